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

/// Churns `idx` (inserts, replaces a third of the points with new vectors,
/// deletes a sixth) and checks that its exact scan exists and answers 20
/// queries with the brute force's ids and distances over the live points.
pub fn check_exact_scan_under_churn(idx: &dyn vectide_core::VectorIndex, dim: usize) {
    let metric = idx.metric();
    let n = 1_200usize;
    let data = clustered(n + n / 3, dim, 8, 41);
    let ids: Vec<u64> = (0..n as u64).collect();
    idx.insert(1, &ids, &data[..n * dim]).unwrap();
    let mut live: std::collections::BTreeMap<u64, Vec<f32>> = ids
        .iter()
        .map(|&i| (i, data[i as usize * dim..(i as usize + 1) * dim].to_vec()))
        .collect();
    let mut seq = 2;
    for i in 0..(n / 3) as u64 {
        let v = &data[(n + i as usize) * dim..(n + i as usize + 1) * dim];
        idx.insert(seq, &[i * 3], v).unwrap();
        live.insert(i * 3, v.to_vec());
        seq += 1;
    }
    let dead: Vec<u64> = (0..n as u64).filter(|i| i % 6 == 1).collect();
    idx.delete(seq, &dead).unwrap();
    for i in &dead {
        live.remove(i);
    }
    let points: Vec<(u64, Vec<f32>)> = live.into_iter().collect();
    for q in clustered(20, dim, 8, 43).chunks(dim) {
        let got = idx
            .exact_scan(q, 10)
            .unwrap()
            .expect("the engine scans its own storage");
        let want = brute_force(metric, &points, q, 10);
        let ids: Vec<u64> = got.iter().map(|n| n.id).collect();
        assert_eq!(ids, want);
        for n in &got {
            let v = &points.iter().find(|p| p.0 == n.id).unwrap().1;
            assert!((n.distance - exact_distance(metric, q, v)).abs() < 1e-4);
        }
    }
}
