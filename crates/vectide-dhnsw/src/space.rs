//! The region's free areas (`docs/format-dhnsw.md`, "free table"): what a
//! rebuild leaves behind (the partition's old blob, and its gap once no
//! partner shares it) is entered in a table in the region, and the next
//! rebuild, from any compute node, takes its area there first (first fit)
//! before growing into the untouched end of the region. The table is
//! changed under a lock word taken by CAS like a partition's state (even
//! free, odd held; a holder stuck past the timeout is taken over).
//!
//! Reusing an area at once is safe for readers: a partition's area is
//! freed only after its rebuild was published (its state moved on), and a
//! reader reads a partition's bytes between two reads of that partition's
//! state, so bytes reused under a reader's feet always come with a changed
//! state, and are read again.

use crate::layout::FREE_LOCK_AT;
use crate::state::{DHnsw, Layout};
use vectide_core::Result;

/// Bytes of one free-table slot: offset, length (0: empty).
pub const FREE_SLOT_BYTES: u64 = 16;

/// Free-table slots for `k` partitions.
pub fn free_slots_for(k: usize) -> u64 {
    2 * k as u64 + 64
}

fn word(b: &[u8]) -> u64 {
    u64::from_le_bytes(b.try_into().expect("8 bytes"))
}

impl DHnsw {
    /// Runs `f` with the free table's lock held, and gives it back.
    fn with_free_lock<R>(&self, lay: &Layout, f: impl FnOnce() -> Result<R>) -> Result<R> {
        let (held, _) = self.take_word(lay.region, FREE_LOCK_AT, 0)?;
        let out = f();
        let found = self.mem.cas(lay.region, FREE_LOCK_AT, held, held + 1);
        let out = out?;
        if found? != held {
            return Err(vectide_core::Error::unavailable(
                "d-hnsw: the free table was taken over while this compute node changed it",
            ));
        }
        Ok(out)
    }

    fn read_free(&self, lay: &Layout) -> Result<Vec<(u64, u64)>> {
        let b = crate::fetch::read_range(
            &*self.mem,
            lay.region,
            lay.header.free_off,
            lay.header.free_off + lay.header.free_slots * FREE_SLOT_BYTES,
        )?;
        Ok(b.chunks_exact(FREE_SLOT_BYTES as usize)
            .map(|s| (word(&s[..8]), word(&s[8..])))
            .collect())
    }

    fn slot_at(lay: &Layout, i: usize) -> u64 {
        lay.header.free_off + i as u64 * FREE_SLOT_BYTES
    }

    /// An area of `size` bytes (a multiple of 8) from the free table, first
    /// fit; `None` when no free area holds it.
    pub(crate) fn take_free(&self, lay: &Layout, size: u64) -> Result<Option<u64>> {
        if lay.header.free_slots == 0 {
            return Ok(None);
        }
        self.with_free_lock(lay, || self.take_free_held(lay, size))
    }

    fn take_free_held(&self, lay: &Layout, size: u64) -> Result<Option<u64>> {
        let slots = self.read_free(lay)?;
        let Some(i) = slots.iter().position(|&(_, len)| len >= size) else {
            return Ok(None);
        };
        let (off, len) = slots[i];
        let rest = if len == size {
            (0u64, 0u64)
        } else {
            (off + size, len - size)
        };
        self.write_slots(lay, &[i], Some((i, rest)))?;
        Ok(Some(off))
    }

    /// Enters `len` bytes at `off` in the free table, merged with a free
    /// neighbour on either side; returns false when the table had no room
    /// (the bytes stay dead until the index is laid out afresh).
    pub(crate) fn give_free(&self, lay: &Layout, off: u64, len: u64) -> Result<bool> {
        if lay.header.free_slots == 0 || len == 0 {
            return Ok(false);
        }
        self.with_free_lock(lay, || self.give_free_held(lay, off, len))
    }

    fn give_free_held(&self, lay: &Layout, off: u64, len: u64) -> Result<bool> {
        let slots = self.read_free(lay)?;
        let (mut lo, mut hi) = (off, off + len);
        let mut clear = Vec::new();
        for (i, &(o, l)) in slots.iter().enumerate() {
            if l == 0 {
                continue;
            }
            if o + l == lo {
                lo = o;
                clear.push(i);
            } else if o == hi {
                hi = o + l;
                clear.push(i);
            }
        }
        let target = clear
            .first()
            .copied()
            .or_else(|| slots.iter().position(|&(_, l)| l == 0));
        let Some(t) = target else {
            return Ok(false);
        };
        self.write_slots(lay, &clear, Some((t, (lo, hi - lo))))?;
        Ok(true)
    }

    /// Empties the slots `clear` and writes `set` (slot, (offset,
    /// length)), with no FLUSH: the table is recomputed from the partition
    /// table when the region is put right after its memory node restarted
    /// ([`rebuild_free`](Self::rebuild_free)), so what a crash leaves of it
    /// does not matter.
    fn write_slots(
        &self,
        lay: &Layout,
        clear: &[usize],
        set: Option<(usize, (u64, u64))>,
    ) -> Result<()> {
        let mut writes: Vec<(u64, Vec<u8>)> = clear
            .iter()
            .filter(|&&i| set.is_none_or(|(t, _)| t != i))
            .map(|&i| (Self::slot_at(lay, i), vec![0u8; FREE_SLOT_BYTES as usize]))
            .collect();
        if let Some((t, (off, len))) = set {
            let mut b = off.to_le_bytes().to_vec();
            b.extend_from_slice(&len.to_le_bytes());
            writes.push((Self::slot_at(lay, t), b));
        }
        crate::fetch::post_unflushed(&*self.mem, lay.region, writes)
    }

    /// Recomputes the free table from the partition table (with no writer
    /// at work: a recovery): every byte between the first partition's and
    /// `alloc_end` that no partition's blob, overflow or gap covers is
    /// free (the areas of rebuilds a crash cut short among them), entered
    /// largest first; what the table has no room for stays dead until the
    /// next relayout. Returns the free bytes entered.
    pub(crate) fn rebuild_free(&self, lay: &Layout) -> Result<u64> {
        if lay.header.free_slots == 0 {
            return Ok(0);
        }
        let rec = lay.record();
        let start = lay.header.free_off + lay.header.free_slots * FREE_SLOT_BYTES;
        let end = self.read_word(lay, crate::layout::ALLOC_END_AT)?;
        let mut used: Vec<(u64, u64)> = Vec::with_capacity(2 * lay.table.len());
        for e in &lay.table {
            if let Some(r) = e.range(rec) {
                used.push(r);
            }
            used.push((e.gap_lo, e.gap_hi));
        }
        used.sort_unstable();
        let mut free = Vec::new();
        let mut at = start;
        for (lo, hi) in used {
            if lo > at {
                free.push((at, lo - at));
            }
            at = at.max(hi);
        }
        if end > at {
            free.push((at, end - at));
        }
        free.sort_unstable_by_key(|f| std::cmp::Reverse(f.1));
        free.truncate(lay.header.free_slots as usize);
        let total = free.iter().map(|f| f.1).sum();
        let mut b = vec![0u8; (lay.header.free_slots * FREE_SLOT_BYTES) as usize];
        for (i, (off, len)) in free.iter().enumerate() {
            b[16 * i..16 * i + 8].copy_from_slice(&off.to_le_bytes());
            b[16 * i + 8..16 * i + 16].copy_from_slice(&len.to_le_bytes());
        }
        crate::fetch::post_unflushed(&*self.mem, lay.region, vec![(lay.header.free_off, b)])?;
        Ok(total)
    }

    /// Bytes the free table holds (a figure for the stats).
    pub(crate) fn free_bytes(&self, lay: &Layout) -> Result<u64> {
        if lay.header.free_slots == 0 {
            return Ok(0);
        }
        Ok(self.read_free(lay)?.iter().map(|&(_, l)| l).sum())
    }
}
