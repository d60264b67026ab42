//! The pruned search against the full scan: random corpora (few and many
//! terms, negative weights, repeated values so that ties happen), random
//! upserts and deletes between searches, random filters, both modifiers
//! and both tie orders must give the same answer, id for id and bit for
//! bit. Document numbers are dense (the search's array accumulator) or
//! spread far apart (its hash map).

use proptest::prelude::*;
use vectide_sparse::{Modifier, SparseIndex, SparseVector};

#[derive(Debug, Clone)]
enum Step {
    Upsert(u64, Vec<(u32, i8)>),
    Delete(u64),
    Search(Vec<(u32, i8)>, usize, u8, bool),
}

fn terms(vocab: u32) -> impl Strategy<Value = Vec<(u32, i8)>> {
    prop::collection::vec((0..vocab, -4i8..8), 0..8)
}

fn step(vocab: u32) -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => (0u64..300, terms(vocab)).prop_map(|(d, t)| Step::Upsert(d, t)),
        1 => (0u64..300).prop_map(Step::Delete),
        2 => (terms(vocab), 1usize..30, any::<u8>(), any::<bool>())
            .prop_map(|(t, k, f, asc)| Step::Search(t, k, f, asc)),
    ]
}

fn vector(t: &[(u32, i8)]) -> SparseVector {
    let mut t = t.to_vec();
    t.sort_by_key(|p| p.0);
    t.dedup_by_key(|p| p.0);
    SparseVector::new(
        t.iter().map(|p| p.0).collect(),
        t.iter().map(|p| f32::from(p.1) * 0.5).collect(),
    )
    .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn pruned_search_equals_the_full_scan(
        vocab in prop_oneof![Just(4u32), Just(40), Just(400)],
        idf in any::<bool>(),
        spread in any::<bool>(),
        steps in prop::collection::vec(step(400), 1..400),
    ) {
        // Far-apart numbers keep the order of the dense ones.
        let num = |d: u64| if spread { d << 40 | 7 } else { d };
        let mut x = SparseIndex::new(if idf { Modifier::Idf } else { Modifier::None });
        let mut seq = 0;
        for s in steps {
            seq += 1;
            match s {
                Step::Upsert(d, t) => {
                    let t: Vec<(u32, i8)> = t.into_iter().map(|(i, v)| (i % vocab, v)).collect();
                    x.upsert(seq, num(d), vector(&t));
                }
                Step::Delete(d) => {
                    x.delete(seq, num(d));
                }
                Step::Search(t, k, f, asc) => {
                    let t: Vec<(u32, i8)> = t.into_iter().map(|(i, v)| (i % vocab, v)).collect();
                    let q = vector(&t);
                    let keep = |d: u64| f == 0 || !(d >> if spread { 40 } else { 0 }).is_multiple_of(u64::from(f % 5 + 1));
                    let tie = |a: u64, b: u64| if asc { a.cmp(&b) } else { b.cmp(&a) };
                    let (got, _) = x.search(&q, k, &keep, &tie);
                    let want = x.search_scan(&q, k, &keep, &tie);
                    prop_assert_eq!(got, want);
                }
            }
        }
    }
}

#[test]
fn large_corpus_agrees_and_prunes() {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut x = SparseIndex::new(Modifier::Idf);
    // A Zipf-like vocabulary: low term numbers are common.
    for d in 0..30_000u64 {
        let n = rng.gen_range(5..30);
        let mut t: Vec<u32> = (0..n)
            .map(|_| (rng.gen::<f64>().powi(3) * 5_000.0) as u32)
            .collect();
        t.sort_unstable();
        t.dedup();
        let v = t.iter().map(|_| rng.gen_range(0.1f32..3.0)).collect();
        x.upsert(1, d, SparseVector::new(t, v).unwrap());
    }
    let asc = |a: u64, b: u64| a.cmp(&b);
    let (mut postings, mut scored, mut read) = (0, 0, 0);
    for _ in 0..50 {
        let mut t: Vec<u32> = (0..8)
            .map(|_| (rng.gen::<f64>().powi(3) * 5_000.0) as u32)
            .collect();
        t.sort_unstable();
        t.dedup();
        let v = t.iter().map(|_| rng.gen_range(0.5f32..2.0)).collect();
        let q = SparseVector::new(t, v).unwrap();
        let (got, st) = x.search(&q, 10, &|_| true, &asc);
        assert_eq!(got, x.search_scan(&q, 10, &|_| true, &asc));
        postings += st.postings;
        scored += st.scored;
        read += st.read;
    }
    // Pruning must read and score well under the postings a scan reads.
    assert!(scored * 2 < postings, "scored {scored} of {postings}");
    assert!(read * 2 < postings, "read {read} of {postings}");
}
