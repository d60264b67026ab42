//! Slot bookkeeping of the volatile graph engines: which slot an external
//! id lives in, which slots are free, and the two moves every upsert and
//! delete makes — publishing a linked node under its id, retiring the node
//! it replaces.
//!
//! A retired slot is marked `DELETED` and queued in `pending`: searches still
//! walk it (the graph stays connected) but never return it, until the
//! engine's consolidation repairs the lists that name it and frees it.

use crate::mem::{Store, DELETED, LIVE};
use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
use vectide_core::{Error, Result, Seq};

/// Where an external id lives and which operation wrote it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdEntry {
    pub slot: u32,
    pub seq: Seq,
}

/// Slot allocation: reclaimed slots first, then never-used ones.
#[derive(Debug, Default)]
pub struct Alloc {
    pub free: Vec<u32>,
    pub next: u32,
}

/// Takes `n` slots (reclaimed ones first), growing the store (by half, at
/// least 1,024 slots) when the never-used ones run out. Lock order: `alloc`,
/// then `store`.
pub fn allocate(alloc: &Mutex<Alloc>, store: &RwLock<Store>, n: usize) -> Result<Vec<u32>> {
    let mut a = alloc.lock();
    let reuse = n.min(a.free.len());
    let at = a.free.len() - reuse;
    let mut slots: Vec<u32> = a.free.split_off(at);
    let fresh = n - reuse;
    let start = a.next as usize;
    let end = start + fresh;
    if end >= u32::MAX as usize {
        a.free.extend(slots);
        return Err(Error::invalid("index is full: 2^32-1 slots"));
    }
    let cap = store.read().capacity;
    if end > cap {
        let new_cap = end.max(cap + cap / 2).max(1024).min(u32::MAX as usize - 1);
        store.write().grow(new_cap);
    }
    a.next = end as u32;
    slots.extend(start as u32..end as u32);
    Ok(slots)
}

/// Marks a slot deleted and queues it for consolidation.
pub fn retire(store: &Store, pending: &Mutex<Vec<u32>>, slot: u32) {
    store.set_state(slot, DELETED);
    pending.lock().push(slot);
}

/// Makes a linked node visible under its id, replacing an older version
/// (which is retired); a node older than what the id holds is retired
/// instead (a replay, or an upsert that lost the race to a newer one).
pub fn publish(
    store: &Store,
    ids: &Mutex<HashMap<u64, IdEntry>>,
    pending: &Mutex<Vec<u32>>,
    slot: u32,
    label: u64,
    seq: Seq,
) {
    let mut map = ids.lock();
    match map.get(&label).copied() {
        Some(e) if e.seq > seq => {
            drop(map);
            retire(store, pending, slot);
        }
        Some(e) => {
            map.insert(label, IdEntry { slot, seq });
            retire(store, pending, e.slot);
            store.set_state(slot, LIVE);
        }
        None => {
            map.insert(label, IdEntry { slot, seq });
            store.set_state(slot, LIVE);
        }
    }
}

/// The rows of a batch that are newer than what their id holds (idempotent
/// replay: an id already written by this or a later operation is left
/// alone).
pub fn newer_rows(ids: &Mutex<HashMap<u64, IdEntry>>, labels: &[u64], seq: Seq) -> Vec<usize> {
    let map = ids.lock();
    (0..labels.len())
        .filter(|&r| map.get(&labels[r]).is_none_or(|e| e.seq < seq))
        .collect()
}

/// Removes the ids a delete at `seq` may remove (a delete older than the
/// write it would undo is skipped) and retires their slots; returns how
/// many.
pub fn delete_ids(
    store: &Store,
    ids: &Mutex<HashMap<u64, IdEntry>>,
    pending: &Mutex<Vec<u32>>,
    labels: &[u64],
    seq: Seq,
) -> usize {
    let mut map = ids.lock();
    let mut n = 0;
    for id in labels {
        if map.get(id).is_some_and(|e| e.seq <= seq) {
            let e = map.remove(id).expect("present");
            retire(store, pending, e.slot);
            n += 1;
        }
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn publish_replaces_older_versions_and_retires_stale_ones() {
        let store = RwLock::new(Store::with_degrees(2, 1, 2, 0));
        let alloc = Mutex::new(Alloc::default());
        let (ids, pending) = (Mutex::new(HashMap::new()), Mutex::new(Vec::new()));
        let s = allocate(&alloc, &store, 3).unwrap();
        assert_eq!(s, vec![0, 1, 2]);
        assert!(store.read().capacity >= 1024);
        let st = store.read();
        for &x in &s {
            // SAFETY: single-threaded test; nothing references the slots.
            unsafe { st.init_slot(x, 7, 0, &[0.0, 1.0], 0) };
        }
        publish(&st, &ids, &pending, 0, 7, 5);
        publish(&st, &ids, &pending, 1, 7, 9); // newer: replaces 0
        publish(&st, &ids, &pending, 2, 7, 6); // older: retired itself
        assert_eq!(ids.lock()[&7], IdEntry { slot: 1, seq: 9 });
        assert_eq!(*pending.lock(), vec![0, 2]);
        assert_eq!(
            (st.state(0), st.state(1), st.state(2)),
            (DELETED, LIVE, DELETED)
        );
        assert_eq!(newer_rows(&ids, &[7, 8], 9), vec![1]);
        assert_eq!(newer_rows(&ids, &[7, 8], 10), vec![0, 1]);
        assert_eq!(
            delete_ids(&st, &ids, &pending, &[7, 8], 8),
            0,
            "older delete skipped"
        );
        assert_eq!(delete_ids(&st, &ids, &pending, &[7, 8], 9), 1);
        assert!(ids.lock().is_empty());
        drop(st);
        alloc.lock().free.push(1);
        assert_eq!(
            allocate(&alloc, &store, 2).unwrap(),
            vec![1, 3],
            "reclaimed first"
        );
        assert_eq!(store.read().state(3), 0);
    }
}
