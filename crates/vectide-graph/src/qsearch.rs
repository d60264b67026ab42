//! Layer-0 search on RaBitQ codes with exact re-ranking (the store's
//! [`codes`](crate::codes) on).
//!
//! The float search's best-first walk (`search::search_layer`) with
//! estimates in place of distances, as SymphonyQG walks its graph: the
//! candidates are ordered by *estimated* distance and the walk stops when
//! the nearest one's estimate is past the `ef`-th best estimate among the
//! admitted nodes met. Expanding a node computes its exact distance (its
//! vector is read once, where the float search reads the vectors of all
//! its neighbours) and estimates all its neighbours at once from the codes
//! stored beside its list (one fast scan per 32). A neighbour whose lower
//! bound (estimate − error bound) is already past the `ef`-th exact
//! distance found cannot be among the answers with the bound's confidence,
//! and is dropped (the error bound prunes it). The answers are the
//! expanded nodes the predicate admits, ranked by their exact distances.
//! Nodes the predicate refuses are walked through, never returned. The
//! next candidate's vector, list and list codes are prefetched once this
//! node's neighbours are in (then the next node is known) and load while
//! this node's exact distance is computed. (A copy of each vector at the
//! head of its codes, one sequential read per hop as SymphonyQG lays a
//! node out, measured no faster on 384-d text and cost 1.5 KiB per node.)

use crate::graph::Graph;
use crate::mem::Store;
use crate::search::{greedy, Scratch};
use std::cmp::Reverse;
use std::sync::atomic::Ordering;
use vectide_core::distance::prefetch;
use vectide_core::heap::{Candidate, Dist};
use vectide_core::metric::DistanceFn;

/// [`crate::search::knn`] on the store's codes: greedy descent on the upper
/// layers with exact distances, then the layer-0 search above. The store
/// must have its codes on; without them this is the float search. The
/// admitted results, closest first by exact distance, are left in
/// `scratch.sorted`.
#[allow(clippy::too_many_arguments)]
pub fn knn_quantized<A: Fn(u32) -> bool>(
    store: &Store,
    dist: DistanceFn,
    q: &[f32],
    entry: Option<(u32, usize)>,
    ef: usize,
    scratch: &mut Scratch,
    admit: A,
) {
    let Some(codes) = store.codes() else {
        return crate::search::knn(store, dist, q, entry, ef, scratch, admit);
    };
    scratch.sorted.clear();
    let Some((ep, top_level)) = entry else {
        return;
    };
    if codes.prepare(q, &mut scratch.codes).is_err() {
        // A query the quantizer refuses (the engine checked it before):
        // the float search answers it.
        return crate::search::knn(store, dist, q, entry, ef, scratch, admit);
    }
    let mut cur = ep;
    let mut cur_dist = dist(q, store.vector(ep));
    for level in (1..=top_level).rev() {
        (cur, cur_dist) = greedy(store, dist, q, cur, cur_dist, level, &mut scratch.neighbors);
    }
    let Scratch {
        visited,
        candidates,
        top,
        est_top,
        codes: cs,
        ..
    } = scratch;
    visited.reset(store.slots());
    candidates.clear();
    top.reset(ef);
    est_top.reset(ef);
    let bound = store.slots() as u32;
    // The entry point seeds layer 0 too, as in the float search (its
    // exact distance stands for its estimate).
    let ep_dist = if cur == ep {
        cur_dist
    } else {
        dist(q, store.vector(ep))
    };
    for (d, s) in [(cur_dist, cur), (ep_dist, ep)] {
        if visited.insert(s) {
            candidates.push(Reverse(Candidate::new(d, s)));
            if admit(s) {
                est_top.push(d, s);
            }
        }
    }
    // Once a node's neighbours are in, the next node to expand is known:
    // its list, list codes and vector are loaded while this node's exact
    // distance is computed (its own vector was loaded the same way).
    let code_lines = codes.list_bytes().div_ceil(64);
    let vec_lines = (store.dim * 4).div_ceil(64);
    while let Some(Reverse(c)) = candidates.pop() {
        if c.dist > Dist(est_top.threshold()) {
            break;
        }
        let node = c.node;
        let list = store.list(node, 0);
        let n = (list[0].load(Ordering::Acquire) as usize).min(list.len() - 1);
        for a in &list[1..=n] {
            prefetch(visited.tag_ptr(a.load(Ordering::Relaxed)));
        }
        codes.estimate_list(node, n, cs);
        let exact_full = top.is_full();
        let exact_worst = top.threshold();
        for (i, a) in list[1..=n].iter().enumerate() {
            let nb = a.load(Ordering::Acquire);
            if nb >= bound || !visited.insert(nb) {
                continue;
            }
            let (est, err) = cs.est[i];
            if exact_full && est - err > exact_worst {
                continue;
            }
            if est < est_top.threshold() {
                candidates.push(Reverse(Candidate::new(est, nb)));
                if admit(nb) {
                    est_top.push(est, nb);
                }
            }
        }
        if let Some(Reverse(nx)) = candidates.peek() {
            if nx.dist <= Dist(est_top.threshold()) {
                prefetch(store.list0_ptr(nx.node));
                let p = codes.list_ptr(nx.node);
                for l in 0..code_lines {
                    prefetch(p.wrapping_add(64 * l));
                }
                let v = store.vector_ptr(nx.node) as *const u8;
                for l in 0..vec_lines {
                    prefetch(v.wrapping_add(64 * l));
                }
            }
        }
        if admit(node) {
            top.push(dist(q, store.vector(node)), node);
        }
    }
    let Scratch { top, sorted, .. } = scratch;
    top.drain_sorted_into(sorted);
}
