"""LlamaIndex (``llama-index-vector-stores-qdrant``) against ``vectide
serve``, unmodified.

Run with the LlamaIndex venv's python (``.venv-fw-llamaindex/bin/python``;
``$VECTIDE_BIN`` names the vectide binary). ``QdrantVectorStore`` in its
default (dense) mode and with ``enable_hybrid=True`` -- the sparse side from
the test's own ``sparse_doc_fn`` / ``sparse_query_fn``, so no fastembed
model is loaded -- under a ``VectorStoreIndex`` built from ``TextNode``s
with metadata and the test's own embed model: retrieval with and without
``MetadataFilters``, the sparse and hybrid query modes (LlamaIndex fuses
client-side, relative score fusion), sync and async clients,
``delete(ref_doc_id)``, ``delete_nodes``, ``get_nodes`` and counts; every
answer is compared with the brute-force one of the same embeddings. Prints
one JSON summary line; exit 1 on any mismatch.
"""

from __future__ import annotations

import asyncio
import uuid

import fwcommon as fw
import qdrant_client
from llama_index.core import Settings, StorageContext, VectorStoreIndex
from llama_index.core.embeddings import BaseEmbedding
from llama_index.core.schema import NodeRelationship, RelatedNodeInfo, TextNode
from llama_index.core.vector_stores import (
    FilterCondition,
    FilterOperator,
    MetadataFilter,
    MetadataFilters,
    VectorStoreQuery,
)
from llama_index.vector_stores.qdrant import QdrantVectorStore

K = 3
NS = uuid.UUID("0b9d7e0a-55f1-4f0e-8a43-8a3f3f9d2c71")
Q_DENSE = "rust memory safety"
Q_HYBRID = "bread dough"
Q_SPARSE = "python packages memory"
Q_AFTER = "borrow rust"  # hybrid after the cooking nodes are gone


class WordEmbedding(BaseEmbedding):
    """The test's dense embedding (``fwcommon.dense_embed``) as LlamaIndex's."""

    def _get_query_embedding(self, query: str) -> list[float]:
        return fw.dense_embed(query)

    async def _aget_query_embedding(self, query: str) -> list[float]:
        return fw.dense_embed(query)

    def _get_text_embedding(self, text: str) -> list[float]:
        return fw.dense_embed(text)


def sparse_fn(texts: list[str]) -> tuple[list[list[int]], list[list[float]]]:
    """The test's sparse embedding in the shape of a ``SparseEncoderCallable``."""
    out = [fw.sparse_embed(t) for t in texts]
    return [i for i, _ in out], [v for _, v in out]


def node_id(key: str) -> str:
    return str(uuid.uuid5(NS, key))


KEY_OF = {node_id(k): k for k in list(fw.TEXTS) + ["d13"]}


def nodes() -> list[TextNode]:
    """The corpus as nodes: metadata ``topic`` / ``year`` / ``key``, left out
    of the embedded text (so the embedding is of the text alone), and one
    source document per topic (``ref_doc_id`` = ``doc-TOPIC``)."""
    out = []
    for k, text in fw.TEXTS.items():
        meta = dict(fw.META[k], key=k)
        out.append(
            TextNode(
                id_=node_id(k),
                text=text,
                metadata=meta,
                excluded_embed_metadata_keys=list(meta),
                excluded_llm_metadata_keys=list(meta),
                relationships={NodeRelationship.SOURCE: RelatedNodeInfo(node_id=f"doc-{meta['topic']}")},
            )
        )
    return out


def keys(results) -> list[str]:
    return [r.node.metadata["key"] for r in results]


def mf(*filters: MetadataFilter, condition: FilterCondition = FilterCondition.AND) -> MetadataFilters:
    return MetadataFilters(filters=list(filters), condition=condition)


FILTERS = {
    # name: (MetadataFilters, which keys it keeps)
    "topic == python": (mf(MetadataFilter(key="topic", value="python")), lambda m: m["topic"] == "python"),
    "year >= 2016": (mf(MetadataFilter(key="year", value=2016, operator=FilterOperator.GTE)), lambda m: m["year"] >= 2016),
    "topic in [rust, cooking]": (
        mf(MetadataFilter(key="topic", value=["rust", "cooking"], operator=FilterOperator.IN)),
        lambda m: m["topic"] in ("rust", "cooking"),
    ),
    "topic != rust and year < 2020": (
        mf(
            MetadataFilter(key="topic", value="rust", operator=FilterOperator.NE),
            MetadataFilter(key="year", value=2020, operator=FilterOperator.LT),
        ),
        lambda m: m["topic"] != "rust" and m["year"] < 2020,
    ),
    "topic == astronomy or year <= 2012": (
        mf(
            MetadataFilter(key="topic", value="astronomy"),
            MetadataFilter(key="year", value=2012, operator=FilterOperator.LTE),
            condition=FilterCondition.OR,
        ),
        lambda m: m["topic"] == "astronomy" or m["year"] <= 2012,
    ),
    # unindexed full-text match: whole lower-cased words (qdrant_client.local)
    "topic text_match 'Cooking'": (
        mf(MetadataFilter(key="topic", value="Cooking", operator=FilterOperator.TEXT_MATCH)),
        lambda m: m["topic"] == "cooking",
    ),
    "topic nin [rust, python]": (
        mf(MetadataFilter(key="topic", value=["rust", "python"], operator=FilterOperator.NIN)),
        lambda m: m["topic"] not in ("rust", "python"),
    ),
    "not (year > 2015)": (
        mf(MetadataFilter(key="year", value=2015, operator=FilterOperator.GT), condition=FilterCondition.NOT),
        lambda m: not m["year"] > 2015,
    ),
    "is_empty(missing)": (
        mf(MetadataFilter(key="missing", value=None, operator=FilterOperator.IS_EMPTY)),
        lambda m: True,
    ),
}


def count(client: qdrant_client.QdrantClient, name: str) -> int:
    return client.count(name, exact=True).count


def dense_mode(s: fw.Scenario) -> None:
    name = "li-dense"
    client = qdrant_client.QdrantClient(url=s.url)
    aclient = qdrant_client.AsyncQdrantClient(url=s.url)
    docs = dict(fw.TEXTS)
    index = None

    with s.check("default: VectorStoreIndex from nodes"):
        store = QdrantVectorStore(collection_name=name, client=client, aclient=aclient)
        index = VectorStoreIndex(nodes(), storage_context=StorageContext.from_defaults(vector_store=store))
        fw.eq(count(client, name), len(docs), "count")
        info = client.get_collection(name)
        fw.eq(info.config.params.vectors.size, fw.DIM, "unnamed dense vector size")
    if index is None:
        return

    with s.check("default: retrieve top k with cosine scores"):
        got = index.as_retriever(similarity_top_k=K).retrieve(Q_DENSE)
        want = fw.rank_dense(Q_DENSE, docs, K)
        fw.eq(keys(got), fw.keys_of(want), Q_DENSE)
        for r, (k, w) in zip(got, want):
            if abs(r.score - w) > 1e-4:
                raise AssertionError(f"score of {k}: got {r.score}, want {w}")

    for fname, (filters, keep) in FILTERS.items():
        with s.check(f"default: retrieve with MetadataFilters {fname}"):
            got = index.as_retriever(similarity_top_k=K, filters=filters).retrieve(Q_DENSE)
            fw.eq(keys(got), fw.keys_of(fw.rank_dense(Q_DENSE, docs, K, lambda k: keep(fw.META[k]))), fname)

    with s.check("default: VectorStoreQuery restricted to node_ids and to doc_ids"):
        some = ["d02", "d05", "d09", "d11"]
        res = store.query(VectorStoreQuery(query_embedding=fw.dense_embed(Q_DENSE), similarity_top_k=K,
                                           node_ids=[node_id(k) for k in some]))
        fw.eq([KEY_OF[i] for i in res.ids], fw.keys_of(fw.rank_dense(Q_DENSE, docs, K, lambda k: k in some)), "node_ids")
        res = store.query(VectorStoreQuery(query_embedding=fw.dense_embed(Q_DENSE), similarity_top_k=K,
                                           doc_ids=["doc-python", "doc-astronomy"]))
        want = fw.rank_dense(Q_DENSE, docs, K, lambda k: fw.META[k]["topic"] in ("python", "astronomy"))
        fw.eq([KEY_OF[i] for i in res.ids], fw.keys_of(want), "doc_ids")

    with s.check("default: async retrieve (AsyncQdrantClient)"):
        got = asyncio.run(index.as_retriever(similarity_top_k=K).aretrieve(Q_DENSE))
        fw.eq(keys(got), fw.keys_of(fw.rank_dense(Q_DENSE, docs, K)), "aretrieve")

    with s.check("default: get_nodes by id and by filter"):
        got = store.get_nodes(node_ids=[node_id("d03"), node_id("d08")])
        fw.eq(sorted(n.metadata["key"] for n in got), ["d03", "d08"], "by id")
        got = store.get_nodes(filters=FILTERS["topic == python"][0])
        fw.eq(sorted(n.metadata["key"] for n in got), ["d04", "d05", "d06"], "by filter")

    with s.check("default: delete(ref_doc_id) removes that document's nodes"):
        store.delete("doc-rust")
        for k in [k for k in docs if fw.META[k]["topic"] == "rust"]:
            del docs[k]
        fw.eq(count(client, name), len(docs), "count after delete(ref_doc_id)")
        fw.eq(keys(index.as_retriever(similarity_top_k=K).retrieve(Q_DENSE)), fw.keys_of(fw.rank_dense(Q_DENSE, docs, K)), "after delete")

    with s.check("default: delete_nodes(node_ids)"):
        gone = fw.keys_of(fw.rank_dense(Q_DENSE, docs, K))[:2]
        store.delete_nodes(node_ids=[node_id(k) for k in gone])
        for k in gone:
            del docs[k]
        fw.eq(count(client, name), len(docs), "count after delete_nodes")
        fw.eq(keys(index.as_retriever(similarity_top_k=K).retrieve(Q_DENSE)), fw.keys_of(fw.rank_dense(Q_DENSE, docs, K)), "after delete_nodes")

    with s.check("default: delete_nodes(filters)"):
        store.delete_nodes(filters=FILTERS["year >= 2016"][0])
        docs = {k: t for k, t in docs.items() if fw.META[k]["year"] < 2016}
        fw.eq(count(client, name), len(docs), "count after delete_nodes(filters)")
        fw.eq(keys(index.as_retriever(similarity_top_k=K).retrieve(Q_DENSE)), fw.keys_of(fw.rank_dense(Q_DENSE, docs, K)), "after")

    with s.check("default: insert_nodes then clear"):
        extra = TextNode(id_=node_id("d13"), text="Rust memory safety without a garbage collector", metadata={"topic": "rust", "year": 2024, "key": "d13"},
                         excluded_embed_metadata_keys=["topic", "year", "key"])
        index.insert_nodes([extra])
        docs["d13"] = extra.text
        fw.eq(keys(index.as_retriever(similarity_top_k=K).retrieve(Q_DENSE)), fw.keys_of(fw.rank_dense(Q_DENSE, docs, K)), "after insert")
        store.clear()
        fw.eq(client.collection_exists(name), False, "exists after clear")


def hybrid_mode(s: fw.Scenario) -> None:
    name = "li-hybrid"
    client = qdrant_client.QdrantClient(url=s.url)
    aclient = qdrant_client.AsyncQdrantClient(url=s.url)
    docs = dict(fw.TEXTS)
    index = None

    with s.check("hybrid: VectorStoreIndex from nodes (named dense + sparse vectors)"):
        store = QdrantVectorStore(
            collection_name=name, client=client, aclient=aclient, enable_hybrid=True,
            sparse_doc_fn=sparse_fn, sparse_query_fn=sparse_fn, batch_size=5,
        )
        index = VectorStoreIndex(nodes(), storage_context=StorageContext.from_defaults(vector_store=store))
        fw.eq(count(client, name), len(docs), "count")
        params = client.get_collection(name).config.params
        fw.eq(sorted(params.vectors), ["text-dense"], "dense vector names")
        fw.eq(sorted(params.sparse_vectors or {}), ["text-sparse-new"], "sparse vector names")
    if index is None:
        return

    def hybrid_expected(q: str, keep=lambda _k: True, alpha: float = 0.5) -> list[str]:
        return fw.relative_score_fusion(
            fw.rank_dense(q, docs, K, keep), fw.rank_sparse(q, docs, K, keep), alpha=alpha, top_k=K
        )

    with s.check("hybrid: hybrid query mode (relative score fusion of dense and sparse)"):
        r = index.as_retriever(similarity_top_k=K, sparse_top_k=K, vector_store_query_mode="hybrid")
        fw.eq(keys(r.retrieve(Q_HYBRID)), hybrid_expected(Q_HYBRID), Q_HYBRID)

    with s.check("hybrid: hybrid query mode with alpha 0.8"):
        r = index.as_retriever(similarity_top_k=K, sparse_top_k=K, vector_store_query_mode="hybrid", alpha=0.8)
        fw.eq(keys(r.retrieve(Q_HYBRID)), hybrid_expected(Q_HYBRID, alpha=0.8), Q_HYBRID)

    with s.check("hybrid: sparse query mode"):
        r = index.as_retriever(similarity_top_k=K, sparse_top_k=K, vector_store_query_mode="sparse")
        got = r.retrieve(Q_SPARSE)
        want = fw.rank_sparse(Q_SPARSE, docs, K)
        fw.eq(keys(got), fw.keys_of(want), Q_SPARSE)
        for x, (k, w) in zip(got, want):
            if abs(x.score - w) > 1e-4:
                raise AssertionError(f"sparse score of {k}: got {x.score}, want {w}")

    with s.check("hybrid: default query mode searches the named dense vector"):
        got = index.as_retriever(similarity_top_k=K).retrieve(Q_DENSE)
        fw.eq(keys(got), fw.keys_of(fw.rank_dense(Q_DENSE, docs, K)), Q_DENSE)

    for fname in ("topic == python", "year >= 2016", "topic == astronomy or year <= 2012"):
        filters, keep = FILTERS[fname]
        with s.check(f"hybrid: hybrid query mode with MetadataFilters {fname}"):
            r = index.as_retriever(similarity_top_k=K, sparse_top_k=K, vector_store_query_mode="hybrid", filters=filters)
            fw.eq(keys(r.retrieve(Q_HYBRID)), hybrid_expected(Q_HYBRID, lambda k: keep(fw.META[k])), fname)

    with s.check("hybrid: async hybrid retrieve (AsyncQdrantClient)"):
        r = index.as_retriever(similarity_top_k=K, sparse_top_k=K, vector_store_query_mode="hybrid")
        fw.eq(keys(asyncio.run(r.aretrieve(Q_HYBRID))), hybrid_expected(Q_HYBRID), "aretrieve")

    with s.check("hybrid: delete(ref_doc_id) then hybrid query"):
        store.delete("doc-cooking")
        for k in [k for k in docs if fw.META[k]["topic"] == "cooking"]:
            del docs[k]
        fw.eq(count(client, name), len(docs), "count after delete")
        r = index.as_retriever(similarity_top_k=K, sparse_top_k=K, vector_store_query_mode="hybrid")
        fw.eq(keys(r.retrieve(Q_AFTER)), hybrid_expected(Q_AFTER), "after delete")


def main() -> None:
    Settings.embed_model = WordEmbedding()
    Settings.llm = None  # no LLM anywhere: retrieval only (MockLLM, no download)
    with fw.Scenario("llamaindex") as s:
        dense_mode(s)
        hybrid_mode(s)


if __name__ == "__main__":
    main()
