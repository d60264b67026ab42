//! Engine `flat` against a brute-force oracle, and its contract: upserts,
//! deletes and slot reuse, filters, bad input, replay, save/load, bounds.

use proptest::prelude::*;
use std::collections::BTreeMap;
use vectide_core::validate::copy_normalized;
use vectide_core::{limits, Error, Metric, Neighbor, SearchParams, Seq, VectorIndex};
use vectide_flat::{Flat, FlatParams};

const METRICS: [Metric; 3] = [Metric::L2, Metric::Ip, Metric::Cosine];

fn flat(dim: usize, metric: Metric) -> Flat {
    Flat::new(dim, metric, FlatParams { threads: Some(2) }).unwrap()
}

fn sp() -> SearchParams {
    SearchParams::default()
}

/// What the index should hold: id → (seq, stored vector), applied with the
/// same sequence rules.
struct Oracle {
    dim: usize,
    metric: Metric,
    points: BTreeMap<u64, (Seq, Vec<f32>)>,
}

impl Oracle {
    fn new(dim: usize, metric: Metric) -> Self {
        Oracle {
            dim,
            metric,
            points: BTreeMap::new(),
        }
    }

    fn insert(&mut self, seq: Seq, ids: &[u64], vectors: &[f32]) {
        for (&id, v) in ids.iter().zip(vectors.chunks_exact(self.dim)) {
            if self.points.get(&id).is_some_and(|(s, _)| *s >= seq) {
                continue;
            }
            let mut row = Vec::new();
            copy_normalized(self.metric, v, &mut row);
            self.points.insert(id, (seq, row));
        }
    }

    fn delete(&mut self, seq: Seq, ids: &[u64]) -> usize {
        ids.iter()
            .filter(|id| {
                let hit = self.points.get(id).is_some_and(|(s, _)| *s <= seq);
                if hit {
                    self.points.remove(id);
                }
                hit
            })
            .count()
    }

    /// Every admitted point with its exact distance, closest first.
    fn ranked(&self, q: &[f32], filter: Option<&dyn Fn(u64) -> bool>) -> Vec<Neighbor> {
        let mut qn = Vec::new();
        copy_normalized(self.metric, q, &mut qn);
        let dist = self.metric.distance_fn();
        let mut all: Vec<Neighbor> = self
            .points
            .iter()
            .filter(|(id, _)| filter.is_none_or(|f| f(**id)))
            .map(|(&id, (_, v))| Neighbor::new(id, dist(&qn, v)))
            .collect();
        all.sort_by(|a, b| a.distance.total_cmp(&b.distance));
        all
    }

    /// The size of the numbers a distance to `q` is computed from: the
    /// tolerance of a rank comparison is relative to it (the batched L2
    /// path selects by `‖x‖² − 2x·q`, whose rounding scales with the norms).
    fn scale(&self, q: &[f32]) -> f32 {
        let nq: f32 = q.iter().map(|x| x * x).sum();
        let nx = self
            .points
            .values()
            .map(|(_, v)| v.iter().map(|x| x * x).sum::<f32>())
            .fold(0.0, f32::max);
        match self.metric {
            Metric::L2 => nq + nx,
            Metric::Ip => (nq * nx).sqrt(),
            Metric::Cosine => 1.0,
        }
    }

    /// Checks one answer: the right length, distinct admitted ids at their
    /// exact distances, closest first, and the oracle's top-k distances up
    /// to ties (1e-5 relative to the scale of the computation).
    fn check(
        &self,
        q: &[f32],
        k: usize,
        filter: Option<&dyn Fn(u64) -> bool>,
        got: &[Neighbor],
        what: &str,
    ) {
        let want = self.ranked(q, filter);
        let tol = 1e-5 * (1.0 + self.scale(q));
        assert_eq!(got.len(), k.min(want.len()), "{what}: length");
        let exact: BTreeMap<u64, f32> = want.iter().map(|n| (n.id, n.distance)).collect();
        let mut seen = std::collections::HashSet::new();
        for (i, n) in got.iter().enumerate() {
            assert!(seen.insert(n.id), "{what}: id {} twice", n.id);
            let d = *exact
                .get(&n.id)
                .unwrap_or_else(|| panic!("{what}: id {} is not admitted", n.id));
            assert!(
                (n.distance - d).abs() <= tol,
                "{what}: id {} at {} not {d}",
                n.id,
                n.distance
            );
            assert!(
                (n.distance - want[i].distance).abs() <= tol,
                "{what}: rank {i}: {} vs oracle {} (tol {tol})",
                n.distance,
                want[i].distance
            );
            if i > 0 {
                assert!(got[i - 1].distance <= n.distance, "{what}: not sorted");
            }
        }
    }
}

#[derive(Debug, Clone)]
enum Op {
    Insert(Vec<u64>, Vec<f32>),
    Delete(Vec<u64>),
}

/// A vector: small integers (exact arithmetic, so exact ties) or floats.
fn vector(dim: usize) -> impl Strategy<Value = Vec<f32>> {
    prop_oneof![
        prop::collection::vec((-6i8..6).prop_map(f32::from), dim),
        prop::collection::vec(-10.0f32..10.0, dim),
    ]
    .prop_map(|mut v| {
        if v.iter().all(|&x| x == 0.0) {
            v[0] = 1.0; // no zero vector (cosine refuses it)
        }
        v
    })
}

fn op(dim: usize) -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => prop::collection::btree_map(0u64..80, vector(dim), 1..40).prop_map(|m| {
            let ids = m.keys().copied().collect();
            Op::Insert(ids, m.into_values().flatten().collect())
        }),
        1 => prop::collection::vec(0u64..90, 1..25).prop_map(Op::Delete),
    ]
}

fn case() -> impl Strategy<Value = (usize, Metric, Vec<Op>, Vec<Vec<f32>>, usize)> {
    (1usize..12, 0usize..3).prop_flat_map(|(dim, m)| {
        (
            Just(dim),
            Just(METRICS[m]),
            prop::collection::vec(op(dim), 1..10),
            prop::collection::vec(vector(dim), 1..12),
            1usize..90,
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// Random histories of inserts, upserts and deletes (some replayed with
    /// old sequence numbers); single, batched and finely tiled batched
    /// searches, with and without a filter, all equal the oracle.
    #[test]
    fn searches_equal_the_oracle((dim, metric, ops, queries, k) in case()) {
        let idx = flat(dim, metric);
        let mut oracle = Oracle::new(dim, metric);
        for (i, op) in ops.iter().enumerate() {
            // Every third operation replays an older sequence number.
            let seq = if i % 3 == 2 { i as Seq - 1 } else { i as Seq + 1 };
            match op {
                Op::Insert(ids, v) => {
                    idx.insert(seq, ids, v).unwrap();
                    oracle.insert(seq, ids, v);
                }
                Op::Delete(ids) => {
                    prop_assert_eq!(idx.delete(seq, ids).unwrap(), oracle.delete(seq, ids));
                }
            }
        }
        prop_assert_eq!(idx.len(), oracle.points.len());
        let st = idx.stats().unwrap();
        prop_assert_eq!(st.live, oracle.points.len());
        prop_assert_eq!(st.slots_used, oracle.points.len());
        for (&id, (_, v)) in &oracle.points {
            prop_assert_eq!(idx.get(id).unwrap(), Some(v.clone()));
        }

        let flat_q: Vec<f32> = queries.concat();
        let odd = |id: u64| id % 3 != 1;
        for filter in [None, Some(&odd as &(dyn Fn(u64) -> bool + Sync))] {
            let f: Option<&dyn Fn(u64) -> bool> = filter.map(|f| f as &dyn Fn(u64) -> bool);
            let batch = idx.search_batch(&flat_q, k, &sp(), filter).unwrap();
            let tiled = idx.search_batch_tiled(&flat_q, k, filter, 3, 7).unwrap();
            prop_assert_eq!(batch.len(), queries.len());
            for (i, q) in queries.iter().enumerate() {
                let single = idx.search(q, k, &sp(), filter).unwrap();
                oracle.check(q, k, f, &single, "single");
                oracle.check(q, k, f, &batch[i], "batch");
                oracle.check(q, k, f, &tiled[i], "tiled");
            }
        }
    }
}

/// A batch large enough for the GEMM path, over several tiles of the
/// default size, with deletes scattered through it.
#[test]
fn a_large_batch_equals_the_oracle() {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    for metric in METRICS {
        let dim = 50;
        let n = 3000;
        let idx = flat(dim, metric);
        let mut oracle = Oracle::new(dim, metric);
        let ids: Vec<u64> = (0..n).map(|i| i * 11 + 5).collect();
        let v: Vec<f32> = (0..n as usize * dim)
            .map(|_| rng.gen_range(-1.0..1.0))
            .collect();
        idx.insert(1, &ids, &v).unwrap();
        oracle.insert(1, &ids, &v);
        let gone: Vec<u64> = ids.iter().copied().step_by(13).collect();
        idx.delete(2, &gone).unwrap();
        oracle.delete(2, &gone);
        let queries: Vec<f32> = (0..300 * dim).map(|_| rng.gen_range(-1.0..1.0)).collect();
        for k in [1, 10, 100] {
            let got = idx.search_batch(&queries, k, &sp(), None).unwrap();
            for (q, g) in queries.chunks_exact(dim).zip(&got) {
                oracle.check(q, k, None, g, "large batch");
            }
        }
    }
}

#[test]
fn deleted_slots_are_reused() {
    let idx = flat(2, Metric::L2);
    let ids: Vec<u64> = (0..100).collect();
    let v: Vec<f32> = (0..200).map(|i| i as f32).collect();
    idx.insert(1, &ids, &v).unwrap();
    let before = idx.stats().unwrap();
    assert_eq!(idx.delete(2, &ids[..50]).unwrap(), 50);
    let mid = idx.stats().unwrap();
    assert_eq!((mid.live, mid.slots_used, mid.pending_deletes), (50, 50, 0));
    assert!(mid.extra.contains(&("free_slots".to_string(), 50.0)));
    let new: Vec<u64> = (1000..1050).collect();
    idx.insert(3, &new, &v[..100]).unwrap();
    let after = idx.stats().unwrap();
    assert_eq!((after.live, after.slots_used), (100, 100));
    assert_eq!(
        after.capacity, before.capacity,
        "no growth: the freed slots took them"
    );
    assert!(after.extra.contains(&("free_slots".to_string(), 0.0)));
    // A re-inserted id is found again; a deleted one is not.
    let r = idx.search(&[0.0, 1.0], 1, &sp(), None).unwrap();
    assert_eq!(r[0].id, 1000);
    assert!(!idx.contains(0).unwrap());
}

#[test]
fn the_filter_is_honoured_by_every_path() {
    let idx = flat(1, Metric::L2);
    let ids: Vec<u64> = (0..200).collect();
    let v: Vec<f32> = (0..200).map(|i| i as f32).collect();
    idx.insert(1, &ids, &v).unwrap();
    let mult7 = |id: u64| id.is_multiple_of(7);
    let r = idx.search(&[50.0], 3, &sp(), Some(&mult7)).unwrap();
    assert_eq!(r.iter().map(|n| n.id).collect::<Vec<_>>(), vec![49, 56, 42]);
    let qs: Vec<f32> = (0..20).map(|i| i as f32 * 10.0).collect();
    let b = idx.search_batch(&qs, 2, &sp(), Some(&mult7)).unwrap();
    for (q, r) in qs.iter().zip(&b) {
        assert!(r.iter().all(|n| n.id.is_multiple_of(7)), "{r:?}");
        assert_eq!(r.len(), 2);
        assert!(
            (r[0].distance - (q % 7.0).min(7.0 - q % 7.0).powi(2)).abs() < 1e-3,
            "{q}: {r:?}"
        );
    }
    let none = |_: u64| false;
    assert!(idx
        .search(&[1.0], 5, &sp(), Some(&none))
        .unwrap()
        .is_empty());
    assert!(idx
        .search_batch(&qs, 5, &sp(), Some(&none))
        .unwrap()
        .iter()
        .all(Vec::is_empty));
}

#[test]
fn bad_input_is_a_typed_error_and_changes_nothing() {
    let idx = flat(3, Metric::Cosine);
    idx.insert(1, &[1, 2], &[1.0, 0.0, 0.0, 0.0, 1.0, 0.0])
        .unwrap();
    let snapshot = |idx: &Flat| {
        (
            idx.len(),
            idx.get(1).unwrap(),
            idx.get(2).unwrap(),
            idx.get(9).unwrap(),
            idx.stats().unwrap(),
        )
    };
    let before = snapshot(&idx);
    let good = [0.0, 0.0, 1.0];
    let cases: Vec<(Vec<u64>, Vec<f32>, &str)> = vec![
        (vec![9], vec![1.0, 2.0], "dimension"),
        (
            vec![9, 1],
            [good, [f32::NAN, 0.0, 0.0]].concat(),
            "non-finite",
        ),
        (
            vec![9, 1],
            [good, [f32::INFINITY, 0.0, 0.0]].concat(),
            "non-finite",
        ),
        (vec![9, u64::MAX], [good, good].concat(), "reserved"),
        (vec![9, 9], [good, good].concat(), "duplicate"),
        (vec![9, 1], [good, [0.0, 0.0, 0.0]].concat(), "zero vector"),
        (vec![9], [good, good].concat(), "ids but"),
    ];
    for (ids, v, want) in cases {
        let e = idx.insert(5, &ids, &v).unwrap_err();
        match want {
            "dimension" => assert!(
                matches!(e, Error::DimensionMismatch { expected: 3, .. }),
                "{e}"
            ),
            _ => assert!(
                matches!(&e, Error::InvalidInput(m) if m.contains(want)),
                "{want}: {e}"
            ),
        }
        assert_eq!(snapshot(&idx), before, "{want}: the index changed");
    }
    // Bad queries.
    assert!(matches!(
        idx.search(&[1.0, 0.0], 1, &sp(), None),
        Err(Error::DimensionMismatch { .. })
    ));
    assert!(idx.search(&[f32::NAN, 0.0, 0.0], 1, &sp(), None).is_err());
    assert!(
        idx.search(&[0.0; 3], 1, &sp(), None).is_err(),
        "zero query under cosine"
    );
    assert!(matches!(
        idx.search_batch(&[1.0; 7], 1, &sp(), None),
        Err(Error::DimensionMismatch { .. })
    ));
    let mut batch = vec![1.0f32; 30];
    batch[17] = f32::NAN;
    assert!(idx.search_batch(&batch, 1, &sp(), None).is_err());
    let mut out = Vec::new();
    assert!(idx.distances(&[1.0, 0.0], &[1], &mut out).is_err() && out.is_empty());
    assert_eq!(
        idx.search_batch(&[], 3, &sp(), None).unwrap(),
        Vec::<Vec<Neighbor>>::new()
    );
}

#[test]
fn k_follows_the_limits_and_allocates_by_the_results() {
    let idx = flat(2, Metric::Ip);
    idx.insert(1, &[1, 2, 3], &[1.0, 0.0, 0.0, 1.0, 1.0, 1.0])
        .unwrap();
    let r = idx.search(&[1.0, 1.0], limits::MAX_K, &sp(), None).unwrap();
    assert_eq!(r.len(), 3);
    assert!(r.capacity() < 64, "allocated by k: {}", r.capacity());
    let qs = vec![1.0f32; 2 * 40];
    for b in idx.search_batch(&qs, limits::MAX_K, &sp(), None).unwrap() {
        assert_eq!(b.len(), 3);
        assert!(b.capacity() < 64);
    }
    for k in [0, limits::MAX_K + 1] {
        assert!(matches!(
            idx.search(&[1.0, 1.0], k, &sp(), None),
            Err(Error::InvalidInput(_))
        ));
        assert!(idx.search_batch(&qs, k, &sp(), None).is_err());
    }
}

#[test]
fn replays_are_idempotent() {
    let idx = flat(2, Metric::L2);
    idx.insert(5, &[1], &[1.0, 1.0]).unwrap();
    // Not newer than the recorded seq: skipped.
    idx.insert(5, &[1], &[2.0, 2.0]).unwrap();
    idx.insert(4, &[1], &[3.0, 3.0]).unwrap();
    assert_eq!(idx.get(1).unwrap(), Some(vec![1.0, 1.0]));
    // Newer: replaced in place.
    idx.insert(6, &[1, 2], &[4.0, 4.0, 5.0, 5.0]).unwrap();
    assert_eq!(idx.get(1).unwrap(), Some(vec![4.0, 4.0]));
    // A delete older than the write is skipped; absent ids are a no-op.
    assert_eq!(idx.delete(5, &[1]).unwrap(), 0);
    assert_eq!(idx.delete(7, &[1, 42]).unwrap(), 1);
    assert_eq!(idx.delete(7, &[1]).unwrap(), 0);

    // Replaying a whole log over a state that already holds it changes nothing.
    let log = [
        (10, Op::Insert(vec![3, 4], vec![1.0, 0.0, 0.0, 1.0])),
        (11, Op::Delete(vec![3])),
        (12, Op::Insert(vec![4, 5], vec![2.0, 2.0, 3.0, 3.0])),
    ];
    let apply = |idx: &Flat| {
        for (seq, op) in &log {
            match op {
                Op::Insert(ids, v) => idx.insert(*seq, ids, v).unwrap(),
                Op::Delete(ids) => _ = idx.delete(*seq, ids).unwrap(),
            }
        }
    };
    apply(&idx);
    let state = |idx: &Flat| (3..6).map(|id| idx.get(id).unwrap()).collect::<Vec<_>>();
    let once = state(&idx);
    apply(&idx);
    assert_eq!(state(&idx), once);
    assert_eq!(once, vec![None, Some(vec![2.0, 2.0]), Some(vec![3.0, 3.0])]);
}

#[test]
fn save_and_load_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    for metric in METRICS {
        let idx = flat(5, metric);
        let ids: Vec<u64> = (0..300).map(|i| i * 3 + 1).collect();
        let v: Vec<f32> = (0..1500).map(|i| ((i * 37) % 19) as f32 - 9.5).collect();
        idx.insert(1, &ids, &v).unwrap();
        idx.delete(2, &ids[10..60]).unwrap();
        idx.insert(3, &[7777], &[1.0, 2.0, 3.0, 4.0, 5.0]).unwrap();
        assert_eq!(idx.durable_seq(), 0, "volatile: nothing saved yet");
        let path = dir.path().join(format!("{metric}.flat"));
        idx.save(&path).unwrap();
        assert_eq!(idx.durable_seq(), 3);
        idx.flush().unwrap();

        let back = Flat::load(&path, Some(1)).unwrap();
        assert_eq!(back.threads(), 1);
        assert_eq!(
            (back.len(), back.dim(), back.metric()),
            (idx.len(), 5, metric)
        );
        assert_eq!(back.durable_seq(), 3);
        for id in ids.iter().chain(&[7777]) {
            assert_eq!(back.get(*id).unwrap(), idx.get(*id).unwrap(), "id {id}");
        }
        let q: Vec<f32> = (0..50).map(|i| (i % 7) as f32 - 3.0).collect();
        assert_eq!(
            back.search_batch(&q, 10, &sp(), None).unwrap(),
            idx.search_batch(&q, 10, &sp(), None).unwrap()
        );
        // Replay after the load: writes not newer than the saved seqs are skipped.
        back.insert(3, &[7777], &[1.0, 0.0, 0.0, 0.0, 0.0]).unwrap();
        assert_eq!(back.get(7777).unwrap(), idx.get(7777).unwrap());
        back.insert(4, &[7777], &[0.0, 0.0, 0.0, 0.0, 1.0]).unwrap();
        assert_ne!(back.get(7777).unwrap(), idx.get(7777).unwrap());
        let info = vectide_flat::inspect(&path).unwrap();
        assert_eq!((info.live, info.slots, info.durable_seq), (251, 251, 3));
        assert_eq!(info.file_bytes, std::fs::metadata(&path).unwrap().len());
    }
    // An empty index round-trips too.
    let empty = flat(3, Metric::L2);
    let p = dir.path().join("empty.flat");
    empty.save(&p).unwrap();
    let back = Flat::load(&p, None).unwrap();
    assert!(back.is_empty());
    assert!(back
        .search(&[1.0, 2.0, 3.0], 4, &sp(), None)
        .unwrap()
        .is_empty());
    assert!(matches!(
        Flat::load(&dir.path().join("absent"), None),
        Err(Error::Io { .. })
    ));
}

#[test]
fn concurrent_writers_and_readers() {
    let idx = std::sync::Arc::new(flat(4, Metric::L2));
    let mut handles = Vec::new();
    for t in 0..3u64 {
        let idx = idx.clone();
        handles.push(std::thread::spawn(move || {
            for round in 0..50u64 {
                let ids: Vec<u64> = (0..20).map(|i| t * 1000 + i).collect();
                let v: Vec<f32> = (0..80).map(|i| (i + round) as f32).collect();
                idx.insert(round * 10 + t + 1, &ids, &v).unwrap();
                if round % 5 == 4 {
                    idx.delete(round * 10 + t + 1, &ids[..10]).unwrap();
                }
            }
        }));
    }
    for _ in 0..2 {
        let idx = idx.clone();
        handles.push(std::thread::spawn(move || {
            for _ in 0..100 {
                let r = idx.search_batch(&[1.0; 40], 5, &sp(), None).unwrap();
                for n in r.iter().flatten() {
                    assert!(n.distance >= 0.0);
                }
            }
        }));
    }
    for h in handles {
        h.join().unwrap();
    }
    // Each writer's last round deleted half of its 20 ids.
    assert_eq!(idx.len(), 30);
}
