//! k-means under squared Euclidean distance.
//!
//! Training is deterministic for a given seed and thread count-independent:
//! the random choices (the training sample, k-means++ seeds, mini-batches,
//! the re-seeding of empty clusters) come from one seeded generator on the
//! calling thread, and the parallel parts (assignment, sums) combine their
//! results in a fixed order.
//!
//! - **Seeding**: k-means++ (Arthur & Vassilvitskii, 2007) on the training
//!   sample: each next centre is drawn with probability proportional to the
//!   squared distance to the nearest centre chosen so far.
//! - **Lloyd**: assign every point to its nearest centre, move each centre to
//!   the mean of its points; stop after `max_iters` or when fewer than
//!   `tolerance` of the points change cluster. An emptied cluster is
//!   re-seeded by splitting the largest one (its centre, nudged both ways).
//! - **Mini-batch** (Sculley, "Web-scale k-means clustering", WWW 2010):
//!   for training sets above `minibatch_above` points, each step draws
//!   `batch_size` points, assigns them, and moves each centre towards its
//!   batch points with a per-centre rate `1 / (points it has absorbed)`.
//!
//! Large inputs are first subsampled to `max_points_per_centroid × k`
//! points (as FAISS does, with the same default of 256): more points move
//! the centres little and cost linearly.

use crate::check_rows;
use rand::rngs::StdRng;
use rand::seq::index::sample;
use rand::{Rng, SeedableRng};
use rayon::prelude::*;
use vectide_core::distance::l2_sq_fn;
use vectide_core::metric::DistanceFn;
use vectide_core::{Error, Result};

/// Parameters of [`train`].
#[derive(Clone, Debug)]
pub struct KMeansParams {
    /// Number of clusters.
    pub k: usize,
    /// Lloyd iterations at most (mini-batch: steps).
    pub max_iters: usize,
    /// Stop Lloyd when at most this fraction of points changed cluster.
    pub tolerance: f64,
    /// Seed of every random choice.
    pub seed: u64,
    /// Training uses at most this many points per centre (a seeded sample).
    pub max_points_per_centroid: usize,
    /// Above this many training points, mini-batch k-means replaces Lloyd.
    pub minibatch_above: usize,
    /// Points per mini-batch step.
    pub batch_size: usize,
}

impl KMeansParams {
    /// Defaults for `k` clusters: 25 iterations, tolerance 0.1 %, seed 0,
    /// 256 points per centre, mini-batch above 1M points with batches of
    /// 10,000 (and 100 steps).
    pub fn new(k: usize) -> Self {
        KMeansParams {
            k,
            max_iters: 25,
            tolerance: 0.001,
            seed: 0,
            max_points_per_centroid: 256,
            minibatch_above: 1_000_000,
            batch_size: 10_000,
        }
    }

    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    pub fn max_iters(mut self, iters: usize) -> Self {
        self.max_iters = iters;
        self
    }

    fn check(&self) -> Result<()> {
        if self.k == 0 {
            return Err(Error::invalid("k-means: k must be at least 1"));
        }
        if self.max_iters == 0 || self.batch_size == 0 || self.max_points_per_centroid == 0 {
            return Err(Error::invalid(
                "k-means: max_iters, batch_size and max_points_per_centroid must be at least 1",
            ));
        }
        if !(0.0..=1.0).contains(&self.tolerance) {
            return Err(Error::invalid("k-means: tolerance must be in [0, 1]"));
        }
        Ok(())
    }
}

/// `k` centres of dimension `dim`, row-major.
#[derive(Clone, Debug, PartialEq)]
pub struct Centroids {
    dim: usize,
    data: Vec<f32>,
}

impl Centroids {
    /// Centres from `k × dim` floats (k ≥ 1, all finite).
    pub fn new(dim: usize, data: Vec<f32>) -> Result<Self> {
        check_rows(&data, dim, 1, "centroids")?;
        Ok(Centroids { dim, data })
    }

    pub fn k(&self) -> usize {
        self.data.len() / self.dim
    }

    pub fn dim(&self) -> usize {
        self.dim
    }

    pub fn centroid(&self, i: usize) -> &[f32] {
        &self.data[i * self.dim..(i + 1) * self.dim]
    }

    pub fn as_slice(&self) -> &[f32] {
        &self.data
    }

    /// The nearest centre of `x` and its squared distance (the first of
    /// equals). `x` must have `dim` floats.
    pub fn nearest(&self, x: &[f32]) -> (u32, f32) {
        nearest_with(l2_sq_fn(), &self.data, self.dim, x)
    }

    /// The `n` nearest centres of `x`, closest first, into `out` (cleared).
    pub fn nearest_n(&self, x: &[f32], n: usize, out: &mut Vec<(u32, f32)>) {
        let dist = l2_sq_fn();
        out.clear();
        out.extend(
            self.data
                .chunks_exact(self.dim)
                .enumerate()
                .map(|(i, c)| (i as u32, dist(x, c))),
        );
        let n = n.min(out.len());
        if n < out.len() {
            out.select_nth_unstable_by(n, |a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
            out.truncate(n);
        }
        out.sort_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
    }

    /// The nearest centre of every row of `data` (`n × dim`), in parallel.
    pub fn assign(&self, data: &[f32]) -> Result<Vec<u32>> {
        check_rows(data, self.dim, 0, "k-means assign")?;
        Ok(assign_rows(l2_sq_fn(), &self.data, self.dim, data)
            .into_iter()
            .map(|(c, _)| c)
            .collect())
    }
}

pub(crate) fn nearest_with(dist: DistanceFn, centres: &[f32], dim: usize, x: &[f32]) -> (u32, f32) {
    // PQ subspaces have 1 to a few dimensions: there an inlined loop beats
    // an indirect call per centre several times over.
    if dim <= 8 {
        return nearest_small(centres, dim, x);
    }
    let mut best = (0u32, f32::INFINITY);
    for (i, c) in centres.chunks_exact(dim).enumerate() {
        let d = dist(x, c);
        if d < best.1 {
            best = (i as u32, d);
        }
    }
    best
}

fn nearest_small(centres: &[f32], dim: usize, x: &[f32]) -> (u32, f32) {
    let mut best = (0u32, f32::INFINITY);
    for (i, c) in centres.chunks_exact(dim).enumerate() {
        let d: f32 = x.iter().zip(c).map(|(a, b)| (a - b) * (a - b)).sum();
        if d < best.1 {
            best = (i as u32, d);
        }
    }
    best
}

pub(crate) fn assign_rows(
    dist: DistanceFn,
    centres: &[f32],
    dim: usize,
    data: &[f32],
) -> Vec<(u32, f32)> {
    if dim <= 8 {
        // Small dimensions (PQ subspaces): the centres transposed once, so
        // that one row is compared with every centre by loops the compiler
        // vectorises; the sums run in the same order as `nearest_small`'s,
        // so the assignment is the same.
        let k = centres.len() / dim.max(1);
        let mut ct = vec![0f32; centres.len()];
        for (i, c) in centres.chunks_exact(dim).enumerate() {
            for (j, &v) in c.iter().enumerate() {
                ct[j * k + i] = v;
            }
        }
        return data
            .par_chunks_exact(dim)
            .with_min_len(256)
            .map_init(
                || vec![0f32; k],
                |buf, x| nearest_transposed(&ct, k, x, buf),
            )
            .collect();
    }
    data.par_chunks_exact(dim)
        .with_min_len(256)
        .map(|x| nearest_with(dist, centres, dim, x))
        .collect()
}

/// The nearest of `k` centres stored dimension-major (`ct[j * k + i]`),
/// by squared L2; ties go to the lower index.
fn nearest_transposed(ct: &[f32], k: usize, x: &[f32], buf: &mut [f32]) -> (u32, f32) {
    buf.fill(0.0);
    for (j, &xj) in x.iter().enumerate() {
        for (b, &c) in buf.iter_mut().zip(&ct[j * k..(j + 1) * k]) {
            let t = xj - c;
            *b += t * t;
        }
    }
    // Eight running minima (a select the compiler turns into vector min),
    // then the first position holding the least.
    let mut lanes = [f32::INFINITY; 8];
    let mut chunks = buf.chunks_exact(8);
    for ch in &mut chunks {
        for (m, &d) in lanes.iter_mut().zip(ch) {
            *m = if d < *m { d } else { *m };
        }
    }
    let mut min = lanes
        .iter()
        .copied()
        .fold(f32::INFINITY, |a, b| if b < a { b } else { a });
    for &d in chunks.remainder() {
        min = if d < min { d } else { min };
    }
    match buf.iter().position(|&d| d == min) {
        Some(i) => (i as u32, min),
        None => (0, f32::INFINITY),
    }
}

/// Trains `params.k` centres on `data` (`n × dim`, n ≥ k).
pub fn train(data: &[f32], dim: usize, params: &KMeansParams) -> Result<Centroids> {
    params.check()?;
    let n = check_rows(data, dim, params.k, "k-means")?;
    let mut rng = StdRng::seed_from_u64(params.seed);
    let cap = params.k.saturating_mul(params.max_points_per_centroid);
    let sampled;
    let train: &[f32] = if n > cap {
        let mut pick = sample(&mut rng, n, cap).into_vec();
        pick.sort_unstable();
        sampled = gather(data, dim, &pick);
        &sampled
    } else {
        data
    };
    let dist = l2_sq_fn();
    let mut centres = plus_plus(dist, train, dim, params.k, &mut rng);
    if train.len() / dim > params.minibatch_above {
        minibatch(dist, train, dim, &mut centres, params, &mut rng);
    } else {
        lloyd(dist, train, dim, &mut centres, params, &mut rng);
    }
    Ok(Centroids { dim, data: centres })
}

pub(crate) fn gather(data: &[f32], dim: usize, rows: &[usize]) -> Vec<f32> {
    let mut out = Vec::with_capacity(rows.len() * dim);
    for &r in rows {
        out.extend_from_slice(&data[r * dim..(r + 1) * dim]);
    }
    out
}

/// k-means++ seeding. Duplicated points are fine: once every remaining
/// point sits on a centre (all weights 0), the next centres are drawn
/// uniformly.
fn plus_plus(dist: DistanceFn, data: &[f32], dim: usize, k: usize, rng: &mut StdRng) -> Vec<f32> {
    let n = data.len() / dim;
    let mut centres = Vec::with_capacity(k * dim);
    let first = rng.gen_range(0..n);
    centres.extend_from_slice(&data[first * dim..(first + 1) * dim]);
    let mut best: Vec<f32> = data
        .par_chunks_exact(dim)
        .with_min_len(1024)
        .map(|x| dist(x, &centres[..dim]))
        .collect();
    for _ in 1..k {
        let total: f64 = best.iter().map(|&d| d as f64).sum();
        let pick = if total > 0.0 {
            let mut r = rng.gen::<f64>() * total;
            let mut pick = n - 1;
            for (i, &d) in best.iter().enumerate() {
                r -= d as f64;
                if r < 0.0 {
                    pick = i;
                    break;
                }
            }
            pick
        } else {
            rng.gen_range(0..n)
        };
        let c = data[pick * dim..(pick + 1) * dim].to_vec();
        best.par_iter_mut()
            .zip(data.par_chunks_exact(dim))
            .with_min_len(1024)
            .for_each(|(b, x)| *b = b.min(dist(x, &c)));
        centres.extend_from_slice(&c);
    }
    centres
}

/// Lloyd's iterations; empty clusters re-seeded from the largest one.
fn lloyd(
    dist: DistanceFn,
    data: &[f32],
    dim: usize,
    centres: &mut [f32],
    p: &KMeansParams,
    rng: &mut StdRng,
) {
    let n = data.len() / dim;
    let k = centres.len() / dim;
    let mut labels = vec![u32::MAX; n];
    for _ in 0..p.max_iters {
        let assigned = assign_rows(dist, centres, dim, data);
        let changed = labels
            .iter_mut()
            .zip(&assigned)
            .filter(|(l, a)| **l != a.0)
            .map(|(l, a)| *l = a.0)
            .count();
        let reseeded = update_means(data, dim, &labels, centres, k, rng);
        // A split cluster's two centres have no points of their own yet:
        // never stop on the iteration that made them.
        if !reseeded && (changed as f64) <= p.tolerance * n as f64 {
            break;
        }
    }
}

/// Moves each centre to the mean of its points (sums in f64, in a fixed
/// order); an empty cluster takes half of the largest one: both get its
/// centre, nudged apart. Returns whether a cluster was re-seeded.
pub(crate) fn update_means(
    data: &[f32],
    dim: usize,
    labels: &[u32],
    centres: &mut [f32],
    k: usize,
    rng: &mut StdRng,
) -> bool {
    let mut reseeded = false;
    let mut sums = vec![0f64; k * dim];
    let mut counts = vec![0usize; k];
    for (x, &l) in data.chunks_exact(dim).zip(labels) {
        let l = l as usize;
        counts[l] += 1;
        for (s, &v) in sums[l * dim..(l + 1) * dim].iter_mut().zip(x) {
            *s += v as f64;
        }
    }
    for c in 0..k {
        if counts[c] > 0 {
            for (dst, s) in centres[c * dim..(c + 1) * dim]
                .iter_mut()
                .zip(&sums[c * dim..(c + 1) * dim])
            {
                *dst = (*s / counts[c] as f64) as f32;
            }
        }
    }
    for c in 0..k {
        if counts[c] > 0 {
            continue;
        }
        let big = (0..k)
            .max_by_key(|&i| (counts[i], std::cmp::Reverse(i)))
            .unwrap_or(0);
        if counts[big] < 2 {
            break; // nothing left to split
        }
        for j in 0..dim {
            let v = centres[big * dim + j];
            let eps = (v.abs().max(1e-3)) * 1e-3 * if rng.gen::<bool>() { 1.0 } else { -1.0 };
            centres[c * dim + j] = v + eps;
            centres[big * dim + j] = v - eps;
        }
        counts[c] = counts[big] / 2;
        counts[big] -= counts[c];
        reseeded = true;
    }
    reseeded
}

/// Sculley's mini-batch k-means.
fn minibatch(
    dist: DistanceFn,
    data: &[f32],
    dim: usize,
    centres: &mut [f32],
    p: &KMeansParams,
    rng: &mut StdRng,
) {
    let n = data.len() / dim;
    let k = centres.len() / dim;
    let b = p.batch_size.min(n);
    let mut absorbed = vec![0u64; k];
    let mut steps = p.max_iters.max(100);
    while steps > 0 {
        steps -= 1;
        let mut pick = sample(rng, n, b).into_vec();
        pick.sort_unstable();
        let batch = gather(data, dim, &pick);
        let assigned = assign_rows(dist, centres, dim, &batch);
        for (x, &(c, _)) in batch.chunks_exact(dim).zip(&assigned) {
            let c = c as usize;
            absorbed[c] += 1;
            let eta = 1.0 / absorbed[c] as f32;
            for (dst, &v) in centres[c * dim..(c + 1) * dim].iter_mut().zip(x) {
                *dst += eta * (v - *dst);
            }
        }
    }
}

/// Mean squared distance of each row to its nearest centre (the k-means
/// objective divided by n), for tests and reports.
pub fn inertia(centres: &Centroids, data: &[f32]) -> Result<f64> {
    let n = check_rows(data, centres.dim, 1, "k-means inertia")?;
    let d = assign_rows(l2_sq_fn(), &centres.data, centres.dim, data);
    Ok(d.iter().map(|&(_, d)| d as f64).sum::<f64>() / n as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transposed_assignment_matches_the_plain_scan() {
        let mut r = 7u64;
        let mut next = || {
            r = r
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((r >> 40) as f32 / (1u64 << 24) as f32) - 0.5
        };
        for dim in [1usize, 2, 3, 8] {
            let centres: Vec<f32> = (0..256 * dim).map(|_| next()).collect();
            let data: Vec<f32> = (0..3000 * dim).map(|_| next()).collect();
            let fast = assign_rows(l2_sq_fn(), &centres, dim, &data);
            for (x, got) in data.chunks_exact(dim).zip(&fast) {
                assert_eq!(*got, nearest_small(&centres, dim, x), "dim {dim}");
            }
        }
    }

    fn blobs(k: usize, per: usize, dim: usize, seed: u64) -> (Vec<f32>, Vec<u32>) {
        let mut rng = StdRng::seed_from_u64(seed);
        let centres: Vec<f32> = (0..k * dim).map(|_| rng.gen_range(-50.0..50.0)).collect();
        let mut data = Vec::new();
        let mut truth = Vec::new();
        for c in 0..k {
            for _ in 0..per {
                data.extend((0..dim).map(|j| centres[c * dim + j] + rng.gen_range(-1.0..1.0)));
                truth.push(c as u32);
            }
        }
        (data, truth)
    }

    #[test]
    fn finds_separated_blobs_and_is_deterministic() {
        let (data, truth) = blobs(8, 100, 4, 1);
        let p = KMeansParams::new(8).seed(3);
        let c = train(&data, 4, &p).unwrap();
        let labels = c.assign(&data).unwrap();
        // Each blob maps to one cluster and each cluster to one blob.
        let pairs: std::collections::BTreeSet<_> = truth.iter().zip(&labels).collect();
        assert_eq!(pairs.len(), 8);
        assert_eq!(train(&data, 4, &p).unwrap(), c, "same seed, same centres");
        // Lloyd's fixed point: each centre is the mean of its points.
        for cl in 0..8u32 {
            let rows: Vec<&[f32]> = data
                .chunks(4)
                .zip(&labels)
                .filter(|(_, &l)| l == cl)
                .map(|(x, _)| x)
                .collect();
            for j in 0..4 {
                let mean = rows.iter().map(|r| r[j] as f64).sum::<f64>() / rows.len() as f64;
                assert!((mean as f32 - c.centroid(cl as usize)[j]).abs() < 1e-3);
            }
        }
    }

    #[test]
    fn assignment_is_the_brute_force_nearest_centre() {
        let (data, _) = blobs(5, 40, 7, 2);
        let c = train(&data, 7, &KMeansParams::new(13)).unwrap();
        for x in data.chunks(7) {
            let brute = (0..c.k())
                .map(|i| {
                    let d: f32 = x
                        .iter()
                        .zip(c.centroid(i))
                        .map(|(a, b)| (a - b) * (a - b))
                        .sum();
                    (i as u32, d)
                })
                .min_by(|a, b| a.1.total_cmp(&b.1))
                .unwrap();
            let (got, d) = c.nearest(x);
            assert!(got == brute.0 || (d - brute.1).abs() <= 1e-4 * brute.1.max(1.0));
        }
        let mut out = Vec::new();
        c.nearest_n(&data[..7], 4, &mut out);
        assert_eq!(out.len(), 4);
        assert!(out.windows(2).all(|w| w[0].1 <= w[1].1));
        assert_eq!(out[0].0, c.nearest(&data[..7]).0);
    }

    #[test]
    fn duplicates_and_k_equal_n_leave_no_centre_unset() {
        let data = vec![1.0f32; 6 * 3];
        let c = train(&data, 3, &KMeansParams::new(6)).unwrap();
        assert_eq!(c.k(), 6);
        assert!(c.as_slice().iter().all(|v| v.is_finite()));
        let (data, _) = blobs(3, 4, 2, 5);
        let c = train(&data, 2, &KMeansParams::new(12)).unwrap();
        assert!(
            inertia(&c, &data).unwrap() < 1e-3,
            "k = n puts a centre on every point"
        );
    }

    #[test]
    fn minibatch_and_sampling_approach_lloyd() {
        let (data, _) = blobs(6, 500, 5, 7);
        let lloyd = train(&data, 5, &KMeansParams::new(6)).unwrap();
        let mut p = KMeansParams::new(6);
        p.minibatch_above = 100;
        p.batch_size = 256;
        p.max_points_per_centroid = 300; // 1,800 of the 3,000 points
        let mb = train(&data, 5, &p).unwrap();
        let (a, b) = (
            inertia(&lloyd, &data).unwrap(),
            inertia(&mb, &data).unwrap(),
        );
        assert!(b <= a * 1.25, "mini-batch inertia {b} vs Lloyd {a}");
    }

    #[test]
    fn bad_input_is_an_error() {
        let p = KMeansParams::new(3);
        assert!(train(&[1.0; 5], 2, &p).is_err(), "ragged rows");
        assert!(train(&[1.0; 4], 2, &p).is_err(), "fewer rows than k");
        assert!(
            train(&[1.0, f32::NAN, 0.0, 0.0, 1.0, 1.0], 2, &p).is_err(),
            "NaN"
        );
        assert!(train(&[1.0; 6], 0, &p).is_err(), "dim 0");
        assert!(train(&[1.0; 6], 2, &KMeansParams::new(0)).is_err(), "k 0");
        assert!(Centroids::new(2, vec![]).is_err());
        let c = Centroids::new(2, vec![0.0, 0.0]).unwrap();
        assert!(c.assign(&[1.0; 3]).is_err());
    }
}
