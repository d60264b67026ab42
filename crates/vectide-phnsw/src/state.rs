//! The state of [`PHnsw`]: the struct every part of the engine works
//! on, its locks and its inherent methods. The parts (build, update,
//! persistence, …) and the engine's face (`engine.rs`, the
//! [`VectorIndex`](vectide_core::VectorIndex) implementation) import it;
//! it imports none of them.

use super::labels::Labels;
use super::layout::{
    decode_data_header, decode_meta, encode_data_header, encode_meta, meta_crc, unpack_entry,
    Geometry, PGraph, META_FILE, M_DURABLE_SEQ, M_ENTRY, M_LABELS_ROOT, M_NEXT_SLOT, M_UPPER_NEXT,
    NODES_FILE, NODES_MAGIC, PAGE, UPPER_FILE, UPPER_MAGIC,
};
use super::log::Logs;
use parking_lot::{Mutex, RwLock};
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use vectide_core::metric::DistanceFn;
use vectide_core::visited::VisitedPool;
use vectide_core::{Error, Metric, Result, Seq, SeqTracker, VectorIndex};
use vectide_graph::search::Scratch;
use vectide_graph::HnswParams;
use vectide_storage::{Media, PersistMode, Region, Site};

/// Parameters of a P-HNSW index beyond the HNSW ones.
#[derive(Debug, Clone, PartialEq)]
pub struct PHnswParams {
    /// Graph parameters (`m`, `ef_construction`, `ef_search`, `seed`,
    /// `threads`, and for consolidations `consolidate_fraction` and
    /// `repair_alpha`, which an open takes at their defaults: they are not
    /// stored in the index).
    pub hnsw: HnswParams,
    /// NLog entries: concurrent operations at most (default 64).
    pub nlog_entries: usize,
    /// NlistLog entries (default 1024): an insert logs up to 32 neighbour
    /// lists per batch of fences.
    pub nlist_entries: usize,
    /// Node blocks allocated at creation (the file grows by half when full).
    pub initial_capacity: usize,
}

impl Default for PHnswParams {
    fn default() -> Self {
        PHnswParams {
            hnsw: HnswParams::default(),
            nlog_entries: 64,
            nlist_entries: 1024,
            initial_capacity: 1024,
        }
    }
}

/// Stripes of the per-node DRAM locks (re-initialised at every open, §4).
pub(crate) const LOCK_STRIPES: usize = 1 << 14;

pub(crate) const LABEL_STRIPES: usize = 1 << 12;

/// Accumulated insert time by phase (nanoseconds): the paper's Figure 10.
#[derive(Debug, Default)]
pub struct Timing {
    pub search_ns: AtomicU64,
    pub update_ns: AtomicU64,
    pub logging_ns: AtomicU64,
}

/// Insert time by phase, in seconds of thread time.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Breakdown {
    pub search_s: f64,
    pub update_s: f64,
    pub logging_s: f64,
}

/// Crash-consistent HNSW in a persistent region (see the module docs).
pub struct PHnsw {
    pub(crate) dir: PathBuf,
    pub(crate) g: Geometry,
    pub(crate) params: HnswParams,
    pub(crate) dist: DistanceFn,
    pub(crate) meta: Region,
    pub(crate) graph: PGraph,
    pub(crate) labels: Labels,
    pub(crate) logs: Logs,
    pub(crate) locks: Box<[Mutex<()>]>,
    /// Serialises operations on the same label (striped by hash).
    pub(crate) label_locks: Box<[Mutex<()>]>,
    pub(crate) entry_lock: Mutex<()>,
    pub(crate) seqs: SeqTracker,
    pub(crate) scratch: VisitedPool<Scratch>,
    pub(crate) pool: Option<vectide_core::pools::Pool>,
    pub(crate) timing: Timing,
    pub(crate) media: Arc<dyn Media>,
    /// What the last open's recovery did.
    pub(crate) recovery: super::recovery::RecoveryReport,
    /// Nodes allocated before this open (slots below it) and the durable
    /// sequence word at the open: see [`PHnsw::recorded_seq`].
    pub(crate) opened_slot: u32,
    pub(crate) opened_durable: Seq,
    /// The highest durable sequence word value a completed fence is known to
    /// have made durable (see [`PHnsw::store_durable_seq`]).
    pub(crate) durable_fenced: AtomicU64,
    /// Set when a logged insert failed to publish (see
    /// [`vectide_core::poison`]): the NLog entry stays for recovery to
    /// redo, and writes are refused until the index is reopened.
    pub(crate) poison: vectide_core::poison::Poison,
    /// Taken shared by every insert and delete (one row at a time) and
    /// exclusively by a consolidation (`consolidate.rs`).
    pub(crate) mutate: RwLock<()>,
    /// Taken shared by every read that walks the graph or follows the label
    /// map; a consolidation takes it exclusively once, between unlinking
    /// its slots and handing them to inserts, so that no reader that could
    /// still hold an unlinked slot sees it reused.
    pub(crate) gate: RwLock<()>,
    /// Slots inserts take before they extend `nodes.vtdp` (DRAM only;
    /// rebuilt from the node states by every consolidation).
    pub(crate) free: Mutex<Vec<u32>>,
    /// Upper-list room inserts take before they bump `upper next` (DRAM
    /// only; rebuilt from the linked nodes' blocks with the free list).
    pub(crate) rooms: Mutex<crate::rooms::RoomPool>,
    /// Slots below `opened_slot` that an insert reused since the open: they
    /// carry the number of their new write (see [`PHnsw::recorded_seq`]).
    pub(crate) reused: Mutex<HashSet<u32>>,
    /// Maintenance jobs (`consolidate`) for the contract's stats.
    pub(crate) activity: vectide_core::activity::Activity,
    /// Consolidation figures since the open.
    pub(crate) consolidation: ConsolidationStats,
    /// Set while a consolidation runs or is claimed by a writer's trigger.
    pub(crate) consolidating: AtomicBool,
    /// One consolidation at a time (its repair runs beside writers, so the
    /// `mutate` lock no longer orders two of them).
    pub(crate) consolidation_serial: Mutex<()>,
    /// Set by `VectorIndex::defer_maintenance`: writers leave a due
    /// consolidation to the caller's `maintain()`.
    pub(crate) maintenance_deferred: AtomicBool,
}

/// What consolidations did since the open.
#[derive(Debug, Default)]
pub(crate) struct ConsolidationStats {
    pub runs: AtomicU64,
    pub unlinked: AtomicU64,
    pub lists_repaired: AtomicU64,
    pub slots_reused: AtomicU64,
    pub micros: AtomicU64,
    /// Live nodes linked again by the reachability walk.
    pub relinked: AtomicU64,
    /// Time writers waited in the last step (entry point, relinks,
    /// unlinks, free list), summed, and its longest.
    pub paused_micros: AtomicU64,
    pub paused_max_micros: AtomicU64,
}

impl std::fmt::Debug for PHnsw {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PHnsw")
            .field("dir", &self.dir)
            .field("dim", &self.g.dim)
            .field("metric", &self.g.metric)
            .field("media", &self.media.kind())
            .field("len", &self.len())
            .finish()
    }
}

pub(crate) const SITE_INIT: Site = Site("create");

impl PHnsw {
    /// Creates a new index in `dir` (created if missing; it must not hold an
    /// index already), on the media of `mode` (or the one a crash kit
    /// installed for `dir`: `vectide_storage::media_for`).
    pub fn create(
        dir: &Path,
        dim: usize,
        metric: Metric,
        params: PHnswParams,
        mode: PersistMode,
    ) -> Result<Self> {
        let media = vectide_storage::media_for(dir, || vectide_storage::media::for_mode(mode));
        Self::create_on(dir, dim, metric, params, media)
    }

    /// Opens (and recovers) the index in `dir` on the media of `mode`.
    pub fn open(dir: &Path, mode: PersistMode, threads: Option<usize>) -> Result<Self> {
        let media = vectide_storage::media_for(dir, || vectide_storage::media::for_mode(mode));
        Self::open_on(dir, media, threads)
    }

    /// Whether `dir` holds a P-HNSW index (its meta file exists).
    pub fn exists(dir: &Path) -> bool {
        dir.join(META_FILE).is_file()
    }

    /// [`PHnsw::create`] on a given media (the crash simulator in tests).
    pub fn create_on(
        dir: &Path,
        dim: usize,
        metric: Metric,
        params: PHnswParams,
        media: Arc<dyn Media>,
    ) -> Result<Self> {
        params.hnsw.validate()?;
        let g = Geometry {
            dim,
            metric,
            m: params.hnsw.m,
            m0: params.hnsw.m0(),
            ef_construction: params.hnsw.ef_construction,
            ef_search: params.hnsw.ef_search,
            seed: params.hnsw.seed,
            nlog_entries: params.nlog_entries,
            nlist_entries: params.nlist_entries,
        };
        g.validate()?;
        if params.initial_capacity > (u32::MAX as usize) / 2 {
            return Err(Error::invalid("initial_capacity is too large"));
        }
        std::fs::create_dir_all(dir).map_err(|e| Error::io_at(dir, e))?;
        if Self::exists(dir) {
            return Err(Error::invalid(format!(
                "{} already holds a P-HNSW index; open it instead",
                dir.display()
            )));
        }
        // Data files first, the meta file last: an index exists once its
        // meta file does, and a crash before leaves files the next create
        // replaces.
        for f in [NODES_FILE, UPPER_FILE] {
            let _ = std::fs::remove_file(dir.join(f));
        }
        let page = encode_meta(&g);
        let crc = u32::from_le_bytes(page[12..16].try_into().expect("4 bytes"));
        let cap = params.initial_capacity.max(16);
        let nodes = Region::create(
            media.clone(),
            &dir.join(NODES_FILE),
            PAGE + cap * g.node_size(),
        )?;
        write_page(
            &nodes,
            &encode_data_header(NODES_MAGIC, crc, g.node_size() as u64, g.dim as u64),
        );
        let upper = Region::create(
            media.clone(),
            &dir.join(UPPER_FILE),
            PAGE + (cap / 8 + 1) * 4 * g.upper_list_bytes(),
        )?;
        write_page(&upper, &encode_data_header(UPPER_MAGIC, crc, g.m as u64, 0));
        let log2 = (cap * 2).next_power_of_two().trailing_zeros().max(10);
        let (labels, root) = Labels::create(dir, media.clone(), crc, log2)?;
        let tmp = dir.join(format!(".{META_FILE}.new"));
        let _ = std::fs::remove_file(&tmp);
        let meta = Region::create(media.clone(), &tmp, g.meta_len())?;
        write_page(&meta, &page);
        meta.u64_at(M_LABELS_ROOT).store(root, Ordering::Relaxed);
        meta.persist(SITE_INIT, 0, meta.len());
        meta.fence(SITE_INIT);
        std::fs::rename(&tmp, dir.join(META_FILE)).map_err(|e| Error::io_at(dir, e))?;
        vectide_core::io::sync_dir(dir)?;
        drop((meta, nodes, upper, labels));
        Self::open_on(dir, media, params.hnsw.threads)
    }

    /// [`PHnsw::open`] on a given media.
    pub fn open_on(dir: &Path, media: Arc<dyn Media>, threads: Option<usize>) -> Result<Self> {
        let meta_path = dir.join(META_FILE);
        if !meta_path.is_file() {
            return Err(Error::invalid(format!(
                "{} holds no P-HNSW index (no {META_FILE})",
                dir.display()
            )));
        }
        let meta = Region::open(media.clone(), &meta_path)?;
        if meta.len() < PAGE {
            return Err(Error::corrupted(format!(
                "{}: {} bytes, shorter than its header page",
                meta_path.display(),
                meta.len()
            )));
        }
        let g = decode_meta(&meta.snapshot(0, PAGE))?;
        if meta.len() < g.meta_len() {
            return Err(Error::corrupted(format!(
                "{}: {} bytes, the logs need {}",
                meta_path.display(),
                meta.len(),
                g.meta_len()
            )));
        }
        let crc = meta_crc(&meta);
        let open_data = |name: &str, magic: &[u8; 8]| -> Result<(Region, (u64, u64))> {
            let path = dir.join(name);
            let r = Region::open(media.clone(), &path)?;
            if r.len() < PAGE {
                return Err(Error::corrupted(format!(
                    "{}: truncated header",
                    path.display()
                )));
            }
            let h = decode_data_header(
                &r.snapshot(0, PAGE),
                magic,
                &path.display().to_string(),
                crc,
            )?;
            Ok((r, h))
        };
        let (nodes, (node_size, dim)) = open_data(NODES_FILE, NODES_MAGIC)?;
        if node_size as usize != g.node_size() || dim as usize != g.dim {
            return Err(Error::corrupted(format!(
                "{NODES_FILE}: node size {node_size} / dim {dim} do not match the header"
            )));
        }
        let (upper, (m, _)) = open_data(UPPER_FILE, UPPER_MAGIC)?;
        if m as usize != g.m {
            return Err(Error::corrupted(format!(
                "{UPPER_FILE}: m {m} does not match the header"
            )));
        }
        let labels = Labels::open(
            dir,
            media.clone(),
            crc,
            meta.u64_at(M_LABELS_ROOT).load(Ordering::Acquire),
        )?;
        let graph = PGraph::new(g, nodes, upper);
        // Allocation words must lie inside their files.
        let next = meta.u64_at(M_NEXT_SLOT).load(Ordering::Acquire) as usize;
        if next > graph.capacity() {
            return Err(Error::corrupted(format!(
                "next slot {next} beyond the {} node blocks of {NODES_FILE}",
                graph.capacity()
            )));
        }
        let upper_next = meta.u64_at(M_UPPER_NEXT).load(Ordering::Acquire) as usize;
        if upper_next < PAGE || upper_next > graph.upper.len() {
            return Err(Error::corrupted(format!(
                "upper allocation word {upper_next} outside {UPPER_FILE} ({} bytes)",
                graph.upper.len()
            )));
        }
        let params = HnswParams {
            m: g.m,
            ef_construction: g.ef_construction,
            ef_search: g.ef_search,
            seed: g.seed,
            threads,
            ..HnswParams::default()
        };
        params.validate()?;
        let durable = meta.u64_at(M_DURABLE_SEQ).load(Ordering::Acquire);
        let mut idx = PHnsw {
            dir: dir.to_path_buf(),
            dist: g.metric.distance_fn(),
            logs: Logs::new(g),
            g,
            params,
            meta,
            graph,
            labels,
            locks: (0..LOCK_STRIPES).map(|_| Mutex::new(())).collect(),
            label_locks: (0..LABEL_STRIPES).map(|_| Mutex::new(())).collect(),
            entry_lock: Mutex::new(()),
            seqs: SeqTracker::starting_at(durable),
            scratch: VisitedPool::default(),
            pool: vectide_core::engine::thread_pool("phnsw", threads)?,
            timing: Timing::default(),
            media,
            recovery: Default::default(),
            opened_slot: 0,
            opened_durable: durable,
            durable_fenced: AtomicU64::new(0),
            poison: Default::default(),
            mutate: RwLock::new(()),
            gate: RwLock::new(()),
            free: Mutex::new(Vec::new()),
            rooms: Mutex::new(Default::default()),
            reused: Mutex::new(HashSet::new()),
            activity: Default::default(),
            consolidation: Default::default(),
            consolidating: AtomicBool::new(false),
            consolidation_serial: Mutex::new(()),
            maintenance_deferred: AtomicBool::new(false),
        };
        idx.recovery = idx.recover()?;
        if idx.consolidation_cut_off() {
            // After the logs: the undone batch names dead nodes again, and
            // the consolidation repairs it with the rest.
            idx.consolidate()?;
            idx.recovery.consolidation_finished = true;
        }
        // Recovery allocates nothing: every slot below this one holds a node
        // written before this open.
        idx.opened_slot = u32::try_from(idx.next_slot()).unwrap_or(u32::MAX);
        let entry = idx.meta.u64_at(M_ENTRY).load(Ordering::Acquire);
        if let Some((ep, _)) = unpack_entry(entry) {
            if ep as usize >= next {
                return Err(Error::corrupted(format!(
                    "entry point {ep} beyond next slot {next}"
                )));
            }
        }
        Ok(idx)
    }

    /// The directory of the index.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The media's kind: `pmem`, `pmem-emulated`, `msync` or `sim`.
    pub fn media_kind(&self) -> &'static str {
        self.media.kind()
    }

    /// The graph parameters.
    pub fn params(&self) -> &HnswParams {
        &self.params
    }

    /// What the recovery of the last open did.
    pub fn recovery_report(&self) -> &super::recovery::RecoveryReport {
        &self.recovery
    }

    /// Insert time spent so far by phase (thread time).
    pub fn breakdown(&self) -> Breakdown {
        let s = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64 * 1e-9;
        Breakdown {
            search_s: s(&self.timing.search_ns),
            update_s: s(&self.timing.update_ns),
            logging_s: s(&self.timing.logging_ns),
        }
    }

    /// The vector of a label (reads the region in memory; cannot fail).
    pub fn vector_of(&self, id: u64) -> Option<Vec<f32>> {
        use vectide_graph::Graph;
        let _gate = self.gate.read();
        self.labels
            .get(&self.graph, id)
            .map(|s| self.graph.vector(s).to_vec())
    }

    /// Whether a label is live.
    pub fn has_label(&self, id: u64) -> bool {
        let _gate = self.gate.read();
        self.labels.get(&self.graph, id).is_some()
    }

    /// Named figures of [`VectorIndex::stats`]: what the last open's
    /// recovery did (`recovery.*`) and insert thread time by phase
    /// (`insert_seconds.*`, the paper's Figure 10).
    pub(crate) fn extra_stats(&self) -> Vec<(String, f64)> {
        let r = self.recovery_report();
        let b = self.breakdown();
        let c = &self.consolidation;
        let ld = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64;
        [
            ("recovery.lists_undone", r.lists_undone as f64),
            ("recovery.discarded", r.discarded as f64),
            ("recovery.redone_logged", r.redone_logged as f64),
            ("recovery.redone_complete", r.redone_complete as f64),
            ("recovery.deletes_redone", r.deletes_redone as f64),
            (
                "recovery.consolidation_finished",
                f64::from(u8::from(r.consolidation_finished)),
            ),
            ("recovery.micros", r.micros as f64),
            ("insert_seconds.search", b.search_s),
            ("insert_seconds.update", b.update_s),
            ("insert_seconds.logging", b.logging_s),
            ("consolidate.runs", ld(&c.runs)),
            ("consolidate.unlinked", ld(&c.unlinked)),
            ("consolidate.lists_repaired", ld(&c.lists_repaired)),
            ("consolidate.slots_reused", ld(&c.slots_reused)),
            ("consolidate.micros", ld(&c.micros)),
            ("consolidate.relinked", ld(&c.relinked)),
            ("consolidate.paused_micros", ld(&c.paused_micros)),
            ("consolidate.paused_max_micros", ld(&c.paused_max_micros)),
            ("free_slots", self.free.lock().len() as f64),
            ("free_upper_lists", self.rooms.lock().free_lists() as f64),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    /// Runs `f` on the index's thread pool (or rayon's global one).
    pub fn install<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        match &self.pool {
            Some(p) => p.install(f),
            None => f(),
        }
    }

    #[inline]
    pub(crate) fn label_lock(&self, label: u64) -> parking_lot::MutexGuard<'_, ()> {
        let h = label.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 52;
        self.label_locks[h as usize % LABEL_STRIPES].lock()
    }

    pub(crate) fn stripe(slot: u32) -> usize {
        slot as usize % LOCK_STRIPES
    }

    /// The sequence number node `slot` counts as written with: an upsert of
    /// its label numbered at most this, or a delete numbered below it, is
    /// skipped as a replay.
    ///
    /// A node written since this open carries the number of its write. A
    /// node written before it counts only up to the durable watermark of
    /// the open: a number above the watermark belongs to an operation that
    /// was in flight at a crash, or that finished while a lower number was
    /// still in flight, and the watermark is all the index promises about
    /// such numbers. A caller replays from `durable_seq()` (a database log)
    /// or numbers its new operations from it (a client without a log, such
    /// as `vectide.Index`): either way its next numbers may repeat those
    /// above the watermark, and they must not be taken for replays. A log
    /// replay applies every record after the watermark in order, so
    /// applying one again whose effect survived is harmless.
    ///
    /// The slots below `opened_slot` hold the nodes written before the
    /// open, except those an insert reused since (`reused`), which carry
    /// the number of their new write.
    pub(crate) fn recorded_seq(&self, slot: u32) -> Seq {
        let seq = self.graph.seq(slot);
        if slot < self.opened_slot && !self.reused.lock().contains(&slot) {
            seq.min(self.opened_durable)
        } else {
            seq
        }
    }

    /// Slots allocated so far.
    pub(crate) fn next_slot(&self) -> usize {
        self.meta.u64_at(M_NEXT_SLOT).load(Ordering::Acquire) as usize
    }

    pub(crate) fn entry(&self) -> Option<(u32, usize)> {
        unpack_entry(self.meta.u64_at(M_ENTRY).load(Ordering::Acquire))
    }
}

pub(crate) fn write_page(r: &Region, page: &[u8]) {
    // SAFETY: called on regions just created, before any other user.
    unsafe { r.bytes_mut(0, page.len()) }.copy_from_slice(page);
    r.persist(SITE_INIT, 0, page.len());
}
