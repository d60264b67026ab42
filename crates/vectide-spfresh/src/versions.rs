//! The version map (§4.2.1 of the paper): one byte per vector, in RAM —
//! a 7-bit reassign version and a delete bit — updated by compare-and-swap.
//!
//! A posting record carries the version its vector had when the record was
//! written. A record is **current** when its vector is not deleted and the
//! map's version equals the record's; any other record is stale (the
//! vector was deleted, or reassigned since, and its current copy lives
//! elsewhere). Equality, not "newer than", because 7 bits wrap at 128.
//!
//! A reassign takes the version it saw when it read the record and bumps
//! it by CAS: of two jobs moving the same vector, one wins and the other
//! sees its CAS fail and drops its move, so no vector is reassigned twice
//! concurrently. A delete sets the delete bit by CAS as well, so it cannot
//! be lost under a concurrent bump.
//!
//! The map grows as vectors are added, without a lock on reads: chunk `k`
//! holds `2^(16+k)` bytes and is allocated once, the first time a vector
//! number falls into it.

use std::sync::atomic::{AtomicU32, AtomicU8, Ordering};
use std::sync::OnceLock;
use vectide_core::io::{push_crc, ByteReader};
use vectide_core::{Error, Result};

/// Bit of a deleted vector.
pub const DELETED: u8 = 0x80;
/// Bits of the version.
pub const VERSION_MASK: u8 = 0x7F;
/// First bytes of an encoded version map.
pub const MAGIC: &[u8; 8] = b"VTSPVER\0";
/// The encoding version this build reads and writes.
pub const FORMAT_VERSION: u32 = 1;

const BASE_BITS: u32 = 16;
const CHUNKS: usize = 33;

/// The chunk and offset of vector number `i`.
#[inline]
fn locate(i: u32) -> (usize, usize) {
    let j = (i as u64 >> BASE_BITS) + 1;
    let k = 63 - j.leading_zeros() as usize;
    let start = ((1u64 << k) - 1) << BASE_BITS;
    (k, (i as u64 - start) as usize)
}

/// A vector's state as the map holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct State {
    pub version: u8,
    pub deleted: bool,
}

impl State {
    fn of(b: u8) -> Self {
        State {
            version: b & VERSION_MASK,
            deleted: b & DELETED != 0,
        }
    }
}

/// The version map (module docs).
pub struct VersionMap {
    chunks: [OnceLock<Box<[AtomicU8]>>; CHUNKS],
    /// Published only once the chunks below it exist.
    len: AtomicU32,
    /// Serialises growth.
    grow: parking_lot::Mutex<()>,
}

impl Default for VersionMap {
    fn default() -> Self {
        VersionMap {
            chunks: std::array::from_fn(|_| OnceLock::new()),
            len: AtomicU32::new(0),
            grow: parking_lot::Mutex::new(()),
        }
    }
}

impl std::fmt::Debug for VersionMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "VersionMap({} vectors)", self.len())
    }
}

impl VersionMap {
    pub fn new() -> Self {
        Self::default()
    }

    /// Vector numbers handed out.
    pub fn len(&self) -> u32 {
        self.len.load(Ordering::Acquire)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn cell(&self, i: u32) -> Option<&AtomicU8> {
        if i >= self.len() {
            return None;
        }
        let (k, off) = locate(i);
        self.chunks[k].get().map(|c| &c[off])
    }

    /// Adds `n` vectors (version 0, live); the first one's number. The new
    /// numbers become visible to other threads only once their bytes exist.
    pub fn push(&self, n: u32) -> Result<u32> {
        let _g = self.grow.lock();
        let first = self.len.load(Ordering::Acquire);
        let end = first
            .checked_add(n)
            .ok_or_else(|| Error::invalid("version map: more than 2^32 - 1 vectors"))?;
        if n > 0 {
            let (lo, _) = locate(first);
            let (hi, _) = locate(end - 1);
            for k in lo..=hi {
                self.chunks[k].get_or_init(|| {
                    (0..1usize << (BASE_BITS as usize + k))
                        .map(|_| AtomicU8::new(0))
                        .collect()
                });
            }
        }
        self.len.store(end, Ordering::Release);
        Ok(first)
    }

    /// The state of vector `i` (`None`: never added).
    pub fn get(&self, i: u32) -> Option<State> {
        self.cell(i).map(|c| State::of(c.load(Ordering::Acquire)))
    }

    /// Whether a record of vector `i` written at `version` is current.
    #[inline]
    pub fn is_current(&self, i: u32, version: u8) -> bool {
        self.cell(i)
            .is_some_and(|c| c.load(Ordering::Acquire) == version & VERSION_MASK)
    }

    /// Marks vector `i` deleted; `false` when it already was or was never
    /// added.
    pub fn delete(&self, i: u32) -> bool {
        self.cell(i).is_some_and(|c| {
            c.fetch_update(Ordering::AcqRel, Ordering::Acquire, |b| {
                (b & DELETED == 0).then_some(b | DELETED)
            })
            .is_ok()
        })
    }

    /// Gives deleted vector `i` to a new vector: live at version 0.
    /// `false` (and nothing changed) when it is live or was never added.
    /// Only for a number the reclaim freed (`reclaim.rs`): no posting, and
    /// no reader, holds a record of the old vector any more, so no record
    /// of it can be taken for the new one whatever its version byte.
    pub fn revive(&self, i: u32) -> bool {
        self.cell(i).is_some_and(|c| {
            c.fetch_update(Ordering::AcqRel, Ordering::Acquire, |b| {
                (b & DELETED != 0).then_some(0)
            })
            .is_ok()
        })
    }

    /// A reassign's claim: bumps vector `i`'s version from `seen` to the
    /// next one (mod 128) if it is still `seen` and live; the new version,
    /// or `None` when another job moved it, it was deleted, or it does not
    /// exist.
    pub fn bump(&self, i: u32, seen: u8) -> Option<u8> {
        let seen = seen & VERSION_MASK;
        let next = (seen + 1) & VERSION_MASK;
        self.cell(i)?
            .compare_exchange(seen, next, Ordering::AcqRel, Ordering::Acquire)
            .ok()
            .map(|_| next)
    }

    /// Whether vector `i` exists and is not deleted. A vector's data never
    /// changes (an upsert takes a new number), so a search may return any
    /// copy of a live vector whatever its version: a stale copy is the
    /// vector itself, and reading it keeps a vector visible while a
    /// reassign moves it between postings the search reads at different
    /// moments.
    #[inline]
    pub fn is_live(&self, i: u32) -> bool {
        self.cell(i)
            .is_some_and(|c| c.load(Ordering::Acquire) & DELETED == 0)
    }

    /// How a copy of vector `i` written at `version` stands: 1 current,
    /// 2 pending (the next version: a reassign wrote it and has not yet
    /// switched the vector over), 0 stale or the vector deleted. A vector's
    /// data never changes (an upsert takes a new vector number), so every
    /// current or pending copy holds the same vector.
    #[inline]
    pub fn standing(&self, i: u32, version: u8) -> u8 {
        let Some(c) = self.cell(i) else { return 0 };
        let b = c.load(Ordering::Acquire);
        let v = version & VERSION_MASK;
        if b & DELETED != 0 {
            0
        } else if b == v {
            1
        } else if (b + 1) & VERSION_MASK == v {
            2
        } else {
            0
        }
    }

    /// Restores vector `i` as live at `version` (recovery replaying an
    /// insert or a reassign); adds vectors up to `i` as needed. Takes the
    /// map exclusively: recovery runs before anything else uses it.
    pub fn set(&mut self, i: u32, version: u8) -> Result<()> {
        let len = self.len();
        if i >= len {
            let more = (i - len)
                .checked_add(1)
                .ok_or_else(|| Error::invalid("version map: more than 2^32 - 1 vectors"))?;
            self.push(more)?;
        }
        match self.cell(i) {
            Some(c) => {
                c.store(version & VERSION_MASK, Ordering::Release);
                Ok(())
            }
            None => Err(Error::invalid(format!("version map: no vector {i}"))),
        }
    }

    /// Live (not deleted) vectors.
    pub fn live(&self) -> u32 {
        (0..self.len())
            .filter(|&i| self.get(i).is_some_and(|s| !s.deleted))
            .count() as u32
    }

    /// `MAGIC ‖ version u32 ‖ n u32 ‖ n bytes ‖ crc32 u32` of everything
    /// before it.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let start = out.len();
        let n = self.len();
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        out.extend_from_slice(&n.to_le_bytes());
        out.extend((0..n).map(|i| self.cell(i).map_or(0, |c| c.load(Ordering::Acquire))));
        push_crc(out, start);
    }

    /// Parses an encoded map; the map and the bytes it took.
    pub fn decode(bytes: &[u8]) -> Result<(Self, usize)> {
        let mut r = ByteReader::new(bytes);
        r.magic_version(MAGIC, FORMAT_VERSION, "version map")?;
        let n = r.u32()?;
        let body = r.bytes(n as usize)?;
        r.crc_of_preceding("version map")?;
        let map = VersionMap::new();
        map.push(n)?;
        for (i, &b) in body.iter().enumerate() {
            if let Some(c) = map.cell(i as u32) {
                c.store(b, Ordering::Relaxed);
            }
        }
        Ok((map, r.position()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn locate_covers_every_number_once_across_chunk_edges() {
        let base = 1u32 << BASE_BITS;
        assert_eq!(locate(0), (0, 0));
        assert_eq!(locate(base - 1), (0, base as usize - 1));
        assert_eq!(locate(base), (1, 0));
        assert_eq!(locate(3 * base - 1), (1, 2 * base as usize - 1));
        assert_eq!(locate(3 * base), (2, 0));
        let (k, off) = locate(u32::MAX);
        assert!(k < CHUNKS && off < 1 << (BASE_BITS as usize + k));
    }

    #[test]
    fn versions_bump_by_cas_wrap_at_128_and_deletes_stick() {
        let m = VersionMap::new();
        assert_eq!(m.push(70_000).unwrap(), 0);
        let v = 69_999;
        assert!(m.is_current(v, 0));
        assert_eq!(m.bump(v, 0), Some(1));
        assert_eq!(
            m.bump(v, 0),
            None,
            "a second job with the old version loses"
        );
        assert!(!m.is_current(v, 0) && m.is_current(v, 1));
        for s in 1..128u8 {
            assert_eq!(m.bump(v, s), Some((s + 1) & 0x7F));
        }
        assert_eq!(m.get(v).unwrap().version, 0, "wrapped");
        assert!(m.delete(v));
        assert!(!m.delete(v));
        assert_eq!(m.bump(v, 0), None, "a deleted vector is not reassigned");
        assert!(!m.is_current(v, 0));
        assert_eq!(m.get(70_000), None);
        assert!(!m.delete(70_000));
        assert_eq!(m.live(), 69_999);
        let mut m = VersionMap::new();
        assert!(m.set(u32::MAX, 1).is_err(), "2^32 vectors");
        assert!(m.is_empty());
    }

    #[test]
    fn only_a_deleted_vector_is_revived_and_it_comes_back_at_version_0() {
        let m = VersionMap::new();
        m.push(3).unwrap();
        assert!(!m.revive(0), "a live vector is not given away");
        assert_eq!(m.bump(1, 0), Some(1));
        assert!(m.delete(1));
        assert!(m.revive(1));
        assert_eq!(
            m.get(1),
            Some(State {
                version: 0,
                deleted: false
            })
        );
        assert!(!m.is_current(1, 1), "a record of the old version is stale");
        assert!(!m.revive(1), "revived once");
        assert!(!m.revive(3), "never added");
    }

    #[test]
    fn of_many_concurrent_claims_exactly_one_wins() {
        let m = VersionMap::new();
        m.push(1000).unwrap();
        let wins = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for i in 0..1000 {
                        if m.bump(i, 0).is_some() {
                            wins.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                });
            }
            // Growing while others claim.
            s.spawn(|| {
                for _ in 0..50 {
                    m.push(3000).unwrap();
                }
            });
        });
        assert_eq!(wins.load(Ordering::Relaxed), 1000);
        assert_eq!(m.len(), 151_000);
        assert!(m.is_current(150_999, 0));
    }

    #[test]
    fn the_encoding_round_trips_and_rejects_damage() {
        let mut m = VersionMap::new();
        m.push(5).unwrap();
        m.bump(1, 0);
        m.delete(3);
        m.set(9, 4).unwrap();
        let mut b = Vec::new();
        m.encode(&mut b);
        let (d, used) = VersionMap::decode(&b).unwrap();
        assert_eq!(used, b.len());
        assert_eq!(d.len(), 10);
        for i in 0..10 {
            assert_eq!(d.get(i), m.get(i));
        }
        for cut in 0..b.len() {
            assert!(VersionMap::decode(&b[..cut]).is_err());
        }
        let mut flip = b.clone();
        flip[14] ^= 1;
        assert!(matches!(
            VersionMap::decode(&flip),
            Err(Error::Corrupted(_))
        ));
    }
}
