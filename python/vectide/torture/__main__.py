"""``python -m vectide.torture {server,db,engines,corrupt,badinput,soak,all}``."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path


def _kill_args(p: argparse.ArgumentParser, rounds: int) -> None:
    p.add_argument("--rounds", type=int, default=rounds, help="kill rounds per target")
    p.add_argument("--writers", type=int, default=3, help="concurrent writer threads")
    p.add_argument("--ids", type=int, default=500, help="ids the writers share")
    p.add_argument("--seed", type=int, default=1)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m vectide.torture", description=__doc__)
    ap.add_argument("--quick", action="store_true", help="the small version that CI runs")
    ap.add_argument("--out", type=Path, help="write the JSON report here")
    ap.add_argument("--workdir", type=Path, help="scratch directory (default: a temporary one)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("server", "db", "engines"):
        _kill_args(sub.add_parser(name, help=f"SIGKILL rounds: {name}"), 30)
    sub.choices["engines"].add_argument(
        "--targets", default="all",
        help="comma-separated ENGINE[:PERSIST] (default all: every engine in a directory, from the registry)")
    sub.choices["db"].add_argument(
        "--targets", default="all",
        help="comma-separated db or db:ENGINE (default all: the default engine and every engine in a directory)")
    sub.add_parser("corrupt", help="the corruption matrix")
    b = sub.add_parser("badinput", help="bad input over HTTP and Python")
    try:
        from . import badinput

        badinput.add_arguments(b)
    except ImportError:
        pass
    from . import soak as _soak

    _soak.add_arguments(sub.add_parser("soak", help="a long churn with every answer checked (see vectide.torture.soak)"))
    _soak.add_driver_arguments(sub.add_parser("soak-driver"))  # internal: the soak's workload
    a = sub.add_parser("all", help="everything")
    _kill_args(a, 30)
    c = sub.add_parser("child")  # internal: a SIGKILL target
    c.add_argument("--target", required=True)
    c.add_argument("--dir", required=True)
    c.add_argument("--seed", type=int, default=1)
    c.add_argument("--writers", type=int, default=3)
    c.add_argument("--ids", type=int, default=500)
    pr = sub.add_parser("probe")  # internal: open a damaged copy
    pr.add_argument("--dir", required=True)
    args = ap.parse_args(argv)

    if args.cmd == "child":
        from .kill import child

        child(args.target, args.dir, args.seed, args.writers, args.ids)
        return 0
    if args.cmd == "soak-driver":
        _soak.driver(args)
        return 0
    if args.cmd == "soak":
        return _run_soak(args, argv)
    if args.cmd == "probe":
        from .corrupt import probe

        print(json.dumps(probe(Path(args.dir))))
        sys.stdout.flush()
        return 0

    tmp = tempfile.TemporaryDirectory(prefix="vectide-torture-")
    work = args.workdir or Path(tmp.name)
    work.mkdir(parents=True, exist_ok=True)
    report = {"command": " ".join([Path(sys.executable).name, "-m", "vectide.torture"] + (argv or sys.argv[1:])),
              "started": time.strftime("%Y-%m-%dT%H:%M:%S")}
    try:
        from vectide import allocator, build_commit, simd_isa

        report["isa"] = simd_isa()
        report["allocator"] = allocator()
        report["commit"] = build_commit()
    except Exception:  # noqa: BLE001
        pass
    cmds = ["server", "db", "engines", "corrupt", "badinput"] if args.cmd == "all" else [args.cmd]
    summary = {}
    failed = False
    for cmd in cmds:
        t0 = time.perf_counter()
        if cmd in ("server", "db", "engines"):
            from . import kill

            rounds = getattr(args, "rounds", 30)
            kw = dict(rounds=rounds, writers=args.writers, n_ids=args.ids, quick=args.quick, seed=args.seed)
            if cmd == "server":
                results = [kill.run_server(workdir=work, **kw)]
            else:
                from .targets import db_spaces_targets, db_targets, engine_targets

                every = ["db"] + db_targets() + db_spaces_targets() if cmd == "db" else engine_targets()
                chosen = getattr(args, "targets", "all")
                targets = every if chosen == "all" else [t for t in chosen.split(",") if t]
                results = [kill.run_child_target(t, workdir=work, **kw) for t in targets]
            report[cmd] = results
            for r in results:
                s = {k: r[k] for k in ("rounds", "acknowledged_ops_checked", "violations")}
                for k in ("restart_s", "open_s"):
                    if k in r:
                        s[k] = r[k]
                summary[r["target"]] = s
                failed |= r["violations"] > 0
                print(f"{r['target']:>17}: {r['rounds']} rounds, {r['acknowledged_ops_checked']} acknowledged "
                      f"operations checked, {r['violations']} violations"
                      + (f", restart min/median/max {r['restart_s']['min']:.3f}/{r['restart_s']['median']:.3f}/"
                         f"{r['restart_s']['max']:.3f} s" if r.get("restart_s") else ""), flush=True)
                for v in r["violation_examples"][:5]:
                    print(f"    {v}", flush=True)
        elif cmd == "corrupt":
            from . import corrupt

            r = corrupt.run(args.quick, work / "corrupt")
            report["corrupt"] = r
            summary["corrupt"] = r["summary"]
            failed |= r["summary"]["violations"] > 0
            print(f"corruption matrix: {r['summary']}", flush=True)
            for c in r["cases"]:
                if c["outcome"] == "violation":
                    print(f"    violation: {c['file']} {c['damage']}@{c['where']}: {c['error']} {c['stderr'][-200:]}", flush=True)
        elif cmd == "badinput":
            from . import badinput

            r = badinput.run(args)
            report["badinput"] = r
            summary["badinput"] = r["summary"]
            failed |= r["summary"].get("failed", 0) > 0
            print(f"bad-input matrix: {r['summary']}", flush=True)
        print(f"  ({cmd}: {time.perf_counter() - t0:.1f} s)", flush=True)
    report["summary"] = summary
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1))
    tmp.cleanup()
    return 1 if failed else 0


def _run_soak(args, argv) -> int:
    from . import soak

    if args.server and args.standalone:
        print("--server and --standalone exclude each other", file=sys.stderr)
        return 2
    mode = "server" if args.server else "standalone" if args.standalone or args.compute_nodes else "db"
    try:
        params = soak.parse_params(args.param)
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    started = time.strftime("%Y-%m-%dT%H:%M:%S")
    with tempfile.TemporaryDirectory(prefix="vectide-soak-") as tmp:
        work = args.workdir or Path(tmp)
        try:
            report = soak.run(args.engine, args.minutes, mode, work, points=args.points, writers=args.writers,
                              readers=args.readers, seed=args.seed, maintain_every=args.maintain_every,
                              params=params, settle_max=args.settle_max, quiet_every=args.quiet_every,
                              compute_nodes=args.compute_nodes, memnode_size_=args.memnode_size, spaces=args.spaces)
        except (soak.UsedWorkdir, soak.BadSoakArguments) as e:
            print(e, file=sys.stderr)
            return 2
    report["command"] = " ".join([Path(sys.executable).name, "-m", "vectide.torture"] + (argv or sys.argv[1:]))
    report["started"] = started
    report["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    try:
        from vectide import allocator, build_commit, simd_isa

        # The code that ran: the commit the extension was built at.
        report["commit"] = build_commit()
        report["isa"] = simd_isa()
        report["allocator"] = allocator()
    except Exception:  # noqa: BLE001
        pass
    out = args.soak_out or args.out
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=1))
    print(json.dumps(report["summary"]), flush=True)
    for v in report["wrong_answer_examples"][:5] + report["lost_examples"][:5] + report["error_examples"][:5]:
        print(f"    {v}", flush=True)
    s = report["summary"]
    return 1 if s["wrong_answers"] or s["acked_writes_lost"] or s["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
