//! Exact search: one query by a scan, many queries by a tiled matrix product.
//!
//! ## One query
//! [`search_one`] computes the distance of the query to every live row with
//! the metric's SIMD kernel ([`Metric::distance_fn`]) and keeps the `k`
//! closest in a bounded heap ([`TopK`]). The filter is asked only about an
//! id whose distance would enter the heap.
//!
//! ## A batch
//! [`search_batch`] cuts the queries into tiles of [`Tiles::queries`] rows
//! (one rayon task each) and, inside a tile, walks the matrix in tiles of
//! [`Tiles::vectors`] rows. Each pair of tiles is one matrix product
//! (`matrixmultiply::sgemm`) of the *augmented* queries, `[-2q, 1]` under
//! L2 and `[-q, 1]` under ip and cosine, with the augmented rows `[x, a]`
//! (`a = ‖x‖²` under L2, `0` otherwise; see `layout.rs`). Its entries are
//! *keys*: the distance less a constant of the query,
//!
//! | metric | key | distance |
//! |---|---|---|
//! | l2 | `‖x‖² − 2x·q` | `key + ‖q‖²` |
//! | ip | `−x·q` | `key` |
//! | cosine | `−x·q` (both normalised) | `key + 1` |
//!
//! so the keys rank the rows exactly as the distances do. Each query row of
//! the key tile (`queries × vectors` floats) is compared with the query's
//! heap threshold in blocks of 32 keys (vector compares), and only the keys
//! of the rare blocks with a key below it reach the filter and the heap. Last, the `k`
//! survivors of each query are re-ranked with the exact kernel, so a batch
//! answers with the same distances as single searches (the expanded L2
//! form loses bits to cancellation; it only selects). A batch of fewer
//! than [`MIN_GEMM_QUERIES`] queries, or one where a row or query has a
//! squared norm beyond [`MAX_GEMM_NORM_SQ`] (where keys could overflow),
//! is answered by one scan per query instead.
//!
//! Nothing is allocated per query but its result vector: keys, augmented
//! queries and heaps are scratch of the rayon task, reused tile after tile.
//! (The GEMM crate allocates its packing buffer once per product.)

use crate::layout::{Store, FREE};
use rayon::prelude::*;
use vectide_core::heap::{Candidate, Dist};
use vectide_core::metric::DistanceFn;
use vectide_core::validate::normalize;
use vectide_core::{Filter, Metric, Neighbor, TopK};

/// Tile sizes of a batched search.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tiles {
    /// Queries per tile (one rayon task; its heaps and augmented queries).
    pub queries: usize,
    /// Rows of the matrix per product: the key tile is `queries × vectors`.
    pub vectors: usize,
}

/// The tiles batched searches use: 1024 queries per tile stream the matrix
/// from memory once per 1024 queries and repack a 256-row tile of it once
/// per 1024 queries. The 1 MiB key tile is written and read back in order,
/// so it may live in L3. Measured on 390K × 10K 50-d vectors (AVX2 EPYC,
/// 512 KiB L2) in interleaved rounds against 256 × 256 and 512 × 256: 3–5 %
/// faster than 256 × 256 on one and two threads.
pub(crate) const TILES: Tiles = Tiles {
    queries: 1024,
    vectors: 256,
};

/// Largest squared norm of a row or query for which a batch is answered by
/// matrix products. Below it every key and every partial sum of a product
/// is below `3·10³⁰`, far from `f32::MAX` (`3.4·10³⁸`), so no key
/// overflows to ±inf or NaN (which a heap threshold could not order).
/// Beyond it (components of 10¹⁵ and more, which no embedding has) a batch
/// falls back to one exact scan per query.
pub(crate) const MAX_GEMM_NORM_SQ: f32 = 1e30;

/// Batches smaller than this are answered by one scan per query (a product
/// with a few query rows wastes most of the GEMM kernel's 8-row panel).
pub(crate) const MIN_GEMM_QUERIES: usize = 4;

/// Keys compared at once with a heap threshold.
const SCAN: usize = 32;

/// Per-thread scratch of single searches.
#[derive(Debug, Default)]
pub(crate) struct Scratch {
    pub heap: TopK,
    pub sorted: Vec<Candidate>,
    /// The query, normalised under cosine.
    pub query: Vec<f32>,
}

/// The `k` nearest live rows of a prepared query (normalised under
/// cosine), closest first, into `out` (cleared first).
pub(crate) fn search_one(
    store: &Store,
    dist: DistanceFn,
    q: &[f32],
    k: usize,
    filter: Option<Filter<'_>>,
    scratch: &mut Scratch,
    out: &mut Vec<Neighbor>,
) {
    let heap = &mut scratch.heap;
    heap.reset(k);
    let dim = store.dim();
    let rows = store.matrix().chunks_exact(store.stride());
    for (slot, (row, &id)) in rows.zip(store.ids()).enumerate() {
        if id == FREE {
            continue;
        }
        let d = dist(q, &row[..dim]);
        if (!heap.is_full() || d < heap.threshold()) && filter.is_none_or(|f| f(id)) {
            heap.push(d, slot as u32);
        }
    }
    heap.drain_sorted_into(&mut scratch.sorted);
    emit(store, &scratch.sorted, out);
}

/// Results of sorted candidates, as (id, distance), into `out` (sized by
/// the results, never by `k`).
fn emit(store: &Store, sorted: &[Candidate], out: &mut Vec<Neighbor>) {
    out.clear();
    out.reserve_exact(sorted.len());
    out.extend(
        sorted
            .iter()
            .map(|c| Neighbor::new(store.id(c.node), c.dist.0)),
    );
}

/// The `k` nearest live rows of every row-major query (already checked),
/// on the current rayon pool. `out[i]` answers query `i`.
pub(crate) fn search_batch(
    store: &Store,
    metric: Metric,
    dist: DistanceFn,
    queries: &[f32],
    k: usize,
    filter: Option<Filter<'_>>,
    tiles: Tiles,
) -> Vec<Vec<Neighbor>> {
    let dim = store.dim();
    let nq = queries.len() / dim;
    let mut out = vec![Vec::new(); nq];
    if nq == 0 || store.live() == 0 {
        return out;
    }
    let wide = |v: &[f32]| vectide_core::distance::norm_sq(v) > MAX_GEMM_NORM_SQ;
    if nq < MIN_GEMM_QUERIES
        || store.max_norm_sq() > MAX_GEMM_NORM_SQ
        || queries.chunks_exact(dim).any(wide)
    {
        out.par_iter_mut()
            .zip(queries.par_chunks_exact(dim))
            .for_each_init(Scratch::default, |s, (o, q)| {
                let mut qbuf = std::mem::take(&mut s.query);
                vectide_core::validate::copy_normalized(metric, q, &mut qbuf);
                search_one(store, dist, &qbuf, k, filter, s, o);
                s.query = qbuf;
            });
        return out;
    }
    // Smaller query tiles when the batch would not give every thread one.
    let per_thread = nq.div_ceil(rayon::current_num_threads().max(1));
    let tiles = Tiles {
        queries: tiles.queries.min(per_thread.next_multiple_of(8)),
        ..tiles
    };
    let job = Job {
        store,
        metric,
        dist,
        k,
        tiles,
    };
    match filter {
        None if store.free_slots() == 0 => job.run(queries, &mut out, |_| true),
        None => {
            let ids = store.ids();
            job.run(queries, &mut out, |s| ids[s as usize] != FREE)
        }
        Some(f) => {
            let mask = admitted(store, f);
            job.run(queries, &mut out, |s| {
                mask[s as usize / 64] >> (s % 64) & 1 != 0
            })
        }
    }
    out
}

/// One bit per slot: live and accepted by the filter (asked once per id,
/// in parallel, for the whole batch).
fn admitted(store: &Store, filter: Filter<'_>) -> Vec<u64> {
    let ids = store.ids();
    let mut mask = vec![0u64; ids.len().div_ceil(64)];
    mask.par_iter_mut()
        .zip(ids.par_chunks(64))
        .for_each(|(word, chunk)| {
            for (b, &id) in chunk.iter().enumerate() {
                if id != FREE && filter(id) {
                    *word |= 1 << b;
                }
            }
        });
    mask
}

/// What every tile of a batch shares.
struct Job<'a> {
    store: &'a Store,
    metric: Metric,
    dist: DistanceFn,
    k: usize,
    tiles: Tiles,
}

/// Scratch of one rayon task of a batch, reused from tile to tile.
#[derive(Default)]
struct TileScratch {
    /// The tile's queries, normalised under cosine (`m × dim`).
    prepared: Vec<f32>,
    /// The augmented queries (`m × (dim + 1)`).
    augmented: Vec<f32>,
    /// One key tile (`m × tiles.vectors`).
    keys: Vec<f32>,
    heaps: Vec<TopK>,
    sorted: Vec<Candidate>,
}

impl Job<'_> {
    fn run<A: Fn(u32) -> bool + Sync>(&self, queries: &[f32], out: &mut [Vec<Neighbor>], admit: A) {
        let qb = self.tiles.queries;
        let dim = self.store.dim();
        out.par_chunks_mut(qb)
            .zip(queries.par_chunks(qb * dim))
            .for_each_init(TileScratch::default, |s, (o, q)| self.tile(q, o, &admit, s));
    }

    /// Answers one tile of queries (`out.len()` of them).
    fn tile<A: Fn(u32) -> bool>(
        &self,
        queries: &[f32],
        out: &mut [Vec<Neighbor>],
        admit: &A,
        s: &mut TileScratch,
    ) {
        let store = self.store;
        let (dim, stride, slots) = (store.dim(), store.stride(), store.slots());
        let kd = dim + 1;
        let m = out.len();
        let xb = self.tiles.vectors;

        s.prepared.clear();
        s.prepared.extend_from_slice(queries);
        if self.metric.normalizes() {
            s.prepared.chunks_exact_mut(dim).for_each(normalize);
        }
        let scale = if self.metric == Metric::L2 {
            -2.0
        } else {
            -1.0
        };
        s.augmented.clear();
        for q in s.prepared.chunks_exact(dim) {
            s.augmented.extend(q.iter().map(|x| x * scale));
            s.augmented.push(1.0);
        }
        s.heaps.resize_with(m.max(s.heaps.len()), TopK::default);
        s.heaps.iter_mut().for_each(|h| h.reset(self.k));
        s.keys.resize(m * xb, 0.0);

        let matrix = store.matrix();
        for x0 in (0..slots).step_by(xb) {
            let n = xb.min(slots - x0);
            // SAFETY: A is `m × kd` at `augmented` (row stride kd, `m·kd`
            // floats written above). B is `kd × n` with element (p, j) at
            // `matrix[(x0 + j)·stride + p]`: p < kd ≤ stride and
            // x0 + j < slots, inside the `slots × stride` matrix. C is
            // `m × n` at `keys` with row stride xb ≥ n: its last element,
            // (m−1)·xb + n − 1, is inside the `m·xb` floats of `keys`.
            // β = 0, so C is written, not read; the slices outlive the call
            // and C overlaps neither A nor B.
            unsafe {
                matrixmultiply::sgemm(
                    m,
                    kd,
                    n,
                    1.0,
                    s.augmented.as_ptr(),
                    kd as isize,
                    1,
                    matrix.as_ptr().add(x0 * stride),
                    1,
                    stride as isize,
                    0.0,
                    s.keys.as_mut_ptr(),
                    xb as isize,
                    1,
                );
            }
            for (keys, heap) in s.keys.chunks_exact(xb).zip(&mut s.heaps[..m]) {
                select(&keys[..n], x0 as u32, heap, admit);
            }
        }

        for ((o, q), heap) in out
            .iter_mut()
            .zip(s.prepared.chunks_exact(dim))
            .zip(&mut s.heaps)
        {
            heap.drain_sorted_into(&mut s.sorted);
            for c in s.sorted.iter_mut() {
                c.dist = Dist((self.dist)(q, store.vector(c.node)));
            }
            s.sorted.sort_unstable();
            emit(store, &s.sorted, o);
        }
    }
}

/// Offers the keys of rows `base..base + keys.len()` to a query's heap.
/// Until the heap is full every admitted row enters; after that, blocks of
/// [`SCAN`] keys are compared with the heap's threshold at once (vector
/// compares) and only a block with a key below it is looked at key by
/// key. Keys are in random order, so such blocks soon become rare.
#[inline(always)]
fn select<A: Fn(u32) -> bool>(keys: &[f32], base: u32, heap: &mut TopK, admit: &A) {
    let mut i = 0;
    while i < keys.len() && !heap.is_full() {
        let slot = base + i as u32;
        if admit(slot) {
            heap.push(keys[i], slot);
        }
        i += 1;
    }
    let mut thr = heap.threshold();
    let mut offer = |from: usize, block: &[f32], thr: &mut f32| {
        for (j, &key) in block.iter().enumerate() {
            if key < *thr {
                let slot = base + (from + j) as u32;
                if admit(slot) && heap.push(key, slot) {
                    *thr = heap.threshold();
                }
            }
        }
    };
    let (blocks, tail) = keys[i..].as_chunks::<SCAN>();
    for (b, block) in blocks.iter().enumerate() {
        if any_below(block, thr) {
            offer(i + b * SCAN, block, &mut thr);
        }
    }
    offer(i + blocks.len() * SCAN, tail, &mut thr);
}

/// Whether a key of the block is below `thr` (NaN keys are not): a
/// compare and an OR per key with no early exit, which the compiler
/// vectorises.
#[inline(always)]
fn any_below(block: &[f32; SCAN], thr: f32) -> bool {
    block.iter().fold(false, |hit, &key| hit | (key < thr))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn store(metric: Metric, dim: usize, n: usize, seed: u64) -> Store {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut s = Store::new(dim, metric);
        s.reserve(n).unwrap();
        let mut row = Vec::new();
        for id in 0..n as u64 {
            let v: Vec<f32> = (0..dim).map(|_| rng.gen_range(-1.0..1.0)).collect();
            vectide_core::validate::copy_normalized(metric, &v, &mut row);
            s.put(1, id * 3, &row);
        }
        s
    }

    fn scan_all(
        store: &Store,
        metric: Metric,
        qs: &[f32],
        k: usize,
        f: Option<Filter<'_>>,
    ) -> Vec<Vec<Neighbor>> {
        let mut scratch = Scratch::default();
        qs.chunks_exact(store.dim())
            .map(|q| {
                let mut qbuf = Vec::new();
                vectide_core::validate::copy_normalized(metric, q, &mut qbuf);
                let mut out = Vec::new();
                search_one(
                    store,
                    metric.distance_fn(),
                    &qbuf,
                    k,
                    f,
                    &mut scratch,
                    &mut out,
                );
                out
            })
            .collect()
    }

    /// The tiled batch equals the scan, over odd tile sizes that leave
    /// partial tiles in both directions, with deletes and a filter.
    #[test]
    fn tiled_batches_equal_scans() {
        for metric in [Metric::L2, Metric::Ip, Metric::Cosine] {
            for dim in [1, 7, 8, 19] {
                let mut s = store(metric, dim, 150, dim as u64);
                for id in (0..150u64).step_by(7) {
                    s.remove(2, id * 3);
                }
                let mut rng = rand::rngs::StdRng::seed_from_u64(9);
                let qs: Vec<f32> = (0..23 * dim).map(|_| rng.gen_range(-1.0..1.0)).collect();
                let even = |id: u64| id.is_multiple_of(2);
                for (k, filter) in [
                    (1, None),
                    (5, None),
                    (200, None),
                    (4, Some(&even as Filter)),
                ] {
                    let want = scan_all(&s, metric, &qs, k, filter);
                    for tiles in [
                        Tiles {
                            queries: 8,
                            vectors: 20,
                        },
                        Tiles {
                            queries: 5,
                            vectors: 33,
                        },
                        TILES,
                    ] {
                        let got =
                            search_batch(&s, metric, metric.distance_fn(), &qs, k, filter, tiles);
                        for (g, w) in got.iter().zip(&want) {
                            assert_eq!(g.len(), w.len());
                            for (a, b) in g.iter().zip(w) {
                                assert!(
                                    (a.distance - b.distance).abs()
                                        <= 1e-5 * (1.0 + b.distance.abs()),
                                    "{metric} dim {dim} k {k} {tiles:?}: {a:?} vs {b:?}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn select_matches_a_plain_heap() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        let keys: Vec<f32> = (0..1000).map(|_| rng.gen_range(-5.0..5.0)).collect();
        for k in [1, 3, 50, 2000] {
            let mut a = TopK::new(k);
            select(&keys[..37], 0, &mut a, &|s| s % 3 != 0);
            select(&keys[37..], 37, &mut a, &|s| s % 3 != 0);
            let mut b = TopK::new(k);
            for (s, &key) in keys.iter().enumerate() {
                if s % 3 != 0 {
                    b.push(key, s as u32);
                }
            }
            let (mut x, mut y) = (Vec::new(), Vec::new());
            a.drain_sorted_into(&mut x);
            b.drain_sorted_into(&mut y);
            assert_eq!(x, y);
        }
    }

    /// Components near `f32::MAX` overflow the expanded L2 form; such
    /// batches are answered by exact scans, like single searches.
    #[test]
    fn huge_components_fall_back_to_exact_scans() {
        for metric in [Metric::L2, Metric::Ip] {
            let mut s = store(metric, 3, 40, 5);
            s.reserve(2).unwrap();
            s.put(1, 1000, &[1e19, 1e19, -1e19]);
            s.put(1, 1001, &[-1e19, 0.0, 1e19]);
            let qs: Vec<f32> = (0..30)
                .map(|i| (i % 5) as f32 - 2.0)
                .chain([1e19, 1e19, -1e19])
                .collect();
            let want = scan_all(&s, metric, &qs, 5, None);
            let got = search_batch(&s, metric, metric.distance_fn(), &qs, 5, None, TILES);
            let bits = |r: &[Vec<Neighbor>]| {
                r.iter()
                    .flatten()
                    .map(|n| (n.id, n.distance.to_bits()))
                    .collect::<Vec<_>>()
            };
            assert_eq!(bits(&got), bits(&want), "{metric}");
        }
    }

    #[test]
    fn empty_store_and_empty_batch() {
        let s = Store::new(4, Metric::L2);
        let got = search_batch(
            &s,
            Metric::L2,
            Metric::L2.distance_fn(),
            &[0.0; 40],
            3,
            None,
            TILES,
        );
        assert_eq!(got, vec![Vec::<Neighbor>::new(); 10]);
        let s = store(Metric::L2, 4, 10, 1);
        assert!(search_batch(
            &s,
            Metric::L2,
            Metric::L2.distance_fn(),
            &[],
            3,
            None,
            TILES
        )
        .is_empty());
    }
}
