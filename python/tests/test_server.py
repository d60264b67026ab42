"""`vectide serve` against real clients: the unmodified qdrant-client (REST),
vectide.Client, raw HTTP for bad input, and SIGKILL crash rounds."""

from __future__ import annotations

import json
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
import http.client
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import numpy as np
import pytest

vectide = pytest.importorskip("vectide._vectide") and __import__("vectide")


def _cli() -> str:
    beside = Path(sys.executable).parent / "vectide"
    if not beside.exists():
        pytest.skip("the vectide CLI is not installed (run make build)")
    return str(beside)


class Server:
    """``vectide serve`` on a port the server picks itself (``--port 0``; it
    prints the address it listens on): no port is chosen here and then
    taken by another process before the server binds it."""

    def __init__(self, data: Path, api_key=None, durability="group"):
        self.data = data
        self.port = None
        self.url = None
        self.api_key = api_key
        self.durability = durability
        self.proc = None
        self.stderr = []

    def start(self, timeout=30.0):
        args = [_cli(), "serve", "--data", str(self.data), "--port", "0", "--durability", self.durability]
        if self.api_key:
            args += ["--api-key", self.api_key]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        listening = queue.Queue()
        self.stderr = lines = []

        def drain(proc=self.proc):  # also keeps the pipe from filling up
            for line in proc.stderr:
                lines.append(line)
                if "listening on " in line:
                    listening.put(line.split("listening on ", 1)[1].strip())
            listening.put(None)

        threading.Thread(target=drain, daemon=True).start()
        try:
            url = listening.get(timeout=timeout)
        except queue.Empty:
            raise RuntimeError("server did not start") from None
        if url is None:
            self.proc.wait()
            raise RuntimeError(f"server exited: {''.join(lines)}")
        self.url, self.port = url, int(url.rsplit(":", 1)[1])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {''.join(lines)}")
            try:
                with urllib.request.urlopen(self.url + "/healthz", timeout=1) as r:
                    if r.status == 200:
                        return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("server did not start")

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture
def server(tmp_path):
    s = Server(tmp_path / "db").start()
    yield s
    s.stop()


def _http(method, url, body=None, headers=None):
    data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    req = urllib.request.Request(url, data=data, method=method, headers={"content-type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            raw = r.read()
            if r.headers.get_content_type() == "application/json":
                return r.status, json.loads(raw or b"null")
            return r.status, raw.decode()
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            return e.code, json.loads(raw)
        except ValueError:
            return e.code, raw.decode(errors="replace")


def test_qdrant_client_end_to_end(server):
    qc = pytest.importorskip("qdrant_client")
    from qdrant_client import models as m

    client = qc.QdrantClient(url=server.url, prefer_grpc=False, check_compatibility=True, timeout=30)
    client.create_collection("docs", vectors_config=m.VectorParams(size=4, distance=m.Distance.COSINE))
    assert client.collection_exists("docs") and not client.collection_exists("nope")
    assert [c.name for c in client.get_collections().collections] == ["docs"]
    rng = np.random.default_rng(0)
    X = rng.random((200, 4)).astype(np.float32) + 0.01
    u = str(uuid.uuid4())
    points = [m.PointStruct(id=i, vector=X[i].tolist(), payload={"city": ["Berlin", "Paris"][i % 2], "n": i}) for i in range(199)]
    points.append(m.PointStruct(id=u, vector=X[199].tolist(), payload={"city": "Lima", "n": 199}))
    r = client.upsert("docs", points=points, wait=True)
    assert r.status == m.UpdateStatus.COMPLETED
    info = client.get_collection("docs")
    assert info.points_count == 200 and info.config.params.vectors.size == 4
    berlin = m.Filter(must=[m.FieldCondition(key="city", match=m.MatchValue(value="Berlin"))])
    res = client.query_points("docs", query=X[10].tolist(), query_filter=berlin, limit=5, with_payload=True).points
    assert res[0].id == 10 and res[0].score == pytest.approx(1.0, abs=1e-5)
    assert all(p.payload["city"] == "Berlin" for p in res)
    ranged = m.Filter(must=[m.FieldCondition(key="n", range=m.Range(gte=50, lt=60))])
    assert client.count("docs", count_filter=ranged, exact=True).count == 10
    got = client.retrieve("docs", ids=[3, u], with_payload=True, with_vectors=True)
    assert {p.id for p in got} == {3, u}
    assert np.allclose([p for p in got if p.id == 3][0].vector, X[3] / np.linalg.norm(X[3]), atol=1e-6)
    page, nxt = client.scroll("docs", limit=7, with_payload=False)
    assert [p.id for p in page] == list(range(7)) and nxt == 7
    client.set_payload("docs", payload={"tag": "x"}, points=[1, 2], wait=True)
    assert client.retrieve("docs", ids=[1])[0].payload == {"city": "Paris", "n": 1, "tag": "x"}
    client.create_payload_index("docs", field_name="city", field_schema="keyword")
    assert "city" in client.get_collection("docs").payload_schema
    client.delete("docs", points_selector=m.PointIdsList(points=[0, 1]), wait=True)
    client.delete("docs", points_selector=m.FilterSelector(filter=berlin), wait=True)
    assert client.count("docs", exact=True).count == 99
    # Our extension of the collection info: the engine's own counters.
    status, body = _http("GET", server.url + "/collections/docs")
    st = body["result"]["vectide"]["engine_stats"]
    assert status == 200 and st["live"] == 99 and st["memory_bytes"] > 0
    # ... and its own figures by name (none for the default engine).
    assert isinstance(st["extra"], dict) and all(isinstance(v, (int, float)) for v in st["extra"].values()), st
    batch = client.query_batch_points("docs", requests=[m.QueryRequest(query=X[5].tolist(), limit=3), m.QueryRequest(query=X[7].tolist(), limit=2)])
    assert [len(b.points) for b in batch] == [3, 2] and batch[0].points[0].id == 5
    assert client.delete_collection("docs")
    assert not client.collection_exists("docs")


def test_search_params_map_to_the_engines_knobs(server):
    u = server.url
    assert _http("PUT", u + "/collections/k", {"vectors": {"size": 4, "distance": "Euclid"}})[0] == 200
    rng = np.random.default_rng(5)
    X = rng.standard_normal((200, 4)).astype(np.float32)
    pts = [{"id": i, "vector": X[i].tolist()} for i in range(200)]
    assert _http("PUT", u + "/collections/k/points?wait=true", {"points": pts})[0] == 200
    q = X[7].tolist()
    exact = sorted(range(200), key=lambda i: float(((X[i] - X[7]) ** 2).sum()))[:5]
    for params in ({"exact": True}, {"hnsw_ef": 50}, {"vectide": {"ef": 50}}):
        code, doc = _http("POST", u + "/collections/k/points/query", {"query": q, "limit": 5, "params": params})
        assert code == 200, doc
        got = [p["id"] for p in doc["result"]["points"]]
        assert got[0] == 7 and (params != {"exact": True} or got == exact), (params, got)
    code, doc = _http("POST", u + "/collections/k/points/query", {"query": q, "params": {"vectide": {"nprobe": 4}}})
    assert code == 400 and "it takes: ef" in doc["status"]["error"], doc
    code, doc = _http("POST", u + "/collections/k/points/query", {"query": q, "params": {"vectide": {"ef": 0}}})
    assert code == 400 and "ef" in doc["status"]["error"], doc
    # An exact engine: hnsw_config and hnsw_ef do not apply and are ignored.
    body = {"vectors": {"size": 4, "distance": "Euclid"}, "hnsw_config": {"m": 8}, "vectide": {"engine": "flat"}}
    assert _http("PUT", u + "/collections/f", body)[0] == 200
    assert _http("PUT", u + "/collections/f/points?wait=true", {"points": pts})[0] == 200
    code, doc = _http("POST", u + "/collections/f/points/query", {"query": q, "limit": 5, "params": {"hnsw_ef": 50}})
    assert code == 200 and [p["id"] for p in doc["result"]["points"]] == exact, doc
    code, doc = _http("POST", u + "/collections/f/points/query", {"query": q, "params": {"vectide": {"ef": 5}}})
    assert code == 400 and "it takes: none" in doc["status"]["error"], doc


def test_bad_input_gets_json_4xx_and_changes_nothing(server):
    u = server.url
    assert _http("PUT", u + "/collections/c", {"vectors": {"size": 3, "distance": "Cosine"}})[0] == 200
    for body, needle in [
        ({"vectors": {"a": {"size": 3, "distance": "Cosine"}}, "sparse_vectors": {"a": {}}}, "used twice"),
        ({"vectors": {"size": 3, "distance": "Manhattan"}}, "Manhattan"),
        ({"vectors": {"a": {"size": 0, "distance": "Cosine"}}}, "vectors.a"),
        ({"vectors": {"size": 3, "distance": "Cosine"}, "sparse_vectors": {"s": {"modifier": "bm42"}}}, "modifier"),
        ({"vectors": {"a": {"size": 3, "distance": "Cosine"}}, "vectide": {"vectors": {"b": {"engine": "flat"}}}}, "no dense vector named"),
        ({}, "required"),
    ]:
        code, doc = _http("PUT", u + "/collections/d", body)
        assert code == 400 and needle in doc["status"]["error"], doc
    assert _http("GET", u + "/collections/nope")[0] == 404
    assert _http("POST", u + "/collections/nope/points/query", {"query": [1, 2, 3]})[0] == 404
    cases = [
        ({"points": [{"id": 1, "vector": [1, 2]}]}, "dimension"),
        (b'{"points": [{"id": 1, "vector": [1, 2, 3]}', "malformed JSON"),
        ({"points": [{"id": 1, "vector": {"named": [1, 2, 3]}}]}, "no vector named"),
        ({"points": [{"id": 1, "vector": {"indices": [1], "values": [1.0]}}]}, "needs its name"),
        ({"points": [{"id": -5, "vector": [1, 2, 3]}]}, "ids"),
        ({"points": [{"id": 1, "vector": [1, 2, 3], "payload": [1]}]}, "object"),
    ]
    for body, needle in cases:
        code, doc = _http("PUT", u + "/collections/c/points?wait=true", body)
        assert code == 400 and needle in doc["status"]["error"], (body, doc)
    code, doc = _http("POST", u + "/collections/c/points/query", {"query": [1, 2, 3], "filter": {"must": [{"key": "a", "regex": "x"}]}})
    assert code == 400 and "unknown condition operator" in doc["status"]["error"]
    # An oversized body is refused once the limit is passed (413).
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    conn.putrequest("PUT", "/collections/c/points?wait=true")
    conn.putheader("content-type", "application/json")
    conn.putheader("content-length", str(100 << 20))
    conn.endheaders()
    try:
        conn.send(b'{"points": [')
        for _ in range(100):
            conn.send(b"0," * (512 << 10))
    except OSError:
        pass  # the server answered and closed once the limit was passed
    resp = conn.getresponse()
    assert resp.status == 413
    conn.close()
    assert _http("POST", u + "/collections/c/points/count", {})[1]["result"]["count"] == 0
    assert _http("GET", u + "/openapi.json")[1]["openapi"].startswith("3.")
    code, text = _http("GET", u + "/metrics")
    assert code == 200
    assert 'vectide_points{collection="c"} 0' in text
    assert 'vectide_requests_total{route="/collections/{name}/points",method="PUT",status="400"}' in text


def test_api_key(tmp_path):
    s = Server(tmp_path / "db", api_key="s3cret").start()
    try:
        assert _http("GET", s.url + "/collections")[0] == 401
        assert _http("GET", s.url + "/collections", headers={"api-key": "wrong"})[0] == 401
        assert _http("GET", s.url + "/collections", headers={"api-key": "s3cret"})[0] == 200
        assert _http("GET", s.url + "/healthz")[0] == 200
        c = vectide.Client(s.url, api_key="s3cret")
        c.create_collection("k", dim=2)
        assert c.list_collections() == ["k"]
    finally:
        s.stop()


@pytest.mark.parametrize("rounds", [
    # The fast version: 8 rounds; the full one VECTIDE_SERVER_KILLS (default 20).
    pytest.param(8, id="small"),
    pytest.param(int(os.environ.get("VECTIDE_SERVER_KILLS", "20")), id="full", marks=pytest.mark.slow),
])
def test_sigkill_rounds_keep_every_acknowledged_write(tmp_path, rounds):
    """A client sends upserts and deletes of 10-point batches with wait=true
    while the server is SIGKILLed at random moments; after each restart every
    acknowledged batch is there (ids, vectors, payloads) and the batch in
    flight is all there or not at all. Where the kills land depends on
    timing (the moments are seeded, the requests' progress is not); the
    checks hold wherever they land."""
    rng = random.Random(7)
    s = Server(tmp_path / "db")
    s.start()
    c = vectide.Client(s.url, timeout=10)
    col = c.create_collection("k", dim=4, metric="l2", m=8)
    model = {}  # id -> (vector, payload)
    op = 0
    for r in range(rounds):
        killer = threading.Timer(rng.uniform(0.05, 0.4), s.kill)
        killer.start()
        in_flight = None
        try:
            while True:
                op += 1
                base = rng.randrange(0, 300)
                ids = [base * 10 + j for j in range(10)]
                if op % 3 == 0 and model:
                    victims = rng.sample(sorted(model), min(10, len(model)))
                    in_flight = ("delete", victims)
                    col.delete(victims)
                    for v in victims:
                        model.pop(v, None)
                else:
                    vecs = np.array([[op, j, r, 1.0] for j in range(10)], dtype=np.float32)
                    pays = [{"op": op, "j": j} for j in range(10)]
                    in_flight = ("upsert", ids, vecs, pays)
                    col.upsert(ids, vecs, payloads=pays)
                    for i, v, p in zip(ids, vecs, pays):
                        model[i] = (v, p)
                in_flight = None
        except (OSError, http.client.HTTPException, RuntimeError):
            pass
        killer.join()
        s.proc.wait()
        s.start()
        c = vectide.Client(s.url, timeout=10)
        col = c.get_collection("k")
        # The batch in flight: all or nothing.
        if in_flight and in_flight[0] == "upsert":
            _, ids, vecs, pays = in_flight
            pts = col._c._call("POST", f"/collections/k/points", {"ids": ids, "with_payload": True, "with_vector": True})
            mine = [p for p in pts if p["payload"] == pays[ids.index(p["id"])]]
            assert len(mine) in (0, 10), f"round {r}: upsert batch half applied ({len(mine)}/10)"
            if len(mine) == 10:
                for i, v, p in zip(ids, vecs, pays):
                    model[i] = (v, p)
        elif in_flight and in_flight[0] == "delete":
            victims = in_flight[1]
            present = col._c._call("POST", f"/collections/k/points", {"ids": victims})
            assert len(present) in (0, len([v for v in victims if v in model])), f"round {r}: delete half applied"
            if not present:
                for v in victims:
                    model.pop(v, None)
        assert col.count() == len(model), f"round {r}"
        if model:
            ids = sorted(model)
            got = col.get(ids)
            for p in got:
                v, pay = model[p.id]
                assert p.payload == pay and np.array_equal(p.vector, v), f"round {r}: point {p.id}"
    s.stop()


def test_a_dhnsw_collection_serves_and_its_lost_memory_node_is_a_503_with_retry_after(server):
    from vectide.memnode import MemoryNode

    u = server.url
    node = MemoryNode(64 << 20).start()
    try:
        # No LRU (cache_partitions 0): every search fetches from the node.
        body = {"vectors": {"size": 4, "distance": "Euclid"},
                "vectide": {"engine": "d-hnsw", "params": {"memnode": node.address, "timeout_ms": 2000,
                                                        "cache_partitions": 0}}}
        code, doc = _http("PUT", u + "/collections/remote", body)
        assert code == 200, doc
        rng = np.random.default_rng(9)
        X = rng.standard_normal((300, 4)).astype(np.float32)
        pts = [{"id": i, "vector": X[i].tolist()} for i in range(300)]
        assert _http("PUT", u + "/collections/remote/points?wait=true", {"points": pts})[0] == 200
        q = X[11].tolist()
        code, doc = _http("POST", u + "/collections/remote/points/query",
                          {"query": q, "limit": 3, "params": {"vectide": {"nprobe": 5}}})
        assert code == 200 and doc["result"]["points"][0]["id"] == 11, doc
    finally:
        node.stop()
    # The memory node is gone: a transient 503 that says retrying may help,
    # within the collection's timeout, and the server stays up.
    req = urllib.request.Request(u + "/collections/remote/points/query", method="POST",
                                 data=json.dumps({"query": q, "limit": 3}).encode(),
                                 headers={"content-type": "application/json"})
    t0 = time.monotonic()
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=60)
    assert time.monotonic() - t0 < 30
    assert e.value.code == 503 and e.value.headers.get("Retry-After") == "1"
    err = json.loads(e.value.read())["status"]["error"]
    assert "retrying may help" in err, err
    assert _http("GET", u + "/healthz")[0] == 200
