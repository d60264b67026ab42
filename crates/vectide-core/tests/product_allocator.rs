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
