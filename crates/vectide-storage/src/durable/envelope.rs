//! Sealed files: the envelope every manifest and snapshot of a durable
//! engine is written in, checked whole before one field is read.
//!
//! ```text
//! MAGIC (8) ‖ version u32 ‖ body … ‖ crc32 u32 of everything before ‖ END (8)
//! ```
//!
//! A file is written with [`Envelope::begin`] (magic and version), the
//! body, then [`Envelope::seal`] (CRC and end marker); it is read with
//! [`Envelope::open`], which checks magic, version, end marker and CRC and
//! hands back a bounds-checked reader positioned at the body. The end
//! marker tells a file cut short from one whose CRC is wrong; the CRC
//! covers the magic and the version too.

use std::path::Path;
use vectide_core::io::{atomic_write, check_envelope, ByteReader};
use vectide_core::{Error, Result};

/// The shape of one kind of sealed file.
#[derive(Debug, Clone, Copy)]
pub struct Envelope {
    /// First bytes.
    pub magic: &'static [u8; 8],
    /// Last bytes.
    pub end: &'static [u8; 8],
    /// The format version this build reads and writes.
    pub version: u32,
    /// The file kind, for errors ("fresh-diskann manifest").
    pub what: &'static str,
}

/// Bytes of the envelope around the body: magic, version, CRC, end.
pub const OVERHEAD: usize = 8 + 4 + 4 + 8;

impl Envelope {
    /// A buffer holding the magic and the version, with room for `body`
    /// more bytes: append the body, then [`Envelope::seal`] it.
    pub fn begin(&self, body: usize) -> Vec<u8> {
        let mut b = Vec::with_capacity(body + OVERHEAD);
        b.extend_from_slice(self.magic);
        b.extend_from_slice(&self.version.to_le_bytes());
        b
    }

    /// Appends the CRC of everything so far and the end marker.
    pub fn seal(&self, mut b: Vec<u8>) -> Vec<u8> {
        debug_assert!(b.starts_with(self.magic), "seal a buffer from begin()");
        let crc = crc32fast::hash(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        b.extend_from_slice(self.end);
        b
    }

    /// Checks a sealed file's envelope (magic, version, end marker, CRC)
    /// and returns a reader over its body. A different version is an
    /// [`Error::Version`]; anything else wrong is [`Error::Corrupted`].
    pub fn open<'a>(&self, bytes: &'a [u8]) -> Result<ByteReader<'a>> {
        let sealed = check_envelope(bytes, self.magic, self.end, self.version, 12, self.what)?;
        let mut r = ByteReader::new(sealed);
        r.magic_version(self.magic, self.version, self.what)?;
        Ok(r)
    }

    /// Whether the file at `path` starts with this envelope's magic.
    pub fn marks(&self, path: &Path) -> bool {
        vectide_core::io::file_starts_with(path, self.magic)
    }

    /// Reads a sealed file and hands its body to `parse`; errors name the
    /// file.
    pub fn read<T>(
        &self,
        path: &Path,
        parse: impl FnOnce(&mut ByteReader<'_>) -> Result<T>,
    ) -> Result<T> {
        let bytes = std::fs::read(path).map_err(|e| Error::io_at(path, e))?;
        self.open(&bytes)
            .and_then(|mut r| {
                let v = parse(&mut r)?;
                if r.remaining() != 0 {
                    return Err(Error::corrupted(format!(
                        "{}: bytes after the last field",
                        self.what
                    )));
                }
                Ok(v)
            })
            .map_err(|e| match e {
                Error::Corrupted(m) => Error::corrupted(format!("{}: {m}", path.display())),
                e => e,
            })
    }

    /// Replaces the file at `path` with sealed `bytes`, atomically (temp
    /// file, fsync, rename, directory fsync).
    pub fn write(&self, path: &Path, bytes: &[u8]) -> Result<()> {
        atomic_write(path, |w| {
            w.write_all(bytes).map_err(|e| Error::io_at(path, e))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const E: Envelope = Envelope {
        magic: b"VTDXTST\0",
        end: b"VTDXEND\0",
        version: 3,
        what: "test file",
    };

    fn sample() -> Vec<u8> {
        let mut b = E.begin(16);
        b.extend_from_slice(&7u64.to_le_bytes());
        b.extend_from_slice(&9u32.to_le_bytes());
        E.seal(b)
    }

    #[test]
    fn sealed_bytes_open_to_their_body() {
        let b = sample();
        assert_eq!(b.len(), 12 + OVERHEAD);
        let mut r = E.open(&b).unwrap();
        assert_eq!((r.u64().unwrap(), r.u32().unwrap()), (7, 9));
        assert_eq!(r.remaining(), 0);
    }

    #[test]
    fn every_flip_or_cut_is_an_error_and_a_new_version_is_a_version_error() {
        let good = sample();
        for i in 0..good.len() {
            let mut bad = good.clone();
            bad[i] ^= 0x10;
            assert!(E.open(&bad).is_err(), "flip at {i}");
        }
        for cut in 0..good.len() {
            assert!(E.open(&good[..cut]).is_err(), "cut at {cut}");
        }
        let newer = Envelope { version: 4, ..E };
        let b = newer.seal(newer.begin(0));
        assert!(matches!(
            E.open(&b),
            Err(Error::Version {
                found: 4,
                supported: 3
            })
        ));
    }

    #[test]
    fn files_round_trip_and_errors_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m");
        E.write(&path, &sample()).unwrap();
        assert!(E.marks(&path));
        let e = E.read(&path, |r| r.u64()).unwrap_err().to_string();
        assert!(e.contains("after the last field"), "{e}");
        assert_eq!(E.read(&path, |r| Ok((r.u64()?, r.u32()?))).unwrap(), (7, 9));
        let mut b = sample();
        b[13] ^= 1;
        std::fs::write(&path, &b).unwrap();
        let e = E.read(&path, |r| r.u64()).unwrap_err().to_string();
        assert!(e.contains(&path.display().to_string()), "{e}");
    }

    proptest! {
        #[test]
        fn the_parser_never_panics(body in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = E.open(&body);
            let mut b = E.begin(body.len());
            b.extend_from_slice(&body);
            let sealed = E.seal(b);
            let r = E.open(&sealed).unwrap();
            prop_assert_eq!(r.remaining(), body.len());
        }
    }
}
