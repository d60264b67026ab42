//! A collection's vector spaces (Qdrant's named vectors and sparse
//! vectors): their configuration, the values a point carries for them, and
//! the engines and indexes that hold them.
//!
//! A collection has zero or more **dense** spaces, each its own engine
//! instance from the registry (its own dimension, metric, engine and
//! parameters), and zero or more **sparse** spaces, each a
//! `vectide_sparse::SparseIndex`. The first dense space is the
//! collection's main one (`CollectionConfig::{dim, metric, engine,
//! params}`, named `vector_name`; `""` is Qdrant's unnamed vector); the
//! others follow in `more_vectors`. A collection of one unnamed dense space
//! and nothing else is the *single* form, whose log records and files are
//! those of a collection before spaces existed. Every other collection is
//! *multi*: its upsert records carry each point's vectors by space number
//! (the dense spaces in order, then the sparse ones), and a point may lack
//! any of them (`docs/format-database.md`).
//!
//! Files: dense space 0 keeps the single form's place (`index.vtdx` or
//! `index/`), dense space `i ≥ 1` lives in `spaces/i/`, sparse space `j`
//! in `sparse-j.vtsp` (`docs/format-sparse.md`).

use crate::error::{DbError, Result};
use parking_lot::RwLock;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use vectide_core::{Metric, Seq};
use vectide_engines::{AnyIndex, Params};
pub use vectide_sparse::{Modifier, SparseIndex, SparseVector};

/// Longest space name.
pub const MAX_SPACE_NAME: usize = 128;
/// Most spaces (dense and sparse together) one collection may have.
pub const MAX_SPACES: usize = 64;

/// A dense space's configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct VectorSpaceConfig {
    pub name: String,
    pub dim: usize,
    pub metric: Metric,
    pub engine: String,
    pub params: Params,
}

/// A sparse space's configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct SparseSpaceConfig {
    pub name: String,
    pub modifier: Modifier,
}

/// One vector of a point.
#[derive(Debug, Clone, PartialEq)]
pub enum VectorValue {
    Dense(Vec<f32>),
    Sparse(SparseVector),
}

/// A point's vectors, by space name (each space at most once).
pub type NamedVectors = Vec<(String, VectorValue)>;

/// A point to upsert into a collection of any form: its vectors by space
/// name (a point may lack some spaces; the single form needs its one).
#[derive(Debug, Clone)]
pub struct PointData {
    pub id: crate::ExtId,
    pub vectors: NamedVectors,
    /// A JSON object, or `Null` for none.
    pub payload: serde_json::Value,
}

/// Checks a space name: at most 128 bytes, no control characters (names
/// never reach file names: spaces are stored by number).
pub fn check_space_name(name: &str) -> Result<()> {
    if name.len() > MAX_SPACE_NAME || name.chars().any(char::is_control) {
        return Err(DbError::invalid(format!(
            "vector name {name:?}: at most {MAX_SPACE_NAME} bytes without control characters"
        )));
    }
    Ok(())
}

/// Where the spaces' numbers point in a multi record: dense spaces first,
/// then sparse ones.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Shape {
    /// The dimension of each dense space.
    pub dense: Vec<usize>,
    /// Sparse spaces.
    pub sparse: usize,
}

impl Shape {
    pub fn spaces(&self) -> usize {
        self.dense.len() + self.sparse
    }
}

/// A dense space of an open collection.
pub(crate) struct DenseSpace {
    pub config: VectorSpaceConfig,
    pub engine: AnyIndex,
    /// The newest sequence number applied to the engine (operations that
    /// do not touch it leave it behind): a checkpoint may cut the log past
    /// the engine's `durable_seq()` only when that covers this.
    pub engine_seq: AtomicU64,
}

/// A sparse space of an open collection.
pub(crate) struct SparseSpace {
    pub config: SparseSpaceConfig,
    pub index: RwLock<SparseIndex>,
    /// Through which sequence number its file holds every operation.
    pub durable: AtomicU64,
    pub file: PathBuf,
}

/// The directory of dense space `i` (space 0 in the collection's own).
pub(crate) fn dense_dir(dir: &Path, i: usize) -> PathBuf {
    if i == 0 {
        dir.to_path_buf()
    } else {
        dir.join("spaces").join(i.to_string())
    }
}

/// The file of sparse space `j`.
pub(crate) fn sparse_file(dir: &Path, j: usize) -> PathBuf {
    dir.join(format!("sparse-{j}.vtsp"))
}

impl SparseSpace {
    /// Loads the space's file, or starts empty without one.
    pub fn open(config: SparseSpaceConfig, file: PathBuf) -> Result<SparseSpace> {
        let index = if file.exists() {
            let x = SparseIndex::load(&file)?;
            if x.modifier() != config.modifier {
                return Err(DbError::corrupted(format!(
                    "{}: the sparse index's modifier {} is not the collection's {}",
                    file.display(),
                    x.modifier().name(),
                    config.modifier.name()
                )));
            }
            x
        } else {
            SparseIndex::new(config.modifier)
        };
        let durable = index.applied_seq();
        Ok(SparseSpace {
            config,
            index: RwLock::new(index),
            durable: AtomicU64::new(durable),
            file,
        })
    }

    pub fn durable_seq(&self) -> Seq {
        self.durable.load(std::sync::atomic::Ordering::Acquire)
    }
}
