//! A StreamingMerge-only loop for profiling: builds an LTI on the first
//! 95 % of `n` points of a dataset's sidecar directory (`python -m
//! vectide.datasets export NAME` writes it) once and keeps it next to the
//! sidecars; each run then merges the same change set into it (5 % of the
//! LTI's points deleted, the last 5 % of the `n` points inserted with the
//! links of a temp index built on them) and prints the phases' times.
//!
//! ```sh
//! cargo run --release -p vectide-diskann --example merge_loop -- \
//!     data/glove-6b-50-angular.vbin [n] [runs] [cache MiB]
//! ```
//!
//! `MERGE_L` and `MERGE_REFILL` set the merge's knobs, `MERGE_IO_THREADS`
//! and `MERGE_IN_FLIGHT` its Insert phase's threads and searches in
//! lock-step per thread (the engine's defaults otherwise); `MERGE_RECALL=1` sweeps recall@10 of the merged
//! LTI at small L against brute force after the last run, and
//! `MERGE_RECALL=rebuild` also of an LTI built from scratch on the same
//! points (kept beside the sidecars, keyed by the old LTI's size: delete
//! it after a `MERGE_INSERTS` run). `MERGE_INSERTS=0` runs the Delete
//! phase alone, `MERGE_DELETES=0` the merge without deletes.
//!
//! `python -m vectide.bench freshdiskann` is the measurement of record
//! (it times the rebuild beside the merge); this is the loop to run under
//! `perf`.

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use std::path::Path;
use std::time::Instant;
use vectide_core::io::Matrix;
use vectide_core::sync::SyncSite;
use vectide_core::{Metric, VectorIndex};
use vectide_diskann::lti::{self, GraphSource, Lti};
use vectide_diskann::merge::{streaming_merge, Inserts, MergeParams, Phase};
use vectide_storage::block::DirectFile;
use vectide_vamana::{FreshVamana, VamanaParams};

const SITE: SyncSite = SyncSite("example.merge_loop");

/// Heap bytes per merge phase: where a merge's RAM goes.
#[path = "../../test-support/counting_alloc.rs"]
mod counting_alloc;

#[global_allocator]
static A: counting_alloc::Counting = counting_alloc::Counting;

fn read_fbin(path: &Path) -> (usize, usize, Vec<f32>) {
    let m = Matrix::read(path).unwrap_or_else(|e| panic!("{e}"));
    (m.rows, m.cols, m.f32s())
}

/// CPU seconds of this process so far (user, system), from /proc.
fn cpu() -> (f64, f64) {
    let s = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let f: Vec<&str> = s
        .rsplit(')')
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    let tick = |i: usize| f.get(i).and_then(|x| x.parse::<f64>().ok()).unwrap_or(0.0) / 100.0;
    (tick(11), tick(12))
}

fn graph(dim: usize, metric: Metric, ids: &[u64], x: &[f32]) -> vectide_vamana::GraphExport {
    let params = VamanaParams {
        threads: Some(std::thread::available_parallelism().map_or(1, |n| n.get())),
        ..VamanaParams::default()
    };
    let v = FreshVamana::new(dim, metric, params).unwrap();
    v.insert(1, ids, x).unwrap();
    v.export_graph()
}

/// A knob from the environment (`MERGE_L`, `MERGE_REFILL`), else the
/// engine's default.
fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let dir = Path::new(
        args.get(1)
            .expect("usage: merge_loop DIR.vbin [n] [runs] [cache MiB]"),
    );
    let (rows, dim, train) = read_fbin(&dir.join("train.fbin"));
    let n: usize = args
        .get(2)
        .map_or(100_000, |s| s.parse().unwrap())
        .min(rows);
    let runs: usize = args.get(3).map_or(3, |s| s.parse().unwrap());
    let cache_mib: usize = args.get(4).map_or(0, |s| s.parse().unwrap());
    let meta = std::fs::read_to_string(dir.join("meta.json")).unwrap();
    let metric = if meta.contains("angular") {
        Metric::Cosine
    } else {
        Metric::L2
    };
    let base = n * 95 / 100;
    let changes = n - base;
    let lti_path = dir.join(format!("merge-loop-{n}.lti"));
    let pq_path = dir.join(format!("merge-loop-{n}.pq"));
    if !lti_path.exists() {
        let t = Instant::now();
        let ids: Vec<u64> = (0..base as u64).collect();
        let g = graph(dim, metric, &ids, &train[..base * dim]);
        let f = DirectFile::open(&lti_path, true, SITE).unwrap();
        lti::write(&f, &pq_path, &GraphSource::from_export(&g), 32, 0).unwrap();
        eprintln!(
            "LTI on {base} points built in {:.1} s",
            t.elapsed().as_secs_f64()
        );
    }
    let mut old = Lti::open(
        Box::new(DirectFile::open(&lti_path, false, SITE).unwrap()),
        &pq_path,
    )
    .unwrap();
    if cache_mib > 0 {
        let c = old.cache_near_start(cache_mib << 20).unwrap();
        eprintln!("{c} nodes cached in {cache_mib} MiB");
    }
    // The change set: 5 % of the LTI's data nodes, and the next points
    // with their temp index's links.
    let start = old.header().start as u32;
    let mut nodes: Vec<u32> = (0..old.header().nodes as u32)
        .filter(|&i| i != start)
        .collect();
    nodes.shuffle(&mut StdRng::seed_from_u64(7));
    // `MERGE_DELETES=0` runs the merge without deletes (the Insert phase
    // without the Delete phase's repairs beside it).
    let deleted = std::env::var("MERGE_DELETES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(changes)
        .min(changes);
    let dead = &nodes[..deleted];
    // `MERGE_INSERTS=0` runs the Delete phase alone.
    let inserted = std::env::var("MERGE_INSERTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(changes)
        .min(changes);
    let labels: Vec<u64> = (base as u64..(base + inserted) as u64).collect();
    // Stored vectors are normalised under cosine, as the engine's are.
    let (vectors, links) = if inserted == 0 {
        (Vec::new(), Vec::new())
    } else {
        let end = base + inserted;
        let t = graph(dim, metric, &labels, &train[base * dim..end * dim]);
        let mut v = vec![0f32; inserted * dim];
        let mut links = vec![Vec::new(); inserted];
        let new_index = |l: u64| {
            (base as u64..end as u64)
                .contains(&l)
                .then(|| (l - base as u64) as usize)
        };
        for (i, &l) in t.labels.iter().enumerate() {
            if let Some(j) = new_index(l) {
                v[j * dim..(j + 1) * dim].copy_from_slice(t.vector(i));
                links[j] = t.lists[i]
                    .iter()
                    .filter_map(|&k| new_index(t.labels[k as usize]))
                    .map(|k| k as u32)
                    .collect();
            }
        }
        (v, links)
    };
    let threads = 2;
    let p = MergeParams {
        r: 64,
        l: env_or("MERGE_L", 40),
        alpha: 1.2,
        w: 4,
        io_threads: env_or("MERGE_IO_THREADS", threads + 1),
        refill: env_or("MERGE_REFILL", 16),
        in_flight: env_or("MERGE_IN_FLIGHT", 8),
    };
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    for run in 0..runs {
        let inter = Box::new(DirectFile::open(&dir.join("merge-loop.mid"), true, SITE).unwrap());
        let out = DirectFile::open(&dir.join("merge-loop.new"), true, SITE).unwrap();
        let t = Instant::now();
        let c0 = cpu();
        let before = counting_alloc::reset();
        // Peaks are charged to the phase the progress named last (the
        // Delete and Insert phases overlap: "insert" once it reports).
        let progress = |ph: Phase, _: u64, _: u64| counting_alloc::enter(ph.ordinal());
        let o = pool.install(|| {
            streaming_merge(
                &old,
                dead,
                Inserts {
                    labels: &labels,
                    vectors: &vectors,
                    links: &links,
                },
                &p,
                inter,
                &out,
                &dir.join("merge-loop.new.pq"),
                2,
                Some(&progress),
            )
            .unwrap()
        });
        // The change set's vector bytes (deleted and new points), as
        // `bench freshdiskann` counts them; the Delete and Insert phases
        // hold every named cache, the Patch phase only the I/O buffers.
        let change = ((inserted + deleted) * dim * 4).max(1) as f64;
        let added = |i: usize| counting_alloc::added(i, before);
        let st = &o.stats;
        let beyond = [
            added(0).max(added(1)).max(added(2)) as f64 - st.cache_bytes() as f64,
            added(3) as f64 - st.io_buffer_bytes as f64,
        ];
        let peaks: Vec<String> = ["start", "delete", "insert", "patch"]
            .iter()
            .enumerate()
            .map(|(i, name)| format!("{name} {:.1} MB", added(i) as f64 / 1e6))
            .collect();
        println!(
            "run {run}: heap added at its peak, by phase: {}; named caches {:.1} MB (near start \
             {:.1}, recent {:.1}, I/O buffers {:.1}); beyond them, over the change set's vector \
             bytes ({:.1} MB): {:.2}x (delete + insert), {:.2}x (patch)",
            peaks.join(", "),
            st.cache_bytes() as f64 / 1e6,
            st.near_start_bytes as f64 / 1e6,
            st.recent_bytes as f64 / 1e6,
            st.io_buffer_bytes as f64 / 1e6,
            change / 1e6,
            beyond[0] / change,
            beyond[1] / change,
        );
        let s = &o.stats;
        let c1 = cpu();
        println!(
            "run {run}: merge {:.2} s, cpu {:.2} user + {:.2} sys (delete {:.2}, insert {:.2}, \
             patch {:.2}); repaired {}, sectors read {}, insert cache hits {}; per new point: \
             {:.1} expanded, {:.0} PQ distances, {:.1} reads",
            t.elapsed().as_secs_f64(),
            c1.0 - c0.0,
            c1.1 - c0.1,
            s.delete_secs,
            s.insert_secs,
            s.patch_secs,
            s.repaired,
            s.sectors_read,
            s.insert_cache_hits,
            s.insert_searches.expanded as f64 / inserted.max(1) as f64,
            s.insert_searches.pq_distances as f64 / inserted.max(1) as f64,
            s.insert_searches.sectors_read as f64 / inserted.max(1) as f64,
        );
        if run + 1 == runs && std::env::var("MERGE_RECALL").is_ok() {
            recall(dir, &old, dead, &labels, &vectors, dim, metric);
        }
        for f in ["merge-loop.mid", "merge-loop.new", "merge-loop.new.pq"] {
            let _ = std::fs::remove_file(dir.join(f));
        }
    }
}

/// Recall@10 of the merged LTI (`merge-loop.new`) over a sweep of small
/// search lists, against brute force over its live points: where a
/// merge's shortcuts would show (recall near 0.98 hides them).
fn recall(
    dir: &Path,
    old: &Lti,
    dead: &[u32],
    labels: &[u64],
    inserted: &[f32],
    dim: usize,
    metric: Metric,
) {
    use rayon::prelude::*;
    let merged = Lti::open(
        Box::new(DirectFile::open(&dir.join("merge-loop.new"), false, SITE).unwrap()),
        &dir.join("merge-loop.new.pq"),
    )
    .unwrap();
    // The live points: the old LTI's minus the deleted, plus the inserted.
    let dead: std::collections::HashSet<u32> = dead.iter().copied().collect();
    let mut live: Vec<(u64, Vec<f32>)> = Vec::new();
    old.scan(|i, node| {
        if node.label != vectide_diskann::layout::NO_LABEL && !dead.contains(&i) {
            let mut v = vec![0f32; dim];
            node.vector_into(&mut v)?;
            live.push((node.label, v));
        }
        Ok(())
    })
    .unwrap();
    for (j, &l) in labels.iter().enumerate() {
        live.push((l, inserted[j * dim..(j + 1) * dim].to_vec()));
    }
    let (nq, _, test) = read_fbin(&dir.join("test.fbin"));
    let nq = nq.min(2000);
    let dist = metric.distance_fn();
    let queries: Vec<Vec<f32>> = (0..nq)
        .map(|q| {
            let mut v = test[q * dim..(q + 1) * dim].to_vec();
            if metric == Metric::Cosine {
                let n = v
                    .iter()
                    .map(|x| x * x)
                    .sum::<f32>()
                    .sqrt()
                    .max(f32::MIN_POSITIVE);
                v.iter_mut().for_each(|x| *x /= n);
            }
            v
        })
        .collect();
    let truth: Vec<Vec<u64>> = queries
        .par_iter()
        .map(|q| {
            let mut d: Vec<(f32, u64)> = live.iter().map(|(l, v)| (dist(q, v), *l)).collect();
            d.select_nth_unstable_by(9, |a, b| a.0.total_cmp(&b.0));
            d[..10].iter().map(|x| x.1).collect()
        })
        .collect();
    let sweep = |name: &str, index: &Lti| {
        for l in [10usize, 12, 16, 24, 40] {
            let hits: usize = queries
                .par_iter()
                .zip(&truth)
                .map_init(lti::Scratch::default, |sc, (q, t)| {
                    let mut out = Vec::new();
                    index
                        .search(q, 10, l, 4, &|_, _| true, sc, &mut out)
                        .unwrap();
                    out.iter().filter(|x| t.contains(&x.1)).count()
                })
                .sum();
            println!(
                "  {name} L {l}: recall@10 {:.4}",
                hits as f64 / (10 * nq) as f64
            );
        }
    };
    sweep("merged", &merged);
    // `MERGE_RECALL=rebuild`: the same sweep over an LTI built from
    // scratch on the live points (kept beside the sidecars).
    if std::env::var("MERGE_RECALL").as_deref() == Ok("rebuild") {
        let path = dir.join(format!("merge-loop-{}.ref.lti", old.header().nodes));
        let pq = path.with_extension("pq");
        if !path.exists() {
            let ids: Vec<u64> = live.iter().map(|x| x.0).collect();
            let x: Vec<f32> = live.iter().flat_map(|x| x.1.iter().copied()).collect();
            let g = graph(dim, metric, &ids, &x);
            let f = DirectFile::open(&path, true, SITE).unwrap();
            lti::write(&f, &pq, &GraphSource::from_export(&g), 32, 0).unwrap();
        }
        let r = Lti::open(Box::new(DirectFile::open(&path, false, SITE).unwrap()), &pq).unwrap();
        sweep("rebuilt", &r);
    }
}
