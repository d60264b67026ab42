//! # vectide-graph
//!
//! What graph indexes share, written once: the [`Graph`] trait (vectors and
//! atomic neighbour lists of a slot, whatever holds them), the best-first
//! layer search with an admission predicate (filtered-out and deleted nodes
//! are walked through but never returned) and greedy descent
//! ([`search`]), and neighbour selection and insert planning ([`prune`]:
//! HNSW's heuristic, its α-rule generalisation, the plan of a new node's
//! lists and the back-link decision), the in-neighbour repair of delete
//! consolidation ([`repair`]) and the HNSW family's parameters
//! ([`hnsw_params`]).
//!
//! Used by the `hnsw` and `p-hnsw` engines; the graph engines to come
//! (FreshVamana, d-HNSW) build on the same pieces.

pub mod codes;
pub mod core;
pub mod graph;
pub mod hnsw_params;
pub mod mem;
pub mod prune;
pub mod qsearch;
pub mod repair;
pub mod search;
pub mod slots;

pub use graph::{store_list, Graph};
pub use hnsw_params::HnswParams;
pub use search::Scratch;

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;
    use vectide_core::heap::Candidate;
    use vectide_core::Metric;

    /// Points on a line, each linked to every other (one layer): small
    /// enough that the exact answer is obvious.
    struct Line {
        vecs: Vec<[f32; 2]>,
        lists: Vec<Vec<AtomicU32>>,
    }

    impl Line {
        fn new(n: usize) -> Line {
            let vecs: Vec<[f32; 2]> = (0..n).map(|i| [i as f32, 0.0]).collect();
            let lists = (0..n)
                .map(|s| {
                    let list: Vec<AtomicU32> = (0..n).map(|_| AtomicU32::new(0)).collect();
                    let ids: Vec<u32> = (0..n as u32).filter(|&o| o as usize != s).collect();
                    store_list(&list, &ids);
                    list
                })
                .collect();
            Line { vecs, lists }
        }
    }

    impl Graph for Line {
        fn slots(&self) -> usize {
            self.vecs.len()
        }
        fn vector(&self, slot: u32) -> &[f32] {
            &self.vecs[slot as usize]
        }
        fn vector_ptr(&self, slot: u32) -> *const f32 {
            self.vecs[slot as usize].as_ptr()
        }
        fn list0_ptr(&self, slot: u32) -> *const u8 {
            self.lists[slot as usize].as_ptr().cast()
        }
        fn list(&self, slot: u32, level: usize) -> &[AtomicU32] {
            if level == 0 {
                &self.lists[slot as usize]
            } else {
                &[]
            }
        }
        fn cap(&self, _: usize) -> usize {
            self.vecs.len() - 1
        }
    }

    #[test]
    fn knn_is_exact_on_a_small_graph_and_admission_filters_without_cutting() {
        let g = Line::new(12);
        let dist = Metric::L2.distance_fn();
        let mut s = Scratch::default();
        search::knn(&g, dist, &[6.2, 0.0], Some((0, 0)), 8, &mut s, |_| true);
        let got: Vec<u32> = s.sorted.iter().take(3).map(|c| c.node).collect();
        assert_eq!(got, vec![6, 7, 5]);
        // Odd slots only: even ones are still walked through.
        search::knn(&g, dist, &[6.2, 0.0], Some((0, 0)), 8, &mut s, |x| {
            x % 2 == 1
        });
        let got: Vec<u32> = s.sorted.iter().take(3).map(|c| c.node).collect();
        assert_eq!(got, vec![7, 5, 9]);
        search::knn(&g, dist, &[6.2, 0.0], None, 8, &mut s, |_| true);
        assert!(s.sorted.is_empty(), "no entry point: no result");
    }

    #[test]
    fn the_heuristic_keeps_diverse_neighbours_and_alpha_keeps_more() {
        let g = Line::new(12);
        let dist = Metric::L2.distance_fn();
        // Base point 0: candidates 1, 2, 3 all lie beyond 1 on the line, so
        // HNSW's rule (α = 1) keeps only 1; a larger α keeps more.
        let cands: Vec<Candidate> = [1u32, 2, 3]
            .iter()
            .map(|&c| Candidate::new(dist(g.vector(0), g.vector(c)), c))
            .collect();
        let mut out = Vec::new();
        prune::select_heuristic(&g, dist, &cands, 3, &mut out);
        assert_eq!(out, vec![1]);
        prune::select_alpha(&g, dist, &cands, 3, 4.0, &mut out);
        assert_eq!(out, vec![1, 2]);
    }

    #[test]
    fn the_expanded_set_is_what_the_search_expanded_and_robust_prune_merges_the_old_list() {
        let g = Line::new(12);
        let dist = Metric::L2.distance_fn();
        let mut s = Scratch::default();
        let q = [3.1, 0.0];
        let entry = [Candidate::new(dist(&q, g.vector(0)), 0)];
        search::search_layer_expanded(&g, dist, &q, &entry, 2, 0, &mut s, |_| true);
        // From 0 every node is a neighbour: 0 is expanded, then the top 2
        // (3 and 4, the farther of which ties the threshold), and nothing
        // farther.
        let expanded: Vec<u32> = s.expanded.iter().map(|c| c.node).collect();
        assert_eq!(expanded, vec![0, 3, 4]);
        // The plain search records nothing.
        s.expanded.clear();
        search::search_layer(&g, dist, &q, &entry, 2, 0, &mut s, |_| true);
        assert!(s.expanded.is_empty());
        // RobustPrune of node 6 over {4, 5, 9} and its own list {7, 8}, 8
        // refused: ranked 5, 7, 4, 9; α = 1 keeps 5 and 7 only (4 lies
        // behind 5, 9 behind 7); α = 4 keeps all four (4·d(5, 4) = 4 ≥
        // d(6, 4) = 4; 4·d(7, 9) = 16 ≥ d(6, 9) = 9).
        store_list(g.list(6, 0), &[7, 8]);
        let (mut pool, mut ranked, mut out) = (Vec::new(), Vec::new(), Vec::new());
        let keep = |x: u32| x != 8;
        prune::robust_prune(
            &g,
            dist,
            6,
            &[4, 5, 9, 6],
            keep,
            1.0,
            10,
            &mut pool,
            &mut ranked,
            &mut out,
        );
        assert_eq!(out, vec![5, 7]);
        prune::robust_prune(
            &g,
            dist,
            6,
            &[4, 5, 9],
            keep,
            4.0,
            10,
            &mut pool,
            &mut ranked,
            &mut out,
        );
        assert_eq!(out, vec![5, 7, 4, 9]);
        prune::robust_prune(
            &g,
            dist,
            6,
            &[4, 5, 9],
            keep,
            4.0,
            3,
            &mut pool,
            &mut ranked,
            &mut out,
        );
        assert_eq!(out, vec![5, 7, 4], "at most r");
    }

    #[test]
    fn repair_keeps_survivors_and_refills_from_the_dead_neighbours_lists() {
        // Node 6 names 5, 7 and the dead 8; 8's list names 9 and 10.
        let g = Line::new(12);
        let dist = Metric::L2.distance_fn();
        store_list(g.list(6, 0), &[5, 7, 8]);
        store_list(g.list(8, 0), &[6, 9, 10, 3]);
        let dead = |x: u32| x == 8;
        let mut sc = repair::RepairScratch::default();
        assert!(
            !repair::repair_list(&g, dist, 5, 0, dead, 1.0, &mut sc) || {
                // 5's list (every other node) names 8 too: repaired, 8 gone.
                !sc.kept().contains(&8)
            }
        );
        assert!(repair::repair_list(&g, dist, 6, 0, dead, 1.0, &mut sc));
        // Survivors first; 9, 10 and 3 all lie behind a kept neighbour on
        // the line, so HNSW's rule (α = 1) admits none of them.
        assert_eq!(sc.kept(), &[5, 7]);
        // α = 4 admits 3 and 9 (both at squared distance 9, ties by id) but
        // not 10: 4·d(9, 10) = 4 < d(6, 10) = 16.
        assert!(repair::repair_list(&g, dist, 6, 0, dead, 4.0, &mut sc));
        assert_eq!(sc.kept(), &[5, 7, 3, 9]);
        // A list without dead neighbours is left alone.
        store_list(g.list(7, 0), &[6, 9]);
        assert!(!repair::repair_list(&g, dist, 7, 0, dead, 1.0, &mut sc));
    }
}
