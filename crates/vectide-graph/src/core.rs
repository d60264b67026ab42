//! [`GraphCore`]: the state and the plain operations every volatile graph
//! engine (`hnsw`, `fresh-vamana`) shares — the store and its locks, the id
//! map, slot allocation, the DeleteList, sequence numbers, the scratch pool,
//! the thread pool — so that an engine adds only its graph logic. An engine
//! holds one in a crate-private field: the allocator and the store's states
//! decide which slots `Store::init_slot` may overwrite, so no user of the
//! engine may reach them.
//!
//! ## Locks
//! - `store`: searches and insert batches share it; growth and slot
//!   reclamation take it exclusively (the reclamation barrier).
//! - `mutate`: insert and delete batches share it; consolidation and save
//!   take it exclusively, so they see no half-done insert.
//! - Order: `mutate`, then `alloc`, then `store`, then `ids` / `pending`.

use crate::mem::{Store, FREE};
use crate::search::Scratch;
use crate::slots::{Alloc, IdEntry};
use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use vectide_core::metric::DistanceFn;
use vectide_core::seq::SeqTracker;
use vectide_core::visited::VisitedPool;
use vectide_core::{Error, IndexStats, Metric, Neighbor, Result, Seq};

/// Shared state of a volatile graph engine (see the module docs).
pub struct GraphCore {
    pub dim: usize,
    pub metric: Metric,
    pub dist: DistanceFn,
    pub store: RwLock<Store>,
    pub mutate: RwLock<()>,
    pub ids: Mutex<HashMap<u64, IdEntry>>,
    pub alloc: Mutex<Alloc>,
    /// The DeleteList: slots deleted (or replaced by an upsert) and not yet
    /// consolidated.
    pub pending: Mutex<Vec<u32>>,
    pub consolidations: AtomicU64,
    /// The maintenance jobs running (consolidations).
    pub activity: vectide_core::activity::Activity,
    pub seqs: SeqTracker,
    /// The watermark of the last save (or load).
    pub durable: AtomicU64,
    pub scratch: VisitedPool<Scratch>,
    pub pool: Option<vectide_core::pools::Pool>,
    /// The file the index was last saved to or loaded from.
    pub path: Mutex<Option<PathBuf>>,
}

impl GraphCore {
    /// The state of an index over `store`; `engine` names the pool's
    /// threads. Checks the dimension.
    pub fn new(
        engine: &'static str,
        dim: usize,
        metric: Metric,
        store: Store,
        threads: Option<usize>,
    ) -> Result<Self> {
        if dim == 0 || dim > vectide_core::limits::MAX_DIM {
            return Err(Error::invalid(format!(
                "dimension must be in 1..={}, got {dim}",
                vectide_core::limits::MAX_DIM
            )));
        }
        Ok(GraphCore {
            dim,
            metric,
            dist: metric.distance_fn(),
            store: RwLock::new(store),
            mutate: RwLock::new(()),
            ids: Mutex::new(HashMap::new()),
            alloc: Mutex::new(Alloc::default()),
            pending: Mutex::new(Vec::new()),
            consolidations: AtomicU64::new(0),
            activity: Default::default(),
            seqs: SeqTracker::default(),
            durable: AtomicU64::new(0),
            scratch: VisitedPool::default(),
            pool: vectide_core::engine::thread_pool(engine, threads)?,
            path: Mutex::new(None),
        })
    }

    /// Installs what a load read: the id map, the allocator, the
    /// DeleteList and the watermark.
    pub fn restore(
        &mut self,
        ids: HashMap<u64, IdEntry>,
        alloc: Alloc,
        pending: Vec<u32>,
        durable_seq: Seq,
    ) {
        *self.ids.get_mut() = ids;
        *self.alloc.get_mut() = alloc;
        *self.pending.get_mut() = pending;
        self.durable.store(durable_seq, Ordering::Release);
        self.seqs = SeqTracker::starting_at(durable_seq);
    }

    /// Runs `f` on the index's thread pool (or rayon's global one).
    pub fn install<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        match &self.pool {
            Some(p) => p.install(f),
            None => f(),
        }
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

    /// Live ids.
    pub fn live(&self) -> usize {
        self.ids.lock().len()
    }

    /// The stored vector of an id.
    pub fn get(&self, id: u64) -> Option<Vec<f32>> {
        let store = self.store.read();
        let slot = self.ids.lock().get(&id).map(|e| e.slot);
        slot.map(|s| store.vector(s).to_vec())
    }

    /// Whether an id is live.
    pub fn contains(&self, id: u64) -> bool {
        self.ids.lock().contains_key(&id)
    }

    /// Exact distances from a query to the live ones of `ids`.
    pub fn distances(&self, query: &[f32], ids: &[u64], out: &mut Vec<Neighbor>) -> Result<()> {
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

    /// Deletes (tombstones) the ids a delete at `seq` may remove; returns
    /// how many, and whether the DeleteList now exceeds `fraction` of the
    /// live points (a consolidation is due).
    pub fn delete(&self, seq: Seq, ids: &[u64], fraction: f64) -> (usize, bool) {
        let removed = {
            let _shared = self.mutate.read();
            let store = self.store.read();
            crate::slots::delete_ids(&store, &self.ids, &self.pending, ids, seq)
        };
        (removed, self.consolidation_due(fraction))
    }

    /// Whether the DeleteList exceeds `fraction` of the live points (a
    /// consolidation is due).
    pub fn consolidation_due(&self, fraction: f64) -> bool {
        let pending = self.pending.lock().len();
        pending as f64 > fraction * self.live().max(1) as f64
    }

    /// The end of a consolidation: waits, by taking the store exclusively,
    /// for every search that may still hold a dead id, then frees the slots
    /// for the next inserts.
    ///
    /// # Safety
    /// The caller holds `mutate` exclusively, every slot in `dead` is
    /// deleted (retired, not live, not an entry point) and no list of a
    /// slot outside `dead` names one of them: the next insert given such a
    /// slot writes its vector with `Store::init_slot`, which requires that
    /// nothing can reach it.
    pub unsafe fn reclaim(&self, dead: &[u32]) {
        drop(self.store.write());
        {
            let store = self.store.read();
            for &d in dead {
                store.set_state(d, FREE);
            }
        }
        self.alloc.lock().free.extend_from_slice(dead);
        self.consolidations.fetch_add(1, Ordering::Relaxed);
    }

    /// The common counters of `stats()`.
    pub fn stats(&self) -> IndexStats {
        // Lock order: `alloc` is never taken while holding `store`.
        let used = self.alloc.lock().next as usize;
        let slots_used = self.slots_used();
        let live = self.live();
        let store = self.store.read();
        let ids_bytes = self.ids.lock().capacity() * (std::mem::size_of::<(u64, IdEntry)>() + 1);
        let mut stats = IndexStats {
            live,
            slots_used,
            capacity: store.capacity,
            pending_deletes: self.pending.lock().len(),
            memory_bytes: store.memory_bytes(used) + ids_bytes,
            consolidations: self.consolidations.load(Ordering::Relaxed),
            ..IndexStats::default()
        };
        self.activity.fill(&mut stats);
        stats
    }
}

impl GraphCore {
    /// The frame of a query: checks `k` and the query (normalised under
    /// cosine into a pooled buffer), then runs `f` with the store (read
    /// lock held) and a pooled scratch.
    pub fn with_query(
        &self,
        query: &[f32],
        k: usize,
        f: impl FnOnce(&Store, &[f32], &mut Scratch),
    ) -> Result<()> {
        if k == 0 {
            return Err(Error::invalid("k must be at least 1"));
        }
        let mut scratch = self.scratch.get();
        let mut qbuf = std::mem::take(&mut scratch.query);
        let result = vectide_core::validate::prepare_query(self.dim, self.metric, query, &mut qbuf)
            .map(|q| {
                let store = self.store.read();
                f(&store, q, &mut scratch)
            });
        scratch.query = qbuf;
        result
    }
}

/// The [`vectide_core::VectorIndex`] methods a volatile graph engine answers
/// from its [`GraphCore`] (a field `core`) and its own `save`: `pool`,
/// `distances`, `get`, `contains`, `len`, `flush` (a save to the last
/// path), `durable_seq` and `stats`. Used inside the engine's `impl`.
#[macro_export]
macro_rules! graph_core_methods {
    () => {
        fn pool(&self) -> Option<&rayon::ThreadPool> {
            self.core.pool.as_deref()
        }

        fn distances(
            &self,
            query: &[f32],
            ids: &[u64],
            out: &mut Vec<vectide_core::Neighbor>,
        ) -> vectide_core::Result<()> {
            self.core.distances(query, ids, out)
        }

        fn get(&self, id: u64) -> vectide_core::Result<Option<Vec<f32>>> {
            Ok(self.core.get(id))
        }

        fn contains(&self, id: u64) -> vectide_core::Result<bool> {
            Ok(self.core.contains(id))
        }

        fn len(&self) -> usize {
            self.core.live()
        }

        fn flush(&self) -> vectide_core::Result<()> {
            match self.core.path() {
                Some(p) => vectide_core::VectorIndex::save(self, &p),
                None => Ok(()),
            }
        }

        fn durable_seq(&self) -> vectide_core::Seq {
            self.core.durable.load(std::sync::atomic::Ordering::Acquire)
        }

        fn stats(&self) -> vectide_core::Result<vectide_core::IndexStats> {
            Ok(self.core.stats())
        }
    };
}
