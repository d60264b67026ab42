//! `vectide`: the command-line front of Vectide.
//!
//! - `vectide bench` runs the ANN benchmark on the native engines only (the
//!   Python harness `python -m vectide.bench ann` adds the peers);
//! - `vectide inspect PATH` describes an index file (or index directory)
//!   after checking it;
//! - `vectide crash-test p-hnsw` runs the crash simulator and the SIGKILL
//!   test of the persistent engine;
//! - `vectide serve --data DIR` serves a database over HTTP;
//! - `vectide import --data DIR --collection NAME FILE` loads points;
//! - `vectide repair --data DIR` salvages a database whose WAL is damaged.

mod bench;
mod crash;
mod dataset;
mod db;

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

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
    /// Check an index file or directory and print its header and counts.
    Inspect {
        /// An index file written by `save`, or the directory of a durable
        /// engine (p-hnsw: regions and both logs; hnsw-snap / hnsw-wal).
        path: PathBuf,
        /// Print JSON instead of aligned text.
        #[arg(long)]
        json: bool,
    },
    /// Serve a database directory over HTTP (Qdrant-compatible REST subset).
    Serve(db::ServeArgs),
    /// Load points from .npy, .jsonl or a dataset (HDF5 `train`) into a collection.
    Import(db::ImportArgs),
    /// Salvage a database whose write-ahead log is damaged: keep the records
    /// before the damage, drop the rest, and print exactly what was dropped.
    Repair(db::RepairArgs),
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
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Bench(args) => bench::run(&args),
        Command::Inspect { path, json } => inspect(&path, json),
        Command::CrashTest(args) => match crash::run(&args) {
            Ok(true) => Ok(()),
            Ok(false) => return ExitCode::from(1),
            Err(e) => Err(e),
        },
        Command::CrashChild(args) => crash::child(&args),
        Command::OpenProbe { path, persist } => open_probe(&path, &persist),
        Command::Serve(args) => db::serve(&args),
        Command::Import(args) => db::import(&args),
        Command::Repair(args) => db::repair(&args),
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
        println!("{}", path.display());
        let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
        for (k, v) in rows {
            println!("  {k:<width$}  {v}");
        }
    }
    Ok(())
}

/// A progress bar on stderr (hidden when stderr is not a terminal).
pub(crate) fn progress(len: u64, what: &str) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(len);
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "{msg:>12} [{bar:30}] {pos}/{len} {elapsed_precise}",
    ) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(what.to_string());
    bar
}

/// `vectide open-probe`: open + first query, timed from `main`.
fn open_probe(path: &std::path::Path, persist: &str) -> Result<(), String> {
    use vectide_core::{SearchParams, VectorIndex};
    let t0 = std::time::Instant::now();
    let mode = vectide_storage::PersistMode::parse(persist).map_err(|e| e.to_string())?;
    let idx = if vectide_engines::engine_at(path) == Some("p-hnsw") {
        vectide_engines::AnyIndex::PHnsw(
            vectide_hnsw::phnsw::PHnsw::open(path, mode, None).map_err(|e| e.to_string())?,
        )
    } else {
        vectide_engines::load(path, None).map_err(|e| e.to_string())?
    };
    let opened = t0.elapsed();
    let q = vec![1.0f32; idx.dim()];
    let hits = idx
        .search(&q, 10, &SearchParams::default(), None)
        .map_err(|e| e.to_string())?;
    let answered = t0.elapsed();
    let recovery = idx.as_phnsw().map(|p| {
        let r = p.recovery_report();
        serde_json::json!({
            "lists_undone": r.lists_undone, "discarded": r.discarded,
            "redone_logged": r.redone_logged, "redone_complete": r.redone_complete,
            "deletes_redone": r.deletes_redone, "micros": r.micros,
        })
    });
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
