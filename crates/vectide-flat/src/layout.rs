//! The slot store: every vector in one contiguous row-major matrix.
//!
//! A slot is a row of `stride` floats, `stride` being `dim + 1` rounded up
//! to whole 32-byte lanes, and the matrix starts on a 32-byte boundary, so
//! no 8-float load of a row crosses a cache line it need not. Column
//! `dim` holds the row's *augmentation*: `‖x‖²` under L2, `0` under the
//! inner-product metrics. A batched search multiplies these `dim + 1`
//! columns with `[-2q, 1]` (L2) or `[-q, 1]` (ip, cosine) and gets the
//! distance minus a per-query constant straight out of the matrix product
//! (see `search.rs`). The columns after it are zero.
//!
//! Beside the matrix: the external id of each slot ([`FREE`] for a free
//! one), the sequence number of the operation that wrote it, the id → slot
//! map and the list of free slots. A delete frees its slot at once and the
//! next insert takes it, so the slots in use are always the live vectors.

use std::collections::HashMap;
use vectide_core::{distance, Error, Metric, Result, Seq, RESERVED_ID};

/// The id of a free slot (the reserved id, which no insert may use).
pub(crate) const FREE: u64 = RESERVED_ID;

/// Floats in one aligned lane.
pub(crate) const LANE: usize = 8;

/// Most slots an index holds (slots are `u32`, as in [`vectide_core::TopK`]).
pub(crate) const MAX_SLOTS: usize = u32::MAX as usize;

/// Eight floats on a 32-byte boundary: the unit of the matrix's allocation.
#[derive(Debug, Clone, Copy, Default)]
#[repr(C, align(32))]
pub(crate) struct Lane([f32; LANE]);

/// Floats per row for a dimension: `dim + 1`, rounded up to whole lanes.
pub(crate) fn stride_of(dim: usize) -> usize {
    (dim + 1).div_ceil(LANE) * LANE
}

/// The vectors, ids and sequence numbers of a flat index.
#[derive(Debug)]
pub(crate) struct Store {
    dim: usize,
    stride: usize,
    metric: Metric,
    /// `slots × stride` floats, in lanes.
    rows: Vec<Lane>,
    /// slot → external id, [`FREE`] for a free slot.
    ids: Vec<u64>,
    /// slot → sequence number of the operation that wrote it.
    seqs: Vec<Seq>,
    /// external id → slot, for the live slots.
    map: HashMap<u64, u32>,
    /// Free slots; the last one is reused first.
    free: Vec<u32>,
    /// The largest squared norm of any row written (never lowered by a
    /// delete): batched searches use it to rule out overflow.
    max_norm_sq: f32,
}

impl Store {
    /// Structural violations: the id map, the slot ids and the free list
    /// must describe the same partition of the slots, and every live row
    /// must carry its augmentation.
    pub fn check(&self) -> Vec<String> {
        let mut v = Vec::new();
        let slots = self.ids.len();
        let mut free = vec![false; slots];
        for &f in &self.free {
            match free.get_mut(f as usize) {
                Some(x) if !*x => *x = true,
                Some(_) => v.push(format!("slot {f} is free twice")),
                None => v.push(format!("free slot {f} beyond the {slots} slots")),
            }
        }
        for (slot, &id) in self.ids.iter().enumerate() {
            let is_free = free[slot];
            if (id == FREE) != is_free {
                v.push(format!("slot {slot}: id {id} but free = {is_free}"));
            } else if id != FREE && self.map.get(&id) != Some(&(slot as u32)) {
                v.push(format!(
                    "slot {slot} holds id {id}, which the map does not send there"
                ));
            }
        }
        let live = slots - self.free.len();
        if self.map.len() != live {
            v.push(format!("{} ids mapped, {live} live slots", self.map.len()));
        }
        v
    }

    pub fn new(dim: usize, metric: Metric) -> Self {
        Store {
            dim,
            stride: stride_of(dim),
            metric,
            rows: Vec::new(),
            ids: Vec::new(),
            seqs: Vec::new(),
            map: HashMap::new(),
            free: Vec::new(),
            max_norm_sq: 0.0,
        }
    }

    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Floats between the starts of two rows.
    pub fn stride(&self) -> usize {
        self.stride
    }

    /// Slots ever allocated (live or free).
    pub fn slots(&self) -> usize {
        self.ids.len()
    }

    /// Live vectors.
    pub fn live(&self) -> usize {
        self.map.len()
    }

    /// Free slots awaiting reuse.
    pub fn free_slots(&self) -> usize {
        self.free.len()
    }

    /// Slots the allocation holds without growing.
    pub fn capacity(&self) -> usize {
        self.rows.capacity() / (self.stride / LANE)
    }

    /// Approximate bytes held (matrix, slot arrays, map, free list).
    pub fn memory_bytes(&self) -> usize {
        self.rows.capacity() * std::mem::size_of::<Lane>()
            + (self.ids.capacity() + self.seqs.capacity()) * 8
            + self.map.capacity() * (std::mem::size_of::<(u64, u32)>() + 1)
            + self.free.capacity() * 4
    }

    /// The whole matrix, `slots × stride` floats.
    #[inline]
    pub fn matrix(&self) -> &[f32] {
        let len = self.rows.len() * LANE;
        // SAFETY: `Lane` is `repr(C)` over `[f32; LANE]` with no padding
        // (32 bytes of floats, 32-byte alignment), so `rows` is `len`
        // initialised, properly aligned f32 values, borrowed as long as `self`.
        unsafe { std::slice::from_raw_parts(self.rows.as_ptr().cast::<f32>(), len) }
    }

    fn matrix_mut(&mut self) -> &mut [f32] {
        let len = self.rows.len() * LANE;
        // SAFETY: as in `matrix`, and `&mut self` makes the borrow unique.
        unsafe { std::slice::from_raw_parts_mut(self.rows.as_mut_ptr().cast::<f32>(), len) }
    }

    /// The stored vector of a slot (`dim` floats, normalised under cosine).
    #[inline]
    pub fn vector(&self, slot: u32) -> &[f32] {
        let start = slot as usize * self.stride;
        &self.matrix()[start..start + self.dim]
    }

    /// The external id of a slot ([`FREE`] when free).
    #[inline]
    pub fn id(&self, slot: u32) -> u64 {
        self.ids[slot as usize]
    }

    /// slot → id, for every slot.
    #[inline]
    pub fn ids(&self) -> &[u64] {
        &self.ids
    }

    /// The sequence number that wrote a slot.
    pub fn seq(&self, slot: u32) -> Seq {
        self.seqs[slot as usize]
    }

    /// The slot of a live id.
    #[inline]
    pub fn slot_of(&self, id: u64) -> Option<u32> {
        self.map.get(&id).copied()
    }

    /// The largest squared norm of a row ever written (`+inf` if one
    /// overflowed).
    pub fn max_norm_sq(&self) -> f32 {
        self.max_norm_sq
    }

    /// Live slots in slot order.
    pub fn live_slots(&self) -> impl Iterator<Item = u32> + '_ {
        (0..self.ids.len() as u32).filter(|&s| self.ids[s as usize] != FREE)
    }

    /// Makes room for `new_ids` more live vectors without touching anything
    /// else, so that the writes after it cannot fail half-way.
    pub fn reserve(&mut self, new_ids: usize) -> Result<()> {
        let grow = new_ids.saturating_sub(self.free.len());
        let slots = self.slots().saturating_add(grow);
        if slots > MAX_SLOTS {
            return Err(Error::invalid(format!(
                "a flat index holds at most {MAX_SLOTS} vectors; this batch needs {slots}"
            )));
        }
        let oom =
            |what: &str| Error::invalid(format!("cannot allocate {what} for {slots} vectors"));
        self.rows
            .try_reserve(grow * (self.stride / LANE))
            .map_err(|_| oom("the vector matrix"))?;
        self.ids.try_reserve(grow).map_err(|_| oom("slot ids"))?;
        self.seqs.try_reserve(grow).map_err(|_| oom("slot seqs"))?;
        self.map
            .try_reserve(new_ids)
            .map_err(|_| oom("the id map"))?;
        Ok(())
    }

    /// Inserts or replaces `id` with a checked vector, stored as given (the
    /// caller normalises under cosine), unless the id's recorded sequence
    /// number is not older than `seq`. Returns whether anything changed.
    /// Call [`Store::reserve`] first: this does not fail.
    pub fn put(&mut self, seq: Seq, id: u64, v: &[f32]) -> bool {
        debug_assert!(id != FREE && v.len() == self.dim);
        let slot = match self.map.get(&id) {
            Some(&s) if self.seqs[s as usize] >= seq => return false,
            Some(&s) => s,
            None => {
                let s = self.take_slot();
                self.map.insert(id, s);
                s
            }
        };
        self.ids[slot as usize] = id;
        self.seqs[slot as usize] = seq;
        self.write_row(slot, v);
        true
    }

    /// Removes a live id unless its recorded sequence number is newer than
    /// `seq`; its slot is free at once. Returns whether it was removed.
    pub fn remove(&mut self, seq: Seq, id: u64) -> bool {
        match self.map.get(&id) {
            Some(&s) if self.seqs[s as usize] <= seq => {
                self.map.remove(&id);
                self.ids[s as usize] = FREE;
                self.seqs[s as usize] = seq;
                let start = s as usize * self.stride;
                let stride = self.stride;
                self.matrix_mut()[start..start + stride].fill(0.0);
                self.free.push(s);
                true
            }
            _ => false,
        }
    }

    /// A free slot, or a new one at the end (room reserved beforehand).
    fn take_slot(&mut self) -> u32 {
        if let Some(s) = self.free.pop() {
            return s;
        }
        let s = self.ids.len() as u32;
        self.ids.push(FREE);
        self.seqs.push(0);
        self.rows
            .extend(std::iter::repeat_n(Lane::default(), self.stride / LANE));
        s
    }

    /// Writes a row: the vector, its augmentation, zero padding.
    fn write_row(&mut self, slot: u32, v: &[f32]) {
        let (dim, stride, metric) = (self.dim, self.stride, self.metric);
        let start = slot as usize * stride;
        let row = &mut self.matrix_mut()[start..start + stride];
        row[..dim].copy_from_slice(v);
        let norm_sq = distance::norm_sq(v);
        row[dim] = match metric {
            Metric::L2 => norm_sq,
            Metric::Ip | Metric::Cosine => 0.0,
        };
        row[dim + 1..].fill(0.0);
        // `max` would drop a NaN; a squared norm is never NaN, only +inf.
        self.max_norm_sq = self.max_norm_sq.max(norm_sq);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_aligned_padded_and_augmented() {
        assert_eq!(stride_of(1), 8);
        assert_eq!(stride_of(7), 8);
        assert_eq!(stride_of(8), 16);
        assert_eq!(stride_of(50), 56);
        let mut s = Store::new(3, Metric::L2);
        s.reserve(2).unwrap();
        assert!(s.put(1, 10, &[1.0, 2.0, 2.0]));
        assert!(s.put(1, 11, &[0.0, 0.0, 1.0]));
        assert_eq!(s.matrix().as_ptr() as usize % 32, 0);
        assert_eq!(s.matrix().len(), 2 * 8);
        assert_eq!(&s.matrix()[..8], &[1.0, 2.0, 2.0, 9.0, 0.0, 0.0, 0.0, 0.0]);
        assert_eq!(s.vector(1), &[0.0, 0.0, 1.0]);
        assert_eq!(s.max_norm_sq(), 9.0);
        s.reserve(1).unwrap();
        s.put(1, 12, &[3e19, 0.0, 0.0]);
        assert_eq!(s.max_norm_sq(), f32::INFINITY);

        let mut c = Store::new(2, Metric::Cosine);
        c.reserve(1).unwrap();
        c.put(1, 1, &[0.6, 0.8]);
        assert_eq!(
            &c.matrix()[..3],
            &[0.6, 0.8, 0.0],
            "no norm column under cosine"
        );
    }

    #[test]
    fn upserts_follow_sequence_numbers_and_slots_are_reused() {
        let mut s = Store::new(2, Metric::Ip);
        s.reserve(3).unwrap();
        for id in 0..3 {
            assert!(s.put(5, id, &[id as f32, 1.0]));
        }
        // Not newer: skipped. Newer: replaced in place.
        assert!(!s.put(5, 1, &[9.0, 9.0]));
        assert!(!s.put(4, 1, &[9.0, 9.0]));
        assert!(s.put(6, 1, &[7.0, 7.0]));
        assert_eq!(s.vector(s.slot_of(1).unwrap()), &[7.0, 7.0]);
        assert_eq!(s.slots(), 3);
        // A delete older than the write is skipped; a newer one frees the slot.
        assert!(!s.remove(5, 1));
        assert!(s.remove(6, 1));
        assert!(!s.remove(7, 1));
        assert_eq!((s.live(), s.free_slots()), (2, 1));
        s.reserve(1).unwrap();
        assert!(s.put(8, 42, &[1.0, 2.0]));
        assert_eq!(s.slot_of(42), Some(1), "the freed slot is reused");
        assert_eq!(s.slots(), 3);
        assert_eq!(s.live_slots().collect::<Vec<_>>(), vec![0, 1, 2]);
        assert_eq!(s.id(1), 42);
        assert_eq!(s.seq(1), 8);
    }

    #[test]
    fn reserve_refuses_more_than_u32_slots() {
        let mut s = Store::new(1, Metric::L2);
        assert!(s.reserve(MAX_SLOTS + 1).is_err());
        assert_eq!(s.capacity(), 0);
    }
}
