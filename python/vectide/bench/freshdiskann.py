"""FreshDiskANN benchmark: StreamingMerge against a rebuild, the disk search
against DiskANN's disk index, RAM, insert latency.

``python -m vectide.bench freshdiskann [--dataset glove-6b-50-angular]
[--change 0.05] [--l 10,16,24,32,48,64,96,128] [--w 4] [--threads 1,2]
[--max-queries 1000] --out FILE.json [--plot DIR]``

The figures of FreshDiskANN (Singh et al., 2021) §6 at our scale, every
engine built and searched in this run on the same data and threads:

* **(a) StreamingMerge.** ``vectide:fresh-diskann`` builds its LTI on a
  random ``1 - change`` of the points (a bulk load into the RW-TempIndex,
  then ``maintain()``: the LTI written from it). Then ``change`` of them
  are deleted and the held-out ``change`` inserted, and ``maintain()``
  merges. Beside it, in the same run: a **rebuild** (the same code, R / L /
  alpha, PQ bytes and threads as the initial build, over the final set) and
  **DiskANN's own disk build** of the final set (PyPI ``diskannpy-rust``
  ``build_disk_index``, R 64, L 75, alpha 1.2, 32 PQ chunks, the same
  threads). Recall@10 before and after the merge at a fixed L and W.
* **(b) Disk search.** The rebuilt LTI and DiskANN's disk index over an L
  sweep at beam width W, 1 and 2 threads, batch calls on each side
  (``Index.search`` of the query matrix; ``batch_search``): recall@10, QPS,
  mean sector reads per query (ours from the engine's counters, DiskANN's
  ``search_stats['mean_ios']``). Both read with ``O_DIRECT`` (DiskANN's
  reader opens its file with it; ours reports it in the JSON), no cache.
  Both are open at once and take turns at each L, who goes first
  alternating: the machine's speed drifts within a run.
* **(c) RAM.** The LTI's RAM per vector (PQ codes, pivots, the location
  map) and the peak resident memory a merge adds (polled every 5 ms) over
  the change set's vector bytes.
* **Inserts.** Single-point insert latency (each call fsyncs the redo log).

Angular data is searched as L2 over unit vectors on DiskANN's side (its
disk index does not take cosine); rankings are the same.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np

from .. import datasets
from .ann import machine_info, rss_bytes, write_json
from .metrics import qps_at_recall, recall_at_k

R, L_BUILD, ALPHA, PQ_BYTES = 64, 75, 1.2, 32
# StreamingMerge's own knobs: the engine's defaults, named so that the
# JSON says what ran (the rebuild runs with L_BUILD).
MERGE_L, MERGE_REFILL = 40, 16


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def value_at_recall(points: List[Tuple[float, float]], target: float) -> Optional[float]:
    """Linear interpolation of a value (sector reads) at ``target`` recall
    between the sweep points around it; ``None`` when the sweep never
    reaches it."""
    pts = sorted(points)
    for (r0, v0), (r1, v1) in zip(pts, pts[1:]):
        if r0 <= target <= r1:
            return v0 if r1 == r0 else v0 + (v1 - v0) * (target - r0) / (r1 - r0)
    if pts and pts[0][0] >= target:
        return pts[0][1]
    return None


class RssPeak:
    """Polls this process's RSS in a thread; ``peak`` over the block."""

    def __init__(self, every: float = 0.005) -> None:
        self.every = every
        self.peak = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_bytes())
            time.sleep(self.every)

    def __enter__(self) -> "RssPeak":
        self.peak = rss_bytes()
        self._t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, rss_bytes())


def _stats(ix) -> Dict[str, float]:
    return dict(ix.stats())


def fresh_index(vectide, path: Path, dim: int, metric: str, threads: int):
    # Freezes and merges only on request: the benchmark times each step.
    return vectide.Index(dim, metric=metric, engine="fresh-diskann", path=str(path), threads=threads,
                         r=R, l_build=L_BUILD, alpha=ALPHA, pq_bytes=PQ_BYTES,
                         merge_l=MERGE_L, merge_refill=MERGE_REFILL,
                         temp_points=1 << 32, merge_points=1 << 40)


def build_lti(vectide, path: Path, ids: np.ndarray, X: np.ndarray, metric: str, threads: int):
    """The initial build (and the rebuild): bulk load, then the LTI."""
    ix = fresh_index(vectide, path, X.shape[1], metric, threads)
    t0 = time.perf_counter()
    ix.add(ids, X)
    t1 = time.perf_counter()
    ix.maintain()
    t2 = time.perf_counter()
    return ix, {"graph_s": t1 - t0, "lti_write_s": t2 - t1, "seconds": t2 - t0}


def measure_point(search, stats_fn, queries, truth, l, t, label) -> Dict[str, float]:
    """One sweep point: ``search(queries, L, T) -> ids`` after a warm-up on
    100 queries; ``stats_fn(before)`` -> mean sector reads per query (and
    optionally more figures) since ``stats_fn(None)``."""
    search(queries[: min(100, len(queries))], l, t)  # warm-up (no cache: O_DIRECT)
    before = stats_fn(None)
    t0 = time.perf_counter()
    ids = search(queries, l, t)
    dt = time.perf_counter() - t0
    after = stats_fn(before)
    sectors, extra = after if isinstance(after, tuple) else (after, {})
    rec = recall_at_k(list(ids), truth, 10)
    _log(f"  {label} T{t} L{l}: recall {rec:.3f}, {len(queries) / dt:,.0f} QPS, {sectors:.1f} sectors")
    return {"threads": t, "L": l, "recall": rec, "qps": len(queries) / dt,
            "mean_latency_us": dt / len(queries) * 1e6 * t, "sectors_per_query": sectors, **extra}


def run(args) -> Dict[str, object]:
    import vectide

    ds = datasets.load(args.dataset)
    metric = datasets.metric_for(ds.distance)
    train = np.ascontiguousarray(ds.train, dtype=np.float32)
    if metric == "cosine":
        train = train / np.linalg.norm(train, axis=1, keepdims=True).clip(1e-30)
    queries = np.ascontiguousarray(ds.test[: args.max_queries], dtype=np.float32)
    if metric == "cosine":
        queries = queries / np.linalg.norm(queries, axis=1, keepdims=True).clip(1e-30)
    n, dim = train.shape
    rng = np.random.default_rng(args.seed)
    order = rng.permutation(n)
    n_change = int(round(n * args.change))
    base = np.sort(order[: n - n_change])
    held = np.sort(order[n - n_change:])
    gone = np.sort(rng.choice(base, n_change, replace=False))
    final = np.sort(np.concatenate([np.setdiff1d(base, gone), held]))
    _log(f"{args.dataset}: {n} points, dim {dim}, {metric}; LTI on {len(base)}, "
         f"delete {len(gone)}, insert {len(held)}; {len(queries)} queries")
    gt_base = datasets.ground_truth(train[base], queries, 10, ds.distance)[0]
    gt_final = datasets.ground_truth(train[final], queries, 10, ds.distance)[0]
    truth_base = base[gt_base].astype(np.uint64)
    truth_final = final[gt_final].astype(np.uint64)
    if args.dir:
        Path(args.dir).mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="vectide-fdann-", dir=args.dir))
    threads = args.build_threads
    res: Dict[str, object] = {"benchmark": "freshdiskann", "dataset": args.dataset, "metric": metric,
                              "n": n, "dim": dim, "change_fraction": args.change, "queries": len(queries),
                              "build_threads": threads, "simd": vectide.simd_isa(),
                              "machine": machine_info(), "params": {"r": R, "l_build": L_BUILD, "alpha": ALPHA,
                                                                    "pq_bytes": PQ_BYTES, "w": args.w,
                                                                    "merge_l": MERGE_L, "merge_refill": MERGE_REFILL}}
    try:
        # (a) initial LTI, the change set, the merge.
        _log("initial build ...")
        ix, build0 = build_lti(vectide, work / "merged", base.astype(np.uint64), train[base], metric, threads)
        s0 = _stats(ix)
        res["initial_build"] = build0
        res["lti"] = {"nodes": s0["lti_nodes"], "ram_bytes": s0["lti_ram_bytes"],
                      "ram_bytes_per_vector": s0["lti_ram_bytes"] / max(1, s0["lti_points"]),
                      "disk_bytes": s0["disk_bytes"]}
        fixed_l = args.fixed_l

        rec_before = recall_at_k(list(ix.search(queries, k=10, ef=fixed_l, beam_width=args.w)[0]), truth_base, 10)
        _log(f"recall before the merge (L {fixed_l}, W {args.w}): {rec_before:.4f}")
        t0 = time.perf_counter()
        ix.delete(gone.astype(np.uint64))
        del_s = time.perf_counter() - t0
        # Inserts: the first ones one call each (latency), the rest in one batch.
        lat = []
        single = held[: args.single_inserts]
        for i in single:
            t = time.perf_counter()
            ix.add(np.array([i], dtype=np.uint64), train[i: i + 1])
            lat.append(time.perf_counter() - t)
        rest = held[args.single_inserts:]
        t0 = time.perf_counter()
        ix.add(rest.astype(np.uint64), train[rest])
        ins_s = time.perf_counter() - t0
        rss_before = rss_bytes()
        with RssPeak() as peak:
            t0 = time.perf_counter()
            ix.maintain()
            merge_s = time.perf_counter() - t0
        s1 = _stats(ix)
        rec_after = recall_at_k(list(ix.search(queries, k=10, ef=fixed_l, beam_width=args.w)[0]), truth_final, 10)
        _log(f"merge {merge_s:.1f} s; recall after (L {fixed_l}, W {args.w}): {rec_after:.4f}")
        change_bytes = (len(gone) + len(held)) * dim * 4
        res["merge"] = {
            "seconds": merge_s,
            "delete_phase_s": s1.get("last_merge_delete_secs"),
            "insert_phase_s": s1.get("last_merge_insert_secs"),
            "patch_phase_s": s1.get("last_merge_patch_secs"),
            "deletes_call_s": del_s, "inserts_batch_s": ins_s,
            "recall_before": rec_before, "recall_after": rec_after, "fixed_l": fixed_l, "w": args.w,
            "rss_before": rss_before, "rss_peak": peak.peak, "peak_added_bytes": peak.peak - rss_before,
            "change_set_vector_bytes": change_bytes, "lti_after": {"nodes": s1["lti_nodes"], "points": s1["lti_points"]},
            # The merge's named caches (records near the start node, each
            # Insert thread's recent records, the scans' and writers' I/O
            # buffers), each bounded by a constant (merge.rs).
            "cache_bytes": {k: s1.get(f"last_merge_{k}_bytes") for k in ("near_start", "recent", "io_buffer")},
        }
        lat_ms = np.array(lat) * 1e3
        res["inserts"] = {"single_calls": len(lat), "p50_ms": float(np.percentile(lat_ms, 50)),
                          "p99_ms": float(np.percentile(lat_ms, 99)), "mean_ms": float(lat_ms.mean())}
        ix.flush()
        del ix
        # The rebuild of the final set, same code and settings.
        _log("rebuild of the final set ...")
        rb, rebuild = build_lti(vectide, work / "rebuilt", final.astype(np.uint64), train[final], metric, threads)
        res["rebuild"] = rebuild
        # DiskANN's disk build of the same set.
        dk = diskann_build(train[final], work / "diskann", threads)
        res["diskann_build"] = dk["build"]
        # (b) disk search sweeps.
        _log("disk search sweeps ...")
        ls = args.l
        rb.flush()
        del rb
        ours_pts: List[Dict[str, float]] = []
        dk_pts: List[Dict[str, float]] = []
        for t in args.threads:  # each side's pool has `threads` workers: reopen with each
            rb = vectide.Index.load(str(work / "rebuilt"), threads=t)

            def rb_stats(before, rb=rb):
                s = _stats(rb)
                now = (s["disk_queries"], s["sectors_per_query"] * s["disk_queries"])
                if before is None:
                    return now
                return (now[1] - before[1]) / max(1, now[0] - before[0])

            def rb_search(q, l, _t, rb=rb):
                return rb.search(q, k=10, ef=l, beam_width=args.w)[0]

            dk_search, dk_stats = diskann_searcher(dk["index_dir"], final, t, args.w, dim)
            # The engines take turns at each L (who goes first alternates):
            # the machine's speed drifts, and one sweep after the other
            # would compare two different moments.
            for i, l in enumerate(ls):
                turns = [("ours", rb_search, rb_stats), ("diskann", dk_search, dk_stats)]
                for who, search, stats in (turns if i % 2 == 0 else turns[::-1]):
                    label = "fresh-diskann" if who == "ours" else "diskann"
                    p = measure_point(search, stats, queries, truth_final, l, t, label)
                    (ours_pts if who == "ours" else dk_pts).append(p)
            o_direct = _stats(rb).get("lti_o_direct", 0) == 1
            rb.flush()
            del rb, dk_search, dk_stats
        ours_pts.sort(key=lambda p: (p["threads"], p["L"]))
        dk_pts.sort(key=lambda p: (p["threads"], p["L"]))
        res["disk_search"] = {"vectide:fresh-diskann": ours_pts, "diskann": dk_pts,
                              "o_direct": {"vectide:fresh-diskann": bool(o_direct), "diskann": True},
                              "o_direct_note": "ours from the engine (lti_o_direct); DiskANN's reader opens "
                                               "its index with O_DIRECT (strace of diskannpy-rust 0.49.1)"}
        summary = summarize(res, ours_pts, dk_pts, args)
        res["summary"] = summary
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return res


def summarize(res, ours_pts, dk_pts, args) -> Dict[str, object]:
    m = res["merge"]
    out: Dict[str, object] = {
        "merge_over_rebuild": m["seconds"] / res["rebuild"]["seconds"],
        "rebuild_over_diskann_build": res["rebuild"]["seconds"] / res["diskann_build"]["seconds"],
        "recall_after_merge_minus_before_points": 100 * (m["recall_after"] - m["recall_before"]),
        "lti_ram_bytes_per_vector": res["lti"]["ram_bytes_per_vector"],
        "merge_peak_ram_over_change_set": m["peak_added_bytes"] / max(1, m["change_set_vector_bytes"]),
        "merge_peak_ram_beyond_caches_over_change_set":
            (m["peak_added_bytes"] - sum(v or 0 for v in m.get("cache_bytes", {}).values()))
            / max(1, m["change_set_vector_bytes"]),
        "insert_p50_ms": res["inserts"]["p50_ms"],
    }
    for t in args.threads:
        o = [(p["recall"], p["qps"]) for p in ours_pts if p["threads"] == t]
        d = [(p["recall"], p["qps"]) for p in dk_pts if p["threads"] == t]
        qo, qd = qps_at_recall(o, 0.95), qps_at_recall(d, 0.95)
        so = value_at_recall([(p["recall"], p["sectors_per_query"]) for p in ours_pts if p["threads"] == t], 0.95)
        sd = value_at_recall([(p["recall"], p["sectors_per_query"]) for p in dk_pts if p["threads"] == t], 0.95)
        key = "" if t == args.threads[0] else f"_threads{t}"
        out[f"disk_qps_ratio_vs_diskann_at_0.95{key}"] = qo / qd if qo and qd else None
        out[f"sector_reads_ratio_vs_diskann_at_0.95{key}"] = so / sd if so and sd else None
    out.update(crash_figures(getattr(args, "crash_json", None)))
    return out


def crash_figures(path: Optional[str]) -> Dict[str, object]:
    """The crash kit's figures from a ``vectide crash-test fresh-diskann
    --json`` report (``None`` without one)."""
    if not path or not Path(path).exists():
        return {"crash_states_checked": None, "violations": None}
    c = json.loads(Path(path).read_text())
    kill = c.get("kill") or {}
    return {"crash_states_checked": c.get("crash_points_checked"), "violations": c.get("violations"),
            "kill_rounds": kill.get("rounds"), "crash_source": str(path)}


def diskann_build(X: np.ndarray, d: Path, threads: int) -> Dict[str, object]:
    import diskannpy

    d.mkdir(parents=True, exist_ok=True)
    _log("DiskANN disk build ...")
    t0 = time.perf_counter()
    diskannpy.build_disk_index(np.ascontiguousarray(X, dtype=np.float32), "l2", str(d), complexity=L_BUILD,
                               graph_degree=R, build_memory_maximum=16.0, num_threads=threads, alpha=ALPHA,
                               num_of_pq_chunks=PQ_BYTES)
    return {"build": {"seconds": time.perf_counter() - t0, "version": _version("diskannpy-rust")},
            "index_dir": d}


def _version(pkg: str) -> Optional[str]:
    try:
        from importlib.metadata import version

        return version(pkg)
    except Exception:
        return None


def diskann_searcher(index_dir, final, t, w, dim):
    """DiskANN's static disk index opened with ``t`` threads: a
    ``search(queries, L, T) -> ids`` (our numbering) and a stats function
    for :func:`measure_point` (its ``search_stats['mean_ios']`` and
    ``mean_hops`` of the last batch)."""
    import diskannpy

    ix = diskannpy.StaticDiskIndex(str(index_dir), num_threads=t, beam_width=w, num_nodes_to_cache=0,
                                   distance_metric="l2", vector_dtype=np.float32, dimensions=dim)
    last: Dict[str, object] = {}

    def search(q, l, threads):
        r = ix.batch_search(q, 10, l, threads)
        last["stats"] = r.search_stats
        return final[np.asarray(r.identifiers, dtype=np.int64)].astype(np.uint64)

    def stats(before):
        if before is None:
            return "start"  # the figures come with each batch
        s = last["stats"]
        return float(s["mean_ios"]), {"mean_hops": float(s.get("mean_hops", 0))}

    return search, stats


def plot(res, out_dir: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for name, pts in res["disk_search"].items():
        if not isinstance(pts, list):
            continue
        for t in sorted({p["threads"] for p in pts}):
            sel = [p for p in pts if p["threads"] == t]
            axes[0].plot([p["recall"] for p in sel], [p["qps"] for p in sel], marker="o", label=f"{name} T{t}")
            axes[1].plot([p["recall"] for p in sel], [p["sectors_per_query"] for p in sel], marker="o",
                         label=f"{name} T{t}")
    axes[0].set_xlabel("recall@10")
    axes[0].set_ylabel("QPS")
    axes[0].set_yscale("log")
    axes[1].set_xlabel("recall@10")
    axes[1].set_ylabel("sector reads / query")
    for a in axes:
        a.grid(alpha=0.3)
        a.legend(fontsize=7)
    fig.suptitle(f"disk search, {res['dataset']} (O_DIRECT, W {res['params']['w']}, {res['simd']})")
    fig.tight_layout()
    fig.savefig(out_dir / "disk_search.png", dpi=120)


def _ints(s: str) -> List[int]:
    return [int(x) for x in s.split(",") if x]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m vectide.bench freshdiskann", description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", default="glove-6b-50-angular")
    p.add_argument("--change", type=float, default=0.05, help="fraction deleted and inserted (default 0.05)")
    p.add_argument("--l", type=_ints, default=[10, 16, 24, 32, 48, 64, 96, 128])
    p.add_argument("--w", type=int, default=4)
    p.add_argument("--threads", type=_ints, default=[1, 2])
    p.add_argument("--build-threads", type=int, default=2)
    p.add_argument("--fixed-l", type=int, default=64, help="L of the recall before/after the merge")
    p.add_argument("--single-inserts", type=int, default=2000, help="inserts timed one call each")
    p.add_argument("--max-queries", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dir", default=None, help="directory for the indexes (default: the temp dir)")
    p.add_argument("--crash-json", default=None, help="a `vectide crash-test fresh-diskann --json` report to fold into the summary")
    p.add_argument("--out", required=True)
    p.add_argument("--crash-only", action="store_true",
                   help="only fold --crash-json into the summary of the results already in --out")
    p.add_argument("--plot", default=None)
    args = p.parse_args(argv)
    if not 0 < args.change < 0.5:
        p.error("--change must be in (0, 0.5)")
    if args.w < 1 or min(args.l) < 1 or min(args.threads) < 1:
        p.error("--w, --l and --threads take values of at least 1")
    if args.crash_only:
        # Fold a crash report into results written earlier (the crash kit
        # runs apart: it would disturb the timings).
        res = json.loads(Path(args.out).read_text())
        if not args.crash_json or not Path(args.crash_json).exists():
            p.error("--crash-only needs --crash-json FILE")
        res["summary"].update(crash_figures(args.crash_json))
        res["crash"] = json.loads(Path(args.crash_json).read_text())
        write_json(res, args.out)
        print(json.dumps(res["summary"], indent=2))
        return 0
    res = run(args)
    write_json(res, args.out)
    if args.plot:
        plot(res, Path(args.plot))
    print(json.dumps(res["summary"], indent=2))
    return 0
