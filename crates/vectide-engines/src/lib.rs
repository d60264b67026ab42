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
    Error, Filter, IndexStats, Metric, Neighbor, Result, SearchParams, Seq, VectorIndex,
};
use vectide_hnsw::{Hnsw, HnswParams};

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
pub const ENGINES: &[&str] = &["hnsw"];

/// Parameters every engine accepts.
const COMMON_PARAMS: &[&str] = &["threads"];

/// Any engine, behind one type.
#[derive(Debug)]
pub enum AnyIndex {
    Hnsw(Hnsw),
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

fn threads_param(params: &Params) -> Result<Option<usize>> {
    match params.get("threads") {
        None => Ok(None),
        Some(v) => match v.as_usize("threads")? {
            0 => Err(Error::invalid("threads must be at least 1")),
            n => Ok(Some(n)),
        },
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
    let mut p = HnswParams::default();
    for (key, value) in params {
        match key.as_str() {
            "m" => p.m = value.as_usize(key)?,
            "ef_construction" => p.ef_construction = value.as_usize(key)?,
            "ef_search" => p.ef_search = value.as_usize(key)?,
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

/// Creates an empty index of the named engine.
pub fn create(engine: &str, dim: usize, metric: Metric, params: &Params) -> Result<AnyIndex> {
    match engine {
        "hnsw" => Ok(AnyIndex::Hnsw(Hnsw::new(
            dim,
            metric,
            hnsw_params(params)?,
        )?)),
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

/// Opens an index file of any engine, chosen by its magic.
pub fn load(path: &Path, threads: Option<usize>) -> Result<AnyIndex> {
    if threads == Some(0) {
        return Err(Error::invalid("threads must be at least 1"));
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
        }
    }

    /// The engine's registry name.
    pub fn engine(&self) -> &'static str {
        match self {
            AnyIndex::Hnsw(_) => "hnsw",
        }
    }

    /// The engine's parameters as `(name, value)` pairs.
    pub fn params(&self) -> Params {
        match self {
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
            AnyIndex::Hnsw(h) => h.params().ef_search,
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
            AnyIndex::Hnsw(h) => h.search_batch(queries, k, params, filter),
        }
    }

    /// Saves the index to a file (atomically).
    pub fn save(&self, path: &Path) -> Result<()> {
        match self {
            AnyIndex::Hnsw(h) => h.save(path),
        }
    }

    /// Worker threads of batch calls.
    pub fn threads(&self) -> usize {
        match self {
            AnyIndex::Hnsw(h) => h.threads(),
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
        assert!(e.to_string().contains("non-negative integer"), "{e}");
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
}
