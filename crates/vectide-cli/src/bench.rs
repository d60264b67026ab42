//! `vectide bench`: the ANN recall/QPS sweep on native engines.
//!
//! Same flags and JSON shape as `python -m vectide.bench ann`; the query loop
//! is native (one `search_into` per query, reused output buffer), so its QPS
//! is the engine's own, without Python's per-call cost.

use crate::dataset::{self, Dataset};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use vectide_core::{Neighbor, SearchParams};
use vectide_engines::{AnyIndex, ParamValue, Params};

const DEFAULT_EFS: &str = "10,16,24,32,48,64,96,128,192,256,384,512";
const TARGETS: [f64; 3] = [0.9, 0.95, 0.99];

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Dataset name (e.g. glove-6b-50-angular) or path to an ann-benchmarks HDF5 file.
    #[arg(long)]
    dataset: String,
    /// Comma-separated engines (`NAME` or `vectide:NAME`; `vectide engines`
    /// lists them). Default: the default engine.
    #[arg(long, default_value = vectide_engines::DEFAULT_ENGINE)]
    engines: String,
    /// Neighbours per query.
    #[arg(long, default_value_t = 10)]
    k: usize,
    /// Build threads (queries run one at a time from one thread).
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Output JSON file.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Recall/QPS plot (drawn by the Python package's plotter).
    #[arg(long)]
    plot: Option<PathBuf>,
    /// HNSW M.
    #[arg(long, default_value_t = 16)]
    m: usize,
    /// HNSW efConstruction.
    #[arg(long = "ef-construction", default_value_t = 200)]
    ef_construction: usize,
    /// Search-list sizes to sweep.
    #[arg(long, default_value = DEFAULT_EFS, value_delimiter = ',')]
    ef: Vec<usize>,
    /// Repetitions of each sweep point (best kept).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Use only the first N queries.
    #[arg(long = "max-queries")]
    max_queries: Option<usize>,
}

struct Point {
    ef: usize,
    recall: f64,
    qps: f64,
}

/// Mean recall@k of `found` (row-major, `k` per query) against ground truth.
fn recall(found: &[u64], ds: &Dataset, nq: usize, k: usize) -> f64 {
    let mut hits = 0usize;
    for q in 0..nq {
        let truth = &ds.neighbors[q * ds.gt_k..q * ds.gt_k + k];
        let got = &found[q * k..(q + 1) * k];
        hits += got
            .iter()
            .filter(|&&id| truth.iter().any(|&t| t as u64 == id))
            .count();
    }
    hits as f64 / (nq * k) as f64
}

/// QPS at a recall target: log-QPS interpolated linearly in recall between
/// the two Pareto-frontier points that bracket it; `None` when no point
/// reaches it. Below the frontier's lowest recall, the fastest point that
/// reaches the target counts.
pub fn qps_at_recall(points: &[(f64, f64)], target: f64) -> Option<f64> {
    let mut frontier: Vec<(f64, f64)> = points
        .iter()
        .copied()
        .filter(|&(r, q)| {
            !points
                .iter()
                .any(|&(r2, q2)| r2 >= r && q2 >= q && (r2 > r || q2 > q))
        })
        .collect();
    frontier.sort_by(|a, b| a.0.total_cmp(&b.0));
    frontier.dedup_by(|a, b| a.0 == b.0);
    let (first, last) = (frontier.first()?, frontier.last()?);
    if last.0 < target {
        return None;
    }
    if target <= first.0 {
        return Some(first.1);
    }
    if let Some(&(_, q)) = frontier.iter().find(|p| p.0 == target) {
        return Some(q);
    }
    frontier.windows(2).find_map(|w| {
        let ((r0, q0), (r1, q1)) = (w[0], w[1]);
        (r0 <= target && target <= r1).then(|| {
            let t = (target - r0) / (r1 - r0);
            (q0.ln() + t * (q1.ln() - q0.ln())).exp()
        })
    })
}

fn engine_name(spec: &str) -> String {
    spec.strip_prefix("vectide:").unwrap_or(spec).to_string()
}

fn build(ds: &Dataset, engine: &str, args: &BenchArgs) -> Result<(AnyIndex, f64), String> {
    let mut params = Params::new();
    params.insert("threads".into(), ParamValue::Int(args.threads as i64));
    // `--m` and `--ef-construction` go to engines whose schema has them.
    let desc = vectide_engines::descriptor(engine).map_err(|e| e.to_string())?;
    for (name, value) in [("m", args.m), ("ef_construction", args.ef_construction)] {
        if desc.param(name).is_some() && !desc.persistence.in_directory() {
            params.insert(name.into(), ParamValue::Int(value as i64));
        }
    }
    let metric = ds.metric()?;
    let index =
        vectide_engines::create(engine, ds.dim, metric, &params).map_err(|e| e.to_string())?;
    let n = ds.n_train();
    let ids: Vec<u64> = (0..n as u64).collect();
    let bar = ProgressBar::new(n as u64).with_message(format!("building {engine}"));
    bar.set_style(
        ProgressStyle::with_template(
            "{msg} {bar:40} {pos}/{len} [{elapsed_precise}<{eta_precise}]",
        )
        .expect("static template"),
    );
    bar.enable_steady_tick(Duration::from_millis(500));
    let start = Instant::now();
    let report = |done: usize| bar.set_position(done as u64);
    index
        .insert_with_progress(1, &ids, &ds.train, Some(&report))
        .map_err(|e| e.to_string())?;
    let secs = start.elapsed().as_secs_f64();
    bar.finish_and_clear();
    Ok((index, secs))
}

fn sweep_point(index: &AnyIndex, ds: &Dataset, nq: usize, k: usize, ef: usize) -> (f64, Vec<u64>) {
    let params = SearchParams::with_ef(ef.max(k));
    let mut out: Vec<Neighbor> = Vec::with_capacity(k);
    let mut found = vec![u64::MAX; nq * k];
    let start = Instant::now();
    for (q, query) in ds.test.chunks_exact(ds.dim).take(nq).enumerate() {
        // Queries come from a validated dataset; an error here would be a bug
        // worth seeing, so it is reported as a miss and counted in recall.
        if index.search_into(query, k, &params, None, &mut out).is_ok() {
            for (j, n) in out.iter().enumerate() {
                found[q * k + j] = n.id;
            }
        }
    }
    let qps = nq as f64 / start.elapsed().as_secs_f64();
    (qps, found)
}

pub fn run(args: &BenchArgs) -> Result<(), String> {
    {
        use vectide_core::limits::{self, check_range};
        let check = || -> vectide_core::Result<()> {
            check_range("--k", args.k, 1, limits::MAX_K)?;
            check_range("--threads", args.threads, 1, limits::MAX_THREADS)?;
            check_range("--runs", args.runs, 1, 1000)?;
            check_range("--m", args.m, limits::MIN_M, limits::MAX_M)?;
            check_range("--ef-construction", args.ef_construction, 1, limits::MAX_EF)?;
            for &ef in &args.ef {
                check_range("--ef", ef, 1, limits::MAX_EF)?;
            }
            Ok(())
        };
        check().map_err(|e| e.to_string())?;
    }
    if args.ef.is_empty() {
        return Err("--ef needs at least one value".into());
    }
    let ds = dataset::load(&args.dataset)?;
    if args.k > ds.gt_k {
        return Err(format!(
            "--k {} exceeds the {} ground-truth neighbours",
            args.k, ds.gt_k
        ));
    }
    let nq = args.max_queries.unwrap_or(usize::MAX).min(ds.n_test());
    eprintln!(
        "{}: {} train, {} queries, dim {}, {} (simd: {})",
        ds.name,
        ds.n_train(),
        nq,
        ds.dim,
        ds.distance,
        vectide_core::distance::active_isa()
    );
    let specs: Vec<String> = args
        .engines
        .split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect();
    let mut built = Vec::new();
    for spec in &specs {
        let engine = engine_name(spec);
        let (index, secs) = build(&ds, &engine, args)?;
        eprintln!("built {spec} in {secs:.1}s");
        built.push((spec.clone(), index, secs));
    }
    let mut sweeps: Vec<Vec<Point>> = built.iter().map(|_| Vec::new()).collect();
    let bar = ProgressBar::new((args.ef.len() * args.runs * built.len()) as u64);
    bar.set_style(
        ProgressStyle::with_template("sweep {bar:40} {pos}/{len} [{elapsed_precise}]")
            .expect("static template"),
    );
    for &ef in &args.ef {
        let mut best: Vec<(f64, Vec<u64>)> = built.iter().map(|_| (0.0, Vec::new())).collect();
        for _ in 0..args.runs {
            for (i, (_, index, _)) in built.iter().enumerate() {
                let (qps, found) = sweep_point(index, &ds, nq, args.k, ef);
                if qps > best[i].0 {
                    best[i] = (qps, found);
                }
                bar.inc(1);
            }
        }
        for (i, (qps, found)) in best.into_iter().enumerate() {
            sweeps[i].push(Point {
                ef: ef.max(args.k),
                recall: recall(&found, &ds, nq, args.k),
                qps,
            });
        }
    }
    bar.finish_and_clear();

    let mut engines = serde_json::Map::new();
    println!(
        "{:<16} {:>9} {:>10} {:>12} {:>12} {:>12}",
        "engine", "build_s", "memory_MB", "qps@0.90", "qps@0.95", "qps@0.99"
    );
    for ((spec, index, secs), sweep) in built.iter().zip(&sweeps) {
        let pts: Vec<(f64, f64)> = sweep.iter().map(|p| (p.recall, p.qps)).collect();
        let at: BTreeMap<String, Option<f64>> = TARGETS
            .iter()
            .map(|&t| (format!("{t}"), qps_at_recall(&pts, t)))
            .collect();
        let fmt = |v: &Option<f64>| v.map_or("-".to_string(), |q| format!("{q:.0}"));
        let stats = index.stats().map_err(|e| e.to_string())?;
        println!(
            "{:<16} {:>9.1} {:>10.1} {:>12} {:>12} {:>12}",
            spec,
            secs,
            stats.memory_bytes as f64 / 1e6,
            fmt(&at["0.9"]),
            fmt(&at["0.95"]),
            fmt(&at["0.99"])
        );
        let params: serde_json::Map<String, Value> = index
            .params()
            .into_iter()
            .map(|(k, v)| {
                let v = match v {
                    ParamValue::Int(i) => json!(i),
                    ParamValue::Float(f) => json!(f),
                    ParamValue::Bool(b) => json!(b),
                    ParamValue::Str(s) => json!(s),
                };
                (k, v)
            })
            .collect();
        engines.insert(
            spec.clone(),
            json!({
                "build_s": secs,
                "memory_bytes": stats.memory_bytes,
                "params": params,
                "sweep": sweep.iter().map(|p| json!({
                    "search_params": {"ef": p.ef},
                    "recall": p.recall,
                    "qps": p.qps,
                })).collect::<Vec<_>>(),
                "qps_at_recall": at,
            }),
        );
    }
    for (spec, sweep) in specs.iter().zip(&sweeps) {
        for p in sweep {
            eprintln!(
                "  {spec:<14} ef={:<4} recall={:.4} qps={:.0}",
                p.ef, p.recall, p.qps
            );
        }
    }
    // Native runs have no peers; the ratio is against the best peer present,
    // i.e. null here, as the JSON contract says.
    let ratios: serde_json::Map<String, Value> =
        specs.iter().map(|s| (s.clone(), Value::Null)).collect();
    let report = json!({
        "dataset": ds.name,
        "k": args.k,
        "threads": args.threads,
        "n_train": ds.n_train(),
        "n_queries": nq,
        "query_loop": "native (vectide bench)",
        "simd": vectide_core::distance::active_isa(),
        "engines": engines,
        "summary": {"ratio_vs_best_peer_at_0.95": ratios},
    });
    if let Some(out) = &args.out {
        let text = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
        std::fs::write(out, text).map_err(|e| format!("{}: {e}", out.display()))?;
        eprintln!("wrote {}", out.display());
        if let Some(png) = &args.plot {
            plot(out, png)?;
        }
    } else if args.plot.is_some() {
        return Err("--plot needs --out (the plot is drawn from the JSON)".into());
    }
    Ok(())
}

/// Draws the recall/QPS plot with the Python package's plotter.
fn plot(json: &std::path::Path, png: &std::path::Path) -> Result<(), String> {
    let py = dataset::python();
    let status = std::process::Command::new(&py)
        .args(["-m", "vectide.bench", "plot"])
        .arg(json)
        .arg(png)
        .status()
        .map_err(|e| format!("cannot run {}: {e}", py.display()))?;
    status
        .success()
        .then_some(())
        .ok_or_else(|| format!("plotting failed ({status})"))
}

#[cfg(test)]
mod tests {
    use super::qps_at_recall;

    #[test]
    fn interpolates_log_qps_on_the_pareto_frontier() {
        let pts = [(0.8, 1000.0), (0.9, 800.0), (0.99, 100.0), (0.85, 10.0)];
        // Exact hit.
        assert_eq!(qps_at_recall(&pts, 0.9), Some(800.0));
        // Bracketed: geometric interpolation between 800 and 100.
        let t = (0.95 - 0.9) / (0.99 - 0.9);
        let want = (800f64.ln() + t * (100f64.ln() - 800f64.ln())).exp();
        assert!((qps_at_recall(&pts, 0.95).unwrap() - want).abs() < 1e-9);
        // Unreachable.
        assert_eq!(qps_at_recall(&pts, 0.995), None);
        // Below the frontier: the fastest point that reaches it.
        assert_eq!(qps_at_recall(&pts, 0.5), Some(1000.0));
        // The dominated point (0.85, 10) plays no part.
        let t = (0.85 - 0.8) / (0.9 - 0.8);
        let want = (1000f64.ln() + t * (800f64.ln() - 1000f64.ln())).exp();
        assert!((qps_at_recall(&pts, 0.85).unwrap() - want).abs() < 1e-9);
        assert_eq!(qps_at_recall(&[], 0.9), None);
    }
}
