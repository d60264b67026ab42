//! Save and load (format documented in `docs/format-fresh-vamana.md`).
//!
//! A save pauses inserts and deletes, streams the graph through a CRC32
//! writer into a temp file beside the target, fsyncs it and renames it over
//! the target ([`vectide_core::io::atomic_write`]). A load reads the whole
//! file, checks the envelope (magic, version, end marker, checksum) before
//! it believes any byte, then every field against its bounds, so that a
//! truncated or corrupted file is an [`Error::Corrupted`], never a panic or
//! a huge allocation.

use crate::engine::{FreshVamana, NO_START};
use crate::params::{VamanaParams, MAX_R};
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::Ordering;
use vectide_core::io::{check_envelope, ByteReader};
use vectide_core::{Error, Metric, Result, StagedSave, VectorIndex};
use vectide_graph::mem::{Store, DELETED, FREE, FROZEN, LIVE};
use vectide_graph::slots::{Alloc, IdEntry};
use vectide_graph::Graph;

/// First bytes of a fresh-vamana index file.
pub const MAGIC: &[u8; 8] = b"VTDXVAMA";
/// Last bytes of the file.
pub const END_MAGIC: &[u8; 8] = b"VTDXEND\0";
/// The format version this build writes and reads.
pub const FORMAT_VERSION: u32 = 1;
const HEADER_LEN: usize = 80;
/// Largest ratio of in-memory slot bytes to file bytes a load accepts (see
/// the hnsw format: a nearly empty index has the largest legitimate one).
const MAX_EXPANSION: u64 = 4096;
/// Memory any file may describe regardless of its size.
const EXPANSION_FLOOR: u64 = 64 << 20;

/// What `vectide inspect` shows of an index file.
#[derive(Debug, Clone, PartialEq)]
pub struct FileInfo {
    pub format_version: u32,
    pub metric: Metric,
    pub dim: usize,
    pub params: VamanaParams,
    pub slots: usize,
    pub live: usize,
    pub deleted_pending: usize,
    pub free: usize,
    pub start_slot: Option<u32>,
    pub durable_seq: u64,
    pub file_bytes: u64,
    pub checksum: u32,
}

impl FreshVamana {
    /// Saves the index to `path` atomically (temp file, fsync, rename).
    /// Inserts and deletes wait while it runs; searches go on.
    pub fn save(&self, path: &Path) -> Result<()> {
        self.save_staged(path)?.commit()
    }

    /// [`save`](Self::save)'s file written beside `path`, to be committed
    /// (see [`VectorIndex::save_staged`]).
    pub fn save_staged(&self, path: &Path) -> Result<StagedSave<'_>> {
        let p = &self.params;
        self.core
            .save_staged(path, |w, store, watermark, alloc_next| {
                let mut h = Vec::with_capacity(HEADER_LEN);
                h.extend_from_slice(MAGIC);
                h.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
                h.extend_from_slice(&[self.core.metric as u8, 0, 0, 0]);
                h.extend_from_slice(&(self.core.dim as u32).to_le_bytes());
                h.extend_from_slice(&(p.r as u32).to_le_bytes());
                h.extend_from_slice(&(p.l_build as u32).to_le_bytes());
                h.extend_from_slice(&(p.l_search as u32).to_le_bytes());
                h.extend_from_slice(&p.alpha.to_le_bytes());
                h.extend_from_slice(&p.consolidate_fraction.to_le_bytes());
                h.extend_from_slice(&p.seed.to_le_bytes());
                h.extend_from_slice(&alloc_next.to_le_bytes());
                h.extend_from_slice(&self.start.load(Ordering::Acquire).to_le_bytes());
                h.extend_from_slice(&watermark.to_le_bytes());
                h.extend_from_slice(&(self.len() as u64).to_le_bytes());
                debug_assert_eq!(h.len(), HEADER_LEN);
                vectide_graph::core::GraphCore::write_graph_file(
                    w, &h, store, alloc_next, false, END_MAGIC,
                )
            })
    }

    /// Loads an index saved by [`FreshVamana::save`]; `threads` sets the
    /// pool of the loaded index (`None`: all cores).
    pub fn load(path: &Path, threads: Option<usize>) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|e| Error::io_at(path, e))?;
        let idx = Self::from_bytes(&bytes, threads)?;
        *idx.core.path.lock() = Some(path.to_path_buf());
        Ok(idx)
    }

    /// Parses the bytes of an index file (the fuzzable core of
    /// [`FreshVamana::load`]).
    pub fn from_bytes(bytes: &[u8], threads: Option<usize>) -> Result<Self> {
        let body = check_envelope(
            bytes,
            MAGIC,
            END_MAGIC,
            FORMAT_VERSION,
            HEADER_LEN,
            "fresh-vamana",
        )?;
        let mut r = ByteReader::new(body);
        let hdr = read_header(&mut r, threads)?;
        let n = hdr.slots;
        // Every slot takes at least 4 bytes, every used one 24 + 4·dim.
        if n > r.remaining() / 4 {
            return Err(Error::corrupted(format!(
                "{n} slots cannot fit in {} bytes",
                r.remaining()
            )));
        }
        let min_used = 24 + 4 * hdr.dim as u64;
        if hdr.live > n as u64 || hdr.live.saturating_mul(min_used) > r.remaining() as u64 {
            return Err(Error::corrupted(format!(
                "{} live points of dimension {} cannot fit in {} bytes",
                hdr.live,
                hdr.dim,
                r.remaining()
            )));
        }
        let cap = crate::params::slack_cap(hdr.params.r);
        let needed = Store::bytes_for(hdr.dim, cap, n) as u64;
        let allowed = (bytes.len() as u64)
            .saturating_mul(MAX_EXPANSION)
            .max(EXPANSION_FLOOR);
        if needed > allowed {
            return Err(Error::corrupted(format!(
                "implausible header: {n} slots of dimension {} need {needed} bytes of memory, \
                 more than {MAX_EXPANSION}x the {}-byte file",
                hdr.dim,
                bytes.len()
            )));
        }
        let store = Store::with_degrees(hdr.dim, 1, cap, n);
        let mut ids: HashMap<u64, IdEntry> = HashMap::with_capacity(hdr.live as usize);
        let mut alloc = Alloc {
            free: Vec::new(),
            next: n as u32,
        };
        let mut pending = Vec::new();
        let mut frozen = Vec::new();
        let mut vec = Vec::with_capacity(hdr.dim);
        let mut list = Vec::new();
        for s in 0..n as u32 {
            let state = r.u8()?;
            r.bytes(3)?;
            if state == FREE {
                alloc.free.push(s);
                continue;
            }
            if ![LIVE, DELETED, FROZEN].contains(&state) {
                return Err(Error::corrupted(format!("slot {s}: bad state {state}")));
            }
            let label = r.u64()?;
            if (label == vectide_core::RESERVED_ID) != (state == FROZEN) {
                return Err(Error::corrupted(format!(
                    "slot {s}: label {label:#x} in state {state} (only the start node is labelled {:#x})",
                    vectide_core::RESERVED_ID
                )));
            }
            let seq = r.u64()?;
            vec.clear();
            r.f32s(hdr.dim, &mut vec)?;
            if vec.iter().any(|x| !x.is_finite()) {
                return Err(Error::corrupted(format!("slot {s}: non-finite vector")));
            }
            // SAFETY: the store is new and owned by this thread; nothing else
            // can reach any slot yet.
            unsafe { store.init_slot(s, label, seq, &vec, 0) };
            let cnt = r.u32()? as usize;
            if cnt > cap {
                return Err(Error::corrupted(format!(
                    "slot {s}: {cnt} neighbours > the room of r = {} ({cap})",
                    hdr.params.r
                )));
            }
            list.clear();
            r.u32s(cnt, &mut list)?;
            if let Some(bad) = list.iter().find(|&&x| x as usize >= n || x == s) {
                return Err(Error::corrupted(format!(
                    "slot {s}: neighbour {bad} out of {n} slots or itself"
                )));
            }
            store.set_list(s, 0, &list);
            store.set_state(s, state);
            match state {
                LIVE => {
                    if ids.insert(label, IdEntry { slot: s, seq }).is_some() {
                        return Err(Error::corrupted(format!("label {label} is live twice")));
                    }
                }
                DELETED => pending.push(s),
                _ => frozen.push(s),
            }
        }
        if r.remaining() != 0 {
            return Err(Error::corrupted(format!(
                "{} unexpected bytes after the last slot",
                r.remaining()
            )));
        }
        if ids.len() as u64 != hdr.live {
            return Err(Error::corrupted(format!(
                "header says {} live points, slots hold {}",
                hdr.live,
                ids.len()
            )));
        }
        let mut buf = Vec::new();
        for s in 0..n as u32 {
            if store.state(s) == FREE {
                continue;
            }
            store.neighbors_into(s, 0, &mut buf);
            if let Some(bad) = buf.iter().find(|&&x| store.state(x) == FREE) {
                return Err(Error::corrupted(format!(
                    "slot {s}: edge to free slot {bad}"
                )));
            }
        }
        // Exactly one frozen start node, named by the header, once any node
        // exists; none before.
        let start_ok = match (hdr.start, frozen.as_slice()) {
            (NO_START, []) => n == alloc.free.len(),
            (s, [f]) => s == *f as u64,
            _ => false,
        };
        if !start_ok {
            return Err(Error::corrupted(format!(
                "start node {:#x} does not match the frozen slots {frozen:?}",
                hdr.start
            )));
        }
        let mut idx = FreshVamana::with_store(hdr.dim, hdr.metric, hdr.params, store)?;
        idx.core.restore(ids, alloc, pending, hdr.durable_seq);
        idx.start.store(hdr.start, Ordering::Release);
        Ok(idx)
    }
}

struct Header {
    metric: Metric,
    dim: usize,
    params: VamanaParams,
    slots: usize,
    start: u64,
    durable_seq: u64,
    live: u64,
}

fn read_header(r: &mut ByteReader<'_>, threads: Option<usize>) -> Result<Header> {
    r.bytes(8)?; // magic, checked
    r.u32()?; // version, checked
    let metric = Metric::from_tag(r.u8()?)?;
    r.bytes(3)?;
    let dim = r.u32()? as usize;
    if dim == 0 || dim > vectide_core::limits::MAX_DIM {
        return Err(Error::corrupted(format!("dimension {dim} out of range")));
    }
    let r_deg = r.u32()? as usize;
    if r_deg > MAX_R {
        return Err(Error::corrupted(format!("r = {r_deg} out of range")));
    }
    let l_build = r.u32()? as usize;
    let l_search = r.u32()? as usize;
    let alpha = f32::from_le_bytes(r.bytes(4)?.try_into().expect("4 bytes"));
    let consolidate_fraction = f64::from_le_bytes(r.bytes(8)?.try_into().expect("8 bytes"));
    let seed = r.u64()?;
    let slots = r.u32()? as usize;
    let start = r.u64()?;
    let durable_seq = r.u64()?;
    let live = r.u64()?;
    let params = VamanaParams {
        r: r_deg,
        l_build,
        l_search,
        alpha,
        consolidate_fraction,
        seed,
        threads,
    };
    params
        .validate()
        .map_err(|e| Error::corrupted(format!("header: {e}")))?;
    Ok(Header {
        metric,
        dim,
        params,
        slots,
        start,
        durable_seq,
        live,
    })
}

/// Reads an index file and describes it (checks everything a load checks).
pub fn inspect(path: &Path) -> Result<FileInfo> {
    let bytes = std::fs::read(path).map_err(|e| Error::io_at(path, e))?;
    let idx = FreshVamana::from_bytes(&bytes, Some(1))?;
    let stats = idx.stats()?;
    let slots = idx.core.alloc.lock().next as usize;
    let crc_at = bytes.len() - END_MAGIC.len() - 4;
    Ok(FileInfo {
        format_version: FORMAT_VERSION,
        metric: idx.metric(),
        dim: idx.dim(),
        params: idx.params.clone(),
        slots,
        live: stats.live,
        deleted_pending: stats.pending_deletes,
        free: slots - stats.slots_used,
        start_slot: idx.start_slot(),
        durable_seq: idx.durable_seq(),
        file_bytes: bytes.len() as u64,
        checksum: u32::from_le_bytes(bytes[crc_at..crc_at + 4].try_into().expect("4 bytes")),
    })
}
