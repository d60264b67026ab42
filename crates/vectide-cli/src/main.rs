//! `vectide`: the command-line front of Vectide.
//!
//! - `vectide bench` runs the ANN benchmark on the native engines only (the
//!   Python harness `python -m vectide.bench ann` adds the peers);
//! - `vectide inspect PATH` describes an index file (or index directory)
//!   after checking it;
//! - `vectide runbook` runs a big-ann-benchmarks streaming runbook (YAML) on
//!   native engines (`python -m vectide.bench runbook` adds the peers);
//! - `vectide crash-test ENGINE|db:ENGINE` runs the crash kit (simulated
//!   crash states, SIGKILLs, the mutation check) on a durable engine or a
//!   database collection;
//! - `vectide serve --data DIR` serves a database over HTTP;
//! - `vectide memnode --listen ADDR --size BYTES` runs a memory node for
//!   d-HNSW (`vectide-remote`);
//! - `vectide import --data DIR --collection NAME FILE` loads points;
//! - `vectide repair --data DIR` salvages a database whose WAL is damaged;
//! - `vectide disk-search --dataset NAME` measures the long-term index's
//!   beam search from the SSD (O_DIRECT);
//! - `vectide pq-eval --dataset NAME` measures product quantization
//!   (`vectide-quant`) on a dataset: PQ-only recall, distance error, speed;
//!   `vectide rabitq-eval --dataset NAME` likewise RaBitQ codes (recall,
//!   estimate error, the error bound, fast-scan speed).

mod bench;
mod crash;
mod dataset;
mod db;
mod disk;
mod memnode;
mod quant;
mod rabitq_eval;
mod runbook;

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

// The product's allocator (see `vectide_core::trim`).
#[cfg(not(feature = "system-allocator"))]
#[global_allocator]
static GLOBAL: vectide_core::trim::ProductAllocator = vectide_core::trim::ProductAllocator;

#[derive(Parser)]
#[command(
    name = "vectide",
    version,
    about = "Vectide: a vector database for data that never stops changing"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Recall/QPS sweep of native engines on an ann-benchmarks dataset.
    Bench(bench::BenchArgs),
    /// Streaming runbook (big-ann-benchmarks YAML) on native engines:
    /// inserts, deletes, replaces and searches with recall over the active
    /// set; exits 2 when the runbook does not fit the dataset (nothing runs).
    Runbook(runbook::RunbookArgs),
    /// Product quantization on a dataset: PQ-only recall, distance error
    /// and lookup speed per code size (JSON).
    PqEval(quant::PqEvalArgs),
    /// RaBitQ codes on a dataset: code-only recall, estimate error, how
    /// often the error bound holds and what it prunes, fast-scan speed per
    /// number of bits (JSON).
    RabitqEval(rabitq_eval::RabitqEvalArgs),
    /// FreshDiskANN's long-term index on a dataset: build, write with
    /// O_DIRECT, and sweep the beam search (recall, QPS, sectors per query).
    DiskSearch(disk::DiskSearchArgs),
    /// List the registered engines with their parameters and search knobs.
    Engines {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Check an index file or directory and print its header and counts.
    Inspect {
        /// An index file written by `save`, or the directory of a durable
        /// engine (p-hnsw: regions and both logs; hnsw-snap / hnsw-wal).
        #[arg(required_unless_present = "memnode")]
        path: Option<PathBuf>,
        /// Print JSON instead of aligned text.
        #[arg(long)]
        json: bool,
        /// A d-hnsw region on a live memory node, HOST:PORT (with --region):
        /// partitions, fill, epochs, gaps.
        #[arg(long, requires = "region", conflicts_with = "path")]
        memnode: Option<String>,
        /// The region's name on the memory node.
        #[arg(long, requires = "memnode")]
        region: Option<String>,
        /// A memory node that does not answer within this many
        /// milliseconds is reported unavailable.
        #[arg(long, default_value_t = 10_000, requires = "memnode",
              value_parser = clap::value_parser!(u64).range(1..=600_000))]
        timeout_ms: u64,
    },
    /// Serve a database directory over HTTP (Qdrant-compatible REST subset).
    Serve(db::ServeArgs),
    /// Run a memory node for d-HNSW: named regions within --size bytes,
    /// served as one-sided verbs over TCP (docs/protocol-memnode.md).
    Memnode(memnode::MemnodeArgs),
    /// Load points from .npy, .jsonl or a dataset (HDF5 `train`) into a collection.
    Import(db::ImportArgs),
    /// Salvage a database whose write-ahead log is damaged: keep the records
    /// before the damage, drop the rest, and print exactly what was dropped.
    Repair(db::RepairArgs),
    /// Run every collection's pending maintenance (merges, consolidation)
    /// with a progress bar.
    Maintain(db::MaintainArgs),
    /// Crash-consistency test: simulator crash points, then SIGKILLed
    /// processes; exits 1 on any violation.
    CrashTest(crash::CrashArgs),
    /// (internal) The child process of the SIGKILL test.
    #[command(hide = true)]
    CrashChild(crash::ChildArgs),
    /// Opens (recovers) an index and answers one query; prints the timings
    /// as JSON (the recovery benchmark runs it in a fresh process).
    OpenProbe {
        /// An index file or the directory of a durable engine.
        path: PathBuf,
        /// p-hnsw media: pmem or msync.
        #[arg(long, default_value = "pmem")]
        persist: String,
        /// After the open, run the engine's full check (`check_structure`:
        /// for p-hnsw, every node's checksum too); a violation is an error.
        #[arg(long)]
        verify: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Bench(args) => bench::run(&args),
        Command::Runbook(args) => match runbook::run(&args) {
            Ok(()) => Ok(()),
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::from(e.exit_code());
            }
        },
        Command::PqEval(args) => quant::run(&args),
        Command::RabitqEval(args) => rabitq_eval::run(&args),
        Command::DiskSearch(args) => disk::run(&args),
        Command::Engines { json } => engines(json),
        Command::Inspect {
            path,
            json,
            memnode,
            region,
            timeout_ms,
        } => match (path, memnode, region) {
            (_, Some(addr), Some(region)) => {
                vectide_dhnsw::persist::inspect_region(&addr, &region, timeout_ms)
                    .map_err(|e| e.to_string())
                    .map(|rows| print_rows(&format!("{addr} {region}"), rows, json))
            }
            (Some(path), _, _) => inspect(&path, json),
            _ => Err("inspect: give a path, or --memnode and --region".to_string()),
        },
        Command::CrashTest(args) => match crash::run(&args) {
            Ok(true) => Ok(()),
            Ok(false) => return ExitCode::from(1),
            Err(e) => Err(e),
        },
        Command::CrashChild(args) => crash::child(&args),
        Command::OpenProbe {
            path,
            persist,
            verify,
        } => open_probe(&path, &persist, verify),
        Command::Serve(args) => db::serve(&args),
        Command::Memnode(args) => memnode::run(&args).map_err(|e| e.to_string()),
        Command::Import(args) => db::import(&args),
        Command::Repair(args) => db::repair(&args),
        Command::Maintain(args) => db::maintain(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
    }
}

fn inspect(path: &std::path::Path, json: bool) -> Result<(), String> {
    let rows = if path.join("catalog.json").is_file() {
        vectide_db::inspect(path).map_err(|e| e.to_string())?
    } else {
        vectide_engines::inspect(path).map_err(|e| e.to_string())?
    };
    print_rows(&path.display().to_string(), rows, json);
    Ok(())
}

/// Prints `(field, value)` rows as aligned text under `title`, or as one
/// JSON object (numbers where a value is one).
fn print_rows(title: &str, rows: Vec<(String, String)>, json: bool) {
    if json {
        let map: serde_json::Map<String, serde_json::Value> = rows
            .into_iter()
            .map(|(k, v)| {
                let value = v
                    .parse::<u64>()
                    .map(serde_json::Value::from)
                    .unwrap_or(serde_json::Value::String(v));
                (k, value)
            })
            .collect();
        println!("{}", serde_json::Value::Object(map));
    } else {
        println!("{title}");
        let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
        for (k, v) in rows {
            println!("  {k:<width$}  {v}");
        }
    }
}

pub(crate) use vectide_harness::machine::progress;

/// `vectide engines`: the registry, engine by engine.
fn engines(json: bool) -> Result<(), String> {
    use serde_json::json;
    let all: Vec<serde_json::Value> = vectide_engines::REGISTRY
        .iter()
        .map(|d| {
            json!({
                "name": d.name,
                "summary": d.summary,
                "persistence": d.persistence.name(),
                "medium": d.medium.name(),
                "knobs": d.knobs.iter().map(|k| k.name()).collect::<Vec<_>>(),
                "primary_knob": d.primary_knob.map(|k| k.name()),
                "params": d.params.iter().map(|p| json!({
                    "name": p.name, "type": p.kind.to_string(), "default": p.default,
                    "doc": p.doc, "source": p.source,
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    if json {
        println!("{}", serde_json::Value::Array(all));
        return Ok(());
    }
    for d in vectide_engines::REGISTRY {
        let knobs: Vec<&str> = d.knobs.iter().map(|k| k.name()).collect();
        println!("{} — {}", d.name, d.summary);
        println!(
            "  persistence: {}; medium: {}; search knobs: {}",
            d.persistence,
            d.medium,
            if knobs.is_empty() {
                "none (exact)".to_string()
            } else {
                knobs.join(", ")
            }
        );
        for p in d.params {
            println!(
                "  {:<22} {:<28} default {:<10} {} [{}]",
                p.name,
                p.kind.to_string(),
                if p.default.is_empty() { "-" } else { p.default },
                p.doc,
                p.source
            );
        }
        println!();
    }
    Ok(())
}

/// `vectide open-probe`: open + first query, timed from `main`; with
/// `verify`, then the engine's full check.
fn open_probe(path: &std::path::Path, persist: &str, verify: bool) -> Result<(), String> {
    use vectide_core::SearchParams;
    let t0 = std::time::Instant::now();
    let found = vectide_engines::engine_at(path).map_err(|e| e.to_string())?;
    // Engines with a `persist` parameter open on the media asked for.
    let mut params = vectide_engines::Params::new();
    if found.is_some_and(|d| d.open_params.contains(&"persist")) {
        params.insert(
            "persist".into(),
            vectide_engines::ParamValue::Str(persist.to_string()),
        );
    }
    let idx = vectide_engines::open(path, &params).map_err(|e| e.to_string())?;
    let opened = t0.elapsed();
    let q = vec![1.0f32; idx.dim()];
    let hits = idx
        .search(&q, 10, &SearchParams::default(), None)
        .map_err(|e| e.to_string())?;
    let answered = t0.elapsed();
    // What recovery did, for engines that report it (`recovery.*` figures).
    let stats = idx.stats().map_err(|e| e.to_string())?;
    let recovery: serde_json::Map<String, serde_json::Value> = stats
        .extra
        .iter()
        .filter_map(|(k, v)| {
            Some((
                k.strip_prefix("recovery.")?.to_string(),
                serde_json::json!(*v as u64),
            ))
        })
        .collect();
    let recovery = (!recovery.is_empty()).then_some(recovery);
    if verify {
        let problems = idx.check_structure().map_err(|e| e.to_string())?;
        if !problems.is_empty() {
            return Err(format!(
                "the check found {} problems: {}",
                problems.len(),
                problems.join("; ")
            ));
        }
    }
    println!(
        "{}",
        serde_json::json!({
            "engine": idx.engine(),
            "len": idx.len(),
            "hits": hits.len(),
            "open_ms": opened.as_secs_f64() * 1e3,
            "first_answer_ms": answered.as_secs_f64() * 1e3,
            "recovery": recovery,
        })
    );
    use std::io::Write;
    std::io::stdout().flush().map_err(|e| e.to_string())?;
    Ok(())
}
