//! `vectide crash-test p-hnsw`: the crash simulator's points, then real
//! processes killed with SIGKILL while several writer threads upsert and
//! delete overlapping labels, on both media (`pmem`, `msync`).
//!
//! The counts default to the environment knobs `VECTIDE_CRASH_POINTS` and
//! `VECTIDE_KILL_ROUNDS` (200 and 20 when unset: the size `make test` runs;
//! the benchmark asks for 1,000 and 50). The kill rounds run once per media.

use clap::Args;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;
use vectide_phnsw::crashtest::{self, CrashTestConfig, KillChild, KillConfig, KillReport, SeqFrom};
use vectide_storage::PersistMode;

#[derive(Args, Debug)]
pub struct CrashArgs {
    /// The engine to test (only `p-hnsw` has a crash protocol of its own).
    pub engine: String,
    /// Simulator crash points (default: $VECTIDE_CRASH_POINTS or 200).
    #[arg(long)]
    pub points: Option<usize>,
    /// SIGKILL rounds of a real child process, per media (default:
    /// $VECTIDE_KILL_ROUNDS or 20).
    #[arg(long)]
    pub kill_rounds: Option<usize>,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Post-crash images per simulator point.
    #[arg(long, default_value_t = 1)]
    pub images: usize,
    #[command(flatten)]
    pub workload: Workload,
    /// Rounds of the concurrent-writer simulator (default:
    /// $VECTIDE_CONCURRENT_ROUNDS or 40).
    #[arg(long)]
    pub concurrent_rounds: Option<usize>,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Directory for the kill test's indexes (default: fresh ones under
    /// /dev/shm for pmem, the temp dir for msync).
    #[arg(long)]
    pub dir: Option<PathBuf>,
}

/// The kill test's writers (the parent passes them on to its child).
#[derive(Args, Debug)]
pub struct Workload {
    /// Writer threads of the kill test's child.
    #[arg(long, default_value_t = 3)]
    pub writers: usize,
    /// Labels the kill test's writers share.
    #[arg(long, default_value_t = 32)]
    pub labels: u64,
    /// Where the child numbers its operations from after an open: `durable`
    /// (its `durable_seq()`, as `vectide.Index` does) or `fresh` (above
    /// every number issued before).
    #[arg(long, default_value = "durable")]
    pub seq_from: String,
}

/// The hidden child of the kill test.
#[derive(Args, Debug)]
pub struct ChildArgs {
    #[arg(long)]
    pub dir: PathBuf,
    #[arg(long)]
    pub seed: u64,
    #[arg(long)]
    pub round: usize,
    #[arg(long, default_value_t = 0)]
    pub seq_floor: u64,
    /// Per writer, the label its first operation retries (`_`: none).
    #[arg(long, default_value = "_")]
    pub retry: String,
    #[arg(long, default_value = "pmem")]
    pub persist: String,
    #[command(flatten)]
    pub workload: Workload,
    /// Operations per writer (default: until killed).
    #[arg(long, default_value_t = u64::MAX)]
    pub limit: u64,
}

fn knob(name: &str, default: usize) -> Result<usize, String> {
    match std::env::var(name) {
        Ok(v) => v
            .trim()
            .parse()
            .map_err(|_| format!("{name} must be a number, got {v:?}")),
        Err(_) => Ok(default),
    }
}

fn seq_from(s: &str) -> Result<SeqFrom, String> {
    SeqFrom::parse(s).ok_or_else(|| format!("--seq-from must be durable or fresh, got {s:?}"))
}

pub fn child(args: &ChildArgs) -> Result<(), String> {
    let cfg = KillConfig {
        mode: PersistMode::parse(&args.persist).map_err(|e| e.to_string())?,
        threads: args.workload.writers,
        labels: args.workload.labels,
        seed: args.seed,
        seq_from: seq_from(&args.workload.seq_from)?,
    };
    let spec = KillChild {
        round: args.round,
        seq_floor: args.seq_floor,
        retry: KillChild::parse_retry(&args.retry),
    };
    crashtest::kill_child(&args.dir, &cfg, &spec, args.limit, std::io::stdout())
        .map_err(|e| e.to_string())
}

/// The kill rounds on one media.
fn kill_mode(dir: &Path, cfg: &KillConfig, rounds: usize) -> Result<(KillReport, f64), String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let command = |c: &KillChild| {
        let mut cmd = Command::new(&exe);
        cmd.args(["crash-child", "--dir"])
            .arg(dir)
            .args(["--seed", &cfg.seed.to_string()])
            .args(["--round", &c.round.to_string()])
            .args(["--seq-floor", &c.seq_floor.to_string()])
            .args(["--retry", &c.retry_arg()])
            .args(["--persist", cfg.mode.name()])
            .args(["--writers", &cfg.threads.to_string()])
            .args(["--labels", &cfg.labels.to_string()])
            .args(["--seq-from", cfg.seq_from.name()]);
        cmd
    };
    let bar = crate::progress(rounds as u64, &format!("kill {}", cfg.mode.name()));
    let t = Instant::now();
    let r = crashtest::kill_rounds(dir, cfg, rounds, &command, &|| bar.inc(1))
        .map_err(|e| e.to_string());
    bar.finish_and_clear();
    Ok((r?, t.elapsed().as_secs_f64()))
}

fn ms(micros: &[u64]) -> (f64, f64) {
    let mut v = micros.to_vec();
    v.sort_unstable();
    (
        v.get(v.len() / 2).map_or(0.0, |&u| u as f64 / 1000.0),
        v.last().map_or(0.0, |&u| u as f64 / 1000.0),
    )
}

/// The kill test's directory for one media (and whether we own it).
fn scratch_dir(arg: &Option<PathBuf>, mode: PersistMode) -> (PathBuf, bool) {
    if let Some(d) = arg {
        return (d.join(mode.name()), false);
    }
    // pmem is emulated on DRAM (/dev/shm, as the paper measured); msync
    // runs on an ordinary file system.
    let root = if mode == PersistMode::Pmem && Path::new("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    let d = root.join(format!(
        "vectide-kill-{}-{}",
        mode.name(),
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&d);
    (d, true)
}

pub fn run(args: &CrashArgs) -> Result<bool, String> {
    if args.engine != "p-hnsw" {
        return Err(format!(
            "crash-test knows the engine \"p-hnsw\" (the one with its own crash protocol), not {:?}",
            args.engine
        ));
    }
    let points = match args.points {
        Some(p) => p,
        None => knob("VECTIDE_CRASH_POINTS", 200)?,
    };
    let rounds = match args.kill_rounds {
        Some(k) => k,
        None => knob("VECTIDE_KILL_ROUNDS", 20)?,
    };
    let concurrent_rounds = match args.concurrent_rounds {
        Some(k) => k,
        None => knob("VECTIDE_CONCURRENT_ROUNDS", 40)?,
    };
    let seq_from = seq_from(&args.workload.seq_from)?;
    let t = Instant::now();
    let sim = crashtest::run(&CrashTestConfig {
        points,
        seed: args.seed,
        images_per_point: args.images.max(1),
        ..CrashTestConfig::default()
    })
    .map_err(|e| e.to_string())?;
    let sim_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let conc = crashtest::run_concurrent(&crashtest::ConcurrentConfig {
        rounds: concurrent_rounds,
        threads: args.workload.writers.max(1),
        seed: args.seed,
        seq_from,
        ..Default::default()
    })
    .map_err(|e| e.to_string())?;
    let conc_s = t.elapsed().as_secs_f64();
    let mut kills: Vec<(PersistMode, KillReport, f64)> = Vec::new();
    for mode in [PersistMode::Pmem, PersistMode::Msync] {
        let (dir, owned) = scratch_dir(&args.dir, mode);
        let cfg = KillConfig {
            mode,
            threads: args.workload.writers.max(1),
            labels: args.workload.labels.max(1),
            seed: args.seed,
            seq_from,
        };
        let r = kill_mode(&dir, &cfg, rounds);
        if owned {
            let _ = std::fs::remove_dir_all(&dir);
        }
        let (r, secs) = r?;
        kills.push((mode, r, secs));
    }
    let kill_violations: usize = kills.iter().map(|k| k.1.violations.len()).sum();
    let ok = sim.violating_points == 0 && conc.violations.is_empty() && kill_violations == 0;
    let all_opens: Vec<u64> = kills
        .iter()
        .flat_map(|k| k.1.open_micros.iter().copied())
        .collect();
    let (median_ms, max_ms) = ms(&all_opens);
    if args.json {
        let by_mode: serde_json::Map<String, serde_json::Value> = kills
            .iter()
            .map(|(mode, k, secs)| {
                let (med, max) = ms(&k.open_micros);
                (
                    mode.name().to_string(),
                    json!({
                        "rounds": k.rounds,
                        "acknowledged_ops": k.tally.acked,
                        "in_flight_ops": k.tally.in_flight,
                        "in_flight_applied": k.tally.in_flight_applied,
                        "max_in_flight": k.tally.max_in_flight,
                        "label_states_checked": k.tally.labels_checked,
                        "recoveries_with_work": k.recoveries_with_work,
                        "violations": k.violations,
                        "open_ms_median": med,
                        "open_ms_max": max,
                        "live_at_end": k.live,
                        "seconds": secs,
                    }),
                )
            })
            .collect();
        let sum = |f: &dyn Fn(&KillReport) -> usize| kills.iter().map(|k| f(&k.1)).sum::<usize>();
        let out = json!({
            "engine": "p-hnsw",
            "seed": args.seed,
            "simulator": {
                "points_checked": sim.points_checked,
                "violating_points": sim.violating_points,
                "violations": sim.violations,
                "by_operation": sim.by_operation,
                "by_pending_lines": sim.by_pending_lines,
                "by_site": sim.by_site,
                "recoveries_with_work": sim.recoveries_with_work,
                "fences": sim.fences,
                "operations": sim.operations,
                "reference_recall_min": sim.reference_recall_min,
                "worst_recall_drop": sim.worst_recall_drop,
                "seconds": sim_s,
            },
            "concurrent_simulator": {
                "writers": args.workload.writers.max(1),
                "seq_from": seq_from.name(),
                "rounds": conc.rounds,
                "acknowledged_ops": conc.tally.acked,
                "in_flight_ops": conc.tally.in_flight,
                "in_flight_applied": conc.tally.in_flight_applied,
                "max_in_flight": conc.tally.max_in_flight,
                "label_states_checked": conc.tally.labels_checked,
                "recoveries_with_work": conc.recoveries_with_work,
                "recovery_crashes": conc.recovery_crashes,
                "violating_rounds": conc.tally.violating_rounds,
                "violations": conc.violations,
                "seconds": conc_s,
            },
            "kill": {
                "writers": args.workload.writers.max(1),
                "labels": args.workload.labels.max(1),
                "seq_from": seq_from.name(),
                "rounds": sum(&|k| k.rounds),
                "acknowledged_ops": sum(&|k| k.tally.acked),
                "in_flight_ops": sum(&|k| k.tally.in_flight),
                "label_states_checked": sum(&|k| k.tally.labels_checked),
                "violations": kills.iter().flat_map(|k| k.1.violations.iter()).collect::<Vec<_>>(),
                "recoveries_with_work": sum(&|k| k.recoveries_with_work),
                "open_ms_median": median_ms,
                "open_ms_max": max_ms,
                "live_at_end": kills.last().map_or(0, |k| k.1.live),
                "seconds": kills.iter().map(|k| k.2).sum::<f64>(),
                "by_mode": by_mode,
            },
            "crash_points_checked": sim.points_checked,
            "violations": sim.violating_points + conc.violations.len() + kill_violations,
        });
        println!(
            "{}",
            serde_json::to_string_pretty(&out).map_err(|e| e.to_string())?
        );
    } else {
        println!(
            "simulator: {} crash points checked ({} fences over {} operations), {} with violations ({:.1}s)",
            sim.points_checked, sim.fences, sim.operations, sim.violating_points, sim_s
        );
        println!("  by operation: {:?}", sim.by_operation);
        println!("  by pending cache lines: {:?}", sim.by_pending_lines);
        println!(
            "  recall@10 of the uncrashed index >= {:.3}; worst drop after recovery {:.3}",
            sim.reference_recall_min, sim.worst_recall_drop
        );
        for v in &sim.violations {
            println!("  VIOLATION {v}");
        }
        println!(
            "concurrent simulator: {} writers, numbers from {}: {} rounds, {} acknowledged and {} in-flight operations ({} applied by recovery, at most {} at one crash), {} label states checked, {} crashes during recovery, {} violating rounds ({:.1}s)",
            args.workload.writers.max(1),
            seq_from.name(),
            conc.rounds,
            conc.tally.acked,
            conc.tally.in_flight,
            conc.tally.in_flight_applied,
            conc.tally.max_in_flight,
            conc.tally.labels_checked,
            conc.recovery_crashes,
            conc.tally.violating_rounds,
            conc_s
        );
        for v in &conc.violations {
            println!("  VIOLATION {v}");
        }
        for (mode, k, secs) in &kills {
            let (med, max) = ms(&k.open_micros);
            println!(
                "kill test ({}, {} writers on {} labels, numbers from {}): {} SIGKILL rounds, {} acknowledged and {} in-flight operations ({} applied), {} label states checked, {} recoveries with log work, open+recovery median {med:.2} ms (max {max:.2} ms), {} violations ({secs:.1}s)",
                mode.name(),
                args.workload.writers.max(1),
                args.workload.labels.max(1),
                seq_from.name(),
                k.rounds,
                k.tally.acked,
                k.tally.in_flight,
                k.tally.in_flight_applied,
                k.tally.labels_checked,
                k.recoveries_with_work,
                k.violations.len(),
            );
            for v in &k.violations {
                println!("  VIOLATION {v}");
            }
        }
    }
    Ok(ok)
}
