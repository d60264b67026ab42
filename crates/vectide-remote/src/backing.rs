//! The memory node's backing file (`docs/format-memnode-backing.md`): with
//! `--backing FILE` every region lives in one memory-mapped file of the
//! storage layer ([`vectide_storage::Region`], the media `p-hnsw` uses:
//! `msync` or `pmem`), so the crash simulator drops and tears whatever was
//! not flushed. Verbs write the mapping directly; a FLUSH verb makes a range
//! durable (the RDMA FLUSH of persistent memory). A node restarted on its
//! file serves what it held at its last FLUSH of each range.
//!
//! The file: a superblock (magic, version, the catalog's shape, a CRC), the
//! next region id in a word of its own, a catalog of [`SLOTS`] slots (one
//! per region: id, name, offset, size, a CRC, and a state word written
//! last), then the regions' bytes, each at a page-aligned offset. Creating
//! a region zeroes its bytes when they were another region's, makes them
//! and its slot durable, and only then marks the slot live; dropping one
//! clears the state word. Everything read back is checked: a damaged file
//! is a typed corruption error at start, never a region served wrong.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use vectide_core::io::ByteReader;
use vectide_core::{Error, Result};
use vectide_storage::media::Media;
use vectide_storage::region::{Region as Mapped, Site};

/// First bytes of a backing file.
pub const MAGIC: &[u8; 8] = b"VTDXBACK";
/// The backing file's format version.
pub const VERSION: u32 = 1;
/// Regions a backing file holds at most.
pub const SLOTS: usize = 256;
/// Bytes of one catalog slot.
pub const SLOT_BYTES: usize = 320;
/// Where the catalog starts (after the superblock's page).
pub const CATALOG_AT: usize = 4096;
/// Where the regions' bytes start.
pub const DATA_AT: u64 = 128 << 10;
/// Regions start at multiples of this.
pub const ALIGN: u64 = 4096;
/// Offset of the next-id word inside the superblock.
const NEXT_ID_AT: usize = 64;
/// Offset of the boot word inside the superblock: the node's starts on
/// this file (1 at creation, one more at each open), durable before the
/// node serves anything.
const BOOT_AT: usize = 72;
/// A live slot's state word.
const LIVE: u64 = u64::from_le_bytes(*b"LIVEREGN");
/// Superblock bytes the CRC covers.
const SUPER_CRC_AT: usize = 24;

/// Persistence sites (what the crash simulator counts and its mutation
/// check disables one at a time).
pub const SITE_SUPER: Site = Site("memnode.super");
pub const SITE_CATALOG: Site = Site("memnode.catalog");
pub const SITE_PUBLISH: Site = Site("memnode.publish");
pub const SITE_ZERO: Site = Site("memnode.zero");
pub const SITE_FLUSH: Site = Site("memnode.flush");
pub const SITE_BOOT: Site = Site("memnode.boot");
/// Sync site of the directory after a new file is renamed into place.
pub const SYNC_RENAME: vectide_core::sync::SyncSite =
    vectide_core::sync::SyncSite("memnode.create");

/// A region as the catalog records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slot {
    pub id: u32,
    pub name: String,
    /// Where its bytes start in the file.
    pub offset: u64,
    pub size: u64,
}

/// What a backing file held when it was opened.
pub struct Restored {
    /// (catalog slot, region) for every live region.
    pub slots: Vec<(usize, Slot)>,
    /// The next region id to hand out (ids are never reused).
    pub next_id: u32,
    /// This start's number on the file (1 for a new file).
    pub boot: u64,
}

/// The open backing file.
pub struct Backing {
    map: Mapped,
    path: PathBuf,
    /// Held (an exclusive `flock`) while the backing is open: a second
    /// memory node on the same file is refused.
    _lock: std::fs::File,
}

/// Takes the file's exclusive lock, or says which file another node holds.
fn lock(path: &Path) -> Result<std::fs::File> {
    use std::os::fd::AsRawFd;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .open(path)
        .map_err(|e| Error::io_at(path, e))?;
    // SAFETY: flock on a descriptor this function owns; no memory is
    // involved.
    let r = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if r != 0 {
        return Err(Error::invalid(format!(
            "memory-node backing file {} is in use by another memory node",
            path.display()
        )));
    }
    Ok(f)
}

/// The file a backing file is made in before it is renamed into place.
fn temporary(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".tmp");
    path.with_file_name(name)
}

fn corrupt(path: &Path, what: impl std::fmt::Display) -> Error {
    Error::corrupted(format!(
        "memory-node backing file {}: {what}",
        path.display()
    ))
}

impl Backing {
    /// Opens `path`, or creates it when it does not exist, on `media`.
    pub fn open_or_create(path: &Path, media: Arc<dyn Media>) -> Result<(Backing, Restored)> {
        if path.exists() {
            Backing::open(path, media)
        } else {
            let b = Backing::create(path, media)?;
            Ok((
                b,
                Restored {
                    slots: Vec::new(),
                    next_id: 1,
                    boot: 1,
                },
            ))
        }
    }

    /// Creates a new backing file: the superblock and an empty catalog,
    /// durable in a temporary file that is then renamed to `path` (a crash
    /// before leaves no file, and the next start begins afresh).
    pub fn create(path: &Path, media: Arc<dyn Media>) -> Result<Backing> {
        let tmp = temporary(path);
        match std::fs::remove_file(&tmp) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io_at(&tmp, e)),
        }
        let map = Mapped::create(media, &tmp, DATA_AT as usize)?;
        let held = lock(&tmp)?;
        let mut sb = Vec::with_capacity(SUPER_CRC_AT + 4);
        sb.extend_from_slice(MAGIC);
        for v in [VERSION, SLOTS as u32, SLOT_BYTES as u32, CATALOG_AT as u32] {
            sb.extend_from_slice(&v.to_le_bytes());
        }
        debug_assert_eq!(sb.len(), SUPER_CRC_AT);
        let crc = crc32fast::hash(&sb);
        sb.extend_from_slice(&crc.to_le_bytes());
        let mut b = Backing {
            map,
            path: path.to_path_buf(),
            _lock: held,
        };
        b.put(0, &sb);
        b.map
            .u64_at(NEXT_ID_AT)
            .store(1, std::sync::atomic::Ordering::Release);
        b.map
            .u64_at(BOOT_AT)
            .store(1, std::sync::atomic::Ordering::Release);
        b.map.persist(SITE_SUPER, 0, CATALOG_AT);
        b.map.fence(SITE_SUPER);
        std::fs::rename(&tmp, path).map_err(|e| Error::io_at(path, e))?;
        b.map.renamed(path);
        let parent = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        vectide_core::sync::sync_dir(parent, SYNC_RENAME)?;
        Ok(b)
    }

    /// Opens an existing backing file and checks all of it: superblock,
    /// every live slot (CRC, name, bounds), that no two regions overlap and
    /// that ids and names are unique.
    pub fn open(path: &Path, media: Arc<dyn Media>) -> Result<(Backing, Restored)> {
        let held = lock(path)?;
        let map = Mapped::open(media, path)?;
        let b = Backing {
            map,
            path: path.to_path_buf(),
            _lock: held,
        };
        let len = b.map.len() as u64;
        if len < DATA_AT {
            return Err(corrupt(
                path,
                format!("{len} bytes, shorter than its catalog"),
            ));
        }
        let head = b.map.snapshot(0, BOOT_AT + 8);
        let mut r = ByteReader::new(&head);
        if r.bytes(8)? != MAGIC {
            return Err(corrupt(path, "not a memory-node backing file (bad magic)"));
        }
        let version = r.u32()?;
        let shape = (r.u32()?, r.u32()?, r.u32()?);
        let crc = r.u32()?;
        if crc != crc32fast::hash(&head[..SUPER_CRC_AT]) {
            return Err(corrupt(path, "the superblock's checksum does not match"));
        }
        if version != VERSION {
            return Err(Error::Version {
                found: version,
                supported: VERSION,
            });
        }
        if shape != (SLOTS as u32, SLOT_BYTES as u32, CATALOG_AT as u32) {
            return Err(corrupt(path, format!("a catalog of shape {shape:?}")));
        }
        let stored_next = u64::from_le_bytes(
            head[NEXT_ID_AT..NEXT_ID_AT + 8]
                .try_into()
                .expect("8 bytes"),
        );
        let stored_boot = u64::from_le_bytes(head[BOOT_AT..].try_into().expect("8 bytes"));
        let mut slots = Vec::new();
        for i in 0..SLOTS {
            let raw = b.map.snapshot(CATALOG_AT + i * SLOT_BYTES, SLOT_BYTES);
            if let Some(s) =
                decode_slot(&raw).map_err(|e| corrupt(path, format!("slot {i}: {e}")))?
            {
                if s.offset < DATA_AT
                    || !s.offset.is_multiple_of(ALIGN)
                    || s.offset.checked_add(s.size).is_none_or(|e| e > len)
                {
                    return Err(corrupt(
                        path,
                        format!(
                            "slot {i}: region {:?} at {}+{} outside the file's {len} bytes",
                            s.name, s.offset, s.size
                        ),
                    ));
                }
                slots.push((i, s));
            }
        }
        let mut by_off: Vec<&Slot> = slots.iter().map(|(_, s)| s).collect();
        by_off.sort_by_key(|s| s.offset);
        for w in by_off.windows(2) {
            if w[0].offset + w[0].size > w[1].offset {
                return Err(corrupt(
                    path,
                    format!("regions {:?} and {:?} overlap", w[0].name, w[1].name),
                ));
            }
        }
        let mut ids: Vec<u32> = slots.iter().map(|(_, s)| s.id).collect();
        let mut names: Vec<&str> = slots.iter().map(|(_, s)| s.name.as_str()).collect();
        ids.sort_unstable();
        names.sort_unstable();
        if ids.windows(2).any(|w| w[0] == w[1]) || names.windows(2).any(|w| w[0] == w[1]) {
            return Err(corrupt(path, "two regions share an id or a name"));
        }
        let max_id = ids.last().copied().unwrap_or(0);
        // A crash between a slot's publication and the next id's is not
        // possible (the id is durable first), but a damaged word is: ids
        // in use are never handed out again either way.
        let next_id = u32::try_from(stored_next)
            .unwrap_or(u32::MAX)
            .max(max_id.saturating_add(1))
            .max(1);
        // This start's number, durable before anything is served: a compute
        // node that sees it change knows the locks it finds held belong to
        // writes the restart cut short.
        let boot = stored_boot.wrapping_add(1).max(1);
        b.map
            .u64_at(BOOT_AT)
            .store(boot, std::sync::atomic::Ordering::Release);
        b.map.persist(SITE_BOOT, BOOT_AT, 8);
        b.map.fence(SITE_BOOT);
        Ok((
            b,
            Restored {
                slots,
                next_id,
                boot,
            },
        ))
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Start of the mapping (it never moves while the backing lives).
    pub fn base(&self) -> *mut u8 {
        self.map.base()
    }

    /// Bytes the file holds.
    pub fn len(&self) -> u64 {
        self.map.len() as u64
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    fn put(&self, off: usize, bytes: &[u8]) {
        // SAFETY: callers hold the node's table lock for catalog writes and
        // write only bytes no region verb reaches (the superblock, a slot, a
        // region not yet published); in bounds is checked by `bytes_mut`.
        unsafe { self.map.bytes_mut(off, bytes.len()) }.copy_from_slice(bytes);
    }

    /// Where a region of `size` bytes goes: the first gap between `live`
    /// regions (or after the last) that holds it, page-aligned.
    pub fn place(&self, live: &[(u64, u64)], size: u64) -> Result<u64> {
        let mut spans: Vec<(u64, u64)> = live.to_vec();
        spans.sort_unstable();
        let mut at = DATA_AT;
        for (off, len) in spans {
            if off >= at && off - at >= size {
                return Ok(at);
            }
            at = at.max((off + len).next_multiple_of(ALIGN));
        }
        Ok(at)
    }

    /// Makes region `slot` live: grows the file if it must, zeroes bytes
    /// another region left, writes the slot and the next id, makes all of
    /// it durable, then the state word.
    pub fn publish(&self, index: usize, slot: &Slot, next_id: u32) -> Result<()> {
        let beyond = || {
            Error::invalid(format!(
                "a region of {} bytes at {} is beyond what the backing file can map",
                slot.size, slot.offset
            ))
        };
        let end = slot.offset.checked_add(slot.size).ok_or_else(beyond)?;
        let fresh_from = self.len();
        if end > fresh_from {
            let want = end
                .checked_next_multiple_of(ALIGN)
                .and_then(|w| usize::try_from(w).ok())
                .ok_or_else(beyond)?;
            self.map.grow(want)?;
        }
        // Bytes below the old end were another region's: zero them.
        let stale_end = end.min(fresh_from);
        if stale_end > slot.offset {
            let (at, n) = (slot.offset as usize, (stale_end - slot.offset) as usize);
            // SAFETY: the region is not published yet, so no verb reaches
            // these bytes; the node's table lock is held by the caller.
            unsafe { self.map.bytes_mut(at, n) }.fill(0);
            self.map.persist(SITE_ZERO, at, n);
        }
        let at = CATALOG_AT + index * SLOT_BYTES;
        self.put(at + 8, &encode_slot(slot)[8..]);
        self.map.persist(SITE_CATALOG, at, SLOT_BYTES);
        self.map
            .u64_at(NEXT_ID_AT)
            .store(u64::from(next_id), std::sync::atomic::Ordering::Release);
        self.map.persist(SITE_CATALOG, NEXT_ID_AT, 8);
        self.map.fence(SITE_CATALOG);
        self.map
            .u64_at(at)
            .store(LIVE, std::sync::atomic::Ordering::Release);
        self.map.persist(SITE_PUBLISH, at, 8);
        self.map.fence(SITE_PUBLISH);
        Ok(())
    }

    /// Clears slot `index` (durable before it returns).
    pub fn unpublish(&self, index: usize) {
        let at = CATALOG_AT + index * SLOT_BYTES;
        self.map
            .u64_at(at)
            .store(0, std::sync::atomic::Ordering::Release);
        self.map.persist(SITE_PUBLISH, at, 8);
        self.map.fence(SITE_PUBLISH);
    }

    /// FLUSH: makes `len` bytes at file offset `at` durable (`site`: the
    /// caller's name for the call, [`SITE_FLUSH`] for one from the network).
    pub fn flush(&self, site: Site, at: u64, len: u64) {
        if len > 0 {
            self.persist(site, at, len);
            self.fence(site);
        }
    }

    /// A FLUSH's first half: `len` bytes at `at` written back (not yet
    /// durable until [`Backing::fence`]).
    pub fn persist(&self, site: Site, at: u64, len: u64) {
        if len > 0 {
            self.map.persist(site, at as usize, len as usize);
        }
    }

    /// A FLUSH's second half: what was persisted is durable.
    pub fn fence(&self, site: Site) {
        self.map.fence(site);
    }
}

/// A slot's bytes: state, id, name length, offset, size, CRC (of id
/// through size and the name), name.
pub fn encode_slot(s: &Slot) -> [u8; SLOT_BYTES] {
    let mut b = [0u8; SLOT_BYTES];
    b[0..8].copy_from_slice(&LIVE.to_le_bytes());
    b[8..12].copy_from_slice(&s.id.to_le_bytes());
    b[12..16].copy_from_slice(&(s.name.len() as u32).to_le_bytes());
    b[16..24].copy_from_slice(&s.offset.to_le_bytes());
    b[24..32].copy_from_slice(&s.size.to_le_bytes());
    let name = &s.name.as_bytes()[..s.name.len().min(SLOT_BYTES - 40)];
    b[40..40 + name.len()].copy_from_slice(name);
    let crc = slot_crc(&b, name.len());
    b[32..36].copy_from_slice(&crc.to_le_bytes());
    b
}

fn slot_crc(b: &[u8], name_len: usize) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&b[8..32]);
    h.update(&b[40..40 + name_len]);
    h.finalize()
}

/// A slot read back: `None` when free; an error when damaged.
pub fn decode_slot(b: &[u8]) -> Result<Option<Slot>> {
    let mut r = ByteReader::new(b);
    let state = r.u64()?;
    if state == 0 {
        return Ok(None);
    }
    if state != LIVE {
        return Err(Error::corrupted(format!("state word {state:#x}")));
    }
    let id = r.u32()?;
    let name_len = r.u32()? as usize;
    let offset = r.u64()?;
    let size = r.u64()?;
    let crc = r.u32()?;
    if name_len == 0 || name_len > crate::regions::MAX_NAME || 40 + name_len > b.len() {
        return Err(Error::corrupted(format!("a name of {name_len} bytes")));
    }
    if crc != slot_crc(b, name_len) {
        return Err(Error::corrupted("the checksum does not match"));
    }
    let name = String::from_utf8(b[40..40 + name_len].to_vec())
        .map_err(|_| Error::corrupted("a name that is not UTF-8"))?;
    if size == 0 || id == 0 {
        return Err(Error::corrupted("a region of 0 bytes or id 0"));
    }
    Ok(Some(Slot {
        id,
        name,
        offset,
        size,
    }))
}
