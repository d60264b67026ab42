//! The `vectide._vectide` extension module: [`Index`], the numpy-friendly
//! front of every engine.
//!
//! Arrays cross the boundary without copies when they are already C-ordered
//! `float32` / `uint64`; anything else (float64, Fortran order, lists) is
//! converted once by numpy. Every batch call releases the GIL and runs on the
//! engine's thread pool. Errors become Python exceptions: `TypeError` for an
//! argument of the wrong type, `ValueError` for bad input (a size beyond its
//! documented bound in [`vectide_core::limits`], exported as
//! `vectide.LIMITS`), `KeyError` for missing ids, `OSError` for I/O and
//! `vectide.CorruptIndexError` (a `ValueError`) for damaged files,
//! `vectide.PoisonedError` (a `RuntimeError`) for writes to an index or
//! collection whose logged write failed to apply.

use numpy::ndarray::Array2;

// The product's allocator (see `vectide_core::trim`).
#[cfg(not(feature = "system-allocator"))]
#[global_allocator]
static GLOBAL: vectide_core::trim::ProductAllocator = vectide_core::trim::ProductAllocator;
use numpy::{
    IntoPyArray, PyArray1, PyArray2, PyArrayMethods, PyReadonlyArray1, PyReadonlyArray2,
    PyUntypedArrayMethods,
};
use pyo3::create_exception;
use pyo3::exceptions::{
    PyConnectionError, PyFileNotFoundError, PyKeyError, PyOSError, PyTypeError, PyValueError,
};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyString};
use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use vectide_core::{limits, Error, Metric, Neighbor, SearchParams, RESERVED_ID};
mod convert;
mod db;
mod harness;

use vectide_engines::{AnyIndex, ParamValue, Params};

create_exception!(
    vectide,
    CorruptIndexError,
    PyValueError,
    "An index file failed its magic, version, bounds or checksum checks."
);

create_exception!(
    vectide,
    PoisonedError,
    pyo3::exceptions::PyRuntimeError,
    "A write already in the log failed to apply: reads go on, writes are refused until the index or database is reopened (which replays the log); retrying cannot help before that."
);

/// Maps the core error type onto Python exceptions.
fn to_py(e: Error) -> PyErr {
    let msg = e.to_string();
    match e {
        Error::InvalidInput(_) | Error::DimensionMismatch { .. } => PyValueError::new_err(msg),
        Error::NotFound(_) => PyKeyError::new_err(msg),
        Error::Corrupted(_) | Error::Version { .. } => CorruptIndexError::new_err(msg),
        Error::Io { ref source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
            PyFileNotFoundError::new_err(msg)
        }
        Error::Io { .. } => PyOSError::new_err(msg),
        Error::Poisoned(_) => PoisonedError::new_err(msg),
        // A remote part (a memory node) that did not answer: transient.
        Error::Unavailable(_) => PyConnectionError::new_err(msg),
    }
}

/// The Python type name of `obj`, for messages.
fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into())
}

/// `operator.index(obj)`: the Python int of an integer-like object.
fn py_index<'py>(obj: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    obj.py().import("operator")?.call_method1("index", (obj,))
}

/// An integer argument `name` in `lo..=hi`: a `TypeError` when `obj` is
/// not an integer (Python or numpy; bools, floats and strings are refused),
/// a `ValueError` naming the range when it lies outside (however large).
pub(crate) fn int_arg(obj: &Bound<'_, PyAny>, name: &str, lo: u64, hi: u64) -> PyResult<u64> {
    let type_err = || {
        PyTypeError::new_err(format!(
            "{name} must be an int, got {} {}",
            type_name(obj),
            obj.repr().map(|r| r.to_string()).unwrap_or_default()
        ))
    };
    if obj.is_instance_of::<PyBool>() {
        return Err(type_err());
    }
    // The common case (a Python int) costs no lookup: searches call this per query.
    let int = if obj.is_instance_of::<PyInt>() {
        obj.clone()
    } else {
        let tn = type_name(obj);
        if tn == "bool" || tn == "bool_" {
            return Err(type_err()); // numpy bools
        }
        // numpy integers and other objects with __index__.
        py_index(obj).map_err(|_| type_err())?
    };
    let range_err = |shown: String| {
        PyValueError::new_err(format!("{name} must be in {lo}..={hi}, got {shown}"))
    };
    match int.extract::<i64>() {
        Ok(v) if v >= 0 && (v as u64) >= lo && (v as u64) <= hi => Ok(v as u64),
        Ok(v) => Err(range_err(v.to_string())),
        Err(_) => {
            let mut shown = int.repr().map(|r| r.to_string()).unwrap_or_default();
            if shown.len() > 40 {
                shown.truncate(40);
                shown.push('…');
            }
            Err(range_err(shown))
        }
    }
}

/// Sets an engine's native search knobs from keyword arguments
/// (`nprobe=32`): a knob the engine does not take is a `ValueError` naming
/// the ones it does, a value outside `1..=max` one naming the bounds.
pub(crate) fn set_knobs(
    desc: &vectide_core::EngineDescriptor,
    knobs: Option<&Bound<'_, PyDict>>,
    params: &mut SearchParams,
) -> PyResult<()> {
    for (name, value) in knobs.into_iter().flat_map(|k| k.iter()) {
        let name: String = name.extract()?;
        let knob = desc.knob(&name).map_err(to_py)?;
        let v = int_arg(&value, &name, 1, knob.max() as u64)?;
        params.set(knob, v as usize).map_err(to_py)?;
    }
    Ok(())
}

/// An optional integer argument (`None` passes through).
pub(crate) fn opt_int_arg(
    obj: Option<&Bound<'_, PyAny>>,
    name: &str,
    lo: u64,
    hi: u64,
) -> PyResult<Option<u64>> {
    match obj {
        Some(o) if !o.is_none() => int_arg(o, name, lo, hi).map(Some),
        _ => Ok(None),
    }
}

/// Converts keyword arguments into engine parameters (None values are skipped).
fn params_from(kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<Params> {
    let mut out = Params::new();
    let Some(kwargs) = kwargs else {
        return Ok(out);
    };
    for (k, v) in kwargs.iter() {
        let key: String = k.extract()?;
        if v.is_none() {
            continue;
        }
        let tn = type_name(&v);
        let np = kwargs.py().import("numpy")?;
        let np_is = |t: &str| -> PyResult<bool> { v.is_instance(&np.getattr(t)?) };
        let value = if v.is_instance_of::<PyBool>() || np_is("bool_")? {
            ParamValue::Bool(v.is_truthy()?)
        } else if v.is_instance_of::<PyInt>() || np_is("integer")? {
            // Python and numpy integers.
            let int = py_index(&v)?;
            ParamValue::Int(int.extract().map_err(|_| {
                PyValueError::new_err(format!("parameter {key} is out of range: {int}"))
            })?)
        } else if v.is_instance_of::<PyFloat>() || np_is("floating")? {
            ParamValue::Float(v.extract()?)
        } else if v.is_instance_of::<PyString>() {
            ParamValue::Str(v.extract()?)
        } else {
            return Err(PyTypeError::new_err(format!(
                "parameter {key} must be an int, float, bool or str, got {tn}"
            )));
        };
        out.insert(key, value);
    }
    Ok(out)
}

/// Rows of float32 values borrowed from a C-ordered numpy array.
enum Rows<'py> {
    One(PyReadonlyArray1<'py, f32>),
    Many(PyReadonlyArray2<'py, f32>),
}

impl Rows<'_> {
    fn as_slice(&self) -> PyResult<&[f32]> {
        Ok(match self {
            Rows::One(a) => a.as_slice()?,
            Rows::Many(a) => a.as_slice()?,
        })
    }
}

/// Checks the width of a borrowed C-ordered float32 array.
fn rows_of<'py>(obj: &Bound<'py, PyAny>, dim: usize, what: &str) -> PyResult<Option<Rows<'py>>> {
    let (rows, cols) = if let Ok(a) = obj.cast::<PyArray2<f32>>() {
        if !a.is_c_contiguous() {
            return Ok(None);
        }
        (Rows::Many(a.readonly()), a.shape()[1])
    } else if let Ok(a) = obj.cast::<PyArray1<f32>>() {
        if !a.is_c_contiguous() {
            return Ok(None);
        }
        (Rows::One(a.readonly()), a.len())
    } else {
        return Ok(None);
    };
    if cols != dim {
        return Err(PyValueError::new_err(format!(
            "{what} have dimension {cols}, the index has dimension {dim}"
        )));
    }
    Ok(Some(rows))
}

/// A float32 C-ordered view of a vector or a matrix of vectors: borrowed
/// without a copy when `obj` already is one, converted by numpy otherwise.
fn as_rows<'py>(obj: &Bound<'py, PyAny>, dim: usize, what: &str) -> PyResult<Rows<'py>> {
    if let Some(rows) = rows_of(obj, dim, what)? {
        return Ok(rows);
    }
    let py = obj.py();
    let np = py.import("numpy")?;
    let kwargs = PyDict::new(py);
    kwargs.set_item("dtype", np.getattr("float32")?)?;
    let arr = np
        .call_method("ascontiguousarray", (obj,), Some(&kwargs))
        .map_err(|e| {
            PyValueError::new_err(format!(
                "{what} must be convertible to a float32 array: {e}"
            ))
        })?;
    let ndim: usize = arr.getattr("ndim")?.extract()?;
    if ndim != 1 && ndim != 2 {
        return Err(PyValueError::new_err(format!(
            "{what} must be a 1-D vector or a 2-D array, got {ndim} dimensions"
        )));
    }
    rows_of(&arr, dim, what)?
        .ok_or_else(|| PyValueError::new_err(format!("{what} could not be read as float32 rows")))
}

/// A uint64 id vector from any integer array-like. An array of another
/// dtype (float, bool, str …), or a list holding a non-integer, is a
/// `TypeError` naming the first offending position and its type; negative
/// or too large ids are a `ValueError`.
fn as_ids<'py>(obj: &Bound<'py, PyAny>) -> PyResult<PyReadonlyArray1<'py, u64>> {
    if let Ok(a) = obj.cast::<PyArray1<u64>>() {
        if a.is_c_contiguous() {
            return Ok(a.readonly());
        }
    }
    let py = obj.py();
    let np = py.import("numpy")?;
    let arr = np
        .call_method1("asarray", (obj,))
        .map_err(|e| PyTypeError::new_err(format!("ids must be a sequence of integers: {e}")))?;
    let arr = np.call_method1("atleast_1d", (arr,))?;
    let ndim: usize = arr.getattr("ndim")?.extract()?;
    if ndim != 1 {
        return Err(PyValueError::new_err(format!(
            "ids must be a 1-D sequence of integers, got {ndim} dimensions"
        )));
    }
    let kind: String = arr.getattr("dtype")?.getattr("kind")?.extract()?;
    // The first item of the caller's sequence that is not an integer (a
    // list [1, 2.5] became a float array: name 2.5, not 1.0).
    let first_bad = || -> PyResult<PyErr> {
        if obj.hasattr("dtype")? {
            let dt = arr.getattr("dtype")?.str()?.to_string();
            return Ok(PyTypeError::new_err(format!(
                "ids must be integers, got an array of dtype {dt}"
            )));
        }
        let operator = py.import("operator")?;
        let Ok(items) = obj.try_iter() else {
            return Ok(PyTypeError::new_err(format!(
                "ids must be integers, got {} {}",
                type_name(obj),
                obj.repr()?
            )));
        };
        for (pos, item) in items.enumerate() {
            let item = item?;
            let tn = type_name(&item);
            let is_int = !(item.is_instance_of::<PyBool>() || tn == "bool" || tn == "bool_")
                && (item.is_instance_of::<PyInt>()
                    || operator.call_method1("index", (&item,)).is_ok());
            if !is_int {
                return Ok(PyTypeError::new_err(format!(
                    "ids must be integers: position {pos} holds a {tn} ({})",
                    item.repr()?
                )));
            }
        }
        Ok(PyTypeError::new_err("ids must be integers"))
    };
    match kind.as_str() {
        "u" => {}
        "i" => {
            let len: usize = arr.len()?;
            if len > 0 {
                let min: i64 = arr.call_method0("min")?.extract()?;
                if min < 0 {
                    let pos: usize = arr.call_method0("argmin")?.extract()?;
                    return Err(PyValueError::new_err(format!(
                        "ids must be non-negative integers, got {min} at position {pos}"
                    )));
                }
            }
        }
        "O" => {
            // Python ints (possibly beyond int64) or anything else: check
            // each, then let numpy convert to uint64 (range errors).
            let items = arr.call_method0("tolist")?;
            for (pos, item) in items.try_iter()?.enumerate() {
                let item = item?;
                let tn = type_name(&item);
                if item.is_instance_of::<PyBool>() || !item.is_instance_of::<PyInt>() {
                    return Err(PyTypeError::new_err(format!(
                        "ids must be integers: position {pos} holds a {tn} ({})",
                        item.repr()?
                    )));
                }
                let ok = item.extract::<u64>().is_ok_and(|v| v != RESERVED_ID);
                if !ok {
                    return Err(PyValueError::new_err(format!(
                        "ids must be integers in [0, 2**64-2]: position {pos} holds {}",
                        item.repr()?
                    )));
                }
            }
            let kwargs = PyDict::new(py);
            kwargs.set_item("dtype", np.getattr("uint64")?)?;
            let converted = np.call_method("array", (items,), Some(&kwargs))?;
            return np.call_method1("atleast_1d", (converted,))?.extract();
        }
        _ => return Err(first_bad()?),
    }
    let kwargs = PyDict::new(py);
    kwargs.set_item("dtype", np.getattr("uint64")?)?;
    np.call_method("ascontiguousarray", (arr,), Some(&kwargs))?
        .extract()
}

/// An approximate nearest-neighbour index.
#[pyclass(name = "Index", module = "vectide", frozen)]
struct PyIndex {
    inner: AnyIndex,
    /// The next operation sequence number.
    seq: AtomicU64,
    /// Default search-list size (`ef`) for graph engines.
    ef: AtomicUsize,
}

impl PyIndex {
    /// The engine's named figures that start with `prefix`, without it
    /// (`None` when it reports none); counts as integers when `ints`.
    fn extra_group<'py>(
        &self,
        py: Python<'py>,
        prefix: &str,
        ints: bool,
    ) -> PyResult<Option<Bound<'py, PyDict>>> {
        let stats = self.inner.stats().map_err(to_py)?;
        let d = PyDict::new(py);
        for (k, v) in &stats.extra {
            if let Some(name) = k.strip_prefix(prefix) {
                if ints {
                    d.set_item(name, *v as u64)?;
                } else {
                    d.set_item(name, *v)?;
                }
            }
        }
        Ok((!d.is_empty()).then_some(d))
    }

    fn wrap(inner: AnyIndex) -> Self {
        let seq = inner.durable_seq();
        let ef = inner.search_defaults().ef.unwrap_or(0);
        PyIndex {
            inner,
            seq: AtomicU64::new(seq),
            ef: AtomicUsize::new(ef),
        }
    }

    fn next_seq(&self) -> u64 {
        self.seq.fetch_add(1, Ordering::AcqRel) + 1
    }
}

#[pymethods]
impl PyIndex {
    /// Index(dim, metric="cosine", engine=DEFAULT_ENGINE, path=None, **params)
    ///
    /// Engines that live in a directory (`vectide.engines()`, `in_directory`)
    /// take it as `path`: an existing index there is opened (and
    /// recovered), else a new one is created.
    #[new]
    #[pyo3(signature = (dim, metric="cosine", engine=None, path=None, **params))]
    fn new(
        py: Python<'_>,
        dim: &Bound<'_, PyAny>,
        metric: &str,
        engine: Option<&str>,
        path: Option<PathBuf>,
        params: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        let dim = int_arg(dim, "dim", 1, limits::MAX_DIM as u64)?;
        let metric = Metric::parse(metric).map_err(to_py)?;
        let engine = engine.unwrap_or(vectide_engines::DEFAULT_ENGINE);
        let mut params = params_from(params)?;
        if let Some(p) = path {
            params.insert("path".into(), ParamValue::Str(p.display().to_string()));
        }
        let inner = py
            .detach(|| vectide_engines::open_or_create(engine, dim as usize, metric, &params))
            .map_err(to_py)?;
        Ok(PyIndex::wrap(inner))
    }

    /// Makes everything applied so far durable (durable engines; a no-op for
    /// `hnsw` without a saved path).
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.inner.flush()).map_err(to_py)
    }

    /// Every operation up to this sequence number is durable.
    #[getter]
    fn durable_seq(&self) -> u64 {
        self.inner.durable_seq()
    }

    /// What the recovery of the last open did (log entries undone,
    /// discarded, redone; microseconds) for engines that report it
    /// (p-hnsw); `None` for the others.
    fn recovery<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let Some(d) = self.extra_group(py, "recovery.", true)? else {
            return Ok(None);
        };
        if let Some(ParamValue::Str(mode)) = self.inner.params().get("persist") {
            d.set_item("media", mode)?;
        }
        Ok(Some(d))
    }

    /// Insert thread-time so far by phase, seconds (`search`, `update`,
    /// `logging`: the P-HNSW paper's Figure 10) for engines that report it;
    /// `None` for the others.
    fn breakdown<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        self.extra_group(py, "insert_seconds.", false)
    }

    /// Runs the maintenance that is due or pending now (delete consolidation
    /// for graph engines) and returns when none is in flight.
    fn maintain(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.inner.maintain()).map_err(to_py)
    }

    /// Holds the engine's background maintenance (`True`: no background
    /// job starts until released; one running finishes; `maintain()`
    /// still runs them) or releases it (`False`). Returns whether the
    /// engine has background jobs to hold (`False`, and nothing done, for
    /// the others). Writes and searches go on.
    fn pause_maintenance(&self, py: Python<'_>, paused: bool) -> bool {
        py.detach(|| self.inner.pause_maintenance(paused))
    }

    /// A full structural check; returns the violations found (an empty list
    /// when sound). ValueError for engines without a checker.
    fn check(&self, py: Python<'_>) -> PyResult<Vec<String>> {
        py.detach(|| self.inner.check_structure()).map_err(to_py)
    }

    /// Adds (or replaces) vectors under the given ids.
    fn add(
        &self,
        py: Python<'_>,
        ids: &Bound<'_, PyAny>,
        vectors: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let ids = as_ids(ids)?;
        let vecs = as_rows(vectors, self.inner.dim(), "vectors")?;
        let ids = ids.as_slice()?;
        let vecs = vecs.as_slice()?;
        if ids.len() * self.inner.dim() != vecs.len() {
            return Err(PyValueError::new_err(format!(
                "got {} ids but {} vectors",
                ids.len(),
                vecs.len() / self.inner.dim()
            )));
        }
        let seq = self.next_seq();
        py.detach(|| self.inner.insert(seq, ids, vecs))
            .map_err(to_py)
    }

    /// Searches the `k` nearest neighbours of each query row.
    ///
    /// Returns `(ids uint64[nq, k], distances float32[nq, k])`, closest first;
    /// missing results are padded with id 2**64-1 and distance +inf. `k` is
    /// at most `MAX_K` (100,000), `ef` at most `MAX_EF` (100,000) and
    /// `nq * k` at most `MAX_BATCH_RESULTS` (2**24): a larger batch is a
    /// `ValueError` that says how to split it. Other keyword arguments are
    /// the engine's search knobs (`beam_width`, `nprobe`, `rerank`; see
    /// `vectide.engines()`): a knob the engine does not take is a
    /// `ValueError` naming the ones it does.
    #[pyo3(signature = (queries, k=None, ef=None, filter=None, **knobs))]
    fn search<'py>(
        &self,
        py: Python<'py>,
        queries: &Bound<'py, PyAny>,
        k: Option<&Bound<'py, PyAny>>,
        ef: Option<&Bound<'py, PyAny>>,
        filter: Option<&Bound<'py, PyAny>>,
        knobs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
        let k = opt_int_arg(k, "k", 1, limits::MAX_K as u64)?.unwrap_or(10) as usize;
        let desc = self.inner.descriptor();
        let mut params = SearchParams::default();
        match opt_int_arg(ef, "ef", 1, limits::MAX_EF as u64)? {
            Some(e) => params
                .set(desc.knob("ef").map_err(to_py)?, e as usize)
                .map_err(to_py)?,
            None => {
                let e = self.ef.load(Ordering::Relaxed);
                params.ef = (e > 0).then_some(e);
            }
        }
        set_knobs(desc, knobs, &mut params)?;
        let allowed: Option<HashSet<u64>> = match filter {
            None => None,
            Some(f) => Some(as_ids(f)?.as_slice()?.iter().copied().collect()),
        };
        let q = as_rows(queries, self.inner.dim(), "queries")?;
        let qs = q.as_slice()?;
        let nq = qs.len() / self.inner.dim();
        limits::check_batch_results(nq, k).map_err(to_py)?;
        let pred = allowed.as_ref().map(|set| move |id: u64| set.contains(&id));
        let filter_ref: Option<&(dyn Fn(u64) -> bool + Sync)> =
            pred.as_ref().map(|p| p as &(dyn Fn(u64) -> bool + Sync));
        let (ids, dists) = py
            .detach(|| -> vectide_core::Result<(Vec<u64>, Vec<f32>)> {
                let mut ids = vec![RESERVED_ID; nq * k];
                let mut dists = vec![f32::INFINITY; nq * k];
                let mut fill = |row: usize, hits: &[Neighbor]| {
                    for (j, h) in hits.iter().enumerate().take(k) {
                        ids[row * k + j] = h.id;
                        dists[row * k + j] = h.distance;
                    }
                };
                if nq == 1 {
                    let mut out = Vec::new();
                    self.inner
                        .search_into(qs, k, &params, filter_ref, &mut out)?;
                    fill(0, &out);
                } else {
                    let all = self.inner.search_batch(qs, k, &params, filter_ref)?;
                    for (row, hits) in all.iter().enumerate() {
                        fill(row, hits);
                    }
                }
                Ok((ids, dists))
            })
            .map_err(to_py)?;
        let ids = Array2::from_shape_vec((nq, k), ids)
            .map_err(|e| PyValueError::new_err(e.to_string()))?
            .into_pyarray(py);
        let dists = Array2::from_shape_vec((nq, k), dists)
            .map_err(|e| PyValueError::new_err(e.to_string()))?
            .into_pyarray(py);
        Ok((ids.into_any(), dists.into_any()))
    }

    /// Deletes ids; absent ids are ignored. Returns how many were removed.
    fn delete(&self, py: Python<'_>, ids: &Bound<'_, PyAny>) -> PyResult<usize> {
        let ids = as_ids(ids)?;
        let ids = ids.as_slice()?;
        let seq = self.next_seq();
        py.detach(|| self.inner.delete(seq, ids)).map_err(to_py)
    }

    /// The stored vectors of ids, as float32[n, dim] (normalised under cosine).
    /// Raises KeyError naming the ids that are not in the index.
    fn get<'py>(&self, py: Python<'py>, ids: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let ids = as_ids(ids)?;
        let ids = ids.as_slice()?;
        let dim = self.inner.dim();
        let mut out = Vec::with_capacity(ids.len() * dim);
        let mut missing = Vec::new();
        for &id in ids {
            match self.inner.get(id).map_err(to_py)? {
                Some(v) => out.extend_from_slice(&v),
                None => missing.push(id),
            }
        }
        if !missing.is_empty() {
            missing.truncate(20);
            return Err(to_py(Error::NotFound(missing)));
        }
        Ok(PyArray1::from_vec(py, out)
            .reshape([ids.len(), dim])?
            .into_any())
    }

    fn __len__(&self) -> usize {
        self.inner.len()
    }

    fn __contains__(&self, id: &Bound<'_, PyAny>) -> PyResult<bool> {
        match id.extract::<u64>() {
            Ok(id) => self.inner.contains(id).map_err(to_py),
            Err(_) => Ok(false),
        }
    }

    fn __repr__(&self) -> String {
        format!(
            "vectide.Index(dim={}, metric={:?}, engine={:?}, len={})",
            self.inner.dim(),
            self.inner.metric().name(),
            self.inner.engine(),
            self.inner.len()
        )
    }

    /// Saves the index to `path` (temp file, fsync, rename).
    fn save(&self, py: Python<'_>, path: PathBuf) -> PyResult<()> {
        py.detach(|| self.inner.save(&path)).map_err(to_py)
    }

    /// Opens an index file written by `save`, or the directory of a durable
    /// engine (recovering it). `params` are the engine's open-time
    /// parameters (`engines()[i]["open_params"]`).
    #[staticmethod]
    #[pyo3(signature = (path, threads=None, **params))]
    fn load(
        py: Python<'_>,
        path: PathBuf,
        threads: Option<&Bound<'_, PyAny>>,
        params: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        let threads =
            opt_int_arg(threads, "threads", 1, limits::MAX_THREADS as u64)?.map(|t| t as usize);
        let mut params = params_from(params)?;
        if let Some(t) = threads {
            params.insert("threads".into(), ParamValue::Int(t as i64));
        }
        let inner = py
            .detach(|| vectide_engines::open(&path, &params))
            .map_err(to_py)?;
        Ok(PyIndex::wrap(inner))
    }

    #[getter]
    fn dim(&self) -> usize {
        self.inner.dim()
    }

    #[getter]
    fn metric(&self) -> &'static str {
        self.inner.metric().name()
    }

    #[getter]
    fn engine(&self) -> &'static str {
        self.inner.engine()
    }

    #[getter]
    fn threads(&self) -> usize {
        self.inner.threads()
    }

    /// Default search-list size used when `search` gets no `ef`.
    #[getter]
    fn get_ef_search(&self) -> usize {
        self.ef.load(Ordering::Relaxed)
    }

    #[setter]
    fn set_ef_search(&self, ef: &Bound<'_, PyAny>) -> PyResult<()> {
        // An engine without the `ef` knob (an exact one) would ignore it.
        self.inner.descriptor().knob("ef").map_err(to_py)?;
        let ef = int_arg(ef, "ef_search", 1, limits::MAX_EF as u64)?;
        self.ef.store(ef as usize, Ordering::Relaxed);
        Ok(())
    }

    /// The engine's build parameters.
    fn params<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for (k, v) in self.inner.params() {
            match v {
                ParamValue::Int(i) => d.set_item(k, i)?,
                ParamValue::Float(f) => d.set_item(k, f)?,
                ParamValue::Bool(b) => d.set_item(k, b)?,
                ParamValue::Str(s) => d.set_item(k, s)?,
            }
        }
        Ok(d)
    }

    /// Sizes and counters: live, slots_used, capacity, pending_deletes,
    /// memory_bytes, consolidations, durable_seq; `maintenance` (the jobs
    /// running now) and `maintenance_started` (jobs begun since the open).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.inner.stats().map_err(to_py)?;
        let d = PyDict::new(py);
        d.set_item("live", s.live)?;
        d.set_item("slots_used", s.slots_used)?;
        d.set_item("capacity", s.capacity)?;
        d.set_item("pending_deletes", s.pending_deletes)?;
        d.set_item("memory_bytes", s.memory_bytes)?;
        d.set_item("consolidations", s.consolidations)?;
        d.set_item("disk_bytes", s.disk_bytes)?;
        d.set_item("reads", s.reads)?;
        d.set_item("bytes_read", s.bytes_read)?;
        d.set_item("round_trips", s.round_trips)?;
        d.set_item("pending_background", s.pending_background)?;
        d.set_item("maintenance", s.maintenance.clone())?;
        d.set_item("maintenance_started", s.maintenance_started)?;
        for (k, v) in &s.extra {
            d.set_item(k, *v)?;
        }
        d.set_item("durable_seq", self.inner.durable_seq())?;
        Ok(d)
    }
}

/// The registered engines: for each, its name, summary, persistence class,
/// medium (`ram`, `pmem`, `ssd` or `remote`), search knobs (and the primary one) and parameters (name, type, default,
/// doc, source of the default).
#[pyfunction]
fn engines(py: Python<'_>) -> PyResult<Vec<Bound<'_, PyDict>>> {
    vectide_engines::REGISTRY
        .iter()
        .map(|d| {
            let e = PyDict::new(py);
            e.set_item("name", d.name)?;
            e.set_item("summary", d.summary)?;
            e.set_item("persistence", d.persistence.name())?;
            e.set_item("in_directory", d.persistence.in_directory())?;
            e.set_item("medium", d.medium.name())?;
            let knobs: Vec<&str> = d.knobs.iter().map(|k| k.name()).collect();
            e.set_item("knobs", knobs)?;
            e.set_item("primary_knob", d.primary_knob.map(|k| k.name()))?;
            let params = d
                .params
                .iter()
                .map(|p| {
                    let x = PyDict::new(py);
                    x.set_item("name", p.name)?;
                    x.set_item("type", p.kind.to_string())?;
                    x.set_item("default", p.default)?;
                    x.set_item("doc", p.doc)?;
                    x.set_item("source", p.source)?;
                    Ok(x)
                })
                .collect::<PyResult<Vec<_>>>()?;
            e.set_item("params", params)?;
            Ok(e)
        })
        .collect()
}

/// The SIMD instruction set the distance kernels dispatched to.
/// The rows of a C-ordered 2-D array.
fn id_rows<'a>(
    a: &'a PyReadonlyArray2<'_, u64>,
) -> PyResult<impl ExactSizeIterator<Item = &'a [u64]>> {
    let width = a.as_array().ncols();
    let n = a.as_array().nrows();
    let flat = a
        .as_slice()
        .map_err(|_| PyValueError::new_err("expected a C-ordered uint64 array"))?;
    Ok((0..n).map(move |i| &flat[i * width..(i + 1) * width]))
}

/// Recall@k of result rows against ground-truth rows
/// (`vectide_core::eval`, the same code as `vectide bench`).
#[pyfunction]
fn recall_at_k(
    found: PyReadonlyArray2<'_, u64>,
    truth: PyReadonlyArray2<'_, u64>,
    k: usize,
) -> PyResult<f64> {
    vectide_core::eval::recall_at_k(id_rows(&found)?, id_rows(&truth)?, k).map_err(to_py)
}

/// The Pareto frontier of `(recall, qps)` points, by increasing recall.
#[pyfunction]
fn pareto_frontier(points: Vec<(f64, f64)>) -> Vec<(f64, f64)> {
    vectide_core::eval::pareto_frontier(&points)
}

/// QPS at a recall target, interpolated on the Pareto frontier (`None`
/// when no point reaches it).
#[pyfunction]
fn qps_at_recall(points: Vec<(f64, f64)>, target: f64) -> Option<f64> {
    vectide_core::eval::qps_at_recall(&points, target)
}

/// Fault plans armed from Python, kept until [`_clear_faults`].
static FAULT_GUARDS: std::sync::Mutex<Vec<vectide_core::fault::FaultGuard>> =
    std::sync::Mutex::new(Vec::new());

/// Tests only: makes the next `n` hits of the fault point `site` (e.g.
/// `"db.apply"`) under directory `root` fail with an I/O error (see
/// `vectide_core::fault`). Returns nothing; `_clear_faults` removes every
/// plan armed this way.
#[pyfunction]
fn _arm_fault(root: PathBuf, site: String, n: u64) {
    // The site names a fault point for the life of the process (a test's
    // handful of names).
    let site = vectide_core::fault::FaultSite(Box::leak(site.into_boxed_str()));
    let plan = vectide_core::fault::Faults::new();
    plan.arm(site, n);
    FAULT_GUARDS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(vectide_core::fault::install_faults(&root, plan));
}

/// Tests only: removes every plan [`_arm_fault`] installed.
#[pyfunction]
fn _clear_faults() {
    FAULT_GUARDS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clear();
}

#[pyfunction]
fn simd_isa() -> &'static str {
    vectide_core::distance::active_isa()
}

/// The allocator this build of the extension uses: `mimalloc` (the
/// product's, `vectide_core::trim`) or `system` (feature
/// `system-allocator`, for comparisons).
#[pyfunction]
fn allocator() -> &'static str {
    if cfg!(feature = "system-allocator") {
        "system"
    } else {
        "mimalloc"
    }
}

/// The commit the extension was built at (`unknown` outside a git
/// checkout); a build from a tree with uncommitted changes still names
/// the commit it started from.
#[pyfunction]
fn build_commit() -> &'static str {
    env!("VECTIDE_BUILD_COMMIT")
}

#[pymodule]
fn _vectide(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyIndex>()?;
    db::register(m)?;
    m.add_function(wrap_pyfunction!(simd_isa, m)?)?;
    m.add_function(wrap_pyfunction!(allocator, m)?)?;
    m.add_function(wrap_pyfunction!(build_commit, m)?)?;
    m.add_function(wrap_pyfunction!(_arm_fault, m)?)?;
    m.add_function(wrap_pyfunction!(_clear_faults, m)?)?;
    m.add_function(wrap_pyfunction!(engines, m)?)?;
    m.add_function(wrap_pyfunction!(recall_at_k, m)?)?;
    m.add_function(wrap_pyfunction!(pareto_frontier, m)?)?;
    m.add_function(wrap_pyfunction!(qps_at_recall, m)?)?;
    harness::register(m)?;
    m.add(
        "RECALL_TARGETS",
        vectide_core::eval::RECALL_TARGETS.to_vec(),
    )?;
    m.add("DEFAULT_ENGINE", vectide_engines::DEFAULT_ENGINE)?;
    m.add("CorruptIndexError", m.py().get_type::<CorruptIndexError>())?;
    m.add("PoisonedError", m.py().get_type::<PoisonedError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("MISSING_ID", RESERVED_ID)?;
    let l = PyDict::new(m.py());
    l.set_item("MAX_K", limits::MAX_K)?;
    l.set_item("MAX_BATCH_RESULTS", limits::MAX_BATCH_RESULTS)?;
    l.set_item("MAX_EF", limits::MAX_EF)?;
    l.set_item("MAX_DIM", limits::MAX_DIM)?;
    l.set_item("MIN_M", limits::MIN_M)?;
    l.set_item("MAX_M", limits::MAX_M)?;
    l.set_item("MAX_THREADS", limits::MAX_THREADS)?;
    l.set_item("MAX_NLOG_ENTRIES", limits::MAX_NLOG_ENTRIES)?;
    l.set_item("MAX_NLIST_ENTRIES", limits::MAX_NLIST_ENTRIES)?;
    l.set_item("MAX_INITIAL_CAPACITY", limits::MAX_INITIAL_CAPACITY)?;
    l.set_item("MAX_INITIAL_BYTES", limits::MAX_INITIAL_BYTES)?;
    l.set_item("MAX_SNAPSHOT_EVERY", limits::MAX_SNAPSHOT_EVERY)?;
    l.set_item("MAX_WAL_BUFFER", limits::MAX_WAL_BUFFER)?;
    l.set_item("MAX_CHECKPOINT_SECONDS", limits::MAX_CHECKPOINT_SECONDS)?;
    l.set_item("JSON_INT_MIN", i64::MIN)?;
    l.set_item("JSON_INT_MAX", u64::MAX)?;
    m.add("LIMITS", l)?;
    Ok(())
}
