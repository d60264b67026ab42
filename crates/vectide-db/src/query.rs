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
//! `using` names (the unnamed `""` by default); `{"fusion": "rrf" | "dbsf"}`
//! or `{"rrf": {"k": K}}` fuses the prefetches' answers; no query lists
//! points in id order (score 1). Prefetches nest; each level's filter is
//! joined with the filters above it as Qdrant joins them (clause by
//! clause: `must` conditions add up, `should` alternatives pool;
//! `Filter::merge`), so limits apply to filtered candidates. A nearest query above prefetches re-scores their union.
//! The semantics are Qdrant's, as its client's local mode implements them:
//! RRF scores `1 / (rank + k)` (k = 2 unless given) summed over the
//! sources, DBSF normalises each source by its mean ± 3 standard
//! deviations and sums; fused ties keep the order of first appearance; a
//! score threshold keeps scores above it (below it for Euclid), and fused
//! scores at or above it; a query by point id leaves that point out.

use crate::collection::{score, Collection};
use crate::error::{DbError, Result};
use crate::filter::{Condition, Filter};
use crate::ids::ExtId;
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
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Fusion {
    /// Reciprocal rank fusion with its constant `k`.
    Rrf(f64),
    /// Distribution-based score fusion.
    Dbsf,
}

#[derive(Debug, Clone, PartialEq)]
pub enum QueryKind {
    Nearest(VectorInput),
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
            if o.len() != 1 {
                return Err(DbError::invalid(format!(
                    "{at}: expected {{\"nearest\": vector}} (mmr is not supported)"
                )));
            }
            Ok(Some(QueryKind::Nearest(vector_input(
                &o["nearest"],
                &format!("{at}.nearest"),
            )?)))
        }
        Value::Object(o) if o.contains_key("fusion") => match (o.len(), o["fusion"].as_str()) {
            (1, Some("rrf")) => Ok(Some(QueryKind::Fusion(Fusion::Rrf(2.0)))),
            (1, Some("dbsf")) => Ok(Some(QueryKind::Fusion(Fusion::Dbsf))),
            _ => Err(DbError::invalid(format!(
                "{at}.fusion must be \"rrf\" or \"dbsf\", got {}",
                o["fusion"]
            ))),
        },
        Value::Object(o) if o.contains_key("rrf") => {
            let r = obj(&o["rrf"], &format!("{at}.rrf"))?;
            for (k, x) in r {
                if k != "k" && !x.is_null() {
                    return Err(DbError::invalid(format!(
                        "{at}.rrf: {k:?} is not supported (only k)"
                    )));
                }
            }
            let k = count(r.get("k"), &format!("{at}.rrf.k"), 1, 1 << 20)?.unwrap_or(2);
            Ok(Some(QueryKind::Fusion(Fusion::Rrf(k as f64))))
        }
        Value::Object(o) if !(o.contains_key("indices") || o.contains_key("values")) => {
            let which = o.keys().next().cloned().unwrap_or_default();
            Err(DbError::invalid(format!(
                "{at}: the query {which:?} is not supported (a vector, a sparse vector, a point id, {{\"nearest\": ...}}, {{\"fusion\": \"rrf\" | \"dbsf\"}} or {{\"rrf\": {{\"k\"}}}})"
            )))
        }
        _ => Ok(Some(QueryKind::Nearest(vector_input(v, at)?))),
    }
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
    if matches!(q, Some(QueryKind::Fusion(_))) && prefetch.is_empty() {
        let at = if at.is_empty() {
            "query".to_string()
        } else {
            format!("{at}.query")
        };
        return Err(DbError::invalid(format!(
            "{at}: a fusion needs prefetches to fuse"
        )));
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

    fn run_level(&self, mut l: Level<'_>) -> Result<Vec<Found>> {
        if l.prefetch.is_empty() {
            return self.base(&l);
        }
        // A query by point id leaves that point out of this level and of
        // its prefetches (the filter reaches them).
        if let Some(QueryKind::Nearest(VectorInput::Point(id))) = l.query {
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
                    Fusion::Rrf(k) => rrf(&sources, *k),
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
        let k = l.limit + l.offset;
        let (with_payload, with_vector) = l.fetch.unwrap_or((false, false));
        let fetched = l.fetch.is_some();
        let Some(QueryKind::Nearest(input)) = l.query else {
            // No query: points in id order.
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
        let (hits, metric) = match input {
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
                (hits, metric)
            }
            VectorInput::Sparse(v) => (
                self.search_sparse(l.using, v, k, filter.as_ref(), with_payload, with_vector)
                    .map_err(using)?,
                Metric::Ip,
            ),
            VectorInput::Point(_) => unreachable!("resolved above"),
        };
        Ok(hits
            .into_iter()
            .map(|h| {
                let s = score(metric, h.distance);
                let f = fetched.then(|| (h.payload.unwrap_or(Value::Null), h.vector, h.vectors));
                (h.id, s, f)
            })
            .filter(|(_, s, _)| {
                l.threshold.is_none_or(|t| match metric {
                    Metric::L2 => *s < t,
                    _ => *s > t,
                })
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

/// Reciprocal rank fusion: `1 / (rank + k)` summed over the sources (rank
/// from 0), best first; ties keep the order of first appearance.
pub fn rrf(sources: &[Vec<Scored>], k: f64) -> Vec<Scored> {
    let mut fused = Fused::default();
    for src in sources {
        for (rank, (id, _)) in src.iter().enumerate() {
            fused.add(id, 1.0 / (rank as f64 + k));
        }
    }
    fused.sorted()
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
        let r = rrf(&[a.clone(), b.clone()], 2.0);
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
        assert_eq!(ok.query, Some(QueryKind::Fusion(Fusion::Rrf(60.0))));
        assert_eq!(ok.prefetch[1].limit, 10);
        assert_eq!(ok.with_vector, WithVector::Names(vec!["d".into()]));
    }
}
