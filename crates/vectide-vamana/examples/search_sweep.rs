//! A search-only sweep for profiling `fresh-vamana`'s query path: builds the
//! index of a dataset's sidecar directory (`python -m vectide.datasets
//! export NAME` writes it) once, saves it next to the sidecars, and on later
//! runs loads it and times single queries from one thread at each `L`.
//!
//! ```sh
//! cargo run --release -p vectide-vamana --example search_sweep -- \
//!     data/glove-6b-50-angular.vbin [L,L,...] [runs]
//! ```
//!
//! Prints recall@10, queries/s and distance computations per query for
//! each `L`; the harnesses (`vectide bench`, `python -m vectide.bench ann`)
//! are the measurements of record, this is the loop to run under `perf`.

use std::path::Path;
use std::time::Instant;
use vectide_core::io::Matrix;
use vectide_core::{Metric, SearchParams, VectorIndex};
use vectide_vamana::{FreshVamana, VamanaParams};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let dir = Path::new(
        args.get(1)
            .expect("usage: search_sweep DIR.vbin [L,..] [runs]"),
    );
    let ls: Vec<usize> = args
        .get(2)
        .map(|s| s.split(',').map(|x| x.parse().unwrap()).collect())
        .unwrap_or_else(|| vec![16, 24, 32, 48, 64, 96, 128]);
    let runs: usize = args.get(3).map(|s| s.parse().unwrap()).unwrap_or(3);
    let read = |name: &str| Matrix::read(&dir.join(name)).unwrap_or_else(|e| panic!("{e}"));
    let (train, test, gt) = (
        read("train.fbin"),
        read("test.fbin"),
        read("neighbors.ibin"),
    );
    let (n, dim, nq, kgt) = (train.rows, train.cols, test.rows, gt.cols);
    let (train, test, gt) = (train.f32s(), test.f32s(), gt.i32s());
    let meta = std::fs::read_to_string(dir.join("meta.json")).unwrap();
    let metric = if meta.contains("angular") {
        Metric::Cosine
    } else {
        Metric::L2
    };
    let saved = dir.join("fresh-vamana.index");
    let index = if saved.exists() {
        FreshVamana::load(&saved, Some(1)).unwrap()
    } else {
        let params = VamanaParams {
            threads: Some(std::thread::available_parallelism().map_or(1, |n| n.get())),
            ..VamanaParams::default()
        };
        let index = FreshVamana::new(dim, metric, params).unwrap();
        let ids: Vec<u64> = (0..n as u64).collect();
        let t = Instant::now();
        index.insert(1, &ids, &train).unwrap();
        eprintln!("built {n} points in {:.1} s", t.elapsed().as_secs_f64());
        index.save(&saved).unwrap();
        index
    };
    let k = 10;
    let mut out = Vec::new();
    println!("simd {}", vectide_core::distance::active_isa());
    for &l in &ls {
        let params = SearchParams::with_ef(l);
        let mut best = f64::MAX;
        let mut hits = 0usize;
        for _ in 0..runs {
            hits = 0;
            let t = Instant::now();
            for q in 0..nq {
                index
                    .search_into(&test[q * dim..(q + 1) * dim], k, &params, None, &mut out)
                    .unwrap();
                let truth = &gt[q * kgt..q * kgt + k];
                hits += out
                    .iter()
                    .filter(|h| truth.contains(&(h.id as i32)))
                    .count();
            }
            best = best.min(t.elapsed().as_secs_f64());
        }
        println!(
            "L {l:4}  recall@10 {:.4}  QPS {:8.0}",
            hits as f64 / (nq * k) as f64,
            nq as f64 / best
        );
    }
}
