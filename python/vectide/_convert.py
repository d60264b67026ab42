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
