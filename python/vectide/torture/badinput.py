"""The bad-input matrix: absurd inputs over HTTP and from Python.

``python -m vectide.torture badinput [--quick]`` starts ``vectide serve`` on
127.0.0.1 (``.venv/bin/vectide``, the binary beside this Python) and an
embedded database in a temporary directory, fills each with the same small
collection, and throws a matrix of bad inputs at them:

- every numeric parameter that arrives from outside (``k``, ``limit``,
  ``offset``, ``ef``/``hnsw_ef``, ``dim``/``vectors.size``, ``m``,
  ``ef_construction``, ``ef_search``, ``threads``, ``nlog_entries``,
  ``nlist_entries``, ``initial_capacity``, ``snapshot_every``,
  ``wal_buffer``, ``checkpoint_seconds`` …) given negative, beyond its
  documented bound (``vectide.LIMITS``), beyond 64 bits, as a float, a
  string, a bool, a list;
- ids of the wrong type (float, null, bool, object, bytes), negative or
  beyond 2**64-1; NaN/inf/overflowing vectors, wrong dimensions;
- payloads that JSON cannot keep exactly (NaN, integers beyond 64 bits),
  deeply nested payloads and filters, malformed filters;
- malformed JSON, bodies that are not objects, wrong content types, bodies
  over the limit, unknown routes, methods, collections, engines and
  parameters, bad collection names, bad API keys;
- the same through ``vectide.Client`` (Python over HTTP);
- raw frames to a memory node (``vectide memnode``, d-HNSW's remote
  memory): ``badinput_memnode``.

Each case must be refused cleanly: Python raises the documented exception
type (``TypeError`` for a wrong type, ``ValueError`` for a bad value,
``KeyError`` for a missing id or collection) with a message naming the
parameter; HTTP answers 4xx with a JSON error body. And nothing else may
happen: no panic, no 5xx, the process stays alive (the Python cases run in a
child process that is restarted if it dies, and the case is counted as
failed), no thread explosion, and the state is unchanged (collections, point
count, every point's id, vector and payload compared before and after).

The report (``run(args)``) is a JSON-able dict: ``summary`` {cases, passed,
failed, by_surface} and ``cases`` (one record per case: surface, group,
name, expectation, what happened, problems).
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

DIM = 4
N = 20
BODY_LIMIT_MB = 4
API_KEY = "s3cret-Key-0123456789"

# The documented bounds; read from the extension (vectide.LIMITS) when it
# has them, so that the matrix follows the code.
_DEFAULT_LIMITS = {
    "MAX_K": 100_000,
    "MAX_BATCH_RESULTS": 1 << 24,
    "MAX_EF": 100_000,
    "MAX_DIM": 65_536,
    "MIN_M": 2,
    "MAX_M": 256,
    "MAX_THREADS": 256,
    "MAX_NLOG_ENTRIES": 4096,
    "MAX_NLIST_ENTRIES": 65_536,
    "MAX_INITIAL_CAPACITY": 1 << 24,
    "MAX_SNAPSHOT_EVERY": 1 << 40,
    "MAX_WAL_BUFFER": 1 << 30,
    "MAX_CHECKPOINT_SECONDS": 365.0 * 86_400.0,
}


def limits() -> Dict[str, Any]:
    out = dict(_DEFAULT_LIMITS)
    try:
        from vectide import _vectide

        out.update(getattr(_vectide, "LIMITS", {}))
    except ImportError:
        pass
    return out


L = limits()


def add_arguments(p: argparse.ArgumentParser) -> None:
    # SUPPRESS: `python -m vectide.torture --quick badinput` sets it on the
    # parent parser; this one must not reset it.
    p.add_argument("--quick", action="store_true", default=argparse.SUPPRESS,
                   help="fewer values per parameter (the CI size)")
    p.add_argument("--surfaces", default="http,python,client,memnode",
                   help="comma-separated subset of http, python, client, memnode")
    p.add_argument("--cli", default=None, help="the vectide binary (default: beside this Python)")
    p.add_argument("--verbose", action="store_true", help="print every case")


# ---------------------------------------------------------------- value families

def deep(depth: int, leaf: Any = 1) -> Any:
    """A payload nested ``depth`` levels deep (built without recursion)."""
    v = leaf
    for _ in range(depth):
        v = {"a": v}
    return v


def deep_filter(depth: int) -> Dict[str, Any]:
    f: Dict[str, Any] = {"must": [{"key": "i", "match": {"value": 1}}]}
    for _ in range(depth):
        f = {"must": [f]}
    return f


def bad_py_ints(lo: int, hi: int, quick: bool) -> List[Tuple[Any, type]]:
    """(value, expected exception) for an integer argument in lo..=hi."""
    out: List[Tuple[Any, type]] = [(hi + 1, ValueError), (2**64, ValueError), (lo - 1, ValueError)]
    if 10**10 > hi:
        # It fits in 64 bits: code that allocates by the value aborts on it.
        out.append((10**10, ValueError))
    if lo - 1 != -1:
        out.append((-1, ValueError))
    out += [(1.5, TypeError), ("8", TypeError), (True, TypeError)]
    if not quick:
        out += [(10**30, ValueError), (-(2**63) - 1, ValueError), (2**63, ValueError),
                (np.int64(hi) + np.int64(1) if hi < 2**62 else 2**62 * 4, ValueError),
                (float(hi), TypeError), (float("nan"), TypeError), (float("inf"), TypeError),
                ([1], TypeError), (b"8", TypeError), (np.float32(2.0), TypeError), (False, TypeError)]
    return out


def bad_json_ints(lo: int, hi: int, quick: bool) -> List[Tuple[str, bool]]:
    """(JSON literal, whether the error must name the field) for an integer
    field in lo..=hi (null is left out: it means "default")."""
    out = [(str(hi + 1), True), (str(2**64), True), (str(lo - 1), True), ("1.5", True), ('"8"', True), ("true", True)]
    if 10**10 > hi:
        out.append((str(10**10), True))
    if lo - 1 != -1:
        out.append(("-1", True))
    if not quick:
        out += [(str(10**30), True), ("-9223372036854775809", True), (f"{hi}.0", True), ("1e3", True),
                ("[1]", True), ("{}", True), ("false", True), ("1e400", False)]
    return out


# ---------------------------------------------------------------- cases and results

@dataclass
class Result:
    surface: str
    group: str
    name: str
    expect: str
    got: str = ""
    problems: List[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.problems

    def record(self) -> Dict[str, Any]:
        return {"surface": self.surface, "group": self.group, "case": self.name, "expect": self.expect,
                "got": self.got[:300], "ok": self.ok, "problems": self.problems, "seconds": round(self.seconds, 4)}


@dataclass
class PyCase:
    group: str
    name: str
    fn: Callable[["PyFixture"], Any]
    expect: Any  # an exception class or a (nested) tuple of them
    needle: Optional[str] = None

    def __post_init__(self) -> None:
        flat: List[type] = []
        todo = [self.expect]
        while todo:
            e = todo.pop()
            if isinstance(e, tuple):
                todo.extend(e)
            else:
                flat.append(e)
        self.expect = tuple(flat)


def _exc_names(expect: Sequence[type]) -> str:
    return "/".join(e.__name__ for e in expect)


# ---------------------------------------------------------------- Python (embedded)

class PyFixture:
    """An Index and a database collection with the same N points."""

    def __init__(self, work: Path) -> None:
        import vectide

        self.vectide = vectide
        self.work = work
        work.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng(3)
        self.X = rng.standard_normal((N, DIM)).astype(np.float32)
        self.index = vectide.Index(DIM, metric="l2", m=8, ef_construction=32)
        self.index.add(np.arange(N), self.X)
        self.saved = work / "saved.vtdx"
        self.index.save(self.saved)
        self.db = vectide.connect(work / "db")
        self.col = self.db.create_collection("c", dim=DIM, metric="l2", m=8, ef_construction=32)
        self.ids: List[Any] = list(range(N - 3)) + ["key-a", uuid.UUID(int=7), 2**64 - 1]
        payloads = [{"i": i, "f": 15028.519667320139, "s": "x" * (i % 3), "big": 2**64 - 1, "neg": -(2**63)}
                    for i in range(N)]
        self.col.upsert(self.ids, self.X, payloads=payloads)
        # A collection of a named dense vector and a sparse one.
        self.multi = self.db.create_collection("m", vectors={"d": {"dim": DIM, "metric": "ip"}},
                                               sparse_vectors={"s": {"modifier": "idf"}})
        self.multi.upsert_points([{"id": i, "vector": {"d": self.X[i], "s": {"indices": [i % 5, 9], "values": [1.0, 0.5]}},
                                   "payload": {"i": i}} for i in range(20)])
        self.q = self.X[0]
        self.n_dirs = 0
        self.case_dir = self.fresh_dir()

    def fresh_dir(self) -> Path:
        """A directory for the case's durable engine or database: it must
        hold nothing after a refused call."""
        self.n_dirs += 1
        return self.work / f"scratch-{self.n_dirs}"

    def state(self) -> str:
        idx = self.index
        ids, dist = idx.search(self.q, k=5)
        points, _ = self.col.scroll(limit=1000, with_vector=True)
        raw = [(p.id, p.payload, p.vector.tolist()) for p in points]
        multi, _ = self.multi.scroll(limit=1000, with_vector=True)
        mraw = [(p.id, p.payload, p.vector["d"].tolist(), p.vector["s"]) for p in multi]
        parts = [len(idx), idx.get(np.arange(N)).tobytes().hex(), ids.tolist(), dist.tolist(), idx.ef_search,
                 self.db.list_collections(), len(self.col), raw, mraw]
        return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()


def python_cases(quick: bool) -> List[PyCase]:
    """The embedded matrix (a pure function of ``quick``, so that a
    restarted child process finds the same case at the same position)."""
    cases: List[PyCase] = []
    add = cases.append
    TE, VE, KE = (TypeError,), (ValueError,), (KeyError,)
    EITHER = (TypeError, ValueError)

    def r(v: Any) -> str:
        try:
            s = repr(v)
        except RecursionError:
            s = f"<{type(v).__name__} nested too deeply to print>"
        return s if len(s) <= 40 else s[:37] + "..."

    # Index(dim=...)
    for v, e in bad_py_ints(1, L["MAX_DIM"], quick):
        add(PyCase("Index", f"Index(dim={r(v)})", lambda fx, v=v: fx.vectide.Index(v), (e,), "dim"))
    add(PyCase("Index", "Index(dim=None)", lambda fx: fx.vectide.Index(None), TE, "dim"))
    add(PyCase("Index", "Index(metric='hamming')", lambda fx: fx.vectide.Index(DIM, metric="hamming"), VE, "metric"))
    add(PyCase("Index", "Index(engine='faiss')", lambda fx: fx.vectide.Index(DIM, engine="faiss"), VE, "engine"))
    add(PyCase("Index", "Index(M=3) unknown param", lambda fx: fx.vectide.Index(DIM, M=3), VE, "unknown parameter"))
    add(PyCase("Index", "Index(path=...) on hnsw", lambda fx: fx.vectide.Index(DIM, path=str(fx.case_dir)), VE, "path"))
    # Engine parameters, per engine.
    graph = {"m": (L["MIN_M"], L["MAX_M"]), "ef_construction": (1, L["MAX_EF"]),
             "ef_search": (1, L["MAX_EF"]), "threads": (1, L["MAX_THREADS"])}
    per_engine = {
        "hnsw": graph,
        "p-hnsw": {**({} if quick else graph), "threads": (1, L["MAX_THREADS"]),
                   "nlog_entries": (1, L["MAX_NLOG_ENTRIES"]),
                   "nlist_entries": (1, L["MAX_NLIST_ENTRIES"]),
                   "initial_capacity": (0, L["MAX_INITIAL_CAPACITY"])},
        "hnsw-wal": {"snapshot_every": (0, L["MAX_SNAPSHOT_EVERY"]), "wal_buffer": (0, L["MAX_WAL_BUFFER"]),
                     "threads": (1, L["MAX_THREADS"])},
    }
    for engine, params in per_engine.items():
        for p, (lo, hi) in params.items():
            for v, e in bad_py_ints(lo, hi, quick):
                expect = VE if e is ValueError else EITHER

                def make(fx, engine=engine, p=p, v=v):
                    kw = {p: v}
                    if engine != "hnsw":
                        kw["path"] = str(fx.case_dir)
                    if engine == "p-hnsw":
                        kw["persist"] = "msync"
                    return fx.vectide.Index(DIM, metric="l2", engine=engine, **kw)

                add(PyCase("Index params", f"Index(engine={engine!r}, {p}={r(v)})", make, expect, p))
    # A preallocation bounded in bytes, not only in rows.
    add(PyCase("Index params", "p-hnsw initial_capacity x dim beyond 64 GiB",
               lambda fx: fx.vectide.Index(L["MAX_DIM"], engine="p-hnsw", path=str(fx.case_dir),
                                            persist="msync", initial_capacity=L["MAX_INITIAL_CAPACITY"]),
               VE, "initial_capacity"))
    # search
    for v, e in bad_py_ints(1, L["MAX_K"], quick):
        add(PyCase("Index.search", f"search(k={r(v)})", lambda fx, v=v: fx.index.search(fx.q, k=v), (e,), "k"))
    for v, e in bad_py_ints(1, L["MAX_EF"], quick):
        add(PyCase("Index.search", f"search(ef={r(v)})", lambda fx, v=v: fx.index.search(fx.q, k=5, ef=v), (e,), "ef"))
    nq = L["MAX_BATCH_RESULTS"] // L["MAX_K"] + 1
    add(PyCase("Index.search", f"search({nq} queries, k=MAX_K): nq*k beyond the batch bound",
               lambda fx: fx.index.search(np.ones((nq, DIM), np.float32), k=L["MAX_K"]), VE, "split"))
    add(PyCase("Index.search", "search(wrong dim)", lambda fx: fx.index.search(np.ones(DIM + 1)), VE, "dimension"))
    add(PyCase("Index.search", "search(NaN query)", lambda fx: fx.index.search(np.full(DIM, np.nan)), VE, "finite|nan"))
    add(PyCase("Index.search", "search(inf query)", lambda fx: fx.index.search(np.full(DIM, np.inf)), VE, "finite|inf"))
    add(PyCase("Index.search", "search(3-D queries)", lambda fx: fx.index.search(np.ones((1, 1, DIM))), VE, "dimensions"))
    add(PyCase("Index.search", "search(string query)", lambda fx: fx.index.search(["a"] * DIM), EITHER, "float32|queries"))
    add(PyCase("Index.search", "search(filter=[1.5])", lambda fx: fx.index.search(fx.q, filter=[1.5]), TE, "position 0"))
    add(PyCase("Index.search", "search(filter='x')", lambda fx: fx.index.search(fx.q, filter="x"), TE, "ids"))
    for v, e in bad_py_ints(1, L["MAX_EF"], quick):
        def set_ef(fx, v=v):
            fx.index.ef_search = v
        add(PyCase("Index.ef_search", f"ef_search = {r(v)}", set_ef, (e,), "ef_search"))
    for v, e in bad_py_ints(1, L["MAX_THREADS"], quick):
        add(PyCase("Index.load", f"load(threads={r(v)})", lambda fx, v=v: fx.vectide.Index.load(fx.saved, threads=v), (e,), "threads"))
    add(PyCase("Index.load", "load(missing file)", lambda fx: fx.vectide.Index.load(fx.work / "missing.vtdx"), (FileNotFoundError,), "missing"))

    def load_junk(fx):
        p = fx.work / "junk.vtdx"
        p.write_bytes(b"not an index at all")
        return fx.vectide.Index.load(p)

    add(PyCase("Index.load", "load(junk file)", load_junk, VE, "index"))
    # add: ids and vectors
    one = lambda: np.ones((1, DIM), np.float32)  # noqa: E731
    for ids, e, needle in [
        ([1.5], TE, "position 0"), ([0, None], TE, "position 1"), ([True], TE, "position 0"),
        (np.array(["a"]), TE, "dtype"), (np.array([1.0]), TE, "float"), (2.5, TE, "float"), ([-1], VE, "non-negative"),
        ([2**64], VE, "2\\*\\*64"), ([2**64 - 1], VE, "reserved"), ([[1]], VE, "1-D"),
        ([uuid.UUID(int=1)], TE, "position 0"), ([b"x"], TE, "position 0"),
    ]:
        add(PyCase("Index.add", f"add(ids={r(ids)})", lambda fx, ids=ids: fx.index.add(ids, np.ones((len(ids), DIM))), e, needle))
    for vecs, needle in [
        (np.full((1, DIM), np.nan), "finite|nan"), (np.full((1, DIM), np.inf), "finite|inf"),
        (np.full((1, DIM), 1e39), "finite|inf"), (np.ones((1, DIM + 1)), "dimension"),
        (np.ones((1, 1, DIM)), "dimensions"), (np.ones((2, DIM)), "ids|vectors"),
    ]:
        add(PyCase("Index.add", f"add(vectors {vecs.shape} {vecs.flat[0]})", lambda fx, vecs=vecs: fx.index.add([100], vecs), VE, needle))
    add(PyCase("Index.add", "add(duplicate ids)", lambda fx: fx.index.add([100, 100], np.ones((2, DIM))), VE, "duplicate"))
    add(PyCase("Index.add", "add(string vectors)", lambda fx: fx.index.add([100], [["a"] * DIM]), EITHER, "vectors"))
    add(PyCase("Index.get", "get([1.5])", lambda fx: fx.index.get([1.5]), TE, "position 0"))
    add(PyCase("Index.get", "get(missing id)", lambda fx: fx.index.get([12345]), KE, "12345"))
    add(PyCase("Index.delete", "delete([None])", lambda fx: fx.index.delete([None]), TE, "position 0"))
    add(PyCase("Index.delete", "delete([-3])", lambda fx: fx.index.delete([-3]), VE, "non-negative"))

    # connect()
    for v, e in bad_py_ints(1, L["MAX_THREADS"], quick):
        add(PyCase("connect", f"connect(threads={r(v)})", lambda fx, v=v: fx.vectide.connect(fx.case_dir, threads=v).close(), (e,), "threads"))
    for v, e in [(0, VE), (-1, VE), (1e300, VE), (float("nan"), VE), (float("inf"), VE), ("5", TE), (True, TE)]:
        add(PyCase("connect", f"connect(checkpoint_seconds={r(v)})", lambda fx, v=v: fx.vectide.connect(fx.case_dir, checkpoint_seconds=v).close(), (e,), "checkpoint_seconds"))
    for v, e in [(-1, VE), (2**64, VE), (1.5, TE), ("x", TE)]:
        add(PyCase("connect", f"connect(checkpoint_bytes={r(v)})", lambda fx, v=v: fx.vectide.connect(fx.case_dir, checkpoint_bytes=v).close(), (e,), "checkpoint_bytes"))
    add(PyCase("connect", "connect(durability='sometimes')", lambda fx: fx.vectide.connect(fx.case_dir, durability="sometimes").close(), VE, "durability"))
    for v in [1, "yes", None]:
        add(PyCase("connect", f"connect(one_log={r(v)})", lambda fx, v=v: fx.vectide.connect(fx.case_dir, one_log=v).close(), TE, "one_log"))
    add(PyCase("connect", "connect(chekpoint_bytes=1)", lambda fx: fx.vectide.connect(fx.case_dir, chekpoint_bytes=1).close(), TE, "chekpoint_bytes"))

    # create_collection
    for v, e in bad_py_ints(1, L["MAX_DIM"], quick):
        add(PyCase("create_collection", f"create_collection(dim={r(v)})", lambda fx, v=v: fx.db.create_collection("bad", dim=v), (e,), "dim"))
    for engine, params in per_engine.items():
        for p, (lo, hi) in params.items():
            for v, e in bad_py_ints(lo, hi, quick):
                if isinstance(v, bytes):
                    continue  # not JSON: covered below
                expect = VE if e is ValueError else EITHER
                add(PyCase("create_collection params", f"create_collection(engine={engine!r}, {p}={r(v)})",
                           lambda fx, engine=engine, p=p, v=v: fx.db.create_collection("bad", dim=DIM, engine=engine, **{p: v}),
                           expect, p))
    for name, kw, e, needle in [
        ("unknown engine", {"engine": "faiss"}, VE, "engine"),
        ("unknown param", {"M": 3}, VE, "unknown parameter"),
        ("path param", {"path": "/tmp/x"}, VE, "path"),
        ("log param", {"engine": "fresh-diskann", "log": "own"}, VE, "log"),
        ("metric", {"metric": "hamming"}, VE, "metric"),
        ("bytes param", {"m": b"8"}, TE, "bytes"),
        ("nan param", {"consolidate_fraction": float("nan")}, VE, "JSON|nan"),
    ]:
        add(PyCase("create_collection", f"create_collection({name})", lambda fx, kw=kw: fx.db.create_collection("bad", dim=DIM, **kw), (e,), needle))
    for name in ["", "../etc", "a/b", "x" * 65, ".hidden", "a b", "nul\x00"]:
        add(PyCase("create_collection", f"create_collection(name={r(name)})", lambda fx, name=name: fx.db.create_collection(name, dim=DIM), VE, "name"))
    add(PyCase("create_collection", "create_collection(existing)", lambda fx: fx.db.create_collection("c", dim=DIM), VE, "exists"))
    add(PyCase("database", "get_collection(missing)", lambda fx: fx.db.get_collection("nope"), KE, "nope"))
    add(PyCase("database", "delete_collection(5)", lambda fx: fx.db.delete_collection(5), TE, None))

    # Collection.upsert: ids
    for ids, e, needle in [
        ([1.0], TE, "position 0"), ([None], TE, "position 0"), ([1, 2.5], TE, "position 1"),
        ([True], TE, "position 0"), ([b"id"], TE, "position 0"), ([{"id": 1}], TE, "position 0"),
        ([[1]], TE, "position 0"), ([object()], TE, "position 0"), ([np.float64(3)], TE, "position 0"),
        ([-1], VE, "position 0"), ([2**64], VE, "position 0"), (b"ab", TE, "bytes"), ({1: 2}, TE, "dict"),
        (3.5, TE, "float"), ([""], VE, "1..=1024|string"), (["x" * 2000], VE, "1..=1024|string"),
        ([5, 5], VE, "duplicate|twice"),
    ]:
        n = len(ids) if isinstance(ids, list) else 1
        add(PyCase("Collection.upsert ids", f"upsert(ids={r(ids)})", lambda fx, ids=ids, n=n: fx.col.upsert(ids, np.ones((n, DIM))), (e,), needle))
    # vectors
    for vecs, needle in [
        (np.full((1, DIM), np.nan), "finite|nan"), (np.full((1, DIM), np.inf), "finite|inf"),
        (np.full((1, DIM), 1e39), "finite|inf"), (np.ones((1, DIM + 1)), "dimension"),
        (np.ones((2, DIM)), "ids|vectors"), (np.ones((1, 1, DIM)), "dimensions"),
    ]:
        add(PyCase("Collection.upsert vectors", f"upsert(vectors {vecs.shape} {vecs.flat[0]})", lambda fx, vecs=vecs: fx.col.upsert([100], vecs), VE, needle))
    # payloads
    for pl, e, needle in [
        ([[1, 2]], VE, "object"), (["x"], VE, "object"), ([5], VE, "object"),
        ([{"a": float("nan")}], VE, "payload|JSON"), ([{"a": float("inf")}], VE, "payload|JSON"),
        ([{"a": 2**70}], VE, "2\\*\\*64"), ([{"a": -(2**63) - 1}], VE, "2\\*\\*63"),
        ([{"a": {1, 2}}], TE, "set|serializable"), ([{"a": b"x"}], TE, "bytes|serializable"),
        ([deep(200)], VE, "recursion|nested|deep"), ([deep(100_000)], VE, "nested|deep|recursion"),
        ([{}, {}], VE, "payloads"),
    ]:
        add(PyCase("Collection.upsert payloads", f"upsert(payloads={r(pl)[:40]})", lambda fx, pl=pl: fx.col.upsert([100], one(), payloads=pl), (e,), needle))
    # search
    for v, e in bad_py_ints(1, L["MAX_K"], quick):
        add(PyCase("Collection.search", f"search(k={r(v)})", lambda fx, v=v: fx.col.search(fx.q, k=v), (e,), "k"))
        add(PyCase("Collection.search_numpy", f"search_numpy(k={r(v)})", lambda fx, v=v: fx.col.search_numpy(fx.q, k=v), (e,), "k"))
    for v, e in bad_py_ints(1, L["MAX_EF"], quick):
        add(PyCase("Collection.search", f"search(ef={r(v)})", lambda fx, v=v: fx.col.search(fx.q, k=3, ef=v), (e,), "ef"))
    add(PyCase("Collection.search", f"search({nq} queries, k=MAX_K)", lambda fx: fx.col.search(np.ones((nq, DIM)), k=L["MAX_K"]), VE, "split"))
    add(PyCase("Collection.search", "search(wrong dim)", lambda fx: fx.col.search(np.ones(DIM + 1)), VE, "dimension"))
    add(PyCase("Collection.search", "search(NaN)", lambda fx: fx.col.search(np.full(DIM, np.nan)), VE, "finite|nan"))
    for f, e, needle in [
        ({"must": "x"}, VE, "must"), ({"must": [{"key": "a", "regex": "x"}]}, VE, "operator"),
        ({"bogus": []}, VE, "bogus"), ([1], TE, "filter"), (5, TE, "filter"),
        (deep_filter(40), VE, "deeper|nested"), (deep_filter(100_000), VE, "nested|deep|recursion"),
        ({"must": [{"key": "i", "range": {"gt": "x"}}]}, VE, "range|number|gt"),
        ({"must": [{"key": "i", "match": {"value": 2**70}}]}, VE, "2\\*\\*64"),
        ({"must": [{"has_id": [1.5]}]}, VE, "id"), ("{not json", VE, "JSON"),
    ]:
        add(PyCase("Collection.search filter", f"search(filter={r(f)[:40]})", lambda fx, f=f: fx.col.search(fx.q, filter=f), (e,), needle))
    # scroll, get, delete, set_payload, create_index
    for v, e in bad_py_ints(0, L["MAX_K"], quick):
        add(PyCase("Collection.scroll", f"scroll(limit={r(v)})", lambda fx, v=v: fx.col.scroll(limit=v), (e,), "limit"))
    for off, e in [(1.5, TE), (None, None), (True, TE), ([1], TE), (-1, VE)]:
        if e is None:
            continue
        add(PyCase("Collection.scroll", f"scroll(offset={r(off)})", lambda fx, off=off: fx.col.scroll(offset=off), (e,), "id|offset"))
    add(PyCase("Collection.get", "get([1.5])", lambda fx: fx.col.get([1.5]), TE, "position 0"))
    add(PyCase("Collection.get", "get(['missing'])", lambda fx: fx.col.get(["missing"]), KE, "missing"))
    add(PyCase("Collection.delete", "delete()", lambda fx: fx.col.delete(), VE, "ids or a filter"))
    add(PyCase("Collection.delete", "delete([None])", lambda fx: fx.col.delete([None]), TE, "position 0"))
    add(PyCase("Collection.delete", "delete(filter=bad)", lambda fx: fx.col.delete(filter={"must": [{"key": "a", "regex": "x"}]}), VE, "operator"))
    add(PyCase("Collection.set_payload", "set_payload([1])", lambda fx: fx.col.set_payload([1], ids=[0]), VE, "object"))
    add(PyCase("Collection.set_payload", "set_payload(NaN)", lambda fx: fx.col.set_payload({"a": float("nan")}, ids=[0]), VE, "payload|JSON"))
    add(PyCase("Collection.set_payload", "set_payload(big int)", lambda fx: fx.col.set_payload({"a": -(2**64)}, ids=[0]), VE, "2\\*\\*63"))
    add(PyCase("Collection.set_payload", "set_payload(ids=[1.5])", lambda fx: fx.col.set_payload({"a": 1}, ids=[1.5]), TE, "position 0"))
    add(PyCase("Collection.create_index", "create_index(kind='fulltext')", lambda fx: fx.col.create_index("s", "fulltext"), VE, "fulltext|keyword"))
    # named and sparse vectors, the Query API, payload edits
    def pt(vector):
        return [{"id": 500, "vector": vector, "payload": {"i": 500}}]

    d = [1.0] * DIM
    for vec, e, needle in [
        ({"s": {"indices": [1, 2], "values": [1.0]}}, VE, "as many values"),
        ({"s": {"indices": [1, 1], "values": [1.0, 2.0]}}, VE, "twice"),
        ({"s": {"indices": [-1], "values": [1.0]}}, VE, "indices\\[0\\]"),
        ({"s": {"indices": [1], "values": [float("nan")]}}, VE, "values|finite|JSON"),
        ({"nope": d}, VE, "no vector named"),
        ({"d": d[:-1]}, VE, "dimension"),
        ({"d": {"indices": [1], "values": [1.0]}}, VE, "dense"),
        ({"s": d}, VE, "sparse"),
        (d, VE, "no vector named"),
    ]:
        add(PyCase("Collection.upsert_points", f"upsert_points(vector={r(vec)})", lambda fx, vec=vec: fx.multi.upsert_points(pt(vec)), (e,), needle))
    add(PyCase("Collection.upsert_points", "upsert_points(point without id)", lambda fx: fx.multi.upsert_points([{"vector": {"d": d}}]), VE, "id"))
    add(PyCase("Collection.upsert_points", "upsert_points(not a list)", lambda fx: fx.multi.upsert_points({"id": 1}), TE, "list"))
    for kw, e, needle in [
        (dict(query={"fusion": "rrf"}), VE, "prefetch"),
        (dict(query={"indices": [1, 1], "values": [1.0, 1.0]}, using="s"), VE, "twice"),
        (dict(query=d, using="nope"), VE, "nope"),
        (dict(query=d, using="d", filter={"must": [{"key": "a[", "match": {"value": 1}}]}), VE, "key path"),
        (dict(query=d, using="d", limit=L["MAX_K"] + 1), VE, "limit"),
        (dict(query={"fusion": "rrf"}, prefetch=[{"query": d, "using": "d", "limit": 0}]), VE, "limit"),
        (dict(query=d, using="d", limit=1.5), TE, "limit"),
    ]:
        add(PyCase("Collection.query", f"query({r(kw)[:40]})", lambda fx, kw=kw: fx.multi.query(**kw), (e,), needle))
    add(PyCase("Collection.delete_payload", "delete_payload(['a['])", lambda fx: fx.multi.delete_payload(["a["], ids=[1]), VE, "key path"))
    add(PyCase("Collection.set_payload", "set_payload(key='a..b')", lambda fx: fx.multi.set_payload({"x": 1}, ids=[1], key="a..b"), VE, "key path"))
    add(PyCase("Collection.overwrite_payload", "overwrite_payload([1])", lambda fx: fx.multi.overwrite_payload([1], ids=[1]), TE, "dict"))
    add(PyCase("Collection.clear_payload", "clear_payload()", lambda fx: fx.multi.clear_payload(), VE, "ids or a filter"))
    add(PyCase("Database.create_collection", "vectors with dim", lambda fx: fx.db.create_collection("x", dim=3, vectors={"a": {"dim": 3}}), TE, "vectors"))
    add(PyCase("Database.create_collection", "vectors without dim", lambda fx: fx.db.create_collection("x", vectors={"a": {"metric": "l2"}}), VE, "dim"))
    add(PyCase("Database.create_collection", "sparse modifier", lambda fx: fx.db.create_collection("x", sparse_vectors={"s": {"modifier": "bm42"}}), VE, "modifier"))
    add(PyCase("Database.create_collection", "a name twice", lambda fx: fx.db.create_collection("x", vectors={"s": {"dim": 3}}, sparse_vectors={"s": None}), VE, "twice"))
    return cases


def run_python_case(fx: PyFixture, case: PyCase) -> Result:
    res = Result("python", case.group, case.name, f"{_exc_names(case.expect)}" + (f" /{case.needle}/" if case.needle else ""))
    fx.case_dir = fx.fresh_dir()
    before = fx.state()
    t0 = time.perf_counter()
    try:
        out = case.fn(fx)
        res.got = f"returned {type(out).__name__}"
        res.problems.append("accepted: no exception")
        if isinstance(out, fx.vectide.Index):
            del out
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:  # noqa: BLE001 - a PanicException is a BaseException
        msg = str(e)
        res.got = f"{type(e).__name__}: {msg}"
        if not isinstance(e, case.expect):
            res.problems.append(f"raised {type(e).__name__}, expected {_exc_names(case.expect)}")
        if not msg.strip():
            res.problems.append("empty message")
        elif case.needle and not re.search(case.needle, msg, re.I):
            res.problems.append(f"message does not mention /{case.needle}/")
    res.seconds = time.perf_counter() - t0
    if res.seconds > 20:
        res.problems.append(f"took {res.seconds:.1f} s")
    if fx.state() != before:
        res.problems.append("state changed")
    d = fx.case_dir
    if d.exists() and any(d.iterdir()):
        res.problems.append(f"files were left in {d.name}: {sorted(p.name for p in d.iterdir())[:5]}")
    if "bad" in fx.db.list_collections():  # created by a wrongly accepted call: start the next case clean
        fx.db.delete_collection("bad")
    return res


def python_child(work: Path, start: int, quick: bool) -> None:
    """Runs the embedded cases from ``start`` on, one JSON line each; the
    parent restarts it after the next case when it dies."""
    fx = PyFixture(work)
    cases = python_cases(quick)
    for i in range(start, len(cases)):
        sys.stdout.write(f"@@START {i}\n")
        sys.stdout.flush()
        r = run_python_case(fx, cases[i])
        sys.stdout.write("@@RESULT " + json.dumps({"i": i, **r.record()}) + "\n")
        sys.stdout.flush()
    sys.stdout.write("@@DONE\n")
    sys.stdout.flush()


def run_python(work: Path, quick: bool, verbose: bool) -> List[Dict[str, Any]]:
    cases = python_cases(quick)
    out: Dict[int, Dict[str, Any]] = {}
    start = 0
    restarts = 0
    while start < len(cases) and restarts < 20:
        child_work = work / f"python-{restarts}"
        cmd = [sys.executable, "-m", "vectide.torture.badinput", "--python-child", "--workdir", str(child_work),
               "--start", str(start)] + (["--quick"] if quick else [])
        env = dict(os.environ)
        # The child imports this very package (installed or from a source tree).
        pkg_root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(x for x in (pkg_root, env.get("PYTHONPATH")) if x)
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
        current: Optional[int] = None
        done = False
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("@@START "):
                current = int(line.split()[1])
            elif line.startswith("@@RESULT "):
                rec = json.loads(line[len("@@RESULT "):])
                i = rec.pop("i")
                out[i] = rec
                current = None
                start = i + 1
                if verbose or not rec["ok"]:
                    _print_record(rec)
            elif line.startswith("@@DONE"):
                done = True
        proc.wait()
        err = proc.stderr.read() if proc.stderr else ""
        if done:
            break
        # The child died: the case in flight failed.
        i = current if current is not None else start
        c = cases[i] if i < len(cases) else None
        how = f"signal {-proc.returncode} ({signal.Signals(-proc.returncode).name})" if proc.returncode < 0 else f"exit code {proc.returncode}"
        rec = Result("python", c.group if c else "?", c.name if c else "?", _exc_names(c.expect) if c else "?",
                     got=f"process died: {how}", problems=[f"process died: {how}: {err.strip()[-300:]}"]).record()
        out[i] = rec
        _print_record(rec)
        start = i + 1
        restarts += 1
    return [out[i] for i in sorted(out)]


# ---------------------------------------------------------------- HTTP

def _cli(explicit: Optional[str]) -> str:
    from ..memnode import cli_path

    return cli_path(explicit)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ChildProcess:
    """A process under test (``proc``): whether it lives, and its threads."""

    proc: Optional[subprocess.Popen] = None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def threads(self) -> int:
        try:
            return len(os.listdir(f"/proc/{self.proc.pid}/task"))
        except OSError:
            return -1


class Server(ChildProcess):
    def __init__(self, cli: str, data: Path, api_key: Optional[str] = None) -> None:
        self.cli = cli
        self.data = data
        self.api_key = api_key
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: Optional[subprocess.Popen] = None
        self.log = data.parent / f"{data.name}.log"

    def start(self) -> "Server":
        args = [self.cli, "serve", "--data", str(self.data), "--port", str(self.port), "--body-limit-mb", str(BODY_LIMIT_MB)]
        if self.api_key:
            args += ["--api-key", self.api_key]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=open(self.log, "wb"))
        deadline = time.time() + 60
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vectide serve exited: {self.log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(self.url + "/healthz", timeout=1) as r:
                    if r.status == 200:
                        return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("vectide serve did not start")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def stderr_tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-1000:]
        except OSError:
            return ""


def http_call(port: int, method: str, path: str, body: Optional[bytes] = None,
              headers: Optional[Sequence[Tuple[str, Any]]] = None, timeout: float = 60) -> Tuple[int, str, bytes]:
    """One request on a fresh connection: (status, content type, body)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.putrequest(method, path, skip_accept_encoding=True)
        names = {n.lower() for n, _ in headers or ()}
        for n, v in headers or ():
            conn.putheader(n, v)
        if "content-type" not in names and body is not None:
            conn.putheader("content-type", "application/json")
        conn.putheader("content-length", str(len(body or b"")))
        conn.endheaders()
        if body:
            try:
                for i in range(0, len(body), 1 << 20):
                    conn.send(body[i:i + (1 << 20)])
            except OSError:
                pass  # the server answered early (413) and closed
        r = conn.getresponse()
        return r.status, r.getheader("content-type") or "", r.read()
    finally:
        conn.close()


@dataclass
class HttpCase:
    group: str
    name: str
    method: str
    path: str
    body: Optional[bytes]
    expect: Tuple[int, ...] = (400,)
    needle: Optional[str] = None
    headers: Tuple[Tuple[str, Any], ...] = ()
    server: str = "main"  # or "auth"


def _j(v: Any) -> bytes:
    return json.dumps(v).encode()


def http_cases(quick: bool) -> List[HttpCase]:
    cases: List[HttpCase] = []
    add = cases.append
    col = "/collections/c"

    # -- create collection
    def create(body_text: str) -> bytes:
        return body_text.encode()

    base_vec = '{"size": 4, "distance": "Euclid"}'
    for lit, named in bad_json_ints(1, L["MAX_DIM"], quick):
        add(HttpCase("create", f"vectors.size={lit}", "PUT", "/collections/bad",
                     create(f'{{"vectors": {{"size": {lit}, "distance": "Euclid"}}}}'), needle="size" if named else None))
    for lit in ["null", '"Manhattan"', "5", '""']:
        add(HttpCase("create", f"vectors.distance={lit}", "PUT", "/collections/bad",
                     create(f'{{"vectors": {{"size": 4, "distance": {lit}}}}}'), needle="distance"))
    for field_, (lo, hi) in {"m": (L["MIN_M"], L["MAX_M"]), "ef_construct": (1, L["MAX_EF"])}.items():
        for lit, named in bad_json_ints(lo, hi, quick):
            add(HttpCase("create", f"hnsw_config.{field_}={lit}", "PUT", "/collections/bad",
                         create(f'{{"vectors": {base_vec}, "hnsw_config": {{"{field_}": {lit}}}}}'),
                         needle=("m" if field_ == "m" else "ef_constr") if named else None))
    graph = {"m": (L["MIN_M"], L["MAX_M"]), "ef_construction": (1, L["MAX_EF"]), "ef_search": (1, L["MAX_EF"]),
             "threads": (1, L["MAX_THREADS"])}
    per_engine = {
        "hnsw": graph,
        "p-hnsw": {**({} if quick else graph), "threads": (1, L["MAX_THREADS"]),
                   "nlog_entries": (1, L["MAX_NLOG_ENTRIES"]), "nlist_entries": (1, L["MAX_NLIST_ENTRIES"]),
                   "initial_capacity": (0, L["MAX_INITIAL_CAPACITY"])},
        "hnsw-wal": {"snapshot_every": (0, L["MAX_SNAPSHOT_EVERY"]), "wal_buffer": (0, L["MAX_WAL_BUFFER"]),
                     "threads": (1, L["MAX_THREADS"])},
    }
    for engine, params in per_engine.items():
        for p, (lo, hi) in params.items():
            for lit, named in bad_json_ints(lo, hi, quick):
                add(HttpCase("create params", f"{engine} {p}={lit}", "PUT", "/collections/bad",
                             create(f'{{"vectors": {base_vec}, "vectide": {{"engine": "{engine}", "params": {{"{p}": {lit}}}}}}}'),
                             needle=p if named else None))
    for name, extra, needle in [
        ("threads 1500 (issue 10)", '"vectide": {"params": {"threads": 1500}}', "threads"),
        ("seed -1", '"vectide": {"params": {"seed": -1}}', "seed"),
        ("seed 1.5", '"vectide": {"params": {"seed": 1.5}}', "seed"),
        ("consolidate_fraction 0", '"vectide": {"params": {"consolidate_fraction": 0}}', "consolidate_fraction"),
        ("consolidate_fraction 2", '"vectide": {"params": {"consolidate_fraction": 2}}', "consolidate_fraction"),
        ("repair_alpha 100", '"vectide": {"params": {"repair_alpha": 100}}', "repair_alpha"),
        ("unknown param", '"vectide": {"params": {"M": 3}}', "unknown parameter"),
        ("unknown engine", '"vectide": {"engine": "faiss"}', "engine"),
        ("engine not a string", '"vectide": {"engine": 5}', "engine"),
        ("params not an object", '"vectide": {"params": [1]}', "params"),
        ("param an object", '"vectide": {"params": {"m": {"x": 1}}}', "m"),
        ("path param", '"vectide": {"params": {"path": "/tmp/elsewhere"}}', "path"),
        ("log param", '"vectide": {"engine": "spfresh", "params": {"log": "own"}}', "log"),
        ("persist disk", '"vectide": {"engine": "p-hnsw", "params": {"persist": "disk"}}', "persist|disk"),
        ("initial_capacity x dim beyond 64 GiB", None, "initial_capacity"),
        ("sparse modifier", '"sparse_vectors": {"s": {"modifier": "bm42"}}', "modifier"),
        ("sparse vectors not an object", '"sparse_vectors": [1]', "sparse_vectors"),
        ("a name used twice", '"sparse_vectors": {"": {}}', "twice"),
        ("vectide.vectors for no space", '"vectide": {"vectors": {"nope": {"engine": "flat"}}}', "nope"),
        ("multivectors", None, "multivector"),
    ]:
        if name.startswith("initial_capacity"):
            body = f'{{"vectors": {{"size": {L["MAX_DIM"]}, "distance": "Dot"}}, "vectide": {{"engine": "p-hnsw", "params": {{"initial_capacity": {L["MAX_INITIAL_CAPACITY"]}}}}}}}'
        elif name == "multivectors":
            body = '{"vectors": {"size": 4, "distance": "Dot", "multivector_config": {"comparator": "max_sim"}}}'
        else:
            body = f'{{"vectors": {base_vec}, {extra}}}'
        add(HttpCase("create", name, "PUT", "/collections/bad", body.encode(), needle=needle))
    for body, needle in [("[]", "object"), ('"x"', "object"), ("5", "object"), ("null", "object"),
                         ('{"vectors": "x"}', "vectors"), ('{"vectors": {"a": {"size": 0, "distance": "Dot"}}}', "vectors.a.size"),
                         ('{"vectors": {"a": {"size": 4, "distance": "Dot"}, "b": {"size": 4}}}', "vectors.b.*distance"),
                         ('{"vectors": {"a": {"size": 4, "distance": "Dot", "multivector_config": {}}}}', "multivector"),
                         ("{}", "vectors")]:
        add(HttpCase("create", f"body {body}", "PUT", "/collections/bad", body.encode(), needle=needle))
    for name in ["..%2F..%2Fetc", "x" * 65, ".hidden", "a%20b", "%00", "a%2Fb", "%C3%A9"]:
        add(HttpCase("create", f"name {name[:20]}", "PUT", f"/collections/{name}", f'{{"vectors": {base_vec}}}'.encode(),
                     expect=(400, 404), needle=None))
    add(HttpCase("create", "existing collection", "PUT", col, f'{{"vectors": {base_vec}}}'.encode(), expect=(409, 400), needle="exists"))

    # -- upsert
    up = col + "/points?wait=true"
    for lit in ["1.5", "null", "true", "false", "{}", "[]", "[1]", "-1", str(2**64), '""', '"' + "x" * 2000 + '"', "1e3", "1.0"]:
        add(HttpCase("upsert ids", f"id {lit[:20]}", "PUT", up, f'{{"points": [{{"id": {lit}, "vector": [1, 2, 3, 4]}}]}}'.encode(), needle="id"))
    for lit, needle in [("[1, 2, 3]", "dimension"), ("[1, 2, 3, 4, 5]", "dimension"), ("[]", "dimension"), ('"x"', "vector"),
                        ('[1, "a", 3, 4]', "finite|number"), ("[1e39, 0, 0, 0]", "finite"), ("[-1e39, 0, 0, 0]", "finite"),
                        ("[[1, 2, 3, 4]]", "multivector"), ('{"named": [1, 2, 3, 4]}', "named"), ("null", "vector"),
                        ('{"indices": [1], "values": [1.0]}', "name"),
                        ("[true, 0, 0, 0]", "finite|number"), ("[NaN, 0, 0, 0]", "JSON"), ("[Infinity, 0, 0, 0]", "JSON"),
                        ("[1e400, 0, 0, 0]", "JSON|range")]:
        add(HttpCase("upsert vectors", f"vector {lit}", "PUT", up, f'{{"points": [{{"id": 100, "vector": {lit}}}]}}'.encode(), needle=needle))
    add(HttpCase("upsert vectors", "vector missing", "PUT", up, b'{"points": [{"id": 100}]}', needle="vector"))
    for lit, needle in [("[1]", "object"), ('"x"', "object"), ("5", "object"), ("true", "object"),
                        (f'{{"big": {2**70}}}', "2\\*\\*64"), (f'{{"neg": {-(2**63) - 1}}}', "2\\*\\*63"),
                        ('{"n": NaN}', "JSON"), (json.dumps(deep(200)), "recursion|nested|deep"),
                        ('{"a": 1,}', "JSON")]:
        add(HttpCase("upsert payloads", f"payload {lit[:30]}", "PUT", up,
                     f'{{"points": [{{"id": 100, "vector": [1, 2, 3, 4], "payload": {lit}}}]}}'.encode(), needle=needle))
    for body, needle in [
        ('{"points": "x"}', "points"), ('{"points": [1]}', "id"), ("{}", "points"), ('{"points": {}}', "points"),
        ('{"points": [{"id": 100, "vector": [1,2,3,4]}, {"id": 100, "vector": [1,2,3,4]}]}', "duplicate|twice"),
        ('{"batch": {"ids": [100, 101], "vectors": [[1,2,3,4]]}}', "ids"),
        ('{"batch": {"ids": [100], "vectors": [[1,2,3,4]], "payloads": [{}, {}]}}', "payloads"),
        ('{"batch": {"ids": [100], "vectors": "x"}}', "vectors"),
        ('{"batch": {"ids": [1.5], "vectors": [[1,2,3,4]]}}', "id"),
        ('{"batch": {"ids": "x", "vectors": [[1,2,3,4]]}}', "ids"),
    ]:
        add(HttpCase("upsert", body[:40], "PUT", up, body.encode(), needle=needle))
    add(HttpCase("upsert", "unknown collection", "PUT", "/collections/nope/points", b'{"points": []}', expect=(404,), needle="nope"))

    # -- query / search / batch
    qp = col + "/points/query"
    q = '"query": [1, 2, 3, 4]'
    for lit, named in bad_json_ints(0, L["MAX_K"], quick):
        add(HttpCase("query", f"limit={lit}", "POST", qp, f'{{{q}, "limit": {lit}}}'.encode(), needle="limit" if named else None))
    for lit, named in bad_json_ints(0, L["MAX_K"], quick):
        add(HttpCase("query", f"offset={lit}", "POST", qp, f'{{{q}, "offset": {lit}}}'.encode(), needle="offset" if named else None))
    add(HttpCase("query", "offset + limit > MAX_K", "POST", qp, f'{{{q}, "offset": 1, "limit": {L["MAX_K"]}}}'.encode(), needle="offset \\+ limit"))
    add(HttpCase("query", "offset MAX_K (+ default limit)", "POST", qp, f'{{{q}, "offset": {L["MAX_K"]}}}'.encode(), needle="offset"))
    add(HttpCase("query", "no query, limit > MAX_K", "POST", qp, f'{{"limit": {L["MAX_K"] + 1}}}'.encode(), needle="limit"))
    for lit, named in bad_json_ints(1, L["MAX_EF"], quick):
        add(HttpCase("query", f"hnsw_ef={lit}", "POST", qp, f'{{{q}, "params": {{"hnsw_ef": {lit}}}}}'.encode(), needle="hnsw_ef" if named else None))
    for lit, needle, expect in [("[1, 2, 3]", "dimension", (400,)), ("[]", "dimension", (400,)), ('"x"', "not found|id", (400, 404)),
                                ("true", "query", (400,)), ("1.5", "id", (400,)), ("-1", "id", (400,)),
                                ('{"nearest": "x"}', "not found", (404,)), ('{"nearest": true}', "vector", (400,)),
                                ('{"recommend": {}}', "query", (400,)), ('{"fusion": "rrf"}', "prefetch", (400,)),
                                ('{"fusion": "max"}', "fusion", (400,)), ('{"indices": [1], "values": [1.0]}', "is dense", (400,)),
                                ("[1e39, 0, 0, 0]", "finite", (400,)), ("[NaN, 0, 0, 0]", "JSON", (400,)),
                                ("12345", "not found", (404,))]:
        add(HttpCase("query", f"query {lit}", "POST", qp, f'{{"query": {lit}}}'.encode(), expect=expect, needle=needle))
    for f, needle in [('"x"', "object"), ('{"must": "x"}', "must"), ('{"must": [{"key": "a", "regex": "x"}]}', "operator"),
                      ('{"bogus": []}', "bogus"), ("[1]", "object"), (json.dumps(deep_filter(40)), "deeper|nested|recursion"),
                      ('{"must": [{"key": "i", "range": {"gt": "x"}}]}', "range|number|gt"),
                      (f'{{"must": [{{"key": "i", "match": {{"value": {2**70}}}}}]}}', "2\\*\\*64"),
                      ('{"must": [{"has_id": [1.5]}]}', "id"), ('{"must": [{"key": 5, "match": {"value": 1}}]}', "key"),
                      ('{"min_should": {"conditions": [], "min_count": 0}}', "min_count"),
                      ('{"must": [{"key": "a[", "match": {"value": 1}}]}', "key path"),
                      ('{"must": [{"nested": {"key": "a"}}]}', "filter"),
                      ('{"must": [{"key": "s", "match": {"text": 5}}]}', "text")]:
        add(HttpCase("query filter", f"filter {f[:40]}", "POST", qp, f'{{{q}, "filter": {f}}}'.encode(), needle=needle))
    for extra, needle in [('"with_payload": 5', "with_payload"), ('"with_payload": {"bogus": 1}', "with_payload|include"),
                          ('"with_payload": ["a", 1]', "with_payload|strings"), ('"with_vector": "yes"', "with_vector"),
                          ('"score_threshold": "x"', "score_threshold"), ('"score_threshold": true', "score_threshold"),
                          ('"using": "dense"', "using"), ('"prefetch": [{"limit": 0}]', "prefetch"),
                          ('"prefetch": 5', "prefetch"), ('"lookup_from": {}', "lookup_from")]:
        add(HttpCase("query", extra[:40], "POST", qp, f'{{{q}, {extra}}}'.encode(), needle=needle))
    add(HttpCase("query", "unknown collection", "POST", "/collections/nope/points/query", f"{{{q}}}".encode(), expect=(404,), needle="nope"))
    bp = col + "/points/query/batch"
    n_batch = L["MAX_BATCH_RESULTS"] // L["MAX_K"] + 1
    add(HttpCase("query batch", f"{n_batch} x limit MAX_K", "POST", bp,
                 json.dumps({"searches": [{"query": [1, 2, 3, 4], "limit": L["MAX_K"]}] * n_batch}).encode(), needle="split"))
    add(HttpCase("query batch", "searches not a list", "POST", bp, b'{"searches": "x"}', needle="searches"))
    add(HttpCase("query batch", "one bad search", "POST", bp, b'{"searches": [{"query": [1,2,3,4]}, {"limit": -1}]}', needle="limit"))
    # MMR and weighted RRF (one prefetch: one weight)
    one = '"prefetch": [{"query": [1, 2, 3, 4]}]'
    for query, needle in [('{"nearest": [1, 2, 3, 4], "mmr": {"diversity": 1.5}}', "mmr.diversity"),
                          ('{"nearest": [1, 2, 3, 4], "mmr": {"diversity": -0.1}}', "mmr.diversity"),
                          ('{"nearest": [1, 2, 3, 4], "mmr": {"diversity": "x"}}', "mmr.diversity"),
                          ('{"nearest": [1, 2, 3, 4], "mmr": {"candidates_limit": 16385}}', "candidates_limit"),
                          ('{"nearest": [1, 2, 3, 4], "mmr": {"candidates_limit": 1.5}}', "candidates_limit"),
                          ('{"nearest": [1, 2, 3, 4], "mmr": {"lambda": 0.5}}', "lambda"),
                          ('{"nearest": [1, 2, 3, 4], "mmr": [1]}', "mmr"),
                          ('{"nearest": [1, 2, 3], "mmr": {}}', "dimension")]:
        add(HttpCase("query mmr", query[:50], "POST", qp, f'{{"query": {query}}}'.encode(), needle=needle))
    for rrf, needle in [('{"weights": [1, 2]}', "2 weights for 1 prefetches"), ('{"weights": []}', "0 weights"),
                        ('{"weights": ["x"]}', "weights\\[0\\]"), ('{"weights": 1}', "weights"),
                        ('{"weights": [1e400]}', "JSON|range")]:
        add(HttpCase("query rrf weights", rrf, "POST", qp, f'{{"query": {{"rrf": {rrf}}}, {one}}}'.encode(), needle=needle))
    # grouped queries
    gp = col + "/points/query/groups"
    for extra, needle in [("", "group_by"), ('"group_by": 5', "group_by"), ('"group_by": "a["', "key path"),
                          ('"group_by": "a", "offset": 1', "offset"), ('"group_by": "a", "with_lookup": "c"', "with_lookup")]:
        add(HttpCase("query groups", extra or "no group_by", "POST", gp, f'{{{q}{", " if extra else ""}{extra}}}'.encode(),
                     needle=needle))
    for field in ("group_size", "limit"):
        for lit, named in bad_json_ints(1, L["MAX_K"], True):
            add(HttpCase("query groups", f"{field}={lit}", "POST", gp, f'{{{q}, "group_by": "a", "{field}": {lit}}}'.encode(),
                         needle=field if named else None))
    add(HttpCase("query groups", "dimension", "POST", gp, b'{"query": [1, 2, 3], "group_by": "a"}', needle="dimension"))
    add(HttpCase("query groups", "unknown collection", "POST", "/collections/nope/points/query/groups",
                 f'{{{q}, "group_by": "a"}}'.encode(), expect=(404,), needle="nope"))
    sgp = col + "/points/search/groups"
    for body, needle in [('{"vector": [1, 2, 3, 4], "group_by": "a", "limit": 3}', "group_size"),
                         ('{"vector": [1, 2, 3, 4], "group_size": 1, "limit": 3}', "group_by"),
                         ('{"vector": [1, 2, 3, 4], "group_by": "a", "group_size": 1, "limit": 0}', "limit"),
                         ('{"vector": [1, 2, 3], "group_by": "a", "group_size": 1, "limit": 3}', "dimension")]:
        add(HttpCase("search groups", body[:50], "POST", sgp, body.encode(), needle=needle))
    sp = col + "/points/search"
    for lit, named in bad_json_ints(0, L["MAX_K"], True):
        add(HttpCase("search", f"limit={lit}", "POST", sp, f'{{"vector": [1, 2, 3, 4], "limit": {lit}}}'.encode(), needle="limit" if named else None))
    add(HttpCase("search", "vector missing", "POST", sp, b'{"limit": 3}', needle="vector"))

    # -- scroll, count, retrieve, delete, payload, index
    sc = col + "/points/scroll"
    for lit, named in bad_json_ints(0, L["MAX_K"], quick):
        add(HttpCase("scroll", f"limit={lit}", "POST", sc, f'{{"limit": {lit}}}'.encode(), needle="limit" if named else None))
    for lit in ["1.5", "true", "{}", "[1]", "-1"]:
        add(HttpCase("scroll", f"offset={lit}", "POST", sc, f'{{"offset": {lit}}}'.encode(), needle="id"))
    add(HttpCase("scroll", "order_by", "POST", sc, b'{"order_by": "i"}', needle="order_by"))
    add(HttpCase("count", "bad filter", "POST", col + "/points/count", b'{"filter": {"must": 5}}', needle="must"))
    rp = col + "/points"
    for body, needle in [('{"ids": "x"}', "list"), ('{"ids": [1.5]}', "id"), ("{}", "list|ids"), ('{"ids": [null]}', "id"),
                         ('{"ids": [1], "with_vector": "x"}', "with_vector")]:
        add(HttpCase("retrieve", body, "POST", rp, body.encode(), needle=needle))
    dp = col + "/points/delete?wait=true"
    for body, needle in [("{}", "points|filter"), ('{"points": [1.5]}', "id"), ('{"points": "x"}', "list"),
                         ('{"filter": {"must": [{"key": "a", "regex": "x"}]}}', "operator"), ('{"points": [true]}', "id")]:
        add(HttpCase("delete", body, "POST", dp, body.encode(), needle=needle))
    pp = col + "/points/payload?wait=true"
    for body, needle in [('{"points": [1]}', "payload"), ('{"payload": [1], "points": [1]}', "object"),
                         ('{"payload": "x", "points": [1]}', "object"), ('{"payload": {"a": 1}}', "points|filter"),
                         ('{"payload": {"a": 1}, "points": [1], "key": "x["}', "key"),
                         ('{"payload": {"a": 1}, "points": [1], "key": 5}', "key"),
                         (f'{{"payload": {{"a": {2**64}}}, "points": [1]}}', "2\\*\\*64"),
                         ('{"payload": {"a": 1}, "points": [1.5]}', "id")]:
        add(HttpCase("set payload", body[:40], "POST", pp, body.encode(), needle=needle))
    # -- a collection of named and sparse vectors ("m": dense "d" of 4, sparse "s")
    mu = "/collections/m/points?wait=true"
    for vec, needle in [
        ('{"s": {"indices": [1, 2], "values": [1.0]}}', "s.*values"),
        ('{"s": {"indices": [1, 1], "values": [1.0, 2.0]}}', "twice"),
        ('{"s": {"indices": [-1], "values": [1.0]}}', "s.indices\\[0\\]"),
        ('{"s": {"indices": [4294967296], "values": [1.0]}}', "s.indices\\[0\\]"),
        ('{"s": {"indices": [1], "values": [NaN]}}', "JSON"),
        ('{"s": {"indices": [1], "values": ["x"]}}', "s.values\\[0\\]"),
        ('{"s": {"indices": [1], "values": [1e39]}}', "s.values\\[0\\]"),
        ('{"s": {"indices": 1, "values": [1.0]}}', "s.indices"),
        ('{"s": {"indices": [1], "values": [1.0], "x": 1}}', "x"),
        ('{"s": [1, 2, 3, 4]}', "sparse"),
        ('{"d": {"indices": [1], "values": [1.0]}}', "dense"),
        ('{"d": [1, 2, 3]}', "dimension"),
        ('{"nope": [1, 2, 3, 4]}', "no vector named \"nope\""),
        ("[1, 2, 3, 4]", "no vector named"),
    ]:
        add(HttpCase("upsert named/sparse", f"vector {vec[:40]}", "PUT", mu, f'{{"points": [{{"id": 500, "vector": {vec}}}]}}'.encode(), needle=needle))
    add(HttpCase("upsert named/sparse", "batch of unequal length", "PUT", mu,
                 b'{"batch": {"ids": [1, 2], "vectors": {"d": [[1, 2, 3, 4]]}}}', needle="ids"))
    mq = "/collections/m/points/query"
    for body, needle in [
        ('{"query": {"indices": [1], "values": [1.0]}, "using": "d"}', "\"d\" is dense"),
        ('{"query": [1, 2, 3, 4], "using": "s"}', "\"s\" is sparse"),
        ('{"query": {"indices": [1, 1], "values": [1.0, 1.0]}, "using": "s"}', "twice"),
        ('{"query": {"fusion": "dbsf"}}', "prefetch"),
        ('{"prefetch": [{"query": [1, 2, 3, 4], "using": "nope"}], "query": {"fusion": "rrf"}}', "nope"),
        ('{"prefetch": [{"query": {"fusion": "rrf"}}], "query": {"fusion": "rrf"}}', "prefetch"),
        ('{"prefetch": [{"bogus": 1}]}', "bogus"),
        ('{"query": {"rrf": {"k": 0}}, "prefetch": [{}]}', "rrf.k"),
        ('{"query": [1, 2, 3, 4], "using": "d", "with_vector": ["d", 5]}', "with_vector"),
    ]:
        add(HttpCase("query named/sparse", body[:50], "POST", mq, body.encode(), needle=needle))
    for path, body, needle in [
        ("/points/payload/delete?wait=true", '{"keys": ["a["], "points": [1]}', "keys\\[0\\]"),
        ("/points/payload/delete?wait=true", '{"points": [1]}', "keys"),
        ("/points/payload?wait=true", '{"payload": {"a": 1}, "points": [1], "key": "a..b"}', "key"),
        ("/points/payload/clear?wait=true", "{}", "points|filter"),
    ]:
        add(HttpCase("payload edits", f"{path.split('?')[0]} {body[:30]}", "POST",
                     "/collections/m" + path, body.encode(), needle=needle))
    add(HttpCase("payload edits", "overwrite with a list", "PUT", "/collections/m/points/payload?wait=true",
                 b'{"payload": [1], "points": [1]}', needle="object"))

    ip = col + "/index?wait=true"
    for body, needle in [('{"field_name": "s", "field_schema": "fulltext"}', "fulltext|keyword"),
                         ('{"field_schema": "keyword"}', "field_name"), ('{"field_name": 5, "field_schema": "keyword"}', "field_name"),
                         ('{"field_name": "s"}', "field_schema"), ('{"field_name": "s", "field_schema": 5}', "field_schema")]:
        add(HttpCase("index", body[:40], "PUT", ip, body.encode(), needle=needle))

    # -- malformed JSON, not objects, content types, sizes
    for name, raw in [("truncated", b'{"points": [{"id": 1'), ("trailing garbage", b'{"points": []} x'),
                      ("invalid UTF-8", b'{"points": [{"id": "\xff\xfe", "vector": [1,2,3,4]}]}'),
                      ("single quotes", b"{'points': []}"), ("trailing comma", b'{"points": [],}'),
                      ("BOM", b'\xef\xbb\xbf{"points": []}'), ("array", b"[]"), ("string", b'"x"'), ("number", b"5"),
                      ("null", b"null"), ("deep arrays", b"[" * 100_000 + b"]" * 100_000),
                      ("deep objects", b'{"a":' * 50_000 + b"1" + b"}" * 50_000)]:
        add(HttpCase("malformed", f"upsert {name}", "PUT", up, raw, needle="JSON|object"))
        if not quick or name in ("truncated", "array", "deep arrays"):
            add(HttpCase("malformed", f"query {name}", "POST", qp, raw, needle="JSON|object"))
    ok_body = b'{"points": [{"id": 100, "vector": [1, 2, 3, 4]}]}'
    for ct in ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "application/xml", "", "json"]:
        add(HttpCase("content type", f"upsert as {ct or 'empty'}", "PUT", up, ok_body, expect=(415,),
                     needle="content-type", headers=(("content-type", ct),)))
    add(HttpCase("content type", "create as text/plain", "PUT", "/collections/bad", f'{{"vectors": {base_vec}}}'.encode(),
                 expect=(415,), needle="content-type", headers=(("content-type", "text/plain"),)))
    big = b'{"points": [' + b"0," * ((BODY_LIMIT_MB << 20) // 2 + 1000) + b"0]}"
    add(HttpCase("size", f"body over {BODY_LIMIT_MB} MiB", "PUT", up, big, expect=(413,), needle="limit|large"))
    big_payload = '{"points": [{"id": 100, "vector": [1,2,3,4], "payload": {"s": "' + "x" * ((BODY_LIMIT_MB << 20) + 10) + '"}}]}'
    add(HttpCase("size", "payload over the body limit", "PUT", up, big_payload.encode(), expect=(413,), needle="limit|large"))

    # -- routes and methods
    for method, path, expect in [("GET", "/nope", (404,)), ("POST", col + "/points/nope", (404,)), ("DELETE", col + "/points", (405,)),
                                 ("PATCH", col, (405,)), ("GET", col + "/points/query", (405,)), ("GET", "/collections/nope", (404,)),
                                 ("POST", "/collections/nope/points/count", (404,))]:
        add(HttpCase("routes", f"{method} {path}", method, path, b"{}" if method in ("POST", "PATCH") else None, expect=expect))

    # -- API keys (a second server with --api-key)
    for name, hdrs in [("missing", ()), ("wrong", (("api-key", "wrong"),)),
                       ("same length", (("api-key", API_KEY[:-1] + "X"),)), ("prefix", (("api-key", API_KEY[:-1]),)),
                       ("longer", (("api-key", API_KEY + "0"),)), ("empty", (("api-key", ""),)),
                       ("case", (("api-key", API_KEY.lower()),)), ("non-ASCII", (("api-key", b"\xff\xfe\xfd"),)),
                       ("as bearer", (("authorization", "Bearer wrong"),))]:
        add(HttpCase("api key", f"{name}", "GET", "/collections", None, expect=(401,), needle="api-key", headers=hdrs, server="auth"))
        if not quick:
            add(HttpCase("api key", f"{name} on a write", "PUT", "/collections/k", f'{{"vectors": {base_vec}}}'.encode(),
                         expect=(401,), needle="api-key", headers=hdrs, server="auth"))
    return cases


def _http_state(port: int, headers=()) -> str:
    parts = []
    _, _, raw = http_call(port, "GET", "/collections", None, headers)
    names = sorted(c["name"] for c in json.loads(raw)["result"]["collections"])
    parts.append(names)
    for n in names:
        _, _, cnt = http_call(port, "POST", f"/collections/{n}/points/count", b'{"exact": true}', headers)
        _, _, page = http_call(port, "POST", f"/collections/{n}/points/scroll",
                               b'{"limit": 1000, "with_payload": true, "with_vector": true}', headers)
        parts.append([n, json.loads(cnt)["result"], json.loads(page)["result"]])
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


mu_path = "/collections/m/points?wait=true"


def _fill_server(port: int, headers=()) -> None:
    rng = np.random.default_rng(3)
    X = rng.standard_normal((N, DIM)).astype(np.float32)
    st, _, raw = http_call(port, "PUT", "/collections/c", b'{"vectors": {"size": 4, "distance": "Euclid"}, "hnsw_config": {"m": 8, "ef_construct": 32}}', headers)
    if st != 200:
        raise RuntimeError(f"create: {st} {raw[:300]!r}")
    ids: List[Any] = list(range(N - 3)) + ["key-a", str(uuid.UUID(int=7)), 2**64 - 1]
    pts = [{"id": i, "vector": X[j].tolist(),
            "payload": {"i": j, "f": 15028.519667320139, "s": "x" * (j % 3), "big": 2**64 - 1, "neg": -(2**63)}}
           for j, i in enumerate(ids)]
    st, _, raw = http_call(port, "PUT", "/collections/c/points?wait=true", _j({"points": pts}), headers)
    if st != 200:
        raise RuntimeError(f"upsert: {st} {raw[:300]!r}")
    # A collection of a named dense vector and a sparse one.
    st, _, raw = http_call(port, "PUT", "/collections/m", _j({"vectors": {"d": {"size": 4, "distance": "Dot"}},
                                                           "sparse_vectors": {"s": {"modifier": "idf"}}}), headers)
    if st != 200:
        raise RuntimeError(f"create m: {st} {raw[:300]!r}")
    pts = [{"id": j, "vector": {"d": X[j].tolist(), "s": {"indices": [j % 7, 10 + j % 3], "values": [1.0, 0.5]}},
            "payload": {"i": j, "tags": ["a", "b"][: j % 3]}} for j in range(20)]
    st, _, raw = http_call(port, "PUT", mu_path, _j({"points": pts}), headers)
    if st != 200:
        raise RuntimeError(f"upsert m: {st} {raw[:300]!r}")


def run_http_case(server: Server, case: HttpCase, auth: Tuple[Tuple[str, str], ...], base_threads: int) -> Result:
    expect = "/".join(map(str, case.expect)) + " JSON" + (f" /{case.needle}/" if case.needle else "")
    res = Result("http", case.group, case.name, expect)
    before = _http_state(server.port, auth)
    t0 = time.perf_counter()
    try:
        status, ctype, raw = http_call(server.port, case.method, case.path, case.body, case.headers)
    except Exception as e:  # noqa: BLE001
        status, ctype, raw = 0, "", str(e).encode()
    res.seconds = time.perf_counter() - t0
    res.got = f"{status} {raw[:200].decode(errors='replace')}"
    if status not in case.expect:
        res.problems.append(f"status {status}, expected {'/'.join(map(str, case.expect))}")
    if status >= 500 or status == 0:
        res.problems.append("server error or no answer")
    if status >= 400:
        if not ctype.startswith("application/json"):
            res.problems.append(f"error body is {ctype or 'untyped'}, not JSON")
        else:
            try:
                err = json.loads(raw)["status"]["error"]
                if not isinstance(err, str) or not err.strip():
                    res.problems.append("empty error message")
                elif case.needle and not re.search(case.needle, err, re.I):
                    res.problems.append(f"error does not mention /{case.needle}/")
            except (ValueError, KeyError, TypeError):
                res.problems.append("error body is not {\"status\": {\"error\": ...}}")
    if not server.alive():
        res.problems.append(f"the server died: {server.stderr_tail()[-300:]}")
        return res
    if server.threads() > base_threads + 64:
        res.problems.append(f"the server runs {server.threads()} threads (was {base_threads})")
    after = _http_state(server.port, auth)
    if after != before:
        res.problems.append("state changed")
        # Undo a collection created by mistake so that later cases start clean.
        if case.method == "PUT" and case.path.startswith("/collections/") and "/points" not in case.path:
            http_call(server.port, "DELETE", case.path, None, auth)
    return res


def run_http(work: Path, cli: str, quick: bool, verbose: bool) -> Tuple[List[Dict[str, Any]], Dict[str, Any]]:
    main = Server(cli, work / "http-db")
    auth = Server(cli, work / "http-auth-db", api_key=API_KEY)
    out: List[Dict[str, Any]] = []
    info: Dict[str, Any] = {}
    try:
        main.start()
        auth.start()
        _fill_server(main.port)
        key = (("api-key", API_KEY),)
        _fill_server(auth.port, key)
        base = {"main": main.threads(), "auth": auth.threads()}
        info["threads_at_start"] = base
        max_threads = dict(base)
        for case in http_cases(quick):
            srv = main if case.server == "main" else auth
            r = run_http_case(srv, case, key if case.server == "auth" else (), base[case.server])
            max_threads[case.server] = max(max_threads[case.server], srv.threads())
            rec = r.record()
            out.append(rec)
            if verbose or not r.ok:
                _print_record(rec)
            if not srv.alive():
                srv.start()  # keep going; the case is already counted as failed
        # Controls: the bounds themselves are accepted.
        for name, method, path, body in [
            ("limit = MAX_K", "POST", "/collections/c/points/query", f'{{"query": [1,2,3,4], "limit": {L["MAX_K"]}}}'.encode()),
            ("scroll limit = MAX_K", "POST", "/collections/c/points/scroll", f'{{"limit": {L["MAX_K"]}}}'.encode()),
            ("hnsw_ef = MAX_EF", "POST", "/collections/c/points/query", f'{{"query": [1,2,3,4], "params": {{"hnsw_ef": {L["MAX_EF"]}}}}}'.encode()),
        ]:
            r = Result("http", "controls", name, "200")
            st, _, raw = http_call(main.port, method, path, body)
            r.got = f"{st} {raw[:100]!r}"
            if st != 200:
                r.problems.append(f"status {st}: a value at its bound is refused")
            out.append(r.record())
            if verbose or not r.ok:
                _print_record(r.record())
        st, _, _ = http_call(auth.port, "GET", "/collections", None, key)
        r = Result("http", "controls", "right api-key", "200", got=str(st))
        if st != 200:
            r.problems.append(f"status {st} with the right key")
        out.append(r.record())
        info["max_threads"] = max_threads
        info["alive_at_end"] = main.alive() and auth.alive()
        with urllib.request.urlopen(main.url + "/healthz", timeout=10) as h:
            info["healthz_at_end"] = h.status
    finally:
        main.stop()
        auth.stop()
    return out, info


# ---------------------------------------------------------------- vectide.Client (Python over HTTP)

def run_client(work: Path, cli: str, verbose: bool) -> List[Dict[str, Any]]:
    import vectide

    srv = Server(cli, work / "client-db")
    out: List[Dict[str, Any]] = []
    try:
        srv.start()
        _fill_server(srv.port)
        c = vectide.Client(srv.url)
        col = c.get_collection("c")
        q = np.ones(DIM, np.float32)
        TE, VE, KE = (TypeError,), (ValueError,), (KeyError,)
        cases = [
            ("create", "threads=1500", lambda: c.create_collection("bad", dim=DIM, threads=1500), VE, "threads"),
            ("create", "dim=1.5", lambda: c.create_collection("bad", dim=1.5), TE, "dim"),
            ("create", "dim=10**9", lambda: c.create_collection("bad", dim=10**9), VE, "size"),
            ("create", "engine='faiss'", lambda: c.create_collection("bad", dim=DIM, engine="faiss"), VE, "engine"),
            ("create", "metric='hamming'", lambda: c.create_collection("bad", dim=DIM, metric="hamming"), VE, "metric"),
            ("upsert", "ids=[1.0]", lambda: col.upsert([1.0], q[None, :]), TE, "position 0"),
            ("upsert", "ids=[None]", lambda: col.upsert([None], q[None, :]), TE, "position 0"),
            ("upsert", "ids=[True]", lambda: col.upsert([True], q[None, :]), TE, "position 0"),
            ("upsert", "ids=[-1]", lambda: col.upsert([-1], q[None, :]), VE, "position 0"),
            ("upsert", "NaN vector", lambda: col.upsert([100], np.full((1, DIM), np.nan)), VE, "finite"),
            ("upsert", "NaN payload", lambda: col.upsert([100], q[None, :], payloads=[{"a": float("nan")}]), VE, "JSON|float"),
            ("upsert", "2**70 payload", lambda: col.upsert([100], q[None, :], payloads=[{"a": 2**70}]), VE, "2\\*\\*64"),
            ("upsert", "wrong dim", lambda: col.upsert([100], np.ones((1, DIM + 1))), VE, "dimension"),
            ("search", "k=10**9", lambda: col.search(q, k=10**9), VE, "limit"),
            ("search", "k=0", lambda: col.search(q, k=0), VE, "limit|k"),
            ("search", "k=1.5", lambda: col.search(q, k=1.5), TE, "k"),
            ("search", "ef=10**9", lambda: col.search(q, k=3, ef=10**9), VE, "hnsw_ef"),
            ("search", "ef='64'", lambda: col.search(q, k=3, ef="64"), TE, "ef"),
            ("search", "bad filter", lambda: col.search(q, filter={"must": "x"}), VE, "must"),
            ("search_numpy", "k=10**9", lambda: col.search_numpy(q, k=10**9), VE, "limit"),
            ("scroll", "limit=10**9", lambda: col.scroll(limit=10**9), VE, "limit"),
            ("scroll", "offset=1.5", lambda: col.scroll(offset=1.5), TE, "position|id"),
            ("get", "ids=[1.5]", lambda: col.get([1.5]), TE, "position 0"),
            ("get", "missing", lambda: col.get(["missing"]), KE, "missing"),
            ("collections", "get_collection(missing)", lambda: c.get_collection("nope"), KE, "nope"),
        ]
        for group, name, fn, expect, needle in cases:
            r = Result("client", group, name, _exc_names(expect) + f" /{needle}/")
            before = _http_state(srv.port)
            t0 = time.perf_counter()
            try:
                fn()
                r.got = "returned"
                r.problems.append("accepted: no exception")
            except Exception as e:  # noqa: BLE001
                r.got = f"{type(e).__name__}: {e}"
                if not isinstance(e, expect):
                    r.problems.append(f"raised {type(e).__name__}, expected {_exc_names(expect)}")
                elif needle and not re.search(needle, str(e), re.I):
                    r.problems.append(f"message does not mention /{needle}/")
            r.seconds = time.perf_counter() - t0
            if not srv.alive():
                r.problems.append("the server died")
                srv.start()
            elif _http_state(srv.port) != before:
                r.problems.append("state changed")
                if group == "create":
                    http_call(srv.port, "DELETE", "/collections/bad")
            rec = r.record()
            out.append(rec)
            if verbose or not r.ok:
                _print_record(rec)
    finally:
        srv.stop()
    return out


# ---------------------------------------------------------------- driver

def _print_record(rec: Dict[str, Any]) -> None:
    mark = "ok  " if rec["ok"] else "FAIL"
    line = f"  {mark} [{rec['surface']}/{rec['group']}] {rec['case']}: {rec['got'][:160]}"
    if rec["problems"]:
        line += f"  <- {'; '.join(rec['problems'])}"
    print(line, flush=True)


def run(args) -> Dict[str, Any]:
    """Runs the matrix; returns ``{"summary": {...}, "cases": [...], ...}``."""
    quick = bool(getattr(args, "quick", False))
    verbose = bool(getattr(args, "verbose", False))
    surfaces = [s.strip() for s in (getattr(args, "surfaces", None) or "http,python,client,memnode").split(",") if s.strip()]
    cli = _cli(getattr(args, "cli", None))
    base = getattr(args, "workdir", None)
    tmp = tempfile.TemporaryDirectory(prefix="vectide-badinput-")
    work = Path(base) / "badinput" if base else Path(tmp.name)
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    t0 = time.perf_counter()
    cases: List[Dict[str, Any]] = []
    report: Dict[str, Any] = {"quick": quick, "limits": {k: v for k, v in L.items()}, "cli": cli}
    try:
        if "python" in surfaces:
            cases += run_python(work, quick, verbose)
        if "http" in surfaces:
            recs, info = run_http(work, cli, quick, verbose)
            cases += recs
            report["server"] = info
        if "client" in surfaces:
            cases += run_client(work, cli, verbose)
        if "memnode" in surfaces:
            from . import badinput_memnode

            cases += badinput_memnode.run(work, cli, verbose, Result, _print_record)
    finally:
        tmp.cleanup()
    by: Dict[str, Dict[str, int]] = {}
    for c in cases:
        s = by.setdefault(c["surface"], {"cases": 0, "passed": 0, "failed": 0})
        s["cases"] += 1
        s["passed" if c["ok"] else "failed"] += 1
    failed = sum(1 for c in cases if not c["ok"])
    report["summary"] = {"cases": len(cases), "passed": len(cases) - failed, "failed": failed, "by_surface": by,
                         "seconds": round(time.perf_counter() - t0, 1)}
    report["cases"] = cases
    report["failures"] = [c for c in cases if not c["ok"]]
    return report


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m vectide.torture.badinput", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(ap)
    ap.add_argument("--out", type=Path, help="write the JSON report here")
    ap.add_argument("--workdir", type=Path, help="scratch directory (default: a temporary one)")
    ap.add_argument("--python-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--start", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.python_child:
        python_child(args.workdir, args.start, bool(getattr(args, "quick", False)))
        return 0
    r = run(args)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(r, indent=1, default=str))
    print(f"bad-input matrix: {r['summary']}")
    return 1 if r["summary"]["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
