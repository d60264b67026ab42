//! Distance kernels. PLACEHOLDER (scalar only) — being replaced by the SIMD
//! implementation with runtime dispatch.

use crate::metric::DistanceFn;

pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}
pub fn l2_sq(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum()
}
pub fn l2_sq_fn() -> DistanceFn {
    l2_sq
}
pub fn neg_dot_fn() -> DistanceFn {
    |a, b| -dot(a, b)
}
pub fn one_minus_dot_fn() -> DistanceFn {
    |a, b| 1.0 - dot(a, b)
}
pub fn norm_sq(a: &[f32]) -> f32 {
    dot(a, a)
}
pub fn active_isa() -> &'static str {
    "scalar"
}
#[inline(always)]
pub fn prefetch<T>(_p: *const T) {}
