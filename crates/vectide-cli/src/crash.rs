//! `vectide crash-test TARGET`: the crash kit (`vectide-crashkit`) on any
//! durable engine of the registry, or on a database collection of any
//! engine (`db:ENGINE`): simulated crash states of concurrent writers at
//! every kind of sync and persist point, then real processes killed with
//! SIGKILL; `--mutation` adds the mutation check (every persistence site
//! switched off in turn must be caught).
//!
//! The counts default to the environment knobs `VECTIDE_CRASH_POINTS` and
//! `VECTIDE_KILL_ROUNDS` (100 and 20 when unset: the size `make test` runs).

use clap::Args;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;
use vectide_core::{ParamValue, Params};
use vectide_crashkit::kill::{self, KillChild, KillConfig, KillReport};
use vectide_crashkit::sim::{self, SimConfigKit, SimReport};
use vectide_crashkit::{SeqFrom, Target};

#[derive(Args, Debug)]
pub struct CrashArgs {
    /// What to crash: a durable engine (`vectide engines` marks them) or
    /// `db:ENGINE`, a database collection of any engine.
    pub target: String,
    /// An engine parameter, `NAME=VALUE` (repeatable), e.g. `persist=msync`.
    #[arg(long = "param", value_name = "NAME=VALUE")]
    pub params: Vec<String>,
    /// Simulated crash points: rounds of the simulator, each ending in one
    /// crash (default: $VECTIDE_CRASH_POINTS or 100).
    #[arg(long)]
    pub points: Option<usize>,
    /// SIGKILL rounds of a real child process (default:
    /// $VECTIDE_KILL_ROUNDS or 20).
    #[arg(long)]
    pub kill_rounds: Option<usize>,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    #[command(flatten)]
    pub workload: Workload,
    /// Also run the mutation check: the simulator once per persistence site
    /// the target uses, with that site switched off (`--mutation-points`
    /// rounds each); a site whose loss goes unnoticed is a failure.
    #[arg(long)]
    pub mutation: bool,
    #[arg(long, default_value_t = 40)]
    pub mutation_points: usize,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Directory for the indexes (default: /dev/shm when present, else the
    /// temp dir).
    #[arg(long)]
    pub dir: Option<PathBuf>,
}

/// The writers (the parent passes them on to its child).
#[derive(Args, Debug)]
pub struct Workload {
    /// Writer threads.
    #[arg(long, default_value_t = 3)]
    pub writers: usize,
    /// Labels the writers share.
    #[arg(long, default_value_t = 32)]
    pub labels: u64,
    /// Where writers number their operations from after an open: `durable`
    /// (the target's `durable_seq()`, as `vectide.Index` does) or `fresh`
    /// (above every number issued before).
    #[arg(long, default_value = "durable")]
    pub seq_from: String,
}

/// The hidden child of the kill test.
#[derive(Args, Debug)]
pub struct ChildArgs {
    #[arg(long)]
    pub target: String,
    #[arg(long = "param")]
    pub params: Vec<String>,
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

fn target(spec: &str, params: &[String]) -> Result<Target, String> {
    let mut p = Params::new();
    for kv in params {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| format!("--param takes NAME=VALUE, got {kv:?}"))?;
        p.insert(k.trim().to_string(), ParamValue::parse(v.trim()));
    }
    Target::parse(spec, p).map_err(|e| e.to_string())
}

fn kill_config(t: Target, w: &Workload, seed: u64) -> Result<KillConfig, String> {
    Ok(KillConfig {
        target: t,
        threads: w.writers.max(1),
        labels: w.labels.max(8),
        seed,
        seq_from: seq_from(&w.seq_from)?,
    })
}

pub fn child(args: &ChildArgs) -> Result<(), String> {
    let cfg = kill_config(
        target(&args.target, &args.params)?,
        &args.workload,
        args.seed,
    )?;
    let spec = KillChild {
        round: args.round,
        seq_floor: args.seq_floor,
        retry: KillChild::parse_retry(&args.retry),
    };
    kill::kill_child(&args.dir, &cfg, &spec, args.limit, std::io::stdout())
        .map_err(|e| e.to_string())
}

fn kill_test(
    dir: &Path,
    args: &CrashArgs,
    cfg: &KillConfig,
    rounds: usize,
) -> Result<(KillReport, f64), String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let command = |c: &KillChild| {
        let mut cmd = Command::new(&exe);
        cmd.args(["crash-child", "--target", &args.target, "--dir"])
            .arg(dir)
            .args(["--seed", &cfg.seed.to_string()])
            .args(["--round", &c.round.to_string()])
            .args(["--seq-floor", &c.seq_floor.to_string()])
            .args(["--retry", &c.retry_arg()])
            .args(["--writers", &cfg.threads.to_string()])
            .args(["--labels", &cfg.labels.to_string()])
            .args(["--seq-from", cfg.seq_from.name()]);
        for p in &args.params {
            cmd.args(["--param", p]);
        }
        cmd
    };
    let bar = crate::progress(rounds as u64, &format!("kill {}", args.target));
    let t = Instant::now();
    let r =
        kill::kill_rounds(dir, cfg, rounds, &command, &|| bar.inc(1)).map_err(|e| e.to_string());
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

fn sim_json(r: &SimReport, secs: f64) -> Value {
    json!({
        "rounds": r.rounds,
        "crashes_at_sync_point": r.crashes_at_sync,
        "crashes_at_fence": r.crashes_at_fence,
        "recovery_crashes": r.recovery_crashes,
        "acknowledged_ops": r.tally.acked,
        "in_flight_ops": r.tally.in_flight,
        "in_flight_applied": r.tally.in_flight_applied,
        "max_in_flight": r.tally.max_in_flight,
        "label_states_checked": r.tally.labels_checked,
        "recoveries_with_work": r.recoveries_with_work,
        "violating_rounds": r.tally.violating_rounds,
        "sites": r.sites.iter().map(|(k, n)| (k.name(), json!(n))).collect::<serde_json::Map<_, _>>(),
        "violations": r.violations,
        "seconds": secs,
    })
}

pub fn run(args: &CrashArgs) -> Result<bool, String> {
    let t0 = target(&args.target, &args.params)?;
    let points = match args.points {
        Some(p) => p,
        None => knob("VECTIDE_CRASH_POINTS", 100)?,
    };
    let rounds = match args.kill_rounds {
        Some(k) => k,
        None => knob("VECTIDE_KILL_ROUNDS", 20)?,
    };
    let kcfg = kill_config(t0.clone(), &args.workload, args.seed)?;
    let scfg = SimConfigKit {
        rounds: points,
        threads: kcfg.threads,
        labels: kcfg.labels.max(8),
        seed: args.seed,
        seq_from: kcfg.seq_from,
        scratch_dir: args.dir.clone(),
        ..SimConfigKit::new(t0)
    };
    let bar = crate::progress(
        1,
        &format!("simulator {} ({points} crash points)", args.target),
    );
    let t = Instant::now();
    let simr = sim::run(&scfg).map_err(|e| e.to_string())?;
    let sim_s = t.elapsed().as_secs_f64();
    bar.finish_and_clear();
    let mut mutations = Vec::new();
    if args.mutation {
        let bar = crate::progress(1, &format!("mutation check {}", args.target));
        let (_, m) = sim::mutation_check(&SimConfigKit {
            rounds: args.mutation_points,
            ..scfg.clone()
        })
        .map_err(|e| e.to_string())?;
        bar.finish_and_clear();
        mutations = m;
    }
    let undetected: Vec<String> = mutations
        .iter()
        .filter(|m| m.violating_rounds == 0)
        .map(|m| m.site.name())
        .collect();
    // The report is printed at the end; a line now keeps the simulator's
    // outcome if the kill rounds cannot run (a binary replaced under them).
    eprintln!(
        "{}: simulator done: {} crash points, {} violations ({sim_s:.0}s); mutation check: {}",
        args.target,
        simr.rounds,
        simr.violations.len(),
        if args.mutation {
            format!("{} sites, undetected {undetected:?}", mutations.len())
        } else {
            "not run".to_string()
        },
    );
    let root = vectide_crashkit::scratch_root(args.dir.as_deref());
    let kdir = root.join(format!("vectide-kill-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&kdir);
    let kr = kill_test(&kdir, args, &kcfg, rounds);
    let _ = std::fs::remove_dir_all(&kdir);
    let (kr, kill_s) = kr?;
    let violations = simr.violations.len() + kr.violations.len();
    let ok = violations == 0 && undetected.is_empty();
    let (median_ms, max_ms) = ms(&kr.open_micros);
    if args.json {
        let out = json!({
            "target": args.target,
            "params": args.params,
            "seed": args.seed,
            "writers": kcfg.threads,
            "labels": kcfg.labels,
            "seq_from": kcfg.seq_from.name(),
            "simulator": sim_json(&simr, sim_s),
            "mutation": mutations.iter().map(|m| json!({
                "site": m.site.name(),
                "calls": m.calls,
                "violating_rounds": m.violating_rounds,
                "detected": m.violating_rounds > 0,
                "first_violation": m.first_violation,
            })).collect::<Vec<_>>(),
            "mutation_undetected": undetected,
            "kill": {
                "rounds": kr.rounds,
                "acknowledged_ops": kr.tally.acked,
                "in_flight_ops": kr.tally.in_flight,
                "in_flight_applied": kr.tally.in_flight_applied,
                "max_in_flight": kr.tally.max_in_flight,
                "label_states_checked": kr.tally.labels_checked,
                "recoveries_with_work": kr.recoveries_with_work,
                "open_ms_median": median_ms,
                "open_ms_max": max_ms,
                "live_at_end": kr.live,
                "violations": kr.violations,
                "seconds": kill_s,
            },
            "crash_points_checked": simr.rounds,
            "violations": violations,
        });
        println!(
            "{}",
            serde_json::to_string_pretty(&out).map_err(|e| e.to_string())?
        );
    } else {
        println!(
            "simulator ({}, {} writers, numbers from {}): {} crash points ({} at a sync point, {} at a fence, {} more during recovery), {} acknowledged and {} in-flight operations ({} applied by recovery, at most {} at one crash), {} label states checked, {} violating rounds ({sim_s:.1}s)",
            args.target,
            kcfg.threads,
            kcfg.seq_from.name(),
            simr.rounds,
            simr.crashes_at_sync,
            simr.crashes_at_fence,
            simr.recovery_crashes,
            simr.tally.acked,
            simr.tally.in_flight,
            simr.tally.in_flight_applied,
            simr.tally.max_in_flight,
            simr.tally.labels_checked,
            simr.tally.violating_rounds,
        );
        for v in &simr.violations {
            println!("  VIOLATION {v}");
        }
        for m in &mutations {
            println!(
                "mutation {}: {} calls; switched off: {} violating rounds{}",
                m.site.name(),
                m.calls,
                m.violating_rounds,
                if m.violating_rounds == 0 {
                    "  NOT DETECTED"
                } else {
                    ""
                }
            );
        }
        println!(
            "kill test ({}): {} SIGKILL rounds, {} acknowledged and {} in-flight operations ({} applied), {} label states checked, {} recoveries with log work, open+recovery median {median_ms:.2} ms (max {max_ms:.2} ms), {} violations ({kill_s:.1}s)",
            args.target,
            kr.rounds,
            kr.tally.acked,
            kr.tally.in_flight,
            kr.tally.in_flight_applied,
            kr.tally.labels_checked,
            kr.recoveries_with_work,
            kr.violations.len(),
        );
        for v in &kr.violations {
            println!("  VIOLATION {v}");
        }
    }
    Ok(ok)
}
