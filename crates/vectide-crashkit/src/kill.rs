//! The real-process kill test (driven by `vectide crash-test` and this
//! crate's tests).
//!
//! A child process opens (recovering) or creates the target (an engine
//! through the registry, or a database collection) and runs several writer
//! threads that
//! upsert and delete labels of one small shared set, with sequence numbers
//! counted from `durable_seq()` as `vectide.Index` does (or above every
//! number the parent saw issued); each writer's first operation retries the
//! label of its operation in flight at the last kill. It reports each
//! operation on stdout before the call (`i <writer> <op> <seq>`) and after
//! it returns (`a <writer> <op>`), one line per write, so the order of the
//! lines is a real-time order. The parent SIGKILLs it at a random moment, opens the index
//! (recovery runs) and checks every label against the acknowledged history
//! ([`super::history`]); the state found is the next round's start.

use crate::history::{check_round, History, Past, SeqFrom, Tally};
use crate::subject::Target;
use crate::workload::{self, Model, Rng, DIM};
use parking_lot::Mutex;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use vectide_core::{Error, Result, Seq};

/// What the kill test runs.
#[derive(Debug, Clone)]
pub struct KillConfig {
    pub target: Target,
    /// Writer threads of the child.
    pub threads: usize,
    /// Labels the writers share (`0..labels`).
    pub labels: u64,
    pub seed: u64,
    pub seq_from: SeqFrom,
}

/// The child side: opens or creates the index in `dir`, then runs the
/// writers of round `c.round` until killed (or `limit` operations each),
/// reporting on `out`.
pub fn kill_child<W: Write + Send>(
    dir: &Path,
    cfg: &KillConfig,
    c: &KillChild,
    limit: u64,
    out: W,
) -> Result<()> {
    let idx = cfg.target.open(dir, DIM)?;
    let durable = idx.durable_seq().unwrap_or(0);
    let start = match cfg.seq_from {
        SeqFrom::Durable => durable,
        SeqFrom::Fresh => c.seq_floor.max(durable),
    };
    let out = Mutex::new(out);
    let line = |s: &str| -> Result<()> {
        let mut o = out.lock();
        writeln!(o, "{s}").map_err(Error::from)?;
        o.flush().map_err(Error::from)
    };
    line(&format!("open {durable} {start}"))?;
    let counter = AtomicU64::new(start);
    let result: Mutex<Result<()>> = Mutex::new(Ok(()));
    std::thread::scope(|s| {
        for t in 0..cfg.threads.max(1) {
            let (idx, counter, line, result, out) = (&*idx, &counter, &line, &result, &out);
            s.spawn(move || {
                let run = || -> Result<()> {
                    for k in 0..limit {
                        let (label, v) = c.op(cfg, t, k);
                        // Number and report under the output lock, so that
                        // the lines order the numbers too.
                        let seq = {
                            let mut o = out.lock();
                            let seq = counter.fetch_add(1, Ordering::AcqRel) + 1;
                            writeln!(o, "i {t} {k} {seq}").map_err(Error::from)?;
                            o.flush().map_err(Error::from)?;
                            seq
                        };
                        match &v {
                            Some(x) => idx.upsert(seq, label, x)?,
                            None => idx.delete(seq, label)?,
                        }
                        idx.make_durable()?;
                        line(&format!("a {t} {k}"))?;
                    }
                    Ok(())
                };
                if let Err(e) = run() {
                    let _ = line(&format!("e {t} {e}"));
                    *result.lock() = Err(e);
                }
            });
        }
    });
    result.into_inner()
}

/// What a child must be told besides the fixed config.
#[derive(Debug, Clone, Default)]
pub struct KillChild {
    pub round: usize,
    /// The highest number issued so far (for [`SeqFrom::Fresh`]).
    pub seq_floor: Seq,
    /// Per writer, the label of its operation in flight at the last kill.
    pub retry: Vec<Option<u64>>,
}

impl KillChild {
    /// Operation `k` of writer `t`.
    pub fn op(&self, cfg: &KillConfig, t: usize, k: u64) -> (u64, Option<Vec<f32>>) {
        let retry = self.retry.get(t).copied().flatten();
        workload::op(cfg.seed, self.round, t, k, cfg.labels, retry)
    }

    /// `retry` as one argument: labels or `_`, comma-separated.
    pub fn retry_arg(&self) -> String {
        if self.retry.is_empty() {
            return "_".into();
        }
        let parts: Vec<String> = self
            .retry
            .iter()
            .map(|r| r.map_or_else(|| "_".to_string(), |l| l.to_string()))
            .collect();
        parts.join(",")
    }

    /// Reads [`KillChild::retry_arg`]'s format.
    pub fn parse_retry(s: &str) -> Vec<Option<u64>> {
        s.split(',').map(|x| x.parse().ok()).collect()
    }
}

/// What the kill rounds found.
#[derive(Debug, Clone, Default)]
pub struct KillReport {
    pub rounds: usize,
    /// What the checks of the rounds counted.
    pub tally: Tally,
    pub recoveries_with_work: usize,
    /// Wall time of each open (recovery included), microseconds.
    pub open_micros: Vec<u64>,
    pub live: usize,
    pub violations: Vec<String>,
}

fn splitmix(x: u64) -> u64 {
    Rng(x).next_u64()
}

/// The parent side: `rounds` times, starts the child `command` makes, kills
/// it with SIGKILL 20-250 ms later, recovers the index in `dir` and checks
/// it. `tick` is called after each round.
pub fn kill_rounds(
    dir: &Path,
    cfg: &KillConfig,
    rounds: usize,
    command: &dyn Fn(&KillChild) -> Command,
    tick: &dyn Fn(),
) -> Result<KillReport> {
    let mut rep = KillReport::default();
    let mut base = Model::new();
    let mut past = Past::default();
    let mut issued: Seq = 0;
    let mut retry: Vec<Option<u64>> = Vec::new();
    for round in 0..rounds {
        let spec = KillChild {
            round,
            seq_floor: issued,
            retry: std::mem::take(&mut retry),
        };
        let mut child = command(&spec)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| Error::invalid(format!("cannot start the child: {e}")))?;
        let stdout = child.stdout.take().expect("piped");
        let reader = std::thread::spawn(move || {
            BufReader::new(stdout)
                .lines()
                .map_while(std::result::Result::ok)
                .collect::<Vec<String>>()
        });
        let wait = 20 + splitmix(cfg.seed ^ (round as u64) << 20) % 230;
        std::thread::sleep(Duration::from_millis(wait));
        // A child that is gone already failed (it runs until killed).
        let ended = child.try_wait().map_err(Error::from)?;
        let _ = child.kill(); // SIGKILL on Unix
        let status = child.wait().map_err(Error::from)?;
        let lines = reader
            .join()
            .map_err(|_| Error::invalid("reader thread panicked"))?;
        let mut err = String::new();
        if let Some(mut e) = child.stderr.take() {
            let _ = e.read_to_string(&mut err);
        }
        if ended.is_some() {
            return Err(Error::invalid(format!(
                "the child of round {round} exited before it was killed ({status}): {err}"
            )));
        }
        // The history, in the order of the lines.
        let mut h = History::default();
        let mut at: std::collections::HashMap<(usize, u64), usize> = Default::default();
        let mut opened: Option<Seq> = None;
        for l in &lines {
            let f: Vec<&str> = l.split_whitespace().collect();
            let num = |i: usize| f.get(i).and_then(|x| x.parse::<u64>().ok());
            match f.first().copied() {
                Some("open") => opened = num(1),
                Some("i") => {
                    let (Some(t), Some(k), Some(seq)) = (num(1), num(2), num(3)) else {
                        continue;
                    };
                    let t = t as usize;
                    let (label, v) = spec.op(cfg, t, k);
                    at.insert((t, k), h.invoke(round, t, k, label, v, seq));
                    issued = issued.max(seq);
                }
                Some("a") => {
                    if let (Some(t), Some(k)) = (num(1), num(2)) {
                        if let Some(&i) = at.get(&(t as usize, k)) {
                            h.ack(i);
                        }
                    }
                }
                Some("e") => rep
                    .violations
                    .push(format!("round {round}: child error: {l}")),
                _ => {}
            }
        }
        retry = h.in_flight_labels(cfg.threads.max(1));
        rep.rounds += 1;
        tick();
        if !cfg.target.exists(dir) {
            if h.ops.iter().any(|o| o.ack.is_some()) {
                rep.violations.push(format!(
                    "round {round}: operations acknowledged but no index on disk"
                ));
            }
            continue;
        }
        let t = Instant::now();
        let idx = match cfg.target.open(dir, DIM) {
            Ok(i) => i,
            Err(e) => {
                rep.tally.violating_rounds += 1;
                rep.violations
                    .push(format!("round {round}: recovery failed: {e}"));
                break;
            }
        };
        rep.open_micros.push(t.elapsed().as_micros() as u64);
        let recovery = idx.recovery_note();
        rep.recoveries_with_work += usize::from(idx.recovered_work());
        let opened_durable = opened.unwrap_or(0);
        let rc = check_round(&*idx, &mut base, &h.ops, opened_durable, &mut past);
        rep.live = idx.len();
        rep.tally.add(rc, &mut rep.violations, |v| {
            format!(
                "round {round} ({}, numbers from {}, {recovery}): {v}",
                cfg.target.name(),
                cfg.seq_from.name(),
            )
        });
    }
    Ok(rep)
}
