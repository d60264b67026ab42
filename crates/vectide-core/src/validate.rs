//! Checks applied to every batch before it changes anything.

use crate::distance;
use crate::error::{Error, Result};
use crate::metric::Metric;
use crate::RESERVED_ID;
use std::cell::Cell;
use std::collections::HashSet;

thread_local! {
    /// How many batches [`check_batch`] has validated on this thread.
    static BATCH_CHECKS: Cell<u64> = const { Cell::new(0) };
}

/// The number of [`check_batch`] calls so far on this thread (a test counts
/// them to show that a write path validates a batch once).
pub fn batch_checks() -> u64 {
    BATCH_CHECKS.with(Cell::get)
}

/// A batch that has been validated: whole rows, one per id, no id reserved
/// or repeated, every value finite and, under cosine, no zero vector.
/// Engines take it in [`crate::VectorIndex::insert_checked`] without
/// checking again, so a batch is validated once, where it enters.
#[derive(Clone, Copy, Debug)]
pub struct Checked<'a> {
    ids: &'a [u64],
    vectors: &'a [f32],
}

impl<'a> Checked<'a> {
    /// Validates the batch ([`check_batch`]).
    pub fn new(dim: usize, metric: Metric, ids: &'a [u64], vectors: &'a [f32]) -> Result<Self> {
        check_batch(dim, metric, ids, vectors)?;
        Ok(Self { ids, vectors })
    }

    /// A batch its caller has already validated at its own edge by the same
    /// rules: the database checks every point's vector with
    /// [`check_vector`] and gives each point an id of its own, so the rows
    /// of a record it commits need no second check. Debug builds check
    /// again, and panic on a caller that did not.
    pub fn validated_by_caller(
        dim: usize,
        metric: Metric,
        ids: &'a [u64],
        vectors: &'a [f32],
    ) -> Self {
        debug_assert!(
            check_rows(dim, metric, ids, vectors).is_ok(),
            "a batch said to be validated is not"
        );
        Self { ids, vectors }
    }

    pub fn ids(&self) -> &'a [u64] {
        self.ids
    }

    pub fn vectors(&self) -> &'a [f32] {
        self.vectors
    }
}

/// Validates a row-major batch of `ids.len()` vectors of dimension `dim`:
/// lengths agree, ids are not reserved and not repeated, values are finite and,
/// under cosine, no vector is zero.
pub fn check_batch(dim: usize, metric: Metric, ids: &[u64], vectors: &[f32]) -> Result<()> {
    BATCH_CHECKS.with(|c| c.set(c.get() + 1));
    check_rows(dim, metric, ids, vectors)
}

/// [`check_batch`] without counting.
fn check_rows(dim: usize, metric: Metric, ids: &[u64], vectors: &[f32]) -> Result<()> {
    if dim == 0 {
        return Err(Error::invalid("dimension must be at least 1"));
    }
    if !vectors.len().is_multiple_of(dim) {
        return Err(Error::DimensionMismatch {
            expected: dim,
            got: vectors.len() % dim,
        });
    }
    let rows = vectors.len() / dim;
    if rows != ids.len() {
        return Err(Error::invalid(format!(
            "{} ids but {} vectors",
            ids.len(),
            rows
        )));
    }
    let mut seen = HashSet::with_capacity(ids.len());
    for &id in ids {
        if id == RESERVED_ID {
            return Err(Error::invalid(format!(
                "id {RESERVED_ID} (2**64-1) is reserved to pad missing results"
            )));
        }
        if !seen.insert(id) {
            return Err(Error::invalid(format!("duplicate id {id} in one batch")));
        }
    }
    for (row, v) in vectors.chunks_exact(dim).enumerate() {
        check_vector(dim, metric, v).map_err(|e| match e {
            Error::InvalidInput(m) => Error::invalid(format!("vector for id {}: {m}", ids[row])),
            other => other,
        })?;
    }
    Ok(())
}

/// Validates one vector (a query or a row of a batch).
pub fn check_vector(dim: usize, metric: Metric, v: &[f32]) -> Result<()> {
    if v.len() != dim {
        return Err(Error::DimensionMismatch {
            expected: dim,
            got: v.len(),
        });
    }
    if let Some(pos) = v.iter().position(|x| !x.is_finite()) {
        return Err(Error::invalid(format!(
            "non-finite value {} at position {pos}",
            v[pos]
        )));
    }
    if metric == Metric::Cosine && distance::norm_sq(v) == 0.0 {
        return Err(Error::invalid(
            "zero vector under the cosine metric has no direction",
        ));
    }
    Ok(())
}

/// L2-normalises `v` in place (callers have rejected zero vectors).
/// A query ready for an engine: checked, and normalised into `buf` under
/// cosine (other metrics use the query as given).
pub fn prepare_query<'a>(
    dim: usize,
    metric: Metric,
    query: &'a [f32],
    buf: &'a mut Vec<f32>,
) -> Result<&'a [f32]> {
    check_vector(dim, metric, query)?;
    if metric.normalizes() {
        copy_normalized(metric, query, buf);
        Ok(buf)
    } else {
        Ok(query)
    }
}

/// Copies a row into `buf` (cleared first), normalised under cosine.
pub fn copy_normalized(metric: Metric, row: &[f32], buf: &mut Vec<f32>) {
    buf.clear();
    buf.extend_from_slice(row);
    if metric.normalizes() {
        normalize(buf);
    }
}

pub fn normalize(v: &mut [f32]) {
    let n = distance::norm_sq(v).sqrt();
    if n > 0.0 {
        let inv = 1.0 / n;
        v.iter_mut().for_each(|x| *x *= inv);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_each_kind_of_bad_batch() {
        let m = Metric::Cosine;
        assert!(check_batch(2, m, &[1], &[1.0, 0.0]).is_ok());
        assert!(matches!(
            check_batch(2, m, &[1], &[1.0, 0.0, 1.0]),
            Err(Error::DimensionMismatch { .. })
        ));
        assert!(check_batch(2, m, &[1, 2], &[1.0, 0.0]).is_err());
        assert!(check_batch(2, m, &[u64::MAX], &[1.0, 0.0]).is_err());
        assert!(check_batch(2, m, &[3, 3], &[1.0, 0.0, 0.0, 1.0]).is_err());
        assert!(check_batch(2, m, &[1], &[f32::NAN, 0.0]).is_err());
        assert!(check_batch(2, m, &[1], &[f32::INFINITY, 0.0]).is_err());
        assert!(check_batch(2, m, &[1], &[0.0, 0.0]).is_err());
        assert!(check_batch(2, Metric::L2, &[1], &[0.0, 0.0]).is_ok());
        assert!(check_batch(0, Metric::L2, &[], &[]).is_err());
    }

    #[test]
    fn normalize_gives_unit_length() {
        let mut v = [3.0f32, 4.0];
        normalize(&mut v);
        assert!((v[0] - 0.6).abs() < 1e-6 && (v[1] - 0.8).abs() < 1e-6);
    }
}
