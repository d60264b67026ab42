//! A write-ahead log: length- and CRC-framed records appended to one file
//! (`docs/format-wal.md`).
//!
//! ```text
//! file   := header record*
//! header := "VTDXWAL\0" (8) | version u32 | reserved u32      (16 bytes)
//! record := len u32 | crc32(payload) u32 | payload (len bytes)
//! ```
//!
//! Appends go to an in-memory buffer; [`Wal::sync`] writes it and
//! `fdatasync`s. A record is durable once a `sync` that followed it
//! returned. Replay ([`Wal::open`]) returns every complete record whose CRC
//! matches, stops at the first one that does not (a torn tail: the crash
//! came in the middle of a write) and truncates the file there, so the next
//! append continues a clean log.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use vectide_core::{Error, Result};

pub const WAL_MAGIC: &[u8; 8] = b"VTDXWAL\0";
pub const WAL_VERSION: u32 = 1;
/// Bytes of the file header.
pub const HEADER: usize = 16;
/// Largest payload accepted (a record claiming more is treated as torn).
pub const MAX_RECORD: usize = 64 << 20;

/// The 16-byte header every log file starts with.
pub fn header_bytes() -> [u8; HEADER] {
    let mut h = [0u8; HEADER];
    h[..8].copy_from_slice(WAL_MAGIC);
    h[8..12].copy_from_slice(&WAL_VERSION.to_le_bytes());
    h
}

/// Appends one framed record (`len | crc32 | payload`) to `out`.
pub fn frame(payload: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
    out.extend_from_slice(payload);
}

/// An append-only log file.
#[derive(Debug)]
pub struct Wal {
    path: PathBuf,
    file: File,
    buf: Vec<u8>,
    /// Bytes in the file (synced or at least written).
    len: u64,
    unsynced: u64,
    syncs: u64,
}

impl Wal {
    /// Opens (or creates) the log and returns it with the payloads of its
    /// valid records, oldest first. A torn tail is cut off.
    pub fn open(path: &Path) -> Result<(Wal, Vec<Vec<u8>>)> {
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(|e| Error::io_at(path, e))?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)
            .map_err(|e| Error::io_at(path, e))?;
        let mut records = Vec::new();
        let end = if bytes.is_empty() {
            file.write_all(&header_bytes())
                .map_err(|e| Error::io_at(path, e))?;
            file.sync_all().map_err(|e| Error::io_at(path, e))?;
            HEADER
        } else {
            if bytes.len() < HEADER || &bytes[..8] != WAL_MAGIC {
                return Err(Error::corrupted(format!(
                    "{}: not a Vectide WAL (bad magic)",
                    path.display()
                )));
            }
            let v = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
            if v != WAL_VERSION {
                return Err(Error::Version {
                    found: v,
                    supported: WAL_VERSION,
                });
            }
            let mut at = HEADER;
            while at + 8 <= bytes.len() {
                let n = u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4")) as usize;
                let crc = u32::from_le_bytes(bytes[at + 4..at + 8].try_into().expect("4"));
                if n > MAX_RECORD || at + 8 + n > bytes.len() {
                    break;
                }
                let payload = &bytes[at + 8..at + 8 + n];
                if crc32fast::hash(payload) != crc {
                    break;
                }
                records.push(payload.to_vec());
                at += 8 + n;
            }
            at
        };
        if (end as u64) < bytes.len().max(HEADER) as u64 {
            file.set_len(end as u64)
                .map_err(|e| Error::io_at(path, e))?;
            file.sync_all().map_err(|e| Error::io_at(path, e))?;
        }
        file.seek(SeekFrom::Start(end as u64))
            .map_err(|e| Error::io_at(path, e))?;
        Ok((
            Wal {
                path: path.to_path_buf(),
                file,
                buf: Vec::new(),
                len: end as u64,
                unsynced: 0,
                syncs: 0,
            },
            records,
        ))
    }

    /// Appends a record to the buffer (not yet durable).
    pub fn append(&mut self, payload: &[u8]) -> Result<()> {
        if payload.len() > MAX_RECORD {
            return Err(Error::invalid(format!(
                "WAL record of {} bytes exceeds the {MAX_RECORD}-byte limit",
                payload.len()
            )));
        }
        frame(payload, &mut self.buf);
        Ok(())
    }

    /// Bytes appended but not yet written.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// Writes the buffer to the file (the OS page cache: it survives a
    /// process crash, not a power loss) without `fdatasync`.
    pub fn write_out(&mut self) -> Result<()> {
        if !self.buf.is_empty() {
            self.file
                .write_all(&self.buf)
                .map_err(|e| Error::io_at(&self.path, e))?;
            self.len += self.buf.len() as u64;
            self.unsynced += self.buf.len() as u64;
            self.buf.clear();
        }
        Ok(())
    }

    /// Bytes written since the last `fdatasync` (buffered ones included).
    pub fn unsynced(&self) -> u64 {
        self.unsynced + self.buf.len() as u64
    }

    /// Writes the buffer and `fdatasync`s: every record appended so far is
    /// durable when this returns.
    pub fn sync(&mut self) -> Result<()> {
        self.write_out()?;
        self.unsynced = 0;
        self.file
            .sync_data()
            .map_err(|e| Error::io_at(&self.path, e))?;
        self.syncs += 1;
        Ok(())
    }

    /// Drops every record (after a checkpoint made them redundant).
    pub fn truncate(&mut self) -> Result<()> {
        self.buf.clear();
        self.unsynced = 0;
        self.file
            .set_len(HEADER as u64)
            .map_err(|e| Error::io_at(&self.path, e))?;
        self.file
            .seek(SeekFrom::Start(HEADER as u64))
            .map_err(|e| Error::io_at(&self.path, e))?;
        self.file
            .sync_all()
            .map_err(|e| Error::io_at(&self.path, e))?;
        self.len = HEADER as u64;
        Ok(())
    }

    /// File size in bytes (written records).
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the log holds no written record.
    pub fn is_empty(&self) -> bool {
        self.len as usize == HEADER && self.buf.is_empty()
    }

    /// `fdatasync`s so far.
    pub fn syncs(&self) -> u64 {
        self.syncs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_torn_tails_are_cut() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("w");
        let (mut w, r) = Wal::open(&p).unwrap();
        assert!(r.is_empty() && w.is_empty());
        w.append(b"one").unwrap();
        w.append(b"").unwrap();
        w.append(&[7u8; 1000]).unwrap();
        assert!(w.buffered() > 1000);
        w.sync().unwrap();
        w.append(b"lost: never synced").unwrap();
        drop(w);
        let (mut w, r) = Wal::open(&p).unwrap();
        assert_eq!(r, vec![b"one".to_vec(), vec![], vec![7u8; 1000]]);
        w.append(b"four").unwrap();
        w.sync().unwrap();
        drop(w);
        // Tear the last record: flip a payload byte, then cut mid-record.
        let mut bytes = std::fs::read(&p).unwrap();
        let n = bytes.len();
        bytes[n - 1] ^= 1;
        std::fs::write(&p, &bytes).unwrap();
        let (w, r) = Wal::open(&p).unwrap();
        assert_eq!(
            r.len(),
            3,
            "the corrupted record and what follows are dropped"
        );
        assert_eq!(
            w.len() as usize,
            n - 12,
            "the file was cut at the torn record"
        );
        drop(w);
        let mut bytes = std::fs::read(&p).unwrap();
        bytes.truncate(bytes.len() - 3);
        std::fs::write(&p, &bytes).unwrap();
        let (mut w, r) = Wal::open(&p).unwrap();
        assert_eq!(r.len(), 2);
        w.truncate().unwrap();
        drop(w);
        let (_, r) = Wal::open(&p).unwrap();
        assert!(r.is_empty());
        std::fs::write(&p, b"garbage garbage garbage").unwrap();
        assert!(matches!(Wal::open(&p), Err(Error::Corrupted(_))));
        let mut bad = WAL_MAGIC.to_vec();
        bad.extend_from_slice(&9u32.to_le_bytes());
        bad.extend_from_slice(&0u32.to_le_bytes());
        std::fs::write(&p, &bad).unwrap();
        assert!(matches!(
            Wal::open(&p),
            Err(Error::Version { found: 9, .. })
        ));
    }
}
