//! The Local Rebuilder (SPFresh §3, §4.1–4.2): a job queue and background
//! threads running **split**, **merge** and **reassign** (LIRE).
//!
//! - *Split* (§3.2, §4.2.1): the posting is garbage-collected (stale and
//!   deleted records dropped, replicas of one vector kept once); if still
//!   over the limit, balanced 2-means cuts it in two new postings whose
//!   centroids enter the centroid index, and the old posting and centroid
//!   are removed. Then reassign.
//! - *Reassign after a split* (§3.3): with `A_o` the old centroid and `A_1`,
//!   `A_2` the new ones, a vector of the new postings is a candidate iff
//!   `D(v, A_o) ≤ D(v, A_i)` for both `i` (the paper's first condition), a
//!   vector of one of the `reassign_range` postings nearest `A_o` (centroid
//!   `B`) iff some `D(v, A_i) ≤ D(v, A_o)` (the second) and
//!   `min_i D(v, A_i) < D(v, B)` (the public code's extra filter: it would
//!   not move towards a new centroid farther than its own). A candidate is
//!   routed again; if its current posting is among the chosen ones it stays
//!   (a false positive); otherwise it is appended to its new postings with
//!   the next version (pending: searches still read the old copies), then
//!   its version is switched by CAS (a failed CAS means a concurrent delete
//!   or move: the job lets it go). Readers see the old copies or the new
//!   ones, never neither; garbage collection keeps pending copies.
//! - *Merge* (§3.2, §4.2.1): a search that meets a posting with at most
//!   `merge_threshold` live records, or with more dead records than live
//!   ones, queues it, and so does a delete for its vector's home posting
//!   (so that a region the stream deleted is merged away without waiting
//!   for a search to meet it); the job garbage-collects the posting when
//!   it is mostly dead (in the paper only a split collects garbage;
//!   collecting here too keeps searches from reading postings that deletes
//!   and moves left mostly dead) and, if it is small, joins it with the nearest posting whose length
//!   allows; the longer one survives and the other's vectors that are nearer
//!   the deleted centroid than the survivor's are reassigned (§3.3: only
//!   they can break NPA).
//!
//! Every job that rewrites postings holds the engine's gate shared (the
//! snapshot job, which takes it exclusively for its capture, never sees
//! half of one) and the locks of the postings it rewrites. A posting gone under a
//! job (a concurrent split or merge removed it) ends the job or makes the
//! vector route again; it is never an error.

use crate::blockstore::Swap;
use crate::heads::Heads;
use crate::jobs::*;
use crate::layout::{blocks_for, Records};
use crate::params::Mode;
use crate::state::{Inner, Rebuilding, Scratch};
use crate::versions::{VersionMap, VERSION_MASK};
use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;
use vectide_core::{Error, Result};
use vectide_quant::{balanced_kmeans, BalancedParams};

/// Runs the Local Rebuilder in the background: when jobs are queued, a
/// drain task runs them on the process's shared rebuild pool
/// (`vectide-spfresh-rebuild-*`, one thread per core), one drain per index
/// at a time. An index thus has one background worker, as when each had a
/// thread of its own, and a process's rebuild threads are bounded by the
/// cores, not by its indexes.
pub(crate) fn start_background(inner: &Arc<Inner>) -> Result<()> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let pool = vectide_core::pools::shared("spfresh-rebuild", cores)?;
    let weak = Arc::downgrade(inner);
    inner.jobs.set_runner(Box::new(move |task| {
        let weak = weak.clone();
        match task {
            Task::Drain => pool.spawn(move || {
                if let Some(me) = weak.upgrade() {
                    me.drain_background();
                }
            }),
            // A rebuild holds its lock for seconds across parallel work:
            // on the process's plain job thread, not a rayon worker (see
            // `vectide_core::job_thread`), one rebuild at a time.
            Task::Rebuild => {
                let job = Box::new(move || {
                    if let Some(me) = weak.upgrade() {
                        me.rebuild_background();
                    }
                });
                if let Err(job) = vectide_core::job_thread::submit("spann-rebuild", job) {
                    // No thread to hand it to: this writer runs it.
                    job();
                }
            }
        }
    }));
    Ok(())
}

/// The current and pending records of `recs`, each (vector, version)
/// once.
fn collect_garbage(
    versions: &VersionMap,
    recs: &Records,
    dim: usize,
    seen: &mut HashSet<(u32, u8)>,
) -> Records {
    seen.clear();
    let mut out = Records::default();
    for j in 0..recs.len() {
        let v = recs.vids[j];
        if versions.standing(v, recs.versions[j]) > 0 && seen.insert((v, recs.versions[j])) {
            out.vids.push(v);
            out.versions.push(recs.versions[j]);
            out.vectors.extend_from_slice(recs.vector(j, dim));
        }
    }
    out
}

fn mean(recs: &Records, dim: usize) -> Vec<f32> {
    let mut c = vec![0.0f32; dim];
    for j in 0..recs.len() {
        c.iter_mut()
            .zip(recs.vector(j, dim))
            .for_each(|(a, x)| *a += x);
    }
    let inv = 1.0 / recs.len().max(1) as f32;
    c.iter_mut().for_each(|a| *a *= inv);
    c
}

fn encoded(recs: &Records, dim: usize) -> Vec<u8> {
    let mut b = Vec::with_capacity(recs.len() * crate::layout::record_bytes(dim));
    recs.encode(dim, &mut b);
    b
}

/// A reassign candidate: vector, version seen, where it is now.
struct Candidate {
    vid: u32,
    version: u8,
    from: u32,
}

impl Inner {
    /// The background drain: runs queued jobs until none is left or the
    /// runner stops. A job that panics is recorded as an error (the shared
    /// pool's thread goes on with the next).
    fn drain_background(&self) {
        let mut sc = self.scratch();
        while let Some(job) = self.jobs.take_background() {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                self.run_job(job, &mut sc)
            }))
            .unwrap_or_else(|_| Err(Error::invalid(format!("{job:?} panicked"))));
            if let Err(e) = r {
                self.note_error(&e);
            }
            self.jobs.finish();
        }
        self.give_back(sc);
    }

    /// The background `spann` rebuild a write started
    /// (`start_rebuild_if_due`), and the blocks it released given back,
    /// as `maintain()` does; again while the changes made meanwhile make
    /// another due (the writes that passed the threshold during one found
    /// it running and started none, and no write may come to start it),
    /// with the dead vector numbers reclaimed between two (a reclaim never
    /// runs beside a rebuild). It ends when the index is closing or paused, or a
    /// holder has taken the rebuilds over. A failed or panicked rebuild is
    /// recorded as a job's error; the next is due only
    /// [`crate::state::REBUILD_FLOOR`] changes later.
    fn rebuild_background(&self) {
        while !self.jobs.stopping() && !self.jobs.paused() && !self.deferred.load(Ordering::Acquire)
        {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                self.rebuild_static_if_due()
            }))
            .unwrap_or_else(|_| Err(Error::invalid("the spann rebuild panicked")));
            match r {
                Ok(true) => {}
                Ok(false) => break,
                Err(e) => {
                    self.note_error(&e);
                    break;
                }
            }
            if self.reclaim_lag() > 0 {
                if let Err(e) = self.with_scratch(|sc| self.reclaim_now(sc)) {
                    self.note_error(&e);
                }
            }
        }
        self.jobs.rebuild_ended();
        // A write that came between the last check and the end found this
        // rebuild still running and started none.
        self.start_rebuild_if_due();
    }

    /// A rebuild (and its blocks given back) if one is due and none runs;
    /// whether it ran.
    pub(crate) fn rebuild_static_if_due(&self) -> Result<bool> {
        let Some(one) = self.rebuild_lock.try_lock() else {
            return Ok(false);
        };
        if !self.rebuild_counts_due() {
            return Ok(false);
        }
        self.rebuild_static_locked(one)?;
        self.give_blocks_back()?;
        Ok(true)
    }

    /// Runs every queued job to completion on this thread (and waits for
    /// the ones background threads are running); the first error, after
    /// all have run.
    pub(crate) fn drain_jobs(&self) -> Result<()> {
        let mut first = Ok(());
        let mut sc = self.scratch();
        loop {
            match self.jobs.take() {
                Some(job) => {
                    let r = self.run_job(job, &mut sc);
                    self.jobs.finish();
                    if let Err(e) = r {
                        self.note_error(&e);
                        if first.is_ok() {
                            first = Err(e);
                        }
                    }
                }
                None => {
                    self.jobs.wait_idle();
                    if self.jobs.pending() == 0 {
                        break;
                    }
                }
            }
        }
        self.give_back(sc);
        first
    }

    fn run_job(&self, job: Job, sc: &mut Scratch) -> Result<()> {
        let r = match job {
            // Compaction serves every mode; splits and merges only LIRE's.
            Job::Compact => self.compact(sc),
            Job::Reclaim => self.reclaim(sc).map(|_| ()),
            Job::Snapshot => return self.snapshot_if_due(),
            _ if self.mode != Mode::Fresh => Ok(()),
            Job::Split(p, depth) => {
                let _job = self.activity.begin("split");
                self.split(p, depth, sc)
            }
            Job::Merge(p) => {
                let _job = self.activity.begin("merge");
                self.merge(p, false, sc)
            }
        };
        // A compaction that found nothing to move must not queue itself
        // again.
        if job != Job::Compact {
            self.after_job();
        }
        r
    }

    /// After a job that rewrote postings: the blocks it released come
    /// back only with a snapshot, so the writes' trigger (blocks held past
    /// a third of those in use) is checked here too, and a file left
    /// mostly free is queued for compaction.
    /// Without it an index whose writes stopped kept them held, its file
    /// at the size the last jobs left (a soak's quiet end: 3-5x the live
    /// vectors' bytes against 2-2.4 under load).
    pub(crate) fn after_job(&self) {
        // A snapshot in flight returns the held blocks, and queues the
        // compaction when due, as it ends (a job run inline by a writer
        // must not queue one that writer would wait for).
        if self.snap_lock.is_locked() {
            return;
        }
        if self.store.held_over(crate::update::GARBAGE_FLOOR) > 0 {
            self.jobs.push(Job::Snapshot);
        } else if self.store.compaction_due() {
            // Free, not held, and most of the file: a snapshot would not
            // come to queue the compaction.
            self.jobs.push(Job::Compact);
        }
    }

    /// Compaction of the block file when it is due: the postings with
    /// blocks in the file's mostly free end, moved one by one
    /// (`BlockStore::relocate`), each under the gate's read side as every
    /// job's PUT (a snapshot's capture waits for one move, not the pass);
    /// then a snapshot, which frees the blocks they left and cuts the
    /// file's free end off (the point of the job: without it the file kept
    /// its length until some later snapshot).
    pub(crate) fn compact(&self, sc: &mut Scratch) -> Result<()> {
        self.compact_at(sc, crate::blockstore::COMPACT_SHARE)
    }

    /// [`Inner::compact`] once more than a `1/share` of the file is free.
    pub(crate) fn compact_at(&self, sc: &mut Scratch, share: u64) -> Result<()> {
        // One compaction at a time: two at once moved the same postings
        // twice, spending the free blocks below the target on postings
        // already there, and left the rest at the file's end (a `spann`
        // `maintain()` with the background drain left 2,030 blocks with
        // 714 in use). A second caller waits and then finds it not due.
        let _one = self.compact_lock.lock();
        if !self.store.compaction_due_at(share) {
            return Ok(());
        }
        let _job = self.activity.begin("compact");
        let mut recs = Records::default();
        let (target, candidates) = self.store.compaction_candidates();
        for &pid in &candidates {
            let _g = self.gate.read();
            // The posting's lock too: a job or a rebuild's swap that read
            // the posting under it must not see it change before its own
            // PUT or remove.
            let _l = self.lock(pid);
            self.store.relocate(pid, target, &mut recs, &mut sc.read)?;
        }
        match candidates.is_empty() {
            true => Ok(()),
            false => self.snapshot(),
        }
    }

    /// Split (module docs).
    fn split(&self, pid: u32, depth: u32, sc: &mut Scratch) -> Result<()> {
        let dim = self.dim;
        let _g = self.gate.read();
        let (old_c, news) = {
            let _l = self.lock(pid);
            let Some(entry) = self.store.get(pid, &mut sc.recs, &mut sc.read)? else {
                return Ok(());
            };
            let kept = collect_garbage(&self.versions, &sc.recs, dim, &mut sc.kept);
            if kept.len() <= self.limit {
                if kept.len() < sc.recs.len() {
                    self.store.put(pid, &encoded(&kept, dim), &Some(entry))?;
                }
                self.counters.gc_only.fetch_add(1, Ordering::Relaxed);
                return Ok(());
            }
            let Some(old_c) = self.heads.read().get(pid).map(<[f32]>::to_vec) else {
                return Ok(());
            };
            let mut bp = BalancedParams::new(2);
            bp.kmeans = bp.kmeans.seed(self.params.seed ^ u64::from(pid));
            let (_, labels) = balanced_kmeans(&kept.vectors, dim, &bp)?;
            let mut halves = [Records::default(), Records::default()];
            for (j, &l) in labels.iter().enumerate() {
                let h = &mut halves[l as usize & 1];
                h.vids.push(kept.vids[j]);
                h.versions.push(kept.versions[j]);
                h.vectors.extend_from_slice(kept.vector(j, dim));
            }
            if halves.iter().any(Records::is_empty) {
                // Identical vectors: nothing to cut.
                if kept.len() < sc.recs.len() {
                    self.store.put(pid, &encoded(&kept, dim), &Some(entry))?;
                }
                return Ok(());
            }
            let mut made: Vec<(u32, Vec<f32>, Records)> = Vec::with_capacity(2);
            for h in halves {
                let p = self.store.create_posting(&encoded(&h, dim))?;
                let c = mean(&h, dim);
                // Homes first: once its centroid is in, others may append
                // to and split the new posting.
                for (&v, &ver) in h.vids.iter().zip(&h.versions) {
                    self.set_home(v, p, ver);
                }
                self.heads.add(&[p], &c)?;
                if h.len() > self.limit {
                    self.jobs.push(Job::Split(p, depth + 1));
                }
                made.push((p, c, h));
            }
            match self.store.remove(pid, &entry) {
                Swap::Done(_) => {}
                s => {
                    return Err(Error::invalid(format!(
                        "split of posting {pid}: it changed under its lock ({s:?})"
                    )))
                }
            }
            self.heads.remove(pid)?;
            // Under its lock, with its centroid gone: a writer still
            // holding a route to it finds its incarnation gone.
            self.store.free_id(pid);
            self.counters.splits.fetch_add(1, Ordering::Relaxed);
            self.counters
                .cascade_max
                .fetch_max(u64::from(depth), Ordering::Relaxed);
            let news: [(u32, Vec<f32>, Records); 2] = made
                .try_into()
                .map_err(|_| Error::invalid("split: not two halves"))?;
            (old_c, news)
        };
        self.reassign_after_split(pid, &old_c, &news, depth, sc)
    }

    fn reassign_after_split(
        &self,
        old: u32,
        old_c: &[f32],
        news: &[(u32, Vec<f32>, Records); 2],
        depth: u32,
        sc: &mut Scratch,
    ) -> Result<()> {
        let dim = self.dim;
        let l2 = self.l2();
        let (c1, c2) = (&news[0].1, &news[1].1);
        let mut cands: Vec<Candidate> = Vec::new();
        let mut vecs: Vec<f32> = Vec::new();
        let mut seen = HashSet::new();
        // (1) vectors of the old posting, now in the new ones.
        for (p, _, recs) in news {
            for j in 0..recs.len() {
                let v = recs.vector(j, dim);
                let d_o = l2(v, old_c);
                if d_o <= l2(v, c1) && d_o <= l2(v, c2) && seen.insert(recs.vids[j]) {
                    cands.push(Candidate {
                        vid: recs.vids[j],
                        version: recs.versions[j],
                        from: *p,
                    });
                    vecs.extend_from_slice(v);
                }
            }
        }
        // (2) vectors of the postings nearest the old centroid.
        if self.params.reassign_range > 0 {
            let k = self.params.reassign_range + 3;
            self.heads
                .nearest(old_c, k, self.params.head_ef.max(k), &mut sc.hits)?;
            sc.pids.clear();
            sc.pids.extend(
                sc.hits
                    .iter()
                    .map(|h| h.id as u32)
                    .filter(|&p| p != old && p != news[0].0 && p != news[1].0)
                    .take(self.params.reassign_range),
            );
            self.store.parallel_get(&sc.pids, &mut sc.read)?;
            let heads = self.heads.read();
            for (i, recs) in sc.read.records().enumerate() {
                let b = sc.pids[i];
                let Some(cb) = heads.get(b) else { continue };
                for j in 0..recs.len() {
                    let vid = recs.vids[j];
                    if !self.versions.is_current(vid, recs.versions[j]) || seen.contains(&vid) {
                        continue;
                    }
                    let v = recs.vector(j, dim);
                    let nearest_new = l2(v, c1).min(l2(v, c2));
                    if nearest_new <= l2(v, old_c) && nearest_new < l2(v, cb) {
                        seen.insert(vid);
                        cands.push(Candidate {
                            vid,
                            version: recs.versions[j],
                            from: b,
                        });
                        vecs.extend_from_slice(v);
                    }
                }
            }
        }
        self.move_candidates(&cands, &vecs, depth, sc)
    }

    /// Reassigns each candidate whose routing no longer includes its
    /// posting.
    fn move_candidates(
        &self,
        cands: &[Candidate],
        vecs: &[f32],
        depth: u32,
        sc: &mut Scratch,
    ) -> Result<()> {
        let dim = self.dim;
        self.counters
            .reassign_evaluated
            .fetch_add(cands.len() as u64, Ordering::Relaxed);
        for (i, c) in cands.iter().enumerate() {
            let v = &vecs[i * dim..(i + 1) * dim];
            if !self.versions.is_current(c.vid, c.version) {
                continue;
            }
            self.route(v, sc)?;
            if sc.sel.is_empty() || sc.sel.contains(&c.from) {
                continue;
            }
            // New copies first, pending; then the switch. A failure before
            // it leaves the old copies current.
            let next = (c.version + 1) & VERSION_MASK;
            self.place_one(c.vid, next, v, depth + 1, sc)?;
            if self.versions.bump(c.vid, c.version).is_some() {
                self.counters.reassign_moved.fetch_add(1, Ordering::Relaxed);
            }
        }
        Ok(())
    }

    /// Merge (module docs). `sweep`: `maintain()`'s pass, which collects
    /// a posting's garbage whenever that saves a block; a job queued by a
    /// search or a delete does only when most records are dead (a rewrite
    /// per delete would cost more than the reads it saves).
    pub(crate) fn merge(&self, pid: u32, sweep: bool, sc: &mut Scratch) -> Result<()> {
        let dim = self.dim;
        let _g = self.gate.read();
        let mut cands = Vec::new();
        let mut vecs = Vec::new();
        {
            let _l = self.lock(pid);
            let Some(entry) = self.store.get(pid, &mut sc.recs, &mut sc.read)? else {
                return Ok(());
            };
            let kept = collect_garbage(&self.versions, &sc.recs, dim, &mut sc.kept);
            let changed = kept.len() < sc.recs.len();
            if kept.len() > self.params.merge_threshold {
                let rb = crate::layout::record_bytes(dim);
                let saves = if sweep {
                    blocks_for(kept.len() * rb) < blocks_for(sc.recs.len() * rb)
                } else {
                    kept.len() * 2 < sc.recs.len()
                };
                if saves {
                    self.store.put(pid, &encoded(&kept, dim), &Some(entry))?;
                    self.counters.collections.fetch_add(1, Ordering::Relaxed);
                }
                return Ok(());
            }
            let Some(my_c) = self.heads.read().get(pid).map(<[f32]>::to_vec) else {
                return Ok(());
            };
            let k = self.params.route_candidates;
            self.heads
                .nearest(&my_c, k, self.params.head_ef.max(k), &mut sc.hits)?;
            let hits = std::mem::take(&mut sc.hits);
            let mut other = Records::default();
            let mut done = false;
            for h in &hits {
                let q = h.id as u32;
                if q == pid || Inner::stripe(q) == Inner::stripe(pid) {
                    continue;
                }
                let Some(_lq) = self.locks[Inner::stripe(q)].try_lock() else {
                    continue;
                };
                let Some(qe) = self.store.get(q, &mut other, &mut sc.read)? else {
                    continue;
                };
                if kept.len() + qe.records as usize >= self.limit {
                    continue;
                }
                let Some(q_c) = self.heads.read().get(q).map(<[f32]>::to_vec) else {
                    continue;
                };
                let kq = collect_garbage(&self.versions, &other, dim, &mut sc.kept);
                let (mut union, from_gone, survivor, s_entry, gone, g_entry, s_c, g_c) =
                    if kept.len() > kq.len() {
                        (kept.clone(), kq, pid, &entry, q, &qe, &my_c, &q_c)
                    } else {
                        (kq, kept.clone(), q, &qe, pid, &entry, &q_c, &my_c)
                    };
                let present: HashSet<(u32, u8)> = union
                    .vids
                    .iter()
                    .copied()
                    .zip(union.versions.iter().copied())
                    .collect();
                for j in 0..from_gone.len() {
                    if !present.contains(&(from_gone.vids[j], from_gone.versions[j])) {
                        union.vids.push(from_gone.vids[j]);
                        union.versions.push(from_gone.versions[j]);
                        union.vectors.extend_from_slice(from_gone.vector(j, dim));
                    }
                }
                self.store
                    .put(survivor, &encoded(&union, dim), &Some(s_entry.clone()))?;
                if !matches!(self.store.remove(gone, g_entry), Swap::Done(_)) {
                    return Err(Error::invalid(format!(
                        "merge: posting {gone} changed under its lock"
                    )));
                }
                self.heads.remove(gone)?;
                self.store.free_id(gone);
                for (&v, &ver) in union.vids.iter().zip(&union.versions) {
                    self.set_home(v, survivor, ver);
                }
                let l2 = self.l2();
                for j in 0..from_gone.len() {
                    let v = from_gone.vector(j, dim);
                    if l2(v, s_c) > l2(v, g_c) {
                        cands.push(Candidate {
                            vid: from_gone.vids[j],
                            version: from_gone.versions[j],
                            from: survivor,
                        });
                        vecs.extend_from_slice(v);
                    }
                }
                self.counters.merges.fetch_add(1, Ordering::Relaxed);
                done = true;
                break;
            }
            sc.hits = hits;
            if !done {
                if kept.is_empty() && self.heads.count() > 1 {
                    if matches!(self.store.remove(pid, &entry), Swap::Done(_)) {
                        self.heads.remove(pid)?;
                        self.store.free_id(pid);
                    }
                } else if changed {
                    self.store.put(pid, &encoded(&kept, dim), &Some(entry))?;
                }
            }
        }
        self.move_candidates(&cands, &vecs, 0, sc)
    }

    /// `spann`'s maintenance: a static build from the live vectors, made
    /// beside the index in use without holding the writer, so that writes
    /// and snapshots go on while it runs.
    ///
    /// 1. Under the writer (a moment): the postings in use and the first
    ///    vector number not yet allocated are noted, and writers start
    ///    recording the vectors they insert (`Rebuilding`).
    /// 2. Unlocked: the current records of vectors below that number are
    ///    read and built into new postings and a fresh centroid index.
    ///    Snapshots leave the new postings out. A vector deleted meanwhile
    ///    is a stale record there, which searches skip as they skip any.
    /// 3. The vectors inserted meanwhile are placed in the new index, in
    ///    rounds while writers go on, the last round under the writer.
    /// 4. Under the writer and the gate: the new centroid index is swapped
    ///    in, the new postings stop being building ones (both in one step
    ///    for a snapshot), the old postings are removed.
    pub(crate) fn rebuild_static(&self) -> Result<()> {
        self.rebuild_static_locked(self.rebuild_lock.lock())
    }

    /// [`Inner::rebuild_static`] under the rebuild lock `_one`.
    fn rebuild_static_locked(&self, _one: parking_lot::MutexGuard<'_, ()>) -> Result<()> {
        let (pids, vid_end, input_at) = {
            let _w = self.writer.lock();
            let input_at = self.changes();
            if self.changes_since_build() == 0 {
                return Ok(());
            }
            *self.rebuilding.lock() = Some(Rebuilding::default());
            let pids: Vec<u32> = (0..self.store.posting_ids())
                .filter(|&p| self.store.entry(p).is_some())
                .collect();
            (pids, self.versions.len(), input_at)
        };
        // From here until the swap, an error or a panic abandons it.
        let mut abandon = Abandon {
            inner: self,
            armed: true,
        };
        let job = self.activity.begin("rebuild");
        let heads = Arc::new(self.heads.fresh()?);
        let read = self.build_beside(&heads, &pids, vid_end)?;
        let w = self.writer.lock();
        let swap_at = Instant::now();
        let last = self.place_inserted(&heads, &read);
        drop(read);
        let _g = self.gate.read();
        let last = last?;
        self.counters
            .rebuild_last_round_max
            .fetch_max(last as u64, Ordering::Relaxed);
        // Its other holder, `Rebuilding::heads`, lets go (writers clone it
        // only under the writer lock, held here).
        if let Some(r) = self.rebuilding.lock().as_mut() {
            r.heads = None;
        }
        let heads = Arc::try_unwrap(heads).map_err(|_| {
            Error::invalid("spann rebuild: the new index is still shared at its swap")
        })?;
        abandon.armed = false;
        let Rebuilding {
            building: built,
            homes,
            ..
        } = self.rebuilding.lock().take().unwrap_or_default();
        self.heads.replace(heads);
        // The homes move to the new postings only now: a snapshot taken
        // during the rebuild recorded the old ones, which it kept whole.
        for (vid, pid) in homes {
            self.set_home(vid, pid, 0);
        }
        // Every posting but the new ones goes: those the rebuild read, and
        // any a writer created meanwhile (a vector no posting took gets one
        // of its own, named only by the old centroids), whose vectors the
        // rebuild placed again.
        // Their ids are free at once: no centroid in use names them, and
        // no writer routes meanwhile (all wait for the writer lock held
        // here; a writer takes its route under it).
        for p in (0..self.store.posting_ids()).filter(|p| !built.contains(p)) {
            let _l = self.lock(p);
            if let Some(e) = self.store.entry(p) {
                self.store.remove(p, &e);
                self.store.free_id(p);
            }
        }
        // The changes made while it ran count as changes since the build:
        // they were placed one by one, as inserts are, not built. (Before,
        // they did not: a rebuild that began at 11K vectors of a 100K bulk
        // load built 1,110 postings and appended the other 89K to them,
        // 136 records each against a split limit of 59, and no rebuild
        // was due again until 25K more changes.)
        self.built_at.store(input_at, Ordering::Relaxed);
        self.carried.store(0, Ordering::Relaxed);
        self.rebuild_failed_at.store(u64::MAX, Ordering::Relaxed);
        self.counters.rebuilds.fetch_add(1, Ordering::Relaxed);
        drop(_g);
        drop(w);
        self.counters
            .rebuild_swap_micros_max
            .fetch_max(swap_at.elapsed().as_micros() as u64, Ordering::Relaxed);
        // The snapshot is a job of its own.
        drop(job);
        self.snapshot()
    }

    /// A failed (or panicked) rebuild's postings go again (no centroid in
    /// use names them), and writers stop recording for it. They are removed while
    /// still recorded as building, so no snapshot in between records one;
    /// no home points at them (homes move only at the swap).
    fn abandon_rebuild(&self) {
        // No writer places in the new index meanwhile (writers place in it
        // only under the writer lock): one that found the postings it
        // routed to removed would create one this would not see.
        let _w = self.writer.lock();
        if let Some(r) = self.rebuilding.lock().as_mut() {
            r.heads = None;
        }
        self.rebuild_failed_at
            .store(self.changes(), Ordering::Relaxed);
        let building: Vec<u32> = self
            .rebuilding
            .lock()
            .as_ref()
            .map(|r| r.building.iter().copied().collect())
            .unwrap_or_default();
        let mut removed = Vec::with_capacity(building.len());
        for p in building {
            let _l = self.lock(p);
            if let Some(entry) = self.store.entry(p) {
                self.store.remove(p, &entry);
                removed.push(p);
            }
        }
        *self.rebuilding.lock() = None;
        // Their ids are free only now: only this rebuild's own index, now
        // dropped, named them, and a new posting that took one while it
        // was still recorded as building would be left out of a snapshot
        // that records its centroid.
        for p in removed {
            self.store.free_id(p);
        }
    }

    /// Steps 2 and 3 of [`Inner::rebuild_static`] (all but the last round
    /// of placements); the vectors the build read.
    ///
    /// Inserts take free vector numbers while it runs (before, they took
    /// new ones, and with rebuilds running most of the time under a steady
    /// churn the numbers grew without bound: 160K to 518K for 100K live
    /// vectors in 30 minutes, 21 bytes each in RAM and in every snapshot).
    /// A free number has no record anywhere (the reclaim, which frees
    /// them, never runs beside a rebuild), so a record of one that the
    /// build reads is its new vector's: built once, and not placed again.
    fn build_beside(&self, heads: &Arc<Heads>, pids: &[u32], vid_end: u32) -> Result<HashSet<u32>> {
        let dim = self.dim;
        let mut vids = Vec::new();
        let mut data = Vec::new();
        let mut seen = HashSet::new();
        self.store.scan(pids, |_, recs| {
            for j in 0..recs.len() {
                let v = recs.vids[j];
                if v < vid_end && self.versions.is_current(v, recs.versions[j]) && seen.insert(v) {
                    vids.push(v);
                    data.extend_from_slice(recs.vector(j, dim));
                }
            }
            Ok(())
        })?;
        self.build(heads, &vids, &data, true)?;
        // From here on, writers place what they insert in the new index
        // themselves (`Rebuilding::heads`): the vectors inserted so far are
        // all that is left to place, and no more come.
        {
            let _w = self.writer.lock();
            if let Some(r) = self.rebuilding.lock().as_mut() {
                r.heads = Some(heads.clone());
            }
        }
        // Rounds of the vectors inserted meanwhile, while writers go on,
        // until few are left for the round under the writer (one round,
        // unless a writer's placement failed and left its vector here).
        for _ in 0..CATCH_UP_ROUNDS {
            if self.place_inserted(heads, &seen)? < CATCH_UP_LAST {
                break;
            }
        }
        Ok(seen)
    }

    /// Places the vectors inserted since the rebuild began (and not placed
    /// by an earlier round, nor `built`: read by the build) in the new
    /// index `heads`; how many were taken.
    fn place_inserted(&self, heads: &Heads, built: &HashSet<u32>) -> Result<usize> {
        #[cfg(test)]
        if self.fail_catch_up.swap(false, Ordering::AcqRel) {
            return Err(Error::invalid("injected: a catch-up round failed"));
        }
        let (vids, data) = match self.rebuilding.lock().as_mut() {
            Some(r) => (std::mem::take(&mut r.vids), std::mem::take(&mut r.data)),
            None => return Ok(0),
        };
        let dim = self.dim;
        let mut sc = self.scratch();
        let placed = (|| {
            for (i, &vid) in vids.iter().enumerate() {
                if !self.versions.is_current(vid, 0) || built.contains(&vid) {
                    continue;
                }
                let v = &data[i * dim..(i + 1) * dim];
                self.place_building(heads, vid, v, &mut sc)?;
            }
            Ok(vids.len())
        })();
        self.give_back(sc);
        placed
    }
}

/// Abandons the rebuild in progress when dropped armed: on an error's
/// return or a panic's unwind before the swap (a panic caught above left
/// its half-built postings stored and writers recording for it, and a
/// failure was not counted).
struct Abandon<'a> {
    inner: &'a Inner,
    armed: bool,
}

impl Drop for Abandon<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.inner.abandon_rebuild();
        }
    }
}

/// Rounds of placing a rebuild's inserted vectors while writers go on
/// (each places what the last one saw arrive).
const CATCH_UP_ROUNDS: usize = 8;

/// A round placing fewer than this leaves the rest to the round under the
/// writer.
const CATCH_UP_LAST: usize = 64;

#[cfg(test)]
mod tests {
    use crate::{Mode, SpannParams, Spfresh};
    use std::sync::atomic::{AtomicBool, Ordering};
    use vectide_core::{Metric, VectorIndex};

    /// A rebuild that fails after writers began placing in its new index
    /// (an injected failure of its catch-up round) leaves no posting of
    /// that index behind: none stored without a centroid in use, and a
    /// snapshot that opens again (abandoning, it holds the writers off,
    /// so that none creates a posting it does not see).
    #[test]
    fn a_rebuild_abandoned_while_writers_place_in_it_leaves_nothing_behind() {
        const DIM: usize = 8;
        let dir = tempfile::tempdir().unwrap();
        let p = SpannParams {
            threads: Some(2),
            posting_pages: 1,
            ..SpannParams::default()
        };
        let row = |i: u64| -> Vec<f32> {
            (0..DIM)
                .map(|j| ((i * 31 + j as u64 * 7) % 97) as f32 + (i % 13) as f32 * 10.0)
                .collect()
        };
        let rows = |a: u64, b: u64| (a..b).flat_map(row).collect::<Vec<f32>>();
        {
            let idx = Spfresh::create(dir.path(), DIM, Metric::L2, Mode::Static, p).unwrap();
            assert!(idx.defer_maintenance());
            idx.insert(1, &(0..3000).collect::<Vec<u64>>(), &rows(0, 3000))
                .unwrap();
            idx.delete(2, &(0..1500).collect::<Vec<u64>>()).unwrap();
            idx.insert(3, &(3000..4500).collect::<Vec<u64>>(), &rows(3000, 4500))
                .unwrap();
            // (A reclaim in the background holds the rebuild lock, and no
            // rebuild is due while it runs: the jobs end first.)
            idx.drain_jobs().unwrap();
            assert!(idx.maintenance_due());
            idx.inner.fail_catch_up.store(true, Ordering::Release);
            let done = AtomicBool::new(false);
            std::thread::scope(|s| {
                s.spawn(|| {
                    let mut id = 10_000u64;
                    while !done.load(Ordering::Acquire) || id < 10_100 {
                        idx.insert(id, &[id], &row(id)).unwrap();
                        id += 1;
                    }
                });
                assert!(idx.maintain().is_err(), "the injected failure");
                done.store(true, Ordering::Release);
            });
            assert_eq!(idx.stats().unwrap().extra_value("rebuilds"), Some(0.0));
            let problems = idx.check_structure().unwrap();
            assert!(problems.is_empty(), "{problems:#?}");
            idx.flush().unwrap();
            // The next rebuild goes through.
            idx.maintain().unwrap();
            let problems = idx.check_structure().unwrap();
            assert!(problems.is_empty(), "{problems:#?}");
        }
        let mut params = vectide_core::Params::new();
        params.insert("threads".into(), vectide_core::ParamValue::Int(2));
        let idx = Spfresh::open(dir.path(), &params).unwrap();
        let problems = idx.check_structure().unwrap();
        assert!(problems.is_empty(), "{problems:#?}");
    }
}
