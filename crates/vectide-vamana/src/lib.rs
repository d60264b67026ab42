//! # vectide-vamana
//!
//! Vectide's FreshVamana engine (`engine="fresh-vamana"`): the streaming
//! graph index of Singh, Subramanya, Krishnaswamy and Simhadri,
//! "FreshDiskANN: A Fast and Accurate Graph-Based ANN Index for Streaming
//! Similarity Search" (2021), §3–§4, in memory. Its long-term SSD index and
//! StreamingMerge build on it in the FreshDiskANN engine.
//!
//! The rooms of this crate, as in every engine crate:
//! - [`params`]: [`VamanaParams`] and the schema (`r = 64`, `l_build = 75`,
//!   `alpha = 1.2` from §6.2);
//! - layout: one graph layer of out-degree `r` in the shared in-memory
//!   store `vectide_graph::mem` (vectors on cache lines, atomic neighbour
//!   lists read without locks, a lock per node for writers);
//! - `builder`: Insert (Algorithm 2: GreedySearch, RobustPrune, back-edges
//!   under per-node locks, in parallel) and the static Vamana build of a
//!   bulk load into an empty index;
//! - search: GreedySearch (Algorithm 1) from the frozen start node, with
//!   filter admission, in `engine`;
//! - `update`: lazy deletes into the DeleteList and their consolidation
//!   (Algorithm 4, in parallel, slot reuse), plus the structural checker;
//! - [`persist`]: save/load (`docs/format-fresh-vamana.md`); a volatile
//!   engine recovers by loading its last save, the database replays its
//!   WAL after it;
//! - `engine`: [`FreshVamana`] and its [`VectorIndex`] implementation.
//!
//! Upserts retire the nodes they replace into the DeleteList, so an insert
//! batch also consolidates once the DeleteList passes the threshold.
//!
//! ## The start node
//! As DiskANN's "frozen points", the index navigates from a node of its own:
//! a copy of the medoid of the first batch, never returned and never
//! deleted, so that deleting any point never moves the entry of searches.
//!
//! ## Where we deviate from the paper, and why
//! - **Deleted nodes are not candidates of an insert's RobustPrune.** The
//!   paper's Algorithm 2 prunes over the whole visited set; we leave nodes
//!   waiting for consolidation out of new lists (they still route
//!   searches), since consolidation would remove those edges anyway.
//! - **A new node always gets an in-edge.** When the pruning of every
//!   back-edge drops it (a point far from all others), its last neighbour
//!   keeps the edge anyway, in the slack its pruned list leaves, so an
//!   upsert is found at once;
//!   and consolidations (and a bulk build) end with a reachability walk
//!   that links any node pruning left without an in-edge (duplicates of a
//!   kept neighbour are never kept by the α-rule).
//! - **Lists have slack.** A back-edge is appended while the list holds
//!   fewer than `1.3·r` ids and pruned back to `r` only past that, as in
//!   DiskANN's code (`GRAPH_SLACK_FACTOR`); the paper prunes at `r`.
//! - **Inner product prunes with α = 1.** Its distances can be negative,
//!   where a scaled threshold has no meaning.
//!
//! ## Distances
//! "Smaller is closer": squared L2, `1 − cos` (vectors normalised at
//! insert), `−dot`. α scales these distances as DiskANN's code does.

mod builder;
mod engine;
pub mod export;
pub mod params;
pub mod persist;
mod update;

pub use builder::Progress;
pub use engine::FreshVamana;
pub use export::{GraphExport, START_LABEL};
pub use params::{VamanaParams, PARAMS};
pub use persist::{inspect, FileInfo, FORMAT_VERSION, MAGIC};
pub use update::GraphCheck;

use std::path::Path;
use vectide_core::{
    EngineDescriptor, Knob, Metric, Params, ParamsExt, Persistence, Result, VectorIndex,
};

/// Engine `fresh-vamana`: FreshVamana in memory.
pub static DESCRIPTOR: EngineDescriptor = EngineDescriptor {
    name: "fresh-vamana",
    summary: "FreshVamana in memory (FreshDiskANN 2021): RobustPrune with α, lazy deletes, parallel delete consolidation; save/load to a file",
    persistence: Persistence::Volatile,
    medium: vectide_core::engine::Medium::Ram,
    params: &PARAMS,
    open_params: &["threads"],
    knobs: &[Knob::Ef],
    primary_knob: Some(Knob::Ef),
    create,
    open,
    detect,
    inspect: inspect_rows,
};

fn create(dim: usize, metric: Metric, params: &Params) -> Result<Box<dyn VectorIndex>> {
    Ok(Box::new(FreshVamana::new(
        dim,
        metric,
        VamanaParams::from_params(params)?,
    )?))
}

fn open(path: &Path, params: &Params) -> Result<Box<dyn VectorIndex>> {
    Ok(Box::new(FreshVamana::load(path, params.usize("threads"))?))
}

/// A file whose first eight bytes are [`MAGIC`].
fn detect(path: &Path) -> bool {
    path.is_file() && vectide_core::io::file_starts_with(path, MAGIC)
}

fn inspect_rows(path: &Path) -> Result<Vec<(String, String)>> {
    let i = inspect(path)?;
    let rows = [
        ("engine", "fresh-vamana".to_string()),
        ("magic", String::from_utf8_lossy(MAGIC).into_owned()),
        ("format_version", i.format_version.to_string()),
        ("metric", i.metric.name().to_string()),
        ("dim", i.dim.to_string()),
        ("r", i.params.r.to_string()),
        ("l_build", i.params.l_build.to_string()),
        ("l_search", i.params.l_search.to_string()),
        ("alpha", i.params.alpha.to_string()),
        ("slots", i.slots.to_string()),
        ("live", i.live.to_string()),
        ("deleted_pending", i.deleted_pending.to_string()),
        ("free_slots", i.free.to_string()),
        (
            "start_slot",
            i.start_slot.map_or("none".into(), |s| s.to_string()),
        ),
        ("durable_seq", i.durable_seq.to_string()),
        ("file_bytes", i.file_bytes.to_string()),
        ("checksum_crc32", format!("{:08x} (verified)", i.checksum)),
    ];
    Ok(rows.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
}
