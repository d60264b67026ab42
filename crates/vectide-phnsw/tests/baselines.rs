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

/// Callers number their writes before they take the index's lock, so a
/// write numbered below a snapshot's watermark can reach the log after the
/// snapshot truncated it; the reopen replays it all the same.
#[test]
fn hnsw_wal_replays_a_write_numbered_below_the_last_snapshot() {
    use vectide_core::VectorIndex;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ix");
    let mut p = BaselineParams::defaults(BaselineKind::Wal);
    p.snapshot_every = 2;
    let data = oracle::clustered(3, 8, 1, 4);
    let idx = Baseline::create(&path, BaselineKind::Wal, 8, Metric::L2, p).unwrap();
    idx.insert(11, &[1], &data[..8]).unwrap();
    idx.insert(12, &[2], &data[8..16]).unwrap(); // a snapshot (2 rows), the log cut
    idx.insert(10, &[3], &data[16..]).unwrap();
    idx.flush().unwrap();
    drop(idx);
    let back = Baseline::open(&path, Some(1)).unwrap();
    for id in [1, 2, 3] {
        assert!(back.contains(id).unwrap(), "id {id} lost");
    }
}

/// The late write re-upserts an id the snapshot holds with a newer number:
/// it was skipped when written, and the replay must skip it too, not batch
/// it with a later call whose higher stamp would let it through.
#[test]
fn hnsw_wal_replays_a_late_stale_upsert_without_applying_it() {
    use vectide_core::VectorIndex;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ix");
    let mut p = BaselineParams::defaults(BaselineKind::Wal);
    p.snapshot_every = 3;
    let v = |x: f32| vec![x; 8];
    let idx = Baseline::create(&path, BaselineKind::Wal, 8, Metric::L2, p).unwrap();
    idx.insert(11, &[1], &v(1.0)).unwrap();
    let two: Vec<f32> = [v(2.0), v(3.0)].concat();
    idx.insert(12, &[2, 3], &two).unwrap(); // 3 rows: a snapshot, the log cut
    idx.insert(10, &[1], &v(9.0)).unwrap(); // older than what id 1 holds: skipped
    idx.insert(13, &[4], &v(4.0)).unwrap();
    assert_eq!(idx.get(1).unwrap().unwrap(), v(1.0));
    idx.flush().unwrap();
    drop(idx);
    let back = Baseline::open(&path, Some(1)).unwrap();
    assert_eq!(
        back.get(1).unwrap().unwrap(),
        v(1.0),
        "the stale upsert came back"
    );
    assert!(back.contains(4).unwrap());
}
