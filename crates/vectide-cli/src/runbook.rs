//! `vectide runbook`: a big-ann-benchmarks streaming runbook on native engines.
//!
//! Everything but the arguments and the printing is the harness core's
//! (`vectide_harness::runbook`, which the Python package calls too): the
//! runbook's parse and check (the first problem is an error naming the
//! step: exit code 2, no output file), which engines run and how each is
//! built, the ground truth (exact, once per distinct active set, before any
//! engine runs, shared and untimed), the timed loop (one `search_into` per
//! query from one thread) and the result document, whose keys are those of
//! `python -m vectide.bench runbook`. Engines run one after another in this
//! process; an engine that lives in a directory runs in a temporary one.

use crate::dataset;
use clap::Args;
use serde_json::{json, Value};
use std::fmt;
use std::path::PathBuf;
use std::time::Instant;
use vectide_harness::runbook::{
    check, default_engines, document, ground_truth, load, run_engine, Data, EngineRun, RunOptions,
};

#[derive(Args, Debug)]
pub struct RunbookArgs {
    /// Dataset name (e.g. clustered-20k-32-angular), an ann-benchmarks HDF5
    /// file, or a directory of exported sidecars (`docs/format-vbin.md`).
    #[arg(long)]
    dataset: String,
    /// The runbook YAML file (big-ann-benchmarks layout).
    #[arg(long)]
    runbook: PathBuf,
    /// The top-level key of the runbook to run when the file holds several.
    #[arg(long = "runbook-dataset")]
    runbook_dataset: Option<String>,
    /// Comma-separated engines (`NAME`, `vectide:NAME`, or a variant
    /// `vectide:NAME@key=value`). Default: every registered approximate
    /// engine that runs in memory or is an SSD index.
    #[arg(long)]
    engines: Option<String>,
    /// Neighbours per query.
    #[arg(long, default_value_t = 10)]
    k: usize,
    /// The value of each graph engine's primary search knob (ef, L), fixed
    /// for the run; an engine without a knob is searched without one.
    #[arg(long, default_value_t = 100)]
    knob: usize,
    /// Postings probed by the engines whose knob is nprobe (the SPANN
    /// family), fixed for the run.
    #[arg(long, default_value_t = 32)]
    nprobe: usize,
    /// Threads of inserts, deletes and replaces (searches use one thread).
    #[arg(long = "update-threads", default_value_t = 2)]
    update_threads: usize,
    /// Queries per search step (the first N of the dataset's).
    #[arg(long, default_value_t = 1000)]
    queries: usize,
    /// Output JSON file (written only when every engine has run).
    #[arg(long)]
    out: PathBuf,
}

/// Why `vectide runbook` failed: its input (exit code 2, nothing ran) or
/// a run (exit code 1).
#[derive(Debug)]
pub enum Failure {
    Input(String),
    Run(String),
}

impl Failure {
    pub fn exit_code(&self) -> u8 {
        match self {
            Failure::Input(_) => 2,
            Failure::Run(_) => 1,
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Input(m) | Failure::Run(m) => f.write_str(m),
        }
    }
}

fn check_args(args: &RunbookArgs) -> Result<(), String> {
    use vectide_core::limits::{self, check_range};
    (|| -> vectide_core::Result<()> {
        check_range("--k", args.k, 1, limits::MAX_K)?;
        check_range("--knob", args.knob, 1, limits::MAX_EF)?;
        check_range("--nprobe", args.nprobe, 1, limits::MAX_EF)?;
        check_range(
            "--update-threads",
            args.update_threads,
            1,
            limits::MAX_THREADS,
        )?;
        check_range("--queries", args.queries, 1, usize::MAX)
    })()
    .map_err(|e| e.to_string())
}

/// The engines asked for (default: the core's set), each resolved once.
fn engines(args: &RunbookArgs) -> Result<Vec<EngineRun>, String> {
    let specs: Vec<String> = match &args.engines {
        Some(list) => list
            .split(',')
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect(),
        None => default_engines(),
    };
    if specs.is_empty() {
        return Err("--engines names no engine".into());
    }
    let mut out: Vec<EngineRun> = Vec::new();
    for spec in &specs {
        let e = EngineRun::new(spec, args.update_threads, args.knob, args.nprobe)?;
        if out.iter().any(|o| o.key == e.key) {
            return Err(format!("engine {} is listed twice", e.key));
        }
        out.push(e);
    }
    Ok(out)
}

/// `vectide runbook`.
pub fn run(args: &RunbookArgs) -> Result<(), Failure> {
    use Failure::{Input, Run};
    check_args(args).map_err(Input)?;
    let mut engines = engines(args).map_err(Input)?;
    let rb = load(&args.runbook, args.runbook_dataset.as_deref()).map_err(|e| Input(e.0))?;
    let ds = dataset::load(&args.dataset).map_err(Input)?;
    let metric = ds.metric().map_err(Input)?;
    let plan = check(&rb, ds.n_train()).map_err(|e| {
        Input(format!(
            "{}: {e} (dataset {}, {} rows)",
            args.runbook.display(),
            ds.name,
            ds.n_train()
        ))
    })?;
    for e in &engines {
        let mut params = e.params.clone();
        if e.desc.persistence.in_directory() {
            params.insert("path".into(), vectide_engines::ParamValue::Str(".".into()));
        }
        vectide_engines::validate(e.desc.name, ds.dim, &params)
            .map_err(|err| Input(format!("{}: {err}", e.key)))?;
    }
    if let Some(dir) = args.out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| Input(format!("{}: {e}", dir.display())))?;
    }
    let nq = args.queries.min(ds.n_test());
    let data = Data::new(ds.dim, metric, &ds.train, &ds.test[..nq * ds.dim]).map_err(Input)?;
    let c = &plan.counts;
    eprintln!(
        "{}: {} rows, {nq} queries, dim {}, {}; runbook {} ({} steps: {} insert, {} delete, \
         {} replace, {} search; peak {} active); engines {} (simd: {})",
        ds.name,
        ds.n_train(),
        ds.dim,
        metric.name(),
        plan.dataset,
        plan.ops.len(),
        c.insert,
        c.delete,
        c.replace,
        c.search,
        c.peak_active,
        engines
            .iter()
            .map(|e| e.key.as_str())
            .collect::<Vec<_>>()
            .join(","),
        vectide_core::distance::active_isa()
    );
    let truth = ground_truth(&data, &plan, args.k, args.update_threads).map_err(Run)?;
    eprintln!(
        "ground truth: {} search steps, {} distinct active sets ({})",
        c.search, truth.distinct, truth.engine
    );
    let opts = RunOptions {
        k: args.k,
        isolated: false,
        ..RunOptions::default()
    };
    let mut results = serde_json::Map::new();
    println!(
        "{:<22} {:>10} {:>10} {:>10} {:>12}",
        "engine",
        format!("recall@{}", args.k),
        "min",
        "seconds",
        "peak_MB"
    );
    for e in &mut engines {
        let t0 = Instant::now();
        let r = run_engine(e, &data, &plan, &truth.steps, &opts).map_err(Run)?;
        let fmt = |v: Option<f64>| v.map_or("-".to_string(), |x| format!("{x:.4}"));
        println!(
            "{:<22} {:>10} {:>10} {:>10.2} {:>12.1}",
            e.key,
            fmt(r["avg_recall"].as_f64()),
            fmt(r["min_recall"].as_f64()),
            r["seconds"].as_f64().unwrap_or(0.0),
            r["peak_memory_bytes"].as_f64().unwrap_or(0.0) / 1e6
        );
        eprintln!(
            "{}: {:.2} s of operations ({:.0} s wall)",
            e.key,
            r["seconds"].as_f64().unwrap_or(0.0),
            t0.elapsed().as_secs_f64()
        );
        results.insert(e.key.clone(), r);
    }
    let file = std::fs::canonicalize(&args.runbook).unwrap_or_else(|_| args.runbook.clone());
    let head = json!({
        "benchmark": "runbook",
        "query_loop": "native (vectide runbook): one search_into call per query",
        "dataset": ds.name,
        "dataset_path": args.dataset,
        "metric": metric.name(),
        "runbook": {
            "file": file.display().to_string(),
            "dataset_key": plan.dataset,
            "max_pts": plan.max_pts,
            "steps": plan.ops.len(),
            "insert": c.insert,
            "delete": c.delete,
            "replace": c.replace,
            "search": c.search,
            "peak_active": c.peak_active,
        },
        "k": args.k,
        "queries_per_search": nq,
        "threads": {"updates": args.update_threads, "searches": 1},
        "search_knob": {"L_or_ef": args.knob, "nprobe": args.nprobe},
        "ground_truth": format!("exact ({}), batched, once per distinct active set", truth.engine),
    });
    let doc: Value = document(head, results, false).map_err(Run)?;
    let text = serde_json::to_string_pretty(&doc).map_err(|e| Run(e.to_string()))?;
    vectide_core::io::atomic_write(&args.out, |w| {
        w.write_all(text.as_bytes())?;
        w.write_all(b"\n")?;
        Ok(())
    })
    .map_err(|e| Run(format!("{}: {e}", args.out.display())))?;
    eprintln!("wrote {}", args.out.display());
    Ok(())
}
