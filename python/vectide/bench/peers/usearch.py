"""USearch (PyPI ``usearch``): HNSW built with the harness's M and
efConstruction."""

from __future__ import annotations

import time

import numpy as np

from .base import _import, _check_metric, Engine


class UsearchEngine(Engine):
    """``usearch.index.Index`` with f32 storage (no quantisation)."""

    name = "usearch"
    METRICS = {"cosine": "cos", "l2": "l2sq", "ip": "ip"}

    def __init__(self) -> None:
        super().__init__()
        self.index = None

    def check(self):
        return _import("usearch.index", "usearch")

    def build(self, train, metric, m, ef_construction, threads):
        _check_metric(metric)
        usearch_index = self.check()
        n, dim = train.shape
        self.index = usearch_index.Index(
            ndim=dim,
            metric=self.METRICS[metric],
            dtype="f32",
            connectivity=int(m),
            expansion_add=int(ef_construction),
            expansion_search=64,
        )
        keys = np.arange(n, dtype=np.uint64)
        t0 = time.perf_counter()
        self.index.add(keys, train, threads=int(threads))
        build_s = time.perf_counter() - t0
        self._base_params(metric, m, ef_construction, threads, usearch_metric=self.METRICS[metric], dtype="f32")
        try:
            import usearch

            self.params["version"] = usearch.__version__
            self.params["dtype_effective"] = str(self.index.dtype)
        except Exception:
            pass
        return build_s

    def set_ef(self, ef):
        self.index.expansion_search = int(ef)

    def query(self, q, k):
        return self.index.search(q, k, threads=1).keys

    def close(self):
        self.index = None


#: Vamana parameters shared by ``vectide:fresh-vamana``, ``diskann`` and
#: ``svs``: FreshDiskANN §6.2 (R = 64, L = 75, alpha = 1.2), so that the three
#: differ in implementation only.
