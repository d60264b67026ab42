//! The API's error: a status and a message, answered as
//! `{"status": {"error": "..."}, "time": 0}`. It wraps the database's
//! [`DbError`] (and through it the core's [`vectide_core::Error`]) by
//! mapping each kind to a status here, in one place.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;
use vectide_db::DbError;

/// An API error: status + message, and for a transient failure (a remote
/// part that did not answer) the seconds after which a retry may succeed,
/// sent as `Retry-After` (a poisoned collection's 503 has none: it needs a
/// restart, not a retry).
#[derive(Debug)]
pub struct ApiError(pub StatusCode, pub String, pub Option<u32>);

/// Seconds a client is asked to wait before retrying a transient failure.
pub const RETRY_AFTER_SECS: u32 = 1;

impl ApiError {
    /// `status` with `msg`.
    pub fn new(status: StatusCode, msg: impl Into<String>) -> Self {
        ApiError(status, msg.into(), None)
    }
    /// 400 with `msg`.
    pub fn bad(msg: impl Into<String>) -> Self {
        ApiError::new(StatusCode::BAD_REQUEST, msg)
    }
    pub fn not_found(msg: impl Into<String>) -> Self {
        ApiError::new(StatusCode::NOT_FOUND, msg)
    }
    pub fn internal(msg: impl Into<String>) -> Self {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, msg)
    }
}

/// The status of a core error: caller mistakes are 400, missing ids 404,
/// a poisoned collection 503 (writes are unavailable until a restart
/// reopens it), a remote part that did not answer 503 (transient: the
/// message says retrying may help), damage, versions and I/O 500.
fn core_status(e: &vectide_core::Error) -> StatusCode {
    use vectide_core::Error as E;
    match e {
        E::Poisoned(_) | E::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        E::InvalidInput(_) | E::DimensionMismatch { .. } => StatusCode::BAD_REQUEST,
        E::NotFound(_) => StatusCode::NOT_FOUND,
        E::Corrupted(_) | E::Version { .. } | E::Io { .. } => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// The status of a database error.
fn db_status(e: &DbError) -> StatusCode {
    match e {
        DbError::Core(e) => core_status(e),
        DbError::CollectionNotFound(_) | DbError::PointNotFound(_) => StatusCode::NOT_FOUND,
        DbError::CollectionExists(_) | DbError::Locked { .. } | DbError::Closed(_) => {
            StatusCode::CONFLICT
        }
        DbError::Store(_) => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

fn retry_of(e: &vectide_core::Error) -> Option<u32> {
    e.is_transient().then_some(RETRY_AFTER_SECS)
}

impl From<DbError> for ApiError {
    fn from(e: DbError) -> Self {
        let retry = match &e {
            DbError::Core(c) => retry_of(c),
            _ => None,
        };
        ApiError(db_status(&e), e.to_string(), retry)
    }
}

impl From<vectide_core::Error> for ApiError {
    fn from(e: vectide_core::Error) -> Self {
        ApiError(core_status(&e), e.to_string(), retry_of(&e))
    }
}

/// A request body that serde could not read into its type: malformed JSON
/// says so; a value of the wrong type or out of bounds is named by its path
/// (`searches[1].limit: invalid value: …`).
impl From<serde_path_to_error::Error<serde_json::Error>> for ApiError {
    fn from(e: serde_path_to_error::Error<serde_json::Error>) -> Self {
        use serde_json::error::Category;
        let path = e.path().to_string();
        let inner = e.into_inner();
        match inner.classify() {
            Category::Data if path != "." => ApiError::bad(format!("{path}: {inner}")),
            Category::Data => ApiError::bad(inner.to_string()),
            Category::Syntax | Category::Eof | Category::Io => {
                ApiError::bad(format!("malformed JSON body: {inner}"))
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({"status": {"error": self.1}, "time": 0.0});
        let mut r = (self.0, axum::Json(body)).into_response();
        if let Some(s) = self.2 {
            r.headers_mut()
                .insert(axum::http::header::RETRY_AFTER, s.into());
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn database_and_core_errors_map_to_their_statuses() {
        let cases: Vec<(ApiError, u16)> = vec![
            (DbError::invalid("bad k").into(), 400),
            (
                DbError::Core(vectide_core::Error::DimensionMismatch {
                    expected: 4,
                    got: 3,
                })
                .into(),
                400,
            ),
            (
                DbError::Core(vectide_core::Error::NotFound(vec![7])).into(),
                404,
            ),
            (DbError::CollectionNotFound("c".into()).into(), 404),
            (DbError::CollectionExists("c".into()).into(), 409),
            (DbError::Closed("c".into()).into(), 409),
            (DbError::corrupted("crc").into(), 500),
            (DbError::Store("redb".into()).into(), 500),
            (
                DbError::io_at("/x", std::io::Error::other("disk")).into(),
                500,
            ),
            (vectide_core::Error::invalid("k").into(), 400),
            (
                DbError::Core(vectide_core::Error::Poisoned("record 3".into())).into(),
                503,
            ),
            (
                DbError::Core(vectide_core::Error::Unavailable("memnode".into())).into(),
                503,
            ),
            (
                vectide_core::Error::Unavailable("memnode".into()).into(),
                503,
            ),
            (
                vectide_core::Error::Version {
                    found: 9,
                    supported: 1,
                }
                .into(),
                500,
            ),
        ];
        for (e, want) in cases {
            assert_eq!(e.0.as_u16(), want, "{}", e.1);
            assert!(!e.1.is_empty());
        }
        // Only the transient 503 asks for a retry, in a header.
        let retry = |e: ApiError| {
            e.into_response()
                .headers()
                .get("retry-after")
                .map(|v| v.to_str().unwrap().to_string())
        };
        let unavailable = vectide_core::Error::Unavailable("memnode".into());
        assert_eq!(retry(DbError::Core(unavailable).into()), Some("1".into()));
        let poisoned = vectide_core::Error::Poisoned("record 3".into());
        assert_eq!(retry(DbError::Core(poisoned).into()), None);
        assert_eq!(retry(DbError::invalid("bad k").into()), None);
        // Invalid input is shown as its message, without a prefix.
        assert_eq!(ApiError::from(DbError::invalid("bad k")).1, "bad k");
    }
}
