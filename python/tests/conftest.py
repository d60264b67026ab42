"""Fixtures shared by the benchmark tests."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

#: The small synthetic dataset the benchmark tests run on (a couple of
#: seconds to prepare).
BENCH_DATASET = "clustered-20k-32-angular"


@pytest.fixture(scope="session")
def data_root(tmp_path_factory):
    """A ``$VECTIDE_DATA`` directory holding ``BENCH_DATASET``, prepared once
    per test session; tests point ``VECTIDE_DATA`` at it themselves."""
    from vectide import datasets

    root = tmp_path_factory.mktemp("bench-data")
    mp = pytest.MonkeyPatch()
    mp.setenv("VECTIDE_DATA", str(root))
    datasets.prepare(BENCH_DATASET, verbose=False)
    yield root
    mp.undo()


def slice_name(n_train: int, n_test: int) -> str:
    """The dataset name of a slice (the stem of its HDF5 file)."""
    return f"clustered-slice-{n_train}-{n_test}-32-angular"


@pytest.fixture(scope="session")
def bench_slice(data_root, tmp_path_factory):
    """``bench_slice(n_train, n_test)``: the path of an ann-benchmarks HDF5
    file holding the first ``n_train`` train rows and the first ``n_test``
    test rows of ``BENCH_DATASET`` with their exact ground truth (written
    once per session and size). Every ``--dataset`` takes such a path: the
    fast versions of the benchmark tests run the same code on it, with
    fewer rows than the full set their slow versions use."""
    from vectide import datasets

    ds = datasets.load(data_root / f"{BENCH_DATASET}.hdf5")
    root = tmp_path_factory.mktemp("bench-slices")
    made = {}

    def make(n_train: int, n_test: int) -> Path:
        path = root / f"{slice_name(n_train, n_test)}.hdf5"
        if path not in made:
            train, test = ds.train[:n_train], ds.test[:n_test]
            nb, dist = datasets.ground_truth(train, test, k=100, distance=ds.distance, progress=False)
            datasets._write_hdf5(path, train, test, nb, dist, ds.distance, f"{BENCH_DATASET} rows [:{n_train}]")
            made[path] = True
        return path

    return make


@pytest.fixture
def shm_path(tmp_path):
    """A fresh directory on ``/dev/shm`` (tmpfs) when there is one, else
    ``tmp_path``: for the fast versions of tests whose time goes to disk
    syncs (msync, fsync) rather than to the code under test. The same calls
    are made; on tmpfs they return at once. Removed afterwards."""
    if not os.path.isdir("/dev/shm"):
        yield tmp_path
        return
    d = tempfile.mkdtemp(prefix="vectide-test-", dir="/dev/shm")
    try:
        yield Path(d)
    finally:
        shutil.rmtree(d, ignore_errors=True)
