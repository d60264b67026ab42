"""Streaming engines driven by one plan, each in a worker process of its own.

The runbook and stability benchmarks run every engine in a worker process
started by :class:`Worker`, so that its memory is its own process's resident
set and a peer with pinned dependencies (``diskannpy`` 0.7.0 needs numpy
1.25) runs in its own virtualenv.

- A Vectide engine's worker runs the harness core's timed loop over the
  whole runbook in one command (``native``): the loop the CLI's
  ``vectide runbook`` runs.
- A peer is driven step by step through one small interface
  (:class:`Stream`): ``insert(ids, X)``, ``delete(ids)``, ``replace(ids,
  X)``, ``after_deletes()`` (the engine's consolidation policy, stated in
  ``policy``), ``set_knob(v)`` and ``query(q, k)``; the timed loops are
  this file's, run inside the worker.

This file is also the worker's program (``python -m vectide.bench.streaming
--serve``; another interpreter finds this package through ``PYTHONPATH``) and imports nothing but numpy,
the standard library and :mod:`vectide.bench.peers` (which imports each
library only when its adapter is made), so that it runs under a virtualenv
that has neither Vectide's extension nor the other peers.

Protocol: the parent writes one JSON command per line to the worker's stdin
and reads one JSON answer per line from a pipe of its own (libraries may
print on stdout; their output goes to a log file). Vectors never cross the
pipe: the worker memory-maps the dataset's ``.npy`` files and commands name
row ranges.

Threads: updates run with ``update_threads`` (2 in the benchmarks) and
searches one query per call from one Python loop (1 thread), for every
engine.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from typing import Dict, Optional

import numpy as np

from .peers import STREAMING as PEERS
from .peers.base import PeerError as StreamError
from .peers.base import Stream


def make_stream(name: str, spec: Dict) -> Stream:
    if name in PEERS:
        return PEERS[name](spec)
    raise StreamError(f"unknown peer {name!r}; known: {', '.join(PEERS)} (Vectide's engines run natively)")


# --------------------------------------------------------------------------
# The worker: a loop over commands, timing each operation itself.


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def timed_search(eng: Stream, queries: np.ndarray, k: int):
    """One call per query from a plain loop; ``(ids [nq, k] int64, latencies s)``."""
    out = np.full((len(queries), k), -1, dtype=np.int64)
    lat = np.empty(len(queries))
    query, clock = eng.query, time.perf_counter
    for i in range(len(queries)):
        t0 = clock()
        row = query(queries[i], k)
        lat[i] = clock() - t0
        n = min(k, len(row))
        out[i, :n] = np.asarray(row[:n]).astype(np.int64, copy=False)
    return out, lat


def run_native(cmd: Dict) -> Dict:
    """A Vectide engine through the whole runbook with the harness core's
    timed loop (in this worker, which is the engine's own process)."""
    from vectide import _vectide as core  # only a Vectide engine's worker gets here

    with np.load(cmd["truth"]) as z:
        truth = [z[f"s{i}"] for i in range(len(z.files))]
    with open(cmd["runbook"], "rb") as f:
        text = f.read()
    doc = core.runbook_run(
        cmd["engine"], text, np.load(cmd["data"], mmap_mode="r"),
        np.ascontiguousarray(np.load(cmd["queries"]), dtype=np.float32), cmd["metric"],
        [t if t.shape[1] else None for t in truth], int(cmd["k"]), int(cmd["knob"]), int(cmd["nprobe"]),
        int(cmd["update_threads"]), settle_after_deletes=bool(cmd["settle"]),
        calibrate=[int(v) for v in cmd["calibrate"]], target=float(cmd["target"]), isolated=True,
        workdir=cmd.get("workdir"),
    )
    return json.loads(doc)


def serve(answer_fd: int) -> int:
    """Reads commands from stdin until ``quit``; answers on ``answer_fd``."""
    out = os.fdopen(answer_fd, "w", buffering=1)
    eng: Optional[Stream] = None
    data: Optional[np.ndarray] = None
    queries: Optional[np.ndarray] = None
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        try:
            ans: Dict[str, object] = {"ok": True}
            if op == "quit":
                if eng is not None:
                    eng.close()
                out.write(json.dumps(ans) + "\n")
                return 0
            if op == "open":
                data = np.load(cmd["data"], mmap_mode="r")
                queries = np.ascontiguousarray(np.load(cmd["queries"]), dtype=np.float32)
                rss0 = _rss()
                eng = make_stream(cmd["engine"], cmd["spec"])
                if cmd.get("train_sample") is not None and hasattr(eng, "train"):
                    eng.train(np.load(cmd["train_sample"]))
                ans.update(params=eng.params, policy=eng.policy, knob=eng.knob, rss_base=rss0)
            elif op in ("insert", "delete", "replace"):
                ids = np.arange(cmd["start"], cmd["end"], dtype=np.uint64)
                t0 = time.perf_counter()
                if op == "insert":
                    eng.insert(ids, np.ascontiguousarray(data[cmd["start"] : cmd["end"]], dtype=np.float32))
                elif op == "delete":
                    eng.delete(ids)
                else:
                    rows = np.ascontiguousarray(data[cmd["rows_start"] : cmd["rows_end"]], dtype=np.float32)
                    eng.replace(ids, rows)
                t1 = time.perf_counter()
                if op == "delete" or cmd.get("settle"):
                    (eng.settle if cmd.get("settle") else eng.after_deletes)()
                t2 = time.perf_counter()
                ans.update(op_s=t1 - t0, consolidate_s=t2 - t1)
            elif op == "native":
                ans.update(result=run_native(cmd))
            elif op == "settle":
                t0 = time.perf_counter()
                eng.settle()
                ans.update(consolidate_s=time.perf_counter() - t0)
            elif op == "search":
                if eng.knob is not None and cmd.get("knob") is not None:
                    eng.set_knob(int(cmd["knob"]))
                nq = int(cmd.get("nq", len(queries)))
                ids, lat = timed_search(eng, queries[:nq], int(cmd["k"]))
                np.save(cmd["result"], ids)
                ans.update(latencies=lat.tolist())
            else:
                raise StreamError(f"unknown command {op!r}")
            ans["rss"] = _rss()
            ans.update(eng.info() if eng is not None else {})
        except Exception as e:  # reported to the parent, which names the step
            ans = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        out.write(json.dumps(ans) + "\n")
    return 0


class Worker:
    """The parent's handle on one engine's worker process."""

    def __init__(self, engine: str, python: str, log_path: str, show_stderr: bool = False) -> None:
        """``show_stderr``: the worker's stderr stays the parent's (the core's
        progress bars); its stdout still goes to the log."""
        import subprocess

        self.engine = engine
        self.log_path = log_path
        # The worker imports this package, also under another venv
        # (.venv-peers, where Vectide is not installed): through a directory
        # holding only a link to it, so that none of this venv's other
        # packages shadow the worker venv's own.
        import tempfile

        env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2"))
        package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        r, w = os.pipe()
        self._log = None
        self._path_dir: Optional[str] = None
        try:
            self._log = open(log_path, "w")
            self._path_dir = tempfile.mkdtemp(prefix="vectide-worker-path-")
            os.symlink(package, os.path.join(self._path_dir, "vectide"))
            env["PYTHONPATH"] = self._path_dir
            self.proc = subprocess.Popen(
                [python, "-m", "vectide.bench.streaming", "--serve", str(w)],
                stdin=subprocess.PIPE, stdout=self._log, stderr=None if show_stderr else subprocess.STDOUT,
                pass_fds=(w,), text=True, env=env,
            )
        except BaseException:
            # Nothing started: nothing will call close(), so undo here.
            os.close(r)
            os.close(w)
            if self._log is not None:
                self._log.close()
            if self._path_dir is not None:
                shutil.rmtree(self._path_dir, ignore_errors=True)
            raise
        os.close(w)
        self._answers = os.fdopen(r, "r")

    def call(self, **cmd) -> Dict:
        try:
            self.proc.stdin.write(json.dumps(cmd) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass
        line = self._answers.readline()
        if not line:
            self.proc.wait()
            raise StreamError(f"{self.engine}: worker exited (code {self.proc.returncode}) during {cmd['op']}; "
                              f"its log: {self._tail()}")
        ans = json.loads(line)
        if not ans.get("ok"):
            raise StreamError(f"{self.engine}: {cmd['op']} failed: {ans.get('error')}")
        return ans

    def _tail(self) -> str:
        try:
            with open(self.log_path) as f:
                return f.read()[-2000:] or "(empty)"
        except OSError:
            return "(unreadable)"

    def close(self) -> None:
        try:
            if self.proc.poll() is None:
                self.call(op="quit")
        except (StreamError, OSError, ValueError):
            pass
        try:
            self.proc.wait(timeout=30)
        except Exception:
            self.proc.kill()
        self._answers.close()
        self._log.close()
        if self._path_dir is not None:
            shutil.rmtree(self._path_dir, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--serve":
        sys.exit(serve(int(sys.argv[2])))
    print("usage: python -m vectide.bench.streaming --serve ANSWER_FD (started by vectide.bench runbook)",
          file=sys.stderr)
    sys.exit(2)

