//! The `fresh-diskann` engine end to end, against the brute-force oracle:
//! inserts, deletes and upserts across the RW/RO temp indexes and the LTI,
//! merges (on request and in the background, with searches and writes
//! going on), reopening after each stage, and bad input.

#[path = "../../test-support/hold_sync.rs"]
mod hold_sync;
#[path = "../../test-support/oracle.rs"]
mod oracle;
#[path = "../../test-support/poison.rs"]
mod poison;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use vectide_core::{Error, Metric, SearchParams, VectorIndex};
use vectide_diskann::{FreshDiskann, FreshDiskannParams, OpenKnobs};

const DIM: usize = 16;

fn params(temp: usize, merge: usize) -> FreshDiskannParams {
    let mut p = FreshDiskannParams {
        pq_bytes: 8,
        temp_points: temp,
        merge_points: merge,
        ..FreshDiskannParams::default()
    };
    p.graph.threads = Some(2);
    p
}

/// The model: id → vector of every live point.
type Model = BTreeMap<u64, Vec<f32>>;

fn recall(ix: &dyn VectorIndex, model: &Model, queries: &[Vec<f32>], metric: Metric) -> f64 {
    let points: Vec<(u64, Vec<f32>)> = model.iter().map(|(k, v)| (*k, v.clone())).collect();
    let p = SearchParams {
        ef: Some(48),
        ..SearchParams::default()
    };
    let found: Vec<Vec<u64>> = queries
        .iter()
        .map(|q| {
            ix.search(q, 10, &p, None)
                .unwrap()
                .iter()
                .map(|n| n.id)
                .collect()
        })
        .collect();
    let truth: Vec<Vec<u64>> = queries
        .iter()
        .map(|q| oracle::brute_force(metric, &points, q, 10))
        .collect();
    oracle::recall(&found, &truth)
}

fn stat(ix: &dyn VectorIndex, name: &str) -> f64 {
    ix.stats()
        .unwrap()
        .extra_value(name)
        .unwrap_or_else(|| panic!("no stat {name}"))
}

fn check_same(ix: &dyn VectorIndex, model: &Model) {
    assert_eq!(ix.len(), model.len());
    for (id, v) in model.iter().step_by(37) {
        assert_eq!(ix.get(*id).unwrap().as_deref(), Some(&v[..]), "id {id}");
    }
    assert!(ix.check_structure().unwrap().is_empty());
}

#[test]
fn inserts_deletes_upserts_merges_and_reopens_match_the_oracle() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ix");
    let metric = Metric::L2;
    let data = oracle::clustered(4000, DIM, 12, 11);
    let row = |i: usize| data[i * DIM..(i + 1) * DIM].to_vec();
    let queries: Vec<Vec<f32>> = (0..50)
        .map(|i| row(i * 79).iter().map(|x| x + 0.02).collect())
        .collect();
    let mut model = Model::new();
    let ix = FreshDiskann::create(&path, DIM, metric, params(700, 1_000_000)).unwrap();
    let mut seq = 0;
    // 2,000 points in batches: the RW index freezes every 700.
    for b in 0..10 {
        seq += 1;
        let ids: Vec<u64> = (b * 200..(b + 1) * 200).map(|i| i as u64).collect();
        let v: Vec<f32> = ids.iter().flat_map(|&i| row(i as usize)).collect();
        ix.insert(seq, &ids, &v).unwrap();
        for &i in &ids {
            model.insert(i, row(i as usize));
        }
    }
    assert!(stat(&ix, "temp_indexes") >= 3.0, "the RW index froze");
    // First merge: the LTI is built from the temp indexes.
    assert!(ix.merge_now().unwrap());
    assert_eq!(stat(&ix, "lti_points"), 2000.0);
    assert_eq!(stat(&ix, "temp_points"), 0.0);
    check_same(&ix, &model);
    let r0 = recall(&ix, &model, &queries, metric);
    assert!(r0 >= 0.9, "recall after the first LTI {r0}");
    // Deletes of LTI points, upserts of LTI points (new vectors), inserts.
    seq += 1;
    let del: Vec<u64> = (0..2000).step_by(10).collect();
    assert_eq!(ix.delete(seq, &del).unwrap(), del.len());
    for id in &del {
        model.remove(id);
    }
    seq += 1;
    let up: Vec<u64> = (5..2000).step_by(20).collect();
    let upv: Vec<f32> = up.iter().flat_map(|&i| row(2000 + i as usize)).collect();
    ix.insert(seq, &up, &upv).unwrap();
    for &i in &up {
        model.insert(i, row(2000 + i as usize));
    }
    seq += 1;
    let new: Vec<u64> = (3000..3600).collect();
    let nv: Vec<f32> = new.iter().flat_map(|&i| row(i as usize)).collect();
    ix.insert(seq, &new, &nv).unwrap();
    for &i in &new {
        model.insert(i, row(i as usize));
    }
    assert_eq!(stat(&ix, "lti_dead"), (del.len() + up.len()) as f64);
    check_same(&ix, &model);
    let r1 = recall(&ix, &model, &queries, metric);
    // Deleted ids never come back.
    let p = SearchParams::with_ef(64);
    for q in &queries {
        for n in ix.search(q, 10, &p, None).unwrap() {
            assert!(model.contains_key(&n.id), "deleted id {} returned", n.id);
        }
    }
    // Reopen before the merge: LTI + snapshots + redo log.
    let durable = ix.durable_seq();
    drop(ix);
    let ix = FreshDiskann::open(&path, OpenKnobs::threads(2)).unwrap();
    assert_eq!(ix.durable_seq(), durable);
    check_same(&ix, &model);
    // StreamingMerge over the LTI.
    assert!(ix.merge_now().unwrap());
    assert_eq!(stat(&ix, "lti_dead"), 0.0);
    assert_eq!(stat(&ix, "temp_points"), 0.0);
    assert_eq!(stat(&ix, "lti_points"), model.len() as f64);
    check_same(&ix, &model);
    let r2 = recall(&ix, &model, &queries, metric);
    assert!(r2 >= r1 - 0.03, "recall {r1} before the merge, {r2} after");
    assert!(ix.last_merge().unwrap().repaired > 0);
    drop(ix);
    let ix = FreshDiskann::open(&path, OpenKnobs::threads(2)).unwrap();
    check_same(&ix, &model);
    assert_eq!(recall(&ix, &model, &queries, metric), r2);
    // Only the files the manifest names are left.
    let mut names: Vec<String> = std::fs::read_dir(&path)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert!(
        names.iter().all(|n| n == "MANIFEST"
            || n.starts_with("lti-2")
            || n.starts_with("pq-2")
            || n.starts_with("redo-")),
        "{names:?}"
    );
}

#[test]
fn searches_and_writes_go_on_during_a_background_merge() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ix");
    let data = oracle::clustered(6000, DIM, 8, 5);
    let row = |i: usize| data[i * DIM..(i + 1) * DIM].to_vec();
    let ix = FreshDiskann::create(&path, DIM, Metric::L2, params(1000, 2500)).unwrap();
    let ids: Vec<u64> = (0..2000).collect();
    let v: Vec<f32> = ids.iter().flat_map(|&i| row(i as usize)).collect();
    ix.insert(1, &ids, &v).unwrap();
    ix.merge_now().unwrap();
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut n = 0;
            while !done.load(Ordering::Acquire) || n < 20 {
                let q = row(n % 2000);
                let r = ix.search(&q, 5, &SearchParams::default(), None).unwrap();
                assert!(!r.is_empty());
                n += 1;
            }
        });
        // 3,000 more points and 500 deletes: past merge_points, so a
        // merge starts in the background while these calls go on.
        let mut seq = 1;
        for b in 0..15 {
            seq += 1;
            let ids: Vec<u64> = (2000 + b * 200..2000 + (b + 1) * 200).collect();
            let v: Vec<f32> = ids.iter().flat_map(|&i| row(i as usize)).collect();
            ix.insert(seq, &ids, &v).unwrap();
            seq += 1;
            let del: Vec<u64> = (b * 33..(b + 1) * 33).collect();
            ix.delete(seq, &del).unwrap();
        }
        done.store(true, Ordering::Release);
    });
    ix.close().unwrap();
    assert!(stat(&ix, "merges") >= 2.0, "a background merge ran");
    assert_eq!(stat(&ix, "merge_failures"), 0.0);
    assert_eq!(ix.len(), 5000 - 15 * 33);
    assert!(ix.check_structure().unwrap().is_empty());
    for id in [0u64, 100, 494] {
        assert!(!ix.contains(id).unwrap());
    }
    assert!(ix.contains(4999).unwrap() && ix.contains(495).unwrap());
}

#[test]
fn bad_input_is_an_error_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ix");
    let ix = FreshDiskann::create(&path, DIM, Metric::Cosine, params(100, 1000)).unwrap();
    ix.insert(1, &[1, 2], &[0.5; 2 * DIM]).unwrap();
    assert!(matches!(
        ix.insert(2, &[3], &[0.5; DIM - 1]),
        Err(Error::DimensionMismatch { .. })
    ));
    let mut nan = vec![0.5; DIM];
    nan[3] = f32::NAN;
    assert!(ix.insert(3, &[4], &nan).is_err());
    assert!(ix
        .search(&[1.0; 3], 5, &SearchParams::default(), None)
        .is_err());
    assert_eq!(ix.len(), 2);
    assert!(
        FreshDiskann::create(&path, DIM, Metric::Cosine, params(100, 1000)).is_err(),
        "an index is there"
    );
    let mut p = params(100, 1000);
    p.pq_bytes = DIM + 1;
    assert!(FreshDiskann::create(&dir.path().join("other"), DIM, Metric::L2, p).is_err());
    // An older sequence number is skipped, as the contract says.
    ix.insert(1, &[1], &[0.9; DIM]).unwrap();
    assert_eq!(ix.get(1).unwrap().unwrap()[0], 1.0 / (DIM as f32).sqrt());
    drop(ix);
    damaged_files_are_errors(&path);
}

fn damaged_files_are_errors(path: &Path) {
    // A flipped byte in the manifest.
    let m = path.join("MANIFEST");
    let good = std::fs::read(&m).unwrap();
    let mut bad = good.clone();
    bad[20] ^= 1;
    std::fs::write(&m, &bad).unwrap();
    assert!(matches!(
        FreshDiskann::open(path, OpenKnobs::threads(1)),
        Err(Error::Corrupted(_))
    ));
    std::fs::write(&m, &good).unwrap();
    // A redo log damaged in the middle is an error; a torn tail is dropped.
    let log = std::fs::read_dir(path)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("redo-")
        })
        .unwrap();
    let ix = FreshDiskann::open(path, OpenKnobs::threads(1)).unwrap();
    ix.insert(10, &[7], &[0.25; DIM]).unwrap();
    drop(ix);
    let bytes = std::fs::read(&log).unwrap();
    let mut torn = bytes.clone();
    torn.truncate(bytes.len() - 5);
    std::fs::write(&log, &torn).unwrap();
    let ix = FreshDiskann::open(path, OpenKnobs::threads(1)).unwrap();
    assert!(!ix.contains(7).unwrap(), "the torn last record is dropped");
    assert!(ix.contains(1).unwrap());
    drop(ix);
    std::fs::write(&log, &bytes).unwrap();
    let mut mid = bytes.clone();
    mid[40] ^= 0xff;
    std::fs::write(&log, &mid).unwrap();
    assert!(
        FreshDiskann::open(path, OpenKnobs::threads(1)).is_err(),
        "a bad record before a good one"
    );
}

/// A write whose apply fails after it is logged poisons the index until a
/// reopen replays it (`vectide_core::poison`); freezes and merges are
/// refused meanwhile (a freeze would drop the log that holds the write).
#[test]
fn a_failed_apply_poisons_the_index_until_the_reopen_replays_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ix");
    let data = oracle::clustered(600, DIM, 8, 3);
    poison::a_failed_apply_poisons_until_the_reopen(
        dir.path(),
        vectide_diskann::APPLY_FAULT,
        DIM,
        &data,
        450,
        || Box::new(FreshDiskann::create(&path, DIM, Metric::L2, params(100, 400)).unwrap()),
        || Box::new(FreshDiskann::open(&path, OpenKnobs::threads(2)).unwrap()),
    );
}

/// Holds a freeze's save of the frozen index (an atomic write of
/// `temp-N.fv`) in its fsync.
fn hold_temp_save() -> std::sync::Arc<hold_sync::Hold> {
    std::sync::Arc::new(hold_sync::Hold::new(|e| {
        e.site == vectide_core::io::ATOMIC_WRITE_FILE
            && e.path
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(".temp-"))
    }))
}

/// Under the database's log, a freeze saves the frozen temp index without
/// the writer lock: writes go on while its file is synced, and the
/// watermark moves to the frozen writes only once the manifest names them
/// (the save is held in its fsync until a second writer finished).
#[test]
fn writers_do_not_wait_for_a_freeze_to_save_the_frozen_index() {
    use std::sync::Arc;
    use vectide_core::sync::install_sync_observer;

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ix");
    let mut p = params(100, 1_000_000);
    p.external_log = true;
    let ix = Arc::new(FreshDiskann::create(&path, DIM, Metric::L2, p).unwrap());
    let data = oracle::clustered(200, DIM, 4, 11);
    for i in 0..99u64 {
        let at = i as usize * DIM;
        ix.insert(i + 1, &[i], &data[at..at + DIM]).unwrap();
    }
    let before = ix.durable_seq();
    let hold = hold_temp_save();
    let _g = install_sync_observer(&path, hold.clone());
    // The 100th point fills the RW index: its write freezes it.
    let freezer = {
        let ix = ix.clone();
        let v = data[99 * DIM..100 * DIM].to_vec();
        std::thread::spawn(move || ix.insert(100, &[99], &v))
    };
    hold.wait_held(|| freezer.is_finished());
    // The freeze is inside its save's fsync now.
    ix.insert(101, &[100], &data[100 * DIM..101 * DIM]).unwrap();
    assert_eq!(ix.delete(102, &[0]).unwrap(), 1);
    assert_eq!(
        ix.durable_seq(),
        before,
        "the watermark moved before the manifest named the frozen writes"
    );
    hold.release();
    freezer.join().unwrap().unwrap();
    assert!(
        hold.released_during_sync(),
        "the writes waited for the freeze's save"
    );
    assert!(ix.durable_seq() >= 100, "{}", ix.durable_seq());
    assert_eq!(ix.len(), 100);
    assert!(ix.check_structure().unwrap().is_empty());
    // Reopened, the frozen index is there; the writes after the freeze are
    // the database's to replay (past `durable_seq()`).
    let durable = ix.durable_seq();
    drop(ix);
    let knobs = OpenKnobs {
        external_log: true,
        ..OpenKnobs::threads(2)
    };
    let again = FreshDiskann::open(&path, knobs).unwrap();
    assert_eq!(again.durable_seq(), durable);
    // Ids 1..=99 were written at or before the freeze (id 0 was deleted
    // after it: the database replays that delete either way).
    for i in 1..100u64 {
        assert!(again.contains(i).unwrap(), "{i} lost");
    }
    assert!(again.check_structure().unwrap().is_empty());
}

/// Standalone too, the frozen index is saved without the writer lock:
/// writes go on, logged in the next serial's log, while the save is held
/// in its fsync. A copy of the directory taken then is the state a crash
/// before the freeze's manifest leaves (the old manifest beside both
/// logs): opened, it holds every write of both logs and has finished the
/// freeze (the manifest names the snapshot, the new log is the RW log).
#[test]
fn a_standalone_freeze_lets_writers_go_on_and_a_crash_before_its_manifest_loses_nothing() {
    use std::sync::Arc;
    use vectide_core::sync::install_sync_observer;

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ix");
    let ix =
        Arc::new(FreshDiskann::create(&path, DIM, Metric::L2, params(100, 1_000_000)).unwrap());
    let data = oracle::clustered(200, DIM, 4, 12);
    let row = |i: u64| data[i as usize * DIM..(i as usize + 1) * DIM].to_vec();
    for i in 0..99u64 {
        ix.insert(i + 1, &[i], &row(i)).unwrap();
    }
    let hold = hold_temp_save();
    let _g = install_sync_observer(&path, hold.clone());
    let freezer = {
        let ix = ix.clone();
        let v = row(99);
        std::thread::spawn(move || ix.insert(100, &[99], &v))
    };
    hold.wait_held(|| freezer.is_finished());
    // Inside the save's fsync: these are logged in redo-2.log and synced.
    ix.insert(101, &[100], &row(100)).unwrap();
    assert_eq!(ix.delete(102, &[0]).unwrap(), 1);
    ix.insert(103, &[5], &row(150)).unwrap();
    let crashed = dir.path().join("crashed");
    std::fs::create_dir(&crashed).unwrap();
    for e in std::fs::read_dir(&path).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), crashed.join(e.file_name())).unwrap();
    }
    hold.release();
    freezer.join().unwrap().unwrap();
    assert!(
        hold.released_during_sync(),
        "the writes waited for the freeze's save"
    );
    assert!(!crashed.join("temp-1.fv").exists() && crashed.join("redo-2.log").exists());
    let check = |ix: &FreshDiskann| {
        assert_eq!(ix.len(), 100);
        assert!(!ix.contains(0).unwrap());
        for i in 1..=100u64 {
            assert!(ix.contains(i).unwrap(), "{i} lost");
        }
        assert_eq!(ix.get(5).unwrap().unwrap(), row(150));
        assert_eq!(ix.get(100).unwrap().unwrap(), row(100));
        assert!(ix.durable_seq() >= 103, "{}", ix.durable_seq());
        assert!(ix.check_structure().unwrap().is_empty());
    };
    check(&ix);
    drop(ix);
    let again = FreshDiskann::open(&crashed, OpenKnobs::threads(2)).unwrap();
    check(&again);
    // The freeze is finished: its snapshot saved and named, the old log gone.
    assert!(crashed.join("temp-1.fv").exists() && !crashed.join("redo-1.log").exists());
    again.insert(104, &[150], &row(151)).unwrap();
    drop(again);
    let again = FreshDiskann::open(&crashed, OpenKnobs::threads(2)).unwrap();
    assert_eq!(again.len(), 101);
    assert_eq!(again.get(150).unwrap().unwrap(), row(151));
    assert_eq!(again.get(5).unwrap().unwrap(), row(150));
}
