"""The embedded database from Python: vectide.connect()."""

from __future__ import annotations

import numpy as np
import pytest

vectide = pytest.importorskip("vectide._vectide") and __import__("vectide")


def test_collections_points_filters_and_reopen(tmp_path):
    db = vectide.connect(tmp_path / "db")
    docs = db.create_collection("docs", dim=8, metric="l2", m=8)
    assert db.list_collections() == ["docs"]
    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 8)).astype(np.float32)
    payloads = [{"city": ["Berlin", "Paris", "Rome"][i % 3], "year": 2000 + i % 20} for i in range(300)]
    docs.upsert(list(range(300)), X, payloads=payloads)
    docs.upsert(["doc-x", "5c56c793-69f3-4fbf-87e6-c4bf54c28c26"], X[:2] + 10, payloads=[{"city": "Lima"}, None])
    assert len(docs) == 302
    hits = docs.search(X[5], k=3)[0]
    assert hits[0].id == 5 and hits[0].payload["city"] == "Rome" and hits[0].score == pytest.approx(0, abs=1e-3)
    berlin = {"must": [{"key": "city", "match": {"value": "Berlin"}}], "must_not": [{"key": "year", "range": {"gte": 2010}}]}
    got = docs.search(X[:4], k=5, filter=berlin)
    assert len(got) == 4 and all(h.payload["city"] == "Berlin" and h.payload["year"] < 2010 for q in got for h in q)
    assert docs.count(berlin) == 50
    ids, scores = docs.search_numpy(X[:2], k=4)
    # Integer ids come back as uint64 (object arrays are for string/UUID ids).
    assert ids.dtype == np.uint64
    assert ids[0, 0] == 0 and scores.shape == (2, 4)
    assert docs.delete(filter={"must": [{"key": "city", "match": {"value": "Rome"}}]}) == 100
    assert docs.delete([0, 999]) == 1
    assert docs.set_payload({"tag": 1}, ids=["doc-x"]) == 1
    with pytest.raises(KeyError, match="999"):
        docs.get([1, 999])
    docs.create_index("city", "keyword")
    assert docs.info()["indexes"] == {"city": "keyword"}
    del docs
    del db
    db = vectide.connect(tmp_path / "db")
    docs = db.get_collection("docs")
    assert len(docs) == 201
    (p,) = docs.get(["doc-x"])
    assert p.payload == {"city": "Lima", "tag": 1}
    np.testing.assert_array_equal(p.vector, X[0] + 10)
    pts, nxt = docs.scroll(limit=5)
    assert [x.id for x in pts] == [1, 3, 4, 6, 7] and nxt == 9
    assert db.delete_collection("docs") and db.list_collections() == []


def test_collection_search_knobs_and_exact(tmp_path):
    db = vectide.connect(tmp_path / "db")
    rng = np.random.default_rng(3)
    X = rng.normal(size=(400, 8)).astype(np.float32)
    c = db.create_collection("c", dim=8, metric="l2", m=4, ef_construction=8)
    c.upsert(list(range(400)), X)
    q = rng.normal(size=(20, 8)).astype(np.float32)
    truth = np.argsort(((X[None, :, :] - q[:, None, :]) ** 2).sum(-1), axis=1)[:, :10]
    exact = c.search_numpy(q, k=10, exact=True)[0].astype(np.int64)
    np.testing.assert_array_equal(exact, truth)
    # A native knob the engine takes is accepted, one it does not is named.
    assert len(c.search(q[0], k=5, ef=64)[0]) == 5
    with pytest.raises(ValueError, match="nprobe.*ef|ef.*nprobe"):
        c.search(q[0], k=5, nprobe=4)
    with pytest.raises(ValueError, match="ef"):
        c.search(q[0], k=5, ef=0)
    # `ef` is the primary knob, ignored where there is none (flat is exact).
    f = db.create_collection("f", dim=8, metric="l2", engine="flat")
    f.upsert(list(range(400)), X)
    np.testing.assert_array_equal(f.search_numpy(q, k=10, ef=5)[0].astype(np.int64), truth)


def test_bad_input_and_locking(tmp_path):
    db = vectide.connect(tmp_path / "db")
    with pytest.raises(vectide.DatabaseLockedError):
        vectide.connect(tmp_path / "db")
    c = db.create_collection("c", dim=4)
    with pytest.raises(ValueError, match="already exists"):
        db.create_collection("c", dim=4)
    with pytest.raises(KeyError):
        db.get_collection("nope")
    with pytest.raises(ValueError, match="unknown parameter"):
        db.create_collection("d", dim=4, M=3)
    with pytest.raises(ValueError, match="dimension"):
        c.upsert([1], np.ones((1, 3)))
    with pytest.raises(ValueError):
        c.upsert([1], np.full((1, 4), np.nan))
    with pytest.raises(ValueError, match="object"):
        c.upsert([1], np.ones((1, 4)), payloads=[[1, 2]])
    with pytest.raises(ValueError, match="unknown condition operator"):
        c.search(np.ones(4), filter={"must": [{"key": "a", "regex": "x"}]})
    with pytest.raises(ValueError, match="durability"):
        vectide.connect(tmp_path / "other", durability="sometimes")
    assert len(c) == 0


def test_close_releases_the_lock_and_handles_fail(tmp_path):
    rng = np.random.default_rng(5)
    X = rng.normal(size=(40, 4)).astype(np.float32)
    with vectide.connect(tmp_path / "db") as db:
        c = db.create_collection("c", dim=4, metric="l2", engine="p-hnsw")
        c.upsert(list(range(40)), X, payloads=[{"i": i} for i in range(40)])
        gone = db.create_collection("gone", dim=4)
        assert db.delete_collection("gone")
        with pytest.raises(RuntimeError, match="closed"):
            gone.upsert([1], X[:1])
    # The with-block closed it: this process (or another) can open it again,
    # while the old handles refuse to work.
    with pytest.raises(RuntimeError, match="closed"):
        c.search(X[0])
    with pytest.raises(RuntimeError, match="closed"):
        db.get_collection("c")
    db.close()  # idempotent
    with vectide.connect(tmp_path / "db") as again:
        c2 = again.get_collection("c")
        assert len(c2) == 40 and c2.get([7])[0].payload == {"i": 7}
        assert again.list_collections() == ["c"]
    # A collection handle keeps an unclosed database open on its own.
    c3 = vectide.connect(tmp_path / "db").get_collection("c")
    assert c3.search(X[3], k=1)[0][0].id == 3


@pytest.mark.parametrize("engine", ["p-hnsw", "hnsw-wal"])
def test_durable_engines_in_collections(tmp_path, engine):
    db = vectide.connect(tmp_path / "db", durability="always")
    c = db.create_collection("c", dim=4, metric="cosine", engine=engine, m=8)
    c.upsert(list(range(50)), np.random.default_rng(1).random((50, 4)) + 0.1)
    c.checkpoint()
    c.upsert([50], np.ones((1, 4)))
    del c, db
    db = vectide.connect(tmp_path / "db")
    c = db.get_collection("c")
    assert len(c) == 51 and c.info()["engine"] == engine
    # The engine's own counters, as the soak samples them.
    st = c.info()["engine_stats"]
    assert st["live"] == 51 and st["memory_bytes"] > 0 and st["disk_bytes"] > 0
