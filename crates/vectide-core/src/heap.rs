//! Search results and the bounded top-k heap used by every engine.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// One search result: an id and its "smaller is closer" distance.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Neighbor {
    pub id: u64,
    pub distance: f32,
}

impl Neighbor {
    pub fn new(id: u64, distance: f32) -> Self {
        Neighbor { id, distance }
    }
}

/// A distance with a total order (NaN sorts last), for heaps.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Dist(pub f32);

impl Eq for Dist {}
impl PartialOrd for Dist {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Dist {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// A candidate in a graph search: distance first, then the node slot, so that
/// ties break deterministically.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Candidate {
    pub dist: Dist,
    pub node: u32,
}

impl Candidate {
    #[inline]
    pub fn new(dist: f32, node: u32) -> Self {
        Candidate {
            dist: Dist(dist),
            node,
        }
    }
}

/// Keeps the `k` smallest-distance entries seen so far.
///
/// A max-heap on distance: the root is the current worst kept entry, so a new
/// entry is admitted in `O(log k)` only when it beats it. The heap keeps its
/// allocation across [`TopK::clear`], so one `TopK` serves many queries.
#[derive(Debug, Clone, Default)]
pub struct TopK {
    k: usize,
    heap: BinaryHeap<Candidate>,
}

/// Entries a new [`TopK`] reserves up front: the heap grows by what a search
/// really keeps, never by an (outside) `k` alone.
const TOPK_PREALLOC: usize = 256;

impl TopK {
    pub fn new(k: usize) -> Self {
        TopK {
            k,
            heap: BinaryHeap::with_capacity(k.saturating_add(1).min(TOPK_PREALLOC)),
        }
    }

    /// Empties the heap and sets a new bound, keeping the allocation.
    pub fn reset(&mut self, k: usize) {
        self.k = k;
        self.heap.clear();
    }

    /// The bytes its heap holds (its capacity).
    pub fn capacity_bytes(&self) -> usize {
        self.heap.capacity() * std::mem::size_of::<Candidate>()
    }

    pub fn len(&self) -> usize {
        self.heap.len()
    }

    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }

    pub fn is_full(&self) -> bool {
        self.heap.len() >= self.k
    }

    /// The worst kept distance, or +inf while the heap is not full.
    #[inline]
    pub fn threshold(&self) -> f32 {
        if self.is_full() {
            self.heap.peek().map_or(f32::INFINITY, |c| c.dist.0)
        } else {
            f32::INFINITY
        }
    }

    /// Offers an entry; returns whether it was kept.
    #[inline]
    pub fn push(&mut self, dist: f32, node: u32) -> bool {
        if self.k == 0 {
            return false;
        }
        if self.heap.len() < self.k {
            self.heap.push(Candidate::new(dist, node));
            true
        } else if self.heap.peek().is_some_and(|w| Dist(dist) < w.dist) {
            self.heap.pop();
            self.heap.push(Candidate::new(dist, node));
            true
        } else {
            false
        }
    }

    /// Removes the worst entry.
    pub fn pop_worst(&mut self) -> Option<Candidate> {
        self.heap.pop()
    }

    /// Drains into `out`, closest first (the allocation of the heap is kept).
    pub fn drain_sorted_into(&mut self, out: &mut Vec<Candidate>) {
        out.clear();
        out.extend(self.heap.drain());
        out.sort_unstable();
    }

    /// Iterates over the kept entries in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = &Candidate> {
        self.heap.iter()
    }
}

/// The order of exact answers: distance, then id (so that ties are
/// answered the same way every time).
pub fn by_distance_then_id(a: &Neighbor, b: &Neighbor) -> Ordering {
    a.distance.total_cmp(&b.distance).then(a.id.cmp(&b.id))
}

/// Cuts `v` down to its `k` nearest entries (in no particular order), in
/// linear time: for scans that fill a buffer a stretch at a time and keep
/// the buffer's size bounded by `k` plus one stretch.
pub fn keep_nearest(v: &mut Vec<Neighbor>, k: usize) {
    if v.len() > k {
        if k > 0 {
            v.select_nth_unstable_by(k, by_distance_then_id);
        }
        v.truncate(k);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keep_nearest_keeps_the_k_nearest_and_breaks_ties_by_id() {
        let mut v: Vec<Neighbor> = [(7, 3.0), (1, 1.0), (9, 2.0), (4, 2.0), (2, 5.0)]
            .into_iter()
            .map(|(i, d)| Neighbor::new(i, d))
            .collect();
        keep_nearest(&mut v, 3);
        v.sort_by(by_distance_then_id);
        let got: Vec<u64> = v.iter().map(|n| n.id).collect();
        assert_eq!(got, vec![1, 4, 9]);
        keep_nearest(&mut v, 0);
        assert!(v.is_empty());
    }

    #[test]
    fn keeps_the_k_smallest() {
        let mut t = TopK::new(3);
        for (i, d) in [5.0, 1.0, 4.0, 2.0, 3.0, 0.5].into_iter().enumerate() {
            t.push(d, i as u32);
        }
        let mut out = Vec::new();
        t.drain_sorted_into(&mut out);
        let got: Vec<u32> = out.iter().map(|c| c.node).collect();
        assert_eq!(got, vec![5, 1, 3]);
        assert!(t.is_empty());
    }

    #[test]
    fn a_huge_k_allocates_by_what_is_kept() {
        // Reserving k + 1 entries up front would abort the process here.
        let mut t = TopK::new(1 << 40);
        assert!(t.heap.capacity() <= TOPK_PREALLOC);
        for i in 0..10 {
            t.push(i as f32, i);
        }
        assert_eq!(t.len(), 10);
        assert!(!t.is_full());
    }

    #[test]
    fn zero_k_keeps_nothing_and_nan_sorts_last() {
        let mut t = TopK::new(0);
        assert!(!t.push(1.0, 1));
        let mut t = TopK::new(2);
        t.push(f32::NAN, 0);
        t.push(1.0, 1);
        t.push(2.0, 2);
        let mut out = Vec::new();
        t.drain_sorted_into(&mut out);
        assert_eq!(out.iter().map(|c| c.node).collect::<Vec<_>>(), vec![1, 2]);
    }
}
