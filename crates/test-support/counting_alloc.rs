//! A global allocator that counts heap bytes: the bytes now, and the peak
//! since the last [`reset`] per stage (the stage [`enter`] named last), so
//! that a test or a profiling loop can say where a job's RAM goes. It
//! counts the whole process: one measuring test per binary.
#![allow(dead_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

pub struct Counting;

/// Stages a measurement can tell apart.
pub const STAGES: usize = 4;

static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: [AtomicUsize; STAGES] = [const { AtomicUsize::new(0) }; STAGES];
static STAGE: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator unchanged; only counts bytes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let now = CURRENT.fetch_add(l.size(), Ordering::Relaxed) + l.size();
        PEAK[STAGE.load(Ordering::Relaxed)].fetch_max(now, Ordering::Relaxed);
        // SAFETY: the caller's contract is passed on as is.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        CURRENT.fetch_sub(l.size(), Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.dealloc(p, l) }
    }
}

/// Starts a measurement in stage 0; returns the bytes held now, which
/// [`added`] subtracts.
pub fn reset() -> usize {
    let now = CURRENT.load(Ordering::SeqCst);
    STAGE.store(0, Ordering::SeqCst);
    for p in &PEAK {
        p.store(now, Ordering::SeqCst);
    }
    now
}

/// Charges later allocations to `stage` (stages only move forward).
pub fn enter(stage: usize) {
    STAGE.fetch_max(stage.min(STAGES - 1), Ordering::Relaxed);
}

/// The peak bytes of `stage` above `before` (what [`reset`] returned).
pub fn added(stage: usize, before: usize) -> usize {
    PEAK[stage].load(Ordering::SeqCst).saturating_sub(before)
}
