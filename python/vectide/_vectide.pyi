"""Type stubs of the native extension ``vectide._vectide``."""

from os import PathLike
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import numpy as np
import numpy.typing as npt

__version__: str
MISSING_ID: int
LIMITS: dict[str, Union[int, float]]
"""The documented bounds of sizes (``vectide_core::limits``): ``MAX_K``
(100,000: ``k``, ``limit``, ``offset + limit``), ``MAX_BATCH_RESULTS``
(2**24: ``nq * k`` of one call), ``MAX_EF`` (100,000), ``MAX_DIM`` (65,536),
``MIN_M``/``MAX_M`` (2/256), ``MAX_THREADS`` (256), the NLog and NlistLog
sizes ``MAX_NLOG_ENTRIES`` (4096), ``MAX_NLIST_ENTRIES`` (65,536),
``MAX_INITIAL_CAPACITY`` (2**24 rows) and ``MAX_INITIAL_BYTES`` (64 GiB),
``MAX_SNAPSHOT_EVERY``, ``MAX_WAL_BUFFER`` (1 GiB), ``MAX_CHECKPOINT_SECONDS``
(one year), ``JSON_INT_MIN``/``JSON_INT_MAX`` (payload integers). An integer
argument beyond its bound is a ``ValueError``; a non-integer (bool, float,
str, None where not optional) a ``TypeError``."""

DEFAULT_ENGINE: str
"""The engine an ``Index`` or a collection gets when none is named."""

def engines() -> list[dict[str, Any]]:
    """The registered engines, from the native registry: for each, ``name``,
    ``summary``, ``persistence``, ``in_directory``, ``medium`` (``ram``,
    ``pmem``, ``ssd`` or ``remote``: where its searches read), ``knobs`` (search
    knobs it takes), ``primary_knob`` and ``params`` (``name``, ``type`` with
    its range, ``default``, ``doc``, ``source`` of the default). Engine names
    and parameters are documented there, not here."""

_Ids = Union[npt.ArrayLike, Iterable[int]]
_Path = Union[str, "PathLike[str]"]

class CorruptIndexError(ValueError):
    """An index file failed its magic, version, bounds or checksum checks."""

class Index:
    """An approximate nearest-neighbour index over float32 vectors.

    ``Index(dim, metric="cosine", engine=DEFAULT_ENGINE, **params)``: the
    engines and their parameters (types, ranges, defaults) are listed by
    ``vectide.engines()``. ``dim`` is 1..=65,536. An unknown engine or
    parameter, or a value out of its range, is a ``ValueError`` naming the
    known ones or the range (see ``LIMITS``).
    """

    def __init__(
        self,
        dim: int,
        metric: str = "cosine",
        engine: Optional[str] = None,
        path: Optional[_Path] = None,
        **params: Any,
    ) -> None:
        """Engines whose ``in_directory`` is true (see ``engines()``) live in
        the directory `path`: an index there is opened and recovered, else
        one is created."""
    def flush(self) -> None:
        """Makes everything applied so far durable."""
    @property
    def durable_seq(self) -> int: ...
    def recovery(self) -> Optional[dict[str, Any]]:
        """What the last open's recovery did, for engines that report it; None otherwise."""
    def breakdown(self) -> Optional[dict[str, float]]:
        """Insert thread-seconds by phase (search, update, logging), for engines that report it."""
    def maintain(self) -> None:
        """Runs pending maintenance now (delete consolidation for graph engines)."""
    def pause_maintenance(self, paused: bool) -> bool:
        """Holds (True) or releases (False) the engine's background jobs; whether it has any to hold."""
    def check(self) -> list[str]:
        """Structural violations (empty when sound); ValueError for engines without a checker."""
    def add(self, ids: _Ids, vectors: npt.ArrayLike) -> None:
        """Adds vectors (n x dim, float32/float64, C or F order); an existing id is replaced.

        Ids are integers in 0..2**64-2: an array of floats, bools or strings
        (or a list holding one) is a TypeError naming the first position."""
    def search(
        self,
        queries: npt.ArrayLike,
        k: int = 10,
        ef: Optional[int] = None,
        filter: Optional[_Ids] = None,
        **knobs: int,
    ) -> Tuple[npt.NDArray[np.uint64], npt.NDArray[np.float32]]:
        """k nearest neighbours of each query row, closest first: (ids[nq,k], distances[nq,k]).

        A 1-D query gives arrays of shape (1, k). Missing results are padded with
        id 2**64-1 and distance +inf. ``filter`` is an allow-list of ids.
        ``k`` is 1..=100,000 and ``ef`` 1..=100,000 (else ValueError; a
        non-integer is a TypeError); ``nq * k`` is at most 2**24 per call
        (a larger batch is a ValueError: split it). Memory is allocated by
        the result arrays only, never by ``k`` beyond them. ``knobs`` are the
        engine's other search knobs (``engines()[i]["knobs"]``); one the
        engine does not take is a ValueError naming the ones it does.
        """
    def delete(self, ids: _Ids) -> int:
        """Deletes ids (absent ones are ignored); returns how many were removed."""
    def get(self, ids: _Ids) -> npt.NDArray[np.float32]:
        """Stored vectors (n x dim); raises KeyError naming missing ids."""
    def save(self, path: _Path) -> None:
        """Writes the index atomically (temp file, fsync, rename)."""
    @staticmethod
    def load(path: _Path, threads: Optional[int] = None, **params: Any) -> "Index":
        """Opens a saved index or a durable engine's directory; ``threads`` is 1..=256;
        ``params`` are the engine's open-time parameters (``engines()[i]["open_params"]``)."""
    def params(self) -> dict[str, Any]: ...
    def stats(self) -> dict[str, int]: ...
    def __len__(self) -> int: ...
    def __contains__(self, id: object) -> bool: ...
    @property
    def dim(self) -> int: ...
    @property
    def metric(self) -> str: ...
    @property
    def engine(self) -> str: ...
    @property
    def threads(self) -> int: ...
    ef_search: int

def allocator() -> str:
    """``mimalloc`` (the product's allocator) or ``system`` (a build with
    the ``system-allocator`` feature, for comparisons)."""

def simd_isa() -> str:
    """The instruction set the distance kernels use: 'avx512', 'avx2', 'neon' or 'scalar'."""

RECALL_TARGETS: list[float]
"""The recall targets benchmarks report QPS at (0.9, 0.95, 0.99)."""

def recall_at_k(found: npt.NDArray[np.uint64], truth: npt.NDArray[np.uint64], k: int) -> float:
    """Mean over queries of ``|found[i, :k] ∩ truth[i, :k]| / k`` (C-ordered
    ``(nq, w)`` arrays; ``MISSING_ID`` pads short rows and never matches;
    duplicates count once). ``ValueError`` for ``k < 1``, no queries, row
    counts that differ or truth rows shorter than ``k``. The same code as
    ``vectide bench`` (``vectide_core::eval``); ``vectide.bench.metrics``
    wraps it for lists of rows."""

def pareto_frontier(points: list[Tuple[float, float]]) -> list[Tuple[float, float]]:
    """The ``(recall, qps)`` points no other point beats on both, by increasing recall."""

def qps_at_recall(points: list[Tuple[float, float]], target: float) -> Optional[float]:
    """QPS at ``target`` recall: ``None`` if no point reaches it, a point's QPS at
    exactly ``target``, the lowest frontier point's QPS below it, else log-QPS
    interpolated linearly in recall between the bracketing frontier points."""

def runbook_parse(text: bytes, dataset: Optional[str] = None) -> Tuple[str, int, list[dict[str, Any]]]:
    """A runbook's steps as the harness core reads them; ``ValueError``
    names the first problem."""
def runbook_check(text: bytes, n: int, dataset: Optional[str] = None) -> dict[str, int]:
    """Counts of a runbook's operations and its largest active set over
    ``n`` rows; ``ValueError`` names the step of the first problem."""
def runbook_default_engines() -> list[str]:
    """The engines a runbook runs when none are named (``vectide:NAME``)."""
def runbook_engine(spec: str, update_threads: int = 2, knob: int = 100, nprobe: int = 32) -> str:
    """An engine of a run resolved as the run will (its result key);
    ``ValueError`` names the problem."""
def runbook_build_params() -> str:
    """The build parameters of every run, by family, as JSON text."""
def runbook_truth(
    text: bytes, rows: npt.NDArray[np.float32], queries: npt.NDArray[np.float32], metric: str, k: int,
    threads: int = 2,
) -> list[Optional[npt.NDArray[np.uint64]]]:
    """Exact neighbours of every search step of a runbook (``None`` where
    the active set is empty), from the harness core."""
def runbook_run(
    engine: str, text: bytes, rows: npt.NDArray[np.float32], queries: npt.NDArray[np.float32], metric: str,
    truth: list[Optional[npt.NDArray[np.uint64]]], k: int, knob: int, nprobe: int, update_threads: int,
    settle_after_deletes: bool = False, calibrate: list[int] = ..., target: float = 0.95,
    isolated: bool = True, workdir: Optional[str] = None,
) -> str:
    """One native engine through a runbook with the harness core's timed
    loop; its result document as JSON text."""
def runbook_report(head: str, results: str, isolated: bool = True) -> str:
    """The result document of a runbook run, as JSON text."""
def kmeans_labels(x: npt.NDArray[np.float32], k: int, seed: int = 0, iters: int = 25) -> npt.NDArray[np.uint32]:
    """Cluster labels from the quantization room's k-means."""

class PoisonedError(RuntimeError):
    """A write already in the log failed to apply: reads go on, writes are
    refused until the index or database is reopened (which replays the log)."""

class DatabaseLockedError(RuntimeError):
    """The database directory is open in another process."""

class _Database:
    """Native side of vectide.Database (JSON text in, JSON text out)."""
    @staticmethod
    def open(
        path: _Path,
        durability: str = "group",
        threads: Optional[int] = None,
        checkpoint_bytes: Optional[int] = None,
        checkpoint_seconds: Optional[float] = None,
    ) -> "_Database": ...
    def create_collection(self, name: str, dim: int, metric: str, engine: str, params: Dict[str, Any]) -> "_Collection": ...
    def create_collection_spaces(
        self, name: str, dense: List[Tuple[str, int, str, str, Dict[str, Any]]], sparse: List[Tuple[str, Optional[str]]]
    ) -> "_Collection": ...
    def collection(self, name: str) -> "_Collection": ...
    def list_collections(self) -> list[str]: ...
    def delete_collection(self, name: str) -> bool: ...
    def flush(self) -> None: ...
    @property
    def path(self) -> str: ...

class _Collection:
    """Native side of vectide.Collection."""
    def upsert(self, ids: Any, vectors: npt.ArrayLike, payloads: Optional[Sequence[Any]] = None) -> int:
        """``ids``: one id or a list (int 0..2**64-1, str, uuid.UUID, numpy
        integers); ``payloads``: one JSON-shaped object per id (or None)."""
    def search(
        self,
        queries: npt.ArrayLike,
        k: int = 10,
        filter: Optional[Union[Dict[str, Any], str]] = None,
        ef: Optional[int] = None,
        with_payload: bool = True,
        with_vector: bool = False,
        exact: bool = False,
        **knobs: int,
    ) -> List[List[Tuple[Union[int, str], float, float, Any, Optional[List[float]]]]]:
        """Per query, hits ``(id, score, distance, payload, vector)``. ``k``
        1..=100,000, ``ef`` 1..=100,000 (the engine's primary knob, ignored
        without one), ``nq * k`` at most 2**24; ``exact`` scans every live
        point; ``knobs`` are the engine's native search knobs."""
    def get(self, ids: Any, with_vector: bool = True) -> List[Optional[Tuple[Union[int, str], Any, Optional[npt.NDArray[np.float32]]]]]: ...
    def delete(self, ids: Any = None, filter: Optional[Union[Dict[str, Any], str]] = None) -> int: ...
    def count(self, filter: Optional[Union[Dict[str, Any], str]] = None) -> int: ...
    def scroll(
        self,
        filter: Optional[Union[Dict[str, Any], str]] = None,
        offset: Any = None,
        limit: int = 10,
        with_vector: bool = False,
    ) -> Tuple[List[Tuple[Union[int, str], Any, Optional[npt.NDArray[np.float32]]]], Optional[Union[int, str]]]:
        """``limit`` 0..=100,000."""
    def set_payload(self, payload: Dict[str, Any], ids: Any = None, filter: Optional[Union[Dict[str, Any], str]] = None) -> int: ...
    def upsert_points(self, points: List[Dict[str, Any]]) -> int: ...
    def query(self, body: Dict[str, Any]) -> List[Tuple[Any, float, Optional[Dict[str, Any]], Any]]: ...
    def query_groups(self, body: Dict[str, Any]) -> List[Tuple[Union[int, str], List[Tuple[Any, float, Optional[Dict[str, Any]], Any]]]]: ...
    def edit_payload(
        self, kind: str, arg: Any, key: Optional[str] = None, ids: Any = None, filter: Optional[Union[Dict[str, Any], str]] = None
    ) -> int: ...
    def create_index(self, field: str, kind: str) -> None: ...
    def checkpoint(self) -> None: ...
    def maintain(self) -> None: ...
    def info(self) -> str: ...
    def __len__(self) -> int: ...
    @property
    def name(self) -> str: ...
