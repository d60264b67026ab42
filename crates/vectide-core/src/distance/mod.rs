//! Distance kernels with runtime CPU dispatch.
//!
//! # Kernels
//!
//! Every instruction set ([`Isa`]) provides the same [`Kernels`]: the inner
//! product, the squared Euclidean distance and the two inner-product
//! distances used by the metrics (`-dot` and `1 - dot`).
//!
//! * [`Isa::Scalar`] — portable code with eight independent accumulators
//!   (`scalar.rs`); always available and the reference for the tests.
//! * [`Isa::Avx2`] — AVX2 + FMA, 4 × 8 lanes (`x86.rs`).
//! * [`Isa::Avx512`] — AVX-512F, 4 × 16 lanes with masked tail loads (`x86.rs`).
//! * [`Isa::Neon`] — aarch64 NEON, 4 × 4 lanes (`neon.rs`).
//!
//! All kernels accept slices of any length and alignment. Both operands must
//! have the same length (checked by `debug_assert!`); in release builds a
//! length mismatch is not detected and only the first `min(a.len(), b.len())`
//! elements are used — never anything out of bounds.
//!
//! The kernels sum in different orders (and the SIMD kernels use fused
//! multiply-add), so results differ between ISAs in the last bits: compare
//! them with a tolerance relative to `Σ|aᵢbᵢ|` (or `Σ(aᵢ-bᵢ)²`).
//!
//! # Dispatch
//!
//! The best ISA of the running CPU is detected once, on first use, and its
//! function pointers are stored in a process-wide [`OnceLock`]. The `*_fn`
//! getters ([`l2_sq_fn`], [`neg_dot_fn`], [`one_minus_dot_fn`]) return those
//! plain `fn` pointers, which call the chosen kernel directly: callers that
//! keep the pointer pay no dispatch per call. The free functions [`dot`],
//! [`l2_sq`] and [`norm_sq`] go through the stored pointers (one atomic load
//! and an indirect call).
//!
//! Setting the environment variable `VECTIDE_SIMD` (see [`SIMD_ENV`]) to
//! `scalar`, `avx2`, `avx512` or `neon` forces that ISA, e.g. to compare
//! against a lower one; it is read once, at detection time, and ignored when
//! the requested ISA is not available on this CPU (`auto` or an empty value
//! mean no override; unknown values are ignored with a warning on stderr).
//! [`active_isa`] reports what was chosen.

#![deny(clippy::undocumented_unsafe_blocks)]

use std::fmt;
use std::sync::OnceLock;

use crate::metric::DistanceFn;

mod scalar;

#[cfg(target_arch = "x86_64")]
mod x86;

#[cfg(all(target_arch = "aarch64", target_feature = "neon"))]
mod neon;

/// The environment variable that forces a (lower) instruction set.
pub const SIMD_ENV: &str = "VECTIDE_SIMD";

/// An instruction set with its own kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Isa {
    /// Portable code; always available.
    Scalar,
    /// x86-64 AVX2 + FMA.
    Avx2,
    /// x86-64 AVX-512F.
    Avx512,
    /// aarch64 NEON.
    Neon,
}

impl Isa {
    /// Every ISA, in increasing order of preference within an architecture.
    pub const ALL: [Isa; 4] = [Isa::Scalar, Isa::Neon, Isa::Avx2, Isa::Avx512];

    /// The lower-case name: `"scalar"`, `"avx2"`, `"avx512"` or `"neon"`.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
            Isa::Neon => "neon",
        }
    }

    /// Preference when several are available (higher is better).
    fn rank(self) -> u8 {
        match self {
            Isa::Scalar => 0,
            Isa::Neon => 1,
            Isa::Avx2 => 2,
            Isa::Avx512 => 3,
        }
    }
}

impl fmt::Display for Isa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The kernels of one instruction set.
#[derive(Debug, Clone, Copy)]
pub struct Kernels {
    /// Inner product.
    pub dot: DistanceFn,
    /// Squared Euclidean distance.
    pub l2_sq: DistanceFn,
    /// `-dot(a, b)`.
    pub neg_dot: DistanceFn,
    /// `1 - dot(a, b)`.
    pub one_minus_dot: DistanceFn,
}

/// The kernels of `isa`, or `None` if the running CPU (or this build's target
/// architecture) does not support it. Kernels returned here are safe to call.
pub fn kernels_for(isa: Isa) -> Option<Kernels> {
    match isa {
        Isa::Scalar => Some(scalar::KERNELS),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => x86::avx2_kernels(),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => x86::avx512_kernels(),
        #[cfg(all(target_arch = "aarch64", target_feature = "neon"))]
        Isa::Neon => Some(neon::KERNELS),
        #[allow(unreachable_patterns)]
        _ => None,
    }
}

/// The ISAs usable on the running CPU, in increasing order of preference
/// (always starts with [`Isa::Scalar`]; the last one is the default choice).
pub fn available_isas() -> Vec<Isa> {
    Isa::ALL
        .into_iter()
        .filter(|&isa| kernels_for(isa).is_some())
        .collect()
}

/// Parses a value of [`SIMD_ENV`] (case-insensitive, surrounding whitespace
/// ignored): `Ok(Some(isa))` for `scalar`, `avx2`, `avx512` (or `avx512f`) and
/// `neon`; `Ok(None)` for an empty value or `auto`; `Err` otherwise.
pub fn parse_simd_override(value: &str) -> Result<Option<Isa>, String> {
    match value.trim().to_ascii_lowercase().as_str() {
        "" | "auto" => Ok(None),
        "scalar" => Ok(Some(Isa::Scalar)),
        "avx2" => Ok(Some(Isa::Avx2)),
        "avx512" | "avx512f" => Ok(Some(Isa::Avx512)),
        "neon" => Ok(Some(Isa::Neon)),
        other => Err(format!(
            "unknown {SIMD_ENV} value {other:?}: expected one of \
             \"scalar\", \"avx2\", \"avx512\", \"neon\" or \"auto\""
        )),
    }
}

/// The ISA to use: `forced` if it is available, otherwise the most preferred
/// available one (`Scalar` if `available` is empty).
fn select_isa(available: &[Isa], forced: Option<Isa>) -> Isa {
    match forced {
        Some(isa) if available.contains(&isa) => isa,
        _ => available
            .iter()
            .copied()
            .max_by_key(|isa| isa.rank())
            .unwrap_or(Isa::Scalar),
    }
}

/// The resolved ISA and its kernels.
struct Active {
    isa: Isa,
    kernels: Kernels,
}

static ACTIVE: OnceLock<Active> = OnceLock::new();

/// Detects the CPU (and reads [`SIMD_ENV`]) on first use.
#[inline]
fn active() -> &'static Active {
    ACTIVE.get_or_init(|| {
        let forced = match std::env::var(SIMD_ENV) {
            Ok(value) => parse_simd_override(&value).unwrap_or_else(|err| {
                eprintln!("vectide: ignoring {err}");
                None
            }),
            Err(_) => None,
        };
        let isa = select_isa(&available_isas(), forced);
        let kernels = kernels_for(isa).unwrap_or(scalar::KERNELS);
        Active { isa, kernels }
    })
}

/// Debug-build check of the kernels' length contract.
#[inline(always)]
fn check_len(a: &[f32], b: &[f32]) {
    debug_assert_eq!(
        a.len(),
        b.len(),
        "distance kernels need slices of equal length"
    );
}

/// Inner product `Σ aᵢbᵢ` (with the active ISA).
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    (active().kernels.dot)(a, b)
}

/// Squared Euclidean distance `Σ (aᵢ-bᵢ)²` (with the active ISA).
#[inline]
pub fn l2_sq(a: &[f32], b: &[f32]) -> f32 {
    (active().kernels.l2_sq)(a, b)
}

/// Squared L2 norm `Σ aᵢ²` (with the active ISA).
#[inline]
pub fn norm_sq(a: &[f32]) -> f32 {
    (active().kernels.dot)(a, a)
}

/// The active squared-Euclidean kernel.
pub fn l2_sq_fn() -> DistanceFn {
    active().kernels.l2_sq
}

/// The active `-dot(a, b)` kernel.
pub fn neg_dot_fn() -> DistanceFn {
    active().kernels.neg_dot
}

/// The active `1 - dot(a, b)` kernel.
pub fn one_minus_dot_fn() -> DistanceFn {
    active().kernels.one_minus_dot
}

/// The active ISA: [`Isa::name`] of `"avx512"`, `"avx2"`, `"neon"` or `"scalar"`.
pub fn active_isa() -> &'static str {
    active().isa.name()
}

/// Hints the CPU to load the cache line holding `p` into all cache levels
/// (T0). Never dereferences `p`, so any address — dangling, null or out of
/// bounds — is fine. A no-op on architectures without support.
#[inline(always)]
pub fn prefetch<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHT0 is a hint: it performs no architectural memory
    // access and cannot fault, whatever the address. SSE is part of the
    // x86-64 baseline, so the instruction is always available.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast::<i8>());
    }
    #[cfg(target_arch = "aarch64")]
    // SAFETY: PRFM is a hint: it performs no architectural memory access and
    // cannot fault, whatever the address; it writes no register, memory or
    // flags and does not touch the stack.
    unsafe {
        std::arch::asm!(
            "prfm pldl1keep, [{0}]",
            in(reg) p,
            options(nostack, preserves_flags, readonly)
        );
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    let _ = p;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_override() {
        assert_eq!(parse_simd_override("scalar"), Ok(Some(Isa::Scalar)));
        assert_eq!(parse_simd_override("avx2"), Ok(Some(Isa::Avx2)));
        assert_eq!(parse_simd_override("avx512"), Ok(Some(Isa::Avx512)));
        assert_eq!(parse_simd_override("avx512f"), Ok(Some(Isa::Avx512)));
        assert_eq!(parse_simd_override("neon"), Ok(Some(Isa::Neon)));
        assert_eq!(parse_simd_override(" AVX2\n"), Ok(Some(Isa::Avx2)));
        assert_eq!(parse_simd_override("Scalar"), Ok(Some(Isa::Scalar)));
        assert_eq!(parse_simd_override(""), Ok(None));
        assert_eq!(parse_simd_override("  "), Ok(None));
        assert_eq!(parse_simd_override("auto"), Ok(None));
        assert!(parse_simd_override("sse2").is_err());
        assert!(parse_simd_override("avx").is_err());
        assert!(parse_simd_override("avx2,fma").is_err());
        for isa in Isa::ALL {
            assert_eq!(parse_simd_override(isa.name()), Ok(Some(isa)));
            assert_eq!(isa.to_string(), isa.name());
        }
    }

    #[test]
    fn select_prefers_best_and_honours_available_overrides() {
        let x86 = [Isa::Scalar, Isa::Avx2, Isa::Avx512];
        assert_eq!(select_isa(&x86, None), Isa::Avx512);
        assert_eq!(select_isa(&x86, Some(Isa::Avx2)), Isa::Avx2);
        assert_eq!(select_isa(&x86, Some(Isa::Scalar)), Isa::Scalar);
        assert_eq!(select_isa(&x86, Some(Isa::Neon)), Isa::Avx512);

        let avx2_only = [Isa::Scalar, Isa::Avx2];
        assert_eq!(select_isa(&avx2_only, None), Isa::Avx2);
        // Forcing an ISA the CPU lacks is ignored.
        assert_eq!(select_isa(&avx2_only, Some(Isa::Avx512)), Isa::Avx2);
        assert_eq!(select_isa(&avx2_only, Some(Isa::Scalar)), Isa::Scalar);

        let arm = [Isa::Scalar, Isa::Neon];
        assert_eq!(select_isa(&arm, None), Isa::Neon);
        assert_eq!(select_isa(&arm, Some(Isa::Avx2)), Isa::Neon);
        assert_eq!(select_isa(&arm, Some(Isa::Scalar)), Isa::Scalar);

        assert_eq!(select_isa(&[Isa::Scalar], Some(Isa::Avx512)), Isa::Scalar);
        assert_eq!(select_isa(&[], None), Isa::Scalar);
    }

    #[test]
    fn availability_is_consistent() {
        let available = available_isas();
        assert_eq!(available.first(), Some(&Isa::Scalar));
        for isa in Isa::ALL {
            assert_eq!(available.contains(&isa), kernels_for(isa).is_some());
        }
        let active = active_isa();
        assert!(
            available.iter().any(|isa| isa.name() == active),
            "active ISA {active} not in {available:?}"
        );
        // Without an override the best available ISA is active.
        if std::env::var_os(SIMD_ENV).is_none() {
            assert_eq!(active, select_isa(&available, None).name());
        }
    }

    #[test]
    fn getters_return_the_active_kernels() {
        let k = active().kernels;
        assert!(std::ptr::fn_addr_eq(l2_sq_fn(), k.l2_sq));
        assert!(std::ptr::fn_addr_eq(neg_dot_fn(), k.neg_dot));
        assert!(std::ptr::fn_addr_eq(one_minus_dot_fn(), k.one_minus_dot));
    }

    #[test]
    fn prefetch_accepts_any_address_and_changes_nothing() {
        // A prefetch is a hint: it must neither fault on addresses that are
        // not mapped nor change the bytes it touches.
        let v = [1.5f32, -2.0, 3.25, 0.0];
        prefetch(v.as_ptr());
        prefetch(v.as_ptr().wrapping_add(1 << 20));
        prefetch(std::ptr::null::<u8>());
        assert_eq!(v, [1.5, -2.0, 3.25, 0.0]);
        assert_eq!(l2_sq_fn()(&v, &v), 0.0);
    }
}
