//! # vectide-hnsw
//!
//! Vectide's in-memory HNSW engine (`engine="hnsw"`), after Malkov &
//! Yashunin, "Efficient and robust approximate nearest neighbor search using
//! Hierarchical Navigable Small World graphs" (TPAMI 2018).
//!
//! The rooms of this crate, as in every engine crate:
//! - [`params`]: [`HnswParams`] and their defaults (`m = 16`,
//!   `ef_construction = 200`), shared by the HNSW family in
//!   `vectide_graph::hnsw_params`;
//! - layout: the slot arrays (vectors, atomic neighbour lists, labels,
//!   states) and the concurrency protocol that lets searches run without locks
//!   while inserts link new nodes live in `vectide_graph::mem`, shared with
//!   `fresh-vamana`;
//! - `builder`: parallel batch insert (rayon) with per-node locks, HNSW's
//!   neighbour-selection heuristic, upsert publication;
//! - `search`: greedy descent and the filtered best-first layer search;
//! - `update`: deletes and their consolidation;
//! - `state`: [`Hnsw`], its locks and its inherent methods (every other
//!   room imports it; it imports none of them); `engine`: the face, its
//!   [`VectorIndex`](vectide_core::VectorIndex) implementation;
//! - [`persist`]: save/load (`docs/format-hnsw.md`).
//!
//! ## Deletes keep the graph navigable
//! A delete is first a tombstone: the node is never returned but is still
//! walked through, so the graph stays connected. Tombstones do not live
//! forever: once they exceed [`HnswParams::consolidate_fraction`] of the live
//! points (5 % by default), a consolidation repairs every list that names a
//! deleted node, filling the freed room from the deleted node's own surviving
//! neighbours under the α-rule (FreshDiskANN's Algorithm 4, with HNSW's α = 1,
//! measured better than 1.2 on HNSW graphs), moves a
//! deleted entry point, relinks any live node the repair left unreachable
//! from the entry point, waits for in-flight searches, and returns the slots
//! to the allocator. New inserts take reclaimed slots first, so the slots
//! in use stay near the live count and the graph never accumulates dead nodes.
//! We chose repair + reuse rather than hnswlib's `replace_deleted` (which
//! reuses a slot without repairing the graph around the deleted node) because
//! the repair keeps recall steady under heavy churn; the churn benchmark in
//! `make demo` measures it.
//!
//! ## Upserts and replay
//! Inserting an existing id links a new node, then atomically (under the id
//! map's lock) switches the id to it and retires the old node. Every id
//! remembers the sequence number that wrote it; an insert or delete that is
//! not newer is skipped, which makes a WAL replay idempotent.
//!
//! ## Distances
//! "Smaller is closer": squared L2, `1 - cos` (vectors normalised at insert),
//! `-dot`.

mod builder;
pub mod descriptor;
mod engine;
mod export;
mod graph;
pub mod persist;
mod search;
mod state;
mod update;

pub use builder::Progress;
pub use descriptor::HNSW;
pub use export::GraphExport;
pub use persist::{inspect, FileInfo, FORMAT_VERSION};
pub use state::Hnsw;
pub use update::GraphCheck;
pub use vectide_graph::hnsw_params as params;
pub use vectide_graph::HnswParams;
