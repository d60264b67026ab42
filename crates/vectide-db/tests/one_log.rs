//! One log under the database. An engine that keeps a redo log of its own
//! (it takes the `log` parameter: `fresh-diskann` and the SPANN family,
//! found through the registry) hands it over to the collection: the
//! collection's WAL is the only log its writes go to, the engine persists
//! its own checkpoints (frozen temp indexes, snapshots) and nothing per
//! write, and a restart replays the WAL past the engine's `durable_seq()`.
//!
//! The syncs are counted through `vectide_core::sync`, by site, under the
//! engine's directory: the engine's redo-log append site must never fire
//! under the database, and must fire once per write when the same engine
//! runs standalone with one writer (so the count can tell the two apart);
//! concurrent standalone writers share those syncs (group commit).

use parking_lot::Mutex;
use serde_json::json;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use vectide_core::sync::{install_sync_observer, SyncEvent, SyncObserver, SyncPhase};
use vectide_core::{Metric, Params, SyncDecision};
use vectide_db::{CollectionConfig, Database, Durability, ExtId, Options, PointInput};
use vectide_engines::ParamValue;
use vectide_storage::wal::SYNC_APPEND;

const DIM: usize = 8;

/// The engines that can hand their log to the database.
fn log_keepers() -> Vec<&'static str> {
    let names: Vec<&str> = vectide_engines::REGISTRY
        .iter()
        .filter(|d| d.param("log").is_some())
        .map(|d| d.name)
        .collect();
    assert!(
        names.contains(&"fresh-diskann") && names.contains(&"spfresh"),
        "{names:?}"
    );
    names
}

/// Syncs under a directory, by site.
#[derive(Default)]
struct Counter {
    by_site: Mutex<BTreeMap<&'static str, u64>>,
}

impl SyncObserver for Counter {
    fn on_sync(&self, e: &SyncEvent<'_>) -> SyncDecision {
        if e.phase == SyncPhase::Before {
            *self.by_site.lock().entry(e.site.0).or_default() += 1;
        }
        SyncDecision::Proceed
    }
}

impl Counter {
    fn get(&self, site: &str) -> u64 {
        self.by_site.lock().get(site).copied().unwrap_or(0)
    }
    fn total(&self) -> u64 {
        self.by_site.lock().values().sum()
    }
}

/// A distinct pseudo-random vector per id (SplitMix64 of `(i, j)`).
fn vector(i: u64) -> Vec<f32> {
    (0..DIM as u64)
        .map(|j| {
            let mut z = (i * DIM as u64 + j).wrapping_add(0x9E37_79B9_7F4A_7C15);
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            ((z ^ (z >> 31)) >> 40) as f32 / (1u64 << 24) as f32
        })
        .collect()
}

fn point(i: u64) -> PointInput {
    PointInput {
        id: ExtId::Num(i),
        vector: vector(i),
        payload: json!({ "i": i }),
    }
}

/// Small checkpoint thresholds of each engine (so that a few thousand
/// writes see several of its own checkpoints), inline background work.
fn small_params(engine: &str) -> Params {
    let d = vectide_engines::descriptor(engine).unwrap();
    let mut p = Params::new();
    for (k, v) in [
        ("temp_points", ParamValue::Int(1_000)),
        ("merge_points", ParamValue::Int(2_500)),
        ("merge", ParamValue::Str("inline".into())),
        ("snapshot_rows", ParamValue::Int(1_000)),
        ("rebuild", ParamValue::Str("inline".into())),
        ("threads", ParamValue::Int(1)),
    ] {
        if d.param(k).is_some() {
            p.insert(k.into(), v);
        }
    }
    p
}

fn opts() -> Options {
    Options {
        durability: Durability::Always,
        checkpoint_interval: Duration::from_secs(3600),
        threads: Some(1),
        ..Options::default()
    }
}

fn config(engine: &str) -> CollectionConfig {
    CollectionConfig {
        dim: DIM,
        metric: Metric::L2,
        engine: engine.to_string(),
        params: small_params(engine),
        ..Default::default()
    }
}

/// Under the database: `n` single-point upserts; returns the syncs under
/// the engine's directory, by site.
fn upserts_in_database(root: &Path, engine: &str, n: u64) -> Arc<Counter> {
    let db = Database::open(root, opts()).unwrap();
    let c = db.create_collection("docs", config(engine)).unwrap();
    let index_dir = root.join("collections").join("docs").join("index");
    assert!(index_dir.is_dir(), "{engine}: no engine directory");
    let counter = Arc::new(Counter::default());
    let guard = install_sync_observer(&index_dir, counter.clone());
    for i in 0..n {
        c.upsert(&[point(i)]).unwrap();
    }
    drop(guard);
    assert_eq!(c.count(None), n as usize);
    db.close().unwrap();
    counter
}

#[test]
fn engines_that_keep_a_log_write_none_of_their_own_under_the_database() {
    const N: u64 = 10_000;
    for engine in log_keepers() {
        let root = tempfile::tempdir().unwrap();
        let c = upserts_in_database(root.path(), engine, N);
        let sites = c.by_site.lock().clone();
        eprintln!("{engine}: engine syncs over {N} single-point upserts: {sites:?}");
        assert_eq!(
            c.get(SYNC_APPEND.0),
            0,
            "{engine}: its own redo log was synced under the database: {sites:?}"
        );
        // Nor is a log of its own ever started at a checkpoint.
        assert!(
            sites.keys().all(|k| !k.starts_with("wal.")),
            "{engine}: a WAL of its own was written under the database: {sites:?}"
        );
        assert!(
            !std::fs::read_dir(root.path().join("collections/docs/index"))
                .unwrap()
                .filter_map(|e| e.ok())
                .any(|e| e.file_name().to_string_lossy().ends_with(".log")),
            "{engine}: a log file in the engine's directory"
        );
        // What is left are the engine's own checkpoints (freezes,
        // snapshots, merges): far fewer than one per write. The most is
        // `spann`'s since the database rebuilds it as it grows: a write
        // rewrites the tail block of each posting holding a replica, and
        // the blocks so released bring a snapshot once they pass a third
        // of those in use (95 snapshots, 285 syncs; 18 while it was never
        // rebuilt, its first build of one point taking every write).
        assert!(
            c.total() > 0 && c.total() < N / 25,
            "{engine}: {} engine syncs over {N} writes: {sites:?}",
            c.total()
        );
        // Everything is there after a reopen.
        let db = Database::open(root.path(), opts()).unwrap();
        let col = db.collection("docs").unwrap();
        assert_eq!(col.count(None), N as usize, "{engine}");
        db.close().unwrap();
    }
}

/// `engine` standalone (its own log) in `root/index`, small thresholds
/// (`extra` overrides those of them the engine takes).
fn standalone(
    engine: &str,
    root: &Path,
    extra: &[(&str, i64)],
) -> (std::path::PathBuf, vectide_engines::AnyIndex) {
    let dir = root.join("index");
    let mut p = small_params(engine);
    let d = vectide_engines::descriptor(engine).unwrap();
    for &(k, v) in extra {
        if d.param(k).is_some() {
            p.insert(k.into(), ParamValue::Int(v));
        }
    }
    p.insert("path".into(), ParamValue::Str(dir.display().to_string()));
    let index = vectide_engines::create(engine, DIM, Metric::L2, &p).unwrap();
    (dir, index)
}

#[test]
fn the_same_engines_standalone_sync_their_own_log_once_per_write() {
    const N: u64 = 200;
    for engine in log_keepers() {
        let root = tempfile::tempdir().unwrap();
        let (dir, index) = standalone(engine, root.path(), &[]);
        let counter = Arc::new(Counter::default());
        let guard = install_sync_observer(&dir, counter.clone());
        for i in 0..N {
            index.insert(i + 1, &[i], &vector(i)).unwrap();
        }
        drop(guard);
        assert_eq!(
            counter.get(SYNC_APPEND.0),
            N,
            "{engine}: {:?}",
            counter.by_site.lock()
        );
        assert_eq!(index.durable_seq(), N, "{engine}");
        index.close().unwrap();
    }
}

/// Delays every redo-log append sync by a millisecond (a slow disk), and
/// counts them.
#[derive(Default)]
struct SlowAppends {
    seen: std::sync::atomic::AtomicU64,
}

impl SyncObserver for SlowAppends {
    fn on_sync(&self, e: &SyncEvent<'_>) -> SyncDecision {
        if e.phase == SyncPhase::Before && e.site == SYNC_APPEND {
            self.seen.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            std::thread::sleep(Duration::from_millis(1));
        }
        SyncDecision::Proceed
    }
}

#[test]
fn standalone_writers_share_the_logs_syncs_and_lose_no_acknowledged_write() {
    const THREADS: u64 = 4;
    const EACH: u64 = 100;
    for engine in log_keepers() {
        let root = tempfile::tempdir().unwrap();
        // Snapshots, freezes and merges while writers wait for syncs.
        let small = [
            ("snapshot_rows", 64),
            ("temp_points", 64),
            ("merge_points", 256),
        ];
        let (dir, index) = standalone(engine, root.path(), &small);
        let slow = Arc::new(SlowAppends::default());
        let guard = install_sync_observer(&dir, slow.clone());
        let next = std::sync::atomic::AtomicU64::new(1);
        // Each thread inserts its own ids and deletes every fourth of them.
        std::thread::scope(|s| {
            for t in 0..THREADS {
                let (index, next) = (&index, &next);
                s.spawn(move || {
                    for i in 0..EACH {
                        let id = t * EACH + i;
                        let seq = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        index.insert(seq, &[id], &vector(id)).unwrap();
                        if i % 4 == 3 {
                            let seq = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                            assert_eq!(index.delete(seq, &[id]).unwrap(), 1);
                        }
                    }
                });
            }
        });
        drop(guard);
        let writes = THREADS * EACH * 5 / 4;
        let syncs = slow.seen.load(std::sync::atomic::Ordering::Relaxed);
        assert!(
            syncs <= writes * 3 / 4,
            "{engine}: {syncs} log syncs for {writes} writes"
        );
        // Dropped without a close: the reopen replays the log.
        drop(index);
        let back = vectide_engines::open(&dir, &Params::new()).unwrap();
        assert_eq!(back.len() as u64, THREADS * EACH * 3 / 4, "{engine}");
        for id in 0..THREADS * EACH {
            assert_eq!(back.contains(id).unwrap(), id % 4 != 3, "{engine}: id {id}");
        }
        assert_eq!(back.durable_seq(), writes, "{engine}");
        back.close().unwrap();
    }
}

/// Fails every redo-log append sync.
struct FailingAppends;

impl SyncObserver for FailingAppends {
    fn on_sync(&self, e: &SyncEvent<'_>) -> SyncDecision {
        if e.site == SYNC_APPEND {
            SyncDecision::Fail
        } else {
            SyncDecision::Proceed
        }
    }
}

#[test]
fn a_failed_log_sync_poisons_a_standalone_engine_until_it_is_reopened() {
    for engine in log_keepers() {
        let root = tempfile::tempdir().unwrap();
        let (dir, index) = standalone(engine, root.path(), &[]);
        index.insert(1, &[1], &vector(1)).unwrap();
        let guard = install_sync_observer(&dir, Arc::new(FailingAppends));
        let err = index.insert(2, &[2], &vector(2)).unwrap_err();
        assert!(
            matches!(err, vectide_core::Error::Poisoned(_)),
            "{engine}: {err}"
        );
        drop(guard);
        // The disk works again; the index does not pretend it knows what
        // reached it: writes are refused, reads go on.
        let again = index.insert(3, &[3], &vector(3)).unwrap_err();
        assert!(
            matches!(again, vectide_core::Error::Poisoned(_)),
            "{engine}: {again}"
        );
        assert!(index.contains(1).unwrap(), "{engine}");
        drop(index);
        let back = vectide_engines::open(&dir, &Params::new()).unwrap();
        assert!(back.contains(1).unwrap(), "{engine}");
        back.insert(4, &[4], &vector(4)).unwrap();
        assert!(back.contains(4).unwrap(), "{engine}");
        back.close().unwrap();
    }
}

#[test]
fn a_restart_replays_the_database_log_past_the_engines_last_checkpoint() {
    for engine in log_keepers() {
        let root = tempfile::tempdir().unwrap();
        {
            let db = Database::open(root.path(), opts()).unwrap();
            let c = db.create_collection("docs", config(engine)).unwrap();
            // 2,500 points (the engine checkpoints every 1,000 rows), then
            // deletes and re-embeddings after its last checkpoint.
            let pts: Vec<PointInput> = (0..2_500).map(point).collect();
            for chunk in pts.chunks(100) {
                c.upsert(chunk).unwrap();
            }
            let gone: Vec<ExtId> = (0..300).map(|i| ExtId::Num(i * 7)).collect();
            c.delete(Some(&gone), None).unwrap();
            let moved: Vec<PointInput> = (2_000..2_100)
                .map(|i| PointInput {
                    vector: vector(i + 50_000),
                    ..point(i)
                })
                .collect();
            c.upsert(&moved).unwrap();
            let engine_durable = c.engine().unwrap().durable_seq();
            assert!(
                engine_durable < c.last_seq(),
                "{engine}: the engine covers every write ({engine_durable}): nothing is left to replay"
            );
            // Dropped without a close: what the engine did not checkpoint
            // lives only in the collection's WAL (as after a kill).
            drop(c);
            drop(db);
        }
        let db = Database::open(root.path(), opts()).unwrap();
        let c = db.collection("docs").unwrap();
        assert!(
            c.counters
                .replayed
                .load(std::sync::atomic::Ordering::Relaxed)
                > 0,
            "{engine}: nothing was replayed"
        );
        // 300 deleted, 14 of them (multiples of 7 in 2,000..2,100) back.
        assert_eq!(c.count(None), 2_500 - 300 + 14, "{engine}");
        let got = c.get(&[ExtId::Num(7), ExtId::Num(2_010)], true).unwrap();
        assert!(got[0].is_none(), "{engine}: a delete came back");
        assert_eq!(
            got[1].as_ref().and_then(|r| r.vector.clone()),
            Some(vector(2_010 + 50_000)),
            "{engine}: the re-embedding was lost"
        );
        let exact = vectide_core::SearchParams {
            exact: true,
            ..Default::default()
        };
        for params in [vectide_core::SearchParams::default(), exact] {
            let hits = c
                .search(&vector(2_050 + 50_000), 1, &params, None, false, false)
                .unwrap();
            assert_eq!(hits[0].id, ExtId::Num(2_050), "{engine}");
        }
        db.close().unwrap();
    }
}

#[test]
fn a_collection_refuses_a_log_parameter() {
    let root = tempfile::tempdir().unwrap();
    let db = Database::open(root.path(), opts()).unwrap();
    let mut cfg = config("fresh-diskann");
    cfg.params
        .insert("log".into(), ParamValue::Str("own".into()));
    let e = db.create_collection("docs", cfg).unwrap_err().to_string();
    assert!(e.contains("log"), "{e}");
    assert!(db.collection("docs").is_err());
    db.close().unwrap();
}

/// A database write is validated once, at the collection's edge: no
/// engine checks the written batch again. Counted through
/// `vectide_core::validate::batch_checks` (this thread's checks; the commit
/// applies a write on the thread that made it), against the same writes
/// given to the engine directly, which checks each one: the difference is
/// one check per write. (An engine's own batches, such as the SPANN
/// family's new centroids, are checked on both paths alike.)
#[test]
fn every_engine_validates_a_database_write_once_at_the_edge() {
    use vectide_core::validate::batch_checks;
    const N: u64 = 300;
    for engine in vectide_engines::names() {
        let root = tempfile::tempdir().unwrap();
        let db = Database::open(root.path(), opts()).unwrap();
        let c = db.create_collection("docs", config(engine)).unwrap();
        let before = batch_checks();
        for i in 0..N {
            c.upsert(&[point(i)]).unwrap();
        }
        let in_db = batch_checks() - before;
        // Bad input is still refused at the edge, and changes nothing.
        let mut bad = point(N);
        bad.vector[0] = f32::NAN;
        assert!(c.upsert(&[bad]).is_err(), "{engine}");
        assert_eq!(c.count(None), N as usize, "{engine}");
        db.close().unwrap();
        let mut p = small_params(engine);
        let dir = root.path().join("standalone");
        if vectide_engines::descriptor(engine)
            .unwrap()
            .persistence
            .in_directory()
        {
            p.insert("path".into(), ParamValue::Str(dir.display().to_string()));
        }
        let index = vectide_engines::create(engine, DIM, Metric::L2, &p).unwrap();
        let before = batch_checks();
        for i in 0..N {
            index.insert(i + 1, &[i], &vector(i)).unwrap();
        }
        let direct = batch_checks() - before;
        index.close().unwrap();
        eprintln!(
            "{engine}: batch checks over {N} writes: {in_db} in the database, {direct} direct"
        );
        assert_eq!(
            direct - in_db,
            N,
            "{engine}: {in_db} in the database, {direct} direct"
        );
    }
}
