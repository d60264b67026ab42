//! The durable-engine kit: what every engine that keeps its state in
//! files of its own shares.
//!
//! - [`envelope`]: sealed files (magic, version, CRC, end marker) for
//!   manifests and snapshots, checked whole before a field is read;
//! - [`record`]: the one record codec of every log (an engine's redo log,
//!   a baseline's log, the database's commit log);
//! - [`redo`]: [`RedoLog`], an engine's redo log of insert and delete calls
//!   over a [`crate::Wal`], and the recovery of its whole calls;
//! - [`replay`]: recovery by replay of those calls after the checkpoint
//!   that covers a sequence number, inserts batched.
//!
//! Users: `fresh-diskann`, `spfresh` (and its SPANN variants), the P-HNSW
//! baselines, and the database (record codec, replay batching).

pub mod envelope;
pub mod record;
pub mod redo;
pub mod replay;

pub use envelope::Envelope;
pub use redo::{
    await_sync, read_calls, select_rows, summarize, LogOp, LogSummary, Recovered, RedoLog,
};
pub use replay::{replay, Batcher, Replayed};
