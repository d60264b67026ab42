//! [`Graph`]: the read side of an HNSW graph, whatever holds it.
//!
//! The volatile `hnsw` engine keeps its graph in DRAM arrays; P-HNSW keeps
//! it in a persistent region. Traversal, neighbour selection and insert
//! planning are written once against this trait and monomorphised for each.

use std::sync::atomic::{AtomicU32, Ordering};

/// Read access to an HNSW graph's vectors and neighbour lists.
///
/// Lists are `[count, n_0, …, n_{cap-1}]` of atomics: readers never lock;
/// a writer (holding the node's lock) stores the entries, then publishes the
/// count with `Release`.
pub trait Graph: Sync {
    /// Upper bound (exclusive) of the slot ids in the graph: the size of a
    /// visited set.
    fn slots(&self) -> usize;
    /// The stored vector of a slot.
    fn vector(&self, slot: u32) -> &[f32];
    /// Address of a slot's vector, for prefetching only.
    fn vector_ptr(&self, slot: u32) -> *const f32;
    /// Starts loading every cache line of a slot's vector (a hint: it never
    /// faults). The default touches the first line only.
    #[inline]
    fn prefetch_vector(&self, slot: u32) {
        vectide_core::distance::prefetch(self.vector_ptr(slot));
    }
    /// Address of a slot's layer-0 list, for prefetching only.
    fn list0_ptr(&self, slot: u32) -> *const u8;
    /// The list `[count, entries…]` of a slot at a layer; empty when the slot
    /// has no such layer.
    fn list(&self, slot: u32, level: usize) -> &[AtomicU32];
    /// Out-degree bound at a layer.
    fn cap(&self, level: usize) -> usize;

    /// Copies a slot's neighbours at a layer into `out` (cleared first). The
    /// count is clamped to the list's room and ids outside the graph are
    /// skipped, so a torn or corrupted list never leads a reader astray.
    #[inline]
    fn neighbors_into(&self, slot: u32, level: usize, out: &mut Vec<u32>) {
        out.clear();
        let list = self.list(slot, level);
        if list.is_empty() {
            return;
        }
        let n = (list[0].load(Ordering::Acquire) as usize).min(list.len() - 1);
        let bound = self.slots() as u32;
        out.extend(
            list[1..=n]
                .iter()
                .map(|a| a.load(Ordering::Acquire))
                .filter(|&id| id < bound),
        );
    }
}

/// Stores `ids` into a list `[count, entries…]`: the entries first, then the
/// count with `Release`, so a reader never sees a count that covers entries
/// not yet written. Returns how many were stored (at most the list's room).
/// The caller holds the node's lock.
pub fn store_list(list: &[AtomicU32], ids: &[u32]) -> usize {
    let Some((count, room)) = list.split_first() else {
        return 0;
    };
    let n = ids.len().min(room.len());
    for (a, &id) in room.iter().zip(&ids[..n]) {
        a.store(id, Ordering::Release);
    }
    count.store(n as u32, Ordering::Release);
    n
}
