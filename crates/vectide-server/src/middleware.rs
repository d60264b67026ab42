//! What every request passes through: the API key (compared in constant
//! time), the content type of bodies, the JSON shape of the framework's own
//! refusals (405, 413, …) and the request metrics.

use crate::error::ApiError;
use crate::App;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;
use std::time::Instant;

/// Whether two secrets are equal, in time that depends on their lengths
/// only: every byte of `given` is compared (against `expected`, or against
/// itself once `expected` is exhausted), differences are OR-folded without
/// an early exit, and the lengths join the fold. Like
/// `hmac.compare_digest`, it reveals at most the lengths, never where the
/// first difference is.
fn secret_eq(expected: &[u8], given: &[u8]) -> bool {
    let mut diff = (expected.len() ^ given.len()) as u64;
    for (i, &g) in given.iter().enumerate() {
        let e = expected.get(i).copied().unwrap_or(!g);
        diff |= u64::from(e ^ g);
    }
    std::hint::black_box(diff) == 0
}

/// Whether the request may pass: `/healthz` always, else with the api-key
/// when one is configured.
fn authorized(app: &App, route: &str, headers: &HeaderMap) -> bool {
    let Some(key) = &app.config.api_key else {
        return true;
    };
    if route == "/healthz" {
        return true;
    }
    match headers.get("api-key") {
        Some(given) => secret_eq(key.as_bytes(), given.as_bytes()),
        None => false,
    }
}

/// A body declared as anything else than JSON (`application/json`,
/// `application/*+json`); a request without a content type is read as JSON.
fn non_json_body(method: &axum::http::Method, headers: &HeaderMap) -> Option<String> {
    use axum::http::Method;
    if !matches!(*method, Method::PUT | Method::POST | Method::PATCH) {
        return None;
    }
    let ct = headers.get(axum::http::header::CONTENT_TYPE)?;
    let text = ct.to_str().unwrap_or("").to_ascii_lowercase();
    let essence = text.split(';').next().unwrap_or("").trim();
    let json = essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"));
    (!json).then(|| {
        format!(
            "request bodies are JSON: expected content-type application/json, got {:?}",
            String::from_utf8_lossy(ct.as_bytes())
        )
    })
}

/// Gives error answers that axum produced itself (413 body limit, 405,
/// rejected path parameters …) the JSON error shape of the API.
async fn json_error(resp: Response) -> Response {
    let status = resp.status();
    let is_json = resp
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if status.as_u16() < 400 || is_json {
        return resp;
    }
    let (parts, body) = resp.into_parts();
    let text = axum::body::to_bytes(body, 64 << 10)
        .await
        .map(|b| String::from_utf8_lossy(&b).trim().to_string())
        .unwrap_or_default();
    let msg = if text.is_empty() {
        status
            .canonical_reason()
            .unwrap_or("request refused")
            .to_string()
    } else {
        text
    };
    let mut out = ApiError::new(status, msg).into_response();
    for (name, value) in parts.headers.iter() {
        if name != axum::http::header::CONTENT_TYPE && name != axum::http::header::CONTENT_LENGTH {
            out.headers_mut().insert(name.clone(), value.clone());
        }
    }
    out
}

pub async fn auth_and_metrics(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    req: Request,
    next: Next,
) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|m| m.as_str().to_string())
        .unwrap_or_else(|| "unmatched".into());
    let method = req.method().to_string();
    let t0 = Instant::now();
    let resp = if !authorized(&app, &route, &headers) {
        ApiError::new(StatusCode::UNAUTHORIZED, "missing or wrong api-key header").into_response()
    } else if let Some(msg) = non_json_body(req.method(), &headers) {
        ApiError::new(StatusCode::UNSUPPORTED_MEDIA_TYPE, msg).into_response()
    } else {
        json_error(next.run(req).await).await
    };
    let status = resp.status().as_u16();
    app.metrics
        .lock()
        .record(route, method, status, t0.elapsed().as_secs_f64());
    resp
}

pub async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "no such endpoint")
}

#[cfg(test)]
mod tests {
    use super::secret_eq;

    #[test]
    fn secrets_compare_without_early_exit() {
        assert!(secret_eq(b"s3cret", b"s3cret"));
        assert!(!secret_eq(b"s3cret", b"s3creT"));
        assert!(!secret_eq(b"s3cret", b"S3cret"));
        assert!(!secret_eq(b"s3cret", b"s3cre"));
        assert!(!secret_eq(b"s3cret", b"s3crett"));
        assert!(!secret_eq(b"s3cret", b""));
        assert!(!secret_eq(b"", b"x"));
        assert!(secret_eq(b"", b""));
        // A byte that equals its own complement cannot exist, so a longer
        // key never matches a shorter one, whatever it holds.
        assert!(!secret_eq(b"ab", b"ab\x00"));
    }
}
