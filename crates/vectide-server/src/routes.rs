//! The handlers and the router. A handler reads its body into a type of
//! [`crate::types`], checks what depends on the collection (dimension,
//! engine knobs), runs the database call on the blocking pool and answers
//! in Qdrant's envelope `{"result", "status", "time"}`.

use crate::error::ApiError;
use crate::types::{
    self, parse_body, CreateCollection, CreateIndex, Distance, GroupsResponse, PointGroup,
    QueryBatch, QueryResponse, Record, Retrieve, ScoredPoint, Scroll, ScrollResponse,
    SearchGroupsRequest, SearchRequest, Selector, UpdateResult, Upsert, VectorsConfig, WithPayload,
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
use vectide_core::limits;
use vectide_db::edit::PayloadEdit;
use vectide_db::path::KeyPath;
use vectide_db::query::{
    parse_point_vectors, parse_vector, GroupsRequest, QueryRequest, WithVector,
};
use vectide_db::spaces::{
    Modifier, NamedVectors, PointData, SparseSpaceConfig, VectorSpaceConfig, VectorValue,
};
use vectide_db::{Collection, CollectionConfig, Database, ExtId, Filter, IndexKind};
use vectide_engines::ParamValue;

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

/// A vector as the API shows it.
fn vector_json(v: VectorValue) -> Value {
    match v {
        VectorValue::Dense(d) => json!(d),
        VectorValue::Sparse(s) => json!({"indices": s.indices(), "values": s.values()}),
    }
}

/// A point's vectors as the API shows them (as Qdrant does): the list
/// itself when the unnamed vector is all there is to show, `{"NAME":
/// vector}` otherwise.
fn vectors_json(c: &Collection, named: NamedVectors) -> Value {
    if c.is_single() || (named.len() == 1 && named[0].0.is_empty()) {
        return named
            .into_iter()
            .next()
            .map_or(Value::Null, |(_, v)| vector_json(v));
    }
    Value::Object(
        named
            .into_iter()
            .map(|(k, v)| (k, vector_json(v)))
            .collect(),
    )
}

/// A record's vectors as asked for.
fn record_vectors(c: &Collection, r: &mut vectide_db::Record, sel: &WithVector) -> Option<Value> {
    if !sel.any() {
        return None;
    }
    let named = match r.vectors.take() {
        Some(n) => n,
        None => r
            .vector
            .take()
            .map(|v| vec![(String::new(), VectorValue::Dense(v))])
            .unwrap_or_default(),
    };
    Some(vectors_json(c, sel.select(named)))
}

fn record(
    c: &Collection,
    mut r: vectide_db::Record,
    sel: &WithPayload,
    vsel: &WithVector,
) -> Record {
    let vector = record_vectors(c, &mut r, vsel);
    Record {
        id: r.id.to_json(),
        payload: sel.apply(r.payload),
        vector,
    }
}

fn with_vector(v: Option<&Value>) -> Result<WithVector, ApiError> {
    Ok(WithVector::parse(v.unwrap_or(&Value::Null), "with_vector")?)
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

/// The collection's configuration: its dense spaces (`vectors`: one
/// unnamed `{"size", "distance"}` or named ones), each with its engine (the
/// default unless `vectide.vectors.NAME.engine` or `vectide.engine` names
/// one) and parameters (`vectide.vectors.NAME.params` or `vectide.params`,
/// and Qdrant's `hnsw_config`, the space's own first, for engines that take
/// `m` / `ef_construction`: others ignore it, since qdrant-client sends it
/// whatever the engine); and its sparse spaces (`sparse_vectors`).
fn create_config(body: CreateCollection) -> Result<CollectionConfig, ApiError> {
    let vectide = body.vectide;
    let (default_engine, default_params) = match &vectide {
        Some(v) => (
            v.engine.clone(),
            v.params
                .as_ref()
                .map(vectide_db::params_from_json)
                .transpose()?,
        ),
        None => (None, None),
    };
    let mut own: std::collections::BTreeMap<String, types::VectideSpace> =
        vectide.and_then(|v| v.vectors).unwrap_or_default();
    let spaces: Vec<(String, Value)> = match body.vectors {
        None | Some(Value::Null) if body.sparse_vectors.is_some() => Vec::new(),
        None | Some(Value::Null) => {
            return Err(ApiError::bad(
                "vectors: {\"size\", \"distance\"} (or named vectors, or sparse_vectors) is required",
            ))
        }
        Some(Value::Object(o)) if o.contains_key("size") || o.contains_key("distance") => {
            vec![(String::new(), Value::Object(o))]
        }
        Some(Value::Object(o)) => o.into_iter().collect(),
        Some(other) => {
            return Err(ApiError::bad(format!(
                "vectors must be {{\"size\", \"distance\"}} or {{\"NAME\": {{\"size\", \"distance\"}}}}, got {other}"
            )))
        }
    };
    let mut dense = Vec::with_capacity(spaces.len());
    for (name, v) in spaces {
        let at = if name.is_empty() {
            "vectors".to_string()
        } else {
            format!("vectors.{name}")
        };
        let cfg = vectors_config(v, &at)?;
        if cfg.multivector_config.is_some() {
            return Err(ApiError::bad(format!(
                "{at}: multivectors are not supported"
            )));
        }
        let mine = own.remove(&name);
        let engine = mine
            .as_ref()
            .and_then(|m| m.engine.clone())
            .or_else(|| default_engine.clone())
            .unwrap_or_else(|| vectide_engines::DEFAULT_ENGINE.to_string());
        let mut params = match mine.as_ref().and_then(|m| m.params.as_ref()) {
            Some(p) => vectide_db::params_from_json(p)?,
            None => default_params.clone().unwrap_or_default(),
        };
        let desc = vectide_engines::descriptor(&engine)?;
        for h in [cfg.hnsw_config.as_ref(), body.hnsw_config.as_ref()]
            .into_iter()
            .flatten()
        {
            for (value, ours) in [(h.m, "m"), (h.ef_construct, "ef_construction")] {
                if let (Some(v), Some(_)) = (value, desc.param(ours)) {
                    params.entry(ours.into()).or_insert(ParamValue::Int(v));
                }
            }
        }
        dense.push(VectorSpaceConfig {
            name,
            dim: cfg.size.0,
            metric: cfg.distance.metric(),
            engine,
            params,
        });
    }
    if let Some(name) = own.keys().next() {
        return Err(ApiError::bad(format!(
            "vectide.vectors.{name}: the collection has no dense vector named {name:?}"
        )));
    }
    let mut sparse = Vec::new();
    for (name, p) in body.sparse_vectors.unwrap_or_default() {
        let modifier = match p.as_ref().and_then(|p| p.modifier.as_deref()) {
            None => Modifier::None,
            Some(m) => Modifier::parse(m).ok_or_else(|| {
                ApiError::bad(format!(
                    "sparse_vectors.{name}.modifier must be \"idf\" or \"none\", got {m:?}"
                ))
            })?,
        };
        sparse.push(SparseSpaceConfig { name, modifier });
    }
    Ok(CollectionConfig::with_spaces(dense, sparse))
}

/// One dense space's `{"size", "distance", ...}`, each field's error
/// naming it (`vectors.NAME.size`).
fn vectors_config(v: Value, at: &str) -> Result<VectorsConfig, ApiError> {
    let Value::Object(mut o) = v else {
        return Err(ApiError::bad(format!(
            "{at} must be {{\"size\", \"distance\"}}, got {v}"
        )));
    };
    fn field<T: serde::de::DeserializeOwned>(
        o: &mut Map<String, Value>,
        name: &str,
        at: &str,
    ) -> Result<Option<T>, ApiError> {
        match o.remove(name) {
            None | Some(Value::Null) => Ok(None),
            Some(x) => serde_json::from_value(x)
                .map(Some)
                .map_err(|e| ApiError::bad(format!("{at}.{name}: {e}"))),
        }
    }
    let size = field(&mut o, "size", at)?
        .ok_or_else(|| ApiError::bad(format!("{at}.size is required")))?;
    let distance = field(&mut o, "distance", at)?
        .ok_or_else(|| ApiError::bad(format!("{at}.distance is required")))?;
    Ok(VectorsConfig {
        size,
        distance,
        hnsw_config: field(&mut o, "hnsw_config", at)?,
        multivector_config: field(&mut o, "multivector_config", at)?,
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
    let dense = cfg.dense_spaces();
    let space = |d: &VectorSpaceConfig| json!({"size": d.dim, "distance": Distance::of(d.metric)});
    let vectors = match dense.as_slice() {
        [only] if only.name.is_empty() => space(only),
        all => Value::Object(all.iter().map(|d| (d.name.clone(), space(d))).collect()),
    };
    let sparse: Map<String, Value> = cfg
        .sparse_vectors
        .iter()
        .map(|s| {
            let modifier = match s.modifier {
                Modifier::Idf => json!("idf"),
                Modifier::None => Value::Null,
            };
            (s.name.clone(), json!({"modifier": modifier}))
        })
        .collect();
    let engines: Map<String, Value> = dense
        .iter()
        .map(|d| (d.name.clone(), json!(d.engine)))
        .collect();
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
                    "vectors": vectors,
                    "sparse_vectors": if sparse.is_empty() { Value::Null } else { Value::Object(sparse) },
                    "shard_number": 1, "replication_factor": 1, "write_consistency_factor": 1,
                    "on_disk_payload": true,
                },
                "hnsw_config": {"m": p("m", 16), "ef_construct": p("ef_construction", 200), "full_scan_threshold": vectide_db::collection::EXACT_MAX},
                "optimizer_config": {"deleted_threshold": 0.2, "vacuum_min_vector_number": 1000, "default_segment_number": 1, "flush_interval_sec": 60},
                "wal_config": {"wal_capacity_mb": 64, "wal_segments_ahead": 0},
            },
            "payload_schema": schema,
            "vectide": {
                "engine": cfg.engine, "engines": engines, "durability": c.durability().name(), "last_seq": c.last_seq(),
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

fn point_vectors(v: &Value, at: &str) -> Result<NamedVectors, ApiError> {
    Ok(parse_point_vectors(v, at)?)
}

async fn upsert_points(call: OnCollection<Upsert>) -> ApiResult {
    let OnCollection { c, req, t0 } = call;
    let mut points = Vec::new();
    if let Some(list) = req.points {
        for (i, p) in list.into_iter().enumerate() {
            points.push(PointData {
                id: p.id.0,
                vectors: point_vectors(&p.vector, &format!("points[{i}].vector"))?,
                payload: p.payload.unwrap_or(Value::Null),
            });
        }
    } else if let Some(batch) = req.batch {
        let ids = batch.ids.0;
        let payloads = match batch.payloads {
            None => vec![Value::Null; ids.len()],
            Some(p) if p.len() == ids.len() => p,
            Some(_) => {
                return Err(ApiError::bad(
                    "batch.payloads must be a list as long as ids",
                ))
            }
        };
        // Per space, one vector per id (a list of dense vectors is the
        // unnamed space's).
        let columns: Vec<(String, Vec<Value>)> = match batch.vectors {
            Value::Array(rows) => vec![(String::new(), rows)],
            Value::Object(o) => o
                .into_iter()
                .map(|(name, rows)| match rows {
                    Value::Array(r) => Ok((name, r)),
                    _ => Err(ApiError::bad(format!(
                        "batch.vectors.{name} must be a list with a vector per id"
                    ))),
                })
                .collect::<Result<_, _>>()?,
            _ => {
                return Err(ApiError::bad(
                    "batch.vectors must be a list of vectors or {\"NAME\": [vectors]}",
                ))
            }
        };
        for (name, rows) in &columns {
            if rows.len() != ids.len() {
                return Err(ApiError::bad(format!(
                    "batch: {} ids but {} vectors{}",
                    ids.len(),
                    rows.len(),
                    if name.is_empty() {
                        String::new()
                    } else {
                        format!(" named {name:?}")
                    }
                )));
            }
        }
        for (i, (id, payload)) in ids.into_iter().zip(payloads).enumerate() {
            let mut vectors = Vec::with_capacity(columns.len());
            for (name, rows) in &columns {
                let at = if name.is_empty() {
                    format!("batch.vectors[{i}]")
                } else {
                    format!("batch.vectors.{name}[{i}]")
                };
                vectors.push((name.clone(), parse_vector(&rows[i], &at)?));
            }
            points.push(PointData {
                id,
                vectors,
                payload,
            });
        }
    } else {
        return Err(ApiError::bad("expected \"points\" or \"batch\""));
    }
    update(t0, c, move |c| c.upsert_points(points)).await
}

/// A query body checked and parsed (`with_payload`'s selection is read
/// here; the rest by the database's parser).
fn query_of(v: &Value) -> Result<(QueryRequest, WithPayload), ApiError> {
    let q = QueryRequest::parse(v)?;
    Ok((q, payload_selection(v)?))
}

/// A query body's `with_payload` selection (all unless given).
fn payload_selection(v: &Value) -> Result<WithPayload, ApiError> {
    match v.get("with_payload") {
        None | Some(Value::Null) => Ok(WithPayload::All),
        Some(w) => serde_json::from_value::<WithPayload>(w.clone())
            .map_err(|e| ApiError::bad(format!("with_payload: {e}"))),
    }
}

/// A point of a query's answer as the API shows it.
fn scored(c: &Collection, p: vectide_db::query::ScoredPoint, sel: &WithPayload) -> ScoredPoint {
    ScoredPoint {
        id: p.id.to_json(),
        version: 0,
        score: p.score,
        payload: p.payload.and_then(|x| sel.apply(x)),
        vector: p.vectors.map(|v| vectors_json(c, v)),
    }
}

fn run_query(
    c: &Collection,
    q: &QueryRequest,
    sel: &WithPayload,
) -> Result<Vec<ScoredPoint>, ApiError> {
    Ok(c.query(q)?.into_iter().map(|p| scored(c, p, sel)).collect())
}

fn run_groups(
    c: &Collection,
    g: &GroupsRequest,
    sel: &WithPayload,
) -> Result<GroupsResponse, ApiError> {
    let groups = c
        .query_groups(g)?
        .into_iter()
        .map(|x| PointGroup {
            id: x.id,
            hits: x.hits.into_iter().map(|p| scored(c, p, sel)).collect(),
        })
        .collect();
    Ok(GroupsResponse { groups })
}

/// `POST .../points/query/groups`: a query whose answer is put in groups
/// by a payload key (`vectide_db::query::GroupsRequest`).
async fn query_groups(call: OnCollection<Value>) -> ApiResult {
    let OnCollection { c, req, t0 } = call;
    let g = GroupsRequest::parse(&req)?;
    let sel = payload_selection(&req)?;
    let out = blocking(move || run_groups(&c, &g, &sel)).await?;
    ok(out, t0)
}

/// `POST .../points/search/groups`: Qdrant's legacy grouped search, run
/// as a grouped query (no payload unless asked, as the legacy search).
async fn search_groups(call: OnCollection<SearchGroupsRequest>) -> ApiResult {
    let OnCollection { c, req, t0 } = call;
    if req.with_lookup.as_ref().is_some_and(|v| !v.is_null()) {
        return Err(ApiError::bad("with_lookup is not supported"));
    }
    let (vector, using) = search_vector(&req.vector);
    let body = json!({
        "query": {"nearest": vector},
        "using": using,
        "filter": req.filter,
        "params": req.params,
        "with_vector": req.with_vector,
        "score_threshold": req.score_threshold,
        "group_by": req.group_by,
        "group_size": req.group_size.0,
        "limit": req.limit.0,
    });
    let g = GroupsRequest::parse(&body)
        .map_err(|e| ApiError::bad(e.to_string().replace("query.nearest", "vector")))?;
    let sel = WithPayload::or(req.with_payload, false);
    let g = GroupsRequest {
        query: QueryRequest {
            with_payload: sel.wants_payload(),
            ..g.query
        },
        ..g
    };
    let out = blocking(move || run_groups(&c, &g, &sel)).await?;
    ok(out, t0)
}

/// A legacy search's `vector`: a list (the unnamed space) or `{"name",
/// "vector"}`; the vector and the space's name (null for the unnamed).
fn search_vector(v: &Value) -> (Value, Value) {
    match v {
        Value::Object(o) if o.contains_key("name") && o.contains_key("vector") => {
            (o["vector"].clone(), o["name"].clone())
        }
        v => (v.clone(), Value::Null),
    }
}

async fn query_points(call: OnCollection<Value>) -> ApiResult {
    let OnCollection { c, req, t0 } = call;
    let (q, sel) = query_of(&req)?;
    let points = blocking(move || run_query(&c, &q, &sel)).await?;
    ok(QueryResponse { points }, t0)
}

async fn query_batch(call: OnCollection<QueryBatch>) -> ApiResult {
    let OnCollection { c, req, t0 } = call;
    // Every request is checked before any runs; together they may ask for
    // at most MAX_BATCH_RESULTS results.
    let queries = req
        .searches
        .iter()
        .enumerate()
        .map(|(i, s)| {
            query_of(s).map_err(|e| ApiError::new(e.0, format!("searches[{i}]: {}", e.1)))
        })
        .collect::<Result<Vec<_>, ApiError>>()?;
    let cells: usize = queries.iter().map(|(q, _)| q.offset + q.limit).sum();
    if cells > limits::MAX_BATCH_RESULTS {
        return Err(ApiError::bad(format!(
            "the batch asks for {cells} results (sum of offset + limit); at most {} \
             per request: split it",
            limits::MAX_BATCH_RESULTS
        )));
    }
    let out = blocking(move || {
        queries
            .iter()
            .map(|(q, sel)| {
                Ok(QueryResponse {
                    points: run_query(&c, q, sel)?,
                })
            })
            .collect::<Result<Vec<QueryResponse>, ApiError>>()
    })
    .await?;
    ok(out, t0)
}

/// Qdrant's legacy search, run as a query: `vector` a list (the unnamed
/// space), `{"name", "vector"}` (dense or sparse); no payload unless asked.
async fn search_points(call: OnCollection<SearchRequest>) -> ApiResult {
    let OnCollection { c, req, t0 } = call;
    let (vector, using) = search_vector(&req.vector);
    let body = json!({
        "query": {"nearest": vector},
        "using": using,
        "filter": req.filter,
        "limit": req.limit.map_or(10, |l| l.0),
        "offset": req.offset.map_or(0, |o| o.0),
        "params": req.params,
        "with_vector": req.with_vector,
        "score_threshold": req.score_threshold,
    });
    let q = QueryRequest::parse(&body)
        .map_err(|e| ApiError::bad(e.to_string().replace("query.nearest", "vector")))?;
    let sel = WithPayload::or(req.with_payload, false);
    let q = QueryRequest {
        with_payload: sel.wants_payload(),
        ..q
    };
    let points = blocking(move || run_query(&c, &q, &sel)).await?;
    ok(points, t0)
}

async fn retrieve_points(call: OnCollection<Retrieve>) -> ApiResult {
    let OnCollection { c, req, t0 } = call;
    let sel = WithPayload::or(req.with_payload, true);
    let vsel = with_vector(req.with_vector.as_ref())?;
    let ids = req.ids.0;
    let out = blocking(move || {
        let recs = c.get(&ids, vsel.any())?;
        Ok(recs
            .into_iter()
            .flatten()
            .map(|r| record(&c, r, &sel, &vsel))
            .collect::<Vec<Record>>())
    })
    .await?;
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
    let vsel = with_vector(req.with_vector.as_ref())?;
    let (points, next) = blocking(move || {
        let (page, next) = c.scroll(filter.as_ref(), offset.as_ref(), limit, vsel.any())?;
        Ok((
            page.into_iter()
                .map(|r| record(&c, r, &sel, &vsel))
                .collect::<Vec<Record>>(),
            next,
        ))
    })
    .await?;
    ok(
        ScrollResponse {
            points,
            next_page_offset: next.map(|n| n.to_json()),
        },
        t0,
    )
}

fn payload_object(req: &Selector) -> Result<Map<String, Value>, ApiError> {
    match &req.payload {
        Some(Value::Object(o)) => Ok(o.clone()),
        None | Some(Value::Null) => Err(ApiError::bad("payload is required")),
        Some(other) => Err(ApiError::bad(format!(
            "payload must be a JSON object, got {other}"
        ))),
    }
}

/// Applies a payload edit to the selected points.
async fn edit(
    call: OnCollection<Selector>,
    make: fn(&Selector) -> Result<PayloadEdit, ApiError>,
) -> ApiResult {
    let OnCollection { c, req, t0 } = call;
    let (ids, filter) = selected(&req)?;
    let edit = make(&req)?;
    update(t0, c, move |c| {
        c.edit_payload(ids.as_deref(), filter.as_ref(), &edit)?;
        Ok(c.last_seq())
    })
    .await
}

/// `POST .../points/payload`: merges keys (at `key` when given).
async fn set_payload(call: OnCollection<Selector>) -> ApiResult {
    edit(call, |req| {
        let m = payload_object(req)?;
        Ok(match &req.key {
            None => PayloadEdit::Merge(m),
            Some(k) => PayloadEdit::SetAt(
                KeyPath::parse(k).map_err(|e| ApiError::bad(format!("key: {e}")))?,
                m,
            ),
        })
    })
    .await
}

/// `PUT .../points/payload`: replaces payloads.
async fn overwrite_payload(call: OnCollection<Selector>) -> ApiResult {
    edit(call, |req| Ok(PayloadEdit::Overwrite(payload_object(req)?))).await
}

/// `POST .../points/payload/delete`: removes keys.
async fn delete_payload(call: OnCollection<Selector>) -> ApiResult {
    edit(call, |req| {
        let keys = req
            .keys
            .as_ref()
            .ok_or_else(|| ApiError::bad("keys (a list of key paths) is required"))?;
        keys.iter()
            .enumerate()
            .map(|(i, k)| KeyPath::parse(k).map_err(|e| ApiError::bad(format!("keys[{i}]: {e}"))))
            .collect::<Result<Vec<_>, _>>()
            .map(PayloadEdit::Delete)
    })
    .await
}

/// `POST .../points/payload/clear`: empties payloads (the body is the
/// selector itself: `{"points"}` or `{"filter"}`).
async fn clear_payload(call: OnCollection<Selector>) -> ApiResult {
    edit(call, |_| Ok(PayloadEdit::Clear)).await
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
        .route(
            "/collections/{name}/points/query/groups",
            post(query_groups),
        )
        .route("/collections/{name}/points/search", post(search_points))
        .route(
            "/collections/{name}/points/search/groups",
            post(search_groups),
        )
        .route("/collections/{name}/points/count", post(count_points))
        .route("/collections/{name}/points/delete", post(delete_points))
        .route("/collections/{name}/points/scroll", post(scroll_points))
        .route(
            "/collections/{name}/points/payload",
            post(set_payload).put(overwrite_payload),
        )
        .route(
            "/collections/{name}/points/payload/delete",
            post(delete_payload),
        )
        .route(
            "/collections/{name}/points/payload/clear",
            post(clear_payload),
        )
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
