"""Streaming runbooks in the big-ann-benchmarks format: read, check, write,
and generate them.

A runbook file is YAML: one top-level key per dataset, holding ``max_pts``
(the most points active at once) and numbered steps ``1, 2, …``, each with an
``operation``:

* ``insert`` / ``delete``: ``start``, ``end`` — the dataset rows
  ``start..end`` (end excluded), whose ids are their row numbers;
* ``search``: no range — the dataset's queries against the active set;
* ``replace``: ``tags_start``, ``tags_end``, ``ids_start``, ``ids_end`` — the
  active ids ``tags_start..tags_end`` take the vectors of rows
  ``ids_start..ids_end`` (the same count).

:func:`check` replays a runbook over a dataset of ``n`` rows before anything
runs and raises :class:`RunbookError` naming the step at the first problem:
an unknown operation, a range out of ``0..n`` or empty, an insert of ids
already active (overlapping inserts), a delete or replace of ids not active
(never inserted, or deleted already), an active set above ``max_pts``, or a
``max_pts`` larger than the dataset.

Generators (deterministic, written out as YAML with :func:`dump`):

* ``sliding-window``: rows enter in chunks; once the window (``max_pts``) is
  full, the oldest chunk leaves before the next enters; a search after every
  insert.
* ``expiration``: chunks enter in order and each leaves after a lifetime of
  1, 2 or 4 chunk steps drawn from the seed (big-ann's expiration-time
  runbooks have mixed lifetimes too); a search after every step; the
  runbook ends at the first chunk that would not fit under ``max_pts``.
* ``churn:P``: ``max_pts`` rows enter, then each cycle deletes P % of them
  (a contiguous range that moves round the set) and inserts the same rows
  again; a search after every cycle.

* ``clustered`` (:func:`clustered`): the dataset's rows are grouped by a
  seeded k-means into ``clusters`` (64) clusters and reordered so that each
  cluster is a contiguous range; clusters are inserted one by one in cluster
  order; after every 8th cluster the oldest live clusters are deleted until
  at most ``max_pts`` points are active; a search follows every 4th
  operation. It returns the runbook with the row order it needs, since
  runbook ranges name rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import numpy as np


def _core():
    """The extension (imported on first use, as the package does)."""
    from . import _vectide

    return _vectide

__all__ = [
    "RunbookError", "Step", "Runbook", "load", "loads", "dump", "check", "generate", "clustered", "kmeans",
    "GENERATORS",
]

OPERATIONS = ("insert", "delete", "search", "replace")


class RunbookError(ValueError):
    """A runbook that cannot run on the dataset; the message names the step."""


@dataclass
class Step:
    operation: str
    start: Optional[int] = None
    end: Optional[int] = None
    tags_start: Optional[int] = None
    tags_end: Optional[int] = None
    ids_start: Optional[int] = None
    ids_end: Optional[int] = None

    def as_dict(self) -> Dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


@dataclass
class Runbook:
    dataset: str
    max_pts: int
    steps: List[Step] = field(default_factory=list)


def loads(text, dataset: Optional[str] = None) -> Runbook:
    """Parses runbook YAML (``str`` or ``bytes``); ``dataset`` picks the
    top-level key (the only one when omitted). The harness core parses it
    (``vectide_harness::runbook``, the CLI's parser): one reading and one
    set of messages for both front ends."""
    data = text.encode() if isinstance(text, str) else bytes(text)
    try:
        name, max_pts, steps = _core().runbook_parse(data, dataset)
    except ValueError as e:
        raise RunbookError(str(e)) from None
    return Runbook(name, max_pts, [Step(**s) for s in steps])


def load(path, dataset: Optional[str] = None) -> Runbook:
    with open(path, "rb") as f:
        return loads(f.read(), dataset)


def dump(rb: Runbook) -> str:
    """The runbook as YAML (the big-ann-benchmarks layout)."""
    import yaml

    body: Dict[Any, Any] = {"max_pts": _plain(rb.max_pts)}
    for i, s in enumerate(rb.steps, 1):
        body[i] = {k: _plain(v) for k, v in s.as_dict().items()}
    return yaml.safe_dump({rb.dataset: body}, sort_keys=False)


def _plain(v: Any) -> Any:
    """NumPy integers as Python ints (YAML knows only the latter)."""
    return int(v) if isinstance(v, np.integer) else v


def check(rb: Runbook, n: int) -> Dict[str, int]:
    """Replays the runbook over ``n`` rows (see the module docs) with the
    harness core's check; returns counts of its operations and the largest
    active set. A runbook built in Python is checked as its text reads (as
    JSON, which is YAML: no PyYAML needed)."""
    import json

    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
        raise RunbookError(f"the dataset's rows must be a count, got {n!r}")
    body: Dict[str, Any] = {"max_pts": _plain(rb.max_pts)}
    for i, s in enumerate(rb.steps, 1):
        body[str(i)] = {k: _plain(v) for k, v in s.as_dict().items()}
    text = json.dumps({str(rb.dataset): body}, default=repr)
    try:
        return dict(_core().runbook_check(text.encode(), int(n), str(rb.dataset)))
    except ValueError as e:
        raise RunbookError(str(e)) from None


def _sliding_window(n: int, max_pts: int, chunk: int, seed: int) -> List[Step]:
    steps: List[Step] = []
    starts = list(range(0, n - chunk + 1, chunk))
    live: List[int] = []
    for a in starts:
        while live and (len(live) + 1) * chunk > max_pts:
            old = live.pop(0)
            steps.append(Step("delete", old, old + chunk))
        steps.append(Step("insert", a, a + chunk))
        live.append(a)
        steps.append(Step("search"))
    return steps


def _expiration(n: int, max_pts: int, chunk: int, seed: int) -> List[Step]:
    rng = np.random.default_rng(seed)
    steps: List[Step] = []
    expiring: Dict[int, List[int]] = {}
    live = 0
    for t, a in enumerate(range(0, n - chunk + 1, chunk)):
        for old in expiring.pop(t, []):
            steps.append(Step("delete", old, old + chunk))
            live -= chunk
        if live + chunk > max_pts:
            break
        steps.append(Step("insert", a, a + chunk))
        live += chunk
        expiring.setdefault(t + int(rng.choice([1, 2, 4])), []).append(a)
        steps.append(Step("search"))
    return steps


def _churn(n: int, max_pts: int, percent: float, cycles: int) -> List[Step]:
    if not (0 < percent <= 100):
        raise RunbookError(f"churn:P needs P in (0, 100], got {percent}")
    m = max(1, int(max_pts * percent / 100))
    steps = [Step("insert", 0, max_pts), Step("search")]
    at = 0
    for _ in range(cycles):
        a = at if at + m <= max_pts else 0
        steps += [Step("delete", a, a + m), Step("insert", a, a + m), Step("search")]
        at = a + m
    return steps


GENERATORS = ("sliding-window", "expiration", "churn:P", "clustered")


def kmeans(x: np.ndarray, k: int, seed: int = 0, iters: int = 25) -> np.ndarray:
    """Cluster labels of the rows of ``x`` (squared L2) from the
    quantization room's k-means (``vectide_quant::kmeans``, the one every
    engine trains with: k-means++ seeding on a seeded sample, then Lloyd or
    mini-batch steps). Deterministic for a given ``seed``."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    n = len(x)
    if x.ndim != 2 or not (1 <= k <= n):
        raise RunbookError(f"k-means into {k} clusters needs at least {k} rows, got {n}")
    try:
        return _core().kmeans_labels(x, int(k), int(seed), int(iters)).astype(np.int64)
    except ValueError as e:
        raise RunbookError(f"k-means: {e}") from None


def clustered(
    x: np.ndarray,
    dataset: str,
    clusters: int = 64,
    max_pts: int = 200_000,
    delete_every: int = 8,
    search_every: int = 4,
    seed: int = 0,
):
    """The ``clustered`` runbook over the rows of ``x`` (see the module
    docs): ``(runbook, order, bounds)`` where ``order`` is the row order the
    runbook's ranges refer to (row ``i`` of the reordered data is row
    ``order[i]`` of ``x``) and ``bounds[c]..bounds[c+1]`` is cluster ``c``."""
    n = len(x)
    labels = kmeans(x, clusters, seed=seed)
    order = np.argsort(labels, kind="stable")
    bounds = np.concatenate([[0], np.cumsum(np.bincount(labels, minlength=clusters))]).astype(np.int64)
    max_pts = min(max_pts, n)
    steps: List[Step] = []
    ops = 0

    def op(step: Step) -> None:
        nonlocal ops
        steps.append(step)
        ops += 1
        if ops % search_every == 0:
            steps.append(Step("search"))

    live: List[int] = []

    def drop_oldest(active: int) -> int:
        old = live.pop(0)
        op(Step("delete", int(bounds[old]), int(bounds[old + 1])))
        return active - int(bounds[old + 1] - bounds[old])

    active = 0
    for c in range(clusters):
        a, b = int(bounds[c]), int(bounds[c + 1])
        if a == b:
            continue
        if b - a > max_pts:
            raise RunbookError(f"clustered: cluster {c} has {b - a} points, more than max_pts {max_pts}")
        while active + (b - a) > max_pts:  # a large cluster: make room now
            active = drop_oldest(active)
        op(Step("insert", a, b))
        live.append(c)
        active += b - a
        if (c + 1) % delete_every == 0:
            # The oldest live clusters leave until the next batch of
            # delete_every clusters (of mean size) fits under max_pts.
            room = max(max_pts - delete_every * n // clusters, 0)
            while live and active > room:
                active = drop_oldest(active)
    if not steps or steps[-1].operation != "search":
        steps.append(Step("search"))
    rb = Runbook(dataset, max_pts, steps)
    check(rb, n)
    return rb, order, bounds


def generate(
    kind: str,
    n: int,
    dataset: str,
    max_pts: int = 200_000,
    chunk: Optional[int] = None,
    cycles: int = 50,
    seed: int = 0,
) -> Runbook:
    """A generated runbook over ``n`` rows (see the module docs); it is
    checked before it is returned."""
    max_pts = min(max_pts, n)
    chunk = chunk or max(1, max_pts // 10)
    if kind == "sliding-window":
        steps = _sliding_window(n, max_pts, chunk, seed)
    elif kind == "expiration":
        steps = _expiration(n, max_pts, chunk, seed)
    elif kind.startswith("churn:"):
        try:
            percent = float(kind.split(":", 1)[1])
        except ValueError:
            raise RunbookError(f"churn:P needs a number P, got {kind!r}") from None
        steps = _churn(n, max_pts, percent, cycles)
    else:
        raise RunbookError(f"unknown generator {kind!r} (known: {', '.join(GENERATORS)}, and clustered with the runner)")
    rb = Runbook(dataset, max_pts, steps)
    check(rb, n)
    return rb
