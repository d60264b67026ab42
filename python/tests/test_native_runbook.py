"""The native `vectide runbook` on runbooks written by `vectide.runbook`:
a churn run of both streaming engines, and the same refusal as the Python
check (installed into .venv/bin by make)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from vectide import runbook as rbk

DATASET = "clustered-20k-32-angular"
ROWS = 20_000

pytest.importorskip("vectide._vectide")


def _run(data_root, tmp_path, rb, *extra, dataset=DATASET):
    from test_cli import _cli

    path = tmp_path / "runbook.yaml"
    path.write_text(rbk.dump(rb))
    out = tmp_path / "native-runbook.json"
    env = {**os.environ, "VECTIDE_DATA": str(data_root), "VECTIDE_PYTHON": sys.executable}
    r = subprocess.run(
        [_cli(), "runbook", "--dataset", str(dataset), "--runbook", str(path), "--out", str(out), *extra],
        capture_output=True, text=True, env=env, timeout=1800,
    )
    return r, out


@pytest.mark.parametrize("rows,cycles", [
    # The fast version: three churn cycles over the first 4,000 rows (an
    # HDF5 slice, which `--dataset` takes as a path); the slow one ten over 20k.
    pytest.param(4000, 3, id="slice"),
    pytest.param(ROWS, 10, id="full", marks=pytest.mark.slow),
])
def test_native_runbook_runs_a_churn_runbook(data_root, bench_slice, tmp_path, rows, cycles):
    dataset = DATASET if rows == ROWS else bench_slice(rows, 100)
    name = DATASET if rows == ROWS else dataset.stem
    rb = rbk.generate("churn:10", rows, name, cycles=cycles)
    counts = rbk.check(rb, rows)
    r, out = _run(data_root, tmp_path, rb, "--engines", "fresh-vamana,hnsw", "--queries", "100", dataset=dataset)
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    assert doc["benchmark"] == "runbook" and doc["dataset"] == name and doc["k"] == 10
    assert doc["threads"] == {"updates": 2, "searches": 1}
    assert doc["queries_per_search"] == 100 and doc["metric"] == "cosine"
    assert {k: doc["runbook"][k] for k in counts} == counts
    engines = ["vectide:fresh-vamana", "vectide:hnsw"]
    assert set(doc["engines"]) == set(engines)
    for name in engines:
        e = doc["engines"][name]
        assert len(e["steps"]) == len(rb.steps)
        searches = [s for s in e["steps"] if s["operation"] == "search"]
        assert len(searches) == counts["search"], name
        for s in searches:
            assert 0 <= s["recall"] <= 1 and s["qps"] > 0 and s["p99_latency_us"] > 0
        assert e["avg_recall"] >= 0.9, (name, e["avg_recall"])
        assert e["min_recall"] <= e["avg_recall"]
        assert e["seconds"] == pytest.approx(sum(s["seconds"] for s in e["steps"]))
        assert doc["summary"]["avg_recall10"][name] == e["avg_recall"]
        assert doc["summary"]["seconds"][name] == e["seconds"]
        assert e["search_knob"] == {"ef": 100}
        assert e["params"]["threads"] == 2


def test_native_runbook_refuses_what_the_python_check_refuses(data_root, tmp_path):
    rb = rbk.Runbook(DATASET, 1000, [rbk.Step("insert", 0, 1000), rbk.Step("search"), rbk.Step("delete", 500, 1500)])
    with pytest.raises(rbk.RunbookError) as python:
        rbk.check(rb, ROWS)
    r, out = _run(data_root, tmp_path, rb, "--engines", "hnsw")
    assert r.returncode == 2 and not out.exists()
    assert str(python.value) in r.stderr and "step 3" in r.stderr, r.stderr
