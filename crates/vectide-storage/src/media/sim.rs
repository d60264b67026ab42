//! [`SimMedia`]: the crash simulator.
//!
//! ## Model
//! The mapped files are the CPU's view of memory (caches + DRAM). Beside each
//! region the simulator keeps a *shadow*: the bytes known to be durable. At
//! open the shadow is the file's content. `persist(range)` snapshots the
//! current content of each line of the range (a write-back in flight);
//! `fence()` copies those snapshots into the shadow (the write-backs are
//! complete). A line whose current content differs from the shadow is
//! *pending*: it was stored to since it last became durable.
//!
//! A crash point is "just before fence number N" (fences counted from the
//! media's creation). There, the simulator materialises the post-crash image:
//! the shadow, with each pending line — independently and by a seeded RNG —
//! fully kept (its current content, or the content a persist snapshotted),
//! dropped (the shadow), or kept in part at 8-byte granularity (each aligned
//! word from the kept or the dropped version). Stores are 8-byte atomic, as
//! on x86. Crashing just before a fence covers every state between two
//! fences, because any subset of the stores since the previous fence is one
//! of the outcomes.
//!
//! The engine goes on running after a crash point: the image is handed to a
//! callback (the checker), so one run of a workload serves many crash points.
//!
//! ## Mutation switch
//! [`SimMedia::disable`] turns every `persist` or `fence` of one [`Site`] into
//! a no-op, to prove that the checker notices a missing persistence point.

use super::{read_racy, Media, LINE};
use crate::region::Site;
use parking_lot::Mutex;
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// One region of a post-crash image.
#[derive(Debug, Clone)]
pub struct ImageRegion {
    /// File name of the region (relative to its directory).
    pub name: String,
    /// The bytes that survived.
    pub bytes: Vec<u8>,
}

/// A post-crash image: what every attached region's file would hold.
#[derive(Debug, Clone)]
pub struct CrashImage {
    /// The fence the crash came just before (0-based).
    pub fence: u64,
    /// The site of that fence.
    pub site: Site,
    /// Lines that were pending (stored to, not yet durable).
    pub pending_lines: usize,
    pub regions: Vec<ImageRegion>,
}

impl CrashImage {
    /// Writes every region file of the image into `dir`.
    pub fn write_to(&self, dir: &std::path::Path) -> std::io::Result<()> {
        for r in &self.regions {
            std::fs::write(dir.join(&r.name), &r.bytes)?;
        }
        Ok(())
    }
}

/// Counters of a simulator run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SimReport {
    pub persists: u64,
    pub fences: u64,
    /// Lines persisted (a persist of a range counts each line once).
    pub persisted_lines: u64,
    /// Per site: (persists, fences).
    pub by_site: BTreeMap<Site, (u64, u64)>,
    /// Calls skipped by the mutation switch.
    pub skipped: u64,
    /// Crash images produced.
    pub crashes: u64,
}

/// Configuration of a simulator.
#[derive(Debug, Clone, Default)]
pub struct SimConfig {
    /// Seed of the line-fate RNG.
    pub seed: u64,
    /// Fence numbers just before which a crash image is taken.
    pub crash_before: BTreeSet<u64>,
    /// Images per crash point, each with its own draw of line fates
    /// (0 counts as 1).
    pub images_per_crash: usize,
}

type Callback = Box<dyn FnMut(CrashImage) + Send>;

struct SimRegion {
    name: String,
    base: usize,
    len: usize,
    shadow: Vec<u8>,
}

struct State {
    regions: HashMap<u32, SimRegion>,
    next_id: u32,
    /// (region, line index) -> content snapshotted by a persist, not yet fenced.
    flushed: HashMap<(u32, usize), [u8; LINE]>,
    report: SimReport,
    crash_before: BTreeSet<u64>,
    disabled: Option<Site>,
    /// Crash at the fence after each call of the disabled site.
    aim: bool,
    rng: u64,
    images: usize,
    on_crash: Option<Callback>,
}

/// Fences after a disabled site's call among which an aimed crash point is
/// drawn ([`SimMedia::aim_after_disabled`]).
pub const AIM_SPREAD: u64 = 8;

/// The crash-simulating media (see the module docs).
pub struct SimMedia {
    state: Mutex<State>,
}

impl std::fmt::Debug for SimMedia {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimMedia").finish_non_exhaustive()
    }
}

/// One step of the seeded splitmix64 generator behind every crash fate
/// (also `crashfs`'s).
pub(crate) fn next(rng: &mut u64) -> u64 {
    *rng = rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *rng;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The same seeded splitmix64 for crash harnesses' workloads: small,
/// seeded, and the same sequence on every platform.
#[derive(Debug, Clone)]
pub struct SplitMix(pub u64);

impl SplitMix {
    pub fn next_u64(&mut self) -> u64 {
        next(&mut self.0)
    }
    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }
    /// Uniform in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }
}

impl SimMedia {
    pub fn new(config: SimConfig) -> Self {
        SimMedia {
            state: Mutex::new(State {
                regions: HashMap::new(),
                next_id: 0,
                flushed: HashMap::new(),
                report: SimReport::default(),
                crash_before: config.crash_before,
                disabled: None,
                aim: false,
                rng: config.seed ^ 0x51ed_c0de,
                images: config.images_per_crash.max(1),
                on_crash: None,
            }),
        }
    }

    /// Sets the callback that receives each crash image. It runs inside the
    /// fence call, so it must not use this media.
    pub fn on_crash(&self, f: impl FnMut(CrashImage) + Send + 'static) {
        self.state.lock().on_crash = Some(Box::new(f));
    }

    /// Adds crash points (fence numbers).
    pub fn crash_before(&self, fences: impl IntoIterator<Item = u64>) {
        self.state.lock().crash_before.extend(fences);
    }

    /// Disables (or, with `None`, re-enables) every persist and fence of a site.
    pub fn disable(&self, site: Option<Site>) {
        self.state.lock().disabled = site;
    }

    /// With a site disabled: makes one of the [`AIM_SPREAD`] fences after
    /// each of its (skipped) fences a crash point, where its loss shows if
    /// it shows at all (a
    /// site called a few times in a long run is met by few crash points
    /// drawn at random). As `FileSim::aim_after_disabled` does for syncs.
    pub fn aim_after_disabled(&self, on: bool) {
        self.state.lock().aim = on;
    }

    /// The counters so far.
    pub fn report(&self) -> SimReport {
        self.state.lock().report.clone()
    }

    /// Fences executed so far.
    pub fn fences(&self) -> u64 {
        self.state.lock().report.fences
    }

    /// Takes a crash image now (as if the process died at this instant).
    pub fn image_now(&self) -> CrashImage {
        let mut s = self.state.lock();
        let fence = s.report.fences;
        materialise(&mut s, fence, Site("now"))
    }
}

fn line_of(s: &State, addr: usize) -> Option<(u32, usize, usize)> {
    s.regions
        .iter()
        .find(|(_, r)| addr >= r.base && addr < r.base + r.len)
        .map(|(&id, r)| (id, r.base, r.len))
}

fn materialise(s: &mut State, fence: u64, site: Site) -> CrashImage {
    let mut pending = 0;
    let mut ids: Vec<u32> = s.regions.keys().copied().collect();
    ids.sort_unstable();
    let mut regions = Vec::with_capacity(ids.len());
    for id in ids {
        let r = &s.regions[&id];
        let mut bytes = r.shadow.clone();
        let mut cur = vec![0u8; r.len];
        read_racy(r.base as *const u8, &mut cur);
        let name = r.name.clone();
        for line in 0..r.len.div_ceil(LINE) {
            let lo = line * LINE;
            let hi = (lo + LINE).min(r.len);
            let flushed = s.flushed.get(&(id, line)).copied();
            let differs = cur[lo..hi] != bytes[lo..hi]
                || flushed.is_some_and(|f| f[..hi - lo] != bytes[lo..hi]);
            if !differs {
                continue;
            }
            pending += 1;
            // The newer version a write-back may have carried: the current
            // content, or what a persist snapshotted.
            let newer: Vec<u8> = match flushed {
                Some(f) if next(&mut s.rng) & 1 == 0 => f[..hi - lo].to_vec(),
                _ => cur[lo..hi].to_vec(),
            };
            match next(&mut s.rng) % 3 {
                0 => bytes[lo..hi].copy_from_slice(&newer),
                1 => {}
                _ => {
                    let bits = next(&mut s.rng);
                    for (w, chunk) in (lo..hi).step_by(8).enumerate() {
                        if bits >> w & 1 == 1 {
                            let e = (chunk + 8).min(hi);
                            bytes[chunk..e].copy_from_slice(&newer[chunk - lo..e - lo]);
                        }
                    }
                }
            }
        }
        regions.push(ImageRegion { name, bytes });
    }
    s.report.crashes += 1;
    CrashImage {
        fence,
        site,
        pending_lines: pending,
        regions,
    }
}

impl Media for SimMedia {
    fn kind(&self) -> &'static str {
        "sim"
    }

    fn persist(&self, site: Site, addr: *const u8, len: usize) {
        let mut s = self.state.lock();
        s.report.by_site.entry(site).or_default().0 += 1;
        if s.disabled == Some(site) {
            s.report.skipped += 1;
            return;
        }
        s.report.persists += 1;
        if len == 0 {
            return;
        }
        let Some((id, base, rlen)) = line_of(&s, addr as usize) else {
            return;
        };
        let first = (addr as usize - base) / LINE;
        let last = (addr as usize - base + len - 1) / LINE;
        for line in first..=last {
            let lo = line * LINE;
            let hi = (lo + LINE).min(rlen);
            let mut buf = [0u8; LINE];
            read_racy((base + lo) as *const u8, &mut buf[..hi - lo]);
            s.flushed.insert((id, line), buf);
            s.report.persisted_lines += 1;
        }
    }

    fn fence(&self, site: Site) {
        let mut s = self.state.lock();
        s.report.by_site.entry(site).or_default().1 += 1;
        if s.disabled == Some(site) {
            s.report.skipped += 1;
            if s.aim {
                // One of the next few fences (drawn): a loss may show only
                // once what the site guarded is built on (an area handed
                // out, then named).
                let at = s.report.fences + next(&mut s.rng) % AIM_SPREAD;
                s.crash_before.insert(at);
            }
            return;
        }
        let n = s.report.fences;
        if s.crash_before.remove(&n) {
            for _ in 0..s.images {
                let image = materialise(&mut s, n, site);
                if let Some(mut cb) = s.on_crash.take() {
                    // The callback may be slow (it recovers a copy and checks
                    // it); the state lock is held, so this media is frozen.
                    cb(image);
                    s.on_crash = Some(cb);
                }
            }
        }
        let flushed = std::mem::take(&mut s.flushed);
        for ((id, line), content) in flushed {
            if let Some(r) = s.regions.get_mut(&id) {
                let lo = line * LINE;
                let hi = (lo + LINE).min(r.len);
                if lo < hi {
                    r.shadow[lo..hi].copy_from_slice(&content[..hi - lo]);
                }
            }
        }
        s.report.fences += 1;
    }

    fn attach(&self, name: &str, base: *mut u8, len: usize) -> u32 {
        let mut shadow = vec![0u8; len];
        read_racy(base, &mut shadow);
        let mut s = self.state.lock();
        let id = s.next_id;
        s.next_id += 1;
        s.regions.insert(
            id,
            SimRegion {
                name: name.to_string(),
                base: base as usize,
                len,
                shadow,
            },
        );
        id
    }

    fn grown(&self, id: u32, new_len: usize) {
        // The new bytes are zeros on the media already (ftruncate + fsync).
        if let Some(r) = self.state.lock().regions.get_mut(&id) {
            r.shadow.resize(new_len, 0);
            r.len = new_len;
        }
    }

    fn renamed(&self, id: u32, name: &str) {
        if let Some(r) = self.state.lock().regions.get_mut(&id) {
            r.name = name.to_string();
        }
    }

    fn detach(&self, id: u32) {
        let mut s = self.state.lock();
        s.regions.remove(&id);
        s.flushed.retain(|(r, _), _| *r != id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Region;
    use std::sync::atomic::Ordering;
    use std::sync::Arc;

    fn setup(crash: &[u64]) -> (tempfile::TempDir, Arc<SimMedia>, Region) {
        let dir = tempfile::tempdir().unwrap();
        let media = Arc::new(SimMedia::new(SimConfig {
            seed: 7,
            crash_before: crash.iter().copied().collect(),
            images_per_crash: 1,
        }));
        let r = Region::create(media.clone(), &dir.path().join("r"), 256).unwrap();
        (dir, media, r)
    }

    #[test]
    fn fenced_data_survives_unfenced_may_not() {
        let (_d, media, r) = setup(&[1]);
        let images = Arc::new(Mutex::new(Vec::new()));
        let sink = images.clone();
        media.on_crash(move |img| sink.lock().push(img));
        r.u64_at(0).store(11, Ordering::Release);
        r.persist(Site("a"), 0, 8);
        r.fence(Site("a")); // fence 0: durable
        r.u64_at(64).store(22, Ordering::Release); // never persisted
        r.u64_at(128).store(33, Ordering::Release);
        r.persist(Site("b"), 128, 8);
        r.fence(Site("b")); // crash just before fence 1
        let imgs = images.lock();
        assert_eq!(imgs.len(), 1);
        let img = &imgs[0];
        assert_eq!((img.fence, img.site, img.pending_lines), (1, Site("b"), 2));
        let b = &img.regions[0].bytes;
        assert_eq!(u64::from_le_bytes(b[0..8].try_into().unwrap()), 11);
        let w64 = u64::from_le_bytes(b[64..72].try_into().unwrap());
        assert!(w64 == 0 || w64 == 22);
        let rep = media.report();
        assert_eq!((rep.persists, rep.fences, rep.crashes), (2, 2, 1));
        assert_eq!(rep.by_site[&Site("b")], (1, 1));
    }

    #[test]
    fn pending_lines_take_every_fate_across_seeds() {
        // Over many seeds, a pending line is sometimes kept, sometimes
        // dropped, sometimes torn at 8-byte granularity.
        let (mut kept, mut dropped, mut torn) = (0, 0, 0);
        for seed in 0..200 {
            let dir = tempfile::tempdir().unwrap();
            let media = Arc::new(SimMedia::new(SimConfig {
                seed,
                crash_before: BTreeSet::new(),
                images_per_crash: 1,
            }));
            let r = Region::create(media.clone(), &dir.path().join("r"), 64).unwrap();
            for w in 0..8 {
                r.u64_at(w * 8).store(u64::MAX, Ordering::Release);
            }
            let img = media.image_now();
            let words: Vec<u64> = img.regions[0]
                .bytes
                .chunks(8)
                .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
                .collect();
            assert!(
                words.iter().all(|&w| w == 0 || w == u64::MAX),
                "8-byte atomic"
            );
            match words.iter().filter(|&&w| w == u64::MAX).count() {
                8 => kept += 1,
                0 => dropped += 1,
                _ => torn += 1,
            }
        }
        assert!(
            kept > 30 && dropped > 30 && torn > 30,
            "{kept} {dropped} {torn}"
        );
    }

    #[test]
    fn disabled_site_is_skipped_and_counted() {
        let (_d, media, r) = setup(&[]);
        media.disable(Some(Site("x")));
        r.u64_at(0).store(5, Ordering::Release);
        r.persist(Site("x"), 0, 8);
        r.fence(Site("y"));
        let img = media.image_now();
        assert_eq!(
            img.pending_lines, 1,
            "the skipped persist left the line pending"
        );
        assert_eq!(media.report().skipped, 1);
        media.disable(None);
        r.persist(Site("x"), 0, 8);
        r.fence(Site("y"));
        assert_eq!(media.image_now().pending_lines, 0);
    }

    #[test]
    fn growth_extends_the_shadow_with_zeros() {
        let (_d, media, r) = setup(&[]);
        r.grow(4096).unwrap();
        r.u64_at(4000).store(9, Ordering::Release);
        r.persist(Site("g"), 4000, 8);
        r.fence(Site("g"));
        let img = media.image_now();
        assert_eq!(img.regions[0].bytes.len(), 4096);
        assert_eq!(img.pending_lines, 0);
        assert_eq!(img.regions[0].bytes[4000], 9);
    }
}
