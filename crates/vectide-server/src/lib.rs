//! # vectide-server
//!
//! The HTTP front of a [`vectide_db::Database`] (axum + tokio). One REST API,
//! shaped as the subset of Qdrant's REST API that the unmodified
//! `qdrant-client` uses (collections, upsert, query, search, retrieve, count,
//! scroll, delete, set payload, payload indexes), with Qdrant's envelope
//! `{"result", "status", "time"}`, its filter syntax, u64 and UUID point ids
//! and its score conventions; plus `/healthz`, `/metrics` (Prometheus text)
//! and `/openapi.json`.
//!
//! - Errors are JSON `{"status": {"error": "..."}, "time": t}` with a 4xx/5xx
//!   status: 400 for bad input and for what we do not support (named or
//!   sparse vectors, other distances), 404 for unknown collections, 401 for a
//!   missing or wrong `api-key` (compared in constant time), 413 for bodies
//!   over the limit, 415 for a body declared as something else than JSON.
//! - Every number that sizes work has a documented bound
//!   ([`vectide_core::limits`]): `limit` and `offset + limit` at most
//!   100,000, `hnsw_ef` at most 100,000, `vectors.size` at most 65,536,
//!   engine parameters (`threads` at most 256, …) checked by the engine
//!   registry, a query batch at most 2**24 result cells; beyond, 400.
//! - JSON numbers round-trip exactly (floats are parsed to the exact double);
//!   integers outside `-2**63..=2**64-1`, which JSON readers cannot keep
//!   exactly, are refused with 400.
//! - Writes are acknowledged after the fsync that covers them (the database's
//!   commit path), whatever `wait` says.
//! - Engine work runs on tokio's blocking pool; handlers never panic on input.
//!
//! Modules by layer: [`routes`] (handlers and the router), [`types`] (the
//! request and response bodies, read and written by serde), [`error`]
//! (`ApiError` and the status of every database and core error),
//! `middleware` (API key, content type, JSON refusals), `metrics`
//! (`/metrics`) and `openapi` (`/openapi.json`).

// The OpenAPI document is one `json!` literal, deeper than the default limit.
#![recursion_limit = "256"]

pub mod error;
mod metrics;
mod middleware;
mod openapi;
pub mod routes;
pub mod types;

pub use error::ApiError;
pub use routes::router;

use parking_lot::Mutex;
use std::sync::Arc;
use vectide_db::Database;

/// The Qdrant API level this server answers as (`GET /`).
pub const QDRANT_API_VERSION: &str = "1.20.0";

/// Server settings.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub api_key: Option<String>,
    /// Largest accepted request body (default 64 MiB).
    pub body_limit: usize,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            api_key: None,
            body_limit: 64 << 20,
        }
    }
}

/// Shared state of the handlers.
pub struct App {
    db: Arc<Database>,
    config: ServerConfig,
    metrics: Mutex<metrics::Metrics>,
}

/// Serves until SIGINT or SIGTERM, then checkpoints every collection.
pub async fn serve(
    db: Arc<Database>,
    addr: std::net::SocketAddr,
    config: ServerConfig,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    eprintln!("vectide: listening on http://{}", listener.local_addr()?);
    let app = router(db.clone(), config);
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            let ctrl_c = tokio::signal::ctrl_c();
            tokio::select! {
                _ = ctrl_c => {}
                _ = term.recv() => {}
            }
        })
        .await?;
    eprintln!("vectide: shutting down, checkpointing collections");
    tokio::task::spawn_blocking(move || db.flush())
        .await
        .map_err(std::io::Error::other)?
        .map_err(std::io::Error::other)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::Router;
    use serde_json::{json, Value};
    use tower::ServiceExt;

    struct Fixture {
        _dir: tempfile::TempDir,
        app: Router,
    }

    fn fixture(api_key: Option<&str>) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let db = Database::open(dir.path(), vectide_db::Options::default()).unwrap();
        let app = router(
            db,
            ServerConfig {
                api_key: api_key.map(String::from),
                body_limit: 1 << 20,
            },
        );
        Fixture { _dir: dir, app }
    }

    async fn call(
        app: &Router,
        method: &str,
        uri: &str,
        body: &[u8],
        headers: &[(&str, &str)],
    ) -> (u16, Value) {
        let mut req = axum::http::Request::builder().method(method).uri(uri);
        let mut has_type = false;
        for (k, v) in headers {
            has_type |= k.eq_ignore_ascii_case("content-type");
            req = req.header(*k, *v);
        }
        if !has_type {
            req = req.header("content-type", "application/json");
        }
        let resp = app
            .clone()
            .oneshot(req.body(Body::from(body.to_vec())).unwrap())
            .await
            .unwrap();
        let status = resp.status().as_u16();
        let ct = resp
            .headers()
            .get("content-type")
            .map(|v| v.to_str().unwrap().to_string());
        let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
            .await
            .unwrap();
        if status >= 400 {
            assert_eq!(
                ct.as_deref(),
                Some("application/json"),
                "{status}: {bytes:?}"
            );
        }
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    }

    fn error(doc: &Value) -> &str {
        doc["status"]["error"].as_str().unwrap_or("")
    }

    #[tokio::test]
    async fn engine_threads_beyond_the_bound_are_400() {
        let f = fixture(None);
        let before = std::fs::read_dir("/proc/self/task").map(|d| d.count()).ok();
        let body = br#"{"vectors": {"size": 3, "distance": "Euclid"}, "vectide": {"params": {"threads": 1500}}}"#;
        let (code, doc) = call(&f.app, "PUT", "/collections/x", body, &[]).await;
        assert_eq!(code, 400, "{doc}");
        assert!(
            error(&doc).contains("threads must be an integer in 1..=256"),
            "{doc}"
        );
        if let (Some(b), Ok(d)) = (before, std::fs::read_dir("/proc/self/task")) {
            assert!(d.count() < b + 64, "threads were started");
        }
        let (code, doc) = call(&f.app, "GET", "/collections/x/exists", b"", &[]).await;
        assert_eq!((code, &doc["result"]["exists"]), (200, &json!(false)));
        for params in [
            r#"{"m": 100000}"#,
            r#"{"ef_construction": 1e9}"#,
            r#"{"ef_search": -1}"#,
            r#"{"threads": true}"#,
            r#"{"threads": "8"}"#,
        ] {
            let body = format!(
                r#"{{"vectors": {{"size": 3, "distance": "Dot"}}, "vectide": {{"params": {params}}}}}"#
            );
            let (code, doc) = call(&f.app, "PUT", "/collections/y", body.as_bytes(), &[]).await;
            assert_eq!(code, 400, "{params}: {doc}");
        }
        let (code, doc) = call(
            &f.app,
            "PUT",
            "/collections/z",
            br#"{"vectors": {"size": 65537, "distance": "Dot"}}"#,
            &[],
        )
        .await;
        assert!(code == 400 && error(&doc).contains("1..=65536"), "{doc}");
    }

    #[tokio::test]
    async fn payload_numbers_round_trip_over_http() {
        let f = fixture(None);
        let (code, _) = call(
            &f.app,
            "PUT",
            "/collections/c",
            br#"{"vectors": {"size": 2, "distance": "Euclid"}}"#,
            &[],
        )
        .await;
        assert_eq!(code, 200);
        let nums = "[15028.519667320139, 0.30000000000000004, 1e-320, 5e-324, 1.7976931348623157e308, -0.0, 9223372036854775807, 18446744073709551615, -9223372036854775808]";
        let body =
            format!(r#"{{"points": [{{"id": 1, "vector": [1, 2], "payload": {{"v": {nums}}}}}]}}"#);
        let (code, doc) = call(
            &f.app,
            "PUT",
            "/collections/c/points?wait=true",
            body.as_bytes(),
            &[],
        )
        .await;
        assert_eq!(code, 200, "{doc}");
        let (code, doc) = call(
            &f.app,
            "POST",
            "/collections/c/points",
            br#"{"ids": [1]}"#,
            &[],
        )
        .await;
        assert_eq!(code, 200, "{doc}");
        let want: Value = serde_json::from_str(nums).unwrap();
        let got = &doc["result"][0]["payload"]["v"];
        assert_eq!(
            got[0].as_f64().unwrap().to_bits(),
            15028.519667320139f64.to_bits()
        );
        assert_eq!(got, &want);
        assert_eq!(got.to_string(), "[15028.519667320139,0.30000000000000004,1e-320,5e-324,1.7976931348623157e+308,-0.0,9223372036854775807,18446744073709551615,-9223372036854775808]");
        // Integers JSON cannot keep exactly are refused, not rounded.
        let (code, doc) = call(&f.app, "PUT", "/collections/c/points?wait=true", br#"{"points": [{"id": 2, "vector": [1, 2], "payload": {"big": 18446744073709551616}}]}"#, &[]).await;
        assert!(code == 400 && error(&doc).contains("2**64-1"), "{doc}");
        let (_, doc) = call(&f.app, "POST", "/collections/c/points/count", b"{}", &[]).await;
        assert_eq!(doc["result"]["count"], 1);
    }

    #[tokio::test]
    async fn sizes_and_ids_beyond_their_bounds_are_400() {
        let f = fixture(None);
        call(
            &f.app,
            "PUT",
            "/collections/c",
            br#"{"vectors": {"size": 2, "distance": "Euclid"}}"#,
            &[],
        )
        .await;
        call(
            &f.app,
            "PUT",
            "/collections/c/points",
            br#"{"points": [{"id": 1, "vector": [1, 2]}]}"#,
            &[],
        )
        .await;
        for body in [
            &br#"{"query": [1, 2], "limit": 100001}"#[..],
            br#"{"query": [1, 2], "limit": 1000000000}"#,
            br#"{"query": [1, 2], "limit": 100000, "offset": 1}"#,
            br#"{"query": [1, 2], "offset": 1000000}"#,
            br#"{"query": [1, 2], "limit": -1}"#,
            br#"{"query": [1, 2], "limit": 1.5}"#,
            br#"{"query": [1, 2], "limit": "10"}"#,
            br#"{"query": [1, 2], "params": {"hnsw_ef": 100001}}"#,
            br#"{"limit": 100001}"#,
            br#"{"query": 1.5}"#,
            br#"{"query": true}"#,
        ] {
            let (code, doc) = call(&f.app, "POST", "/collections/c/points/query", body, &[]).await;
            assert_eq!(code, 400, "{}: {doc}", String::from_utf8_lossy(body));
        }
        let (code, doc) = call(
            &f.app,
            "POST",
            "/collections/c/points/query",
            br#"{"query": [1, 2], "limit": 100000}"#,
            &[],
        )
        .await;
        assert_eq!(code, 200, "{doc}");
        let (code, doc) = call(
            &f.app,
            "POST",
            "/collections/c/points/scroll",
            br#"{"limit": 100001}"#,
            &[],
        )
        .await;
        assert_eq!(code, 400, "{doc}");
        let one = r#"{"query": [1, 2], "limit": 100000}"#;
        let batch = format!(r#"{{"searches": [{}]}}"#, vec![one; 200].join(","));
        let (code, doc) = call(
            &f.app,
            "POST",
            "/collections/c/points/query/batch",
            batch.as_bytes(),
            &[],
        )
        .await;
        assert!(code == 400 && error(&doc).contains("split"), "{doc}");
        for id in [
            "1.5",
            "null",
            "true",
            "{}",
            "[1]",
            "-1",
            "18446744073709551616",
        ] {
            let body = format!(r#"{{"points": [{{"id": {id}, "vector": [1, 2]}}]}}"#);
            let (code, doc) =
                call(&f.app, "PUT", "/collections/c/points", body.as_bytes(), &[]).await;
            assert_eq!(code, 400, "id {id}: {doc}");
        }
        let (_, doc) = call(&f.app, "POST", "/collections/c/points/count", b"{}", &[]).await;
        assert_eq!(doc["result"]["count"], 1);
    }

    #[tokio::test]
    async fn refusals_by_the_framework_are_json_too() {
        let f = fixture(Some("s3cret"));
        let key = [("api-key", "s3cret")];
        let (code, doc) = call(&f.app, "GET", "/collections", b"", &[]).await;
        assert!(code == 401 && error(&doc).contains("api-key"), "{doc}");
        let (code, _) = call(&f.app, "GET", "/collections", b"", &[("api-key", "s3creT")]).await;
        assert_eq!(code, 401);
        let (code, _) = call(&f.app, "GET", "/collections", b"", &key).await;
        assert_eq!(code, 200);
        let big = vec![b' '; 2 << 20];
        let (code, doc) = call(&f.app, "PUT", "/collections/c", &big, &key).await;
        assert!(code == 413 && !error(&doc).is_empty(), "{doc}");
        let (code, doc) = call(&f.app, "PATCH", "/collections/c", b"{}", &key).await;
        assert!(code == 405 && !error(&doc).is_empty(), "{doc}");
        let body = br#"{"vectors": {"size": 2, "distance": "Euclid"}}"#;
        let (code, doc) = call(
            &f.app,
            "PUT",
            "/collections/c",
            body,
            &[key[0], ("content-type", "text/plain")],
        )
        .await;
        assert!(
            code == 415 && error(&doc).contains("application/json"),
            "{doc}"
        );
        let (code, _) = call(
            &f.app,
            "PUT",
            "/collections/c",
            body,
            &[key[0], ("content-type", "application/json; charset=utf-8")],
        )
        .await;
        assert_eq!(code, 200);
    }

    /// The Query API's MMR, weighted RRF and grouped queries over HTTP
    /// (the requests LangChain's `max_marginal_relevance_search` and
    /// Haystack's retrievers send), and their bad input as 400s.
    #[tokio::test]
    async fn mmr_weighted_rrf_and_groups_over_http() {
        let f = fixture(None);
        let body = br#"{"vectors": {"size": 2, "distance": "Cosine"}}"#;
        let (code, _) = call(&f.app, "PUT", "/collections/c", body, &[]).await;
        assert_eq!(code, 200);
        let points: Vec<String> = (0..10)
            .map(|i| {
                let tags = if i % 2 == 1 { r#"["a", "b"]"# } else { r#""c""# };
                format!(
                    r#"{{"id": {i}, "vector": [1, {}], "payload": {{"meta": {{"g": {}}}, "t": {tags}}}}}"#,
                    f64::from(i) * 0.1 + 0.01,
                    i % 3
                )
            })
            .collect();
        let body = format!(r#"{{"points": [{}]}}"#, points.join(","));
        let (code, _) = call(
            &f.app,
            "PUT",
            "/collections/c/points?wait=true",
            body.as_bytes(),
            &[],
        )
        .await;
        assert_eq!(code, 200);
        let ids = |doc: &Value, at: &str| -> Vec<u64> {
            doc.pointer(at)
                .and_then(Value::as_array)
                .unwrap_or_else(|| panic!("{doc}"))
                .iter()
                .map(|p| p["id"].as_u64().unwrap())
                .collect()
        };
        // LangChain's MMR request (its answer is local mode's).
        let (code, doc) = call(
            &f.app,
            "POST",
            "/collections/c/points/query",
            br#"{"query": {"nearest": [1, 0.3], "mmr": {"diversity": 1.0, "candidates_limit": 10}}, "using": "", "limit": 4, "with_vector": true, "with_payload": true}"#,
            &[],
        )
        .await;
        assert_eq!(code, 200, "{doc}");
        assert_eq!(ids(&doc, "/result/points"), vec![3, 9, 0, 6]);
        assert!(doc["result"]["points"][0]["vector"].is_array(), "{doc}");
        // Weighted RRF.
        let (code, doc) = call(
            &f.app,
            "POST",
            "/collections/c/points/query",
            br#"{"prefetch": [{"query": [1, 0.3], "limit": 2}, {"query": [1, 0.9], "limit": 2}], "query": {"rrf": {"weights": [3.0, 1.0]}}}"#,
            &[],
        )
        .await;
        assert_eq!(code, 200, "{doc}");
        assert_eq!(ids(&doc, "/result/points"), vec![3, 2, 9, 8]);
        assert!((doc["result"]["points"][0]["score"].as_f64().unwrap() - 0.75).abs() < 1e-6);
        // Groups, with a payload selection.
        let (code, doc) = call(
            &f.app,
            "POST",
            "/collections/c/points/query/groups",
            br#"{"query": {"nearest": [1, 0.3]}, "with_vector": false, "with_payload": ["t"], "group_by": "meta.g", "group_size": 2, "limit": 2}"#,
            &[],
        )
        .await;
        assert_eq!(code, 200, "{doc}");
        let groups = doc["result"]["groups"].as_array().unwrap();
        assert_eq!(groups.len(), 2, "{doc}");
        assert_eq!((&groups[0]["id"], &groups[1]["id"]), (&json!(0), &json!(2)));
        assert_eq!(ids(&doc, "/result/groups/0/hits"), vec![3, 6]);
        assert_eq!(ids(&doc, "/result/groups/1/hits"), vec![2, 5]);
        assert_eq!(groups[0]["hits"][0]["payload"], json!({"t": ["a", "b"]}));
        let (code, doc) = call(
            &f.app,
            "POST",
            "/collections/c/points/search/groups",
            br#"{"vector": [1, 0.3], "group_by": "t", "group_size": 2, "limit": 5}"#,
            &[],
        )
        .await;
        assert_eq!(code, 200, "{doc}");
        let groups = doc["result"]["groups"].as_array().unwrap();
        let names: Vec<&Value> = groups.iter().map(|g| &g["id"]).collect();
        assert_eq!(names, [&json!("a"), &json!("b"), &json!("c")]);
        assert!(groups[0]["hits"][0]["payload"].is_null(), "{doc}");
        for (uri, body, says) in [
            (
                "query",
                &br#"{"query": {"nearest": [1, 0], "mmr": {"diversity": 2}}}"#[..],
                "query.mmr.diversity",
            ),
            (
                "query",
                br#"{"query": {"nearest": [1, 0], "mmr": {"candidates_limit": 100000}}}"#,
                "candidates_limit",
            ),
            (
                "query",
                br#"{"prefetch": [{"query": [1, 0]}], "query": {"rrf": {"weights": [1, 2]}}}"#,
                "2 weights for 1 prefetches",
            ),
            ("query/groups", br#"{"query": [1, 0]}"#, "group_by"),
            (
                "query/groups",
                br#"{"query": [1, 0], "group_by": "g", "group_size": 0}"#,
                "group_size",
            ),
            (
                "query/groups",
                br#"{"query": [1, 0], "group_by": "g", "with_lookup": "x"}"#,
                "with_lookup",
            ),
            (
                "query/groups",
                br#"{"query": [1, 0, 0], "group_by": "g"}"#,
                "dimension",
            ),
            (
                "search/groups",
                br#"{"vector": [1, 0], "group_by": "g", "limit": 3}"#,
                "group_size",
            ),
            (
                "search/groups",
                br#"{"vector": [1, "x"], "group_by": "g", "limit": 3, "group_size": 1}"#,
                "vector[1]",
            ),
        ] {
            let (code, doc) = call(
                &f.app,
                "POST",
                &format!("/collections/c/points/{uri}"),
                body,
                &[],
            )
            .await;
            assert_eq!(code, 400, "{}: {doc}", String::from_utf8_lossy(body));
            assert!(error(&doc).contains(says), "{says}: {doc}");
        }
        let (code, doc) = call(
            &f.app,
            "POST",
            "/collections/nope/points/query/groups",
            b"{}",
            &[],
        )
        .await;
        assert_eq!(code, 404, "{doc}");
        let (_, doc) = call(&f.app, "GET", "/openapi.json", b"", &[]).await;
        for path in [
            "/collections/{name}/points/query/groups",
            "/collections/{name}/points/search/groups",
        ] {
            assert!(doc["paths"][path]["post"].is_object(), "{path}");
        }
    }

    fn dir_bytes(p: &std::path::Path) -> u64 {
        std::fs::read_dir(p)
            .unwrap()
            .map(|e| e.unwrap().metadata().unwrap().len())
            .sum()
    }

    #[tokio::test]
    async fn maintain_and_checkpoint_run_on_request() {
        let f = fixture(None);
        let body =
            br#"{"vectors": {"size": 2, "distance": "Euclid"}, "vectide": {"engine": "hnsw"}}"#;
        let (code, doc) = call(&f.app, "PUT", "/collections/c", body, &[]).await;
        assert_eq!(code, 200, "{doc}");
        let points: Vec<String> = (0..300)
            .map(|i| format!(r#"{{"id": {i}, "vector": [{i}, 1]}}"#))
            .collect();
        let body = format!(r#"{{"points": [{}]}}"#, points.join(","));
        let (code, _) = call(&f.app, "PUT", "/collections/c/points", body.as_bytes(), &[]).await;
        assert_eq!(code, 200);
        let ids: Vec<String> = (0..100).map(|i| i.to_string()).collect();
        let body = format!(r#"{{"points": [{}]}}"#, ids.join(","));
        let (code, _) = call(
            &f.app,
            "POST",
            "/collections/c/points/delete",
            body.as_bytes(),
            &[],
        )
        .await;
        assert_eq!(code, 200);
        let pending =
            |doc: &Value| doc["result"]["vectide"]["engine_stats"]["pending_deletes"].clone();
        let (_, doc) = call(&f.app, "GET", "/collections/c", b"", &[]).await;
        assert_eq!(pending(&doc), json!(100), "{doc}");
        let (code, doc) = call(&f.app, "POST", "/collections/c/vectide/maintain", b"", &[]).await;
        assert_eq!((code, &doc["result"]), (200, &json!(true)), "{doc}");
        let (_, doc) = call(&f.app, "GET", "/collections/c", b"", &[]).await;
        assert_eq!(pending(&doc), json!(0), "{doc}");
        let wal = f._dir.path().join("collections/c/wal");
        let logged = dir_bytes(&wal);
        let (code, doc) = call(
            &f.app,
            "POST",
            "/collections/c/vectide/checkpoint",
            b"",
            &[],
        )
        .await;
        assert_eq!((code, &doc["result"]), (200, &json!(true)), "{doc}");
        assert!(
            dir_bytes(&wal) < logged / 10,
            "the log was not cut: {logged} bytes before"
        );
        let (_, doc) = call(&f.app, "POST", "/collections/c/points/count", b"{}", &[]).await;
        assert_eq!(doc["result"]["count"], 200);
        for verb in ["maintain", "checkpoint"] {
            let uri = format!("/collections/nope/vectide/{verb}");
            let (code, doc) = call(&f.app, "POST", &uri, b"", &[]).await;
            assert!(code == 404 && error(&doc).contains("nope"), "{doc}");
        }
    }
}
