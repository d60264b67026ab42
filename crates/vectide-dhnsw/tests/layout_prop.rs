//! The d-HNSW region layout against a brute-force oracle (proptest): an
//! index of K = 3 partitions with small overflow gaps (so inserts overflow
//! them and partitions are rebuilt) takes a first batch and then a random
//! sequence of insert batches (labels from a small space: some are
//! upserts, some bring deleted labels back) and deletes. Afterwards its
//! structure is whole, its count and every label's vector are the
//! oracle's, deleted labels are gone, every live node is reachable (its own
//! vector finds it first, at distance 0), and searches probing every
//! partition find what an exact scan of the oracle's live set finds.

use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use vectide_core::params::params_of;
use vectide_core::{Metric, ParamValue, SearchParams, VectorIndex};

const DIM: usize = 8;
/// Labels come from `0..LABELS`: later batches hit earlier labels often.
const LABELS: u64 = 600;
const K: usize = 3;
/// Per-query recall@10 a search of every partition must reach.
const MIN_RECALL: f64 = 0.9;

fn index() -> Box<dyn VectorIndex> {
    let p = params_of([
        ("partitions", ParamValue::Int(K as i64)),
        ("gap", ParamValue::Float(0.02)),
        ("m", ParamValue::Int(8)),
        ("threads", ParamValue::Int(2)),
    ]);
    (vectide_dhnsw::DESCRIPTOR.create)(DIM, Metric::L2, &p).unwrap()
}

#[derive(Debug, Clone)]
enum Op {
    Insert(Vec<u64>),
    Delete(Vec<u64>),
    /// A batch naming one label twice: refused whole, nothing changes.
    Refused(Vec<u64>),
}

/// Distinct labels of the label space, in random order.
fn labels(n: std::ops::Range<usize>) -> impl Strategy<Value = Vec<u64>> {
    proptest::sample::subsequence((0..LABELS).collect::<Vec<u64>>(), n).prop_shuffle()
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => labels(1..60).prop_map(Op::Insert),
        2 => labels(1..25).prop_map(Op::Delete),
        1 => (labels(1..20), any::<proptest::sample::Index>()).prop_map(|(mut l, i)| {
            l.push(l[i.index(l.len())]);
            Op::Refused(l)
        }),
    ]
}

/// A case: the seed of the vectors, the first batch (the build: tiny
/// ones make the index outgrow its region and move to a new one), the
/// operations after it, and where among them a batch large enough to
/// overflow every gap goes (so each case rebuilds partitions).
#[derive(Debug, Clone)]
struct Case {
    seed: u64,
    first: Vec<u64>,
    ops: Vec<Op>,
}

fn case() -> impl Strategy<Value = Case> {
    (
        any::<u64>(),
        prop_oneof![1 => labels(12..40), 2 => labels(90..240)],
        proptest::collection::vec(op(), 4..30),
        labels(60..100),
        any::<proptest::sample::Index>(),
    )
        .prop_map(|(seed, first, mut ops, big, at)| {
            let at = at.index(ops.len() + 1);
            ops.insert(at, Op::Insert(big));
            Case { seed, first, ops }
        })
}

fn l2(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum()
}

/// Exact top-`k` labels of the oracle's live set.
fn brute_force(live: &BTreeMap<u64, Vec<f32>>, q: &[f32], k: usize) -> Vec<u64> {
    let mut d: Vec<(f32, u64)> = live.iter().map(|(&l, v)| (l2(q, v), l)).collect();
    d.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    d.into_iter().take(k).map(|x| x.1).collect()
}

/// Random rows: uniform in [-1, 1)^DIM, so no two labels share a vector.
fn rows(rng: &mut StdRng, n: usize) -> Vec<f32> {
    (0..n * DIM).map(|_| rng.gen_range(-1.0f32..1.0)).collect()
}

/// Runs a case against the oracle; returns the violations (each named by
/// its check) and the partition rebuilds the index made.
fn run(case: &Case) -> (Vec<String>, f64) {
    let mut rng = StdRng::seed_from_u64(case.seed);
    let idx = index();
    let mut live: BTreeMap<u64, Vec<f32>> = BTreeMap::new();
    let mut bad = Vec::new();
    let mut seq = 1;
    let insert = |rng: &mut StdRng, live: &mut BTreeMap<u64, Vec<f32>>, labels: &[u64], seq| {
        let v = rows(rng, labels.len());
        idx.insert(seq, labels, &v).unwrap();
        for (l, row) in labels.iter().zip(v.chunks(DIM)) {
            live.insert(*l, row.to_vec());
        }
    };
    insert(&mut rng, &mut live, &case.first, seq);
    for op in &case.ops {
        seq += 1;
        match op {
            Op::Insert(labels) => insert(&mut rng, &mut live, labels, seq),
            Op::Refused(labels) => {
                let v = rows(&mut rng, labels.len());
                if idx.insert(seq, labels, &v).is_ok() {
                    bad.push(format!(
                        "refused: a batch naming a label twice was taken: {labels:?}"
                    ));
                }
            }
            Op::Delete(labels) => {
                let gone = idx.delete(seq, labels).unwrap();
                let want = labels.iter().filter(|l| live.remove(l).is_some()).count();
                if gone != want {
                    bad.push(format!("delete: {gone} removed, the oracle {want}"));
                }
            }
        }
    }
    let st = idx.stats().unwrap();
    let rebuilds = st.extra_value("partition_rebuilds").unwrap();
    if st.extra_value("partitions") != Some(K as f64) {
        bad.push(format!("partitions: {:?}", st.extra_value("partitions")));
    }
    let cs = idx.check_structure().unwrap();
    if !cs.is_empty() {
        bad.push(format!("structure: {:?}", &cs[..cs.len().min(4)]));
    }
    if idx.len() != live.len() {
        bad.push(format!("len: {}, the oracle {}", idx.len(), live.len()));
    }
    // Every label of the space: the last vector written, or nothing.
    for l in 0..LABELS {
        let (got, has) = (idx.get(l).unwrap(), idx.contains(l).unwrap());
        let want = live.get(&l);
        if got.as_ref() != want || has != want.is_some() {
            bad.push(format!(
                "get/contains {l}: {:?}/{has}, the oracle {:?}",
                got.map(|v| v[0]),
                want.map(|v| v[0])
            ));
        }
    }
    // Every live node is reachable: its own vector finds it first.
    let every = SearchParams {
        nprobe: Some(K),
        ef: Some(128),
        ..SearchParams::default()
    };
    let (ls, qs): (Vec<u64>, Vec<Vec<f32>>) = live.iter().map(|(l, v)| (*l, v.clone())).unzip();
    let hits = idx.search_batch(&qs.concat(), 1, &every, None).unwrap();
    for (l, hit) in ls.iter().zip(&hits) {
        match hit.first() {
            Some(h) if h.id == *l && h.distance == 0.0 => {}
            h => bad.push(format!("reachable {l}: found {h:?}")),
        }
    }
    // Random queries: every partition probed finds the exact top 10.
    let qs = rows(&mut rng, 10);
    let got = idx.search_batch(&qs, 10, &every, None).unwrap();
    for (q, found) in qs.chunks(DIM).zip(&got) {
        let truth = brute_force(&live, q, 10);
        let hit = found.iter().filter(|n| truth.contains(&n.id)).count();
        let recall = hit as f64 / truth.len().max(1) as f64;
        if recall < MIN_RECALL {
            let ids: Vec<u64> = found.iter().map(|n| n.id).collect();
            bad.push(format!("recall {recall}: {ids:?}, exact {truth:?}"));
        }
    }
    (bad, rebuilds)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn the_layout_keeps_what_a_brute_force_oracle_keeps(case in case()) {
        let (bad, rebuilds) = run(&case);
        prop_assert!(bad.is_empty(), "{} violations: {:?}", bad.len(), &bad[..bad.len().min(6)]);
        // Every case overflows the gaps (its large batch).
        prop_assert!(rebuilds > 0.0, "no partition was rebuilt");
    }
}
