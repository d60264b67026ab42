//! A region put right after its memory node restarted on its backing file
//! (`docs/format-dhnsw.md`, "After a restart"). The node serves what it
//! held at its last FLUSH: every write this engine acknowledged, and of the
//! writes the restart cut short, whatever phases were durable. Those left
//! their partitions (or the free table) held, a rebuild intent perhaps, and
//! nodes written but never named in the label map, or named elsewhere
//! before their tombstone was written. None of their writers will finish:
//! their calls failed when the node went down.
//!
//! The header's boot word says in which of the node's boots the region was
//! last put right. The first compute node to see it behind the node's boot
//! marks it (CAS, FLUSHed) and puts the region right: the values a crash
//! left in label-map buckets without a key zeroed; the free table's lock
//! given back; every partition taken (over, when held), its intent folded,
//! its labels reconciled with the map (`locks.rs`), published; the counts
//! recounted; then the boot word set to the node's boot. Writers check the
//! boot word in the doorbell that takes a lock and wait while it is behind
//! or marked, so no live writer's lock is taken over; a recovery whose
//! compute node stopped is taken over after the take-over time.

use crate::layout::{BOOT_AT, ENTRY_BYTES, FREE_LOCK_AT, RECOVERING};
use crate::state::{DHnsw, Layout};
use std::time::{Duration, Instant};
use vectide_core::Result;

/// The boot number's bits in the boot word.
const BOOT_BITS: u64 = (1 << 48) - 1;

/// Whether the boot word `word` says a region of `mem` is put right for
/// the memory node's current boot.
pub(crate) fn boot_is_current(mem: &dyn vectide_remote::RemoteMemory, word: u64) -> bool {
    word == mem.boot() & BOOT_BITS
}

impl DHnsw {
    /// Before a call: when the memory node's boot moved since this node
    /// last saw the region put right (a restart), puts it right (or waits
    /// for whoever does). No round trip otherwise.
    pub(crate) fn ensure_recovered(&self) -> Result<()> {
        let boot = self.mem.boot() & BOOT_BITS;
        if self
            .layout
            .read()
            .as_ref()
            .is_none_or(|l| l.header.boot == boot)
        {
            return Ok(());
        }
        let _w = self.write.lock();
        let mut guard = self.layout.write();
        if let Some(lay) = guard.as_mut() {
            if lay.header.boot != boot {
                self.recover_if_restarted(lay)?;
                lay.header.boot = boot;
            }
        }
        Ok(())
    }

    /// Whether the boot word `word` says the region is put right for the
    /// memory node's current boot.
    pub(crate) fn boot_current(&self, word: u64) -> bool {
        boot_is_current(&*self.mem, word)
    }

    /// Puts `lay`'s region right if its memory node restarted since it was
    /// last (see the module docs); waits while another compute node does.
    /// Returns whether this node did.
    pub(crate) fn recover_if_restarted(&self, lay: &mut Layout) -> Result<bool> {
        let lease = self.lease();
        let mut seen: Option<(u64, Instant)> = None;
        loop {
            let boot = self.mem.boot() & BOOT_BITS;
            let w = self.read_word(lay, BOOT_AT)?;
            if w == boot {
                return Ok(false);
            }
            if w & BOOT_BITS > boot {
                // Put right for a later boot than this node knows of (its
                // transport's greeting is stale): never claimed from here.
                return Err(vectide_core::Error::unavailable(
                    "d-hnsw: the memory node restarted since this compute node last greeted it; retry",
                ));
            }
            let marked = w & RECOVERING != 0 && w & BOOT_BITS == boot;
            let claim = if !marked {
                // Behind the node's boot: the first to mark it recovers.
                Some(boot | RECOVERING)
            } else {
                match seen {
                    // Marked and unchanged for the take-over time: its
                    // recovery stopped; take it over (the next attempt).
                    Some((s, since)) if s == w && since.elapsed() > lease => {
                        Some(w.wrapping_add(1 << 48) | RECOVERING)
                    }
                    Some((s, _)) if s == w => None,
                    _ => {
                        seen = Some((w, Instant::now()));
                        None
                    }
                }
            };
            match claim {
                Some(mark) => {
                    // No FLUSH of the boot word: a recovery whose end a
                    // crash loses is run again (it changes nothing twice).
                    if self.mem.cas(lay.region, BOOT_AT, w, mark)? != w {
                        continue;
                    }
                    if let Err(e) = self.recover_orphans(lay) {
                        // The mark taken back, so that the next attempt (any
                        // node's) starts at once rather than after the
                        // take-over time.
                        let _ = self.mem.cas(lay.region, BOOT_AT, mark, w);
                        return Err(e);
                    }
                    if self.mem.cas(lay.region, BOOT_AT, mark, boot)? != mark {
                        // Taken over meanwhile (this recovery outlived the
                        // take-over time): the other one finishes.
                        continue;
                    }
                    lay.header.boot = boot;
                    crate::state::Timing::add(&self.timing.recoveries, 1);
                    return Ok(true);
                }
                None => std::thread::sleep(Duration::from_millis(2)),
            }
        }
    }

    pub(crate) fn read_word(&self, lay: &Layout, at: u64) -> Result<u64> {
        let b = self.mem.read(lay.region, at, 8)?;
        Ok(u64::from_le_bytes(b[..8].try_into().expect("8 bytes")))
    }

    /// Puts right what writers that will not finish left (every lock held
    /// now is theirs): after a restart of the memory node, or when an
    /// owner takes a region's lease over (a leased region has no other
    /// writer). Its own takes skip the boot check meanwhile.
    pub(crate) fn recover_orphans(&self, lay: &mut Layout) -> Result<()> {
        self.recovering
            .store(true, std::sync::atomic::Ordering::Release);
        let done = self.recover(lay);
        self.recovering
            .store(false, std::sync::atomic::Ordering::Release);
        done
    }

    /// The recovery itself.
    fn recover(&self, lay: &mut Layout) -> Result<()> {
        // Values the restart left in buckets without a key (a claim it cut
        // short), zeroed before any writer claims a bucket.
        lay.map
            .clear_keyless(&*self.mem, crate::sites::MAP_UNTORN)?;
        // The free table's lock: held by a write the restart cut short.
        let free = self.read_word(lay, FREE_LOCK_AT)?;
        if free % 2 == 1 {
            self.mem.cas(lay.region, FREE_LOCK_AT, free, free + 1)?;
        }
        // Every partition, held or not (a node named elsewhere before its
        // tombstone was written sits in a published partition).
        let k = lay.table.len() as u32;
        let at = lay.header.table_off;
        let table =
            crate::fetch::read_range(&*self.mem, lay.region, at, at + u64::from(k) * ENTRY_BYTES)?;
        for p in 0..k {
            let b = &table[(p as u64 * ENTRY_BYTES) as usize..];
            let s = u64::from_le_bytes(
                b[crate::layout::ENTRY_STATE_AT as usize..][..8]
                    .try_into()
                    .expect("8 bytes"),
            );
            // Held by a write that will not finish: taken over at once
            // (odd to the next odd value); free: taken. A writer that took
            // it meanwhile gives it back at once (its doorbell saw the boot
            // word marked): the state read again and the take tried again.
            let mut s = s;
            let mut tries = 0;
            let take = loop {
                let take = if s % 2 == 1 { s + 2 } else { s + 1 };
                let found = self.mem.cas(lay.region, lay.state_at(p), s, take)?;
                if found == s {
                    break take;
                }
                tries += 1;
                if tries > 64 {
                    return Err(vectide_core::Error::unavailable(format!(
                        "d-hnsw: partition {p} kept changing while the region was put right after its memory node restarted"
                    )));
                }
                std::thread::sleep(Duration::from_millis(1));
                s = found;
            };
            // The entry as the region has it (this node's copy may match
            // the state read and still be older than the fields).
            self.reload_entry(lay, p, take)?;
            self.reconcile(lay, p)?;
            self.publish(lay, p, take)?;
        }
        // The free table from the partitions (the areas of rebuilds a
        // crash cut short come back), with its lock taken meanwhile.
        let (held, _) = self.take_word(lay.region, FREE_LOCK_AT, free + free % 2)?;
        let rebuilt = self.rebuild_free(lay);
        self.mem.cas(lay.region, FREE_LOCK_AT, held, held + 1)?;
        rebuilt?;
        // Every partition reconciled: nothing is owed.
        crate::fetch::post_unflushed(
            &*self.mem,
            lay.region,
            vec![(crate::layout::OWED_AT, 0u64.to_le_bytes().to_vec())],
        )?;
        self.taken_over
            .store(true, std::sync::atomic::Ordering::Release);
        self.recount_if_taken_over(lay)
    }
}
