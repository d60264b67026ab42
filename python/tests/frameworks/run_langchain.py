"""LangChain (``langchain-qdrant``) against ``vectide serve``, unmodified.

Run with the LangChain venv's python (``.venv-fw-langchain/bin/python``;
``$VECTIDE_BIN`` names the vectide binary). ``QdrantVectorStore`` in each
retrieval mode -- DENSE, SPARSE (the test's own ``SparseEmbeddings``, so
fastembed is never needed) and HYBRID (RRF of the two) -- stores the corpus
of ``fwcommon`` with metadata, searches it with and without a
``qdrant_client.models.Filter`` on ``metadata.*``, deletes by id and counts
through the store's client; every answer is compared with the brute-force
one of the same embeddings. Prints one JSON summary line; exit 1 on any
mismatch.
"""

from __future__ import annotations

import uuid

import fwcommon as fw
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_qdrant import QdrantVectorStore, RetrievalMode, SparseEmbeddings, SparseVector
from qdrant_client import models

K = 3
NS = uuid.UUID("6f1c3f52-0d4e-4a57-9d43-3b8f5c1e2a10")


class WordEmbeddings(Embeddings):
    """The test's dense embedding (``fwcommon.dense_embed``) as LangChain's."""

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return [fw.dense_embed(t) for t in texts]

    def embed_query(self, text: str) -> list[float]:
        return fw.dense_embed(text)


class WordSparse(SparseEmbeddings):
    """The test's sparse embedding (``fwcommon.sparse_embed``)."""

    def embed_documents(self, texts: list[str]) -> list[SparseVector]:
        return [self.embed_query(t) for t in texts]

    def embed_query(self, text: str) -> SparseVector:
        idx, val = fw.sparse_embed(text)
        return SparseVector(indices=idx, values=val)


def point_id(key: str, mode: RetrievalMode):
    """UUID strings in two modes, integers in the third: both id kinds."""
    if mode == RetrievalMode.SPARSE:
        return int(key[1:])
    return str(uuid.uuid5(NS, key))


def keys(docs: list[Document]) -> list[str]:
    return [d.metadata["key"] for d in docs]


def topic_filter(topic: str) -> models.Filter:
    return models.Filter(must=[models.FieldCondition(key="metadata.topic", match=models.MatchValue(value=topic))])


def year_filter(gte: int) -> models.Filter:
    return models.Filter(must=[models.FieldCondition(key="metadata.year", range=models.Range(gte=gte))])


def expected(mode: RetrievalMode, query: str, docs: dict[str, str], k: int, keep=lambda _k: True) -> list[str]:
    if mode == RetrievalMode.DENSE:
        return fw.keys_of(fw.rank_dense(query, docs, k, keep))
    if mode == RetrievalMode.SPARSE:
        return fw.keys_of(fw.rank_sparse(query, docs, k, keep))
    # HYBRID: each prefetch is limited to k, then RRF (k=2) to k
    dense = fw.keys_of(fw.rank_dense(query, docs, k, keep))
    sparse = fw.keys_of(fw.rank_sparse(query, docs, k, keep))
    return fw.rrf([dense, sparse], k)


QUERIES = {
    RetrievalMode.DENSE: "rust memory safety",
    RetrievalMode.SPARSE: "python packages memory",
    RetrievalMode.HYBRID: "comets gas",
}


def scenario(s: fw.Scenario, mode: RetrievalMode) -> None:
    name = f"lc-{mode.value}"
    docs = dict(fw.TEXTS)
    q = QUERIES[mode]
    dense = None if mode == RetrievalMode.SPARSE else WordEmbeddings()
    sparse = None if mode == RetrievalMode.DENSE else WordSparse()
    store: QdrantVectorStore | None = None

    with s.check(f"{mode.value}: from_texts with metadatas and ids"):
        keys_ = list(docs)
        store = QdrantVectorStore.from_texts(
            [docs[k] for k in keys_],
            embedding=dense,
            metadatas=[dict(fw.META[k], key=k) for k in keys_],
            ids=[point_id(k, mode) for k in keys_],
            collection_name=name,
            url=s.url,
            retrieval_mode=mode,
            sparse_embedding=sparse,
            force_recreate=True,
        )
        fw.eq(store.client.count(name, exact=True).count, len(docs), "count after from_texts")
    if store is None:
        return

    with s.check(f"{mode.value}: reopen with from_existing_collection (validates the collection config)"):
        store = QdrantVectorStore.from_existing_collection(
            name, embedding=dense, retrieval_mode=mode, sparse_embedding=sparse, url=s.url
        )

    with s.check(f"{mode.value}: similarity_search"):
        fw.eq(keys(store.similarity_search(q, k=K)), expected(mode, q, docs, K), q)

    with s.check(f"{mode.value}: similarity_search_with_score scores"):
        got = store.similarity_search_with_score(q, k=K)
        if mode == RetrievalMode.DENSE:
            want = fw.rank_dense(q, docs, K)
        elif mode == RetrievalMode.SPARSE:
            want = fw.rank_sparse(q, docs, K)
        else:  # RRF of the two prefetches (k each)
            d = fw.keys_of(fw.rank_dense(q, docs, K))
            sp = fw.keys_of(fw.rank_sparse(q, docs, K))
            want = fw.rrf_scored([d, sp], K)
        fw.eq([d.metadata["key"] for d, _ in got], [k for k, _ in want], "order")
        for (doc, score), (key, w) in zip(got, want):
            if abs(score - w) > 1e-4:
                raise AssertionError(f"score of {key}: got {score}, want {w}")

    with s.check(f"{mode.value}: similarity_search with score_threshold and offset"):
        scored = store.similarity_search_with_score(q, k=K)
        cut = (scored[1][1] + scored[2][1]) / 2  # between the 2nd and 3rd score
        fw.eq(keys(store.similarity_search(q, k=K, score_threshold=cut)), expected(mode, q, docs, K)[:2], "threshold")
        if mode != RetrievalMode.HYBRID:  # (an offset of a fused query skips fused results, not prefetched ones)
            fw.eq(keys(store.similarity_search(q, k=2, offset=1)), expected(mode, q, docs, K)[1:3], "offset")

    with s.check(f"{mode.value}: similarity_search with a metadata.topic filter"):
        for topic in ("python", "cooking"):
            keep = lambda k, t=topic: fw.META[k]["topic"] == t  # noqa: E731
            fw.eq(keys(store.similarity_search(q, k=K, filter=topic_filter(topic))), expected(mode, q, docs, K, keep), topic)

    with s.check(f"{mode.value}: similarity_search with a metadata.year range filter"):
        keep = lambda k: fw.META[k]["year"] >= 2016  # noqa: E731
        fw.eq(keys(store.similarity_search(q, k=K, filter=year_filter(2016))), expected(mode, q, docs, K, keep), "year>=2016")

    with s.check(f"{mode.value}: get_by_ids"):
        got = store.get_by_ids([point_id("d02", mode), point_id("d07", mode)])
        fw.eq(sorted((d.metadata["key"], d.page_content) for d in got), [("d02", docs["d02"]), ("d07", docs["d07"])])

    with s.check(f"{mode.value}: delete(ids) and count"):
        top = expected(mode, q, docs, K)[0]
        fw.eq(store.delete(ids=[point_id(top, mode)]), True, "delete returned")
        del docs[top]
        fw.eq(store.client.count(name, exact=True).count, len(docs), "count after delete")
        fw.eq(keys(store.similarity_search(q, k=K)), expected(mode, q, docs, K), "search after delete")

    with s.check(f"{mode.value}: add_texts then search finds the new text"):
        new = {"d13": "Rust async tasks and Python coroutines both wait on gas free memory packages"}
        store.add_texts(list(new.values()), metadatas=[{"topic": "mixed", "year": 2024, "key": "d13"}], ids=[point_id("d13", mode)])
        docs.update(new)
        fw.eq(store.client.count(name, exact=True).count, len(docs), "count after add_texts")
        fw.eq(keys(store.similarity_search(q, k=K)), expected(mode, q, docs, K), "search after add")
        keep = lambda k: k == "d13" or fw.META[k]["topic"] == "python"  # noqa: E731
        flt = models.Filter(should=[
            models.FieldCondition(key="metadata.topic", match=models.MatchAny(any=["python", "mixed"])),
        ])
        fw.eq(keys(store.similarity_search(q, k=K, filter=flt)), expected(mode, q, docs, K, keep), "match any")

    if mode == RetrievalMode.DENSE:
        with s.check("dense: max_marginal_relevance_search (Qdrant MMR)"):
            got = keys(store.max_marginal_relevance_search(q, k=3, fetch_k=6, lambda_mult=0.5))
            fw.eq(got, fw.mmr(q, docs, 3, 6, diversity=0.5), "mmr")

    with s.check(f"{mode.value}: delete the collection"):
        fw.eq(store.client.delete_collection(name), True)
        fw.eq(store.client.collection_exists(name), False)


def main() -> None:
    with fw.Scenario("langchain") as s:
        for mode in (RetrievalMode.DENSE, RetrievalMode.SPARSE, RetrievalMode.HYBRID):
            scenario(s, mode)


if __name__ == "__main__":
    main()
