//! An engine's maintenance that falls due during a write (an hnsw delete
//! passing `consolidate_fraction`) does not run inside that write, under
//! the collection's turn where every later write waits for it: the
//! database's background thread runs it.

use serde_json::json;
use std::time::{Duration, Instant};
use vectide_db::{CollectionConfig, Database, ExtId, Options, PointInput};
use vectide_engines::Params;

/// Points `0..n` of 4 dimensions, each distinct.
fn points(n: u64) -> Vec<PointInput> {
    (0..n)
        .map(|i| PointInput {
            id: ExtId::Num(i),
            vector: vec![i as f32, (i % 7) as f32, (i % 13) as f32, 1.0],
            payload: json!({}),
        })
        .collect()
}

/// Options under which no checkpoint falls due (they count as maintenance
/// jobs too).
fn no_checkpoints() -> Options {
    Options {
        checkpoint_bytes: u64::MAX,
        checkpoint_min_bytes: u64::MAX,
        checkpoint_interval: Duration::from_secs(3600),
        ..Options::default()
    }
}

/// Creates an `engine` collection of 3,000 points and deletes a third of
/// them (far past the 5 % threshold of hnsw and p-hnsw) in a database whose
/// background thread runs checkpoints only: the delete returns without
/// running a maintenance job, and none runs afterwards (one run inline, or
/// by a thread of the delete's own, would show in `maintenance_started`).
/// Reopened with background maintenance on, the database's thread runs the
/// consolidation, which leaves `pending_deletes` at 0.
fn a_delete_past_the_threshold_leaves_the_consolidation_to_the_background(engine: &str) {
    let root = tempfile::tempdir().unwrap();
    let opts = no_checkpoints();
    let gone: Vec<ExtId> = (0..3_000u64).step_by(3).map(ExtId::Num).collect();
    {
        let db = Database::open(
            root.path(),
            Options {
                background_maintenance: false,
                ..opts.clone()
            },
        )
        .unwrap();
        let c = db
            .create_collection(
                "docs",
                CollectionConfig::new(4, vectide_core::Metric::L2, engine),
            )
            .unwrap();
        c.upsert(&points(3_000)).unwrap();
        let started = c.stats().unwrap().maintenance_started;
        assert_eq!(c.delete(Some(&gone), None).unwrap(), gone.len());
        assert!(c.maintenance_due(), "{engine}: no maintenance fell due");
        // Two of the background thread's 200 ms periods.
        std::thread::sleep(Duration::from_millis(500));
        let st = c.stats().unwrap();
        assert_eq!(
            st.maintenance_started, started,
            "{engine}: the delete's consolidation ran without the background thread"
        );
        assert_eq!(st.pending_deletes, gone.len());
    }
    let db = Database::open(root.path(), opts).unwrap();
    let c = db.collection("docs").unwrap();
    let t0 = Instant::now();
    loop {
        let st = c.stats().unwrap();
        // Done: begun since the open and no longer running (a job takes
        // the DeleteList when it begins and frees the slots at its end).
        if st.maintenance_started > 0 && st.maintenance.is_empty() {
            assert_eq!(st.pending_deletes, 0);
            assert_eq!(st.slots_used, 2_000);
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "{engine}: no background consolidation: {st:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(c.count(None), 2_000);
}

#[test]
fn an_hnsw_delete_past_the_threshold_leaves_the_consolidation_to_the_background() {
    a_delete_past_the_threshold_leaves_the_consolidation_to_the_background("hnsw");
}

#[test]
fn a_p_hnsw_delete_past_the_threshold_leaves_the_consolidation_to_the_background() {
    a_delete_past_the_threshold_leaves_the_consolidation_to_the_background("p-hnsw");
}

/// A `spann` collection rebuilds in the background once a quarter of it
/// has changed since its build (it never rebuilt under the database or
/// the server before: nothing asked for its `maintain()`).
#[test]
fn a_spann_collection_is_rebuilt_by_the_background_thread_once_a_quarter_changed() {
    let root = tempfile::tempdir().unwrap();
    let opts = no_checkpoints();
    let db = Database::open(root.path(), opts).unwrap();
    let c = db
        .create_collection(
            "docs",
            CollectionConfig::new(4, vectide_core::Metric::L2, "spann"),
        )
        .unwrap();
    let rebuilds = || c.stats().unwrap().extra_value("rebuilds").unwrap();
    // The first upsert into the empty collection is its static build.
    c.upsert(&points(4_000)).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    assert!(!c.maintenance_due());
    assert_eq!(rebuilds(), 0.0, "a rebuild ran with nothing changed");
    // 900 deletes: under the floor of 1,000 rows.
    let gone: Vec<ExtId> = (0..900u64).map(ExtId::Num).collect();
    c.delete(Some(&gone), None).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(rebuilds(), 0.0, "a rebuild ran before a quarter changed");
    // 100 more: 1,000 rows changed, a quarter of the 3,000 live and more.
    let gone: Vec<ExtId> = (900..1_000u64).map(ExtId::Num).collect();
    c.delete(Some(&gone), None).unwrap();
    let t0 = Instant::now();
    while rebuilds() < 1.0 || c.maintenance_due() {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "no background rebuild: {:?}",
            c.stats().unwrap()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(c.count(None), 3_000);
}

/// A long maintenance job (a `spann` rebuild) does not hold up another
/// collection's checkpoint: they run on threads of their own. Before, the
/// one background thread ran the rebuild and every checkpoint waited, the
/// logs growing meanwhile.
#[test]
fn a_rebuild_does_not_hold_up_the_checkpoints() {
    let root = tempfile::tempdir().unwrap();
    let db = Database::open(
        root.path(),
        Options {
            checkpoint_bytes: 1,
            checkpoint_min_bytes: 1,
            ..Options::default()
        },
    )
    .unwrap();
    let dim = 32;
    let slow = db
        .create_collection(
            "slow",
            CollectionConfig::new(dim, vectide_core::Metric::L2, "spann"),
        )
        .unwrap();
    let fast = db
        .create_collection(
            "fast",
            CollectionConfig::new(4, vectide_core::Metric::L2, "hnsw"),
        )
        .unwrap();
    let n = 40_000u64;
    let big: Vec<PointInput> = (0..n)
        .map(|i| PointInput {
            id: ExtId::Num(i),
            vector: (0..dim)
                .map(|j| ((i * 31 + j as u64 * 17) % 1000) as f32)
                .collect(),
            payload: json!({}),
        })
        .collect();
    slow.upsert(&big).unwrap();
    // A quarter deleted: the background thread starts a rebuild.
    let gone: Vec<ExtId> = (0..n / 4).map(ExtId::Num).collect();
    slow.delete(Some(&gone), None).unwrap();
    let t0 = Instant::now();
    let rebuilding = || slow.stats().unwrap().maintenance.contains(&"rebuild");
    while !rebuilding() {
        assert!(t0.elapsed() < Duration::from_secs(30), "no rebuild began");
        std::thread::sleep(Duration::from_millis(1));
    }
    fast.upsert(&points(10)).unwrap();
    assert!(fast.wal_tail_bytes() > 0);
    while fast.wal_tail_bytes() > 0 {
        assert!(
            rebuilding(),
            "the other collection's checkpoint waited for the whole rebuild"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Dropping the last handles while the background thread runs a job waits
/// for that job and releases the directory lock before the drop returns:
/// an open right after it succeeds (it failed with `Locked` while the
/// thread itself held the database through its pass).
#[test]
fn dropping_the_database_mid_job_releases_its_lock_at_once() {
    let root = tempfile::tempdir().unwrap();
    let config = CollectionConfig {
        dim: 4,
        metric: vectide_core::Metric::L2,
        engine: "hnsw".into(),
        params: Params::new(),
        ..Default::default()
    };
    let n = 20_000u64;
    {
        let db = Database::open(root.path(), Options::default()).unwrap();
        let c = db.create_collection("docs", config).unwrap();
        for chunk in points(n).chunks(2_000) {
            c.upsert(chunk).unwrap();
        }
        let started = c.stats().unwrap().maintenance_started;
        let gone: Vec<ExtId> = (0..n).step_by(3).map(ExtId::Num).collect();
        c.delete(Some(&gone), None).unwrap();
        let t0 = Instant::now();
        // Wait until the background consolidation is running.
        loop {
            let st = c.stats().unwrap();
            if st.maintenance_started > started && !st.maintenance.is_empty() {
                break;
            }
            assert!(
                st.maintenance_started == started,
                "the job ended before it was seen running: make it longer"
            );
            assert!(t0.elapsed() < Duration::from_secs(30), "no job began");
            std::thread::sleep(Duration::from_millis(1));
        }
        drop(c);
        drop(db);
    }
    let db = Database::open(root.path(), Options::default()).unwrap();
    let c = db.collection("docs").unwrap();
    assert_eq!(c.count(None), (n - n.div_ceil(3)) as usize);
}
