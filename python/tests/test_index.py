"""The Python API of vectide.Index: results, conventions and errors."""

from __future__ import annotations

import threading

import numpy as np
import pytest

vectide = pytest.importorskip("vectide._vectide") and __import__("vectide")

MISSING = 2**64 - 1


def clustered(n, dim, seed=0, centres=20):
    rng = np.random.default_rng(seed)
    c = rng.normal(size=(centres, dim)).astype(np.float32)
    x = c[rng.integers(0, centres, n)] + 0.3 * rng.normal(size=(n, dim)).astype(np.float32)
    return x.astype(np.float32)


def brute(x, q, k, metric):
    if metric == "l2":
        d = ((q[:, None, :] - x[None, :, :]) ** 2).sum(-1)
    elif metric == "ip":
        d = -(q @ x.T)
    else:
        xn = x / np.linalg.norm(x, axis=1, keepdims=True)
        qn = q / np.linalg.norm(q, axis=1, keepdims=True)
        d = 1 - qn @ xn.T
    return np.argsort(d, axis=1, kind="stable")[:, :k], np.sort(d, axis=1)[:, :k]


@pytest.mark.parametrize("metric", ["l2", "cosine", "ip"])
def test_recall_and_distance_conventions(metric):
    x = clustered(3000, 16)
    if metric == "ip":
        x /= np.linalg.norm(x, axis=1, keepdims=True)
    q = clustered(50, 16, seed=1)
    # One insert thread: the same graph, and so the same recall, every run.
    idx = vectide.Index(16, metric=metric, m=16, ef_construction=100, threads=1)
    idx.add(np.arange(len(x)), x)
    ids, dist = idx.search(q, k=10, ef=128)
    assert ids.shape == (50, 10) and ids.dtype == np.uint64
    assert dist.shape == (50, 10) and dist.dtype == np.float32
    true_ids, true_d = brute(x, q, 10, metric)
    recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(ids.astype(np.int64), true_ids)])
    assert recall >= 0.95, recall
    # Distances are "smaller is closer" and match the metric's definition
    # (squared L2, 1 - cos, -dot) for every returned id.
    assert np.all(np.diff(dist, axis=1) >= -1e-6)
    rows = ids.astype(np.int64)
    if metric == "l2":
        want = ((q[:, None, :] - x[rows]) ** 2).sum(-1)
    elif metric == "ip":
        want = -np.einsum("qd,qkd->qk", q, x[rows])
    else:
        xn = x / np.linalg.norm(x, axis=1, keepdims=True)
        qn = q / np.linalg.norm(q, axis=1, keepdims=True)
        want = 1 - np.einsum("qd,qkd->qk", qn, xn[rows])
    np.testing.assert_allclose(dist, want, rtol=1e-4, atol=1e-4)
    # The best distance found is the exact best for nearly every query.
    assert np.mean(np.isclose(dist[:, 0], true_d[:, 0], rtol=1e-4, atol=1e-5)) >= 0.95


def test_padding_single_query_and_dtypes():
    idx = vectide.Index(4, metric="l2")
    idx.add([10, 20], np.array([[0, 0, 0, 1], [0, 0, 1, 0]], dtype=np.float64))
    ids, dist = idx.search([0, 0, 0, 1], k=5)
    assert ids.shape == (1, 5)
    assert ids[0, 0] == 10 and ids[0, 1] == 20
    assert np.all(ids[0, 2:] == MISSING) and np.all(np.isinf(dist[0, 2:]))
    # Fortran-ordered float64 input gives the same answer as C-ordered float32.
    q = np.asfortranarray(np.array([[0, 0, 1, 0], [0, 0, 0, 1]], dtype=np.float64))
    ids_f, _ = idx.search(q, k=1)
    ids_c, _ = idx.search(np.ascontiguousarray(q, dtype=np.float32), k=1)
    assert ids_f.tolist() == ids_c.tolist() == [[20], [10]]


def test_delete_get_contains_len_upsert():
    x = clustered(500, 8)
    idx = vectide.Index(8, metric="l2")
    idx.add(np.arange(500, dtype=np.uint64), x)
    assert len(idx) == 500 and 3 in idx and 999 not in idx and -1 not in idx
    np.testing.assert_array_equal(idx.get([3, 4]), x[3:5])
    assert idx.delete([3, 4, 12345]) == 2
    assert idx.delete([3]) == 0
    assert len(idx) == 498 and 3 not in idx
    with pytest.raises(KeyError, match=r"\b3\b"):
        idx.get([2, 3])
    ids, _ = idx.search(x[3], k=10)
    assert 3 not in ids
    # Upsert: the same id takes the new vector.
    idx.add([7], x[100:101] + 5.0)
    np.testing.assert_allclose(idx.get([7])[0], x[100] + 5.0)
    assert len(idx) == 498
    ids, _ = idx.search(x[100] + 5.0, k=1)
    assert ids[0, 0] == 7


def test_filter_allowlist():
    x = clustered(2000, 8)
    idx = vectide.Index(8, metric="l2")
    idx.add(np.arange(2000), x)
    allowed = np.arange(0, 2000, 50)
    ids, _ = idx.search(x[:5], k=10, filter=allowed)
    assert set(ids.ravel().tolist()) <= set(allowed.tolist())
    true, _ = brute(x[allowed], x[:5], 10, "l2")
    hits = [len(set(a) & set(allowed[t])) for a, t in zip(ids.astype(np.int64), true)]
    assert np.mean(hits) >= 9


def test_save_load_roundtrip_and_corruption(tmp_path):
    x = clustered(1000, 12)
    idx = vectide.Index(12, metric="cosine", m=8, ef_search=40)
    idx.add(np.arange(1000), x)
    idx.delete(np.arange(0, 1000, 3))
    path = tmp_path / "i.vtdx"
    idx.save(path)
    back = vectide.Index.load(str(path), threads=1)
    assert len(back) == len(idx) and back.metric == "cosine" and back.dim == 12
    assert back.ef_search == 40 and back.params()["m"] == 8
    a, _ = idx.search(x[:20], k=5)
    b, _ = back.search(x[:20], k=5)
    np.testing.assert_array_equal(a, b)
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    bad = tmp_path / "bad.vtdx"
    bad.write_bytes(bytes(raw))
    with pytest.raises(vectide.CorruptIndexError, match="checksum|corrupt"):
        vectide.Index.load(bad)
    bad.write_bytes(bytes(raw[:100]))
    with pytest.raises(ValueError):
        vectide.Index.load(bad)
    with pytest.raises(FileNotFoundError):
        vectide.Index.load(tmp_path / "nope")


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda i: i.add([1], np.ones((1, 5))), "dimension"),
        (lambda i: i.add([1], np.full((1, 4), np.nan)), "finite|NaN"),
        (lambda i: i.add([1], np.full((1, 4), np.inf)), "finite|inf"),
        (lambda i: i.add([1], np.zeros((1, 4))), "zero"),
        (lambda i: i.add([MISSING], np.ones((1, 4))), "reserved"),
        (lambda i: i.add([1, 2], np.ones((1, 4))), "ids|vectors"),
        (lambda i: i.add([5, 5], np.ones((2, 4))), "duplicate"),
        (lambda i: i.add([-1], np.ones((1, 4))), "non-negative"),
        (lambda i: i.add([1], np.ones((1, 2, 4))), "dimensions"),
        (lambda i: i.search(np.ones(4), k=0), "k must"),
        (lambda i: i.search(np.ones(4), k=-3), "k must"),
        (lambda i: i.search(np.ones(3), k=1), "dimension"),
        (lambda i: i.search(np.full(4, np.nan), k=1), "finite|NaN"),
        (lambda i: i.search(np.ones(4), k=1, ef=0), "ef"),
    ],
)
def test_bad_input_raises_and_changes_nothing(call, match):
    idx = vectide.Index(4, metric="cosine")
    idx.add([100], np.ones((1, 4)))
    with pytest.raises(ValueError, match=match):
        call(idx)
    assert len(idx) == 1 and 100 in idx
    np.testing.assert_allclose(idx.get([100]), np.full((1, 4), 0.5), rtol=1e-6)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda i: i.add([1.5], np.ones((1, 4))), "position 0 holds a float"),
        (lambda i: i.add([1, None], np.ones((2, 4))), "position 1 holds a NoneType"),
        (lambda i: i.add([True], np.ones((1, 4))), "position 0 holds a bool"),
        (lambda i: i.add(np.array(["a"]), np.ones((1, 4))), "dtype <U1"),
        (lambda i: i.add(["a"], np.ones((1, 4))), "position 0 holds a str"),
        (lambda i: i.search(np.ones(4), k=2.0), "k must be an int"),
        (lambda i: i.search(np.ones(4), k=True), "k must be an int"),
        (lambda i: i.search(np.ones(4), k=1, ef="64"), "ef must be an int"),
    ],
)
def test_wrong_types_raise_type_error_and_change_nothing(call, match):
    idx = vectide.Index(4, metric="cosine")
    idx.add([100], np.ones((1, 4)))
    with pytest.raises(TypeError, match=match):
        call(idx)
    assert len(idx) == 1 and 100 in idx


def test_constructor_errors():
    with pytest.raises(ValueError, match="metric"):
        vectide.Index(4, metric="hamming")
    with pytest.raises(ValueError, match="engine"):
        vectide.Index(4, engine="nope")
    with pytest.raises(ValueError, match="unknown parameter"):
        vectide.Index(4, M=16)
    with pytest.raises(ValueError, match="dim"):
        vectide.Index(0)
    with pytest.raises(ValueError, match="threads"):
        vectide.Index(4, threads=0)
    with pytest.raises(TypeError):
        vectide.Index(4, m=[1])


def test_threads_and_concurrent_use():
    x = clustered(4000, 16)
    idx = vectide.Index(16, metric="l2", threads=2)
    assert idx.threads == 2
    idx.add(np.arange(2000), x[:2000])
    errors = []

    def writer():
        try:
            for s in range(2000, 4000, 250):
                idx.add(np.arange(s, s + 250), x[s : s + 250])
                idx.delete(np.arange(s - 2000, s - 2000 + 50))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    def reader():
        try:
            for _ in range(30):
                ids, _ = idx.search(x[:64], k=10)
                assert ids.shape == (64, 10)
        except Exception as e:  # pragma: no cover
            errors.append(e)

    ts = [threading.Thread(target=writer)] + [threading.Thread(target=reader) for _ in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors
    assert len(idx) == 4000 - 8 * 50
    ids, _ = idx.search(x[3999], k=1)
    assert ids[0, 0] == 3999


def test_ef_search_property_and_stats():
    idx = vectide.Index(4, metric="l2", ef_search=32)
    assert idx.ef_search == 32
    idx.ef_search = 100
    assert idx.ef_search == 100
    with pytest.raises(ValueError):
        idx.ef_search = 0
    idx.add(np.arange(10), np.random.default_rng(0).normal(size=(10, 4)))
    s = idx.stats()
    assert s["live"] == 10 and s["memory_bytes"] > 0 and s["slots_used"] == 10
    assert vectide.simd_isa() in ("scalar", "avx2", "avx512", "neon")
    # The product build runs on the product's allocator (vectide_core::trim).
    assert vectide.allocator() == "mimalloc"


def test_the_build_names_its_commit():
    import re
    import subprocess
    from pathlib import Path

    c = vectide.build_commit()
    assert c == "unknown" or re.fullmatch(r"[0-9a-f]{7,40}", c)
    root = Path(__file__).resolve().parents[2]
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True)
    if head.returncode == 0 and c != "unknown":
        # Built from this checkout: a commit of its history.
        assert subprocess.run(["git", "cat-file", "-e", c + "^{commit}"], cwd=root).returncode == 0
