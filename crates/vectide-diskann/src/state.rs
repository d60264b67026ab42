//! The `fresh-diskann` engine's state (FreshDiskANN §5.1): the LTI
//! generation, the temp indexes, the location map `id → (LTI node | temp
//! serial, seq)` that is the one truth of what is live, the DeleteList and
//! `ro_dead`; the writer's side (redo log, manifest), the merge status and
//! the I/O counters; [`Inner`], which every other part of the engine works on.

use crate::layout::NO_LABEL;
use crate::lti::{Lti, Scratch};
use crate::manifest::Manifest;
use crate::merge::MergeStats;
use crate::params::FreshDiskannParams;
use parking_lot::{Condvar, Mutex, RwLock};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8};
use std::sync::Arc;
use vectide_core::sync::SyncSite;
use vectide_core::{Metric, Result, VectorIndex};
use vectide_storage::durable::RedoLog;
use vectide_vamana::{FreshVamana, VamanaParams, START_LABEL};

/// Sync site of the LTI files a merge writes.
pub const LTI_SYNC: SyncSite = SyncSite("fresh-diskann.lti");

/// Where a live point is: an LTI node, or the temp index of a serial
/// (serials stay below 2^32: eight bytes a place, 24 a map entry).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Place {
    Lti(u32),
    Temp(u32),
}

impl Place {
    pub(crate) fn temp(serial: u64) -> Place {
        Place::Temp(serial as u32)
    }
}

/// The largest temp-index serial.
pub(crate) const MAX_SERIAL: u64 = u32::MAX as u64;

/// A live point's place and the sequence number of the operation that put
/// it there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Loc {
    pub place: Place,
    pub seq: u64,
}

/// A temp index and its serial.
pub(crate) struct Temp {
    pub serial: u64,
    pub index: FreshVamana,
}

pub(crate) struct LtiGen {
    pub gen: u64,
    pub lti: Lti,
}

#[derive(Default)]
pub(crate) struct State {
    pub lti: Option<Arc<LtiGen>>,
    /// Oldest first; the last is the RW-TempIndex.
    pub temps: Vec<Arc<Temp>>,
    pub loc: HashMap<u64, Loc>,
    /// The DeleteList: LTI nodes whose point is gone.
    pub lti_dead: Vec<u32>,
    /// Points of RO-TempIndexes that are gone: `(serial, id)`.
    pub ro_dead: Vec<(u64, u64)>,
}

impl State {
    pub(crate) fn rw(&self) -> &Arc<Temp> {
        self.temps.last().expect("there is always an RW-TempIndex")
    }

    /// Records that `old` no longer holds `id`; returns whether the copy is
    /// in the RW index (which the caller deletes there).
    pub(crate) fn displace(&mut self, id: u64, old: Loc, rw: u64) -> bool {
        match old.place {
            Place::Lti(n) => self.lti_dead.push(n),
            Place::Temp(s) if u64::from(s) != rw => self.ro_dead.push((u64::from(s), id)),
            Place::Temp(_) => return true,
        }
        false
    }

    pub(crate) fn temp_points(&self) -> usize {
        self.temps.iter().map(|t| t.index.len()).sum()
    }
}

/// The writer's side: the redo log in use (none when the database's
/// commit log is the only log) and the manifest in force.
pub(crate) struct Writer {
    pub log: Option<RedoLog>,
    pub manifest: Manifest,
}

/// Merge progress, read by `stats`.
#[derive(Default)]
pub(crate) struct MergeStatus {
    pub(crate) running: AtomicBool,
    /// 0 idle, 1 delete, 2 insert, 3 patch, 4 switch.
    pub(crate) phase: AtomicU8,
    pub(crate) done: AtomicU64,
    pub(crate) total: AtomicU64,
    pub(crate) merges: AtomicU64,
    pub(crate) failures: AtomicU64,
    pub(crate) last: Mutex<Option<MergeStats>>,
    pub(crate) last_error: Mutex<Option<String>>,
    /// The maintenance jobs running (merges and freezes).
    pub(crate) activity: vectide_core::activity::Activity,
}

#[derive(Default)]
pub(crate) struct IoCounters {
    pub(crate) queries: AtomicU64,
    pub(crate) sectors: AtomicU64,
    pub(crate) hops: AtomicU64,
    pub(crate) cache_hits: AtomicU64,
}

pub(crate) struct Inner {
    pub dir: PathBuf,
    pub dim: usize,
    pub metric: Metric,
    pub params: FreshDiskannParams,
    pub threads: usize,
    pub state: RwLock<State>,
    pub writer: Mutex<Writer>,
    /// The newest sequence number applied (with `log=own`, written to the
    /// log first; its call returns once the log's `fdatasync` covers it):
    /// what a freeze covers.
    pub durable: AtomicU64,
    /// With `log=own`, the newest sequence number whose call synced its
    /// log and returned: `durable_seq()`.
    pub synced: AtomicU64,
    /// The newest sequence number the manifest covers (`covered_seq` of
    /// the last freeze): with `log=database`, the durability watermark.
    pub covered: AtomicU64,
    pub(crate) merge_lock: Mutex<()>,
    /// Held through a freeze (see `Inner::freeze`).
    pub(crate) freeze_lock: Mutex<()>,
    /// Whether a background merge is queued or running (on the process's
    /// shared merge pool); `background_done` is signalled when it ends.
    pub(crate) background: Mutex<bool>,
    pub(crate) background_done: Condvar,
    pub(crate) status: MergeStatus,
    pub(crate) scratches: Mutex<Vec<Scratch>>,
    pub(crate) io: IoCounters,
    pub(crate) pool: vectide_core::pools::Pool,
    /// Set when a logged write failed to apply or its log failed to sync
    /// (see [`vectide_core::poison`]).
    pub(crate) poison: vectide_core::poison::Poison,
}

impl Inner {
    pub(crate) fn new(
        dir: &Path,
        dim: usize,
        metric: Metric,
        params: FreshDiskannParams,
        state: State,
        writer: Writer,
        durable: u64,
    ) -> Result<Self> {
        let threads = params
            .graph
            .threads
            .unwrap_or_else(rayon::current_num_threads);
        let pool = vectide_core::engine::pool_of("fdann", threads)?;
        Ok(Inner {
            dir: dir.to_path_buf(),
            dim,
            metric,
            params,
            threads,
            state: RwLock::new(state),
            writer: Mutex::new(writer),
            durable: AtomicU64::new(durable),
            synced: AtomicU64::new(durable),
            covered: AtomicU64::new(durable),
            merge_lock: Mutex::new(()),
            freeze_lock: Mutex::new(()),
            background: Mutex::new(false),
            background_done: Condvar::new(),
            status: MergeStatus::default(),
            scratches: Mutex::new(Vec::new()),
            io: IoCounters::default(),
            pool,
            poison: Default::default(),
        })
    }

    /// The graph parameters of a temp index.
    pub(crate) fn temp_params(params: &FreshDiskannParams, threads: usize) -> VamanaParams {
        VamanaParams {
            threads: Some(threads),
            ..params.graph.clone()
        }
    }

    pub(crate) fn new_temp(&self, serial: u64) -> Result<Arc<Temp>> {
        Ok(Arc::new(Temp {
            serial,
            index: FreshVamana::new(
                self.dim,
                self.metric,
                Self::temp_params(&self.params, self.threads),
            )?,
        }))
    }

    pub(crate) fn alpha(&self) -> f32 {
        if self.metric == Metric::Ip {
            1.0
        } else {
            self.params.graph.alpha
        }
    }
}

/// Whether a record label is a point (not a free record or the start node).
pub(crate) fn is_point(label: u64) -> bool {
    label != NO_LABEL && label != START_LABEL
}
