//! The embedded database for Python: `vectide._vectide.Database` and
//! `Collection`. Ids, payloads and filters cross as Python objects, checked
//! and converted once here (`convert.rs`; no JSON text on the way); vectors
//! as numpy arrays; results come back as Python objects. Every call
//! releases the GIL while the database works. Sizes (`k`, `limit`, `ef`, `dim`,
//! `threads` …) are checked against [`vectide_core::limits`] first:
//! `TypeError` for a non-integer, `ValueError` beyond the bound.

use crate::convert::{ext_id, ext_ids, id_to_py, to_value};
use crate::{as_rows, int_arg, opt_int_arg, set_knobs};
use pyo3::exceptions::{PyKeyError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString, PyTuple};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::{Arc, Weak};
use vectide_core::{limits, Metric, SearchParams};
use vectide_db::edit::PayloadEdit;
use vectide_db::path::KeyPath;
use vectide_db::query::{parse_point_vectors, GroupsRequest, QueryRequest, ScoredPoint};
use vectide_db::spaces::{
    Modifier, NamedVectors, PointData, SparseSpaceConfig, VectorSpaceConfig, VectorValue,
};
use vectide_db::{
    score, Collection, CollectionConfig, Database, DbError, Durability, Filter, IndexKind, Options,
    PointInput,
};

pyo3::create_exception!(
    vectide,
    DatabaseLockedError,
    pyo3::exceptions::PyRuntimeError,
    "The database directory is open in another process."
);

pub(crate) fn to_py(e: DbError) -> PyErr {
    let msg = e.to_string();
    match e {
        DbError::Core(e) => crate::to_py(e),
        DbError::CollectionNotFound(_) | DbError::PointNotFound(_) => PyKeyError::new_err(msg),
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

/// A filter: a dict in Qdrant's shape (or its JSON text), or `None`.
fn filter_from(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Filter>> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else {
        return Ok(None);
    };
    let v = if let Ok(s) = obj.cast::<PyString>() {
        parse_json(&s.to_cow()?, "filter")?
    } else if obj.is_instance_of::<PyDict>() {
        to_value(obj, "filter")?
    } else {
        return Err(PyTypeError::new_err(format!(
            "filter must be a dict (or JSON text), got {}",
            crate::type_name(obj)
        )));
    };
    Filter::parse(&v).map(Some).map_err(to_py)
}

/// A stored point as `(id, payload, vector or None)`: the vector a float32
/// array in a collection of the single form, else `{"NAME": array |
/// {"indices", "values"}}`.
fn record_to_py<'py>(py: Python<'py>, r: &vectide_db::Record) -> PyResult<Bound<'py, PyAny>> {
    let vector = match (&r.vectors, &r.vector) {
        (Some(named), _) => {
            let d = PyDict::new(py);
            for (name, v) in named {
                match v {
                    VectorValue::Dense(x) => {
                        d.set_item(name, numpy::PyArray1::from_slice(py, x))?
                    }
                    VectorValue::Sparse(x) => d.set_item(
                        name,
                        crate::convert::to_py(
                            py,
                            &json!({"indices": x.indices(), "values": x.values()}),
                        )?,
                    )?,
                }
            }
            d.into_any()
        }
        (None, Some(v)) => numpy::PyArray1::from_slice(py, v).into_any(),
        (None, None) => py.None().into_bound(py),
    };
    Ok(PyTuple::new(
        py,
        [
            id_to_py(py, &r.id)?,
            crate::convert::to_py(py, &r.payload)?,
            vector,
        ],
    )?
    .into_any())
}

/// A dense space as Python names it: `(name, dim, metric, engine, params)`.
type DenseSpaceArg<'py> = (
    String,
    Bound<'py, PyAny>,
    String,
    String,
    Bound<'py, PyDict>,
);

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
        params: &Bound<'_, PyDict>,
    ) -> PyResult<PyCollection> {
        let dim = int_arg(dim, "dim", 1, limits::MAX_DIM as u64)?;
        let metric = Metric::parse(metric).map_err(crate::to_py)?;
        let mut values = serde_json::Map::new();
        for (k, v) in params.iter() {
            let k: String = k.extract()?;
            let v = to_value(&v, &format!("parameter {k}"))?;
            values.insert(k, v);
        }
        let params = vectide_db::params_from_json(&Value::Object(values)).map_err(to_py)?;
        let config = CollectionConfig {
            dim: dim as usize,
            metric,
            engine: engine.to_string(),
            params,
            ..Default::default()
        };
        let c = py
            .detach(|| self.db.create_collection(name, config))
            .map_err(to_py)?;
        Ok(PyCollection::new(&self.db, &c))
    }

    /// A collection of named dense spaces `(name, dim, metric, engine,
    /// params)` and sparse spaces `(name, modifier)`.
    fn create_collection_spaces(
        &self,
        py: Python<'_>,
        name: &str,
        dense: Vec<DenseSpaceArg<'_>>,
        sparse: Vec<(String, Option<String>)>,
    ) -> PyResult<PyCollection> {
        let mut spaces = Vec::with_capacity(dense.len());
        for (vname, dim, metric, engine, params) in dense {
            let dim = int_arg(
                &dim,
                &format!("vectors[{vname:?}].dim"),
                1,
                limits::MAX_DIM as u64,
            )?;
            let metric = Metric::parse(&metric).map_err(crate::to_py)?;
            let mut values = serde_json::Map::new();
            for (k, v) in params.iter() {
                let k: String = k.extract()?;
                let v = to_value(&v, &format!("parameter {k}"))?;
                values.insert(k, v);
            }
            spaces.push(VectorSpaceConfig {
                name: vname,
                dim: dim as usize,
                metric,
                engine,
                params: vectide_db::params_from_json(&Value::Object(values)).map_err(to_py)?,
            });
        }
        let sparse = sparse
            .into_iter()
            .map(|(vname, m)| {
                let modifier = match m.as_deref() {
                    None => Modifier::None,
                    Some(x) => Modifier::parse(x).ok_or_else(|| {
                        PyValueError::new_err(format!(
                            "sparse_vectors[{vname:?}].modifier must be \"idf\" or \"none\", got {x:?}"
                        ))
                    })?,
                };
                Ok(SparseSpaceConfig {
                    name: vname,
                    modifier,
                })
            })
            .collect::<PyResult<Vec<_>>>()?;
        let config = CollectionConfig::with_spaces(spaces, sparse);
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
    #[pyo3(signature = (ids, vectors, payloads=None))]
    fn upsert(
        &self,
        py: Python<'_>,
        ids: &Bound<'_, PyAny>,
        vectors: &Bound<'_, PyAny>,
        payloads: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<u64> {
        let c = self.col()?;
        let ids = ext_ids(ids)?;
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
        let payloads: Vec<Value> = match payloads.filter(|p| !p.is_none()) {
            None => vec![Value::Null; ids.len()],
            Some(p) => {
                if p.is_instance_of::<PyDict>() || p.is_instance_of::<PyString>() {
                    return Err(PyTypeError::new_err(format!(
                        "payloads must be a sequence (one payload per id), got {}",
                        crate::type_name(p)
                    )));
                }
                let items: Vec<Value> = p
                    .try_iter()
                    .map_err(|_| {
                        PyTypeError::new_err(format!(
                            "payloads must be a sequence (one payload per id), got {}",
                            crate::type_name(p)
                        ))
                    })?
                    .map(|x| to_value(&x?, "payloads"))
                    .collect::<PyResult<_>>()?;
                if items.len() != ids.len() {
                    return Err(PyValueError::new_err(format!(
                        "got {} ids but {} payloads",
                        ids.len(),
                        items.len()
                    )));
                }
                items
            }
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
        py.detach(|| c.upsert_owned(points)).map_err(to_py)
    }

    /// Searches each query row; returns a list (per query) of hits
    /// `(id, score, distance, payload or None, vector or None)`. `ef` sets
    /// the engine's primary knob (ignored by an engine without one, as
    /// Qdrant's `hnsw_ef` is); `exact` scans every live point; other keyword
    /// arguments are the engine's native knobs.
    #[pyo3(signature = (queries, k=None, filter=None, ef=None, with_payload=true, with_vector=false, exact=false, **knobs))]
    #[allow(clippy::too_many_arguments)]
    fn search<'py>(
        &self,
        py: Python<'py>,
        queries: &Bound<'py, PyAny>,
        k: Option<&Bound<'py, PyAny>>,
        filter: Option<&Bound<'py, PyAny>>,
        ef: Option<&Bound<'py, PyAny>>,
        with_payload: bool,
        with_vector: bool,
        exact: bool,
        knobs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyList>> {
        let c = self.col()?;
        let k = opt_int_arg(k, "k", 1, limits::MAX_K as u64)?.unwrap_or(10) as i64;
        let desc = c.main_engine().map_err(to_py)?.descriptor();
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
        let filter = filter_from(filter)?;
        let dim = c.config().dim;
        let rows = as_rows(queries, dim, "queries")?;
        let flat = rows.as_slice()?;
        limits::check_batch_results(flat.len() / dim, k as usize)
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        let metric = c.config().metric;
        let found: Vec<Vec<vectide_db::Hit>> = py
            .detach(|| {
                flat.chunks_exact(dim)
                    .map(|q| {
                        c.search(
                            q,
                            k as usize,
                            &params,
                            filter.as_ref(),
                            with_payload,
                            with_vector,
                        )
                    })
                    .collect::<Result<_, DbError>>()
            })
            .map_err(to_py)?;
        let out = PyList::empty(py);
        for hits in &found {
            let row = PyList::empty(py);
            for h in hits {
                let payload = match &h.payload {
                    Some(p) => crate::convert::to_py(py, p)?,
                    None => py.None().into_bound(py),
                };
                let vector = match &h.vector {
                    Some(v) => PyList::new(py, v)?.into_any(),
                    None => py.None().into_bound(py),
                };
                let score = score(metric, h.distance);
                row.append(PyTuple::new(
                    py,
                    [
                        id_to_py(py, &h.id)?,
                        score.into_pyobject(py)?.into_any(),
                        h.distance.into_pyobject(py)?.into_any(),
                        payload,
                        vector,
                    ],
                )?)?;
            }
            out.append(row)?;
        }
        Ok(out)
    }

    /// Points by id: a list of `(id, payload, vector or None)`, `None` for
    /// unknown ids.
    #[pyo3(signature = (ids, with_vector=true))]
    fn get<'py>(
        &self,
        py: Python<'py>,
        ids: &Bound<'py, PyAny>,
        with_vector: bool,
    ) -> PyResult<Bound<'py, PyList>> {
        let c = self.col()?;
        let ids = ext_ids(ids)?;
        let recs = py.detach(|| c.get(&ids, with_vector)).map_err(to_py)?;
        let out = PyList::empty(py);
        for r in &recs {
            match r {
                None => out.append(py.None())?,
                Some(r) => out.append(record_to_py(py, r)?)?,
            }
        }
        Ok(out)
    }

    #[pyo3(signature = (ids=None, filter=None))]
    fn delete(
        &self,
        py: Python<'_>,
        ids: Option<&Bound<'_, PyAny>>,
        filter: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<usize> {
        let c = self.col()?;
        let ids = ids.filter(|i| !i.is_none()).map(ext_ids).transpose()?;
        let filter = filter_from(filter)?;
        if ids.is_none() && filter.is_none() {
            return Err(PyValueError::new_err("delete needs ids or a filter"));
        }
        py.detach(|| c.delete(ids.as_deref(), filter.as_ref()))
            .map_err(to_py)
    }

    #[pyo3(signature = (filter=None))]
    fn count(&self, py: Python<'_>, filter: Option<&Bound<'_, PyAny>>) -> PyResult<usize> {
        let c = self.col()?;
        let filter = filter_from(filter)?;
        Ok(py.detach(|| c.count(filter.as_ref())))
    }

    /// A page ordered by id: `([(id, payload, vector or None)], next id or None)`.
    #[pyo3(signature = (filter=None, offset=None, limit=None, with_vector=false))]
    fn scroll<'py>(
        &self,
        py: Python<'py>,
        filter: Option<&Bound<'py, PyAny>>,
        offset: Option<&Bound<'py, PyAny>>,
        limit: Option<&Bound<'py, PyAny>>,
        with_vector: bool,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let c = self.col()?;
        let limit = opt_int_arg(limit, "limit", 0, limits::MAX_K as u64)?.unwrap_or(10) as usize;
        let filter = filter_from(filter)?;
        let offset = offset
            .filter(|o| !o.is_none())
            .map(|o| ext_id(o, None))
            .transpose()?;
        let (page, next) = py
            .detach(|| c.scroll(filter.as_ref(), offset.as_ref(), limit, with_vector))
            .map_err(to_py)?;
        let points = PyList::empty(py);
        for r in &page {
            points.append(record_to_py(py, r)?)?;
        }
        let next = match &next {
            Some(n) => id_to_py(py, n)?,
            None => py.None().into_bound(py),
        };
        PyTuple::new(py, [points.into_any(), next])
    }

    /// Upserts points given as dicts `{"id", "vector", "payload"}`, the
    /// vector a list (the unnamed space) or `{"NAME": list | {"indices",
    /// "values"}}`; returns the operation's sequence number.
    fn upsert_points(&self, py: Python<'_>, points: &Bound<'_, PyList>) -> PyResult<u64> {
        let c = self.col()?;
        let mut out = Vec::with_capacity(points.len());
        for (i, p) in points.iter().enumerate() {
            let d = p.cast::<PyDict>().map_err(|_| {
                PyTypeError::new_err(format!(
                    "points[{i}] must be a dict {{\"id\", \"vector\", \"payload\"}}, got {}",
                    crate::type_name(&p)
                ))
            })?;
            let id = d
                .get_item("id")?
                .ok_or_else(|| PyValueError::new_err(format!("points[{i}] has no \"id\"")))?;
            let vector = d
                .get_item("vector")?
                .ok_or_else(|| PyValueError::new_err(format!("points[{i}] has no \"vector\"")))?;
            let payload = match d.get_item("payload")? {
                Some(x) if !x.is_none() => to_value(&x, &format!("points[{i}].payload"))?,
                _ => Value::Null,
            };
            let at = format!("points[{i}].vector");
            let vectors = parse_point_vectors(&to_value(&vector, &at)?, &at).map_err(to_py)?;
            out.push(PointData {
                id: ext_id(&id, Some(i))?,
                vectors,
                payload,
            });
        }
        py.detach(|| c.upsert_points(out)).map_err(to_py)
    }

    /// Runs a query in the Query API's shape (a dict: `prefetch`, `query`,
    /// `using`, `filter`, `limit`, ...); returns `(id, score, payload or
    /// None, vectors or None)` per point, the vectors a list in a
    /// collection of the single form, else `{"NAME": vector}`.
    fn query<'py>(
        &self,
        py: Python<'py>,
        body: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyList>> {
        let c = self.col()?;
        let q = QueryRequest::parse(&to_value(body, "query")?).map_err(to_py)?;
        let found = py.detach(|| c.query(&q)).map_err(to_py)?;
        let out = PyList::empty(py);
        for p in found {
            out.append(scored_to_py(py, &c, p)?)?;
        }
        Ok(out)
    }

    /// Runs a grouped query (a dict: the query's keys without `offset`,
    /// and `group_by`, `group_size`); returns `(group id, hits)` per group,
    /// each hit as `query` returns it.
    fn query_groups<'py>(
        &self,
        py: Python<'py>,
        body: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyList>> {
        let c = self.col()?;
        let g = GroupsRequest::parse(&to_value(body, "query")?).map_err(to_py)?;
        let found = py.detach(|| c.query_groups(&g)).map_err(to_py)?;
        let out = PyList::empty(py);
        for group in found {
            let hits = PyList::empty(py);
            for p in group.hits {
                hits.append(scored_to_py(py, &c, p)?)?;
            }
            out.append(PyTuple::new(
                py,
                [crate::convert::to_py(py, &group.id)?, hits.into_any()],
            )?)?;
        }
        Ok(out)
    }

    /// A payload edit: `kind` is "set" (`arg` the payload, `key` a key path
    /// or None), "overwrite" (`arg` the payload), "delete" (`arg` the key
    /// paths) or "clear"; returns how many points were selected.
    #[pyo3(signature = (kind, arg, key=None, ids=None, filter=None))]
    fn edit_payload(
        &self,
        py: Python<'_>,
        kind: &str,
        arg: &Bound<'_, PyAny>,
        key: Option<String>,
        ids: Option<&Bound<'_, PyAny>>,
        filter: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<usize> {
        let c = self.col()?;
        let object = || -> PyResult<serde_json::Map<String, Value>> {
            match to_value(arg, "payload")? {
                Value::Object(o) => Ok(o),
                other => Err(PyTypeError::new_err(format!(
                    "payload must be a dict, got {other}"
                ))),
            }
        };
        let path = |k: &str| KeyPath::parse(k).map_err(to_py);
        let edit = match kind {
            "set" => match &key {
                None => PayloadEdit::Merge(object()?),
                Some(k) => PayloadEdit::SetAt(path(k)?, object()?),
            },
            "overwrite" => PayloadEdit::Overwrite(object()?),
            "delete" => {
                let keys: Vec<String> = arg.extract().map_err(|_| {
                    PyTypeError::new_err("keys must be a list of key paths (strings)")
                })?;
                PayloadEdit::Delete(keys.iter().map(|k| path(k)).collect::<PyResult<_>>()?)
            }
            "clear" => PayloadEdit::Clear,
            other => {
                return Err(PyValueError::new_err(format!(
                    "unknown payload edit {other:?}"
                )))
            }
        };
        let ids = ids.filter(|i| !i.is_none()).map(ext_ids).transpose()?;
        let filter = filter_from(filter)?;
        if ids.is_none() && filter.is_none() {
            return Err(PyValueError::new_err(
                "a payload edit needs ids or a filter",
            ));
        }
        py.detach(|| c.edit_payload(ids.as_deref(), filter.as_ref(), &edit))
            .map_err(to_py)
    }

    #[pyo3(signature = (payload, ids=None, filter=None))]
    fn set_payload(
        &self,
        py: Python<'_>,
        payload: &Bound<'_, PyAny>,
        ids: Option<&Bound<'_, PyAny>>,
        filter: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<usize> {
        let c = self.col()?;
        let payload = to_value(payload, "payload")?;
        let ids = ids.filter(|i| !i.is_none()).map(ext_ids).transpose()?;
        let filter = filter_from(filter)?;
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

    /// Runs the engine's pending maintenance now (a consolidation, a
    /// merge, a rebuild); writes and searches go on meanwhile.
    fn maintain(&self, py: Python<'_>) -> PyResult<()> {
        let c = self.col()?;
        py.detach(|| c.maintain()).map_err(to_py)
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
        let (maintenance, engine_stats) = c.stats_json();
        let indexes: serde_json::Map<String, Value> = c
            .indexes()
            .into_iter()
            .map(|(f, k)| (f, json!(k.name())))
            .collect();
        let vectors: serde_json::Map<String, Value> = cfg
            .dense_spaces()
            .iter()
            .map(|d| {
                (
                    d.name.clone(),
                    json!({"dim": d.dim, "metric": d.metric.name(), "engine": d.engine}),
                )
            })
            .collect();
        let sparse: serde_json::Map<String, Value> = cfg
            .sparse_vectors
            .iter()
            .map(|s| (s.name.clone(), json!({"modifier": s.modifier.name()})))
            .collect();
        Ok(json!({
            "vectors": vectors, "sparse_vectors": sparse, "single": c.is_single(),
            "name": c.name(), "dim": cfg.dim, "metric": cfg.metric.name(), "engine": cfg.engine,
            "params": params, "points": c.len(), "indexes": indexes,
            "durability": c.durability().name(), "last_seq": c.last_seq(),
            "opened_seconds": c.opened_in.as_secs_f64(),
            "replayed": c.counters.replayed.load(std::sync::atomic::Ordering::Relaxed),
            "poisoned": c.poisoned(),
            "maintenance": maintenance, "engine_stats": engine_stats,
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

/// A point of a query's answer as the Python side takes it: `(id, score,
/// payload or None, vectors or None)`.
fn scored_to_py<'py>(
    py: Python<'py>,
    c: &Collection,
    p: ScoredPoint,
) -> PyResult<Bound<'py, PyTuple>> {
    let vectors = match p.vectors {
        None => py.None().into_bound(py),
        Some(named) => crate::convert::to_py(py, &named_json(c, named))?,
    };
    let payload = match &p.payload {
        Some(v) => crate::convert::to_py(py, v)?,
        None => py.None().into_bound(py),
    };
    PyTuple::new(
        py,
        [
            id_to_py(py, &p.id)?,
            p.score.into_pyobject(py)?.into_any(),
            payload,
            vectors,
        ],
    )
}

/// A point's vectors as JSON: the list itself in a collection of the
/// single form, `{"NAME": list | {"indices", "values"}}` otherwise.
fn named_json(c: &Collection, named: NamedVectors) -> Value {
    let one = |v: VectorValue| match v {
        VectorValue::Dense(d) => json!(d),
        VectorValue::Sparse(s) => json!({"indices": s.indices(), "values": s.values()}),
    };
    if c.is_single() {
        return named
            .into_iter()
            .next()
            .map_or(Value::Null, |(_, v)| one(v));
    }
    Value::Object(named.into_iter().map(|(k, v)| (k, one(v))).collect())
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
