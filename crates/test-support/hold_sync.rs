//! A sync observer that holds one kind of sync until the test says so: the
//! check that writers go on while a maintenance job is inside its fsync.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};
use vectide_core::sync::{SyncDecision, SyncEvent, SyncObserver, SyncPhase};

/// Holds the first syncs that `pick` selects (at most 10 s each) until
/// [`Hold::release`]; records whether the release came while one waited.
pub struct Hold {
    pick: fn(&SyncEvent<'_>) -> bool,
    syncing: AtomicBool,
    done: Mutex<bool>,
    cv: Condvar,
    released_during_sync: AtomicBool,
}

impl Hold {
    pub fn new(pick: fn(&SyncEvent<'_>) -> bool) -> Self {
        Hold {
            pick,
            syncing: AtomicBool::new(false),
            done: Mutex::new(false),
            cv: Condvar::new(),
            released_during_sync: AtomicBool::new(false),
        }
    }

    /// Waits until a picked sync is being held; panics after 30 s or when
    /// `gave_up()` says the job ended without one.
    pub fn wait_held(&self, gave_up: impl Fn() -> bool) {
        let t0 = Instant::now();
        while !self.syncing.load(Ordering::SeqCst) {
            assert!(
                t0.elapsed() < Duration::from_secs(30) && !gave_up(),
                "the job never reached the sync to hold"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Lets the held sync go on.
    pub fn release(&self) {
        *self.done.lock().unwrap() = true;
        self.cv.notify_all();
    }

    /// Whether the release came while the sync was held (the test's
    /// writes finished during it).
    pub fn released_during_sync(&self) -> bool {
        self.released_during_sync.load(Ordering::SeqCst)
    }
}

/// Whether the thread `h` finishes within `limit` (polled every ms): a
/// writer that must not wait for a held sync.
#[allow(dead_code)] // not every test binary that holds a sync has one
pub fn finishes_within<T>(h: &std::thread::JoinHandle<T>, limit: Duration) -> bool {
    let t0 = Instant::now();
    while !h.is_finished() && t0.elapsed() < limit {
        std::thread::sleep(Duration::from_millis(1));
    }
    h.is_finished()
}

impl SyncObserver for Hold {
    fn on_sync(&self, e: &SyncEvent<'_>) -> SyncDecision {
        if e.phase == SyncPhase::Before && (self.pick)(e) {
            self.syncing.store(true, Ordering::SeqCst);
            let done = self.done.lock().unwrap();
            let (done, _) = self
                .cv
                .wait_timeout_while(done, Duration::from_secs(10), |d| !*d)
                .unwrap();
            if *done {
                self.released_during_sync.store(true, Ordering::SeqCst);
            }
        }
        SyncDecision::Proceed
    }
}
