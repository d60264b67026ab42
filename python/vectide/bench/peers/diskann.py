"""DiskANN: the static in-memory Vamana index of the Rust DiskANN's bindings
(PyPI ``diskannpy-rust``) for ``bench ann``, and the C++ bindings' dynamic
index (``diskannpy`` 0.7.0, under ``.venv-peers``: it pins numpy 1.25) under a
runbook. Both are built with the Vamana family's R, L and alpha."""

from __future__ import annotations

import shutil
import tempfile
import time
from typing import Optional

import numpy as np

from .base import _import, _version, _stdout_to_stderr, _check_metric, VAMANA_R, VAMANA_L_BUILD, VAMANA_ALPHA, VAMANA_SOURCE, _metric_data, _PeerEngine, Stream


class DiskannEngine(_PeerEngine):
    """DiskANN's static in-memory Vamana index (PyPI ``diskannpy-rust``, the
    Rust DiskANN's bindings, with numpy 2 wheels; the C++ ``diskannpy`` pins
    numpy 1.25). ``build_async_index`` builds the graph by concurrent inserts
    and writes it to a directory, ``AsyncDiskIndex`` loads it into memory:
    ``build_s`` covers both (there is no in-memory-only path), and ``close``
    deletes the directory. Cosine is L2 over unit vectors, the distance the
    alpha rule is defined on. The knob is the search list size ``L``. QPS
    includes diskannpy's Python wrapper around the native search (it copies
    the query and converts the result lists): about a quarter of a query's
    time at 32-d, L = 10."""

    name = "diskann"
    knob = "L"
    METRICS = {"cosine": "l2", "l2": "l2", "ip": "innerproduct"}

    def __init__(self) -> None:
        super().__init__()
        self.index = None
        self.dir: Optional[str] = None
        self.L = 64

    def check(self):
        return _import("diskannpy", "diskannpy-rust")

    def build(self, train, metric, m, ef_construction, threads):
        _check_metric(metric)
        dap = self.check()
        self.metric = metric
        n, dim = train.shape
        data = _metric_data(train, metric)
        dmetric = self.METRICS[metric]
        # Required arguments without a default take the values of DiskANN's own
        # DiskAnnPy test fixture (build_random_vectors_and_async_index) and of
        # AsyncDiskIndex's defaults; num_tasks (concurrent insert tasks over a
        # runtime of num_threads workers) follows the thread count.
        build = {
            "graph_degree": VAMANA_R,
            "complexity": VAMANA_L_BUILD,
            "alpha": VAMANA_ALPHA,
            "num_start_pts": 1,
            "graph_slack_factor": 1.3,
            "max_fp_vecs_per_prune": 0,
            "num_tasks": int(threads),
            "insert_minibatch_size": 1,
            "pq_seed": 0,
            "use_pq": False,
        }
        self.dir = tempfile.mkdtemp(prefix="vectide-bench-diskann-")
        try:
            t0 = time.perf_counter()
            with _stdout_to_stderr():
                dap.build_async_index(
                    data=data, distance_metric=dmetric, index_directory=self.dir,
                    num_threads=int(threads), **build,
                )
                del data
                self.index = dap.AsyncDiskIndex(
                    self.dir, num_threads=1, r=VAMANA_R, l=VAMANA_L_BUILD, alpha=VAMANA_ALPHA,
                    graph_slack_factor=build["graph_slack_factor"], vector_dtype=np.float32,
                    dimensions=dim, max_points=n,
                )
            build_s = time.perf_counter() - t0
        except BaseException:
            self.close()
            raise
        self._peer_params(
            metric, m, ef_construction, threads, _version("diskannpy-rust", dap),
            index_params={"index": "static in-memory (build_async_index + AsyncDiskIndex)",
                          "distance_metric": dmetric, **build, "num_threads": int(threads)},
            search="AsyncDiskIndex.search(q, k, L), one query per call; search runtime of 1 thread (num_threads=1)",
            source=VAMANA_SOURCE + "; the other build arguments from DiskANN's DiskAnnPy test fixture "
            "and AsyncDiskIndex's defaults",
            build_s_covers="build_async_index (writes the vectors, builds, saves) and loading it into memory",
        )
        return build_s

    def set_ef(self, ef):
        self.L = int(ef)

    def query(self, q, k):
        return self.index.search(q, k, max(self.L, k)).identifiers

    def close(self):
        self.index = None
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None


class DiskannStream(Stream):
    """``diskannpy.DynamicMemoryIndex`` (0.7.0). Cosine data arrives unit
    length and is indexed with ``l2`` (the same order, and the distance
    Vamana's α-rule is defined on). Tags are ids + 1: tag 0 is reserved."""

    name = "diskann"
    #: How it keeps its index clean after deletes, as the results say.
    policy = (
        "mark_deleted on delete, consolidate_delete() after every delete step (as the "
        "big-ann-benchmarks streaming baseline does)"
    )
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
