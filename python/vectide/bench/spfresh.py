"""SPFresh benchmark: a distribution-shifting update stream, SPFresh against
SPANN updated in place (SPANN+) and a static SPANN rebuilt on the final data.

``python -m vectide.bench spfresh [--dataset glove-6b-50-angular]
[--clusters 64] [--initial 32] [--phases 10] [--nprobe 64] [--threads 2]
[--batch 1000] [--queries 10000] [--limit N] [--param NAME=VALUE]...
[--static-heads matched|both|default] [--dir DIR] [--crash-json F]
--out FILE.json [--plot DIR]``

SPFresh (Xu et al., SOSP 2023) §2.3 and §5.4 at our scale. The dataset is
cut by k-means into ``clusters`` clusters (the clustered runbook's
seeded k-means, :func:`vectide.runbook.kmeans`). The
indexes are built on the points of the first ``initial`` clusters; then
``phases`` phases each insert the next slice of the remaining clusters'
points (cluster by cluster) and delete as many of the oldest points, until
the stream has replaced at least 100 % of the initial size. Engines, each
in its own directory, same parameters and threads:

* ``spfresh``: SPANN + LIRE (splits, merges, reassigns in the background);
* ``spann-inplace``: SPANN+ (appends in place, tombstones, no rebalancing);
* ``spann``: a static SPANN built on the final live set, with as many
  postings as SPFresh ended with (``--static-heads``; the build at the
  default ``head_ratio`` runs beside it as ``spann-default-ratio``).

Per phase: insert and delete throughput, and the latency of single-query
searches issued from a second thread while the phase's updates run.
Index quality is judged on the final indexes with no updates running
(SPFresh's background jobs drained first): ``queries`` queries (test
queries, then training points outside the final set when the test set is
smaller), one call each from one thread, the engines taking turns over
chunks of queries, nprobe fixed: recall@10 against
exact ground truth over the final live set, mean / P99 / P99.9 latency,
postings and blocks read per query. Reported without a target: posting
length max / mean, the fraction of inserts whose APPEND took a posting over
the split limit, reassign candidates evaluated vs moved, the longest split
cascade. Postings are read with ``O_DIRECT`` (reported).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np

from .. import datasets
from ..runbook import kmeans
from .ann import machine_info, write_json
from .freshdiskann import crash_figures
from .metrics import recall_at_k

ENGINES = ("spfresh", "spann-inplace", "spann")
DEFAULT_STATIC = "spann-default-ratio"


def static_builds(args, final_ix: Dict[str, object], live: int) -> Dict[str, Dict[str, object]]:
    """The static SPANN builds on the final data: name → engine params.

    ``spann`` (the summary's static index) is built with as many postings
    as SPFresh ended with (``head_ratio`` = SPFresh's postings / live
    points) under ``--static-heads matched``, so that both indexes spend
    the same centroid-index memory and read postings of the same regime at
    the same nprobe: at the default head_ratio (0.1) the static build's
    postings hold about 15 records where SPFresh's settle between half the
    split limit and the limit (splits halve a full one), and a fixed
    nprobe then compares two points of different recall and cost. With
    ``both`` (the default) the build at the default head_ratio runs too,
    as ``spann-default-ratio``, and its figures are reported beside."""
    base = dict(args.param)
    out: Dict[str, Dict[str, object]] = {}
    postings = None
    if "spfresh" in final_ix:
        postings = stat(dict(final_ix["spfresh"].stats()), "postings")
    if args.static_heads in ("matched", "both") and postings and live:
        out["spann"] = {**base, "head_ratio": min(1.0, postings / live)}
        if args.static_heads == "both":
            out[DEFAULT_STATIC] = base
    else:
        out["spann"] = base
    return out


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def stream(labels: np.ndarray, initial: int, phases: int, seed: int):
    """(initial ids, [(insert ids, delete ids)] per phase): clusters in a
    seeded order; the first ``initial`` clusters build the index (swapped,
    largest for smallest, with later ones while the later clusters hold
    fewer points, so that the stream replaces at least 100 % of the
    initial size); the rest arrive in ``phases`` equal slices, each
    deleting as many of the oldest live points."""
    rng = np.random.default_rng(seed)
    order = list(rng.permutation(labels.max() + 1))
    size = np.bincount(labels, minlength=len(order))
    head, tail = order[:initial], order[initial:]
    while size[head].sum() > size[tail].sum():
        big = max(head, key=lambda c: size[c])
        small = min(tail, key=lambda c: size[c])
        if size[big] <= size[small]:
            break
        head[head.index(big)], tail[tail.index(small)] = small, big
    order = head + tail
    rank = np.empty(len(order), dtype=np.int64)
    rank[np.asarray(order)] = np.arange(len(order))
    ids = np.argsort(rank[labels], kind="stable").astype(np.uint64)
    n0 = int((rank[labels] < initial).sum())
    base, rest = ids[:n0], ids[n0:]
    slices = np.array_split(rest, phases)
    live_order = list(base)  # oldest first
    out = []
    at = 0
    for s in slices:
        gone = np.array(live_order[at:at + len(s)], dtype=np.uint64)
        at += len(s)
        live_order.extend(s.tolist())
        out.append((s, gone))
    return base, out


def make_index(vectide, engine: str, d: Path, dim: int, metric: str, threads: int, nprobe: int,
               params: Optional[Dict[str, object]] = None):
    if d.exists():
        shutil.rmtree(d)
    return vectide.Index(dim, metric=metric, engine=engine, path=str(d), threads=threads, nprobe=nprobe,
                         **(params or {}))


def _param(s: str):
    """``NAME=VALUE`` → (name, int, float or str value)."""
    name, eq, raw = s.partition("=")
    if not eq or not name or not raw:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {s!r}")
    for conv in (int, float):
        try:
            return name, conv(raw)
        except ValueError:
            pass
    return name, raw


def add_batches(ix, ids: np.ndarray, X: np.ndarray, batch: int) -> float:
    t0 = time.perf_counter()
    for s in range(0, len(ids), batch):
        ix.add(ids[s:s + batch], X[ids[s:s + batch].astype(np.int64)])
    return time.perf_counter() - t0


def delete_batches(ix, ids: np.ndarray, batch: int) -> float:
    t0 = time.perf_counter()
    for s in range(0, len(ids), batch):
        ix.delete(ids[s:s + batch])
    return time.perf_counter() - t0


class Prober:
    """Single-query searches from a thread while updates run."""

    def __init__(self, ix, queries: np.ndarray, nprobe: int) -> None:
        self.ix, self.queries, self.nprobe = ix, queries, nprobe
        self.lat: List[float] = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            q = self.queries[i % len(self.queries)][None, :]
            t0 = time.perf_counter()
            self.ix.search(q, k=10, nprobe=self.nprobe)
            self.lat.append(time.perf_counter() - t0)
            i += 1

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()


def lat_summary(lat: List[float]) -> Dict[str, Optional[float]]:
    if not lat:
        return {"n": 0, "mean_ms": None, "p99_ms": None, "p999_ms": None}
    a = np.asarray(lat) * 1e3
    return {"n": len(a), "mean_ms": float(a.mean()), "p99_ms": float(np.percentile(a, 99)),
            "p999_ms": float(np.percentile(a, 99.9))}


def stat(st: Dict[str, float], key: str) -> Optional[float]:
    v = st.get(key)
    return None if v is None else float(v)


def quality(ixs: Dict[str, object], queries: np.ndarray, truth: np.ndarray, nprobe: int,
            chunk: int = 250) -> Dict[str, Dict[str, object]]:
    """One call per query from this thread, recall@10 and latencies per
    engine. The engines take turns over chunks of ``chunk`` queries, so
    that the machine's slow spells fall on all of them alike (the tail
    percentiles of engines measured one after another differed by 1.6x
    between runs of the same static index)."""
    before = {e: dict(ix.stats()) for e, ix in ixs.items()}
    found: Dict[str, list] = {e: [] for e in ixs}
    lat: Dict[str, List[float]] = {e: [] for e in ixs}
    for s in range(0, len(queries), chunk):
        for e, ix in ixs.items():
            for q in queries[s:s + chunk]:
                t0 = time.perf_counter()
                ids, _ = ix.search(q[None, :], k=10, nprobe=nprobe)
                lat[e].append(time.perf_counter() - t0)
                found[e].append(ids[0])
    nq = len(queries)
    res: Dict[str, Dict[str, object]] = {}
    for e, ix in ixs.items():
        after = dict(ix.stats())
        out: Dict[str, object] = {"recall10": recall_at_k(found[e], truth, 10), **lat_summary(lat[e])}
        for k in ("postings_per_query", "blocks_per_query"):
            # Counters are cumulative: the delta over these queries.
            b, a = before[e].get("queries", 0.0), after.get("queries", 0.0)
            tot_b, tot_a = before[e].get(k, 0.0) * b, after.get(k, 0.0) * a
            out[k] = (tot_a - tot_b) / nq if a > b else None
        res[e] = out
    return res


def run(args) -> Dict[str, object]:
    import vectide

    ds = datasets.load(args.dataset)
    X = np.ascontiguousarray(ds.train, dtype=np.float32)
    if args.limit:
        X = X[:args.limit]
    metric = ds.metric
    dim = X.shape[1]
    _log(f"k-means of {len(X)} points into {args.clusters} clusters")
    labels = kmeans(X, args.clusters, seed=args.seed)
    base, phases = stream(labels, args.initial, args.phases, args.seed)
    final_live = set(base.tolist())
    for ins, gone in phases:
        final_live.difference_update(gone.tolist())
        final_live.update(ins.tolist())
    live = np.array(sorted(final_live), dtype=np.uint64)
    changed = sum(len(i) for i, _ in phases)
    # Queries: the test set, topped up with training points not in the
    # final set (they are absent from the index, as test queries are).
    Q = np.ascontiguousarray(ds.test, dtype=np.float32)
    if len(Q) < args.queries:
        outside = np.setdiff1d(np.arange(len(X)), live.astype(np.int64))
        rng = np.random.default_rng(args.seed + 1)
        extra = X[rng.choice(outside, size=min(len(outside), args.queries - len(Q)), replace=False)]
        Q = np.concatenate([Q, extra])
    Q = Q[:args.queries]
    _log(f"ground truth over the final {len(live)} points for {len(Q)} queries (flat)")
    flat = vectide.Index(dim, metric=metric, engine="flat", threads=args.threads)
    flat.add(live, X[live.astype(np.int64)])
    truth = np.asarray(flat.search(Q, k=10)[0])
    del flat

    root = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="vectide-spfresh-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    probe_q = Q[: min(len(Q), 2000)]
    engines: Dict[str, Dict[str, object]] = {}
    final_ix: Dict[str, object] = {}
    for engine in [e for e in args.engines if e != "spann"]:
        d = root / engine
        ix = make_index(vectide, engine, d, dim, metric, args.threads, args.nprobe, dict(args.param))
        _log(f"{engine}: build on {len(base)} points")
        t_build = add_batches(ix, base, X, max(len(base), 1))
        ix.maintain()
        rec: Dict[str, object] = {"build_s": t_build, "phases": []}
        for p, (ins, gone) in enumerate(phases):
            with Prober(ix, probe_q, args.nprobe) as pr:
                t_ins = add_batches(ix, ins, X, args.batch)
                t_del = delete_batches(ix, gone, args.batch)
            st = dict(ix.stats())
            ph = {"phase": p + 1, "inserted": int(len(ins)), "deleted": int(len(gone)),
                  "insert_s": t_ins, "delete_s": t_del,
                  "inserts_per_s": len(ins) / t_ins if t_ins else None,
                  "search_during_updates": lat_summary(pr.lat),
                  "pending_jobs": st.get("pending_background"),
                  "postings": stat(st, "postings"), "posting_records_max": stat(st, "posting_records_max"),
                  "splits": stat(st, "splits"), "merges": stat(st, "merges")}
            rec["phases"].append(ph)
            _log(f"{engine} phase {p + 1}: {len(ins)} in {t_ins:.1f}s, {len(gone)} out {t_del:.1f}s, "
                 f"search p99 {ph['search_during_updates']['p99_ms']} ms")
        t0 = time.perf_counter()
        ix.maintain()  # the queued jobs run out (spfresh); nothing else running after
        rec["drain_s"] = time.perf_counter() - t0
        engines[engine] = rec
        final_ix[engine] = ix
    if "spann" in args.engines:
        statics = static_builds(args, final_ix, len(live))
        for name, params in statics.items():
            d = root / name
            ix = make_index(vectide, "spann", d, dim, metric, args.threads, args.nprobe, params)
            _log(f"{name}: static build on the final {len(live)} points (head_ratio "
                 f"{params.get('head_ratio', 'default')})")
            t_build = add_batches(ix, live, X, len(live))
            engines[name] = {"build_s": t_build, "params": dict(params)}
            final_ix[name] = ix
    _log(f"final quality over {len(Q)} queries, engines taking turns: {', '.join(final_ix)}")
    for e, q in quality(final_ix, Q, truth, args.nprobe).items():
        engines[e]["final"] = q
        engines[e]["stats"] = dict(final_ix[e].stats())
        engines[e]["live"] = len(final_ix[e])
        _log(f"{e}: recall@10 {q['recall10']:.4f}, p99.9 {q['p999_ms']:.2f} ms, "
             f"blocks/query {q['blocks_per_query']}")
    final_ix.clear()
    if not args.dir:
        shutil.rmtree(root, ignore_errors=True)

    def fin(e, k):
        return engines.get(e, {}).get("final", {}).get(k)

    def ratio(a, b):
        return a / b if a is not None and b else None

    def gap(a, b):
        return None if fin(a, "recall10") is None or fin(b, "recall10") is None \
            else 100.0 * (fin(a, "recall10") - fin(b, "recall10"))

    s_st = engines.get("spfresh", {}).get("stats", {})
    ev, mv = s_st.get("reassign_evaluated"), s_st.get("reassign_moved")
    summary = {
        "static_recall10": fin("spann", "recall10"),
        "spfresh_recall10": fin("spfresh", "recall10"),
        "inplace_recall10": fin("spann-inplace", "recall10"),
        "recall_gap_vs_static_points": gap("spann", "spfresh"),
        "inplace_recall_gap_vs_static_points": gap("spann", "spann-inplace"),
        "p999_ratio_vs_static": ratio(fin("spfresh", "p999_ms"), fin("spann", "p999_ms")),
        "inplace_p999_ratio_vs_static": ratio(fin("spann-inplace", "p999_ms"), fin("spann", "p999_ms")),
        "p99_ratio_vs_static": ratio(fin("spfresh", "p99_ms"), fin("spann", "p99_ms")),
        "static_postings": stat(engines.get("spann", {}).get("stats", {}), "postings"),
        "spfresh_postings": stat(s_st, "postings"),
        # The static build at the engine's default head_ratio (more, shorter
        # postings than SPFresh keeps), reported beside the matched one.
        "static_default_recall10": fin(DEFAULT_STATIC, "recall10"),
        "recall_gap_vs_static_default_points": gap(DEFAULT_STATIC, "spfresh"),
        "p999_ratio_vs_static_default": ratio(fin("spfresh", "p999_ms"), fin(DEFAULT_STATIC, "p999_ms")),
        "p99_ratio_vs_static_default": ratio(fin("spfresh", "p99_ms"), fin(DEFAULT_STATIC, "p99_ms")),
        "split_fraction": s_st.get("split_fraction"),
        "reassign_moved_over_evaluated": ratio(mv, ev),
        "cascade_max": s_st.get("cascade_max"),
        "posting_records_max": s_st.get("posting_records_max"),
        "posting_records_mean": s_st.get("posting_records_mean"),
        "changed_over_initial": changed / max(len(base), 1),
    }
    summary.update(crash_figures(args.crash_json))
    return {
        "benchmark": "spfresh",
        "dataset": args.dataset,
        "metric": metric,
        "points": int(len(X)),
        "initial": int(len(base)),
        "final": int(len(live)),
        "queries": int(len(Q)),
        "nprobe": args.nprobe,
        "params": dict(args.param),
        "static_heads": args.static_heads,
        "threads": args.threads,
        "batch": args.batch,
        "o_direct": "reported by the block file (VECTIDE_IO unset: io_uring + O_DIRECT where the file system takes it)",
        "machine": machine_info(),
        "engines": engines,
        "summary": summary,
    }


def plot(res: Dict[str, object], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(1, 2, figsize=(11, 4))
    for e, rec in res["engines"].items():
        ph = rec.get("phases") or []
        if ph:
            ax[0].plot([p["phase"] for p in ph], [p["search_during_updates"]["p99_ms"] for p in ph], marker="o", label=e)
            ax[1].plot([p["phase"] for p in ph], [p["posting_records_max"] for p in ph], marker="o", label=e)
    ax[0].set_xlabel("phase")
    ax[0].set_ylabel("P99 search latency during updates (ms)")
    ax[1].set_xlabel("phase")
    ax[1].set_ylabel("longest posting (records)")
    for a in ax:
        a.legend()
        a.grid(alpha=0.3)
    fig.suptitle(f"SPFresh stream on {res['dataset']} (nprobe {res['nprobe']}, {res['threads']} threads)")
    fig.tight_layout()
    fig.savefig(out / "spfresh-stream.png", dpi=120)
    plt.close(fig)


def _ints(s: str) -> List[int]:
    return [int(x) for x in s.split(",") if x]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m vectide.bench spfresh", description=__doc__.split("\n\n")[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", default="glove-6b-50-angular")
    p.add_argument("--clusters", type=int, default=64)
    p.add_argument("--initial", type=int, default=32, help="clusters the indexes are built on")
    p.add_argument("--phases", type=int, default=10)
    p.add_argument("--nprobe", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch", type=int, default=1000, help="rows per insert or delete call")
    p.add_argument("--queries", type=int, default=10_000)
    p.add_argument("--limit", type=int, default=0, help="use the first N points only (quick runs)")
    p.add_argument("--engines", type=lambda s: [e for e in s.split(",") if e], default=list(ENGINES))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--param", type=_param, action="append", default=[], metavar="NAME=VALUE",
                   help="an engine parameter given to every engine (repeatable), e.g. head_ratio=0.05")
    p.add_argument("--static-heads", choices=("matched", "both", "default"), default="both",
                   help="the static spann's head_ratio: SPFresh's final postings per live point (matched), "
                        "the engine default, or both (the summary's static figures are the matched build's)")
    p.add_argument("--dir", default=None, help="directory for the indexes (default: a temp dir, removed)")
    p.add_argument("--crash-json", default=None, help="a `vectide crash-test spfresh --json` report to fold into the summary")
    p.add_argument("--out", required=True)
    p.add_argument("--plot", default=None)
    args = p.parse_args(argv)
    if not 0 < args.initial < args.clusters:
        p.error("--initial must be between 0 and --clusters")
    bad = [e for e in args.engines if e not in ENGINES]
    if bad:
        p.error(f"unknown engines {bad}: choose among {', '.join(ENGINES)}")
    if min(args.phases, args.nprobe, args.threads, args.batch, args.queries) < 1:
        p.error("--phases, --nprobe, --threads, --batch and --queries take values of at least 1")
    res = run(args)
    write_json(res, args.out)
    if args.plot:
        plot(res, Path(args.plot))
    print(json.dumps(res["summary"], indent=2))
    return 0
