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
use crate::Graph;
use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use vectide_core::io::stage_write;
use vectide_core::metric::DistanceFn;
use vectide_core::seq::SeqTracker;
use vectide_core::visited::VisitedPool;
use vectide_core::StagedSave;
use vectide_core::{heap, Error, IndexStats, Metric, Neighbor, Result, Seq};

/// Slots an exact scan reads under one hold of the store's read lock.
pub const SCAN_STRETCH: usize = 4096;

/// The `k` nearest of the slots below `end()` (asked again after each
/// stretch: inserts extend it), nearest first, ties by id, one per id:
/// `stretch(slots, bound, kept)` pushes the live ones among `slots` no
/// farther than `bound` (the k-th distance found so far), holding the
/// engine's read lock for that stretch only, so that a writer that needs
/// it exclusively waits for [`SCAN_STRETCH`] slots, never the whole scan.
/// An upsert makes its new slot live before it retires the old one: an
/// id met twice keeps its nearer copy. An engine's
/// [`vectide_core::VectorIndex::exact_scan`] over its slots.
pub fn scan_nearest(
    k: usize,
    mut end: impl FnMut() -> u32,
    mut stretch: impl FnMut(std::ops::Range<u32>, f32, &mut Vec<Neighbor>),
) -> Result<Vec<Neighbor>> {
    vectide_core::limits::check_k(k)?;
    let mut kept: Vec<Neighbor> = Vec::with_capacity(k.min(SCAN_STRETCH) + SCAN_STRETCH);
    // The k-th distance once `kept` has been cut to k (a point farther
    // than it cannot enter).
    let mut bound = f32::INFINITY;
    let mut start = 0u32;
    loop {
        let end = end();
        if start >= end {
            break;
        }
        let stop = end.min(start.saturating_add(SCAN_STRETCH as u32));
        stretch(start..stop, bound, &mut kept);
        if kept.len() > k {
            heap::keep_nearest(&mut kept, k);
            bound = kept
                .iter()
                .map(|n| n.distance)
                .fold(f32::NEG_INFINITY, f32::max);
        }
        start = stop;
    }
    kept.sort_by(heap::by_distance_then_id);
    let mut seen = std::collections::HashSet::with_capacity(kept.len());
    kept.retain(|n| seen.insert(n.id));
    Ok(kept)
}

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
    /// Held by a save from its start to its commit, so that saves reach
    /// their file and `durable` in the order they were taken.
    pub saving: Mutex<()>,
    /// Held through a consolidation (they run one at a time: a
    /// consolidation's repair runs beside the writers).
    pub consolidating: Mutex<()>,
    /// Set by `VectorIndex::defer_maintenance`: a delete that passes the
    /// threshold leaves the consolidation to the caller's `maintain()`.
    pub maintenance_deferred: std::sync::atomic::AtomicBool,
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
            saving: Mutex::new(()),
            consolidating: Mutex::new(()),
            maintenance_deferred: Default::default(),
        })
    }

    /// A save's first step (see [`vectide_core::VectorIndex::save_staged`]):
    /// with inserts and deletes paused, `write` fills a temp file beside
    /// `path` from the store, the watermark and the allocator's end; the
    /// returned save's commit makes it durable, puts it in place and moves
    /// `durable` and `path`. Saves are serialized from here to their commit.
    pub fn save_staged<'a>(
        &'a self,
        path: &Path,
        write: impl FnOnce(&mut dyn Write, &Store, Seq, u32) -> Result<()>,
    ) -> Result<StagedSave<'a>> {
        let saving = self.saving.lock();
        let (file, watermark) = {
            let _exclusive = self.mutate.write();
            let watermark = self.seqs.watermark();
            let alloc_next = self.alloc.lock().next;
            let store = self.store.read();
            let file = stage_write(path, |w| write(w, &store, watermark, alloc_next))?;
            (file, watermark)
        };
        let path = path.to_path_buf();
        Ok(StagedSave::new(file, watermark, move || {
            self.durable.store(watermark, Ordering::Release);
            *self.path.lock() = Some(path);
            drop(saving);
        }))
    }

    /// Writes a saved graph file of `hnsw` or `fresh-vamana`: `header`
    /// (the magic, the version and the engine's fields), the slot records
    /// ([`Self::write_slot_records`]), then the trailer that
    /// `vectide_core::io::check_envelope` checks (the CRC32 of everything
    /// before it, `end_magic`).
    pub fn write_graph_file(
        w: &mut dyn std::io::Write,
        header: &[u8],
        store: &Store,
        alloc_next: u32,
        levels: bool,
        end_magic: &[u8; 8],
    ) -> Result<()> {
        let mut cw = vectide_core::io::CrcWriter::new(w);
        cw.put(header)?;
        Self::write_slot_records(store, alloc_next, levels, &mut cw)?;
        let crc = cw.crc();
        w.write_all(&crc.to_le_bytes())?;
        w.write_all(end_magic)?;
        Ok(())
    }

    /// Writes slots `0..alloc_next` of `store` as the saved graph formats
    /// of `hnsw` and `fresh-vamana` lay them out: `state u8 | level u8 |
    /// 0 u16`, then for a slot in use its label, sequence number, vector
    /// and, per level up to `level` (0 when `levels` is false), a neighbour
    /// count and the neighbours.
    pub fn write_slot_records(
        store: &Store,
        alloc_next: u32,
        levels: bool,
        cw: &mut vectide_core::io::CrcWriter<'_>,
    ) -> Result<()> {
        let mut rec = Vec::with_capacity(64 + store.dim * 4 + (1 + store.cap(0)) * 4);
        let mut list = Vec::new();
        for s in 0..alloc_next {
            rec.clear();
            let state = store.state(s);
            let level = if state == FREE || !levels {
                0
            } else {
                store.level(s)
            };
            rec.extend_from_slice(&[state, level as u8, 0, 0]);
            if state != FREE {
                rec.extend_from_slice(&store.label(s).to_le_bytes());
                rec.extend_from_slice(&store.seq(s).to_le_bytes());
                for x in store.vector(s) {
                    rec.extend_from_slice(&x.to_le_bytes());
                }
                for l in 0..=level {
                    store.neighbors_into(s, l, &mut list);
                    rec.extend_from_slice(&(list.len() as u32).to_le_bytes());
                    for &n in &list {
                        rec.extend_from_slice(&n.to_le_bytes());
                    }
                }
            }
            cw.put(&rec)?;
        }
        Ok(())
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

    /// The `k` nearest live points to `query` by exact distance, nearest
    /// first (see [`vectide_core::VectorIndex::exact_scan`]): the slots in
    /// memory order, the store's read lock taken per [`SCAN_STRETCH`]
    /// slots, so that a growth or a consolidation's reclaim (which take the
    /// store exclusively) waits for one stretch, never the whole scan.
    /// Under one read lock a slot seen live keeps its label and vector (a
    /// slot is freed only under the exclusive lock).
    pub fn exact_scan(&self, query: &[f32], k: usize) -> Result<Vec<Neighbor>> {
        let mut qbuf = Vec::new();
        let q = vectide_core::validate::prepare_query(self.dim, self.metric, query, &mut qbuf)?;
        scan_nearest(
            k,
            || self.alloc.lock().next,
            |slots, bound, kept| {
                let store = self.store.read();
                for slot in slots {
                    if store.is_live(slot) {
                        let d = (self.dist)(q, store.vector(slot));
                        if d <= bound {
                            kept.push(Neighbor::new(store.label(slot), d));
                        }
                    }
                }
            },
        )
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

    /// `VectorIndex::defer_maintenance` of an engine on this core: its
    /// writers leave a due consolidation to the caller's `maintain()`.
    pub fn defer_maintenance(&self) -> bool {
        self.maintenance_deferred
            .store(true, std::sync::atomic::Ordering::Release);
        true
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
    ///
    /// On a pool thread the read lock is taken recursively: a batch's
    /// queries run as jobs of the engine's pool, and a pool thread that
    /// waits inside an insert or a consolidation (which hold the store's
    /// read lock across their own jobs) may run one. Had it queued behind
    /// a writer waiting for that same read lock (an insert that grows the
    /// store), neither could go on: the deadlock a Python test of
    /// `fresh-vamana` met under concurrent inserts, deletes and searches.
    /// Other threads queue behind a waiting writer, so that a stream of
    /// single queries cannot keep a growth waiting.
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
                let store = if rayon::current_thread_index().is_some() {
                    self.store.read_recursive()
                } else {
                    self.store.read()
                };
                f(&store, q, &mut scratch)
            });
        scratch.query = qbuf;
        result
    }
}

/// The [`vectide_core::VectorIndex`] methods a volatile graph engine answers
/// from its [`GraphCore`] (a field `core`) and its own `save`: `pool`,
/// `distances`, `exact_scan`, `get`, `contains`, `len`, `flush` (a save to the last
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

        fn exact_scan(
            &self,
            query: &[f32],
            k: usize,
        ) -> vectide_core::Result<Option<Vec<vectide_core::Neighbor>>> {
            self.core.exact_scan(query, k).map(Some)
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    /// A query must not queue behind a writer that waits for a read lock
    /// already held: an insert holds the store's read lock across its pool
    /// jobs, and a pool thread that waits there may run a search's job.
    #[test]
    fn a_query_passes_a_waiting_writer_while_the_store_is_read_locked() {
        let core = GraphCore::new("test", 2, Metric::L2, Store::new(2, 4, 8), Some(1)).unwrap();
        std::thread::scope(|s| {
            let held = core.store.read();
            let writer = s.spawn(|| drop(core.store.write()));
            // Let the writer park on the lock.
            std::thread::sleep(Duration::from_millis(200));
            let (tx, rx) = mpsc::channel();
            let core = &core;
            // The query runs as a job of the engine's pool, as a batch's do.
            let query = s.spawn(move || {
                let r = core.install(|| core.with_query(&[0.0, 1.0], 1, |_, _, _| ()));
                tx.send(r.is_ok()).unwrap();
            });
            let answered = rx.recv_timeout(Duration::from_secs(5));
            drop(held);
            query.join().unwrap();
            writer.join().unwrap();
            assert_eq!(answered, Ok(true), "the query waited for the writer");
        });
    }
}
