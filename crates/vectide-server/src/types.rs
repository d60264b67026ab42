//! Request and response bodies, read and written by serde.
//!
//! Request types accept the fields `qdrant-client` sends even where we
//! ignore them (Qdrant's `shard_number`, `on_disk`, `quantization`, …), so
//! they do not deny unknown fields; our own namespaces (`vectide` in a
//! collection's creation) do. A field we cannot honour (`using`,
//! `prefetch`, `sparse_vectors`, …) is read as present or absent and
//! refused by the handler with a message naming it. Every number that sizes
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

/// One vector component: a finite number (as `f32`).
struct Component(f32);

impl<'de> Deserialize<'de> for Component {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Component;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a finite number")
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Component, E> {
                let x = v as f32;
                if x.is_finite() {
                    Ok(Component(x))
                } else {
                    Err(E::invalid_value(de::Unexpected::Float(v), &self))
                }
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Component, E> {
                Ok(Component(v as f32))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Component, E> {
                Ok(Component(v as f32))
            }
        }
        d.deserialize_any(V)
    }
}

fn components<'de, A: SeqAccess<'de>>(mut seq: A) -> Result<Vec<f32>, A::Error> {
    let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(limits::MAX_DIM));
    while let Some(Component(x)) = seq.next_element()? {
        out.push(x);
    }
    Ok(out)
}

const NAMED_VECTORS: &str =
    "named and sparse vectors are not supported; send a plain list of floats";

/// A dense vector: a list of finite numbers (its dimension is checked
/// against the collection by [`Vector::of_dim`]).
#[derive(Debug, Clone)]
pub struct Vector(pub Vec<f32>);

impl Vector {
    /// The components, when there are `dim` of them.
    pub fn of_dim(self, dim: usize, what: &str) -> Result<Vec<f32>, ApiError> {
        if self.0.len() != dim {
            return Err(ApiError::bad(format!(
                "{what}: wrong vector dimension: the collection has {dim}, got {}",
                self.0.len()
            )));
        }
        Ok(self.0)
    }
}

impl<'de> Deserialize<'de> for Vector {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Vector;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a vector (a list of numbers)")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Vector, A::Error> {
                components(seq).map(Vector)
            }
            fn visit_map<A: MapAccess<'de>>(self, _: A) -> Result<Vector, A::Error> {
                Err(de::Error::custom(NAMED_VECTORS))
            }
        }
        d.deserialize_any(V)
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
    pub vectors: Option<VectorsConfig>,
    pub sparse_vectors: Option<IgnoredAny>,
    pub hnsw_config: Option<HnswConfig>,
    pub vectide: Option<VectideConfig>,
}

/// `vectors` of a collection: one unnamed dense vector.
#[derive(Debug, Deserialize)]
#[serde(expecting = "vectors: {\"size\", \"distance\"}")]
pub struct VectorsConfig {
    pub size: Option<Dim>,
    pub distance: Option<Distance>,
    pub multivector_config: Option<IgnoredAny>,
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

/// Our own namespace: the engine and its parameters.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VectideConfig {
    pub engine: Option<String>,
    /// Checked by the registry against the engine's schema.
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
    pub vector: Vector,
    pub payload: Option<Value>,
}

#[derive(Debug, Deserialize)]
#[serde(expecting = "a batch {\"ids\", \"vectors\", \"payloads\"}")]
pub struct Batch {
    pub ids: PointIds,
    pub vectors: Vec<Vector>,
    pub payloads: Option<Vec<Value>>,
}

/// `POST /collections/{name}/points`.
#[derive(Debug, Deserialize)]
pub struct Retrieve {
    pub ids: PointIds,
    pub with_payload: Option<WithPayload>,
    pub with_vector: Option<bool>,
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
    /// Set payload: the keys to merge (an object, checked by the database).
    pub payload: Option<Value>,
    /// Set payload into a nested key: not supported.
    pub key: Option<IgnoredAny>,
}

/// `POST .../points/scroll`.
#[derive(Debug, Deserialize)]
pub struct Scroll {
    pub filter: Option<Value>,
    pub offset: Option<PointId>,
    pub limit: Option<Limit>,
    pub with_payload: Option<WithPayload>,
    pub with_vector: Option<bool>,
    pub order_by: Option<IgnoredAny>,
}

/// What `query` asks for: a vector, `{"nearest": vector}` or the vector of
/// a stored point.
#[derive(Debug, Clone)]
pub enum QueryInput {
    Vector(Vector, &'static str),
    Point(ExtId),
}

impl<'de> Deserialize<'de> for QueryInput {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = QueryInput;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a vector, {\"nearest\": vector} or a point id")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<QueryInput, A::Error> {
                Ok(QueryInput::Vector(Vector(components(seq)?), "query"))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<QueryInput, A::Error> {
                match map.next_key::<String>()? {
                    Some(k) if k == "nearest" => {
                        let v = map.next_value::<Vector>()?;
                        if map.next_key::<IgnoredAny>()?.is_some() {
                            return Err(de::Error::custom("query: expected {\"nearest\": vector}"));
                        }
                        Ok(QueryInput::Vector(v, "query.nearest"))
                    }
                    Some(k) => Err(de::Error::custom(format!(
                        "query {k:?} is not supported; a query is a vector, \
                         {{\"nearest\": vector}} or a point id"
                    ))),
                    None => Err(de::Error::custom("query: expected {\"nearest\": vector}")),
                }
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<QueryInput, E> {
                PointIdVisitor.visit_u64(v).map(QueryInput::Point)
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<QueryInput, E> {
                PointIdVisitor.visit_i64(v).map(QueryInput::Point)
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<QueryInput, E> {
                PointIdVisitor.visit_str(v).map(QueryInput::Point)
            }
        }
        d.deserialize_any(V)
    }
}

/// A query's `params`: Qdrant's `hnsw_ef` and `exact`, and our `vectide`
/// object of native knobs (`{"nprobe": 32}`), checked against the engine's.
#[derive(Debug, Deserialize, Default)]
pub struct SearchParamsIn {
    pub hnsw_ef: Option<Ef>,
    pub exact: Option<bool>,
    pub vectide: Option<BTreeMap<String, u64>>,
}

/// One query of `/points/query`, `/points/query/batch` (`query`) or
/// `/points/search` (`vector`).
#[derive(Debug, Deserialize)]
#[serde(expecting = "a query request object")]
pub struct QueryRequest {
    pub query: Option<QueryInput>,
    pub vector: Option<Vector>,
    pub using: Option<IgnoredAny>,
    pub prefetch: Option<IgnoredAny>,
    pub lookup_from: Option<IgnoredAny>,
    pub filter: Option<Value>,
    pub limit: Option<Limit>,
    pub offset: Option<Limit>,
    pub params: Option<SearchParamsIn>,
    pub with_payload: Option<WithPayload>,
    pub with_vector: Option<bool>,
    pub score_threshold: Option<f64>,
}

/// `POST .../points/query/batch`.
#[derive(Debug, Deserialize)]
pub struct QueryBatch {
    pub searches: Vec<QueryRequest>,
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

/// A stored point (retrieve, scroll).
#[derive(Debug, Serialize)]
pub struct Record {
    pub id: Value,
    pub payload: Option<Value>,
    pub vector: Option<Vec<f32>>,
}

/// A point found by a query.
#[derive(Debug, Serialize)]
pub struct ScoredPoint {
    pub id: Value,
    pub version: u64,
    pub score: f32,
    pub payload: Option<Value>,
    pub vector: Option<Vec<f32>>,
}

#[derive(Debug, Serialize)]
pub struct QueryResponse {
    pub points: Vec<ScoredPoint>,
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
        let q: QueryRequest = parse(r#"{"limit": 100000, "offset": 0}"#).unwrap();
        assert_eq!(q.limit, Some(Bounded(100_000)));
        for (body, needle) in [
            (
                r#"{"limit": 100001}"#,
                "limit: invalid value: integer `100001`",
            ),
            (r#"{"limit": -1}"#, "limit: invalid value: integer `-1`"),
            (r#"{"limit": 1.5}"#, "limit: invalid type: floating point"),
            (r#"{"limit": "10"}"#, "limit: invalid type: string"),
            (r#"{"limit": true}"#, "limit: invalid type: boolean"),
            (r#"{"params": {"hnsw_ef": 0}}"#, "params.hnsw_ef"),
            (r#"{"limit": 18446744073709551616}"#, "2**64-1"),
        ] {
            let e = parse::<QueryRequest>(body).unwrap_err();
            assert!(e.contains(needle), "{body}: {e}");
        }
        let e = parse::<QueryRequest>(r#"{"offset": 100001}"#).unwrap_err();
        assert!(e.contains("0..=100000"), "{e}");
    }

    #[test]
    fn vectors_ids_and_payload_selectors() {
        let u: Upsert = parse(
            r#"{"points": [{"id": 1, "vector": [1, 2.5]}, {"id": "a-key", "vector": [0, 0], "payload": {"x": 1}}]}"#,
        )
        .unwrap();
        let pts = u.points.unwrap();
        assert_eq!(pts[0].vector.0, vec![1.0, 2.5]);
        assert!(matches!(pts[1].id.0, ExtId::Str(ref s) if s == "a-key"));
        for (body, needle) in [
            (
                r#"{"points": [{"id": 1, "vector": [1e39, 0]}]}"#,
                "points[0].vector[0]",
            ),
            (
                r#"{"points": [{"id": 1, "vector": [1, "a"]}]}"#,
                "finite number",
            ),
            (r#"{"points": [{"id": 1, "vector": {"a": [1]}}]}"#, "named"),
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
    fn queries_and_bodies_that_are_not_objects() {
        let q: QueryRequest = parse(r#"{"query": {"nearest": [1, 2]}}"#).unwrap();
        assert!(
            matches!(q.query, Some(QueryInput::Vector(ref v, "query.nearest")) if v.0 == [1.0, 2.0])
        );
        let q: QueryRequest = parse(r#"{"query": 7}"#).unwrap();
        assert!(matches!(q.query, Some(QueryInput::Point(ExtId::Num(7)))));
        let deep = format!(r#"{{"x": {}1{}}}"#, "[".repeat(200), "]".repeat(200));
        for (body, needle) in [
            (r#"{"query": true}"#, "query: invalid type: boolean"),
            (
                r#"{"query": {"recommend": {}}}"#,
                "\"recommend\" is not supported",
            ),
            (r#"{"query": 1.5}"#, "point id"),
            ("[]", "must be a JSON object"),
            ("5", "must be a JSON object"),
            ("{\"a\": 1", "malformed JSON body"),
            ("{} x", "malformed JSON body"),
            (deep.as_str(), "nested deeper"),
        ] {
            let e = parse::<QueryRequest>(body).unwrap_err();
            assert!(e.contains(needle), "{body}: {e}");
        }
        let e = parse::<CreateCollection>(r#"{"vectide": {"engin": "flat"}}"#).unwrap_err();
        assert!(e.contains("unknown field `engin`"), "{e}");
        let c: CreateCollection = parse(
            r#"{"vectors": {"size": 4, "distance": "Dot", "on_disk": null}, "shard_number": 1, "hnsw_config": {"m": 8, "payload_m": null}}"#,
        )
        .unwrap();
        assert_eq!(c.vectors.unwrap().distance, Some(Distance::Dot));
        assert_eq!(c.hnsw_config.unwrap().m, Some(8));
        for (body, needle) in [
            (
                r#"{"vectors": {"size": 4, "distance": 5}}"#,
                "vectors.distance: invalid type",
            ),
            (
                r#"{"vectors": {"size": 4, "distance": "Manhattan"}}"#,
                "unknown variant `Manhattan`",
            ),
        ] {
            let e = parse::<CreateCollection>(body).unwrap_err();
            assert!(e.contains(needle), "{body}: {e}");
        }
    }
}
