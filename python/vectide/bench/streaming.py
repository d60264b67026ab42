"""Streaming engines driven by one plan, each in a worker process of its own.

The runbook and stability benchmarks run every engine in a worker process
started by :class:`Worker`, so that its memory is its own process's resident
set and a peer with pinned dependencies (``diskannpy`` 0.7.0 needs numpy
1.25) runs in its own virtualenv.

- A Vectide engine's worker runs the harness core's timed loop over the
  whole runbook in one command (``native``): the loop the CLI's
  ``vectide runbook`` runs.
- A peer is driven step by step through one small interface
  (:class:`Stream`): ``insert(ids, X)``, ``delete(ids)``, ``replace(ids,
  X)``, ``after_deletes()`` (the engine's consolidation policy, stated in
  ``policy``), ``set_knob(v)`` and ``query(q, k)``; the timed loops are
  this file's, run inside the worker.

This file is also the worker's program (``python streaming.py --serve``) and
imports nothing but numpy and the standard library at the top, so that it
runs under a virtualenv that has neither Vectide nor the other peers.

Protocol: the parent writes one JSON command per line to the worker's stdin
and reads one JSON answer per line from a pipe of its own (libraries may
print on stdout; their output goes to a log file). Vectors never cross the
pipe: the worker memory-maps the dataset's ``.npy`` files and commands name
row ranges.

Threads: updates run with ``update_threads`` (2 in the benchmarks) and
searches one query per call from one Python loop (1 thread), for every
engine.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Dict, List, Optional

import numpy as np

#: How each engine keeps its graph clean after deletes, as written into results.
POLICIES = {
    "hnswlib": "mark_deleted on delete; inserts of new ids reuse deleted slots "
    "(allow_replace_deleted, add_items(replace_deleted=True)); a deleted id inserted again "
    "is unmarked and updated; no consolidation exists in hnswlib",
    "diskann": "mark_deleted on delete, consolidate_delete() after every delete step "
    "(as the big-ann-benchmarks streaming baseline does)",
    "svs": "delete() on delete, consolidate() then compact() after every delete step",
    "faiss-ivf": "remove_ids() removes at once; no consolidation needed",
}


class StreamError(RuntimeError):
    """An engine operation failed; the message names the engine and the step."""


def _import(module: str, pip_name: str):
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise StreamError(f"needs the Python package {pip_name!r} (import {module!r} failed: {e})") from None


class Stream:
    """One engine under a runbook. ``spec``: ``dim``, ``metric`` (``cosine``
    vectors arrive unit-normalised), ``capacity`` (the most points active at
    once), ``update_threads``, ``params`` (R / L / alpha for the Vamana
    family, M / efConstruction for HNSW, nlist for IVF)."""

    name = "stream"
    policy = ""
    knob = "ef"

    def __init__(self, spec: Dict) -> None:
        self.spec = spec
        self.dim = int(spec["dim"])
        self.metric = spec["metric"]
        self.threads = int(spec.get("update_threads", 2))
        self.params: Dict[str, object] = {}

    def insert(self, ids: np.ndarray, X: np.ndarray) -> None:
        raise NotImplementedError

    def delete(self, ids: np.ndarray) -> None:
        raise NotImplementedError

    def replace(self, ids: np.ndarray, X: np.ndarray) -> None:
        """Active ``ids`` take new vectors; the default is delete + insert."""
        self.delete(ids)
        self.after_deletes()
        self.insert(ids, X)

    def after_deletes(self) -> None:
        """The consolidation policy, run (and timed) after every delete step."""

    def settle(self) -> None:
        """Finishes pending consolidation (the stability benchmark waits for it)."""
        self.after_deletes()

    def set_knob(self, value: int) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Releases what the engine holds (files of a disk engine)."""

    def query(self, q: np.ndarray, k: int) -> np.ndarray:
        raise NotImplementedError

    def info(self) -> Dict[str, object]:
        return {}


class HnswlibStream(Stream):
    name = "hnswlib"
    policy = POLICIES["hnswlib"]

    def __init__(self, spec):
        super().__init__(spec)
        hnswlib = _import("hnswlib", "hnswlib")
        p = spec.get("params", {})
        m, efc = int(p.get("m", 16)), int(p.get("ef_construction", 200))
        self.capacity = int(spec["capacity"])
        self.index = hnswlib.Index(space={"cosine": "cosine", "l2": "l2", "ip": "ip"}[self.metric], dim=self.dim)
        self.index.init_index(max_elements=self.capacity, M=m, ef_construction=efc, random_seed=100,
                              allow_replace_deleted=True)
        self.index.set_num_threads(1)
        self.deleted: set = set()
        self.params = {"m": m, "ef_construction": efc, "max_elements": self.capacity,
                       "allow_replace_deleted": True, "version": getattr(hnswlib, "__version__", None)}

    def insert(self, ids, X):
        fresh = np.ones(len(ids), dtype=bool)
        again = [i for i, x in enumerate(ids.tolist()) if x in self.deleted]
        for i in again:
            label = int(ids[i])
            self.deleted.discard(label)
            try:
                self.index.unmark_deleted(label)
            except RuntimeError:
                continue  # its slot went to another id: insert it as new
            fresh[i] = False
        if not fresh.all():  # unmarked labels: hnswlib's update path
            self.index.add_items(X[~fresh], ids[~fresh], num_threads=self.threads)
        if fresh.any():
            X, ids = X[fresh], ids[fresh]
            free = self.capacity - self.index.get_current_count() + len(self.deleted)
            if len(ids) > free:  # more live points than planned: grow
                self.capacity = self.index.get_current_count() + len(ids)
                self.index.resize_index(self.capacity)
            self.index.add_items(X, ids, num_threads=self.threads, replace_deleted=True)

    def delete(self, ids):
        for label in ids.tolist():
            self.index.mark_deleted(label)
            self.deleted.add(label)

    def replace(self, ids, X):
        self.index.add_items(X, ids, num_threads=self.threads)  # in-place update

    def set_knob(self, value):
        self.index.set_ef(int(value))

    def query(self, q, k):
        return self.index.knn_query(q, k=k)[0][0]


class DiskannStream(Stream):
    """``diskannpy.DynamicMemoryIndex`` (0.7.0). Cosine data arrives unit
    length and is indexed with ``l2`` (the same order, and the distance
    Vamana's α-rule is defined on). Tags are ids + 1: tag 0 is reserved."""

    name = "diskann"
    policy = POLICIES["diskann"]
    knob = "L"

    def __init__(self, spec):
        super().__init__(spec)
        dap = _import("diskannpy", "diskannpy==0.7.0")
        p = spec.get("params", {})
        r, l_build, alpha = int(p.get("r", 64)), int(p.get("l_build", 75)), float(p.get("alpha", 1.2))
        metric = {"cosine": "l2", "l2": "l2", "ip": "mips"}[self.metric]
        cap = int(spec["capacity"]) + 1
        self.index = dap.DynamicMemoryIndex(
            distance_metric=metric, vector_dtype=np.float32, dimensions=self.dim, max_vectors=cap,
            complexity=l_build, graph_degree=r, alpha=alpha, num_threads=self.threads,
            initial_search_complexity=int(p.get("l_search", 64)), search_threads=1,
        )
        self.L = 64
        self.params = {"graph_degree": r, "complexity": l_build, "alpha": alpha, "distance_metric": metric,
                       "max_vectors": cap, "num_threads": self.threads, "version": "0.7.0"}

    def insert(self, ids, X):
        self.index.batch_insert(np.ascontiguousarray(X), (ids + 1).astype(np.uint32), num_threads=self.threads)

    def delete(self, ids):
        for tag in (ids + 1).astype(np.uint32):
            self.index.mark_deleted(tag)

    def after_deletes(self):
        self.index.consolidate_delete()

    def set_knob(self, value):
        self.L = int(value)

    def query(self, q, k):
        return self.index.search(q, k_neighbors=k, complexity=max(self.L, k)).identifiers.astype(np.int64) - 1


class SvsStream(Stream):
    """Intel SVS ``DynamicVamana`` (PyPI ``scalable-vs``), built on the
    first insert; cosine as squared L2 over unit vectors, so α means what it
    means in FreshVamana."""

    name = "svs"
    policy = POLICIES["svs"]
    knob = "L"

    def __init__(self, spec):
        super().__init__(spec)
        self.svs = _import("svs", "scalable-vs")
        p = spec.get("params", {})
        self.r, self.l_build, self.alpha = int(p.get("r", 64)), int(p.get("l_build", 75)), float(p.get("alpha", 1.2))
        self.dist = self.svs.DistanceType.MIP if self.metric == "ip" else self.svs.DistanceType.L2
        self.index = None
        self.L = 64
        self.params = {"graph_max_degree": self.r, "window_size": self.l_build, "alpha": self.alpha,
                       "max_candidate_pool_size": 750, "prune_to": self.r, "distance": str(self.dist),
                       "version": getattr(self.svs, "library_version", lambda: None)()}

    def insert(self, ids, X):
        X = np.ascontiguousarray(X, dtype=np.float32)
        ids = ids.astype(np.uint64)
        if self.index is None:
            bp = self.svs.VamanaBuildParameters(
                alpha=self.alpha, graph_max_degree=self.r, window_size=self.l_build,
                max_candidate_pool_size=750, prune_to=self.r,
            )
            self.index = self.svs.DynamicVamana.build(bp, X, ids, self.dist, self.threads)
        else:
            self.index.num_threads = self.threads
            self.index.add(X, ids)

    def delete(self, ids):
        self.index.delete(ids.astype(np.uint64))

    def after_deletes(self):
        self.index.num_threads = self.threads
        self.index.consolidate()
        self.index.compact(1000)

    def set_knob(self, value):
        self.L = int(value)
        if self.index is not None:
            self.index.search_window_size = self.L
            self.index.num_threads = 1

    def query(self, q, k):
        self.index.search_window_size = max(self.L, k)
        return self.index.search(q, k)[0][0]


class FaissIvfStream(Stream):
    """faiss ``IndexIVFFlat`` with ids (``add_with_ids`` / ``remove_ids``),
    its quantiser trained before the first step (untimed) on a seeded sample
    of the whole dataset; cosine as inner product over unit vectors. The
    issue asked for ``IndexIDMap(IndexIVFFlat)``, but IndexIDMap's
    ``remove_ids`` aborts the process on an IVF index (faiss 1.15 asserts
    that the sub-index renumbers like a flat one, which IVF does not); IVF
    keeps the ids itself, so the map adds nothing."""

    name = "faiss-ivf"
    policy = POLICIES["faiss-ivf"]
    knob = "nprobe"

    def __init__(self, spec):
        super().__init__(spec)
        self.faiss = _import("faiss", "faiss-cpu")
        nlist = int(spec.get("params", {}).get("nlist", 1024))
        metric = self.faiss.METRIC_L2 if self.metric == "l2" else self.faiss.METRIC_INNER_PRODUCT
        self.quantizer = self.faiss.IndexFlat(self.dim, metric)
        self.ivf = self.faiss.IndexIVFFlat(self.quantizer, self.dim, nlist, metric)
        self.index = self.ivf
        self.params = {"index": "IndexIVFFlat", "nlist": nlist, "metric": "L2" if self.metric == "l2" else "INNER_PRODUCT",
                       "version": self.faiss.__version__}

    def train(self, sample: np.ndarray) -> None:
        self.faiss.omp_set_num_threads(self.threads)
        self.ivf.train(np.ascontiguousarray(sample, dtype=np.float32))
        self.params["train_rows"] = int(len(sample))

    def insert(self, ids, X):
        self.faiss.omp_set_num_threads(self.threads)
        self.index.add_with_ids(np.ascontiguousarray(X), ids.astype(np.int64))

    def delete(self, ids):
        self.faiss.omp_set_num_threads(self.threads)
        self.index.remove_ids(self.faiss.IDSelectorBatch(ids.astype(np.int64)))

    def set_knob(self, value):
        self.faiss.omp_set_num_threads(1)
        self.ivf.nprobe = int(value)

    def query(self, q, k):
        return self.index.search(q.reshape(1, -1), k)[1][0]


PEERS = {"hnswlib": HnswlibStream, "diskann": DiskannStream, "svs": SvsStream, "faiss-ivf": FaissIvfStream}


def make_stream(name: str, spec: Dict) -> Stream:
    if name in PEERS:
        return PEERS[name](spec)
    raise StreamError(f"unknown peer {name!r}; known: {', '.join(PEERS)} (Vectide's engines run natively)")


# --------------------------------------------------------------------------
# The worker: a loop over commands, timing each operation itself.


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def timed_search(eng: Stream, queries: np.ndarray, k: int):
    """One call per query from a plain loop; ``(ids [nq, k] int64, latencies s)``."""
    out = np.full((len(queries), k), -1, dtype=np.int64)
    lat = np.empty(len(queries))
    query, clock = eng.query, time.perf_counter
    for i in range(len(queries)):
        t0 = clock()
        row = query(queries[i], k)
        lat[i] = clock() - t0
        n = min(k, len(row))
        out[i, :n] = np.asarray(row[:n]).astype(np.int64, copy=False)
    return out, lat


def run_native(cmd: Dict) -> Dict:
    """A Vectide engine through the whole runbook with the harness core's
    timed loop (in this worker, which is the engine's own process)."""
    from vectide import _vectide as core  # only a Vectide engine's worker gets here

    with np.load(cmd["truth"]) as z:
        truth = [z[f"s{i}"] for i in range(len(z.files))]
    with open(cmd["runbook"], "rb") as f:
        text = f.read()
    doc = core.runbook_run(
        cmd["engine"], text, np.load(cmd["data"], mmap_mode="r"),
        np.ascontiguousarray(np.load(cmd["queries"]), dtype=np.float32), cmd["metric"],
        [t if t.shape[1] else None for t in truth], int(cmd["k"]), int(cmd["knob"]), int(cmd["nprobe"]),
        int(cmd["update_threads"]), settle_after_deletes=bool(cmd["settle"]),
        calibrate=[int(v) for v in cmd["calibrate"]], target=float(cmd["target"]), isolated=True,
        workdir=cmd.get("workdir"),
    )
    return json.loads(doc)


def serve(answer_fd: int) -> int:
    """Reads commands from stdin until ``quit``; answers on ``answer_fd``."""
    out = os.fdopen(answer_fd, "w", buffering=1)
    eng: Optional[Stream] = None
    data: Optional[np.ndarray] = None
    queries: Optional[np.ndarray] = None
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        try:
            ans: Dict[str, object] = {"ok": True}
            if op == "quit":
                if eng is not None:
                    eng.close()
                out.write(json.dumps(ans) + "\n")
                return 0
            if op == "open":
                data = np.load(cmd["data"], mmap_mode="r")
                queries = np.ascontiguousarray(np.load(cmd["queries"]), dtype=np.float32)
                rss0 = _rss()
                eng = make_stream(cmd["engine"], cmd["spec"])
                if cmd.get("train_sample") is not None and hasattr(eng, "train"):
                    eng.train(np.load(cmd["train_sample"]))
                ans.update(params=eng.params, policy=eng.policy, knob=eng.knob, rss_base=rss0)
            elif op in ("insert", "delete", "replace"):
                ids = np.arange(cmd["start"], cmd["end"], dtype=np.uint64)
                t0 = time.perf_counter()
                if op == "insert":
                    eng.insert(ids, np.ascontiguousarray(data[cmd["start"] : cmd["end"]], dtype=np.float32))
                elif op == "delete":
                    eng.delete(ids)
                else:
                    rows = np.ascontiguousarray(data[cmd["rows_start"] : cmd["rows_end"]], dtype=np.float32)
                    eng.replace(ids, rows)
                t1 = time.perf_counter()
                if op == "delete" or cmd.get("settle"):
                    (eng.settle if cmd.get("settle") else eng.after_deletes)()
                t2 = time.perf_counter()
                ans.update(op_s=t1 - t0, consolidate_s=t2 - t1)
            elif op == "native":
                ans.update(result=run_native(cmd))
            elif op == "settle":
                t0 = time.perf_counter()
                eng.settle()
                ans.update(consolidate_s=time.perf_counter() - t0)
            elif op == "search":
                if eng.knob is not None and cmd.get("knob") is not None:
                    eng.set_knob(int(cmd["knob"]))
                nq = int(cmd.get("nq", len(queries)))
                ids, lat = timed_search(eng, queries[:nq], int(cmd["k"]))
                np.save(cmd["result"], ids)
                ans.update(latencies=lat.tolist())
            else:
                raise StreamError(f"unknown command {op!r}")
            ans["rss"] = _rss()
            ans.update(eng.info() if eng is not None else {})
        except Exception as e:  # reported to the parent, which names the step
            ans = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        out.write(json.dumps(ans) + "\n")
    return 0


class Worker:
    """The parent's handle on one engine's worker process."""

    def __init__(self, engine: str, python: str, log_path: str, show_stderr: bool = False) -> None:
        """``show_stderr``: the worker's stderr stays the parent's (the core's
        progress bars); its stdout still goes to the log."""
        import subprocess

        self.engine = engine
        self.log_path = log_path
        r, w = os.pipe()
        self._log = open(log_path, "w")
        env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2"))
        self.proc = subprocess.Popen(
            [python, os.path.abspath(__file__), "--serve", str(w)],
            stdin=subprocess.PIPE, stdout=self._log, stderr=None if show_stderr else subprocess.STDOUT,
            pass_fds=(w,), text=True, env=env,
        )
        os.close(w)
        self._answers = os.fdopen(r, "r")

    def call(self, **cmd) -> Dict:
        try:
            self.proc.stdin.write(json.dumps(cmd) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass
        line = self._answers.readline()
        if not line:
            self.proc.wait()
            raise StreamError(f"{self.engine}: worker exited (code {self.proc.returncode}) during {cmd['op']}; "
                              f"its log: {self._tail()}")
        ans = json.loads(line)
        if not ans.get("ok"):
            raise StreamError(f"{self.engine}: {cmd['op']} failed: {ans.get('error')}")
        return ans

    def _tail(self) -> str:
        try:
            with open(self.log_path) as f:
                return f.read()[-2000:] or "(empty)"
        except OSError:
            return "(unreadable)"

    def close(self) -> None:
        try:
            if self.proc.poll() is None:
                self.call(op="quit")
        except (StreamError, OSError, ValueError):
            pass
        try:
            self.proc.wait(timeout=30)
        except Exception:
            self.proc.kill()
        self._answers.close()
        self._log.close()


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--serve":
        sys.exit(serve(int(sys.argv[2])))
    print("usage: streaming.py --serve ANSWER_FD (started by vectide.bench runbook)", file=sys.stderr)
    sys.exit(2)
