//! # vectide-db
//!
//! The database around the engines: named collections in a directory, user
//! ids (u64, UUID, string), JSON payloads in redb, Qdrant-style filters and
//! payload indexes, and one commit path per collection (WAL with group
//! commit → engine + point store; see [`collection`]).
//!
//! ```text
//! DIR/
//!   LOCK                      flock'ed by the process that has the database open
//!   catalog.json              the collections and their configuration (atomic rewrite)
//!   collections/NAME/
//!     wal/<first seq>.log     the write-ahead log (docs/format-wal.md), segments
//!     points.redb             ids and payloads
//!     index.vtdx | index/     the engine: a snapshot (hnsw) or its own directory
//! ```
//!
//! Works with every engine through `VectorIndex`; an engine that lands later
//! plugs in through `vectide-engines` with no change here.

pub mod collection;
pub mod commitlog;
pub mod edit;
pub mod error;
pub mod filter;
mod guard;
pub mod ids;
pub mod path;
pub mod query;
mod record;
pub mod spaces;
pub mod store;

/// The files of a collection's point store: its snapshot and its log of
/// checkpoint batches (`store::files`).
pub const STORE_FILES: [&str; 2] = [store::files::SNAPSHOT_FILE, store::files::LOG_FILE];

pub use collection::{score, Collection, CollectionConfig, Hit, Options, PointInput, Record};
pub use commitlog::Durability;
pub use error::{DbError, Result};
pub use filter::Filter;
pub use ids::ExtId;
pub use store::IndexKind;

use parking_lot::{Mutex, RwLock};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use vectide_core::Metric;
use vectide_engines::{ParamValue, Params};

const CATALOG: &str = "catalog.json";
const CATALOG_FORMAT: &str = "vectide-catalog";
/// Version 2: `points.redb` is redb's file format 3 (redb 4.x); version 1
/// stores (redb 2.x, format 2) are refused by number, not opened.
/// Version 3: WAL records in the one record codec (kind first, ids and
/// vectors in columns, external ids and payloads in the tail).
/// Version 4: the point store in files of its own (`points.snap`,
/// `points.log`) instead of redb; a version-3 database is migrated at its
/// open (each collection's `points.redb` converted, then the catalog
/// rewritten as version 4).
/// Version 5: collections of several vector spaces (named dense ones,
/// sparse ones; `vector_name`, `more_vectors`, `sparse_vectors`) and their
/// multi upsert records; a version-4 catalog is read as is (its
/// collections are all of the single form) and rewritten as version 5.
const CATALOG_VERSION: u64 = 5;
/// The oldest catalog version an open migrates.
const CATALOG_MIGRATES_FROM: u64 = 3;

/// A collection name: 1..=64 of `[A-Za-z0-9_.-]`, not starting with a dot.
pub fn check_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(DbError::invalid(format!(
            "collection names are 1..=64 characters of letters, digits, '_', '-', '.' (not first): got {name:?}"
        )))
    }
}

fn param_to_json(v: &ParamValue) -> Value {
    match v {
        ParamValue::Int(i) => json!(i),
        ParamValue::Float(f) => json!(f),
        ParamValue::Bool(b) => json!(b),
        ParamValue::Str(s) => json!(s),
    }
}

/// Engine parameters from JSON (a flat object of scalars).
pub fn params_from_json(v: &Value) -> Result<Params> {
    let mut out = Params::new();
    let Some(obj) = v.as_object() else {
        return if v.is_null() {
            Ok(out)
        } else {
            Err(DbError::invalid("params must be an object"))
        };
    };
    for (k, v) in obj {
        let p = match v {
            Value::Bool(b) => ParamValue::Bool(*b),
            Value::Number(n) if n.is_i64() => ParamValue::Int(n.as_i64().expect("i64")),
            Value::Number(n) => ParamValue::Float(n.as_f64().unwrap_or(f64::NAN)),
            Value::String(s) => ParamValue::Str(s.clone()),
            Value::Null => continue,
            other => {
                return Err(DbError::invalid(format!(
                    "parameter {k} must be a scalar, got {other}"
                )))
            }
        };
        out.insert(k.clone(), p);
    }
    Ok(out)
}

fn params_to_json(p: &Params) -> Value {
    Value::Object(
        p.iter()
            .map(|(k, v)| (k.clone(), param_to_json(v)))
            .collect(),
    )
}

fn config_to_json(name: &str, c: &CollectionConfig) -> Value {
    let mut v = json!({"name": name, "dim": c.dim, "metric": c.metric.name(), "engine": c.engine, "params": params_to_json(&c.params)});
    if !c.is_single() {
        v["vector_name"] = json!(c.vector_name);
        v["more_vectors"] = c
            .more_vectors
            .iter()
            .map(|s| json!({"name": s.name, "dim": s.dim, "metric": s.metric.name(), "engine": s.engine, "params": params_to_json(&s.params)}))
            .collect();
        v["sparse_vectors"] = c
            .sparse_vectors
            .iter()
            .map(|s| json!({"name": s.name, "modifier": s.modifier.name()}))
            .collect();
    }
    v
}

/// A dense space's fields of a catalog entry (`dim` 0 allowed only for a
/// collection's main space, meaning none).
fn space_from_json(
    v: &Value,
    bad: &dyn Fn(&str) -> DbError,
    main: bool,
) -> Result<(usize, Metric, String, Params)> {
    let dim = v["dim"]
        .as_u64()
        .filter(|d| (1..=65_536).contains(d) || (main && *d == 0))
        .ok_or_else(|| bad("dim"))? as usize;
    let metric = Metric::parse(v["metric"].as_str().ok_or_else(|| bad("metric"))?)
        .map_err(|_| bad("metric"))?;
    let engine = v["engine"]
        .as_str()
        .ok_or_else(|| bad("engine"))?
        .to_string();
    let params = params_from_json(&v["params"]).map_err(|_| bad("params"))?;
    Ok((dim, metric, engine, params))
}

fn config_from_json(v: &Value) -> Result<(String, CollectionConfig)> {
    let bad = |what: &str| DbError::corrupted(format!("catalog entry without a valid {what}: {v}"));
    let name = v["name"].as_str().ok_or_else(|| bad("name"))?.to_string();
    check_name(&name).map_err(|_| bad("name"))?;
    let multi = v.get("vector_name").is_some();
    let (dim, metric, engine, params) = space_from_json(v, &bad, multi)?;
    let mut config = CollectionConfig {
        dim,
        metric,
        engine,
        params,
        ..Default::default()
    };
    if multi {
        config.vector_name = v["vector_name"]
            .as_str()
            .ok_or_else(|| bad("vector_name"))?
            .to_string();
        for s in v["more_vectors"]
            .as_array()
            .ok_or_else(|| bad("more_vectors"))?
        {
            let (dim, metric, engine, params) = space_from_json(s, &bad, false)?;
            config.more_vectors.push(spaces::VectorSpaceConfig {
                name: s["name"].as_str().ok_or_else(|| bad("vector name"))?.into(),
                dim,
                metric,
                engine,
                params,
            });
        }
        for s in v["sparse_vectors"]
            .as_array()
            .ok_or_else(|| bad("sparse_vectors"))?
        {
            config.sparse_vectors.push(spaces::SparseSpaceConfig {
                name: s["name"].as_str().ok_or_else(|| bad("vector name"))?.into(),
                modifier: s["modifier"]
                    .as_str()
                    .and_then(spaces::Modifier::parse)
                    .ok_or_else(|| bad("modifier"))?,
            });
        }
        Collection::validate_config(&config).map_err(|e| bad(&format!("space ({e})")))?;
    }
    Ok((name, config))
}

/// An open database (see the crate docs).
pub struct Database {
    dir: PathBuf,
    /// The flock'ed LOCK file; `None` once closed.
    lock: Mutex<Option<File>>,
    opts: Options,
    /// Shared with the background threads, which never hold the database
    /// itself: the drop of the last user handle stops and joins them there
    /// and then, not later on one of them, releases the directory lock.
    collections: Arc<RwLock<BTreeMap<String, Arc<Collection>>>>,
    /// Serialises catalog rewrites and collection creation/removal.
    catalog: Mutex<()>,
    stop: Arc<AtomicBool>,
    /// The background threads: checkpoints, and (with
    /// [`Options::background_maintenance`]) the engines' deferred
    /// maintenance on a thread of its own, so that a long job (a `spann`
    /// rebuild) does not hold up the checkpoints that cut the log.
    background: Mutex<Vec<std::thread::JoinHandle<()>>>,
}

impl std::fmt::Debug for Database {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Database").field("dir", &self.dir).finish()
    }
}

fn lock_dir(dir: &Path) -> Result<File> {
    let path = dir.join("LOCK");
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| DbError::io_at(&path, e))?;
    // SAFETY: flock on a descriptor we own; it does not touch memory.
    let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc != 0 {
        let mut holder = String::new();
        let _ = f.read_to_string(&mut holder);
        return Err(DbError::Locked {
            path: dir.to_path_buf(),
            holder: holder.trim().to_string(),
        });
    }
    f.set_len(0).map_err(|e| DbError::io_at(&path, e))?;
    f.rewind().map_err(|e| DbError::io_at(&path, e))?;
    write!(f, "{}", std::process::id()).map_err(|e| DbError::io_at(&path, e))?;
    Ok(f)
}

/// A collection of an engine that lives on a memory node takes its
/// region's lease (so that one database at a time writes it) under an
/// owner name of its own, made here once and kept in the catalog with the
/// rest of its parameters: a random 64-bit id and the collection's name
/// (unless the caller named one).
fn with_lease(name: &str, mut config: CollectionConfig) -> CollectionConfig {
    let on_node = vectide_engines::descriptor(&config.engine)
        .is_ok_and(|d| d.persistence == vectide_engines::Persistence::OnMemoryNode);
    if on_node && !config.params.contains_key("lease") {
        // A random 64-bit id: std's hasher keys are drawn from the OS.
        let id = {
            use std::hash::{BuildHasher, Hasher};
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u32(std::process::id());
            h.finish()
        };
        config.params.insert(
            "lease".into(),
            vectide_engines::ParamValue::Str(format!("db-{id:016x}/{name}")),
        );
    }
    config
}

/// The collections the catalog in `dir` lists (none without a catalog).
fn read_catalog(dir: &Path) -> Result<Vec<(String, CollectionConfig)>> {
    Ok(read_catalog_versioned(dir)?.1)
}

/// [`read_catalog`] with the catalog's version (the current one without a
/// catalog).
fn read_catalog_versioned(dir: &Path) -> Result<(u64, Vec<(String, CollectionConfig)>)> {
    let catalog_path = dir.join(CATALOG);
    if !catalog_path.exists() {
        return Ok((CATALOG_VERSION, Vec::new()));
    }
    let bytes = std::fs::read(&catalog_path).map_err(|e| DbError::io_at(&catalog_path, e))?;
    let v: Value = serde_json::from_slice(&bytes)
        .map_err(|e| DbError::corrupted(format!("{}: {e}", catalog_path.display())))?;
    if v["format"] != CATALOG_FORMAT {
        return Err(DbError::corrupted(format!(
            "{} is not a Vectide catalog",
            catalog_path.display()
        )));
    }
    let version = v["version"].as_u64().unwrap_or(0);
    if !(CATALOG_MIGRATES_FROM..=CATALOG_VERSION).contains(&version) {
        return Err(DbError::Core(vectide_core::Error::Version {
            found: version as u32,
            supported: CATALOG_VERSION as u32,
        }));
    }
    let entries = v["collections"].as_array().ok_or_else(|| {
        DbError::corrupted(format!(
            "{}: no list of collections",
            catalog_path.display()
        ))
    })?;
    Ok((
        version,
        entries
            .iter()
            .map(config_from_json)
            .collect::<Result<_>>()?,
    ))
}

/// What `repair` did to one collection.
#[derive(Debug, Clone)]
pub struct CollectionRepair {
    pub collection: String,
    /// The WAL cut (see [`commitlog::repair`]).
    pub wal: commitlog::RepairReport,
    /// Points whose vector the engine no longer holds after the cut (their
    /// payloads were in the store): deleted so that store and engine agree.
    pub orphans_removed: Vec<ExtId>,
    /// Vectors the engine still held for points the store had deleted
    /// (operations after the cut that reached the store): removed.
    pub stale_vectors_removed: usize,
}

/// Salvages a database whose WAL or engine files are damaged: every
/// collection's log is cut
/// at its first damage (the records before it are kept, the damaged record
/// and everything after it dropped) and the database is opened and
/// replayed. The engine and the point store come back as of their own
/// durable points, which may lie beyond the cut; they are then made to
/// agree: points left with a payload but no vector are deleted (and listed),
/// vectors of points the store had deleted are removed. Finally the
/// database checkpoints and closes. Returns what was dropped, per
/// collection. Needs the directory unlocked.
///
/// A crash part-way is safe: the repair first writes a durable marker
/// (`REPAIRING`), which it removes only once it has closed the database, and
/// an open that finds the marker runs the repair again before it opens (every
/// step is idempotent: the cut finds the log cut, the fill of void records
/// continues where it stopped, the reconciliation finds what is left).
pub fn repair(dir: &Path, opts: Options) -> Result<Vec<CollectionRepair>> {
    let mut out = Vec::new();
    {
        let _lock = lock_dir(dir)?;
        let marker = dir.join(REPAIR_MARKER);
        vectide_core::io::atomic_write(&marker, |w| {
            w.write_all(b"a repair of this database is under way; its next open completes it\n")
                .map_err(|e| vectide_core::Error::io_at(&marker, e))
        })?;
        for (name, _) in read_catalog(dir)? {
            let wal = commitlog::repair(&dir.join("collections").join(&name).join("wal"))?;
            out.push(CollectionRepair {
                collection: name,
                wal,
                orphans_removed: Vec::new(),
                stale_vectors_removed: 0,
            });
        }
    }
    let db = Database::open(
        dir,
        Options {
            repair: true,
            ..opts
        },
    )?;
    for r in &mut out {
        let c = db.collection(&r.collection)?;
        (r.orphans_removed, r.stale_vectors_removed) = c.remove_orphans()?;
    }
    db.close()?;
    drop(db);
    let marker = dir.join(REPAIR_MARKER);
    std::fs::remove_file(&marker).map_err(|e| DbError::io_at(&marker, e))?;
    vectide_core::io::sync_dir(dir)?;
    Ok(out)
}

/// The file whose presence says a [`repair`] began and has not finished.
const REPAIR_MARKER: &str = "REPAIRING";

impl Database {
    /// Opens (creating if needed) the database in `dir` and recovers every
    /// collection. The directory is locked until the database is dropped.
    pub fn open(dir: &Path, opts: Options) -> Result<Arc<Database>> {
        if !opts.repair && dir.join(REPAIR_MARKER).is_file() {
            // A repair was interrupted (a crash, an error): finish it first.
            repair(dir, opts.clone())?;
        }
        std::fs::create_dir_all(dir.join("collections")).map_err(|e| DbError::io_at(dir, e))?;
        let lock = lock_dir(dir)?;
        let mut collections = BTreeMap::new();
        let (version, listed) = read_catalog_versioned(dir)?;
        for (name, config) in listed {
            let cdir = dir.join("collections").join(&name);
            let c = Collection::open(&name, &cdir, config, opts.clone())?;
            collections.insert(name, Arc::new(c));
        }
        let db = Arc::new(Database {
            dir: dir.to_path_buf(),
            lock: Mutex::new(Some(lock)),
            opts,
            collections: Arc::new(RwLock::new(collections)),
            catalog: Mutex::new(()),
            stop: Arc::new(AtomicBool::new(false)),
            background: Mutex::new(Vec::new()),
        });
        if version < CATALOG_VERSION {
            // Every collection was migrated by its open.
            db.write_catalog(&db.collections.read())?;
        }
        db.start_checkpointer();
        Ok(db)
    }

    fn start_checkpointer(self: &Arc<Self>) {
        let mut kinds = vec![(Pass::Checkpoints, "vectide-checkpoint")];
        if self.opts.background_maintenance {
            kinds.push((Pass::Maintenance, "vectide-maintain"));
        }
        let mut threads = self.background.lock();
        for (pass, name) in kinds {
            let collections = self.collections.clone();
            let stop = self.stop.clone();
            let handle = std::thread::Builder::new()
                .name(name.into())
                .spawn(move || {
                    while !stop.load(Ordering::Acquire) {
                        // Woken early by a close or drop (which unpark it).
                        std::thread::park_timeout(Duration::from_millis(200));
                        if stop.load(Ordering::Acquire) {
                            break;
                        }
                        background_pass(&collections, &stop, pass);
                    }
                });
            threads.extend(handle.ok());
        }
    }

    /// Stops the background threads and waits for the jobs they run (not
    /// when called on one of them).
    fn stop_background(&self) {
        self.stop.store(true, Ordering::Release);
        let threads = std::mem::take(&mut *self.background.lock());
        // All woken first, so that none waits out its period while another
        // is joined.
        for h in &threads {
            h.thread().unpark();
        }
        for h in threads {
            if h.thread().id() != std::thread::current().id() {
                let _ = h.join();
            }
        }
    }

    /// The database directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn write_catalog(&self, cols: &BTreeMap<String, Arc<Collection>>) -> Result<()> {
        let entries: Vec<Value> = cols
            .iter()
            .map(|(n, c)| config_to_json(n, c.config()))
            .collect();
        let doc =
            json!({"format": CATALOG_FORMAT, "version": CATALOG_VERSION, "collections": entries});
        let bytes = serde_json::to_vec_pretty(&doc).map_err(|e| DbError::invalid(e.to_string()))?;
        vectide_core::io::atomic_write(&self.dir.join(CATALOG), |w| {
            w.write_all(&bytes).map_err(Into::into)
        })?;
        Ok(())
    }

    fn check_open(&self) -> Result<()> {
        if self.lock.lock().is_none() {
            return Err(DbError::Closed(format!("database {}", self.dir.display())));
        }
        Ok(())
    }

    /// Checkpoints every collection, closes them (remaining handles then
    /// fail with [`DbError::Closed`]) and releases the directory lock, so
    /// that another process may open the database. Idempotent. A
    /// collection's files close when its last handle is dropped.
    pub fn close(&self) -> Result<()> {
        let _g = self.catalog.lock();
        if self.lock.lock().is_none() {
            return Ok(());
        }
        self.stop_background();
        let cols = std::mem::take(&mut *self.collections.write());
        let mut first_err = None;
        for c in cols.values() {
            c.close();
            if let Err(e) = c.final_checkpoint() {
                first_err.get_or_insert(e);
            }
        }
        drop(cols);
        *self.lock.lock() = None;
        first_err.map_or(Ok(()), Err)
    }

    /// Creates a collection (its engine and parameters are checked first).
    pub fn create_collection(
        &self,
        name: &str,
        config: CollectionConfig,
    ) -> Result<Arc<Collection>> {
        check_name(name)?;
        Collection::validate_config(&config)?;
        let _g = self.catalog.lock();
        self.check_open()?;
        if self.collections.read().contains_key(name) {
            return Err(DbError::CollectionExists(name.to_string()));
        }
        let cdir = self.dir.join("collections").join(name);
        // Leftovers of a collection whose creation or deletion a crash cut.
        let _ = std::fs::remove_dir_all(&cdir);
        let config = with_lease(name, config);
        let c = Arc::new(Collection::open(name, &cdir, config, self.opts.clone())?);
        let mut cols = self.collections.read().clone();
        cols.insert(name.to_string(), c.clone());
        if let Err(e) = self.write_catalog(&cols) {
            let _ = std::fs::remove_dir_all(&cdir);
            return Err(e);
        }
        *self.collections.write() = cols;
        Ok(c)
    }

    /// A collection by name.
    pub fn collection(&self, name: &str) -> Result<Arc<Collection>> {
        self.check_open()?;
        self.collections
            .read()
            .get(name)
            .cloned()
            .ok_or_else(|| DbError::CollectionNotFound(name.to_string()))
    }

    /// Collection names, sorted.
    pub fn list(&self) -> Vec<String> {
        self.collections.read().keys().cloned().collect()
    }

    /// Removes a collection and its files; returns whether it existed.
    pub fn delete_collection(&self, name: &str) -> Result<bool> {
        let _g = self.catalog.lock();
        self.check_open()?;
        let mut cols = self.collections.read().clone();
        let Some(c) = cols.remove(name) else {
            return Ok(false);
        };
        self.write_catalog(&cols)?;
        *self.collections.write() = cols;
        c.close();
        let dir = c.dir().to_path_buf();
        drop(c);
        let _ = std::fs::remove_dir_all(&dir);
        Ok(true)
    }

    /// Checkpoints every collection (what a graceful shutdown does); a
    /// poisoned one is left to its log, which its reopen replays.
    pub fn flush(&self) -> Result<()> {
        let cols: Vec<Arc<Collection>> = self.collections.read().values().cloned().collect();
        for c in cols {
            match c.checkpoint() {
                Err(e) if e.is_poisoned() => {}
                other => other?,
            }
        }
        Ok(())
    }
}

impl Drop for Database {
    fn drop(&mut self) {
        self.stop_background();
    }
}

/// What a background thread runs.
#[derive(Clone, Copy)]
enum Pass {
    /// The checkpoints that are due.
    Checkpoints,
    /// The maintenance the engines deferred from their writes (an hnsw
    /// consolidation) or leave to the caller (a `spann` rebuild).
    Maintenance,
}

/// One pass of a background thread: the checkpoints that are due, or the
/// deferred maintenance that is, off the write path; no job starts once
/// the database is stopping (a close or the drop of its last handle waits
/// for the job that runs). The maintenance thread runs only with
/// [`Options::background_maintenance`].
fn background_pass(
    collections: &RwLock<BTreeMap<String, Arc<Collection>>>,
    stop: &AtomicBool,
    pass: Pass,
) {
    type Due = fn(&Collection) -> bool;
    type Job = fn(&Collection) -> Result<()>;
    let (due, run, what): (Due, Job, &str) = match pass {
        Pass::Checkpoints => (
            Collection::checkpoint_due,
            Collection::checkpoint,
            "checkpoint",
        ),
        Pass::Maintenance => (
            Collection::maintenance_due,
            Collection::maintain,
            "maintenance",
        ),
    };
    let picked: Vec<Arc<Collection>> = collections
        .read()
        .values()
        .filter(|c| due(c))
        .cloned()
        .collect();
    for c in picked {
        if stop.load(Ordering::Acquire) {
            return;
        }
        if let Err(e) = run(&c) {
            eprintln!("vectide: {what} of collection {:?} failed: {e}", c.name());
        }
    }
}

/// `vectide inspect DIR` for a database: the catalog and, per collection,
/// its files (read without opening: no lock, no recovery).
pub fn inspect(dir: &Path) -> Result<Vec<(String, String)>> {
    let path = dir.join(CATALOG);
    let bytes = std::fs::read(&path).map_err(|e| DbError::io_at(&path, e))?;
    let v: Value = serde_json::from_slice(&bytes)
        .map_err(|e| DbError::corrupted(format!("{}: {e}", path.display())))?;
    if v["format"] != CATALOG_FORMAT {
        return Err(DbError::corrupted(format!(
            "{} is not a Vectide catalog",
            path.display()
        )));
    }
    let mut rows = vec![
        ("kind".to_string(), "database".to_string()),
        ("catalog_version".to_string(), v["version"].to_string()),
    ];
    let locked = std::fs::read_to_string(dir.join("LOCK")).unwrap_or_default();
    rows.push(("last_opened_by_pid".into(), locked.trim().to_string()));
    let size = |p: &Path| -> u64 {
        if p.is_dir() {
            std::fs::read_dir(p)
                .map(|rd| {
                    rd.flatten()
                        .map(|e| e.metadata().map(|m| m.len()).unwrap_or(0))
                        .sum()
                })
                .unwrap_or(0)
        } else {
            std::fs::metadata(p).map(|m| m.len()).unwrap_or(0)
        }
    };
    let entries = v["collections"].as_array().cloned().unwrap_or_default();
    rows.push(("collections".into(), entries.len().to_string()));
    for e in entries {
        let (name, c) = config_from_json(&e)?;
        let cdir = dir.join("collections").join(&name);
        let segments = std::fs::read_dir(cdir.join("wal"))
            .map(|rd| rd.count())
            .unwrap_or(0);
        let engine_path = if cdir.join("index").is_dir() {
            cdir.join("index")
        } else {
            cdir.join("index.vtdx")
        };
        rows.push((
            format!("collection.{name}"),
            format!(
                "dim {} {} engine {}; wal {} segment(s) {} bytes; point store {} bytes; engine files {} bytes",
                c.dim,
                c.metric.name(),
                c.engine,
                segments,
                size(&cdir.join("wal")),
                STORE_FILES.iter().map(|f| size(&cdir.join(f))).sum::<u64>(),
                size(&engine_path)
            ),
        ));
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{files::StoreFiles, legacy};
    use redb::ReadableDatabase as _;

    /// A catalog-version-3 database (its point store in `points.redb`)
    /// opens with its points, payloads and indexes, and is left at
    /// version 4 with the store in its own files.
    #[test]
    fn a_version_3_database_is_migrated_at_its_open() {
        let root = tempfile::tempdir().unwrap();
        let col = root.path().join("collections").join("docs");
        {
            let db = Database::open(root.path(), Options::default()).unwrap();
            let c = db
                .create_collection("docs", CollectionConfig::new(4, Metric::L2, "flat"))
                .unwrap();
            let pts: Vec<PointInput> = (0..5u64)
                .map(|i| PointInput {
                    id: ExtId::Num(i * 10),
                    vector: vec![i as f32, 0.0, 1.0, 2.0],
                    payload: json!({"i": i}),
                })
                .collect();
            c.upsert(&pts).unwrap();
            c.create_index("i", store::IndexKind::Integer).unwrap();
            db.close().unwrap();
        }
        // The same state as version 3 kept it: in redb.
        let (img, _) = StoreFiles::read(&col).unwrap();
        assert_eq!(img.points.len(), 5);
        {
            let db = redb::Database::create(col.join(legacy::LEGACY_FILE)).unwrap();
            let w = db.begin_write().unwrap();
            {
                let mut t = w.open_table(legacy::POINTS).unwrap();
                for (&id, row) in &img.points {
                    t.insert(id, row.as_slice()).unwrap();
                }
                let mut t = w.open_table(legacy::IDS).unwrap();
                for (&id, row) in &img.points {
                    let (_, n) = ExtId::decode(&row[8..]).unwrap();
                    t.insert(&row[8..8 + n], id).unwrap();
                }
                let mut t = w.open_table(legacy::META).unwrap();
                t.insert("applied_seq", img.applied).unwrap();
                t.insert("next_internal", img.next_internal).unwrap();
                t.insert("engine_seq", img.engine_seq).unwrap();
                let mut t = w.open_table(legacy::INDEXES).unwrap();
                for (f, k) in &img.indexes {
                    t.insert(f.as_str(), k.name()).unwrap();
                }
            }
            w.commit().unwrap();
            assert!(db.begin_read().is_ok());
        }
        for f in STORE_FILES {
            if col.join(f).exists() {
                std::fs::remove_file(col.join(f)).unwrap();
            }
        }
        let catalog = root.path().join(CATALOG);
        let text = std::fs::read_to_string(&catalog).unwrap();
        let v3 = text.replacen("\"version\": 5", "\"version\": 3", 1);
        assert_ne!(v3, text);
        std::fs::write(&catalog, &v3).unwrap();

        let db = Database::open(root.path(), Options::default()).unwrap();
        let c = db.collection("docs").unwrap();
        assert_eq!(c.len(), 5);
        let got = c.get(&[ExtId::Num(30)], false).unwrap();
        assert_eq!(got[0].as_ref().unwrap().payload, json!({"i": 3}));
        assert_eq!(
            c.indexes(),
            vec![("i".to_string(), store::IndexKind::Integer)]
        );
        assert!(!col.join(legacy::LEGACY_FILE).exists());
        assert!(std::fs::read_to_string(&catalog)
            .unwrap()
            .contains("\"version\": 5"));
        drop(c);
        drop(db);
        let db = Database::open(root.path(), Options::default()).unwrap();
        assert_eq!(db.collection("docs").unwrap().len(), 5);
    }
}
