//! [`Region`]: a byte-addressable region backed by a memory-mapped file.
//!
//! The file is mapped `MAP_SHARED` into an address range reserved once, much
//! larger than the file (`MAP_NORESERVE`, so the reservation costs address
//! space only). Growing the region extends the file with `ftruncate` inside
//! that range: the base address never moves, so pointers into the region stay
//! valid while other threads read it, and nothing is rewritten. Bytes beyond
//! the file's length are never touched (they would fault).
//!
//! A region does not decide how bytes become durable: its [`Media`] does.
//! `persist(site, range)` starts writing a range back, `fence(site)` waits
//! until everything persisted before it (in every region of the same media) is
//! durable. Stores between two fences may reach the media in any order, or
//! not at all if the process or machine dies first; only 8-byte aligned stores
//! are atomic.

use crate::media::Media;
use parking_lot::Mutex;
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use vectide_core::sync::{sync_file, SyncSite};
use vectide_core::{Error, Result};

/// Sync site of [`Region::create`] (the new file's length).
pub const SYNC_CREATE: SyncSite = SyncSite("region.create");
/// Sync site of [`Region::grow`] (the new length).
pub const SYNC_GROW: SyncSite = SyncSite("region.grow");

/// The name of a `persist` or `fence` call site. Sites are what the crash
/// simulator counts and what its mutation check disables one at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Site(pub &'static str);

/// How a persistent engine makes its region durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PersistMode {
    /// Cache-line write-back (`clwb`) + `sfence`: persistent memory (DAX with
    /// `MAP_SYNC`) or its DRAM emulation on `/dev/shm`.
    Pmem,
    /// `msync` of the dirty pages at every fence, with group commit: ordinary
    /// disks.
    Msync,
}

impl PersistMode {
    /// Parses `"pmem"` or `"msync"`.
    pub fn parse(text: &str) -> Result<Self> {
        match text {
            "pmem" => Ok(PersistMode::Pmem),
            "msync" => Ok(PersistMode::Msync),
            other => Err(Error::invalid(format!(
                "persist must be \"pmem\" or \"msync\", got {other:?}"
            ))),
        }
    }

    /// The name [`PersistMode::parse`] reads.
    pub fn name(self) -> &'static str {
        match self {
            PersistMode::Pmem => "pmem",
            PersistMode::Msync => "msync",
        }
    }
}

/// Address space reserved per region: growth beyond it needs a reopen.
pub const DEFAULT_RESERVE: usize = 1 << 40;

/// A memory-mapped file whose bytes a [`Media`] makes durable.
pub struct Region {
    path: PathBuf,
    file: File,
    base: *mut u8,
    reserved: usize,
    len: AtomicUsize,
    media: Arc<dyn Media>,
    id: u32,
    grow_lock: Mutex<()>,
}

// SAFETY: the mapping is shared memory owned by this value until drop; all
// access to its bytes goes through atomics or through `unsafe` accessors
// whose callers uphold the engine's exclusivity protocol. The raw pointer is
// the only non-Send/Sync field, and it is never freed while borrowed (munmap
// happens in Drop, which needs ownership).
unsafe impl Send for Region {}
// SAFETY: see `Send`; shared access is synchronised by the callers' protocol.
unsafe impl Sync for Region {}

impl std::fmt::Debug for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Region")
            .field("path", &self.path)
            .field("len", &self.len())
            .field("media", &self.media.kind())
            .finish()
    }
}

impl Region {
    /// Creates a new region file of `len` bytes (zero-filled); fails if the
    /// file exists.
    pub fn create(media: Arc<dyn Media>, path: &Path, len: usize) -> Result<Region> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)
            .map_err(|e| Error::io_at(path, e))?;
        file.set_len(len as u64)
            .map_err(|e| Error::io_at(path, e))?;
        sync_file(&file, path, SYNC_CREATE, false)?;
        Self::map(media, path, file, len)
    }

    /// Opens an existing region file with its current length.
    pub fn open(media: Arc<dyn Media>, path: &Path) -> Result<Region> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| Error::io_at(path, e))?;
        let len = file.metadata().map_err(|e| Error::io_at(path, e))?.len() as usize;
        Self::map(media, path, file, len)
    }

    fn map(media: Arc<dyn Media>, path: &Path, file: File, len: usize) -> Result<Region> {
        let reserved = DEFAULT_RESERVE.max(len.next_power_of_two().saturating_mul(4));
        let fd = file.as_raw_fd();
        let prot = libc::PROT_READ | libc::PROT_WRITE;
        let mut base = libc::MAP_FAILED;
        if media.wants_map_sync() {
            // SAFETY: a fresh mapping at an address the kernel picks; no
            // existing memory is affected. MAP_SYNC is refused (EOPNOTSUPP /
            // EINVAL) on file systems without DAX, and we fall back below.
            base = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    reserved,
                    prot,
                    libc::MAP_SHARED_VALIDATE | libc::MAP_SYNC | libc::MAP_NORESERVE,
                    fd,
                    0,
                )
            };
            media.note_map_sync(base != libc::MAP_FAILED);
        }
        if base == libc::MAP_FAILED {
            // SAFETY: as above, without MAP_SYNC.
            base = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    reserved,
                    prot,
                    libc::MAP_SHARED | libc::MAP_NORESERVE,
                    fd,
                    0,
                )
            };
        }
        if base == libc::MAP_FAILED {
            return Err(Error::io_at(path, std::io::Error::last_os_error()));
        }
        let base = base as *mut u8;
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let id = media.attach(&name, base, len);
        Ok(Region {
            path: path.to_path_buf(),
            file,
            base,
            reserved,
            len: AtomicUsize::new(len),
            media,
            id,
            grow_lock: Mutex::new(()),
        })
    }

    /// The file behind the region.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Records that the region's file was renamed to `to` (the media names
    /// its crash images' files by it).
    pub fn renamed(&mut self, to: &Path) {
        self.path = to.to_path_buf();
        let name = to
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        self.media.renamed(self.id, &name);
    }

    /// The media that makes this region durable.
    pub fn media(&self) -> &Arc<dyn Media> {
        &self.media
    }

    /// Start of the mapping; it never moves while the region lives.
    #[inline]
    pub fn base(&self) -> *mut u8 {
        self.base
    }

    /// Bytes currently backed by the file.
    #[inline]
    pub fn len(&self) -> usize {
        self.len.load(Ordering::Acquire)
    }

    /// Whether the region is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Extends the file to `new_len` bytes (zero-filled) without moving or
    /// rewriting anything; the new length is made durable before it is used.
    pub fn grow(&self, new_len: usize) -> Result<()> {
        let _g = self.grow_lock.lock();
        let old = self.len();
        if new_len <= old {
            return Ok(());
        }
        if new_len > self.reserved {
            return Err(Error::invalid(format!(
                "region {} cannot grow to {new_len} bytes in this mapping ({} reserved); reopen it",
                self.path.display(),
                self.reserved
            )));
        }
        self.file
            .set_len(new_len as u64)
            .map_err(|e| Error::io_at(&self.path, e))?;
        sync_file(&self.file, &self.path, SYNC_GROW, false)?;
        self.media.grown(self.id, new_len);
        self.len.store(new_len, Ordering::Release);
        Ok(())
    }

    #[inline]
    fn check(&self, off: usize, len: usize, align: usize) {
        assert!(
            off.is_multiple_of(align) && off.checked_add(len).is_some_and(|e| e <= self.len()),
            "region access {off}+{len} outside {} bytes (or misaligned)",
            self.len()
        );
    }

    /// The 8-byte word at `off` (8-aligned, in bounds; panics otherwise, which
    /// is an engine bug: offsets read from the region are validated first).
    #[inline]
    pub fn u64_at(&self, off: usize) -> &AtomicU64 {
        self.check(off, 8, 8);
        // SAFETY: in bounds of the mapping (checked), 8-aligned (checked; the
        // base is page-aligned), and AtomicU64 has the layout of u64. The
        // mapping lives as long as `self`.
        unsafe { &*(self.base.add(off) as *const AtomicU64) }
    }

    /// The 4-byte word at `off` (4-aligned, in bounds).
    #[inline]
    pub fn u32_at(&self, off: usize) -> &AtomicU32 {
        self.check(off, 4, 4);
        // SAFETY: as in `u64_at`, for a 4-aligned u32.
        unsafe { &*(self.base.add(off) as *const AtomicU32) }
    }

    /// `n` consecutive 4-byte words from `off` (4-aligned, in bounds).
    #[inline]
    pub fn u32s_at(&self, off: usize, n: usize) -> &[AtomicU32] {
        self.check(off, n * 4, 4);
        // SAFETY: as in `u32_at`, for `n` consecutive words.
        unsafe { std::slice::from_raw_parts(self.base.add(off) as *const AtomicU32, n) }
    }

    /// Shared view of `len` bytes at `off`.
    ///
    /// # Safety
    /// No thread may write these bytes while the borrow lives.
    #[inline]
    pub unsafe fn bytes(&self, off: usize, len: usize) -> &[u8] {
        self.check(off, len, 1);
        // SAFETY: in bounds (checked); absence of writers is the caller's
        // contract.
        unsafe { std::slice::from_raw_parts(self.base.add(off), len) }
    }

    /// Mutable view of `len` bytes at `off`.
    ///
    /// # Safety
    /// No other thread may read or write these bytes while the borrow lives.
    #[inline]
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn bytes_mut(&self, off: usize, len: usize) -> &mut [u8] {
        self.check(off, len, 1);
        // SAFETY: in bounds (checked); exclusivity is the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.base.add(off), len) }
    }

    /// Copies `len` bytes at `off` out with relaxed 8-byte atomic loads (safe
    /// while other threads write them; used by inspectors and checkers).
    pub fn snapshot(&self, off: usize, len: usize) -> Vec<u8> {
        self.check(off, len, 1);
        let mut out = vec![0u8; len];
        crate::media::read_racy(self.base.wrapping_add(off), &mut out);
        out
    }

    /// Starts writing `len` bytes at `off` back to the media.
    #[inline]
    pub fn persist(&self, site: Site, off: usize, len: usize) {
        debug_assert!(off + len <= self.len());
        self.media
            .persist(site, self.base.wrapping_add(off) as *const u8, len);
    }

    /// Waits until every range persisted before (in every region of this
    /// media) is durable.
    #[inline]
    pub fn fence(&self, site: Site) {
        self.media.fence(site);
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        self.media.detach(self.id);
        // SAFETY: `base`/`reserved` are exactly what mmap returned; no borrow
        // of the mapping can outlive `self` (all accessors borrow `self`).
        unsafe {
            libc::munmap(self.base as *mut libc::c_void, self.reserved);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::media::PmemMedia;

    #[test]
    fn grow_keeps_base_and_content() {
        let dir = tempfile::tempdir().unwrap();
        let media: Arc<dyn Media> = Arc::new(PmemMedia::new());
        let path = dir.path().join("r");
        let r = Region::create(media.clone(), &path, 4096).unwrap();
        let base = r.base();
        r.u64_at(8).store(42, Ordering::Release);
        r.persist(Site("t"), 8, 8);
        r.fence(Site("t"));
        r.grow(1 << 20).unwrap();
        assert_eq!(r.base(), base);
        assert_eq!(r.len(), 1 << 20);
        r.u64_at((1 << 20) - 8).store(7, Ordering::Release);
        assert_eq!(r.u64_at(8).load(Ordering::Acquire), 42);
        drop(r);
        let r = Region::open(media, &path).unwrap();
        assert_eq!(r.len(), 1 << 20);
        assert_eq!(r.u64_at(8).load(Ordering::Acquire), 42);
        assert_eq!(r.u64_at((1 << 20) - 8).load(Ordering::Acquire), 7);
        assert!(Region::create(r.media().clone(), &path, 10).is_err());
    }

    #[test]
    #[should_panic(expected = "outside")]
    fn out_of_bounds_access_panics_instead_of_faulting() {
        let dir = tempfile::tempdir().unwrap();
        let r = Region::create(Arc::new(PmemMedia::new()), &dir.path().join("r"), 64).unwrap();
        r.u64_at(64);
    }

    #[test]
    fn mode_parse() {
        assert_eq!(PersistMode::parse("pmem").unwrap(), PersistMode::Pmem);
        assert_eq!(PersistMode::parse("msync").unwrap().name(), "msync");
        assert!(PersistMode::parse("disk").is_err());
    }
}
