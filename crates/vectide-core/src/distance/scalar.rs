//! Portable reference kernels.
//!
//! These are the fallback on CPUs without a supported SIMD extension and the
//! reference the SIMD kernels are tested against. Each kernel keeps eight
//! independent partial sums (one per lane of a chunk of eight), which breaks
//! the serial dependency of a naive fold so that LLVM can vectorise the loop
//! with whatever the compilation target guarantees (SSE2 on x86-64, NEON on
//! aarch64). The summation order therefore differs from a left-to-right fold
//! and from the SIMD kernels: compare results with a tolerance, never exactly.

use super::{check_len, Kernels};

/// Lanes per chunk, i.e. the number of independent accumulators.
const LANES: usize = 8;

/// The scalar kernel set.
pub(super) const KERNELS: Kernels = Kernels {
    dot,
    l2_sq,
    neg_dot,
    one_minus_dot,
};

/// Adds the eight partial sums pairwise (a balanced tree keeps the rounding
/// error small and the dependency chain short).
#[inline(always)]
fn reduce(acc: [f32; LANES]) -> f32 {
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]))
}

/// Inner product.
#[inline]
pub(super) fn dot(a: &[f32], b: &[f32]) -> f32 {
    check_len(a, b);
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let ca = a.chunks_exact(LANES);
    let cb = b.chunks_exact(LANES);
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    let mut acc = [0.0f32; LANES];
    for (xa, xb) in ca.zip(cb) {
        for ((s, x), y) in acc.iter_mut().zip(xa).zip(xb) {
            *s += x * y;
        }
    }
    reduce(acc) + tail
}

/// Squared Euclidean distance.
#[inline]
pub(super) fn l2_sq(a: &[f32], b: &[f32]) -> f32 {
    check_len(a, b);
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let ca = a.chunks_exact(LANES);
    let cb = b.chunks_exact(LANES);
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| (x - y) * (x - y))
        .sum();
    let mut acc = [0.0f32; LANES];
    for (xa, xb) in ca.zip(cb) {
        for ((s, x), y) in acc.iter_mut().zip(xa).zip(xb) {
            let d = x - y;
            *s += d * d;
        }
    }
    reduce(acc) + tail
}

/// `-dot(a, b)`.
fn neg_dot(a: &[f32], b: &[f32]) -> f32 {
    -dot(a, b)
}

/// `1 - dot(a, b)`.
fn one_minus_dot(a: &[f32], b: &[f32]) -> f32 {
    1.0 - dot(a, b)
}
