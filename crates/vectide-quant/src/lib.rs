//! Quantization and clustering, written once for every engine that needs
//! them: FreshDiskANN's long-term index (PQ codes in RAM for routing and for
//! StreamingMerge's approximate distances), SPFresh's posting centroids
//! (balanced k-means) and d-HNSW's partitions.
//!
//! - [`kmeans`]: k-means++ seeding, Lloyd iterations, and Sculley's
//!   mini-batch k-means for large training sets; [`Centroids`] assigns
//!   points to their nearest centre.
//! - [`balanced`]: k-means whose clusters are held under a size cap (a
//!   capacity-constrained assignment after Lloyd), as SPANN wants its
//!   postings, and its hierarchical form that picks SPANN's posting
//!   centroids for a target posting size.
//! - [`pq`]: product quantization: train, encode, decode, and asymmetric
//!   distance tables computed per query ([`DistanceTable`]), whose lookups
//!   dispatch at run time to an AVX2 gather kernel or the portable one.
//! - [`rabitq`]: RaBitQ codes (1-bit and extended multi-bit) with the
//!   unbiased estimator and its error bound, a fast Hadamard rotation, and
//!   fast-scan kernels that estimate 32 codes at once (AVX-512BW, AVX2 or
//!   the portable loop, chosen at run time).
//!
//! All distances inside the clustering are squared Euclidean, through
//! `vectide_core::distance`'s dispatched kernels. Every entry point checks
//! its input and returns `vectide_core::Error::InvalidInput` for a bad one;
//! nothing here panics on user input.

#![deny(clippy::undocumented_unsafe_blocks)]

pub mod balanced;
pub mod kmeans;
pub mod pq;
pub mod rabitq;

pub use balanced::{balanced_kmeans, hierarchical_balanced, BalancedParams};
pub use kmeans::{train as kmeans, Centroids, KMeansParams};
pub use pq::{DistanceTable, PqParams, ProductQuantizer, KSUB};
pub use rabitq::{Rabitq, RabitqParams};

use vectide_core::{Error, Result};

/// Checks that `data` is `n × dim` finite floats with `n >= min_rows`;
/// returns `n`.
pub(crate) fn check_rows(data: &[f32], dim: usize, min_rows: usize, what: &str) -> Result<usize> {
    if dim == 0 {
        return Err(Error::invalid(format!(
            "{what}: dimension must be at least 1"
        )));
    }
    if !data.len().is_multiple_of(dim) {
        return Err(Error::invalid(format!(
            "{what}: {} floats are not a whole number of {dim}-d rows",
            data.len()
        )));
    }
    let n = data.len() / dim;
    if n < min_rows {
        return Err(Error::invalid(format!(
            "{what}: needs at least {min_rows} rows, got {n}"
        )));
    }
    if let Some(i) = data.iter().position(|x| !x.is_finite()) {
        return Err(Error::invalid(format!(
            "{what}: row {} holds a non-finite value",
            i / dim
        )));
    }
    Ok(n)
}
