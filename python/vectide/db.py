"""The Vectide database from Python: ``vectide.connect(path)``.

Collections hold points: an id (int, UUID string or any other string key), a
vector and a JSON payload. Filters are dicts in Qdrant's shape::

    db = vectide.connect("./data")
    docs = db.create_collection("docs", dim=384, metric="cosine")
    docs.upsert([1, 2], vectors, payloads=[{"city": "Berlin"}, {"city": "Paris"}])
    hits = docs.search(query, k=10, filter={"must": [{"key": "city", "match": {"value": "Berlin"}}]})
    hits[0][0].id, hits[0][0].score, hits[0][0].payload

Every write is durable when the call returns (write-ahead log, fsync; with
``durability="group"`` concurrent writers share one fsync). Scores follow
Qdrant: cosine similarity, dot product, or Euclidean distance (``l2``).

Ids are ``int`` (0 to 2**64-1; numpy integers too), ``str`` or
``uuid.UUID``; anything else is a ``TypeError`` naming its position.
Payload numbers round-trip exactly (integers within -2**63..2**64-1; NaN
and infinities are refused). Sizes have documented bounds
(``vectide.LIMITS``): ``k`` and ``limit`` at most 100,000, ``ef`` at most
100,000, ``dim`` at most 65,536, ``threads`` at most 256, ``nq * k`` of one
call at most 2**24; beyond, ``ValueError``; a non-integer, ``TypeError``.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import numpy as np

from ._convert import _check_params, _groups_body, _native_ids, _point_dicts, _query_body, _rows, _spaces

PointId = Union[int, str, uuid.UUID]

__all__ = ["connect", "Database", "Collection", "Hit", "Group", "Point", "DatabaseLockedError"]


def _native():
    from . import _vectide

    return _vectide


def __getattr__(name):
    if name == "DatabaseLockedError":
        return _native().DatabaseLockedError
    raise AttributeError(name)


@dataclass
class Hit:
    """A search result."""

    id: PointId
    score: float
    distance: float
    payload: Optional[Dict[str, Any]] = None
    vector: Optional[List[float]] = None


@dataclass
class Group:
    """A group of a grouped query: the value its points share at the
    ``group_by`` key (an int or a str) and its hits, best first."""

    id: Union[int, str]
    hits: List[Hit]


@dataclass
class Point:
    """A stored point."""

    id: PointId
    payload: Dict[str, Any]
    vector: Optional[np.ndarray] = None


def _filter(f):
    """A filter as the native call takes it: a dict, JSON text or None."""
    if f is None or isinstance(f, (str, Mapping)):
        return f
    raise TypeError(f"filter must be a dict (or JSON text), got {type(f).__name__}")


def _point(r) -> Point:
    return Point(r[0], r[1], r[2])


class Collection:
    """A named set of points (see the module docs)."""

    def __init__(self, native) -> None:
        self._c = native

    @property
    def name(self) -> str:
        return self._c.name

    def info(self) -> Dict[str, Any]:
        """dim, metric, engine, params, points, indexes, durability, ..."""
        return json.loads(self._c.info())

    def __len__(self) -> int:
        return len(self._c)

    def __repr__(self) -> str:
        i = self.info()
        return f"Collection({i['name']!r}, dim={i['dim']}, metric={i['metric']!r}, engine={i['engine']!r}, points={i['points']})"

    def upsert(self, ids, vectors, payloads: Optional[Sequence[Optional[Dict[str, Any]]]] = None) -> int:
        """Inserts or replaces points; returns the operation's sequence number.
        Ids, vectors and payloads go to the native layer as they are: it
        checks them once (errors name the problem) and stores them."""
        return self._c.upsert(_native_ids(ids), _rows(vectors), payloads)

    def search(
        self,
        vectors,
        k: int = 10,
        filter: Optional[Dict[str, Any]] = None,
        with_payload: bool = True,
        with_vector: bool = False,
        ef: Optional[int] = None,
        exact: bool = False,
        **knobs: int,
    ) -> List[List[Hit]]:
        """The ``k`` nearest points of each query row (a list per query).

        ``ef`` sets the engine's primary search knob (ignored by an engine
        without one, as Qdrant's ``hnsw_ef``); ``exact=True`` scans every
        live point; other keyword arguments are the engine's native knobs
        (``vectide.engines()``), e.g. ``nprobe=32``: one it does not take is
        a ``ValueError`` naming those it does."""
        raw = self._c.search(_rows(vectors), k, _filter(filter), ef, with_payload, with_vector, exact, **knobs)
        return [[Hit(*h) for h in q] for q in raw]

    def search_numpy(
        self, vectors, k: int = 10, filter=None, ef: Optional[int] = None, exact: bool = False, **knobs: int
    ) -> Tuple[np.ndarray, np.ndarray]:
        """Fast path: ``(ids, scores)`` arrays of shape ``(nq, k)``; ids are
        uint64 when every id is an integer (padding ``2**64-1``), else objects
        (padding ``None``); missing scores are NaN. Knobs as in ``search``."""
        # The native call checks k (and nq * k) before anything is allocated here.
        res = self._c.search(_rows(vectors), k, _filter(filter), ef, False, False, exact, **knobs)
        numeric = all(isinstance(h[0], int) for q in res for h in q)
        ids = np.full((len(res), k), np.iinfo(np.uint64).max, dtype=np.uint64) if numeric else np.full((len(res), k), None, dtype=object)
        scores = np.full((len(res), k), np.nan, dtype=np.float32)
        for i, q in enumerate(res):
            for j, h in enumerate(q):
                ids[i, j] = h[0]
                scores[i, j] = h[1]
        return ids, scores

    def get(self, ids, with_vector: bool = True) -> List[Point]:
        """Points by id; raises KeyError naming the ids that are absent."""
        ids = _native_ids(ids)
        raw = self._c.get(ids, with_vector)
        if any(r is None for r in raw):
            want = ids if isinstance(ids, list) else [ids]
            missing = [
                int(i) if isinstance(i, np.integer) else str(i) if isinstance(i, uuid.UUID) else i
                for i, r in zip(want, raw)
                if r is None
            ]
            raise KeyError(f"ids not found: {missing}")
        return [_point(r) for r in raw]

    def delete(self, ids=None, filter: Optional[Dict[str, Any]] = None) -> int:
        """Deletes points by id or by filter; returns how many were removed."""
        return self._c.delete(None if ids is None else _native_ids(ids), _filter(filter))

    def count(self, filter: Optional[Dict[str, Any]] = None) -> int:
        return self._c.count(_filter(filter))

    def scroll(self, filter=None, offset: Optional[PointId] = None, limit: int = 10, with_vector: bool = False):
        """A page of points ordered by id: ``(points, next_offset)``."""
        points, next_offset = self._c.scroll(_filter(filter), offset, limit, with_vector)
        return [_point(r) for r in points], next_offset

    def upsert_points(self, points) -> int:
        """Inserts or replaces points given as dicts ``{"id", "vector",
        "payload"}``: the vector a list or array (the unnamed space) or, in a
        collection of named or sparse vectors, ``{"NAME": list | array |
        {"indices": [...], "values": [...]}}`` (a point may lack spaces; an
        upsert replaces the whole point). Returns the sequence number."""
        return self._c.upsert_points(_point_dicts(points))

    def query(self, query=None, *, prefetch=None, using: Optional[str] = None, filter=None, limit: int = 10,
              offset: int = 0, score_threshold: Optional[float] = None, with_payload: bool = True,
              with_vector=False, params: Optional[Dict[str, Any]] = None) -> List[Hit]:
        """The Query API (Qdrant's ``query_points``): ``query`` is a dense
        vector, a sparse vector ``{"indices", "values"}``, a point id,
        ``{"nearest": ...}`` (re-ranked by maximal marginal relevance with
        ``"mmr": {"diversity": 0..1, "candidates_limit": N}``), ``{"fusion":
        "rrf" | "dbsf"}`` or ``{"rrf": {"k": K, "weights": [one per
        prefetch]}}``; ``prefetch`` a dict or list of dicts of the same keys
        (nested); ``using`` the vector's name; ``with_vector`` a bool or
        names; ``params`` ``{"hnsw_ef", "exact", "vectide": {...}}``. Hits
        carry the score (their ``distance`` is NaN: a fused score has none)
        and, when asked, the vector: a list, or ``{"NAME": vector}`` outside
        the single form."""
        body = _query_body(query, prefetch, using, filter, limit, offset, score_threshold, with_payload, with_vector, params)
        return [Hit(i, s, float("nan"), p, v) for i, s, p, v in self._c.query(body)]

    def query_groups(self, group_by: str, query=None, *, prefetch=None, using: Optional[str] = None, filter=None,
                     limit: int = 10, group_size: int = 3, score_threshold: Optional[float] = None,
                     with_payload: bool = True, with_vector=False, params: Optional[Dict[str, Any]] = None) -> List[Group]:
        """A grouped query (Qdrant's ``query_points_groups``): the query as
        ``query`` takes it, its points put in groups by their value(s) at
        the key path ``group_by`` (an int or a str; each element of an
        array; a point holding another value there joins no group). The
        first ``limit`` groups to appear, ordered by their best hit, with at
        most ``group_size`` hits each; prefetch limits are lifted to the
        whole collection, as in Qdrant's local mode."""
        body = _groups_body(group_by, query, prefetch, using, filter, limit, group_size, score_threshold, with_payload,
                            with_vector, params)
        return [Group(g, [Hit(i, s, float("nan"), p, v) for i, s, p, v in hits]) for g, hits in self._c.query_groups(body)]

    def set_payload(self, payload: Dict[str, Any], ids=None, filter=None, key: Optional[str] = None) -> int:
        """Merges ``payload``'s keys into the selected points' payloads (a
        None value removes its key); at the key path ``key`` when given
        (``"meta"``, ``"items[].tags"``)."""
        if key is None:
            return self._c.set_payload(payload, None if ids is None else _native_ids(ids), _filter(filter))
        return self._c.edit_payload("set", payload, key, None if ids is None else _native_ids(ids), _filter(filter))

    def overwrite_payload(self, payload: Dict[str, Any], ids=None, filter=None) -> int:
        """Replaces the selected points' payloads."""
        return self._c.edit_payload("overwrite", payload, None, None if ids is None else _native_ids(ids), _filter(filter))

    def delete_payload(self, keys: Sequence[str], ids=None, filter=None) -> int:
        """Removes the key paths ``keys`` from the selected points' payloads."""
        return self._c.edit_payload("delete", list(keys), None, None if ids is None else _native_ids(ids), _filter(filter))

    def clear_payload(self, ids=None, filter=None) -> int:
        """Empties the selected points' payloads."""
        return self._c.edit_payload("clear", None, None, None if ids is None else _native_ids(ids), _filter(filter))

    def create_index(self, field: str, schema: str = "keyword") -> None:
        """A payload index on ``field``: ``"keyword"`` or ``"integer"``."""
        self._c.create_index(field, schema)

    def checkpoint(self) -> None:
        self._c.checkpoint()

    def maintain(self) -> None:
        """Runs the engine's pending maintenance now (a delete
        consolidation, a merge, a rebuild); writes and searches go on."""
        self._c.maintain()


class Database:
    """A database directory opened by this process (locked against others)."""

    def __init__(self, native) -> None:
        self._db = native

    @property
    def path(self) -> str:
        return self._db.path

    def create_collection(
        self, name: str, dim: Optional[int] = None, metric: str = "cosine", engine: Optional[str] = None, *,
        vectors: Optional[Dict[str, Dict[str, Any]]] = None, sparse_vectors: Optional[Dict[str, Any]] = None, **params
    ) -> Collection:
        """A new collection; ``engine`` is one of ``vectide.engines()`` (default
        ``vectide.DEFAULT_ENGINE``) and ``params`` its parameters.

        Named vectors instead of one: ``vectors={"NAME": {"dim", "metric",
        "engine", "params"}}`` (each space its own engine) and sparse ones
        ``sparse_vectors={"NAME": {"modifier": "idf"} or None}``; then
        ``dim``, ``engine`` and ``params`` are not given."""
        from . import _vectide

        if vectors is None and sparse_vectors is None:
            if dim is None:
                raise TypeError("create_collection needs dim (or vectors / sparse_vectors)")
            return Collection(self._db.create_collection(name, dim, metric, engine or _vectide.DEFAULT_ENGINE, _check_params(params)))
        if dim is not None or engine is not None or params:
            raise TypeError("with vectors / sparse_vectors, give each space's dim, engine and params there")
        dense, sparse = _spaces(vectors, sparse_vectors)
        dense = [(n, d, m, e or _vectide.DEFAULT_ENGINE, p) for n, d, m, e, p in dense]
        return Collection(self._db.create_collection_spaces(name, dense, sparse))

    def get_collection(self, name: str) -> Collection:
        return Collection(self._db.collection(name))

    def list_collections(self) -> List[str]:
        return self._db.list_collections()

    def delete_collection(self, name: str) -> bool:
        return self._db.delete_collection(name)

    def flush(self) -> None:
        """Checkpoints every collection."""
        self._db.flush()

    def close(self) -> None:
        """Checkpoints and closes every collection and releases the directory
        lock (another process may then open it). Collection handles then
        raise ``RuntimeError``. Idempotent; ``with vectide.connect(p) as db:``
        calls it on exit."""
        self._db.close()

    def __enter__(self) -> "Database":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Database({self.path!r}, collections={self.list_collections()})"


def connect(path: Union[str, Path], durability: str = "group", threads: Optional[int] = None, **options) -> Database:
    """Opens (creating if needed) the database in ``path``.

    ``durability``: ``"group"`` (default: when several writers are active,
    the fsync waits up to 2 ms for them to join; a lone writer never waits)
    or ``"always"`` (the fsync starts at once); in both, a write returns only
    after an fsync that covers it. ``options``:
    ``checkpoint_bytes``, ``checkpoint_seconds``, and ``one_log`` (default
    ``True``: engines that keep a redo log of their own, such as
    ``fresh-diskann`` and ``spfresh``, hand it to the collection's log and
    persist only their checkpoints; ``False`` keeps both logs, as before
    there was one, for comparisons).
    """
    known = ("checkpoint_bytes", "checkpoint_seconds", "one_log")
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise TypeError(f"unknown database option(s) {', '.join(unknown)}; known: {', '.join(known)}")
    one_log = options.get("one_log", True)
    if not isinstance(one_log, bool):
        raise TypeError(f"one_log must be True or False, got {one_log!r}")
    return Database(
        _native()._Database.open(
            Path(path), durability, threads, options.get("checkpoint_bytes"), options.get("checkpoint_seconds"), one_log
        )
    )
