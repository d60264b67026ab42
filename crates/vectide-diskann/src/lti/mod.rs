//! The long-term index: writing one from a graph, opening it, and DiskANN's
//! beam search over it (FreshDiskANN §5.1, DiskANN §3.3).
//!
//! **Search.** The candidate list holds the `L` best nodes seen, ranked by
//! PQ distance (codes in RAM). Each hop takes the `W` best unexpanded
//! candidates and reads their sectors in **one batch** (io_uring under
//! [`DirectFile`](vectide_storage::block::DirectFile)), except those in the
//! RAM cache. An expanded node's full-precision vector (it came with the
//! sector) gets its exact distance, and its neighbours enter the list by PQ
//! distance. The other records of a sector read (its **sector mates**:
//! [`write`] lays a node out beside its nearest neighbours, see
//! [`sector_order`]) get exact distances too, and a mate that would enter
//! the list is expanded at once, saving the read its expansion would cost
//! later. The search stops when the `L` best are all expanded; the
//! results are the expanded nodes re-ranked by exact distance, the start
//! node and the nodes `admit` refuses (deleted, filtered out) left out.
//!
//! **Cache.** [`Lti::cache_near_start`] keeps the sectors of the nodes
//! nearest the start (breadth-first, by hops) within a RAM budget, as
//! DiskANN's `num_nodes_to_cache`: the first hops of every query then read
//!
//! The room's files: this one holds the open LTI (its header, PQ codes, the
//! sequential scans); `writer.rs` writes one (and edits a record in
//! place), `cache.rs` holds the RAM caches of sectors, `search.rs` the beam
//! search.

mod cache;
mod search;
mod writer;

pub use cache::{Lockstep, Scratch, SectorCache};
pub use writer::{edit_record, sector_order, write, GraphSource, NodeWriter, Written};

use crate::layout::{check_sector, Header, Node, PqFile, PAYLOAD};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use vectide_core::metric::DistanceFn;
use vectide_core::{Error, Result};
use vectide_quant::ProductQuantizer;
use vectide_storage::block::{AlignedBuf, BlockFile, ReadReq, BLOCK};

/// Per-query work, summed into the engine's stats.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct QueryStats {
    /// Sectors read from the file.
    pub sectors_read: u64,
    /// Read batches (hops that read anything).
    pub hops: u64,
    /// Nodes expanded.
    pub expanded: u64,
    /// Expanded nodes found in the cache.
    pub cache_hits: u64,
    /// PQ distances computed.
    pub pq_distances: u64,
    /// Exact distances computed.
    pub exact_distances: u64,
}

impl std::ops::AddAssign for QueryStats {
    fn add_assign(&mut self, o: Self) {
        self.sectors_read += o.sectors_read;
        self.hops += o.hops;
        self.expanded += o.expanded;
        self.cache_hits += o.cache_hits;
        self.pq_distances += o.pq_distances;
        self.exact_distances += o.exact_distances;
    }
}

/// Sectors a [`NodeWriter`] gathers before one write, and the run length
/// of [`Lti::scan`]'s sequential reads.
pub const RUN: usize = 256;

/// Runs [`Lti::scan_runs`] reads ahead of the one it hands out.
pub const SCAN_AHEAD: usize = 2;

/// A run of whole sectors [`Lti::scan_runs`] read and checked: the records
/// of nodes `first .. first + len`.
pub struct Run<'b> {
    first: u64,
    len: usize,
    /// The run's first sector.
    sector: u64,
    bytes: &'b [u8],
}

impl<'b> Run<'b> {
    /// Records in the run.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The number of the run's `k`-th node.
    pub fn id(&self, k: usize) -> u32 {
        (self.first + k as u64) as u32
    }

    /// The `k`-th record's bytes (assembled in `joined` when a record
    /// spans sectors).
    pub fn record<'s>(&'s self, h: &Header, k: usize, joined: &'s mut Vec<u8>) -> &'s [u8] {
        let id = self.first + k as u64;
        let at = (h.locate(id).0 - self.sector) as usize * BLOCK;
        record_in(h, &self.bytes[at..], id as u32, joined)
    }

    /// The `k`-th record, parsed.
    pub fn node<'s>(&'s self, h: &Header, k: usize, joined: &'s mut Vec<u8>) -> Result<Node<'s>> {
        Node::parse(self.record(h, k, joined), h)
    }
}

/// Node `id`'s record out of `buf`, the sector(s) it starts in; a record
/// spanning sectors is assembled in `joined`.
fn record_in<'b>(h: &Header, buf: &'b [u8], id: u32, joined: &'b mut Vec<u8>) -> &'b [u8] {
    let nb = h.node_bytes();
    let (_, off) = h.locate(id as u64);
    if h.sectors_per_node() == 1 {
        return &buf[off..off + nb];
    }
    joined.clear();
    let mut left = nb;
    for s in 0..h.sectors_per_node() {
        let take = left.min(PAYLOAD);
        joined.extend_from_slice(&buf[s * BLOCK..s * BLOCK + take]);
        left -= take;
    }
    joined
}

/// An open LTI: the file, its header, PQ codes in RAM and the node cache.
pub struct Lti {
    file: Box<dyn BlockFile>,
    header: Header,
    pq: ProductQuantizer,
    /// Shared with the intermediate index of a StreamingMerge, and handed
    /// back (patched in place) at its switch.
    codes: Arc<Vec<u8>>,
    dist: DistanceFn,
    /// First sector → the sectors a record starts in (CRC-checked).
    cache: HashMap<u64, Box<[u8]>>,
}

impl Lti {
    /// Opens an LTI file and its PQ file; checks the header, the PQ file
    /// (envelope, CRC) and that both describe the same nodes.
    pub fn open(file: Box<dyn BlockFile>, pq_path: &Path) -> Result<Self> {
        let header = Self::read_header(&*file)?;
        let (pq, codes) = PqFile::read(pq_path)?;
        Self::from_parts(file, header, pq, Arc::new(codes))
    }

    /// An LTI over a file whose header was read already, with PQ codes
    /// from elsewhere (a StreamingMerge's intermediate index shares the
    /// live index's codes). Checks that both describe the same nodes.
    pub fn from_parts(
        file: Box<dyn BlockFile>,
        header: Header,
        pq: ProductQuantizer,
        codes: Arc<Vec<u8>>,
    ) -> Result<Self> {
        if pq.dim() != header.dim as usize
            || pq.m() != header.pq_bytes as usize
            || codes.len() as u64 != header.nodes * pq.m() as u64
        {
            return Err(Error::corrupted(
                "LTI and PQ file disagree (dim, code size or node count)",
            ));
        }
        let dist = header.metric.distance_fn();
        Ok(Lti {
            file,
            header,
            pq,
            codes,
            dist,
            cache: HashMap::new(),
        })
    }

    pub fn header(&self) -> &Header {
        &self.header
    }

    /// Reads the header of an LTI file.
    pub fn read_header(file: &dyn BlockFile) -> Result<Header> {
        if file.len_blocks() == 0 {
            return Err(Error::corrupted("LTI file is empty"));
        }
        let mut s0 = AlignedBuf::new(1);
        file.read(0, &mut s0)?;
        Header::decode(&s0, file.len_blocks())
    }

    /// The PQ codes, `nodes × pq_bytes`.
    pub fn codes(&self) -> &Arc<Vec<u8>> {
        &self.codes
    }

    /// Gives up the index, returning its codes (for a merge's switch).
    pub fn into_codes(self) -> Arc<Vec<u8>> {
        self.codes
    }

    /// Reads every node record in order, in runs of [`RUN`] sectors (one
    /// read each), checking every sector, and hands `f` each node's number
    /// and record ([`Lti::scan_runs`] underneath).
    pub fn scan(&self, mut f: impl FnMut(u32, Node<'_>) -> Result<()>) -> Result<()> {
        let h = self.header;
        let mut joined = Vec::new();
        self.scan_runs(|run| {
            for k in 0..run.len() {
                f(run.id(k), run.node(&h, k, &mut joined)?)?;
            }
            Ok(())
        })
    }

    /// Reads the whole file in order, in runs of [`RUN`] sectors (one read
    /// each, whole records), and hands `f` each run once all its sectors
    /// are checked: a damaged sector stops the scan before any record of
    /// its run. A thread of its own reads up to [`SCAN_AHEAD`] runs ahead
    /// of `f`.
    pub fn scan_runs(&self, mut f: impl FnMut(&Run<'_>) -> Result<()>) -> Result<()> {
        let h = self.header;
        let data = h.data_sectors();
        let spn = h.sectors_per_node();
        let nps = h.nodes_per_sector();
        std::thread::scope(|s| {
            let (full_tx, full_rx) = std::sync::mpsc::sync_channel(SCAN_AHEAD);
            let (free_tx, free_rx) = std::sync::mpsc::channel::<AlignedBuf>();
            let file = &*self.file;
            s.spawn(move || {
                let (mut sector, mut node, mut bufs) = (1u64, 0u64, 0usize);
                while sector < 1 + data {
                    let take = ((1 + data - sector) as usize).min(RUN);
                    // Whole records per run when a record spans sectors.
                    let take = if nps == 0 { take - take % spn } else { take };
                    if take == 0 {
                        return;
                    }
                    let len = if nps > 0 {
                        ((take * nps) as u64).min(h.nodes - node)
                    } else {
                        (take / spn) as u64
                    };
                    let mut buf = if bufs <= SCAN_AHEAD {
                        bufs += 1;
                        AlignedBuf::new(RUN)
                    } else {
                        match free_rx.recv() {
                            Ok(b) => b,
                            Err(_) => return, // the scan stopped
                        }
                    };
                    let r = file.read(sector, &mut buf[..take * BLOCK]).and_then(|()| {
                        (0..take).try_for_each(|k| check_sector(buf.block(k), sector + k as u64))
                    });
                    let failed = r.is_err();
                    let run = (sector, take, node, len as usize);
                    if full_tx.send(r.map(|()| (run, buf))).is_err() || failed {
                        return;
                    }
                    sector += take as u64;
                    node += len;
                }
            });
            for got in full_rx {
                let ((sector, take, first, len), buf) = got?;
                f(&Run {
                    first,
                    len,
                    sector,
                    bytes: &buf[..take * BLOCK],
                })?;
                let _ = free_tx.send(buf);
            }
            Ok(())
        })
    }

    /// Reads the records of `ids` (any order, one batch per 64) and hands
    /// `f` each.
    pub fn read_records(
        &self,
        ids: &[u32],
        scratch: &mut Scratch,
        mut f: impl FnMut(u32, Node<'_>) -> Result<()>,
    ) -> Result<QueryStats> {
        let mut stats = QueryStats::default();
        let mut joined = Vec::new();
        let mut firsts = Vec::with_capacity(64);
        for chunk in ids.chunks(64) {
            if let Some(&bad) = chunk.iter().find(|&&i| i as u64 >= self.header.nodes) {
                return Err(Error::invalid(format!("LTI has no node {bad}")));
            }
            firsts.clear();
            firsts.extend(chunk.iter().map(|&id| self.header.locate(id as u64).0));
            self.read_sectors(&firsts, &mut scratch.bufs)?;
            stats.sectors_read += (firsts.len() * self.header.sectors_per_node()) as u64;
            stats.hops += 1;
            for (&id, buf) in chunk.iter().zip(&scratch.bufs) {
                f(
                    id,
                    Node::parse(record_in(&self.header, buf, id, &mut joined), &self.header)?,
                )?;
            }
        }
        Ok(stats)
    }

    pub fn pq(&self) -> &ProductQuantizer {
        &self.pq
    }

    pub fn file(&self) -> &dyn BlockFile {
        &*self.file
    }

    /// RAM held: PQ codes and pivots, and the cache.
    pub fn memory_bytes(&self) -> usize {
        self.codes.len()
            + 4 * (self.pq.codebooks().len() + self.pq.mean().len())
            + self.cache.values().map(|b| b.len() + 16).sum::<usize>()
    }

    /// Nodes whose records are in the cache.
    pub fn cached(&self) -> usize {
        let nps = self.header.nodes_per_sector() as u64;
        if nps == 0 {
            return self.cache.len();
        }
        self.cache
            .keys()
            .map(|&first| (self.header.nodes - (first - 1) * nps).min(nps) as usize)
            .sum()
    }

    /// The PQ code of node `i`.
    pub fn code(&self, i: u32) -> &[u8] {
        let m = self.header.pq_bytes as usize;
        &self.codes[i as usize * m..(i as usize + 1) * m]
    }

    /// Reads the records starting at sectors `firsts` (`sectors_per_node`
    /// sectors each) into `scratch.bufs[i]`, one batch for all, and checks
    /// every sector's CRC.
    /// Reads the records starting at `firsts` into `bufs` (one each, in
    /// order) in one batch and checks their sectors.
    fn read_sectors(&self, firsts: &[u64], bufs: &mut Vec<AlignedBuf>) -> Result<()> {
        let spn = self.header.sectors_per_node();
        // Buffers used on an index with smaller records are replaced.
        bufs.retain(|b| b.blocks() >= spn);
        while bufs.len() < firsts.len() {
            bufs.push(AlignedBuf::new(spn));
        }
        let mut reqs: Vec<ReadReq<'_>> = firsts
            .iter()
            .zip(bufs.iter_mut())
            .map(|(&block, buf)| ReadReq {
                block,
                buf: &mut buf[..spn * BLOCK],
            })
            .collect();
        self.file.read_batch(&mut reqs)?;
        drop(reqs);
        for (buf, &first) in bufs.iter().zip(firsts) {
            for s in 0..spn {
                check_sector(buf.block(s), first + s as u64)?;
            }
        }
        Ok(())
    }
}
