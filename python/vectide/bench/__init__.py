"""Benchmark harness.

* ``python -m vectide.bench ann ...``: the recall/QPS sweep against peer
  libraries (see :mod:`vectide.bench.ann`).
* ``python -m vectide.bench churn ...``: recall/QPS/memory under delete and
  re-insert churn (see :mod:`vectide.bench.churn`).
* ``python -m vectide.bench phnsw ...``: the P-HNSW paper's figures at our
  scale (see :mod:`vectide.bench.phnsw`).
* ``python -m vectide.bench stability ...``: recall over many delete and
  re-insert cycles, every streaming engine and peer (see
  :mod:`vectide.bench.churn`).
* ``python -m vectide.bench runbook ...``: big-ann-benchmarks streaming
  runbooks over Vectide's streaming engines and the peers (see
  :mod:`vectide.bench.runbooks`).
* ``python -m vectide.bench freshdiskann ...``: StreamingMerge against a
  rebuild and DiskANN's disk build, the disk search against DiskANN's disk
  index (see :mod:`vectide.bench.freshdiskann`).
* ``python -m vectide.bench spfresh ...``: a distribution-shifting update
  stream, SPFresh against SPANN+ and a static SPANN (see
  :mod:`vectide.bench.spfresh`).
* ``python -m vectide.bench dhnsw-writes ...``: d-HNSW's writes from several
  compute nodes at once (see :mod:`vectide.bench.dhnsw_writes`).
* ``python -m vectide.bench dhnsw ...``: d-HNSW's latency breakdown (the
  slides' Tables 1-2) with a memory node in its own process: naive,
  no-doorbell and doorbell fetches, the pipeline, cold and warm, against a
  local ``hnsw`` (see :mod:`vectide.bench.dhnsw`).
* ``python -m vectide.bench exact ...``: batched exact search, ``vectide:flat``
  against faiss ``IndexFlat`` (see :mod:`vectide.bench.exact`).
* ``python -m vectide.bench plot FILE.json FILE.png``: the recall/QPS plot of a
  result file (also used by the native ``vectide bench --plot``).
* ``python -m vectide.bench table FILE.json``: its summary table.
"""

from __future__ import annotations

import argparse
import sys

__all__ = ["main"]


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] == "churn":  # churn parses its own arguments
        from . import churn

        return churn.main(argv[1:])
    if argv and argv[0] == "freshdiskann":  # and freshdiskann
        from . import freshdiskann

        return freshdiskann.main(argv[1:])
    if argv and argv[0] == "spfresh":  # and spfresh
        from . import spfresh

        return spfresh.main(argv[1:])
    if argv and argv[0] == "phnsw":  # so does phnsw
        from . import phnsw

        return phnsw.main(argv[1:])
    if argv and argv[0] == "dhnsw":  # and dhnsw
        from . import dhnsw

        return dhnsw.main(argv[1:])
    if argv and argv[0] == "dhnsw-writes":  # and d-HNSW's writers
        from . import dhnsw_writes

        return dhnsw_writes.main(argv[1:])
    if argv and argv[0] == "db":  # and db
        from . import db

        return db.main(argv[1:])
    if argv and argv[0] == "stability":  # and stability
        from . import churn

        return churn.stability_main(argv[1:])
    if argv and argv[0] == "runbook":  # and runbook
        from . import runbooks

        return runbooks.main(argv[1:])
    if argv and argv[0] == "exact":  # and exact
        from . import exact

        return exact.main(argv[1:])
    if argv and argv[0] == "sparse":  # and sparse
        from . import sparse

        return sparse.main(argv[1:])

    from . import ann

    parser = argparse.ArgumentParser(prog="python -m vectide.bench", description="Vectide benchmarks")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser(
        "ann",
        help="recall/QPS sweep against peer ANN libraries",
        description=(ann.__doc__ or "").split("Method")[0].strip(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ann.add_arguments(p)
    p.set_defaults(func=ann.run_cli)
    sub.add_parser("churn", help="recall/QPS under delete + re-insert churn (vectide:hnsw)", add_help=False)
    sub.add_parser("db", help="database: upsert throughput, filtered recall, restart, server vs in-process", add_help=False)
    sub.add_parser("freshdiskann", help="FreshDiskANN: StreamingMerge vs rebuild vs DiskANN's build, disk search vs DiskANN's disk index", add_help=False)
    sub.add_parser("spfresh", help="SPFresh: a shifting update stream, spfresh vs spann-inplace vs a static spann rebuilt on the final data", add_help=False)
    sub.add_parser("phnsw", help="P-HNSW paper figures: insert time, breakdown, recovery, msync, crash test", add_help=False)
    sub.add_parser("dhnsw", help="d-HNSW Tables 1-2: latency breakdown of naive / no-doorbell / doorbell fetches from a memory node", add_help=False)
    sub.add_parser("dhnsw-writes", help="d-HNSW writes from 1 and 2 compute nodes at once: throughput, CAS retries, round trips and bytes per insert, recall after +20 %% and -20 %%", add_help=False)
    sub.add_parser("stability", help="recall over 50 delete/re-insert cycles, streaming engines and peers", add_help=False)
    sub.add_parser("runbook", help="big-ann streaming runbooks: every streaming engine and peer, same threads", add_help=False)
    sub.add_parser("exact", help="exact search: vectide:flat against faiss IndexFlat, same threads", add_help=False)
    sub.add_parser("sparse", help="exact sparse search against scipy.sparse, and hybrid (RRF) against dense alone, on real text", add_help=False)
    p = sub.add_parser("plot", help="recall/QPS plot of a result JSON")
    p.add_argument("json", metavar="FILE.json")
    p.add_argument("png", metavar="FILE.png")
    p.set_defaults(func=_plot)
    p = sub.add_parser("table", help="summary table of a result JSON")
    p.add_argument("json", metavar="FILE.json")
    p.set_defaults(func=_table)
    args = parser.parse_args(argv)
    return args.func(args)


def _read(path):
    import json

    with open(path) as f:
        return json.load(f)


def _plot(args) -> int:
    from . import report

    report.plot(_read(args.json), args.png)
    print(f"wrote {args.png}")
    return 0


def _table(args) -> int:
    from . import report

    print(report.format_table(_read(args.json)))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
