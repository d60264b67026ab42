//! Old nodes a stopped writer owed a tombstone. An upsert that moves a
//! label names its new node, publishes that partition, and only then, with
//! no partition held, tombstones the old node (taking a second partition
//! while holding one could wait in a cycle). A writer that stops in between
//! leaves the old node live though no label names it: searches would
//! answer it. So the writer raises the header's owed word before the
//! publish and lowers it after the tombstones; `maintain` on any compute
//! node that sees the word at one nonzero value for the take-over time
//! (its writers are gone: a live one lowers it within a write) reconciles
//! every partition and sets the word back (`docs/format-dhnsw.md`).

use crate::layout::OWED_AT;
use crate::state::{DHnsw, Layout};
use std::time::Instant;
use vectide_core::Result;

impl DHnsw {
    /// Raises the owed word by `by` (> 0), or lowers it by `-by`, never
    /// below 0 (a sweep may have set it to 0 while this writer's
    /// tombstones were under way: lowering it past 0 would hide another
    /// writer's raise).
    pub(crate) fn owe(&self, lay: &Layout, by: i64) -> Result<()> {
        if by > 0 {
            self.mem.fetch_add(lay.region, OWED_AT, by as u64)?;
        } else if by < 0 {
            let mut w = self.read_word(lay, OWED_AT)?;
            while w > 0 {
                let next = w.saturating_sub(by.unsigned_abs());
                let found = self.mem.cas(lay.region, OWED_AT, w, next)?;
                if found == w {
                    break;
                }
                w = found;
            }
        }
        Ok(())
    }

    /// `maintain`'s part: returns how many partitions it reconciled (0 when
    /// nothing was owed, or not for long enough yet).
    pub(crate) fn sweep_owed(&self, lay: &mut Layout) -> Result<usize> {
        if !self.may_repair(lay)? {
            return Ok(0);
        }
        let w = self.read_word(lay, OWED_AT)?;
        let mut seen = self.owed_seen.lock();
        if w == 0 {
            *seen = None;
            return Ok(0);
        }
        match *seen {
            Some((v, since)) if v == w && since.elapsed() > self.lease() => {}
            Some((v, _)) if v == w => return Ok(0),
            _ => {
                *seen = Some((w, Instant::now()));
                return Ok(0);
            }
        }
        *seen = None;
        drop(seen);
        let k = lay.table.len() as u32;
        for p in 0..k {
            let held = self.acquire(lay, p)?;
            let fixed = self.reconcile(lay, p);
            let given = self.release(lay, p, held);
            fixed?;
            given?;
        }
        // Live writers may have moved it meanwhile: then it stays, and the
        // next sweep waits for it again.
        self.mem.cas(lay.region, OWED_AT, w, 0)?;
        self.taken_over
            .store(true, std::sync::atomic::Ordering::Release);
        self.recount_if_taken_over(lay)?;
        Ok(k as usize)
    }
}
