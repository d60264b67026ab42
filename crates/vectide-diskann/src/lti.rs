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
//! nothing.

use crate::layout::{check_sector, encode_node, seal, Header, Node, PqFile, NO_LABEL, PAYLOAD};
use rayon::prelude::*;
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use vectide_core::metric::DistanceFn;
use vectide_core::{Error, Metric, Result, SparseVisited};
use vectide_quant::{DistanceTable, PqParams, ProductQuantizer};
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

/// What a graph to write looks like: `n` nodes with vectors, labels and
/// out-lists, and a start node.
pub struct GraphSource<'a> {
    pub dim: usize,
    pub metric: Metric,
    pub max_degree: usize,
    pub vectors: &'a [f32],
    pub labels: &'a [u64],
    pub lists: &'a [Vec<u32>],
    pub start: u32,
    pub durable_seq: u64,
}

impl<'a> GraphSource<'a> {
    /// The graph of a `fresh-vamana` export as it is (its start node, its
    /// durable sequence number; node 0 stands in for the start of an empty
    /// export, which [`write`] refuses anyway).
    pub fn from_export(g: &'a vectide_vamana::GraphExport) -> Self {
        GraphSource {
            dim: g.dim,
            metric: g.metric,
            max_degree: g.max_degree,
            vectors: &g.vectors,
            labels: &g.labels,
            lists: &g.lists,
            start: g.start.unwrap_or(0),
            durable_seq: g.durable_seq,
        }
    }
}

/// What [`write`] wrote: the header, and the node number each source
/// index received (records are laid out by [`sector_order`]).
#[derive(Debug, Clone)]
pub struct Written {
    pub header: Header,
    pub node_of: Vec<u32>,
}

/// Writes `g` as an LTI into `file` (which must be empty) and its PQ file
/// at `pq_path` (`pq_bytes` per code, trained on the vectors with `seed`).
/// Records are laid out by [`sector_order`] (a node shares its sector with
/// its nearest neighbours); the LTI is written in runs of 256 sectors, then
/// synced.
pub fn write(
    file: &dyn BlockFile,
    pq_path: &Path,
    g: &GraphSource<'_>,
    pq_bytes: usize,
    seed: u64,
) -> Result<Written> {
    let n = g.labels.len();
    if g.vectors.len() != n * g.dim || g.lists.len() != n || (n > 0 && g.start as usize >= n) {
        return Err(Error::invalid(
            "LTI write: vectors, labels and lists disagree",
        ));
    }
    if g.lists
        .iter()
        .any(|l| l.len() > g.max_degree || l.iter().any(|&x| x as usize >= n))
    {
        return Err(Error::invalid(
            "LTI write: a list is over the degree bound or names a missing node",
        ));
    }
    if n < vectide_quant::KSUB || n > u32::MAX as usize {
        return Err(Error::invalid(format!(
            "LTI write: {n} nodes; an LTI holds 256 (one per PQ centroid) to 2^32 - 1 nodes"
        )));
    }
    if g.dim == 0
        || g.dim > crate::layout::MAX_DIM as usize
        || g.max_degree == 0
        || g.max_degree > crate::layout::MAX_DEGREE as usize
    {
        return Err(Error::invalid(format!(
            "LTI write: dim {} and max degree {} must be in 1..={} and 1..={}",
            g.dim,
            g.max_degree,
            crate::layout::MAX_DIM,
            crate::layout::MAX_DEGREE
        )));
    }
    let h = Header {
        metric: g.metric,
        dim: g.dim as u32,
        max_degree: g.max_degree as u32,
        nodes: n as u64,
        start: g.start as u64,
        durable_seq: g.durable_seq,
        pq_bytes: pq_bytes as u32,
    };
    let mut p = PqParams::new(pq_bytes);
    p.seed = seed;
    let pq = ProductQuantizer::train(g.vectors, g.dim, &p)?;
    let src_codes = pq.encode_all(g.vectors)?;
    let order = sector_order(g.lists, g.start, h.nodes_per_sector());
    let mut node_of = vec![0u32; n];
    for (node, &src) in order.iter().enumerate() {
        node_of[src as usize] = node as u32;
    }
    let m = pq.m();
    let mut codes = vec![0u8; n * m];
    let mut w = NodeWriter::new(file, h)?;
    let mut list = Vec::with_capacity(g.max_degree);
    for (node, &src) in order.iter().enumerate() {
        let src = src as usize;
        list.clear();
        list.extend(g.lists[src].iter().map(|&x| node_of[x as usize]));
        w.push(
            &g.vectors[src * g.dim..(src + 1) * g.dim],
            g.labels[src],
            &list,
        )?;
        codes[node * m..(node + 1) * m].copy_from_slice(&src_codes[src * m..(src + 1) * m]);
    }
    let header = w.finish(node_of[g.start as usize] as u64, h.durable_seq)?;
    PqFile::write(pq_path, &pq, &codes)?;
    Ok(Written { header, node_of })
}

/// The order records are written in: `order[node] = source index`. Each
/// sector of `nps` records is filled from a seed and then breadth-first
/// from its members' out-lists (nearest first, as pruning leaves them), so a
/// node shares its sector with its nearest neighbours and the search,
/// which reads whole sectors, gets them without another read (Starling,
/// SIGMOD 2024, lays blocks out for the same reason). Seeds are taken in
/// breadth-first order from `start`, then any node not reached. With
/// `nps ≤ 1` (a record per sector or larger) the order is the identity.
/// O(n·R) time, O(n) memory.
pub fn sector_order(lists: &[Vec<u32>], start: u32, nps: usize) -> Vec<u32> {
    let n = lists.len();
    if nps <= 1 || n == 0 {
        return (0..n as u32).collect();
    }
    let mut placed = vec![false; n];
    let mut queued = vec![false; n];
    let mut queue = std::collections::VecDeque::new();
    let mut next_id = 0usize;
    let mut order = Vec::with_capacity(n);
    let mut sector: Vec<u32> = Vec::with_capacity(nps);
    let s = (start as usize).min(n - 1);
    queued[s] = true;
    queue.push_back(s as u32);
    // The next unplaced node in breadth-first order (then by id).
    let mut next_seed = |placed: &[bool]| -> Option<u32> {
        loop {
            let u = match queue.pop_front() {
                Some(u) => u,
                None => {
                    while next_id < n && queued[next_id] {
                        next_id += 1;
                    }
                    if next_id == n {
                        return None;
                    }
                    queued[next_id] = true;
                    next_id as u32
                }
            };
            for &v in &lists[u as usize] {
                if (v as usize) < n && !queued[v as usize] {
                    queued[v as usize] = true;
                    queue.push_back(v);
                }
            }
            if !placed[u as usize] {
                return Some(u);
            }
        }
    };
    while order.len() < n {
        sector.clear();
        while sector.len() < nps {
            let Some(seed) = next_seed(&placed) else {
                break;
            };
            placed[seed as usize] = true;
            sector.push(seed);
            let mut k = sector.len() - 1;
            while sector.len() < nps && k < sector.len() {
                for &v in &lists[sector[k] as usize] {
                    if sector.len() == nps {
                        break;
                    }
                    if (v as usize) < n && !placed[v as usize] {
                        placed[v as usize] = true;
                        sector.push(v);
                    }
                }
                k += 1;
            }
        }
        if sector.is_empty() {
            break;
        }
        order.extend_from_slice(&sector);
    }
    order
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

/// Writes node records in node order into an empty block file, in runs of
/// [`RUN`] sectors, each sector sealed; [`NodeWriter::finish`] writes the
/// header (with the node count pushed) and syncs. The LTI writer and each
/// StreamingMerge phase write through it.
pub struct NodeWriter<'a> {
    file: &'a dyn BlockFile,
    h: Header,
    buf: AlignedBuf,
    /// Whole sectors in `buf`.
    filled: usize,
    /// Records in the sector being filled (records that share sectors).
    in_sector: usize,
    next_sector: u64,
    rec: Vec<u8>,
    zero: Vec<f32>,
    nodes: u64,
}

impl<'a> NodeWriter<'a> {
    /// A writer of records shaped by `shape` (its `dim`, `max_degree`,
    /// metric and `pq_bytes`; the node count is what gets pushed). The file
    /// is emptied first.
    pub fn new(file: &'a dyn BlockFile, shape: Header) -> Result<Self> {
        file.set_len_blocks(0)?;
        Ok(NodeWriter {
            file,
            h: shape,
            buf: AlignedBuf::new(RUN),
            filled: 0,
            in_sector: 0,
            next_sector: 1,
            rec: Vec::with_capacity(shape.node_bytes()),
            zero: vec![0.0; shape.dim as usize],
            nodes: 0,
        })
    }

    /// Records pushed so far.
    pub fn nodes(&self) -> u64 {
        self.nodes
    }

    fn flush(&mut self) -> Result<()> {
        if self.filled > 0 {
            for s in 0..self.filled {
                seal(self.buf.block_mut(s));
            }
            self.file
                .write(self.next_sector, &self.buf[..self.filled * BLOCK])?;
            self.next_sector += self.filled as u64;
            self.buf.fill(0);
            self.filled = 0;
        }
        Ok(())
    }

    /// Packed records: moves on to the next sector when the current one is
    /// full, writing the buffer out when it is full.
    fn open_slot(&mut self) -> Result<()> {
        if self.in_sector == self.h.nodes_per_sector() {
            self.filled += 1;
            self.in_sector = 0;
        }
        if self.filled == RUN {
            self.flush()?;
        }
        Ok(())
    }

    /// Appends the next node's record.
    pub fn push(&mut self, vector: &[f32], label: u64, list: &[u32]) -> Result<()> {
        self.rec.clear();
        encode_node(&mut self.rec, &self.h, vector, label, list)?;
        let nps = self.h.nodes_per_sector();
        if nps > 0 {
            self.open_slot()?;
            let at = self.filled * BLOCK + self.in_sector * self.h.node_bytes();
            self.buf[at..at + self.rec.len()].copy_from_slice(&self.rec);
            self.in_sector += 1;
        } else {
            let spn = self.h.sectors_per_node();
            if self.filled + spn > RUN {
                self.flush()?;
            }
            for (k, chunk) in self.rec.chunks(PAYLOAD).enumerate() {
                let at = (self.filled + k) * BLOCK;
                self.buf[at..at + chunk.len()].copy_from_slice(chunk);
            }
            self.filled += spn;
        }
        self.nodes += 1;
        Ok(())
    }

    /// Appends `n` records, encoded in parallel: `fill(k, slot)` writes
    /// the `k`-th into its slot (`node_bytes` zeroed bytes), as
    /// [`crate::layout::encode_node_into`] does. The records land where `n` calls of
    /// [`NodeWriter::push`] would put them.
    pub fn push_records(
        &mut self,
        n: usize,
        fill: impl Fn(usize, &mut [u8]) -> Result<()> + Sync,
    ) -> Result<()> {
        let nb = self.h.node_bytes();
        let nps = self.h.nodes_per_sector();
        let mut k = 0;
        while k < n {
            if nps > 0 {
                self.open_slot()?;
                // Slots from (filled, in_sector) to the buffer's end.
                let s0 = self.filled * nps + self.in_sector;
                let take = (RUN * nps - s0).min(n - k);
                let end = s0 + take;
                let region = &mut self.buf[self.filled * BLOCK..end.div_ceil(nps) * BLOCK];
                let first_sector = self.filled;
                region
                    .par_chunks_mut(BLOCK)
                    .enumerate()
                    .try_for_each(|(si, sector)| {
                        let base = (first_sector + si) * nps;
                        for slot in s0.max(base)..end.min(base + nps) {
                            let at = (slot - base) * nb;
                            fill(k + slot - s0, &mut sector[at..at + nb])?;
                        }
                        Ok::<(), Error>(())
                    })?;
                (self.filled, self.in_sector) = if end.is_multiple_of(nps) {
                    (end / nps - 1, nps)
                } else {
                    (end / nps, end % nps)
                };
                self.nodes += take as u64;
                k += take;
            } else {
                let spn = self.h.sectors_per_node();
                if self.filled + spn > RUN {
                    self.flush()?;
                }
                let take = ((RUN - self.filled) / spn).min(n - k);
                let region = &mut self.buf[self.filled * BLOCK..(self.filled + take * spn) * BLOCK];
                region
                    .par_chunks_mut(spn * BLOCK)
                    .enumerate()
                    .try_for_each_init(
                        || vec![0u8; nb],
                        |rec, (r, sectors)| {
                            rec.fill(0);
                            fill(k + r, rec)?;
                            for (s, chunk) in rec.chunks(PAYLOAD).enumerate() {
                                sectors[s * BLOCK..s * BLOCK + chunk.len()].copy_from_slice(chunk);
                            }
                            Ok::<(), Error>(())
                        },
                    )?;
                self.filled += take * spn;
                self.nodes += take as u64;
                k += take;
            }
        }
        Ok(())
    }

    /// Appends a free record: no point (label [`NO_LABEL`], a zero vector,
    /// no neighbours); never returned, never linked to.
    pub fn push_free(&mut self) -> Result<()> {
        let zero = std::mem::take(&mut self.zero);
        let r = self.push(&zero, NO_LABEL, &[]);
        self.zero = zero;
        r
    }

    /// Writes the last sectors and the header, then syncs. Returns the
    /// header as written.
    pub fn finish(mut self, start: u64, durable_seq: u64) -> Result<Header> {
        if self.in_sector > 0 {
            self.filled += 1;
            self.in_sector = 0;
        }
        self.flush()?;
        let h = Header {
            nodes: self.nodes,
            start,
            durable_seq,
            ..self.h
        };
        if h.nodes > 0 && h.start >= h.nodes {
            return Err(Error::invalid("LTI write: start node past the node count"));
        }
        self.file.write(0, &h.encode())?;
        self.file.sync()?;
        Ok(h)
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

/// One node record of a written LTI file, read back and rewritten in
/// place: StreamingMerge's last step gives an orphaned node an in-edge
/// this way. Reads and checks the record's sectors, hands `edit` the
/// node's vector and list, and, when the list changed, writes the sectors
/// back resealed (not synced). Returns what `edit` returned.
pub fn edit_record<T>(
    file: &dyn BlockFile,
    h: &Header,
    id: u32,
    edit: impl FnOnce(&[f32], &mut Vec<u32>) -> T,
) -> Result<T> {
    if id as u64 >= h.nodes {
        return Err(Error::invalid(format!("LTI has no node {id}")));
    }
    let spn = h.sectors_per_node();
    let nb = h.node_bytes();
    let (first, off) = h.locate(id as u64);
    let mut buf = AlignedBuf::new(spn);
    file.read(first, &mut buf)?;
    for s in 0..spn {
        check_sector(buf.block(s), first + s as u64)?;
    }
    let mut joined = Vec::new();
    let node = Node::parse(record_in(h, &buf, id, &mut joined), h)?;
    let mut vector = vec![0.0; h.dim as usize];
    node.vector_into(&mut vector)?;
    let label = node.label;
    let mut list: Vec<u32> = node.neighbor_ids().collect();
    let before = list.clone();
    let out = edit(&vector, &mut list);
    if list == before {
        return Ok(out);
    }
    if list.iter().any(|&x| x as u64 >= h.nodes) {
        return Err(Error::invalid(
            "LTI record edit: neighbour past the node count",
        ));
    }
    let mut rec = Vec::with_capacity(nb);
    encode_node(&mut rec, h, &vector, label, &list)?;
    if spn == 1 {
        buf[off..off + nb].copy_from_slice(&rec);
    } else {
        for (s, chunk) in rec.chunks(PAYLOAD).enumerate() {
            buf[s * BLOCK..s * BLOCK + chunk.len()].copy_from_slice(chunk);
        }
    }
    for s in 0..spn {
        seal(buf.block_mut(s));
    }
    file.write(first, &buf)?;
    Ok(out)
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

/// Records read once and shared by searches: first sector → the sectors
/// its record starts in (CRC-checked when read).
#[derive(Debug, Default)]
pub struct SectorCache(HashMap<u64, Box<[u8]>>);

impl SectorCache {
    /// Sectors held.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Bytes held (records and a key each).
    pub fn bytes(&self) -> usize {
        self.0.values().map(|b| b.len() + 16).sum()
    }

    fn get(&self, first: u64) -> Option<&[u8]> {
        self.0.get(&first).map(|b| &b[..])
    }
}

/// Per-thread search state, reused across queries.
#[derive(Default)]
pub struct Scratch {
    /// `(pq distance, node, expanded)`, sorted by distance, at most `L`.
    list: Vec<(f32, u32, bool)>,
    visited: SparseVisited,
    table: DistanceTable,
    /// Expanded nodes: `(exact distance, label)`.
    full: Vec<(f32, u64)>,
    /// With [`Lti::search_expanded`]: every expanded node that holds a
    /// point, `(exact distance, node)`, and their vectors back to back.
    pub expanded: Vec<(f32, u32)>,
    pub expanded_vectors: Vec<f32>,
    bufs: Vec<AlignedBuf>,
    vec: Vec<f32>,
    batch: Vec<u32>,
    /// Unvisited neighbours of an expanded node and their PQ distances.
    fresh: Vec<u32>,
    dists: Vec<f32>,
    /// Nodes expanded in this query.
    done: SparseVisited,
    /// Neighbours that can enter the list, and the merge buffer.
    entering: Vec<(f32, u32, bool)>,
    merged: Vec<(f32, u32, bool)>,
    /// First sectors of this hop's nodes, and those not cached.
    sectors: Vec<u64>,
    reads: Vec<u64>,
    /// Records this scratch's searches find besides the file (the recent
    /// ones are off unless [`Scratch::keep_recent`] turned them on).
    caches: ReadCaches,
}

impl Scratch {
    /// Keeps the last `sectors` records read (CLOCK eviction) and serves
    /// later searches on this scratch from them. StreamingMerge's Insert
    /// phase turns it on: a thread searches for new points in
    /// `sector_order`, so consecutive searches end in the same region and
    /// read the same sectors.
    pub fn keep_recent(&mut self, sectors: usize) {
        self.caches.keep_recent(sectors);
    }

    /// Serves this scratch's searches from `cache` too (records of the
    /// same LTI, as [`Lti::sectors_near_start`] reads them).
    pub fn share_cache(&mut self, cache: Arc<SectorCache>) {
        self.caches.shared = Some(cache);
    }

    /// Bytes the recent-records cache holds.
    pub fn recent_bytes(&self) -> usize {
        self.caches.recent.bytes()
    }
}

/// Where searches find records besides the file and the LTI's own cache:
/// a cache shared between searches and the records read lately.
#[derive(Default)]
struct ReadCaches {
    recent: Recent,
    shared: Option<Arc<SectorCache>>,
}

impl ReadCaches {
    fn keep_recent(&mut self, sectors: usize) {
        self.recent = Recent {
            cap: sectors,
            ..Recent::default()
        };
    }

    /// Whether the record starting at `first` is held (a recent one is
    /// marked referenced).
    fn hit(&mut self, first: u64) -> bool {
        self.shared
            .as_ref()
            .is_some_and(|c| c.0.contains_key(&first))
            || self.recent.touch(first)
    }

    fn get(&self, first: u64) -> Option<&[u8]> {
        self.shared
            .as_deref()
            .and_then(|c| c.get(first))
            .or_else(|| self.recent.get(first))
    }

    /// Keeps a hop's reads (`reads[i]` in `bufs[i]`) among the recent
    /// records, when they are on.
    fn keep(&mut self, reads: &[u64], bufs: &[AlignedBuf], bytes: usize) {
        if self.recent.cap > 0 {
            for (&first, buf) in reads.iter().zip(bufs) {
                self.recent.put(first, &buf[..bytes]);
            }
        }
    }
}

/// The records a hop expands: in the LTI's cache, in `caches`, or read
/// for the hop (`reads[i]` in `bufs[i]`).
struct HopSectors<'a> {
    cache: &'a HashMap<u64, Box<[u8]>>,
    caches: &'a ReadCaches,
    reads: &'a [u64],
    bufs: &'a [AlignedBuf],
}

impl HopSectors<'_> {
    fn get(&self, first: u64) -> &[u8] {
        if let Some(b) = self.cache.get(&first) {
            return b;
        }
        if let Some(b) = self.caches.get(first) {
            return b;
        }
        let i = self.reads.iter().position(|&s| s == first).unwrap_or(0);
        &self.bufs[i][..]
    }
}

/// Searches run in lock-step by [`Lti::search_expanded_lockstep`]: a slot
/// per search in flight, and the caches and read buffers they share.
pub struct Lockstep {
    slots: Vec<Slot>,
    caches: ReadCaches,
    bufs: Vec<AlignedBuf>,
    reads: Vec<u64>,
}

#[derive(Default)]
struct Slot {
    job: Option<usize>,
    scratch: Scratch,
    stats: QueryStats,
    planned: bool,
}

impl Lockstep {
    /// Room for `in_flight` searches at once (at least one).
    pub fn new(in_flight: usize) -> Self {
        Lockstep {
            slots: (0..in_flight.max(1)).map(|_| Slot::default()).collect(),
            caches: ReadCaches::default(),
            bufs: Vec::new(),
            reads: Vec::new(),
        }
    }

    /// Keeps the last `sectors` records read, as [`Scratch::keep_recent`],
    /// for all the searches run here.
    pub fn keep_recent(&mut self, sectors: usize) {
        self.caches.keep_recent(sectors);
    }

    /// Serves the searches from `cache` too, as [`Scratch::share_cache`].
    pub fn share_cache(&mut self, cache: Arc<SectorCache>) {
        self.caches.shared = Some(cache);
    }
}

/// A small per-scratch record cache: first sector → the record's sectors,
/// evicted by CLOCK (a hit sets a reference bit the hand clears once).
#[derive(Default)]
struct Recent {
    cap: usize,
    slot_of: HashMap<u64, usize>,
    keys: Vec<u64>,
    bufs: Vec<Box<[u8]>>,
    referenced: Vec<bool>,
    hand: usize,
}

impl Recent {
    fn bytes(&self) -> usize {
        self.bufs.iter().map(|b| b.len()).sum()
    }

    fn get(&self, first: u64) -> Option<&[u8]> {
        self.slot_of.get(&first).map(|&i| &self.bufs[i][..])
    }

    fn touch(&mut self, first: u64) -> bool {
        match self.slot_of.get(&first) {
            Some(&i) => {
                self.referenced[i] = true;
                true
            }
            None => false,
        }
    }

    fn put(&mut self, first: u64, bytes: &[u8]) {
        if self.cap == 0 || self.slot_of.contains_key(&first) {
            return;
        }
        let i = if self.bufs.len() < self.cap {
            self.bufs.push(bytes.into());
            self.keys.push(first);
            self.referenced.push(false);
            self.bufs.len() - 1
        } else {
            while self.referenced[self.hand] {
                self.referenced[self.hand] = false;
                self.hand = (self.hand + 1) % self.cap;
            }
            let i = self.hand;
            self.hand = (self.hand + 1) % self.cap;
            self.slot_of.remove(&self.keys[i]);
            if self.bufs[i].len() == bytes.len() {
                self.bufs[i].copy_from_slice(bytes);
            } else {
                self.bufs[i] = bytes.into();
            }
            self.keys[i] = first;
            i
        };
        self.slot_of.insert(first, i);
    }
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

    /// Caches the sectors of the nodes nearest the start (breadth-first,
    /// with the sector mates that share them) until `budget_bytes` is
    /// spent. Returns the nodes whose records are cached.
    pub fn cache_near_start(&mut self, budget_bytes: usize) -> Result<usize> {
        self.cache.clear();
        self.cache = self.sectors_near_start(budget_bytes)?.0;
        Ok(self.cached())
    }

    /// The sectors of the nodes nearest the start, breadth-first, until
    /// `budget_bytes` is spent: what [`Lti::cache_near_start`] keeps, as a
    /// cache of its own that searches can share through
    /// [`Scratch::share_cache`] (StreamingMerge's Insert phase). A level's
    /// reads are spread over the current rayon pool's threads.
    pub fn sectors_near_start(&self, budget_bytes: usize) -> Result<SectorCache> {
        let mut cache = HashMap::new();
        if self.header.nodes == 0 {
            return Ok(SectorCache(cache));
        }
        let h = self.header;
        let bytes = h.sectors_per_node() * BLOCK;
        let max = budget_bytes / (bytes + 16);
        let mut frontier = vec![h.start as u32];
        let mut seen = std::collections::HashSet::new();
        seen.insert(h.start as u32);
        let mut joined = Vec::new();
        while !frontier.is_empty() && cache.len() < max {
            let level = std::mem::take(&mut frontier);
            // The level's sectors not held yet, in breadth-first order,
            // within the budget; read in batches of 64, one batch per
            // thread of the pool at once.
            let mut wanted = std::collections::HashSet::new();
            let mut firsts: Vec<u64> = level
                .iter()
                .map(|&id| h.locate(id as u64).0)
                .filter(|f| !cache.contains_key(f) && wanted.insert(*f))
                .collect();
            firsts.truncate(max - cache.len());
            let read: Vec<Vec<(u64, Box<[u8]>)>> = firsts
                .par_chunks(64)
                .map_init(Vec::new, |bufs, chunk| {
                    self.read_sectors(chunk, bufs)?;
                    Ok(chunk
                        .iter()
                        .zip(bufs.iter())
                        .map(|(&first, buf)| (first, buf[..bytes].to_vec().into_boxed_slice()))
                        .collect())
                })
                .collect::<Result<_>>()?;
            cache.extend(read.into_iter().flatten());
            for &id in &level {
                let Some(buf) = cache.get(&h.locate(id as u64).0) else {
                    continue;
                };
                let node = Node::parse(record_in(&h, buf, id, &mut joined), &h)?;
                for nbr in node.neighbor_ids() {
                    if seen.insert(nbr) {
                        frontier.push(nbr);
                    }
                }
            }
        }
        Ok(SectorCache(cache))
    }

    /// Beam search: the `k` nearest admitted nodes to `q` (normalised under
    /// cosine) by exact distance, as `(distance, label)` into `out`.
    /// `admit(node, label)` decides which expanded nodes may be results.
    #[allow(clippy::too_many_arguments)]
    pub fn search(
        &self,
        q: &[f32],
        k: usize,
        l: usize,
        w: usize,
        admit: &dyn Fn(u32, u64) -> bool,
        scratch: &mut Scratch,
        out: &mut Vec<(f32, u64)>,
    ) -> Result<QueryStats> {
        self.beam(q, k, l, w, admit, false, scratch, out)
    }

    /// GreedySearch for StreamingMerge's Insert phase: the beam search with
    /// list `l`, leaving every expanded node that holds a point (the start
    /// node included) with its exact distance and vector in
    /// `scratch.expanded` / `scratch.expanded_vectors`.
    pub fn search_expanded(
        &self,
        q: &[f32],
        l: usize,
        w: usize,
        scratch: &mut Scratch,
    ) -> Result<QueryStats> {
        let mut out = Vec::new();
        self.beam(q, 1, l, w, &|_, _| false, true, scratch, &mut out)
    }

    /// GreedySearch as [`Lti::search_expanded`] for each of `jobs`, up to
    /// one search per slot of `ls` at a time, in lock-step: each round
    /// every search in flight picks its hop's nodes, the records none of
    /// the caches hold are read in one batch (each once, however many
    /// searches want it), and every search expands its nodes. A slot whose
    /// search ends takes the next job at once. `done(job, scratch, stats)`
    /// is called as each search ends (in no fixed order), with
    /// `scratch.expanded` / `scratch.expanded_vectors` filled; a record
    /// read once for several searches counts as read by the first and as
    /// a cache hit by the others.
    ///
    /// StreamingMerge's Insert phase runs its searches so: one batch per
    /// round for all of a thread's searches instead of one per search, so
    /// far fewer submissions, wake-ups and thread switches per read.
    pub fn search_expanded_lockstep<'q>(
        &self,
        jobs: impl IntoIterator<Item = usize>,
        query: impl Fn(usize) -> &'q [f32],
        l: usize,
        w: usize,
        ls: &mut Lockstep,
        mut done: impl FnMut(usize, &Scratch, QueryStats) -> Result<()>,
    ) -> Result<()> {
        let (l, w) = (l.max(1), w.max(1));
        let bytes = self.header.sectors_per_node() * BLOCK;
        let mut jobs = jobs.into_iter();
        let Lockstep {
            slots,
            caches,
            bufs,
            reads,
        } = ls;
        for slot in slots.iter_mut() {
            slot.job = None;
        }
        loop {
            reads.clear();
            let mut planned = false;
            for slot in slots.iter_mut() {
                slot.planned = false;
                loop {
                    let j = match slot.job {
                        Some(j) => j,
                        None => {
                            let Some(j) = jobs.next() else { break };
                            slot.stats = QueryStats::default();
                            if !self.beam_start(query(j), 1, &mut slot.scratch, &mut slot.stats)? {
                                done(j, &slot.scratch, slot.stats)?;
                                continue;
                            }
                            slot.job = Some(j);
                            j
                        }
                    };
                    if self.beam_plan(w, &mut slot.scratch, caches, reads, &mut slot.stats) {
                        slot.planned = true;
                        planned = true;
                        break;
                    }
                    slot.job = None;
                    done(j, &slot.scratch, slot.stats)?;
                }
            }
            if !planned {
                return Ok(());
            }
            if !reads.is_empty() {
                self.read_sectors(reads, bufs)?;
            }
            let src = HopSectors {
                cache: &self.cache,
                caches,
                reads,
                bufs,
            };
            for slot in slots.iter_mut().filter(|s| s.planned) {
                let q = query(slot.job.unwrap_or_default());
                let no = |_: u32, _: u64| false;
                self.beam_hop(q, l, &no, true, &mut slot.scratch, &mut slot.stats, &src)?;
            }
            caches.keep(reads, bufs, bytes);
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn beam(
        &self,
        q: &[f32],
        k: usize,
        l: usize,
        w: usize,
        admit: &dyn Fn(u32, u64) -> bool,
        collect: bool,
        scratch: &mut Scratch,
        out: &mut Vec<(f32, u64)>,
    ) -> Result<QueryStats> {
        out.clear();
        let mut stats = QueryStats::default();
        if !self.beam_start(q, k, scratch, &mut stats)? {
            return Ok(stats);
        }
        let (l, w) = (l.max(k).max(1), w.max(1));
        let bytes = self.header.sectors_per_node() * BLOCK;
        let mut caches = std::mem::take(&mut scratch.caches);
        let mut bufs = std::mem::take(&mut scratch.bufs);
        let mut reads = std::mem::take(&mut scratch.reads);
        let r = (|| -> Result<()> {
            loop {
                reads.clear();
                if !self.beam_plan(w, scratch, &mut caches, &mut reads, &mut stats) {
                    return Ok(());
                }
                if !reads.is_empty() {
                    self.read_sectors(&reads, &mut bufs)?;
                }
                let src = HopSectors {
                    cache: &self.cache,
                    caches: &caches,
                    reads: &reads,
                    bufs: &bufs,
                };
                self.beam_hop(q, l, admit, collect, scratch, &mut stats, &src)?;
                caches.keep(&reads, &bufs, bytes);
            }
        })();
        scratch.caches = caches;
        scratch.bufs = bufs;
        scratch.reads = reads;
        r?;
        self.beam_done(k, scratch, out);
        Ok(stats)
    }

    /// A search's set-up: the PQ table of `q` and a list holding the start
    /// node. False when there is nothing to search (no nodes, or `k` 0).
    fn beam_start(
        &self,
        q: &[f32],
        k: usize,
        scratch: &mut Scratch,
        stats: &mut QueryStats,
    ) -> Result<bool> {
        let h = &self.header;
        scratch.expanded.clear();
        scratch.expanded_vectors.clear();
        scratch.full.clear();
        if q.len() != h.dim as usize {
            return Err(Error::DimensionMismatch {
                expected: h.dim as usize,
                got: q.len(),
            });
        }
        if h.nodes == 0 || k == 0 {
            return Ok(false);
        }
        self.pq.table_into(q, h.metric, &mut scratch.table)?;
        scratch.visited.clear();
        scratch.list.clear();
        scratch.vec.resize(h.dim as usize, 0.0);
        let start = h.start as u32;
        scratch.visited.insert(start);
        scratch
            .list
            .push((scratch.table.distance(self.code(start)), start, false));
        stats.pq_distances += 1;
        scratch.done.clear();
        Ok(true)
    }

    /// Picks a hop's nodes (the `w` nearest unexpanded in the list) into
    /// `scratch.batch` and their first sectors into `scratch.sectors`;
    /// each sector neither cached nor in `reads` already is pushed to
    /// `reads` and counted as read. False when the search is over.
    fn beam_plan(
        &self,
        w: usize,
        scratch: &mut Scratch,
        caches: &mut ReadCaches,
        reads: &mut Vec<u64>,
        stats: &mut QueryStats,
    ) -> bool {
        let h = &self.header;
        scratch.batch.clear();
        for e in scratch.list.iter_mut() {
            if !e.2 {
                e.2 = true;
                scratch.batch.push(e.1);
                if scratch.batch.len() == w {
                    break;
                }
            }
        }
        if scratch.batch.is_empty() {
            return false;
        }
        scratch.sectors.clear();
        let mut read_any = false;
        for &id in &scratch.batch {
            let (first, _) = h.locate(id as u64);
            if scratch.sectors.contains(&first) {
                continue;
            }
            scratch.sectors.push(first);
            if self.cache.contains_key(&first) || caches.hit(first) || reads.contains(&first) {
                stats.cache_hits += 1;
            } else {
                reads.push(first);
                stats.sectors_read += h.sectors_per_node() as u64;
                read_any = true;
            }
        }
        if read_any {
            stats.hops += 1;
        }
        true
    }

    /// Expands a hop's nodes (`scratch.batch`, their records in `src`),
    /// then the sector mates whose exact distance would enter the list.
    #[allow(clippy::too_many_arguments)]
    fn beam_hop(
        &self,
        q: &[f32],
        l: usize,
        admit: &dyn Fn(u32, u64) -> bool,
        collect: bool,
        scratch: &mut Scratch,
        stats: &mut QueryStats,
        src: &HopSectors<'_>,
    ) -> Result<()> {
        let h = &self.header;
        let nps = h.nodes_per_sector();
        let mut joined = Vec::new();
        let batch = std::mem::take(&mut scratch.batch);
        let sectors = std::mem::take(&mut scratch.sectors);
        let r = (|| -> Result<()> {
            for &id in &batch {
                if scratch.done.contains(id) {
                    continue; // expanded as a sector mate this hop
                }
                let rec = record_in(h, src.get(h.locate(id as u64).0), id, &mut joined);
                let node = Node::parse(rec, h)?;
                node.vector_into(&mut scratch.vec)?;
                let d = (self.dist)(q, &scratch.vec);
                stats.exact_distances += 1;
                self.expand(id, &node, d, false, l, admit, collect, scratch, stats)?;
            }
            // Sector mates: their records came with the read. One whose
            // exact distance would enter the list is expanded now, saving
            // the read its expansion would cost later.
            if nps > 1 {
                for &first in &sectors {
                    let buf = src.get(first);
                    let base = (first - 1) * nps as u64;
                    for slot in 0..nps as u64 {
                        let v = base + slot;
                        if v >= h.nodes || scratch.done.contains(v as u32) {
                            continue;
                        }
                        let v = v as u32;
                        let node = Node::parse(record_in(h, buf, v, &mut joined), h)?;
                        if node.label == NO_LABEL {
                            continue;
                        }
                        node.vector_into(&mut scratch.vec)?;
                        let d = (self.dist)(q, &scratch.vec);
                        stats.exact_distances += 1;
                        let enters =
                            scratch.list.len() < l || scratch.list.last().is_some_and(|e| d < e.0);
                        if enters {
                            self.expand(v, &node, d, true, l, admit, collect, scratch, stats)?;
                        }
                    }
                }
            }
            Ok(())
        })();
        scratch.batch = batch;
        scratch.sectors = sectors;
        r
    }

    /// The `k` nearest results of a finished search into `out`.
    fn beam_done(&self, k: usize, scratch: &mut Scratch, out: &mut Vec<(f32, u64)>) {
        scratch
            .full
            .sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        out.clear();
        out.extend(scratch.full.iter().take(k).copied());
    }

    /// Expands node `id` (exact distance `d`, its vector in
    /// `scratch.vec`): a result if admitted, collected under
    /// `search_expanded`, its unvisited neighbours into the list by PQ
    /// distance. A sector mate (`mate`) also enters the list, expanded.
    #[allow(clippy::too_many_arguments)]
    fn expand(
        &self,
        id: u32,
        node: &Node<'_>,
        d: f32,
        mate: bool,
        l: usize,
        admit: &dyn Fn(u32, u64) -> bool,
        collect: bool,
        scratch: &mut Scratch,
        stats: &mut QueryStats,
    ) -> Result<()> {
        scratch.done.insert(id);
        stats.expanded += 1;
        if mate {
            if scratch.visited.insert(id) {
                insert_bounded(&mut scratch.list, l, (d, id, true));
            } else if let Some(e) = scratch.list.iter_mut().find(|e| e.1 == id) {
                e.2 = true;
            }
        }
        if node.label != NO_LABEL {
            if collect {
                scratch.expanded.push((d, id));
                scratch.expanded_vectors.extend_from_slice(&scratch.vec);
            }
            if id as u64 != self.header.start && admit(id, node.label) {
                scratch.full.push((d, node.label));
            }
        }
        // The unvisited neighbours' PQ distances in one batch (their
        // visited slots fetched first: each probe is a cache miss).
        for nbr in node.neighbor_ids() {
            scratch.visited.prefetch(nbr);
        }
        scratch.fresh.clear();
        for nbr in node.neighbor_ids() {
            if scratch.visited.insert(nbr) {
                scratch.fresh.push(nbr);
            }
        }
        scratch
            .table
            .distances_at(&self.codes, &scratch.fresh, &mut scratch.dists)?;
        stats.pq_distances += scratch.fresh.len() as u64;
        // Those that can enter, sorted, merged into the list in one pass.
        let worst = if scratch.list.len() >= l {
            scratch.list.last().map_or(f32::INFINITY, |e| e.0)
        } else {
            f32::INFINITY
        };
        scratch.entering.clear();
        scratch.entering.extend(
            scratch
                .fresh
                .iter()
                .zip(&scratch.dists)
                .filter(|e| *e.1 < worst)
                .map(|(&nbr, &d)| (d, nbr, false)),
        );
        if !scratch.entering.is_empty() {
            scratch
                .entering
                .sort_unstable_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
            merge_bounded(&mut scratch.list, &scratch.entering, l, &mut scratch.merged);
        }
        Ok(())
    }
}

/// Merges `new` (sorted) into the distance-sorted `list`, keeping the `l`
/// best; an entry already in `list` goes first among equal distances.
fn merge_bounded(
    list: &mut Vec<(f32, u32, bool)>,
    new: &[(f32, u32, bool)],
    l: usize,
    merged: &mut Vec<(f32, u32, bool)>,
) {
    merged.clear();
    let (mut i, mut j) = (0, 0);
    while merged.len() < l && (i < list.len() || j < new.len()) {
        if j == new.len() || (i < list.len() && list[i].0 <= new[j].0) {
            merged.push(list[i]);
            i += 1;
        } else {
            merged.push(new[j]);
            j += 1;
        }
    }
    std::mem::swap(list, merged);
}

/// Inserts into a distance-sorted list kept at most `l` long.
fn insert_bounded(list: &mut Vec<(f32, u32, bool)>, l: usize, e: (f32, u32, bool)) {
    if list.len() >= l && list.last().is_some_and(|last| e.0 >= last.0) {
        return;
    }
    let at = list.partition_point(|x| x.0 <= e.0);
    list.insert(at, e);
    list.truncate(l);
}

#[cfg(test)]
mod tests {
    use super::sector_order;

    /// A ring where node `i` links to its 4 nearest ring neighbours, its
    /// numbering shuffled.
    fn shuffled_ring(n: usize) -> Vec<Vec<u32>> {
        let pos: Vec<usize> = (0..n).map(|i| (i * 7919) % n).collect(); // node -> ring position
        let mut at = vec![0u32; n];
        for (node, &p) in pos.iter().enumerate() {
            at[p] = node as u32;
        }
        (0..n)
            .map(|node| {
                let p = pos[node];
                [1, n - 1, 2, n - 2]
                    .iter()
                    .map(|&d| at[(p + d) % n])
                    .collect()
            })
            .collect()
    }

    /// Fraction of edges whose ends share a sector under `order`.
    fn shared(lists: &[Vec<u32>], order: &[u32], nps: usize) -> f64 {
        let mut sector = vec![0usize; lists.len()];
        for (i, &src) in order.iter().enumerate() {
            sector[src as usize] = i / nps;
        }
        let (mut same, mut all) = (0, 0);
        for (u, l) in lists.iter().enumerate() {
            for &v in l {
                all += 1;
                same += usize::from(sector[u] == sector[v as usize]);
            }
        }
        same as f64 / all as f64
    }

    #[test]
    fn sector_order_is_a_permutation_that_keeps_neighbours_together() {
        let n = 1000;
        let lists = shuffled_ring(n);
        let order = sector_order(&lists, 5, 8);
        let mut seen = order.clone();
        seen.sort_unstable();
        assert_eq!(seen, (0..n as u32).collect::<Vec<_>>());
        let identity: Vec<u32> = (0..n as u32).collect();
        let (ours, ids) = (shared(&lists, &order, 8), shared(&lists, &identity, 8));
        assert!(ours > 0.5 && ids < 0.05, "shared edges {ours} vs {ids}");
        // One record per sector or larger: the identity.
        assert_eq!(sector_order(&lists, 5, 1), identity);
        // Unreachable nodes and out-of-range ids are still placed once.
        let mut lists = lists;
        lists.push(vec![u32::MAX]);
        lists.push(Vec::new());
        let mut all = sector_order(&lists, 0, 8);
        all.sort_unstable();
        assert_eq!(all, (0..n as u32 + 2).collect::<Vec<_>>());
        assert!(sector_order(&[], 0, 8).is_empty());
    }
}

#[cfg(test)]
mod merge_tests {
    use super::{insert_bounded, merge_bounded};

    #[test]
    fn merging_a_sorted_batch_equals_inserting_one_at_a_time() {
        for l in [1, 5, 16] {
            let (mut a, mut b, mut tmp) = (Vec::new(), Vec::new(), Vec::new());
            for round in 0..40u32 {
                let mut new: Vec<(f32, u32, bool)> = (0..round % 7)
                    .map(|k| (((round * 31 + k * 17) % 23) as f32, round * 10 + k, false))
                    .collect();
                new.sort_by(|x, y| x.0.total_cmp(&y.0).then(x.1.cmp(&y.1)));
                for &e in &new {
                    insert_bounded(&mut a, l, e);
                }
                merge_bounded(&mut b, &new, l, &mut tmp);
                assert_eq!(a, b, "l {l} round {round}");
                assert!(b.len() <= l);
            }
        }
    }
}

#[cfg(test)]
mod writer_tests {
    use super::{NodeWriter, RUN};
    use crate::layout::{encode_node_into, Header, Vector, NO_LABEL};
    use vectide_core::Metric;
    use vectide_storage::block::SimBlockFile;

    fn shape(dim: u32, max_degree: u32) -> Header {
        Header {
            metric: Metric::L2,
            dim,
            max_degree,
            nodes: 0,
            start: 0,
            durable_seq: 3,
            pq_bytes: 1,
        }
    }

    fn record(i: usize, dim: usize) -> (Vec<f32>, u64, Vec<u32>) {
        let v = (0..dim).map(|d| (i * 31 + d) as f32 * 0.5).collect();
        let list = (0..(i % 5) as u32).map(|k| (i as u32 + k) % 7).collect();
        (v, i as u64 * 3 + 1, list)
    }

    /// Records pushed in parallel chunks of odd sizes, between single
    /// pushes and free records, give the same file as single pushes,
    /// for records packed several to a sector and spanning sectors.
    #[test]
    fn parallel_pushes_write_what_single_pushes_write() {
        for (dim, max_degree) in [(3, 6), (1100, 40)] {
            let h = shape(dim, max_degree);
            let n = if h.nodes_per_sector() > 0 {
                RUN * h.nodes_per_sector() * 2 + 17
            } else {
                RUN + 9
            };
            let free = |i: usize| i % 11 == 4;
            let one = SimBlockFile::new(1);
            let mut w = NodeWriter::new(&one, h).unwrap();
            for i in 0..n {
                if free(i) {
                    w.push_free().unwrap();
                } else {
                    let (v, label, list) = record(i, dim as usize);
                    w.push(&v, label, &list).unwrap();
                }
            }
            w.finish(0, 3).unwrap();
            let many = SimBlockFile::new(1);
            let mut w = NodeWriter::new(&many, h).unwrap();
            let mut i = 0;
            for (step, chunk) in [1usize, 250, 7, 3000, 1, 100_000].iter().enumerate() {
                let take = (*chunk).min(n - i);
                if step % 2 == 0 && take > 0 {
                    // A single push between the chunks.
                    let (v, label, list) = record(i, dim as usize);
                    if free(i) {
                        w.push_free().unwrap();
                    } else {
                        w.push(&v, label, &list).unwrap();
                    }
                    i += 1;
                    continue;
                }
                let from = i;
                w.push_records(take, |k, slot| {
                    let j = from + k;
                    if free(j) {
                        return encode_node_into(slot, &h, Vector::Zero, NO_LABEL, &[]);
                    }
                    let (v, label, list) = record(j, dim as usize);
                    encode_node_into(slot, &h, Vector::Floats(&v), label, &list)
                })
                .unwrap();
                i += take;
            }
            assert_eq!(i, n, "the steps cover every record");
            assert_eq!(w.nodes(), n as u64);
            w.finish(0, 3).unwrap();
            assert_eq!(one.current(), many.current(), "dim {dim}");
        }
    }
}
