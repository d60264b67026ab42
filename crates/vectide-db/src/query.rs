//! The Query API (Qdrant's `/points/query`): one parser of its JSON shape
//! and one evaluation, which the server, the embedded Python API and the
//! HTTP client all reach.
//!
//! ```json
//! {"prefetch": [{"query": [0.1, 0.2], "using": "dense", "limit": 100},
//!               {"query": {"indices": [3, 9], "values": [0.5, 1.0]}, "using": "bm25"}],
//!  "query": {"fusion": "rrf"}, "filter": {...}, "limit": 10, "offset": 0,
//!  "score_threshold": null, "with_payload": true, "with_vector": false}
//! ```
//!
//! A query is nearest by a dense vector, a sparse vector or a stored
//! point's vector (`{"nearest": ...}` or the bare input), in the space
//! `using` names (the unnamed `""` by default), re-ranked by maximal
//! marginal relevance with `{"nearest": ..., "mmr": {"diversity",
//! "candidates_limit"}}`; `{"fusion": "rrf" | "dbsf"}` or `{"rrf": {"k": K,
//! "weights": [...]}}` fuses the prefetches' answers; no query lists
//! points in id order (score 1). A grouped query (`/points/query/groups`,
//! [`GroupsRequest`]) puts a query's answer in groups by a payload key.
//! Prefetches nest; each level's filter is
//! joined with the filters above it as Qdrant joins them (clause by
//! clause: `must` conditions add up, `should` alternatives pool;
//! `Filter::merge`), so limits apply to filtered candidates. A nearest query above prefetches re-scores their union.
//! The semantics are Qdrant's, as its client's local mode implements them:
//! RRF scores `1 / (rank + k)` (k = 2 unless given) summed over the
//! sources (`1 / ((rank + 1) / w + k − 1)` for a source of weight `w`),
//! DBSF normalises each source by its mean ± 3 standard
//! deviations and sums; fused ties keep the order of first appearance; a
//! score threshold keeps scores above it (below it for Euclid), and fused
//! scores at or above it; a query by point id leaves that point out. MMR
//! re-ranks the `candidates_limit` nearest (the limit unless given; the
//! threshold applies to them, the offset to the re-ranked answer) with
//! `λ = 1 − diversity`, and its points keep their similarity as score.

use crate::collection::{score, Collection, Hit};
use crate::error::{DbError, Result};
use crate::filter::{Condition, Filter};
use crate::ids::ExtId;
use crate::path::KeyPath;
use crate::spaces::{NamedVectors, SparseVector, VectorValue};
use serde_json::Value;
use std::collections::HashMap;
use vectide_core::{limits, Metric, SearchParams};

/// Deepest nesting of prefetches.
pub const MAX_PREFETCH_DEPTH: usize = 8;

/// What a nearest query searches with.
#[derive(Debug, Clone, PartialEq)]
pub enum VectorInput {
    Dense(Vec<f32>),
    Sparse(SparseVector),
    /// A stored point's vector in the space searched.
    Point(ExtId),
}

/// How prefetches' answers are fused.
#[derive(Debug, Clone, PartialEq)]
pub enum Fusion {
    /// Reciprocal rank fusion with its constant `k` and, when given, one
    /// weight per prefetch (in the prefetches' order).
    Rrf { k: f64, weights: Option<Vec<f64>> },
    /// Distribution-based score fusion.
    Dbsf,
}

/// Maximal marginal relevance: the nearest candidates re-ranked, each
/// pick trading its similarity to the query against its similarity to
/// the points already picked.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Mmr {
    /// 0 (relevance only) ..= 1 (diversity only); 0.5 unless given.
    pub diversity: f64,
    /// How many nearest points are re-ranked (`candidates_limit`; the
    /// level's limit unless given).
    pub candidates: Option<usize>,
}

/// Most candidates an MMR query re-ranks (Qdrant's bound on
/// `candidates_limit`, `QdrantLocal.MMR_CANDIDATES_LIMIT_MAX`); a limit
/// standing in for an absent `candidates_limit` is clamped to it too.
pub const MAX_MMR_CANDIDATES: usize = 16_384;

#[derive(Debug, Clone, PartialEq)]
pub enum QueryKind {
    /// Nearest to the input, re-ranked by MMR when asked.
    Nearest(VectorInput, Option<Mmr>),
    Fusion(Fusion),
}

/// Search knobs as asked (resolved against the space's engine when run).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Knobs {
    pub hnsw_ef: Option<usize>,
    pub exact: bool,
    /// Native knobs by name (`{"nprobe": 32}`).
    pub native: Vec<(String, u64)>,
}

/// Which vectors to return.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum WithVector {
    #[default]
    None,
    All,
    Names(Vec<String>),
}

impl WithVector {
    pub fn parse(v: &Value, at: &str) -> Result<WithVector> {
        match v {
            Value::Null | Value::Bool(false) => Ok(WithVector::None),
            Value::Bool(true) => Ok(WithVector::All),
            Value::Array(a) => a
                .iter()
                .map(|x| {
                    x.as_str().map(str::to_string).ok_or_else(|| {
                        DbError::invalid(format!("{at}: a list of vector names, got {x}"))
                    })
                })
                .collect::<Result<Vec<_>>>()
                .map(WithVector::Names),
            other => Err(DbError::invalid(format!(
                "{at} must be a bool or a list of vector names, got {other}"
            ))),
        }
    }

    pub fn any(&self) -> bool {
        *self != WithVector::None
    }

    /// Keeps the asked vectors of `named`.
    pub fn select(&self, named: NamedVectors) -> NamedVectors {
        match self {
            WithVector::None => Vec::new(),
            WithVector::All => named,
            WithVector::Names(n) => named.into_iter().filter(|(k, _)| n.contains(k)).collect(),
        }
    }
}

/// One level of prefetch.
#[derive(Debug, Clone, PartialEq)]
pub struct Prefetch {
    pub prefetch: Vec<Prefetch>,
    pub query: Option<QueryKind>,
    pub using: Option<String>,
    pub filter: Option<Filter>,
    pub knobs: Knobs,
    pub score_threshold: Option<f32>,
    pub limit: usize,
}

/// A whole query request.
#[derive(Debug, Clone, PartialEq)]
pub struct QueryRequest {
    pub prefetch: Vec<Prefetch>,
    pub query: Option<QueryKind>,
    pub using: Option<String>,
    pub filter: Option<Filter>,
    pub knobs: Knobs,
    pub score_threshold: Option<f32>,
    pub limit: usize,
    pub offset: usize,
    pub with_payload: bool,
    pub with_vector: WithVector,
}

/// A point in a query's answer.
#[derive(Debug, Clone, PartialEq)]
pub struct ScoredPoint {
    pub id: ExtId,
    pub score: f32,
    pub payload: Option<Value>,
    /// The asked vectors, by space name (the single form's under `""`).
    pub vectors: Option<NamedVectors>,
}

// ---------------------------------------------------------------- parsing

fn obj<'a>(v: &'a Value, at: &str) -> Result<&'a serde_json::Map<String, Value>> {
    v.as_object()
        .ok_or_else(|| DbError::invalid(format!("{at} must be an object, got {v}")))
}

fn count(v: Option<&Value>, at: &str, lo: usize, hi: usize) -> Result<Option<usize>> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => n
            .as_u64()
            .filter(|&x| (lo as u64..=hi as u64).contains(&x))
            .map(|x| Some(x as usize))
            .ok_or_else(|| {
                DbError::invalid(format!("{at} must be an integer in {lo}..={hi}, got {n}"))
            }),
        Some(other) => Err(DbError::invalid(format!(
            "{at} must be an integer in {lo}..={hi}, got {other}"
        ))),
    }
}

fn threshold(v: Option<&Value>, at: &str) -> Result<Option<f32>> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => n
            .as_f64()
            .map(|x| x as f32)
            .filter(|x| x.is_finite())
            .map(Some)
            .ok_or_else(|| DbError::invalid(format!("{at} must be a finite number"))),
        Some(other) => Err(DbError::invalid(format!(
            "{at} must be a number, got {other}"
        ))),
    }
}

fn name(v: Option<&Value>, at: &str) -> Result<Option<String>> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(DbError::invalid(format!(
            "{at} must be a vector name, got {other}"
        ))),
    }
}

/// A dense vector (finite numbers) or a sparse one
/// (`{"indices", "values"}`), as a point or a query carries it.
pub fn parse_vector(v: &Value, at: &str) -> Result<VectorValue> {
    match v {
        Value::Array(a) => {
            if a.first().is_some_and(Value::is_array) {
                return Err(DbError::invalid(format!(
                    "{at}: multivectors are not supported"
                )));
            }
            a.iter()
                .enumerate()
                .map(|(i, x)| {
                    x.as_f64()
                        .map(|f| f as f32)
                        .filter(|f| f.is_finite())
                        .ok_or_else(|| {
                            DbError::invalid(format!("{at}[{i}] must be a finite number, got {x}"))
                        })
                })
                .collect::<Result<Vec<f32>>>()
                .map(VectorValue::Dense)
        }
        Value::Object(o) if o.contains_key("indices") || o.contains_key("values") => {
            for k in o.keys() {
                if k != "indices" && k != "values" {
                    return Err(DbError::invalid(format!(
                        "{at}: a sparse vector has indices and values, not {k:?}"
                    )));
                }
            }
            let list = |k: &str| {
                o.get(k).and_then(Value::as_array).ok_or_else(|| {
                    DbError::invalid(format!("{at}.{k} must be a list"))
                })
            };
            let indices = list("indices")?
                .iter()
                .enumerate()
                .map(|(i, x)| {
                    x.as_u64()
                        .and_then(|u| u32::try_from(u).ok())
                        .ok_or_else(|| {
                            DbError::invalid(format!(
                                "{at}.indices[{i}] must be an integer in 0..=4294967295, got {x}"
                            ))
                        })
                })
                .collect::<Result<Vec<u32>>>()?;
            let values = list("values")?
                .iter()
                .enumerate()
                .map(|(i, x)| {
                    x.as_f64()
                        .map(|f| f as f32)
                        .filter(|f| f.is_finite())
                        .ok_or_else(|| {
                            DbError::invalid(format!("{at}.values[{i}] must be a finite number, got {x}"))
                        })
                })
                .collect::<Result<Vec<f32>>>()?;
            SparseVector::new(indices, values)
                .map(VectorValue::Sparse)
                .map_err(|e| DbError::invalid(format!("{at}: {e}")))
        }
        other => Err(DbError::invalid(format!(
            "{at} must be a vector (a list of numbers) or a sparse vector {{\"indices\", \"values\"}}, got {other}"
        ))),
    }
}

/// A point's vectors in Qdrant's shape: a dense list (the unnamed space)
/// or `{"NAME": dense | sparse, ...}`.
pub fn parse_point_vectors(v: &Value, at: &str) -> Result<NamedVectors> {
    match v {
        Value::Object(o) if !(o.contains_key("indices") || o.contains_key("values")) => o
            .iter()
            .map(|(name, x)| Ok((name.clone(), parse_vector(x, &format!("{at}.{name}"))?)))
            .collect(),
        other => match parse_vector(other, at)? {
            d @ VectorValue::Dense(_) => Ok(vec![(String::new(), d)]),
            VectorValue::Sparse(_) => Err(DbError::invalid(format!(
                "{at}: a sparse vector needs its name: {{\"NAME\": {{\"indices\", \"values\"}}}}"
            ))),
        },
    }
}

fn vector_input(v: &Value, at: &str) -> Result<VectorInput> {
    match v {
        Value::Number(_) | Value::String(_) => ExtId::from_json(v)
            .map(VectorInput::Point)
            .map_err(|e| DbError::invalid(format!("{at}: {e}"))),
        _ => Ok(match parse_vector(v, at)? {
            VectorValue::Dense(d) => VectorInput::Dense(d),
            VectorValue::Sparse(s) => VectorInput::Sparse(s),
        }),
    }
}

fn query_kind(v: &Value, at: &str) -> Result<Option<QueryKind>> {
    // A null field is an absent one (clients send `"mmr": null`).
    let stripped;
    let v = match v {
        Value::Object(o) if o.values().any(Value::is_null) => {
            stripped = Value::Object(
                o.iter()
                    .filter(|(_, x)| !x.is_null())
                    .map(|(k, x)| (k.clone(), x.clone()))
                    .collect(),
            );
            &stripped
        }
        other => other,
    };
    match v {
        Value::Null => Ok(None),
        Value::Object(o) if o.contains_key("nearest") => {
            if let Some(k) = o.keys().find(|k| *k != "nearest" && *k != "mmr") {
                return Err(DbError::invalid(format!(
                    "{at}: unknown field {k:?} (expected {{\"nearest\": vector, \"mmr\": {{\"diversity\", \"candidates_limit\"}}}})"
                )));
            }
            let mmr = o
                .get("mmr")
                .map(|m| parse_mmr(m, &format!("{at}.mmr")))
                .transpose()?;
            Ok(Some(QueryKind::Nearest(
                vector_input(&o["nearest"], &format!("{at}.nearest"))?,
                mmr,
            )))
        }
        Value::Object(o) if o.contains_key("fusion") => match (o.len(), o["fusion"].as_str()) {
            (1, Some("rrf")) => Ok(Some(QueryKind::Fusion(Fusion::Rrf {
                k: 2.0,
                weights: None,
            }))),
            (1, Some("dbsf")) => Ok(Some(QueryKind::Fusion(Fusion::Dbsf))),
            _ => Err(DbError::invalid(format!(
                "{at}.fusion must be \"rrf\" or \"dbsf\", got {}",
                o["fusion"]
            ))),
        },
        Value::Object(o) if o.contains_key("rrf") => {
            let r = obj(&o["rrf"], &format!("{at}.rrf"))?;
            for (k, x) in r {
                if k != "k" && k != "weights" && !x.is_null() {
                    return Err(DbError::invalid(format!(
                        "{at}.rrf: {k:?} is not supported (only k and weights)"
                    )));
                }
            }
            let k = count(r.get("k"), &format!("{at}.rrf.k"), 1, 1 << 20)?.unwrap_or(2);
            let weights = match r.get("weights") {
                None | Some(Value::Null) => None,
                Some(Value::Array(a)) => Some(
                    a.iter()
                        .enumerate()
                        .map(|(i, x)| {
                            x.as_f64().filter(|w| w.is_finite()).ok_or_else(|| {
                                DbError::invalid(format!(
                                    "{at}.rrf.weights[{i}] must be a finite number, got {x}"
                                ))
                            })
                        })
                        .collect::<Result<Vec<f64>>>()?,
                ),
                Some(other) => {
                    return Err(DbError::invalid(format!(
                        "{at}.rrf.weights must be a list of numbers (one per prefetch), got {other}"
                    )))
                }
            };
            Ok(Some(QueryKind::Fusion(Fusion::Rrf {
                k: k as f64,
                weights,
            })))
        }
        Value::Object(o) if !(o.contains_key("indices") || o.contains_key("values")) => {
            let which = o.keys().next().cloned().unwrap_or_default();
            Err(DbError::invalid(format!(
                "{at}: the query {which:?} is not supported (a vector, a sparse vector, a point id, {{\"nearest\": ..., \"mmr\": ...}}, {{\"fusion\": \"rrf\" | \"dbsf\"}} or {{\"rrf\": {{\"k\", \"weights\"}}}})"
            )))
        }
        _ => Ok(Some(QueryKind::Nearest(vector_input(v, at)?, None))),
    }
}

/// `{"diversity": 0..=1, "candidates_limit": 0..=MAX_MMR_CANDIDATES}`,
/// both optional (Qdrant's `Mmr`; a null is an absent field).
fn parse_mmr(v: &Value, at: &str) -> Result<Mmr> {
    let o = obj(v, at)?;
    if let Some(k) = o
        .iter()
        .find(|(k, x)| *k != "diversity" && *k != "candidates_limit" && !x.is_null())
        .map(|(k, _)| k)
    {
        return Err(DbError::invalid(format!(
            "{at}: unknown field {k:?} (expected diversity and candidates_limit)"
        )));
    }
    let diversity = match o.get("diversity") {
        None | Some(Value::Null) => 0.5,
        Some(x) => x
            .as_f64()
            .filter(|d| (0.0..=1.0).contains(d))
            .ok_or_else(|| {
                DbError::invalid(format!("{at}.diversity must be a number in 0..=1, got {x}"))
            })?,
    };
    let candidates = count(
        o.get("candidates_limit"),
        &format!("{at}.candidates_limit"),
        0,
        MAX_MMR_CANDIDATES,
    )?;
    Ok(Mmr {
        diversity,
        candidates,
    })
}

impl Knobs {
    pub fn parse(v: Option<&Value>, at: &str) -> Result<Knobs> {
        let mut out = Knobs::default();
        let Some(v) = v.filter(|v| !v.is_null()) else {
            return Ok(out);
        };
        let o = obj(v, at)?;
        for (k, x) in o {
            match k.as_str() {
                "hnsw_ef" => {
                    out.hnsw_ef = count(Some(x), &format!("{at}.hnsw_ef"), 1, limits::MAX_EF)?
                }
                "exact" => {
                    out.exact = match x {
                        Value::Null => false,
                        Value::Bool(b) => *b,
                        other => {
                            return Err(DbError::invalid(format!(
                                "{at}.exact must be a bool, got {other}"
                            )))
                        }
                    }
                }
                "vectide" => {
                    if x.is_null() {
                        continue;
                    }
                    for (name, n) in obj(x, &format!("{at}.vectide"))? {
                        let n = n.as_u64().ok_or_else(|| {
                            DbError::invalid(format!(
                                "{at}.vectide.{name} must be a positive integer, got {n}"
                            ))
                        })?;
                        out.native.push((name.clone(), n));
                    }
                }
                // Qdrant's other knobs (quantization, indexed_only, acorn,
                // idf) are accepted and have no effect here.
                _ => {}
            }
        }
        Ok(out)
    }

    /// The knobs for a space's engine: `hnsw_ef` sets its primary knob
    /// (ignored by an engine without one), the native ones are checked
    /// against the knobs it takes.
    pub fn resolve(&self, desc: &vectide_core::engine::EngineDescriptor) -> Result<SearchParams> {
        let mut out = SearchParams {
            exact: self.exact,
            ..SearchParams::default()
        };
        if let (Some(ef), Some(knob)) = (self.hnsw_ef, desc.primary_knob) {
            out.set(knob, ef.min(knob.max()))?;
        }
        for (name, v) in &self.native {
            let knob = desc.knob(name)?;
            let max = knob.max();
            let value = usize::try_from(*v)
                .ok()
                .filter(|x| (1..=max).contains(x))
                .ok_or_else(|| {
                    DbError::invalid(format!(
                        "params.vectide.{name} must be an integer in 1..={max}, got {v}"
                    ))
                })?;
            out.set(knob, value)?;
        }
        Ok(out)
    }
}

fn filter_of(v: Option<&Value>, at: &str) -> Result<Option<Filter>> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(f) => Filter::parse(f)
            .map(Some)
            .map_err(|e| DbError::invalid(format!("{at}: {e}"))),
    }
}

fn prefetches(v: Option<&Value>, at: &str, depth: usize) -> Result<Vec<Prefetch>> {
    if depth > MAX_PREFETCH_DEPTH {
        return Err(DbError::invalid(format!(
            "{at}: prefetches nested deeper than {MAX_PREFETCH_DEPTH} levels"
        )));
    }
    match v {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(a)) => a
            .iter()
            .enumerate()
            .map(|(i, p)| Prefetch::parse(p, &format!("{at}[{i}]"), depth))
            .collect(),
        Some(p @ Value::Object(_)) => Ok(vec![Prefetch::parse(p, at, depth)?]),
        Some(other) => Err(DbError::invalid(format!(
            "{at} must be a prefetch or a list of them, got {other}"
        ))),
    }
}

pub const PREFETCH_FIELDS: &[&str] = &[
    "prefetch",
    "query",
    "using",
    "filter",
    "params",
    "score_threshold",
    "limit",
    "lookup_from",
];

impl Prefetch {
    fn parse(v: &Value, at: &str, depth: usize) -> Result<Prefetch> {
        let o = obj(v, at)?;
        for k in o.keys() {
            if !PREFETCH_FIELDS.contains(&k.as_str()) {
                return Err(DbError::invalid(format!("{at}: unknown field {k:?}")));
            }
        }
        if o.get("lookup_from").is_some_and(|v| !v.is_null()) {
            return Err(DbError::invalid(format!(
                "{at}.lookup_from is not supported"
            )));
        }
        let p = Prefetch {
            prefetch: prefetches(o.get("prefetch"), &format!("{at}.prefetch"), depth + 1)?,
            query: query_kind(
                o.get("query").unwrap_or(&Value::Null),
                &format!("{at}.query"),
            )?,
            using: name(o.get("using"), &format!("{at}.using"))?,
            filter: filter_of(o.get("filter"), &format!("{at}.filter"))?,
            knobs: Knobs::parse(o.get("params"), &format!("{at}.params"))?,
            score_threshold: threshold(o.get("score_threshold"), &format!("{at}.score_threshold"))?,
            limit: count(o.get("limit"), &format!("{at}.limit"), 1, limits::MAX_K)?.unwrap_or(10),
        };
        check_fusion(&p.query, &p.prefetch, at)?;
        Ok(p)
    }
}

fn check_fusion(q: &Option<QueryKind>, prefetch: &[Prefetch], at: &str) -> Result<()> {
    let at = if at.is_empty() {
        "query".to_string()
    } else {
        format!("{at}.query")
    };
    if matches!(q, Some(QueryKind::Fusion(_))) && prefetch.is_empty() {
        return Err(DbError::invalid(format!(
            "{at}: a fusion needs prefetches to fuse"
        )));
    }
    if let Some(QueryKind::Fusion(Fusion::Rrf {
        weights: Some(w), ..
    })) = q
    {
        if w.len() != prefetch.len() {
            return Err(DbError::invalid(format!(
                "{at}.rrf.weights: {} weights for {} prefetches (one weight per prefetch)",
                w.len(),
                prefetch.len()
            )));
        }
    }
    Ok(())
}

pub const QUERY_FIELDS: &[&str] = &[
    "prefetch",
    "query",
    "using",
    "filter",
    "params",
    "score_threshold",
    "limit",
    "offset",
    "with_payload",
    "with_vector",
    "with_vectors",
    "lookup_from",
    "shard_key",
];

impl QueryRequest {
    /// Parses a `/points/query` body (`with_payload`'s value is the front
    /// end's to read: here only whether any payload is wanted).
    pub fn parse(v: &Value) -> Result<QueryRequest> {
        let o = obj(v, "query request")?;
        for k in o.keys() {
            if !QUERY_FIELDS.contains(&k.as_str()) {
                return Err(DbError::invalid(format!("unknown field {k:?}")));
            }
        }
        if o.get("lookup_from").is_some_and(|v| !v.is_null()) {
            return Err(DbError::invalid("lookup_from is not supported"));
        }
        let limit = count(o.get("limit"), "limit", 0, limits::MAX_K)?.unwrap_or(10);
        let offset = count(o.get("offset"), "offset", 0, limits::MAX_K)?.unwrap_or(0);
        limits::check_page(offset, limit)?;
        let q = QueryRequest {
            prefetch: prefetches(o.get("prefetch"), "prefetch", 1)?,
            query: query_kind(o.get("query").unwrap_or(&Value::Null), "query")?,
            using: name(o.get("using"), "using")?,
            filter: filter_of(o.get("filter"), "filter")?,
            knobs: Knobs::parse(o.get("params"), "params")?,
            score_threshold: threshold(o.get("score_threshold"), "score_threshold")?,
            limit,
            offset,
            with_payload: !matches!(o.get("with_payload"), Some(Value::Bool(false))),
            with_vector: WithVector::parse(
                o.get("with_vector")
                    .or(o.get("with_vectors"))
                    .unwrap_or(&Value::Null),
                "with_vector",
            )?,
        };
        check_fusion(&q.query, &q.prefetch, "")?;
        Ok(q)
    }
}

/// The fields of a `/points/query/groups` body: a query's, without
/// `offset`, and the grouping.
pub const GROUPS_FIELDS: &[&str] = &[
    "prefetch",
    "query",
    "using",
    "filter",
    "params",
    "score_threshold",
    "limit",
    "with_payload",
    "with_vector",
    "with_vectors",
    "lookup_from",
    "shard_key",
    "group_by",
    "group_size",
    "with_lookup",
];

/// A grouped query (Qdrant's `/points/query/groups`): the query's answer
/// put in groups by the value(s) at a payload key path.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupsRequest {
    /// The query; its `limit` is the number of groups (offset 0).
    pub query: QueryRequest,
    pub group_by: KeyPath,
    /// Most hits per group.
    pub group_size: usize,
}

/// One group of a grouped query's answer.
#[derive(Debug, Clone, PartialEq)]
pub struct PointGroup {
    /// The value the group's points share at `group_by`: an integer or a
    /// string.
    pub id: Value,
    pub hits: Vec<ScoredPoint>,
}

impl GroupsRequest {
    /// Parses a `/points/query/groups` body: the query's fields (as
    /// [`QueryRequest::parse`] reads them), `group_by` (a key path,
    /// required), `group_size` (3 unless given) and `limit` (groups, 10
    /// unless given), both at least 1.
    pub fn parse(v: &Value) -> Result<GroupsRequest> {
        let o = obj(v, "query groups request")?;
        for k in o.keys() {
            if !GROUPS_FIELDS.contains(&k.as_str()) {
                return Err(DbError::invalid(format!("unknown field {k:?}")));
            }
        }
        if o.get("with_lookup").is_some_and(|v| !v.is_null()) {
            return Err(DbError::invalid("with_lookup is not supported"));
        }
        let group_by = match o.get("group_by") {
            Some(Value::String(s)) => {
                KeyPath::parse(s).map_err(|e| DbError::invalid(format!("group_by: {e}")))?
            }
            None | Some(Value::Null) => {
                return Err(DbError::invalid(
                    "group_by (a payload key path) is required",
                ))
            }
            Some(other) => {
                return Err(DbError::invalid(format!(
                    "group_by must be a payload key path, got {other}"
                )))
            }
        };
        let group_size = count(o.get("group_size"), "group_size", 1, limits::MAX_K)?.unwrap_or(3);
        let limit = count(o.get("limit"), "limit", 1, limits::MAX_K)?.unwrap_or(10);
        let mut rest = o.clone();
        for k in ["group_by", "group_size", "with_lookup"] {
            rest.remove(k);
        }
        rest.insert("limit".into(), Value::from(limit));
        Ok(GroupsRequest {
            query: QueryRequest::parse(&Value::Object(rest))?,
            group_by,
            group_size,
        })
    }
}

// ---------------------------------------------------------------- evaluation

fn with_condition(f: Option<Filter>, c: Condition, negate: bool) -> Filter {
    let mut f = f.unwrap_or_default();
    if negate {
        f.must_not.push(c);
    } else {
        f.must.push(c);
    }
    f
}

/// One level's parameters, as a base query or a prefetch gives them.
struct Level<'a> {
    prefetch: &'a [Prefetch],
    query: Option<&'a QueryKind>,
    using: &'a str,
    filter: Option<Filter>,
    knobs: &'a Knobs,
    threshold: Option<f32>,
    limit: usize,
    offset: usize,
    /// For the top level: whether its answer carries payloads and vectors
    /// (read with the search under one look at the store, so that a point
    /// deleted meanwhile is replaced by the next, not dropped). `None` for
    /// a prefetch, whose candidates carry nothing.
    fetch: Option<(bool, bool)>,
}

/// A candidate: id and score.
type Scored = (ExtId, f32);

/// A candidate with what its level fetched: `(payload, main vector, named
/// vectors)`.
type Found = (
    ExtId,
    f32,
    Option<(Value, Option<Vec<f32>>, Option<NamedVectors>)>,
);

impl Collection {
    /// Runs a query (see the module docs).
    pub fn query(&self, q: &QueryRequest) -> Result<Vec<ScoredPoint>> {
        if q.limit == 0 {
            return Ok(Vec::new());
        }
        let level = Level {
            prefetch: &q.prefetch,
            query: q.query.as_ref(),
            using: q.using.as_deref().unwrap_or(""),
            filter: q.filter.clone(),
            knobs: &q.knobs,
            threshold: q.score_threshold,
            limit: q.limit,
            offset: q.offset,
            fetch: Some((q.with_payload, q.with_vector.any())),
        };
        let found = self.run_level(level)?;
        // A fused answer's payloads and vectors are read now (a point
        // deleted since is dropped); a searched one's came with it.
        let missing: Vec<ExtId> = found
            .iter()
            .filter(|f| f.2.is_none())
            .map(|f| f.0.clone())
            .collect();
        let mut late: HashMap<ExtId, crate::Record> = self
            .get(&missing, q.with_vector.any())?
            .into_iter()
            .flatten()
            .map(|r| (r.id.clone(), r))
            .collect();
        Ok(found
            .into_iter()
            .filter_map(|(id, score, fetched)| {
                let (payload, vector, vectors) = match fetched {
                    Some(f) => f,
                    None => {
                        let r = late.remove(&id)?;
                        (r.payload, r.vector, r.vectors)
                    }
                };
                let vectors = q.with_vector.any().then(|| {
                    let named = match vectors {
                        Some(n) => n,
                        None => vector
                            .map(|v| vec![(String::new(), VectorValue::Dense(v))])
                            .unwrap_or_default(),
                    };
                    q.with_vector.select(named)
                });
                Some(ScoredPoint {
                    id,
                    score,
                    payload: q.with_payload.then_some(payload),
                    vectors,
                })
            })
            .collect())
    }

    /// Runs a grouped query (see [`GroupsRequest`]), as qdrant-client's
    /// local mode does (`LocalCollection.query_groups`): the query runs
    /// over the whole collection (every prefetch's limit is lifted to the
    /// number of points, and so is an absent `candidates_limit` of MMR);
    /// its points, in the answer's order, join the group of each distinct
    /// value they hold at `group_by` (an integer or a string; a point
    /// holding any other value there, or none, joins no group); a group
    /// keeps its first `group_size` hits, and the first `limit` groups to
    /// appear are the answer, ordered by their best hit.
    ///
    /// The answer is read in pages that grow (a query's answer to a larger
    /// limit extends its answer to a smaller one) until those groups are
    /// full or the answer has ended; at most [`limits::MAX_K`] points are
    /// read, and a query with prefetches, which runs them whole each time,
    /// is read once.
    pub fn query_groups(&self, g: &GroupsRequest) -> Result<Vec<PointGroup>> {
        let cap = self.len().clamp(1, limits::MAX_K);
        let groups = g.query.limit;
        let mut q = g.query.clone();
        q.offset = 0;
        q.with_payload = true;
        lift_limits(&mut q.prefetch, cap);
        if let Some(QueryKind::Nearest(_, Some(m))) = &mut q.query {
            m.candidates.get_or_insert(cap.min(MAX_MMR_CANDIDATES));
        }
        let mut page = if q.prefetch.is_empty() {
            groups
                .saturating_mul(g.group_size)
                .saturating_mul(2)
                .clamp(1, cap)
        } else {
            cap
        };
        loop {
            q.limit = page;
            let found = self.query(&q)?;
            let ended = found.len() < page || page == cap;
            let mut out = group(found, &g.group_by, g.group_size, groups);
            let full = out.len() == groups && out.iter().all(|x| x.hits.len() == g.group_size);
            if ended || full {
                if !g.query.with_payload {
                    for h in out.iter_mut().flat_map(|x| x.hits.iter_mut()) {
                        h.payload = None;
                    }
                }
                return Ok(out);
            }
            page = page.saturating_mul(4).min(cap);
        }
    }

    fn run_level(&self, mut l: Level<'_>) -> Result<Vec<Found>> {
        if l.prefetch.is_empty() {
            return self.base(&l);
        }
        // A query by point id leaves that point out of this level and of
        // its prefetches (the filter reaches them).
        if let Some(QueryKind::Nearest(VectorInput::Point(id), _)) = l.query {
            l.filter = Some(with_condition(
                l.filter.take(),
                Condition::HasId([id.clone()].into_iter().collect()),
                true,
            ));
        }
        let sources = l
            .prefetch
            .iter()
            .map(|p| {
                self.run_level(Level {
                    prefetch: &p.prefetch,
                    query: p.query.as_ref(),
                    using: p.using.as_deref().unwrap_or(""),
                    filter: Filter::merge(l.filter.as_ref(), p.filter.as_ref()),
                    knobs: &p.knobs,
                    threshold: p.score_threshold,
                    limit: p.limit,
                    offset: 0,
                    fetch: None,
                })
                .map(|found| {
                    found
                        .into_iter()
                        .map(|(id, s, _)| (id, s))
                        .collect::<Vec<Scored>>()
                })
            })
            .collect::<Result<Vec<_>>>()?;
        match l.query {
            Some(QueryKind::Fusion(f)) => {
                let mut fused = match f {
                    Fusion::Rrf { k, weights } => rrf(&sources, *k, weights.as_deref()),
                    Fusion::Dbsf => dbsf(&sources),
                };
                fused.truncate(l.limit + l.offset);
                if let Some(t) = l.threshold {
                    fused.retain(|(_, s)| *s >= t);
                }
                Ok(fused
                    .into_iter()
                    .skip(l.offset)
                    .map(|(id, s)| (id, s, None))
                    .collect())
            }
            _ => {
                // Re-score the sources' union (or list it) at this level.
                let mut ids: Vec<ExtId> = sources.into_iter().flatten().map(|(id, _)| id).collect();
                ids.sort();
                ids.dedup();
                if ids.is_empty() {
                    return Ok(Vec::new());
                }
                let filter = with_condition(
                    l.filter.clone(),
                    Condition::HasId(ids.into_iter().collect()),
                    false,
                );
                self.base(&Level {
                    filter: Some(filter),
                    prefetch: &[],
                    ..l
                })
            }
        }
    }

    /// A query without prefetches.
    fn base(&self, l: &Level<'_>) -> Result<Vec<Found>> {
        let (with_payload, with_vector) = l.fetch.unwrap_or((false, false));
        let fetched = l.fetch.is_some();
        let Some(QueryKind::Nearest(input, mmr)) = l.query else {
            // No query: points in id order.
            let k = l.limit + l.offset;
            let (page, _) = self.scroll(l.filter.as_ref(), None, k, with_vector)?;
            return Ok(page
                .into_iter()
                .skip(l.offset)
                .map(|r| {
                    let f = fetched.then_some((r.payload, r.vector, r.vectors));
                    (r.id, 1.0, f)
                })
                .collect());
        };
        let mut filter = l.filter.clone();
        let resolved;
        let input = match input {
            VectorInput::Point(id) => {
                resolved = self.vector_of_point(id, l.using)?;
                filter = Some(with_condition(
                    filter,
                    Condition::HasId([id.clone()].into_iter().collect()),
                    true,
                ));
                &resolved
            }
            other => other,
        };
        let using = |e: DbError| match e {
            DbError::Core(vectide_core::Error::InvalidInput(m))
                if m.contains("no vector named") =>
            {
                DbError::invalid(format!("using: {m}"))
            }
            other => other,
        };
        // Without MMR: the limit + offset nearest. With it: its
        // candidates (from offset 0), each with its vector in the space
        // searched; the offset applies to the re-ranked answer.
        let k = match mmr {
            None => l.limit + l.offset,
            Some(m) => m.candidates.unwrap_or(l.limit).min(MAX_MMR_CANDIDATES),
        };
        if k == 0 {
            return Ok(Vec::new());
        }
        let with_vector = with_vector || mmr.is_some();
        let (hits, metric, sparse) = match input {
            VectorInput::Dense(v) => {
                let params = l
                    .knobs
                    .resolve(self.dense_engine(l.using).map_err(using)?.descriptor())?;
                let metric = self.dense_space(l.using).map_err(using)?.config.metric;
                let hits = self.search_in(
                    l.using,
                    v,
                    k,
                    &params,
                    filter.as_ref(),
                    with_payload,
                    with_vector,
                )?;
                (hits, metric, false)
            }
            VectorInput::Sparse(v) => (
                self.search_sparse(l.using, v, k, filter.as_ref(), with_payload, with_vector)
                    .map_err(using)?,
                Metric::Ip,
                true,
            ),
            VectorInput::Point(_) => unreachable!("resolved above"),
        };
        let hits: Vec<(Hit, f32)> = hits
            .into_iter()
            .map(|h| {
                let s = score(metric, h.distance);
                (h, s)
            })
            .filter(|(_, s)| {
                l.threshold.is_none_or(|t| match metric {
                    Metric::L2 => *s < t,
                    _ => *s > t,
                })
            })
            .collect();
        let hits = match mmr {
            None => hits,
            Some(m) => {
                let space = if sparse {
                    Similarity::Sparse
                } else {
                    Similarity::Dense(metric)
                };
                let vectors: Vec<VectorValue> = hits
                    .iter()
                    .map(|(h, _)| {
                        vector_in(h, l.using).ok_or_else(|| {
                            DbError::invalid(format!("point {}: no vector {:?}", h.id, l.using))
                        })
                    })
                    .collect::<Result<_>>()?;
                let query = match input {
                    VectorInput::Dense(v) => VectorValue::Dense(v.clone()),
                    VectorInput::Sparse(v) => VectorValue::Sparse(v.clone()),
                    VectorInput::Point(_) => unreachable!("resolved above"),
                };
                let order = mmr_order(
                    &query,
                    &vectors,
                    space,
                    1.0 - m.diversity,
                    l.limit + l.offset,
                );
                let mut slots: Vec<Option<(Hit, f32)>> = hits.into_iter().map(Some).collect();
                order.into_iter().filter_map(|i| slots[i].take()).collect()
            }
        };
        Ok(hits
            .into_iter()
            .map(|(h, s)| {
                let f = fetched.then(|| (h.payload.unwrap_or(Value::Null), h.vector, h.vectors));
                (h.id, s, f)
            })
            .skip(l.offset)
            .collect())
    }

    /// A stored point's vector in the space `using`, as a query input.
    fn vector_of_point(&self, id: &ExtId, using: &str) -> Result<VectorInput> {
        let rec = self
            .get(std::slice::from_ref(id), true)?
            .into_iter()
            .next()
            .flatten()
            .ok_or_else(|| DbError::PointNotFound(format!("point {id}")))?;
        let named = match rec.vectors {
            Some(n) => n,
            None => rec
                .vector
                .map(|v| vec![(String::new(), VectorValue::Dense(v))])
                .unwrap_or_default(),
        };
        named
            .into_iter()
            .find(|(n, _)| n == using)
            .map(|(_, v)| match v {
                VectorValue::Dense(d) => VectorInput::Dense(d),
                VectorValue::Sparse(s) => VectorInput::Sparse(s),
            })
            .ok_or_else(|| DbError::PointNotFound(format!("vector {using:?} of point {id}")))
    }
}

/// Sets every (nested) prefetch's limit to `n`.
fn lift_limits(prefetch: &mut [Prefetch], n: usize) {
    for p in prefetch {
        p.limit = n;
        lift_limits(&mut p.prefetch, n);
    }
}

/// The distinct values (in payload order) that put a point in groups, with
/// their JSON text (1 and "1" differ): the values at `by` (an array there
/// gives its elements), or `None` when there are none or one of them is
/// neither an integer nor a string (the point then joins no group, as in
/// Qdrant).
fn group_ids(payload: &Value, by: &KeyPath) -> Option<Vec<(String, Value)>> {
    if !payload.is_object() {
        return None;
    }
    let mut found = Vec::new();
    by.values(payload, true, &mut found);
    if found.is_empty()
        || !found
            .iter()
            .all(|v| v.is_string() || v.is_i64() || v.is_u64())
    {
        return None;
    }
    let mut seen = std::collections::HashSet::with_capacity(found.len());
    Some(
        found
            .into_iter()
            .map(|v| (v.to_string(), v))
            .filter(|(key, _)| seen.insert(key.clone()))
            .map(|(key, v)| (key, v.clone()))
            .collect(),
    )
}

/// `points` (in answer order) in groups by their values at `by`: at most
/// `limit` groups, in order of first appearance, of at most `size` hits.
fn group(points: Vec<ScoredPoint>, by: &KeyPath, size: usize, limit: usize) -> Vec<PointGroup> {
    let mut out: Vec<PointGroup> = Vec::new();
    // A group's place by its value's JSON text.
    let mut place: HashMap<String, usize> = HashMap::new();
    for p in points {
        let Some(ids) = p.payload.as_ref().and_then(|x| group_ids(x, by)) else {
            continue;
        };
        for (key, id) in ids {
            let i = match place.get(&key) {
                Some(&i) => i,
                None if out.len() < limit => {
                    place.insert(key, out.len());
                    out.push(PointGroup {
                        id,
                        hits: Vec::new(),
                    });
                    out.len() - 1
                }
                None => continue,
            };
            if out[i].hits.len() < size {
                out[i].hits.push(p.clone());
            }
        }
    }
    out
}

/// Reciprocal rank fusion: `1 / (rank + k)` summed over the sources (rank
/// from 0), best first; ties keep the order of first appearance. With
/// weights (one per source), a source of weight `w` adds
/// `1 / ((rank + 1) / w + k - 1)`, and nothing when `w <= 0` (its points
/// still join the answer, at 0), as qdrant-client's
/// `hybrid.fusion.reciprocal_rank_fusion` computes it; a weight of 1 is
/// the unweighted term.
pub fn rrf(sources: &[Vec<Scored>], k: f64, weights: Option<&[f64]>) -> Vec<Scored> {
    let mut fused = Fused::default();
    for (i, src) in sources.iter().enumerate() {
        let w = weights.and_then(|w| w.get(i)).copied().unwrap_or(1.0);
        for (rank, (id, _)) in src.iter().enumerate() {
            let s = if w <= 0.0 {
                0.0
            } else {
                1.0 / ((rank as f64 + 1.0) / w + k - 1.0)
            };
            fused.add(id, s);
        }
    }
    fused.sorted()
}

/// How MMR compares two vectors: a dense space's metric as a similarity
/// (cosine, dot product, negated squared Euclidean distance), or a sparse
/// space's dot product (0 without a shared index).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Similarity {
    Dense(Metric),
    Sparse,
}

impl Similarity {
    /// The similarity of `a` and `b` (larger is closer), in f64. These are
    /// the values qdrant-client's local mode ranks by
    /// (`calculate_distance_core`: the cosine of the two vectors, the dot
    /// product, minus the squared distance; sparse: the plain dot product,
    /// without the space's IDF), not the scores shown.
    pub fn of(self, a: &VectorValue, b: &VectorValue) -> f64 {
        match (self, a, b) {
            (Similarity::Sparse, VectorValue::Sparse(x), VectorValue::Sparse(y)) => {
                x.dot(y).map_or(0.0, f64::from)
            }
            (Similarity::Dense(metric), VectorValue::Dense(x), VectorValue::Dense(y)) => {
                let dot = || -> f64 {
                    x.iter()
                        .zip(y)
                        .map(|(p, q)| f64::from(*p) * f64::from(*q))
                        .sum()
                };
                match metric {
                    Metric::Ip => dot(),
                    Metric::L2 => -x
                        .iter()
                        .zip(y)
                        .map(|(p, q)| (f64::from(*p) - f64::from(*q)).powi(2))
                        .sum::<f64>(),
                    Metric::Cosine => {
                        let norm = |v: &[f32]| -> f64 {
                            v.iter().map(|p| f64::from(*p).powi(2)).sum::<f64>().sqrt()
                        };
                        let (nx, ny) = (norm(x), norm(y));
                        if nx == 0.0 || ny == 0.0 {
                            0.0
                        } else {
                            dot() / (nx * ny)
                        }
                    }
                }
            }
            // Vectors of one space are all of its kind.
            _ => 0.0,
        }
    }
}

/// Maximal marginal relevance over `candidates` (in the order searched):
/// the positions of at most `limit` of them, in the order picked. The
/// first pick is the candidate most similar to `query`; each next one
/// maximises `λ·sim(query, c) − (1 − λ)·max sim(c, picked)`. As Qdrant
/// does it (and qdrant-client's local mode after it, `_mmr`), the
/// candidates still pending are kept in a list that a pick leaves by a
/// swap-remove (the last one moves into its place), and a tie goes to the
/// last maximum in that list's order. Each candidate's largest similarity
/// to the picked ones is kept up to date as picks are added, so a pick
/// costs one similarity per pending candidate.
pub fn mmr_order(
    query: &VectorValue,
    candidates: &[VectorValue],
    sim: Similarity,
    lambda: f64,
    limit: usize,
) -> Vec<usize> {
    if candidates.is_empty() || limit == 0 {
        return Vec::new();
    }
    let relevance: Vec<f64> = candidates.iter().map(|c| sim.of(query, c)).collect();
    let mut closest = vec![f64::NEG_INFINITY; candidates.len()];
    let mut pending: Vec<usize> = (0..candidates.len()).collect();
    let first = last_argmax(pending.iter().map(|&i| relevance[i]));
    let mut picked = vec![pending.swap_remove(first)];
    while picked.len() < limit && !pending.is_empty() {
        let last = &candidates[picked[picked.len() - 1]];
        for &i in &pending {
            closest[i] = closest[i].max(sim.of(&candidates[i], last));
        }
        let next = last_argmax(
            pending
                .iter()
                .map(|&i| lambda * relevance[i] - (1.0 - lambda) * closest[i]),
        );
        picked.push(pending.swap_remove(next));
    }
    picked
}

/// The position of the largest value, the last one on ties (Rust's
/// `Iterator::max_by`, which Qdrant's MMR uses).
fn last_argmax(values: impl Iterator<Item = f64>) -> usize {
    let mut best = (0, f64::NEG_INFINITY);
    for (i, v) in values.enumerate() {
        if i == 0 || v >= best.1 {
            best = (i, v);
        }
    }
    best.0
}

/// A hit's vector in the space `using` (searched with its vectors).
fn vector_in(h: &Hit, using: &str) -> Option<VectorValue> {
    match &h.vectors {
        Some(named) => named
            .iter()
            .find(|(n, _)| n == using)
            .map(|(_, v)| v.clone()),
        None => h.vector.clone().map(VectorValue::Dense),
    }
}

/// Distribution-based score fusion: each source's scores mapped by
/// `(s − (μ − 3σ)) / 6σ` (σ the sample deviation; a lone score or no
/// spread gives 0.5), summed, best first; ties keep the order of first
/// appearance.
pub fn dbsf(sources: &[Vec<Scored>]) -> Vec<Scored> {
    let mut fused = Fused::default();
    for src in sources.iter().filter(|s| !s.is_empty()) {
        let n = src.len() as f64;
        let xs: Vec<f64> = src.iter().map(|(_, s)| f64::from(*s)).collect();
        let mean = xs.iter().sum::<f64>() / n;
        let var = if src.len() > 1 {
            xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0)
        } else {
            0.0
        };
        let sd = var.sqrt();
        let (lo, hi) = (mean - 3.0 * sd, mean + 3.0 * sd);
        for ((id, _), x) in src.iter().zip(&xs) {
            let norm = if var == 0.0 {
                0.5
            } else {
                (x - lo) / (hi - lo)
            };
            fused.add(id, norm);
        }
    }
    fused.sorted()
}

/// Fused scores summed per id, remembering the order of first appearance
/// (Qdrant's fusions keep it for ties).
#[derive(Default)]
struct Fused {
    order: Vec<ExtId>,
    scores: HashMap<ExtId, f64>,
}

impl Fused {
    fn add(&mut self, id: &ExtId, s: f64) {
        match self.scores.get_mut(id) {
            Some(x) => *x += s,
            None => {
                self.order.push(id.clone());
                self.scores.insert(id.clone(), s);
            }
        }
    }

    /// The ids by score, best first, stable (ties in first-appearance order).
    fn sorted(self) -> Vec<Scored> {
        let mut out: Vec<(ExtId, f64)> = self
            .order
            .into_iter()
            .map(|id| {
                let s = self.scores[&id];
                (id, s)
            })
            .collect();
        out.sort_by(|a, b| b.1.total_cmp(&a.1));
        out.into_iter().map(|(id, s)| (id, s as f32)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ids(v: &[Scored]) -> Vec<u64> {
        v.iter()
            .map(|(id, _)| match id {
                ExtId::Num(n) => *n,
                _ => unreachable!(),
            })
            .collect()
    }

    fn src(xs: &[(u64, f32)]) -> Vec<Scored> {
        xs.iter().map(|&(i, s)| (ExtId::Num(i), s)).collect()
    }

    #[test]
    fn rrf_and_dbsf_follow_qdrant() {
        let a = src(&[(1, 0.9), (2, 0.8), (3, 0.1)]);
        let b = src(&[(3, 5.0), (4, 4.0)]);
        let r = rrf(&[a.clone(), b.clone()], 2.0, None);
        // 1: 1/2; 2: 1/3; 3: 1/4 + 1/2; 4: 1/3.
        assert_eq!(ids(&r), vec![3, 1, 2, 4]);
        assert!((r[0].1 - 0.75).abs() < 1e-6);
        let d = dbsf(&[a, b, Vec::new()]);
        // b: mean 4.5, sd 0.7071: 3 -> (5 - 2.379) / 4.243 = 0.618.
        assert_eq!(d.len(), 4);
        let s3 = d.iter().find(|x| x.0 == ExtId::Num(3)).unwrap().1;
        let m: f64 = (0.9 + 0.8 + 0.1) / 3.0;
        let sd = (((0.9 - m).powi(2) + (0.8 - m).powi(2) + (0.1 - m).powi(2)) / 2.0).sqrt();
        let want = (0.1 - (m - 3.0 * sd)) / (6.0 * sd)
            + (5.0 - (4.5 - 3.0 * 0.5f64.sqrt())) / (6.0 * 0.5f64.sqrt());
        assert!((f64::from(s3) - want).abs() < 1e-5, "{s3} vs {want}");
        let lone = dbsf(&[src(&[(9, 3.0)])]);
        assert_eq!(lone[0].1, 0.5);
    }

    #[test]
    fn bad_queries_name_the_field() {
        for (body, says) in [
            (json!({"query": {"fusion": "rrf"}}), "needs prefetches"),
            (json!({"query": {"fusion": "max"}, "prefetch": [{}]}), "rrf"),
            (
                json!({"query": {"indices": [1, 1], "values": [1, 2]}}),
                "appears twice",
            ),
            (
                json!({"query": {"indices": [1], "values": [1, 2]}}),
                "as many values",
            ),
            (
                json!({"query": {"indices": [-1], "values": [1]}}),
                "query.indices[0]",
            ),
            (json!({"query": {"recommend": {}}}), "not supported"),
            (json!({"prefetch": [{"limit": 0}]}), "prefetch[0].limit"),
            (
                json!({"prefetch": {"filter": {"must": [{"key": "a["}]}}}),
                "prefetch.filter",
            ),
            (json!({"limit": 100001}), "limit"),
            (json!({"usin": "x"}), "unknown field \"usin\""),
            (json!({"query": [[1.0]]}), "multivectors"),
            (json!({"with_vector": 3}), "with_vector"),
        ] {
            let e = QueryRequest::parse(&body).unwrap_err().to_string();
            assert!(e.contains(says), "{body}: {e}");
        }
        let mut deep = json!({});
        for _ in 0..12 {
            deep = json!({"prefetch": [deep]});
        }
        assert!(QueryRequest::parse(&deep)
            .unwrap_err()
            .to_string()
            .contains("deeper"));
        let ok = QueryRequest::parse(&json!({
            "prefetch": [{"query": [1.0, 2.0], "using": "d", "limit": 5},
                         {"query": {"indices": [3], "values": [1.0]}, "using": "s"}],
            "query": {"rrf": {"k": 60}}, "limit": 3, "with_vector": ["d"]
        }))
        .unwrap();
        assert_eq!(
            ok.query,
            Some(QueryKind::Fusion(Fusion::Rrf {
                k: 60.0,
                weights: None
            }))
        );
        assert_eq!(ok.prefetch[1].limit, 10);
        assert_eq!(ok.with_vector, WithVector::Names(vec!["d".into()]));
    }

    #[test]
    fn weighted_rrf_follows_qdrant_client() {
        let a = src(&[(1, 0.9), (2, 0.8), (3, 0.1)]);
        let b = src(&[(3, 5.0), (4, 4.0)]);
        let plain = rrf(&[a.clone(), b.clone()], 2.0, None);
        let ones = rrf(&[a.clone(), b.clone()], 2.0, Some(&[1.0, 1.0]));
        assert_eq!(plain, ones);
        // Weight 3 on a: rank r adds 1 / ((r + 1) / 3 + 1); b as before.
        let w = rrf(&[a.clone(), b.clone()], 2.0, Some(&[3.0, 1.0]));
        let want = |x: f64| x as f32;
        assert_eq!(ids(&w), vec![3, 1, 2, 4]);
        assert_eq!(w[0].1, want(1.0 / (3.0 / 3.0 + 1.0) + 1.0 / 2.0));
        assert_eq!(w[1].1, want(1.0 / (1.0 / 3.0 + 1.0)));
        assert_eq!(w[2].1, want(1.0 / (2.0 / 3.0 + 1.0)));
        assert_eq!(w[3].1, want(1.0 / 3.0));
        // A weight of 0 or less adds nothing; its points stay, at 0, in
        // the order they first appeared.
        let z = rrf(&[a, b], 60.0, Some(&[0.0, -2.0]));
        assert_eq!(ids(&z), vec![1, 2, 3, 4]);
        assert!(z.iter().all(|x| x.1 == 0.0));
    }

    fn dense(x: f32, y: f32) -> VectorValue {
        VectorValue::Dense(vec![x, y])
    }

    #[test]
    fn mmr_picks_as_qdrant_does() {
        let dot = Similarity::Dense(Metric::Ip);
        // After the first pick (0), the last candidate takes its place in
        // the pending list ([3, 1, 2]); 1, 2 and 3 then tie, and the last
        // maximum in that order wins (2); then [3, 1] tie again: 1.
        let c = [
            dense(1.0, 0.0),
            dense(0.0, 1.0),
            dense(0.0, -1.0),
            dense(0.0, 1.0),
        ];
        assert_eq!(
            mmr_order(&dense(1.0, 0.0), &c, dot, 0.5, 10),
            vec![0, 2, 1, 3]
        );
        assert_eq!(mmr_order(&dense(1.0, 0.0), &c, dot, 0.5, 2), vec![0, 2]);
        // Equally relevant: the last is picked first.
        let same = [dense(0.0, 1.0), dense(0.0, -1.0)];
        assert_eq!(mmr_order(&dense(1.0, 0.0), &same, dot, 0.5, 1), vec![1]);
        // λ = 1 is the nearest order; λ = 0 keeps only the first pick by
        // relevance, then the least similar to the picks.
        let q = dense(1.0, 0.0);
        let c = [
            dense(1.0, 0.1),
            dense(1.0, 0.2),
            dense(1.0, -0.9),
            dense(1.0, 0.15),
        ];
        let cos = Similarity::Dense(Metric::Cosine);
        assert_eq!(mmr_order(&q, &c, cos, 1.0, 4), vec![0, 3, 1, 2]);
        assert_eq!(mmr_order(&q, &c, cos, 0.0, 2), vec![0, 2]);
        assert!(mmr_order(&q, &[], cos, 0.5, 3).is_empty());
        // Euclid ranks by minus the squared distance; sparse by the plain
        // dot product, 0 without a shared index.
        let l2 = Similarity::Dense(Metric::L2);
        assert_eq!(l2.of(&dense(1.0, 1.0), &dense(4.0, 5.0)), -25.0);
        let sp = |i: Vec<u32>, v: Vec<f32>| VectorValue::Sparse(SparseVector::new(i, v).unwrap());
        let s = Similarity::Sparse;
        assert_eq!(
            s.of(
                &sp(vec![1, 5], vec![2.0, 3.0]),
                &sp(vec![5, 9], vec![0.5, 1.0])
            ),
            1.5
        );
        assert_eq!(s.of(&sp(vec![1], vec![2.0]), &sp(vec![2], vec![1.0])), 0.0);
    }

    #[test]
    fn new_query_shapes_parse_and_bad_ones_are_named() {
        let q = QueryRequest::parse(&json!({
            "query": {"nearest": [1.0, 0.0], "mmr": {"diversity": 0.25, "candidates_limit": 6}},
            "using": "", "limit": 3
        }))
        .unwrap();
        assert_eq!(
            q.query,
            Some(QueryKind::Nearest(
                VectorInput::Dense(vec![1.0, 0.0]),
                Some(Mmr {
                    diversity: 0.25,
                    candidates: Some(6)
                })
            ))
        );
        let q = QueryRequest::parse(&json!({"query": {"nearest": 7, "mmr": {}}})).unwrap();
        assert_eq!(
            q.query,
            Some(QueryKind::Nearest(
                VectorInput::Point(ExtId::Num(7)),
                Some(Mmr {
                    diversity: 0.5,
                    candidates: None
                })
            ))
        );
        let q = QueryRequest::parse(&json!({"query": {"nearest": [1.0], "mmr": null}})).unwrap();
        assert_eq!(
            q.query,
            Some(QueryKind::Nearest(VectorInput::Dense(vec![1.0]), None))
        );
        let q = QueryRequest::parse(&json!({
            "prefetch": [{"query": [1.0]}, {"query": [2.0]}],
            "query": {"rrf": {"weights": [3, 1.5]}}
        }))
        .unwrap();
        assert_eq!(
            q.query,
            Some(QueryKind::Fusion(Fusion::Rrf {
                k: 2.0,
                weights: Some(vec![3.0, 1.5])
            }))
        );
        let two = json!([{"query": [1.0]}, {"query": [2.0]}]);
        for (body, says) in [
            (
                json!({"query": {"nearest": [1.0], "mmr": {"diversity": 1.5}}}),
                "query.mmr.diversity must be a number in 0..=1",
            ),
            (
                json!({"query": {"nearest": [1.0], "mmr": {"diversity": "x"}}}),
                "query.mmr.diversity",
            ),
            (
                json!({"query": {"nearest": [1.0], "mmr": {"candidates_limit": 16385}}}),
                "query.mmr.candidates_limit must be an integer in 0..=16384",
            ),
            (
                json!({"query": {"nearest": [1.0], "mmr": {"candidates_limit": -1}}}),
                "candidates_limit",
            ),
            (
                json!({"query": {"nearest": [1.0], "mmr": {"lambda": 0.5}}}),
                "unknown field \"lambda\"",
            ),
            (
                json!({"query": {"nearest": [1.0], "mmr": 3}}),
                "query.mmr must be an object",
            ),
            (
                json!({"query": {"nearest": [1.0], "recommend": {}}}),
                "unknown field \"recommend\"",
            ),
            (
                json!({"prefetch": two, "query": {"rrf": {"weights": [1.0]}}}),
                "query.rrf.weights: 1 weights for 2 prefetches",
            ),
            (
                json!({"prefetch": [{"prefetch": two, "query": {"rrf": {"weights": [1, 2, 3]}}}], "query": {"fusion": "rrf"}}),
                "prefetch[0].query.rrf.weights: 3 weights for 2 prefetches",
            ),
            (
                json!({"prefetch": two, "query": {"rrf": {"weights": [1.0, "2"]}}}),
                "query.rrf.weights[1] must be a finite number",
            ),
            (
                json!({"prefetch": two, "query": {"rrf": {"weights": 2}}}),
                "query.rrf.weights must be a list",
            ),
            (
                json!({"prefetch": two, "query": {"rrf": {"weight": [1, 2]}}}),
                "\"weight\" is not supported",
            ),
        ] {
            let e = QueryRequest::parse(&body).unwrap_err().to_string();
            assert!(e.contains(says), "{body}: {e}");
        }
        let g = GroupsRequest::parse(&json!({"query": [1.0], "group_by": "meta.topic"})).unwrap();
        assert_eq!(
            (g.group_size, g.query.limit, g.group_by.as_str()),
            (3, 10, "meta.topic")
        );
        for (body, says) in [
            (
                json!({"query": [1.0]}),
                "group_by (a payload key path) is required",
            ),
            (
                json!({"group_by": 3}),
                "group_by must be a payload key path",
            ),
            (
                json!({"group_by": "a["}),
                "group_by: \"a[\" is not a valid key path",
            ),
            (
                json!({"group_by": "a", "group_size": 0}),
                "group_size must be an integer in 1..=",
            ),
            (
                json!({"group_by": "a", "limit": 0}),
                "limit must be an integer in 1..=",
            ),
            (
                json!({"group_by": "a", "offset": 2}),
                "unknown field \"offset\"",
            ),
            (
                json!({"group_by": "a", "with_lookup": "other"}),
                "with_lookup is not supported",
            ),
            (
                json!({"group_by": "a", "query": {"fusion": "rrf"}}),
                "needs prefetches",
            ),
            (json!([1]), "must be an object"),
        ] {
            let e = GroupsRequest::parse(&body).unwrap_err().to_string();
            assert!(e.contains(says), "{body}: {e}");
        }
    }

    /// Ten points on a cosine plane, `[1, 0.1·i + 0.01]`, with payloads to
    /// group by; the expected answers below are qdrant-client 1.20.0's
    /// local mode's on the same data and requests.
    fn plane() -> (tempfile::TempDir, std::sync::Arc<crate::Database>) {
        let dir = tempfile::tempdir().unwrap();
        let db = crate::Database::open(dir.path(), crate::Options::default()).unwrap();
        let c = db
            .create_collection("c", crate::CollectionConfig::new(2, Metric::Cosine, "flat"))
            .unwrap();
        let points: Vec<crate::PointInput> = (0..10u64)
            .map(|i| crate::PointInput {
                id: ExtId::Num(i),
                vector: vec![1.0, i as f32 * 0.1 + 0.01],
                payload: json!({
                    "g": i % 3,
                    "t": if i % 2 == 1 { json!(["a", "b"]) } else { json!("c") },
                    "f": 1.5,
                    "bad": [1, true],
                }),
            })
            .collect();
        c.upsert(&points).unwrap();
        (dir, db)
    }

    fn run(c: &Collection, body: Value) -> Vec<(u64, f32)> {
        c.query(&QueryRequest::parse(&body).unwrap())
            .unwrap()
            .into_iter()
            .map(|p| match p.id {
                ExtId::Num(n) => (n, p.score),
                _ => unreachable!(),
            })
            .collect()
    }

    fn only_ids(v: &[(u64, f32)]) -> Vec<u64> {
        v.iter().map(|x| x.0).collect()
    }

    #[test]
    fn mmr_through_a_collection_answers_as_local_mode() {
        let (_dir, db) = plane();
        let c = db.collection("c").unwrap();
        let mmr = |d: f64, cl: Option<usize>, limit: usize, offset: usize| {
            run(
                &c,
                json!({"query": {"nearest": [1.0, 0.3], "mmr": {"diversity": d, "candidates_limit": cl}},
                       "limit": limit, "offset": offset}),
            )
        };
        let two = mmr(0.5, Some(2), 3, 0);
        assert_eq!(only_ids(&two), vec![3, 2]);
        // The points keep their similarity to the query as score.
        assert!((two[0].1 - 0.999_958_2).abs() < 1e-5, "{two:?}");
        assert!((two[1].1 - 0.996_435).abs() < 1e-5, "{two:?}");
        assert_eq!(only_ids(&mmr(1.0, Some(10), 4, 0)), vec![3, 9, 0, 6]);
        assert_eq!(only_ids(&mmr(0.5, Some(10), 2, 1)), vec![0, 2]);
        assert!(mmr(0.5, Some(0), 3, 0).is_empty());
        // Diversity 0: the nearest order.
        let near = run(&c, json!({"query": [1.0, 0.3], "limit": 5}));
        assert_eq!(mmr(0.0, Some(10), 5, 0), near);
        // Without candidates_limit the limit's nearest are the candidates.
        assert_eq!(only_ids(&mmr(0.5, None, 2, 0)), only_ids(&near[..2]));
        // By point id: that point is left out.
        let by_id = run(
            &c,
            json!({"query": {"nearest": 3, "mmr": {"diversity": 0.5, "candidates_limit": 10}}, "limit": 4}),
        );
        assert_eq!(only_ids(&by_id), vec![4, 0, 2, 5]);
        // In a prefetch, and over one: a filter and a threshold apply to
        // the candidates.
        let f = run(
            &c,
            json!({"prefetch": {"query": {"nearest": [1.0, 0.3], "mmr": {"diversity": 1.0, "candidates_limit": 10}},
                                "limit": 2, "filter": {"must_not": [{"has_id": [3]}]}},
                   "query": {"fusion": "rrf"}}),
        );
        assert_eq!(only_ids(&f), vec![2, 9]);
        let t = run(
            &c,
            json!({"query": {"nearest": [1.0, 0.3], "mmr": {"diversity": 1.0, "candidates_limit": 10}},
                   "score_threshold": 0.99, "limit": 10}),
        );
        assert!(
            t.iter().all(|x| x.1 > 0.99) && t.len() < 10 && t[0].0 == 3,
            "{t:?}"
        );
    }

    #[test]
    fn weighted_rrf_through_a_collection_answers_as_local_mode() {
        let (_dir, db) = plane();
        let c = db.collection("c").unwrap();
        let pf = json!([{"query": [1.0, 0.3], "limit": 2}, {"query": [1.0, 0.9], "limit": 2}]);
        let w = run(
            &c,
            json!({"prefetch": pf, "query": {"rrf": {"weights": [3.0, 1.0]}}}),
        );
        assert_eq!(only_ids(&w), vec![3, 2, 9, 8]);
        for (got, want) in w.iter().zip([0.75, 0.6, 0.5, 1.0 / 3.0]) {
            assert!((f64::from(got.1) - want).abs() < 1e-6, "{w:?}");
        }
        let w = run(
            &c,
            json!({"prefetch": pf, "query": {"rrf": {"k": 10, "weights": [3.0, 0.5]}}}),
        );
        for (got, want) in w
            .iter()
            .zip([0.107_142_86, 0.103_448_28, 0.090_909_09, 0.076_923_08])
        {
            assert!((f64::from(got.1) - want).abs() < 1e-6, "{w:?}");
        }
    }

    fn grouped(c: &Collection, body: Value) -> Vec<(Value, Vec<(u64, f32)>)> {
        c.query_groups(&GroupsRequest::parse(&body).unwrap())
            .unwrap()
            .into_iter()
            .map(|g| {
                let hits = g
                    .hits
                    .iter()
                    .map(|p| match p.id {
                        ExtId::Num(n) => (n, p.score),
                        _ => unreachable!(),
                    })
                    .collect();
                (g.id, hits)
            })
            .collect()
    }

    fn group_ids_of(g: &[(Value, Vec<(u64, f32)>)]) -> Vec<(Value, Vec<u64>)> {
        g.iter().map(|(id, h)| (id.clone(), only_ids(h))).collect()
    }

    #[test]
    fn groups_through_a_collection_answer_as_local_mode() {
        let (_dir, db) = plane();
        let c = db.collection("c").unwrap();
        let q = |by: &str, limit: usize, size: usize| {
            group_ids_of(&grouped(
                &c,
                json!({"query": [1.0, 0.3], "group_by": by, "limit": limit, "group_size": size}),
            ))
        };
        assert_eq!(
            q("g", 2, 2),
            vec![(json!(0), vec![3, 6]), (json!(2), vec![2, 5])]
        );
        // An array puts a point in a group per value.
        assert_eq!(
            q("t", 5, 2),
            vec![
                (json!("a"), vec![3, 5]),
                (json!("b"), vec![3, 5]),
                (json!("c"), vec![2, 4])
            ]
        );
        // Floats, and an array holding a bool, group nothing; nor does a
        // key no point has.
        assert!(q("f", 5, 2).is_empty() && q("bad", 5, 2).is_empty() && q("nope", 5, 2).is_empty());
        // Every point in one group: the first group_size of the answer.
        let all = q("g", 10, 10);
        assert_eq!(all.len(), 3);
        assert_eq!(all[0].1.len(), 4);
        // No query: id order, score 1.
        let none = grouped(&c, json!({"group_by": "g", "limit": 5, "group_size": 2}));
        assert_eq!(
            group_ids_of(&none),
            vec![
                (json!(0), vec![0, 3]),
                (json!(1), vec![1, 4]),
                (json!(2), vec![2, 5])
            ]
        );
        assert!(none.iter().flat_map(|g| &g.1).all(|h| h.1 == 1.0));
        // Prefetch limits are lifted to the whole collection.
        let fused = grouped(
            &c,
            json!({"prefetch": [{"query": [1.0, 0.3], "limit": 2}, {"query": [1.0, 0.9], "limit": 2}],
                   "query": {"fusion": "rrf"}, "group_by": "g", "limit": 5, "group_size": 2}),
        );
        let want = [
            (0, [(3, 0.625), (9, 0.5909)]),
            (2, [(2, 0.4444), (8, 0.4333)]),
            (1, [(4, 0.3929), (7, 0.3611)]),
        ];
        assert_eq!(fused.len(), 3);
        for ((gid, hits), (wid, whits)) in fused.iter().zip(want) {
            assert_eq!(gid, &json!(wid));
            for (h, w) in hits.iter().zip(whits) {
                assert!(h.0 == w.0 && (h.1 - w.1).abs() < 1e-4, "{fused:?}");
            }
        }
        // Payloads only when asked; the grouping reads them regardless.
        let g = c
            .query_groups(
                &GroupsRequest::parse(
                    &json!({"query": [1.0, 0.3], "group_by": "g", "limit": 1, "group_size": 1, "with_payload": false}),
                )
                .unwrap(),
            )
            .unwrap();
        assert_eq!(g.len(), 1);
        assert_eq!(g[0].hits[0].payload, None);
    }

    #[test]
    fn groups_read_as_far_as_they_need_and_no_further() {
        let dir = tempfile::tempdir().unwrap();
        let db = crate::Database::open(dir.path(), crate::Options::default()).unwrap();
        let c = db
            .create_collection("big", crate::CollectionConfig::new(1, Metric::L2, "flat"))
            .unwrap();
        // 2,000 points on a line; group k holds the points i with
        // i % 500 == k, so the nearest to 0 fill groups 0, 1, ... in
        // order and group 0's third point is 1,000 away.
        let points: Vec<crate::PointInput> = (0..2000u64)
            .map(|i| crate::PointInput {
                id: ExtId::Num(i),
                vector: vec![i as f32],
                payload: json!({"k": i % 500}),
            })
            .collect();
        c.upsert(&points).unwrap();
        let g = grouped(
            &c,
            json!({"query": [0.0], "group_by": "k", "limit": 2, "group_size": 3}),
        );
        assert_eq!(
            group_ids_of(&g),
            vec![
                (json!(0), vec![0, 500, 1000]),
                (json!(1), vec![1, 501, 1001])
            ]
        );
        let g = grouped(
            &c,
            json!({"query": [0.0], "group_by": "k", "limit": 600, "group_size": 5,
                   "filter": {"must": [{"key": "k", "range": {"lt": 3}}]}}),
        );
        assert_eq!(g.len(), 3);
        assert!(g.iter().all(|x| x.1.len() == 4));
    }
}
