"""The corruption matrix: every file of a database damaged in turn.

A template database holds one collection per engine of the registry, named
after it (``targets.py``: the small parameters that make freezes, merges,
snapshots and splits happen; ``p-hnsw`` with ``persist=msync``): snapshot +
WAL tail for the in-memory engines, each durable engine's own files, and
for each engine that lives on a memory node one more collection
(``<engine>-backed``) on a memory node inside the process on the backing
file ``memnode.vtb`` in the database's directory (``memnode=file:...``,
relative: every probe runs in its copy's directory), which the collection
keeps itself in (no saved file). For
every file in it (catalog, WAL
segments, point stores, engine files) and every damage (flip 8 bytes, zero
512 bytes, truncate) at its start, middle and end, a copy is damaged and
opened in a fresh process, which reads every point and runs a search. Each
case is classified:

- ``intact``: it opens and every point is as written;
- ``torn-tail``: it opens and only the last acknowledged operations of a
  collection are missing: damage at the very end of the last WAL segment is
  indistinguishable from a write torn by a crash (``docs/format-wal.md``);
- ``typed-error``: opening fails with a Vectide error naming the damage;
- ``undetected``: it opens with different data where the format has no
  checksum by design (P-HNSW node data, ``docs/format-phnsw.md``; a memory
  node's region bytes, raw remote memory, ``docs/format-dhnsw.md``);
- ``violation``: a crash, a panic, a hang, or different data anywhere else.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

import numpy as np

from .targets import collection_kwargs

DIM = 8


def engines() -> List[str]:
    """Every engine of the registry: one collection each, named after it."""
    import vectide

    return [e["name"] for e in vectide.engines()]


#: The backing file of the memory node the ``-backed`` collections use.
BACKING = "memnode.vtb"


def on_memory_node() -> List[str]:
    """The engines that live on a memory node (by the registry's class)."""
    import vectide

    return [e["name"] for e in vectide.engines() if e["persistence"].endswith("on its memory node")]


@contextlib.contextmanager
def _inside(path: Path):
    """Runs with ``path`` as the working directory (the backed collections
    name their backing file relative to it)."""
    before = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)


def build_template(path: Path) -> None:
    import vectide

    rng = np.random.default_rng(5)
    path.mkdir(parents=True, exist_ok=True)
    with _inside(path):
        _fill(vectide.connect(path), rng)
    import gc

    gc.collect()


def _fill(db, rng) -> None:
    colls = [(e, e, collection_kwargs(e)) for e in engines()]
    colls += [(f"{e}-backed", e, {**collection_kwargs(e), "memnode": f"file:{BACKING}"}) for e in on_memory_node()]
    for name, engine, kwargs in colls:
        c = db.create_collection(name, dim=DIM, metric="l2", engine=engine, **kwargs)
        c.upsert(list(range(300)), rng.standard_normal((300, DIM)).astype(np.float32),
                 payloads=[{"i": i, "f": float(rng.standard_normal())} for i in range(300)])
        c.checkpoint()
        for i in range(300, 340):
            c.upsert([i], rng.standard_normal((1, DIM)).astype(np.float32), payloads=[{"i": i}])
        c.delete(list(range(0, 20)))
        c.set_payload({"late": True}, ids=[25])
    # A collection of several vector spaces: the default engine's, a flat
    # one and a sparse one (their files: index.vtdx, spaces/1/, sparse-0.vtsp).
    from . import kill

    c = db.create_collection(SPACES, vectors={
        "main": {"dim": DIM, "metric": "l2", "params": collection_kwargs("hnsw"), "engine": "hnsw"},
        "echo": {"dim": DIM, "metric": "l2", "engine": "flat"}}, sparse_vectors={"terms": {"modifier": "idf"}})

    def pts(ids):
        out = []
        for i in ids:
            v = rng.standard_normal(DIM).astype(np.float32)
            out.append({"id": i, "vector": {"main": v, "echo": v[::-1], "terms": kill.terms_of(v)}, "payload": {"i": i}})
        return out

    c.upsert_points(pts(range(300)))
    c.checkpoint()
    c.upsert_points(pts(range(300, 340)))
    c.delete(list(range(0, 20)))
    c.set_payload({"late": True}, ids=[25], key="meta")
    # Dropped without close (no final checkpoint): the WAL tails stay.
    del c, db


# The collection of several vector spaces in the template.
SPACES = "spaces"


def _digest(p) -> str:
    if isinstance(p.vector, dict):
        vec = json.dumps({k: (v.tolist() if hasattr(v, "tolist") else v) for k, v in p.vector.items()}, sort_keys=True).encode()
    else:
        vec = np.asarray(p.vector, dtype=np.float32).tobytes()
    return hashlib.sha1(vec + json.dumps(p.payload, sort_keys=True).encode()).hexdigest()[:16]


def probe(path: Path) -> dict:
    """Opens the database, reads everything, searches; a JSON-able digest."""
    import vectide

    try:
        db = vectide.connect(path)
        out = {}
        for name in sorted(db.list_collections()):
            c = db.get_collection(name)
            pts, offset = [], None
            while True:
                page, offset = c.scroll(offset=offset, limit=256, with_vector=True)
                pts += page
                if offset is None:
                    break
            c.search(np.zeros(DIM, dtype=np.float32), k=5)
            out[name] = {json.dumps(p.id): _digest(p) for p in pts}
        db.close()
        return {"ok": True, "collections": out}
    except BaseException as e:  # noqa: BLE001 - classified by the parent
        return {"ok": False, "type": type(e).__module__ + "." + type(e).__name__, "message": str(e)[:500]}


DAMAGES = [(kind, where) for kind in ("flip", "zero", "truncate") for where in ("start", "middle", "end")]


def damage(file: Path, kind: str, where: str) -> None:
    b = bytearray(file.read_bytes())
    n = len(b)
    if n == 0:
        return
    if kind == "truncate":
        keep = {"start": 0, "middle": n // 2, "end": max(0, n - 8)}[where]
        del b[keep:]
    else:
        width = 8 if kind == "flip" else 512
        width = min(width, n)
        at = {"start": 0, "middle": max(0, n // 2 - width // 2), "end": n - width}[where]
        for i in range(at, at + width):
            b[i] = b[i] ^ 0xFF if kind == "flip" else 0
    file.write_bytes(bytes(b))


def _is_last_wal_segment(rel: Path, files: List[Path]) -> bool:
    if rel.parent.name != "wal":
        return False
    siblings = sorted(f for f in files if f.parent == rel.parent)
    return siblings[-1] == rel


def classify(rel: Path, kind: str, where: str, files: List[Path], want: dict, got: dict, rc: int, err: str) -> str:
    if rc != 0 or "panicked" in err or (not got.get("ok") and "Panic" in got.get("type", "")):
        return "violation"
    if not got.get("ok"):
        t = got.get("type", "")
        return "typed-error" if t.startswith("vectide.") or t.endswith(("Error", "Exception")) and got.get("message") else "violation"
    if got["collections"] == want["collections"]:
        return "intact"
    coll = rel.parts[1] if rel.parts[0] == "collections" else None
    changed = {k for k in want["collections"] if got["collections"].get(k) != want["collections"][k]}
    if rel.name == BACKING and changed and all(k.endswith("-backed") for k in changed):
        return "undetected"  # a region's bytes: raw memory, no checksum
    if coll and changed <= {coll}:
        if where == "end" and _is_last_wal_segment(rel, files):
            return "torn-tail"
        if coll == "p-hnsw" and rel.parts[2] == "index" and rel.name.startswith("nodes"):
            return "undetected"
    return "violation"


def sample_cases(files: List[Path], damages: List[tuple]) -> List[tuple]:
    """The smallest matrix that still damages every kind of file with every
    damage: every engine file of every collection, and one of each other
    name (catalog, point store, WAL segment: the same format in every
    collection), each file with one of the damages in turn; ``(file, kind,
    where)`` triples."""
    def kind(rel: Path):
        if rel.parts[0] == "collections" and len(rel.parts) > 2 and rel.parts[2].startswith(("index", "spaces", "sparse-")):
            return rel.parts[1], "/".join(rel.parts[2:])
        return rel.name

    seen, picked = set(), []
    for rel in files:
        if kind(rel) not in seen:
            seen.add(kind(rel))
            picked.append(rel)
    return [(rel, *damages[i % len(damages)]) for i, rel in enumerate(picked)]


def run(quick: bool, workdir: Path, python: str = sys.executable, sample: bool = False) -> dict:
    """The matrix over a fresh template in ``workdir``: every file with every
    damage (``quick``: three of them), or with ``sample`` only
    :func:`sample_cases` (the test suite's fast version)."""
    template = workdir / "template"
    build_template(template)
    files = sorted(p.relative_to(template) for p in template.rglob("*") if p.is_file() and p.name != "LOCK")
    # Opening checkpoints on close and changes the files: probe a copy.
    pristine = workdir / "pristine"
    shutil.copytree(template, pristine)
    with _inside(pristine):
        want = probe(pristine)
    assert want["ok"], want
    shutil.rmtree(pristine)
    damages = DAMAGES
    if quick:
        damages = [("flip", "middle"), ("truncate", "middle"), ("flip", "end")]
    todo = sample_cases(files, damages) if sample else [(rel, k, w) for rel in files for k, w in damages]
    cases = []
    for rel, kind, where in todo:
        case_dir = workdir / "case"
        shutil.rmtree(case_dir, ignore_errors=True)
        shutil.copytree(template, case_dir)
        damage(case_dir / rel, kind, where)
        t0 = time.perf_counter()
        try:
            p = subprocess.run([python, "-m", "vectide.torture", "probe", "--dir", str(case_dir)],
                               capture_output=True, text=True, timeout=300, cwd=case_dir)
            rc, out, err = p.returncode, p.stdout, p.stderr
        except subprocess.TimeoutExpired:
            rc, out, err = -999, "", "timed out (hang)"
        try:
            got = json.loads(out.strip().splitlines()[-1])
        except (ValueError, IndexError):
            got = {"ok": False, "type": "none", "message": ""}
        outcome = classify(rel, kind, where, files, want, got, rc, err)
        cases.append({
            "file": str(rel), "damage": kind, "where": where, "outcome": outcome,
            "error": None if got.get("ok") else f"{got.get('type')}: {got.get('message')}",
            "exit": rc, "stderr": err[-400:] if outcome == "violation" else "",
            "seconds": round(time.perf_counter() - t0, 3),
        })
    counts: Dict[str, int] = {}
    for c in cases:
        counts[c["outcome"]] = counts.get(c["outcome"], 0) + 1
    return {"files": [str(f) for f in files], "cases": cases,
            "summary": {"cases": len(cases), **counts, "violations": counts.get("violation", 0)}}
