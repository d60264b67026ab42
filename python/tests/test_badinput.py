"""Issue 10, items 5-8 and the bad-input matrix (d).

The quick matrix (``python -m vectide.torture badinput --quick``) must have
no failure; the focused tests below each failed on the code before the fix:

- item 5: payload floats came back changed in their last bit
  (15028.519667320139 -> 15028.51966732014), embedded, at rest and over HTTP;
- item 6: ``"threads": 1500`` over HTTP started 1500 threads (200 OK);
- item 7: ``search(q, k=10**9)`` aborted the process (SIGABRT) on Index and
  Collection; ``upsert([1.0, None, 2.5], ...)`` created string ids;
- item 8: the API key was compared with ``!=`` (the constant-time
  comparison is unit-tested in ``vectide-server``; here every kind of wrong
  key is refused and the right one passes).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import numpy as np
import pytest

vectide = pytest.importorskip("vectide._vectide") and __import__("vectide")

from test_server import Server, _cli, _http  # noqa: E402

# Values whose last bit the old parser changed, and the edges of doubles and
# of 64-bit integers.
FLOATS = [15028.519667320139, 0.1 + 0.2, 1e-320, 5e-324, 1.7976931348623157e308, -0.0,
          2.2250738585072014e-308, 123456789.12345679, 0.1, -1.5e-7]
INTS = [2**63 - 1, -(2**63), 2**64 - 1, 0, -1]


def _same(a, b) -> bool:
    """Equal values and types, and -0.0 keeps its sign."""
    return json.dumps(a) == json.dumps(b) and all(
        type(x) is type(y) and (not isinstance(x, float) or np.signbit(x) == np.signbit(y)) for x, y in zip(a, b)
    )


# ---------------------------------------------------------------- the matrix

def test_quick_bad_input_matrix_has_no_failures(tmp_path):
    from vectide.torture import badinput

    surfaces = "http,python,client,memnode" if (Path(sys.executable).parent / "vectide").exists() else "python"
    args = argparse.Namespace(quick=True, surfaces=surfaces, verbose=False, cli=None, workdir=tmp_path)
    r = badinput.run(args)
    s = r["summary"]
    assert s["cases"] >= 300, s
    if "memnode" in surfaces:
        assert s["by_surface"]["memnode"]["cases"] >= 25, s
    bad = [f"{c['surface']}/{c['group']}/{c['case']}: {c['problems']} ({c['got'][:150]})" for c in r["failures"]]
    assert s["failed"] == 0, "\n".join(bad[:40])
    json.dumps(r)  # the report is JSON-able


# ---------------------------------------------------------------- item 5: floats

def test_payload_numbers_round_trip_embedded_and_at_rest(tmp_path):
    payload = {"f": FLOATS, "i": INTS, "x": 15028.519667320139}
    db = vectide.connect(tmp_path / "db")
    c = db.create_collection("c", dim=2, metric="l2")
    c.upsert([1], [[1.0, 2.0]], payloads=[payload])
    c.set_payload({"y": 15028.519667320139}, ids=[1])

    def check(col, where):
        (p,) = col.get([1])
        assert _same(p.payload["f"], FLOATS), (where, p.payload["f"])
        assert _same(p.payload["i"], INTS), (where, p.payload["i"])
        assert p.payload["x"] == 15028.519667320139 and p.payload["y"] == 15028.519667320139, where
        (h,) = col.search([1.0, 2.0], k=1)[0]
        assert _same(h.payload["f"], FLOATS), where

    check(c, "in memory")
    del c
    del db  # no checkpoint: the next open replays the WAL
    db = vectide.connect(tmp_path / "db")
    c = db.get_collection("c")
    check(c, "after WAL replay")
    c.checkpoint()
    db.close()
    db = vectide.connect(tmp_path / "db")
    check(db.get_collection("c"), "from the point store")
    db.close()


def test_payload_numbers_round_trip_over_http(tmp_path):
    _cli()
    s = Server(tmp_path / "db").start()
    try:
        c = vectide.Client(s.url)
        col = c.create_collection("c", dim=2, metric="l2")
        col.upsert([1], [[1.0, 2.0]], payloads=[{"f": FLOATS, "i": INTS}])
        (p,) = col.get([1])
        assert _same(p.payload["f"], FLOATS), p.payload["f"]
        assert _same(p.payload["i"], INTS), p.payload["i"]
        # The raw text the server sends back.
        code, doc = _http("POST", s.url + "/collections/c/points", {"ids": [1]})
        assert code == 200 and doc["result"][0]["payload"]["f"][0] == 15028.519667320139
        hits = col.search([1.0, 2.0], k=1)[0]
        assert _same(hits[0].payload["f"], FLOATS)
        s.stop()
        s.start()  # from the WAL / store of a restarted server
        (p,) = vectide.Client(s.url).get_collection("c").get([1])
        assert _same(p.payload["f"], FLOATS)
    finally:
        s.stop()


def test_integers_json_cannot_keep_are_refused_not_rounded(tmp_path):
    db = vectide.connect(tmp_path / "db")
    c = db.create_collection("c", dim=2, metric="l2")
    for v in (2**64, -(2**63) - 1, 10**30):
        with pytest.raises(ValueError, match=r"2\*\*64-1"):
            c.upsert([1], [[1.0, 2.0]], payloads=[{"v": v}])
    with pytest.raises(ValueError, match="JSON"):
        c.upsert([1], [[1.0, 2.0]], payloads=[{"v": float("nan")}])
    assert len(c) == 0
    db.close()


# ---------------------------------------------------------------- item 6: threads

def test_http_threads_beyond_the_bound_are_400_and_start_nothing(tmp_path):
    _cli()
    s = Server(tmp_path / "db").start()
    try:
        def threads():
            return len(os.listdir(f"/proc/{s.proc.pid}/task"))

        before = threads()
        body = {"vectors": {"size": 3, "distance": "Euclid"}, "vectide": {"params": {"threads": 1500}}}
        code, doc = _http("PUT", s.url + "/collections/x", body)
        assert code == 400, doc
        assert "threads" in doc["status"]["error"] and "256" in doc["status"]["error"], doc
        assert threads() < before + 32
        assert _http("GET", s.url + "/collections/x/exists")[1]["result"]["exists"] is False
        for bad in (0, -1, 257, 2**64, 1.5, "8", True):
            body["vectide"]["params"]["threads"] = bad
            code, doc = _http("PUT", s.url + "/collections/x", body)
            assert code == 400 and "threads" in doc["status"]["error"], (bad, doc)
        body["vectide"]["params"]["threads"] = 2
        assert _http("PUT", s.url + "/collections/x", body)[0] == 200
    finally:
        s.stop()


def test_python_threads_and_sizes_are_bounded(tmp_path):
    lim = vectide.LIMITS
    assert lim["MAX_THREADS"] == 256 and lim["MAX_K"] >= 100_000
    with pytest.raises(ValueError, match=r"threads must be an integer in 1\.\.=256"):
        vectide.Index(4, threads=1500)
    with pytest.raises(ValueError, match="threads"):
        vectide.connect(tmp_path / "a", threads=1500)
    with pytest.raises(TypeError, match="threads"):
        vectide.connect(tmp_path / "a", threads=2.0)
    with pytest.raises(ValueError, match="dim"):
        vectide.Index(lim["MAX_DIM"] + 1)
    with pytest.raises(TypeError, match="dim"):
        vectide.Index(True)
    with pytest.raises(ValueError, match="m must be an integer in 2..=256"):
        vectide.Index(4, m=100_000)
    with pytest.raises(ValueError, match="ef_construction"):
        vectide.Index(4, ef_construction=10**7)
    with pytest.raises(ValueError, match="nlog_entries"):
        vectide.Index(4, engine="p-hnsw", path=tmp_path / "p", persist="msync", nlog_entries=10**6)
    assert not (tmp_path / "p").exists() or not any((tmp_path / "p").iterdir())
    db = vectide.connect(tmp_path / "db")
    with pytest.raises(ValueError, match="threads"):
        db.create_collection("x", dim=4, threads=1500)
    assert db.list_collections() == []
    idx = vectide.Index(4, threads=np.int64(2), m=np.int32(8))  # numpy integers are integers
    assert idx.threads == 2 and idx.params()["m"] == 8
    db.close()


# ---------------------------------------------------------------- item 7: k and ids

_HUGE_K = textwrap.dedent(
    """
    import sys, tempfile, numpy as np, vectide
    out = []
    def attempt(name, fn):
        try:
            fn()
            out.append(f"{name}: accepted")
        except Exception as e:
            out.append(f"{name}: {type(e).__name__}: {e}")
    idx = vectide.Index(3, metric="l2")
    idx.add([1, 2], np.ones((2, 3)))
    db = vectide.connect(tempfile.mkdtemp())
    c = db.create_collection("c", dim=3, metric="l2")
    c.upsert([1, 2], np.ones((2, 3)))
    q = np.ones(3)
    attempt("Index k=10**9", lambda: idx.search(q, k=10**9))
    attempt("Index k=10**12", lambda: idx.search(q, k=10**12))
    attempt("Index batch", lambda: idx.search(np.ones((1000, 3)), k=100_000))
    attempt("Collection k=10**9", lambda: c.search(q, k=10**9))
    attempt("Collection search_numpy k=10**9", lambda: c.search_numpy(q, k=10**9))
    attempt("Collection scroll limit=10**9", lambda: c.scroll(limit=10**9))
    ids, d = idx.search(q, k=100_000)  # at the bound: padded, allocated by the arrays only
    out.append(f"Index k=MAX_K shape {ids.shape} found {(ids != vectide.MISSING_ID).sum()}")
    hits = c.search(q, k=100_000)[0]
    out.append(f"Collection k=MAX_K found {len(hits)}")
    print("\\n".join(out))
    """
)


def test_huge_k_is_a_value_error_not_an_abort():
    """Under a 4 GiB address-space limit the old code aborted
    (``memory allocation of 8000000000 bytes failed``, SIGABRT)."""

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))

    p = subprocess.run([sys.executable, "-c", _HUGE_K], capture_output=True, text=True, timeout=300, preexec_fn=limit)
    assert p.returncode == 0, (p.returncode, p.stderr[-2000:])
    lines = dict(line.split(": ", 1) for line in p.stdout.strip().splitlines() if ": " in line)
    for name in ["Index k=10**9", "Index k=10**12", "Collection k=10**9", "Collection search_numpy k=10**9"]:
        assert lines[name].startswith("ValueError: k must be in 1..=100000"), (name, lines[name])
    assert lines["Index batch"].startswith("ValueError") and "split the batch" in lines["Index batch"]
    assert lines["Collection scroll limit=10**9"].startswith("ValueError: limit must be in 0..=100000")
    assert "Index k=MAX_K shape (1, 100000) found 2" in p.stdout
    assert "Collection k=MAX_K found 2" in p.stdout


def test_wrong_id_types_are_type_errors_naming_the_position(tmp_path):
    db = vectide.connect(tmp_path / "db")
    c = db.create_collection("c", dim=3, metric="l2")
    c.upsert([7], np.ones((1, 3)))
    with pytest.raises(TypeError, match="position 0") as e:
        c.upsert([1.0, None, 2.5], np.ones((3, 3)))
    assert "float" in str(e.value)
    for ids, pos, typ in [([1, None], 1, "NoneType"), ([2, 3, 2.5], 2, "float"), ([True], 0, "bool"),
                          ([b"x"], 0, "bytes"), ([np.float32(1)], 0, "float32"), ([[1]], 0, "list")]:
        with pytest.raises(TypeError, match=f"{typ}.*position {pos}"):
            c.upsert(ids, np.ones((len(ids), 3)))
    for bad in (1.5, None, b"ab", {1: 2}):
        with pytest.raises(TypeError):
            c.upsert(bad, np.ones((1, 3)))
    with pytest.raises(ValueError, match="position 0"):
        c.upsert([-1], np.ones((1, 3)))
    with pytest.raises(TypeError, match="position 0"):
        c.get([1.0])
    with pytest.raises(TypeError, match="position 0"):
        c.delete([None])
    with pytest.raises(TypeError):
        c.scroll(offset=2.5)
    assert [p.id for p in c.scroll(limit=10)[0]] == [7]
    # The accepted kinds: int (numpy too), str, uuid.UUID.
    u = uuid.UUID(int=5)
    c.upsert([np.uint64(2**64 - 1), "doc", u, np.int32(3)], np.ones((4, 3)))
    assert sorted(map(str, (p.id for p in c.scroll(limit=10)[0]))) == sorted(["7", "3", str(2**64 - 1), "doc", str(u)])
    (p,) = c.get([u])
    assert p.id == str(u)
    db.close()
    # The Index: ids are integers.
    idx = vectide.Index(3)
    with pytest.raises(TypeError, match="position 1"):
        idx.add([1, 2.5], np.ones((2, 3)))
    assert len(idx) == 0


def test_client_rejects_the_same_ids_and_sizes(tmp_path):
    _cli()
    s = Server(tmp_path / "db").start()
    try:
        col = vectide.Client(s.url).create_collection("c", dim=3, metric="l2")
        col.upsert([7], np.ones((1, 3)))
        with pytest.raises(TypeError, match="position 0"):
            col.upsert([1.0, None, 2.5], np.ones((3, 3)))
        with pytest.raises(ValueError, match="limit"):
            col.search(np.ones(3), k=10**9)
        with pytest.raises(TypeError, match="k must be an int"):
            col.search(np.ones(3), k=2.5)
        # Raw HTTP: Qdrant ids are unsigned integers or strings; anything else is 400.
        for bad in [1.5, None, True, {}, [], -1, 2**64]:
            code, doc = _http("PUT", s.url + "/collections/c/points?wait=true", {"points": [{"id": bad, "vector": [1, 2, 3]}]})
            assert code == 400 and "id" in doc["status"]["error"], (bad, doc)
        for body in [{"query": [1, 2, 3], "limit": 100_001}, {"query": [1, 2, 3], "offset": 99_999, "limit": 2},
                     {"query": [1, 2, 3], "params": {"hnsw_ef": 100_001}}]:
            code, doc = _http("POST", s.url + "/collections/c/points/query", body)
            assert code == 400, (body, doc)
        assert col.count() == 1
    finally:
        s.stop()


# ---------------------------------------------------------------- item 8: API key

def test_every_wrong_api_key_is_refused(tmp_path):
    _cli()
    key = "s3cret-Key-0123456789"
    s = Server(tmp_path / "db", api_key=key).start()
    try:
        for wrong in ["", "x", key[:-1], key + "0", key[:-1] + "X", key.upper(), "\u00e9" * len(key)]:
            hdr = {"api-key": wrong.encode("utf-8").decode("latin-1")}
            code, doc = _http("GET", s.url + "/collections", headers=hdr)
            assert code == 401 and "api-key" in doc["status"]["error"], (wrong, doc)
        assert _http("GET", s.url + "/collections")[0] == 401
        assert _http("GET", s.url + "/collections", headers={"api-key": key})[0] == 200
    finally:
        s.stop()
