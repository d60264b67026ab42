"""The runbook benchmark: the clustered generator, ground truth over the
active set, and a small run of every streaming engine and peer."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from vectide import runbook as rbk
from vectide.bench import runbooks

DATASET = "clustered-20k-32-angular"


def _blobs(seed=3, k=6, per=200, dim=8):
    rng = np.random.default_rng(seed)
    centres = rng.normal(scale=20.0, size=(k, dim))
    x = np.concatenate([c + rng.normal(size=(per, dim)) for c in centres]).astype(np.float32)
    truth = np.repeat(np.arange(k), per)
    return x, truth


def test_kmeans_recovers_well_separated_blobs_and_is_deterministic():
    x, truth = _blobs()
    labels = rbk.kmeans(x, 6, seed=0)
    # Every blob lands in one cluster and every cluster holds one blob.
    pairs = {(int(a), int(b)) for a, b in zip(truth, labels)}
    assert len(pairs) == 6 and len({b for _, b in pairs}) == 6
    assert np.array_equal(labels, rbk.kmeans(x, 6, seed=0))
    # Lloyd's fixed point: each point is with its nearest centre.
    centres = np.stack([x[labels == c].mean(0) for c in range(6)])
    d = ((x[:, None, :] - centres[None]) ** 2).sum(-1)
    assert np.array_equal(d.argmin(1), labels)
    with pytest.raises(rbk.RunbookError, match="at least 7 rows"):
        rbk.kmeans(x[:6], 7)


def test_clustered_runbook_inserts_clusters_in_order_and_stays_under_max_pts():
    x, _ = _blobs(k=16, per=50)
    rb, order, bounds = rbk.clustered(x, "blobs", clusters=16, max_pts=400, delete_every=4, search_every=4)
    assert sorted(order.tolist()) == list(range(len(x)))
    inserts = [(s.start, s.end) for s in rb.steps if s.operation == "insert"]
    assert inserts == [(int(bounds[c]), int(bounds[c + 1])) for c in range(16) if bounds[c] < bounds[c + 1]]
    # Deletes take the oldest live clusters first.
    deletes = [(s.start, s.end) for s in rb.steps if s.operation == "delete"]
    assert deletes and deletes == inserts[: len(deletes)]
    counts = rbk.check(rb, len(x))
    assert counts["peak_active"] <= 400
    # A search after every 4th operation, and one at the end.
    ops = 0
    for i, s in enumerate(rb.steps):
        if s.operation == "search":
            assert ops % 4 == 0 or i == len(rb.steps) - 1
        else:
            ops += 1
            if ops % 4 == 0:
                assert rb.steps[i + 1].operation == "search"
    assert rb.steps[-1].operation == "search"
    # Points of one cluster share a label.
    labels = rbk.kmeans(x, 16, seed=0)[order]
    for c in range(16):
        assert len(set(labels[bounds[c] : bounds[c + 1]].tolist())) <= 1
    assert rbk.dump(rb) == rbk.dump(rbk.clustered(x, "blobs", clusters=16, max_pts=400, delete_every=4)[0])


def _run(tmp_path, engines, runbook="clustered", extra=(), dataset=DATASET, max_pts=4000, queries=100):
    out = tmp_path / "rb.json"
    code = runbooks.main(
        ["--dataset", str(dataset), "--runbook", runbook, "--engines", ",".join(engines), "--max-pts", str(max_pts),
         "--queries", str(queries), "--knob", "64", "--out", str(out), *extra]
    )
    return code, out


def test_ground_truth_is_exact_over_the_active_set(data_root, monkeypatch, tmp_path):
    monkeypatch.setenv("VECTIDE_DATA", str(data_root))
    from vectide import datasets

    ds = datasets.load(DATASET)
    rb = rbk.loads(
        "t:\n  max_pts: 3000\n"
        "  1: {operation: insert, start: 0, end: 3000}\n"
        "  2: {operation: delete, start: 1000, end: 2000}\n"
        "  3: {operation: replace, tags_start: 0, tags_end: 500, ids_start: 5000, ids_end: 5500}\n"
        "  4: {operation: search}\n"
    )
    prep = runbooks.Prepared(ds, None, 50, tmp_path / "prep")
    truth = runbooks.ground_truth(prep, rb, 10, tmp_path)
    assert len(truth) == 1 and truth[0].shape == (50, 10)
    # Brute force: ids 0..499 hold rows 5000..5499, 500..999 and 2000..2999 their own.
    ids = np.concatenate([np.arange(0, 1000), np.arange(2000, 3000)])
    rows = ids.copy()
    rows[:500] += 5000
    x = np.asarray(prep.data)[rows]
    sims = prep.queries @ x.T
    want = ids[np.argsort(-sims, axis=1, kind="stable")[:, :10]]
    assert (truth[0] == want).mean() > 0.999
    assert not np.isin(truth[0], np.arange(1000, 2000)).any()
    # Cached: the second call reads the file.
    cached = list(tmp_path.glob("gt2-*.npz"))
    assert len(cached) == 1
    assert np.array_equal(runbooks.ground_truth(prep, rb, 10, tmp_path)[0], truth[0])
    # The same ranges over another row order are other points: not the cached answer.
    order = np.arange(len(ds.train))[::-1].copy()
    other = runbooks.Prepared(ds, order, 50, tmp_path / "prep-reversed")
    again = runbooks.ground_truth(other, rb, 10, tmp_path)[0]
    assert len(list(tmp_path.glob("gt2-*.npz"))) == 2 and not np.array_equal(again, truth[0])


def _check_run(code, out, engines, rows):
    """A runbook result over ``engines`` on a dataset of ``rows`` rows."""
    assert code == 0
    doc = json.loads(out.read_text())
    assert set(doc["summary"]["avg_recall10"]) == set(engines)
    assert doc["threads"] == {"updates": 2, "searches": 1}
    searches = doc["runbook"]["search"]
    for name, e in doc["engines"].items():
        steps = [s for s in e["steps"] if s["operation"] == "search"]
        assert len(steps) == searches
        for s in steps:
            assert 0 <= s["recall"] <= 1 and s["qps"] > 0 and s["p99_latency_us"] >= s["mean_latency_us"] * 0.5
        ops = sum(s["seconds"] for s in e["steps"])
        assert e["seconds"] == pytest.approx(ops) and doc["summary"]["seconds"][name] == e["seconds"]
        assert e["consolidation_policy"] and doc["policies"][name] == e["consolidation_policy"]
        if name != "faiss-ivf":  # graphs: the clustered stream keeps them accurate
            assert e["avg_recall"] >= 0.9, (name, e["avg_recall"])
    assert Path(doc["runbook"]["yaml"]).exists()
    assert rbk.check(rbk.load(doc["runbook"]["yaml"]), rows)["search"] == searches
    return doc


def _optional_peers():
    """svs when its package is installed, diskann when its interpreter is."""
    engines = []
    for name, module in (("svs", "svs"),):
        try:
            __import__(module)
            engines.append(name)
        except ImportError:
            pass
    if Path(runbooks.peers_python()).exists():
        engines.append("diskann")
    return engines


def _groups():
    """The engines of the fast clustered runs: Vectide's graphs, its SPANN
    family (knob nprobe) and the peers but svs; every streaming engine is in
    one of them."""
    import vectide

    knob = {f"vectide:{e['name']}": e["primary_knob"] for e in vectide.engines()}
    mine = runbooks.streaming_engines()
    groups = {
        "vectide-graphs": [e for e in mine if knob[e] != "nprobe"],
        "vectide-spann": [e for e in mine if knob[e] == "nprobe"],
        "peers": ["hnswlib", "faiss-ivf"] + [e for e in _optional_peers() if e != "svs"],
    }
    assert sorted(groups["vectide-graphs"] + groups["vectide-spann"]) == sorted(mine)
    assert len(groups["vectide-graphs"]) >= 3 and len(groups["vectide-spann"]) >= 3
    return groups


@pytest.mark.parametrize("group", ["vectide-graphs", "vectide-spann", "peers"])
def test_a_clustered_run_on_a_slice(data_root, bench_slice, monkeypatch, tmp_path, group):
    # The fast version of the next test: the clustered runbook (k-means into
    # 64 clusters, inserted in turn) over the first 4,000 rows, at most 1,000
    # active, 30 queries per search, the engines in three runs. svs runs the
    # short runbook file of the test after this one instead: its 64 insert
    # steps here took 4 s on an idle machine but 53 s with another process
    # busy on one of the two cores.
    monkeypatch.setenv("VECTIDE_DATA", str(data_root))
    engines = _groups()[group]
    dataset = bench_slice(4000, 100)
    code, out = _run(tmp_path, engines, dataset=dataset, max_pts=1000, queries=30)
    doc = _check_run(code, out, engines, 4000)
    assert doc["dataset"] == dataset.stem and doc["runbook"]["generator"] == "clustered"
    assert doc["runbook"]["insert"] == 64 and doc["runbook"]["peak_active"] <= 1000


def test_svs_runs_a_runbook_file(data_root, bench_slice, monkeypatch, tmp_path):
    # svs (and a Vectide engine beside it) on a short runbook file: builds on
    # the first insert, adds, deletes with consolidate and compact.
    pytest.importorskip("svs")
    monkeypatch.setenv("VECTIDE_DATA", str(data_root))
    path = tmp_path / "short.yaml"
    path.write_text("t:\n  max_pts: 1000\n  1: {operation: insert, start: 0, end: 500}\n  2: {operation: search}\n"
                    "  3: {operation: insert, start: 500, end: 1000}\n  4: {operation: search}\n"
                    "  5: {operation: delete, start: 0, end: 300}\n  6: {operation: search}\n"
                    "  7: {operation: insert, start: 1000, end: 1300}\n  8: {operation: search}\n")
    engines = ["svs", "vectide:fresh-vamana"]
    code, out = _run(tmp_path, engines, str(path), dataset=bench_slice(4000, 100), queries=30)
    doc = _check_run(code, out, engines, 4000)
    assert doc["runbook"]["file"] == str(path) and doc["runbook"]["search"] == 4
    assert doc["engines"]["svs"]["params"]["graph_max_degree"] == runbooks.VAMANA["r"]


@pytest.mark.slow
def test_a_small_clustered_run_over_every_engine(data_root, monkeypatch, tmp_path):
    monkeypatch.setenv("VECTIDE_DATA", str(data_root))
    engines = runbooks.streaming_engines() + ["hnswlib", "faiss-ivf"] + _optional_peers()
    code, out = _run(tmp_path, engines)
    _check_run(code, out, engines, 20_000)


@pytest.mark.parametrize(
    "runbook, engines, message",
    [
        ("nosuch", ["vectide:hnsw"], "neither a file nor a generator"),
        ("churn:5", ["vectide:nosuch"], 'unknown engine "nosuch"'),
        ("churn:5", ["nosuch"], "unknown streaming engine 'nosuch'"),
        ("churn:5", ["vectide:hnsw@m=many"], "m=many is not an integer"),
        ("churn:5", ["hnswlib", "hnswlib"], "listed twice"),
        ("churn:5", ["vectide:hnsw@repair_alpha"], "expected NAME@key=value"),
        ("churn:5", ["hnswlib@m=8"], "only vectide:ENGINE takes @key=value"),
        ("churn:5", ["vectide:nosuch@m=8"], 'unknown engine "nosuch"'),
        ("churn:5", ["vectide:hnsw@m=8@m=9"], 'sets "m" twice'),
    ],
)
def test_bad_input_is_refused_before_anything_runs(data_root, monkeypatch, tmp_path, capsys, runbook, engines, message):
    monkeypatch.setenv("VECTIDE_DATA", str(data_root))
    code, out = _run(tmp_path, engines, runbook)
    assert code == 2 and not out.exists()
    assert message in capsys.readouterr().err


def test_a_runbook_file_that_deletes_ids_never_inserted_is_refused(data_root, monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("VECTIDE_DATA", str(data_root))
    path = tmp_path / "bad.yaml"
    path.write_text("t:\n  max_pts: 100\n  1: {operation: insert, start: 0, end: 100}\n"
                    "  2: {operation: delete, start: 50, end: 150}\n  3: {operation: search}\n")
    code, out = _run(tmp_path, ["vectide:hnsw"], str(path))
    assert code == 2 and not out.exists()
    assert "step 2 (delete 50..150): ids never inserted" in capsys.readouterr().err
    path.write_text("t:\n  max_pts: 30000\n  1: {operation: insert, start: 0, end: 100}\n")
    assert _run(tmp_path, ["vectide:hnsw"], str(path))[0] == 2
    assert "max_pts 30000 must be in 1..=20000" in capsys.readouterr().err


#: The fast versions run on the first 4,000 rows, where a higher recall
#: target keeps the calibration sweeping past its first value; the slow
#: ones on the full 20k set at the default target.
SIZES = [pytest.param(4000, 0.98, id="slice"), pytest.param(20_000, 0.95, id="full", marks=pytest.mark.slow)]


def _dataset(bench_slice, rows):
    return DATASET if rows == 20_000 else str(bench_slice(rows, 100))


@pytest.mark.parametrize("rows,target", SIZES)
def test_stability_fixes_each_knob_at_the_target_and_reports_drift(data_root, bench_slice, monkeypatch, tmp_path,
                                                                     rows, target):
    monkeypatch.setenv("VECTIDE_DATA", str(data_root))
    from vectide.bench import churn

    out = tmp_path / "stability.json"
    code = churn.stability_main(
        ["--dataset", _dataset(bench_slice, rows), "--cycles", "2", "--rates", "10", "--engines",
         "vectide:fresh-vamana,hnswlib", "--queries", "100", "--target", str(target), "--out", str(out)]
    )
    assert code == 0
    doc = json.loads(out.read_text())
    assert doc["n"] == rows and doc["target_recall_for_knob"] == target
    for name in ("vectide:fresh-vamana", "hnswlib"):
        r = doc["engines"][name]["10"]
        sweep = r["calibration"]["sweep"]
        assert r["calibration"]["target"] == target
        # The smallest sweep value reaching the target: every earlier one missed it.
        assert sweep[-1]["recall"] >= target and all(p["recall"] < target for p in sweep[:-1])
        assert list(r["knob"].values()) == [r["calibration"]["chosen"]]
        assert len(r["cycles"]) == 3  # cycle 0 and two churn cycles
        assert r["cycle0_recall10"] == r["cycles"][0]["recall10"]
        worst = min(c["recall10"] for c in r["cycles"][1:])
        assert doc["summary"]["recall_drift_points"][name]["10"] == pytest.approx(100 * (r["cycle0_recall10"] - worst))
        assert 0 < r["cycles"][0]["recall5at5"] <= 1
    assert churn.stability_main(["--rates", "0", "--out", str(tmp_path / "x.json")]) == 2


@pytest.mark.parametrize("rows", [pytest.param(4000, id="slice"), pytest.param(20_000, id="full", marks=pytest.mark.slow)])
def test_engine_variants_parse_and_run_beside_the_plain_engine(data_root, bench_slice, monkeypatch, tmp_path, rows):
    from vectide import _vectide as core

    # The harness core resolves a variant (the CLI's rule), typed by the schema.
    assert core.runbook_engine("hnsw@repair_alpha=1.2@m=8") == "vectide:hnsw@repair_alpha=1.2@m=8"
    with pytest.raises(ValueError, match="has no parameter"):
        core.runbook_engine("vectide:hnsw@x=a")
    monkeypatch.setenv("VECTIDE_DATA", str(data_root))
    from vectide.bench import churn

    dataset = _dataset(bench_slice, rows)
    out = tmp_path / "variants.json"
    code = churn.stability_main(
        ["--dataset", dataset, "--cycles", "1", "--rates", "10", "--engines",
         "vectide:hnsw,vectide:hnsw@repair_alpha=1.2", "--queries", "50", "--out", str(out)]
    )
    assert code == 0
    doc = json.loads(out.read_text())
    plain = doc["engines"]["vectide:hnsw"]["10"]["params"]
    variant = doc["engines"]["vectide:hnsw@repair_alpha=1.2"]["10"]["params"]
    assert plain["repair_alpha"] == pytest.approx(1.0)
    assert variant["repair_alpha"] == pytest.approx(1.2)
    # A parameter the engine does not take is refused before anything runs.
    code = churn.stability_main(
        ["--dataset", dataset, "--cycles", "1", "--rates", "10", "--engines", "vectide:hnsw@nosuch=1",
         "--queries", "50", "--out", str(tmp_path / "bad.json")]
    )
    assert code == 2
