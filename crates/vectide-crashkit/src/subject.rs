//! What the kit crashes: an engine from the registry, a database
//! collection of an engine (`db:ENGINE`), or a database collection of
//! several vector spaces whose main one is the engine (`db-spaces:ENGINE`:
//! a second dense space on the default engine and a sparse space with IDF, every point
//! written to all three), behind one [`Subject`] trait.

use std::path::Path;
use std::sync::Arc;
use vectide_core::{
    Error, Knob, Metric, Params, Persistence, Result, SearchParams, Seq, VectorIndex,
};
use vectide_db::spaces::{
    Modifier, PointData, SparseSpaceConfig, SparseVector, VectorSpaceConfig, VectorValue,
};
use vectide_db::{CollectionConfig, Database, ExtId, Options, PointInput};
use vectide_engines::{AnyIndex, ParamValue};

/// The name of the one collection of a `db:ENGINE` target.
const COLLECTION: &str = "crash";

/// A crash-test target, parsed from `ENGINE` or `db:ENGINE`.
#[derive(Debug, Clone)]
pub enum Target {
    /// A durable engine of the registry, in its own directory.
    Engine { engine: String, params: Params },
    /// A database in a directory, with one collection of the engine (any
    /// engine: the database's WAL makes a volatile one durable); with
    /// `spaces`, a collection of several vector spaces (see the module docs).
    Db {
        engine: String,
        params: Params,
        spaces: bool,
    },
}

/// `db-spaces:ENGINE`'s further spaces.
const ECHO_SPACE: &str = "echo";
const SPARSE_SPACE: &str = "terms";

impl Target {
    /// Parses `ENGINE` or `db:ENGINE`; `params` are the engine's (checked by
    /// the registry). An unknown engine, or an engine target that is not
    /// durable, is an error naming the ones that are.
    pub fn parse(spec: &str, params: Params) -> Result<Target> {
        for (prefix, spaces) in [("db:", false), ("db-spaces:", true)] {
            if let Some(engine) = spec.strip_prefix(prefix) {
                let d = vectide_engines::descriptor(engine)?;
                vectide_core::params::check_params(d.name, d.params, &params)?;
                return Ok(Target::Db {
                    engine: engine.to_string(),
                    params,
                    spaces,
                });
            }
        }
        let d = vectide_engines::descriptor(spec)?;
        vectide_core::params::check_params(d.name, d.params, &params)?;
        if !d.persistence.durable() {
            return Err(Error::invalid(format!(
                "engine {spec:?} is volatile: crash-test runs durable engines ({}) or a database collection of any engine (db:{spec})",
                vectide_engines::survivor_names().join(", ")
            )));
        }
        Ok(Target::Engine {
            engine: spec.to_string(),
            params,
        })
    }

    /// Every target the kit knows: each durable engine, and a database
    /// collection of each engine, of one space and of several.
    pub fn all() -> Vec<String> {
        let mut out: Vec<String> = vectide_engines::survivor_names()
            .into_iter()
            .map(String::from)
            .collect();
        for prefix in ["db", "db-spaces"] {
            out.extend(
                vectide_engines::names()
                    .into_iter()
                    .map(|n| format!("{prefix}:{n}")),
            );
        }
        out
    }

    /// `ENGINE`, `db:ENGINE` or `db-spaces:ENGINE`.
    pub fn name(&self) -> String {
        match self {
            Target::Engine { engine, .. } => engine.clone(),
            Target::Db {
                engine,
                spaces: false,
                ..
            } => format!("db:{engine}"),
            Target::Db { engine, .. } => format!("db-spaces:{engine}"),
        }
    }

    pub fn params(&self) -> &Params {
        match self {
            Target::Engine { params, .. } | Target::Db { params, .. } => params,
        }
    }

    /// Whether `dir` holds the target already.
    pub fn exists(&self, dir: &Path) -> bool {
        match self {
            Target::Engine { engine, .. } if on_memory_node(engine) => {
                dir.join(MEMNODE_FILE).exists()
            }
            Target::Engine { .. } => matches!(vectide_engines::engine_at(dir), Ok(Some(_))),
            Target::Db { .. } => has_entries(dir),
        }
    }

    /// Opens the target in `dir` (recovering it), creating it when `dir`
    /// holds nothing.
    pub fn open(&self, dir: &Path, dim: usize) -> Result<Box<dyn Subject>> {
        match self {
            Target::Engine { engine, params } => {
                let mut p = params.clone();
                if on_memory_node(engine) {
                    // A memory node inside this process on a backing file
                    // in `dir` (its media the simulator's there), one
                    // region, one named writer: a crash is the memory
                    // node's, and the next round's compute node attaches
                    // to what its restart serves.
                    std::fs::create_dir_all(dir).map_err(|e| Error::io_at(dir, e))?;
                    let file = dir.join(MEMNODE_FILE);
                    p.insert(
                        "memnode".into(),
                        ParamValue::Str(format!("file:{}", file.display())),
                    );
                    p.entry("region".into())
                        .or_insert(ParamValue::Str("crash".into()));
                    p.entry("writer".into())
                        .or_insert(ParamValue::Str("crash".into()));
                    // A lock a failed write left held is taken over after
                    // six of these (the writers of a round go on after
                    // its crash point, and may wait on one).
                    p.entry("timeout_ms".into()).or_insert(ParamValue::Int(50));
                } else {
                    p.insert("path".into(), ParamValue::Str(dir.display().to_string()));
                }
                p.entry("threads".into()).or_insert(ParamValue::Int(1));
                let idx = vectide_engines::open_or_create(engine, dim, Metric::L2, &p)?;
                let flush = matches!(
                    idx.descriptor().persistence,
                    Persistence::DurableAtFlush | Persistence::OnMemoryNode
                );
                Ok(Box::new(EngineSubject { idx, flush }))
            }
            Target::Db {
                engine,
                params,
                spaces,
            } => {
                let opts = Options {
                    threads: Some(1),
                    ..Options::default()
                };
                let db = Database::open(dir, opts).map_err(db_err)?;
                let mut config = CollectionConfig {
                    dim,
                    metric: Metric::L2,
                    engine: engine.clone(),
                    params: params.clone(),
                    ..Default::default()
                };
                if *spaces {
                    config.vector_name = "main".into();
                    config.more_vectors.push(VectorSpaceConfig {
                        name: ECHO_SPACE.into(),
                        dim,
                        metric: Metric::L2,
                        engine: vectide_engines::DEFAULT_ENGINE.into(),
                        params: Params::new(),
                    });
                    config.sparse_vectors.push(SparseSpaceConfig {
                        name: SPARSE_SPACE.into(),
                        modifier: Modifier::Idf,
                    });
                }
                let coll = match db.collection(COLLECTION) {
                    Ok(c) => c,
                    Err(_) => db.create_collection(COLLECTION, config).map_err(db_err)?,
                };
                Ok(Box::new(DbSubject {
                    db,
                    coll,
                    spaces: *spaces,
                }))
            }
        }
    }
}

/// The backing file of the memory node an engine that lives on one runs
/// on in a target's directory.
pub const MEMNODE_FILE: &str = "memnode.vtb";

/// Whether an engine lives on a memory node (its persistence class says).
fn on_memory_node(engine: &str) -> bool {
    vectide_engines::descriptor(engine).is_ok_and(|d| d.persistence == Persistence::OnMemoryNode)
}

fn has_entries(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|mut d| d.next().is_some())
}

fn db_err(e: vectide_db::DbError) -> Error {
    match e {
        vectide_db::DbError::Core(e) => e,
        other => Error::invalid(other.to_string()),
    }
}

/// The calls the kit makes, whatever it crashes.
pub trait Subject: Send + Sync {
    /// Upserts one label; returns once the target acknowledged it.
    fn upsert(&self, seq: Seq, label: u64, vector: &[f32]) -> Result<()>;
    fn delete(&self, seq: Seq, label: u64) -> Result<()>;
    /// What must follow a write before it counts as acknowledged: `flush()`
    /// for engines durable at flush, nothing otherwise.
    fn make_durable(&self) -> Result<()>;
    /// Runs the target's maintenance (`VectorIndex::maintain`); nothing by
    /// default.
    fn maintain(&self) -> Result<()> {
        Ok(())
    }
    fn vector_of(&self, label: u64) -> Result<Option<Vec<f32>>>;
    /// The label found at rank 1 when searching `v`.
    fn nearest(&self, v: &[f32]) -> Result<Option<u64>>;
    /// Structural violations (the engine's own checker).
    fn check(&self) -> Result<Vec<String>>;
    /// The durable watermark of the caller's sequence numbers (`None` for a
    /// database, which numbers operations itself).
    fn durable_seq(&self) -> Option<Seq>;
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// What recovery did, from the engine's named figures (for messages).
    fn recovery_note(&self) -> String;
    /// One of the engine's stats: `slots_used`, or a named figure of its
    /// `extra` list; `None` when it has no such figure.
    fn figure(&self, _name: &str) -> Option<f64> {
        None
    }
    /// Whether recovery had log work (undo, redo, replay) to do.
    fn recovered_work(&self) -> bool;
}

struct EngineSubject {
    idx: AnyIndex,
    flush: bool,
}

fn recovery_figures(idx: &dyn VectorIndex) -> Vec<(String, f64)> {
    idx.stats()
        .map(|s| {
            s.extra
                .into_iter()
                .filter(|(k, _)| k.starts_with("recovery.") && !k.ends_with("micros"))
                .collect()
        })
        .unwrap_or_default()
}

fn note(figs: &[(String, f64)]) -> String {
    let parts: Vec<String> = figs
        .iter()
        .filter(|(_, v)| *v != 0.0)
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    if parts.is_empty() {
        "recovery: nothing to undo or redo".into()
    } else {
        format!("recovery: {}", parts.join(" "))
    }
}

impl Subject for EngineSubject {
    fn upsert(&self, seq: Seq, label: u64, vector: &[f32]) -> Result<()> {
        self.idx.insert(seq, &[label], vector)
    }
    fn delete(&self, seq: Seq, label: u64) -> Result<()> {
        self.idx.delete(seq, &[label]).map(|_| ())
    }
    fn make_durable(&self) -> Result<()> {
        if self.flush {
            self.idx.flush()?;
        }
        Ok(())
    }
    fn maintain(&self) -> Result<()> {
        self.idx.maintain()
    }
    fn vector_of(&self, label: u64) -> Result<Option<Vec<f32>>> {
        self.idx.get(label)
    }
    fn nearest(&self, v: &[f32]) -> Result<Option<u64>> {
        let p = wide_search(&*self.idx);
        Ok(self.idx.search(v, 1, &p, None)?.first().map(|n| n.id))
    }
    fn check(&self) -> Result<Vec<String>> {
        self.idx.check_structure()
    }
    fn durable_seq(&self) -> Option<Seq> {
        Some(self.idx.durable_seq())
    }
    fn len(&self) -> usize {
        self.idx.len()
    }
    fn recovery_note(&self) -> String {
        note(&recovery_figures(&*self.idx))
    }
    fn recovered_work(&self) -> bool {
        recovery_figures(&*self.idx).iter().any(|(_, v)| *v != 0.0)
    }
    fn figure(&self, name: &str) -> Option<f64> {
        let s = self.idx.stats().ok()?;
        match name {
            "slots_used" => Some(s.slots_used as f64),
            _ => s.extra_value(name),
        }
    }
}

struct DbSubject {
    db: Arc<Database>,
    coll: Arc<vectide_db::Collection>,
    /// `db-spaces:`: every point in three spaces.
    spaces: bool,
}

/// `db-spaces:`'s second dense vector of a point: its main one reversed.
fn echo_of(v: &[f32]) -> Vec<f32> {
    v.iter().rev().copied().collect()
}

/// `db-spaces:`'s sparse vector of a label.
fn terms_of(label: u64) -> SparseVector {
    let (a, b) = ((label % 97) as u32, 100 + (label % 13) as u32);
    SparseVector::new(vec![a, b], vec![1.0 + (label % 5) as f32, 0.5])
        .expect("two distinct indices, finite values")
}

impl DbSubject {
    /// `db-spaces:`: every live point has its three vectors, each the one
    /// its main vector and label make.
    fn check_spaces(&self) -> Result<Vec<String>> {
        let mut bad = Vec::new();
        let mut offset = None;
        loop {
            let (page, next) = self
                .coll
                .scroll(None, offset.as_ref(), 1000, true)
                .map_err(db_err)?;
            for r in page {
                let named = r.vectors.unwrap_or_default();
                let get = |n: &str| named.iter().find(|(k, _)| k == n).map(|(_, v)| v);
                let label = match r.id {
                    ExtId::Num(n) => n,
                    ref other => {
                        bad.push(format!("point {other}: not a label"));
                        continue;
                    }
                };
                match (get("main"), get(ECHO_SPACE), get(SPARSE_SPACE)) {
                    (
                        Some(VectorValue::Dense(m)),
                        Some(VectorValue::Dense(e)),
                        Some(VectorValue::Sparse(t)),
                    ) => {
                        if *e != echo_of(m) {
                            bad.push(format!("point {label}: its {ECHO_SPACE:?} vector is not its main one reversed"));
                        }
                        if *t != terms_of(label) {
                            bad.push(format!(
                                "point {label}: its {SPARSE_SPACE:?} vector is not its label's"
                            ));
                        }
                    }
                    _ => bad.push(format!(
                        "point {label}: lacks a vector space ({} of 3)",
                        named.len()
                    )),
                }
            }
            match next {
                Some(n) => offset = Some(n),
                None => break,
            }
        }
        let sparse_len = self
            .coll
            .search_sparse(SPARSE_SPACE, &terms_of(0), 1, None, false, false)
            .map(|_| ())
            .map_err(db_err);
        if let Err(e) = sparse_len {
            bad.push(format!("the sparse space does not answer: {e}"));
        }
        Ok(bad)
    }
}

impl Drop for DbSubject {
    fn drop(&mut self) {
        // Stops the checkpointer thread; the kit drops a crashed database
        // without a checkpoint anyway (the image was taken before).
        let _ = self.db.close();
    }
}

impl Subject for DbSubject {
    fn upsert(&self, _: Seq, label: u64, vector: &[f32]) -> Result<()> {
        if self.spaces {
            let p = PointData {
                id: ExtId::Num(label),
                vectors: vec![
                    ("main".into(), VectorValue::Dense(vector.to_vec())),
                    (ECHO_SPACE.into(), VectorValue::Dense(echo_of(vector))),
                    (SPARSE_SPACE.into(), VectorValue::Sparse(terms_of(label))),
                ],
                payload: serde_json::Value::Null,
            };
            return self.coll.upsert_points(vec![p]).map(|_| ()).map_err(db_err);
        }
        let p = PointInput {
            id: ExtId::Num(label),
            vector: vector.to_vec(),
            payload: serde_json::Value::Null,
        };
        self.coll.upsert(&[p]).map(|_| ()).map_err(db_err)
    }
    fn delete(&self, _: Seq, label: u64) -> Result<()> {
        self.coll
            .delete(Some(&[ExtId::Num(label)]), None)
            .map(|_| ())
            .map_err(db_err)
    }
    fn make_durable(&self) -> Result<()> {
        Ok(()) // a collection acknowledges after its WAL's fsync
    }
    fn vector_of(&self, label: u64) -> Result<Option<Vec<f32>>> {
        let r = self.coll.get(&[ExtId::Num(label)], true).map_err(db_err)?;
        Ok(r.into_iter().next().flatten().and_then(|r| r.vector))
    }
    fn nearest(&self, v: &[f32]) -> Result<Option<u64>> {
        let Some(engine) = self.coll.engine() else {
            return Ok(None);
        };
        let p = wide_search(&**engine);
        let hits = self
            .coll
            .search(v, 1, &p, None, false, false)
            .map_err(db_err)?;
        Ok(hits.first().and_then(|h| match h.id {
            ExtId::Num(n) => Some(n),
            _ => None,
        }))
    }
    fn check(&self) -> Result<Vec<String>> {
        let mut v = Vec::new();
        for (name, engine) in self.coll.engines() {
            v.extend(engine.check_structure()?);
            // Each space holds a vector of every live point (the kit
            // writes every space of every point), and the point store
            // agrees on what is live.
            if engine.len() != self.coll.len() {
                v.push(format!(
                    "vector space {name:?} holds {} vectors, the point store {} points",
                    engine.len(),
                    self.coll.len()
                ));
            }
        }
        if self.spaces {
            v.extend(self.check_spaces()?);
        }
        Ok(v)
    }
    fn durable_seq(&self) -> Option<Seq> {
        None
    }
    fn len(&self) -> usize {
        self.coll.len()
    }
    fn recovery_note(&self) -> String {
        self.coll
            .engine()
            .map(|e| note(&recovery_figures(&**e)))
            .unwrap_or_default()
    }
    fn recovered_work(&self) -> bool {
        self.coll
            .engines()
            .any(|(_, e)| recovery_figures(&**e).iter().any(|(_, v)| *v != 0.0))
    }
}

/// The engine's search defaults with a generous `ef` where it takes one
/// (the kit's indexes are small: a rank-1 miss is then a broken graph).
fn wide_search(idx: &dyn VectorIndex) -> SearchParams {
    let mut p = idx.search_defaults();
    let knobs = idx.descriptor().knobs;
    if knobs.contains(&Knob::Ef) {
        p.ef = Some(p.ef.unwrap_or(0).max(64));
    }
    // A cluster index reads every posting: the check is of what is
    // stored, not of how well the centroids route.
    if knobs.contains(&Knob::Nprobe) {
        p.nprobe = Some(vectide_core::limits::MAX_NPROBE);
    }
    p
}
