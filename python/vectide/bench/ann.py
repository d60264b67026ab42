"""ANN benchmark: recall/QPS sweeps of Vectide against peer libraries.

``python -m vectide.bench ann --dataset NAME|PATH --engines vectide:hnsw,hnswlib,faiss-hnsw,usearch
--k 10 --threads 1 --out FILE.json [--plot FILE.png] [--m 16] [--ef-construction 200]
[--ef LIST] [--max-queries N] [--runs 3]``

Method
------
* Every engine is built on ``train`` with the same build thread count; the
  engines that take ``M`` and ``efConstruction`` (the HNSW ones) get the same
  values, the Vamana ones share R, L and alpha, and the other peers are
  configured as their authors recommend (each engine's ``params`` records
  its configuration and its source). ``build_s`` is the wall time of the
  library's build call(s). ``memory_bytes`` is the growth of the process's
  resident set (``/proc/self/statm``) across the build, each side taken after
  ``gc.collect()`` and ``malloc_trim(0)``; all engines stay alive for the
  interleaved sweep, so each is measured by its own delta.
  ``memory_bytes_per_vector`` divides it by the training rows;
  ``reported_bytes_per_vector`` is the index's own figure per row (its
  reported memory, or, for peers that report none, ``saved_index_bytes``:
  the size of the library's own saved index).
* The same ``ef`` list is swept for every engine as its primary search knob
  (``ef``, ``L``, ScaNN's leaves to search, the IVF peers' ``nprobe``;
  ``ef < k`` runs at ``k``; ``search_params`` records what was searched with)
  and an engine without a knob is measured once. Queries go one per call, from the same
  Python loop for every engine, timed with ``time.perf_counter`` around the
  whole loop: QPS = queries / seconds. Sweep order is
  ``for ef: for run: for engine``, so the measurements compared with each
  other are adjacent in time; the best QPS of ``--runs`` runs is kept with its
  recall (recall is deterministic per point).
* Recall@k = mean over queries of ``|found ∩ neighbors[:, :k]| / k``.
* ``qps_at_recall`` interpolates the Pareto frontier (see ``metrics.py``);
  ratios compare each engine with the best peer (engines not named
  ``vectide:*``) that reaches the target.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import gc
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np

from .. import datasets
from .engines import Engine, is_peer, make_engine
from .metrics import RECALL_TARGETS, qps_at_recall, ratio_vs_best_peer, recall_at_k, target_key

DEFAULT_EFS = (10, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
DEFAULT_ENGINES = "vectide:hnsw,hnswlib,faiss-hnsw,usearch"
MEMORY_METHOD = (
    "RSS delta across the build: resident pages from /proc/self/statm x page size, "
    "read after gc.collect() and malloc_trim(0) before and after the add call(s); "
    "all engines stay alive, each is measured by its own delta"
)
WARMUP_QUERIES = 200

# --------------------------------------------------------------------------
# Process measurements

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def rss_bytes() -> int:
    """Current resident set size of this process."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * _PAGE
    except OSError:  # not Linux: peak RSS is the best the stdlib offers
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024


def _settle() -> None:
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def machine_info() -> Dict[str, object]:
    model = None
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    info: Dict[str, object] = {
        "cpu_model": model or platform.processor() or None,
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "numpy": np.__version__,
    }
    if hasattr(os, "sched_getaffinity"):
        info["usable_cores"] = len(os.sched_getaffinity(0))
    info["simd"] = simd_isa()
    try:
        import vectide

        info["allocator"] = vectide.allocator()
    except (ImportError, AttributeError):
        info["allocator"] = None
    return info


def simd_isa() -> Optional[str]:
    """The distance kernels' instruction set in this process (``avx512``,
    ``avx2``, ...), or None before the extension is built."""
    try:
        import vectide

        return vectide.simd_isa()
    except ImportError:
        return None


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------
# The benchmark


def time_queries(engine: Engine, queries, k: int):
    """One call per query from a plain Python loop; returns ``(seconds, results)``."""
    query = engine.query
    results: List[np.ndarray] = []
    append = results.append
    t0 = time.perf_counter()
    for q in queries:
        append(query(q, k))
    return time.perf_counter() - t0, results


def run_ann(
    dataset: str,
    engines: Sequence[str],
    k: int = 10,
    threads: int = 1,
    m: int = 16,
    ef_construction: int = 200,
    efs: Sequence[int] = DEFAULT_EFS,
    max_queries: Optional[int] = None,
    runs: int = 3,
    log=_log,
) -> Dict[str, object]:
    """Runs the benchmark and returns the result document (see ``main``)."""
    if k < 1 or runs < 1 or threads < 1 or m < 2 or ef_construction < 1:
        raise ValueError("k, runs, threads and ef_construction must be >= 1 and m >= 2")
    if not efs or min(efs) < 1:
        raise ValueError("the ef list must hold positive integers")
    if len(set(engines)) != len(engines):
        raise ValueError("an engine is listed twice")
    adapters = [make_engine(name) for name in engines]
    for a in adapters:
        a.check()

    ds = datasets.load(dataset)
    if ds.neighbors is None:
        raise ValueError(f"{ds.path}: no ground truth ('neighbors')")
    if k > ds.neighbors.shape[1]:
        raise ValueError(f"k={k} exceeds the {ds.neighbors.shape[1]} ground-truth neighbours stored")
    nq = ds.test.shape[0] if max_queries is None else min(max_queries, ds.test.shape[0])
    test = np.ascontiguousarray(ds.test[:nq])
    truth = ds.neighbors[:nq, :k]
    metric = ds.metric
    log(
        f"dataset {ds.name}: train {ds.train.shape}, {nq} queries, distance {ds.distance} "
        f"(metric {metric}), k={k}, threads={threads}, M={m}, efConstruction={ef_construction}"
    )

    built: Dict[str, Dict[str, object]] = {}
    prepared = {}
    for a in adapters:
        _settle()
        before = rss_bytes()
        build_s = a.build(ds.train, metric, m, ef_construction, threads)
        _settle()
        mem = rss_bytes() - before
        n = max(1, int(ds.train.shape[0]))
        built[a.name] = {"build_s": build_s, "memory_bytes": max(0, mem),
                         "memory_bytes_per_vector": max(0, mem) / n}
        if a.reported_memory_bytes is not None:
            built[a.name]["reported_memory_bytes"] = a.reported_memory_bytes
            built[a.name]["reported_bytes_per_vector"] = a.reported_memory_bytes / n
        else:
            # No in-memory figure: the size of the library's own saved index,
            # where the adapter can tell it (rabitqlib, faiss IVF).
            saved = a.index_bytes()
            if saved is not None:
                built[a.name]["saved_index_bytes"] = int(saved)
                built[a.name]["reported_bytes_per_vector"] = int(saved) / n
        prepared[a.name] = a.prepare_queries(test)
        log(f"built {a.name}: {build_s:.2f} s, RSS +{mem / 1e6:.1f} MB")

    # Warm-up (untimed): page in code and the index before the first timed point.
    for a in adapters:
        a.set_ef(max(efs[0], k))
        time_queries(a, prepared[a.name][:WARMUP_QUERIES], k)

    sweeps: Dict[str, List[Dict[str, object]]] = {a.name: [] for a in adapters}
    for i, ef in enumerate(efs):
        eff = max(int(ef), k)
        best: Dict[str, Dict[str, object]] = {}
        # Engines without a knob (exact ones) are measured once.
        swept = [a for a in adapters if a.knob is not None or i == 0]
        for run in range(runs):
            for a in swept:
                a.set_ef(eff)
                seconds, results = time_queries(a, prepared[a.name], k)
                qps = nq / seconds if seconds > 0 else float("inf")
                rec = recall_at_k(results, truth, k)
                point = best.get(a.name)
                qps_runs = (point["qps_runs"] if point else []) + [qps]
                if point is None or qps > point["qps"]:
                    params = {"ef": int(ef), "ef_effective": eff} if a.knob == "ef" else a.search_params(eff)
                    point = {"search_params": params, "recall": rec, "qps": qps}
                point["qps_runs"] = qps_runs
                best[a.name] = point
        for a in swept:
            sweeps[a.name].append(best[a.name])
        log(f"ef={ef:<4} " + "  ".join(f"{n}: R={p['recall']:.4f} {p['qps']:.0f} qps" for n, p in best.items()))

    engines_out: Dict[str, Dict[str, object]] = {}
    for a in adapters:
        pts = [(p["recall"], p["qps"]) for p in sweeps[a.name]]
        engines_out[a.name] = {
            **built[a.name],
            "params": a.params,
            "sweep": sweeps[a.name],
            "qps_at_recall": {target_key(t): qps_at_recall(pts, t) for t in RECALL_TARGETS},
        }
    for a in adapters:
        a.close()

    peers = [n for n in engines_out if is_peer(n)]
    summary: Dict[str, object] = {"peers": peers}
    # The figures of record per engine: QPS at each recall target, build
    # time, and memory per vector (RSS growth over the build, and the
    # index's own figure where it reports one).
    summary["qps_at_recall"] = {n: e["qps_at_recall"] for n, e in engines_out.items()}
    summary["build_s"] = {n: e["build_s"] for n, e in engines_out.items()}
    summary["memory_bytes_per_vector"] = {n: e["memory_bytes_per_vector"] for n, e in engines_out.items()}
    summary["reported_bytes_per_vector"] = {n: e.get("reported_bytes_per_vector") for n, e in engines_out.items()}
    summary["simd"] = simd_isa()
    for t in RECALL_TARGETS:
        key = target_key(t)
        at = {n: e["qps_at_recall"][key] for n, e in engines_out.items()}
        summary[f"ratio_vs_best_peer_at_{key}"] = ratio_vs_best_peer(at, peers)
        reaching = [(at[p], p) for p in peers if at[p] is not None]
        summary[f"best_peer_at_{key}"] = max(reaching)[1] if reaching else None

    return {
        "dataset": ds.name,
        "dataset_path": str(ds.path),
        "distance": ds.distance,
        "metric": metric,
        "k": k,
        "threads": threads,
        "n_train": int(ds.train.shape[0]),
        "n_queries": int(nq),
        "query_loop": "python: one engine.query(q, k) call per query",
        "dimension": ds.dimension,
        "params": {
            "m": m,
            "ef_construction": ef_construction,
            "ef": [int(e) for e in efs],
            "runs": runs,
            "timing": "time.perf_counter around the whole query loop; QPS = queries / seconds",
            "sweep_order": "for ef: for run: for engine; best QPS of the runs kept",
        },
        "memory_method": MEMORY_METHOD,
        "machine": machine_info(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "engines": engines_out,
        "summary": summary,
    }


def write_json(result: Dict[str, object], path) -> None:
    path = Path(path)
    if path.parent != Path(""):
        path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    os.replace(tmp, path)


# --------------------------------------------------------------------------
# Command line


def _int_list(s: str) -> List[int]:
    try:
        vals = [int(x) for x in s.replace(" ", "").split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of integers, got {s!r}") from None
    if not vals or min(vals) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {s!r}")
    return vals


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dataset", required=True, metavar="NAME|PATH", help="dataset name or ann-benchmarks .hdf5 file")
    p.add_argument("--engines", default=DEFAULT_ENGINES, help=f"comma-separated (default {DEFAULT_ENGINES})")
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--threads", type=int, default=1, help="build threads for every engine (default 1)")
    p.add_argument("--out", metavar="FILE.json", help="write the results as JSON")
    p.add_argument("--plot", metavar="FILE.png", help="recall/QPS plot")
    p.add_argument("--m", type=int, default=16)
    p.add_argument("--ef-construction", type=int, default=200)
    p.add_argument("--ef", type=_int_list, default=list(DEFAULT_EFS), metavar="LIST",
                   help="search ef values (default " + ",".join(map(str, DEFAULT_EFS)) + ")")
    p.add_argument("--max-queries", type=int, metavar="N", help="use the first N test queries")
    p.add_argument("--runs", type=int, default=3, help="timed runs per sweep point, best kept (default 3)")


def run_cli(args: argparse.Namespace) -> int:
    from . import report

    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    try:
        for name in engines:
            make_engine(name)
        result = run_ann(
            args.dataset,
            engines,
            k=args.k,
            threads=args.threads,
            m=args.m,
            ef_construction=args.ef_construction,
            efs=args.ef,
            max_queries=args.max_queries,
            runs=args.runs,
        )
    except datasets.UnknownDatasetError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (ValueError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(report.format_table(result))
    if args.out:
        write_json(result, args.out)
        print(f"wrote {args.out}")
    if args.plot:
        report.plot(result, args.plot)
        print(f"wrote {args.plot}")
    return 0
