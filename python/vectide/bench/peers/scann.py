"""ScaNN (PyPI ``scann``)."""

from __future__ import annotations

import math
import time

from .base import _import, _version, _check_metric, _metric_data, _PeerEngine


class ScannEngine(_PeerEngine):
    """Google ScaNN (PyPI ``scann``) as its documentation recommends for a few
    hundred thousand points (docs/algorithms.md rules of thumb and the
    README's GloVe example): a k-means tree of ``round(sqrt(n))`` leaves,
    anisotropic AH scoring with 2 dimensions per block (threshold 0.2; NaN,
    i.e. plain AH, for L2 as ScaNN's own ann-benchmarks entry does), exact
    re-scoring of the top 100. Cosine is dot product over unit vectors. The
    sweep's value ``v`` maps onto ``leaves_to_search = min(v, num_leaves)``
    and ``pre_reorder_num_neighbors = max(100, v)``, so that, as in ScaNN's
    own ann-benchmarks sweeps, a larger value searches more leaves and
    re-scores more candidates."""

    name = "scann"
    knob = "leaves_to_search"
    DIMS_PER_BLOCK, AVQ_THRESHOLD, REORDER = 2, 0.2, 100
    TRAINING_SAMPLE = 250_000  # the README example's sample

    def __init__(self) -> None:
        super().__init__()
        self.searcher = None
        self.num_leaves = 1
        self.leaves = 1
        self.reorder = self.REORDER

    def check(self):
        return _import("scann", "scann")

    def build(self, train, metric, m, ef_construction, threads):
        _check_metric(metric)
        scann = self.check()
        self.metric = metric
        n = train.shape[0]
        data = _metric_data(train, metric)
        measure = "squared_l2" if metric == "l2" else "dot_product"
        avq = float("nan") if metric == "l2" else self.AVQ_THRESHOLD
        self.num_leaves = max(1, round(math.sqrt(n)))
        sample = min(n, self.TRAINING_SAMPLE)
        t0 = time.perf_counter()
        builder = (
            scann.scann_ops_pybind.builder(data, 10, measure)
            # The build-time default of leaves to search (the README's 5 %) is
            # never used: every search passes its own.
            .tree(num_leaves=self.num_leaves, num_leaves_to_search=max(1, self.num_leaves // 20),
                  training_sample_size=sample)
            .score_ah(self.DIMS_PER_BLOCK, anisotropic_quantization_threshold=avq)
            .reorder(self.REORDER)
        )
        builder.set_n_training_threads(int(threads))
        self.searcher = builder.build()
        build_s = time.perf_counter() - t0
        del builder, data
        self.searcher.set_num_threads(1)
        self._peer_params(
            metric, m, ef_construction, threads, _version("scann", scann),
            index_params={"distance_measure": measure, "num_leaves": self.num_leaves,
                          "training_sample_size": sample, "dimensions_per_block": self.DIMS_PER_BLOCK,
                          "anisotropic_quantization_threshold": None if math.isnan(avq) else avq,
                          "reorder": self.REORDER, "training_threads": int(threads)},
            search="searcher.search(q, k, pre_reorder_num_neighbors, leaves_to_search), one query per call; "
            "set_num_threads(1). Sweep value v: leaves_to_search = min(v, num_leaves), "
            "pre_reorder_num_neighbors = max(100, v)",
            source="ScaNN docs/algorithms.md (num_leaves ~ sqrt(n), AH with 2 dims per block, rescore) and "
            "README example (score_ah(2, anisotropic_quantization_threshold=0.2), reorder(100), "
            "training_sample_size 250000); AVQ off for L2 as in ScaNN's ann-benchmarks config",
        )
        return build_s

    def search_params(self, value):
        leaves, reorder = self._mapped(value)
        return {"leaves_to_search": leaves, "pre_reorder_num_neighbors": reorder}

    def _mapped(self, value: int):
        return min(int(value), self.num_leaves), max(self.REORDER, int(value))

    def set_ef(self, ef):
        self.leaves, self.reorder = self._mapped(ef)

    def query(self, q, k):
        return self.searcher.search(q, k, max(self.reorder, k), self.leaves)[0]

    def close(self):
        self.searcher = None
