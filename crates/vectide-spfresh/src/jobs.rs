//! The Local Rebuilder's job queue (SPFresh §4.1): split, merge and
//! reassign jobs, deduplicated, and the workers' stop and wait flags. The
//! jobs themselves run in `rebuild.rs`.

use parking_lot::{Condvar, Mutex};
use std::collections::{HashSet, VecDeque};
use std::thread::JoinHandle;

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
}

impl Job {
    pub(crate) fn key(self) -> (bool, u32) {
        match self {
            Job::Split(p, _) => (true, p),
            Job::Merge(p) => (false, p),
            // No posting has this number.
            Job::Compact => (true, u32::MAX),
        }
    }
}

#[derive(Default)]
pub(crate) struct JobState {
    pub(crate) queue: VecDeque<Job>,
    pub(crate) queued: HashSet<(bool, u32)>,
    pub(crate) running: usize,
    pub(crate) stop: bool,
}

/// The job queue (a posting is queued at most once per kind).
#[derive(Default)]
pub(crate) struct Jobs {
    pub(crate) state: Mutex<JobState>,
    pub(crate) work: Condvar,
    pub(crate) idle: Condvar,
    pub(crate) workers: Mutex<Vec<JoinHandle<()>>>,
}

impl Jobs {
    pub fn push(&self, job: Job) {
        let mut s = self.state.lock();
        if s.queued.insert(job.key()) {
            s.queue.push_back(job);
            self.work.notify_one();
        }
    }

    /// Jobs queued or running.
    pub fn pending(&self) -> usize {
        let s = self.state.lock();
        s.queue.len() + s.running
    }

    /// The next job, marked running; `wait`: blocks until one comes or the
    /// workers stop.
    pub(crate) fn take(&self, wait: bool) -> Option<Job> {
        let mut s = self.state.lock();
        loop {
            // A stopping worker leaves the queue to whoever drains it
            // (searches may keep queueing merges).
            if wait && s.stop {
                return None;
            }
            if let Some(j) = s.queue.pop_front() {
                s.queued.remove(&j.key());
                s.running += 1;
                return Some(j);
            }
            if !wait {
                return None;
            }
            self.work.wait(&mut s);
        }
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

    /// Stops and joins the background workers (queued jobs stay queued).
    pub fn stop_workers(&self) {
        self.state.lock().stop = true;
        self.work.notify_all();
        let hs: Vec<_> = self.workers.lock().drain(..).collect();
        for h in hs {
            let _ = h.join();
        }
        self.state.lock().stop = false;
    }
}
