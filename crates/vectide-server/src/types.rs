//! Request and response bodies, read and written by serde.
//!
//! Request types accept the fields `qdrant-client` sends even where we
//! ignore them (Qdrant's `shard_number`, `on_disk`, `quantization`, …), so
//! they do not deny unknown fields; our own namespaces (`vectide` in a
//! collection's creation) do. A field we cannot honour (`lookup_from`,
//! `order_by`, …) is read as present or absent and refused by the handler
//! with a message naming it. Vectors (dense, sparse, named), query bodies
//! and selectors of vectors stay JSON values for the database's parsers
//! (`vectide_db::query`), which every front end shares. Every number that sizes
//! work is a [`Bounded`] integer (the bounds of [`vectide_core::limits`]),
//! vector components are finite `f32`, point ids are [`ExtId`]s. Payloads,
//! engine parameters and filters stay JSON values: payloads are arbitrary
//! JSON, and the database parses the other two (`params_from_json`,
//! `Filter::parse`) for every front end.

use crate::error::ApiError;
use axum::body::Bytes;
use serde::de::{self, DeserializeOwned, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt;
use vectide_core::limits;
use vectide_db::ExtId;

/// Reads a request body into `T`: an empty body is `{}`; integers beyond 64
/// bits are refused (they would not be stored exactly), so is nesting
/// deeper than [`limits::MAX_JSON_DEPTH`] (even in fields that are
/// skipped); the body must be a JSON object.
pub fn parse_body<T: DeserializeOwned>(body: &Bytes) -> Result<T, ApiError> {
    let text: &[u8] = if body.iter().all(|c| c.is_ascii_whitespace()) {
        b"{}"
    } else {
        body
    };
    limits::check_json_integers(text)?;
    limits::check_json_depth(text)?;
    if text.iter().find(|c| !c.is_ascii_whitespace()) != Some(&b'{') {
        // A struct would also read a JSON array (positionally); a body is an object.
        return Err(match serde_json::from_slice::<IgnoredAny>(text) {
            Err(e) => ApiError::bad(format!("malformed JSON body: {e}")),
            Ok(_) => ApiError::bad("the request body must be a JSON object"),
        });
    }
    let mut de = serde_json::Deserializer::from_slice(text);
    let value = serde_path_to_error::deserialize(&mut de)?;
    de.end()
        .map_err(|e| ApiError::bad(format!("malformed JSON body: {e}")))?;
    Ok(value)
}

// ---------------------------------------------------------------- scalars

/// An integer in `LO..=HI`; anything else (a float, a string, a value out
/// of range) is refused with the range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounded<const LO: u64, const HI: u64>(pub usize);

/// `limit`, `offset`: at most [`limits::MAX_K`].
pub type Limit = Bounded<0, { limits::MAX_K as u64 }>;
/// `hnsw_ef`: `1..=MAX_EF`.
pub type Ef = Bounded<1, { limits::MAX_EF as u64 }>;
/// `vectors.size`: `1..=MAX_DIM`.
pub type Dim = Bounded<1, { limits::MAX_DIM as u64 }>;

impl<'de, const LO: u64, const HI: u64> Deserialize<'de> for Bounded<LO, HI> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<const LO: u64, const HI: u64>;
        impl<const LO: u64, const HI: u64> Visitor<'_> for V<LO, HI> {
            type Value = Bounded<LO, HI>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                write!(f, "an integer in {LO}..={HI}")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
                if (LO..=HI).contains(&v) {
                    usize::try_from(v)
                        .map(Bounded)
                        .map_err(|_| E::invalid_value(de::Unexpected::Unsigned(v), &self))
                } else {
                    Err(E::invalid_value(de::Unexpected::Unsigned(v), &self))
                }
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
                match u64::try_from(v) {
                    Ok(u) => self.visit_u64(u),
                    Err(_) => Err(E::invalid_value(de::Unexpected::Signed(v), &self)),
                }
            }
        }
        d.deserialize_any(V::<LO, HI>)
    }
}

/// A point id: an unsigned integer, a UUID or a string key.
#[derive(Debug, Clone)]
pub struct PointId(pub ExtId);

struct PointIdVisitor;

impl Visitor<'_> for PointIdVisitor {
    type Value = ExtId;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a point id (point ids are unsigned integers, UUIDs or strings)")
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<ExtId, E> {
        Ok(ExtId::Num(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<ExtId, E> {
        match u64::try_from(v) {
            Ok(u) => Ok(ExtId::Num(u)),
            Err(_) => Err(E::invalid_value(de::Unexpected::Signed(v), &self)),
        }
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<ExtId, E> {
        ExtId::from_str_key(v).map_err(E::custom)
    }
}

impl<'de> Deserialize<'de> for PointId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(PointIdVisitor).map(PointId)
    }
}

/// A list of point ids.
#[derive(Debug, Clone, Default)]
pub struct PointIds(pub Vec<ExtId>);

impl<'de> Deserialize<'de> for PointIds {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = PointIds;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a list of point ids")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<PointIds, A::Error> {
                let mut out = Vec::new();
                while let Some(PointId(id)) = seq.next_element()? {
                    out.push(id);
                }
                Ok(PointIds(out))
            }
        }
        d.deserialize_any(V)
    }
}

/// `with_payload`: a bool, a list of keys, `{"include": [...]}` or
/// `{"exclude": [...]}`.
#[derive(Debug, Clone, PartialEq)]
pub enum WithPayload {
    None,
    All,
    Include(Vec<String>),
    Exclude(Vec<String>),
}

impl WithPayload {
    pub fn or(sel: Option<WithPayload>, default: bool) -> WithPayload {
        sel.unwrap_or(if default {
            WithPayload::All
        } else {
            WithPayload::None
        })
    }

    pub fn wants_payload(&self) -> bool {
        *self != WithPayload::None
    }

    /// The selected part of a payload (`None` when no payload is asked for).
    pub fn apply(&self, p: Value) -> Option<Value> {
        let keep = |keys: &Vec<String>, include: bool| {
            let Value::Object(o) = p.clone() else {
                return Value::Object(Default::default());
            };
            Value::Object(
                o.into_iter()
                    .filter(|(k, _)| keys.contains(k) == include)
                    .collect(),
            )
        };
        match self {
            WithPayload::None => None,
            WithPayload::All => Some(p),
            WithPayload::Include(keys) => Some(keep(keys, true)),
            WithPayload::Exclude(keys) => Some(keep(keys, false)),
        }
    }
}

impl<'de> Deserialize<'de> for WithPayload {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = WithPayload;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a bool, a list of keys or {\"include\" | \"exclude\": [keys]}")
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<WithPayload, E> {
                Ok(if v {
                    WithPayload::All
                } else {
                    WithPayload::None
                })
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<WithPayload, A::Error> {
                let mut keys = Vec::new();
                while let Some(k) = seq.next_element::<String>()? {
                    keys.push(k);
                }
                Ok(WithPayload::Include(keys))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<WithPayload, A::Error> {
                let out = match map.next_key::<String>()?.as_deref() {
                    Some("include") => WithPayload::Include(map.next_value()?),
                    Some("exclude") => WithPayload::Exclude(map.next_value()?),
                    _ => {
                        return Err(de::Error::custom(
                            "expected {\"include\": [keys]} or {\"exclude\": [keys]}",
                        ))
                    }
                };
                if map.next_key::<IgnoredAny>()?.is_some() {
                    return Err(de::Error::custom(
                        "expected one of include or exclude, not both",
                    ));
                }
                Ok(out)
            }
        }
        d.deserialize_any(V)
    }
}

// ---------------------------------------------------------------- collections

/// `PUT /collections/{name}`.
#[derive(Debug, Deserialize)]
#[serde(expecting = "a collection: {\"vectors\": {\"size\", \"distance\"}, ...}")]
pub struct CreateCollection {
    /// `{"size", "distance"}` (one unnamed vector) or `{"NAME": {"size",
    /// "distance"}, ...}` (named vectors; may be empty).
    pub vectors: Option<Value>,
    /// `{"NAME": {"modifier": "idf" | "none"}, ...}`.
    pub sparse_vectors: Option<BTreeMap<String, Option<SparseVectorParams>>>,
    pub hnsw_config: Option<HnswConfig>,
    pub vectide: Option<VectideConfig>,
}

/// One dense vector space of a collection.
#[derive(Debug, Deserialize)]
#[serde(expecting = "a vector space: {\"size\", \"distance\"}")]
pub struct VectorsConfig {
    pub size: Dim,
    pub distance: Distance,
    pub hnsw_config: Option<HnswConfig>,
    pub multivector_config: Option<IgnoredAny>,
}

/// One sparse vector space of a collection (its `index` settings are
/// accepted and ignored: the inverted index has none).
#[derive(Debug, Deserialize)]
pub struct SparseVectorParams {
    pub modifier: Option<String>,
    pub index: Option<IgnoredAny>,
}

#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
pub enum Distance {
    Cosine,
    Dot,
    Euclid,
}

impl<'de> Deserialize<'de> for Distance {
    /// Read as a string (so that a number is a type error naming the field,
    /// not a JSON syntax error).
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        match s.as_str() {
            "Cosine" => Ok(Distance::Cosine),
            "Dot" => Ok(Distance::Dot),
            "Euclid" => Ok(Distance::Euclid),
            _ => Err(de::Error::unknown_variant(&s, &["Cosine", "Dot", "Euclid"])),
        }
    }
}

impl Distance {
    pub fn metric(self) -> vectide_core::Metric {
        match self {
            Distance::Cosine => vectide_core::Metric::Cosine,
            Distance::Dot => vectide_core::Metric::Ip,
            Distance::Euclid => vectide_core::Metric::L2,
        }
    }
    pub fn of(m: vectide_core::Metric) -> Distance {
        match m {
            vectide_core::Metric::Cosine => Distance::Cosine,
            vectide_core::Metric::Ip => Distance::Dot,
            vectide_core::Metric::L2 => Distance::Euclid,
        }
    }
}

/// Qdrant's `hnsw_config`: `m` and `ef_construct` go to engines that take
/// them (the registry bounds them); the rest is accepted and ignored.
#[derive(Debug, Deserialize)]
pub struct HnswConfig {
    pub m: Option<i64>,
    pub ef_construct: Option<i64>,
}

/// Our own namespace: the engine and its parameters (for every dense
/// space), and per named space its own.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VectideConfig {
    pub engine: Option<String>,
    /// Checked by the registry against the engine's schema.
    pub params: Option<Value>,
    /// Per dense space: `{"NAME": {"engine", "params"}}`.
    pub vectors: Option<BTreeMap<String, VectideSpace>>,
}

/// The engine and parameters of one dense space.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VectideSpace {
    pub engine: Option<String>,
    pub params: Option<Value>,
}

/// `PUT /collections/{name}/index`.
#[derive(Debug, Deserialize)]
pub struct CreateIndex {
    pub field_name: String,
    pub field_schema: FieldSchema,
}

/// `"keyword"`, `"integer"` or `{"type": "keyword", ...}`.
#[derive(Debug)]
pub struct FieldSchema(pub String);

impl<'de> Deserialize<'de> for FieldSchema {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = FieldSchema;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("\"keyword\" or \"integer\" (or {\"type\": ...})")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<FieldSchema, E> {
                Ok(FieldSchema(v.to_string()))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<FieldSchema, A::Error> {
                let mut kind = None;
                while let Some(k) = map.next_key::<String>()? {
                    if k == "type" {
                        kind = Some(map.next_value::<String>()?);
                    } else {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
                kind.map(FieldSchema)
                    .ok_or_else(|| de::Error::missing_field("type"))
            }
        }
        d.deserialize_any(V)
    }
}

// ---------------------------------------------------------------- points

/// `PUT /collections/{name}/points`: a list of points or a batch.
#[derive(Debug, Deserialize)]
pub struct Upsert {
    pub points: Option<Vec<PointStruct>>,
    pub batch: Option<Batch>,
}

#[derive(Debug, Deserialize)]
#[serde(expecting = "a point {\"id\", \"vector\", \"payload\"}")]
pub struct PointStruct {
    pub id: PointId,
    /// A dense vector, or `{"NAME": dense | sparse, ...}`.
    pub vector: Value,
    pub payload: Option<Value>,
}

#[derive(Debug, Deserialize)]
#[serde(expecting = "a batch {\"ids\", \"vectors\", \"payloads\"}")]
pub struct Batch {
    pub ids: PointIds,
    /// A list of dense vectors, or `{"NAME": [vector per id], ...}`.
    pub vectors: Value,
    pub payloads: Option<Vec<Value>>,
}

/// `POST /collections/{name}/points`.
#[derive(Debug, Deserialize)]
pub struct Retrieve {
    pub ids: PointIds,
    pub with_payload: Option<WithPayload>,
    /// A bool or a list of vector names.
    pub with_vector: Option<Value>,
}

/// `POST .../points/count`.
#[derive(Debug, Deserialize)]
pub struct Count {
    pub filter: Option<Value>,
    pub exact: Option<bool>,
}

/// `POST .../points/delete` and `.../points/payload`: ids or a filter.
#[derive(Debug, Deserialize)]
pub struct Selector {
    pub points: Option<PointIds>,
    pub filter: Option<Value>,
    /// Set or overwrite payload: the keys (an object, checked by the
    /// database).
    pub payload: Option<Value>,
    /// Set payload at a key path.
    pub key: Option<String>,
    /// Delete payload: the key paths to remove.
    pub keys: Option<Vec<String>>,
}

/// `POST .../points/scroll`.
#[derive(Debug, Deserialize)]
pub struct Scroll {
    pub filter: Option<Value>,
    pub offset: Option<PointId>,
    pub limit: Option<Limit>,
    pub with_payload: Option<WithPayload>,
    /// A bool or a list of vector names.
    pub with_vector: Option<Value>,
    pub order_by: Option<IgnoredAny>,
}

/// `POST .../points/search` (Qdrant's legacy search): `vector` is a
/// dense vector, `{"name", "vector"}` for a named space, or a sparse
/// vector by name (`{"name", "vector": {"indices", "values"}}`); the rest
/// becomes a query of the Query API.
#[derive(Debug, Deserialize)]
#[serde(expecting = "a search request object")]
pub struct SearchRequest {
    pub vector: Value,
    pub filter: Option<Value>,
    pub limit: Option<Limit>,
    pub offset: Option<Limit>,
    pub params: Option<Value>,
    pub with_payload: Option<WithPayload>,
    pub with_vector: Option<Value>,
    pub score_threshold: Option<f64>,
}

/// `POST .../points/search/groups`: Qdrant's legacy grouped search (the
/// search's `vector`, with `group_by`, `group_size` and `limit`
/// required, as Qdrant's `SearchGroupsRequest` has them), run as a
/// grouped query.
#[derive(Debug, Deserialize)]
#[serde(expecting = "a search groups request object")]
pub struct SearchGroupsRequest {
    pub vector: Value,
    pub filter: Option<Value>,
    pub params: Option<Value>,
    pub with_payload: Option<WithPayload>,
    pub with_vector: Option<Value>,
    pub score_threshold: Option<f64>,
    pub group_by: String,
    pub group_size: GroupCount,
    pub limit: GroupCount,
    pub with_lookup: Option<Value>,
}

/// `group_size` and a grouped search's `limit`: `1..=MAX_K`.
pub type GroupCount = Bounded<1, { limits::MAX_K as u64 }>;

/// `POST .../points/query/batch`: each search is a query body.
#[derive(Debug, Deserialize)]
pub struct QueryBatch {
    pub searches: Vec<Value>,
}

// ---------------------------------------------------------------- responses

/// The answer to a write: its sequence number.
#[derive(Debug, Serialize)]
pub struct UpdateResult {
    pub operation_id: u64,
    pub status: &'static str,
}

impl UpdateResult {
    pub fn completed(seq: u64) -> Self {
        UpdateResult {
            operation_id: seq,
            status: "completed",
        }
    }
}

/// A stored point (retrieve, scroll); `vector` is a list in a
/// collection of the single form, `{"NAME": vector}` otherwise.
#[derive(Debug, Serialize)]
pub struct Record {
    pub id: Value,
    pub payload: Option<Value>,
    pub vector: Option<Value>,
}

/// A point found by a query.
#[derive(Debug, Serialize)]
pub struct ScoredPoint {
    pub id: Value,
    pub version: u64,
    pub score: f32,
    pub payload: Option<Value>,
    pub vector: Option<Value>,
}

#[derive(Debug, Serialize)]
pub struct QueryResponse {
    pub points: Vec<ScoredPoint>,
}

/// Points that share a value at the `group_by` key.
#[derive(Debug, Serialize)]
pub struct PointGroup {
    pub id: Value,
    pub hits: Vec<ScoredPoint>,
}

#[derive(Debug, Serialize)]
pub struct GroupsResponse {
    pub groups: Vec<PointGroup>,
}

#[derive(Debug, Serialize)]
pub struct ScrollResponse {
    pub points: Vec<Record>,
    pub next_page_offset: Option<Value>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse<T: DeserializeOwned>(s: &str) -> Result<T, String> {
        parse_body(&Bytes::copy_from_slice(s.as_bytes())).map_err(|e| e.1)
    }

    #[test]
    fn bounded_integers_name_the_field_and_the_range() {
        let q: SearchRequest = parse(r#"{"vector": [1], "limit": 100000, "offset": 0}"#).unwrap();
        assert_eq!(q.limit, Some(Bounded(100_000)));
        for (body, needle) in [
            (
                r#"{"vector": [1], "limit": 100001}"#,
                "limit: invalid value: integer `100001`",
            ),
            (
                r#"{"vector": [1], "limit": -1}"#,
                "limit: invalid value: integer `-1`",
            ),
            (
                r#"{"vector": [1], "limit": 1.5}"#,
                "limit: invalid type: floating point",
            ),
            (
                r#"{"vector": [1], "limit": "10"}"#,
                "limit: invalid type: string",
            ),
            (
                r#"{"vector": [1], "limit": true}"#,
                "limit: invalid type: boolean",
            ),
            (
                r#"{"vector": [1], "limit": 18446744073709551616}"#,
                "2**64-1",
            ),
        ] {
            let e = parse::<SearchRequest>(body).unwrap_err();
            assert!(e.contains(needle), "{body}: {e}");
        }
        let e = parse::<SearchRequest>(r#"{"vector": [1], "offset": 100001}"#).unwrap_err();
        assert!(e.contains("0..=100000"), "{e}");
    }

    #[test]
    fn ids_and_payload_selectors() {
        let u: Upsert = parse(
            r#"{"points": [{"id": 1, "vector": [1, 2.5]}, {"id": "a-key", "vector": {"s": {"indices": [1], "values": [2]}}, "payload": {"x": 1}}]}"#,
        )
        .unwrap();
        let pts = u.points.unwrap();
        assert_eq!(pts[0].vector, serde_json::json!([1, 2.5]));
        assert!(matches!(pts[1].id.0, ExtId::Str(ref s) if s == "a-key"));
        for (body, needle) in [
            (r#"{"points": [{"id": -1, "vector": [1]}]}"#, "points[0].id"),
            (r#"{"points": [{"id": 1.5, "vector": [1]}]}"#, "point id"),
            (r#"{"points": [{"id": 1}]}"#, "missing field `vector`"),
            (r#"{"points": [1]}"#, "a point {\"id\""),
            (r#"{"batch": {"ids": "x", "vectors": []}}"#, "batch.ids"),
        ] {
            let e = parse::<Upsert>(body).unwrap_err();
            assert!(e.contains(needle), "{body}: {e}");
        }
        let r: Retrieve = parse(r#"{"ids": [1], "with_payload": {"exclude": ["a"]}}"#).unwrap();
        let sel = r.with_payload.unwrap();
        assert_eq!(
            sel.apply(serde_json::json!({"a": 1, "b": 2})),
            Some(serde_json::json!({"b": 2}))
        );
        let e = parse::<Retrieve>(r#"{"ids": "x"}"#).unwrap_err();
        assert!(e.contains("a list of point ids"), "{e}");
        let e = parse::<Retrieve>(r#"{"ids": [1], "with_payload": {"bogus": 1}}"#).unwrap_err();
        assert!(e.contains("with_payload") && e.contains("include"), "{e}");
    }

    #[test]
    fn bodies_that_are_not_objects_and_collection_shapes() {
        let deep = format!(r#"{{"x": {}1{}}}"#, "[".repeat(200), "]".repeat(200));
        for (body, needle) in [
            ("[]", "must be a JSON object"),
            ("5", "must be a JSON object"),
            ("{\"a\": 1", "malformed JSON body"),
            ("{} x", "malformed JSON body"),
            (deep.as_str(), "nested deeper"),
        ] {
            let e = parse::<Scroll>(body).unwrap_err();
            assert!(e.contains(needle), "{body}: {e}");
        }
        let e = parse::<CreateCollection>(r#"{"vectide": {"engin": "flat"}}"#).unwrap_err();
        assert!(e.contains("unknown field `engin`"), "{e}");
        let e = parse::<CreateCollection>(r#"{"vectide": {"vectors": {"a": {"engin": "flat"}}}}"#)
            .unwrap_err();
        assert!(e.contains("unknown field `engin`"), "{e}");
        let c: CreateCollection = parse(
            r#"{"vectors": {"size": 4, "distance": "Dot", "on_disk": null}, "shard_number": 1, "hnsw_config": {"m": 8, "payload_m": null}, "sparse_vectors": {"s": {"modifier": "idf"}, "t": null}}"#,
        )
        .unwrap();
        assert_eq!(c.hnsw_config.unwrap().m, Some(8));
        let sparse = c.sparse_vectors.unwrap();
        assert_eq!(
            sparse["s"].as_ref().unwrap().modifier.as_deref(),
            Some("idf")
        );
        assert!(sparse["t"].is_none());
        for (body, needle) in [
            (r#"{"size": 4, "distance": 5}"#, "invalid type"),
            (
                r#"{"size": 4, "distance": "Manhattan"}"#,
                "unknown variant `Manhattan`",
            ),
            (r#"{"size": 0, "distance": "Dot"}"#, "1..="),
        ] {
            let v: serde_json::Value = serde_json::from_str(body).unwrap();
            let e = serde_json::from_value::<VectorsConfig>(v)
                .unwrap_err()
                .to_string();
            assert!(e.contains(needle), "{body}: {e}");
        }
    }
}
