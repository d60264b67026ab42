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

Each adapter names the search knob the sweep varies in ``knob`` (``ef``,
``L``, ``leaves_to_search``; ``None``: measured once) and records in
``params`` how it is configured: the harness's ``m`` / ``ef_construction``
(listed under ``ignores`` by an engine that does not take them), the
library's own parameters under ``index_params``, its version and, for a peer
configured as its authors recommend, where that recommendation comes from
(``config_source``).

Names: ``vectide:ENGINE`` (any engine of the native module, ``vectide:hnsw``
first) and the peers ``hnswlib``, ``faiss-hnsw``, ``usearch`` (HNSW built
with the harness's ``m`` and ``ef_construction``), ``diskann`` (DiskANN's
static in-memory Vamana index, PyPI ``diskannpy-rust``), ``svs`` (Intel SVS
Vamana, PyPI ``scalable-vs``), ``glass`` (PyPI ``pyglass-portable``),
``scann`` and ``vsag`` (VSAG's HGraph, PyPI ``pyvsag``). The Vamana engines
(``vectide:fresh-vamana``, ``diskann``, ``svs``) share R = 64, L_build = 75,
alpha = 1.2 (FreshDiskANN §6.2), so they differ in implementation only.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import math
import os
import shutil
import sys
import tempfile
import time
from typing import Callable, Dict, Iterator, Optional

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


def _version(dist: str, module=None) -> Optional[str]:
    """The installed version of the PyPI distribution ``dist`` (several peers
    have no ``__version__``)."""
    try:
        from importlib.metadata import version

        return version(dist)
    except Exception:
        return getattr(module, "__version__", None)


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """Native code of some peers (glass, diskannpy) prints progress on file
    descriptor 1, where the harness prints its table: send it to stderr, with
    the harness's own log, while their build runs."""
    try:
        sys.stdout.flush()
        saved = os.dup(1)
    except (OSError, ValueError, AttributeError):
        saved = None
    if saved is None:
        yield
        return
    try:
        os.dup2(2, 1)
        yield
    finally:
        try:  # C stdio buffers what printf wrote; it must land on stderr too
            ctypes.CDLL(None).fflush(None)
        except (OSError, AttributeError):
            pass
        os.dup2(saved, 1)
        os.close(saved)


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

    def search_params(self, value: int) -> Dict[str, int]:
        """What a sweep point of a knob other than ``ef`` searched with, as the
        JSON records it (``value`` is the sweep's ``ef``, raised to ``k``).
        An adapter that maps the value onto its library's parameters records
        the parameters it passed."""
        return {self.knob: int(value)} if self.knob is not None else {}

    def _base_params(self, metric, m, ef_construction, threads, **extra) -> None:
        self.params = {
            "metric": metric,
            "m": int(m),
            "ef_construction": int(ef_construction),
            "threads": int(threads),
            **extra,
        }

    def _peer_params(
        self,
        metric: str,
        m: int,
        ef_construction: int,
        threads: int,
        version: Optional[str],
        index_params: Dict[str, object],
        search: str,
        source: str,
        **extra,
    ) -> None:
        """``params`` of a peer configured as its authors recommend rather than
        with the harness's ``m`` / ``ef_construction``: both are still
        recorded (the run's settings, as the native ``vectide bench`` records
        them) and listed under ``ignores``, next to the library's own
        parameters, how a query is issued and where the configuration comes
        from."""
        self._base_params(metric, m, ef_construction, threads, **extra)
        self.params.update(
            ignores=["m", "ef_construction"],
            version=version,
            index_params=index_params,
            search=search,
            config_source=source,
        )


def vectide_descriptor(engine: str) -> Dict[str, object]:
    """The native registry's entry for ``engine`` (``vectide.engines()``);
    ``ValueError`` naming the known engines when there is none."""
    import vectide

    desc = next((e for e in vectide.engines() if e["name"] == engine), None)
    if desc is None:
        known = ", ".join(e["name"] for e in vectide.engines())
        raise ValueError(f"unknown engine 'vectide:{engine}'; known Vectide engines: {known}")
    return desc


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
        self._in_directory = False
        self._dir: Optional[str] = None
        try:
            import vectide

            self.engine = engine or vectide.DEFAULT_ENGINE
            self.name = f"vectide:{self.engine}"
            desc = vectide_descriptor(self.engine)
            self.knob = desc["primary_knob"]
            self._takes = {p["name"] for p in desc["params"]}
            self._in_directory = bool(desc["in_directory"])
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
        if self._in_directory:  # a disk or durable engine: a directory of its own, removed at close
            self._dir = tempfile.mkdtemp(prefix="vectide-bench-", dir=os.environ.get("VECTIDE_BENCH_DIR"))
            build["path"] = os.path.join(self._dir, "index")
        self.index = Index(dim, metric=metric, engine=self.engine, threads=threads, **build)
        ids = np.arange(n, dtype=np.uint64)
        t0 = time.perf_counter()
        self.index.add(ids, train)
        build_s = time.perf_counter() - t0
        self._base_params(metric, m, ef_construction, threads, engine=self.engine)
        ignored = [p for p in ("m", "ef_construction") if p not in self._takes]
        if ignored:  # fresh-vamana takes r / l_build / alpha, flat nothing
            self.params["ignores"] = ignored
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
        self.index = None  # dropping the index stops its background work
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


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


#: Vamana parameters shared by ``vectide:fresh-vamana``, ``diskann`` and
#: ``svs``: FreshDiskANN §6.2 (R = 64, L = 75, alpha = 1.2), so that the three
#: differ in implementation only.
VAMANA_R, VAMANA_L_BUILD, VAMANA_ALPHA = 64, 75, 1.2
VAMANA_SOURCE = "FreshDiskANN (Singh et al. 2021) §6.2: R = 64, L = 75, alpha = 1.2, shared by every Vamana engine"


def _metric_data(train: np.ndarray, metric: str) -> np.ndarray:
    """The training rows as a peer indexes them: unit rows for cosine (the
    peers then search by L2 or inner product, whose order over unit vectors
    is cosine's), float32 C-contiguous otherwise."""
    return _unit_rows(train) if metric == "cosine" else np.ascontiguousarray(train, dtype=np.float32)


class _PeerEngine(Engine):
    """A peer that normalises cosine data itself and takes each query as a
    1-D float32 row."""

    def __init__(self) -> None:
        super().__init__()
        self.metric: Optional[str] = None

    def prepare_queries(self, queries):
        return _metric_data(queries, self.metric or "l2")


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


class GlassEngine(_PeerEngine):
    """glass (PyPI ``pyglass-portable``, zilliztech/pyglass built without
    AVX-512): an HNSW graph searched through a quantized ``Searcher`` whose
    candidates are re-ranked. Configured as pyglass's examples/config.yaml
    (HNSW, R = 48, L = 200, build quantizer SQ8U, refine FP16) with one
    measured departure: search quantizer SQ8U where the README's rule of
    thumb says SQ4U, because the refiner re-ranks only 1.5·k candidates, so
    SQ4U capped recall@10 near 0.91 whatever ef (measured on
    clustered-20k-32 and on synthetic 384-d clusters) and glass would never
    reach the 0.95 / 0.99 targets. Cosine is inner product over
    unit vectors (as glass's ann-benchmarks module does). ``build_s`` covers
    the graph, the searcher's quantizers and ``optimize``."""

    name = "glass"
    knob = "ef"
    R, L = 48, 200
    BUILD_QUANT, SEARCH_QUANT, REFINE_QUANT = "SQ8U", "SQ8U", "FP16"

    def __init__(self) -> None:
        super().__init__()
        self.searcher = None

    def check(self):
        return _import("glass", "pyglass-portable")

    def build(self, train, metric, m, ef_construction, threads):
        _check_metric(metric)
        glass = self.check()
        self.metric = metric
        data = _metric_data(train, metric)
        gmetric = "L2" if metric == "l2" else "IP"
        glass.set_num_threads(int(threads))
        t0 = time.perf_counter()
        with _stdout_to_stderr():
            builder = glass.Index("HNSW", gmetric, self.BUILD_QUANT, R=self.R, L=self.L)
            graph = builder.build(data)
            del builder
            # The Searcher takes the graph over: a second Searcher of the same
            # Graph object finds nothing.
            self.searcher = glass.Searcher(graph, data, gmetric, self.SEARCH_QUANT, self.REFINE_QUANT)
            del graph
            self.searcher.optimize(1)  # tunes prefetching for one search thread
        build_s = time.perf_counter() - t0
        del data
        glass.set_num_threads(1)
        self._peer_params(
            metric, m, ef_construction, threads, _version("pyglass-portable", glass),
            index_params={"index_type": "HNSW", "metric": gmetric, "R": self.R, "L": self.L,
                          "build_quant": self.BUILD_QUANT, "search_quant": self.SEARCH_QUANT,
                          "refine_quant": self.REFINE_QUANT, "refine_factor": 1.5},
            search="Searcher.search(q, k) with set_ef(ef), one query per call; optimize(1), set_num_threads(1)",
            source="zilliztech/pyglass examples/config.yaml (HNSW, R 48, L 200, build SQ8U, refine FP16) and "
            "README rule of thumb (SQ8U to build); search quant SQ8U instead of the README's SQ4U, "
            "which caps recall@10 near 0.91 (refiner re-ranks 1.5k candidates)",
        )
        return build_s

    def set_ef(self, ef):
        self.searcher.set_ef(int(ef))

    def query(self, q, k):
        return self.searcher.search(q, k)[0]

    def close(self):
        self.searcher = None


class ScannEngine(_PeerEngine):
    """Google ScaNN (PyPI ``scann``) as its documentation recommends for a few
    hundred thousand points (docs/algorithms.md rules of thumb and the
    README's GloVe example): a k-means tree of ``round(sqrt(n))`` leaves,
    anisotropic AH scoring with 2 dimensions per block (threshold 0.2; NaN,
    i.e. plain AH, for L2 as ScaNN's own ann-benchmarks entry does), exact
    re-scoring of the top 100. Cosine is dot product over unit vectors. The
    sweep's value ``v`` maps onto ``leaves_to_search = min(v, num_leaves)``
    and ``pre_reorder_num_neighbors = max(100, v)``, so that, as in ScaNN's
    own ann-benchmarks sweeps, a larger value searches more leaves and
    re-scores more candidates."""

    name = "scann"
    knob = "leaves_to_search"
    DIMS_PER_BLOCK, AVQ_THRESHOLD, REORDER = 2, 0.2, 100
    TRAINING_SAMPLE = 250_000  # the README example's sample

    def __init__(self) -> None:
        super().__init__()
        self.searcher = None
        self.num_leaves = 1
        self.leaves = 1
        self.reorder = self.REORDER

    def check(self):
        return _import("scann", "scann")

    def build(self, train, metric, m, ef_construction, threads):
        _check_metric(metric)
        scann = self.check()
        self.metric = metric
        n = train.shape[0]
        data = _metric_data(train, metric)
        measure = "squared_l2" if metric == "l2" else "dot_product"
        avq = float("nan") if metric == "l2" else self.AVQ_THRESHOLD
        self.num_leaves = max(1, round(math.sqrt(n)))
        sample = min(n, self.TRAINING_SAMPLE)
        t0 = time.perf_counter()
        builder = (
            scann.scann_ops_pybind.builder(data, 10, measure)
            # The build-time default of leaves to search (the README's 5 %) is
            # never used: every search passes its own.
            .tree(num_leaves=self.num_leaves, num_leaves_to_search=max(1, self.num_leaves // 20),
                  training_sample_size=sample)
            .score_ah(self.DIMS_PER_BLOCK, anisotropic_quantization_threshold=avq)
            .reorder(self.REORDER)
        )
        builder.set_n_training_threads(int(threads))
        self.searcher = builder.build()
        build_s = time.perf_counter() - t0
        del builder, data
        self.searcher.set_num_threads(1)
        self._peer_params(
            metric, m, ef_construction, threads, _version("scann", scann),
            index_params={"distance_measure": measure, "num_leaves": self.num_leaves,
                          "training_sample_size": sample, "dimensions_per_block": self.DIMS_PER_BLOCK,
                          "anisotropic_quantization_threshold": None if math.isnan(avq) else avq,
                          "reorder": self.REORDER, "training_threads": int(threads)},
            search="searcher.search(q, k, pre_reorder_num_neighbors, leaves_to_search), one query per call; "
            "set_num_threads(1). Sweep value v: leaves_to_search = min(v, num_leaves), "
            "pre_reorder_num_neighbors = max(100, v)",
            source="ScaNN docs/algorithms.md (num_leaves ~ sqrt(n), AH with 2 dims per block, rescore) and "
            "README example (score_ah(2, anisotropic_quantization_threshold=0.2), reorder(100), "
            "training_sample_size 250000); AVQ off for L2 as in ScaNN's ann-benchmarks config",
        )
        return build_s

    def search_params(self, value):
        leaves, reorder = self._mapped(value)
        return {"leaves_to_search": leaves, "pre_reorder_num_neighbors": reorder}

    def _mapped(self, value: int):
        return min(int(value), self.num_leaves), max(self.REORDER, int(value))

    def set_ef(self, ef):
        self.leaves, self.reorder = self._mapped(ef)

    def query(self, q, k):
        return self.searcher.search(q, k, max(self.reorder, k), self.leaves)[0]

    def close(self):
        self.searcher = None


class VsagEngine(_PeerEngine):
    """VSAG's HGraph (PyPI ``pyvsag``), the index VSAG's documentation
    recommends for dense vectors: its quick start's SQ8 base codes,
    max_degree 32 and ef_construction 400, with the documented re-ranking on
    an FP32 copy (``use_reorder``), without which SQ8 capped recall@10 near
    0.97 on clustered-20k-32 (with it: 0.9995 at ef 128, and faster than
    FP32 base codes on synthetic 384-d clusters). Cosine is inner product
    over unit vectors (as VSAG's ann-benchmarks module does). The knob is
    HGraph's ``ef_search``, passed as a JSON string on every call (pyvsag's
    only way). ``memory_bytes`` includes about 130 MB that creating an index
    allocates whatever its size (measured with 2k and 20k points)."""

    name = "vsag"
    knob = "ef"
    INDEX = "hgraph"

    def __init__(self) -> None:
        super().__init__()
        self.index = None
        self._search_json = ""
        self._ids_at = 0

    def check(self):
        return _import("pyvsag", "pyvsag")

    def build(self, train, metric, m, ef_construction, threads):
        _check_metric(metric)
        pyvsag = self.check()
        self.metric = metric
        n, dim = train.shape
        data = _metric_data(train, metric)
        index_param = {
            "base_quantization_type": "sq8",
            "max_degree": 32,
            "ef_construction": 400,
            "use_reorder": True,
            "precise_quantization_type": "fp32",
            "build_thread_count": int(threads),
        }
        config = {"dtype": "float32", "metric_type": "l2" if metric == "l2" else "ip", "dim": int(dim),
                  "index_param": index_param}
        pyvsag.set_logger_off()
        self.index = pyvsag.Index(self.INDEX, json.dumps(config))
        t0 = time.perf_counter()
        self.index.build(vectors=data.reshape(-1), ids=np.arange(n, dtype=np.int64), num_elements=n, dim=dim)
        build_s = time.perf_counter() - t0
        # pyvsag 0.18's docstring says knn_search returns (distances, ids);
        # its wheel returns (ids, distances). Ask once which.
        probe = self.index.knn_search(vector=data[0], k=1, parameters=json.dumps({self.INDEX: {"ef_search": 10}}))
        self._ids_at = 0 if np.asarray(probe[0]).dtype.kind in "iu" else 1
        del data
        self._peer_params(
            metric, m, ef_construction, threads, _version("pyvsag", pyvsag),
            index_params={"index": self.INDEX, **config},
            search='knn_search(q, k, {"hgraph": {"ef_search": ef}}), one query per call on this thread',
            source="VSAG docs (indexes/hgraph.md: HGraph is the recommended default for dense vectors; quick "
            "start sq8, max_degree 32, ef_construction 400; use_reorder with fp32 precise codes for high recall)",
        )
        return build_s

    def set_ef(self, ef):
        self._search_json = json.dumps({self.INDEX: {"ef_search": int(ef)}})

    def query(self, q, k):
        return self.index.knn_search(vector=q, k=k, parameters=self._search_json)[self._ids_at]

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
    "vectide:fresh-vamana": lambda: VectideEngine("fresh-vamana"),
    "hnswlib": HnswlibEngine,
    "faiss-hnsw": FaissHnswEngine,
    "usearch": UsearchEngine,
    "diskann": DiskannEngine,
    "svs": SvsEngine,
    "glass": GlassEngine,
    "scann": ScannEngine,
    "vsag": VsagEngine,
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
