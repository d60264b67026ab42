//! # P-HNSW: crash-consistent HNSW in a persistent region (`engine="p-hnsw"`)
//!
//! After Lee et al., "P-HNSW: Crash-Consistent HNSW for Vector Databases on
//! Persistent Memory" (Appl. Sci. 2025, 15(19), 10554). The whole graph —
//! layer-0 node blocks with their vectors, upper-layer lists, the label map
//! and the logs — lives in memory-mapped region files
//! (`vectide_storage::Region`), made durable by `persist` + `fence` on a
//! [`vectide_storage::Media`]: `clwb`/`sfence` (`persist="pmem"`: DAX, or
//! its DRAM emulation on `/dev/shm`, as the paper measured) or `msync` with
//! group commit (`persist="msync"`: ordinary disks). The same code runs on
//! the crash simulator in tests.
//!
//! Rooms: `layout` (the byte layout, `docs/format-phnsw.md`), `log` (NLog and
//! NlistLog), `labels` (persistent label map), `builder` (inserts and
//! upserts, §4.3), `update` (deletes), `recovery` (§5), `engine` (state,
//! open, search), `check` (structural checker) and `crashtest` (the crash
//! simulator harness behind `vectide crash-test`).
//!
//! ## Where we deviate from the paper, and why
//! - **Fence sharing for in-edges.** The paper fences every NlistLog entry's
//!   transitions one list at a time. We keep one NlistLog entry per
//!   neighbour-list update and the same states, but the (up to
//!   `nlist_entries / nlog_entries`) lists one insert changes share their
//!   four fences: the neighbours' locks are taken together in a global
//!   order. Recovery is unchanged (each entry is undone on its own). With
//!   ~20 lists per insert this turns ~60 fences into 4 — on pmem a few
//!   percent of insert time, with `msync` the difference between usable and
//!   not.
//! - **Publication after the in-edges.** §4.3 adds the label to the map right
//!   after `LOGGED`; we publish (map, node `LIVE`, replaced node `DELETED`,
//!   live count, entry point) after the in-edges, still under the NLog entry
//!   and redone by recovery. A reader then never finds a label whose node is
//!   not yet reachable, which makes upserts atomic from the reader's view.
//! - **`LOGGING` is not persisted.** Recovery treats `LOGGING` exactly like
//!   `NONE`, so the claim is a DRAM-visible CAS only; persisting it would be
//!   a fence no reader of the media can observe.
//! - **Deletes and upserts** are logged in the NLog too (kinds `DELETE`,
//!   `UPSERT`); the paper covers inserts only. Deleted nodes stay as
//!   tombstones (the paper's delete flag).
//! - **Label map.** A flat linear-probing table with self-validating buckets
//!   and rebuild-and-switch growth instead of CCEH (see `labels`).
//! - **Live count.** Each NLog entry carries a counter; an operation sets its
//!   entry's counter to `before ± 1` (the `before` value is in the log, so
//!   the redo is idempotent); `len()` sums the counters.

mod builder;
pub mod check;
pub mod crashtest;
mod engine;
pub mod inspect;
mod labels;
pub mod layout;
mod log;
mod recovery;
mod update;

pub use engine::{Breakdown, PHnsw, PHnswParams};
pub use recovery::RecoveryReport;
