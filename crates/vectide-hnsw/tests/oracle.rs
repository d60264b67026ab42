//! Property test: random insert / upsert / delete / save-load sequences
//! against a brute-force oracle (a map from id to vector).

use proptest::prelude::*;
use std::collections::BTreeMap;
use vectide_core::{Metric, SearchParams, VectorIndex};
use vectide_graph::codes::Quantization;
use vectide_hnsw::{Hnsw, HnswParams};

const DIM: usize = 6;
const IDS: u64 = 48;

#[derive(Debug, Clone)]
enum Op {
    /// Upsert a batch of (id, vector); ids in a batch are distinct.
    Insert(Vec<(u64, Vec<f32>)>),
    Delete(Vec<u64>),
    SaveLoad,
}

fn vector() -> impl Strategy<Value = Vec<f32>> {
    prop::collection::vec(-8i32..8, DIM)
        .prop_filter("non-zero", |v| v.iter().any(|&x| x != 0))
        .prop_map(|v| v.into_iter().map(|x| x as f32 * 0.25).collect())
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => prop::collection::btree_map(0..IDS, vector(), 1..24)
            .prop_map(|m| Op::Insert(m.into_iter().collect())),
        3 => prop::collection::btree_set(0..IDS, 1..16)
            .prop_map(|s| Op::Delete(s.into_iter().collect())),
        1 => Just(Op::SaveLoad),
    ]
}

fn dist(metric: Metric, a: &[f32], b: &[f32]) -> f32 {
    match metric {
        Metric::L2 => a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum(),
        _ => {
            let na = a.iter().map(|x| x * x).sum::<f32>().sqrt();
            let nb = b.iter().map(|x| x * x).sum::<f32>().sqrt();
            1.0 - a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>() / (na * nb)
        }
    }
}

/// The engine's exact scan answers as the brute force over the oracle:
/// the same distances, each id live at its distance.
fn check_exact_scan(
    idx: &Hnsw,
    metric: Metric,
    oracle: &BTreeMap<u64, Vec<f32>>,
) -> Result<(), TestCaseError> {
    const K: usize = 5;
    let q: Vec<f32> = (0..DIM).map(|i| i as f32 * 0.5 - 1.0).collect();
    let mut want: Vec<f32> = oracle.values().map(|v| dist(metric, &q, v)).collect();
    want.sort_by(f32::total_cmp);
    want.truncate(K);
    let got = idx.exact_scan(&q, K).unwrap().expect("hnsw scans");
    prop_assert_eq!(got.len(), want.len());
    for (n, w) in got.iter().zip(&want) {
        prop_assert!((n.distance - w).abs() <= 1e-5, "{:?} vs {:?}", got, want);
        let v = oracle.get(&n.id);
        prop_assert!(v.is_some_and(|v| (dist(metric, &q, v) - n.distance).abs() <= 1e-5));
    }
    Ok(())
}

fn check(metric: Metric, ops: Vec<Op>, threads: usize) -> Result<(), TestCaseError> {
    check_with(metric, ops, threads, Quantization::None)
}

fn check_with(
    metric: Metric,
    ops: Vec<Op>,
    threads: usize,
    quantization: Quantization,
) -> Result<(), TestCaseError> {
    let params = HnswParams {
        m: 8,
        ef_construction: 32,
        consolidate_fraction: 0.1,
        threads: Some(threads),
        quantization,
        ..HnswParams::default()
    };
    let mut idx = Hnsw::new(DIM, metric, params).unwrap();
    let mut oracle: BTreeMap<u64, Vec<f32>> = BTreeMap::new();
    let dir = tempfile::tempdir().unwrap();
    let mut seq = 0;
    let mut applied = 0;
    for op in ops {
        seq += 1;
        match op {
            Op::Insert(batch) => {
                let ids: Vec<u64> = batch.iter().map(|(id, _)| *id).collect();
                let flat: Vec<f32> = batch.iter().flat_map(|(_, v)| v.clone()).collect();
                idx.insert(seq, &ids, &flat).unwrap();
                applied = seq;
                for (id, v) in batch {
                    oracle.insert(id, v);
                }
            }
            Op::Delete(ids) => {
                let want = ids.iter().filter(|id| oracle.contains_key(id)).count();
                prop_assert_eq!(idx.delete(seq, &ids).unwrap(), want);
                applied = seq;
                for id in ids {
                    oracle.remove(&id);
                }
            }
            Op::SaveLoad => {
                let path = dir.path().join("i.vtdx");
                idx.save(&path).unwrap();
                idx = Hnsw::load(&path, Some(threads)).unwrap();
                // Everything applied before the save is durable.
                prop_assert_eq!(idx.durable_seq(), applied);
            }
        }
        prop_assert_eq!(idx.len(), oracle.len());
        check_exact_scan(&idx, metric, &oracle)?;
        let g = idx.check_graph();
        prop_assert_eq!(g.bad_edges, 0, "{:?}", g);
        // With codes, every list carries its neighbours' current codes.
        if let Err(e) = idx.check_codes() {
            prop_assert!(false, "{}", e);
        }
        // Layer 0 of HNSW is a directed graph: inserts (pruning a
        // neighbour's list, raising the entry point) can leave nodes the
        // entry point does not reach; consolidations and
        // `repair_reachability` relink them (checked at the end).
        let _ = g.reachable;
    }
    idx.repair_reachability();
    let g = idx.check_graph();
    prop_assert_eq!(g.reachable, g.live, "unreachable after repair: {:?}", g);
    let stats = idx.stats().unwrap();
    prop_assert!(stats.slots_used <= stats.live + stats.pending_deletes);
    for id in 0..IDS {
        prop_assert_eq!(
            idx.contains(id).unwrap(),
            oracle.contains_key(&id),
            "contains({})",
            id
        );
        match oracle.get(&id) {
            None => prop_assert!(idx.get(id).unwrap().is_none()),
            Some(v) => {
                let got = idx.get(id).unwrap().unwrap();
                // Stored vectors are normalised under cosine.
                prop_assert!(
                    dist(metric, &got, v) <= 1e-5,
                    "get({id}) = {got:?}, want {v:?}"
                );
                // Exact top-1 (ef exceeds the point count, so the search is
                // exhaustive over everything reachable): the id itself or a
                // point at the same distance (duplicate vectors).
                let hits = idx.search(v, 1, &SearchParams::with_ef(64), None).unwrap();
                prop_assert_eq!(hits.len(), 1);
                let best = oracle
                    .values()
                    .map(|w| dist(metric, v, w))
                    .fold(f32::INFINITY, f32::min);
                prop_assert!(
                    hits[0].id == id || (hits[0].distance - best).abs() <= 1e-5,
                    "top-1 of {id} is {} at {}, best is {best}",
                    hits[0].id,
                    hits[0].distance
                );
            }
        }
    }
    // A full-size search returns the live set, but for a rare node that the
    // search's layer-0 start cannot reach (the entry point reaches all, but
    // the greedy descent may start layer 0 elsewhere).
    if let Some(v) = oracle.values().next() {
        let full = |idx: &Hnsw| {
            let all = idx
                .search(v, IDS as usize, &SearchParams::with_ef(128), None)
                .unwrap();
            let mut got: Vec<u64> = all.iter().map(|n| n.id).collect();
            got.sort_unstable();
            got
        };
        let want: Vec<u64> = oracle.keys().copied().collect();
        let before = full(&idx);
        prop_assert!(before.iter().all(|id| oracle.contains_key(id)));
        prop_assert!(
            before.len() + 2 >= want.len(),
            "{} of {} reachable",
            before.len(),
            want.len()
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn l2_sequences_match_the_oracle(ops in prop::collection::vec(op(), 1..40)) {
        check(Metric::L2, ops, 1)?;
    }

    #[test]
    fn cosine_sequences_match_the_oracle(ops in prop::collection::vec(op(), 1..40)) {
        check(Metric::Cosine, ops, 2)?;
    }

    /// The same on RaBitQ codes: inserts, upserts, deletes, consolidations
    /// and save/load keep every list's codes those of its neighbours, and
    /// searches stay exact where the float search is.
    #[test]
    fn quantized_sequences_match_the_oracle(
        ops in prop::collection::vec(op(), 1..40),
        cosine in any::<bool>(),
    ) {
        let metric = if cosine { Metric::Cosine } else { Metric::L2 };
        check_with(metric, ops, 2, Quantization::Rabitq1)?;
    }
}
