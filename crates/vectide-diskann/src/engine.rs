//! The `fresh-diskann` engine (FreshDiskANN §5.1–5.4, §5.6): state, the
//! write path (redo log, RW-TempIndex, DeleteList), search over every part,
//! freezing, and the merge with its atomic switch.
//!
//! ## State
//! - the **LTI** (`lti-G.bin`, PQ codes in RAM), or none before the first
//!   merge;
//! - **temp indexes**: `fresh-vamana` graphs in RAM, the last one the
//!   RW-TempIndex that takes inserts, the others RO-TempIndexes (frozen,
//!   snapshot in `temp-S.fv`);
//! - the **location map** `id → (LTI node | temp serial, seq)` of every
//!   live point: the one truth of what is live. A copy of a point anywhere
//!   else (an LTI node replaced by an upsert, a frozen temp's point deleted
//!   since) is filtered out of every search, and listed for the next merge:
//!   LTI nodes in the **DeleteList**, temp points in `ro_dead`.
//!
//! ## Writes
//! One writer at a time (a mutex): the call is validated, written to the
//! redo log and fsynced (the call is durable when it returns), applied to
//! the RW-TempIndex and the location map. Past `temp_points` the RW index
//! freezes: its snapshot is saved, a new redo log starts, the manifest
//! names both. Past `merge_points` changes a background StreamingMerge
//! starts; searches, inserts and deletes go on beside it.
//!
//! ## The merge switch
//! After the new LTI is written, under the writer mutex and the state lock:
//! the merged points move to their LTI nodes (a point deleted or replaced
//! during the merge leaves its new node in the DeleteList), the manifest
//! naming the new generation is renamed into place, and the codes array is
//! patched in place. Until that rename, a crash or an error leaves the old
//! LTI in force.

use crate::layout::NO_LABEL;
use crate::lti::{self, GraphSource, Lti, Scratch};
use crate::manifest::{self, Manifest};
use crate::merge::{streaming_merge, Inserts, MergeParams, MergeStats, Phase};
use crate::params::FreshDiskannParams;
use parking_lot::{Mutex, RwLock};
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use vectide_core::sync::SyncSite;
use vectide_core::validate::{check_batch, prepare_query};
use vectide_core::{
    Error, Filter, IndexStats, Metric, Neighbor, Params, Result, SearchParams, Seq, VectorIndex,
};
use vectide_storage::block::DirectFile;
use vectide_storage::durable::{select_rows, RedoLog};
use vectide_vamana::{FreshVamana, VamanaParams, START_LABEL};

/// Sync site of the LTI files a merge writes.
pub const LTI_SYNC: SyncSite = SyncSite("fresh-diskann.lti");

/// Searches each Insert-phase thread of a merge runs at once in
/// lock-step ([`MergeParams::in_flight`]); the phase has a thread per core
/// and one more, so that a thread waiting on its round's reads leaves its
/// core to another. On GloVe 390K (`examples/merge_loop.rs`, 5 % changed,
/// 2 cores, AVX2; four runs of each, interleaved) 3 threads × 8 searches
/// merged in 17.3 s on average against 20.1 s for 8 threads × 1 (the
/// kernel's CPU time fell from 7-8 s to 3.5-4 s), and 17.05 s / 19.2 s
/// with the visited-slot prefetch. 4 × 4, 2 × 8 and 3 × 4 were no better
/// than 3 × 8. More searches in flight cost user time: each holds a
/// 32 KiB PQ table and a visited set of about 64 KiB, and 8 of them
/// outgrow the L1 and L2 caches.
const MERGE_IN_FLIGHT: usize = 8;

/// Where a live point is: an LTI node, or the temp index of a serial
/// (serials stay below 2^32: eight bytes a place, 24 a map entry).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Place {
    Lti(u32),
    Temp(u32),
}

impl Place {
    pub(crate) fn temp(serial: u64) -> Place {
        Place::Temp(serial as u32)
    }
}

/// The largest temp-index serial.
pub(crate) const MAX_SERIAL: u64 = u32::MAX as u64;

/// A live point's place and the sequence number of the operation that put
/// it there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Loc {
    pub place: Place,
    pub seq: u64,
}

/// A temp index and its serial.
pub(crate) struct Temp {
    pub serial: u64,
    pub index: FreshVamana,
}

pub(crate) struct LtiGen {
    pub gen: u64,
    pub lti: Lti,
}

#[derive(Default)]
pub(crate) struct State {
    pub lti: Option<Arc<LtiGen>>,
    /// Oldest first; the last is the RW-TempIndex.
    pub temps: Vec<Arc<Temp>>,
    pub loc: HashMap<u64, Loc>,
    /// The DeleteList: LTI nodes whose point is gone.
    pub lti_dead: Vec<u32>,
    /// Points of RO-TempIndexes that are gone: `(serial, id)`.
    pub ro_dead: Vec<(u64, u64)>,
}

impl State {
    fn rw(&self) -> &Arc<Temp> {
        self.temps.last().expect("there is always an RW-TempIndex")
    }

    /// Records that `old` no longer holds `id`; returns whether the copy is
    /// in the RW index (which the caller deletes there).
    fn displace(&mut self, id: u64, old: Loc, rw: u64) -> bool {
        match old.place {
            Place::Lti(n) => self.lti_dead.push(n),
            Place::Temp(s) if u64::from(s) != rw => self.ro_dead.push((u64::from(s), id)),
            Place::Temp(_) => return true,
        }
        false
    }

    fn temp_points(&self) -> usize {
        self.temps.iter().map(|t| t.index.len()).sum()
    }
}

/// The writer's side: the redo log in use (none when the database's
/// commit log is the only log) and the manifest in force.
pub(crate) struct Writer {
    pub log: Option<RedoLog>,
    pub manifest: Manifest,
}

/// Merge progress, read by `stats`.
#[derive(Default)]
pub(crate) struct MergeStatus {
    running: AtomicBool,
    /// 0 idle, 1 delete, 2 insert, 3 patch, 4 switch.
    phase: AtomicU8,
    done: AtomicU64,
    total: AtomicU64,
    merges: AtomicU64,
    failures: AtomicU64,
    last: Mutex<Option<MergeStats>>,
    last_error: Mutex<Option<String>>,
}

#[derive(Default)]
pub(crate) struct IoCounters {
    queries: AtomicU64,
    sectors: AtomicU64,
    hops: AtomicU64,
    cache_hits: AtomicU64,
}

pub(crate) struct Inner {
    pub dir: PathBuf,
    pub dim: usize,
    pub metric: Metric,
    pub params: FreshDiskannParams,
    pub threads: usize,
    pub state: RwLock<State>,
    pub writer: Mutex<Writer>,
    /// The newest sequence number applied (with `log=own`, logged and
    /// synced first: durable).
    pub durable: AtomicU64,
    /// The newest sequence number the manifest covers (`covered_seq` of
    /// the last freeze): with `log=database`, the durability watermark.
    pub covered: AtomicU64,
    merge_lock: Mutex<()>,
    background: Mutex<Option<JoinHandle<()>>>,
    status: MergeStatus,
    scratches: Mutex<Vec<Scratch>>,
    io: IoCounters,
    pool: rayon::ThreadPool,
}

/// A FreshDiskANN index in a directory (see the module docs).
pub struct FreshDiskann {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for FreshDiskann {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FreshDiskann")
            .field("dir", &self.inner.dir)
            .field("dim", &self.inner.dim)
            .field("len", &self.len())
            .finish()
    }
}

impl Drop for FreshDiskann {
    fn drop(&mut self) {
        self.inner.join_background();
    }
}

impl Inner {
    pub(crate) fn new(
        dir: &Path,
        dim: usize,
        metric: Metric,
        params: FreshDiskannParams,
        state: State,
        writer: Writer,
        durable: u64,
    ) -> Result<Self> {
        let threads = params
            .graph
            .threads
            .unwrap_or_else(rayon::current_num_threads);
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("vectide-fdann-{i}"))
            .build()
            .map_err(|e| Error::invalid(format!("thread pool: {e}")))?;
        Ok(Inner {
            dir: dir.to_path_buf(),
            dim,
            metric,
            params,
            threads,
            state: RwLock::new(state),
            writer: Mutex::new(writer),
            durable: AtomicU64::new(durable),
            covered: AtomicU64::new(durable),
            merge_lock: Mutex::new(()),
            background: Mutex::new(None),
            status: MergeStatus::default(),
            scratches: Mutex::new(Vec::new()),
            io: IoCounters::default(),
            pool,
        })
    }

    /// The graph parameters of a temp index.
    pub(crate) fn temp_params(params: &FreshDiskannParams, threads: usize) -> VamanaParams {
        VamanaParams {
            threads: Some(threads),
            ..params.graph.clone()
        }
    }

    pub(crate) fn new_temp(&self, serial: u64) -> Result<Arc<Temp>> {
        Ok(Arc::new(Temp {
            serial,
            index: FreshVamana::new(
                self.dim,
                self.metric,
                Self::temp_params(&self.params, self.threads),
            )?,
        }))
    }

    fn alpha(&self) -> f32 {
        if self.metric == Metric::Ip {
            1.0
        } else {
            self.params.graph.alpha
        }
    }

    // ----- writes -----

    /// Applies an insert (after logging, or in replay): rows whose id holds a
    /// newer or equal sequence number are skipped.
    pub(crate) fn apply_insert(
        &self,
        seq: u64,
        ids: &[u64],
        vectors: &[f32],
        progress: Option<vectide_core::Progress<'_>>,
    ) -> Result<()> {
        let rw = self.state.read().rw().clone();
        rw.index.insert_with_progress(seq, ids, vectors, progress)?;
        let mut st = self.state.write();
        for &id in ids {
            let new = Loc {
                place: Place::temp(rw.serial),
                seq,
            };
            if let Some(old) = st.loc.insert(id, new) {
                st.displace(id, old, rw.serial);
            }
        }
        Ok(())
    }

    /// Applies a delete; returns how many points went.
    pub(crate) fn apply_delete(&self, seq: u64, ids: &[u64]) -> Result<usize> {
        let mut in_rw = Vec::new();
        let mut removed = 0;
        let rw = {
            let mut st = self.state.write();
            let rw = st.rw().clone();
            for &id in ids {
                let Some(&old) = st.loc.get(&id) else {
                    continue;
                };
                if old.seq > seq {
                    continue;
                }
                st.loc.remove(&id);
                removed += 1;
                if st.displace(id, old, rw.serial) {
                    in_rw.push(id);
                }
            }
            rw
        };
        if !in_rw.is_empty() {
            rw.index.delete(seq, &in_rw)?;
        }
        Ok(removed)
    }

    /// The rows of a batch that are newer than what their ids hold.
    fn newer_rows(&self, seq: u64, ids: &[u64]) -> Vec<usize> {
        let st = self.state.read();
        ids.iter()
            .enumerate()
            .filter(|(_, id)| st.loc.get(id).is_none_or(|l| seq > l.seq))
            .map(|(i, _)| i)
            .collect()
    }

    pub(crate) fn insert(
        self: &Arc<Self>,
        seq: Seq,
        ids: &[u64],
        vectors: &[f32],
        progress: Option<vectide_core::Progress<'_>>,
    ) -> Result<()> {
        check_batch(self.dim, self.metric, ids, vectors)?;
        let mut w = self.writer.lock();
        let rows = self.newer_rows(seq, ids);
        let (ids, vectors) = select_rows(self.dim, ids, vectors, &rows);
        if let Some(log) = &mut w.log {
            log.log_insert(seq, &ids, &vectors)?;
        }
        if !ids.is_empty() {
            self.apply_insert(seq, &ids, &vectors, progress)?;
        }
        self.durable.fetch_max(seq, Ordering::AcqRel);
        if self.after_write(&mut w)? {
            drop(w);
            self.merge()?;
        }
        Ok(())
    }

    pub(crate) fn delete(self: &Arc<Self>, seq: Seq, ids: &[u64]) -> Result<usize> {
        let mut w = self.writer.lock();
        let targets: Vec<u64> = {
            let st = self.state.read();
            let mut seen = HashSet::new();
            ids.iter()
                .copied()
                .filter(|id| st.loc.get(id).is_some_and(|l| l.seq <= seq) && seen.insert(*id))
                .collect()
        };
        if let Some(log) = &mut w.log {
            log.log_delete(seq, &targets)?;
        }
        let n = self.apply_delete(seq, &targets)?;
        self.durable.fetch_max(seq, Ordering::AcqRel);
        if self.after_write(&mut w)? {
            drop(w);
            self.merge()?;
        }
        Ok(n)
    }

    /// Freezes a full RW index and starts a merge that is due; returns
    /// whether the caller runs one inline (after releasing the writer).
    fn after_write(self: &Arc<Self>, w: &mut Writer) -> Result<bool> {
        let (rw_len, changes, can_build) = {
            let st = self.state.read();
            (
                st.rw().index.len(),
                st.temp_points() + st.lti_dead.len(),
                // The first LTI needs a point per PQ centroid.
                st.lti.is_some() || st.loc.len() >= vectide_quant::KSUB,
            )
        };
        if rw_len >= self.params.temp_points {
            self.freeze(w)?;
        }
        if changes >= self.params.merge_points
            && can_build
            && !self.status.running.load(Ordering::Acquire)
        {
            if self.params.merge_inline {
                return Ok(true);
            }
            self.start_background();
        }
        Ok(false)
    }

    /// The current manifest covering `covered`, with the dead lists as
    /// they stand now.
    fn manifest_now(&self, w: &Writer, covered: Seq) -> Manifest {
        let mut m = w.manifest.clone();
        m.covered_seq = covered;
        let st = self.state.read();
        m.lti_dead = st.lti_dead.clone();
        m.ro_dead = st.ro_dead.clone();
        m
    }

    /// Freezes the RW-TempIndex: snapshot, a new redo log, the manifest
    /// naming both, then the old log removed. With `log=database` and an
    /// empty RW index, only the manifest is rewritten (so that it covers
    /// the deletes since the last freeze).
    pub(crate) fn freeze(&self, w: &mut Writer) -> Result<()> {
        let rw = self.state.read().rw().clone();
        if rw.index.is_empty() && self.params.external_log {
            let applied = self.durable.load(Ordering::Acquire);
            if applied > w.manifest.covered_seq {
                let m = self.manifest_now(w, applied);
                m.write(&self.dir)?;
                w.manifest = m;
                self.covered.fetch_max(applied, Ordering::AcqRel);
            }
            return Ok(());
        }
        if rw.index.is_empty() && w.log.as_ref().is_none_or(|l| l.wal().is_empty()) {
            return Ok(());
        }
        let next = rw.serial + 1;
        if next > MAX_SERIAL {
            return Err(Error::invalid(
                "fresh-diskann: 2^32 - 1 temp indexes frozen; no serial is left",
            ));
        }
        rw.index.save(&manifest::temp_file(&self.dir, rw.serial))?;
        // Under the database, its commit log holds the writes: no log of
        // our own is started (nor synced into existence).
        let log = match self.params.external_log {
            true => None,
            false => {
                let (log, stale) = RedoLog::open(&manifest::log_file(&self.dir, next), self.dim)?;
                if !stale.ops.is_empty() || stale.torn {
                    return Err(Error::corrupted(format!(
                        "{} holds records of a log the manifest does not name",
                        manifest::log_file(&self.dir, next).display()
                    )));
                }
                Some(log)
            }
        };
        let mut m = self.manifest_now(w, self.durable.load(Ordering::Acquire));
        m.ro.push(rw.serial);
        m.rw = next;
        m.write(&self.dir)?;
        let covered = m.covered_seq;
        let temp = self.new_temp(next)?;
        self.state.write().temps.push(temp);
        w.manifest = m;
        self.covered.fetch_max(covered, Ordering::AcqRel);
        w.log = log;
        let _ = std::fs::remove_file(manifest::log_file(&self.dir, rw.serial));
        Ok(())
    }

    // ----- merge -----

    fn start_background(self: &Arc<Self>) {
        let mut bg = self.background.lock();
        if self.status.running.swap(true, Ordering::AcqRel) {
            return;
        }
        if let Some(h) = bg.take() {
            let _ = h.join();
        }
        let me = Arc::clone(self);
        *bg = Some(std::thread::spawn(move || {
            let r = me.merge();
            if let Err(e) = r {
                me.status.failures.fetch_add(1, Ordering::Relaxed);
                *me.status.last_error.lock() = Some(e.to_string());
            }
            me.status.running.store(false, Ordering::Release);
        }));
    }

    pub(crate) fn join_background(&self) {
        let h = self.background.lock().take();
        if let Some(h) = h {
            let _ = h.join();
        }
    }

    /// Runs StreamingMerge now (module docs). Returns whether it merged.
    pub(crate) fn merge(self: &Arc<Self>) -> Result<bool> {
        let _one = self.merge_lock.lock();
        let r = self.merge_locked();
        self.status.phase.store(0, Ordering::Release);
        let ok = r?;
        Ok(ok)
    }

    fn merge_locked(self: &Arc<Self>) -> Result<bool> {
        // Freeze, then take the change set.
        let (old, dead, ros, covered, gen) = {
            let mut w = self.writer.lock();
            self.freeze(&mut w)?;
            let st = self.state.read();
            let mut dead = st.lti_dead.clone();
            dead.sort_unstable();
            dead.dedup();
            let ros: Vec<Arc<Temp>> = st.temps[..st.temps.len() - 1].to_vec();
            (
                st.lti.clone(),
                dead,
                ros,
                w.manifest.covered_seq,
                w.manifest.lti_gen + 1,
            )
        };
        if ros.is_empty() && dead.is_empty() {
            return Ok(false);
        }
        let ch = self.change_set(&ros);
        if old.is_none() && ch.labels.len() < vectide_quant::KSUB {
            // Too few points to train PQ: they stay in the temp indexes.
            return Ok(false);
        }
        let lti_path = manifest::lti_file(&self.dir, gen);
        let pq_path = manifest::pq_file(&self.dir, gen);
        let mid_path = manifest::mid_file(&self.dir, gen);
        let cleanup = || {
            for p in [&lti_path, &pq_path, &mid_path] {
                let _ = std::fs::remove_file(p);
            }
        };
        // The first LTI from one temp index whose points are all live is that
        // index's graph as it is; otherwise a static build of the points.
        let reuse = match (&old, ros.as_slice()) {
            (None, [one]) if one.index.len() == ch.labels.len() => Some(&one.index),
            _ => None,
        };
        let built = self
            .pool
            .install(|| self.build_new(old.as_deref(), reuse, &dead, &ch, gen, covered));
        let _ = std::fs::remove_file(&mid_path);
        let (slots, outcome) = match built {
            Ok(x) => x,
            Err(e) => {
                cleanup();
                return Err(e);
            }
        };
        self.status.phase.store(4, Ordering::Release);
        let r = self.switch(old, &dead, &ros, &ch, &slots, outcome.as_ref(), gen);
        if r.is_err() {
            cleanup();
        }
        r?;
        self.status.merges.fetch_add(1, Ordering::Relaxed);
        if let Some(o) = outcome {
            *self.status.last.lock() = Some(o.stats);
        }
        Ok(true)
    }

    /// The live points of the frozen temp indexes, with their links.
    fn change_set(&self, ros: &[Arc<Temp>]) -> ChangeSet {
        let exports: Vec<_> = ros
            .iter()
            .map(|t| (t.serial, t.index.export_graph()))
            .collect();
        let st = self.state.read();
        let mut ch = ChangeSet::default();
        for (serial, g) in &exports {
            let mut num = vec![u32::MAX; g.len()];
            let keep: Vec<usize> = (0..g.len())
                .filter(|&i| {
                    let l = g.labels[i];
                    l != START_LABEL
                        && st
                            .loc
                            .get(&l)
                            .is_some_and(|x| x.place == Place::temp(*serial))
                })
                .collect();
            let base = ch.labels.len() as u32;
            for (k, &i) in keep.iter().enumerate() {
                num[i] = base + k as u32;
            }
            for &i in &keep {
                ch.labels.push(g.labels[i]);
                ch.origin.push(*serial);
                ch.vectors.extend_from_slice(g.vector(i));
                ch.links.push(
                    g.lists[i]
                        .iter()
                        .map(|&n| num[n as usize])
                        .filter(|&n| n != u32::MAX)
                        .collect(),
                );
            }
        }
        ch
    }

    /// Writes generation `gen`: StreamingMerge over the old LTI, or the
    /// first LTI built from the change set. Returns each point's node.
    fn build_new(
        &self,
        old: Option<&LtiGen>,
        reuse: Option<&FreshVamana>,
        dead: &[u32],
        ch: &ChangeSet,
        gen: u64,
        covered: u64,
    ) -> Result<(Vec<u32>, Option<crate::merge::MergeOutcome>)> {
        let out = DirectFile::open(&manifest::lti_file(&self.dir, gen), true, LTI_SYNC)?;
        let pq_path = manifest::pq_file(&self.dir, gen);
        match old {
            Some(old) => {
                let mid = DirectFile::open(&manifest::mid_file(&self.dir, gen), true, LTI_SYNC)?;
                let status = &self.status;
                let progress = |ph: Phase, done: u64, total: u64| {
                    let code = match ph {
                        Phase::Delete => 1,
                        Phase::Insert => 2,
                        Phase::Patch => 3,
                    };
                    status.phase.store(code, Ordering::Release);
                    status.done.store(done, Ordering::Release);
                    status.total.store(total, Ordering::Release);
                };
                let p = MergeParams {
                    r: self.params.graph.r,
                    l: self.params.merge_l,
                    alpha: self.alpha(),
                    w: self.params.beam_width,
                    io_threads: self.threads + 1,
                    refill: self.params.merge_refill,
                    in_flight: MERGE_IN_FLIGHT,
                };
                let o = streaming_merge(
                    &old.lti,
                    dead,
                    Inserts {
                        labels: &ch.labels,
                        vectors: &ch.vectors,
                        links: &ch.links,
                    },
                    &p,
                    Box::new(mid),
                    &out,
                    &pq_path,
                    covered,
                    Some(&progress),
                )?;
                Ok((o.slots.clone(), Some(o)))
            }
            None => {
                self.status.phase.store(2, Ordering::Release);
                let g = match reuse {
                    Some(v) => {
                        // Repair around the deletes it still holds first.
                        v.maintain()?;
                        v.export_graph()
                    }
                    None => {
                        let v = FreshVamana::new(
                            self.dim,
                            self.metric,
                            Self::temp_params(&self.params, self.threads),
                        )?;
                        v.insert(covered.max(1), &ch.labels, &ch.vectors)?;
                        v.export_graph()
                    }
                };
                self.status.phase.store(3, Ordering::Release);
                let written = lti::write(
                    &out,
                    &pq_path,
                    &GraphSource {
                        durable_seq: covered,
                        ..GraphSource::from_export(&g)
                    },
                    self.params.pq_bytes,
                    self.params.graph.seed,
                )?;
                // Records are laid out by sector_order: node numbers are
                // not the export's indexes.
                let node: HashMap<u64, u32> = g
                    .labels
                    .iter()
                    .zip(&written.node_of)
                    .map(|(&l, &n)| (l, n))
                    .collect();
                Ok((ch.labels.iter().map(|l| node[l]).collect(), None))
            }
        }
    }

    /// The atomic switch to generation `gen` (module docs).
    #[allow(clippy::too_many_arguments)]
    fn switch(
        &self,
        old: Option<Arc<LtiGen>>,
        dead: &[u32],
        ros: &[Arc<Temp>],
        ch: &ChangeSet,
        slots: &[u32],
        outcome: Option<&crate::merge::MergeOutcome>,
        gen: u64,
    ) -> Result<()> {
        let file = DirectFile::open(&manifest::lti_file(&self.dir, gen), false, LTI_SYNC)?;
        let header = Lti::read_header(&file)?;
        let pq = old.as_ref().map(|g| g.lti.pq().clone());
        drop(old);
        let merged: HashSet<u64> = ros.iter().map(|t| t.serial).collect();
        let dead_set: HashSet<u32> = dead.iter().copied().collect();
        let mut w = self.writer.lock();
        let mut st = self.state.write();
        let mut moves = Vec::with_capacity(slots.len());
        let mut lti_dead: Vec<u32> = st
            .lti_dead
            .iter()
            .copied()
            .filter(|n| !dead_set.contains(n))
            .collect();
        for (j, &slot) in slots.iter().enumerate() {
            let id = ch.labels[j];
            match st.loc.get(&id) {
                Some(l) if l.place == Place::temp(ch.origin[j]) => moves.push((id, slot, l.seq)),
                _ => lti_dead.push(slot),
            }
        }
        let ro_dead: Vec<(u64, u64)> = st
            .ro_dead
            .iter()
            .copied()
            .filter(|(s, _)| !merged.contains(s))
            .collect();
        let mut m = w.manifest.clone();
        m.lti_gen = gen;
        m.ro.retain(|s| !merged.contains(s));
        m.lti_dead = lti_dead.clone();
        m.ro_dead = ro_dead.clone();
        let lti = match (pq, outcome) {
            (Some(pq), Some(o)) => {
                // Patch the codes in place: no search holds the old LTI
                // while the state is locked, so its codes are ours.
                m.write(&self.dir)?;
                let mut codes = match st.lti.take().map(Arc::try_unwrap) {
                    Some(Ok(g)) => {
                        Arc::try_unwrap(g.lti.into_codes()).unwrap_or_else(|a| (*a).clone())
                    }
                    Some(Err(a)) => a.lti.codes().as_ref().clone(),
                    None => Vec::new(),
                };
                o.apply_codes(&mut codes);
                Lti::from_parts(Box::new(file), header, pq, Arc::new(codes))
            }
            _ => {
                let lti = Lti::open(Box::new(file), &manifest::pq_file(&self.dir, gen))?;
                m.write(&self.dir)?;
                st.lti = None;
                Ok(lti)
            }
        };
        let lti = match lti {
            Ok(l) => l,
            Err(e) => {
                // The manifest names the new LTI but it cannot be used here:
                // reopening the directory recovers it.
                return Err(Error::corrupted(format!(
                    "merge switch: the new LTI could not be opened ({e}); reopen the index"
                )));
            }
        };
        for (id, slot, seq) in moves {
            st.loc.insert(
                id,
                Loc {
                    place: Place::Lti(slot),
                    seq,
                },
            );
        }
        st.lti_dead = lti_dead;
        st.ro_dead = ro_dead;
        st.temps.retain(|t| !merged.contains(&t.serial));
        st.lti = Some(Arc::new(LtiGen { gen, lti }));
        w.manifest = m;
        drop(st);
        drop(w);
        if gen > 1 {
            let _ = std::fs::remove_file(manifest::lti_file(&self.dir, gen - 1));
            let _ = std::fs::remove_file(manifest::pq_file(&self.dir, gen - 1));
        }
        for s in merged {
            let _ = std::fs::remove_file(manifest::temp_file(&self.dir, s));
        }
        Ok(())
    }

    // ----- reads -----

    fn search_into(
        &self,
        query: &[f32],
        k: usize,
        params: &SearchParams,
        filter: Option<Filter<'_>>,
        out: &mut Vec<Neighbor>,
    ) -> Result<()> {
        out.clear();
        let mut buf = Vec::new();
        let q = prepare_query(self.dim, self.metric, query, &mut buf)?;
        if k == 0 {
            return Ok(());
        }
        let l = params.ef.unwrap_or(self.params.graph.l_search).max(k);
        let w = params.beam_width.unwrap_or(self.params.beam_width);
        let st = self.state.read();
        if let Some(g) = &st.lti {
            let mut scratch = self.scratches.lock().pop().unwrap_or_default();
            let mut found = Vec::new();
            let admit = |node: u32, label: u64| {
                st.loc
                    .get(&label)
                    .is_some_and(|x| x.place == Place::Lti(node))
                    && filter.is_none_or(|f| f(label))
            };
            let r = g.lti.search(q, k, l, w, &admit, &mut scratch, &mut found);
            self.scratches.lock().push(scratch);
            let qs = r?;
            self.io.queries.fetch_add(1, Ordering::Relaxed);
            self.io
                .sectors
                .fetch_add(qs.sectors_read, Ordering::Relaxed);
            self.io.hops.fetch_add(qs.hops, Ordering::Relaxed);
            self.io
                .cache_hits
                .fetch_add(qs.cache_hits, Ordering::Relaxed);
            out.extend(found.iter().map(|&(d, id)| Neighbor::new(id, d)));
        }
        let tp = SearchParams::with_ef(l);
        let mut part = Vec::new();
        for t in &st.temps {
            if t.index.is_empty() {
                continue;
            }
            let serial = t.serial;
            let admit = |id: u64| {
                st.loc
                    .get(&id)
                    .is_some_and(|x| x.place == Place::temp(serial))
                    && filter.is_none_or(|f| f(id))
            };
            t.index.search_into(q, k, &tp, Some(&admit), &mut part)?;
            out.extend_from_slice(&part);
        }
        out.sort_by(|a, b| a.distance.total_cmp(&b.distance).then(a.id.cmp(&b.id)));
        out.truncate(k);
        Ok(())
    }

    fn get(&self, id: u64) -> Result<Option<Vec<f32>>> {
        let st = self.state.read();
        let Some(l) = st.loc.get(&id).copied() else {
            return Ok(None);
        };
        match l.place {
            Place::Temp(s) => match st.temps.iter().find(|t| t.serial == u64::from(s)) {
                Some(t) => t.index.get(id),
                None => Err(Error::corrupted(format!(
                    "point {id} names a missing temp index"
                ))),
            },
            Place::Lti(n) => {
                let g = st
                    .lti
                    .as_ref()
                    .ok_or_else(|| Error::corrupted(format!("point {id} names a missing LTI")))?;
                let mut v = vec![0.0; self.dim];
                let mut scratch = Scratch::default();
                g.lti
                    .read_records(&[n], &mut scratch, |_, node| node.vector_into(&mut v))?;
                Ok(Some(v))
            }
        }
    }

    fn stats(&self) -> IndexStats {
        let st = self.state.read();
        let temp_points = st.temp_points();
        let (lti_nodes, lti_mem, lti_reads) = st.lti.as_ref().map_or((0, 0, 0), |g| {
            (
                g.lti.header().nodes,
                g.lti.memory_bytes(),
                g.lti.file().stats().blocks_read,
            )
        });
        let temp_mem: usize = st
            .temps
            .iter()
            .map(|t| t.index.stats().map_or(0, |s| s.memory_bytes))
            .sum();
        let loc_mem = st.loc.capacity() * (std::mem::size_of::<(u64, Loc)>() + 1);
        let disk: u64 = std::fs::read_dir(&self.dir)
            .map(|rd| {
                rd.filter_map(|e| e.ok()?.metadata().ok())
                    .map(|m| m.len())
                    .sum()
            })
            .unwrap_or(0);
        let q = self.io.queries.load(Ordering::Relaxed).max(1) as f64;
        let s = &self.status;
        let mut extra = vec![
            ("lti_nodes".to_string(), lti_nodes as f64),
            (
                "lti_points".into(),
                st.loc
                    .values()
                    .filter(|l| matches!(l.place, Place::Lti(_)))
                    .count() as f64,
            ),
            ("lti_dead".into(), st.lti_dead.len() as f64),
            ("lti_ram_bytes".into(), (lti_mem + loc_mem) as f64),
            ("temp_indexes".into(), st.temps.len() as f64),
            ("temp_points".into(), temp_points as f64),
            ("ro_dead".into(), st.ro_dead.len() as f64),
            ("merges".into(), s.merges.load(Ordering::Relaxed) as f64),
            (
                "merge_failures".into(),
                s.failures.load(Ordering::Relaxed) as f64,
            ),
            (
                "merge_running".into(),
                f64::from(u8::from(s.running.load(Ordering::Relaxed))),
            ),
            (
                "merge_phase".into(),
                f64::from(s.phase.load(Ordering::Relaxed)),
            ),
            ("merge_done".into(), s.done.load(Ordering::Relaxed) as f64),
            ("merge_total".into(), s.total.load(Ordering::Relaxed) as f64),
            (
                "disk_queries".into(),
                self.io.queries.load(Ordering::Relaxed) as f64,
            ),
            (
                "sectors_per_query".into(),
                self.io.sectors.load(Ordering::Relaxed) as f64 / q,
            ),
            (
                "hops_per_query".into(),
                self.io.hops.load(Ordering::Relaxed) as f64 / q,
            ),
            (
                "cache_hits".into(),
                self.io.cache_hits.load(Ordering::Relaxed) as f64,
            ),
            (
                "lti_generation".into(),
                st.lti.as_ref().map_or(0, |g| g.gen) as f64,
            ),
        ];
        if let Some(m) = s.last.lock().as_ref() {
            extra.push(("last_merge_delete_secs".into(), m.delete_secs));
            extra.push(("last_merge_insert_secs".into(), m.insert_secs));
            extra.push(("last_merge_patch_secs".into(), m.patch_secs));
            extra.push(("last_merge_sectors_read".into(), m.sectors_read as f64));
            extra.push((
                "last_merge_insert_cache_hits".into(),
                m.insert_cache_hits as f64,
            ));
            extra.push((
                "last_merge_insert_expanded".into(),
                m.insert_searches.expanded as f64,
            ));
            extra.push((
                "last_merge_insert_pq_distances".into(),
                m.insert_searches.pq_distances as f64,
            ));
            extra.push(("last_merge_orphans_linked".into(), m.orphans_linked as f64));
            extra.push(("last_merge_orphans_left".into(), m.orphans_left as f64));
        }
        IndexStats {
            live: st.loc.len(),
            slots_used: lti_nodes as usize + temp_points,
            capacity: lti_nodes as usize + temp_points,
            pending_deletes: st.lti_dead.len() + st.ro_dead.len(),
            memory_bytes: lti_mem + loc_mem + temp_mem,
            disk_bytes: disk,
            reads: lti_reads,
            bytes_read: lti_reads * 4096,
            round_trips: 0,
            pending_background: usize::from(s.running.load(Ordering::Relaxed)),
            consolidations: s.merges.load(Ordering::Relaxed),
            extra,
        }
    }

    /// Checks the location map against the parts.
    fn check(&self) -> Result<Vec<String>> {
        let st = self.state.read();
        let mut v = Vec::new();
        let serials: HashMap<u64, &Arc<Temp>> = st.temps.iter().map(|t| (t.serial, t)).collect();
        let nodes = st.lti.as_ref().map_or(0, |g| g.lti.header().nodes);
        let mut bad_temp = 0;
        let mut bad_node = 0;
        for (&id, l) in &st.loc {
            match l.place {
                Place::Temp(s) => match serials.get(&u64::from(s)) {
                    Some(t) if t.index.contains(id)? => {}
                    _ => bad_temp += 1,
                },
                Place::Lti(n) if (n as u64) < nodes => {}
                Place::Lti(_) => bad_node += 1,
            }
        }
        if bad_temp > 0 {
            v.push(format!(
                "{bad_temp} points placed in a temp index that lacks them"
            ));
        }
        if bad_node > 0 {
            v.push(format!("{bad_node} points placed past the LTI"));
        }
        if st.lti_dead.iter().any(|&n| n as u64 >= nodes) {
            v.push("the DeleteList names nodes past the LTI".into());
        }
        if let Some(g) = &st.lti {
            // Every live LTI point must be reachable from the start node
            // (deleted nodes still route). Reads the whole LTI: a checker.
            let n = nodes as usize;
            let mut lists: Vec<Vec<u32>> = vec![Vec::new(); n];
            g.lti.scan(|i, node| {
                lists[i as usize] = node.neighbor_ids().collect();
                Ok(())
            })?;
            let live: Vec<u32> = st
                .loc
                .values()
                .filter_map(|l| match l.place {
                    Place::Lti(node) => Some(node),
                    Place::Temp(_) => None,
                })
                .collect();
            let lost = unreachable(&lists, g.lti.header().start as u32, &live);
            if !lost.is_empty() {
                v.push(format!(
                    "{} live LTI points unreachable from the start node (nodes {:?}…)",
                    lost.len(),
                    &lost[..lost.len().min(8)]
                ));
            }
        }
        for t in &st.temps {
            for e in t.index.check_structure()? {
                v.push(format!("temp index {}: {e}", t.serial));
            }
        }
        Ok(v)
    }
}

/// The points a merge folds in: per point its label, origin temp, vector
/// and links (indices of other points).
#[derive(Default)]
pub(crate) struct ChangeSet {
    labels: Vec<u64>,
    origin: Vec<u64>,
    vectors: Vec<f32>,
    links: Vec<Vec<u32>>,
}

impl FreshDiskann {
    /// The index directory.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    pub fn params(&self) -> &FreshDiskannParams {
        &self.inner.params
    }

    /// Runs a merge now (waiting for a background one first); returns
    /// whether anything was merged.
    pub fn merge_now(&self) -> Result<bool> {
        self.inner.join_background();
        self.inner.merge()
    }

    /// Freezes the RW-TempIndex now.
    pub fn freeze(&self) -> Result<()> {
        let mut w = self.inner.writer.lock();
        self.inner.freeze(&mut w)
    }

    /// Statistics of the last merge.
    pub fn last_merge(&self) -> Option<MergeStats> {
        self.inner.status.last.lock().clone()
    }

    /// The LTI in force, if any, for tools (`read`: a closure over it).
    pub fn with_lti<R>(&self, f: impl FnOnce(Option<&Lti>) -> R) -> R {
        let st = self.inner.state.read();
        f(st.lti.as_ref().map(|g| &g.lti))
    }

    /// Caches the records nearest the LTI's start within `bytes` of RAM.
    pub fn cache_lti(&self, bytes: usize) -> Result<usize> {
        let mut st = self.inner.state.write();
        let Some(g) = st.lti.take() else {
            return Ok(0);
        };
        let mut g = match Arc::try_unwrap(g) {
            Ok(g) => g,
            Err(a) => {
                st.lti = Some(a);
                return Err(Error::invalid(
                    "the LTI is in use by a merge; cache it later",
                ));
            }
        };
        let r = g.lti.cache_near_start(bytes);
        st.lti = Some(Arc::new(g));
        r
    }
}

impl VectorIndex for FreshDiskann {
    fn descriptor(&self) -> &'static vectide_core::EngineDescriptor {
        &crate::DESCRIPTOR
    }

    fn params(&self) -> Params {
        let mut p = self.inner.params.to_params(self.inner.threads);
        p.insert(
            "path".into(),
            vectide_core::ParamValue::Str(self.inner.dir.display().to_string()),
        );
        p
    }

    fn dim(&self) -> usize {
        self.inner.dim
    }

    fn metric(&self) -> Metric {
        self.inner.metric
    }

    fn threads(&self) -> usize {
        self.inner.threads
    }

    fn pool(&self) -> Option<&rayon::ThreadPool> {
        Some(&self.inner.pool)
    }

    fn search_defaults(&self) -> SearchParams {
        SearchParams {
            ef: Some(self.inner.params.graph.l_search),
            beam_width: Some(self.inner.params.beam_width),
            ..SearchParams::default()
        }
    }

    fn insert(&self, seq: Seq, ids: &[u64], vectors: &[f32]) -> Result<()> {
        self.inner.insert(seq, ids, vectors, None)
    }

    fn insert_with_progress(
        &self,
        seq: Seq,
        ids: &[u64],
        vectors: &[f32],
        progress: Option<vectide_core::Progress<'_>>,
    ) -> Result<()> {
        self.inner.insert(seq, ids, vectors, progress)
    }

    fn delete(&self, seq: Seq, ids: &[u64]) -> Result<usize> {
        self.inner.delete(seq, ids)
    }

    fn search_into(
        &self,
        query: &[f32],
        k: usize,
        params: &SearchParams,
        filter: Option<Filter<'_>>,
        out: &mut Vec<Neighbor>,
    ) -> Result<()> {
        self.inner.search_into(query, k, params, filter, out)
    }

    fn get(&self, id: u64) -> Result<Option<Vec<f32>>> {
        self.inner.get(id)
    }

    fn contains(&self, id: u64) -> Result<bool> {
        Ok(self.inner.state.read().loc.contains_key(&id))
    }

    fn len(&self) -> usize {
        self.inner.state.read().loc.len()
    }

    fn flush(&self) -> Result<()> {
        if self.inner.params.external_log {
            // The caller's log holds the writes since the last freeze:
            // freeze now, so that the manifest covers them.
            let mut w = self.inner.writer.lock();
            return self.inner.freeze(&mut w);
        }
        // Every acknowledged call is durable already (its log record was
        // synced before it returned).
        Ok(())
    }

    fn durable_seq(&self) -> Seq {
        let i = &self.inner;
        if i.params.external_log {
            i.covered.load(Ordering::Acquire)
        } else {
            i.durable.load(Ordering::Acquire)
        }
    }

    fn stats(&self) -> Result<IndexStats> {
        Ok(self.inner.stats())
    }

    fn maintain(&self) -> Result<()> {
        self.merge_now().map(|_| ())
    }

    fn close(&self) -> Result<()> {
        self.inner.join_background();
        if self.inner.params.external_log {
            self.flush()?;
        }
        Ok(())
    }

    fn check_structure(&self) -> Result<Vec<String>> {
        self.inner.check()
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// The nodes of `live` that no path of out-edges from `start` reaches.
pub(crate) fn unreachable(lists: &[Vec<u32>], start: u32, live: &[u32]) -> Vec<u32> {
    let mut seen = vec![false; lists.len()];
    let mut stack = Vec::new();
    if (start as usize) < lists.len() {
        seen[start as usize] = true;
        stack.push(start);
    }
    while let Some(u) = stack.pop() {
        for &v in &lists[u as usize] {
            if let Some(s) = seen.get_mut(v as usize) {
                if !*s {
                    *s = true;
                    stack.push(v);
                }
            }
        }
    }
    let mut lost: Vec<u32> = live
        .iter()
        .copied()
        .filter(|&x| !seen.get(x as usize).copied().unwrap_or(false))
        .collect();
    lost.sort_unstable();
    lost
}

/// Whether a record label is a point (not a free record or the start node).
pub(crate) fn is_point(label: u64) -> bool {
    label != NO_LABEL && label != START_LABEL
}

#[cfg(test)]
mod tests {
    use super::unreachable;

    #[test]
    fn unreachable_names_live_nodes_no_path_reaches() {
        // 0 -> 1 -> 2, 3 -> 0 (3 has no in-edge), 4 isolated, 9 past the end.
        let lists = vec![vec![1], vec![2], vec![], vec![0], vec![]];
        assert_eq!(unreachable(&lists, 0, &[1, 2, 3, 4, 9]), vec![3, 4, 9]);
        assert_eq!(unreachable(&lists, 3, &[0, 1, 2, 3]), Vec::<u32>::new());
        assert_eq!(unreachable(&lists, 7, &[0]), vec![0]);
    }
}
