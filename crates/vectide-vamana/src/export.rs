//! A compact copy of the graph for FreshDiskANN's long-term index: the
//! live nodes and the frozen start node, renumbered `0..n` in slot order,
//! with their vectors, labels and lists (edges to nodes left out dropped).

use crate::engine::FreshVamana;
use vectide_core::Metric;
use vectide_graph::mem::{FROZEN, LIVE};
use vectide_graph::Graph;

/// The label the frozen start node carries in an export.
pub const START_LABEL: u64 = u64::MAX - 1;

/// See the module docs.
#[derive(Debug, Clone, PartialEq)]
pub struct GraphExport {
    pub dim: usize,
    pub metric: Metric,
    /// The room of a list: `⌈1.3·r⌉` (back-edges may fill a list past `r`
    /// until its next prune, as DiskANN's graph slack allows).
    pub max_degree: usize,
    /// Per node: the user's id, [`START_LABEL`] for the start node.
    pub labels: Vec<u64>,
    /// Per node: the sequence number of the operation that wrote it.
    pub seqs: Vec<u64>,
    /// `n × dim` (normalised under cosine, as stored).
    pub vectors: Vec<f32>,
    /// Per node: out-neighbours, as export numbers.
    pub lists: Vec<Vec<u32>>,
    /// The start node's number (`None` for an empty index).
    pub start: Option<u32>,
    /// The highest sequence number the export contains.
    pub durable_seq: u64,
}

impl GraphExport {
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    pub fn vector(&self, i: usize) -> &[f32] {
        &self.vectors[i * self.dim..(i + 1) * self.dim]
    }
}

impl FreshVamana {
    /// The graph as it is now (inserts and deletes wait; searches go on).
    /// Nodes in the DeleteList are left out with their edges: consolidate
    /// first (`maintain`) for a graph repaired around them.
    pub fn export_graph(&self) -> GraphExport {
        // `mutate` shuts out inserts (the only allocators), so reading the
        // allocator after the store lock cannot deadlock with one.
        let _exclusive = self.core.mutate.write();
        let used = self.core.alloc.lock().next;
        let store = self.core.store.read();
        let start = self.start_slot();
        let mut number = vec![u32::MAX; used as usize];
        let mut slots = Vec::new();
        for s in 0..used {
            let st = store.state(s);
            if st == LIVE || st == FROZEN {
                number[s as usize] = slots.len() as u32;
                slots.push(s);
            }
        }
        let dim = self.core.dim;
        let mut out = GraphExport {
            dim,
            metric: self.core.metric,
            max_degree: store.cap(0),
            labels: Vec::with_capacity(slots.len()),
            seqs: Vec::with_capacity(slots.len()),
            vectors: Vec::with_capacity(slots.len() * dim),
            lists: Vec::with_capacity(slots.len()),
            start: start.map(|s| number[s as usize]).filter(|&n| n != u32::MAX),
            durable_seq: self.core.seqs.watermark(),
        };
        let mut list = Vec::new();
        for &s in &slots {
            out.labels.push(if store.state(s) == FROZEN {
                START_LABEL
            } else {
                store.label(s)
            });
            out.seqs.push(store.seq(s));
            out.vectors.extend_from_slice(store.vector(s));
            store.neighbors_into(s, 0, &mut list);
            out.lists.push(
                list.iter()
                    .map(|&n| number.get(n as usize).copied().unwrap_or(u32::MAX))
                    .filter(|&n| n != u32::MAX)
                    .collect(),
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use crate::{FreshVamana, VamanaParams};
    use vectide_core::{Metric, VectorIndex};

    #[test]
    fn export_renumbers_live_nodes_and_drops_deleted_ones() {
        let dim = 4;
        let v = FreshVamana::new(dim, Metric::L2, VamanaParams::default()).unwrap();
        let data: Vec<f32> = (0..200 * dim).map(|i| ((i * 7919) % 101) as f32).collect();
        let ids: Vec<u64> = (0..200).map(|i| 1000 + i).collect();
        v.insert(1, &ids, &data).unwrap();
        v.delete(2, &[1000, 1001]).unwrap();
        let g = v.export_graph();
        assert_eq!(g.len(), 199, "198 live nodes and the start node");
        let start = g.start.unwrap() as usize;
        assert_eq!(g.labels[start], super::START_LABEL);
        assert!(!g.labels.contains(&1000) && !g.labels.contains(&1001));
        for (i, l) in g.lists.iter().enumerate() {
            assert!(
                l.len() <= g.max_degree
                    && l.iter().all(|&n| (n as usize) < g.len() && n as usize != i)
            );
        }
        let i = g.labels.iter().position(|&l| l == 1005).unwrap();
        assert_eq!(g.vector(i), &data[5 * dim..6 * dim]);
        assert_eq!(g.durable_seq, 2);
    }
}
