#!/usr/bin/env python3
"""Create the framework test venvs that are missing or stale.

    python3 python/tests/frameworks/setup_venvs.py [NAME ...] [--force] [--no-cache] [--root DIR]

For each framework NAME (default: langchain llamaindex haystack) the venv
``ROOT/.venv-fw-NAME`` holds ``requirements-NAME.txt`` (beside this file).
A venv is stale when its stamp file (``.fw-stamp``) differs from the hash
of that requirements file and of this Python's version; a stale or missing
venv is removed, created with ``python -m venv`` and installed with pip, the
stamp written last (so an interrupted install is redone next time). The
installs run in parallel; each one's time is printed, and its pip log on
failure. ``--no-cache`` passes ``--no-cache-dir`` to pip (what an empty CI
cache costs). Standard library only; exit 1 if any install failed.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
FRAMEWORKS = ("langchain", "llamaindex", "haystack")
STAMP = ".fw-stamp"


def requirements(name: str) -> Path:
    return HERE / f"requirements-{name}.txt"


def digest(name: str) -> str:
    h = hashlib.sha256(requirements(name).read_bytes())
    h.update(sys.version.encode())
    return h.hexdigest()


def is_current(venv: Path, name: str) -> bool:
    stamp = venv / STAMP
    return (venv / "bin" / "python").exists() and stamp.exists() and stamp.read_text().strip() == digest(name)


def build(venv: Path, name: str, no_cache: bool) -> tuple[str, float, str | None]:
    """``(name, seconds, error log or None)``."""
    t0 = time.monotonic()
    shutil.rmtree(venv, ignore_errors=True)
    steps = [
        [sys.executable, "-m", "venv", str(venv)],
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check", "-q",
         *(["--no-cache-dir"] if no_cache else []), "-r", str(requirements(name))],
    ]
    for cmd in steps:
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            return name, time.monotonic() - t0, f"$ {' '.join(cmd)}\n{r.stdout}{r.stderr}"
    (venv / STAMP).write_text(digest(name) + "\n")
    return name, time.monotonic() - t0, None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", metavar="NAME", help=f"of {', '.join(FRAMEWORKS)} (default: all)")
    ap.add_argument("--force", action="store_true", help="rebuild even if current")
    ap.add_argument("--no-cache", action="store_true", help="pip install --no-cache-dir")
    ap.add_argument("--root", type=Path, default=HERE.parents[2], help="where the .venv-fw-* go (default: repo root)")
    args = ap.parse_args()
    names = args.names or list(FRAMEWORKS)
    unknown = sorted(set(names) - set(FRAMEWORKS))
    if unknown:
        ap.error(f"unknown framework(s) {', '.join(unknown)}; known: {', '.join(FRAMEWORKS)}")

    todo = []
    for name in names:
        venv = args.root / f".venv-fw-{name}"
        if not args.force and is_current(venv, name):
            print(f"{venv.name}: current")
        else:
            todo.append((venv, name))
    if not todo:
        return 0
    t0 = time.monotonic()
    failed = 0
    with ThreadPoolExecutor(len(todo)) as pool:
        for name, seconds, error in pool.map(lambda vn: build(*vn, args.no_cache), todo):
            if error is None:
                print(f".venv-fw-{name}: installed in {seconds:.1f} s")
            else:
                failed += 1
                print(f".venv-fw-{name}: FAILED after {seconds:.1f} s\n{error}", file=sys.stderr)
    print(f"framework venvs: {len(todo) - failed} of {len(todo)} built in {time.monotonic() - t0:.1f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
