//! Hostile sparse index files: random mutations of a valid file give a
//! typed error (`Corrupted` or `Version`) or an index that is consistent
//! with itself, never a panic, a hang or a huge allocation. Half of the
//! mutations re-seal the checksum so that the checks behind it run.

use proptest::prelude::*;

#[path = "../../test-support/file_mutation.rs"]
mod file_mutation;
use file_mutation::{apply, mutation, reseal};
use std::sync::OnceLock;
use vectide_core::Error;
use vectide_sparse::{Modifier, SparseIndex, SparseVector, END_MAGIC};

fn valid_file() -> &'static [u8] {
    static FILE: OnceLock<Vec<u8>> = OnceLock::new();
    FILE.get_or_init(|| {
        let mut x = SparseIndex::new(Modifier::Idf);
        for d in 0..30u64 {
            let t: Vec<u32> = (0..(d % 4 + 1) as u32)
                .map(|i| i * 2 + d as u32 % 3)
                .collect();
            let v: Vec<f32> = t.iter().map(|&i| i as f32 - 2.0).collect();
            x.upsert(d, d * 2, SparseVector::new(t, v).unwrap());
        }
        let mut b = Vec::new();
        x.write_to(&mut b).unwrap();
        b
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3000, ..ProptestConfig::default() })]

    #[test]
    fn mutated_files_never_panic(
        muts in prop::collection::vec(mutation(), 1..4),
        seal in any::<bool>(),
    ) {
        let mut bytes = valid_file().to_vec();
        apply(&mut bytes, &muts);
        if seal {
            reseal(&mut bytes, END_MAGIC.len());
        }
        match SparseIndex::parse(&bytes) {
            Ok(x) => {
                prop_assert!(x.len() <= 1 << 20);
                let q = SparseVector::new(vec![0, 1, 2, 3], vec![1.0; 4]).unwrap();
                let tie = |a: u64, b: u64| a.cmp(&b);
                let (got, _) = x.search(&q, 5, &|_| true, &tie);
                prop_assert_eq!(got, x.search_scan(&q, 5, &|_| true, &tie));
            }
            Err(Error::Corrupted(_) | Error::Version { .. }) => {}
            Err(e) => prop_assert!(false, "unexpected error {e}"),
        }
    }
}

#[test]
fn the_valid_file_parses() {
    let x = SparseIndex::parse(valid_file()).unwrap();
    assert_eq!(x.len(), 30);
}
