//! The benchmark harness core and the quantization room's k-means, for
//! `vectide.runbook` and `vectide.bench`: a runbook's parse and check, its
//! ground truth, the timed loop of a native engine and the result document
//! (`vectide_harness`), so Python and the CLI run one harness.
//!
//! Vectors cross as NumPy arrays without copies (C-ordered `float32`);
//! results cross as JSON text (the documents the benchmarks write). Long
//! calls release the GIL.

use crate::to_py;
use numpy::{PyArray2, PyArrayMethods, PyReadonlyArray2, PyUntypedArrayMethods};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::sync::Arc;
use vectide_core::Metric;
use vectide_harness::runbook::{self, Data, Truth};

/// A runbook's steps as the harness core reads them: `(dataset, max_pts,
/// steps)`, each step a dict of its operation and integer fields.
/// `ValueError` (`vectide.runbook.RunbookError`) names the first problem.
#[pyfunction]
#[pyo3(signature = (text, dataset=None))]
fn runbook_parse<'py>(
    py: Python<'py>,
    text: &[u8],
    dataset: Option<&str>,
) -> PyResult<(String, i128, Vec<Bound<'py, PyDict>>)> {
    use vectide_harness::runbook::{parse, Step};
    let rb = parse(text, dataset).map_err(|e| PyValueError::new_err(e.0))?;
    let steps = rb
        .steps
        .iter()
        .map(|s| {
            let d = PyDict::new(py);
            let (op, fields): (&str, Vec<(&str, i128)>) = match *s {
                Step::Insert { start, end } => ("insert", vec![("start", start), ("end", end)]),
                Step::Delete { start, end } => ("delete", vec![("start", start), ("end", end)]),
                Step::Search => ("search", vec![]),
                Step::Replace {
                    tags_start,
                    tags_end,
                    ids_start,
                    ids_end,
                } => (
                    "replace",
                    vec![
                        ("tags_start", tags_start),
                        ("tags_end", tags_end),
                        ("ids_start", ids_start),
                        ("ids_end", ids_end),
                    ],
                ),
            };
            d.set_item("operation", op)?;
            for (k, v) in fields {
                d.set_item(k, v)?;
            }
            Ok(d)
        })
        .collect::<PyResult<Vec<_>>>()?;
    Ok((rb.dataset, rb.max_pts, steps))
}

/// Checks a runbook (its YAML) against a dataset of `n` rows with the
/// harness core's check: counts of its operations and its largest active
/// set, or `ValueError` naming the step of the first problem.
#[pyfunction]
#[pyo3(signature = (text, n, dataset=None))]
fn runbook_check<'py>(
    py: Python<'py>,
    text: &[u8],
    n: usize,
    dataset: Option<&str>,
) -> PyResult<Bound<'py, PyDict>> {
    use vectide_harness::runbook::{check, parse};
    let plan = parse(text, dataset)
        .and_then(|rb| check(&rb, n))
        .map_err(|e| PyValueError::new_err(e.0))?;
    let c = &plan.counts;
    let d = PyDict::new(py);
    d.set_item("insert", c.insert)?;
    d.set_item("delete", c.delete)?;
    d.set_item("search", c.search)?;
    d.set_item("replace", c.replace)?;
    d.set_item("peak_active", c.peak_active)?;
    Ok(d)
}

/// Cluster labels of the rows of `x` (squared L2) from the quantization
/// room's k-means (`vectide_quant::kmeans`: k-means++ seeding, Lloyd or
/// mini-batch past its sample size, seeded), with the GIL released.
#[pyfunction]
#[pyo3(signature = (x, k, seed=0, iters=25))]
fn kmeans_labels<'py>(
    py: Python<'py>,
    x: PyReadonlyArray2<'py, f32>,
    k: usize,
    seed: u64,
    iters: usize,
) -> PyResult<Bound<'py, numpy::PyArray1<u32>>> {
    let dim = x.as_array().ncols();
    let data = x
        .as_slice()
        .map_err(|_| PyValueError::new_err("expected a C-ordered float32 array"))?;
    let params = vectide_quant::KMeansParams::new(k)
        .seed(seed)
        .max_iters(iters);
    let labels = py
        .detach(|| vectide_quant::kmeans(data, dim, &params).and_then(|c| c.assign(data)))
        .map_err(to_py)?;
    Ok(numpy::PyArray1::from_vec(py, labels))
}

/// A C-ordered float32 matrix as a slice and its width.
fn matrix<'a>(what: &str, a: &'a PyReadonlyArray2<'_, f32>) -> PyResult<(&'a [f32], usize)> {
    let cols = a.shape()[1];
    let s = a.as_slice().map_err(|_| {
        PyValueError::new_err(format!("{what}: expected a C-ordered float32 array"))
    })?;
    Ok((s, cols))
}

/// The rows and queries of a run, checked.
fn data<'a>(
    rows: &'a PyReadonlyArray2<'_, f32>,
    queries: &'a PyReadonlyArray2<'_, f32>,
    metric: &str,
) -> PyResult<Data<'a>> {
    let metric = Metric::parse(metric).map_err(to_py)?;
    let (r, dim) = matrix("rows", rows)?;
    let (q, qdim) = matrix("queries", queries)?;
    if qdim != dim {
        return Err(PyValueError::new_err(format!(
            "queries are {qdim}-d, rows {dim}-d"
        )));
    }
    Data::new(dim, metric, r, q).map_err(PyValueError::new_err)
}

fn plan_of(text: &[u8], n: usize) -> PyResult<runbook::Plan> {
    runbook::parse(text, None)
        .and_then(|rb| runbook::check(&rb, n))
        .map_err(|e| PyValueError::new_err(e.0))
}

/// The engines a runbook runs when none are named (`vectide:NAME`).
#[pyfunction]
fn runbook_default_engines() -> Vec<String> {
    runbook::default_engines()
}

/// Resolves an engine of a run (`NAME`, `vectide:NAME`, or a variant
/// `vectide:NAME@key=value`) as the run will: its result key, or
/// `ValueError` naming the problem (unknown engine or parameter, a value
/// not of the parameter's kind, a key set twice).
#[pyfunction]
#[pyo3(signature = (spec, update_threads=2, knob=100, nprobe=32))]
fn runbook_engine(
    spec: &str,
    update_threads: usize,
    knob: usize,
    nprobe: usize,
) -> PyResult<String> {
    runbook::EngineRun::new(spec, update_threads, knob, nprobe)
        .map(|e| e.key)
        .map_err(PyValueError::new_err)
}

/// The build parameters every run gives the engines that take them, as
/// JSON text: `{"vamana_family": {...}, "hnsw_family": {...}}` (the peers
/// of each family get the same).
#[pyfunction]
fn runbook_build_params() -> String {
    runbook::build_params_json().to_string()
}

/// Ground truth of every search step of a runbook (its YAML) over `rows`
/// (ids are row numbers): a list with, per search step, an `(nq, k')`
/// uint64 array of exact neighbours (`k'` = min(k, active set)), or `None`
/// where the active set is empty.
#[pyfunction]
#[pyo3(signature = (text, rows, queries, metric, k, threads=2))]
fn runbook_truth<'py>(
    py: Python<'py>,
    text: &[u8],
    rows: PyReadonlyArray2<'py, f32>,
    queries: PyReadonlyArray2<'py, f32>,
    metric: &str,
    k: usize,
    threads: usize,
) -> PyResult<Vec<Option<Bound<'py, PyArray2<u64>>>>> {
    let d = data(&rows, &queries, metric)?;
    let plan = plan_of(text, d.n_rows())?;
    check_k(k)?;
    let nq = d.n_queries();
    let gt = py
        .detach(|| runbook::ground_truth(&d, &plan, k, threads.max(1)))
        .map_err(PyValueError::new_err)?;
    gt.steps
        .iter()
        .map(|t| {
            t.as_ref()
                .map(|t| numpy::PyArray1::from_slice(py, &t.ids).reshape([nq, t.k]))
                .transpose()
        })
        .collect()
}

fn check_k(k: usize) -> PyResult<()> {
    vectide_core::limits::check_range("k", k, 1, vectide_core::limits::MAX_K).map_err(to_py)
}

/// Runs a runbook (its YAML) on one native engine (`vectide:NAME` or a
/// variant `vectide:NAME@key=value`) with the harness core's timed loop;
/// `truth` is [`runbook_truth`]'s list. Returns the engine's result
/// document as JSON text. `isolated`: this process is the engine's own (a
/// benchmark worker), so memory is the resident set's growth.
#[pyfunction]
#[pyo3(signature = (engine, text, rows, queries, metric, truth, k, knob, nprobe, update_threads,
                    settle_after_deletes=false, calibrate=Vec::new(), target=0.95,
                    isolated=true, workdir=None))]
#[allow(clippy::too_many_arguments)]
fn runbook_run<'py>(
    py: Python<'py>,
    engine: &str,
    text: &[u8],
    rows: PyReadonlyArray2<'py, f32>,
    queries: PyReadonlyArray2<'py, f32>,
    metric: &str,
    truth: Vec<Option<PyReadonlyArray2<'py, u64>>>,
    k: usize,
    knob: usize,
    nprobe: usize,
    update_threads: usize,
    settle_after_deletes: bool,
    calibrate: Vec<usize>,
    target: f64,
    isolated: bool,
    workdir: Option<std::path::PathBuf>,
) -> PyResult<String> {
    let d = data(&rows, &queries, metric)?;
    let plan = plan_of(text, d.n_rows())?;
    check_k(k)?;
    let nq = d.n_queries();
    let steps = truth
        .iter()
        .map(|t| {
            t.as_ref()
                .map(|a| {
                    let [rows, cols] = [a.shape()[0], a.shape()[1]];
                    let ids = a.as_slice().map_err(|_| {
                        PyValueError::new_err("truth: expected C-ordered uint64 arrays")
                    })?;
                    if rows != nq || cols == 0 {
                        return Err(PyValueError::new_err(format!(
                            "truth: a ({rows}, {cols}) array for {nq} queries"
                        )));
                    }
                    Ok(Arc::new(Truth {
                        k: cols,
                        ids: ids.to_vec(),
                    }))
                })
                .transpose()
        })
        .collect::<PyResult<Vec<_>>>()?;
    if steps.len() != plan.counts.search {
        return Err(PyValueError::new_err(format!(
            "truth holds {} search steps, the runbook {}",
            steps.len(),
            plan.counts.search
        )));
    }
    let mut e = runbook::EngineRun::new(engine, update_threads, knob, nprobe)
        .map_err(PyValueError::new_err)?;
    let opts = runbook::RunOptions {
        k,
        settle_after_deletes,
        calibrate,
        target,
        isolated,
        workdir,
    };
    let doc = py
        .detach(|| runbook::run_engine(&mut e, &d, &plan, &steps, &opts))
        .map_err(PyValueError::new_err)?;
    Ok(doc.to_string())
}

/// The result document of a run: `head` (JSON object text with at least
/// `k`) and the engines' results (JSON object text, in run order);
/// returns the document as JSON text.
#[pyfunction]
#[pyo3(signature = (head, results, isolated=true))]
fn runbook_report(head: &str, results: &str, isolated: bool) -> PyResult<String> {
    let parse = |what: &str, t: &str| {
        serde_json::from_str::<serde_json::Value>(t)
            .map_err(|e| PyValueError::new_err(format!("{what}: {e}")))
    };
    let head = parse("head", head)?;
    let serde_json::Value::Object(results) = parse("results", results)? else {
        return Err(PyValueError::new_err("results: expected a JSON object"));
    };
    runbook::document(head, results, isolated)
        .map(|d| d.to_string())
        .map_err(PyValueError::new_err)
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(runbook_parse, m)?)?;
    m.add_function(wrap_pyfunction!(runbook_check, m)?)?;
    m.add_function(wrap_pyfunction!(runbook_default_engines, m)?)?;
    m.add_function(wrap_pyfunction!(runbook_engine, m)?)?;
    m.add_function(wrap_pyfunction!(runbook_build_params, m)?)?;
    m.add_function(wrap_pyfunction!(runbook_truth, m)?)?;
    m.add_function(wrap_pyfunction!(runbook_run, m)?)?;
    m.add_function(wrap_pyfunction!(runbook_report, m)?)?;
    m.add_function(wrap_pyfunction!(kmeans_labels, m)?)?;
    Ok(())
}
