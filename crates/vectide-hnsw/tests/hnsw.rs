//! Integration tests of the HNSW engine against a brute-force oracle.

#[path = "../../test-support/oracle.rs"]
mod common;

use common::{brute_force, clustered, recall};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use vectide_core::{Error, Metric, SearchParams, VectorIndex};
use vectide_hnsw::{Hnsw, HnswParams};

/// Queries drawn from the same clusters as the points of `build`.
fn queries(n: usize, dim: usize) -> Vec<f32> {
    let all = clustered(20_000 + n, dim, 20, 7);
    all[20_000 * dim..].to_vec()
}

fn build(metric: Metric, n: usize, dim: usize) -> (Hnsw, Vec<(u64, Vec<f32>)>) {
    let mut data = clustered(n, dim, 20, 7);
    if metric == Metric::Ip {
        // Inner-product search on embeddings of similar norms, as in practice.
        for v in data.chunks_exact_mut(dim) {
            let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
            v.iter_mut().for_each(|x| *x /= n);
        }
    }
    let idx = Hnsw::new(dim, metric, HnswParams::default()).unwrap();
    let ids: Vec<u64> = (0..n as u64).map(|i| i * 3 + 1).collect();
    idx.insert(1, &ids, &data).unwrap();
    let points = ids
        .iter()
        .zip(data.chunks_exact(dim))
        .map(|(&i, v)| (i, v.to_vec()))
        .collect();
    (idx, points)
}

fn measure(idx: &Hnsw, points: &[(u64, Vec<f32>)], queries: &[f32], dim: usize, ef: usize) -> f64 {
    let mut found = Vec::new();
    let mut truth = Vec::new();
    for q in queries.chunks_exact(dim) {
        let r = idx.search(q, 10, &SearchParams::with_ef(ef), None).unwrap();
        found.push(r.iter().map(|n| n.id).collect::<Vec<_>>());
        truth.push(brute_force(idx.metric(), points, q, 10));
    }
    recall(&found, &truth)
}

#[test]
fn recall_against_brute_force_for_every_metric() {
    let dim = 24;
    let queries = queries(200, dim);
    for metric in [Metric::L2, Metric::Ip, Metric::Cosine] {
        let (idx, points) = build(metric, 4000, dim);
        let r = measure(&idx, &points, &queries, dim, 64);
        assert!(r >= 0.95, "{metric}: recall@10 = {r}");
        assert_eq!(idx.len(), 4000);
    }
}

#[test]
fn distances_follow_the_smaller_is_closer_convention() {
    let idx = Hnsw::new(2, Metric::Cosine, HnswParams::default()).unwrap();
    idx.insert(1, &[1, 2], &[1.0, 0.0, 0.0, 2.0]).unwrap();
    let r = idx
        .search(&[3.0, 4.0], 2, &SearchParams::default(), None)
        .unwrap();
    assert_eq!(r[0].id, 2);
    assert!((r[0].distance - 0.2).abs() < 1e-6, "1 - cos = 1 - 0.8");
    assert!((r[1].distance - 0.4).abs() < 1e-6);
    let ip = Hnsw::new(2, Metric::Ip, HnswParams::default()).unwrap();
    ip.insert(1, &[1], &[1.0, 2.0]).unwrap();
    let r = ip
        .search(&[3.0, 4.0], 1, &SearchParams::default(), None)
        .unwrap();
    assert!((r[0].distance + 11.0).abs() < 1e-5, "-dot");
}

#[test]
fn deletes_are_repaired_and_slots_reused() {
    let dim = 16;
    let (idx, mut points) = build(Metric::L2, 5000, dim);
    let queries = queries(200, dim);
    let before = measure(&idx, &points, &queries, dim, 64);
    // Delete 30 % in one batch: more than the 5 % threshold, so it consolidates.
    let all = points.clone();
    let gone: Vec<u64> = points.iter().step_by(3).map(|p| p.0).collect();
    assert_eq!(idx.delete(2, &gone).unwrap(), gone.len());
    points.retain(|p| !gone.contains(&p.0));
    let st = idx.stats().unwrap();
    assert_eq!(st.pending_deletes, 0, "consolidated");
    assert_eq!(st.slots_used, points.len(), "slots reclaimed");
    assert!(st.consolidations >= 1);
    let after = measure(&idx, &points, &queries, dim, 64);
    // The honest reference: a fresh index built on the survivors.
    let fresh = Hnsw::new(dim, Metric::L2, HnswParams::default()).unwrap();
    let ids: Vec<u64> = points.iter().map(|p| p.0).collect();
    let flat: Vec<f32> = points.iter().flat_map(|p| p.1.clone()).collect();
    fresh.insert(1, &ids, &flat).unwrap();
    let reference = measure(&fresh, &points, &queries, dim, 64);
    eprintln!("recall before {before}, after delete {after}, fresh build {reference}");
    assert!(
        after >= reference - 0.02,
        "recall {before} -> {after}; fresh {reference}"
    );
    for id in &gone {
        assert!(!idx.contains(*id).unwrap());
    }
    // Re-insert them: reclaimed slots are used first.
    let back: Vec<&(u64, Vec<f32>)> = all.iter().filter(|p| gone.contains(&p.0)).collect();
    let vecs: Vec<f32> = back.iter().flat_map(|p| p.1.clone()).collect();
    idx.insert(3, &gone, &vecs).unwrap();
    let points = all;
    let st = idx.stats().unwrap();
    assert_eq!(st.live, 5000);
    assert!(st.slots_used <= 5000, "no slot growth: {}", st.slots_used);
    let again = measure(&idx, &points, &queries, dim, 64);
    assert!(again >= before - 0.02, "recall {before} -> {again}");
}

#[test]
fn deleting_everything_then_inserting_works() {
    let (idx, points) = build(Metric::L2, 300, 8);
    let ids: Vec<u64> = points.iter().map(|p| p.0).collect();
    assert_eq!(idx.delete(2, &ids).unwrap(), 300);
    assert!(idx.is_empty());
    assert!(idx
        .search(&[0.0; 8], 5, &SearchParams::default(), None)
        .unwrap()
        .is_empty());
    idx.insert(3, &[7], &[1.0; 8]).unwrap();
    let r = idx
        .search(&[1.0; 8], 5, &SearchParams::default(), None)
        .unwrap();
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].id, 7);
}

#[test]
fn upsert_replaces_the_vector_and_returns_the_id_once() {
    let (idx, _) = build(Metric::L2, 1000, 8);
    let id = 1; // the first id of `build`
    let new = vec![50.0f32; 8];
    idx.insert(2, &[id], &new).unwrap();
    assert_eq!(idx.len(), 1000);
    assert_eq!(idx.get(id).unwrap().unwrap(), new);
    let r = idx
        .search(&new, 10, &SearchParams::default(), None)
        .unwrap();
    assert_eq!(r[0].id, id);
    assert_eq!(r[0].distance, 0.0);
    assert_eq!(r.iter().filter(|n| n.id == id).count(), 1);
}

#[test]
fn replay_of_an_older_operation_changes_nothing() {
    let idx = Hnsw::new(2, Metric::L2, HnswParams::default()).unwrap();
    idx.insert(5, &[1], &[1.0, 1.0]).unwrap();
    idx.insert(5, &[1], &[9.0, 9.0]).unwrap();
    assert_eq!(
        idx.get(1).unwrap().unwrap(),
        vec![1.0, 1.0],
        "same seq: skipped"
    );
    assert_eq!(idx.delete(4, &[1]).unwrap(), 0, "older delete: skipped");
    assert!(idx.contains(1).unwrap());
    assert_eq!(idx.delete(6, &[1]).unwrap(), 1);
    assert_eq!(
        idx.delete(6, &[1]).unwrap(),
        0,
        "deleting twice is harmless"
    );
    assert_eq!(idx.stats().unwrap().slots_used, 0);
}

#[test]
fn filter_is_applied_during_traversal() {
    let dim = 16;
    let (idx, points) = build(Metric::L2, 4000, dim);
    let queries = queries(100, dim);
    // 10 % selectivity.
    let pred = |id: u64| id % 10 == 1;
    let allowed: Vec<(u64, Vec<f32>)> = points.iter().filter(|p| pred(p.0)).cloned().collect();
    let mut found = Vec::new();
    let mut truth = Vec::new();
    for q in queries.chunks_exact(dim) {
        let r = idx
            .search(q, 10, &SearchParams::with_ef(64), Some(&pred))
            .unwrap();
        assert!(r.iter().all(|n| pred(n.id)));
        found.push(r.iter().map(|n| n.id).collect::<Vec<_>>());
        truth.push(brute_force(Metric::L2, &allowed, q, 10));
    }
    let r = recall(&found, &truth);
    assert!(r >= 0.9, "filtered recall {r}");
    // A filter nobody passes returns nothing.
    let none = |_: u64| false;
    assert!(idx
        .search(&queries[..dim], 10, &SearchParams::default(), Some(&none))
        .unwrap()
        .is_empty());
}

#[test]
fn capacity_grows_across_many_batches() {
    let dim = 4;
    let idx = Hnsw::new(dim, Metric::L2, HnswParams::default()).unwrap();
    let data = clustered(3000, dim, 5, 1);
    for (b, chunk) in data.chunks(dim * 100).enumerate() {
        let ids: Vec<u64> = (0..chunk.len() / dim)
            .map(|i| (b * 100 + i) as u64)
            .collect();
        idx.insert(b as u64 + 1, &ids, chunk).unwrap();
    }
    assert_eq!(idx.len(), 3000);
    assert!(idx.stats().unwrap().capacity >= 3000);
    for i in (0..3000).step_by(97) {
        let v = &data[i * dim..(i + 1) * dim];
        let r = idx.search(v, 1, &SearchParams::with_ef(100), None).unwrap();
        assert_eq!(r[0].distance, 0.0);
    }
}

#[test]
fn bad_input_is_rejected_and_changes_nothing() {
    let idx = Hnsw::new(3, Metric::Cosine, HnswParams::default()).unwrap();
    idx.insert(1, &[1], &[1.0, 0.0, 0.0]).unwrap();
    let cases: Vec<(Vec<u64>, Vec<f32>)> = vec![
        (vec![2], vec![1.0, 0.0]),                        // wrong dimension
        (vec![2], vec![f32::NAN, 0.0, 0.0]),              // NaN
        (vec![2], vec![f32::INFINITY, 0.0, 0.0]),         // Inf
        (vec![2], vec![0.0, 0.0, 0.0]),                   // zero under cosine
        (vec![u64::MAX], vec![1.0, 0.0, 0.0]),            // reserved id
        (vec![2, 3], vec![1.0, 0.0, 0.0]),                // length mismatch
        (vec![2, 2], vec![1.0, 0.0, 0.0, 0.0, 1.0, 0.0]), // duplicate ids
    ];
    for (ids, v) in cases {
        let e = idx.insert(2, &ids, &v).unwrap_err();
        assert!(
            matches!(e, Error::InvalidInput(_) | Error::DimensionMismatch { .. }),
            "{e}"
        );
    }
    assert_eq!(idx.len(), 1);
    assert_eq!(idx.stats().unwrap().slots_used, 1);
    let p = SearchParams::default();
    assert!(idx.search(&[1.0, 0.0, 0.0], 0, &p, None).is_err(), "k = 0");
    assert!(idx.search(&[1.0, 0.0], 1, &p, None).is_err());
    assert!(idx.search(&[f32::NAN, 0.0, 0.0], 1, &p, None).is_err());
    assert!(idx.search(&[0.0, 0.0, 0.0], 1, &p, None).is_err());
    assert!(Hnsw::new(0, Metric::L2, HnswParams::default()).is_err());
    let bad = HnswParams {
        m: 1,
        ..HnswParams::default()
    };
    assert!(Hnsw::new(3, Metric::L2, bad).is_err());
}

#[test]
fn concurrent_inserts_deletes_and_searches() {
    let dim = 16;
    let idx = Arc::new(
        Hnsw::new(
            dim,
            Metric::L2,
            HnswParams {
                threads: Some(2),
                ..HnswParams::default()
            },
        )
        .unwrap(),
    );
    let seq = Arc::new(AtomicU64::new(1));
    let data = Arc::new(clustered(8000, dim, 20, 11));
    std::thread::scope(|s| {
        for t in 0..2u64 {
            let (idx, seq, data) = (idx.clone(), seq.clone(), data.clone());
            s.spawn(move || {
                // Writer t owns ids t, t+2, t+4, ...; inserts in batches, deletes a quarter.
                for b in 0..20u64 {
                    let ids: Vec<u64> = (0..100).map(|i| (b * 100 + i) * 2 + t).collect();
                    let vecs: Vec<f32> = ids
                        .iter()
                        .flat_map(|&id| data[id as usize * dim..][..dim].to_vec())
                        .collect();
                    idx.insert(seq.fetch_add(1, Ordering::SeqCst), &ids, &vecs)
                        .unwrap();
                    let del: Vec<u64> = ids.iter().copied().step_by(4).collect();
                    idx.delete(seq.fetch_add(1, Ordering::SeqCst), &del)
                        .unwrap();
                }
            });
        }
        for _ in 0..2 {
            let (idx, data) = (idx.clone(), data.clone());
            s.spawn(move || {
                for i in 0..3000 {
                    let q = &data[(i % 8000) * dim..(i % 8000 + 1) * dim];
                    let r = idx.search(q, 5, &SearchParams::with_ef(32), None).unwrap();
                    assert!(r.len() <= 5);
                    assert!(r.windows(2).all(|w| w[0].distance <= w[1].distance));
                }
            });
        }
    });
    // 2 writers x 20 batches x 100 ids, a quarter deleted.
    assert_eq!(idx.len(), 3000);
    idx.consolidate();
    let st = idx.stats().unwrap();
    assert_eq!(st.slots_used, 3000);
    // Every live id is found by its own vector.
    let mut misses = 0;
    for b in 0..20u64 {
        for t in 0..2u64 {
            for i in (1..100).step_by(4) {
                let id = (b * 100 + i) * 2 + t;
                let v = idx.get(id).unwrap().expect("live");
                let r = idx.search(&v, 1, &SearchParams::with_ef(64), None).unwrap();
                if r[0].distance != 0.0 {
                    misses += 1;
                }
            }
        }
    }
    assert_eq!(misses, 0);
}

#[test]
fn save_load_round_trip_and_corruption_detection() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idx.vtdx");
    let dim = 12;
    let (idx, points) = build(Metric::Cosine, 2000, dim);
    idx.delete(2, &[points[0].0, points[1].0]).unwrap(); // stays pending (below 5 %)
    assert_eq!(idx.durable_seq(), 0);
    idx.save(&path).unwrap();
    assert_eq!(idx.durable_seq(), 2);
    let back = Hnsw::load(&path, None).unwrap();
    assert_eq!(back.len(), idx.len());
    assert_eq!(back.durable_seq(), 2);
    assert_eq!(back.stats().unwrap().pending_deletes, 2);
    let queries = clustered(50, dim, 20, 4);
    for q in queries.chunks_exact(dim) {
        let a = idx.search(q, 10, &SearchParams::default(), None).unwrap();
        let b = back.search(q, 10, &SearchParams::default(), None).unwrap();
        assert_eq!(a, b);
    }
    // A loaded index keeps working.
    back.insert(3, &[999_999], &vec![0.5; dim]).unwrap();
    assert!(back.contains(999_999).unwrap());

    let good = std::fs::read(&path).unwrap();
    // Any flipped byte is caught (sample positions across the file).
    for pos in (0..good.len()).step_by(good.len() / 97 + 1) {
        let mut bad = good.clone();
        bad[pos] ^= 0x5a;
        assert!(Hnsw::from_bytes(&bad, None).is_err(), "flip at {pos}");
    }
    // Truncation at any length.
    for len in [0, 4, 8, 50, 100, good.len() / 2, good.len() - 1] {
        assert!(Hnsw::from_bytes(&good[..len], None).is_err(), "len {len}");
    }
    // A future version is a Version error (2 is the quantized format,
    // tests/quantized.rs).
    let mut v3 = good.clone();
    v3[8] = 3;
    assert!(matches!(
        Hnsw::from_bytes(&v3, None),
        Err(Error::Version { found: 3, .. })
    ));
    // Saving over a file whose directory vanished fails cleanly.
    assert!(idx.save(&dir.path().join("nope/idx")).is_err());
}

#[test]
fn inserts_and_deletes_run_while_a_consolidation_repairs() {
    // A consolidation's repair runs beside inserts and deletes: writes
    // complete while it runs (on a whole-job hold of the inserts' lock, the
    // first insert waits for its end and none completes during it), and
    // none of them leaves an edge to a reclaimed slot.
    let dim = 16;
    let n = 20_000;
    let params = HnswParams {
        threads: Some(1),
        ..HnswParams::default()
    };
    let data = clustered(n + 2_000, dim, 20, 11);
    let idx = Hnsw::new(dim, Metric::L2, params).unwrap();
    idx.defer_maintenance();
    let ids: Vec<u64> = (0..n as u64).collect();
    idx.insert(1, &ids, &data[..n * dim]).unwrap();
    let gone: Vec<u64> = (0..n as u64).step_by(4).collect();
    idx.delete(2, &gone).unwrap();
    assert!(idx.maintenance_due(), "deferred, not run by the delete");
    assert_eq!(idx.stats().unwrap().consolidations, 0);
    let running = std::sync::atomic::AtomicBool::new(true);
    let (during, reclaimed) = std::thread::scope(|s| {
        let job = s.spawn(|| {
            let r = idx.consolidate();
            running.store(false, Ordering::Release);
            r
        });
        // Wait until the job has taken its dead set (it empties the
        // DeleteList under the exclusive lock; its activity begins before).
        while idx.stats().unwrap().pending_deletes > 0 && !job.is_finished() {
            std::thread::yield_now();
        }
        let mut during = 0;
        let mut seq = 3;
        for i in 0..2_000u64 {
            if !running.load(Ordering::Acquire) {
                break;
            }
            let id = n as u64 + i;
            let at = (n + i as usize) * dim;
            idx.insert(seq, &[id], &data[at..at + dim]).unwrap();
            idx.delete(seq + 1, &[i * 4 + 1]).unwrap();
            seq += 2;
            during += usize::from(running.load(Ordering::Acquire));
        }
        (during, job.join().unwrap())
    });
    assert_eq!(reclaimed, gone.len());
    eprintln!("{during} writes completed during the consolidation");
    assert!(
        during >= 3,
        "{during} writes completed during the consolidation"
    );
    // The deletes made meanwhile wait for the next one; then every edge is sound.
    idx.consolidate();
    let g = idx.check_graph();
    assert_eq!(g.bad_edges, 0, "{g:?}");
    assert_eq!(g.live, idx.len());
    for id in gone {
        assert!(!idx.contains(id).unwrap());
    }
}
