//! The paper baselines' failure path: `hnsw-wal` whose logged call fails
//! to apply is poisoned until a reopen replays its log.

#[path = "../../test-support/hold_sync.rs"]
mod hold_sync;
#[path = "../../test-support/oracle.rs"]
mod oracle;
#[path = "../../test-support/poison.rs"]
mod poison;

use vectide_core::{Metric, VectorIndex};
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

/// `hnsw-snap`'s snapshot is written under the baseline's lock (the
/// paper's baseline: inserts wait while it is written) but synced after
/// it: another writer goes on while the writer that took it is inside its
/// fsync (before, the fsync ran under the lock and every writer waited for
/// the disk).
#[test]
fn an_hnsw_snap_writer_does_not_wait_for_another_writers_snapshot_fsync() {
    use hold_sync::Hold;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Duration;
    use vectide_core::sync::install_sync_observer;

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ix");
    let dim = 8;
    let data = oracle::clustered(300, dim, 4, 2);
    let mut p = BaselineParams::defaults(BaselineKind::Snap);
    p.snapshot_every = 100;
    let idx = Arc::new(Baseline::create(&path, BaselineKind::Snap, dim, Metric::L2, p).unwrap());
    idx.insert(1, &(0..50).collect::<Vec<u64>>(), &data[..50 * dim])
        .unwrap();
    let hold = Arc::new(Hold::new(|e| {
        e.site == vectide_core::io::ATOMIC_WRITE_FILE
            && e.path.to_string_lossy().contains("snapshot")
    }));
    let guard = install_sync_observer(dir.path(), hold.clone());
    // 100 more rows: this write takes the snapshot.
    let a_done = Arc::new(AtomicBool::new(false));
    let a = {
        let (idx, done) = (idx.clone(), a_done.clone());
        let rows = data[50 * dim..150 * dim].to_vec();
        std::thread::spawn(move || {
            let r = idx.insert(2, &(50..150).collect::<Vec<u64>>(), &rows);
            done.store(true, Ordering::SeqCst);
            r
        })
    };
    hold.wait_held(|| a_done.load(Ordering::SeqCst));
    let b = {
        let idx = idx.clone();
        let row = data[200 * dim..201 * dim].to_vec();
        std::thread::spawn(move || idx.insert(3, &[200], &row))
    };
    let b_went_on = hold_sync::finishes_within(&b, Duration::from_secs(5));
    hold.release();
    a.join().unwrap().unwrap();
    b.join().unwrap().unwrap();
    drop(guard);
    assert!(
        hold.released_during_sync(),
        "the snapshot's fsync was not held"
    );
    assert!(
        b_went_on,
        "a write waited for another write's snapshot fsync"
    );
    assert_eq!(idx.durable_seq(), 2, "the snapshot holds writes 1 and 2");
    drop(idx);
    let idx = Baseline::open(&path, None).unwrap();
    assert_eq!(idx.len(), 150, "the snapshot, without the write after it");
}
