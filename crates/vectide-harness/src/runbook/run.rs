//! The timed loop of one native engine over a plan.
//!
//! A fresh index with `threads` = the update threads (an engine that lives
//! in a directory gets a temporary one, removed at the end), then the steps
//! in order: insert (ids = row numbers), delete, replace (an upsert: the
//! engine contract's insert replaces an existing id), search (every query,
//! one `search_into` per query from one thread into a reused buffer, each
//! query timed). Ground truth, data loading and the memory reading after
//! each step are not timed.

use super::data::{ids, Data};
use super::engine::{policy, EngineRun};
use super::truth::Truth;
use super::{Op, Plan};
use crate::machine::{param_json, progress, rss_bytes};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;
use vectide_core::eval::recall_at_k;
use vectide_core::{Neighbor, RESERVED_ID};
use vectide_engines::{AnyIndex, ParamValue};

/// How a run goes beyond the plan.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Neighbours per query.
    pub k: usize,
    /// After each delete step, wait for the engine's consolidation
    /// (`maintain`, timed as the step's `consolidate_s`): the stability
    /// benchmark's setting.
    pub settle_after_deletes: bool,
    /// At the first search step, try these knob values in order (untimed)
    /// and keep the first whose recall@k reaches `target`, else the last.
    pub calibrate: Vec<usize>,
    pub target: f64,
    /// The engine has this process to itself (a worker process): memory is
    /// the resident set's growth. Otherwise (engines one after another in
    /// one process) the engine's own figure comes first.
    pub isolated: bool,
    /// Where a directory engine's temporary directory goes (default: the
    /// system's temporary directory).
    pub workdir: Option<PathBuf>,
}

/// `q`-quantile of sorted values, linear between ranks (NumPy's default).
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let pos = q * (sorted.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64)
}

/// One search step's answers: `nq × k` ids and each query's latency.
struct Searched {
    found: Vec<u64>,
    latencies: Vec<f64>,
}

/// The engine under the run, and the buffers its searches reuse.
struct Runner<'a> {
    e: &'a mut EngineRun,
    index: AnyIndex,
    data: Data<'a>,
    k: usize,
    out: Vec<Neighbor>,
    searched: Searched,
}

impl Runner<'_> {
    fn search(&mut self) -> vectide_core::Result<()> {
        let (k, dim) = (self.k, self.data.dim);
        let s = &mut self.searched;
        s.found.fill(RESERVED_ID);
        s.latencies.clear();
        for (q, query) in self.data.queries.chunks_exact(dim).enumerate() {
            let t0 = Instant::now();
            let res = self
                .index
                .search_into(query, k, &self.e.search, None, &mut self.out);
            s.latencies.push(t0.elapsed().as_secs_f64());
            res?;
            for (j, n) in self.out.iter().take(k).enumerate() {
                s.found[q * k + j] = n.id;
            }
        }
        Ok(())
    }

    /// Recall@k and recall@5 of the last search against `truth`.
    fn recalls(
        &self,
        truth: Option<&super::Truth>,
    ) -> Result<(Option<f64>, Option<f64>), vectide_core::Error> {
        let Some(t) = truth else {
            return Ok((None, None)); // an empty active set: nothing to find
        };
        let at = |kk: usize| {
            recall_at_k(
                self.searched.found.chunks_exact(self.k),
                t.ids.chunks_exact(t.k),
                kk,
            )
        };
        Ok((Some(at(t.k)?), if t.k >= 5 { Some(at(5)?) } else { None }))
    }
}

/// Runs `plan` on one engine against `truth` (the exact answers per search
/// step, `None` where nothing is active); returns its result document (the keys of
/// `python -m vectide.bench runbook`'s per-engine results).
pub fn run_engine(
    e: &mut EngineRun,
    data: &Data<'_>,
    plan: &Plan,
    truth: &[Option<Arc<Truth>>],
    opts: &RunOptions,
) -> Result<Value, String> {
    let k = opts.k;
    let rss0 = rss_bytes();
    let mut params = e.params.clone();
    // A directory engine runs in a temporary directory, removed with it.
    let dir = if e.desc.persistence.in_directory() {
        let base = opts.workdir.clone().unwrap_or_else(std::env::temp_dir);
        let d = tempfile::Builder::new()
            .prefix("vectide-runbook-")
            .tempdir_in(&base)
            .map_err(|err| format!("{}: a directory in {}: {err}", e.key, base.display()))?;
        let path = d.path().join("index");
        params.insert(
            "path".into(),
            ParamValue::Str(path.to_string_lossy().into_owned()),
        );
        Some(d)
    } else {
        None
    };
    let index = vectide_engines::create(e.desc.name, data.dim, data.metric, &params)
        .map_err(|err| format!("{}: {err}", e.key))?;
    let nq = data.n_queries();
    let mut r = Runner {
        e,
        index,
        data: *data,
        k,
        out: Vec::with_capacity(k),
        searched: Searched {
            found: vec![RESERVED_ID; nq * k],
            latencies: Vec::with_capacity(nq),
        },
    };
    let result = steps(&mut r, plan, truth, opts, rss0);
    let Runner { index, .. } = r;
    drop(index); // stops its background work before its directory goes
    drop(dir);
    result
}

fn steps(
    r: &mut Runner<'_>,
    plan: &Plan,
    truth: &[Option<Arc<Truth>>],
    opts: &RunOptions,
    rss0: Option<u64>,
) -> Result<Value, String> {
    let (k, nq) = (opts.k, r.data.n_queries());
    let key = r.e.key.clone();
    let bar = progress(plan.ops.len() as u64, &key);
    let mut steps: Vec<Value> = Vec::with_capacity(plan.ops.len());
    let mut totals: BTreeMap<&str, f64> = ["insert", "delete", "replace", "consolidate", "search"]
        .into_iter()
        .map(|op| (op, 0.0))
        .collect();
    let mut recalls: Vec<f64> = Vec::new();
    let mut peak_memory = 0u64;
    let mut calibration = Value::Null;
    let mut search_no = 0usize;
    for (i, op) in plan.ops.iter().enumerate() {
        let num = i + 1;
        let seq = num as u64;
        let err = |err: vectide_core::Error| format!("{key}: step {num} ({}): {err}", op.name());
        let mut row = Map::new();
        row.insert("step".into(), json!(num));
        row.insert("operation".into(), json!(op.name()));
        let count = match op {
            Op::Insert(rg) => {
                let (ids, x) = (ids(rg), r.data.slice(rg));
                let t0 = Instant::now();
                r.index.insert(seq, &ids, x).map_err(err)?;
                Some((rg.len(), t0.elapsed().as_secs_f64()))
            }
            Op::Delete(rg) => {
                let ids = ids(rg);
                let t0 = Instant::now();
                r.index.delete(seq, &ids).map_err(err)?;
                Some((rg.len(), t0.elapsed().as_secs_f64()))
            }
            Op::Replace { tags, rows } => {
                // An upsert: insert replaces the vector of an existing id.
                let (ids, x) = (ids(tags), r.data.slice(rows));
                let t0 = Instant::now();
                r.index.insert(seq, &ids, x).map_err(err)?;
                Some((tags.len(), t0.elapsed().as_secs_f64()))
            }
            Op::Search => None,
        };
        if let Some((count, secs)) = count {
            let mut cons = 0.0;
            if opts.settle_after_deletes && matches!(op, Op::Delete(_)) {
                let t1 = Instant::now();
                r.index.maintain().map_err(err)?;
                cons = t1.elapsed().as_secs_f64();
            }
            *totals.entry(op.name()).or_default() += secs;
            *totals.entry("consolidate").or_default() += cons;
            let total = secs + cons;
            row.insert("points".into(), json!(count));
            row.insert("seconds".into(), json!(total));
            row.insert("consolidate_s".into(), json!(cons));
            row.insert(
                "points_per_s".into(),
                json!((total > 0.0).then(|| count as f64 / total)),
            );
        } else {
            let t = truth
                .get(search_no)
                .ok_or_else(|| {
                    format!("{key}: step {num}: the ground truth has no such search step")
                })?
                .as_deref();
            if search_no == 0 && !opts.calibrate.is_empty() && r.e.knob.is_some() {
                // Untimed: choosing the knob is set-up.
                let mut sweep = Vec::new();
                for &v in &opts.calibrate {
                    r.e.set_knob(v)?;
                    r.search().map_err(err)?;
                    let recall = r.recalls(t).map_err(err)?.0;
                    sweep.push(json!({"knob": v, "recall": recall}));
                    if recall.is_some_and(|x| x >= opts.target) {
                        break;
                    }
                }
                calibration = json!({
                    "target": opts.target,
                    "sweep": sweep,
                    "chosen": r.e.knob_value(),
                });
            }
            r.search().map_err(err)?;
            let (recall, recall5) = r.recalls(t).map_err(err)?;
            search_no += 1;
            recalls.extend(recall);
            let lat = &r.searched.latencies;
            let total: f64 = lat.iter().sum();
            *totals.entry("search").or_default() += total;
            let mut sorted = lat.clone();
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
        let stats = r.index.stats().map_err(err)?;
        let rss = match (rss0, rss_bytes()) {
            (Some(a), Some(b)) => Some(b.saturating_sub(a)),
            _ => None,
        };
        let own = (stats.memory_bytes > 0).then_some(stats.memory_bytes as u64);
        let memory = if opts.isolated {
            rss.or(own)
        } else {
            own.or(rss)
        }
        .unwrap_or(0);
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
        let line = matches!(op, Op::Search).then(|| {
            let recall = row.get("recall").and_then(Value::as_f64);
            let qps = row.get("qps").and_then(Value::as_f64).unwrap_or(0.0);
            format!(
                "{key}: step {num}/{}: recall@{k} {}, {qps:.0} qps, memory {:.0} MB",
                plan.ops.len(),
                recall.map_or("-".to_string(), |r| format!("{r:.4}")),
                memory as f64 / 1e6
            )
        });
        steps.push(Value::Object(row));
        bar.inc(1);
        if let Some(line) = line.filter(|_| bar.is_hidden()) {
            eprintln!("{line}"); // not a terminal: a line per search step
        }
    }
    bar.finish_and_clear();
    let mut params = Map::new();
    params.insert("engine".into(), json!(r.e.desc.name));
    params.insert("version".into(), json!(env!("CARGO_PKG_VERSION")));
    params.insert("simd".into(), json!(vectide_core::distance::active_isa()));
    for (name, v) in r.index.params() {
        params.insert(name, param_json(v));
    }
    let search_knob = match (r.e.knob, r.e.knob_value()) {
        (Some(kn), Some(v)) => json!({ kn.name(): v }),
        _ => json!({}),
    };
    let avg = (!recalls.is_empty()).then(|| recalls.iter().sum::<f64>() / recalls.len() as f64);
    let min = recalls.iter().copied().reduce(f64::min);
    Ok(json!({
        "params": params,
        "consolidation_policy": policy(r.e.desc),
        "search_knob": search_knob,
        "calibration": calibration,
        "steps": steps,
        "avg_recall": avg,
        "min_recall": min,
        "seconds": totals.values().sum::<f64>(),
        "seconds_by_operation": totals,
        "peak_memory_bytes": peak_memory,
    }))
}
