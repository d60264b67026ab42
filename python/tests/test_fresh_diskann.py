"""Engine ``fresh-diskann`` through the Python API, and a CI-sized run of
``python -m vectide.bench freshdiskann`` against DiskANN's disk index."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import vectide

DIM = 24


def _data(n, seed=0):
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((12, DIM)).astype(np.float32) * 4
    x = centres[rng.integers(0, 12, n)] + rng.standard_normal((n, DIM)).astype(np.float32)
    return x.astype(np.float32)


def _truth(x, ids, q, k):
    d = ((q[:, None, :] - x[None, :, :]) ** 2).sum(-1)
    return ids[np.argsort(d, axis=1, kind="stable")[:, :k]]


def _recall(found, truth):
    return np.mean([len(set(f) & set(t)) / len(t) for f, t in zip(found, truth)])


def test_index_merges_deletes_upserts_and_reopens(tmp_path):
    path = tmp_path / "fd"
    x = _data(3000)
    ix = vectide.Index(DIM, metric="l2", engine="fresh-diskann", path=str(path), threads=2,
                       pq_bytes=8, temp_points=800, merge_points=10**9)
    ids = np.arange(2000, dtype=np.uint64)
    ix.add(ids, x[:2000])
    ix.maintain()  # the first LTI
    s = ix.stats()
    assert s["lti_points"] == 2000 and s["temp_points"] == 0 and s["merges"] == 1
    gone = np.arange(0, 2000, 7, dtype=np.uint64)
    assert ix.delete(gone) == len(gone)
    ix.add(np.arange(2000, 3000, dtype=np.uint64), x[2000:])
    ix.add(np.array([1, 2], dtype=np.uint64), x[2998:3000])  # upserts of LTI points
    assert ix.stats()["lti_dead"] == len(gone) + 2
    live = np.setdiff1d(np.arange(3000), gone.astype(np.int64))
    vec = x.copy()
    vec[1], vec[2] = x[2998], x[2999]
    q = x[::97] + 0.05
    truth = _truth(vec[live], live, q, 10)
    found = ix.search(q, k=10, ef=48, beam_width=4)[0]
    before = _recall(found, truth)
    assert not np.isin(found, gone).any()
    ix.maintain()  # StreamingMerge
    s = ix.stats()
    assert s["lti_dead"] == 0 and s["lti_points"] == len(live) and s["merges"] == 2
    after = _recall(ix.search(q, k=10, ef=48)[0], truth)
    assert before >= 0.9 and after >= before - 0.03, (before, after)
    np.testing.assert_array_equal(ix.get([1])[0], x[2998])
    del ix
    again = vectide.Index.load(str(path), threads=1)
    assert len(again) == len(live) and again.engine == "fresh-diskann"
    assert _recall(again.search(q, k=10, ef=48)[0], truth) == pytest.approx(after)
    with pytest.raises(ValueError):
        again.search(q, k=10, nprobe=3)  # a knob the engine does not take
    with pytest.raises(ValueError):
        again.add(np.array([5], dtype=np.uint64), np.ones((1, DIM + 1), dtype=np.float32))
    assert len(again) == len(live)


def test_inspect_reads_the_manifest_lti_and_log(tmp_path):
    path = tmp_path / "fd"
    ix = vectide.Index(DIM, metric="cosine", engine="fresh-diskann", path=str(path), pq_bytes=4)
    ix.add(np.arange(400, dtype=np.uint64), _data(400))
    ix.maintain()
    ix.add(np.array([9999], dtype=np.uint64), _data(1, 3))
    del ix
    cli = Path(sys.executable).parent / "vectide"
    if not cli.exists():
        pytest.skip("the vectide CLI is not beside this Python")
    out = subprocess.run([str(cli), "inspect", str(path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "lti_nodes" in out.stdout and "redo_log" in out.stdout and "1 calls" in out.stdout


@pytest.mark.parametrize("rows", [
    # The fast version: the first 4,000 rows (an HDF5 slice); the full 20k set is slow.
    pytest.param(4000, id="slice"),
    pytest.param(20_000, id="full", marks=pytest.mark.slow),
])
def test_bench_freshdiskann_writes_the_summary(tmp_path, data_root, bench_slice, monkeypatch, rows):
    pytest.importorskip("diskannpy")
    monkeypatch.setenv("VECTIDE_DATA", str(data_root))
    dataset = "clustered-20k-32-angular" if rows == 20_000 else str(bench_slice(rows, 100))
    out = tmp_path / "fd.json"
    r = subprocess.run([sys.executable, "-m", "vectide.bench", "freshdiskann", "--dataset", dataset,
                        "--l", "16,48", "--threads", "1", "--max-queries", "100", "--single-inserts", "50",
                        "--out", str(out), "--plot", str(tmp_path / "plots")],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["dataset"] == dataset and doc["n"] == rows
    s = doc["summary"]
    for key in ("merge_over_rebuild", "rebuild_over_diskann_build", "recall_after_merge_minus_before_points",
                "disk_qps_ratio_vs_diskann_at_0.95", "sector_reads_ratio_vs_diskann_at_0.95",
                "lti_ram_bytes_per_vector", "merge_peak_ram_over_change_set",
                "merge_peak_ram_beyond_caches_over_change_set", "insert_p50_ms",
                "crash_states_checked", "violations"):
        assert key in s, key
    caches = doc["merge"]["cache_bytes"]
    assert caches["io_buffer"] > 0 and caches["near_start"] > 0, caches
    assert 0 < s["merge_over_rebuild"] and 0 < s["rebuild_over_diskann_build"]
    assert abs(s["recall_after_merge_minus_before_points"]) < 5
    assert s["lti_ram_bytes_per_vector"] >= 32  # 32-byte PQ codes (dim 32) and the location map
    for name in ("vectide:fresh-diskann", "diskann"):
        pts = doc["disk_search"][name]
        assert len(pts) == 2 and all(p["recall"] > 0.8 and p["sectors_per_query"] > 1 for p in pts)
        assert [p["L"] for p in pts] == [16, 48]  # measured in turns, reported in L order
    assert all(p["mean_hops"] > 0 for p in doc["disk_search"]["diskann"])
    assert (tmp_path / "plots" / "disk_search.png").exists()
    # A crash report run apart is folded into the same summary.
    crash = tmp_path / "crash.json"
    crash.write_text(json.dumps({"crash_points_checked": 123, "violations": 0, "kill": {"rounds": 4}}))
    r = subprocess.run([sys.executable, "-m", "vectide.bench", "freshdiskann", "--crash-only",
                        "--crash-json", str(crash), "--out", str(out)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    folded = json.loads(out.read_text())
    assert folded["summary"]["crash_states_checked"] == 123 and folded["summary"]["violations"] == 0
    assert folded["summary"]["merge_over_rebuild"] == s["merge_over_rebuild"]  # the rest untouched
    r = subprocess.run([sys.executable, "-m", "vectide.bench", "freshdiskann", "--crash-only", "--out", str(out)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "--crash-json" in r.stderr
