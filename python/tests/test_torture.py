"""Small versions of the torture tools (``python -m vectide.torture``): SIGKILL
rounds of the server, the embedded database and every durable engine under
concurrent writers, and the corruption matrix. Each must find 0 violations."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

vectide = pytest.importorskip("vectide._vectide") and __import__("vectide")

from vectide.torture import corrupt, kill, targets  # noqa: E402
from vectide.torture.oracle import DELETE, SET_PAYLOAD, UPSERT, Oracle, identify, payload, vector  # noqa: E402


def _no_violations(r: dict) -> None:
    assert r["violations"] == 0, r["violation_examples"]
    assert r["acknowledged_ops_checked"] > 0


def test_oracle_catches_a_lost_write_and_accepts_either_side_of_an_inflight_one():
    o = Oracle(3)
    o.begin(0, 1, UPSERT, 5)
    o.ack(0)
    o.begin(1, 2, UPSERT, 6)
    o.ack(1)
    o.begin(1, 2, DELETE, 0)  # in flight at the crash
    o.begin(0, 1, SET_PAYLOAD, 9)
    o.ack(0)
    o.crashed()
    # The acknowledged payload rewrite of id 1 was lost: a violation.
    bad = o.check({0: None, 1: (5, 5), 2: None}, 8)
    assert len(bad) == 1 and bad[0].startswith("id 1")
    # Either outcome of the in-flight delete is accepted, and then adopted.
    assert o.check({0: None, 1: (5, 9), 2: None}, 8) == []
    assert o.expected[2] is None
    assert o.check({0: None, 1: (5, 9), 2: (6, 6)}, 8) != []


def test_two_operations_in_flight_on_one_id_compose_in_order():
    # The server run's history behind a false alarm: writer 0's upsert of
    # id 4 reached the log, the kill failed its request, writer 1 (waiting
    # for id 4's lock) began another upsert of it before seeing the server
    # gone. Both are in flight; the first one's outcome is allowed.
    o = Oracle(5)
    o.begin(0, 4, UPSERT, 7)
    o.begin(1, 4, UPSERT, 8)
    o.crashed()
    assert o.check({4: (7, 7)}, 8) == []
    assert o.expected[4] == (7, 7)
    # Every subset in order: none, either, both (upsert then payload).
    o.begin(2, 4, DELETE, 0)
    o.begin(0, 4, SET_PAYLOAD, 9)
    o.crashed()
    assert sorted(o.uncertain[4], key=repr) == sorted([(7, 7), None, (7, 9)], key=repr)
    assert o.check({4: (7, 9)}, 8) == []
    # Order matters: from absent, an upsert then a payload update can give
    # (7, 9); the other order could not (the update would find no point).
    # Writer 1 begins first, so the order is not the writers' numbering.
    o.expected[3] = None
    o.begin(1, 3, UPSERT, 7)
    o.begin(0, 3, SET_PAYLOAD, 9)
    o.crashed()
    assert (7, 9) in o.uncertain[3]
    assert o.check({3: (7, 9), 4: (7, 9)}, 8) == []
    # A state no order of them produces is still a violation.
    o.begin(0, 4, SET_PAYLOAD, 10)
    o.begin(1, 4, DELETE, 0)
    o.crashed()
    assert o.check({3: (7, 9), 4: (7, 7)}, 8) == ["id 4: found vector#7/payload#7, acknowledged vector#7/payload#9 or vector#7/payload#10 or absent"]


def test_identify_names_what_a_wrong_point_holds():
    dim = 8
    allowed = [(11, 11), (11, 12)]
    # A candidate is recognised.
    assert identify(vector(11, dim), payload(12), allowed, dim) == (11, 12)
    # An older write (vector and payload of seed 7) is named, not matched.
    assert identify(vector(7, dim), payload(7), allowed, dim) == (7, 7)
    # The right vector with an older payload; a payload altered in place.
    assert identify(vector(11, dim), payload(7), allowed, dim) == (11, 7)
    bent = dict(payload(12), f=1.5)
    assert identify(vector(11, dim), bent, allowed, dim) == (11, -1)
    # A payload naming a seed no generator takes is simply unknown.
    assert identify(vector(11, dim), {"s": -5}, allowed, dim) == (11, -1)
    assert identify(vector(11, dim), {"s": True}, allowed, dim) == (11, -1)
    # A vector no seed makes.
    assert identify(vector(11, dim) + 1, payload(11), allowed, dim) == (-1, 11)
    # Whatever is found, a violation stays one.
    o = Oracle(1)
    o.begin(0, 0, UPSERT, 11)
    o.ack(0)
    bad = o.check({0: identify(vector(7, dim), payload(7), [o.expected[0]], dim)}, dim)
    assert bad == ["id 0: found vector#7/payload#7, acknowledged vector#11/payload#11"]


def test_embedded_database_survives_sigkill_rounds(tmp_path):
    _no_violations(kill.run_child_target("db", rounds=3, writers=3, n_ids=200, quick=True, seed=3, workdir=tmp_path))


# Standalone, the fast set runs one durable engine (spfresh, whose own WAL,
# snapshots and background rebuilds all run within three rounds); the
# rest are slow. Every durable engine runs in a database collection below.
STANDALONE_FAST = "spfresh"


@pytest.mark.parametrize("target", [
    t if t == STANDALONE_FAST else pytest.param(t, marks=pytest.mark.slow) for t in targets.engine_targets()
])
def test_durable_engines_survive_sigkill_rounds(tmp_path, target):
    r = kill.run_child_target(target, rounds=3, writers=3, n_ids=200, quick=True, seed=4, workdir=tmp_path)
    _no_violations(r)


@pytest.mark.parametrize("target", targets.db_targets())
def test_database_collections_of_every_durable_engine_survive_sigkill_rounds(tmp_path, target):
    r = kill.run_child_target(target, rounds=3, writers=3, n_ids=200, quick=True, seed=6, workdir=tmp_path)
    _no_violations(r)


# One collection of several spaces in the fast set (p-hnsw: durable per
# call, so a replay takes a record at its durable point again); the rest
# are slow.
SPACES_FAST = "db-spaces:p-hnsw"


@pytest.mark.parametrize("target", [
    t if t == SPACES_FAST else pytest.param(t, marks=pytest.mark.slow) for t in targets.db_spaces_targets()
])
def test_collections_of_several_spaces_survive_sigkill_rounds(tmp_path, target):
    r = kill.run_child_target(target, rounds=3, writers=3, n_ids=200, quick=True, seed=8, workdir=tmp_path)
    _no_violations(r)


def test_torture_targets_come_from_the_registry():
    names = {e["name"] for e in vectide.engines() if e["in_directory"]}
    assert {t.partition(":")[0] for t in targets.engine_targets()} == names
    assert {"p-hnsw:pmem", "p-hnsw:msync"} <= set(targets.engine_targets())
    assert set(targets.db_targets()) == {f"db:{n}" for n in names}
    assert set(targets.db_spaces_targets()) == {f"db-spaces:{n}" for n in names}
    assert SPACES_FAST in targets.db_spaces_targets()
    assert STANDALONE_FAST in targets.engine_targets()
    assert set(corrupt.engines()) == {e["name"] for e in vectide.engines()}
    # Each engine gets the small values of the parameters it takes, only.
    assert targets.small_params("fresh-diskann")["temp_points"] == 50
    assert "temp_points" not in targets.small_params("hnsw") and targets.small_params("hnsw")["m"] == 8
    assert targets.durable_at_flush("hnsw-wal") and not targets.durable_at_flush("p-hnsw:msync")


def test_server_survives_sigkill_rounds(tmp_path):
    cli = Path(sys.executable).parent / "vectide"
    if not cli.exists():
        pytest.skip("the vectide CLI is not installed (run make build)")
    r = kill.run_server(rounds=3, writers=3, n_ids=200, quick=True, seed=5, workdir=tmp_path)
    _no_violations(r)
    assert len(r["restart_all_s"]) == 3


def _check_matrix(r: dict) -> None:
    s = r["summary"]
    assert s["violations"] == 0, [c for c in r["cases"] if c["outcome"] == "violation"]
    # Every file kind was damaged, and damage was detected somewhere.
    files = {c["file"] for c in r["cases"]}
    assert any(f.endswith("catalog.json") for f in files)
    assert any("/wal/" in f for f in files) and any(f.endswith("points.log") for f in files)
    assert any(f.endswith("index.vtdx") for f in files)
    assert s.get("typed-error", 0) > 0


def test_corruption_matrix_sample_has_no_violation(shm_path):
    # The fast version: every engine file of every collection and one file
    # of each other name, each with one of the quick damages in turn, on
    # tmpfs (the template's p-hnsw collection persists with msync, which
    # costs seconds on a disk).
    r = corrupt.run(quick=True, workdir=shm_path, sample=True)
    _check_matrix(r)
    damaged = [c["file"] for c in r["cases"]]
    assert len(set(damaged)) == len(damaged) < len(r["files"])
    assert {Path(f).name for f in damaged} == {Path(f).name for f in r["files"]}
    assert {(c["damage"], c["where"]) for c in r["cases"]} == {("flip", "middle"), ("truncate", "middle"), ("flip", "end")}
    # Every collection's engine state is among the files damaged.
    engine_files = {f for f in r["files"] if f.startswith("collections/") and Path(f).parts[2].startswith(("index", "spaces", "sparse-"))}
    assert engine_files <= set(damaged)
    assert {Path(f).parts[1] for f in engine_files} == set(corrupt.engines()) | {corrupt.SPACES}
    # The collection of several spaces: its second space's and its sparse
    # space's files are damaged too.
    assert any(Path(f).parts[2] == "spaces" for f in engine_files)
    assert any(Path(f).name == "sparse-0.vtsp" for f in engine_files)
    # The backing file of the memory node the backed collections live on
    # (every engine that lives on one) is damaged too.
    assert corrupt.on_memory_node() and corrupt.BACKING in damaged


@pytest.mark.slow
def test_corruption_matrix_has_no_violation(tmp_path):
    r = corrupt.run(quick=True, workdir=tmp_path)
    _check_matrix(r)
    assert len(r["cases"]) == 3 * len(r["files"])
