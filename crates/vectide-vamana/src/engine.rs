//! The [`FreshVamana`] engine: state, locks, search, and the
//! [`VectorIndex`] implementation.

use crate::params::VamanaParams;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use vectide_core::heap::Candidate;
use vectide_core::validate::Checked;
use vectide_core::{Filter, Metric, Neighbor, Result, SearchParams, Seq, VectorIndex};
use vectide_graph::core::GraphCore;
use vectide_graph::mem::Store;
use vectide_graph::search::{search_layer, Scratch};

/// No start node yet (an index that never held a point).
pub(crate) const NO_START: u64 = u64::MAX;

/// A FreshVamana index in memory (see the crate docs for the design). The
/// state every volatile graph engine shares (store, locks, id map,
/// allocator, DeleteList, sequence numbers, pools) is its [`GraphCore`],
/// private to the crate.
pub struct FreshVamana {
    pub(crate) core: GraphCore,
    pub(crate) params: VamanaParams,
    /// The frozen start node's slot, or [`NO_START`].
    pub(crate) start: AtomicU64,
    /// Held by the insert that creates the start node.
    pub(crate) start_lock: Mutex<()>,
}

impl std::fmt::Debug for FreshVamana {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FreshVamana")
            .field("dim", &self.core.dim)
            .field("metric", &self.core.metric)
            .field("params", &self.params)
            .field("len", &self.len())
            .finish()
    }
}

impl FreshVamana {
    /// An empty index.
    pub fn new(dim: usize, metric: Metric, params: VamanaParams) -> Result<Self> {
        let store = Store::with_degrees(dim, 1, crate::params::slack_cap(params.r), 0);
        Self::with_store(dim, metric, params, store)
    }

    pub(crate) fn with_store(
        dim: usize,
        metric: Metric,
        params: VamanaParams,
        store: Store,
    ) -> Result<Self> {
        params.validate()?;
        let core = GraphCore::new("fresh-vamana", dim, metric, store, params.threads)?;
        Ok(FreshVamana {
            core,
            start: AtomicU64::new(NO_START),
            start_lock: Mutex::new(()),
            params,
        })
    }

    /// The parameters the index was built with.
    pub fn params(&self) -> &VamanaParams {
        &self.params
    }

    /// α as the pruning rule uses it: 1 under inner product, whose
    /// distances can be negative (a scaled threshold means nothing there).
    pub(crate) fn alpha(&self) -> f32 {
        if self.core.metric == Metric::Ip {
            1.0
        } else {
            self.params.alpha
        }
    }

    /// The start node's slot.
    pub(crate) fn start_slot(&self) -> Option<u32> {
        let w = self.start.load(Ordering::Acquire);
        (w != NO_START).then_some(w as u32)
    }

    /// GreedySearch (Algorithm 1) from the start node with a list of `l`,
    /// deleted nodes walked but never returned; results go to `out`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn search_with(
        &self,
        store: &Store,
        q: &[f32],
        k: usize,
        l: usize,
        filter: Option<Filter<'_>>,
        scratch: &mut Scratch,
        out: &mut Vec<Neighbor>,
    ) {
        out.clear();
        let Some(start) = self.start_slot() else {
            return;
        };
        let entry = [Candidate::new(
            (self.core.dist)(q, store.vector(start)),
            start,
        )];
        match filter {
            None => search_layer(store, self.core.dist, q, &entry, l, 0, scratch, |s| {
                store.is_live(s)
            }),
            Some(f) => search_layer(store, self.core.dist, q, &entry, l, 0, scratch, |s| {
                store.is_live(s) && f(store.label(s))
            }),
        }
        let Scratch { top, sorted, .. } = scratch;
        top.drain_sorted_into(sorted);
        out.extend(
            sorted
                .iter()
                .take(k)
                .map(|c| Neighbor::new(store.label(c.node), c.dist.0)),
        );
    }
}

impl VectorIndex for FreshVamana {
    fn descriptor(&self) -> &'static vectide_core::EngineDescriptor {
        &crate::DESCRIPTOR
    }

    fn params(&self) -> vectide_core::Params {
        self.params.to_params(self.threads())
    }

    fn check_structure(&self) -> Result<Vec<String>> {
        let g = self.check_graph();
        let mut v = Vec::new();
        if g.bad_edges > 0 {
            v.push(format!("{} edges to free slots or self-loops", g.bad_edges));
        }
        if g.over_degree > 0 {
            v.push(format!("{} lists longer than their room", g.over_degree));
        }
        if g.live != self.len() {
            v.push(format!("{} live slots, {} live ids", g.live, self.len()));
        }
        if g.live > 0 && !g.start_ok {
            v.push("no frozen start node while points are live".into());
        }
        Ok(v)
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn search_defaults(&self) -> SearchParams {
        SearchParams::with_ef(self.params.l_search)
    }

    fn dim(&self) -> usize {
        self.core.dim
    }

    fn metric(&self) -> Metric {
        self.core.metric
    }

    fn insert(&self, seq: Seq, ids: &[u64], vectors: &[f32]) -> Result<()> {
        self.insert_with_progress(seq, ids, vectors, None)
    }

    fn insert_checked(&self, seq: Seq, batch: Checked<'_>) -> Result<()> {
        self.insert_checked_rows(seq, batch, None)
    }

    fn insert_with_progress(
        &self,
        seq: Seq,
        ids: &[u64],
        vectors: &[f32],
        progress: Option<vectide_core::Progress<'_>>,
    ) -> Result<()> {
        let batch = Checked::new(self.dim(), self.metric(), ids, vectors)?;
        self.insert_checked_rows(seq, batch, progress)
    }

    fn save(&self, path: &std::path::Path) -> Result<()> {
        FreshVamana::save(self, path)
    }

    fn save_staged(&self, path: &std::path::Path) -> Result<vectide_core::StagedSave<'_>> {
        FreshVamana::save_staged(self, path)
    }

    fn maintain(&self) -> Result<()> {
        self.consolidate();
        Ok(())
    }

    fn defer_maintenance(&self) -> bool {
        self.core.defer_maintenance()
    }

    fn maintenance_due(&self) -> bool {
        self.core
            .consolidation_due(self.params.consolidate_fraction)
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
        let l = params.ef.unwrap_or(self.params.l_search).max(k);
        self.core.with_query(query, k, |store, q, scratch| {
            self.search_with(store, q, k, l, filter, scratch, out)
        })
    }

    vectide_graph::graph_core_methods!();
}
