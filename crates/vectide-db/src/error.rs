//! The database's error type.

use std::path::PathBuf;

pub type Result<T, E = DbError> = std::result::Result<T, E>;

/// What can go wrong in a database call: the core's [`vectide_core::Error`]
/// (invalid input, damage, I/O, format versions, dimensions, missing ids) is
/// wrapped, not repeated; the other variants are the database's own. The
/// HTTP server and the Python bindings map each kind to a status or an
/// exception.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    /// An error of the core's kinds, raised by an engine or by the database
    /// itself (its message names the problem).
    #[error(transparent)]
    Core(#[from] vectide_core::Error),
    /// No such collection.
    #[error("collection {0:?} not found")]
    CollectionNotFound(String),
    /// The collection exists already.
    #[error("collection {0:?} already exists")]
    CollectionExists(String),
    /// Another process holds the database directory.
    #[error("database {path} is locked by another process (pid {holder}); close it first")]
    Locked { path: PathBuf, holder: String },
    /// A handle used after its database was closed or its collection
    /// deleted.
    #[error("{0} is closed (its database was closed or the collection deleted)")]
    Closed(String),
    /// The payload store.
    #[error("payload store: {0}")]
    Store(String),
    /// A point (or a vector of it) a request names is not there.
    #[error("{0} not found")]
    PointNotFound(String),
}

impl DbError {
    /// A caller mistake ([`vectide_core::Error::InvalidInput`]).
    pub fn invalid(msg: impl Into<String>) -> Self {
        DbError::Core(vectide_core::Error::invalid(msg))
    }
    /// Damaged bytes ([`vectide_core::Error::Corrupted`]).
    pub fn corrupted(msg: impl Into<String>) -> Self {
        DbError::Core(vectide_core::Error::corrupted(msg))
    }
    /// An I/O error on `path` ([`vectide_core::Error::Io`]).
    pub fn io_at(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        DbError::Core(vectide_core::Error::io_at(path, source))
    }
    /// The core error this wraps, if it is one.
    pub fn core(&self) -> Option<&vectide_core::Error> {
        match self {
            DbError::Core(e) => Some(e),
            _ => None,
        }
    }
    /// Whether this is a caller mistake (invalid input or a wrong dimension).
    pub fn is_invalid_input(&self) -> bool {
        matches!(
            self.core(),
            Some(
                vectide_core::Error::InvalidInput(_)
                    | vectide_core::Error::DimensionMismatch { .. }
            )
        )
    }
    /// Whether the collection is poisoned ([`vectide_core::Error::Poisoned`]):
    /// a committed write failed to apply; writes are refused until the
    /// database is reopened.
    pub fn is_poisoned(&self) -> bool {
        matches!(self.core(), Some(vectide_core::Error::Poisoned(_)))
    }
    /// Whether this reports damaged bytes.
    pub fn is_corrupted(&self) -> bool {
        matches!(self.core(), Some(vectide_core::Error::Corrupted(_)))
    }
}

impl From<std::io::Error> for DbError {
    fn from(source: std::io::Error) -> Self {
        DbError::Core(source.into())
    }
}

impl From<serde_json::Error> for DbError {
    fn from(e: serde_json::Error) -> Self {
        DbError::invalid(format!("malformed JSON: {e}"))
    }
}

/// A redb error: damage its checks found is `Corrupted`, the rest `Store`.
fn from_redb(storage: Option<&redb::StorageError>, e: &dyn std::fmt::Display) -> DbError {
    match storage {
        Some(redb::StorageError::Corrupted(m)) => DbError::corrupted(format!("payload store: {m}")),
        _ => DbError::Store(e.to_string()),
    }
}

impl From<redb::StorageError> for DbError {
    fn from(e: redb::StorageError) -> Self {
        from_redb(Some(&e), &e)
    }
}

impl From<redb::Error> for DbError {
    fn from(e: redb::Error) -> Self {
        match &e {
            redb::Error::Corrupted(m) => DbError::corrupted(format!("payload store: {m}")),
            _ => DbError::Store(e.to_string()),
        }
    }
}

macro_rules! store_err {
    ($($t:ident),*) => {$(
        impl From<redb::$t> for DbError {
            fn from(e: redb::$t) -> Self {
                let storage = match &e {
                    redb::$t::Storage(s) => Some(s),
                    _ => None,
                };
                from_redb(storage, &e)
            }
        }
    )*};
}
store_err!(DatabaseError, TransactionError, TableError, CommitError);
