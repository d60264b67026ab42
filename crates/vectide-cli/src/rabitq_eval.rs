//! `vectide rabitq-eval`: how good RaBitQ codes are on a dataset.
//!
//! For each number of bits: a quantizer around the train rows' mean
//! (seeded rotation), every row encoded; the 1-bit codes packed 32 to a
//! fast-scan block. Per query, every row is estimated: by the fast scan for
//! the 1-bit estimate and its bound, and, with more bits, by the levels.
//! Reported per bits:
//! - `recall10_at_10` / `recall10_at_100`: the true 10 nearest among the
//!   10 / 100 best by the estimate (code-only search, and what re-ranking
//!   100 candidates exactly could recover);
//! - `distance_error_random_pairs` / `_true_neighbours`: mean |estimate −
//!   exact| over mean |exact|, for a query with 1,000 random rows and with
//!   its true 10;
//! - `outside_bound`: the share of random pairs whose 1-bit estimate is
//!   further from the exact distance than the bound (the paper's ε₀ = 1.9
//!   puts about 6 % there);
//! - `pruned_by_bound`: the share of rows whose lower bound (estimate −
//!   bound) is past the true 10th distance, i.e. what a search that prunes
//!   by the bound never computes exactly, and `missed_by_bound`: true
//!   neighbours among them;
//! - bytes per vector, encode seconds, and 1-bit estimates per second of
//!   the dispatched fast-scan kernel and of the portable one.

use crate::quant::{exact, load_for_eval, write_report};
use clap::Args;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::time::Instant;
use vectide_quant::rabitq::fastscan::{self, scan_scalar, Block, BLOCK};
use vectide_quant::rabitq::{Code, Rabitq, RabitqParams};

#[derive(Args, Debug)]
pub struct RabitqEvalArgs {
    /// Dataset name (e.g. glove-6b-50-angular) or an ann-benchmarks HDF5 path.
    #[arg(long)]
    dataset: String,
    /// Bits per coordinate to evaluate (1 to 8).
    #[arg(long, default_value = "1,2,4", value_delimiter = ',')]
    bits: Vec<u8>,
    /// Queries used (the first N).
    #[arg(long, default_value_t = 200)]
    queries: usize,
    /// Output JSON file.
    #[arg(long)]
    out: Option<PathBuf>,
}

/// The 1-bit estimates and bounds of every row by the fast scan.
fn scan_all(
    q: &vectide_quant::rabitq::Query,
    blocks: &[Block],
    codes: &[Code],
    est: &mut [f32],
    bound: &mut [f32],
    kernel: fn(&[u8], &[u8], &mut [u32; BLOCK]),
) {
    let mut ip = [0u32; BLOCK];
    for (b, block) in blocks.iter().enumerate() {
        kernel(&q.lut, &block.bytes, &mut ip);
        let lo = b * BLOCK;
        let hi = (lo + BLOCK).min(codes.len());
        for i in lo..hi {
            let (e, r) = q.finish(ip[i - lo] as f32, &codes[i].factors);
            est[i] = e;
            bound[i] = r;
        }
    }
}

pub fn run(args: &RabitqEvalArgs) -> Result<(), String> {
    let (ds, metric) = load_for_eval(&args.dataset)?;
    let dim = ds.dim;
    let n = ds.n_train();
    let nq = args.queries.min(ds.n_test());
    if nq == 0 || ds.gt_k < 10 || n < 100 {
        return Err(
            "rabitq-eval needs 100 rows and a query with 10 ground-truth neighbours".into(),
        );
    }
    let kernel = fastscan::kernel_name();
    eprintln!(
        "{}: {n} rows, {dim}-d, {nq} queries, metric {metric:?}, fast scan {kernel}",
        ds.name
    );
    let mut per = serde_json::Map::new();
    let mut summary = serde_json::Map::new();
    let (mut est, mut bound, mut fine) = (vec![0f32; n], vec![0f32; n], vec![0f32; n]);
    let mut order: Vec<u32> = Vec::with_capacity(n);
    for &bits in &args.bits {
        let params = RabitqParams {
            bits,
            ..RabitqParams::default()
        };
        let t0 = Instant::now();
        let rq = Rabitq::train(metric, &ds.train, dim, params).map_err(|e| e.to_string())?;
        let codes: Vec<Code> = ds
            .train
            .chunks_exact(dim)
            .map(|v| rq.encode(v))
            .collect::<Result<_, _>>()
            .map_err(|e| e.to_string())?;
        let blocks: Vec<Block> = codes
            .chunks(BLOCK)
            .map(|c| Block::pack(c.iter().map(|x| x.bin.as_slice()), rq.padded()))
            .collect();
        let encode_s = t0.elapsed().as_secs_f64();
        let mut rng = StdRng::seed_from_u64(0);
        let (mut hit10, mut hit100) = (0usize, 0usize);
        let (mut err_rand, mut sum_rand, mut err_nn, mut sum_nn) = (0f64, 0f64, 0f64, 0f64);
        let (mut outside, mut pairs, mut pruned, mut missed) = (0usize, 0usize, 0usize, 0usize);
        let mut scan_s = 0.0;
        for qi in 0..nq {
            let q = &ds.test[qi * dim..(qi + 1) * dim];
            let pq = rq.query(q).map_err(|e| e.to_string())?;
            let ts = Instant::now();
            scan_all(&pq, &blocks, &codes, &mut est, &mut bound, fastscan::scan);
            scan_s += ts.elapsed().as_secs_f64();
            if bits > 1 {
                for (f, c) in fine.iter_mut().zip(&codes) {
                    *f = rq.estimate_levels(&pq, c);
                }
            } else {
                fine.copy_from_slice(&est);
            }
            order.clear();
            order.extend(0..n as u32);
            order
                .select_nth_unstable_by(99, |&a, &b| fine[a as usize].total_cmp(&fine[b as usize]));
            order.truncate(100);
            order.sort_by(|&a, &b| fine[a as usize].total_cmp(&fine[b as usize]));
            let truth = &ds.neighbors[qi * ds.gt_k..qi * ds.gt_k + 10];
            let row = |i: usize| &ds.train[i * dim..(i + 1) * dim];
            let tenth = truth
                .iter()
                .map(|&t| exact(metric, q, row(t as usize)))
                .fold(f32::MIN, f32::max);
            for &t in truth {
                let t = t as usize;
                hit10 += usize::from(order[..10].contains(&(t as u32)));
                hit100 += usize::from(order.contains(&(t as u32)));
                let e = exact(metric, q, row(t));
                err_nn += f64::from((fine[t] - e).abs());
                sum_nn += f64::from(e.abs());
                missed += usize::from(est[t] - bound[t] > tenth);
            }
            pruned += (0..n).filter(|&i| est[i] - bound[i] > tenth).count();
            for _ in 0..1000 {
                let r = rng.gen_range(0..n);
                let e = exact(metric, q, row(r));
                err_rand += f64::from((fine[r] - e).abs());
                sum_rand += f64::from(e.abs());
                outside += usize::from((est[r] - e).abs() > bound[r]);
                pairs += 1;
            }
        }
        // The portable kernel on the same blocks and the first query.
        let pq = rq.query(&ds.test[..dim]).map_err(|e| e.to_string())?;
        let ts = Instant::now();
        scan_all(&pq, &blocks, &codes, &mut est, &mut bound, scan_scalar);
        let scalar_s = ts.elapsed().as_secs_f64();
        std::hint::black_box(&est);
        let per_s = (n * nq) as f64 / scan_s.max(1e-9);
        let scalar_per_s = n as f64 / scalar_s.max(1e-9);
        let r = json!({
            "bits": bits,
            "padded_dimension": rq.padded(),
            "bytes_per_vector": rq.code_bytes(),
            "encode_s": encode_s,
            "recall10_at_10": hit10 as f64 / (10 * nq) as f64,
            "recall10_at_100": hit100 as f64 / (10 * nq) as f64,
            "distance_error_random_pairs": err_rand / sum_rand.max(f64::MIN_POSITIVE),
            "distance_error_true_neighbours": err_nn / sum_nn.max(f64::MIN_POSITIVE),
            "outside_bound": outside as f64 / pairs.max(1) as f64,
            "pruned_by_bound": pruned as f64 / (n * nq) as f64,
            "missed_by_bound": missed as f64 / (10 * nq) as f64,
            "estimates_per_s_dispatched": per_s,
            "estimates_per_s_scalar": scalar_per_s,
        });
        eprintln!("bits {bits}: {r}");
        summary.insert(
            format!("rabitq{bits}"),
            json!({
                "recall10_at_10": r["recall10_at_10"],
                "recall10_at_100": r["recall10_at_100"],
                "distance_error_random_pairs": r["distance_error_random_pairs"],
                "outside_bound": r["outside_bound"],
                "fastscan_over_scalar": per_s / scalar_per_s,
            }),
        );
        per.insert(format!("rabitq{bits}"), r);
    }
    let doc: Value = json!({
        "benchmark": "rabitq-eval",
        "dataset": ds.name,
        "n_train": n,
        "n_queries": nq,
        "dimension": dim,
        "metric": format!("{metric:?}"),
        "fastscan_kernel": kernel,
        "simd": vectide_core::distance::active_isa(),
        "machine": vectide_harness::machine::machine_info(),
        "command": std::env::args().collect::<Vec<_>>().join(" "),
        "method": "one quantizer around the train rows' mean (seeded fast-Hadamard rotation), every row encoded; \
                   per query every row estimated (1 bit by the fast scan, more bits by the levels)",
        "results": per,
        "summary": summary,
    });
    write_report(&doc, args.out.as_deref())
}
