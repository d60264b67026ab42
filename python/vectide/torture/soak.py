"""The soak: a collection under churn for minutes or hours, every answer
checked against a model of the exact expected state.

``python -m vectide.torture soak --engine E --minutes M [--server]
[--standalone] [--compute-nodes N] --out FILE.json``. The workload is
written once, against the collection protocol (the embedded
``Collection``, or ``vectide.Client``'s collection with ``--server``);
``--standalone`` runs a durable engine alone, on its own log, through
``vectide.Index`` (no payloads, no exact search); ``--compute-nodes N`` an
engine on a memory node, through N compute nodes (below).

How it runs:

- A **driver** process loads ``--points`` GloVe-50 rows (cosine) and then
  runs ``--writers`` writer threads (single-point upserts of absent ids,
  re-upserts of live ids with a new vector, deletes, payload edits; about
  as many inserts as deletes, so the live set stays near its size) and
  ``--readers`` reader threads, as fast as they go. Each writer owns the
  ids congruent to its number, so an id's operations never overlap.
- Every operation is printed (``B op id kind seed`` before, ``A op`` once
  it is acknowledged: on return, or for an engine durable at flush after
  the next flush) and the parent keeps the acknowledged history
  (``oracle.Oracle``).
- Readers check every answer against the driver's model (a logical clock
  taken at each operation's begin and end): no id absent through the whole
  call (a delete acknowledged before it began), no id never written; every
  fifth search is exact (``exact=True``): every returned id live at some
  moment of the call, its score the distance to its vector when it did not
  change, and every id live and unchanged through the call that is nearer
  than the k-th result present.
- Every 2 s: directory bytes (allocated) over live vector bytes (live ×
  dim × 4, payloads excluded), the holder's RSS, and when the driver holds
  the data (embedded, glibc) its glibc heap: bytes allocated and bytes the
  allocator keeps free (``heap_in_use_growth``, ``heap_free_growth``; the
  product's own allocations go to mimalloc, so this is the interpreter's
  and the C libraries' share), and the engine's own stats
  (``engine_stats``: a block store's blocks in use, free and held,
  postings, slots, its memory). Every 50 ms the engine's
  maintenance stat (``maintenance``: jobs running, jobs started); a write
  or search that began in an interval where a job ran (or began) counts as
  "maintenance", else "idle". Standalone, an engine whose background jobs
  can be held (``Index.pause_maintenance``: ``spfresh``, ``spann``) is held
  for 5 s in every minute (``--quiet-every``; each sample's ``quiet``):
  under this churn its jobs never stop, and those windows are where its
  idle writes come from.
- At the end the writers park (readers go on) while the holder does what a
  quiet moment gives it (the engine's pending maintenance and, through the
  database or the server, a checkpoint; the server has Vectide's own
  endpoints for both) until no job has run for a second: one "settled" sample.
  Then the writers resume, and 1-3 s later
  the holder of the data (the driver, or the server) is SIGKILLed
  mid-stream, the data reopened and every id compared with the
  acknowledged history.

An engine that lives on a memory node (registry persistence
``"durable at flush, on its memory node"``, ``ON_MEMORY_NODE``; decided by
that string, never by the engine's name) runs standalone with
``--compute-nodes N`` (N >= 1; 1 when not given): the soak starts a memory
node itself (``vectide memnode`` on 127.0.0.1, ``--backing`` a file in the
work dir's ``data``, whose bytes are the disk samples and whose RSS is the
holder's), and the driver attaches N compute nodes (N ``vectide.Index``
objects on one region, each with its own ``writer`` name, each numbering
its own operations) after loading the points through the first. Writer
``w`` writes through node ``w % N``, reader ``r`` reads through node
``r % N``: the one model in the driver checks every answer, so an answer
read through one node is held to the writes made through another. A write
is acknowledged when its call returns (durable on a backed memory node);
each node also flushes every second (its durable_seq in the region's
writer table), and at the settle each node's durable_seq must be the last
of its operations. The holder SIGKILLed at the end is the memory node; it
is restarted on its backing file (a new port), a fresh compute node
attaches and every id is compared with the acknowledged history as for
the other engines; besides, the region's live count must be the number of
ids found (no label twice), its structure whole (``Index.check``), no
search through the fresh node may return an id found absent, and each
writer name must read back at least the durable_seq it flushed at the
settle. The memory node is stopped and what the soak put in the work dir
removed at the end, also when the soak fails. The summary adds
``compute_nodes``, ``writes_per_compute_node``,
``searches_per_compute_node``, ``write_ms_mean_per_compute_node``,
``cas_retries_per_compute_node``, ``durable_seq_mismatches``,
``label_count_minus_live``, ``structure_violations``,
``absent_ids_in_answers_after_restart``, ``durable_seq_at_settle``,
``durable_seq_after_restart`` and ``durable_seq_regressions`` (every
failure among them is also one of ``errors``).

The JSON report's ``summary`` holds ``wrong_answers``,
``acked_writes_lost``, ``disk_over_live_growth`` (the settled sample over
the reference: the first sample between jobs once the first maintenance
job the churn began had completed; jobs the load began do not count, the
churn has not shaped the files yet. Both are taken between jobs, so a job
that copies its files, or a log between two checkpoints, does not put one
of them on a tooth of the sawtooth; ``disk_over_live_growth_under_load``
is the last sample under load over the same reference, and
``disk_over_live_envelope_growth`` the peaks' trend),
``disk_over_live_last`` (the settled sample's; ``settled`` says whether no
job ran when it was taken, ``settle_s`` how long that took),
``rss_growth`` (the last sample under load over the one after
warm-up; ``rss_envelope_growth`` compares the peaks instead, as
``disk_over_live_envelope_growth`` does, so a job's working memory at the
last sample does not read as growth; ``rss_floor_growth`` the troughs, where
memory kept after the jobs shows; ``rss_settled_growth`` the settled
sample; ``rss_anon_growth`` the anonymous part
alone, without mapped files; ``rss_anon_huge_last`` the last sample's
anonymous bytes in transparent huge pages, 0 also when unreadable) and
``write_p999_maintenance_over_idle``.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from .oracle import DELETE, SET_PAYLOAD, UPSERT, Oracle

DIM = 50
NAME = "soak"
DATASET = "glove-6b-50-angular"
INF = np.iinfo(np.int64).max
K = 10
EXACT_EVERY = 5
SAMPLE_S = 2.0
POLL_S = 0.05
# The settle before the kill: how long it may wait for the writers to park
# and for the maintenance jobs to end.
PARK_S = 60.0
SETTLE_S = 300.0
QUIET_S = 1.0
# Standalone, an engine whose background jobs can be held
# (``Index.pause_maintenance``) is held for QUIET_WINDOW_S in every
# ``--quiet-every`` seconds (at most a third of it): under this churn the
# jobs of ``spfresh`` never stop (a split, merge or reassign begins in
# every 50 ms poll), so without these windows no write is idle and the
# maintenance P99.9 has no same-run baseline.
QUIET_EVERY_S = 60.0
QUIET_WINDOW_S = 5.0
# Cosine distances computed by the engine (f32 kernels) and by numpy agree
# to about 1e-6; a wrong vector is off by far more.
TOL = 2e-4
WRITE_KINDS = ("upsert_new", "reupsert", "delete", "payload")


# ---------------------------------------------------------------- shared

def _rows() -> Tuple[np.ndarray, np.ndarray]:
    """GloVe-50's (train, test) rows, unit length (no ground truth needed)."""
    from vectide import datasets

    train, test = datasets.vectors(DATASET)
    return np.ascontiguousarray(train, dtype=np.float32), np.ascontiguousarray(test, dtype=np.float32)


def id_space(points: int) -> int:
    """Ids in play: a quarter more than the live set, so that inserts find
    absent ids."""
    return points + points // 4


def initial_rows(points: int, seed: int, n_rows: int) -> np.ndarray:
    """The GloVe row of each initially loaded id ``0..points``."""
    return np.random.default_rng(seed).integers(0, n_rows, size=points)


def part_of(rel: Path) -> str:
    """The part of the data a file belongs to: its first path component
    below a database collection's directory (``wal``, ``points`` for the
    point store's ``points.snap`` and ``points.log``, the engine's
    ``index``...), or below the index directory when standalone."""
    parts = rel.parts
    if len(parts) >= 3 and parts[0] == "collections":
        parts = parts[2:]
        if len(parts) == 1 and parts[0].startswith("points."):
            return "points"
    return parts[0] if parts else ""


def dir_bytes(path: Path) -> Tuple[int, int, Dict[str, int]]:
    """(allocated, apparent) bytes of the files under ``path``, and the
    allocated bytes of each part (see ``part_of``)."""
    alloc = size = 0
    parts: Dict[str, int] = {}
    for root, _, files in os.walk(path):
        for f in files:
            full = os.path.join(root, f)
            try:
                st = os.lstat(full)
            except OSError:
                continue  # removed while walking
            alloc += st.st_blocks * 512
            size += st.st_size
            key = part_of(Path(full).relative_to(path))
            parts[key] = parts.get(key, 0) + st.st_blocks * 512
    return alloc, size, parts


def rss_bytes(pid: int) -> Dict[str, int]:
    """The holder's resident set from ``/proc/PID/status``: ``rss`` in all,
    ``rss_anon`` (heap and stacks), ``rss_file`` (mapped files and shared
    memory, e.g. a persistent region) and ``rss_anon_huge`` (the anonymous
    bytes in transparent huge pages), in bytes (0 when unreadable)."""
    keys = {"VmRSS:": "rss", "RssAnon:": "rss_anon", "RssFile:": "rss_file", "RssShmem:": "rss_file"}
    out = {"rss": 0, "rss_anon": 0, "rss_file": 0}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key = keys.get(line.split(":", 1)[0] + ":")
                if key:
                    out[key] += int(line.split()[1]) * 1024
    except OSError:
        pass
    # Transparent huge pages among the anonymous ones (``smaps_rollup``):
    # RSS that moves with them is the kernel's collapsing, not allocation.
    out["rss_anon_huge"] = 0
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("AnonHugePages:"):
                    out["rss_anon_huge"] = int(line.split()[1]) * 1024
    except OSError:
        pass
    return out


def heap_bytes() -> Optional[Tuple[int, int]]:
    """This process's C heap: (bytes in use, free bytes the allocator holds),
    from glibc's ``mallinfo2``; ``None`` elsewhere. When the driver holds
    the data (embedded), it tells RSS growth that is allocation from growth
    that is the allocator's free lists."""
    global _mallinfo2
    if _mallinfo2 is None:
        try:
            import ctypes

            class _MI2(ctypes.Structure):
                _fields_ = [(n, ctypes.c_size_t) for n in
                            "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]

            f = ctypes.CDLL("libc.so.6").mallinfo2
            f.restype = _MI2
            _mallinfo2 = f
        except (OSError, AttributeError):
            _mallinfo2 = False
    if not _mallinfo2:
        return None
    m = _mallinfo2()
    return int(m.uordblks + m.hblkhd), int(m.fordblks)


_mallinfo2 = None


# ---------------------------------------------------------------- the model

class Model:
    """What the driver's readers check against: per id, the state after
    its last begun operation (``cur``: a GloVe row, -1 absent), the state
    before it, the logical clock at its begin (``b``) and acknowledgement
    (``a``, ``INF`` while in flight), the acknowledgement of the operation
    before it, and when the id was first written. One operation per id is
    in flight at most (its writer owns it)."""

    def __init__(self, n_ids: int, vecs: np.ndarray) -> None:
        self.lock = threading.Lock()
        self.clock = 0
        self.vecs = vecs
        self.cur = np.full(n_ids, -1, dtype=np.int64)
        self.before = np.full(n_ids, -1, dtype=np.int64)
        self.b = np.zeros(n_ids, dtype=np.int64)
        self.a = np.zeros(n_ids, dtype=np.int64)
        self.prev_a = np.zeros(n_ids, dtype=np.int64)
        self.first = np.full(n_ids, INF, dtype=np.int64)
        # For the exact check's brute force: the vector and liveness of
        # `cur` (read without the lock; every finding is rechecked under it).
        self.mat = np.zeros((n_ids, vecs.shape[1]), dtype=np.float32)
        self.live = np.zeros(n_ids, dtype=bool)
        self.n_live = 0

    def load(self, ids: np.ndarray, rows: np.ndarray) -> None:
        self.cur[ids] = rows
        self.first[ids] = 0
        self.mat[ids] = self.vecs[rows]
        self.live[ids] = True
        self.n_live = int(self.live.sum())

    def tick(self) -> int:
        with self.lock:
            self.clock += 1
            return self.clock

    def begin(self, id_: int, row: int) -> None:
        with self.lock:
            self.clock += 1
            self.before[id_] = self.cur[id_]
            self.prev_a[id_] = self.a[id_]
            self.cur[id_] = row
            self.b[id_] = self.clock
            self.a[id_] = INF
            if row >= 0:
                if self.first[id_] == INF:
                    self.first[id_] = self.clock
                self.mat[id_] = self.vecs[row]
            self.n_live += int(row >= 0) - int(bool(self.live[id_]))
            self.live[id_] = row >= 0

    def ack(self, id_: int) -> None:
        with self.lock:
            self.clock += 1
            self.a[id_] = self.clock

    def during(self, id_: int, r0: int, r1: int) -> Tuple[Optional[List[int]], bool]:
        """The states ``id_`` may have had during a call that ran between
        clocks ``r0`` and ``r1`` (``None``: unknown, the history kept is too
        short), and whether it was never written before ``r1``."""
        with self.lock:
            b, a, cur, before, pa, first = (int(self.b[id_]), int(self.a[id_]), int(self.cur[id_]),
                                            int(self.before[id_]), int(self.prev_a[id_]), int(self.first[id_]))
        never = first > r1
        if b > r1:  # the last operation began after the call
            return ([before] if pa < r0 else None), never
        if a < r0:  # settled before the call began, unchanged through it
            return [cur], never
        return ([before, cur] if pa < r0 else None), never


# ---------------------------------------------------------------- the driver

# The registry's persistence class of an engine that lives in a memory
# node's region (``vectide memnode``), not in a directory: the soak runs it
# on a memory node of its own with ``--compute-nodes N`` compute nodes.
ON_MEMORY_NODE = "durable at flush, on its memory node"
# The region the soak's compute nodes share, and their writer names.
REGION = NAME


def engine_desc(engine: str) -> dict:
    """The registry's entry of ``engine`` (``vectide.engines()``)."""
    import vectide

    for e in vectide.engines():
        if e["name"] == engine:
            return e
    raise ValueError(f"unknown engine {engine!r}")


def on_memory_node(engine: str) -> bool:
    """Whether ``engine`` lives on a memory node, by its registry
    persistence class (never by its name)."""
    return engine_desc(engine)["persistence"] == ON_MEMORY_NODE


def writer_name(node: int) -> str:
    """Compute node ``node``'s writer name in the region's writer table."""
    return f"{NAME}-{node}"


class _Target:
    """The collection (or standalone index) the driver works on. For an
    engine on a memory node (``memnode``), ``nodes`` compute nodes attached
    to one region (``idx`` is the first: the load, the maintenance polls
    and the engine's stats go through it); each numbers its own operations
    (``ops``, the product's own sequence numbers counted from ``base``,
    its ``durable_seq`` when it attached)."""

    def __init__(self, mode: str, engine: str, path: str, url: Optional[str], params: Dict[str, object],
                 memnode: Optional[str] = None, nodes: int = 0, spaces: bool = False) -> None:
        import vectide

        self.spaces = spaces
        self.mode = mode
        self.engine = engine
        self.params = params
        self.payloads = mode != "standalone"
        self.exact = mode != "standalone"
        self.memnode = memnode
        self.nodes: List[object] = []
        self.n_nodes = max(1, nodes) if memnode else 1
        self.ops = [0] * self.n_nodes
        self.base = [0] * self.n_nodes
        self.node_locks = [threading.Lock() for _ in range(self.n_nodes)]
        if mode == "standalone" and memnode:
            self.at_flush = False  # every write is durable when it returns
            self._attach(0)
            self.idx = self.nodes[0]
        elif mode == "standalone":
            self.idx = vectide.Index(dim=DIM, metric="cosine", engine=engine, path=path, **params)
            desc = next(e for e in vectide.engines() if e["name"] == engine)
            self.at_flush = desc["persistence"] == "durable at flush"
        else:
            self.at_flush = False
            if mode == "server":
                self.db = vectide.Client(url, timeout=120)
            else:
                self.db = vectide.connect(path)
            try:
                self.col = self.db.get_collection(NAME)
            except KeyError:
                if spaces:
                    self.col = self.db.create_collection(NAME, vectors=spaces_config(engine, params),
                                                         sparse_vectors={"terms": {"modifier": "idf"}})
                else:
                    self.col = self.db.create_collection(NAME, dim=DIM, metric="cosine", engine=engine, **params)

    def _attach(self, n: int) -> None:
        import vectide

        idx = vectide.Index(dim=DIM, metric="cosine", engine=self.engine, memnode=self.memnode, region=REGION,
                            writer=writer_name(n), **self.params)
        self.base[n] = int(idx.durable_seq)
        self.nodes.append(idx)

    def attach_peers(self) -> None:
        """Attaches compute nodes 1..N-1 to the region (once the load has
        built it: a region is built from its first insert)."""
        for n in range(len(self.nodes), self.n_nodes):
            self._attach(n)

    def _node(self, node: int):
        """Compute node ``node``'s index, its operation counted (the
        counter follows the product's sequence numbers: one per call)."""
        with self.node_locks[node]:
            self.ops[node] += 1
        return self.nodes[node]

    def upsert(self, ids, vecs, seeds, node: int = 0) -> None:
        if self.memnode:
            self._node(node).add(np.asarray(ids, dtype=np.uint64), vecs)
        elif self.mode == "standalone":
            self.idx.add(np.asarray(ids, dtype=np.uint64), vecs)
        elif self.spaces:
            self.col.upsert_points([{"id": int(i), "vector": {"": v, "echo": v[::-1], "terms": terms_of(v)},
                                     "payload": {"s": int(s)}} for i, v, s in zip(ids, vecs, seeds)])
        else:
            self.col.upsert(list(ids), vecs, payloads=[{"s": int(s)} for s in seeds])

    def delete(self, id_: int, node: int = 0) -> None:
        if self.memnode:
            self._node(node).delete(np.array([id_], dtype=np.uint64))
        elif self.mode == "standalone":
            self.idx.delete(np.array([id_], dtype=np.uint64))
        else:
            self.col.delete([id_])

    def flush_nodes(self) -> List[int]:
        """Flushes every compute node (each records its durable_seq in the
        region's writer table); returns their durable_seqs."""
        for idx in self.nodes:
            idx.flush()
        return [int(idx.durable_seq) for idx in self.nodes]

    def node_report(self) -> List[Dict[str, object]]:
        """Per compute node: operations issued (``ops``: calls since it
        attached, each one of its sequence numbers), the sequence number
        it started from, its durable_seq, and a few of its own stats."""
        out = []
        for n, idx in enumerate(self.nodes):
            with self.node_locks[n]:
                ops = self.ops[n]
            row: Dict[str, object] = {"ops": ops, "base_seq": self.base[n], "durable_seq": int(idx.durable_seq)}
            try:
                st = idx.stats()
                for k in ("cas_retries", "round_trips", "partition_rebuilds", "repartitions", "region_relayouts",
                          "cached_partitions"):
                    if k in st:
                        row[k] = st[k]
            except Exception as e:  # noqa: BLE001
                row["stats_error"] = f"{type(e).__name__}: {str(e)[:200]}"
            out.append(row)
        return out

    def set_payload(self, id_: int, seed: int) -> None:
        self.col.set_payload({"s": seed}, ids=[id_])

    def flush(self) -> None:
        self.idx.flush()

    def search(self, q: np.ndarray, exact: bool, node: int = 0) -> Tuple[List[int], List[float]]:
        if self.mode == "standalone":
            ids, d = (self.nodes[node] if self.memnode else self.idx).search(q, K)
            keep = ids[0] != np.iinfo(np.uint64).max
            return [int(i) for i in ids[0][keep]], [float(x) for x in d[0][keep]]
        hits = self.col.search(q[None, :], K, with_payload=False, exact=exact)[0]
        return [int(h.id) for h in hits], [float(h.distance) for h in hits]

    def maintenance(self) -> Tuple[bool, int]:
        """(a job runs now, jobs started so far)."""
        if self.mode == "standalone":
            s = self.idx.stats()
            return bool(s.get("maintenance")), int(s.get("maintenance_started", 0))
        info = self.col.info()
        m = (info.get("vectide", {}) if self.mode == "server" else info).get("maintenance") or {}
        return bool(m.get("running")), int(m.get("started", 0))

    def engine_stats(self) -> Dict[str, float]:
        """The engine's own stats (the contract's and its extra figures)."""
        if self.mode == "standalone":
            s = self.idx.stats()
        else:
            info = self.col.info()
            s = (info.get("vectide", {}) if self.mode == "server" else info).get("engine_stats") or {}
        # Through the database the engine's own figures come under "extra"
        # (standalone, beside the contract's).
        s = {**s, **(s.get("extra") or {})}
        return {k: v for k, v in s.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}

    def maintain(self) -> None:
        if self.mode == "standalone":
            self.idx.maintain()
        else:
            self.col.maintain()

    def settle(self) -> None:
        """Asks for the work a quiet moment gives the holder: the engine's
        pending maintenance, and in the database (embedded or through the
        server's endpoints) a checkpoint, which cuts the log. Through the
        server on a connection of its own that waits as long as the settle
        may (a merge can outlast the writers' timeout)."""
        if self.mode == "server":
            import vectide

            client = vectide.Client(self.db.url, timeout=SETTLE_S)
            try:
                col = client.get_collection(NAME)
                col.maintain()
                col.checkpoint()
            finally:
                client.close()
            return
        self.maintain()
        if self.mode == "db":
            self.col.checkpoint()
        elif self.memnode:
            self.flush_nodes()
        elif self.at_flush:
            self.flush()


def spaces_config(engine: str, params: Dict[str, object]) -> Dict[str, dict]:
    """``--spaces``: the engine's space (unnamed, so that searches reach it
    as before) and a second on ``flat`` holding each vector reversed; a
    sparse space ``terms`` beside them (:func:`terms_of`)."""
    return {"": {"dim": DIM, "metric": "cosine", "engine": engine, "params": dict(params)},
            "echo": {"dim": DIM, "metric": "cosine", "engine": "flat"}}


def terms_of(v) -> dict:
    """The sparse vector a ``--spaces`` point carries beside ``v``."""
    from .kill import terms_of as t

    return t(v)


def _spaces_problem(i: int, named) -> Optional[str]:
    """A ``--spaces`` point's three vectors, checked against each other."""
    if not isinstance(named, dict) or set(named) != {"", "echo", "terms"}:
        return f"id {i}: vectors {sorted(named) if isinstance(named, dict) else type(named).__name__} (all three were written together)"
    main = np.asarray(named[""], dtype=np.float32)
    echo = np.asarray(named["echo"], dtype=np.float32)
    want = terms_of(main)
    terms = named["terms"]
    # Cosine spaces hold unit vectors: the echo is the main one reversed.
    if not np.allclose(echo, main[::-1], atol=1e-6) or terms["indices"] != want["indices"] \
            or not np.array_equal(np.float32(terms["values"]), np.float32(want["values"])):
        return f"id {i}: its echo or terms vector is not the one written with its main vector"
    return None


def driver(args) -> None:
    """Runs the load, then the writers, readers and samplers until killed."""
    out_lock = threading.Lock()

    def say(line: str) -> None:
        with out_lock:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()

    vecs, queries = _rows()
    n_ids = id_space(args.points)
    params = json.loads(args.params)
    t = _Target(args.mode, args.engine, args.dir, args.url, params, memnode=args.memnode,
                nodes=args.compute_nodes, spaces=args.spaces)
    model = Model(n_ids, vecs)
    rows0 = initial_rows(args.points, args.seed, len(vecs))
    ids0 = np.arange(args.points)
    t_load = time.perf_counter()
    # On a memory node the load is one insert through the first compute
    # node: the region is built from its first insert (its partitions from
    # all the points, as a bulk load would), and the others attach to it.
    step = args.points if t.memnode else 5_000
    for lo in range(0, args.points, step):
        hi = min(lo + step, args.points)
        t.upsert(ids0[lo:hi], vecs[rows0[lo:hi]], rows0[lo:hi])
        say(f"P load {hi}")
    if t.at_flush:
        t.flush()
    if t.memnode:
        t.attach_peers()
    model.load(ids0, rows0)
    say(f"L {time.perf_counter() - t_load:.3f}")
    holder = args.holder_pid or os.getpid()
    work = Path(args.work)
    stop = threading.Event()
    # The settle before the kill (see ``settle``): writers park while it runs.
    pause = threading.Event()
    resume = threading.Event()
    parked = threading.Semaphore(0)
    op_no = iter(range(1, 2**62))
    op_lock = threading.Lock()

    def next_op() -> int:
        with op_lock:
            return next(op_no)

    lat_w: List[List[float]] = [[] for _ in range(args.writers)]
    lat_s: List[List[float]] = [[] for _ in range(args.readers)]
    unflushed: List[int] = []
    unflushed_lock = threading.Lock()
    counts = {"upsert_new": 0, "reupsert": 0, "delete": 0, "payload": 0, "searches": 0, "exact_searches": 0}
    count_lock = threading.Lock()
    # Per compute node (on a memory node): writes acknowledged through it,
    # searches answered by it.
    node_writes = [0] * t.n_nodes
    node_searches = [0] * t.n_nodes
    node_write_s = [0.0] * t.n_nodes

    def writer(w: int) -> None:
        rng = random.Random(args.seed * 7919 + w)
        node = w % t.n_nodes  # the compute node this writer writes through
        live = [i for i in range(w, args.points, args.writers)]
        absent = [i for i in range(args.points + (w - args.points) % args.writers, n_ids, args.writers)]
        mine = lat_w[w]
        while not stop.is_set():
            if pause.is_set():
                parked.release()
                resume.wait()
                continue
            r = rng.random()
            if r < 0.3 and live:
                kind, pool = "delete", live
            elif r < 0.6 and absent:
                kind, pool = "upsert_new", absent
            elif r < 0.85 or not t.payloads:
                kind, pool = "reupsert", live
            else:
                kind, pool = "payload", live
            if not pool:
                continue
            j = rng.randrange(len(pool))
            id_ = pool[j]
            op = next_op()
            if kind == "delete":
                row, code, seed = -1, DELETE, 0
            elif kind == "payload":
                row, code, seed = int(model.cur[id_]), SET_PAYLOAD, rng.randrange(1, 2**31)
            else:
                row = rng.randrange(len(vecs))
                code, seed = UPSERT, row
            say(f"B {op} {id_} {code} {seed}")
            model.begin(id_, row)
            t0 = time.monotonic()
            try:
                if code == DELETE:
                    t.delete(id_, node)
                elif code == SET_PAYLOAD:
                    t.set_payload(id_, seed)
                else:
                    t.upsert([id_], vecs[row][None, :], [seed], node)
            except Exception as e:  # noqa: BLE001
                # The outcome is unknown: the operation stays in flight.
                say(f"E writer {w}: {type(e).__name__}: {str(e)[:300]}")
                return
            t1 = time.monotonic()
            model.ack(id_)
            mine += (t0, t1 - t0)
            if t.at_flush:
                with unflushed_lock:
                    unflushed.append(op)
            else:
                say(f"A {op}")
            # Move the id between the writer's pools.
            if kind == "delete" or kind == "upsert_new":
                pool[j] = pool[-1]
                pool.pop()
                (absent if kind == "delete" else live).append(id_)
            with count_lock:
                counts[kind] += 1
                node_writes[node] += 1
                node_write_s[node] += t1 - t0

    def flusher() -> None:
        while not stop.is_set():
            time.sleep(1.0)
            with unflushed_lock:
                done = list(unflushed)
                unflushed.clear()
            try:
                t.flush()
            except Exception as e:  # noqa: BLE001
                say(f"E flush: {type(e).__name__}: {str(e)[:300]}")
                return
            for op in done:
                say(f"A {op}")

    def node_flusher() -> None:
        """On a memory node: each compute node flushes every second (it
        records its durable_seq in the region's writer table), beside its
        writes; acknowledgements do not wait for it (a write is durable on
        the backed memory node when it returns)."""
        while not stop.wait(1.0):
            try:
                t.flush_nodes()
            except Exception as e:  # noqa: BLE001
                say(f"E flush: {type(e).__name__}: {str(e)[:300]}")
                return

    def reader(rd: int) -> None:
        rng = random.Random(args.seed * 104729 + rd)
        node = rd % t.n_nodes  # the compute node this reader reads through
        mine = lat_s[rd]
        n = 0
        while not stop.is_set():
            q = queries[rng.randrange(len(queries))]
            exact = t.exact and n % EXACT_EVERY == 0
            n += 1
            r0 = model.tick()
            t0 = time.monotonic()
            try:
                ids, dists = t.search(q, exact, node)
            except Exception as e:  # noqa: BLE001
                say(f"V search failed: {type(e).__name__}: {str(e)[:300]}")
                continue
            t1 = time.monotonic()
            r1 = model.tick()
            mine += (t0, t1 - t0, float(exact))
            for v in check_answer(model, q, ids, dists, r0, r1, exact):
                say(f"V {'exact' if exact else 'ann'}: {v}")
            with count_lock:
                counts["exact_searches" if exact else "searches"] += 1
                node_searches[node] += 1

    polls: List[float] = []

    def poller() -> None:
        while not stop.is_set():
            try:
                running, started = t.maintenance()
            except Exception as e:  # noqa: BLE001
                say(f"E maintenance stat: {type(e).__name__}: {str(e)[:300]}")
                return
            polls.extend((time.monotonic(), float(running), float(started)))
            time.sleep(POLL_S)

    # Idle windows (QUIET_EVERY_S): the engine's background jobs held.
    # A window and the settle exclude each other (``quiet_lock``): the
    # settle waits for the jobs to end, which a held engine would fake.
    held = threading.Event()
    quiet_lock = threading.Lock()
    windows = [0]
    quieting = (t.mode == "standalone" and args.quiet_every > 0
                and t.idx.pause_maintenance(False))
    window = min(QUIET_WINDOW_S, args.quiet_every / 3)

    def quieter() -> None:
        while not stop.wait(args.quiet_every - window):
            with quiet_lock:
                if pause.is_set():
                    continue
                try:
                    t.idx.pause_maintenance(True)
                    held.set()
                    windows[0] += 1
                    stop.wait(window)
                finally:
                    t.idx.pause_maintenance(False)
                    held.clear()

    def maintainer() -> None:
        while not stop.wait(args.maintain_every):
            try:
                t.maintain()
            except Exception as e:  # noqa: BLE001
                say(f"E maintain: {type(e).__name__}: {str(e)[:300]}")
                return

    threads = [threading.Thread(target=writer, args=(w,), daemon=True) for w in range(args.writers)]
    threads += [threading.Thread(target=reader, args=(r,), daemon=True) for r in range(args.readers)]
    threads.append(threading.Thread(target=poller, daemon=True))
    if t.at_flush:
        threads.append(threading.Thread(target=flusher, daemon=True))
    if t.memnode:
        threads.append(threading.Thread(target=node_flusher, daemon=True))
    if args.maintain_every > 0:
        threads.append(threading.Thread(target=maintainer, daemon=True))
    if quieting:
        threads.append(threading.Thread(target=quieter, daemon=True))
    # Jobs the load began (its checkpoints, an engine's first
    # consolidation) are not the churn's: the disk reference is taken
    # after the first job that begins once the churn does.
    try:
        _, before = t.maintenance()
    except Exception as e:  # noqa: BLE001
        say(f"E maintenance stat: {type(e).__name__}: {str(e)[:300]}")
        before = 0
    say(f"R {before}")
    for th in threads:
        th.start()
    data_dir = Path(args.data_dir)
    files = {"write": work / "lat-write.f64", "search": work / "lat-search.f64", "maint": work / "maint.f64"}
    t_start = time.monotonic()

    def drain(xs: List[float], width: int, f) -> List[float]:
        """Moves the whole records of ``xs`` to file ``f`` and out of memory
        (the lists would otherwise hold every latency of the run: about
        100 MB of Python floats in a 30-minute soak, counted in the holder's
        RSS). Returns the last record moved. Threads append to ``xs`` while
        this runs; CPython makes the slice, the ``+=`` and the ``del`` each
        atomic, and a record may be half appended, so only whole ones go."""
        n = len(xs) - len(xs) % width
        moved = xs[:n]
        np.asarray(moved, dtype=np.float64).tofile(f)
        del xs[:n]
        return moved[-width:]

    last = [0.0, 0.0, 0.0]

    def take_sample() -> dict:
        alloc, size, parts = dir_bytes(data_dir)
        # What the engine says it holds (a block store's blocks in use, free
        # and held; postings; slots; its memory), so that the level of disk
        # over live can be explained from the JSON at every sample.
        try:
            stats = t.engine_stats()
        except Exception as e:  # noqa: BLE001
            say(f"E engine stats: {type(e).__name__}: {str(e)[:300]}")
            stats = {}
        m = stats.get("memory_bytes")
        engine_memory = None if m is None else int(m)
        with count_lock:
            c = dict(counts)
            per_node = list(zip(node_writes, node_searches, node_write_s))
        heap = heap_bytes() if holder == os.getpid() else None
        nodes = None
        if t.memnode:
            nodes = t.node_report()
            for row, (nw, ns, ws) in zip(nodes, per_node):
                row.update({"writes": nw, "searches": ns, "write_ms_mean": round(1000.0 * ws / max(1, nw), 3)})
        now = time.monotonic()
        return {"compute_nodes": nodes, "t": round(now - t_start, 3), "clock": round(now, 3), "disk_bytes": alloc, "apparent_bytes": size,
                "live": model.n_live, **rss_bytes(holder), "engine_memory": engine_memory,
                "heap_in_use": None if heap is None else heap[0],
                "heap_free": None if heap is None else heap[1],
                "maintenance_started": int(last[2]),
                "maintenance_running": bool(last[1]), "paused": pause.is_set(),
                "quiet": held.is_set() if quieting else None,
                "quiet_windows": windows[0] if quieting else None, "disk_parts": parts, **c,
                "engine_stats": stats}

    def settle() -> None:
        """Parks the writers (readers go on), asks for the holder's quiet-time
        work (``_Target.settle``), waits until no maintenance job has run or
        begun for ``QUIET_S``, and
        reports that state as one sample (``Q``); then the writers resume.
        The disk reference is a sample between jobs too (``first_job_done``),
        so the two compare the same point of the jobs' sawtooth: a job that
        copies its files, or a log between two checkpoints, puts a sample
        taken under load anywhere on the teeth."""
        t0 = time.monotonic()
        with quiet_lock:  # a held window ends first; none begins meanwhile
            pause.set()
        alive = sum(th.is_alive() for th in threads[:args.writers])
        parked_all = all(parked.acquire(timeout=PARK_S) for _ in range(alive))
        with count_lock:
            writes_at_park = sum(counts[k] for k in WRITE_KINDS)
        # What the writers left unflushed, the flusher acknowledges.
        while t.at_flush and time.monotonic() - t0 < PARK_S:
            with unflushed_lock:
                if not unflushed:
                    break
            time.sleep(0.05)
        settled = False
        running, started = True, None
        try:
            t.settle()
            limit = t0 + (args.settle_max if args.settle_max is not None else SETTLE_S)
            # Quiet for QUIET_S: no job running and none begun meanwhile (a
            # job that one queued, e.g. a compaction after a snapshot, has
            # not begun yet the moment its predecessor ends).
            quiet = None
            while time.monotonic() < limit:
                running, started = t.maintenance()
                now = time.monotonic()
                if not running:
                    if quiet is None or quiet[1] != started:
                        quiet = (now, started)
                    elif now - quiet[0] >= QUIET_S:
                        settled = True
                        break
                else:
                    quiet = None
                time.sleep(0.1)
        except Exception as e:  # noqa: BLE001
            say(f"E settle: {type(e).__name__}: {str(e)[:300]}")
        x = take_sample()
        if started is not None:
            x.update({"maintenance_running": bool(running), "maintenance_started": int(started)})
        x.update({"settle_s": round(time.monotonic() - t0, 3), "settled": settled and parked_all,
                  "writes_at_park": writes_at_park})
        say("Q " + json.dumps(x))
        pause.clear()
        resume.set()

    def control() -> None:
        for line in sys.stdin:
            if line.strip() == "Q":
                settle()

    threading.Thread(target=control, daemon=True).start()
    while True:
        time.sleep(SAMPLE_S)
        # Latencies and polls so far go to files (the parent reads them
        # after the kill; a SIGKILL loses at most the last 2 s of them).
        with open(files["write"], "ab") as f:
            for xs in lat_w:
                drain(xs, 2, f)
        with open(files["search"], "ab") as f:
            for xs in lat_s:
                drain(xs, 3, f)
        with open(files["maint"], "ab") as f:
            last = drain(polls, 3, f) or last
        say("S " + json.dumps(take_sample()))


def _growth(samples: List[Dict], warm: Optional[int], key: str) -> Optional[float]:
    """The last sample's ``key`` over the warm sample's (``None`` when
    either lacks it)."""
    if warm is None or not samples:
        return None
    a, b = samples[warm].get(key), samples[-1].get(key)
    return None if not a or b is None else round(b / a, 4)


def live_bytes(sample: Dict) -> int:
    """A sample's live vector bytes (live x dim x 4; at least 1)."""
    return max(1, sample["live"] * DIM * 4)


def disk_over_live(sample: Dict) -> float:
    """A sample's directory bytes over its live vector bytes."""
    return sample["disk_bytes"] / live_bytes(sample)


def parts_over_live(sample: Dict) -> Dict[str, float]:
    """A sample's bytes per part over its live vector bytes."""
    lb = live_bytes(sample)
    return {k: round(v / lb, 3) for k, v in sorted(sample.get("disk_parts", {}).items())}


def check_answer(model: Model, q: np.ndarray, ids: List[int], dists: List[float], r0: int, r1: int,
                 exact: bool) -> List[str]:
    """The violations in one answer (see the module docs)."""
    bad = []
    if len(set(ids)) != len(ids):
        bad.append(f"duplicate ids in {ids}")
    if any(d2 < d1 - TOL for d1, d2 in zip(dists, dists[1:])):
        bad.append(f"distances out of order: {dists}")
    n_ids = len(model.cur)
    for i, d in zip(ids, dists):
        if not 0 <= i < n_ids:
            bad.append(f"id {i} was never written")
            continue
        states, never = model.during(i, r0, r1)
        if never:
            bad.append(f"id {i} was never written before the call ended")
        elif states is not None and all(s < 0 for s in states):
            bad.append(f"id {i} was absent through the call (deleted, acknowledged before it began)")
        elif exact and states is not None and len(states) == 1:
            want = 1.0 - float(np.dot(q, model.vecs[states[0]]))
            if abs(want - d) > TOL:
                bad.append(f"id {i}: distance {d:.6f}, its vector is at {want:.6f}")
    if exact:
        kth = dists[-1] if len(ids) >= K else float("inf")
        d_all = 1.0 - model.mat @ q
        d_all[~model.live] = np.inf
        d_all[[i for i in ids if 0 <= i < n_ids]] = np.inf
        for c in np.flatnonzero(d_all < kth - TOL)[:50]:
            states, _ = model.during(int(c), r0, r1)
            if states is None or len(states) != 1 or states[0] < 0:
                continue  # changed during the call (or absent): not judged
            d = 1.0 - float(np.dot(q, model.vecs[states[0]]))
            if d < kth - TOL:
                bad.append(f"missed id {c} at {d:.6f}, nearer than the k-th result ({kth:.6f}); "
                           f"live and unchanged through the call")
    return bad


# ---------------------------------------------------------------- the parent

def _percentiles(x: np.ndarray) -> Optional[Dict[str, float]]:
    if len(x) == 0:
        return None
    p = np.percentile(x, [50, 99, 99.9]) * 1000.0
    return {"n": int(len(x)), "p50_ms": round(float(p[0]), 4), "p99_ms": round(float(p[1]), 4),
            "p999_ms": round(float(p[2]), 4), "max_ms": round(float(x.max()) * 1000.0, 4)}


def first_job_done(samples: Sequence[Dict], before: int) -> Optional[int]:
    """The first sample between jobs after the first maintenance job that
    began once the churn did (``before`` jobs began during the load) had
    completed: one began, and none runs. Where no such sample exists (jobs
    run back to back), the first one after a second job began (the first
    one ended: jobs of a kind run in turn)."""
    for i, x in enumerate(samples):
        if x["maintenance_started"] - before >= 1 and not x["maintenance_running"]:
            return i
    for i, x in enumerate(samples):
        if x["maintenance_started"] - before > 1:
            return i
    return None


def _window_growth(values: Sequence[float], start: Optional[int], share: float, pick) -> Optional[float]:
    """``pick`` (max or min) of the last ``share`` of ``values`` over
    ``pick`` of the first ``share`` from ``start`` on."""
    if start is None or len(values) - start < 2:
        return None
    tail = values[start:]
    k = max(1, int(len(tail) * share))
    return round(pick(tail[-k:]) / max(1e-30, pick(tail[:k])), 4)


def envelope_growth(ratios: Sequence[float], start: Optional[int], share: float = 0.2) -> Optional[float]:
    """The highest of the last ``share`` of ``ratios`` over the highest of
    the first ``share`` from ``start`` on: a trend the sawtooth of a log
    cut at checkpoints, or of a copy a job holds while it runs, does not
    hide or fake (a single sample lands anywhere on the teeth)."""
    return _window_growth(ratios, start, share, max)


def floor_growth(values: Sequence[float], start: Optional[int], share: float = 0.2) -> Optional[float]:
    """The lowest of the last ``share`` of ``values`` over the lowest of the
    first ``share`` from ``start`` on: what stays between jobs (memory an
    allocator keeps after a job freed it raises the floor, a job's working
    memory only the teeth)."""
    return _window_growth(values, start, share, min)


def split_latencies(starts: np.ndarray, lats: np.ndarray, polls: np.ndarray) -> Dict[str, Optional[dict]]:
    """Latencies split by whether a maintenance job ran (or began) in the
    poll interval where the call began."""
    if len(polls) < 2:
        return {"maintenance": None, "idle": _percentiles(lats)}
    t, running, started = polls[:, 0], polls[:, 1] > 0, polls[:, 2]
    busy = running[:-1] | running[1:] | (started[1:] > started[:-1])
    k = np.searchsorted(t, starts, side="right") - 1
    inside = (k >= 0) & (k < len(busy))
    m = np.zeros(len(starts), dtype=bool)
    m[inside] = busy[k[inside]]
    return {"maintenance": _percentiles(lats[m]), "idle": _percentiles(lats[~m & inside])}


def slowest(starts: np.ndarray, lats: np.ndarray, samples: Sequence[Dict], n: int = 5) -> List[Dict[str, object]]:
    """The ``n`` slowest calls, slowest first: when each began (``t``, the
    samples' clock, so that the engine's stats around it can be read from
    the samples) and how long it took, to find what a stall waited for."""
    if len(lats) == 0:
        return []
    ref = next((x for x in samples if "clock" in x), None)
    offset = 0.0 if ref is None else ref["clock"] - ref["t"]
    top = np.argsort(lats)[::-1][:n]
    return [{"t": round(float(starts[i]) - offset, 3), "ms": round(float(lats[i]) * 1000.0, 3)} for i in top]


def _read_f64(path: Path, width: int) -> np.ndarray:
    if not path.exists():
        return np.zeros((0, width))
    a = np.fromfile(path, dtype=np.float64)
    return a[: len(a) - len(a) % width].reshape(-1, width)


def _identify(vec, pay, cands, vecs) -> object:
    """Which candidate state (row, payload seed) a stored point is."""
    if vec is None:
        return None
    v = np.asarray(vec, dtype=np.float32)
    s = pay.get("s") if isinstance(pay, dict) else None
    for c in cands:
        if c is not None and np.allclose(v, vecs[c[0]], atol=1e-5) and (pay is None or s == c[1]):
            return c
    return (-1, s if isinstance(s, int) else -1)


def _final_state(mode: str, path: str, url: Optional[str], engine: str, params, oracle: Oracle,
                 vecs: np.ndarray, problems: Optional[List[str]] = None) -> Tuple[Dict[int, object], float]:
    import vectide

    ids = list(oracle.expected)
    t0 = time.perf_counter()
    if mode == "standalone":
        idx = vectide.Index(dim=DIM, metric="cosine", engine=engine, path=path, **params)
        opened = time.perf_counter() - t0

        def get(chunk):
            out = []
            for i in chunk:
                out.append((idx.get(np.array([i], dtype=np.uint64))[0], None) if i in idx else None)
            return out
        closer = None
    elif mode == "db":
        db = vectide.connect(path)
        opened = time.perf_counter() - t0
        col = db.get_collection(NAME)

        def get(chunk):
            return [None if r is None else (r[2], r[1]) for r in col._c.get(list(chunk), True)]
        closer = db.close
    else:
        col = vectide.Client(url, timeout=120).get_collection(NAME)
        opened = time.perf_counter() - t0

        def get(chunk):
            recs = col._c._call("POST", col._path("/points"), {"ids": chunk, "with_payload": True, "with_vector": True})
            by = {r["id"]: r for r in recs}
            return [None if i not in by else (by[i]["vector"], by[i].get("payload") or {}) for i in chunk]
        closer = None
    found = {}
    for lo in range(0, len(ids), 1000):
        chunk = ids[lo:lo + 1000]
        for i, rec in zip(chunk, get(chunk)):
            cands = oracle.uncertain.get(i, [oracle.expected[i]])
            if rec is not None and isinstance(rec[0], dict):
                # --spaces: the main vector identifies the write; the other
                # two must be the ones written with it.
                bad = _spaces_problem(i, rec[0])
                if bad and problems is not None:
                    problems.append(bad)
                rec = (rec[0].get(""), rec[1])
            found[i] = None if rec is None or rec[0] is None else _identify(rec[0], rec[1], cands, vecs)
    if closer:
        closer()
    return found, opened


def _final_state_memnode(address: str, engine: str, params, oracle: Oracle, vecs: np.ndarray, queries: np.ndarray,
                         nodes: int, settled_seqs: Optional[List[int]]) -> Tuple[Dict[int, object], float, dict]:
    """After the memory node's restart: a fresh compute node attaches to the
    region (the first to call puts it right), every id is read through it,
    and beside the acknowledged history's check (the caller's) the region
    is held to what it says of itself: its live count is the number of ids
    found (a label twice would count twice), its structure is whole, a
    search returns no id found absent, and each compute node's writer name
    reads back at least the durable_seq it flushed at the settle."""
    import vectide

    t0 = time.perf_counter()
    idx = vectide.Index(dim=DIM, metric="cosine", engine=engine, memnode=address, region=REGION,
                        writer=f"{NAME}-check", **params)
    opened = time.perf_counter() - t0
    found: Dict[int, object] = {}
    for i in oracle.expected:
        cands = oracle.uncertain.get(i, [oracle.expected[i]])
        vec = idx.get(np.array([i], dtype=np.uint64))[0] if i in idx else None
        found[i] = _identify(vec, None, cands, vecs)
    live = sum(v is not None for v in found.values())
    extra: dict = {"live_found": live, "count": len(idx)}
    extra["structure_violations"] = [str(v) for v in idx.check()]
    # Searches through the fresh node: no id found absent comes back.
    back = []
    rng = np.random.default_rng(0)
    for q in queries[rng.integers(0, len(queries), 200)]:
        ids, _ = idx.search(q, K)
        back += [int(i) for i in ids[0] if i != np.iinfo(np.uint64).max and found.get(int(i)) is None]
    extra["absent_ids_in_answers"] = sorted(set(back))
    # Each writer name's durable_seq, as the region's writer table keeps it.
    seqs = []
    for n in range(nodes):
        peer = vectide.Index(dim=DIM, metric="cosine", engine=engine, memnode=address, region=REGION,
                             writer=writer_name(n), **params)
        seqs.append(int(peer.durable_seq))
        del peer
    extra["durable_seq_after_restart"] = seqs
    extra["durable_seq_at_settle"] = settled_seqs
    del idx
    return found, opened, extra


class _MemoryNodes:
    """The memory node the soak runs an engine on: a child process on
    loopback (``vectide memnode --listen 127.0.0.1:0``) keeping its regions
    in ``DATA/memnode.vtb`` (the data's directory, sampled for disk bytes;
    its RSS is the holder's), restarted on that file after its SIGKILL (a
    new port, a log of its own each time)."""

    def __init__(self, data: Path, workdir: Path, size: str) -> None:
        self.data, self.workdir, self.size = data, workdir, size
        self.backing = data / "memnode.vtb"
        self.started: List[object] = []

    @property
    def current(self):
        return self.started[-1]

    @property
    def address(self) -> str:
        return self.current.address

    @property
    def pid(self) -> int:
        return self.current.proc.pid

    def log(self, n: int) -> Path:
        return self.workdir / f"memnode-{n}.log"

    def start(self) -> float:
        """Starts one on the backing file; the seconds until it listened."""
        from vectide.memnode import MemoryNode

        self.data.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        node = MemoryNode(self.size, log=self.log(len(self.started)), extra=["--backing", str(self.backing)])
        self.started.append(node)
        node.start()
        return round(time.perf_counter() - t0, 4)

    def alive(self) -> bool:
        return bool(self.started) and self.current.proc is not None and self.current.proc.poll() is None

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return self.log(len(self.started) - 1).read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def kill(self) -> None:
        """SIGKILL (``MemoryNode.stop`` kills), waited for."""
        if self.started:
            self.current.stop()

    def stop_all(self) -> None:
        for node in self.started:
            try:
                node.stop()
            except Exception:  # noqa: BLE001
                pass


def memnode_size(points: int, size: Optional[str] = None) -> str:
    """The memory node's ``--size``: ``size``, else max(1 GiB, 16 KiB per
    point) (the backing file grows with what the regions use, not to it)."""
    return str(size) if size else str(max(1 << 30, points * (16 << 10)))


def _memnode_figures(remote: Optional[dict], q: Optional[dict], last: dict, errors: List[str]) -> dict:
    """The summary's figures of a soak on a memory node (``remote``: what
    ``_final_state_memnode`` found after the restart), each failure also
    one of ``errors``."""
    rows = last.get("compute_nodes") or []
    out: Dict[str, object] = {
        "compute_nodes": len(rows) or None,
        "writes_per_compute_node": [r.get("writes", 0) for r in rows],
        "searches_per_compute_node": [r.get("searches", 0) for r in rows],
        "write_ms_mean_per_compute_node": [r.get("write_ms_mean") for r in rows],
        "cas_retries_per_compute_node": [r.get("cas_retries") for r in rows],
    }
    # At the settle every writer was parked and each node flushed: its
    # durable_seq is the last of its own sequence numbers (the operations
    # it issued since it attached, counted from where it started).
    settle_rows = (q or {}).get("compute_nodes") or []
    mism = [f"compute node {n}: durable_seq {r['durable_seq']} at the settle, its operations end at "
            f"{r['base_seq'] + r['ops']}" for n, r in enumerate(settle_rows)
            if r["durable_seq"] != r["base_seq"] + r["ops"]]
    out["durable_seq_mismatches"] = len(mism) if settle_rows and q and q.get("settled") else None
    if out["durable_seq_mismatches"]:
        errors.extend(mism)
    if remote is None:
        return out
    out.update({
        # A label twice (or a count that forgot one) shows here: the
        # region's live count over the ids found.
        "label_count_minus_live": remote["count"] - remote["live_found"],
        "structure_violations": len(remote["structure_violations"]),
        "absent_ids_in_answers_after_restart": len(remote["absent_ids_in_answers"]),
        "durable_seq_at_settle": remote["durable_seq_at_settle"],
        "durable_seq_after_restart": remote["durable_seq_after_restart"],
    })
    if remote["count"] != remote["live_found"]:
        errors.append(f"after the restart the region counts {remote['count']} live labels, "
                      f"{remote['live_found']} ids were found")
    errors.extend(f"structure after the restart: {v}" for v in remote["structure_violations"][:20])
    if remote["absent_ids_in_answers"]:
        errors.append(f"after the restart searches returned ids found absent: {remote['absent_ids_in_answers'][:20]}")
    at, back = remote["durable_seq_at_settle"], remote["durable_seq_after_restart"]
    if at is not None:
        regress = [n for n, (a, b) in enumerate(zip(at, back)) if b < a]
        out["durable_seq_regressions"] = len(regress)
        errors.extend(f"compute node {n}'s writer name reads back durable_seq {back[n]} after the restart, "
                      f"it flushed {at[n]} at the settle" for n in regress)
    return out


class UsedWorkdir(ValueError):
    """The soak's ``--workdir`` holds an earlier soak's data."""


class BadSoakArguments(ValueError):
    """Soak options that do not fit together (e.g. ``--compute-nodes`` for
    an engine that does not live on a memory node)."""


def run(engine: str, minutes: float, mode: str, workdir: Path, points: int = 100_000, writers: int = 4,
        readers: int = 2, seed: int = 1, maintain_every: float = 0.0, params: Optional[dict] = None,
        progress: bool = True, settle_max: Optional[float] = None, quiet_every: float = QUIET_EVERY_S,
        compute_nodes: Optional[int] = None, memnode_size_: Optional[str] = None, spaces: bool = False) -> dict:
    """Runs one soak and returns its report (see the module docs). A
    ``workdir`` whose ``data`` holds anything (an earlier soak's index, left
    by a killed run) is refused with :class:`UsedWorkdir`: the model starts empty,
    and an index reopened from it would fail every check.

    An engine that lives on a memory node (registry persistence
    ``ON_MEMORY_NODE``) runs standalone on a memory node the soak starts,
    through ``compute_nodes`` compute nodes (default 1); the memory node is
    stopped and what the soak put in ``workdir`` removed at the end, also
    when the soak fails. ``compute_nodes`` for any other engine, or through
    the server, is :class:`BadSoakArguments`."""
    data = workdir / "data"
    if data.exists() and any(data.iterdir()):
        raise UsedWorkdir(f"{data} already holds data (an earlier soak's?); give the soak an empty --workdir")
    remote = on_memory_node(engine)
    if compute_nodes is not None:
        if not remote:
            raise BadSoakArguments(f"--compute-nodes is for an engine that lives on a memory node (persistence "
                                   f"{ON_MEMORY_NODE!r}); {engine}'s is {engine_desc(engine)['persistence']!r}")
        if mode == "server":
            raise BadSoakArguments("--compute-nodes runs the engine standalone, not through the server")
        if compute_nodes < 1:
            raise BadSoakArguments(f"--compute-nodes takes N >= 1, got {compute_nodes}")
        mode = "standalone"
    params = dict(params or {})
    if spaces and mode == "standalone":
        raise BadSoakArguments("--spaces is a database collection's: not with --standalone or --compute-nodes")
    if not (remote and mode == "standalone"):
        return _soak(engine, minutes, mode, workdir, points, writers, readers, seed, maintain_every, params,
                     progress, settle_max, quiet_every, None, 0, spaces)
    for k in ("memnode", "region", "writer"):
        if k in params:
            raise BadSoakArguments(f"--param {k} is the soak's own on a memory node")
    created = not workdir.exists()
    mem = _MemoryNodes(data, workdir, memnode_size(points, memnode_size_))
    try:
        return _soak(engine, minutes, mode, workdir, points, writers, readers, seed, maintain_every, params,
                     progress, settle_max, quiet_every, mem, compute_nodes or 1)
    finally:
        mem.stop_all()
        # What the soak put in the work dir: the backing file (a region as
        # large as the run made it), the nodes' logs, the latency files.
        import shutil

        if created:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            shutil.rmtree(data, ignore_errors=True)
            for f in [mem.log(i) for i in range(len(mem.started))] + [
                    workdir / n for n in ("lat-write.f64", "lat-search.f64", "maint.f64")]:
                try:
                    f.unlink()
                except OSError:
                    pass


def _soak(engine: str, minutes: float, mode: str, workdir: Path, points: int, writers: int, readers: int,
          seed: int, maintain_every: float, params: dict, progress: bool, settle_max: Optional[float],
          quiet_every: float, mem: Optional[_MemoryNodes], n_nodes: int, spaces: bool = False) -> dict:
    """``run``'s soak; ``mem`` the memory node (not started yet) of an
    engine that lives on one, worked through ``n_nodes`` compute nodes."""
    from .kill import _Server

    data = workdir / "data"
    vecs, queries = _rows()
    workdir.mkdir(parents=True, exist_ok=True)
    server = None
    url = None
    if mem is not None:
        mem.start()
    if mode == "server":
        server = _Server(data, dim=DIM)
        server.start()
        url = server.url
    cmd = [sys.executable, "-m", "vectide.torture", "soak-driver", "--mode", mode, "--engine", engine,
           "--dir", str(data), "--data-dir", str(data), "--work", str(workdir), "--points", str(points),
           "--writers", str(writers), "--readers", str(readers), "--seed", str(seed),
           "--maintain-every", str(maintain_every), "--quiet-every", str(quiet_every),
           "--params", json.dumps(params)]
    if settle_max is not None:
        cmd += ["--settle-max", str(settle_max)]
    if spaces:
        cmd += ["--spaces"]
    if server:
        cmd += ["--url", url, "--holder-pid", str(server.proc.pid)]
    if mem is not None:
        cmd += ["--memnode", mem.address, "--compute-nodes", str(n_nodes), "--holder-pid", str(mem.pid)]
    oracle = Oracle(id_space(points))
    rows0 = initial_rows(points, seed, len(vecs))
    for i, r in enumerate(rows0):
        oracle.expected[i] = (int(r), int(r)) if mode != "standalone" else (int(r), None)
    samples: List[dict] = []
    violations: List[str] = []
    errors: List[str] = []
    n_violations = 0
    ready = threading.Event()
    # Set before the kill: what fails after it is the kill's doing.
    killed = threading.Event()
    loaded: Dict[str, float] = {}
    # The driver checks exact answers with numpy (one matrix-vector product
    # per exact search): OpenBLAS's own threads spin between those calls and
    # took 44 % of the driver's CPU in a perf profile, away from the engine.
    env = dict(os.environ)
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env.setdefault(var, "1")
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            bufsize=1, env=env)
    settled: Dict[str, dict] = {}
    after_settle = [0]
    settled_seen = threading.Event()
    stderr_tail: List[str] = []

    def drain_stderr() -> None:
        for line in proc.stderr:
            stderr_tail.append(line)
            del stderr_tail[:-200]

    def read_lines() -> None:
        nonlocal n_violations
        for line in proc.stdout:
            if not line.endswith("\n"):
                break
            tag, _, rest = line.rstrip("\n").partition(" ")
            if tag == "B":
                op, id_, kind, s = rest.split()
                s = int(s)
                oracle.begin(int(op), int(id_), kind, s)
                if settled_seen.is_set():
                    after_settle[0] += 1
            elif tag == "A":
                oracle.ack(int(rest))
            elif tag == "Q":
                settled["sample"] = json.loads(rest)
                settled_seen.set()
            elif tag == "S":
                samples.append(json.loads(rest))
                if progress and len(samples) % 15 == 0:
                    x = samples[-1]
                    print(f"  soak {engine} ({mode}) t={x['t']:.0f}s live={x['live']} "
                          f"disk/live={x['disk_bytes'] / max(1, x['live'] * DIM * 4):.2f} "
                          f"rss={x['rss'] / 2**20:.0f} MiB writes={x['upsert_new'] + x['reupsert'] + x['delete'] + x['payload']} "
                          f"searches={x['searches'] + x['exact_searches']} wrong={n_violations}", flush=True)
            elif killed.is_set() and (tag == "E" or rest.startswith("search failed")):
                pass  # a call the kill of the server cut
            elif tag == "V":
                n_violations += 1
                if len(violations) < 50:
                    violations.append(rest)
            elif tag == "E":
                errors.append(rest)
            elif tag == "L":
                loaded["seconds"] = float(rest)
            elif tag == "R":
                loaded["jobs_before_churn"] = int(rest or 0)
                ready.set()

    threads = [threading.Thread(target=read_lines, daemon=True), threading.Thread(target=drain_stderr, daemon=True)]
    for th in threads:
        th.start()
    report: Dict[str, object] = {"engine": engine, "mode": mode, "minutes": minutes, "points": points,
                                 "writers": writers, "readers": readers, "params": params,
                                 "compute_nodes": n_nodes if mem is not None else None,
                                 "maintain_every_s": maintain_every, "quiet_every_s": quiet_every,
                                 "quiet_window_s": min(QUIET_WINDOW_S, quiet_every / 3)}
    try:
        deadline = time.monotonic() + 3600
        while not ready.wait(1.0):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the soak driver did not start: {''.join(stderr_tail)[-3000:]}")
        if progress:
            print(f"  soak {engine} ({mode}): {points} points loaded in {loaded.get('seconds', 0):.1f} s; "
                  f"churning for {minutes} min", flush=True)
        t_end = time.monotonic() + minutes * 60.0
        while time.monotonic() < t_end and proc.poll() is None:
            time.sleep(min(0.5, max(0.0, t_end - time.monotonic())))
        # The settled sample: the writers park until the jobs end (the
        # driver's ``settle``), then resume.
        if progress:
            print(f"  soak {engine} ({mode}): settling (writers parked until no job has run for a second)", flush=True)
        try:
            proc.stdin.write("Q\n")
            proc.stdin.flush()
        except OSError:
            pass
        give_up = time.monotonic() + PARK_S + max(SETTLE_S, settle_max or 0.0) + 60.0
        while not settled_seen.wait(0.5):
            if proc.poll() is not None or time.monotonic() > give_up:
                errors.append("the driver did not report a settled sample")
                break
        # A random moment inside the 1-3 s after the writers resumed, mid-stream.
        time.sleep(random.Random(seed).uniform(1.0, 3.0))
        if mem is not None and not mem.alive():
            errors.append(f"the memory node exited before the kill: {mem.log_tail()}")
        killed.set()
        if server:
            server.kill()
        if mem is not None:
            mem.kill()  # the holder of the data, mid-stream
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        threads[0].join()
        err = "".join(stderr_tail)
        if "panicked" in err or "Traceback" in err:
            errors.append(f"the driver failed before the kill: {err[-2000:]}")
        oracle.crashed()
        acked = oracle.acked
        if server:
            report["restart_s"] = server.start()
        remote: Optional[dict] = None
        space_problems: List[str] = []
        if mem is not None:
            # Restarted on the same backing file (a new address).
            report["restart_s"] = mem.start()
            qs = settled.get("sample") or {}
            at_settle = [r["durable_seq"] for r in qs["compute_nodes"]] if qs.get("compute_nodes") else None
            found, opened, remote = _final_state_memnode(mem.address, engine, params, oracle, vecs, queries,
                                                         n_nodes, at_settle)
        else:
            found, opened = _final_state(mode, str(data), url, engine, params, oracle, vecs, space_problems)
        lost = oracle.check(found, DIM)
        lost += space_problems
    finally:
        if proc.poll() is None:
            proc.kill()
        if server:
            server.kill()
        if mem is not None:
            mem.kill()
    w = _read_f64(workdir / "lat-write.f64", 2)
    s = _read_f64(workdir / "lat-search.f64", 3)
    polls = _read_f64(workdir / "maint.f64", 3)
    writes = split_latencies(w[:, 0], w[:, 1], polls)
    searches = split_latencies(s[:, 0], s[:, 1], polls)
    # The samples under load: those before the settle began (the few taken
    # while the writers were parked, or after they resumed, are not).
    q = settled.get("sample")
    all_samples = samples
    if q is not None:
        began = q["t"] - q["settle_s"]
        samples = [x for x in samples if x["t"] < began]
    rss = [float(x["rss"]) for x in samples]
    ratio = [disk_over_live(x) for x in samples]
    first_done = first_job_done(samples, int(loaded.get("jobs_before_churn", 0)))
    warm = next((i for i, x in enumerate(samples) if x["t"] >= min(60.0, 0.2 * minutes * 60.0)), None)
    last = samples[-1] if samples else {}
    end_ratio = disk_over_live(q) if q is not None else (ratio[-1] if ratio else None)
    ref = None if first_done is None else ratio[first_done]
    total_writes = sum(last.get(k, 0) for k in WRITE_KINDS)
    mw, iw = writes["maintenance"], writes["idle"]
    on_node = _memnode_figures(remote, q, last, errors) if mem is not None else {}
    summary = {
        "wrong_answers": n_violations,
        "acked_writes_lost": len(lost),
        "errors": len(errors),
        # The settled sample (writers parked, no job running) over the
        # reference (the first sample between jobs once the churn's first
        # one ended); the last sample under load beside it.
        "disk_over_live_growth": None if ref is None or end_ratio is None else round(end_ratio / ref, 4),
        "disk_over_live_growth_under_load": None if ref is None or not ratio else round(ratio[-1] / ref, 4),
        "disk_over_live_first": None if ref is None else round(ref, 3),
        "disk_over_live_last": None if end_ratio is None else round(end_ratio, 3),
        "disk_over_live_last_under_load": round(ratio[-1], 3) if ratio else None,
        "settled": None if q is None else bool(q["settled"]),
        "settle_s": None if q is None else q["settle_s"],
        "writes_begun_after_settle": after_settle[0],
        "disk_over_live_envelope_growth": envelope_growth(ratio, first_done),
        # Where the bytes are (over live vector bytes), to explain the level.
        "disk_parts_over_live_first": None if first_done is None else parts_over_live(samples[first_done]),
        "disk_parts_over_live_last": parts_over_live(last) if samples else None,
        "disk_parts_over_live_settled": None if q is None else parts_over_live(q),
        "rss_growth": None if warm is None else round(last["rss"] / max(1, samples[warm]["rss"]), 4),
        # The same trend on the peaks: a merge or rebuild holds its working
        # memory while it runs, so one sample lands high or low on the teeth
        # depending on the phase (the last 20 % of samples' highest over the
        # first 20 %'s from warm-up on).
        "rss_envelope_growth": envelope_growth(rss, warm),
        # The settled sample's RSS over the warm one (a merge's working
        # memory freed, and no write in flight).
        "rss_settled_growth": None if warm is None or q is None
        else round(q["rss"] / max(1, samples[warm]["rss"]), 4),
        "rss_floor_growth": floor_growth(rss, warm),
        # The anonymous part alone (heap, stacks): mapped files come and go
        # with the page cache's reclaim, not with the process's own growth.
        "rss_anon_growth": _growth(samples, warm, "rss_anon"),
        # Of the last sample's anonymous bytes, those in transparent huge
        # pages: the in-memory graphs' arrays (`HugeArray`) ask for them,
        # the product's allocator does not (`vectide_core::trim`).
        "rss_anon_huge_last": last.get("rss_anon_huge"),
        # What the engine itself reports over the same samples: RSS growth
        # that it does not share lies outside its structures (the
        # allocator, the driver).
        "engine_memory_growth": None if warm is None or not last.get("engine_memory")
        or not samples[warm].get("engine_memory")
        else round(last["engine_memory"] / samples[warm]["engine_memory"], 4),
        # The holder's C heap (embedded only): what is allocated, and what
        # the allocator keeps free, at the last sample over the warm one.
        "heap_in_use_growth": _growth(samples, warm, "heap_in_use"),
        "heap_free_growth": _growth(samples, warm, "heap_free"),
        "write_p999_maintenance_over_idle": None if not (mw and iw) else round(mw["p999_ms"] / iw["p999_ms"], 3),
        "writes": total_writes,
        "churn_over_live": round((last.get("upsert_new", 0) + last.get("reupsert", 0) + last.get("delete", 0))
                                 / max(1, points), 3),
        "writes_per_s": round(total_writes / max(1e-9, last.get("t", 0)), 1) if samples else 0,
        "searches": last.get("searches", 0) + last.get("exact_searches", 0),
        "exact_searches": last.get("exact_searches", 0),
        "maintenance_jobs": last.get("maintenance_started", 0),
        "acknowledged_ops_checked": acked,
        "reopen_s": round(opened, 4),
        "load_s": loaded.get("seconds"),
        "jobs_before_churn": loaded.get("jobs_before_churn"),
        "disk_reference_t": None if first_done is None else samples[first_done]["t"],
        **on_node,
    }
    report.update({
        "summary": summary,
        "write_latency": writes,
        "slowest_writes": slowest(w[:, 0], w[:, 1], all_samples),
        "search_latency": searches,
        "samples": all_samples,
        "settled_sample": q,
        "wrong_answer_examples": violations,
        "lost_examples": lost[:50],
        "error_examples": errors[:50],
    })
    return report


def add_arguments(p) -> None:
    p.add_argument("--engine", required=True, help="an engine from the registry")
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--server", action="store_true", help="through `vectide serve` and the HTTP client")
    p.add_argument("--standalone", action="store_true", help="the engine alone, on its own log (durable engines)")
    p.add_argument("--points", type=int, default=100_000, help="live points (GloVe-50 rows)")
    p.add_argument("--writers", type=int, default=4)
    p.add_argument("--readers", type=int, default=2)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--maintain-every", type=float, default=0.0,
                   help="also call maintain() every this many seconds (0: the engine's own schedule only)")
    p.add_argument("--quiet-every", type=float, default=QUIET_EVERY_S, metavar="SECONDS",
                   help="standalone, hold the engine's background jobs (if it has any to hold) for "
                        f"{QUIET_WINDOW_S:.0f} s (at most a third) in every this many seconds, so that "
                        "idle writes exist (0: never)")
    p.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                   help="an engine parameter (repeatable)")
    p.add_argument("--settle-max", type=float, default=None, metavar="SECONDS",
                   help="how long the settle before the kill may wait for the jobs to end (default "
                        f"{SETTLE_S:.0f} s)")
    p.add_argument("--compute-nodes", type=int, default=None, metavar="N",
                   help="an engine that lives on a memory node (registry persistence "
                        f"{ON_MEMORY_NODE!r}): the soak starts a memory node (loopback, backing file in the "
                        "work dir) and N >= 1 compute nodes attached to one region, writer w writing through "
                        "node w %% N and reader r reading through node r %% N; at the end the memory node is "
                        "SIGKILLed mid-stream and restarted on its backing file (implies --standalone; "
                        "default 1 for such an engine standalone)")
    p.add_argument("--memnode-size", default=None, metavar="BYTES",
                   help="the memory node's --size (suffixes K, M, G; default max(1G, 16K per point))")
    p.add_argument("--spaces", action="store_true",
                   help="a collection of several vector spaces: the engine's, a second on flat and a sparse one "
                        "(every point in all three, checked against each other at the end)")
    p.add_argument("--out", dest="soak_out", type=Path, help="write the JSON report here")


def add_driver_arguments(p) -> None:
    for a in ("--mode", "--engine", "--dir", "--data-dir", "--work", "--params"):
        p.add_argument(a, required=True)
    p.add_argument("--url")
    p.add_argument("--holder-pid", type=int, default=0)
    p.add_argument("--memnode", default=None, help="the memory node's HOST:PORT (an engine on a memory node)")
    p.add_argument("--compute-nodes", type=int, default=0)
    p.add_argument("--spaces", action="store_true")
    for a, d in (("--points", 100_000), ("--writers", 4), ("--readers", 2), ("--seed", 1)):
        p.add_argument(a, type=int, default=d)
    p.add_argument("--maintain-every", type=float, default=0.0)
    p.add_argument("--quiet-every", type=float, default=QUIET_EVERY_S)
    p.add_argument("--settle-max", type=float, default=None)


def parse_params(items: List[str]) -> Dict[str, object]:
    out: Dict[str, object] = {}
    for it in items:
        k, sep, v = it.partition("=")
        if not sep or not k:
            raise ValueError(f"--param takes NAME=VALUE, got {it!r}")
        try:
            out[k] = json.loads(v)
        except ValueError:
            out[k] = v
    return out
