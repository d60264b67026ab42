"""d-HNSW writes from several compute nodes (issue 37's figures), with a
memory node in its own process.

``python -m vectide.bench dhnsw-writes [--dataset glove-6b-50-angular] [--limit 100000]
[--share 0.2] [--batch 100] [--nodes 1,2] [--threads 1] [--queries 1000] [--backing] --out FILE.json``

With ``--backing`` the memory node keeps its regions in a backing file (in
the temporary directory, on the local disk): every acknowledged write is
then FLUSHed (msync) phase by phase, and the figures include that cost.

Per run: the first ``1 - share`` of ``limit`` rows are built into a region
by this process; then ``n`` compute-node processes (each ``vectide.Index``
attached to the region, ``threads`` each) insert the remaining ``share``
between them, in batches of ``batch`` rows, at the same time. Reported per
``n``: insert throughput (rows over the slowest node's wall time), and per
inserted row the round trips, bytes both ways, modelled network time
(3 us + bytes / 100 Gb/s per round trip) and CAS retries (a partition's
state or a label's value another node changed first), the partitions
rebuilt and their mean rebuild time. The nodes attach first, then start at
one moment; rows/s is all rows over the time to the last node's end. Then
recall@10 at b = 5, ef 48 against exact top-10 (numpy) after the inserts,
beside a fresh build of the same rows with the same partitions; and after
deleting ``share`` of all rows (from one node), beside a fresh build of
what remains (same partitions).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

import numpy as np

from .. import datasets
from ..memnode import MemoryNode
from .ann import machine_info, write_json
from .dhnsw import _recall, _truth

_WORKER = r"""
import json, sys, time
import numpy as np
import vectide
addr, region, path, lo, hi, batch, threads = sys.argv[1:8]
lo, hi, batch, threads = int(lo), int(hi), int(batch), int(threads)
start_at = float(sys.argv[9])
x = np.load(path, mmap_mode="r")
ix = vectide.Index(x.shape[1], sys.argv[8], engine="d-hnsw", memnode=addr, region=region, threads=threads)
keys = ("round_trips", "bytes_sent", "bytes_received", "net_model_ns", "cas_retries",
        "partition_rebuilds", "rebuild_ns")
st = ix.stats()
s0 = {k: st[k] for k in keys}
# Every node starts at the same moment (after its attach).
time.sleep(max(0.0, start_at - time.time()))
for s in range(lo, hi, batch):
    e = min(hi, s + batch)
    ix.add(np.arange(s, e, dtype=np.uint64), np.ascontiguousarray(x[s:e]))
end = time.time()
st = ix.stats()
print(json.dumps({"rows": hi - lo, "wall_s": end - start_at, "late_s": max(0.0, time.time() - end),
                  **{k: st[k] - s0[k] for k in keys}}))
"""


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _recall_of(ix, queries: np.ndarray, truth: np.ndarray) -> float:
    ids, _ = ix.search(queries, k=10, nprobe=5, ef=48)
    return _recall(ids, truth, 10)


def run(args) -> Dict[str, object]:
    import vectide

    ds = datasets.load(args.dataset)
    x = np.ascontiguousarray(ds.train[: args.limit], dtype=np.float32)
    queries = np.ascontiguousarray(ds.test[: args.queries], dtype=np.float32)
    n = len(x)
    cut = int(n * (1 - args.share))
    res: Dict[str, object] = {"dataset": args.dataset, "points": n, "built": cut, "inserted": n - cut,
                              "backing": bool(args.backing)}
    work = Path(tempfile.mkdtemp(prefix="vectide-dhnsw-writes-", dir=args.workdir))
    path = work / "x.npy"
    np.save(path, x)
    truth_all = _truth(x, queries, ds.metric)
    runs = {}
    for nodes in args.nodes:
        extra = ["--backing", str(work / f"node-{nodes}.vtb")] if args.backing else []
        with MemoryNode(size=args.node_size, extra=extra) as node:
            region = f"w{nodes}"
            t0 = time.perf_counter()
            ix = vectide.Index(x.shape[1], ds.metric, engine="d-hnsw", memnode=node.address,
                               region=region, threads=args.threads)
            ix.add(np.arange(cut, dtype=np.uint64), x[:cut])
            build_s = time.perf_counter() - t0
            bounds = np.linspace(cut, n, nodes + 1).astype(int)
            # A common start a few seconds ahead: the nodes attach first
            # (each reads the region), then insert at the same time; rows/s
            # is all rows over the time to the last node's end.
            start_at = time.time() + 5.0 + 0.5 * nodes
            procs = [subprocess.Popen(
                [sys.executable, "-c", _WORKER, node.address, region, str(path), str(bounds[i]),
                 str(bounds[i + 1]), str(args.batch), str(args.threads), ds.metric, str(start_at)],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(nodes)]
            outs = [p.communicate() for p in procs]
            for p, (_, err) in zip(procs, outs):
                if p.returncode != 0:
                    raise RuntimeError(f"a compute node failed: {err[-2000:]}")
            per = [json.loads(o) for o, _ in outs]
            rows = sum(r["rows"] for r in per)
            tot = {k: sum(r[k] for r in per) for k in per[0] if k not in ("wall_s", "late_s")}
            rebuilds = tot["partition_rebuilds"]
            r = {
                "nodes": nodes,
                "build_s": build_s,
                "insert_rows_per_s": rows / max(p["wall_s"] for p in per),
                "round_trips_per_insert": tot["round_trips"] / rows,
                "bytes_per_insert": (tot["bytes_sent"] + tot["bytes_received"]) / rows,
                "model_us_per_insert": tot["net_model_ns"] / 1e3 / rows,
                "cas_retries_per_insert": tot["cas_retries"] / rows,
                "partition_rebuilds": rebuilds,
                "rebuild_ms_per_partition": (tot["rebuild_ns"] / 1e6 / rebuilds) if rebuilds else None,
                "per_node": per,
            }
            r["recall10_after_insert"] = _recall_of(ix, queries, truth_all)
            k_used = int(ix.stats()["partitions"])
            r["partitions"] = k_used
            if nodes == args.nodes[0]:
                # Deletes of `share` of all rows (from this node), then recall.
                gone = np.arange(0, n, int(round(1 / args.share)), dtype=np.uint64)
                t0 = time.perf_counter()
                ix.delete(gone)
                r["delete_rows_per_s"] = len(gone) / (time.perf_counter() - t0)
                keep = np.setdiff1d(np.arange(n), gone.astype(np.int64))
                truth_keep = keep[_truth(x[keep], queries, ds.metric)]
                r["recall10_after_delete"] = _recall_of(ix, queries, truth_keep)
                fresh = vectide.Index(x.shape[1], ds.metric, engine="d-hnsw", memnode=node.address,
                                      threads=args.threads, partitions=k_used)
                fresh.add(keep.astype(np.uint64), x[keep])
                r["recall10_fresh_after_delete"] = _recall_of(fresh, queries, truth_keep)
                del fresh
            r["check"] = ix.check()
            _log(f"  {nodes} node(s): {r['insert_rows_per_s']:.0f} rows/s, "
                 f"{r['round_trips_per_insert']:.2f} round trips and {r['cas_retries_per_insert']:.3f} "
                 f"CAS retries per row, recall@10 {r['recall10_after_insert']:.3f}")
            runs[str(nodes)] = r
            del ix
    # The fresh builds have the partitions the inserted index has (the same
    # b probes the same share of the data).
    k_used = next(iter(runs.values()))["partitions"]
    with MemoryNode(size=args.node_size) as node:
        fresh = vectide.Index(x.shape[1], ds.metric, engine="d-hnsw", memnode=node.address,
                              threads=args.threads, partitions=k_used)
        fresh.add(np.arange(n, dtype=np.uint64), x)
        res["recall10_fresh_build"] = _recall_of(fresh, queries, truth_all)
        del fresh
    res["runs"] = runs
    return res


def summary(r: Dict[str, object]) -> Dict[str, object]:
    runs = r["runs"]
    one = runs.get("1") or next(iter(runs.values()))
    two = runs.get("2")
    out = {
        "dataset": r["dataset"],
        "backing": r.get("backing", False),
        "insert_rows_per_s_1_node": one["insert_rows_per_s"],
        "insert_rows_per_s_2_nodes": two["insert_rows_per_s"] if two else None,
        "scaling_2_vs_1_nodes": (two["insert_rows_per_s"] / one["insert_rows_per_s"]) if two else None,
        "cas_retries_per_insert_2_nodes": two["cas_retries_per_insert"] if two else None,
        "round_trips_per_insert": one["round_trips_per_insert"],
        "bytes_per_insert": one["bytes_per_insert"],
        "model_us_per_insert": one["model_us_per_insert"],
        "recall10_after_insert": one["recall10_after_insert"],
        "recall10_fresh_build": r["recall10_fresh_build"],
        "recall10_points_below_fresh_after_insert": 100 * (r["recall10_fresh_build"] - one["recall10_after_insert"]),
        "recall10_after_delete": one.get("recall10_after_delete"),
        "recall10_fresh_after_delete": one.get("recall10_fresh_after_delete"),
        "rebuild_ms_per_partition": one["rebuild_ms_per_partition"],
        "structure_violations": sum(len(x["check"]) for x in runs.values()),
    }
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m vectide.bench dhnsw-writes")
    ap.add_argument("--dataset", default="glove-6b-50-angular")
    ap.add_argument("--limit", type=int, default=100_000)
    ap.add_argument("--share", type=float, default=0.2)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--nodes", default="1,2")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--node-size", type=int, default=4 << 30)
    ap.add_argument("--backing", action="store_true",
                    help="the memory node keeps its regions in a backing file (FLUSHes cost msyncs)")
    ap.add_argument("--workdir", default=None, help="where the temporary files go (default: the temp dir)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    args.nodes = [int(v) for v in args.nodes.split(",")]
    if not 0 < args.share < 1:
        ap.error("--share must be between 0 and 1")
    import vectide

    res = run(args)
    info = machine_info()
    info["simd_isa"] = vectide.simd_isa()
    out = {"benchmark": "dhnsw-writes", "machine": info, "args": vars(args),
           "network_model": {"latency_us": 3.0, "bandwidth_gbps": 100.0},
           # What ran: the command and the commit the extension was built at.
           "command": " ".join(["python", "-m", "vectide.bench", "dhnsw-writes"]
                               + list(sys.argv[2:] if argv is None else argv)),
           "commit": vectide.build_commit(), "summary": summary(res), **res}
    write_json(out, args.out)
    for k, v in out["summary"].items():
        print(f"{k}: {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
