//! The in-memory graph store of the volatile graph engines (`hnsw`, and
//! `fresh-vamana` with a single layer).
//!
//! Node slots are numbered `0..capacity`. Per slot:
//! - the vector (`dim` f32, normalised under cosine) in one contiguous array;
//! - the layer-0 list: `[count, n_0, …, n_{m0-1}]` as `AtomicU32` (HNSW's
//!   `m0 = 2m`; Vamana's out-degree bound `R`);
//! - the upper lists (`level` of them, each `[count, n_0, …, n_{m-1}]`) in
//!   a boxed slice per slot;
//! - label (external id), the sequence number that wrote it, level, state,
//!   and a lock taken by writers of that slot's lists;
//! - with quantization on, the slot's RaBitQ code and its layer-0
//!   neighbours' codes ([`crate::codes`]), which every layer-0 write below
//!   keeps in step with the list.
//!
//! ## Concurrency protocol
//! Neighbour lists are atomics: readers never lock, writers hold the slot's
//! lock, write the entries and then publish the count with `Release`. A reader
//! may see a list mid-update, but every id in it names an allocated slot, so a
//! search is never misled into memory it may not read.
//!
//! Vectors and upper-list boxes are plain memory behind `UnsafeCell`. They are
//! written only by [`Store::init_slot`], whose contract is that the slot is
//! unreachable: it was never linked, or it was freed by a consolidation that
//! first removed every edge to it and then waited (under the engine's
//! exclusive store lock) for all searches that could still hold its id. The
//! writer then links the slot with `Release` stores, and readers find it only
//! through `Acquire` loads, so the vector is visible to them before its id is.

use crate::codes::Codes;
use crate::graph::Graph;
use parking_lot::Mutex;
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};
use vectide_core::hugemem::{HugeArray, Zeroable};

/// Slot never used or reclaimed.
pub const FREE: u8 = 0;
/// Being inserted: traversable, never returned.
pub const INSERTING: u8 = 1;
/// Live: returned by searches.
pub const LIVE: u8 = 2;
/// Deleted, waiting for consolidation: traversable, never returned.
pub const DELETED: u8 = 3;
/// A navigation node of the index's own (Vamana's frozen start point):
/// traversable, never returned, never deleted.
pub const FROZEN: u8 = 4;

/// A slice of cells that the engine writes under the protocol above, held
/// in `S`: a boxed slice, or a [`HugeArray`] for the large arrays searches
/// read at random.
pub struct Cells<T, S = Box<[UnsafeCell<T>]>> {
    data: S,
    _elem: std::marker::PhantomData<T>,
}

// SAFETY: `Cells` hands out shared references only through `get`, and
// mutable ones only through the unsafe `get_mut`, whose callers guarantee that
// no other thread reads or writes the same elements at the same time (the
// slot protocol in the module docs). With that, sharing across threads is as
// safe as sharing `&[T]` and `&mut [T]` of disjoint elements.
unsafe impl<T: Send + Sync, S: Send> Sync for Cells<T, S> {}

impl<T> Cells<T> {
    pub fn new(v: Vec<T>) -> Self {
        let b: Box<[T]> = v.into_boxed_slice();
        // SAFETY: `UnsafeCell<T>` is `repr(transparent)` over `T`, so a boxed
        // slice of `T` has exactly the layout of a boxed slice of
        // `UnsafeCell<T>`; the allocation is moved, not copied or freed.
        let data = unsafe { Box::from_raw(Box::into_raw(b) as *mut [UnsafeCell<T>]) };
        Cells {
            data,
            _elem: std::marker::PhantomData,
        }
    }
}

impl<T: Zeroable> Cells<T, HugeArray<UnsafeCell<T>>> {
    /// `len` zeroed cells in memory advised for huge pages.
    pub fn zeroed(len: usize) -> Self {
        Cells {
            data: HugeArray::zeroed(len),
            _elem: std::marker::PhantomData,
        }
    }

    /// `len` cells starting with a copy of these (growth under `&mut`).
    pub fn grown(&mut self, len: usize) -> Self {
        Cells {
            data: self.data.grown(len),
            _elem: std::marker::PhantomData,
        }
    }
}

impl<T, S: std::ops::DerefMut<Target = [UnsafeCell<T>]>> Cells<T, S> {
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.data.len()
    }

    /// Shared view of `start..start + len`.
    ///
    /// Panics when out of bounds (engine bug, not user input).
    #[inline]
    pub fn get(&self, start: usize, len: usize) -> &[T] {
        let cells = &self.data[start..start + len];
        // SAFETY: same layout as above; the engine's protocol guarantees no
        // concurrent `get_mut` on these elements while this borrow lives.
        unsafe { std::slice::from_raw_parts(cells.as_ptr() as *const T, len) }
    }

    /// Mutable view of `start..start + len`.
    ///
    /// # Safety
    /// No other thread may access these elements while the borrow lives.
    #[inline]
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn get_mut(&self, start: usize, len: usize) -> &mut [T] {
        let cells = &self.data[start..start + len];
        // SAFETY: exclusivity is the caller's obligation; `UnsafeCell` makes
        // mutation through a shared reference permitted.
        unsafe { std::slice::from_raw_parts_mut(UnsafeCell::raw_get(cells.as_ptr()), len) }
    }

    /// Exclusive access through `&mut self` (used while growing).
    pub fn as_mut_slice(&mut self) -> &mut [T] {
        let len = self.data.len();
        // SAFETY: `&mut self` proves exclusivity; layout as in `new`.
        unsafe { std::slice::from_raw_parts_mut(self.data.as_mut_ptr() as *mut T, len) }
    }
}

/// One 64-byte cache line of vector data. Vectors are stored in whole lines
/// (rows padded with zeros to a multiple of 16 floats), so that every vector
/// starts on a cache-line boundary: a 50-d vector touches 4 lines, never 5,
/// and the SIMD kernels' loads do not straddle lines.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub struct Line([f32; LINE_FLOATS]);

// SAFETY: `Line` is `repr(C)` over `[f32; 16]`: all-zero bytes are sixteen
// 0.0 floats, and it has no drop glue.
unsafe impl Zeroable for Line {}

const LINE_FLOATS: usize = 16;

/// Graph storage for `capacity` slots.
pub struct Store {
    pub dim: usize,
    /// Cache lines per vector.
    lines: usize,
    pub m: usize,
    pub m0: usize,
    pub capacity: usize,
    /// Vectors and layer-0 lists, the arrays every search reads at random,
    /// in huge pages where the kernel grants them (see
    /// `vectide_core::hugemem`).
    vectors: Cells<Line, HugeArray<UnsafeCell<Line>>>,
    links0: HugeArray<AtomicU32>,
    upper: Cells<Box<[AtomicU32]>>,
    levels: Box<[AtomicU8]>,
    labels: Box<[AtomicU64]>,
    seqs: Box<[AtomicU64]>,
    states: Box<[AtomicU8]>,
    /// One bit per slot, set iff its state is [`LIVE`]: the check every
    /// search makes of every node it meets, kept in `capacity / 8` bytes so
    /// that it stays in cache (the state bytes are `capacity` bytes, and a
    /// miss on them per candidate cost a fifth of a query's time).
    live: Box<[AtomicU64]>,
    locks: Box<[Mutex<()>]>,
    /// The RaBitQ codes, when the engine walks on them.
    codes: Option<Codes>,
}

fn atomics_u32(n: usize) -> Box<[AtomicU32]> {
    (0..n).map(|_| AtomicU32::new(0)).collect()
}

fn atomics_u64(n: usize) -> Box<[AtomicU64]> {
    (0..n).map(|_| AtomicU64::new(0)).collect()
}

fn atomics_u8(n: usize) -> Box<[AtomicU8]> {
    (0..n).map(|_| AtomicU8::new(0)).collect()
}

impl Store {
    /// HNSW's store: upper lists of `m`, layer-0 lists of `2m`.
    pub fn new(dim: usize, m: usize, capacity: usize) -> Self {
        Self::with_degrees(dim, m, 2 * m, capacity)
    }

    /// A store whose layer-0 lists hold `m0` and upper lists `m` (a
    /// single-layer graph never gives a node a level above 0).
    pub fn with_degrees(dim: usize, m: usize, m0: usize, capacity: usize) -> Self {
        let lines = dim.div_ceil(LINE_FLOATS);
        Store {
            dim,
            lines,
            m,
            m0,
            capacity,
            vectors: Cells::zeroed(capacity * lines),
            links0: HugeArray::zeroed(capacity * (1 + m0)),
            upper: Cells::new((0..capacity).map(|_| Box::default()).collect()),
            levels: atomics_u8(capacity),
            labels: atomics_u64(capacity),
            seqs: atomics_u64(capacity),
            states: atomics_u8(capacity),
            live: atomics_u64(capacity.div_ceil(64)),
            locks: (0..capacity).map(|_| Mutex::new(())).collect(),
            codes: None,
        }
    }

    /// Turns the codes on with quantizer `rq`: every slot in use is
    /// encoded and every layer-0 list gets its neighbours' codes. Needs
    /// exclusive access.
    pub fn enable_codes(&mut self, rq: vectide_quant::Rabitq) -> vectide_core::Result<()> {
        if rq.dim() != self.dim {
            return Err(vectide_core::Error::invalid(format!(
                "a quantizer of dimension {} for a graph of dimension {}",
                rq.dim(),
                self.dim
            )));
        }
        let codes = Codes::new(rq, self.m0, self.capacity);
        for s in 0..self.capacity as u32 {
            if self.state(s) != FREE {
                codes.set_own(s, self.vector(s));
            }
        }
        let mut ids = Vec::new();
        for s in 0..self.capacity as u32 {
            if self.state(s) != FREE {
                self.neighbors_into(s, 0, &mut ids);
                codes.write_list(s, &ids);
            }
        }
        self.codes = Some(codes);
        Ok(())
    }

    /// The codes, when on.
    #[inline]
    pub fn codes(&self) -> Option<&Codes> {
        self.codes.as_ref()
    }

    /// Checks that every slot in use carries its layer-0 neighbours'
    /// current codes (quiescent store; for tests and checks). `Err` names
    /// the first slot that does not.
    pub fn check_codes(&self) -> std::result::Result<(), String> {
        let Some(c) = &self.codes else {
            return Ok(());
        };
        let mut ids = Vec::new();
        for s in 0..self.capacity as u32 {
            if self.state(s) == FREE {
                continue;
            }
            self.neighbors_into(s, 0, &mut ids);
            if !c.list_matches(s, &ids) {
                return Err(format!(
                    "slot {s}: its list's codes are not its neighbours' ({ids:?})"
                ));
            }
        }
        Ok(())
    }

    /// Bytes that [`Store::new`] allocates for `capacity` slots (before any
    /// upper layer).
    pub fn bytes_for(dim: usize, m0: usize, capacity: usize) -> usize {
        let per_slot = dim.div_ceil(LINE_FLOATS) * 64
            + (1 + m0) * 4
            + std::mem::size_of::<Box<[AtomicU32]>>()
            + 1
            + 8
            + 8
            + 1
            + std::mem::size_of::<Mutex<()>>()
            + 1; // the live bit, rounded up to a byte
        capacity.saturating_mul(per_slot)
    }

    /// Grows to `new_capacity` slots, keeping every slot's content. Needs
    /// exclusive access (the engine holds its store lock for writing).
    pub fn grow(&mut self, new_capacity: usize) {
        if new_capacity <= self.capacity {
            return;
        }
        self.vectors = self.vectors.grown(new_capacity * self.lines);

        let mut upper: Vec<Box<[AtomicU32]>> = Vec::with_capacity(new_capacity);
        upper.extend(self.upper.as_mut_slice().iter_mut().map(std::mem::take));
        upper.resize_with(new_capacity, Box::default);
        self.upper = Cells::new(upper);

        fn extend64(old: &mut Box<[AtomicU64]>, n: usize) {
            let mut v: Vec<AtomicU64> = std::mem::take(old).into_vec();
            v.resize_with(n, || AtomicU64::new(0));
            *old = v.into_boxed_slice();
        }
        fn extend8(old: &mut Box<[AtomicU8]>, n: usize) {
            let mut v: Vec<AtomicU8> = std::mem::take(old).into_vec();
            v.resize_with(n, || AtomicU8::new(0));
            *old = v.into_boxed_slice();
        }
        self.links0 = self.links0.grown(new_capacity * (1 + self.m0));
        if let Some(c) = self.codes.as_mut() {
            self.codes = Some(c.grown(new_capacity));
        }
        extend8(&mut self.levels, new_capacity);
        extend64(&mut self.labels, new_capacity);
        extend64(&mut self.seqs, new_capacity);
        extend8(&mut self.states, new_capacity);
        extend64(&mut self.live, new_capacity.div_ceil(64));
        let mut locks = std::mem::take(&mut self.locks).into_vec();
        locks.resize_with(new_capacity, || Mutex::new(()));
        self.locks = locks.into_boxed_slice();
        self.capacity = new_capacity;
    }

    /// Writes a slot's vector, metadata and empty lists.
    ///
    /// # Safety
    /// The slot must be unreachable: no list of any slot names it, it is not
    /// the entry point, and no search or insert that could still hold its id
    /// is in flight (see the module docs). The caller owns it exclusively
    /// until it links it.
    pub unsafe fn init_slot(&self, slot: u32, label: u64, seq: u64, vector: &[f32], level: usize) {
        let s = slot as usize;
        // SAFETY: exclusivity of this slot's cells is the caller's contract.
        unsafe {
            let lines = self.vectors.get_mut(s * self.lines, self.lines);
            // SAFETY: `Line` is `repr(C)` over `[f32; 16]` with no padding, so
            // `lines` is `16 * self.lines >= dim` initialised floats.
            let floats = std::slice::from_raw_parts_mut(lines.as_mut_ptr() as *mut f32, self.dim);
            floats.copy_from_slice(vector);
            self.upper.get_mut(s, 1)[0] = atomics_u32(level * (1 + self.m));
        }
        self.links0[s * (1 + self.m0)].store(0, Ordering::Relaxed);
        if let Some(c) = &self.codes {
            c.set_own(slot, vector);
            // A reused slot's list codes are its previous occupant's.
            c.write_list(slot, &[]);
        }
        self.levels[s].store(level as u8, Ordering::Relaxed);
        self.labels[s].store(label, Ordering::Relaxed);
        self.seqs[s].store(seq, Ordering::Relaxed);
        self.set_state(slot, INSERTING);
    }

    #[inline]
    pub fn vector(&self, slot: u32) -> &[f32] {
        let lines = self.vectors.get(slot as usize * self.lines, self.lines);
        // SAFETY: `Line` is `repr(C)` over `[f32; 16]` with no padding, so the
        // borrowed lines hold `16 * self.lines >= dim` floats, shared as `&`.
        unsafe { std::slice::from_raw_parts(lines.as_ptr() as *const f32, self.dim) }
    }

    /// Address of a slot's vector, for prefetching (never dereferenced here).
    #[inline]
    pub fn vector_ptr(&self, slot: u32) -> *const f32 {
        self.vectors
            .get(0, 0)
            .as_ptr()
            .wrapping_add(slot as usize * self.lines) as *const f32
    }

    /// Address of a slot's layer-0 list, for prefetching (never dereferenced here).
    #[inline]
    pub fn links0_ptr(&self, slot: u32) -> *const AtomicU32 {
        self.links0
            .as_ptr()
            .wrapping_add(slot as usize * (1 + self.m0))
    }

    /// The list `[count, entries…]` of a slot at a layer; empty when the
    /// slot has no such layer.
    #[inline]
    pub fn list(&self, slot: u32, level: usize) -> &[AtomicU32] {
        let s = slot as usize;
        if level == 0 {
            let w = 1 + self.m0;
            &self.links0[s * w..(s + 1) * w]
        } else {
            let w = 1 + self.m;
            let up = &self.upper.get(s, 1)[0];
            up.get((level - 1) * w..level * w).unwrap_or(&[])
        }
    }

    /// Capacity of a list at a layer.
    #[inline]
    pub fn cap(&self, level: usize) -> usize {
        if level == 0 {
            self.m0
        } else {
            self.m
        }
    }

    /// Replaces a slot's list at a layer (and, at layer 0, its
    /// neighbours' codes). The caller holds the slot's lock.
    pub fn set_list(&self, slot: u32, level: usize, ids: &[u32]) {
        if level == 0 {
            if let Some(c) = &self.codes {
                c.write_list(slot, &ids[..ids.len().min(self.m0)]);
            }
        }
        crate::graph::store_list(Store::list(self, slot, level), ids);
    }

    /// Appends to a list with room; returns false when full. Caller holds the lock.
    pub fn push_neighbor(&self, slot: u32, level: usize, id: u32) -> bool {
        let list = self.list(slot, level);
        if list.is_empty() {
            return false;
        }
        let n = list[0].load(Ordering::Acquire) as usize;
        if n + 1 >= list.len() {
            return false;
        }
        if level == 0 {
            if let Some(c) = &self.codes {
                c.write_entry(slot, n, id);
            }
        }
        list[n + 1].store(id, Ordering::Release);
        list[0].store(n as u32 + 1, Ordering::Release);
        true
    }

    #[inline]
    pub fn lock(&self, slot: u32) -> parking_lot::MutexGuard<'_, ()> {
        self.locks[slot as usize].lock()
    }

    #[inline]
    pub fn state(&self, slot: u32) -> u8 {
        self.states[slot as usize].load(Ordering::Acquire)
    }

    /// Whether a slot is [`LIVE`] (returned by searches), from the bitmap.
    #[inline]
    pub fn is_live(&self, slot: u32) -> bool {
        let s = slot as usize;
        self.live[s / 64].load(Ordering::Acquire) & (1 << (s % 64)) != 0
    }

    /// Sets a slot's state and its live bit, state first. A reader that sees
    /// the bit set sees everything written before it was set (`Release` /
    /// `Acquire`); while a slot leaves `LIVE` the bit may trail the state by
    /// an instant (a search can still return a point whose delete is in
    /// progress, as with the state alone). Callers serialise the changes of
    /// one slot (its id's lock, exclusive ownership, or the store lock), so
    /// the state and the bit never disagree once a change is done.
    pub fn set_state(&self, slot: u32, state: u8) {
        let s = slot as usize;
        self.states[s].store(state, Ordering::Release);
        let bit = 1u64 << (s % 64);
        if state == LIVE {
            self.live[s / 64].fetch_or(bit, Ordering::Release);
        } else {
            self.live[s / 64].fetch_and(!bit, Ordering::Release);
        }
    }

    #[inline]
    pub fn label(&self, slot: u32) -> u64 {
        self.labels[slot as usize].load(Ordering::Relaxed)
    }

    pub fn seq(&self, slot: u32) -> u64 {
        self.seqs[slot as usize].load(Ordering::Relaxed)
    }

    #[inline]
    pub fn level(&self, slot: u32) -> usize {
        self.levels[slot as usize].load(Ordering::Relaxed) as usize
    }

    /// Approximate bytes held.
    pub fn memory_bytes(&self, used: usize) -> usize {
        let per_slot = self.lines * 64 + (1 + self.m0) * 4 + 8 + 8 + 1 + 1 + 1 + 16;
        let upper: usize = (0..used.min(self.capacity))
            .map(|s| self.level(s as u32) * (1 + self.m) * 4)
            .sum();
        let codes = self.codes.as_ref().map_or(0, |c| c.bytes_per_slot());
        self.capacity * (per_slot + codes) + self.live.len() * 8 + upper
    }

    /// Total elements in the vectors array (for tests).
    #[cfg(test)]
    pub fn vector_cells(&self) -> usize {
        self.vectors.len() * LINE_FLOATS
    }
}

impl Graph for Store {
    #[inline]
    fn slots(&self) -> usize {
        self.capacity
    }
    #[inline]
    fn vector(&self, slot: u32) -> &[f32] {
        Store::vector(self, slot)
    }
    #[inline]
    fn vector_ptr(&self, slot: u32) -> *const f32 {
        Store::vector_ptr(self, slot)
    }
    #[inline]
    fn prefetch_vector(&self, slot: u32) {
        let p = self.vector_ptr(slot);
        for line in 0..self.lines {
            vectide_core::distance::prefetch(p.wrapping_add(line * LINE_FLOATS));
        }
    }
    #[inline]
    fn list0_ptr(&self, slot: u32) -> *const u8 {
        self.links0_ptr(slot) as *const u8
    }
    #[inline]
    fn list(&self, slot: u32, level: usize) -> &[AtomicU32] {
        Store::list(self, slot, level)
    }
    #[inline]
    fn cap(&self, level: usize) -> usize {
        Store::cap(self, level)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn init_list_and_grow_keep_content() {
        let mut s = Store::new(3, 2, 2);
        // SAFETY: single-threaded test; nothing references the slots yet.
        unsafe {
            s.init_slot(0, 10, 1, &[1.0, 2.0, 3.0], 1);
            s.init_slot(1, 11, 2, &[4.0, 5.0, 6.0], 0);
        }
        s.set_list(0, 0, &[1]);
        s.set_list(0, 1, &[1]);
        assert!(s.push_neighbor(1, 0, 0));
        s.grow(5);
        assert_eq!(s.capacity, 5);
        assert_eq!(s.vector_cells(), 5 * 16);
        assert_eq!(
            s.vector(1).as_ptr() as usize % 64,
            0,
            "rows start on a cache line"
        );
        assert_eq!(s.vector(1), &[4.0, 5.0, 6.0]);
        let mut out = Vec::new();
        s.neighbors_into(0, 1, &mut out);
        assert_eq!(out, vec![1]);
        s.neighbors_into(1, 0, &mut out);
        assert_eq!(out, vec![0]);
        s.neighbors_into(1, 3, &mut out);
        assert!(out.is_empty(), "missing layer reads empty");
        assert_eq!((s.label(0), s.seq(1), s.level(0)), (10, 2, 1));
        assert_eq!(s.state(1), INSERTING);
    }

    #[test]
    fn full_list_refuses_push() {
        let s = Store::new(1, 2, 1);
        // SAFETY: single-threaded test.
        unsafe { s.init_slot(0, 0, 0, &[0.0], 0) };
        for i in 0..4 {
            assert!(s.push_neighbor(0, 0, i));
        }
        assert!(!s.push_neighbor(0, 0, 9));
    }

    #[test]
    fn live_bit_follows_every_state_change_and_survives_growth() {
        // 130 slots: three bitmap words, the last one partial.
        let mut s = Store::new(1, 2, 130);
        for slot in [0u32, 63, 64, 129] {
            // SAFETY: single-threaded test; nothing references the slots.
            unsafe { s.init_slot(slot, slot as u64, 0, &[0.0], 0) };
            assert!(!s.is_live(slot), "an inserting slot is not live");
            s.set_state(slot, LIVE);
            assert!(s.is_live(slot));
        }
        s.set_state(63, DELETED);
        assert!(!s.is_live(63));
        assert!(s.is_live(64), "neighbouring bits are untouched");
        s.grow(300);
        for slot in 0..300u32 {
            let want = matches!(slot, 0 | 64 | 129);
            assert_eq!(s.is_live(slot), want, "slot {slot} after growth");
            assert_eq!(s.is_live(slot), s.state(slot) == LIVE);
        }
        s.set_state(64, FREE);
        // SAFETY: slot 0 is unreferenced; re-initialising clears its bit.
        unsafe { s.init_slot(0, 7, 1, &[1.0], 0) };
        assert!(!s.is_live(0) && !s.is_live(64) && s.is_live(129));
    }
}
