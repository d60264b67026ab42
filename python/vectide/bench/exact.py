"""Exact search: ``vectide:flat`` against faiss ``IndexFlatIP`` / ``IndexFlatL2``.

``python -m vectide.bench exact --dataset glove-6b-50-angular [--threads 1,2]
[--k 10] [--runs 3] [--max-queries N] --out FILE.json``

Method
------
Both engines hold the same training vectors (cosine data normalised for faiss,
whose inner-product index then ranks as cosine does; Vectide normalises on
insert) and answer the whole query matrix in one batched call, with the same
number of threads (``faiss.omp_set_num_threads`` and the index's ``threads``)
in the same process and run. Each thread count is timed ``--runs`` times,
alternating the engines, and the fastest run is kept; QPS = queries / seconds
of the search call. Building is not timed.

Agreement: for every query the two id lists are compared position by
position; a position where the ids differ counts as a mismatch only when the
two engines' distances at that position differ by more than 1e-5 relative
(a tie that either order may break is not a mismatch). The count is reported.

``summary.flat_qps_ratio_vs_faiss`` maps each thread count to
``vectide:flat QPS / faiss QPS`` (target >= 0.9, goal >= 1.0), with the SIMD
instruction set the kernels ran on.
"""

from __future__ import annotations

import argparse
import datetime
import time
from typing import Dict, List

import numpy as np

from .. import datasets
from .ann import _int_list, _log, _settle, machine_info, write_json


def _faiss_index(train: np.ndarray, metric: str):
    import faiss

    dim = train.shape[1]
    if metric == "l2":
        index = faiss.IndexFlatL2(dim)
        index.add(train)
    else:
        index = faiss.IndexFlatIP(dim)
        x = train.copy()
        if metric == "cosine":
            faiss.normalize_L2(x)
        index.add(x)
    return index


def _faiss_queries(test: np.ndarray, metric: str) -> np.ndarray:
    q = np.ascontiguousarray(test, dtype=np.float32).copy()
    if metric == "cosine":
        import faiss

        faiss.normalize_L2(q)
    return q


def _to_distance(faiss_scores: np.ndarray, metric: str) -> np.ndarray:
    """faiss scores as Vectide distances (smaller is closer)."""
    if metric == "cosine":
        return 1.0 - faiss_scores
    if metric == "ip":
        return -faiss_scores
    return faiss_scores  # IndexFlatL2 returns squared L2, as Vectide does


def mismatches(ids_a, dist_a, ids_b, dist_b, rel: float = 1e-5) -> int:
    """Positions where the ids differ and the distances are not a tie."""
    differ = ids_a != ids_b
    scale = np.maximum(np.maximum(np.abs(dist_a), np.abs(dist_b)), 1e-12)
    not_tie = np.abs(dist_a - dist_b) > rel * scale
    return int(np.count_nonzero(differ & not_tie))


def run(dataset: str, threads: List[int], k: int, runs: int, max_queries: int) -> Dict[str, object]:
    import faiss
    import vectide

    ds = datasets.load(dataset)
    metric = ds.metric
    train = np.ascontiguousarray(ds.train, dtype=np.float32)
    test = np.ascontiguousarray(ds.test[: max_queries or None], dtype=np.float32)
    nq = len(test)
    _log(f"exact: {ds.name} {train.shape} x {nq} queries, k={k}, metric={metric}")
    fq = _faiss_queries(test, metric)
    fidx = _faiss_index(train, metric)
    results: Dict[str, Dict[str, object]] = {"vectide:flat": {}, "faiss-flat": {}}
    ratios: Dict[str, float] = {}
    agreement: Dict[str, int] = {}
    for t in threads:
        flat = vectide.Index(train.shape[1], metric=metric, engine="flat", threads=t)
        flat.add(np.arange(len(train), dtype=np.uint64), train)
        faiss.omp_set_num_threads(t)
        best = {"vectide:flat": float("inf"), "faiss-flat": float("inf")}
        out = {}
        for r in range(runs):
            order = ["vectide:flat", "faiss-flat"] if r % 2 == 0 else ["faiss-flat", "vectide:flat"]
            for name in order:
                _settle()
                t0 = time.perf_counter()
                if name == "vectide:flat":
                    ids, dist = flat.search(test, k=k)
                else:
                    scores, ids = fidx.search(fq, k)
                    dist = _to_distance(scores, metric)
                secs = time.perf_counter() - t0
                best[name] = min(best[name], secs)
                out[name] = (ids.astype(np.int64), dist.astype(np.float32))
        for name in best:
            results[name][str(t)] = {"seconds": best[name], "qps": nq / best[name]}
        ratios[str(t)] = results["vectide:flat"][str(t)]["qps"] / results["faiss-flat"][str(t)]["qps"]
        (ia, da), (ib, db) = out["vectide:flat"], out["faiss-flat"]
        agreement[str(t)] = mismatches(ia, da, ib, db)
        _log(
            f"  threads={t}: vectide:flat {results['vectide:flat'][str(t)]['qps']:.0f} q/s, "
            f"faiss-flat {results['faiss-flat'][str(t)]['qps']:.0f} q/s, ratio {ratios[str(t)]:.2f}, "
            f"mismatches {agreement[str(t)]} of {nq * k}"
        )
        del flat
    return {
        "benchmark": "exact",
        "dataset": ds.name,
        "metric": metric,
        "n_train": int(len(train)),
        "n_queries": nq,
        "k": k,
        "threads": threads,
        "runs": runs,
        "engines": results,
        "machine": {**machine_info(), "simd_isa": vectide.simd_isa()},
        "peer_versions": {"faiss": getattr(faiss, "__version__", None)},
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "summary": {
            "flat_qps_ratio_vs_faiss": ratios,
            "mismatches": agreement,
            "compared_positions": nq * k,
            "simd_isa": vectide.simd_isa(),
        },
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m vectide.bench exact", description=(__doc__ or "").split("Method")[0])
    p.add_argument("--dataset", default="glove-6b-50-angular")
    p.add_argument("--threads", type=_int_list, default=[1, 2])
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--max-queries", type=int, default=0, help="0: every test query")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    if a.k < 1 or a.runs < 1 or any(t < 1 for t in a.threads):
        p.error("--k, --runs and --threads must be at least 1")
    doc = run(a.dataset, a.threads, a.k, a.runs, a.max_queries)
    write_json(doc, a.out)
    _log(f"wrote {a.out}")
    return 0
