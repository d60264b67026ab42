//! # vectide-spfresh
//!
//! SPFresh (Xu et al., SOSP 2023): a SPANN cluster index (Chen et al.,
//! NeurIPS 2021) on SSD kept balanced in place by LIRE, and its two
//! baselines, as three engines of one implementation:
//!
//! - `spann`: the static index (hierarchical balanced k-means, boundary
//!   replicas, an `hnsw` centroid index, postings in the block store);
//!   updates are appended in place and `maintain()` rebuilds it;
//! - `spann-inplace`: the paper's SPANN+: updates appended in place,
//!   deletes as tombstones, never a split, merge or reassign;
//! - `spfresh`: SPANN + the Updater + the Local Rebuilder (split, merge,
//!   reassign under the NPA conditions).
//!
//! The rooms:
//! - [`params`]: [`SpannParams`] and [`Mode`], defaults with sources;
//! - layout: [`layout`] (block store bytes, `docs/format-blockstore.md`)
//!   and [`snapshot`] (the engine snapshot, `docs/format-spfresh.md`); the
//!   WAL records are the storage crate's `redo` records;
//! - [`blockstore`]: the Block Controller (§4.3): GET, ParallelGET (one
//!   io_uring batch), APPEND (read-modify-write of the last block into a
//!   fresh block, the mapping entry swapped by CAS), PUT, and released
//!   blocks held back until the next snapshot is durable (§4.4); `tails`
//!   keeps the partly filled last block of recently appended postings in
//!   RAM so that an APPEND writes without reading;
//! - [`versions`]: the version map (§4.2.1), a byte per vector;
//! - [`builder`]: the static build and SPANN's replica rule;
//! - `search`: the centroid index and the search (ParallelGET, stale and
//!   deleted records skipped, replicas counted once);
//! - `update`: the Updater (inserts APPENDed, deletes as tombstones);
//! - `rebuild`: the Local Rebuilder (job queue, background threads, split,
//!   merge, reassign);
//! - `recovery`: create, open = snapshot + WAL replay, inspect;
//! - `engine`: [`Spfresh`], its locks, snapshots and `VectorIndex`.

#![deny(clippy::undocumented_unsafe_blocks)]

pub mod blockstore;
pub mod builder;
mod engine;
mod heads;
mod jobs;
pub mod layout;
pub mod params;
mod rebuild;
mod reclaim;
mod recovery;
mod search;
pub mod snapshot;
mod state;
mod tails;
mod update;
pub mod versions;

pub use blockstore::{BlockStore, ReadScratch, StoreStats, Swap};
pub use builder::BUILD_FAULT;
pub use engine::Spfresh;
pub use layout::{encode_record, Records};
pub use params::{Mode, SpannParams, PARAMS};
pub use recovery::{inspect_rows, wal_serials};
pub use state::{wal_file, BLOCKS, BLOCK_SYNC, SNAPSHOT};
pub use update::APPLY_FAULT;
pub use versions::VersionMap;

use std::path::Path;
use vectide_core::{
    EngineDescriptor, Error, Knob, Metric, Params, ParamsExt, Persistence, Result, VectorIndex,
};

fn dir_of(engine: &str, params: &Params) -> Result<std::path::PathBuf> {
    params
        .string("path")
        .map(std::path::PathBuf::from)
        .ok_or_else(|| {
            Error::invalid(format!(
                "engine {engine:?} lives in a directory: pass path=DIR"
            ))
        })
}

fn create_mode(
    mode: Mode,
    dim: usize,
    metric: Metric,
    params: &Params,
) -> Result<Box<dyn VectorIndex>> {
    let p = SpannParams::from_params(mode.engine(), params)?;
    Ok(Box::new(Spfresh::create(
        &dir_of(mode.engine(), params)?,
        dim,
        metric,
        mode,
        p,
    )?))
}

fn open_mode(mode: Mode, path: &Path, params: &Params) -> Result<Box<dyn VectorIndex>> {
    match Spfresh::mode_at(path) {
        Some(m) if m == mode => Ok(Box::new(Spfresh::open(path, params)?)),
        Some(m) => Err(Error::invalid(format!(
            "{} holds a {} index, not {}",
            path.display(),
            m.engine(),
            mode.engine()
        ))),
        None => Err(Error::invalid(format!(
            "{} holds no {} index (no readable snapshot.bin)",
            path.display(),
            mode.engine()
        ))),
    }
}

macro_rules! spann_descriptor {
    ($name:ident, $mode:expr, $engine:literal, $summary:literal, $detect:ident) => {
        fn $detect(path: &Path) -> bool {
            Spfresh::mode_at(path) == Some($mode)
        }
        /// See the crate docs.
        pub static $name: EngineDescriptor = EngineDescriptor {
            name: $engine,
            summary: $summary,
            persistence: Persistence::DurableOnAck,
            medium: vectide_core::engine::Medium::Ssd,
            params: &PARAMS,
            open_params: params::OPEN_PARAMS,
            knobs: &[Knob::Nprobe],
            primary_knob: Some(Knob::Nprobe),
            create: |dim, metric, params| create_mode($mode, dim, metric, params),
            open: |path, params| open_mode($mode, path, params),
            detect: $detect,
            inspect: inspect_rows,
        };
    };
}

spann_descriptor!(
    SPANN,
    Mode::Static,
    "spann",
    "SPANN (2021): balanced-k-means postings on SSD with boundary replicas and an HNSW centroid index; static build, maintain() rebuilds",
    detect_spann
);
spann_descriptor!(
    SPANN_INPLACE,
    Mode::Inplace,
    "spann-inplace",
    "SPANN+ (SPFresh's baseline): SPANN with updates appended in place and deletes as tombstones, never rebalanced",
    detect_spann_inplace
);
spann_descriptor!(
    SPFRESH,
    Mode::Fresh,
    "spfresh",
    "SPFresh (2023): SPANN on SSD kept balanced in place by LIRE (split, merge, reassign), snapshot + WAL recovery",
    detect_spfresh
);
