"""The engine registry as Python sees it: `vectide.engines()`, search knobs
checked against the engine's, and errors naming what is known."""

from __future__ import annotations

import numpy as np
import pytest

vectide = pytest.importorskip("vectide._vectide") and __import__("vectide")


def test_engines_lists_every_engine_with_its_schema():
    engines = {e["name"]: e for e in vectide.engines()}
    assert vectide.DEFAULT_ENGINE in engines
    assert {"hnsw", "p-hnsw", "hnsw-snap", "hnsw-wal"} <= set(engines)
    for e in engines.values():
        assert e["summary"] and e["persistence"]
        names = [p["name"] for p in e["params"]]
        assert "threads" in names and len(names) == len(set(names))
        assert ("path" in names) == e["in_directory"]
        for p in e["params"]:
            assert p["type"] and p["doc"] and p["source"], (e["name"], p)
        assert e["primary_knob"] is None or e["primary_knob"] in e["knobs"]
    h = engines["hnsw"]
    assert h["knobs"] == ["ef"] and h["primary_knob"] == "ef" and not h["in_directory"]
    m = next(p for p in h["params"] if p["name"] == "m")
    assert m["type"] == "integer 2..=256" and m["default"] == "16"
    assert engines["p-hnsw"]["persistence"] == "durable on acknowledgement"


def test_search_knobs_are_checked_against_the_engine():
    rng = np.random.default_rng(3)
    X = rng.standard_normal((300, 8)).astype(np.float32)
    idx = vectide.Index(8, "l2", m=8)
    idx.add(np.arange(300), X)
    ids, _ = idx.search(X[:5], k=3, ef=40)
    assert (ids[:, 0] == np.arange(5)).all()
    with pytest.raises(ValueError, match=r'unknown search knob "nprobe" for engine "hnsw"; it takes: ef'):
        idx.search(X[:1], k=3, nprobe=4)
    with pytest.raises(ValueError, match="ef"):
        idx.search(X[:1], k=3, ef=0)


def test_unknown_engine_names_the_known_ones(tmp_path):
    with pytest.raises(ValueError, match="known engines: hnsw, p-hnsw"):
        vectide.Index(8, "l2", engine="nope")
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "junk").write_bytes(b"x")
    with pytest.raises(ValueError, match="holds no index of a known engine"):
        vectide.Index.load(tmp_path / "x")
    assert sorted(p.name for p in (tmp_path / "x").iterdir()) == ["junk"]
