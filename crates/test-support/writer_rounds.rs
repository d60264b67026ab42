//! Writers beside a maintenance job: one thread runs `round(k)` (a write or
//! two) until the job ends, each round timed; the rounds that began and
//! ended inside the job are those the job did not hold up.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Instant;

/// What [`rounds_beside`] saw.
pub struct Beside<T> {
    /// The job's result.
    pub out: T,
    /// The job's wall time, milliseconds.
    pub job_ms: f64,
    /// Rounds that began after the job began and ended before it ended.
    pub inside: usize,
}

impl<T> Beside<T> {
    /// Prints the figures and fails unless at least `min` rounds began and
    /// ended inside the job (`what` names it).
    pub fn expect_inside(&self, min: usize, what: &str) {
        println!(
            "{what} {:.1} ms, {} writer rounds began and ended inside it",
            self.job_ms, self.inside
        );
        assert!(
            self.inside >= min,
            "only {} writer rounds began and ended while the {what} ran",
            self.inside
        );
    }
}

/// Runs `round(0)`, `round(1)`, … (at most `max`) in a thread of its own;
/// after its third round starts, runs `job` here; stops the rounds when the
/// job returns.
pub fn rounds_beside<T>(
    max: usize,
    round: impl Fn(usize) + Sync,
    job: impl FnOnce() -> T,
) -> Beside<T> {
    let done = AtomicBool::new(false);
    let started = AtomicUsize::new(0);
    let t_zero = Instant::now();
    let micros = || t_zero.elapsed().as_micros() as u64;
    std::thread::scope(|s| {
        let writer = s.spawn(|| {
            let mut rounds = Vec::new();
            for k in 0..max {
                if done.load(Ordering::Acquire) {
                    break;
                }
                started.store(k + 1, Ordering::Release);
                let began = micros();
                round(k);
                rounds.push((began, micros()));
            }
            rounds
        });
        while started.load(Ordering::Acquire) < 3 && !writer.is_finished() {
            std::thread::yield_now();
        }
        let begin = micros();
        let out = job();
        let end = micros();
        done.store(true, Ordering::Release);
        let rounds = writer.join().expect("the writer thread");
        let inside = rounds
            .iter()
            .filter(|&&(b, e)| b >= begin && e <= end)
            .count();
        Beside {
            out,
            job_ms: (end - begin) as f64 / 1e3,
            inside,
        }
    })
}
