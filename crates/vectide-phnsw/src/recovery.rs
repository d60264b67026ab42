//! Recovery on open (§5): NlistLog undo first, then NLog redo.
//!
//! 1. DRAM locks are new (they are never in the region).
//! 2. NlistLog: a `LOGGED` entry means the in-edge batch of its operation
//!    may be half written: every list of that batch gets its old count and
//!    entries back and the operation's progress word moves back to the batch
//!    (persisted; made durable by the redo's first fence). `LOGGING`
//!    entries are ignored (reset).
//! 3. NLog, per entry: `LOGGING` → discarded (the node was never linked);
//!    `LOGGED` → the out-edges are rewritten from the log → fence, then as
//!    below from the first in-edge batch; `N_COMPLETE` → the in-edges are
//!    redone with the insert's own code (NlistLog-protected) from the first
//!    batch not written, the operation is published → fence, `NONE` → fence.
//!    A logged delete is applied again → fence, `NONE` → fence.
//!
//! The nodes an NLog entry names (its new node, the node it replaces or
//! deletes) are verified against their checksums before anything is redone:
//! a damaged node is [`Error::Corrupted`] naming its slot, and nothing of the
//! entry is written.
//!
//! Every step is idempotent and uses the same logs and states as the normal
//! path, so a crash during recovery is recovered by the next open (§5.4).
//! The work is proportional to the log entries in flight, never to the
//! number of nodes: no node or bucket is scanned. The one exception comes
//! after it: a consolidation that a crash cut off while its repaired lists
//! could leave a live node unreachable (the meta word `consolidating`) is
//! run again by the open, as `maintain()` would run it.

use super::log::{NEntry, KIND_DELETE, LOGGED, LOGGING, NONE, N_COMPLETE};
use super::state::PHnsw;
use std::time::Instant;
use vectide_core::{Error, Result};
use vectide_storage::Site;

pub(crate) const S_R_UNDO: Site = Site("recovery.undo_list");
pub(crate) const F_R_UNDO: Site = Site("recovery.fence.undo_list");
pub(crate) const S_R_DONE: Site = Site("recovery.none");
pub(crate) const F_R_DONE: Site = Site("recovery.fence.none");

/// What a recovery did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// NlistLog entries undone (old lists written back).
    pub lists_undone: usize,
    /// NLog entries discarded (`LOGGING`).
    pub discarded: usize,
    /// Inserts redone from `LOGGED` (out-edges and in-edges).
    pub redone_logged: usize,
    /// Inserts redone from `N_COMPLETE` (in-edges).
    pub redone_complete: usize,
    /// Deletes redone.
    pub deletes_redone: usize,
    /// A consolidation the crash cut off between its first repaired list
    /// and its last relink was finished by the open (its time is not in
    /// `micros`).
    pub consolidation_finished: bool,
    /// Wall time of the recovery, microseconds.
    pub micros: u64,
}

impl PHnsw {
    fn check_slot(&self, slot: u32, what: &str) -> Result<()> {
        if (slot as usize) < self.next_slot() {
            Ok(())
        } else {
            Err(Error::corrupted(format!(
                "{what} names node {slot}, beyond the {} allocated",
                self.next_slot()
            )))
        }
    }

    pub(crate) fn recover(&self) -> Result<RecoveryReport> {
        let t = Instant::now();
        let mut rep = RecoveryReport::default();
        let meta = &self.meta;
        // NlistLog first, one operation's partition at a time. A LOGGED
        // entry marks the in-edge batch that operation was writing (its
        // lists are still locked at the crash, so nobody else changed them):
        // every entry of that batch is undone, LOGGED or already NONE, and
        // the operation's progress word moves back to the batch, durably
        // with the restored lists, so that the redo (of this recovery or of
        // the next, if this one crashes) recomputes the whole batch exactly.
        let per = self.logs.nlist_per_op();
        for owner in 0..self.g.nlog_entries {
            let part = owner * per..((owner + 1) * per).min(self.g.nlist_entries);
            let mut in_flight = None;
            for i in part.clone() {
                match self.logs.nlist_state(meta, i) {
                    NONE => {}
                    LOGGING => self.logs.nlist_store_state(meta, i, NONE),
                    LOGGED => {
                        in_flight = Some((
                            self.logs.nlist_owner_batch(meta, i),
                            self.logs.nlist_batch_count(meta, i),
                        ))
                    }
                    s => {
                        return Err(Error::corrupted(format!(
                            "NlistLog entry {i} has unknown state {s}"
                        )))
                    }
                }
            }
            let Some(((new, batch), count)) = in_flight else {
                continue;
            };
            // The batch wrote the owner's first `count` entries; entries
            // after them may carry the same node and batch number from an
            // older batch (a reused slot, a consolidation) and stay alone.
            let victims: Vec<usize> = part
                .take(count)
                .filter(|&i| self.logs.nlist_owner_batch(meta, i) == (new, batch))
                .collect();
            for &i in &victims {
                let (slot, level, old) = self.logs.nlist_read(meta, i).ok_or_else(|| {
                    Error::corrupted(format!("NlistLog entry {i} is LOGGED but malformed"))
                })?;
                self.check_slot(slot, "NlistLog entry")?;
                self.write_list(slot, level, &old, S_R_UNDO);
            }
            if self.logs.nlog_inedges(meta, owner) > batch {
                self.logs.nlog_set_inedges(meta, owner, batch, S_R_UNDO);
            }
            // The restored lists and progress must be durable before the
            // entries are released, and the entries' NONE durable before
            // anything else changes: a consolidation's batch is not redone
            // (nothing re-logs its entries), and an insert's redo may log
            // fewer lists than the batch it undid, so an entry left LOGGED
            // on the media would be undone again by a later recovery, over
            // lists written since.
            meta.fence(F_R_UNDO);
            for &i in &victims {
                self.logs.nlist_set_state(meta, i, NONE, S_R_UNDO);
            }
            meta.fence(F_R_UNDO);
            rep.lists_undone += victims.len();
        }
        // Then NLog.
        let mut scratch = self.scratch.get();
        for i in 0..self.g.nlog_entries {
            let state = self.logs.nlog_state(meta, i);
            match state {
                NONE => continue,
                LOGGING => {
                    self.logs.nlog_store_state(meta, i, NONE);
                    rep.discarded += 1;
                    continue;
                }
                LOGGED | N_COMPLETE => {}
                s => {
                    return Err(Error::corrupted(format!(
                        "NLog entry {i} has unknown state {s}"
                    )))
                }
            }
            let e: NEntry = self.logs.nlog_read(meta, i).ok_or_else(|| {
                Error::corrupted(format!("NLog entry {i} is logged but malformed"))
            })?;
            self.check_slot(e.slot, "NLog entry")?;
            // The node this entry redoes was made durable, checksum
            // included, by the fence before its entry became LOGGED: a
            // mismatch is damage, not a crash state.
            self.graph.verify(e.slot)?;
            if let Some(o) = e.old {
                self.check_slot(o, "NLog entry (old node)")?;
                self.graph.verify(o)?;
            }
            if e.kind == KIND_DELETE {
                self.apply_delete(i, &e);
                rep.deletes_redone += 1;
            } else {
                for &n in e.lists.iter().flatten() {
                    self.check_slot(n, "NLog out-edge")?;
                }
                let fresh = state == LOGGED;
                if fresh {
                    // LOGGED is durable already, so the redo from here on is
                    // guaranteed: N_COMPLETE need not be made durable (the
                    // progress word shares its cache line and carries it).
                    self.write_out_edges(&e);
                    self.logs.nlog_store_state(meta, i, N_COMPLETE);
                    rep.redone_logged += 1;
                } else {
                    rep.redone_complete += 1;
                }
                let from = if fresh {
                    0
                } else {
                    self.logs.nlog_inedges(meta, i)
                };
                self.link_back(i, e.slot, &e.lists, &mut scratch, from);
                self.publish(i, &e)?;
            }
            self.logs.nlog_set_state(meta, i, NONE, S_R_DONE);
            meta.fence(F_R_DONE);
        }
        rep.micros = t.elapsed().as_micros() as u64;
        Ok(rep)
    }
}
