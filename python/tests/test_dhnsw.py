"""d-HNSW from Python: an index on a memory node in its own process
(``vectide memnode``), its recall against numpy, save and load with another
fetch mode, the region described by ``vectide inspect --memnode``, a memory
node that is gone (a ConnectionError, not a hang), and the benchmark's
small version."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import vectide
from vectide.memnode import MemoryNode, cli_path

HAVE_CLI = (Path(sys.executable).parent / "vectide").exists()
needs_cli = pytest.mark.skipif(not HAVE_CLI, reason="the vectide binary is not installed beside this Python")


def _data(n, dim, seed=3):
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(12, dim)).astype(np.float32) * 4
    x = centres[rng.integers(0, 12, n)] + rng.normal(size=(n, dim)).astype(np.float32)
    return x.astype(np.float32)


def _truth(base, q, k):
    d = ((q[:, None, :] - base[None, :, :]) ** 2).sum(-1)
    return np.argsort(d, axis=1)[:, :k]


def _recall(found, truth):
    return np.mean([len(set(f) & set(t)) / len(t) for f, t in zip(found.tolist(), truth.tolist())])


@needs_cli
def test_an_index_on_a_memory_node_searches_saves_and_is_inspected(tmp_path):
    x = _data(3000, 24)
    base, q = x[:2800], x[2800:]
    truth = _truth(base, q, 10)
    with MemoryNode(256 << 20, log=tmp_path / "node.log") as node:
        ix = vectide.Index(24, "l2", engine="d-hnsw", memnode=node.address, region="py1",
                           partition_points=200, threads=2)
        ix.add(np.arange(len(base), dtype=np.uint64), base)
        ids, _ = ix.search(q, k=10, nprobe=14)
        assert _recall(ids, truth) > 0.95
        ids5, _ = ix.search(q, k=10)
        assert _recall(ids5, truth) > 0.8
        st = ix.stats()
        assert st["partitions"] == 14 and st["round_trips"] > 0 and st["net_model_ns"] > 0
        assert ix.params()["region"] == "py1"
        # Deleted points never come back.
        gone = np.arange(0, 2800, 7, dtype=np.uint64)
        assert ix.delete(gone) == len(gone)
        ids, _ = ix.search(q, k=10, nprobe=14)
        assert not set(ids.ravel().tolist()) & set(gone.tolist())
        # The live region, described by the CLI.
        out = subprocess.run([cli_path(), "inspect", "--memnode", node.address, "--region", "py1", "--json",
                              "--timeout-ms", "5000"],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        rows = json.loads(out.stdout)
        assert rows["partitions"] == 14 and rows["live"] == 2800 - len(gone), rows
        # A second compute node attaches to the named region: the same
        # answers; its writes are seen by the first; another dimension is
        # refused.
        peer = vectide.Index(24, "l2", engine="d-hnsw", memnode=node.address, region="py1")
        assert len(peer) == 2800 - len(gone)
        assert (peer.search(q, k=10, nprobe=14)[0] == ix.search(q, k=10, nprobe=14)[0]).all()
        peer.add(np.array([1], dtype=np.uint64), base[2:3])
        assert peer.delete(np.array([2], dtype=np.uint64)) == 1
        assert len(ix) == 2800 - len(gone) - 1
        assert np.allclose(np.asarray(ix.get(1)).ravel(), base[2])
        with pytest.raises(KeyError):
            ix.get(2)
        with pytest.raises(ValueError, match="holds a 24-d l2 index, this one is 8-d"):
            vectide.Index(8, "l2", engine="d-hnsw", memnode=node.address, region="py1")
        # Saved, then opened with the naive fetch: the same answers, far more round trips.
        path = tmp_path / "i.dhnsw"
        ix.save(str(path))
        ids_a, _ = ix.search(q[:20], k=10, nprobe=3)
        back = vectide.Index.load(str(path), memnode=node.address, fetch="naive")
        before = back.stats()["round_trips"]
        ids_b, _ = back.search(q[:20], k=10, nprobe=3)
        assert (ids_a == ids_b).all()
        assert back.stats()["round_trips"] - before > 20 * 3 * 10
        with pytest.raises(ValueError, match="unknown parameter"):
            vectide.Index.load(str(path), memnode=node.address, m=8)
        with pytest.raises(ValueError):
            vectide.Index.load(str(path), fetch="rdma")


@needs_cli
def test_a_memory_node_that_is_gone_is_a_connection_error_within_the_timeout(tmp_path):
    node = MemoryNode(64 << 20).start()
    ix = vectide.Index(8, "l2", engine="d-hnsw", memnode=node.address, timeout_ms=2000)
    ix.add(np.arange(300, dtype=np.uint64), _data(300, 8))
    node.stop()
    t0 = time.monotonic()
    with pytest.raises(ConnectionError):
        ix.search(_data(4, 8, seed=9), k=5)
    assert time.monotonic() - t0 < 30


def test_without_a_memory_node_the_index_runs_one_inside_the_process():
    x = _data(500, 8)
    ix = vectide.Index(8, "l2", engine="d-hnsw")
    ix.add(np.arange(500, dtype=np.uint64), x)
    ids, _ = ix.search(x[:5], k=1)
    assert ids[:, 0].tolist() == [0, 1, 2, 3, 4]
    assert ix.params()["memnode"] == "in-process"


@needs_cli
def test_dhnsw_benchmark_small(tmp_path, data_root, monkeypatch):
    from vectide.bench import dhnsw

    monkeypatch.setenv("VECTIDE_DATA", str(data_root))
    out = tmp_path / "d.json"
    rc = dhnsw.main(["--datasets", "clustered-20k-32-angular", "--limit", "6000", "--queries", "300",
                     "--naive-queries", "30", "--partitions", "30", "--warm-batches", "3", "--cold-batches", "3",
                     "--out", str(out), "--plot", str(tmp_path / "png")])
    assert rc == 0
    r = json.loads(out.read_text())
    s = r["summary"]
    for key in ("latency_speedup_vs_naive", "network_speedup_vs_naive", "doorbell_speedup_vs_no_doorbell",
                "pipeline_speedup", "round_trips_per_query", "bytes_per_query", "recall10_at_b5_ef48",
                "qps_ratio_vs_local_hnsw_at_recall_0.9", "latency_speedup_vs_naive_compute_in_process"):
        assert key in s, key
    c = r["datasets"]["clustered-20k-32-angular"]["cold"]
    # The naive traversal on the in-process node: the same round trips
    # counted, its compute measured apart from the TCP run's.
    assert c["naive-in-process"]["round_trips_per_query"] == c["naive"]["round_trips_per_query"]
    assert c["naive-in-process"]["sub_hnsw_ms"] > 0 and s["latency_speedup_vs_naive_compute_in_process"] > 1
    # Exact counts: every partition a batch needs in chains of K/10 = 3 READs.
    assert c["doorbell"]["round_trips_per_query"] < c["no-doorbell"]["round_trips_per_query"]
    assert c["naive"]["round_trips_per_query"] > 20 * c["no-doorbell"]["round_trips_per_query"]
    assert s["latency_speedup_vs_naive"] > 1 and s["network_speedup_vs_naive"] > 1
    # Cold figures: the median of the measured batches (naive: one).
    for key, n in (("doorbell", 3), ("no-doorbell+pipeline", 3), ("naive", 1)):
        each = c[key]["latency_model_ms_each"]
        assert c[key]["batches_measured"] == n == len(each), key
        assert c[key]["latency_model_ms"] == sorted(each)[n // 2], key
    assert 0.5 < s["recall10_at_b5_ef48"] <= 1.0
    # The default K (ceil(6000 / 6250) = 1): b = 5 probes it all.
    assert s["default_partitions"] == 1 and s["recall10_at_b5_ef48_default_partitions"] >= s["recall10_at_b5_ef48"]
    assert r["command"].startswith("python -m vectide.bench dhnsw --datasets clustered-20k-32-angular")
    assert r["commit"]
    assert list((tmp_path / "png").glob("*.png"))


@needs_cli
def test_a_memory_node_restarted_on_its_backing_file_serves_its_regions(tmp_path):
    backing = tmp_path / "node.vtb"
    x = _data(1200, 8)
    node = MemoryNode(64 << 20, extra=["--backing", str(backing)]).start()
    try:
        ix = vectide.Index(8, "l2", engine="d-hnsw", memnode=node.address, region="kept", partition_points=300)
        ix.add(np.arange(1200, dtype=np.uint64), x)
        want, _ = ix.search(x[:20], k=5, nprobe=4)
    finally:
        node.proc.kill()  # SIGKILL: the mapping's pages stay with the kernel
        node.proc.wait()
    del ix
    with MemoryNode(64 << 20, extra=["--backing", str(backing)]) as again:
        peer = vectide.Index(8, "l2", engine="d-hnsw", memnode=again.address, region="kept")
        assert len(peer) == 1200
        got, _ = peer.search(x[:20], k=5, nprobe=4)
        assert (got == want).all()
        del peer
    # A damaged backing file: the node does not start, and says why.
    data = bytearray(backing.read_bytes())
    data[0] ^= 1
    backing.write_bytes(bytes(data))
    out = subprocess.run([cli_path(), "memnode", "--listen", "127.0.0.1:0", "--size", "64M",
                          "--backing", str(backing)], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "bad magic" in out.stderr and "node.vtb" in out.stderr, out.stderr


_WRITER = r"""
import json, sys
import numpy as np
import vectide

addr, who = sys.argv[1], int(sys.argv[2])
ix = vectide.Index(8, "l2", engine="d-hnsw", memnode=addr, region="shared", timeout_ms=10000)

def vec(label):
    rng = np.random.default_rng(label * 7 + who)
    return (rng.normal(size=8) + 30 * who).astype(np.float32)

acked = []
for r in range(12):
    # Own labels, and labels both processes upsert (800..860).
    labels = list(range(1000 + 1000 * who + 10 * r, 1010 + 1000 * who + 10 * r)) + list(range(800 + 5 * r, 805 + 5 * r))
    ix.add(np.array(labels, dtype=np.uint64), np.stack([vec(l) for l in labels]))
    acked.append(["add", labels])
    gone = [l for l in range(3 * r + who, 400, 50)][:4]
    ix.delete(np.array(gone, dtype=np.uint64))
    acked.append(["delete", gone])
    ix.search(np.stack([vec(l) for l in labels[:3]]), k=3)
print(json.dumps(acked))
"""


@needs_cli
def test_two_compute_node_processes_write_one_region(tmp_path):
    """Two compute-node processes attached to one region insert, upsert
    (some labels from both) and delete (some labels from both) while
    searching; afterwards, from a third node, every acknowledged write is
    there (a label upserted by both holds one of the two vectors), nothing
    deleted comes back, the count agrees, and the region's structure is
    whole."""
    x = _data(1500, 8)
    with MemoryNode(256 << 20) as node:
        ix = vectide.Index(8, "l2", engine="d-hnsw", memnode=node.address, region="shared", partitions=6)
        ix.add(np.arange(1500, dtype=np.uint64), x)
        procs = [subprocess.Popen([sys.executable, "-c", _WRITER, node.address, str(w)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for w in (0, 1)]
        outs = [p.communicate(timeout=300) for p in procs]
        for p, (out, err) in zip(procs, outs):
            assert p.returncode == 0, err[-2000:]
        logs = [json.loads(out) for out, _ in outs]
        deleted = {l for log in logs for op, ls in log if op == "delete" for l in ls}
        added = {l for log in logs for op, ls in log if op == "add" for l in ls}
        live = (set(range(1500)) - deleted) | added
        check = vectide.Index(8, "l2", engine="d-hnsw", memnode=node.address, region="shared")
        assert len(check) == len(live) == len(ix)
        for l in sorted(deleted - added):
            with pytest.raises(KeyError):
                check.get(l)
        both = set(range(800, 860))
        for l in sorted(added):
            got = np.asarray(check.get(l)).ravel()
            owners = [w for w in (0, 1) if l in both or 1000 + 1000 * w <= l < 2000 + 1000 * w]
            ok = [np.allclose(got, (np.random.default_rng(l * 7 + w).normal(size=8) + 30 * w).astype(np.float32))
                  for w in owners]
            assert any(ok), l
        ids, _ = check.search(x[:50], k=10, nprobe=6, ef=64)
        assert not set(ids.ravel().tolist()) & (deleted - added)
        assert check.check() == []


@needs_cli
def test_dhnsw_writes_benchmark_small(tmp_path, data_root, monkeypatch):
    """The writers' benchmark on a small slice: two compute-node processes
    insert at once; every figure the issue names is in the summary, the
    per-node counts add up, and the region's structure is whole."""
    from vectide.bench import dhnsw_writes

    monkeypatch.setenv("VECTIDE_DATA", str(data_root))
    out = tmp_path / "w.json"
    rc = dhnsw_writes.main(["--dataset", "clustered-20k-32-angular", "--limit", "4000", "--queries", "100",
                            "--batch", "50", "--out", str(out)])
    assert rc == 0
    r = json.loads(out.read_text())
    s = r["summary"]
    for key in ("insert_rows_per_s_1_node", "insert_rows_per_s_2_nodes", "cas_retries_per_insert_2_nodes",
                "round_trips_per_insert", "bytes_per_insert", "model_us_per_insert", "recall10_after_insert",
                "recall10_fresh_build", "recall10_after_delete", "recall10_fresh_after_delete"):
        assert s[key] is not None, key
    assert s["structure_violations"] == 0
    two = r["runs"]["2"]
    assert sum(p["rows"] for p in two["per_node"]) == r["inserted"] == 800
    assert s["round_trips_per_insert"] > 0 and s["bytes_per_insert"] > 0
    assert s["recall10_after_insert"] > 0.8 and abs(s["recall10_points_below_fresh_after_insert"]) < 10
    assert r["commit"] and r["machine"]["simd_isa"]


_DB_WRITER = r"""
import sys
import numpy as np
import vectide

path, addr = sys.argv[1], sys.argv[2]
db = vectide.connect(path, checkpoint_seconds=0.3)
c = db.create_collection("c", 8, "l2", engine="d-hnsw", memnode=addr, region="shared", timeout_ms=1000)
rng = np.random.default_rng(5)
for b in range(10_000):
    ids = np.arange(10 * b, 10 * b + 10, dtype=np.uint64)
    c.upsert(ids, rng.normal(size=(10, 8)).astype(np.float32))
    print(f"acked {10 * b + 10}", flush=True)
"""


@needs_cli
def test_a_database_collection_leases_its_region(tmp_path):
    """A database collection of d-hnsw on a memory node with a backing file
    lives in its region (checkpoints FLUSH it, no saved file) and holds the
    region's lease: while its database writes, a second database's
    collection on that region is refused with an error naming the holder;
    the writing process SIGKILLed mid-stream, its database reopened takes
    the lease back at once and holds every acknowledged point."""
    backing = tmp_path / "node.vtb"
    with MemoryNode(256 << 20, extra=["--backing", str(backing)]) as node:
        proc = subprocess.Popen([sys.executable, "-c", _DB_WRITER, str(tmp_path / "db1"), node.address],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        acked = 0
        try:
            for line in proc.stdout:
                acked = int(line.split()[1])
                if acked >= 600:
                    break
            assert acked >= 600, proc.stderr.read()[-2000:]
            other = vectide.connect(tmp_path / "db2")
            with pytest.raises(ValueError) as refused:
                other.create_collection("c", 8, "l2", engine="d-hnsw", memnode=node.address, region="shared",
                                        timeout_ms=1000)
            msg = str(refused.value)
            assert "leased to" in msg and "/c" in msg and "one database at a time" in msg, msg
            other.close()
        finally:
            proc.kill()  # SIGKILL, mid-stream
            proc.wait()
        for line in proc.stdout:  # what it acknowledged before it died
            acked = int(line.split()[1])
        assert not list((tmp_path / "db1").rglob("index.vtdx")), "no saved file: the region is the engine's copy"
        t0 = time.monotonic()
        db = vectide.connect(tmp_path / "db1")
        c = db.get_collection("c")
        reopened = time.monotonic() - t0
        assert reopened < 1.0, f"the lease back at once, not after its expiry ({reopened:.2f} s)"
        assert c.count() >= acked
        c.get(list(range(acked)), with_vector=False)  # raises KeyError naming any lost point
        c.upsert(np.array([10**9], dtype=np.uint64), np.ones((1, 8), dtype=np.float32))
        db.close()
