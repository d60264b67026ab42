//! The Updater (SPFresh §4.1): an insert is logged, then each vector goes
//! to up to `replicas` postings chosen by SPANN's replica rule among its
//! nearest centroids and is APPENDed there as `(vid, version, vector)`; a
//! delete is logged, then a tombstone in the version map (no disk I/O).
//! A posting pushed past the split limit by an APPEND queues a split
//! (`spfresh` only). An APPEND that finds its posting gone (a concurrent
//! split or merge removed it) routes the vector again.

use crate::blockstore::Swap;
use crate::builder::rng_select;
use crate::heads::Heads;
use crate::jobs::Job;
use crate::layout::encode_record;
use crate::params::Mode;
use crate::state::{home_word, Inner, Scratch, NO_HOME};
use rayon::prelude::*;
use std::sync::atomic::{AtomicU64, Ordering};
use vectide_core::fault::{self, FaultSite};
use vectide_core::validate::{normalize, Checked};
use vectide_core::{Error, Result, Seq};
use vectide_storage::durable::{await_sync, select_rows};
use vectide_storage::Pending;

/// Route attempts before a vector gets a posting of its own.
const MAX_REROUTES: usize = 8;

/// Batches of fewer rows are placed on the caller's thread.
const INLINE_ROWS: usize = 4;

/// The fault point between an insert's log and its apply (tests of the
/// poisoned state).
pub const APPLY_FAULT: FaultSite = FaultSite("spfresh.apply");

/// Released blocks below which no snapshot is taken for the garbage
/// alone (16 MiB of 4 KiB blocks).
pub(crate) const GARBAGE_FLOOR: u64 = 4096;

/// A snapshot is overdue at this many times its trigger: the background
/// job is held up (behind a long reclaim or compaction, or by a shared
/// pool busy with other indexes), and the writer that finds it so takes
/// the snapshot itself, as a writer runs a reclaim that lags.
const OVERDUE: u64 = 2;

/// How pressing a snapshot is after a write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SnapshotNeed {
    No,
    Due,
    Overdue,
}

impl Inner {
    /// Rows of `ids` newer than what the index holds of them.
    fn newer_rows(&self, seq: Seq, ids: &[u64]) -> Vec<usize> {
        let m = self.ids.read();
        ids.iter()
            .enumerate()
            .filter(|(_, id)| {
                m.ext
                    .get(id)
                    .is_none_or(|&v| m.seq_of.get(v as usize).is_none_or(|&s| seq > s))
            })
            .map(|(i, _)| i)
            .collect()
    }

    /// The contract's insert: validated, logged, applied, and synced
    /// before it returns (the `fdatasync` outside the writer lock, shared
    /// with the writers that logged meanwhile: group commit, `wal.rs`). A
    /// failure of the log, its sync or the apply poisons the index (its
    /// state may then differ from its log).
    pub(crate) fn insert(&self, seq: Seq, batch: Checked<'_>) -> Result<()> {
        let (ids, vectors) = (batch.ids(), batch.vectors());
        let mut w = self.writer.lock();
        self.poison.check()?;
        let rows = self.newer_rows(seq, ids);
        let (ids, vectors) = select_rows(self.dim, ids, vectors, &rows);
        let pending = match &mut w.wal {
            Some(wal) => Some(
                wal.write_insert(seq, &ids, &vectors)
                    .map_err(|e| self.poison.poison(&format!("the log of write {seq}"), &e))?,
            ),
            None => None,
        };
        w.rows += ids.len() as u64;
        let applied = fault::hit(&self.dir, APPLY_FAULT)
            .and_then(|()| self.apply_insert(seq, &ids, &vectors))
            .map_err(|e| self.poison.poison(&format!("the apply of write {seq}"), &e));
        if applied.is_ok() {
            // Only an applied write may be covered by a snapshot.
            self.durable.fetch_max(seq, Ordering::AcqRel);
        }
        let snap = self.snapshot_need(w.rows);
        let prev = w.prev.clone();
        drop(w);
        self.await_logs(prev, pending, seq)?;
        self.synced.fetch_max(seq, Ordering::AcqRel);
        applied?;
        self.after_write(snap)
    }

    /// The contract's delete: logged, tombstones (which cannot fail), then
    /// synced as an insert is.
    pub(crate) fn delete(&self, seq: Seq, ids: &[u64]) -> Result<usize> {
        let mut w = self.writer.lock();
        self.poison.check()?;
        let targets: Vec<u64> = {
            let m = self.ids.read();
            let mut seen = std::collections::HashSet::new();
            ids.iter()
                .copied()
                .filter(|id| {
                    m.ext.get(id).is_some_and(|&v| m.seq_of[v as usize] <= seq) && seen.insert(*id)
                })
                .collect()
        };
        let pending = match &mut w.wal {
            Some(wal) => Some(
                wal.write_delete(seq, &targets)
                    .map_err(|e| self.poison.poison(&format!("the log of write {seq}"), &e))?,
            ),
            None => None,
        };
        w.rows += targets.len() as u64;
        let n = self.apply_delete(seq, &targets);
        self.durable.fetch_max(seq, Ordering::AcqRel);
        let snap = self.snapshot_need(w.rows);
        let prev = w.prev.clone();
        drop(w);
        self.await_logs(prev, pending, seq)?;
        self.synced.fetch_max(seq, Ordering::AcqRel);
        self.after_write(snap)?;
        Ok(n)
    }

    /// Waits until write `seq` is durable: its own log's sync (`pending`,
    /// shared with the writers of the same moment) and, while a snapshot
    /// has just switched logs, the old log's (`prev`: see `Writer::prev`).
    fn await_logs(&self, prev: Option<Pending>, pending: Option<Pending>, seq: Seq) -> Result<()> {
        await_sync(prev, &self.poison, seq)?;
        await_sync(pending, &self.poison, seq)
    }

    /// A snapshot is due after `rows` logged rows, or once the blocks
    /// released since the last one exceed a third of the blocks in use
    /// (and of [`GARBAGE_FLOOR`]; `blockstore::HELD_SHARE`): every APPEND rewrites a posting's last block
    /// into a fresh one and every rebuild job rewrites whole postings, and
    /// the old blocks may only be reused after a snapshot (§4.4), so
    /// without this the file grew by a block per append between
    /// snapshots (measured: 2.5 GB for 110 MB of postings after the GloVe
    /// stream of `bench spfresh`).
    pub(crate) fn snapshot_due(&self, rows: u64) -> bool {
        self.snapshot_need(rows) != SnapshotNeed::No
    }

    /// [`Inner::snapshot_due`], and whether the snapshot is [`OVERDUE`].
    pub(crate) fn snapshot_need(&self, rows: u64) -> SnapshotNeed {
        let times = (rows / self.params.snapshot_rows).max(self.store.held_over(GARBAGE_FLOOR));
        match times {
            0 => SnapshotNeed::No,
            t if t >= OVERDUE => SnapshotNeed::Overdue,
            _ => SnapshotNeed::Due,
        }
    }

    /// After a write: a snapshot when one is due (queued for the background
    /// jobs, or taken here when they run inline), and the queued jobs when
    /// they run inline.
    fn after_write(&self, snapshot: SnapshotNeed) -> Result<()> {
        let r = self.after_write_jobs(snapshot);
        self.start_rebuild_if_due();
        r
    }

    /// [`Inner::after_write`] but for the rebuild.
    fn after_write_jobs(&self, snapshot: SnapshotNeed) -> Result<()> {
        match self.reclaim_lag() {
            0 => {}
            // Far behind (the background drain starved by a busy queue or
            // by the cores): this writer runs it, as a backstop.
            lag if lag >= 4 && !self.params.rebuild_inline => {
                self.with_scratch(|sc| self.reclaim(sc))?;
            }
            _ => self.jobs.push(Job::Reclaim),
        }
        if self.params.rebuild_inline {
            self.drain_jobs()?;
            if snapshot != SnapshotNeed::No {
                self.snapshot()?;
            }
            return Ok(());
        }
        match snapshot {
            SnapshotNeed::No => {}
            // The backstop, unless a snapshot is running (it gives the
            // blocks back soon). Its failure is the job's, not this
            // write's (which is durable already): recorded, as a job's.
            SnapshotNeed::Overdue if !self.snap_lock.is_locked() => {
                if let Err(e) = self.snapshot() {
                    self.note_error(&e);
                }
            }
            // The background job takes it: the writer that found it due
            // waits neither for its capture nor for its syncs.
            _ => self.jobs.push(Job::Snapshot),
        }
        Ok(())
    }

    /// A `spann` index that no holder rebuilds (none called
    /// `defer_maintenance`: a standalone index) starts its due rebuild
    /// itself: in the background, or in this writer when jobs run
    /// inline. Before, only a caller's `maintain()` rebuilt it, and a
    /// standalone index under churn never was: in a 10-minute soak its
    /// postings went from about 12,000 of 15 records to 637 of 230, and
    /// its disk over live vectors from the reference to 1.67 times it.
    /// A failed rebuild is recorded, not this write's error (the write is
    /// durable already).
    pub(crate) fn start_rebuild_if_due(&self) {
        if self.mode != Mode::Static || self.deferred.load(Ordering::Acquire) || !self.rebuild_due()
        {
            return;
        }
        if self.params.rebuild_inline {
            // One writer rebuilds; one that finds it running goes on.
            if let Err(e) = self.rebuild_static_if_due() {
                self.note_error(&e);
            }
        } else {
            self.jobs.start_rebuild();
        }
    }

    /// The snapshot job: a snapshot if one is still due (one taken since
    /// the job was queued, by an earlier job or a flush, may have made this
    /// one moot).
    pub(crate) fn snapshot_if_due(&self) -> Result<()> {
        let rows = self.writer.lock().rows;
        match self.snapshot_due(rows) {
            true => self.snapshot(),
            false => Ok(()),
        }
    }

    /// Applies an insert of rows newer than the index's (the live path and
    /// the WAL replay): vector numbers (freed ones first, from the end of
    /// the free list; new ones after), then the static build of a first
    /// load or the placement of each vector. Freed numbers are taken while
    /// a `spann` rebuild runs too: a vector the rebuild read is not placed
    /// again (`rebuild.rs`, `build_beside`).
    pub(crate) fn apply_insert(&self, seq: Seq, ids: &[u64], vectors: &[f32]) -> Result<()> {
        let n = ids.len();
        if n == 0 {
            return Ok(());
        }
        let dim = self.dim;
        let mut data = vectors.to_vec();
        if self.metric.normalizes() {
            data.chunks_exact_mut(dim).for_each(normalize);
        }
        let _g = self.gate.read();
        // Free numbers are taken while a `spann` rebuild runs too (see
        // `build_beside`).
        let vids = {
            let mut m = self.ids.write();
            let mut vids = Vec::with_capacity(n);
            {
                let mut free = self.free.lock();
                let homes = self.homes.read();
                while vids.len() < n {
                    let Some(v) = free.pop() else { break };
                    if !self.versions.revive(v) {
                        return Err(Error::invalid(format!("free vector number {v} is live")));
                    }
                    m.of_vid[v as usize] = ids[vids.len()];
                    m.seq_of[v as usize] = seq;
                    homes[v as usize].store(home_word(NO_HOME, 0), Ordering::Release);
                    vids.push(v);
                }
            }
            let reused = vids.len();
            let more = n - reused;
            let first = self.versions.push(more as u32)?;
            vids.extend(first..first + more as u32);
            m.of_vid.extend_from_slice(&ids[reused..]);
            m.seq_of.extend((0..more).map(|_| seq));
            self.homes
                .write()
                .extend((0..more).map(|_| AtomicU64::new(home_word(NO_HOME, 0))));
            for (&id, &v) in ids.iter().zip(&vids) {
                if let Some(old) = m.ext.insert(id, v) {
                    self.versions.delete(old);
                }
            }
            self.counters
                .reused_vids
                .fetch_add(reused as u64, Ordering::Relaxed);
            vids
        };
        self.counters.inserts.fetch_add(n as u64, Ordering::Relaxed);
        if self.heads.count() == 0 {
            self.build(&self.heads, &vids, &data, false)?;
            self.mark_built();
        } else {
            self.place_batch(&vids, &data)?;
        }
        // A rebuild running beside places them in its new index too: it
        // does, from what it is given here, until its new index is built;
        // then this writer does.
        // A batch of INLINE_ROWS or more goes to the rebuild's rounds (off
        // the writer lock): placed here it would hold the writers, and
        // placed in parallel it raced its own rows for the new postings
        // (1,426 posting ids for 678 postings in a test that allows 2x).
        let direct = match self.rebuilding.lock().as_mut() {
            Some(r) if r.heads.is_some() && vids.len() < INLINE_ROWS => r.heads.clone(),
            Some(r) => {
                r.vids.extend_from_slice(&vids);
                r.data.extend_from_slice(&data);
                None
            }
            None => None,
        };
        if let Some(heads) = direct {
            self.place_in_rebuild(&heads, &vids, &data);
        }
        Ok(())
    }

    /// Places inserted vectors `vids` (rows `data`) in a rebuild's new
    /// index `heads` (a writer's part, under the writer lock). One that
    /// fails goes to the rebuild's own list, which it places before its
    /// swap (or fails there, and is abandoned): the write itself is
    /// applied to the index in use, and a copy placed twice costs space
    /// only, as a search counts a vector once.
    fn place_in_rebuild(&self, heads: &Heads, vids: &[u32], data: &[f32]) {
        let dim = self.dim;
        self.with_scratch(|sc| {
            for (i, &vid) in vids.iter().enumerate() {
                let v = &data[i * dim..(i + 1) * dim];
                if let Err(e) = self.place_building(heads, vid, v, sc) {
                    self.note_error(&e);
                    if let Some(r) = self.rebuilding.lock().as_mut() {
                        r.vids.push(vid);
                        r.data.extend_from_slice(v);
                    }
                }
            }
        });
    }

    /// Creates a posting of records `recs` for a rebuild's new index,
    /// recorded as building in the same step for a snapshot (see
    /// `Rebuilding`).
    pub(crate) fn create_building(&self, recs: &[u8]) -> Result<u32> {
        // Recursive: a writer placing in a rebuild's index holds it already
        // (`apply_insert`), and a waiting `gate.write()` must not stall it.
        let _g = self.gate.read_recursive();
        let pid = self.store.create_posting(recs)?;
        if let Some(r) = self.rebuilding.lock().as_mut() {
            r.building.insert(pid);
        }
        Ok(pid)
    }

    /// Places vector `vid` (version 0, as `spann` numbers every copy) in
    /// the postings that the replica rule picks in `heads`, a rebuild's
    /// new index; a posting of its own when it finds none.
    pub(crate) fn place_building(
        &self,
        heads: &Heads,
        vid: u32,
        v: &[f32],
        sc: &mut Scratch,
    ) -> Result<()> {
        let mut rec = std::mem::take(&mut sc.rec);
        rec.clear();
        encode_record(&mut rec, vid, 0, v);
        let res = (|| {
            self.route_in(heads, v, sc)?;
            let (sel, inc) = (std::mem::take(&mut sc.sel), std::mem::take(&mut sc.sel_inc));
            let mut home = None;
            for (&pid, &i) in sel.iter().zip(&inc) {
                if self
                    .append_locked(heads, (pid, i), &rec, &[], 0, sc)?
                    .is_some()
                    && home.is_none()
                {
                    home = Some(pid);
                }
            }
            (sc.sel, sc.sel_inc) = (sel, inc);
            let pid = match home {
                Some(pid) => pid,
                None => {
                    let pid = self.create_building(&rec)?;
                    heads.add(&[pid], v)?;
                    pid
                }
            };
            // The home moves at the swap (see `Rebuilding::homes`).
            if let Some(rb) = self.rebuilding.lock().as_mut() {
                rb.homes.push((vid, pid));
            }
            Ok(())
        })();
        sc.rec = rec;
        res
    }

    /// Applies a delete of `ids` at `seq` (tombstones); the number removed.
    /// In `spfresh`, each deleted vector's home posting is queued for a
    /// merge check: a posting that deletes emptied is merged (or its dead
    /// records collected) without waiting for a search to meet it, so that
    /// searches stop spending their `nprobe` on dead regions.
    pub(crate) fn apply_delete(&self, seq: Seq, ids: &[u64]) -> usize {
        let mut homes = Vec::new();
        let n = {
            let mut m = self.ids.write();
            let mut n = 0;
            for id in ids {
                if let Some(&v) = m.ext.get(id) {
                    if m.seq_of[v as usize] <= seq {
                        m.ext.remove(id);
                        self.versions.delete(v);
                        n += 1;
                        if self.mode == Mode::Fresh {
                            homes.extend(self.home(v).filter(|&p| p != NO_HOME));
                        }
                    }
                }
            }
            n
        };
        homes.sort_unstable();
        homes.dedup();
        for p in homes {
            self.jobs.push(Job::Merge(p));
        }
        self.counters.deletes.fetch_add(n as u64, Ordering::Relaxed);
        n
    }

    /// The postings vector `v` goes to (SPANN's replica rule over its
    /// `route_candidates` nearest centroids) into `sc.sel`.
    pub(crate) fn route(&self, v: &[f32], sc: &mut Scratch) -> Result<()> {
        self.route_in(&self.heads, v, sc)
    }

    /// [`Inner::route`] by the centroid index `heads`.
    pub(crate) fn route_in(&self, heads: &Heads, v: &[f32], sc: &mut Scratch) -> Result<()> {
        let k = self.params.route_candidates;
        heads.nearest(v, k, self.params.head_ef.max(k), &mut sc.hits)?;
        let cents = heads.read();
        sc.cands.clear();
        sc.cands.extend(
            sc.hits
                .iter()
                .map(|h| (h.distance, h.id as u32))
                .filter(|&(_, p)| cents.get(p).is_some() && self.store.entry(p).is_some()),
        );
        rng_select(
            self.l2(),
            &sc.cands,
            |c| {
                cents
                    .get(c)
                    .expect("candidates were filtered under this guard")
            },
            self.params.replicas,
            self.params.rng_factor,
            &mut sc.sel,
        );
        sc.sel_inc.clear();
        sc.sel_inc.extend(
            sc.sel
                .iter()
                .map(|&p| cents.incarnation(p).expect("selected from the candidates")),
        );
        Ok(())
    }

    /// APPEND under the posting's lock: the posting's new length, or
    /// `None` when it is gone. `to` is the posting as routed: its id and
    /// its incarnation in `heads`, the centroid index of the route; a
    /// posting removed since is gone even when a new one has taken its id.
    /// On success, posting `pid` becomes the home of `vids` (records at
    /// `version`) while the lock is still held (a split of it cannot slip
    /// in between and leave them pointing at a removed posting).
    pub(crate) fn append_locked(
        &self,
        heads: &Heads,
        to: (u32, u32),
        recs: &[u8],
        vids: &[u32],
        version: u8,
        sc: &mut Scratch,
    ) -> Result<Option<u32>> {
        let (pid, incarnation) = to;
        let _l = self.lock(pid);
        // Removals and the frees of ids that follow them hold the lock.
        if heads.read().incarnation(pid) != Some(incarnation) {
            return Ok(None);
        }
        Ok(match self.store.append(pid, recs, &mut sc.read)? {
            Swap::Done(n) => {
                for &v in vids {
                    self.set_home(v, pid, version);
                }
                Some(n)
            }
            Swap::Gone | Swap::Changed => None,
        })
    }

    /// After an APPEND of `added` records left posting `pid` at `len`:
    /// queues its split when it is over the limit (`spfresh` only);
    /// whether this APPEND is the one that took it over.
    pub(crate) fn maybe_split(&self, pid: u32, len: u32, added: usize, depth: u32) -> bool {
        let len = len as usize;
        if self.mode != Mode::Fresh || len <= self.limit {
            return false;
        }
        self.jobs.push(Job::Split(pid, depth));
        len - added <= self.limit
    }

    /// Places the vectors `vids` (rows of `data`): routed, then
    /// one APPEND per posting (both in parallel on the engine's pool for a
    /// batch of [`INLINE_ROWS`] or more, on the caller's thread below it:
    /// waking the pool costs a single-point upsert more than its routing);
    /// vectors whose posting went away are placed again one by one.
    fn place_batch(&self, vids: &[u32], data: &[f32]) -> Result<()> {
        let dim = self.dim;
        let n = data.len() / dim;
        // (posting, its incarnation, row) per copy.
        let route_row = |sc: &mut Scratch, r: usize| -> Result<Vec<(u32, u32, u32)>> {
            self.route(&data[r * dim..(r + 1) * dim], sc)?;
            Ok(sc
                .sel
                .iter()
                .zip(&sc.sel_inc)
                .map(|(&p, &i)| (p, i, r as u32))
                .collect())
        };
        let append_group = |sc: &mut Scratch, g: &[(u32, u32, u32)]| -> Result<()> {
            let (pid, inc) = (g[0].0, g[0].1);
            let mut rec = std::mem::take(&mut sc.rec);
            rec.clear();
            let homed: Vec<u32> = g.iter().map(|&(_, _, r)| vids[r as usize]).collect();
            for &(_, _, r) in g {
                let r = r as usize;
                encode_record(&mut rec, vids[r], 0, &data[r * dim..(r + 1) * dim]);
            }
            let got = self.append_locked(&self.heads, (pid, inc), &rec, &homed, 0, sc);
            sc.rec = rec;
            if let Some(len) = got? {
                if self.maybe_split(pid, len, g.len(), 0) {
                    self.counters.split_triggers.fetch_add(1, Ordering::Relaxed);
                }
            }
            Ok(())
        };
        let inline = n < INLINE_ROWS;
        let mut pairs: Vec<(u32, u32, u32)> = if inline {
            let mut sc = self.scratch();
            let mut pairs = Vec::new();
            let routed = (0..n).try_for_each(|r| -> Result<()> {
                pairs.extend(route_row(&mut sc, r)?);
                Ok(())
            });
            self.give_back(sc);
            routed?;
            pairs
        } else {
            self.pool.install(|| {
                (0..n)
                    .into_par_iter()
                    .map_init(|| self.scratch(), route_row)
                    .collect::<Result<Vec<_>>>()
                    .map(|v| v.into_iter().flatten().collect())
            })?
        };
        pairs.sort_unstable();
        let groups: Vec<&[(u32, u32, u32)]> =
            pairs.chunk_by(|a, b| (a.0, a.1) == (b.0, b.1)).collect();
        if inline {
            self.with_scratch(|sc| groups.iter().try_for_each(|g| append_group(sc, g)))?;
        } else {
            self.pool.install(|| {
                groups
                    .par_iter()
                    .map_init(|| self.scratch(), |sc, g| append_group(sc, g))
                    .collect::<Result<()>>()
            })?;
        }
        // A vector none of whose postings took it (they vanished under a
        // split or a merge) still has no home: placed again on its own.
        let mut sc = self.scratch();
        let mut out = Ok(());
        for (r, &vid) in vids.iter().enumerate() {
            if self.home(vid) == Some(NO_HOME) {
                if let Err(e) = self.place_one(vid, 0, &data[r * dim..(r + 1) * dim], 0, &mut sc) {
                    out = Err(e);
                    break;
                }
            }
        }
        self.give_back(sc);
        out
    }

    /// Places one vector (`vid` at `version`) in the postings the replica
    /// rule picks, routing again while they vanish; after
    /// [`MAX_REROUTES`] tries (or with no centroid at all) it gets a
    /// posting of its own. `depth` is the split cascade it belongs to.
    pub(crate) fn place_one(
        &self,
        vid: u32,
        version: u8,
        v: &[f32],
        depth: u32,
        sc: &mut Scratch,
    ) -> Result<()> {
        let mut rec = std::mem::take(&mut sc.rec);
        rec.clear();
        encode_record(&mut rec, vid, version, v);
        let res = (|| {
            for _ in 0..MAX_REROUTES {
                self.route(v, sc)?;
                if sc.sel.is_empty() {
                    break;
                }
                let (sel, inc) = (std::mem::take(&mut sc.sel), std::mem::take(&mut sc.sel_inc));
                let mut any = false;
                for (&pid, &i) in sel.iter().zip(&inc) {
                    let home: &[u32] = if any { &[] } else { &[vid] };
                    if let Some(len) =
                        self.append_locked(&self.heads, (pid, i), &rec, home, version, sc)?
                    {
                        any = true;
                        self.maybe_split(pid, len, 1, depth);
                    }
                }
                (sc.sel, sc.sel_inc) = (sel, inc);
                if any {
                    return Ok(());
                }
                self.counters.reroutes.fetch_add(1, Ordering::Relaxed);
            }
            let pid = self.store.create_posting(&rec)?;
            self.set_home(vid, pid, version);
            self.heads.add(&[pid], v)?;
            Ok(())
        })();
        sc.rec = rec;
        res
    }
}

#[cfg(test)]
mod tests {
    use crate::layout::encode_record;
    use crate::{Mode, SpannParams, Spfresh};
    use vectide_core::{Metric, VectorIndex};

    /// A writer holding a route to a posting that a split removed, whose
    /// id a new posting then took, does not append to the new posting:
    /// its APPEND finds the incarnation it routed to gone. Without the
    /// check, the vector would land in a posting whose centroid is
    /// elsewhere, where searches near it never look.
    #[test]
    fn an_append_by_an_old_route_misses_a_posting_that_reused_the_id() {
        let dir = tempfile::tempdir().unwrap();
        let p = SpannParams {
            rebuild_inline: true,
            threads: Some(1),
            ..SpannParams::default()
        };
        let idx = Spfresh::create(dir.path(), 4, Metric::L2, Mode::Fresh, p).unwrap();
        let data: Vec<f32> = (0..32 * 4).map(|i| ((i * 7) % 13) as f32).collect();
        idx.insert(1, &(0..32).collect::<Vec<u64>>(), &data)
            .unwrap();
        let inner = idx.inner.clone();
        let v = [1.0f32, 2.0, 3.0, 4.0];
        let mut sc = inner.scratch();
        inner.route(&v, &mut sc).unwrap();
        let (pid, old) = (sc.sel[0], sc.sel_inc[0]);
        // What a split does under the posting's lock, then a new posting
        // (another split's half) taking the freed id.
        {
            let _l = inner.lock(pid);
            let entry = inner.store.entry(pid).unwrap();
            assert!(matches!(
                inner.store.remove(pid, &entry),
                crate::blockstore::Swap::Done(_)
            ));
            inner.heads.remove(pid).unwrap();
            inner.store.free_id(pid);
        }
        let mut rec = Vec::new();
        encode_record(&mut rec, 0, 0, &[9.0, 9.0, 9.0, 9.0]);
        assert_eq!(
            inner.store.create_posting(&rec).unwrap(),
            pid,
            "the freed id is taken again"
        );
        inner.heads.add(&[pid], &[9.0, 9.0, 9.0, 9.0]).unwrap();
        let new = inner.heads.read().incarnation(pid).unwrap();
        assert_ne!(new, old);
        let mut mine = Vec::new();
        encode_record(&mut mine, 1, 0, &v);
        let by_old = inner.append_locked(&inner.heads, (pid, old), &mine, &[], 0, &mut sc);
        assert_eq!(
            by_old.unwrap(),
            None,
            "appended by a route to the removed posting"
        );
        assert_eq!(inner.store.entry(pid).unwrap().records, 1);
        let by_new = inner.append_locked(&inner.heads, (pid, new), &mine, &[], 0, &mut sc);
        assert_eq!(by_new.unwrap(), Some(2));
        inner.give_back(sc);
    }
}
