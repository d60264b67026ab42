"""vectide.datasets: preparation, ground truth, loading and sidecar export."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

h5py = pytest.importorskip("h5py")

from vectide import datasets  # noqa: E402

ANGULAR = "clustered-20k-32-angular"
EUCLIDEAN = "clustered-20k-32-euclidean"
PYTHON_DIR = str(Path(__file__).resolve().parents[1])


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    """One prepared data directory shared by the module (preparing takes ~1 s)."""
    root = tmp_path_factory.mktemp("vectide-data")
    mp = pytest.MonkeyPatch()
    mp.setenv("VECTIDE_DATA", str(root))
    datasets.prepare(ANGULAR, verbose=False)
    datasets.prepare(EUCLIDEAN, verbose=False)
    yield root
    mp.undo()


@pytest.fixture
def data_env(data_root, monkeypatch):
    monkeypatch.setenv("VECTIDE_DATA", str(data_root))
    return data_root


def brute(train, q, k, distance):
    train = train.astype(np.float64)
    q = q.astype(np.float64)
    if distance == "angular":
        d = 1.0 - q @ train.T
    else:
        d = np.sqrt(((q[:, None, :] - train[None, :, :]) ** 2).sum(-1))
    order = np.argsort(d, axis=1, kind="stable")[:, :k]
    return order, np.take_along_axis(d, order, axis=1)


@pytest.mark.parametrize("name,distance", [(ANGULAR, "angular"), (EUCLIDEAN, "euclidean")])
def test_layout_shapes_dtypes_attrs(data_env, name, distance):
    path = data_env / f"{name}.hdf5"
    assert path.is_file()
    with h5py.File(path, "r") as f:
        assert f["train"].shape == (20_000, 32) and f["train"].dtype == np.float32
        assert f["test"].shape == (500, 32) and f["test"].dtype == np.float32
        assert f["neighbors"].shape == (500, 100) and f["neighbors"].dtype == np.int32
        assert f["distances"].shape == (500, 100) and f["distances"].dtype == np.float32
        assert f.attrs["distance"] == distance
        assert f.attrs["point_type"] == "float"
        assert int(f.attrs["dimension"]) == 32
    ds = datasets.load(name)
    assert ds.name == name and Path(ds.path) == path and ds.distance == distance
    for a in (ds.train, ds.test):
        assert a.dtype == np.float32 and a.flags["C_CONTIGUOUS"]
    assert np.all(np.diff(ds.distances, axis=1) >= 0)
    assert ds.neighbors.min() >= 0 and ds.neighbors.max() < 20_000
    norms = np.linalg.norm(ds.train, axis=1)
    if distance == "angular":
        np.testing.assert_allclose(norms, 1.0, atol=1e-5)
        np.testing.assert_allclose(np.linalg.norm(ds.test, axis=1), 1.0, atol=1e-5)
    else:
        assert norms.std() > 0.1  # really not normalised


@pytest.mark.parametrize("name", [ANGULAR, EUCLIDEAN])
def test_ground_truth_matches_brute_force(data_env, name):
    ds = datasets.load(name)
    sel = np.array([0, 7, 123, 499])
    ids, dist = brute(ds.train, ds.test[sel], 100, ds.distance)
    np.testing.assert_allclose(ds.distances[sel], dist, rtol=1e-5, atol=1e-6)
    # Ids may only differ where distances tie (to float precision).
    same = ds.neighbors[sel] == ids
    assert same.mean() > 0.99
    for r, q in enumerate(sel):
        for j in np.nonzero(~same[r])[0]:
            a, b = ds.neighbors[q, j], ids[r, j]
            da = brute(ds.train[[a]], ds.test[[q]], 1, ds.distance)[1][0, 0]
            db = brute(ds.train[[b]], ds.test[[q]], 1, ds.distance)[1][0, 0]
            assert abs(da - db) < 1e-6


def test_ground_truth_function_ties_and_metrics():
    # Duplicated points tie exactly: the smaller id must come first.
    train = np.array([[1, 0], [0, 1], [1, 0], [-1, 0], [1, 0]], dtype=np.float32)
    test = np.array([[1, 0], [0, 2]], dtype=np.float32)
    ids, d = datasets.ground_truth(train, test, 4, "angular")
    assert ids.tolist() == [[0, 2, 4, 1], [1, 0, 2, 3]]
    np.testing.assert_allclose(d[0], [0, 0, 0, 1], atol=1e-7)
    ids, d = datasets.ground_truth(train, test, 3, "euclidean")
    assert ids[0].tolist() == [0, 2, 4]
    np.testing.assert_allclose(d[1], [1, np.sqrt(5), np.sqrt(5)], rtol=1e-6)
    ids, d = datasets.ground_truth(train, test, 2, "ip")
    np.testing.assert_allclose(d[1], [-2, 0], atol=1e-7)
    # Many exact duplicates tie across the candidate cut: still the smallest ids.
    rng = np.random.default_rng(1)
    far = rng.normal(size=(300, 4)).astype(np.float32) + 10
    dup = np.tile(np.array([[0.5, 0.5, 0.5, 0.5]], dtype=np.float32), (200, 1))
    x = np.concatenate([far[:150], dup, far[150:]])  # duplicates are ids 150..349
    perm = rng.permutation(x.shape[0])
    x = x[perm]
    ids, d = datasets.ground_truth(x, np.full((1, 4), 0.5, dtype=np.float32), 30, "euclidean")
    assert ids[0].tolist() == sorted(np.nonzero((perm >= 150) & (perm < 350))[0].tolist())[:30]
    assert np.all(d == 0)
    # Block size does not change the answer.
    rng = np.random.default_rng(0)
    x, q = rng.normal(size=(500, 8)).astype(np.float32), rng.normal(size=(37, 8)).astype(np.float32)
    a = datasets.ground_truth(x, q, 10, "euclidean", block=5)
    b = datasets.ground_truth(x, q, 10, "euclidean", block=1000)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])


def test_prepare_is_deterministic(data_env, tmp_path, monkeypatch):
    first = datasets.load(ANGULAR)
    monkeypatch.setenv("VECTIDE_DATA", str(tmp_path))
    datasets.prepare(ANGULAR, verbose=False)
    second = datasets.load(ANGULAR)
    assert Path(second.path).parent == tmp_path
    for key in ("train", "test", "neighbors", "distances"):
        assert np.array_equal(getattr(first, key), getattr(second, key)), key
    # No temporary files are left behind.
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{ANGULAR}.hdf5"]


def test_prepare_skips_existing_unless_forced(data_env, tmp_path, monkeypatch):
    monkeypatch.setenv("VECTIDE_DATA", str(tmp_path))
    p = datasets.prepare(EUCLIDEAN, verbose=False)
    mtime = p.stat().st_mtime_ns
    assert datasets.prepare(EUCLIDEAN, verbose=False) == p and p.stat().st_mtime_ns == mtime
    os.utime(p, ns=(mtime - 10**9, mtime - 10**9))
    datasets.prepare(EUCLIDEAN, force=True, verbose=False)
    assert p.stat().st_mtime_ns != mtime - 10**9


def test_load_prepares_missing_and_accepts_paths(data_env, tmp_path, monkeypatch):
    src = data_env / f"{EUCLIDEAN}.hdf5"
    ds = datasets.load(str(src))
    assert ds.distance == "euclidean" and ds.metric == "l2" and ds.train.shape == (20_000, 32)
    # A foreign ann-benchmarks file with a bytes attribute and no distances.
    foreign = tmp_path / "tiny-4-euclidean.hdf5"
    with h5py.File(foreign, "w") as f:
        f.attrs["distance"] = np.bytes_(b"euclidean")
        f.create_dataset("train", data=np.eye(4, dtype=np.float64))
        f.create_dataset("test", data=np.ones((2, 4)))
        f.create_dataset("neighbors", data=np.zeros((2, 3), dtype=np.int64))
    t = datasets.load(foreign)
    assert t.name == "tiny-4-euclidean" and t.train.dtype == np.float32 and t.neighbors.dtype == np.int32
    assert t.distances is None and t.distance == "euclidean"
    # Loading a known name that is missing prepares it.
    monkeypatch.setenv("VECTIDE_DATA", str(tmp_path / "fresh"))
    ds2 = datasets.load(ANGULAR)
    assert (tmp_path / "fresh" / f"{ANGULAR}.hdf5").is_file() and ds2.test.shape == (500, 32)


def test_metric_mapping():
    assert datasets.metric_for("angular") == "cosine"
    assert datasets.metric_for("euclidean") == "l2"
    assert datasets.metric_for("dot") == "ip" and datasets.metric_for("ip") == "ip"
    with pytest.raises(ValueError):
        datasets.metric_for("hamming")


def test_unknown_name(data_env, capsys):
    with pytest.raises(datasets.UnknownDatasetError) as e:
        datasets.load("no-such-dataset")
    assert "glove-6b-50-angular" in str(e.value) and ANGULAR in str(e.value)
    assert datasets.main(["prepare", "no-such-dataset"]) == 2
    err = capsys.readouterr().err
    assert "no-such-dataset" in err and "known datasets" in err and EUCLIDEAN in err


def test_unknown_name_cli_exit_code(data_env):
    env = dict(os.environ, PYTHONPATH=PYTHON_DIR)
    r = subprocess.run(
        [sys.executable, "-m", "vectide.datasets", "export", "no-such-dataset"],
        capture_output=True, text=True, env=env, cwd=data_env,
    )
    assert r.returncode == 2 and "known datasets" in r.stderr and r.stdout == ""


def _read(path, dtype):
    raw = np.fromfile(path, dtype="<u4", count=2)
    body = np.fromfile(path, dtype=dtype, offset=8)
    assert body.size == raw[0] * raw[1]
    return body.reshape(int(raw[0]), int(raw[1]))


def test_export_round_trip_and_reuse(data_env, capsys):
    assert datasets.main(["export", ANGULAR]) == 0
    out = Path(capsys.readouterr().out.strip().splitlines()[-1])
    assert out.is_absolute() and out == (data_env / f"{ANGULAR}.vbin").resolve()
    ds = datasets.load(ANGULAR)
    assert np.array_equal(_read(out / "train.fbin", "<f4"), ds.train)
    assert np.array_equal(_read(out / "test.fbin", "<f4"), ds.test)
    assert np.array_equal(_read(out / "neighbors.ibin", "<i4"), ds.neighbors)
    assert np.array_equal(datasets.read_matrix(out / "neighbors.ibin"), ds.neighbors)
    meta = json.loads((out / "meta.json").read_text())
    assert {k: meta[k] for k in ("name", "distance", "dimension", "train", "test", "k_gt")} == {
        "name": ANGULAR, "distance": "angular", "dimension": 32, "train": 20_000, "test": 500, "k_gt": 100,
    }
    assert not [p for p in out.iterdir() if ".tmp" in p.name]
    # Up to date: nothing is rewritten.
    stamps = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    assert datasets.export(ANGULAR).resolve() == out
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == stamps
    # A damaged sidecar is detected and rewritten.
    (out / "train.fbin").write_bytes(b"\0" * 8)
    datasets.export(ANGULAR)
    assert np.array_equal(_read(out / "train.fbin", "<f4"), ds.train)


def test_export_by_path_uses_cache_dir(data_env, tmp_path):
    src = tmp_path / "copy.hdf5"
    src.write_bytes((data_env / f"{EUCLIDEAN}.hdf5").read_bytes())
    out = datasets.export(str(src))
    assert out.parent == data_env / "cache"
    assert out.name.startswith("copy-") and out.name.endswith(".vbin") and len(out.name) == len("copy-") + 8 + 5
    assert np.array_equal(_read(out / "test.fbin", "<f4"), datasets.load(src).test)
    assert json.loads((out / "meta.json").read_text())["distance"] == "euclidean"
    # A modified file gets a new cache entry.
    os.utime(src, ns=(1, 1))
    assert datasets.export(str(src)) != out


@pytest.mark.parametrize("distance", ["angular", "euclidean", "ip"])
def test_ground_truth_through_flat_equals_numpy(monkeypatch, distance):
    pytest.importorskip("vectide._vectide")
    rng = np.random.default_rng(7)
    x = rng.normal(size=(3000, 12)).astype(np.float32)
    x[100:140] = x[5]  # exact duplicates: ties at and across the cut
    q = np.concatenate([rng.normal(size=(60, 12)).astype(np.float32), x[5:6]])
    calls = []
    real = datasets._flat_candidates
    monkeypatch.setattr(datasets, "_flat_candidates", lambda *a: calls.append(1) or real(*a))
    a = datasets.ground_truth(x, q, 20, distance)
    assert calls, "the native flat engine was used"
    monkeypatch.setattr(datasets, "_flat_candidates", lambda *a: None)
    b = datasets.ground_truth(x, q, 20, distance)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    # Both equal a float64 scan of every point, ties by the smaller id (the
    # duplicates of point 5 score a few ulps apart in float32 products).
    x64, q64 = x.astype(np.float64), q.astype(np.float64)
    if distance == "angular":
        x64 /= np.linalg.norm(x64, axis=1, keepdims=True)
        q64 /= np.linalg.norm(q64, axis=1, keepdims=True)
        d = 1.0 - q64 @ x64.T
    elif distance == "euclidean":
        d = np.sqrt(((q64[:, None, :] - x64[None, :, :]) ** 2).sum(-1))
    else:
        d = -(q64 @ x64.T)
    ids = np.broadcast_to(np.arange(len(x)), d.shape)
    want = np.lexsort((ids, np.round(d, 9)), axis=-1)[:, :20]
    assert np.array_equal(a[0], want)


# --------------------------------------------------------------------------
# The text dataset: passages, their embeddings and the committed sample

TEXT_SAMPLE = datasets.TEXT_SAMPLE

DOC = """The kernel keeps a reference count in every object,
and frees it at zero.

0x01   0x02   reserved

The   kernel keeps a reference count in every OBJECT, and frees it at zero.

See also.

Locks protect shared data. A spinlock never sleeps. A mutex may sleep while it waits. Readers
and writers can share a rwlock. Sequence locks favour the writers. RCU lets readers run without
any lock at all."""


def test_split_passages_is_deterministic_and_deduplicates():
    paras = [("doc.html", "Refcounts", p) for p in DOC.split("\n\n")]
    paras.append(("doc.html", "Locking", "Short closing words of another section."))
    out = datasets.split_passages(paras, min_words=8, max_words=16, keep_words=5)
    assert out == datasets.split_passages(list(paras), min_words=8, max_words=16, keep_words=5)
    texts = [t for _, _, t in out]
    # Whitespace collapsed; the repeat (other case and spacing) dropped; the
    # table cell and the 2-word line are not prose.
    assert texts[0] == "The kernel keeps a reference count in every object, and frees it at zero."
    assert sum("reference count" in t.lower() for t in texts) == 1
    assert not any("0x01" in t or t.startswith("See also") for t in texts)
    # The 36-word paragraph is cut at sentence ends into 3 pieces of 8-16 words.
    locks = [t for _, sec, t in out if sec == "Refcounts"][1:]
    assert [len(t.split()) for t in locks] == [15, 12, 9] and all(t.endswith(".") for t in locks)
    assert " ".join(locks) == " ".join(DOC.split("\n\n")[-1].split())
    # Sections are never mixed; a short section end is kept only from keep_words up.
    assert out[-1] == ("doc.html", "Locking", "Short closing words of another section.")
    assert datasets.split_passages(paras[-1:], keep_words=7) == []
    # Short paragraphs of one section are joined up to min_words.
    two = [("d", "s", "One two three four five six."), ("d", "s", "Seven eight nine ten eleven twelve.")]
    joined = datasets.split_passages(two, min_words=10, max_words=20, keep_words=5)
    assert joined == [("d", "s", "One two three four five six. Seven eight nine ten eleven twelve.")]


def test_html_paragraphs_of_sphinx_and_rustdoc_pages():
    page = """<html><body><nav><p>Navigation is not text of the page at all here.</p></nav>
    <div role="main"><div><h1>Kref<a class="headerlink">\u00b6</a></h1>
    <p>A <code>kref</code> counts   references.</p><pre>kref_get(&amp;x);</pre>
    <div><h2>Rules</h2><p>Take one &amp; drop one.</p></div></div></div>
    <footer><p>Copyright text that is not part of the main body.</p></footer></body></html>"""
    p = datasets._HtmlParagraphs()
    p.feed(page)
    assert p.paragraphs == [("Kref", "A kref counts references."), ("Rules", "Take one & drop one.")]
    p = datasets._HtmlParagraphs()
    p.feed("<p>outside</p><main><h4>pub fn len(&amp;self)</h4><p>Returns the length.</p></main><p>after</p>")
    assert p.paragraphs == [("pub fn len(&self)", "Returns the length.")]


def test_text_sample_dataset(tmp_path, monkeypatch):
    assert datasets.TEXT_SAMPLE_FILE.is_file() and datasets.TEXT_SAMPLE_FILE.stat().st_size < 2_500_000
    monkeypatch.setenv("VECTIDE_DATA", str(tmp_path))
    path = datasets.prepare(TEXT_SAMPLE, verbose=False)
    with h5py.File(path, "r") as f:
        assert f.attrs["distance"] == "angular" and int(f.attrs["dimension"]) == 384
        assert "all-MiniLM-L6-v2" in f.attrs["model"] and "linux-doc" in f.attrs["corpus"]
    ds = datasets.load(TEXT_SAMPLE)
    assert ds.train.shape == (2_000, 384) and ds.test.shape == (200, 384) and ds.dimension == 384
    assert ds.neighbors.shape == (200, 100) and ds.distances.shape == (200, 100)
    np.testing.assert_allclose(np.linalg.norm(ds.train, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(ds.test, axis=1), 1.0, atol=1e-5)
    # Exact ground truth: float64 brute force over every train row.
    ids, dist = brute(ds.train, ds.test, 100, "angular")
    np.testing.assert_allclose(ds.distances, dist, rtol=1e-5, atol=1e-6)
    assert (ds.neighbors == ids).mean() > 0.999
    # The text lines up with the rows: ids are the rows, and a query shares
    # far more words with its nearest passage than with a random one.
    text = datasets.passages(TEXT_SAMPLE)
    assert [r["id"] for r in text["train"]] == list(range(2_000))
    assert [r["id"] for r in text["test"]] == list(range(200))
    assert all(r["text"] and ":" in r["source"] for r in text["train"] + text["test"])
    assert len({r["text"] for r in text["train"] + text["test"]}) == 2_200

    def overlap(a, b):  # Jaccard of the words of 5+ letters
        a, b = (set(re.findall(r"[a-z]{5,}", t.lower())) for t in (a, b))
        return len(a & b) / max(1, len(a | b))

    queries, train = [q["text"] for q in text["test"]], [r["text"] for r in text["train"]]
    near = np.mean([overlap(q, train[ds.neighbors[i, 0]]) for i, q in enumerate(queries)])
    rand = np.mean([overlap(q, train[(7 * i + 3) % 2_000]) for i, q in enumerate(queries)])
    assert near > 3 * rand  # about 0.067 against 0.008
    # Preparing again gives the same file contents.
    first = ds
    datasets.prepare(TEXT_SAMPLE, force=True, verbose=False)
    again = datasets.load(TEXT_SAMPLE)
    for key in ("train", "test", "neighbors", "distances"):
        assert np.array_equal(getattr(first, key), getattr(again, key)), key


def test_textembed_pieces_without_the_model():
    import math

    from vectide import textembed

    # GELU with the exact erf, to float32 precision.
    x = np.linspace(-9, 9, 20_001).astype(np.float32)
    want = np.array([0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in x.astype(np.float64)])
    assert np.abs(textembed._gelu_(x.copy()) - want).max() < 1e-6
    # Batches: sorted by length, within the token budget, every row once.
    lengths = [5, 60, 7, 7, 300, 33, 12, 64, 64, 2]
    batches = textembed._batches(lengths, 128)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    assert all(len(b) == 1 or len(b) * max(lengths[i] for i in b) <= 128 for b in batches)
    flat = [lengths[i] for b in batches for i in b]
    assert flat == sorted(flat)
