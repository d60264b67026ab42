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
    file.set_len_blocks(0)?;
    const RUN: usize = 256;
    let spn = h.sectors_per_node();
    let nps = h.nodes_per_sector();
    let mut buf = AlignedBuf::new(RUN);
    let mut filled = 0usize; // sectors in `buf`
    let mut next_sector = 1u64;
    let mut rec = Vec::with_capacity(h.node_bytes());
    let flush = |buf: &mut AlignedBuf, filled: &mut usize, next: &mut u64| -> Result<()> {
        if *filled > 0 {
            for s in 0..*filled {
                seal(buf.block_mut(s));
            }
            file.write(*next, &buf[..*filled * BLOCK])?;
            *next += *filled as u64;
            buf.fill(0);
            *filled = 0;
        }
        Ok(())
    };
    for i in 0..n {
        rec.clear();
        encode_node(
            &mut rec,
            &h,
            &g.vectors[i * g.dim..(i + 1) * g.dim],
            g.labels[i],
            &g.lists[i],
        )?;
        if nps > 0 {
            let slot = i % nps;
            if slot == 0 && i > 0 {
                filled += 1;
                if filled == RUN {
                    flush(&mut buf, &mut filled, &mut next_sector)?;
                }
            }
            let at = filled * BLOCK + slot * h.node_bytes();
            buf[at..at + rec.len()].copy_from_slice(&rec);
        } else {
            if filled + spn > RUN {
                flush(&mut buf, &mut filled, &mut next_sector)?;
            }
            for (k, chunk) in rec.chunks(PAYLOAD).enumerate() {
                let at = (filled + k) * BLOCK;
                buf[at..at + chunk.len()].copy_from_slice(chunk);
            }
            filled += spn;
        }
    }
    if nps > 0 && n > 0 {
        filled += 1;
    }
    flush(&mut buf, &mut filled, &mut next_sector)?;
    file.write(0, &h.encode())?;
    file.sync()?;
    PqFile::write(pq_path, &pq, &codes)?;
    Ok(h)
}

/// An open LTI: the file, its header, PQ codes in RAM and the node cache.
pub struct Lti {
    file: Box<dyn BlockFile>,
    header: Header,
    pq: ProductQuantizer,
    codes: Vec<u8>,
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
    bufs: Vec<AlignedBuf>,
    vec: Vec<f32>,
    node: Vec<u8>,
    batch: Vec<u32>,
}

impl Lti {
    /// Opens an LTI file and its PQ file; checks the header, the PQ file
    /// (envelope, CRC) and that both describe the same nodes.
    pub fn open(file: Box<dyn BlockFile>, pq_path: &Path) -> Result<Self> {
        let mut s0 = AlignedBuf::new(1);
        if file.len_blocks() == 0 {
            return Err(Error::corrupted("LTI file is empty"));
        }
        file.read(0, &mut s0)?;
        let header = Header::decode(&s0, file.len_blocks())?;
        let (pq, codes) = PqFile::read(pq_path)?;
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

    fn code(&self, i: u32) -> &[u8] {
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
    #[allow(clippy::too_many_arguments)]
    pub fn search(
        &self,
        q: &[f32],
        k: usize,
        l: usize,
        w: usize,
        admit: &dyn Fn(u64) -> bool,
        scratch: &mut Scratch,
        out: &mut Vec<(f32, u64)>,
    ) -> Result<QueryStats> {
        let h = &self.header;
        out.clear();
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
                if id != start && node.label != NO_LABEL && admit(node.label) {
                    scratch
                        .full
                        .push(((self.dist)(q, &scratch.vec), node.label));
                    stats.exact_distances += 1;
                }
                for nbr in node.neighbor_ids() {
                    if !scratch.visited.insert(nbr) {
                        continue;
                    }
                    let d = scratch.table.distance(self.code(nbr));
                    stats.pq_distances += 1;
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
