//! Deletes: lazy, into the DeleteList, and their consolidation
//! (FreshDiskANN's Algorithm 4).
//!
//! A delete removes the id from the id map and marks its slot `DELETED`:
//! searches keep walking it (the graph stays navigable) but never return
//! it. When the DeleteList exceeds `consolidate_fraction` of the live
//! points — or on request (`maintain`) — a consolidation runs:
//!
//! 1. the DeleteList is taken as the dead set while inserts and deletes
//!    pause (exclusive `mutate` lock, an instant); then they go on beside
//!    the repair, as searches do: an insert never links to a deleted node
//!    (`linkable`), so a repaired list stays clean, and a list is repaired
//!    under its node's lock, as an insert's back-edge is written;
//! 2. in parallel over every remaining node `p` whose out-list names a
//!    deleted node, a stretch of slots at a time: the candidate set is `p`'s surviving neighbours plus
//!    the surviving neighbours of its deleted ones, and `p`'s list becomes
//!    RobustPrune(p, candidates, α, R) — Algorithm 4 exactly;
//! 3. with inserts and deletes paused again, a walk from the start node
//!    finds live nodes the pruning left
//!    unreachable and links each from its closest reachable node (shared
//!    with hnsw: `vectide_graph::repair::reconnect_unreachable`);
//! 4. an exclusive store-lock barrier waits for every search that may still
//!    hold a deleted id, then the slots are marked free and handed to the
//!    allocator, which gives them to the next inserts (slot reuse).
//!
//! The start node is frozen: never deleted, so it never moves.

use crate::builder::linkable;
use crate::engine::FreshVamana;
use rayon::prelude::*;
use std::sync::atomic::Ordering;
use vectide_core::heap::Candidate;
use vectide_core::{Result, Seq};
use vectide_graph::mem::{Store, FREE, FROZEN, LIVE};
use vectide_graph::prune::robust_prune;
use vectide_graph::repair::reconnect_unreachable;
use vectide_graph::Graph;

/// Slots a consolidation repairs per hold of the store's read lock.
pub const REPAIR_STRETCH: usize = 256;

/// Per-thread buffers of a consolidation.
#[derive(Default)]
struct Buffers {
    list: Vec<u32>,
    dead_list: Vec<u32>,
    cands: Vec<u32>,
    pool: Vec<u32>,
    ranked: Vec<Candidate>,
    out: Vec<u32>,
}

impl FreshVamana {
    pub(crate) fn delete_batch(&self, seq: Seq, ids: &[u64]) -> Result<usize> {
        let _op = self.core.seqs.begin(seq);
        let (removed, due) = self.core.delete(seq, ids, self.params.consolidate_fraction);
        if due && !self.core.maintenance_deferred.load(Ordering::Acquire) {
            self.consolidate();
        }
        Ok(removed)
    }

    /// Consolidates when the DeleteList exceeds `consolidate_fraction` of
    /// the live points (unless the caller runs maintenance itself:
    /// `defer_maintenance`).
    pub(crate) fn consolidate_if_due(&self) {
        if !self.core.maintenance_deferred.load(Ordering::Acquire)
            && self
                .core
                .consolidation_due(self.params.consolidate_fraction)
        {
            self.consolidate();
        }
    }

    /// Runs Algorithm 4 over the DeleteList and reclaims its slots (see the
    /// module docs). Returns how many slots were reclaimed. Consolidations
    /// run one at a time; inserts and deletes wait only while the dead set
    /// is taken and for the last step (reachability, reclaim), not for the
    /// repair.
    pub fn consolidate(&self) -> usize {
        let _serial = self.core.consolidating.lock();
        let _job = self.core.activity.begin("consolidate");
        // The dead set is taken once no insert is half done: every insert
        // after it starts with these nodes deleted and never links to them
        // (`linkable`), so a repaired list gains no edge to one again.
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
        let alpha = self.alpha();
        // Beside inserts and deletes: each list is read, pruned and written
        // under its node's lock, as an insert's back-edge is, so neither
        // loses the other's change; the store's read lock a stretch at a
        // time, so that an insert that grows the store waits for a stretch.
        for start in (0..used).step_by(REPAIR_STRETCH) {
            let stop = (start + REPAIR_STRETCH).min(used);
            let store = self.core.store.read();
            self.core.install(|| {
                (start as u32..stop as u32).into_par_iter().for_each_init(
                    Buffers::default,
                    |b, s| {
                        if !is_dead[s as usize] && store.state(s) != FREE {
                            self.repair(&store, s, &is_dead, alpha, b);
                        }
                    },
                )
            });
        }
        let _exclusive = self.core.mutate.write();
        let used = self.core.alloc.lock().next as usize;
        is_dead.resize(used, false);
        self.reconnect(&self.core.store.read(), used, &is_dead);
        // SAFETY: we hold `mutate` exclusively; every dead slot was retired
        // by a delete or an upsert before the dead set was taken, the
        // repair above rewrote every list of a surviving slot that named
        // one (under its lock, so no back-edge write undid it), no insert
        // since links to a deleted node, and the start node is frozen,
        // never dead.
        unsafe { self.core.reclaim(&dead) };
        dead.len()
    }

    /// Links every live node the start node cannot reach (pruning can drop
    /// a node's last in-edge: duplicates of a kept neighbour, say, are
    /// never kept). Inserts and deletes wait; searches go on. Returns the
    /// nodes relinked.
    pub fn repair_reachability(&self) -> usize {
        let _exclusive = self.core.mutate.write();
        let used = self.core.alloc.lock().next as usize;
        let store = self.core.store.read();
        self.reconnect(&store, used, &vec![false; used])
    }

    pub(crate) fn reconnect(&self, store: &Store, used: usize, is_dead: &[bool]) -> usize {
        let Some(start) = self.start_slot() else {
            return 0;
        };
        let live = |s: u32| !is_dead[s as usize] && store.state(s) != FREE;
        let mut scratch = self.core.scratch.get();
        reconnect_unreachable(
            store,
            self.core.dist,
            start,
            used,
            live,
            self.params.l_build,
            &mut scratch,
        )
    }

    /// Algorithm 4 for one node.
    fn repair(&self, store: &Store, p: u32, is_dead: &[bool], alpha: f32, b: &mut Buffers) {
        let dead = |x: u32| is_dead.get(x as usize).copied().unwrap_or(false);
        // The list is read and written under the node's lock: an insert's
        // back-edge may land beside the repair.
        let _g = store.lock(p);
        store.neighbors_into(p, 0, &mut b.list);
        if !b.list.iter().any(|&x| dead(x)) {
            return;
        }
        b.cands.clear();
        for &v in b.list.iter().filter(|&&v| dead(v)) {
            store.neighbors_into(v, 0, &mut b.dead_list);
            b.cands
                .extend(b.dead_list.iter().copied().filter(|&y| !dead(y)));
        }
        let keep = |x: u32| !dead(x) && linkable(store, x);
        robust_prune(
            store,
            self.core.dist,
            p,
            &b.cands,
            keep,
            alpha,
            self.params.r,
            &mut b.pool,
            &mut b.ranked,
            &mut b.out,
        );
        store.set_list(p, 0, &b.out);
    }
}

/// What [`FreshVamana::check_graph`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GraphCheck {
    /// Live nodes.
    pub live: usize,
    /// Live nodes reachable from the start node (through any used node,
    /// deleted ones included, as searches walk them).
    pub reachable: usize,
    /// Edges naming a free slot, and self-loops.
    pub bad_edges: usize,
    /// Lists longer than their room (`SLACK · r`).
    pub over_degree: usize,
    /// Whether the start node is a used slot in the frozen state.
    pub start_ok: bool,
}

impl FreshVamana {
    /// Walks the whole graph and checks its structure (for tests and
    /// `check_structure`; O(N·R), pauses inserts and deletes).
    pub fn check_graph(&self) -> GraphCheck {
        let _exclusive = self.core.mutate.write();
        let used = self.core.alloc.lock().next as usize;
        let store = self.core.store.read();
        let used_slot = |s: u32| (s as usize) < used && store.state(s) != FREE;
        let mut report = GraphCheck::default();
        let mut buf = Vec::new();
        for s in 0..used as u32 {
            if !used_slot(s) {
                continue;
            }
            if store.state(s) == LIVE {
                report.live += 1;
            }
            store.neighbors_into(s, 0, &mut buf);
            if buf.len() > store.cap(0) {
                report.over_degree += 1;
            }
            report.bad_edges += buf.iter().filter(|&&y| !used_slot(y) || y == s).count();
        }
        let start = self.start_slot().filter(|&s| used_slot(s));
        report.start_ok = start.is_some_and(|s| store.state(s) == FROZEN);
        if let Some(start) = start {
            let mut seen = vec![false; used];
            let mut stack = vec![start];
            seen[start as usize] = true;
            while let Some(x) = stack.pop() {
                if store.state(x) == LIVE {
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
