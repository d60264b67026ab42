"""The engine registry as Python sees it: `vectide.engines()`, search knobs
checked against the engine's, and errors naming what is known."""

from __future__ import annotations

import numpy as np
import pytest

vectide = pytest.importorskip("vectide._vectide") and __import__("vectide")


def test_engines_lists_every_engine_with_its_schema():
    engines = {e["name"]: e for e in vectide.engines()}
    assert vectide.DEFAULT_ENGINE in engines
    assert {"hnsw", "p-hnsw", "hnsw-snap", "hnsw-wal"} <= set(engines)
    for e in engines.values():
        assert e["summary"] and e["persistence"]
        assert e["medium"] in ("ram", "pmem", "ssd", "remote")
        assert e["in_directory"] or e["medium"] in ("ram", "remote"), e["name"]
        names = [p["name"] for p in e["params"]]
        assert "threads" in names and len(names) == len(set(names))
        assert ("path" in names) == e["in_directory"]
        for p in e["params"]:
            assert p["type"] and p["doc"] and p["source"], (e["name"], p)
        assert e["primary_knob"] is None or e["primary_knob"] in e["knobs"]
    h = engines["hnsw"]
    assert h["knobs"] == ["ef"] and h["primary_knob"] == "ef" and not h["in_directory"]
    m = next(p for p in h["params"] if p["name"] == "m")
    assert m["type"] == "integer 2..=256" and m["default"] == "16"
    assert engines["p-hnsw"]["persistence"] == "durable on acknowledgement"
    assert engines["p-hnsw"]["medium"] == "pmem" and engines["fresh-diskann"]["medium"] == "ssd"


def test_search_knobs_are_checked_against_the_engine():
    rng = np.random.default_rng(3)
    X = rng.standard_normal((300, 8)).astype(np.float32)
    idx = vectide.Index(8, "l2", m=8)
    idx.add(np.arange(300), X)
    ids, _ = idx.search(X[:5], k=3, ef=40)
    assert (ids[:, 0] == np.arange(5)).all()
    with pytest.raises(ValueError, match=r'unknown search knob "nprobe" for engine "hnsw"; it takes: ef'):
        idx.search(X[:1], k=3, nprobe=4)
    with pytest.raises(ValueError, match="ef"):
        idx.search(X[:1], k=3, ef=0)


def test_unknown_engine_names_the_known_ones(tmp_path):
    with pytest.raises(ValueError, match="known engines: hnsw, p-hnsw"):
        vectide.Index(8, "l2", engine="nope")
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "junk").write_bytes(b"x")
    with pytest.raises(ValueError, match="holds no index of a known engine"):
        vectide.Index.load(tmp_path / "x")
    assert sorted(p.name for p in (tmp_path / "x").iterdir()) == ["junk"]


def _exact(X, q, k, metric):
    if metric == "l2":
        d = ((X - q) ** 2).sum(1)
    else:
        d = -(X @ q)
    return np.lexsort((np.arange(len(X)), d))[:k]


@pytest.mark.parametrize("metric", ["l2", "ip"])
def test_flat_is_exact_saves_and_loads(tmp_path, metric):
    rng = np.random.default_rng(11)
    X = rng.standard_normal((2000, 16)).astype(np.float32)
    idx = vectide.Index(16, metric, engine="flat", threads=2)
    assert idx.engine == "flat"
    idx.add(np.arange(2000), X)
    idx.delete([3, 4])
    idx.add([5], X[6:7])  # upsert
    Q = rng.standard_normal((50, 16)).astype(np.float32)
    ids, _ = idx.search(Q, k=10)  # batched
    one, _ = idx.search(Q[0], k=10)  # a single query
    live = np.array([i for i in range(2000) if i not in (3, 4)])
    Xl = X[live].copy()
    Xl[live == 5] = X[6]
    for r in range(50):
        want = live[_exact(Xl, Q[r], 10, metric)]
        assert set(ids[r]) == set(want), r
    assert (one[0] == ids[0]).all()
    with pytest.raises(ValueError, match='unknown search knob "ef" for engine "flat"; it takes: none'):
        idx.search(Q[0], k=3, ef=10)
    with pytest.raises(ValueError, match='unknown search knob "ef"'):
        idx.ef_search = 10
    path = tmp_path / "f.vtdx"
    idx.save(path)
    back = vectide.Index.load(path)
    assert back.engine == "flat" and len(back) == 1998 and 3 not in back
    np.testing.assert_array_equal(back.search(Q, k=10)[0], ids)
    with pytest.raises(ValueError, match="unknown parameter"):
        vectide.Index(16, metric, engine="flat", m=16)


def test_flat_collections(tmp_path):
    import vectide.db  # noqa: F401

    db = vectide.connect(tmp_path / "db")
    c = db.create_collection("f", dim=4, metric="l2", engine="flat")
    X = np.random.default_rng(2).standard_normal((300, 4)).astype(np.float32)
    c.upsert(list(range(300)), X, payloads=[{"i": i} for i in range(300)])
    hits = c.search(X[9], k=3)[0]
    assert hits[0].id == 9 and hits[0].payload == {"i": 9}
    db.close()
    db = vectide.connect(tmp_path / "db")
    c = db.get_collection("f")
    assert len(c) == 300 and c.search(X[9], k=1)[0][0].id == 9
    db.close()


def test_maintain_runs_pending_consolidation_now():
    rng = np.random.default_rng(4)
    X = rng.standard_normal((500, 8)).astype(np.float32)
    # Deletes below the automatic threshold stay pending until maintain().
    idx = vectide.Index(8, "l2", m=8, consolidate_fraction=0.5)
    idx.add(np.arange(500), X)
    idx.delete(np.arange(20))
    before = idx.stats()
    assert before["pending_deletes"] == 20
    idx.maintain()
    after = idx.stats()
    assert after["pending_deletes"] == 0
    assert after["consolidations"] == before["consolidations"] + 1
    assert len(idx) == 480 and 3 not in idx
