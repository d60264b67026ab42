//! The one error type of the core crate, used by the engines and wrapped
//! (not repeated) by the database's `DbError` and the server's `ApiError`.

use std::path::PathBuf;

/// Result alias used across Vectide's crates.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in an index operation.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An operating-system I/O error, with the path it concerned when known.
    #[error("I/O error{}: {source}", path.as_ref().map(|p| format!(" on {}", p.display())).unwrap_or_default())]
    Io {
        path: Option<PathBuf>,
        #[source]
        source: std::io::Error,
    },
    /// Bytes on disk (or in a region) that fail a magic, bounds or checksum check.
    #[error("corrupted data: {0}")]
    Corrupted(String),
    /// A format version this build does not read.
    #[error("unsupported format version {found} (this build reads version {supported})")]
    Version { found: u32, supported: u32 },
    /// A vector whose length is not the index dimension.
    #[error("dimension mismatch: the index has dimension {expected}, got {got}")]
    DimensionMismatch { expected: usize, got: usize },
    /// Any other caller mistake; the message names the problem (and is
    /// shown as is, over HTTP and in Python exceptions).
    #[error("{0}")]
    InvalidInput(String),
    /// Ids that are not in the index.
    #[error("ids not found: {0:?}")]
    NotFound(Vec<u64>),
    /// A write that was already in the log failed to apply, so the state in
    /// memory differs from the log: reads go on, writes are refused until
    /// the index or collection is reopened (which replays the log).
    /// Retrying cannot help before that. The text names the first failure.
    #[error("poisoned: {0}; writes are refused until it is reopened, which replays the log")]
    Poisoned(String),
    /// A remote part (a memory node) did not answer within its timeout, or
    /// its connection failed. Transient: nothing was decided by the failed
    /// call's caller, and retrying may help (unlike [`Error::Poisoned`]).
    #[error("unavailable: {0}; retrying may help")]
    Unavailable(String),
}

impl Error {
    /// Shorthand for [`Error::InvalidInput`].
    pub fn invalid(msg: impl Into<String>) -> Self {
        Error::InvalidInput(msg.into())
    }
    /// Shorthand for [`Error::Unavailable`].
    pub fn unavailable(msg: impl Into<String>) -> Self {
        Error::Unavailable(msg.into())
    }
    /// Whether retrying the call may succeed ([`Error::Unavailable`]).
    pub fn is_transient(&self) -> bool {
        matches!(self, Error::Unavailable(_))
    }
    /// Shorthand for [`Error::Corrupted`].
    pub fn corrupted(msg: impl Into<String>) -> Self {
        Error::Corrupted(msg.into())
    }
    /// Wraps an I/O error with the path it concerned.
    pub fn io_at(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: Some(path.into()),
            source,
        }
    }
}

impl From<std::io::Error> for Error {
    fn from(source: std::io::Error) -> Self {
        Error::Io { path: None, source }
    }
}
