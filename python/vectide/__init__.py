"""Vectide: a vector database for data that never stops changing.

The native engines live in the compiled extension ``vectide._vectide``; this
package adds datasets, the benchmark harness and plots in pure Python.
"""

from __future__ import annotations

__all__ = [
    "CorruptIndexError",
    "Index",
    "MISSING_ID",
    "__version__",
    "simd_isa",
    "allocator",
    "build_commit",
    "connect",
    "Database",
    "Collection",
    "DatabaseLockedError",
    "PoisonedError",
    "Client",
    "LIMITS",
    "engines",
    "DEFAULT_ENGINE",
]

MISSING_ID = 2**64 - 1
"""Id used to pad missing results; reserved, rejected on insert."""


def __getattr__(name: str):
    # The extension is imported on first use so that the pure-Python parts
    # (``python -m vectide.datasets``) work before the native build exists.
    if name in (
        "Index",
        "CorruptIndexError",
        "__version__",
        "simd_isa",
        "allocator",
        "build_commit",
        "DatabaseLockedError",
        "PoisonedError",
        "LIMITS",
        "engines",
        "DEFAULT_ENGINE",
    ):
        from . import _vectide

        return getattr(_vectide, name)
    if name == "Client":
        from .client import Client

        return Client
    if name in ("connect", "Database", "Collection"):
        from . import db

        return getattr(db, name)
    raise AttributeError(f"module 'vectide' has no attribute {name!r}")
