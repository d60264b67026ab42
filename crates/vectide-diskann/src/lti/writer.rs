//! Writing an LTI: a whole graph ([`write`], records laid out by
//! [`sector_order`]), node records in order ([`NodeWriter`], which the
//! StreamingMerge's patch phase uses too), and one record edited in place
//! ([`edit_record`]).

use super::{record_in, RUN};
use crate::layout::{check_sector, encode_node, seal, Header, Node, PqFile, NO_LABEL, PAYLOAD};
use rayon::prelude::*;
use std::path::Path;
use vectide_core::{Error, Metric, Result};
use vectide_quant::{PqParams, ProductQuantizer};
use vectide_storage::block::{AlignedBuf, BlockFile, BLOCK};

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
