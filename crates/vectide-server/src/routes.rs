//! The handlers and the router. A handler reads its body into a type of
//! [`crate::types`], checks what depends on the collection (dimension,
//! engine knobs), runs the database call on the blocking pool and answers
//! in Qdrant's envelope `{"result", "status", "time"}`.

use crate::error::ApiError;
use crate::types::{
    self, parse_body, CreateCollection, CreateIndex, Distance, QueryBatch, QueryInput,
    QueryRequest, QueryResponse, Record, Retrieve, ScoredPoint, Scroll, ScrollResponse,
    SearchParamsIn, Selector, UpdateResult, Upsert, WithPayload,
};
use crate::{metrics, middleware, openapi, App, ServerConfig, QDRANT_API_VERSION};
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, FromRequest, FromRequestParts, Path, Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::Router;
use parking_lot::Mutex;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Map, Value};
use std::sync::Arc;
use std::time::Instant;
use vectide_core::{limits, Metric, SearchParams};
use vectide_db::{
    score, Collection, CollectionConfig, Database, ExtId, Filter, IndexKind, PointInput,
};
use vectide_engines::{ParamValue, Params};

type ApiResult = Result<Response, ApiError>;

fn ok(result: impl Serialize, t0: Instant) -> ApiResult {
    Ok(axum::Json(json!({
        "result": serde_json::to_value(result).map_err(|e| ApiError::internal(e.to_string()))?,
        "status": "ok",
        "time": t0.elapsed().as_secs_f64(),
    }))
    .into_response())
}

/// Runs blocking database work off the async threads.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::internal(format!("worker failed: {e}")))?
}

fn collection(app: &App, name: &str) -> Result<Arc<Collection>, ApiError> {
    app.db.collection(name).map_err(ApiError::from)
}

/// A request on one collection: the collection (an unknown one is 404
/// before the body is read), the body read into `T` and the start time.
struct OnCollection<T> {
    c: Arc<Collection>,
    req: T,
    t0: Instant,
}

impl<T: DeserializeOwned> FromRequest<Arc<App>> for OnCollection<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, app: &Arc<App>) -> Result<Self, ApiError> {
        let t0 = Instant::now();
        let (mut parts, body) = req.into_parts();
        let Path(name) = Path::<String>::from_request_parts(&mut parts, app)
            .await
            .map_err(|e| ApiError::new(e.status(), e.body_text()))?;
        let c = collection(app, &name)?;
        let bytes = Bytes::from_request(Request::from_parts(parts, body), app)
            .await
            .map_err(|e| ApiError::new(e.status(), e.body_text()))?;
        Ok(OnCollection {
            c,
            req: parse_body(&bytes)?,
            t0,
        })
    }
}

/// Runs a write on the blocking pool and answers with its sequence number.
async fn update(
    t0: Instant,
    c: Arc<Collection>,
    write: impl FnOnce(&Collection) -> Result<u64, vectide_db::DbError> + Send + 'static,
) -> ApiResult {
    let seq = blocking(move || Ok(write(&c)?)).await?;
    ok(UpdateResult::completed(seq), t0)
}

fn filter(f: Option<&Value>) -> Result<Option<Filter>, ApiError> {
    f.filter(|v| !v.is_null())
        .map(|v| Filter::parse(v).map_err(ApiError::from))
        .transpose()
}

fn record(r: vectide_db::Record, sel: &WithPayload) -> Record {
    Record {
        id: r.id.to_json(),
        payload: sel.apply(r.payload),
        vector: r.vector,
    }
}

// ---------------------------------------------------------------- service

async fn root() -> Response {
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

// ---------------------------------------------------------------- collections

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

/// The collection's configuration: dimension and metric, the engine (the
/// default unless `vectide.engine` names one) and its parameters, from
/// `vectide.params` and from Qdrant's `hnsw_config` for engines that take
/// `m` / `ef_construction` (others ignore it: qdrant-client sends it
/// whatever the engine, and an exact engine has no graph to configure).
fn create_config(body: CreateCollection) -> Result<CollectionConfig, ApiError> {
    if body.sparse_vectors.is_some() {
        return Err(ApiError::bad("sparse vectors are not supported"));
    }
    let vectors = body
        .vectors
        .ok_or_else(|| ApiError::bad("vectors: {\"size\", \"distance\"} is required"))?;
    let Some(dim) = vectors.size else {
        return Err(ApiError::bad(
            "named vectors are not supported: vectors must be {\"size\", \"distance\"}",
        ));
    };
    let distance = vectors
        .distance
        .ok_or_else(|| ApiError::bad("vectors.distance is required"))?;
    if vectors.multivector_config.is_some() {
        return Err(ApiError::bad("multivectors are not supported"));
    }
    let mut params = Params::new();
    let mut engine = vectide_engines::DEFAULT_ENGINE.to_string();
    if let Some(v) = body.vectide {
        if let Some(e) = v.engine {
            engine = e;
        }
        if let Some(p) = &v.params {
            params = vectide_db::params_from_json(p)?;
        }
    }
    let desc = vectide_engines::descriptor(&engine)?;
    if let Some(h) = body.hnsw_config {
        for (value, ours) in [(h.m, "m"), (h.ef_construct, "ef_construction")] {
            if let (Some(v), Some(_)) = (value, desc.param(ours)) {
                params.entry(ours.into()).or_insert(ParamValue::Int(v));
            }
        }
    }
    Ok(CollectionConfig {
        dim: dim.0,
        metric: distance.metric(),
        engine,
        params,
        ..Default::default()
    })
}

async fn create_collection(
    State(app): State<Arc<App>>,
    Path(name): Path<String>,
    body: Bytes,
) -> ApiResult {
    let t0 = Instant::now();
    let config = create_config(parse_body(&body)?)?;
    blocking(move || {
        app.db
            .create_collection(&name, config)
            .map(|_| ())
            .map_err(ApiError::from)
    })
    .await?;
    ok(true, t0)
}

async fn delete_collection(State(app): State<Arc<App>>, Path(name): Path<String>) -> ApiResult {
    let t0 = Instant::now();
    let existed = blocking(move || app.db.delete_collection(&name).map_err(ApiError::from)).await?;
    ok(existed, t0)
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
    let (maintenance, engine_stats) = c.stats_json();
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
                    "vectors": {"size": cfg.dim, "distance": Distance::of(cfg.metric)},
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
                "poisoned": c.poisoned(),
                "maintenance": maintenance, "engine_stats": engine_stats,
            },
        }),
        t0,
    )
}

async fn create_index(call: OnCollection<CreateIndex>) -> ApiResult {
    let OnCollection { c, req, t0 } = call;
    let kind = IndexKind::parse(&req.field_schema.0)?;
    update(t0, c, move |c| {
        c.create_index(&req.field_name, kind)?;
        Ok(c.last_seq())
    })
    .await
}

// ---------------------------------------------------------------- vectide's own

/// `POST /collections/{name}/vectide/maintain` (not in Qdrant's API): runs
/// the engine's pending maintenance now (a delete consolidation, a merge, a
/// rebuild) and answers once none is in flight. Writes and searches go on
/// meanwhile; the server's own schedule runs the same work when it is due.
async fn maintain(State(app): State<Arc<App>>, Path(name): Path<String>) -> ApiResult {
    run_now(&app, &name, Collection::maintain).await
}

/// `POST /collections/{name}/vectide/checkpoint` (not in Qdrant's API):
/// a checkpoint now (the engine's state made durable, the commit log cut
/// behind it), as the server's schedule takes one when enough is logged.
async fn checkpoint(State(app): State<Arc<App>>, Path(name): Path<String>) -> ApiResult {
    run_now(&app, &name, Collection::checkpoint).await
}

/// Vectide's own on-request work on one collection (`maintain`,
/// `checkpoint`): run on the blocking pool, answered `true` once done.
async fn run_now(
    app: &App,
    name: &str,
    work: fn(&Collection) -> vectide_db::Result<()>,
) -> ApiResult {
    let t0 = Instant::now();
    let c = collection(app, name)?;
    blocking(move || Ok(work(&c)?)).await?;
    ok(true, t0)
}

// ---------------------------------------------------------------- points

async fn upsert_points(call: OnCollection<Upsert>) -> ApiResult {
    let OnCollection { c, req, t0 } = call;
    let dim = c.config().dim;
    let mut points = Vec::new();
    if let Some(list) = req.points {
        for (i, p) in list.into_iter().enumerate() {
            points.push(PointInput {
                id: p.id.0,
                vector: p.vector.of_dim(dim, &format!("points[{i}]"))?,
                payload: p.payload.unwrap_or(Value::Null),
            });
        }
    } else if let Some(batch) = req.batch {
        let ids = batch.ids.0;
        if batch.vectors.len() != ids.len() {
            return Err(ApiError::bad(format!(
                "batch: {} ids but {} vectors",
                ids.len(),
                batch.vectors.len()
            )));
        }
        let payloads = match batch.payloads {
            None => vec![Value::Null; ids.len()],
            Some(p) if p.len() == ids.len() => p,
            Some(_) => {
                return Err(ApiError::bad(
                    "batch.payloads must be a list as long as ids",
                ))
            }
        };
        for (i, ((id, v), payload)) in ids.into_iter().zip(batch.vectors).zip(payloads).enumerate()
        {
            points.push(PointInput {
                id,
                vector: v.of_dim(dim, &format!("batch.vectors[{i}]"))?,
                payload,
            });
        }
    } else {
        return Err(ApiError::bad("expected \"points\" or \"batch\""));
    }
    update(t0, c, move |c| c.upsert_owned(points)).await
}

/// One query, checked against the collection.
struct Query {
    vector: Option<Vec<f32>>,
    filter: Option<Filter>,
    limit: usize,
    offset: usize,
    params: SearchParams,
    sel: WithPayload,
    with_vector: bool,
    threshold: Option<f32>,
}

/// Checks a query request against the collection (`search_api`: the legacy
/// `/points/search`, whose vector is `vector` and which returns no payload
/// by default). A query by point id reads the point's vector.
fn query_of(c: &Collection, q: QueryRequest, search_api: bool) -> Result<Query, ApiError> {
    let dim = c.config().dim;
    for (unsupported, given) in [
        ("using", q.using.is_some()),
        ("prefetch", q.prefetch.is_some()),
        ("lookup_from", q.lookup_from.is_some()),
    ] {
        if given {
            return Err(ApiError::bad(format!("{unsupported} is not supported")));
        }
    }
    let vector = if search_api {
        let v = q
            .vector
            .ok_or_else(|| ApiError::bad("vector: a vector (a list of numbers) is required"))?;
        Some(v.of_dim(dim, "vector")?)
    } else {
        match q.query {
            None => None,
            Some(QueryInput::Vector(v, what)) => Some(v.of_dim(dim, what)?),
            Some(QueryInput::Point(id)) => {
                let got = c.get(std::slice::from_ref(&id), true)?;
                let v = got
                    .into_iter()
                    .next()
                    .flatten()
                    .and_then(|r| r.vector)
                    .ok_or_else(|| ApiError::not_found(format!("point {id} not found")))?;
                Some(v)
            }
        }
    };
    let params = search_params(c, q.params.unwrap_or_default())?;
    let threshold = q.score_threshold.map(|t| t as f32);
    let limit = q.limit.map_or(10, |l| l.0);
    let offset = q.offset.map_or(0, |o| o.0);
    limits::check_page(offset, limit)?;
    Ok(Query {
        vector,
        filter: filter(q.filter.as_ref())?,
        limit,
        offset,
        params,
        sel: WithPayload::or(q.with_payload, !search_api),
        with_vector: q.with_vector.unwrap_or(false),
        threshold,
    })
}

/// The search knobs of a query's `params`, for the collection's engine.
/// Qdrant's `hnsw_ef` sets the engine's primary knob (ignored by an engine
/// without one); `exact: true` asks for an exact scan; `vectide` holds the
/// engine's native knobs (`{"nprobe": 32}`), checked against the ones it
/// takes.
fn search_params(c: &Collection, p: SearchParamsIn) -> Result<SearchParams, ApiError> {
    let mut out = SearchParams::default();
    let desc = c.main_engine()?.descriptor();
    if let (Some(ef), Some(knob)) = (p.hnsw_ef, desc.primary_knob) {
        out.set(knob, ef.0.min(knob.max()))?;
    }
    out.exact = p.exact.unwrap_or(false);
    for (name, v) in p.vectide.unwrap_or_default() {
        let knob = desc.knob(&name)?;
        let max = knob.max();
        let value = usize::try_from(v)
            .ok()
            .filter(|x| (1..=max).contains(x))
            .ok_or_else(|| {
                ApiError::bad(format!(
                    "params.vectide.{name} must be an integer in 1..={max}, got {v}"
                ))
            })?;
        out.set(knob, value)?;
    }
    Ok(out)
}

fn run_query(c: &Collection, q: &Query) -> Result<Vec<ScoredPoint>, ApiError> {
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
            .map(|r| ScoredPoint {
                id: r.id.to_json(),
                version: 0,
                score: 0.0,
                payload: q.sel.apply(r.payload),
                vector: r.vector,
            })
            .collect());
    };
    let hits = c.search(
        vector,
        q.offset + q.limit,
        &q.params,
        q.filter.as_ref(),
        q.sel.wants_payload(),
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
            keep.then(|| ScoredPoint {
                id: h.id.to_json(),
                version: 0,
                score: s,
                payload: h.payload.and_then(|p| q.sel.apply(p)),
                vector: h.vector,
            })
        })
        .collect())
}

async fn query_points(call: OnCollection<QueryRequest>) -> ApiResult {
    let OnCollection { c, req, t0 } = call;
    let points = blocking(move || run_query(&c, &query_of(&c, req, false)?)).await?;
    ok(QueryResponse { points }, t0)
}

async fn query_batch(call: OnCollection<QueryBatch>) -> ApiResult {
    let OnCollection { c, req, t0 } = call;
    let out = blocking(move || {
        // Every request is checked before any runs; together they may ask
        // for at most MAX_BATCH_RESULTS results.
        let queries = req
            .searches
            .into_iter()
            .map(|s| query_of(&c, s, false))
            .collect::<Result<Vec<Query>, ApiError>>()?;
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
            .map(|q| {
                Ok(QueryResponse {
                    points: run_query(&c, q)?,
                })
            })
            .collect::<Result<Vec<QueryResponse>, ApiError>>()
    })
    .await?;
    ok(out, t0)
}

async fn search_points(call: OnCollection<QueryRequest>) -> ApiResult {
    let OnCollection { c, req, t0 } = call;
    let points = blocking(move || run_query(&c, &query_of(&c, req, true)?)).await?;
    ok(points, t0)
}

async fn retrieve_points(call: OnCollection<Retrieve>) -> ApiResult {
    let OnCollection { c, req, t0 } = call;
    let sel = WithPayload::or(req.with_payload, true);
    let with_vector = req.with_vector.unwrap_or(false);
    let ids = req.ids.0;
    let recs = blocking(move || Ok(c.get(&ids, with_vector)?)).await?;
    let out: Vec<Record> = recs
        .into_iter()
        .flatten()
        .map(|r| record(r, &sel))
        .collect();
    ok(out, t0)
}

async fn count_points(call: OnCollection<types::Count>) -> ApiResult {
    let OnCollection { c, req, t0 } = call;
    let f = filter(req.filter.as_ref())?;
    let n = blocking(move || Ok(c.count(f.as_ref()))).await?;
    ok(json!({"count": n}), t0)
}

/// The points a delete or a payload update applies to.
fn selected(s: &Selector) -> Result<(Option<Vec<ExtId>>, Option<Filter>), ApiError> {
    let ids = s.points.as_ref().map(|p| p.0.clone());
    let filter = filter(s.filter.as_ref())?;
    if ids.is_none() && filter.is_none() {
        return Err(ApiError::bad("expected \"points\" (ids) or \"filter\""));
    }
    Ok((ids, filter))
}

async fn delete_points(call: OnCollection<Selector>) -> ApiResult {
    let OnCollection { c, req, t0 } = call;
    let (ids, filter) = selected(&req)?;
    update(t0, c, move |c| {
        c.delete(ids.as_deref(), filter.as_ref())?;
        Ok(c.last_seq())
    })
    .await
}

async fn scroll_points(call: OnCollection<Scroll>) -> ApiResult {
    let OnCollection { c, req, t0 } = call;
    if req.order_by.is_some() {
        return Err(ApiError::bad(
            "order_by is not supported (points come in id order)",
        ));
    }
    let filter = filter(req.filter.as_ref())?;
    let offset = req.offset.map(|o| o.0);
    let limit = req.limit.map_or(10, |l| l.0);
    let sel = WithPayload::or(req.with_payload, true);
    let with_vector = req.with_vector.unwrap_or(false);
    let (page, next) =
        blocking(move || Ok(c.scroll(filter.as_ref(), offset.as_ref(), limit, with_vector)?))
            .await?;
    ok(
        ScrollResponse {
            points: page.into_iter().map(|r| record(r, &sel)).collect(),
            next_page_offset: next.map(|n| n.to_json()),
        },
        t0,
    )
}

async fn set_payload(call: OnCollection<Selector>) -> ApiResult {
    let OnCollection { c, req, t0 } = call;
    if req.key.is_some() {
        return Err(ApiError::bad("setting a nested key is not supported"));
    }
    let (ids, filter) = selected(&req)?;
    let payload = req
        .payload
        .filter(|p| !p.is_null())
        .ok_or_else(|| ApiError::bad("payload is required"))?;
    update(t0, c, move |c| {
        c.set_payload(ids.as_deref(), filter.as_ref(), &payload)?;
        Ok(c.last_seq())
    })
    .await
}

/// The router (for `serve` and for in-process tests).
pub fn router(db: Arc<Database>, config: ServerConfig) -> Router {
    let limit = config.body_limit;
    let app = Arc::new(App {
        db,
        config,
        metrics: Mutex::new(metrics::Metrics::default()),
    });
    Router::new()
        .route("/", get(root))
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics::metrics))
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
        .route("/collections/{name}/vectide/maintain", post(maintain))
        .route("/collections/{name}/vectide/checkpoint", post(checkpoint))
        .fallback(middleware::not_found)
        .layer(axum::middleware::from_fn_with_state(
            app.clone(),
            middleware::auth_and_metrics,
        ))
        .layer(DefaultBodyLimit::max(limit))
        .with_state(app)
}
