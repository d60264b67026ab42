//! P-HNSW with several writers of overlapping labels, crashed and recovered
//! round after round, every label checked against the acknowledged history:
//! on the crash simulator (power-loss images, several operations in flight,
//! crashes during recovery), and in real child processes killed with SIGKILL
//! on both media (`pmem`, `msync`).
//!
//! Sizes: `VECTIDE_CONCURRENT_ROUNDS` (simulator rounds, default 40) and
//! `VECTIDE_KILL_ROUNDS` (SIGKILL rounds per media, default 10);
//! `VECTIDE_CRASH_SEED` shifts the seeds.

use std::path::PathBuf;
use std::process::Command;
use vectide_phnsw::crashtest::{
    kill_child, kill_rounds, run_concurrent, ConcurrentConfig, KillChild, KillConfig, SeqFrom,
};
use vectide_storage::PersistMode;

fn knob(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn simulator(seq_from: SeqFrom, seed: u64) {
    let rounds = knob("VECTIDE_CONCURRENT_ROUNDS", 40);
    let seed = seed + knob("VECTIDE_CRASH_SEED", 0) as u64;
    let r = run_concurrent(&ConcurrentConfig {
        rounds,
        seed,
        seq_from,
        ..ConcurrentConfig::default()
    })
    .unwrap();
    println!("{r:#?}");
    assert_eq!(r.tally.violating_rounds, 0, "{:#?}", r.violations);
    assert!(r.violations.is_empty(), "{:#?}", r.violations);
    assert_eq!(r.rounds, rounds);
    assert!(
        r.tally.max_in_flight >= 2,
        "crashes with several operations in flight"
    );
    assert!(r.tally.in_flight_applied > 0 && r.tally.in_flight_applied < r.tally.in_flight);
    assert!(r.recovery_crashes > 0 || rounds < 10);
}

/// Numbers counted from `durable_seq()` after every open, as `vectide.Index`
/// does: operations in effect above the watermark must not make a later
/// operation look like a replay.
#[test]
fn concurrent_writers_recover_exactly_numbered_from_durable_seq() {
    simulator(SeqFrom::Durable, 7);
}

/// Numbers never reused: the log protocol alone.
#[test]
fn concurrent_writers_recover_exactly_with_fresh_numbers() {
    simulator(SeqFrom::Fresh, 8);
}

// ---- SIGKILL: this test binary re-executes itself as the child ----

const CHILD_ENV: &str = "VECTIDE_TEST_KILL_CHILD";

fn mode_of(s: &str) -> PersistMode {
    PersistMode::parse(s).unwrap()
}

/// The child: runs only when the parent test started this binary with
/// `CHILD_ENV` set (`dir|mode|seq_from|round|seq_floor|seed|retry`); never returns.
#[test]
fn kill_child_entry() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let f: Vec<&str> = spec.split('|').collect();
    let cfg = KillConfig {
        mode: mode_of(f[1]),
        seq_from: SeqFrom::parse(f[2]).unwrap(),
        seed: f[5].parse().unwrap(),
        ..KillConfig::default()
    };
    let child = KillChild {
        round: f[3].parse().unwrap(),
        seq_floor: f[4].parse().unwrap(),
        retry: KillChild::parse_retry(f[6]),
    };
    let r = kill_child(
        &PathBuf::from(f[0]),
        &cfg,
        &child,
        u64::MAX,
        std::io::stdout(),
    );
    if let Err(e) = r {
        panic!("child failed: {e}");
    }
}

fn killed(mode: PersistMode) {
    let rounds = knob("VECTIDE_KILL_ROUNDS", 10);
    let root = if mode == PersistMode::Pmem && std::path::Path::new("/dev/shm").is_dir() {
        tempfile::tempdir_in("/dev/shm").unwrap()
    } else {
        tempfile::tempdir().unwrap()
    };
    let dir = root.path().join("index");
    let cfg = KillConfig {
        mode,
        seed: 5 + knob("VECTIDE_CRASH_SEED", 0) as u64,
        ..KillConfig::default()
    };
    let exe = std::env::current_exe().unwrap();
    let command = |c: &KillChild| {
        let mut cmd = Command::new(&exe);
        cmd.args([
            "--exact",
            "kill_child_entry",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(
            CHILD_ENV,
            format!(
                "{}|{}|{}|{}|{}|{}|{}",
                dir.display(),
                cfg.mode.name(),
                cfg.seq_from.name(),
                c.round,
                c.seq_floor,
                cfg.seed,
                c.retry_arg()
            ),
        );
        cmd
    };
    let r = kill_rounds(&dir, &cfg, rounds, &command, &|| {}).unwrap();
    println!(
        "{} rounds, {} acknowledged, {} in flight ({} applied, at most {} at once), {} label states checked, {} recoveries with work: {:?}",
        r.rounds,
        r.tally.acked,
        r.tally.in_flight,
        r.tally.in_flight_applied,
        r.tally.max_in_flight,
        r.tally.labels_checked,
        r.recoveries_with_work,
        r.recoveries
    );
    assert!(r.violations.is_empty(), "{:#?}", r.violations);
    assert_eq!(r.rounds, rounds);
    assert!(r.tally.acked > 0);
}

#[test]
fn sigkilled_concurrent_writers_recover_exactly_pmem() {
    killed(PersistMode::Pmem);
}

#[test]
fn sigkilled_concurrent_writers_recover_exactly_msync() {
    killed(PersistMode::Msync);
}
