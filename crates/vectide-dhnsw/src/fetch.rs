//! What crosses the network: partitions fetched whole in doorbell chains
//! (or one round trip each), writes posted in chains, and the naive
//! baseline's graph whose every node is fetched by a READ of its own the
//! first time a search touches it.

use crate::layout::{BlobHeader, Entry, BLOB_HEADER, DELETED};
use crate::state::{DHnsw, Layout};
use crate::subgraph::SubGraph;
use parking_lot::Mutex;
use std::sync::atomic::AtomicU32;
use std::sync::OnceLock;
use vectide_core::io::ByteReader;
use vectide_core::{Error, Result};
use vectide_graph::Graph;
use vectide_remote::{Region, RemoteMemory, Verb};

/// Largest WRITE in one work request, and bytes per doorbell of writes
/// (the memory node takes frames of up to 64 MiB).
const WRITE_PIECE: usize = 8 << 20;
const CHAIN_BYTES: usize = 32 << 20;
/// Work requests per doorbell (the node's limit is 4,096).
const CHAIN_WRS: usize = 1024;
/// Bytes one chain of READs may bring back (a reply frame holds 256 MiB).
const CHAIN_READ_BYTES: u64 = 128 << 20;

/// Posts `writes` (offset, bytes) in as few doorbell chains as the node's
/// limits allow, in order, then FLUSHes what they wrote (durable on a
/// memory node with a backing file when this returns).
pub fn post_writes(
    mem: &dyn RemoteMemory,
    region: Region,
    writes: Vec<(u64, Vec<u8>)>,
) -> Result<()> {
    post_phases(mem, region, vec![writes])
}

/// Posts phases of writes: each phase's WRITEs, then FLUSHes of the ranges
/// they wrote, so that on a memory node with a backing file no byte of a
/// phase becomes durable... before every byte of the phases before it is
/// (a chain runs in order and a FLUSH completes once its range is
/// durable). As few doorbell chains as the node's limits allow.
pub fn post_phases(
    mem: &dyn RemoteMemory,
    region: Region,
    phases: Vec<Vec<(u64, Vec<u8>)>>,
) -> Result<()> {
    let mut chain: Vec<Verb> = Vec::new();
    let mut bytes = 0usize;
    let send = |chain: &mut Vec<Verb>| -> Result<()> {
        if chain.is_empty() {
            return Ok(());
        }
        for c in mem.post(chain)? {
            c.into_done()?;
        }
        chain.clear();
        Ok(())
    };
    for writes in phases {
        let mut ranges: Vec<(u64, u64)> = Vec::with_capacity(writes.len());
        for (off, b) in writes {
            ranges.push((off, off + b.len() as u64));
            for (i, piece) in b.chunks(WRITE_PIECE).enumerate() {
                if chain.len() == CHAIN_WRS || bytes + piece.len() > CHAIN_BYTES {
                    send(&mut chain)?;
                    bytes = 0;
                }
                bytes += piece.len();
                chain.push(Verb::Write {
                    region: region.id,
                    offset: off + (i * WRITE_PIECE) as u64,
                    bytes: piece.to_vec(),
                });
            }
        }
        // Neighbouring ranges flushed as one.
        ranges.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
        for (lo, hi) in ranges {
            match merged.last_mut() {
                Some(last) if lo <= last.1 => last.1 = last.1.max(hi),
                _ => merged.push((lo, hi)),
            }
        }
        for (lo, hi) in merged {
            if chain.len() == CHAIN_WRS {
                send(&mut chain)?;
                bytes = 0;
            }
            chain.push(Verb::Flush {
                region: region.id,
                offset: lo,
                len: hi - lo,
            });
        }
    }
    send(&mut chain)
}

pub fn read_range(mem: &dyn RemoteMemory, region: Region, lo: u64, hi: u64) -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity((hi - lo) as usize);
    let mut at = lo;
    while at < hi {
        let n = (hi - at).min(WRITE_PIECE as u64);
        out.extend_from_slice(&mem.read(region, at, n as u32)?);
        at += n;
    }
    Ok(out)
}

impl DHnsw {
    /// Fetches partitions `parts` (one READ each), `chain` READs per
    /// doorbell, handing each chain's graphs to `got` as they arrive.
    pub(crate) fn fetch_chains(
        &self,
        lay: &Layout,
        parts: &[u32],
        chain: usize,
        mut got: impl FnMut(Vec<(u32, Vec<u8>)>) -> Result<()>,
    ) -> Result<()> {
        let rec = lay.record();
        let range = |p: u32| {
            lay.table[p as usize]
                .range(rec)
                .expect("ranges are checked when the table is read")
        };
        // Chains of at most `chain` READs whose replies fit a frame.
        let mut chunks: Vec<&[u32]> = Vec::new();
        let mut start = 0;
        let mut bytes = 0u64;
        for (i, &p) in parts.iter().enumerate() {
            let (lo, hi) = range(p);
            if i > start && (i - start == chain.max(1) || bytes + (hi - lo) > CHAIN_READ_BYTES) {
                chunks.push(&parts[start..i]);
                (start, bytes) = (i, 0);
            }
            bytes += hi - lo;
        }
        if start < parts.len() {
            chunks.push(&parts[start..]);
        }
        for c in chunks {
            if let [p] = c {
                let (lo, hi) = range(*p);
                if hi - lo > CHAIN_READ_BYTES {
                    // Larger than a reply frame holds: READs of pieces.
                    got(vec![(*p, read_range(&*self.mem, lay.region, lo, hi)?)])?;
                    continue;
                }
            }
            let wrs: Vec<Verb> = c
                .iter()
                .map(|&p| {
                    let (lo, hi) = range(p);
                    Verb::Read {
                        region: lay.region.id,
                        offset: lo,
                        len: (hi - lo) as u32,
                    }
                })
                .collect();
            let mut out = Vec::with_capacity(c.len());
            for (&p, comp) in c.iter().zip(self.mem.post(&wrs)?) {
                out.push((p, comp.into_data()?));
            }
            got(out)?;
        }
        Ok(())
    }

    /// Deserialises a fetched partition.
    pub(crate) fn decode_part(&self, lay: &Layout, p: u32, bytes: &[u8]) -> Result<SubGraph> {
        let e = &lay.table[p as usize];
        let h = &lay.header;
        SubGraph::decode(
            bytes,
            e.count as usize,
            e.backward,
            self.dim,
            h.m as usize,
            h.m0 as usize,
            p,
        )
    }

    /// A partition's graph: the LRU's, else one READ (cached after).
    pub(crate) fn part(&self, lay: &Layout, p: u32) -> Result<std::sync::Arc<SubGraph>> {
        if let Some(g) = self.cache.lock().get(p) {
            return Ok(g);
        }
        let mut g = None;
        self.fetch_chains(lay, &[p], 1, |mut v| {
            let (_, b) = v.pop().expect("one read");
            g = Some(self.decode_part(lay, p, &b)?);
            Ok(())
        })?;
        let g = std::sync::Arc::new(g.expect("fetched"));
        self.cache.lock().put(p, std::sync::Arc::clone(&g));
        Ok(g)
    }
}

/// A node as the naive baseline fetched it.
struct Node {
    deleted: bool,
    label: u64,
    list0: Box<[AtomicU32]>,
    vector: Box<[f32]>,
}

/// A partition read node by node: the blob's header and upper layers by
/// one READ when opened, each node's record by one READ the first time
/// the search touches it (the paper's naive baseline: no partition is
/// shipped whole). Implements [`Graph`], so it is searched by the same
/// traversal as a fetched sub-HNSW.
pub struct RemoteGraph<'a> {
    mem: &'a dyn RemoteMemory,
    region: Region,
    entry_row: Entry,
    record: u64,
    dim: usize,
    m: usize,
    m0: usize,
    pub entry: Option<(u32, usize)>,
    upper: Vec<Box<[AtomicU32]>>,
    nodes: Vec<OnceLock<Node>>,
    failed: Mutex<Option<Error>>,
    empty_list: Box<[AtomicU32]>,
    zeros: Box<[f32]>,
}

impl<'a> RemoteGraph<'a> {
    /// Opens partition `p`: two READs (the blob's header, then its upper
    /// layers when it has any).
    pub fn open(mem: &'a dyn RemoteMemory, lay: &Layout, p: u32) -> Result<RemoteGraph<'a>> {
        let e = lay.table[p as usize];
        let hd = &lay.header;
        let head = mem.read(lay.region, e.blob_off, BLOB_HEADER as u32)?;
        let h = BlobHeader::decode(&mut ByteReader::new(&head), hd.dim, hd.m, hd.m0)?;
        let n = h.n as usize + e.count as usize;
        let (dim, m, m0) = (hd.dim as usize, hd.m as usize, hd.m0 as usize);
        let mut upper: Vec<Box<[AtomicU32]>> = (0..n).map(|_| Box::default()).collect();
        let up_len = h.records_at() - BLOB_HEADER;
        if h.up_nodes > 0 {
            let b = mem.read(lay.region, e.blob_off + BLOB_HEADER as u64, up_len as u32)?;
            crate::subgraph::decode_upper(&mut ByteReader::new(&b), &h, m, &mut upper)?;
        }
        let entry = if h.entry != crate::layout::NO_NODE {
            Some((h.entry, h.top as usize))
        } else {
            (n > 0).then_some((0, 0))
        };
        Ok(RemoteGraph {
            mem,
            region: lay.region,
            entry_row: e,
            record: lay.record(),
            dim,
            m,
            m0,
            entry,
            upper,
            nodes: (0..n).map(|_| OnceLock::new()).collect(),
            failed: Mutex::new(None),
            empty_list: (0..1 + m0).map(|_| AtomicU32::new(0)).collect(),
            zeros: vec![0.0; dim].into_boxed_slice(),
        })
    }

    fn fetch(&self, id: u32) -> Result<Node> {
        let at = self.entry_row.node_at(u64::from(id), self.record);
        let b = self.mem.read(self.region, at, self.record as u32)?;
        let mut r = ByteReader::new(&b);
        let label = r.u64()?;
        let flags = r.u32()?;
        let count = r.u32()?;
        let mut list = Vec::new();
        r.u32s(self.m0, &mut list)?;
        let mut vector = Vec::new();
        r.f32s(self.dim, &mut vector)?;
        let n = self.nodes.len() as u32;
        let c = (count as usize).min(self.m0);
        let mut l0 = vec![AtomicU32::new(c as u32)];
        l0.extend(
            list.iter()
                .map(|&x| AtomicU32::new(if x < n { x } else { 0 })),
        );
        Ok(Node {
            deleted: flags & DELETED != 0,
            label,
            list0: l0.into_boxed_slice(),
            vector: vector.into_boxed_slice(),
        })
    }

    fn node(&self, id: u32) -> Option<&Node> {
        let cell = self.nodes.get(id as usize)?;
        if let Some(n) = cell.get() {
            return Some(n);
        }
        match self.fetch(id) {
            Ok(n) => Some(cell.get_or_init(|| n)),
            Err(e) => {
                self.failed.lock().get_or_insert(e);
                None
            }
        }
    }

    /// The first READ that failed during a search, if one did.
    pub fn take_error(&self) -> Option<Error> {
        self.failed.lock().take()
    }

    pub fn label(&self, id: u32) -> u64 {
        self.node(id).map_or(u64::MAX, |n| n.label)
    }

    pub fn is_deleted(&self, id: u32) -> bool {
        self.node(id).is_none_or(|n| n.deleted)
    }
}

impl Graph for RemoteGraph<'_> {
    fn slots(&self) -> usize {
        self.nodes.len()
    }
    fn vector(&self, slot: u32) -> &[f32] {
        self.node(slot).map_or(&self.zeros, |n| &n.vector)
    }
    fn vector_ptr(&self, slot: u32) -> *const f32 {
        // Never fetches: a prefetch hint of a node not here yet is skipped.
        self.nodes
            .get(slot as usize)
            .and_then(OnceLock::get)
            .map_or(std::ptr::null(), |n| n.vector.as_ptr())
    }
    fn prefetch_vector(&self, _slot: u32) {}
    fn list0_ptr(&self, slot: u32) -> *const u8 {
        self.nodes
            .get(slot as usize)
            .and_then(OnceLock::get)
            .map_or(std::ptr::null(), |n| n.list0.as_ptr() as *const u8)
    }
    fn list(&self, slot: u32, level: usize) -> &[AtomicU32] {
        if level == 0 {
            return self.node(slot).map_or(&self.empty_list, |n| &n.list0);
        }
        let w = 1 + self.m;
        self.upper[slot as usize]
            .get((level - 1) * w..level * w)
            .unwrap_or(&[])
    }
    fn cap(&self, level: usize) -> usize {
        if level == 0 {
            self.m0
        } else {
            self.m
        }
    }
}
