//! Reads of a collection: points by id, counts, pages, and the search
//! (the engine's, its filtered traversal, or exact over a filter's matches).

use super::{Collection, Hit, Record};
use crate::error::{DbError, Result};
use crate::filter::Filter;
use crate::ids::ExtId;
use crate::spaces::{DenseSpace, NamedVectors, SparseVector, VectorValue};
use crate::store::Point;
use std::sync::atomic::Ordering;
use vectide_core::{heap, SearchParams};
use vectide_engines::AnyIndex;

impl Collection {
    /// The live internal ids the selector names: explicit ids (unknown ones
    /// ignored) or every point a filter accepts.
    pub(super) fn select(
        &self,
        ids: Option<&[ExtId]>,
        filter: Option<&Filter>,
    ) -> Vec<(u64, ExtId)> {
        let store = self.store.read();
        match (ids, filter) {
            (Some(ids), f) => ids
                .iter()
                .filter_map(|e| store.internal(e).map(|i| (i, e)))
                .filter(|(i, _)| {
                    store
                        .get(*i)
                        .is_some_and(|p| f.is_none_or(|f| f.eval(&p.ext, &p.payload)))
                })
                .map(|(i, e)| (i, e.clone()))
                .collect(),
            (None, Some(f)) => {
                let cands = store.index_candidates(f);
                let mut out: Vec<(u64, ExtId)> = match cands {
                    Some((c, exact)) => c
                        .into_iter()
                        .filter_map(|i| {
                            store
                                .get(i)
                                .filter(|p| exact || f.eval(&p.ext, &p.payload))
                                .map(|p| (i, p.ext.clone()))
                        })
                        .collect(),
                    None => store
                        .iter()
                        .filter(|(_, p)| f.eval(&p.ext, &p.payload))
                        .map(|(&i, p)| (i, p.ext.clone()))
                        .collect(),
                };
                out.sort_unstable_by_key(|x| x.0);
                out
            }
            (None, None) => Vec::new(),
        }
    }

    /// Points by id, in the order asked; unknown ids give `None`.
    pub fn get(&self, ids: &[ExtId], with_vector: bool) -> Result<Vec<Option<Record>>> {
        let store = self.store.read();
        let mut out = Vec::with_capacity(ids.len());
        for e in ids {
            let Some((i, p)) = store.internal(e).and_then(|i| Some((i, store.get(i)?))) else {
                out.push(None);
                continue;
            };
            let (vector, vectors) = self.vectors_of(i, with_vector)?;
            out.push(Some(Record {
                id: p.ext.clone(),
                payload: p.payload.clone(),
                vector,
                vectors,
            }));
        }
        Ok(out)
    }

    /// A point's vectors when asked for: the main dense space's, and in a
    /// multi collection every one it has, by space name.
    fn vectors_of(
        &self,
        i: u64,
        with_vector: bool,
    ) -> Result<(Option<Vec<f32>>, Option<NamedVectors>)> {
        if !with_vector {
            return Ok((None, None));
        }
        if self.shape.is_none() {
            return Ok((self.dense[0].engine.get(i)?, None));
        }
        let mut named = Vec::with_capacity(self.dense.len() + self.sparse.len());
        let mut main = None;
        for (k, d) in self.dense.iter().enumerate() {
            if let Some(v) = d.engine.get(i)? {
                if k == 0 {
                    main = Some(v.clone());
                }
                named.push((d.config.name.clone(), VectorValue::Dense(v)));
            }
        }
        for sp in &self.sparse {
            if let Some(v) = sp.index.read().get(i) {
                named.push((sp.config.name.clone(), VectorValue::Sparse(v.clone())));
            }
        }
        Ok((main, Some(named)))
    }

    /// Points matching a filter (all without one).
    pub fn count(&self, filter: Option<&Filter>) -> usize {
        match filter {
            None => self.len(),
            Some(f) => self.select(None, Some(f)).len(),
        }
    }

    /// A page of points ordered by id, starting at `offset` (inclusive);
    /// returns the page and the id where the next page starts.
    pub fn scroll(
        &self,
        filter: Option<&Filter>,
        offset: Option<&ExtId>,
        limit: usize,
        with_vector: bool,
    ) -> Result<(Vec<Record>, Option<ExtId>)> {
        let store = self.store.read();
        let mut all: Vec<(&ExtId, u64, &Point)> = store
            .iter()
            .filter(|(_, p)| filter.is_none_or(|f| f.eval(&p.ext, &p.payload)))
            .filter(|(_, p)| offset.is_none_or(|o| &p.ext >= o))
            .map(|(&i, p)| (&p.ext, i, p))
            .collect();
        all.sort_unstable_by(|a, b| a.0.cmp(b.0));
        let next = all.get(limit).map(|x| x.0.clone());
        let page = all
            .into_iter()
            .take(limit)
            .map(|(e, i, p)| {
                let (vector, vectors) = self.vectors_of(i, with_vector)?;
                Ok(Record {
                    id: e.clone(),
                    payload: p.payload.clone(),
                    vector,
                    vectors,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok((page, next))
    }

    /// The `k` nearest points to `query` that pass `filter`.
    ///
    /// Without a filter: the engine's search. With one: the payload indexes
    /// (or a sample of 512 points, when no index applies) estimate how many
    /// points match. At most `exact_max` matches are answered exactly by
    /// computing their distances; more go to the engine's filtered graph
    /// search (the predicate is evaluated during the traversal) with `ef`
    /// raised to `k / selectivity` (at most 4096), so that restrictive
    /// filters keep their recall.
    pub fn search(
        &self,
        query: &[f32],
        k: usize,
        params: &SearchParams,
        filter: Option<&Filter>,
        with_payload: bool,
        with_vector: bool,
    ) -> Result<Vec<Hit>> {
        self.check_vector(query)?;
        self.search_dense(
            &self.dense[0],
            query,
            k,
            params,
            filter,
            with_payload,
            with_vector,
        )
    }

    /// [`search`](Self::search) in the dense space named `using`.
    #[allow(clippy::too_many_arguments)]
    pub fn search_in(
        &self,
        using: &str,
        query: &[f32],
        k: usize,
        params: &SearchParams,
        filter: Option<&Filter>,
        with_payload: bool,
        with_vector: bool,
    ) -> Result<Vec<Hit>> {
        let space = self.dense_space(using)?;
        super::check_dense(&space.config, query)?;
        self.search_dense(space, query, k, params, filter, with_payload, with_vector)
    }

    #[allow(clippy::too_many_arguments)]
    fn search_dense(
        &self,
        space: &DenseSpace,
        query: &[f32],
        k: usize,
        params: &SearchParams,
        filter: Option<&Filter>,
        with_payload: bool,
        with_vector: bool,
    ) -> Result<Vec<Hit>> {
        let filter = self.begin_search(k, filter)?;
        let engine = &space.engine;
        // The store's lock is held only to read the points, never through
        // a whole engine search or exact scan (an exact scan of an SSD
        // engine reads every posting): writers wait for it. A point deleted
        // or replaced meanwhile is dropped or returned as it was during
        // the call (the lookup below).
        let found: Vec<(u64, f32)> = match filter {
            None if params.exact => match engine.exact_scan(query, spared(k))? {
                Some(found) => found.into_iter().map(|n| (n.id, n.distance)).collect(),
                None => {
                    let all: Vec<u64> = self.store.read().iter().map(|(&i, _)| i).collect();
                    exact(engine, query, k, &all)?
                }
            },
            None => engine
                .search(query, k, params, None)?
                .into_iter()
                .map(|n| (n.id, n.distance))
                .collect(),
            Some(f) => {
                let store = self.store.read();
                let n = store.len().max(1);
                let estimate = match store.index_estimate(f) {
                    Some(c) => c,
                    None => {
                        let step = (n / 512).max(1);
                        let hits = store
                            .iter()
                            .step_by(step)
                            .take(512)
                            .filter(|(_, p)| f.eval(&p.ext, &p.payload))
                            .count();
                        let sampled = n.div_ceil(step).clamp(1, 512);
                        hits * n / sampled
                    }
                };
                if params.exact || estimate <= self.opts.exact_max {
                    let matches: Vec<u64> = match store.index_candidates(f) {
                        Some((c, true)) => c,
                        Some((c, false)) => c
                            .into_iter()
                            .filter(|i| store.get(*i).is_some_and(|p| f.eval(&p.ext, &p.payload)))
                            .collect(),
                        None => store
                            .iter()
                            .filter(|(_, p)| f.eval(&p.ext, &p.payload))
                            .map(|(&i, _)| i)
                            .collect(),
                    };
                    drop(store);
                    exact(engine, query, k, &matches)?
                } else {
                    let sel = (estimate as f64 / n as f64).clamp(1e-6, 1.0);
                    // Engines with a candidate list widen it by the
                    // filter's selectivity (others take the knobs as given).
                    let mut widened = params.clone();
                    if let Some(base) = params.ef.or(engine.search_defaults().ef) {
                        let ef = (k as f64 / sel).ceil() as usize;
                        widened.ef = Some(ef.max(base.max(k)).min(4096));
                    }
                    // The filter reads the payloads as the engine walks.
                    let pred = |i: u64| store.get(i).is_some_and(|p| f.eval(&p.ext, &p.payload));
                    engine
                        .search(query, k, &widened, Some(&pred))?
                        .into_iter()
                        .map(|n| (n.id, n.distance))
                        .collect()
                }
            }
        };
        self.hits(found, k, filter, with_payload, with_vector)
    }

    /// A search's common checks and count; the filter, unless trivial.
    fn begin_search<'f>(&self, k: usize, filter: Option<&'f Filter>) -> Result<Option<&'f Filter>> {
        self.check_open()?;
        if k == 0 {
            return Err(DbError::invalid("k (limit) must be at least 1"));
        }
        vectide_core::limits::check_k(k)?;
        self.counters.searches.fetch_add(1, Ordering::Relaxed);
        Ok(filter.filter(|f| !f.is_trivial()))
    }

    /// The points of `found` (internal id, distance) as hits, up to `k`:
    /// a point deleted since is dropped, and one whose payload no longer
    /// matches the filter.
    fn hits(
        &self,
        found: Vec<(u64, f32)>,
        k: usize,
        filter: Option<&Filter>,
        with_payload: bool,
        with_vector: bool,
    ) -> Result<Vec<Hit>> {
        let store = self.store.read();
        let mut hits = Vec::with_capacity(found.len().min(k));
        for (i, d) in found {
            if hits.len() == k {
                break;
            }
            if let Some(p) = store.get(i) {
                // A payload edited since the matches were taken no longer
                // matching: the point is not returned.
                if filter.is_some_and(|f| !f.eval(&p.ext, &p.payload)) {
                    continue;
                }
                let (vector, vectors) = self.vectors_of(i, with_vector)?;
                hits.push(Hit {
                    id: p.ext.clone(),
                    distance: d,
                    payload: with_payload.then(|| p.payload.clone()),
                    vector,
                    vectors,
                });
            }
        }
        Ok(hits)
    }

    /// The `k` points of the sparse space `using` with the largest dot
    /// product with `query` (after the space's modifier) that pass
    /// `filter`, exactly (`vectide_sparse`: MaxScore pruned, the filter
    /// asked inside the search); only points sharing a term with the query
    /// are answers; ties by point id. A hit's distance is −dot.
    #[allow(clippy::too_many_arguments)]
    pub fn search_sparse(
        &self,
        using: &str,
        query: &SparseVector,
        k: usize,
        filter: Option<&Filter>,
        with_payload: bool,
        with_vector: bool,
    ) -> Result<Vec<Hit>> {
        let space = self.sparse_space(using)?;
        let filter = self.begin_search(k, filter)?;
        let found: Vec<(u64, f32)> = {
            let store = self.store.read();
            let accept = |i: u64| {
                store
                    .get(i)
                    .is_some_and(|p| filter.is_none_or(|f| f.eval(&p.ext, &p.payload)))
            };
            let tie = |a: u64, b: u64| match (store.get(a), store.get(b)) {
                (Some(x), Some(y)) => x.ext.cmp(&y.ext),
                _ => a.cmp(&b),
            };
            let (found, _) = space.index.read().search(query, k, &accept, &tie);
            found.into_iter().map(|(i, s)| (i, -s)).collect()
        };
        self.hits(found, k, filter, with_payload, with_vector)
    }
}

/// Exact top-k among `ids` by the engine's distance, and up to
/// `EXACT_SPARE` more: the scan runs without the store's lock, and a point
/// of the top k deleted meanwhile is dropped at the lookup, where the next
/// one takes its place (else the answer would come back short though
/// enough points were live throughout). Ids the engine does not hold (a
/// point without this space's vector) are skipped.
fn exact(engine: &AnyIndex, query: &[f32], k: usize, ids: &[u64]) -> Result<Vec<(u64, f32)>> {
    // One call with every id: an SSD engine answers a long list with one
    // pass over its postings (several shorter calls would each make that
    // pass).
    let mut all = Vec::with_capacity(ids.len());
    engine.distances(query, ids, &mut all)?;
    heap::keep_nearest(&mut all, spared(k));
    all.sort_by(heap::by_distance_then_id);
    Ok(all.into_iter().map(|n| (n.id, n.distance)).collect())
}

/// `k` and the spare results of an exact search (within the bound on `k`).
fn spared(k: usize) -> usize {
    k.saturating_add(EXACT_SPARE)
        .min(vectide_core::limits::MAX_K)
}

/// Spare results an exact search keeps beyond `k` (see `Collection::exact`).
const EXACT_SPARE: usize = 16;
