//! The [`Flat`] engine: state, locks and the [`VectorIndex`] implementation.
//!
//! One `RwLock` guards the slot store: searches (single, batched, `get`,
//! `distances`) and saves share it, inserts and deletes take it
//! exclusively. Batch calls hold the shared lock once for the whole batch
//! and hand `&Store` to their rayon tasks, which never lock again.

use crate::layout::Store;
use crate::params::FlatParams;
use crate::search::{search_batch, search_one, Scratch, Tiles, TILES};
use parking_lot::{Mutex, RwLock};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use vectide_core::metric::DistanceFn;
use vectide_core::seq::SeqTracker;
use vectide_core::validate::{check_vector, prepare_query};
use vectide_core::visited::VisitedPool;
use vectide_core::{
    limits, EngineDescriptor, Error, Filter, IndexStats, Metric, Neighbor, Params, Result,
    SearchParams, Seq, VectorIndex,
};

/// An exact (brute-force) index in memory. See the crate docs.
pub struct Flat {
    pub(crate) dim: usize,
    pub(crate) metric: Metric,
    pub(crate) params: FlatParams,
    pub(crate) dist: DistanceFn,
    pub(crate) store: RwLock<Store>,
    /// Operations in flight, for the watermark a save captures.
    pub(crate) seqs: SeqTracker,
    /// The watermark of the last save or load.
    pub(crate) durable: AtomicU64,
    /// Held by a save: one at a time.
    pub(crate) saving: Mutex<()>,
    scratch: VisitedPool<Scratch>,
    pool: Option<rayon::ThreadPool>,
}

impl std::fmt::Debug for Flat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Flat")
            .field("dim", &self.dim)
            .field("metric", &self.metric)
            .field("params", &self.params)
            .field("len", &self.len())
            .finish()
    }
}

impl Flat {
    /// An empty index.
    pub fn new(dim: usize, metric: Metric, params: FlatParams) -> Result<Self> {
        limits::check_dim(dim)?;
        Self::with_store(Store::new(dim, metric), metric, params, 0)
    }

    /// An index over a filled store whose operations up to `durable` are
    /// captured (a load).
    pub(crate) fn with_store(
        store: Store,
        metric: Metric,
        params: FlatParams,
        durable: Seq,
    ) -> Result<Self> {
        params.validate()?;
        let dim = store.dim();
        let pool = vectide_core::engine::thread_pool("flat", params.threads)?;
        Ok(Flat {
            dim,
            metric,
            params,
            dist: metric.distance_fn(),
            store: RwLock::new(store),
            seqs: SeqTracker::starting_at(durable),
            durable: AtomicU64::new(durable),
            saving: Mutex::new(()),
            scratch: VisitedPool::default(),
            pool,
        })
    }

    /// The parameters the index was created (or loaded) with.
    pub fn flat_params(&self) -> &FlatParams {
        &self.params
    }

    /// Checks a query, normalises it under cosine into pooled scratch, and
    /// runs `f` with the store (shared lock), the prepared query and the
    /// rest of the scratch.
    fn with_query<R>(
        &self,
        query: &[f32],
        f: impl FnOnce(&Store, &[f32], &mut Scratch) -> R,
    ) -> Result<R> {
        let mut scratch = self.scratch.get();
        let mut qbuf = std::mem::take(&mut scratch.query);
        let result = prepare_query(self.dim, self.metric, query, &mut qbuf)
            .map(|q| f(&self.store.read(), q, &mut scratch));
        scratch.query = qbuf;
        result
    }

    /// Runs `f` on the index's pool (or rayon's global one).
    pub fn install<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        match &self.pool {
            Some(p) => p.install(f),
            None => f(),
        }
    }

    /// [`VectorIndex::search_batch`] with explicit tile sizes: `query_tile`
    /// queries per task, `vector_tile` rows per matrix product (for tests
    /// and tuning; the trait method uses the tuned defaults).
    #[doc(hidden)]
    pub fn search_batch_tiled(
        &self,
        queries: &[f32],
        k: usize,
        filter: Option<Filter<'_>>,
        query_tile: usize,
        vector_tile: usize,
    ) -> Result<Vec<Vec<Neighbor>>> {
        limits::check_k(k)?;
        if query_tile == 0 || vector_tile == 0 {
            return Err(Error::invalid("tile sizes must be at least 1"));
        }
        if !queries.len().is_multiple_of(self.dim) {
            return Err(Error::DimensionMismatch {
                expected: self.dim,
                got: queries.len() % self.dim,
            });
        }
        for q in queries.chunks_exact(self.dim) {
            check_vector(self.dim, self.metric, q)?;
        }
        let tiles = Tiles {
            queries: query_tile,
            vectors: vector_tile,
        };
        let store = self.store.read();
        Ok(
            self.install(|| {
                search_batch(&store, self.metric, self.dist, queries, k, filter, tiles)
            }),
        )
    }

    /// Opens a file written by [`VectorIndex::save`] (`threads`: the pool of
    /// the loaded index, `None` for all cores).
    pub fn load(path: &Path, threads: Option<usize>) -> Result<Self> {
        crate::persist::load(path, FlatParams { threads })
    }

    /// Parses the bytes of a saved file (the fuzzable core of [`Flat::load`]).
    pub fn from_bytes(bytes: &[u8], threads: Option<usize>) -> Result<Self> {
        crate::persist::from_bytes(bytes, FlatParams { threads })
    }
}

impl VectorIndex for Flat {
    fn descriptor(&self) -> &'static EngineDescriptor {
        &crate::DESCRIPTOR
    }

    fn params(&self) -> Params {
        self.params.to_params(self.threads())
    }

    fn dim(&self) -> usize {
        self.dim
    }

    fn metric(&self) -> Metric {
        self.metric
    }

    fn pool(&self) -> Option<&rayon::ThreadPool> {
        self.pool.as_ref()
    }

    fn insert(&self, seq: Seq, ids: &[u64], vectors: &[f32]) -> Result<()> {
        self.insert_batch(seq, ids, vectors)
    }

    fn delete(&self, seq: Seq, ids: &[u64]) -> Result<usize> {
        self.delete_batch(seq, ids)
    }

    fn search_into(
        &self,
        query: &[f32],
        k: usize,
        _params: &SearchParams,
        filter: Option<Filter<'_>>,
        out: &mut Vec<Neighbor>,
    ) -> Result<()> {
        out.clear();
        limits::check_k(k)?;
        self.with_query(query, |store, q, scratch| {
            search_one(store, self.dist, q, k, filter, scratch, out)
        })
    }

    fn search_batch(
        &self,
        queries: &[f32],
        k: usize,
        _params: &SearchParams,
        filter: Option<Filter<'_>>,
    ) -> Result<Vec<Vec<Neighbor>>> {
        self.search_batch_tiled(queries, k, filter, TILES.queries, TILES.vectors)
    }

    fn distances(&self, query: &[f32], ids: &[u64], out: &mut Vec<Neighbor>) -> Result<()> {
        self.with_query(query, |store, q, _| {
            out.extend(ids.iter().filter_map(|&id| {
                let slot = store.slot_of(id)?;
                Some(Neighbor::new(id, (self.dist)(q, store.vector(slot))))
            }))
        })
    }

    fn get(&self, id: u64) -> Result<Option<Vec<f32>>> {
        let store = self.store.read();
        Ok(store.slot_of(id).map(|s| store.vector(s).to_vec()))
    }

    fn contains(&self, id: u64) -> Result<bool> {
        Ok(self.store.read().slot_of(id).is_some())
    }

    fn len(&self) -> usize {
        self.store.read().live()
    }

    /// A volatile index has nothing to make durable but by [`VectorIndex::save`].
    fn flush(&self) -> Result<()> {
        Ok(())
    }

    fn durable_seq(&self) -> Seq {
        self.durable.load(Ordering::Acquire)
    }

    fn stats(&self) -> Result<IndexStats> {
        let store = self.store.read();
        Ok(IndexStats {
            live: store.live(),
            // Deletes free their slot at once.
            slots_used: store.live(),
            capacity: store.capacity(),
            pending_deletes: 0,
            memory_bytes: store.memory_bytes(),
            extra: vec![("free_slots".into(), store.free_slots() as f64)],
            ..IndexStats::default()
        })
    }

    fn save(&self, path: &Path) -> Result<()> {
        crate::persist::save(self, path)
    }

    fn check_structure(&self) -> Result<Vec<String>> {
        Ok(self.store.read().check())
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_index_answers_and_reports() {
        let idx = Flat::new(2, Metric::L2, FlatParams { threads: Some(2) }).unwrap();
        idx.insert(1, &[1, 2, 3], &[0.0, 0.0, 1.0, 0.0, 5.0, 5.0])
            .unwrap();
        let r = idx
            .search(&[0.9, 0.0], 2, &SearchParams::default(), None)
            .unwrap();
        assert_eq!(r.iter().map(|n| n.id).collect::<Vec<_>>(), vec![2, 1]);
        assert!((r[0].distance - 0.01).abs() < 1e-6);
        assert_eq!(idx.threads(), 2);
        assert_eq!(idx.engine(), "flat");
        assert_eq!(idx.get(3).unwrap(), Some(vec![5.0, 5.0]));
        assert!(idx.contains(1).unwrap() && !idx.contains(4).unwrap());
        let mut d = Vec::new();
        idx.distances(&[0.0, 0.0], &[3, 9, 1], &mut d).unwrap();
        assert_eq!(d, vec![Neighbor::new(3, 50.0), Neighbor::new(1, 0.0)]);
        assert_eq!(idx.delete(2, &[1, 1, 77]).unwrap(), 1);
        let st = idx.stats().unwrap();
        assert_eq!((st.live, st.slots_used, st.pending_deletes), (2, 2, 0));
        assert!(st.capacity >= 3 && st.memory_bytes > 0);
        assert_eq!(idx.len(), 2);
        assert!(idx
            .search(&[0.0, 0.0], 0, &SearchParams::default(), None)
            .is_err());
        assert!(idx
            .search(
                &[0.0, 0.0],
                limits::MAX_K + 1,
                &SearchParams::default(),
                None
            )
            .is_err());
        for dim in [0, limits::MAX_DIM + 1, usize::MAX] {
            assert!(Flat::new(dim, Metric::L2, FlatParams::default()).is_err());
        }
    }
}
