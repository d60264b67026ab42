//! Crash-safe whole-file writes: temp file, fsync, rename, directory fsync.

use crate::error::{Error, Result};
use crate::sync::{self, SyncSite};
use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// Whether the file at `path` starts with `magic` (false when it cannot be
/// read or is shorter). Reads only the first bytes.
pub fn file_starts_with(path: &Path, magic: &[u8]) -> bool {
    use std::io::Read;
    let mut buf = vec![0u8; magic.len()];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut buf))
        .is_ok()
        && buf == magic
}

/// Writes a file atomically: `write` fills a temp file beside `path`, which is
/// fsynced and renamed over `path`; the directory is fsynced so the rename
/// survives a crash. On any error the old file (if any) is untouched and the
/// temp file is removed.
pub fn atomic_write<F>(path: &Path, write: F) -> Result<()>
where
    F: FnOnce(&mut dyn Write) -> Result<()>,
{
    stage_write(path, write)?.commit()
}

/// The first half of [`atomic_write`]: `write` fills the temp file (in the
/// page cache, no fsync yet). The returned [`StagedFile`] makes it durable
/// and puts it in place; dropped without a commit, it removes the temp
/// file. So a caller can write its state under its locks and leave the
/// fsync to after it released them.
pub fn stage_write<F>(path: &Path, write: F) -> Result<StagedFile>
where
    F: FnOnce(&mut dyn Write) -> Result<()>,
{
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = path
        .file_name()
        .ok_or_else(|| Error::invalid(format!("not a file path: {}", path.display())))?;
    let tmp = dir.join(format!(
        ".{}.tmp-{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let file = File::create(&tmp).map_err(|e| Error::io_at(&tmp, e))?;
    // From here on the guard removes the temp file on any error.
    let mut staged = StagedFile {
        path: path.to_path_buf(),
        dir,
        tmp,
        file: None,
    };
    let mut w = BufWriter::with_capacity(1 << 20, file);
    write(&mut w)?;
    let file = w
        .into_inner()
        .map_err(|e| Error::io_at(&staged.tmp, e.into_error()))?;
    staged.file = Some(file);
    Ok(staged)
}

/// A whole file written beside its target and not yet durable (see
/// [`stage_write`]).
#[derive(Debug)]
pub struct StagedFile {
    path: PathBuf,
    dir: PathBuf,
    tmp: PathBuf,
    /// `None` until written, and after the commit.
    file: Option<File>,
}

impl StagedFile {
    /// fsyncs the temp file, renames it over the target and fsyncs the
    /// directory. On an error the target is untouched (or, if the rename
    /// happened, already the new file) and the temp file is removed.
    pub fn commit(mut self) -> Result<()> {
        let file = self
            .file
            .take()
            .ok_or_else(|| Error::invalid("a staged file was committed before it was written"))?;
        sync::sync_file(&file, &self.tmp, ATOMIC_WRITE_FILE, false)?;
        fs::rename(&self.tmp, &self.path).map_err(|e| Error::io_at(&self.path, e))?;
        // Renamed: nothing is left for the drop to remove.
        self.tmp = PathBuf::new();
        sync::sync_dir(&self.dir, ATOMIC_WRITE_DIR)
    }
}

impl Drop for StagedFile {
    fn drop(&mut self) {
        if !self.tmp.as_os_str().is_empty() {
            let _ = fs::remove_file(&self.tmp);
        }
    }
}

/// Sync site of [`atomic_write`]'s fsync of the temp file.
pub const ATOMIC_WRITE_FILE: SyncSite = SyncSite("atomic_write.file");
/// Sync site of [`atomic_write`]'s fsync of the directory after the rename.
pub const ATOMIC_WRITE_DIR: SyncSite = SyncSite("atomic_write.dir");
/// Sync site of [`sync_dir`] (callers without a site of their own).
pub const DIR: SyncSite = SyncSite("dir");

/// fsyncs a directory so that renames and creations in it are durable,
/// through the sync point of site [`DIR`]; [`sync::sync_dir`] names its own.
pub fn sync_dir(dir: &Path) -> Result<()> {
    sync::sync_dir(dir, DIR)
}

/// A writer that feeds a CRC32 as bytes pass through it.
pub struct CrcWriter<'a> {
    inner: &'a mut dyn Write,
    hasher: crc32fast::Hasher,
}

impl<'a> CrcWriter<'a> {
    pub fn new(inner: &'a mut dyn Write) -> Self {
        CrcWriter {
            inner,
            hasher: crc32fast::Hasher::new(),
        }
    }
    /// The CRC32 of everything written so far.
    pub fn crc(&self) -> u32 {
        self.hasher.clone().finalize()
    }
    pub fn put(&mut self, bytes: &[u8]) -> Result<()> {
        self.write_all(bytes).map_err(Error::from)
    }
}

impl Write for CrcWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Appends the CRC-32 of `out[start..]` (the section begun at `start`), as
/// [`ByteReader::crc_of_preceding`] checks it.
pub fn push_crc(out: &mut Vec<u8>, start: usize) {
    let crc = crc32fast::hash(&out[start..]);
    out.extend_from_slice(&crc.to_le_bytes());
}

/// A bounds-checked little-endian reader over a byte slice: every read past
/// the end is a [`Error::Corrupted`], never a panic.
pub struct ByteReader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> ByteReader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        ByteReader { buf, pos: 0 }
    }
    pub fn position(&self) -> usize {
        self.pos
    }
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }
    /// The bytes not read yet (the reader does not move): for a section
    /// whose own parser says how much of it was used.
    pub fn rest(&self) -> &'a [u8] {
        &self.buf[self.pos..]
    }
    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or_else(|| {
                Error::corrupted(format!(
                    "truncated: wanted {n} bytes at offset {}, {} left",
                    self.pos,
                    self.remaining()
                ))
            })?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    /// Reads a magic and a format version: a different magic is
    /// corruption ("not a Vectide `what`"), a different version a
    /// [`Error::Version`].
    pub fn magic_version(&mut self, magic: &[u8], version: u32, what: &str) -> Result<()> {
        self.magic_version_in(magic, version..=version, what)
            .map(|_| ())
    }
    /// [`magic_version`](Self::magic_version) for a reader of several
    /// versions: returns the one found, a version outside `versions` is an
    /// [`Error::Version`] naming the newest read.
    pub fn magic_version_in(
        &mut self,
        magic: &[u8],
        versions: std::ops::RangeInclusive<u32>,
        what: &str,
    ) -> Result<u32> {
        if self.bytes(magic.len())? != magic {
            return Err(Error::corrupted(format!(
                "not a Vectide {what} (bad magic)"
            )));
        }
        let found = self.u32()?;
        if !versions.contains(&found) {
            return Err(Error::Version {
                found,
                supported: *versions.end(),
            });
        }
        Ok(found)
    }
    /// Reads a CRC-32 and checks it against everything before it in the
    /// buffer (a section that ends in the CRC of its own bytes).
    pub fn crc_of_preceding(&mut self, what: &str) -> Result<()> {
        let end = self.pos;
        if self.u32()? != crc32fast::hash(&self.buf[..end]) {
            return Err(Error::corrupted(format!("{what}: checksum mismatch")));
        }
        Ok(())
    }
    pub fn u8(&mut self) -> Result<u8> {
        Ok(self.bytes(1)?[0])
    }
    pub fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(
            self.bytes(4)?.try_into().expect("4 bytes"),
        ))
    }
    pub fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(
            self.bytes(8)?.try_into().expect("8 bytes"),
        ))
    }
    /// Reads `n` little-endian u32 values into `out`.
    pub fn u32s(&mut self, n: usize, out: &mut Vec<u32>) -> Result<()> {
        let b = self.bytes(
            n.checked_mul(4)
                .ok_or_else(|| Error::corrupted("length overflow"))?,
        )?;
        out.extend(
            b.chunks_exact(4)
                .map(|c| u32::from_le_bytes(c.try_into().expect("4"))),
        );
        Ok(())
    }
    /// Reads `n` little-endian f32 values into `out`.
    pub fn f32s(&mut self, n: usize, out: &mut Vec<f32>) -> Result<()> {
        let b = self.bytes(
            n.checked_mul(4)
                .ok_or_else(|| Error::corrupted("length overflow"))?,
        )?;
        out.extend(
            b.chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().expect("4"))),
        );
        Ok(())
    }
}

/// A matrix file of the benchmark dataset sidecars (`docs/format-vbin.md`,
/// the `fbin` / `ibin` layout of big-ann-benchmarks): u32 rows, u32 cols,
/// then rows·cols 4-byte little-endian values, row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct Matrix {
    pub rows: usize,
    pub cols: usize,
    values: Vec<u8>,
}

impl Matrix {
    /// Reads one; a file whose length does not match its shape is
    /// [`Error::Corrupted`].
    pub fn read(path: &Path) -> Result<Matrix> {
        let bytes = fs::read(path).map_err(|e| Error::io_at(path, e))?;
        Matrix::parse(&bytes).map_err(|e| match e {
            Error::Corrupted(m) => Error::corrupted(format!("{}: {m}", path.display())),
            e => e,
        })
    }

    /// Parses a matrix file's bytes (see [`Matrix::read`]).
    pub fn parse(bytes: &[u8]) -> Result<Matrix> {
        let mut r = ByteReader::new(bytes);
        let rows = r.u32()? as usize;
        let cols = r.u32()? as usize;
        let body = r.bytes(r.remaining())?;
        if rows.checked_mul(cols).and_then(|n| n.checked_mul(4)) != Some(body.len()) {
            return Err(Error::corrupted(format!(
                "header says {rows} x {cols} but the file holds {} bytes of data",
                body.len()
            )));
        }
        Ok(Matrix {
            rows,
            cols,
            values: body.to_vec(),
        })
    }

    /// The values as f32 (an `.fbin`).
    pub fn f32s(&self) -> Vec<f32> {
        self.values
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
            .collect()
    }

    /// The values as i32 (an `.ibin`).
    pub fn i32s(&self) -> Vec<i32> {
        self.values
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes(c.try_into().expect("4 bytes")))
            .collect()
    }
}

/// The envelope of a single-file index (`MAGIC | version u32 | body… |
/// crc32 u32 | END_MAGIC`): checks the magic, that the file holds at least
/// `min_len` bytes before its trailer, the version, the end marker and the
/// CRC32 of everything before it. Returns the checksummed part (the magic
/// and version included). `what` names the file kind in errors.
pub fn check_envelope<'a>(
    bytes: &'a [u8],
    magic: &[u8; 8],
    end_magic: &[u8; 8],
    version: u32,
    min_len: usize,
    what: &str,
) -> Result<&'a [u8]> {
    if bytes.len() < magic.len() || &bytes[..magic.len()] != magic {
        return Err(Error::corrupted(format!(
            "not a Vectide {what} file (bad magic)"
        )));
    }
    if bytes.len() < min_len + 12 {
        return Err(Error::corrupted(format!(
            "truncated: {} bytes is shorter than a header",
            bytes.len()
        )));
    }
    let found = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
    if found != version {
        return Err(Error::Version {
            found,
            supported: version,
        });
    }
    let (rest, end) = bytes.split_at(bytes.len() - end_magic.len());
    if end != end_magic {
        return Err(Error::corrupted("truncated: end marker missing"));
    }
    let (body, crc) = rest.split_at(rest.len() - 4);
    let want = u32::from_le_bytes(crc.try_into().expect("4 bytes"));
    let got = crc32fast::hash(body);
    if want != got {
        return Err(Error::corrupted(format!(
            "checksum mismatch: stored {want:#010x}, computed {got:#010x}"
        )));
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_write_replaces_and_cleans_up_on_error() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f.bin");
        atomic_write(&p, |w| Ok(w.write_all(b"one")?)).unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"one");
        let r = atomic_write(&p, |w| {
            w.write_all(b"two")?;
            Err(Error::invalid("boom"))
        });
        assert!(r.is_err());
        assert_eq!(fs::read(&p).unwrap(), b"one", "old file untouched");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1, "temp removed");
    }

    #[test]
    fn a_staged_file_is_in_place_only_once_committed() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f.bin");
        atomic_write(&p, |w| Ok(w.write_all(b"one")?)).unwrap();
        let staged = stage_write(&p, |w| Ok(w.write_all(b"two")?)).unwrap();
        assert_eq!(
            fs::read(&p).unwrap(),
            b"one",
            "not in place before the commit"
        );
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 2);
        drop(staged);
        assert_eq!(fs::read(&p).unwrap(), b"one");
        assert_eq!(
            fs::read_dir(dir.path()).unwrap().count(),
            1,
            "a dropped stage is removed"
        );
        stage_write(&p, |w| Ok(w.write_all(b"three")?))
            .unwrap()
            .commit()
            .unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"three");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn matrices_read_by_shape_and_bad_lengths_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m.fbin");
        let file = |rows: u32, cols: u32, values: &[u8]| {
            let mut b = rows.to_le_bytes().to_vec();
            b.extend_from_slice(&cols.to_le_bytes());
            b.extend_from_slice(values);
            fs::write(&p, b).unwrap();
        };
        let values: Vec<u8> = [1.5f32, -2.0, 3.0, 4.25, 5.0, 6.0]
            .iter()
            .flat_map(|f| f.to_le_bytes())
            .collect();
        file(3, 2, &values);
        let m = Matrix::read(&p).unwrap();
        assert_eq!((m.rows, m.cols), (3, 2));
        assert_eq!(m.f32s(), [1.5, -2.0, 3.0, 4.25, 5.0, 6.0]);
        file(2, 1, &[7, 0, 0, 0, 0xff, 0xff, 0xff, 0xff]);
        assert_eq!(Matrix::read(&p).unwrap().i32s(), [7, -1]);
        file(4, 2, &values);
        let e = Matrix::read(&p).unwrap_err().to_string();
        assert!(e.contains("header says 4 x 2"), "{e}");
        // A shape whose byte count overflows, and a file shorter than its
        // header: errors, not panics.
        file(u32::MAX, u32::MAX, &values);
        assert!(matches!(Matrix::read(&p), Err(Error::Corrupted(_))));
        fs::write(&p, [1u8, 2, 3]).unwrap();
        assert!(matches!(Matrix::read(&p), Err(Error::Corrupted(_))));
        assert!(Matrix::read(&dir.path().join("none")).is_err());
    }

    proptest::proptest! {
        /// Fuzz: any bytes parse to a matrix whose shape accounts for every
        /// byte, or to an error; never a panic.
        #[test]
        fn matrix_parsing_takes_any_bytes(
            rows in 0u32..4, cols in 0u32..4, extra in proptest::collection::vec(proptest::num::u8::ANY, 0..40),
            raw in proptest::bool::ANY,
        ) {
            let mut b = Vec::new();
            if !raw {
                b.extend_from_slice(&rows.to_le_bytes());
                b.extend_from_slice(&cols.to_le_bytes());
            }
            b.extend_from_slice(&extra);
            if let Ok(m) = Matrix::parse(&b) {
                proptest::prop_assert_eq!(8 + 4 * m.rows * m.cols, b.len());
                proptest::prop_assert_eq!(m.f32s().len(), m.rows * m.cols);
            }
        }
    }

    #[test]
    fn a_section_sealed_by_push_crc_checks_and_a_flip_fails() {
        let mut b = vec![9u8, 9];
        push_crc(&mut b, 1);
        // The CRC covers the section from `start`: read from there.
        let mut r = ByteReader::new(&b[1..]);
        assert_eq!(r.u8().unwrap(), 9);
        r.crc_of_preceding("test").unwrap();
        let mut flipped = b[1..].to_vec();
        flipped[0] ^= 1;
        let mut r = ByteReader::new(&flipped);
        r.u8().unwrap();
        assert!(matches!(
            r.crc_of_preceding("test"),
            Err(Error::Corrupted(_))
        ));
    }

    #[test]
    fn byte_reader_reports_truncation() {
        let mut r = ByteReader::new(&[1, 0, 0, 0, 2]);
        assert_eq!(r.u32().unwrap(), 1);
        assert!(matches!(r.u32(), Err(Error::Corrupted(_))));
        assert_eq!(r.u8().unwrap(), 2);
    }
}
