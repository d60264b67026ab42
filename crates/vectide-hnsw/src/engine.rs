//! The [`Hnsw`] engine: state, locks, and the [`VectorIndex`] implementation.

use crate::params::HnswParams;
use crate::search::{knn, Scratch};
use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use vectide_core::metric::DistanceFn;
use vectide_core::seq::SeqTracker;
use vectide_core::visited::VisitedPool;
use vectide_core::{
    Error, Filter, IndexStats, Metric, Neighbor, Result, SearchParams, Seq, VectorIndex,
};
use vectide_graph::mem::{Store, LIVE};

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

/// A volatile HNSW index (see the crate docs for the design).
pub struct Hnsw {
    pub(crate) dim: usize,
    pub(crate) metric: Metric,
    pub(crate) params: HnswParams,
    pub(crate) dist: DistanceFn,
    /// Readers (searches, insert batches) share it; growth and slot
    /// reclamation take it exclusively.
    pub(crate) store: RwLock<Store>,
    /// Insert and delete batches share it; consolidation and save take it
    /// exclusively, so they see no half-done insert.
    pub(crate) mutate: RwLock<()>,
    pub(crate) ids: Mutex<HashMap<u64, IdEntry>>,
    pub(crate) alloc: Mutex<Alloc>,
    pub(crate) pending: Mutex<Vec<u32>>,
    pub(crate) entry: AtomicU64,
    /// Held by an insert whose level exceeds the current top level.
    pub(crate) entry_lock: Mutex<()>,
    pub(crate) level_counter: AtomicU64,
    pub(crate) consolidations: AtomicU64,
    pub(crate) seqs: SeqTracker,
    pub(crate) durable: AtomicU64,
    pub(crate) scratch: VisitedPool<Scratch>,
    pub(crate) pool: Option<rayon::ThreadPool>,
    pub(crate) path: Mutex<Option<PathBuf>>,
}

impl std::fmt::Debug for Hnsw {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hnsw")
            .field("dim", &self.dim)
            .field("metric", &self.metric)
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
        if dim == 0 || dim > 65_536 {
            return Err(Error::invalid(format!(
                "dimension must be in 1..=65536, got {dim}"
            )));
        }
        let pool = vectide_core::engine::thread_pool("hnsw", params.threads)?;
        Ok(Hnsw {
            dim,
            metric,
            dist: metric.distance_fn(),
            store: RwLock::new(store),
            mutate: RwLock::new(()),
            ids: Mutex::new(HashMap::new()),
            alloc: Mutex::new(Alloc::default()),
            pending: Mutex::new(Vec::new()),
            entry: AtomicU64::new(NO_ENTRY),
            entry_lock: Mutex::new(()),
            level_counter: AtomicU64::new(0),
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
    pub fn params(&self) -> &HnswParams {
        &self.params
    }

    /// Runs `f` on the index's thread pool (or rayon's global one).
    pub fn install<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        match &self.pool {
            Some(p) => p.install(f),
            None => f(),
        }
    }

    /// Prepares a query: checks it and normalises it under cosine.
    pub(crate) fn prepare_query<'a>(
        &self,
        query: &'a [f32],
        buf: &'a mut Vec<f32>,
    ) -> Result<&'a [f32]> {
        vectide_core::validate::prepare_query(self.dim, self.metric, query, buf)
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
            None => knn(store, self.dist, q, entry, ef, scratch, |s| {
                store.state(s) == LIVE
            }),
            Some(f) => knn(store, self.dist, q, entry, ef, scratch, |s| {
                store.state(s) == LIVE && f(store.label(s))
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

    /// Slots holding a live or not-yet-reclaimed vector.
    pub fn slots_used(&self) -> usize {
        let a = self.alloc.lock();
        a.next as usize - a.free.len()
    }

    /// The path the index was last saved to or loaded from.
    pub fn path(&self) -> Option<PathBuf> {
        self.path.lock().clone()
    }
}

impl VectorIndex for Hnsw {
    fn descriptor(&self) -> &'static vectide_core::EngineDescriptor {
        &crate::descriptor::HNSW
    }

    fn params(&self) -> vectide_core::Params {
        vectide_graph::hnsw_params::graph_params_out(&self.params, self.threads())
    }

    fn pool(&self) -> Option<&rayon::ThreadPool> {
        self.pool.as_ref()
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
        self.dim
    }

    fn metric(&self) -> Metric {
        self.metric
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
        if k == 0 {
            return Err(Error::invalid("k must be at least 1"));
        }
        let mut scratch = self.scratch.get();
        let mut qbuf = std::mem::take(&mut scratch.query);
        let result = self.prepare_query(query, &mut qbuf).map(|q| {
            let ef = params.ef.unwrap_or(self.params.ef_search).max(k);
            let store = self.store.read();
            self.search_with(&store, q, k, ef, filter, &mut scratch, out);
        });
        scratch.query = qbuf;
        result
    }

    fn distances(&self, query: &[f32], ids: &[u64], out: &mut Vec<Neighbor>) -> Result<()> {
        let mut scratch = self.scratch.get();
        let mut qbuf = std::mem::take(&mut scratch.query);
        let result = self.prepare_query(query, &mut qbuf).map(|q| {
            let store = self.store.read();
            let map = self.ids.lock();
            out.extend(ids.iter().filter_map(|&id| {
                let slot = map.get(&id)?.slot;
                Some(Neighbor::new(id, (self.dist)(q, store.vector(slot))))
            }));
        });
        scratch.query = qbuf;
        result
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
        Ok(IndexStats {
            live,
            slots_used,
            capacity: store.capacity,
            pending_deletes: self.pending.lock().len(),
            memory_bytes: store.memory_bytes(used) + ids_bytes,
            consolidations: self.consolidations.load(Ordering::Relaxed),
            ..IndexStats::default()
        })
    }
}
