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
use crate::edit::PayloadEdit;
use crate::error::{DbError, Result};
use crate::filter::Filter;
use crate::ids::ExtId;
use crate::record::{
    encode_targets, encode_upsert, encode_upsert_multi, MultiRow, Op, UpsertRow, OP_DELETE,
    OP_SET_PAYLOAD,
};
use crate::spaces::{
    DenseSpace, NamedVectors, PointData, Shape, SparseSpace, SparseSpaceConfig, VectorSpaceConfig,
    VectorValue,
};
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

mod apply;
mod checkpoint;
mod recovery;
mod search;

/// How a collection is built (kept in the catalog): its main dense space
/// (`dim`, `metric`, `engine`, `params`, named `vector_name`; `dim` 0 when
/// the collection has no dense space), further dense spaces and sparse
/// spaces (see [`crate::spaces`]).
#[derive(Debug, Clone, PartialEq)]
pub struct CollectionConfig {
    pub dim: usize,
    pub metric: Metric,
    pub engine: String,
    pub params: Params,
    /// The main space's name: `""` is Qdrant's unnamed vector.
    pub vector_name: String,
    pub more_vectors: Vec<VectorSpaceConfig>,
    pub sparse_vectors: Vec<SparseSpaceConfig>,
}

impl Default for CollectionConfig {
    fn default() -> Self {
        CollectionConfig {
            dim: 0,
            metric: Metric::L2,
            engine: vectide_engines::DEFAULT_ENGINE.into(),
            params: Params::new(),
            vector_name: String::new(),
            more_vectors: Vec::new(),
            sparse_vectors: Vec::new(),
        }
    }
}

impl CollectionConfig {
    /// A collection of `engine` with the engine's default parameters.
    pub fn new(dim: usize, metric: Metric, engine: &str) -> Self {
        CollectionConfig {
            dim,
            metric,
            engine: engine.into(),
            ..Default::default()
        }
    }

    /// The single form: one unnamed dense space and nothing else (its
    /// records and files are those of a collection before spaces existed).
    pub fn is_single(&self) -> bool {
        self.dim > 0
            && self.vector_name.is_empty()
            && self.more_vectors.is_empty()
            && self.sparse_vectors.is_empty()
    }

    /// The dense spaces, the main one first.
    pub fn dense_spaces(&self) -> Vec<VectorSpaceConfig> {
        let mut out = Vec::with_capacity(1 + self.more_vectors.len());
        if self.dim > 0 {
            out.push(VectorSpaceConfig {
                name: self.vector_name.clone(),
                dim: self.dim,
                metric: self.metric,
                engine: self.engine.clone(),
                params: self.params.clone(),
            });
        }
        out.extend(self.more_vectors.iter().cloned());
        out
    }

    /// The record shape of a multi collection.
    pub(crate) fn shape(&self) -> Shape {
        Shape {
            dense: self.dense_spaces().iter().map(|s| s.dim).collect(),
            sparse: self.sparse_vectors.len(),
        }
    }

    /// A collection of the given dense and sparse spaces (the first dense
    /// space becomes the main one).
    pub fn with_spaces(dense: Vec<VectorSpaceConfig>, sparse: Vec<SparseSpaceConfig>) -> Self {
        let mut dense = dense.into_iter();
        let mut c = match dense.next() {
            Some(m) => CollectionConfig {
                dim: m.dim,
                metric: m.metric,
                engine: m.engine,
                params: m.params,
                vector_name: m.name,
                ..Default::default()
            },
            None => CollectionConfig::default(),
        };
        c.more_vectors = dense.collect();
        c.sparse_vectors = sparse;
        c
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
    /// The engine's distance ("smaller is closer": squared L2, 1 − cos, −dot;
    /// a sparse space's is −dot).
    pub distance: f32,
    pub payload: Option<Value>,
    /// The main dense space's vector, when asked for and the point has one.
    pub vector: Option<Vec<f32>>,
    /// In a multi collection, when asked for: every vector the point has,
    /// by space name.
    pub vectors: Option<NamedVectors>,
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
    /// The main dense space's vector, when asked for and the point has one.
    pub vector: Option<Vec<f32>>,
    /// In a multi collection, when asked for: every vector the point has,
    /// by space name.
    pub vectors: Option<NamedVectors>,
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
    /// The dense spaces, the main one first (none in a sparse-only
    /// collection).
    dense: Vec<DenseSpace>,
    sparse: Vec<SparseSpace>,
    /// A multi collection's record shape (`None`: the single form).
    shape: Option<Shape>,
    log: CommitLog,
    store: RwLock<PointStore>,
    /// The next sequence number to apply.
    turn: Mutex<Seq>,
    turn_cv: Condvar,
    last_checkpoint: Mutex<Instant>,
    /// Held through a checkpoint: one at a time, so that the store's
    /// flushes reach its file in the order they were taken.
    checkpointing: Mutex<()>,
    pub(crate) opts: Options,
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
    /// The threads a query's sibling prefetches run on side by side (made
    /// at the first query that has two; `None` with one thread).
    pub(crate) query_pool: std::sync::OnceLock<Option<vectide_core::pools::Pool>>,
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

    /// The main dense space's engine (for benchmarks comparing with the
    /// engine alone, and the crash kit); `None` in a collection without a
    /// dense space.
    pub fn engine(&self) -> Option<&AnyIndex> {
        self.dense.first().map(|d| &d.engine)
    }

    /// The main dense space's engine, or an error naming what the
    /// collection has instead.
    pub fn main_engine(&self) -> Result<&AnyIndex> {
        self.engine()
            .ok_or_else(|| DbError::invalid("the collection has no dense vectors"))
    }

    /// The engine of the dense space named `using`.
    pub fn dense_engine(&self, using: &str) -> Result<&AnyIndex> {
        Ok(&self.dense_space(using)?.engine)
    }

    /// Every dense space's name and engine, the main one first.
    pub fn engines(&self) -> impl Iterator<Item = (&str, &AnyIndex)> {
        self.dense
            .iter()
            .map(|d| (d.config.name.as_str(), &d.engine))
    }

    /// Whether the collection is of the single form (one unnamed dense
    /// space, nothing else).
    pub fn is_single(&self) -> bool {
        self.shape.is_none()
    }

    /// The dense space named `name`.
    pub(crate) fn dense_space(&self, name: &str) -> Result<&DenseSpace> {
        if self.sparse.iter().any(|d| d.config.name == name) {
            return Err(DbError::invalid(format!(
                "vector {name:?} is sparse: search it with a sparse vector {{\"indices\", \"values\"}}"
            )));
        }
        self.dense
            .iter()
            .find(|d| d.config.name == name)
            .ok_or_else(|| self.no_space(name))
    }

    /// The sparse space named `name`.
    pub(crate) fn sparse_space(&self, name: &str) -> Result<&SparseSpace> {
        if self.dense.iter().any(|d| d.config.name == name) {
            return Err(DbError::invalid(format!(
                "vector {name:?} is dense: search it with a dense vector (a list of numbers)"
            )));
        }
        self.sparse
            .iter()
            .find(|d| d.config.name == name)
            .ok_or_else(|| self.no_space(name))
    }

    fn no_space(&self, name: &str) -> DbError {
        let mut names: Vec<String> = self
            .dense
            .iter()
            .map(|d| format!("{:?}", d.config.name))
            .chain(
                self.sparse
                    .iter()
                    .map(|d| format!("{:?} (sparse)", d.config.name)),
            )
            .collect();
        if names.is_empty() {
            names.push("none".into());
        }
        DbError::invalid(format!(
            "the collection has no vector named {name:?} (it has {})",
            names.join(", ")
        ))
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
                    apply::apply(&self.dense, &self.sparse, &op, None)?;
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

    /// Checks a query or row against the main dense space.
    fn check_vector(&self, v: &[f32]) -> Result<()> {
        let main = self
            .dense
            .first()
            .ok_or_else(|| DbError::invalid("the collection has no dense vectors"))?;
        check_dense(&main.config, v)
    }

    /// Inserts or replaces points (vectors and payloads); durable and visible
    /// when it returns. Returns the operation's sequence number.
    pub fn upsert(&self, points: &[PointInput]) -> Result<Seq> {
        self.upsert_owned(points.to_vec())
    }

    /// [`upsert`](Self::upsert), taking the points: their ids and payloads
    /// move into the record and the point store instead of being copied.
    /// Each point's vector is the main dense space's.
    pub fn upsert_owned(&self, mut points: Vec<PointInput>) -> Result<Seq> {
        if points.is_empty() {
            return Ok(self.last_seq());
        }
        if self.shape.is_some() {
            let name = self.config.vector_name.clone();
            return self.upsert_points(
                points
                    .into_iter()
                    .map(|p| PointData {
                        id: p.id,
                        vectors: vec![(name.clone(), VectorValue::Dense(p.vector))],
                        payload: p.payload,
                    })
                    .collect(),
            );
        }
        let mut seen = HashSet::with_capacity(points.len());
        for p in &points {
            self.check_vector(&p.vector)
                .map_err(|e| DbError::invalid(format!("point {}: {e}", p.id)))?;
            check_payload(&p.id, &p.payload)?;
            if !seen.insert(&p.id) {
                return Err(twice(&p.id));
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

    /// Inserts or replaces points with their vectors by space name (a
    /// point may lack some spaces; an upsert replaces the whole point, so
    /// a vector it had in a space it now lacks is removed). Every vector
    /// is checked against its space first; nothing is written when one
    /// is wrong.
    pub fn upsert_points(&self, mut points: Vec<PointData>) -> Result<Seq> {
        if points.is_empty() {
            return Ok(self.last_seq());
        }
        let Some(shape) = &self.shape else {
            // The single form: one unnamed dense vector per point.
            let mut single = Vec::with_capacity(points.len());
            for p in points {
                let PointData {
                    id,
                    mut vectors,
                    payload,
                } = p;
                let vector = match (vectors.len(), vectors.pop()) {
                    (1, Some((name, VectorValue::Dense(v)))) if name.is_empty() => v,
                    (0, _) => {
                        return Err(DbError::invalid(format!(
                            "point {id}: the collection's vector is missing"
                        )))
                    }
                    (_, Some((name, _))) => return Err(self.no_space_for(&id, &name)),
                    _ => unreachable!("len > 0 has a last"),
                };
                single.push(PointInput {
                    id,
                    vector,
                    payload,
                });
            }
            return self.upsert_owned(single);
        };
        // Each point's vectors as (space number, value), ascending.
        let mut slots: Vec<Vec<(usize, usize)>> = Vec::with_capacity(points.len());
        let mut seen = HashSet::with_capacity(points.len());
        for p in &points {
            check_payload(&p.id, &p.payload)?;
            if !seen.insert(&p.id) {
                return Err(twice(&p.id));
            }
            let mut mine = Vec::with_capacity(p.vectors.len());
            for (k, (name, v)) in p.vectors.iter().enumerate() {
                let space = self.space_number(name, v).map_err(|e| match e {
                    SpaceMiss::Name => self.no_space_for(&p.id, name),
                    SpaceMiss::Kind(msg) => DbError::invalid(format!("point {}: {msg}", p.id)),
                })?;
                if let VectorValue::Dense(x) = v {
                    check_dense(&self.dense[space].config, x).map_err(|e| {
                        DbError::invalid(format!("point {}: vector {name:?}: {e}", p.id))
                    })?;
                }
                mine.push((space, k));
            }
            mine.sort_unstable();
            if let Some(w) = mine.windows(2).find(|w| w[0].0 == w[1].0) {
                return Err(DbError::invalid(format!(
                    "point {}: vector {:?} given twice",
                    p.id, p.vectors[w[0].1].0
                )));
            }
            slots.push(mine);
        }
        drop(seen);
        let n = points.len();
        let seq = self.commit(|seq, store| {
            let rows = points.iter_mut().zip(&slots).map(|(p, mine)| MultiRow {
                id: store.assign(&p.id),
                ext: std::mem::replace(&mut p.id, ExtId::Num(0)),
                vectors: mine.iter().map(|&(s, k)| (s, &p.vectors[k].1)).collect(),
                payload: std::mem::take(&mut p.payload),
            });
            Ok(encode_upsert_multi(seq, shape, n, rows))
        })?;
        self.counters
            .upserted
            .fetch_add(n as u64, Ordering::Relaxed);
        Ok(seq)
    }

    /// The number of the space `name` (dense spaces first, then sparse),
    /// checked against the value's kind.
    fn space_number(&self, name: &str, v: &VectorValue) -> std::result::Result<usize, SpaceMiss> {
        if let Some(i) = self.dense.iter().position(|d| d.config.name == name) {
            return match v {
                VectorValue::Dense(_) => Ok(i),
                VectorValue::Sparse(_) => Err(SpaceMiss::Kind(format!(
                    "vector {name:?} is dense, got a sparse vector"
                ))),
            };
        }
        if let Some(j) = self.sparse.iter().position(|d| d.config.name == name) {
            return match v {
                VectorValue::Sparse(_) => Ok(self.dense.len() + j),
                VectorValue::Dense(_) => Err(SpaceMiss::Kind(format!(
                    "vector {name:?} is sparse, got a dense vector"
                ))),
            };
        }
        Err(SpaceMiss::Name)
    }

    fn no_space_for(&self, id: &ExtId, name: &str) -> DbError {
        DbError::invalid(format!("point {id}: {}", self.no_space(name)))
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

    /// Merges `payload`'s keys into the payloads of the selected points
    /// (a null removes its key, as in Qdrant); returns how many.
    pub fn set_payload(
        &self,
        ids: Option<&[ExtId]>,
        filter: Option<&Filter>,
        payload: &Value,
    ) -> Result<usize> {
        let Value::Object(m) = payload else {
            return Err(DbError::invalid("the payload to set must be a JSON object"));
        };
        self.edit_payload(ids, filter, &PayloadEdit::Merge(m.clone()))
    }

    /// Applies a payload edit (set with or without a key path, overwrite,
    /// delete keys, clear) to the selected points; returns how many.
    pub fn edit_payload(
        &self,
        ids: Option<&[ExtId]>,
        filter: Option<&Filter>,
        edit: &PayloadEdit,
    ) -> Result<usize> {
        edit.check_depth()?;
        let targets = self.select(ids, filter);
        if targets.is_empty() {
            self.settle()?;
            return Ok(0);
        }
        self.simple_op(OP_SET_PAYLOAD, &targets, &edit.to_json())?;
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
    /// In a collection of several spaces: the main dense space's counters
    /// with every space's memory and disk bytes added (and each further
    /// space's under `extra`, as `space.NAME.memory_bytes`).
    pub fn stats(&self) -> Result<vectide_core::IndexStats> {
        let mut s = match self.dense.first() {
            Some(d) => d.engine.stats()?,
            None => vectide_core::IndexStats {
                live: self.len(),
                ..Default::default()
            },
        };
        for d in self.dense.iter().skip(1) {
            let o = d.engine.stats()?;
            s.memory_bytes += o.memory_bytes;
            s.disk_bytes += o.disk_bytes;
            s.extra.push((
                format!("space.{}.memory_bytes", d.config.name),
                o.memory_bytes as f64,
            ));
        }
        for sp in &self.sparse {
            let m = sp.index.read().memory_bytes();
            s.memory_bytes += m;
            s.extra
                .push((format!("space.{}.memory_bytes", sp.config.name), m as f64));
        }
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
            && self.dense.iter().any(|d| d.engine.maintenance_due())
    }

    /// Runs the engine's pending maintenance (delete consolidation, a
    /// merge) and returns when none is in flight; writes and searches go on
    /// meanwhile. Its progress is in [`Collection::stats`]' extras.
    pub fn maintain(&self) -> Result<()> {
        self.check_open()?;
        for d in &self.dense {
            d.engine.maintain()?;
        }
        Ok(())
    }
}

/// Why a vector found no space.
enum SpaceMiss {
    Name,
    Kind(String),
}

fn check_dense(space: &VectorSpaceConfig, v: &[f32]) -> Result<()> {
    vectide_core::validate::check_vector(space.dim, space.metric, v).map_err(DbError::from)
}

fn check_payload(id: &ExtId, payload: &Value) -> Result<()> {
    if payload.is_null() || payload.is_object() {
        Ok(())
    } else {
        Err(DbError::invalid(format!(
            "point {id}: the payload must be a JSON object"
        )))
    }
}

fn twice(id: &ExtId) -> DbError {
    DbError::invalid(format!("point {id} appears twice in one batch"))
}
