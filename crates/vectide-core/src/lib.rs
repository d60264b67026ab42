//! # vectide-core
//!
//! What every Vectide engine shares: the [`Metric`]s and their SIMD distance
//! kernels (runtime CPU dispatch), the top-k heap, the reusable visited set,
//! the operation-sequence watermark, input validation, atomic file writes,
//! the named [`sync`] points every `fsync` goes through (observable by a
//! crash kit, scoped by directory with [`scope`]), the injected [`fault`]
//! points of error-path tests, the [`poison`] flag of a failed apply, the
//! maintenance [`activity`] an engine reports,
//! the [`VectorIndex`] trait that every engine implements, the one
//! [`Error`] type, the documented bounds of every outside input
//! ([`limits`]) and how benchmarks judge results ([`eval`]: recall@k, the
//! Pareto frontier, QPS at a recall target).
//!
//! Distances are "smaller is closer" everywhere: squared L2 for
//! [`Metric::L2`], `1 - cos` for [`Metric::Cosine`] (vectors are normalised at
//! insert and searched by inner product) and `-dot` for [`Metric::Ip`].

pub mod activity;
pub mod distance;
pub mod engine;
pub mod error;
pub mod eval;
pub mod fault;
pub mod heap;
pub mod hugemem;
pub mod index;
pub mod io;
pub mod job_thread;
pub mod limits;
pub mod metric;
pub mod params;
pub mod poison;
pub mod pools;
pub mod sched;
pub mod scope;
pub mod seq;
pub mod sync;
pub mod trim;
pub mod validate;
pub mod visited;

pub use engine::{EngineDescriptor, Knob, Medium, Persistence};
pub use error::{Error, Result};
pub use heap::{Neighbor, TopK};
pub use index::{Filter, IndexStats, Progress, SearchParams, StagedSave, VectorIndex};
pub use metric::Metric;
pub use params::{ParamKind, ParamSpec, ParamValue, Params, ParamsExt};
pub use seq::{Seq, SeqTracker};
pub use sync::{
    install_sync_observer, sync_dir, sync_file, sync_point, ObserverGuard, SyncDecision, SyncEvent,
    SyncKind, SyncObserver, SyncPhase, SyncSite,
};
pub use visited::{SparseVisited, VisitedPool, VisitedSet};

/// The id reserved to pad missing results (`u64::MAX`); rejected on insert.
pub const RESERVED_ID: u64 = u64::MAX;
