//! Deletes that keep the graph navigable.
//!
//! A delete removes the id from the id map and marks its slot `DELETED`:
//! from then on searches never return it, but still walk through it, so the
//! graph stays connected. When the pending deletes exceed
//! `consolidate_fraction` of the live points, a consolidation runs (in the
//! style of FreshDiskANN's Algorithm 4):
//!
//! 1. the DeleteList is taken as the dead set while inserts are paused
//!    (exclusive `mutate` lock, an instant); then inserts, deletes and
//!    searches go on beside the repair: an insert never links to a deleted
//!    node, so a repaired list stays clean, and a list is repaired under
//!    its node's lock, as an insert's back-edge is written;
//! 2. for every remaining node `p` and layer `l` whose list names a deleted
//!    node, the surviving neighbours stay and the freed room is filled from
//!    the surviving neighbours of its deleted neighbours, closest first, each
//!    admitted only if no kept neighbour `r` has `α·d(r, c) < d(p, c)`
//!    (α = `repair_alpha`, 1 by default, HNSW's rule; see its docs) —
//!    `vectide_graph::repair`;
//! 3. with inserts paused again: a deleted entry point is replaced by the
//!    live node of highest level;
//! 4. a walk from the entry point finds live nodes the repair left
//!    unreachable (pruning can drop every path to a node) and links each from
//!    its closest reachable node;
//! 5. an exclusive store-lock barrier waits for every search that may still
//!    hold a deleted id, then the slots are marked free and handed to the
//!    allocator, which gives them to the next inserts.
//!
//! So the slots in use stay close to the live points (reclaimed space), and
//! no search keeps walking tombstones forever.

use crate::graph::Graph;
use crate::state::{pack_entry, unpack_entry, Hnsw, NO_ENTRY};
use rayon::prelude::*;
use std::sync::atomic::Ordering;
use vectide_core::{Result, Seq};
use vectide_graph::mem::{Store, FREE};
use vectide_graph::repair::{reconnect_unreachable, repair_list, RepairScratch};

/// Slots a consolidation repairs per hold of the store's read lock.
pub const REPAIR_STRETCH: usize = 256;

impl Hnsw {
    pub(crate) fn delete_batch(&self, seq: Seq, ids: &[u64]) -> Result<usize> {
        let _op = self.core.seqs.begin(seq);
        let (removed, due) = self.core.delete(seq, ids, self.params.consolidate_fraction);
        if due && !self.core.maintenance_deferred.load(Ordering::Acquire) {
            self.consolidate();
        }
        Ok(removed)
    }

    /// Links every live node that the entry point cannot reach (HNSW's
    /// pruning of a neighbour's list can, rarely, drop a node's last
    /// in-edge; consolidations run this too). Inserts and deletes wait;
    /// searches go on. Returns the nodes relinked.
    pub fn repair_reachability(&self) -> usize {
        let _exclusive = self.core.mutate.write();
        let used = self.core.alloc.lock().next as usize;
        let store = self.core.store.read();
        // Tombstones stay in the graph until a consolidation: searches walk
        // them, so reachability goes through them too.
        self.reconnect_unreachable(&store, used, &vec![false; used])
    }

    /// Repairs the graph around every pending delete and reclaims their
    /// slots. Returns how many slots were reclaimed. Consolidations run one
    /// at a time; inserts and deletes wait only while the dead set is taken
    /// and for the last step (entry point, reachability, reclaim), not for
    /// the repair.
    pub fn consolidate(&self) -> usize {
        let _serial = self.core.consolidating.lock();
        let _job = self.core.activity.begin("consolidate");
        // The dead set is taken once no insert is half done: every insert
        // after it starts with these nodes deleted and so never links to
        // them (`builder`), and a node repaired below gains no edge to one.
        let (dead, used) = {
            let _exclusive = self.core.mutate.write();
            let dead: Vec<u32> = std::mem::take(&mut *self.core.pending.lock());
            (dead, self.core.alloc.lock().next as usize)
        };
        if dead.is_empty() {
            return 0;
        }
        let mut is_dead = vec![false; used];
        for &d in &dead {
            is_dead[d as usize] = true;
        }
        // The repair runs beside inserts and deletes: each list is read,
        // repaired and written under its node's lock, as an insert's
        // back-edge is, so neither loses the other's change. The store's
        // read lock is taken a stretch at a time, so that an insert that
        // grows the store (exclusive) waits for a stretch, not the job.
        for start in (0..used).step_by(REPAIR_STRETCH) {
            let stop = (start + REPAIR_STRETCH).min(used);
            let store = self.core.store.read();
            self.core.install(|| {
                (start as u32..stop as u32).into_par_iter().for_each_init(
                    RepairScratch::default,
                    |sc, s| {
                        if !is_dead[s as usize] && store.state(s) != FREE {
                            self.repair_node(&store, s, &is_dead, sc);
                        }
                    },
                )
            });
        }
        let _exclusive = self.core.mutate.write();
        let used = self.core.alloc.lock().next as usize;
        is_dead.resize(used, false);
        {
            let store = self.core.store.read();
            if let Some((ep, _)) = unpack_entry(self.entry.load(Ordering::Acquire)) {
                if is_dead[ep as usize] {
                    let best = (0..used as u32)
                        .filter(|&s| !is_dead[s as usize] && store.state(s) != FREE)
                        .max_by_key(|&s| (store.level(s), std::cmp::Reverse(s)));
                    let word = best.map_or(NO_ENTRY, |s| pack_entry(s, store.level(s)));
                    self.entry.store(word, Ordering::Release);
                }
            }
            self.reconnect_unreachable(&store, used, &is_dead);
        }
        // SAFETY: we hold `mutate` exclusively; every dead slot was retired
        // by a delete or an upsert before the dead set was taken, the
        // repair above rewrote every list of a surviving slot that named
        // one (under its lock, so no back-edge write undid it), and no
        // insert since links to a deleted node (the entry point
        // is never dead: it was moved above).
        unsafe { self.core.reclaim(&dead) };
        dead.len()
    }

    /// Makes every live node reachable again on layer 0
    /// (`vectide_graph::repair::reconnect_unreachable`); returns the nodes
    /// relinked.
    fn reconnect_unreachable(&self, store: &Store, used: usize, is_dead: &[bool]) -> usize {
        let Some(ep) = unpack_entry(self.entry.load(Ordering::Acquire)).map(|(s, _)| s) else {
            return 0;
        };
        let live = |s: u32| !is_dead[s as usize] && store.state(s) != FREE;
        let mut scratch = self.core.scratch.get();
        reconnect_unreachable(
            store,
            self.core.dist,
            ep,
            used,
            live,
            self.params.ef_construction,
            &mut scratch,
        )
    }

    fn repair_node(&self, store: &Store, s: u32, is_dead: &[bool], sc: &mut RepairScratch) {
        let dead = |x: u32| is_dead.get(x as usize).copied().unwrap_or(false);
        let alpha = if self.core.metric == vectide_core::Metric::Ip {
            1.0
        } else {
            self.params.repair_alpha
        };
        let _g = store.lock(s);
        for l in 0..=store.level(s) {
            if repair_list(store, self.core.dist, s, l, dead, alpha, sc) {
                store.set_list(s, l, sc.kept());
            }
        }
    }
}

/// What [`Hnsw::check_graph`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GraphCheck {
    /// Live nodes.
    pub live: usize,
    /// Live nodes reachable on layer 0 from the entry point (through any
    /// used node, deleted ones included, as searches walk them).
    pub reachable: usize,
    /// Live nodes (other than the entry point) that no used node links to on layer 0.
    pub orphans: usize,
    /// Edges naming a free slot, or a node absent from that layer.
    pub bad_edges: usize,
}

impl Hnsw {
    /// Walks the whole graph and checks its structure (for tests and
    /// `vectide inspect`; O(N·m), pauses inserts and deletes).
    pub fn check_graph(&self) -> GraphCheck {
        let _exclusive = self.core.mutate.write();
        let used = self.core.alloc.lock().next as usize;
        let store = self.core.store.read();
        let used_slot = |s: u32| (s as usize) < used && store.state(s) != FREE;
        let mut report = GraphCheck::default();
        let mut indeg = vec![0u32; used];
        let mut buf = Vec::new();
        for s in 0..used as u32 {
            if !used_slot(s) {
                continue;
            }
            if store.state(s) == vectide_graph::mem::LIVE {
                report.live += 1;
            }
            for l in 0..=store.level(s) {
                store.neighbors_into(s, l, &mut buf);
                for &y in &buf {
                    if !used_slot(y) || store.level(y) < l {
                        report.bad_edges += 1;
                    } else if l == 0 {
                        indeg[y as usize] += 1;
                    }
                }
            }
        }
        let ep = unpack_entry(self.entry.load(Ordering::Acquire)).map(|(s, _)| s);
        report.orphans = (0..used as u32)
            .filter(|&s| {
                store.state(s) == vectide_graph::mem::LIVE
                    && Some(s) != ep
                    && indeg[s as usize] == 0
            })
            .count();
        if let Some(ep) = ep.filter(|&e| used_slot(e)) {
            let mut seen = vec![false; used];
            let mut stack = vec![ep];
            seen[ep as usize] = true;
            while let Some(x) = stack.pop() {
                if store.state(x) == vectide_graph::mem::LIVE {
                    report.reachable += 1;
                }
                store.neighbors_into(x, 0, &mut buf);
                for &y in &buf {
                    if used_slot(y) && !seen[y as usize] {
                        seen[y as usize] = true;
                        stack.push(y);
                    }
                }
            }
        }
        report
    }
}
