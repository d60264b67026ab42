//! Python objects to the database's values and back, without JSON text:
//! point ids (`int`, `str`, `uuid.UUID`, numpy integers) into [`ExtId`]s,
//! payloads and filters (dicts, lists, tuples, strings, numbers, bools,
//! `None`, numpy scalars) into `serde_json` values, and stored payloads and
//! ids back into Python objects. This is the embedded database's one check
//! of them: errors name the problem (and the position of a bad id) as a
//! `TypeError` or `ValueError`, before anything is written.

use crate::type_name;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use serde_json::{Map, Number, Value};
use vectide_core::limits;
use vectide_db::ExtId;

fn short_repr(obj: &Bound<'_, PyAny>) -> String {
    let r = obj.repr().map(|r| r.to_string()).unwrap_or_default();
    match r.char_indices().nth(60) {
        Some((i, _)) => r[..i].to_string(),
        None => r,
    }
}

fn is_numpy_bool(obj: &Bound<'_, PyAny>) -> bool {
    let tn = type_name(obj);
    (tn == "bool_" || tn == "bool") && !obj.is_instance_of::<PyBool>()
}

/// The numpy kind of a numpy scalar (`'i'`, `'u'`, `'f'`, `'b'` …), or
/// `None` for anything else.
fn numpy_kind(obj: &Bound<'_, PyAny>) -> Option<char> {
    let dtype = obj.getattr("dtype").ok()?;
    let kind: String = dtype.getattr("kind").ok()?.extract().ok()?;
    kind.chars().next()
}

/// One point id; `pos` is its position in the caller's list, for errors.
pub(crate) fn ext_id(obj: &Bound<'_, PyAny>, pos: Option<usize>) -> PyResult<ExtId> {
    let at = pos.map_or(String::new(), |p| format!(" at position {p}"));
    let wrong = || {
        PyTypeError::new_err(format!(
            "point ids are int, str or uuid.UUID; got {} {}{at}",
            type_name(obj),
            short_repr(obj)
        ))
    };
    if obj.is_instance_of::<PyBool>() || is_numpy_bool(obj) {
        return Err(wrong());
    }
    if let Ok(s) = obj.cast::<PyString>() {
        return ExtId::from_str_key(&s.to_cow()?).map_err(crate::db::to_py);
    }
    let int = if obj.is_instance_of::<PyInt>() {
        Some(obj.clone())
    } else if matches!(numpy_kind(obj), Some('i' | 'u')) {
        Some(crate::py_index(obj)?)
    } else {
        None
    };
    if let Some(int) = int {
        return int.extract::<u64>().map(ExtId::Num).map_err(|_| {
            PyValueError::new_err(format!(
                "integer point ids must be in 0..2**64-1; got {}{at}",
                short_repr(&int)
            ))
        });
    }
    let uuid = obj.py().import("uuid")?.getattr("UUID")?;
    if obj.is_instance(&uuid)? {
        return ExtId::from_str_key(&obj.str()?.to_string()).map_err(crate::db::to_py);
    }
    Err(wrong())
}

/// One id or a sequence of ids.
pub(crate) fn ext_ids(obj: &Bound<'_, PyAny>) -> PyResult<Vec<ExtId>> {
    if let Ok(list) = obj.cast::<PyList>() {
        return list
            .iter()
            .enumerate()
            .map(|(p, i)| ext_id(&i, Some(p)))
            .collect();
    }
    let single = obj.is_instance_of::<PyInt>()
        || obj.is_instance_of::<PyString>()
        || obj.is_instance_of::<PyBool>()
        || is_numpy_bool(obj)
        || matches!(numpy_kind(obj), Some('i' | 'u'))
            && obj.getattr("ndim").and_then(|n| n.extract::<usize>()).ok() == Some(0)
        || obj.is_instance(&obj.py().import("uuid")?.getattr("UUID")?)?;
    if single {
        return Ok(vec![ext_id(obj, None)?]);
    }
    let tn = type_name(obj);
    let refused = matches!(tn.as_str(), "bytes" | "bytearray")
        || obj.is_instance_of::<PyDict>()
        || obj.is_instance(&obj.py().import("collections.abc")?.getattr("Mapping")?)?;
    let items = match obj.try_iter() {
        Ok(items) if !refused => items,
        _ => {
            return Err(PyTypeError::new_err(format!(
                "ids must be one id or a sequence of ids, got {tn}"
            )))
        }
    };
    items
        .enumerate()
        .map(|(p, i)| ext_id(&i?, Some(p)))
        .collect()
}

/// A payload, filter or other JSON-shaped argument as a JSON value. `what`
/// names it in errors. Integers must lie in -2**63..=2**64-1 (what a JSON
/// number is stored exactly as), floats must be finite, object keys are
/// strings (ints, floats, bools and `None` become theirs, as `json.dumps`
/// does), nesting is bounded by [`limits::MAX_JSON_DEPTH`].
pub(crate) fn to_value(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Value> {
    value_at(obj, what, 0)
}

fn int_value(int: &Bound<'_, PyAny>, what: &str) -> PyResult<Value> {
    if let Ok(v) = int.extract::<i64>() {
        return Ok(Value::from(v));
    }
    if let Ok(v) = int.extract::<u64>() {
        return Ok(Value::from(v));
    }
    Err(PyValueError::new_err(format!(
        "{what}: integer {} is outside -2**63..=2**64-1 and would not be stored exactly; send it as a string or a float",
        short_repr(int)
    )))
}

fn float_value(f: f64, what: &str) -> PyResult<Value> {
    Number::from_f64(f).map(Value::Number).ok_or_else(|| {
        PyValueError::new_err(format!(
            "{what}: out of range float values are not JSON compliant: {f}"
        ))
    })
}

fn key_of(k: &Bound<'_, PyAny>) -> PyResult<String> {
    if let Ok(s) = k.cast::<PyString>() {
        return Ok(s.to_cow()?.into_owned());
    }
    if k.is_instance_of::<PyBool>() {
        return Ok(if k.is_truthy()? { "true" } else { "false" }.into());
    }
    if k.is_none() {
        return Ok("null".into());
    }
    if k.is_instance_of::<PyInt>() || k.is_instance_of::<PyFloat>() {
        return Ok(k.str()?.to_string());
    }
    Err(PyTypeError::new_err(format!(
        "keys must be str, int, float, bool or None, not {}",
        type_name(k)
    )))
}

fn value_at(obj: &Bound<'_, PyAny>, what: &str, depth: usize) -> PyResult<Value> {
    if obj.is_none() {
        return Ok(Value::Null);
    }
    if obj.is_instance_of::<PyBool>() {
        return Ok(Value::Bool(obj.is_truthy()?));
    }
    if obj.is_instance_of::<PyInt>() {
        return int_value(obj, what);
    }
    if let Ok(f) = obj.cast::<PyFloat>() {
        return float_value(f.value(), what);
    }
    if let Ok(s) = obj.cast::<PyString>() {
        return Ok(Value::String(s.to_cow()?.into_owned()));
    }
    let deeper = || {
        if depth >= limits::MAX_JSON_DEPTH {
            Err(PyValueError::new_err(format!(
                "{what}: nested deeper than {} levels",
                limits::MAX_JSON_DEPTH
            )))
        } else {
            Ok(depth + 1)
        }
    };
    if let Ok(d) = obj.cast::<PyDict>() {
        let depth = deeper()?;
        let mut m = Map::with_capacity(d.len());
        for (k, v) in d.iter() {
            m.insert(key_of(&k)?, value_at(&v, what, depth)?);
        }
        return Ok(Value::Object(m));
    }
    if let Ok(l) = obj.cast::<PyList>() {
        let depth = deeper()?;
        return l.iter().map(|v| value_at(&v, what, depth)).collect();
    }
    if let Ok(t) = obj.cast::<PyTuple>() {
        let depth = deeper()?;
        return t.iter().map(|v| value_at(&v, what, depth)).collect();
    }
    // numpy scalars are numbers (and numpy bools are bools).
    match numpy_kind(obj) {
        Some('b') => return Ok(Value::Bool(obj.is_truthy()?)),
        Some('i' | 'u') => return int_value(&crate::py_index(obj)?, what),
        Some('f') => return float_value(obj.extract::<f64>()?, what),
        _ => {}
    }
    Err(PyTypeError::new_err(format!(
        "{what}: object of type {} is not JSON serializable",
        type_name(obj)
    )))
}

/// A stored JSON value as a Python object (numbers keep their kind: an
/// integer comes back an `int`, a float a `float`, -0.0 keeps its sign).
pub(crate) fn to_py<'py>(py: Python<'py>, v: &Value) -> PyResult<Bound<'py, PyAny>> {
    Ok(match v {
        Value::Null => py.None().into_bound(py),
        Value::Bool(b) => PyBool::new(py, *b).to_owned().into_any(),
        Value::Number(n) => {
            if let Some(u) = n.as_u64() {
                u.into_pyobject(py)?.into_any()
            } else if let Some(i) = n.as_i64() {
                i.into_pyobject(py)?.into_any()
            } else {
                PyFloat::new(py, n.as_f64().unwrap_or(f64::NAN)).into_any()
            }
        }
        Value::String(s) => PyString::new(py, s).into_any(),
        Value::Array(a) => {
            let l = PyList::empty(py);
            for x in a {
                l.append(to_py(py, x)?)?;
            }
            l.into_any()
        }
        Value::Object(m) => {
            let d = PyDict::new(py);
            for (k, x) in m {
                d.set_item(k, to_py(py, x)?)?;
            }
            d.into_any()
        }
    })
}

/// A point id as a Python `int` or `str` (UUIDs in their hyphenated form).
pub(crate) fn id_to_py<'py>(py: Python<'py>, id: &ExtId) -> PyResult<Bound<'py, PyAny>> {
    Ok(match id {
        ExtId::Num(n) => n.into_pyobject(py)?.into_any(),
        ExtId::Uuid(u) => PyString::new(py, &u.hyphenated().to_string()).into_any(),
        ExtId::Str(s) => PyString::new(py, s).into_any(),
    })
}
