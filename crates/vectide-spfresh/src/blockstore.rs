//! The block store: SPFresh's Block Controller (§4.3) over a
//! [`BlockFile`] (`O_DIRECT` and io_uring on a real file, the crash
//! simulator in tests), bytes in `docs/format-blockstore.md`.
//!
//! In RAM: the **mapping**, one entry per posting id (its record count and
//! its blocks, each named by block number and gen), and the **free pool**.
//! Blocks are never written in place while a mapping entry names them:
//!
//! - **GET** reads a posting's blocks in one batch and checks each (CRC,
//!   posting, gen); **ParallelGET** reads many postings in one batch.
//! - **APPEND** reads only the last block when it has room (and not even
//!   that when the tail cache holds it, see `crate::tails`), writes its
//!   payload and the new records into fresh blocks, and swaps the entry by
//!   **compare-and-swap**. The old last block is released. A lost race (a
//!   concurrent APPEND or PUT swapped first) frees the fresh blocks and
//!   tries again on the new entry.
//! - **PUT** writes a whole posting into fresh blocks and swaps the entry,
//!   by CAS against the entry the caller read (a split's garbage
//!   collection must not overwrite an APPEND it did not see).
//!
//! **Released blocks are held back** until the next snapshot is durable
//! (§4.4): the last durable snapshot's mapping names only blocks that no
//! write has touched since, so recovery from it reads exactly the postings
//! it recorded. A snapshot ([`BlockStore::snapshot`]) captures the mapping
//! and the pool at one instant (swaps wait while it copies the entries),
//! then syncs the file, so every block it names is durable; the caller
//! writes the image and calls [`BlockStore::snapshot_durable`], which
//! returns the blocks released before the capture to the pool.
//!
//! **Posting ids are reused**: a new posting takes the lowest free id, so
//! the id space (and every table indexed by it: the mapping, the
//! centroids, the snapshot's) follows the live postings rather than every
//! posting ever made. An id is free when absent at the open, or once the
//! engine says nothing can reach it ([`BlockStore::free_id`]); a reader
//! that meets a reused id reads the new posting's blocks (each names its
//! posting and gen), whose records carry their own vector numbers.
//!
//! A reader holding an entry from before a swap may meet a block that a
//! later snapshot let a write reuse: the block's gen differs from the
//! entry's, and the read starts again from the current entry. A block that
//! fails its checks while its entry is still current is corruption.

use crate::layout::{
    blocks_for, decode_map, encode_map, open_block, record_bytes, seal_block, BlockHead, BlockRef,
    MapImage, Posting, Records, RecordsView, StoreHeader, PAYLOAD,
};
use crate::tails::{Tails, TAIL_CACHE_POSTINGS};
use arc_swap::ArcSwapOption;
use parking_lot::{Mutex, RwLock};
use std::collections::{BTreeSet, HashSet};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use vectide_core::{Error, Result};
use vectide_storage::block::{AlignedBuf, BlockFile, ReadReq, BLOCK};

/// Reads of one posting before a read that keeps meeting swaps gives up.
const MAX_RETRIES: usize = 1000;

/// Files smaller than this many blocks (1 MiB) are not compacted. (It was
/// 16 MiB: a file below that stayed mostly free once the jobs' own
/// snapshots kept it from ever passing it, e.g. 8.6 MB holding 0.3 MB of
/// postings after 90 % of 6,000 vectors were deleted.)
pub const COMPACT_FLOOR: u64 = 256;

/// Postings per ParallelGET of [`BlockStore::scan`].
pub const SCAN_POSTINGS: usize = 256;

/// The background jobs compact once more than a `1/COMPACT_SHARE` of the
/// file is free.
pub const COMPACT_SHARE: u64 = 4;

/// `maintain()` compacts once more than a `1/MAINTAIN_COMPACT_SHARE` of
/// the file is free: the explicit call gives back what the background
/// jobs leave for the next writes to reuse.
pub const MAINTAIN_COMPACT_SHARE: u64 = 8;

/// A snapshot is forced once the blocks held back for it exceed this
/// share of the blocks in use (or of the caller's floor): held blocks are
/// file space that serves nothing until the snapshot returns them.
pub const HELD_SHARE: u64 = 3;

/// The free pool: free blocks, the released ones held back, and the file's
/// never-used end. Free blocks are handed out lowest first, so that the
/// postings gather at the file's start and the free blocks at its end,
/// where [`BlockStore::snapshot_durable`] cuts them off the file.
#[derive(Debug, Default)]
struct Pool {
    free: BTreeSet<u32>,
    /// Released since the last snapshot's capture.
    held: Vec<u32>,
    /// Released before the capture of a snapshot not yet durable.
    pending: Vec<u32>,
    /// Blocks from here on were never handed out.
    end: u32,
    /// A snapshot is captured and not yet durable or abandoned.
    in_flight: bool,
}

/// Counters of a block store.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct StoreStats {
    /// Live postings.
    pub postings: u64,
    /// Blocks named by live postings.
    pub blocks_used: u64,
    /// Blocks in the free pool.
    pub blocks_free: u64,
    /// Released blocks held back for the next snapshot.
    pub blocks_held: u64,
    /// Blocks from the file's start to its never-used end.
    pub blocks_end: u64,
    /// Postings read (GET, and each posting of a ParallelGET).
    pub postings_read: u64,
    /// Blocks read.
    pub blocks_read: u64,
    /// Blocks written.
    pub blocks_written: u64,
    /// APPENDs and PUTs that lost their compare-and-swap and went again.
    pub cas_retries: u64,
    /// Reads that met a reused block and went again.
    pub read_retries: u64,
    /// APPENDs that found their tail in the tail cache / had to read it.
    pub tail_hits: u64,
    pub tail_misses: u64,
    /// Bytes of payload the tail cache holds.
    pub tail_bytes: u64,
    /// Times the file's free end was cut off (after a snapshot).
    pub trims: u64,
    /// Postings moved towards the file's start by compaction.
    pub compacted: u64,
}

#[derive(Default)]
struct Counters {
    /// Times the file's free end was cut off.
    trims: AtomicU64,
    /// Postings moved by compaction.
    compacted: AtomicU64,
    postings_read: AtomicU64,
    blocks_read: AtomicU64,
    blocks_written: AtomicU64,
    cas_retries: AtomicU64,
    read_retries: AtomicU64,
}

/// Per-thread buffers of reads.
///
/// A ParallelGET decodes its whole batch into one [`Records`] and names
/// each posting's part of it (`spans`), so that what a reused scratch
/// keeps is the largest batch it read, not the sum over its slots of the
/// largest posting each slot ever held (which crept towards the batch
/// size times the largest posting: session 44's `spann-inplace` soak
/// through the server).
#[derive(Default)]
pub struct ReadScratch {
    buf: Option<AlignedBuf>,
    payload: Vec<u8>,
    /// The records of the last [`BlockStore::parallel_get`], every
    /// posting's in one run.
    all: Records,
    /// Posting `i`'s records in `all`: (start, count).
    spans: Vec<(usize, usize)>,
    dim: usize,
}

impl ReadScratch {
    /// The read buffer, at least `blocks` long, taken out so that the
    /// other fields stay usable; the caller puts it back in `buf`.
    fn take_buf(&mut self, blocks: usize) -> AlignedBuf {
        match self.buf.take() {
            Some(b) if b.blocks() >= blocks => b,
            _ => AlignedBuf::new(blocks.max(1).next_power_of_two()),
        }
    }

    /// How many postings the last ParallelGET asked for.
    pub fn postings(&self) -> usize {
        self.spans.len()
    }

    /// The records of the `i`-th posting the last ParallelGET asked for
    /// (empty for one that did not exist).
    pub fn posting(&self, i: usize) -> RecordsView<'_> {
        let (start, n) = self.spans[i];
        self.all.slice(start..start + n, self.dim)
    }

    /// The records of every posting the last ParallelGET asked for, in
    /// the order asked.
    pub fn records(&self) -> impl Iterator<Item = RecordsView<'_>> + '_ {
        (0..self.spans.len()).map(|i| self.posting(i))
    }

    /// The bytes its buffers hold.
    pub fn capacity_bytes(&self) -> usize {
        self.buf.as_ref().map_or(0, |b| b.blocks() * BLOCK)
            + self.payload.capacity()
            + self.all.capacity_bytes()
            + self.spans.capacity() * std::mem::size_of::<(usize, usize)>()
    }
}

/// Whether posting `e` has a block at or past `target` (a compaction's
/// candidate).
fn reaches(e: &Posting, target: u32) -> bool {
    e.blocks.iter().any(|r| r.block >= target)
}

/// Checks a block read for posting `pid` as entry ref `r` names it, with
/// `want_used` payload bytes; its payload, or why not.
fn check_block(
    pid: u32,
    r: BlockRef,
    want_used: usize,
    bytes: &[u8],
) -> std::result::Result<&[u8], String> {
    match open_block(bytes) {
        Ok((h, p)) if h.posting == pid && h.gen == r.gen && h.used as usize == want_used => Ok(p),
        Ok((h, _)) => Err(format!(
            "block {} holds posting {} gen {} ({} bytes), the mapping names posting {pid} gen {} ({want_used} bytes)",
            r.block, h.posting, h.gen, h.used, r.gen
        )),
        Err(err) => Err(format!("block {}: {err}", r.block)),
    }
}

/// The outcome of a conditional swap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Swap {
    /// Swapped; the posting now holds this many records.
    Done(u32),
    /// The entry was not the one expected (a concurrent swap came first).
    Changed,
    /// The posting no longer exists.
    Gone,
}

/// One posting id's place in the mapping.
#[derive(Default)]
struct Slot {
    entry: ArcSwapOption<Posting>,
    /// The shrink count at this posting's last PUT or removal.
    shrunk: AtomicU64,
}

/// SPFresh's block store (module docs).
pub struct BlockStore {
    file: Box<dyn BlockFile>,
    dim: usize,
    map: RwLock<Vec<Slot>>,
    /// Ids of removed postings that may be handed out again, lowest first
    /// (those absent at the open, and those given [`BlockStore::free_id`]).
    free_pids: Mutex<BTreeSet<u32>>,
    pool: Mutex<Pool>,
    /// Shrinks so far (PUTs and removals: the swaps that may drop a
    /// record); see [`BlockStore::shrunk_since`].
    shrinks: AtomicU64,
    /// Swaps hold it shared from their CAS to their release; a snapshot's
    /// capture holds it exclusively.
    gate: RwLock<()>,
    /// Reads hold the read side, the cut of the file's free end the write
    /// side: the file's length does not change under a read.
    trim: RwLock<()>,
    gen: AtomicU32,
    counters: Counters,
    tails: Tails,
}

impl std::fmt::Debug for BlockStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BlockStore(dim {}, {:?})", self.dim, self.stats())
    }
}

impl BlockStore {
    /// A new, empty store in `file` (which should be empty): writes the
    /// header block. Nothing is synced before the first snapshot.
    pub fn create(file: Box<dyn BlockFile>, dim: usize) -> Result<Self> {
        if dim == 0 || dim > crate::layout::MAX_DIM as usize {
            return Err(Error::invalid(format!(
                "block store: dimension {dim} is outside 1..=65536"
            )));
        }
        let mut b = AlignedBuf::new(1);
        StoreHeader { dim: dim as u32 }.encode(&mut b);
        file.set_len_blocks(0)?;
        file.write(0, &b)?;
        Ok(Self::assemble(
            file,
            dim,
            MapImage {
                dim: dim as u32,
                end: 1,
                ..MapImage::default()
            },
        ))
    }

    /// Opens `file` as of a snapshot's mapping (`image`): checks the header
    /// block, the dimension, and that the file holds every block the
    /// mapping names. Postings are checked block by block when read.
    pub fn open(file: Box<dyn BlockFile>, image: MapImage) -> Result<Self> {
        image.check()?;
        let mut b = AlignedBuf::new(1);
        if file.len_blocks() == 0 {
            return Err(Error::corrupted("block store: the file is empty"));
        }
        file.read(0, &mut b)?;
        let h = StoreHeader::decode(&b)?;
        if h.dim != image.dim {
            return Err(Error::DimensionMismatch {
                expected: image.dim as usize,
                got: h.dim as usize,
            });
        }
        let last = u64::from(image.named_end());
        if last > file.len_blocks() {
            return Err(Error::corrupted(format!(
                "block store: the mapping names block {} of a {}-block file",
                last - 1,
                file.len_blocks()
            )));
        }
        // Blocks past the file that the mapping does not name are free by
        // being past the end (a hostile `end` costs nothing).
        let mut image = image;
        image.end = (image.end as u64).min(file.len_blocks()).max(last) as u32;
        let end = image.end;
        image.free.retain(|&b| b < end);
        Ok(Self::assemble(file, h.dim as usize, image))
    }

    /// Opens `file` as of an encoded mapping (see [`decode_map`]); the
    /// bytes the mapping took.
    pub fn open_encoded(file: Box<dyn BlockFile>, bytes: &[u8]) -> Result<(Self, usize)> {
        let (image, used) = decode_map(bytes)?;
        Ok((Self::open(file, image)?, used))
    }

    fn assemble(file: Box<dyn BlockFile>, dim: usize, image: MapImage) -> Self {
        let free_pids = (0u32..)
            .zip(&image.postings)
            .filter(|(_, p)| p.is_none())
            .map(|(pid, _)| pid)
            .collect();
        let map = image
            .postings
            .into_iter()
            .map(|p| Slot {
                entry: ArcSwapOption::new(p.map(Arc::new)),
                shrunk: AtomicU64::new(0),
            })
            .collect();
        BlockStore {
            file,
            dim,
            map: RwLock::new(map),
            free_pids: Mutex::new(free_pids),
            pool: Mutex::new(Pool {
                free: image.free.into_iter().collect(),
                end: image.end.max(1),
                ..Pool::default()
            }),
            gate: RwLock::new(()),
            trim: RwLock::new(()),
            gen: AtomicU32::new(image.gen),
            shrinks: AtomicU64::new(0),
            counters: Counters::default(),
            tails: Tails::new(TAIL_CACHE_POSTINGS),
        }
    }

    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Bytes of one record.
    pub fn record_bytes(&self) -> usize {
        record_bytes(self.dim)
    }

    /// The posting-id space: every id handed out is below it (live, or
    /// removed and free for the next new posting).
    pub fn posting_ids(&self) -> u32 {
        self.map.read().len() as u32
    }

    /// The current entry of posting `pid` (`None`: removed or unknown).
    pub fn entry(&self, pid: u32) -> Option<Arc<Posting>> {
        self.map
            .read()
            .get(pid as usize)
            .and_then(|s| s.entry.load_full())
    }

    /// The count of shrinks so far: PUTs and removals, the only swaps that
    /// may drop a record (an APPEND keeps every record it found).
    pub fn shrink_count(&self) -> u64 {
        self.shrinks.load(Ordering::SeqCst)
    }

    /// Whether any of postings `pids` was PUT or removed since
    /// [`BlockStore::shrink_count`] returned `since`. A reader that took
    /// the count before its reads and finds no shrink since has seen, in
    /// each posting, every record that was in it when it started: a copy
    /// written elsewhere and then dropped from a posting read cannot slip
    /// between its reads.
    pub fn shrunk_since(&self, pids: &[u32], since: u64) -> bool {
        let map = self.map.read();
        pids.iter().any(|&p| {
            map.get(p as usize)
                .is_some_and(|s| s.shrunk.load(Ordering::SeqCst) > since)
        })
    }

    /// The block file's I/O counters.
    pub fn io_stats(&self) -> vectide_storage::block::IoStats {
        self.file.stats()
    }

    /// Whether reads bypass the page cache.
    pub fn bypasses_cache(&self) -> bool {
        self.file.bypasses_cache()
    }

    pub fn stats(&self) -> StoreStats {
        let (postings, blocks_used) = {
            let map = self.map.read();
            map.iter()
                .filter_map(|s| s.entry.load_full())
                .fold((0, 0), |(n, b), p| (n + 1, b + p.blocks.len() as u64))
        };
        let pool = self.pool.lock();
        let c = &self.counters;
        let (tail_hits, tail_misses) = self.tails.hits_misses();
        StoreStats {
            postings,
            blocks_used,
            blocks_free: pool.free.len() as u64,
            blocks_held: Self::held_in(&pool),
            blocks_end: pool.end as u64,
            postings_read: c.postings_read.load(Ordering::Relaxed),
            blocks_read: c.blocks_read.load(Ordering::Relaxed),
            blocks_written: c.blocks_written.load(Ordering::Relaxed),
            cas_retries: c.cas_retries.load(Ordering::Relaxed),
            read_retries: c.read_retries.load(Ordering::Relaxed),
            tail_hits,
            tail_misses,
            tail_bytes: self.tails.bytes(),
            trims: c.trims.load(Ordering::Relaxed),
            compacted: c.compacted.load(Ordering::Relaxed),
        }
    }

    fn check_records(&self, recs: &[u8]) -> Result<u32> {
        let rb = self.record_bytes();
        if !recs.len().is_multiple_of(rb) {
            return Err(Error::invalid(format!(
                "block store: {} bytes are not whole {rb}-byte records",
                recs.len()
            )));
        }
        u32::try_from(recs.len() / rb)
            .map_err(|_| Error::invalid("block store: too many records for one posting"))
    }

    // ---- reads ----

    /// GET: the records of posting `pid` into `out` (cleared first) and
    /// the entry they were read under; `None` when the posting does not
    /// exist (then `out` is empty).
    pub fn get(
        &self,
        pid: u32,
        out: &mut Records,
        sc: &mut ReadScratch,
    ) -> Result<Option<Arc<Posting>>> {
        out.clear();
        for _ in 0..MAX_RETRIES {
            let Some(e) = self.entry(pid) else {
                return Ok(None);
            };
            let n = e.blocks.len();
            let mut buf = sc.take_buf(n);
            self.read_blocks(&mut [(&e.blocks[..], &mut buf[..n * BLOCK])])?;
            let whole = self.assemble_posting(pid, &e, &buf[..n * BLOCK], &mut sc.payload);
            sc.buf = Some(buf);
            match whole? {
                true => {
                    out.decode_from(&sc.payload, self.dim)?;
                    self.counters.postings_read.fetch_add(1, Ordering::Relaxed);
                    return Ok(Some(e));
                }
                false => {
                    self.counters.read_retries.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        Err(Error::invalid(format!(
            "block store: posting {pid} kept changing under {MAX_RETRIES} reads"
        )))
    }

    /// Postings `pids`, ParallelGET [`SCAN_POSTINGS`] at a time, each
    /// given to `f` with its id (its records empty if it does not exist),
    /// in order; the first error of a read or of `f` ends it. For the
    /// passes over the whole index (a census, the structure check, a
    /// rebuild's read), which read with a scratch of their own, so that no
    /// pooled one keeps a buffer their size.
    pub fn scan(
        &self,
        pids: &[u32],
        mut f: impl FnMut(u32, RecordsView<'_>) -> Result<()>,
    ) -> Result<()> {
        let mut sc = ReadScratch::default();
        for chunk in pids.chunks(SCAN_POSTINGS) {
            self.parallel_get(chunk, &mut sc)?;
            for (&pid, recs) in chunk.iter().zip(sc.records()) {
                f(pid, recs)?;
            }
        }
        Ok(())
    }

    /// ParallelGET: postings `pids` in one batch of reads, decoded into
    /// `sc` (`sc.posting(i)`, empty for a posting that does not exist);
    /// the blocks the batch read. A posting swapped under the batch is
    /// read again on its own.
    pub fn parallel_get(&self, pids: &[u32], sc: &mut ReadScratch) -> Result<usize> {
        let entries: Vec<Option<Arc<Posting>>> = pids.iter().map(|&p| self.entry(p)).collect();
        let total: usize = entries.iter().flatten().map(|e| e.blocks.len()).sum();
        sc.dim = self.dim;
        sc.all.clear();
        sc.spans.clear();
        sc.spans.resize(pids.len(), (0, 0));
        let mut buf = sc.take_buf(total);
        {
            let mut parts: Vec<(&[BlockRef], &mut [u8])> = Vec::with_capacity(pids.len());
            let mut rest: &mut [u8] = &mut buf[..total * BLOCK];
            for e in entries.iter().flatten() {
                let (head, tail) = rest.split_at_mut(e.blocks.len() * BLOCK);
                parts.push((&e.blocks, head));
                rest = tail;
            }
            self.read_blocks(&mut parts)?;
        }
        let mut at = 0;
        let mut again = Vec::new();
        for (i, (&pid, e)) in pids.iter().zip(&entries).enumerate() {
            let Some(e) = e else { continue };
            let bytes = &buf[at * BLOCK..(at + e.blocks.len()) * BLOCK];
            at += e.blocks.len();
            if self.assemble_posting(pid, e, bytes, &mut sc.payload)? {
                let start = sc.all.len();
                sc.all.decode_from(&sc.payload, self.dim)?;
                sc.spans[i] = (start, sc.all.len() - start);
                self.counters.postings_read.fetch_add(1, Ordering::Relaxed);
            } else {
                self.counters.read_retries.fetch_add(1, Ordering::Relaxed);
                again.push(i);
            }
        }
        sc.buf = Some(buf);
        let mut r = Records::default();
        for i in again {
            self.get(pids[i], &mut r, sc)?;
            sc.spans[i] = (sc.all.len(), r.len());
            sc.all.extend_from(&r);
        }
        Ok(total)
    }

    /// Reads every part's blocks into its buffer, as one batch.
    fn read_blocks(&self, parts: &mut [(&[BlockRef], &mut [u8])]) -> Result<()> {
        let mut reqs: Vec<ReadReq<'_>> = Vec::new();
        for (refs, buf) in parts.iter_mut() {
            for (r, b) in refs.iter().zip(buf.chunks_exact_mut(BLOCK)) {
                reqs.push(ReadReq {
                    block: r.block as u64,
                    buf: b,
                });
            }
        }
        self.read_reqs(reqs)
    }

    /// Reads `reqs`, a block past the file's end as zeros: a reader that
    /// holds an entry from before a swap may name blocks the file no
    /// longer has (freed by a later snapshot and cut off its end); zeros
    /// fail the block's checks, and the read goes again from the current
    /// entry (a current entry naming such a block is corruption). The
    /// length cannot change during the read (`trim`'s read side).
    fn read_reqs(&self, mut reqs: Vec<ReadReq<'_>>) -> Result<()> {
        let _len = self.trim.read();
        let len = self.file.len_blocks();
        reqs.retain_mut(|r| {
            let inside = r.block < len;
            if !inside {
                r.buf.fill(0);
            }
            inside
        });
        if reqs.is_empty() {
            return Ok(());
        }
        let n = reqs.len() as u64;
        self.file.read_batch(&mut reqs)?;
        self.counters.blocks_read.fetch_add(n, Ordering::Relaxed);
        Ok(())
    }

    /// Checks the blocks of entry `e` (read into `bytes`) and gathers their
    /// payloads into `payload`. `false`: a block is not the one the entry
    /// names and the entry has been swapped since (read again); a block
    /// that fails while its entry is current is corruption.
    fn assemble_posting(
        &self,
        pid: u32,
        e: &Arc<Posting>,
        bytes: &[u8],
        payload: &mut Vec<u8>,
    ) -> Result<bool> {
        payload.clear();
        let total = e.records as usize * self.record_bytes();
        let mut problem = None;
        for (i, (r, b)) in e.blocks.iter().zip(bytes.chunks_exact(BLOCK)).enumerate() {
            let want_used = if i + 1 == e.blocks.len() {
                total - i * PAYLOAD
            } else {
                PAYLOAD
            };
            match check_block(pid, *r, want_used, b) {
                Ok(p) => payload.extend_from_slice(p),
                Err(why) => {
                    problem = Some(why);
                    break;
                }
            }
        }
        match problem {
            None => Ok(true),
            Some(why) => self.stale_or_corrupt(pid, e, why),
        }
    }

    /// A block of entry `e` failed its checks: `Ok(false)` when the entry
    /// has been swapped since (read again), else corruption.
    fn stale_or_corrupt(&self, pid: u32, e: &Arc<Posting>, why: String) -> Result<bool> {
        if self.entry(pid).is_some_and(|c| Arc::ptr_eq(&c, e)) {
            return Err(Error::corrupted(format!(
                "block store: posting {pid}: {why}"
            )));
        }
        Ok(false)
    }

    // ---- writes ----

    /// Hands out `n` blocks (free ones first, then the file's end).
    fn alloc(&self, n: usize) -> Result<Vec<u32>> {
        let mut pool = self.pool.lock();
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            match pool.free.pop_first() {
                Some(b) => out.push(b),
                None => {
                    let b = pool.end;
                    pool.end = b
                        .checked_add(1)
                        .ok_or_else(|| Error::invalid("block store: 2^32 blocks"))?;
                    out.push(b);
                }
            }
        }
        Ok(out)
    }

    /// Blocks written but never named by an entry: free at once.
    fn discard(&self, blocks: impl IntoIterator<Item = u32>) {
        self.pool.lock().free.extend(blocks);
    }

    /// Writes `payload` for posting `pid` into fresh blocks; their refs.
    fn write_fresh(&self, pid: u32, payload: &[u8]) -> Result<Vec<BlockRef>> {
        let n = blocks_for(payload.len());
        if n == 0 {
            return Ok(Vec::new());
        }
        let blocks = self.alloc(n)?;
        let mut buf = AlignedBuf::new(n);
        let mut refs = Vec::with_capacity(n);
        for (i, (&block, chunk)) in blocks.iter().zip(payload.chunks(PAYLOAD)).enumerate() {
            let gen = self.gen.fetch_add(1, Ordering::Relaxed);
            let head = BlockHead {
                posting: pid,
                gen,
                used: chunk.len() as u16,
            };
            seal_block(buf.block_mut(i), head, chunk)?;
            refs.push(BlockRef { block, gen });
        }
        // Runs of consecutive block numbers go out as one write each.
        let mut i = 0;
        let result = (|| {
            while i < n {
                let mut j = i + 1;
                while j < n && blocks[j] == blocks[j - 1] + 1 {
                    j += 1;
                }
                self.file
                    .write(blocks[i] as u64, &buf[i * BLOCK..j * BLOCK])?;
                i = j;
            }
            Ok(())
        })();
        if let Err(e) = result {
            self.discard(blocks);
            return Err(e);
        }
        self.counters
            .blocks_written
            .fetch_add(n as u64, Ordering::Relaxed);
        Ok(refs)
    }

    /// Puts the last of the blocks `fresh` that now end posting `pid`
    /// (written from `payload`) in the tail cache.
    fn remember_tail(&self, pid: u32, fresh: &[BlockRef], payload: &[u8]) {
        if let Some(&last) = fresh.last() {
            let start = (blocks_for(payload.len()) - 1) * PAYLOAD;
            self.tails.put(pid, last, &payload[start..]);
        }
    }

    /// Swaps posting `pid`'s entry from `expected` to `new` and releases
    /// `released`; `Changed`/`Gone` (nothing released) when the entry is no
    /// longer `expected`.
    fn swap(
        &self,
        pid: u32,
        expected: &Option<Arc<Posting>>,
        new: Option<Arc<Posting>>,
        released: &[BlockRef],
        shrink: bool,
    ) -> Swap {
        let records = new.as_ref().map_or(0, |p| p.records);
        let _gate = self.gate.read();
        let map = self.map.read();
        let Some(slot) = map.get(pid as usize) else {
            return Swap::Gone;
        };
        if shrink {
            // Counted before the swap, so that a reader that sees the new
            // entry also sees the count (a failed swap only costs a
            // reader a spurious retry).
            let n = self.shrinks.fetch_add(1, Ordering::SeqCst) + 1;
            slot.shrunk.fetch_max(n, Ordering::SeqCst);
        }
        let prev = slot.entry.compare_and_swap(expected, new);
        let same = match (&*prev, expected) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            (None, None) => true,
            _ => false,
        };
        if !same {
            return if prev.is_none() {
                Swap::Gone
            } else {
                Swap::Changed
            };
        }
        self.pool
            .lock()
            .held
            .extend(released.iter().map(|r| r.block));
        Swap::Done(records)
    }

    /// APPEND: adds whole records `recs` (encoded as
    /// [`crate::layout::encode_record`]) to posting `pid`. Reads only the
    /// last block, and only when it has room and the tail cache does not
    /// hold it (`crate::tails`); the old last block is released. Retries a
    /// lost swap. `Gone` when the posting does not exist (removed by a
    /// split or a merge): the caller re-routes.
    pub fn append(&self, pid: u32, recs: &[u8], sc: &mut ReadScratch) -> Result<Swap> {
        let n = self.check_records(recs)?;
        if n == 0 {
            return Ok(self
                .entry(pid)
                .map_or(Swap::Gone, |e| Swap::Done(e.records)));
        }
        loop {
            let Some(e) = self.entry(pid) else {
                return Ok(Swap::Gone);
            };
            let records = e
                .records
                .checked_add(n)
                .ok_or_else(|| Error::invalid("block store: too many records for one posting"))?;
            let total = e.records as usize * self.record_bytes();
            let tail_used = total - e.blocks.len().saturating_sub(1) * PAYLOAD;
            let mut payload = Vec::with_capacity(tail_used + recs.len());
            let mut keep = e.blocks.len();
            let mut released: Vec<BlockRef> = Vec::new();
            if let Some(&tail) = e.blocks.last().filter(|_| tail_used < PAYLOAD) {
                if !self.tails.get_into(pid, tail, tail_used, &mut payload) {
                    let mut buf = sc.take_buf(1);
                    self.read_reqs(vec![ReadReq {
                        block: tail.block as u64,
                        buf: &mut buf[..BLOCK],
                    }])?;
                    let tail_ok = check_block(pid, tail, tail_used, &buf[..BLOCK])
                        .map(|p| payload.extend_from_slice(p));
                    sc.buf = Some(buf);
                    if let Err(why) = tail_ok {
                        self.stale_or_corrupt(pid, &e, why)?;
                        self.counters.read_retries.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                }
                keep -= 1;
                released.push(tail);
            }
            payload.extend_from_slice(recs);
            let fresh = self.write_fresh(pid, &payload)?;
            let mut blocks = e.blocks[..keep].to_vec();
            blocks.extend_from_slice(&fresh);
            let new = Arc::new(Posting { records, blocks });
            match self.swap(pid, &Some(e), Some(new), &released, false) {
                Swap::Done(r) => {
                    self.remember_tail(pid, &fresh, &payload);
                    return Ok(Swap::Done(r));
                }
                lost => {
                    self.discard(fresh.iter().map(|r| r.block));
                    if lost == Swap::Gone {
                        return Ok(Swap::Gone);
                    }
                    self.counters.cas_retries.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }

    /// PUT: replaces posting `pid` with whole records `recs`, by CAS
    /// against `expected` (the entry the caller read). Its old blocks are
    /// released. `Gone` when the posting does not exist (`expected` is
    /// `None`).
    pub fn put(&self, pid: u32, recs: &[u8], expected: &Option<Arc<Posting>>) -> Result<Swap> {
        let records = self.check_records(recs)?;
        // Only an existing posting is replaced (a new one is
        // `create_posting`'s, whose empty id no PUT may take).
        if expected.is_none() || pid >= self.posting_ids() {
            return Ok(Swap::Gone);
        }
        let fresh = self.write_fresh(pid, recs)?;
        let released: Vec<BlockRef> = expected
            .as_ref()
            .map(|e| e.blocks.clone())
            .unwrap_or_default();
        let new = Arc::new(Posting {
            records,
            blocks: fresh.clone(),
        });
        let s = self.swap(pid, expected, Some(new), &released, true);
        if s == Swap::Done(records) {
            self.remember_tail(pid, &fresh, recs);
        } else {
            self.discard(fresh.iter().map(|r| r.block));
        }
        Ok(s)
    }

    /// A new posting holding `recs`; its id: the lowest one free (that
    /// of a removed posting), else a new one past the others.
    pub fn create_posting(&self, recs: &[u8]) -> Result<u32> {
        let records = self.check_records(recs)?;
        let reused = self.free_pids.lock().pop_first();
        let pid = match reused {
            Some(pid) => pid,
            None => {
                let mut map = self.map.write();
                map.push(Slot::default());
                (map.len() - 1) as u32
            }
        };
        let fresh = match self.write_fresh(pid, recs) {
            Ok(f) => f,
            Err(e) => {
                // The id goes back (a new slot stays, empty and free).
                self.free_pids.lock().insert(pid);
                return Err(e);
            }
        };
        let new = Arc::new(Posting {
            records,
            blocks: fresh.clone(),
        });
        match self.swap(pid, &None, Some(new), &[], false) {
            Swap::Done(_) => {
                self.remember_tail(pid, &fresh, recs);
                Ok(pid)
            }
            _ => {
                // Unreachable while only this call may fill a free id
                // (taken off the free set, or new, above).
                self.discard(fresh.iter().map(|r| r.block));
                Err(Error::invalid(
                    "block store: a new posting id was taken twice",
                ))
            }
        }
    }

    /// Removes posting `pid` by CAS against `expected`; its blocks are
    /// released. Its id is not handed out again before [`Self::free_id`].
    pub fn remove(&self, pid: u32, expected: &Arc<Posting>) -> Swap {
        self.swap(pid, &Some(expected.clone()), None, &expected.blocks, true)
    }

    /// Lets [`Self::create_posting`] hand out the id of removed posting
    /// `pid` again: the caller's word that nothing can reach the id any
    /// more (no centroid in use names it, and no writer holds a route to
    /// it), since a writer holding an old route would append to the new
    /// posting. A live posting's id is not freed.
    pub fn free_id(&self, pid: u32) {
        if self.entry(pid).is_none() && pid < self.posting_ids() {
            self.free_pids.lock().insert(pid);
        }
    }

    // ---- compaction ----

    /// Blocks in use: handed out, neither free nor held.
    fn in_use(pool: &Pool) -> u64 {
        let held = Self::held_in(pool);
        u64::from(pool.end)
            .saturating_sub(1)
            .saturating_sub(held + pool.free.len() as u64)
    }

    /// Whether the file is worth compacting: past [`COMPACT_FLOOR`] blocks
    /// and more than a quarter of it free (the background jobs' test).
    pub fn compaction_due(&self) -> bool {
        self.compaction_due_at(COMPACT_SHARE)
    }

    /// Whether more than a `1/share` of the file is free (and it is past
    /// [`COMPACT_FLOOR`] blocks). A compaction leaves an eighth of the
    /// blocks in use free, so `share` ≥ 8 is never due right after one.
    pub fn compaction_due_at(&self, share: u64) -> bool {
        let pool = self.pool.lock();
        // Free blocks, not held ones: those come back only with a
        // snapshot (the held trigger's), and a compaction has nowhere to
        // move postings to before it.
        u64::from(pool.end) >= COMPACT_FLOOR && pool.free.len() as u64 * share > u64::from(pool.end)
    }

    /// The postings to move when compacting, and the block they must end
    /// below: those with a block past the file's share of blocks in use
    /// (plus an eighth).
    pub fn compaction_candidates(&self) -> (u32, Vec<u32>) {
        let target = {
            let pool = self.pool.lock();
            let used = Self::in_use(&pool);
            (1 + used + used / 8) as u32
        };
        let map = self.map.read();
        let pids = (0..map.len() as u32)
            .filter(|&p| {
                map[p as usize]
                    .entry
                    .load()
                    .as_ref()
                    .is_some_and(|e| reaches(e, target))
            })
            .collect();
        (target, pids)
    }

    /// Moves posting `pid` into the lowest free blocks by a PUT of its own
    /// records, if it still has a block at or past `target` (an earlier
    /// move or a write may have put it below since the candidates were
    /// taken; moving it again would spend the low free blocks that the
    /// postings still at the end need). A posting that changes meanwhile
    /// keeps its change and is left where it is. Its old blocks are
    /// released as any PUT's are: the next durable snapshot frees them and
    /// cuts the file's free end off ([`BlockStore::snapshot_durable`]).
    /// Returns whether it moved.
    pub fn relocate(
        &self,
        pid: u32,
        target: u32,
        recs: &mut Records,
        sc: &mut ReadScratch,
    ) -> Result<bool> {
        if !self.entry(pid).is_some_and(|e| reaches(&e, target)) {
            return Ok(false);
        }
        let Some(e) = self.get(pid, recs, sc)? else {
            return Ok(false);
        };
        let bytes = std::mem::take(&mut sc.payload);
        let r = self.put(pid, &bytes, &Some(e));
        sc.payload = bytes;
        let moved = matches!(r?, Swap::Done(_));
        if moved {
            self.counters.compacted.fetch_add(1, Ordering::Relaxed);
        }
        Ok(moved)
    }

    // ---- snapshots ----

    /// Blocks held back for the next snapshot (released, not yet free).
    pub fn held(&self) -> u64 {
        Self::held_in(&self.pool.lock())
    }

    /// The held blocks of `pool`: released, waiting for a snapshot (or
    /// for the one in flight).
    fn held_in(pool: &Pool) -> u64 {
        (pool.held.len() + pool.pending.len()) as u64
    }

    /// Whether the blocks held back for the next snapshot exceed a
    /// [`HELD_SHARE`]-th of both the blocks in use and `floor`: the point
    /// where a snapshot (which returns them to the pool) keeps the file
    /// within about a third more than its live data. Blocks in use are
    /// counted as the handed-out ones not free or held (writes in flight
    /// included), without a walk of the mapping.
    pub fn held_due(&self, floor: u64) -> bool {
        self.held_over(floor) >= 1
    }

    /// How many times over the [`BlockStore::held_due`] threshold the held
    /// blocks are (0: not due; 2: a snapshot twice overdue), from one look
    /// at the pool.
    pub fn held_over(&self, floor: u64) -> u64 {
        let pool = self.pool.lock();
        let held = Self::held_in(&pool);
        let threshold = Self::in_use(&pool).max(floor).max(1);
        match held * HELD_SHARE {
            h if h > threshold => (h - 1) / threshold,
            _ => 0,
        }
    }

    /// Captures the mapping and the pool at one instant, syncs the file so
    /// that every block the capture names is durable, and encodes the
    /// capture into `out` (see [`encode_map`]). Blocks released before the
    /// capture stay held until [`BlockStore::snapshot_durable`] (after the
    /// caller has made the encoded image durable) or go back to being held
    /// on [`BlockStore::snapshot_abandoned`]. One snapshot at a time: a
    /// second one before the first is resolved is an error (it would let
    /// the first's resolution free blocks the first still names).
    pub fn snapshot(&self, out: &mut Vec<u8>) -> Result<()> {
        self.capture(out, &HashSet::new())?;
        self.sync_capture()
    }

    /// The first half of [`BlockStore::snapshot`]: captures and encodes,
    /// syncing nothing, so that a caller holding its own locks for the
    /// capture can release them before [`BlockStore::sync_capture`] (no
    /// writer waits behind the fsync). The postings in `omit` are left out
    /// of the image (their ids recorded as gone, their blocks as free):
    /// a `spann` rebuild's new postings, which no centroid in use names
    /// yet.
    pub fn capture(&self, out: &mut Vec<u8>, omit: &HashSet<u32>) -> Result<()> {
        let (postings, end, gen) = {
            let _gate = self.gate.write();
            let map = self.map.read();
            let postings: Vec<Option<Posting>> = map
                .iter()
                .enumerate()
                .map(|(p, s)| match omit.contains(&(p as u32)) {
                    true => None,
                    false => s.entry.load_full().map(|p| (*p).clone()),
                })
                .collect();
            let mut pool = self.pool.lock();
            if pool.in_flight {
                return Err(Error::invalid(
                    "block store: a snapshot is in flight (make it durable or abandon it first)",
                ));
            }
            pool.in_flight = true;
            let held = std::mem::take(&mut pool.held);
            pool.pending.extend(held);
            (postings, pool.end, self.gen.load(Ordering::Relaxed))
        };
        // Free in the image: every block below the end that the captured
        // entries do not name (the held ones, the free ones, and blocks
        // handed out to writes not yet swapped in).
        let mut named = vec![false; end as usize];
        named[0] = true;
        for p in postings.iter().flatten() {
            for r in &p.blocks {
                named[r.block as usize] = true;
            }
        }
        let free = (0..end).filter(|&b| !named[b as usize]).collect();
        encode_map(
            &MapImage {
                dim: self.dim as u32,
                postings,
                free,
                end,
                gen,
            },
            out,
        );
        Ok(())
    }

    /// The second half of [`BlockStore::snapshot`]: syncs the file, so that
    /// every block the capture names is durable (and later writes, which is
    /// harmless: the capture's blocks are not reused before
    /// [`BlockStore::snapshot_durable`]). On failure the capture is
    /// abandoned.
    pub fn sync_capture(&self) -> Result<()> {
        self.file.sync().inspect_err(|_| self.snapshot_abandoned())
    }

    /// The last snapshot is durable: the blocks released before its
    /// capture may be reused.
    ///
    /// Free blocks at the file's end are then cut off it: no entry names
    /// them, and the durable snapshot's mapping does not either (a block it
    /// names is never released before the next snapshot), so recovery
    /// reads none of them whether or not a crash keeps the shorter length.
    /// The cut runs under the pool's lock, so no write is handed one of the
    /// blocks meanwhile; a failed cut leaves the file longer, and the
    /// blocks free.
    pub fn snapshot_durable(&self) {
        let mut pool = self.pool.lock();
        let pending = std::mem::take(&mut pool.pending);
        pool.free.extend(pending);
        pool.in_flight = false;
        let old_end = pool.end;
        while pool.end > 1 && pool.free.last() == Some(&(pool.end - 1)) {
            pool.free.pop_last();
            pool.end -= 1;
        }
        if pool.end < old_end {
            // Readers wait for the cut (it does not move under a read).
            let _len = self.trim.write();
            if self.file.set_len_blocks(u64::from(pool.end)).is_ok() {
                self.counters.trims.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// The last snapshot was not made durable: what it would have let go
    /// stays held.
    pub fn snapshot_abandoned(&self) {
        let mut pool = self.pool.lock();
        let pending = std::mem::take(&mut pool.pending);
        pool.held.extend(pending);
        pool.in_flight = false;
    }
}
