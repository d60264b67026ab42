//! Running a query on a collection: each level of prefetches searched or
//! listed, fused or re-scored, re-ranked by MMR when asked, and the
//! answer's payloads and vectors read.

use super::fusion::{dbsf, rrf, Scored};
use super::groups::{group, lift_limits};
use super::mmr::{mmr_order, Similarity};
use super::{
    Fusion, GroupsRequest, Knobs, PointGroup, Prefetch, QueryKind, QueryRequest, ScoredPoint,
    VectorInput, MAX_MMR_CANDIDATES,
};
use crate::collection::{score, Collection, Hit};
use crate::error::{DbError, Result};
use crate::filter::{Condition, Filter};
use crate::ids::ExtId;
use crate::spaces::{NamedVectors, VectorValue};
use serde_json::Value;
use std::collections::HashMap;
use vectide_core::{limits, Metric, SearchParams};

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

    /// The pool sibling prefetches share: the collection's `threads`
    /// (all cores unless set), `None` with one.
    fn query_pool(&self) -> Option<&vectide_core::pools::Pool> {
        self.query_pool
            .get_or_init(|| {
                let threads = self
                    .opts
                    .threads
                    .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
                (threads > 1)
                    .then(|| vectide_core::pools::shared("query", threads).ok())
                    .flatten()
            })
            .as_ref()
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
        let run = |p: &Prefetch| {
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
        };
        // Sibling prefetches (a hybrid query's dense and sparse searches)
        // run side by side on the collection's threads, each on one; the
        // answer is the same as one after the other.
        // The first runs on the calling thread while the pool takes the
        // others: one pool thread to wake for a hybrid query, not two.
        let sources = match self.query_pool() {
            Some(pool) if l.prefetch.len() > 1 => {
                let run = &run;
                let mut out: Vec<Option<Result<Vec<Scored>>>> =
                    l.prefetch.iter().map(|_| None).collect();
                if let Some((first, rest)) = out.split_first_mut() {
                    pool.in_place_scope(|s| {
                        for (slot, p) in rest.iter_mut().zip(&l.prefetch[1..]) {
                            s.spawn(move |_| *slot = Some(run(p)));
                        }
                        *first = Some(run(&l.prefetch[0]));
                    });
                }
                out.into_iter()
                    .map(|r| {
                        r.unwrap_or_else(|| {
                            Err(vectide_core::Error::invalid("a prefetch did not run").into())
                        })
                    })
                    .collect::<Result<Vec<_>>>()?
            }
            _ => l.prefetch.iter().map(run).collect::<Result<Vec<_>>>()?,
        };
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

impl Knobs {
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

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use serde_json::json;

    /// Ten points on a cosine plane, `[1, 0.1·i + 0.01]`, with payloads to
    /// group by; the expected answers below are qdrant-client 1.20.0's
    /// local mode's on the same data and requests.
    pub(in crate::query) fn plane() -> (tempfile::TempDir, std::sync::Arc<crate::Database>) {
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

    pub(in crate::query) fn only_ids(v: &[(u64, f32)]) -> Vec<u64> {
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

    #[test]
    fn sibling_prefetches_side_by_side_answer_as_one_after_the_other() {
        let open = |threads: usize| {
            let dir = tempfile::tempdir().unwrap();
            let opts = crate::Options {
                threads: Some(threads),
                ..crate::Options::default()
            };
            let db = crate::Database::open(dir.path(), opts).unwrap();
            let c = db
                .create_collection("c", crate::CollectionConfig::new(3, Metric::Cosine, "flat"))
                .unwrap();
            let points: Vec<crate::PointInput> = (0..200u64)
                .map(|i| crate::PointInput {
                    id: ExtId::Num(i),
                    vector: vec![1.0, (i % 17) as f32 * 0.1, (i % 5) as f32 * 0.3 + 0.01],
                    payload: json!({"g": i % 3}),
                })
                .collect();
            c.upsert(&points).unwrap();
            (dir, db)
        };
        let (_d1, one) = open(1);
        let (_d4, four) = open(4);
        let (c1, c4) = (one.collection("c").unwrap(), four.collection("c").unwrap());
        assert!(c1.query_pool().is_none() && c4.query_pool().is_some());
        let bodies = [
            json!({"prefetch": [{"query": [1.0, 0.3, 0.2], "limit": 30}, {"query": [1.0, 1.2, 0.9], "limit": 30},
                                {"query": [0.2, 0.1, 1.0], "limit": 30, "filter": {"must": [{"key": "g", "match": {"value": 1}}]}}],
                   "query": {"fusion": "rrf"}, "limit": 20}),
            json!({"prefetch": [{"query": [1.0, 0.3, 0.2], "limit": 25},
                                {"prefetch": [{"query": [0.5, 0.5, 0.5], "limit": 40}, {"query": [1.0, 0.0, 0.0], "limit": 40}],
                                 "query": {"fusion": "dbsf"}, "limit": 25}],
                   "query": {"fusion": "rrf"}, "limit": 15}),
            json!({"prefetch": [{"query": [1.0, 0.3, 0.2], "limit": 50}, {"query": [0.3, 1.0, 0.2], "limit": 50}],
                   "query": [1.0, 1.0, 1.0], "limit": 10}),
        ];
        for b in bodies {
            let (a, b4) = (run(&c1, b.clone()), run(&c4, b));
            assert!(!a.is_empty());
            assert_eq!(a, b4);
        }
    }
}
