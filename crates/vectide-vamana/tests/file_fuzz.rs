//! Hostile fresh-vamana files: random mutations of a valid file must give an
//! error (or a consistent index), never a panic, a hang or a huge
//! allocation. Half of the mutations re-seal the trailer's CRC, so that the
//! structural checks behind the checksum are exercised, not only the CRC.

use proptest::prelude::*;

#[path = "../../test-support/file_mutation.rs"]
mod file_mutation;
use file_mutation::{apply, mutation, reseal};
use std::sync::OnceLock;
use vectide_core::{Metric, SearchParams, VectorIndex};
use vectide_vamana::{FreshVamana, VamanaParams};

/// Bytes after the CRC: the end magic (docs/format-fresh-vamana.md).
const END: usize = 8;

fn valid_file() -> &'static [u8] {
    static BYTES: OnceLock<Vec<u8>> = OnceLock::new();
    BYTES.get_or_init(|| {
        let params = VamanaParams {
            r: 4,
            l_build: 12,
            threads: Some(1),
            ..VamanaParams::default()
        };
        let idx = FreshVamana::new(3, Metric::L2, params).unwrap();
        let ids: Vec<u64> = (0..40).collect();
        let v: Vec<f32> = (0..120).map(|i| ((i * 7919) % 23) as f32 - 11.0).collect();
        idx.insert(1, &ids, &v).unwrap();
        // Pending deletes (the DeleteList) are part of the file too.
        idx.delete(2, &[3, 4]).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.vama");
        idx.save(&path).unwrap();
        std::fs::read(&path).unwrap()
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn mutated_files_never_panic(muts in prop::collection::vec(mutation(), 1..4), seal in any::<bool>()) {
        let mut bytes = valid_file().to_vec();
        apply(&mut bytes, &muts);
        if seal {
            reseal(&mut bytes, END);
        }
        // Either an error, or an index that answers queries and passes its
        // own graph check (a mutation may hit bytes no check can tell from
        // valid ones, e.g. a vector component).
        if let Ok(idx) = FreshVamana::from_bytes(&bytes, Some(1)) {
            let g = idx.check_graph();
            prop_assert_eq!(g.bad_edges, 0);
            prop_assert!(g.start_ok || idx.is_empty());
            let r = idx.search(&[0.0, 1.0, 2.0], 5, &SearchParams::default(), None);
            prop_assert!(r.is_ok());
        }
    }
}

#[test]
fn the_valid_file_loads() {
    let idx = FreshVamana::from_bytes(valid_file(), Some(1)).unwrap();
    assert_eq!(idx.len(), 38);
    let g = idx.check_graph();
    assert_eq!((g.bad_edges, g.start_ok), (0, true));
}

/// Offset of the header's `slots` field (docs/format-fresh-vamana.md).
const SLOTS_AT: usize = 52;

#[test]
fn a_resealed_lie_in_the_header_is_caught_by_structure_checks() {
    let mut bytes = valid_file().to_vec();
    // One slot more than the records hold.
    let slots = u32::from_le_bytes(bytes[SLOTS_AT..SLOTS_AT + 4].try_into().unwrap());
    bytes[SLOTS_AT..SLOTS_AT + 4].copy_from_slice(&(slots + 1).to_le_bytes());
    reseal(&mut bytes, END);
    let err = FreshVamana::from_bytes(&bytes, Some(1))
        .unwrap_err()
        .to_string();
    assert!(err.contains("truncated") || err.contains("slot"), "{err}");
    // A slot count that would need gigabytes is refused before allocating.
    let mut bytes = valid_file().to_vec();
    bytes[SLOTS_AT..SLOTS_AT + 4].copy_from_slice(&u32::MAX.to_le_bytes());
    reseal(&mut bytes, END);
    let err = FreshVamana::from_bytes(&bytes, Some(1))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("cannot fit") || err.contains("implausible"),
        "{err}"
    );
}
