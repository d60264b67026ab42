//! `vectide bench`: the ANN recall/QPS sweep on native engines.
//!
//! Same flags and JSON shape as `python -m vectide.bench ann` (the keys its
//! tests check: dataset, k, threads, machine, date, n_train, n_queries,
//! per engine build_s, memory_bytes, params, sweep and qps_at_recall, and
//! the summary); the query loop is native (one `search_into` per query,
//! reused output buffer), so its QPS is the engine's own, without Python's
//! per-call cost. Each engine's build parameters and the knob a sweep varies
//! come from the registry (`vectide_engines::descriptor`); an engine without
//! a knob is measured once. Recall and QPS at recall come from
//! `vectide_core::eval`, the code the Python harness calls too.

use crate::dataset::{self, Dataset};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::time::{Duration, Instant};
use vectide_core::eval::{qps_at_recall, recall_at_k, RECALL_TARGETS};
use vectide_core::{EngineDescriptor, Knob, Neighbor, SearchParams, RESERVED_ID};
use vectide_engines::{AnyIndex, ParamValue, Params};
use vectide_harness::machine::{machine_info, param_json, rss_bytes, utc_now};

const DEFAULT_EFS: &str = "10,16,24,32,48,64,96,128,192,256,384,512";
const MEMORY_METHOD: &str = "RSS delta across the build: VmRSS from /proc/self/status before \
     and after the insert call; all engines stay alive, each is measured by its own delta \
     (the engine's own figure where /proc is missing)";

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

/// One sweep point: the knob value asked for (`None` for an engine without
/// a knob), recall and the best QPS of the runs (all runs kept).
struct Point {
    asked: Option<usize>,
    recall: f64,
    qps: f64,
    qps_runs: Vec<f64>,
}

/// The runs of one sweep point so far: the ids of the fastest, every QPS.
#[derive(Default)]
struct Runs {
    found: Vec<u64>,
    qps: Vec<f64>,
}

/// One engine: its index, build time, memory and sweep.
struct Measured {
    spec: String,
    desc: &'static EngineDescriptor,
    index: AnyIndex,
    build_s: f64,
    memory_bytes: u64,
    sweep: Vec<Point>,
}

fn engine_name(spec: &str) -> String {
    spec.strip_prefix("vectide:").unwrap_or(spec).to_string()
}

/// The build parameters of an engine from the registry: `threads`, and
/// `--m` / `--ef-construction` where its schema has them.
fn build_params(desc: &EngineDescriptor, args: &BenchArgs) -> Params {
    let mut params = Params::new();
    params.insert("threads".into(), ParamValue::Int(args.threads as i64));
    for (name, value) in [("m", args.m), ("ef_construction", args.ef_construction)] {
        if desc.param(name).is_some() && !desc.persistence.in_directory() {
            params.insert(name.into(), ParamValue::Int(value as i64));
        }
    }
    params
}

fn build(ds: &Dataset, spec: &str, args: &BenchArgs) -> Result<Measured, String> {
    let engine = engine_name(spec);
    let desc = vectide_engines::descriptor(&engine).map_err(|e| e.to_string())?;
    let params = build_params(desc, args);
    let metric = ds.metric()?;
    let before = rss_bytes();
    let index =
        vectide_engines::create(&engine, ds.dim, metric, &params).map_err(|e| e.to_string())?;
    let n = ds.n_train();
    let ids: Vec<u64> = (0..n as u64).collect();
    let bar = ProgressBar::new(n as u64).with_message(format!("building {engine}"));
    if let Ok(style) =
        ProgressStyle::with_template("{msg} {bar:40} {pos}/{len} [{elapsed_precise}<{eta_precise}]")
    {
        bar.set_style(style);
    }
    bar.enable_steady_tick(Duration::from_millis(500));
    let start = Instant::now();
    let report = |done: usize| bar.set_position(done as u64);
    index
        .insert_with_progress(1, &ids, &ds.train, Some(&report))
        .map_err(|e| e.to_string())?;
    let build_s = start.elapsed().as_secs_f64();
    bar.finish_and_clear();
    let reported = index.stats().map_err(|e| e.to_string())?.memory_bytes;
    let memory_bytes = match (before, rss_bytes()) {
        (Some(b), Some(a)) => a.saturating_sub(b),
        _ => reported as u64,
    };
    Ok(Measured {
        spec: spec.to_string(),
        desc,
        index,
        build_s,
        memory_bytes,
        sweep: Vec::new(),
    })
}

/// One timed pass over the queries; returns the QPS and the ids found
/// (`k` per query, `u64::MAX` where fewer were found).
fn time_queries(
    index: &AnyIndex,
    ds: &Dataset,
    nq: usize,
    k: usize,
    params: &SearchParams,
) -> (f64, Vec<u64>) {
    let mut out: Vec<Neighbor> = Vec::with_capacity(k);
    let mut found = vec![RESERVED_ID; nq * k];
    let start = Instant::now();
    for (q, query) in ds.test.chunks_exact(ds.dim).take(nq).enumerate() {
        // Queries come from a validated dataset; an error here would be a bug
        // worth seeing, so it is reported as a miss and counted in recall.
        if index.search_into(query, k, params, None, &mut out).is_ok() {
            for (j, n) in out.iter().enumerate() {
                found[q * k + j] = n.id;
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let qps = if secs > 0.0 {
        nq as f64 / secs
    } else {
        f64::INFINITY
    };
    (qps, found)
}

/// `search_params` of a sweep point, as the Python harness writes them.
fn search_params_json(knob: Option<Knob>, asked: Option<usize>, k: usize) -> Value {
    match (knob, asked) {
        (Some(Knob::Ef), Some(ef)) => json!({"ef": ef, "ef_effective": ef.max(k)}),
        (Some(knob), Some(v)) => json!({knob.name(): v.max(k)}),
        _ => json!({}),
    }
}

fn check_args(args: &BenchArgs) -> Result<(), String> {
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
    if args.ef.is_empty() {
        return Err("--ef needs at least one value".into());
    }
    Ok(())
}

pub fn run(args: &BenchArgs) -> Result<(), String> {
    check_args(args)?;
    let specs: Vec<String> = args
        .engines
        .split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect();
    for (i, spec) in specs.iter().enumerate() {
        vectide_engines::descriptor(&engine_name(spec)).map_err(|e| e.to_string())?;
        if specs[..i].contains(spec) {
            return Err(format!("engine {spec} is listed twice"));
        }
    }
    let ds = dataset::load(&args.dataset)?;
    if args.k > ds.gt_k {
        return Err(format!(
            "--k {} exceeds the {} ground-truth neighbours",
            args.k, ds.gt_k
        ));
    }
    let nq = args.max_queries.unwrap_or(usize::MAX).min(ds.n_test());
    if nq == 0 {
        return Err("the dataset has no test queries".into());
    }
    let metric = ds.metric()?;
    eprintln!(
        "{}: {} train, {} queries, dim {}, {} (simd: {})",
        ds.name,
        ds.n_train(),
        nq,
        ds.dim,
        ds.distance,
        vectide_core::distance::active_isa()
    );
    let truth: Vec<u64> = ds.neighbors.iter().map(|&t| t as u64).collect();
    let truth_rows = || truth.chunks_exact(ds.gt_k).take(nq);

    let mut engines: Vec<Measured> = Vec::new();
    for spec in &specs {
        let m = build(&ds, spec, args)?;
        eprintln!("built {spec} in {:.1}s", m.build_s);
        engines.push(m);
    }
    let bar = ProgressBar::new((args.ef.len() * args.runs * engines.len()) as u64);
    if let Ok(style) =
        ProgressStyle::with_template("sweep {bar:40} {pos}/{len} [{elapsed_precise}]")
    {
        bar.set_style(style);
    }
    // Sweep order as in the Python harness: for ef, for run, for engine;
    // an engine without a knob (exact) is measured once, at the first point.
    for (i, &ef) in args.ef.iter().enumerate() {
        let eff = ef.max(args.k);
        let mut best: Vec<Runs> = engines.iter().map(|_| Runs::default()).collect();
        for _ in 0..args.runs {
            for (e, runs) in engines.iter().zip(best.iter_mut()) {
                let mut params = SearchParams::default();
                match e.desc.primary_knob {
                    Some(knob) => params.set(knob, eff).map_err(|e| e.to_string())?,
                    None if i > 0 => continue,
                    None => {}
                }
                let (qps, found) = time_queries(&e.index, &ds, nq, args.k, &params);
                bar.inc(1);
                if runs.qps.iter().all(|&q| qps > q) {
                    runs.found = found;
                }
                runs.qps.push(qps);
            }
        }
        for (e, runs) in engines.iter_mut().zip(best) {
            let Some(qps) = runs.qps.iter().copied().reduce(f64::max) else {
                continue; // not measured at this point (an exact engine)
            };
            let recall = recall_at_k(runs.found.chunks_exact(args.k), truth_rows(), args.k)
                .map_err(|e| e.to_string())?;
            e.sweep.push(Point {
                asked: e.desc.primary_knob.map(|_| ef),
                recall,
                qps,
                qps_runs: runs.qps,
            });
        }
    }
    bar.finish_and_clear();

    let key = |t: f64| format!("{t}");
    println!(
        "{:<16} {:>9} {:>10} {:>12} {:>12} {:>12}",
        "engine", "build_s", "memory_MB", "qps@0.9", "qps@0.95", "qps@0.99"
    );
    let mut engines_out = serde_json::Map::new();
    for e in &engines {
        let pts: Vec<(f64, f64)> = e.sweep.iter().map(|p| (p.recall, p.qps)).collect();
        let at: Vec<(String, Option<f64>)> = RECALL_TARGETS
            .iter()
            .map(|&t| (key(t), qps_at_recall(&pts, t)))
            .collect();
        let fmt = |v: Option<f64>| v.map_or("-".to_string(), |q| format!("{q:.0}"));
        println!(
            "{:<16} {:>9.1} {:>10.1} {:>12} {:>12} {:>12}",
            e.spec,
            e.build_s,
            e.memory_bytes as f64 / 1e6,
            fmt(at[0].1),
            fmt(at[1].1),
            fmt(at[2].1)
        );
        for p in &e.sweep {
            eprintln!(
                "  {:<14} {}={:<4} recall={:.4} qps={:.0}",
                e.spec,
                e.desc.primary_knob.map_or("-", |k| k.name()),
                p.asked.map_or("-".to_string(), |v| v.to_string()),
                p.recall,
                p.qps
            );
        }
        let index_params: serde_json::Map<String, Value> = e
            .index
            .params()
            .into_iter()
            .map(|(k, v)| (k, param_json(v)))
            .collect();
        let stats = e.index.stats().map_err(|e| e.to_string())?;
        engines_out.insert(
            e.spec.clone(),
            json!({
                "build_s": e.build_s,
                "memory_bytes": e.memory_bytes,
                "reported_memory_bytes": stats.memory_bytes,
                "params": {
                    "metric": metric.name(),
                    "m": args.m,
                    "ef_construction": args.ef_construction,
                    "threads": args.threads,
                    "engine": e.desc.name,
                    "version": env!("CARGO_PKG_VERSION"),
                    "index_params": index_params,
                },
                "sweep": e.sweep.iter().map(|p| json!({
                    "search_params": search_params_json(e.desc.primary_knob, p.asked, args.k),
                    "recall": p.recall,
                    "qps": p.qps,
                    "qps_runs": p.qps_runs,
                })).collect::<Vec<_>>(),
                "qps_at_recall": at.into_iter().map(|(k, v)| (k, json!(v))).collect::<serde_json::Map<String, Value>>(),
            }),
        );
    }
    // The ratios compare each engine with the best peer (an engine not
    // named vectide:*); a native run has none, so every ratio is null.
    let mut summary = serde_json::Map::new();
    summary.insert("peers".into(), json!([]));
    for &t in &RECALL_TARGETS {
        let nulls: serde_json::Map<String, Value> =
            specs.iter().map(|s| (s.clone(), Value::Null)).collect();
        summary.insert(
            format!("ratio_vs_best_peer_at_{}", key(t)),
            Value::Object(nulls),
        );
        summary.insert(format!("best_peer_at_{}", key(t)), Value::Null);
    }
    let report = json!({
        "dataset": ds.name,
        "distance": ds.distance,
        "metric": metric.name(),
        "k": args.k,
        "threads": args.threads,
        "n_train": ds.n_train(),
        "n_queries": nq,
        "query_loop": "native (vectide bench): one search_into call per query",
        "dimension": ds.dim,
        "params": {
            "m": args.m,
            "ef_construction": args.ef_construction,
            "ef": args.ef,
            "runs": args.runs,
            "timing": "Instant around the whole query loop; QPS = queries / seconds",
            "sweep_order": "for ef: for run: for engine; best QPS of the runs kept",
        },
        "memory_method": MEMORY_METHOD,
        "machine": machine_info(),
        "date": utc_now(),
        "engines": engines_out,
        "summary": summary,
    });
    if let Some(out) = &args.out {
        let text = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
        std::fs::write(out, text + "\n").map_err(|e| format!("{}: {e}", out.display()))?;
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
    use super::*;

    #[test]
    fn search_params_are_written_as_the_python_harness_writes_them() {
        assert_eq!(
            search_params_json(Some(Knob::Ef), Some(5), 10),
            json!({"ef": 5, "ef_effective": 10})
        );
        assert_eq!(
            search_params_json(Some(Knob::Nprobe), Some(32), 10),
            json!({"nprobe": 32})
        );
        assert_eq!(search_params_json(None, None, 10), json!({}));
    }

    #[test]
    fn the_date_is_iso_8601_utc() {
        let d = utc_now();
        assert_eq!(d.len(), 25, "{d}");
        assert!(d.ends_with("+00:00") && d.as_bytes()[10] == b'T', "{d}");
        let year: i32 = d[..4].parse().unwrap();
        let month: u32 = d[5..7].parse().unwrap();
        let day: u32 = d[8..10].parse().unwrap();
        assert!(
            year >= 2024 && (1..=12).contains(&month) && (1..=31).contains(&day),
            "{d}"
        );
    }
}
