"""Text table and recall/QPS plot of an ANN benchmark result document."""

from __future__ import annotations

from typing import Dict, List, Optional

from .metrics import RECALL_TARGETS, pareto_frontier, target_key


def _fmt(v: Optional[float], spec: str) -> str:
    return "-" if v is None else format(v, spec)


def format_table(result: Dict[str, object]) -> str:
    """One row per engine: build time, memory, QPS at each recall target and
    the ratio to the best peer at each target."""
    engines: Dict[str, Dict] = result["engines"]  # type: ignore[assignment]
    summary: Dict[str, Dict] = result.get("summary", {})  # type: ignore[assignment]
    keys = [target_key(t) for t in RECALL_TARGETS]
    header = ["engine", "build_s", "mem_MB"] + [f"QPS@{k}" for k in keys] + [f"x@{k}" for k in keys]
    rows: List[List[str]] = []
    for name, e in engines.items():
        mem = e.get("memory_bytes")
        row = [name, _fmt(e.get("build_s"), ".2f"), _fmt(None if mem is None else mem / 1e6, ".1f")]
        row += [_fmt(e.get("qps_at_recall", {}).get(k), ".0f") for k in keys]
        row += [_fmt((summary.get(f"ratio_vs_best_peer_at_{k}") or {}).get(name), ".2f") for k in keys]
        rows.append(row)
    widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]
    line = lambda r: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
    title = (
        f"{result.get('dataset')}: k={result.get('k')}, threads={result.get('threads')}, "
        f"{result.get('n_train')} train, {result.get('n_queries')} queries"
    )
    out = [title, line(header), line(["-" * w for w in widths])] + [line(r) for r in rows]
    reported = [(n, e["reported_memory_bytes"]) for n, e in engines.items() if "reported_memory_bytes" in e]
    for n, b in reported:
        out.append(f"{n}: index reports {b / 1e6:.1f} MB")
    out.append("x@t = QPS at recall t / best peer's QPS at t (peers: engines not named vectide:*)")
    return "\n".join(out)


def plot(result: Dict[str, object], path) -> None:
    """Recall (x) vs QPS (log y): each engine's Pareto frontier as a line with
    markers, all its sweep points faint behind it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5.5), dpi=120)
    for i, (name, e) in enumerate(result["engines"].items()):  # type: ignore[union-attr]
        color = f"C{i}"
        pts = [(p["recall"], p["qps"]) for p in e["sweep"]]
        ax.scatter([r for r, _ in pts], [q for _, q in pts], color=color, alpha=0.25, s=14, linewidths=0)
        front = pareto_frontier(pts)
        ax.plot([r for r, _ in front], [q for _, q in front], marker="o", ms=4, color=color, label=name,
                lw=2.0 if name.startswith("vectide:") else 1.4)
    ax.set_yscale("log")
    ax.set_xlabel(f"recall@{result.get('k')}")
    ax.set_ylabel("queries per second (log)")
    loop = result.get("query_loop", "one Python call per query")
    ax.set_title(
        f"{result.get('dataset')}  k={result.get('k')}  threads={result.get('threads')}\n"
        f"{result.get('n_queries')} queries, {loop}",
        fontsize=10,
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
