"""The deterministic tokenizer and BM25-style weights (``vectide.sparse_text``),
and BM25 end to end: a collection's IDF modifier turns the dot product of
these vectors into the BM25 score a brute-force computation gives."""

from __future__ import annotations

import math

import pytest

from vectide.sparse_text import Bm25, term_index, words

vectide = pytest.importorskip("vectide._vectide") and __import__("vectide")


def test_words_and_indices_are_deterministic():
    assert words("The Quick brown-fox, 3rd_time!") == ["the", "quick", "brown", "fox", "3rd", "time"]
    # FNV-1a 32-bit reference values.
    assert term_index("") == 0x811C9DC5
    assert term_index("a") == 0xE40C292C
    assert term_index("foobar") == 0xBF9CF968
    assert all(0 <= term_index(w) < 2**32 for w in ["x", "é", "数据"])


def test_document_and_query_weights():
    enc = Bm25().fit(["x y z w", "x x"])  # avglen 3
    v = enc.document("x x y")
    tf, dl = {term_index("x"): 2, term_index("y"): 1}, 3
    for i, x in zip(v["indices"], v["values"]):
        f = tf[i]
        assert x == pytest.approx(f * 2.2 / (f + 1.2 * (0.25 + 0.75 * dl / 3)))
    assert v["indices"] == sorted(v["indices"])
    q = enc.query("y X x")
    assert sorted(q["indices"]) == sorted({term_index("x"), term_index("y")}) and q["values"] == [1.0, 1.0]
    with pytest.raises(ValueError):
        Bm25(b=2)


def test_stop_words_are_left_out_unless_asked_for():
    enc = Bm25().fit(["the rust compiler", "a borrow checker is strict"])  # avglen 2.5 words kept
    assert enc.avglen == 2.5
    assert enc.document("The Rust compiler") == enc.document("rust compiler")
    assert enc.query("what is the") == {"indices": [], "values": []}
    assert enc.query("The rust") == enc.query("rust")
    every = Bm25(stopwords=()).fit(["the rust compiler"])
    assert every.avglen == 3 and term_index("the") in every.query("the rust")["indices"]
    custom = Bm25(stopwords=["Rust"])
    assert custom.query("rust the") == {"indices": [term_index("the")], "values": [1.0]}
    with pytest.raises(TypeError, match="stopwords"):
        Bm25(stopwords="the")


def test_idf_modifier_makes_the_dot_product_bm25(tmp_path):
    docs = ["rust vector search", "python search tutorial", "rust rust borrow checker",
            "vector databases store vectors", "search engines rank documents"]
    enc = Bm25().fit(docs)
    with vectide.connect(tmp_path / "db") as db:
        c = db.create_collection("t", sparse_vectors={"bm25": {"modifier": "idf"}})
        c.upsert_points([{"id": i, "vector": {"bm25": enc.document(t)}} for i, t in enumerate(docs)])
        hits = c.query(enc.query("rust search"), using="bm25", limit=5)

    def bm25(q, d):
        n = len(docs)
        s = 0.0
        for w in set(words(q)):
            df = sum(w in words(x) for x in docs)
            idf = math.log((n - df + 0.5) / (df + 0.5) + 1)
            f = words(d).count(w)
            if f:
                s += idf * f * 2.2 / (f + 1.2 * (0.25 + 0.75 * len(words(d)) / enc.avglen))
        return s

    want = sorted(((bm25("rust search", d), i) for i, d in enumerate(docs) if bm25("rust search", d) > 0),
                  key=lambda x: (-x[0], x[1]))
    assert [h.id for h in hits] == [i for _, i in want]
    for h, (s, _) in zip(hits, want):
        assert h.score == pytest.approx(s, rel=1e-5)


def test_the_sparse_benchmark_agrees_with_scipy_on_the_text_sample(tmp_path):
    """``bench sparse`` on the committed text sample (2,000 passages, 200
    queries held apart): Vectide's exact sparse answers are scipy's, id for
    id; the JSON carries the keys the issue names."""
    pytest.importorskip("scipy")
    from vectide import datasets
    from vectide.bench import sparse

    datasets.prepare(datasets.TEXT_SAMPLE, verbose=False)
    r = sparse.run(str(tmp_path / "s.json"), max_docs=None, n_queries=200, dataset=datasets.TEXT_SAMPLE, threads=2)
    assert r["documents"] == 2000 and r["queries"] == 200 and r["db_threads"] == 2
    s = r["summary"]
    assert s["sparse_mismatches"] == 0
    assert set(s) == {"sparse_qps_ratio_vs_scipy", "sparse_mismatches", "hybrid_latency_over_dense"}
    assert s["sparse_qps_ratio_vs_scipy"] > 0 and s["hybrid_latency_over_dense"] > 0


def test_scipy_top_breaks_ties_by_id_and_skips_documents_without_a_shared_term():
    pytest.importorskip("scipy")
    from vectide.bench.sparse import _scipy_index, scipy_top

    docs = [{"indices": [1], "values": [1.0]}, {"indices": [2], "values": [5.0]},
            {"indices": [1], "values": [1.0]}, {"indices": [1, 2], "values": [1.0, 1.0]}]
    m, col_of = _scipy_index(docs)
    assert scipy_top(m, col_of, 4, {"indices": [1], "values": [1.0]}, 2) == [0, 2]
    assert scipy_top(m, col_of, 4, {"indices": [9], "values": [1.0]}, 2) == []
