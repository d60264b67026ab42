"""d-HNSW benchmark: the slides' Tables 1-2 (the latency breakdown of a
batch of queries: network, sub-HNSW search, meta-HNSW search) re-made
with a memory node in its own process.

``python -m vectide.bench dhnsw [--datasets glove-6b-50-angular,minilm-debian-docs-384-angular]
[--partitions 160] [--queries 2000] [--naive-queries 200] [--cold-batches 3] [--warm-batches 10]
[--threads 2] [--limit N] [--node-size BYTES] --out FILE.json [--plot DIR]``

Per dataset, ``queries`` queries (the test set, then training rows held out
of the index when the test set is smaller) against the rest of ``train``,
exact top-10 by numpy. The index is built once (``partitions`` K: 160 by
default, the authors' K for SIFT1M, so that b = 5 probes the same share of
the data as theirs and a doorbell chain holds K/10 = 16 READs), saved, and
opened again for each configuration (the open uploads it into a new region
of the same memory node):

* ``naive``: every node a search visits fetched by a READ of its own;
* ``no-doorbell``: each partition one READ, one round trip each;
* ``doorbell``: the batch's partitions in doorbell chains of K/10 READs;

each with the pipeline (fetch overlapping search) on and off (and
``naive-in-process``: the naive traversal again on a memory node inside
the benchmark's process, so its compute is measured without the loopback
transport's CPU per READ; its latency is that compute plus the TCP run's
modelled network, and its ratio to ``doorbell`` is
``latency_speedup_vs_naive_compute_in_process``), **cold**: no
LRU (``cache_partitions=0``), so every partition a batch needs is fetched:
the figures of record. After one unmeasured batch (the process's first
touch of its buffers is start-up, not cache state: on synthetic 384-d data
the first batch's decode took 3-8 times as long as the next ones'),
``cold-batches`` batches are measured (an odd number) and the median (by
modelled latency) reported, each one's latency beside it. ``naive`` runs
``naive-queries`` queries once, after ten unmeasured ones, and is scaled
to the batch (its queries share nothing). Then **warm**: the default
LRU (K/20 sub-HNSWs) over ``warm-batches`` batches, the first excluded.

Per configuration: the batch's latency under the network model (3 us + bytes
/ 100 Gb/s per round trip: meta-HNSW time + modelled network time +
sub-HNSW time, or their overlap with the pipeline) and as measured wall
time on loopback TCP; round trips, work requests and bytes per query;
recall@1 and @10. A sweep of b and efSearch gives recall against both; the
same queries on a local in-memory ``hnsw`` over the whole set (same threads)
give what disaggregation costs (``qps_ratio_vs_local_hnsw_at_recall_0.9``:
d-HNSW's QPS with the default LRU (K/20 sub-HNSWs: it holds a small share
of what a batch needs, so most partitions are fetched every batch) at the
cheapest (b, ef) reaching recall@10 0.9 over the
local index's at the smallest ef reaching it; null when d-HNSW never
reaches 0.9). Recall at b = 5, ef 48 is also measured on an index built
with the engine's default K (``ceil(N / 6,250)``: fewer, larger partitions,
so the same b probes a larger share of the data). The summary's figures are those of the 384-d set when it ran
(GloVe's beside them).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np

from .. import datasets
from ..memnode import MemoryNode
from .ann import machine_info, write_json

TEXT = "minilm-debian-docs-384-angular"
GLOVE = "glove-6b-50-angular"


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _truth(base: np.ndarray, queries: np.ndarray, metric: str, k: int = 10) -> np.ndarray:
    """Exact top-k ids (rows of ``base``) by numpy, in blocks."""
    out = np.empty((len(queries), k), dtype=np.uint64)
    b = base.astype(np.float32)
    if metric == "cosine":
        b = b / np.maximum(np.linalg.norm(b, axis=1, keepdims=True), 1e-30)
    bn = (b * b).sum(1) if metric == "l2" else None
    for s in range(0, len(queries), 256):
        q = queries[s:s + 256].astype(np.float32)
        if metric == "cosine":
            q = q / np.maximum(np.linalg.norm(q, axis=1, keepdims=True), 1e-30)
        d = -(q @ b.T) if metric != "l2" else bn[None, :] - 2 * (q @ b.T)
        part = np.argpartition(d, k, axis=1)[:, :k]
        order = np.take_along_axis(d, part, 1).argsort(1)
        out[s:s + 256] = np.take_along_axis(part, order, 1)
    return out


def _recall(found: np.ndarray, truth: np.ndarray, k: int) -> float:
    hits = sum(len(set(f[:k].tolist()) & set(t[:k].tolist())) for f, t in zip(found, truth))
    return hits / (k * len(truth))


def _stats(ix) -> Dict[str, float]:
    return {k: float(v) for k, v in ix.stats().items() if isinstance(v, (int, float))}


def _delta(after: Dict[str, float], before: Dict[str, float]) -> Dict[str, float]:
    return {k: after[k] - before.get(k, 0.0) for k in after}


def _batch(ix, qs: np.ndarray, truth: np.ndarray, threads: int, pipeline: bool, scale: float = 1.0,
           **knobs) -> Dict[str, object]:
    """One batch: measured, broken down, and modelled."""
    s0 = _stats(ix)
    t0 = time.perf_counter()
    ids, _ = ix.search(qs, k=10, **knobs)
    wall = time.perf_counter() - t0
    d = _delta(_stats(ix), s0)
    nq = len(qs)
    meta_ms = d["meta_ns"] / 1e6
    sub_ms = d["sub_ns"] / 1e6
    net_model_ms = d["net_model_ns"] / 1e6
    net_wall_ms = d["net_wall_ns"] / 1e6
    if d["partitions_fetched"] + d["partitions_cached"] == 0 and d["round_trips"] > 0:
        # naive: the READs run inside the searches, on `threads` threads;
        # compute = the threads' busy time less the time in round trips.
        compute_ms = max(0.0, threads * (wall * 1e3 - meta_ms) - net_wall_ms)
        sub_ms = compute_ms / threads
        net_model_ms_batch = net_model_ms / threads
        model_ms = meta_ms + sub_ms + net_model_ms_batch
        net_model_ms = net_model_ms_batch
    elif pipeline:
        model_ms = meta_ms + max(net_model_ms, sub_ms)
    else:
        model_ms = meta_ms + net_model_ms + sub_ms
    return {
        "queries": nq,
        "scaled_to": int(nq * scale),
        "latency_model_ms": model_ms * scale,
        "latency_wall_ms": wall * 1e3 * scale,
        "network_model_ms": net_model_ms * scale,
        "network_wall_ms": net_wall_ms * scale,
        "sub_hnsw_ms": sub_ms * scale,
        "meta_hnsw_ms": meta_ms * scale,
        "round_trips_per_query": d["round_trips"] / nq,
        "work_requests_per_query": d["work_requests"] / nq,
        "bytes_per_query": (d["bytes_sent"] + d["bytes_received"]) / nq,
        "partitions_fetched": d["partitions_fetched"],
        "partitions_cached": d["partitions_cached"],
        "recall1": _recall(ids, truth, 1),
        "recall10": _recall(ids, truth, 10),
        "qps_wall": nq / wall,
    }


def run_dataset(name: str, args, node: MemoryNode, work: Path) -> Dict[str, object]:
    import vectide

    ds = datasets.load(name)
    train, test = ds.train, ds.test
    if args.limit:
        train = train[: args.limit]
    nq = args.queries
    held = max(0, nq - len(test))
    base = train[: len(train) - held]
    queries = np.ascontiguousarray(np.concatenate([test[: nq], train[len(train) - held:]])[:nq], dtype=np.float32)
    _log(f"{name}: {len(base)} points, {len(queries)} queries ({held} held out of train); exact top-10")
    truth = _truth(base, queries, ds.metric)
    res: Dict[str, object] = {"dataset": name, "points": len(base), "queries": len(queries),
                              "dim": int(base.shape[1]), "metric": ds.metric}
    t0 = time.perf_counter()
    ix = vectide.Index(base.shape[1], ds.metric, engine="d-hnsw", memnode=node.address,
                       partitions=args.partitions, threads=args.threads)
    ix.add(np.arange(len(base), dtype=np.uint64), base)
    res["build_s"] = time.perf_counter() - t0
    st = ix.stats()
    res["region_bytes"] = st.get("region_bytes")
    res["partitions"] = st.get("partitions")
    path = work / f"{name}.dhnsw"
    ix.save(str(path))
    del ix
    _log(f"  built in {res['build_s']:.1f} s, {res['partitions']:.0f} partitions")
    cold: Dict[str, object] = {}
    for mode in ("doorbell", "no-doorbell", "naive"):
        for pipeline in (True, False):
            if mode == "naive" and pipeline:
                continue  # nothing to overlap: the READs are inside the search
            ix = vectide.Index.load(str(path), memnode=node.address, fetch=mode, pipeline=pipeline,
                                    cache_partitions=0, threads=args.threads)
            q, t = (queries, truth)
            scale = 1.0
            reps = max(1, args.cold_batches) | 1  # odd: the median is one batch
            if mode == "naive":
                n = min(args.naive_queries, len(queries))
                q, t, scale = queries[:n], truth[:n], len(queries) / n
                reps = 1  # minutes per batch; its cost is the round trips, not the warm-up
            # One unmeasured batch first (a few queries for naive): the
            # process's first touch of its decode buffers and thread pool
            # is start-up, not the cache state; with no LRU every batch
            # after it is as cold (every partition fetched and decoded).
            warm = slice(10) if mode == "naive" else slice(None)
            _batch(ix, q[warm], t[warm], args.threads, pipeline)
            runs = [_batch(ix, q, t, args.threads, pipeline, scale) for _ in range(reps)]
            r = dict(sorted(runs, key=lambda x: x["latency_model_ms"])[len(runs) // 2])
            r["batches_measured"] = len(runs)
            r["latency_model_ms_each"] = [x["latency_model_ms"] for x in runs]
            r["latency_wall_ms_each"] = [x["latency_wall_ms"] for x in runs]
            key = f"{mode}{'' if mode == 'naive' else ('+pipeline' if pipeline else '')}"
            cold[key] = r
            _log(f"  cold {key:22s} model {r['latency_model_ms']:9.1f} ms, wall {r['latency_wall_ms']:9.1f} ms, "
                 f"{r['round_trips_per_query']:8.2f} round trips/q, recall@10 {r['recall10']:.3f}")
            del ix
    # The naive traversal once more on a memory node inside this process
    # (its verbs are function calls, counted the same): its compute without
    # the loopback transport's CPU per READ, which on 2 cores shared with
    # the memory node's process varies from run to run (4.9 s and 12.6 s
    # for the same 2,000 queries of the 384-d set in sessions 45 and 46).
    ix = vectide.Index.load(str(path), fetch="naive", cache_partitions=0, threads=args.threads)
    n = min(args.naive_queries, len(queries))
    _batch(ix, queries[:10], truth[:10], args.threads, False)
    r = _batch(ix, queries[:n], truth[:n], args.threads, False, len(queries) / n)
    tcp = cold["naive"]
    cold["naive-in-process"] = r
    cold["naive-in-process"]["latency_model_ms"] = tcp["meta_hnsw_ms"] + tcp["network_model_ms"] + r["sub_hnsw_ms"]
    cold["naive-in-process"]["network_model_ms"] = tcp["network_model_ms"]
    del ix
    _log(f"  cold naive, compute in process: {r['sub_hnsw_ms']:9.1f} ms (over TCP {tcp['sub_hnsw_ms']:.1f} ms)")
    res["cold"] = cold
    # Warm: the default LRU over several batches.
    ix = vectide.Index.load(str(path), memnode=node.address, threads=args.threads)
    warm = [_batch(ix, queries, truth, args.threads, True) for _ in range(args.warm_batches)]
    res["warm"] = {"batches": warm[1:] if len(warm) > 1 else warm,
                   "latency_model_ms": float(np.mean([w["latency_model_ms"] for w in warm[1:] or warm])),
                   "latency_wall_ms": float(np.mean([w["latency_wall_ms"] for w in warm[1:] or warm])),
                   "cache_capacity": ix.stats().get("cache_capacity")}
    # Recall against b and efSearch (all sub-HNSWs cached: no network).
    del ix
    ix = vectide.Index.load(str(path), memnode=node.address, threads=args.threads,
                            cache_partitions=int(res["partitions"]))
    ix.search(queries[:1], k=10)
    sweep = []
    for b in (1, 2, 3, 5, 8, 12, 16, 24):
        for ef in (16, 32, 48, 64, 128):
            r = _batch(ix, queries, truth, args.threads, True, nprobe=b, ef=ef)
            sweep.append({"b": b, "ef": ef, "recall1": r["recall1"], "recall10": r["recall10"]})
    res["sweep"] = sweep
    at = [s for s in sweep if s["b"] == 5 and s["ef"] == 48]
    res["recall10_at_b5_ef48"] = at[0]["recall10"] if at else None
    res["recall1_at_b5_ef48"] = at[0]["recall1"] if at else None
    del ix
    # The same (b, ef) at the engine's default K (ceil(N / 6,250)): fewer,
    # larger partitions, so b = 5 probes a larger share of the data.
    ix = vectide.Index(base.shape[1], ds.metric, engine="d-hnsw", memnode=node.address, threads=args.threads)
    ix.add(np.arange(len(base), dtype=np.uint64), base)
    k_default = int(ix.stats()["partitions"])
    r = _batch(ix, queries, truth, args.threads, True, nprobe=5, ef=48)
    res["default_partitions"] = {"partitions": k_default, "recall1_at_b5_ef48": r["recall1"],
                                 "recall10_at_b5_ef48": r["recall10"]}
    _log(f"  default K = {k_default}: recall@10 at b 5, ef 48 {r['recall10']:.3f}")
    del ix
    # d-HNSW warm QPS at the cheapest (b, ef) reaching 0.9, and local hnsw.
    ok = sorted((s for s in sweep if s["recall10"] >= 0.9), key=lambda s: (s["b"], s["ef"]))
    dh_qps = None
    if ok:
        ix = vectide.Index.load(str(path), memnode=node.address, threads=args.threads)
        for _ in range(2):
            r = _batch(ix, queries, truth, args.threads, True, nprobe=ok[0]["b"], ef=ok[0]["ef"])
        dh_qps = r["qps_wall"]
        res["dhnsw_at_recall_0.9"] = {"b": ok[0]["b"], "ef": ok[0]["ef"], "qps_wall": dh_qps,
                                     "recall10": r["recall10"]}
        del ix
    t0 = time.perf_counter()
    local = vectide.Index(base.shape[1], ds.metric, engine="hnsw", threads=args.threads)
    local.add(np.arange(len(base), dtype=np.uint64), base)
    res["local_hnsw_build_s"] = time.perf_counter() - t0
    loc = []
    for ef in (10, 16, 24, 32, 48, 64, 96, 128, 256):
        t0 = time.perf_counter()
        ids, _ = local.search(queries, k=10, ef=ef)
        wall = time.perf_counter() - t0
        loc.append({"ef": ef, "recall10": _recall(ids, truth, 10), "qps": len(queries) / wall})
    res["local_hnsw"] = loc
    hit = [x for x in loc if x["recall10"] >= 0.9]
    res["qps_ratio_vs_local_hnsw_at_recall_0.9"] = (dh_qps / hit[0]["qps"]) if (dh_qps and hit) else None
    if not ok:
        res["note"] = "d-HNSW never reached recall@10 0.9 in the sweep"
    return res


def doorbell_speedup(c: Dict[str, Dict[str, float]]) -> float:
    """No-doorbell over doorbell batch latency under the model, both given
    the same meta-HNSW and sub-HNSW stage times (the mean of their two
    measurements) and each its own exactly counted network time: what the
    doorbell changes is the round trips, and the two runs' compute differs
    by more than that from run to run (the stage times of both are in the
    JSON, and their plain ratio is ``doorbell_speedup_measured_stages``)."""
    a, b = c["no-doorbell"], c["doorbell"]
    compute = (a["meta_hnsw_ms"] + a["sub_hnsw_ms"] + b["meta_hnsw_ms"] + b["sub_hnsw_ms"]) / 2
    return (compute + a["network_model_ms"]) / (compute + b["network_model_ms"])


def summary(per: Dict[str, Dict[str, object]]) -> Dict[str, object]:
    main = per.get(TEXT) or next(iter(per.values()))
    c = main["cold"]
    out = {
        "dataset": main["dataset"],
        "note": None if main["dataset"] == TEXT else f"the figures are {main['dataset']}'s: {TEXT} did not run",
        "latency_model": "meta-HNSW + modelled network + sub-HNSW stage, measured without the pipeline "
                         "(with it, the stage shares the 2 cores with the loopback transfers the model "
                         "replaces); pipeline_speedup is measured wall time on loopback TCP",
        "latency_speedup_vs_naive": c["naive"]["latency_model_ms"] / c["doorbell"]["latency_model_ms"],
        "latency_speedup_vs_naive_compute_in_process":
            c["naive-in-process"]["latency_model_ms"] / c["doorbell"]["latency_model_ms"],
        "network_speedup_vs_naive": c["naive"]["network_model_ms"] / c["doorbell"]["network_model_ms"],
        "doorbell_speedup_vs_no_doorbell": doorbell_speedup(c),
        "doorbell_speedup_measured_stages": c["no-doorbell"]["latency_model_ms"] / c["doorbell"]["latency_model_ms"],
        "pipeline_speedup": c["doorbell"]["latency_wall_ms"] / c["doorbell+pipeline"]["latency_wall_ms"],
        "round_trips_per_query": c["doorbell"]["round_trips_per_query"],
        "bytes_per_query": c["doorbell"]["bytes_per_query"],
        "recall10_at_b5_ef48": main["recall10_at_b5_ef48"],
        "partitions": main["partitions"],
        "recall10_at_b5_ef48_default_partitions": main["default_partitions"]["recall10_at_b5_ef48"],
        "default_partitions": main["default_partitions"]["partitions"],
        "qps_ratio_vs_local_hnsw_at_recall_0.9": main["qps_ratio_vs_local_hnsw_at_recall_0.9"],
    }
    for name, r in per.items():
        if r is not main:
            cc = r["cold"]
            out[f"{name}"] = {
                "latency_speedup_vs_naive": cc["naive"]["latency_model_ms"] / cc["doorbell"]["latency_model_ms"],
                "latency_speedup_vs_naive_compute_in_process":
                    cc["naive-in-process"]["latency_model_ms"] / cc["doorbell"]["latency_model_ms"],
                "network_speedup_vs_naive": cc["naive"]["network_model_ms"] / cc["doorbell"]["network_model_ms"],
                "doorbell_speedup_vs_no_doorbell": doorbell_speedup(cc),
                "recall10_at_b5_ef48": r["recall10_at_b5_ef48"],
                "recall10_at_b5_ef48_default_partitions": r["default_partitions"]["recall10_at_b5_ef48"],
                "qps_ratio_vs_local_hnsw_at_recall_0.9": r["qps_ratio_vs_local_hnsw_at_recall_0.9"],
            }
    return out


def plot(res: Dict[str, object], out_dir: Path) -> List[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, r in res["datasets"].items():
        c = r["cold"]
        modes = ["naive", "no-doorbell", "doorbell"]
        fig, ax = plt.subplots(figsize=(6, 3.5))
        bottom = np.zeros(len(modes))
        for part, label in (("network_model_ms", "network (model)"), ("sub_hnsw_ms", "sub-HNSW search"),
                            ("meta_hnsw_ms", "meta-HNSW search")):
            vals = np.array([c[m][part] for m in modes])
            ax.bar(modes, vals, bottom=bottom, label=label)
            bottom += vals
        ax.set_yscale("log")
        ax.set_ylabel(f"batch latency, ms ({r['queries']} queries, cold)")
        ax.set_title(f"d-HNSW on {name}: {res['machine'].get('simd_isa', '')}")
        ax.legend(fontsize=8)
        p = out_dir / f"dhnsw-breakdown-{name}.png"
        fig.tight_layout()
        fig.savefig(p, dpi=120)
        plt.close(fig)
        paths.append(p)
    return paths


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m vectide.bench dhnsw", description=__doc__.split("\n\n")[0])
    ap.add_argument("--datasets", default=f"{GLOVE},{TEXT}")
    ap.add_argument("--partitions", type=int, default=160)
    ap.add_argument("--queries", type=int, default=2000)
    ap.add_argument("--naive-queries", type=int, default=200)
    ap.add_argument("--cold-batches", type=int, default=3,
                    help="cold batches measured per configuration after an unmeasured one (rounded up to odd); "
                         "the median is reported")
    ap.add_argument("--warm-batches", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--node-size", type=int, default=4 << 30)
    ap.add_argument("--cli", default=None, help="the vectide binary (default: beside this Python, or on PATH)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--plot", default=None)
    args = ap.parse_args(argv)
    import vectide

    per: Dict[str, Dict[str, object]] = {}
    with tempfile.TemporaryDirectory() as tmp, MemoryNode(args.node_size, args.cli, Path(tmp) / "memnode.log") as node:
        for name in [d for d in args.datasets.split(",") if d]:
            per[name] = run_dataset(name, args, node, Path(tmp))
    info = machine_info()
    info["simd_isa"] = vectide.simd_isa()
    res = {"benchmark": "dhnsw", "machine": info, "args": vars(args), "datasets": per,
           "network_model": {"latency_us": 3.0, "bandwidth_gbps": 100.0},
           # What ran: the command and the commit the extension was built at.
           "command": " ".join(["python", "-m", "vectide.bench", "dhnsw"] + list(sys.argv[2:] if argv is None else argv)),
           "commit": vectide.build_commit()}
    res["summary"] = summary(per)
    write_json(res, args.out)
    if args.plot:
        for p in plot(res, Path(args.plot)):
            _log(f"wrote {p}")
    for k, v in res["summary"].items():
        _log(f"{k}: {v}")
    return 0
