//! The database's syncs go through `vectide_core::sync` (the WAL's, the
//! payload store's redb commits, the catalog's atomic writes), so that the
//! file crash simulator sees them: every post-crash image taken at any of
//! them, or after the last acknowledgement, holds every acknowledged point.

use parking_lot::Mutex;
use serde_json::json;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use vectide_core::{Metric, SyncSite};
use vectide_db::{CollectionConfig, Database, ExtId, Options, PointInput};
use vectide_engines::Params;
use vectide_storage::{FileSim, FileSimConfig, FileSimReport};

fn opts() -> Options {
    Options {
        checkpoint_interval: Duration::from_secs(3600),
        ..Options::default()
    }
}

fn batch(from: usize, n: usize) -> Vec<PointInput> {
    (from..from + n)
        .map(|i| PointInput {
            id: ExtId::Num(i as u64),
            vector: (0..4).map(|j| ((i * 7 + j) % 13) as f32 + 1.0).collect(),
            payload: json!({ "i": i }),
        })
        .collect()
}

/// Points of collection `docs` in the database image at `dir`.
fn count(dir: &std::path::Path) -> Result<usize, String> {
    let db = Database::open(dir, opts()).map_err(|e| e.to_string())?;
    let n = db.collection("docs").map_or(0, |c| c.count(None));
    db.close().map_err(|e| e.to_string())?;
    Ok(n)
}

/// Runs the workload with a file crash simulator taking an image at every
/// sync point (and four after the last acknowledgement), `disabled` ignored
/// by it; returns its report and the images that lost acknowledged points.
fn run(disabled: Option<SyncSite>) -> (FileSimReport, Vec<String>) {
    let root = tempfile::tempdir().unwrap();
    let images = tempfile::tempdir().unwrap();
    let sim = FileSim::new(
        root.path(),
        FileSimConfig {
            seed: 5,
            crash_before: (0..1000).collect(),
            images_per_crash: 1,
            image_dir: images.path().to_path_buf(),
            ..Default::default()
        },
    )
    .unwrap();
    sim.disable(disabled);
    let acknowledged = Arc::new(AtomicUsize::new(0));
    let failures = Arc::new(Mutex::new(Vec::new()));
    {
        let (acknowledged, failures) = (acknowledged.clone(), failures.clone());
        sim.on_crash(move |img| {
            let acked = acknowledged.load(Ordering::SeqCst);
            match count(&img.dir) {
                Ok(n) if n >= acked => {}
                other => failures.lock().push(format!(
                    "image before sync {} ({}, {}): {other:?} of {acked} acknowledged points; {:?}",
                    img.point,
                    img.site,
                    img.path.display(),
                    img.files
                )),
            }
            let _ = std::fs::remove_dir_all(&img.dir);
        });
    }
    let guard = sim.install();
    let db = Database::open(root.path(), opts()).unwrap();
    let c = db
        .create_collection(
            "docs",
            CollectionConfig {
                dim: 4,
                metric: Metric::L2,
                engine: "hnsw".into(),
                params: Params::new(),
                ..Default::default()
            },
        )
        .unwrap();
    for (from, n) in [(0, 20), (20, 20), (40, 1), (41, 1)] {
        c.upsert(&batch(from, n)).unwrap();
        acknowledged.store(from + n, Ordering::SeqCst);
    }
    c.checkpoint().unwrap();
    for (from, n) in [(42, 10), (52, 1)] {
        c.upsert(&batch(from, n)).unwrap();
        acknowledged.store(from + n, Ordering::SeqCst);
    }
    for k in 0..4 {
        let img = sim
            .image_now(&images.path().join(format!("now-{k}")))
            .unwrap();
        match count(&img.dir) {
            Ok(53) => {}
            other => failures
                .lock()
                .push(format!("image now: {other:?} of 53; {:?}", img.files)),
        }
    }
    db.close().unwrap();
    drop(guard);
    let failures = failures.lock().clone();
    (sim.report(), failures)
}

#[test]
fn images_at_every_sync_point_hold_every_acknowledged_point() {
    let (report, failures) = run(None);
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert!(failures.is_empty(), "{failures:#?}");
    let sites: BTreeSet<&str> = report.by_site.keys().map(|s| s.0).collect();
    for site in [
        "atomic_write.file",
        "atomic_write.dir",
        "db.commitlog.create",
        "db.commitlog.sync",
        "db.store.sync",
    ] {
        assert!(sites.contains(site), "{site} not among {sites:?}");
    }
    assert!(report.images > 10, "{report:?}");
}

#[test]
fn ignoring_the_wal_sync_loses_acknowledged_points_in_some_image() {
    let (report, failures) = run(Some(SyncSite("db.commitlog.sync")));
    assert!(report.skipped > 0, "{report:?}");
    assert!(!failures.is_empty(), "the mutation went unnoticed");
}

/// The point store's batch sync matters: without it, an image taken after
/// the checkpoint cut the WAL can lack the batch (its log's unsynced tail
/// dropped, torn or zeroed), and the open finds records missing.
#[test]
fn ignoring_the_point_store_sync_loses_acknowledged_points_in_some_image() {
    let (report, failures) = run(Some(vectide_db::store::SYNC_STORE));
    assert!(report.skipped > 0, "{report:?}");
    assert!(!failures.is_empty(), "the mutation went unnoticed");
}
