//! Opening a collection: its engine's parameters (the directory, who logs),
//! recovery by replay of the WAL past each side's durable point (the engine,
//! the point store), the checks that refuse states which would lose
//! acknowledged data, and what `repair` does after it cut a damaged log.

use super::{Collection, CollectionConfig, Counters, Options};
use crate::commitlog::{record_seq, CommitLog};
use crate::error::{DbError, Result};
use crate::ids::ExtId;
use crate::record::{decode, Op, ReplayBatch, OP_DELETE};
use crate::store::PointStore;
use parking_lot::{Condvar, Mutex, RwLock};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use vectide_engines::{ParamValue, Params};

pub(super) const INDEX_FILE: &str = "index.vtdx";
const INDEX_DIR: &str = "index";

/// Whether the engine keeps a redo log of its own that it hands over to
/// the collection's WAL (it takes the `log` parameter, and `one_log` is
/// on).
pub(super) fn hands_log_over(engine: &str, opts: &Options) -> bool {
    opts.one_log
        && vectide_engines::descriptor(engine)
            .is_ok_and(|d| d.param(vectide_core::engine::LOG.name).is_some())
}

fn engine_params(config: &CollectionConfig, dir: &Path, opts: &Options) -> Params {
    let threads = opts.threads;
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
    if hands_log_over(&config.engine, opts) {
        // One log: the collection's WAL holds every write; the engine
        // persists its checkpoints only (see `Collection::checkpoint`).
        p.insert(
            vectide_core::engine::LOG.name.into(),
            ParamValue::Str("database".into()),
        );
    }
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
        if config.params.contains_key(vectide_core::engine::LOG.name) {
            return Err(DbError::invalid(
                "collections keep the one log of their writes themselves: do not pass log",
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
        let params = engine_params(&config, dir, &opts);
        let snapshot = dir.join(INDEX_FILE);
        let desc = vectide_engines::descriptor(&config.engine)?;
        let engine = if desc.persistence.saved_by_database() && snapshot.exists() {
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
        let mut store = PointStore::open(dir)?;
        let engine_durable = engine.durable_seq();
        let wal_dir = dir.join("wal");
        let held = engine_durable.max(store.applied_seq());
        let (log, records) = CommitLog::open(&wal_dir, opts.durability, opts.segment_bytes)?;
        if opts.repair {
            // A repair cut the log behind what the engine or the store
            // holds: the numbers between are filled with void records (the
            // operations they stood for were dropped with the cut), so that
            // the log stays contiguous and new operations are numbered above
            // what both sides hold. Re-running a repair continues a fill a
            // crash interrupted.
            log.fill_through(held, |seq| {
                crate::record::encode_targets(seq, OP_DELETE, &[], &serde_json::Value::Null).0
            })?;
        }
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
                "{}: the log starts at sequence number {first} but the point store holds only up to {}: records are missing (are {}'s point store files {} damaged or replaced?)",
                wal_dir.display(),
                store.applied_seq(),
                dir.display(),
                crate::STORE_FILES.join(" and ")
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
        let mut engine_seq = engine_durable;
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
                if op.touches_engine() {
                    engine_seq = op.seq;
                }
            }
            if op.seq > store.applied_seq() {
                store_ops.push(op);
                if store_ops.len() >= 4096 {
                    store.apply_many(store_ops.drain(..).map(|o| (o.seq, o.changes)));
                }
            }
            replayed += 1;
            replayed_bytes += rec.len() as u64 + 8;
        }
        pending.flush(&engine)?;
        store.apply_many(store_ops.drain(..).map(|o| (o.seq, o.changes)));
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
            // With none missing, the engine's live count beyond the
            // store's is the deleted points it still holds (the store
            // forgets deleted ids, so they are counted, not listed).
            let stale = (engine.len() + missing).saturating_sub(store.len());
            if missing > 0 || stale > 0 {
                return Err(DbError::corrupted(format!(
                    "{}: the engine and the point store disagree ({missing} of the store's {} points have no vector, {stale} deleted points still have one): a file of the engine or the store is damaged; `vectide repair` deletes the points that lost their vector",
                    dir.display(),
                    store.len()
                )));
            }
        }
        let next = log.last_seq() + 1;
        // From here on a write never runs the engine's due maintenance
        // under the turn: the database's background thread does.
        engine.defer_maintenance();
        let c = Collection {
            name: name.to_string(),
            dir: dir.to_path_buf(),
            config,
            engine,
            log,
            store: RwLock::new(store),
            turn: Mutex::new(next),
            engine_seq: AtomicU64::new(engine_seq),
            turn_cv: Condvar::new(),
            last_checkpoint: Mutex::new(Instant::now()),
            checkpointing: Mutex::new(()),
            opts,
            closed: AtomicBool::new(false),
            poison: Default::default(),
            activity: Default::default(),
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
        if replayed_bytes >= c.checkpoint_threshold().saturating_mul(2) {
            c.checkpoint()?;
        }
        Ok(Collection {
            opened_in: t0.elapsed(),
            ..c
        })
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
            // Deleted ids are forgotten: every internal id ever assigned
            // that is not live is looked up (a repair is rare; an open
            // only counts them).
            let mut stale = Vec::new();
            for id in 0..store.next_internal() {
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
            self.engine_seq.fetch_max(*turn - 1, Ordering::AcqRel);
        }
        Ok((orphans, stale.len()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vectide_core::Metric;

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
        let p = engine_params(&config, dir.path(), &Options::default());
        assert!(!p.contains_key("wal_buffer"));
        assert_eq!(p.get("m"), Some(&ParamValue::Int(8)));
        assert_eq!(p.get("threads"), Some(&ParamValue::Int(256)));
        assert!(p.contains_key("path"));
        vectide_engines::open_or_create("hnsw-snap", 4, Metric::L2, &p).unwrap();
    }
}
