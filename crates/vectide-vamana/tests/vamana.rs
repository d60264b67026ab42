//! fresh-vamana against a brute-force oracle: the static build, streaming
//! inserts, deletes and their consolidation, upserts, filters, concurrent
//! writers and readers, save/load and hostile files.

#[path = "../../test-support/file_mutation.rs"]
mod file_mutation;
#[path = "../../test-support/oracle.rs"]
mod oracle;
#[path = "../../test-support/writer_rounds.rs"]
mod writer_rounds;

use oracle::{brute_force, clustered, recall};
use proptest::prelude::*;
use std::collections::BTreeMap;
use vectide_core::{Metric, SearchParams, VectorIndex};
use vectide_vamana::{FreshVamana, VamanaParams};
use writer_rounds::rounds_beside;

const DIM: usize = 16;

fn params(r: usize) -> VamanaParams {
    VamanaParams {
        r,
        l_build: 48,
        threads: Some(2),
        ..VamanaParams::default()
    }
}

fn ids_of(idx: &FreshVamana, q: &[f32], k: usize, l: usize) -> Vec<u64> {
    idx.search(q, k, &SearchParams::with_ef(l), None)
        .unwrap()
        .iter()
        .map(|n| n.id)
        .collect()
}

/// Recall@10 of `idx` over `queries` against the live points of `model`.
fn recall_vs(idx: &FreshVamana, model: &BTreeMap<u64, Vec<f32>>, queries: &[f32], l: usize) -> f64 {
    let pts: Vec<(u64, Vec<f32>)> = model.iter().map(|(k, v)| (*k, v.clone())).collect();
    let (mut found, mut truth) = (Vec::new(), Vec::new());
    for q in queries.chunks_exact(DIM) {
        found.push(ids_of(idx, q, 10, l));
        truth.push(brute_force(idx.metric(), &pts, q, 10));
    }
    recall(&found, &truth)
}

#[test]
fn the_static_build_and_streaming_inserts_find_the_neighbours() {
    let n = 3000;
    let data = clustered(n, DIM, 20, 1);
    let queries = clustered(100, DIM, 20, 2);
    let model: BTreeMap<u64, Vec<f32>> = (0..n as u64)
        .map(|i| (i, data[i as usize * DIM..(i as usize + 1) * DIM].to_vec()))
        .collect();
    let ids: Vec<u64> = (0..n as u64).collect();
    // One build thread: the graphs (and so the recall asserted) are the same
    // in every run; with two, the build order varied and one run in about
    // ten of the fast set failed here.
    let one = VamanaParams {
        threads: Some(1),
        ..params(24)
    };
    // One batch into an empty index: the two-pass static build.
    let bulk = FreshVamana::new(DIM, Metric::L2, one.clone()).unwrap();
    bulk.insert(1, &ids, &data).unwrap();
    let r_bulk = recall_vs(&bulk, &model, &queries, 64);
    // The same points in batches of 100: Algorithm 2 for each.
    let stream = FreshVamana::new(DIM, Metric::L2, one).unwrap();
    for (b, chunk) in ids.chunks(100).enumerate() {
        stream
            .insert(
                b as u64 + 1,
                chunk,
                &data[b * 100 * DIM..(b * 100 + chunk.len()) * DIM],
            )
            .unwrap();
    }
    let r_stream = recall_vs(&stream, &model, &queries, 64);
    println!("recall@10 at L = 64: bulk {r_bulk:.4}, streaming {r_stream:.4}");
    assert!(r_bulk >= 0.95, "bulk {r_bulk}");
    assert!(r_stream >= 0.95, "streaming {r_stream}");
    for idx in [&bulk, &stream] {
        assert_eq!(idx.check_structure().unwrap(), Vec::<String>::new());
        let g = idx.check_graph();
        assert_eq!((g.live, g.reachable), (n, n));
    }
}

#[test]
fn deletes_are_never_returned_and_consolidation_keeps_recall_and_reuses_slots() {
    let n = 2000usize;
    let data = clustered(n, DIM, 16, 3);
    let queries = clustered(60, DIM, 16, 4);
    let p = VamanaParams {
        consolidate_fraction: 0.2,
        ..params(24)
    };
    let idx = FreshVamana::new(DIM, Metric::L2, p).unwrap();
    let ids: Vec<u64> = (0..n as u64).collect();
    idx.insert(1, &ids, &data).unwrap();
    let mut model: BTreeMap<u64, Vec<f32>> = (0..n as u64)
        .map(|i| (i, data[i as usize * DIM..(i as usize + 1) * DIM].to_vec()))
        .collect();
    let slots_before = idx.stats().unwrap().slots_used;
    let mut seq = 1;
    // Ten churn cycles: delete 10 % (every tenth id shifted by the cycle),
    // re-insert them with new vectors.
    for cycle in 0..10u64 {
        let gone: Vec<u64> = (0..n as u64).filter(|i| (i + cycle) % 10 == 0).collect();
        seq += 1;
        assert_eq!(idx.delete(seq, &gone).unwrap(), gone.len());
        for g in &gone {
            model.remove(g);
        }
        for q in queries.chunks_exact(DIM) {
            let found = ids_of(&idx, q, 10, 64);
            assert!(
                found.iter().all(|i| model.contains_key(i)),
                "a deleted id came back"
            );
        }
        let fresh = clustered(gone.len(), DIM, 16, 100 + cycle);
        seq += 1;
        idx.insert(seq, &gone, &fresh).unwrap();
        for (k, g) in gone.iter().enumerate() {
            model.insert(*g, fresh[k * DIM..(k + 1) * DIM].to_vec());
        }
    }
    idx.consolidate();
    let r = recall_vs(&idx, &model, &queries, 64);
    println!("recall@10 after 10 churn cycles of 10 %: {r:.4}");
    assert!(r >= 0.93, "{r}");
    let s = idx.stats().unwrap();
    assert!(s.consolidations >= 5, "{s:?}");
    assert_eq!(s.pending_deletes, 0);
    assert_eq!(idx.len(), n);
    // Reclaimed slots are reused: the slots in use stay at the live count
    // (plus the start node).
    assert_eq!(s.slots_used, n + 1);
    assert!(s.capacity <= slots_before + n / 2 + 1024, "{s:?}");
    assert_eq!(idx.check_structure().unwrap(), Vec::<String>::new());
}

#[test]
fn upserts_filters_and_bad_input() {
    let idx = FreshVamana::new(4, Metric::Cosine, params(8)).unwrap();
    let v: Vec<f32> = (0..400).map(|i| ((i * 37) % 17) as f32 + 1.0).collect();
    let ids: Vec<u64> = (0..100).collect();
    idx.insert(1, &ids, &v).unwrap();
    // The rows repeat every 17 ids: duplicates, which pruning never keeps
    // beside their twin; the build's reachability walk links them.
    let g = idx.check_graph();
    assert_eq!((g.live, g.reachable), (100, 100));
    // Upsert: id 5 now points the other way.
    idx.insert(2, &[5], &[-1.0, -2.0, -3.0, -4.0]).unwrap();
    let top = idx
        .search(&[-1.0, -2.0, -3.0, -4.0], 1, &SearchParams::default(), None)
        .unwrap();
    assert_eq!(
        top[0].id,
        5,
        "{top:?} {:?} {:?}",
        idx.get(5),
        idx.check_graph()
    );
    // A replay of the older write changes nothing.
    idx.insert(1, &[5], &v[20..24]).unwrap();
    assert_eq!(
        idx.search(&[-1.0, -2.0, -3.0, -4.0], 1, &SearchParams::default(), None)
            .unwrap()[0]
            .id,
        5
    );
    assert_eq!(idx.len(), 100);
    let even = |id: u64| id.is_multiple_of(2);
    let hits = idx
        .search(&v[0..4], 10, &SearchParams::with_ef(100), Some(&even))
        .unwrap();
    assert_eq!(hits.len(), 10);
    assert!(hits.iter().all(|h| h.id.is_multiple_of(2)));
    // Bad input changes nothing.
    assert!(idx.insert(3, &[1000], &[1.0, 2.0]).is_err());
    assert!(idx.insert(3, &[1000], &[f32::NAN, 1.0, 1.0, 1.0]).is_err());
    assert!(idx
        .search(&[1.0], 3, &SearchParams::default(), None)
        .is_err());
    assert!(idx
        .search(&v[0..4], 0, &SearchParams::default(), None)
        .is_err());
    assert_eq!(idx.len(), 100);
    assert!(FreshVamana::new(4, Metric::L2, VamanaParams { r: 1, ..params(8) }).is_err());
    // An empty index answers nothing.
    let empty = FreshVamana::new(4, Metric::L2, params(8)).unwrap();
    assert!(empty
        .search(&[1.0; 4], 3, &SearchParams::default(), None)
        .unwrap()
        .is_empty());
    assert_eq!(empty.check_structure().unwrap(), Vec::<String>::new());
}

/// Writers insert and delete while readers search: every answer names only
/// ids that were inserted at some point, and the end state matches the
/// oracle exactly (ids, vectors) with a high recall.
#[test]
fn concurrent_inserts_deletes_and_searches_match_the_oracle() {
    let n = 2400usize;
    let data = clustered(n, DIM, 12, 5);
    let idx = FreshVamana::new(
        DIM,
        Metric::L2,
        VamanaParams {
            consolidate_fraction: 0.1,
            ..params(16)
        },
    )
    .unwrap();
    let seq = std::sync::atomic::AtomicU64::new(0);
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        for w in 0..2usize {
            let (idx, data, seq) = (&idx, &data, &seq);
            s.spawn(move || {
                // Writer w owns ids ≡ w (mod 2): inserts them in batches of
                // 40, deleting every third id of the batch before last.
                let mine: Vec<u64> = (0..n as u64).filter(|i| *i as usize % 2 == w).collect();
                for (b, chunk) in mine.chunks(40).enumerate() {
                    let mut v = Vec::new();
                    for &i in chunk {
                        v.extend_from_slice(&data[i as usize * DIM..(i as usize + 1) * DIM]);
                    }
                    let s1 = seq.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                    idx.insert(s1, chunk, &v).unwrap();
                    if b > 0 {
                        let prev: Vec<u64> = mine[(b - 1) * 40..b * 40]
                            .iter()
                            .copied()
                            .step_by(3)
                            .collect();
                        let s2 = seq.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                        idx.delete(s2, &prev).unwrap();
                    }
                }
            });
        }
        for r in 0..2u64 {
            let (idx, data, stop) = (&idx, &data, &stop);
            s.spawn(move || {
                let mut k = r as usize;
                while !stop.load(std::sync::atomic::Ordering::Acquire) {
                    let q = &data[(k % n) * DIM..(k % n + 1) * DIM];
                    for h in idx.search(q, 10, &SearchParams::with_ef(32), None).unwrap() {
                        assert!((h.id as usize) < n, "unknown id {}", h.id);
                    }
                    k += 7;
                }
            });
        }
        // Stop the readers once the writers are done (they finish first).
        s.spawn(|| {
            while seq.load(std::sync::atomic::Ordering::SeqCst) < (n / 40) as u64 * 2 - 2 {
                std::thread::yield_now();
            }
            stop.store(true, std::sync::atomic::Ordering::Release);
        });
    });
    let mut model = BTreeMap::new();
    for w in 0..2usize {
        let mine: Vec<u64> = (0..n as u64).filter(|i| *i as usize % 2 == w).collect();
        let chunks: Vec<&[u64]> = mine.chunks(40).collect();
        for (b, chunk) in chunks.iter().enumerate() {
            for (j, &i) in chunk.iter().enumerate() {
                let deleted = b + 1 < chunks.len() && j % 3 == 0;
                if !deleted {
                    model.insert(i, data[i as usize * DIM..(i as usize + 1) * DIM].to_vec());
                }
            }
        }
    }
    assert_eq!(idx.len(), model.len());
    for (id, v) in &model {
        assert_eq!(idx.get(*id).unwrap().as_ref(), Some(v));
    }
    // L = 128: with r = 16 on 12 tight clusters, recall at L = 64 depends on
    // the order the writers' batches land in (0.91 to 0.99, measured; the
    // same when run serially); at 128 we measured 0.956 to 1.
    let queries = clustered(50, DIM, 12, 6);
    let r = recall_vs(&idx, &model, &queries, 128);
    let g = idx.check_graph();
    println!("recall@10 at L = 128 after concurrent churn: {r:.4}; {g:?}");
    assert_eq!(
        g.reachable, g.live,
        "every live node reachable from the start"
    );
    assert!(r >= 0.93, "{r}");
    assert_eq!(idx.check_structure().unwrap(), Vec::<String>::new());
}

#[test]
fn save_load_round_trips_and_damaged_files_are_errors() {
    let data = clustered(500, 8, 5, 7);
    let ids: Vec<u64> = (0..500).collect();
    let idx = FreshVamana::new(8, Metric::L2, params(12)).unwrap();
    idx.insert(4, &ids, &data).unwrap();
    idx.delete(5, &[1, 2, 3]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("i.vama");
    idx.save(&path).unwrap();
    assert_eq!(idx.durable_seq(), 5);
    let back = FreshVamana::load(&path, Some(1)).unwrap();
    assert_eq!(back.len(), 497);
    assert_eq!(back.durable_seq(), 5);
    assert_eq!(back.params().r, 12);
    for q in data.chunks_exact(8).take(20) {
        assert_eq!(ids_of(&back, q, 10, 40), ids_of(&idx, q, 10, 40));
    }
    let info = vectide_vamana::inspect(&path).unwrap();
    assert_eq!((info.live, info.deleted_pending), (497, 3));
    let good = std::fs::read(&path).unwrap();
    let mut flipped = good.clone();
    flipped[200] ^= 1;
    assert!(matches!(
        FreshVamana::from_bytes(&flipped, None),
        Err(vectide_core::Error::Corrupted(_))
    ));
    assert!(FreshVamana::from_bytes(&good[..good.len() / 2], None).is_err());
    let mut newer = good.clone();
    newer[8] = 9;
    assert!(matches!(
        FreshVamana::from_bytes(&newer, None),
        Err(vectide_core::Error::Version {
            found: 9,
            supported: 1
        })
    ));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// Random mutations of a valid file: an error, or an index that answers
    /// and passes its own check; never a panic.
    #[test]
    fn mutated_files_never_panic(muts in prop::collection::vec(file_mutation::mutation(), 1..4), seal in any::<bool>()) {
        static FILE: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
        let good = FILE.get_or_init(|| {
            let idx = FreshVamana::new(3, Metric::L2, params(4)).unwrap();
            let ids: Vec<u64> = (0..40).collect();
            let v: Vec<f32> = (0..120).map(|i| ((i * 7919) % 23) as f32 - 11.0).collect();
            idx.insert(1, &ids, &v).unwrap();
            idx.delete(2, &[3, 4]).unwrap();
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("f");
            idx.save(&path).unwrap();
            std::fs::read(&path).unwrap()
        });
        let mut bytes = good.clone();
        file_mutation::apply(&mut bytes, &muts);
        if seal {
            file_mutation::reseal(&mut bytes, 8);
        }
        if let Ok(idx) = FreshVamana::from_bytes(&bytes, Some(1)) {
            prop_assert_eq!(idx.check_graph().bad_edges, 0);
            prop_assert!(idx.search(&[0.0, 1.0, 2.0], 5, &SearchParams::default(), None).is_ok());
        }
    }

    /// Any sequence of inserts, upserts and deletes: with a list as long as
    /// the index, the answer is the brute-force one over the live points.
    #[test]
    fn exhaustive_searches_match_brute_force(ops in prop::collection::vec((0u64..60, any::<bool>(), -8i32..8, -8i32..8), 1..120)) {
        let idx = FreshVamana::new(2, Metric::L2, VamanaParams { r: 6, l_build: 12, threads: Some(1), consolidate_fraction: 0.3, ..VamanaParams::default() }).unwrap();
        let mut model: BTreeMap<u64, Vec<f32>> = BTreeMap::new();
        for (s, (id, del, x, y)) in ops.into_iter().enumerate() {
            let seq = s as u64 + 1;
            if del {
                idx.delete(seq, &[id]).unwrap();
                model.remove(&id);
            } else {
                let v = vec![x as f32 + id as f32 * 1e-3, y as f32];
                idx.insert(seq, &[id], &v).unwrap();
                model.insert(id, v);
            }
        }
        prop_assert_eq!(idx.len(), model.len());
        let pts: Vec<(u64, Vec<f32>)> = model.iter().map(|(k, v)| (*k, v.clone())).collect();
        let q = [0.5f32, -0.25];
        let found = ids_of(&idx, &q, 5, 200);
        let want = brute_force(Metric::L2, &pts, &q, 5);
        prop_assert_eq!(found, want);
    }
}

/// A consolidation's repair runs beside writers: with 8,000 points and half
/// of them deleted, insert + delete rounds that begin and end inside the
/// consolidation exist (none did when it held writers for the whole job),
/// and afterwards the graph has no bad edge, every live node is reachable
/// and nearly every live label is found by its own vector.
#[test]
fn writers_complete_while_a_consolidation_repairs() {
    use std::sync::atomic::{AtomicU64, Ordering};
    let n = 8_000usize;
    let idx = FreshVamana::new(
        DIM,
        Metric::L2,
        VamanaParams {
            threads: Some(1),
            ..params(24)
        },
    )
    .unwrap();
    // The test's own consolidation, not a writer's.
    assert!(idx.defer_maintenance());
    let data = clustered(n + 4_000, DIM, 40, 5);
    let row = |i: usize| &data[i * DIM..(i + 1) * DIM];
    let ids: Vec<u64> = (0..n as u64).collect();
    idx.insert(1, &ids, &data[..n * DIM]).unwrap();
    let dead: Vec<u64> = (0..n as u64).filter(|i| i % 2 == 0).collect();
    idx.delete(2, &dead).unwrap();

    let seq = AtomicU64::new(3);
    let r = rounds_beside(
        4_000,
        |k| {
            let q = seq.fetch_add(2, Ordering::Relaxed);
            idx.insert(q, &[(n + k) as u64], row(n + k)).unwrap();
            idx.delete(q + 1, &[(2 * k + 1) as u64 % n as u64]).unwrap();
        },
        || idx.consolidate(),
    );
    assert!(r.out >= dead.len(), "{} reclaimed", r.out);
    r.expect_inside(20, "consolidation");
    let check = idx.check_graph();
    assert_eq!(check.bad_edges, 0, "{check:?}");
    assert_eq!(check.reachable, check.live, "{check:?}");
    let mut missed = 0;
    for label in 0..(n + 4_000) as u64 {
        if let Some(v) = idx.get(label).unwrap() {
            if ids_of(&idx, &v, 1, 64).first() != Some(&label) {
                missed += 1;
            }
        }
    }
    assert!(
        missed * 100 <= idx.len(),
        "{missed} of {} missed",
        idx.len()
    );
}
