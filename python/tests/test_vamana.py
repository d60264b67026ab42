"""fresh-vamana from Python: several threads insert, delete and search at
once, and the end state matches a brute-force oracle; save/load; the
registry's schema."""

from __future__ import annotations

import threading

import numpy as np
import pytest

vectide = pytest.importorskip("vectide._vectide") and __import__("vectide")


def _truth(X, ids, Q, k):
    d = ((Q[:, None, :] - X[None, :, :]) ** 2).sum(-1)
    return ids[np.argsort(d, axis=1, kind="stable")[:, :k]]


def test_the_registry_describes_fresh_vamana():
    e = next(e for e in vectide.engines() if e["name"] == "fresh-vamana")
    defaults = {p["name"]: p["default"] for p in e["params"]}
    assert defaults["r"] == "64" and defaults["l_build"] == "75" and defaults["alpha"] == "1.2"
    assert e["knobs"] == ["ef"] and e["primary_knob"] == "ef"
    with pytest.raises(ValueError, match="alpha"):
        vectide.Index(8, "l2", engine="fresh-vamana", alpha=0.5)


def test_concurrent_inserts_deletes_and_searches_match_the_oracle(tmp_path):
    rng = np.random.default_rng(7)
    n, dim = 4000, 24
    centres = rng.standard_normal((30, dim)).astype(np.float32)
    X = (centres[rng.integers(0, 30, n)] + 0.2 * rng.standard_normal((n, dim))).astype(np.float32)
    idx = vectide.Index(dim, "l2", engine="fresh-vamana", r=32, l_build=64, threads=2)
    idx.add(np.arange(1000), X[:1000])  # a bulk build first
    errors: list[BaseException] = []
    stop = threading.Event()

    def writer(part: int) -> None:
        try:
            mine = np.arange(1000 + part, n, 2)
            for b in range(0, len(mine), 50):
                chunk = mine[b : b + 50]
                idx.add(chunk, X[chunk])
                idx.delete(chunk[::4])  # a quarter of each batch goes again
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    def reader(seed: int) -> None:
        # Its own generator: how many searches a reader makes depends on
        # timing, and the queries below must not (nor may two threads share
        # one generator).
        mine = np.random.default_rng(seed)
        try:
            while not stop.is_set():
                ids, _ = idx.search(X[mine.integers(0, n, 8)], k=10, ef=48)
                assert ((ids < n) | (ids == np.iinfo(np.uint64).max)).all()
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    writers = [threading.Thread(target=writer, args=(p,)) for p in (0, 1)]
    readers = [threading.Thread(target=reader, args=(100 + r,)) for r in range(2)]
    for t in writers + readers:
        t.start()
    for t in writers:
        t.join()
    stop.set()
    for t in readers:
        t.join()
    assert not errors, errors
    deleted = set()
    for part in (0, 1):
        mine = np.arange(1000 + part, n, 2)
        for b in range(0, len(mine), 50):
            deleted.update(mine[b : b + 50][::4].tolist())
    live = np.array([i for i in range(n) if i not in deleted])
    assert len(idx) == len(live)
    Q = (centres[rng.integers(0, 30, 200)] + 0.2 * rng.standard_normal((200, dim))).astype(np.float32)
    ids, _ = idx.search(Q, k=10, ef=64)
    truth = _truth(X[live], live, Q, 10)
    recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(ids.tolist(), truth.tolist())])
    assert recall >= 0.95, recall
    assert idx.check() == []
    path = tmp_path / "v.vama"
    idx.save(path)
    back = vectide.Index.load(path)
    assert back.engine == "fresh-vamana" and len(back) == len(live)
    np.testing.assert_array_equal(back.search(Q, k=10, ef=64)[0], ids)
