//! # vectide-diskann
//!
//! FreshDiskANN's disk side (Singh et al., 2021, §5; DiskANN, Subramanya et
//! al., NeurIPS 2019, §3): the SSD-resident **long-term index** (LTI).
//!
//! - [`layout`]: the bytes (`docs/format-lti.md`): a header sector, node
//!   records (full-precision vector, label, neighbour ids) packed into
//!   4 KiB sectors with a CRC each, and the PQ file beside it;
//! - [`lti`]: writing an LTI from a graph (`fresh-vamana`'s export), opening
//!   one (PQ codes in RAM), the node cache near the start node, and the
//!   beam search (W sector reads per hop as one batch, PQ distances for
//!   routing, exact re-ranking of expanded nodes) with per-query stats.
//!
//! - [`merge`]: StreamingMerge (§5.3–5.4): Delete, Insert and Patch phases
//!   over the LTI read block by block, RAM growing with the change set;
//!
//! and the engine `fresh-diskann` (§5.1–5.6), in the rooms every engine
//! crate has:
//! - [`params`]: [`FreshDiskannParams`] (the graph's R, L, α as
//!   `fresh-vamana`; beam width, PQ bytes, freeze and merge thresholds);
//! - layout: [`layout`] (the LTI) and [`manifest`] (the manifest and the
//!   redo log records), `docs/format-lti.md` and
//!   `docs/format-fresh-diskann.md`;
//! - builder: the first LTI is a static Vamana build of the temp indexes'
//!   points ([`lti::write`]); later ones are merges ([`merge`]);
//! - search, update: in `engine` (every part searched, deleted copies
//!   filtered by the location map, results merged);
//! - `recovery`: manifest, LTI, RO snapshots, redo-log replay;
//! - `engine`: [`FreshDiskann`] and its `VectorIndex` implementation.
//!
//! An upsert of a point in the LTI is a delete plus an insert: the old node
//! joins the DeleteList, the new vector goes to the RW-TempIndex, and the
//! next merge removes the one and adds the other.

#![deny(clippy::undocumented_unsafe_blocks)]

mod engine;
pub mod layout;
pub mod lti;
pub mod manifest;
pub mod merge;
pub mod params;
mod read;
mod recovery;
mod state;
mod stats;
mod switch;
mod write;

pub use engine::FreshDiskann;
pub use layout::Header;
pub use lti::{GraphSource, Lti, QueryStats, Scratch};
pub use params::{FreshDiskannParams, OpenKnobs, PARAMS};
pub use write::APPLY_FAULT;

use std::path::Path;
use vectide_core::{
    EngineDescriptor, Error, Knob, Metric, Params, ParamsExt, Persistence, Result, VectorIndex,
};

/// Engine `fresh-diskann`: FreshDiskANN in a directory.
pub static DESCRIPTOR: EngineDescriptor = EngineDescriptor {
    name: "fresh-diskann",
    summary: "FreshDiskANN (2021): an SSD long-term index with PQ in RAM, fresh-vamana temp indexes, StreamingMerge in the background, a redo log",
    persistence: Persistence::DurableOnAck,
    medium: vectide_core::engine::Medium::Ssd,
    params: &PARAMS,
    open_params: &["threads", "path", "merge", "merge_l", "merge_refill", "log"],
    knobs: &[Knob::Ef, Knob::BeamWidth],
    primary_knob: Some(Knob::Ef),
    create,
    open,
    detect: FreshDiskann::exists,
    inspect: inspect_rows,
};

fn dir_of(params: &Params) -> Result<std::path::PathBuf> {
    params
        .string("path")
        .map(std::path::PathBuf::from)
        .ok_or_else(|| {
            Error::invalid("engine \"fresh-diskann\" lives in a directory: pass path=DIR")
        })
}

fn create(dim: usize, metric: Metric, params: &Params) -> Result<Box<dyn VectorIndex>> {
    let p = FreshDiskannParams::from_params(params)?;
    Ok(Box::new(FreshDiskann::create(
        &dir_of(params)?,
        dim,
        metric,
        p,
    )?))
}

fn open(path: &Path, params: &Params) -> Result<Box<dyn VectorIndex>> {
    Ok(Box::new(FreshDiskann::open(
        path,
        params::OpenKnobs::from_params(params)?,
    )?))
}

/// `vectide inspect` of a directory: the manifest, the LTI header, the
/// snapshots and the redo log.
fn inspect_rows(path: &Path) -> Result<Vec<(String, String)>> {
    let m = manifest::Manifest::read(path)?;
    let mut rows = vec![
        ("engine", "fresh-diskann".to_string()),
        (
            "manifest",
            format!("version {} (CRC verified)", manifest::VERSION),
        ),
        ("metric", m.metric.name().to_string()),
        ("dim", m.dim.to_string()),
        ("r", m.params.graph.r.to_string()),
        ("l_build", m.params.graph.l_build.to_string()),
        ("alpha", m.params.graph.alpha.to_string()),
        ("beam_width", m.params.beam_width.to_string()),
        ("pq_bytes", m.params.pq_bytes.to_string()),
        ("lti_generation", m.lti_gen.to_string()),
        ("ro_snapshots", format!("{:?}", m.ro)),
        ("rw_serial", m.rw.to_string()),
        ("covered_seq", m.covered_seq.to_string()),
        ("delete_list", m.lti_dead.len().to_string()),
        ("ro_deleted", m.ro_dead.len().to_string()),
    ];
    if m.lti_gen > 0 {
        let f = vectide_storage::block::DirectFile::open(
            &manifest::lti_file(path, m.lti_gen),
            false,
            engine::LTI_SYNC,
        )?;
        let lti = Lti::open(Box::new(f), &manifest::pq_file(path, m.lti_gen))?;
        let h = lti.header();
        rows.push(("lti_nodes", h.nodes.to_string()));
        rows.push(("lti_max_degree", h.max_degree.to_string()));
        rows.push(("lti_nodes_per_sector", h.nodes_per_sector().to_string()));
        rows.push(("lti_sectors", (1 + h.data_sectors()).to_string()));
        rows.push(("lti_durable_seq", h.durable_seq.to_string()));
        rows.push(("pq_ram_bytes", lti.memory_bytes().to_string()));
    }
    for &s in &m.ro {
        let i = vectide_vamana::inspect(&manifest::temp_file(path, s))?;
        rows.push((
            "ro_snapshot",
            format!(
                "temp-{s}.fv: {} live, durable_seq {}",
                i.live, i.durable_seq
            ),
        ));
    }
    let log = manifest::log_file(path, m.rw);
    rows.push((
        "redo_log",
        if log.exists() {
            let l = vectide_storage::durable::summarize(&log, m.dim)?;
            format!(
                "redo-{}.log: {} calls, {} bytes{}",
                m.rw,
                l.calls,
                l.bytes,
                if l.torn { " (torn tail)" } else { "" }
            )
        } else {
            "none (the database's commit log holds the writes)".into()
        },
    ));
    Ok(rows.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
}
