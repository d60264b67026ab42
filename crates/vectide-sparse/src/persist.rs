//! Save and load (`docs/format-sparse.md`).
//!
//! A save writes every document's vector in document order through a
//! CRC-32 writer into a file staged beside its target; the caller commits
//! it (fsync, rename, directory fsync) outside its locks. A load believes
//! nothing before the magic, the version, the end magic and the checksum
//! are right, then reads every field through the one bounds-checked
//! reader ([`ByteReader`]): a damaged file is [`Error::Corrupted`] or
//! [`Error::Version`], never a panic, and no allocation exceeds what the
//! file's length implies. The posting lists and their bounds are rebuilt
//! from the vectors.

use crate::index::{Modifier, SparseIndex};
use crate::vector::{SparseVector, MAX_NNZ};
use std::io::Write;
use std::path::Path;
use vectide_core::io::{stage_write, ByteReader, CrcWriter, StagedFile};
use vectide_core::{Error, Result};

/// First bytes of a sparse index file.
pub const MAGIC: &[u8; 8] = b"VTDXSPRS";
/// Last bytes.
pub const END_MAGIC: &[u8; 8] = b"VTDXEND\0";
/// The format version this build writes and reads.
pub const FORMAT_VERSION: u32 = 1;
/// Bytes of the header: magic, version, modifier, applied sequence
/// number, documents.
pub const HEADER_LEN: usize = 8 + 4 + 1 + 8 + 8;
/// Bytes of the trailer: CRC-32, end magic.
pub const TRAILER_LEN: usize = 4 + 8;

fn modifier_code(m: Modifier) -> u8 {
    match m {
        Modifier::None => 0,
        Modifier::Idf => 1,
    }
}

impl SparseIndex {
    /// The index's bytes (what [`SparseIndex::save_staged`] writes).
    pub fn write_to(&self, out: &mut dyn Write) -> Result<()> {
        let mut w = CrcWriter::new(out);
        let mut head = Vec::with_capacity(HEADER_LEN);
        head.extend_from_slice(MAGIC);
        head.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        head.push(modifier_code(self.modifier));
        head.extend_from_slice(&self.applied.to_le_bytes());
        head.extend_from_slice(&(self.docs.len() as u64).to_le_bytes());
        w.put(&head)?;
        let mut ids: Vec<u64> = self.docs.keys().copied().collect();
        ids.sort_unstable();
        let mut buf = Vec::with_capacity(1 << 16);
        for id in ids {
            let v = &self.docs[&id];
            buf.extend_from_slice(&id.to_le_bytes());
            buf.extend_from_slice(&(v.len() as u32).to_le_bytes());
            for t in v.indices() {
                buf.extend_from_slice(&t.to_le_bytes());
            }
            for x in v.values() {
                buf.extend_from_slice(&x.to_le_bytes());
            }
            if buf.len() >= 1 << 16 {
                w.put(&buf)?;
                buf.clear();
            }
        }
        w.put(&buf)?;
        let crc = w.crc();
        out_tail(w, crc)
    }

    /// Writes the index beside `path` (not yet durable); the returned file
    /// holds every operation through [`SparseIndex::applied_seq`].
    pub fn save_staged(&self, path: &Path) -> Result<StagedFile> {
        stage_write(path, |out| self.write_to(out))
    }

    /// Reads an index file.
    pub fn load(path: &Path) -> Result<SparseIndex> {
        let bytes = std::fs::read(path).map_err(|e| Error::io_at(path, e))?;
        SparseIndex::parse(&bytes).map_err(|e| match e {
            Error::Corrupted(m) => Error::corrupted(format!("{}: {m}", path.display())),
            other => other,
        })
    }

    /// Parses an index file's bytes.
    pub fn parse(bytes: &[u8]) -> Result<SparseIndex> {
        if bytes.len() < HEADER_LEN + TRAILER_LEN {
            return Err(Error::corrupted(format!(
                "sparse index: {} bytes, shorter than a header and trailer",
                bytes.len()
            )));
        }
        let mut r = ByteReader::new(bytes);
        r.magic_version(MAGIC, FORMAT_VERSION, "sparse index")?;
        let body_end = bytes.len() - TRAILER_LEN;
        let mut t = ByteReader::new(&bytes[body_end..]);
        let crc = t.u32()?;
        if t.bytes(8)? != END_MAGIC {
            return Err(Error::corrupted("sparse index: bad end magic (truncated?)"));
        }
        if crc != crc32fast::hash(&bytes[..body_end]) {
            return Err(Error::corrupted("sparse index: checksum mismatch"));
        }
        let modifier = match r.u8()? {
            0 => Modifier::None,
            1 => Modifier::Idf,
            m => {
                return Err(Error::corrupted(format!(
                    "sparse index: unknown modifier {m}"
                )))
            }
        };
        let applied = r.u64()?;
        let n = r.u64()?;
        let mut body = ByteReader::new(&bytes[r.position()..body_end]);
        if n > (body.remaining() / 12) as u64 {
            return Err(Error::corrupted(format!(
                "sparse index: {n} documents cannot fit in {} bytes",
                body.remaining()
            )));
        }
        let mut index = SparseIndex::new(modifier);
        let mut last: Option<u64> = None;
        let (mut idx, mut vals) = (Vec::new(), Vec::new());
        for _ in 0..n {
            let id = body.u64()?;
            if last.is_some_and(|l| l >= id) {
                return Err(Error::corrupted(format!(
                    "sparse index: document {id} out of order"
                )));
            }
            last = Some(id);
            let nnz = body.u32()? as usize;
            if nnz > MAX_NNZ {
                return Err(Error::corrupted(format!(
                    "sparse index: document {id} claims {nnz} terms"
                )));
            }
            idx.clear();
            vals.clear();
            body.u32s(nnz, &mut idx)?;
            body.f32s(nnz, &mut vals)?;
            let v = SparseVector::new(idx.clone(), vals.clone())
                .map_err(|e| Error::corrupted(format!("sparse index: document {id}: {e}")))?;
            index.upsert(0, id, v);
        }
        if body.remaining() != 0 {
            return Err(Error::corrupted(
                "sparse index: bytes after the last document",
            ));
        }
        index.applied = applied;
        Ok(index)
    }
}

fn out_tail(mut w: CrcWriter<'_>, crc: u32) -> Result<()> {
    let mut tail = Vec::with_capacity(TRAILER_LEN);
    tail.extend_from_slice(&crc.to_le_bytes());
    tail.extend_from_slice(END_MAGIC);
    w.put(&tail)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn save_load_round_trip_and_damage_is_refused() {
        let mut x = SparseIndex::new(Modifier::Idf);
        for d in 0..500u64 {
            let t: Vec<u32> = (0..(d % 7 + 1) as u32)
                .map(|i| i * 3 + (d % 5) as u32)
                .collect();
            let v: Vec<f32> = t.iter().map(|&i| i as f32 * 0.25 - 1.0).collect();
            x.upsert(d + 1, d * 3, SparseVector::new(t, v).unwrap());
        }
        x.delete(900, 9);
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s.vtsp");
        x.save_staged(&p).unwrap().commit().unwrap();
        let y = SparseIndex::load(&p).unwrap();
        assert_eq!(y.len(), x.len());
        assert_eq!(y.applied_seq(), 900);
        assert_eq!(y.modifier(), Modifier::Idf);
        for (d, v) in x.iter() {
            assert_eq!(y.get(d), Some(v));
        }
        y.check();
        let bytes = std::fs::read(&p).unwrap();
        for cut in [0, 10, HEADER_LEN, bytes.len() - 1] {
            assert!(SparseIndex::parse(&bytes[..cut]).is_err());
        }
        let mut bad = bytes.clone();
        bad[HEADER_LEN + 3] ^= 1;
        let e = SparseIndex::parse(&bad).unwrap_err();
        assert!(e.to_string().contains("checksum"), "{e}");
        let mut v2 = bytes.clone();
        v2[8] = 2;
        assert!(matches!(
            SparseIndex::parse(&v2),
            Err(Error::Version { .. })
        ));
    }
}
