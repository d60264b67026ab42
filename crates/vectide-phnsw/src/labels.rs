//! The persistent label → node map (`labels-<gen>.vtdp`).
//!
//! An open-addressing table of 16-byte buckets `{label: u64, value: u64}`
//! with linear probing; `value` is `0` (empty), `u64::MAX` (tombstone) or
//! `slot + 1`. Every change is one 8-byte atomic store of `value` (plus, for
//! a bucket claimed by a new label, one store of `label`), made under an NLog
//! entry: publication, upsert switch and delete are redone by recovery, so a
//! torn bucket never outlives the recovery that follows the crash.
//!
//! **Self-validating buckets.** A bucket counts only if its slot's node
//! carries the same label. A crash can persist a claimed bucket's `value`
//! without its `label` (they are different words); such a bucket names a node
//! with another label and is ignored, so `label` and `value` need no ordering
//! between them and a claim costs no extra fence.
//!
//! **Growth.** When a claim probes more than [`MAX_PROBE`] buckets (the table
//! is full of live entries or tombstones), the table is rebuilt at twice the
//! size needed by the live entries into `labels-<gen+1>.vtdp`, made durable,
//! and switched to by one 8-byte atomic store of the meta header's root word
//! (`gen << 8 | log2 buckets`); the old file is then removed. A crash before
//! the switch leaves an orphan file that the next open removes.
//!
//! This is the "equivalent" of CCEH the issue allows: CCEH splits one segment
//! at a time while our rebuild pauses writers of the map for O(n) at each
//! doubling (amortised O(1) per insert, readers never pause), in exchange for
//! one flat table and a one-word publication. Recovery reads no bucket.

use super::layout::{
    decode_data_header, encode_data_header, PGraph, FREE, LABELS_MAGIC, LIVE, M_LABELS_ROOT, PAGE,
};
use parking_lot::{Mutex, RwLock};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use vectide_core::{Error, Result};
use vectide_storage::{Media, Region, Site};

pub const EMPTY: u64 = 0;
pub const TOMBSTONE: u64 = u64::MAX;
/// A claim probing further than this rebuilds the table.
pub const MAX_PROBE: usize = 48;
const BUCKET: usize = 16;

pub const SITE_BUCKET: Site = Site("labels.bucket");
const SITE_REBUILD: Site = Site("labels.rebuild");
const SITE_ROOT: Site = Site("labels.root");

fn hash(label: u64) -> u64 {
    let mut x = label.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

pub fn file_name(gen: u64) -> String {
    format!("labels-{gen}.vtdp")
}

/// One generation of the table.
pub struct Table {
    pub region: Region,
    pub gen: u64,
    pub log2: u32,
    mask: usize,
}

impl Table {
    fn label_at(&self, i: usize) -> u64 {
        self.region
            .u64_at(PAGE + i * BUCKET)
            .load(Ordering::Acquire)
    }
    fn value_at(&self, i: usize) -> u64 {
        self.region
            .u64_at(PAGE + i * BUCKET + 8)
            .load(Ordering::Acquire)
    }
    pub fn buckets(&self) -> usize {
        self.mask + 1
    }

    /// The bucket holding `label` and its slot, if a valid one exists.
    fn find(&self, g: &PGraph, label: u64) -> Option<(usize, u32)> {
        let mut i = hash(label) as usize & self.mask;
        for _ in 0..=self.mask {
            let v = self.value_at(i);
            if v == EMPTY {
                return None;
            }
            if v != TOMBSTONE && self.label_at(i) == label {
                if let Some(slot) = valid_slot(g, v, label) {
                    return Some((i, slot));
                }
            }
            i = (i + 1) & self.mask;
        }
        None
    }
}

/// The slot a bucket value names, if that node exists and carries `label`.
fn valid_slot(g: &PGraph, value: u64, label: u64) -> Option<u32> {
    let slot = value.checked_sub(1)?;
    let slot = u32::try_from(slot).ok()?;
    ((slot as usize) < g.capacity() && g.label(slot) == label && g.state(slot) != FREE)
        .then_some(slot)
}

/// The map: the current table plus a writers' lock.
pub struct Labels {
    dir: PathBuf,
    media: Arc<dyn Media>,
    meta_crc: u32,
    pub table: RwLock<Table>,
    write: Mutex<()>,
}

fn create_table(
    dir: &Path,
    media: &Arc<dyn Media>,
    meta_crc: u32,
    gen: u64,
    log2: u32,
) -> Result<Table> {
    let path = dir.join(file_name(gen));
    let _ = std::fs::remove_file(&path);
    let buckets = 1usize << log2;
    let region = Region::create(media.clone(), &path, PAGE + buckets * BUCKET)?;
    let header = encode_data_header(LABELS_MAGIC, meta_crc, gen, log2 as u64);
    // SAFETY: the region was just created; nobody else maps it yet.
    unsafe { region.bytes_mut(0, PAGE) }.copy_from_slice(&header);
    region.persist(SITE_REBUILD, 0, PAGE);
    Ok(Table {
        region,
        gen,
        log2,
        mask: buckets - 1,
    })
}

impl Labels {
    /// A new empty map (generation 0) for a new index; returns it and the
    /// root word to store in the meta header.
    pub fn create(
        dir: &Path,
        media: Arc<dyn Media>,
        meta_crc: u32,
        log2: u32,
    ) -> Result<(Labels, u64)> {
        let t = create_table(dir, &media, meta_crc, 0, log2)?;
        let root = log2 as u64;
        Ok((
            Labels {
                dir: dir.to_path_buf(),
                media,
                meta_crc,
                table: RwLock::new(t),
                write: Mutex::new(()),
            },
            root,
        ))
    }

    /// Opens the generation the root word names and removes orphans of an
    /// interrupted rebuild.
    pub fn open(dir: &Path, media: Arc<dyn Media>, meta_crc: u32, root: u64) -> Result<Labels> {
        let gen = root >> 8;
        let log2 = (root & 0xff) as u32;
        if !(4..=40).contains(&log2) {
            return Err(Error::corrupted(format!(
                "label map root word {root:#x}: bad size 2^{log2}"
            )));
        }
        let path = dir.join(file_name(gen));
        let region = Region::open(media.clone(), &path)?;
        let what = path.display().to_string();
        if region.len() < PAGE {
            return Err(Error::corrupted(format!("{what}: truncated header")));
        }
        let (hgen, hlog2) =
            decode_data_header(&region.snapshot(0, PAGE), LABELS_MAGIC, &what, meta_crc)?;
        let buckets = 1usize << log2;
        if hgen != gen || hlog2 != log2 as u64 || region.len() < PAGE + buckets * BUCKET {
            return Err(Error::corrupted(format!(
                "{what}: generation {hgen} / 2^{hlog2} buckets / {} bytes do not match the root word (generation {gen}, 2^{log2})",
                region.len()
            )));
        }
        if let Ok(rd) = std::fs::read_dir(dir) {
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if name.starts_with("labels-") && name.ends_with(".vtdp") && name != file_name(gen)
                {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
        Ok(Labels {
            dir: dir.to_path_buf(),
            media,
            meta_crc,
            table: RwLock::new(Table {
                region,
                gen,
                log2,
                mask: buckets - 1,
            }),
            write: Mutex::new(()),
        })
    }

    /// The live slot `label` maps to.
    pub fn get(&self, g: &PGraph, label: u64) -> Option<u32> {
        self.table
            .read()
            .find(g, label)
            .map(|(_, s)| s)
            .filter(|&s| g.state(s) == LIVE)
    }

    /// Maps `label` to `slot` (new label or upsert switch). Idempotent.
    /// Persists the bucket (the caller fences). `meta` receives a rebuild's
    /// root word.
    pub fn publish(&self, g: &PGraph, meta: &Region, label: u64, slot: u32) -> Result<()> {
        let _w = self.write.lock();
        loop {
            {
                let t = self.table.read();
                if let Some((i, _)) = t.find(g, label) {
                    let off = PAGE + i * BUCKET;
                    t.region
                        .u64_at(off + 8)
                        .store(slot as u64 + 1, Ordering::Release);
                    t.region.persist(SITE_BUCKET, off + 8, 8);
                    return Ok(());
                }
                let mut i = hash(label) as usize & t.mask;
                for _ in 0..MAX_PROBE.min(t.buckets()) {
                    let v = t.value_at(i);
                    if v == EMPTY || v == TOMBSTONE {
                        let off = PAGE + i * BUCKET;
                        t.region.u64_at(off).store(label, Ordering::Release);
                        t.region
                            .u64_at(off + 8)
                            .store(slot as u64 + 1, Ordering::Release);
                        t.region.persist(SITE_BUCKET, off, BUCKET);
                        return Ok(());
                    }
                    i = (i + 1) & t.mask;
                }
            }
            self.rebuild(g, meta)?;
        }
    }

    /// Makes sure a later [`Labels::publish`] of `label` finds its bucket or
    /// a free one without rebuilding (a rebuild does I/O that can fail, and
    /// publication happens after the operation is logged). Rebuilds now if
    /// needed.
    pub fn reserve(&self, g: &PGraph, meta: &Region, label: u64) -> Result<()> {
        let _w = self.write.lock();
        {
            let t = self.table.read();
            if t.find(g, label).is_some() {
                return Ok(());
            }
            let mut i = hash(label) as usize & t.mask;
            for _ in 0..(MAX_PROBE / 2).min(t.buckets()) {
                let v = t.value_at(i);
                if v == EMPTY || v == TOMBSTONE {
                    return Ok(());
                }
                i = (i + 1) & t.mask;
            }
        }
        self.rebuild(g, meta)
    }

    /// Removes `label` (tombstone). Idempotent; persists, the caller fences.
    pub fn remove(&self, g: &PGraph, label: u64) {
        let _w = self.write.lock();
        let t = self.table.read();
        if let Some((i, _)) = t.find(g, label) {
            let off = PAGE + i * BUCKET + 8;
            t.region.u64_at(off).store(TOMBSTONE, Ordering::Release);
            t.region.persist(SITE_BUCKET, off, 8);
        }
    }

    /// Every valid `(label, slot)` (checkers and inspectors; O(table)).
    pub fn entries(&self, g: &PGraph) -> Vec<(u64, u32)> {
        let t = self.table.read();
        (0..t.buckets())
            .filter_map(|i| {
                let v = t.value_at(i);
                if v == EMPTY || v == TOMBSTONE {
                    return None;
                }
                let label = t.label_at(i);
                let slot = valid_slot(g, v, label)?;
                // A bucket naming a deleted node is a leftover of a crash
                // that recovery replaced; it maps nothing.
                (g.state(slot) == LIVE).then_some((label, slot))
            })
            .collect()
    }

    /// Rebuilds into the next generation at twice the size the live entries
    /// need (writers hold `write`).
    fn rebuild(&self, g: &PGraph, meta: &Region) -> Result<()> {
        let entries = self.entries(g);
        let (gen, old_log2) = {
            let t = self.table.read();
            (t.gen, t.log2)
        };
        let need = (entries.len() * 4).max(1 << old_log2).next_power_of_two();
        let log2 = need.trailing_zeros().max(old_log2);
        let t = create_table(&self.dir, &self.media, self.meta_crc, gen + 1, log2)?;
        for (label, slot) in entries {
            let mut i = hash(label) as usize & t.mask;
            while t.value_at(i) != EMPTY {
                i = (i + 1) & t.mask;
            }
            let off = PAGE + i * BUCKET;
            t.region.u64_at(off).store(label, Ordering::Relaxed);
            t.region
                .u64_at(off + 8)
                .store(slot as u64 + 1, Ordering::Relaxed);
        }
        t.region.persist(SITE_REBUILD, 0, t.region.len());
        t.region.fence(SITE_REBUILD);
        meta.u64_at(M_LABELS_ROOT)
            .store(((gen + 1) << 8) | log2 as u64, Ordering::Release);
        meta.persist(SITE_ROOT, M_LABELS_ROOT, 8);
        meta.fence(SITE_ROOT);
        let old = std::mem::replace(&mut *self.table.write(), t);
        let old_path = old.region.path().to_path_buf();
        drop(old);
        let _ = std::fs::remove_file(old_path);
        Ok(())
    }
}
