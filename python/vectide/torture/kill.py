"""SIGKILL torture: writers under load, killed at random, checked exactly.

Targets: ``server`` (``vectide serve``, writers over HTTP in this process),
``db`` (the embedded database in a child process) and the durable engines
opened directly in a child process: ``p-hnsw:pmem``, ``p-hnsw:msync``,
``hnsw-snap``, ``hnsw-wal``, ``fresh-diskann``, ``spfresh``,
``spann-inplace``. A child prints ``B writer id kind seed`` before
each operation and ``A writer`` after it returned; the parent reads the
lines, kills the child at a random moment, reopens the data itself and
checks every id against the acknowledged history (see ``oracle``).
"""

from __future__ import annotations

import gc
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np

from .oracle import DELETE, SET_PAYLOAD, UPSERT, Oracle, identify, payload, vector
from .targets import collection_kwargs, durable_at_flush, open_kwargs


def is_db(target: str) -> bool:
    """``db``, ``db:ENGINE`` or ``db-spaces:ENGINE``: a database collection,
    not an engine alone."""
    return target == "db" or target.startswith(("db:", "db-spaces:"))


def has_spaces(target: str) -> bool:
    """``db-spaces:ENGINE``: a collection of the engine's space ("main"), a
    second dense one on ``flat`` ("echo": the main vector reversed) and a
    sparse one with IDF ("terms": made from the main vector)."""
    return target.startswith("db-spaces:")


def terms_of(v) -> dict:
    """The sparse vector a ``db-spaces`` point carries beside ``v``."""
    a, b = (int(abs(float(x)) * 1000) % 50 for x in v[:2])
    return {"indices": [a, 50 + b], "values": [1.0 + a / 50, 0.5]}

DIM = 8
GRAPH = {"m": 8, "ef_construction": 32}
# Targets and their parameters come from the registry (targets.py): small
# graphs, fresh-diskann's frequent freezes and background merges, the
# SPANN family's postings of at most 8 records (splits, merges and
# reassigns in the background) and a snapshot every 64 rows.


def _cli() -> str:
    beside = Path(sys.executable).parent / "vectide"
    return str(beside) if beside.exists() else "vectide"


# ---------------------------------------------------------------- the child

def _open_engine(target: str, path: str):
    import vectide

    engine = target.partition(":")[0]
    return vectide.Index(dim=DIM, metric="l2", engine=engine, path=path, **open_kwargs(target))


def _db_engine(target: str) -> str:
    """The engine of a database target: ``db`` (the default engine) or
    ``db:ENGINE``."""
    import vectide

    return target.partition(":")[2] or vectide.DEFAULT_ENGINE


def _open_collection(db, target: str):
    try:
        return db.get_collection("t")
    except KeyError:
        engine = _db_engine(target)
        if has_spaces(target):
            return db.create_collection(
                "t",
                vectors={"main": {"dim": DIM, "metric": "l2", "engine": engine, "params": collection_kwargs(engine)},
                         "echo": {"dim": DIM, "metric": "l2", "engine": "flat"}},
                sparse_vectors={"terms": {"modifier": "idf"}},
            )
        return db.create_collection("t", dim=DIM, metric="l2", engine=engine, **collection_kwargs(engine))


def child(target: str, path: str, seed: int, writers: int, n_ids: int) -> None:
    """Runs writers forever (until killed), printing B/A lines."""
    out_lock = threading.Lock()

    def say(line: str) -> None:
        with out_lock:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()

    if is_db(target):
        import vectide

        db = vectide.connect(path)
        col = _open_collection(db, target)
        kinds = [UPSERT] * 5 + [DELETE] * 2 + [SET_PAYLOAD] * 2

        spaces = has_spaces(target)

        def op(kind, id_, s):
            if kind == UPSERT and spaces:
                v = vector(s, DIM)
                col.upsert_points([{"id": id_, "vector": {"main": v, "echo": v[::-1], "terms": terms_of(v)},
                                    "payload": payload(s)}])
            elif kind == UPSERT:
                col.upsert([id_], vector(s, DIM)[None, :], payloads=[payload(s)])
            elif kind == DELETE:
                col.delete([id_])
            else:
                col.set_payload(payload(s), ids=[id_])
    else:
        idx = _open_engine(target, path)
        flush = durable_at_flush(target)  # a flush acknowledges
        kinds = [UPSERT] * 5 + [DELETE] * 2

        def op(kind, id_, s):
            if kind == UPSERT:
                idx.add(np.array([id_], dtype=np.uint64), vector(s, DIM)[None, :])
            else:
                idx.delete(np.array([id_], dtype=np.uint64))
            if flush:
                idx.flush()

    locks = [threading.Lock() for _ in range(n_ids)]
    say("R")

    def writer(w: int) -> None:
        rng = random.Random(seed * 1000 + w)
        while True:
            id_ = rng.randrange(n_ids)
            kind = rng.choice(kinds)
            s = rng.randrange(1, 2**31)
            with locks[id_]:
                say(f"B {w} {id_} {kind} {s}")
                op(kind, id_, s)
                say(f"A {w}")

    threads = [threading.Thread(target=writer, args=(w,), daemon=True) for w in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


# ---------------------------------------------------------------- reading back

def _read_engine(target: str, path: str, oracle: Oracle) -> Dict[int, object]:
    idx = _open_engine(target, path)
    found = {}
    for id_, want in oracle.expected.items():
        cands = oracle.uncertain.get(id_, [want])
        if id_ in idx:
            v = idx.get(np.array([id_], dtype=np.uint64))[0]
            found[id_] = identify(v, None, cands, DIM)
        else:
            found[id_] = None
    problems = idx.check() if target.startswith("p-hnsw") else []
    del idx
    gc.collect()
    if problems:
        found["__structure__"] = problems
    return found


def _read_points(get, oracle: Oracle) -> Dict[int, object]:
    ids = list(oracle.expected)
    found = {}
    for lo in range(0, len(ids), 256):
        chunk = ids[lo : lo + 256]
        for id_, rec in zip(chunk, get(chunk)):
            want = oracle.expected[id_]
            cands = oracle.uncertain.get(id_, [want])
            found[id_] = None if rec is None else identify(rec[0], rec[1], cands, DIM)
    return found


def _db_get(col, problems: List[str]):
    """Points as (vector, payload); a ``db-spaces`` point's main vector,
    with its other two checked against it (a mismatch is a problem)."""
    def get(ids):
        out = []
        for id_, r in zip(ids, col._c.get(list(ids), True)):
            if r is None:
                out.append(None)
            elif isinstance(r[2], dict):
                named = r[2]
                main = named.get("main")
                if main is None or set(named) != {"main", "echo", "terms"}:
                    problems.append(f"id {id_}: vectors {sorted(named)} (all three were written together)")
                    out.append((None if main is None else main.tolist(), r[1]))
                    continue
                want = terms_of(main)
                same_terms = named["terms"]["indices"] == want["indices"] and np.array_equal(
                    np.float32(named["terms"]["values"]), np.float32(want["values"]))
                if named["echo"].tolist() != main[::-1].tolist() or not same_terms:
                    problems.append(f"id {id_}: its echo or terms vector is not the one written with its main vector")
                out.append((main.tolist(), r[1]))
            else:
                out.append((r[2].tolist(), r[1]))
        return out

    return get


# ---------------------------------------------------------------- rounds

def _round_times(quick: bool, rng: random.Random) -> float:
    return rng.uniform(0.1, 0.6) if quick else rng.uniform(0.2, 2.0)


# A round's kill comes a drawn time after its first acknowledged write, so
# that every round checks acknowledged writes whatever the machine's speed
# (before, a round on a loaded machine could end before any write did).
FIRST_ACK_TIMEOUT_S = 120.0


def _wait_first_ack(acked, what: str) -> None:
    """Waits for ``acked()`` (polled) up to :data:`FIRST_ACK_TIMEOUT_S`."""
    deadline = time.monotonic() + FIRST_ACK_TIMEOUT_S
    while not acked():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: no write was acknowledged within {FIRST_ACK_TIMEOUT_S:.0f} s")
        time.sleep(0.002)


def run_child_target(target: str, rounds: int, writers: int, n_ids: int, quick: bool, seed: int, workdir: Path) -> dict:
    rng = random.Random(seed)
    path = str(workdir / target.replace(":", "-"))
    if target.startswith("p-hnsw:pmem") and Path("/dev/shm").is_dir():
        path = tempfile.mkdtemp(prefix="vectide-torture-", dir="/dev/shm") + "/idx"
    oracle = Oracle(n_ids)
    violations: List[str] = []
    opens = []
    acked_per_round = []
    try:
        for r in range(rounds):
            proc = subprocess.Popen(
                [sys.executable, "-m", "vectide.torture", "child", "--target", target, "--dir", path,
                 "--seed", str(seed * 100 + r), "--writers", str(writers), "--ids", str(n_ids)],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1,
            )
            ready = threading.Event()
            before = oracle.acked

            def reader():
                for line in proc.stdout:
                    if not line.endswith("\n"):
                        break
                    parts = line.split()
                    if parts[0] == "R":
                        ready.set()
                    elif parts[0] == "B":
                        oracle.begin(int(parts[1]), int(parts[2]), parts[3], int(parts[4]))
                    elif parts[0] == "A":
                        oracle.ack(int(parts[1]))

            t = threading.Thread(target=reader, daemon=True)
            t.start()
            if not ready.wait(120):
                proc.kill()
                raise RuntimeError(f"{target}: the child did not start: {proc.stderr.read()}")
            try:
                _wait_first_ack(lambda: oracle.acked > before or proc.poll() is not None, f"{target} round {r}")
            except RuntimeError:
                proc.kill()
                raise
            time.sleep(_round_times(quick, rng))
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            t.join()
            err = proc.stderr.read()
            if "panicked" in err or "Traceback" in err:
                violations.append(f"round {r}: the child failed before the kill: {err[-2000:]}")
            oracle.crashed()
            acked_per_round.append(oracle.acked - before)
            t0 = time.perf_counter()
            if is_db(target):
                import vectide

                db = vectide.connect(path)
                opens.append(time.perf_counter() - t0)
                problems: List[str] = []
                try:
                    col = db.get_collection("t")
                    found = _read_points(_db_get(col, problems), oracle)
                except KeyError:
                    found = {i: None for i in oracle.expected}
                db.close()
                if problems:
                    found["__structure__"] = problems
            else:
                found = _read_engine(target, path, oracle)
                opens.append(time.perf_counter() - t0)
            structure = found.pop("__structure__", None)
            if structure:
                violations.append(f"round {r}: structural check: {structure[:5]}")
            bad = oracle.check(found, DIM)
            violations += [f"round {r}: {b}" for b in bad]
    finally:
        if "/dev/shm/" in path:
            shutil.rmtree(str(Path(path).parent), ignore_errors=True)
    return _report(target, rounds, writers, n_ids, oracle, acked_per_round, violations, open_s=_stats(opens))


def _report(target, rounds, writers, n_ids, oracle, acked_per_round, violations, **extra) -> dict:
    return {
        "target": target,
        "rounds": rounds,
        "writers": writers,
        "ids": n_ids,
        "acknowledged_ops_checked": oracle.acked,
        "acked_per_round": acked_per_round,
        "violations": len(violations),
        "violation_examples": violations[:20],
        **extra,
    }


def _stats(xs: List[float]) -> dict:
    if not xs:
        return {}
    s = sorted(xs)
    return {"min": s[0], "median": s[len(s) // 2], "max": s[-1]}


# ---------------------------------------------------------------- the server

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Server:
    def __init__(self, data: Path, dim: int = DIM) -> None:
        self.data = data
        self.dim = dim
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: Optional[subprocess.Popen] = None

    def start(self) -> float:
        """Starts the server; returns the seconds until it answered a query
        (or its health check, before the collection exists)."""
        t0 = time.perf_counter()
        self.proc = subprocess.Popen([_cli(), "serve", "--data", str(self.data), "--port", str(self.port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.time() + 300
        body = json.dumps({"vector": [0.0] * (self.dim - 1) + [1.0], "limit": 1}).encode()
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.proc.stderr.read().decode()[-2000:]}")
            try:
                req = urllib.request.Request(self.url + "/collections/t/points/search", data=body, method="POST",
                                             headers={"content-type": "application/json"})
                with urllib.request.urlopen(req, timeout=5) as r:
                    if r.status == 200:
                        return time.perf_counter() - t0
            except urllib.error.HTTPError as e:
                if e.code == 404:
                    return time.perf_counter() - t0
            except OSError:
                pass
            time.sleep(0.01)
        raise RuntimeError("server did not start")

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()


def run_server(rounds: int, writers: int, n_ids: int, quick: bool, seed: int, workdir: Path) -> dict:
    import vectide

    rng = random.Random(seed)
    server = _Server(workdir / "server-db")
    oracle = Oracle(n_ids)
    violations: List[str] = []
    restarts: List[float] = []
    opened: List[dict] = []
    acked_per_round = []
    locks = [threading.Lock() for _ in range(n_ids)]
    try:
        server.start()
        client = vectide.Client(server.url, timeout=30)
        if "t" not in client.list_collections():
            client.create_collection("t", dim=DIM, metric="l2", engine="hnsw", **GRAPH)
        for r in range(rounds):
            stop = threading.Event()
            before = oracle.acked

            def writer(w: int) -> None:
                c = vectide.Client(server.url, timeout=30)
                col = c.get_collection("t")
                wr = random.Random(seed * 7919 + r * 31 + w)
                kinds = [UPSERT] * 5 + [DELETE] * 2 + [SET_PAYLOAD] * 2
                while not stop.is_set():
                    id_ = wr.randrange(n_ids)
                    kind = wr.choice(kinds)
                    s = wr.randrange(1, 2**31)
                    with locks[id_]:
                        oracle.begin(w, id_, kind, s)
                        try:
                            if kind == UPSERT:
                                col.upsert([id_], vector(s, DIM)[None, :], payloads=[payload(s)])
                            elif kind == DELETE:
                                col._c._call("POST", col._path("/points/delete?wait=true"), {"points": [id_]})
                            else:
                                col.set_payload(payload(s), ids=[id_])
                        except Exception:
                            return  # the server died: the operation stays in flight
                        oracle.ack(w)

            threads = [threading.Thread(target=writer, args=(w,), daemon=True) for w in range(writers)]
            for t in threads:
                t.start()
            try:
                _wait_first_ack(lambda: oracle.acked > before, f"server round {r}")
            except RuntimeError:
                server.kill()
                raise
            time.sleep(_round_times(quick, rng))
            server.kill()
            stop.set()
            for t in threads:
                t.join(60)
            oracle.crashed()
            acked_per_round.append(oracle.acked - before)
            restarts.append(server.start())
            col = vectide.Client(server.url, timeout=60).get_collection("t")
            v = col.info().get("vectide", {})
            opened.append({k: v.get(k) for k in ("opened_seconds", "replayed")})

            def get(ids):
                recs = col._c._call("POST", col._path("/points"), {"ids": ids, "with_payload": True, "with_vector": True})
                by = {r["id"]: r for r in recs}
                return [None if i not in by else (by[i]["vector"], by[i].get("payload") or {}) for i in ids]

            bad = oracle.check(_read_points(get, oracle), DIM)
            violations += [f"round {r}: {b}" for b in bad]
    finally:
        server.kill()
    return _report("server", rounds, writers, n_ids, oracle, acked_per_round, violations,
                   restart_s=_stats(restarts), restart_all_s=restarts, collection_open=opened)
