//! Neighbour selection and insert planning, generic over [`Graph`]:
//! HNSW's heuristic (Malkov & Yashunin, Algorithm 4), its α-generalisation
//! (FreshDiskANN's RobustPrune rule), the plan of a new node's lists, the
//! back-link decision, and the level draw.

use crate::graph::Graph;
use crate::search::{greedy, search_layer, Scratch};
use vectide_core::heap::Candidate;
use vectide_core::metric::DistanceFn;

/// Highest layer a node may get.
pub const MAX_LEVEL: usize = 16;

/// HNSW's neighbour-selection heuristic: walks `cands` (sorted, closest
/// first) and keeps a candidate only if no already kept node is closer to it
/// than the base point is. Keeps at most `m`.
pub fn select_heuristic<G: Graph>(
    store: &G,
    dist: DistanceFn,
    cands: &[Candidate],
    m: usize,
    out: &mut Vec<u32>,
) {
    select_alpha(store, dist, cands, m, 1.0, out)
}

/// The α-RNG generalisation (DiskANN's RobustPrune): a candidate `c` is
/// dropped when a kept `r` has `α · d(r, c) < d(p, c)`. `α = 1` is HNSW's
/// heuristic; `α > 1` keeps more, longer edges. Only meaningful for
/// non-negative distances (callers pass 1 for inner product).
pub fn select_alpha<G: Graph>(
    store: &G,
    dist: DistanceFn,
    cands: &[Candidate],
    m: usize,
    alpha: f32,
    out: &mut Vec<u32>,
) {
    out.clear();
    for c in cands {
        if out.len() >= m {
            break;
        }
        if admits(store, dist, out, c, alpha) {
            out.push(c.node);
        }
    }
}

/// Whether no node of `kept` occludes candidate `c` under `alpha`
/// (`α · d(k, c) ≥ d(p, c)` for every kept `k`).
#[inline]
fn admits<G: Graph>(g: &G, dist: DistanceFn, kept: &[u32], c: &Candidate, alpha: f32) -> bool {
    let vc = g.vector(c.node);
    kept.iter()
        .all(|&k| alpha * dist(vc, g.vector(k)) >= c.dist.0)
}

/// FreshDiskANN's RobustPrune (Algorithm 3): the new out-list of `p` from
/// the candidate pool `cands` together with `p`'s current list, without `p`
/// itself and without nodes `keep` refuses (deleted ones, say), ranked by
/// distance to `p` and pruned by the α-rule to at most `r` (the α = 1
/// selection first, then α fills the room left). `pool` and
/// `ranked` are scratch; the list is left in `out`.
#[allow(clippy::too_many_arguments)]
pub fn robust_prune<G: Graph>(
    g: &G,
    dist: DistanceFn,
    p: u32,
    cands: &[u32],
    keep: impl Fn(u32) -> bool,
    alpha: f32,
    r: usize,
    pool: &mut Vec<u32>,
    ranked: &mut Vec<Candidate>,
    out: &mut Vec<u32>,
) {
    g.neighbors_into(p, 0, out);
    pool.clear();
    pool.extend_from_slice(cands);
    pool.extend_from_slice(out);
    pool.sort_unstable();
    pool.dedup();
    pool.retain(|&x| x != p && keep(x));
    rank_from(g, dist, p, pool, ranked);
    // As DiskANN's code: first the α = 1 selection, then the room left is
    // filled in rank order under α (each admitted one checked against all
    // kept so far), so the list holds the diverse neighbours first and the
    // long α-edges after them. The first pass remembers, per candidate, the
    // distance to the kept node that occluded it: that node is still kept
    // in the second pass, so when it occludes under α too the candidate is
    // out without another distance (the same lists, about half the work).
    out.clear();
    OCCLUDER.with(|occ| {
        let mut occ = occ.borrow_mut();
        occ.clear();
        occ.resize(ranked.len(), f32::INFINITY);
        for (i, c) in ranked.iter().enumerate() {
            if out.len() >= r {
                break;
            }
            let vc = g.vector(c.node);
            match out
                .iter()
                .map(|&k| dist(vc, g.vector(k)))
                .find(|&d| d < c.dist.0)
            {
                Some(d) => occ[i] = d,
                None => {
                    occ[i] = f32::NEG_INFINITY; // kept
                    out.push(c.node);
                }
            }
        }
        if alpha > 1.0 && out.len() < r {
            for (i, c) in ranked.iter().enumerate() {
                if out.len() >= r {
                    break;
                }
                // Kept already (−∞), or its first-pass occluder occludes
                // under α as well.
                if occ[i] == f32::NEG_INFINITY || alpha * occ[i] < c.dist.0 {
                    continue;
                }
                if admits(g, dist, out, c, alpha) {
                    out.push(c.node);
                }
            }
        }
    });
}

thread_local! {
    /// [`robust_prune`]'s per-candidate occluder distances (reused).
    static OCCLUDER: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Vectors without lists: a [`Graph`] for pruning points that are not in an
/// in-memory graph (StreamingMerge prunes disk nodes over their PQ
/// reconstructions and new points over their vectors). Slot `i` is
/// `rows[i]`, borrowed where it lies (no copy); every list is empty.
#[derive(Debug, Clone, Copy)]
pub struct Rows<'a> {
    pub rows: &'a [&'a [f32]],
}

impl Graph for Rows<'_> {
    fn slots(&self) -> usize {
        self.rows.len()
    }
    fn vector(&self, slot: u32) -> &[f32] {
        self.rows[slot as usize]
    }
    fn vector_ptr(&self, slot: u32) -> *const f32 {
        self.rows[slot as usize].as_ptr()
    }
    fn list0_ptr(&self, slot: u32) -> *const u8 {
        self.rows[slot as usize].as_ptr() as *const u8
    }
    fn list(&self, _slot: u32, _level: usize) -> &[std::sync::atomic::AtomicU32] {
        &[]
    }
    fn cap(&self, _level: usize) -> usize {
        0
    }
}

/// RobustPrune of row 0 of `points` over the others (slots `1..`): the
/// kept slots, at most `r`, into `out` (see [`robust_prune`]).
pub fn prune_points(
    points: Rows<'_>,
    dist: DistanceFn,
    alpha: f32,
    r: usize,
    pool: &mut Vec<u32>,
    ranked: &mut Vec<Candidate>,
    out: &mut Vec<u32>,
) {
    let n = points.slots() as u32;
    let cands: Vec<u32> = (1..n).collect();
    robust_prune(
        &points,
        dist,
        0,
        &cands,
        |_| true,
        alpha,
        r,
        pool,
        ranked,
        out,
    );
}

/// Distances from `base` to each id, sorted closest first, into `out`.
pub fn rank_from<G: Graph>(
    store: &G,
    dist: DistanceFn,
    base: u32,
    ids: &[u32],
    out: &mut Vec<Candidate>,
) {
    let vb = store.vector(base);
    out.clear();
    out.extend(
        ids.iter()
            .map(|&i| Candidate::new(dist(vb, store.vector(i)), i)),
    );
    out.sort_unstable();
}

/// Phase 1 of an insert, shared by every engine: greedy descent from the
/// entry point `(slot, top level)` down to layer `level + 1`, then at each
/// layer `min(level, top)..=0` a search with `ef_construction` candidates and
/// the heuristic selection of at most `m` neighbours. `lists[l]` receives the
/// selected neighbours at layer `l` (`lists.len() == level + 1`; layers above
/// the current top stay empty). Neighbours are chosen only among the slots
/// `admit` takes (all are walked): hnsw admits no deleted node, so that a
/// consolidation whose repair runs beside inserts never finds a new edge
/// to a node it is removing.
#[allow(clippy::too_many_arguments)]
pub fn plan_links<G: Graph>(
    g: &G,
    dist: DistanceFn,
    v: &[f32],
    slot: u32,
    level: usize,
    (ep, top): (u32, usize),
    ef_construction: usize,
    m: usize,
    scratch: &mut Scratch,
    lists: &mut Vec<Vec<u32>>,
    admit: impl Fn(u32) -> bool,
) {
    lists.resize_with(level + 1, Vec::new);
    lists.truncate(level + 1);
    lists.iter_mut().for_each(Vec::clear);
    let mut cur = ep;
    let mut cur_dist = dist(v, g.vector(ep));
    for l in (level + 1..=top).rev() {
        (cur, cur_dist) = greedy(g, dist, v, cur, cur_dist, l, &mut scratch.neighbors);
    }
    for l in (0..=level.min(top)).rev() {
        search_layer(
            g,
            dist,
            v,
            &[Candidate::new(cur_dist, cur)],
            ef_construction,
            l,
            scratch,
            |s| s != slot && admit(s),
        );
        let Scratch {
            top: heap, sorted, ..
        } = scratch;
        heap.drain_sorted_into(sorted);
        if let Some(c) = sorted.first() {
            (cur, cur_dist) = (c.node, c.dist.0);
        }
        select_heuristic(g, dist, sorted, m, &mut lists[l]);
    }
}

/// What a neighbour's list becomes when a new node links to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backlink {
    /// The new node is already listed (or the neighbour has no such layer).
    Present,
    /// There is room: the new node goes at the end.
    Append,
    /// The list is full: it becomes the heuristic selection left in `kept`.
    Replace,
}

/// Phase 2 step of an insert, shared by every engine: decides how `n`'s list
/// at layer `l` takes the back-edge to `new` (the caller holds `n`'s lock).
/// `buf` receives `n`'s current list; on [`Backlink::Replace`], `kept` the new
/// one (the current list plus `new`, pruned by HNSW's heuristic to the
/// layer's bound).
#[allow(clippy::too_many_arguments)]
pub fn backlink<G: Graph>(
    g: &G,
    dist: DistanceFn,
    n: u32,
    new: u32,
    l: usize,
    buf: &mut Vec<u32>,
    ranked: &mut Vec<Candidate>,
    kept: &mut Vec<u32>,
) -> Backlink {
    if g.list(n, l).is_empty() {
        buf.clear();
        return Backlink::Present;
    }
    g.neighbors_into(n, l, buf);
    if buf.contains(&new) {
        return Backlink::Present;
    }
    if buf.len() < g.cap(l) {
        return Backlink::Append;
    }
    buf.push(new);
    rank_from(g, dist, n, buf, ranked);
    select_heuristic(g, dist, ranked, g.cap(l), kept);
    Backlink::Replace
}

/// SplitMix64's output function: a well-mixed 64-bit value of `x`.
pub fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The level of the `n`-th insert: P(level >= l) = m^-l, a pure function of
/// the seed and the counter (so builds are reproducible).
pub fn draw_level(seed: u64, n: u64, m: usize) -> usize {
    let u = (splitmix64(seed ^ splitmix64(n)) >> 11) as f64 / (1u64 << 53) as f64;
    let ml = 1.0 / (m as f64).ln();
    ((-(1.0 - u).ln() * ml) as usize).min(MAX_LEVEL)
}

#[cfg(test)]
mod tests {
    use super::*;
    use vectide_core::Metric;

    /// The two passes as written in the paper and DiskANN's code, every
    /// check against every kept node.
    fn reference(points: &Rows<'_>, dist: DistanceFn, alpha: f32, r: usize) -> Vec<u32> {
        let mut ranked = Vec::new();
        let ids: Vec<u32> = (1..points.slots() as u32).collect();
        rank_from(points, dist, 0, &ids, &mut ranked);
        let mut out = Vec::new();
        for a in [1.0, alpha] {
            for c in &ranked {
                if out.len() >= r {
                    break;
                }
                if out.contains(&c.node) {
                    continue;
                }
                if admits(points, dist, &out, c, a) {
                    out.push(c.node);
                }
            }
        }
        out
    }

    #[test]
    fn robust_prune_keeps_the_lists_of_the_plain_two_passes() {
        let mut x = 12345u32;
        let mut rnd = || {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x % 1000) as f32 / 1000.0
        };
        for (case, &(n, dim, alpha, r)) in [
            (40, 2, 1.2, 8),
            (120, 8, 1.2, 16),
            (300, 16, 1.5, 64),
            (60, 4, 1.0, 10),
        ]
        .iter()
        .enumerate()
        {
            let data: Vec<f32> = (0..n * dim).map(|_| rnd()).collect();
            let rows: Vec<&[f32]> = data.chunks(dim).collect();
            let pts = Rows { rows: &rows };
            for metric in [Metric::L2, Metric::Cosine] {
                let dist = metric.distance_fn();
                let want = reference(&pts, dist, alpha, r);
                let (mut pool, mut ranked, mut out) = (Vec::new(), Vec::new(), Vec::new());
                prune_points(pts, dist, alpha, r, &mut pool, &mut ranked, &mut out);
                assert_eq!(out, want, "case {case} {metric:?}");
                assert!(!out.is_empty() && out.len() <= r);
            }
        }
    }
}
