//! Every available ISA's kernels against an `f64` reference, for every
//! dimension in `0..=1024`, at aligned and unaligned starting offsets, with
//! NaN guard elements around the operands so that any out-of-bounds read
//! poisons the result.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use vectide_core::distance::{self, available_isas, kernels_for, Isa, Kernels, SIMD_ENV};

const MAX_DIM: usize = 1024;
/// Relative tolerance (f32 arithmetic with different summation orders).
const REL_TOL: f64 = 1e-4;
/// Guard elements on each side of an operand.
const GUARD: usize = 64;

/// The available ISAs with their kernels; prints a note for the others.
fn isas_under_test() -> Vec<(Isa, Kernels)> {
    Isa::ALL
        .into_iter()
        .filter_map(|isa| match kernels_for(isa) {
            Some(k) => Some((isa, k)),
            None => {
                eprintln!("note: skipping {isa} kernels: not available on this CPU/target");
                None
            }
        })
        .collect()
}

/// A buffer holding `values` at element `offset` past a 64-byte boundary,
/// surrounded by NaN guards. `slice()` returns exactly `values`.
struct Guarded {
    buf: Vec<f32>,
    start: usize,
    len: usize,
}

impl Guarded {
    fn new(values: &[f32], offset: usize) -> Self {
        let mut buf = vec![f32::NAN; values.len() + 2 * GUARD + 16 + offset];
        // Elements needed to reach the next 64-byte boundary (0..16).
        let align = buf.as_ptr().align_offset(64);
        assert!(align < 16);
        let start = GUARD + align + offset;
        buf[start..start + values.len()].copy_from_slice(values);
        Guarded {
            buf,
            start,
            len: values.len(),
        }
    }

    fn slice(&self) -> &[f32] {
        &self.buf[self.start..self.start + self.len]
    }
}

/// `(Σ aᵢbᵢ, Σ |aᵢbᵢ|)` in f64.
fn dot_ref(a: &[f32], b: &[f32]) -> (f64, f64) {
    a.iter().zip(b).fold((0.0, 0.0), |(s, m), (&x, &y)| {
        let p = x as f64 * y as f64;
        (s + p, m + p.abs())
    })
}

/// `Σ (aᵢ-bᵢ)²` in f64 (its own magnitude).
fn l2_ref(a: &[f32], b: &[f32]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(&x, &y)| {
            let d = x as f64 - y as f64;
            d * d
        })
        .sum()
}

#[track_caller]
fn assert_close(got: f32, want: f64, magnitude: f64, what: &dyn Fn() -> String) {
    let err = (got as f64 - want).abs();
    let tol = REL_TOL * (1.0 + magnitude);
    assert!(
        err <= tol, // false for NaN
        "{}: got {got}, want {want} (|err| {err:e} > tol {tol:e})",
        what()
    );
}

fn random_vec(rng: &mut StdRng, dim: usize, scale: f32) -> Vec<f32> {
    (0..dim).map(|_| rng.gen_range(-scale..scale)).collect()
}

#[test]
fn every_isa_matches_the_f64_reference_for_all_dims_and_offsets() {
    let isas = isas_under_test();
    let mut rng = StdRng::seed_from_u64(0x5eed_d157);
    for dim in 0..=MAX_DIM {
        // Vary the magnitude with the dimension.
        let scale = [1.0, 2.0, 0.01, 100.0][dim % 4];
        let a = random_vec(&mut rng, dim, scale);
        let b = random_vec(&mut rng, dim, scale);
        let (dot_want, dot_mag) = dot_ref(&a, &b);
        let l2_want = l2_ref(&a, &b);
        // Per ISA, the (dot, l2_sq) bits at the first offsets: the summation
        // order must not depend on where the operands live.
        let mut first: Vec<Option<(u32, u32)>> = vec![None; isas.len()];
        for off_a in 0..4 {
            let ga = Guarded::new(&a, off_a);
            for off_b in 0..4 {
                let gb = Guarded::new(&b, off_b);
                let (sa, sb) = (ga.slice(), gb.slice());
                for (&(isa, k), first) in isas.iter().zip(&mut first) {
                    let what = |name: &str| {
                        let name = name.to_string();
                        move || format!("{isa} {name} dim={dim} offsets=({off_a},{off_b})")
                    };
                    let d = (k.dot)(sa, sb);
                    assert_close(d, dot_want, dot_mag, &what("dot"));
                    assert_close((k.l2_sq)(sa, sb), l2_want, l2_want, &what("l2_sq"));
                    assert_close((k.neg_dot)(sa, sb), -dot_want, dot_mag, &what("neg_dot"));
                    assert_close(
                        (k.one_minus_dot)(sa, sb),
                        1.0 - dot_want,
                        dot_mag,
                        &what("one_minus_dot"),
                    );
                    // The wrappers run the same kernel: bit-identical results.
                    assert_eq!((k.neg_dot)(sa, sb).to_bits(), (-d).to_bits());
                    assert_eq!((k.one_minus_dot)(sa, sb).to_bits(), (1.0 - d).to_bits());
                    // Deterministic and symmetric.
                    assert_eq!((k.dot)(sa, sb).to_bits(), d.to_bits());
                    assert_eq!((k.dot)(sb, sa), d, "{}", what("dot symmetry")());
                    assert_eq!((k.l2_sq)(sb, sa), (k.l2_sq)(sa, sb));
                    let bits = (d.to_bits(), (k.l2_sq)(sa, sb).to_bits());
                    assert_eq!(
                        *first.get_or_insert(bits),
                        bits,
                        "{}",
                        what("alignment independence")()
                    );
                }
            }
        }
    }
}

/// Small integers make every product and partial sum exact in f32, so every
/// ISA must return exactly the reference whatever its summation order: a
/// skipped, duplicated or foreign element cannot hide inside the tolerance.
#[test]
fn every_isa_is_exact_on_small_integers() {
    let isas = isas_under_test();
    let mut rng = StdRng::seed_from_u64(7);
    for dim in 0..=MAX_DIM {
        let a: Vec<f32> = (0..dim).map(|_| rng.gen_range(-8i32..=8) as f32).collect();
        let b: Vec<f32> = (0..dim).map(|_| rng.gen_range(-8i32..=8) as f32).collect();
        let dot_want = dot_ref(&a, &b).0 as f32;
        let l2_want = l2_ref(&a, &b) as f32;
        for off in 0..4 {
            let (ga, gb) = (Guarded::new(&a, off), Guarded::new(&b, 3 - off));
            for &(isa, k) in &isas {
                let (sa, sb) = (ga.slice(), gb.slice());
                assert_eq!((k.dot)(sa, sb), dot_want, "{isa} dot dim={dim} off={off}");
                assert_eq!(
                    (k.l2_sq)(sa, sb),
                    l2_want,
                    "{isa} l2_sq dim={dim} off={off}"
                );
                assert_eq!((k.neg_dot)(sa, sb), -dot_want, "{isa} neg_dot dim={dim}");
                assert_eq!(
                    (k.one_minus_dot)(sa, sb),
                    1.0 - dot_want,
                    "{isa} 1-dot dim={dim}"
                );
            }
        }
    }
}

#[test]
fn long_vectors() {
    let isas = isas_under_test();
    let mut rng = StdRng::seed_from_u64(11);
    for dim in [1536, 2048, 3072, 4099, 10_000, 65_537] {
        let a = random_vec(&mut rng, dim, 1.0);
        let b = random_vec(&mut rng, dim, 1.0);
        let (dot_want, dot_mag) = dot_ref(&a, &b);
        let l2_want = l2_ref(&a, &b);
        let (ga, gb) = (Guarded::new(&a, 1), Guarded::new(&b, 2));
        for &(isa, k) in &isas {
            let (sa, sb) = (ga.slice(), gb.slice());
            let what = || format!("{isa} dim={dim}");
            assert_close((k.dot)(sa, sb), dot_want, dot_mag, &what);
            assert_close((k.l2_sq)(sa, sb), l2_want, l2_want, &what);
        }
    }
}

#[test]
fn zero_length_inputs() {
    let empty: &[f32] = &[];
    // An empty slice in the middle of a NaN buffer: nothing may be read.
    let nan = [f32::NAN; 8];
    for &(isa, k) in &isas_under_test() {
        for (a, b) in [(empty, empty), (&nan[3..3], &nan[5..5])] {
            assert_eq!((k.dot)(a, b), 0.0, "{isa}");
            assert_eq!((k.l2_sq)(a, b), 0.0, "{isa}");
            assert_eq!((k.neg_dot)(a, b), 0.0, "{isa}");
            assert_eq!((k.one_minus_dot)(a, b), 1.0, "{isa}");
        }
    }
    assert_eq!(distance::dot(empty, empty), 0.0);
    assert_eq!(distance::l2_sq(empty, empty), 0.0);
    assert_eq!(distance::norm_sq(empty), 0.0);
}

#[test]
fn special_values_propagate() {
    for &(isa, k) in &isas_under_test() {
        for dim in [1, 7, 8, 9, 31, 64, 100] {
            for pos in [0, dim / 2, dim - 1] {
                let mut a = vec![1.0f32; dim];
                let b = vec![1.0f32; dim];
                a[pos] = f32::NAN;
                assert!((k.dot)(&a, &b).is_nan(), "{isa} dim={dim} pos={pos}");
                assert!((k.l2_sq)(&a, &b).is_nan(), "{isa} dim={dim} pos={pos}");
                a[pos] = f32::INFINITY;
                assert_eq!((k.dot)(&a, &b), f32::INFINITY, "{isa} dim={dim}");
                assert_eq!((k.l2_sq)(&a, &b), f32::INFINITY, "{isa} dim={dim}");
            }
        }
    }
}

#[test]
fn public_api_uses_the_active_isa() {
    let active = distance::active_isa();
    let isa = available_isas()
        .into_iter()
        .find(|isa| isa.name() == active)
        .expect("active ISA is available");
    eprintln!(
        "note: active ISA {active}, available {:?}",
        available_isas()
    );
    let k = kernels_for(isa).unwrap();
    let mut rng = StdRng::seed_from_u64(3);
    for dim in [1, 3, 50, 96, 128, 384, 768, 1000] {
        let a = random_vec(&mut rng, dim, 1.0);
        let b = random_vec(&mut rng, dim, 1.0);
        let d = (k.dot)(&a, &b);
        assert_eq!(distance::dot(&a, &b), d);
        assert_eq!(distance::l2_sq(&a, &b), (k.l2_sq)(&a, &b));
        assert_eq!(distance::norm_sq(&a), (k.dot)(&a, &a));
        assert_eq!(distance::l2_sq_fn()(&a, &b), (k.l2_sq)(&a, &b));
        assert_eq!(distance::neg_dot_fn()(&a, &b), -d);
        assert_eq!(distance::one_minus_dot_fn()(&a, &b), 1.0 - d);
    }
}

/// Release builds use the common prefix of mismatched operands.
#[cfg(not(debug_assertions))]
#[test]
fn mismatched_lengths_use_the_common_prefix() {
    let mut rng = StdRng::seed_from_u64(5);
    for &(isa, k) in &isas_under_test() {
        for dim in [0, 1, 5, 17, 50, 100, 129] {
            let a = random_vec(&mut rng, dim, 1.0);
            let b = random_vec(&mut rng, dim + 13, 1.0);
            let (dot_want, dot_mag) = dot_ref(&a, &b[..dim]);
            let l2_want = l2_ref(&a, &b[..dim]);
            let what = || format!("{isa} dim={dim}");
            assert_close((k.dot)(&a, &b), dot_want, dot_mag, &what);
            assert_close((k.dot)(&b, &a), dot_want, dot_mag, &what);
            assert_close((k.l2_sq)(&a, &b), l2_want, l2_want, &what);
            assert_close((k.l2_sq)(&b, &a), l2_want, l2_want, &what);
        }
    }
}

/// Debug builds reject mismatched operands.
#[cfg(debug_assertions)]
#[test]
fn mismatched_lengths_panic_in_debug_builds() {
    let a = [1.0f32; 9];
    let b = [1.0f32; 10];
    for &(isa, k) in &isas_under_test() {
        for f in [k.dot, k.l2_sq, k.neg_dot, k.one_minus_dot] {
            let r = std::panic::catch_unwind(|| f(&a, &b));
            assert!(r.is_err(), "{isa}: no panic on mismatched lengths");
        }
    }
}

/// Child half of `simd_env_override`: checks the active ISA when spawned
/// with `VECTIDE_TEST_EXPECT_ISA` set, passes trivially otherwise.
#[test]
fn simd_env_child() {
    if let Ok(expected) = std::env::var("VECTIDE_TEST_EXPECT_ISA") {
        assert_eq!(distance::active_isa(), expected);
    }
}

/// `VECTIDE_SIMD` end to end: re-runs this test binary (only `simd_env_child`)
/// with the variable set and checks which ISA the fresh process picked.
#[test]
fn simd_env_override() {
    let available = available_isas();
    let best = *available.last().unwrap();
    let mut cases: Vec<(String, Isa)> = available
        .iter()
        .map(|isa| (isa.name().to_uppercase(), *isa))
        .collect();
    // Unavailable or unknown values fall back to the best ISA.
    for isa in Isa::ALL {
        if !available.contains(&isa) {
            cases.push((isa.name().to_string(), best));
        }
    }
    cases.push(("auto".to_string(), best));
    cases.push(("definitely-not-an-isa".to_string(), best));

    let exe = std::env::current_exe().unwrap();
    for (value, expected) in cases {
        let out = std::process::Command::new(&exe)
            .args(["--exact", "simd_env_child", "--test-threads=1"])
            .env(SIMD_ENV, &value)
            .env("VECTIDE_TEST_EXPECT_ISA", expected.name())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{SIMD_ENV}={value} should select {expected}:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            stdout.contains("1 passed"),
            "child did not run the test: {stdout}"
        );
    }
}
