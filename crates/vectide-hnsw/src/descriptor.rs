//! The registry descriptor of engine `hnsw`. Its graph parameter specs live
//! in `vectide_graph::hnsw_params`, shared with `p-hnsw` and the baselines.

use crate::Hnsw;
use std::path::Path;
use vectide_core::engine::THREADS;
use vectide_core::{
    EngineDescriptor, Knob, Metric, ParamSpec, Params, ParamsExt, Persistence, Result, VectorIndex,
};
use vectide_graph::hnsw_params::{
    graph_params, CONSOLIDATE_FRACTION, EF_CONSTRUCTION, EF_SEARCH, M, QUANTIZATION, REPAIR_ALPHA,
    SEED,
};

static PARAMS: [ParamSpec; 8] = [
    M,
    EF_CONSTRUCTION,
    EF_SEARCH,
    SEED,
    CONSOLIDATE_FRACTION,
    REPAIR_ALPHA,
    QUANTIZATION,
    THREADS,
];

/// Engine `hnsw`: the volatile HNSW index.
pub static HNSW: EngineDescriptor = EngineDescriptor {
    name: "hnsw",
    summary:
        "HNSW in memory (Malkov & Yashunin 2018), with delete consolidation; save/load to a file",
    persistence: Persistence::Volatile,
    medium: vectide_core::engine::Medium::Ram,
    params: &PARAMS,
    open_params: &["threads"],
    knobs: &[Knob::Ef],
    primary_knob: Some(Knob::Ef),
    create,
    open,
    detect,
    inspect,
};

fn create(dim: usize, metric: Metric, params: &Params) -> Result<Box<dyn VectorIndex>> {
    Ok(Box::new(Hnsw::new(dim, metric, graph_params(params)?)?))
}

fn open(path: &Path, params: &Params) -> Result<Box<dyn VectorIndex>> {
    Ok(Box::new(Hnsw::load(path, params.usize("threads"))?))
}

fn detect(path: &Path) -> bool {
    path.is_file() && vectide_core::io::file_starts_with(path, crate::persist::MAGIC)
}

fn inspect(path: &Path) -> Result<Vec<(String, String)>> {
    let i = crate::persist::inspect(path)?;
    let rows = [
        ("engine", "hnsw".to_string()),
        (
            "magic",
            String::from_utf8_lossy(crate::persist::MAGIC).into_owned(),
        ),
        ("format_version", i.format_version.to_string()),
        ("metric", i.metric.name().to_string()),
        ("dim", i.dim.to_string()),
        ("m", i.m.to_string()),
        ("ef_construction", i.ef_construction.to_string()),
        ("ef_search", i.ef_search.to_string()),
        ("quantization", i.quantization.name().to_string()),
        ("slots", i.slots.to_string()),
        ("live", i.live.to_string()),
        ("deleted_pending", i.deleted_pending.to_string()),
        ("free_slots", i.free.to_string()),
        (
            "entry_slot",
            i.entry_slot.map_or("none".into(), |s| s.to_string()),
        ),
        ("max_level", i.max_level.to_string()),
        ("durable_seq", i.durable_seq.to_string()),
        ("file_bytes", i.file_bytes.to_string()),
        ("checksum_crc32", format!("{:08x} (verified)", i.checksum)),
    ];
    Ok(rows.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
}
