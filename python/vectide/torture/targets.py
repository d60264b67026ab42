"""What the torture tools run, derived from the engine registry
(``vectide.engines()``), never from a list of names: a new engine joins the
kill rounds and the corruption matrix by being registered.

- :func:`engine_targets`: every engine that lives in a directory,
  standalone, once per choice of a ``persist`` parameter (``p-hnsw:pmem``,
  ``p-hnsw:msync``);
- :func:`db_targets`: a database collection of each of them (``db:ENGINE``);
- :func:`db_spaces_targets`: a collection of several vector spaces whose
  main one is each of them (``db-spaces:ENGINE``);
- :func:`small_params`: the parameters that make an engine's state
  machinery run within a few hundred points (frequent freezes, merges,
  snapshots and splits), for the ones it takes.
"""

from __future__ import annotations

from typing import Dict, List

# Values that make background machinery run on a few hundred 8-d points;
# each engine gets the ones it takes.
SMALL: Dict[str, object] = {
    "m": 8,
    "ef_construction": 32,
    "r": 8,
    "l_build": 32,
    "pq_bytes": 4,
    "temp_points": 50,
    "merge_points": 300,
    "posting_vectors": 8,
    "snapshot_rows": 64,
}


def _registry() -> List[dict]:
    import vectide

    return list(vectide.engines())


def _choices(param: dict) -> List[str]:
    t = str(param.get("type", ""))
    return [c.strip() for c in t[len("one of "):].split("|")] if t.startswith("one of ") else []


def small_params(engine: str) -> Dict[str, object]:
    """:data:`SMALL`'s values for the parameters ``engine`` takes."""
    desc = next((e for e in _registry() if e["name"] == engine), None)
    if desc is None:
        raise ValueError(f"unknown engine {engine!r}")
    takes = {p["name"] for p in desc["params"]}
    return {k: v for k, v in SMALL.items() if k in takes}


def engine_targets() -> List[str]:
    """Every engine in a directory; ``ENGINE:CHOICE`` per ``persist`` choice."""
    out = []
    for e in _registry():
        if not e["in_directory"]:
            continue
        persist = next((p for p in e["params"] if p["name"] == "persist"), None)
        choices = _choices(persist) if persist else []
        out += [f"{e['name']}:{c}" for c in choices] or [e["name"]]
    return out


def durable_at_flush(target: str) -> bool:
    """Whether the engine of ``ENGINE[:PERSIST]`` makes a write durable only
    at ``flush()`` (its acknowledgement then follows the flush)."""
    engine = target.partition(":")[0]
    desc = next((e for e in _registry() if e["name"] == engine), None)
    return desc is not None and desc["persistence"] == "durable at flush"


def db_targets() -> List[str]:
    """A database collection of every engine that lives in a directory."""
    return [f"db:{e['name']}" for e in _registry() if e["in_directory"]]


def db_spaces_targets() -> List[str]:
    """A database collection of several vector spaces whose main one is
    each engine that lives in a directory (``db-spaces:ENGINE``)."""
    return [f"db-spaces:{e['name']}" for e in _registry() if e["in_directory"]]


def open_kwargs(target: str) -> Dict[str, object]:
    """Parameters of ``ENGINE[:PERSIST]``: the small ones, and ``persist``."""
    engine, _, persist = target.partition(":")
    kw = small_params(engine)
    if persist:
        kw["persist"] = persist
    return kw


def collection_kwargs(engine: str) -> Dict[str, object]:
    """Parameters of a collection of ``engine`` in a torture database: the
    small ones; a ``persist`` choice takes ``msync`` when offered (a file on
    disk, not a pmem device)."""
    kw = small_params(engine)
    desc = next(e for e in _registry() if e["name"] == engine)
    persist = next((p for p in desc["params"] if p["name"] == "persist"), None)
    if persist and "msync" in _choices(persist):
        kw["persist"] = "msync"
    return kw
