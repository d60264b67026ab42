//! `vectide runbook`: a big-ann-benchmarks streaming runbook on native engines.
//!
//! The runbook format, its parser and its check are the harness core's
//! (`vectide_harness::runbook`, which the Python package calls too): the
//! first problem is an error naming the step (exit code 2, no output file).
//!
//! The run mirrors `python -m vectide.bench runbook` (its JSON keys), with
//! the timed loops native: for each engine a fresh index with `threads =
//! --update-threads`, then the steps in order — insert (rows as f32, ids =
//! row numbers), delete, replace (an upsert: the engine contract's insert
//! replaces an existing id), search (the first `--queries` queries, one
//! `search_into` per query from one thread into a reused buffer, each query
//! timed). Ground truth of each search step is exact over the active set,
//! computed before any engine runs with the registry's exact in-memory
//! engine (batched search), once per distinct active set, shared by every
//! engine and excluded from every timing.

use crate::bench::{engine_name, machine_info, param_json, rss_bytes, utc_now};
use crate::dataset::{self, Dataset};
use clap::Args;
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::ops::Range;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::Instant;
use vectide_core::eval::recall_at_k;
use vectide_core::{EngineDescriptor, Knob, Neighbor, SearchParams, RESERVED_ID};
use vectide_engines::{AnyIndex, ParamValue, Params};
use vectide_harness::runbook::{check, load, Op, Plan};

/// The build parameters every run gives the engines that take them (by
/// schema): the Vamana family's R, L and alpha (FreshDiskANN §6.2) and the
/// HNSW family's M and efConstruction, as the Python runner does.
const VAMANA_FAMILY: [(&str, f64); 3] = [("r", 64.0), ("l_build", 75.0), ("alpha", 1.2)];
const HNSW_FAMILY: [(&str, f64); 2] = [("m", 16.0), ("ef_construction", 200.0)];

const POLICY: &str = "the engine's own: deletes are lazy and consolidation runs inside the delete \
     or insert call once the deleted fraction reaches consolidate_fraction (engine parameter)";
const SECONDS_DEFINITION: &str =
    "sum of the engine's operation times (inserts, deletes, replaces, \
     searches), each call timed natively; consolidation runs inside those calls; ground truth and \
     data loading excluded";
const MEMORY_METHOD: &str = "the engine's own memory figure (stats memory_bytes) after the step; \
     where an engine reports none, VmRSS from /proc/self/status minus VmRSS before the engine was \
     created";

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
    /// Comma-separated engines (`NAME` or `vectide:NAME`; in-memory ones).
    /// Default: every registered in-memory engine with a search knob.
    #[arg(long)]
    engines: Option<String>,
    /// Neighbours per query.
    #[arg(long, default_value_t = 10)]
    k: usize,
    /// The value of each engine's primary search knob (ef, L), fixed for
    /// the run; an engine without a knob is searched without one.
    #[arg(long, default_value_t = 100)]
    knob: usize,
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

// ---------------------------------------------------------------------------
// The run.

/// One engine as it will run.
struct Engine {
    /// `vectide:NAME`, the key of its results.
    key: String,
    desc: &'static EngineDescriptor,
    params: Params,
    search: SearchParams,
    knob: Option<Knob>,
}

fn check_args(args: &RunbookArgs) -> Result<(), String> {
    use vectide_core::limits::{self, check_range};
    (|| -> vectide_core::Result<()> {
        check_range("--k", args.k, 1, limits::MAX_K)?;
        check_range("--knob", args.knob, 1, limits::MAX_EF)?;
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

/// The build parameters of an engine: `threads`, the family parameters its
/// schema takes, and `l_search` = `--knob` where it takes one.
fn build_params(desc: &EngineDescriptor, args: &RunbookArgs) -> Params {
    let mut params = Params::new();
    params.insert(
        "threads".into(),
        ParamValue::Int(args.update_threads as i64),
    );
    for (name, value) in VAMANA_FAMILY.iter().chain(HNSW_FAMILY.iter()) {
        if let Some(spec) = desc.param(name) {
            let value = match spec.kind {
                vectide_engines::ParamKind::Float { .. } => ParamValue::Float(*value),
                _ => ParamValue::Int(*value as i64),
            };
            params.insert(name.to_string(), value);
        }
    }
    if desc.param("l_search").is_some() {
        params.insert("l_search".into(), ParamValue::Int(args.knob as i64));
    }
    params
}

/// The engines asked for (default: every in-memory engine with a knob).
fn engines(args: &RunbookArgs) -> Result<Vec<Engine>, String> {
    let specs: Vec<String> = match &args.engines {
        Some(list) => list
            .split(',')
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect(),
        None => vectide_engines::REGISTRY
            .iter()
            .filter(|d| !d.persistence.in_directory() && d.primary_knob.is_some())
            .map(|d| d.name.to_string())
            .collect(),
    };
    if specs.is_empty() {
        return Err("--engines names no engine".into());
    }
    let mut out: Vec<Engine> = Vec::new();
    for spec in &specs {
        let name = engine_name(spec);
        let desc = vectide_engines::descriptor(&name).map_err(|e| e.to_string())?;
        if desc.persistence.in_directory() {
            return Err(format!(
                "engine {name} lives in a directory; runbooks drive in-memory engines"
            ));
        }
        let key = format!("vectide:{name}");
        if out.iter().any(|e| e.key == key) {
            return Err(format!("engine {key} is listed twice"));
        }
        let mut search = SearchParams::default();
        if let Some(knob) = desc.primary_knob {
            search
                .set(knob, args.knob)
                .map_err(|e| format!("{key}: --knob: {e}"))?;
        }
        out.push(Engine {
            key,
            desc,
            params: build_params(desc, args),
            search,
            knob: desc.primary_knob,
        });
    }
    Ok(out)
}

/// Exact top-k of every query at one active set (`k` ids per query, fewer
/// than asked when the active set is smaller).
struct Truth {
    k: usize,
    ids: Vec<u64>,
}

/// The registry's exact in-memory engine (the one without a search knob).
fn exact_engine() -> Result<&'static EngineDescriptor, String> {
    vectide_engines::REGISTRY
        .iter()
        .copied()
        .find(|d| d.primary_knob.is_none() && !d.persistence.in_directory())
        .ok_or_else(|| "no exact in-memory engine is registered for the ground truth".into())
}

/// Rows of the dataset as one slice (`r` within the dataset, checked).
fn rows<'a>(ds: &'a Dataset, r: &Range<usize>) -> &'a [f32] {
    &ds.train[r.start * ds.dim..r.end * ds.dim]
}

fn ids(r: &Range<usize>) -> Vec<u64> {
    (r.start as u64..r.end as u64).collect()
}

/// Ground truth of every search step (`None` where the active set is
/// empty): the exact engine mirrors the runbook, and each distinct active
/// set (ids and the rows they hold) is searched once, batched.
fn ground_truth(
    ds: &Dataset,
    plan: &Plan,
    nq: usize,
    k: usize,
    threads: usize,
) -> Result<Vec<Option<Rc<Truth>>>, String> {
    use std::hash::{DefaultHasher, Hash, Hasher};
    const NONE: usize = usize::MAX;
    let exact = exact_engine()?;
    let mut params = Params::new();
    params.insert("threads".into(), ParamValue::Int(threads as i64));
    let metric = ds.metric()?;
    let index = vectide_engines::create(exact.name, ds.dim, metric, &params)
        .map_err(|e| format!("ground truth ({}): {e}", exact.name))?;
    let queries = &ds.test[..nq * ds.dim];
    let mut row_of = vec![NONE; ds.n_train()];
    let mut live = 0usize;
    let mut seen: HashMap<(u64, u64), Rc<Truth>> = HashMap::new();
    let mut last: Option<Option<Rc<Truth>>> = None;
    let mut out = Vec::with_capacity(plan.counts.search);
    let bar = crate::progress(plan.counts.search as u64, "truth");
    for (i, op) in plan.ops.iter().enumerate() {
        let seq = i as u64 + 1;
        let err = |e: vectide_core::Error| {
            format!(
                "ground truth ({}): step {} ({}): {e}",
                exact.name,
                i + 1,
                op.name()
            )
        };
        match op {
            Op::Insert(r) => {
                index.insert(seq, &ids(r), rows(ds, r)).map_err(err)?;
                r.clone().for_each(|id| row_of[id] = id);
                live += r.len();
            }
            Op::Delete(r) => {
                index.delete(seq, &ids(r)).map_err(err)?;
                row_of[r.clone()].fill(NONE);
                live -= r.len();
            }
            Op::Replace { tags, rows: from } => {
                index.insert(seq, &ids(tags), rows(ds, from)).map_err(err)?;
                tags.clone()
                    .zip(from.clone())
                    .for_each(|(id, row)| row_of[id] = row);
            }
            Op::Search => {}
        }
        if !matches!(op, Op::Search) {
            last = None; // the active set may have changed
            continue;
        }
        if let Some(t) = &last {
            out.push(t.clone());
            bar.inc(1);
            continue;
        }
        let truth = if live == 0 {
            None
        } else {
            let (mut a, mut b) = (DefaultHasher::new(), DefaultHasher::new());
            0x5eed_u64.hash(&mut b);
            for (id, &row) in row_of.iter().enumerate().filter(|(_, &r)| r != NONE) {
                (id, row).hash(&mut a);
                (id, row).hash(&mut b);
            }
            let key = (a.finish(), b.finish());
            if let Some(t) = seen.get(&key) {
                Some(t.clone())
            } else {
                let kk = k.min(live);
                let found = index
                    .search_batch(queries, kk, &SearchParams::default(), None)
                    .map_err(err)?;
                let mut ids = vec![RESERVED_ID; nq * kk];
                for (q, hits) in found.iter().enumerate() {
                    for (j, n) in hits.iter().take(kk).enumerate() {
                        ids[q * kk + j] = n.id;
                    }
                }
                let t = Rc::new(Truth { k: kk, ids });
                seen.insert(key, t.clone());
                Some(t)
            }
        };
        last = Some(truth.clone());
        out.push(truth);
        bar.inc(1);
    }
    bar.finish_and_clear();
    eprintln!(
        "ground truth: {} search steps, {} distinct active sets ({})",
        plan.counts.search,
        seen.len(),
        exact.name
    );
    Ok(out)
}

/// `q`-quantile of sorted values, linear between ranks (numpy's default).
fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let pos = q * (sorted.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64)
}

/// Runs the plan on one engine; returns its result document.
fn run_engine(
    e: &Engine,
    ds: &Dataset,
    plan: &Plan,
    truth: &[Option<Rc<Truth>>],
    nq: usize,
    k: usize,
) -> Result<Value, String> {
    let name = e.desc.name;
    let metric = ds.metric()?;
    let rss0 = rss_bytes();
    let index: AnyIndex = vectide_engines::create(name, ds.dim, metric, &e.params)
        .map_err(|err| format!("{}: {err}", e.key))?;
    let bar = crate::progress(plan.ops.len() as u64, &e.key);
    let mut steps: Vec<Value> = Vec::with_capacity(plan.ops.len());
    let mut totals: BTreeMap<&str, f64> = ["insert", "delete", "replace", "search"]
        .into_iter()
        .map(|op| (op, 0.0))
        .collect();
    let mut recalls: Vec<f64> = Vec::new();
    let mut peak_memory = 0u64;
    let mut out: Vec<Neighbor> = Vec::with_capacity(k);
    let mut found = vec![RESERVED_ID; nq * k];
    let mut latencies: Vec<f64> = Vec::with_capacity(nq);
    let mut search_no = 0usize;
    for (i, op) in plan.ops.iter().enumerate() {
        let num = i + 1;
        let seq = num as u64;
        let err =
            |err: vectide_core::Error| format!("{}: step {num} ({}): {err}", e.key, op.name());
        let mut row = serde_json::Map::new();
        row.insert("step".into(), json!(num));
        row.insert("operation".into(), json!(op.name()));
        let points = match op {
            Op::Insert(r) => {
                let (ids, x) = (ids(r), rows(ds, r));
                let t0 = Instant::now();
                index.insert(seq, &ids, x).map_err(err)?;
                Some((r.len(), t0.elapsed().as_secs_f64()))
            }
            Op::Delete(r) => {
                let ids = ids(r);
                let t0 = Instant::now();
                index.delete(seq, &ids).map_err(err)?;
                Some((r.len(), t0.elapsed().as_secs_f64()))
            }
            Op::Replace { tags, rows: from } => {
                // An upsert: insert replaces the vector of an existing id.
                let (ids, x) = (ids(tags), rows(ds, from));
                let t0 = Instant::now();
                index.insert(seq, &ids, x).map_err(err)?;
                Some((tags.len(), t0.elapsed().as_secs_f64()))
            }
            Op::Search => None,
        };
        if let Some((count, secs)) = points {
            *totals.entry(op.name()).or_default() += secs;
            row.insert("points".into(), json!(count));
            row.insert("seconds".into(), json!(secs));
            row.insert(
                "points_per_s".into(),
                json!((secs > 0.0).then(|| count as f64 / secs)),
            );
        } else {
            found.fill(RESERVED_ID);
            latencies.clear();
            for (q, query) in ds.test.chunks_exact(ds.dim).take(nq).enumerate() {
                let t0 = Instant::now();
                let res = index.search_into(query, k, &e.search, None, &mut out);
                latencies.push(t0.elapsed().as_secs_f64());
                res.map_err(err)?;
                for (j, n) in out.iter().take(k).enumerate() {
                    found[q * k + j] = n.id;
                }
            }
            let total: f64 = latencies.iter().sum();
            *totals.entry("search").or_default() += total;
            let (recall, recall5) = match &truth[search_no] {
                Some(t) => {
                    let at = |kk: usize| {
                        recall_at_k(found.chunks_exact(k), t.ids.chunks_exact(t.k), kk)
                            .map_err(|err| format!("{}: step {num}: {err}", e.key))
                    };
                    (Some(at(t.k)?), if t.k >= 5 { Some(at(5)?) } else { None })
                }
                None => (None, None), // an empty active set: nothing to find
            };
            search_no += 1;
            if let Some(r) = recall {
                recalls.push(r);
            }
            let mut sorted = latencies.clone();
            sorted.sort_by(f64::total_cmp);
            row.insert("recall".into(), json!(recall));
            row.insert("recall5at5".into(), json!(recall5));
            row.insert(
                "qps".into(),
                json!((total > 0.0).then(|| nq as f64 / total)),
            );
            row.insert("mean_latency_us".into(), json!(1e6 * total / nq as f64));
            row.insert(
                "p99_latency_us".into(),
                json!(1e6 * quantile(&sorted, 0.99)),
            );
            row.insert("seconds".into(), json!(total));
        }
        // Untimed: what the step left in memory.
        let stats = index.stats().map_err(err)?;
        let rss = match (rss0, rss_bytes()) {
            (Some(a), Some(b)) => Some(b.saturating_sub(a)),
            _ => None,
        };
        let memory = if stats.memory_bytes > 0 {
            stats.memory_bytes as u64
        } else {
            rss.unwrap_or(0)
        };
        peak_memory = peak_memory.max(memory);
        row.insert("memory_bytes".into(), json!(memory));
        row.insert("rss_delta_bytes".into(), json!(rss));
        row.insert(
            "engine_stats".into(),
            json!({
                "live": stats.live,
                "slots_used": stats.slots_used,
                "capacity": stats.capacity,
                "pending_deletes": stats.pending_deletes,
                "consolidations": stats.consolidations,
                "memory_bytes": stats.memory_bytes,
            }),
        );
        let recall = row.get("recall").and_then(Value::as_f64);
        let qps = row.get("qps").and_then(Value::as_f64);
        steps.push(Value::Object(row));
        bar.inc(1);
        if matches!(op, Op::Search) && bar.is_hidden() {
            // Not a terminal: a line per search step.
            eprintln!(
                "{}: step {num}/{}: recall@{k} {}, {:.0} qps, memory {:.0} MB",
                e.key,
                plan.ops.len(),
                recall.map_or("-".to_string(), |r| format!("{r:.4}")),
                qps.unwrap_or(0.0),
                memory as f64 / 1e6
            );
        }
    }
    bar.finish_and_clear();
    let mut params = serde_json::Map::new();
    params.insert("engine".into(), json!(name));
    params.insert("version".into(), json!(env!("CARGO_PKG_VERSION")));
    params.insert("simd".into(), json!(vectide_core::distance::active_isa()));
    for (k, v) in index.params() {
        params.insert(k, param_json(v));
    }
    let search_knob = match e.knob.and_then(|kn| e.search.get(kn).map(|v| (kn, v))) {
        Some((kn, v)) => json!({ kn.name(): v }),
        None => json!({}),
    };
    let avg = (!recalls.is_empty()).then(|| recalls.iter().sum::<f64>() / recalls.len() as f64);
    let min = recalls.iter().copied().reduce(f64::min);
    Ok(json!({
        "params": params,
        "consolidation_policy": POLICY,
        "search_knob": search_knob,
        "calibration": null,
        "steps": steps,
        "avg_recall": avg,
        "min_recall": min,
        "seconds": totals.values().sum::<f64>(),
        "seconds_by_operation": totals,
        "peak_memory_bytes": peak_memory,
    }))
}

/// `vectide runbook`.
pub fn run(args: &RunbookArgs) -> Result<(), Failure> {
    use Failure::{Input, Run};
    check_args(args).map_err(Input)?;
    let engines = engines(args).map_err(Input)?;
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
        vectide_engines::validate(e.desc.name, ds.dim, &e.params)
            .map_err(|err| Input(format!("{}: {err}", e.key)))?;
    }
    if let Some(dir) = args.out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| Input(format!("{}: {e}", dir.display())))?;
    }
    let nq = args.queries.min(ds.n_test());
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
    let truth = ground_truth(&ds, &plan, nq, args.k, args.update_threads).map_err(Run)?;
    let mut results = serde_json::Map::new();
    println!(
        "{:<22} {:>10} {:>10} {:>10} {:>12}",
        "engine",
        format!("recall@{}", args.k),
        "min",
        "seconds",
        "peak_MB"
    );
    for e in &engines {
        let t0 = Instant::now();
        let r = run_engine(e, &ds, &plan, &truth, nq, args.k).map_err(Run)?;
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
    let by = |field: &str| -> serde_json::Map<String, Value> {
        results
            .iter()
            .map(|(k, r)| (k.clone(), r[field].clone()))
            .collect()
    };
    let mut summary = serde_json::Map::new();
    summary.insert(
        format!("avg_recall{}", args.k),
        Value::Object(by("avg_recall")),
    );
    summary.insert("seconds".into(), Value::Object(by("seconds")));
    summary.insert(
        "peak_memory_bytes".into(),
        Value::Object(by("peak_memory_bytes")),
    );
    let file = std::fs::canonicalize(&args.runbook).unwrap_or_else(|_| args.runbook.clone());
    let doc = json!({
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
        "build_params": {
            "vamana_family": VAMANA_FAMILY.iter().map(|(k, v)| (k.to_string(), json!(v))).collect::<serde_json::Map<_, _>>(),
            "hnsw_family": HNSW_FAMILY.iter().map(|(k, v)| (k.to_string(), json!(*v as u64))).collect::<serde_json::Map<_, _>>(),
        },
        "search_knob": {"L_or_ef": args.knob},
        "ground_truth": format!("exact ({}), batched, once per distinct active set", exact_engine().map_or("?", |d| d.name)),
        "policies": results.keys().map(|k| (k.clone(), json!(POLICY))).collect::<serde_json::Map<_, _>>(),
        "seconds_definition": SECONDS_DEFINITION,
        "memory_method": MEMORY_METHOD,
        "machine": machine_info(),
        "simd": vectide_core::distance::active_isa(),
        "date": utc_now(),
        "engines": results,
        "summary": summary,
    });
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
