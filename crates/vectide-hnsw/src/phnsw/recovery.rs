//! Recovery on open (§5): NlistLog undo first, then NLog redo.
//!
//! 1. DRAM locks are new (they are never in the region).
//! 2. NlistLog: a `LOGGED` entry means a neighbour list may be half
//!    rewritten: its old count and list are written back → fence, then the
//!    entry goes `NONE` → fence. `LOGGING` entries are ignored (reset).
//! 3. NLog, per entry: `LOGGING` → discarded (the node was never linked);
//!    `LOGGED` → the out-edges are rewritten from the log → fence, `N_COMPLETE`
//!    → fence, then as below; `N_COMPLETE` → the in-edges are redone with the
//!    insert's own code (NlistLog-protected; lists already holding the node
//!    are left alone), the operation is published → fence, `NONE` → fence.
//!    A logged delete is applied again → fence, `NONE` → fence.
//!
//! Every step is idempotent and uses the same logs and states as the normal
//! path, so a crash during recovery is recovered by the next open (§5.4).
//! The work is proportional to the log entries in flight, never to the
//! number of nodes: no node or bucket is scanned.

use super::engine::PHnsw;
use super::log::{NEntry, KIND_DELETE, LOGGED, LOGGING, NONE, N_COMPLETE};
use std::time::Instant;
use vectide_core::{Error, Result};
use vectide_storage::Site;

pub(crate) const S_R_UNDO: Site = Site("recovery.undo_list");
pub(crate) const F_R_UNDO: Site = Site("recovery.fence.undo_list");
pub(crate) const S_R_UNDO_DONE: Site = Site("recovery.undo_none");
pub(crate) const F_R_UNDO_DONE: Site = Site("recovery.fence.undo_none");
pub(crate) const S_R_NCOMPLETE: Site = Site("recovery.n_complete");
pub(crate) const F_R_NCOMPLETE: Site = Site("recovery.fence.n_complete");
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
        // NlistLog first.
        for i in 0..self.g.nlist_entries {
            match self.logs.nlist_state(meta, i) {
                NONE => {}
                LOGGING => self.logs.nlist_set_state(meta, i, NONE, S_R_UNDO_DONE),
                LOGGED => {
                    let (slot, level, old) = self.logs.nlist_read(meta, i).ok_or_else(|| {
                        Error::corrupted(format!("NlistLog entry {i} is LOGGED but malformed"))
                    })?;
                    self.check_slot(slot, "NlistLog entry")?;
                    self.write_list(slot, level, &old, S_R_UNDO);
                    meta.fence(F_R_UNDO);
                    self.logs.nlist_set_state(meta, i, NONE, S_R_UNDO_DONE);
                    meta.fence(F_R_UNDO_DONE);
                    rep.lists_undone += 1;
                }
                s => {
                    return Err(Error::corrupted(format!(
                        "NlistLog entry {i} has unknown state {s}"
                    )))
                }
            }
        }
        // Then NLog.
        let mut scratch = self.scratch.get();
        for i in 0..self.g.nlog_entries {
            let state = self.logs.nlog_state(meta, i);
            match state {
                NONE => continue,
                LOGGING => {
                    self.logs.nlog_release(meta, i);
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
            if let Some(o) = e.old {
                self.check_slot(o, "NLog entry (old node)")?;
            }
            if e.kind == KIND_DELETE {
                self.apply_delete(i, &e);
                rep.deletes_redone += 1;
            } else {
                for &n in e.lists.iter().flatten() {
                    self.check_slot(n, "NLog out-edge")?;
                }
                if state == LOGGED {
                    self.write_out_edges(&e);
                    self.logs.nlog_set_state(meta, i, N_COMPLETE, S_R_NCOMPLETE);
                    meta.fence(F_R_NCOMPLETE);
                    rep.redone_logged += 1;
                } else {
                    rep.redone_complete += 1;
                }
                self.link_back(e.slot, &e.lists, &mut scratch);
                self.publish(i, &e)?;
            }
            self.logs.nlog_set_state(meta, i, NONE, S_R_DONE);
            meta.fence(F_R_DONE);
        }
        rep.micros = t.elapsed().as_micros() as u64;
        Ok(rep)
    }
}
