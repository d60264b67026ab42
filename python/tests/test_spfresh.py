"""Engines ``spfresh``, ``spann-inplace`` and ``spann`` through the Python
API, the benchmark's stream, and a CI-sized run of ``python -m vectide.bench
spfresh``."""

import json
import subprocess
import sys
import threading

import numpy as np
import pytest

import vectide
from vectide.bench.spfresh import stream

DIM = 16


def _data(n, seed=0):
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((12, DIM)).astype(np.float32) * 4
    return (centres[rng.integers(0, 12, n)] + rng.standard_normal((n, DIM))).astype(np.float32)


def _truth(x, ids, q, k):
    d = ((q[:, None, :] - x[None, :, :]) ** 2).sum(-1)
    return ids[np.argsort(d, axis=1, kind="stable")[:, :k]]


def _recall(found, truth):
    return np.mean([len(set(f) & set(t)) / len(t) for f, t in zip(found, truth)])


def test_the_registry_describes_the_spann_engines():
    engines = {e["name"]: e for e in vectide.engines()}
    for name in ("spann", "spann-inplace", "spfresh"):
        e = engines[name]
        assert e["in_directory"] and e["knobs"] == ["nprobe"] and e["primary_knob"] == "nprobe"
        assert e["medium"] == "ssd"
        names = {p["name"] for p in e["params"]}
        assert {"replicas", "posting_pages", "reassign_range", "merge_threshold"} <= names
    from vectide.bench import runbooks

    streaming = runbooks.streaming_engines()
    assert {"vectide:spann", "vectide:spann-inplace", "vectide:spfresh"} <= set(streaming)
    assert "vectide:p-hnsw" not in streaming and "vectide:hnsw-wal" not in streaming


@pytest.mark.parametrize("initial,rounds,deletes,inserts,reads", [
    # The fast version: 1,000 points, then three rounds; the slow one 3,000 and six.
    pytest.param(1000, 3, 200, 300, 100, id="small"),
    pytest.param(3000, 6, 400, 500, 300, id="full", marks=pytest.mark.slow),
])
def test_spfresh_under_concurrent_inserts_deletes_and_searches(tmp_path, initial, rounds, deletes, inserts, reads):
    """Writers and readers at once against a brute-force oracle of what is
    live at the end; then a reopen (snapshot + WAL replay) answers the same."""
    total = initial + rounds * inserts
    x = _data(total)
    # Postings of at most 16 vectors (so that splits and reassigns run), a
    # snapshot every half of the initial points (so that the reopen reads
    # a snapshot and replays the WAL after it).
    ix = vectide.Index(DIM, metric="l2", engine="spfresh", path=str(tmp_path / "s"), threads=2,
                       posting_vectors=16, snapshot_rows=initial // 2)
    ix.add(np.arange(initial), x[:initial])
    errors = []

    def reader():
        try:
            for i in range(reads):
                ids, _ = ix.search(x[i:i + 1], k=5, nprobe=16)
                assert len(ids[0]) == 5
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    t = threading.Thread(target=reader)
    t.start()
    for r in range(rounds):
        ix.delete(np.arange(r * deletes, (r + 1) * deletes))
        new = np.arange(initial + r * inserts, initial + (r + 1) * inserts)
        ix.add(new, x[new])
    t.join()
    assert not errors, errors
    live = np.arange(rounds * deletes, total)
    assert len(ix) == len(live)
    ix.maintain()
    st = dict(ix.stats())
    assert st["splits"] > 0 and st["reassign_evaluated"] > 0
    q = _data(100, seed=9)
    truth = _truth(x[live], live, q, 10)
    found = ix.search(q, k=10, nprobe=64)[0]
    assert _recall(found, truth) >= 0.9
    del ix
    again = vectide.Index.load(tmp_path / "s")
    assert len(again) == len(live)
    assert _recall(again.search(q, k=10, nprobe=64)[0], truth) >= 0.9
    with pytest.raises(ValueError):
        again.search(q, k=10, ef=10)  # not a knob of spfresh


def test_bad_input_changes_nothing(tmp_path):
    ix = vectide.Index(DIM, metric="cosine", engine="spann-inplace", path=str(tmp_path / "i"))
    x = _data(300)
    ix.add(np.arange(300), x)
    with pytest.raises(ValueError):
        ix.add(np.arange(300, 302), x[:2, :5])
    with pytest.raises(ValueError):
        ix.add(np.array([5, 5]), x[:2])
    with pytest.raises(ValueError):
        ix.search(x[:1], k=10, nprobe=0)
    with pytest.raises(ValueError):
        vectide.Index(DIM, metric="l2", engine="spfresh", path=str(tmp_path / "j"), replicas=0)
    assert len(ix) == 300


def test_the_stream_replaces_at_least_the_initial_size():
    rng = np.random.default_rng(1)
    labels = rng.integers(0, 64, 20000)
    labels[:6000] = 3  # one cluster far larger than the others
    base, phases = stream(labels, 32, 10, 0)
    inserted = np.concatenate([i for i, _ in phases])
    deleted = np.concatenate([d for _, d in phases])
    assert len(inserted) >= len(base) and len(deleted) == len(inserted)
    assert len(set(base.tolist()) & set(inserted.tolist())) == 0
    # Deletes take the oldest points first.
    assert set(deleted[: len(base)].tolist()) <= set(base.tolist())


@pytest.mark.parametrize("limit,queries,batch", [
    # The fast version: 3,000 points and 100 queries; the slow one 6,000 and 300.
    pytest.param(3000, 100, 250, id="small"),
    pytest.param(6000, 300, 500, id="full", marks=pytest.mark.slow),
])
def test_bench_spfresh_writes_the_summary(tmp_path, data_root, monkeypatch, limit, queries, batch):
    monkeypatch.setenv("VECTIDE_DATA", str(data_root))
    out = tmp_path / "s.json"
    r = subprocess.run([sys.executable, "-m", "vectide.bench", "spfresh", "--dataset", "clustered-20k-32-angular",
                        "--limit", str(limit), "--clusters", "16", "--initial", "8", "--phases", "3",
                        "--queries", str(queries), "--batch", str(batch), "--out", str(out),
                        "--plot", str(tmp_path / "plots")],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    s = json.loads(out.read_text())["summary"]
    for key in ("recall_gap_vs_static_points", "static_recall10", "p999_ratio_vs_static",
                "inplace_recall_gap_vs_static_points", "inplace_p999_ratio_vs_static", "split_fraction",
                "reassign_moved_over_evaluated", "crash_states_checked", "violations"):
        assert key in s, key
    assert 0.5 < s["static_recall10"] <= 1 and s["changed_over_initial"] >= 1
    # Measured, not placeholders: the three engines ran and spfresh split.
    assert s["recall_gap_vs_static_points"] is not None and s["inplace_recall_gap_vs_static_points"] is not None
    assert s["p999_ratio_vs_static"] > 0 and 0 < s["split_fraction"] < 1
    assert s["crash_states_checked"] is None  # no --crash-json given
    # The summary's static build has about as many postings as SPFresh
    # ended with; the default-ratio build is measured beside it.
    assert 0.5 < s["static_postings"] / s["spfresh_postings"] < 2
    assert s["static_default_recall10"] is not None and s["p999_ratio_vs_static_default"] > 0
    assert (tmp_path / "plots" / "spfresh-stream.png").exists()
