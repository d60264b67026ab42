//! The registry descriptor of engine `hnsw`, and the graph parameters that
//! `p-hnsw` and the paper baselines share with it.

use crate::params::HnswParams;
use crate::Hnsw;
use std::path::Path;
use vectide_core::engine::THREADS;
use vectide_core::{
    limits, EngineDescriptor, Knob, Metric, ParamKind, ParamSpec, Params, ParamsExt, Persistence,
    Result, VectorIndex,
};

/// `m`: graph degree.
pub const M: ParamSpec = ParamSpec {
    name: "m",
    kind: ParamKind::Int {
        min: limits::MIN_M as i64,
        max: limits::MAX_M as i64,
    },
    default: "16",
    doc: "neighbours per node on the upper layers (2m on layer 0)",
    source: "HNSW paper (Malkov & Yashunin 2018) and hnswlib",
};
/// `ef_construction`: candidate list while inserting.
pub const EF_CONSTRUCTION: ParamSpec = ParamSpec {
    name: "ef_construction",
    kind: ParamKind::Int {
        min: 1,
        max: limits::MAX_EF as i64,
    },
    default: "200",
    doc: "candidate-list size while inserting",
    source: "hnswlib's default",
};
/// `ef_search`: the default of the `ef` knob.
pub const EF_SEARCH: ParamSpec = ParamSpec {
    name: "ef_search",
    kind: ParamKind::Int {
        min: 1,
        max: limits::MAX_EF as i64,
    },
    default: "64",
    doc: "default candidate-list size of a search (the ef knob; raised to k)",
    source: "Vectide (recall ≈ 0.95 at k = 10 on glove-50)",
};
/// `seed`: level generator.
pub const SEED: ParamSpec = ParamSpec {
    name: "seed",
    kind: ParamKind::Int {
        min: 0,
        max: i64::MAX,
    },
    default: "0x5eedec7d",
    doc: "seed of the level generator (levels are a function of it and the insert counter)",
    source: "Vectide",
};
/// `consolidate_fraction`: when deletes are consolidated.
pub const CONSOLIDATE_FRACTION: ParamSpec = ParamSpec {
    name: "consolidate_fraction",
    kind: ParamKind::Float {
        min: 1e-9,
        max: 1.0,
    },
    default: "0.05",
    doc: "pending deletes, as a fraction of live points, that trigger a consolidation",
    source: "FreshDiskANN §6 (consolidation at a few percent of deletes)",
};
/// `repair_alpha`: α of the in-neighbour repair.
pub const REPAIR_ALPHA: ParamSpec = ParamSpec {
    name: "repair_alpha",
    kind: ParamKind::Float { min: 1.0, max: 4.0 },
    default: "1.0",
    doc: "α of the repair rule of consolidation (1 = HNSW's own heuristic)",
    source: "Vectide, measured under churn (see HnswParams::repair_alpha)",
};

static PARAMS: [ParamSpec; 7] = [
    M,
    EF_CONSTRUCTION,
    EF_SEARCH,
    SEED,
    CONSOLIDATE_FRACTION,
    REPAIR_ALPHA,
    THREADS,
];

/// Engine `hnsw`: the volatile HNSW index.
pub static HNSW: EngineDescriptor = EngineDescriptor {
    name: "hnsw",
    summary:
        "HNSW in memory (Malkov & Yashunin 2018), with delete consolidation; save/load to a file",
    persistence: Persistence::Volatile,
    params: &PARAMS,
    open_params: &["threads"],
    knobs: &[Knob::Ef],
    primary_knob: Some(Knob::Ef),
    create,
    open,
    detect,
    inspect,
};

/// The graph fields of checked parameters (other keys are left to the
/// caller); every absent one keeps its default.
pub fn graph_params(params: &Params) -> Result<HnswParams> {
    let d = HnswParams::default();
    let p = HnswParams {
        m: params.usize("m").unwrap_or(d.m),
        ef_construction: params.usize("ef_construction").unwrap_or(d.ef_construction),
        ef_search: params.usize("ef_search").unwrap_or(d.ef_search),
        seed: params.int("seed").map_or(d.seed, |s| s as u64),
        consolidate_fraction: params
            .float("consolidate_fraction")
            .unwrap_or(d.consolidate_fraction),
        repair_alpha: params
            .float("repair_alpha")
            .map_or(d.repair_alpha, |a| a as f32),
        threads: params.usize("threads"),
    };
    p.validate()?;
    Ok(p)
}

/// The graph parameters as [`Params`] (the inverse of [`graph_params`]).
pub fn graph_params_out(p: &HnswParams, threads: usize) -> Params {
    use vectide_core::ParamValue::{Float, Int};
    let mut out = Params::new();
    out.insert("m".into(), Int(p.m as i64));
    out.insert("ef_construction".into(), Int(p.ef_construction as i64));
    out.insert("ef_search".into(), Int(p.ef_search as i64));
    out.insert("seed".into(), Int(p.seed as i64));
    out.insert("consolidate_fraction".into(), Float(p.consolidate_fraction));
    // Through text, so that an f32 such as 1.2 reads back as 1.2, not 1.2000000476837158.
    out.insert(
        "repair_alpha".into(),
        Float(p.repair_alpha.to_string().parse().unwrap_or(1.0)),
    );
    out.insert("threads".into(), Int(threads as i64));
    out
}

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
