//! Giving freed memory back to the system: the product's allocator, and a
//! trim of the C heap after a large job.
//!
//! glibc's allocator keeps what a program frees: a chunk in the middle of
//! an arena stays resident until the same process allocates it again, and
//! the threshold above which a block gets a mapping of its own (and goes
//! back to the system when freed) rises to 32 MiB after the first such
//! block is freed. A maintenance job that allocates hundreds of megabytes
//! in blocks of a few megabytes (a StreamingMerge, a rebuild) therefore
//! leaves them resident after it ends, fragmented among live blocks, and a
//! long-running database's RSS climbs with every job although what it has
//! allocated stays flat (the soak measured it: `fresh-diskann`'s heap in
//! use 230 MB throughout, free heap 72 → 422 MB over ten minutes).
//!
//! Two answers, both here:
//! - [`ProductAllocator`] (mimalloc) is the global allocator of the
//!   product's binaries: the Python extension and the `vectide` CLI (the
//!   server, the memory node) declare it. It allocates each size class from
//!   pages of its own and gives a page back to the system (purges it) soon
//!   after its last block is freed, so a job's freed memory leaves RSS
//!   without a trim, and small long-lived blocks do not pin the pages of
//!   large freed ones. Same 10-minute `fresh-diskann` soak: RSS between
//!   merges stayed near 340 MB, where glibc with the trim below crept 322 →
//!   477 MB. Test binaries (but `tests/product_allocator.rs`, which checks
//!   this) and the benchmarks' counting allocators keep the system
//!   allocator. It is built with local-dynamic TLS: the extension is
//!   dlopen'ed (the workspace's `Cargo.toml` says why). It is also built
//!   without transparent huge pages (`no_thp`): by default it advises the
//!   kernel to back its arenas with 2 MiB pages (`MADV_HUGEPAGE`), and
//!   khugepaged then collapses any 2 MiB range that still holds a resident
//!   page back into a whole huge page, filling in again the 4 KiB pages
//!   mimalloc had purged. A server soak showed it (session 39, flat engine,
//!   `/proc/PID/smaps_rollup` every 10 s over its last six minutes):
//!   anonymous memory less `AnonHugePages` stayed within 89–96 MB (one
//!   sample 103) while the huge pages moved between 50 and 68 MB, and the
//!   rises of RSS were theirs (session 38's `p-hnsw` server soak: 118 ->
//!   168 MB with the engine's own memory at 62 MB). On a machine whose THP
//!   setting is `always` rather than `madvise`, the kernel does it without
//!   being asked; there `MIMALLOC_ALLOW_THP=0` in the environment makes
//!   mimalloc turn THP off for the whole process (`PR_SET_THP_DISABLE`,
//!   inherited by child processes), the huge pages `HugeArray` asks for
//!   included.
//! - [`release_free_heap`] asks glibc to advise the kernel that the free
//!   pages of every arena are unneeded (`malloc_trim(0)`); they are faulted
//!   in again, zeroed, if they are used again. Under mimalloc it serves
//!   what still goes to glibc (the Python interpreter's objects, C
//!   libraries); the activity guard runs it after long jobs. Elsewhere than
//!   glibc it does nothing.

/// The global allocator of the product's binaries (see the module's docs).
pub use mimalloc::MiMalloc as ProductAllocator;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Returns the C heap's free pages to the system; `true` when some were.
pub fn release_free_heap() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: malloc_trim only walks the allocator's own free lists under
        // its arena locks; it is safe to call from any thread at any time and
        // frees nothing that is in use.
        unsafe { libc::malloc_trim(0) != 0 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

/// Wall-clock second of the last trim (0: never).
static LAST: AtomicU64 = AtomicU64::new(0);

/// [`release_free_heap`], at most once per `every` across the process (a
/// trim walks every arena; jobs that end close together share one).
/// Returns whether this call trimmed.
pub fn release_free_heap_at_most_every(every: Duration) -> bool {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let last = LAST.load(Ordering::Relaxed);
    if last != 0 && now < last.saturating_add(every.as_secs()) {
        return false;
    }
    if LAST
        .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
        .is_err()
    {
        return false; // another thread trims now
    }
    release_free_heap();
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rss_bytes() -> Option<u64> {
        let s = std::fs::read_to_string("/proc/self/status").ok()?;
        let line = s.lines().find(|l| l.starts_with("VmRSS:"))?;
        Some(line.split_whitespace().nth(1)?.parse::<u64>().ok()? * 1024)
    }

    /// Blocks below the mapping threshold, freed around one kept block so
    /// the arena cannot shrink from its top: resident until the trim.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn freed_heap_pages_leave_rss_after_a_trim() {
        let held: Vec<Vec<u8>> = (0..3000)
            .map(|i| vec![(i % 251) as u8 + 1; 60 << 10])
            .collect();
        let keep = vec![7u8; 60 << 10];
        let before = rss_bytes().unwrap();
        drop(held);
        let freed = rss_bytes().unwrap();
        release_free_heap();
        let after = rss_bytes().unwrap();
        assert_eq!(keep[0], 7);
        // 3,000 × 60 KiB = 176 MiB freed: glibc keeps it, the trim returns it.
        assert!(
            freed + (100 << 20) > before,
            "freed blocks stay resident: {before} -> {freed}"
        );
        assert!(
            after + (100 << 20) < freed,
            "the trim returns them: {freed} -> {after}"
        );
    }

    #[test]
    fn trims_are_rate_limited() {
        let every = Duration::from_secs(3600);
        let first = release_free_heap_at_most_every(every);
        let second = release_free_heap_at_most_every(every);
        assert!(!second, "a second trim within the hour is skipped");
        let _ = first; // another test may have trimmed first
    }
}
