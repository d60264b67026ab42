//! Deletes that keep the graph navigable.
//!
//! A delete removes the id from the id map and marks its slot `DELETED`:
//! from then on searches never return it, but still walk through it, so the
//! graph stays connected. When the pending deletes exceed
//! `consolidate_fraction` of the live points, a consolidation runs (in the
//! style of FreshDiskANN's Algorithm 4, with HNSW's own selection heuristic
//! in place of α-RNG pruning):
//!
//! 1. inserts are paused (exclusive `mutate` lock); searches go on;
//! 2. for every remaining node `p` and layer `l` whose list names a deleted
//!    node, the candidates are `p`'s surviving neighbours plus the surviving
//!    neighbours of its deleted neighbours; the heuristic keeps at most the
//!    layer's bound of them as `p`'s new list;
//! 3. a deleted entry point is replaced by the live node of highest level;
//! 4. an exclusive store-lock barrier waits for every search that may still
//!    hold a deleted id, then the slots are marked free and handed to the
//!    allocator, which gives them to the next inserts.
//!
//! So the slots in use stay close to the live points (reclaimed space), and
//! no search keeps walking tombstones forever.

use crate::builder::rank_from;
use crate::engine::{pack_entry, unpack_entry, Hnsw, NO_ENTRY};
use crate::layout::{Store, FREE};
use rayon::prelude::*;
use std::sync::atomic::Ordering;
use vectide_core::heap::Candidate;
use vectide_core::{Result, Seq, VectorIndex};

#[derive(Default)]
struct RepairScratch {
    list: Vec<u32>,
    dead_list: Vec<u32>,
    cands: Vec<u32>,
    ranked: Vec<Candidate>,
    kept: Vec<u32>,
}

impl Hnsw {
    pub(crate) fn delete_batch(&self, seq: Seq, ids: &[u64]) -> Result<usize> {
        let _op = self.seqs.begin(seq);
        let removed = {
            let _shared = self.mutate.read();
            let store = self.store.read();
            let mut map = self.ids.lock();
            let mut n = 0;
            for id in ids {
                // Idempotent replay: a delete older than the write it would
                // undo is skipped.
                if map.get(id).is_some_and(|e| e.seq <= seq) {
                    let e = map.remove(id).expect("present");
                    crate::engine::retire(&store, &self.pending, e.slot);
                    n += 1;
                }
            }
            n
        };
        let pending = self.pending.lock().len();
        let live = self.len().max(1);
        if pending as f64 > self.params.consolidate_fraction * live as f64 {
            self.consolidate();
        }
        Ok(removed)
    }

    /// Repairs the graph around every pending delete and reclaims their
    /// slots. Returns how many slots were reclaimed.
    pub fn consolidate(&self) -> usize {
        let _exclusive = self.mutate.write();
        let dead: Vec<u32> = std::mem::take(&mut *self.pending.lock());
        if dead.is_empty() {
            return 0;
        }
        let used = self.alloc.lock().next as usize;
        {
            let store = self.store.read();
            let mut is_dead = vec![false; used];
            for &d in &dead {
                is_dead[d as usize] = true;
            }
            self.install(|| {
                (0..used as u32).into_par_iter().for_each_init(
                    RepairScratch::default,
                    |sc, s| {
                        if !is_dead[s as usize] && store.state(s) != FREE {
                            self.repair_node(&store, s, &is_dead, sc);
                        }
                    },
                )
            });
            if let Some((ep, _)) = unpack_entry(self.entry.load(Ordering::Acquire)) {
                if is_dead[ep as usize] {
                    let best = (0..used as u32)
                        .filter(|&s| !is_dead[s as usize] && store.state(s) != FREE)
                        .max_by_key(|&s| (store.level(s), std::cmp::Reverse(s)));
                    let word = best.map_or(NO_ENTRY, |s| pack_entry(s, store.level(s)));
                    self.entry.store(word, Ordering::Release);
                }
            }
        }
        // Barrier: once we hold the store exclusively, no search that could
        // have read an edge to a dead node is still running.
        drop(self.store.write());
        {
            let store = self.store.read();
            for &d in &dead {
                store.set_state(d, FREE);
            }
        }
        self.alloc.lock().free.extend_from_slice(&dead);
        self.consolidations.fetch_add(1, Ordering::Relaxed);
        dead.len()
    }

    fn repair_node(&self, store: &Store, s: u32, is_dead: &[bool], sc: &mut RepairScratch) {
        let dead = |x: u32| is_dead.get(x as usize).copied().unwrap_or(false);
        for l in 0..=store.level(s) {
            store.neighbors_into(s, l, &mut sc.list);
            if !sc.list.iter().any(|&x| dead(x)) {
                continue;
            }
            // Survivors stay (they passed the heuristic when chosen); the
            // freed room goes to the best of the deleted neighbours' own
            // neighbours that the α-rule admits next to them.
            sc.kept.clear();
            sc.cands.clear();
            for &x in &sc.list {
                if dead(x) {
                    store.neighbors_into(x, l, &mut sc.dead_list);
                    sc.cands
                        .extend(sc.dead_list.iter().copied().filter(|&y| y != s && !dead(y)));
                } else {
                    sc.kept.push(x);
                }
            }
            sc.cands.sort_unstable();
            sc.cands.dedup();
            sc.cands.retain(|y| !sc.kept.contains(y));
            rank_from(store, self.dist, s, &sc.cands, &mut sc.ranked);
            let alpha = if self.metric == vectide_core::Metric::Ip {
                1.0
            } else {
                self.params.repair_alpha
            };
            let cap = store.cap(l);
            for c in &sc.ranked {
                if sc.kept.len() >= cap {
                    break;
                }
                let vc = store.vector(c.node);
                if sc
                    .kept
                    .iter()
                    .all(|&r| alpha * (self.dist)(vc, store.vector(r)) >= c.dist.0)
                {
                    sc.kept.push(c.node);
                }
            }
            let _g = store.lock(s);
            store.set_list(s, l, &sc.kept);
        }
    }
}
