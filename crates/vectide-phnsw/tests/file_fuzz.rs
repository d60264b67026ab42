//! Hostile region files: random mutations of one file of a valid p-hnsw
//! directory must give an error at open (or an index that answers and
//! checks its own structure), never a panic, a hang or a huge allocation.
//! The valid directory holds every node state of format version 3: live,
//! deleted (tombstones), unlinked by a consolidation and reused by inserts
//! after it. The regions carry their own checksums (header, node records),
//! so no re-seal applies.

use proptest::prelude::*;

// `reseal` is for formats with a trailing file CRC, which the regions do not have.
#[allow(dead_code)]
#[path = "../../test-support/file_mutation.rs"]
mod file_mutation;
use file_mutation::{apply, mutation};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use vectide_core::{Error, Metric, SearchParams, VectorIndex};
use vectide_graph::HnswParams;
use vectide_phnsw::{PHnsw, PHnswParams};
use vectide_storage::PersistMode;

/// The valid directory's files: (name, bytes).
fn valid_files() -> &'static [(String, Vec<u8>)] {
    static FILES: OnceLock<Vec<(String, Vec<u8>)>> = OnceLock::new();
    FILES.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let params = PHnswParams {
            hnsw: HnswParams {
                m: 4,
                ef_construction: 16,
                threads: Some(1),
                ..HnswParams::default()
            },
            initial_capacity: 64,
            ..PHnswParams::default()
        };
        let idx = PHnsw::create(dir.path(), 3, Metric::L2, params, PersistMode::Pmem).unwrap();
        let v = |i: u64| [(i * 7 % 23) as f32 - 11.0, (i % 5) as f32, i as f32 * 0.1];
        let ids: Vec<u64> = (0..40).collect();
        let flat: Vec<f32> = ids.iter().flat_map(|&i| v(i)).collect();
        idx.insert(1, &ids, &flat).unwrap();
        idx.delete(2, &(0..12).collect::<Vec<_>>()).unwrap();
        idx.maintain().unwrap();
        let ids: Vec<u64> = (100..106).collect();
        let flat: Vec<f32> = ids.iter().flat_map(|&i| v(i)).collect();
        idx.insert(3, &ids, &flat).unwrap();
        idx.delete(4, &[20, 21]).unwrap();
        drop(idx);
        let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.is_file())
            .map(|p| (name(&p), std::fs::read(&p).unwrap()))
            .collect();
        files.sort();
        files
    })
}

fn name(p: &Path) -> String {
    p.file_name().unwrap().to_string_lossy().into_owned()
}

/// A fresh copy of the valid directory with file `which` replaced by `bytes`.
fn copy_with(which: usize, bytes: &[u8]) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    for (i, (n, b)) in valid_files().iter().enumerate() {
        std::fs::write(dir.path().join(n), if i == which { bytes } else { b }).unwrap();
    }
    let p = dir.path().to_path_buf();
    (dir, p)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn a_mutated_region_file_never_panics(
        which in any::<prop::sample::Index>(),
        muts in prop::collection::vec(mutation(), 1..4),
    ) {
        let which = which.index(valid_files().len());
        let mut bytes = valid_files()[which].1.clone();
        apply(&mut bytes, &muts);
        let (_keep, dir) = copy_with(which, &bytes);
        // Either an error, or an index whose search and structure check
        // answer or name the damage (a mutation may hit bytes that only a
        // read of them finds, e.g. a node record's checksum).
        if let Ok(idx) = PHnsw::open(&dir, PersistMode::Pmem, Some(1)) {
            let r = idx.search(&[0.0, 1.0, 2.0], 5, &SearchParams::default(), None);
            prop_assert!(matches!(r, Ok(_) | Err(Error::Corrupted(_))), "{:?}", r);
            let c = idx.check_structure();
            prop_assert!(matches!(c, Ok(_) | Err(Error::Corrupted(_))), "{:?}", c);
        }
    }
}

#[test]
fn the_valid_directory_opens_with_every_node_state() {
    let (_keep, dir) = copy_with(usize::MAX, &[]);
    let idx = PHnsw::open(&dir, PersistMode::Pmem, Some(1)).unwrap();
    assert_eq!(idx.len(), 40 - 12 + 6 - 2);
    assert_eq!(idx.check_structure().unwrap(), Vec::<String>::new());
    assert!(
        valid_files().len() >= 3,
        "{:?}",
        valid_files().iter().map(|f| &f.0).collect::<Vec<_>>()
    );
}
