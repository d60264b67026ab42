"""Shared pieces of the RAG framework scenarios (``run_*.py``).

Standard library only: each scenario runs with its framework's own venv
python (``.venv-fw-*``), which has no vectide package, so this module is
imported from the scenario's directory.

It gives:

* ``VectideServer`` -- ``vectide serve`` on a fresh temporary data directory
  and a free port of 127.0.0.1, waited for until it answers, stopped at the
  end (binary from ``$VECTIDE_BIN``).
* ``TraceProxy`` -- an optional recording HTTP proxy in front of the server
  (``VECTIDE_FW_TRACE=1``): every exchange that the server answers with a
  status >= 400 is printed with its method, path, request and response body,
  to tell which framework call met which server gap.
* The test's own deterministic embeddings: ``dense_embed`` (a hashed
  random projection of the bag of words, ``DIM`` floats) and
  ``sparse_embed`` (term frequencies over CRC-32 word ids). Both depend on
  nothing but the text, so every expected answer is computed here by brute
  force: ``rank_dense`` (cosine), ``rank_sparse`` (dot product, optionally
  with Qdrant's IDF modifier), ``rrf`` (Qdrant's reciprocal rank fusion) and
  ``relative_score_fusion`` (LlamaIndex's client-side hybrid fusion).
* ``Scenario`` -- records named checks; a failed check does not stop the
  ones after it. ``finish()`` prints one JSON line and exits 1 if any check
  failed.
"""

from __future__ import annotations

import atexit
import http.client
import http.server
import ipaddress
import json
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.request
import zlib
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

# ---------------------------------------------------------------- embeddings

#: Dimension of the test's dense embedding.
DIM = 16

#: Sparse word ids are CRC-32 of the word, cut to this many bits.
SPARSE_BITS = 20

_WORD = re.compile(r"[a-z0-9]+")
_STOP = frozenset(
    "a an and are as at be by for from has have in is it its of on or that the this to was with".split()
)


def words(text: str) -> list[str]:
    """Lower-cased alphanumeric words of ``text`` without common stop words."""
    return [w for w in _WORD.findall(text.lower()) if w not in _STOP]


def _word_direction(word: str) -> list[float]:
    """A fixed pseudo-random direction for ``word`` (components in [-1, 1]),
    from CRC-32 -- stable across runs and machines, unlike ``hash()``."""
    return [((zlib.crc32(f"{word}#{i}".encode()) % 2001) - 1000) / 1000.0 for i in range(DIM)]


def dense_embed(text: str) -> list[float]:
    """The sum of the word directions of ``text``'s words: texts sharing
    words point the same way, so cosine neighbours follow word overlap."""
    v = [0.0] * DIM
    for w in words(text):
        for i, x in enumerate(_word_direction(w)):
            v[i] += x
    if not any(v):
        v[0] = 1.0  # an all-stop-word text: still a valid cosine vector
    return v


def unit(v: Sequence[float]) -> list[float]:
    """``v`` scaled to length 1: a cosine collection stores (and returns)
    its vectors normalised, as Qdrant does."""
    n = math.sqrt(sum(x * x for x in v))
    return [x / n for x in v]


def close(a: Sequence[float] | None, b: Sequence[float], tol: float = 1e-5) -> bool:
    return a is not None and len(a) == len(b) and all(abs(x - y) <= tol for x, y in zip(a, b))


def word_id(word: str) -> int:
    return zlib.crc32(word.encode()) & ((1 << SPARSE_BITS) - 1)


def sparse_embed(text: str) -> tuple[list[int], list[float]]:
    """Term frequencies of ``text``'s words keyed by ``word_id``, divided
    by the number of words (so that equal counts in texts of different
    lengths do not tie), as sorted ``(indices, values)``."""
    ws = words(text)
    tf: dict[int, float] = {}
    for w in ws:
        i = word_id(w)
        tf[i] = tf.get(i, 0.0) + 1.0
    idx = sorted(tf)
    return idx, [tf[i] / len(ws) for i in idx]


# ---------------------------------------------------------------- expected answers

#: Consecutive scores closer than this count as a tie: the test data must
#: have none where an order is compared (float32 storage, float64 here).
TIE_EPS = 1e-4


class TieError(AssertionError):
    """The test's data makes an expected order ambiguous: change the data."""


def _cosine(a: Sequence[float], b: Sequence[float]) -> float:
    na = math.sqrt(sum(x * x for x in a))
    nb = math.sqrt(sum(x * x for x in b))
    return sum(x * y for x, y in zip(a, b)) / (na * nb)


def _sparse_dot(q: tuple[list[int], list[float]], d: tuple[list[int], list[float]]) -> tuple[float, bool]:
    dm = dict(zip(*d))
    hit = [i for i in q[0] if i in dm]
    return sum(v * dm[i] for i, v in zip(*q) if i in dm), bool(hit)


def _top(scored: list[tuple[float, str]], k: int, what: str) -> list[tuple[str, float]]:
    scored = sorted(scored, key=lambda s: -s[0])
    # the first k must be strictly ordered, and the k-th strictly above the (k+1)-th
    for i in range(min(k, len(scored)) - (0 if len(scored) > k else 1)):
        if scored[i][0] - scored[i + 1][0] < TIE_EPS:
            raise TieError(f"{what}: tie between {scored[i]} and {scored[i + 1]} -- change the test data")
    return [(key, s) for s, key in scored[:k]]


def rank_dense(query: str, docs: dict[str, str], k: int, keep: Callable[[str], bool] = lambda _k: True) -> list[tuple[str, float]]:
    """Top ``k`` of ``docs`` (key -> text) by cosine to ``query``'s dense
    embedding, among the keys that ``keep`` accepts: ``[(key, score)]``."""
    q = dense_embed(query)
    return _top([(_cosine(q, dense_embed(t)), key) for key, t in docs.items() if keep(key)], k, f"dense {query!r}")


def idf(df: int, n: int) -> float:
    """Qdrant's IDF modifier (qdrant_client.local ``_compute_idf``)."""
    return math.log((n - df + 0.5) / (df + 0.5) + 1)


def rank_sparse(
    query: str,
    docs: dict[str, str],
    k: int,
    keep: Callable[[str], bool] = lambda _k: True,
    use_idf: bool = False,
) -> list[tuple[str, float]]:
    """Top ``k`` of ``docs`` by the dot product of sparse embeddings; only
    documents sharing a word id with the query score (as in Qdrant). With
    ``use_idf`` the query's values are weighted by the IDF over all of
    ``docs`` (the collection's live points, filter or not)."""
    q = sparse_embed(query)
    if use_idf:
        embs = [set(sparse_embed(t)[0]) for t in docs.values()]
        q = (q[0], [v * idf(sum(i in e for e in embs), len(embs)) for i, v in zip(*q)])
    scored = []
    for key, t in docs.items():
        if keep(key):
            s, hit = _sparse_dot(q, sparse_embed(t))
            if hit:
                scored.append((s, key))
    return _top(scored, k, f"sparse {query!r}")


def rrf_scored(
    lists: Sequence[Sequence[str]], limit: int, k: int = 2, weights: Sequence[float] | None = None
) -> list[tuple[str, float]]:
    """Qdrant's reciprocal rank fusion, as qdrant_client.local computes it:
    the point at 0-based position ``pos`` of a list adds ``1 / (pos + k)``
    (``k`` = 2 unless given, Qdrant's default), with a weight ``w``
    ``1 / ((pos + 1) / w + k - 1)``: ``[(key, score)]``, best first."""
    scores: dict[str, float] = {}
    for j, lst in enumerate(lists):
        w = 1.0 if weights is None else weights[j]
        for pos, key in enumerate(lst):
            scores[key] = scores.get(key, 0.0) + (1.0 / ((pos + 1) / w + k - 1) if w > 0 else 0.0)
    return _top([(s, key) for key, s in scores.items()], limit, "rrf")


def rrf(lists: Sequence[Sequence[str]], limit: int, k: int = 2, weights: Sequence[float] | None = None) -> list[str]:
    """The keys of ``rrf_scored``."""
    return keys_of(rrf_scored(lists, limit, k, weights))


def relative_score_fusion(
    dense: Sequence[tuple[str, float]], sparse: Sequence[tuple[str, float]], alpha: float, top_k: int
) -> list[str]:
    """LlamaIndex's default Qdrant hybrid fusion, recomputed: each list's
    scores min-max normalised to [0, 1], then ``alpha * dense + (1 -
    alpha) * sparse``."""

    def norm(lst: Sequence[tuple[str, float]]) -> dict[str, float]:
        if not lst:
            return {}
        lo, hi = min(s for _, s in lst), max(s for _, s in lst)
        return {key: (hi if hi == lo else (s - lo) / (hi - lo)) for key, s in lst}

    d, s = norm(dense), norm(sparse)
    if not sparse:
        return [key for key, _ in dense][:top_k]
    if not dense:
        return [key for key, _ in sparse][:top_k]
    keys = list(dict.fromkeys([key for key, _ in dense] + [key for key, _ in sparse]))
    fused = [(alpha * d.get(key, 0.0) + (1 - alpha) * s.get(key, 0.0), key) for key in keys]
    return [key for key, _ in _top(fused, top_k, "relative score fusion")]


# ---------------------------------------------------------------- the server


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def vectide_bin() -> str:
    b = os.environ.get("VECTIDE_BIN") or shutil.which("vectide")
    if not b:
        sys.exit("fwcommon: set VECTIDE_BIN to the vectide binary")
    return b


class VectideServer:
    """``vectide serve`` on a fresh data directory and a free local port."""

    def __init__(self, binary: str | None = None) -> None:
        self.binary = binary or vectide_bin()
        self.data = tempfile.mkdtemp(prefix="vectide-fw-")
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self.log = Path(self.data + ".log")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> "VectideServer":
        for _attempt in range(3):  # a free port may be taken before we bind it
            self.port = free_port()
            with open(self.log, "wb") as log:
                self.proc = subprocess.Popen(
                    [self.binary, "serve", "--data", self.data, "--host", "127.0.0.1", "--port", str(self.port)],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and self.proc.poll() is None:
                try:
                    with urllib.request.urlopen(f"{self.url}/healthz", timeout=1) as r:
                        if r.status == 200:
                            return self
                except OSError:
                    time.sleep(0.05)
            self.stop(keep_data=True)
        raise RuntimeError(f"vectide serve did not answer; its log:\n{self.log.read_text(errors='replace')[-4000:]}")

    def stop(self, keep_data: bool = False) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        if not keep_data:
            shutil.rmtree(self.data, ignore_errors=True)
            self.log.unlink(missing_ok=True)

    def __enter__(self) -> "VectideServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class TraceProxy:
    """A recording HTTP/1.1 proxy to ``target`` (host, port) on a free local
    port: keeps every exchange, answered or refused, for the report."""

    def __init__(self, target_port: int) -> None:
        self.exchanges: list[dict] = []
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a) -> None:  # quiet
                pass

            def _forward(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
                conn = http.client.HTTPConnection("127.0.0.1", target_port, timeout=60)
                conn.request(self.command, self.path, body=body or None, headers=headers)
                r = conn.getresponse()
                data = r.read()
                conn.close()
                proxy.exchanges.append(
                    {
                        "method": self.command,
                        "path": self.path,
                        "request": body.decode(errors="replace"),
                        "status": r.status,
                        "response": data.decode(errors="replace"),
                    }
                )
                self.send_response(r.status)
                for k, v in r.getheaders():
                    if k.lower() not in ("content-length", "transfer-encoding", "connection"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _forward

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def errors(self) -> list[dict]:
        return [e for e in self.exchanges if e["status"] >= 400]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


# ---------------------------------------------------------------- no network

#: Connection attempts and name lookups of this process outside loopback.
network_attempts: list[str] = []
_guarded = False


def _is_loopback(host) -> bool:
    if host is None:
        return True
    if isinstance(host, bytes):
        host = host.decode(errors="replace")
    host = str(host).strip("[]")
    if host in ("localhost", ""):
        return True
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return False  # a name other than localhost: a DNS lookup


def guard_network() -> None:
    """Record (through an audit hook) every ``socket.connect`` and
    ``getaddrinfo`` of this process aimed outside loopback: the network
    namespace makes them fail, this makes them visible, even where a
    library swallows the failure (a telemetry ping, an optional download)."""
    global _guarded
    if _guarded:
        return
    _guarded = True

    def hook(event: str, args: tuple) -> None:
        if event == "socket.connect":
            addr = args[1]
            host = addr[0] if isinstance(addr, tuple) else None  # AF_UNIX paths are local
        elif event == "socket.getaddrinfo":
            host = args[0]
        else:
            return
        if not _is_loopback(host):
            network_attempts.append(f"{event} {args[1] if event == 'socket.connect' else args[:2]!r}")

    sys.addaudithook(hook)


def exit_nonzero_on_network_attempts() -> None:
    """For a snippet run as a script: at exit, name any attempt and make the
    exit status 3."""
    guard_network()

    def report() -> None:
        if network_attempts:
            print("network access outside loopback:\n  " + "\n  ".join(network_attempts), file=sys.stderr, flush=True)
            sys.stdout.flush()
            os._exit(3)

    atexit.register(report)


# ---------------------------------------------------------------- checks


class Scenario:
    """Named checks of one framework against one server; see module doc."""

    def __init__(self, framework: str) -> None:
        self.framework = framework
        self.passed: list[str] = []
        self.failed: list[dict] = []
        self.order: list[str] = []  # every check, in the order run
        self.t0 = time.monotonic()
        self.server = VectideServer()
        self.proxy: TraceProxy | None = None
        guard_network()

    # -- server ------------------------------------------------------------

    def __enter__(self) -> "Scenario":
        self.server.start()
        if os.environ.get("VECTIDE_FW_TRACE") == "1":
            self.proxy = TraceProxy(self.server.port)
        return self

    def __exit__(self, et, ev, tb) -> bool:
        if et is not None and not issubclass(et, SystemExit):
            self.failed.append({"check": "(scenario aborted)", "error": _describe(ev)})
            self.order.append("(scenario aborted)")
        # qdrant-client checks the server's version on a background thread
        # of each new client: let those finish before the server goes, or
        # they warn "Failed to obtain server version" about our own stop
        for t in threading.enumerate():
            if "_check_compatibility" in t.name:
                t.join(5)
        if self.proxy is not None:
            self.proxy.close()
        self.server.stop()
        self.finish()
        return False

    @property
    def url(self) -> str:
        """Where the framework connects: the server, or the trace proxy."""
        return self.proxy.url if self.proxy is not None else self.server.url

    @property
    def port(self) -> int:
        return self.proxy.port if self.proxy is not None else self.server.port

    # -- checks --------------------------------------------------------------

    @contextmanager
    def check(self, name: str) -> Iterator[None]:
        """``with s.check("dense search"):`` -- an exception inside fails
        this check (recorded with the framework's error and, when tracing,
        the HTTP exchanges it caused) and the scenario goes on."""
        mark = len(self.proxy.exchanges) if self.proxy is not None else 0
        self.order.append(name)
        try:
            yield
        except TieError:
            raise
        except Exception as e:  # noqa: BLE001 -- recorded, reported, exit 1
            entry = {"check": name, "error": _describe(e)}
            if self.proxy is not None:
                entry["http_errors"] = [x for x in self.proxy.exchanges[mark:] if x["status"] >= 400]
            self.failed.append(entry)
            print(f"FAIL {self.framework}: {name}: {entry['error']}", file=sys.stderr)
            for x in entry.get("http_errors", []):
                print(f"     {x['method']} {x['path']} {x['request'][:600]}\n  -> {x['status']} {x['response'][:600]}", file=sys.stderr)
        else:
            self.passed.append(name)

    def finish(self) -> None:
        with self.check("no network access outside loopback"):
            if network_attempts:
                raise AssertionError("; ".join(network_attempts[:20]))
        summary = {
            "framework": self.framework,
            "passed": len(self.passed),
            "failed": len(self.failed),
            "checks": self.order,
            "failures": self.failed,
            "seconds": round(time.monotonic() - self.t0, 2),
        }
        print(json.dumps(summary), flush=True)
        if self.failed:
            sys.exit(1)


def _describe(e: BaseException) -> str:
    """The error, its causes (a framework often wraps the client's error,
    which holds the server's answer) and where in the scenario it arose."""
    parts, seen, x = [], set(), e
    while x is not None and id(x) not in seen:
        seen.add(id(x))
        parts.append(f"{type(x).__name__}: {x}")
        x = x.__cause__ or x.__context__
    msg = " <- caused by ".join(parts)
    tb = traceback.extract_tb(e.__traceback__)
    here = [f for f in tb if "/frameworks/" in f.filename]
    if here:
        f = here[-1]
        msg += f" (at {Path(f.filename).name}:{f.lineno})"
    return msg[:3000]


def eq(got, want, what: str = "") -> None:
    """``assert got == want`` with both in the message."""
    if got != want:
        raise AssertionError(f"{what}: got {got!r}, want {want!r}" if what else f"got {got!r}, want {want!r}")


def keys_of(ranked: Iterable[tuple[str, float]]) -> list[str]:
    return [k for k, _ in ranked]


# ---------------------------------------------------------------- the corpus

#: The scenarios' documents: key -> (text, metadata). Keys become point ids
#: where a framework lets the caller choose them.
CORPUS: dict[str, tuple[str, dict]] = {
    "d01": ("Rust ownership rules make memory safety a compile time property", {"topic": "rust", "year": 2015}),
    "d02": ("The borrow checker in Rust rejects data races before the program runs", {"topic": "rust", "year": 2018}),
    "d03": ("Cargo builds Rust crates and runs their tests and benchmarks", {"topic": "rust", "year": 2021}),
    "d04": ("Python lists grow by doubling their memory when they run out of room", {"topic": "python", "year": 2012}),
    "d05": ("The Python garbage collector frees cycles that reference counting misses", {"topic": "python", "year": 2019}),
    "d06": ("Pip installs Python packages from wheels into a virtual environment", {"topic": "python", "year": 2023}),
    "d07": ("Slow cooking softens tough beef in a heavy pot over many hours", {"topic": "cooking", "year": 2010}),
    "d08": ("Bread dough rises when yeast ferments sugar into gas", {"topic": "cooking", "year": 2016}),
    "d09": ("A cast iron pan holds heat for searing steak and baking bread", {"topic": "cooking", "year": 2020}),
    "d10": ("Telescopes collect starlight with a large mirror or lens", {"topic": "astronomy", "year": 2011}),
    "d11": ("The moon raises tides in the oceans as the earth turns", {"topic": "astronomy", "year": 2017}),
    "d12": ("Comets grow bright tails of gas and dust near the sun", {"topic": "astronomy", "year": 2022}),
}

TEXTS: dict[str, str] = {k: t for k, (t, _m) in CORPUS.items()}
META: dict[str, dict] = {k: m for k, (_t, m) in CORPUS.items()}


def groups(ranked: Sequence[str], group_of: Callable[[str], object], limit: int, size: int) -> list[list[str]]:
    """Qdrant's grouped search over an already ranked list: groups in the
    order of their best member, the first ``limit`` groups, at most ``size``
    members each."""
    out: dict[object, list[str]] = {}
    for key in ranked:
        g = out.setdefault(group_of(key), [])
        if len(g) < size:
            g.append(key)
    return list(out.values())[:limit]


def mmr(query: str, docs: dict[str, str], k: int, fetch_k: int, diversity: float) -> list[str]:
    """Qdrant's maximal marginal relevance over cosine (qdrant_client.local
    ``_mmr``): the ``fetch_k`` nearest are the candidates; the most relevant
    first, then each time the one maximising ``(1 - diversity) * sim(q, d)
    - diversity * max sim(d, chosen)``."""
    cands = keys_of(rank_dense(query, docs, fetch_k))
    q = dense_embed(query)
    rel = {c: _cosine(q, dense_embed(docs[c])) for c in cands}
    lam = 1.0 - diversity
    chosen = [cands[0]]
    pending = cands[1:]
    while len(chosen) < k and pending:
        scored = [
            (lam * rel[c] - (1 - lam) * max(_cosine(dense_embed(docs[c]), dense_embed(docs[s])) for s in chosen), c)
            for c in pending
        ]
        best = _top(scored, 1, "mmr")[0][0]
        chosen.append(best)
        pending.remove(best)
    return chosen


# ---------------------------------------------------------------- README snippets

REPO = Path(__file__).resolve().parents[3]
README = REPO / "README.md"


def snippet_marker(name: str) -> str:
    return f"<!-- snippet: {name} -->"


def extract_snippet(path: str | Path, name: str) -> str:
    """The ```python block that follows the line ``<!-- snippet: NAME -->``
    in the markdown file ``path`` (blank lines between are allowed). Raises
    ``LookupError`` naming what is wrong."""
    lines = Path(path).read_text().splitlines()
    tag = snippet_marker(name)
    at = [i for i, line in enumerate(lines) if line.strip() == tag]
    if len(at) != 1:
        raise LookupError(f"{path}: {len(at)} lines {tag!r}, want exactly 1")
    i = at[0] + 1
    while i < len(lines) and not lines[i].strip():
        i += 1
    if i == len(lines) or lines[i].strip() != "```python":
        raise LookupError(f"{path}:{at[0] + 1}: no ```python block right after {tag!r}")
    body = []
    for line in lines[i + 1 :]:
        if line.strip() == "```":
            return "\n".join(body) + "\n"
        body.append(line)
    raise LookupError(f"{path}:{i + 1}: the ```python block after {tag!r} is not closed")


def snippet_source(name: str) -> tuple[Path, str]:
    """``(path, code)`` of the README's snippet ``name``."""
    return README, extract_snippet(README, name)
