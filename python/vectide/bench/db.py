"""Database benchmark: the commit path, filters, restart and the server.

``python -m vectide.bench db [--dataset glove-6b-50-angular-100k] --out FILE.json``

Method
------
* **Upsert throughput.** Points/s upserting ``--upsert-points`` rows, one point
  per call, from 1 client and from 8 concurrent client threads, into a fresh
  ``hnsw`` collection with ``durability="always"`` and ``"group"``, against the
  engine alone (``vectide.Index.add``, same calls, same threads) in the same
  run. Each configuration runs twice, alternating, best kept. Also batches of
  100 points per call from 1 client (1 engine thread each).
* **Write rates per engine** (``--parts writes``): single-point upserts of
  GloVe rows (ids from a shared counter, each point's row ``X[id % N]``)
  from 1, 4 and 16 client threads for ``--write-seconds`` each, into a fresh
  collection of each of ``--write-engines`` (``p-hnsw`` with
  ``persist="msync"``), ``durability="group"``; median of ``--write-reps``
  runs, the configurations interleaved within each repetition. An engine
  that keeps a redo log of its own (it takes the ``log`` parameter) runs
  twice: with one log (the default) and with both logs
  (``one_log=False``, as before there was one). The summary holds each
  rate's ratio to ``hnsw``'s at the same thread count.
* **Payload upserts** (``--parts payloads``): batches of 100 points, each
  with a JSON payload of about 1 KB (text, tags, numbers, a nested object;
  different per point), from one Python thread into a fresh collection of
  ``--payload-engine`` (1 engine thread): points/s over ``--payload-points``
  points, best of ``--payload-reps`` runs. Run it once per build to compare
  builds (the JSON text path before, Python objects after).
* **Filtered recall@10** at 1 %, 10 % and 50 % selectivity (payload field
  ``pct = i % 100``, filter ``pct < s``) against exact brute force over the
  matching points, with and without an integer payload index.
* **Restart time.** A ``--restart-n``-point ``hnsw`` collection is built,
  checkpointed, then given a WAL tail of 10,000 more upserts; a fresh process
  opens the database and answers one query: the wall time from its start.
* **Server vs in-process search QPS** on the same collection: one query per
  call from the same Python loop, ``vectide.Client`` against ``vectide serve``
  on loopback versus ``Collection.search`` in process; and over HTTP with 100
  queries per request (``/points/query/batch``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np

from .. import datasets
from .ann import _log, machine_info, write_json
from .metrics import recall_at_k


def _cli() -> str:
    beside = Path(sys.executable).parent / "vectide"
    if not beside.exists():
        raise RuntimeError("the vectide CLI is not installed (run make build)")
    return str(beside)


def _rate(fn, X: np.ndarray, clients: int) -> float:
    """Calls ``fn(i, row)`` for every row from ``clients`` threads; rows/s."""
    parts = np.array_split(np.arange(len(X)), clients)

    def work(idx):
        for i in idx:
            fn(int(i), X[i])

    threads = [threading.Thread(target=work, args=(p,)) for p in parts]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return len(X) / (time.perf_counter() - t0)


def upsert_throughput(X: np.ndarray, metric: str, root: Path, args) -> Dict[str, Dict[str, float]]:
    import vectide

    out: Dict[str, Dict[str, float]] = {}
    configs = [("engine", None), ("always", "always"), ("group", "group")]
    for rnd in range(2):
        for name, durability in (configs if rnd == 0 else list(reversed(configs))):
            for clients in (1, 8):
                if durability is None:
                    idx = vectide.Index(X.shape[1], metric, m=args.m, ef_construction=args.ef_construction)
                    rate = _rate(lambda i, v: idx.add([i], v[None, :]), X, clients)
                    del idx
                else:
                    d = root / f"tp-{name}-{clients}-{rnd}"
                    shutil.rmtree(d, ignore_errors=True)
                    db = vectide.connect(d, durability=durability)
                    c = db.create_collection("t", dim=X.shape[1], metric=metric, m=args.m, ef_construction=args.ef_construction)
                    rate = _rate(lambda i, v: c.upsert([i], v[None, :], payloads=[{"i": i}]), X, clients)
                    del c, db
                    shutil.rmtree(d, ignore_errors=True)
                key = f"{clients}_client" + ("s" if clients > 1 else "")
                _log(f"upsert {name} {key}: {rate:.0f} points/s")
                cell = out.setdefault(name, {})
                cell[key] = max(cell.get(key, 0.0), rate)
        # Batches of 100 points per call, 1 client: what a bulk load sees.
        for name, durability in (configs if rnd == 0 else list(reversed(configs))):
            B = 100
            t0 = time.perf_counter()
            if durability is None:
                idx = vectide.Index(X.shape[1], metric, m=args.m, ef_construction=args.ef_construction, threads=1)
                for s in range(0, len(X), B):
                    idx.add(np.arange(s, min(len(X), s + B)), X[s : s + B])
                del idx
            else:
                d = root / f"tpb-{name}-{rnd}"
                shutil.rmtree(d, ignore_errors=True)
                db = vectide.connect(d, durability=durability, threads=1)
                c = db.create_collection("t", dim=X.shape[1], metric=metric, m=args.m, ef_construction=args.ef_construction)
                for s in range(0, len(X), B):
                    e = min(len(X), s + B)
                    c.upsert(list(range(s, e)), X[s:e], payloads=[{"i": i} for i in range(s, e)])
                db.close()
                shutil.rmtree(d, ignore_errors=True)
            rate = len(X) / (time.perf_counter() - t0)
            _log(f"upsert {name} batches of {B}: {rate:.0f} points/s")
            cell = out.setdefault(name, {})
            cell["batch100_1_client"] = max(cell.get("batch100_1_client", 0.0), rate)
    return out


def _timed_upserts(c, X: np.ndarray, clients: int, seconds: float) -> float:
    """Single-point upserts from ``clients`` threads for ``seconds``;
    acknowledged points/s."""
    lock = threading.Lock()
    state = {"next": 0, "done": 0}
    stop = time.perf_counter() + seconds
    n = len(X)

    def work():
        done = 0
        while time.perf_counter() < stop:
            with lock:
                i = state["next"]
                state["next"] = i + 1
            c.upsert([i], X[i % n][None, :])
            done += 1
        with lock:
            state["done"] += done

    threads = [threading.Thread(target=work) for _ in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return state["done"] / (time.perf_counter() - t0)


def _takes_log(engine: str) -> bool:
    import vectide

    desc = next((e for e in vectide.engines() if e["name"] == engine), None)
    if desc is None:
        raise SystemExit(f"unknown engine {engine!r} in --write-engines")
    return any(p["name"] == "log" for p in desc["params"])


def write_rates(X: np.ndarray, metric: str, root: Path, args) -> Dict[str, object]:
    import vectide

    engines = [e for e in args.write_engines.split(",") if e]
    configs = []  # (label, engine, one_log, params)
    for e in engines:
        params = {"persist": "msync"} if e == "p-hnsw" else {}
        configs.append((e, e, True, params))
        if _takes_log(e):
            configs.append((f"{e} (own log too)", e, False, params))
    clients_list = [int(c) for c in args.write_clients.split(",")]
    runs: Dict[str, Dict[str, List[float]]] = {label: {str(c): [] for c in clients_list} for label, *_ in configs}
    for rep in range(args.write_reps):
        order = configs if rep % 2 == 0 else list(reversed(configs))
        for label, engine, one_log, params in order:
            for clients in clients_list:
                d = root / f"writes-{rep}-{clients}"
                shutil.rmtree(d, ignore_errors=True)
                db = vectide.connect(d, durability="group", one_log=one_log)
                c = db.create_collection("w", dim=X.shape[1], metric=metric, engine=engine, **params)
                rate = _timed_upserts(c, X, clients, args.write_seconds)
                db.close()
                shutil.rmtree(d, ignore_errors=True)
                runs[label][str(clients)].append(rate)
                _log(f"writes rep {rep + 1}/{args.write_reps} {label}, {clients} clients: {rate:.0f} points/s")
    median = {label: {c: float(np.median(v)) for c, v in per.items()} for label, per in runs.items()}
    ratio = {
        label: {c: (median[label][c] / median["hnsw"][c] if "hnsw" in median and median["hnsw"][c] > 0 else None) for c in per}
        for label, per in median.items()
    }
    return {"seconds": args.write_seconds, "reps": args.write_reps, "runs": runs, "median_points_per_s": median, "ratio_to_hnsw": ratio}


_WORDS = ("vector", "database", "stream", "graph", "index", "payload", "merge", "recall",
          "latency", "shard", "embedding", "query", "filter", "segment", "durable", "crash")


def payload_of(i: int) -> dict:
    """A JSON payload of about 1 KB, different per point."""
    w = [_WORDS[(i * 7 + j * 3) % len(_WORDS)] for j in range(120)]
    return {
        "title": " ".join(w[:8]),
        "body": " ".join(w[8:110]),
        "tags": w[110:120],
        "n": i,
        "score": (i % 997) / 997.0,
        "public": i % 3 == 0,
        "meta": {"source": f"doc-{i % 50}", "rev": i % 7, "lang": "en", "pos": [i % 13, i % 17]},
    }


def payload_upserts(X: np.ndarray, metric: str, root: Path, args) -> Dict[str, object]:
    import vectide

    n = min(args.payload_points, len(X))
    B = 100
    payloads = [payload_of(i) for i in range(n)]
    sizes = [len(json.dumps(p)) for p in payloads[:100]]
    runs = []
    for rep in range(args.payload_reps):
        d = root / f"payloads-{rep}"
        shutil.rmtree(d, ignore_errors=True)
        db = vectide.connect(d, threads=1)
        c = db.create_collection("p", dim=X.shape[1], metric=metric, engine=args.payload_engine)
        t0 = time.perf_counter()
        for s in range(0, n, B):
            e = min(n, s + B)
            c.upsert(list(range(s, e)), X[s:e], payloads=payloads[s:e])
        rate = n / (time.perf_counter() - t0)
        db.close()
        shutil.rmtree(d, ignore_errors=True)
        runs.append(rate)
        _log(f"payload upserts rep {rep + 1}/{args.payload_reps} ({args.payload_engine}): {rate:.0f} points/s")
    return {"engine": args.payload_engine, "points": n, "batch": B, "payload_bytes_mean": float(np.mean(sizes)),
            "runs_points_per_s": runs, "best_points_per_s": max(runs)}


def filtered_recall(X: np.ndarray, Q: np.ndarray, metric: str, root: Path, args) -> Dict[str, Dict[str, float]]:
    import vectide

    d = root / "filters"
    shutil.rmtree(d, ignore_errors=True)
    db = vectide.connect(d)
    c = db.create_collection("f", dim=X.shape[1], metric=metric, m=args.m, ef_construction=args.ef_construction)
    n = len(X)
    for s in range(0, n, 10_000):
        e = min(n, s + 10_000)
        c.upsert(list(range(s, e)), X[s:e], payloads=[{"pct": i % 100} for i in range(s, e)])
    Xn = X / np.linalg.norm(X, axis=1, keepdims=True) if metric == "cosine" else X
    Qs = Q[: args.filter_queries]
    pct = np.arange(n) % 100
    out: Dict[str, Dict[str, float]] = {}

    def exact_top10(q: np.ndarray, ids: Optional[np.ndarray] = None) -> np.ndarray:
        Y = Xn if ids is None else Xn[ids]
        if metric == "cosine":
            dist = -(Y @ (q / np.linalg.norm(q)))
        elif metric == "ip":
            dist = -(Y @ q)
        else:
            dist = ((Y - q) ** 2).sum(1)
        top = np.argsort(dist, kind="stable")[:10]
        return top if ids is None else ids[top]

    def recall(found, truth) -> float:
        return recall_at_k([[h.id for h in res] for res in found], np.array(truth), 10)

    # Reference: the same searches without a filter, at the same default ef.
    found = c.search(Qs, k=10, with_payload=False)
    out["unfiltered"] = {"recall": recall(found, [exact_top10(q) for q in Qs])}
    _log(f"unfiltered recall@10 (reference): {out['unfiltered']['recall']:.4f}")
    for indexed in (False, True):
        if indexed:
            c.create_index("pct", "integer")
        for sel in (1, 10, 50):
            ids = np.nonzero(pct < sel)[0]
            t0 = time.perf_counter()
            found = c.search(Qs, k=10, filter={"must": [{"key": "pct", "range": {"lt": sel}}]}, with_payload=False)
            secs = time.perf_counter() - t0
            r = recall(found, [exact_top10(q, ids) for q in Qs])
            key = "indexed" if indexed else "no_index"
            out.setdefault(key, {})[f"{sel}%"] = r
            out.setdefault(key + "_qps", {})[f"{sel}%"] = len(Qs) / secs
            _log(f"filtered recall@10 at {sel}% ({key}): {r:.4f}")
    del c, db
    shutil.rmtree(d, ignore_errors=True)
    return out


PROBE = r"""
import sys, time
t0 = time.perf_counter()
import numpy as np, vectide
db = vectide.connect(sys.argv[1])
c = db.get_collection("r")
c.search(np.ones(int(sys.argv[2]), dtype=np.float32), k=10)
print(time.perf_counter() - t0, c.info()["replayed"], len(c), flush=True)
"""


def restart_time(X_all: np.ndarray, metric: str, root: Path, args) -> Dict[str, float]:
    import vectide

    n = min(args.restart_n, len(X_all) - 10_000)
    d = root / "restart"
    shutil.rmtree(d, ignore_errors=True)
    db = vectide.connect(d)
    c = db.create_collection("r", dim=X_all.shape[1], metric=metric, m=args.m, ef_construction=args.ef_construction)
    for s in range(0, n, 10_000):
        e = min(n, s + 10_000)
        c.upsert(list(range(s, e)), X_all[s:e])
    c.checkpoint()
    for s in range(n, n + 10_000, 1000):
        c.upsert(list(range(s, s + 1000)), X_all[s : s + 1000])
    del c, db
    runs = []
    for _ in range(3):
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, "-c", PROBE, str(d), str(X_all.shape[1])], capture_output=True, text=True, check=True)
        wall = time.perf_counter() - t0
        inner, replayed, live = p.stdout.split()
        runs.append({"wall_s": wall, "open_and_query_s": float(inner), "replayed_records": int(replayed), "points": int(live)})
        _log(f"restart of {live} points: {wall:.2f} s wall ({replayed} WAL records replayed)")
    shutil.rmtree(d, ignore_errors=True)
    runs.sort(key=lambda r: r["wall_s"])
    return {"n": int(n) + 10_000, **runs[1], "runs": runs}


def server_vs_inprocess(X: np.ndarray, Q: np.ndarray, metric: str, root: Path, args) -> Dict[str, float]:
    import vectide

    d = root / "server"
    shutil.rmtree(d, ignore_errors=True)
    db = vectide.connect(d)
    c = db.create_collection("s", dim=X.shape[1], metric=metric, m=args.m, ef_construction=args.ef_construction)
    for s in range(0, len(X), 10_000):
        e = min(len(X), s + 10_000)
        c.upsert(list(range(s, e)), X[s:e])
    db.flush()
    Qs = Q[: args.server_queries]
    best_local = 0.0
    for _ in range(3):
        t0 = time.perf_counter()
        for q in Qs:
            c.search(q, k=10, with_payload=False)
        best_local = max(best_local, len(Qs) / (time.perf_counter() - t0))
    del c, db
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([_cli(), "serve", "--data", str(d), "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(600):
            try:
                urllib.request.urlopen(url + "/healthz", timeout=1)
                break
            except OSError:
                time.sleep(0.05)
        rc = vectide.Client(url).get_collection("s")
        rc.metric  # warm the metric lookup
        best_remote = 0.0
        best_batch = 0.0
        for _ in range(3):
            t0 = time.perf_counter()
            for q in Qs:
                rc.search(q, k=10, with_payload=False)
            best_remote = max(best_remote, len(Qs) / (time.perf_counter() - t0))
            t0 = time.perf_counter()
            for s in range(0, len(Qs), 100):
                rc.search(Qs[s : s + 100], k=10, with_payload=False)
            best_batch = max(best_batch, len(Qs) / (time.perf_counter() - t0))
    finally:
        proc.terminate()
        proc.wait()
        shutil.rmtree(d, ignore_errors=True)
    _log(f"search QPS: in process {best_local:.0f}, over HTTP {best_remote:.0f} (one query per request), {best_batch:.0f} (100 per request)")
    return {"in_process_qps": best_local, "server_qps": best_remote, "ratio": best_remote / best_local,
            "server_batch100_qps": best_batch, "batch100_ratio": best_batch / best_local}


def run(args) -> dict:
    ds = datasets.load(args.dataset)
    metric = ds.metric
    X = np.ascontiguousarray(ds.train, dtype=np.float32)
    Q = np.ascontiguousarray(ds.test, dtype=np.float32)
    root = Path(datasets.data_dir()) / "db-bench"
    root.mkdir(parents=True, exist_ok=True)
    result: Dict[str, object] = {
        "dataset": ds.name,
        "metric": metric,
        "machine": machine_info(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "params": {"m": args.m, "ef_construction": args.ef_construction, "upsert_points": args.upsert_points},
    }
    parts = set(args.parts.split(","))
    known = {"upsert", "writes", "payloads", "filters", "server", "restart"}
    unknown = parts - known
    if unknown:
        raise SystemExit(f"unknown --parts {sorted(unknown)} (known: {', '.join(sorted(known))})")
    try:
        if "upsert" in parts:
            result["upsert_points_per_s"] = upsert_throughput(X[: args.upsert_points], metric, root, args)
        if "writes" in parts:
            result["write_rates"] = write_rates(X, metric, root, args)
        if "payloads" in parts:
            result["payload_upserts"] = payload_upserts(X, metric, root, args)
        if "filters" in parts:
            result["filtered_recall_at_10"] = filtered_recall(X, Q, metric, root, args)
        if "server" in parts:
            result["server_vs_in_process"] = server_vs_inprocess(X, Q, metric, root, args)
        if "restart" in parts and args.restart_n > 0:
            big = datasets.load(args.restart_dataset)
            result["restart"] = restart_time(np.ascontiguousarray(big.train, dtype=np.float32), big.metric, root, args)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    summary: Dict[str, object] = {}
    up = result.get("upsert_points_per_s")
    if up:
        summary["group_vs_always_8_clients"] = up["group"]["8_clients"] / up["always"]["8_clients"]
        summary["group_vs_engine_8_clients"] = up["group"]["8_clients"] / up["engine"]["8_clients"]
        summary["always_vs_engine_1_client"] = up["always"]["1_client"] / up["engine"]["1_client"]
    wr = result.get("write_rates")
    if wr:
        summary["write_points_per_s"] = wr["median_points_per_s"]
        summary["write_ratio_to_hnsw"] = wr["ratio_to_hnsw"]
    if "payload_upserts" in result:
        summary["payload_batch100_points_per_s"] = result["payload_upserts"]["best_points_per_s"]
    fr = result.get("filtered_recall_at_10")
    if fr:
        summary["filtered_recall_min"] = min(v for k, d in fr.items() if k in ("indexed", "no_index") for v in d.values())
        summary["unfiltered_recall"] = fr["unfiltered"]["recall"]
    if "server_vs_in_process" in result:
        summary["server_qps_ratio"] = result["server_vs_in_process"]["ratio"]
        summary["server_batch100_qps_ratio"] = result["server_vs_in_process"]["batch100_ratio"]
    if "restart" in result:
        summary["restart_s"] = result["restart"]["wall_s"]
    result["summary"] = summary
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m vectide.bench db", description=__doc__.split("Method")[0].strip())
    p.add_argument("--dataset", default="glove-6b-50-angular-100k")
    p.add_argument("--restart-dataset", default="glove-6b-50-angular")
    p.add_argument("--restart-n", type=int, default=380_000)
    p.add_argument("--upsert-points", type=int, default=5000)
    p.add_argument("--filter-queries", type=int, default=200)
    p.add_argument("--server-queries", type=int, default=2000)
    p.add_argument("--m", type=int, default=16)
    p.add_argument("--ef-construction", type=int, default=200)
    p.add_argument("--parts", default="upsert,filters,server,restart", help="comma-separated subset of upsert,writes,payloads,filters,server,restart")
    p.add_argument("--payload-engine", default="hnsw", help="engine of --parts payloads")
    p.add_argument("--payload-points", type=int, default=20_000)
    p.add_argument("--payload-reps", type=int, default=3)
    p.add_argument("--write-engines", default="hnsw,p-hnsw,fresh-diskann,spfresh", help="engines of --parts writes")
    p.add_argument("--write-clients", default="1,4,16", help="client thread counts of --parts writes")
    p.add_argument("--write-seconds", type=float, default=30.0)
    p.add_argument("--write-reps", type=int, default=3)
    p.add_argument("--out", metavar="FILE.json")
    args = p.parse_args(argv)
    result = run(args)
    print(json.dumps(result["summary"], indent=2))
    print(json.dumps({k: result[k] for k in ("upsert_points_per_s", "filtered_recall_at_10", "server_vs_in_process") if k in result}, indent=1))
    if "write_rates" in result:
        print("write rates (median points/s):", json.dumps(result["write_rates"]["median_points_per_s"], indent=1))
    if "restart" in result:
        print("restart:", json.dumps({k: v for k, v in result["restart"].items() if k != "runs"}))
    if args.out:
        write_json(result, args.out)
        print(f"wrote {args.out}")
    return 0
