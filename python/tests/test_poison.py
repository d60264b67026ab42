"""A poisoned collection (a committed write that failed to apply):
``vectide.PoisonedError`` from the embedded database and from the HTTP
client, reads going on, and a reopen that replays the write."""

from __future__ import annotations

import http.server
import json
import threading

import numpy as np
import pytest

vectide = pytest.importorskip("vectide._vectide") and __import__("vectide")
from vectide import _vectide  # noqa: E402


@pytest.fixture
def faults():
    yield _vectide._arm_fault
    _vectide._clear_faults()


def test_the_embedded_collection_refuses_writes_until_reopened(tmp_path, faults):
    assert issubclass(vectide.PoisonedError, RuntimeError)
    X = np.random.default_rng(1).normal(size=(30, 8)).astype(np.float32)
    db = vectide.connect(tmp_path / "db")
    c = db.create_collection("c", dim=8, metric="l2", engine="spfresh")
    c.upsert(list(range(20)), X[:20])
    faults(str(tmp_path / "db"), "db.apply", 1)
    with pytest.raises(vectide.PoisonedError, match="injected fault at db.apply"):
        c.upsert([20], X[20:21])
    assert "record" in c.info()["poisoned"]
    # Reads go on; writes are refused with the first cause, and not logged.
    assert len(c) == 20 and c.search(X[3], k=1)[0][0].id == 3
    last = c.info()["last_seq"]
    for write in (lambda: c.upsert([21], X[21:22]), lambda: c.delete([0]), lambda: c.set_payload({"a": 1}, ids=[1])):
        with pytest.raises(vectide.PoisonedError, match="injected fault at db.apply"):
            write()
    assert c.info()["last_seq"] == last
    del c
    db.close()
    db = vectide.connect(tmp_path / "db")
    c = db.get_collection("c")
    assert c.info()["poisoned"] is None
    assert len(c) == 21 and [p.id for p in c.get([20])] == [20]
    c.upsert([21], X[21:22])
    assert len(c) == 22


class _Poisoned(http.server.BaseHTTPRequestHandler):
    """Answers every request as a server with a poisoned collection does."""

    def do_PUT(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = json.dumps({"status": {"error": "poisoned: record 7 failed: disk; writes are refused"}, "time": 0}).encode()
        self.send_response(503)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_PUT

    def log_message(self, *args):
        pass


def test_the_http_client_raises_the_same_exception():
    srv = http.server.HTTPServer(("127.0.0.1", 0), _Poisoned)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        from vectide.client import RemoteCollection

        client = vectide.Client(f"http://127.0.0.1:{srv.server_address[1]}", timeout=10)
        col = RemoteCollection(client, "c")
        with pytest.raises(vectide.PoisonedError, match="record 7"):
            col.upsert([1], np.ones((1, 4), dtype=np.float32))
    finally:
        srv.shutdown()
        srv.server_close()
