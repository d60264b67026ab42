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
