"""faiss (PyPI ``faiss-cpu``): ``IndexHNSWFlat``, the IVF FastScan indexes
with exact re-ranking (RaBitQ and PQ 4-bit codes), and ``IndexIVFFlat`` under
a runbook."""

from __future__ import annotations

import time
from typing import Dict, Optional

import numpy as np

from .base import _import, _check_metric, _metric_data, _unit_rows, IVF_NLIST_RULE, _ivf_nlist, _serialized_bytes, Engine, _PeerEngine, Stream


class FaissHnswEngine(Engine):
    """``faiss.IndexHNSWFlat``; cosine is inner product on normalised vectors."""

    name = "faiss-hnsw"

    def __init__(self) -> None:
        super().__init__()
        self.index = None
        self.metric = None

    def check(self):
        return _import("faiss", "faiss-cpu")

    def build(self, train, metric, m, ef_construction, threads):
        _check_metric(metric)
        faiss = self.check()
        self.faiss = faiss
        self.metric = metric
        n, dim = train.shape
        faiss.omp_set_num_threads(int(threads))
        fmetric = faiss.METRIC_L2 if metric == "l2" else faiss.METRIC_INNER_PRODUCT
        self.index = faiss.IndexHNSWFlat(dim, int(m), fmetric)
        self.index.hnsw.efConstruction = int(ef_construction)
        data = _unit_rows(train) if metric == "cosine" else np.ascontiguousarray(train, dtype=np.float32)
        t0 = time.perf_counter()
        self.index.add(data)
        build_s = time.perf_counter() - t0
        del data
        # Searches are issued one query per call from one Python thread, like
        # every other engine; an OpenMP team per call would only add overhead.
        faiss.omp_set_num_threads(1)
        self._base_params(
            metric, m, ef_construction, threads, faiss_metric="L2" if metric == "l2" else "INNER_PRODUCT",
            search_omp_threads=1,
        )
        self.params["version"] = getattr(faiss, "__version__", None)
        return build_s

    def prepare_queries(self, queries):
        q = _unit_rows(queries) if self.metric == "cosine" else np.ascontiguousarray(queries, dtype=np.float32)
        return q.reshape(q.shape[0], 1, q.shape[1])  # each item is a (1, d) row

    def set_ef(self, ef):
        self.index.hnsw.efSearch = int(ef)

    def query(self, q, k):
        if q.ndim == 1:
            q = q.reshape(1, -1)
        _, labels = self.index.search(q, k)
        return labels[0]

    def close(self):
        self.index = None


class _FaissIvfRefineEngine(_PeerEngine):
    """A faiss IVF index over compressed codes with exact re-ranking
    (``...,RFlat``: ``IndexRefineFlat`` keeps the float32 vectors), built by
    ``index_factory`` with ``_ivf_nlist(n)`` lists; ``build_s`` covers
    ``train`` and ``add``. Cosine is inner product over unit vectors. The
    faiss wiki gives two search parameters, ``nprobe`` and the re-ranking
    ``k_factor``; the sweep's value ``v`` maps onto ``nprobe = min(v, nlist)``
    and ``max(100, 4 v)`` re-ranked candidates (``k_factor`` = that / k), so
    that a larger value probes more lists and re-ranks more. The factor 4
    follows the measured nprobe x k_factor frontier (clustered-20k-32, both
    metrics, both faiss IVF peers, k = 10): the QPS at recall 0.99 was 2-3x
    that of ``max(100, v)`` (ScaNN's adapter's rule), 8 v did no better and
    16 v was slower."""

    knob = "nprobe"
    REFINE_MIN, REFINE_PER_PROBE = 100, 4

    def __init__(self) -> None:
        super().__init__()
        self.index = None
        self.ivf = None
        self.nlist = 1
        self.refine = self.REFINE_MIN
        self._k: Optional[int] = None

    def check(self):
        return _import("faiss", "faiss-cpu")

    def factory(self, dim: int) -> str:
        raise NotImplementedError

    def _built(self, faiss, dim: int) -> Dict[str, object]:
        """Extra ``index_params`` read off the built index."""
        return {}

    def build(self, train, metric, m, ef_construction, threads):
        _check_metric(metric)
        faiss = self.check()
        self.metric = metric
        data = _metric_data(train, metric)
        n, dim = data.shape
        self.nlist = _ivf_nlist(n)
        fmetric = faiss.METRIC_L2 if metric == "l2" else faiss.METRIC_INNER_PRODUCT
        spec = self.factory(dim)
        faiss.omp_set_num_threads(int(threads))
        self.index = faiss.index_factory(dim, spec, fmetric)
        t0 = time.perf_counter()
        self.index.train(data)
        self.index.add(data)
        build_s = time.perf_counter() - t0
        del data
        faiss.omp_set_num_threads(1)  # one query per call, as for faiss-hnsw
        self.ivf = faiss.downcast_index(faiss.extract_index_ivf(self.index))
        self._k = None
        self._peer_params(
            metric, m, ef_construction, threads, getattr(faiss, "__version__", None),
            index_params={"index_factory": spec, "faiss_metric": "L2" if metric == "l2" else "INNER_PRODUCT",
                          "nlist": self.nlist, "nlist_rule": IVF_NLIST_RULE,
                          "ivf_class": type(self.ivf).__name__, **self._built(faiss, dim)},
            search="index.search(q[None, :], k) with ivf.nprobe and the refine stage's k_factor, one query per "
            "call; omp_set_num_threads(1). Sweep value v: nprobe = min(v, nlist), k_factor = max(100, 4 v) / k",
            source=self.SOURCE,
            build_s_covers="index.train (k-means and the codec) and index.add",
            search_omp_threads=1,
        )
        return build_s

    def prepare_queries(self, queries):
        q = _metric_data(queries, self.metric or "l2")
        return q.reshape(q.shape[0], 1, q.shape[1])  # each item is a (1, d) row

    def search_params(self, value):
        nprobe, refine = self._mapped(value)
        return {"nprobe": nprobe, "refine_candidates": refine}

    def _mapped(self, value: int):
        return min(int(value), self.nlist), max(self.REFINE_MIN, self.REFINE_PER_PROBE * int(value))

    def set_ef(self, ef):
        nprobe, self.refine = self._mapped(ef)
        self.ivf.nprobe = nprobe
        self._k = None  # k_factor is set on the next query, which knows k

    def query(self, q, k):
        if k != self._k:
            self.index.k_factor = max(self.refine, k) / k
            self._k = k
        return self.index.search(q, k)[1][0]

    def index_bytes(self):
        if self.index is None:
            return None
        import faiss

        return _serialized_bytes(lambda path: faiss.write_index(self.index, path))

    def close(self):
        self.index = self.ivf = None


class FaissIvfRabitqEngine(_FaissIvfRefineEngine):
    """faiss ``RR{d},IVF{nlist},RaBitQfs,RFlat``: a random rotation (which
    RaBitQ requires), IVF over 1-bit RaBitQ FastScan codes
    (``IndexIVFRaBitQFastScan``, queries quantised to its default ``qb`` bits)
    and exact re-ranking of the candidates."""

    name = "faiss-ivf-rabitq"
    SOURCE = (
        "faiss wiki 'Guidelines to choose an index' (RaBitQ: random rotation preprocessing, FastScan variant "
        "IVFK,RaBitQfs for faster search; IVF K = 4*sqrt(N) below 1M vectors) and 'The index factory' (RR, "
        "RFlat re-ranking); 1-bit codes + RFlat as the 'Faiss IVF RaBitQfs raw + RFlat' configuration of "
        "RaBitQ-Library's IVF benchmark (docs/benchmarks/ivf.md), searched by nprobe and k_factor"
    )

    def factory(self, dim):
        return f"RR{dim},IVF{self.nlist},RaBitQfs,RFlat"

    def _built(self, faiss, dim):
        return {"rabitq_nb_bits": int(self.ivf.rabitq.nb_bits), "qb": int(self.ivf.qb)}


class FaissIvfPqfsEngine(_FaissIvfRefineEngine):
    """faiss ``IVF{nlist},PQ{M}x4fs,RFlat``: IVF over 4-bit PQ FastScan
    codes (``IndexIVFPQFastScan``) with exact re-ranking, the faiss wiki's
    choice next to HNSW when memory is not a concern ("faster than HNSW").
    ``M = d / 2`` sub-quantizers (2 dimensions per 4-bit code, as the PQ
    FastScan baseline of RaBitQ-Library's IVF benchmark; ``M = d`` for odd
    ``d``)."""

    name = "faiss-ivf-pqfs"
    SOURCE = (
        "faiss wiki 'Guidelines to choose an index' ('Is memory a concern? If not: HNSWM or ... "
        "IVF1024,PQNx4fs,RFlat', faster than HNSW, tuned by nprobe and k_factor; IVF K = 4*sqrt(N) below 1M "
        "vectors); PQ M = d/2 as the 'Faiss IVF PQfs + RFlat' baseline of RaBitQ-Library's IVF benchmark "
        "(docs/benchmarks/ivf.md)"
    )

    @staticmethod
    def pq_m(dim: int) -> int:
        return dim // 2 if dim % 2 == 0 else dim

    def factory(self, dim):
        return f"IVF{self.nlist},PQ{self.pq_m(dim)}x4fs,RFlat"

    def _built(self, faiss, dim):
        return {"pq_m": self.pq_m(dim), "pq_nbits": 4, "bbs": int(self.ivf.bbs)}


class FaissIvfStream(Stream):
    """faiss ``IndexIVFFlat`` with ids (``add_with_ids`` / ``remove_ids``),
    its quantiser trained before the first step (untimed) on a seeded sample
    of the whole dataset; cosine as inner product over unit vectors. The
    issue asked for ``IndexIDMap(IndexIVFFlat)``, but IndexIDMap's
    ``remove_ids`` aborts the process on an IVF index (faiss 1.15 asserts
    that the sub-index renumbers like a flat one, which IVF does not); IVF
    keeps the ids itself, so the map adds nothing."""

    name = "faiss-ivf"
    #: How it keeps its index clean after deletes, as the results say.
    policy = "remove_ids() removes at once; no consolidation needed"
    knob = "nprobe"

    def __init__(self, spec):
        super().__init__(spec)
        self.faiss = _import("faiss", "faiss-cpu")
        nlist = int(spec.get("params", {}).get("nlist", 1024))
        metric = self.faiss.METRIC_L2 if self.metric == "l2" else self.faiss.METRIC_INNER_PRODUCT
        self.quantizer = self.faiss.IndexFlat(self.dim, metric)
        self.ivf = self.faiss.IndexIVFFlat(self.quantizer, self.dim, nlist, metric)
        self.index = self.ivf
        self.params = {"index": "IndexIVFFlat", "nlist": nlist, "metric": "L2" if self.metric == "l2" else "INNER_PRODUCT",
                       "version": self.faiss.__version__}

    def train(self, sample: np.ndarray) -> None:
        self.faiss.omp_set_num_threads(self.threads)
        self.ivf.train(np.ascontiguousarray(sample, dtype=np.float32))
        self.params["train_rows"] = int(len(sample))

    def insert(self, ids, X):
        self.faiss.omp_set_num_threads(self.threads)
        self.index.add_with_ids(np.ascontiguousarray(X), ids.astype(np.int64))

    def delete(self, ids):
        self.faiss.omp_set_num_threads(self.threads)
        self.index.remove_ids(self.faiss.IDSelectorBatch(ids.astype(np.int64)))

    def set_knob(self, value):
        self.faiss.omp_set_num_threads(1)
        self.ivf.nprobe = int(value)

    def query(self, q, k):
        return self.index.search(q.reshape(1, -1), k)[1][0]
