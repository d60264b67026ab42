//! Threads are bounded per process, not per index: engines that ask for the
//! same pool share it (`vectide_core::pools`), the SPANN family's Local
//! Rebuilder and FreshDiskANN's background merges run on shared pools, so
//! forty indexes of `fresh-diskann` and forty of `spfresh`, with forty
//! merges due at once, do not start forty times the threads of one (the
//! peak is sampled every millisecond). (Its own test binary: nextest runs it in a process of its
//! own, so other tests' threads do not count.)

use vectide_core::{Metric, ParamValue, Params};

/// Threads of this process (entries of `/proc/self/task`; `None` off Linux).
fn process_threads() -> Option<usize> {
    std::fs::read_dir("/proc/self/task")
        .ok()
        .map(|d| d.filter_map(|e| e.ok()).count())
}

const THREADS: i64 = 4;
const INDEXES: usize = 40;
const POINTS: usize = 256;

fn params(engine: &str, dir: &std::path::Path) -> Params {
    let mut p = Params::new();
    p.insert("threads".into(), ParamValue::Int(THREADS));
    p.insert("path".into(), ParamValue::Str(dir.display().to_string()));
    if engine == "fresh-diskann" {
        // Every index's points make a background merge due (the first
        // needs a point per PQ centroid).
        p.insert("merge_points".into(), ParamValue::Int(POINTS as i64));
    }
    p
}

#[test]
fn many_indexes_share_a_bounded_number_of_threads() {
    let Some(before) = process_threads() else {
        return; // not Linux: nothing to count
    };
    // The most threads seen while the indexes open, write and merge.
    let peak = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(before));
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let (peak, done) = (peak.clone(), done.clone());
        std::thread::spawn(move || {
            while !done.load(std::sync::atomic::Ordering::Acquire) {
                if let Some(n) = process_threads() {
                    peak.fetch_max(n, std::sync::atomic::Ordering::AcqRel);
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        })
    };
    let before = before + 1; // the sampler
    let root = tempfile::tempdir().unwrap();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut open = Vec::new();
    for i in 0..INDEXES {
        for engine in ["fresh-diskann", "spfresh"] {
            let dir = root.path().join(format!("{engine}-{i}"));
            let idx =
                vectide_engines::create(engine, 8, Metric::L2, &params(engine, &dir)).unwrap();
            // One point short of a merge.
            let rows: Vec<f32> = (0..(POINTS - 1) * 8)
                .map(|x| ((x * 7 + i) % 31) as f32)
                .collect();
            let ids: Vec<u64> = (0..POINTS as u64 - 1).collect();
            idx.insert(1, &ids, &rows).unwrap();
            open.push(idx);
        }
    }
    // The last point of each: forty merges (and SPFresh's jobs) due at once.
    for idx in &open {
        idx.insert(2, &[POINTS as u64 - 1], &[1.0; 8]).unwrap();
    }
    for idx in &open {
        assert_eq!(idx.len(), POINTS);
    }
    drop(open); // waits for the background merges
    done.store(true, std::sync::atomic::Ordering::Release);
    sampler.join().unwrap();
    let after = peak.load(std::sync::atomic::Ordering::Acquire);
    // The `fdann` and `spann` pools of THREADS workers each; the rebuild
    // and merge pools of one per core; the merges' I/O and Delete-phase
    // pools of about a core each, and each running merge's two phase
    // threads (at most a merge per core runs); a margin for pools rayon or
    // the runtime start once per process. Before the pools were shared,
    // each index started its own (682 threads here).
    let bound = 2 * THREADS as usize + 6 * cores + 16;
    assert!(
        after - before <= bound,
        "{INDEXES} indexes of each engine started {} threads (bound {bound})",
        after - before
    );
}
