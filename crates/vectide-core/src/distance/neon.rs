//! aarch64 NEON kernels (4 lanes).
//!
//! NEON is part of the compilation target's baseline (this module is only
//! compiled when `target_feature = "neon"` is enabled at build time), so no
//! runtime detection is needed: the `#[target_feature(enable = "neon")]`
//! kernels are sound to call from anywhere in such a build.
//!
//! Same shape as the x86 kernels: four independent accumulators in the main
//! loop, at most one two-vector and one one-vector step for the remainder, and
//! a scalar tail of at most three elements (NEON has no masked loads).

use std::arch::aarch64::*;

use super::{check_len, Kernels};

/// The NEON kernel set.
pub(super) const KERNELS: Kernels = Kernels {
    dot,
    l2_sq,
    neg_dot,
    one_minus_dot,
};

/// One accumulation step: `acc + x*y` (dot) or `acc + (x-y)^2` (L2).
#[inline]
#[target_feature(enable = "neon")]
fn step<const L2: bool>(acc: float32x4_t, x: float32x4_t, y: float32x4_t) -> float32x4_t {
    if L2 {
        let d = vsubq_f32(x, y);
        vfmaq_f32(acc, d, d)
    } else {
        vfmaq_f32(acc, x, y)
    }
}

/// Dot product (`L2 = false`) or squared L2 distance (`L2 = true`) over the
/// first `min(a.len(), b.len())` elements.
#[target_feature(enable = "neon")]
fn kernel<const L2: bool>(a: &[f32], b: &[f32]) -> f32 {
    const W: usize = 4;
    let n = a.len().min(b.len());
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let mut acc0 = vdupq_n_f32(0.0);
    let mut acc1 = vdupq_n_f32(0.0);
    let mut acc2 = vdupq_n_f32(0.0);
    let mut acc3 = vdupq_n_f32(0.0);
    let mut i = 0;
    while i + 4 * W <= n {
        // SAFETY: `i + 4W <= n <= len` of both slices, so the four 4-lane
        // loads at `i`, `i+W`, `i+2W`, `i+3W` stay within both slices
        // (`vld1q_f32` has no alignment requirement beyond that of `f32`).
        unsafe {
            acc0 = step::<L2>(acc0, vld1q_f32(pa.add(i)), vld1q_f32(pb.add(i)));
            acc1 = step::<L2>(acc1, vld1q_f32(pa.add(i + W)), vld1q_f32(pb.add(i + W)));
            acc2 = step::<L2>(
                acc2,
                vld1q_f32(pa.add(i + 2 * W)),
                vld1q_f32(pb.add(i + 2 * W)),
            );
            acc3 = step::<L2>(
                acc3,
                vld1q_f32(pa.add(i + 3 * W)),
                vld1q_f32(pb.add(i + 3 * W)),
            );
        }
        i += 4 * W;
    }
    if i + 2 * W <= n {
        // SAFETY: `i + 2W <= n`: both 4-lane loads per slice are in bounds.
        unsafe {
            acc0 = step::<L2>(acc0, vld1q_f32(pa.add(i)), vld1q_f32(pb.add(i)));
            acc1 = step::<L2>(acc1, vld1q_f32(pa.add(i + W)), vld1q_f32(pb.add(i + W)));
        }
        i += 2 * W;
    }
    if i + W <= n {
        // SAFETY: `i + W <= n`: the 4-lane load per slice is in bounds.
        unsafe {
            acc2 = step::<L2>(acc2, vld1q_f32(pa.add(i)), vld1q_f32(pb.add(i)));
        }
        i += W;
    }
    let mut sum = vaddvq_f32(vaddq_f32(vaddq_f32(acc0, acc1), vaddq_f32(acc2, acc3)));
    for (x, y) in a[i..n].iter().zip(&b[i..n]) {
        sum += if L2 { (x - y) * (x - y) } else { x * y };
    }
    sum
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    check_len(a, b);
    // SAFETY: NEON is enabled for the whole build (module `cfg`), so the
    // CPU running this code supports it; the kernel bounds every load.
    unsafe { kernel::<false>(a, b) }
}

fn l2_sq(a: &[f32], b: &[f32]) -> f32 {
    check_len(a, b);
    // SAFETY: NEON is enabled for the whole build (module `cfg`), so the
    // CPU running this code supports it; the kernel bounds every load.
    unsafe { kernel::<true>(a, b) }
}

fn neg_dot(a: &[f32], b: &[f32]) -> f32 {
    check_len(a, b);
    // SAFETY: NEON is enabled for the whole build (module `cfg`), so the
    // CPU running this code supports it; the kernel bounds every load.
    -unsafe { kernel::<false>(a, b) }
}

fn one_minus_dot(a: &[f32], b: &[f32]) -> f32 {
    check_len(a, b);
    // SAFETY: NEON is enabled for the whole build (module `cfg`), so the
    // CPU running this code supports it; the kernel bounds every load.
    1.0 - unsafe { kernel::<false>(a, b) }
}
