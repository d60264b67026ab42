//! # vectide-flat
//!
//! Vectide's exact engine (`engine="flat"`): every search compares the query
//! with every live vector. It answers small collections outright, re-ranks
//! candidates exactly, and computes the ground truth of every benchmark.
//!
//! The rooms of this crate, as in every engine crate:
//! - [`params`]: [`FlatParams`] (only `threads`) and the schema [`PARAMS`];
//! - `layout`: the slot store: vectors in one 32-byte-aligned row-major
//!   matrix (rows padded to whole 8-float lanes, with an extra column that
//!   folds the L2 norm into the matrix product), slot ↔ id maps,
//!   per-slot sequence numbers and the free-slot list;
//! - `builder`: insert/upsert batches, checked whole before any write;
//! - `search`: the single-query scan with the SIMD kernel and a bounded
//!   heap, and the batched search: query tiles × vector tiles as matrix
//!   products (`matrixmultiply`), keys compared in blocks of 32 with each
//!   query's heap threshold, survivors re-ranked exactly, tiles in
//!   parallel on the engine's rayon pool;
//! - `update`: deletes, which free their slot for the next insert at once;
//! - [`persist`]: save/load to one checksummed file (`docs/format-flat.md`);
//! - `state`: [`Flat`], its locks and its inherent methods (every other
//!   room imports it; it imports none of them);
//! - `engine`: the face, [`Flat`]'s [`VectorIndex`] implementation.
//!
//! ## Distances
//! "Smaller is closer": squared L2, `1 − cos` (vectors normalised at
//! insert), `−dot`. Ties are broken by slot, so results are deterministic
//! for a given history.
//!
//! ## Sequence numbers
//! Each slot remembers the sequence number of the operation that wrote it.
//! An insert not newer than the one recorded for its id is skipped, a
//! delete older than it too, so a log replay is harmless. The engine is
//! volatile: [`VectorIndex::durable_seq`] is the watermark captured by the
//! last save (or read back by a load).
//!
//! ## Concurrency
//! Searches and saves share one `RwLock` over the store; inserts and
//! deletes take it exclusively. Simple, and a batch of searches holds the
//! shared lock once for all its queries.

mod builder;
mod engine;
mod layout;
pub mod params;
pub mod persist;
mod search;
mod state;
mod update;

pub use params::{FlatParams, PARAMS};
pub use persist::{inspect, FileInfo, FORMAT_VERSION, MAGIC};
pub use state::Flat;

use std::path::Path;
use vectide_core::{EngineDescriptor, Metric, Params, Persistence, Result, VectorIndex};

/// Engine `flat`: exact search in memory, saved to one file.
pub static DESCRIPTOR: EngineDescriptor = EngineDescriptor {
    name: "flat",
    summary: "exact brute-force search in memory (GEMM-tiled batches); save/load to a file",
    persistence: Persistence::Volatile,
    medium: vectide_core::engine::Medium::Ram,
    params: &PARAMS,
    open_params: &["threads"],
    knobs: &[],
    primary_knob: None,
    create,
    open,
    detect,
    inspect: inspect_rows,
};

fn create(dim: usize, metric: Metric, params: &Params) -> Result<Box<dyn VectorIndex>> {
    Ok(Box::new(Flat::new(
        dim,
        metric,
        FlatParams::from_params(params)?,
    )?))
}

fn open(path: &Path, params: &Params) -> Result<Box<dyn VectorIndex>> {
    let p = FlatParams::from_params(params)?;
    Ok(Box::new(Flat::load(path, p.threads)?))
}

/// A file whose first eight bytes are [`MAGIC`].
fn detect(path: &Path) -> bool {
    path.is_file() && vectide_core::io::file_starts_with(path, MAGIC)
}

fn inspect_rows(path: &Path) -> Result<Vec<(String, String)>> {
    let i = inspect(path)?;
    let rows = [
        ("engine", "flat".to_string()),
        ("magic", String::from_utf8_lossy(MAGIC).into_owned()),
        ("format_version", i.format_version.to_string()),
        ("metric", i.metric.name().to_string()),
        ("dim", i.dim.to_string()),
        ("live", i.live.to_string()),
        ("slots", i.slots.to_string()),
        ("durable_seq", i.durable_seq.to_string()),
        ("file_bytes", i.file_bytes.to_string()),
        ("checksum_crc32", format!("{:08x} (verified)", i.checksum)),
    ];
    Ok(rows.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use vectide_core::params::params_of;
    use vectide_core::ParamValue;

    #[test]
    fn the_descriptor_creates_opens_detects_and_inspects() {
        let d = &DESCRIPTOR;
        assert_eq!(d.name, "flat");
        assert!(d.param("threads").is_some());
        assert!(d
            .knob("ef")
            .unwrap_err()
            .to_string()
            .contains("it is exact"));
        let p = params_of([("threads", ParamValue::Int(1))]);
        let idx = (d.create)(2, Metric::Ip, &p).unwrap();
        assert_eq!(idx.params(), p);
        assert!((d.create)(2, Metric::Ip, &params_of([("m", ParamValue::Int(1))])).is_err());
        idx.insert(3, &[1, 2], &[1.0, 0.0, 0.0, 1.0]).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("i.flat");
        idx.save(&path).unwrap();
        assert!((d.detect)(&path));
        assert!(!(d.detect)(dir.path()));
        assert!(!(d.detect)(&dir.path().join("absent")));
        let back = (d.open)(&path, &params_of([("threads", ParamValue::Int(2))])).unwrap();
        assert_eq!((back.len(), back.threads(), back.durable_seq()), (2, 2, 3));
        let rows = (d.inspect)(&path).unwrap();
        let get = |k: &str| rows.iter().find(|r| r.0 == k).map(|r| r.1.clone()).unwrap();
        assert_eq!(get("engine"), "flat");
        assert_eq!(get("metric"), "ip");
        assert_eq!(get("live"), "2");
        assert_eq!(get("durable_seq"), "3");
        assert!(get("checksum_crc32").ends_with("(verified)"));
        assert!((d.open)(dir.path(), &Params::new()).is_err());
    }
}
