//! Shared helpers of the integration tests: clustered data and a brute-force oracle.
#![allow(dead_code)]

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use vectide_core::Metric;

/// `n` points in `dim` dimensions around `clusters` Gaussian-ish centres.
pub fn clustered(n: usize, dim: usize, clusters: usize, seed: u64) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    let centres: Vec<f32> = (0..clusters * dim)
        .map(|_| rng.gen_range(-1.0..1.0))
        .collect();
    let mut out = Vec::with_capacity(n * dim);
    for _ in 0..n {
        let c = rng.gen_range(0..clusters);
        for d in 0..dim {
            let noise: f32 = (0..3).map(|_| rng.gen_range(-0.15f32..0.15)).sum();
            out.push(centres[c * dim + d] + noise);
        }
    }
    out
}

fn normalized(v: &[f32]) -> Vec<f32> {
    let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    v.iter().map(|x| x / n).collect()
}

/// Exact distance in the engine's convention.
pub fn exact_distance(metric: Metric, a: &[f32], b: &[f32]) -> f32 {
    match metric {
        Metric::L2 => a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum(),
        Metric::Ip => -a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>(),
        Metric::Cosine => {
            let (a, b) = (normalized(a), normalized(b));
            1.0 - a.iter().zip(&b).map(|(x, y)| x * y).sum::<f32>()
        }
    }
}

/// Exact top-k ids among `(id, vector)` pairs.
pub fn brute_force(metric: Metric, points: &[(u64, Vec<f32>)], q: &[f32], k: usize) -> Vec<u64> {
    let mut d: Vec<(f32, u64)> = points
        .iter()
        .map(|(id, v)| (exact_distance(metric, q, v), *id))
        .collect();
    d.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    d.into_iter().take(k).map(|x| x.1).collect()
}

/// Mean recall of `found` against `truth` (both per query).
pub fn recall(found: &[Vec<u64>], truth: &[Vec<u64>]) -> f64 {
    let mut hit = 0usize;
    let mut total = 0usize;
    for (f, t) in found.iter().zip(truth) {
        total += t.len();
        hit += f.iter().filter(|x| t.contains(x)).count();
    }
    hit as f64 / total.max(1) as f64
}
