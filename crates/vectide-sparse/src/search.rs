//! Exact top-k by dot product, document at a time, with MaxScore and
//! block-max pruning.
//!
//! The query's terms are ordered by the most each can add to a score (its
//! list's bound: the query weight times the list's largest weight, or its
//! smallest for a negative query weight, and never below 0 since a
//! document without the term gets 0 from it). Once `k` documents are held,
//! the terms whose bounds together stay below the k-th score are
//! *non-essential*: a document found only in their lists cannot enter, so
//! candidates come from the essential lists alone. A candidate's bound is
//! then tightened with the block maxima of the non-essential lists at its
//! document, and their exact weights are looked up only while the bound
//! can still reach the k-th score. The answer is the same as scoring every
//! document that shares a term with the query: only documents that
//! provably cannot enter are skipped.
//!
//! Scores are the exact dot products ([`SparseVector::dot`], f64
//! accumulation in term order, reported as f32); documents sharing no term
//! with the query are not answers (Qdrant's rule). Ties are ordered by the
//! caller's `tie` order, so that the database can break them by point id.

use crate::index::SparseIndex;
use crate::postings::{PostingList, BLOCK};
use crate::vector::SparseVector;
use std::cmp::Ordering;

/// What a search did, for tests and benchmarks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SearchStats {
    /// Postings in the query's lists (what a full scan reads).
    pub postings: usize,
    /// Candidates scored exactly.
    pub scored: usize,
    /// Candidates the filter was asked about.
    pub filtered: usize,
}

struct Cursor<'a> {
    list: &'a PostingList,
    q: f64,
    bound: f64,
    pos: usize,
}

impl Cursor<'_> {
    fn doc(&self) -> Option<u64> {
        self.list.docs().get(self.pos).copied()
    }
}

/// A held answer; the max-heap's top is the worst one.
struct Held<'t> {
    doc: u64,
    score: f32,
    tie: &'t dyn Fn(u64, u64) -> Ordering,
}

impl Held<'_> {
    /// `Less` when `self` ranks before `other`.
    fn rank(&self, other: &Self) -> Ordering {
        other
            .score
            .total_cmp(&self.score)
            .then_with(|| (self.tie)(self.doc, other.doc))
    }
}

impl PartialEq for Held<'_> {
    fn eq(&self, o: &Self) -> bool {
        self.rank(o) == Ordering::Equal
    }
}
impl Eq for Held<'_> {}
impl PartialOrd for Held<'_> {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Held<'_> {
    fn cmp(&self, o: &Self) -> Ordering {
        self.rank(o)
    }
}

/// How far below the k-th score a bound must be before it prunes: the f32
/// rounding of an exact score (2⁻²⁴ relative) must not push a pruned
/// document over it.
fn floor(theta: f32) -> f64 {
    let t = f64::from(theta);
    t - t.abs() * 1e-6 - 1e-30
}

impl SparseIndex {
    /// The `k` documents with the largest dot product with `query` (after
    /// the index's modifier) among those `accept` admits, best first, ties
    /// in `tie` order. `accept` is asked only about documents that would
    /// enter the answer.
    pub fn search(
        &self,
        query: &SparseVector,
        k: usize,
        accept: &dyn Fn(u64) -> bool,
        tie: &dyn Fn(u64, u64) -> Ordering,
    ) -> (Vec<(u64, f32)>, SearchStats) {
        let q = self.effective_query(query);
        let mut stats = SearchStats::default();
        if k == 0 {
            return (Vec::new(), stats);
        }
        let mut cursors: Vec<Cursor<'_>> = q
            .indices()
            .iter()
            .zip(q.values())
            .filter_map(|(t, &w)| {
                let list = self.lists.get(t)?;
                let q = f64::from(w);
                Some(Cursor {
                    list,
                    q,
                    bound: list.list_bound(q).max(0.0),
                    pos: 0,
                })
            })
            .collect();
        stats.postings = cursors.iter().map(|c| c.list.len()).sum();
        cursors.sort_by(|a, b| a.bound.total_cmp(&b.bound));
        // prefix[i]: the bounds of cursors[..i] together.
        let mut prefix = vec![0f64; cursors.len() + 1];
        for (i, c) in cursors.iter().enumerate() {
            prefix[i + 1] = prefix[i] + c.bound;
        }
        let mut heap: std::collections::BinaryHeap<Held<'_>> =
            std::collections::BinaryHeap::with_capacity(k + 1);
        // Cursors [..ne] are non-essential.
        let mut ne = 0usize;
        let mut block_bounds = vec![0f64; cursors.len()];
        while let Some(doc) = cursors[ne..].iter().filter_map(Cursor::doc).min() {
            let mut partial = 0f64;
            // The magnitudes summed so far: the bound's rounding error is
            // a fraction of them (weights that cancel leave a partial sum
            // far smaller than its terms).
            let mut magnitude = 0f64;
            for c in &mut cursors[ne..] {
                if c.doc() == Some(doc) {
                    let x = c.q * f64::from(c.list.weights()[c.pos]);
                    partial += x;
                    magnitude += x.abs();
                    c.pos += 1;
                }
            }
            let theta = (heap.len() == k).then(|| heap.peek().map_or(f32::MIN, |h| h.score));
            if let Some(theta) = theta {
                let floor = floor(theta) - 1e-12 * (magnitude + prefix[ne]);
                if partial + prefix[ne] < floor {
                    continue;
                }
                // Tighten with the block maxima at `doc`, then look the
                // non-essential weights up while the bound can still reach.
                let mut rest = 0f64;
                for (j, c) in cursors[..ne].iter_mut().enumerate() {
                    c.pos = c.list.seek(c.pos, doc);
                    block_bounds[j] = if c.pos < c.list.len() {
                        c.list
                            .block_bound(PostingList::block_of(c.pos), c.q)
                            .max(0.0)
                    } else {
                        0.0
                    };
                    rest += block_bounds[j];
                }
                if partial + rest < floor {
                    continue;
                }
                let mut pruned = false;
                for j in (0..ne).rev() {
                    let c = &cursors[j];
                    rest -= block_bounds[j];
                    if c.doc() == Some(doc) {
                        let x = c.q * f64::from(c.list.weights()[c.pos]);
                        partial += x;
                        magnitude += x.abs();
                    }
                    if partial + rest < floor - 1e-12 * magnitude {
                        pruned = true;
                        break;
                    }
                }
                if pruned {
                    continue;
                }
            }
            // The exact score, as a full scan computes it.
            let Some(score) = self.docs.get(&doc).and_then(|v| v.dot(&q)) else {
                continue;
            };
            stats.scored += 1;
            let held = Held { doc, score, tie };
            if heap.len() == k && heap.peek().is_some_and(|w| held.rank(w) != Ordering::Less) {
                continue;
            }
            stats.filtered += 1;
            if !accept(doc) {
                continue;
            }
            heap.push(held);
            if heap.len() > k {
                heap.pop();
            }
            if heap.len() == k {
                let theta = floor(heap.peek().map_or(f32::MIN, |h| h.score));
                while ne < cursors.len() && prefix[ne + 1] < theta {
                    ne += 1;
                }
            }
        }
        let mut out: Vec<Held<'_>> = heap.into_vec();
        out.sort();
        (out.into_iter().map(|h| (h.doc, h.score)).collect(), stats)
    }

    /// The same answer by scoring every document that shares a term with
    /// the query (the oracle of the tests and the benchmark's baseline).
    pub fn search_scan(
        &self,
        query: &SparseVector,
        k: usize,
        accept: &dyn Fn(u64) -> bool,
        tie: &dyn Fn(u64, u64) -> Ordering,
    ) -> Vec<(u64, f32)> {
        let q = self.effective_query(query);
        let mut all: Vec<(u64, f32)> = self
            .docs
            .iter()
            .filter(|(d, _)| accept(**d))
            .filter_map(|(&d, v)| v.dot(&q).map(|s| (d, s)))
            .collect();
        all.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| tie(a.0, b.0)));
        all.truncate(k);
        all
    }
}

/// Blocks of bounds a list of `n` postings keeps (for the format docs'
/// arithmetic and the benchmarks).
pub fn blocks(n: usize) -> usize {
    n.div_ceil(BLOCK)
}
