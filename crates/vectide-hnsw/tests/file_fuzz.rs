//! Hostile index files: random mutations of a valid file must give an error
//! (or a consistent index), never a panic, a hang or a huge allocation.
//! Half of the mutations re-seal the file with a correct checksum, so that the
//! structural checks behind the CRC are exercised, not only the CRC.

use proptest::prelude::*;

#[path = "../../test-support/file_mutation.rs"]
mod file_mutation;
use file_mutation::{apply, mutation, reseal};
use std::sync::OnceLock;
use vectide_core::{Metric, SearchParams, VectorIndex};
use vectide_graph::codes::Quantization;
use vectide_hnsw::{Hnsw, HnswParams};

const END: usize = 8;

fn valid_file() -> &'static [u8] {
    static BYTES: OnceLock<Vec<u8>> = OnceLock::new();
    BYTES.get_or_init(|| file_with(Quantization::None))
}

/// The same index walking on RaBitQ codes: a version-2 file, with the
/// quantizer after the header.
fn valid_quantized_file() -> &'static [u8] {
    static BYTES: OnceLock<Vec<u8>> = OnceLock::new();
    BYTES.get_or_init(|| file_with(Quantization::Rabitq1))
}

fn file_with(quantization: Quantization) -> Vec<u8> {
    {
        let params = HnswParams {
            m: 4,
            ef_construction: 16,
            threads: Some(1),
            quantization,
            ..HnswParams::default()
        };
        let idx = Hnsw::new(3, Metric::L2, params).unwrap();
        let ids: Vec<u64> = (0..40).collect();
        let v: Vec<f32> = (0..120).map(|i| ((i * 7919) % 23) as f32 - 11.0).collect();
        idx.insert(1, &ids, &v).unwrap();
        idx.delete(2, &[3, 4]).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.vtdx");
        idx.save(&path).unwrap();
        std::fs::read(&path).unwrap()
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn mutated_files_never_panic(
        muts in prop::collection::vec(mutation(), 1..4),
        seal in any::<bool>(),
        quantized in any::<bool>(),
    ) {
        let mut bytes = if quantized { valid_quantized_file() } else { valid_file() }.to_vec();
        apply(&mut bytes, &muts);
        if seal {
            reseal(&mut bytes, END);
        }
        // Either an error, or an index that answers queries and passes its
        // own graph check (a mutation may hit bytes that no check can tell
        // from valid ones, e.g. a vector component).
        if let Ok(idx) = Hnsw::from_bytes(&bytes, Some(1)) {
            let g = idx.check_graph();
            prop_assert_eq!(g.bad_edges, 0);
            let r = idx.search(&[0.0, 1.0, 2.0], 5, &SearchParams::default(), None);
            prop_assert!(r.is_ok());
        }
    }
}

#[test]
fn the_valid_file_loads() {
    let idx = Hnsw::from_bytes(valid_file(), Some(1)).unwrap();
    assert_eq!(idx.len(), 38);
    assert_eq!(idx.check_graph().bad_edges, 0);
    let q = Hnsw::from_bytes(valid_quantized_file(), Some(1)).unwrap();
    assert!(q.has_codes() && q.len() == 38);
    assert_eq!(&valid_quantized_file()[8..12], &2u32.to_le_bytes());
}

/// Offset of the header's `slots` field (docs/format-hnsw.md).
const SLOTS_AT: usize = 40;

#[test]
fn a_resealed_lie_in_the_header_is_caught_by_structure_checks() {
    let mut bytes = valid_file().to_vec();
    // One slot more than the records hold.
    let slots = u32::from_le_bytes(bytes[SLOTS_AT..SLOTS_AT + 4].try_into().unwrap());
    bytes[SLOTS_AT..SLOTS_AT + 4].copy_from_slice(&(slots + 1).to_le_bytes());
    reseal(&mut bytes, END);
    let err = Hnsw::from_bytes(&bytes, Some(1)).unwrap_err().to_string();
    assert!(err.contains("truncated") || err.contains("slot"), "{err}");
    // A slot count that would need gigabytes is refused before allocating.
    let mut bytes = valid_file().to_vec();
    bytes[SLOTS_AT..SLOTS_AT + 4].copy_from_slice(&u32::MAX.to_le_bytes());
    reseal(&mut bytes, END);
    let err = Hnsw::from_bytes(&bytes, Some(1)).unwrap_err().to_string();
    assert!(
        err.contains("cannot fit") || err.contains("implausible"),
        "{err}"
    );
}
