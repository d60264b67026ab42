"""Conformance with Qdrant's semantics (``vectide.conformance``): seeded
random scenarios through the same qdrant-client calls against ``vectide
serve`` and against qdrant-client's local mode, answer for answer. The fast
set runs a few hundred scenarios; ``make test-all`` runs 1,000 more."""

from __future__ import annotations

import json
import os

import pytest

vectide = pytest.importorskip("vectide._vectide") and __import__("vectide")
pytest.importorskip("qdrant_client")

from vectide import conformance  # noqa: E402


def _run(tmp_path, scenarios: int, seed: int):
    from test_server import Server

    s = Server(tmp_path / "db").start()
    try:
        out = tmp_path / "conformance.json"
        report = conformance.run(s.url, scenarios, seed=seed, out=str(out), progress=False)
    finally:
        s.stop()
    return report, json.loads(out.read_text())


def _check(report, written, scenarios):
    assert written == report
    s = report["summary"]
    assert report["failures"] == [], report["failures"]
    assert s["unexplained_differences"] == 0
    assert s["scenarios"] == scenarios
    assert s["operations"] >= 20 * scenarios and s["checks"] >= 10 * scenarios
    # Every feature class appeared.
    missing = [f for f, n in s["per_feature"].items() if n == 0]
    assert not missing, missing
    if os.environ.get("VECTIDE_RESULTS"):
        with open(os.path.join(os.environ["VECTIDE_RESULTS"], f"conformance-{scenarios}.json"), "w") as fh:
            json.dump(report, fh, indent=1)


@pytest.mark.parametrize("scenarios,seed", [
    pytest.param(250, 1, id="fast"),
    pytest.param(1000, 2, id="full", marks=pytest.mark.slow),
])
def test_vectide_answers_as_qdrant_local_mode(tmp_path, scenarios, seed):
    report, written = _run(tmp_path, scenarios, seed)
    _check(report, written, scenarios)


def test_a_difference_is_caught(tmp_path, monkeypatch):
    """The comparison can fail: a reference whose RRF constant differs from
    Qdrant's is told apart from the server within a few scenarios."""
    from qdrant_client.hybrid import fusion

    real = fusion.reciprocal_rank_fusion
    monkeypatch.setattr(
        "qdrant_client.local.local_collection.reciprocal_rank_fusion",
        lambda responses, limit=10, ranking_constant_k=None, weights=None: real(responses, limit, 5, weights),
    )
    report, _ = _run(tmp_path, 60, 3)
    assert report["summary"]["unexplained_differences"] == 1
    assert "rrf" in report["failures"][0]["error"]
