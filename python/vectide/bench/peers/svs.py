"""Intel SVS (PyPI ``scalable-vs``): the static Vamana for ``bench ann`` and
``DynamicVamana`` under a runbook, with the Vamana family's R, L and alpha."""

from __future__ import annotations

import time
from typing import Optional

import numpy as np

from .base import _import, _version, _check_metric, VAMANA_R, VAMANA_L_BUILD, VAMANA_ALPHA, VAMANA_SOURCE, _metric_data, Engine, Stream


class SvsEngine(Engine):
    """Intel SVS's static Vamana (PyPI ``scalable-vs``),
    ``svs.Vamana.build(VamanaBuildParameters(...), data, distance,
    num_threads)``, uncompressed float32. Cosine is L2 over unit vectors, so
    alpha = 1.2 means what it means in DiskANN (SVS's own cosine wants
    alpha = 0.95: it maximises similarity); inner product is SVS's MIP with the
    alpha its documentation gives for maximisation, 0.95. Other build
    parameters are SVS's defaults. The knob is the search window size
    (``L``)."""

    name = "svs"
    knob = "L"
    MIP_ALPHA = 0.95

    def __init__(self) -> None:
        super().__init__()
        self.index = None
        self.metric: Optional[str] = None

    def check(self):
        return _import("svs", "scalable-vs")

    def build(self, train, metric, m, ef_construction, threads):
        _check_metric(metric)
        svs = self.check()
        self.metric = metric
        data = _metric_data(train, metric)
        dist = svs.DistanceType.MIP if metric == "ip" else svs.DistanceType.L2
        alpha = self.MIP_ALPHA if metric == "ip" else VAMANA_ALPHA
        bp = svs.VamanaBuildParameters(alpha=alpha, graph_max_degree=VAMANA_R, window_size=VAMANA_L_BUILD)
        t0 = time.perf_counter()
        self.index = svs.Vamana.build(bp, data, dist, num_threads=int(threads))
        build_s = time.perf_counter() - t0
        del data
        self.index.num_threads = 1  # one query per call, on this thread
        self._peer_params(
            metric, m, ef_construction, threads, _version("scalable-vs", svs),
            index_params={
                "index": "svs.Vamana (static), float32",
                "distance": "L2 over unit vectors" if metric == "cosine" else str(dist),
                "graph_max_degree": VAMANA_R, "window_size": VAMANA_L_BUILD, "alpha": alpha,
                "max_candidate_pool_size": "SVS default (2 x graph_max_degree)",
                "prune_to": "SVS default (graph_max_degree - 4)",
                "use_full_search_history": bool(bp.use_full_search_history),
                "num_threads": int(threads),
                "search_parameters_after_build": str(self.index.search_parameters),
            },
            search="Vamana.search(q[None, :], k) with search_window_size = L, one query per call; num_threads = 1",
            source=VAMANA_SOURCE + (" (alpha 0.95 for MIP: SVS's VamanaBuildParameters docstring)"
                                    if metric == "ip" else "") + "; other parameters SVS's defaults",
            library_version=svs.library_version(),
        )
        return build_s

    def prepare_queries(self, queries):
        q = _metric_data(queries, self.metric or "l2")
        return q.reshape(q.shape[0], 1, q.shape[1])  # each item is a (1, d) row

    def set_ef(self, ef):
        self.index.search_window_size = int(ef)

    def query(self, q, k):
        return self.index.search(q, k)[0][0]

    def close(self):
        self.index = None


class SvsStream(Stream):
    """Intel SVS ``DynamicVamana`` (PyPI ``scalable-vs``), built on the
    first insert; cosine as squared L2 over unit vectors, so α means what it
    means in FreshVamana."""

    name = "svs"
    #: How it keeps its index clean after deletes, as the results say.
    policy = "delete() on delete, consolidate() then compact() after every delete step"
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
