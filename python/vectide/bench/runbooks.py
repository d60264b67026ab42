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
  ``$VECTIDE_DATA/runbooks/<dataset>/clustered-<max_pts>-s<seed>-q.npz``: its
  ranges name rows of that order, not of the dataset's own.
* The harness core (``vectide_harness``, through the extension; the CLI's
  ``vectide runbook`` runs the same code) checks the runbook, computes the
  ground truth and runs Vectide's engines; this file prepares the data,
  drives the peers by the same plan and writes the result with the core's
  report.
* Ground truth of every search step is exact over the active set (ids and
  the rows they hold after replaces), computed by the core with the
  registry's exact engine, and cached under ``$VECTIDE_DATA/runbooks/``
  keyed by the runbook's text, the row order and the query count.
* Every engine runs in a worker process of its own (``streaming.py``),
  alone on the machine, with the same threads: ``--update-threads`` (2) for
  inserts, deletes and consolidation, one query per call from one loop for
  searches. A Vectide engine's worker runs the core's timed loop (one
  native ``search_into`` per query); a peer's worker times its library's
  calls from Python. ``seconds`` is the sum of an engine's operation times
  (inserts, deletes, consolidations, searches), excluding ground truth,
  process start and data loading.
* Per step: seconds, update throughput (points / s, consolidation included),
  and for searches recall@k, QPS, mean and P99 latency; memory is the
  worker's resident set above its size before the engine was created.
* The search knob of every engine is fixed for the whole run (``--knob``: L
  for the Vamana family, ef for HNSW, one value for all; ``--nprobe`` for
  the engines that probe lists: Vectide's SPANN family and faiss's IVF), and
  each family is built with the same parameters (the core's: R, L and alpha;
  M and efConstruction).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np

from .. import _vectide as core
from .. import datasets
from .. import runbook as rbmod
from .ann import machine_info, write_json
from .metrics import recall_at_k
from .streaming import PEERS, StreamError, Worker

PEER_ENGINES = tuple(PEERS)
#: The build parameters of each family, the core's (FreshDiskANN §6.2 for
#: the Vamana family); the peers of a family get the same.
FAMILIES = json.loads(core.runbook_build_params())
VAMANA = FAMILIES["vamana_family"]
HNSW = FAMILIES["hnsw_family"]


def streaming_engines() -> List[str]:
    """The harness core's default set, as ``vectide:NAME``: every registered
    approximate Vectide engine (one with a search knob) that runs in memory
    or is an SSD index (its directory is a temporary one). The
    persistent-memory engine and the durable in-RAM baselines of its paper
    (P-HNSW, hnsw-snap, hnsw-wal) join on request through ``--engines``."""
    return list(core.runbook_default_engines())


def default_engines() -> List[str]:
    return streaming_engines() + list(PEER_ENGINES)


def peers_python() -> str:
    """The interpreter of ``.venv-peers`` (diskannpy 0.7.0 pins numpy 1.25)."""
    venv = os.environ.get("VECTIDE_PEERS_VENV", ".venv-peers")
    return str(Path(venv) / "bin" / "python")


def python_for(engine: str) -> str:
    return peers_python() if engine == "diskann" else sys.executable


def check_engines(engines: Sequence[str]) -> None:
    """Every name must be a Vectide engine as the core resolves it
    (``vectide:NAME`` or a variant ``vectide:NAME@key=value``) or a peer,
    and none listed twice; raises ``ValueError`` naming the problem."""
    if len(set(engines)) != len(engines):
        raise ValueError("an engine is listed twice")
    for e in engines:
        if e.startswith("vectide:"):
            core.runbook_engine(e)  # the core's own message
        elif "@" in e:
            raise ValueError(f"engine variant {e!r}: only vectide:ENGINE takes @key=value")
        elif e not in PEER_ENGINES:
            raise ValueError(f"unknown streaming engine {e!r}; known: vectide:ENGINE (vectide engines), "
                             f"{', '.join(PEER_ENGINES)}")
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


class Truth(list):
    """Per search step an ``(nq, k')`` uint64 array, or ``None``; ``path``
    is the cache file that holds the same arrays (handed to the native
    runner's worker as it is)."""

    def __init__(self, arrays, path: Path):
        super().__init__(arrays)
        self.path = path


def ground_truth(prep: Prepared, rb: rbmod.Runbook, k: int, cache: Path) -> Truth:
    """Exact top-``k`` over the active set at every search step, from the
    harness core (cached): per search step an ``(nq, k')`` uint64 array
    (``k'`` = min(k, active)), or ``None`` where nothing is active."""
    # The row order is part of the key: the same ranges over another order
    # (stability's random one, clustered's) are other points.
    text = rbmod.dump(rb)
    key = hashlib.sha256(
        (text + f"|k={k}|nq={len(prep.queries)}|rows={prep.directory.name}").encode()
    ).hexdigest()[:16]
    path = cache / f"gt2-{key}.npz"
    if path.exists():
        return Truth(load_truth(path), path)
    searches = sum(s.operation == "search" for s in rb.steps)
    _log(f"ground truth for {searches} search steps (the harness core, cached in {path})")
    out = core.runbook_truth(text.encode(), np.asarray(prep.data), prep.queries, prep.metric, k)
    save_truth(path, out, len(prep.queries))
    return Truth(out, path)


def save_truth(path: Path, truth: List[Optional[np.ndarray]], nq: int) -> None:
    """An empty active set is stored as an ``(nq, 0)`` array."""
    tmp = path.with_name(path.name + ".tmp.npz")
    empty = np.zeros((nq, 0), dtype=np.uint64)
    np.savez(tmp, **{f"s{i}": empty if a is None else a for i, a in enumerate(truth)})
    os.replace(tmp, path)


def load_truth(path: Path) -> List[Optional[np.ndarray]]:
    with np.load(path) as z:
        arrays = [z[f"s{i}"] for i in range(len(z.files))]
    return [a if a.shape[1] else None for a in arrays]


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
    if engine.startswith("vectide:"):
        return _run_native(engine, prep, rb, truth, k, knob, nprobe, update_threads, workdir,
                           settle_after_deletes, calibrate, target)
    name = engine
    params = dict(VAMANA) if engine in ("diskann", "svs") else dict(HNSW)
    params["l_search"] = knob if not calibrate else int(calibrate[0])
    if engine == "faiss-ivf":
        params = {"nlist": _nlist(rb.max_pts)}
    spec = {"dim": int(prep.data.shape[1]), "metric": prep.metric, "capacity": int(rb.max_pts),
            "update_threads": update_threads, "params": params}
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
                        sweep.append({"knob": int(v), "recall": _recall(np.load(res), truth[si], k)})
                        if sweep[-1]["recall"] is not None and sweep[-1]["recall"] >= target:
                            break
                    knob_value = sweep[-1]["knob"]
                    calibration = {"target": target, "sweep": sweep, "chosen": knob_value}
                ans = w.call(op="search", knob=knob_value, k=k, result=str(res))
                found = np.load(res)
                lat = np.asarray(ans.pop("latencies"))
                total = float(lat.sum())
                totals["search"] += total
                t = truth[si]
                row.update(
                    recall=_recall(found, t, k),
                    recall5at5=_recall(found[:, :5], None if t is None else t[:, :5], 5) if k >= 5 else None,
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
        recalls = [r["recall"] for r in steps if r["operation"] == "search" and r["recall"] is not None]
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


def _recall(found: np.ndarray, truth: Optional[np.ndarray], k: int) -> Optional[float]:
    """recall@k, ``None`` where the active set was empty."""
    return None if truth is None else recall_at_k(found, truth.astype(np.int64), k)


def _run_native(engine, prep, rb, truth, k, knob, nprobe, update_threads, workdir, settle_after_deletes,
                calibrate, target) -> Dict[str, object]:
    """A Vectide engine in a worker of its own running the harness core's
    timed loop (the CLI's): the worker reads the data, the runbook and the
    ground truth from files and returns the engine's result document."""
    stem = engine.replace(":", "_")
    rb_path = workdir / f"{stem}.runbook.yaml"
    rb_path.write_text(rbmod.dump(rb))
    # The cache file when the truth came from one; else a file of our own.
    cached = getattr(truth, "path", None)
    own = cached is None or not Path(cached).exists()
    truth_path = workdir / f"{stem}.truth.npz" if own else Path(cached)
    if own:
        save_truth(truth_path, truth, len(prep.queries))
    w = Worker(engine, sys.executable, str(workdir / f"{stem}.log"), show_stderr=True)
    try:
        return w.call(op="native", engine=engine, runbook=str(rb_path), data=str(prep.data_path),
                      queries=str(prep.queries_path), metric=prep.metric, truth=str(truth_path), k=k,
                      knob=int(calibrate[0]) if calibrate else knob, nprobe=nprobe, update_threads=update_threads,
                      settle=settle_after_deletes, calibrate=[int(v) for v in calibrate], target=target,
                      workdir=os.environ.get("VECTIDE_BENCH_DIR"))["result"]
    finally:
        w.close()
        rb_path.unlink(missing_ok=True)
        if own:
            truth_path.unlink(missing_ok=True)


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
        # "-q": rows ordered by the quantization room's k-means (files
        # without it came from an earlier k-means and order other rows).
        path = cache / f"clustered-{min(max_pts, n)}-s{seed}-q.npz"
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
    head = {
        "benchmark": "runbook",
        "dataset": ds.name,
        "dataset_path": str(ds.path),
        "metric": prep.metric,
        "runbook": {**source, "max_pts": rb.max_pts, "steps": len(rb.steps), **counts,
                    "yaml": str(out_path.with_suffix(".runbook.yaml"))},
        "k": args.k,
        "queries_per_search": nq,
        "threads": {"updates": args.update_threads, "searches": 1},
        "search_knob": {"L_or_ef": args.knob, "nprobe": args.nprobe},
        "query_loop": "Vectide engines: the harness core's native loop (one search_into per query); "
        "peers: one library call per query from a Python loop",
        "ground_truth": "exact (the harness core, the registry's exact engine), once per distinct active set",
        "machine": machine_info(),
    }
    doc = json.loads(core.runbook_report(json.dumps(head), json.dumps(results)))
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
    p.add_argument("--nprobe", type=int, default=32, help="lists / postings probed (faiss-ivf, Vectide's SPANN family)")
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
