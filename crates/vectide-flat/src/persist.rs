//! Save and load (format documented in `docs/format-flat.md`).
//!
//! A save holds the store's shared lock (searches go on, inserts and
//! deletes wait), captures the sequence watermark, and streams the live
//! vectors, compacted into slot order, through a CRC-32 writer into a temp
//! file that [`atomic_write`] fsyncs and renames over the target. A load
//! reads the whole file and believes no byte before the magic, the version,
//! the end magic and the checksum are right; then every field is checked
//! against its bounds with a [`ByteReader`], so that a damaged file is an
//! [`Error::Corrupted`] (or [`Error::Version`]), never a panic, and no
//! allocation is larger than the file implies.

use crate::layout::{Store, FREE, MAX_SLOTS};
use crate::params::FlatParams;
use crate::state::Flat;
use std::path::Path;
use std::sync::atomic::Ordering;
use vectide_core::io::{stage_write, ByteReader, CrcWriter};
use vectide_core::{distance, limits, Error, Metric, Result, Seq, StagedSave};

/// First bytes of a flat index file.
pub const MAGIC: &[u8; 8] = b"VTDXFLAT";
/// Last bytes of a flat index file.
pub const END_MAGIC: &[u8; 8] = b"VTDXEND\0";
/// The format version this build writes and reads.
pub const FORMAT_VERSION: u32 = 1;
/// Bytes of the header.
pub const HEADER_LEN: usize = 40;
/// Bytes of the trailer (CRC-32, end magic).
pub const TRAILER_LEN: usize = 12;
/// How far the squared norm of a stored cosine vector may be from 1.
const UNIT_TOLERANCE: f32 = 1e-3;
/// Bytes staged before they go through the CRC writer.
const STAGE: usize = 1 << 16;

/// What `vectide inspect` shows of a flat index file.
#[derive(Debug, Clone, PartialEq)]
pub struct FileInfo {
    pub format_version: u32,
    pub metric: Metric,
    pub dim: usize,
    /// Live vectors (the file holds no free slot).
    pub live: usize,
    /// Slots the loaded index will use (equal to `live`: saves compact).
    pub slots: usize,
    pub durable_seq: Seq,
    pub file_bytes: u64,
    /// The CRC-32 of the file's body, verified.
    pub checksum: u32,
}

/// Writes `flat` to `path` atomically.
pub(crate) fn save(flat: &Flat, path: &Path) -> Result<()> {
    save_staged(flat, path)?.commit()
}

/// [`save`]'s file written beside `path` (writes wait meanwhile), to be
/// committed without the store's lock.
pub(crate) fn save_staged<'a>(flat: &'a Flat, path: &Path) -> Result<StagedSave<'a>> {
    // One save at a time, to its commit, so that the watermarks they
    // capture reach `durable` in the order their renames happened.
    let saving = flat.saving.lock();
    let store = flat.store.read();
    let watermark = flat.seqs.watermark();
    let file = stage_write(path, |w| {
        let mut cw = CrcWriter::new(w);
        let dim = store.dim();
        let mut h = Vec::with_capacity(HEADER_LEN);
        h.extend_from_slice(MAGIC);
        h.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        h.extend_from_slice(&[flat.metric as u8, 0, 0, 0]);
        h.extend_from_slice(&(dim as u32).to_le_bytes());
        h.extend_from_slice(&0u32.to_le_bytes());
        h.extend_from_slice(&(store.live() as u64).to_le_bytes());
        h.extend_from_slice(&watermark.to_le_bytes());
        debug_assert_eq!(h.len(), HEADER_LEN);
        cw.put(&h)?;
        let mut stage = Vec::with_capacity(STAGE + 8 * dim);
        let mut put = |cw: &mut CrcWriter<'_>, bytes: &[u8]| -> Result<()> {
            stage.extend_from_slice(bytes);
            if stage.len() >= STAGE {
                cw.put(&stage)?;
                stage.clear();
            }
            Ok(())
        };
        for s in store.live_slots() {
            put(&mut cw, &store.id(s).to_le_bytes())?;
        }
        for s in store.live_slots() {
            put(&mut cw, &store.seq(s).to_le_bytes())?;
        }
        for s in store.live_slots() {
            for x in store.vector(s) {
                put(&mut cw, &x.to_le_bytes())?;
            }
        }
        cw.put(&stage)?;
        let crc = cw.crc();
        w.write_all(&crc.to_le_bytes())?;
        w.write_all(END_MAGIC)?;
        Ok(())
    })?;
    drop(store);
    Ok(StagedSave::new(file, watermark, move || {
        flat.durable.fetch_max(watermark, Ordering::AcqRel);
        drop(saving);
    }))
}

/// Loads a file written by [`save`].
pub(crate) fn load(path: &Path, params: FlatParams) -> Result<Flat> {
    let bytes = std::fs::read(path).map_err(|e| Error::io_at(path, e))?;
    from_bytes(&bytes, params)
}

/// Parses and checks the bytes of a file into an index.
pub(crate) fn from_bytes(bytes: &[u8], params: FlatParams) -> Result<Flat> {
    let file = parse(bytes)?;
    let store = file.store()?;
    Flat::with_store(store, file.metric, params, file.durable_seq)
}

/// Reads and checks a file without keeping an index: what
/// `vectide inspect` shows.
pub fn inspect(path: &Path) -> Result<FileInfo> {
    let bytes = std::fs::read(path).map_err(|e| Error::io_at(path, e))?;
    let file = parse(&bytes)?;
    let store = file.store()?;
    Ok(FileInfo {
        format_version: FORMAT_VERSION,
        metric: file.metric,
        dim: file.dim,
        live: store.live(),
        slots: store.slots(),
        durable_seq: file.durable_seq,
        file_bytes: bytes.len() as u64,
        checksum: file.checksum,
    })
}

/// A file whose envelope and header passed their checks, its arrays not
/// yet decoded.
struct File<'a> {
    metric: Metric,
    dim: usize,
    count: usize,
    durable_seq: Seq,
    checksum: u32,
    ids: &'a [u8],
    seqs: &'a [u8],
    vectors: &'a [u8],
}

/// Checks, in this order: magic, length, version, end magic, checksum,
/// header fields, and that the arrays fill the body exactly.
fn parse(bytes: &[u8]) -> Result<File<'_>> {
    if bytes.get(..MAGIC.len()) != Some(MAGIC) {
        return Err(Error::corrupted("bad magic: not a flat index file"));
    }
    if bytes.len() < HEADER_LEN + TRAILER_LEN {
        return Err(Error::corrupted(format!(
            "truncated: {} bytes, a flat index file has at least {}",
            bytes.len(),
            HEADER_LEN + TRAILER_LEN
        )));
    }
    let mut r = ByteReader::new(bytes);
    r.bytes(MAGIC.len())?;
    let version = r.u32()?;
    if version != FORMAT_VERSION {
        return Err(Error::Version {
            found: version,
            supported: FORMAT_VERSION,
        });
    }
    let body_len = bytes.len() - TRAILER_LEN;
    let mut t = ByteReader::new(&bytes[body_len..]);
    let stored_crc = t.u32()?;
    if t.bytes(END_MAGIC.len())? != END_MAGIC {
        return Err(Error::corrupted("bad end magic: truncated or damaged file"));
    }
    let crc = crc32fast::hash(&bytes[..body_len]);
    if crc != stored_crc {
        return Err(Error::corrupted(format!(
            "checksum mismatch: stored {stored_crc:08x}, computed {crc:08x}"
        )));
    }

    let metric = Metric::from_tag(r.u8()?)?;
    if r.bytes(3)? != [0, 0, 0] {
        return Err(Error::corrupted(
            "reserved header bytes 13..16 are not zero",
        ));
    }
    let dim = r.u32()? as usize;
    if limits::check_dim(dim).is_err() {
        return Err(Error::corrupted(format!(
            "dimension {dim} outside 1..={}",
            limits::MAX_DIM
        )));
    }
    if r.u32()? != 0 {
        return Err(Error::corrupted(
            "reserved header bytes 20..24 are not zero",
        ));
    }
    let count = r.u64()?;
    let durable_seq = r.u64()?;
    debug_assert_eq!(r.position(), HEADER_LEN);
    let row_bytes = 16 + 4 * dim as u64;
    let expected = count
        .checked_mul(row_bytes)
        .and_then(|b| b.checked_add(HEADER_LEN as u64));
    if expected != Some(body_len as u64) {
        return Err(Error::corrupted(format!(
            "header says {count} vectors of dimension {dim}, the file holds {} bytes of them",
            body_len - HEADER_LEN
        )));
    }
    // The size equation bounds `count` by the file length.
    let count = count as usize;
    if count > MAX_SLOTS {
        return Err(Error::corrupted(format!(
            "{count} vectors exceed the {MAX_SLOTS} slots of an index"
        )));
    }
    let mut body = ByteReader::new(&bytes[HEADER_LEN..body_len]);
    Ok(File {
        metric,
        dim,
        count,
        durable_seq,
        checksum: crc,
        ids: body.bytes(8 * count)?,
        seqs: body.bytes(8 * count)?,
        vectors: body.bytes(4 * dim * count)?,
    })
}

impl File<'_> {
    /// Decodes the arrays into a store, checking every id (not reserved,
    /// unique) and vector (finite; of unit length under cosine).
    fn store(&self) -> Result<Store> {
        let mut store = Store::new(self.dim, self.metric);
        store.reserve(self.count)?;
        let mut ids = ByteReader::new(self.ids);
        let mut seqs = ByteReader::new(self.seqs);
        let mut vectors = ByteReader::new(self.vectors);
        let mut v = Vec::with_capacity(self.dim);
        for _ in 0..self.count {
            let id = ids.u64()?;
            let seq = seqs.u64()?;
            v.clear();
            vectors.f32s(self.dim, &mut v)?;
            if id == FREE {
                return Err(Error::corrupted(format!("reserved id {FREE} in the file")));
            }
            if store.slot_of(id).is_some() {
                return Err(Error::corrupted(format!("id {id} appears twice")));
            }
            if v.iter().any(|x| !x.is_finite()) {
                return Err(Error::corrupted(format!(
                    "vector of id {id} has a non-finite value"
                )));
            }
            if self.metric.normalizes() && (distance::norm_sq(&v) - 1.0).abs() > UNIT_TOLERANCE {
                return Err(Error::corrupted(format!(
                    "vector of id {id} is not of unit length under cosine"
                )));
            }
            store.put(seq, id, &v);
        }
        Ok(store)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vectide_core::VectorIndex;

    fn saved(metric: Metric) -> Vec<u8> {
        let idx = Flat::new(3, metric, FlatParams::default()).unwrap();
        idx.insert(
            4,
            &[7, 8, 9],
            &[1.0, 2.0, 3.0, -1.0, 0.5, 0.0, 0.0, 0.0, 2.0],
        )
        .unwrap();
        idx.delete(5, &[8]).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.flat");
        idx.save(&p).unwrap();
        assert_eq!(idx.durable_seq(), 5);
        std::fs::read(&p).unwrap()
    }

    #[test]
    fn layout_is_as_documented() {
        let b = saved(Metric::Cosine);
        assert_eq!(b.len(), HEADER_LEN + 2 * (16 + 12) + TRAILER_LEN);
        assert_eq!(&b[..8], MAGIC);
        assert_eq!(b[8..12], 1u32.to_le_bytes());
        assert_eq!(b[12], Metric::Cosine as u8);
        assert_eq!(b[16..20], 3u32.to_le_bytes());
        assert_eq!(b[24..32], 2u64.to_le_bytes());
        assert_eq!(b[32..40], 5u64.to_le_bytes());
        assert_eq!(b[40..48], 7u64.to_le_bytes(), "ids in slot order");
        assert_eq!(b[48..56], 9u64.to_le_bytes());
        assert_eq!(b[56..64], 4u64.to_le_bytes(), "seqs");
        let x = 1.0f32 / 14f32.sqrt();
        assert!((f32::from_le_bytes(b[72..76].try_into().unwrap()) - x).abs() < 1e-6);
        assert_eq!(b[92..96], 1.0f32.to_le_bytes(), "vectors, normalised");
        let crc_at = b.len() - TRAILER_LEN;
        assert_eq!(
            b[crc_at..crc_at + 4],
            crc32fast::hash(&b[..crc_at]).to_le_bytes()
        );
        assert_eq!(&b[crc_at + 4..], END_MAGIC);
    }

    #[test]
    fn each_check_has_its_error() {
        let good = saved(Metric::L2);
        let reseal = |b: &mut Vec<u8>| {
            let at = b.len() - TRAILER_LEN;
            let crc = crc32fast::hash(&b[..at]);
            b[at..at + 4].copy_from_slice(&crc.to_le_bytes());
        };
        let load = |b: &[u8]| {
            from_bytes(b, FlatParams::default())
                .map(|_| ())
                .unwrap_err()
        };
        assert!(matches!(load(b"VTDXHNSW"), Error::Corrupted(m) if m.contains("magic")));
        assert!(matches!(load(&good[..30]), Error::Corrupted(m) if m.contains("truncated")));
        let mut b = good.clone();
        b[8] = 2;
        assert!(matches!(
            load(&b),
            Error::Version {
                found: 2,
                supported: 1
            }
        ));
        let mut b = good.clone();
        b.pop();
        assert!(matches!(load(&b), Error::Corrupted(m) if m.contains("end magic")));
        let mut b = good.clone();
        b[45] ^= 1;
        assert!(matches!(load(&b), Error::Corrupted(m) if m.contains("checksum")));
        let cases: [(usize, &[u8], &str); 7] = [
            (12, &[7], "metric"),
            (14, &[1], "reserved"),
            (16, &[0], "dimension"),
            (24, &[3], "header says"),
            (40, &[9], "twice"),
            (40, &u64::MAX.to_le_bytes(), "reserved id"),
            (72, &f32::NAN.to_le_bytes(), "non-finite"),
        ];
        for (at, bytes, want) in cases {
            let mut b = good.clone();
            b[at..at + bytes.len()].copy_from_slice(bytes);
            reseal(&mut b);
            let e = load(&b);
            assert!(
                matches!(&e, Error::Corrupted(m) if m.contains(want)),
                "{want}: {e}"
            );
        }
        let mut b = saved(Metric::Cosine);
        b[72..76].copy_from_slice(&3.0f32.to_le_bytes());
        reseal(&mut b);
        assert!(load(&b).to_string().contains("unit length"));
    }
}
