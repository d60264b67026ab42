//! The OpenAPI 3.0 document of the API (`GET /openapi.json`).

use serde_json::{json, Value};
use vectide_core::limits;

fn envelope(result: Value) -> Value {
    json!({
        "description": "success",
        "content": {"application/json": {"schema": {
            "type": "object",
            "properties": {"result": result, "status": {"type": "string"}, "time": {"type": "number"}},
            "required": ["result", "status", "time"]
        }}}
    })
}

fn body(schema: Value) -> Value {
    json!({"required": true, "content": {"application/json": {"schema": schema}}})
}

fn errors() -> Value {
    let e = json!({"description": "error", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}});
    json!({"400": e.clone(), "401": e.clone(), "404": e.clone(), "409": e.clone(), "413": e.clone(), "415": e.clone(), "500": e})
}

fn op(summary: &str, request: Option<Value>, result: Value) -> Value {
    let mut responses = errors();
    responses["200"] = envelope(result);
    let mut o = json!({
        "summary": summary,
        "parameters": [{"name": "name", "in": "path", "required": true, "schema": {"type": "string", "pattern": "^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,63}$"}}],
        "responses": responses,
    });
    if let Some(r) = request {
        o["requestBody"] = body(r);
    }
    o
}

fn r(name: &str) -> Value {
    json!({"$ref": format!("#/components/schemas/{name}")})
}

/// The document.
pub fn document() -> Value {
    let update = r("UpdateResult");
    // The documented bounds (vectide_core::limits); beyond them, 400.
    let limit = json!({"type": "integer", "minimum": 0, "maximum": limits::MAX_K, "description": format!("at most {}; offset + limit at most {}", limits::MAX_K, limits::MAX_K)});
    let offset = json!({"type": "integer", "minimum": 0, "maximum": limits::MAX_K, "description": format!("offset + limit at most {}", limits::MAX_K)});
    let group_count = json!({"type": "integer", "minimum": 1, "maximum": limits::MAX_K});
    let knobs: serde_json::Map<String, Value> = vectide_engines::Knob::ALL
        .iter()
        .map(|k| {
            (
                k.name().to_string(),
                json!({"type": "integer", "minimum": 1, "maximum": k.max()}),
            )
        })
        .collect();
    let search_params = json!({"type": "object", "properties": {
        "hnsw_ef": {"type": "integer", "minimum": 1, "maximum": limits::MAX_EF, "description": "the engine's primary search knob (ignored by engines without one)"},
        "exact": {"type": "boolean", "description": "an exact scan of the collection's points"},
        "vectide": {"type": "object", "properties": knobs, "additionalProperties": false, "description": "the engine's native search knobs; a knob the engine does not take is refused (400)"}
    }});
    let engine_names = vectide_engines::names();
    let engine_params = vectide_engines::REGISTRY
        .iter()
        .map(|d| {
            let ps: Vec<String> = d
                .params
                .iter()
                .filter(|p| p.name != "path")
                .map(|p| format!("{} {}", p.name, p.kind))
                .collect();
            format!("{}: {}", d.name, ps.join(", "))
        })
        .collect::<Vec<_>>()
        .join("; ");
    let points = json!({"type": "array", "items": r("Point")});
    json!({
        "openapi": "3.0.3",
        "info": {
            "title": "Vectide REST API",
            "version": env!("CARGO_PKG_VERSION"),
            "description": format!("Collections of points (id, vector, JSON payload) with filtered vector search. The shapes are the subset of Qdrant's REST API that qdrant-client uses; scores follow Qdrant (Cosine and Dot: similarity, Euclid: distance). Bounds: limit and offset + limit at most {k}, hnsw_ef at most {ef}, vectors.size at most {dim}, engine threads at most {threads}, a query batch at most {cells} results (sum of offset + limit); payload integers within -2**63..2**64-1 (floats round-trip exactly); request bodies are application/json.", k = limits::MAX_K, ef = limits::MAX_EF, dim = limits::MAX_DIM, threads = limits::MAX_THREADS, cells = limits::MAX_BATCH_RESULTS)
        },
        "paths": {
            "/": {"get": {"summary": "Server version", "responses": {"200": {"description": "version", "content": {"application/json": {"schema": {"type": "object", "properties": {"title": {"type": "string"}, "version": {"type": "string"}}}}}}}}},
            "/healthz": {"get": {"summary": "Liveness", "responses": {"200": {"description": "ok"}}}},
            "/metrics": {"get": {"summary": "Prometheus metrics", "responses": {"200": {"description": "text exposition format", "content": {"text/plain": {"schema": {"type": "string"}}}}}}},
            "/collections": {"get": {"summary": "List collections", "responses": {"200": envelope(json!({"type": "object", "properties": {"collections": {"type": "array", "items": {"type": "object", "properties": {"name": {"type": "string"}}}}}}))}}},
            "/collections/{name}": {
                "put": op("Create a collection", Some(r("CreateCollection")), json!({"type": "boolean"})),
                "get": op("Collection info", None, json!({"type": "object"})),
                "delete": op("Delete a collection", None, json!({"type": "boolean"}))
            },
            "/collections/{name}/exists": {"get": op("Whether a collection exists", None, json!({"type": "object", "properties": {"exists": {"type": "boolean"}}}))},
            "/collections/{name}/points": {
                "put": op("Upsert points (acknowledged after the WAL fsync)", Some(r("PointsList")), update.clone()),
                "post": op("Retrieve points by id", Some(r("PointRequest")), points.clone())
            },
            "/collections/{name}/points/query": {"post": op("Query points", Some(r("QueryRequest")), json!({"type": "object", "properties": {"points": {"type": "array", "items": r("ScoredPoint")}}}))},
            "/collections/{name}/points/query/batch": {"post": op("Batch of queries (together at most MAX_BATCH_RESULTS results)", Some(r("QueryBatch")), json!({"type": "array"}))},
            "/collections/{name}/points/query/groups": {"post": op("Query points, grouped by a payload key (the first `limit` groups to appear, by their best hit; at most `group_size` hits each)", Some(r("QueryGroupsRequest")), r("GroupsResult"))},
            "/collections/{name}/points/search": {"post": op("Search points", Some(r("SearchRequest")), json!({"type": "array", "items": r("ScoredPoint")}))},
            "/collections/{name}/points/search/groups": {"post": op("Search points, grouped by a payload key", Some(r("SearchGroupsRequest")), r("GroupsResult"))},
            "/collections/{name}/points/count": {"post": op("Count points", Some(r("CountRequest")), json!({"type": "object", "properties": {"count": {"type": "integer"}}}))},
            "/collections/{name}/points/delete": {"post": op("Delete points by id or filter", Some(r("Selector")), update.clone())},
            "/collections/{name}/points/scroll": {"post": op("Page through points in id order", Some(r("ScrollRequest")), json!({"type": "object", "properties": {"points": points, "next_page_offset": r("PointId")}}))},
            "/collections/{name}/points/payload": {
                "post": op("Merge keys into payloads (at a key path when `key` is given; a null removes its key)", Some(r("SetPayload")), update.clone()),
                "put": op("Replace payloads", Some(r("SetPayload")), update.clone())
            },
            "/collections/{name}/points/payload/delete": {"post": op("Remove keys (key paths) from payloads", Some(r("DeletePayload")), update.clone())},
            "/collections/{name}/points/payload/clear": {"post": op("Empty payloads", Some(r("Selector")), update.clone())},
            "/collections/{name}/index": {"put": op("Declare a payload index", Some(r("CreateIndex")), update)},
            "/collections/{name}/vectide/maintain": {"post": op("Vectide's own: run the engine's pending maintenance now (consolidation, merge, rebuild); answers when none is in flight", None, json!({"type": "boolean"}))},
            "/collections/{name}/vectide/checkpoint": {"post": op("Vectide's own: take a checkpoint now (engine state durable, commit log cut)", None, json!({"type": "boolean"}))}
        },
        "components": {"schemas": {
            "Error": {"type": "object", "properties": {"status": {"type": "object", "properties": {"error": {"type": "string"}}}, "time": {"type": "number"}}},
            "PointId": {"oneOf": [{"type": "integer", "minimum": 0, "maximum": u64::MAX}, {"type": "string", "minLength": 1, "maxLength": vectide_db::ids::MAX_KEY_BYTES}]},
            "Vector": {"type": "array", "items": {"type": "number"}},
            "SparseVector": {"type": "object", "required": ["indices", "values"], "properties": {"indices": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": u32::MAX}}, "values": {"type": "array", "items": {"type": "number"}}}},
            "AnyVector": {"oneOf": [r("Vector"), r("SparseVector")]},
            "Vectors": {"oneOf": [r("Vector"), {"type": "object", "additionalProperties": r("AnyVector"), "description": "vectors by space name"}]},
            "WithVector": {"oneOf": [{"type": "boolean"}, {"type": "array", "items": {"type": "string"}, "description": "vector names"}]},
            "QueryInput": {"oneOf": [r("Vector"), r("SparseVector"), r("PointId"),
                {"type": "object", "required": ["nearest"], "properties": {"nearest": {"oneOf": [r("Vector"), r("SparseVector"), r("PointId")]}, "mmr": r("Mmr")}},
                {"type": "object", "required": ["fusion"], "properties": {"fusion": {"type": "string", "enum": ["rrf", "dbsf"]}}},
                {"type": "object", "required": ["rrf"], "properties": {"rrf": {"type": "object", "properties": {"k": {"type": "integer", "minimum": 1}, "weights": {"type": "array", "items": {"type": "number"}, "description": "one weight per prefetch: a source of weight w adds 1 / ((rank + 1) / w + k - 1), nothing when w <= 0"}}}}}]},
            "Mmr": {"type": "object", "additionalProperties": false, "description": "maximal marginal relevance: the candidates_limit nearest re-ranked with lambda = 1 - diversity; the points keep their similarity as score", "properties": {
                "diversity": {"type": "number", "minimum": 0, "maximum": 1, "description": "0.5 unless given"},
                "candidates_limit": {"type": "integer", "minimum": 0, "maximum": vectide_db::query::MAX_MMR_CANDIDATES, "description": "the limit unless given"}}},
            "Prefetch": {"type": "object", "properties": {"prefetch": {"type": "array", "items": {"$ref": "#/components/schemas/Prefetch"}}, "query": r("QueryInput"), "using": {"type": "string"}, "filter": r("Filter"), "params": search_params.clone(), "score_threshold": {"type": "number"}, "limit": limit.clone()}},
            "Payload": {"type": "object", "nullable": true},
            "Point": {"type": "object", "properties": {"id": r("PointId"), "payload": r("Payload"), "vector": r("Vectors")}},
            "PointStruct": {"type": "object", "required": ["id", "vector"], "properties": {"id": r("PointId"), "vector": r("Vectors"), "payload": r("Payload")}},
            "PointsList": {"type": "object", "properties": {"points": {"type": "array", "items": r("PointStruct")}, "batch": r("Batch")}},
            "Batch": {"type": "object", "required": ["ids", "vectors"], "properties": {"ids": {"type": "array", "items": r("PointId")}, "vectors": {"oneOf": [{"type": "array", "items": r("Vector")}, {"type": "object", "additionalProperties": {"type": "array", "items": r("AnyVector")}}]}, "payloads": {"type": "array", "items": r("Payload")}}},
            "PointRequest": {"type": "object", "required": ["ids"], "properties": {"ids": {"type": "array", "items": r("PointId")}, "with_payload": r("WithPayload"), "with_vector": r("WithVector")}},
            "ScoredPoint": {"type": "object", "required": ["id", "version", "score"], "properties": {"id": r("PointId"), "version": {"type": "integer"}, "score": {"type": "number"}, "payload": r("Payload"), "vector": r("Vectors")}},
            "UpdateResult": {"type": "object", "properties": {"operation_id": {"type": "integer"}, "status": {"type": "string", "enum": ["completed"]}}},
            "Condition": {"type": "object", "properties": {
                "key": {"type": "string"},
                "match": {"type": "object", "properties": {"value": {"oneOf": [{"type": "string"}, {"type": "integer"}, {"type": "boolean"}]}, "any": {"type": "array"}, "except": {"type": "array"}}},
                "range": {"type": "object", "properties": {"gt": {"type": "number"}, "gte": {"type": "number"}, "lt": {"type": "number"}, "lte": {"type": "number"}}},
                "has_id": {"type": "array", "items": r("PointId")},
                "is_empty": {"type": "object", "properties": {"key": {"type": "string"}}},
                "is_null": {"type": "object", "properties": {"key": {"type": "string"}}}
            }},
            "Filter": {"type": "object", "properties": {"must": {"type": "array", "items": r("Condition")}, "should": {"type": "array", "items": r("Condition")}, "must_not": {"type": "array", "items": r("Condition")}}},
            "Selector": {"type": "object", "properties": {"points": {"type": "array", "items": r("PointId")}, "filter": r("Filter")}},
            "SetPayload": {"type": "object", "required": ["payload"], "properties": {"points": {"type": "array", "items": r("PointId")}, "filter": r("Filter"), "payload": {"type": "object"}, "key": {"type": "string", "description": "a key path (a.b, tags[], items[0].name)"}}},
            "DeletePayload": {"type": "object", "required": ["keys"], "properties": {"points": {"type": "array", "items": r("PointId")}, "filter": r("Filter"), "keys": {"type": "array", "items": {"type": "string"}}}},
            "CountRequest": {"type": "object", "properties": {"filter": r("Filter"), "exact": {"type": "boolean"}}},
            "CreateIndex": {"type": "object", "required": ["field_name", "field_schema"], "properties": {"field_name": {"type": "string", "minLength": 1}, "field_schema": {"oneOf": [{"type": "string", "enum": ["keyword", "integer"]}, {"type": "object", "required": ["type"], "properties": {"type": {"type": "string", "enum": ["keyword", "integer"]}}}]}}},
            "QueryBatch": {"type": "object", "required": ["searches"], "properties": {"searches": {"type": "array", "items": r("QueryRequest")}}},
            "WithPayload": {"oneOf": [{"type": "boolean"}, {"type": "array", "items": {"type": "string"}},
                {"type": "object", "properties": {"include": {"type": "array", "items": {"type": "string"}}}, "required": ["include"], "additionalProperties": false},
                {"type": "object", "properties": {"exclude": {"type": "array", "items": {"type": "string"}}}, "required": ["exclude"], "additionalProperties": false}]},
            "QueryRequest": {"type": "object", "properties": {"prefetch": {"oneOf": [r("Prefetch"), {"type": "array", "items": r("Prefetch")}]}, "query": r("QueryInput"), "using": {"type": "string"}, "filter": r("Filter"), "limit": limit.clone(), "offset": offset.clone(), "with_payload": r("WithPayload"), "with_vector": r("WithVector"), "with_vectors": r("WithVector"), "score_threshold": {"type": "number"}, "params": search_params.clone()}},
            "QueryGroupsRequest": {"type": "object", "required": ["group_by"], "properties": {"prefetch": {"oneOf": [r("Prefetch"), {"type": "array", "items": r("Prefetch")}]}, "query": r("QueryInput"), "using": {"type": "string"}, "filter": r("Filter"), "limit": group_count.clone(), "with_payload": r("WithPayload"), "with_vector": r("WithVector"), "with_vectors": r("WithVector"), "score_threshold": {"type": "number"}, "params": search_params.clone(),
                "group_by": {"type": "string", "description": "a payload key path; a point joins the group of each integer or string there (an array: each element), none if it holds another value"},
                "group_size": {"type": "integer", "minimum": 1, "maximum": limits::MAX_K, "description": "3 unless given"}}},
            "SearchGroupsRequest": {"type": "object", "required": ["vector", "group_by", "group_size", "limit"], "properties": {"vector": {"oneOf": [r("Vector"), {"type": "object", "required": ["name", "vector"], "properties": {"name": {"type": "string"}, "vector": r("AnyVector")}}]}, "filter": r("Filter"), "with_payload": r("WithPayload"), "with_vector": r("WithVector"), "score_threshold": {"type": "number"}, "params": search_params.clone(),
                "group_by": {"type": "string"}, "group_size": group_count.clone(), "limit": group_count}},
            "PointGroup": {"type": "object", "required": ["id", "hits"], "properties": {"id": {"oneOf": [{"type": "integer"}, {"type": "string"}]}, "hits": {"type": "array", "items": r("ScoredPoint")}}},
            "GroupsResult": {"type": "object", "properties": {"groups": {"type": "array", "items": r("PointGroup")}}},
            "SearchRequest": {"type": "object", "required": ["vector"], "properties": {"vector": {"oneOf": [r("Vector"), {"type": "object", "required": ["name", "vector"], "properties": {"name": {"type": "string"}, "vector": r("AnyVector")}}]}, "filter": r("Filter"), "limit": limit.clone(), "offset": offset, "with_payload": r("WithPayload"), "with_vector": r("WithVector"), "score_threshold": {"type": "number"}, "params": search_params}},
            "ScrollRequest": {"type": "object", "properties": {"filter": r("Filter"), "limit": limit, "offset": r("PointId"), "with_payload": r("WithPayload"), "with_vector": r("WithVector")}},
            "VectorParams": {"type": "object", "required": ["size", "distance"], "properties": {"size": {"type": "integer", "minimum": 1, "maximum": limits::MAX_DIM}, "distance": {"type": "string", "enum": ["Cosine", "Dot", "Euclid"]}, "hnsw_config": {"type": "object", "properties": {"m": {"type": "integer"}, "ef_construct": {"type": "integer"}}}}},
            "CreateCollection": {"type": "object", "properties": {
                "vectors": {"oneOf": [r("VectorParams"), {"type": "object", "additionalProperties": r("VectorParams"), "description": "named dense vectors, each its own engine"}]},
                "sparse_vectors": {"type": "object", "additionalProperties": {"type": "object", "nullable": true, "properties": {"modifier": {"type": "string", "enum": ["idf", "none"], "nullable": true}, "index": {"type": "object"}}}},
                "hnsw_config": {"type": "object", "properties": {"m": {"type": "integer", "minimum": limits::MIN_M, "maximum": limits::MAX_M}, "ef_construct": {"type": "integer", "minimum": 1, "maximum": limits::MAX_EF}}},
                "vectide": {"type": "object", "additionalProperties": false, "properties": {"engine": {"type": "string", "enum": engine_names.clone()}, "vectors": {"type": "object", "description": "per named dense vector: its own engine and params", "additionalProperties": {"type": "object", "additionalProperties": false, "properties": {"engine": {"type": "string", "enum": engine_names}, "params": {"type": "object"}}}}, "params": {
                    "type": "object",
                    "description": format!(
                        "Engine parameters, checked against the engine's schema: unknown names are refused and \
                         every number is bounded (beyond, 400). {engine_params}."
                    )
                }}}
            }}
        }}
    })
}

#[cfg(test)]
mod tests {
    use super::document;
    use crate::types;
    use serde::de::{self, Deserialize, Deserializer, Visitor};
    use std::collections::BTreeSet;

    /// A deserializer that records the field names a derived struct asks
    /// for, then stops.
    struct Fields(Option<&'static [&'static str]>);

    #[derive(Debug)]
    struct Stop;
    impl std::fmt::Display for Stop {
        fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("stop")
        }
    }
    impl std::error::Error for Stop {}
    impl de::Error for Stop {
        fn custom<T: std::fmt::Display>(_: T) -> Self {
            Stop
        }
    }

    impl<'de> Deserializer<'de> for &mut Fields {
        type Error = Stop;
        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Stop> {
            Err(Stop)
        }
        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Stop> {
            self.0 = Some(fields);
            Err(Stop)
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
            bytes byte_buf option unit unit_struct newtype_struct seq tuple
            tuple_struct map enum identifier ignored_any
        }
    }

    fn fields<'de, T: Deserialize<'de>>() -> BTreeSet<&'static str> {
        let mut f = Fields(None);
        let _ = T::deserialize(&mut f);
        f.0.expect("a derived struct").iter().copied().collect()
    }

    /// Every field a request type reads is documented, and the document
    /// names no field the type ignores, except the fields that are read
    /// only to be refused with a message (not part of the API).
    #[test]
    fn request_schemas_match_the_serde_types() {
        let doc = document();
        let schemas = &doc["components"]["schemas"];
        let check = |schema: &str, read: BTreeSet<&'static str>, refused: &[&str]| {
            let documented: BTreeSet<&str> = schemas[schema]["properties"]
                .as_object()
                .unwrap_or_else(|| panic!("{schema} has no properties"))
                .keys()
                .map(String::as_str)
                .collect();
            let accepted: BTreeSet<&str> = read
                .iter()
                .copied()
                .filter(|f| !refused.contains(f))
                .collect();
            assert_eq!(documented, accepted, "{schema}");
        };
        let query: BTreeSet<&'static str> =
            vectide_db::query::QUERY_FIELDS.iter().copied().collect();
        check("QueryRequest", query, &["lookup_from", "shard_key"]);
        let prefetch: BTreeSet<&'static str> =
            vectide_db::query::PREFETCH_FIELDS.iter().copied().collect();
        check("Prefetch", prefetch, &["lookup_from"]);
        let groups: BTreeSet<&'static str> =
            vectide_db::query::GROUPS_FIELDS.iter().copied().collect();
        check(
            "QueryGroupsRequest",
            groups,
            &["lookup_from", "shard_key", "with_lookup"],
        );
        check("SearchRequest", fields::<types::SearchRequest>(), &[]);
        check(
            "SearchGroupsRequest",
            fields::<types::SearchGroupsRequest>(),
            &["with_lookup"],
        );
        check("ScrollRequest", fields::<types::Scroll>(), &["order_by"]);
        check("PointRequest", fields::<types::Retrieve>(), &[]);
        check("PointsList", fields::<types::Upsert>(), &[]);
        check("PointStruct", fields::<types::PointStruct>(), &[]);
        check("Batch", fields::<types::Batch>(), &[]);
        check("CountRequest", fields::<types::Count>(), &[]);
        check("CreateIndex", fields::<types::CreateIndex>(), &[]);
        check("QueryBatch", fields::<types::QueryBatch>(), &[]);
        let mut selector = fields::<types::Selector>();
        for f in ["payload", "key", "keys"] {
            selector.remove(f);
        }
        check("Selector", selector, &[]);
        check("SetPayload", fields::<types::Selector>(), &["keys"]);
        check(
            "DeletePayload",
            fields::<types::Selector>(),
            &["key", "payload"],
        );
        check("CreateCollection", fields::<types::CreateCollection>(), &[]);
        let create = &schemas["CreateCollection"]["properties"];
        let sub = |v: &serde_json::Value| -> BTreeSet<String> {
            v["properties"]
                .as_object()
                .unwrap()
                .keys()
                .cloned()
                .collect()
        };
        let names = |s: BTreeSet<&'static str>| -> BTreeSet<String> {
            s.into_iter().map(String::from).collect()
        };
        let mut vectors = fields::<types::VectorsConfig>();
        vectors.remove("multivector_config");
        assert_eq!(sub(&schemas["VectorParams"]), names(vectors));
        assert_eq!(
            sub(&create["hnsw_config"]),
            names(fields::<types::HnswConfig>())
        );
        assert_eq!(
            sub(&create["vectide"]),
            names(fields::<types::VectideConfig>())
        );
        assert_eq!(
            sub(&create["vectide"]["properties"]["vectors"]["additionalProperties"]),
            names(fields::<types::VectideSpace>())
        );
        assert_eq!(create["vectide"]["additionalProperties"], false);
        let mut sparse = fields::<types::SparseVectorParams>();
        sparse.retain(|_| true);
        assert_eq!(
            sub(&create["sparse_vectors"]["additionalProperties"]),
            names(sparse)
        );
    }
}
