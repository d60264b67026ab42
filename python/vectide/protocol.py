"""The collection protocol: what a Vectide collection and a Vectide
database offer, whichever way they are reached.

Two implementations satisfy it today: the embedded database
(``vectide.connect(path)``, ``vectide.db``) and the HTTP client
(``vectide.Client(url)``, ``vectide.client``); the cluster will be the third.
``python/tests/test_protocol.py`` runs one test suite against each, so a
caller written against these two classes works with any of them.

Both return the same values: ``Hit`` (``id``, ``score``, ``distance``,
``payload``, ``vector``) from ``search``, ``Group`` (``id``, ``hits``) from
``query_groups``, ``Point`` (``id``, ``payload``,
``vector`` as a float32 array) from ``get`` and ``scroll``; ids are ``int``
or ``str`` (UUIDs in their hyphenated form). Errors: ``KeyError`` for an
unknown collection or point, ``ValueError`` for bad values, ``TypeError``
for values of the wrong type.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Protocol, Tuple, runtime_checkable

import numpy as np

from .db import Group, Hit, Point, PointId

__all__ = ["CollectionProtocol", "DatabaseProtocol"]


@runtime_checkable
class CollectionProtocol(Protocol):
    """A named set of points with vectors and JSON payloads."""

    @property
    def name(self) -> str: ...

    def info(self) -> Dict[str, Any]: ...

    def __len__(self) -> int: ...

    def upsert(self, ids, vectors, payloads=None) -> int:
        """Inserts or replaces points; returns the operation's sequence number."""

    def search(
        self, vectors, k: int = 10, filter=None, with_payload: bool = True, with_vector: bool = False, ef: Optional[int] = None
    ) -> List[List[Hit]]:
        """The ``k`` nearest points of each query row."""

    def search_numpy(self, vectors, k: int = 10, filter=None, ef: Optional[int] = None) -> Tuple[np.ndarray, np.ndarray]:
        """``(ids, scores)`` arrays of shape ``(nq, k)``."""

    def get(self, ids, with_vector: bool = True) -> List[Point]:
        """Points by id; ``KeyError`` naming the absent ones."""

    def delete(self, ids=None, filter=None) -> int:
        """Deletes by id or filter; how many were removed."""

    def count(self, filter=None) -> int: ...

    def scroll(
        self, filter=None, offset: Optional[PointId] = None, limit: int = 10, with_vector: bool = False
    ) -> Tuple[List[Point], Optional[PointId]]:
        """A page of points ordered by id, and the next page's first id."""

    def upsert_points(self, points) -> int:
        """Inserts or replaces points ``{"id", "vector", "payload"}`` with named
        and sparse vectors; returns the operation's sequence number."""

    def query(self, query=None, *, prefetch=None, using=None, filter=None, limit: int = 10, offset: int = 0,
              score_threshold=None, with_payload: bool = True, with_vector=False, params=None) -> List[Hit]:
        """The Query API: nearest by dense, sparse or point id (MMR re-ranked
        when asked), prefetch, fusion (weighted RRF)."""

    def query_groups(self, group_by: str, query=None, *, prefetch=None, using=None, filter=None, limit: int = 10,
                     group_size: int = 3, score_threshold=None, with_payload: bool = True, with_vector=False,
                     params=None) -> List[Group]:
        """The Query API's answer in groups by a payload key path."""

    def set_payload(self, payload: Dict[str, Any], ids=None, filter=None, key=None) -> int:
        """Merges keys into the selected points' payloads (at a key path when
        ``key`` is given); how many were selected."""

    def overwrite_payload(self, payload: Dict[str, Any], ids=None, filter=None) -> int: ...

    def delete_payload(self, keys, ids=None, filter=None) -> int: ...

    def clear_payload(self, ids=None, filter=None) -> int: ...

    def create_index(self, field: str, schema: str = "keyword") -> None: ...

    def maintain(self) -> None:
        """Runs the engine's pending maintenance now; returns once none is in flight."""

    def checkpoint(self) -> None:
        """Makes the engine's state durable and cuts the commit log behind it."""


@runtime_checkable
class DatabaseProtocol(Protocol):
    """Where collections live."""

    def create_collection(self, name: str, dim: Optional[int] = None, metric: str = "cosine", engine: Optional[str] = None, *,
                          vectors=None, sparse_vectors=None, **params) -> CollectionProtocol: ...

    def get_collection(self, name: str) -> CollectionProtocol: ...

    def list_collections(self) -> List[str]: ...

    def delete_collection(self, name: str) -> bool: ...
