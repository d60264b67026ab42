"""One test suite for the collection protocol (``vectide.protocol``), run
against each implementation: the embedded database and the HTTP client
talking to ``vectide serve`` on loopback."""

from __future__ import annotations

import uuid

import numpy as np
import pytest

vectide = pytest.importorskip("vectide._vectide") and __import__("vectide")

from vectide.protocol import CollectionProtocol, DatabaseProtocol  # noqa: E402


@pytest.fixture(params=["embedded", "http"])
def db(request, tmp_path):
    if request.param == "embedded":
        d = vectide.connect(tmp_path / "db")
        yield d
        d.close()
    else:
        from test_server import Server

        s = Server(tmp_path / "db").start()
        try:
            yield vectide.Client(s.url)
        finally:
            s.stop()


X = np.array([[0, 0, 0], [1, 0, 0], [0, 3, 4], [2, 2, 2], [5, 0, 0]], dtype=np.float32)
U = "5c56c793-69f3-4fbf-87e6-c4bf54c28c26"


def _filled(db):
    c = db.create_collection("c", dim=3, metric="l2")
    c.upsert([1, 2, "k", uuid.UUID(U), 9], X,
             payloads=[{"city": "Lima", "n": 1}, {"city": "Rome", "n": 2}, None, {"city": "Lima", "n": 4}, {"n": 9}])
    return c


def test_both_implementations_satisfy_the_protocol(db):
    assert isinstance(db, DatabaseProtocol)
    c = _filled(db)
    assert isinstance(c, CollectionProtocol)
    assert c.name == "c" and len(c) == 5 and db.list_collections() == ["c"]
    assert isinstance(c.info(), dict)


def test_search_get_and_ids_round_trip(db):
    c = _filled(db)
    hits = c.search([0, 0, 0.1], k=2)[0]
    assert [h.id for h in hits] == [1, 2]
    assert hits[0].score == pytest.approx(0.1, abs=1e-5) and hits[0].payload == {"city": "Lima", "n": 1}
    hits = c.search([0, 3, 4], k=1, with_payload=False, with_vector=True)[0]
    assert hits[0].id == "k" and hits[0].payload is None and list(hits[0].vector) == [0, 3, 4]
    (p,) = c.get([uuid.UUID(U)])
    assert p.id == U and p.payload == {"city": "Lima", "n": 4}
    assert p.vector.dtype == np.float32 and p.vector.tolist() == [2, 2, 2]
    assert [q.id for q in c.get([9, 1])] == [9, 1]
    with pytest.raises(KeyError, match="77"):
        c.get([1, 77])
    ids, scores = c.search_numpy(np.stack([X[0], X[4]]), k=7)
    assert ids.shape == scores.shape == (2, 7)
    assert ids[0, 0] == 1 and ids[1, 0] == 9 and np.isnan(scores[0, 5:]).all()


def test_filters_count_scroll_and_delete(db):
    c = _filled(db)
    lima = {"must": [{"key": "city", "match": {"value": "Lima"}}]}
    assert c.count(lima) == 2 and c.count() == 5
    got = c.search([0, 0, 0], k=5, filter=lima)[0]
    assert sorted(str(h.id) for h in got) == ["1", U]
    c.create_index("city", "keyword")
    assert [h.id for h in c.search([0, 0, 0], k=5, filter=lima)[0]] == [h.id for h in got]
    big = {"must": [{"key": "n", "range": {"gte": 2}}]}
    assert c.count(big) == 3
    seen, offset = [], None
    while True:
        page, offset = c.scroll(offset=offset, limit=2)
        assert len(page) <= 2
        seen += [p.id for p in page]
        if offset is None:
            break
    assert sorted(map(str, seen)) == sorted(["1", "2", "9", "k", U]) and len(seen) == 5
    assert c.delete(filter=big) == 3 and len(c) == 2
    assert c.delete([1]) == 1 and c.count() == 1


def test_set_payload_merges_keys(db):
    c = _filled(db)
    assert c.set_payload({"tag": True}, ids=[1, 2]) == 2
    assert c.get([1])[0].payload == {"city": "Lima", "n": 1, "tag": True}
    assert c.set_payload({"n": 0}, filter={"must": [{"key": "city", "match": {"value": "Lima"}}]}) == 2
    assert c.count({"must": [{"key": "n", "match": {"value": 0}}]}) == 2


def test_bad_input_is_refused_and_changes_nothing(db):
    c = _filled(db)
    with pytest.raises(TypeError):
        c.upsert([True], X[:1])
    with pytest.raises(ValueError):
        c.upsert([42], np.array([[0, np.nan, 0]], dtype=np.float32))
    with pytest.raises(ValueError):
        c.upsert([42, 43], X[:1])
    with pytest.raises(ValueError):
        c.upsert([42], X[:1], payloads=[{"v": float("inf")}])
    with pytest.raises(ValueError):
        c.search([0, 0], k=1)
    assert len(c) == 5 and c.count({"must": [{"has_id": [42, 43]}]}) == 0


def test_collections_are_created_listed_and_deleted(db):
    _filled(db)
    with pytest.raises(ValueError):
        db.create_collection("c", dim=3)
    db.create_collection("d", dim=2, metric="cosine")
    assert db.list_collections() == ["c", "d"]
    assert db.delete_collection("d") and db.list_collections() == ["c"]
    with pytest.raises(KeyError):
        db.get_collection("d")
    assert len(db.get_collection("c")) == 5


def _engine_stats(c):
    info = c.info()
    return (info.get("vectide") or info)["engine_stats"]


def test_maintain_and_checkpoint_do_their_work_now(db, tmp_path):
    c = db.create_collection("m", dim=2, metric="l2", engine="hnsw")
    c.upsert(list(range(300)), np.stack([np.arange(300), np.ones(300)], axis=1).astype(np.float32))
    assert c.delete(list(range(100))) == 100
    assert _engine_stats(c)["pending_deletes"] == 100
    c.maintain()
    assert _engine_stats(c)["pending_deletes"] == 0
    wal = tmp_path / "db" / "collections" / "m" / "wal"
    logged = sum(f.stat().st_size for f in wal.iterdir())
    c.checkpoint()
    assert sum(f.stat().st_size for f in wal.iterdir()) < logged / 10
    assert c.count() == 200 and [h.id for h in c.search([150, 1], k=1)[0]] == [150]
