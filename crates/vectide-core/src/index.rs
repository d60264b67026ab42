//! The [`VectorIndex`] trait: the one contract every engine implements.

use crate::error::Result;
use crate::heap::Neighbor;
use crate::metric::Metric;
use crate::seq::Seq;

/// A predicate on external ids, evaluated during the traversal: only ids for
/// which it returns `true` may appear in the results.
pub type Filter<'a> = &'a (dyn Fn(u64) -> bool + Sync);

/// Per-query knobs. Fields an engine does not use are ignored by it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SearchParams {
    /// Size of the dynamic candidate list of graph searches (HNSW's `ef`,
    /// Vamana's `L`). `None` uses the engine's default; it is raised to `k`.
    pub ef: Option<usize>,
}

impl SearchParams {
    pub fn with_ef(ef: usize) -> Self {
        SearchParams { ef: Some(ef) }
    }
}

/// Counters and sizes an engine reports.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IndexStats {
    /// Live (searchable) vectors.
    pub live: usize,
    /// Node slots holding a live or a not-yet-reclaimed deleted vector.
    pub slots_used: usize,
    /// Slots allocated (used, free or never used).
    pub capacity: usize,
    /// Deleted vectors whose slots are not reclaimed yet.
    pub pending_deletes: usize,
    /// Bytes of memory held by the index structures (approximate).
    pub memory_bytes: usize,
    /// Delete consolidations run so far.
    pub consolidations: u64,
}

/// An approximate nearest-neighbour index over `f32` vectors.
///
/// ## Sequence numbers
/// Every mutating call carries a caller-supplied operation sequence number.
/// [`VectorIndex::durable_seq`] returns a low watermark: every operation with
/// a sequence number `<= durable_seq()` that has entered the engine is durable
/// (for volatile engines: captured by the last save). Applying an operation
/// twice is harmless: an insert whose sequence number is not newer than the one
/// already recorded for its id is skipped, and deleting an absent id is a no-op.
/// A database WAL can therefore replay every record after `durable_seq()`.
pub trait VectorIndex: Send + Sync {
    /// Vector dimension.
    fn dim(&self) -> usize;
    /// Distance metric.
    fn metric(&self) -> Metric;
    /// Inserts a batch (row-major `ids.len() x dim`); an existing id is replaced
    /// (upsert). The batch is validated first: on error nothing changes.
    fn insert(&self, seq: Seq, ids: &[u64], vectors: &[f32]) -> Result<()>;
    /// Deletes ids; absent ids are ignored. Returns how many were removed.
    fn delete(&self, seq: Seq, ids: &[u64]) -> Result<usize>;
    /// Writes the `k` nearest live neighbours of `query` (closest first) into
    /// `out`, which is cleared first; reusing `out` avoids allocation.
    fn search_into(
        &self,
        query: &[f32],
        k: usize,
        params: &SearchParams,
        filter: Option<Filter<'_>>,
        out: &mut Vec<Neighbor>,
    ) -> Result<()>;
    /// Like [`VectorIndex::search_into`], returning a new vector (sized by
    /// the results found, not by `k`).
    fn search(
        &self,
        query: &[f32],
        k: usize,
        params: &SearchParams,
        filter: Option<Filter<'_>>,
    ) -> Result<Vec<Neighbor>> {
        let mut out = Vec::new();
        self.search_into(query, k, params, filter, &mut out)?;
        Ok(out)
    }
    /// Exact distances from `query` to the live ids among `ids` (absent ids
    /// are skipped), appended to `out` in the order of `ids`. Used for exact
    /// search over a small candidate set (e.g. a selective payload filter).
    /// The default reads each vector with [`VectorIndex::get`]; engines
    /// override it to read in place without allocating.
    fn distances(&self, query: &[f32], ids: &[u64], out: &mut Vec<Neighbor>) -> Result<()> {
        let mut buf = Vec::new();
        let q = crate::validate::prepare_query(self.dim(), self.metric(), query, &mut buf)?;
        let dist = self.metric().distance_fn();
        out.extend(
            ids.iter()
                .filter_map(|&id| self.get(id).map(|v| Neighbor::new(id, dist(q, &v)))),
        );
        Ok(())
    }
    /// The stored vector of an id (normalised under cosine).
    fn get(&self, id: u64) -> Option<Vec<f32>>;
    /// Whether the id is live.
    fn contains(&self, id: u64) -> bool;
    /// Number of live vectors.
    fn len(&self) -> usize;
    /// Whether the index holds no live vector.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Makes everything applied so far durable (a no-op for volatile engines
    /// without a path).
    fn flush(&self) -> Result<()>;
    /// The durability low watermark (see the trait docs).
    fn durable_seq(&self) -> Seq;
    /// Sizes and counters.
    fn stats(&self) -> IndexStats;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An index of one point, to exercise the trait's default methods.
    struct One;

    impl VectorIndex for One {
        fn dim(&self) -> usize {
            2
        }
        fn metric(&self) -> Metric {
            Metric::L2
        }
        fn insert(&self, _: Seq, _: &[u64], _: &[f32]) -> Result<()> {
            Ok(())
        }
        fn delete(&self, _: Seq, _: &[u64]) -> Result<usize> {
            Ok(0)
        }
        fn search_into(
            &self,
            _: &[f32],
            k: usize,
            _: &SearchParams,
            _: Option<Filter<'_>>,
            out: &mut Vec<Neighbor>,
        ) -> Result<()> {
            out.clear();
            out.extend([Neighbor::new(7, 0.5)].into_iter().take(k));
            Ok(())
        }
        fn get(&self, _: u64) -> Option<Vec<f32>> {
            None
        }
        fn contains(&self, id: u64) -> bool {
            id == 7
        }
        fn len(&self) -> usize {
            1
        }
        fn flush(&self) -> Result<()> {
            Ok(())
        }
        fn durable_seq(&self) -> Seq {
            0
        }
        fn stats(&self) -> IndexStats {
            IndexStats::default()
        }
    }

    #[test]
    fn search_allocates_by_the_results_not_by_k() {
        // Reserving `k` entries up front would abort the process here.
        let got = One
            .search(&[0.0, 0.0], usize::MAX / 2, &SearchParams::default(), None)
            .unwrap();
        assert_eq!(got, vec![Neighbor::new(7, 0.5)]);
        assert!(got.capacity() < 64);
    }
}
