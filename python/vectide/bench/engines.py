"""Engine adapters with one interface, so every engine is driven the same way.

An adapter is built once on the training vectors, then searched one query per
call::

    eng = make_engine("hnswlib")
    build_s = eng.build(train, metric="cosine", m=16, ef_construction=200, threads=1)
    queries = eng.prepare_queries(test)      # untimed: dtype/shape/normalisation
    eng.set_ef(64)
    ids = eng.query(queries[i], k=10)        # 1-D array of ids, closest first

``build`` returns the wall time of the library's add call(s) only.
``prepare_queries`` lets an adapter put the query matrix in the form its
library takes without paying for it inside the timed loop (faiss wants a
``(1, d)`` row and normalised vectors for cosine); it never changes results.

Names: ``vectide:ENGINE`` (any engine of the native module, ``vectide:hnsw``
first), ``hnswlib``, ``faiss-hnsw`` and ``usearch``.
"""

from __future__ import annotations

import time
from typing import Callable, Dict, Optional

import numpy as np

__all__ = ["Engine", "KNOWN_ENGINES", "make_engine", "is_peer"]

METRICS = ("cosine", "l2", "ip")


def _import(module: str, pip_name: str):
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise RuntimeError(
            f"engine needs the Python package {pip_name!r} (import {module!r} failed: {e}); "
            f"install it with: pip install {pip_name}"
        ) from None


def _check_metric(metric: str) -> None:
    if metric not in METRICS:
        raise ValueError(f"unsupported metric {metric!r}; expected one of {', '.join(METRICS)}")


class Engine:
    """Base class: ``build``, ``set_ef``, ``query``; ``name`` and ``params``."""

    name: str = "engine"
    #: The search knob a sweep varies (``None``: exact, measured once).
    knob: Optional[str] = "ef"

    def __init__(self) -> None:
        self.params: Dict[str, object] = {}
        self.reported_memory_bytes: Optional[int] = None

    def build(self, train: np.ndarray, metric: str, m: int, ef_construction: int, threads: int) -> float:
        raise NotImplementedError

    def set_ef(self, ef: int) -> None:
        raise NotImplementedError

    def query(self, q: np.ndarray, k: int) -> np.ndarray:
        raise NotImplementedError

    def check(self) -> None:
        """Raises ``RuntimeError`` naming the package to install when the library is missing."""

    def prepare_queries(self, queries: np.ndarray):
        """The queries as this engine's ``query`` takes them (row ``i`` = query ``i``)."""
        return np.ascontiguousarray(queries, dtype=np.float32)

    def close(self) -> None:
        """Drops the index."""

    def _base_params(self, metric, m, ef_construction, threads, **extra) -> None:
        self.params = {
            "metric": metric,
            "m": int(m),
            "ef_construction": int(ef_construction),
            "threads": int(threads),
            **extra,
        }


class VectideEngine(Engine):
    """``vectide:ENGINE``: ``vectide.Index(..., engine=ENGINE)``. Its build
    parameters and the knob a sweep varies come from the native registry
    (``vectide.engines()``): ``m`` and ``ef_construction`` go to engines
    that take them, and an engine without a knob is measured once."""

    def __init__(self, engine: Optional[str] = None) -> None:
        super().__init__()
        self.engine = engine
        self.name = f"vectide:{engine}"
        self.index = None
        self._knob_value: Optional[int] = None
        self._takes: set = set()
        try:
            import vectide

            self.engine = engine or vectide.DEFAULT_ENGINE
            self.name = f"vectide:{self.engine}"
            desc = next((e for e in vectide.engines() if e["name"] == self.engine), None)
            if desc is None:
                known = ", ".join(e["name"] for e in vectide.engines())
                raise ValueError(f"unknown engine {self.name!r}; known Vectide engines: {known}")
            self.knob = desc["primary_knob"]
            self._takes = {p["name"] for p in desc["params"]}
        except ImportError:
            pass  # check() names what to build

    def check(self):
        try:
            import vectide

            return vectide.Index
        except ImportError as e:
            raise RuntimeError(
                f"engine {self.name} needs the native module vectide._vectide ({e}); "
                "build it with: maturin develop --release"
            ) from None

    def build(self, train, metric, m, ef_construction, threads):
        _check_metric(metric)
        Index = self.check()
        import vectide

        n, dim = train.shape
        build = {"m": m, "ef_construction": ef_construction}
        build = {k: v for k, v in build.items() if k in self._takes}
        self.index = Index(dim, metric=metric, engine=self.engine, threads=threads, **build)
        ids = np.arange(n, dtype=np.uint64)
        t0 = time.perf_counter()
        self.index.add(ids, train)
        build_s = time.perf_counter() - t0
        self._base_params(metric, m, ef_construction, threads, engine=self.engine)
        try:
            self.params["version"] = vectide.__version__
            self.params["index_params"] = dict(self.index.params())
        except Exception:  # informative only
            pass
        try:
            stats = self.index.stats()
            if "memory_bytes" in stats:
                self.reported_memory_bytes = int(stats["memory_bytes"])
        except Exception:
            pass
        return build_s

    def set_ef(self, ef):
        if self.knob == "ef":
            self.index.ef_search = int(ef)
        elif self.knob is not None:
            self._knob_value = int(ef)

    def query(self, q, k):
        if self._knob_value is not None:
            ids, _ = self.index.search(q, k=k, **{self.knob: self._knob_value})
        else:
            ids, _ = self.index.search(q, k=k)
        return ids[0]

    def close(self):
        self.index = None


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


class FaissHnswEngine(Engine):
    """``faiss.IndexHNSWFlat``; cosine is inner product on normalised vectors."""

    name = "faiss-hnsw"

    def __init__(self) -> None:
        super().__init__()
        self.index = None
        self.metric = None

    def check(self):
        return _import("faiss", "faiss-cpu")

    def build(self, train, metric, m, ef_construction, threads):
        _check_metric(metric)
        faiss = self.check()
        self.faiss = faiss
        self.metric = metric
        n, dim = train.shape
        faiss.omp_set_num_threads(int(threads))
        fmetric = faiss.METRIC_L2 if metric == "l2" else faiss.METRIC_INNER_PRODUCT
        self.index = faiss.IndexHNSWFlat(dim, int(m), fmetric)
        self.index.hnsw.efConstruction = int(ef_construction)
        data = _unit_rows(train) if metric == "cosine" else np.ascontiguousarray(train, dtype=np.float32)
        t0 = time.perf_counter()
        self.index.add(data)
        build_s = time.perf_counter() - t0
        del data
        # Searches are issued one query per call from one Python thread, like
        # every other engine; an OpenMP team per call would only add overhead.
        faiss.omp_set_num_threads(1)
        self._base_params(
            metric, m, ef_construction, threads, faiss_metric="L2" if metric == "l2" else "INNER_PRODUCT",
            search_omp_threads=1,
        )
        self.params["version"] = getattr(faiss, "__version__", None)
        return build_s

    def prepare_queries(self, queries):
        q = _unit_rows(queries) if self.metric == "cosine" else np.ascontiguousarray(queries, dtype=np.float32)
        return q.reshape(q.shape[0], 1, q.shape[1])  # each item is a (1, d) row

    def set_ef(self, ef):
        self.index.hnsw.efSearch = int(ef)

    def query(self, q, k):
        if q.ndim == 1:
            q = q.reshape(1, -1)
        _, labels = self.index.search(q, k)
        return labels[0]

    def close(self):
        self.index = None


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


def _unit_rows(x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float32)
    norms = np.linalg.norm(x, axis=1)
    if np.all(np.abs(norms - 1.0) < 1e-5):
        return x  # already normalised: no copy
    norms[norms == 0] = 1.0
    return np.ascontiguousarray(x / norms[:, None], dtype=np.float32)


KNOWN_ENGINES: Dict[str, Callable[[], Engine]] = {
    "vectide:hnsw": lambda: VectideEngine("hnsw"),
    "hnswlib": HnswlibEngine,
    "faiss-hnsw": FaissHnswEngine,
    "usearch": UsearchEngine,
}


def make_engine(name: str) -> Engine:
    """The adapter for ``name``; ``vectide:ENGINE`` passes any ``ENGINE`` through."""
    if name in KNOWN_ENGINES:
        return KNOWN_ENGINES[name]()
    if name.startswith("vectide:") and len(name) > len("vectide:"):
        return VectideEngine(name[len("vectide:") :])
    raise ValueError(
        f"unknown engine {name!r}; known engines: {', '.join(KNOWN_ENGINES)} "
        "(or vectide:ENGINE for another native engine)"
    )


def is_peer(name: str) -> bool:
    """Peers are the engines Vectide is compared against."""
    return not name.startswith("vectide:")
