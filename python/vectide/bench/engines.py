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
``L``, ``leaves_to_search``, ``nprobe``; ``None``: measured once) and records in
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
``scann``, ``vsag`` (VSAG's HGraph, PyPI ``pyvsag``), the RaBitQ-Library
indexes (PyPI ``rabitqlib``) ``symqg`` (SymphonyQG), ``rabitq-hnsw`` (HNSW
over RaBitQ codes, built with the harness's ``m`` and ``ef_construction``)
and ``rabitq-ivf`` (IVF, RaBitQ codes with raw-vector re-ranking), and
faiss's IVF FastScan indexes with exact re-ranking, ``faiss-ivf-rabitq``
(``RR,IVF,RaBitQfs,RFlat``) and ``faiss-ivf-pqfs`` (``IVF,PQx4fs,RFlat``).
The Vamana engines (``vectide:fresh-vamana``, ``diskann``, ``svs``) share
R = 64, L_build = 75, alpha = 1.2 (FreshDiskANN §6.2), so they differ in
implementation only. The IVF peers (``rabitq-ivf``, ``faiss-ivf-*``) have
about ``4 sqrt(n)`` lists and sweep ``nprobe``; rabitqlib's indexes take at
least 64 dimensions, so lower-dimensional data is zero-padded for them
(``params["padded_dim"]``).
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

    def index_bytes(self) -> Optional[int]:
        """The size of the built index as its library accounts for it, or
        ``None`` where the adapter has no such figure. Not called by the
        harness (it measures the RSS growth across the build); the rabitqlib
        and faiss IVF adapters return the size of the library's own
        serialisation of the index (what RaBitQ-Library's benchmarks report as
        index size), written to a temporary file."""
        return None

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
        ignores=("m", "ef_construction"),
        **extra,
    ) -> None:
        """``params`` of a peer configured as its authors recommend rather than
        with the harness's ``m`` / ``ef_construction``: both are still
        recorded (the run's settings, as the native ``vectide bench`` records
        them) and listed under ``ignores``, next to the library's own
        parameters, how a query is issued and where the configuration comes
        from. A peer that does take them (an HNSW) passes ``ignores=()``."""
        self._base_params(metric, m, ef_construction, threads, **extra)
        if ignores:
            self.params["ignores"] = list(ignores)
        self.params.update(
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
        self._wait_background()
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

    def _wait_background(self, poll_s: float = 0.05, timeout_s: float = 3600.0) -> None:
        """Waits until the engine's background work (a merge the inserts
        started, queued rebuild jobs) is done: the build is not over before
        it, and it must not run beside the next engine's build or the
        timed searches. Work still pending after ``timeout_s`` is an error
        naming the engine, not a hang."""
        deadline = time.monotonic() + timeout_s
        while int(self.index.stats().get("pending_background", 0)) > 0:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name}: background work still pending after {timeout_s:.0f} s")
            time.sleep(poll_s)

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


# --------------------------------------------------------------------------
# RaBitQ-Library (PyPI ``rabitqlib``) and faiss's RaBitQ / FastScan IVF indexes

#: The fewest dimensions rabitqlib 0.7 takes: its indexes rotate vectors with
#: ``FhtKacRotator``, which raises "Unsupported dimension" below 64 (above it
#: the library pads to a multiple of 32 itself, and queries keep the original
#: dimension), and its k-means (``RaBitQKMeans``, ``QGKMeans``) requires
#: ``64 <= d``. Lower dimensions are zero-padded to 64: appending zeros
#: changes no L2 distance, inner product or norm, so L2, inner product and
#: cosine order every pair as before.
RABITQ_MIN_DIM = 64
RABITQ_DOCS = "RaBitQ-Library docs (VectorDB-NTU/RaBitQ-Library)"
#: The IVF peers' list count: ``4 * sqrt(n)`` (faiss wiki, "Guidelines to
#: choose an index": K = 4*sqrt(N) to 16*sqrt(N) below 1M vectors; the
#: RaBitQ-Library IVF benchmark's 4,096 lists for 1M vectors), at most one
#: list per 39 points (the minimum points per centroid below which faiss's
#: and rabitqlib's k-means warn).
IVF_POINTS_PER_LIST = 39
IVF_NLIST_RULE = "round(4 * sqrt(n)), at most n // 39 (the k-means minimum of 39 points per centroid)"


def _ivf_nlist(n: int) -> int:
    return max(1, min(round(4 * math.sqrt(n)), n // IVF_POINTS_PER_LIST))


def _zero_pad(x: np.ndarray, dim: int) -> np.ndarray:
    """``x`` (float32 rows) with zero columns appended up to ``dim``."""
    if x.shape[1] == dim:
        return x
    out = np.zeros((x.shape[0], dim), dtype=np.float32)
    out[:, : x.shape[1]] = x
    return out


def _serialized_bytes(write: Callable[[str], None]) -> int:
    """The size of the file ``write(path)`` produces, in a temporary directory."""
    d = tempfile.mkdtemp(prefix="vectide-bench-size-", dir=os.environ.get("VECTIDE_BENCH_DIR"))
    try:
        path = os.path.join(d, "index")
        write(path)
        return os.path.getsize(path)
    finally:
        shutil.rmtree(d, ignore_errors=True)


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


class _FaissIvfRefineEngine(_PeerEngine):
    """A faiss IVF index over compressed codes with exact re-ranking
    (``...,RFlat``: ``IndexRefineFlat`` keeps the float32 vectors), built by
    ``index_factory`` with ``_ivf_nlist(n)`` lists; ``build_s`` covers
    ``train`` and ``add``. Cosine is inner product over unit vectors. The
    faiss wiki gives two search parameters, ``nprobe`` and the re-ranking
    ``k_factor``; the sweep's value ``v`` maps onto ``nprobe = min(v, nlist)``
    and ``max(100, 4 v)`` re-ranked candidates (``k_factor`` = that / k), so
    that a larger value probes more lists and re-ranks more. The factor 4
    follows the measured nprobe x k_factor frontier (clustered-20k-32, both
    metrics, both faiss IVF peers, k = 10): the QPS at recall 0.99 was 2-3x
    that of ``max(100, v)`` (ScaNN's adapter's rule), 8 v did no better and
    16 v was slower."""

    knob = "nprobe"
    REFINE_MIN, REFINE_PER_PROBE = 100, 4

    def __init__(self) -> None:
        super().__init__()
        self.index = None
        self.ivf = None
        self.nlist = 1
        self.refine = self.REFINE_MIN
        self._k: Optional[int] = None

    def check(self):
        return _import("faiss", "faiss-cpu")

    def factory(self, dim: int) -> str:
        raise NotImplementedError

    def _built(self, faiss, dim: int) -> Dict[str, object]:
        """Extra ``index_params`` read off the built index."""
        return {}

    def build(self, train, metric, m, ef_construction, threads):
        _check_metric(metric)
        faiss = self.check()
        self.metric = metric
        data = _metric_data(train, metric)
        n, dim = data.shape
        self.nlist = _ivf_nlist(n)
        fmetric = faiss.METRIC_L2 if metric == "l2" else faiss.METRIC_INNER_PRODUCT
        spec = self.factory(dim)
        faiss.omp_set_num_threads(int(threads))
        self.index = faiss.index_factory(dim, spec, fmetric)
        t0 = time.perf_counter()
        self.index.train(data)
        self.index.add(data)
        build_s = time.perf_counter() - t0
        del data
        faiss.omp_set_num_threads(1)  # one query per call, as for faiss-hnsw
        self.ivf = faiss.downcast_index(faiss.extract_index_ivf(self.index))
        self._k = None
        self._peer_params(
            metric, m, ef_construction, threads, getattr(faiss, "__version__", None),
            index_params={"index_factory": spec, "faiss_metric": "L2" if metric == "l2" else "INNER_PRODUCT",
                          "nlist": self.nlist, "nlist_rule": IVF_NLIST_RULE,
                          "ivf_class": type(self.ivf).__name__, **self._built(faiss, dim)},
            search="index.search(q[None, :], k) with ivf.nprobe and the refine stage's k_factor, one query per "
            "call; omp_set_num_threads(1). Sweep value v: nprobe = min(v, nlist), k_factor = max(100, 4 v) / k",
            source=self.SOURCE,
            build_s_covers="index.train (k-means and the codec) and index.add",
            search_omp_threads=1,
        )
        return build_s

    def prepare_queries(self, queries):
        q = _metric_data(queries, self.metric or "l2")
        return q.reshape(q.shape[0], 1, q.shape[1])  # each item is a (1, d) row

    def search_params(self, value):
        nprobe, refine = self._mapped(value)
        return {"nprobe": nprobe, "refine_candidates": refine}

    def _mapped(self, value: int):
        return min(int(value), self.nlist), max(self.REFINE_MIN, self.REFINE_PER_PROBE * int(value))

    def set_ef(self, ef):
        nprobe, self.refine = self._mapped(ef)
        self.ivf.nprobe = nprobe
        self._k = None  # k_factor is set on the next query, which knows k

    def query(self, q, k):
        if k != self._k:
            self.index.k_factor = max(self.refine, k) / k
            self._k = k
        return self.index.search(q, k)[1][0]

    def index_bytes(self):
        if self.index is None:
            return None
        import faiss

        return _serialized_bytes(lambda path: faiss.write_index(self.index, path))

    def close(self):
        self.index = self.ivf = None


class FaissIvfRabitqEngine(_FaissIvfRefineEngine):
    """faiss ``RR{d},IVF{nlist},RaBitQfs,RFlat``: a random rotation (which
    RaBitQ requires), IVF over 1-bit RaBitQ FastScan codes
    (``IndexIVFRaBitQFastScan``, queries quantised to its default ``qb`` bits)
    and exact re-ranking of the candidates."""

    name = "faiss-ivf-rabitq"
    SOURCE = (
        "faiss wiki 'Guidelines to choose an index' (RaBitQ: random rotation preprocessing, FastScan variant "
        "IVFK,RaBitQfs for faster search; IVF K = 4*sqrt(N) below 1M vectors) and 'The index factory' (RR, "
        "RFlat re-ranking); 1-bit codes + RFlat as the 'Faiss IVF RaBitQfs raw + RFlat' configuration of "
        "RaBitQ-Library's IVF benchmark (docs/benchmarks/ivf.md), searched by nprobe and k_factor"
    )

    def factory(self, dim):
        return f"RR{dim},IVF{self.nlist},RaBitQfs,RFlat"

    def _built(self, faiss, dim):
        return {"rabitq_nb_bits": int(self.ivf.rabitq.nb_bits), "qb": int(self.ivf.qb)}


class FaissIvfPqfsEngine(_FaissIvfRefineEngine):
    """faiss ``IVF{nlist},PQ{M}x4fs,RFlat``: IVF over 4-bit PQ FastScan
    codes (``IndexIVFPQFastScan``) with exact re-ranking, the faiss wiki's
    choice next to HNSW when memory is not a concern ("faster than HNSW").
    ``M = d / 2`` sub-quantizers (2 dimensions per 4-bit code, as the PQ
    FastScan baseline of RaBitQ-Library's IVF benchmark; ``M = d`` for odd
    ``d``)."""

    name = "faiss-ivf-pqfs"
    SOURCE = (
        "faiss wiki 'Guidelines to choose an index' ('Is memory a concern? If not: HNSWM or ... "
        "IVF1024,PQNx4fs,RFlat', faster than HNSW, tuned by nprobe and k_factor; IVF K = 4*sqrt(N) below 1M "
        "vectors); PQ M = d/2 as the 'Faiss IVF PQfs + RFlat' baseline of RaBitQ-Library's IVF benchmark "
        "(docs/benchmarks/ivf.md)"
    )

    @staticmethod
    def pq_m(dim: int) -> int:
        return dim // 2 if dim % 2 == 0 else dim

    def factory(self, dim):
        return f"IVF{self.nlist},PQ{self.pq_m(dim)}x4fs,RFlat"

    def _built(self, faiss, dim):
        return {"pq_m": self.pq_m(dim), "pq_nbits": 4, "bbs": int(self.ivf.bbs)}


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
    "symqg": SymqgEngine,
    "rabitq-hnsw": RabitqHnswEngine,
    "rabitq-ivf": RabitqIvfEngine,
    "faiss-ivf-rabitq": FaissIvfRabitqEngine,
    "faiss-ivf-pqfs": FaissIvfPqfsEngine,
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
