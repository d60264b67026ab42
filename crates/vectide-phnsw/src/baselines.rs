//! The P-HNSW paper's durable baselines (§6.1), as engines:
//!
//! - `hnsw-snap` ([`BaselineKind::Snap`]): the volatile [`Hnsw`] plus a full
//!   save (`docs/format-hnsw.md`: temp file, fsync, rename) every
//!   `snapshot_every` inserted rows. Inserts wait while a snapshot is
//!   written, not for its `fsync`, which the writer that took it runs after
//!   releasing the lock (unless the next snapshot falls due before that
//!   `fsync` ends: it waits for it, under the lock). After a crash it comes
//!   back as of its last snapshot.
//! - `hnsw-wal` ([`BaselineKind::Wal`]): the volatile [`Hnsw`] plus a
//!   write-ahead log of every insert and delete (`docs/format-wal.md`),
//!   written to the file per operation and `fdatasync`ed once `wal_buffer`
//!   bytes accumulated since the last sync; optionally a snapshot every `snapshot_every` rows,
//!   which truncates the log. Recovery loads the last snapshot and replays
//!   the log after it (rebuilding the graph, as the paper's HNSW_WAL does).
//!
//! Both live in a directory: `baseline.vtdb` (the manifest: engine, metric,
//! dimension, parameters), `snapshot.vtdx` and, for `hnsw-wal`, `wal.log`.
//!
//! The inner HNSW's delete consolidation never runs under the baseline's
//! lock (which every write takes): under a database it is left to the
//! database's maintenance thread (`defer_maintenance`, `maintenance_due`,
//! `maintain`); on its own the baseline queues it for the process's
//! consolidation thread (or, when no thread can be started, the writer
//! that found it due runs it after releasing the lock). It changes no
//! logical content, so neither the log nor a snapshot depends on it; its
//! repair runs beside the writes, as `hnsw`'s does, so a snapshot may catch
//! it half done, and an open relinks what that left unreachable.

use parking_lot::Mutex;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use vectide_core::engine::{PATH, THREADS};
use vectide_core::fault::{self, FaultSite};
use vectide_core::io::ByteReader;
use vectide_core::poison::Poison;
use vectide_core::validate::Checked;
use vectide_core::{
    limits, EngineDescriptor, Knob, ParamKind, ParamSpec, ParamValue, Params, ParamsExt,
    Persistence,
};
use vectide_core::{
    Error, Filter, IndexStats, Metric, Neighbor, Result, SearchParams, Seq, VectorIndex,
};
use vectide_graph::hnsw_params as descriptor;
use vectide_graph::HnswParams;
use vectide_hnsw::Hnsw;
use vectide_storage::durable::{replay, Envelope, RedoLog};

pub const MANIFEST_MAGIC: &[u8; 8] = b"VTDXBASE";
pub const MANIFEST_FILE: &str = "baseline.vtdb";
/// Version 2: the sealed envelope, and a log of whole calls in the one
/// record codec (version 1 logged one record per row).
const MANIFEST_VERSION: u32 = 2;
/// The manifest's sealed envelope.
const MANIFEST: Envelope = Envelope {
    magic: MANIFEST_MAGIC,
    end: b"VTDXBEND",
    version: MANIFEST_VERSION,
    what: "baseline manifest",
};
const SNAPSHOT_FILE: &str = "snapshot.vtdx";
const WAL_FILE: &str = "wal.log";

/// Which baseline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BaselineKind {
    Snap,
    Wal,
}

impl BaselineKind {
    /// The engine name.
    pub fn name(self) -> &'static str {
        match self {
            BaselineKind::Snap => "hnsw-snap",
            BaselineKind::Wal => "hnsw-wal",
        }
    }
}

/// Parameters of a baseline.
#[derive(Debug, Clone, PartialEq)]
pub struct BaselineParams {
    pub hnsw: HnswParams,
    /// Rows inserted between two snapshots (0: never; default 100,000 for
    /// `hnsw-snap`, 0 for `hnsw-wal`).
    pub snapshot_every: usize,
    /// `hnsw-wal`: bytes written between two `fdatasync`s (default 1 MiB).
    pub wal_buffer: usize,
}

impl BaselineParams {
    /// The defaults of a kind.
    pub fn defaults(kind: BaselineKind) -> Self {
        BaselineParams {
            hnsw: HnswParams::default(),
            snapshot_every: match kind {
                BaselineKind::Snap => 100_000,
                BaselineKind::Wal => 0,
            },
            wal_buffer: 1 << 20,
        }
    }
}

struct State {
    since_snapshot: usize,
    wal: Option<RedoLog>,
    /// Highest sequence number appended to the WAL buffer (`hnsw-snap`:
    /// applied, as it has no WAL).
    appended: Seq,
    /// Calls logged so far (`hnsw-snap`'s flush compares it with
    /// `Baseline::snapped`: sequence numbers may arrive out of order, so a
    /// snapshot's watermark does not tell which calls it holds).
    calls: u64,
}

/// A volatile HNSW made durable by snapshots or a WAL (see the module docs).
pub struct Baseline {
    kind: BaselineKind,
    dir: PathBuf,
    params: BaselineParams,
    /// Shared with a queued background consolidation (which holds it weakly).
    inner: Arc<Hnsw>,
    /// Set by `defer_maintenance`: the caller (a database's maintenance
    /// thread) runs the inner consolidation through `maintain`.
    deferred: AtomicBool,
    /// A background consolidation is queued or running.
    consolidation_queued: Arc<AtomicBool>,
    /// Background consolidations that panicked (the stats' extra
    /// `consolidation_panics`).
    consolidation_panics: Arc<AtomicU64>,
    state: Mutex<State>,
    /// Every operation up to here is durable (snapshot or synced log).
    durable: AtomicU64,
    /// `State::calls` as of the last committed snapshot (`hnsw-snap`).
    snapped: AtomicU64,
    /// What the last open did: logged calls replayed.
    replayed: usize,
    /// Set when a logged call failed to apply (see
    /// [`vectide_core::poison`]): writes and snapshots are refused until
    /// the index is reopened.
    poison: Poison,
    /// The maintenance jobs running (snapshots).
    activity: vectide_core::activity::Activity,
}

/// The fault point between a baseline's log and its apply (tests of the
/// poisoned state).
pub const APPLY_FAULT: FaultSite = FaultSite("baseline.apply");

/// The process's job thread for the standalone baselines' consolidations
/// (`vectide-baseline-consolidate`, one after the other; see
/// [`vectide_core::job_thread`] for why a plain thread). Each
/// consolidation's repair runs on its index's pool as before.
mod consolidation_thread {
    pub use vectide_core::job_thread::Job;

    /// Queues `job`; gives it back when no thread can be started.
    pub fn submit(job: Job) -> Result<(), Job> {
        vectide_core::job_thread::submit("baseline-consolidate", job)
    }
}

impl std::fmt::Debug for Baseline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Baseline")
            .field("kind", &self.kind)
            .field("dir", &self.dir)
            .field("len", &self.inner.len())
            .finish()
    }
}

fn manifest_bytes(kind: BaselineKind, dim: usize, metric: Metric, p: &BaselineParams) -> Vec<u8> {
    let mut b = MANIFEST.begin(56);
    b.push(match kind {
        BaselineKind::Snap => 1,
        BaselineKind::Wal => 2,
    });
    b.push(metric as u8);
    b.extend_from_slice(&[0, 0]);
    b.extend_from_slice(&(dim as u32).to_le_bytes());
    b.extend_from_slice(&(p.hnsw.m as u32).to_le_bytes());
    b.extend_from_slice(&(p.hnsw.ef_construction as u32).to_le_bytes());
    b.extend_from_slice(&(p.hnsw.ef_search as u32).to_le_bytes());
    b.extend_from_slice(&p.hnsw.seed.to_le_bytes());
    b.extend_from_slice(&(p.snapshot_every as u64).to_le_bytes());
    b.extend_from_slice(&(p.wal_buffer as u64).to_le_bytes());
    MANIFEST.seal(b)
}

/// Reads a manifest: kind, dimension, metric, parameters.
pub fn read_manifest(dir: &Path) -> Result<(BaselineKind, usize, Metric, BaselineParams)> {
    MANIFEST.read(&dir.join(MANIFEST_FILE), parse_manifest)
}

fn parse_manifest(r: &mut ByteReader<'_>) -> Result<(BaselineKind, usize, Metric, BaselineParams)> {
    let kind = match r.u8()? {
        1 => BaselineKind::Snap,
        2 => BaselineKind::Wal,
        k => return Err(Error::corrupted(format!("unknown kind {k}"))),
    };
    let metric = Metric::from_tag(r.u8()?)?;
    r.bytes(2)?;
    let dim = r.u32()? as usize;
    let mut p = BaselineParams::defaults(kind);
    p.hnsw.m = r.u32()? as usize;
    p.hnsw.ef_construction = r.u32()? as usize;
    p.hnsw.ef_search = r.u32()? as usize;
    p.hnsw.seed = r.u64()?;
    p.snapshot_every = r.u64()? as usize;
    p.wal_buffer = r.u64()? as usize;
    p.hnsw.validate()?;
    Ok((kind, dim, metric, p))
}

impl Baseline {
    /// Creates a new baseline index in `dir` (which must not hold one).
    pub fn create(
        dir: &Path,
        kind: BaselineKind,
        dim: usize,
        metric: Metric,
        params: BaselineParams,
    ) -> Result<Self> {
        params.hnsw.validate()?;
        let inner = Hnsw::new(dim, metric, params.hnsw.clone())?;
        std::fs::create_dir_all(dir).map_err(|e| Error::io_at(dir, e))?;
        if dir.join(MANIFEST_FILE).exists() {
            return Err(Error::invalid(format!(
                "{} already holds an index; open it instead",
                dir.display()
            )));
        }
        for f in [SNAPSHOT_FILE, WAL_FILE] {
            let _ = std::fs::remove_file(dir.join(f));
        }
        let bytes = manifest_bytes(kind, dim, metric, &params);
        MANIFEST.write(&dir.join(MANIFEST_FILE), &bytes)?;
        let wal = match kind {
            BaselineKind::Wal => Some(RedoLog::open(&dir.join(WAL_FILE), dim)?.0),
            BaselineKind::Snap => None,
        };
        Ok(Self::assemble(kind, dir, params, inner, wal, 0, 0))
    }

    /// Opens a baseline index: loads the last snapshot and (for `hnsw-wal`)
    /// replays the log after it.
    pub fn open(dir: &Path, threads: Option<usize>) -> Result<Self> {
        let (kind, dim, metric, mut params) = read_manifest(dir)?;
        params.hnsw.threads = threads;
        let snap = dir.join(SNAPSHOT_FILE);
        let inner = if snap.exists() {
            let inner = Hnsw::load(&snap, threads)?;
            // A snapshot may have been written while a consolidation was
            // repairing lists (it runs beside the writes): a live node whose
            // in-edges were mid-repair can be unreachable in it until the
            // next consolidation. Relinked here, as a consolidation's end
            // would.
            inner.repair_reachability();
            inner
        } else {
            Hnsw::new(dim, metric, params.hnsw.clone())?
        };
        if inner.dim() != dim || inner.metric() != metric {
            return Err(Error::corrupted(format!(
                "{}: snapshot does not match the manifest",
                snap.display()
            )));
        }
        let base = inner.durable_seq();
        let mut replayed = 0;
        let mut durable = base;
        let wal = match kind {
            BaselineKind::Snap => None,
            BaselineKind::Wal => {
                // A call cut by a crash is dropped (and abandoned in the
                // log, so that a retry of its number is not joined to it).
                let (wal, rec) = RedoLog::open(&dir.join(WAL_FILE), dim)?;
                // The log holds the calls after the snapshot (a snapshot
                // empties it), whatever their numbers: callers number a
                // write before they take the lock, so one numbered below
                // the snapshot's watermark may follow it. All are replayed,
                // in parallel batches, as the paper's HNSW_WAL rebuilds.
                // A crash between the snapshot's rename and the truncation
                // leaves calls the snapshot holds: replayed in log order
                // over it, each id ends as its last call left it (an
                // insert no newer than what the id holds is skipped, and
                // `replay` batches no call numbered at or below `base`).
                let r = replay(
                    rec.ops,
                    base,
                    |seq, ids, vectors| inner.insert(seq, ids, vectors),
                    |seq, ids| inner.delete(seq, ids).map(drop),
                )?;
                replayed = r.calls;
                durable = r.watermark;
                Some(wal)
            }
        };
        Ok(Self::assemble(
            kind, dir, params, inner, wal, durable, replayed,
        ))
    }

    fn assemble(
        kind: BaselineKind,
        dir: &Path,
        params: BaselineParams,
        inner: Hnsw,
        wal: Option<RedoLog>,
        durable: Seq,
        replayed: usize,
    ) -> Self {
        // From here on the inner index leaves its consolidation to us (the
        // replay above, which nobody waits on but the opener, ran them
        // inline).
        VectorIndex::defer_maintenance(&inner);
        Baseline {
            kind,
            dir: dir.to_path_buf(),
            params,
            inner: Arc::new(inner),
            deferred: AtomicBool::new(false),
            consolidation_queued: Arc::default(),
            consolidation_panics: Arc::default(),
            state: Mutex::new(State {
                since_snapshot: 0,
                wal,
                appended: durable,
                calls: 0,
            }),
            durable: AtomicU64::new(durable),
            snapped: AtomicU64::new(0),
            replayed,
            poison: Poison::default(),
            activity: Default::default(),
        }
    }

    /// Which baseline this is.
    pub fn kind(&self) -> BaselineKind {
        self.kind
    }

    /// The wrapped volatile index.
    pub fn inner(&self) -> &Hnsw {
        &self.inner
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The parameters.
    pub fn params(&self) -> &BaselineParams {
        &self.params
    }

    /// Logged calls replayed by the last open.
    pub fn replayed(&self) -> usize {
        self.replayed
    }

    /// Writes a snapshot now (and, for `hnsw-wal`, truncates the log).
    pub fn snapshot(&self) -> Result<()> {
        let staged = self.snapshot_locked(&mut self.state.lock())?;
        staged.commit(self)
    }

    /// A snapshot, taken with the baseline's lock held (`st`): writers wait
    /// while the index is written beside its file. `hnsw-snap` puts it in
    /// place (fsync, rename) when the returned snapshot is committed, after
    /// the caller released the lock, so that writers do not wait for the
    /// disk. `hnsw-wal` does it all here: its log may be truncated only once
    /// the snapshot is durable, and only of what the snapshot holds.
    fn snapshot_locked(&self, st: &mut State) -> Result<StagedSnapshot<'_>> {
        // A poisoned index lacks a logged call: a snapshot would cover it
        // and truncate the log that holds it.
        self.poison.check()?;
        let job = self.activity.begin("snapshot");
        let path = self.dir.join(SNAPSHOT_FILE);
        let Some(wal) = st.wal.as_mut() else {
            let save = self.inner.save_staged(&path)?;
            st.since_snapshot = 0;
            return Ok(StagedSnapshot {
                save: Some(save),
                calls: st.calls,
                _job: job,
            });
        };
        wal.sync()?;
        self.inner.save(&path)?;
        wal.wal_mut().truncate()?;
        st.since_snapshot = 0;
        self.durable
            .fetch_max(self.inner.durable_seq(), Ordering::AcqRel);
        Ok(StagedSnapshot {
            save: None,
            calls: st.calls,
            _job: job,
        })
    }

    /// Logs a call (`vectors` empty: a delete) without waiting for the
    /// disk: it reaches the file (the page cache) before it is applied, and
    /// an `fdatasync` follows once `wal_buffer` bytes accumulated.
    fn log(
        &self,
        st: &mut State,
        seq: Seq,
        insert: bool,
        ids: &[u64],
        vectors: &[f32],
    ) -> Result<()> {
        st.calls += 1;
        let Some(wal) = st.wal.as_mut() else {
            st.appended = st.appended.max(seq);
            return Ok(());
        };
        if insert {
            wal.append_insert(seq, ids, vectors)?;
        } else {
            wal.append_delete(seq, ids)?;
        }
        st.appended = st.appended.max(seq);
        if wal.wal().unsynced() >= self.params.wal_buffer as u64 {
            wal.sync()?;
            self.durable.fetch_max(st.appended, Ordering::AcqRel);
        } else {
            wal.wal_mut().write_out()?;
        }
        Ok(())
    }

    /// After a delete, outside the baseline's lock: a consolidation that is
    /// due is queued for the process's consolidation thread, unless a
    /// database runs it.
    fn after_delete(&self) {
        if self.deferred.load(Ordering::Acquire) || !self.inner.maintenance_due() {
            return;
        }
        if self.consolidation_queued.swap(true, Ordering::AcqRel) {
            return;
        }
        let weak = Arc::downgrade(&self.inner);
        let queued = Arc::clone(&self.consolidation_queued);
        let panics = Arc::clone(&self.consolidation_panics);
        let job = move || {
            // One job per index at a time: the flag stays set while it runs,
            // and a delete that found it set is covered by the check after
            // the clear.
            while let Some(inner) = weak.upgrade() {
                // A consolidation returns no error; a panic in it must not
                // end the thread (it is counted in the stats' extras).
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    inner.consolidate();
                }));
                if r.is_err() {
                    panics.fetch_add(1, Ordering::Relaxed);
                }
                queued.store(false, Ordering::Release);
                if !inner.maintenance_due() || queued.swap(true, Ordering::AcqRel) {
                    return;
                }
            }
            queued.store(false, Ordering::Release);
        };
        if let Err(job) = consolidation_thread::submit(Box::new(job)) {
            // No thread to hand it to: this writer runs it (still outside
            // the baseline's lock).
            job();
        }
    }

    /// Counts an insert's rows; a snapshot when they make one due (to be
    /// committed once the lock is released).
    fn after_insert(&self, st: &mut State, rows: usize) -> Result<Option<StagedSnapshot<'_>>> {
        st.since_snapshot += rows;
        if self.params.snapshot_every > 0 && st.since_snapshot >= self.params.snapshot_every {
            return self.snapshot_locked(st).map(Some);
        }
        Ok(None)
    }
}

/// A snapshot written under the baseline's lock and not yet in place (see
/// `Baseline::snapshot_locked`); its job counts as running until the commit.
#[must_use = "a staged snapshot is durable only once committed"]
struct StagedSnapshot<'a> {
    save: Option<vectide_core::StagedSave<'a>>,
    /// `State::calls` when it was written: it holds those calls.
    calls: u64,
    _job: vectide_core::activity::Running<'a>,
}

impl StagedSnapshot<'_> {
    /// Syncs the snapshot and puts it in place, then moves the durable
    /// watermark to what it holds. When that fails, the next insert tries
    /// a snapshot again (as when the write under the lock fails).
    fn commit(self, b: &Baseline) -> Result<()> {
        if let Some(save) = self.save {
            let covers = save.covers();
            if let Err(e) = save.commit() {
                let mut st = b.state.lock();
                st.since_snapshot = st.since_snapshot.max(b.params.snapshot_every);
                return Err(e);
            }
            b.durable.fetch_max(covers, Ordering::AcqRel);
        }
        b.snapped.fetch_max(self.calls, Ordering::AcqRel);
        Ok(())
    }
}

impl VectorIndex for Baseline {
    fn descriptor(&self) -> &'static vectide_core::EngineDescriptor {
        match self.kind {
            BaselineKind::Snap => &HNSW_SNAP,
            BaselineKind::Wal => &HNSW_WAL,
        }
    }

    fn params(&self) -> vectide_core::Params {
        let mut out = descriptor::graph_params_out(&self.params.hnsw, self.inner.threads());
        // The manifest keeps the graph's build parameters, not the repair ones.
        for k in ["consolidate_fraction", "repair_alpha"] {
            out.remove(k);
        }
        out.insert(
            "path".into(),
            ParamValue::Str(self.dir.display().to_string()),
        );
        let int = |v: usize| ParamValue::Int(i64::try_from(v).unwrap_or(i64::MAX));
        out.insert("snapshot_every".into(), int(self.params.snapshot_every));
        if self.kind == BaselineKind::Wal {
            out.insert("wal_buffer".into(), int(self.params.wal_buffer));
        }
        out
    }

    fn pool(&self) -> Option<&rayon::ThreadPool> {
        VectorIndex::pool(&*self.inner)
    }

    fn check_structure(&self) -> Result<Vec<String>> {
        self.inner.check_structure()
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn search_defaults(&self) -> SearchParams {
        SearchParams::with_ef(self.params.hnsw.ef_search)
    }

    fn dim(&self) -> usize {
        self.inner.dim()
    }

    fn metric(&self) -> Metric {
        self.inner.metric()
    }

    fn insert(&self, seq: Seq, ids: &[u64], vectors: &[f32]) -> Result<()> {
        let batch = Checked::new(self.dim(), self.metric(), ids, vectors)?;
        self.insert_checked(seq, batch)
    }

    fn insert_checked(&self, seq: Seq, batch: Checked<'_>) -> Result<()> {
        let (ids, vectors) = (batch.ids(), batch.vectors());
        let mut st = self.state.lock();
        self.poison.check()?;
        self.log(&mut st, seq, true, ids, vectors)
            .map_err(|e| self.poison.poison(&format!("the log of write {seq}"), &e))?;
        fault::hit(&self.dir, APPLY_FAULT)
            .and_then(|()| self.inner.insert_checked(seq, batch))
            .map_err(|e| self.poison.poison(&format!("the apply of write {seq}"), &e))?;
        let staged = self.after_insert(&mut st, ids.len())?;
        drop(st);
        match staged {
            Some(snapshot) => snapshot.commit(self),
            None => Ok(()),
        }
    }

    fn delete(&self, seq: Seq, ids: &[u64]) -> Result<usize> {
        let removed = {
            let mut st = self.state.lock();
            self.poison.check()?;
            self.log(&mut st, seq, false, ids, &[])
                .map_err(|e| self.poison.poison(&format!("the log of write {seq}"), &e))?;
            fault::hit(&self.dir, APPLY_FAULT)
                .and_then(|()| self.inner.delete(seq, ids))
                .map_err(|e| self.poison.poison(&format!("the apply of write {seq}"), &e))?
        };
        self.after_delete();
        Ok(removed)
    }

    fn maintain(&self) -> Result<()> {
        // Waits for a background consolidation that is running (they run
        // one at a time), then runs what is left.
        self.inner.consolidate();
        Ok(())
    }

    fn defer_maintenance(&self) -> bool {
        self.deferred.store(true, Ordering::Release);
        true
    }

    fn maintenance_due(&self) -> bool {
        self.inner.maintenance_due()
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

    fn distances(&self, query: &[f32], ids: &[u64], out: &mut Vec<Neighbor>) -> Result<()> {
        self.inner.distances(query, ids, out)
    }

    fn exact_scan(&self, query: &[f32], k: usize) -> Result<Option<Vec<Neighbor>>> {
        self.inner.exact_scan(query, k)
    }

    fn get(&self, id: u64) -> Result<Option<Vec<f32>>> {
        self.inner.get(id)
    }

    fn contains(&self, id: u64) -> Result<bool> {
        self.inner.contains(id)
    }

    fn len(&self) -> usize {
        self.inner.len()
    }

    fn flush(&self) -> Result<()> {
        let mut st = self.state.lock();
        let calls = st.calls;
        match st.wal.as_mut() {
            Some(wal) => {
                wal.sync()?;
                let a = st.appended;
                self.durable.fetch_max(a, Ordering::AcqRel);
                Ok(())
            }
            // Nothing logged since the calls the last committed snapshot
            // holds: already durable. (Not `durable >= appended`: a
            // snapshot's watermark may pass a smaller number whose call
            // comes after it. Before, every flush wrote a whole snapshot: a
            // caller flushing once a second kept an idle index writing
            // 30 MB a second, and a soak's settle never saw it quiet.)
            None if self.snapped.load(Ordering::Acquire) >= calls => Ok(()),
            None => {
                let staged = self.snapshot_locked(&mut st)?;
                drop(st);
                staged.commit(self)
            }
        }
    }

    fn durable_seq(&self) -> Seq {
        self.durable.load(Ordering::Acquire)
    }

    fn stats(&self) -> Result<IndexStats> {
        let mut s = self.inner.stats()?;
        s.disk_bytes = [MANIFEST_FILE, SNAPSHOT_FILE, WAL_FILE]
            .iter()
            .filter_map(|f| std::fs::metadata(self.dir.join(f)).ok())
            .map(|m| m.len())
            .sum();
        self.activity.fill(&mut s);
        s.extra.push((
            "consolidation_panics".into(),
            self.consolidation_panics.load(Ordering::Relaxed) as f64,
        ));
        Ok(s)
    }
}

// ---- registry descriptors ------------------------------------------------

/// `snapshot_every` of both baselines.
const SNAPSHOT_EVERY: ParamSpec = ParamSpec {
    name: "snapshot_every",
    kind: ParamKind::Int {
        min: 0,
        max: limits::MAX_SNAPSHOT_EVERY as i64,
    },
    default: "100000 (hnsw-snap), 0 (hnsw-wal)",
    doc: "rows inserted between two snapshots (0: never)",
    source: "P-HNSW paper §6.1 (the snapshot baseline)",
};

static SNAP_PARAMS: [ParamSpec; 7] = [
    descriptor::M,
    descriptor::EF_CONSTRUCTION,
    descriptor::EF_SEARCH,
    descriptor::SEED,
    SNAPSHOT_EVERY,
    PATH,
    THREADS,
];

static WAL_PARAMS: [ParamSpec; 8] = [
    descriptor::M,
    descriptor::EF_CONSTRUCTION,
    descriptor::EF_SEARCH,
    descriptor::SEED,
    SNAPSHOT_EVERY,
    ParamSpec {
        name: "wal_buffer",
        kind: ParamKind::Int {
            min: 0,
            max: limits::MAX_WAL_BUFFER as i64,
        },
        default: "1048576",
        doc: "bytes written between two fdatasyncs (0 acts as 1: sync every operation)",
        source: "P-HNSW paper §6.1 (the WAL baseline's buffer)",
    },
    PATH,
    THREADS,
];

/// Engine `hnsw-snap`: the paper's snapshot baseline.
pub static HNSW_SNAP: EngineDescriptor = EngineDescriptor {
    name: "hnsw-snap",
    summary: "P-HNSW paper baseline: volatile HNSW saved in full every snapshot_every rows (each snapshot replaces the last)",
    persistence: Persistence::DurableAtFlush,
    medium: vectide_core::engine::Medium::Ram,
    params: &SNAP_PARAMS,
    open_params: &["threads", "path"],
    knobs: &[Knob::Ef],
    primary_knob: Some(Knob::Ef),
    create: |dim, metric, p| create_kind(BaselineKind::Snap, dim, metric, p),
    open: open_any,
    detect: |dir| detect_kind(BaselineKind::Snap, dir),
    inspect: inspect_dir,
};

/// Engine `hnsw-wal`: the paper's WAL baseline.
pub static HNSW_WAL: EngineDescriptor = EngineDescriptor {
    name: "hnsw-wal",
    summary: "P-HNSW paper baseline: volatile HNSW with a write-ahead log, replayed at open; the log is kept whole, as the paper's, unless snapshot_every > 0 cuts it at each snapshot",
    persistence: Persistence::DurableAtFlush,
    medium: vectide_core::engine::Medium::Ram,
    params: &WAL_PARAMS,
    open_params: &["threads", "path"],
    knobs: &[Knob::Ef],
    primary_knob: Some(Knob::Ef),
    create: |dim, metric, p| create_kind(BaselineKind::Wal, dim, metric, p),
    open: open_any,
    detect: |dir| detect_kind(BaselineKind::Wal, dir),
    inspect: inspect_dir,
};

/// [`BaselineParams`] from checked parameters.
pub fn baseline_params(kind: BaselineKind, params: &Params) -> Result<BaselineParams> {
    let d = BaselineParams::defaults(kind);
    Ok(BaselineParams {
        hnsw: descriptor::graph_params(params)?,
        snapshot_every: params.usize("snapshot_every").unwrap_or(d.snapshot_every),
        wal_buffer: params.usize("wal_buffer").unwrap_or(d.wal_buffer).max(1),
    })
}

fn create_kind(
    kind: BaselineKind,
    dim: usize,
    metric: Metric,
    params: &Params,
) -> Result<Box<dyn VectorIndex>> {
    let p = baseline_params(kind, params)?;
    let dir = params.string("path").map(PathBuf::from).ok_or_else(|| {
        Error::invalid(format!(
            "engine {:?} lives in a directory: pass path=DIR",
            kind.name()
        ))
    })?;
    Ok(Box::new(Baseline::create(&dir, kind, dim, metric, p)?))
}

fn open_any(dir: &Path, params: &Params) -> Result<Box<dyn VectorIndex>> {
    Ok(Box::new(Baseline::open(dir, params.usize("threads"))?))
}

/// A directory with a manifest is a baseline's. When the manifest cannot be
/// read (damaged, a newer version) the first baseline claims it, so that its
/// `open` or `inspect` reports the real error rather than "unknown engine".
fn detect_kind(kind: BaselineKind, dir: &Path) -> bool {
    dir.join(MANIFEST_FILE).is_file()
        && match read_manifest(dir) {
            Ok((k, ..)) => k == kind,
            Err(_) => kind == BaselineKind::Snap,
        }
}

fn inspect_dir(dir: &Path) -> Result<Vec<(String, String)>> {
    let (kind, dim, metric, p) = read_manifest(dir)?;
    let size = |f: &str| {
        std::fs::metadata(dir.join(f)).map_or("absent".to_string(), |m| m.len().to_string())
    };
    let rows = [
        ("engine", kind.name().to_string()),
        ("metric", metric.name().to_string()),
        ("dim", dim.to_string()),
        ("m", p.hnsw.m.to_string()),
        ("ef_construction", p.hnsw.ef_construction.to_string()),
        ("snapshot_every", p.snapshot_every.to_string()),
        ("wal_buffer", p.wal_buffer.to_string()),
        ("snapshot_bytes", size(SNAPSHOT_FILE)),
        ("wal_bytes", size(WAL_FILE)),
    ];
    Ok(rows.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use vectide_storage::durable::record;

    fn rows(n: usize, dim: usize, salt: u64) -> Vec<f32> {
        (0..n * dim)
            .map(|i| (((i as u64 * 2654435761 + salt) % 1000) as f32) / 1000.0 + 0.001)
            .collect()
    }

    #[test]
    fn open_relinks_live_nodes_its_snapshot_left_unreachable() {
        // Pruning with m = 2 drops some nodes' last in-edge on layer 0 (a
        // consolidation would relink them; none runs without deletes), so
        // the snapshot holds live nodes the entry point cannot reach.
        let dir = tempfile::tempdir().unwrap();
        let dim = 2;
        let mut p = BaselineParams::defaults(BaselineKind::Snap);
        p.hnsw.m = 2;
        p.hnsw.ef_construction = 8;
        p.hnsw.threads = Some(1);
        let s = Baseline::create(dir.path(), BaselineKind::Snap, dim, Metric::L2, p).unwrap();
        let n = 3000;
        let ids: Vec<u64> = (0..n as u64).collect();
        let v: Vec<f32> = (0..n * dim)
            .map(|i| {
                ((i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40) as f32 / (1u64 << 24) as f32
            })
            .collect();
        s.insert(1, &ids, &v).unwrap();
        s.snapshot().unwrap();
        drop(s);
        let saved = Hnsw::load(&dir.path().join(SNAPSHOT_FILE), Some(1)).unwrap();
        let g = saved.check_graph();
        assert!(
            g.reachable < g.live,
            "no unreachable node was planted: {g:?}"
        );
        let s = Baseline::open(dir.path(), Some(1)).unwrap();
        let g = s.inner().check_graph();
        assert_eq!((g.live, g.reachable), (n, n), "{g:?}");
    }

    #[test]
    fn wal_watermark_survives_operations_logged_out_of_sequence_order() {
        // Two writers numbered 5 and 6; the one holding 6 logs first.
        let dir = tempfile::tempdir().unwrap();
        let p = BaselineParams::defaults(BaselineKind::Wal);
        let w = Baseline::create(dir.path(), BaselineKind::Wal, 2, Metric::L2, p).unwrap();
        w.insert(6, &[1], &[0.5, 0.5]).unwrap();
        w.insert(5, &[2], &[0.25, 0.5]).unwrap();
        w.flush().unwrap();
        assert_eq!(w.durable_seq(), 6);
        drop(w);
        let w = Baseline::open(dir.path(), None).unwrap();
        assert_eq!(w.durable_seq(), 6, "not the last record's 5");
        assert_eq!(w.len(), 2);
    }

    #[test]
    fn a_call_is_replayed_whole_or_not_at_all() {
        let dir = tempfile::tempdir().unwrap();
        let dim = 2;
        let p = BaselineParams::defaults(BaselineKind::Wal);
        let w = Baseline::create(dir.path(), BaselineKind::Wal, dim, Metric::L2, p).unwrap();
        // Three rows per frame: a call of 8 inserts spans 3 frames.
        let frame = record::HEAD + 3 * (8 + 4 * dim);
        {
            let mut st = w.state.lock();
            let log = st.wal.take().unwrap();
            st.wal = Some(log.with_max_frame(frame));
        }
        w.insert(1, &[0, 1, 2, 3], &rows(4, dim, 1)).unwrap();
        w.delete(2, &[0, 1, 2, 3]).unwrap();
        w.insert(3, &[0, 1], &rows(2, dim, 2)).unwrap();
        let wal = dir.path().join(WAL_FILE);
        w.flush().unwrap();
        let before = std::fs::metadata(&wal).unwrap().len();
        w.insert(4, &(10..18).collect::<Vec<u64>>(), &rows(8, dim, 3))
            .unwrap();
        w.flush().unwrap();
        assert_eq!(w.durable_seq(), 4);
        drop(w);
        // The crash tore the call's last frame: its first two frames are
        // whole, and none of its records may come back.
        let after = std::fs::metadata(&wal).unwrap().len();
        assert!(after > before + 2 * frame as u64);
        let f = std::fs::OpenOptions::new().write(true).open(&wal).unwrap();
        f.set_len(after - 3).unwrap();
        drop(f);
        let w = Baseline::open(dir.path(), None).unwrap();
        assert_eq!(w.durable_seq(), 3, "call 4 lost its last frame");
        assert_eq!(w.len(), 2);
        assert!(!w.contains(10).unwrap());
        assert_eq!(w.get(1).unwrap().unwrap(), rows(2, dim, 2)[dim..].to_vec());
        // The retry reuses number 4 with other content: the cut call's
        // frames must not join it.
        w.insert(4, &[20], &rows(1, dim, 4)).unwrap();
        w.flush().unwrap();
        drop(w);
        let w = Baseline::open(dir.path(), None).unwrap();
        assert_eq!((w.durable_seq(), w.len()), (4, 3));
        assert!(!w.contains(10).unwrap() && w.contains(20).unwrap());
    }

    #[test]
    fn wal_replays_after_the_snapshot_and_snap_keeps_its_last_snapshot() {
        let dir = tempfile::tempdir().unwrap();
        let dim = 4;
        let mut p = BaselineParams::defaults(BaselineKind::Wal);
        p.snapshot_every = 300;
        p.wal_buffer = 64;
        let w =
            Baseline::create(&dir.path().join("w"), BaselineKind::Wal, dim, Metric::L2, p).unwrap();
        let ids: Vec<u64> = (0..500).collect();
        let v = rows(500, dim, 1);
        w.insert(1, &ids[..400], &v[..400 * dim]).unwrap(); // snapshot after 400 rows
        w.insert(2, &ids[400..], &v[400 * dim..]).unwrap();
        w.delete(3, &[7, 8]).unwrap();
        w.flush().unwrap();
        assert_eq!(w.durable_seq(), 3);
        drop(w);
        let w = Baseline::open(&dir.path().join("w"), None).unwrap();
        assert_eq!(w.len(), 498);
        assert_eq!(
            w.replayed(),
            2,
            "the insert of 100 rows and the delete after the snapshot"
        );
        assert_eq!(
            w.get(450).unwrap().unwrap(),
            v[450 * dim..451 * dim].to_vec()
        );
        assert!(!w.contains(7).unwrap());

        let mut p = BaselineParams::defaults(BaselineKind::Snap);
        p.snapshot_every = 200;
        let s = Baseline::create(
            &dir.path().join("s"),
            BaselineKind::Snap,
            dim,
            Metric::L2,
            p,
        )
        .unwrap();
        for (b, chunk) in ids.chunks(100).enumerate() {
            s.insert(
                b as u64 + 1,
                chunk,
                &v[b * 100 * dim..(b * 100 + chunk.len()) * dim],
            )
            .unwrap();
        }
        assert_eq!(s.durable_seq(), 4, "snapshots after 200 and 400 rows");
        drop(s);
        let s = Baseline::open(&dir.path().join("s"), None).unwrap();
        assert_eq!(s.len(), 400, "the rows after the last snapshot are lost");
        assert!(Baseline::create(
            &dir.path().join("s"),
            BaselineKind::Snap,
            dim,
            Metric::L2,
            BaselineParams::defaults(BaselineKind::Snap)
        )
        .is_err());
        std::fs::write(dir.path().join("s").join(MANIFEST_FILE), b"VTDXBASE junk").unwrap();
        assert!(matches!(
            Baseline::open(&dir.path().join("s"), None),
            Err(Error::Corrupted(_))
        ));
    }

    fn filled(kind: BaselineKind, dir: &Path, n: u64) -> Baseline {
        let mut p = BaselineParams::defaults(kind);
        p.snapshot_every = 0;
        let b = Baseline::create(dir, kind, 4, Metric::L2, p).unwrap();
        let ids: Vec<u64> = (0..n).collect();
        b.insert(1, &ids, &rows(n as usize, 4, 7)).unwrap();
        b
    }

    #[test]
    fn a_flush_with_nothing_new_takes_no_snapshot() {
        let dir = tempfile::tempdir().unwrap();
        let b = filled(BaselineKind::Snap, dir.path(), 50);
        let started = |b: &Baseline| b.stats().unwrap().maintenance_started;
        b.flush().unwrap();
        let after_first = started(&b);
        assert_eq!(b.durable_seq(), 1);
        b.flush().unwrap();
        b.flush().unwrap();
        assert_eq!(
            started(&b),
            after_first,
            "a flush of nothing new snapshotted"
        );
        // A delete is new: the next flush takes one, and it is durable.
        assert_eq!(b.delete(2, &[3]).unwrap(), 1);
        b.flush().unwrap();
        assert_eq!(started(&b), after_first + 1);
        assert_eq!(b.durable_seq(), 2);
        drop(b);
        let again = Baseline::open(dir.path(), Some(2)).unwrap();
        assert_eq!(again.len(), 49);
    }

    #[test]
    fn a_flush_after_a_smaller_number_applied_late_takes_a_snapshot() {
        // Writers number their calls before taking the lock: seq 3 may be
        // applied and snapshotted (watermark 3) before seq 2 is applied.
        // The flush after seq 2 must still snapshot it.
        let dir = tempfile::tempdir().unwrap();
        let b = filled(BaselineKind::Snap, dir.path(), 10);
        b.insert(3, &[100], &rows(1, 4, 8)).unwrap();
        b.flush().unwrap();
        assert_eq!(b.durable_seq(), 3);
        b.insert(2, &[101], &rows(1, 4, 9)).unwrap();
        b.flush().unwrap();
        drop(b);
        let again = Baseline::open(dir.path(), Some(2)).unwrap();
        assert!(again.contains(101).unwrap(), "acknowledged seq 2 lost");
        assert_eq!(again.len(), 12);
    }

    #[test]
    fn a_delete_that_makes_a_consolidation_due_leaves_it_to_the_thread() {
        // The consolidation thread runs a job that waits on a gate the test
        // holds, so a consolidation queued behind it cannot have run when
        // the delete returns; one run by the writer would have.
        let gate = Arc::new(parking_lot::RwLock::new(()));
        let held = gate.write();
        let started = Arc::new(AtomicBool::new(false));
        let blocker = {
            let (gate, started) = (Arc::clone(&gate), Arc::clone(&started));
            Box::new(move || {
                started.store(true, Ordering::Release);
                drop(gate.read());
            })
        };
        assert!(consolidation_thread::submit(blocker).is_ok());
        while !started.load(Ordering::Acquire) {
            std::thread::yield_now();
        }
        for kind in [BaselineKind::Wal, BaselineKind::Snap] {
            let dir = tempfile::tempdir().unwrap();
            let b = filled(kind, dir.path(), 400);
            let dead: Vec<u64> = (0..100).collect();
            assert_eq!(b.delete(2, &dead).unwrap(), 100);
            assert!(
                b.inner().maintenance_due(),
                "{kind:?}: the delete ran the consolidation itself"
            );
            assert_eq!(b.len(), 300);
        }
        let dir = tempfile::tempdir().unwrap();
        let b = filled(BaselineKind::Wal, dir.path(), 400);
        b.delete(2, &(0..100).collect::<Vec<u64>>()).unwrap();
        drop(held);
        let t = std::time::Instant::now();
        while b.inner().maintenance_due() {
            assert!(
                t.elapsed() < std::time::Duration::from_secs(60),
                "the queued consolidation never ran"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(b.inner().stats().unwrap().maintenance_started >= 1);
        let q = rows(1, 4, 99);
        let got = b.search(&q, 10, &SearchParams::default(), None).unwrap();
        assert_eq!(got.len(), 10);
        assert!(got.iter().all(|n| n.id >= 100), "a deleted id came back");
        // A later delete that makes one due again queues another.
        b.delete(3, &(100..200).collect::<Vec<u64>>()).unwrap();
        let t = std::time::Instant::now();
        while b.inner().maintenance_due() {
            assert!(t.elapsed() < std::time::Duration::from_secs(60));
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(b.len(), 200);
    }

    #[test]
    fn under_a_database_the_consolidation_waits_for_maintain() {
        let dir = tempfile::tempdir().unwrap();
        let b = filled(BaselineKind::Snap, dir.path(), 400);
        assert!(b.defer_maintenance());
        assert!(!b.maintenance_due());
        b.delete(2, &(0..100).collect::<Vec<u64>>()).unwrap();
        // Nothing else runs it: the database's thread polls and maintains.
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(b.maintenance_due());
        b.maintain().unwrap();
        assert!(!b.maintenance_due());
        assert_eq!(b.len(), 300);
        assert!(!b.contains(5).unwrap() && b.contains(105).unwrap());
    }

    /// Fails every sync of a snapshot's temp file while set.
    struct FailSnapshotSync(AtomicBool);

    impl vectide_core::sync::SyncObserver for FailSnapshotSync {
        fn on_sync(&self, e: &vectide_core::sync::SyncEvent<'_>) -> vectide_core::SyncDecision {
            let ours = e.phase == vectide_core::sync::SyncPhase::Before
                && e.site == vectide_core::io::ATOMIC_WRITE_FILE;
            match ours && self.0.load(Ordering::SeqCst) {
                true => vectide_core::SyncDecision::Fail,
                false => vectide_core::SyncDecision::Proceed,
            }
        }
    }

    #[test]
    fn a_snapshot_whose_fsync_failed_is_tried_again_by_the_next_insert() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = BaselineParams::defaults(BaselineKind::Snap);
        p.snapshot_every = 100;
        let b = Baseline::create(dir.path(), BaselineKind::Snap, 4, Metric::L2, p).unwrap();
        let fail = Arc::new(FailSnapshotSync(AtomicBool::new(true)));
        let guard = vectide_core::sync::install_sync_observer(dir.path(), fail.clone());
        let v = rows(101, 4, 3);
        let ids: Vec<u64> = (0..100).collect();
        assert!(b.insert(1, &ids, &v[..400]).is_err(), "the failed fsync");
        assert_eq!(b.durable_seq(), 0);
        fail.0.store(false, Ordering::SeqCst);
        // One row: not 100 since the last snapshot, yet it takes one.
        b.insert(2, &[100], &v[400..]).unwrap();
        drop(guard);
        assert_eq!(b.durable_seq(), 2);
        drop(b);
        assert_eq!(Baseline::open(dir.path(), None).unwrap().len(), 101);
    }
}
