//! The result document of a runbook run: what the caller knows of the run
//! (dataset, runbook, knobs), the engines' results, and what every run
//! states alike (definitions, machine, date, the summary the issue tables
//! read). The CLI writes it for native engines; Python for native engines
//! and peers together.

use super::engine::{HNSW_FAMILY, VAMANA_FAMILY};
use crate::machine::{machine_info, utc_now};
use serde_json::{json, Map, Value};

/// What `seconds` sums.
pub const SECONDS_DEFINITION: &str = "sum of the engine's operation times (inserts, deletes, \
     replaces, consolidations, searches), each operation timed where it runs; ground truth, \
     process start and data loading excluded";

/// How memory is read (see `RunOptions::isolated`).
pub fn memory_method(isolated: bool) -> &'static str {
    if isolated {
        "the resident set (VmRSS) of the engine's own worker process minus its size before the \
         engine was created; the engine's own figure (stats memory_bytes) where the system gives none"
    } else {
        "the engine's own memory figure (stats memory_bytes) after the step; where an engine \
         reports none, VmRSS of the process minus VmRSS before the engine was created"
    }
}

/// The build parameters every run gives the engines that take them.
pub fn build_params_json() -> Value {
    let family = |f: &[(&str, f64)]| -> Map<String, Value> {
        f.iter()
            .map(|(k, v)| {
                let v = if v.fract() == 0.0 {
                    json!(*v as i64)
                } else {
                    json!(v)
                };
                (k.to_string(), v)
            })
            .collect()
    };
    json!({"vamana_family": family(&VAMANA_FAMILY), "hnsw_family": family(&HNSW_FAMILY)})
}

/// The whole document: `head` (an object with at least `k`) and the
/// results by engine, in run order.
pub fn document(head: Value, results: Map<String, Value>, isolated: bool) -> Result<Value, String> {
    let Value::Object(mut doc) = head else {
        return Err("the report's head must be an object".into());
    };
    let k = doc
        .get("k")
        .and_then(Value::as_u64)
        .ok_or("the report's head names no k")?;
    let by = |field: &str| -> Map<String, Value> {
        results
            .iter()
            .map(|(name, r)| (name.clone(), r.get(field).cloned().unwrap_or(Value::Null)))
            .collect()
    };
    let mut summary = Map::new();
    summary.insert(format!("avg_recall{k}"), Value::Object(by("avg_recall")));
    summary.insert("seconds".into(), Value::Object(by("seconds")));
    summary.insert(
        "peak_memory_bytes".into(),
        Value::Object(by("peak_memory_bytes")),
    );
    doc.entry("benchmark").or_insert(json!("runbook"));
    doc.insert("build_params".into(), build_params_json());
    doc.insert("policies".into(), Value::Object(by("consolidation_policy")));
    doc.insert("seconds_definition".into(), json!(SECONDS_DEFINITION));
    doc.insert("memory_method".into(), json!(memory_method(isolated)));
    // A front end that knows more of the machine (Python's version, say)
    // says so in the head.
    doc.entry("machine").or_insert_with(machine_info);
    doc.insert("simd".into(), json!(vectide_core::distance::active_isa()));
    doc.entry("date").or_insert_with(|| json!(utc_now()));
    doc.insert("engines".into(), Value::Object(results));
    doc.insert("summary".into(), Value::Object(summary));
    Ok(Value::Object(doc))
}
