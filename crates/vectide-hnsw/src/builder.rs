//! Inserting: slot allocation, level draw, the layer-by-layer linking of
//! HNSW (Malkov & Yashunin, Algorithm 1 with the neighbour-selection
//! heuristic of Algorithm 4), and the publication of a new node.

use crate::engine::{pack_entry, retire, unpack_entry, Hnsw, IdEntry};
use crate::graph::Graph;
use crate::layout::{Store, LIVE};
use crate::params::MAX_LEVEL;
use crate::search::{greedy, search_layer, Scratch};
use rayon::prelude::*;
use std::sync::atomic::{AtomicUsize, Ordering};
use vectide_core::heap::Candidate;
use vectide_core::metric::DistanceFn;
use vectide_core::validate::{check_batch, copy_normalized};
use vectide_core::{Error, Result, Seq};

/// Called with the number of rows done so far (for progress bars).
pub use vectide_core::Progress;

/// HNSW's neighbour-selection heuristic: walks `cands` (sorted, closest
/// first) and keeps a candidate only if no already kept node is closer to it
/// than the base point is. Keeps at most `m`.
pub(crate) fn select_heuristic<G: Graph>(
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
pub(crate) fn select_alpha<G: Graph>(
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
        let vc = store.vector(c.node);
        if out
            .iter()
            .all(|&r| alpha * dist(vc, store.vector(r)) >= c.dist.0)
        {
            out.push(c.node);
        }
    }
}

/// Distances from `base` to each id, sorted closest first, into `out`.
pub(crate) fn rank_from<G: Graph>(
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
/// the current top stay empty).
#[allow(clippy::too_many_arguments)]
pub(crate) fn plan_links<G: Graph>(
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
            |s| s != slot,
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
pub(crate) enum Backlink {
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
pub(crate) fn backlink<G: Graph>(
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

fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The level of the `n`-th insert: P(level >= l) = m^-l, a pure function of
/// the seed and the counter (so builds are reproducible).
pub(crate) fn draw_level(seed: u64, n: u64, m: usize) -> usize {
    let u = (splitmix64(seed ^ splitmix64(n)) >> 11) as f64 / (1u64 << 53) as f64;
    let ml = 1.0 / (m as f64).ln();
    ((-(1.0 - u).ln() * ml) as usize).min(MAX_LEVEL)
}

impl Hnsw {
    /// Draws a level with P(level >= l) = m^-l.
    fn random_level(&self) -> usize {
        let n = self.level_counter.fetch_add(1, Ordering::Relaxed);
        draw_level(self.params.seed, n, self.params.m)
    }

    /// Takes `n` slots (reclaimed ones first), growing the store if needed.
    fn allocate(&self, n: usize) -> Result<Vec<u32>> {
        let mut a = self.alloc.lock();
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
        let cap = self.store.read().capacity;
        if end > cap {
            let new_cap = end.max(cap + cap / 2).max(1024).min(u32::MAX as usize - 1);
            self.store.write().grow(new_cap);
        }
        a.next = end as u32;
        slots.extend(start as u32..end as u32);
        Ok(slots)
    }

    /// Inserts a batch (upsert semantics), in parallel on the index's pool.
    pub(crate) fn insert_batch(&self, seq: Seq, ids: &[u64], vectors: &[f32]) -> Result<()> {
        self.insert_with_progress(seq, ids, vectors, None)
    }

    /// [`Hnsw::insert_batch`] reporting progress.
    pub fn insert_with_progress(
        &self,
        seq: Seq,
        ids: &[u64],
        vectors: &[f32],
        progress: Option<Progress<'_>>,
    ) -> Result<()> {
        check_batch(self.dim, self.metric, ids, vectors)?;
        let _op = self.seqs.begin(seq);
        let _shared = self.mutate.read();
        // Idempotent replay: an id already written by this or a later
        // operation is left alone.
        let rows: Vec<usize> = {
            let map = self.ids.lock();
            (0..ids.len())
                .filter(|&r| map.get(&ids[r]).is_none_or(|e| e.seq < seq))
                .collect()
        };
        if rows.is_empty() {
            return Ok(());
        }
        let slots = self.allocate(rows.len())?;
        let store = self.store.read();
        let done = AtomicUsize::new(0);
        let dim = self.dim;
        let work = |scratch: &mut Scratch, i: usize| {
            let r = rows[i];
            let mut v = std::mem::take(&mut scratch.query);
            copy_normalized(self.metric, &vectors[r * dim..(r + 1) * dim], &mut v);
            let level = self.random_level();
            self.insert_node(&store, slots[i], ids[r], seq, &v, level, scratch);
            self.publish(&store, slots[i], ids[r], seq);
            scratch.query = v;
            if let Some(p) = progress {
                let n = done.fetch_add(1, Ordering::Relaxed) + 1;
                if n.is_multiple_of(1024) || n == rows.len() {
                    p(n);
                }
            }
        };
        if rows.len() < 64 || self.threads() == 1 {
            let mut scratch = self.scratch.get();
            (0..rows.len()).for_each(|i| work(&mut scratch, i));
        } else {
            self.install(|| {
                (0..rows.len())
                    .into_par_iter()
                    .for_each_init(|| self.scratch.get(), |scratch, i| work(scratch, i))
            });
        }
        Ok(())
    }

    /// Links one node into the graph, top layer first.
    #[allow(clippy::too_many_arguments)]
    fn insert_node(
        &self,
        store: &Store,
        slot: u32,
        label: u64,
        seq: Seq,
        v: &[f32],
        level: usize,
        scratch: &mut Scratch,
    ) {
        // SAFETY: `slot` came from `allocate`: never linked, or reclaimed by a
        // consolidation that removed every edge to it and waited for all
        // searches (exclusive store lock) before freeing it. No other thread
        // knows its id until we link it below.
        unsafe { store.init_slot(slot, label, seq, v, level) };
        let mut word = self.entry.load(Ordering::Acquire);
        let _top_guard = if unpack_entry(word).is_none_or(|(_, top)| level > top) {
            let g = self.entry_lock.lock();
            word = self.entry.load(Ordering::Acquire);
            Some(g)
        } else {
            None
        };
        let Some(entry) = unpack_entry(word) else {
            self.entry.store(pack_entry(slot, level), Ordering::Release);
            return;
        };
        // Phase 1: every own list is set before anyone can reach the node, so
        // a search entering it at any layer finds its edges there (an empty
        // list at an entry point would strand that search).
        let mut lists = std::mem::take(&mut scratch.lists);
        plan_links(
            store,
            self.dist,
            v,
            slot,
            level,
            entry,
            self.params.ef_construction,
            self.params.m,
            scratch,
            &mut lists,
        );
        for (l, selected) in lists.iter_mut().enumerate() {
            let Scratch {
                neighbors, sorted, ..
            } = scratch;
            self.set_own_list(store, slot, l, selected, neighbors, sorted);
        }
        // Phase 2: the back-edges that make the node reachable.
        for (l, selected) in lists.iter().enumerate() {
            for &n in selected {
                let Scratch {
                    sorted,
                    neighbors,
                    fresh,
                    ..
                } = scratch;
                let _g = store.lock(n);
                match backlink(store, self.dist, n, slot, l, neighbors, sorted, fresh) {
                    Backlink::Present => {}
                    Backlink::Append => {
                        store.push_neighbor(n, l, slot);
                    }
                    Backlink::Replace => store.set_list(n, l, fresh),
                }
            }
        }
        scratch.lists = lists;
        if level > entry.1 {
            self.entry.store(pack_entry(slot, level), Ordering::Release);
        }
    }

    /// Sets the new node's list at layer `l`, merging with edges other
    /// inserters may already have added to it (they can reach the node
    /// through a higher layer before this one is set).
    fn set_own_list(
        &self,
        store: &Store,
        slot: u32,
        l: usize,
        selected: &mut Vec<u32>,
        buf: &mut Vec<u32>,
        ranked: &mut Vec<Candidate>,
    ) {
        let _g = store.lock(slot);
        store.neighbors_into(slot, l, buf);
        if buf.is_empty() {
            store.set_list(slot, l, selected);
            return;
        }
        buf.extend_from_slice(selected);
        buf.sort_unstable();
        buf.dedup();
        buf.retain(|&x| x != slot);
        rank_from(store, self.dist, slot, buf, ranked);
        select_heuristic(store, self.dist, ranked, store.cap(l), selected);
        store.set_list(slot, l, selected);
    }

    /// Makes a linked node visible under its id (replacing an older version).
    fn publish(&self, store: &Store, slot: u32, label: u64, seq: Seq) {
        let mut map = self.ids.lock();
        match map.get(&label).copied() {
            Some(e) if e.seq > seq => {
                drop(map);
                retire(store, &self.pending, slot);
            }
            Some(e) => {
                map.insert(label, IdEntry { slot, seq });
                retire(store, &self.pending, e.slot);
                store.set_state(slot, LIVE);
            }
            None => {
                map.insert(label, IdEntry { slot, seq });
                store.set_state(slot, LIVE);
            }
        }
    }
}
