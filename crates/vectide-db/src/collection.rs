//! A collection: one engine, one point store, one write-ahead log, and the
//! one commit path between them.
//!
//! **The commit path.** An operation (upsert, delete, set payload) is
//! validated, then — under the log's lock, so that sequence order is log
//! order — given its sequence number, its external ids mapped to internal ids
//! and its record appended to the WAL (ids, vectors, payloads, sequence
//! number; framed with a CRC). The writer waits for the `fdatasync` that
//! covers the record (its own, or a group commit's), then applies the
//! record to the engine and to the point store, in sequence order, and only
//! then acknowledges. Readers therefore never see an operation that a crash
//! could take back.
//!
//! **Recovery.** On open, the engine and the store come back as of their own
//! durable points (`durable_seq()`); every WAL record newer than the older
//! of the two is applied again to whichever lacks it (both are idempotent
//! per point), so no vector survives without its payload or the reverse.
//! P-HNSW is durable per operation, so nothing is replayed into it twice.
//!
//! **Checkpoints** (`Collection::checkpoint`, run by the database's background
//! thread when the WAL grew by `checkpoint_bytes` since the last one, or
//! `checkpoint_interval` passed with writes in between): a volatile engine is
//! saved (`index.vtdx`), a durable one flushed; the store commits with fsync;
//! then the WAL segments older than both are deleted, so restart time stays
//! bounded by one snapshot load plus at most `checkpoint_bytes` of replay.
//!
//! This file holds the collection's state and its writes; the record codec
//! is `crate::record`, and the rest sits beside it: `recovery` (open,
//! replay, repair), `search` (reads) and `checkpoint`.

use crate::commitlog::{CommitLog, Durability};
use crate::error::{DbError, Result};
use crate::filter::Filter;
use crate::ids::ExtId;
use crate::record::{encode_targets, encode_upsert, Op, UpsertRow, OP_DELETE, OP_SET_PAYLOAD};
use crate::store::{IndexKind, PointStore};
use parking_lot::{Condvar, Mutex, RwLock};
use serde_json::Value;
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use vectide_core::fault::FaultSite;
use vectide_core::poison::Poison;
use vectide_core::{Metric, Seq};
use vectide_engines::{AnyIndex, Params};

mod checkpoint;
mod recovery;
mod search;

/// How a collection is built (kept in the catalog).
#[derive(Debug, Clone, PartialEq)]
pub struct CollectionConfig {
    pub dim: usize,
    pub metric: Metric,
    pub engine: String,
    pub params: Params,
}

impl CollectionConfig {
    /// A collection of `engine` with the engine's default parameters.
    pub fn new(dim: usize, metric: Metric, engine: &str) -> Self {
        CollectionConfig {
            dim,
            metric,
            engine: engine.into(),
            params: Params::new(),
        }
    }
}

/// Tuning of the commit path and checkpoints.
#[derive(Debug, Clone)]
pub struct Options {
    pub durability: Durability,
    /// WAL segment size before rotation (default 64 MiB).
    pub segment_bytes: u64,
    /// Checkpoint once the WAL tail that a restart would replay exceeds
    /// `checkpoint_ratio` times the index's size, but never below
    /// `checkpoint_min_bytes` nor above `checkpoint_bytes` (defaults 0.05,
    /// 64 KiB, 256 MiB). Replaying a byte of WAL into a graph index costs
    /// about a hundred times more than loading a byte of its snapshot, so the
    /// tail is kept small next to the index: restart time stays bounded
    /// however often the process dies.
    pub checkpoint_bytes: u64,
    pub checkpoint_min_bytes: u64,
    pub checkpoint_ratio: f64,
    /// ... or this long after the last one, if anything was written (60 s).
    pub checkpoint_interval: Duration,
    /// Worker threads of engines (None: all cores).
    pub threads: Option<usize>,
    /// Filters matching at most this many points are answered exactly
    /// (default [`EXACT_MAX`]).
    pub exact_max: usize,
    /// Open for `repair`: an engine and a store that disagree are opened
    /// (to be reconciled) instead of refused.
    pub repair: bool,
    /// Engines that keep a redo log of their own hand it to the
    /// collection's WAL (`log=database`; the default). `false` keeps both
    /// logs, as before there was one: for comparisons only.
    pub one_log: bool,
    /// Whether the database's maintenance thread runs the maintenance that
    /// engines defer from their writes (an hnsw delete consolidation; the
    /// default). `false` leaves it to explicit `maintain()` calls, for
    /// users who choose when the work runs; checkpoints stay in the
    /// background either way.
    pub background_maintenance: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            durability: Durability::DEFAULT,
            segment_bytes: 64 << 20,
            checkpoint_bytes: 256 << 20,
            checkpoint_min_bytes: 64 << 10,
            checkpoint_ratio: 0.05,
            checkpoint_interval: Duration::from_secs(60),
            threads: None,
            exact_max: EXACT_MAX,
            repair: false,
            one_log: true,
            background_maintenance: true,
        }
    }
}

/// A point to upsert.
#[derive(Debug, Clone)]
pub struct PointInput {
    pub id: ExtId,
    pub vector: Vec<f32>,
    /// A JSON object, or `Null` for none.
    pub payload: Value,
}

/// A search result.
#[derive(Debug, Clone, PartialEq)]
pub struct Hit {
    pub id: ExtId,
    /// The engine's distance ("smaller is closer": squared L2, 1 − cos, −dot).
    pub distance: f32,
    pub payload: Option<Value>,
    pub vector: Option<Vec<f32>>,
}

/// The score users see for an engine distance (Qdrant's conventions):
/// cosine similarity (`1 − d`), the dot product (`−d`), or the Euclidean
/// distance (`√d`, not squared).
pub fn score(metric: Metric, distance: f32) -> f32 {
    match metric {
        Metric::Cosine => 1.0 - distance,
        Metric::Ip => -distance,
        Metric::L2 => distance.max(0.0).sqrt(),
    }
}

/// A stored point, as `get` and `scroll` return it.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    pub id: ExtId,
    pub payload: Value,
    pub vector: Option<Vec<f32>>,
}

/// Counters of a collection.
#[derive(Debug, Default)]
pub struct Counters {
    pub upserted: AtomicU64,
    pub deleted: AtomicU64,
    pub searches: AtomicU64,
    pub checkpoints: AtomicU64,
    pub replayed: AtomicU64,
}

/// Filters whose matches are at most this many are answered exactly, by
/// scanning the matches, instead of by a filtered graph search.
pub const EXACT_MAX: usize = 20_000;

/// The fault point between a record's commit and its apply (tests of the
/// poisoned state).
pub const APPLY_FAULT: FaultSite = FaultSite("db.apply");

/// One collection (see the module docs).
pub struct Collection {
    name: String,
    dir: PathBuf,
    config: CollectionConfig,
    engine: AnyIndex,
    log: CommitLog,
    store: RwLock<PointStore>,
    /// The next sequence number to apply.
    turn: Mutex<Seq>,
    /// The newest sequence number applied to the engine (payload-only
    /// operations do not reach it): a checkpoint may cut the log past an
    /// engine's `durable_seq()` only when that covers this.
    engine_seq: AtomicU64,
    turn_cv: Condvar,
    last_checkpoint: Mutex<Instant>,
    /// Held through a checkpoint: one at a time, so that the store's
    /// flushes reach its file in the order they were taken.
    checkpointing: Mutex<()>,
    opts: Options,
    /// Set when the database closes or the collection is deleted: writes
    /// and searches through a remaining handle then fail with `Closed`.
    closed: AtomicBool,
    /// Set when a committed record failed to sync or to apply (see
    /// [`vectide_core::poison`]): reads go on, writes are refused until
    /// the database is reopened, which replays the log.
    poison: Poison,
    /// The collection's own maintenance job (checkpoints); the engine
    /// reports its own beside it in [`Collection::stats`].
    activity: vectide_core::activity::Activity,
    pub counters: Counters,
    /// What the last open did: records replayed and seconds taken.
    pub opened_in: Duration,
}

impl std::fmt::Debug for Collection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Collection")
            .field("name", &self.name)
            .field("config", &self.config)
            .finish()
    }
}

impl Collection {
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn config(&self) -> &CollectionConfig {
        &self.config
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The engine (for benchmarks comparing with the engine alone).
    pub fn engine(&self) -> &AnyIndex {
        &self.engine
    }

    pub fn durability(&self) -> Durability {
        self.log.durability()
    }

    /// Live points.
    pub fn len(&self) -> usize {
        self.store.read().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Highest sequence number acknowledged.
    pub fn last_seq(&self) -> Seq {
        *self.turn.lock() - 1
    }

    /// Appends the record `make` builds, waits for its fsync, applies it in
    /// sequence order. The record is applied even if a later one's fsync
    /// failed; if its own failed, nothing is applied and the error returned.
    fn commit(
        &self,
        make: impl FnOnce(Seq, &mut PointStore) -> Result<(Vec<u8>, Op)>,
    ) -> Result<Seq> {
        self.check_open()?;
        self.poison.check()?;
        let (seq, op) = self.log.append(|seq| {
            let mut store = self.store.write();
            make(seq, &mut store)
        })?;
        let durable = self.log.commit(seq);
        let mut turn = self.turn.lock();
        while *turn != seq {
            self.turn_cv.wait(&mut turn);
        }
        // A record after a poisoning one is in the log but not applied
        // either: the reopen applies it in order.
        let result = self
            .poison
            .check()
            .map_err(DbError::from)
            .and(durable)
            .and_then(|()| {
                // An engine that panics poisons the collection like one
                // that fails: the turn still passes to the next record, so
                // no writer (nor a `settle`) waits for it forever.
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    vectide_core::fault::hit(&self.dir, APPLY_FAULT)?;
                    op.apply_committed(&self.engine)?;
                    if op.touches_engine() {
                        self.engine_seq.store(seq, Ordering::Release);
                    }
                    self.store.write().apply_recorded(seq, op.changes);
                    Ok(())
                }))
                .unwrap_or_else(|_| {
                    Err(DbError::from(vectide_core::Error::invalid(
                        "the engine panicked while applying the record",
                    )))
                })
            })
            .map_err(|e| self.poison.poison(&format!("record {seq}"), &e).into());
        *turn = seq + 1;
        self.turn_cv.notify_all();
        drop(turn);
        result.map(|()| seq)
    }

    /// Marks the collection closed (see [`DbError::Closed`]); operations
    /// already past the check finish, and recovery covers them.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
    }

    /// Whether [`Collection::close`] ran.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// The first failure that poisoned the collection, if one did (see
    /// [`DbError::is_poisoned`]).
    pub fn poisoned(&self) -> Option<&str> {
        self.poison.cause()
    }

    fn check_open(&self) -> Result<()> {
        if self.is_closed() {
            return Err(DbError::Closed(format!("collection {:?}", self.name)));
        }
        Ok(())
    }

    fn check_vector(&self, v: &[f32]) -> Result<()> {
        vectide_core::validate::check_vector(self.config.dim, self.config.metric, v)
            .map_err(DbError::from)
    }

    /// Inserts or replaces points (vectors and payloads); durable and visible
    /// when it returns. Returns the operation's sequence number.
    pub fn upsert(&self, points: &[PointInput]) -> Result<Seq> {
        self.upsert_owned(points.to_vec())
    }

    /// [`upsert`](Self::upsert), taking the points: their ids and payloads
    /// move into the record and the point store instead of being copied.
    pub fn upsert_owned(&self, mut points: Vec<PointInput>) -> Result<Seq> {
        if points.is_empty() {
            return Ok(self.last_seq());
        }
        let mut seen = HashSet::with_capacity(points.len());
        for p in &points {
            self.check_vector(&p.vector)
                .map_err(|e| DbError::invalid(format!("point {}: {e}", p.id)))?;
            if !(p.payload.is_null() || p.payload.is_object()) {
                return Err(DbError::invalid(format!(
                    "point {}: the payload must be a JSON object",
                    p.id
                )));
            }
            if !seen.insert(&p.id) {
                return Err(DbError::invalid(format!(
                    "point {} appears twice in one batch",
                    p.id
                )));
            }
        }
        drop(seen);
        let dim = self.config.dim;
        let n = points.len();
        let seq = self.commit(|seq, store| {
            let rows = points.iter_mut().map(|p| UpsertRow {
                id: store.assign(&p.id),
                ext: std::mem::replace(&mut p.id, ExtId::Num(0)),
                vector: &p.vector,
                payload: std::mem::take(&mut p.payload),
            });
            Ok(encode_upsert(seq, dim, n, rows))
        })?;
        self.counters
            .upserted
            .fetch_add(n as u64, Ordering::Relaxed);
        Ok(seq)
    }

    /// Logs and applies a delete or payload update of `targets`, selected
    /// before the record is made: a target deleted (and perhaps inserted
    /// again, under a new internal id) in between is dropped, since the
    /// call ran concurrently with that delete and may be ordered right
    /// after it. A delete makes the store forget its targets' external ids
    /// in log order (see [`PointStore::forget`]).
    fn simple_op(&self, kind: u8, targets: &[(u64, ExtId)], payload: &Value) -> Result<Seq> {
        self.commit(|seq, store| {
            let still: Vec<(u64, ExtId)> = targets
                .iter()
                .filter(|(id, ext)| store.internal(ext) == Some(*id))
                .cloned()
                .collect();
            if kind == OP_DELETE {
                for (id, ext) in &still {
                    store.forget(ext, *id);
                }
            }
            Ok(encode_targets(seq, kind, &still, payload))
        })
    }

    /// Waits until every record appended so far is durable and applied.
    /// A call that selected nothing returns through here: what it saw may
    /// be a delete already recorded (its ids forgotten) but not yet
    /// durable, and answering "nothing to do" before that delete is
    /// durable would acknowledge a state a crash can take back.
    fn settle(&self) -> Result<()> {
        let seq = self.log.last_seq();
        self.log.commit(seq)?;
        let mut turn = self.turn.lock();
        while *turn <= seq {
            self.turn_cv.wait(&mut turn);
        }
        drop(turn);
        self.poison.check().map_err(DbError::from)
    }

    /// Deletes points named by id or matched by a filter; returns how many.
    pub fn delete(&self, ids: Option<&[ExtId]>, filter: Option<&Filter>) -> Result<usize> {
        let targets = self.select(ids, filter);
        if targets.is_empty() {
            self.settle()?;
            return Ok(0);
        }
        self.simple_op(OP_DELETE, &targets, &Value::Null)?;
        self.counters
            .deleted
            .fetch_add(targets.len() as u64, Ordering::Relaxed);
        Ok(targets.len())
    }

    /// Merges `payload`'s keys into the payloads of the selected points;
    /// returns how many.
    pub fn set_payload(
        &self,
        ids: Option<&[ExtId]>,
        filter: Option<&Filter>,
        payload: &Value,
    ) -> Result<usize> {
        if !payload.is_object() {
            return Err(DbError::invalid("the payload to set must be a JSON object"));
        }
        let targets = self.select(ids, filter);
        if targets.is_empty() {
            self.settle()?;
            return Ok(0);
        }
        self.simple_op(OP_SET_PAYLOAD, &targets, payload)?;
        Ok(targets.len())
    }

    /// Declares a payload index on `field`.
    pub fn create_index(&self, field: &str, kind: IndexKind) -> Result<()> {
        self.check_open()?;
        self.store.write().create_index(field, kind)
    }

    /// Declared payload indexes.
    pub fn indexes(&self) -> Vec<(String, IndexKind)> {
        self.store.read().indexes()
    }

    /// `fdatasync`s of the WAL so far (group commit shares them).
    pub fn wal_syncs(&self) -> u64 {
        self.log.syncs()
    }

    /// WAL segment files (for checks and metrics).
    pub fn wal_segments(&self) -> usize {
        self.log.segments()
    }

    /// The engine's size counters, with the collection's checkpoints
    /// among the maintenance jobs.
    pub fn stats(&self) -> Result<vectide_core::IndexStats> {
        let mut s = self.engine.stats()?;
        self.activity.fill(&mut s);
        Ok(s)
    }

    /// The engine's stats as the front ends show them, from one call:
    /// the maintenance jobs (`{"running": [names], "started": count}`)
    /// and the size counters (live vectors, slots used and allocated,
    /// deletes not yet reclaimed, memory and disk bytes, and the engine's
    /// own figures by name under `extra`: a block store's blocks in use,
    /// free and held, postings, rebuilds); both null when the engine's
    /// stats fail.
    pub fn stats_json(&self) -> (serde_json::Value, serde_json::Value) {
        match self.stats() {
            Ok(s) => {
                let extra: serde_json::Map<String, serde_json::Value> = s
                    .extra
                    .iter()
                    .map(|(k, v)| (k.clone(), serde_json::json!(v)))
                    .collect();
                (
                    serde_json::json!({"running": s.maintenance, "started": s.maintenance_started}),
                    serde_json::json!({
                        "live": s.live, "slots_used": s.slots_used, "capacity": s.capacity,
                        "pending_deletes": s.pending_deletes, "memory_bytes": s.memory_bytes,
                        "disk_bytes": s.disk_bytes, "extra": extra,
                    }),
                )
            }
            Err(_) => (serde_json::Value::Null, serde_json::Value::Null),
        }
    }

    /// Whether the engine has deferred maintenance due (see
    /// `VectorIndex::defer_maintenance`; the database's maintenance thread
    /// runs it).
    pub fn maintenance_due(&self) -> bool {
        !self.closed.load(Ordering::Acquire)
            && self.poison.cause().is_none()
            && self.engine.maintenance_due()
    }

    /// Runs the engine's pending maintenance (delete consolidation, a
    /// merge) and returns when none is in flight; writes and searches go on
    /// meanwhile. Its progress is in [`Collection::stats`]' extras.
    pub fn maintain(&self) -> Result<()> {
        self.check_open()?;
        Ok(self.engine.maintain()?)
    }
}
