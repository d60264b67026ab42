//! Threads are bounded per process, not per index: engines that ask for the
//! same pool share it (`vectide_core::pools`), and the SPANN family's
//! Local Rebuilder runs on one shared pool, so opening forty indexes of
//! `fresh-diskann` and forty of `spfresh` does not start forty times the
//! threads of one. (Its own test binary: nextest runs it in a process of its
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

fn params(dir: &std::path::Path) -> Params {
    let mut p = Params::new();
    p.insert("threads".into(), ParamValue::Int(THREADS));
    p.insert("path".into(), ParamValue::Str(dir.display().to_string()));
    p
}

#[test]
fn many_indexes_share_a_bounded_number_of_threads() {
    let Some(before) = process_threads() else {
        return; // not Linux: nothing to count
    };
    let root = tempfile::tempdir().unwrap();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut open = Vec::new();
    for i in 0..INDEXES {
        for engine in ["fresh-diskann", "spfresh"] {
            let dir = root.path().join(format!("{engine}-{i}"));
            let idx = vectide_engines::create(engine, 8, Metric::L2, &params(&dir)).unwrap();
            let rows: Vec<f32> = (0..16 * 8).map(|x| (x % 13) as f32 + i as f32).collect();
            let ids: Vec<u64> = (0..16).collect();
            idx.insert(1, &ids, &rows).unwrap();
            open.push(idx);
        }
    }
    let after = process_threads().unwrap();
    // The `fdann` and `spann` pools of THREADS workers each, the rebuild
    // pool of one per core, and a margin for pools rayon or the runtime
    // start once per process. Before the pools were shared, each index
    // started its own (40 × 4 + 40 × (4 + 1) = 360 threads here).
    let bound = 2 * THREADS as usize + cores + 16;
    assert!(
        after - before <= bound,
        "{INDEXES} indexes of each engine started {} threads (bound {bound})",
        after - before
    );
    for idx in &open {
        assert_eq!(idx.len(), 16);
    }
    drop(open);
}
