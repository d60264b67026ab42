//! A checkpoint's fsyncs run beside the writers: the point store's commit,
//! a volatile engine's save, a durable engine's flush. A write that
//! arrives while one of them is held completes before it returns, and
//! everything survives a reopen.

use serde_json::json;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;
use vectide_core::io::ATOMIC_WRITE_FILE;
use vectide_core::sync::{
    install_sync_observer, SyncDecision, SyncEvent, SyncObserver, SyncPhase, SyncSite,
};
use vectide_db::store::SYNC_STORE;
use vectide_db::{CollectionConfig, Database, ExtId, Options, PointInput};

fn point(i: u64) -> PointInput {
    PointInput {
        id: ExtId::Num(i),
        vector: vec![i as f32, 1.0, 2.0, 3.0],
        payload: json!({ "i": i }),
    }
}

/// Holds the first sync of `site` until a write completes (or 10 s pass)
/// and records whether it did.
struct HoldSync {
    site: SyncSite,
    entered: mpsc::SyncSender<()>,
    write_done: Arc<AtomicBool>,
    done_during_sync: AtomicBool,
    armed: AtomicBool,
}

impl SyncObserver for HoldSync {
    fn on_sync(&self, e: &SyncEvent<'_>) -> SyncDecision {
        if e.site != self.site || e.phase != SyncPhase::Before {
            return SyncDecision::Proceed;
        }
        if !self.armed.swap(false, Ordering::SeqCst) {
            return SyncDecision::Proceed;
        }
        let _ = self.entered.try_send(());
        for _ in 0..1000 {
            if self.write_done.load(Ordering::SeqCst) {
                self.done_during_sync.store(true, Ordering::SeqCst);
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        SyncDecision::Proceed
    }
}

/// Writes two operations while a checkpoint of an `engine` collection
/// holds its first sync of `site`, then checks both landed during it and
/// after a reopen.
fn writes_complete_while_a_checkpoint_holds(engine: &str, site: SyncSite, checkpoint_bytes: u64) {
    let root = tempfile::tempdir().unwrap();
    let opts = || Options {
        checkpoint_interval: Duration::from_secs(3600),
        checkpoint_bytes,
        ..Options::default()
    };
    let db = Database::open(root.path(), opts()).unwrap();
    let c = db
        .create_collection(
            "docs",
            CollectionConfig::new(4, vectide_core::Metric::L2, engine),
        )
        .unwrap();
    c.upsert(&(0..50).map(point).collect::<Vec<_>>()).unwrap();

    let (entered_tx, entered_rx) = mpsc::sync_channel(1);
    let write_done = Arc::new(AtomicBool::new(false));
    let hold = Arc::new(HoldSync {
        site,
        entered: entered_tx,
        write_done: write_done.clone(),
        done_during_sync: AtomicBool::new(false),
        armed: AtomicBool::new(true),
    });
    let guard = install_sync_observer(root.path(), hold.clone());
    std::thread::scope(|s| {
        let (c, write_done) = (&c, &write_done);
        let writer = s.spawn(move || {
            entered_rx
                .recv_timeout(Duration::from_secs(30))
                .expect("the checkpoint never reached the held sync");
            c.upsert(&[point(50)]).unwrap();
            c.delete(Some(&[ExtId::Num(3)]), None).unwrap();
            write_done.store(true, Ordering::SeqCst);
        });
        c.checkpoint().unwrap();
        writer.join().unwrap();
    });
    drop(guard);
    assert!(
        hold.done_during_sync.load(Ordering::SeqCst),
        "{engine}: the writes waited for the checkpoint's {site} sync"
    );
    assert_eq!(c.count(None), 50);
    // The writes after the checkpoint's cut are in the log, those before
    // it in the store's durable commit: a reopen holds both.
    drop(c);
    db.close().unwrap();
    let db = Database::open(root.path(), opts()).unwrap();
    let c = db.collection("docs").unwrap();
    assert_eq!(c.count(None), 50);
    let got = c
        .get(&[ExtId::Num(50), ExtId::Num(3), ExtId::Num(49)], false)
        .unwrap();
    assert_eq!(got[0].as_ref().unwrap().payload, json!({ "i": 50 }));
    assert!(got[1].is_none());
    assert!(got[2].is_some());
    db.close().unwrap();
}

#[test]
fn writes_complete_while_a_checkpoint_syncs_the_point_store() {
    writes_complete_while_a_checkpoint_holds("flat", SYNC_STORE, 256 << 20);
}

#[test]
fn writes_complete_while_a_checkpoint_syncs_a_volatile_engines_save() {
    writes_complete_while_a_checkpoint_holds("hnsw", ATOMIC_WRITE_FILE, 256 << 20);
}

/// `fresh-diskann` hands its log over; a tiny `checkpoint_bytes` makes the
/// checkpoint flush it (a freeze, whose temp index save syncs).
#[test]
fn writes_complete_while_a_checkpoint_flushes_a_durable_engine() {
    writes_complete_while_a_checkpoint_holds("fresh-diskann", ATOMIC_WRITE_FILE, 1);
}
