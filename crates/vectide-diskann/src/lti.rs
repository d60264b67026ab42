//! The long-term index: writing one from a graph, opening it, and DiskANN's
//! beam search over it (FreshDiskANN §5.1, DiskANN §3.3).
//!
//! **Search.** The candidate list holds the `L` best nodes seen, ranked by
//! PQ distance (codes in RAM). Each hop takes the `W` best unexpanded
//! candidates and reads their sectors in **one batch** (io_uring under
//! [`DirectFile`](vectide_storage::block::DirectFile)), except those in the
//! RAM cache. An expanded node's full-precision vector (it came with the
//! sector) gets its exact distance, and its neighbours enter the list by PQ
//! distance. The search stops when the `L` best are all expanded; the
//! results are the expanded nodes re-ranked by exact distance, the start
//! node and the nodes `admit` refuses (deleted, filtered out) left out.
//!
//! **Cache.** [`Lti::cache_near_start`] keeps the records of the nodes
//! nearest the start (breadth-first, by hops) within a RAM budget, as
//! DiskANN's `num_nodes_to_cache`: the first hops of every query then read
//! nothing.

use crate::layout::{check_sector, encode_node, seal, Header, Node, PqFile, NO_LABEL, PAYLOAD};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use vectide_core::metric::DistanceFn;
use vectide_core::{Error, Metric, Result, VisitedSet};
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

/// Writes `g` as an LTI into `file` (which must be empty) and its PQ file
/// at `pq_path` (`pq_bytes` per code, trained on the vectors with `seed`).
/// The LTI is written in runs of 256 sectors, then synced.
pub fn write(
    file: &dyn BlockFile,
    pq_path: &Path,
    g: &GraphSource<'_>,
    pq_bytes: usize,
    seed: u64,
) -> Result<Header> {
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
    let codes = pq.encode_all(g.vectors)?;
    let mut w = NodeWriter::new(file, h)?;
    for i in 0..n {
        w.push(
            &g.vectors[i * g.dim..(i + 1) * g.dim],
            g.labels[i],
            &g.lists[i],
        )?;
    }
    let h = w.finish(h.start, h.durable_seq)?;
    PqFile::write(pq_path, &pq, &codes)?;
    Ok(h)
}

/// Sectors a [`NodeWriter`] gathers before one write, and the run length
/// of [`Lti::scan`]'s sequential reads.
pub const RUN: usize = 256;

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

    /// Appends the next node's record.
    pub fn push(&mut self, vector: &[f32], label: u64, list: &[u32]) -> Result<()> {
        self.rec.clear();
        encode_node(&mut self.rec, &self.h, vector, label, list)?;
        let nps = self.h.nodes_per_sector();
        if nps > 0 {
            if self.in_sector == nps {
                self.filled += 1;
                self.in_sector = 0;
                if self.filled == RUN {
                    self.flush()?;
                }
            }
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

/// An open LTI: the file, its header, PQ codes in RAM and the node cache.
pub struct Lti {
    file: Box<dyn BlockFile>,
    header: Header,
    pq: ProductQuantizer,
    /// Shared with the intermediate index of a StreamingMerge, and handed
    /// back (patched in place) at its switch.
    codes: Arc<Vec<u8>>,
    dist: DistanceFn,
    cache: HashMap<u32, Box<[u8]>>,
}

/// Per-thread search state, reused across queries.
#[derive(Default)]
pub struct Scratch {
    /// `(pq distance, node, expanded)`, sorted by distance, at most `L`.
    list: Vec<(f32, u32, bool)>,
    visited: VisitedSet,
    table: DistanceTable,
    /// Expanded nodes: `(exact distance, label)`.
    full: Vec<(f32, u64)>,
    /// With [`Lti::search_expanded`]: every expanded node that holds a
    /// point, `(exact distance, node)`, and their vectors back to back.
    pub expanded: Vec<(f32, u32)>,
    pub expanded_vectors: Vec<f32>,
    bufs: Vec<AlignedBuf>,
    vec: Vec<f32>,
    node: Vec<u8>,
    batch: Vec<u32>,
    /// Unvisited neighbours of an expanded node and their PQ distances.
    fresh: Vec<u32>,
    dists: Vec<f32>,
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
    /// and record.
    pub fn scan(&self, mut f: impl FnMut(u32, Node<'_>) -> Result<()>) -> Result<()> {
        let h = &self.header;
        let data = h.data_sectors();
        let mut buf = AlignedBuf::new(RUN);
        let nb = h.node_bytes();
        let spn = h.sectors_per_node();
        let nps = h.nodes_per_sector();
        let mut rec = Vec::with_capacity(nb);
        let mut node: u64 = 0;
        let mut sector = 1u64;
        while sector < 1 + data {
            let take = ((1 + data - sector) as usize).min(RUN);
            // Whole records per run when a record spans sectors.
            let take = if nps == 0 { take - take % spn } else { take };
            self.file.read(sector, &mut buf[..take * BLOCK])?;
            for s in 0..take {
                check_sector(buf.block(s), sector + s as u64)?;
            }
            if nps > 0 {
                for s in 0..take {
                    for k in 0..nps {
                        if node >= h.nodes {
                            break;
                        }
                        let b = &buf.block(s)[k * nb..(k + 1) * nb];
                        f(node as u32, Node::parse(b, h)?)?;
                        node += 1;
                    }
                }
            } else {
                for r in 0..take / spn {
                    rec.clear();
                    let mut left = nb;
                    for s in 0..spn {
                        let t = left.min(PAYLOAD);
                        rec.extend_from_slice(&buf.block(r * spn + s)[..t]);
                        left -= t;
                    }
                    f(node as u32, Node::parse(&rec, h)?)?;
                    node += 1;
                }
            }
            sector += take as u64;
        }
        Ok(())
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
        let nb = self.header.node_bytes();
        for chunk in ids.chunks(64) {
            if let Some(&bad) = chunk.iter().find(|&&i| i as u64 >= self.header.nodes) {
                return Err(Error::invalid(format!("LTI has no node {bad}")));
            }
            self.read_nodes(chunk, scratch, &mut stats)?;
            let recs = std::mem::take(&mut scratch.node);
            let r = chunk.iter().enumerate().try_for_each(|(k, &id)| {
                f(id, Node::parse(&recs[k * nb..(k + 1) * nb], &self.header)?)
            });
            scratch.node = recs;
            r?;
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

    /// Nodes in the cache.
    pub fn cached(&self) -> usize {
        self.cache.len()
    }

    /// The PQ code of node `i`.
    pub fn code(&self, i: u32) -> &[u8] {
        let m = self.header.pq_bytes as usize;
        &self.codes[i as usize * m..(i as usize + 1) * m]
    }

    /// Reads nodes `ids` into `scratch.node` (records back to back), one
    /// batch for all of them.
    fn read_nodes(&self, ids: &[u32], scratch: &mut Scratch, stats: &mut QueryStats) -> Result<()> {
        let h = &self.header;
        let spn = h.sectors_per_node();
        let nb = h.node_bytes();
        // A scratch used on an index with smaller records gets new buffers.
        scratch.bufs.retain(|b| b.blocks() >= spn);
        while scratch.bufs.len() < ids.len() {
            scratch.bufs.push(AlignedBuf::new(spn));
        }
        let mut reqs: Vec<ReadReq<'_>> = Vec::with_capacity(ids.len());
        let mut firsts = Vec::with_capacity(ids.len());
        for (&id, buf) in ids.iter().zip(scratch.bufs.iter_mut()) {
            let (sector, _) = h.locate(id as u64);
            firsts.push(sector);
            reqs.push(ReadReq {
                block: sector,
                buf: &mut buf[..spn * BLOCK],
            });
        }
        self.file.read_batch(&mut reqs)?;
        drop(reqs);
        stats.sectors_read += (ids.len() * spn) as u64;
        stats.hops += 1;
        scratch.node.clear();
        for ((&id, buf), &first) in ids.iter().zip(&scratch.bufs).zip(&firsts) {
            for s in 0..spn {
                check_sector(buf.block(s), first + s as u64)?;
            }
            let (_, off) = h.locate(id as u64);
            if spn == 1 {
                scratch.node.extend_from_slice(&buf[off..off + nb]);
            } else {
                let mut left = nb;
                for s in 0..spn {
                    let take = left.min(PAYLOAD);
                    scratch.node.extend_from_slice(&buf.block(s)[..take]);
                    left -= take;
                }
            }
        }
        Ok(())
    }

    /// Caches the records of the nodes nearest the start (breadth-first)
    /// until `budget_bytes` is spent.
    pub fn cache_near_start(&mut self, budget_bytes: usize) -> Result<usize> {
        self.cache.clear();
        if self.header.nodes == 0 {
            return Ok(0);
        }
        let nb = self.header.node_bytes();
        let max = budget_bytes / (nb + 16);
        let mut frontier = vec![self.header.start as u32];
        let mut seen = std::collections::HashSet::new();
        seen.insert(self.header.start as u32);
        let mut scratch = Scratch::default();
        let mut stats = QueryStats::default();
        while !frontier.is_empty() && self.cache.len() < max {
            let take = frontier.len().min(max - self.cache.len());
            let level: Vec<u32> = frontier.drain(..take).collect();
            let mut next = Vec::new();
            for chunk in level.chunks(64) {
                self.read_nodes(chunk, &mut scratch, &mut stats)?;
                for (k, &id) in chunk.iter().enumerate() {
                    let rec = &scratch.node[k * nb..(k + 1) * nb];
                    let node = Node::parse(rec, &self.header)?;
                    for nbr in node.neighbor_ids() {
                        if seen.insert(nbr) {
                            next.push(nbr);
                        }
                    }
                    self.cache.insert(id, rec.to_vec().into_boxed_slice());
                }
            }
            frontier.extend(next);
        }
        Ok(self.cache.len())
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
        let h = &self.header;
        out.clear();
        scratch.expanded.clear();
        scratch.expanded_vectors.clear();
        let mut stats = QueryStats::default();
        if q.len() != h.dim as usize {
            return Err(Error::DimensionMismatch {
                expected: h.dim as usize,
                got: q.len(),
            });
        }
        if h.nodes == 0 || k == 0 {
            return Ok(stats);
        }
        let (l, w) = (l.max(k).max(1), w.max(1));
        self.pq.table_into(q, h.metric, &mut scratch.table)?;
        scratch.visited.reset(h.nodes as usize);
        scratch.list.clear();
        scratch.full.clear();
        scratch.vec.resize(h.dim as usize, 0.0);
        let start = h.start as u32;
        scratch.visited.insert(start);
        scratch
            .list
            .push((scratch.table.distance(self.code(start)), start, false));
        stats.pq_distances += 1;
        let nb = h.node_bytes();
        loop {
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
                break;
            }
            // Cached records first; the rest in one read batch.
            let batch = std::mem::take(&mut scratch.batch);
            let misses: Vec<u32> = batch
                .iter()
                .copied()
                .filter(|id| !self.cache.contains_key(id))
                .collect();
            if !misses.is_empty() {
                self.read_nodes(&misses, scratch, &mut stats)?;
            }
            let read = std::mem::take(&mut scratch.node);
            let mut mi = 0;
            for &id in &batch {
                let rec: &[u8] = match self.cache.get(&id) {
                    Some(r) => {
                        stats.cache_hits += 1;
                        r
                    }
                    None => {
                        let r = &read[mi * nb..(mi + 1) * nb];
                        mi += 1;
                        r
                    }
                };
                let node = Node::parse(rec, h)?;
                stats.expanded += 1;
                node.vector_into(&mut scratch.vec)?;
                if collect && node.label != NO_LABEL {
                    let d = (self.dist)(q, &scratch.vec);
                    stats.exact_distances += 1;
                    scratch.expanded.push((d, id));
                    scratch.expanded_vectors.extend_from_slice(&scratch.vec);
                }
                if id != start && node.label != NO_LABEL && admit(id, node.label) {
                    scratch
                        .full
                        .push(((self.dist)(q, &scratch.vec), node.label));
                    stats.exact_distances += 1;
                }
                // The unvisited neighbours' PQ distances in one batch.
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
                for (&nbr, &d) in scratch.fresh.iter().zip(&scratch.dists) {
                    insert_bounded(&mut scratch.list, l, (d, nbr, false));
                }
            }
            scratch.node = read;
            scratch.batch = batch;
        }
        scratch
            .full
            .sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        out.extend(scratch.full.iter().take(k).copied());
        Ok(stats)
    }
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
