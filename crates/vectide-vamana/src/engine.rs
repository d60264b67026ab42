//! The [`FreshVamana`] engine: state, locks, search, and the
//! [`VectorIndex`] implementation.

use crate::params::VamanaParams;
use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use vectide_core::heap::Candidate;
use vectide_core::metric::DistanceFn;
use vectide_core::seq::SeqTracker;
use vectide_core::visited::VisitedPool;
use vectide_core::{
    Error, Filter, IndexStats, Metric, Neighbor, Result, SearchParams, Seq, VectorIndex,
};
use vectide_graph::mem::{Store, LIVE};
use vectide_graph::search::{search_layer, Scratch};
use vectide_graph::slots::{Alloc, IdEntry};

/// No start node yet (an index that never held a point).
pub(crate) const NO_START: u64 = u64::MAX;

/// A FreshVamana index in memory (see the crate docs for the design).
pub struct FreshVamana {
    pub(crate) dim: usize,
    pub(crate) metric: Metric,
    pub(crate) params: VamanaParams,
    pub(crate) dist: DistanceFn,
    /// Readers (searches, insert batches) share it; growth and slot
    /// reclamation take it exclusively.
    pub(crate) store: RwLock<Store>,
    /// Insert and delete batches share it; consolidation and save take it
    /// exclusively, so they see no half-done insert.
    pub(crate) mutate: RwLock<()>,
    pub(crate) ids: Mutex<HashMap<u64, IdEntry>>,
    pub(crate) alloc: Mutex<Alloc>,
    /// The DeleteList: slots deleted (or replaced by an upsert) and not yet
    /// consolidated.
    pub(crate) pending: Mutex<Vec<u32>>,
    /// The frozen start node's slot, or [`NO_START`].
    pub(crate) start: AtomicU64,
    /// Held by the insert that creates the start node.
    pub(crate) start_lock: Mutex<()>,
    pub(crate) consolidations: AtomicU64,
    pub(crate) seqs: SeqTracker,
    pub(crate) durable: AtomicU64,
    pub(crate) scratch: VisitedPool<Scratch>,
    pub(crate) pool: Option<rayon::ThreadPool>,
    pub(crate) path: Mutex<Option<PathBuf>>,
}

impl std::fmt::Debug for FreshVamana {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FreshVamana")
            .field("dim", &self.dim)
            .field("metric", &self.metric)
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
        if dim == 0 || dim > vectide_core::limits::MAX_DIM {
            return Err(Error::invalid(format!(
                "dimension must be in 1..={}, got {dim}",
                vectide_core::limits::MAX_DIM
            )));
        }
        let pool = vectide_core::engine::thread_pool("fresh-vamana", params.threads)?;
        Ok(FreshVamana {
            dim,
            metric,
            dist: metric.distance_fn(),
            store: RwLock::new(store),
            mutate: RwLock::new(()),
            ids: Mutex::new(HashMap::new()),
            alloc: Mutex::new(Alloc::default()),
            pending: Mutex::new(Vec::new()),
            start: AtomicU64::new(NO_START),
            start_lock: Mutex::new(()),
            consolidations: AtomicU64::new(0),
            seqs: SeqTracker::default(),
            durable: AtomicU64::new(0),
            scratch: VisitedPool::default(),
            pool,
            path: Mutex::new(None),
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
        if self.metric == Metric::Ip {
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

    /// Runs `f` on the index's thread pool (or rayon's global one).
    pub fn install<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        match &self.pool {
            Some(p) => p.install(f),
            None => f(),
        }
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
        let entry = [Candidate::new((self.dist)(q, store.vector(start)), start)];
        match filter {
            None => search_layer(store, self.dist, q, &entry, l, 0, scratch, |s| {
                store.state(s) == LIVE
            }),
            Some(f) => search_layer(store, self.dist, q, &entry, l, 0, scratch, |s| {
                store.state(s) == LIVE && f(store.label(s))
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

    /// Slots holding a live or not-yet-reclaimed vector (the start node
    /// included).
    pub fn slots_used(&self) -> usize {
        let a = self.alloc.lock();
        a.next as usize - a.free.len()
    }

    /// The path the index was last saved to or loaded from.
    pub fn path(&self) -> Option<PathBuf> {
        self.path.lock().clone()
    }
}

impl VectorIndex for FreshVamana {
    fn descriptor(&self) -> &'static vectide_core::EngineDescriptor {
        &crate::DESCRIPTOR
    }

    fn params(&self) -> vectide_core::Params {
        self.params.to_params(self.threads())
    }

    fn pool(&self) -> Option<&rayon::ThreadPool> {
        self.pool.as_ref()
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
        self.dim
    }

    fn metric(&self) -> Metric {
        self.metric
    }

    fn insert(&self, seq: Seq, ids: &[u64], vectors: &[f32]) -> Result<()> {
        self.insert_with_progress(seq, ids, vectors, None)
    }

    fn insert_with_progress(
        &self,
        seq: Seq,
        ids: &[u64],
        vectors: &[f32],
        progress: Option<vectide_core::Progress<'_>>,
    ) -> Result<()> {
        FreshVamana::insert_with_progress(self, seq, ids, vectors, progress)
    }

    fn save(&self, path: &std::path::Path) -> Result<()> {
        FreshVamana::save(self, path)
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
        if k == 0 {
            return Err(Error::invalid("k must be at least 1"));
        }
        let mut scratch = self.scratch.get();
        let mut qbuf = std::mem::take(&mut scratch.query);
        let result = vectide_core::validate::prepare_query(self.dim, self.metric, query, &mut qbuf)
            .map(|q| {
                let l = params.ef.unwrap_or(self.params.l_search).max(k);
                let store = self.store.read();
                self.search_with(&store, q, k, l, filter, &mut scratch, out);
            });
        scratch.query = qbuf;
        result
    }

    fn distances(&self, query: &[f32], ids: &[u64], out: &mut Vec<Neighbor>) -> Result<()> {
        let mut qbuf = Vec::new();
        let q = vectide_core::validate::prepare_query(self.dim, self.metric, query, &mut qbuf)?;
        let store = self.store.read();
        let map = self.ids.lock();
        out.extend(ids.iter().filter_map(|&id| {
            let slot = map.get(&id)?.slot;
            Some(Neighbor::new(id, (self.dist)(q, store.vector(slot))))
        }));
        Ok(())
    }

    fn get(&self, id: u64) -> Result<Option<Vec<f32>>> {
        let store = self.store.read();
        let slot = self.ids.lock().get(&id).map(|e| e.slot);
        Ok(slot.map(|s| store.vector(s).to_vec()))
    }

    fn contains(&self, id: u64) -> Result<bool> {
        Ok(self.ids.lock().contains_key(&id))
    }

    fn len(&self) -> usize {
        self.ids.lock().len()
    }

    fn flush(&self) -> Result<()> {
        match self.path() {
            Some(p) => self.save(&p),
            None => Ok(()),
        }
    }

    fn durable_seq(&self) -> Seq {
        self.durable.load(Ordering::Acquire)
    }

    fn stats(&self) -> Result<IndexStats> {
        // Lock order: `alloc` is never taken while holding `store`.
        let used = self.alloc.lock().next as usize;
        let slots_used = self.slots_used();
        let live = self.len();
        let store = self.store.read();
        let ids_bytes = self.ids.lock().capacity() * (std::mem::size_of::<(u64, IdEntry)>() + 1);
        let pending = self.pending.lock().len();
        Ok(IndexStats {
            live,
            slots_used,
            capacity: store.capacity,
            pending_deletes: pending,
            memory_bytes: store.memory_bytes(used) + ids_bytes,
            consolidations: self.consolidations.load(Ordering::Relaxed),
            ..IndexStats::default()
        })
    }
}
