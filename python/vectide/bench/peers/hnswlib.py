"""hnswlib (PyPI ``hnswlib``): the HNSW graph built with the harness's M and
efConstruction, and the same library under a runbook (``mark_deleted``,
``replace_deleted``)."""

from __future__ import annotations

import time

import numpy as np

from .base import _import, _check_metric, Engine, Stream


class HnswlibEngine(Engine):
    name = "hnswlib"
    SPACES = {"cosine": "cosine", "l2": "l2", "ip": "ip"}

    def __init__(self, seed: int = 100) -> None:
        super().__init__()
        self.seed = seed
        self.index = None

    def check(self):
        return _import("hnswlib", "hnswlib")

    def build(self, train, metric, m, ef_construction, threads):
        _check_metric(metric)
        hnswlib = self.check()
        n, dim = train.shape
        self.index = hnswlib.Index(space=self.SPACES[metric], dim=dim)
        self.index.init_index(max_elements=n, M=m, ef_construction=ef_construction, random_seed=self.seed)
        self.index.set_num_threads(threads)
        t0 = time.perf_counter()
        self.index.add_items(train, np.arange(n), num_threads=threads)
        build_s = time.perf_counter() - t0
        self._base_params(metric, m, ef_construction, threads, space=self.SPACES[metric], random_seed=self.seed)
        self.params["version"] = getattr(hnswlib, "__version__", None)
        return build_s

    def set_ef(self, ef):
        self.index.set_ef(int(ef))

    def query(self, q, k):
        labels, _ = self.index.knn_query(q, k=k)
        return labels[0]

    def close(self):
        self.index = None


class HnswlibStream(Stream):
    name = "hnswlib"
    #: How it keeps its index clean after deletes, as the results say.
    policy = (
        "mark_deleted on delete; inserts of new ids reuse deleted slots "
        "(allow_replace_deleted, add_items(replace_deleted=True)); a deleted id inserted "
        "again is unmarked and updated; no consolidation exists in hnswlib"
    )

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
