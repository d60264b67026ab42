//! Hostile index files: random mutations of a valid file must give an error
//! (`Corrupted` or `Version`) or a consistent index, never a panic, a hang
//! or a huge allocation. Half of the mutations re-seal the file with a
//! correct checksum, so that the structural checks behind the CRC are
//! exercised, not only the CRC.

use proptest::prelude::*;

#[path = "../../test-support/file_mutation.rs"]
mod file_mutation;
use file_mutation::{apply, mutation, reseal};
use std::sync::OnceLock;
use vectide_core::{Error, Metric, SearchParams, VectorIndex};
use vectide_flat::{Flat, FlatParams};

/// Bytes after the CRC: the end magic.
const END: usize = 8;
/// Offset of the header's `count` field (docs/format-flat.md).
const COUNT_AT: usize = 24;

fn valid_file(metric: Metric) -> Vec<u8> {
    let idx = Flat::new(3, metric, FlatParams { threads: Some(1) }).unwrap();
    let ids: Vec<u64> = (0..40).collect();
    let v: Vec<f32> = (0..120).map(|i| ((i * 7919) % 23) as f32 - 11.0).collect();
    idx.insert(1, &ids, &v).unwrap();
    idx.delete(2, &[3, 4]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f.flat");
    idx.save(&path).unwrap();
    std::fs::read(&path).unwrap()
}

fn valid_files() -> &'static [Vec<u8>] {
    static FILES: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    FILES.get_or_init(|| [Metric::L2, Metric::Cosine].map(valid_file).to_vec())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3000, ..ProptestConfig::default() })]

    #[test]
    fn mutated_files_never_panic(
        which in 0usize..2,
        muts in prop::collection::vec(mutation(), 1..4),
        seal in any::<bool>(),
    ) {
        let mut bytes = valid_files()[which].clone();
        apply(&mut bytes, &muts);
        if seal {
            reseal(&mut bytes, END);
        }
        // Either a typed error, or an index that answers queries (a
        // mutation may hit bytes no check can tell from valid ones, e.g. a
        // vector component or a sequence number).
        match Flat::from_bytes(&bytes, Some(1)) {
            Ok(idx) => {
                prop_assert!(idx.len() <= 38);
                let q = vec![1.0f32; idx.dim()];
                let r = idx.search(&q, 5, &SearchParams::default(), None).unwrap();
                prop_assert_eq!(r.len(), idx.len().min(5));
                // The batched path selects by matrix-product keys, then
                // re-ranks exactly: the same distances up to ties.
                let b = idx.search_batch(&q.repeat(8), 5, &SearchParams::default(), None).unwrap();
                prop_assert_eq!(b[0].len(), r.len());
                for (x, y) in b[0].iter().zip(&r) {
                    let (a, b) = (x.distance, y.distance);
                    let close = (a - b).abs() <= 1e-4 * (1.0 + a.abs().max(b.abs()));
                    prop_assert!(close || a.total_cmp(&b).is_eq(), "{:?} vs {:?}", x, y);
                }
            }
            Err(Error::Corrupted(_) | Error::Version { .. }) => {}
            Err(e) => prop_assert!(false, "unexpected error kind: {e}"),
        }
    }
}

#[test]
fn the_valid_files_load() {
    for bytes in valid_files() {
        let idx = Flat::from_bytes(bytes, Some(1)).unwrap();
        assert_eq!(idx.len(), 38);
    }
}

#[test]
fn a_resealed_lie_in_the_header_is_caught_by_structure_checks() {
    let valid = &valid_files()[0];
    for count in [37u64, 39, u64::MAX, u64::MAX / 28 + 1] {
        let mut bytes = valid.clone();
        bytes[COUNT_AT..COUNT_AT + 8].copy_from_slice(&count.to_le_bytes());
        reseal(&mut bytes, END);
        let err = Flat::from_bytes(&bytes, Some(1)).unwrap_err();
        assert!(
            matches!(&err, Error::Corrupted(m) if m.contains("header says")),
            "{count}: {err}"
        );
    }
    // A newer format version is refused as such, before anything else.
    let mut bytes = valid.clone();
    bytes[8..12].copy_from_slice(&2u32.to_le_bytes());
    assert!(matches!(
        Flat::from_bytes(&bytes, None),
        Err(Error::Version {
            found: 2,
            supported: 1
        })
    ));
}
