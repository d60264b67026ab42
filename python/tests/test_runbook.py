"""Runbooks: the big-ann-benchmarks YAML read and written back, the checks
that refuse a runbook before anything runs, and the generators."""

from __future__ import annotations

import pytest

from vectide import runbook as rbk

BIGANN_STYLE = """
toy-1k:
  max_pts: 600
  1:
    operation: "insert"
    start: 0
    end: 500
  2:
    operation: "search"
  3:
    operation: "delete"
    start: 0
    end: 100
  4:
    operation: "replace"
    tags_start: 100
    tags_end: 150
    ids_start: 800
    ids_end: 850
  5:
    operation: "insert"
    start: 500
    end: 600
  6:
    operation: "search"
  gt_url: "none"
"""


def test_a_big_ann_runbook_round_trips_and_is_checked():
    rb = rbk.loads(BIGANN_STYLE)
    assert rb.dataset == "toy-1k" and rb.max_pts == 600 and len(rb.steps) == 6
    assert rb.steps[3].as_dict() == {"operation": "replace", "tags_start": 100, "tags_end": 150, "ids_start": 800, "ids_end": 850}
    counts = rbk.check(rb, 1000)
    assert counts == {"insert": 2, "delete": 1, "search": 2, "replace": 1, "peak_active": 500}
    again = rbk.loads(rbk.dump(rb))
    assert again == rb


@pytest.mark.parametrize(
    "change, message",
    [
        (('operation: "delete"', 'operation: "compact"'), "step 3: unknown operation 'compact'"),
        (("end: 600", "end: 1001"), "outside 0..1000"),
        (("start: 500\n    end: 600", "start: 400\n    end: 600"), "already active from an earlier insert, first 400"),
        (("start: 0\n    end: 100", "start: 450\n    end: 550"), "never inserted or deleted already, first 500"),
        (("tags_end: 150", "tags_end: 140"), "step 4 \\(replace\\): 40 tags but 50 rows"),
        (("max_pts: 600", "max_pts: 450"), "more than max_pts 450"),
        (("max_pts: 600", "max_pts: 5000"), "max_pts 5000 must be in 1..=1000"),
    ],
)
def test_bad_runbooks_are_refused_naming_the_step(change, message):
    text = BIGANN_STYLE.replace(*change, 1)
    assert text != BIGANN_STYLE
    with pytest.raises(rbk.RunbookError, match=message):
        rbk.check(rbk.loads(text), 1000)


def test_malformed_files_are_refused():
    for text, message in [
        ("[1, 2]", "mapping"),
        ("a:\n  1:\n    operation: search\n", "max_pts is missing"),
        ("a:\n  max_pts: 5\n  2:\n    operation: search\n", "without gaps"),
        ("a:\n  max_pts: 5\n  1:\n    operation: insert\n    start: 0\n", r"missing \['end'\]"),
        ("a:\n  max_pts: 5\n  1:\n    operation: search\n    start: 0\n", "unknown field"),
        ("a:\n  max_pts: 5\nb:\n  max_pts: 5\n", "name one"),
        ("a:\n  max_pts: 5\n  1.5:\n    operation: search\n", "unknown key"),
        ("a:\n  max_pts: 5\n  1:\n    operation: search\n  '1':\n    operation: search\n", "appears twice"),
    ]:
        with pytest.raises(rbk.RunbookError, match=message):
            rbk.loads(text)


@pytest.mark.parametrize("kind", ["sliding-window", "expiration", "churn:5", "churn:50"])
def test_generators_are_deterministic_and_valid(kind):
    a = rbk.generate(kind, n=10_000, dataset="toy", max_pts=2_000, cycles=5, seed=3)
    b = rbk.generate(kind, n=10_000, dataset="toy", max_pts=2_000, cycles=5, seed=3)
    assert rbk.dump(a) == rbk.dump(b)
    counts = rbk.check(rbk.loads(rbk.dump(a)), 10_000)
    assert counts["search"] >= 5 and counts["delete"] >= 1 and counts["peak_active"] <= 2_000
    if kind.startswith("churn"):
        assert counts["peak_active"] == 2_000 and counts["insert"] == 6
    with pytest.raises(rbk.RunbookError, match="unknown generator"):
        rbk.generate("zigzag", n=100, dataset="toy")


def test_hand_built_runbooks_are_checked_too():
    with pytest.raises(rbk.RunbookError, match=r"missing \['end'\]"):
        rbk.check(rbk.Runbook("toy", 10, [rbk.Step("insert", start=0)]), 100)
    with pytest.raises(rbk.RunbookError, match="unknown operation"):
        rbk.check(rbk.Runbook("toy", 10, [rbk.Step("upsert")]), 100)


def test_python_and_the_cli_read_with_one_parser():
    # Python hands the text to the harness core the CLI uses: a hand-built
    # runbook with NumPy integers is checked as its YAML reads, and the
    # counts come from the core.
    import numpy as np

    rb = rbk.Runbook("toy", np.int64(10), [rbk.Step("insert", start=np.int64(0), end=np.int32(5)), rbk.Step("search")])
    assert rbk.check(rb, 100) == {"insert": 1, "delete": 0, "search": 1, "replace": 0, "peak_active": 5}
    back = rbk.loads(rbk.dump(rb).encode())
    assert (back.dataset, back.max_pts, [s.as_dict() for s in back.steps]) == (
        "toy", 10, [{"operation": "insert", "start": 0, "end": 5}, {"operation": "search"}])
    with pytest.raises(rbk.RunbookError, match="max_pts 10 must be in 1..=4"):
        rbk.check(rb, 4)
    with pytest.raises(rbk.RunbookError, match="must be a count"):
        rbk.check(rb, -1)
    # A name that is not a string, and a value that is not an integer.
    assert rbk.check(rbk.Runbook(7, 3, [rbk.Step("insert", start=0, end=3)]), 3)["peak_active"] == 3
    with pytest.raises(rbk.RunbookError, match="must be an integer"):
        rbk.check(rbk.Runbook("toy", 3, [rbk.Step("insert", start=0, end=2.5)]), 3)
    # A file the core refuses (an alias bomb past its node budget) is a
    # RunbookError here too, not a crash.
    bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n"
        for p, c in zip("abcdefgh", "bcdefghi"))
    with pytest.raises(rbk.RunbookError):
        rbk.loads(bomb)


def test_kmeans_is_the_quantization_rooms():
    import numpy as np

    rng = np.random.default_rng(3)
    centres = np.array([[0, 0], [10, 10], [0, 10]], dtype=np.float32)
    x = np.concatenate([c + rng.normal(0, 0.1, size=(50, 2)).astype(np.float32) for c in centres])
    labels = rbk.kmeans(x, 3, seed=1)
    assert labels.shape == (150,) and len(set(labels.tolist())) == 3
    # Each true cluster lands in one label.
    assert all(len(set(labels[i * 50:(i + 1) * 50].tolist())) == 1 for i in range(3))
    with pytest.raises(rbk.RunbookError, match="needs at least 4 rows"):
        rbk.kmeans(x[:3], 4)
