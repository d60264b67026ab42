//! RaBitQ against brute force: the estimator's bias and its bound, the
//! multi-bit codes' tighter estimates, the kernels against the portable
//! one, and bad input.

use super::fastscan::{scan, scan_scalar, Block, BLOCK};
use super::*;
use rand::{Rng, SeedableRng};

/// Clustered data, as embeddings are: a few centres and noise.
fn data(n: usize, dim: usize, seed: u64) -> Vec<f32> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let centres: Vec<Vec<f32>> = (0..8)
        .map(|_| (0..dim).map(|_| rng.gen_range(-1.0..1.0)).collect())
        .collect();
    (0..n)
        .flat_map(|i| {
            let c = &centres[i % 8];
            c.iter()
                .map(|x| x + rng.gen_range(-0.6f32..0.6))
                .collect::<Vec<_>>()
        })
        .collect()
}

fn exact(metric: Metric, a: &[f32], b: &[f32]) -> f32 {
    match metric {
        Metric::L2 => a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum(),
        Metric::Ip => -a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>(),
        Metric::Cosine => 1.0 - a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>(),
    }
}

fn normalise(v: &mut [f32]) {
    let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    v.iter_mut().for_each(|x| *x /= n);
}

#[test]
fn the_estimate_is_unbiased_and_its_bound_holds() {
    for (metric, dim) in [
        (Metric::L2, 50),
        (Metric::L2, 384),
        (Metric::Ip, 128),
        (Metric::Cosine, 96),
    ] {
        let n = 600;
        let mut xs = data(n, dim, 1);
        let mut qs = data(20, dim, 2);
        if metric == Metric::Cosine {
            xs.chunks_exact_mut(dim).for_each(normalise);
            qs.chunks_exact_mut(dim).for_each(normalise);
        }
        let rq = Rabitq::train(metric, &xs, dim, RabitqParams::default()).unwrap();
        let codes: Vec<Code> = xs
            .chunks_exact(dim)
            .map(|v| rq.encode(v).unwrap())
            .collect();
        let (mut err_sum, mut scale_sum, mut total) = (0f64, 0f64, 0);
        let (mut outside, mut far_outside) = (0, 0);
        for q in qs.chunks_exact(dim) {
            let pq = rq.query(q).unwrap();
            for (v, c) in xs.chunks_exact(dim).zip(&codes) {
                let (est, bound) = rq.estimate(&pq, c);
                let d = exact(metric, v, q);
                err_sum += f64::from(est - d);
                scale_sum += f64::from(bound);
                if (est - d).abs() > bound {
                    outside += 1;
                }
                if (est - d).abs() > bound * (3.3 / EPSILON0) {
                    far_outside += 1;
                }
                total += 1;
            }
        }
        // Unbiased: the mean signed error is a small share of the bound.
        let bias = err_sum / f64::from(total) / (scale_sum / f64::from(total));
        assert!(
            bias.abs() < 0.05,
            "{metric:?} {dim}: bias {bias} of the bound"
        );
        // The error is close to a normal one whose standard deviation is
        // the bound over ε₀ (the paper's analysis): with ε₀ = 1.9 about
        // 6 % fall outside, with 3.3 about 0.1 % (the query's 4-bit
        // quantization adds a little).
        assert!(
            outside * 100 <= total * 9,
            "{metric:?} {dim}: {outside} of {total} outside"
        );
        assert!(
            far_outside * 1000 <= total * 3,
            "{metric:?} {dim}: {far_outside} of {total} past 3.3/1.9 of the bound"
        );
    }
}

#[test]
fn more_bits_estimate_closer_and_code_only_search_finds_the_neighbours() {
    let (n, dim) = (2000, 128);
    let xs = data(n, dim, 3);
    let qs = data(30, dim, 4);
    let mut errs = Vec::new();
    for bits in [1u8, 2, 4, 6] {
        let rq = Rabitq::train(Metric::L2, &xs, dim, RabitqParams { bits, seed: 7 }).unwrap();
        assert_eq!(rq.code_bytes(), 16 + if bits > 1 { 128 } else { 0 } + 20);
        let codes: Vec<Code> = xs
            .chunks_exact(dim)
            .map(|v| rq.encode(v).unwrap())
            .collect();
        let (mut err, mut recall) = (0f64, 0usize);
        for q in qs.chunks_exact(dim) {
            let pq = rq.query(q).unwrap();
            let mut truth: Vec<(f32, usize)> = xs
                .chunks_exact(dim)
                .enumerate()
                .map(|(i, v)| (exact(Metric::L2, v, q), i))
                .collect();
            let mut est: Vec<(f32, usize)> = codes
                .iter()
                .enumerate()
                .map(|(i, c)| (rq.estimate_levels(&pq, c), i))
                .collect();
            for ((e, _), (t, _)) in est.iter().zip(&truth) {
                err += f64::from((e - t).abs() / t.max(1e-6));
            }
            truth.sort_by(|a, b| a.0.total_cmp(&b.0));
            est.sort_by(|a, b| a.0.total_cmp(&b.0));
            let want: std::collections::HashSet<usize> = truth[..10].iter().map(|p| p.1).collect();
            // Recall@10 of the codes alone, re-ranking their best 200
            // (1 bit) or 50 (more).
            let rerank = if bits == 1 { 200 } else { 50 };
            recall += est[..rerank].iter().filter(|p| want.contains(&p.1)).count();
        }
        let err = err / (qs.len() / dim * n) as f64;
        let recall = recall as f64 / (qs.len() / dim * 10) as f64;
        let floor = if bits <= 2 { 0.9 } else { 0.98 };
        assert!(
            recall >= floor,
            "bits {bits}: recall {recall} (mean relative error {err})"
        );
        errs.push(err);
    }
    for w in errs.windows(2) {
        assert!(w[1] < w[0], "more bits, larger error: {errs:?}");
    }
    assert!(
        errs[3] < errs[0] / 8.0,
        "6 bits not much better than 1: {errs:?}"
    );
}

#[test]
fn the_decoded_code_points_near_the_vector() {
    let dim = 64;
    let xs = data(50, dim, 5);
    for bits in [1u8, 5] {
        let rq = Rabitq::train(Metric::L2, &xs, dim, RabitqParams { bits, seed: 1 }).unwrap();
        for v in xs.chunks_exact(dim) {
            let c = rq.encode(v).unwrap();
            let r: Vec<f32> = v.iter().zip(rq.centroid()).map(|(a, b)| a - b).collect();
            let rn = r.iter().map(|x| x * x).sum::<f32>().sqrt();
            let back = rq.decode(&c, rn);
            let cos = back
                .iter()
                .zip(rq.centroid())
                .zip(&r)
                .map(|((a, b), x)| (a - b) * x)
                .sum::<f32>()
                / (rn * rn);
            // A random rotation's sign code keeps about √(2/π) ≈ 0.8 of a
            // vector's direction; five bits nearly all of it.
            let want = if bits == 1 { 0.7 } else { 0.98 };
            assert!(cos > want, "bits {bits}: cosine {cos}");
        }
    }
}

#[test]
fn fast_scan_equals_the_popcount_and_every_kernel_agrees() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(6);
    for dim in [50, 64, 300, 1000] {
        let xs = data(45, dim, 8);
        let rq = Rabitq::train(Metric::L2, &xs, dim, RabitqParams::default()).unwrap();
        let codes: Vec<Code> = xs
            .chunks_exact(dim)
            .map(|v| rq.encode(v).unwrap())
            .collect();
        let q: Vec<f32> = (0..dim).map(|_| rng.gen_range(-2.0..2.0)).collect();
        let pq = rq.query(&q).unwrap();
        for chunk in codes.chunks(BLOCK) {
            let block = Block::pack(chunk.iter().map(|c| c.bin.as_slice()), rq.padded());
            let mut want = [0u32; BLOCK];
            scan_scalar(&pq.lut, &block.bytes, &mut want);
            for (j, c) in chunk.iter().enumerate() {
                assert_eq!(want[j], pq.bin_dot(&c.bin), "dim {dim} slot {j}");
                let mut back = vec![0u64; rq.padded() / 64];
                Block::get(&block.bytes, j, &mut back);
                assert_eq!(back, c.bin);
            }
            // Empty slots score 0.
            assert!(want[chunk.len()..].iter().all(|&x| x == 0));
            let mut got = [0u32; BLOCK];
            scan(&pq.lut, &block.bytes, &mut got);
            assert_eq!(got, want, "dispatched kernel, dim {dim}");
            #[cfg(target_arch = "x86_64")]
            {
                use super::fastscan::x86;
                if x86::avx2_ok() {
                    x86::scan_avx2(&pq.lut, &block.bytes, &mut got);
                    assert_eq!(got, want, "avx2, dim {dim}");
                }
                if x86::avx512_ok() {
                    x86::scan_avx512(&pq.lut, &block.bytes, &mut got);
                    assert_eq!(got, want, "avx512, dim {dim}");
                }
            }
        }
    }
}

#[test]
fn the_kernels_hold_the_largest_sums() {
    // Every bit set and every query level at 15: the largest sums the
    // 16-bit lanes must carry, at the largest padded dimension.
    let padded = fastscan::MAX_PADDED;
    let lut: Vec<u8> = (0..padded / 4)
        .flat_map(|_| (0..16u32).map(|p| (p.count_ones() * 15) as u8))
        .collect();
    let ones = vec![u64::MAX; padded / 64];
    let block = Block::pack(std::iter::repeat_n(ones.as_slice(), BLOCK), padded);
    let mut want = [0u32; BLOCK];
    scan_scalar(&lut, &block.bytes, &mut want);
    assert!(want.iter().all(|&x| x == 15 * padded as u32));
    let mut got = [0u32; BLOCK];
    scan(&lut, &block.bytes, &mut got);
    assert_eq!(got, want);
}

#[test]
fn bad_input_is_refused_by_name() {
    let e = Rabitq::new(Metric::L2, vec![0.0; 8], RabitqParams { bits: 9, seed: 0 }).unwrap_err();
    assert!(e.to_string().contains("bits must be 1 to 8"), "{e}");
    assert!(Rabitq::new(Metric::L2, vec![0.0; 8], RabitqParams { bits: 0, seed: 0 }).is_err());
    let e = Rabitq::new(Metric::L2, vec![0.0; 9000], RabitqParams::default()).unwrap_err();
    assert!(e.to_string().contains("dimension 9000"), "{e}");
    assert!(Rabitq::new(Metric::L2, Vec::new(), RabitqParams::default()).is_err());
    let rq = Rabitq::new(Metric::L2, vec![0.0; 8], RabitqParams::default()).unwrap();
    let e = rq.encode(&[1.0; 7]).unwrap_err();
    assert!(e.to_string().contains("7 values"), "{e}");
    assert!(rq.encode(&[f32::NAN; 8]).is_err());
    assert!(rq.query(&[f32::INFINITY; 8]).is_err());
    // The centroid itself has a code, and its estimate is exact.
    let c = rq.encode(&[0.0; 8]).unwrap();
    let q = rq.query(&[1.0; 8]).unwrap();
    let (est, bound) = rq.estimate(&q, &c);
    assert!((est - 8.0).abs() < 1e-4 && bound == 0.0, "{est} ± {bound}");
}
