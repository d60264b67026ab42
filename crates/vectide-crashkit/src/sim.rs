//! Simulated crash states of concurrent writers, for any target.
//!
//! Each round opens the previous round's post-crash image (recovery runs),
//! checks it against the history ([`crate::history`]), then lets several
//! writer threads upsert and delete labels of one small shared set, with
//! sequence numbers counted from the target's `durable_seq()` (as a client
//! without a log does) or above every number ever issued; a writer's first
//! operation of a round retries the label of its operation in flight at the
//! crash, with new content.
//!
//! The round's directory is simulated twice over, and the target never
//! knows: its file syncs (`vectide_core::sync`) go through a file crash
//! simulator ([`FileSim`]), and the persistent regions it opens there
//! (`vectide_storage::media_for`) run on the cache-line simulator
//! ([`SimMedia`]). The crash comes at a random sync point or fence of the
//! round (which of the two, at random, among those the target uses), while
//! the other writers are in the middle of their own operations. The image is
//! both simulators' post-crash state: every file as the file simulator
//! leaves it (unsynced tails kept, dropped, torn or zero-filled; entries not yet durable
//! kept or lost), with the region files replaced by the region simulator's
//! image (pending lines kept, dropped or torn). It is the next round's
//! start; a share of the rounds also crashes during the recovery of that
//! image, at one of the recovery's own sync points or fences.
//!
//! With a site switched off (`disable`), one persistence call of the target
//! does nothing durable; [`mutation_check`] runs the rounds once per site the
//! target uses and reports which ones the checks caught. With a site
//! switched off, odd rounds crash only where its loss shows, just after one
//! of its calls (`FileSim::aim_after_disabled` for a sync site,
//! `SimMedia::aim_after_disabled` for a region site: the fence after it),
//! instead of at a drawn point: a site called once per log or per merge is
//! met by few crash points drawn at random.
//!
//! One limit, from the region simulator: its fence makes every thread's
//! persisted lines durable (as `msync` does), while on persistent memory
//! `sfence` waits only for the issuing thread's write-backs.

use crate::history::{check_round, History, Past, SeqFrom, Tally};
use crate::subject::{Subject, Target};
use crate::workload::{vector, Model, Rng, DIM};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use vectide_core::sync::SyncSite;
use vectide_core::{Error, Result};
use vectide_storage::crashfs::{FileSim, FileSimConfig};
use vectide_storage::{
    install_media_override, scratch_dir, scratch_root, CrashImage, SimConfig, SimMedia, Site,
};

/// What to run.
#[derive(Debug, Clone)]
pub struct SimConfigKit {
    pub target: Target,
    pub rounds: usize,
    pub threads: usize,
    /// Labels the writers share (`0..labels`).
    pub labels: u64,
    pub seed: u64,
    pub seq_from: SeqFrom,
    /// Operations per writer and round at most (the crash comes first as a
    /// rule).
    pub max_ops: u64,
    /// The crash comes at one of the next `crash_window` sync points or
    /// fences of a round.
    pub crash_window: u64,
    /// The crash point is drawn among at least this many of the next sync
    /// points or fences, however few the last round issued (0: as many as
    /// it issued). Long rounds let work that needs many writes (a reclaim
    /// of vector numbers) run between crashes.
    pub min_span: u64,
    /// Share of rounds whose recovery crashes too.
    pub recovery_share: f64,
    /// A persistence site to switch off (the mutation check).
    pub disable: Option<Disabled>,
    pub scratch_dir: Option<PathBuf>,
    /// Writer 0 calls `maintain()` after every this many of its operations
    /// (consolidations, merges: crashes land in them and in the writes
    /// beside and after them); 0: never.
    pub maintain_every: u64,
}

impl SimConfigKit {
    /// The defaults for a target.
    pub fn new(target: Target) -> SimConfigKit {
        SimConfigKit {
            target,
            rounds: 40,
            threads: 3,
            labels: 48,
            seed: 1,
            seq_from: SeqFrom::Durable,
            max_ops: 40,
            crash_window: 120,
            min_span: 0,
            recovery_share: 0.2,
            disable: None,
            scratch_dir: None,
            maintain_every: 0,
        }
    }
}

/// A persistence site: a file sync site or a region persist/fence site.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Disabled {
    Sync(SyncSite),
    Region(Site),
}

impl Disabled {
    pub fn name(&self) -> String {
        match self {
            Disabled::Sync(s) => format!("sync:{}", s.0),
            Disabled::Region(s) => format!("region:{}", s.0),
        }
    }
}

/// What a run found.
#[derive(Debug, Clone, Default)]
pub struct SimReport {
    /// Rounds checked (each ends in a crash and a checked recovery).
    pub rounds: usize,
    /// What the checks of the rounds counted.
    pub tally: Tally,
    pub recoveries_with_work: usize,
    pub recovery_crashes: usize,
    /// Crashes at a file sync point and at a region fence.
    pub crashes_at_sync: usize,
    pub crashes_at_fence: usize,
    /// Persistence sites the target used, with their calls.
    pub sites: BTreeMap<Disabled, u64>,
    pub violations: Vec<String>,
    /// The most vector slots (numbers) the target held at the end of a
    /// round's writes, and the reclaims it ran, summed over the rounds
    /// (both from its stats; 0 when it has no such figure).
    pub slots_max: usize,
    pub reclaims: u64,
}

/// A directory removed on drop.
pub type TempDir = tempfile::TempDir;

/// Both simulators of one directory, installed while this lives.
struct Sims {
    files: Arc<FileSim>,
    media: Arc<SimMedia>,
    _images: TempDir,
    _guards: (
        vectide_core::sync::ObserverGuard,
        vectide_storage::MediaGuard,
    ),
}

impl Sims {
    /// `aim`: crash where a disabled sync site's loss shows
    /// ([`FileSim::aim_after_disabled`]); such rounds draw no crash point.
    fn new(
        dir: &Path,
        scratch: &Path,
        seed: u64,
        disable: Option<Disabled>,
        aim: bool,
    ) -> Result<Sims> {
        let images = scratch_dir(scratch, "img")?;
        let files = FileSim::new(
            dir,
            FileSimConfig {
                seed,
                image_dir: images.path().to_path_buf(),
                ..Default::default()
            },
        )?;
        let media = Arc::new(SimMedia::new(SimConfig {
            seed: seed ^ 0x006d_6564_6961,
            ..Default::default()
        }));
        match disable {
            Some(Disabled::Sync(s)) => {
                files.disable(Some(s));
                files.aim_after_disabled(aim);
            }
            Some(Disabled::Region(s)) => {
                media.disable(Some(s));
                media.aim_after_disabled(aim);
            }
            None => {}
        }
        let g1 = files.install();
        let g2 = install_media_override(dir, media.clone());
        Ok(Sims {
            files,
            media,
            _images: images,
            _guards: (g1, g2),
        })
    }

    /// Where the next crash of each kind can come.
    fn counts(&self) -> (u64, u64) {
        (self.files.sync_points(), self.media.fences())
    }

    fn sites(&self, into: &mut BTreeMap<Disabled, u64>) {
        for (k, n) in self.files.report().by_site {
            *into.entry(Disabled::Sync(k)).or_default() += n;
        }
        for (k, (p, f)) in self.media.report().by_site {
            *into.entry(Disabled::Region(k)).or_default() += p + f;
        }
    }
}

/// Makes `out` a composite image: the files of `files_dir` (a file
/// simulator image, moved there) with every region file replaced by the
/// region image's bytes.
fn compose(files_dir: &Path, regions: Option<&CrashImage>, out: &Path) -> Result<()> {
    // The image is a scratch copy already: move it (same file system) rather
    // than copy it again.
    let moved = std::fs::remove_dir(out).is_ok() && std::fs::rename(files_dir, out).is_ok();
    if !moved {
        copy_tree(files_dir, out)?;
    }
    if let Some(img) = regions {
        for r in &img.regions {
            for p in find_named(out, &r.name) {
                std::fs::write(&p, &r.bytes).map_err(|e| Error::io_at(&p, e))?;
            }
        }
    }
    Ok(())
}

fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to).map_err(|e| Error::io_at(to, e))?;
    for e in std::fs::read_dir(from).map_err(|e| Error::io_at(from, e))? {
        let e = e.map_err(|e| Error::io_at(from, e))?;
        let (src, dst) = (e.path(), to.join(e.file_name()));
        if src.is_dir() {
            copy_tree(&src, &dst)?;
        } else {
            std::fs::copy(&src, &dst).map_err(|e| Error::io_at(&dst, e))?;
        }
    }
    Ok(())
}

/// With `VECTIDE_CRASH_KEEP=DIR`, a copy of an image that failed to open
/// goes to `DIR/round-N` (to open it again under a debugger); returns a
/// note saying where, or nothing.
fn keep_image(dir: &Path, round: usize) -> String {
    let Some(root) = std::env::var_os("VECTIDE_CRASH_KEEP") else {
        return String::new();
    };
    let to = Path::new(&root).join(format!("round-{round}"));
    let prev = Path::new(&root).join("before-open");
    let older = Path::new(&root).join(format!("round-{round}-previous"));
    let _ = std::fs::rename(Path::new(&root).join("previous"), &older);
    let _ = std::fs::remove_dir_all(&prev);
    match copy_tree(dir, &to) {
        Ok(()) => format!("; kept in {}", to.display()),
        Err(e) => format!("; keeping it in {} failed: {e}", to.display()),
    }
}

/// With `VECTIDE_CRASH_KEEP=DIR`, after a round whose check failed: the
/// image it opened (`DIR/round-N-opened`) and the one its crash left
/// (`DIR/round-N-crashed`, as the next round opened it).
fn keep_checked(round: usize) {
    let Some(root) = std::env::var_os("VECTIDE_CRASH_KEEP") else {
        return;
    };
    let root = Path::new(&root);
    let _ = copy_tree(
        &root.join("previous"),
        &root.join(format!("round-{round}-opened")),
    );
    let _ = copy_tree(
        &root.join("before-open"),
        &root.join(format!("round-{round}-crashed")),
    );
}

/// With `VECTIDE_CRASH_KEEP=DIR`: the image each round opens, before the
/// open changes it, as `DIR/previous` (the last round's, for a round
/// whose image fails to open next).
fn keep_before(dir: &Path) {
    let Some(root) = std::env::var_os("VECTIDE_CRASH_KEEP") else {
        return;
    };
    let (prev, cur) = (
        Path::new(&root).join("previous"),
        Path::new(&root).join("before-open"),
    );
    let _ = std::fs::remove_dir_all(&prev);
    let _ = std::fs::rename(&cur, &prev);
    let _ = copy_tree(dir, &cur);
}

/// The files under `dir` with their sizes (for messages).
fn listing(dir: &Path) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                let name = e.file_name().to_string_lossy().into_owned();
                out.extend(
                    listing(&p)
                        .into_iter()
                        .map(|(n, l)| (format!("{name}/{n}"), l)),
                );
            } else {
                let len = e.metadata().map_or(0, |m| m.len());
                out.push((e.file_name().to_string_lossy().into_owned(), len));
            }
        }
    }
    out.sort();
    out
}

fn find_named(dir: &Path, name: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(find_named(&p, name));
            } else if e.file_name().to_string_lossy() == name {
                out.push(p);
            }
        }
    }
    out
}

/// What the crash callback hands back: the image's files directory, the
/// region image, and the history at the crash.
type Crashed = Arc<Mutex<Option<(PathBuf, Option<CrashImage>, History)>>>;

/// Whether `round` crashes only where the disabled site's loss shows (or,
/// when it is not called, once the writers are done): odd rounds of a
/// mutation check (a sync site: just after one of its calls; a region
/// site: at the fence after one of its calls). Even rounds keep their drawn crash
/// point, so that a site called only while the index is created (round 0)
/// or one whose loss shows much later is met too.
fn aimed(cfg: &SimConfigKit, round: usize) -> bool {
    cfg.disable.is_some() && round % 2 == 1
}

/// Runs the rounds (see the module docs).
pub fn run(cfg: &SimConfigKit) -> Result<SimReport> {
    if cfg.threads == 0 || cfg.labels < 8 {
        return Err(Error::invalid(
            "the crash simulator needs threads >= 1 and labels >= 8",
        ));
    }
    let scratch = scratch_root(cfg.scratch_dir.as_deref());
    let mut rep = SimReport::default();
    let mut rng = Rng(cfg.seed ^ 0xc0c0_77e7);
    let mut base = Model::new();
    let mut past = Past::default();
    let mut dir = scratch_dir(&scratch, "sim")?;
    let mut pending: Option<(History, u64)> = None;
    let mut issued = 0u64;
    let mut retry: Vec<Option<u64>> = vec![None; cfg.threads];
    // Sync points and fences of the last round.
    let mut rate = (0u64, 0u64);
    for round in 0..=cfg.rounds {
        let aim = aimed(cfg, round);
        let sims = Sims::new(
            dir.path(),
            &scratch,
            cfg.seed ^ (round as u64) << 8,
            cfg.disable,
            aim,
        )?;
        keep_before(dir.path());
        let idx = match cfg.target.open(dir.path(), DIM) {
            Ok(i) => i,
            Err(e) => {
                rep.tally.violating_rounds += 1;
                rep.violations.push(format!(
                    "round {round}: open (recovery) failed: {e}; the image holds {:?}{}",
                    listing(dir.path()),
                    keep_image(dir.path(), round)
                ));
                break;
            }
        };
        if round == 0 {
            // Half the labels exist before the first crash.
            for label in 0..cfg.labels / 2 {
                let v = vector(&mut rng, DIM);
                issued += 1;
                idx.upsert(issued, label, &v)?;
                base.insert(label, v);
            }
            idx.make_durable()?;
        }
        if let Some((h, opened_durable)) = pending.take() {
            rep.rounds += 1;
            rep.recoveries_with_work += usize::from(idx.recovered_work());
            let rc = check_round(&*idx, &mut base, &h.ops, opened_durable, &mut past);
            if !rc.violations.is_empty() {
                keep_checked(round - 1);
            }
            let note = idx.recovery_note();
            rep.tally.add(rc, &mut rep.violations, |e| {
                format!("round {} ({}, {note}): {e}", round - 1, cfg.target.name())
            });
        }
        if round == cfg.rounds {
            sims.sites(&mut rep.sites);
            break;
        }
        let (syncs0, fences0) = sims.counts();
        let hist = Arc::new(Mutex::new(History::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let crashed: Crashed = Arc::new(Mutex::new(None));

        // A fence or a sync point, in proportion to how many of each the
        // target issued in the last round (at its first, in its creation).
        let (ds, df) = if rate == (0, 0) {
            (syncs0, fences0)
        } else {
            rate
        };
        // A round aimed at a disabled region site crashes at the fence
        // after its first call (the media aims), else where drawn.
        let region_aim = aim && matches!(cfg.disable, Some(Disabled::Region(_)));
        let at_fence =
            region_aim || (df > 0 && rng.below((ds + df) as usize) < df as usize && !aim);
        // Within the events a round issues (as the last one did), so that
        // the crash comes before the writers run out as a rule.
        let span = if at_fence { df } else { ds }.max(cfg.min_span);
        let window = cfg.crash_window.min(span.max(1));
        let at = 1 + rng.below(window as usize) as u64;
        let images = scratch_dir(&scratch, "img-now")?;
        if at_fence {
            let (hist, stop, crashed, files) = (
                hist.clone(),
                stop.clone(),
                crashed.clone(),
                sims.files.clone(),
            );
            let target = images.path().join("at-fence");
            sims.media.on_crash(move |img| {
                let mut c = crashed.lock();
                if c.is_none() {
                    if let Ok(fimg) = files.image_now(&target) {
                        *c = Some((fimg.dir, Some(img), hist.lock().clone()));
                    }
                }
                stop.store(true, Ordering::Release);
            });
            if !region_aim {
                sims.media.crash_before([fences0 + at]);
            }
        } else {
            let (hist, stop, crashed, media) = (
                hist.clone(),
                stop.clone(),
                crashed.clone(),
                sims.media.clone(),
            );
            sims.files.on_crash(move |fimg| {
                let mut c = crashed.lock();
                if c.is_none() {
                    let regions = media.image_now();
                    *c = Some((fimg.dir.clone(), Some(regions), hist.lock().clone()));
                } else {
                    // A later (aimed) crash point of the same round.
                    let _ = std::fs::remove_dir_all(&fimg.dir);
                }
                stop.store(true, Ordering::Release);
            });
            if !aim {
                sims.files.crash_before([syncs0 + at]);
            }
        }
        let start = match cfg.seq_from {
            SeqFrom::Durable => idx.durable_seq().unwrap_or(0),
            SeqFrom::Fresh => issued.max(idx.durable_seq().unwrap_or(0)),
        };
        let opened_durable = idx.durable_seq().unwrap_or(0);
        let counter = AtomicU64::new(start);
        let errors: Mutex<Vec<String>> = Mutex::new(Vec::new());
        writers(cfg, round, &*idx, &hist, &stop, &counter, &retry, &errors);
        issued = issued.max(counter.load(Ordering::Acquire));
        rep.slots_max = rep
            .slots_max
            .max(idx.figure("slots_used").unwrap_or(0.0) as usize);
        rep.reclaims += idx.figure("reclaims").unwrap_or(0.0) as u64;
        for e in errors.into_inner() {
            rep.violations.push(format!("round {round}: {e}"));
        }
        let taken = crashed.lock().take();
        let (files_dir, regions, h) = match taken {
            Some(x) => {
                if at_fence {
                    rep.crashes_at_fence += 1;
                } else {
                    rep.crashes_at_sync += 1;
                }
                x
            }
            // Every writer ran out of operations before the crash point.
            None => {
                let fimg = sims.files.image_now(&images.path().join("now"))?;
                (fimg.dir, Some(sims.media.image_now()), hist.lock().clone())
            }
        };
        sims.sites(&mut rep.sites);
        let (syncs1, fences1) = sims.counts();
        rate = (syncs1 - syncs0, fences1 - fences0);
        // The image lives in the simulators' scratch: compose it first.
        let next = scratch_dir(&scratch, "sim")?;
        compose(&files_dir, regions.as_ref(), next.path())?;
        drop(idx);
        drop(sims);
        drop(images);
        retry = h.in_flight_labels(cfg.threads);
        if (rng.unit() as f64) < cfg.recovery_share {
            if let Some(second) = crash_in_recovery(cfg, &scratch, &next, rng.next_u64())? {
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

/// The writers of one round, until the crash (or `max_ops` each).
#[allow(clippy::too_many_arguments)]
fn writers(
    cfg: &SimConfigKit,
    round: usize,
    idx: &dyn Subject,
    hist: &Mutex<History>,
    stop: &AtomicBool,
    counter: &AtomicU64,
    retry: &[Option<u64>],
    errors: &Mutex<Vec<String>>,
) {
    std::thread::scope(|s| {
        for t in 0..cfg.threads {
            let retry = retry.get(t).copied().flatten();
            s.spawn(move || {
                for k in 0..cfg.max_ops {
                    if stop.load(Ordering::Acquire) {
                        break;
                    }
                    let (label, v) = crate::workload::op(cfg.seed, round, t, k, cfg.labels, retry);
                    // The number is taken at invocation, as a client does.
                    let (i, seq) = {
                        let mut h = hist.lock();
                        let seq = counter.fetch_add(1, Ordering::AcqRel) + 1;
                        (h.invoke(round, t, k, label, v.clone(), seq), seq)
                    };
                    let out = match &v {
                        Some(x) => idx.upsert(seq, label, x),
                        None => idx.delete(seq, label),
                    }
                    .and_then(|_| idx.make_durable());
                    if let Err(e) = out {
                        // After the crash point the simulators may refuse
                        // nothing, but a target may still fail; before it,
                        // any error is a finding.
                        if !stop.load(Ordering::Acquire) {
                            errors.lock().push(format!("writer {t} op {k}: {e}"));
                        }
                        break;
                    }
                    hist.lock().ack(i);
                    let every = cfg.maintain_every;
                    if t == 0 && every > 0 && (k + 1) % every == 0 {
                        if let Err(e) = idx.maintain() {
                            if !stop.load(Ordering::Acquire) {
                                errors
                                    .lock()
                                    .push(format!("writer {t} maintain after op {k}: {e}"));
                            }
                            break;
                        }
                    }
                }
            });
        }
    });
}

/// Recovers a copy of `img` under simulators that crash at one of the
/// recovery's own sync points or fences; returns that image (`None`: the
/// recovery has none).
fn crash_in_recovery(
    cfg: &SimConfigKit,
    scratch: &Path,
    img: &TempDir,
    seed: u64,
) -> Result<Option<TempDir>> {
    // Count the recovery's events on a throwaway copy.
    let probe = scratch_dir(scratch, "probe")?;
    copy_tree(img.path(), probe.path())?;
    let (syncs, fences) = {
        let sims = Sims::new(probe.path(), scratch, seed, cfg.disable, false)?;
        drop(cfg.target.open(probe.path(), DIM));
        sims.counts()
    };
    drop(probe);
    let total = syncs + fences;
    if total == 0 {
        return Ok(None);
    }
    let at = seed % total;
    let target = scratch_dir(scratch, "rec")?;
    copy_tree(img.path(), target.path())?;
    let sims = Sims::new(target.path(), scratch, seed ^ 0xa5a5, cfg.disable, false)?;
    type Image = Arc<Mutex<Option<(PathBuf, Option<CrashImage>)>>>;
    let crashed: Image = Arc::new(Mutex::new(None));
    let holder = scratch_dir(scratch, "rec-img")?;
    if at < syncs {
        let (sink, media) = (crashed.clone(), sims.media.clone());
        sims.files.on_crash(move |f| {
            let mut c = sink.lock();
            if c.is_none() {
                *c = Some((f.dir.clone(), Some(media.image_now())));
            }
        });
        sims.files.crash_before([at]);
    } else {
        let (sink, files) = (crashed.clone(), sims.files.clone());
        let where_ = holder.path().join("at-fence");
        sims.media.on_crash(move |r| {
            let mut c = sink.lock();
            if c.is_none() {
                if let Ok(f) = files.image_now(&where_) {
                    *c = Some((f.dir, Some(r)));
                }
            }
        });
        sims.media.crash_before([at - syncs]);
    }
    drop(cfg.target.open(target.path(), DIM));
    let Some((files_dir, regions)) = crashed.lock().take() else {
        return Ok(None);
    };
    let out = scratch_dir(scratch, "sim")?;
    compose(&files_dir, regions.as_ref(), out.path())?;
    drop(sims);
    Ok(Some(out))
}

/// The outcome of [`mutation_check`] for one site.
#[derive(Debug, Clone)]
pub struct Mutation {
    pub site: Disabled,
    /// Calls of the site in the unmutated run.
    pub calls: u64,
    /// Rounds with a violation when the site was switched off.
    pub violating_rounds: usize,
    pub first_violation: Option<String>,
}

/// The mutation check: runs `cfg` once unmutated (which must be clean) to
/// learn the persistence sites the target uses, then once per site with
/// that site switched off. Returns the unmutated report and one outcome per
/// site; a site with no violating round was not proven necessary.
pub fn mutation_check(cfg: &SimConfigKit) -> Result<(SimReport, Vec<Mutation>)> {
    let clean = run(&SimConfigKit {
        disable: None,
        ..cfg.clone()
    })?;
    let mut out = Vec::new();
    for (&site, &calls) in &clean.sites {
        let r = run(&SimConfigKit {
            disable: Some(site),
            ..cfg.clone()
        })?;
        out.push(Mutation {
            site,
            calls,
            // Writer errors and failed recoveries count as caught too.
            violating_rounds: r
                .tally
                .violating_rounds
                .max(usize::from(!r.violations.is_empty())),
            first_violation: r.violations.first().cloned(),
        });
    }
    Ok((clean, out))
}
