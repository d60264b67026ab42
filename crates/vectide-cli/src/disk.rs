//! `vectide disk-search`: the long-term index's beam search on a dataset,
//! read from the SSD with `O_DIRECT`.
//!
//! Builds `fresh-vamana` over the train rows (R, L, α from the registry's
//! defaults: the paper's 64, 75, 1.2), writes it as an LTI with `--pq-bytes`
//! codes (`docs/format-lti.md`), reopens it through `DirectFile`, optionally
//! caches the nodes nearest the start, and sweeps the search list `L` at
//! beam width `W` with 1 and 2 threads: recall@10, QPS, mean latency, mean
//! sectors read and hops per query. The JSON names the ISA, whether reads
//! bypassed the page cache, and the read path (io_uring or pread).

use crate::dataset;
use clap::Args;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;
use vectide_core::eval::recall_at_k;
use vectide_core::{Metric, VectorIndex};
use vectide_diskann::lti::{self, GraphSource, Lti, QueryStats, Scratch};
use vectide_storage::block::DirectFile;
use vectide_vamana::{FreshVamana, VamanaParams};

#[derive(Args, Debug)]
pub struct DiskSearchArgs {
    /// Dataset name (e.g. glove-6b-50-angular) or an ann-benchmarks HDF5 path.
    #[arg(long)]
    dataset: String,
    /// Directory for the index files (default: a temporary one under ./data).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Search list sizes to sweep.
    #[arg(
        long,
        default_value = "10,16,24,32,48,64,96,128",
        value_delimiter = ','
    )]
    l: Vec<usize>,
    /// Beam width: sectors read per hop.
    #[arg(long, default_value_t = 4)]
    w: usize,
    /// Search threads to measure.
    #[arg(long, default_value = "1,2", value_delimiter = ',')]
    threads: Vec<usize>,
    /// Bytes per PQ code.
    #[arg(long = "pq-bytes", default_value_t = 32)]
    pq_bytes: usize,
    /// RAM for the node cache near the start, in MiB (0: none).
    #[arg(long = "cache-mb", default_value_t = 0)]
    cache_mb: usize,
    /// Build threads.
    #[arg(long = "build-threads", default_value_t = 2)]
    build_threads: usize,
    /// Queries used (the first N).
    #[arg(long, default_value_t = 1000)]
    queries: usize,
    /// Output JSON file.
    #[arg(long)]
    out: Option<PathBuf>,
}

pub fn run(args: &DiskSearchArgs) -> Result<(), String> {
    if args.w == 0 || args.l.contains(&0) || args.threads.contains(&0) {
        return Err("--w, --l and --threads take values of at least 1".into());
    }
    let ds = dataset::load(&args.dataset)?;
    let metric = ds.metric()?;
    let dim = ds.dim;
    let n = ds.n_train();
    let nq = args.queries.min(ds.n_test());
    let k = 10;
    if ds.gt_k < k || nq == 0 {
        return Err("disk-search needs queries with 10 ground-truth neighbours".into());
    }
    let tmp;
    let dir = match &args.dir {
        Some(d) => {
            std::fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
            d.clone()
        }
        None => {
            std::fs::create_dir_all("data").map_err(|e| e.to_string())?;
            tmp = tempfile::Builder::new()
                .prefix("vectide-disk-search-")
                .tempdir_in("data")
                .map_err(|e| e.to_string())?;
            tmp.path().to_path_buf()
        }
    };
    let isa = vectide_core::distance::active_isa();
    eprintln!(
        "{}: {n} rows, {dim}-d, {nq} queries, simd {isa}; building fresh-vamana",
        ds.name
    );
    let params = VamanaParams {
        threads: Some(args.build_threads),
        ..VamanaParams::default()
    };
    let (r, l_build, alpha) = (params.r, params.l_build, params.alpha);
    let t0 = Instant::now();
    let v = FreshVamana::new(dim, metric, params).map_err(|e| e.to_string())?;
    let ids: Vec<u64> = (0..n as u64).collect();
    v.insert(1, &ids, &ds.train).map_err(|e| e.to_string())?;
    let build_s = t0.elapsed().as_secs_f64();
    let g = v.export_graph();
    drop(v);
    let start = g.start.ok_or("the dataset is empty")?;
    let lti_path = dir.join("lti.blk");
    let pq_path = dir.join("lti.pq");
    let site = vectide_core::sync::SyncSite("disk-search.lti");
    let t1 = Instant::now();
    {
        let f = DirectFile::open(&lti_path, true, site).map_err(|e| e.to_string())?;
        lti::write(
            &f,
            &pq_path,
            &GraphSource {
                start,
                ..GraphSource::from_export(&g)
            },
            args.pq_bytes,
            0,
        )
        .map_err(|e| e.to_string())?;
    }
    let write_s = t1.elapsed().as_secs_f64();
    drop(g);
    let file = DirectFile::open(&lti_path, false, site).map_err(|e| e.to_string())?;
    let (direct, read_path) = (file.direct(), file.read_path());
    let mut lti = Lti::open(Box::new(file), &pq_path).map_err(|e| e.to_string())?;
    let cached = lti
        .cache_near_start(args.cache_mb << 20)
        .map_err(|e| e.to_string())?;
    let file_bytes = std::fs::metadata(&lti_path).map(|m| m.len()).unwrap_or(0);
    eprintln!(
        "LTI written in {write_s:.1} s ({:.0} MB, O_DIRECT {direct}, reads via {read_path}); {cached} nodes cached; \
         RAM {:.1} MB ({:.1} B/vector)",
        file_bytes as f64 / 1e6,
        lti.memory_bytes() as f64 / 1e6,
        lti.memory_bytes() as f64 / n as f64
    );
    let mut queries = ds.test[..nq * dim].to_vec();
    if metric == Metric::Cosine {
        for q in queries.chunks_mut(dim) {
            let s = q.iter().map(|x| x * x).sum::<f32>().sqrt();
            if s > 0.0 {
                q.iter_mut().for_each(|x| *x /= s);
            }
        }
    }
    let truth: Vec<u64> = ds.neighbors[..nq * ds.gt_k]
        .chunks(ds.gt_k)
        .flat_map(|r| r[..k].iter().map(|&i| i as u64))
        .collect();
    let mut sweep = Vec::new();
    for &threads in &args.threads {
        for &l in &args.l {
            let found: Vec<std::sync::Mutex<Vec<u64>>> =
                (0..nq).map(|_| std::sync::Mutex::new(Vec::new())).collect();
            let next = AtomicUsize::new(0);
            let lti_ref = &lti;
            let t = Instant::now();
            let per_thread: Vec<Result<(QueryStats, f64), String>> = std::thread::scope(|s| {
                let handles: Vec<_> = (0..threads)
                    .map(|_| {
                        let (next, found, queries) = (&next, &found, &queries);
                        s.spawn(move || {
                            let mut scratch = Scratch::default();
                            let mut out = Vec::new();
                            let mut stats = QueryStats::default();
                            let mut lat = 0.0;
                            loop {
                                let i = next.fetch_add(1, Ordering::Relaxed);
                                if i >= nq {
                                    break;
                                }
                                let tq = Instant::now();
                                let st = lti_ref
                                    .search(
                                        &queries[i * dim..(i + 1) * dim],
                                        k,
                                        l,
                                        args.w,
                                        &|_, _| true,
                                        &mut scratch,
                                        &mut out,
                                    )
                                    .map_err(|e| e.to_string())?;
                                lat += tq.elapsed().as_secs_f64();
                                stats += st;
                                let mut ids: Vec<u64> = out.iter().map(|&(_, id)| id).collect();
                                ids.resize(k, vectide_core::RESERVED_ID);
                                *found[i].lock().expect("no panics hold it") = ids;
                            }
                            Ok((stats, lat))
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| {
                        h.join()
                            .unwrap_or_else(|_| Err("a search thread panicked".into()))
                    })
                    .collect()
            });
            let wall = t.elapsed().as_secs_f64();
            let mut stats = QueryStats::default();
            let mut lat = 0.0;
            for r in per_thread {
                let (s, l) = r?;
                stats += s;
                lat += l;
            }
            let flat: Vec<u64> = found
                .into_iter()
                .flat_map(|m| m.into_inner().expect("no panics"))
                .collect();
            let recall =
                recall_at_k(flat.chunks(k), truth.chunks(k), k).map_err(|e| e.to_string())?;
            let point = json!({
                "threads": threads, "L": l, "W": args.w,
                "recall": recall,
                "qps": nq as f64 / wall,
                "mean_latency_us": 1e6 * lat / nq as f64,
                "mean_sectors_read": stats.sectors_read as f64 / nq as f64,
                "mean_hops": stats.hops as f64 / nq as f64,
                "mean_expanded": stats.expanded as f64 / nq as f64,
                "mean_pq_distances": stats.pq_distances as f64 / nq as f64,
                "cache_hits_per_query": stats.cache_hits as f64 / nq as f64,
            });
            eprintln!("{point}");
            sweep.push(point);
        }
    }
    let doc: Value = json!({
        "benchmark": "disk-search",
        "dataset": ds.name,
        "n_train": n,
        "n_queries": nq,
        "dimension": dim,
        "simd": isa,
        "machine": vectide_harness::machine::machine_info(),
        "o_direct": direct,
        "read_path": read_path,
        "build": {"engine": vectide_vamana::DESCRIPTOR.name, "r": r, "l_build": l_build, "alpha": alpha,
                  "threads": args.build_threads, "build_s": build_s, "lti_write_s": write_s},
        "pq_bytes": args.pq_bytes,
        "lti_bytes": file_bytes,
        "ram_bytes": lti.memory_bytes(),
        "ram_bytes_per_vector": lti.memory_bytes() as f64 / n as f64,
        "cached_nodes": cached,
        "sweep": sweep,
    });
    let text = serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())?;
    match &args.out {
        Some(p) => std::fs::write(p, text).map_err(|e| format!("writing {}: {e}", p.display()))?,
        None => println!("{text}"),
    }
    Ok(())
}
