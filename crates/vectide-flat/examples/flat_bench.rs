//! Times the batched exact search of engine `flat` against faiss
//! `IndexFlatIP` (or `IndexFlatL2`) on the same random data, with 1 and 2
//! threads, in one run.
//!
//! ```text
//! cargo run --release -p vectide-flat --example flat_bench -- \
//!     [--n 390000] [--nq 10000] [--dim 50] [--k 10] [--metric ip|l2] \
//!     [--threads 1,2] [--python .venv/bin/python] [--reps 2] [--tiles Q,X]
//! ```
//!
//! The vectors and queries are uniform in [-1, 1) from a fixed seed. They
//! are written to a temp directory as raw little-endian f32 files, which a
//! Python child process loads with numpy and hands to faiss (with
//! `faiss.omp_set_num_threads(t)`), once with faiss's default
//! `distance_compute_blas_threshold` and once with it lowered to 20 (its
//! BLAS path). The two sides run in interleaved rounds (`--reps`), so that
//! both meet the same load of the machine, and each configuration keeps its
//! best round. Without faiss (no `--python`, or it fails to import), only
//! Vectide's numbers are printed.

use rand::{Rng, SeedableRng};
use std::collections::HashSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;
use vectide_core::{Metric, SearchParams, VectorIndex};
use vectide_flat::{Flat, FlatParams};

struct Args {
    n: usize,
    nq: usize,
    dim: usize,
    k: usize,
    metric: Metric,
    threads: Vec<usize>,
    python: Option<PathBuf>,
    reps: usize,
    /// Tile sizes (queries, vectors); `None`: the engine's defaults.
    tiles: Option<(usize, usize)>,
}

fn parse_args() -> Args {
    let mut a = Args {
        n: 390_000,
        nq: 10_000,
        dim: 50,
        k: 10,
        metric: Metric::Ip,
        threads: vec![1, 2],
        python: [".venv/bin/python", "../../.venv/bin/python"]
            .iter()
            .map(PathBuf::from)
            .find(|p| p.exists()),
        reps: 2,
        tiles: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        let num = || value.parse::<usize>().expect("a number");
        match flag.as_str() {
            "--n" => a.n = num(),
            "--nq" => a.nq = num(),
            "--dim" => a.dim = num(),
            "--k" => a.k = num(),
            "--reps" => a.reps = num().max(1),
            "--metric" => a.metric = Metric::parse(&value).expect("a metric"),
            "--threads" => {
                a.threads = value
                    .split(',')
                    .map(|t| t.parse().expect("a number"))
                    .collect()
            }
            "--python" => a.python = Some(PathBuf::from(value)),
            "--tiles" => {
                let (q, x) = value.split_once(',').expect("--tiles Q,X");
                a.tiles = Some((q.parse().expect("a number"), x.parse().expect("a number")));
            }
            other => panic!("unknown flag {other}"),
        }
    }
    a
}

fn write_f32(path: &Path, data: &[f32]) {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    for x in data {
        f.write_all(&x.to_le_bytes()).unwrap();
    }
}

const FAISS: &str = r#"
import sys, time, numpy as np, faiss
d, n, nq, k, reps, metric = (int(sys.argv[i]) for i in range(1, 7))
base, queries, out = sys.argv[7], sys.argv[8], sys.argv[9]
threads = [int(t) for t in sys.argv[10].split(",")]
xb = np.fromfile(base, dtype="<f4").reshape(n, d)
xq = np.fromfile(queries, dtype="<f4").reshape(nq, d)
index = faiss.IndexFlatIP(d) if metric == 1 else faiss.IndexFlatL2(d)
index.add(xb)
default_threshold = faiss.cvar.distance_compute_blas_threshold
for path, threshold in (("default", default_threshold), ("blas", 20)):
    faiss.cvar.distance_compute_blas_threshold = threshold
    for t in threads:
        faiss.omp_set_num_threads(t)
        best = float("inf")
        for _ in range(reps):
            t0 = time.perf_counter()
            D, I = index.search(xq, k)
            best = min(best, time.perf_counter() - t0)
        print(path, threshold, t, best, flush=True)
I.astype("<i8").tofile(out)
"#;

/// One faiss timing: its search path (`default`: faiss's own
/// `distance_compute_blas_threshold`, `blas`: the threshold lowered to 20 so
/// that the batch goes through its BLAS path), the threshold, threads, seconds.
struct FaissTime {
    path: String,
    threshold: String,
    threads: usize,
    secs: f64,
}

/// faiss's best times, and its ids (`nq × k`).
fn run_faiss(a: &Args, python: &Path, dir: &Path) -> Option<(Vec<FaissTime>, Vec<i64>)> {
    let threads: Vec<String> = a.threads.iter().map(|t| t.to_string()).collect();
    let out = dir.join("faiss_ids.bin");
    let metric = if a.metric == Metric::L2 { 0 } else { 1 };
    let res = std::process::Command::new(python)
        .arg("-c")
        .arg(FAISS)
        .args([a.dim, a.n, a.nq, a.k, 1, metric].map(|v| v.to_string()))
        .arg(dir.join("base.f32"))
        .arg(dir.join("queries.f32"))
        .arg(&out)
        .arg(threads.join(","))
        .env(
            "OMP_NUM_THREADS",
            a.threads.iter().max().unwrap().to_string(),
        )
        .output()
        .ok()?;
    if !res.status.success() {
        eprintln!("faiss run failed: {}", String::from_utf8_lossy(&res.stderr));
        return None;
    }
    let times = String::from_utf8_lossy(&res.stdout)
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            Some(FaissTime {
                path: w.next()?.to_string(),
                threshold: w.next()?.to_string(),
                threads: w.next()?.parse().ok()?,
                secs: w.next()?.parse().ok()?,
            })
        })
        .collect();
    let ids = std::fs::read(&out)
        .ok()?
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    Some((times, ids))
}

fn main() {
    let a = parse_args();
    let mut rng = rand::rngs::StdRng::seed_from_u64(42);
    let base: Vec<f32> = (0..a.n * a.dim).map(|_| rng.gen_range(-1.0..1.0)).collect();
    let queries: Vec<f32> = (0..a.nq * a.dim)
        .map(|_| rng.gen_range(-1.0..1.0))
        .collect();
    let ids: Vec<u64> = (0..a.n as u64).collect();
    println!(
        "data: n={} nq={} dim={} k={} metric={} simd={} ({} cores)",
        a.n,
        a.nq,
        a.dim,
        a.k,
        a.metric,
        vectide_core::distance::active_isa(),
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );

    // Rounds interleave the two sides, so that both meet the same load of
    // the machine; each configuration keeps its best round.
    let indexes: Vec<(usize, Flat)> = a
        .threads
        .iter()
        .map(|&t| {
            let idx = Flat::new(a.dim, a.metric, FlatParams { threads: Some(t) }).unwrap();
            idx.insert(1, &ids, &base).unwrap();
            (t, idx)
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    if a.python.is_some() {
        write_f32(&dir.path().join("base.f32"), &base);
        write_f32(&dir.path().join("queries.f32"), &queries);
    }
    let mut ours = vec![f64::INFINITY; indexes.len()];
    let mut our_ids = Vec::new();
    let mut theirs: Vec<FaissTime> = Vec::new();
    let mut faiss_ids = None;
    for round in 1..=a.reps {
        for ((t, idx), best) in indexes.iter().zip(&mut ours) {
            let t0 = Instant::now();
            our_ids = match a.tiles {
                Some((q, x)) => idx.search_batch_tiled(&queries, a.k, None, q, x),
                None => idx.search_batch(&queries, a.k, &SearchParams::default(), None),
            }
            .unwrap();
            let secs = t0.elapsed().as_secs_f64();
            println!("round {round}: vectide flat threads={t}: {secs:.3} s");
            *best = best.min(secs);
        }
        let Some(python) = &a.python else { continue };
        let Some((times, got)) = run_faiss(&a, python, dir.path()) else {
            continue;
        };
        for f in times {
            println!(
                "round {round}: faiss {} path threads={}: {:.3} s",
                f.path, f.threads, f.secs
            );
            match theirs
                .iter_mut()
                .find(|b| b.path == f.path && b.threads == f.threads)
            {
                Some(b) => b.secs = b.secs.min(f.secs),
                None => theirs.push(f),
            }
        }
        faiss_ids = Some(got);
    }

    println!("best of {} rounds:", a.reps);
    for ((t, _), best) in indexes.iter().zip(&ours) {
        println!(
            "vectide flat threads={t}: {best:.3} s, {:.0} QPS",
            a.nq as f64 / best
        );
    }
    let Some(faiss_ids) = faiss_ids else {
        println!("faiss: not run (no --python, or it failed)");
        return;
    };
    let kind = if a.metric == Metric::L2 { "L2" } else { "IP" };
    for f in &theirs {
        println!(
            "faiss IndexFlat{kind} ({} path, blas_threshold={}) threads={}: {:.3} s, {:.0} QPS",
            f.path,
            f.threshold,
            f.threads,
            f.secs,
            a.nq as f64 / f.secs
        );
    }
    for f in &theirs {
        if let Some(((t, _), mine)) = indexes
            .iter()
            .zip(&ours)
            .find(|((t, _), _)| *t == f.threads)
        {
            println!(
                "ratio threads={t} vs faiss {} path: vectide QPS / faiss QPS = {:.2}",
                f.path,
                f.secs / mine
            );
        }
    }
    // The two exact answers agree up to ties.
    let mut same = 0usize;
    for (q, r) in our_ids.iter().enumerate() {
        let want: HashSet<i64> = faiss_ids[q * a.k..(q + 1) * a.k].iter().copied().collect();
        same += r.iter().filter(|n| want.contains(&(n.id as i64))).count();
    }
    println!(
        "agreement with faiss top-{}: {:.5}",
        a.k,
        same as f64 / (a.nq * a.k) as f64
    );
}
