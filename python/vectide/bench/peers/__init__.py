"""The peers Vectide is measured against: one module per library, holding
every adapter of that library (its static index for ``bench ann``, its
streaming index for the runbooks), over the shared interfaces and helpers of
:mod:`.base`. The registries below are the only lists of peers.

Names: the peers ``hnswlib``, ``faiss-hnsw``, ``usearch`` (HNSW built
with the harness's ``m`` and ``ef_construction``), ``diskann`` (DiskANN's
static in-memory Vamana index, PyPI ``diskannpy-rust``), ``svs`` (Intel SVS
Vamana, PyPI ``scalable-vs``), ``glass`` (PyPI ``pyglass-portable``),
``scann``, ``vsag`` (VSAG's HGraph, PyPI ``pyvsag``), the RaBitQ-Library
indexes (PyPI ``rabitqlib``) ``symqg`` (SymphonyQG), ``rabitq-hnsw`` (HNSW
over RaBitQ codes, built with the harness's ``m`` and ``ef_construction``)
and ``rabitq-ivf`` (IVF, RaBitQ codes with raw-vector re-ranking), and
faiss's IVF FastScan indexes with exact re-ranking, ``faiss-ivf-rabitq``
(``RR,IVF,RaBitQfs,RFlat``) and ``faiss-ivf-pqfs`` (``IVF,PQx4fs,RFlat``).
Under a runbook: ``hnswlib``, ``diskann`` (``diskannpy`` 0.7.0's dynamic
index), ``svs`` (``DynamicVamana``) and ``faiss-ivf``. The Vamana engines (``vectide:fresh-vamana``, ``diskann``, ``svs``) share
R = 64, L_build = 75, alpha = 1.2 (FreshDiskANN §6.2), so they differ in
implementation only. The IVF peers (``rabitq-ivf``, ``faiss-ivf-*``) have
about ``4 sqrt(n)`` lists and sweep ``nprobe``; rabitqlib's indexes take at
least 64 dimensions, so lower-dimensional data is zero-padded for them
(``params["padded_dim"]``).
"""

from __future__ import annotations

from typing import Callable, Dict, Type

from .base import Engine, PeerError, Stream
from .diskann import DiskannEngine, DiskannStream
from .faiss import FaissHnswEngine, FaissIvfPqfsEngine, FaissIvfRabitqEngine, FaissIvfStream
from .glass import GlassEngine
from .hnswlib import HnswlibEngine, HnswlibStream
from .rabitq import RabitqHnswEngine, RabitqIvfEngine, SymqgEngine
from .scann import ScannEngine
from .svs import SvsEngine, SvsStream
from .usearch import UsearchEngine
from .vsag import VsagEngine

__all__ = ["Engine", "PeerError", "STATIC", "STREAMING", "Stream"]

#: Built once and searched (``bench ann``).
STATIC: Dict[str, Callable[[], Engine]] = {
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

#: Driven through a runbook, in a worker process each.
STREAMING: Dict[str, Type[Stream]] = {
    "hnswlib": HnswlibStream,
    "diskann": DiskannStream,
    "svs": SvsStream,
    "faiss-ivf": FaissIvfStream,
}
