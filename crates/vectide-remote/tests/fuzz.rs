//! Fuzz targets of the memory node's backing-file parsers (proptest,
//! `docs/format-memnode-backing.md`): a catalog slot decoded from arbitrary
//! bytes, and from a valid slot with random bytes overwritten; a real
//! backing file damaged at random offsets of its superblock and catalog,
//! and one given forged slots whose checksums are good. Each answers what
//! an independent model of the format says (`Ok` with exactly the slots it
//! lists, or a typed corruption or version error), never a panic and never
//! a hang; a file it accepts has every region inside the file, page-aligned,
//! apart from the others, under a unique id and name, and serves it.

use proptest::prelude::*;
use std::path::Path;
use std::sync::{mpsc, Arc, OnceLock};
use std::time::Duration;
use vectide_core::Error;
use vectide_remote::backing::{
    self, Backing, Slot, ALIGN, CATALOG_AT, DATA_AT, MAGIC, SLOTS, SLOT_BYTES, VERSION,
};
use vectide_remote::{Completion, Regions, Verb};
use vectide_storage::media::{Media, MsyncMedia};

/// The catalog's bytes in the file.
const CATALOG_END: usize = CATALOG_AT + SLOTS * SLOT_BYTES;
/// Where the next-id and boot words are in the superblock.
const NEXT_ID_AT: usize = 64;
const BOOT_AT: usize = 72;
/// A live slot's state word.
const LIVE: &[u8; 8] = b"LIVEREGN";
/// An open that takes longer than this is a hang.
const HANG: Duration = Duration::from_secs(30);

fn msync() -> Arc<dyn Media> {
    Arc::new(MsyncMedia::new())
}

/// A slot's checksum as the format defines it: bytes 8..32 and the name.
fn slot_crc(b: &[u8], name_len: usize) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&b[8..32]);
    h.update(&b[40..40 + name_len]);
    h.finalize()
}

fn pattern(seed: u8, n: usize) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) | 1)
        .collect()
}

/// A real backing file, closed: regions `a`, `d` (in the bytes `b` left)
/// and one with a long name live, each written and flushed with its own
/// pattern; slot 2 (region `c`, dropped) free with its old fields.
struct Pristine {
    bytes: Vec<u8>,
    /// Name, id, the pattern seed its bytes hold.
    regions: Vec<(String, u32, u8)>,
}

const LONG: &str = "a-region-with-a-name-of-two-hundred-bytes-";

fn pristine() -> &'static Pristine {
    static P: OnceLock<Pristine> = OnceLock::new();
    P.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("node.vtb");
        let (b, restored) = Backing::open_or_create(&path, msync()).unwrap();
        let r = Regions::backed(1 << 24, b, restored).unwrap();
        let long = format!("{LONG}{}", "x".repeat(200 - LONG.len()));
        let mut regions = Vec::new();
        let mut put = |r: &Regions, name: &str, size: u64, seed: u8| {
            let info = r.create(name, size).unwrap();
            let c = r.execute(&[
                Verb::Write {
                    region: info.id,
                    offset: 0,
                    bytes: pattern(seed, size as usize),
                },
                Verb::Flush {
                    region: info.id,
                    offset: 0,
                    len: size,
                    site: backing::SITE_FLUSH,
                },
            ]);
            assert_eq!(c, vec![Completion::Done, Completion::Done]);
            regions.push((name.to_string(), info.id, seed));
        };
        put(&r, "a", 5000, 1);
        r.create("b", 4096).unwrap();
        r.create("c", 100).unwrap();
        r.drop_region("b").unwrap();
        put(&r, "d", 3000, 2);
        put(&r, &long, 9000, 3);
        r.drop_region("c").unwrap();
        drop(r);
        let bytes = std::fs::read(&path).unwrap();
        // The layout the fuzzing below aims at: slots 0, 1 and 3 live.
        let live: Vec<usize> = (0..SLOTS)
            .filter(|&i| &bytes[CATALOG_AT + i * SLOT_BYTES..][..8] == LIVE)
            .collect();
        assert_eq!(live, vec![0, 1, 3]);
        Pristine { bytes, regions }
    })
}

/// What opening `bytes` must give, by the format alone.
#[derive(Debug, PartialEq)]
enum Expect {
    Corrupted,
    Version(u32),
    Opened {
        slots: Vec<(usize, Slot)>,
        next_id: u32,
        boot: u64,
    },
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

/// The model: the checks of "Checks at start", in their order.
fn expect(b: &[u8]) -> Expect {
    if (b.len() as u64) < DATA_AT {
        return Expect::Corrupted;
    }
    if &b[..8] != MAGIC || u32_at(b, 24) != crc32fast::hash(&b[..24]) {
        return Expect::Corrupted;
    }
    if u32_at(b, 8) != VERSION {
        return Expect::Version(u32_at(b, 8));
    }
    let shape = (u32_at(b, 12), u32_at(b, 16), u32_at(b, 20));
    if shape != (SLOTS as u32, SLOT_BYTES as u32, CATALOG_AT as u32) {
        return Expect::Corrupted;
    }
    let mut slots = Vec::new();
    for i in 0..SLOTS {
        let s = &b[CATALOG_AT + i * SLOT_BYTES..][..SLOT_BYTES];
        if u64_at(s, 0) == 0 {
            continue;
        }
        if &s[..8] != LIVE {
            return Expect::Corrupted;
        }
        let (id, name_len) = (u32_at(s, 8), u32_at(s, 12) as usize);
        let (offset, size) = (u64_at(s, 16), u64_at(s, 24));
        if name_len == 0 || name_len > 255 || u32_at(s, 32) != slot_crc(s, name_len) {
            return Expect::Corrupted;
        }
        let Ok(name) = std::str::from_utf8(&s[40..40 + name_len]) else {
            return Expect::Corrupted;
        };
        if id == 0 || size == 0 {
            return Expect::Corrupted;
        }
        let inside = offset >= DATA_AT
            && offset % ALIGN == 0
            && offset
                .checked_add(size)
                .is_some_and(|e| e <= b.len() as u64);
        if !inside {
            return Expect::Corrupted;
        }
        slots.push((
            i,
            Slot {
                id,
                name: name.to_string(),
                offset,
                size,
            },
        ));
    }
    for (x, (_, s)) in slots.iter().enumerate() {
        for (_, t) in &slots[x + 1..] {
            let apart = s.offset + s.size <= t.offset || t.offset + t.size <= s.offset;
            if !apart || s.id == t.id || s.name == t.name {
                return Expect::Corrupted;
            }
        }
    }
    let max_id = slots.iter().map(|(_, s)| s.id).max().unwrap_or(0);
    let stored = u64_at(b, NEXT_ID_AT).min(u64::from(u32::MAX)) as u32;
    Expect::Opened {
        next_id: stored.max(max_id.saturating_add(1)).max(1),
        boot: u64_at(b, BOOT_AT).wrapping_add(1).max(1),
        slots,
    }
}

/// What an open gave: the restored slots, next id and boot, and each
/// region's bytes as the regions on the file serve them.
#[derive(Debug)]
struct Opened {
    slots: Vec<(usize, Slot)>,
    next_id: u32,
    boot: u64,
    contents: Vec<(String, Vec<u8>)>,
    /// The id a region created afterwards got, or the error.
    created: std::result::Result<u32, String>,
}

/// Opens `path` as a memory node does, serves every region it lists (a
/// full READ of each) and creates one more; in a thread, so that a hang is
/// a failure rather than a stuck test.
fn open_watched(path: &Path) -> vectide_core::Result<Opened> {
    let path = path.to_path_buf();
    let (tx, rx) = mpsc::channel();
    let worker = std::thread::spawn(move || {
        let run = || -> vectide_core::Result<Opened> {
            let (b, restored) = Backing::open(&path, msync())?;
            let (slots, next_id, boot) = (restored.slots.clone(), restored.next_id, restored.boot);
            let r = Regions::backed(1 << 30, b, restored)?;
            let mut contents = Vec::new();
            for info in r.list() {
                let c = r.execute(&[Verb::Read {
                    region: info.id,
                    offset: 0,
                    len: info.size as u32,
                }]);
                match &c[..] {
                    [Completion::Data(d)] => contents.push((info.name, d.clone())),
                    c => panic!("region {info:?}: {c:?}"),
                }
            }
            let created = r
                .create("created-after-open", 4096)
                .map(|i| i.id)
                .map_err(|e| e.to_string());
            Ok(Opened {
                slots,
                next_id,
                boot,
                contents,
                created,
            })
        };
        let _ = tx.send(run());
    });
    match rx.recv_timeout(HANG) {
        Ok(r) => {
            worker.join().unwrap();
            r
        }
        Err(mpsc::RecvTimeoutError::Disconnected) => match worker.join() {
            Err(p) => std::panic::resume_unwind(p),
            Ok(()) => unreachable!("the worker always sends"),
        },
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("opening a damaged file hung"),
    }
}

/// Writes `bytes` as a backing file, opens it and checks the outcome
/// against the model: the same error kind, or the same slots, next id and
/// boot, every region inside the file and apart, served with the bytes
/// the file holds there; a region created afterwards gets a new id.
fn check_open(bytes: &[u8]) -> std::result::Result<(), TestCaseError> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("node.vtb");
    std::fs::write(&path, bytes).unwrap();
    let want = expect(bytes);
    let got = open_watched(&path);
    let (slots, next_id, boot, opened) = match (want, got) {
        (Expect::Corrupted, Err(Error::Corrupted(m))) => {
            prop_assert!(m.contains("node.vtb"), "the error names the file: {m}");
            return Ok(());
        }
        (Expect::Version(v), Err(Error::Version { found, supported })) => {
            prop_assert_eq!((found, supported), (v, VERSION));
            return Ok(());
        }
        (
            Expect::Opened {
                slots,
                next_id,
                boot,
            },
            Ok(o),
        ) => (slots, next_id, boot, o),
        (want, got) => {
            return Err(TestCaseError::fail(format!(
                "the model says {want:?}, the open gave {got:?}"
            )))
        }
    };
    prop_assert_eq!(&opened.slots, &slots);
    prop_assert_eq!((opened.next_id, opened.boot), (next_id, boot));
    // The invariants on their own (the model could share a mistake).
    let len = bytes.len() as u64;
    let mut seen_ids = std::collections::BTreeSet::new();
    let mut seen_names = std::collections::BTreeSet::new();
    let mut spans = Vec::new();
    for (_, s) in &opened.slots {
        prop_assert!(s.offset >= DATA_AT && s.offset % ALIGN == 0, "{s:?}");
        prop_assert!(s.offset + s.size <= len, "{s:?} beyond {len}");
        prop_assert!(seen_ids.insert(s.id) && seen_names.insert(s.name.clone()));
        prop_assert!(next_id > s.id);
        spans.push((s.offset, s.size));
    }
    spans.sort_unstable();
    prop_assert!(spans.windows(2).all(|w| w[0].0 + w[0].1 <= w[1].0));
    // Each region is served with the file's bytes at its offset.
    prop_assert_eq!(opened.contents.len(), opened.slots.len());
    for (name, got) in &opened.contents {
        let s = &opened
            .slots
            .iter()
            .find(|(_, s)| &s.name == name)
            .unwrap()
            .1;
        let at = s.offset as usize;
        prop_assert!(got[..] == bytes[at..at + s.size as usize], "region {name}");
    }
    // A new region takes a new id (or the ids ran out).
    match &opened.created {
        Ok(id) => prop_assert!(*id == next_id && !seen_ids.contains(id), "{id}"),
        Err(e) => prop_assert!(next_id == u32::MAX && e.contains("ran out"), "{e}"),
    }
    // The start was counted, durably.
    let after = std::fs::read(&path).unwrap();
    prop_assert_eq!(u64_at(&after, BOOT_AT), boot);
    Ok(())
}

fn valid_slot() -> impl Strategy<Value = Slot> {
    (1u32.., "[a-z0-9._~é€-]{1,85}", any::<u64>(), 1u64..).prop_map(|(id, name, offset, size)| {
        Slot {
            id,
            name,
            offset,
            size,
        }
    })
}

/// Offsets the damage goes to: mostly the superblock's fields and the
/// slots in use, sometimes anywhere in the superblock and catalog.
fn damage_at() -> impl Strategy<Value = usize> {
    prop_oneof![
        0usize..80,
        0usize..CATALOG_AT,
        CATALOG_AT..CATALOG_AT + 4 * SLOT_BYTES,
        CATALOG_AT..CATALOG_END,
    ]
}

/// A forged slot: fields from small spaces so that ids, names and byte
/// ranges collide with the live regions' (and with each other) often, and
/// are often all good: in a free slot, on the file's free page (3) or in
/// pages it grew by (7..), under a fresh id and name; each check of the
/// open is then what one bad field runs into.
fn forged() -> impl Strategy<Value = (usize, Slot)> {
    let page = prop_oneof![Just(3u64), 7u64..13];
    let offset = prop_oneof![
        8 => page.clone().prop_map(|p| DATA_AT + p * ALIGN),
        2 => (page, 1u64..ALIGN).prop_map(|(p, o)| DATA_AT + p * ALIGN + o),
        2 => (0u64..12).prop_map(|p| DATA_AT + p * ALIGN),
        1 => (0u64..DATA_AT / ALIGN).prop_map(|p| p * ALIGN),
        1 => 0u64..DATA_AT,
        1 => any::<u64>(),
    ];
    let size = prop_oneof![
        6 => 1u64..ALIGN,
        1 => Just(0),
        2 => (1u64..4).prop_map(|p| p * ALIGN),
        1 => any::<u64>(),
    ];
    (
        prop_oneof![4 => Just(2usize), 4 => 4usize..8, 1 => 0usize..SLOTS],
        prop_oneof![6 => 6u32..40, 1 => Just(0), 2 => 1u32..8, 1 => any::<u32>()],
        prop_oneof![6 => "[a-z]{1,3}", 1 => Just("a".to_string()), 1 => Just("d".to_string())],
        offset,
        size,
    )
        .prop_map(|(i, id, name, offset, size)| {
            (
                i,
                Slot {
                    id,
                    name,
                    offset,
                    size,
                },
            )
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Arbitrary bytes, some made to look like a live slot (state word,
    /// a short name, even a good checksum) so that the later checks run.
    #[test]
    fn arbitrary_slot_bytes_never_panic(
        mut bytes in proptest::collection::vec(any::<u8>(), 0..400),
        live in any::<bool>(),
        name_len in prop_oneof![1 => Just(None), 2 => (0u32..8).prop_map(Some), 1 => (0u32..300).prop_map(Some)],
        ascii_name in any::<bool>(),
        good_crc in any::<bool>(),
    ) {
        if live && bytes.len() >= 8 {
            bytes[..8].copy_from_slice(LIVE);
        }
        if let (Some(n), true) = (name_len, bytes.len() >= 16) {
            bytes[12..16].copy_from_slice(&n.to_le_bytes());
            let n = n as usize;
            if ascii_name && 40 + n <= bytes.len() {
                for x in &mut bytes[40..40 + n] {
                    *x = b'a' + *x % 26;
                }
            }
            if good_crc && n >= 1 && 40 + n <= bytes.len() {
                let crc = slot_crc(&bytes, n);
                bytes[32..36].copy_from_slice(&crc.to_le_bytes());
            }
        }
        match backing::decode_slot(&bytes) {
            Ok(None) => prop_assert!(bytes.len() >= 8 && bytes[..8] == [0; 8]),
            Ok(Some(s)) => {
                prop_assert!(s.id != 0 && s.size != 0);
                prop_assert!(!s.name.is_empty() && s.name.len() <= 255);
                // What was decoded encodes back to the bytes it came from
                // (all but the 4 unused bytes after the checksum).
                let n = 40 + s.name.len();
                let e = backing::encode_slot(&s);
                prop_assert!(e[..36] == bytes[..36] && e[40..n] == bytes[40..n]);
            }
            Err(e) => prop_assert!(matches!(e, Error::Corrupted(_)), "{e:?}"),
        }
    }

    #[test]
    fn slots_round_trip(s in valid_slot()) {
        prop_assert_eq!(backing::decode_slot(&backing::encode_slot(&s)).unwrap(), Some(s));
    }

    /// A valid slot with 1 to 4 bytes overwritten: the slot itself when
    /// only bytes no check covers changed (the 4 after the checksum, the
    /// name's unused room), `None` when the state word became 0, and a
    /// corruption error for any other change.
    #[test]
    fn damaged_slots_are_rejected_unless_untouched(
        s in valid_slot(),
        at in proptest::collection::vec((0usize..SLOT_BYTES, any::<u8>()), 1..5),
    ) {
        let good = backing::encode_slot(&s);
        let mut b = good;
        for (i, v) in at {
            b[i] = v;
        }
        let changed: Vec<usize> = (0..SLOT_BYTES).filter(|&i| b[i] != good[i]).collect();
        let covered = |i: usize| i < 36 || (40..40 + s.name.len()).contains(&i);
        let got = backing::decode_slot(&b);
        if !changed.iter().any(|&i| covered(i)) {
            prop_assert_eq!(got.unwrap(), Some(s));
        } else if b[..8] == [0; 8] {
            prop_assert_eq!(got.unwrap(), None);
        } else {
            prop_assert!(matches!(got, Err(Error::Corrupted(_))), "{changed:?}: {got:?}");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// The real file with 1 to 4 random bytes of its superblock and catalog
    /// overwritten.
    #[test]
    fn damaged_backing_files_open_as_the_format_says(
        at in proptest::collection::vec((damage_at(), any::<u8>()), 1..5),
    ) {
        let p = pristine();
        let mut b = p.bytes.clone();
        for (i, v) in at {
            b[i] = v;
        }
        check_open(&b)?;
        // Untouched regions keep their bytes: every region the damaged file
        // still lists under its old name and id holds its pattern.
        if let Expect::Opened { slots, .. } = expect(&b) {
            for (name, id, seed) in &p.regions {
                if let Some((_, s)) = slots.iter().find(|(_, s)| &s.name == name && s.id == *id) {
                    let at = s.offset as usize;
                    prop_assert!(b[at..at + s.size as usize] == pattern(*seed, s.size as usize)[..]);
                }
            }
        }
    }

    /// Forged slots with good checksums (overlapping, outside the file,
    /// off a page, sharing an id or a name), a superblock of another
    /// version or shape with a good checksum, a damaged next-id or boot
    /// word, and the file cut short or grown.
    #[test]
    fn forged_catalogs_open_as_the_format_says(
        slots in proptest::collection::vec(forged(), 0..3),
        version in prop_oneof![8 => Just(VERSION), 1 => any::<u32>()],
        shape in prop_oneof![8 => Just(None), 1 => (0usize..3, any::<u32>()).prop_map(Some)],
        next_id in prop_oneof![Just(None), any::<u64>().prop_map(Some)],
        boot in prop_oneof![Just(None), any::<u64>().prop_map(Some)],
        len in prop_oneof![
            2 => Just(None),
            4 => (0usize..6 * ALIGN as usize).prop_map(Some),
            1 => (0usize..200_000).prop_map(Some),
        ],
    ) {
        let p = pristine();
        let mut b = p.bytes.clone();
        for (i, s) in &slots {
            b[CATALOG_AT + i * SLOT_BYTES..][..SLOT_BYTES].copy_from_slice(&backing::encode_slot(s));
        }
        b[8..12].copy_from_slice(&version.to_le_bytes());
        if let Some((f, v)) = shape {
            b[12 + 4 * f..16 + 4 * f].copy_from_slice(&v.to_le_bytes());
        }
        let crc = crc32fast::hash(&b[..24]);
        b[24..28].copy_from_slice(&crc.to_le_bytes());
        if let Some(n) = next_id {
            b[NEXT_ID_AT..NEXT_ID_AT + 8].copy_from_slice(&n.to_le_bytes());
        }
        if let Some(n) = boot {
            b[BOOT_AT..BOOT_AT + 8].copy_from_slice(&n.to_le_bytes());
        }
        if let Some(n) = len {
            // Small: grown by that many bytes; large: cut (or grown) to it.
            let n = if n < 6 * ALIGN as usize { b.len() + n } else { n };
            b.resize(n, 0);
        }
        check_open(&b)?;
    }
}
