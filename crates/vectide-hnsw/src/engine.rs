//! The [`Hnsw`] engine: state, locks, and the [`VectorIndex`] implementation.

use crate::params::HnswParams;
use crate::search::{knn, Scratch};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use vectide_core::{Filter, Metric, Neighbor, Result, SearchParams, Seq, VectorIndex};
use vectide_graph::core::GraphCore;
use vectide_graph::mem::Store;

pub(crate) use vectide_graph::slots::{Alloc, IdEntry};

pub(crate) const NO_ENTRY: u64 = u64::MAX;

/// Packs the entry point (slot, top level) into one atomic word.
#[inline]
pub(crate) fn pack_entry(slot: u32, level: usize) -> u64 {
    ((slot as u64) << 8) | level as u64
}

#[inline]
pub(crate) fn unpack_entry(word: u64) -> Option<(u32, usize)> {
    (word != NO_ENTRY).then_some(((word >> 8) as u32, (word & 0xff) as usize))
}

/// A volatile HNSW index (see the crate docs for the design). The state
/// every volatile graph engine shares (store, locks, id map, allocator,
/// DeleteList, sequence numbers, pools) is its [`GraphCore`], private to
/// the crate.
pub struct Hnsw {
    pub(crate) core: GraphCore,
    pub(crate) params: HnswParams,
    pub(crate) entry: AtomicU64,
    /// Held by an insert whose level exceeds the current top level.
    pub(crate) entry_lock: Mutex<()>,
    pub(crate) level_counter: AtomicU64,
}

impl std::fmt::Debug for Hnsw {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hnsw")
            .field("dim", &self.core.dim)
            .field("metric", &self.core.metric)
            .field("params", &self.params)
            .field("len", &self.len())
            .finish()
    }
}

impl Hnsw {
    /// An empty index.
    pub fn new(dim: usize, metric: Metric, params: HnswParams) -> Result<Self> {
        let store = Store::new(dim, params.m, 0);
        Self::with_store(dim, metric, params, store)
    }

    pub(crate) fn with_store(
        dim: usize,
        metric: Metric,
        params: HnswParams,
        store: Store,
    ) -> Result<Self> {
        params.validate()?;
        let core = GraphCore::new("hnsw", dim, metric, store, params.threads)?;
        Ok(Hnsw {
            core,
            entry: AtomicU64::new(NO_ENTRY),
            entry_lock: Mutex::new(()),
            level_counter: AtomicU64::new(0),
            params,
        })
    }

    /// The parameters the index was built with.
    pub fn params(&self) -> &HnswParams {
        &self.params
    }

    /// Searches with a prepared scratch; results go to `out`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn search_with(
        &self,
        store: &Store,
        q: &[f32],
        k: usize,
        ef: usize,
        filter: Option<Filter<'_>>,
        scratch: &mut Scratch,
        out: &mut Vec<Neighbor>,
    ) {
        out.clear();
        let entry = unpack_entry(self.entry.load(Ordering::Acquire));
        match filter {
            None => knn(store, self.core.dist, q, entry, ef, scratch, |s| {
                store.is_live(s)
            }),
            Some(f) => knn(store, self.core.dist, q, entry, ef, scratch, |s| {
                store.is_live(s) && f(store.label(s))
            }),
        }
        out.extend(
            scratch
                .sorted
                .iter()
                .take(k)
                .map(|c| Neighbor::new(store.label(c.node), c.dist.0)),
        );
    }
}

impl VectorIndex for Hnsw {
    fn descriptor(&self) -> &'static vectide_core::EngineDescriptor {
        &crate::descriptor::HNSW
    }

    fn params(&self) -> vectide_core::Params {
        vectide_graph::hnsw_params::graph_params_out(&self.params, self.threads())
    }

    /// Edges to free slots or to nodes absent from that layer, and a live
    /// count that disagrees with the slot states. (Reachability is not a
    /// violation: pruning can, rarely, strand a node between
    /// consolidations; `check_graph` reports it.)
    fn check_structure(&self) -> Result<Vec<String>> {
        let g = self.check_graph();
        let mut v = Vec::new();
        if g.bad_edges > 0 {
            v.push(format!(
                "{} edges to free slots or missing layers",
                g.bad_edges
            ));
        }
        if g.live != self.len() {
            v.push(format!("{} live slots, {} live ids", g.live, self.len()));
        }
        Ok(v)
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn search_defaults(&self) -> SearchParams {
        SearchParams::with_ef(self.params.ef_search)
    }

    fn dim(&self) -> usize {
        self.core.dim
    }

    fn metric(&self) -> Metric {
        self.core.metric
    }

    fn insert(&self, seq: Seq, ids: &[u64], vectors: &[f32]) -> Result<()> {
        self.insert_batch(seq, ids, vectors)
    }

    fn insert_with_progress(
        &self,
        seq: Seq,
        ids: &[u64],
        vectors: &[f32],
        progress: Option<vectide_core::Progress<'_>>,
    ) -> Result<()> {
        Hnsw::insert_with_progress(self, seq, ids, vectors, progress)
    }

    fn save(&self, path: &std::path::Path) -> Result<()> {
        Hnsw::save(self, path)
    }

    fn maintain(&self) -> Result<()> {
        self.consolidate();
        Ok(())
    }

    fn delete(&self, seq: Seq, ids: &[u64]) -> Result<usize> {
        self.delete_batch(seq, ids)
    }

    fn search_into(
        &self,
        query: &[f32],
        k: usize,
        params: &SearchParams,
        filter: Option<Filter<'_>>,
        out: &mut Vec<Neighbor>,
    ) -> Result<()> {
        let ef = params.ef.unwrap_or(self.params.ef_search).max(k);
        self.core.with_query(query, k, |store, q, scratch| {
            self.search_with(store, q, k, ef, filter, scratch, out)
        })
    }

    vectide_graph::graph_core_methods!();
}
