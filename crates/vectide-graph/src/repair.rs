//! In-neighbour repair: what consolidation does to a list that names
//! deleted nodes (FreshDiskANN's Algorithm 4, Singh et al. 2021).
//!
//! The surviving neighbours stay (they passed the pruning rule when chosen);
//! the freed room goes to the deleted neighbours' own surviving neighbours,
//! closest first, each admitted only if no kept neighbour `r` has
//! `α·d(r, c) < d(p, c)`. With α = 1 this is HNSW's heuristic; FreshVamana
//! uses its construction α.

use crate::graph::Graph;
use crate::prune::rank_from;
use vectide_core::heap::Candidate;
use vectide_core::metric::DistanceFn;

/// Per-thread buffers of [`repair_list`]; after a call that returned true,
/// [`RepairScratch::kept`] holds the repaired list.
#[derive(Default)]
pub struct RepairScratch {
    list: Vec<u32>,
    dead_list: Vec<u32>,
    cands: Vec<u32>,
    ranked: Vec<Candidate>,
    kept: Vec<u32>,
}

impl RepairScratch {
    /// The repaired list of the last [`repair_list`] call that returned true.
    pub fn kept(&self) -> &[u32] {
        &self.kept
    }
}

/// Computes the repaired list of `slot` at `level` when it names a node for
/// which `dead` is true; returns false (and computes nothing) when it does
/// not. The caller stores [`RepairScratch::kept`] under the node's lock.
#[allow(clippy::too_many_arguments)]
pub fn repair_list<G: Graph>(
    g: &G,
    dist: DistanceFn,
    slot: u32,
    level: usize,
    dead: impl Fn(u32) -> bool,
    alpha: f32,
    sc: &mut RepairScratch,
) -> bool {
    g.neighbors_into(slot, level, &mut sc.list);
    if !sc.list.iter().any(|&x| dead(x)) {
        return false;
    }
    sc.kept.clear();
    sc.cands.clear();
    for &x in &sc.list {
        if dead(x) {
            g.neighbors_into(x, level, &mut sc.dead_list);
            sc.cands.extend(
                sc.dead_list
                    .iter()
                    .copied()
                    .filter(|&y| y != slot && !dead(y)),
            );
        } else {
            sc.kept.push(x);
        }
    }
    sc.cands.sort_unstable();
    sc.cands.dedup();
    sc.cands.retain(|y| !sc.kept.contains(y));
    rank_from(g, dist, slot, &sc.cands, &mut sc.ranked);
    let cap = g.cap(level);
    for c in &sc.ranked {
        if sc.kept.len() >= cap {
            break;
        }
        let vc = g.vector(c.node);
        if sc
            .kept
            .iter()
            .all(|&r| alpha * dist(vc, g.vector(r)) >= c.dist.0)
        {
            sc.kept.push(c.node);
        }
    }
    true
}
