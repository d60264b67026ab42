//! The registry descriptor of engine `p-hnsw`.

use super::{PHnsw, PHnswParams};
use std::path::{Path, PathBuf};
use vectide_core::engine::{PATH, THREADS};
use vectide_core::{
    limits, EngineDescriptor, Error, Knob, Metric, ParamKind, ParamSpec, ParamValue, Params,
    ParamsExt, Persistence, Result, VectorIndex,
};
use vectide_graph::hnsw_params::{
    graph_params, graph_params_out, EF_CONSTRUCTION, EF_SEARCH, M, SEED,
};
use vectide_storage::PersistMode;

/// `persist`: how the regions become durable.
pub const PERSIST: ParamSpec = ParamSpec {
    name: "persist",
    kind: ParamKind::Choice(&["pmem", "msync"]),
    default: "pmem",
    doc: "pmem: clwb + sfence (DAX or /dev/shm); msync: msync of dirty pages at each fence (disks)",
    source: "P-HNSW (Appl. Sci. 2025) targets pmem; msync is Vectide's port to ordinary disks",
};

static PARAMS: [ParamSpec; 9] = [
    M,
    EF_CONSTRUCTION,
    EF_SEARCH,
    SEED,
    ParamSpec {
        name: "nlog_entries",
        kind: ParamKind::Int {
            min: 1,
            max: limits::MAX_NLOG_ENTRIES as i64,
        },
        default: "64",
        doc: "NLog entries: concurrent operations at most",
        source: "Vectide (the paper sizes it by writer threads)",
    },
    ParamSpec {
        name: "nlist_entries",
        kind: ParamKind::Int {
            min: 1,
            max: limits::MAX_NLIST_ENTRIES as i64,
        },
        default: "1024",
        doc: "NlistLog entries (an insert logs up to 32 neighbour lists per batch of fences)",
        source: "Vectide",
    },
    ParamSpec {
        name: "initial_capacity",
        kind: ParamKind::Int {
            min: 0,
            max: limits::MAX_INITIAL_CAPACITY as i64,
        },
        default: "1024",
        doc: "node blocks allocated at creation (the file grows by half when full)",
        source: "Vectide",
    },
    PERSIST,
    PATH,
];

static ALL_PARAMS: [ParamSpec; 10] = [
    PARAMS[0], PARAMS[1], PARAMS[2], PARAMS[3], PARAMS[4], PARAMS[5], PARAMS[6], PARAMS[7],
    PARAMS[8], THREADS,
];

/// Engine `p-hnsw`: HNSW in a persistent region.
pub static P_HNSW: EngineDescriptor = EngineDescriptor {
    name: "p-hnsw",
    summary: "P-HNSW (Appl. Sci. 2025): HNSW in a persistent region, crash-consistent through a redo NLog and an undo NlistLog",
    persistence: Persistence::DurableOnAck,
    medium: vectide_core::engine::Medium::PersistentMemory,
    params: &ALL_PARAMS,
    open_params: &["threads", "persist", "path"],
    knobs: &[Knob::Ef],
    primary_knob: Some(Knob::Ef),
    create,
    open,
    detect: PHnsw::exists,
    inspect: super::inspect::inspect,
};

/// `persist` of checked parameters (default `pmem`).
pub fn persist_mode(params: &Params) -> Result<PersistMode> {
    params
        .string("persist")
        .map_or(Ok(PersistMode::Pmem), PersistMode::parse)
}

/// [`PHnswParams`] from checked parameters.
pub fn phnsw_params(params: &Params) -> Result<PHnswParams> {
    let d = PHnswParams::default();
    Ok(PHnswParams {
        hnsw: graph_params(params)?,
        nlog_entries: params.usize("nlog_entries").unwrap_or(d.nlog_entries),
        nlist_entries: params.usize("nlist_entries").unwrap_or(d.nlist_entries),
        initial_capacity: params
            .usize("initial_capacity")
            .unwrap_or(d.initial_capacity),
    })
}

/// The directory of checked parameters.
fn dir_of(params: &Params) -> Result<PathBuf> {
    params
        .string("path")
        .map(PathBuf::from)
        .ok_or_else(|| Error::invalid("engine \"p-hnsw\" lives in a directory: pass path=DIR"))
}

fn create(dim: usize, metric: Metric, params: &Params) -> Result<Box<dyn VectorIndex>> {
    let p = phnsw_params(params)?;
    let bytes = p.initial_capacity.saturating_mul(dim).saturating_mul(4);
    if bytes > limits::MAX_INITIAL_BYTES {
        return Err(Error::invalid(format!(
            "initial_capacity {} × dim {dim} preallocates {bytes} bytes of vectors; \
             at most {} are allowed (the file grows on its own)",
            p.initial_capacity,
            limits::MAX_INITIAL_BYTES
        )));
    }
    let mode = persist_mode(params)?;
    Ok(Box::new(PHnsw::create(
        &dir_of(params)?,
        dim,
        metric,
        p,
        mode,
    )?))
}

fn open(path: &Path, params: &Params) -> Result<Box<dyn VectorIndex>> {
    Ok(Box::new(PHnsw::open(
        path,
        persist_mode(params)?,
        params.usize("threads"),
    )?))
}

impl PHnsw {
    /// The parameters in effect, as [`Params`].
    pub(crate) fn params_out(&self) -> Params {
        let mut out = graph_params_out(self.params(), self.threads());
        for k in ["consolidate_fraction", "repair_alpha"] {
            out.remove(k);
        }
        out.insert(
            "path".into(),
            ParamValue::Str(self.dir().display().to_string()),
        );
        // `pmem-emulated` (pmem on a non-DAX file system) and the simulator
        // report as the mode they were opened with.
        let mode = if self.media_kind() == "msync" {
            "msync"
        } else {
            "pmem"
        };
        out.insert("persist".into(), ParamValue::Str(mode.to_string()));
        let int = |v: usize| ParamValue::Int(i64::try_from(v).unwrap_or(i64::MAX));
        let g = &self.logs.g;
        out.insert("nlog_entries".into(), int(g.nlog_entries));
        out.insert("nlist_entries".into(), int(g.nlist_entries));
        // The node blocks the region holds now: creating with it gives an
        // index of the same room.
        out.insert(
            "initial_capacity".into(),
            int(vectide_graph::Graph::slots(&self.graph).max(1)),
        );
        out
    }
}
