//! The memory node's backing file: regions and flushed bytes survive a
//! restart; a damaged file is a typed error at start; and under the crash
//! simulator every state at every fence of a workload reopens to what was
//! acknowledged (creates, drops, FLUSHes), never to a stale region's bytes,
//! while disabling any one persistence site is caught.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use vectide_remote::backing::{
    self, Backing, SITE_CATALOG, SITE_FLUSH, SITE_PUBLISH, SITE_SUPER, SITE_ZERO,
};
use vectide_remote::{Completion, MemoryNode, NodeLimits, RegionInfo, Regions, RemoteMemory, Verb};
use vectide_storage::media::{CrashImage, Media, MsyncMedia, SimConfig, SimMedia};
use vectide_storage::region::Site;

fn msync() -> Arc<dyn Media> {
    Arc::new(MsyncMedia::new())
}

fn open(path: &std::path::Path, media: Arc<dyn Media>, cap: u64) -> vectide_core::Result<Regions> {
    let (b, restored) = Backing::open_or_create(path, media)?;
    Regions::backed(cap, b, restored)
}

fn write(r: &Regions, id: u32, offset: u64, bytes: &[u8]) {
    let c = r.execute(&[Verb::Write {
        region: id,
        offset,
        bytes: bytes.to_vec(),
    }]);
    assert_eq!(c, vec![Completion::Done]);
}

fn flush(r: &Regions, id: u32, offset: u64, len: u64) {
    let c = r.execute(&[Verb::Flush {
        region: id,
        offset,
        len,
        site: SITE_FLUSH,
    }]);
    assert_eq!(c, vec![Completion::Done]);
}

fn read(r: &Regions, id: u32, len: u32) -> Vec<u8> {
    match r
        .execute(&[Verb::Read {
            region: id,
            offset: 0,
            len,
        }])
        .pop()
    {
        Some(Completion::Data(d)) => d,
        c => panic!("{c:?}"),
    }
}

fn pattern(seed: u8, n: usize) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) | 1)
        .collect()
}

#[test]
fn regions_and_flushed_bytes_survive_a_restart_and_ids_are_not_reused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("node.vtb");
    let r = open(&path, msync(), 1 << 20).unwrap();
    let a = r.create("a", 5000).unwrap();
    let b = r.create("b", 4096).unwrap();
    write(&r, a.id, 100, &pattern(1, 4000));
    flush(&r, a.id, 100, 4000);
    write(&r, b.id, 0, &pattern(2, 4096));
    flush(&r, b.id, 0, 4096);
    // CAS and FETCH_ADD act on the mapping like on the heap.
    let c = r.execute(&[
        Verb::FetchAdd {
            region: b.id,
            offset: 8,
            add: 5,
        },
        Verb::Flush {
            region: b.id,
            offset: 0,
            len: 16,
            site: SITE_FLUSH,
        },
    ]);
    let before = u64::from_le_bytes(pattern(2, 16)[8..16].try_into().unwrap());
    assert_eq!(c, vec![Completion::Word(before), Completion::Done]);
    r.drop_region("b").unwrap();
    drop(r);
    let r = open(&path, msync(), 1 << 20).unwrap();
    assert_eq!(
        r.list(),
        vec![RegionInfo {
            name: "a".into(),
            id: a.id,
            size: 5000
        }]
    );
    let got = read(&r, a.id, 5000);
    assert_eq!(&got[100..4100], &pattern(1, 4000)[..]);
    assert!(got[..100].iter().chain(&got[4100..]).all(|&x| x == 0));
    // A new region after the restart: a new id, b's old bytes zeroed.
    let c = r.create("c", 4096).unwrap();
    assert!(c.id > b.id, "ids are never reused: {} after {}", c.id, b.id);
    assert!(read(&r, c.id, 4096).iter().all(|&x| x == 0));
    // The node's size still bounds the regions kept.
    drop(r);
    let e = open(&path, msync(), 6000).err().unwrap().to_string();
    assert!(e.contains("more than the node's size"), "{e}");
    // The catalog holds 256 regions.
    let r = open(&path, msync(), 1 << 30).unwrap();
    for i in 0..backing::SLOTS - 2 {
        r.create(&format!("r{i}"), 8).unwrap();
    }
    let e = r.create("one-too-many", 8).unwrap_err().to_string();
    assert!(e.contains("catalog is full"), "{e}");
}

#[test]
fn a_damaged_backing_file_is_a_typed_error_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("node.vtb");
    {
        let r = open(&path, msync(), 1 << 20).unwrap();
        r.create("a", 4096).unwrap();
        r.create("b", 4096).unwrap();
    }
    let good = std::fs::read(&path).unwrap();
    let slot = |i: usize| backing::CATALOG_AT + i * backing::SLOT_BYTES;
    type Damage = Box<dyn Fn(&mut Vec<u8>)>;
    let cases: Vec<(&str, Damage)> = vec![
        ("bad magic", Box::new(|b| b[0] ^= 1)),
        ("checksum does not match", Box::new(|b| b[13] ^= 1)),
        ("state word", Box::new(move |b| b[slot(0)] ^= 1)),
        (
            "checksum does not match",
            Box::new(move |b| b[slot(1) + 17] ^= 1),
        ),
        ("shorter than its catalog", Box::new(|b| b.truncate(1000))),
        (
            "outside the file",
            Box::new(move |b| {
                let len = b.len();
                b.truncate(len - 4096);
            }),
        ),
        (
            "overlap",
            Box::new(move |b| {
                // Slot 1 moved onto slot 0's bytes, its checksum made good.
                let mut s = backing::decode_slot(&b[slot(1)..slot(2)]).unwrap().unwrap();
                s.offset = backing::decode_slot(&b[slot(0)..slot(1)])
                    .unwrap()
                    .unwrap()
                    .offset;
                b[slot(1)..slot(2)].copy_from_slice(&backing::encode_slot(&s));
            }),
        ),
    ];
    for (want, damage) in cases {
        let mut bytes = good.clone();
        damage(&mut bytes);
        std::fs::write(&path, &bytes).unwrap();
        let e = open(&path, msync(), 1 << 20).err().map(|e| e.to_string());
        assert!(
            e.as_deref()
                .is_some_and(|e| e.contains(want) && e.contains("node.vtb")),
            "{want}: {e:?}"
        );
    }
    let mut v2 = good.clone();
    v2[8..12].copy_from_slice(&2u32.to_le_bytes());
    let crc = crc32fast::hash(&v2[..24]);
    v2[24..28].copy_from_slice(&crc.to_le_bytes());
    std::fs::write(&path, &v2).unwrap();
    assert!(matches!(
        open(&path, msync(), 1 << 20).err(),
        Some(vectide_core::Error::Version { found: 2, .. })
    ));
    std::fs::write(&path, &good).unwrap();
    assert_eq!(open(&path, msync(), 1 << 20).unwrap().list().len(), 2);
}

/// What the workload acknowledged: each step with the fence count when it
/// began and when it returned (a crash before fence `f` saw the steps that
/// returned by `f` whole and the one under way at `f` either way), and what
/// each region must hold once its FLUSH returned.
struct Log {
    steps: Vec<(u64, u64, Step)>,
}

#[derive(Clone)]
enum Step {
    Created(&'static str),
    Dropped(&'static str),
    /// Region, offset, the bytes flushed there.
    Flushed(&'static str, usize, Vec<u8>),
}

const SIZE: usize = 6000;

// Names longer than 24 bytes: a slot's fields then reach past the cache
// line of its state word, so persisting the state word alone does not
// carry them (the catalog site's mutation check depends on it).
const A: &str = "region-a-with-a-long-name-0123456789";
const B: &str = "region-b-with-a-long-name-0123456789";
const C: &str = "region-c-with-a-long-name-0123456789";
const D: &str = "region-d-with-a-long-name-0123456789";

/// The workload: regions created, written, flushed, dropped, and a new
/// region placed in a dropped one's bytes (which must read as zeros, never
/// as the old region's).
fn workload(r: &Regions, media: &SimMedia) -> Log {
    let mut log = Log { steps: Vec::new() };
    let mut began = media.fences();
    let mut step = |s: Step| {
        let now = media.fences();
        log.steps.push((began, now, s));
        began = now;
    };
    let a = r.create(A, SIZE as u64).unwrap();
    step(Step::Created(A));
    let b = r.create(B, 4096).unwrap();
    step(Step::Created(B));
    write(r, a.id, 0, &pattern(1, SIZE));
    flush(r, a.id, 0, SIZE as u64);
    step(Step::Flushed(A, 0, pattern(1, SIZE)));
    write(r, b.id, 0, &pattern(2, 4096));
    r.drop_region(A).unwrap();
    step(Step::Dropped(A));
    let c = r.create(C, SIZE as u64).unwrap();
    step(Step::Created(C));
    write(r, c.id, 0, &pattern(3, SIZE));
    flush(r, c.id, 0, SIZE as u64);
    step(Step::Flushed(C, 0, pattern(3, SIZE)));
    let d = r.create(D, 3 << 20).unwrap();
    step(Step::Created(D));
    write(r, d.id, 1 << 20, &pattern(4, 4096));
    flush(r, d.id, 1 << 20, 4096);
    step(Step::Flushed(D, 1 << 20, pattern(4, 4096)));
    log
}

/// Checks one crash image against the log; returns the violations.
fn check(img: &CrashImage, log: &Log, dir: &std::path::Path) -> Vec<String> {
    // The image's file under the name it had then (the simulator follows
    // the rename): the file is made as a temporary and renamed into place
    // right after its first fence, so a crash before that fence leaves only
    // the temporary, and the node starts afresh.
    let dir = dir.join(format!("img-{}-{}", img.fence, img.pending_lines));
    std::fs::create_dir_all(&dir).unwrap();
    let name = &img.regions[0].name;
    assert!(name == "node.vtb" || name == "node.vtb.tmp", "{name}");
    std::fs::write(dir.join(name), &img.regions[0].bytes).unwrap();
    let r = match open(&dir.join("node.vtb"), msync(), 1 << 30) {
        Ok(r) => r,
        Err(e) => return vec![format!("fence {}: does not open: {e}", img.fence)],
    };
    let live: BTreeMap<String, RegionInfo> =
        r.list().into_iter().map(|i| (i.name.clone(), i)).collect();
    let mut bad = Vec::new();
    let mut must: BTreeMap<&str, bool> = BTreeMap::new();
    let mut content: BTreeMap<&str, (usize, &[u8])> = BTreeMap::new();
    for (began, done_at, s) in &log.steps {
        if *done_at > img.fence {
            // Under way at the crash: its region may be either way.
            if *began <= img.fence {
                if let Step::Created(n) | Step::Dropped(n) = s {
                    must.remove(n);
                }
            }
            break;
        }
        match s {
            Step::Created(n) => {
                must.insert(n, true);
            }
            Step::Dropped(n) => {
                must.insert(n, false);
                content.remove(n);
            }
            Step::Flushed(n, at, bytes) => {
                content.insert(n, (*at, bytes));
            }
        }
    }
    for (n, &there) in &must {
        if live.contains_key(*n) != there {
            bad.push(format!(
                "fence {} ({}): region {n} {}",
                img.fence,
                img.site.0,
                if there { "lost" } else { "back" }
            ));
        }
    }
    for (n, info) in &live {
        let got = read(&r, info.id, info.size as u32);
        if let Some((at, want)) = content.get(n.as_str()) {
            if got.get(*at..at + want.len()) != Some(want) {
                bad.push(format!(
                    "fence {}: region {n} lost flushed bytes",
                    img.fence
                ));
            }
        }
        // Every 8-byte word of c is zero or c's own: never a's old bytes.
        if n == C {
            let own = pattern(3, SIZE);
            let stale = got
                .chunks(8)
                .zip(own.chunks(8))
                .any(|(g, o)| g.iter().any(|&x| x != 0) && g != o);
            if stale {
                bad.push(format!(
                    "fence {}: region c shows another region's bytes",
                    img.fence
                ));
            }
        }
    }
    bad
}

/// Runs the workload with a crash image before every fence (4 draws each)
/// and `disabled` switched off; returns (images, violations).
fn crash_run(disabled: Option<Site>) -> (usize, Vec<String>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("node.vtb");
    // Fence numbers are known only after a dry run.
    let fences = {
        let media = Arc::new(SimMedia::new(SimConfig::default()));
        let r = open(&path, media.clone(), 1 << 30).unwrap();
        workload(&r, &media);
        drop(r);
        std::fs::remove_file(&path).unwrap();
        media.fences()
    };
    let media = Arc::new(SimMedia::new(SimConfig {
        seed: 7,
        crash_before: (0..=fences).collect(),
        images_per_crash: 4,
    }));
    let images = Arc::new(Mutex::new(Vec::new()));
    {
        let images = Arc::clone(&images);
        media.on_crash(move |img| images.lock().unwrap().push(img));
    }
    media.disable(disabled);
    let r = open(&path, media.clone(), 1 << 30).unwrap();
    let log = workload(&r, &media);
    let mut all = std::mem::take(&mut *images.lock().unwrap());
    all.push(media.image_now());
    drop(r);
    let out = tempfile::tempdir().unwrap();
    let bad: Vec<String> = all
        .iter()
        .flat_map(|img| check(img, &log, out.path()))
        .collect();
    (all.len(), bad)
}

#[test]
fn every_crash_state_reopens_to_what_was_acknowledged() {
    let (images, bad) = crash_run(None);
    assert!(images >= 40, "{images} images");
    assert!(
        bad.is_empty(),
        "{} violations: {:?}",
        bad.len(),
        &bad[..bad.len().min(5)]
    );
}

#[test]
fn the_mutation_check_finds_every_persistence_site() {
    for site in [
        SITE_SUPER,
        SITE_ZERO,
        SITE_CATALOG,
        SITE_PUBLISH,
        SITE_FLUSH,
    ] {
        let (_, bad) = crash_run(Some(site));
        assert!(!bad.is_empty(), "disabling {} went unnoticed", site.0);
    }
}

#[test]
fn a_memory_node_restarted_on_its_backing_file_serves_what_it_flushed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("node.vtb");
    // A stopped node's connection threads let go of the file (its lock)
    // a moment after the node is dropped: a restart waits for that.
    let reopen = || {
        let t = std::time::Instant::now();
        loop {
            match open(&path, msync(), 1 << 24) {
                Ok(r) => return r,
                Err(e) if e.to_string().contains("in use") && t.elapsed().as_secs() < 10 => {
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                Err(e) => panic!("{e}"),
            }
        }
    };
    let start =
        || MemoryNode::serve("127.0.0.1:0", Arc::new(reopen()), NodeLimits::default()).unwrap();
    let node = start();
    let mem =
        vectide_remote::TcpMemory::connect(&node.addr().to_string(), Default::default()).unwrap();
    let reg = mem.create_region("kept", 1 << 16).unwrap();
    mem.write(reg, 64, &pattern(9, 1000)).unwrap();
    mem.cas(reg, 0, 0, 42).unwrap();
    mem.flush(reg, 0, 1064).unwrap();
    assert!(mem.flush(reg, 1 << 16, 1).is_err(), "out of bounds");
    drop(mem);
    drop(node);
    let node = start();
    let mem =
        vectide_remote::TcpMemory::connect(&node.addr().to_string(), Default::default()).unwrap();
    let again = mem.open_region("kept").unwrap();
    assert_eq!(again, reg, "the same id and size");
    assert_eq!(mem.read(again, 64, 1000).unwrap(), pattern(9, 1000));
    assert_eq!(mem.read(again, 0, 8).unwrap(), 42u64.to_le_bytes().to_vec());
}

#[test]
fn a_second_memory_node_on_the_same_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("node.vtb");
    let first = open(&path, msync(), 1 << 20).unwrap();
    let e = open(&path, msync(), 1 << 20).err().unwrap().to_string();
    assert!(e.contains("in use by another memory node"), "{e}");
    drop(first);
    assert!(
        open(&path, msync(), 1 << 20).is_ok(),
        "free again once closed"
    );
}
