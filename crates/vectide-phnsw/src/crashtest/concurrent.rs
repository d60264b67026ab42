//! Crash states of concurrent writers on the simulator.
//!
//! The single-writer harness ([`super::run`]) crashes one operation at a
//! time: every other operation is acknowledged, and every crash is recovered
//! from the same uncrashed history. That cannot reach states where several
//! operations from different threads are in flight at once, nor a history
//! that goes on after a recovery and crashes again. This harness does both:
//!
//! - each round opens the previous round's post-crash image (recovery runs),
//!   checks it against the history ([`super::history`]), then lets several
//!   writer threads upsert and delete labels of one small shared set, with
//!   sequence numbers counted from the index's `durable_seq()` (as a client
//!   without a log does) or above every number ever issued; a writer's first
//!   operation of a round retries the label of its operation in flight at
//!   the crash, with new content;
//! - the simulator crashes at a random fence of the round (power-loss image:
//!   pending lines kept, dropped or torn), while the other writers are in the
//!   middle of their own operations; the writers stop, and the image is the
//!   next round's index;
//! - a share of the rounds also crashes during the recovery of that image.
//!
//! One limit: the simulator's fence makes every thread's persisted lines
//! durable (as `msync` does), while on persistent memory `sfence` waits only
//! for the issuing thread's write-backs. A writer that relies on another
//! writer's persist is therefore not caught here; the unit tests of
//! `phnsw` pin the one such case the protocol had (the durable word).

use super::history::{check_round, History, Past, SeqFrom, Tally};
use super::{params, scratch_root, sim, sim_n, vector, Model, Rng, TempDir};
use crate::PHnsw;
use parking_lot::Mutex;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use vectide_core::{Error, Metric, Result, VectorIndex};
use vectide_storage::CrashImage;

/// What to run.
#[derive(Debug, Clone)]
pub struct ConcurrentConfig {
    pub rounds: usize,
    pub threads: usize,
    /// Labels the writers share (`0..labels`).
    pub labels: u64,
    pub dim: usize,
    pub seed: u64,
    pub seq_from: SeqFrom,
    /// Operations per writer and round at most (the crash comes first as a
    /// rule).
    pub max_ops: u64,
    /// The crash comes at one of the first `crash_window` fences of a round.
    pub crash_window: u64,
    /// Share of rounds whose recovery crashes too.
    pub recovery_share: f64,
    pub scratch_dir: Option<PathBuf>,
}

impl Default for ConcurrentConfig {
    fn default() -> Self {
        ConcurrentConfig {
            rounds: 40,
            threads: 3,
            labels: 48,
            dim: 12,
            seed: 1,
            seq_from: SeqFrom::Durable,
            max_ops: 40,
            crash_window: 120,
            recovery_share: 0.2,
            scratch_dir: None,
        }
    }
}

/// What a run found.
#[derive(Debug, Clone, Default)]
pub struct ConcurrentReport {
    /// Rounds checked (each ends in a crash and a checked recovery).
    pub rounds: usize,
    /// What the checks of the rounds counted.
    pub tally: Tally,
    pub recoveries_with_work: usize,
    pub recovery_crashes: usize,
    pub violations: Vec<String>,
}

/// Runs the concurrent crash test (see the module docs).
pub fn run_concurrent(cfg: &ConcurrentConfig) -> Result<ConcurrentReport> {
    if cfg.threads == 0 || cfg.labels < 8 || cfg.dim == 0 {
        return Err(Error::invalid(
            "concurrent crash test needs threads >= 1, labels >= 8, dim >= 1",
        ));
    }
    let root = scratch_root(&super::CrashTestConfig {
        scratch_dir: cfg.scratch_dir.clone(),
        ..Default::default()
    });
    let mut rep = ConcurrentReport::default();
    let mut rng = Rng(cfg.seed ^ 0xc0c0_77e7);
    let mut base = Model::new();
    let mut past = Past::default();
    // The image of the last crash, its history, and the durable watermark
    // its round began with.
    let mut dir = TempDir::new(&root, "conc")?;
    let mut pending: Option<(History, u64)> = None;
    let mut issued = 0u64;
    // Per writer, the label of its operation in flight at the last crash:
    // its first operation of the next round retries that label (with new
    // content), as a client does with an operation it got no answer for.
    let mut retry: Vec<Option<u64>> = vec![None; cfg.threads];
    for round in 0..=cfg.rounds {
        let media = sim(cfg.seed ^ (round as u64) << 8, None, []);
        let idx = if round == 0 {
            let idx = PHnsw::create_on(&dir.0, cfg.dim, Metric::L2, params(), media.clone())?;
            // Half the labels exist before the first crash.
            let ids: Vec<u64> = (0..cfg.labels / 2).collect();
            let rows: Vec<Vec<f32>> = ids.iter().map(|_| vector(&mut rng, cfg.dim)).collect();
            idx.insert(1, &ids, &rows.concat())?;
            base.extend(ids.into_iter().zip(rows));
            issued = 1;
            idx
        } else {
            match PHnsw::open_on(&dir.0, media.clone(), Some(1)) {
                Ok(i) => i,
                Err(e) => {
                    rep.tally.violating_rounds += 1;
                    rep.violations
                        .push(format!("round {round}: recovery failed: {e}"));
                    break;
                }
            }
        };
        if let Some((h, opened_durable)) = pending.take() {
            rep.rounds += 1;
            rep.recoveries_with_work += usize::from(super::kill::had_work(idx.recovery_report()));
            let rc = check_round(&idx, &mut base, &h.ops, opened_durable, &mut past);
            let recovery = idx.recovery_report();
            rep.tally.add(rc, &mut rep.violations, |e| {
                format!("round {} (recovery {recovery:?}): {e}", round - 1)
            });
        }
        if round == cfg.rounds {
            break;
        }
        // The round: writers until the crash.
        let start = match cfg.seq_from {
            SeqFrom::Durable => idx.durable_seq(),
            SeqFrom::Fresh => issued.max(idx.durable_seq()),
        };
        let opened_durable = idx.durable_seq();
        let counter = AtomicU64::new(start);
        let hist = Arc::new(Mutex::new(History::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let crashed: Arc<Mutex<Option<(CrashImage, History)>>> = Arc::new(Mutex::new(None));
        {
            let (hist, stop, crashed) = (hist.clone(), stop.clone(), crashed.clone());
            media.on_crash(move |img| {
                let mut c = crashed.lock();
                if c.is_none() {
                    *c = Some((img, hist.lock().clone()));
                }
                stop.store(true, Ordering::Release);
            });
        }
        media.crash_before([media.fences() + 1 + rng.below(cfg.crash_window as usize) as u64]);
        let errors: Mutex<Vec<String>> = Mutex::new(Vec::new());
        std::thread::scope(|s| {
            for t in 0..cfg.threads {
                let (idx, hist, stop, counter, errors) = (&idx, &hist, &stop, &counter, &errors);
                let retry = retry[t];
                let seed = cfg.seed;
                s.spawn(move || {
                    let mut r = Rng(seed ^ ((round as u64) << 32) ^ ((t as u64) << 16) ^ 0x5eed);
                    for k in 0..cfg.max_ops {
                        if stop.load(Ordering::Acquire) {
                            break;
                        }
                        let label = r.next() % cfg.labels;
                        let label = retry.filter(|_| k == 0).unwrap_or(label);
                        let v = (r.below(10) < 7).then(|| vector(&mut r, cfg.dim));
                        // The number is taken at invocation, as a client does.
                        let (i, seq) = {
                            let mut h = hist.lock();
                            let seq = counter.fetch_add(1, Ordering::AcqRel) + 1;
                            (h.invoke(round, t, k, label, v.clone(), seq), seq)
                        };
                        let out = match &v {
                            Some(x) => idx.insert(seq, &[label], x),
                            None => idx.delete(seq, &[label]).map(|_| ()),
                        };
                        if let Err(e) = out {
                            errors.lock().push(format!("writer {t} op {k}: {e}"));
                            break;
                        }
                        hist.lock().ack(i);
                    }
                });
            }
        });
        issued = issued.max(counter.load(Ordering::Acquire));
        for e in errors.into_inner() {
            rep.violations.push(format!("round {round}: {e}"));
        }
        let taken = crashed.lock().take();
        let (img, h) = match taken {
            Some(x) => x,
            // Every writer ran out of operations before the crash point.
            None => (media.image_now(), hist.lock().clone()),
        };
        drop(idx);
        retry = h.in_flight_labels(cfg.threads);
        let next = TempDir::new(&root, "conc")?;
        img.write_to(&next.0)
            .map_err(|e| Error::io_at(&next.0, e))?;
        if (rng.unit() as f64) < cfg.recovery_share {
            if let Some(second) = crash_in_recovery(&root, &next, cfg.seed ^ img.fence)? {
                rep.recovery_crashes += 1;
                dir = second;
                pending = Some((h, opened_durable));
                continue;
            }
        }
        dir = next;
        pending = Some((h, opened_durable));
    }
    Ok(rep)
}

/// Recovers a copy of `img_dir` on a simulator that crashes at one of the
/// recovery's own fences; returns that image (`None`: no fence to crash).
fn crash_in_recovery(
    root: &std::path::Path,
    img_dir: &TempDir,
    seed: u64,
) -> Result<Option<TempDir>> {
    let copy = |tag: &str| -> Result<TempDir> {
        let d = TempDir::new(root, tag)?;
        for e in std::fs::read_dir(&img_dir.0).map_err(|e| Error::io_at(&img_dir.0, e))? {
            let e = e.map_err(|e| Error::io_at(&img_dir.0, e))?;
            std::fs::copy(e.path(), d.0.join(e.file_name())).map_err(|e| Error::io_at(&d.0, e))?;
        }
        Ok(d)
    };
    // Count the recovery's fences on a throwaway copy.
    let probe = copy("probe")?;
    let s = sim(seed, None, []);
    drop(PHnsw::open_on(&probe.0, s.clone(), Some(1)));
    let fences = s.fences();
    if fences == 0 {
        return Ok(None);
    }
    let at = seed.wrapping_mul(0x9e37_79b9) % fences;
    let target = copy("rec")?;
    let s2 = sim_n(seed ^ 0xa5a5, None, [at], 1);
    let img: Arc<Mutex<Option<CrashImage>>> = Arc::new(Mutex::new(None));
    {
        let sink = img.clone();
        s2.on_crash(move |i| *sink.lock() = Some(i));
    }
    drop(PHnsw::open_on(&target.0, s2, Some(1)));
    let Some(i) = img.lock().take() else {
        return Ok(None);
    };
    let out = TempDir::new(root, "conc")?;
    i.write_to(&out.0).map_err(|e| Error::io_at(&out.0, e))?;
    Ok(Some(out))
}
