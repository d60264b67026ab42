//! The state of the SPANN-family engines (`spann`, `spann-inplace`,
//! `spfresh`), their locks and snapshots: [`Inner`], which every other room
//! works on and which imports none of them (the centroid index and the job
//! queue are rooms of their own below it). The face, the [`Spfresh`] handle
//! and its `VectorIndex` implementation, is `engine.rs`.
//!
//! ## State (all in RAM but the postings)
//! - the **centroid index** ([`Heads`]): an `hnsw` graph over the posting
//!   centroids, and the centroids by posting id;
//! - the **block store**: postings of `(vid, version, vector)` records in
//!   4 KiB blocks of `blocks.dat`;
//! - the **version map**: a byte per vector number (vid);
//! - the **id maps**: the caller's id of each vid, the sequence number of
//!   the insert that created it, a posting holding a current copy (`home`,
//!   what `get` reads), and id → vid of the live vectors.
//!
//! ## Locks
//! - `writer`: one writing call at a time (its WAL records written, then
//!   the change applied; the call waits for the WAL's sync after releasing
//!   it, group commit); a snapshot holds it while it switches the WAL
//!   and captures the state, and syncs the old WAL after releasing it (a
//!   write logged in the new WAL meanwhile is acknowledged once both are
//!   durable: `Writer::prev`);
//! - `gate`: held shared by every change to postings, versions and
//!   centroids (a call's apply, a Local Rebuilder job), exclusively by a
//!   snapshot's capture, so a snapshot never sees half a split or half a
//!   reassign;
//! - posting locks (striped): an APPEND, a split's or a merge's rewrite of
//!   a posting holds that posting's stripe. Searches take none of these.
//!
//! ## Durability (§4.4)
//! A writing call's records are written to the WAL before it is applied,
//! and synced (an `fdatasync` shared with the writers of the same moment)
//! before it returns: it is durable when it returns. Every `snapshot_rows` logged rows, once the
//! blocks released since the last snapshot exceed a third of those in
//! use (and of `GARBAGE_FLOOR`), at `close` and after `maintain`, a snapshot: a new WAL is started, the state captured under the
//! gate, the block file synced, `snapshot.bin` replaced atomically, and the
//! blocks released since the previous snapshot returned to the free pool.

use crate::blockstore::{BlockStore, ReadScratch};
use crate::heads::Heads;
use crate::jobs::Jobs;
use crate::layout::Records;
use crate::params::{Mode, SpannParams};
use crate::snapshot::{self, SnapHead};
use crate::versions::VersionMap;
use parking_lot::{Mutex, RwLock};
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use vectide_core::heap::{Candidate, TopK};
use vectide_core::poison::Poison;
use vectide_core::sync::SyncSite;
use vectide_core::{Error, IndexStats, Metric, Neighbor, Result};
use vectide_storage::block::BLOCK;
use vectide_storage::durable::RedoLog;

/// Sync site of the block file (at each snapshot).
pub const BLOCK_SYNC: SyncSite = SyncSite("spfresh.blocks");
/// The block file's name.
pub const BLOCKS: &str = "blocks.dat";
/// The snapshot's file name.
pub const SNAPSHOT: &str = "snapshot.bin";

/// The WAL of serial `s`.
pub fn wal_file(dir: &Path, s: u64) -> PathBuf {
    dir.join(format!("wal-{s}.log"))
}

/// A home word: the version of the copy and its posting.
pub(crate) fn home_word(pid: u32, version: u8) -> u64 {
    (u64::from(version & crate::versions::VERSION_MASK) << 32) | u64::from(pid)
}

/// A vector's home before it is placed.
pub(crate) const NO_HOME: u32 = u32::MAX;

/// Posting-lock stripes.
pub(crate) const STRIPES: usize = 1024;
/// Passes of `maintain()`'s sweep at most (each goes over every posting;
/// a pass that changes nothing ends it).
pub(crate) const SWEEP_ROUNDS: usize = 4;
/// A `spann` rebuild is due once the rows inserted or deleted since the
/// last build reach this share of the live vectors (Vectide's choice: a
/// quarter keeps the appended share of the postings small while the
/// rebuilds' total work stays within a few times the live set's).
pub const REBUILD_SHARE: f64 = 0.25;
/// The fewest rows that make a `spann` rebuild due (a small index is not
/// rebuilt every few writes).
pub const REBUILD_FLOOR: u64 = 1000;

/// The id maps (module docs).
#[derive(Default)]
pub(crate) struct Ids {
    pub ext: HashMap<u64, u32>,
    pub of_vid: Vec<u64>,
    pub seq_of: Vec<u64>,
}

/// The writer's side: the redo log in use (none when the database's
/// commit log is the only log) and its serial.
pub(crate) struct Writer {
    pub wal: Option<RedoLog>,
    /// The sync of the log a snapshot switched away from, while it may
    /// still run: a write logged in the log in use may have been shaped by
    /// one waiting in the old log (rows dropped as older than what an id
    /// holds, deletes of ids it holds), so it is acknowledged only once
    /// this is durable too (`Inner::await_logs`).
    pub prev: Option<vectide_storage::Pending>,
    pub serial: u64,
    /// Rows written since the last snapshot.
    pub rows: u64,
}

/// Counters the stats report.
#[derive(Default)]
pub(crate) struct Counters {
    pub inserts: AtomicU64,
    pub deletes: AtomicU64,
    /// Foreground inserts whose APPEND took a posting past the limit.
    pub split_triggers: AtomicU64,
    pub splits: AtomicU64,
    /// Splits that garbage collection alone brought under the limit.
    pub gc_only: AtomicU64,
    pub merges: AtomicU64,
    /// Postings the merge job rewrote without their dead records.
    pub collections: AtomicU64,
    pub reassign_evaluated: AtomicU64,
    pub reassign_moved: AtomicU64,
    pub reroutes: AtomicU64,
    pub cascade_max: AtomicU64,
    pub jobs_failed: AtomicU64,
    pub queries: AtomicU64,
    /// Searches that met a posting removed under them and started over.
    pub search_restarts: AtomicU64,
    pub postings_read: AtomicU64,
    pub blocks_read: AtomicU64,
    pub snapshots: AtomicU64,
    /// `spann` rebuilds swapped in.
    pub rebuilds: AtomicU64,
    /// The longest a rebuild's swap held the writer lock (µs), and the
    /// most vectors its last placement round (under that lock) placed.
    pub rebuild_swap_micros_max: AtomicU64,
    pub rebuild_last_round_max: AtomicU64,
    /// Reclaims that freed vector numbers, the numbers they freed, the
    /// postings they rewrote, the bytes those PUTs wrote and the time they
    /// took (`reclaim.rs`).
    pub reclaims: AtomicU64,
    pub reclaimed_vids: AtomicU64,
    pub reclaim_postings: AtomicU64,
    pub reclaim_bytes: AtomicU64,
    pub reclaim_micros: AtomicU64,
    /// Inserts that took a freed vector number.
    pub reused_vids: AtomicU64,
}

/// Per-thread buffers of searches, routing and jobs.
#[derive(Default)]
pub(crate) struct Scratch {
    pub read: ReadScratch,
    pub hits: Vec<Neighbor>,
    pub pids: Vec<u32>,
    pub cands: Vec<(f32, u32)>,
    pub sel: Vec<u32>,
    /// The incarnation of each posting in `sel` when it was routed to.
    pub sel_inc: Vec<u32>,
    /// Vectors a search has scored.
    pub seen: HashSet<u32>,
    /// (vector, version) pairs a garbage collection has kept.
    pub kept: HashSet<(u32, u8)>,
    pub top: Option<TopK>,
    pub sorted: Vec<Candidate>,
    pub recs: Records,
    pub qbuf: Vec<f32>,
    pub rec: Vec<u8>,
}

impl Scratch {
    /// The bytes its buffers hold (capacities; a hash set's entries plus
    /// its one control byte each).
    pub fn capacity_bytes(&self) -> usize {
        use std::mem::size_of;
        self.read.capacity_bytes()
            + self.hits.capacity() * size_of::<Neighbor>()
            + (self.pids.capacity() + self.sel.capacity() + self.sel_inc.capacity()) * 4
            + self.cands.capacity() * size_of::<(f32, u32)>()
            + self.seen.capacity() * (size_of::<u32>() + 1)
            + self.kept.capacity() * (size_of::<(u32, u8)>() + 1)
            + self.top.as_ref().map_or(0, TopK::capacity_bytes)
            + self.sorted.capacity() * size_of::<Candidate>()
            + self.recs.capacity_bytes()
            + self.qbuf.capacity() * 4
            + self.rec.capacity()
    }
}

pub(crate) struct Inner {
    pub dir: PathBuf,
    pub dim: usize,
    pub metric: Metric,
    pub mode: Mode,
    pub params: SpannParams,
    pub limit: usize,
    pub store: BlockStore,
    pub versions: VersionMap,
    pub ids: RwLock<Ids>,
    /// Per vid: `version << 32 | pid`, a posting holding its copy at that
    /// version (see [`Inner::set_home`]).
    pub homes: RwLock<Vec<AtomicU64>>,
    pub heads: Heads,
    pub locks: Vec<Mutex<()>>,
    pub gate: RwLock<()>,
    pub writer: Mutex<Writer>,
    pub snap_lock: Mutex<()>,
    /// Held by a compaction (one at a time).
    pub compact_lock: Mutex<()>,
    /// The newest sequence number applied (with `log=own`, written to the
    /// log first; its call returns once the log's `fdatasync` covers it):
    /// what a snapshot covers.
    pub durable: AtomicU64,
    /// With `log=own`, the newest sequence number whose call synced its
    /// log and returned: `durable_seq()`.
    pub synced: AtomicU64,
    /// The newest sequence number the last durable snapshot covers: with
    /// `log=database`, the durability watermark.
    pub covered: AtomicU64,
    pub jobs: Jobs,
    pub counters: Counters,
    pub scratches: Mutex<Vec<Scratch>>,
    pub pool: vectide_core::pools::Pool,
    pub threads: usize,
    pub last_error: Mutex<Option<String>>,
    /// Set when a logged write failed to apply or its log failed to sync
    /// (see [`vectide_core::poison`]).
    pub poison: Poison,
    /// The maintenance jobs running (splits, merges, snapshots, rebuilds).
    pub activity: vectide_core::activity::Activity,
    /// The changes ([`Inner::changes`]) applied when the input of the
    /// last `spann` build was taken: those a rebuild placed as it went
    /// (inserted or deleted while it ran) count as changes since.
    pub built_at: AtomicU64,
    /// The changes since the build that the snapshot an open read
    /// recorded (counted before this process's changes; 0 once a build
    /// completes here).
    pub carried: AtomicU64,
    /// The inserts and deletes counted when a `spann` rebuild last failed
    /// (`u64::MAX`: none since the last success): the next is due only
    /// [`REBUILD_FLOOR`] rows later, so a caller polling `rebuild_due`
    /// does not start a failing rebuild again every pass.
    pub rebuild_failed_at: AtomicU64,
    /// Set by `defer_maintenance` (and from the open with `log=database`):
    /// a holder (a database's maintenance thread) polls `rebuild_due` and
    /// runs the `spann` rebuild. Unset (a standalone index), the write
    /// that finds a rebuild due starts one itself (`update.rs`,
    /// `start_rebuild_if_due`).
    pub deferred: AtomicBool,
    /// A `spann` rebuild in progress (see `rebuild.rs`): the postings it
    /// builds beside the index in use, which no snapshot records, and the
    /// vectors inserted since it began, which it places again before it
    /// swaps its index in. `None` when no rebuild runs.
    pub rebuilding: Mutex<Option<Rebuilding>>,
    /// One rebuild at a time; a reclaim holds it too (see `reclaim.rs`).
    pub rebuild_lock: Mutex<()>,
    /// Vector numbers free for reuse: deleted, and no posting holds a
    /// record of them (`reclaim.rs`). In the snapshot.
    pub free: Mutex<Vec<u32>>,
    /// Held shared by every reader (search, get, distances) from its
    /// first read of a posting to its answer; a reclaim takes it
    /// exclusively for a moment before it frees numbers, so that no
    /// reader still holds a record of a number that a new vector takes.
    pub readers: RwLock<()>,
    /// Tests: the next catch-up round of a rebuild fails.
    #[cfg(test)]
    pub fail_catch_up: std::sync::atomic::AtomicBool,
}

/// What a `spann` rebuild in progress shares with writers and snapshots.
#[derive(Default)]
pub(crate) struct Rebuilding {
    /// Postings of the new index (not yet named by the centroids in use).
    pub building: HashSet<u32>,
    /// Vector numbers inserted since the rebuild began (until its new
    /// index is built, and those a writer failed to place in it), and
    /// their (normalised) rows.
    pub vids: Vec<u32>,
    pub data: Vec<f32>,
    /// (vector, new posting): the homes the rebuild gives at its swap (the
    /// homes in use keep naming the old postings until then, so that a
    /// snapshot taken meanwhile records homes it keeps).
    pub homes: Vec<(u32, u32)>,
    /// The new index once its build is done: from then on a writer places
    /// what it inserts in it too, under the writer lock, instead of
    /// adding to `vids` for the rebuild to place. The rebuild then places
    /// a backlog that no longer grows, so the round under the writer lock
    /// at its swap is empty; before, writers could outrun its rounds
    /// (session 45: 2,040 vectors placed in a swap that held the writers
    /// for 1.86 s).
    pub heads: Option<std::sync::Arc<Heads>>,
}

impl Inner {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        dir: &Path,
        dim: usize,
        metric: Metric,
        mode: Mode,
        params: SpannParams,
        store: BlockStore,
        versions: VersionMap,
        writer: Writer,
    ) -> Result<Inner> {
        let threads = params
            .threads
            .unwrap_or_else(rayon::current_num_threads)
            .max(1);
        let pool = vectide_core::engine::pool_of("spann", threads)?;
        // A database's index (its log) always has a holder, from its
        // log's replay on: the replay's writes must not start a rebuild.
        let deferred = AtomicBool::new(params.external_log);
        Ok(Inner {
            dir: dir.to_path_buf(),
            dim,
            metric,
            mode,
            limit: params.posting_limit(dim),
            heads: Heads::new(dim, threads)?,
            params,
            store,
            versions,
            ids: RwLock::new(Ids::default()),
            homes: RwLock::new(Vec::new()),
            locks: (0..STRIPES).map(|_| Mutex::new(())).collect(),
            gate: RwLock::new(()),
            writer: Mutex::new(writer),
            snap_lock: Mutex::new(()),
            compact_lock: Mutex::new(()),
            durable: AtomicU64::new(0),
            synced: AtomicU64::new(0),
            covered: AtomicU64::new(0),
            jobs: Jobs::default(),
            counters: Counters::default(),
            scratches: Mutex::new(Vec::new()),
            pool,
            threads,
            last_error: Mutex::new(None),
            poison: Poison::default(),
            activity: Default::default(),
            built_at: AtomicU64::new(0),
            carried: AtomicU64::new(0),
            rebuild_failed_at: AtomicU64::new(u64::MAX),
            deferred,
            rebuilding: Mutex::new(None),
            rebuild_lock: Mutex::new(()),
            free: Mutex::new(Vec::new()),
            readers: RwLock::new(()),
            #[cfg(test)]
            fail_catch_up: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// The lock of posting `pid`'s stripe.
    pub(crate) fn lock(&self, pid: u32) -> parking_lot::MutexGuard<'_, ()> {
        self.locks[pid as usize % STRIPES].lock()
    }

    pub(crate) fn stripe(pid: u32) -> usize {
        pid as usize % STRIPES
    }

    pub(crate) fn scratch(&self) -> Scratch {
        self.scratches.lock().pop().unwrap_or_default()
    }

    /// The bytes the pooled scratches hold.
    pub(crate) fn scratch_bytes(&self) -> usize {
        self.scratches
            .lock()
            .iter()
            .map(Scratch::capacity_bytes)
            .sum()
    }

    /// Runs `f` with a scratch of the pool, given back after it.
    pub(crate) fn with_scratch<T>(&self, f: impl FnOnce(&mut Scratch) -> T) -> T {
        let mut sc = self.scratch();
        let r = f(&mut sc);
        self.give_back(sc);
        r
    }

    pub(crate) fn give_back(&self, sc: Scratch) {
        let mut s = self.scratches.lock();
        if s.len() < 4 * self.threads + 4 {
            s.push(sc);
        }
    }

    /// Makes posting `pid`, which holds `vid`'s copy at `version`, its
    /// home, unless the home already names a copy that stands higher (see
    /// [`VersionMap::standing`]: a pending copy above a current one, a
    /// current one above a stale one). A job that copied a vector before a
    /// reassign moved it cannot point the home back at the old copy: the
    /// reassign's pending home outranks it, and once the switch is made
    /// the old version no longer stands at all.
    pub(crate) fn set_home(&self, vid: u32, pid: u32, version: u8) {
        let homes = self.homes.read();
        let Some(h) = homes.get(vid as usize) else {
            return;
        };
        let word = home_word(pid, version);
        let mut cur = h.load(Ordering::Acquire);
        loop {
            let mine = self.versions.standing(vid, version);
            let theirs = self.versions.standing(vid, (cur >> 32) as u8);
            let placed = cur as u32 != NO_HOME;
            if mine == 0 || (placed && theirs > mine) {
                return;
            }
            match h.compare_exchange_weak(cur, word, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return,
                Err(now) => cur = now,
            }
        }
    }

    /// The home posting of `vid` ([`NO_HOME`] before it is placed).
    pub(crate) fn home(&self, vid: u32) -> Option<u32> {
        self.homes
            .read()
            .get(vid as usize)
            .map(|h| h.load(Ordering::Acquire) as u32)
    }

    /// Whether a `spann` rebuild is due: the rows inserted or deleted
    /// since the last build reach [`REBUILD_SHARE`] of the live vectors
    /// (at least [`REBUILD_FLOOR`]), and none runs. The database's and the
    /// server's background pass polls it and runs `maintain()` (the
    /// engine's `defer_maintenance`); before, a `spann` collection there
    /// never rebuilt, its postings growing by appends from its first build
    /// on (a bulk load into an empty collection: about a hundred postings
    /// of a thousand vectors each).
    pub(crate) fn rebuild_due(&self) -> bool {
        !self.rebuild_lock.is_locked() && self.rebuild_counts_due()
    }

    /// [`Inner::rebuild_due`] but for the rebuild lock: whether the
    /// changes since the build make a rebuild due (for a caller holding
    /// the lock).
    pub(crate) fn rebuild_counts_due(&self) -> bool {
        if self.mode != Mode::Static {
            return false;
        }
        let changes = self.changes();
        let failed = self.rebuild_failed_at.load(Ordering::Relaxed);
        if failed != u64::MAX && changes.saturating_sub(failed) < REBUILD_FLOOR {
            return false;
        }
        let since = self.changes_since_build();
        let live = self.ids.read().ext.len() as f64;
        since >= REBUILD_FLOOR.max((live * REBUILD_SHARE) as u64)
    }

    /// Records that the index is as built (`spann`'s `maintain` rebuilds
    /// only after updates since).
    pub(crate) fn mark_built(&self) {
        self.built_at.store(self.changes(), Ordering::Relaxed);
        self.carried.store(0, Ordering::Relaxed);
    }

    /// Changes applied since the input of the last `spann` build was taken
    /// (what [`Inner::rebuild_due`] weighs).
    pub(crate) fn changes_since_build(&self) -> u64 {
        (self.changes() + self.carried.load(Ordering::Relaxed))
            .saturating_sub(self.built_at.load(Ordering::Relaxed))
    }

    /// Inserts and deletes applied so far (since the open).
    pub(crate) fn changes(&self) -> u64 {
        let c = &self.counters;
        c.inserts.load(Ordering::Relaxed) + c.deletes.load(Ordering::Relaxed)
    }

    /// Squared L2, the routing distance (centroids, replica rule, NPA).
    pub(crate) fn l2(&self) -> vectide_core::metric::DistanceFn {
        Metric::L2.distance_fn()
    }

    pub(crate) fn note_error(&self, e: &Error) {
        self.counters.jobs_failed.fetch_add(1, Ordering::Relaxed);
        *self.last_error.lock() = Some(e.to_string());
    }

    /// Takes a snapshot (module docs). One at a time. Refused once
    /// poisoned: the state in memory lacks a logged write, and the
    /// snapshot would cover it and drop the log that holds it.
    ///
    /// Writers wait only for the capture (the mapping, the id and version
    /// maps, the centroids, encoded in memory): the next log is created
    /// before it and the block file and the snapshot are synced after it.
    pub(crate) fn snapshot(&self) -> Result<()> {
        self.poison.check()?;
        let _one = self.snap_lock.lock();
        let _job = self.activity.begin("snapshot");
        // Only a snapshot moves the serial, and this one holds `snap_lock`.
        let next = self.writer.lock().serial + 1;
        // Under the database, its commit log holds the writes: no log of
        // our own is started (nor synced into existence).
        let wal = match self.params.external_log {
            true => None,
            false => {
                let (wal, old) = RedoLog::open(&wal_file(&self.dir, next), self.dim)?;
                if !old.ops.is_empty() || old.torn {
                    return Err(Error::corrupted(format!(
                        "wal-{next}.log exists beyond the WAL in use"
                    )));
                }
                vectide_core::io::sync_dir(&self.dir)?;
                Some(wal)
            }
        };
        let mut w = self.writer.lock();
        // Writes poison under the writer lock (a failed log write or apply):
        // checked again here, such a write is not covered. (A failed sync
        // poisons after the lock; the write it covers is applied and may be
        // covered, which loses nothing.)
        self.poison.check()?;
        // The old log's writes go to its file here, and its sync runs after
        // the writer lock is released: the writes logged next in the new
        // log wait for it before they are acknowledged (`Writer::prev`), so
        // no writer stands behind an fsync to log and apply.
        let old_sync = match w.wal.as_mut() {
            Some(old) => Some(old.pending().map_err(|e| {
                self.poison
                    .poison("the write of the log before a snapshot", &e)
            })?),
            None => None,
        };
        w.prev = old_sync.clone();
        let prev = w.serial;
        w.wal = wal;
        w.serial = next;
        w.rows = 0;
        let covered = self.durable.load(Ordering::Acquire);
        let bytes = {
            let _g = self.gate.write();
            let head = SnapHead {
                mode: self.mode,
                metric: self.metric,
                dim: self.dim,
                params: self.params.clone(),
                serial: next,
                covered_seq: covered,
                since_build: self.changes_since_build(),
            };
            // A rebuild's new postings are not recorded (no centroid in
            // use names them yet; the vectors are in the old ones), nor
            // homes in them.
            let building = self
                .rebuilding
                .lock()
                .as_ref()
                .map(|r| r.building.clone())
                .unwrap_or_default();
            let mut map = Vec::new();
            self.store.capture(&mut map, &building)?;
            let ids = self.ids.read();
            let homes: Vec<u32> = self
                .homes
                .read()
                .iter()
                .map(|h| match h.load(Ordering::Relaxed) as u32 {
                    p if building.contains(&p) => NO_HOME,
                    p => p,
                })
                .collect();
            let cents = self.heads.read();
            let centroids: Vec<Option<&[f32]>> =
                (0..cents.len()).map(|p| cents.get(p as u32)).collect();
            // A reclaim frees numbers only after its PUTs: every number in
            // the list has no record in the mapping captured above.
            let free = self.free.lock();
            snapshot::encode(
                &head,
                &snapshot::Vids {
                    ext: &ids.of_vid,
                    seqs: &ids.seq_of,
                    homes: &homes,
                    versions: &self.versions,
                    free: &free,
                },
                &centroids,
                &map,
            )
        };
        drop(w);
        if let Some(t) = old_sync {
            t.wait().map_err(|e| {
                self.store.snapshot_abandoned();
                self.poison
                    .poison("the sync of the log before a snapshot", &e)
            })?;
            // Durable now: later writes need not look at it (snapshots run
            // one at a time, so `prev` is still this one's).
            self.writer.lock().prev = None;
        }
        self.store.sync_capture()?;
        let path = self.dir.join(SNAPSHOT);
        match snapshot::ENVELOPE.write(&path, &bytes) {
            Ok(()) => {
                self.store.snapshot_durable();
                self.covered.fetch_max(covered, Ordering::AcqRel);
                self.counters.snapshots.fetch_add(1, Ordering::Relaxed);
                // A file mostly free is compacted by a job; the snapshot
                // after it cuts the freed end off.
                if self.store.compaction_due() {
                    self.jobs.push(crate::jobs::Job::Compact);
                }
                for s in (1..=prev).rev() {
                    let f = wal_file(&self.dir, s);
                    if !f.exists() {
                        break;
                    }
                    let _ = std::fs::remove_file(&f);
                }
                Ok(())
            }
            Err(e) => {
                self.store.snapshot_abandoned();
                Err(e)
            }
        }
    }
}

/// What the postings hold, from a full read ([`Spfresh::census`]).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Census {
    pub postings: u64,
    /// Records stored.
    pub records: u64,
    /// Current records (copies a search must read).
    pub current: u64,
    /// Postings without a current record.
    pub empty: u64,
    /// Live vectors.
    pub live: u64,
}

impl Census {
    /// Current copies per live vector (SPANN's replication).
    pub fn copies_per_vector(&self) -> f64 {
        self.current as f64 / self.live.max(1) as f64
    }
}

impl Inner {
    pub(crate) fn census(&self) -> Result<Census> {
        let pids: Vec<u32> = (0..self.store.posting_ids())
            .filter(|&p| self.store.entry(p).is_some())
            .collect();
        let mut c = Census {
            postings: pids.len() as u64,
            live: self.ids.read().ext.len() as u64,
            ..Census::default()
        };
        self.store.scan(&pids, |_, recs| {
            let cur = (0..recs.len())
                .filter(|&j| self.versions.is_current(recs.vids[j], recs.versions[j]))
                .count() as u64;
            c.records += recs.len() as u64;
            c.current += cur;
            c.empty += u64::from(cur == 0);
            Ok(())
        })?;
        Ok(c)
    }

    /// The contract's `maintain()`: the queued jobs run out; then a `spann`
    /// index is rebuilt statically from its live vectors when updates have
    /// changed it since its build, and `spfresh` sweeps: every posting gets
    /// the merge job's check (merged when small, its garbage collected
    /// whenever that saves a block), the jobs that queues run out, again
    /// while a pass changes anything (`spann-inplace` has neither). Then a
    /// snapshot returns the blocks the rebuild, the sweep or the drained
    /// jobs released, and a file left mostly free is compacted
    /// (`give_blocks_back`). Searches queue those
    /// checks lazily as they meet postings (§3.2); after a sweep none is
    /// left for the next searches to run in the background.
    pub(crate) fn maintain(&self) -> Result<()> {
        self.drain_jobs()?;
        match self.mode {
            Mode::Static => {
                self.rebuild_static()?;
                // The old index's postings went: their blocks come back
                // as after a sweep.
                self.give_space_back()
            }
            Mode::Fresh => {
                // A merge's reassigns can leave another posting small, so
                // the sweep goes again while it changes anything.
                let changes = || {
                    let c = &self.counters;
                    c.merges.load(Ordering::Relaxed) + c.collections.load(Ordering::Relaxed)
                };
                let _job = self.activity.begin("sweep");
                let mut sc = self.scratch();
                let swept = (|| {
                    for _ in 0..SWEEP_ROUNDS {
                        let before = changes();
                        for p in 0..self.store.posting_ids() {
                            if self.store.entry(p).is_some() {
                                self.merge(p, true, &mut sc)?;
                            }
                        }
                        self.drain_jobs()?;
                        if changes() == before {
                            break;
                        }
                    }
                    Ok::<(), Error>(())
                })();
                self.give_back(sc);
                swept?;
                self.give_space_back()
            }
            // Postings only grow (no splits); the jobs drained above
            // released blocks a snapshot returns.
            Mode::Inplace => self.give_space_back(),
        }
    }

    /// `maintain()`'s end: every dead vector number's records dropped (a
    /// reclaim, due or not: the background one waits for a quarter of the
    /// live count), the blocks that and the jobs before released returned
    /// by a snapshot, and the file compacted once an eighth of it is free
    /// (the background jobs wait for a quarter). What the background jobs
    /// leave for the next writes to reuse, the explicit call gives back:
    /// before, a `spann-inplace` collection through the server settled at
    /// 1.18 times its disk reference after a 10-minute churn, its postings
    /// holding the records of 4% of its numbers dead and a quarter of its
    /// file free.
    fn give_space_back(&self) -> Result<()> {
        if self.dead_unfree().0 > 0 {
            self.with_scratch(|sc| self.reclaim_now(sc))?;
        }
        self.give_blocks_back_at(crate::blockstore::MAINTAIN_COMPACT_SHARE)
    }

    /// A snapshot when blocks are held, which frees them; then, if that
    /// left the file mostly free, a compaction (whose own snapshot cuts
    /// the end off).
    pub(crate) fn give_blocks_back(&self) -> Result<()> {
        self.give_blocks_back_at(crate::blockstore::COMPACT_SHARE)
    }

    /// [`Inner::give_blocks_back`], compacting once more than a `1/share`
    /// of the file is free.
    fn give_blocks_back_at(&self, share: u64) -> Result<()> {
        // Held blocks come back with a snapshot; none held (a rebuild
        // ends with its own snapshot), none needed.
        if self.store.held() > 0 {
            self.snapshot()?;
        }
        if self.store.compaction_due_at(share) {
            self.with_scratch(|sc| self.compact_at(sc, share))?;
        }
        Ok(())
    }

    pub(crate) fn stats(&self) -> Result<IndexStats> {
        let st = self.store.stats();
        let c = &self.counters;
        let live = self.ids.read().ext.len();
        let vids = self.versions.len() as usize;
        let free = self.free.lock().len();
        let queries = c.queries.load(Ordering::Relaxed).max(1) as f64;
        let inserts = c.inserts.load(Ordering::Relaxed);
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64;
        let mut max_len = 0u32;
        let mut sum_len = 0u64;
        for p in 0..self.store.posting_ids() {
            if let Some(e) = self.store.entry(p) {
                max_len = max_len.max(e.records);
                sum_len += u64::from(e.records);
            }
        }
        let mut extra = vec![
            ("postings".to_string(), st.postings as f64),
            // The id space (live postings and the free ids below it).
            ("posting_ids".into(), f64::from(self.store.posting_ids())),
            // What a `spann` rebuild is due on (`rebuild_due`).
            (
                "changes_since_build".into(),
                self.changes_since_build() as f64,
            ),
            ("centroids".into(), self.heads.count() as f64),
            ("posting_limit".into(), self.limit as f64),
            ("posting_records_max".into(), f64::from(max_len)),
            (
                "posting_records_mean".into(),
                sum_len as f64 / st.postings.max(1) as f64,
            ),
            ("blocks_used".into(), st.blocks_used as f64),
            ("blocks_free".into(), st.blocks_free as f64),
            ("blocks_held".into(), st.blocks_held as f64),
            ("inserts".into(), inserts as f64),
            ("deletes".into(), load(&c.deletes)),
            ("split_triggers".into(), load(&c.split_triggers)),
            (
                "split_fraction".into(),
                load(&c.split_triggers) / inserts.max(1) as f64,
            ),
            ("splits".into(), load(&c.splits)),
            ("gc_only_splits".into(), load(&c.gc_only)),
            ("merges".into(), load(&c.merges)),
            ("collections".into(), load(&c.collections)),
            ("reassign_evaluated".into(), load(&c.reassign_evaluated)),
            ("reassign_moved".into(), load(&c.reassign_moved)),
            ("reroutes".into(), load(&c.reroutes)),
            ("cascade_max".into(), load(&c.cascade_max)),
            ("jobs_failed".into(), load(&c.jobs_failed)),
            ("snapshots".into(), load(&c.snapshots)),
            ("rebuilds".into(), load(&c.rebuilds)),
            (
                "rebuild_swap_seconds_max".into(),
                load(&c.rebuild_swap_micros_max) / 1e6,
            ),
            (
                "rebuild_last_round_max".into(),
                load(&c.rebuild_last_round_max),
            ),
            ("queries".into(), load(&c.queries)),
            ("search_restarts".into(), load(&c.search_restarts)),
            (
                "postings_per_query".into(),
                load(&c.postings_read) / queries,
            ),
            ("blocks_per_query".into(), load(&c.blocks_read) / queries),
            (
                "bytes_per_query".into(),
                load(&c.blocks_read) * BLOCK as f64 / queries,
            ),
            ("cas_retries".into(), st.cas_retries as f64),
            ("read_retries".into(), st.read_retries as f64),
            ("tail_cache_hits".into(), st.tail_hits as f64),
            ("tail_cache_misses".into(), st.tail_misses as f64),
            ("block_file_trims".into(), st.trims as f64),
            ("postings_compacted".into(), st.compacted as f64),
            ("vids".into(), vids as f64),
            ("vids_free".into(), free as f64),
            ("vids_reused".into(), load(&c.reused_vids)),
            ("reclaims".into(), load(&c.reclaims)),
            ("reclaimed_vids".into(), load(&c.reclaimed_vids)),
            (
                "reclaim_postings_rewritten".into(),
                load(&c.reclaim_postings),
            ),
            ("reclaim_bytes_written".into(), load(&c.reclaim_bytes)),
            ("reclaim_seconds".into(), load(&c.reclaim_micros) / 1e6),
        ];
        let scratch = self.scratch_bytes();
        extra.push(("scratch_bytes".into(), scratch as f64));
        let io = self.store.io_stats();
        let mut stats = IndexStats {
            live,
            slots_used: vids,
            capacity: vids,
            // Dead numbers a reclaim has not freed yet.
            pending_deletes: vids - live - free.min(vids - live),
            memory_bytes: vids * (1 + 8 + 8 + 4)
                + live * 24
                + self.heads.memory_bytes()
                + self.store.posting_ids() as usize * 48
                + st.tail_bytes as usize
                + scratch,
            disk_bytes: st.blocks_end * BLOCK as u64,
            reads: io.reads,
            bytes_read: io.blocks_read * BLOCK as u64,
            round_trips: io.batches,
            pending_background: self.jobs.pending(),
            consolidations: c.splits.load(Ordering::Relaxed) + c.merges.load(Ordering::Relaxed),
            extra,
            ..IndexStats::default()
        };
        self.activity.fill(&mut stats);
        Ok(stats)
    }

    /// The structural check: every posting has a centroid and every
    /// centroid a posting; every live vector has a current record in some
    /// posting, its home among them; no current record names a deleted or
    /// unknown vector.
    ///
    /// It waits for a `spann` rebuild in progress and holds the next one
    /// (and a reclaim) off: the postings a rebuild builds beside the
    /// index in use have no centroid in use until its swap, and were
    /// reported as "stored but no centroid".
    pub(crate) fn check_structure(&self) -> Result<Vec<String>> {
        let _no_rebuild = self.rebuild_lock.lock();
        let _g = self.gate.write();
        let mut problems = Vec::new();
        let n = self.store.posting_ids();
        let mut pids = Vec::new();
        {
            let cents = self.heads.read();
            for p in 0..n.max(cents.len() as u32) {
                let has_post = self.store.entry(p).is_some();
                let has_cent = cents.get(p).is_some();
                if has_post != has_cent {
                    problems.push(format!(
                        "posting {p}: {} but {}",
                        if has_post { "stored" } else { "absent" },
                        if has_cent {
                            "has a centroid"
                        } else {
                            "no centroid"
                        }
                    ));
                }
                if has_post {
                    pids.push(p);
                }
            }
        }
        let ids = self.ids.read();
        let vids = self.versions.len() as usize;
        let mut found = vec![false; vids];
        let mut home_ok = vec![false; vids];
        let mut is_free = vec![false; vids];
        for &v in self.free.lock().iter() {
            match is_free.get_mut(v as usize) {
                Some(f) if !*f => *f = true,
                Some(_) => problems.push(format!("vector {v} is free twice")),
                None => problems.push(format!("free vector {v} was never numbered")),
            }
            if self.versions.get(v).is_some_and(|s| !s.deleted) {
                problems.push(format!("vector {v} is free but live"));
            }
        }
        self.store.scan(&pids, |pid, recs| {
            // A `spann` posting holds a vector's copy once. (In `spfresh`
            // the Local Rebuilder's reassigns can leave two copies of one
            // version in a posting: space only, since a search counts a
            // vector once; seen before session 43's changes too, and left
            // alone.)
            let mut copies = HashSet::with_capacity(recs.len());
            for j in 0..recs.len() {
                let v = recs.vids[j];
                if self.mode != Mode::Fresh && !copies.insert((v, recs.versions[j])) {
                    problems.push(format!(
                        "posting {pid}: two records of vector {v} at version {}",
                        recs.versions[j]
                    ));
                }
                if (v as usize) >= vids {
                    problems.push(format!("posting {pid}: record of unknown vector {v}"));
                    continue;
                }
                if is_free[v as usize] {
                    problems.push(format!(
                        "posting {pid}: a record of vector {v}, which is free"
                    ));
                }
                if self.versions.is_current(v, recs.versions[j]) {
                    found[v as usize] = true;
                    if self.home(v) == Some(pid) {
                        home_ok[v as usize] = true;
                    }
                }
            }
            Ok(())
        })?;
        for (&id, &v) in &ids.ext {
            if !found[v as usize] {
                problems.push(format!("id {id} (vector {v}) has no current record"));
            } else if !home_ok[v as usize] {
                problems.push(format!(
                    "id {id} (vector {v}): its home holds no current copy"
                ));
            }
            if self.versions.get(v).is_none_or(|s| s.deleted) {
                problems.push(format!("id {id} (vector {v}) is live but marked deleted"));
            }
        }
        if ids.of_vid.len() != vids || ids.seq_of.len() != vids {
            problems.push(format!(
                "{} vector numbers but {} ids and {} sequence numbers",
                vids,
                ids.of_vid.len(),
                ids.seq_of.len()
            ));
        }
        problems.truncate(100);
        Ok(problems)
    }
}
