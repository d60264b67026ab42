//! Scheduling hints for background threads.
//!
//! A StreamingMerge runs CPU-bound work (the Delete phase's repairs) beside
//! work that mostly waits on the disk (the Insert phase's searches). At the
//! same priority the CPU-bound threads take the cores while a search's reads
//! complete, and the searches, the merge's critical path, wait for a turn.
//! Threads that lower their own priority run on what the others leave.

/// Lowers the calling thread's CPU priority by `steps` nice levels (at most
/// to 19). On Linux the nice value belongs to each thread, and raising it
/// needs no privilege; elsewhere this does nothing. Returns the thread's
/// nice value after the call, `None` where it is not supported or the call
/// failed (the thread keeps running at its old priority).
pub fn lower_priority(steps: i32) -> Option<i32> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: getpriority and setpriority take no pointers. On Linux
        // `PRIO_PROCESS` with `who` 0 names the calling thread (nice is a
        // per-thread attribute under NPTL), so only this thread changes.
        unsafe {
            *libc::__errno_location() = 0;
            let now = libc::getpriority(libc::PRIO_PROCESS, 0);
            if now == -1 && *libc::__errno_location() != 0 {
                return None;
            }
            let to = (now + steps.max(0)).min(19);
            if libc::setpriority(libc::PRIO_PROCESS, 0, to) != 0 {
                return None;
            }
            Some(libc::getpriority(libc::PRIO_PROCESS, 0))
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = steps;
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_lowers_its_own_priority_only() {
        let (before, after) = std::thread::spawn(|| {
            let before = lower_priority(0);
            (before, lower_priority(3))
        })
        .join()
        .unwrap();
        if cfg!(target_os = "linux") {
            let before = before.expect("nice readable");
            assert_eq!(after, Some((before + 3).min(19)));
            // This thread was not touched.
            assert_eq!(lower_priority(0), Some(before));
        } else {
            assert_eq!(after, None);
        }
    }
}
