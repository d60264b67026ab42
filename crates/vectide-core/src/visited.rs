//! A visited set that is never cleared per query.
//!
//! Each slot holds the generation in which it was last visited; starting a
//! query bumps the generation, which forgets every earlier mark in O(1). The
//! tag array is only zeroed when the 8-bit generation wraps (every 255
//! queries, a memset of one byte per slot). One byte per slot rather than
//! two keeps the array half as large in cache, where random probes of it
//! are a visible part of a search. Sets are pooled so that searches
//! allocate nothing.

use parking_lot::Mutex;

/// Generation-tagged visited marks for node slots `0..capacity`.
#[derive(Debug, Default)]
pub struct VisitedSet {
    tags: Vec<u8>,
    generation: u8,
}

impl VisitedSet {
    pub fn new(capacity: usize) -> Self {
        VisitedSet {
            tags: vec![0; capacity],
            generation: 1,
        }
    }

    /// Starts a new query over at least `capacity` slots.
    #[inline]
    pub fn reset(&mut self, capacity: usize) {
        if self.tags.len() < capacity {
            self.tags.resize(capacity, 0);
        }
        self.generation = self.generation.wrapping_add(1);
        if self.generation == 0 {
            self.tags.fill(0);
            self.generation = 1;
        }
    }

    /// Marks `slot`; returns `true` when it was not yet visited in this query.
    /// Slots beyond the capacity given to [`VisitedSet::reset`] report visited.
    #[inline]
    pub fn insert(&mut self, slot: u32) -> bool {
        match self.tags.get_mut(slot as usize) {
            Some(t) if *t != self.generation => {
                *t = self.generation;
                true
            }
            _ => false,
        }
    }

    #[inline]
    pub fn contains(&self, slot: u32) -> bool {
        self.tags
            .get(slot as usize)
            .is_none_or(|t| *t == self.generation)
    }

    /// Address of a slot's tag, for prefetching.
    #[inline]
    pub fn tag_ptr(&self, slot: u32) -> *const u8 {
        self.tags.as_ptr().wrapping_add(slot as usize)
    }

    pub fn capacity(&self) -> usize {
        self.tags.len()
    }
}

/// A visited set sized by what one search visits, not by the index: open
/// addressing over node numbers (Fibonacci hashing, linear probing, kept
/// at most half full), emptied per search in time proportional to its
/// capacity. The disk index's beam search uses it, as DiskANN's disk search
/// uses a hash set, so that a search thread holds kilobytes, not a byte per
/// node of an index larger than RAM. `u32::MAX` cannot be stored.
#[derive(Debug, Clone)]
pub struct SparseVisited {
    slots: Vec<u32>,
    len: usize,
}

const EMPTY: u32 = u32::MAX;

impl Default for SparseVisited {
    fn default() -> Self {
        SparseVisited {
            slots: vec![EMPTY; 1024],
            len: 0,
        }
    }
}

impl SparseVisited {
    /// Forgets every mark.
    #[inline]
    pub fn clear(&mut self) {
        if self.len > 0 {
            self.slots.fill(EMPTY);
            self.len = 0;
        }
    }

    #[inline]
    fn home(&self, id: u32) -> usize {
        let bits = self.slots.len().trailing_zeros();
        ((id as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - bits)) as usize
    }

    /// Fetches the slot `id` hashes to toward the cache, ahead of an
    /// [`SparseVisited::insert`] or [`SparseVisited::contains`] of it: a
    /// hint that changes nothing. A search's set outgrows the L1 cache
    /// (about 5,000 marks at L 50 and degree 64: 64 KiB), and the probes of
    /// a list's neighbours are independent, so prefetching them all first
    /// overlaps their misses.
    #[inline]
    pub fn prefetch(&self, id: u32) {
        crate::distance::prefetch(self.slots.as_ptr().wrapping_add(self.home(id)));
    }

    /// Marks `id`; `true` when it was not marked yet (`u32::MAX`: `false`).
    #[inline]
    pub fn insert(&mut self, id: u32) -> bool {
        if id == EMPTY {
            return false;
        }
        if 2 * (self.len + 1) > self.slots.len() {
            self.grow();
        }
        let mask = self.slots.len() - 1;
        let mut i = self.home(id);
        loop {
            match self.slots[i] {
                EMPTY => {
                    self.slots[i] = id;
                    self.len += 1;
                    return true;
                }
                x if x == id => return false,
                _ => i = (i + 1) & mask,
            }
        }
    }

    #[inline]
    pub fn contains(&self, id: u32) -> bool {
        let mask = self.slots.len() - 1;
        let mut i = self.home(id);
        loop {
            match self.slots[i] {
                EMPTY => return false,
                x if x == id => return true,
                _ => i = (i + 1) & mask,
            }
        }
    }

    /// Marks held.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        4 * self.slots.len()
    }

    fn grow(&mut self) {
        let bigger = vec![EMPTY; 2 * self.slots.len()];
        let old = std::mem::replace(&mut self.slots, bigger);
        self.len = 0;
        for id in old.into_iter().filter(|&x| x != EMPTY) {
            self.insert(id);
        }
    }
}

/// A pool of reusable scratch values (visited sets, heaps) shared by the
/// threads that search one index.
#[derive(Debug)]
pub struct VisitedPool<T> {
    free: Mutex<Vec<T>>,
}

impl<T> Default for VisitedPool<T> {
    fn default() -> Self {
        VisitedPool {
            free: Mutex::new(Vec::new()),
        }
    }
}

impl<T: Default> VisitedPool<T> {
    /// Takes a scratch value (or makes one) and returns it when the guard drops.
    pub fn get(&self) -> PoolGuard<'_, T> {
        let item = self.free.lock().pop().unwrap_or_default();
        PoolGuard {
            pool: self,
            item: Some(item),
        }
    }
}

/// A pooled value, given back on drop.
pub struct PoolGuard<'a, T> {
    pool: &'a VisitedPool<T>,
    item: Option<T>,
}

impl<T> std::ops::Deref for PoolGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        self.item.as_ref().expect("present until drop")
    }
}

impl<T> std::ops::DerefMut for PoolGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        self.item.as_mut().expect("present until drop")
    }
}

impl<T> Drop for PoolGuard<'_, T> {
    fn drop(&mut self) {
        if let Some(item) = self.item.take() {
            self.pool.free.lock().push(item);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sparse_visited_agrees_with_a_hash_set() {
        let mut v = SparseVisited::default();
        let mut oracle = std::collections::HashSet::new();
        let mut x: u64 = 7;
        for round in 0..20 {
            v.clear();
            oracle.clear();
            // Rounds of different sizes: growth past the first capacity,
            // then clears that must forget everything.
            for _ in 0..(round * 300) {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let id = (x >> 40) as u32 % 5000;
                v.prefetch(id); // a hint: must change nothing
                assert_eq!(v.insert(id), oracle.insert(id), "round {round}, id {id}");
            }
            for id in 0..5000 {
                assert_eq!(v.contains(id), oracle.contains(&id));
            }
            assert_eq!(v.len(), oracle.len());
        }
        assert!(
            v.bytes() <= 4 * 4 * 5000,
            "stays near twice the marks: {}",
            v.bytes()
        );
        v.prefetch(u32::MAX);
        assert!(!v.insert(u32::MAX) && !v.contains(u32::MAX));
    }

    #[test]
    fn generations_forget_old_marks() {
        let mut v = VisitedSet::new(4);
        v.reset(4);
        assert!(v.insert(2));
        assert!(!v.insert(2));
        assert!(v.contains(2));
        v.reset(4);
        assert!(!v.contains(2));
        assert!(v.insert(2));
        assert!(!v.insert(10), "out of range reads as visited");
    }

    #[test]
    fn wraparound_clears_tags() {
        // Around the wrap of the 8-bit generation, a stale mark must never
        // read as "visited in this query".
        for n in [254, 255, 256, 257, 510, 70_000] {
            let mut v = VisitedSet::new(2);
            v.reset(2);
            v.insert(0);
            for _ in 0..n {
                v.reset(2);
            }
            assert!(v.insert(0), "stale mark after {n} resets");
            assert!(v.insert(1));
            assert!(!v.insert(0));
        }
    }

    #[test]
    fn pool_reuses_items() {
        let pool: VisitedPool<VisitedSet> = VisitedPool::default();
        {
            let mut g = pool.get();
            g.reset(100);
        }
        let g = pool.get();
        assert_eq!(g.capacity(), 100);
    }
}
