"""A memory node (``vectide memnode``) in a child process, for d-HNSW
benchmarks, tests and the demo: started on a loopback port the kernel
picks, its address read from its first line, stopped on exit.

``with MemoryNode(size=2 << 30) as node: vectide.Index(..., engine="d-hnsw",
memnode=node.address)``
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import List, Optional, Tuple


def cli_path(explicit: Optional[str] = None) -> str:
    """The ``vectide`` binary: ``explicit``, the one beside this Python, or
    the one on ``PATH``."""
    if explicit:
        return explicit
    beside = Path(sys.executable).parent / "vectide"
    return str(beside) if beside.exists() else (shutil.which("vectide") or "vectide")


class MemoryNode:
    """``vectide memnode --listen 127.0.0.1:0 --size SIZE [extra...]``."""

    def __init__(self, size: int, cli: Optional[str] = None, log: Optional[Path] = None,
                 extra: Optional[List[str]] = None) -> None:
        self.size, self.cli, self.log, self.extra = size, cli_path(cli), log, extra or []
        self.proc: Optional[subprocess.Popen] = None
        self.addr: Tuple[str, int] = ("127.0.0.1", 0)

    @property
    def address(self) -> str:
        return f"{self.addr[0]}:{self.addr[1]}"

    def start(self) -> "MemoryNode":
        err = open(self.log, "wb") if self.log else subprocess.DEVNULL
        self.proc = subprocess.Popen(
            [self.cli, "memnode", "--listen", "127.0.0.1:0", "--size", str(self.size), *self.extra],
            stdout=subprocess.PIPE, stderr=err, text=True)
        line = self.proc.stdout.readline()  # "memnode listening on HOST:PORT with N bytes"
        if "listening on" not in line:
            self.stop()
            tail = self.log.read_text()[-500:] if self.log else ""
            raise RuntimeError(f"vectide memnode did not start: {line!r} {tail}")
        host, port = line.split("listening on ")[1].split()[0].rsplit(":", 1)
        self.addr = (host, int(port))
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)

    def __enter__(self) -> "MemoryNode":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
