"""Converters shared by the embedded collection (``vectide.db``) and the
HTTP client (``vectide.client``): argument checks that both front ends make
the same way, and the JSON-ready forms of ids and payloads the HTTP client
sends. (The embedded collection hands ids and payloads to the native layer
as Python objects; it checks them once, in ``convert.rs``, with the same
messages as ``_id_value`` here.)"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from typing import Any, Dict, List, Optional

import numpy as np

_MAX_ID = 2**64 - 1


def _id_value(i, pos: Optional[int] = None):
    """One point id as JSON-ready value: an int in 0..2**64-1, a str, or a
    UUID (as its string); a TypeError names the position and the type of
    anything else (floats, None, bools, bytes …)."""
    where = "" if pos is None else f" at position {pos}"
    if isinstance(i, (bool, np.bool_)):
        raise TypeError(f"point ids are int, str or uuid.UUID; got bool {i!r}{where}")
    if isinstance(i, (int, np.integer)):
        v = int(i)
        if not 0 <= v <= _MAX_ID:
            raise ValueError(f"integer point ids must be in 0..2**64-1; got {v}{where}")
        return v
    if isinstance(i, str):
        return i
    if isinstance(i, uuid.UUID):
        return str(i)
    raise TypeError(f"point ids are int, str or uuid.UUID; got {type(i).__name__} {i!r:.60}{where}")


def _id_values(ids) -> List[Any]:
    """A list of ids (or one id) as JSON-ready values (see ``_id_value``)."""
    if isinstance(ids, (int, np.integer, str, uuid.UUID, bool, np.bool_)):
        return [_id_value(ids)]
    if isinstance(ids, (bytes, bytearray, Mapping)) or not hasattr(ids, "__iter__"):
        raise TypeError(f"ids must be one id or a sequence of ids, got {type(ids).__name__}")
    return [_id_value(i, pos) for pos, i in enumerate(ids)]


def _int(value, name: str) -> int:
    """An integer argument (numpy integers too; bools and floats are a TypeError)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r:.60}")
    return int(value)


def _json_default(o):
    # numpy scalars are numbers (and numpy bools are bools).
    if isinstance(o, np.bool_):
        return bool(o)
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    raise TypeError(f"Object of type {type(o).__name__} is not JSON serializable")


def _dumps(value, what: str) -> str:
    """JSON text of a payload or filter: NaN and infinities are refused
    (JSON has no such numbers), as are values nested too deeply."""
    try:
        return json.dumps(value, allow_nan=False, default=_json_default)
    except ValueError as e:
        raise ValueError(f"{what}: {e}") from None
    except RecursionError:
        raise ValueError(f"{what}: nested too deeply") from None


def _check_params(params: Dict[str, Any]) -> Dict[str, Any]:
    """Engine parameters: NaN and infinities are named (JSON cannot carry them)."""
    for k, v in params.items():
        if isinstance(v, (float, np.floating)) and not np.isfinite(v):
            raise ValueError(f"parameter {k} must be a finite number, got {v}")
    return params


def _rows(vectors, n: Optional[int] = None) -> np.ndarray:
    a = np.asarray(vectors, dtype=np.float32)
    if a.ndim == 1:
        a = a[None, :]
    return np.ascontiguousarray(a)


def _native_ids(ids):
    """Ids as the native calls take them: one id, or a list (a generator or
    other iterable is read once, here); what is neither is passed on for
    the native layer to name."""
    if isinstance(ids, (int, np.integer, str, uuid.UUID, bool, np.bool_, bytes, bytearray, Mapping, list)):
        return ids
    if not hasattr(ids, "__iter__"):
        return ids
    if isinstance(ids, np.ndarray) and ids.dtype.kind in "iu":
        return ids.tolist()  # Python ints: no per-item numpy lookups
    return list(ids)


def _plain(v):
    """A vector (or a dict of them, or a sparse vector dict) with numpy
    arrays and scalars as lists and numbers, ready for JSON or the native
    layer."""
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, Mapping):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, uuid.UUID):
        return str(v)
    return v


def _point_dicts(points) -> List[Dict[str, Any]]:
    """Points for ``upsert_points``: dicts ``{"id", "vector", "payload"}``,
    the vector a list or array (the unnamed space) or ``{"NAME": list |
    array | {"indices", "values"}}``."""
    if isinstance(points, Mapping) or not hasattr(points, "__iter__"):
        raise TypeError(f"points must be a list of dicts {{id, vector, payload}}, got {type(points).__name__}")
    out = []
    for i, p in enumerate(points):
        if not isinstance(p, Mapping):
            raise TypeError(f"points[{i}] must be a dict {{id, vector, payload}}, got {type(p).__name__}")
        unknown = set(p) - {"id", "vector", "payload"}
        if unknown:
            raise ValueError(f"points[{i}]: unknown key(s) {sorted(unknown)} (known: id, vector, payload)")
        if "id" not in p or "vector" not in p:
            raise ValueError(f"points[{i}] needs an id and a vector")
        out.append({"id": _id_value(p["id"], i), "vector": _plain(p["vector"]), "payload": p.get("payload")})
    return out


def _query_body(query=None, prefetch=None, using=None, filter=None, limit: int = 10, offset: int = 0,
                score_threshold=None, with_payload=True, with_vector=False, params=None) -> Dict[str, Any]:
    """A Query API body (Qdrant's ``/points/query`` shape) from the keyword
    arguments of ``Collection.query``; the database checks it."""
    body: Dict[str, Any] = {"limit": _int(limit, "limit"), "offset": _int(offset, "offset"),
                            "with_payload": with_payload, "with_vector": _plain(with_vector)}
    if query is not None:
        body["query"] = _plain(query)
    if prefetch is not None:
        body["prefetch"] = _plain(prefetch)
    if using is not None:
        body["using"] = using
    if filter is not None:
        if not isinstance(filter, Mapping):
            raise TypeError(f"filter must be a dict, got {type(filter).__name__}")
        body["filter"] = filter
    if score_threshold is not None:
        body["score_threshold"] = float(score_threshold)
    if params is not None:
        body["params"] = params
    return body


def _groups_body(group_by, query=None, prefetch=None, using=None, filter=None, limit: int = 10, group_size: int = 3,
                 score_threshold=None, with_payload=True, with_vector=False, params=None) -> Dict[str, Any]:
    """A grouped query's body (Qdrant's ``/points/query/groups`` shape):
    the query's keys without ``offset``, with ``group_by`` and
    ``group_size``; the database checks it."""
    if not isinstance(group_by, str):
        raise TypeError(f"group_by must be a key path (str), got {type(group_by).__name__}")
    body = _query_body(query, prefetch, using, filter, limit, 0, score_threshold, with_payload, with_vector, params)
    del body["offset"]
    body["group_by"] = group_by
    body["group_size"] = _int(group_size, "group_size")
    return body


def _spaces(vectors, sparse_vectors):
    """Named dense spaces ``{"NAME": {"dim", "metric", "engine", "params"}}``
    and sparse ones ``{"NAME": {"modifier"} | None}``, checked for shape."""
    dense = []
    for name, spec in (vectors or {}).items():
        if not isinstance(spec, Mapping):
            raise TypeError(f"vectors[{name!r}] must be a dict {{dim, metric, engine, params}}")
        unknown = set(spec) - {"dim", "metric", "engine", "params"}
        if unknown:
            raise ValueError(f"vectors[{name!r}]: unknown key(s) {sorted(unknown)} (known: dim, metric, engine, params)")
        if "dim" not in spec:
            raise ValueError(f"vectors[{name!r}] needs a dim")
        dense.append((name, spec["dim"], spec.get("metric", "cosine"), spec.get("engine"), _check_params(dict(spec.get("params") or {}))))
    sparse = []
    for name, spec in (sparse_vectors or {}).items():
        if spec is not None and not isinstance(spec, Mapping):
            raise TypeError(f"sparse_vectors[{name!r}] must be a dict {{modifier}} or None")
        unknown = set(spec or {}) - {"modifier"}
        if unknown:
            raise ValueError(f"sparse_vectors[{name!r}]: unknown key(s) {sorted(unknown)} (known: modifier)")
        sparse.append((name, (spec or {}).get("modifier")))
    return dense, sparse
