"""Type stubs of the native extension ``vectide._vectide``."""

from os import PathLike
from typing import Any, Iterable, Optional, Tuple, Union

import numpy as np
import numpy.typing as npt

__version__: str
MISSING_ID: int

_Ids = Union[npt.ArrayLike, Iterable[int]]
_Path = Union[str, "PathLike[str]"]

class CorruptIndexError(ValueError):
    """An index file failed its magic, version, bounds or checksum checks."""

class Index:
    """An approximate nearest-neighbour index over float32 vectors.

    ``Index(dim, metric="cosine", engine="hnsw", **params)``; for ``hnsw`` the
    params are ``m`` (16), ``ef_construction`` (200), ``ef_search`` (64),
    ``seed``, ``consolidate_fraction`` (0.05), ``repair_alpha`` (1.0) and
    ``threads`` (default: all cores).
    """

    def __init__(
        self,
        dim: int,
        metric: str = "cosine",
        engine: str = "hnsw",
        path: Optional[_Path] = None,
        **params: Any,
    ) -> None:
        """Durable engines ("p-hnsw", "hnsw-snap", "hnsw-wal") live in the
        directory `path`: an index there is opened and recovered, else one is
        created. p-hnsw takes persist="pmem" (default) or "msync"."""
    def flush(self) -> None:
        """Makes everything applied so far durable."""
    @property
    def durable_seq(self) -> int: ...
    def recovery(self) -> Optional[dict[str, Any]]:
        """p-hnsw: what the last open's recovery did; None otherwise."""
    def breakdown(self) -> Optional[dict[str, float]]:
        """p-hnsw: insert thread-seconds by phase (search, update, logging)."""
    def check(self) -> list[str]:
        """p-hnsw: structural violations (empty when sound)."""
    def add(self, ids: _Ids, vectors: npt.ArrayLike) -> None:
        """Adds vectors (n x dim, float32/float64, C or F order); an existing id is replaced."""
    def search(
        self,
        queries: npt.ArrayLike,
        k: int = 10,
        ef: Optional[int] = None,
        filter: Optional[_Ids] = None,
    ) -> Tuple[npt.NDArray[np.uint64], npt.NDArray[np.float32]]:
        """k nearest neighbours of each query row, closest first: (ids[nq,k], distances[nq,k]).

        A 1-D query gives arrays of shape (1, k). Missing results are padded with
        id 2**64-1 and distance +inf. ``filter`` is an allow-list of ids.
        """
    def delete(self, ids: _Ids) -> int:
        """Deletes ids (absent ones are ignored); returns how many were removed."""
    def get(self, ids: _Ids) -> npt.NDArray[np.float32]:
        """Stored vectors (n x dim); raises KeyError naming missing ids."""
    def save(self, path: _Path) -> None:
        """Writes the index atomically (temp file, fsync, rename)."""
    @staticmethod
    def load(path: _Path, threads: Optional[int] = None) -> "Index": ...
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

def simd_isa() -> str:
    """The instruction set the distance kernels use: 'avx512', 'avx2', 'neon' or 'scalar'."""

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
    def create_collection(self, name: str, dim: int, metric: str, engine: str, params_json: str) -> "_Collection": ...
    def collection(self, name: str) -> "_Collection": ...
    def list_collections(self) -> list[str]: ...
    def delete_collection(self, name: str) -> bool: ...
    def flush(self) -> None: ...
    @property
    def path(self) -> str: ...

class _Collection:
    """Native side of vectide.Collection."""
    def upsert(self, ids_json: str, vectors: npt.ArrayLike, payloads_json: Optional[str] = None) -> int: ...
    def search(
        self,
        queries: npt.ArrayLike,
        k: int = 10,
        filter_json: Optional[str] = None,
        ef: Optional[int] = None,
        with_payload: bool = True,
        with_vector: bool = False,
    ) -> str: ...
    def get(self, ids_json: str, with_vector: bool = True) -> str: ...
    def delete(self, ids_json: Optional[str] = None, filter_json: Optional[str] = None) -> int: ...
    def count(self, filter_json: Optional[str] = None) -> int: ...
    def scroll(
        self,
        filter_json: Optional[str] = None,
        offset_json: Optional[str] = None,
        limit: int = 10,
        with_vector: bool = False,
    ) -> str: ...
    def set_payload(self, payload_json: str, ids_json: Optional[str] = None, filter_json: Optional[str] = None) -> int: ...
    def create_index(self, field: str, kind: str) -> None: ...
    def checkpoint(self) -> None: ...
    def info(self) -> str: ...
    def __len__(self) -> int: ...
    @property
    def name(self) -> str: ...
