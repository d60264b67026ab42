"""RaBitQ-Library (PyPI ``rabitqlib``): SymphonyQG, HNSW over RaBitQ codes
and IVF with raw-vector re-ranking."""

from __future__ import annotations

import time
from typing import Dict, Optional

import numpy as np

from .base import _import, _version, _check_metric, _metric_data, RABITQ_MIN_DIM, RABITQ_DOCS, IVF_NLIST_RULE, _ivf_nlist, _zero_pad, _serialized_bytes, _PeerEngine


class _RabitqEngine(_PeerEngine):
    """A RaBitQ-Library index (PyPI ``rabitqlib``). Cosine is inner product
    over unit vectors (the library's quick start: "normalize database and
    query vectors first and use metric='ip'"); rows of fewer than
    ``RABITQ_MIN_DIM`` dimensions are zero-padded (``params["padded_dim"]``),
    queries too. Queries go one per call as a ``(1, d)`` row with
    ``num_threads`` 1 (the Python default)."""

    def __init__(self) -> None:
        super().__init__()
        self.index = None
        self.dim: Optional[int] = None
        self.padded_dim: Optional[int] = None

    def check(self):
        return _import("rabitqlib", "rabitqlib")

    def _data(self, train: np.ndarray, metric: str) -> np.ndarray:
        self.metric = metric
        self.dim = int(train.shape[1])
        self.padded_dim = max(self.dim, RABITQ_MIN_DIM)
        return _zero_pad(_metric_data(train, metric), self.padded_dim)

    @staticmethod
    def _rq_metric(metric: str) -> str:
        return "l2" if metric == "l2" else "ip"

    def _padding(self) -> Dict[str, object]:
        padded = self.padded_dim != self.dim
        return {
            "input_dim": self.dim,
            "padded_dim": self.padded_dim,
            "padding": (f"zeros appended to the vectors and queries, {self.dim} -> {self.padded_dim} dimensions "
                        f"(rabitqlib's rotator and k-means take at least {RABITQ_MIN_DIM}); L2, inner product "
                        "and cosine unchanged") if padded else "none",
        }

    def prepare_queries(self, queries):
        q = _zero_pad(_metric_data(queries, self.metric or "l2"), self.padded_dim or queries.shape[1])
        return q.reshape(q.shape[0], 1, q.shape[1])  # each item is a (1, d) row

    def index_bytes(self):
        return _serialized_bytes(self.index.save) if self.index is not None else None

    def close(self):
        self.index = None


def _rabitq_clusters(rq, data: np.ndarray, k: int, spherical: bool, threads: int):
    """Centroids and exact assignments of ``data`` into ``k`` clusters by
    rabitqlib's own k-means as its IVF and HNSW benchmarks train them: up to
    10 iterations, seed 42, exact final assignment, spherical for inner
    product. ``RaBitQKMeans`` for few clusters, ``QGKMeans`` for more than its
    graph degree (32), as the clustering docs recommend."""
    cls = rq.QGKMeans if k > 32 else rq.RaBitQKMeans
    km = cls(data.shape[1], k, niter=10, seed=42, final_assignment=rq.FinalAssignmentMode.Exact,
             spherical=spherical, num_threads=int(threads))
    km.train(data)
    return km.centroids, km.assignments, cls.__name__


class _RabitqGraphEngine(_RabitqEngine):
    """A rabitqlib graph index, searched as ``index.search(q, k, ef)``; the
    knob is ``ef`` (at least ``k``)."""

    knob = "ef"

    def __init__(self) -> None:
        super().__init__()
        self.ef = 64

    def set_ef(self, ef):
        self.ef = int(ef)

    def query(self, q, k):
        return self.index.search(q, k, max(self.ef, k))[0][0]


class SymqgEngine(_RabitqGraphEngine):
    """SymphonyQG (``rabitqlib.SymqgIndex``) as the library's docs and
    examples configure it: maximum degree 32, ``ef_construction`` 200, PiPNN
    initialisation, raw vectors (``quantization_bits=0``, the default). The
    knob is the query search window ``ef``."""

    name = "symqg"
    MAX_DEGREE, EF_CONSTRUCTION, QUANTIZATION_BITS, INIT = 32, 200, 0, "pipnn"

    def build(self, train, metric, m, ef_construction, threads):
        _check_metric(metric)
        rq = self.check()
        data = self._data(train, metric)
        rmetric = self._rq_metric(metric)
        self.index = rq.SymqgIndex(dim=self.padded_dim, max_degree=self.MAX_DEGREE, metric=rmetric,
                                   quantization_bits=self.QUANTIZATION_BITS)
        t0 = time.perf_counter()
        self.index.build(data, ef_construction=self.EF_CONSTRUCTION, num_threads=int(threads), init=self.INIT)
        build_s = time.perf_counter() - t0
        del data
        self._peer_params(
            metric, m, ef_construction, threads, _version("rabitqlib", rq),
            index_params={"index": "SymqgIndex", "metric": rmetric, "max_degree": self.MAX_DEGREE,
                          "ef_construction": self.EF_CONSTRUCTION, "quantization_bits": self.QUANTIZATION_BITS,
                          "init": self.INIT, "num_threads": int(threads)},
            search="SymqgIndex.search(q[None, :], k, ef), one query per call; num_threads = 1",
            source=RABITQ_DOCS + ": docs/index/qg.md Python example and sample/python/symqg_indexing.py "
            "(max_degree 32, ef_construction 200, init pipnn, quantization_bits 0), as in the library's "
            "graph benchmark (docs/benchmarks/graphs.md)",
            **self._padding(),
        )
        return build_s


class RabitqHnswEngine(_RabitqGraphEngine):
    """HNSW over RaBitQ codes (``rabitqlib.HnswIndex``), built with the
    harness's ``m`` and ``ef_construction`` like the other HNSW peers (the
    defaults, 16 and 200, are also the library's benchmark settings) and
    configured otherwise as RaBitQ-Library's graph benchmark: 1 + 8 bits per
    dimension (``nbits=9``, its most accurate setting), random seed 42, 16
    centroids from ``RaBitQKMeans``. The graph is built from the raw vectors;
    the index keeps only the codes (the base layer re-ranks with the extra
    bits). The knob is ``ef``. ``build_s`` includes the k-means."""

    name = "rabitq-hnsw"
    NBITS, CLUSTERS, SEED = 9, 16, 42

    def build(self, train, metric, m, ef_construction, threads):
        _check_metric(metric)
        rq = self.check()
        data = self._data(train, metric)
        n = data.shape[0]
        rmetric = self._rq_metric(metric)
        clusters = min(self.CLUSTERS, n)
        t0 = time.perf_counter()
        centroids, assignments, kmeans = _rabitq_clusters(rq, data, clusters, rmetric == "ip", threads)
        self.index = rq.HnswIndex(dim=self.padded_dim, max_elements=n, M=int(m), ef_construction=int(ef_construction),
                                  nbits=self.NBITS, metric=rmetric, random_seed=self.SEED)
        self.index.build(data, centroids, assignments, num_threads=int(threads))
        build_s = time.perf_counter() - t0
        del data, centroids, assignments
        self._peer_params(
            metric, m, ef_construction, threads, _version("rabitqlib", rq),
            index_params={"index": "HnswIndex", "metric": rmetric, "M": int(m),
                          "ef_construction": int(ef_construction), "nbits": self.NBITS, "random_seed": self.SEED,
                          "num_clusters": clusters, "kmeans": f"{kmeans}(niter=10, seed=42, exact final "
                          f"assignment, spherical={rmetric == 'ip'})", "fast_quantization": False,
                          "num_threads": int(threads)},
            search="HnswIndex.search(q[None, :], k, ef), one query per call; num_threads = 1",
            source=RABITQ_DOCS + ": graph benchmark (docs/benchmarks/graphs.md: HNSW RaBitQ 1+8, nbits 9, M 16, "
            "efConstruction 200, seed 42, 16 RaBitQKMeans centroids, up to 10 iterations, exact final "
            "assignment) and sample/python/hnsw_rabitq_indexing.py; M and efConstruction are the harness's",
            ignores=(),
            build_s_covers="k-means (16 centroids) and HnswIndex.build",
            **self._padding(),
        )
        return build_s


class RabitqIvfEngine(_RabitqEngine):
    """IVF over RaBitQ codes (``rabitqlib.IvfIndex``) in its raw-vector
    re-ranking mode (``nbits=32``: one-bit FastScan codes filter, the stored
    float32 vectors re-rank), the "IVF RaBitQ raw" configuration of
    RaBitQ-Library's IVF benchmark and its most accurate. ``_ivf_nlist(n)``
    lists from rabitqlib's k-means (``QGKMeans`` for many lists). The knob is
    ``nprobe``: the sweep's value ``v`` probes ``min(v, nlist)`` lists.
    ``build_s`` includes the k-means."""

    name = "rabitq-ivf"
    knob = "nprobe"
    NBITS = 32

    def __init__(self) -> None:
        super().__init__()
        self.nlist = 1
        self.nprobe = 1

    def build(self, train, metric, m, ef_construction, threads):
        _check_metric(metric)
        rq = self.check()
        data = self._data(train, metric)
        n = data.shape[0]
        rmetric = self._rq_metric(metric)
        self.nlist = _ivf_nlist(n)
        t0 = time.perf_counter()
        centroids, assignments, kmeans = _rabitq_clusters(rq, data, self.nlist, rmetric == "ip", threads)
        self.index = rq.IvfIndex(dim=self.padded_dim, max_elements=n, num_clusters=self.nlist, nbits=self.NBITS,
                                 metric=rmetric)
        self.index.build(data, centroids, assignments, num_threads=int(threads))
        build_s = time.perf_counter() - t0
        del data, centroids, assignments
        self._peer_params(
            metric, m, ef_construction, threads, _version("rabitqlib", rq),
            index_params={"index": "IvfIndex", "metric": rmetric, "nbits": self.NBITS,
                          "num_clusters": self.nlist, "num_clusters_rule": IVF_NLIST_RULE,
                          "kmeans": f"{kmeans}(niter=10, seed=42, exact final assignment, "
                          f"spherical={rmetric == 'ip'})", "fast_quantization": False,
                          "high_accuracy": "automatic", "num_threads": int(threads)},
            search="IvfIndex.search(q[None, :], k, nprobe), one query per call; num_threads = 1. "
            "Sweep value v: nprobe = min(v, num_clusters)",
            source=RABITQ_DOCS + ": IVF benchmark (docs/benchmarks/ivf.md: 'IVF RaBitQ raw', nbits 32; k-means "
            "up to 10 iterations, seed 42, exact final assignment, spherical for inner product), docs/index/ivf.md "
            "and docs/clustering.md (QGKMeans for many clusters); num_clusters ~ 4 sqrt(n) as the benchmark's "
            "4096 for 1M (faiss wiki's 4*sqrt(N) rule)",
            build_s_covers="k-means and IvfIndex.build",
            **self._padding(),
        )
        return build_s

    def search_params(self, value):
        return {"nprobe": self._mapped(value)}

    def _mapped(self, value: int) -> int:
        return min(int(value), self.nlist)

    def set_ef(self, ef):
        self.nprobe = self._mapped(ef)

    def query(self, q, k):
        return self.index.search(q, k, self.nprobe)[0][0]
