"""Haystack (``qdrant-haystack``) against ``vectide serve``, unmodified.

Run with the Haystack venv's python (``.venv-fw-haystack/bin/python``;
``$VECTIDE_BIN`` names the vectide binary). ``QdrantDocumentStore`` without
sparse embeddings (one unnamed dense vector) and with them (named
``text-dense`` + ``text-sparse``, with and without the IDF modifier):
``write_documents`` with meta, embedding and sparse embedding under each
duplicate policy, ``QdrantEmbeddingRetriever``,
``QdrantSparseEmbeddingRetriever`` and ``QdrantHybridRetriever`` (RRF, its
``rrf_k`` and ``rrf_weights``) with and without Haystack filters on
``meta.*``, ``filter_documents``, ``count_documents(_by_filter)``,
``delete_documents``, ``delete_by_filter``, ``update_by_filter`` and
``delete_all_documents``; every answer is compared with the brute-force one
of the same embeddings. Prints one JSON summary line; exit 1 on any
mismatch.
"""

from __future__ import annotations

import fwcommon as fw
from haystack import Document
from haystack.dataclasses import SparseEmbedding
from haystack.document_stores.errors import DuplicateDocumentError
from haystack.document_stores.types import DuplicatePolicy
from haystack_integrations.components.retrievers.qdrant import (
    QdrantEmbeddingRetriever,
    QdrantHybridRetriever,
    QdrantSparseEmbeddingRetriever,
)
from haystack_integrations.document_stores.qdrant import QdrantDocumentStore

K = 3
PREFETCH = 10  # the hybrid retriever's prefetches name no limit: Qdrant's default 10
Q_DENSE = "rust memory safety"
Q_SPARSE = "python packages memory"
Q_HYBRID = "comets gas"


def documents(sparse: bool) -> list[Document]:
    out = []
    for k, text in fw.TEXTS.items():
        idx, val = fw.sparse_embed(text)
        out.append(
            Document(
                id=k,
                content=text,
                meta=dict(fw.META[k]),
                embedding=fw.dense_embed(text),
                sparse_embedding=SparseEmbedding(indices=idx, values=val) if sparse else None,
            )
        )
    return out


def ids(docs: list[Document]) -> list[str]:
    return [d.id for d in docs]


def sparse_query(text: str) -> SparseEmbedding:
    idx, val = fw.sparse_embed(text)
    return SparseEmbedding(indices=idx, values=val)


def f_eq(field: str, value) -> dict:
    return {"field": f"meta.{field}", "operator": "==", "value": value}


FILTERS = {
    # name: (Haystack filter, which metadata it keeps)
    "topic == python": (f_eq("topic", "python"), lambda m: m["topic"] == "python"),
    "year >= 2016 and topic in [rust, cooking]": (
        {
            "operator": "AND",
            "conditions": [
                {"field": "meta.year", "operator": ">=", "value": 2016},
                {"field": "meta.topic", "operator": "in", "value": ["rust", "cooking"]},
            ],
        },
        lambda m: m["year"] >= 2016 and m["topic"] in ("rust", "cooking"),
    ),
    "topic != astronomy or year < 2012": (
        {
            "operator": "OR",
            "conditions": [
                {"field": "meta.topic", "operator": "!=", "value": "astronomy"},
                {"field": "meta.year", "operator": "<", "value": 2012},
            ],
        },
        lambda m: m["topic"] != "astronomy" or m["year"] < 2012,
    ),
    "not (topic not in [python, rust])": (
        {"operator": "NOT", "conditions": [{"field": "meta.topic", "operator": "not in", "value": ["python", "rust"]}]},
        lambda m: m["topic"] in ("python", "rust"),
    ),
}


def check_scores(got: list[Document], want: list[tuple[str, float]], what: str) -> None:
    fw.eq(ids(got), fw.keys_of(want), what)
    for d, (k, w) in zip(got, want):
        if d.score is None or abs(d.score - w) > 1e-4:
            raise AssertionError(f"{what}: score of {k}: got {d.score}, want {w}")


def dense_store(s: fw.Scenario) -> None:
    docs = dict(fw.TEXTS)
    store = QdrantDocumentStore(
        url=s.url, index="hs-dense", embedding_dim=fw.DIM, recreate_index=True, progress_bar=False,
        use_sparse_embeddings=False, write_batch_size=5, scroll_size=5,  # several upserts, scroll pages
    )

    with s.check("dense: write_documents and count_documents"):
        fw.eq(store.write_documents(documents(sparse=False)), len(docs), "written")
        fw.eq(store.count_documents(), len(docs), "count")

    with s.check("dense: write_documents duplicate policies (FAIL raises, SKIP writes none, OVERWRITE all)"):
        try:
            store.write_documents(documents(sparse=False)[:2], policy=DuplicatePolicy.FAIL)
        except DuplicateDocumentError:
            pass
        else:
            raise AssertionError("policy FAIL did not raise on existing ids")
        fw.eq(store.write_documents(documents(sparse=False)[:2], policy=DuplicatePolicy.SKIP), 0, "SKIP")
        fw.eq(store.write_documents(documents(sparse=False), policy=DuplicatePolicy.OVERWRITE), len(docs), "OVERWRITE")
        fw.eq(store.count_documents(), len(docs), "count")

    with s.check("dense: QdrantEmbeddingRetriever top k with cosine scores"):
        r = QdrantEmbeddingRetriever(document_store=store, top_k=K)
        check_scores(r.run(query_embedding=fw.dense_embed(Q_DENSE))["documents"], fw.rank_dense(Q_DENSE, docs, K), Q_DENSE)

    with s.check("dense: QdrantEmbeddingRetriever score_threshold"):
        want = fw.rank_dense(Q_DENSE, docs, K)
        r = QdrantEmbeddingRetriever(document_store=store, top_k=K, score_threshold=(want[1][1] + want[2][1]) / 2)
        fw.eq(ids(r.run(query_embedding=fw.dense_embed(Q_DENSE))["documents"]), fw.keys_of(want)[:2], "threshold")

    for name, (flt, keep) in FILTERS.items():
        with s.check(f"dense: QdrantEmbeddingRetriever with filter {name}"):
            r = QdrantEmbeddingRetriever(document_store=store, top_k=K, filters=flt)
            got = r.run(query_embedding=fw.dense_embed(Q_DENSE))["documents"]
            fw.eq(ids(got), fw.keys_of(fw.rank_dense(Q_DENSE, docs, K, lambda k: keep(fw.META[k]))), name)

    with s.check("dense: reopen the existing index (recreate_index=False validates its config)"):
        again = QdrantDocumentStore(url=s.url, index="hs-dense", embedding_dim=fw.DIM, progress_bar=False)
        fw.eq(again.count_documents(), len(docs), "count")

    with s.check("dense: QdrantEmbeddingRetriever group_by meta.topic"):
        r = QdrantEmbeddingRetriever(document_store=store, top_k=2, group_by="meta.topic", group_size=2)
        got = r.run(query_embedding=fw.dense_embed(Q_DENSE))["documents"]
        ranked = fw.keys_of(fw.rank_dense(Q_DENSE, docs, len(docs)))
        fw.eq(ids(got), [k for g in fw.groups(ranked, lambda k: fw.META[k]["topic"], 2, 2) for k in g], "groups")

    with s.check("dense: filter_documents and count_documents_by_filter"):
        for name, (flt, keep) in FILTERS.items():
            want = sorted(k for k in docs if keep(fw.META[k]))
            got = store.filter_documents(filters=flt)
            fw.eq(sorted(ids(got)), want, name)
            fw.eq(store.count_documents_by_filter(flt), len(want), f"count {name}")
        every = {d.id: d for d in store.filter_documents()}
        fw.eq(sorted(every), sorted(docs), "all")
        d = every["d05"]
        fw.eq((d.content, d.meta), (docs["d05"], fw.META["d05"]), "content and meta round trip")
        if not fw.close(d.embedding, fw.unit(fw.dense_embed(docs["d05"]))):  # stored normalised (cosine)
            raise AssertionError(f"embedding round trip: {d.embedding}")

    with s.check("dense: metadata field min/max and unique values (scrolled in pages of 5)"):
        years = [fw.META[k]["year"] for k in docs]
        fw.eq(store.get_metadata_field_min_max("year"), {"min": min(years), "max": max(years)}, "min/max")
        fw.eq(store.count_unique_metadata_by_filter(f_eq("topic", "rust"), ["topic", "year"]), {"topic": 1, "year": 3}, "unique")

    with s.check("dense: delete_documents and count"):
        top = fw.keys_of(fw.rank_dense(Q_DENSE, docs, K))[:2]
        store.delete_documents(top)
        for k in top:
            del docs[k]
        fw.eq(store.count_documents(), len(docs), "count")
        r = QdrantEmbeddingRetriever(document_store=store, top_k=K)
        fw.eq(ids(r.run(query_embedding=fw.dense_embed(Q_DENSE))["documents"]), fw.keys_of(fw.rank_dense(Q_DENSE, docs, K)), "after")

    with s.check("dense: delete_by_filter returns the number deleted"):
        gone = [k for k in docs if fw.META[k]["topic"] == "python"]
        fw.eq(store.delete_by_filter(f_eq("topic", "python")), len(gone), "deleted")
        for k in gone:
            del docs[k]
        fw.eq(store.count_documents(), len(docs), "count")

    with s.check("dense: update_by_filter then filter by the new meta"):
        keep = [k for k in docs if fw.META[k]["topic"] == "cooking"]
        fw.eq(store.update_by_filter(f_eq("topic", "cooking"), {"kitchen": True}), len(keep), "updated")
        fw.eq(sorted(ids(store.filter_documents(f_eq("kitchen", True)))), sorted(keep), "kitchen")
        fw.eq(store.count_documents(), len(docs), "count")

    with s.check("dense: delete_all_documents"):
        store.delete_all_documents()
        fw.eq(store.count_documents(), 0, "count")

    with s.check("dense: delete_all_documents(recreate_index=True)"):
        store.write_documents(documents(sparse=False))
        store.delete_all_documents(recreate_index=True)
        fw.eq(store.count_documents(), 0, "count")
        store.write_documents(documents(sparse=False)[:1])
        fw.eq(store.count_documents(), 1, "count after a write to the recreated index")


def sparse_store(s: fw.Scenario, idf: bool) -> None:
    tag = "sparse+idf" if idf else "sparse"
    docs = dict(fw.TEXTS)
    store = QdrantDocumentStore(
        url=s.url, index=f"hs-{'idf' if idf else 'sparse'}", embedding_dim=fw.DIM, recreate_index=True,
        progress_bar=False, use_sparse_embeddings=True, sparse_idf=idf,
        payload_fields_to_index=[{"field_name": "meta.topic", "field_schema": "keyword"}],
    )

    with s.check(f"{tag}: write_documents with embedding and sparse_embedding"):
        fw.eq(store.write_documents(documents(sparse=True)), len(docs), "written")
        fw.eq(store.count_documents(), len(docs), "count")

    with s.check(f"{tag}: reopen the existing index (named vectors validated)"):
        again = QdrantDocumentStore(url=s.url, index=store.index, embedding_dim=fw.DIM, progress_bar=False,
                                    use_sparse_embeddings=True, sparse_idf=idf)
        fw.eq(again.count_documents(), len(docs), "count")

    with s.check(f"{tag}: QdrantSparseEmbeddingRetriever top k with scores"):
        r = QdrantSparseEmbeddingRetriever(document_store=store, top_k=K)
        check_scores(r.run(query_sparse_embedding=sparse_query(Q_SPARSE))["documents"], fw.rank_sparse(Q_SPARSE, docs, K, use_idf=idf), Q_SPARSE)

    if idf:  # the rest is the same with or without the modifier
        return

    with s.check(f"{tag}: QdrantSparseEmbeddingRetriever with filters"):
        for name, (flt, keep) in FILTERS.items():
            r = QdrantSparseEmbeddingRetriever(document_store=store, top_k=K, filters=flt)
            got = r.run(query_sparse_embedding=sparse_query(Q_SPARSE))["documents"]
            fw.eq(ids(got), fw.keys_of(fw.rank_sparse(Q_SPARSE, docs, K, lambda k: keep(fw.META[k]))), name)

    with s.check(f"{tag}: QdrantEmbeddingRetriever on the named dense vector"):
        r = QdrantEmbeddingRetriever(document_store=store, top_k=K)
        check_scores(r.run(query_embedding=fw.dense_embed(Q_DENSE))["documents"], fw.rank_dense(Q_DENSE, docs, K), Q_DENSE)

    def hybrid_want(q: str, keep=lambda _k: True, k: int = 2, weights=None) -> list[tuple[str, float]]:
        # the retriever's prefetches are [sparse, dense]
        lists = [fw.keys_of(fw.rank_sparse(q, docs, PREFETCH, keep)), fw.keys_of(fw.rank_dense(q, docs, PREFETCH, keep))]
        return fw.rrf_scored(lists, K, k=k, weights=weights)

    with s.check(f"{tag}: QdrantHybridRetriever (RRF) with scores"):
        r = QdrantHybridRetriever(document_store=store, top_k=K)
        got = r.run(query_embedding=fw.dense_embed(Q_HYBRID), query_sparse_embedding=sparse_query(Q_HYBRID))["documents"]
        check_scores(got, hybrid_want(Q_HYBRID), Q_HYBRID)

    for name, (flt, keep) in FILTERS.items():
        with s.check(f"{tag}: QdrantHybridRetriever with filter {name}"):
            r = QdrantHybridRetriever(document_store=store, top_k=K, filters=flt)
            got = r.run(query_embedding=fw.dense_embed(Q_HYBRID), query_sparse_embedding=sparse_query(Q_HYBRID))["documents"]
            fw.eq(ids(got), fw.keys_of(hybrid_want(Q_HYBRID, lambda k: keep(fw.META[k]))), name)

    with s.check(f"{tag}: QdrantHybridRetriever rrf_k=60"):
        r = QdrantHybridRetriever(document_store=store, top_k=K, rrf_k=60)
        got = r.run(query_embedding=fw.dense_embed(Q_HYBRID), query_sparse_embedding=sparse_query(Q_HYBRID))["documents"]
        check_scores(got, hybrid_want(Q_HYBRID, k=60), "rrf_k=60")

    with s.check(f"{tag}: QdrantHybridRetriever rrf_weights=[3, 1] (sparse, dense)"):
        r = QdrantHybridRetriever(document_store=store, top_k=K, rrf_weights=[3.0, 1.0])
        got = r.run(query_embedding=fw.dense_embed(Q_HYBRID), query_sparse_embedding=sparse_query(Q_HYBRID))["documents"]
        check_scores(got, hybrid_want(Q_HYBRID, weights=[3.0, 1.0]), "rrf_weights")

    with s.check(f"{tag}: filter_documents returns both embeddings"):
        d = {x.id: x for x in store.filter_documents(f_eq("topic", "astronomy"))}
        fw.eq(sorted(d), ["d10", "d11", "d12"], "astronomy")
        idx, val = fw.sparse_embed(docs["d11"])
        got = d["d11"].sparse_embedding
        fw.eq(got is not None and list(got.indices), idx, "sparse indices round trip")
        if max(abs(a - b) for a, b in zip(got.values, val)) > 1e-6:
            raise AssertionError(f"sparse values round trip: {got.values} vs {val}")
        if not fw.close(d["d11"].embedding, fw.unit(fw.dense_embed(docs["d11"]))):  # stored normalised (cosine)
            raise AssertionError(f"dense embedding round trip: {d['d11'].embedding}")

    with s.check(f"{tag}: delete_documents then hybrid"):
        gone = fw.keys_of(hybrid_want(Q_HYBRID))[:1]
        store.delete_documents(gone)
        for k in gone:
            del docs[k]
        fw.eq(store.count_documents(), len(docs), "count")
        r = QdrantHybridRetriever(document_store=store, top_k=K)
        got = r.run(query_embedding=fw.dense_embed(Q_HYBRID), query_sparse_embedding=sparse_query(Q_HYBRID))["documents"]
        fw.eq(ids(got), fw.keys_of(hybrid_want(Q_HYBRID)), "after delete")


def main() -> None:
    with fw.Scenario("haystack") as s:
        dense_store(s)
        sparse_store(s, idf=False)
        sparse_store(s, idf=True)


if __name__ == "__main__":
    main()
