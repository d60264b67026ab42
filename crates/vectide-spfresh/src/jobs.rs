//! The Local Rebuilder's job queue (SPFresh §4.1): split, merge and
//! reassign jobs, and the engine's own compaction, reclaim and snapshot
//! jobs, deduplicated, and the workers' stop and wait flags. The jobs
//! themselves run in `rebuild.rs` (the snapshot in `state.rs`).

use parking_lot::{Condvar, Mutex};
use std::collections::{HashSet, VecDeque};

/// A Local Rebuilder job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Job {
    /// Split a posting; the second field is the cascade depth (0 for a
    /// split an insert queued, d + 1 for one a depth-d split's reassigns
    /// queued).
    Split(u32, u32),
    /// Merge a small posting.
    Merge(u32),
    /// Move postings out of the block file's mostly free end
    /// (`BlockStore::relocate`).
    Compact,
    /// Drop every record of the dead vector numbers and free them for
    /// reuse (`reclaim.rs`).
    Reclaim,
    /// Take a snapshot if one is still due (queued by the write that found
    /// it due, which does not wait for it).
    Snapshot,
}

impl Job {
    pub(crate) fn key(self) -> (bool, u32) {
        match self {
            Job::Split(p, _) => (true, p),
            Job::Merge(p) => (false, p),
            // No posting has this number.
            Job::Compact => (true, u32::MAX),
            Job::Reclaim => (true, u32::MAX - 1),
            Job::Snapshot => (true, u32::MAX - 2),
        }
    }
}

#[derive(Default)]
pub(crate) struct JobState {
    pub(crate) queue: VecDeque<Job>,
    pub(crate) queued: HashSet<(bool, u32)>,
    pub(crate) running: usize,
    pub(crate) stop: bool,
    /// A background runner is installed ([`Jobs::set_runner`]) and not
    /// stopped.
    background: bool,
    /// A background drain is queued or running (at most one per index).
    draining: bool,
    /// A background `spann` rebuild is queued or running (at most one per
    /// index; [`Jobs::start_rebuild`]).
    rebuilding: bool,
    /// The holder paused the background jobs ([`Jobs::pause`]): no drain
    /// or rebuild starts, a drain running ends after its current job.
    paused: bool,
}

/// What a background task runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Task {
    /// Calls [`Jobs::take_background`] until it returns `None`, running
    /// each job.
    Drain,
    /// A `spann` rebuild, then [`Jobs::rebuild_ended`]. It runs beside the
    /// drain, not in it: a rebuild takes seconds, and the snapshots and
    /// reclaims queued meanwhile must not wait for it.
    Rebuild,
}

/// Starts a background task on the process's shared rebuild pool.
pub(crate) type Runner = Box<dyn Fn(Task) + Send + Sync>;

/// The job queue (a posting is queued at most once per kind).
#[derive(Default)]
pub(crate) struct Jobs {
    pub(crate) state: Mutex<JobState>,
    pub(crate) idle: Condvar,
    /// Signalled when a background drain ends.
    retired: Condvar,
    runner: Mutex<Option<Runner>>,
}

impl Jobs {
    pub fn push(&self, job: Job) {
        let start = {
            let mut s = self.state.lock();
            if !s.queued.insert(job.key()) {
                return;
            }
            // A reclaim and a snapshot go first: the splits and merges of a
            // busy queue would otherwise let dead numbers, and blocks held
            // until the next snapshot, pile up behind them. A queued
            // snapshot stays ahead of a reclaim, which rewrites postings
            // (releasing blocks) for as long as it runs.
            match job {
                Job::Snapshot => s.queue.push_front(job),
                Job::Reclaim if s.queue.front() == Some(&Job::Snapshot) => s.queue.insert(1, job),
                Job::Reclaim => s.queue.push_front(job),
                _ => s.queue.push_back(job),
            }
            Self::claim_drain(&mut s)
        };
        if start {
            self.start_drain();
        }
    }

    /// Whether the caller must start a background drain (and, if so, marks
    /// one started): jobs are queued, a runner is installed, and no drain is
    /// queued or running already.
    fn claim_drain(s: &mut JobState) -> bool {
        if s.background && !s.stop && !s.paused && !s.draining && !s.queue.is_empty() {
            s.draining = true;
            true
        } else {
            false
        }
    }

    fn start_drain(&self) {
        if let Some(run) = &*self.runner.lock() {
            run(Task::Drain);
        }
    }

    /// Starts a background rebuild unless one is queued or running, or no
    /// runner is installed (or it is stopping); whether it started one.
    pub(crate) fn start_rebuild(&self) -> bool {
        {
            let mut s = self.state.lock();
            if !s.background || s.stop || s.paused || s.rebuilding {
                return false;
            }
            s.rebuilding = true;
        }
        match &*self.runner.lock() {
            Some(run) => {
                run(Task::Rebuild);
                true
            }
            None => {
                self.rebuild_ended();
                false
            }
        }
    }

    /// Pauses the background jobs (`true`) or resumes them (`false`, and
    /// a drain starts if jobs queued meanwhile); whether a background
    /// runner is installed (without one, jobs run in their callers and
    /// there is nothing to pause). A rebuild running goes on to its end;
    /// a due one starts at the first write after the resume.
    pub(crate) fn pause(&self, paused: bool) -> bool {
        let start = {
            let mut s = self.state.lock();
            if !s.background {
                return false;
            }
            s.paused = paused;
            Self::claim_drain(&mut s)
        };
        if start {
            self.start_drain();
        }
        true
    }

    /// Whether the holder paused the background jobs.
    pub(crate) fn paused(&self) -> bool {
        self.state.lock().paused
    }

    /// Whether the runner is being stopped (a background task should end).
    pub(crate) fn stopping(&self) -> bool {
        self.state.lock().stop
    }

    /// Called by the background rebuild as it ends (however it ends).
    pub(crate) fn rebuild_ended(&self) {
        let mut s = self.state.lock();
        s.rebuilding = false;
        self.retired.notify_all();
    }

    /// Installs the background runner: from now on, queued jobs are run in
    /// the background, one drain at a time.
    pub(crate) fn set_runner(&self, run: Runner) {
        *self.runner.lock() = Some(run);
        let start = {
            let mut s = self.state.lock();
            s.background = true;
            Self::claim_drain(&mut s)
        };
        if start {
            self.start_drain();
        }
    }

    /// Jobs queued or running.
    pub fn pending(&self) -> usize {
        let s = self.state.lock();
        s.queue.len() + s.running
    }

    fn pop(s: &mut JobState) -> Option<Job> {
        let j = s.queue.pop_front()?;
        s.queued.remove(&j.key());
        s.running += 1;
        Some(j)
    }

    /// The next job, marked running, or `None` when none is queued.
    pub(crate) fn take(&self) -> Option<Job> {
        Self::pop(&mut self.state.lock())
    }

    /// The next job for the background drain, marked running; `None` ends
    /// the drain (nothing queued, or the runner is stopping: a stopping
    /// drain leaves the queue to whoever drains it, as searches may keep
    /// queueing merges).
    pub(crate) fn take_background(&self) -> Option<Job> {
        let mut s = self.state.lock();
        let job = if s.stop || s.paused {
            None
        } else {
            Self::pop(&mut s)
        };
        if job.is_none() {
            s.draining = false;
            self.retired.notify_all();
        }
        job
    }

    pub(crate) fn finish(&self) {
        let mut s = self.state.lock();
        s.running -= 1;
        if s.running == 0 && s.queue.is_empty() {
            self.idle.notify_all();
        }
    }

    /// Waits until no job is queued or running (the caller runs none).
    pub(crate) fn wait_idle(&self) {
        let mut s = self.state.lock();
        while s.running > 0 && s.queue.is_empty() {
            self.idle.wait(&mut s);
        }
    }

    /// Stops the background runner and waits for its drain and its
    /// rebuild to end (queued jobs stay queued; later ones are run by
    /// whoever drains them).
    pub fn stop_workers(&self) {
        let mut s = self.state.lock();
        s.stop = true;
        s.background = false;
        while s.draining || s.rebuilding {
            self.retired.wait(&mut s);
        }
        s.stop = false;
        drop(s);
        // The runner holds the shared pool: dropped, the pool's threads end
        // once no index uses it.
        self.runner.lock().take();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn order(jobs: &Jobs) -> Vec<Job> {
        std::iter::from_fn(|| {
            let j = jobs.take();
            if j.is_some() {
                jobs.finish();
            }
            j
        })
        .collect()
    }

    #[test]
    fn a_snapshot_goes_first_and_stays_ahead_of_a_later_reclaim() {
        let jobs = Jobs::default();
        jobs.push(Job::Split(1, 0));
        jobs.push(Job::Snapshot);
        jobs.push(Job::Reclaim);
        jobs.push(Job::Snapshot);
        assert_eq!(
            order(&jobs),
            [Job::Snapshot, Job::Reclaim, Job::Split(1, 0)],
            "queued once each, the snapshot first"
        );
        jobs.push(Job::Merge(2));
        jobs.push(Job::Reclaim);
        jobs.push(Job::Snapshot);
        assert_eq!(order(&jobs), [Job::Snapshot, Job::Reclaim, Job::Merge(2)]);
    }

    #[test]
    fn a_pause_starts_no_drain_or_rebuild_and_a_resume_starts_the_drain() {
        use std::sync::Arc;
        let jobs = Jobs::default();
        assert!(!jobs.pause(true), "no runner: nothing to pause");
        assert!(!jobs.paused());
        let started = Arc::new(Mutex::new(Vec::new()));
        let log = started.clone();
        jobs.set_runner(Box::new(move |t| log.lock().push(t)));
        assert!(jobs.pause(true));
        jobs.push(Job::Split(1, 0));
        jobs.push(Job::Merge(2));
        assert!(!jobs.start_rebuild(), "no rebuild starts while paused");
        assert!(started.lock().is_empty(), "no drain starts while paused");
        assert_eq!(jobs.pending(), 2, "the jobs stay queued");
        assert!(jobs.pause(false));
        assert_eq!(
            *started.lock(),
            [Task::Drain],
            "the resume starts the drain"
        );
        // A drain running when a pause comes ends after its current job.
        assert_eq!(jobs.take_background(), Some(Job::Split(1, 0)));
        assert!(jobs.pause(true));
        jobs.finish();
        assert_eq!(jobs.take_background(), None, "paused: the drain ends");
        assert_eq!(jobs.pending(), 1);
        assert!(jobs.pause(false));
        assert_eq!(*started.lock(), [Task::Drain, Task::Drain]);
        assert!(jobs.start_rebuild());
    }
}
