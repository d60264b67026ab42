//! # vectide-engines
//!
//! One place that knows every engine: the Python package, the CLI and (later)
//! the database create engines by name from loosely typed parameters and open
//! index files by their magic, without matching on engine types themselves.
//! A new engine is one more [`AnyIndex`] variant and one more arm in
//! [`create`], [`load`] and [`inspect`].

use std::collections::BTreeMap;
use std::fmt;
use std::io::Read;
use std::path::Path;
use vectide_core::{
    limits, Error, Filter, IndexStats, Metric, Neighbor, Result, SearchParams, Seq, VectorIndex,
};
use vectide_hnsw::baselines::{Baseline, BaselineKind, BaselineParams};
use vectide_hnsw::phnsw::{PHnsw, PHnswParams};
use vectide_hnsw::{Hnsw, HnswParams};
use vectide_storage::PersistMode;

/// A parameter value as it arrives from Python, JSON or the command line.
#[derive(Debug, Clone, PartialEq)]
pub enum ParamValue {
    Int(i64),
    Float(f64),
    Bool(bool),
    Str(String),
}

impl fmt::Display for ParamValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParamValue::Int(v) => write!(f, "{v}"),
            ParamValue::Float(v) => write!(f, "{v}"),
            ParamValue::Bool(v) => write!(f, "{v}"),
            ParamValue::Str(v) => write!(f, "{v:?}"),
        }
    }
}

impl ParamValue {
    /// Parses a command-line value: integer, float, `true`/`false`, else string.
    pub fn parse(text: &str) -> ParamValue {
        if let Ok(v) = text.parse::<i64>() {
            ParamValue::Int(v)
        } else if let Ok(v) = text.parse::<f64>() {
            ParamValue::Float(v)
        } else if let Ok(v) = text.parse::<bool>() {
            ParamValue::Bool(v)
        } else {
            ParamValue::Str(text.to_string())
        }
    }

    fn as_usize(&self, key: &str) -> Result<usize> {
        match self {
            ParamValue::Int(v) if *v >= 0 => Ok(*v as usize),
            other => Err(Error::invalid(format!(
                "parameter {key} must be a non-negative integer, got {other}"
            ))),
        }
    }

    /// An integer in `lo..=hi` (the documented range of `key`, see
    /// [`vectide_core::limits`]); the error names both.
    fn as_bounded(&self, key: &str, lo: usize, hi: usize) -> Result<usize> {
        match self {
            ParamValue::Int(v) if *v >= 0 && (*v as u64) <= hi as u64 && *v as usize >= lo => {
                Ok(*v as usize)
            }
            other => Err(Error::invalid(format!(
                "parameter {key} must be an integer in {lo}..={hi}, got {other}"
            ))),
        }
    }

    fn as_str(&self, key: &str) -> Result<&str> {
        match self {
            ParamValue::Str(v) => Ok(v),
            other => Err(Error::invalid(format!(
                "parameter {key} must be a string, got {other}"
            ))),
        }
    }

    fn as_f64(&self, key: &str) -> Result<f64> {
        match self {
            ParamValue::Int(v) => Ok(*v as f64),
            ParamValue::Float(v) => Ok(*v),
            other => Err(Error::invalid(format!(
                "parameter {key} must be a number, got {other}"
            ))),
        }
    }
}

/// Engine parameters by name.
pub type Params = BTreeMap<String, ParamValue>;

/// The engines this build knows.
pub const ENGINES: &[&str] = &["hnsw", "p-hnsw", "hnsw-snap", "hnsw-wal"];

/// Engines that live in a directory (`path` parameter) and recover on open.
pub const DURABLE_ENGINES: &[&str] = &["p-hnsw", "hnsw-snap", "hnsw-wal"];

/// Parameters every engine accepts.
const COMMON_PARAMS: &[&str] = &["threads"];

/// Any engine, behind one type.
#[derive(Debug)]
pub enum AnyIndex {
    Hnsw(Hnsw),
    PHnsw(PHnsw),
    Baseline(Baseline),
}

fn unknown_params(engine: &str, params: &Params, known: &[&str]) -> Result<()> {
    let unknown: Vec<&str> = params
        .keys()
        .map(String::as_str)
        .filter(|k| !known.contains(k) && !COMMON_PARAMS.contains(k))
        .collect();
    if unknown.is_empty() {
        return Ok(());
    }
    let mut all: Vec<&str> = known.iter().chain(COMMON_PARAMS).copied().collect();
    all.sort_unstable();
    Err(Error::invalid(format!(
        "unknown parameter(s) {} for engine {engine:?}; known: {}",
        unknown.join(", "),
        all.join(", ")
    )))
}

/// `threads`: `1..=MAX_THREADS` (a pool spawns its threads when built).
fn threads_param(params: &Params) -> Result<Option<usize>> {
    match params.get("threads") {
        None => Ok(None),
        Some(ParamValue::Int(0)) => Err(Error::invalid(format!(
            "threads must be at least 1 (and at most {})",
            limits::MAX_THREADS
        ))),
        Some(v) => v.as_bounded("threads", 1, limits::MAX_THREADS).map(Some),
    }
}

/// Builds [`HnswParams`] from loose parameters (unknown keys are an error).
pub fn hnsw_params(params: &Params) -> Result<HnswParams> {
    const KNOWN: &[&str] = &[
        "m",
        "ef_construction",
        "ef_search",
        "seed",
        "consolidate_fraction",
        "repair_alpha",
    ];
    unknown_params("hnsw", params, KNOWN)?;
    graph_params(params)
}

/// The HNSW fields of loose parameters (other keys are left to the caller).
fn graph_params(params: &Params) -> Result<HnswParams> {
    let mut p = HnswParams::default();
    for (key, value) in params {
        match key.as_str() {
            "m" => p.m = value.as_bounded(key, limits::MIN_M, limits::MAX_M)?,
            "ef_construction" => p.ef_construction = value.as_bounded(key, 1, limits::MAX_EF)?,
            "ef_search" => p.ef_search = value.as_bounded(key, 1, limits::MAX_EF)?,
            "seed" => p.seed = value.as_usize(key)? as u64,
            "consolidate_fraction" => p.consolidate_fraction = value.as_f64(key)?,
            "repair_alpha" => p.repair_alpha = value.as_f64(key)? as f32,
            _ => {}
        }
    }
    p.threads = threads_param(params)?;
    p.validate()?;
    Ok(p)
}

/// The directory of a durable engine (`path` parameter).
fn path_param(engine: &str, params: &Params) -> Result<std::path::PathBuf> {
    match params.get("path") {
        Some(v) => Ok(std::path::PathBuf::from(v.as_str("path")?)),
        None => Err(Error::invalid(format!(
            "engine {engine:?} lives in a directory: pass path=DIR"
        ))),
    }
}

/// `persist` of p-hnsw: `"pmem"` (default) or `"msync"`.
pub fn persist_param(params: &Params) -> Result<PersistMode> {
    match params.get("persist") {
        None => Ok(PersistMode::Pmem),
        Some(v) => PersistMode::parse(v.as_str("persist")?),
    }
}

/// Builds [`PHnswParams`] from loose parameters.
pub fn phnsw_params(params: &Params) -> Result<PHnswParams> {
    const KNOWN: &[&str] = &[
        "m",
        "ef_construction",
        "ef_search",
        "seed",
        "path",
        "persist",
        "nlog_entries",
        "nlist_entries",
        "initial_capacity",
    ];
    unknown_params("p-hnsw", params, KNOWN)?;
    let mut p = PHnswParams {
        hnsw: graph_params(params)?,
        ..PHnswParams::default()
    };
    for (key, value) in params {
        match key.as_str() {
            "nlog_entries" => {
                p.nlog_entries = value.as_bounded(key, 1, limits::MAX_NLOG_ENTRIES)?
            }
            "nlist_entries" => {
                p.nlist_entries = value.as_bounded(key, 1, limits::MAX_NLIST_ENTRIES)?
            }
            "initial_capacity" => {
                p.initial_capacity = value.as_bounded(key, 0, limits::MAX_INITIAL_CAPACITY)?
            }
            _ => {}
        }
    }
    p.hnsw.threads = threads_param(params)?;
    Ok(p)
}

/// Builds [`BaselineParams`] from loose parameters.
pub fn baseline_params(kind: BaselineKind, params: &Params) -> Result<BaselineParams> {
    const KNOWN: &[&str] = &[
        "m",
        "ef_construction",
        "ef_search",
        "seed",
        "path",
        "snapshot_every",
        "wal_buffer",
    ];
    unknown_params(kind.name(), params, KNOWN)?;
    let mut p = BaselineParams::defaults(kind);
    p.hnsw = graph_params(params)?;
    for (key, value) in params {
        match key.as_str() {
            "snapshot_every" => {
                p.snapshot_every = value.as_bounded(key, 0, limits::MAX_SNAPSHOT_EVERY)?
            }
            "wal_buffer" => p.wal_buffer = value.as_bounded(key, 0, limits::MAX_WAL_BUFFER)?.max(1),
            _ => {}
        }
    }
    p.hnsw.threads = threads_param(params)?;
    Ok(p)
}

/// Whether `dir` holds an index of a durable engine, and which.
pub fn engine_at(dir: &Path) -> Option<&'static str> {
    if PHnsw::exists(dir) {
        return Some("p-hnsw");
    }
    vectide_hnsw::baselines::read_manifest(dir)
        .ok()
        .map(|(k, ..)| k.name())
}

/// Opens the durable index at `params["path"]` when it exists (recovering
/// it; its engine, dimension and metric must match), else creates it. Other
/// engines are created.
pub fn open_or_create(
    engine: &str,
    dim: usize,
    metric: Metric,
    params: &Params,
) -> Result<AnyIndex> {
    limits::check_dim(dim)?;
    if !DURABLE_ENGINES.contains(&engine) {
        return create(engine, dim, metric, params);
    }
    let dir = path_param(engine, params)?;
    let Some(found) = engine_at(&dir) else {
        return create(engine, dim, metric, params);
    };
    if found != engine {
        return Err(Error::invalid(format!(
            "{} holds a {found:?} index, not {engine:?}",
            dir.display()
        )));
    }
    let threads = threads_param(params)?;
    let idx = match engine {
        "p-hnsw" => AnyIndex::PHnsw(PHnsw::open(&dir, persist_param(params)?, threads)?),
        _ => AnyIndex::Baseline(Baseline::open(&dir, threads)?),
    };
    if idx.dim() != dim || idx.metric() != metric {
        return Err(Error::invalid(format!(
            "{} holds a {}-d {} index, asked for {dim}-d {}",
            dir.display(),
            idx.dim(),
            idx.metric().name(),
            metric.name()
        )));
    }
    Ok(idx)
}

/// Creates an empty index of the named engine.
pub fn create(engine: &str, dim: usize, metric: Metric, params: &Params) -> Result<AnyIndex> {
    limits::check_dim(dim)?;
    match engine {
        "hnsw" => Ok(AnyIndex::Hnsw(Hnsw::new(
            dim,
            metric,
            hnsw_params(params)?,
        )?)),
        "p-hnsw" => {
            let p = phnsw_params(params)?;
            let bytes = p.initial_capacity.saturating_mul(dim).saturating_mul(4);
            if bytes > limits::MAX_INITIAL_BYTES {
                return Err(Error::invalid(format!(
                    "initial_capacity {} × dim {dim} preallocates {bytes} bytes of vectors; \
                     at most {} are allowed (the file grows on its own)",
                    p.initial_capacity,
                    limits::MAX_INITIAL_BYTES
                )));
            }
            let dir = path_param(engine, params)?;
            Ok(AnyIndex::PHnsw(PHnsw::create(
                &dir,
                dim,
                metric,
                p,
                persist_param(params)?,
            )?))
        }
        "hnsw-snap" | "hnsw-wal" => {
            let kind = if engine == "hnsw-snap" {
                BaselineKind::Snap
            } else {
                BaselineKind::Wal
            };
            let p = baseline_params(kind, params)?;
            let dir = path_param(engine, params)?;
            Ok(AnyIndex::Baseline(Baseline::create(
                &dir, kind, dim, metric, p,
            )?))
        }
        other => Err(Error::invalid(format!(
            "unknown engine {other:?}; known engines: {}",
            ENGINES.join(", ")
        ))),
    }
}

/// Reads the first 8 bytes of a file (its magic).
fn read_magic(path: &Path) -> Result<[u8; 8]> {
    let mut f = std::fs::File::open(path).map_err(|e| Error::io_at(path, e))?;
    let mut magic = [0u8; 8];
    f.read_exact(&mut magic).map_err(|e| match e.kind() {
        std::io::ErrorKind::UnexpectedEof => Error::corrupted(format!(
            "{} is too short to be an index file",
            path.display()
        )),
        _ => Error::io_at(path, e),
    })?;
    Ok(magic)
}

/// Opens an index of any engine: a directory of a durable engine (recovered
/// on open; p-hnsw in `pmem` mode) or a file chosen by its magic.
pub fn load(path: &Path, threads: Option<usize>) -> Result<AnyIndex> {
    if let Some(t) = threads {
        limits::check_threads(t)?;
    }
    if path.is_dir() {
        return match engine_at(path) {
            Some("p-hnsw") => Ok(AnyIndex::PHnsw(PHnsw::open(
                path,
                PersistMode::Pmem,
                threads,
            )?)),
            Some(_) => Ok(AnyIndex::Baseline(Baseline::open(path, threads)?)),
            None => Err(Error::invalid(format!(
                "{} holds no Vectide index",
                path.display()
            ))),
        };
    }
    let magic = read_magic(path)?;
    if &magic == vectide_hnsw::persist::MAGIC {
        return Ok(AnyIndex::Hnsw(Hnsw::load(path, threads)?));
    }
    Err(Error::corrupted(format!(
        "{} is not a Vectide index file (unknown magic {:02x?})",
        path.display(),
        magic
    )))
}

/// A description of an index file, as `(field, value)` lines for `vectide inspect`.
pub fn inspect(path: &Path) -> Result<Vec<(String, String)>> {
    if path.is_dir() {
        if PHnsw::exists(path) {
            return vectide_hnsw::phnsw::inspect::inspect(path);
        }
        let (kind, dim, metric, p) = vectide_hnsw::baselines::read_manifest(path)?;
        let size = |f: &str| {
            std::fs::metadata(path.join(f)).map_or("absent".to_string(), |m| m.len().to_string())
        };
        let rows = [
            ("engine", kind.name().to_string()),
            ("metric", metric.name().to_string()),
            ("dim", dim.to_string()),
            ("m", p.hnsw.m.to_string()),
            ("ef_construction", p.hnsw.ef_construction.to_string()),
            ("snapshot_every", p.snapshot_every.to_string()),
            ("wal_buffer", p.wal_buffer.to_string()),
            ("snapshot_bytes", size("snapshot.vtdx")),
            ("wal_bytes", size("wal.log")),
        ];
        return Ok(rows.into_iter().map(|(k, v)| (k.to_string(), v)).collect());
    }
    let magic = read_magic(path)?;
    if &magic == vectide_hnsw::persist::MAGIC {
        let i = vectide_hnsw::inspect(path)?;
        let rows = [
            ("engine", "hnsw".to_string()),
            ("magic", String::from_utf8_lossy(&magic).into_owned()),
            ("format_version", i.format_version.to_string()),
            ("metric", i.metric.name().to_string()),
            ("dim", i.dim.to_string()),
            ("m", i.m.to_string()),
            ("ef_construction", i.ef_construction.to_string()),
            ("ef_search", i.ef_search.to_string()),
            ("slots", i.slots.to_string()),
            ("live", i.live.to_string()),
            ("deleted_pending", i.deleted_pending.to_string()),
            ("free_slots", i.free.to_string()),
            (
                "entry_slot",
                i.entry_slot.map_or("none".into(), |s| s.to_string()),
            ),
            ("max_level", i.max_level.to_string()),
            ("durable_seq", i.durable_seq.to_string()),
            ("file_bytes", i.file_bytes.to_string()),
            ("checksum_crc32", format!("{:08x} (verified)", i.checksum)),
        ];
        return Ok(rows.into_iter().map(|(k, v)| (k.to_string(), v)).collect());
    }
    Err(Error::corrupted(format!(
        "{} is not a Vectide index file (unknown magic {:02x?})",
        path.display(),
        magic
    )))
}

impl AnyIndex {
    fn inner(&self) -> &dyn VectorIndex {
        match self {
            AnyIndex::Hnsw(h) => h,
            AnyIndex::PHnsw(h) => h,
            AnyIndex::Baseline(b) => b,
        }
    }

    /// The volatile HNSW inside (the engine itself or the one a baseline wraps).
    fn volatile(&self) -> Option<&Hnsw> {
        match self {
            AnyIndex::Hnsw(h) => Some(h),
            AnyIndex::Baseline(b) => Some(b.inner()),
            AnyIndex::PHnsw(_) => None,
        }
    }

    /// The engine's registry name.
    pub fn engine(&self) -> &'static str {
        match self {
            AnyIndex::Hnsw(_) => "hnsw",
            AnyIndex::PHnsw(_) => "p-hnsw",
            AnyIndex::Baseline(b) => b.kind().name(),
        }
    }

    /// The P-HNSW engine, when this is one.
    pub fn as_phnsw(&self) -> Option<&PHnsw> {
        match self {
            AnyIndex::PHnsw(p) => Some(p),
            _ => None,
        }
    }

    /// The engine's parameters as `(name, value)` pairs.
    pub fn params(&self) -> Params {
        let int = |v: usize| ParamValue::Int(v as i64);
        match self {
            AnyIndex::PHnsw(h) => {
                let p = h.params();
                let mut out = Params::new();
                out.insert("m".into(), int(p.m));
                out.insert("ef_construction".into(), int(p.ef_construction));
                out.insert("ef_search".into(), int(p.ef_search));
                out.insert(
                    "path".into(),
                    ParamValue::Str(h.dir().display().to_string()),
                );
                out.insert(
                    "persist".into(),
                    ParamValue::Str(h.media_kind().to_string()),
                );
                out.insert("threads".into(), int(h.threads()));
                out
            }
            AnyIndex::Baseline(b) => {
                let p = b.params();
                let mut out = Params::new();
                out.insert("m".into(), int(p.hnsw.m));
                out.insert("ef_construction".into(), int(p.hnsw.ef_construction));
                out.insert("ef_search".into(), int(p.hnsw.ef_search));
                out.insert(
                    "path".into(),
                    ParamValue::Str(b.dir().display().to_string()),
                );
                out.insert("snapshot_every".into(), int(p.snapshot_every));
                out.insert("wal_buffer".into(), int(p.wal_buffer));
                out.insert("threads".into(), int(b.inner().threads()));
                out
            }
            AnyIndex::Hnsw(h) => {
                let p = h.params();
                let mut out = Params::new();
                out.insert("m".into(), ParamValue::Int(p.m as i64));
                out.insert(
                    "ef_construction".into(),
                    ParamValue::Int(p.ef_construction as i64),
                );
                out.insert("ef_search".into(), ParamValue::Int(p.ef_search as i64));
                out.insert(
                    "consolidate_fraction".into(),
                    ParamValue::Float(p.consolidate_fraction),
                );
                out.insert(
                    "repair_alpha".into(),
                    // Through text, so that an f32 such as 1.2 reads back as 1.2, not 1.2000000476837158.
                    ParamValue::Float(p.repair_alpha.to_string().parse().unwrap_or(1.0)),
                );
                out.insert("threads".into(), ParamValue::Int(h.threads() as i64));
                out
            }
        }
    }

    /// The default search-list size (`ef`) of graph engines.
    pub fn default_ef(&self) -> usize {
        match self {
            AnyIndex::PHnsw(h) => h.params().ef_search,
            _ => self.volatile().map_or(64, |h| h.params().ef_search),
        }
    }

    /// Inserts a batch, reporting progress (rows done) when asked.
    pub fn insert_with_progress(
        &self,
        seq: Seq,
        ids: &[u64],
        vectors: &[f32],
        progress: Option<&(dyn Fn(usize) + Sync)>,
    ) -> Result<()> {
        match self {
            AnyIndex::Hnsw(h) => h.insert_with_progress(seq, ids, vectors, progress),
            AnyIndex::PHnsw(h) => h.insert_with_progress(seq, ids, vectors, progress),
            AnyIndex::Baseline(b) => b.insert(seq, ids, vectors),
        }
    }

    /// Searches many row-major queries in parallel.
    pub fn search_batch(
        &self,
        queries: &[f32],
        k: usize,
        params: &SearchParams,
        filter: Option<Filter<'_>>,
    ) -> Result<Vec<Vec<Neighbor>>> {
        match self {
            AnyIndex::PHnsw(h) => h.search_batch(queries, k, params, filter),
            _ => self
                .volatile()
                .expect("volatile engines")
                .search_batch(queries, k, params, filter),
        }
    }

    /// Saves the index to a file (atomically). Durable engines live in their
    /// directory: for them this is an error naming `flush`.
    pub fn save(&self, path: &Path) -> Result<()> {
        match self {
            AnyIndex::Hnsw(h) => h.save(path),
            other => Err(Error::invalid(format!(
                "a {} index lives in its directory and is durable on its own; \
                 save({}) does not apply (use flush() to force durability)",
                other.engine(),
                path.display()
            ))),
        }
    }

    /// Worker threads of batch calls.
    pub fn threads(&self) -> usize {
        match self {
            AnyIndex::PHnsw(h) => h.threads(),
            _ => self.volatile().map_or(1, |h| h.threads()),
        }
    }
}

impl VectorIndex for AnyIndex {
    fn dim(&self) -> usize {
        self.inner().dim()
    }
    fn metric(&self) -> Metric {
        self.inner().metric()
    }
    fn insert(&self, seq: Seq, ids: &[u64], vectors: &[f32]) -> Result<()> {
        self.inner().insert(seq, ids, vectors)
    }
    fn delete(&self, seq: Seq, ids: &[u64]) -> Result<usize> {
        self.inner().delete(seq, ids)
    }
    fn search_into(
        &self,
        query: &[f32],
        k: usize,
        params: &SearchParams,
        filter: Option<Filter<'_>>,
        out: &mut Vec<Neighbor>,
    ) -> Result<()> {
        self.inner().search_into(query, k, params, filter, out)
    }
    fn distances(
        &self,
        query: &[f32],
        ids: &[u64],
        out: &mut Vec<Neighbor>,
    ) -> vectide_core::Result<()> {
        self.inner().distances(query, ids, out)
    }
    fn get(&self, id: u64) -> Option<Vec<f32>> {
        self.inner().get(id)
    }
    fn contains(&self, id: u64) -> bool {
        self.inner().contains(id)
    }
    fn len(&self) -> usize {
        self.inner().len()
    }
    fn flush(&self) -> Result<()> {
        self.inner().flush()
    }
    fn durable_seq(&self) -> Seq {
        self.inner().durable_seq()
    }
    fn stats(&self) -> IndexStats {
        self.inner().stats()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(pairs: &[(&str, ParamValue)]) -> Params {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect()
    }

    #[test]
    fn parses_cli_values() {
        assert_eq!(ParamValue::parse("16"), ParamValue::Int(16));
        assert_eq!(ParamValue::parse("0.5"), ParamValue::Float(0.5));
        assert_eq!(ParamValue::parse("true"), ParamValue::Bool(true));
        assert_eq!(ParamValue::parse("x"), ParamValue::Str("x".into()));
    }

    #[test]
    fn creates_hnsw_with_params() {
        let idx = create(
            "hnsw",
            8,
            Metric::L2,
            &params(&[("m", ParamValue::Int(8)), ("threads", ParamValue::Int(1))]),
        )
        .unwrap();
        assert_eq!(idx.engine(), "hnsw");
        assert_eq!(idx.params()["m"], ParamValue::Int(8));
        assert_eq!(idx.threads(), 1);
    }

    #[test]
    fn rejects_unknown_engine_and_params() {
        let e = create("nope", 8, Metric::L2, &Params::new()).unwrap_err();
        assert!(e.to_string().contains("known engines: hnsw"), "{e}");
        let e = create("hnsw", 8, Metric::L2, &params(&[("M", ParamValue::Int(8))])).unwrap_err();
        assert!(e.to_string().contains("unknown parameter(s) M"), "{e}");
        let e = create(
            "hnsw",
            8,
            Metric::L2,
            &params(&[("m", ParamValue::Float(1.5))]),
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("m must be an integer in 2..=256"),
            "{e}"
        );
        let e = create(
            "hnsw",
            8,
            Metric::L2,
            &params(&[("threads", ParamValue::Int(0))]),
        )
        .unwrap_err();
        assert!(e.to_string().contains("at least 1"), "{e}");
    }

    #[test]
    fn every_numeric_param_has_a_bound() {
        // Issue 10 item 6: `threads: 1500` used to start 1500 threads.
        let e = create(
            "hnsw",
            8,
            Metric::L2,
            &params(&[("threads", ParamValue::Int(1500))]),
        )
        .unwrap_err();
        assert!(
            e.to_string()
                .contains("threads must be an integer in 1..=256"),
            "{e}"
        );
        let dir = tempfile::tempdir().unwrap();
        let numeric: &[(&str, &[&str])] = &[
            ("hnsw", &["m", "ef_construction", "ef_search", "threads"]),
            (
                "p-hnsw",
                &[
                    "m",
                    "ef_construction",
                    "ef_search",
                    "threads",
                    "nlog_entries",
                    "nlist_entries",
                    "initial_capacity",
                ],
            ),
            (
                "hnsw-wal",
                &[
                    "m",
                    "ef_construction",
                    "ef_search",
                    "threads",
                    "snapshot_every",
                    "wal_buffer",
                ],
            ),
        ];
        for (engine, keys) in numeric {
            for key in *keys {
                for bad in [
                    ParamValue::Int(i64::MAX),
                    ParamValue::Int(-1),
                    ParamValue::Float(16.5),
                    ParamValue::Bool(true),
                    ParamValue::Str("16".into()),
                ] {
                    let path = dir.path().join(format!("{engine}-{key}"));
                    let p = params(&[
                        (key, bad.clone()),
                        ("path", ParamValue::Str(path.display().to_string())),
                    ]);
                    let p = if *engine == "hnsw" {
                        params(&[(key, bad.clone())])
                    } else {
                        p
                    };
                    let e = open_or_create(engine, 8, Metric::L2, &p).unwrap_err();
                    let msg = e.to_string();
                    assert!(
                        matches!(e, Error::InvalidInput(_)),
                        "{engine} {key}={bad}: {msg}"
                    );
                    assert!(msg.contains(key), "{engine} {key}={bad}: {msg}");
                    assert!(!path.exists(), "{engine} {key}={bad} left files behind");
                }
            }
        }
        // Preallocation is bounded in bytes too.
        let p = params(&[
            ("initial_capacity", ParamValue::Int(1 << 24)),
            (
                "path",
                ParamValue::Str(dir.path().join("big").display().to_string()),
            ),
        ]);
        let e = create("p-hnsw", 65_536, Metric::L2, &p).unwrap_err();
        assert!(e.to_string().contains("initial_capacity"), "{e}");
        let e = create("hnsw", 65_537, Metric::L2, &Params::new()).unwrap_err();
        assert!(e.to_string().contains("dim must be in 1..=65536"), "{e}");
        assert!(load(dir.path(), Some(limits::MAX_THREADS + 1)).is_err());
    }

    #[test]
    fn loads_and_inspects_by_magic() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("i.vtdx");
        let idx = create("hnsw", 4, Metric::Cosine, &Params::new()).unwrap();
        idx.insert(1, &[7, 9], &[1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0])
            .unwrap();
        idx.save(&path).unwrap();
        let back = load(&path, Some(1)).unwrap();
        assert_eq!(back.len(), 2);
        assert!(back.contains(9));
        let rows = inspect(&path).unwrap();
        let get = |k: &str| rows.iter().find(|(n, _)| n == k).unwrap().1.clone();
        assert_eq!(get("live"), "2");
        assert_eq!(get("metric"), "cosine");
        assert_eq!(get("durable_seq"), "1");

        let junk = dir.path().join("junk");
        std::fs::write(&junk, b"NOTANINDEXFILE").unwrap();
        assert!(matches!(load(&junk, None), Err(Error::Corrupted(_))));
        std::fs::write(&junk, b"abc").unwrap();
        assert!(matches!(inspect(&junk), Err(Error::Corrupted(_))));
        assert!(matches!(
            load(&dir.path().join("missing"), None),
            Err(Error::Io { .. })
        ));
    }

    #[test]
    fn in_place_distances_match_get_and_the_metric() {
        let dir = tempfile::tempdir().unwrap();
        let dim = 6;
        let vecs: Vec<f32> = (0..40 * dim)
            .map(|i| ((i * 37 % 101) as f32) - 50.0)
            .collect();
        let ids: Vec<u64> = (0..40).map(|i| i * 3 + 1).collect();
        let query = [0.5, -1.0, 2.0, 0.0, 1.5, -0.5];
        for metric in [Metric::L2, Metric::Ip, Metric::Cosine] {
            for engine in ENGINES {
                let path = dir.path().join(format!("{engine}-{metric:?}"));
                let p = if DURABLE_ENGINES.contains(engine) {
                    params(&[("path", ParamValue::Str(path.display().to_string()))])
                } else {
                    Params::new()
                };
                let idx = open_or_create(engine, dim, metric, &p).unwrap();
                idx.insert(1, &ids, &vecs).unwrap();
                idx.delete(2, &[ids[5]]).unwrap();
                // Unknown and deleted ids are skipped.
                let asked = [ids[0], 999, ids[5], ids[7], ids[39]];
                let mut got = Vec::new();
                idx.distances(&query, &asked, &mut got).unwrap();
                let mut q = Vec::new();
                let q = vectide_core::validate::prepare_query(dim, metric, &query, &mut q).unwrap();
                let want: Vec<(u64, f32)> = asked
                    .iter()
                    .filter_map(|&i| idx.get(i).map(|v| (i, metric.distance_fn()(q, &v))))
                    .collect();
                assert_eq!(got.len(), 3, "{engine} {metric:?}");
                for (g, (id, d)) in got.iter().zip(&want) {
                    assert_eq!(g.id, *id, "{engine} {metric:?}");
                    assert!(
                        (g.distance - d).abs() <= 1e-4 * d.abs().max(1.0),
                        "{engine} {metric:?}: {} vs {d}",
                        g.distance
                    );
                }
                assert!(idx.distances(&query[..3], &asked, &mut got).is_err());
            }
        }
    }

    #[test]
    fn durable_engines_live_in_directories_and_recover() {
        let dir = tempfile::tempdir().unwrap();
        for engine in DURABLE_ENGINES {
            let path = dir.path().join(engine);
            let p = params(&[("path", ParamValue::Str(path.display().to_string()))]);
            let e = create(engine, 4, Metric::L2, &Params::new()).unwrap_err();
            assert!(e.to_string().contains("path=DIR"), "{e}");
            let idx = open_or_create(engine, 4, Metric::L2, &p).unwrap();
            assert_eq!(idx.engine(), *engine);
            idx.insert(1, &[1, 2], &[1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0])
                .unwrap();
            idx.flush().unwrap();
            assert!(idx.save(&dir.path().join("x")).is_err() || *engine == "hnsw");
            drop(idx);
            assert_eq!(engine_at(&path), Some(*engine));
            let back = open_or_create(engine, 4, Metric::L2, &p).unwrap();
            assert_eq!(back.len(), 2, "{engine} recovers its rows");
            drop(back);
            let back = load(&path, Some(1)).unwrap();
            assert!(back.contains(2));
            drop(back);
            let e = open_or_create(engine, 5, Metric::L2, &p).unwrap_err();
            assert!(e.to_string().contains("4-d"), "{e}");
            let rows = inspect(&path).unwrap();
            assert_eq!(rows[0].1, *engine);
        }
        let p = params(&[(
            "path",
            ParamValue::Str(dir.path().join("p-hnsw").display().to_string()),
        )]);
        let e = open_or_create("hnsw-wal", 4, Metric::L2, &p).unwrap_err();
        assert!(e.to_string().contains("holds a \"p-hnsw\" index"), "{e}");
        let bad = params(&[
            (
                "path",
                ParamValue::Str(dir.path().join("q").display().to_string()),
            ),
            ("persist", ParamValue::Str("disk".into())),
        ]);
        assert!(create("p-hnsw", 4, Metric::L2, &bad).is_err());
        let rows = inspect(&dir.path().join("p-hnsw")).unwrap();
        let get = |k: &str| rows.iter().find(|(n, _)| n == k).unwrap().1.clone();
        assert_eq!(get("live"), "2");
        assert!(get("nlog").contains("0 logged"), "{}", get("nlog"));
    }
}
