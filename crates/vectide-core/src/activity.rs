//! Which maintenance jobs of an engine run now, and how many have begun.
//!
//! An engine keeps one [`Activity`] and wraps each maintenance job
//! (a merge, a freeze, a consolidation, a split, a snapshot, a rebuild, a
//! checkpoint, a compaction) in the guard [`Activity::begin`] returns.
//! [`Activity::fill`] copies both figures into [`IndexStats`]: `maintenance`
//! (the names of the jobs running at the call, each once) and
//! `maintenance_started` (jobs begun since the open). A sampler that sees
//! the count move between two polls knows a job ran in between even when
//! it was too short to be seen running (the soak's latency split uses both).
//! A job that ran for [`LONG_JOB`] or more gives the C heap's free pages
//! back to the system when it ends ([`crate::trim`]: what a merge or a
//! rebuild allocated and freed would otherwise stay resident).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::IndexStats;

/// The running jobs of one engine (or database collection).
#[derive(Debug, Default)]
pub struct Activity {
    running: Mutex<Vec<(&'static str, u32)>>,
    started: AtomicU64,
}

/// A job that runs until this guard is dropped.
#[must_use = "the job counts as running only while the guard lives"]
#[derive(Debug)]
pub struct Running<'a> {
    activity: &'a Activity,
    job: &'static str,
    began: Instant,
}

/// A job at least this long trims the heap when it ends (at most once per
/// [`TRIM_EVERY`] across the process).
pub const LONG_JOB: Duration = Duration::from_millis(200);
const TRIM_EVERY: Duration = Duration::from_secs(5);

impl Activity {
    /// An activity with nothing running.
    pub fn new() -> Self {
        Self::default()
    }

    /// Marks `job` running until the guard is dropped (jobs of one name
    /// may overlap: they are counted).
    pub fn begin(&self, job: &'static str) -> Running<'_> {
        self.started.fetch_add(1, Ordering::Relaxed);
        let mut r = self.running.lock();
        match r.iter_mut().find(|(j, _)| *j == job) {
            Some((_, n)) => *n += 1,
            None => r.push((job, 1)),
        }
        Running {
            activity: self,
            job,
            began: Instant::now(),
        }
    }

    /// The names of the jobs running now, in the order they first began.
    pub fn running(&self) -> Vec<&'static str> {
        self.running.lock().iter().map(|(j, _)| *j).collect()
    }

    /// Jobs begun since this activity was made.
    pub fn started(&self) -> u64 {
        self.started.load(Ordering::Relaxed)
    }

    /// Adds this activity's figures to `stats` (jobs already listed there
    /// are not repeated).
    pub fn fill(&self, stats: &mut IndexStats) {
        for j in self.running() {
            if !stats.maintenance.contains(&j) {
                stats.maintenance.push(j);
            }
        }
        stats.maintenance_started += self.started();
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        // The trim is part of the job: it runs while the job still counts
        // as running, so what it costs the writers is counted against the
        // job.
        if self.began.elapsed() >= LONG_JOB {
            crate::trim::release_free_heap_at_most_every(TRIM_EVERY);
        }
        let mut r = self.activity.running.lock();
        if let Some(i) = r.iter().position(|(j, _)| *j == self.job) {
            r[i].1 -= 1;
            if r[i].1 == 0 {
                r.remove(i);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jobs_are_listed_while_their_guards_live_and_counted_after() {
        let a = Activity::new();
        assert!(a.running().is_empty());
        let m1 = a.begin("merge");
        let s = a.begin("snapshot");
        let m2 = a.begin("merge");
        assert_eq!(a.running(), vec!["merge", "snapshot"]);
        drop(m1);
        assert_eq!(
            a.running(),
            vec!["merge", "snapshot"],
            "one merge still runs"
        );
        drop(m2);
        assert_eq!(a.running(), vec!["snapshot"]);
        drop(s);
        assert!(a.running().is_empty());
        assert_eq!(a.started(), 3);
        let mut st = IndexStats {
            maintenance: vec!["checkpoint"],
            maintenance_started: 2,
            ..IndexStats::default()
        };
        let _r = a.begin("checkpoint");
        a.fill(&mut st);
        assert_eq!(st.maintenance, vec!["checkpoint"]);
        assert_eq!(st.maintenance_started, 6);
    }
}
