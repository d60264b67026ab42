"""The soak (``python -m vectide.torture soak``): its checks catch what they
are for, and short soaks of the durable engines (embedded, through the
server, standalone) end with no wrong answer and no lost write. The long
soaks of every engine are the ``slow`` variants."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from vectide.torture import soak


def _model(n=6, dim=4):
    vecs = np.eye(dim, dtype=np.float32)[[0, 1, 2, 3, 0, 1]][:n]
    vecs = np.vstack([vecs, np.full((1, dim), 0.5, dtype=np.float32)])
    m = soak.Model(n, vecs)
    m.load(np.arange(4), np.arange(4))  # ids 0..3 live, rows 0..3
    return m


def test_a_workdir_left_with_an_earlier_soaks_data_is_refused(tmp_path):
    """A killed soak leaves its index in ``WORKDIR/data``; a soak started on
    it would reopen that index against an empty model and report every
    answer wrong (it did: 15,511 "wrong" in the first 30 s)."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "index.vtdx").write_bytes(b"left over")
    with pytest.raises(soak.UsedWorkdir, match="already holds data"):
        soak.run("flat", 0.01, "db", tmp_path)
    r = subprocess.run([sys.executable, "-m", "vectide.torture", "--workdir", str(tmp_path), "soak",
                        "--engine", "flat", "--minutes", "0.01"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "already holds data" in r.stderr, r.stderr
    assert (tmp_path / "data" / "index.vtdx").read_bytes() == b"left over"


def test_the_reader_check_catches_a_deleted_a_never_written_and_a_missed_id():
    m = _model()
    q = np.array([1, 0, 0, 0], dtype=np.float32)
    soak_k = soak.K
    soak.K = 2
    try:
        m.begin(1, -1)  # delete id 1 ...
        m.ack(1)  # ... acknowledged before the search
        r0 = m.tick()
        r1 = m.tick()
        assert soak.check_answer(m, q, [0, 2], [0.0, 1.0], r0, r1, exact=True) == []
        bad = soak.check_answer(m, q, [0, 1], [0.0, 1.0], r0, r1, exact=False)
        assert len(bad) == 1 and "id 1 was absent" in bad[0]
        bad = soak.check_answer(m, q, [0, 5], [0.0, 1.0], r0, r1, exact=False)
        assert len(bad) == 1 and "never written" in bad[0]
        # An id outside every id ever used, in an exact answer: named, not a crash.
        bad = soak.check_answer(m, q, [0, 10**9], [0.0, 1.0], r0, r1, exact=True)
        assert any("10" in b and "never written" in b for b in bad), bad
        # Id 0 (distance 0) is live and unchanged: an exact answer without it is wrong.
        bad = soak.check_answer(m, q, [2, 3], [1.0, 1.0], r0, r1, exact=True)
        assert any("missed id 0" in b for b in bad), bad
        # A wrong distance for an unchanged id.
        bad = soak.check_answer(m, q, [0, 2], [0.5, 1.0], r0, r1, exact=True)
        assert any("id 0: distance" in b for b in bad), bad
        # An id deleted while the call ran may be returned; so may one
        # missing from an exact answer when it changed during the call.
        r0 = m.tick()
        m.begin(0, -1)
        r1 = m.tick()
        m.ack(0)
        assert soak.check_answer(m, q, [0, 2], [0.0, 1.0], r0, r1, exact=True) == []
        assert soak.check_answer(m, q, [2, 3], [1.0, 1.0], r0, r1, exact=True) == []
    finally:
        soak.K = soak_k


def test_latencies_split_by_the_maintenance_polls():
    # Polls at 0, 1, 2, 3 s: a job runs at 1 s; one begins and ends between 2 and 3 s.
    polls = np.array([[0.0, 0, 0], [1.0, 1, 1], [2.0, 0, 1], [3.0, 0, 2], [4.0, 0, 2]])
    starts = np.array([0.5, 1.5, 2.5, 3.5, 3.6])
    lats = np.array([0.010, 0.020, 0.030, 0.001, 0.002])
    s = soak.split_latencies(starts, lats, polls)
    assert s["maintenance"]["n"] == 3 and s["idle"]["n"] == 2
    assert s["maintenance"]["max_ms"] == pytest.approx(30.0)
    assert s["idle"]["max_ms"] == pytest.approx(2.0)


def test_the_slowest_calls_are_named_on_the_samples_clock():
    starts = np.array([100.0, 101.0, 102.0, 103.0])
    lats = np.array([0.001, 0.5, 0.002, 0.03])
    samples = [{"t": 2.0, "clock": 99.0}, {"t": 4.0, "clock": 101.0}]
    got = soak.slowest(starts, lats, samples, n=2)
    assert got == [{"t": 4.0, "ms": 500.0}, {"t": 6.0, "ms": 30.0}]
    assert soak.slowest(starts[:0], lats[:0], samples) == []


def _clean_report(proc, out):
    """The soak's report, after checking it found nothing wrong: (report,
    summary, a message with the examples)."""
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    r = json.loads(out.read_text())
    s = r["summary"]
    detail = f"{s}\n{r['wrong_answer_examples'][:5]}\n{r['lost_examples'][:5]}\n{r['error_examples'][:5]}"
    assert s["wrong_answers"] == 0, detail
    assert s["acked_writes_lost"] == 0, detail
    assert s["errors"] == 0, detail
    assert proc.returncode == 0, detail
    return r, s, detail


def _run(tmp_path, engine, mode, minutes, points, *extra):
    out = tmp_path / f"{engine}-{mode}.json"
    cmd = [sys.executable, "-m", "vectide.torture", "--workdir", str(tmp_path / "work"), "soak", "--engine", engine,
           "--minutes", str(minutes), "--points", str(points), "--out", str(out), *extra]
    if mode == "server":
        cmd.append("--server")
    elif mode == "standalone":
        cmd.append("--standalone")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    r, s, detail = _clean_report(proc, out)
    assert s["acknowledged_ops_checked"] > 0 and s["exact_searches" if mode != "standalone" else "searches"] > 0, detail
    assert len(r["samples"]) >= 2, detail
    # The slowest writes, on the samples' clock (within the run).
    slow = r["slowest_writes"]
    assert slow and [x["ms"] for x in slow] == sorted((x["ms"] for x in slow), reverse=True), slow
    # (The split leaves out the calls outside the polls: at most the slowest.)
    assert slow[0]["ms"] >= max(v["max_ms"] for v in r["write_latency"].values() if v) - 1e-3, slow
    assert all(-5 < x["t"] < r["samples"][-1]["t"] + 60 for x in slow), (slow, r["samples"][-1]["t"])
    for key in ("disk_over_live_last", "rss_growth", "rss_envelope_growth", "rss_floor_growth", "rss_anon_growth",
                "write_p999_maintenance_over_idle"):
        assert key in s
    # The resident set's parts, read from the holder's /proc status: the
    # anonymous and the file-backed pages make up the whole.
    for x in r["samples"]:
        assert x["rss"] > 0 and x["rss_anon"] > 0, x
        assert x["rss_anon"] + x["rss_file"] == x["rss"], x
        # Huge pages are part of the anonymous memory (read a moment apart
        # from it: one huge page of slack).
        assert 0 <= x["rss_anon_huge"] <= x["rss_anon"] + (2 << 20), x
    # The settled sample: taken with the writers parked (no write between
    # parking and the sample), between jobs, the holder asked for its
    # quiet-time work (through the server by Vectide's own endpoints).
    q = r["settled_sample"]
    assert q is not None and q["paused"], detail
    assert q["writes_at_park"] == sum(q[k] for k in soak.WRITE_KINDS), q
    assert s["settled"] and not q["maintenance_running"], detail
    assert s["disk_over_live_last"] == round(q["disk_bytes"] / (q["live"] * soak.DIM * 4), 3), detail
    # The engine's own stats at that moment, its live count the model's.
    assert q["engine_stats"]["live"] == q["live"], q.get("engine_stats")
    # ... and the engine's own figures, through the database and the server
    # too (a block store's blocks explain its level of disk over live).
    if engine in ("spfresh", "spann", "spann-inplace"):
        assert q["engine_stats"]["blocks_used"] > 0, q["engine_stats"]
    # Writes went on after it: the kill came mid-stream.
    assert s["writes_begun_after_settle"] > 0, detail
    # The parts add up to the whole, sample by sample.
    for x in r["samples"] + [q]:
        assert sum(x["disk_parts"].values()) == x["disk_bytes"], x
    # The driver's C heap is sampled when it holds the data (embedded,
    # glibc), and never a server's (another process).
    heaps = [x["heap_in_use"] for x in r["samples"]]
    if mode == "server":
        assert heaps == [None] * len(heaps)
    elif soak.heap_bytes() is not None:
        assert all(h and h > 0 for h in heaps), heaps
    return r


# Small merge, snapshot and split thresholds: maintenance runs within seconds.
SMALL = {
    "fresh-diskann": ["--param", "temp_points=1000", "--param", "merge_points=3000"],
    "spfresh": ["--param", "snapshot_rows=2000"],
    "spann": ["--param", "snapshot_rows=2000", "--maintain-every", "5"],
    "p-hnsw": [],
}

# About two minutes of soak in the fast set, shared across the durable engines.
FAST = [("fresh-diskann", "db"), ("spfresh", "db"), ("spann", "db"), ("p-hnsw", "db"),
        ("spfresh", "server"), ("fresh-diskann", "standalone")]


@pytest.mark.parametrize("engine,mode", FAST, ids=[f"{e}-{m}" for e, m in FAST])
def test_a_short_soak_has_no_wrong_answer_and_loses_no_write(tmp_path, engine, mode):
    r = _run(tmp_path, engine, mode, 0.25, 5_000, *SMALL[engine])
    assert r["summary"]["maintenance_jobs"] > 0, "no maintenance job ran: the soak did not test it"
    if mode == "standalone" and engine == "fresh-diskann":
        # Its merges cannot be held (pause_maintenance declines): never
        # held, and said so in every sample.
        assert {x["quiet"] for x in r["samples"]} == {None}
        assert {x["quiet_windows"] for x in r["samples"]} == {None}


def test_a_soak_of_a_collection_of_several_spaces_loses_nothing(tmp_path):
    """--spaces: the engine's space, a second on flat and a sparse one, every
    point written to all three and, at the end, every acknowledged point's
    three vectors found together (a point whose echo or terms vector is not
    the one written with its main vector counts as lost)."""
    r = _run(tmp_path, "spfresh", "db", 0.2, 3_000, *SMALL["spfresh"], "--spaces")
    assert r["summary"]["acknowledged_ops_checked"] > 0
    parts = r["settled_sample"]["disk_parts"]
    assert "spaces" in parts and "sparse-0.vtsp" in parts, parts


def test_a_standalone_soak_holds_the_jobs_that_never_stop_for_idle_windows(tmp_path):
    # spfresh's splits, merges and reassigns run without a pause under the
    # soak's churn: the held windows are where its idle writes come from.
    r = _run(tmp_path, "spfresh", "standalone", 0.25, 5_000, *SMALL["spfresh"], "--quiet-every", "4.5")
    assert r["quiet_every_s"] == 4.5 and r["quiet_window_s"] == 1.5, r["quiet_window_s"]
    # Windows begin at 3, 7.5, 12 s...: at least two by the last sample.
    assert r["samples"][-1]["quiet_windows"] >= 2, [x["quiet_windows"] for x in r["samples"]]
    assert False in [x["quiet"] for x in r["samples"]]
    assert not r["settled_sample"]["quiet"], "the settle waits for a held window to end"
    assert r["write_latency"]["idle"] is not None and r["write_latency"]["idle"]["n"] > 0, r["write_latency"]
    assert r["summary"]["write_p999_maintenance_over_idle"] is not None


HAVE_CLI = (Path(sys.executable).parent / "vectide").exists()
needs_cli = pytest.mark.skipif(not HAVE_CLI, reason="the vectide binary is not installed beside this Python")


def _memnodes_on(backing: Path):
    """Pids of processes whose command line names ``backing`` (a memory
    node the soak started on it)."""
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if str(backing).encode() in (d / "cmdline").read_bytes():
                    pids.append(int(d.name))
            except OSError:
                pass
    return pids


@needs_cli
def test_a_soak_on_a_memory_node_through_two_compute_nodes_loses_nothing_across_its_restart(tmp_path):
    """d-hnsw (chosen by the registry's persistence class) on a memory node
    the soak starts, written and read through two compute nodes on one
    region: every answer checked against the one model (answers through one
    node see the other's writes), both nodes wrote, each node's durable_seq
    is its own last operation at the settle; the memory node SIGKILLed
    mid-stream and restarted on its backing file loses no acknowledged
    write, brings no deleted id back, counts no label twice, keeps every
    writer's durable_seq; the memory node is gone and the work dir
    removed afterwards."""
    work = tmp_path / "work"
    out = tmp_path / "d-hnsw.json"
    cmd = [sys.executable, "-m", "vectide.torture", "--workdir", str(work), "soak", "--engine", "d-hnsw",
           "--compute-nodes", "2", "--minutes", "0.2", "--points", "3000", "--param", "partition_points=500",
           "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    r, s, detail = _clean_report(proc, out)
    assert r["mode"] == "standalone" and r["compute_nodes"] == s["compute_nodes"] == 2, detail
    # Both compute nodes wrote and answered searches.
    assert len(s["writes_per_compute_node"]) == 2 and min(s["writes_per_compute_node"]) > 0, detail
    assert min(s["searches_per_compute_node"]) > 0, detail
    assert sum(s["writes_per_compute_node"]) == s["writes"], detail
    # The region after the restart: its count is the ids found, whole,
    # no absent id in an answer, every writer's durable_seq kept.
    assert s["label_count_minus_live"] == 0 and s["structure_violations"] == 0, detail
    assert s["absent_ids_in_answers_after_restart"] == 0, detail
    assert s["durable_seq_mismatches"] == 0 and s["durable_seq_regressions"] == 0, detail
    assert all(b >= a > 0 for a, b in zip(s["durable_seq_at_settle"], s["durable_seq_after_restart"])), detail
    assert s["acknowledged_ops_checked"] > 100 and s["writes_begun_after_settle"] > 0, detail
    assert r["restart_s"] > 0 and s["settled"], detail
    # Each node numbers its own operations: at the settle, one flush each,
    # its durable_seq is where its own count ends.
    q = r["settled_sample"]
    assert [n["durable_seq"] for n in q["compute_nodes"]] == [n["base_seq"] + n["ops"] for n in q["compute_nodes"]]
    # The holder sampled is the memory node: its backing file is the data,
    # its RSS the holder's (no C heap of the driver's).
    for x in r["samples"]:
        assert set(x["disk_parts"]) == {"memnode.vtb"} and x["disk_bytes"] > 0, x
        assert x["rss"] > 0 and x["heap_in_use"] is None, x
    assert not work.exists(), list(work.rglob("*"))
    assert _memnodes_on(work / "data" / "memnode.vtb") == []


@needs_cli
def test_a_failed_soak_on_a_memory_node_stops_it_and_cleans_its_work_dir(tmp_path):
    work = tmp_path / "work"
    with pytest.raises(RuntimeError, match="did not start"):
        # A parameter out of range: the driver fails to open its first compute node.
        soak.run("d-hnsw", 0.05, "standalone", work, points=500, params={"partition_points": 0},
                 progress=False, compute_nodes=2)
    assert not work.exists()
    assert _memnodes_on(work / "data" / "memnode.vtb") == []


def test_compute_nodes_are_refused_for_an_engine_off_a_memory_node(tmp_path):
    with pytest.raises(soak.BadSoakArguments, match="memory node"):
        soak.run("flat", 0.01, "standalone", tmp_path, compute_nodes=2)
    with pytest.raises(soak.BadSoakArguments, match="N >= 1"):
        soak.run("d-hnsw", 0.01, "standalone", tmp_path, compute_nodes=0)
    with pytest.raises(soak.BadSoakArguments, match="server"):
        soak.run("d-hnsw", 0.01, "server", tmp_path, compute_nodes=2)
    r = subprocess.run([sys.executable, "-m", "vectide.torture", "--workdir", str(tmp_path / "w"), "soak",
                        "--engine", "flat", "--compute-nodes", "2", "--minutes", "0.01"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--compute-nodes is for an engine that lives on a memory node" in r.stderr, r.stderr


def _every(mode):
    import vectide

    es = vectide.engines()
    if mode == "standalone":
        return [e["name"] for e in es if e["in_directory"]]
    return [e["name"] for e in es]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["db", "server", "standalone"])
def test_a_soak_of_every_engine_has_no_wrong_answer_and_loses_no_write(tmp_path, mode):
    for engine in _every(mode):
        _run(tmp_path / engine, engine, mode, 3, 100_000, *SMALL.get(engine, []))


@pytest.mark.slow
@needs_cli
def test_a_soak_of_every_engine_on_a_memory_node_through_two_compute_nodes(tmp_path):
    import vectide

    for engine in [e["name"] for e in vectide.engines() if e["persistence"] == soak.ON_MEMORY_NODE]:
        out = tmp_path / f"{engine}.json"
        proc = subprocess.run([sys.executable, "-m", "vectide.torture", "--workdir", str(tmp_path / engine), "soak",
                               "--engine", engine, "--compute-nodes", "2", "--minutes", "3", "--points", "100000",
                               "--out", str(out)], capture_output=True, text=True, timeout=1800)
        assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
        r = json.loads(out.read_text())
        s = r["summary"]
        detail = f"{s}\n{r['wrong_answer_examples'][:5]}\n{r['lost_examples'][:5]}\n{r['error_examples'][:5]}"
        assert s["wrong_answers"] == 0 and s["acked_writes_lost"] == 0 and s["errors"] == 0, detail
        assert min(s["writes_per_compute_node"]) > 0 and proc.returncode == 0, detail


def test_disk_parts_name_a_collections_wal_store_and_index(tmp_path):
    col = tmp_path / "collections" / "docs"
    (col / "wal").mkdir(parents=True)
    (col / "index").mkdir()
    (col / "wal" / "1.log").write_bytes(b"x" * 10_000)
    (col / "index" / "nodes.vtdp").write_bytes(b"y" * 20_000)
    (col / "points.snap").write_bytes(b"z" * 5_000)
    (col / "points.log").write_bytes(b"z" * 3_000)
    (tmp_path / "catalog.json").write_text("{}")
    alloc, size, parts = soak.dir_bytes(tmp_path)
    assert set(parts) == {"wal", "index", "points", "catalog.json"}
    assert sum(parts.values()) == alloc and size == 38_002
    assert parts["points"] >= 8_000
    assert parts["index"] >= 20_000 > parts["wal"] >= 10_000
    lb = soak.DIM * 4 * 100
    got = soak.parts_over_live({"live": 100, "disk_parts": parts})
    assert got["index"] == round(parts["index"] / lb, 3)


def test_envelope_growth_follows_the_trend_not_the_teeth():
    teeth = [3.0, 4.0, 5.0] * 10  # a log cut at every third sample: flat
    assert soak.envelope_growth(teeth, 0) == 1.0
    rising = [3.0 + 0.1 * i for i in range(30)]
    assert soak.envelope_growth(rising, 0) > 1.5
    assert soak.envelope_growth(rising, None) is None
    assert soak.envelope_growth([1.0], 0) is None


def test_floor_growth_follows_the_troughs():
    # Teeth of the same height on a rising floor (memory kept after each job).
    rising_floor = [1.0 + 0.05 * i + (2.0 if i % 4 == 3 else 0.0) for i in range(20)]
    assert soak.floor_growth(rising_floor, 0) > 1.5
    flat = [1.0 + (0.8 if i % 3 == 0 else 0.0) for i in range(30)]
    assert soak.floor_growth(flat, 0) == 1.0
    assert soak.floor_growth(flat, None) is None
    assert soak.floor_growth([1.0], 0) is None


def test_the_disk_reference_follows_the_first_job_of_the_churn_not_of_the_load():
    def s(started, running):
        return {"maintenance_started": started, "maintenance_running": running}
    # Eight jobs began during the load; the ninth is the churn's first.
    samples = [s(8, False), s(9, True), s(9, True), s(9, False), s(10, True)]
    assert soak.first_job_done(samples, 8) == 3
    # Jobs back to back: a second job beginning means the first one ended
    # (they run in turn).
    assert soak.first_job_done([s(8, True), s(10, True)], 8) == 1
    assert soak.first_job_done([s(8, False), s(9, True)], 8) is None
    # Without load-time jobs, the first sample past one finished job.
    assert soak.first_job_done([s(0, False), s(1, True), s(1, False)], 0) == 2
    # The reference is a sample between jobs: not one where the second runs.
    assert soak.first_job_done([s(0, False), s(1, True), s(2, True), s(2, False)], 0) == 3
