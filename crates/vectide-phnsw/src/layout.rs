//! The P-HNSW layout in its persistent regions (`docs/format-phnsw.md`).
//!
//! An index is a directory of region files:
//! - `meta.vtdp`: the header (geometry, entry point, allocation words,
//!   durable sequence number, label-map root) and the two logs;
//! - `nodes.vtdp`: the layer-0 node blocks (paper's Figure 2a);
//! - `upper.vtdp`: the upper-layer neighbour lists (Figure 2b), allocated
//!   per node, contiguously, by a bump pointer;
//! - `labels-<gen>.vtdp`: the label → node map (see `labels`).
//!
//! Every file starts with a 4 KiB page holding its magic, format version,
//! kind-specific geometry and a CRC-32 of that page's fixed part.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use vectide_core::{Error, Metric, Result};
use vectide_graph::prune::MAX_LEVEL;
use vectide_graph::Graph;
use vectide_storage::Region;

/// Format version of every P-HNSW region file. Version 2 added the node
/// checksum (a CRC-32 of each node block's immutable part); version 3 the
/// `UNLINKED` node state (slots reclaimed by a consolidation and reused by
/// inserts) and the batch size in NlistLog entries. Older files are refused
/// with [`Error::Version`].
pub const FORMAT_VERSION: u32 = 3;
/// Bytes of every file's header page.
pub const PAGE: usize = 4096;
/// Cache line.
pub const LINE: usize = 64;

pub const META_MAGIC: &[u8; 8] = b"VTDXPHNS";
pub const NODES_MAGIC: &[u8; 8] = b"VTDXPNOD";
pub const UPPER_MAGIC: &[u8; 8] = b"VTDXPUPR";
pub const LABELS_MAGIC: &[u8; 8] = b"VTDXPLBL";

pub const META_FILE: &str = "meta.vtdp";
pub const NODES_FILE: &str = "nodes.vtdp";
pub const UPPER_FILE: &str = "upper.vtdp";

/// Node states (the paper's delete flag, plus the insert's own progress).
pub const FREE: u32 = 0;
pub const INSERTING: u32 = 1;
pub const LIVE: u32 = 2;
pub const DELETED: u32 = 3;
/// A deleted node that a consolidation unlinked: no list, bucket or entry
/// word names it any more, so its slot may be reused (version 3).
pub const UNLINKED: u32 = 4;

/// Entry-point word when the graph is empty.
pub const NO_ENTRY: u64 = u64::MAX;

// Mutable words of the meta header, one cache line each.
pub const M_ENTRY: usize = 256;
pub const M_NEXT_SLOT: usize = 320;
pub const M_UPPER_NEXT: usize = 384;
pub const M_DURABLE_SEQ: usize = 448;
pub const M_LABELS_ROOT: usize = 512;
pub const M_LEVEL_COUNTER: usize = 576;
/// Non-zero from before a consolidation writes its first list until its
/// lists (and the links that keep every live node reachable) are durable:
/// an open that finds it set finishes the consolidation. Zero in files
/// written before the word existed, which reads as "none in flight".
pub const M_CONSOLIDATING: usize = 640;
/// The fixed (CRC-covered) part of the meta header: bytes 16..256.
const META_FIXED_END: usize = 256;

#[inline]
fn align(x: usize, a: usize) -> usize {
    x.div_ceil(a) * a
}

/// Geometry shared by every file of an index: fixed at creation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    pub dim: usize,
    pub metric: Metric,
    pub m: usize,
    pub m0: usize,
    pub ef_construction: usize,
    pub ef_search: usize,
    pub seed: u64,
    pub nlog_entries: usize,
    pub nlist_entries: usize,
}

impl Geometry {
    /// Offset of `state, level` in a node block.
    pub fn n_state(&self) -> usize {
        align(4 + 4 * self.m0, 8)
    }
    pub fn n_label(&self) -> usize {
        self.n_state() + 8
    }
    pub fn n_seq(&self) -> usize {
        self.n_state() + 16
    }
    pub fn n_upper(&self) -> usize {
        self.n_state() + 24
    }
    /// Offset of the node checksum (u32; see [`node_checksum`]).
    pub fn n_crc(&self) -> usize {
        self.n_state() + 32
    }
    /// Offset of the vector in a node block (cache-line aligned).
    pub fn n_vector(&self) -> usize {
        align(self.n_crc() + 4, LINE)
    }
    /// Bytes per node block (a multiple of 64, so vectors stay aligned).
    pub fn node_size(&self) -> usize {
        self.n_vector() + align(4 * self.dim, LINE)
    }
    /// Bytes of one upper-layer list `[count, m ids]`.
    pub fn upper_list_bytes(&self) -> usize {
        4 * (1 + self.m)
    }
    /// Bytes of the lists an NLog entry can hold (`level <= MAX_LEVEL`).
    pub fn nlog_lists_bytes(&self) -> usize {
        4 * (1 + self.m0) + MAX_LEVEL * self.upper_list_bytes()
    }
    pub fn nlog_entry_size(&self) -> usize {
        align(NL_LISTS + self.nlog_lists_bytes(), LINE)
    }
    pub fn nlist_entry_size(&self) -> usize {
        align(NI_LIST + 4 * (1 + self.m0), LINE)
    }
    pub fn nlog_offset(&self, i: usize) -> usize {
        PAGE + i * self.nlog_entry_size()
    }
    pub fn nlist_offset(&self, i: usize) -> usize {
        PAGE + self.nlog_entries * self.nlog_entry_size() + i * self.nlist_entry_size()
    }
    pub fn meta_len(&self) -> usize {
        align(self.nlist_offset(self.nlist_entries), PAGE)
    }
    /// Offset of a node block in `nodes.vtdp`.
    #[inline]
    pub fn node_offset(&self, slot: u32) -> usize {
        PAGE + slot as usize * self.node_size()
    }
    /// Nodes a `nodes.vtdp` of `len` bytes holds.
    pub fn capacity_of(&self, len: usize) -> usize {
        len.saturating_sub(PAGE) / self.node_size()
    }

    /// Checks ranges, so that a hostile header cannot ask for absurd sizes.
    pub fn validate(&self) -> Result<()> {
        let bad = |what: &str, v: usize, lo: usize, hi: usize| {
            if v < lo || v > hi {
                Err(Error::invalid(format!(
                    "{what} must be in {lo}..={hi}, got {v}"
                )))
            } else {
                Ok(())
            }
        };
        bad("dim", self.dim, 1, 65_536)?;
        bad("m", self.m, 2, 256)?;
        if self.m0 != 2 * self.m {
            return Err(Error::corrupted(format!("m0 {} is not 2m", self.m0)));
        }
        bad("ef_construction", self.ef_construction, 1, 100_000)?;
        bad("ef_search", self.ef_search, 1, 100_000)?;
        bad("nlog_entries", self.nlog_entries, 1, 4096)?;
        bad("nlist_entries", self.nlist_entries, 1, 65_536)?;
        Ok(())
    }
}

// NLog entry fields.
pub const NL_STATE: usize = 0;
pub const NL_KIND: usize = 8;
pub const NL_LEVEL: usize = 12;
pub const NL_SLOT: usize = 16;
pub const NL_LABEL: usize = 24;
pub const NL_SEQ: usize = 32;
pub const NL_OLD: usize = 40;
pub const NL_LIVE_BEFORE: usize = 48;
/// In-edge batches whose lists are written (recovery resumes after them).
pub const NL_INEDGES: usize = 56;
/// The entry's share of the live count (its own cache line; see `len`).
pub const NL_LIVE: usize = 64;
pub const NL_LISTS: usize = 128;

// NlistLog entry fields.
pub const NI_STATE: usize = 0;
pub const NI_SLOT: usize = 8;
pub const NI_LEVEL: usize = 12;
/// Which in-edge batch of its operation the entry belongs to.
pub const NI_BATCH: usize = 16;
/// The node whose insert the entry serves (with the batch: the entry's op).
pub const NI_NEW: usize = 20;
/// How many entries (from the owner's first) the entry's batch wrote:
/// recovery undoes exactly those (version 3; a slot reused by a new insert,
/// or a consolidation, could otherwise match stale entries of an older
/// batch by node and batch number).
pub const NI_COUNT: usize = 24;
pub const NI_LIST: usize = 32;

fn put(buf: &mut [u8], off: usize, bytes: &[u8]) {
    buf[off..off + bytes.len()].copy_from_slice(bytes);
}
fn get32(buf: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(buf[off..off + 4].try_into().expect("4 bytes"))
}
fn get64(buf: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(buf[off..off + 8].try_into().expect("8 bytes"))
}

/// Builds the meta header page (fixed part + zeroed mutable words).
pub fn encode_meta(g: &Geometry) -> Vec<u8> {
    let mut p = vec![0u8; PAGE];
    put(&mut p, 0, META_MAGIC);
    put(&mut p, 8, &FORMAT_VERSION.to_le_bytes());
    put(&mut p, 16, &(g.dim as u32).to_le_bytes());
    put(&mut p, 20, &(g.metric as u32).to_le_bytes());
    put(&mut p, 24, &(g.m as u32).to_le_bytes());
    put(&mut p, 28, &(g.m0 as u32).to_le_bytes());
    put(&mut p, 32, &(g.ef_construction as u32).to_le_bytes());
    put(&mut p, 36, &(g.ef_search as u32).to_le_bytes());
    put(&mut p, 40, &(MAX_LEVEL as u32).to_le_bytes());
    put(&mut p, 44, &(g.node_size() as u32).to_le_bytes());
    put(&mut p, 48, &(g.n_vector() as u32).to_le_bytes());
    put(&mut p, 52, &(g.nlog_entries as u32).to_le_bytes());
    put(&mut p, 56, &(g.nlog_entry_size() as u32).to_le_bytes());
    put(&mut p, 60, &(g.nlist_entries as u32).to_le_bytes());
    put(&mut p, 64, &(g.nlist_entry_size() as u32).to_le_bytes());
    put(&mut p, 72, &g.seed.to_le_bytes());
    let crc = crc32fast::hash(&p[16..META_FIXED_END]);
    put(&mut p, 12, &crc.to_le_bytes());
    put(&mut p, M_ENTRY, &NO_ENTRY.to_le_bytes());
    put(&mut p, M_NEXT_SLOT, &0u64.to_le_bytes());
    put(&mut p, M_UPPER_NEXT, &(PAGE as u64).to_le_bytes());
    p
}

fn check_magic_version(page: &[u8], magic: &[u8; 8], what: &str) -> Result<()> {
    if page.len() < PAGE {
        return Err(Error::corrupted(format!(
            "{what}: {} bytes, shorter than its header page",
            page.len()
        )));
    }
    if &page[..8] != magic {
        return Err(Error::corrupted(format!(
            "{what}: bad magic {:02x?} (expected {:?})",
            &page[..8],
            String::from_utf8_lossy(magic)
        )));
    }
    let v = get32(page, 8);
    if v != FORMAT_VERSION {
        return Err(Error::Version {
            found: v,
            supported: FORMAT_VERSION,
        });
    }
    Ok(())
}

/// Reads and checks the meta header page.
pub fn decode_meta(page: &[u8]) -> Result<Geometry> {
    check_magic_version(page, META_MAGIC, META_FILE)?;
    let crc = crc32fast::hash(&page[16..META_FIXED_END]);
    if crc != get32(page, 12) {
        return Err(Error::corrupted(format!(
            "{META_FILE}: header checksum mismatch (torn or corrupted header)"
        )));
    }
    let tag = get32(page, 20);
    let metric = u8::try_from(tag)
        .ok()
        .and_then(|t| Metric::from_tag(t).ok())
        .ok_or_else(|| Error::corrupted(format!("{META_FILE}: unknown metric {tag}")))?;
    let g = Geometry {
        dim: get32(page, 16) as usize,
        metric,
        m: get32(page, 24) as usize,
        m0: get32(page, 28) as usize,
        ef_construction: get32(page, 32) as usize,
        ef_search: get32(page, 36) as usize,
        seed: get64(page, 72),
        nlog_entries: get32(page, 52) as usize,
        nlist_entries: get32(page, 60) as usize,
    };
    g.validate()
        .map_err(|e| Error::corrupted(format!("{META_FILE}: {e}")))?;
    let derived = [
        (40, MAX_LEVEL, "max level"),
        (44, g.node_size(), "node size"),
        (48, g.n_vector(), "vector offset"),
        (56, g.nlog_entry_size(), "NLog entry size"),
        (64, g.nlist_entry_size(), "NlistLog entry size"),
    ];
    for (off, want, what) in derived {
        if get32(page, off) as usize != want {
            return Err(Error::corrupted(format!(
                "{META_FILE}: {what} {} does not match the geometry ({want})",
                get32(page, off)
            )));
        }
    }
    Ok(g)
}

/// Header page of a data file (`nodes`, `upper`, `labels-*`): magic, version,
/// the meta header's CRC (binds the file to its index), and two parameters.
pub fn encode_data_header(magic: &[u8; 8], meta_crc: u32, a: u64, b: u64) -> Vec<u8> {
    let mut p = vec![0u8; PAGE];
    put(&mut p, 0, magic);
    put(&mut p, 8, &FORMAT_VERSION.to_le_bytes());
    put(&mut p, 16, &meta_crc.to_le_bytes());
    put(&mut p, 24, &a.to_le_bytes());
    put(&mut p, 32, &b.to_le_bytes());
    let crc = crc32fast::hash(&p[16..64]);
    put(&mut p, 12, &crc.to_le_bytes());
    p
}

/// Checks a data file's header page; returns its two parameters.
pub fn decode_data_header(
    page: &[u8],
    magic: &[u8; 8],
    what: &str,
    meta_crc: u32,
) -> Result<(u64, u64)> {
    check_magic_version(page, magic, what)?;
    if crc32fast::hash(&page[16..64]) != get32(page, 12) {
        return Err(Error::corrupted(format!(
            "{what}: header checksum mismatch"
        )));
    }
    if get32(page, 16) != meta_crc {
        return Err(Error::corrupted(format!(
            "{what}: belongs to another index (meta checksum differs)"
        )));
    }
    Ok((get64(page, 24), get64(page, 32)))
}

/// The meta header's CRC (stored at offset 12).
pub fn meta_crc(meta: &Region) -> u32 {
    meta.u32_at(12).load(Ordering::Relaxed)
}

/// Packs the entry point (slot, top level) into one atomic word.
#[inline]
pub fn pack_entry(slot: u32, level: usize) -> u64 {
    ((slot as u64) << 8) | level as u64
}

#[inline]
pub fn unpack_entry(word: u64) -> Option<(u32, usize)> {
    (word != NO_ENTRY).then_some(((word >> 8) as u32, (word & 0xff) as usize))
}

/// The checksum of a node's immutable part: CRC-32 of the slot number
/// (u32, so that a block copied to another slot does not verify), then
/// `head`, the block's bytes from the level to the end of the upper-list
/// offset (level, label, sequence number, upper offset), then the vector's
/// bytes. The neighbour lists and the state word change in place after
/// publication and are not covered (`docs/format-phnsw.md`).
pub fn node_checksum(slot: u32, head: &[u8], vector: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&slot.to_le_bytes());
    h.update(head);
    h.update(vector);
    h.finalize()
}

/// The error of a node whose checksum does not match.
pub fn checksum_mismatch(slot: u32, stored: u32, computed: u32) -> Error {
    Error::corrupted(format!(
        "{NODES_FILE}: node {slot}: checksum mismatch (stored {stored:08x}, computed \
         {computed:08x}): its label, level, sequence number, upper-list offset or vector \
         was altered"
    ))
}

/// Checks a node block read from the file against its stored checksum.
pub fn verify_node_block(g: &Geometry, slot: u32, block: &[u8]) -> Result<()> {
    let stored = get32(block, g.n_crc());
    let computed = node_checksum(
        slot,
        &block[g.n_state() + 4..g.n_crc()],
        &block[g.n_vector()..g.n_vector() + 4 * g.dim],
    );
    if stored == computed {
        Ok(())
    } else {
        Err(checksum_mismatch(slot, stored, computed))
    }
}

/// The graph as it lies in the `nodes` and `upper` regions.
pub struct PGraph {
    pub g: Geometry,
    pub nodes: Region,
    pub upper: Region,
    node_size: usize,
    n_vector: usize,
    n_state: usize,
}

impl PGraph {
    pub fn new(g: Geometry, nodes: Region, upper: Region) -> Self {
        PGraph {
            node_size: g.node_size(),
            n_vector: g.n_vector(),
            n_state: g.n_state(),
            g,
            nodes,
            upper,
        }
    }

    /// Node blocks the `nodes` file holds now.
    #[inline]
    pub fn capacity(&self) -> usize {
        self.g.capacity_of(self.nodes.len())
    }

    #[inline]
    pub fn node_off(&self, slot: u32) -> usize {
        PAGE + slot as usize * self.node_size
    }

    #[inline]
    pub fn state_word(&self, slot: u32) -> &AtomicU32 {
        self.nodes.u32_at(self.node_off(slot) + self.n_state)
    }

    #[inline]
    pub fn state(&self, slot: u32) -> u32 {
        self.state_word(slot).load(Ordering::Acquire)
    }

    #[inline]
    pub fn level(&self, slot: u32) -> usize {
        (self
            .nodes
            .u32_at(self.node_off(slot) + self.n_state + 4)
            .load(Ordering::Acquire) as usize)
            .min(MAX_LEVEL)
    }

    #[inline]
    pub fn label_word(&self, slot: u32) -> &AtomicU64 {
        self.nodes.u64_at(self.node_off(slot) + self.g.n_label())
    }

    #[inline]
    pub fn label(&self, slot: u32) -> u64 {
        self.label_word(slot).load(Ordering::Acquire)
    }

    #[inline]
    pub fn seq(&self, slot: u32) -> u64 {
        self.nodes
            .u64_at(self.node_off(slot) + self.g.n_seq())
            .load(Ordering::Acquire)
    }

    /// Offset in `upper` of the node's list at `level >= 1`, if it has one
    /// and it lies inside the file (a corrupted pointer reads as "none").
    #[inline]
    pub fn upper_off(&self, slot: u32, level: usize) -> Option<usize> {
        if level == 0 || level > self.level(slot) {
            return None;
        }
        let base = self
            .nodes
            .u64_at(self.node_off(slot) + self.g.n_upper())
            .load(Ordering::Acquire) as usize;
        let lb = self.g.upper_list_bytes();
        let off = base.checked_add((level - 1) * lb)?;
        (base >= PAGE && off.checked_add(lb)? <= self.upper.len()).then_some(off)
    }

    /// The checksum of a node's immutable part as it lies in the region.
    fn checksum_of(&self, slot: u32) -> u32 {
        let off = self.node_off(slot);
        let head = self.n_state + 4..self.g.n_crc();
        // SAFETY: both ranges are bounds-checked by `bytes`. They hold the
        // node's immutable part, written only while the slot is unreachable
        // (by the thread that allocated it) and never again: no writer races
        // these shared borrows. The lists and the state word, which change
        // in place, are not borrowed.
        unsafe {
            node_checksum(
                slot,
                self.nodes.bytes(off + head.start, head.len()),
                self.nodes.bytes(off + self.n_vector, 4 * self.g.dim),
            )
        }
    }

    /// Writes the checksum of a node whose immutable part is complete (the
    /// slot is unreachable; the caller persists the block with it).
    pub fn seal(&self, slot: u32) {
        let crc = self.checksum_of(slot);
        self.nodes
            .u32_at(self.node_off(slot) + self.g.n_crc())
            .store(crc, Ordering::Relaxed);
    }

    /// Verifies a node against its checksum: [`Error::Corrupted`] naming
    /// the slot on a mismatch.
    pub fn verify(&self, slot: u32) -> Result<()> {
        if slot as usize >= self.capacity() {
            return Err(Error::corrupted(format!(
                "{NODES_FILE}: node {slot} lies beyond the file ({} nodes)",
                self.capacity()
            )));
        }
        let stored = self
            .nodes
            .u32_at(self.node_off(slot) + self.g.n_crc())
            .load(Ordering::Acquire);
        let computed = self.checksum_of(slot);
        if stored == computed {
            Ok(())
        } else {
            Err(checksum_mismatch(slot, stored, computed))
        }
    }

    /// Region and byte range of a node's list at a layer (for persisting).
    pub fn list_range(&self, slot: u32, level: usize) -> Option<(&Region, usize, usize)> {
        if level == 0 {
            Some((&self.nodes, self.node_off(slot), 4 * (1 + self.g.m0)))
        } else {
            self.upper_off(slot, level)
                .map(|o| (&self.upper, o, self.g.upper_list_bytes()))
        }
    }
}

impl Graph for PGraph {
    #[inline]
    fn slots(&self) -> usize {
        self.capacity()
    }

    #[inline]
    fn vector(&self, slot: u32) -> &[f32] {
        let off = self.node_off(slot) + self.n_vector;
        let dim = self.g.dim;
        // SAFETY: `slot < capacity` for every id the engine reads (ids from
        // lists are filtered by `slots()`; entry/log ids are validated), so
        // the vector lies inside the mapping (bounds checked by `bytes`),
        // 64-byte aligned (page-aligned base, node size and vector offset
        // multiples of 64). A node's vector is written only before the node
        // is reachable, so no writer races this shared borrow.
        unsafe {
            let bytes = self.nodes.bytes(off, dim * 4);
            std::slice::from_raw_parts(bytes.as_ptr() as *const f32, dim)
        }
    }

    #[inline]
    fn vector_ptr(&self, slot: u32) -> *const f32 {
        self.nodes
            .base()
            .wrapping_add(self.node_off(slot) + self.n_vector) as *const f32
    }

    #[inline]
    fn list0_ptr(&self, slot: u32) -> *const u8 {
        self.nodes.base().wrapping_add(self.node_off(slot)) as *const u8
    }

    #[inline]
    fn list(&self, slot: u32, level: usize) -> &[AtomicU32] {
        if level == 0 {
            self.nodes.u32s_at(self.node_off(slot), 1 + self.g.m0)
        } else {
            match self.upper_off(slot, level) {
                Some(off) => self.upper.u32s_at(off, 1 + self.g.m),
                None => &[],
            }
        }
    }

    #[inline]
    fn cap(&self, level: usize) -> usize {
        if level == 0 {
            self.g.m0
        } else {
            self.g.m
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geo() -> Geometry {
        Geometry {
            dim: 50,
            metric: Metric::Cosine,
            m: 16,
            m0: 32,
            ef_construction: 200,
            ef_search: 64,
            seed: 1,
            nlog_entries: 64,
            nlist_entries: 512,
        }
    }

    #[test]
    fn node_block_offsets_for_glove() {
        let g = geo();
        assert_eq!(g.n_state(), 136);
        assert_eq!(g.n_label(), 144);
        assert_eq!(g.n_crc(), 168);
        assert_eq!(g.n_vector(), 192);
        assert_eq!(g.node_size(), 448);
        assert_eq!(g.nlog_entry_size() % 64, 0);
        assert_eq!(g.nlist_entry_size(), 192);
        let small = Geometry { m: 6, m0: 12, ..g };
        assert!(
            small.nlist_entry_size() >= NI_LIST + 4 * 13,
            "count + m0 ids fit"
        );
        assert_eq!(g.meta_len() % PAGE, 0);
    }

    #[test]
    fn meta_round_trip_and_rejections() {
        let g = geo();
        let p = encode_meta(&g);
        assert_eq!(decode_meta(&p).unwrap(), g);
        let mut bad = p.clone();
        bad[0] = b'X';
        assert!(matches!(decode_meta(&bad), Err(Error::Corrupted(_))));
        let mut bad = p.clone();
        bad[8] = 9;
        assert!(matches!(
            decode_meta(&bad),
            Err(Error::Version { found: 9, .. })
        ));
        // Versions 1 (before node checksums) and 2 (before slot reuse: no
        // UNLINKED state, NlistLog entries without their batch size) are
        // refused, not misread.
        for v in [1u32, 2] {
            let mut old = p.clone();
            old[8..12].copy_from_slice(&v.to_le_bytes());
            assert!(
                matches!(
                    decode_meta(&old),
                    Err(Error::Version { found, supported: 3 }) if found == v
                ),
                "version {v}"
            );
        }
        let mut bad = p.clone();
        bad[16] ^= 1; // dim changed: torn header
        assert!(matches!(decode_meta(&bad), Err(Error::Corrupted(m)) if m.contains("checksum")));
        assert!(decode_meta(&p[..100]).is_err());
        let h = encode_data_header(NODES_MAGIC, 7, 448, 3);
        assert_eq!(
            decode_data_header(&h, NODES_MAGIC, "n", 7).unwrap(),
            (448, 3)
        );
        assert!(decode_data_header(&h, NODES_MAGIC, "n", 8).is_err());
        assert!(decode_data_header(&h, UPPER_MAGIC, "n", 7).is_err());
    }
}
