//! # vectide-phnsw: P-HNSW, crash-consistent HNSW in a persistent region (`engine="p-hnsw"`)
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
//! upserts, §4.3), `update` (deletes), `consolidate` (repair around deleted
//! nodes and slot reuse), `rooms` (the free upper-list room consolidations
//! find and inserts reuse), `recovery` (§5), `state` (the
//! struct the other rooms work on: state, create/open, search; it imports
//! only the layout, the logs and the label map), `engine` (the face: the
//! `VectorIndex` implementation), `check` (structural checker) and `crashtest` (a single-writer
//! harness that crashes at every fence of a small workload, with the
//! mutation check; test builds only, feature `crash-harness`; the generic
//! kit behind `vectide crash-test` is `vectide-crashkit`).
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
//!   `NONE`, so the claim is a DRAM-side CAS only; persisting it would be a
//!   fence no reader of the media can observe.
//! - **NLog entries are claimed by a DRAM flag** and released only after the
//!   fence that makes their `NONE` durable. The paper's claim is a CAS on the
//!   state word, which frees an entry as soon as `NONE` is stored: another
//!   thread could then write its content into the entry while the old
//!   operation's `LOGGED` / `N_COMPLETE` was still the durable state, and a
//!   crash could leave that state over a mix of both contents (a line reaches
//!   persistent memory in 8-byte pieces), which recovery would redo.
//! - **Allocation words** (next slot, upper next) move by CAS, and only once
//!   their file holds the room: a word beyond its file (stored by one thread
//!   before it grew the file, then persisted by another's fence, or left by a
//!   SIGKILL) would make the index fail to open.
//! - **Deletes and upserts** are logged in the NLog too (kinds `DELETE`,
//!   `UPSERT`); the paper covers inserts only. Deleted nodes stay as
//!   tombstones (the paper's delete flag) until a consolidation
//!   (`consolidate`, which the paper does not have) repairs the lists that
//!   name them under the NlistLog, marks them `UNLINKED` and hands their
//!   slots to inserts.
//! - **Label map.** A flat linear-probing table with self-validating buckets
//!   and rebuild-and-switch growth instead of CCEH (see `labels`).
//! - **Live count.** Each NLog entry carries a counter; an operation sets its
//!   entry's counter to `before ± 1` (the `before` value is in the log, so
//!   the redo is idempotent); `len()` sums the counters.
//! - **Sequence numbers** (the paper has none; `VectorIndex` does). Each
//!   node records the number of its write, and an upsert (delete) that is
//!   not newer than (older than) its label's node is skipped as a replay.
//!   The durable word is a low watermark: with concurrent writers, nodes
//!   numbered above it survive a crash (operations recovery completed, or
//!   that finished while a lower number was in flight). A caller's next
//!   numbers come from the watermark (a database replays its log after it;
//!   `vectide.Index` counts up from it), so they may repeat those numbers
//!   for new operations. Numbers recorded before an open therefore count
//!   only up to the watermark of that open (`PHnsw::recorded_seq`; the nodes
//!   are the slots allocated before the open), and a replayed record whose
//!   effect survived is applied again, which in log order is harmless.
//!   Every writer that acknowledges persists the durable word itself before
//!   its last fence (unless a completed fence already covered its value):
//!   the word another writer raised is not durable until that writer
//!   fences.

mod builder;
pub mod check;
mod consolidate;
#[cfg(feature = "crash-harness")]
pub mod crashtest;
pub mod descriptor;
mod engine;
pub mod inspect;
mod labels;
pub mod layout;
mod log;
mod recovery;
mod rooms;
mod state;
#[cfg(test)]
mod tests;
mod update;

pub use builder::APPLY_FAULT;
pub use descriptor::P_HNSW;
pub use recovery::RecoveryReport;
pub use state::{Breakdown, PHnsw, PHnswParams};
pub mod baselines;
