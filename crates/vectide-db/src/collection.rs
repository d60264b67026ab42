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

use crate::commitlog::{record_seq, CommitLog, Durability};
use crate::error::{DbError, Result};
use crate::filter::Filter;
use crate::ids::ExtId;
use crate::store::{Change, IndexKind, Point, PointStore};
use parking_lot::{Condvar, Mutex, RwLock};
use serde_json::Value;
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use vectide_core::{Metric, Neighbor, SearchParams, Seq};
use vectide_engines::{AnyIndex, ParamValue, Params, Persistence};

/// How a collection is built (kept in the catalog).
#[derive(Debug, Clone, PartialEq)]
pub struct CollectionConfig {
    pub dim: usize,
    pub metric: Metric,
    pub engine: String,
    pub params: Params,
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

const OP_UPSERT: u8 = 1;
const OP_DELETE: u8 = 2;
const OP_SET_PAYLOAD: u8 = 3;

/// Filters whose matches are at most this many are answered exactly, by
/// scanning the matches, instead of by a filtered graph search.
pub const EXACT_MAX: usize = 20_000;

/// A decoded WAL record.
#[derive(Debug)]
struct Op {
    seq: Seq,
    kind: u8,
    ids: Vec<u64>,
    vectors: Vec<f32>,
    changes: Vec<Change>,
}

fn put_u32(b: &mut Vec<u8>, v: u32) {
    b.extend_from_slice(&v.to_le_bytes());
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let s = self
            .b
            .get(self.at..self.at + n)
            .ok_or_else(|| DbError::corrupted("WAL record truncated"))?;
        self.at += n;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4")))
    }
    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8")))
    }
    fn ext(&mut self) -> Result<ExtId> {
        let (id, n) = ExtId::decode(&self.b[self.at..])?;
        self.at += n;
        Ok(id)
    }
    fn json(&mut self) -> Result<Value> {
        let n = self.u32()? as usize;
        if n == 0 {
            return Ok(Value::Null);
        }
        serde_json::from_slice(self.take(n)?)
            .map_err(|e| DbError::corrupted(format!("WAL payload: {e}")))
    }
}

fn put_json(b: &mut Vec<u8>, v: &Value) {
    if v.is_null() {
        put_u32(b, 0);
    } else {
        let s = v.to_string();
        put_u32(b, s.len() as u32);
        b.extend_from_slice(s.as_bytes());
    }
}

fn decode(payload: &[u8], dim: usize) -> Result<Op> {
    let mut r = Reader { b: payload, at: 0 };
    let seq = r.u64()?;
    let kind = r.u8()?;
    let n = r.u32()? as usize;
    if n > payload.len() {
        return Err(DbError::corrupted(
            "WAL record claims more points than it holds",
        ));
    }
    let mut op = Op {
        seq,
        kind,
        ids: Vec::with_capacity(n),
        vectors: Vec::new(),
        changes: Vec::with_capacity(n),
    };
    for _ in 0..n {
        let id = r.u64()?;
        let ext = r.ext()?;
        op.ids.push(id);
        match kind {
            OP_UPSERT => {
                let raw = r.take(4 * dim)?;
                op.vectors.extend(
                    raw.chunks_exact(4)
                        .map(|c| f32::from_le_bytes(c.try_into().expect("4"))),
                );
                let payload = r.json()?;
                op.changes.push(Change::Upsert { id, ext, payload });
            }
            OP_DELETE => op.changes.push(Change::Delete { id, ext }),
            OP_SET_PAYLOAD => {
                let payload = r.json()?;
                op.changes.push(Change::SetPayload { id, ext, payload });
            }
            k => {
                return Err(DbError::corrupted(format!(
                    "WAL record of unknown kind {k}"
                )))
            }
        }
    }
    Ok(op)
}

/// Consecutive upserts of a WAL tail, replayed into the engine as one batch
/// (one call instead of one per record, which dominated restart time). A
/// batch ends at a delete, at an id it already holds, or at 4096 points; it
/// carries the sequence number of its last record, which is harmless: each
/// point is applied once, and everything up to that number is applied when
/// the batch is.
#[derive(Default)]
struct ReplayBatch {
    seq: Seq,
    ids: Vec<u64>,
    vectors: Vec<f32>,
    seen: HashSet<u64>,
}

impl ReplayBatch {
    fn add(&mut self, engine: &AnyIndex, op: &Op) -> Result<()> {
        if op.kind != OP_UPSERT || op.ids.iter().any(|i| self.seen.contains(i)) {
            self.flush(engine)?;
        }
        if op.kind != OP_UPSERT {
            return Collection::apply_engine(engine, op);
        }
        self.seq = op.seq;
        self.ids.extend_from_slice(&op.ids);
        self.vectors.extend_from_slice(&op.vectors);
        self.seen.extend(op.ids.iter().copied());
        if self.ids.len() >= 4096 {
            self.flush(engine)?;
        }
        Ok(())
    }

    fn flush(&mut self, engine: &AnyIndex) -> Result<()> {
        if !self.ids.is_empty() {
            engine.insert(self.seq, &self.ids, &self.vectors)?;
            self.ids.clear();
            self.vectors.clear();
            self.seen.clear();
        }
        Ok(())
    }
}

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
    turn_cv: Condvar,
    last_checkpoint: Mutex<Instant>,
    opts: Options,
    /// Set when the database closes or the collection is deleted: writes
    /// and searches through a remaining handle then fail with `Closed`.
    closed: AtomicBool,
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

const INDEX_FILE: &str = "index.vtdx";
const INDEX_DIR: &str = "index";

fn engine_params(config: &CollectionConfig, dir: &Path, threads: Option<usize>) -> Params {
    let mut p = config.params.clone();
    // Catalogs written before `threads` was bounded may hold more: clamp
    // them rather than refuse to open the collection.
    if let Some(ParamValue::Int(t)) = p.get_mut("threads") {
        *t = (*t).clamp(1, vectide_core::limits::MAX_THREADS as i64);
    }
    // Catalogs written before engines checked their parameters against
    // their schema may hold one the engine never used (`wal_buffer` for
    // `hnsw-snap`): drop it rather than refuse to open the collection.
    if let Ok(d) = vectide_engines::descriptor(&config.engine) {
        p.retain(|k, _| d.param(k).is_some());
    }
    let in_dir =
        vectide_engines::descriptor(&config.engine).is_ok_and(|d| d.persistence.in_directory());
    if in_dir {
        p.insert(
            "path".into(),
            ParamValue::Str(dir.join(INDEX_DIR).display().to_string()),
        );
    }
    if let (Some(t), false) = (threads, p.contains_key("threads")) {
        p.insert("threads".into(), ParamValue::Int(t as i64));
    }
    p
}

impl Collection {
    /// Checks a configuration by building a throwaway engine (durable
    /// engines are checked without touching disk: parameters only).
    pub fn validate_config(config: &CollectionConfig) -> Result<()> {
        if config.params.contains_key("path") {
            return Err(DbError::invalid(
                "collections place their engine themselves: do not pass path",
            ));
        }
        vectide_engines::validate(&config.engine, config.dim, &config.params)?;
        Ok(())
    }

    /// Opens (recovering) or creates the collection in `dir`.
    pub fn open(
        name: &str,
        dir: &Path,
        config: CollectionConfig,
        opts: Options,
    ) -> Result<Collection> {
        let t0 = Instant::now();
        std::fs::create_dir_all(dir).map_err(|e| DbError::io_at(dir, e))?;
        let params = engine_params(&config, dir, opts.threads);
        let snapshot = dir.join(INDEX_FILE);
        let desc = vectide_engines::descriptor(&config.engine)?;
        let engine = if desc.persistence == Persistence::Volatile && snapshot.exists() {
            let e = vectide_engines::load(&snapshot, opts.threads)?;
            if e.dim() != config.dim || e.metric() != config.metric || e.engine() != config.engine {
                return Err(DbError::corrupted(format!(
                    "{}: the engine snapshot does not match the collection",
                    snapshot.display()
                )));
            }
            e
        } else {
            vectide_engines::open_or_create(&config.engine, config.dim, config.metric, &params)?
        };
        let store_path = dir.join(crate::STORE_FILE);
        let mut store = crate::guard::catch_corruption(&store_path.display().to_string(), || {
            PointStore::open(&store_path)
        })?;
        let engine_durable = engine.durable_seq();
        let wal_dir = dir.join("wal");
        let held = engine_durable.max(store.applied_seq());
        let (log, records) = CommitLog::open(
            &wal_dir,
            opts.durability,
            opts.segment_bytes,
            if opts.repair { held } else { 0 },
        )?;
        // Both sides apply an operation only after its record is durable,
        // so neither can be ahead of the log unless the log lost records.
        if held > log.last_seq() {
            return Err(DbError::corrupted(format!(
                "{}: the log ends at sequence number {} but the engine or the point store holds operations through {held}: acknowledged records were lost from the log; `vectide repair` reconciles what is left",
                wal_dir.display(),
                log.last_seq()
            )));
        }
        // The store applies every operation: the log must continue right
        // after what it holds, or acknowledged operations are missing.
        let first = records
            .first()
            .map(|r| record_seq(r))
            .transpose()?
            .unwrap_or(log.first_seq())
            .min(log.first_seq());
        if first > store.applied_seq() + 1 {
            return Err(DbError::corrupted(format!(
                "{}: the log starts at sequence number {first} but the point store holds only up to {}: records are missing (is {} damaged or replaced?)",
                wal_dir.display(),
                store.applied_seq(),
                store_path.display()
            )));
        }
        if engine_durable < store.engine_checkpoint() {
            return Err(DbError::corrupted(format!(
                "{}: the engine holds operations only through sequence number {engine_durable}, but the last checkpoint made it durable through {}: its files lost data the log no longer holds",
                dir.display(),
                store.engine_checkpoint()
            )));
        }
        let mut replayed = 0u64;
        let mut replayed_bytes = 0u64;
        // The store's share of the tail goes in one transaction per chunk
        // (a commit per record would dominate restart time).
        let mut store_ops: Vec<Op> = Vec::new();
        let mut pending = ReplayBatch::default();
        for rec in &records {
            let seq = record_seq(rec)?;
            if seq <= engine_durable && seq <= store.applied_seq() {
                continue;
            }
            let op = decode(rec, config.dim)?;
            if op.seq > engine_durable {
                pending.add(&engine, &op)?;
            }
            if op.seq > store.applied_seq() {
                store_ops.push(op);
                if store_ops.len() >= 4096 {
                    store.apply_many(store_ops.iter().map(|o| (o.seq, &o.changes[..])))?;
                    store_ops.clear();
                }
            }
            replayed += 1;
            replayed_bytes += rec.len() as u64 + 8;
        }
        pending.flush(&engine)?;
        store.apply_many(store_ops.iter().map(|o| (o.seq, &o.changes[..])))?;
        drop(store_ops);
        log.set_bytes_since_checkpoint(replayed_bytes);
        // After replay, the engine and the store hold the same live points
        // (each applies every operation, the engine first). A difference
        // means an engine or store file lost or changed data.
        if !opts.repair {
            let mut missing = 0;
            for (&id, _) in store.iter() {
                missing += usize::from(!engine.contains(id)?);
            }
            let mut stale = 0;
            for id in store.assigned() {
                stale += usize::from(store.get(id).is_none() && engine.contains(id)?);
            }
            if missing > 0 || stale > 0 {
                return Err(DbError::corrupted(format!(
                    "{}: the engine and the point store disagree ({missing} of the store's {} points have no vector, {stale} deleted points still have one): a file of the engine or the store is damaged; `vectide repair` deletes the points that lost their vector",
                    dir.display(),
                    store.len()
                )));
            }
        }
        let next = log.last_seq() + 1;
        let c = Collection {
            name: name.to_string(),
            dir: dir.to_path_buf(),
            config,
            engine,
            log,
            store: RwLock::new(store),
            turn: Mutex::new(next),
            turn_cv: Condvar::new(),
            last_checkpoint: Mutex::new(Instant::now()),
            opts,
            closed: AtomicBool::new(false),
            counters: Counters::default(),
            opened_in: Duration::ZERO,
        };
        c.counters.replayed.store(replayed, Ordering::Relaxed);
        // The replayed tail counts towards the next checkpoint, which the
        // background thread takes as soon as it is due. A process that keeps
        // dying before that would replay an ever longer tail at each start,
        // so a replay of twice the threshold checkpoints now, before the open
        // returns: the tail replayed at open never exceeds about twice the
        // threshold, however often the process dies.
        if replayed_bytes >= 2 * c.checkpoint_threshold() {
            c.checkpoint()?;
        }
        Ok(Collection {
            opened_in: t0.elapsed(),
            ..c
        })
    }

    fn apply_engine(engine: &AnyIndex, op: &Op) -> Result<()> {
        match op.kind {
            OP_UPSERT => engine.insert(op.seq, &op.ids, &op.vectors)?,
            OP_DELETE => {
                engine.delete(op.seq, &op.ids)?;
            }
            _ => {}
        }
        Ok(())
    }

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
        let (seq, op) = self.log.append(|seq| {
            let mut store = self.store.write();
            make(seq, &mut store)
        })?;
        let durable = self.log.commit(seq);
        let mut turn = self.turn.lock();
        while *turn != seq {
            self.turn_cv.wait(&mut turn);
        }
        let result = durable.and_then(|()| {
            Self::apply_engine(&self.engine, &op)?;
            self.store.write().apply(seq, &op.changes)
        });
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
        if points.is_empty() {
            return Ok(self.last_seq());
        }
        let mut seen = HashSet::with_capacity(points.len());
        for p in points {
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
        let dim = self.config.dim;
        let seq = self.commit(|seq, store| {
            let mut b = Vec::with_capacity(16 + points.len() * (4 * dim + 64));
            b.extend_from_slice(&seq.to_le_bytes());
            b.push(OP_UPSERT);
            put_u32(&mut b, points.len() as u32);
            let mut op = Op {
                seq,
                kind: OP_UPSERT,
                ids: Vec::with_capacity(points.len()),
                vectors: Vec::with_capacity(points.len() * dim),
                changes: Vec::with_capacity(points.len()),
            };
            for p in points {
                let id = store.assign(&p.id);
                b.extend_from_slice(&id.to_le_bytes());
                p.id.encode(&mut b);
                for x in &p.vector {
                    b.extend_from_slice(&x.to_le_bytes());
                }
                put_json(&mut b, &p.payload);
                op.ids.push(id);
                op.vectors.extend_from_slice(&p.vector);
                op.changes.push(Change::Upsert {
                    id,
                    ext: p.id.clone(),
                    payload: p.payload.clone(),
                });
            }
            Ok((b, op))
        })?;
        self.counters
            .upserted
            .fetch_add(points.len() as u64, Ordering::Relaxed);
        Ok(seq)
    }

    /// The live internal ids the selector names: explicit ids (unknown ones
    /// ignored) or every point a filter accepts.
    fn select(&self, ids: Option<&[ExtId]>, filter: Option<&Filter>) -> Vec<(u64, ExtId)> {
        let store = self.store.read();
        match (ids, filter) {
            (Some(ids), f) => ids
                .iter()
                .filter_map(|e| store.internal(e).map(|i| (i, e)))
                .filter(|(i, _)| {
                    store
                        .get(*i)
                        .is_some_and(|p| f.is_none_or(|f| f.eval(&p.ext, &p.payload)))
                })
                .map(|(i, e)| (i, e.clone()))
                .collect(),
            (None, Some(f)) => {
                let cands = store.index_candidates(f);
                let mut out: Vec<(u64, ExtId)> = match cands {
                    Some((c, exact)) => c
                        .into_iter()
                        .filter_map(|i| {
                            store
                                .get(i)
                                .filter(|p| exact || f.eval(&p.ext, &p.payload))
                                .map(|p| (i, p.ext.clone()))
                        })
                        .collect(),
                    None => store
                        .iter()
                        .filter(|(_, p)| f.eval(&p.ext, &p.payload))
                        .map(|(&i, p)| (i, p.ext.clone()))
                        .collect(),
                };
                out.sort_unstable_by_key(|x| x.0);
                out
            }
            (None, None) => Vec::new(),
        }
    }

    fn simple_op(&self, kind: u8, targets: &[(u64, ExtId)], payload: &Value) -> Result<Seq> {
        self.commit(|seq, _| {
            let mut b = Vec::with_capacity(16 + targets.len() * 32);
            b.extend_from_slice(&seq.to_le_bytes());
            b.push(kind);
            put_u32(&mut b, targets.len() as u32);
            let mut op = Op {
                seq,
                kind,
                ids: Vec::with_capacity(targets.len()),
                vectors: Vec::new(),
                changes: Vec::with_capacity(targets.len()),
            };
            for (id, ext) in targets {
                b.extend_from_slice(&id.to_le_bytes());
                ext.encode(&mut b);
                op.ids.push(*id);
                op.changes.push(if kind == OP_DELETE {
                    Change::Delete {
                        id: *id,
                        ext: ext.clone(),
                    }
                } else {
                    put_json(&mut b, payload);
                    Change::SetPayload {
                        id: *id,
                        ext: ext.clone(),
                        payload: payload.clone(),
                    }
                });
            }
            Ok((b, op))
        })
    }

    /// Deletes points named by id or matched by a filter; returns how many.
    pub fn delete(&self, ids: Option<&[ExtId]>, filter: Option<&Filter>) -> Result<usize> {
        let targets = self.select(ids, filter);
        if targets.is_empty() {
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
            return Ok(0);
        }
        self.simple_op(OP_SET_PAYLOAD, &targets, payload)?;
        Ok(targets.len())
    }

    /// Points by id, in the order asked; unknown ids give `None`.
    pub fn get(&self, ids: &[ExtId], with_vector: bool) -> Result<Vec<Option<Record>>> {
        let store = self.store.read();
        let mut out = Vec::with_capacity(ids.len());
        for e in ids {
            let Some((i, p)) = store.internal(e).and_then(|i| Some((i, store.get(i)?))) else {
                out.push(None);
                continue;
            };
            out.push(Some(Record {
                id: p.ext.clone(),
                payload: p.payload.clone(),
                vector: self.vector_of(i, with_vector)?,
            }));
        }
        Ok(out)
    }

    /// The engine's vector of a point when asked for.
    fn vector_of(&self, i: u64, with_vector: bool) -> Result<Option<Vec<f32>>> {
        Ok(if with_vector {
            self.engine.get(i)?
        } else {
            None
        })
    }

    /// Points matching a filter (all without one).
    pub fn count(&self, filter: Option<&Filter>) -> usize {
        match filter {
            None => self.len(),
            Some(f) => self.select(None, Some(f)).len(),
        }
    }

    /// A page of points ordered by id, starting at `offset` (inclusive);
    /// returns the page and the id where the next page starts.
    pub fn scroll(
        &self,
        filter: Option<&Filter>,
        offset: Option<&ExtId>,
        limit: usize,
        with_vector: bool,
    ) -> Result<(Vec<Record>, Option<ExtId>)> {
        let store = self.store.read();
        let mut all: Vec<(&ExtId, u64, &Point)> = store
            .iter()
            .filter(|(_, p)| filter.is_none_or(|f| f.eval(&p.ext, &p.payload)))
            .filter(|(_, p)| offset.is_none_or(|o| &p.ext >= o))
            .map(|(&i, p)| (&p.ext, i, p))
            .collect();
        all.sort_unstable_by(|a, b| a.0.cmp(b.0));
        let next = all.get(limit).map(|x| x.0.clone());
        let page = all
            .into_iter()
            .take(limit)
            .map(|(e, i, p)| {
                Ok(Record {
                    id: e.clone(),
                    payload: p.payload.clone(),
                    vector: self.vector_of(i, with_vector)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok((page, next))
    }

    /// The `k` nearest points to `query` that pass `filter`.
    ///
    /// Without a filter: the engine's search. With one: the payload indexes
    /// (or a sample of 512 points, when no index applies) estimate how many
    /// points match. At most `exact_max` matches are answered exactly by
    /// computing their distances; more go to the engine's filtered graph
    /// search (the predicate is evaluated during the traversal) with `ef`
    /// raised to `k / selectivity` (at most 4096), so that restrictive
    /// filters keep their recall.
    pub fn search(
        &self,
        query: &[f32],
        k: usize,
        params: &SearchParams,
        filter: Option<&Filter>,
        with_payload: bool,
        with_vector: bool,
    ) -> Result<Vec<Hit>> {
        self.check_open()?;
        if k == 0 {
            return Err(DbError::invalid("k (limit) must be at least 1"));
        }
        vectide_core::limits::check_k(k)?;
        self.check_vector(query)?;
        self.counters.searches.fetch_add(1, Ordering::Relaxed);
        let store = self.store.read();
        let filter = filter.filter(|f| !f.is_trivial());
        let found: Vec<(u64, f32)> = match filter {
            None if params.exact => {
                let all: Vec<u64> = store.iter().map(|(&i, _)| i).collect();
                self.exact(query, k, &all)?
            }
            None => self
                .engine
                .search(query, k, params, None)?
                .into_iter()
                .map(|n| (n.id, n.distance))
                .collect(),
            Some(f) => {
                let n = store.len().max(1);
                let estimate = match store.index_estimate(f) {
                    Some(c) => c,
                    None => {
                        let step = (n / 512).max(1);
                        let hits = store
                            .iter()
                            .step_by(step)
                            .take(512)
                            .filter(|(_, p)| f.eval(&p.ext, &p.payload))
                            .count();
                        let sampled = n.div_ceil(step).clamp(1, 512);
                        hits * n / sampled
                    }
                };
                if params.exact || estimate <= self.opts.exact_max {
                    let matches: Vec<u64> = match store.index_candidates(f) {
                        Some((c, true)) => c,
                        Some((c, false)) => c
                            .into_iter()
                            .filter(|i| store.get(*i).is_some_and(|p| f.eval(&p.ext, &p.payload)))
                            .collect(),
                        None => store
                            .iter()
                            .filter(|(_, p)| f.eval(&p.ext, &p.payload))
                            .map(|(&i, _)| i)
                            .collect(),
                    };
                    self.exact(query, k, &matches)?
                } else {
                    let sel = (estimate as f64 / n as f64).clamp(1e-6, 1.0);
                    // Engines with a candidate list widen it by the
                    // filter's selectivity (others take the knobs as given).
                    let mut widened = params.clone();
                    if let Some(base) = params.ef.or(self.engine.search_defaults().ef) {
                        let ef = (k as f64 / sel).ceil() as usize;
                        widened.ef = Some(ef.max(base.max(k)).min(4096));
                    }
                    let pred = |i: u64| store.get(i).is_some_and(|p| f.eval(&p.ext, &p.payload));
                    self.engine
                        .search(query, k, &widened, Some(&pred))?
                        .into_iter()
                        .map(|n| (n.id, n.distance))
                        .collect()
                }
            }
        };
        let mut hits = Vec::with_capacity(found.len());
        for (i, d) in found {
            if let Some(p) = store.get(i) {
                hits.push(Hit {
                    id: p.ext.clone(),
                    distance: d,
                    payload: with_payload.then(|| p.payload.clone()),
                    vector: self.vector_of(i, with_vector)?,
                });
            }
        }
        Ok(hits)
    }

    /// Exact top-k among `ids` by the engine's distance.
    fn exact(&self, query: &[f32], k: usize, ids: &[u64]) -> Result<Vec<(u64, f32)>> {
        let mut all = Vec::with_capacity(ids.len());
        self.engine.distances(query, ids, &mut all)?;
        let by =
            |a: &Neighbor, b: &Neighbor| a.distance.total_cmp(&b.distance).then(a.id.cmp(&b.id));
        if all.len() > k {
            all.select_nth_unstable_by(k, by);
            all.truncate(k);
        }
        all.sort_by(by);
        Ok(all.into_iter().map(|n| (n.id, n.distance)).collect())
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

    /// Whether the checkpoint policy calls for a checkpoint now.
    pub fn checkpoint_due(&self) -> bool {
        let bytes = self.log.bytes_since_checkpoint();
        bytes >= self.checkpoint_threshold()
            || (bytes > 0 && self.last_checkpoint.lock().elapsed() >= self.opts.checkpoint_interval)
    }

    /// WAL bytes (counted from what a restart would replay) that make a
    /// checkpoint due (see [`Options::checkpoint_bytes`]).
    pub fn checkpoint_threshold(&self) -> u64 {
        let o = &self.opts;
        let index = self.engine.stats().map_or(0, |s| s.memory_bytes) as f64 * o.checkpoint_ratio;
        let cap = o.checkpoint_bytes.max(1);
        (index as u64).clamp(o.checkpoint_min_bytes.min(cap), cap)
    }

    /// WAL bytes a restart now would replay (about).
    pub fn wal_tail_bytes(&self) -> u64 {
        self.log.bytes_since_checkpoint()
    }

    /// Saves or flushes the engine, makes the store durable, and deletes the
    /// WAL segments both cover. Writers wait while it runs.
    pub fn checkpoint(&self) -> Result<()> {
        self.checkpoint_and(false)
    }

    /// The last checkpoint, at the database's close: a durable engine is
    /// closed (its background work stopped, the rest made durable) rather
    /// than flushed; a volatile one is saved, which is all its close would
    /// do again.
    pub(crate) fn final_checkpoint(&self) -> Result<()> {
        self.checkpoint_and(true)
    }

    fn checkpoint_and(&self, close: bool) -> Result<()> {
        let turn = self.turn.lock();
        if self.engine.descriptor().persistence == Persistence::Volatile {
            self.engine.save(&self.dir.join(INDEX_FILE))?;
        } else if close {
            self.engine.close()?;
        } else {
            self.engine.flush()?;
        }
        self.store.write().checkpoint(self.engine.durable_seq())?;
        // Every operation before the turn is applied, and the engine and the
        // store now hold all of them durably (operations that do not touch
        // the engine, such as payload updates, leave its own counter behind).
        let upto = *turn - 1;
        drop(turn);
        self.log.truncate_through(upto)?;
        *self.last_checkpoint.lock() = Instant::now();
        self.counters.checkpoints.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Makes the store and the engine agree after a repair cut the WAL
    /// (either may hold operations from after the cut): points the store
    /// holds without a vector in the engine are deleted (returned), and
    /// vectors the engine holds for points the store deleted are removed
    /// from the engine (counted). The caller checkpoints afterwards.
    pub fn remove_orphans(&self) -> Result<(Vec<ExtId>, usize)> {
        let (orphans, stale): (Vec<ExtId>, Vec<u64>) = {
            let store = self.store.read();
            let mut orphans = Vec::new();
            for (&id, p) in store.iter() {
                if !self.engine.contains(id)? {
                    orphans.push(p.ext.clone());
                }
            }
            let mut stale = Vec::new();
            for id in store.assigned() {
                if store.get(id).is_none() && self.engine.contains(id)? {
                    stale.push(id);
                }
            }
            (orphans, stale)
        };
        if !orphans.is_empty() {
            self.delete(Some(&orphans), None)?;
        }
        if !stale.is_empty() {
            let turn = self.turn.lock();
            self.engine.delete(*turn - 1, &stale)?;
        }
        Ok((orphans, stale.len()))
    }

    /// `fdatasync`s of the WAL so far (group commit shares them).
    pub fn wal_syncs(&self) -> u64 {
        self.log.syncs()
    }

    /// WAL segment files (for checks and metrics).
    pub fn wal_segments(&self) -> usize {
        self.log.segments()
    }

    /// The engine's size counters.
    pub fn stats(&self) -> Result<vectide_core::IndexStats> {
        Ok(self.engine.stats()?)
    }

    /// Runs the engine's pending maintenance (delete consolidation, a
    /// merge) and returns when none is in flight; writes and searches go on
    /// meanwhile. Its progress is in [`Collection::stats`]' extras.
    pub fn maintain(&self) -> Result<()> {
        self.check_open()?;
        Ok(self.engine.maintain()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn catalog_params_an_engine_does_not_take_are_dropped_at_open() {
        // A catalog written when hnsw-snap still accepted `wal_buffer`.
        let mut params = Params::new();
        params.insert("wal_buffer".into(), ParamValue::Int(1024));
        params.insert("m".into(), ParamValue::Int(8));
        params.insert("threads".into(), ParamValue::Int(1500));
        let config = CollectionConfig {
            dim: 4,
            metric: Metric::L2,
            engine: "hnsw-snap".into(),
            params,
        };
        let dir = tempfile::tempdir().unwrap();
        let p = engine_params(&config, dir.path(), None);
        assert!(!p.contains_key("wal_buffer"));
        assert_eq!(p.get("m"), Some(&ParamValue::Int(8)));
        assert_eq!(p.get("threads"), Some(&ParamValue::Int(256)));
        assert!(p.contains_key("path"));
        vectide_engines::open_or_create("hnsw-snap", 4, Metric::L2, &p).unwrap();
    }
}
