"""Recall, Pareto frontiers, QPS at a recall target and ratios between engines.

``qps_at_recall(points, t)`` with ``points = [(recall, qps), ...]``:

1. Keep the Pareto frontier: points not dominated by another point with
   recall >= and QPS >= (one of them strictly). Sorted by recall, the
   frontier's QPS strictly decreases.
2. No point reaches ``t`` -> ``None``.
3. A frontier point with recall exactly ``t`` -> its QPS.
4. ``t`` below the lowest frontier recall -> the QPS of that lowest point,
   which is the largest QPS among all points with recall >= ``t``: we do not
   extrapolate downwards, we report what the engine actually delivers at a
   recall of at least ``t``.
5. Otherwise two consecutive frontier points bracket ``t``
   (``r_lo < t < r_hi``) and ``log(QPS)`` is interpolated linearly in recall.
"""

from __future__ import annotations

import math
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import numpy as np

Point = Tuple[float, float]

RECALL_TARGETS = (0.9, 0.95, 0.99)


def recall_at_k(found: Sequence[np.ndarray], truth: np.ndarray, k: int) -> float:
    """Mean over queries of ``|found[i][:k] ∩ truth[i, :k]| / k``.

    ``found`` rows may be shorter than ``k`` or padded with ids that cannot
    match (e.g. ``MISSING_ID``); duplicates are counted once.
    """
    truth = np.asarray(truth)[:, :k].astype(np.int64)
    nq = truth.shape[0]
    if len(found) != nq:
        raise ValueError(f"{len(found)} result rows for {nq} queries")
    padded = np.full((nq, k), -1, dtype=np.int64)
    for i, row in enumerate(found):
        row = np.ascontiguousarray(np.asarray(row).reshape(-1)[:k])
        if row.dtype == np.uint64:
            row = row.view(np.int64)  # MISSING_ID becomes -1, which never matches
        padded[i, : row.shape[0]] = row
    hits = 0
    for s in range(0, nq, 4096):
        t, f = truth[s : s + 4096], padded[s : s + 4096]
        hits += int((t[:, :, None] == f[:, None, :]).any(axis=2).sum())
    return hits / (nq * k)


def pareto_frontier(points: Iterable[Point]) -> List[Point]:
    """Non-dominated ``(recall, qps)`` points, sorted by increasing recall."""
    pts = sorted(set((float(r), float(q)) for r, q in points), key=lambda p: (-p[0], -p[1]))
    frontier: List[Point] = []
    best_qps = -math.inf
    for r, q in pts:  # by decreasing recall; at equal recall the best QPS first
        if q > best_qps:
            frontier.append((r, q))
            best_qps = q
    frontier.reverse()
    return frontier


def qps_at_recall(points: Iterable[Point], target: float, eps: float = 1e-12) -> Optional[float]:
    """QPS at ``target`` recall; see the module docstring for the rules."""
    frontier = pareto_frontier(points)
    reaching = [p for p in frontier if p[0] >= target - eps]
    if not reaching:
        return None
    for r, q in frontier:
        if abs(r - target) <= eps:
            return q
    if target < frontier[0][0]:
        return frontier[0][1]
    for (r_lo, q_lo), (r_hi, q_hi) in zip(frontier, frontier[1:]):
        if r_lo < target < r_hi:
            if q_lo <= 0 or q_hi <= 0:
                return q_lo + (target - r_lo) / (r_hi - r_lo) * (q_hi - q_lo)
            w = (target - r_lo) / (r_hi - r_lo)
            return math.exp(math.log(q_lo) + w * (math.log(q_hi) - math.log(q_lo)))
    return None  # unreachable: some frontier point reaches the target


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
