"""What every peer adapter shares: the two interfaces (:class:`Engine`, built
once and searched, for ``bench ann``; :class:`Stream`, driven step by step
through a runbook), the import of a peer's library, metric handling, and
the build parameters the peers of a family share.

Imports nothing but numpy and the standard library, so that the streaming
worker runs it under ``.venv-peers`` (which has neither Vectide's extension
nor the other peers).
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import shutil
import sys
import tempfile
from typing import Callable, Dict, Iterator, Optional

import numpy as np


class PeerError(RuntimeError):
    """A peer cannot run (its package is missing) or one of its operations
    failed; the message names the engine and, in a runbook, the step."""


def _import(module: str, pip_name: str):
    """The peer's library, or :class:`PeerError` naming the package to install."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise PeerError(
            f"engine needs the Python package {pip_name!r} (import {module!r} failed: {e}); "
            f"install it with: pip install {pip_name}"
        ) from None


METRICS = ("cosine", "l2", "ip")


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


VAMANA_R, VAMANA_L_BUILD, VAMANA_ALPHA = 64, 75, 1.2
VAMANA_SOURCE = "FreshDiskANN (Singh et al. 2021) §6.2: R = 64, L = 75, alpha = 1.2, shared by every Vamana engine"


def _metric_data(train: np.ndarray, metric: str) -> np.ndarray:
    """The training rows as a peer indexes them: unit rows for cosine (the
    peers then search by L2 or inner product, whose order over unit vectors
    is cosine's), float32 C-contiguous otherwise."""
    return _unit_rows(train) if metric == "cosine" else np.ascontiguousarray(train, dtype=np.float32)


def _unit_rows(x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float32)
    norms = np.linalg.norm(x, axis=1)
    if np.all(np.abs(norms - 1.0) < 1e-5):
        return x  # already normalised: no copy
    norms[norms == 0] = 1.0
    return np.ascontiguousarray(x / norms[:, None], dtype=np.float32)


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


class _PeerEngine(Engine):
    """A peer that normalises cosine data itself and takes each query as a
    1-D float32 row."""

    def __init__(self) -> None:
        super().__init__()
        self.metric: Optional[str] = None

    def prepare_queries(self, queries):
        return _metric_data(queries, self.metric or "l2")


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
