//! Aligned block files: the storage under the disk-resident indexes
//! (FreshDiskANN's long-term index, SPFresh's block store).
//!
//! A block file is an array of [`BLOCK`]-byte blocks, read and written in
//! whole, aligned blocks. [`BlockFile`] is the backend trait; two
//! implementations:
//!
//! - [`DirectFile`]: a real file opened with `O_DIRECT`, so reads come from
//!   the device and not from the page cache (our datasets fit in RAM; a
//!   disk index measured through the page cache would measure RAM). Many
//!   reads at once ([`BlockFile::read_batch`], a beam search's W sectors)
//!   are submitted together through **io_uring** and waited for together;
//!   where the kernel refuses io_uring (old kernels, seccomp in containers)
//!   or `VECTIDE_IO=pread` asks for it, the same batch is read with `pread`
//!   one block run at a time. A file system that refuses `O_DIRECT` (tmpfs)
//!   gets a buffered file, and [`DirectFile::direct`] says so. Syncs go
//!   through `vectide_core::sync`, so a crash kit observing the directory
//!   sees them.
//! - [`SimBlockFile`]: an in-memory block device that keeps what the last
//!   sync made durable apart from what was written since, and at chosen
//!   sync points hands out **crash images**: every block written since the
//!   last sync is, by a seeded draw, kept, dropped (the durable content),
//!   or torn (each 512-byte sector old or new: devices promise sector
//!   atomicity, not block atomicity). With [`SimBlockFile::disable`] its
//!   syncs stop counting as durable, for the mutation check.
//!
//! Buffers handed to either must be [`BLOCK`]-aligned and whole blocks long
//! ([`AlignedBuf`] is such a buffer); anything else is an
//! `InvalidInput` error, never undefined behaviour.

use crate::media::rng_next;
use parking_lot::Mutex;
use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::collections::{BTreeMap, BTreeSet};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use vectide_core::sync::{sync_file, SyncSite};
use vectide_core::{Error, Result};

/// Bytes per block: the SSD's 4 KiB page, and `O_DIRECT`'s alignment.
pub const BLOCK: usize = 4096;
/// The unit a device writes atomically (a torn block mixes these).
pub const SECTOR: usize = 512;
/// Environment variable: `pread` forces the portable read path.
pub const IO_ENV: &str = "VECTIDE_IO";

/// A zeroed, [`BLOCK`]-aligned buffer of whole blocks.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the buffer owns its allocation exclusively (like a `Box<[u8]>`);
// `&AlignedBuf` hands out only `&[u8]`, `&mut` only `&mut [u8]`.
unsafe impl Send for AlignedBuf {}
// SAFETY: as above: shared access is read-only.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// `blocks` zeroed blocks (at least one is allocated, so the pointer is
    /// always a real, aligned allocation).
    pub fn new(blocks: usize) -> Self {
        let len = blocks * BLOCK;
        let layout =
            Layout::from_size_align(len.max(BLOCK), BLOCK).expect("BLOCK is a power of two");
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        AlignedBuf { ptr, len }
    }

    pub fn blocks(&self) -> usize {
        self.len / BLOCK
    }

    /// Block `i` of the buffer.
    pub fn block(&self, i: usize) -> &[u8] {
        &self[i * BLOCK..(i + 1) * BLOCK]
    }

    pub fn block_mut(&mut self, i: usize) -> &mut [u8] {
        &mut self[i * BLOCK..(i + 1) * BLOCK]
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        let layout =
            Layout::from_size_align(self.len.max(BLOCK), BLOCK).expect("same layout as new");
        // SAFETY: `ptr` came from `alloc_zeroed` with this very layout and is
        // freed once, here.
        unsafe { dealloc(self.ptr.as_ptr(), layout) }
    }
}

impl std::ops::Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr` points to `len` initialised (zeroed) bytes owned by
        // this buffer, alive as long as `self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedBuf({} blocks)", self.blocks())
    }
}

/// One read of a batch: `buf.len() / BLOCK` blocks from block `block` on.
pub struct ReadReq<'a> {
    pub block: u64,
    pub buf: &'a mut [u8],
}

/// I/O counters of a block file (reads are what a disk index is judged by).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct IoStats {
    /// Read requests (one per [`ReadReq`] or [`BlockFile::read`] call).
    pub reads: u64,
    /// Blocks read.
    pub blocks_read: u64,
    /// Batches submitted (a [`BlockFile::read`] is a batch of one).
    pub batches: u64,
    /// Blocks written.
    pub blocks_written: u64,
    /// Syncs.
    pub syncs: u64,
}

#[derive(Default)]
struct Counters {
    reads: AtomicU64,
    blocks_read: AtomicU64,
    batches: AtomicU64,
    blocks_written: AtomicU64,
    syncs: AtomicU64,
}

impl Counters {
    fn read(&self, reqs: u64, blocks: u64) {
        self.reads.fetch_add(reqs, Ordering::Relaxed);
        self.blocks_read.fetch_add(blocks, Ordering::Relaxed);
        self.batches.fetch_add(1, Ordering::Relaxed);
    }
    fn get(&self) -> IoStats {
        IoStats {
            reads: self.reads.load(Ordering::Relaxed),
            blocks_read: self.blocks_read.load(Ordering::Relaxed),
            batches: self.batches.load(Ordering::Relaxed),
            blocks_written: self.blocks_written.load(Ordering::Relaxed),
            syncs: self.syncs.load(Ordering::Relaxed),
        }
    }
}

/// An array of [`BLOCK`]-byte blocks on some medium.
pub trait BlockFile: Send + Sync {
    /// Blocks in the file.
    fn len_blocks(&self) -> u64;
    /// Reads `buf.len() / BLOCK` blocks from block `block` on.
    fn read(&self, block: u64, buf: &mut [u8]) -> Result<()> {
        self.read_batch(&mut [ReadReq { block, buf }])
    }
    /// Reads every request, submitted together where the backend can.
    fn read_batch(&self, reqs: &mut [ReadReq<'_>]) -> Result<()>;
    /// Writes `buf.len() / BLOCK` blocks from block `block` on, growing the
    /// file when they end past it. Not durable until [`BlockFile::sync`].
    fn write(&self, block: u64, buf: &[u8]) -> Result<()>;
    /// Makes every write so far durable (`fdatasync`).
    fn sync(&self) -> Result<()>;
    /// Sets the length in blocks (shrinking drops the tail, growing adds
    /// zero blocks).
    fn set_len_blocks(&self, blocks: u64) -> Result<()>;
    /// The I/O counters.
    fn stats(&self) -> IoStats;
    /// Whether reads bypass the page cache (`O_DIRECT`); `false` for files
    /// that are not on a device.
    fn bypasses_cache(&self) -> bool {
        false
    }
}

/// A shared block file is a block file (a test keeps a handle on the
/// [`SimBlockFile`] it hands to a store, to take its crash images).
impl<T: BlockFile + ?Sized> BlockFile for std::sync::Arc<T> {
    fn len_blocks(&self) -> u64 {
        (**self).len_blocks()
    }
    fn read(&self, block: u64, buf: &mut [u8]) -> Result<()> {
        (**self).read(block, buf)
    }
    fn read_batch(&self, reqs: &mut [ReadReq<'_>]) -> Result<()> {
        (**self).read_batch(reqs)
    }
    fn write(&self, block: u64, buf: &[u8]) -> Result<()> {
        (**self).write(block, buf)
    }
    fn sync(&self) -> Result<()> {
        (**self).sync()
    }
    fn set_len_blocks(&self, blocks: u64) -> Result<()> {
        (**self).set_len_blocks(blocks)
    }
    fn stats(&self) -> IoStats {
        (**self).stats()
    }
    fn bypasses_cache(&self) -> bool {
        (**self).bypasses_cache()
    }
}

/// Checks that `buf` is whole, aligned blocks; returns how many.
pub fn check_buf(buf: &[u8]) -> Result<u64> {
    if buf.is_empty()
        || !buf.len().is_multiple_of(BLOCK)
        || !(buf.as_ptr() as usize).is_multiple_of(BLOCK)
    {
        return Err(Error::invalid(format!(
            "block I/O needs a non-empty buffer of whole {BLOCK}-byte blocks at a {BLOCK}-byte aligned address \
             (got {} bytes at offset {} from alignment)",
            buf.len(),
            buf.as_ptr() as usize % BLOCK
        )));
    }
    Ok((buf.len() / BLOCK) as u64)
}

fn check_range(path: &str, block: u64, n: u64, len: u64) -> Result<()> {
    match block.checked_add(n) {
        Some(end) if end <= len => Ok(()),
        _ => Err(Error::invalid(format!(
            "{path}: read of blocks {block}..{} past the end ({len} blocks)",
            block.saturating_add(n)
        ))),
    }
}

// ---------------------------------------------------------------------------
// The real file.

/// A block file on disk, read with `O_DIRECT` (see the module docs).
pub struct DirectFile {
    file: File,
    path: PathBuf,
    site: SyncSite,
    direct: bool,
    len: AtomicU64,
    rings: Option<Rings>,
    counters: Counters,
}

/// The io_uring instances of a file: one per concurrent batch, kept for
/// reuse (a ring is not shared between threads while it is in use).
struct Rings {
    free: Mutex<Vec<io_uring::IoUring>>,
    entries: u32,
}

impl DirectFile {
    /// Opens (`create`: creates) the block file at `path`. Its syncs report
    /// `site` to a crash kit. The length must be whole blocks.
    pub fn open(path: &Path, create: bool, site: SyncSite) -> Result<Self> {
        let mut opts = OpenOptions::new();
        opts.read(true).write(true).create(create);
        let (file, direct) = match opts.clone().custom_flags(libc::O_DIRECT).open(path) {
            Ok(f) => (f, true),
            // tmpfs and some overlay set-ups refuse O_DIRECT with EINVAL.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                (opts.open(path).map_err(|e| Error::io_at(path, e))?, false)
            }
            Err(e) => return Err(Error::io_at(path, e)),
        };
        let bytes = file.metadata().map_err(|e| Error::io_at(path, e))?.len();
        if !bytes.is_multiple_of(BLOCK as u64) {
            return Err(Error::corrupted(format!(
                "{}: {bytes} bytes is not a whole number of {BLOCK}-byte blocks",
                path.display()
            )));
        }
        let rings = if std::env::var(IO_ENV).is_ok_and(|v| v == "pread") {
            None
        } else {
            // Where the kernel refuses io_uring, or has it without the READ
            // opcode (5.1 to 5.5), every batch uses pread.
            io_uring::IoUring::new(64)
                .ok()
                .filter(supports_read)
                .map(|r| Rings {
                    free: Mutex::new(vec![r]),
                    entries: 64,
                })
        };
        Ok(DirectFile {
            file,
            path: path.to_path_buf(),
            site,
            direct,
            len: AtomicU64::new(bytes / BLOCK as u64),
            rings,
            counters: Counters::default(),
        })
    }

    /// Whether reads bypass the page cache (`O_DIRECT` accepted).
    pub fn direct(&self) -> bool {
        self.direct
    }

    /// `"io_uring"` or `"pread"`: how batches are read.
    pub fn read_path(&self) -> &'static str {
        if self.rings.is_some() {
            "io_uring"
        } else {
            "pread"
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn pread_all(&self, block: u64, buf: &mut [u8]) -> Result<()> {
        self.file
            .read_exact_at(buf, block * BLOCK as u64)
            .map_err(|e| Error::io_at(&self.path, e))
    }

    fn read_uring(&self, rings: &Rings, reqs: &mut [ReadReq<'_>]) -> Result<()> {
        use io_uring::{opcode, types};
        use std::os::fd::AsRawFd;
        let pooled = rings.free.lock().pop();
        let mut ring = match pooled
            .map(Ok)
            .unwrap_or_else(|| io_uring::IoUring::new(rings.entries))
        {
            Ok(r) => r,
            Err(_) => {
                for r in reqs.iter_mut() {
                    self.pread_all(r.block, r.buf)?;
                }
                return Ok(());
            }
        };
        let fd = types::Fd(self.file.as_raw_fd());
        let mut failure: Option<std::io::Error> = None;
        let mut short: Vec<usize> = Vec::new();
        let per_round = rings.entries as usize;
        let mut start = 0;
        while start < reqs.len() && failure.is_none() {
            let end = (start + per_round).min(reqs.len());
            {
                let mut sq = ring.submission();
                for (i, r) in reqs[start..end].iter_mut().enumerate() {
                    let e = opcode::Read::new(fd, r.buf.as_mut_ptr(), r.buf.len() as u32)
                        .offset(r.block * BLOCK as u64)
                        .build()
                        .user_data((start + i) as u64);
                    // SAFETY: `r.buf` stays mutably borrowed — alive, unmoved
                    // and untouched — until this function returns, and it
                    // returns only once the kernel holds no reference to it:
                    // every submitted entry is reaped below, and a ring whose
                    // entries were never consumed is dropped unexecuted. The
                    // fd is `self.file`'s, open as long as `self`. The queue
                    // has room: a round pushes at most `entries` entries into
                    // a queue emptied by the previous round.
                    if unsafe { sq.push(&e) }.is_err() {
                        failure = Some(std::io::Error::other("io_uring submission queue full"));
                        break;
                    }
                }
            }
            let pushed = ring.submission().len();
            let mut pending = pushed;
            let mut gave_up = false;
            while pending > 0 {
                for c in ring.completion() {
                    pending -= 1;
                    let (i, res) = (c.user_data() as usize, c.result());
                    if res == -libc::EINVAL || res == -libc::EOPNOTSUPP {
                        // An operation this kernel or file refuses through
                        // the ring: read it with pread below.
                        short.push(i);
                    } else if res < 0 {
                        failure.get_or_insert(std::io::Error::from_raw_os_error(-res));
                    } else if (res as usize) < reqs[i].buf.len() {
                        short.push(i);
                    }
                }
                if pending == 0 {
                    break;
                }
                match ring.submit_and_wait(1) {
                    Ok(_) => {}
                    Err(e)
                        if matches!(
                            e.raw_os_error(),
                            Some(libc::EINTR | libc::EAGAIN | libc::EBUSY)
                        ) => {}
                    Err(e) => {
                        // Entries the kernel never consumed will never run;
                        // those it did must still be waited for.
                        let unconsumed = ring.submission().len();
                        failure.get_or_insert(e);
                        if pending == unconsumed {
                            gave_up = true;
                            break;
                        }
                        std::thread::sleep(std::time::Duration::from_micros(50));
                    }
                }
            }
            if gave_up {
                // The ring still holds unexecuted entries: never reuse it.
                return Err(Error::io_at(
                    &self.path,
                    failure.unwrap_or_else(|| std::io::Error::other("io_uring")),
                ));
            }
            start = end;
        }
        rings.free.lock().push(ring);
        if let Some(e) = failure {
            return Err(Error::io_at(&self.path, e));
        }
        // A short read (rare on regular files) is finished with pread.
        for i in short {
            let r = &mut reqs[i];
            self.pread_all(r.block, r.buf)?;
        }
        Ok(())
    }
}

/// Whether the kernel behind `ring` implements `IORING_OP_READ`.
fn supports_read(ring: &io_uring::IoUring) -> bool {
    let mut probe = io_uring::Probe::new();
    ring.submitter().register_probe(&mut probe).is_ok()
        && probe.is_supported(io_uring::opcode::Read::CODE)
}

impl BlockFile for DirectFile {
    fn len_blocks(&self) -> u64 {
        self.len.load(Ordering::Acquire)
    }

    fn read_batch(&self, reqs: &mut [ReadReq<'_>]) -> Result<()> {
        let len = self.len_blocks();
        let mut blocks = 0;
        for r in reqs.iter() {
            let n = check_buf(r.buf)?;
            check_range(&self.path.display().to_string(), r.block, n, len)?;
            blocks += n;
        }
        if reqs.is_empty() {
            return Ok(());
        }
        self.counters.read(reqs.len() as u64, blocks);
        match &self.rings {
            Some(rings) if reqs.len() > 1 => self.read_uring(rings, reqs),
            _ => {
                for r in reqs.iter_mut() {
                    self.pread_all(r.block, r.buf)?;
                }
                Ok(())
            }
        }
    }

    fn write(&self, block: u64, buf: &[u8]) -> Result<()> {
        let n = check_buf(buf)?;
        let end = block
            .checked_add(n)
            .filter(|e| e.checked_mul(BLOCK as u64).is_some())
            .ok_or_else(|| Error::invalid("block write past the largest offset"))?;
        self.file
            .write_all_at(buf, block * BLOCK as u64)
            .map_err(|e| Error::io_at(&self.path, e))?;
        self.len.fetch_max(end, Ordering::AcqRel);
        self.counters.blocks_written.fetch_add(n, Ordering::Relaxed);
        Ok(())
    }

    fn sync(&self) -> Result<()> {
        self.counters.syncs.fetch_add(1, Ordering::Relaxed);
        sync_file(&self.file, &self.path, self.site, true)
    }

    fn set_len_blocks(&self, blocks: u64) -> Result<()> {
        let bytes = blocks
            .checked_mul(BLOCK as u64)
            .ok_or_else(|| Error::invalid("block file length overflows"))?;
        self.file
            .set_len(bytes)
            .map_err(|e| Error::io_at(&self.path, e))?;
        self.len.store(blocks, Ordering::Release);
        Ok(())
    }

    fn bypasses_cache(&self) -> bool {
        self.direct
    }

    fn stats(&self) -> IoStats {
        self.counters.get()
    }
}

// ---------------------------------------------------------------------------
// The crash simulator.

/// What a crash image did to one block written since the last sync.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockFate {
    /// The new content reached the medium.
    Kept,
    /// The old (durable) content stayed; a block past the durable length
    /// is gone.
    Dropped,
    /// A mix: each 512-byte sector new or old.
    Torn,
}

/// A post-crash state of a [`SimBlockFile`].
#[derive(Debug, Clone)]
pub struct BlockCrashImage {
    /// The sync point it precedes (numbered from 0).
    pub sync_point: u64,
    /// The file's bytes after the crash (whole blocks).
    pub bytes: Vec<u8>,
    /// The fate of every block written since the last sync.
    pub fates: BTreeMap<u64, BlockFate>,
}

#[derive(Default)]
struct SimState {
    /// What the last (counted) sync made durable.
    durable: Vec<u8>,
    /// Everything written so far.
    current: Vec<u8>,
    /// Blocks written since the last counted sync.
    dirty: BTreeSet<u64>,
    syncs: u64,
    crash_at: BTreeSet<u64>,
    disabled: bool,
    seed: u64,
    images: Vec<BlockCrashImage>,
}

/// An in-memory block file with crash images (see the module docs).
pub struct SimBlockFile {
    state: Mutex<SimState>,
    counters: Counters,
}

impl SimBlockFile {
    /// An empty file; crash draws are seeded by `seed`.
    pub fn new(seed: u64) -> Self {
        SimBlockFile {
            state: Mutex::new(SimState {
                seed: seed | 1,
                ..SimState::default()
            }),
            counters: Counters::default(),
        }
    }

    /// A file whose content is already durable (as after a recovery).
    pub fn with_durable(bytes: Vec<u8>, seed: u64) -> Result<Self> {
        if !bytes.len().is_multiple_of(BLOCK) {
            return Err(Error::invalid("a block file holds whole blocks"));
        }
        let f = SimBlockFile::new(seed);
        {
            let mut s = f.state.lock();
            s.durable = bytes.clone();
            s.current = bytes;
        }
        Ok(f)
    }

    /// Take a crash image just before each of these sync points.
    pub fn crash_before(&self, points: impl IntoIterator<Item = u64>) {
        self.state.lock().crash_at.extend(points);
    }

    /// Mutation check: syncs from now on do not make anything durable (the
    /// workload runs unchanged; images lose what they should have kept).
    pub fn disable(&self) {
        self.state.lock().disabled = true;
    }

    /// Sync points so far.
    pub fn sync_points(&self) -> u64 {
        self.state.lock().syncs
    }

    /// The images taken so far (drained).
    pub fn take_images(&self) -> Vec<BlockCrashImage> {
        std::mem::take(&mut self.state.lock().images)
    }

    /// A crash image of the present state (as if the power failed now).
    pub fn image_now(&self) -> BlockCrashImage {
        let mut s = self.state.lock();
        let at = s.syncs;
        image(&mut s, at)
    }

    /// The current (not necessarily durable) content.
    pub fn current(&self) -> Vec<u8> {
        self.state.lock().current.clone()
    }
}

fn image(s: &mut SimState, sync_point: u64) -> BlockCrashImage {
    let mut bytes = s.durable.clone();
    let mut fates = BTreeMap::new();
    // The file's length after a crash: the durable one, or longer when a
    // kept or torn block past it survived (its gap reads as zeros).
    let dirty: Vec<u64> = s.dirty.iter().copied().collect();
    for b in dirty {
        let fate = match rng_next(&mut s.seed) % 3 {
            0 => BlockFate::Kept,
            1 => BlockFate::Dropped,
            _ => BlockFate::Torn,
        };
        let at = b as usize * BLOCK;
        if at + BLOCK > s.current.len() {
            // Written, then truncated away: nothing to show.
            continue;
        }
        let new = &s.current[at..at + BLOCK];
        match fate {
            BlockFate::Dropped => {}
            BlockFate::Kept | BlockFate::Torn => {
                if bytes.len() < at + BLOCK {
                    bytes.resize(at + BLOCK, 0);
                }
                for sec in 0..BLOCK / SECTOR {
                    let take_new = fate == BlockFate::Kept || rng_next(&mut s.seed) & 1 == 1;
                    if take_new {
                        let r = sec * SECTOR..(sec + 1) * SECTOR;
                        bytes[at + r.start..at + r.end].copy_from_slice(&new[r]);
                    }
                }
            }
        }
        fates.insert(b, fate);
    }
    BlockCrashImage {
        sync_point,
        bytes,
        fates,
    }
}

impl BlockFile for SimBlockFile {
    fn len_blocks(&self) -> u64 {
        (self.state.lock().current.len() / BLOCK) as u64
    }

    fn read_batch(&self, reqs: &mut [ReadReq<'_>]) -> Result<()> {
        let s = self.state.lock();
        let len = (s.current.len() / BLOCK) as u64;
        let mut blocks = 0;
        for r in reqs.iter() {
            let n = check_buf(r.buf)?;
            check_range("simulated block file", r.block, n, len)?;
            blocks += n;
        }
        for r in reqs.iter_mut() {
            let at = r.block as usize * BLOCK;
            r.buf.copy_from_slice(&s.current[at..at + r.buf.len()]);
        }
        if !reqs.is_empty() {
            self.counters.read(reqs.len() as u64, blocks);
        }
        Ok(())
    }

    fn write(&self, block: u64, buf: &[u8]) -> Result<()> {
        let n = check_buf(buf)?;
        let end = block
            .checked_add(n)
            .and_then(|e| usize::try_from(e).ok())
            .and_then(|e| e.checked_mul(BLOCK))
            .ok_or_else(|| Error::invalid("block write past the largest offset"))?;
        let mut s = self.state.lock();
        if s.current.len() < end {
            s.current.resize(end, 0);
        }
        let at = block as usize * BLOCK;
        s.current[at..end].copy_from_slice(buf);
        s.dirty.extend(block..block + n);
        self.counters.blocks_written.fetch_add(n, Ordering::Relaxed);
        Ok(())
    }

    fn sync(&self) -> Result<()> {
        self.counters.syncs.fetch_add(1, Ordering::Relaxed);
        let mut s = self.state.lock();
        let point = s.syncs;
        s.syncs += 1;
        if s.crash_at.contains(&point) {
            let img = image(&mut s, point);
            s.images.push(img);
        }
        if !s.disabled {
            s.durable = s.current.clone();
            s.dirty.clear();
        }
        Ok(())
    }

    fn set_len_blocks(&self, blocks: u64) -> Result<()> {
        let bytes = usize::try_from(blocks)
            .ok()
            .and_then(|b| b.checked_mul(BLOCK))
            .ok_or_else(|| Error::invalid("block file length overflows"))?;
        let mut s = self.state.lock();
        s.current.resize(bytes, 0);
        // Truncation is durable at once (as in the file simulator); growth
        // shows as zero blocks either way.
        if s.durable.len() > bytes {
            s.durable.truncate(bytes);
        }
        s.dirty.retain(|&b| b < blocks);
        Ok(())
    }

    fn stats(&self) -> IoStats {
        self.counters.get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pattern(blocks: usize, tag: u8) -> AlignedBuf {
        let mut b = AlignedBuf::new(blocks);
        for (i, x) in b.iter_mut().enumerate() {
            *x = tag ^ (i % 251) as u8;
        }
        b
    }

    fn roundtrip(f: &dyn BlockFile) {
        let a = pattern(3, 1);
        f.write(0, &a).unwrap();
        let b = pattern(2, 7);
        f.write(5, &b).unwrap();
        assert_eq!(f.len_blocks(), 7);
        f.sync().unwrap();
        let mut one = AlignedBuf::new(1);
        f.read(1, &mut one).unwrap();
        assert_eq!(&one[..], a.block(1));
        // A batch of reads, in any order, including the zero gap.
        let (mut x, mut y, mut z) = (AlignedBuf::new(2), AlignedBuf::new(1), AlignedBuf::new(1));
        f.read_batch(&mut [
            ReadReq {
                block: 5,
                buf: &mut x,
            },
            ReadReq {
                block: 0,
                buf: &mut y,
            },
            ReadReq {
                block: 3,
                buf: &mut z,
            },
        ])
        .unwrap();
        assert_eq!(&x[..], &b[..]);
        assert_eq!(&y[..], a.block(0));
        assert!(z.iter().all(|&v| v == 0));
        let s = f.stats();
        assert_eq!(
            (s.reads, s.blocks_read, s.batches, s.blocks_written),
            (4, 5, 2, 5)
        );
        // Bad requests are errors and change nothing.
        let mut past = AlignedBuf::new(1);
        assert!(f.read(7, &mut past).is_err());
        let mut unaligned = vec![0u8; BLOCK + 1];
        let off = usize::from((unaligned.as_ptr() as usize).is_multiple_of(BLOCK));
        assert!(f.read(0, &mut unaligned[off..off + BLOCK]).is_err());
        assert!(f.write(0, &[0u8; 100]).is_err());
        assert!(f.read(u64::MAX, &mut past).is_err());
        assert_eq!(f.len_blocks(), 7);
        f.set_len_blocks(2).unwrap();
        assert_eq!(f.len_blocks(), 2);
        assert!(f.read(2, &mut past).is_err());
    }

    #[test]
    fn direct_file_round_trips_with_io_uring_and_with_pread() {
        let dir = tempfile::tempdir().unwrap();
        let f = DirectFile::open(&dir.path().join("a.blk"), true, SyncSite("test.block")).unwrap();
        roundtrip(&f);
        eprintln!("direct {} via {}", f.direct(), f.read_path());
        // The pread path, forced.
        let mut g =
            DirectFile::open(&dir.path().join("b.blk"), true, SyncSite("test.block")).unwrap();
        g.rings = None;
        assert_eq!(g.read_path(), "pread");
        roundtrip(&g);
        // Reopening sees the blocks; a length that is not whole blocks is refused.
        drop(f);
        let f = DirectFile::open(&dir.path().join("a.blk"), false, SyncSite("test.block")).unwrap();
        assert_eq!(f.len_blocks(), 2);
        std::fs::write(dir.path().join("c.blk"), [0u8; 100]).unwrap();
        assert!(
            DirectFile::open(&dir.path().join("c.blk"), false, SyncSite("test.block")).is_err()
        );
    }

    #[test]
    fn a_large_batch_spans_several_ring_rounds() {
        let dir = tempfile::tempdir().unwrap();
        let f =
            DirectFile::open(&dir.path().join("big.blk"), true, SyncSite("test.block")).unwrap();
        let data = pattern(200, 3);
        f.write(0, &data).unwrap();
        let mut bufs: Vec<AlignedBuf> = (0..200).map(|_| AlignedBuf::new(1)).collect();
        let mut reqs: Vec<ReadReq> = bufs
            .iter_mut()
            .enumerate()
            .map(|(i, b)| ReadReq {
                block: (199 - i) as u64,
                buf: &mut b[..],
            })
            .collect();
        f.read_batch(&mut reqs).unwrap();
        drop(reqs);
        for (i, b) in bufs.iter().enumerate() {
            assert_eq!(&b[..], data.block(199 - i), "block {}", 199 - i);
        }
    }

    #[test]
    fn sim_file_behaves_like_a_file() {
        roundtrip(&SimBlockFile::new(1));
    }

    #[test]
    fn crash_images_keep_synced_blocks_and_draw_the_rest() {
        let f = SimBlockFile::new(42);
        f.write(0, &pattern(2, 1)).unwrap();
        f.sync().unwrap(); // point 0: blocks 0, 1 durable
        f.crash_before([1, 2]);
        f.write(1, &pattern(1, 9)).unwrap(); // overwrite in place
        f.write(2, &pattern(2, 5)).unwrap(); // append
        f.sync().unwrap(); // point 1: image first
        f.write(0, &pattern(1, 8)).unwrap();
        f.disable();
        f.sync().unwrap(); // point 2: image; then nothing becomes durable
        let images = f.take_images();
        assert_eq!(
            images.iter().map(|i| i.sync_point).collect::<Vec<_>>(),
            vec![1, 2]
        );
        let old = pattern(2, 1);
        let first = &images[0];
        assert_eq!(
            &first.bytes[..BLOCK],
            old.block(0),
            "block 0 was durable and untouched"
        );
        assert_eq!(
            first.fates.keys().copied().collect::<Vec<_>>(),
            vec![1, 2, 3]
        );
        for (&b, &fate) in &first.fates {
            let new = if b == 1 { pattern(1, 9) } else { pattern(2, 5) };
            let new_block = if b == 1 {
                new.block(0).to_vec()
            } else {
                new.block(b as usize - 2).to_vec()
            };
            let old_block: Vec<u8> = if b == 1 {
                old.block(1).to_vec()
            } else {
                vec![0; BLOCK]
            };
            let got = first
                .bytes
                .get(b as usize * BLOCK..(b as usize + 1) * BLOCK);
            match fate {
                BlockFate::Kept => assert_eq!(got.unwrap(), &new_block[..]),
                BlockFate::Dropped => assert!(got.is_none_or(|g| g == &old_block[..])),
                BlockFate::Torn => {
                    let g = got.unwrap();
                    for s in 0..BLOCK / SECTOR {
                        let r = s * SECTOR..(s + 1) * SECTOR;
                        assert!(
                            g[r.clone()] == new_block[r.clone()]
                                || g[r.clone()] == old_block[r.clone()]
                        );
                    }
                }
            }
        }
        // The second image: block 0's new content is not durable yet.
        assert!(images[1].fates.contains_key(&0));
        // After the disabled sync the model still holds the point-1 state,
        // so an image now can lose block 0's write again.
        assert!(f.image_now().fates.contains_key(&0));
    }

    #[test]
    fn fates_cover_all_three_outcomes_over_many_draws() {
        let mut seen = BTreeSet::new();
        for seed in 0..20 {
            let f = SimBlockFile::new(seed);
            f.write(0, &pattern(4, 2)).unwrap();
            for fate in f.image_now().fates.values() {
                seen.insert(format!("{fate:?}"));
            }
        }
        assert_eq!(seen.len(), 3, "{seen:?}");
    }

    #[test]
    fn aligned_buffers_are_aligned_and_zeroed() {
        for n in [0, 1, 3] {
            let b = AlignedBuf::new(n);
            assert_eq!(b.as_ptr() as usize % BLOCK, 0);
            assert_eq!(b.len(), n * BLOCK);
            assert!(b.iter().all(|&x| x == 0));
        }
    }
}
