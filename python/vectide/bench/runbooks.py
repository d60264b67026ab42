"""Runbook benchmark: big-ann-benchmarks streaming runbooks over every engine.

``python -m vectide.bench runbook --dataset NAME|PATH --runbook FILE.yaml|GENERATOR
[--engines LIST] [--knob V] [--queries 1000] --out FILE.json [--plot DIR]``

Method
------
* The runbook (a YAML file, or a generator: ``clustered``, ``sliding-window``,
  ``expiration``, ``churn:P``) is checked against the dataset before
  anything runs. A generated one is written next to the results as YAML;
  ``clustered`` also fixes the row order its ranges refer to (k-means into 64
  clusters, seed 0), kept with its YAML in
  ``$VECTIDE_DATA/runbooks/<dataset>/clustered-<max_pts>-s<seed>.npz``: its
  ranges name rows of that order, not of the dataset's own.
* Ground truth of every search step is exact over the active set (ids and
  the rows they hold after replaces), computed with Vectide's ``flat``
  engine, and cached under ``$VECTIDE_DATA/runbooks/`` keyed by the dataset
  file, the row order and the runbook's text.
* Every engine runs in a worker process of its own (``streaming.py``),
  alone on the machine, with the same threads: ``--update-threads`` (2) for
  inserts, deletes and consolidation, one query per call from one loop for
  searches. The worker times each operation itself; ``seconds`` is the sum
  of an engine's operation times (inserts, deletes, consolidations,
  searches), excluding ground truth, process start and data loading.
* Per step: seconds, update throughput (points / s, consolidation included),
  and for searches recall@k, QPS, mean and P99 latency; memory is the
  worker's resident set above its size before the engine was created.
* The search knob of every engine is fixed for the whole run (``--knob``: L
  for the Vamana family, ef for HNSW, one value for all; ``--nprobe`` for
  IVF), and the Vamana family is built with the same R, L and alpha.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from .. import datasets
from .. import runbook as rbmod
from .ann import machine_info, simd_isa, write_json
from .metrics import recall_at_k
from .streaming import POLICIES, StreamError, Worker

PEER_ENGINES = ("hnswlib", "diskann", "svs", "faiss-ivf")
#: The Vamana family's shared build parameters (FreshDiskANN §6.2).
VAMANA = {"r": 64, "l_build": 75, "alpha": 1.2}
HNSW = {"m": 16, "ef_construction": 200}


def streaming_engines() -> List[str]:
    """Every registered approximate Vectide engine (one with a search knob)
    that runs in memory or is an SSD index (``medium`` ``ssd``: its
    directory is a temporary one), as ``vectide:NAME``. The
    persistent-memory engine and the durable in-RAM baselines of its paper
    (P-HNSW, hnsw-snap, hnsw-wal) join on request through ``--engines``."""
    import vectide

    return [
        f"vectide:{e['name']}"
        for e in vectide.engines()
        if e["primary_knob"] and (not e["in_directory"] or e["medium"] == "ssd")
    ]


def default_engines() -> List[str]:
    return streaming_engines() + list(PEER_ENGINES)


def peers_python() -> str:
    """The interpreter of ``.venv-peers`` (diskannpy 0.7.0 pins numpy 1.25)."""
    venv = os.environ.get("VECTIDE_PEERS_VENV", ".venv-peers")
    return str(Path(venv) / "bin" / "python")


def python_for(engine: str) -> str:
    return peers_python() if engine == "diskann" else sys.executable


def split_engine(engine: str) -> Tuple[str, Dict[str, object]]:
    """``vectide:NAME@key=value@key=value`` → (``vectide:NAME``, overrides):
    a variant of a Vectide engine with some build parameters changed (say
    ``vectide:hnsw@repair_alpha=1.2``), run and reported under its full
    name beside the plain engine. Values parse as int, then float, else
    stay strings; the engine checks the names (an unknown one is an error)."""
    base, *pairs = engine.split("@")
    overrides: Dict[str, object] = {}
    for pair in pairs:
        key, eq, raw = pair.partition("=")
        if not eq or not key or not raw:
            raise ValueError(f"engine variant {engine!r}: expected NAME@key=value, got {pair!r}")
        if key in overrides:
            raise ValueError(f"engine variant {engine!r} sets {key!r} twice")
        value: object = raw
        for conv in (int, float):
            try:
                value = conv(raw)
                break
            except ValueError:
                pass
        overrides[key] = value
    if overrides and not base.startswith("vectide:"):
        raise ValueError(f"engine variant {engine!r}: only vectide:ENGINE takes @key=value")
    return base, overrides


def check_engines(engines: Sequence[str]) -> None:
    """Every name must be a registered streaming engine (or a variant of
    one) or a peer, and none listed twice; raises ``ValueError``."""
    if len(set(engines)) != len(engines):
        raise ValueError("an engine is listed twice")
    known = streaming_engines()
    for e in engines:
        base, _ = split_engine(e)
        if base not in known and base not in PEER_ENGINES:
            raise ValueError(f"unknown streaming engine {e!r}; known: {', '.join(known + list(PEER_ENGINES))} "
                             "(a Vectide engine also as vectide:NAME@param=value)")
    if "diskann" in engines and not Path(peers_python()).exists():
        raise ValueError(f"diskann runs under {peers_python()} (diskannpy 0.7.0 pins numpy 1.25), which does "
                         "not exist: run `make venv`, or set VECTIDE_PEERS_VENV")


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _bar(total: int, desc: str):
    try:
        from tqdm import tqdm

        return tqdm(total=total, desc=desc, unit="step", file=sys.stderr, leave=False,
                    disable=not sys.stderr.isatty())
    except ImportError:  # pragma: no cover
        return None


class Prepared:
    """The dataset as the workers read it: rows in runbook order (unit
    length for cosine) and queries, as ``.npy`` files in ``directory``."""

    def __init__(self, ds, order: Optional[np.ndarray], nq: int, directory: Path) -> None:
        self.metric = ds.metric
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.data_path = directory / "data.npy"
        self.queries_path = directory / f"queries-{nq}.npy"
        stamp = directory / "stamp.json"
        want = {"source": str(ds.path), "mtime": os.stat(ds.path).st_mtime_ns, "order": _digest(order), "nq": nq}
        have = json.loads(stamp.read_text()) if stamp.exists() else None
        if have != want or not self.data_path.exists() or not self.queries_path.exists():
            x = np.ascontiguousarray(ds.train if order is None else ds.train[order], dtype=np.float32)
            q = np.ascontiguousarray(ds.test[:nq], dtype=np.float32)
            if self.metric == "cosine":
                x, q = datasets._normalize(x), datasets._normalize(q)
            _save_npy(self.data_path, x)
            _save_npy(self.queries_path, q)
            stamp.write_text(json.dumps(want))
        self.data = np.load(self.data_path, mmap_mode="r")
        self.queries = np.load(self.queries_path)


def _save_npy(path: Path, a: np.ndarray) -> None:
    tmp = path.with_name(path.name + ".tmp.npy")
    np.save(tmp, a)
    os.replace(tmp, path)


def _digest(order: Optional[np.ndarray]) -> Optional[str]:
    return None if order is None else hashlib.sha256(np.ascontiguousarray(order).tobytes()).hexdigest()[:16]


def ground_truth(prep: Prepared, rb: rbmod.Runbook, k: int, cache: Path) -> List[np.ndarray]:
    """Exact top-``k`` over the active set at every search step (cached)."""
    # The row order is part of the key: the same ranges over another order
    # (stability's random one, clustered's) are other points.
    key = hashlib.sha256(
        (rbmod.dump(rb) + f"|k={k}|nq={len(prep.queries)}|rows={prep.directory.name}").encode()
    ).hexdigest()[:16]
    path = cache / f"gt-{key}.npz"
    if path.exists():
        with np.load(path) as z:
            return [z[f"s{i}"] for i in range(len(z.files))]
    n = len(prep.data)
    row_of = np.full(n, -1, dtype=np.int64)  # id -> row it holds (-1: inactive)
    out: List[np.ndarray] = []
    searches = sum(s.operation == "search" for s in rb.steps)
    seen: Dict[str, np.ndarray] = {}
    distance = {"cosine": "angular", "l2": "euclidean", "ip": "dot"}[prep.metric]
    _log(f"ground truth for {searches} search steps (flat, cached in {path})")
    for s in rb.steps:
        if s.operation == "insert":
            row_of[s.start : s.end] = np.arange(s.start, s.end)
        elif s.operation == "delete":
            row_of[s.start : s.end] = -1
        elif s.operation == "replace":
            row_of[s.tags_start : s.tags_end] = np.arange(s.ids_start, s.ids_end)
        else:
            ids = np.flatnonzero(row_of >= 0)
            state = hashlib.sha256(ids.tobytes() + row_of[ids].tobytes()).hexdigest()
            if state not in seen:
                rows = np.asarray(prep.data[row_of[ids]])
                nb, _ = datasets.ground_truth(rows, prep.queries, k=min(k, len(ids)), distance=distance, progress=False)
                seen[state] = ids[nb]
            out.append(seen[state])
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez(tmp, **{f"s{i}": a for i, a in enumerate(out)})
    os.replace(tmp, path)
    return out


def run_engine(
    engine: str,
    prep: Prepared,
    rb: rbmod.Runbook,
    truth: List[np.ndarray],
    k: int,
    knob: int,
    nprobe: int,
    update_threads: int,
    workdir: Path,
    settle_after_deletes: bool = False,
    calibrate: Sequence[int] = (),
    target: float = 0.95,
) -> Dict[str, object]:
    """Runs the runbook on one engine; returns its result document.

    ``settle_after_deletes``: wait for the engine's consolidation after each
    delete step (the stability benchmark). ``calibrate``: at the first search
    step, try these knob values in order and keep the first whose recall@k
    reaches ``target`` (the largest when none does) for the rest of the run."""
    name = engine
    engine, overrides = split_engine(name)
    params = dict(VAMANA) if engine in ("diskann", "svs", "vectide:fresh-vamana") else dict(HNSW)
    params["l_search"] = knob if not calibrate else int(calibrate[0])
    if engine == "faiss-ivf":
        params = {"nlist": _nlist(rb.max_pts)}
    spec = {"dim": int(prep.data.shape[1]), "metric": prep.metric, "capacity": int(rb.max_pts),
            "update_threads": update_threads, "params": params, "overrides": overrides}
    sample = None
    if engine == "faiss-ivf":  # the quantiser's training sample (untimed)
        rng = np.random.default_rng(0)
        pick = np.sort(rng.choice(len(prep.data), size=min(len(prep.data), 50 * spec["params"]["nlist"]), replace=False))
        sample = workdir / "ivf-train.npy"
        _save_npy(sample, np.asarray(prep.data[pick]))
    w = Worker(engine, python_for(engine), str(workdir / f"{name.replace(':', '_')}.log"))
    try:
        opened = w.call(op="open", engine=engine, spec=spec, data=str(prep.data_path), queries=str(prep.queries_path),
                        train_sample=None if sample is None else str(sample))
        knob_value = nprobe if opened["knob"] == "nprobe" else knob
        base = opened["rss_base"]
        steps: List[Dict[str, object]] = []
        totals = {"insert": 0.0, "delete": 0.0, "replace": 0.0, "consolidate": 0.0, "search": 0.0}
        si = 0
        calibration = None
        bar = _bar(len(rb.steps), name)
        for num, s in enumerate(rb.steps, 1):
            row: Dict[str, object] = {"step": num, "operation": s.operation}
            if s.operation in ("insert", "delete"):
                ans = w.call(op=s.operation, start=s.start, end=s.end, settle=settle_after_deletes and s.operation == "delete")
                count = s.end - s.start
            elif s.operation == "replace":
                ans = w.call(op="replace", start=s.tags_start, end=s.tags_end, rows_start=s.ids_start, rows_end=s.ids_end)
                count = s.tags_end - s.tags_start
            else:
                res = workdir / "result.npy"
                if calibrate and si == 0 and opened["knob"]:
                    sweep = []
                    for v in calibrate:  # untimed: choosing the knob is set-up
                        w.call(op="search", knob=int(v), k=k, result=str(res))
                        sweep.append({"knob": int(v), "recall": recall_at_k(np.load(res), truth[si], k)})
                        if sweep[-1]["recall"] >= target:
                            break
                    knob_value = sweep[-1]["knob"]
                    calibration = {"target": target, "sweep": sweep, "chosen": knob_value}
                ans = w.call(op="search", knob=knob_value, k=k, result=str(res))
                found = np.load(res)
                lat = np.asarray(ans.pop("latencies"))
                total = float(lat.sum())
                totals["search"] += total
                row.update(
                    recall=recall_at_k(found, truth[si], k),
                    recall5at5=recall_at_k(found[:, :5], truth[si][:, :5], 5) if k >= 5 else None,
                    qps=len(lat) / total if total > 0 else None,
                    mean_latency_us=1e6 * float(lat.mean()),
                    p99_latency_us=1e6 * float(np.percentile(lat, 99)),
                    seconds=total,
                )
                si += 1
            if s.operation != "search":
                op_s, cons_s = ans["op_s"], ans["consolidate_s"]
                totals[s.operation] += op_s
                totals["consolidate"] += cons_s
                row.update(points=count, seconds=op_s + cons_s, consolidate_s=cons_s,
                           points_per_s=count / (op_s + cons_s) if op_s + cons_s > 0 else None)
            row["memory_bytes"] = int(ans["rss"]) - int(base)
            if "engine_stats" in ans:
                row["engine_stats"] = ans["engine_stats"]
            steps.append(row)
            if bar is not None and not bar.disable:
                bar.update(1)
                if s.operation == "search":
                    bar.set_postfix(recall=f"{row['recall']:.3f}")
            elif s.operation == "search":  # not a terminal: a line per search step
                _log(f"{name}: step {num}/{len(rb.steps)}: recall@{k} {row['recall']:.4f}, "
                     f"{row['qps']:.0f} qps, memory {row['memory_bytes'] / 1e6:.0f} MB")
        if bar is not None:
            bar.close()
        recalls = [r["recall"] for r in steps if r["operation"] == "search"]
        return {
            "params": opened["params"],
            "consolidation_policy": opened["policy"],
            "search_knob": {opened["knob"]: knob_value} if opened["knob"] else {},
            "calibration": calibration,
            "steps": steps,
            "avg_recall": float(np.mean(recalls)) if recalls else None,
            "min_recall": float(np.min(recalls)) if recalls else None,
            "seconds": float(sum(totals.values())),
            "seconds_by_operation": totals,
            "peak_memory_bytes": max(r["memory_bytes"] for r in steps) if steps else 0,
        }
    finally:
        w.close()


def _nlist(max_pts: int) -> int:
    """IVF lists: about 4·sqrt(points), a power of two (faiss's guideline)."""
    return int(2 ** round(np.log2(max(16.0, 4 * np.sqrt(max_pts)))))


def load_runbook(spec: str, ds, max_pts: int, seed: int, cache: Path):
    """``(runbook, order, source)`` for a YAML path or a generator name."""
    n = len(ds.train)
    if os.path.exists(spec):
        rb = rbmod.load(spec, None)
        rbmod.check(rb, n)
        return rb, None, {"file": os.path.abspath(spec)}
    if spec == "clustered":
        path = cache / f"clustered-{min(max_pts, n)}-s{seed}.npz"
        if path.exists():
            with np.load(path) as z:
                order, text = z["order"], str(z["yaml"])
            rb = rbmod.loads(text)
        else:
            _log(f"clustered: k-means of {n} rows into 64 clusters (seed {seed})")
            rb, order, _ = rbmod.clustered(ds.train if ds.metric != "cosine" else datasets._normalize(ds.train),
                                           f"{ds.name}-clustered", max_pts=max_pts, seed=seed)
            tmp = path.with_name(path.name + ".tmp.npz")
            np.savez(tmp, order=order, yaml=np.array(rbmod.dump(rb)))
            os.replace(tmp, path)
        rbmod.check(rb, n)
        return rb, order, {"generator": "clustered", "seed": seed, "clusters": 64}
    if spec in rbmod.GENERATORS or spec.startswith("churn:"):
        rb = rbmod.generate(spec, n, ds.name, max_pts=max_pts, seed=seed)
        return rb, None, {"generator": spec, "seed": seed}
    raise rbmod.RunbookError(
        f"--runbook {spec!r} is neither a file nor a generator (known: {', '.join(rbmod.GENERATORS)})"
    )


def run(args: argparse.Namespace) -> Dict[str, object]:
    engines = [e for e in args.engines.split(",") if e] if args.engines else default_engines()
    check_engines(engines)
    ds = datasets.load(args.dataset)
    cache = datasets.data_dir() / "runbooks" / ds.name
    cache.mkdir(parents=True, exist_ok=True)
    rb, order, source = load_runbook(args.runbook, ds, args.max_pts, args.seed, cache)
    counts = rbmod.check(rb, len(ds.train))
    nq = min(args.queries, len(ds.test))
    prep = Prepared(ds, order, nq, cache / (f"order-{_digest(order)}" if order is not None else "rows"))
    truth = ground_truth(prep, rb, args.k, cache)
    out_path = Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    (out_path.with_suffix(".runbook.yaml")).write_text(rbmod.dump(rb))
    _log(f"{ds.name}: {len(ds.train)} rows, {nq} queries, {prep.metric}; runbook {counts}; engines {engines}")
    results: Dict[str, object] = {}
    workdir = cache / "work"
    workdir.mkdir(exist_ok=True)
    for e in engines:
        t0 = time.perf_counter()
        results[e] = run_engine(e, prep, rb, truth, args.k, args.knob, args.nprobe, args.update_threads, workdir)
        r = results[e]
        _log(f"{e}: avg recall@{args.k} {r['avg_recall']:.4f} (min {r['min_recall']:.4f}), "
             f"{r['seconds']:.1f} s of operations ({time.perf_counter() - t0:.0f} s wall), "
             f"peak memory {r['peak_memory_bytes'] / 1e6:.0f} MB")
    doc = {
        "benchmark": "runbook",
        "dataset": ds.name,
        "dataset_path": str(ds.path),
        "metric": prep.metric,
        "runbook": {**source, "max_pts": rb.max_pts, "steps": len(rb.steps), **counts,
                    "yaml": str(out_path.with_suffix(".runbook.yaml"))},
        "k": args.k,
        "queries_per_search": nq,
        "threads": {"updates": args.update_threads, "searches": 1},
        "build_params": {"vamana_family": VAMANA, "hnsw_family": HNSW},
        "search_knob": {"L_or_ef": args.knob, "nprobe": args.nprobe},
        "policies": {e: results[e]["consolidation_policy"] for e in engines},
        "seconds_definition": "sum of the engine's operation times (inserts, deletes, replaces, consolidations, "
        "searches) measured inside its worker; ground truth, process start and data loading excluded",
        "memory_method": "worker process RSS (/proc/self/statm) minus its RSS before the engine was created",
        "machine": machine_info(),
        "simd": simd_isa(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "engines": results,
        "summary": {
            f"avg_recall{args.k}": {e: results[e]["avg_recall"] for e in engines},
            "seconds": {e: results[e]["seconds"] for e in engines},
            "peak_memory_bytes": {e: results[e]["peak_memory_bytes"] for e in engines},
        },
    }
    write_json(doc, out_path)
    _log(f"wrote {out_path}")
    if args.plot:
        plot(doc, Path(args.plot))
    return doc


def plot(doc: Dict[str, object], directory: Path) -> None:
    """Recall@k and QPS per search step, one line per engine."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    for name, r in doc["engines"].items():
        pts = [(i, s) for i, s in enumerate([s for s in r["steps"] if s["operation"] == "search"])]
        axes[0].plot([i for i, _ in pts], [s["recall"] for _, s in pts], marker=".", label=name)
        axes[1].plot([i for i, _ in pts], [s["qps"] for _, s in pts], marker=".", label=name)
    axes[0].set_ylabel(f"recall@{doc['k']}")
    axes[1].set_ylabel("QPS (1 thread)")
    axes[1].set_xlabel("search step")
    axes[0].set_title(f"runbook {doc['runbook'].get('generator', 'file')} on {doc['dataset']}")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    path = directory / "runbook.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    _log(f"wrote {path}")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dataset", required=True, help="dataset name or HDF5 path")
    p.add_argument("--runbook", required=True, help="runbook YAML file or generator "
                   "(clustered, sliding-window, expiration, churn:P)")
    p.add_argument("--engines", default=None, help="comma-separated; default: every Vectide streaming engine "
                   "and the peers " + ",".join(PEER_ENGINES))
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--queries", type=int, default=1000, help="queries per search step")
    p.add_argument("--knob", type=int, default=100, help="L (Vamana family) or ef (HNSW) for every search")
    p.add_argument("--nprobe", type=int, default=32, help="IVF lists probed (faiss-ivf)")
    p.add_argument("--update-threads", type=int, default=2)
    p.add_argument("--max-pts", type=int, default=200_000, help="for generators")
    p.add_argument("--seed", type=int, default=0, help="for generators")
    p.add_argument("--out", required=True)
    p.add_argument("--plot", default=None, metavar="DIR")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m vectide.bench runbook", description=__doc__.split("\n")[0])
    add_arguments(p)
    args = p.parse_args(argv)
    if args.k < 1 or args.queries < 1 or args.knob < 1 or args.nprobe < 1 or args.update_threads < 1:
        p.error("--k, --queries, --knob, --nprobe and --update-threads must be >= 1")
    try:
        run(args)
    except (rbmod.RunbookError, StreamError, ValueError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0
