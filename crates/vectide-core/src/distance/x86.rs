//! x86-64 kernels: AVX2 + FMA (8 lanes) and AVX-512F (16 lanes).
//!
//! # Soundness
//!
//! The kernels are `#[target_feature]` functions: running one on a CPU that
//! lacks those features is undefined behaviour. A `#[target_feature]` function
//! cannot be coerced to the safe [`DistanceFn`](crate::metric::DistanceFn)
//! pointer directly, so each kernel gets a safe wrapper that calls it in an
//! `unsafe` block. Those wrappers are private to this module and the only way
//! to obtain them is through [`avx2_kernels`] and [`avx512_kernels`], which
//! hand them out only after `is_x86_feature_detected!` confirmed the features
//! on the running CPU.
//!
//! Every load is either an unaligned full-width load whose last lane lies
//! before `n = min(a.len(), b.len())`, or a masked load (`VMASKMOVPS`, or
//! `VMOVUPS` with a zeroing mask) from an in-bounds address whose enabled
//! lanes lie before `n`: masked-off lanes are not accessed and cannot fault.
//!
//! # Shape
//!
//! One generic skeleton per ISA, instantiated for the inner product
//! (`L2 = false`) and the squared distance (`L2 = true`): a main loop over
//! four vectors per operand with four independent accumulators (hiding the
//! FMA latency); then at most one two-vector step, one one-vector step and one
//! masked step for the remainder, each into a different accumulator; and a
//! final tree reduction.
//!
//! Which element goes into which accumulator depends only on its index, never
//! on the address: results are bit-identical wherever the operands live and
//! symmetric in `a` and `b`. (Peeling up to an alignment boundary makes
//! misaligned inputs measurably faster, as 64-byte loads that straddle cache
//! lines are expensive, but the rounding would then depend on the
//! allocation; aligning the vector storage to 64 bytes gets the same speed
//! without that.)

use std::arch::x86_64::*;

use super::Kernels;

/// The AVX2 + FMA kernels, if the running CPU supports both.
pub(super) fn avx2_kernels() -> Option<Kernels> {
    (is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")).then_some(avx2::KERNELS)
}

/// The AVX-512F kernels, if the running CPU supports AVX-512F.
pub(super) fn avx512_kernels() -> Option<Kernels> {
    is_x86_feature_detected!("avx512f").then_some(avx512::KERNELS)
}

/// Generates a module of safe wrappers around one ISA's generic kernel.
///
/// Must only be expanded for kernels whose target features are checked by the
/// function that hands out the module's `KERNELS` (see the module docs).
macro_rules! safe_wrappers {
    ($module:ident, $kernel:ident) => {
        mod $module {
            use super::super::{check_len, Kernels};

            pub(in super::super) const KERNELS: Kernels = Kernels {
                dot,
                l2_sq,
                neg_dot,
                one_minus_dot,
            };

            fn dot(a: &[f32], b: &[f32]) -> f32 {
                check_len(a, b);
                // SAFETY: this wrapper is only reachable through `KERNELS`,
                // which is handed out only after the kernel's target features
                // were detected at runtime; the kernel bounds every load by
                // `min(a.len(), b.len())`.
                unsafe { super::$kernel::<false>(a, b) }
            }

            fn l2_sq(a: &[f32], b: &[f32]) -> f32 {
                check_len(a, b);
                // SAFETY: as in `dot` above.
                unsafe { super::$kernel::<true>(a, b) }
            }

            fn neg_dot(a: &[f32], b: &[f32]) -> f32 {
                check_len(a, b);
                // SAFETY: as in `dot` above.
                -unsafe { super::$kernel::<false>(a, b) }
            }

            fn one_minus_dot(a: &[f32], b: &[f32]) -> f32 {
                check_len(a, b);
                // SAFETY: as in `dot` above.
                1.0 - unsafe { super::$kernel::<false>(a, b) }
            }
        }
    };
}

safe_wrappers!(avx2, kernel_avx2);
safe_wrappers!(avx512, kernel_avx512);

// ---------------------------------------------------------------- AVX2 + FMA

/// One accumulation step: `acc + x*y` (dot) or `acc + (x-y)^2` (L2).
#[inline]
#[target_feature(enable = "avx2,fma")]
fn step_avx2<const L2: bool>(acc: __m256, x: __m256, y: __m256) -> __m256 {
    if L2 {
        let d = _mm256_sub_ps(x, y);
        _mm256_fmadd_ps(d, d, acc)
    } else {
        _mm256_fmadd_ps(x, y, acc)
    }
}

/// A `maskload` mask enabling lanes `0..k` (`k <= 8`).
#[inline]
#[target_feature(enable = "avx2,fma")]
fn lanes_below_avx2(k: usize) -> __m256i {
    _mm256_cmpgt_epi32(
        _mm256_set1_epi32(k as i32),
        _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
    )
}

/// Horizontal sum of the eight lanes.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn hsum_avx2(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// Dot product (`L2 = false`) or squared L2 distance (`L2 = true`) over the
/// first `min(a.len(), b.len())` elements.
#[target_feature(enable = "avx2,fma")]
fn kernel_avx2<const L2: bool>(a: &[f32], b: &[f32]) -> f32 {
    const W: usize = 8;
    let n = a.len().min(b.len());
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let mut acc0 = _mm256_setzero_ps();
    let mut acc1 = _mm256_setzero_ps();
    let mut acc2 = _mm256_setzero_ps();
    let mut acc3 = _mm256_setzero_ps();
    let mut i = 0;
    while i + 4 * W <= n {
        // SAFETY: `i + 4W <= n <= len` of both slices, so the four unaligned
        // 8-lane loads at `i`, `i+W`, `i+2W`, `i+3W` stay within both slices.
        unsafe {
            acc0 = step_avx2::<L2>(acc0, _mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i)));
            acc1 = step_avx2::<L2>(
                acc1,
                _mm256_loadu_ps(pa.add(i + W)),
                _mm256_loadu_ps(pb.add(i + W)),
            );
            acc2 = step_avx2::<L2>(
                acc2,
                _mm256_loadu_ps(pa.add(i + 2 * W)),
                _mm256_loadu_ps(pb.add(i + 2 * W)),
            );
            acc3 = step_avx2::<L2>(
                acc3,
                _mm256_loadu_ps(pa.add(i + 3 * W)),
                _mm256_loadu_ps(pb.add(i + 3 * W)),
            );
        }
        i += 4 * W;
    }
    // Fewer than 4W elements are left.
    if i + 2 * W <= n {
        // SAFETY: `i + 2W <= n`: both 8-lane loads per slice are in bounds.
        unsafe {
            acc0 = step_avx2::<L2>(acc0, _mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i)));
            acc1 = step_avx2::<L2>(
                acc1,
                _mm256_loadu_ps(pa.add(i + W)),
                _mm256_loadu_ps(pb.add(i + W)),
            );
        }
        i += 2 * W;
    }
    if i + W <= n {
        // SAFETY: `i + W <= n`: the 8-lane load per slice is in bounds.
        unsafe {
            acc2 = step_avx2::<L2>(acc2, _mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i)));
        }
        i += W;
    }
    if i < n {
        // Lanes `0..n-i` (1..=7) enabled; disabled lanes load as 0.0 in both
        // operands and so contribute 0 to either sum.
        let mask = lanes_below_avx2(n - i);
        // SAFETY: `i < n`, so `pa.add(i)`/`pb.add(i)` point into the slices,
        // and only the lanes `i..n` are enabled; masked-off lanes are neither
        // read nor able to fault (VMASKMOVPS semantics).
        unsafe {
            acc3 = step_avx2::<L2>(
                acc3,
                _mm256_maskload_ps(pa.add(i), mask),
                _mm256_maskload_ps(pb.add(i), mask),
            );
        }
    }
    hsum_avx2(_mm256_add_ps(
        _mm256_add_ps(acc0, acc1),
        _mm256_add_ps(acc2, acc3),
    ))
}

// ------------------------------------------------------------------ AVX-512F

/// One accumulation step: `acc + x*y` (dot) or `acc + (x-y)^2` (L2).
#[inline]
#[target_feature(enable = "avx512f")]
fn step_avx512<const L2: bool>(acc: __m512, x: __m512, y: __m512) -> __m512 {
    if L2 {
        let d = _mm512_sub_ps(x, y);
        _mm512_fmadd_ps(d, d, acc)
    } else {
        _mm512_fmadd_ps(x, y, acc)
    }
}

/// Dot product (`L2 = false`) or squared L2 distance (`L2 = true`) over the
/// first `min(a.len(), b.len())` elements.
#[target_feature(enable = "avx512f")]
fn kernel_avx512<const L2: bool>(a: &[f32], b: &[f32]) -> f32 {
    const W: usize = 16;
    let n = a.len().min(b.len());
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let mut acc0 = _mm512_setzero_ps();
    let mut acc1 = _mm512_setzero_ps();
    let mut acc2 = _mm512_setzero_ps();
    let mut acc3 = _mm512_setzero_ps();
    let mut i = 0;
    while i + 4 * W <= n {
        // SAFETY: `i + 4W <= n <= len` of both slices, so the four unaligned
        // 16-lane loads at `i`, `i+W`, `i+2W`, `i+3W` stay within both slices.
        unsafe {
            acc0 = step_avx512::<L2>(acc0, _mm512_loadu_ps(pa.add(i)), _mm512_loadu_ps(pb.add(i)));
            acc1 = step_avx512::<L2>(
                acc1,
                _mm512_loadu_ps(pa.add(i + W)),
                _mm512_loadu_ps(pb.add(i + W)),
            );
            acc2 = step_avx512::<L2>(
                acc2,
                _mm512_loadu_ps(pa.add(i + 2 * W)),
                _mm512_loadu_ps(pb.add(i + 2 * W)),
            );
            acc3 = step_avx512::<L2>(
                acc3,
                _mm512_loadu_ps(pa.add(i + 3 * W)),
                _mm512_loadu_ps(pb.add(i + 3 * W)),
            );
        }
        i += 4 * W;
    }
    // Fewer than 4W elements are left.
    if i + 2 * W <= n {
        // SAFETY: `i + 2W <= n`: both 16-lane loads per slice are in bounds.
        unsafe {
            acc0 = step_avx512::<L2>(acc0, _mm512_loadu_ps(pa.add(i)), _mm512_loadu_ps(pb.add(i)));
            acc1 = step_avx512::<L2>(
                acc1,
                _mm512_loadu_ps(pa.add(i + W)),
                _mm512_loadu_ps(pb.add(i + W)),
            );
        }
        i += 2 * W;
    }
    if i + W <= n {
        // SAFETY: `i + W <= n`: the 16-lane load per slice is in bounds.
        unsafe {
            acc2 = step_avx512::<L2>(acc2, _mm512_loadu_ps(pa.add(i)), _mm512_loadu_ps(pb.add(i)));
        }
        i += W;
    }
    if i < n {
        // Bits `0..n-i` set (1..=15 lanes); disabled lanes load as 0.0 in
        // both operands and so contribute 0 to either sum.
        let mask: __mmask16 = (1u16 << (n - i)) - 1;
        // SAFETY: `i < n`, so `pa.add(i)`/`pb.add(i)` point into the slices,
        // and only the lanes `i..n` are enabled; masked-off lanes are neither
        // read nor able to fault (AVX-512 fault suppression).
        unsafe {
            acc3 = step_avx512::<L2>(
                acc3,
                _mm512_maskz_loadu_ps(mask, pa.add(i)),
                _mm512_maskz_loadu_ps(mask, pb.add(i)),
            );
        }
    }
    _mm512_reduce_add_ps(_mm512_add_ps(
        _mm512_add_ps(acc0, acc1),
        _mm512_add_ps(acc2, acc3),
    ))
}
