//! The tail cache: the payload of the partly filled last block of recently
//! appended postings, kept in RAM so that the next APPEND to the posting
//! writes its fresh block without reading the old one back from the disk.
//!
//! An entry is valid only for the block it was written as: it is looked up
//! by posting id *and* the block's `(block, gen)` ref, which no other write
//! ever carries (every block write takes a new gen). A PUT, a removal or a
//! lost swap therefore never needs to invalidate anything: the posting's
//! new last block has another ref, the stale entry misses and is replaced
//! by the next APPEND. Nothing here is durable; after a crash or an open
//! the cache starts empty and the first APPEND to each posting reads its
//! tail as before.
//!
//! At most [`TAIL_CACHE_POSTINGS`] postings are held (each less than one
//! block of payload, so at most 16 MiB); a full cache drops an arbitrary
//! entry for the new one, which keeps the most recently appended postings
//! hot without the bookkeeping of an LRU.

use crate::layout::{BlockRef, PAYLOAD};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

/// Postings whose tail is kept at most.
pub const TAIL_CACHE_POSTINGS: usize = 4096;

struct Tail {
    at: BlockRef,
    payload: Box<[u8]>,
}

/// The cache (module docs).
pub(crate) struct Tails {
    cap: usize,
    map: Mutex<HashMap<u32, Tail>>,
    bytes: AtomicU64,
    hits: AtomicU64,
    misses: AtomicU64,
}

impl Tails {
    pub(crate) fn new(cap: usize) -> Self {
        Tails {
            cap,
            map: Mutex::new(HashMap::new()),
            bytes: AtomicU64::new(0),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    /// Appends to `out` the cached payload of posting `pid`'s last block
    /// `at`, if the cache holds exactly that block with `used` bytes;
    /// whether it did.
    pub(crate) fn get_into(&self, pid: u32, at: BlockRef, used: usize, out: &mut Vec<u8>) -> bool {
        let hit = {
            let map = self.map.lock();
            match map.get(&pid) {
                Some(t) if t.at == at && t.payload.len() == used => {
                    out.extend_from_slice(&t.payload);
                    true
                }
                _ => false,
            }
        };
        let c = if hit { &self.hits } else { &self.misses };
        c.fetch_add(1, Ordering::Relaxed);
        hit
    }

    /// Records that posting `pid`'s last block is now `at` holding
    /// `payload`; a full block (nothing to append to) is forgotten instead.
    pub(crate) fn put(&self, pid: u32, at: BlockRef, payload: &[u8]) {
        let mut map = self.map.lock();
        if payload.len() >= PAYLOAD || payload.is_empty() {
            if let Some(old) = map.remove(&pid) {
                self.bytes
                    .fetch_sub(old.payload.len() as u64, Ordering::Relaxed);
            }
            return;
        }
        if map.len() >= self.cap && !map.contains_key(&pid) {
            let victim = map.keys().next().copied();
            if let Some(old) = victim.and_then(|v| map.remove(&v)) {
                self.bytes
                    .fetch_sub(old.payload.len() as u64, Ordering::Relaxed);
            }
        }
        if self.cap == 0 {
            return;
        }
        self.bytes
            .fetch_add(payload.len() as u64, Ordering::Relaxed);
        let new = Tail {
            at,
            payload: payload.into(),
        };
        if let Some(old) = map.insert(pid, new) {
            self.bytes
                .fetch_sub(old.payload.len() as u64, Ordering::Relaxed);
        }
    }

    /// Bytes of payload held.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    /// (hits, misses) of [`Tails::get_into`] so far.
    pub(crate) fn hits_misses(&self) -> (u64, u64) {
        (
            self.hits.load(Ordering::Relaxed),
            self.misses.load(Ordering::Relaxed),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(block: u32, gen: u32) -> BlockRef {
        BlockRef { block, gen }
    }

    #[test]
    fn hits_only_the_block_it_was_written_as() {
        let t = Tails::new(8);
        t.put(3, at(10, 1), b"abc");
        let mut out = Vec::new();
        assert!(t.get_into(3, at(10, 1), 3, &mut out));
        assert_eq!(out, b"abc");
        // Another gen of the same block, another block, another length,
        // another posting: misses, and `out` is untouched.
        out.clear();
        assert!(!t.get_into(3, at(10, 2), 3, &mut out));
        assert!(!t.get_into(3, at(11, 1), 3, &mut out));
        assert!(!t.get_into(3, at(10, 1), 4, &mut out));
        assert!(!t.get_into(4, at(10, 1), 3, &mut out));
        assert!(out.is_empty());
        assert_eq!(t.hits_misses(), (1, 4));
    }

    #[test]
    fn full_blocks_are_forgotten_and_the_size_is_bounded() {
        let t = Tails::new(4);
        for pid in 0..10u32 {
            t.put(pid, at(pid, pid), &[pid as u8; 100]);
        }
        assert_eq!(t.map.lock().len(), 4);
        assert_eq!(t.bytes(), 400);
        // The last one put is always kept.
        let mut out = Vec::new();
        assert!(t.get_into(9, at(9, 9), 100, &mut out));
        // A block filled to the brim leaves nothing to append to.
        t.put(9, at(20, 20), &vec![1u8; PAYLOAD]);
        assert!(!t.get_into(9, at(20, 20), PAYLOAD, &mut out));
        assert_eq!(t.bytes(), 300);
        // Replacing an entry keeps the byte count exact.
        let present = *t.map.lock().keys().next().unwrap();
        t.put(present, at(21, 21), &[0u8; 10]);
        assert_eq!(t.bytes(), 210);
        let held: u64 = t.map.lock().values().map(|v| v.payload.len() as u64).sum();
        assert_eq!(t.bytes(), held);
        let none = Tails::new(0);
        none.put(1, at(1, 1), b"x");
        assert_eq!((none.bytes(), none.map.lock().len()), (0, 0));
    }
}
