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

mod openapi;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, MatchedPath, Path, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::Router;
use parking_lot::Mutex;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;
use vectide_core::{limits, Metric, SearchParams};
use vectide_db::{
    score, Collection, CollectionConfig, Database, DbError, ExtId, Filter, IndexKind, PointInput,
};
use vectide_engines::{ParamValue, Params};

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

#[derive(Default)]
struct Metrics {
    /// (route, method, status) -> (count, seconds).
    requests: BTreeMap<(String, String, u16), (u64, f64)>,
}

/// Shared state of the handlers.
pub struct App {
    db: Arc<Database>,
    config: ServerConfig,
    metrics: Mutex<Metrics>,
}

/// An API error: status + message.
#[derive(Debug)]
pub struct ApiError(StatusCode, String);

impl ApiError {
    fn bad(msg: impl Into<String>) -> Self {
        ApiError(StatusCode::BAD_REQUEST, msg.into())
    }
}

impl From<DbError> for ApiError {
    fn from(e: DbError) -> Self {
        let code = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        ApiError(code, e.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({"status": {"error": self.1}, "time": 0.0});
        (self.0, axum::Json(body)).into_response()
    }
}

type ApiResult = Result<Response, ApiError>;

fn ok(result: Value, t0: Instant) -> ApiResult {
    Ok(
        axum::Json(json!({"result": result, "status": "ok", "time": t0.elapsed().as_secs_f64()}))
            .into_response(),
    )
}

fn body_json(b: &Bytes) -> Result<Value, ApiError> {
    if b.iter().all(|c| c.is_ascii_whitespace()) {
        return Ok(Value::Object(Map::new()));
    }
    let v: Value = serde_json::from_slice(b)
        .map_err(|e| ApiError::bad(format!("malformed JSON body: {e}")))?;
    limits::check_json_integers(b).map_err(|e| ApiError::bad(e.to_string()))?;
    if !v.is_object() {
        return Err(ApiError::bad("the request body must be a JSON object"));
    }
    Ok(v)
}

/// Runs blocking database work off the async threads.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f).await.map_err(|e| {
        ApiError(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("worker failed: {e}"),
        )
    })?
}

fn collection(app: &App, name: &str) -> Result<Arc<Collection>, ApiError> {
    app.db.collection(name).map_err(ApiError::from)
}

fn distance_name(m: Metric) -> &'static str {
    match m {
        Metric::Cosine => "Cosine",
        Metric::Ip => "Dot",
        Metric::L2 => "Euclid",
    }
}

fn opt<'a>(v: &'a Value, key: &str) -> Option<&'a Value> {
    v.get(key).filter(|x| !x.is_null())
}

fn bool_field(v: &Value, key: &str, default: bool) -> Result<bool, ApiError> {
    match opt(v, key) {
        None => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(other) => Err(ApiError::bad(format!(
            "{key} must be true or false, got {other}"
        ))),
    }
}

fn usize_field(v: &Value, key: &str, default: usize, max: usize) -> Result<usize, ApiError> {
    match opt(v, key) {
        None => Ok(default),
        Some(x) => match x.as_u64() {
            Some(n) if (n as usize) <= max => Ok(n as usize),
            _ => Err(ApiError::bad(format!(
                "{key} must be an integer in 0..={max}, got {x}"
            ))),
        },
    }
}

fn filter_field(v: &Value, key: &str) -> Result<Option<Filter>, ApiError> {
    opt(v, key)
        .map(|f| Filter::parse(f).map_err(ApiError::from))
        .transpose()
}

fn ids_field(v: &Value) -> Result<Vec<ExtId>, ApiError> {
    let arr = v
        .as_array()
        .ok_or_else(|| ApiError::bad("point ids must be a list"))?;
    arr.iter()
        .map(|x| ExtId::from_json(x).map_err(ApiError::from))
        .collect()
}

fn vector_of(v: &Value, dim: usize, what: &str) -> Result<Vec<f32>, ApiError> {
    match v {
        Value::Array(a) => {
            if a.len() != dim {
                return Err(ApiError::bad(format!(
                    "{what}: wrong vector dimension: the collection has {dim}, got {}",
                    a.len()
                )));
            }
            a.iter()
                .map(|x| {
                    x.as_f64()
                        .map(|f| f as f32)
                        .filter(|f| f.is_finite())
                        .ok_or_else(|| {
                            ApiError::bad(format!(
                                "{what}: vector components must be finite numbers, got {x}"
                            ))
                        })
                })
                .collect()
        }
        Value::Object(_) => Err(ApiError::bad(format!(
            "{what}: named and sparse vectors are not supported; send a plain list of floats"
        ))),
        other => Err(ApiError::bad(format!(
            "{what}: a vector must be a list of floats, got {other}"
        ))),
    }
}

/// `with_payload`: bool, a list of keys, or `{"include": [...]}` / `{"exclude": [...]}`.
#[derive(Debug, Clone)]
enum PayloadSel {
    None,
    All,
    Include(Vec<String>),
    Exclude(Vec<String>),
}

fn payload_sel(v: &Value, default: bool) -> Result<PayloadSel, ApiError> {
    let keys = |x: &Value| -> Result<Vec<String>, ApiError> {
        x.as_array()
            .ok_or_else(|| ApiError::bad("with_payload keys must be a list of strings"))?
            .iter()
            .map(|k| {
                k.as_str()
                    .map(String::from)
                    .ok_or_else(|| ApiError::bad("with_payload keys must be strings"))
            })
            .collect()
    };
    match opt(v, "with_payload") {
        None => Ok(if default {
            PayloadSel::All
        } else {
            PayloadSel::None
        }),
        Some(Value::Bool(true)) => Ok(PayloadSel::All),
        Some(Value::Bool(false)) => Ok(PayloadSel::None),
        Some(x @ Value::Array(_)) => Ok(PayloadSel::Include(keys(x)?)),
        Some(Value::Object(o)) => {
            if let Some(i) = o.get("include") {
                Ok(PayloadSel::Include(keys(i)?))
            } else if let Some(e) = o.get("exclude") {
                Ok(PayloadSel::Exclude(keys(e)?))
            } else {
                Err(ApiError::bad("with_payload: expected include or exclude"))
            }
        }
        Some(other) => Err(ApiError::bad(format!(
            "with_payload must be a bool, a list or an object, got {other}"
        ))),
    }
}

fn apply_sel(sel: &PayloadSel, p: Value) -> Option<Value> {
    match sel {
        PayloadSel::None => None,
        PayloadSel::All => Some(p),
        PayloadSel::Include(keys) => Some(Value::Object(
            p.as_object()
                .map(|o| {
                    o.iter()
                        .filter(|(k, _)| keys.contains(k))
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect()
                })
                .unwrap_or_default(),
        )),
        PayloadSel::Exclude(keys) => Some(Value::Object(
            p.as_object()
                .map(|o| {
                    o.iter()
                        .filter(|(k, _)| !keys.contains(k))
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect()
                })
                .unwrap_or_default(),
        )),
    }
}

fn record_json(id: &ExtId, payload: Option<Value>, vector: Option<Vec<f32>>) -> Value {
    json!({"id": id.to_json(), "payload": payload, "vector": vector})
}

// ---------------------------------------------------------------- handlers

async fn root(State(_): State<Arc<App>>) -> Response {
    axum::Json(json!({
        "title": "vectide (qdrant-compatible REST subset)",
        "version": QDRANT_API_VERSION,
        "vectide_version": env!("CARGO_PKG_VERSION"),
    }))
    .into_response()
}

async fn healthz() -> Response {
    axum::Json(json!({"status": "ok"})).into_response()
}

async fn openapi_doc() -> Response {
    axum::Json(openapi::document()).into_response()
}

async fn list_collections(State(app): State<Arc<App>>) -> ApiResult {
    let t0 = Instant::now();
    let cols: Vec<Value> = app
        .db
        .list()
        .into_iter()
        .map(|n| json!({"name": n}))
        .collect();
    ok(json!({"collections": cols}), t0)
}

async fn collection_exists(State(app): State<Arc<App>>, Path(name): Path<String>) -> ApiResult {
    let t0 = Instant::now();
    ok(json!({"exists": app.db.collection(&name).is_ok()}), t0)
}

fn parse_create(body: &Value) -> Result<CollectionConfig, ApiError> {
    if opt(body, "sparse_vectors").is_some() {
        return Err(ApiError::bad("sparse vectors are not supported"));
    }
    let vectors = opt(body, "vectors")
        .ok_or_else(|| ApiError::bad("vectors: {\"size\", \"distance\"} is required"))?;
    let vo = vectors
        .as_object()
        .ok_or_else(|| ApiError::bad("vectors must be an object"))?;
    if !vo.contains_key("size") {
        return Err(ApiError::bad(
            "named vectors are not supported: vectors must be {\"size\", \"distance\"}",
        ));
    }
    let dim = vo["size"]
        .as_u64()
        .filter(|&d| (1..=limits::MAX_DIM as u64).contains(&d))
        .ok_or_else(|| {
            ApiError::bad(format!(
                "vectors.size must be an integer in 1..={}, got {}",
                limits::MAX_DIM,
                vo["size"]
            ))
        })?;
    let metric = match vo.get("distance").and_then(|d| d.as_str()) {
        Some("Cosine") => Metric::Cosine,
        Some("Dot") => Metric::Ip,
        Some("Euclid") => Metric::L2,
        Some(other) => {
            return Err(ApiError::bad(format!(
                "distance {other:?} is not supported (Cosine, Dot, Euclid)"
            )))
        }
        None => return Err(ApiError::bad("vectors.distance is required")),
    };
    if opt(vectors, "multivector_config").is_some() {
        return Err(ApiError::bad("multivectors are not supported"));
    }
    let mut params = Params::new();
    let mut engine = vectide_engines::DEFAULT_ENGINE.to_string();
    if let Some(h) = opt(body, "hnsw_config") {
        if let Some(m) = opt(h, "m") {
            params.insert(
                "m".into(),
                ParamValue::Int(
                    m.as_i64()
                        .ok_or_else(|| ApiError::bad("hnsw_config.m must be an integer"))?,
                ),
            );
        }
        if let Some(e) = opt(h, "ef_construct") {
            params.insert(
                "ef_construction".into(),
                ParamValue::Int(
                    e.as_i64().ok_or_else(|| {
                        ApiError::bad("hnsw_config.ef_construct must be an integer")
                    })?,
                ),
            );
        }
    }
    if let Some(v) = opt(body, "vectide") {
        if let Some(e) = opt(v, "engine") {
            engine = e
                .as_str()
                .ok_or_else(|| ApiError::bad("vectide.engine must be a string"))?
                .to_string();
        }
        if let Some(p) = opt(v, "params") {
            params.extend(vectide_db::params_from_json(p)?);
        }
    }
    // Qdrant clients send `hnsw_config` whatever the engine: its fields
    // apply to engines that take them and are ignored by the others (an
    // exact engine has no graph to configure).
    let desc = vectide_engines::descriptor(&engine).map_err(|e| ApiError::bad(e.to_string()))?;
    if let Some(h) = opt(body, "hnsw_config") {
        for (qdrant, ours) in [("m", "m"), ("ef_construct", "ef_construction")] {
            if opt(h, qdrant).is_some() && desc.param(ours).is_none() {
                params.remove(ours);
            }
        }
    }
    Ok(CollectionConfig {
        dim: dim as usize,
        metric,
        engine,
        params,
    })
}

async fn create_collection(
    State(app): State<Arc<App>>,
    Path(name): Path<String>,
    body: Bytes,
) -> ApiResult {
    let t0 = Instant::now();
    let config = parse_create(&body_json(&body)?)?;
    blocking(move || {
        app.db
            .create_collection(&name, config)
            .map(|_| ())
            .map_err(ApiError::from)
    })
    .await?;
    ok(json!(true), t0)
}

async fn delete_collection(State(app): State<Arc<App>>, Path(name): Path<String>) -> ApiResult {
    let t0 = Instant::now();
    let existed = blocking(move || app.db.delete_collection(&name).map_err(ApiError::from)).await?;
    ok(json!(existed), t0)
}

async fn get_collection(State(app): State<Arc<App>>, Path(name): Path<String>) -> ApiResult {
    let t0 = Instant::now();
    let c = collection(&app, &name)?;
    let cfg = c.config();
    let p = |k: &str, d: i64| match cfg.params.get(k) {
        Some(ParamValue::Int(i)) => *i,
        _ => d,
    };
    let n = c.len();
    let schema: Map<String, Value> = c
        .indexes()
        .into_iter()
        .map(|(f, k)| {
            (
                f.clone(),
                json!({"data_type": k.name(), "points": c.count(None)}),
            )
        })
        .collect();
    ok(
        json!({
            "status": "green",
            "optimizer_status": "ok",
            "indexed_vectors_count": n,
            "points_count": n,
            "segments_count": 1,
            "config": {
                "params": {
                    "vectors": {"size": cfg.dim, "distance": distance_name(cfg.metric)},
                    "shard_number": 1, "replication_factor": 1, "write_consistency_factor": 1,
                    "on_disk_payload": true,
                },
                "hnsw_config": {"m": p("m", 16), "ef_construct": p("ef_construction", 200), "full_scan_threshold": vectide_db::collection::EXACT_MAX},
                "optimizer_config": {"deleted_threshold": 0.2, "vacuum_min_vector_number": 1000, "default_segment_number": 1, "flush_interval_sec": 60},
                "wal_config": {"wal_capacity_mb": 64, "wal_segments_ahead": 0},
            },
            "payload_schema": schema,
            "vectide": {
                "engine": cfg.engine, "durability": c.durability().name(), "last_seq": c.last_seq(),
                "opened_seconds": c.opened_in.as_secs_f64(),
                "replayed": c.counters.replayed.load(std::sync::atomic::Ordering::Relaxed),
                "wal_tail_bytes": c.wal_tail_bytes(),
            },
        }),
        t0,
    )
}

fn update_result(seq: u64) -> Value {
    json!({"operation_id": seq, "status": "completed"})
}

async fn upsert_points(
    State(app): State<Arc<App>>,
    Path(name): Path<String>,
    body: Bytes,
) -> ApiResult {
    let t0 = Instant::now();
    let c = collection(&app, &name)?;
    let body = body_json(&body)?;
    let dim = c.config().dim;
    let mut points = Vec::new();
    if let Some(list) = opt(&body, "points") {
        let arr = list
            .as_array()
            .ok_or_else(|| ApiError::bad("points must be a list"))?;
        for (i, p) in arr.iter().enumerate() {
            let at = format!("points[{i}]");
            let id = ExtId::from_json(p.get("id").unwrap_or(&Value::Null))
                .map_err(|e| ApiError::bad(format!("{at}.id: {e}")))?;
            let vector = vector_of(p.get("vector").unwrap_or(&Value::Null), dim, &at)?;
            let payload = p.get("payload").cloned().unwrap_or(Value::Null);
            points.push(PointInput {
                id,
                vector,
                payload,
            });
        }
    } else if let Some(batch) = opt(&body, "batch") {
        let ids = ids_field(batch.get("ids").unwrap_or(&Value::Null))?;
        let vectors = batch
            .get("vectors")
            .and_then(|v| v.as_array())
            .ok_or_else(|| ApiError::bad("batch.vectors must be a list of vectors"))?;
        if vectors.len() != ids.len() {
            return Err(ApiError::bad(format!(
                "batch: {} ids but {} vectors",
                ids.len(),
                vectors.len()
            )));
        }
        let payloads = match opt(batch, "payloads") {
            None => vec![Value::Null; ids.len()],
            Some(Value::Array(a)) if a.len() == ids.len() => a.clone(),
            Some(_) => {
                return Err(ApiError::bad(
                    "batch.payloads must be a list as long as ids",
                ))
            }
        };
        for (i, ((id, v), payload)) in ids.into_iter().zip(vectors).zip(payloads).enumerate() {
            points.push(PointInput {
                id,
                vector: vector_of(v, dim, &format!("batch.vectors[{i}]"))?,
                payload,
            });
        }
    } else {
        return Err(ApiError::bad("expected \"points\" or \"batch\""));
    }
    let seq = blocking(move || c.upsert(&points).map_err(ApiError::from)).await?;
    ok(update_result(seq), t0)
}

/// One query request (for /points/query, /points/query/batch and /points/search).
struct QueryReq {
    vector: Option<Vec<f32>>,
    filter: Option<Filter>,
    limit: usize,
    offset: usize,
    params: SearchParams,
    sel: PayloadSel,
    with_vector: bool,
    threshold: Option<f32>,
}

fn parse_query(c: &Collection, q: &Value, search_api: bool) -> Result<QueryReq, ApiError> {
    let dim = c.config().dim;
    for unsupported in ["using", "prefetch", "lookup_from"] {
        if opt(q, unsupported).is_some() {
            return Err(ApiError::bad(format!("{unsupported} is not supported")));
        }
    }
    let vector = if search_api {
        Some(vector_of(
            q.get("vector").unwrap_or(&Value::Null),
            dim,
            "vector",
        )?)
    } else {
        match opt(q, "query") {
            None => None,
            Some(v @ Value::Array(_)) => Some(vector_of(v, dim, "query")?),
            Some(Value::Object(o)) if o.contains_key("nearest") => {
                Some(vector_of(&o["nearest"], dim, "query.nearest")?)
            }
            Some(id @ (Value::Number(_) | Value::String(_))) => {
                let id = ExtId::from_json(id)?;
                let got = c.get(std::slice::from_ref(&id), true)?;
                let v = got
                    .into_iter()
                    .next()
                    .flatten()
                    .and_then(|r| r.vector)
                    .ok_or_else(|| {
                        ApiError(StatusCode::NOT_FOUND, format!("point {id} not found"))
                    })?;
                Some(v)
            }
            Some(other) => {
                return Err(ApiError::bad(format!(
                    "query must be a vector, {{\"nearest\": vector}} or a point id; got {other}"
                )))
            }
        }
    };
    let params = search_params(c, opt(q, "params"))?;
    let threshold = match opt(q, "score_threshold") {
        None => None,
        Some(t) => Some(
            t.as_f64()
                .filter(|x| x.is_finite())
                .ok_or_else(|| ApiError::bad("score_threshold must be a number"))?
                as f32,
        ),
    };
    let limit = usize_field(q, "limit", 10, limits::MAX_K)?;
    let offset = usize_field(q, "offset", 0, limits::MAX_K)?;
    limits::check_page(offset, limit).map_err(|e| ApiError::bad(e.to_string()))?;
    Ok(QueryReq {
        vector,
        filter: filter_field(q, "filter")?,
        limit,
        offset,
        params,
        sel: payload_sel(q, !search_api)?,
        with_vector: bool_field(q, "with_vector", false)?,
        threshold,
    })
}

/// The search knobs of a query's `params`, for the collection's engine.
/// Qdrant's `hnsw_ef` sets the engine's primary knob (ignored by an engine
/// without one); `exact: true` asks for an exact scan; `vectide` holds the
/// engine's native knobs (`{"nprobe": 32}`), checked against the ones it
/// takes.
fn search_params(c: &Collection, params: Option<&Value>) -> Result<SearchParams, ApiError> {
    let mut out = SearchParams::default();
    let Some(p) = params else {
        return Ok(out);
    };
    let desc = c.engine().descriptor();
    let knob_value = |name: &str, v: &Value, max: usize| {
        v.as_u64()
            .filter(|&x| (1..=max as u64).contains(&x))
            .map(|x| x as usize)
            .ok_or_else(|| {
                ApiError::bad(format!(
                    "params.{name} must be an integer in 1..={max}, got {v}"
                ))
            })
    };
    if let Some(e) = opt(p, "hnsw_ef") {
        let v = knob_value("hnsw_ef", e, limits::MAX_EF)?;
        if let Some(knob) = desc.primary_knob {
            out.set(knob, v.min(knob.max()))
                .map_err(|e| ApiError::bad(e.to_string()))?;
        }
    }
    out.exact = bool_field(p, "exact", false)?;
    if let Some(native) = opt(p, "vectide") {
        let Value::Object(m) = native else {
            return Err(ApiError::bad(
                "params.vectide must be an object of search knobs",
            ));
        };
        for (name, v) in m {
            let knob = desc.knob(name).map_err(|e| ApiError::bad(e.to_string()))?;
            out.set(knob, knob_value(name, v, knob.max())?)
                .map_err(|e| ApiError::bad(e.to_string()))?;
        }
    }
    Ok(out)
}

fn run_query(c: &Collection, q: &QueryReq) -> Result<Vec<Value>, ApiError> {
    if q.limit == 0 {
        return Ok(Vec::new());
    }
    let metric = c.config().metric;
    let Some(vector) = &q.vector else {
        // No query: points in id order, as a scroll would give them.
        let (page, _) = c.scroll(q.filter.as_ref(), None, q.offset + q.limit, q.with_vector)?;
        return Ok(page
            .into_iter()
            .skip(q.offset)
            .map(|r| json!({"id": r.id.to_json(), "version": 0, "score": 0.0, "payload": apply_sel(&q.sel, r.payload), "vector": r.vector}))
            .collect());
    };
    let params = &q.params;
    let want_payload = !matches!(q.sel, PayloadSel::None);
    let hits = c.search(
        vector,
        q.offset + q.limit,
        params,
        q.filter.as_ref(),
        want_payload,
        q.with_vector,
    )?;
    Ok(hits
        .into_iter()
        .skip(q.offset)
        .filter_map(|h| {
            let s = score(metric, h.distance);
            let keep = q.threshold.is_none_or(|t| match metric {
                Metric::L2 => s <= t,
                _ => s >= t,
            });
            keep.then(|| {
                json!({
                    "id": h.id.to_json(), "version": 0, "score": s,
                    "payload": h.payload.and_then(|p| apply_sel(&q.sel, p)), "vector": h.vector,
                })
            })
        })
        .collect())
}

async fn query_points(
    State(app): State<Arc<App>>,
    Path(name): Path<String>,
    body: Bytes,
) -> ApiResult {
    let t0 = Instant::now();
    let c = collection(&app, &name)?;
    let body = body_json(&body)?;
    let pts = blocking(move || {
        let q = parse_query(&c, &body, false)?;
        run_query(&c, &q)
    })
    .await?;
    ok(json!({"points": pts}), t0)
}

async fn query_batch(
    State(app): State<Arc<App>>,
    Path(name): Path<String>,
    body: Bytes,
) -> ApiResult {
    let t0 = Instant::now();
    let c = collection(&app, &name)?;
    let body = body_json(&body)?;
    let out = blocking(move || {
        let searches = body
            .get("searches")
            .and_then(|s| s.as_array())
            .ok_or_else(|| ApiError::bad("searches must be a list"))?;
        // Every request is checked before any runs; together they may ask
        // for at most MAX_BATCH_RESULTS results.
        let queries = searches
            .iter()
            .map(|s| parse_query(&c, s, false))
            .collect::<Result<Vec<QueryReq>, ApiError>>()?;
        let cells: usize = queries.iter().map(|q| q.offset + q.limit).sum();
        if cells > limits::MAX_BATCH_RESULTS {
            return Err(ApiError::bad(format!(
                "the batch asks for {cells} results (sum of offset + limit); at most {} \
                 per request: split it",
                limits::MAX_BATCH_RESULTS
            )));
        }
        queries
            .iter()
            .map(|q| Ok(json!({"points": run_query(&c, q)?})))
            .collect::<Result<Vec<Value>, ApiError>>()
    })
    .await?;
    ok(Value::Array(out), t0)
}

async fn search_points(
    State(app): State<Arc<App>>,
    Path(name): Path<String>,
    body: Bytes,
) -> ApiResult {
    let t0 = Instant::now();
    let c = collection(&app, &name)?;
    let body = body_json(&body)?;
    let pts = blocking(move || {
        let q = parse_query(&c, &body, true)?;
        run_query(&c, &q)
    })
    .await?;
    ok(Value::Array(pts), t0)
}

async fn retrieve_points(
    State(app): State<Arc<App>>,
    Path(name): Path<String>,
    body: Bytes,
) -> ApiResult {
    let t0 = Instant::now();
    let c = collection(&app, &name)?;
    let body = body_json(&body)?;
    let ids = ids_field(body.get("ids").unwrap_or(&Value::Null))?;
    let sel = payload_sel(&body, true)?;
    let with_vector = bool_field(&body, "with_vector", false)?;
    let recs = blocking(move || Ok(c.get(&ids, with_vector)?)).await?;
    let out: Vec<Value> = recs
        .into_iter()
        .flatten()
        .map(|r| record_json(&r.id, apply_sel(&sel, r.payload), r.vector))
        .collect();
    ok(Value::Array(out), t0)
}

async fn count_points(
    State(app): State<Arc<App>>,
    Path(name): Path<String>,
    body: Bytes,
) -> ApiResult {
    let t0 = Instant::now();
    let c = collection(&app, &name)?;
    let body = body_json(&body)?;
    let f = filter_field(&body, "filter")?;
    let n = blocking(move || Ok(c.count(f.as_ref()))).await?;
    ok(json!({"count": n}), t0)
}

fn selector(body: &Value) -> Result<(Option<Vec<ExtId>>, Option<Filter>), ApiError> {
    let ids = opt(body, "points").map(ids_field).transpose()?;
    let filter = filter_field(body, "filter")?;
    if ids.is_none() && filter.is_none() {
        return Err(ApiError::bad("expected \"points\" (ids) or \"filter\""));
    }
    Ok((ids, filter))
}

async fn delete_points(
    State(app): State<Arc<App>>,
    Path(name): Path<String>,
    body: Bytes,
) -> ApiResult {
    let t0 = Instant::now();
    let c = collection(&app, &name)?;
    let body = body_json(&body)?;
    let (ids, filter) = selector(&body)?;
    let seq = blocking(move || {
        c.delete(ids.as_deref(), filter.as_ref())?;
        Ok(c.last_seq())
    })
    .await?;
    ok(update_result(seq), t0)
}

async fn scroll_points(
    State(app): State<Arc<App>>,
    Path(name): Path<String>,
    body: Bytes,
) -> ApiResult {
    let t0 = Instant::now();
    let c = collection(&app, &name)?;
    let body = body_json(&body)?;
    if opt(&body, "order_by").is_some() {
        return Err(ApiError::bad(
            "order_by is not supported (points come in id order)",
        ));
    }
    let filter = filter_field(&body, "filter")?;
    let offset = opt(&body, "offset").map(ExtId::from_json).transpose()?;
    let limit = usize_field(&body, "limit", 10, limits::MAX_K)?;
    let sel = payload_sel(&body, true)?;
    let with_vector = bool_field(&body, "with_vector", false)?;
    let (page, next) =
        blocking(move || Ok(c.scroll(filter.as_ref(), offset.as_ref(), limit, with_vector)?))
            .await?;
    let points: Vec<Value> = page
        .into_iter()
        .map(|r| record_json(&r.id, apply_sel(&sel, r.payload), r.vector))
        .collect();
    ok(
        json!({"points": points, "next_page_offset": next.map(|n| n.to_json())}),
        t0,
    )
}

async fn set_payload(
    State(app): State<Arc<App>>,
    Path(name): Path<String>,
    body: Bytes,
) -> ApiResult {
    let t0 = Instant::now();
    let c = collection(&app, &name)?;
    let body = body_json(&body)?;
    if opt(&body, "key").is_some() {
        return Err(ApiError::bad("setting a nested key is not supported"));
    }
    let payload = opt(&body, "payload")
        .cloned()
        .ok_or_else(|| ApiError::bad("payload is required"))?;
    let (ids, filter) = selector(&body)?;
    let seq = blocking(move || {
        c.set_payload(ids.as_deref(), filter.as_ref(), &payload)?;
        Ok(c.last_seq())
    })
    .await?;
    ok(update_result(seq), t0)
}

async fn create_index(
    State(app): State<Arc<App>>,
    Path(name): Path<String>,
    body: Bytes,
) -> ApiResult {
    let t0 = Instant::now();
    let c = collection(&app, &name)?;
    let body = body_json(&body)?;
    let field = opt(&body, "field_name")
        .and_then(|f| f.as_str())
        .ok_or_else(|| ApiError::bad("field_name is required"))?
        .to_string();
    let kind = match opt(&body, "field_schema") {
        Some(Value::String(s)) => IndexKind::parse(s)?,
        Some(Value::Object(o)) => {
            IndexKind::parse(o.get("type").and_then(|t| t.as_str()).unwrap_or(""))?
        }
        _ => {
            return Err(ApiError::bad(
                "field_schema must be \"keyword\" or \"integer\"",
            ))
        }
    };
    let seq = blocking(move || {
        c.create_index(&field, kind)?;
        Ok(c.last_seq())
    })
    .await?;
    ok(update_result(seq), t0)
}

async fn metrics(State(app): State<Arc<App>>) -> Response {
    let mut out = String::new();
    out.push_str("# HELP vectide_requests_total HTTP requests by route, method and status.\n# TYPE vectide_requests_total counter\n");
    let m = app.metrics.lock();
    for ((route, method, status), (n, _)) in &m.requests {
        out.push_str(&format!("vectide_requests_total{{route=\"{route}\",method=\"{method}\",status=\"{status}\"}} {n}\n"));
    }
    out.push_str("# HELP vectide_request_seconds Time spent answering requests.\n# TYPE vectide_request_seconds summary\n");
    for ((route, method, status), (n, s)) in &m.requests {
        out.push_str(&format!("vectide_request_seconds_sum{{route=\"{route}\",method=\"{method}\",status=\"{status}\"}} {s}\n"));
        out.push_str(&format!("vectide_request_seconds_count{{route=\"{route}\",method=\"{method}\",status=\"{status}\"}} {n}\n"));
    }
    drop(m);
    out.push_str(
        "# HELP vectide_points Live points per collection.\n# TYPE vectide_points gauge\n",
    );
    let mut sizes = String::from("# HELP vectide_index_bytes Engine memory (or region) bytes per collection.\n# TYPE vectide_index_bytes gauge\n");
    for name in app.db.list() {
        if let Ok(c) = app.db.collection(&name) {
            out.push_str(&format!(
                "vectide_points{{collection=\"{name}\"}} {}\n",
                c.len()
            ));
            sizes.push_str(&format!(
                "vectide_index_bytes{{collection=\"{name}\"}} {}\n",
                c.stats().map_or(0, |s| s.memory_bytes)
            ));
        }
    }
    out.push_str(&sizes);
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4",
        )],
        out,
    )
        .into_response()
}

// ---------------------------------------------------------------- middleware

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
    let mut out = ApiError(status, msg).into_response();
    for (name, value) in parts.headers.iter() {
        if name != axum::http::header::CONTENT_TYPE && name != axum::http::header::CONTENT_LENGTH {
            out.headers_mut().insert(name.clone(), value.clone());
        }
    }
    out
}

async fn auth_and_metrics(
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
        ApiError(
            StatusCode::UNAUTHORIZED,
            "missing or wrong api-key header".into(),
        )
        .into_response()
    } else if let Some(msg) = non_json_body(req.method(), &headers) {
        ApiError(StatusCode::UNSUPPORTED_MEDIA_TYPE, msg).into_response()
    } else {
        json_error(next.run(req).await).await
    };
    let status = resp.status().as_u16();
    let mut m = app.metrics.lock();
    let e = m.requests.entry((route, method, status)).or_default();
    e.0 += 1;
    e.1 += t0.elapsed().as_secs_f64();
    resp
}

async fn not_found() -> ApiError {
    ApiError(StatusCode::NOT_FOUND, "no such endpoint".into())
}

/// The router (for `serve` and for in-process tests).
pub fn router(db: Arc<Database>, config: ServerConfig) -> Router {
    let limit = config.body_limit;
    let app = Arc::new(App {
        db,
        config,
        metrics: Mutex::new(Metrics::default()),
    });
    Router::new()
        .route("/", get(root))
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .route("/openapi.json", get(openapi_doc))
        .route("/collections", get(list_collections))
        .route(
            "/collections/{name}",
            put(create_collection)
                .get(get_collection)
                .delete(delete_collection),
        )
        .route("/collections/{name}/exists", get(collection_exists))
        .route(
            "/collections/{name}/points",
            put(upsert_points).post(retrieve_points),
        )
        .route("/collections/{name}/points/query", post(query_points))
        .route("/collections/{name}/points/query/batch", post(query_batch))
        .route("/collections/{name}/points/search", post(search_points))
        .route("/collections/{name}/points/count", post(count_points))
        .route("/collections/{name}/points/delete", post(delete_points))
        .route("/collections/{name}/points/scroll", post(scroll_points))
        .route("/collections/{name}/points/payload", post(set_payload))
        .route("/collections/{name}/index", put(create_index))
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(
            app.clone(),
            auth_and_metrics,
        ))
        .layer(DefaultBodyLimit::max(limit))
        .with_state(app)
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
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let ctrl_c = tokio::signal::ctrl_c();
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                    .expect("SIGTERM handler");
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
    use tower::ServiceExt;

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
}
