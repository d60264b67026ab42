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
    subprocess.run(
        [_cli(), "bench", "--dataset", "clustered-20k-32-angular", "--engines", "vectide:hnsw",
         "--ef", "10,64", "--runs", "1", "--max-queries", "200", "--threads", "2",
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
