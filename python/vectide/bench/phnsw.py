"""P-HNSW benchmark: the paper's Figures 8, 9, 10 and 12 at our scale.

``python -m vectide.bench phnsw [--dataset glove-6b-50-angular] [--sizes 100000,200000,390000]
[--threads 1,2] [--runs 2] --out FILE.json [--plot DIR]``

Method
------
* **Insertion time (Fig. 8, 9).** For every prefix size and thread count,
  every engine builds the prefix from scratch with M=16, efConstruction=200,
  inserting chunks of 10,000 rows (the same calls for every engine):
  ``hnsw`` (volatile), ``p-hnsw`` (``persist="pmem"``, region files on
  ``/dev/shm``: DRAM-emulated persistent memory as in the paper, surviving a
  process crash but not a power loss — this machine has no DAX device),
  ``hnsw-snap`` (a full save every ``--snapshot-every`` rows) and
  ``hnsw-wal`` (buffered WAL, 1 MiB, fdatasync when full) — both on the local
  disk, as the paper's baselines were on SSD — and hnswlib as an outside
  reference. Each build runs ``--runs`` times, alternating the engine order;
  the faster run is kept.
* **Breakdown (Fig. 10).** p-hnsw's insert thread-time split into search
  (finding neighbours, deciding back-links), update (node and list writes,
  publication) and logging (NLog/NlistLog writes, persists, fences).
* **Search.** p-hnsw against hnsw at the largest size, one query per call
  from the same Python loop, three interleaved runs, best kept, at the same
  ``ef``.
* **Recovery (Fig. 12).** For every size and durable engine, a child process
  builds the prefix and keeps inserting (upserting once the rows run out);
  it is SIGKILLed mid-insert. Then ``vectide open-probe DIR`` runs in a fresh
  process: the figure is the wall time from its start to its first answered
  query (process start, open, recovery or snapshot load or WAL replay, one
  search), measured by this process around the child (median of three
  probes on copies of the crashed directory; one for hnsw-wal, whose replay
  rebuilds the graph).
* **msync.** Insert throughput of p-hnsw with ``persist="msync"`` (region files
  on the local disk) against hnsw-wal, building ``--msync-rows`` rows with 2
  threads each (and p-hnsw also with ``--msync-workers``), best of two
  alternating runs.
* **Crash test.** ``vectide crash-test p-hnsw --points P --kill-rounds K``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np

from .. import datasets
from .ann import _int_list, _log, _settle, machine_info, write_json

CHUNK = 10_000
DURABLE = ("p-hnsw", "hnsw-snap", "hnsw-wal")
BUILD_ENGINES = ("hnsw", "p-hnsw", "hnsw-snap", "hnsw-wal", "hnswlib")
EMULATION_NOTE = (
    "pmem figures are emulated: p-hnsw's region files live on /dev/shm (DRAM) and are made "
    "durable with clwb+sfence as on persistent memory; they survive a process crash, not a power "
    "loss (this machine has no DAX device). The paper's own figures were DRAM-emulated too."
)


def _cli() -> str:
    beside = Path(sys.executable).parent / "vectide"
    if beside.exists():
        return str(beside)
    found = shutil.which("vectide")
    if not found:
        raise RuntimeError("the vectide CLI is not installed (run make build)")
    return found


class Workdirs:
    """Scratch directories: one on /dev/shm (pmem emulation), one on disk."""

    def __init__(self) -> None:
        tag = f"vectide-phnsw-bench-{os.getpid()}"
        shm = Path("/dev/shm")
        self.pmem = (shm if shm.is_dir() else Path(datasets.data_dir())) / tag
        self.disk = Path(datasets.data_dir()) / tag
        self.n = 0

    def fresh(self, engine: str, persist: str = "pmem") -> Path:
        self.n += 1
        root = self.pmem if engine == "p-hnsw" and persist == "pmem" else self.disk
        d = root / f"{engine}-{self.n}"
        shutil.rmtree(d, ignore_errors=True)
        d.parent.mkdir(parents=True, exist_ok=True)
        return d

    def cleanup(self) -> None:
        shutil.rmtree(self.pmem, ignore_errors=True)
        shutil.rmtree(self.disk, ignore_errors=True)


def _params(engine: str, args, threads: int, persist: str = "pmem") -> Dict[str, object]:
    p: Dict[str, object] = dict(m=args.m, ef_construction=args.ef_construction, threads=threads)
    if engine == "p-hnsw":
        p["persist"] = persist
    if engine == "hnsw-snap":
        p["snapshot_every"] = args.snapshot_every
    return p


def build(engine: str, X: np.ndarray, metric: str, threads: int, args, dirs: Workdirs, persist: str = "pmem"):
    """Builds ``X`` in chunks; returns ``(seconds, index, path)``."""
    n = X.shape[0]
    ids = np.arange(n, dtype=np.uint64)
    _settle()
    if engine == "hnswlib":
        import hnswlib

        space = {"cosine": "cosine", "l2": "l2", "ip": "ip"}[metric]
        idx = hnswlib.Index(space=space, dim=X.shape[1])
        idx.init_index(max_elements=n, M=args.m, ef_construction=args.ef_construction, random_seed=100)
        t0 = time.perf_counter()
        for s in range(0, n, CHUNK):
            idx.add_items(X[s : s + CHUNK], ids[s : s + CHUNK], num_threads=threads)
        return time.perf_counter() - t0, idx, None
    import vectide

    path = dirs.fresh(engine, persist) if engine in DURABLE else None
    idx = vectide.Index(X.shape[1], metric, engine=engine, path=path, **_params(engine, args, threads, persist))
    t0 = time.perf_counter()
    for s in range(0, n, CHUNK):
        idx.add(ids[s : s + CHUNK], X[s : s + CHUNK])
    return time.perf_counter() - t0, idx, path


def _remove(path: Optional[Path]) -> None:
    """Removes an index directory (after the caller dropped its last reference)."""
    _settle()
    if path is not None:
        shutil.rmtree(path, ignore_errors=True)


def search_qps(indexes: Dict[str, object], Q: np.ndarray, efs: List[int], runs: int = 3) -> Dict[str, Dict[int, float]]:
    out: Dict[str, Dict[int, float]] = {name: {} for name in indexes}
    for ef in efs:
        for _ in range(runs):
            for name, idx in indexes.items():
                search = idx.search
                t0 = time.perf_counter()
                for q in Q:
                    search(q, k=10, ef=ef)
                qps = len(Q) / (time.perf_counter() - t0)
                out[name][ef] = max(out[name].get(ef, 0.0), qps)
    return out


CHILD = r"""
import json, sys
import numpy as np
import vectide
engine, path, n, threads, params, data, metric = sys.argv[1:8]
n, threads, params = int(n), int(threads), json.loads(params)
X = np.load(data, mmap_mode="r")
idx = vectide.Index(X.shape[1], metric, engine=engine, path=path, threads=threads, **params)
for s in range(0, n, 10000):
    e = min(n, s + 10000)
    idx.add(np.arange(s, e, dtype=np.uint64), np.asarray(X[s:e]))
print("built", flush=True)
i = n
while True:
    if i >= X.shape[0]:
        i = 0
    j = min(i + 100, X.shape[0])
    idx.add(np.arange(i, j, dtype=np.uint64), np.asarray(X[i:j]))
    i = j
"""


def crash_mid_insert(engine: str, path: Path, n: int, data: Path, metric: str, args, threads: int) -> None:
    """Builds ``n`` rows in a child process, then SIGKILLs it mid-insert."""
    params = _params(engine, args, threads)
    params.pop("threads")
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, engine, str(path), str(n), str(threads), json.dumps(params), str(data), metric],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = child.stdout.readline()
    if line.strip() != "built":
        child.kill()
        err = child.stderr.read()
        raise RuntimeError(f"{engine} child failed before the kill: {err[-2000:]}")
    time.sleep(args.kill_after)
    child.send_signal(signal.SIGKILL)
    child.wait()


def probe(path: Path, persist: str = "pmem") -> Dict[str, object]:
    """`vectide open-probe` in a fresh process, timed from spawn to its answer."""
    t0 = time.perf_counter()
    p = subprocess.Popen([_cli(), "open-probe", str(path), "--persist", persist], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    wall = time.perf_counter() - t0
    p.wait()
    if p.returncode != 0 or not line:
        raise RuntimeError(f"open-probe {path} failed: {p.stderr.read()[-2000:]}")
    info = json.loads(line)
    info["wall_ms"] = wall * 1e3
    return info


def recovery_times(X: np.ndarray, metric: str, args, dirs: Workdirs, sizes: List[int]) -> Dict[str, Dict[int, dict]]:
    data = dirs.disk / "train.npy"
    data.parent.mkdir(parents=True, exist_ok=True)
    np.save(data, X)
    out: Dict[str, Dict[int, dict]] = {e: {} for e in DURABLE}
    for n in sizes:
        for engine in DURABLE:
            path = dirs.fresh(engine)
            _log(f"recovery: {engine} n={n}: build in a child, SIGKILL mid-insert")
            crash_mid_insert(engine, path, n, data, metric, args, threads=max(args.threads))
            reps = 1 if engine == "hnsw-wal" else 3
            probes = []
            for _ in range(reps):
                copy = path.with_name(path.name + "-copy")
                shutil.rmtree(copy, ignore_errors=True)
                shutil.copytree(path, copy)
                probes.append(probe(copy))
                shutil.rmtree(copy, ignore_errors=True)
            probes.sort(key=lambda p: p["wall_ms"])
            med = probes[len(probes) // 2]
            out[engine][n] = {
                "ms": med["wall_ms"],
                "open_ms": med["open_ms"],
                "first_answer_ms": med["first_answer_ms"],
                "live_after": med["len"],
                "recovery": med.get("recovery"),
                "probes_ms": [p["wall_ms"] for p in probes],
            }
            _log(f"  {engine} n={n}: {med['wall_ms']:.1f} ms to the first answer ({med['len']} live)")
            shutil.rmtree(path, ignore_errors=True)
    data.unlink()
    return out


def run(args) -> dict:
    import vectide

    ds = datasets.load(args.dataset)
    metric = ds.metric
    X_all = np.ascontiguousarray(ds.train, dtype=np.float32)
    sizes = sorted({min(s, X_all.shape[0]) for s in args.sizes})
    big = sizes[-1]
    Q = np.ascontiguousarray(ds.test[: args.queries], dtype=np.float32)
    dirs = Workdirs()
    result: Dict[str, object] = {
        "dataset": ds.name,
        "metric": metric,
        "sizes": sizes,
        "threads": args.threads,
        "params": {"m": args.m, "ef_construction": args.ef_construction, "snapshot_every": args.snapshot_every,
                   "chunk": CHUNK, "runs": args.runs},
        "media": {"p-hnsw": "pmem-emulated (/dev/shm)", "hnsw-snap": "disk", "hnsw-wal": "disk"},
        "note": EMULATION_NOTE,
        "machine": machine_info(),
        "simd": vectide.simd_isa(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    parts = {x.strip() for x in args.parts.split(",") if x.strip()}
    unknown = parts - {"build", "recovery", "msync", "crash"}
    if unknown:
        raise ValueError(f"unknown parts {sorted(unknown)} (known: build, recovery, msync, crash)")
    engines = tuple(e.strip() for e in args.engines.split(",") if e.strip())
    if set(engines) - set(BUILD_ENGINES):
        raise ValueError(f"unknown engines {sorted(set(engines) - set(BUILD_ENGINES))}")
    rec: Dict[str, Dict[int, dict]] = {e: {} for e in DURABLE}
    ms: Dict[str, float] = {}
    crash = None
    runs_all: Dict[str, Dict[str, Dict[str, List[float]]]] = {e: {} for e in engines}
    try:
        # ---- Fig. 8/9/10: insertion time, throughput, breakdown; search QPS.
        builds: Dict[str, Dict[str, Dict[str, float]]] = {e: {} for e in engines}
        breakdown: Dict[str, Dict[str, Dict[str, float]]] = {}
        qps: Dict[str, Dict[int, float]] = {}
        for n in (sizes if "build" in parts else []):
            X = X_all[:n]
            for t in args.threads:
                best_bd = None
                for r in range(args.runs):
                    order = engines if r % 2 == 0 else tuple(reversed(engines))
                    kept = {}
                    for engine in order:
                        secs, idx, path = build(engine, X, metric, t, args, dirs)
                        _log(f"build n={n} threads={t} run={r}: {engine} {secs:.2f} s")
                        runs_all[engine].setdefault(str(n), {}).setdefault(str(t), []).append(secs)
                        cell = builds[engine].setdefault(str(n), {})
                        if secs < cell.get(str(t), float("inf")):
                            cell[str(t)] = secs
                            if engine == "p-hnsw":
                                best_bd = idx.breakdown()
                        if n == big and t == 1 and r == args.runs - 1 and engine in ("hnsw", "p-hnsw"):
                            kept[engine] = (idx, path)
                        else:
                            idx = None
                            _remove(path)
                    if kept:
                        _log(f"search: hnsw vs p-hnsw at n={n}, {len(Q)} queries, ef {args.ef}")
                        qps = search_qps({k: v[0] for k, v in kept.items()}, Q, args.ef)
                        paths = [v[1] for v in kept.values()]
                        kept = None
                        idx = None
                        for path in paths:
                            _remove(path)
                if best_bd:
                    total = sum(best_bd.values()) or 1.0
                    breakdown.setdefault(str(n), {})[str(t)] = {
                        **{k: v for k, v in best_bd.items()},
                        **{f"{k}_share": v / total for k, v in best_bd.items()},
                    }
        result["build_s"] = builds
        result["build_runs_s"] = runs_all
        result["throughput_rows_per_s"] = {
            e: {n: {t: int(n) / s for t, s in per.items()} for n, per in v.items()} for e, v in builds.items()
        }
        result["breakdown"] = breakdown
        result["search_qps"] = {e: {str(ef): q for ef, q in v.items()} for e, v in qps.items()}

        # ---- Fig. 12: recovery after SIGKILL.
        if "recovery" in parts:
            rec = recovery_times(X_all, metric, args, dirs, sizes)
        result["recovery"] = {e: {str(n): v for n, v in per.items()} for e, per in rec.items()}

        # ---- msync mode against hnsw-wal (same rows; same threads, and p-hnsw
        # also with more workers than cores so that group commit has fences
        # of concurrent inserts to share).
        Xm = X_all[: args.msync_rows]
        runs_ms = [("hnsw-wal", 2), ("p-hnsw", 2)] + [("p-hnsw", t) for t in args.msync_workers if t != 2]
        for r in range(2 if "msync" in parts else 0):
            for engine, t in (runs_ms if r == 0 else list(reversed(runs_ms))):
                secs, idx, path = build(engine, Xm, metric, t, args, dirs, persist="msync")
                rate = len(Xm) / secs
                key = f"{engine}@{t}"
                _log(f"msync: {key} {len(Xm)} rows in {secs:.2f} s ({rate:.0f} rows/s)")
                ms[key] = max(ms.get(key, 0.0), rate)
                idx = None
                _remove(path)
        result["msync"] = {"rows": int(len(Xm)), "rows_per_s": ms,
                           "note": "p-hnsw makes every insert durable before it returns; hnsw-wal acknowledges "
                                   "before its buffered WAL is fdatasynced"}

        # ---- Crash test.
        if "crash" in parts and (args.crash_points > 0 or args.kill_rounds > 0):
            _log(f"crash test: {args.crash_points} simulator points, {args.kill_rounds} SIGKILL rounds")
            # The crash kit once per media: the simulator and SIGKILLs on
            # pmem (the default), SIGKILLs again on msync.
            runs = {}
            for media, points in (("pmem", args.crash_points), ("msync", 0)):
                p = subprocess.run(
                    [_cli(), "crash-test", "p-hnsw", "--json", "--param", f"persist={media}",
                     "--points", str(points), "--kill-rounds", str(args.kill_rounds)],
                    capture_output=True, text=True,
                )
                runs[media] = json.loads(p.stdout) if p.stdout.strip() else {"error": p.stderr[-2000:]}
            pm = runs["pmem"]
            crash = dict(pm)
            if all("kill" in r for r in runs.values()):
                crash["kill"] = dict(pm["kill"])
                crash["kill"]["rounds"] = sum(r["kill"]["rounds"] for r in runs.values())
                crash["kill"]["by_mode"] = {m: r["kill"] for m, r in runs.items()}
                crash["violations"] = sum(r.get("violations", 0) for r in runs.values())
            else:
                crash["violations"] = crash.get("violations") or 1
                crash["errors"] = {m: r.get("error") for m, r in runs.items() if "error" in r}
        result["crash_test"] = crash
    finally:
        dirs.cleanup()

    def b(e: str, t: int = 1) -> Optional[float]:
        return builds.get(e, {}).get(str(big), {}).get(str(t))

    def ratio(a, c):
        return (a / c) if (a is not None and c) else None

    ef0 = args.ef[0]
    snap = rec["hnsw-snap"].get(big, {}).get("ms")
    ph = rec["p-hnsw"].get(big, {}).get("ms")
    def paired_median(a: str, c: str, t: int = 1) -> Optional[float]:
        xa = runs_all.get(a, {}).get(str(big), {}).get(str(t), [])
        xc = runs_all.get(c, {}).get(str(big), {}).get(str(t), [])
        rs = sorted(x / y for x, y in zip(xa, xc) if y)
        return rs[len(rs) // 2] if rs else None

    result["summary"] = {
        "insert_overhead_vs_hnsw": ratio(b("p-hnsw"), b("hnsw")),
        "insert_overhead_vs_hnsw_paired_median": paired_median("p-hnsw", "hnsw"),
        "insert_overhead_vs_hnsw_2_threads": ratio(b("p-hnsw", 2), b("hnsw", 2)) if 2 in args.threads else None,
        "recovery_speedup_vs_snap": ratio(snap, ph),
        "recovery_speedup_vs_wal": ratio(rec["hnsw-wal"].get(big, {}).get("ms"), ph),
        "recovery_ms_by_n": {str(n): v["ms"] for n, v in rec["p-hnsw"].items()},
        "search_qps_ratio_vs_hnsw": ratio(qps.get("p-hnsw", {}).get(ef0), qps.get("hnsw", {}).get(ef0)),
        "search_qps_ratio_vs_hnsw_by_ef": {
            str(ef): ratio(qps.get("p-hnsw", {}).get(ef), qps.get("hnsw", {}).get(ef)) for ef in args.ef
        },
        "msync_insert_ratio_vs_wal": ratio(ms.get("p-hnsw@2"), ms.get("hnsw-wal@2")),
        "msync_insert_ratio_vs_wal_best_workers": ratio(max((v for k, v in ms.items() if k.startswith("p-hnsw")), default=None), ms.get("hnsw-wal@2")),
        "hnsw_build_ratio_vs_hnswlib": ratio(b("hnsw"), b("hnswlib")),
        "snap_build_ratio_vs_hnsw": ratio(b("hnsw-snap"), b("hnsw")),
        "wal_build_ratio_vs_hnsw": ratio(b("hnsw-wal"), b("hnsw")),
        "crash_points_checked": (crash or {}).get("crash_points_checked"),
        "kill_rounds": ((crash or {}).get("kill") or {}).get("rounds"),
        "kill_rounds_by_mode": {
            m: v.get("rounds") for m, v in (((crash or {}).get("kill") or {}).get("by_mode") or {}).items()
        },
        "violations": (crash or {}).get("violations"),
        "at_n": big,
        "search_ef": ef0,
    }
    return result


def format_report(r: dict) -> str:
    lines = [f"P-HNSW benchmark on {r['dataset']} ({r['metric']}); {r['note']}", ""]
    lines.append("insertion time, seconds (threads: " + ", ".join(map(str, r["threads"])) + ")")
    head = f"  {'engine':<11}" + "".join(f"{'n=' + str(n) + ' t=' + str(t):>18}" for n in r["sizes"] for t in r["threads"])
    lines.append(head)
    for e, per in r["build_s"].items():
        row = f"  {e:<11}"
        for n in r["sizes"]:
            for t in r["threads"]:
                v = per.get(str(n), {}).get(str(t))
                row += f"{(f'{v:.2f}' if v is not None else '-'):>18}"
        lines.append(row)
    lines.append("")
    lines.append("recovery after SIGKILL, ms from process start to the first answered query")
    for e, per in r["recovery"].items():
        lines.append(f"  {e:<11}" + "".join(f"  n={n}: {v['ms']:.1f}" for n, v in per.items()))
    lines.append("")
    for n, per in r["breakdown"].items():
        for t, bd in per.items():
            lines.append(
                f"p-hnsw insert breakdown n={n} t={t}: search {bd['search_share']:.1%}, "
                f"update {bd['update_share']:.1%}, logging {bd['logging_share']:.1%}"
            )
    lines.append(f"search QPS (one call per query): {json.dumps(r['search_qps'])}")
    lines.append(f"msync mode: {json.dumps(r['msync'])}")
    lines.append("")
    lines.append("summary")
    for k, v in r["summary"].items():
        lines.append(f"  {k}: {v}")
    return "\n".join(lines)


def plot(r: dict, outdir) -> List[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    written = []
    sizes = r["sizes"]
    # Fig. 8: insertion time vs size, 1 thread.
    fig, ax = plt.subplots(figsize=(7, 4.5))
    t0 = str(r["threads"][0])
    for e, per in r["build_s"].items():
        ys = [per.get(str(n), {}).get(t0) for n in sizes]
        ax.plot(sizes, ys, marker="o", label=e)
    ax.set_xlabel("vectors inserted")
    ax.set_ylabel(f"insertion time, s ({t0} thread)")
    ax.set_title(f"Fig. 8 (ours): insertion time, {r['dataset']}\n(p-hnsw pmem emulated on /dev/shm)")
    ax.grid(alpha=0.3)
    ax.legend()
    p = outdir / "fig8_insert_time.png"
    fig.tight_layout()
    fig.savefig(p, dpi=110)
    plt.close(fig)
    written.append(p)
    # Fig. 9: throughput vs threads at the largest size.
    fig, ax = plt.subplots(figsize=(7, 4.5))
    big = str(sizes[-1])
    for e, per in r["throughput_rows_per_s"].items():
        ts = r["threads"]
        ax.plot(ts, [per.get(big, {}).get(str(t)) for t in ts], marker="o", label=e)
    ax.set_xlabel("threads")
    ax.set_ylabel("inserts per second")
    ax.set_xticks(r["threads"])
    ax.set_title(f"Fig. 9 (ours): insert throughput at n={big}")
    ax.grid(alpha=0.3)
    ax.legend()
    p = outdir / "fig9_insert_throughput.png"
    fig.tight_layout()
    fig.savefig(p, dpi=110)
    plt.close(fig)
    written.append(p)
    # Fig. 10: breakdown.
    fig, ax = plt.subplots(figsize=(7, 4.5))
    labels, parts = [], {"search": [], "update": [], "logging": []}
    for n, per in r["breakdown"].items():
        for t, bd in per.items():
            labels.append(f"n={n}\nt={t}")
            for k in parts:
                parts[k].append(100 * bd[f"{k}_share"])
    bottom = np.zeros(len(labels))
    for k, v in parts.items():
        ax.bar(labels, v, bottom=bottom, label=k)
        bottom += np.array(v)
    ax.set_ylabel("% of p-hnsw insert thread-time")
    ax.set_title("Fig. 10 (ours): p-hnsw insert time breakdown")
    ax.legend()
    p = outdir / "fig10_breakdown.png"
    fig.tight_layout()
    fig.savefig(p, dpi=110)
    plt.close(fig)
    written.append(p)
    # Fig. 12: recovery time vs size.
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for e, per in r["recovery"].items():
        ns = sorted(int(n) for n in per)
        ax.plot(ns, [per[str(n)]["ms"] for n in ns], marker="o", label=e)
    ax.set_yscale("log")
    ax.set_xlabel("vectors in the index")
    ax.set_ylabel("ms from process start to first answer (log)")
    ax.set_title("Fig. 12 (ours): recovery after SIGKILL mid-insert")
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    p = outdir / "fig12_recovery.png"
    fig.tight_layout()
    fig.savefig(p, dpi=110)
    plt.close(fig)
    written.append(p)
    return written


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dataset", default="glove-6b-50-angular", metavar="NAME|PATH")
    p.add_argument("--sizes", type=_int_list, default=[100_000, 200_000, 390_000])
    p.add_argument("--threads", type=_int_list, default=[1, 2])
    p.add_argument("--runs", type=int, default=2, help="builds per engine and point, faster kept (default 2)")
    p.add_argument("--m", type=int, default=16)
    p.add_argument("--ef-construction", type=int, default=200)
    p.add_argument("--snapshot-every", type=int, default=50_000, help="hnsw-snap: rows between snapshots")
    p.add_argument("--ef", type=_int_list, default=[64, 128], help="search ef for the QPS comparison")
    p.add_argument("--queries", type=int, default=5000)
    p.add_argument("--kill-after", type=float, default=0.5, help="seconds of inserting after the build before SIGKILL")
    p.add_argument("--msync-rows", type=int, default=20_000)
    p.add_argument("--msync-workers", type=_int_list, default=[2, 16], help="p-hnsw insert workers in msync mode")
    p.add_argument("--crash-points", type=int, default=1000)
    p.add_argument("--kill-rounds", type=int, default=50)
    p.add_argument("--parts", default="build,recovery,msync,crash",
                   help="comma-separated parts to run (default: all)")
    p.add_argument("--engines", default=",".join(BUILD_ENGINES), help="engines of the build part")
    p.add_argument("--out", metavar="FILE.json")
    p.add_argument("--plot", metavar="DIR")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vectide.bench phnsw", description=__doc__.split("Method")[0].strip(),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        result = run(args)
    except (datasets.UnknownDatasetError, ValueError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(format_report(result))
    if args.out:
        write_json(result, args.out)
        print(f"wrote {args.out}")
    if args.plot:
        for p in plot(result, args.plot):
            print(f"wrote {p}")
    crash = result.get("crash_test") or {}
    return 1 if crash.get("violations") else 0
