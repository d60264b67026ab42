//! [`MsyncMedia`]: persistence points turned into `msync`, with group commit.

use super::Media;
use crate::region::Site;
use parking_lot::{Condvar, Mutex};
use std::collections::HashMap;

const PAGE: usize = 4096;

/// Persistence on an ordinary file system: `persist` records the dirty pages,
/// `fence` makes them durable with `msync(MS_SYNC)`.
///
/// **Group commit.** Fences of concurrent threads share one round of
/// `msync`s: a fence that finds a round running waits for it (and, if its
/// pages arrived after the round took its list, for the next one, which the
/// first waiter to wake leads). A round issues one `msync` per region over the
/// span of its dirty pages, so a fence costs one device flush however many
/// ranges were persisted since the last one.
#[derive(Debug, Default)]
pub struct MsyncMedia {
    state: Mutex<State>,
    done: Condvar,
}

#[derive(Debug, Default)]
struct State {
    /// Region id -> (base address, length).
    regions: HashMap<u32, (usize, usize)>,
    next_id: u32,
    /// Region id -> dirty page span [lo, hi) as byte offsets.
    dirty: HashMap<u32, (usize, usize)>,
    /// Rounds started / finished.
    started: u64,
    finished: u64,
    syncing: bool,
    rounds: u64,
    msyncs: u64,
}

impl MsyncMedia {
    pub fn new() -> Self {
        Self::default()
    }

    /// (fence rounds, msync calls) so far: the group-commit ratio is
    /// fences / rounds.
    pub fn counters(&self) -> (u64, u64) {
        let s = self.state.lock();
        (s.rounds, s.msyncs)
    }
}

impl Media for MsyncMedia {
    fn kind(&self) -> &'static str {
        "msync"
    }

    fn persist(&self, _site: Site, addr: *const u8, len: usize) {
        if len == 0 {
            return;
        }
        let a = addr as usize;
        let mut s = self.state.lock();
        let hit = s
            .regions
            .iter()
            .find(|(_, &(b, l))| a >= b && a < b + l)
            .map(|(&id, &(b, _))| (id, b));
        if let Some((id, b)) = hit {
            let lo = (a - b) & !(PAGE - 1);
            let hi = (a - b + len).div_ceil(PAGE) * PAGE;
            let e = s.dirty.entry(id).or_insert((lo, hi));
            e.0 = e.0.min(lo);
            e.1 = e.1.max(hi);
        }
    }

    fn fence(&self, _site: Site) {
        let mut s = self.state.lock();
        // The round that will cover our pages: the running one only if our
        // pages are not still waiting (they were taken by it), else the next.
        let target = if s.dirty.is_empty() {
            if s.syncing {
                s.started
            } else {
                return;
            }
        } else {
            s.started + 1
        };
        loop {
            if s.finished >= target {
                return;
            }
            if s.syncing {
                self.done.wait(&mut s);
                continue;
            }
            // Lead a round.
            s.syncing = true;
            s.started += 1;
            let round = s.started;
            let dirty = std::mem::take(&mut s.dirty);
            let work: Vec<(usize, usize, usize)> = dirty
                .into_iter()
                .filter_map(|(id, (lo, hi))| {
                    s.regions
                        .get(&id)
                        .map(|&(base, len)| (base, lo, hi.min(len.div_ceil(PAGE) * PAGE)))
                })
                .collect();
            drop(s);
            let mut calls = 0;
            for (base, lo, hi) in work {
                if hi > lo {
                    // SAFETY: [base+lo, base+hi) lies inside a live mapping
                    // of an attached region (page-aligned; hi is clamped to
                    // the region's page-rounded length). msync does not touch
                    // memory contents.
                    unsafe {
                        libc::msync((base + lo) as *mut libc::c_void, hi - lo, libc::MS_SYNC);
                    }
                    calls += 1;
                }
            }
            s = self.state.lock();
            s.finished = round;
            s.syncing = false;
            s.rounds += 1;
            s.msyncs += calls;
            self.done.notify_all();
        }
    }

    fn attach(&self, _name: &str, base: *mut u8, len: usize) -> u32 {
        let mut s = self.state.lock();
        let id = s.next_id;
        s.next_id += 1;
        s.regions.insert(id, (base as usize, len));
        id
    }

    fn grown(&self, id: u32, new_len: usize) {
        if let Some(r) = self.state.lock().regions.get_mut(&id) {
            r.1 = new_len;
        }
    }

    fn detach(&self, id: u32) {
        let mut s = self.state.lock();
        s.regions.remove(&id);
        s.dirty.remove(&id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Region;
    use std::sync::atomic::Ordering;
    use std::sync::Arc;

    #[test]
    fn fences_group_and_persist_to_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let media = Arc::new(MsyncMedia::new());
        let path = dir.path().join("r");
        let r = Region::create(media.clone(), &path, 3 * PAGE).unwrap();
        r.u64_at(PAGE + 16).store(0xabcd, Ordering::Release);
        r.persist(Site("t"), PAGE + 16, 8);
        r.fence(Site("t"));
        assert_eq!(media.counters(), (1, 1));
        // Nothing dirty: a fence returns without a round.
        r.fence(Site("t"));
        assert_eq!(media.counters().0, 1);
        // The bytes are in the file (read through the page cache).
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[PAGE + 16..PAGE + 24], &0xabcdu64.to_le_bytes());

        // Concurrent fences share rounds.
        let r = Arc::new(r);
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let r = r.clone();
                std::thread::spawn(move || {
                    for i in 0..50 {
                        let off = (t * 8 + (i % 8) * 64) % (3 * PAGE - 8);
                        r.u64_at(off & !7).store(i as u64, Ordering::Release);
                        r.persist(Site("t"), off & !7, 8);
                        r.fence(Site("t"));
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let (rounds, _) = media.counters();
        assert!(rounds <= 201, "at most one round per fence");
    }
}
