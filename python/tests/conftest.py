"""Fixtures shared by the benchmark tests."""

from __future__ import annotations

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
