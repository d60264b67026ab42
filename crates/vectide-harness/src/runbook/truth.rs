//! Ground truth of a runbook: the exact top-k of every query at every
//! search step, over the active set as the steps before it left it.
//!
//! The registry's exact in-memory engine mirrors the runbook (its inserts,
//! deletes and replaces, as upserts), and each distinct active set (the
//! ids and the rows they hold) is searched once, batched; search steps that
//! see the same set share one answer. Nothing here is timed.

use super::data::{ids, Data};
use super::{Op, Plan};
use crate::machine::progress;
use std::collections::HashMap;
use std::sync::Arc;
use vectide_core::{EngineDescriptor, SearchParams, RESERVED_ID};
use vectide_engines::{ParamValue, Params};

/// Exact top-k of every query at one active set: `k` ids per query (`k`
/// is the asked one, or the active set's size when that is smaller).
#[derive(Debug, Clone, PartialEq)]
pub struct Truth {
    pub k: usize,
    /// `nq × k`, row-major.
    pub ids: Vec<u64>,
}

/// The answer of every search step, in order (`None` where the active set
/// is empty: there is nothing to find).
#[derive(Debug, Clone)]
pub struct GroundTruth {
    pub steps: Vec<Option<Arc<Truth>>>,
    /// How many distinct active sets were searched.
    pub distinct: usize,
    /// The engine that computed it.
    pub engine: &'static str,
}

/// The registry's exact in-memory engine (the one without a search knob).
pub fn exact_engine() -> Result<&'static EngineDescriptor, String> {
    vectide_engines::REGISTRY
        .iter()
        .copied()
        .find(|d| d.primary_knob.is_none() && !d.persistence.in_directory())
        .ok_or_else(|| "no exact in-memory engine is registered for the ground truth".into())
}

/// Computes the ground truth of `plan` on `data` with `threads` threads.
pub fn ground_truth(
    data: &Data<'_>,
    plan: &Plan,
    k: usize,
    threads: usize,
) -> Result<GroundTruth, String> {
    use std::hash::{DefaultHasher, Hash, Hasher};
    const NONE: usize = usize::MAX;
    let exact = exact_engine()?;
    let mut params = Params::new();
    params.insert("threads".into(), ParamValue::Int(threads as i64));
    let index = vectide_engines::create(exact.name, data.dim, data.metric, &params)
        .map_err(|e| format!("ground truth ({}): {e}", exact.name))?;
    let mut row_of = vec![NONE; data.n_rows()];
    let mut live = 0usize;
    let mut seen: HashMap<(u64, u64), Arc<Truth>> = HashMap::new();
    let mut last: Option<Option<Arc<Truth>>> = None;
    let mut out = Vec::with_capacity(plan.counts.search);
    let bar = progress(plan.counts.search as u64, "truth");
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
                index.insert(seq, &ids(r), data.slice(r)).map_err(err)?;
                r.clone().for_each(|id| row_of[id] = id);
                live += r.len();
            }
            Op::Delete(r) => {
                index.delete(seq, &ids(r)).map_err(err)?;
                row_of[r.clone()].fill(NONE);
                live -= r.len();
            }
            Op::Replace { tags, rows } => {
                index
                    .insert(seq, &ids(tags), data.slice(rows))
                    .map_err(err)?;
                tags.clone()
                    .zip(rows.clone())
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
            // Two independent 64-bit hashes of (id, row) over the active set.
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
                    .search_batch(data.queries, kk, &SearchParams::default(), None)
                    .map_err(err)?;
                let mut ids = vec![RESERVED_ID; data.n_queries() * kk];
                for (q, hits) in found.iter().enumerate() {
                    for (j, n) in hits.iter().take(kk).enumerate() {
                        ids[q * kk + j] = n.id;
                    }
                }
                let t = Arc::new(Truth { k: kk, ids });
                seen.insert(key, t.clone());
                Some(t)
            }
        };
        last = Some(truth.clone());
        out.push(truth);
        bar.inc(1);
    }
    bar.finish_and_clear();
    Ok(GroundTruth {
        steps: out,
        distinct: seen.len(),
        engine: exact.name,
    })
}
