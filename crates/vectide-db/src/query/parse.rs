//! Reading a Query API request: the JSON shapes of queries, vectors,
//! prefetches, search knobs and groupings, each refused with the path of
//! the field at fault.

use super::{
    Fusion, GroupsRequest, Knobs, Mmr, Prefetch, QueryKind, QueryRequest, VectorInput, WithVector,
    MAX_MMR_CANDIDATES, MAX_PREFETCH_DEPTH,
};
use crate::error::{DbError, Result};
use crate::filter::Filter;
use crate::ids::ExtId;
use crate::path::KeyPath;
use crate::spaces::{NamedVectors, SparseVector, VectorValue};
use serde_json::Value;
use vectide_core::limits;

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
}

fn obj<'a>(v: &'a Value, at: &str) -> Result<&'a serde_json::Map<String, Value>> {
    v.as_object()
        .ok_or_else(|| DbError::invalid(format!("{at} must be an object, got {v}")))
}

/// Refuses the first field of `o` that `fields` does not name, as
/// `{at}: unknown field "k"` (`unknown field "k"` when `at` is empty).
fn known_fields(o: &serde_json::Map<String, Value>, fields: &[&str], at: &str) -> Result<()> {
    match o.keys().find(|k| !fields.contains(&k.as_str())) {
        None => Ok(()),
        Some(k) if at.is_empty() => Err(DbError::invalid(format!("unknown field {k:?}"))),
        Some(k) => Err(DbError::invalid(format!("{at}: unknown field {k:?}"))),
    }
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
        known_fields(o, PREFETCH_FIELDS, at)?;
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
        known_fields(o, QUERY_FIELDS, "")?;
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

impl GroupsRequest {
    /// Parses a `/points/query/groups` body: the query's fields (as
    /// [`QueryRequest::parse`] reads them), `group_by` (a key path,
    /// required), `group_size` (3 unless given) and `limit` (groups, 10
    /// unless given), both at least 1.
    pub fn parse(v: &Value) -> Result<GroupsRequest> {
        let o = obj(v, "query groups request")?;
        known_fields(o, GROUPS_FIELDS, "")?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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
}
