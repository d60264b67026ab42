//! A sparse vector: term indices (u32, as Qdrant's) with their weights,
//! checked once where it enters and kept sorted by index.

use vectide_core::{Error, Result};

/// Most terms one sparse vector may hold (a bound on what one point or one
/// query may make the index allocate).
pub const MAX_NNZ: usize = 1 << 16;

/// A sparse vector with unique indices in ascending order and finite
/// values (build one with [`SparseVector::new`]).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SparseVector {
    indices: Vec<u32>,
    values: Vec<f32>,
}

impl SparseVector {
    /// Checks and sorts: equal lengths, no index twice, finite values, at
    /// most [`MAX_NNZ`] terms. The error names the problem and, where
    /// there is one, the position.
    pub fn new(indices: Vec<u32>, values: Vec<f32>) -> Result<SparseVector> {
        if indices.len() != values.len() {
            return Err(Error::invalid(format!(
                "a sparse vector needs as many values as indices, got {} indices and {} values",
                indices.len(),
                values.len()
            )));
        }
        if indices.len() > MAX_NNZ {
            return Err(Error::invalid(format!(
                "a sparse vector holds at most {MAX_NNZ} terms, got {}",
                indices.len()
            )));
        }
        if let Some(i) = values.iter().position(|v| !v.is_finite()) {
            return Err(Error::invalid(format!(
                "sparse vector values must be finite, values[{i}] is {}",
                values[i]
            )));
        }
        let sorted = indices.windows(2).all(|w| w[0] < w[1]);
        let (indices, values) = if sorted {
            (indices, values)
        } else {
            let mut pairs: Vec<(u32, f32)> = indices.into_iter().zip(values).collect();
            pairs.sort_unstable_by_key(|p| p.0);
            if let Some(w) = pairs.windows(2).find(|w| w[0].0 == w[1].0) {
                return Err(Error::invalid(format!(
                    "sparse vector indices must be unique, {} appears twice",
                    w[0].0
                )));
            }
            pairs.into_iter().unzip()
        };
        Ok(SparseVector { indices, values })
    }

    pub fn indices(&self) -> &[u32] {
        &self.indices
    }

    pub fn values(&self) -> &[f32] {
        &self.values
    }

    pub fn len(&self) -> usize {
        self.indices.len()
    }

    pub fn is_empty(&self) -> bool {
        self.indices.is_empty()
    }

    /// The dot product with `other`, or `None` when they share no index
    /// (Qdrant scores only points that share a term with the query).
    /// Accumulated in f64 in index order.
    pub fn dot(&self, other: &SparseVector) -> Option<f32> {
        let (mut i, mut j, mut sum, mut overlap) = (0, 0, 0f64, false);
        while i < self.indices.len() && j < other.indices.len() {
            match self.indices[i].cmp(&other.indices[j]) {
                std::cmp::Ordering::Less => i += 1,
                std::cmp::Ordering::Greater => j += 1,
                std::cmp::Ordering::Equal => {
                    sum += f64::from(self.values[i]) * f64::from(other.values[j]);
                    overlap = true;
                    i += 1;
                    j += 1;
                }
            }
        }
        overlap.then_some(sum as f32)
    }

    /// The same vector with each value multiplied by `weight(index)`
    /// (clamped to the finite f32 range).
    pub fn reweighted(&self, weight: impl Fn(u32) -> f64) -> SparseVector {
        SparseVector {
            indices: self.indices.clone(),
            values: self
                .indices
                .iter()
                .zip(&self.values)
                // A weight past f32's range is clamped, so that no score
                // becomes infinite (or NaN against a zero).
                .map(|(&t, &v)| {
                    (f64::from(v) * weight(t)).clamp(-f64::from(f32::MAX), f64::from(f32::MAX))
                        as f32
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_sorts_and_refuses_bad_vectors() {
        let v = SparseVector::new(vec![5, 1, 3], vec![0.5, 1.0, -2.0]).unwrap();
        assert_eq!(v.indices(), &[1, 3, 5]);
        assert_eq!(v.values(), &[1.0, -2.0, 0.5]);
        let e = SparseVector::new(vec![1, 2], vec![1.0]).unwrap_err();
        assert!(e.to_string().contains("as many values"), "{e}");
        let e = SparseVector::new(vec![2, 1, 2], vec![1.0, 1.0, 1.0]).unwrap_err();
        assert!(e.to_string().contains("2 appears twice"), "{e}");
        let e = SparseVector::new(vec![1, 2], vec![1.0, f32::NAN]).unwrap_err();
        assert!(e.to_string().contains("values[1]"), "{e}");
    }

    #[test]
    fn dot_is_none_without_overlap() {
        let a = SparseVector::new(vec![1, 4], vec![2.0, 3.0]).unwrap();
        let b = SparseVector::new(vec![4, 9], vec![0.0, 1.0]).unwrap();
        let c = SparseVector::new(vec![2], vec![1.0]).unwrap();
        assert_eq!(a.dot(&b), Some(0.0));
        assert_eq!(a.dot(&c), None);
    }
}
