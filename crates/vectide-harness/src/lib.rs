//! # vectide-harness
//!
//! The one core of Vectide's benchmarks, called by the `vectide` CLI and,
//! through the extension, by the Python package (`vectide.runbook`), so
//! that a runbook means the same thing, and fails with the same message,
//! whichever front end reads it.
//!
//! - [`runbook`]: streaming runbooks in the big-ann-benchmarks format:
//!   YAML parsing with hostile-input limits, the check of a runbook against
//!   a dataset, the plan that runs, its ground truth, the timed loop of a
//!   native engine and the result document.
//! - [`machine`]: what a result says of the machine and the run (CPU, SIMD
//!   level, resident set, time), and the progress bar.

pub mod machine;
pub mod runbook;
