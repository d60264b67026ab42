//! Damaged files: a WAL bad in the middle refuses to open (naming the
//! segment and offset) and `repair` salvages what precedes the damage; only
//! a torn tail of the last segment is cut; a damaged point store file is a
//! typed error, not a panic; restarts replay a bounded tail.

use serde_json::json;
use std::path::{Path, PathBuf};
use std::time::Duration;
use vectide_core::Metric;
use vectide_db::{CollectionConfig, Database, DbError, ExtId, Options, PointInput};
use vectide_engines::{ParamValue, Params};

fn cfg() -> CollectionConfig {
    let mut params = Params::new();
    params.insert("m".into(), ParamValue::Int(8));
    params.insert("ef_construction".into(), ParamValue::Int(32));
    CollectionConfig {
        dim: 4,
        metric: Metric::L2,
        engine: "hnsw".into(),
        params,
        ..Default::default()
    }
}

fn opts() -> Options {
    Options {
        checkpoint_interval: Duration::from_secs(3600),
        checkpoint_bytes: 1 << 40,
        checkpoint_min_bytes: 1 << 40,
        segment_bytes: 4096,
        ..Options::default()
    }
}

fn point(i: u64) -> PointInput {
    PointInput {
        id: ExtId::Num(i),
        vector: vec![i as f32, 1.0, -(i as f32), 0.5],
        payload: json!({"i": i}),
    }
}

/// A collection whose engine hands its log over to the database's
/// (`fresh-diskann`): a checkpoint makes the point store durable through
/// the last operation but keeps the log from the engine's own durable
/// point, which it moves only at its freezes and merges.
fn handover_cfg() -> CollectionConfig {
    CollectionConfig {
        engine: "fresh-diskann".into(),
        params: Params::new(),
        ..cfg()
    }
}

/// 680 acknowledged upserts, one per record, then deletes of ids 0..20, in
/// a `fresh-diskann` collection; a checkpoint then makes the point store
/// durable through all of them while the engine has persisted none (the
/// log keeps every record), and the process "dies". Returns the WAL
/// segments, oldest first.
fn fill(dir: &Path) -> Vec<PathBuf> {
    let db = Database::open(dir, opts()).unwrap();
    let c = db.create_collection("docs", handover_cfg()).unwrap();
    for i in 0..680 {
        c.upsert(&[point(i)]).unwrap();
    }
    let del: Vec<ExtId> = (0..20).map(ExtId::Num).collect();
    c.delete(Some(&del), None).unwrap();
    c.checkpoint().unwrap();
    assert!(
        segments(dir).len() > 4,
        "the log keeps what the engine has not persisted"
    );
    drop(c);
    drop(db);
    segments(dir)
}

fn segments(dir: &Path) -> Vec<PathBuf> {
    let mut segs: Vec<PathBuf> = std::fs::read_dir(dir.join("collections/docs/wal"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    segs.sort();
    segs
}

fn flip(path: &Path, at: usize) {
    let mut b = std::fs::read(path).unwrap();
    for x in &mut b[at..at + 8] {
        *x ^= 0x5a;
    }
    std::fs::write(path, b).unwrap();
}

fn corrupted(dir: &Path) -> String {
    match Database::open(dir, opts()) {
        Err(DbError::Core(vectide_core::Error::Corrupted(m))) => m,
        Err(e) => panic!("expected a corruption error, got {e}"),
        Ok(db) => panic!(
            "opened with {} points instead of failing",
            db.collection("docs").unwrap().len()
        ),
    }
}

#[test]
fn damage_in_an_earlier_segment_is_an_error_and_repair_salvages_the_prefix() {
    let dir = tempfile::tempdir().unwrap();
    let segs = fill(dir.path());
    assert!(segs.len() > 4, "{} segments", segs.len());
    let before = std::fs::read(&segs[2]).unwrap();
    let at = before.len() / 2;
    flip(&segs[2], at);
    let msg = corrupted(dir.path());
    let name = segs[2].file_name().unwrap().to_string_lossy().into_owned();
    assert!(msg.contains(&name), "{msg}");
    assert!(msg.contains("damaged at byte"), "{msg}");
    // Refusing to open changed nothing.
    assert_eq!(segments(dir.path()), segs);
    let rep = vectide_db::repair(dir.path(), opts()).unwrap();
    let wal = &rep[0].wal;
    let (path, offset, _) = wal.damage.clone().unwrap();
    assert_eq!(path, segs[2]);
    assert!(offset as usize <= at);
    assert_eq!(wal.removed_segments.len(), segs.len() - 3);
    // Records 1..=kept are kept; every later record is reported dropped
    // (all but the damaged one are readable).
    let kept = wal.kept_through;
    assert!(kept > 0 && kept < 680);
    assert_eq!(
        wal.dropped_seqs.unwrap().1,
        681,
        "the delete was the last record"
    );
    assert!(wal.dropped_records >= 680 - kept as usize, "{wal:?}");
    // The engine (which persisted nothing) replayed upserts 0..kept; the
    // point store's checkpoint held every operation. The
    // repair made them agree: points after the cut lost their vectors and
    // were deleted (listed), and the delete of ids 0..20, which had reached
    // the store, was carried to the engine.
    let kept = kept as usize;
    assert_eq!(rep[0].orphans_removed.len(), 680 - kept);
    assert_eq!(rep[0].stale_vectors_removed, 20);
    let db = Database::open(dir.path(), opts()).unwrap();
    let c = db.collection("docs").unwrap();
    assert_eq!(c.len(), kept - 20);
    let got = c
        .get(
            &[
                ExtId::Num(0),
                ExtId::Num(kept as u64 - 1),
                ExtId::Num(kept as u64),
            ],
            true,
        )
        .unwrap();
    assert!(got[0].is_none());
    assert_eq!(
        got[1].as_ref().unwrap().vector.as_deref(),
        Some(&point(kept as u64 - 1).vector[..])
    );
    assert!(
        got[2].is_none(),
        "upsert {kept} lost its vector with the cut"
    );
    let hits = c
        .search(
            &point(3).vector,
            5,
            &vectide_core::SearchParams::default(),
            None,
            false,
            false,
        )
        .unwrap();
    assert!(hits
        .iter()
        .all(|h| matches!(h.id, ExtId::Num(i) if (20..kept as u64).contains(&i))));
    // New writes continue after the salvaged prefix and survive a restart.
    c.upsert(&[point(5000)]).unwrap();
    drop(c);
    drop(db);
    let db = Database::open(dir.path(), opts()).unwrap();
    assert_eq!(db.collection("docs").unwrap().len(), kept - 19);
}

#[test]
fn damage_near_the_end_of_the_last_segment_is_an_error_a_torn_tail_is_cut() {
    let dir = tempfile::tempdir().unwrap();
    let mut segs = fill(dir.path());
    // The checkpoint rotated to a new, empty segment; a crash before its
    // creation was durable leaves the one before it last.
    let empty = segs.pop().unwrap();
    let bytes = std::fs::read(&empty).unwrap();
    assert!(vectide_storage::wal::scan(&empty, &bytes)
        .unwrap()
        .records
        .is_empty());
    std::fs::remove_file(&empty).unwrap();
    let last = segs.last().unwrap().clone();
    let clean = std::fs::read(&last).unwrap();
    // Flipped in the second-to-last record (as at 95 % of a long segment):
    // a valid record follows.
    let scan = vectide_storage::wal::scan(&last, &clean).unwrap();
    assert!(scan.records.len() >= 2);
    let (off, _) = scan.records[scan.records.len() - 2];
    flip(&last, off as usize + 4);
    let msg = corrupted(dir.path());
    assert!(
        msg.contains(&last.file_name().unwrap().to_string_lossy().into_owned()),
        "{msg}"
    );
    // The last, acknowledged record cut short looks torn to the log, but the
    // point store had applied it (after its fsync): the store is ahead of
    // the log, which lost an acknowledged record, and that is reported
    // without creating or cutting anything.
    std::fs::write(&last, &clean[..clean.len() - 3]).unwrap();
    let msg = corrupted(dir.path());
    assert!(msg.contains("were lost"), "{msg}");
    assert_eq!(segments(dir.path()), segs);
    // A torn tail (a record cut short by the crash, never acknowledged) is
    // cut and the rest opens.
    let mut torn = clean.clone();
    torn.extend_from_slice(&[200, 0, 0, 0, 1, 2, 3, 4, 9, 9, 9]);
    std::fs::write(&last, &torn).unwrap();
    let db = Database::open(dir.path(), opts()).unwrap();
    assert_eq!(db.collection("docs").unwrap().len(), 660);
    drop(db);
    assert_eq!(
        std::fs::read(&last).unwrap(),
        clean,
        "the torn bytes were cut"
    );
}

#[test]
fn a_truncated_earlier_segment_or_a_missing_one_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let segs = fill(dir.path());
    let b = std::fs::read(&segs[1]).unwrap();
    std::fs::write(&segs[1], &b[..b.len() - 5]).unwrap();
    let msg = corrupted(dir.path());
    assert!(msg.contains("later segments follow"), "{msg}");
    std::fs::write(&segs[1], &b).unwrap();
    std::fs::remove_file(&segs[3]).unwrap();
    let msg = corrupted(dir.path());
    assert!(msg.contains("records are missing"), "{msg}");
}

#[test]
fn damaged_point_stores_and_catalogs_are_typed_errors() {
    let dir = tempfile::tempdir().unwrap();
    fill(dir.path());
    let col = dir.path().join("collections/docs");
    let files: Vec<_> = vectide_db::STORE_FILES
        .iter()
        .map(|f| col.join(f))
        .filter(|p| p.exists())
        .collect();
    assert!(!files.is_empty(), "no point store file");
    for path in &files {
        let good = std::fs::read(path).unwrap();
        for cut in [good.len() - 1, good.len() / 2, 100, 17, 0] {
            std::fs::write(path, &good[..cut]).unwrap();
            match Database::open(dir.path(), opts()) {
                Err(e) if e.is_corrupted() => {}
                Err(e) => panic!("{} cut at {cut}: unexpected error {e}", path.display()),
                // A cut log is a torn tail (or a new log): the WAL (kept
                // whole for the engine here) brings every point back.
                Ok(db) => {
                    assert_eq!(db.collection("docs").unwrap().len(), 660, "cut at {cut}")
                }
            }
            std::fs::write(path, &good).unwrap();
        }
        let mut bad = good.clone();
        let at = bad.len() / 2;
        bad[at] ^= 0x55;
        std::fs::write(path, &bad).unwrap();
        match Database::open(dir.path(), opts()) {
            Err(e) if e.is_corrupted() => {}
            Err(e) => panic!("{} flipped: unexpected error {e}", path.display()),
            Ok(db) => assert_eq!(db.collection("docs").unwrap().len(), 660, "flipped"),
        }
        std::fs::write(path, &good).unwrap();
    }
    let catalog = dir.path().join("catalog.json");
    let text = std::fs::read_to_string(&catalog).unwrap();
    std::fs::write(&catalog, text.replace("\"docs\"", "\"../../x\"")).unwrap();
    assert!(corrupted(dir.path()).contains("name"));
    std::fs::write(&catalog, &text[..text.len() / 2]).unwrap();
    corrupted(dir.path());
}

#[test]
fn catalogs_of_older_formats_are_refused_by_version() {
    // Version 1: stores written by redb 2; version 2: WAL records before
    // the one record codec.
    for v in [1, 2] {
        let dir = tempfile::tempdir().unwrap();
        fill(dir.path());
        let catalog = dir.path().join("catalog.json");
        let text = std::fs::read_to_string(&catalog).unwrap();
        let old = text.replacen("\"version\": 5", &format!("\"version\": {v}"), 1);
        assert_ne!(old, text, "{text}");
        std::fs::write(&catalog, &old).unwrap();
        match Database::open(dir.path(), opts()) {
            Err(DbError::Core(vectide_core::Error::Version { found, supported })) => {
                assert_eq!((found, supported), (v, 5))
            }
            Err(e) => panic!("unexpected error {e}"),
            Ok(_) => panic!("a version {v} catalog opened"),
        }
        assert_eq!(std::fs::read_to_string(&catalog).unwrap(), old, "unchanged");
    }
}

#[test]
fn restarts_replay_a_bounded_tail() {
    let dir = tempfile::tempdir().unwrap();
    let o = Options {
        checkpoint_min_bytes: 8 << 10,
        checkpoint_bytes: 8 << 10,
        checkpoint_interval: Duration::from_secs(3600),
        ..Options::default()
    };
    // Each "life" writes a little and dies before any background checkpoint
    // could run; without the checkpoint at open, replay would grow each time.
    let mut replayed = Vec::new();
    for life in 0..12u64 {
        let db = Database::open(dir.path(), o.clone()).unwrap();
        let c = match db.collection("docs") {
            Ok(c) => c,
            Err(_) => db.create_collection("docs", cfg()).unwrap(),
        };
        replayed.push(
            c.counters
                .replayed
                .load(std::sync::atomic::Ordering::Relaxed),
        );
        for i in 0..60 {
            c.upsert(&[point(life * 100 + i)]).unwrap();
        }
        // Dies: dropping without `close` stops the background thread and
        // saves nothing (the hnsw engine is volatile).
        drop(c);
        drop(db);
    }
    let max = *replayed.iter().max().unwrap();
    // Bounded by twice the threshold (about 120 records here) plus one
    // life's writes; 12 lives would replay up to 660 records without the
    // count carried over and the checkpoint at open.
    assert!(max <= 320, "replayed per restart: {replayed:?}");
}

#[test]
fn catalogs_from_before_the_thread_bound_still_open() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = cfg();
    c.engine = "p-hnsw".into();
    c.params.insert("threads".into(), ParamValue::Int(2));
    let db = Database::open(dir.path(), opts()).unwrap();
    db.create_collection("docs", c)
        .unwrap()
        .upsert(&[point(1)])
        .unwrap();
    db.close().unwrap();
    drop(db);
    let catalog = dir.path().join("catalog.json");
    let text = std::fs::read_to_string(&catalog).unwrap();
    let text = text.replace("\"threads\": 2", "\"threads\":2");
    assert!(text.contains("\"threads\":2"), "{text}");
    std::fs::write(&catalog, text.replace("\"threads\":2", "\"threads\":1500")).unwrap();
    let db = Database::open(dir.path(), opts()).unwrap();
    assert_eq!(db.collection("docs").unwrap().len(), 1);
}

/// Copies a directory tree.
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dst = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_tree(&e.path(), &dst);
        } else {
            std::fs::copy(e.path(), dst).unwrap();
        }
    }
}

/// A crash at any point of a repair: the image the file crash simulator
/// takes before each of its syncs (unsynced data and directory entries
/// lost or kept by draw) opens (the open finishes the repair, once its
/// marker is durable; before, the image is the damaged database), with a log
/// whose sequence numbers have no gap (an open checks that) and the points
/// the uninterrupted repair keeps, and a repair run again after that
/// changes nothing. Before the fix, an image taken after the
/// repair's open had started the log anew above the engine's and store's
/// sequence numbers (records kept through K, next segment at D + 1) and
/// before its checkpoint deleted the old segments held a gap that every
/// later open and repair refused.
#[test]
fn a_crash_anywhere_in_a_repair_leaves_a_database_that_opens() {
    use parking_lot::Mutex;
    use std::sync::Arc;
    use vectide_storage::{FileSim, FileSimConfig};
    let dir = tempfile::tempdir().unwrap();
    let segs = fill(dir.path());
    let at = std::fs::read(&segs[2]).unwrap().len() / 2;
    flip(&segs[2], at);
    // What an uninterrupted repair keeps.
    let reference = tempfile::tempdir().unwrap();
    copy_tree(dir.path(), reference.path());
    let kept = vectide_db::repair(reference.path(), opts()).unwrap()[0]
        .wal
        .kept_through as usize;
    let want = kept - 20;
    assert_eq!(
        Database::open(reference.path(), opts())
            .unwrap()
            .collection("docs")
            .unwrap()
            .len(),
        want
    );

    let images = tempfile::tempdir().unwrap();
    let sim = FileSim::new(
        dir.path(),
        FileSimConfig {
            seed: 11,
            crash_before: (0..1000).collect(),
            images_per_crash: 2,
            image_dir: images.path().to_path_buf(),
            ..Default::default()
        },
    )
    .unwrap();
    let failures = Arc::new(Mutex::new(Vec::new()));
    {
        let failures = failures.clone();
        sim.on_crash(move |img| {
            // Once the repair's marker is durable, an open finishes the
            // interrupted repair; before, the image is the damaged database
            // the repair started from, which an open refuses. Either way, a
            // repair run (again) then leaves the same points.
            let points = |what: &str| {
                Database::open(&img.dir, opts())
                    .map_err(|e| format!("{what}: {e}"))
                    .map(|db| db.collection("docs").unwrap().len())
            };
            let begun = img.dir.join("REPAIRING").is_file();
            let outcome = (if begun { points("open") } else { Ok(want) }).and_then(|n| {
                vectide_db::repair(&img.dir, opts()).map_err(|e| format!("repair again: {e}"))?;
                match points("open after the repair")? {
                    m if m == n => Ok(m),
                    m => Err(format!("{n} points, then {m} after the repair")),
                }
            });
            if outcome != Ok(want) {
                failures.lock().push(format!(
                    "image before sync {} ({}): {outcome:?}, want {want} points; {:?}",
                    img.point, img.site, img.files
                ));
            }
            let _ = std::fs::remove_dir_all(&img.dir);
        });
    }
    let guard = sim.install();
    vectide_db::repair(dir.path(), opts()).unwrap();
    drop(guard);
    let report = sim.report();
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert!(report.images >= 6, "{report:?}");
    let failures = failures.lock().clone();
    assert!(failures.is_empty(), "{failures:#?}");
}
