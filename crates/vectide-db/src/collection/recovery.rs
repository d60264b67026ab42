//! Opening a collection: its engine's parameters (the directory, who logs),
//! recovery by replay of the WAL past each side's durable point (the engine,
//! the point store), the checks that refuse states which would lose
//! acknowledged data, and what `repair` does after it cut a damaged log.

use super::apply::{apply, Durable};
use super::{Collection, CollectionConfig, Counters, Options};
use crate::commitlog::{record_seq, CommitLog};
use crate::error::{DbError, Result};
use crate::ids::ExtId;
use crate::record::{decode_for, Op, ReplayBatch, OP_DELETE};
use crate::spaces::{
    check_space_name, dense_dir, sparse_file, DenseSpace, SparseSpace, VectorSpaceConfig,
    MAX_SPACES,
};
use crate::store::PointStore;
use parking_lot::{Condvar, Mutex, RwLock};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use vectide_core::Seq;
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

fn engine_params(config: &VectorSpaceConfig, dir: &Path, opts: &Options) -> Params {
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
    /// Checks a configuration by building a throwaway engine per dense
    /// space (durable engines are checked without touching disk:
    /// parameters only), and the spaces' names.
    pub fn validate_config(config: &CollectionConfig) -> Result<()> {
        let dense = config.dense_spaces();
        if config.dim == 0 && config.sparse_vectors.is_empty() {
            return Err(DbError::invalid(
                "a collection needs a vector space: dim must be at least 1 (or give sparse vectors)",
            ));
        }
        if config.dim == 0 && !config.more_vectors.is_empty() {
            return Err(DbError::invalid(
                "a collection's first dense space is its main one: more_vectors without a main space",
            ));
        }
        if dense.len() + config.sparse_vectors.len() > MAX_SPACES {
            return Err(DbError::invalid(format!(
                "a collection has at most {MAX_SPACES} vector spaces"
            )));
        }
        let mut names = std::collections::HashSet::new();
        let all = dense
            .iter()
            .map(|d| &d.name)
            .chain(config.sparse_vectors.iter().map(|s| &s.name));
        for name in all {
            check_space_name(name)?;
            if !names.insert(name) {
                return Err(DbError::invalid(format!(
                    "vector name {name:?} is used twice"
                )));
            }
        }
        for (i, space) in dense.iter().enumerate() {
            let at = |e: DbError| {
                if config.is_single() {
                    e
                } else {
                    DbError::invalid(format!("vector {:?}: {e}", space.name))
                }
            };
            if space.params.contains_key("path") {
                return Err(at(DbError::invalid(
                    "collections place their engine themselves: do not pass path",
                )));
            }
            if space.params.contains_key(vectide_core::engine::LOG.name) {
                return Err(at(DbError::invalid(
                    "collections keep the one log of their writes themselves: do not pass log",
                )));
            }
            if i > 0
                && vectide_engines::descriptor(&space.engine)
                    .is_ok_and(|d| d.persistence == vectide_engines::Persistence::OnMemoryNode)
            {
                return Err(at(DbError::invalid(format!(
                    "engine {} lives on a memory node: only a collection's first vector space may use it",
                    space.engine
                ))));
            }
            vectide_engines::validate(&space.engine, space.dim, &space.params)
                .map_err(|e| at(e.into()))?;
        }
        Ok(())
    }

    /// Opens (or creates) dense space `i`'s engine in its directory.
    fn open_dense(
        space: &VectorSpaceConfig,
        dir: &Path,
        i: usize,
        opts: &Options,
    ) -> Result<DenseSpace> {
        let sdir = dense_dir(dir, i);
        std::fs::create_dir_all(&sdir).map_err(|e| DbError::io_at(&sdir, e))?;
        let params = engine_params(space, &sdir, opts);
        let snapshot = sdir.join(INDEX_FILE);
        let desc = vectide_engines::descriptor(&space.engine)?;
        let engine = if desc.persistence.saved_by_database() && snapshot.exists() {
            let e = vectide_engines::load(&snapshot, opts.threads)?;
            if e.dim() != space.dim || e.metric() != space.metric || e.engine() != space.engine {
                return Err(DbError::corrupted(format!(
                    "{}: the engine snapshot does not match the collection",
                    snapshot.display()
                )));
            }
            e
        } else {
            vectide_engines::open_or_create(&space.engine, space.dim, space.metric, &params)?
        };
        let seq = engine.durable_seq();
        Ok(DenseSpace {
            config: space.clone(),
            engine,
            engine_seq: AtomicU64::new(seq),
        })
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
        let dense = config
            .dense_spaces()
            .iter()
            .enumerate()
            .map(|(i, space)| Self::open_dense(space, dir, i, &opts))
            .collect::<Result<Vec<_>>>()?;
        let sparse = config
            .sparse_vectors
            .iter()
            .enumerate()
            .map(|(j, space)| SparseSpace::open(space.clone(), sparse_file(dir, j)))
            .collect::<Result<Vec<_>>>()?;
        let shape = (!config.is_single()).then(|| config.shape());
        let durable = Durable {
            dense: dense.iter().map(|d| d.engine.durable_seq()).collect(),
            sparse: sparse.iter().map(SparseSpace::durable_seq).collect(),
        };
        let mut store = PointStore::open(dir)?;
        let spaces_durable = durable.dense.iter().chain(&durable.sparse);
        // The oldest durable point of a space (the store's without one).
        let engine_durable = spaces_durable
            .clone()
            .copied()
            .min()
            .unwrap_or(store.applied_seq());
        // Records from here on are due in some space (an engine durable
        // per call takes the record at its durable point again: `apply`).
        let due_from = dense
            .iter()
            .zip(&durable.dense)
            .map(|(d, &s)| if d.engine.keeps_itself() { s } else { s + 1 })
            .chain(durable.sparse.iter().map(|s| s + 1))
            .min()
            .unwrap_or(Seq::MAX);
        let wal_dir = dir.join("wal");
        let held = spaces_durable
            .copied()
            .max()
            .unwrap_or(0)
            .max(store.applied_seq());
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
        // The store's share of the tail goes in one transaction per chunk
        // (a commit per record would dominate restart time).
        let mut store_ops: Vec<Op> = Vec::new();
        let mut pending = ReplayBatch::default();
        for rec in &records {
            let seq = record_seq(rec)?;
            if seq < due_from && seq <= store.applied_seq() {
                continue;
            }
            let op = decode_for(rec, config.dim, shape.as_ref())?;
            match (&shape, dense.first()) {
                // The single form: consecutive upserts in one batch.
                (None, Some(main)) => {
                    if op.seq > durable.dense[0] {
                        pending.add(&main.engine, &op)?;
                        if op.touches_engine() {
                            main.engine_seq.store(op.seq, Ordering::Release);
                        }
                    }
                }
                _ => apply(&dense, &sparse, &op, Some(&durable))?,
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
        if let (None, Some(main)) = (&shape, dense.first()) {
            pending.flush(&main.engine)?;
        }
        store.apply_many(store_ops.drain(..).map(|o| (o.seq, o.changes)));
        drop(store_ops);
        log.set_bytes_since_checkpoint(replayed_bytes);
        // After replay, the engine and the store hold the same live points
        // (each applies every operation, the engine first). A difference
        // means an engine or store file lost or changed data.
        if !opts.repair {
            check_agreement(dir, &store, &dense, &sparse, shape.is_none())?;
        }
        let next = log.last_seq() + 1;
        // From here on a write never runs the engine's due maintenance
        // under the turn: the database's background thread does.
        for d in &dense {
            d.engine.defer_maintenance();
        }
        let c = Collection {
            name: name.to_string(),
            dir: dir.to_path_buf(),
            config,
            dense,
            sparse,
            shape,
            log,
            store: RwLock::new(store),
            turn: Mutex::new(next),
            turn_cv: Condvar::new(),
            last_checkpoint: Mutex::new(Instant::now()),
            checkpointing: Mutex::new(()),
            opts,
            closed: AtomicBool::new(false),
            poison: Default::default(),
            activity: Default::default(),
            query_pool: std::sync::OnceLock::new(),
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
        let (orphans, stale): (Vec<ExtId>, Vec<Vec<u64>>) = {
            let store = self.store.read();
            let mut orphans = Vec::new();
            // In a multi collection a point may lack any space: only the
            // single form's points must all have a vector.
            if let (true, Some(main)) = (self.is_single(), self.dense.first()) {
                for (&id, p) in store.iter() {
                    if !main.engine.contains(id)? {
                        orphans.push(p.ext.clone());
                    }
                }
            }
            // Deleted ids are forgotten: every internal id ever assigned
            // that is not live is looked up (a repair is rare; an open
            // only counts them).
            let mut stale = vec![Vec::new(); self.dense.len()];
            for id in 0..store.next_internal() {
                if store.get(id).is_none() {
                    for (d, out) in self.dense.iter().zip(&mut stale) {
                        if d.engine.contains(id)? {
                            out.push(id);
                        }
                    }
                }
            }
            (orphans, stale)
        };
        if !orphans.is_empty() {
            self.delete(Some(&orphans), None)?;
        }
        let mut removed = 0;
        let turn = self.turn.lock();
        for (d, ids) in self.dense.iter().zip(&stale) {
            if !ids.is_empty() {
                d.engine.delete(*turn - 1, ids)?;
                d.engine_seq.fetch_max(*turn - 1, Ordering::AcqRel);
                removed += ids.len();
            }
        }
        let store = self.store.read();
        for sp in &self.sparse {
            let mut x = sp.index.write();
            let gone: Vec<u64> = x
                .iter()
                .map(|(d, _)| d)
                .filter(|&d| store.get(d).is_none())
                .collect();
            for d in &gone {
                x.delete(*turn - 1, *d);
            }
            removed += gone.len();
        }
        Ok((orphans, removed))
    }
}

/// After replay every space and the store hold the same points (each
/// applies every operation): a difference means a file of a space or of
/// the store lost or changed data.
fn check_agreement(
    dir: &Path,
    store: &PointStore,
    dense: &[DenseSpace],
    sparse: &[SparseSpace],
    single: bool,
) -> Result<()> {
    let disagree = |what: String| {
        DbError::corrupted(format!(
            "{}: {what}: a file of the engine or the store is damaged; `vectide repair` deletes the points that lost their vector",
            dir.display()
        ))
    };
    if let (true, Some(main)) = (single, dense.first()) {
        let mut missing = 0;
        for (&id, _) in store.iter() {
            missing += usize::from(!main.engine.contains(id)?);
        }
        // With none missing, the engine's live count beyond the store's
        // is the deleted points it still holds (the store forgets deleted
        // ids, so they are counted, not listed).
        let stale = (main.engine.len() + missing).saturating_sub(store.len());
        if missing > 0 || stale > 0 {
            return Err(disagree(format!(
                "the engine and the point store disagree ({missing} of the store's {} points have no vector, {stale} deleted points still have one)",
                store.len()
            )));
        }
        return Ok(());
    }
    // A multi collection's points may lack any space: a space holds no
    // more points than the store, and none the store deleted.
    for d in dense {
        if d.engine.len() > store.len() {
            return Err(disagree(format!(
                "vector space {:?} holds {} points, the point store {}",
                d.config.name,
                d.engine.len(),
                store.len()
            )));
        }
    }
    for sp in sparse {
        let x = sp.index.read();
        let stale = x.iter().filter(|(d, _)| store.get(*d).is_none()).count();
        if stale > 0 {
            return Err(disagree(format!(
                "sparse space {:?} holds {stale} points the point store deleted",
                sp.config.name
            )));
        }
    }
    Ok(())
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
        let config = VectorSpaceConfig {
            name: String::new(),
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
