//! The paper baselines' failure path: `hnsw-wal` whose logged call fails
//! to apply is poisoned until a reopen replays its log.

#[path = "../../test-support/oracle.rs"]
mod oracle;
#[path = "../../test-support/poison.rs"]
mod poison;

use vectide_core::Metric;
use vectide_phnsw::baselines::{Baseline, BaselineKind, BaselineParams, APPLY_FAULT};

#[test]
fn a_failed_apply_poisons_hnsw_wal_until_the_reopen_replays_its_log() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ix");
    let data = oracle::clustered(300, 8, 4, 2);
    poison::a_failed_apply_poisons_until_the_reopen(
        dir.path(),
        APPLY_FAULT,
        8,
        &data,
        200,
        || {
            let p = BaselineParams::defaults(BaselineKind::Wal);
            Box::new(Baseline::create(&path, BaselineKind::Wal, 8, Metric::L2, p).unwrap())
        },
        || Box::new(Baseline::open(&path, Some(1)).unwrap()),
    );
}

#[test]
fn both_baselines_scan_their_graph_for_an_exact_search() {
    for kind in [BaselineKind::Wal, BaselineKind::Snap] {
        let dir = tempfile::tempdir().unwrap();
        let p = BaselineParams::defaults(kind);
        let idx = Baseline::create(&dir.path().join("ix"), kind, 12, Metric::L2, p).unwrap();
        oracle::check_exact_scan_under_churn(&idx, 12);
    }
}
