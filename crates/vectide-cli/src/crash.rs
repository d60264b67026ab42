//! `vectide crash-test p-hnsw`: the crash simulator's points, then real
//! processes killed with SIGKILL in the middle of their inserts.
//!
//! The counts default to the environment knobs `VECTIDE_CRASH_POINTS` and
//! `VECTIDE_KILL_ROUNDS` (200 and 20 when unset: the size `make test` runs;
//! the benchmark asks for 1,000 and 50).

use clap::Args;
use serde_json::json;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use vectide_hnsw::phnsw::crashtest::{self, CrashTestConfig, Model};

#[derive(Args, Debug)]
pub struct CrashArgs {
    /// The engine to test (only `p-hnsw` has a crash protocol of its own).
    pub engine: String,
    /// Simulator crash points (default: $VECTIDE_CRASH_POINTS or 200).
    #[arg(long)]
    pub points: Option<usize>,
    /// SIGKILL rounds of a real child process (default: $VECTIDE_KILL_ROUNDS or 20).
    #[arg(long)]
    pub kill_rounds: Option<usize>,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Post-crash images per simulator point.
    #[arg(long, default_value_t = 1)]
    pub images: usize,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Directory for the kill test's index (default: a fresh one under
    /// /dev/shm, or the temp dir).
    #[arg(long)]
    pub dir: Option<PathBuf>,
}

/// The hidden child of the kill test.
#[derive(Args, Debug)]
pub struct ChildArgs {
    #[arg(long)]
    pub dir: PathBuf,
    #[arg(long)]
    pub seed: u64,
    #[arg(long)]
    pub start: u64,
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

pub fn child(args: &ChildArgs) -> Result<(), String> {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    crashtest::kill_child(&args.dir, args.seed, args.start, args.limit, &mut out)
        .map_err(|e| e.to_string())
}

fn splitmix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Result of the kill rounds.
struct KillReport {
    rounds: usize,
    acked: u64,
    violations: Vec<String>,
    open_micros: Vec<u64>,
    recoveries_with_work: usize,
    live: usize,
}

fn kill_rounds(dir: &Path, rounds: usize, seed: u64) -> Result<KillReport, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut model = Model::new();
    let mut next = 0u64;
    let mut rep = KillReport {
        rounds: 0,
        acked: 0,
        violations: Vec::new(),
        open_micros: Vec::new(),
        recoveries_with_work: 0,
        live: 0,
    };
    let bar = crate::progress(rounds as u64, "kill rounds");
    for r in 0..rounds {
        let mut child = Command::new(&exe)
            .args(["crash-child", "--dir"])
            .arg(dir)
            .args(["--seed", &seed.to_string(), "--start", &next.to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start the child: {e}"))?;
        let stdout = child.stdout.take().expect("piped");
        let reader = std::thread::spawn(move || {
            let mut last: Option<u64> = None;
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(i) = line.strip_prefix("ack ").and_then(|x| x.parse().ok()) {
                    last = Some(i);
                }
            }
            last
        });
        // Kill at a random moment: 20-250 ms after start (the child opens or
        // creates the index first, then inserts continuously).
        let wait = 20 + splitmix(seed ^ (r as u64) << 20) % 230;
        std::thread::sleep(Duration::from_millis(wait));
        let _ = child.kill(); // SIGKILL on Unix
        let status = child.wait().map_err(|e| e.to_string())?;
        let last = reader
            .join()
            .map_err(|_| "reader thread panicked".to_string())?;
        if status.success() {
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                use std::io::Read;
                let _ = e.read_to_string(&mut err);
            }
            return Err(format!("the child exited before it was killed: {err}"));
        }
        for i in next..last.map_or(next, |l| l + 1) {
            crashtest::kill_apply(&mut model, seed, i);
        }
        if let Some(l) = last {
            rep.acked += l + 1 - next;
            next = l + 1;
        }
        rep.rounds += 1;
        if !vectide_hnsw::phnsw::PHnsw::exists(dir) {
            // Killed before the index existed: nothing was acknowledged.
            if last.is_some() {
                rep.violations.push(format!(
                    "round {r}: operations acknowledged but no index on disk"
                ));
            }
            bar.inc(1);
            continue;
        }
        match crashtest::kill_check(dir, seed, &mut model, next) {
            Ok(kc) => {
                rep.open_micros.push(kc.open_micros);
                if kc.recovery != Default::default() {
                    rep.recoveries_with_work += 1;
                }
                rep.live = kc.live;
                for v in kc.violations.into_iter().take(3) {
                    rep.violations
                        .push(format!("round {r} (after op {next}): {v}"));
                }
            }
            Err(e) => rep
                .violations
                .push(format!("round {r}: recovery failed: {e}")),
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    Ok(rep)
}

fn scratch_dir(arg: &Option<PathBuf>) -> Result<(PathBuf, bool), String> {
    if let Some(d) = arg {
        return Ok((d.clone(), false));
    }
    let root = if Path::new("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    let d = root.join(format!("vectide-kill-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    Ok((d, true))
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
    let t = Instant::now();
    let sim = crashtest::run(&CrashTestConfig {
        points,
        seed: args.seed,
        images_per_point: args.images.max(1),
        ..CrashTestConfig::default()
    })
    .map_err(|e| e.to_string())?;
    let sim_s = t.elapsed().as_secs_f64();
    let (dir, owned) = scratch_dir(&args.dir)?;
    let t = Instant::now();
    let kill = kill_rounds(&dir, rounds, args.seed);
    if owned {
        let _ = std::fs::remove_dir_all(&dir);
    }
    let kill = kill?;
    let kill_s = t.elapsed().as_secs_f64();
    let mut opens = kill.open_micros.clone();
    opens.sort_unstable();
    let median_ms = opens
        .get(opens.len() / 2)
        .map_or(0.0, |&u| u as f64 / 1000.0);
    let max_ms = opens.last().map_or(0.0, |&u| u as f64 / 1000.0);
    let ok = sim.violating_points == 0 && kill.violations.is_empty();
    if args.json {
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
            "kill": {
                "rounds": kill.rounds,
                "acknowledged_ops": kill.acked,
                "violations": kill.violations,
                "recoveries_with_work": kill.recoveries_with_work,
                "open_ms_median": median_ms,
                "open_ms_max": max_ms,
                "live_at_end": kill.live,
                "seconds": kill_s,
            },
            "crash_points_checked": sim.points_checked,
            "violations": sim.violating_points + kill.violations.len(),
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
            "kill test: {} SIGKILL rounds, {} acknowledged operations, {} recoveries with log work, open+recovery median {:.2} ms (max {:.2} ms), {} violations ({:.1}s)",
            kill.rounds,
            kill.acked,
            kill.recoveries_with_work,
            median_ms,
            max_ms,
            kill.violations.len(),
            kill_s
        );
        for v in &kill.violations {
            println!("  VIOLATION {v}");
        }
    }
    Ok(ok)
}
