//! # vectide-engines
//!
//! The registry: one table, [`REGISTRY`], with one line per engine — the
//! [`EngineDescriptor`] its crate exports. Every front end (the database,
//! the server, the CLI, Python) learns engines from this table: names,
//! parameter schemas, search knobs, persistence classes, and the functions
//! that create, open and inspect indexes. No engine name is matched
//! anywhere else (a test in this crate checks the front ends' sources).
//!
//! Adding an engine: write its crate with a `DESCRIPTOR`, add the crate as a
//! dependency here and one line to [`REGISTRY`].

use std::path::Path;
pub use vectide_core::params::{check_params, ParamKind, ParamSpec, ParamValue, Params, ParamsExt};
use vectide_core::{limits, Error, Metric, Result, VectorIndex};
pub use vectide_core::{EngineDescriptor, Knob, Persistence};

/// Any engine, behind the one contract.
pub type AnyIndex = Box<dyn VectorIndex>;

/// Every engine this build knows, one line each.
pub static REGISTRY: &[&EngineDescriptor] = &[
    &vectide_hnsw::HNSW,
    &vectide_phnsw::P_HNSW,
    &vectide_phnsw::baselines::HNSW_SNAP,
    &vectide_phnsw::baselines::HNSW_WAL,
    &vectide_flat::DESCRIPTOR,
    &vectide_vamana::DESCRIPTOR,
    &vectide_diskann::DESCRIPTOR,
    &vectide_spfresh::SPANN,
    &vectide_spfresh::SPANN_INPLACE,
    &vectide_spfresh::SPFRESH,
    &vectide_dhnsw::DESCRIPTOR,
];

/// The engine a collection or an index gets when none is named.
pub const DEFAULT_ENGINE: &str = REGISTRY_DEFAULT.name;
const REGISTRY_DEFAULT: &EngineDescriptor = &vectide_hnsw::HNSW;

/// The names of every engine, in registry order.
pub fn names() -> Vec<&'static str> {
    REGISTRY.iter().map(|d| d.name).collect()
}

/// The names of the engines whose data outlives their process by itself
/// (in a directory, or on a memory node's backing file).
pub fn survivor_names() -> Vec<&'static str> {
    REGISTRY
        .iter()
        .filter(|d| d.persistence.durable())
        .map(|d| d.name)
        .collect()
}

/// The names of the engines that live in a directory.
pub fn durable_names() -> Vec<&'static str> {
    REGISTRY
        .iter()
        .filter(|d| d.persistence.in_directory())
        .map(|d| d.name)
        .collect()
}

/// The descriptor of a named engine; an unknown name is an error listing
/// the known ones.
pub fn descriptor(engine: &str) -> Result<&'static EngineDescriptor> {
    REGISTRY
        .iter()
        .copied()
        .find(|d| d.name == engine)
        .ok_or_else(|| {
            Error::invalid(format!(
                "unknown engine {engine:?}; known engines: {}",
                names().join(", ")
            ))
        })
}

/// Checks an engine name and its parameters without creating anything.
/// `path` is supplied by the caller for engines in a directory, so it is
/// not required here.
pub fn validate(engine: &str, dim: usize, params: &Params) -> Result<&'static EngineDescriptor> {
    limits::check_dim(dim)?;
    let d = descriptor(engine)?;
    check_params(d.name, d.params, params)?;
    Ok(d)
}

/// The directory of an engine that lives in one (`path`).
fn path_param(d: &EngineDescriptor, params: &Params) -> Result<std::path::PathBuf> {
    match params.string("path") {
        Some(p) => Ok(p.into()),
        None => Err(Error::invalid(format!(
            "engine {:?} lives in a directory: pass path=DIR",
            d.name
        ))),
    }
}

/// Creates an empty index of the named engine.
pub fn create(engine: &str, dim: usize, metric: Metric, params: &Params) -> Result<AnyIndex> {
    let d = validate(engine, dim, params)?;
    if d.persistence.in_directory() {
        let dir = path_param(d, params)?;
        if let Some(found) = engine_at(&dir)? {
            return Err(Error::invalid(format!(
                "{} already holds a {:?} index",
                dir.display(),
                found.name
            )));
        }
    }
    (d.create)(dim, metric, params)
}

/// Which engine's index a path holds: `None` for a path that does not
/// exist or an empty directory; an error for a file or a non-empty directory
/// that no registered engine recognises.
pub fn engine_at(path: &Path) -> Result<Option<&'static EngineDescriptor>> {
    if !path.exists() {
        return Ok(None);
    }
    if let Some(d) = REGISTRY.iter().copied().find(|d| (d.detect)(path)) {
        return Ok(Some(d));
    }
    if path.is_dir() {
        let empty = std::fs::read_dir(path)
            .map_err(|e| Error::io_at(path, e))?
            .next()
            .is_none();
        if empty {
            return Ok(None);
        }
        return Err(Error::invalid(format!(
            "{} holds no index of a known engine ({})",
            path.display(),
            names().join(", ")
        )));
    }
    let mut magic = Vec::new();
    use std::io::Read;
    std::fs::File::open(path)
        .and_then(|f| f.take(8).read_to_end(&mut magic))
        .map_err(|e| Error::io_at(path, e))?;
    if magic.len() < 8 {
        return Err(Error::corrupted(format!(
            "{} is too short to be an index file",
            path.display()
        )));
    }
    Err(Error::corrupted(format!(
        "{} is not a Vectide index file (unknown magic {:02x?})",
        path.display(),
        magic
    )))
}

/// Opens the index of an engine that lives in a directory when its
/// `path` holds one (recovering it; its engine, dimension and metric must
/// match), else creates it. Volatile engines are created.
pub fn open_or_create(
    engine: &str,
    dim: usize,
    metric: Metric,
    params: &Params,
) -> Result<AnyIndex> {
    let d = validate(engine, dim, params)?;
    if !d.persistence.in_directory() {
        return (d.create)(dim, metric, params);
    }
    let dir = path_param(d, params)?;
    let Some(found) = engine_at(&dir)? else {
        return (d.create)(dim, metric, params);
    };
    if found.name != d.name {
        return Err(Error::invalid(format!(
            "{} holds a {:?} index, not {:?}",
            dir.display(),
            found.name,
            d.name
        )));
    }
    let idx = (d.open)(&dir, params)?;
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

/// Opens an index of any engine at `path` (a directory of an engine that
/// lives in one, recovered on open, or a saved file), chosen by what the
/// path holds. `params` are open-time parameters (`threads`, `persist`).
pub fn open(path: &Path, params: &Params) -> Result<AnyIndex> {
    if !path.exists() {
        return Err(Error::io_at(
            path,
            std::io::Error::new(std::io::ErrorKind::NotFound, "no such file or directory"),
        ));
    }
    let d = engine_at(path)?
        .ok_or_else(|| Error::invalid(format!("{} holds no Vectide index", path.display())))?;
    let allowed: Vec<ParamSpec> = d
        .params
        .iter()
        .filter(|p| d.open_params.contains(&p.name) && p.name != "path")
        .copied()
        .collect();
    check_params(d.name, &allowed, params)?;
    (d.open)(path, params)
}

/// [`open`] with only a thread count.
pub fn load(path: &Path, threads: Option<usize>) -> Result<AnyIndex> {
    let mut p = Params::new();
    if let Some(t) = threads {
        limits::check_threads(t)?;
        p.insert("threads".into(), ParamValue::Int(t as i64));
    }
    open(path, &p)
}

/// A description of an index, as `(field, value)` rows for `vectide inspect`.
pub fn inspect(path: &Path) -> Result<Vec<(String, String)>> {
    let d = engine_at(path)?
        .ok_or_else(|| Error::invalid(format!("{} holds no Vectide index", path.display())))?;
    (d.inspect)(path)
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

    /// What `params()` reports recreates the index: every parameter of the
    /// schema is there (the path of a durable engine included), each valid
    /// for it, and creating from it gives the same parameters again.
    #[test]
    fn every_engine_reports_every_parameter_of_its_schema() {
        let dir = tempfile::tempdir().unwrap();
        for d in REGISTRY {
            let mut p = Params::new();
            if d.params.iter().any(|s| s.name == "path") {
                let path = dir.path().join(d.name);
                p.insert("path".into(), ParamValue::Str(path.display().to_string()));
            }
            let idx = create(d.name, 4, Metric::L2, &p).unwrap();
            let out = idx.params();
            for spec in d.params {
                assert!(
                    out.contains_key(spec.name),
                    "{}: {} missing from {out:?}",
                    d.name,
                    spec.name
                );
            }
            validate(d.name, 4, &out).unwrap_or_else(|e| panic!("{}: {e}", d.name));
            drop(idx);
            if let Some(ParamValue::Str(path)) = out.get("path") {
                std::fs::remove_dir_all(path).unwrap();
            }
            let again = create(d.name, 4, Metric::L2, &out).unwrap();
            assert_eq!(again.params(), out, "{}", d.name);
        }
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
        assert!(
            e.to_string()
                .contains("threads must be an integer in 1..=256, got 0"),
            "{e}"
        );
    }

    #[test]
    fn fresh_diskann_takes_its_merge_knobs_at_open() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fd");
        let p = params(&[("path", ParamValue::Str(path.to_string_lossy().into_owned()))]);
        drop(create("fresh-diskann", 8, Metric::L2, &p).unwrap());
        let knobs = params(&[
            ("merge_l", ParamValue::Int(20)),
            ("merge_refill", ParamValue::Int(4)),
        ]);
        assert!(open(&path, &knobs).is_ok());
        let e = open(&path, &params(&[("merge_l", ParamValue::Int(0))])).unwrap_err();
        assert!(e.to_string().contains("merge_l"), "{e}");
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
        assert!(back.contains(9).unwrap());
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
            for engine in names() {
                let path = dir.path().join(format!("{engine}-{metric:?}"));
                let p = if descriptor(engine).unwrap().persistence.in_directory() {
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
                    .filter_map(|&i| {
                        idx.get(i)
                            .unwrap()
                            .map(|v| (i, metric.distance_fn()(q, &v)))
                    })
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
        for engine in durable_names() {
            let path = dir.path().join(engine);
            let p = params(&[("path", ParamValue::Str(path.display().to_string()))]);
            let e = create(engine, 4, Metric::L2, &Params::new()).unwrap_err();
            assert!(e.to_string().contains("path=DIR"), "{e}");
            let idx = open_or_create(engine, 4, Metric::L2, &p).unwrap();
            assert_eq!(idx.engine(), engine);
            idx.insert(1, &[1, 2], &[1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0])
                .unwrap();
            idx.flush().unwrap();
            assert!(idx.save(&dir.path().join("x")).is_err());
            drop(idx);
            assert_eq!(engine_at(&path).unwrap().map(|d| d.name), Some(engine));
            let back = open_or_create(engine, 4, Metric::L2, &p).unwrap();
            assert_eq!(back.len(), 2, "{engine} recovers its rows");
            drop(back);
            let back = load(&path, Some(1)).unwrap();
            assert!(back.contains(2).unwrap());
            drop(back);
            let e = open_or_create(engine, 5, Metric::L2, &p).unwrap_err();
            assert!(e.to_string().contains("4-d"), "{e}");
            let rows = inspect(&path).unwrap();
            assert_eq!(rows[0].1, engine);
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

    fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                rust_files(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }

    /// Front ends and the crash kit learn engines from the registry: no
    /// engine name appears as a string in their sources (tests excluded).
    #[test]
    fn no_engine_name_is_matched_outside_the_registry() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let mut files = Vec::new();
        for dir in [
            "crates/vectide-db/src",
            "crates/vectide-server/src",
            "crates/vectide-cli/src",
            "crates/vectide-python/src",
            "crates/vectide-crashkit/src",
        ] {
            rust_files(&root.join(dir), &mut files);
        }
        files.push(root.join("python/vectide/_vectide.pyi"));
        let mut found = Vec::new();
        for f in &files {
            let text = std::fs::read_to_string(f).unwrap();
            // Unit tests at the end of a file may name engines.
            let code = text.split("#[cfg(test)]").next().unwrap();
            for name in names() {
                if code.contains(&format!("\"{name}\"")) {
                    found.push(format!("{}: \"{name}\"", f.display()));
                }
            }
        }
        assert!(files.len() > 10, "the scan found the front ends");
        assert!(
            found.is_empty(),
            "engine names matched outside the registry: {found:#?}"
        );
    }

    #[test]
    fn a_damaged_manifest_is_reported_as_damage_not_as_an_unknown_engine() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("snap");
        let p = params(&[("path", ParamValue::Str(path.display().to_string()))]);
        drop(open_or_create("hnsw-snap", 4, Metric::L2, &p).unwrap());
        let manifest = path.join(vectide_phnsw::baselines::MANIFEST_FILE);
        let mut bytes = std::fs::read(&manifest).unwrap();
        let n = bytes.len();
        bytes[n - 6] ^= 0x40;
        std::fs::write(&manifest, &bytes).unwrap();
        assert!(matches!(load(&path, None), Err(Error::Corrupted(_))));
        assert!(matches!(inspect(&path), Err(Error::Corrupted(_))));
    }

    #[test]
    fn unknown_directories_and_files_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("something"), b"x").unwrap();
        let e = load(dir.path(), None).unwrap_err();
        assert!(
            e.to_string().contains("holds no index of a known engine"),
            "{e}"
        );
        let p = params(&[("path", ParamValue::Str(dir.path().display().to_string()))]);
        let e = open_or_create("p-hnsw", 4, Metric::L2, &p).unwrap_err();
        assert!(e.to_string().contains("known engine"), "{e}");
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            1,
            "nothing created"
        );
        let e = descriptor("nope").unwrap_err();
        assert!(e.to_string().contains("known engines: hnsw, p-hnsw"), "{e}");
        let d = descriptor("hnsw").unwrap();
        let e = d.knob("nprobe").unwrap_err();
        assert!(e.to_string().contains("it takes: ef"), "{e}");
        assert_eq!(d.knob("ef").unwrap(), Knob::Ef);
    }
}
