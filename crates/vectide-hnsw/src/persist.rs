//! Save and load (format documented in `docs/format-hnsw.md`).
//!
//! A save pauses inserts and deletes, streams the graph through a CRC32
//! writer into a temp file beside the target, fsyncs it and renames it over
//! the target ([`vectide_core::io::atomic_write`]). A load reads the whole
//! file, checks the end magic and the checksum before it believes any byte,
//! then checks every field against its bounds, so that a truncated or
//! corrupted file is an [`Error::Corrupted`], never a panic or a huge
//! allocation.

use crate::graph::Graph;
use crate::params::{HnswParams, MAX_LEVEL};
use crate::state::{unpack_entry, Alloc, Hnsw, IdEntry};
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::Ordering;
use vectide_core::io::{check_envelope, ByteReader};
use vectide_core::{Error, Metric, Result, StagedSave, VectorIndex};
use vectide_graph::codes::Quantization;
use vectide_graph::mem::{Store, DELETED, FREE, LIVE};
use vectide_quant::{Rabitq, RabitqParams};

/// First bytes of an HNSW index file.
pub const MAGIC: &[u8; 8] = b"VTDXHNSW";
/// Last bytes of an HNSW index file.
pub const END_MAGIC: &[u8; 8] = b"VTDXEND\0";
/// The format version this build writes for an index on float32 (and
/// reads).
pub const FORMAT_VERSION: u32 = 1;
/// The version of a file whose index walks on RaBitQ codes: the header's
/// first reserved byte names the quantization and the quantizer follows
/// the header (see `docs/format-hnsw.md`). A build that knows only
/// version 1 refuses it by its version.
pub const FORMAT_VERSION_QUANTIZED: u32 = 2;
const HEADER_LEN: usize = 88;
/// Largest ratio of in-memory slot bytes to file bytes a load accepts (an
/// index whose slots are nearly all free, e.g. after deleting everything,
/// has the largest legitimate ratio: about 800 at dimension 768).
const MAX_EXPANSION: u64 = 4096;
/// Memory any file may describe regardless of its size.
const EXPANSION_FLOOR: u64 = 64 << 20;

/// What `vectide inspect` shows of an index file.
#[derive(Debug, Clone, PartialEq)]
pub struct FileInfo {
    pub format_version: u32,
    pub metric: Metric,
    pub quantization: Quantization,
    pub dim: usize,
    pub m: usize,
    pub ef_construction: usize,
    pub ef_search: usize,
    pub slots: usize,
    pub live: usize,
    pub deleted_pending: usize,
    pub free: usize,
    pub entry_slot: Option<u32>,
    pub max_level: usize,
    pub durable_seq: u64,
    pub file_bytes: u64,
    pub checksum: u32,
}

impl Hnsw {
    /// Saves the index to `path` atomically (temp file, fsync, rename).
    /// Inserts and deletes wait while it runs; searches go on.
    pub fn save(&self, path: &Path) -> Result<()> {
        self.save_staged(path)?.commit()
    }

    /// [`save`](Self::save)'s file written beside `path`, to be committed
    /// (see [`VectorIndex::save_staged`]).
    pub fn save_staged(&self, path: &Path) -> Result<StagedSave<'_>> {
        self.core
            .save_staged(path, |w, store, watermark, alloc_next| {
                let mut h = Vec::with_capacity(HEADER_LEN);
                let quantizer = store.codes().map(|c| c.quantizer());
                let (version, tag) = match self.params.quantization {
                    Quantization::None => (FORMAT_VERSION, 0),
                    q => (FORMAT_VERSION_QUANTIZED, q.tag()),
                };
                h.extend_from_slice(MAGIC);
                h.extend_from_slice(&version.to_le_bytes());
                h.extend_from_slice(&[self.core.metric as u8, tag, 0, 0]);
                h.extend_from_slice(&(self.core.dim as u32).to_le_bytes());
                h.extend_from_slice(&(self.params.m as u32).to_le_bytes());
                h.extend_from_slice(&(self.params.ef_construction as u32).to_le_bytes());
                h.extend_from_slice(&(self.params.ef_search as u32).to_le_bytes());
                h.extend_from_slice(&self.params.seed.to_le_bytes());
                h.extend_from_slice(&alloc_next.to_le_bytes());
                h.extend_from_slice(&self.params.repair_alpha.to_le_bytes());
                h.extend_from_slice(&self.entry.load(Ordering::Acquire).to_le_bytes());
                h.extend_from_slice(&watermark.to_le_bytes());
                h.extend_from_slice(&self.level_counter.load(Ordering::Relaxed).to_le_bytes());
                h.extend_from_slice(&(self.len() as u64).to_le_bytes());
                h.extend_from_slice(&self.params.consolidate_fraction.to_le_bytes());
                debug_assert_eq!(h.len(), HEADER_LEN);
                if version == FORMAT_VERSION_QUANTIZED {
                    // The quantizer, once the first insert has made it.
                    h.push(u8::from(quantizer.is_some()));
                    if let Some(rq) = quantizer {
                        h.extend_from_slice(&rq.seed().to_le_bytes());
                        for x in rq.centroid() {
                            h.extend_from_slice(&x.to_le_bytes());
                        }
                    }
                }
                vectide_graph::core::GraphCore::write_graph_file(
                    w, &h, store, alloc_next, true, END_MAGIC,
                )
            })
    }

    /// Loads an index saved by [`Hnsw::save`]. `threads` sets the pool of
    /// the loaded index (`None`: all cores).
    pub fn load(path: &Path, threads: Option<usize>) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|e| Error::io_at(path, e))?;
        let idx = Self::from_bytes(&bytes, threads)?;
        *idx.core.path.lock() = Some(path.to_path_buf());
        Ok(idx)
    }

    /// Parses the bytes of an index file (the fuzzable core of [`Hnsw::load`]).
    pub fn from_bytes(bytes: &[u8], threads: Option<usize>) -> Result<Self> {
        let version = match bytes.get(8..12) {
            Some(v) if v == FORMAT_VERSION_QUANTIZED.to_le_bytes() => FORMAT_VERSION_QUANTIZED,
            _ => FORMAT_VERSION,
        };
        let body = check_envelope(bytes, MAGIC, END_MAGIC, version, HEADER_LEN, "HNSW")?;
        let mut r = ByteReader::new(body);
        let hdr = read_header(&mut r)?;
        let quantization = if version == FORMAT_VERSION_QUANTIZED {
            match Quantization::from_tag(hdr.quant_tag)? {
                Quantization::None => {
                    return Err(Error::corrupted(
                        "a version-2 file (with codes) names no quantization",
                    ))
                }
                q => q,
            }
        } else if hdr.quant_tag != 0 {
            return Err(Error::corrupted(format!(
                "a version-1 file (float32) names quantization tag {}",
                hdr.quant_tag
            )));
        } else {
            Quantization::None
        };
        let present = if quantization == Quantization::None {
            false
        } else {
            match r.u8()? {
                0 => false,
                1 => true,
                b => {
                    return Err(Error::corrupted(format!(
                        "quantizer flag {b} is not 0 or 1"
                    )))
                }
            }
        };
        let quantizer = if !present {
            None
        } else {
            let seed = r.u64()?;
            let mut centroid = Vec::with_capacity(hdr.dim);
            r.f32s(hdr.dim, &mut centroid)?;
            let rq = Rabitq::new(hdr.metric, centroid, RabitqParams { bits: 1, seed })
                .map_err(|e| Error::corrupted(format!("quantizer: {e}")))?;
            Some(rq)
        };
        let params = HnswParams {
            quantization,
            m: hdr.m,
            ef_construction: hdr.ef_construction,
            ef_search: hdr.ef_search,
            seed: hdr.seed,
            consolidate_fraction: hdr.consolidate_fraction,
            repair_alpha: hdr.repair_alpha,
            threads,
        };
        params
            .validate()
            .map_err(|e| Error::corrupted(format!("header: {e}")))?;
        let n = hdr.slots;
        // Every non-free slot needs at least 4 + 16 + 4*dim + 4 bytes.
        if n > r.remaining() / 4 {
            return Err(Error::corrupted(format!(
                "{n} slots cannot fit in {} bytes",
                r.remaining()
            )));
        }
        // Every live slot needs at least 4 + 16 + 4*dim + 4 bytes.
        let min_live = 24 + 4 * hdr.dim as u64;
        if hdr.live > n as u64 || hdr.live.saturating_mul(min_live) > r.remaining() as u64 {
            return Err(Error::corrupted(format!(
                "{} live points of dimension {} cannot fit in {} bytes",
                hdr.live,
                hdr.dim,
                r.remaining()
            )));
        }
        // Free slots take 4 bytes in the file but a whole row in memory; a
        // file may describe at most MAX_EXPANSION times its size (plus a floor)
        // in memory, so that a hostile header cannot ask for a huge allocation.
        let codes = if quantizer.is_some() {
            vectide_graph::codes::Codes::bytes_for(hdr.dim, 2 * hdr.m)
        } else {
            0
        };
        let needed = (Store::bytes_for(hdr.dim, 2 * hdr.m, n) as u64)
            .saturating_add((codes as u64).saturating_mul(n as u64));
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
        let store = Store::new(hdr.dim, hdr.m, n);
        let mut ids: HashMap<u64, IdEntry> = HashMap::with_capacity(hdr.live as usize);
        let mut alloc = Alloc {
            free: Vec::new(),
            next: n as u32,
        };
        let mut pending = Vec::new();
        let mut vec = Vec::with_capacity(hdr.dim);
        let mut list = Vec::new();
        for s in 0..n as u32 {
            let state = r.u8()?;
            let level = r.u8()? as usize;
            r.bytes(2)?;
            if state == FREE {
                alloc.free.push(s);
                continue;
            }
            if state != LIVE && state != DELETED {
                return Err(Error::corrupted(format!("slot {s}: bad state {state}")));
            }
            if level > MAX_LEVEL {
                return Err(Error::corrupted(format!(
                    "slot {s}: level {level} > {MAX_LEVEL}"
                )));
            }
            let label = r.u64()?;
            let seq = r.u64()?;
            vec.clear();
            r.f32s(hdr.dim, &mut vec)?;
            if vec.iter().any(|x| !x.is_finite()) {
                return Err(Error::corrupted(format!("slot {s}: non-finite vector")));
            }
            // SAFETY: the store is new and owned by this thread; nothing else
            // can reach any slot yet.
            unsafe { store.init_slot(s, label, seq, &vec, level) };
            for l in 0..=level {
                let cnt = r.u32()? as usize;
                if cnt > store.cap(l) {
                    return Err(Error::corrupted(format!(
                        "slot {s} layer {l}: {cnt} neighbours > bound {}",
                        store.cap(l)
                    )));
                }
                list.clear();
                r.u32s(cnt, &mut list)?;
                if let Some(bad) = list.iter().find(|&&x| x as usize >= n) {
                    return Err(Error::corrupted(format!(
                        "slot {s} layer {l}: neighbour {bad} out of {n} slots"
                    )));
                }
                store.set_list(s, l, &list);
            }
            store.set_state(s, state);
            if state == LIVE {
                if ids.insert(label, IdEntry { slot: s, seq }).is_some() {
                    return Err(Error::corrupted(format!("label {label} is live twice")));
                }
            } else {
                pending.push(s);
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
        // Edges must name used slots, and the entry point must be a used
        // slot whose level it states.
        let mut buf = Vec::new();
        for s in 0..n as u32 {
            if store.state(s) == FREE {
                continue;
            }
            for l in 0..=store.level(s) {
                store.neighbors_into(s, l, &mut buf);
                if let Some(bad) = buf.iter().find(|&&x| store.state(x) == FREE) {
                    return Err(Error::corrupted(format!(
                        "slot {s} layer {l}: edge to free slot {bad}"
                    )));
                }
                if l > 0 {
                    if let Some(bad) = buf.iter().find(|&&x| store.level(x) < l) {
                        return Err(Error::corrupted(format!(
                            "slot {s} layer {l}: edge to slot {bad} absent from that layer"
                        )));
                    }
                }
            }
        }
        match unpack_entry(hdr.entry) {
            None if n - alloc.free.len() > 0 => {
                return Err(Error::corrupted("no entry point but the graph has nodes"))
            }
            Some((ep, lvl))
                if ep as usize >= n || store.state(ep) == FREE || store.level(ep) != lvl =>
            {
                return Err(Error::corrupted(format!(
                    "bad entry point {ep} at level {lvl}"
                )))
            }
            _ => {}
        }
        let mut store = store;
        if let Some(rq) = quantizer {
            store.enable_codes(rq)?;
        }
        let mut idx = Hnsw::with_store(hdr.dim, hdr.metric, params, store)?;
        idx.core.restore(ids, alloc, pending, hdr.durable_seq);
        idx.entry.store(hdr.entry, Ordering::Release);
        idx.level_counter
            .store(hdr.level_counter, Ordering::Relaxed);
        Ok(idx)
    }
}

struct Header {
    metric: Metric,
    quant_tag: u8,
    dim: usize,
    m: usize,
    ef_construction: usize,
    ef_search: usize,
    seed: u64,
    slots: usize,
    repair_alpha: f32,
    entry: u64,
    durable_seq: u64,
    level_counter: u64,
    live: u64,
    consolidate_fraction: f64,
}

fn read_header(r: &mut ByteReader<'_>) -> Result<Header> {
    r.bytes(8)?; // magic, checked
    r.u32()?; // version, checked
    let metric = Metric::from_tag(r.u8()?)?;
    let quant_tag = r.u8()?;
    r.bytes(2)?;
    let dim = r.u32()? as usize;
    if dim == 0 || dim > 65_536 {
        return Err(Error::corrupted(format!("dimension {dim} out of range")));
    }
    let m = r.u32()? as usize;
    let ef_construction = r.u32()? as usize;
    let ef_search = r.u32()? as usize;
    let seed = r.u64()?;
    let slots = r.u32()? as usize;
    let repair_alpha = f32::from_le_bytes(r.bytes(4)?.try_into().expect("4 bytes"));
    let entry = r.u64()?;
    let durable_seq = r.u64()?;
    let level_counter = r.u64()?;
    let live = r.u64()?;
    let consolidate_fraction = f64::from_le_bytes(r.bytes(8)?.try_into().expect("8 bytes"));
    Ok(Header {
        metric,
        quant_tag,
        dim,
        m,
        ef_construction,
        ef_search,
        seed,
        slots,
        repair_alpha,
        entry,
        durable_seq,
        level_counter,
        live,
        consolidate_fraction,
    })
}

/// Reads an index file and describes it (checks everything a load checks).
pub fn inspect(path: &Path) -> Result<FileInfo> {
    let bytes = std::fs::read(path).map_err(|e| Error::io_at(path, e))?;
    let idx = Hnsw::from_bytes(&bytes, Some(1))?;
    let stats = idx.stats()?;
    let entry = unpack_entry(idx.entry.load(Ordering::Acquire));
    let slots = idx.core.alloc.lock().next as usize;
    let crc_at = bytes.len() - END_MAGIC.len() - 4;
    Ok(FileInfo {
        format_version: if idx.params.quantization == Quantization::None {
            FORMAT_VERSION
        } else {
            FORMAT_VERSION_QUANTIZED
        },
        metric: idx.metric(),
        quantization: idx.params.quantization,
        dim: idx.dim(),
        m: idx.params.m,
        ef_construction: idx.params.ef_construction,
        ef_search: idx.params.ef_search,
        slots,
        live: stats.live,
        deleted_pending: stats.pending_deletes,
        free: slots - stats.slots_used,
        entry_slot: entry.map(|(s, _)| s),
        max_level: entry.map_or(0, |(_, l)| l),
        durable_seq: idx.durable_seq(),
        file_bytes: bytes.len() as u64,
        checksum: u32::from_le_bytes(bytes[crc_at..crc_at + 4].try_into().expect("4 bytes")),
    })
}
