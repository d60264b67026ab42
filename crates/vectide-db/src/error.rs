//! The database's error type.

use std::path::PathBuf;

pub type Result<T, E = DbError> = std::result::Result<T, E>;

/// What can go wrong in a database call. The HTTP server maps each kind to a
/// status code (`status`).
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    /// A caller mistake; the message names it (400).
    #[error("{0}")]
    InvalidInput(String),
    /// No such collection (404).
    #[error("collection {0:?} not found")]
    CollectionNotFound(String),
    /// The collection exists already (409).
    #[error("collection {0:?} already exists")]
    CollectionExists(String),
    /// Another process holds the database directory (409).
    #[error("database {path} is locked by another process (pid {holder}); close it first")]
    Locked { path: PathBuf, holder: String },
    /// A handle used after its database was closed or its collection
    /// deleted (409).
    #[error("{0} is closed (its database was closed or the collection deleted)")]
    Closed(String),
    /// Bytes on disk that fail their checks.
    #[error("corrupted data: {0}")]
    Corrupted(String),
    /// An operating-system I/O error.
    #[error("I/O error{}: {source}", path.as_ref().map(|p| format!(" on {}", p.display())).unwrap_or_default())]
    Io {
        path: Option<PathBuf>,
        #[source]
        source: std::io::Error,
    },
    /// The payload store.
    #[error("payload store: {0}")]
    Store(String),
    /// An engine error (invalid vectors are mapped to `InvalidInput`).
    #[error(transparent)]
    Engine(vectide_core::Error),
}

impl DbError {
    pub fn invalid(msg: impl Into<String>) -> Self {
        DbError::InvalidInput(msg.into())
    }
    pub fn corrupted(msg: impl Into<String>) -> Self {
        DbError::Corrupted(msg.into())
    }
    pub fn io_at(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        DbError::Io {
            path: Some(path.into()),
            source,
        }
    }

    /// The HTTP status this error maps to.
    pub fn status(&self) -> u16 {
        match self {
            DbError::InvalidInput(_) => 400,
            DbError::CollectionNotFound(_) => 404,
            DbError::CollectionExists(_) | DbError::Locked { .. } | DbError::Closed(_) => 409,
            DbError::Engine(e) => match e {
                vectide_core::Error::InvalidInput(_)
                | vectide_core::Error::DimensionMismatch { .. } => 400,
                vectide_core::Error::NotFound(_) => 404,
                _ => 500,
            },
            _ => 500,
        }
    }
}

impl From<vectide_core::Error> for DbError {
    fn from(e: vectide_core::Error) -> Self {
        match e {
            vectide_core::Error::InvalidInput(m) => DbError::InvalidInput(m),
            vectide_core::Error::DimensionMismatch { expected, got } => DbError::InvalidInput(
                format!("wrong vector dimension: the collection has {expected}, got {got}"),
            ),
            vectide_core::Error::Io { path, source } => DbError::Io { path, source },
            vectide_core::Error::Corrupted(m) => DbError::Corrupted(m),
            other => DbError::Engine(other),
        }
    }
}

impl From<std::io::Error> for DbError {
    fn from(source: std::io::Error) -> Self {
        DbError::Io { path: None, source }
    }
}

impl From<serde_json::Error> for DbError {
    fn from(e: serde_json::Error) -> Self {
        DbError::InvalidInput(format!("malformed JSON: {e}"))
    }
}

/// A redb error: damage its checks found is `Corrupted`, the rest `Store`.
fn from_redb(storage: Option<&redb::StorageError>, e: &dyn std::fmt::Display) -> DbError {
    match storage {
        Some(redb::StorageError::Corrupted(m)) => DbError::Corrupted(format!("payload store: {m}")),
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
            redb::Error::Corrupted(m) => DbError::Corrupted(format!("payload store: {m}")),
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
