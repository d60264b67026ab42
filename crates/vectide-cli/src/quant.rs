//! `vectide pq-eval`: how good product quantization is on a dataset.
//!
//! For each code size `m` (bytes per vector): train on the dataset's train
//! rows (a seeded sample of at most 65,536), encode them all, then per query
//! build the ADC table and rank every row by its PQ distance. Reported:
//! - `recall10_at_10`: PQ-only search (the 10 best by PQ distance) against
//!   the true 10 nearest neighbours;
//! - `recall10_at_100`: the true 10 among the 100 best by PQ distance (what
//!   a re-ranking of 100 candidates could recover);
//! - `distance_error`: mean |PQ − exact| over mean exact distance, for
//!   pairs of a query with 1,000 random rows and with its true 10 nearest;
//! - seconds to train and encode, and lookups per second of the dispatched
//!   ADC kernel and of the portable one on the same codes.

use crate::dataset;
use clap::Args;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::time::Instant;
use vectide_core::Metric;
use vectide_quant::pq::{lookup_scalar, DistanceTable, PqParams, ProductQuantizer, KSUB};

#[derive(Args, Debug)]
pub struct PqEvalArgs {
    /// Dataset name (e.g. glove-6b-50-angular) or an ann-benchmarks HDF5 path.
    #[arg(long)]
    dataset: String,
    /// Bytes per code to evaluate.
    #[arg(long, default_value = "8,16,32", value_delimiter = ',')]
    m: Vec<usize>,
    /// Queries used (the first N).
    #[arg(long, default_value_t = 1000)]
    queries: usize,
    /// Output JSON file.
    #[arg(long)]
    out: Option<PathBuf>,
}

/// The exact distance under `metric` (vectors already normalised for
/// cosine), the yardstick of the quantization evaluations.
pub(crate) fn exact(metric: Metric, a: &[f32], b: &[f32]) -> f32 {
    match metric {
        Metric::L2 => a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum(),
        Metric::Ip => -a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>(),
        Metric::Cosine => 1.0 - a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>(),
    }
}

/// Normalises every `dim`-value row of `v` (zero rows are left alone).
fn normalise(v: &mut [f32], dim: usize) {
    for row in v.chunks_mut(dim) {
        let n = row.iter().map(|x| x * x).sum::<f32>().sqrt();
        if n > 0.0 {
            row.iter_mut().for_each(|x| *x /= n);
        }
    }
}

/// The dataset and its metric, rows normalised under cosine.
pub(crate) fn load_for_eval(name: &str) -> Result<(dataset::Dataset, Metric), String> {
    let mut ds = dataset::load(name)?;
    let metric = ds.metric()?;
    if metric == Metric::Cosine {
        normalise(&mut ds.train, ds.dim);
        normalise(&mut ds.test, ds.dim);
    }
    Ok((ds, metric))
}

pub fn run(args: &PqEvalArgs) -> Result<(), String> {
    let (ds, metric) = load_for_eval(&args.dataset)?;
    let dim = ds.dim;
    let n = ds.n_train();
    let nq = args.queries.min(ds.n_test());
    if nq == 0 || ds.gt_k < 10 {
        return Err("pq-eval needs at least one query with 10 ground-truth neighbours".into());
    }
    let isa = vectide_core::distance::active_isa();
    eprintln!(
        "{}: {n} rows, {dim}-d, {nq} queries, metric {metric:?}, simd {isa}",
        ds.name
    );
    let mut per_m = serde_json::Map::new();
    let mut summary = serde_json::Map::new();
    for &m in &args.m {
        let t0 = Instant::now();
        let pq = ProductQuantizer::train(&ds.train, dim, &PqParams::new(m))
            .map_err(|e| e.to_string())?;
        let train_s = t0.elapsed().as_secs_f64();
        let t1 = Instant::now();
        let codes = pq.encode_all(&ds.train).map_err(|e| e.to_string())?;
        let encode_s = t1.elapsed().as_secs_f64();
        let mut rng = StdRng::seed_from_u64(0);
        let (mut hit10, mut hit100) = (0usize, 0usize);
        let (mut err_rand, mut sum_rand, mut err_nn, mut sum_nn) = (0f64, 0f64, 0f64, 0f64);
        let mut table = DistanceTable::default();
        let mut dists = vec![0f32; n];
        let mut order: Vec<u32> = Vec::with_capacity(n);
        let mut scan_s = 0.0;
        for qi in 0..nq {
            let q = &ds.test[qi * dim..(qi + 1) * dim];
            pq.table_into(q, metric, &mut table)
                .map_err(|e| e.to_string())?;
            let ts = Instant::now();
            table.distances(&codes, &mut dists);
            scan_s += ts.elapsed().as_secs_f64();
            order.clear();
            order.extend(0..n as u32);
            order.select_nth_unstable_by(100.min(n - 1), |&a, &b| {
                dists[a as usize].total_cmp(&dists[b as usize])
            });
            order.truncate(100.min(n));
            order.sort_by(|&a, &b| dists[a as usize].total_cmp(&dists[b as usize]));
            let truth = &ds.neighbors[qi * ds.gt_k..qi * ds.gt_k + 10];
            for &t in truth {
                let t = t as u32;
                hit10 += usize::from(order[..10.min(order.len())].contains(&t));
                hit100 += usize::from(order.contains(&t));
                let e = exact(
                    metric,
                    q,
                    &ds.train[t as usize * dim..(t as usize + 1) * dim],
                );
                err_nn += (dists[t as usize] - e).abs() as f64;
                sum_nn += e.abs() as f64;
            }
            for _ in 0..1000 {
                let r = rng.gen_range(0..n);
                let e = exact(metric, q, &ds.train[r * dim..(r + 1) * dim]);
                err_rand += (dists[r] - e).abs() as f64;
                sum_rand += e.abs() as f64;
            }
        }
        // The portable kernel on the same codes and the first query's table.
        pq.table_into(&ds.test[..dim], metric, &mut table)
            .map_err(|e| e.to_string())?;
        let ts = Instant::now();
        let mut sink = 0f32;
        for c in codes.chunks_exact(m) {
            sink += table.bias() + lookup_scalar(table.terms(), m, c);
        }
        let scalar_s = ts.elapsed().as_secs_f64();
        std::hint::black_box(sink);
        let lookups = (n * nq) as f64;
        let r = json!({
            "m": m,
            "bytes_per_vector": m,
            "train_s": train_s,
            "encode_s": encode_s,
            "recall10_at_10": hit10 as f64 / (10 * nq) as f64,
            "recall10_at_100": hit100 as f64 / (10 * nq) as f64,
            "distance_error_random_pairs": err_rand / sum_rand.max(f64::MIN_POSITIVE),
            "distance_error_true_neighbours": err_nn / sum_nn.max(f64::MIN_POSITIVE),
            "codes_per_s_dispatched": lookups / scan_s.max(1e-9),
            "codes_per_s_scalar": n as f64 / scalar_s.max(1e-9),
        });
        eprintln!("m {m}: {r}");
        summary.insert(
            format!("pq{m}"),
            json!({
                "recall10_at_10": r["recall10_at_10"],
                "recall10_at_100": r["recall10_at_100"],
                "distance_error_random_pairs": r["distance_error_random_pairs"],
                "simd_over_scalar": (lookups / scan_s.max(1e-9)) / (n as f64 / scalar_s.max(1e-9)),
            }),
        );
        per_m.insert(format!("pq{m}"), r);
    }
    let doc: Value = json!({
        "benchmark": "pq-eval",
        "dataset": ds.name,
        "n_train": n,
        "n_queries": nq,
        "dimension": dim,
        "metric": format!("{metric:?}"),
        "ksub": KSUB,
        "simd": isa,
        "machine": vectide_harness::machine::machine_info(),
        "method": "train on a seeded sample of at most 65,536 rows (centred, k-means per subspace, 25 iterations), \
                   encode every row; per query an ADC table and a full scan of the codes",
        "results": per_m,
        "summary": summary,
    });
    write_report(&doc, args.out.as_deref())
}

/// Writes a report as pretty JSON to `out`, or prints it.
pub(crate) fn write_report(doc: &Value, out: Option<&std::path::Path>) -> Result<(), String> {
    let text = serde_json::to_string_pretty(doc).map_err(|e| e.to_string())?;
    match out {
        Some(p) => std::fs::write(p, text).map_err(|e| format!("writing {}: {e}", p.display())),
        None => {
            println!("{text}");
            Ok(())
        }
    }
}
