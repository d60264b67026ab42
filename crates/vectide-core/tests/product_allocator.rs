//! The product's allocator (`vectide_core::trim::ProductAllocator`, the
//! global allocator of the Python extension and the CLI) gives the pages
//! of freed blocks back to the system by itself: the pattern that kept a
//! long-running database's RSS climbing under glibc (blocks of a few tens
//! of KiB freed around small blocks that stay) leaves RSS without a trim.
//! Under glibc's allocator this test fails (see `trim.rs`'s own test: the
//! same blocks stay resident until `malloc_trim`).

#[global_allocator]
static GLOBAL: vectide_core::trim::ProductAllocator = vectide_core::trim::ProductAllocator;

fn rss_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmRSS:"))?;
    Some(line.split_whitespace().nth(1)?.parse::<u64>().ok()? * 1024)
}

#[cfg(target_os = "linux")]
#[test]
fn freed_blocks_leave_rss_without_a_trim() {
    // 176 MiB of 60 KiB blocks, each followed by a small block that stays.
    let mut big = Vec::with_capacity(3000);
    let mut small = Vec::with_capacity(3000);
    for i in 0..3000 {
        big.push(vec![(i % 251) as u8 + 1; 60 << 10]);
        small.push(vec![(i % 13) as u8 + 1; 48]);
    }
    let before = rss_bytes().unwrap();
    drop(big);
    let freed = 3000u64 * (60 << 10);
    // The allocator purges free pages after a short delay, on its next
    // calls: keep allocating a little while waiting (at most 5 s).
    let mut after = rss_bytes().unwrap();
    for _ in 0..100 {
        if before.saturating_sub(after) >= freed * 3 / 4 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
        let churn: Vec<Vec<u8>> = (0..64).map(|i| vec![i as u8; 4096]).collect();
        drop(churn);
        after = rss_bytes().unwrap();
    }
    assert!(
        before.saturating_sub(after) >= freed * 3 / 4,
        "RSS {before} -> {after}: less than 3/4 of the {freed} bytes freed went back"
    );
    // The small blocks are intact.
    for (i, s) in small.iter().enumerate() {
        assert!(s.iter().all(|&b| b == (i % 13) as u8 + 1));
    }
}

/// The `VmFlags` of the mapping of `/proc/self/smaps` that holds `addr`.
#[cfg(target_os = "linux")]
fn vm_flags_of(addr: usize) -> Option<String> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
    let mut inside = false;
    for line in smaps.lines() {
        // A mapping's first line: `start-end perms offset dev inode [path]`.
        if let Some((range, _)) = line.split_once(' ') {
            if let Some((lo, hi)) = range.split_once('-') {
                if let (Ok(lo), Ok(hi)) =
                    (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
                {
                    inside = lo <= addr && addr < hi;
                    continue;
                }
            }
        }
        if inside {
            if let Some(flags) = line.strip_prefix("VmFlags:") {
                return Some(flags.trim().to_string());
            }
        }
    }
    None
}

/// The allocator does not advise the kernel to back its memory with
/// transparent huge pages (`MADV_HUGEPAGE`, the `hg` flag of the mapping).
/// With the advice, khugepaged collapses any 2 MiB range that still has a
/// resident page back into a whole huge page, refilling what the allocator
/// had purged: a server soak's RSS climbed 118 -> 168 MB with its huge
/// pages while the engine's memory stayed at 62 MB. Fails when mimalloc is
/// built without its `no_thp` feature (on Linux with overcommit allowed, its
/// default: mimalloc advises only the arenas it commits up front).
#[cfg(target_os = "linux")]
#[test]
fn heap_memory_is_not_advised_into_huge_pages() {
    // Small blocks and a large one (mimalloc v3 serves both from its
    // arenas, up to 2 GiB): neither may carry the advice.
    let small: Vec<Vec<u8>> = (0..256).map(|i| vec![i as u8; 1024]).collect();
    let large = vec![1u8; 64 << 20];
    for (what, addr) in [
        ("a 1 KiB block", small[128].as_ptr() as usize),
        ("a 64 MiB block", large.as_ptr() as usize),
    ] {
        let flags = vm_flags_of(addr).expect("the block's mapping is in /proc/self/smaps");
        assert!(
            !flags.split_whitespace().any(|f| f == "hg"),
            "{what}'s mapping is advised into huge pages: VmFlags {flags}"
        );
    }
    assert_eq!(small[255][0], 255);
    assert_eq!(large[(64 << 20) - 1], 1);
}
