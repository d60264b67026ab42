"""``python -m vectide.bench sparse --out FILE.json``: exact sparse search and
hybrid search on real text, embedded.

The passages of ``minilm-debian-docs-384-angular`` (train rows as documents,
the held-apart test rows as queries) become sparse term vectors
(:mod:`vectide.sparse_text`: deterministic words, English stop words left
out unless ``--keep-stopwords``, FNV-1a indices, BM25-style document
weights, the collection's IDF modifier on the query side). Then, in one run on one thread:

* **Sparse**: exact top-10 by Vectide (``Collection.query`` on the sparse
  space, one query per call) against ``scipy.sparse`` doing the same exact
  work the smart way (the CSC columns of the query's terms, weighted by
  their IDF, summed; the top 10 by ``argpartition``; only documents sharing
  a term with the query; ties by id). The answers must be identical:
  ``sparse_mismatches`` counts queries whose ids differ.
* **Hybrid**: the median latency over the queries of a prefetch of 100
  dense (default knob) and 100 sparse candidates fused by RRF, against the
  dense query alone, on the same collection. The database runs with
  ``--threads`` (all cores by default): a hybrid query's two prefetches
  then run side by side, one thread each; every search itself, and every
  other query here, runs on one thread, one query at a time.

JSON ``summary``: ``sparse_qps_ratio_vs_scipy``, ``sparse_mismatches``,
``hybrid_latency_over_dense``.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np

DATASET = "minilm-debian-docs-384-angular"


def _scipy_index(docs: List[Dict[str, list]]):
    """The documents as a CSC matrix (documents x compact term columns)."""
    import scipy.sparse as sp

    col_of: Dict[int, int] = {}
    rows, cols, vals = [], [], []
    for r, d in enumerate(docs):
        for i, v in zip(d["indices"], d["values"]):
            c = col_of.setdefault(i, len(col_of))
            rows.append(r)
            cols.append(c)
            vals.append(np.float32(v))
    m = sp.csc_matrix((np.asarray(vals, dtype=np.float64), (rows, cols)), shape=(len(docs), len(col_of)))
    m.sort_indices()
    return m, col_of


def scipy_top(m, col_of: Dict[int, int], n_docs: int, q: Dict[str, list], k: int) -> List[int]:
    """Exact top-``k`` of a query over the CSC matrix: the query's columns,
    weighted by Qdrant's IDF (as f32, as the collection computes it),
    summed into the scores of the documents they hold; best first, ties by
    id; documents sharing no term are no answers."""
    scores = np.zeros(n_docs, dtype=np.float64)
    touched = []
    for i in q["indices"]:
        c = col_of.get(i)
        if c is None:
            continue
        lo, hi = m.indptr[c], m.indptr[c + 1]
        df = hi - lo
        w = float(np.float32(math.log((n_docs - df + 0.5) / (df + 0.5) + 1)))
        rows = m.indices[lo:hi]
        scores[rows] += w * m.data[lo:hi]
        touched.append(rows)
    if not touched:
        return []
    cand = np.unique(np.concatenate(touched))
    s = scores[cand].astype(np.float32)
    if len(cand) > k:
        part = np.argpartition(-s, k - 1)[:k]
        kth = s[part].min()
        keep = s >= kth  # every tie of the k-th, then ordered by id
        cand, s = cand[keep], s[keep]
    order = np.lexsort((cand, -s))
    return [int(x) for x in cand[order][:k]]


def run(out: Optional[str], max_docs: Optional[int], n_queries: int, k: int = 10, dataset: str = DATASET,
        keep_stopwords: bool = False, threads: Optional[int] = None) -> dict:
    import vectide
    from vectide import datasets
    from vectide.bench.ann import machine_info, write_json
    from vectide.sparse_text import Bm25

    texts = datasets.passages(dataset)
    ds = datasets.load(dataset)
    train = texts["train"][:max_docs] if max_docs else texts["train"]
    test = texts["test"][:n_queries]
    dense = ds.train[: len(train)]
    qdense = ds.test[: len(test)]
    enc = (Bm25(stopwords=()) if keep_stopwords else Bm25()).fit(t["text"] for t in train)
    docs = [enc.document(t["text"]) for t in train]
    queries = [enc.query(t["text"]) for t in test]
    import os

    db_threads = threads or os.cpu_count() or 1
    res: Dict[str, object] = {"benchmark": "sparse", "dataset": dataset, "documents": len(docs),
                              "queries": len(queries), "k": k, "threads": 1, "db_threads": db_threads,
                              "tokenizer": "vectide.sparse_text (words, %s, FNV-1a indices, BM25 k1 1.2 b 0.75, IDF modifier)"
                              % ("every word kept" if keep_stopwords else "English stop words left out")}
    with tempfile.TemporaryDirectory() as tmp:
        db = vectide.connect(Path(tmp) / "db", threads=db_threads)
        c = db.create_collection("p", vectors={"dense": {"dim": dense.shape[1], "metric": "cosine"}},
                                 sparse_vectors={"bm25": {"modifier": "idf"}})
        t0 = time.perf_counter()
        for lo in range(0, len(docs), 2000):
            c.upsert_points([{"id": i, "vector": {"dense": dense[i], "bm25": docs[i]}}
                             for i in range(lo, min(lo + 2000, len(docs)))])
        res["load_s"] = round(time.perf_counter() - t0, 2)
        m, col_of = _scipy_index(docs)
        # Sparse: best of 3 timed passes each.
        ours_ids: List[List[int]] = []
        best_ours = best_scipy = float("inf")
        for rep in range(3):
            t0 = time.perf_counter()
            got = [c.query(q, using="bm25", limit=k, with_payload=False) for q in queries]
            best_ours = min(best_ours, time.perf_counter() - t0)
            if rep == 0:
                ours_ids = [[int(h.id) for h in g] for g in got]
        for _ in range(3):
            t0 = time.perf_counter()
            ref = [scipy_top(m, col_of, len(docs), q, k) for q in queries]
            best_scipy = min(best_scipy, time.perf_counter() - t0)
        mismatches = sum(a != b for a, b in zip(ours_ids, ref))
        res["sparse"] = {"vectide_qps": round(len(queries) / best_ours, 1), "scipy_qps": round(len(queries) / best_scipy, 1),
                         "mismatches": mismatches}
        # Hybrid against dense alone, per-query latencies.
        lat_dense, lat_hybrid = [], []
        for qd, qs in zip(qdense, queries):
            t0 = time.perf_counter()
            c.query(qd, using="dense", limit=k, with_payload=False)
            lat_dense.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            c.query({"fusion": "rrf"}, prefetch=[{"query": qd, "using": "dense", "limit": 100},
                                                 {"query": qs, "using": "bm25", "limit": 100}],
                    limit=k, with_payload=False)
            lat_hybrid.append(time.perf_counter() - t0)
        res["hybrid"] = {"dense_median_ms": round(statistics.median(lat_dense) * 1e3, 3),
                         "hybrid_median_ms": round(statistics.median(lat_hybrid) * 1e3, 3)}
        db.close()
    info = machine_info()
    info["simd_isa"] = vectide.simd_isa()
    res["machine"] = info
    res["command"] = " ".join(["python", "-m", "vectide.bench", "sparse"] + sys.argv[2:])
    res["commit"] = vectide.build_commit()
    res["date"] = time.strftime("%Y-%m-%d")
    res["summary"] = {
        "sparse_qps_ratio_vs_scipy": round(res["sparse"]["vectide_qps"] / res["sparse"]["scipy_qps"], 3),
        "sparse_mismatches": mismatches,
        "hybrid_latency_over_dense": round(res["hybrid"]["hybrid_median_ms"] / res["hybrid"]["dense_median_ms"], 3),
    }
    if out:
        write_json(res, out)
    return res


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m vectide.bench sparse", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", help="write the results as JSON")
    p.add_argument("--dataset", default=DATASET, help=f"a text dataset with passages (default {DATASET})")
    p.add_argument("--max-docs", type=int, default=None, help="the first N passages only (default: all)")
    p.add_argument("--queries", type=int, default=1000)
    p.add_argument("--threads", type=int, default=None,
                   help="the database's threads (default: all cores); a hybrid query's prefetches share them")
    p.add_argument("--keep-stopwords", action="store_true",
                   help="keep English stop words in the vectors (a heavier workload: longer queries, longer lists)")
    a = p.parse_args(argv)
    if a.threads is not None and a.threads < 1:
        p.error("--threads must be at least 1")
    r = run(a.out, a.max_docs, a.queries, dataset=a.dataset, keep_stopwords=a.keep_stopwords, threads=a.threads)
    print(json.dumps(r["summary"]))
    return 0 if r["summary"]["sparse_mismatches"] == 0 else 1
