//! # vectide-dhnsw
//!
//! Vectide's `d-hnsw` engine, after d-HNSW (HotStorage '25, the seed
//! `../shared/seeds/001_*`): the vectors live in a **memory node**'s region
//! (`vectide memnode`), reached through the one-sided verbs of
//! `vectide-remote`; a **compute node** (this engine) keeps only a
//! meta-HNSW over the partitions' centroids, the label map and an LRU of
//! fetched sub-HNSWs.
//!
//! The rooms:
//! - [`params`]: [`DhnswParams`] and the schema [`PARAMS`];
//! - [`layout`]: the region's bytes (header, partition table, label map
//!   section, graph blobs and node records; `docs/format-dhnsw.md`),
//!   through the bounds-checked reader;
//! - [`subgraph`]: a blob deserialised into typed arrays behind the shared
//!   `Graph` trait (searched by `vectide-graph`'s traversal);
//! - `builder`: balanced k-means (a hard cap of ⌈N/K⌉ per partition), the
//!   sub-HNSWs and the meta-HNSW (built by `vectide-hnsw`), placement in
//!   pairs around shared gaps, written in doorbell chains, the header last;
//!   a full partition rebuilt alone at the region's end;
//! - `fetch`: partitions fetched in doorbell chains, one round trip each,
//!   or node by node (the naive baseline's `RemoteGraph`);
//! - `search`: batched search, grouped by partition, pipelined;
//! - `locks`: partitions taken and published by CAS of their state word,
//!   tombstones written under them, labels read back under them;
//! - `update`: inserts into the gaps and tombstone deletes, from any
//!   compute node, each published in the label map by CAS;
//! - [`labelmap`]: the remote label map (label → partition, slot,
//!   version), changed only by CAS;
//! - [`persist`]: save / open (the region's bytes in one checksummed file),
//!   and attaching to a region a memory node holds (a memory node with a
//!   backing file keeps what was flushed across its restarts);
//! - `state`: [`DHnsw`], its locks, LRU and timings;
//! - `engine`: the face, the [`VectorIndex`] implementation.
//!
//! An index is built from its first insert (the partitions need data);
//! later inserts go to the partition the meta-HNSW ranks first, into its
//! gap, and a partition whose gap is full is rebuilt with its live nodes at
//! the end of the region. With automatic K, an index whose live count calls
//! for twice its partitions is partitioned afresh into a new region.
//!
//! A compute node created with `region = NAME` that the memory node already
//! holds attaches to it (header, dimension and metric checked, the labels
//! read from the label map) and searches, reads and writes it like the
//! compute node that built it: writers take partitions by CAS of their
//! state word (`locks`), publish labels in the remote label map by CAS, and
//! readers check the state around what they read. Moving the index to a
//! new region is done by one compute node holding every partition.
//!
//! Durability (a memory node with a backing file): [`sites`] names every
//! FLUSH; `recovery` puts a region right after its memory node restarted;
//! [`writers`] keeps each named compute node's `durable_seq` in the region;
//! `lease` lets one owner (a database collection) at a time write a
//! region; `sweep` tombstones old nodes a stopped writer owed.

mod builder;
#[cfg(test)]
mod death_tests;
mod engine;
pub mod fetch;
#[cfg(test)]
mod interleave_tests;
pub mod labelmap;
pub mod layout;
mod lease;
mod locks;
pub mod params;
pub mod persist;
mod recovery;
mod search;
pub mod sites;
mod space;
mod state;
pub mod subgraph;
mod sweep;
mod switches;
#[cfg(test)]
mod test_transport;
mod update;
pub mod writers;

pub use params::{DhnswParams, Fetch, PARAMS};
pub use state::DHnsw;

use std::path::Path;
use vectide_core::engine::Medium;
use vectide_core::{EngineDescriptor, Knob, Metric, Params, Persistence, Result, VectorIndex};

/// Engine `d-hnsw`.
pub static DESCRIPTOR: EngineDescriptor = EngineDescriptor {
    name: "d-hnsw",
    summary: "d-HNSW (HotStorage'25): partitions as sub-HNSWs in a memory node's region, a meta-HNSW on the compute node, doorbell-batched and pipelined fetches; durable on a memory node with a backing file, several compute nodes writing one region; save/load to a file",
    persistence: Persistence::OnMemoryNode,
    medium: Medium::Remote,
    params: &PARAMS,
    open_params: params::OPEN_PARAMS,
    knobs: &[Knob::Ef, Knob::Nprobe],
    primary_knob: Some(Knob::Nprobe),
    create,
    open,
    detect,
    inspect: inspect_rows,
};

fn create(dim: usize, metric: Metric, params: &Params) -> Result<Box<dyn VectorIndex>> {
    let mut idx = DHnsw::connect(dim, metric, DhnswParams::from_params(params)?)?;
    persist::attach(&mut idx)?;
    Ok(Box::new(idx))
}

fn open(path: &Path, params: &Params) -> Result<Box<dyn VectorIndex>> {
    Ok(Box::new(persist::open(path, params)?))
}

fn detect(path: &Path) -> bool {
    path.is_file() && vectide_core::io::file_starts_with(path, persist::FILE_MAGIC)
}

fn inspect_rows(path: &Path) -> Result<Vec<(String, String)>> {
    let s = persist::read_saved(path)?;
    let mut rows = vec![
        ("engine", "d-hnsw".to_string()),
        ("format_version", persist::FILE_VERSION.to_string()),
        ("dim", s.dim.to_string()),
        ("metric", s.metric.name().to_string()),
        ("durable_seq", s.seq.to_string()),
        ("region", s.region.clone()),
        ("image_bytes", s.image.len().to_string()),
    ];
    if !s.image.is_empty() {
        let (h, table, _, locs) = persist::decode_image(&s.image, s.dim, s.seq)?;
        rows.extend(layout_rows(&h, &table, locs.len()));
    }
    Ok(rows.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
}

/// Rows describing a region's layout: partitions, fill, epochs, gaps.
pub fn layout_rows(
    h: &layout::Header,
    table: &[layout::Entry],
    live: usize,
) -> Vec<(&'static str, String)> {
    let rec = u64::from(h.record);
    let nodes: u64 = table.iter().map(|e| u64::from(e.n_base) + e.count).sum();
    let overflow: u64 = table.iter().map(|e| e.count).sum();
    let sizes: Vec<u64> = table
        .iter()
        .map(|e| u64::from(e.n_base) + e.count)
        .collect();
    let gaps: u64 = {
        let mut seen = std::collections::BTreeSet::new();
        table
            .iter()
            .filter(|e| seen.insert((e.gap_lo, e.gap_hi)))
            .map(|e| e.gap_hi - e.gap_lo)
            .sum()
    };
    vec![
        ("partitions", h.k.to_string()),
        ("live", live.to_string()),
        ("nodes", format!("{nodes} ({overflow} in overflow gaps)")),
        (
            "partition_nodes",
            format!(
                "min {} max {}",
                sizes.iter().min().copied().unwrap_or(0),
                sizes.iter().max().copied().unwrap_or(0)
            ),
        ),
        ("m, m0", format!("{}, {}", h.m, h.m0)),
        ("record_bytes", rec.to_string()),
        ("epoch", h.epoch.to_string()),
        (
            "partition_epochs",
            format!("max {}", table.iter().map(|e| e.epoch).max().unwrap_or(0)),
        ),
        ("gap_bytes", format!("{gaps} ({} used)", overflow * rec)),
        (
            "region_bytes",
            format!("{} ({} handed out)", h.region_size, h.alloc_end),
        ),
    ]
}
