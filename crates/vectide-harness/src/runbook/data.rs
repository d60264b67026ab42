//! The vectors a runbook runs on: the dataset's rows (in the runbook's row
//! order) and its queries, borrowed from whoever loaded them (the CLI's
//! reader, or NumPy arrays through the extension).

use std::ops::Range;
use vectide_core::Metric;

/// Rows and queries of one dimension and metric (`cosine` rows arrive
/// as they are: the engines normalise them).
#[derive(Clone, Copy)]
pub struct Data<'a> {
    pub dim: usize,
    pub metric: Metric,
    /// `n × dim`, row-major.
    pub rows: &'a [f32],
    /// `nq × dim`, row-major: every search step asks all of them.
    pub queries: &'a [f32],
}

impl<'a> Data<'a> {
    /// Checks the shapes: whole rows, at least one query.
    pub fn new(
        dim: usize,
        metric: Metric,
        rows: &'a [f32],
        queries: &'a [f32],
    ) -> Result<Self, String> {
        vectide_core::limits::check_dim(dim).map_err(|e| e.to_string())?;
        if !rows.len().is_multiple_of(dim) || !queries.len().is_multiple_of(dim) {
            return Err(format!(
                "rows ({} values) and queries ({} values) must hold whole {dim}-d vectors",
                rows.len(),
                queries.len()
            ));
        }
        if queries.is_empty() {
            return Err("no queries: a search step needs at least one".into());
        }
        Ok(Self {
            dim,
            metric,
            rows,
            queries,
        })
    }

    pub fn n_rows(&self) -> usize {
        self.rows.len() / self.dim
    }

    pub fn n_queries(&self) -> usize {
        self.queries.len() / self.dim
    }

    /// Rows `r` as one slice (the plan was checked against [`Self::n_rows`]).
    pub fn slice(&self, r: &Range<usize>) -> &'a [f32] {
        &self.rows[r.start * self.dim..r.end * self.dim]
    }
}

/// The ids of a range of rows (ids are row numbers).
pub fn ids(r: &Range<usize>) -> Vec<u64> {
    (r.start as u64..r.end as u64).collect()
}
