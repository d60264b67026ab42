//! The arrays of a built graph, for an engine that lays a graph out in
//! storage of its own (d-HNSW writes each partition's sub-HNSW into a
//! memory node's region). Builds there go through this crate's builder;
//! the export copies the result out.

use crate::state::{unpack_entry, Hnsw};
use std::sync::atomic::Ordering;

/// A graph's nodes `0..n` (slot order): label, level, vector and one
/// neighbour list per level (`lists[node][level]`), and the entry point
/// `(node, top level)`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GraphExport {
    pub dim: usize,
    /// Out-degree bound on layers >= 1 (layer 0 holds `m0`).
    pub m: usize,
    pub m0: usize,
    pub entry: Option<(u32, usize)>,
    pub labels: Vec<u64>,
    pub levels: Vec<u8>,
    /// Row-major `n x dim` (normalised under the cosine metric, as stored).
    pub vectors: Vec<f32>,
    pub lists: Vec<Vec<Vec<u32>>>,
}

impl Hnsw {
    /// Copies the graph out; `None` when a slot below the allocator's end is
    /// not live (a graph with deletes or freed slots: export a fresh build).
    pub fn export(&self) -> Option<GraphExport> {
        let _pause = self.core.mutate.write();
        let store = self.core.store.read();
        let n = self.core.slots_used();
        let mut out = GraphExport {
            dim: store.dim,
            m: store.m,
            m0: store.m0,
            entry: unpack_entry(self.entry.load(Ordering::Acquire)),
            ..GraphExport::default()
        };
        for slot in 0..n as u32 {
            if !store.is_live(slot) {
                return None;
            }
            let level = store.level(slot);
            out.labels.push(store.label(slot));
            out.levels.push(level as u8);
            out.vectors.extend_from_slice(store.vector(slot));
            out.lists.push(
                (0..=level)
                    .map(|l| {
                        let list = store.list(slot, l);
                        let c = (list[0].load(Ordering::Acquire) as usize).min(list.len() - 1);
                        list[1..=c]
                            .iter()
                            .map(|a| a.load(Ordering::Acquire))
                            .collect()
                    })
                    .collect(),
            );
        }
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vectide_core::{Metric, VectorIndex};
    use vectide_graph::HnswParams;

    #[test]
    fn a_fresh_build_exports_every_node_with_lists_inside_the_graph() {
        let dim = 4;
        let n = 300;
        let data: Vec<f32> = (0..n * dim).map(|i| ((i * 37) % 101) as f32).collect();
        let labels: Vec<u64> = (0..n as u64).map(|i| 1000 + i).collect();
        let h = Hnsw::new(dim, Metric::L2, HnswParams::default()).unwrap();
        h.insert(1, &labels, &data).unwrap();
        let g = h.export().expect("a fresh build exports");
        assert_eq!(g.labels.len(), n);
        assert_eq!(g.vectors.len(), n * dim);
        let mut seen = g.labels.clone();
        seen.sort_unstable();
        assert_eq!(seen, labels);
        let (ep, top) = g.entry.unwrap();
        assert_eq!(g.levels[ep as usize] as usize, top);
        for (node, lists) in g.lists.iter().enumerate() {
            assert_eq!(lists.len(), g.levels[node] as usize + 1);
            assert!(!lists[0].is_empty(), "node {node} has no layer-0 edge");
            for l in lists.iter().flatten() {
                assert!((*l as usize) < n);
            }
        }
        h.delete(2, &[1000]).unwrap();
        assert!(
            h.export().is_none(),
            "a graph with a delete is not exported"
        );
    }
}
