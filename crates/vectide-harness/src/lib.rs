//! # vectide-harness
//!
//! The one core of Vectide's benchmarks, called by the `vectide` CLI and,
//! through the extension, by the Python package (`vectide.runbook`), so
//! that a runbook means the same thing, and fails with the same message,
//! whichever front end reads it.
//!
//! - [`runbook`]: streaming runbooks in the big-ann-benchmarks format:
//!   YAML parsing with hostile-input limits, the check of a runbook against
//!   a dataset, and the plan that runs.

pub mod runbook;
