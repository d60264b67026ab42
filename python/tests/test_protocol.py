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


def _rag(db):
    """A collection of two named dense spaces and a sparse one (IDF)."""
    c = db.create_collection(
        "rag",
        vectors={"text": {"dim": 3, "metric": "cosine", "engine": "flat"}, "image": {"dim": 2, "metric": "l2"}},
        sparse_vectors={"words": {"modifier": "idf"}},
    )
    pts = [
        {"id": 1, "vector": {"text": [1, 0, 0], "image": [0, 0], "words": {"indices": [1, 2], "values": [1.0, 1.0]}},
         "payload": {"meta": {"topic": "a"}, "tags": ["x", "y"]}},
        {"id": 2, "vector": {"text": np.array([0, 1, 0], dtype=np.float32), "words": {"indices": [2], "values": [2.0]}},
         "payload": {"meta": {"topic": "b"}, "tags": ["y"]}},
        {"id": 3, "vector": {"image": [3, 4], "words": {"indices": [3], "values": [0.5]}}, "payload": {"meta": {"topic": "a"}}},
        {"id": 4, "vector": {"text": [0.7, 0.7, 0]}, "payload": {"meta": {"topic": "c"}, "tags": []}},
    ]
    c.upsert_points(pts)
    return c


def test_named_and_sparse_vectors_and_the_query_api(db):
    c = _rag(db)
    assert len(c) == 4
    hits = c.query([1, 0, 0], using="text", limit=2, params={"exact": True})
    assert [h.id for h in hits] == [1, 4] and hits[0].score == pytest.approx(1.0, abs=1e-5)
    # Sparse with IDF: N = 3 holders of "words"; term 2 in two, term 1 in one.
    idf1, idf2 = np.log((3 - 1 + 0.5) / 1.5 + 1), np.log((3 - 2 + 0.5) / 2.5 + 1)
    hits = c.query({"indices": [1, 2], "values": [1.0, 1.0]}, using="words", limit=5)
    assert [h.id for h in hits] == [1, 2]
    assert hits[0].score == pytest.approx(idf1 + idf2, rel=1e-5) and hits[1].score == pytest.approx(2 * idf2, rel=1e-5)
    # A point lacking a space is not found there.
    assert [h.id for h in c.query([0, 0], using="image", limit=5)] == [1, 3]
    # Nearest by point id leaves the point out.
    assert [h.id for h in c.query(1, using="text", limit=1, params={"exact": True})] == [4]
    # Hybrid: RRF over a dense and a sparse prefetch (k = 2): 1 is first in
    # both (1/2 + 1/2), 2 second in sparse (1/3), 4 second in dense (1/3).
    fused = c.query({"fusion": "rrf"}, prefetch=[
        {"query": [1, 0, 0], "using": "text", "limit": 2, "params": {"exact": True}},
        {"query": {"indices": [1, 2], "values": [1.0, 1.0]}, "using": "words"},
    ], limit=3, with_vector=["words"])
    assert [h.id for h in fused] == [1, 4, 2] and fused[0].score == pytest.approx(1.0)
    assert fused[0].vector == {"words": {"indices": [1, 2], "values": [1.0, 1.0]}}
    assert fused[1].vector == {}
    dbsf = c.query({"fusion": "dbsf"}, prefetch=[{"query": [1, 0, 0], "using": "text", "params": {"exact": True}}], limit=4)
    assert dbsf[0].id == 1
    topic_a = {"must": [{"key": "meta.topic", "match": {"value": "a"}}]}
    assert [h.id for h in c.query({"fusion": "rrf"}, prefetch=[{"query": [0, 0], "using": "image"}], filter=topic_a)] == [1, 3]
    (p,) = c.get([2], with_vector=True)
    assert p.payload == {"meta": {"topic": "b"}, "tags": ["y"]}
    assert sorted(p.vector) == ["text", "words"] and p.vector["text"].tolist() == [0, 1, 0]
    assert p.vector["words"] == {"indices": [2], "values": [2.0]}
    for bad in ({"fusion": "rrf"}, {"indices": [1, 1], "values": [1, 1]}):
        with pytest.raises(ValueError):
            c.query(bad, using="words")
    with pytest.raises(ValueError, match="no vector named"):
        c.upsert_points([{"id": 9, "vector": {"nope": [1, 2, 3]}}])
    with pytest.raises(ValueError, match="values"):
        c.upsert_points([{"id": 9, "vector": {"words": {"indices": [1, 2], "values": [1.0]}}}])
    with pytest.raises(ValueError):
        c.upsert_points([{"id": 9, "vector": {"words": {"indices": [1], "values": [float("nan")]}}}])
    assert len(c) == 4


def test_mmr_weighted_rrf_and_groups(db):
    c = _rag(db)
    exact = {"exact": True}
    assert [h.id for h in c.query([1, 0, 0], using="text", limit=3, params=exact)] == [1, 4, 2]
    # MMR with diversity 1: after the most relevant point, the least
    # similar to those picked; each keeps its similarity as score.
    hits = c.query({"nearest": [1, 0, 0], "mmr": {"diversity": 1.0, "candidates_limit": 3}}, using="text", limit=3,
                   params=exact)
    assert [h.id for h in hits] == [1, 2, 4]
    assert [h.score for h in hits] == pytest.approx([1.0, 0.0, 0.5 ** 0.5], abs=1e-5)
    # Weighted RRF (k = 2): 1 is first in both (1/2 + 1/(1/3 + 1)), 2
    # second in the sparse one of weight 3 (1/(2/3 + 1)), 4 second in the
    # dense one (1/3).
    fused = c.query({"rrf": {"weights": [1.0, 3.0]}}, prefetch=[
        {"query": [1, 0, 0], "using": "text", "limit": 2, "params": exact},
        {"query": {"indices": [1, 2], "values": [1.0, 1.0]}, "using": "words"},
    ], limit=3)
    assert [h.id for h in fused] == [1, 2, 4]
    assert [h.score for h in fused] == pytest.approx([1.25, 0.6, 1 / 3])
    # Groups: the answer is 1, 4, 2 (3 has no text vector); 4's tags are
    # empty, so it joins no group; 1 is in two.
    groups = c.query_groups("tags", [1, 0, 0], using="text", limit=3, group_size=2, params=exact)
    assert [(g.id, [h.id for h in g.hits]) for g in groups] == [("x", [1]), ("y", [1, 2])]
    assert groups[1].hits[1].payload == {"meta": {"topic": "b"}, "tags": ["y"]}
    groups = c.query_groups("meta.topic", [1, 0, 0], using="text", limit=2, with_payload=False, params=exact)
    assert [(g.id, [h.id for h in g.hits]) for g in groups] == [("a", [1]), ("c", [4])]
    assert groups[0].hits[0].payload is None and groups[0].hits[0].score == pytest.approx(1.0)
    with pytest.raises(ValueError, match="group_size"):
        c.query_groups("tags", [1, 0, 0], using="text", group_size=0)
    with pytest.raises(ValueError, match="2 weights for 1 prefetches"):
        c.query({"rrf": {"weights": [1, 2]}}, prefetch=[{"query": [1, 0, 0], "using": "text"}])
    with pytest.raises(ValueError, match="diversity"):
        c.query({"nearest": [1, 0, 0], "mmr": {"diversity": 2}}, using="text")
    with pytest.raises(TypeError, match="group_by"):
        c.query_groups(3, [1, 0, 0], using="text")


def test_payload_edits_and_nested_filters(db):
    c = _rag(db)
    assert c.count({"must": [{"key": "tags[]", "match": {"value": "y"}}]}) == 2
    assert c.count({"must": [{"is_empty": {"key": "tags"}}]}) == 2
    assert c.count({"min_should": {"conditions": [{"key": "meta.topic", "match": {"value": "a"}}, {"has_id": [1, 4]}], "min_count": 2}}) == 1
    assert c.set_payload({"n": 1, "topic": None}, ids=[1], key="meta") == 1
    assert c.get([1])[0].payload["meta"] == {"n": 1}
    assert c.overwrite_payload({"only": True}, filter={"must": [{"key": "meta.topic", "match": {"value": "b"}}]}) == 1
    assert c.get([2])[0].payload == {"only": True}
    assert c.delete_payload(["tags"], ids=[1, 4]) == 2
    assert "tags" not in c.get([1])[0].payload
    assert c.clear_payload(ids=[3]) == 1
    assert c.get([3])[0].payload == {}
    assert c.delete(filter={"must": [{"key": "meta.topic", "match": {"value": "c"}}]}) == 1
    assert len(c) == 3
    with pytest.raises(ValueError, match="key path"):
        c.delete_payload(["a["], ids=[1])
