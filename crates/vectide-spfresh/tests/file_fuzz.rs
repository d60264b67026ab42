//! Hostile block-store bytes: random mutations of a valid encoded mapping
//! (half of them re-sealed, so the structural checks behind the CRC are
//! exercised) and of a valid store file must give an error or a store
//! whose every read either errors or decodes whole records, never a panic
//! or a huge allocation; random bytes are never a mapping, a block, a
//! record stream or a version map that panics. The engine snapshot
//! (`snapshot.bin`) gets the same: random bytes, and mutations of a real
//! one, re-sealed or not, decode or fail, never panic.

use proptest::prelude::*;

#[path = "../../test-support/file_mutation.rs"]
mod file_mutation;
use file_mutation::{apply, mutation, reseal};
use std::sync::{Arc, OnceLock};
use vectide_spfresh::layout::{decode_map, encode_record, open_block, StoreHeader};
use vectide_spfresh::{snapshot, BlockStore, ReadScratch, Records};
use vectide_storage::block::{SimBlockFile, BLOCK};

const DIM: usize = 3;

/// (store file bytes, encoded mapping) of a small store.
fn valid() -> &'static (Vec<u8>, Vec<u8>) {
    static V: OnceLock<(Vec<u8>, Vec<u8>)> = OnceLock::new();
    V.get_or_init(|| {
        let file = Arc::new(SimBlockFile::new(1));
        let store = BlockStore::create(Box::new(file.clone()), DIM).unwrap();
        let mut sc = ReadScratch::default();
        for p in 0..4u32 {
            let mut r = Vec::new();
            for i in 0..(p * 150) {
                encode_record(&mut r, p * 1000 + i, 1, &[i as f32, 1.0, 2.0]);
            }
            let pid = store.create_posting(&r).unwrap();
            store
                .append(pid, &r[..r.len().min(17 * 5)], &mut sc)
                .unwrap();
        }
        let e = store.entry(1).unwrap();
        store.remove(1, &e);
        let mut map = Vec::new();
        store.snapshot(&mut map).unwrap();
        (file.current(), map)
    })
}

/// Every posting of a store opened from hostile bytes reads as whole
/// records or as an error.
fn read_all(store: &BlockStore) {
    let mut sc = ReadScratch::default();
    let mut r = Records::default();
    for pid in 0..store.posting_ids() + 2 {
        if store.get(pid, &mut r, &mut sc).is_ok() {
            assert_eq!(r.vectors.len(), r.len() * DIM);
        }
    }
    let pids: Vec<u32> = (0..store.posting_ids()).collect();
    let _ = store.parallel_get(&pids, &mut sc);
}

/// The bytes of a real engine snapshot (an index with postings, a
/// delete, a reopen's worth of state).
fn valid_snapshot() -> &'static Vec<u8> {
    static V: OnceLock<Vec<u8>> = OnceLock::new();
    V.get_or_init(|| {
        use vectide_core::VectorIndex;
        let dir = tempfile::tempdir().unwrap();
        let p = vectide_spfresh::SpannParams {
            posting_vectors: 4,
            rebuild_inline: true,
            ..Default::default()
        };
        let idx = vectide_spfresh::Spfresh::create(
            dir.path(),
            DIM,
            vectide_core::Metric::L2,
            vectide_spfresh::Mode::Fresh,
            p,
        )
        .unwrap();
        let v: Vec<f32> = (0..40 * DIM).map(|i| ((i * 37) % 101) as f32).collect();
        idx.insert(1, &(0..40).collect::<Vec<u64>>(), &v).unwrap();
        idx.delete(2, &[3, 4]).unwrap();
        idx.close().unwrap();
        std::fs::read(dir.path().join(vectide_spfresh::SNAPSHOT)).unwrap()
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1500, ..ProptestConfig::default() })]

    #[test]
    fn mutated_snapshots_never_panic(muts in prop::collection::vec(mutation(), 1..4), seal in any::<bool>()) {
        let mut bytes = valid_snapshot().clone();
        apply(&mut bytes, &muts);
        if seal {
            reseal(&mut bytes, snapshot::END.len());
        }
        if let Ok(s) = snapshot::decode(&bytes) {
            // What decodes is shaped as it says.
            prop_assert_eq!(s.ext.len(), s.versions.len() as usize);
            prop_assert_eq!(s.homes.len(), s.ext.len());
            for c in s.centroids.iter().flatten() {
                prop_assert_eq!(c.len(), s.head.dim);
            }
        }
    }

    #[test]
    fn mutated_mappings_never_panic(muts in prop::collection::vec(mutation(), 1..4), seal in any::<bool>()) {
        let (file, map) = valid();
        let mut bytes = map.clone();
        apply(&mut bytes, &muts);
        if seal {
            reseal(&mut bytes, 0);
        }
        let sim = SimBlockFile::with_durable(file.clone(), 1).unwrap();
        if let Ok((store, _)) = BlockStore::open_encoded(Box::new(sim), &bytes) {
            read_all(&store);
        }
    }

    #[test]
    fn mutated_store_files_never_panic(muts in prop::collection::vec(mutation(), 1..6)) {
        let (file, map) = valid();
        let mut bytes = file.clone();
        apply(&mut bytes, &muts);
        bytes.resize(bytes.len().div_ceil(BLOCK) * BLOCK, 0);
        let _ = StoreHeader::decode(&bytes);
        for b in bytes.chunks(BLOCK).skip(1) {
            let _ = open_block(b);
        }
        if let Ok(sim) = SimBlockFile::with_durable(bytes, 1) {
            if let Ok((store, _)) = BlockStore::open_encoded(Box::new(sim), map) {
                read_all(&store);
            }
        }
    }

    #[test]
    fn random_bytes_are_never_a_mapping_that_panics(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        let _ = decode_map(&bytes);
        let _ = open_block(&bytes);
        let _ = StoreHeader::decode(&bytes);
        let _ = Records::default().decode_from(&bytes, DIM);
        let _ = vectide_spfresh::VersionMap::decode(&bytes);
        let _ = snapshot::decode(&bytes);
    }
}

#[test]
fn the_valid_snapshot_decodes() {
    let s = snapshot::decode(valid_snapshot()).unwrap();
    assert_eq!(s.ext.len(), 40);
    assert!(s.versions.get(3).unwrap().deleted && !s.versions.get(5).unwrap().deleted);
    assert!(s.centroids.iter().flatten().count() > 1, "the index split");
}

#[test]
fn the_valid_store_opens_and_reads() {
    let (file, map) = valid();
    let sim = SimBlockFile::with_durable(file.clone(), 1).unwrap();
    let (store, used) = BlockStore::open_encoded(Box::new(sim), map).unwrap();
    assert_eq!(used, map.len());
    let mut r = Records::default();
    let mut sc = ReadScratch::default();
    assert!(store.get(1, &mut r, &mut sc).unwrap().is_none());
    store.get(3, &mut r, &mut sc).unwrap().unwrap();
    assert_eq!(r.len(), 455);
    assert_eq!(r.vids[450], 3000);
}
