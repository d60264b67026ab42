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


def _int(v: Any, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise RunbookError(f"{what} must be an integer, got {v!r}")
    return v


def loads(text: str, dataset: Optional[str] = None) -> Runbook:
    """Parses runbook YAML; ``dataset`` picks the top-level key (the only
    one when omitted)."""
    import yaml

    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise RunbookError(f"not YAML: {e}") from None
    if not isinstance(doc, dict) or not doc:
        raise RunbookError("a runbook is a mapping from a dataset name to its steps")
    if dataset is None:
        if len(doc) != 1:
            raise RunbookError(f"the file holds runbooks for {sorted(map(str, doc))}: name one")
        dataset = next(iter(doc))
    if dataset not in doc:
        raise RunbookError(f"no runbook for dataset {dataset!r}; the file has {sorted(map(str, doc))}")
    body = doc[dataset]
    if not isinstance(body, dict) or "max_pts" not in body:
        raise RunbookError(f"{dataset}: max_pts is missing")
    max_pts = _int(body["max_pts"], f"{dataset}: max_pts")
    numbered = {}
    for k, v in body.items():
        if k in ("max_pts", "gt_url"):
            continue
        if isinstance(k, bool) or not (isinstance(k, int) or (isinstance(k, str) and k.isdigit())):
            raise RunbookError(f"{dataset}: unknown key {k!r} (steps are numbered 1, 2, …)")
        num = int(k)
        if num in numbered:
            raise RunbookError(f"{dataset}: step {num} appears twice")
        numbered[num] = v
    if sorted(numbered) != list(range(1, len(numbered) + 1)):
        raise RunbookError(f"{dataset}: steps must be numbered 1..{len(numbered)} without gaps")
    steps = []
    for num in range(1, len(numbered) + 1):
        s = numbered[num]
        if not isinstance(s, dict) or "operation" not in s:
            raise RunbookError(f"step {num}: no operation")
        op = s["operation"]
        if op not in OPERATIONS:
            raise RunbookError(f"step {num}: unknown operation {op!r} (known: {', '.join(OPERATIONS)})")
        allowed = {"operation"} | {
            "insert": {"start", "end"},
            "delete": {"start", "end"},
            "search": set(),
            "replace": {"tags_start", "tags_end", "ids_start", "ids_end"},
        }[op]
        extra = set(s) - allowed
        if extra:
            raise RunbookError(f"step {num} ({op}): unknown field(s) {sorted(extra)}")
        missing = allowed - set(s) - {"operation"}
        if missing:
            raise RunbookError(f"step {num} ({op}): missing {sorted(missing)}")
        steps.append(Step(op, **{k: _int(v, f"step {num}: {k}") for k, v in s.items() if k != "operation"}))
    return Runbook(str(dataset), max_pts, steps)


def load(path, dataset: Optional[str] = None) -> Runbook:
    with open(path) as f:
        return loads(f.read(), dataset)


def dump(rb: Runbook) -> str:
    """The runbook as YAML (the big-ann-benchmarks layout)."""
    import yaml

    body: Dict[Any, Any] = {"max_pts": int(rb.max_pts)}
    for i, s in enumerate(rb.steps, 1):
        body[i] = s.as_dict()
    return yaml.safe_dump({rb.dataset: body}, sort_keys=False)


def check(rb: Runbook, n: int) -> Dict[str, int]:
    """Replays the runbook over ``n`` rows (see the module docs); returns
    counts of its operations and the largest active set."""
    if rb.max_pts < 1 or rb.max_pts > n:
        raise RunbookError(f"max_pts {rb.max_pts} must be in 1..={n} (the dataset's rows)")
    active = np.zeros(n, dtype=bool)
    counts = {op: 0 for op in OPERATIONS}
    peak = 0

    def rng(num, op, a, b):
        if not (0 <= a < b <= n):
            raise RunbookError(f"step {num} ({op}): range {a}..{b} is empty or outside 0..{n}")

    for num, s in enumerate(rb.steps, 1):
        if s.operation not in OPERATIONS:
            raise RunbookError(f"step {num}: unknown operation {s.operation!r} (known: {', '.join(OPERATIONS)})")
        need = {"insert": ("start", "end"), "delete": ("start", "end"), "search": (),
                "replace": ("tags_start", "tags_end", "ids_start", "ids_end")}[s.operation]
        missing = [f for f in need if not isinstance(getattr(s, f), int)]
        if missing:
            raise RunbookError(f"step {num} ({s.operation}): missing {missing}")
        counts[s.operation] += 1
        if s.operation in ("insert", "delete"):
            rng(num, s.operation, s.start, s.end)
            inserting = s.operation == "insert"
            # An insert needs every id inactive, a delete every id active.
            wrong = np.flatnonzero(active[s.start : s.end] == inserting)
            if wrong.size:
                why = "ids already active from an earlier insert" if inserting else "ids never inserted or deleted already"
                raise RunbookError(
                    f"step {num} ({s.operation} {s.start}..{s.end}): {why}, first {s.start + int(wrong[0])}"
                )
            active[s.start : s.end] = inserting
        elif s.operation == "replace":
            rng(num, "replace tags", s.tags_start, s.tags_end)
            rng(num, "replace ids", s.ids_start, s.ids_end)
            if s.tags_end - s.tags_start != s.ids_end - s.ids_start:
                raise RunbookError(f"step {num} (replace): {s.tags_end - s.tags_start} tags but {s.ids_end - s.ids_start} rows")
            gone = np.flatnonzero(~active[s.tags_start : s.tags_end])
            if gone.size:
                raise RunbookError(f"step {num} (replace): id {s.tags_start + int(gone[0])} is not active")
        live = int(active.sum())
        if live > rb.max_pts:
            raise RunbookError(f"step {num}: {live} points active, more than max_pts {rb.max_pts}")
        peak = max(peak, live)
    return {**counts, "peak_active": peak}


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


def kmeans(x: np.ndarray, k: int, seed: int = 0, iters: int = 25, sample: int = 100_000) -> np.ndarray:
    """Cluster labels of the rows of ``x`` (squared L2): k-means++ seeding
    on a seeded sample of at most ``sample`` rows, then ``iters`` Lloyd
    iterations over all rows; an emptied cluster takes the point farthest
    from its centre. Deterministic for a given ``seed``."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    n = len(x)
    if not (1 <= k <= n):
        raise RunbookError(f"k-means into {k} clusters needs at least {k} rows, got {n}")
    rng = np.random.default_rng(seed)
    pool = x[rng.choice(n, size=min(n, sample), replace=False)] if n > sample else x
    centres = np.empty((k, x.shape[1]), dtype=np.float32)
    centres[0] = pool[rng.integers(len(pool))]
    d2 = ((pool - centres[0]) ** 2).sum(1)
    for c in range(1, k):
        total = float(d2.sum())
        pick = rng.choice(len(pool), p=d2 / total) if total > 0 else rng.integers(len(pool))
        centres[c] = pool[pick]
        d2 = np.minimum(d2, ((pool - centres[c]) ** 2).sum(1))
    sq = (x * x).sum(1)
    labels = np.zeros(n, dtype=np.int64)
    for _ in range(iters):
        best = np.empty(n, dtype=np.float32)
        for a in range(0, n, 65536):
            d = sq[a : a + 65536, None] - 2 * x[a : a + 65536] @ centres.T + (centres * centres).sum(1)[None, :]
            labels[a : a + 65536] = d.argmin(1)
            best[a : a + 65536] = d.min(1)
        counts = np.bincount(labels, minlength=k)
        sums = np.zeros((k, x.shape[1]), dtype=np.float64)
        np.add.at(sums, labels, x)
        new = (sums / np.maximum(counts, 1)[:, None]).astype(np.float32)
        for c in np.flatnonzero(counts == 0):
            far = int(best.argmax())
            new[c], best[far] = x[far], -np.inf
        if np.array_equal(new, centres):
            break
        centres = new
    return labels


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
