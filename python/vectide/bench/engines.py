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
first) and the peers of :mod:`vectide.bench.peers` (one module per library,
the only list of them).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from typing import Callable, Dict, Optional

import numpy as np

from .peers import STATIC
from .peers.base import Engine, _check_metric

__all__ = ["Engine", "KNOWN_ENGINES", "make_engine", "is_peer"]


def vectide_descriptor(engine: str) -> Dict[str, object]:
    """The native registry's entry for ``engine`` (``vectide.engines()``);
    ``ValueError`` naming the known engines when there is none."""
    import vectide

    desc = next((e for e in vectide.engines() if e["name"] == engine), None)
    if desc is None:
        known = ", ".join(e["name"] for e in vectide.engines())
        raise ValueError(f"unknown engine 'vectide:{engine}'; known Vectide engines: {known}")
    return desc


def _variant(name: str, rest: str, desc: Dict[str, object]) -> Dict[str, object]:
    """The parameters of ``vectide:ENGINE@key=value@…``, typed as the
    registry declares them; ``ValueError`` naming a bad one."""
    kinds = {p["name"]: str(p["type"]) for p in desc["params"]}  # type: ignore[union-attr]
    out: Dict[str, object] = {}
    for pair in rest.split("@"):
        key, eq, raw = pair.partition("=")
        if not key or not eq or not raw:
            raise ValueError(f"engine variant {name!r}: expected ENGINE@key=value, got {pair!r}")
        if key not in kinds or key in ("path", "threads"):
            raise ValueError(f"engine variant {name!r}: {desc['name']} has no parameter {key!r} to vary")
        if key in out:
            raise ValueError(f"engine variant {name!r} sets {key!r} twice")
        kind = kinds[key]
        try:
            if kind.startswith("integer"):
                out[key] = int(raw, 0)
            elif kind.startswith("number"):
                out[key] = float(raw)
            elif kind.startswith("bool"):
                if raw not in ("true", "false"):
                    raise ValueError(raw)
                out[key] = raw == "true"
            else:
                out[key] = raw
        except ValueError:
            raise ValueError(f"engine variant {name!r}: {key}={raw!r} is not of type {kind}") from None
    return out


class VectideEngine(Engine):
    """``vectide:ENGINE``: ``vectide.Index(..., engine=ENGINE)``. Its build
    parameters and the knob a sweep varies come from the native registry
    (``vectide.engines()``): ``m`` and ``ef_construction`` go to engines
    that take them, and an engine without a knob is measured once."""

    def __init__(self, engine: Optional[str] = None) -> None:
        super().__init__()
        spec = engine
        engine, _, rest = (engine or "").partition("@")
        self.engine = engine or None
        self.name = f"vectide:{spec}"
        self.index = None
        self._knob_value: Optional[int] = None
        self._takes: set = set()
        self._in_directory = False
        self._dir: Optional[str] = None
        # A variant, ``ENGINE@key=value@…``: those parameters on top.
        self._variant: Dict[str, object] = {}
        try:
            import vectide

            self.engine = self.engine or vectide.DEFAULT_ENGINE
            self.name = f"vectide:{self.engine}" + (f"@{rest}" if rest else "")
            desc = vectide_descriptor(self.engine)
            self.knob = desc["primary_knob"]
            self._takes = {p["name"] for p in desc["params"]}
            self._in_directory = bool(desc["in_directory"])
            if rest:
                self._variant = _variant(self.name, rest, desc)
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
        build.update(self._variant)
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


KNOWN_ENGINES: Dict[str, Callable[[], Engine]] = {
    "vectide:hnsw": lambda: VectideEngine("hnsw"),
    "vectide:fresh-vamana": lambda: VectideEngine("fresh-vamana"),
    **STATIC,
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
