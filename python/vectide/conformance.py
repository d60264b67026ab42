"""Conformance with Qdrant's semantics: seeded random scenarios driven
through the same ``qdrant-client`` calls against ``vectide serve`` and
against qdrant-client's own local mode (``QdrantClient(":memory:")``, the
reference implementation of the API in Python), answer for answer.

``python -m vectide.conformance --scenarios 1000 --out conformance.json``

Each scenario creates one collection of a random shape (one unnamed dense
vector; named dense vectors; sparse vectors with and without the IDF
modifier; sparse only; a mix), upserts at least 200 points with nested
payloads (objects, arrays, text, integers, floats, booleans, nulls) and a
random share of points lacking some vectors, then runs at least 20 random
operations: upserts that replace points, deletes by id and by filter,
payload edits (set with and without a key path, overwrite, delete keys,
clear), exact dense queries, sparse queries, queries by point id, prefetch
with RRF (plain and weighted) and with DBSF, MMR re-ranking (dense and
sparse, by vector and by point id), grouped queries (``query_points_groups``
by keys holding strings, integers, arrays and values that group nothing,
over plain, fused and MMR queries), count, scroll and retrieve, with
filters of every condition class. After every operation the two sides must agree: the same
ids in the same order, scores within 1e-4, the same payloads and vectors.
Ties (scores within 1e-6) are put in id order on both sides before the
comparison, as the issue asks; a tie cut by the limit (or the offset)
leaves which of the tied points are in the answer to rounding (fused
scores tie exactly, e.g. DBSF over two sources of two points), so such a
run of ties at the cut is compared by its length and score only.

Deliberate differences (the generator stays clear of them; the README
lists them too):

* dense search is approximate unless ``params.exact`` is set: every dense
  query here asks for ``exact=True`` (local mode is always exact);
* point ids are unsigned integers and UUIDs in local mode; Vectide also
  takes other string keys (not generated);
* a payload edit naming an id that does not exist is an error in Qdrant
  (404 after the others are applied) and a no-op for that id in Vectide
  (edits here name existing ids only);
* Qdrant's server counts deleted points in its IDF statistics until they
  are vacuumed; Vectide counts live points, as local mode does;
* a grouped query reads at most 100,000 points of its answer (local mode
  reads them all), and MMR re-ranks at most 16,384 candidates (local mode
  refuses a larger ``candidates_limit`` but takes a larger ``limit`` in
  its place); the scenarios stay far below both.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
import uuid
from collections import Counter
from typing import Any, Dict, List, Optional, Tuple

DELIBERATE = [
    "dense search is approximate unless params.exact is set (the test always sets it; local mode is exact)",
    "point ids beyond unsigned integers and UUIDs (other string keys) exist in Vectide only (not generated)",
    "a payload edit naming a missing id: Qdrant answers 404 after applying the rest, Vectide skips that id (not generated)",
    "IDF counts live points (as local mode does); Qdrant's server counts deleted ones until vacuum",
    "a grouped query reads at most 100,000 points of its answer and MMR re-ranks at most 16,384 candidates "
    "(local mode reads every point; not generated)",
]

FEATURES = [
    "named spaces", "sparse", "sparse idf", "dense search", "sparse search", "query by id", "prefetch rrf",
    "prefetch dbsf", "rescore prefetch", "score threshold", "offset", "count", "scroll", "retrieve",
    "upsert replace", "delete by id", "delete by filter", "set payload", "set payload key", "overwrite payload",
    "delete payload", "clear payload", "filter match value", "filter match any", "filter match except",
    "filter match text", "filter range", "filter is_empty", "filter is_null", "filter has_id", "filter min_should",
    "filter nested key", "filter array key", "filter nested", "filter should", "filter must_not",
    "mmr", "mmr by id", "rrf weights", "query groups", "groups array key", "groups fused", "groups mmr",
]

WORDS = ["alpha", "beta", "gamma", "delta", "rust", "vector", "search", "fresh", "disk", "graph"]
TOPICS = ["a", "b", "c", "d"]


class Mismatch(AssertionError):
    pass


class Scenario:
    """One seeded scenario (see the module docs)."""

    def __init__(self, seed: int, ours, ref, counts: Counter) -> None:
        from qdrant_client import models as m

        self.m = m
        self.rng = random.Random(seed)
        self.ours, self.ref = ours, ref
        self.name = f"s{seed}"
        self.counts = counts
        self.checks = 0
        self.ops = 0
        self.ids: List[Any] = []
        self._shape()

    # ------------------------------------------------------------ shape

    def _shape(self) -> None:
        r, m = self.rng, self.m
        kind = r.choice(["unnamed", "named", "sparse-only", "unnamed+sparse", "named+sparse"])
        self.dense: Dict[str, Tuple[int, Any]] = {}
        self.sparse: Dict[str, bool] = {}
        dists = [m.Distance.COSINE, m.Distance.DOT, m.Distance.EUCLID]
        if kind.startswith("unnamed"):
            self.dense[""] = (r.randint(3, 8), r.choice(dists))
        if kind.startswith("named"):
            for n in r.sample(["text", "image", "title"], r.randint(1, 3)):
                self.dense[n] = (r.randint(2, 8), r.choice(dists))
            self.counts["named spaces"] += 1
        if "sparse" in kind:
            for n in r.sample(["bm25", "splade", "words"], r.randint(1, 2)):
                self.sparse[n] = r.random() < 0.5
            self.counts["sparse"] += 1
            if any(self.sparse.values()):
                self.counts["sparse idf"] += 1
        if "" in self.dense:
            dim, dist = self.dense[""]
            vectors_config: Any = m.VectorParams(size=dim, distance=dist)
        else:
            vectors_config = {n: m.VectorParams(size=d, distance=t) for n, (d, t) in self.dense.items()}
        sparse_config = {n: m.SparseVectorParams(modifier=m.Modifier.IDF if idf else None) for n, idf in self.sparse.items()} or None
        for c in (self.ours, self.ref):
            c.create_collection(self.name, vectors_config=vectors_config, sparse_vectors_config=sparse_config)
        self.vocab = r.choice([20, 60, 300])

    # ------------------------------------------------------------ data

    def _dense(self, dim: int) -> List[float]:
        return [round(self.rng.uniform(-1, 1), 6) for _ in range(dim)]

    def _sparse_vec(self, n: Optional[int] = None):
        r = self.rng
        n = r.randint(1, 8) if n is None else n
        idx = sorted(r.sample(range(self.vocab), min(n, self.vocab)))
        return self.m.SparseVector(indices=idx, values=[round(r.uniform(0.05, 2.0), 6) for _ in idx])

    def _vector(self, full: bool = False):
        r = self.rng
        out: Dict[str, Any] = {}
        for n, (dim, _) in self.dense.items():
            if full or n == "" or r.random() < 0.85:
                out[n] = self._dense(dim)
        for n in self.sparse:
            if full or r.random() < 0.85:
                out[n] = self._sparse_vec()
        if list(out) == [""]:
            return out[""]
        if "" in out and not self.sparse:
            return out[""]
        return out

    def _payload(self) -> Dict[str, Any]:
        r = self.rng
        p: Dict[str, Any] = {}
        if r.random() < 0.9:
            p["meta"] = {"topic": r.choice(TOPICS), "n": r.randint(0, 50)}
            if r.random() < 0.3:
                p["meta"]["lang"] = r.sample(["en", "de", "fr"], r.randint(0, 2))
        if r.random() < 0.8:
            p["tags"] = r.sample(TOPICS, r.randint(0, 3))
        if r.random() < 0.7:
            p["title"] = " ".join(r.choice(WORDS).capitalize() if r.random() < 0.3 else r.choice(WORDS) for _ in range(r.randint(1, 5)))
        if r.random() < 0.7:
            p["year"] = r.randint(1990, 2025)
        if r.random() < 0.5:
            p["price"] = round(r.uniform(0, 100), 3)
        if r.random() < 0.3:
            p["flag"] = r.random() < 0.5
        if r.random() < 0.2:
            p["maybe"] = None if r.random() < 0.5 else [None, 1]
        if r.random() < 0.3:
            p["items"] = [{"k": r.randint(0, 3), "v": r.choice(TOPICS)} for _ in range(r.randint(0, 3))]
        return p

    def _new_id(self):
        r = self.rng
        while True:
            i = str(uuid.UUID(int=r.getrandbits(128))) if r.random() < 0.15 else r.randint(0, 10**6)
            if i not in self.ids:
                return i

    # ------------------------------------------------------------ filters

    def _condition(self):
        r, m = self.rng, self.m
        kind = r.choice(["value", "any", "except", "text", "range", "is_empty", "is_null", "has_id", "nested key",
                         "array key", "nested"])
        self.counts[f"filter {kind}" if kind not in ("value", "any", "except", "text") else f"filter match {kind}"] += 1
        if kind == "value":
            key, v = r.choice([("meta.topic", r.choice(TOPICS)), ("year", r.randint(1990, 2025)), ("flag", r.random() < 0.5),
                               ("tags", r.choice(TOPICS))])
            return m.FieldCondition(key=key, match=m.MatchValue(value=v))
        if kind == "any":
            return m.FieldCondition(key=r.choice(["meta.topic", "tags"]), match=m.MatchAny(any=r.sample(TOPICS, 2)))
        if kind == "except":
            return m.FieldCondition(key=r.choice(["meta.topic", "tags"]), match=m.MatchExcept(**{"except": r.sample(TOPICS, 2)}))
        if kind == "text":
            return m.FieldCondition(key="title", match=m.MatchText(text=" ".join(r.sample(WORDS, r.randint(1, 2)))))
        if kind == "range":
            key = r.choice(["year", "price", "meta.n"])
            lo = {"year": 1990, "price": 0, "meta.n": 0}[key] + r.uniform(0, 20)
            return m.FieldCondition(key=key, range=m.Range(gte=lo, lt=lo + r.uniform(5, 40)))
        if kind == "is_empty":
            return m.IsEmptyCondition(is_empty=m.PayloadField(key=r.choice(["tags", "maybe", "meta.lang", "nope"])))
        if kind == "is_null":
            return m.IsNullCondition(is_null=m.PayloadField(key=r.choice(["maybe", "tags", "meta.topic"])))
        if kind == "has_id":
            return m.HasIdCondition(has_id=r.sample(self.ids, min(len(self.ids), r.randint(1, 20))))
        if kind == "nested key":
            return m.FieldCondition(key="meta.n", range=m.Range(lte=r.randint(0, 50)))
        if kind == "array key":
            return m.FieldCondition(key="items[].v", match=m.MatchValue(value=r.choice(TOPICS)))
        return m.NestedCondition(nested=m.Nested(key="items", filter=m.Filter(must=[
            m.FieldCondition(key="k", match=m.MatchValue(value=r.randint(0, 3))),
            m.FieldCondition(key="v", match=m.MatchValue(value=r.choice(TOPICS)))])))

    def _filter(self, p: float = 0.6):
        r, m = self.rng, self.m
        if r.random() > p:
            return None
        f = m.Filter()
        shape = r.choice(["must", "must", "should", "must_not", "min_should", "mixed"])
        self.counts[f"filter {shape}"] += shape in ("should", "must_not", "min_should")
        if shape in ("must", "mixed"):
            f.must = [self._condition() for _ in range(r.randint(1, 2))]
        if shape in ("should", "mixed"):
            f.should = [self._condition() for _ in range(r.randint(1, 3))]
        if shape in ("must_not", "mixed"):
            f.must_not = [self._condition()]
        if shape == "min_should":
            conds = [self._condition() for _ in range(3)]
            f.min_should = m.MinShould(conditions=conds, min_count=r.randint(1, 2))
        return f

    # ------------------------------------------------------------ comparing

    def _norm(self, points, scored: bool):
        """(id, score, payload, vector) per point, ties in id order."""
        rows = []
        for p in points:
            rows.append((p.id, getattr(p, "score", None) if scored else None, p.payload, p.vector))
        if scored:
            out, i = [], 0
            while i < len(rows):
                j = i
                while j + 1 < len(rows) and abs(rows[j + 1][1] - rows[i][1]) <= 1e-6:
                    j += 1
                out.extend(sorted(rows[i:j + 1], key=lambda x: (isinstance(x[0], str), str(x[0]) if isinstance(x[0], str) else x[0])))
                i = j + 1
            rows = out
        return rows

    def _same_vec(self, a, b) -> bool:
        if isinstance(a, dict) or isinstance(b, dict):
            if not isinstance(a, dict) or not isinstance(b, dict) or set(a) != set(b):
                return False
            return all(self._same_vec(a[k], b[k]) for k in a)
        if hasattr(a, "indices") or hasattr(b, "indices"):
            return list(a.indices) == list(b.indices) and all(abs(x - y) <= 1e-5 for x, y in zip(a.values, b.values)) \
                and len(a.values) == len(b.values)
        if a is None or b is None:
            return a is None and b is None
        return len(a) == len(b) and all(abs(x - y) <= 1e-4 for x, y in zip(a, b))

    @staticmethod
    def _tie_run(rows, at_end: bool) -> int:
        """How many rows at the end (or start) tie with the last (first)."""
        if not rows:
            return 0
        seq = rows[::-1] if at_end else rows
        n = 1
        while n < len(seq) and abs(seq[n][1] - seq[0][1]) <= 1e-6:
            n += 1
        return n

    def _cut_ties(self, a, b, cut_start: bool, cut_end: bool):
        """``a`` and ``b`` without the runs of ties at a cut (the offset at
        the start, the limit at the end) when they hold different points but
        agree in length and score: which tied points make the cut is up to
        rounding on each side."""
        if len(a) != len(b) or not a:
            return a, b
        for at_end, cut in ((False, cut_start), (True, cut_end)):
            if not cut or not a:
                continue
            na, nb = self._tie_run(a, at_end), self._tie_run(b, at_end)
            edge = -1 if at_end else 0
            ra, rb = (a[-na:], b[-nb:]) if at_end else (a[:na], b[:nb])
            if na == nb and {x[0] for x in ra} != {x[0] for x in rb} \
                    and abs(a[edge][1] - b[edge][1]) <= 1e-4 * max(1.0, abs(b[edge][1])):
                a, b = (a[:-na], b[:-nb]) if at_end else (a[na:], b[nb:])
        return a, b

    def _compare(self, what: str, ours, ref, scored: bool = True, cut_start: bool = False,
                 cut_end: bool = False) -> None:
        a, b = self._norm(ours, scored), self._norm(ref, scored)
        if scored:
            a, b = self._cut_ties(a, b, cut_start, cut_end)
        self.checks += 1
        if [x[0] for x in a] != [x[0] for x in b]:
            raise Mismatch(f"{what}: ids {[x[0] for x in a]} != reference {[x[0] for x in b]}")
        for x, y in zip(a, b):
            if scored and abs(x[1] - y[1]) > 1e-4 * max(1.0, abs(y[1])):
                raise Mismatch(f"{what}: point {x[0]} score {x[1]} != reference {y[1]}")
            if x[2] != y[2]:
                raise Mismatch(f"{what}: point {x[0]} payload {x[2]} != reference {y[2]}")
            if not self._same_vec(x[3], y[3]):
                raise Mismatch(f"{what}: point {x[0]} vector {x[3]} != reference {y[3]}")

    def _both(self, fn):
        return fn(self.ours), fn(self.ref)

    # ------------------------------------------------------------ operations

    def upsert(self, n: int, replace: float = 0.0) -> None:
        m, r = self.m, self.rng
        pts = []
        chosen = set()
        for _ in range(n):
            if self.ids and r.random() < replace:
                i = r.choice(self.ids)
                if i in chosen:
                    continue
                self.counts["upsert replace"] += 1
            else:
                i = self._new_id()
                self.ids.append(i)
            chosen.add(i)
            pts.append(m.PointStruct(id=i, vector=self._vector(), payload=self._payload()))
        if not pts:
            return
        for c in (self.ours, self.ref):
            c.upsert(self.name, points=pts, wait=True)

    def op(self) -> None:
        r, m = self.rng, self.m
        self.ops += 1
        ops = ["upsert", "delete ids", "delete filter", "set", "set key", "overwrite", "delete payload", "clear",
               "count", "scroll", "retrieve"]
        ops += ["dense"] * 3 + ["by id"] if self.dense else []
        ops += ["sparse"] * 3 if self.sparse else []
        ops += ["rrf", "dbsf", "rescore"] if len(self.dense) + len(self.sparse) >= 1 else []
        ops += ["mmr", "rrf weights", "groups", "groups"]
        kind = r.choice(ops)
        name = self.name
        if not self.ids and kind in ("delete ids", "retrieve", "set", "set key", "overwrite", "delete payload", "clear"):
            kind = "upsert"
        if kind == "upsert":
            self.upsert(r.randint(1, 20), replace=0.5)
        elif kind in ("delete ids", "delete filter"):
            if kind == "delete ids":
                gone = r.sample(self.ids, min(len(self.ids), r.randint(1, 5)))
                sel: Any = m.PointIdsList(points=gone)
                self.counts["delete by id"] += 1
            else:
                f = m.Filter(must=[self._condition()])
                sel = m.FilterSelector(filter=f)
                self.counts["delete by filter"] += 1
            for c in (self.ours, self.ref):
                c.delete(name, points_selector=sel, wait=True)
            self._refresh_ids()
        elif kind in ("set", "set key", "overwrite", "delete payload", "clear"):
            self._payload_edit(kind)
        elif kind == "count":
            self.counts["count"] += 1
            f = self._filter(0.9)
            a, b = self._both(lambda c: c.count(name, count_filter=f, exact=True).count)
            self.checks += 1
            if a != b:
                raise Mismatch(f"count {f}: {a} != reference {b}")
        elif kind == "scroll":
            self.counts["scroll"] += 1
            f = self._filter()
            lim = r.randint(1, 50)
            off = r.choice(self.ids) if self.ids and r.random() < 0.3 and all(isinstance(i, int) for i in self.ids) else None
            wv = r.random() < 0.3
            (pa, na), (pb, nb) = self._both(lambda c: c.scroll(name, scroll_filter=f, limit=lim, offset=off, with_payload=True, with_vectors=wv))
            self._compare(f"scroll {f}", pa, pb, scored=False)
            self.checks += 1
            if na != nb:
                raise Mismatch(f"scroll next offset {na} != reference {nb}")
        elif kind == "groups":
            self._groups()
        elif kind == "retrieve":
            self.counts["retrieve"] += 1
            want = r.sample(self.ids, min(len(self.ids), r.randint(1, 10)))
            a, b = self._both(lambda c: c.retrieve(name, ids=want, with_payload=True, with_vectors=True))
            key = lambda p: (isinstance(p.id, str), str(p.id))  # noqa: E731
            self._compare(f"retrieve {want}", sorted(a, key=key), sorted(b, key=key), scored=False)
        else:
            self._query(kind)

    def _refresh_ids(self) -> None:
        alive = set()
        offset = None
        while True:
            page, offset = self.ref.scroll(self.name, limit=1000, offset=offset, with_payload=False)
            alive.update(p.id for p in page)
            if offset is None:
                break
        self.ids = [i for i in self.ids if i in alive]

    def _payload_edit(self, kind: str) -> None:
        r, m = self.rng, self.m
        if not self.ids:
            return
        by_filter = r.random() < 0.4
        ids = r.sample(self.ids, min(len(self.ids), r.randint(1, 6)))
        f = m.Filter(must=[self._condition()]) if by_filter else None
        sel: Dict[str, Any] = {"points": f} if by_filter else {"points": ids}
        name = self.name
        if kind == "set":
            self.counts["set payload"] += 1
            payload = {"extra": r.randint(0, 9), "year": None} if r.random() < 0.5 else {"tags": r.sample(TOPICS, 2)}
            for c in (self.ours, self.ref):
                c.set_payload(name, payload=payload, wait=True, **sel)
        elif kind == "set key":
            self.counts["set payload key"] += 1
            key = r.choice(["meta", "meta.deep", "items[]", "fresh"])
            payload = {"q": r.randint(0, 9)} if r.random() < 0.7 else {"topic": None}
            for c in (self.ours, self.ref):
                c.set_payload(name, payload=payload, key=key, wait=True, **sel)
        elif kind == "overwrite":
            self.counts["overwrite payload"] += 1
            payload = self._payload()
            for c in (self.ours, self.ref):
                c.overwrite_payload(name, payload=payload, wait=True, **sel)
        elif kind == "delete payload":
            self.counts["delete payload"] += 1
            keys = r.sample(["tags", "meta.topic", "title", "items[].k", "maybe", "nope"], r.randint(1, 3))
            for c in (self.ours, self.ref):
                c.delete_payload(name, keys=keys, wait=True, **sel)
        else:
            self.counts["clear payload"] += 1
            for c in (self.ours, self.ref):
                c.clear_payload(name, points_selector=f if by_filter else m.PointIdsList(points=ids), wait=True)
        # The edited points, read back from both sides.
        want = ids if not by_filter else r.sample(self.ids, min(len(self.ids), 10))
        a, b = self._both(lambda c: c.retrieve(name, ids=want, with_payload=True))
        key = lambda p: (isinstance(p.id, str), str(p.id))  # noqa: E731
        self._compare(f"{kind} then retrieve", sorted(a, key=key), sorted(b, key=key), scored=False)

    def _leaf(self):
        """A prefetch leaf: a dense or sparse nearest query in some space."""
        r, m = self.rng, self.m
        spaces = [(n, "d") for n in self.dense] + [(n, "s") for n in self.sparse]
        n, k = r.choice(spaces)
        q = self._dense(self.dense[n][0]) if k == "d" else self._sparse_vec()
        return m.Prefetch(query=q, using=n or None, limit=r.randint(5, 40), filter=self._filter(0.3),
                          params=m.SearchParams(exact=True) if k == "d" else None)

    def _mmr_query(self, using: str, sparse: bool):
        """A nearest query re-ranked by MMR in the space ``using``, by a
        random vector or (dense) a point's id; ``None`` when the point
        drawn lacks that space."""
        r, m = self.rng, self.m
        mmr = m.Mmr(diversity=r.choice([None, round(r.random(), 3), 0.0, 1.0]),
                    candidates_limit=r.choice([None, r.randint(0, 40)]))
        if not sparse and self.ids and r.random() < 0.25:
            target = r.choice(self.ids)
            pt = self.ref.retrieve(self.name, ids=[target], with_vectors=True)[0]
            vec = pt.vector if not isinstance(pt.vector, dict) else pt.vector.get(using)
            if vec is None:
                return None
            self.counts["mmr by id"] += 1
            return m.NearestQuery(nearest=target, mmr=mmr)
        q = self._sparse_vec(r.randint(1, 6)) if sparse else self._dense(self.dense[using][0])
        return m.NearestQuery(nearest=q, mmr=mmr)

    def _groups(self) -> None:
        """A grouped query (``query_points_groups``): the groups' ids in
        order, and each group's hits."""
        r, m = self.rng, self.m
        self.counts["query groups"] += 1
        by = r.choice(["meta.topic", "year", "tags", "items[].k", "items[].v", "meta.lang", "flag", "price",
                       "maybe", "nope"])
        if by in ("tags", "items[].k", "items[].v", "meta.lang"):
            self.counts["groups array key"] += 1
        args: Dict[str, Any] = dict(group_by=by, query_filter=self._filter(0.4), limit=r.randint(1, 8),
                                    group_size=r.randint(1, 5), with_payload=r.random() < 0.8,
                                    with_vectors=r.random() < 0.2)
        spaces = [(n, "d") for n in self.dense] + [(n, "s") for n in self.sparse]
        n, k = r.choice(spaces)
        shape = r.choice(["nearest", "nearest", "none", "fused", "mmr"])
        if shape == "nearest":
            q = self._dense(self.dense[n][0]) if k == "d" else self._sparse_vec(r.randint(1, 6))
            args.update(query=q, using=n or None, search_params=m.SearchParams(exact=True) if k == "d" else None)
        elif shape == "fused":
            self.counts["groups fused"] += 1
            args.update(prefetch=[self._leaf() for _ in range(r.randint(1, 3))],
                        query=m.FusionQuery(fusion=r.choice([m.Fusion.RRF, m.Fusion.DBSF])))
        elif shape == "mmr":
            q = self._mmr_query(n, k == "s")
            if q is None:
                return
            self.counts["groups mmr"] += 1
            args.update(query=q, using=n or None, search_params=m.SearchParams(exact=True) if k == "d" else None)
        a, b = self._both(lambda c: c.query_points_groups(self.name, **args).groups)
        self.checks += 1
        ga, gb = [g.id for g in a], [g.id for g in b]
        if ga != gb:
            raise Mismatch(f"groups by {by} ({shape}): groups {ga} != reference {gb}")
        for x, y in zip(a, b):
            self._compare(f"groups by {by} ({shape}) group {x.id}", x.hits, y.hits,
                          cut_end=shape != "mmr" and len(y.hits) == args["group_size"])

    def _query(self, kind: str) -> None:
        r, m = self.rng, self.m
        name = self.name
        limit = r.randint(1, 25)
        offset = r.randint(0, 5) if r.random() < 0.3 else None
        if offset:
            self.counts["offset"] += 1
        f = self._filter()
        wv: Any = r.random() < 0.25
        args: Dict[str, Any] = dict(query_filter=f, limit=limit, offset=offset, with_payload=True, with_vectors=wv)
        if kind == "dense":
            self.counts["dense search"] += 1
            n = r.choice(list(self.dense))
            args.update(query=self._dense(self.dense[n][0]), using=n or None, search_params=m.SearchParams(exact=True))
            if r.random() < 0.25:
                self.counts["score threshold"] += 1
                args["score_threshold"] = r.uniform(-0.5, 0.8) if self.dense[n][1] != m.Distance.EUCLID else r.uniform(0.5, 2.5)
        elif kind == "sparse":
            self.counts["sparse search"] += 1
            n = r.choice(list(self.sparse))
            args.update(query=self._sparse_vec(r.randint(1, 6)), using=n)
        elif kind == "by id":
            if not self.ids:
                return
            self.counts["query by id"] += 1
            n = r.choice(list(self.dense))
            target = r.choice(self.ids)
            ref_pt = self.ref.retrieve(name, ids=[target], with_vectors=True)[0]
            vec = ref_pt.vector if not isinstance(ref_pt.vector, dict) else ref_pt.vector.get(n)
            if vec is None:
                return  # the point lacks this space: both sides answer 404 / KeyError
            args.update(query=target, using=n or None, search_params=m.SearchParams(exact=True))
        elif kind in ("rrf", "dbsf"):
            self.counts[f"prefetch {kind}"] += 1
            args.update(prefetch=[self._leaf() for _ in range(r.randint(1, 3))],
                        query=m.FusionQuery(fusion=m.Fusion.RRF if kind == "rrf" else m.Fusion.DBSF))
        elif kind == "rrf weights":
            self.counts["rrf weights"] += 1
            leaves = [self._leaf() for _ in range(r.randint(1, 3))]
            weights = [r.choice([round(r.uniform(0.1, 3.0), 3), 1.0, 0.0, -1.0]) for _ in leaves]
            args.update(prefetch=leaves, query=m.RrfQuery(rrf=m.Rrf(k=r.choice([None, r.randint(1, 80)]), weights=weights)))
        elif kind == "mmr":
            spaces = [(n, "d") for n in self.dense] + [(n, "s") for n in self.sparse]
            n, k = r.choice(spaces)
            q = self._mmr_query(n, k == "s")
            if q is None:
                return
            self.counts["mmr"] += 1
            args.update(query=q, using=n or None, search_params=m.SearchParams(exact=True) if k == "d" else None)
            if k == "d" and r.random() < 0.25:
                self.counts["score threshold"] += 1
                args["score_threshold"] = r.uniform(-0.5, 0.8) if self.dense[n][1] != m.Distance.EUCLID else r.uniform(0.5, 2.5)
        else:
            self.counts["rescore prefetch"] += 1
            spaces = [(n, "d") for n in self.dense] + [(n, "s") for n in self.sparse]
            n, k = r.choice(spaces)
            q = self._dense(self.dense[n][0]) if k == "d" else self._sparse_vec()
            args.update(prefetch=[self._leaf() for _ in range(r.randint(1, 2))], query=q, using=n or None,
                        search_params=m.SearchParams(exact=True) if k == "d" else None)
        a, b = self._both(lambda c: c.query_points(name, **args).points)
        # MMR's order is its own: only a cut of the plain ranking can split ties.
        cuts = kind != "mmr"
        self._compare(f"{kind} {args.get('using')}", a, b, cut_start=cuts and bool(offset),
                      cut_end=cuts and len(b) == limit)

    def run(self, n_points: int, n_ops: int) -> None:
        while len(self.ids) < n_points:
            self.upsert(min(100, n_points - len(self.ids)))
        for _ in range(n_ops):
            self.op()
        for c in (self.ours, self.ref):
            c.delete_collection(self.name)


def run(url: str, scenarios: int, seed: int = 0, points: int = 200, ops: int = 20, out: Optional[str] = None,
        progress: bool = True) -> Dict[str, Any]:
    """Runs the scenarios against the server at ``url``; returns (and writes
    to ``out``) the JSON report. A mismatch is reported with its scenario's
    seed and stops the run."""
    import warnings

    from qdrant_client import QdrantClient

    warnings.filterwarnings("ignore", module="qdrant_client")
    ours = QdrantClient(url=url, prefer_grpc=False, timeout=60, check_compatibility=False)
    counts: Counter = Counter()
    total_ops = total_checks = 0
    failures: List[Dict[str, Any]] = []
    t0 = time.time()
    bar = None
    if progress:
        try:
            from tqdm import tqdm

            bar = tqdm(total=scenarios, desc="conformance", unit="scenario", file=sys.stderr)
        except ImportError:
            bar = None
    for i in range(scenarios):
        ref = QdrantClient(":memory:")
        sc = Scenario(seed * 1_000_003 + i, ours, ref, counts)
        try:
            sc.run(points, ops)
        except Mismatch as e:
            failures.append({"scenario": i, "seed": seed * 1_000_003 + i, "error": str(e)[:2000]})
            try:
                ours.delete_collection(sc.name)
            except Exception:  # noqa: BLE001
                pass
            break
        finally:
            ref.close()
            total_ops += sc.ops
            total_checks += sc.checks
            if bar is not None:
                bar.update(1)
    if bar is not None:
        bar.close()
    import vectide

    report = {
        "benchmark": "conformance",
        "command": " ".join(["python", "-m", "vectide.conformance"] + sys.argv[1:]),
        "commit": vectide.build_commit(),
        "simd_isa": vectide.simd_isa(),
        "date": time.strftime("%Y-%m-%d"),
        "summary": {
            "scenarios": scenarios if not failures else failures[0]["scenario"],
            "operations": total_ops,
            "checks": total_checks,
            "unexplained_differences": len(failures),
            "per_feature": {f: counts.get(f, 0) for f in FEATURES},
        },
        "deliberate_differences": DELIBERATE,
        "failures": failures,
        "seconds": round(time.time() - t0, 1),
        "points_per_scenario": points,
        "operations_per_scenario": ops,
    }
    if out:
        with open(out, "w") as fh:
            json.dump(report, fh, indent=1)
    return report


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m vectide.conformance", description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", help="a running vectide serve (default: start one on loopback)")
    ap.add_argument("--scenarios", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--points", type=int, default=200)
    ap.add_argument("--ops", type=int, default=20)
    ap.add_argument("--out", default="conformance.json")
    a = ap.parse_args(argv)
    if a.points < 200 or a.ops < 20:
        ap.error("a scenario has at least 200 points and 20 operations")
    if a.url:
        report = run(a.url, a.scenarios, a.seed, a.points, a.ops, a.out)
    else:
        import tempfile

        from .torture.badinput import Server, _cli

        with tempfile.TemporaryDirectory() as d:
            srv = Server(_cli(None), __import__("pathlib").Path(d) / "db")
            srv.start()
            try:
                report = run(f"http://127.0.0.1:{srv.port}", a.scenarios, a.seed, a.points, a.ops, a.out)
            finally:
                srv.stop()
    s = report["summary"]
    print(f"{s['scenarios']} scenarios, {s['operations']} operations, {s['checks']} checks, "
          f"{s['unexplained_differences']} unexplained differences ({report['seconds']} s)")
    for f in report["failures"]:
        print(f"  seed {f['seed']}: {f['error']}")
    return 0 if not report["failures"] else 1


if __name__ == "__main__":
    sys.exit(main())
