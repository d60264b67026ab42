"""vectide.bench: recall, Pareto interpolation, ratios and a tiny end-to-end run."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from vectide.bench import main
from vectide.bench.engines import is_peer, make_engine
from vectide.bench.metrics import pareto_frontier, qps_at_recall, ratio_vs_best_peer, recall_at_k

DATASET = "clustered-20k-32-angular"


# --------------------------------------------------------------------------
# Pareto frontier and QPS at a recall target

SWEEP = [(0.80, 1000.0), (0.90, 500.0), (0.95, 100.0), (0.85, 300.0), (0.99, 20.0)]


def test_frontier_drops_dominated_points():
    # (0.85, 300) is dominated by (0.90, 500); so is a slower duplicate recall.
    assert pareto_frontier(SWEEP + [(0.90, 400.0)]) == [(0.80, 1000.0), (0.90, 500.0), (0.95, 100.0), (0.99, 20.0)]
    assert pareto_frontier([]) == []


def test_exact_hit():
    assert qps_at_recall(SWEEP, 0.90) == 500.0
    assert qps_at_recall(SWEEP, 0.95) == 100.0
    assert qps_at_recall(SWEEP, 0.99) == 20.0


def test_bracket_interpolates_log_qps():
    # Half way from (0.90, 500) to (0.95, 100) in recall: geometric mean.
    assert qps_at_recall(SWEEP, 0.925) == pytest.approx(math.sqrt(500 * 100))
    # A quarter of the way from (0.80, 1000) to (0.90, 500): 1000 * 0.5**0.25.
    assert qps_at_recall(SWEEP, 0.825) == pytest.approx(1000 * 0.5**0.25)


def test_dominated_points_are_ignored():
    # Without the frontier, (0.85, 300) would bracket 0.875 with (0.90, 500).
    assert qps_at_recall(SWEEP, 0.875) == pytest.approx(math.exp(math.log(1000) + 0.75 * math.log(0.5)))
    # A slow point above a fast one at higher recall changes nothing.
    assert qps_at_recall(SWEEP + [(0.93, 50.0)], 0.925) == pytest.approx(math.sqrt(500 * 100))


def test_unreachable_is_none():
    assert qps_at_recall(SWEEP, 0.995) is None
    assert qps_at_recall([], 0.9) is None
    assert qps_at_recall([(0.5, 10.0)], 0.9) is None


def test_below_lowest_frontier_point_uses_best_qps_reaching_it():
    pts = [(0.92, 800.0), (0.97, 200.0), (0.93, 700.0)]
    assert qps_at_recall(pts, 0.90) == 800.0
    # The fastest point with recall >= t, even when a slower one has lower recall.
    assert qps_at_recall([(0.95, 900.0), (0.91, 400.0)], 0.90) == 900.0


# --------------------------------------------------------------------------
# Ratios and recall


def test_ratio_vs_best_peer_with_nulls():
    at = {"vectide:hnsw": 300.0, "hnswlib": 200.0, "faiss-hnsw": None, "usearch": 100.0}
    peers = ["hnswlib", "faiss-hnsw", "usearch"]
    r = ratio_vs_best_peer(at, peers)
    assert r["vectide:hnsw"] == pytest.approx(1.5)
    assert r["hnswlib"] == pytest.approx(1.0) and r["usearch"] == pytest.approx(0.5)
    assert r["faiss-hnsw"] is None
    # Engine side null.
    assert ratio_vs_best_peer({"vectide:hnsw": None, "hnswlib": 5.0}, ["hnswlib"])["vectide:hnsw"] is None
    # Peer side null: no peer reaches the target.
    r = ratio_vs_best_peer({"vectide:hnsw": 5.0, "hnswlib": None}, ["hnswlib"])
    assert r == {"vectide:hnsw": None, "hnswlib": None}
    # No peers at all.
    assert ratio_vs_best_peer({"vectide:hnsw": 5.0}, []) == {"vectide:hnsw": None}


def test_recall_at_k():
    truth = np.array([[1, 2, 3, 9], [4, 5, 6, 9]], dtype=np.int32)
    found = [np.array([3, 2, 7], dtype=np.uint64), np.array([4, 4, 2**64 - 1], dtype=np.uint64)]
    # Query 0: {3, 2} of {1, 2, 3}; query 1: {4} once (duplicates and MISSING_ID ignored).
    assert recall_at_k(found, truth, 3) == pytest.approx((2 / 3 + 1 / 3) / 2)
    assert recall_at_k([np.array([1, 2, 3]), np.array([6, 5, 4])], truth, 3) == 1.0
    assert recall_at_k([np.array([], dtype=np.int64), np.array([5])], truth, 3) == pytest.approx(1 / 6)


def test_recall_matches_a_brute_force_reference():
    pytest.importorskip("vectide._vectide")
    rng = np.random.default_rng(5)
    for _ in range(50):
        k, nq = int(rng.integers(1, 12)), int(rng.integers(1, 20))
        truth = np.stack([rng.permutation(50)[:k + 2] for _ in range(nq)]).astype(np.int32)
        found = []
        for _ in range(nq):
            row = rng.integers(-1, 50, size=int(rng.integers(0, k + 3)))
            found.append(row.astype(np.int64) if rng.random() < 0.5 else row.astype(np.int64).astype(np.uint64))
        want = sum(len(set(truth[i, :k].tolist()) & {int(x) for x in found[i][:k].astype(np.int64) if x >= 0})
                   for i in range(nq)) / (nq * k)
        assert recall_at_k(found, truth, k) == pytest.approx(want, abs=1e-12)
    with pytest.raises(ValueError):
        recall_at_k([np.array([1])], np.array([[1, 2]]), 3)  # truth shorter than k
    with pytest.raises(ValueError):
        recall_at_k([np.array([1])] * 2, np.array([[1, 2]]), 1)  # row counts differ


def test_recall_targets_are_the_native_ones():
    native = pytest.importorskip("vectide._vectide")
    from vectide.bench.metrics import RECALL_TARGETS

    assert tuple(native.RECALL_TARGETS) == RECALL_TARGETS


def test_engine_registry():
    known = ("vectide:hnsw, vectide:fresh-vamana, hnswlib, faiss-hnsw, usearch, diskann, svs, glass, scann, vsag, "
             "symqg, rabitq-hnsw, rabitq-ivf, faiss-ivf-rabitq, faiss-ivf-pqfs")
    with pytest.raises(ValueError, match=f"known engines: {known}"):
        make_engine("annoy")
    # Each engine names the knob a sweep varies; building is not needed for that.
    assert [make_engine(n).knob for n in ("diskann", "svs", "glass", "scann", "vsag")] == [
        "L", "L", "ef", "leaves_to_search", "ef"]
    assert [make_engine(n).knob for _, n in RABITQ_PEERS] == ["ef", "ef", "nprobe", "nprobe", "nprobe"]
    assert make_engine("vectide:flat").name == "vectide:flat"
    assert not is_peer("vectide:hnsw") and is_peer("hnswlib")


def test_a_vectide_engine_variant_builds_with_its_parameters():
    pytest.importorskip("vectide._vectide")
    import numpy as np

    e = make_engine("vectide:hnsw@quantization=rabitq1@m=8")
    assert e.name == "vectide:hnsw@quantization=rabitq1@m=8" and e.knob == "ef"
    rng = np.random.default_rng(0)
    train = rng.standard_normal((500, 64)).astype(np.float32)
    e.build(train, "l2", 16, 64, 1)
    # The variant wins over the run's m; its quantization is on.
    assert e.params["index_params"]["quantization"] == "rabitq1" and e.params["index_params"]["m"] == 8
    e.set_ef(64)
    assert len(e.query(train[3], 5)) == 5
    e.close()
    for bad, msg in [("vectide:hnsw@quantization", "expected ENGINE@key=value"),
                     ("vectide:hnsw@nope=1", "has no parameter 'nope'"),
                     ("vectide:hnsw@m=x", "is not of type integer"),
                     ("vectide:hnsw@m=8@m=9", "sets 'm' twice")]:
        with pytest.raises(ValueError, match=msg):
            make_engine(bad)


def test_unknown_engine_cli(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("VECTIDE_DATA", str(tmp_path))
    assert main(["ann", "--dataset", DATASET, "--engines", "hnswlib,nope"]) == 2
    assert "unknown engine 'nope'" in capsys.readouterr().err


# --------------------------------------------------------------------------
# End to end


def _knob(name):
    """The knob a sweep varies for an engine of the harness: a native
    engine's primary knob from the registry, the adapter's for the peers."""
    if not name.startswith("vectide:"):
        return make_engine(name).knob
    import vectide

    return next(e["primary_knob"] for e in vectide.engines() if e["name"] == name.split(":", 1)[1])


def _check_result(doc, engines, k=10, efs=(10, 32), dataset=DATASET, n_train=20_000):
    """The JSON contract of an ANN result, for the Python harness and the
    native `vectide bench` alike (run with ``--ef 10,32 --max-queries 100``,
    or the ``efs`` given, on ``dataset`` of ``n_train`` rows)."""
    for key in ("dataset", "k", "threads", "engines", "summary", "machine", "date", "n_train", "n_queries"):
        assert key in doc, key
    assert doc["dataset"] == dataset and doc["k"] == k and doc["threads"] == 1
    assert doc["n_train"] == n_train and doc["n_queries"] == 100
    assert doc["machine"]["cores"] >= 1
    assert set(doc["engines"]) == set(engines)
    for name, e in doc["engines"].items():
        assert set(e) >= {"build_s", "memory_bytes", "params", "sweep", "qps_at_recall"}
        assert e["build_s"] > 0 and isinstance(e["memory_bytes"], int)
        assert e["params"]["m"] == 16 and e["params"]["threads"] == 1
        if _knob(name) is None:  # exact: measured once, no knob
            assert [p["search_params"] for p in e["sweep"]] == [{}], name
            assert e["sweep"][0]["recall"] == pytest.approx(1.0)
        elif _knob(name) == "ef":
            assert [p["search_params"]["ef"] for p in e["sweep"]] == list(efs)
            assert [p["search_params"]["ef_effective"] for p in e["sweep"]] == list(efs)
        else:  # L, leaves_to_search, nprobe: the value searched with (at most the leaves there are)
            assert [p["search_params"][_knob(name)] for p in e["sweep"]] == list(efs), name
        for p in e["sweep"]:
            assert set(p) >= {"search_params", "recall", "qps"}
            assert 0.0 <= p["recall"] <= 1.0 and p["qps"] > 0
        assert e["sweep"][-1]["recall"] >= 0.9, name
        assert set(e["qps_at_recall"]) == {"0.9", "0.95", "0.99"}
        # The last sweep point reaches 0.9, so QPS at 0.9 is a number.
        assert e["qps_at_recall"]["0.9"] > 0, name
        for v in e["qps_at_recall"].values():
            assert v is None or v > 0
    # Each ratio is the engine's QPS over the best peer's, recomputed here.
    peers = doc["summary"]["peers"]
    for key in ("0.9", "0.95"):
        ratios = doc["summary"][f"ratio_vs_best_peer_at_{key}"]
        assert set(ratios) == set(engines)
        at = {n: e["qps_at_recall"][key] for n, e in doc["engines"].items()}
        best = max((at[p] for p in peers if at[p] is not None), default=None)
        for name, v in ratios.items():
            want = None if at[name] is None or best is None else at[name] / best
            assert v == pytest.approx(want), (key, name)


def test_end_to_end_peers(data_root, monkeypatch, tmp_path, capsys):
    pytest.importorskip("hnswlib")
    pytest.importorskip("faiss")
    monkeypatch.setenv("VECTIDE_DATA", str(data_root))
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    rc = main([
        "ann", "--dataset", DATASET, "--engines", "hnswlib,faiss-hnsw", "--k", "10", "--threads", "1",
        "--ef", "10,32", "--max-queries", "100", "--runs", "2", "--ef-construction", "100",
        "--out", str(out), "--plot", str(png),
    ])
    assert rc == 0
    doc = json.loads(out.read_text())
    _check_result(doc, ["hnswlib", "faiss-hnsw"])
    assert doc["summary"]["ratio_vs_best_peer_at_0.9"]["hnswlib"] is not None
    assert max(v for v in doc["summary"]["ratio_vs_best_peer_at_0.95"].values() if v is not None) == pytest.approx(1.0)
    assert png.stat().st_size > 1000 and png.read_bytes()[:4] == b"\x89PNG"
    table = capsys.readouterr().out
    assert "hnswlib" in table and "faiss-hnsw" in table and "QPS@0.95" in table


#: The peers measured as the fastest installable libraries (import name,
#: engine); each test of them skips when its package is missing.
FAST_PEERS = [("diskannpy", "diskann"), ("svs", "svs"), ("glass", "glass"), ("scann", "scann"), ("pyvsag", "vsag")]


@pytest.mark.parametrize("rows", [
    # The fast version: the first 4,000 rows (an HDF5 slice); the full 20k set is slow.
    pytest.param(4000, id="slice"),
    pytest.param(20_000, id="full", marks=pytest.mark.slow),
])
def test_end_to_end_fast_peers(data_root, bench_slice, monkeypatch, tmp_path, rows):
    # The Vamana engines side by side with the peers configured as their
    # authors recommend: every one reaches recall 0.9 at the largest knob
    # value and its params name its configuration.
    pytest.importorskip("vectide._vectide")
    for module, _ in FAST_PEERS:
        pytest.importorskip(module)
    engines = ["vectide:fresh-vamana"] + [name for _, name in FAST_PEERS]
    monkeypatch.setenv("VECTIDE_DATA", str(data_root))
    dataset = DATASET if rows == 20_000 else str(bench_slice(rows, 100))
    ds_name = Path(dataset).stem
    import tempfile

    scratch = tmp_path / "scratch"  # where DiskANN writes its index directory
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    out = tmp_path / "fast.json"
    rc = main([
        "ann", "--dataset", dataset, "--engines", ",".join(engines), "--k", "10", "--threads", "1",
        "--ef", "10,32", "--max-queries", "100", "--runs", "1", "--out", str(out),
    ])
    assert rc == 0
    doc = json.loads(out.read_text())
    _check_result(doc, engines, dataset=ds_name, n_train=rows)
    assert doc["summary"]["peers"] == engines[1:]
    e = {name: doc["engines"][name]["params"] for name in engines}
    # The Vamana engines share R, L_build and alpha (FreshDiskANN §6.2).
    fv = e["vectide:fresh-vamana"]["index_params"]
    assert (fv["r"], fv["l_build"]) == (64, 75) and fv["alpha"] == pytest.approx(1.2)
    assert e["vectide:fresh-vamana"]["ignores"] == ["m", "ef_construction"]
    d = e["diskann"]["index_params"]
    assert (d["graph_degree"], d["complexity"], d["alpha"], d["distance_metric"]) == (64, 75, 1.2, "l2")
    s = e["svs"]["index_params"]
    assert (s["graph_max_degree"], s["window_size"], s["alpha"]) == (64, 75, 1.2)
    assert s["distance"] == "L2 over unit vectors"
    g = e["glass"]["index_params"]
    assert (g["index_type"], g["R"], g["L"], g["build_quant"], g["search_quant"], g["refine_quant"]) == (
        "HNSW", 48, 200, "SQ8U", "SQ8U", "FP16")
    sc = e["scann"]["index_params"]
    assert (sc["num_leaves"], sc["dimensions_per_block"], sc["anisotropic_quantization_threshold"], sc["reorder"]) == (
        round(math.sqrt(rows)), 2, 0.2, 100)  # 141 for 20,000 rows
    assert doc["engines"]["scann"]["sweep"][0]["search_params"] == {
        "leaves_to_search": 10, "pre_reorder_num_neighbors": 100}
    v = e["vsag"]["index_params"]
    assert v["index"] == "hgraph" and v["index_param"]["base_quantization_type"] == "sq8"
    assert v["index_param"]["use_reorder"] is True and v["metric_type"] == "ip"
    for name in engines[1:]:
        assert e[name]["version"] and e[name]["config_source"] and e[name]["search"], name
        assert e[name]["ignores"] == ["m", "ef_construction"], name
    # DiskANN's index directory is gone once the run is over.
    assert list(scratch.iterdir()) == []


def test_missing_peer_package_names_the_pip_package(monkeypatch):
    import sys

    pips = {"diskann": "diskannpy-rust", "svs": "scalable-vs", "glass": "pyglass-portable", "scann": "scann",
            "vsag": "pyvsag"}
    for module, name in FAST_PEERS:
        monkeypatch.setitem(sys.modules, module, None)  # the import fails as if not installed
        with pytest.raises(RuntimeError, match=f"pip install {pips[name]}$"):
            make_engine(name).check()


#: RaBitQ-Library's indexes (PyPI rabitqlib) and faiss's IVF FastScan
#: indexes with exact re-ranking: (import name, engine).
RABITQ_PEERS = [("rabitqlib", "symqg"), ("rabitqlib", "rabitq-hnsw"), ("rabitqlib", "rabitq-ivf"),
                ("faiss", "faiss-ivf-rabitq"), ("faiss", "faiss-ivf-pqfs")]


@pytest.mark.parametrize("rows", [
    # The fast version: the first 4,000 rows (an HDF5 slice), knob values
    # 10 and 64 (its IVF indexes have 102 lists); the full 20k set is slow.
    pytest.param(4000, id="slice"),
    pytest.param(20_000, id="full", marks=pytest.mark.slow),
])
@pytest.mark.parametrize("module,name", RABITQ_PEERS, ids=[n for _, n in RABITQ_PEERS])
def test_end_to_end_rabitq_and_fastscan_peers(module, name, rows, data_root, bench_slice, monkeypatch, tmp_path):
    # One peer per run: it reaches recall 0.95 at its largest knob value on the
    # 32-d clustered set (cosine), zero-padded to 64 dimensions for rabitqlib,
    # and its params name its configuration and where it comes from.
    pytest.importorskip("vectide._vectide")
    pytest.importorskip(module)
    monkeypatch.setenv("VECTIDE_DATA", str(data_root))
    dataset = DATASET if rows == 20_000 else str(bench_slice(rows, 100))
    top = 128 if rows == 20_000 else 64
    nlist = min(round(4 * math.sqrt(rows)), rows // 39)  # 512 for 20,000 rows, 102 for 4,000
    out = tmp_path / "r.json"
    rc = main([
        "ann", "--dataset", dataset, "--engines", name, "--k", "10", "--threads", "1", "--ef", f"10,{top}",
        "--max-queries", "100", "--runs", "1", "--ef-construction", "100", "--out", str(out),
    ])
    assert rc == 0
    doc = json.loads(out.read_text())
    _check_result(doc, [name], efs=(10, top), dataset=Path(dataset).stem, n_train=rows)
    e = doc["engines"][name]
    assert e["sweep"][-1]["recall"] >= 0.95, e["sweep"]
    p, ip = e["params"], e["params"]["index_params"]
    assert p["version"] and p["config_source"] and p["search"], p
    assert p["metric"] == "cosine"
    if module == "rabitqlib":
        assert (p["input_dim"], p["padded_dim"]) == (32, 64) and p["padding"].startswith("zeros appended")
        assert ip["metric"] == "ip"  # inner product over unit vectors
    else:
        assert "padded_dim" not in p and ip["faiss_metric"] == "INNER_PRODUCT"
    search = [pt["search_params"] for pt in e["sweep"]]
    if name == "symqg":
        assert (ip["max_degree"], ip["ef_construction"], ip["init"], ip["quantization_bits"]) == (32, 200, "pipnn", 0)
        assert p["ignores"] == ["m", "ef_construction"]
    elif name == "rabitq-hnsw":  # an HNSW: the harness's M and efConstruction
        assert (ip["M"], ip["ef_construction"], ip["nbits"], ip["num_clusters"]) == (16, 100, 9, 16)
        assert "ignores" not in p
    elif name == "rabitq-ivf":  # min(round(4 sqrt(n)), n // 39) lists
        assert (ip["nbits"], ip["num_clusters"]) == (32, nlist) and ip["kmeans"].startswith("QGKMeans")
        assert search == [{"nprobe": 10}, {"nprobe": top}]
    else:
        want = {"faiss-ivf-rabitq": f"RR32,IVF{nlist},RaBitQfs,RFlat", "faiss-ivf-pqfs": f"IVF{nlist},PQ16x4fs,RFlat"}
        assert ip["index_factory"] == want[name] and ip["nlist"] == nlist
        assert search == [{"nprobe": 10, "refine_candidates": 100}, {"nprobe": top, "refine_candidates": 4 * top}]
        assert p["ignores"] == ["m", "ef_construction"]


def test_rabitq_peers_zero_pad_below_64_dimensions():
    # rabitqlib's rotator refuses fewer than 64 dimensions ("Unsupported
    # dimension for FhtKacRotator"): the adapters append zeros to the vectors
    # and to the queries, which changes no distance, so the results match
    # brute force on the original vectors.
    rabitqlib = pytest.importorskip("rabitqlib")
    rng = np.random.default_rng(7)
    x = rng.standard_normal((600, 20)).astype(np.float32)
    q = rng.standard_normal((20, 20)).astype(np.float32)
    with pytest.raises(ValueError, match="FhtKacRotator"):
        rabitqlib.IvfIndex(dim=20, max_elements=600, num_clusters=4, nbits=32)
    for metric in ("l2", "cosine"):
        xm = x if metric == "l2" else x / np.linalg.norm(x, axis=1, keepdims=True)
        qm = q if metric == "l2" else q / np.linalg.norm(q, axis=1, keepdims=True)
        truth = np.argsort(((qm[:, None, :] - xm[None, :, :]) ** 2).sum(-1), axis=1)[:, :10]
        for name in ("symqg", "rabitq-hnsw", "rabitq-ivf"):
            eng = make_engine(name)
            eng.build(x, metric, 16, 64, 1)
            assert (eng.params["input_dim"], eng.params["padded_dim"], eng.index.dim) == (20, 64, 64), name
            pq = eng.prepare_queries(q)
            assert pq.shape == (20, 1, 64) and not pq[:, 0, 20:].any(), name
            np.testing.assert_allclose(pq[:, 0, :20], qm, rtol=1e-6, atol=1e-6)
            eng.set_ef(200)
            found = [eng.query(pq[i], 10) for i in range(len(q))]
            assert recall_at_k(found, truth, 10) >= 0.95, (name, metric)
            assert eng.index_bytes() > 600 * 64 // 8, name  # the serialised index
            eng.close()
    # 64 dimensions or more: no padding (rabitqlib pads internally above 64).
    eng = make_engine("rabitq-ivf")
    eng.build(rng.standard_normal((600, 72)).astype(np.float32), "l2", 16, 64, 1)
    assert (eng.params["padded_dim"], eng.params["padding"]) == (72, "none")
    assert eng.params["index_params"]["kmeans"].startswith("RaBitQKMeans")  # 15 lists: flat k-means


def test_faiss_ivf_peers_on_small_data():
    # Odd dimension: PQ with one dimension per sub-quantizer; the refine
    # stage keeps float32 vectors, so the serialised index holds at least them.
    pytest.importorskip("faiss")
    rng = np.random.default_rng(8)
    x = rng.standard_normal((800, 25)).astype(np.float32)
    q = rng.standard_normal((20, 25)).astype(np.float32)
    truth = np.argsort(((q[:, None, :] - x[None, :, :]) ** 2).sum(-1), axis=1)[:, :10]
    for name, spec in (("faiss-ivf-rabitq", "RR25,IVF20,RaBitQfs,RFlat"), ("faiss-ivf-pqfs", "IVF20,PQ25x4fs,RFlat")):
        eng = make_engine(name)
        eng.build(x, "l2", 16, 64, 1)
        assert eng.params["index_params"]["index_factory"] == spec  # 800 // 39 lists
        assert eng.search_params(512) == {"nprobe": 20, "refine_candidates": 2048}
        eng.set_ef(512)  # every list, re-ranking all the candidates: exact
        pq = eng.prepare_queries(q)
        assert recall_at_k([eng.query(pq[i], 10) for i in range(len(q))], truth, 10) == 1.0, name
        assert eng.index_bytes() >= 800 * 25 * 4, name
        eng.close()
    assert make_engine("hnswlib").index_bytes() is None


def test_missing_rabitqlib_or_faiss_names_the_pip_package(monkeypatch):
    import sys

    pips = {"rabitqlib": "rabitqlib", "faiss": "faiss-cpu"}
    for module, name in RABITQ_PEERS:
        monkeypatch.setitem(sys.modules, module, None)  # the import fails as if not installed
        with pytest.raises(RuntimeError, match=f"pip install {pips[module]}$"):
            make_engine(name).check()


def test_end_to_end_vectide(data_root, monkeypatch, tmp_path):
    pytest.importorskip("vectide._vectide")
    pytest.importorskip("hnswlib")
    monkeypatch.setenv("VECTIDE_DATA", str(data_root))
    out = tmp_path / "v.json"
    rc = main([
        "ann", "--dataset", DATASET, "--engines", "vectide:hnsw,hnswlib", "--ef", "10,32",
        "--max-queries", "100", "--runs", "1", "--ef-construction", "100", "--out", str(out),
    ])
    assert rc == 0
    doc = json.loads(out.read_text())
    _check_result(doc, ["vectide:hnsw", "hnswlib"])
    assert doc["summary"]["ratio_vs_best_peer_at_0.9"]["hnswlib"] is not None
    assert doc["engines"]["vectide:hnsw"].get("reported_memory_bytes", 1) > 0
    assert doc["summary"]["peers"] == ["hnswlib"]
    # The figures of record per engine, in the summary: QPS at each target,
    # build time and memory per vector (RSS growth / N; the index's own).
    n = doc["n_train"]
    for name in ("vectide:hnsw", "hnswlib"):
        e = doc["engines"][name]
        assert doc["summary"]["qps_at_recall"][name] == e["qps_at_recall"]
        assert doc["summary"]["build_s"][name] == e["build_s"]
        assert doc["summary"]["memory_bytes_per_vector"][name] == pytest.approx(e["memory_bytes"] / n)
    hnsw = doc["engines"]["vectide:hnsw"]
    assert doc["summary"]["reported_bytes_per_vector"]["vectide:hnsw"] == pytest.approx(
        hnsw["reported_memory_bytes"] / n)
    assert doc["summary"]["reported_bytes_per_vector"]["hnswlib"] is None
    assert doc["summary"]["simd"] == doc["machine"]["simd"]


def test_an_engine_without_a_knob_is_measured_once(data_root, monkeypatch, tmp_path):
    pytest.importorskip("vectide._vectide")
    monkeypatch.setenv("VECTIDE_DATA", str(data_root))
    out = tmp_path / "f.json"
    rc = main([
        "ann", "--dataset", DATASET, "--engines", "vectide:flat,vectide:hnsw", "--ef", "10,32",
        "--max-queries", "100", "--runs", "1", "--ef-construction", "100", "--out", str(out),
    ])
    assert rc == 0
    doc = json.loads(out.read_text())
    flat = doc["engines"]["vectide:flat"]
    assert len(flat["sweep"]) == 1 and flat["sweep"][0]["search_params"] == {}
    assert flat["sweep"][0]["recall"] == pytest.approx(1.0)
    assert "m" not in flat["params"].get("index_params", {})
    assert len(doc["engines"]["vectide:hnsw"]["sweep"]) == 2


def test_native_bench_passes_the_same_shape_check(data_root, tmp_path):
    # `vectide bench` (Rust) writes the harness's JSON shape: the same check
    # as the Python runs above, an exact engine measured once included.
    pytest.importorskip("vectide._vectide")
    import os
    import subprocess
    import sys

    from test_cli import _cli

    out = tmp_path / "native.json"
    env = {**os.environ, "VECTIDE_DATA": str(data_root), "VECTIDE_PYTHON": sys.executable}
    r = subprocess.run(
        [_cli(), "bench", "--dataset", DATASET, "--engines", "vectide:hnsw,vectide:flat", "--ef", "10,32",
         "--max-queries", "100", "--runs", "2", "--threads", "1", "--ef-construction", "100", "--out", str(out)],
        capture_output=True, text=True, env=env,
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    _check_result(doc, ["vectide:hnsw", "vectide:flat"])
    assert doc["summary"]["peers"] == []
    assert len(doc["engines"]["vectide:hnsw"]["sweep"][0]["qps_runs"]) == 2
    assert doc["engines"]["vectide:hnsw"]["params"]["index_params"]["m"] == 16
    assert "m" not in doc["engines"]["vectide:flat"]["params"]["index_params"]


def test_plot_and_table_of_a_native_result(tmp_path, capsys):
    # The shape `vectide bench` (Rust) writes: no peers, null ratios, fewer extras.
    doc = {
        "dataset": DATASET, "k": 10, "threads": 1, "n_train": 20000, "n_queries": 500,
        "query_loop": "native (vectide bench)",
        "engines": {"vectide:hnsw": {
            "build_s": 1.5, "memory_bytes": 7_000_000, "params": {"m": 16},
            "sweep": [{"search_params": {"ef": 10}, "recall": 0.88, "qps": 9e4},
                      {"search_params": {"ef": 32}, "recall": 0.98, "qps": 5e4}],
            "qps_at_recall": {"0.9": 8.1e4, "0.95": 6.2e4, "0.99": None},
        }},
        "summary": {"ratio_vs_best_peer_at_0.95": {"vectide:hnsw": None}},
    }
    js, png = tmp_path / "n.json", tmp_path / "n.png"
    js.write_text(json.dumps(doc))
    assert main(["plot", str(js), str(png)]) == 0
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert main(["table", str(js)]) == 0
    out = capsys.readouterr().out
    assert "vectide:hnsw" in out and "62000" in out


def test_churn_reclaims_slots_and_keeps_recall(tmp_path, monkeypatch):
    pytest.importorskip("vectide._vectide")
    from vectide.bench import churn

    monkeypatch.setenv("VECTIDE_DATA", str(tmp_path / "data"))
    out = tmp_path / "churn.json"
    code = churn.main(
        # One build thread: the graph, and so every recall below, is the
        # same in every run (with parallel inserts it differed run to run).
        ["--dataset", "clustered-20k-32-angular", "--rounds", "3", "--max-queries", "300",
         "--runs", "1", "--m", "8", "--ef-construction", "64", "--threads", "1", "--out", str(out)]
    )
    import json

    rep = json.loads(out.read_text())
    assert len(rep["rounds"]) == 4
    s = rep["summary"]
    # Deleted space is reclaimed and reused: slots never exceed 1.1x live.
    assert s["slots_per_live_max"] <= 1.1
    assert all(r["live"] == 20000 for r in rep["rounds"])
    assert s["recall_round0"] >= 0.9 and s["recall_drop_points"] <= 3
    assert s["checks"]["reload_identical"]
    # The exit code reflects the checks (QPS on a tiny set is noisy, so only
    # its consistency with the report is asserted).
    assert code == (0 if all(s["checks"].values()) else 1)


#: The P-HNSW benchmark's fast version (smaller graphs, sizes, msync run
#: and crash test; its scratch directories on tmpfs) and the slow one.
PHNSW_RUNS = {
    "small": dict(sizes=(500, 1000), crash_points=10, kill_rounds=1, args=[
        "--m", "8", "--ef-construction", "32", "--queries", "50", "--msync-rows", "100", "--crash-points", "10",
        "--kill-rounds", "1", "--kill-after", "0.05", "--snapshot-every", "300"]),
    "full": dict(sizes=(1500, 3000), crash_points=20, kill_rounds=2, args=[
        "--queries", "100", "--msync-rows", "300", "--crash-points", "20", "--kill-rounds", "2",
        "--kill-after", "0.1", "--snapshot-every", "1000"]),
}


@pytest.mark.parametrize("size", ["small", pytest.param("full", marks=pytest.mark.slow)])
def test_phnsw_benchmark_small_run(tmp_path, shm_path, data_root, monkeypatch, size):
    pytest.importorskip("vectide._vectide")
    pytest.importorskip("hnswlib")
    from vectide.bench import phnsw

    run = PHNSW_RUNS[size]
    # The full version prepares its own copy of the dataset on disk; the
    # small one reads the session's copy and keeps its scratch on tmpfs.
    monkeypatch.setenv("VECTIDE_DATA", str(tmp_path / "data" if size == "full" else shm_path))
    dataset = DATASET if size == "full" else str(data_root / f"{DATASET}.hdf5")
    out = tmp_path / "ph.json"
    code = phnsw.main(
        ["--dataset", dataset, "--sizes", ",".join(map(str, run["sizes"])), "--threads", "1", "--runs", "1",
         "--msync-workers", "2", *run["args"], "--out", str(out), "--plot", str(tmp_path / "plots")]
    )
    r = json.loads(out.read_text())
    assert code == 0
    assert r["dataset"] == DATASET
    s = r["summary"]
    for key in ("insert_overhead_vs_hnsw", "recovery_speedup_vs_snap", "search_qps_ratio_vs_hnsw",
                "msync_insert_ratio_vs_wal", "hnsw_build_ratio_vs_hnswlib"):
        assert isinstance(s[key], float) and s[key] > 0, key
    small, big = (str(n) for n in run["sizes"])
    assert set(s["recovery_ms_by_n"]) == {small, big}
    assert s["crash_points_checked"] == run["crash_points"] and s["violations"] == 0
    assert s["kill_rounds"] == 2 * run["kill_rounds"]
    # The SIGKILL rounds run on both media.
    assert s["kill_rounds_by_mode"] == {"pmem": run["kill_rounds"], "msync": run["kill_rounds"]}
    assert set(r["build_s"]) == {"hnsw", "p-hnsw", "hnsw-snap", "hnsw-wal", "hnswlib"}
    # Recovery after SIGKILL: every durable engine came back with rows.
    for e in ("p-hnsw", "hnsw-snap", "hnsw-wal"):
        assert r["recovery"][e][big]["live_after"] > 0
    bd = r["breakdown"][big]["1"]
    assert abs(bd["search_share"] + bd["update_share"] + bd["logging_share"] - 1) < 1e-9
    assert "emulated" in r["note"]
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == [
        "fig10_breakdown.png", "fig12_recovery.png", "fig8_insert_time.png", "fig9_insert_throughput.png"]


def test_write_rates_small_run(data_root, bench_slice, monkeypatch, tmp_path):
    """``bench db --parts writes``: every engine that keeps a log of its own
    (found through the registry) runs with one log and with both; the
    summary holds the medians and the ratios to hnsw at each thread count."""
    pytest.importorskip("vectide._vectide")
    monkeypatch.setenv("VECTIDE_DATA", str(data_root))
    out = tmp_path / "w.json"
    rc = main([
        "db", "--dataset", str(bench_slice(2000, 10)), "--parts", "writes", "--write-engines", "hnsw,fresh-diskann",
        "--write-clients", "1,2", "--write-seconds", "0.3", "--write-reps", "2", "--out", str(out),
    ])
    assert rc == 0
    doc = json.loads(out.read_text())
    w = doc["write_rates"]
    assert set(w["runs"]) == {"hnsw", "fresh-diskann", "fresh-diskann (own log too)"}
    for label, per in w["runs"].items():
        assert set(per) == {"1", "2"}
        for c, rates in per.items():
            assert len(rates) == 2 and all(r > 0 for r in rates), (label, c, rates)
            assert w["median_points_per_s"][label][c] == pytest.approx(float(np.median(rates)))
    assert doc["summary"]["write_ratio_to_hnsw"]["hnsw"] == {"1": 1.0, "2": 1.0}
    r = doc["summary"]["write_ratio_to_hnsw"]["fresh-diskann"]["2"]
    assert r == pytest.approx(w["median_points_per_s"]["fresh-diskann"]["2"] / w["median_points_per_s"]["hnsw"]["2"])


def test_payload_upserts_small_run(data_root, bench_slice, monkeypatch, tmp_path):
    """``bench db --parts payloads``: batches of 100 points with payloads of
    about 1 KB; the summary holds the best rate."""
    pytest.importorskip("vectide._vectide")
    from vectide.bench.db import payload_of

    monkeypatch.setenv("VECTIDE_DATA", str(data_root))
    out = tmp_path / "p.json"
    rc = main(["db", "--dataset", str(bench_slice(2000, 10)), "--parts", "payloads", "--payload-points", "300",
               "--payload-reps", "2", "--out", str(out)])
    assert rc == 0
    doc = json.loads(out.read_text())
    p = doc["payload_upserts"]
    assert p["points"] == 300 and p["batch"] == 100 and len(p["runs_points_per_s"]) == 2
    assert 900 <= p["payload_bytes_mean"] <= 1200, p
    assert doc["summary"]["payload_batch100_points_per_s"] == max(p["runs_points_per_s"]) > 0
    assert payload_of(1) != payload_of(2)
