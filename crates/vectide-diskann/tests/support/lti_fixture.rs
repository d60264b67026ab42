//! An LTI on disk for the merge's RAM tests: a FreshVamana graph over the
//! first `n` rows of `data`, written with `pq_bytes`-byte codes into `dir`
//! and opened.

use std::path::Path;
use vectide_core::sync::SyncSite;
use vectide_core::{Metric, VectorIndex};
use vectide_diskann::lti::{self, GraphSource, Lti};
use vectide_storage::block::DirectFile;
use vectide_vamana::{FreshVamana, VamanaParams};

pub const SITE: SyncSite = SyncSite("test.lti_fixture");

pub fn build_lti(dir: &Path, data: &[f32], n: usize, dim: usize, pq_bytes: usize) -> Lti {
    let path = dir.join("old.lti");
    let pq = dir.join("old.pq");
    let params = VamanaParams {
        threads: Some(2),
        ..VamanaParams::default()
    };
    let v = FreshVamana::new(dim, Metric::L2, params).unwrap();
    let ids: Vec<u64> = (0..n as u64).collect();
    v.insert(1, &ids, &data[..n * dim]).unwrap();
    let g = v.export_graph();
    let f = DirectFile::open(&path, true, SITE).unwrap();
    let source = GraphSource {
        durable_seq: 1,
        ..GraphSource::from_export(&g)
    };
    lti::write(&f, &pq, &source, pq_bytes, 0).unwrap();
    Lti::open(Box::new(DirectFile::open(&path, false, SITE).unwrap()), &pq).unwrap()
}
