//! In-neighbour repair: what consolidation does to a list that names
//! deleted nodes (FreshDiskANN's Algorithm 4, Singh et al. 2021).
//!
//! The surviving neighbours stay (they passed the pruning rule when chosen);
//! the freed room goes to the deleted neighbours' own surviving neighbours,
//! closest first, each admitted only if no kept neighbour `r` has
//! `α·d(r, c) < d(p, c)`. With α = 1 this is HNSW's heuristic; FreshVamana
//! uses its construction α.

use crate::graph::Graph;
use crate::mem::Store;
use crate::prune::rank_from;
use crate::search::{search_layer, Scratch};
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

    /// The list that call read: a caller that repairs without the node's
    /// lock compares it with the list under the lock before it writes.
    pub fn seen(&self) -> &[u32] {
        &self.list
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

/// Makes every live node reachable again on layer 0. The pruning in
/// a consolidation's repair can drop every edge that used to reach a node
/// (or a small group of nodes) through a deleted node; property tests
/// find such cases with small degrees. A walk from the entry point marks what
/// is reachable; each node it misses is linked from the closest reachable
/// node that has room, or that can give up its farthest neighbour while
/// another node still links to that one. Everything the linked node
/// reaches becomes reachable with it. Returns the nodes relinked.
pub fn reconnect_unreachable(
    store: &Store,
    dist: DistanceFn,
    ep: u32,
    used: usize,
    live: impl Fn(u32) -> bool,
    ef: usize,
    scratch: &mut Scratch,
) -> usize {
    reconnect_unreachable_with(store, dist, ep, used, live, ef, scratch, |y, _, list| {
        let _g = store.lock(y);
        store.set_list(y, 0, list);
        true
    })
}

/// [`reconnect_unreachable`] over any [`Graph`]: `set(node, seen, list)`
/// stores a node's new layer-0 list (a persistent engine logs it first),
/// made from `seen`, the list as read, and returns whether it did.
///
/// Inserts may run beside the call when `set` refuses (returns `false`)
/// a list that is no longer `seen` under the node's lock: the node it would
/// have linked is left for the next repair. Nodes at or above `used` (the
/// inserts' new ones) are walked past, never linked; the reachability this
/// works from is then a snapshot that an insert's pruning may have changed
/// since, as with any HNSW insert.
#[allow(clippy::too_many_arguments)]
pub fn reconnect_unreachable_with<G: Graph>(
    store: &G,
    dist: DistanceFn,
    ep: u32,
    used: usize,
    live: impl Fn(u32) -> bool,
    ef: usize,
    scratch: &mut Scratch,
    mut set: impl FnMut(u32, &[u32], &[u32]) -> bool,
) -> usize {
    let mut buf = Vec::new();
    let mut reach = vec![false; used];
    // In-edges from reachable nodes: a node may give up a neighbour only
    // if another reachable node still links to it, so that relinking one
    // node never strands another.
    let mut indeg = vec![0u32; used];
    let mark = |from: u32, reach: &mut Vec<bool>, indeg: &mut Vec<u32>, buf: &mut Vec<u32>| {
        let mut stack = vec![from];
        reach[from as usize] = true;
        while let Some(x) = stack.pop() {
            store.neighbors_into(x, 0, buf);
            for &y in buf.iter() {
                if y as usize >= used {
                    continue; // a node inserted since the call began
                }
                indeg[y as usize] += 1;
                if live(y) && !reach[y as usize] {
                    reach[y as usize] = true;
                    stack.push(y);
                }
            }
        }
    };
    mark(ep, &mut reach, &mut indeg, &mut buf);
    let missing: Vec<u32> = (0..used as u32)
        .filter(|&s| live(s) && !reach[s as usize])
        .collect();
    if missing.is_empty() {
        return 0;
    }

    let mut list = Vec::new();
    let mut seen = Vec::new();
    let mut cands = Vec::new();
    let mut ranked = Vec::new();
    let mut relinked = 0;
    let mut queue: std::collections::VecDeque<u32> = missing.into_iter().collect();
    let mut budget = queue.len() * 4 + 16;
    while let Some(x) = queue.pop_front() {
        if reach[x as usize] || budget == 0 {
            continue;
        }
        budget -= 1;
        let v = store.vector(x);
        let entry = Candidate::new(dist(v, store.vector(ep)), ep);
        search_layer(store, dist, v, &[entry], ef, 0, scratch, |s| {
            live(s) && reach.get(s as usize).copied().unwrap_or(false)
        });
        let Scratch { top, sorted, .. } = scratch;
        top.drain_sorted_into(sorted);
        cands.clear();
        cands.extend(sorted.iter().map(|c| c.node));
        rank_from(store, dist, x, &cands, &mut ranked);
        let mut choice = with_room(store, &ranked, &mut list);
        if choice.is_none() {
            // Every reachable node with room is a candidate too (the search
            // above found full ones only): a scan of the graph, before any
            // list gives up a neighbour (which costs a walk of the graph).
            for s in 0..used as u32 {
                if live(s) && reach[s as usize] && s != x && !cands.contains(&s) {
                    store.neighbors_into(s, 0, &mut list);
                    if list.len() < store.cap(0) {
                        cands.push(s);
                    }
                }
            }
            rank_from(store, dist, x, &cands, &mut ranked);
            choice = with_room(store, &ranked, &mut list)
                .or_else(|| giving_up(store, dist, &ranked, &indeg, &mut list));
        }
        let Some((y, slot_in_list)) = choice else {
            continue; // the next repair (or consolidation) tries again
        };
        store.neighbors_into(y, 0, &mut list);
        if list.contains(&x) {
            // A writer linked x from y since the walk (an insert that reuses
            // a freed slot below `used` back-links it while this call runs):
            // x is reachable, and a second copy of the edge would be a
            // duplicate neighbour.
            indeg[x as usize] += 1;
            mark(x, &mut reach, &mut indeg, &mut buf);
            continue;
        }
        seen.clear();
        seen.extend_from_slice(&list);
        match slot_in_list {
            None => list.push(x),
            Some(i) if i < list.len() => list[i] = x,
            Some(_) => continue, // the list shrank under a writer
        }
        if !set(y, &seen, &list) {
            continue; // an insert changed the list: the next repair tries
        }
        relinked += 1;
        if slot_in_list.is_none() {
            // Only an edge was added: what x reaches joins the reachable set.
            indeg[x as usize] += 1;
            mark(x, &mut reach, &mut indeg, &mut buf);
        } else {
            // An eviction can strand what was reachable only through a
            // cycle: recompute reachability from scratch and queue
            // whatever is missing now.
            reach.iter_mut().for_each(|r| *r = false);
            indeg.iter_mut().for_each(|d| *d = 0);
            mark(ep, &mut reach, &mut indeg, &mut buf);
            queue.extend((0..used as u32).filter(|&s| live(s) && !reach[s as usize]));
        }
    }
    relinked
}

/// The closest of `ranked` whose layer-0 list has room.
fn with_room<G: Graph>(
    store: &G,
    ranked: &[Candidate],
    list: &mut Vec<u32>,
) -> Option<(u32, Option<usize>)> {
    ranked.iter().find_map(|c| {
        store.neighbors_into(c.node, 0, list);
        (list.len() < store.cap(0)).then_some((c.node, None))
    })
}

/// The closest of `ranked` that can give up its farthest neighbour that
/// another reachable node also links, and that neighbour's index.
fn giving_up<G: Graph>(
    store: &G,
    dist: DistanceFn,
    ranked: &[Candidate],
    indeg: &[u32],
    list: &mut Vec<u32>,
) -> Option<(u32, Option<usize>)> {
    ranked.iter().find_map(|c| {
        let y = c.node;
        store.neighbors_into(y, 0, list);
        let vy = store.vector(y);
        list.iter()
            .enumerate()
            .filter(|(_, &z)| indeg.get(z as usize).is_some_and(|&d| d > 1))
            .max_by(|a, b| dist(vy, store.vector(*a.1)).total_cmp(&dist(vy, store.vector(*b.1))))
            .map(|(i, _)| (y, Some(i)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::Store;
    use crate::search::Scratch;
    use std::sync::atomic::{AtomicBool, Ordering};
    use vectide_core::Metric;

    /// A writer links the unreachable node from its nearest reachable one
    /// after the walk and before the relink reads that node's list (an
    /// insert reusing a freed slot does so beside a consolidation): the
    /// relink must find the edge there and not add a second copy.
    #[test]
    fn a_node_linked_by_a_writer_after_the_walk_is_not_linked_twice() {
        // A line 0 - 1 - 2 - 3, and node 4 beside 3 that nothing links.
        let s = Store::new(1, 4, 5);
        for (i, x) in [0.0f32, 1.0, 2.0, 3.0, 3.5].iter().enumerate() {
            // SAFETY: single-threaded test; nothing references the slots yet.
            unsafe { s.init_slot(i as u32, i as u64, 1, &[*x], 0) };
            s.set_state(i as u32, crate::mem::LIVE);
        }
        s.set_list(0, 0, &[1]);
        s.set_list(1, 0, &[0, 2]);
        s.set_list(2, 0, &[1, 3]);
        s.set_list(3, 0, &[2]);
        let linked = AtomicBool::new(false);
        // `live` is first asked about node 4 when the walk is over and the
        // missing nodes are collected: the writer's link lands then.
        let live = |n: u32| {
            if n == 4 && !linked.swap(true, Ordering::Relaxed) {
                let _g = s.lock(3);
                assert!(s.push_neighbor(3, 0, 4));
            }
            true
        };
        let mut written = Vec::new();
        let n = reconnect_unreachable_with(
            &s,
            Metric::L2.distance_fn(),
            0,
            5,
            live,
            8,
            &mut Scratch::default(),
            |y, _, list| {
                written.push((y, list.to_vec()));
                true
            },
        );
        assert!(linked.load(Ordering::Relaxed), "the writer's link ran");
        assert_eq!(written, vec![], "nothing to write: 3 already links 4");
        assert_eq!(n, 0);
        let mut out = Vec::new();
        s.neighbors_into(3, 0, &mut out);
        assert_eq!(out, vec![2, 4]);
    }
}
