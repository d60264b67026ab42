//! Streaming runbooks in the big-ann-benchmarks format: YAML, one
//! top-level key per dataset holding `max_pts` and steps numbered `1..N`
//! (`gt_url` is ignored), each with an `operation`:
//!
//! - `insert` / `delete`: `start`, `end` — rows `start..end`, ids = row numbers;
//! - `search`: no fields — the dataset's queries against the active set;
//! - `replace`: `tags_start`, `tags_end`, `ids_start`, `ids_end` — the active
//!   ids `tags_start..tags_end` take the vectors of rows `ids_start..ids_end`.
//!
//! [`parse`] reads the bytes of the file through `serde_norway` (its
//! recursion and alias-repetition limits, plus a node budget here, so a
//! hostile file is an error, never a panic or an exhausted memory);
//! [`check`] replays the runbook over the dataset's rows before anything
//! runs: the first problem is an error naming the step. Messages render
//! values as Python does (`'name'`, `['a', 'b']`): the Python package
//! raises them as they are.
//!
//! Then the run: [`ground_truth`] of every search step, [`run_engine`] (the
//! timed loop of one native engine), and [`document`] (the result file).
//!
//! Files: `yaml.rs` (the node tree, its budget, `repr`), `parse.rs` (the
//! runbook as written), `plan.rs` (the check and the plan), `data.rs` (the
//! rows and queries a run borrows), `truth.rs` (ground truth), `engine.rs`
//! (which engines run, built how), `run.rs` (the timed loop), `report.rs`
//! (the result document).

mod data;
mod engine;
mod parse;
mod plan;
mod report;
mod run;
mod truth;
mod yaml;

pub use data::Data;
pub use engine::{
    build_params, default_engines, is_native, policy, EngineRun, HNSW_FAMILY, VAMANA_FAMILY,
};
pub use parse::{parse, Runbook, Step};
pub use plan::{check, Counts, Op, Plan};
pub use report::{build_params_json, document, memory_method, SECONDS_DEFINITION};
pub use run::{quantile, run_engine, RunOptions};
pub use truth::{exact_engine, ground_truth, GroundTruth, Truth};

use std::fmt;
use std::path::Path;

/// The operations of a runbook, in the order error messages list them.
pub const OPERATIONS: [&str; 4] = ["insert", "delete", "search", "replace"];
/// The largest runbook file read (big-ann-benchmarks' largest are a few MB).
pub const MAX_FILE_BYTES: u64 = 64 << 20;
/// The most YAML nodes a runbook may hold once its aliases are expanded.
const MAX_NODES: usize = 8 << 20;

/// A runbook that cannot run on the dataset; the message names the step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunbookError(pub String);

impl fmt::Display for RunbookError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RunbookError {}

fn fail<T>(msg: impl Into<String>) -> Result<T, RunbookError> {
    Err(RunbookError(msg.into()))
}

/// Reads a runbook file (at most [`MAX_FILE_BYTES`]) and parses it.
pub fn load(path: &Path, key: Option<&str>) -> Result<Runbook, RunbookError> {
    use std::io::Read;
    let err = |e: std::io::Error| RunbookError(format!("{}: {e}", path.display()));
    let file = std::fs::File::open(path).map_err(err)?;
    let mut bytes = Vec::new();
    file.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(err)?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return fail(format!(
            "{}: larger than {} MiB; not a runbook",
            path.display(),
            MAX_FILE_BYTES >> 20
        ));
    }
    parse(&bytes, key).map_err(|e| RunbookError(format!("{}: {e}", path.display())))
}

#[cfg(test)]
mod tests;
