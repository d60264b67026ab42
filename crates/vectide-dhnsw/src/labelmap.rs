//! The remote label map (`docs/format-dhnsw.md`, "label map"): a hash
//! table in the region from a label (the engine contract's `u64` id) to
//! where its node lives (partition, slot) and a version, changed only by
//! one-sided CAS, so that any compute node may upsert or delete any label
//! without a coordinator.
//!
//! A bucket is two 8-byte words: the **key** (`label + 1`; 0 is an empty
//! bucket; `u64::MAX` is the contract's reserved id and never stored) and
//! the **value** ([`Slot`]: present bit, partition, slot, version). A label
//! claims a bucket once, by CAS of the key from 0, and keeps it: a delete
//! clears the present bit and raises the version, so probe chains never
//! break (linear probing, windows of [`WINDOW`] buckets read by one READ).
//! Every change of a value is a CAS from the value last read to one with
//! the next version: of two compute nodes changing one label at once,
//! exactly one CAS wins and the other re-reads and decides again, so no
//! update of the map is lost and no label is mapped twice.

use vectide_core::{Error, Result};
use vectide_remote::{Region, RemoteMemory, Verb};

/// Bytes of one bucket.
pub const BUCKET_BYTES: u64 = 16;
/// Buckets one probe READ brings back.
pub const WINDOW: u64 = 8;
/// Work requests per doorbell of the batch operations.
const CHAIN: usize = 1024;
/// Largest share of buckets with a key before the map is full (a map that
/// full is laid out afresh with its live labels only).
pub const MAX_LOAD: f64 = 0.9;

const PRESENT: u64 = 1 << 63;
const PART_BITS: u32 = 23;
const SLOT_BITS: u32 = 24;
const VERSION_BITS: u32 = 16;
/// Largest partition number and slot a value can hold.
pub const MAX_PART: u32 = (1 << PART_BITS) - 1;
pub const MAX_SLOT: u32 = (1 << SLOT_BITS) - 1;

/// A value word: where a label's node is (when present) and the version of
/// the label's last change (wrapping at 2^16: a CAS compares whole words,
/// so a stale read loses unless exactly 65,536 changes came between).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Slot {
    pub present: bool,
    pub part: u32,
    pub slot: u32,
    pub version: u16,
}

impl Slot {
    pub fn encode(self) -> u64 {
        u64::from(self.present) << 63
            | u64::from(self.part & MAX_PART) << (SLOT_BITS + VERSION_BITS)
            | u64::from(self.slot & MAX_SLOT) << VERSION_BITS
            | u64::from(self.version)
    }

    pub fn decode(w: u64) -> Slot {
        Slot {
            present: w & PRESENT != 0,
            part: ((w >> (SLOT_BITS + VERSION_BITS)) as u32) & MAX_PART,
            slot: ((w >> VERSION_BITS) as u32) & MAX_SLOT,
            version: w as u16,
        }
    }

    /// The next version at `(part, slot)`.
    pub fn at(self, part: u32, slot: u32) -> Slot {
        Slot {
            present: true,
            part,
            slot,
            version: self.version.wrapping_add(1),
        }
    }

    /// The next version, absent.
    pub fn absent(self) -> Slot {
        Slot {
            present: false,
            part: 0,
            slot: 0,
            version: self.version.wrapping_add(1),
        }
    }
}

/// Where a map lives: `buckets` (a power of two) at `off` in `region`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LabelMap {
    pub region: Region,
    pub off: u64,
    pub buckets: u64,
}

/// A label's bucket and the value read from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Found {
    pub bucket: u64,
    pub value: Slot,
}

/// The bucket a label's probe starts at (a 64-bit mix: labels are often
/// consecutive).
fn home(label: u64, buckets: u64) -> u64 {
    let mut z = label.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (z ^ (z >> 31)) & (buckets - 1)
}

fn key_of(label: u64) -> Result<u64> {
    if label == vectide_core::RESERVED_ID {
        return Err(Error::invalid(format!("d-hnsw: id {label} is reserved")));
    }
    Ok(label + 1)
}

fn word(b: &[u8]) -> u64 {
    u64::from_le_bytes(b.try_into().expect("8 bytes"))
}

impl LabelMap {
    /// Bytes a map of `buckets` takes.
    pub fn bytes_for(buckets: u64) -> u64 {
        buckets * BUCKET_BYTES
    }

    /// Buckets for a region laid out for `points` labels: twice as many,
    /// a power of two, at least one window.
    pub fn buckets_for(points: u64) -> u64 {
        (points.max(1) * 2).next_power_of_two().max(WINDOW)
    }

    fn bucket_at(&self, b: u64) -> u64 {
        self.off + (b & (self.buckets - 1)) * BUCKET_BYTES
    }

    /// Where bucket `b`'s value word is.
    pub fn value_at(&self, b: u64) -> u64 {
        self.bucket_at(b) + 8
    }

    /// Reads the window of buckets starting at `b` (wrapping at the end
    /// of the table: two READs in one doorbell then).
    fn window(&self, mem: &dyn RemoteMemory, b: u64) -> Result<Vec<(u64, u64)>> {
        let b = b & (self.buckets - 1);
        let n = WINDOW.min(self.buckets);
        let first = n.min(self.buckets - b);
        let mut wrs = vec![Verb::Read {
            region: self.region.id,
            offset: self.bucket_at(b),
            len: (first * BUCKET_BYTES) as u32,
        }];
        if first < n {
            wrs.push(Verb::Read {
                region: self.region.id,
                offset: self.off,
                len: ((n - first) * BUCKET_BYTES) as u32,
            });
        }
        let mut out = Vec::with_capacity(n as usize);
        for c in mem.post(&wrs)? {
            let d = c.into_data()?;
            for kv in d.chunks_exact(BUCKET_BYTES as usize) {
                out.push((word(&kv[..8]), word(&kv[8..])));
            }
        }
        Ok(out)
    }

    /// The label's bucket and value, or `None` when no bucket holds it.
    pub fn get(&self, mem: &dyn RemoteMemory, label: u64) -> Result<Option<Found>> {
        let key = key_of(label)?;
        let start = home(label, self.buckets);
        let mut b = start;
        loop {
            for (i, (k, v)) in self.window(mem, b)?.into_iter().enumerate() {
                if k == key {
                    return Ok(Some(Found {
                        bucket: (b + i as u64) & (self.buckets - 1),
                        value: Slot::decode(v),
                    }));
                }
                if k == 0 {
                    return Ok(None);
                }
            }
            b += WINDOW.min(self.buckets);
            if b - start >= self.buckets {
                return Ok(None);
            }
        }
    }

    /// The label's bucket, claimed by CAS of an empty key when it has
    /// none (two nodes claiming one label at once share the bucket the
    /// first CAS took), and whether this call took it; an error when the
    /// map is full.
    pub fn claim(&self, mem: &dyn RemoteMemory, label: u64) -> Result<(Found, bool)> {
        let key = key_of(label)?;
        let start = home(label, self.buckets);
        let mut b = start;
        loop {
            let win = self.window(mem, b)?;
            for (i, (k, v)) in win.into_iter().enumerate() {
                let bucket = (b + i as u64) & (self.buckets - 1);
                if k == key {
                    return Ok((
                        Found {
                            bucket,
                            value: Slot::decode(v),
                        },
                        false,
                    ));
                }
                if k != 0 {
                    continue;
                }
                let at = self.bucket_at(bucket);
                // No FLUSH: the key is made durable with its value, whose
                // swap FLUSHes the bucket (one cache line) before the map
                // names anything by it.
                let found = mem.cas(self.region, at, 0, key)?;
                if found == 0 || found == key {
                    let v = mem.read(self.region, at + 8, 8)?;
                    return Ok((
                        Found {
                            bucket,
                            value: Slot::decode(word(&v)),
                        },
                        found == 0,
                    ));
                }
                // Another label took it: probe on.
            }
            b += WINDOW.min(self.buckets);
            if b - start >= self.buckets {
                return Err(Error::invalid(format!(
                    "d-hnsw: the label map's {} buckets are all taken",
                    self.buckets
                )));
            }
        }
    }

    /// CAS of the bucket's value from `expect` to `new`; returns the value
    /// found (the swap happened if it equals `expect`).
    pub fn swap(
        &self,
        mem: &dyn RemoteMemory,
        bucket: u64,
        expect: Slot,
        new: Slot,
    ) -> Result<Slot> {
        let at = self.bucket_at(bucket);
        let c = mem.post(&[
            Verb::Cas {
                region: self.region.id,
                offset: at + 8,
                expect: expect.encode(),
                new: new.encode(),
            },
            Verb::Flush {
                region: self.region.id,
                offset: at,
                len: BUCKET_BYTES,
                site: crate::sites::MAP_SWAP,
            },
        ])?;
        let mut it = c.into_iter();
        let found = it.next().expect("two completions").into_word()?;
        it.next().expect("two completions").into_done()?;
        Ok(Slot::decode(found))
    }

    /// The buckets of a new map holding `rows` (label, partition, slot),
    /// each present at version 1, laid out as the remote probes expect;
    /// returns the bytes and each row's bucket (in `rows`' order).
    pub fn encode_new(buckets: u64, rows: &[(u64, u32, u32)]) -> Result<(Vec<u8>, Vec<u64>)> {
        if (rows.len() as f64) > MAX_LOAD * buckets as f64 {
            return Err(Error::invalid(format!(
                "d-hnsw: {} labels do not fit a label map of {buckets} buckets",
                rows.len()
            )));
        }
        let mut b = vec![0u8; Self::bytes_for(buckets) as usize];
        let mut at = Vec::with_capacity(rows.len());
        for &(label, part, slot) in rows {
            let key = key_of(label)?;
            let mut i = home(label, buckets);
            loop {
                let o = (i * BUCKET_BYTES) as usize;
                let k = word(&b[o..o + 8]);
                if k == key {
                    return Err(Error::invalid(format!(
                        "d-hnsw: label {label} twice in one build"
                    )));
                }
                if k == 0 {
                    b[o..o + 8].copy_from_slice(&key.to_le_bytes());
                    let v = Slot::default().at(part, slot);
                    b[o + 8..o + 16].copy_from_slice(&v.encode().to_le_bytes());
                    at.push(i);
                    break;
                }
                i = (i + 1) & (buckets - 1);
            }
        }
        Ok((b, at))
    }

    /// [`get`](Self::get) for many labels: their first probe windows in one
    /// doorbell per chunk; a label found in neither way there (its window
    /// full of other labels) is looked up alone.
    pub fn get_many(&self, mem: &dyn RemoteMemory, labels: &[u64]) -> Result<Vec<Option<Found>>> {
        let mut out = Vec::with_capacity(labels.len());
        for chunk in labels.chunks(CHAIN) {
            let homes: Vec<u64> = chunk.iter().map(|&l| home(l, self.buckets)).collect();
            let wrs: Vec<Verb> = homes
                .iter()
                .map(|&h| Verb::Read {
                    region: self.region.id,
                    offset: self.bucket_at(h),
                    len: (WINDOW.min(self.buckets - h) * BUCKET_BYTES) as u32,
                })
                .collect();
            for (i, c) in mem.post(&wrs)?.into_iter().enumerate() {
                let key = key_of(chunk[i])?;
                let d = c.into_data()?;
                let mut got = None;
                let mut settled = false;
                for (j, kv) in d.chunks_exact(BUCKET_BYTES as usize).enumerate() {
                    let k = word(&kv[..8]);
                    if k == key {
                        got = Some(Found {
                            bucket: homes[i] + j as u64,
                            value: Slot::decode(word(&kv[8..])),
                        });
                        settled = true;
                        break;
                    }
                    if k == 0 {
                        settled = true;
                        break;
                    }
                }
                out.push(if settled {
                    got
                } else {
                    self.get(mem, chunk[i])?
                });
            }
        }
        Ok(out)
    }

    /// [`claim`](Self::claim) for many labels: their probe windows in one
    /// doorbell, the empty keys taken by CAS in a second; a label whose
    /// window is full or whose CAS lost to another label is claimed alone.
    /// Returns each label's bucket and value, and how many buckets this
    /// call took.
    pub fn claim_many(&self, mem: &dyn RemoteMemory, labels: &[u64]) -> Result<(Vec<Found>, u64)> {
        let mut out: Vec<Option<Found>> = vec![None; labels.len()];
        let mut took = 0u64;
        for (ci, chunk) in labels.chunks(CHAIN / 2).enumerate() {
            let base = ci * (CHAIN / 2);
            let homes: Vec<u64> = chunk.iter().map(|&l| home(l, self.buckets)).collect();
            let mut wrs = Vec::with_capacity(chunk.len());
            for &h in &homes {
                // One READ per label (a window that wraps is left to `claim`).
                let n = WINDOW.min(self.buckets - h);
                wrs.push(Verb::Read {
                    region: self.region.id,
                    offset: self.bucket_at(h),
                    len: (n * BUCKET_BYTES) as u32,
                });
            }
            let mut cas = Vec::new();
            for (i, c) in mem.post(&wrs)?.into_iter().enumerate() {
                let key = key_of(chunk[i])?;
                let d = c.into_data()?;
                for (j, kv) in d.chunks_exact(BUCKET_BYTES as usize).enumerate() {
                    let (k, v) = (word(&kv[..8]), word(&kv[8..]));
                    let bucket = homes[i] + j as u64;
                    if k == key {
                        out[base + i] = Some(Found {
                            bucket,
                            value: Slot::decode(v),
                        });
                        break;
                    }
                    if k == 0 {
                        // Two labels of this chunk may want one empty
                        // bucket: the second CAS loses and is redone alone.
                        cas.push((base + i, bucket, key));
                        break;
                    }
                }
            }
            if !cas.is_empty() {
                // No FLUSH: a key is made durable with the first value
                // swapped into its bucket (that FLUSH covers the whole
                // bucket), before the map names anything by it.
                let mut wrs: Vec<Verb> = Vec::with_capacity(cas.len());
                for &(_, bucket, key) in &cas {
                    wrs.push(Verb::Cas {
                        region: self.region.id,
                        offset: self.bucket_at(bucket),
                        expect: 0,
                        new: key,
                    });
                }
                let done = mem.post(&wrs)?;
                let mut words = Vec::with_capacity(cas.len());
                for c in done {
                    words.push(c.into_word()?);
                }
                for (found, &(i, bucket, key)) in words.into_iter().zip(&cas) {
                    if found == 0 {
                        took += 1;
                        out[i] = Some(Found {
                            bucket,
                            value: Slot::default(),
                        });
                    } else if found == key {
                        // Claimed by another node at the same moment; its
                        // value is read by `claim` below.
                    }
                }
            }
        }
        let mut done = Vec::with_capacity(labels.len());
        for (i, f) in out.into_iter().enumerate() {
            done.push(match f {
                Some(f) => f,
                None => {
                    let (f, t) = self.claim(mem, labels[i])?;
                    took += u64::from(t);
                    f
                }
            });
        }
        Ok((done, took))
    }

    /// Many [`swap`](Self::swap)s in doorbells: (bucket, expect, new) each,
    /// each bucket (key and value) FLUSHed after its CAS (durable on a
    /// memory node with a backing file); returns the values found, in
    /// order.
    pub fn swap_many(
        &self,
        mem: &dyn RemoteMemory,
        swaps: &[(u64, Slot, Slot)],
    ) -> Result<Vec<Slot>> {
        let mut out = Vec::with_capacity(swaps.len());
        for chunk in swaps.chunks(CHAIN / 2) {
            // The CASes, then a FLUSH of each bucket (one run of FLUSHes,
            // which the memory node makes durable with one fence): every
            // bucket durable when the doorbell returns.
            let mut wrs: Vec<Verb> = Vec::with_capacity(2 * chunk.len());
            for &(b, e, n) in chunk {
                wrs.push(Verb::Cas {
                    region: self.region.id,
                    offset: self.bucket_at(b) + 8,
                    expect: e.encode(),
                    new: n.encode(),
                });
            }
            for &(b, ..) in chunk {
                wrs.push(Verb::Flush {
                    region: self.region.id,
                    offset: self.bucket_at(b),
                    len: BUCKET_BYTES,
                    site: crate::sites::MAP_SWAP,
                });
            }
            for (i, c) in mem.post(&wrs)?.into_iter().enumerate() {
                if i < chunk.len() {
                    out.push(Slot::decode(c.into_word()?));
                } else {
                    c.into_done()?;
                }
            }
        }
        Ok(out)
    }

    /// [`swap_many`](Self::swap_many) for a single writer: every CAS must
    /// win (a loss means another compute node writes the region).
    pub fn swap_all(&self, mem: &dyn RemoteMemory, swaps: &[(u64, Slot, Slot)]) -> Result<()> {
        let seen = self.swap_many(mem, swaps)?;
        match (0..swaps.len()).find(|&i| seen[i] != swaps[i].1) {
            None => Ok(()),
            Some(i) => Err(Error::corrupted(format!(
                "d-hnsw: the label map changed under this compute node (bucket {}); only one compute node may write a region",
                swaps[i].0
            ))),
        }
    }

    /// Every bucket's bytes, in large READs.
    fn read_all(&self, mem: &dyn RemoteMemory) -> Result<Vec<u8>> {
        crate::fetch::read_range(
            mem,
            self.region,
            self.off,
            self.off + Self::bytes_for(self.buckets),
        )
    }

    /// Every bucket with a key: (label, value), read in large READs (a
    /// rebuild, a structure check, an attaching node's count).
    pub fn scan(&self, mem: &dyn RemoteMemory) -> Result<Vec<(u64, Slot)>> {
        Ok(self
            .read_all(mem)?
            .chunks_exact(BUCKET_BYTES as usize)
            .filter_map(|kv| {
                let k = word(&kv[..8]);
                (k != 0).then(|| (k - 1, Slot::decode(word(&kv[8..]))))
            })
            .collect())
    }
}

impl LabelMap {
    /// Zeroes, durably, the value word of every bucket without a key.
    /// A claim writes a bucket's key unFLUSHed and its first value FLUSHed
    /// with it; a crash in between may keep the value's cache line in part
    /// (the value, not the key). Such a value names a node of a write the
    /// crash cut short; left standing, the next label to claim the bucket
    /// would find it there, and a crash that kept that claim's key but not
    /// its value would name the cut-short write's node for that label. Run
    /// by the recovery after a restart, before any writer claims a bucket.
    /// Returns how many buckets it zeroed.
    pub fn clear_keyless(
        &self,
        mem: &dyn RemoteMemory,
        site: vectide_remote::Site,
    ) -> Result<usize> {
        let stale: Vec<(u64, u64)> = self
            .read_all(mem)?
            .chunks_exact(BUCKET_BYTES as usize)
            .enumerate()
            .filter(|(_, kv)| word(&kv[..8]) == 0 && word(&kv[8..]) != 0)
            .map(|(b, kv)| (b as u64, word(&kv[8..])))
            .collect();
        // By CAS from the value read, each FLUSHed: a claim that came in
        // between (a writer of a lease taken over meanwhile) keeps its own.
        for chunk in stale.chunks(CHAIN / 2) {
            let mut wrs: Vec<Verb> = Vec::with_capacity(2 * chunk.len());
            for &(b, v) in chunk {
                wrs.push(Verb::Cas {
                    region: self.region.id,
                    offset: self.value_at(b),
                    expect: v,
                    new: 0,
                });
            }
            for &(b, _) in chunk {
                wrs.push(Verb::Flush {
                    region: self.region.id,
                    offset: self.bucket_at(b),
                    len: BUCKET_BYTES,
                    site,
                });
            }
            for (i, c) in mem.post(&wrs)?.into_iter().enumerate() {
                if i < chunk.len() {
                    c.into_word()?;
                } else {
                    c.into_done()?;
                }
            }
        }
        Ok(stale.len())
    }
}

/// CAS of the word at `at`, then a FLUSH of it (site `site`), in one
/// doorbell: the word is durable, whichever value it holds, when this
/// returns. Returns the word found.
pub(crate) fn cas_flushed(
    mem: &dyn RemoteMemory,
    region: Region,
    at: u64,
    expect: u64,
    new: u64,
    site: vectide_remote::Site,
) -> Result<u64> {
    let c = mem.post(&[
        Verb::Cas {
            region: region.id,
            offset: at,
            expect,
            new,
        },
        Verb::Flush {
            region: region.id,
            offset: at,
            len: 8,
            site,
        },
    ])?;
    let mut it = c.into_iter();
    let found = it.next().expect("two completions").into_word()?;
    it.next().expect("two completions").into_done()?;
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use std::sync::Arc;
    use vectide_remote::{LocalMemory, NetModel, Regions};

    fn map(buckets: u64) -> (Arc<Regions>, LabelMap) {
        let regions = Arc::new(Regions::new(1 << 24));
        let mem = LocalMemory::local(Arc::clone(&regions), NetModel::default());
        let region = mem
            .create_region("m", 64 + LabelMap::bytes_for(buckets))
            .unwrap();
        (
            regions,
            LabelMap {
                region,
                off: 64,
                buckets,
            },
        )
    }

    #[test]
    fn values_round_trip_and_versions_wrap() {
        for s in [
            Slot::default(),
            Slot {
                present: true,
                part: MAX_PART,
                slot: MAX_SLOT,
                version: u16::MAX,
            },
            Slot {
                present: true,
                part: 7,
                slot: 123_456,
                version: 3,
            },
        ] {
            assert_eq!(Slot::decode(s.encode()), s);
        }
        let s = Slot {
            version: u16::MAX,
            ..Slot::default()
        };
        assert_eq!(s.at(1, 2).version, 0);
        assert!(!s.at(1, 2).absent().present);
    }

    #[test]
    fn claims_get_and_swaps_follow_a_model_and_a_full_map_says_so() {
        let (regions, m) = map(64);
        let mem = LocalMemory::local(regions, NetModel::default());
        assert_eq!(m.get(&mem, 5).unwrap(), None);
        assert!(m.get(&mem, u64::MAX).is_err(), "the reserved id");
        let mut model: BTreeMap<u64, Slot> = BTreeMap::new();
        // Labels that collide at the table's end wrap around it.
        for label in 0..50u64 {
            let (f, took) = m.claim(&mem, label).unwrap();
            assert!(took);
            assert_eq!(f.value, Slot::default());
            let new = f.value.at(label as u32 % 3, label as u32);
            assert_eq!(m.swap(&mem, f.bucket, f.value, new).unwrap(), f.value);
            model.insert(label, new);
            // A stale expectation loses and changes nothing.
            assert_eq!(
                m.swap(&mem, f.bucket, f.value, f.value.absent()).unwrap(),
                new
            );
        }
        for (label, want) in &model {
            let f = m.get(&mem, *label).unwrap().unwrap();
            assert_eq!(f.value, *want);
            assert_eq!(m.claim(&mem, *label).unwrap(), (f, false), "claimed once");
        }
        let mut scanned = m.scan(&mem).unwrap();
        scanned.sort_by_key(|x| x.0);
        assert_eq!(scanned, model.into_iter().collect::<Vec<_>>());
        for label in 50..64u64 {
            m.claim(&mem, label).unwrap();
        }
        let e = m.claim(&mem, 1000).unwrap_err().to_string();
        assert!(e.contains("all taken"), "{e}");
        assert_eq!(m.get(&mem, 1000).unwrap(), None, "a full map still answers");
    }

    /// Compute nodes (threads, each with its own transport) upsert and
    /// delete overlapping labels at once, each change a CAS from the value
    /// it read, re-read on failure. Afterwards every label has one bucket,
    /// its version counts exactly the changes that won, and its value is
    /// the last of them.
    #[test]
    fn concurrent_changes_of_one_label_lose_nothing() {
        let (regions, m) = map(256);
        let nodes = 4u32;
        let won: Vec<Vec<(u64, Slot)>> = std::thread::scope(|sc| {
            let hs: Vec<_> = (0..nodes)
                .map(|n| {
                    let mem = LocalMemory::local(Arc::clone(&regions), NetModel::default());
                    sc.spawn(move || {
                        let mut won = Vec::new();
                        let mut rng = 0x1234_5678u64 + u64::from(n);
                        for i in 0..400u32 {
                            rng = rng
                                .wrapping_mul(6364136223846793005)
                                .wrapping_add(1442695040888963407);
                            let label = (rng >> 33) % 24;
                            let (f, _) = m.claim(&mem, label).unwrap();
                            let mut cur = f.value;
                            loop {
                                let new = if rng & (1 << 20) == 0 {
                                    cur.absent()
                                } else {
                                    cur.at(n, i)
                                };
                                let seen = m.swap(&mem, f.bucket, cur, new).unwrap();
                                if seen == cur {
                                    won.push((label, new));
                                    break;
                                }
                                cur = seen;
                            }
                        }
                        won
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let mem = LocalMemory::local(regions, NetModel::default());
        let scanned = m.scan(&mem).unwrap();
        let mut labels: Vec<u64> = scanned.iter().map(|x| x.0).collect();
        labels.sort_unstable();
        labels.dedup();
        assert_eq!(labels.len(), scanned.len(), "no label holds two buckets");
        let mut by_label: BTreeMap<u64, Vec<Slot>> = BTreeMap::new();
        for w in won.into_iter().flatten() {
            by_label.entry(w.0).or_default().push(w.1);
        }
        for (label, value) in scanned {
            let wins = &by_label[&label];
            // Versions of the winning changes are 1, 2, ... with no gap or
            // repeat (none lost, none applied twice), and the map holds
            // the last.
            let mut vs: Vec<u16> = wins.iter().map(|s| s.version).collect();
            vs.sort_unstable();
            assert_eq!(
                vs,
                (1..=wins.len() as u16).collect::<Vec<_>>(),
                "label {label}"
            );
            let last = wins.iter().max_by_key(|s| s.version).unwrap();
            assert_eq!(value, *last, "label {label}");
        }
    }
}
