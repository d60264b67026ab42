//! The state of [`Flat`]: the struct every part of the engine works
//! on, its locks and its inherent methods. The parts (build, update,
//! persistence, …) and the engine's face (`engine.rs`, the
//! [`VectorIndex`](vectide_core::VectorIndex) implementation) import it;
//! it imports none of them.
//!
//! One `RwLock` guards the slot store: searches (single, batched, `get`,
//! `distances`) and saves share it, inserts and deletes take it
//! exclusively. Batch calls hold the shared lock once for the whole batch
//! and hand `&Store` to their rayon tasks, which never lock again.

use crate::layout::Store;
use crate::params::FlatParams;
use crate::search::{search_batch, Scratch, Tiles};
use parking_lot::{Mutex, RwLock};
use std::path::Path;
use std::sync::atomic::AtomicU64;
use vectide_core::metric::DistanceFn;
use vectide_core::seq::SeqTracker;
use vectide_core::validate::{check_vector, prepare_query};
use vectide_core::visited::VisitedPool;
use vectide_core::{limits, Error, Filter, Metric, Neighbor, Result, Seq, VectorIndex};

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
    pub(crate) scratch: VisitedPool<Scratch>,
    pub(crate) pool: Option<vectide_core::pools::Pool>,
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
    pub(crate) fn with_query<R>(
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
