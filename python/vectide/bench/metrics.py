"""Recall, Pareto frontiers, QPS at a recall target and ratios between engines.

Recall@k, the Pareto frontier and QPS at a recall target are computed in one
place, ``vectide_core::eval`` (Rust), which the native ``vectide bench``
calls directly and this module through the extension (``vectide._vectide``);
the functions here only put Python data in the shape it takes. The rules:

* ``recall_at_k``: mean over queries of ``|found[i][:k] ∩ truth[i, :k]| / k``;
  rows may be shorter than ``k`` or padded with ids that cannot match
  (``MISSING_ID``, or ``-1`` from faiss); duplicates count once.
* ``pareto_frontier``: points not dominated by another point with recall >=
  and QPS >= (one of them strictly), by increasing recall.
* ``qps_at_recall(points, t)``: no point reaches ``t`` -> ``None``; a
  frontier point at exactly ``t`` -> its QPS; ``t`` below the lowest
  frontier recall -> the QPS of that lowest point (the largest QPS among the
  points reaching ``t``: no extrapolation downwards); otherwise ``log(QPS)``
  interpolated linearly in recall between the two frontier points that
  bracket ``t``.
"""

from __future__ import annotations

from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import numpy as np

Point = Tuple[float, float]

#: Equal to ``vectide._vectide.RECALL_TARGETS`` (a test checks it); a
#: constant here so that reports and plots of saved results need no build.
RECALL_TARGETS = (0.9, 0.95, 0.99)


def _native():
    try:
        from .. import _vectide
    except ImportError as e:
        raise RuntimeError(
            "recall and QPS at recall are computed by the native module vectide._vectide "
            f"(the same code as `vectide bench`), which is not built ({e}); build it with: make build"
        ) from None
    return _vectide


def _as_ids(rows: np.ndarray) -> np.ndarray:
    """Ids as uint64 (a negative id, faiss's -1, becomes MISSING_ID)."""
    return np.ascontiguousarray(rows, dtype=np.int64).view(np.uint64) if rows.dtype.kind == "i" else rows


def recall_at_k(found: Sequence[np.ndarray], truth: np.ndarray, k: int) -> float:
    """Recall@k of ``found`` (one row of ids per query, or an ``(nq, w)``
    array) against ``truth`` (``(nq, >= k)``)."""
    native = _native()
    truth = np.asarray(truth)[:, :k]
    if truth.dtype.kind not in "iu":
        raise ValueError(f"ground-truth ids must be integers, got {truth.dtype}")
    truth = np.ascontiguousarray(_as_ids(truth), dtype=np.uint64)
    nq = truth.shape[0]
    if len(found) != nq:
        raise ValueError(f"{len(found)} result rows for {nq} queries")
    padded = np.full((nq, k), native.MISSING_ID, dtype=np.uint64)
    for i, row in enumerate(found):
        row = np.asarray(row).reshape(-1)[:k]
        if row.size == 0:
            continue
        if row.dtype.kind not in "iu":
            raise ValueError(f"result row {i}: ids must be integers, got {row.dtype}")
        padded[i, : row.shape[0]] = _as_ids(row)
    return native.recall_at_k(padded, truth, int(k))


def pareto_frontier(points: Iterable[Point]) -> List[Point]:
    """Non-dominated ``(recall, qps)`` points, sorted by increasing recall."""
    return [tuple(p) for p in _native().pareto_frontier([(float(r), float(q)) for r, q in points])]


def qps_at_recall(points: Iterable[Point], target: float) -> Optional[float]:
    """QPS at ``target`` recall; see the module docstring for the rules."""
    return _native().qps_at_recall([(float(r), float(q)) for r, q in points], float(target))


def ratio_vs_best_peer(
    qps_by_engine: Mapping[str, Optional[float]], peers: Iterable[str]
) -> Dict[str, Optional[float]]:
    """``qps / max(peer qps)`` for every engine at one recall target.

    The maximum is over peers that reach the target (non-null); the ratio is
    ``None`` when the engine's own value is null or no peer reaches it.
    """
    peer_vals = [qps_by_engine.get(p) for p in peers]
    peer_vals = [v for v in peer_vals if v is not None]
    best = max(peer_vals) if peer_vals else None
    out: Dict[str, Optional[float]] = {}
    for name, v in qps_by_engine.items():
        out[name] = None if v is None or best is None or best <= 0 else v / best
    return out


def target_key(t: float) -> str:
    """JSON key of a recall target: ``0.9`` -> ``"0.9"``."""
    return repr(float(t))
