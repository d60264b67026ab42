//! The `fresh-diskann` write path (§5.2, §5.6): validated calls, the redo
//! log (standalone) or none (under the database), the RW-TempIndex and the
//! location map, and the freeze that snapshots the RW index.

use crate::manifest::{self, Manifest};
use crate::state::*;
use parking_lot::MutexGuard;
use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use vectide_core::fault::{self, FaultSite};
use vectide_core::validate::Checked;
use vectide_core::{Error, Result, Seq, VectorIndex};
use vectide_storage::durable::{await_sync, select_rows, RedoLog};

/// The fault point between a write's log and its apply (tests of the
/// poisoned state).
pub const APPLY_FAULT: FaultSite = FaultSite("fresh-diskann.apply");

impl Inner {
    // ----- writes -----

    /// Applies an insert (after logging, or in replay): rows whose id holds a
    /// newer or equal sequence number are skipped.
    pub(crate) fn apply_insert(
        &self,
        seq: u64,
        batch: Checked<'_>,
        progress: Option<vectide_core::Progress<'_>>,
    ) -> Result<()> {
        let ids = batch.ids();
        let rw = self.state.read().rw().clone();
        rw.index.insert_checked_rows(seq, batch, progress)?;
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
    pub(crate) fn newer_rows(&self, seq: u64, ids: &[u64]) -> Vec<usize> {
        let st = self.state.read();
        ids.iter()
            .enumerate()
            .filter(|(_, id)| st.loc.get(id).is_none_or(|l| seq > l.seq))
            .map(|(i, _)| i)
            .collect()
    }

    /// The contract's insert: logged (standalone), applied, and synced
    /// before it returns (the `fdatasync` outside the writer lock, shared
    /// with the writers that logged meanwhile: group commit, `wal.rs`). A
    /// failure of the log, its sync or the apply poisons the index (its
    /// state may then differ from its log).
    pub(crate) fn insert(
        self: &Arc<Self>,
        seq: Seq,
        batch: Checked<'_>,
        progress: Option<vectide_core::Progress<'_>>,
    ) -> Result<()> {
        let (ids, vectors) = (batch.ids(), batch.vectors());
        let mut w = self.writer.lock();
        self.poison.check()?;
        let rows = self.newer_rows(seq, ids);
        let (ids, vectors) = select_rows(self.dim, ids, vectors, &rows);
        let pending = match &mut w.log {
            Some(log) => Some(
                log.write_insert(seq, &ids, &vectors)
                    .map_err(|e| self.poison.poison(&format!("the log of write {seq}"), &e))?,
            ),
            None => None,
        };
        if !ids.is_empty() {
            // Rows of a checked batch are a checked batch.
            let rows = Checked::validated_by_caller(self.dim, self.metric, &ids, &vectors);
            fault::hit(&self.dir, APPLY_FAULT)
                .and_then(|()| self.apply_insert(seq, rows, progress))
                .map_err(|e| self.poison.poison(&format!("the apply of write {seq}"), &e))?;
        }
        self.durable.fetch_max(seq, Ordering::AcqRel);
        let merge = self.after_write(&mut w);
        drop(w);
        await_sync(pending, &self.poison, seq)?;
        self.synced.fetch_max(seq, Ordering::AcqRel);
        if merge? {
            self.merge()?;
        }
        Ok(())
    }

    /// The contract's delete: logged (standalone), applied, then synced;
    /// poisons like [`Inner::insert`].
    pub(crate) fn delete(self: &Arc<Self>, seq: Seq, ids: &[u64]) -> Result<usize> {
        let mut w = self.writer.lock();
        self.poison.check()?;
        let targets: Vec<u64> = {
            let st = self.state.read();
            let mut seen = HashSet::new();
            ids.iter()
                .copied()
                .filter(|id| st.loc.get(id).is_some_and(|l| l.seq <= seq) && seen.insert(*id))
                .collect()
        };
        let pending = match &mut w.log {
            Some(log) => Some(
                log.write_delete(seq, &targets)
                    .map_err(|e| self.poison.poison(&format!("the log of write {seq}"), &e))?,
            ),
            None => None,
        };
        let n = fault::hit(&self.dir, APPLY_FAULT)
            .and_then(|()| self.apply_delete(seq, &targets))
            .map_err(|e| self.poison.poison(&format!("the apply of write {seq}"), &e))?;
        self.durable.fetch_max(seq, Ordering::AcqRel);
        let merge = self.after_write(&mut w);
        drop(w);
        await_sync(pending, &self.poison, seq)?;
        self.synced.fetch_max(seq, Ordering::AcqRel);
        if merge? {
            self.merge()?;
        }
        Ok(n)
    }

    /// Freezes a full RW index and starts a merge that is due; returns
    /// whether the caller runs one inline (after releasing the writer).
    pub(crate) fn after_write(self: &Arc<Self>, w: &mut MutexGuard<'_, Writer>) -> Result<bool> {
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
    pub(crate) fn manifest_now(&self, w: &Writer, covered: Seq) -> Manifest {
        let mut m = w.manifest.clone();
        m.covered_seq = covered;
        let st = self.state.read();
        m.lti_dead = st.lti_dead.clone();
        m.ro_dead = st.ro_dead.clone();
        m
    }

    /// Freezes the RW-TempIndex: snapshot, a new redo log (standalone),
    /// the manifest naming both, then the old log removed. With
    /// `log=database` and an empty RW index, only the manifest is
    /// rewritten (so that it covers the deletes since the last freeze).
    /// Refused once poisoned: the state in memory lacks a logged write, and
    /// the freeze would drop the log that holds it.
    ///
    /// One freeze at a time: a freeze that finds another in flight waits
    /// for it without the writer lock (the other needs the lock to end).
    /// The frozen index is saved without the writer lock, a new RW index
    /// taking the writes meanwhile ([`Inner::freeze_switch`]); writers
    /// wait only while the indexes are switched and the manifest written.
    pub(crate) fn freeze(&self, w: &mut MutexGuard<'_, Writer>) -> Result<()> {
        let _one = match self.freeze_lock.try_lock() {
            Some(g) => g,
            None => MutexGuard::unlocked(w, || self.freeze_lock.lock()),
        };
        self.poison.check()?;
        let _job = self.status.activity.begin("freeze");
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
        self.freeze_switch(w, rw, next)
    }

    /// The manifest naming the frozen `serial` as a snapshot and `serial +
    /// 1` as the RW serial, covering `covered`, written and put in force
    /// (the last step of every freeze, and of a recovery that finishes
    /// one a crash cut).
    pub(crate) fn name_frozen(&self, w: &mut Writer, serial: u64, covered: Seq) -> Result<()> {
        let mut m = self.manifest_now(w, covered);
        m.ro.push(serial);
        m.rw = serial + 1;
        m.write(&self.dir)?;
        w.manifest = m;
        self.covered.fetch_max(covered, Ordering::AcqRel);
        Ok(())
    }

    /// The freeze of a non-empty RW-TempIndex `S`, in steps: (0)
    /// standalone, without the writer lock, `redo-(S+1).log` is created
    /// (its header synced); (1) under the lock a new RW-TempIndex `S+1`
    /// takes the writes (standalone, logged in the new log) and the frozen
    /// `S` stays searchable (it changes no more: deletes of its points go
    /// to the RO dead list); (2) without the lock, `temp-S.fv` is saved;
    /// (3) under the lock again, the manifest naming `S` as a snapshot and
    /// `S+1` as the RW serial is written; standalone `redo-S.log` is then
    /// removed.
    ///
    /// Under the database the manifest covers the watermark of (1): only
    /// then does `durable_seq()` (`covered`) move to the writes `S` holds,
    /// and a crash before (3) leaves the old manifest and watermark, for
    /// the database to replay those writes. Standalone it covers the
    /// watermark of (3) (the writes after (1) are in the log it names),
    /// and a crash before (3) leaves the old manifest beside both logs:
    /// recovery replays `redo-S.log` into `S`, `redo-(S+1).log` into
    /// `S+1`, and finishes the freeze (`recovery.rs`). A failure after (1)
    /// poisons the index: the state in memory has a frozen temp index no
    /// manifest names, and a later manifest would drop it (the reopen
    /// replays).
    fn freeze_switch(
        &self,
        w: &mut MutexGuard<'_, Writer>,
        rw: Arc<Temp>,
        next: u64,
    ) -> Result<()> {
        let log = match self.params.external_log {
            true => None,
            false => {
                let path = manifest::log_file(&self.dir, next);
                let (log, stale) = MutexGuard::unlocked(w, || RedoLog::open(&path, self.dim))?;
                if !stale.ops.is_empty() || stale.torn {
                    return Err(Error::corrupted(format!(
                        "{} holds records of a log the manifest does not name",
                        path.display()
                    )));
                }
                // A write may have failed while the lock was let go.
                self.poison.check()?;
                Some(log)
            }
        };
        let at_switch = self.durable.load(Ordering::Acquire);
        let temp = self.new_temp(next)?;
        self.state.write().temps.push(temp);
        // Writers that logged in the old log wait for its sync on their
        // own tickets; the old log is closed once no manifest names it.
        let old = log.map(|l| w.log.replace(l));
        let serial = rw.serial;
        let why = |e: &Error| {
            self.poison
                .poison(&format!("the freeze of temp index {serial}"), e)
        };
        MutexGuard::unlocked(w, || rw.index.save(&manifest::temp_file(&self.dir, serial)))
            .map_err(|e| why(&e))?;
        let covered = match old {
            None => at_switch,
            Some(_) => self.durable.load(Ordering::Acquire),
        };
        self.name_frozen(w, serial, covered).map_err(|e| why(&e))?;
        if let Some(old) = old {
            drop(old);
            let _ = std::fs::remove_file(manifest::log_file(&self.dir, serial));
        }
        Ok(())
    }
}
