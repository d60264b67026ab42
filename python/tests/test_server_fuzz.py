"""Property-based fuzzing of `vectide serve` from its own /openapi.json
(schemathesis): no request may make the server answer 5xx or die."""

from __future__ import annotations

import json
import os
import urllib.request

import pytest

schemathesis = pytest.importorskip("schemathesis")
hypothesis = pytest.importorskip("hypothesis")
vectide = pytest.importorskip("vectide._vectide") and __import__("vectide")

from test_server import Server  # noqa: E402


@pytest.mark.parametrize("examples", [
    # The fast version: a few examples per operation. The full one takes
    # VECTIDE_FUZZ_EXAMPLES (default 60).
    pytest.param(8, id="small"),
    pytest.param(int(os.environ.get("VECTIDE_FUZZ_EXAMPLES", "60")), id="full", marks=pytest.mark.slow),
])
def test_openapi_fuzz_never_crashes_the_server(tmp_path, examples):
    s = Server(tmp_path / "db").start()
    try:
        c = vectide.Client(s.url)
        col = c.create_collection("fz", dim=3, metric="cosine")
        col.upsert([1, 2, 3], [[1, 0, 0], [0, 1, 0], [0, 0, 1]], payloads=[{"a": 1}, {"a": "x"}, None])
        schema = schemathesis.openapi.from_url(s.url + "/openapi.json")
        operations = [op.ok() for op in schema.get_all_operations()]
        assert len(operations) >= 15
        seen = {}
        for op in operations:
            strategy = op.as_strategy()

            # derandomize: the same examples every run (a fixed seed per
            # operation), so what is generated does not depend on chance.
            @hypothesis.settings(
                max_examples=examples,
                deadline=None,
                database=None,
                derandomize=True,
                suppress_health_check=list(hypothesis.HealthCheck),
            )
            @hypothesis.given(case=strategy, keep=hypothesis.strategies.booleans())
            def run(case, keep):
                if keep and "name" in (case.path_parameters or {}):
                    # Half the cases hit the existing collection, so that
                    # bodies get past the 404 and are parsed.
                    case.path_parameters["name"] = "fz"
                if case.method == "DELETE":
                    return  # deleting collections is covered elsewhere
                resp = case.call(base_url=s.url)
                seen[(case.method, case.path, resp.status_code)] = seen.get((case.method, case.path, resp.status_code), 0) + 1
                assert resp.status_code < 500, (case.method, case.formatted_path, case.body, resp.text)
                if resp.status_code >= 400:
                    doc = resp.json()
                    assert "error" in doc["status"], doc

            run()
            assert s.proc.poll() is None, "the server died"
        with urllib.request.urlopen(s.url + "/healthz") as r:
            assert r.status == 200
        print(json.dumps({f"{m} {p} {code}": n for (m, p, code), n in sorted(seen.items())}, indent=1))
        assert any(code == 200 for (_, _, code) in seen), "some fuzzed requests succeeded"
        assert any(400 <= code < 500 for (_, _, code) in seen), "some were rejected"
    finally:
        s.stop()
