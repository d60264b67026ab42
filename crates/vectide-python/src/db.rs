//! The embedded database for Python: `vectide._vectide.Database` and
//! `Collection`. Ids, payloads and filters cross as JSON text (the pure-Python
//! `vectide.db` module turns them into Python objects); vectors as numpy
//! arrays. Every call releases the GIL. Sizes (`k`, `limit`, `ef`, `dim`,
//! `threads` …) are checked against [`vectide_core::limits`] first:
//! `TypeError` for a non-integer, `ValueError` beyond the bound.

use crate::{as_rows, int_arg, opt_int_arg, set_knobs};
use pyo3::exceptions::{PyKeyError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::{Arc, Weak};
use vectide_core::{limits, Metric, SearchParams};
use vectide_db::{
    score, Collection, CollectionConfig, Database, DbError, Durability, ExtId, Filter, IndexKind,
    Options, PointInput,
};

pyo3::create_exception!(
    vectide,
    DatabaseLockedError,
    pyo3::exceptions::PyRuntimeError,
    "The database directory is open in another process."
);

fn to_py(e: DbError) -> PyErr {
    let msg = e.to_string();
    match e {
        DbError::Core(e) => crate::to_py(e),
        DbError::CollectionNotFound(_) => PyKeyError::new_err(msg),
        DbError::CollectionExists(_) => PyValueError::new_err(msg),
        DbError::Locked { .. } => DatabaseLockedError::new_err(msg),
        DbError::Store(_) | DbError::Closed(_) => PyRuntimeError::new_err(msg),
    }
}

fn parse_json(text: &str, what: &str) -> PyResult<Value> {
    let v = serde_json::from_str(text)
        .map_err(|e| PyValueError::new_err(format!("{what}: malformed JSON: {e}")))?;
    limits::check_json_integers(text.as_bytes())
        .map_err(|e| PyValueError::new_err(format!("{what}: {e}")))?;
    Ok(v)
}

fn ids_from(text: &str) -> PyResult<Vec<ExtId>> {
    let v = parse_json(text, "ids")?;
    let arr = v
        .as_array()
        .ok_or_else(|| PyValueError::new_err("ids must be a list"))?;
    arr.iter()
        .map(|x| ExtId::from_json(x).map_err(to_py))
        .collect()
}

fn filter_from(text: Option<&str>) -> PyResult<Option<Filter>> {
    text.map(|t| Filter::parse(&parse_json(t, "filter")?).map_err(to_py))
        .transpose()
}

/// An open database.
#[pyclass(name = "_Database", module = "vectide", frozen)]
pub struct PyDatabase {
    db: Arc<Database>,
}

#[pymethods]
impl PyDatabase {
    #[staticmethod]
    #[pyo3(signature = (path, durability="group", threads=None, checkpoint_bytes=None, checkpoint_seconds=None, one_log=true))]
    fn open(
        py: Python<'_>,
        path: PathBuf,
        durability: &str,
        threads: Option<&Bound<'_, PyAny>>,
        checkpoint_bytes: Option<&Bound<'_, PyAny>>,
        checkpoint_seconds: Option<&Bound<'_, PyAny>>,
        one_log: bool,
    ) -> PyResult<Self> {
        let threads =
            opt_int_arg(threads, "threads", 1, limits::MAX_THREADS as u64)?.map(|t| t as usize);
        let mut opts = Options {
            durability: Durability::parse(durability).map_err(to_py)?,
            threads,
            one_log,
            ..Options::default()
        };
        if let Some(b) = opt_int_arg(checkpoint_bytes, "checkpoint_bytes", 0, i64::MAX as u64)? {
            opts.checkpoint_bytes = b.max(1);
        }
        if let Some(s) = checkpoint_seconds.filter(|s| !s.is_none()) {
            let tn = s.get_type().name()?.to_string();
            let secs: f64 = if tn == "bool" || tn == "bool_" {
                None
            } else {
                s.extract().ok()
            }
            .ok_or_else(|| {
                PyTypeError::new_err(format!("checkpoint_seconds must be a number, got {tn}"))
            })?;
            if !(secs.is_finite() && secs > 0.0 && secs <= limits::MAX_CHECKPOINT_SECONDS) {
                return Err(PyValueError::new_err(format!(
                    "checkpoint_seconds must be in (0, {}], got {secs:?}",
                    limits::MAX_CHECKPOINT_SECONDS
                )));
            }
            opts.checkpoint_interval = std::time::Duration::from_secs_f64(secs);
        }
        let db = py.detach(|| Database::open(&path, opts)).map_err(to_py)?;
        Ok(PyDatabase { db })
    }

    fn create_collection(
        &self,
        py: Python<'_>,
        name: &str,
        dim: &Bound<'_, PyAny>,
        metric: &str,
        engine: &str,
        params_json: &str,
    ) -> PyResult<PyCollection> {
        let dim = int_arg(dim, "dim", 1, limits::MAX_DIM as u64)?;
        let metric = Metric::parse(metric).map_err(crate::to_py)?;
        let params =
            vectide_db::params_from_json(&parse_json(params_json, "params")?).map_err(to_py)?;
        let config = CollectionConfig {
            dim: dim as usize,
            metric,
            engine: engine.to_string(),
            params,
        };
        let c = py
            .detach(|| self.db.create_collection(name, config))
            .map_err(to_py)?;
        Ok(PyCollection::new(&self.db, &c))
    }

    fn collection(&self, name: &str) -> PyResult<PyCollection> {
        let c = self.db.collection(name).map_err(to_py)?;
        Ok(PyCollection::new(&self.db, &c))
    }

    fn list_collections(&self) -> Vec<String> {
        self.db.list()
    }

    fn delete_collection(&self, py: Python<'_>, name: &str) -> PyResult<bool> {
        py.detach(|| self.db.delete_collection(name)).map_err(to_py)
    }

    /// Checkpoints and closes every collection and releases the lock.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.db.close()).map_err(to_py)
    }

    /// Checkpoints every collection.
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.db.flush()).map_err(to_py)
    }

    #[getter]
    fn path(&self) -> String {
        self.db.dir().display().to_string()
    }
}

/// One collection.
#[pyclass(name = "_Collection", module = "vectide", frozen)]
pub struct PyCollection {
    /// Keeps the database open while a collection handle is alive (a
    /// handle may outlive the Python `Database` object).
    _db: Arc<Database>,
    /// Weak, so that `Database.close()` (or deleting the collection)
    /// really closes the collection's files.
    c: Weak<Collection>,
    name: String,
}

impl PyCollection {
    fn new(db: &Arc<Database>, c: &Arc<Collection>) -> Self {
        PyCollection {
            _db: db.clone(),
            c: Arc::downgrade(c),
            name: c.name().to_string(),
        }
    }

    fn col(&self) -> PyResult<Arc<Collection>> {
        self.c
            .upgrade()
            .filter(|c| !c.is_closed())
            .ok_or_else(|| to_py(DbError::Closed(format!("collection {:?}", self.name))))
    }
}

#[pymethods]
impl PyCollection {
    /// Upserts `len(ids)` points; returns the operation's sequence number.
    #[pyo3(signature = (ids_json, vectors, payloads_json=None))]
    fn upsert(
        &self,
        py: Python<'_>,
        ids_json: &str,
        vectors: &Bound<'_, PyAny>,
        payloads_json: Option<&str>,
    ) -> PyResult<u64> {
        let c = self.col()?;
        let ids = ids_from(ids_json)?;
        let dim = c.config().dim;
        let rows = as_rows(vectors, dim, "vectors")?;
        let flat = rows.as_slice()?;
        if flat.len() != ids.len() * dim {
            return Err(PyValueError::new_err(format!(
                "got {} ids but {} vectors",
                ids.len(),
                flat.len() / dim
            )));
        }
        let payloads: Vec<Value> = match payloads_json {
            None => vec![Value::Null; ids.len()],
            Some(t) => match parse_json(t, "payloads")? {
                Value::Array(a) if a.len() == ids.len() => a,
                Value::Array(a) => {
                    return Err(PyValueError::new_err(format!(
                        "got {} ids but {} payloads",
                        ids.len(),
                        a.len()
                    )))
                }
                _ => return Err(PyValueError::new_err("payloads must be a list")),
            },
        };
        let points: Vec<PointInput> = ids
            .into_iter()
            .zip(payloads)
            .enumerate()
            .map(|(i, (id, payload))| PointInput {
                id,
                vector: flat[i * dim..(i + 1) * dim].to_vec(),
                payload,
            })
            .collect();
        py.detach(|| c.upsert(&points)).map_err(to_py)
    }

    /// Searches each query row; returns JSON: a list (per query) of hits
    /// `{"id", "score", "distance", "payload"?, "vector"?}`. `ef` sets the
    /// engine's primary knob (ignored by an engine without one, as Qdrant's
    /// `hnsw_ef` is); `exact` scans every live point; other keyword
    /// arguments are the engine's native knobs.
    #[pyo3(signature = (queries, k=None, filter_json=None, ef=None, with_payload=true, with_vector=false, exact=false, **knobs))]
    #[allow(clippy::too_many_arguments)]
    fn search(
        &self,
        py: Python<'_>,
        queries: &Bound<'_, PyAny>,
        k: Option<&Bound<'_, PyAny>>,
        filter_json: Option<&str>,
        ef: Option<&Bound<'_, PyAny>>,
        with_payload: bool,
        with_vector: bool,
        exact: bool,
        knobs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<String> {
        let c = self.col()?;
        let k = opt_int_arg(k, "k", 1, limits::MAX_K as u64)?.unwrap_or(10) as i64;
        let desc = c.engine().descriptor();
        let mut params = SearchParams {
            exact,
            ..SearchParams::default()
        };
        if let (Some(e), Some(knob)) = (
            opt_int_arg(ef, "ef", 1, limits::MAX_EF as u64)?,
            desc.primary_knob,
        ) {
            params
                .set(knob, (e as usize).min(knob.max()))
                .map_err(crate::to_py)?;
        }
        set_knobs(desc, knobs, &mut params)?;
        let filter = filter_from(filter_json)?;
        let dim = c.config().dim;
        let rows = as_rows(queries, dim, "queries")?;
        let flat = rows.as_slice()?;
        limits::check_batch_results(flat.len() / dim, k as usize)
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        let metric = c.config().metric;
        let out: Result<Vec<Value>, DbError> = py.detach(|| {
            flat.chunks_exact(dim)
                .map(|q| {
                    let hits = c.search(q, k as usize, &params, filter.as_ref(), with_payload, with_vector)?;
                    Ok(Value::Array(
                        hits.into_iter()
                            .map(|h| {
                                let mut o = json!({"id": h.id.to_json(), "score": score(metric, h.distance), "distance": h.distance});
                                if let Some(p) = h.payload {
                                    o["payload"] = p;
                                }
                                if let Some(v) = h.vector {
                                    o["vector"] = json!(v);
                                }
                                o
                            })
                            .collect(),
                    ))
                })
                .collect()
        });
        Ok(Value::Array(out.map_err(to_py)?).to_string())
    }

    /// Points by id (JSON list, `null` for unknown ids).
    #[pyo3(signature = (ids_json, with_vector=true))]
    fn get(&self, py: Python<'_>, ids_json: &str, with_vector: bool) -> PyResult<String> {
        let c = self.col()?;
        let ids = ids_from(ids_json)?;
        let recs = py.detach(|| c.get(&ids, with_vector)).map_err(to_py)?;
        let v: Vec<Value> = recs
            .into_iter()
            .map(|r| match r {
                None => Value::Null,
                Some(r) => {
                    let mut o = json!({"id": r.id.to_json(), "payload": r.payload});
                    if let Some(v) = r.vector {
                        o["vector"] = json!(v);
                    }
                    o
                }
            })
            .collect();
        Ok(Value::Array(v).to_string())
    }

    #[pyo3(signature = (ids_json=None, filter_json=None))]
    fn delete(
        &self,
        py: Python<'_>,
        ids_json: Option<&str>,
        filter_json: Option<&str>,
    ) -> PyResult<usize> {
        let c = self.col()?;
        let ids = ids_json.map(ids_from).transpose()?;
        let filter = filter_from(filter_json)?;
        if ids.is_none() && filter.is_none() {
            return Err(PyValueError::new_err("delete needs ids or a filter"));
        }
        py.detach(|| c.delete(ids.as_deref(), filter.as_ref()))
            .map_err(to_py)
    }

    #[pyo3(signature = (filter_json=None))]
    fn count(&self, py: Python<'_>, filter_json: Option<&str>) -> PyResult<usize> {
        let c = self.col()?;
        let filter = filter_from(filter_json)?;
        Ok(py.detach(|| c.count(filter.as_ref())))
    }

    /// A page ordered by id: JSON `{"points": [...], "next": id|null}`.
    #[pyo3(signature = (filter_json=None, offset_json=None, limit=None, with_vector=false))]
    fn scroll(
        &self,
        py: Python<'_>,
        filter_json: Option<&str>,
        offset_json: Option<&str>,
        limit: Option<&Bound<'_, PyAny>>,
        with_vector: bool,
    ) -> PyResult<String> {
        let c = self.col()?;
        let limit = opt_int_arg(limit, "limit", 0, limits::MAX_K as u64)?.unwrap_or(10) as usize;
        let filter = filter_from(filter_json)?;
        let offset = offset_json
            .map(|t| parse_json(t, "offset").and_then(|v| ExtId::from_json(&v).map_err(to_py)))
            .transpose()?;
        let (page, next) = py
            .detach(|| c.scroll(filter.as_ref(), offset.as_ref(), limit, with_vector))
            .map_err(to_py)?;
        let points: Vec<Value> = page
            .into_iter()
            .map(|r| {
                let mut o = json!({"id": r.id.to_json(), "payload": r.payload});
                if let Some(v) = r.vector {
                    o["vector"] = json!(v);
                }
                o
            })
            .collect();
        Ok(json!({"points": points, "next": next.map(|n| n.to_json())}).to_string())
    }

    #[pyo3(signature = (payload_json, ids_json=None, filter_json=None))]
    fn set_payload(
        &self,
        py: Python<'_>,
        payload_json: &str,
        ids_json: Option<&str>,
        filter_json: Option<&str>,
    ) -> PyResult<usize> {
        let c = self.col()?;
        let payload = parse_json(payload_json, "payload")?;
        let ids = ids_json.map(ids_from).transpose()?;
        let filter = filter_from(filter_json)?;
        py.detach(|| c.set_payload(ids.as_deref(), filter.as_ref(), &payload))
            .map_err(to_py)
    }

    fn create_index(&self, py: Python<'_>, field: &str, kind: &str) -> PyResult<()> {
        let c = self.col()?;
        let kind = IndexKind::parse(kind).map_err(to_py)?;
        py.detach(|| c.create_index(field, kind)).map_err(to_py)
    }

    /// Checkpoints the collection now.
    fn checkpoint(&self, py: Python<'_>) -> PyResult<()> {
        let c = self.col()?;
        py.detach(|| c.checkpoint()).map_err(to_py)
    }

    /// JSON description: name, dim, metric, engine, params, points, indexes.
    fn info(&self) -> PyResult<String> {
        let c = self.col()?;
        let cfg = c.config();
        let params: serde_json::Map<String, Value> = cfg
            .params
            .iter()
            .map(|(k, v)| {
                (
                    k.clone(),
                    match v {
                        vectide_engines::ParamValue::Int(i) => json!(i),
                        vectide_engines::ParamValue::Float(f) => json!(f),
                        vectide_engines::ParamValue::Bool(b) => json!(b),
                        vectide_engines::ParamValue::Str(s) => json!(s),
                    },
                )
            })
            .collect();
        let indexes: serde_json::Map<String, Value> = c
            .indexes()
            .into_iter()
            .map(|(f, k)| (f, json!(k.name())))
            .collect();
        Ok(json!({
            "name": c.name(), "dim": cfg.dim, "metric": cfg.metric.name(), "engine": cfg.engine,
            "params": params, "points": c.len(), "indexes": indexes,
            "durability": c.durability().name(), "last_seq": c.last_seq(),
            "opened_seconds": c.opened_in.as_secs_f64(),
            "replayed": c.counters.replayed.load(std::sync::atomic::Ordering::Relaxed),
        })
        .to_string())
    }

    fn __len__(&self) -> PyResult<usize> {
        Ok(self.col()?.len())
    }

    #[getter]
    fn name(&self) -> String {
        self.name.clone()
    }
}

/// Registers the database classes.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyDatabase>()?;
    m.add_class::<PyCollection>()?;
    m.add(
        "DatabaseLockedError",
        m.py().get_type::<DatabaseLockedError>(),
    )?;
    Ok(())
}
