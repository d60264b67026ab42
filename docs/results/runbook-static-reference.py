# Run as: VECTIDE_DATA=data .venv/bin/python docs/results/runbook-static-reference.py 6,13,20,26
# (the clustered runbook of python -m vectide.bench runbook must have run once: it caches the runbook and its ground truth).
"""Static reference for the clustered runbook: at chosen search steps, a fresh-vamana
and an hnswlib index built statically on that step's active set, searched at knob 100."""
import sys, time, numpy as np, hnswlib, vectide
from vectide import datasets
from vectide.bench import runbooks as R
ds = datasets.load('glove-6b-50-angular')
cache = datasets.data_dir() / 'runbooks' / ds.name
rb, order, _ = R.load_runbook('clustered', ds, 200000, 0, cache)
prep = R.Prepared(ds, order, 1000, cache / f"order-{R._digest(order)}")
truth = R.ground_truth(prep, rb, 10, cache)
want = [int(x) for x in sys.argv[1].split(',')]
row_of = np.full(len(prep.data), -1, dtype=np.int64); si = 0
Q = np.asarray(prep.queries, dtype=np.float32)
for s in rb.steps:
    if s.operation == 'insert': row_of[s.start:s.end] = np.arange(s.start, s.end)
    elif s.operation == 'delete': row_of[s.start:s.end] = -1
    elif s.operation == 'search':
        if si in want:
            ids = np.flatnonzero(row_of >= 0); X = np.ascontiguousarray(prep.data[row_of[ids]], dtype=np.float32)
            g = truth[si]
            def rec(res): return np.mean([len(set(map(int, r[:10])) & set(map(int, t[:10]))) / 10 for r, t in zip(res, g)])
            v = vectide.Index(50, metric='cosine', engine='fresh-vamana', threads=2); v.add(ids.astype(np.uint64), X)
            rv = rec([v.search(q, k=10, ef=100)[0][0] for q in Q])
            h = hnswlib.Index(space='cosine', dim=50); h.init_index(max_elements=len(ids), M=16, ef_construction=200); h.set_num_threads(2)
            h.add_items(X, ids); h.set_ef(100); h.set_num_threads(1)
            rh = rec([h.knn_query(q, k=10)[0][0] for q in Q])
            print(f'search step {si}: {len(ids)} active; static fresh-vamana L=100 recall@10 {rv:.4f}; static hnswlib ef=100 {rh:.4f}', flush=True)
        si += 1
