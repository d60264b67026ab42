"""The native `vectide` CLI: inspect and bench (installed into .venv/bin by make)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

vectide = pytest.importorskip("vectide._vectide") and __import__("vectide")


def _cli() -> str:
    beside = Path(sys.executable).parent / "vectide"
    if beside.exists():
        return str(beside)
    found = shutil.which("vectide")
    if not found:
        pytest.skip("the vectide CLI is not installed (run make build)")
    return found


def test_inspect_reports_header_and_counts(tmp_path):
    idx = vectide.Index(8, metric="l2", m=8)
    idx.add(np.arange(300), np.random.default_rng(0).normal(size=(300, 8)))
    idx.delete([1, 2])
    path = tmp_path / "x.vtdx"
    idx.save(path)
    out = subprocess.run([_cli(), "inspect", "--json", str(path)], capture_output=True, text=True, check=True)
    info = json.loads(out.stdout)
    assert info["engine"] == "hnsw" and info["format_version"] == 1
    assert info["dim"] == 8 and info["m"] == 8 and info["live"] == 298
    assert info["metric"] == "l2" and info["durable_seq"] == 2


def test_inspect_rejects_corrupt_file(tmp_path):
    bad = tmp_path / "bad.vtdx"
    bad.write_bytes(b"VTDXHNSW" + b"\0" * 200)
    out = subprocess.run([_cli(), "inspect", str(bad)], capture_output=True, text=True)
    assert out.returncode == 1
    assert "corrupted" in out.stderr or "checksum" in out.stderr or "version" in out.stderr


def test_native_bench_writes_the_json_contract(tmp_path, monkeypatch):
    monkeypatch.setenv("VECTIDE_DATA", str(tmp_path / "data"))
    monkeypatch.setenv("VECTIDE_PYTHON", sys.executable)
    out_json = tmp_path / "native.json"
    # One build thread: the same graph, and so the same recall, every run
    # (with two, the recall at ef 64 varied between 0.97 and 0.98).
    subprocess.run(
        [_cli(), "bench", "--dataset", "clustered-20k-32-angular", "--engines", "vectide:hnsw",
         "--ef", "10,64", "--runs", "1", "--max-queries", "200", "--threads", "1",
         "--m", "8", "--ef-construction", "64", "--out", str(out_json)],
        check=True, capture_output=True, text=True, env=os.environ.copy(),
    )
    res = json.loads(out_json.read_text())
    assert res["dataset"] == "clustered-20k-32-angular" and res["k"] == 10
    eng = res["engines"]["vectide:hnsw"]
    assert eng["build_s"] > 0 and eng["memory_bytes"] > 0
    assert [p["search_params"]["ef"] for p in eng["sweep"]] == [10, 64]
    assert all(0 <= p["recall"] <= 1 and p["qps"] > 0 for p in eng["sweep"])
    assert eng["sweep"][1]["recall"] >= 0.9
    assert set(eng["qps_at_recall"]) == {"0.9", "0.95", "0.99"}


def test_native_bench_rejects_unknown_engine(tmp_path, monkeypatch):
    monkeypatch.setenv("VECTIDE_DATA", str(tmp_path / "data"))
    monkeypatch.setenv("VECTIDE_PYTHON", sys.executable)
    out = subprocess.run(
        [_cli(), "bench", "--dataset", "clustered-20k-32-angular", "--engines", "nope", "--max-queries", "10"],
        capture_output=True, text=True, env=os.environ.copy(),
    )
    assert out.returncode == 1 and "unknown engine" in out.stderr


def test_pq_eval_measures_product_quantization(tmp_path, monkeypatch):
    monkeypatch.setenv("VECTIDE_DATA", str(tmp_path / "data"))
    monkeypatch.setenv("VECTIDE_PYTHON", sys.executable)
    out_json = tmp_path / "pq.json"
    subprocess.run(
        [_cli(), "pq-eval", "--dataset", "clustered-20k-32-angular", "--m", "4,16", "--queries", "50",
         "--out", str(out_json)],
        check=True, capture_output=True, text=True, env=os.environ.copy(),
    )
    res = json.loads(out_json.read_text())
    assert res["benchmark"] == "pq-eval" and res["simd"] in ("scalar", "avx2", "avx512", "neon")
    small, big = res["results"]["pq4"], res["results"]["pq16"]
    for r in (small, big):
        assert 0 < r["recall10_at_10"] <= r["recall10_at_100"] <= 1
        assert r["codes_per_s_dispatched"] > 0 and r["codes_per_s_scalar"] > 0
    # More bytes per code: closer distances and better PQ-only recall.
    assert big["distance_error_random_pairs"] < small["distance_error_random_pairs"]
    assert big["recall10_at_10"] > small["recall10_at_10"]
    assert big["recall10_at_100"] >= 0.9
    assert set(res["summary"]) == {"pq4", "pq16"}
    bad = subprocess.run(
        [_cli(), "pq-eval", "--dataset", "clustered-20k-32-angular", "--m", "64", "--queries", "5"],
        capture_output=True, text=True, env=os.environ.copy(),
    )
    assert bad.returncode == 1 and "m (bytes per code) must be in 1..=32" in bad.stderr


def test_rabitq_eval_measures_the_codes(tmp_path, monkeypatch):
    monkeypatch.setenv("VECTIDE_DATA", str(tmp_path / "data"))
    monkeypatch.setenv("VECTIDE_PYTHON", sys.executable)
    out_json = tmp_path / "rq.json"
    subprocess.run(
        [_cli(), "rabitq-eval", "--dataset", "clustered-20k-32-angular", "--bits", "1,4", "--queries", "40",
         "--out", str(out_json)],
        check=True, capture_output=True, text=True, env=os.environ.copy(),
    )
    res = json.loads(out_json.read_text())
    assert res["benchmark"] == "rabitq-eval" and res["fastscan_kernel"] in ("scalar", "avx2", "avx512")
    one, four = res["results"]["rabitq1"], res["results"]["rabitq4"]
    for r in (one, four):
        assert 0 < r["recall10_at_10"] <= r["recall10_at_100"] <= 1
        assert r["estimates_per_s_dispatched"] > 0 and r["estimates_per_s_scalar"] > 0
        # The bound: about 6 % of pairs outside it (ε₀ = 1.9), and it
        # prunes rows while keeping nearly every true neighbour.
        assert 0 < r["outside_bound"] < 0.12 and r["missed_by_bound"] < 0.05 and r["pruned_by_bound"] > 0.2
    assert one["padded_dimension"] == 64 and one["bytes_per_vector"] == 64 // 8 + 20
    # More bits: closer estimates and better code-only recall.
    assert four["distance_error_random_pairs"] < one["distance_error_random_pairs"] / 3
    assert four["recall10_at_10"] > one["recall10_at_10"]
    assert one["recall10_at_100"] >= 0.9
    assert set(res["summary"]) == {"rabitq1", "rabitq4"}
    bad = subprocess.run(
        [_cli(), "rabitq-eval", "--dataset", "clustered-20k-32-angular", "--bits", "9", "--queries", "5"],
        capture_output=True, text=True, env=os.environ.copy(),
    )
    assert bad.returncode == 1 and "bits must be 1 to 8" in bad.stderr


def test_disk_search_measures_the_long_term_index_from_disk(tmp_path, monkeypatch):
    monkeypatch.setenv("VECTIDE_DATA", str(tmp_path / "data"))
    monkeypatch.setenv("VECTIDE_PYTHON", sys.executable)
    out_json = tmp_path / "disk.json"
    # One build thread: the same graph, and so the same sweep, every run.
    subprocess.run(
        [_cli(), "disk-search", "--dataset", "clustered-20k-32-angular", "--dir", str(tmp_path / "lti"),
         "--l", "16,64", "--w", "4", "--threads", "1,2", "--build-threads", "1", "--pq-bytes", "16", "--cache-mb", "1",
         "--queries", "100", "--out", str(out_json)],
        check=True, capture_output=True, text=True, env=os.environ.copy(), timeout=600,
    )
    res = json.loads(out_json.read_text())
    assert res["benchmark"] == "disk-search" and res["read_path"] in ("io_uring", "pread")
    assert (tmp_path / "lti" / "lti.blk").stat().st_size == res["lti_bytes"] and res["lti_bytes"] % 4096 == 0
    assert res["cached_nodes"] > 0 and res["ram_bytes_per_vector"] > 16
    pts = {(p["threads"], p["L"]): p for p in res["sweep"]}
    assert set(pts) == {(1, 16), (1, 64), (2, 16), (2, 64)}
    for p in pts.values():
        assert p["qps"] > 0 and p["mean_hops"] > 0
        assert p["mean_sectors_read"] <= 4 * p["mean_hops"] + 1e-9
    # A longer list reads more and finds more; threads change no answer.
    assert pts[(1, 64)]["recall"] >= pts[(1, 16)]["recall"] and pts[(1, 64)]["recall"] >= 0.9
    assert pts[(1, 64)]["mean_sectors_read"] > pts[(1, 16)]["mean_sectors_read"]
    assert pts[(2, 64)]["recall"] == pts[(1, 64)]["recall"]
    bad = subprocess.run([_cli(), "disk-search", "--dataset", "clustered-20k-32-angular", "--w", "0"],
                         capture_output=True, text=True, env=os.environ.copy())
    assert bad.returncode == 1 and "at least 1" in bad.stderr


def test_import_reads_npy_hdf5_and_jsonl_and_rejects_bad_files(tmp_path):
    h5py = pytest.importorskip("h5py")
    rng = np.random.default_rng(3)
    data = tmp_path / "db"
    env = {**os.environ, "VECTIDE_PYTHON": sys.executable}

    def run(*args):
        return subprocess.run([_cli(), "import", "--data", str(data), *args], capture_output=True, text=True, env=env)

    X = rng.normal(size=(120, 6)).astype(np.float32)
    np.save(tmp_path / "x.npy", X)
    r = run("--collection", "a", "--metric", "l2", str(tmp_path / "x.npy"))
    assert r.returncode == 0, r.stderr
    H = rng.normal(size=(80, 6))
    with h5py.File(tmp_path / "x.hdf5", "w") as f:
        f["train"] = H  # float64 and no test/neighbors: only `train` is needed
    r = run("--collection", "b", "--metric", "l2", str(tmp_path / "x.hdf5"))
    assert r.returncode == 0, r.stderr
    lines = [json.dumps({"id": f"doc-{i}", "vector": rng.normal(size=6).tolist(), "payload": {"i": i}}) for i in range(30)]
    (tmp_path / "x.jsonl").write_text("\n".join(lines) + "\n")
    r = run("--collection", "c", str(tmp_path / "x.jsonl"))
    assert r.returncode == 0, r.stderr

    with h5py.File(tmp_path / "bad.hdf5", "w") as f:
        f["vectors"] = H
    r = run("--collection", "d", str(tmp_path / "bad.hdf5"))
    assert r.returncode != 0 and "train" in r.stderr
    (tmp_path / "torn.npy").write_bytes((tmp_path / "x.npy").read_bytes()[:200])
    r = run("--collection", "a", str(tmp_path / "torn.npy"))
    assert r.returncode != 0 and "torn.npy" in r.stderr
    r = run("--collection", "a", str(tmp_path / "x.jsonl"))  # into an existing 6-d collection: 30 more points
    assert r.returncode == 0, r.stderr
    np.save(tmp_path / "wide.npy", rng.normal(size=(5, 7)).astype(np.float32))
    r = run("--collection", "a", str(tmp_path / "wide.npy"))
    assert r.returncode != 0 and "dimension" in r.stderr.lower()

    db = vectide.connect(data)
    try:
        a, b, c = (db.get_collection(n) for n in "abc")
        assert (a.count(), b.count(), c.count()) == (150, 80, 30)
        got = a.get([7])[0]
        np.testing.assert_allclose(got.vector, X[7], rtol=1e-6)
        np.testing.assert_allclose(b.get([5])[0].vector, H[5].astype(np.float32), rtol=1e-6)
        assert c.get(["doc-4"])[0].payload == {"i": 4}
    finally:
        db.close()


def test_size_flags_have_bounds(tmp_path):
    env = {**os.environ, "VECTIDE_PYTHON": sys.executable}
    for args, name in [
        (["bench", "--dataset", "x", "--k", "1000000000"], "--k"),
        (["bench", "--dataset", "x", "--threads", "100000"], "--threads"),
        (["bench", "--dataset", "x", "--ef", "10,999999999"], "--ef"),
        (["serve", "--data", str(tmp_path / "d"), "--body-limit-mb", str(2**60)], "--body-limit-mb"),
        (["import", "--data", str(tmp_path / "d"), "--collection", "c", "--batch", "0", "x.npy"], "--batch"),
    ]:
        r = subprocess.run([_cli(), *args], capture_output=True, text=True, env=env, timeout=60)
        assert r.returncode == 1 and name in r.stderr and "panicked" not in r.stderr, (args, r.stderr)


def test_repair_salvages_a_damaged_wal_and_reports_what_was_dropped(tmp_path):
    data = tmp_path / "db"
    db = vectide.connect(data)
    # fresh-diskann hands its log over: the checkpoint makes the point store
    # durable through every write while the engine persisted none, so the
    # log keeps them all (and starts a new, empty segment).
    c = db.create_collection("docs", dim=4, metric="l2", engine="fresh-diskann")
    for i in range(50):
        c.upsert([i], np.full((1, 4), i, dtype=np.float32), payloads=[{"i": i}])
    c.checkpoint()
    del c, db  # dies
    import gc

    gc.collect()
    seg, _empty = sorted((data / "collections/docs/wal").iterdir())
    b = bytearray(seg.read_bytes())
    b[len(b) // 2 : len(b) // 2 + 8] = bytes(x ^ 0xFF for x in b[len(b) // 2 : len(b) // 2 + 8])
    seg.write_bytes(bytes(b))
    with pytest.raises(vectide.CorruptIndexError, match=seg.name):
        vectide.connect(data)
    r = subprocess.run([_cli(), "repair", "--data", str(data), "--json"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    (rep,) = json.loads(r.stdout)
    assert rep["damaged"] and rep["segment"].endswith(seg.name)
    kept = rep["kept_through_seq"]
    assert 0 < kept < 50 and rep["dropped_seqs"][1] == 50
    with vectide.connect(data) as db:
        # The engine replayed the kept prefix; the store's points after it
        # lost their vectors and were deleted (and listed).
        assert len(db.get_collection("docs")) == kept
        assert len(rep["points_without_vector_deleted"]) == 50 - kept
    r = subprocess.run([_cli(), "repair", "--data", str(data)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "sound" in r.stdout
