//! A graph blob deserialised on the compute node (a fetched sub-HNSW or
//! the meta-HNSW): typed arrays behind the shared [`Graph`] trait, so the
//! traversal, neighbour selection and back-link rules are the ones every
//! HNSW engine of the project runs.

use crate::layout::{BlobHeader, GraphParts, DELETED, NO_NODE};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};
use vectide_core::io::ByteReader;
use vectide_core::metric::DistanceFn;
use vectide_core::{Error, Neighbor, Result};
use vectide_graph::{Graph, Scratch};

/// A deserialised graph. Node ids are `0..n`: the blob's records, then the
/// overflow records in the order they were written.
pub struct SubGraph {
    pub dim: usize,
    pub m: usize,
    pub m0: usize,
    /// Nodes in the blob itself (the rest came from the overflow).
    pub n_base: usize,
    pub entry: Option<(u32, usize)>,
    pub labels: Vec<u64>,
    deleted: Vec<AtomicU8>,
    vectors: Vec<f32>,
    list0: Vec<AtomicU32>,
    upper: Vec<Box<[AtomicU32]>>,
    /// Bytes this graph came from (what its READ moved).
    pub wire_bytes: usize,
    /// The partition state (an even one, `docs/format-dhnsw.md`) whose
    /// bytes this graph holds: the LRU's copy serves a writer only while
    /// the partition is still at it.
    version: AtomicU64,
}

fn atomics(words: impl Iterator<Item = u32>) -> Vec<AtomicU32> {
    words.map(AtomicU32::new).collect()
}

/// Reads a blob's upper layers (its index, then its words) from `r`,
/// positioned after the blob's header, into `upper` (one list set per node;
/// nodes without upper layers keep theirs empty). Every node must be one of
/// the blob's and every level at most its top.
pub fn decode_upper(
    r: &mut ByteReader<'_>,
    h: &BlobHeader,
    m: usize,
    upper: &mut [Box<[AtomicU32]>],
) -> Result<()> {
    let mut index = Vec::with_capacity(h.up_nodes as usize);
    for _ in 0..h.up_nodes {
        index.push((r.u32()?, r.u32()?, r.u32()?));
    }
    let mut words = Vec::new();
    r.u32s(h.up_words as usize, &mut words)?;
    for (node, level, first) in index {
        let len = level as usize * (1 + m);
        let slice = words
            .get(first as usize..first as usize + len)
            .filter(|_| node < h.n && level <= h.top && (node as usize) < upper.len())
            .ok_or_else(|| {
                Error::corrupted(format!("d-hnsw blob {}: upper lists out of bounds", h.tag))
            })?;
        upper[node as usize] = atomics(slice.iter().copied()).into_boxed_slice();
    }
    Ok(())
}

impl SubGraph {
    /// Decodes `bytes`: `overflow` records of `backward` growth before the
    /// blob, or after it, as one READ returned them. `dim`, `m`, `m0` are
    /// the region's; `tag` the partition expected.
    #[allow(clippy::too_many_arguments)]
    pub fn decode(
        bytes: &[u8],
        overflow: usize,
        backward: bool,
        dim: usize,
        m: usize,
        m0: usize,
        tag: u32,
    ) -> Result<SubGraph> {
        let rec = crate::layout::record_bytes(dim, m0);
        let over_bytes = overflow
            .checked_mul(rec)
            .filter(|&b| b <= bytes.len())
            .ok_or_else(|| {
                Error::corrupted("d-hnsw: a partition's overflow is longer than its read")
            })?;
        let (before, blob) = if backward {
            bytes.split_at(over_bytes)
        } else {
            (&bytes[..0], bytes)
        };
        let mut r = ByteReader::new(blob);
        let h = BlobHeader::decode(&mut r, dim as u32, m as u32, m0 as u32)?;
        if h.tag != tag {
            return Err(Error::corrupted(format!(
                "d-hnsw: partition {tag}'s bytes hold the blob of {}",
                h.tag
            )));
        }
        let n_base = h.n as usize;
        if blob.len() < h.bytes() || blob.len() - h.bytes() != if backward { 0 } else { over_bytes }
        {
            return Err(Error::corrupted(format!(
                "d-hnsw blob {tag}: {} bytes read, its header says {} and {overflow} overflow records",
                bytes.len(),
                h.bytes()
            )));
        }
        let n = n_base + overflow;
        let mut g = SubGraph {
            dim,
            m,
            m0,
            n_base,
            entry: (h.entry != NO_NODE).then_some((h.entry, h.top as usize)),
            labels: Vec::with_capacity(n),
            deleted: Vec::with_capacity(n),
            vectors: Vec::with_capacity(n * dim),
            list0: Vec::with_capacity(n * (1 + m0)),
            upper: (0..n).map(|_| Box::default()).collect(),
            wire_bytes: bytes.len(),
            version: AtomicU64::new(0),
        };
        decode_upper(&mut r, &h, m, &mut g.upper)?;
        if let Some((ep, top)) = g.entry {
            if g.level(ep) < top {
                return Err(Error::corrupted(format!(
                    "d-hnsw blob {tag}: the entry point has no layer {top}"
                )));
            }
        }
        if g.entry.is_none() && n > 0 {
            // A partition built empty: its first overflow node enters.
            g.entry = Some((0, 0));
        }
        let records_at = h.records_at();
        for i in 0..n_base {
            g.push_record(
                &blob[records_at + i * rec..records_at + (i + 1) * rec],
                n as u32,
            )?;
        }
        for j in 0..overflow {
            let at = if backward {
                (overflow - 1 - j) * rec
            } else {
                h.bytes() + j * rec
            };
            let src = if backward { before } else { blob };
            g.push_record(&src[at..at + rec], n as u32)?;
        }
        Ok(g)
    }

    /// Appends one record's node (read straight into the graph's arrays:
    /// no allocation per record). Its list keeps only the ids among the
    /// graph's `n` nodes: a list may name a node whose record a writer has
    /// written but not yet published (its partition's count not raised),
    /// which a reader must not follow. A count above the list's room is
    /// damage.
    fn push_record(&mut self, rec: &[u8], n: u32) -> Result<()> {
        let mut r = ByteReader::new(rec);
        self.labels.push(r.u64()?);
        let flags = r.u32()?;
        self.deleted
            .push(AtomicU8::new(u8::from(flags & DELETED != 0)));
        let count = r.u32()?;
        let list = r.bytes(self.m0 * 4)?;
        if count as usize > self.m0 {
            return Err(Error::corrupted(format!(
                "d-hnsw: a node's list holds {count} ids, more than its room of {}",
                self.m0
            )));
        }
        let at = self.list0.len();
        self.list0.push(AtomicU32::new(0));
        let mut kept = 0u32;
        for c in list.chunks_exact(4).take(count as usize) {
            let id = u32::from_le_bytes(c.try_into().expect("4 bytes"));
            if id < n {
                self.list0.push(AtomicU32::new(id));
                kept += 1;
            }
        }
        self.list0[at].store(kept, Ordering::Relaxed);
        self.list0
            .extend((kept as usize..self.m0).map(|_| AtomicU32::new(0)));
        r.f32s(self.dim, &mut self.vectors)
    }

    /// Builds the graph of `parts` directly (no bytes), as the encoder
    /// would lay it out and the decoder read it back.
    pub fn from_parts(p: &GraphParts) -> SubGraph {
        let n = p.labels.len();
        let mut list0 = Vec::with_capacity(n * (1 + p.m0));
        let mut upper: Vec<Box<[AtomicU32]>> = Vec::with_capacity(n);
        for node in 0..n {
            let l0 = &p.lists[node][0];
            let c = l0.len().min(p.m0);
            list0.push(AtomicU32::new(c as u32));
            list0.extend((0..p.m0).map(|i| AtomicU32::new(if i < c { l0[i] } else { 0 })));
            let mut up = Vec::new();
            for level in 1..=p.levels[node] as usize {
                let l = &p.lists[node][level];
                let c = l.len().min(p.m);
                up.push(AtomicU32::new(c as u32));
                up.extend((0..p.m).map(|i| AtomicU32::new(if i < c { l[i] } else { 0 })));
            }
            upper.push(up.into_boxed_slice());
        }
        SubGraph {
            dim: p.dim,
            m: p.m,
            m0: p.m0,
            n_base: n,
            entry: p.entry,
            labels: p.labels.clone(),
            deleted: (0..n)
                .map(|i| AtomicU8::new(u8::from(p.flags.get(i).is_some_and(|f| f & DELETED != 0))))
                .collect(),
            vectors: p.vectors.clone(),
            list0,
            upper,
            wire_bytes: 0,
            version: AtomicU64::new(0),
        }
    }

    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// The partition state this graph's bytes are of.
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    pub fn set_version(&self, v: u64) {
        self.version.store(v, Ordering::Release);
    }

    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    pub fn level(&self, node: u32) -> usize {
        self.upper[node as usize].len() / (1 + self.m)
    }

    pub fn is_deleted(&self, node: u32) -> bool {
        self.deleted[node as usize].load(Ordering::Relaxed) != 0
    }

    pub fn mark_deleted(&self, node: u32) {
        self.deleted[node as usize].store(1, Ordering::Relaxed);
    }

    /// Live nodes.
    pub fn live(&self) -> usize {
        self.deleted
            .iter()
            .filter(|d| d.load(Ordering::Relaxed) == 0)
            .count()
    }

    /// A node's current layer-0 list.
    pub fn list0_of(&self, node: u32) -> Vec<u32> {
        let mut out = Vec::new();
        self.neighbors_into(node, 0, &mut out);
        out
    }

    /// Appends a node (layer 0 only, no edges yet); returns its id.
    pub fn push_node(&mut self, label: u64, v: &[f32]) -> u32 {
        let id = self.labels.len() as u32;
        self.labels.push(label);
        self.deleted.push(AtomicU8::new(0));
        self.vectors.extend_from_slice(v);
        self.list0.push(AtomicU32::new(0));
        self.list0.extend((0..self.m0).map(|_| AtomicU32::new(0)));
        self.upper.push(Box::default());
        if self.entry.is_none() {
            self.entry = Some((id, 0));
        }
        id
    }

    /// Replaces a node's layer-0 list.
    pub fn set_list0(&self, node: u32, ids: &[u32]) {
        vectide_graph::store_list(self.list(node, 0), ids);
    }

    /// The `k` nearest nodes to `q` that `admit` takes, searched with `ef`
    /// candidates, appended to `out` as (label, distance).
    #[allow(clippy::too_many_arguments)]
    pub fn search(
        &self,
        dist: DistanceFn,
        q: &[f32],
        k: usize,
        ef: usize,
        scratch: &mut Scratch,
        admit: impl Fn(u64) -> bool,
        out: &mut Vec<Neighbor>,
    ) {
        vectide_graph::search::knn(self, dist, q, self.entry, ef.max(k), scratch, |s| {
            !self.is_deleted(s) && admit(self.labels[s as usize])
        });
        out.extend(
            scratch
                .sorted
                .iter()
                .take(k)
                .map(|c| Neighbor::new(self.labels[c.node as usize], c.dist.0)),
        );
    }

    /// A copy that can take new nodes (inserts work on one, then replace
    /// the cached graph).
    pub fn to_owned_graph(&self) -> SubGraph {
        let load = |v: &[AtomicU32]| atomics(v.iter().map(|a| a.load(Ordering::Relaxed)));
        SubGraph {
            dim: self.dim,
            m: self.m,
            m0: self.m0,
            n_base: self.n_base,
            entry: self.entry,
            labels: self.labels.clone(),
            deleted: self
                .deleted
                .iter()
                .map(|d| AtomicU8::new(d.load(Ordering::Relaxed)))
                .collect(),
            vectors: self.vectors.clone(),
            list0: load(&self.list0),
            upper: self
                .upper
                .iter()
                .map(|u| load(u).into_boxed_slice())
                .collect(),
            wire_bytes: self.wire_bytes,
            version: AtomicU64::new(self.version()),
        }
    }

    /// The graph as parts to lay out again (every node, tombstones kept
    /// as flags, node ids unchanged).
    pub fn to_parts(&self) -> GraphParts {
        let n = self.len();
        GraphParts {
            dim: self.dim,
            m: self.m,
            m0: self.m0,
            entry: self.entry,
            labels: self.labels.clone(),
            flags: (0..n as u32)
                .map(|i| if self.is_deleted(i) { DELETED } else { 0 })
                .collect(),
            levels: (0..n as u32).map(|i| self.level(i) as u8).collect(),
            vectors: self.vectors.clone(),
            lists: (0..n as u32)
                .map(|i| {
                    (0..=self.level(i))
                        .map(|l| {
                            let mut v = Vec::new();
                            self.neighbors_into(i, l, &mut v);
                            v
                        })
                        .collect()
                })
                .collect(),
        }
    }

    /// The live nodes' labels and vectors (what a rebuild starts from).
    pub fn live_rows(&self) -> (Vec<u64>, Vec<f32>) {
        let mut labels = Vec::new();
        let mut vectors = Vec::new();
        for i in 0..self.len() as u32 {
            if !self.is_deleted(i) {
                labels.push(self.labels[i as usize]);
                vectors.extend_from_slice(self.vector(i));
            }
        }
        (labels, vectors)
    }

    /// Bytes this graph holds in RAM.
    pub fn memory_bytes(&self) -> usize {
        self.labels.len() * 9
            + self.vectors.len() * 4
            + self.list0.len() * 4
            + self.upper.iter().map(|u| u.len() * 4 + 16).sum::<usize>()
    }
}

impl Graph for SubGraph {
    fn slots(&self) -> usize {
        self.labels.len()
    }
    fn vector(&self, slot: u32) -> &[f32] {
        let s = slot as usize * self.dim;
        &self.vectors[s..s + self.dim]
    }
    fn vector_ptr(&self, slot: u32) -> *const f32 {
        self.vectors.as_ptr().wrapping_add(slot as usize * self.dim)
    }
    fn list0_ptr(&self, slot: u32) -> *const u8 {
        self.list0
            .as_ptr()
            .wrapping_add(slot as usize * (1 + self.m0)) as *const u8
    }
    fn list(&self, slot: u32, level: usize) -> &[AtomicU32] {
        let s = slot as usize;
        if level == 0 {
            let w = 1 + self.m0;
            &self.list0[s * w..(s + 1) * w]
        } else {
            let w = 1 + self.m;
            self.upper[s].get((level - 1) * w..level * w).unwrap_or(&[])
        }
    }
    fn cap(&self, level: usize) -> usize {
        if level == 0 {
            self.m0
        } else {
            self.m
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{encode_blob, encode_record, record_bytes};

    fn parts() -> GraphParts {
        GraphParts {
            dim: 2,
            m: 2,
            m0: 3,
            entry: Some((1, 1)),
            labels: vec![10, 11, 12],
            flags: vec![0, 0, DELETED],
            levels: vec![0, 1, 0],
            vectors: vec![0.0, 0.0, 1.0, 0.0, 2.0, 0.0],
            lists: vec![vec![vec![1]], vec![vec![0, 2], vec![]], vec![vec![1, 3]]],
        }
    }

    #[test]
    fn blob_and_overflow_decode_in_either_direction() {
        let p = parts();
        let blob = encode_blob(&p, 4);
        let rec = record_bytes(2, 3);
        let mut over = Vec::new();
        encode_record(&mut over, 13, 0, &[2, 0], 3, &[3.0, 0.0]);
        assert_eq!(over.len(), rec);
        let mut fwd = blob.clone();
        fwd.extend_from_slice(&over);
        let mut back = over.clone();
        back.extend_from_slice(&blob);
        for (bytes, backward) in [(fwd, false), (back, true)] {
            let g = SubGraph::decode(&bytes, 1, backward, 2, 2, 3, 4).unwrap();
            assert_eq!(g.labels, vec![10, 11, 12, 13]);
            assert_eq!((g.n_base, g.level(1), g.level(0)), (3, 1, 0));
            assert!(g.is_deleted(2) && !g.is_deleted(3));
            assert_eq!(g.list0_of(3), vec![2, 0]);
            assert_eq!(g.vector(3), &[3.0, 0.0]);
            let mut s = Scratch::default();
            let mut out = Vec::new();
            let dist = vectide_core::Metric::L2.distance_fn();
            g.search(dist, &[2.1, 0.0], 2, 8, &mut s, |_| true, &mut out);
            let ids: Vec<u64> = out.iter().map(|n| n.id).collect();
            assert_eq!(
                ids,
                vec![13, 11],
                "the deleted node 12 is walked, never returned"
            );
            assert!(
                SubGraph::decode(&bytes, 1, backward, 2, 2, 3, 5).is_err(),
                "another tag"
            );
            assert!(
                SubGraph::decode(&bytes, 2, backward, 2, 2, 3, 4).is_err(),
                "a lying count"
            );
        }
        // A count above the list's room in the first record: rejected. A
        // list entry outside the graph (4 nodes with the overflow: a node
        // not yet published) is left out of the list.
        let at = BlobHeader::decode(&mut ByteReader::new(&blob), 2, 2, 3)
            .unwrap()
            .records_at();
        let mut fwd = blob.clone();
        fwd.extend_from_slice(&over);
        assert_eq!(
            SubGraph::decode(&fwd, 1, false, 2, 2, 3, 4)
                .unwrap()
                .list0_of(0),
            vec![1]
        );
        let mut bad = fwd.clone();
        bad[at + 12..at + 16].copy_from_slice(&4u32.to_le_bytes());
        let e = SubGraph::decode(&bad, 1, false, 2, 2, 3, 4).err();
        assert!(
            e.is_some_and(|e| e.to_string().contains("more than its room")),
            "a count of 4 in a list of 3"
        );
        let mut ahead = fwd.clone();
        ahead[at + 12..at + 16].copy_from_slice(&2u32.to_le_bytes());
        ahead[at + 20..at + 24].copy_from_slice(&4u32.to_le_bytes());
        let g = SubGraph::decode(&ahead, 1, false, 2, 2, 3, 4).unwrap();
        assert_eq!(g.list0_of(0), vec![1], "node 4 is not published: skipped");
        let from = SubGraph::from_parts(&p);
        assert_eq!(from.labels, vec![10, 11, 12]);
        assert!(from.is_deleted(2));
    }
}
