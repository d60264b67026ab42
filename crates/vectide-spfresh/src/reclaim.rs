//! The reclaim of vector numbers (vids). An upsert gives the new vector a
//! number and marks the old one deleted; a delete marks its number
//! deleted. Each number costs its version byte, id, sequence number and
//! home in RAM and 21 bytes in every snapshot, so numbers must come back
//! for the index to stay the size of its live set under churn.
//!
//! A number may be given to a new vector only once nothing can take a
//! record of the old vector for the new one. Versions cannot tell them
//! apart: a search returns any copy of a live vector whatever its version
//! byte (a vector's data never changes, see `versions.rs`), and 7 bits
//! wrap anyway. So the old vector's records must be gone, from every
//! posting and from every reader's hands:
//!
//! 1. The dead numbers are taken (deleted in the version map, not already
//!    free), under the id maps' read lock, which an insert holds
//!    exclusively while it revives a free number.
//! 2. The gate is taken exclusively for a moment: every job or apply that
//!    read a record of one of them before its delete, and may still write
//!    it elsewhere (a split, a merge, a reassign), has finished. Every job
//!    from then on drops a deleted vector's records (`collect_garbage`)
//!    and cannot move it (its version CAS fails), and no insert writes an
//!    old number: no new record of these numbers appears.
//! 3. Every posting holding one of their records is PUT without them, each
//!    under the gate's read side and its posting lock (as a job's PUT).
//!    A posting created meanwhile (it may take an id the scan has passed)
//!    holds none of their records, by step 2.
//! 4. `readers` is taken exclusively for a moment: every search or get
//!    that read a posting before its PUT has answered.
//! 5. The numbers go onto the free list, their homes cleared.
//!
//! A `spann` rebuild reads the vectors numbered before it began and writes
//! postings beside the index in use; the reclaim holds `rebuild_lock`, so
//! the two never overlap (a reclaim due during a rebuild waits for the
//! next write): a number free while a rebuild runs has no record, and a
//! record of it that the rebuild reads is the new vector's (inserts take
//! free numbers then too; `rebuild.rs`, `build_beside`).
//!
//! Crashes: the free list is in the snapshot, captured under the gate with
//! the block mapping; a number is on it only after its PUTs, so a snapshot
//! never lists a free number that a posting it maps still holds. Recovery
//! replays the WAL (which logs ids and vectors, not numbers) from that
//! snapshot: a number freed or reused after it is dead in it, its old
//! records dead with it, and the replayed inserts take numbers from the
//! snapshot's own free list.

use crate::layout::Records;
use crate::state::{home_word, Inner, Scratch, NO_HOME};
use std::sync::atomic::Ordering;
use std::time::Instant;
use vectide_core::{Error, Result};

/// A reclaim is due once the dead numbers not yet free reach a
/// `RECLAIM_SHARE`-th of the live vectors, and at least this many.
pub(crate) const RECLAIM_FLOOR: usize = 16;

/// Until a reclaim, postings carry the dead numbers' records beside the
/// live ones: a quarter of the live count bounds that slack (a half let
/// `spfresh`'s block file swing by a third under a steady churn; a
/// quarter took the index from 6.4 to 3.6 bytes per live vector byte in
/// a 20K-point soak), for a reclaim twice as often.
pub(crate) const RECLAIM_SHARE: usize = 4;

/// PUT attempts of one posting before the reclaim gives up (a posting
/// changes only under its lock, which the reclaim holds: one is enough).
const PUT_TRIES: usize = 4;

/// What one reclaim did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReclaimReport {
    /// Numbers freed.
    pub freed: u64,
    /// Postings read.
    pub postings_read: u64,
    /// Postings rewritten without the dead records.
    pub postings_rewritten: u64,
    /// Records dropped.
    pub records_dropped: u64,
    /// Bytes of the blocks those PUTs wrote.
    pub bytes_written: u64,
    pub micros: u64,
}

impl Inner {
    /// Dead numbers that are not free yet.
    pub(crate) fn dead_unfree(&self) -> (usize, usize) {
        let live = self.ids.read().ext.len();
        let free = self.free.lock().len();
        let vids = self.versions.len() as usize;
        (vids.saturating_sub(live + free), live)
    }

    /// Whether enough numbers are dead for a reclaim (module docs).
    pub(crate) fn reclaim_due(&self) -> bool {
        self.reclaim_lag() > 0
    }

    /// The dead numbers not yet free over the reclaim's threshold, in
    /// whole thresholds (0: no reclaim due).
    pub(crate) fn reclaim_lag(&self) -> usize {
        let (dead, live) = self.dead_unfree();
        dead / (live / RECLAIM_SHARE).max(RECLAIM_FLOOR)
    }

    /// The reclaim job: when due (and no `spann` rebuild runs), the dead
    /// numbers' records dropped and the numbers freed (module docs).
    pub(crate) fn reclaim(&self, sc: &mut Scratch) -> Result<Option<ReclaimReport>> {
        if !self.reclaim_due() {
            return Ok(None);
        }
        let r = self.reclaim_now(sc);
        // A write that made a standalone `spann` rebuild due while this
        // held the rebuild lock found none due and started none.
        if !self.params.rebuild_inline {
            self.start_rebuild_if_due();
        }
        r
    }

    /// A reclaim of every dead number now, due or not; `None` when a
    /// rebuild runs (it is queued again after that rebuild's next write).
    pub(crate) fn reclaim_now(&self, sc: &mut Scratch) -> Result<Option<ReclaimReport>> {
        let Some(_one) = self.rebuild_lock.try_lock() else {
            return Ok(None);
        };
        let _job = self.activity.begin("reclaim");
        let t0 = Instant::now();
        let mut rep = ReclaimReport::default();
        // 1. The dead numbers.
        let (dead, count) = {
            let _ids = self.ids.read();
            let free = self.free.lock();
            let n = self.versions.len() as usize;
            let mut dead = vec![false; n];
            for i in 0..n as u32 {
                dead[i as usize] = self.versions.get(i).is_some_and(|s| s.deleted);
            }
            for &v in free.iter() {
                dead[v as usize] = false;
            }
            let count = dead.iter().filter(|&&d| d).count();
            (dead, count)
        };
        if count == 0 {
            return Ok(Some(rep));
        }
        let is_dead = |v: u32| dead.get(v as usize).copied().unwrap_or(false);
        // 2. Jobs that may still copy their records finish.
        drop(self.gate.write());
        // 3. Their records dropped.
        let rb = crate::layout::record_bytes(self.dim);
        let mut pid = 0;
        while pid < self.store.posting_ids() {
            self.drop_records(pid, &is_dead, rb, &mut rep, sc)?;
            pid += 1;
        }
        // 4. Readers holding records read before those PUTs answer.
        drop(self.readers.write());
        // 5. Free.
        {
            // The order an insert takes them in.
            let mut free = self.free.lock();
            let homes = self.homes.read();
            for (v, _) in dead.iter().enumerate().filter(|(_, &d)| d) {
                homes[v].store(home_word(NO_HOME, 0), Ordering::Release);
                free.push(v as u32);
            }
        }
        rep.freed = count as u64;
        rep.micros = t0.elapsed().as_micros() as u64;
        let c = &self.counters;
        c.reclaims.fetch_add(1, Ordering::Relaxed);
        c.reclaimed_vids.fetch_add(rep.freed, Ordering::Relaxed);
        c.reclaim_postings
            .fetch_add(rep.postings_rewritten, Ordering::Relaxed);
        c.reclaim_bytes
            .fetch_add(rep.bytes_written, Ordering::Relaxed);
        c.reclaim_micros.fetch_add(rep.micros, Ordering::Relaxed);
        // The blocks the PUTs released come back at the next snapshot (one
        // is forced once they exceed a third of the blocks in use).
        Ok(Some(rep))
    }

    /// Step 3 for posting `pid`.
    fn drop_records(
        &self,
        pid: u32,
        is_dead: &dyn Fn(u32) -> bool,
        rb: usize,
        rep: &mut ReclaimReport,
        sc: &mut Scratch,
    ) -> Result<()> {
        let _g = self.gate.read();
        let _l = self.lock(pid);
        for _ in 0..PUT_TRIES {
            let Some(entry) = self.store.get(pid, &mut sc.recs, &mut sc.read)? else {
                return Ok(());
            };
            rep.postings_read += 1;
            let recs = &sc.recs;
            if !recs.vids.iter().any(|&v| is_dead(v)) {
                return Ok(());
            }
            let mut kept = Records::default();
            for j in 0..recs.len() {
                if !is_dead(recs.vids[j]) {
                    kept.vids.push(recs.vids[j]);
                    kept.versions.push(recs.versions[j]);
                    kept.vectors.extend_from_slice(recs.vector(j, self.dim));
                }
            }
            let mut bytes = Vec::with_capacity(kept.len() * rb);
            kept.encode(self.dim, &mut bytes);
            match self.store.put(pid, &bytes, &Some(entry))? {
                crate::blockstore::Swap::Done(_) => {
                    rep.postings_rewritten += 1;
                    rep.records_dropped += (recs.len() - kept.len()) as u64;
                    rep.bytes_written += (crate::layout::blocks_for(bytes.len())
                        * vectide_storage::block::BLOCK)
                        as u64;
                    return Ok(());
                }
                crate::blockstore::Swap::Gone => return Ok(()),
                crate::blockstore::Swap::Changed => continue,
            }
        }
        Err(Error::invalid(format!(
            "reclaim: posting {pid} kept changing under its lock"
        )))
    }
}

#[cfg(test)]
mod tests {
    use crate::{Mode, SpannParams, Spfresh};
    use std::time::Duration;
    use vectide_core::{Metric, VectorIndex};

    /// A reader that began before a reclaim holds it between its PUTs and
    /// the freeing of the numbers: the records are gone, the numbers not
    /// yet free, until the reader is done (without the `readers` barrier
    /// the numbers were free at once).
    #[test]
    fn numbers_are_freed_only_after_the_readers_that_began_before() {
        let dir = tempfile::tempdir().unwrap();
        let p = SpannParams {
            rebuild_inline: true,
            threads: Some(1),
            ..SpannParams::default()
        };
        let idx = Spfresh::create(dir.path(), 4, Metric::L2, Mode::Inplace, p).unwrap();
        let ids: Vec<u64> = (0..64).collect();
        let data: Vec<f32> = (0..64 * 4).map(|i| (i % 17) as f32).collect();
        idx.insert(1, &ids, &data).unwrap();
        let inner = idx.inner.clone();
        let reader = inner.readers.read();
        std::thread::scope(|s| {
            // The delete makes a reclaim due; inline, it runs in the call.
            let deleting = s.spawn(|| idx.delete(2, &ids[..40]).unwrap());
            // Until every stored record is current: the dead ones dropped.
            let swept = || {
                let c = inner.census().unwrap();
                c.records == c.current
            };
            let mut waited = 0;
            while inner.ids.read().ext.len() > 24 && waited < 250 {
                std::thread::sleep(Duration::from_millis(20));
                waited += 1;
            }
            while !swept() && waited < 500 {
                std::thread::sleep(Duration::from_millis(20));
                waited += 1;
            }
            assert!(swept(), "the reclaim's PUTs do not wait for readers");
            std::thread::sleep(Duration::from_millis(200));
            assert!(inner.free.lock().is_empty(), "freed under a reader");
            assert!(!deleting.is_finished(), "the reclaim waits for the reader");
            drop(reader);
            assert_eq!(deleting.join().unwrap(), 40);
        });
        assert_eq!(inner.free.lock().len(), 40);
        assert!(inner.check_structure().unwrap().is_empty());
    }
}
