//! RaBitQ's random rotation, as fast Hadamard transforms.
//!
//! RaBitQ needs a random orthogonal map `P` applied to every vector and
//! query. A dense random matrix costs `D²` per query; this one costs
//! `O(D log D)`: the vector is padded with zeros to `D'` (a multiple of
//! 64, the code's word size), then four rounds each flip the signs of the
//! coordinates by a seeded random pattern and apply the normalised
//! Walsh–Hadamard transform to the leading `2^⌊log₂ D'⌋` coordinates and
//! then to the trailing ones. When `D'` is a power of two the two blocks
//! are the same; otherwise they overlap, so every coordinate is mixed with
//! every other. Each step is orthogonal, so the whole map is: norms and
//! inner products are kept (to rounding), which is all the estimator's
//! algebra needs; the randomness of the signs is what spreads a vector's
//! energy over all coordinates, as a Haar-random rotation would.

use rand::{Rng, SeedableRng};

/// Rounds of sign flips and transforms.
const ROUNDS: usize = 4;

/// A seeded random orthogonal map on `padded`-dimensional vectors.
#[derive(Debug, Clone, PartialEq)]
pub struct Rotator {
    dim: usize,
    padded: usize,
    /// `±1` per round and padded coordinate.
    signs: Vec<f32>,
}

/// The padded dimension of `dim`: the next multiple of 64.
pub fn padded_dim(dim: usize) -> usize {
    dim.div_ceil(64).max(1) * 64
}

impl Rotator {
    /// The rotation of `dim`-dimensional vectors drawn from `seed`.
    pub fn new(dim: usize, seed: u64) -> Rotator {
        let padded = padded_dim(dim);
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let signs = (0..ROUNDS * padded)
            .map(|_| if rng.gen::<bool>() { 1.0 } else { -1.0 })
            .collect();
        Rotator { dim, padded, signs }
    }

    /// The input dimension.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// The output dimension (a multiple of 64).
    pub fn padded(&self) -> usize {
        self.padded
    }

    /// `out = P · v` (`v` of `dim` values, `out` of `padded`).
    pub fn rotate(&self, v: &[f32], out: &mut [f32]) {
        debug_assert_eq!(v.len(), self.dim);
        out[..self.dim].copy_from_slice(v);
        self.rotate_in_place(out);
    }

    /// [`rotate`](Self::rotate) of the vector in `buf[..dim]`, in place
    /// (`buf` of `padded` values; what follows `dim` is overwritten).
    pub fn rotate_in_place(&self, out: &mut [f32]) {
        debug_assert_eq!(out.len(), self.padded);
        out[self.dim..].fill(0.0);
        let block = 1usize << self.padded.ilog2();
        for r in 0..ROUNDS {
            for (x, s) in out.iter_mut().zip(&self.signs[r * self.padded..]) {
                *x *= s;
            }
            fwht(&mut out[..block]);
            if block < self.padded {
                let start = self.padded - block;
                fwht(&mut out[start..]);
            }
        }
    }

    /// `v = Pᵀ · x`, the inverse (for tests and decoding): `x` of `padded`
    /// values, `v` of `dim` (the padding's share dropped).
    pub fn unrotate(&self, x: &[f32], v: &mut [f32]) {
        let mut y = x.to_vec();
        let block = 1usize << self.padded.ilog2();
        for r in (0..ROUNDS).rev() {
            if block < self.padded {
                let start = self.padded - block;
                fwht(&mut y[start..]);
            }
            fwht(&mut y[..block]);
            for (x, s) in y.iter_mut().zip(&self.signs[r * self.padded..]) {
                *x *= s;
            }
        }
        v.copy_from_slice(&y[..self.dim]);
    }
}

/// The normalised Walsh–Hadamard transform in place (`x.len()` a power of
/// two); its own inverse.
fn fwht(x: &mut [f32]) {
    let n = x.len();
    let mut h = 1;
    while h < n {
        for chunk in x.chunks_exact_mut(2 * h) {
            let (a, b) = chunk.split_at_mut(h);
            for (u, v) in a.iter_mut().zip(b.iter_mut()) {
                let (s, d) = (*u + *v, *u - *v);
                *u = s;
                *v = d;
            }
        }
        h *= 2;
    }
    let scale = 1.0 / (n as f32).sqrt();
    for v in x.iter_mut() {
        *v *= scale;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dot(a: &[f32], b: &[f32]) -> f64 {
        a.iter()
            .zip(b)
            .map(|(x, y)| f64::from(*x) * f64::from(*y))
            .sum()
    }

    #[test]
    fn keeps_norms_and_inner_products_and_inverts() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        for dim in [1, 5, 50, 64, 100, 384, 768] {
            let r = Rotator::new(dim, 11);
            assert_eq!(r.padded() % 64, 0);
            assert!(r.padded() >= dim && r.padded() < dim + 64);
            let a: Vec<f32> = (0..dim).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let b: Vec<f32> = (0..dim).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let (mut ra, mut rb) = (vec![0.0; r.padded()], vec![0.0; r.padded()]);
            r.rotate(&a, &mut ra);
            r.rotate(&b, &mut rb);
            let tol = 1e-4 * (dot(&a, &a) * dot(&b, &b)).sqrt().max(1e-3);
            assert!((dot(&ra, &rb) - dot(&a, &b)).abs() < tol, "dim {dim}");
            assert!((dot(&ra, &ra) - dot(&a, &a)).abs() < 1e-4 * dot(&a, &a));
            let mut back = vec![0.0; dim];
            r.unrotate(&ra, &mut back);
            for (x, y) in back.iter().zip(&a) {
                assert!((x - y).abs() < 1e-4, "dim {dim}: {x} vs {y}");
            }
        }
    }

    #[test]
    fn spreads_a_spike_over_every_coordinate() {
        // A basis vector comes out with no coordinate holding much of it
        // (a random unit vector's largest is about √(2 ln D / D)).
        for dim in [50, 384] {
            let r = Rotator::new(dim, 5);
            let mut e = vec![0.0; dim];
            e[7] = 1.0;
            let mut out = vec![0.0; r.padded()];
            r.rotate(&e, &mut out);
            let max = out.iter().fold(0f32, |m, x| m.max(x.abs()));
            let limit = 4.0 / (r.padded() as f32).sqrt();
            assert!(max < limit, "dim {dim}: largest coordinate {max}");
            let zeros = out.iter().filter(|x| x.abs() < 1e-7).count();
            assert!(zeros < r.padded() / 8, "dim {dim}: {zeros} zeros");
        }
    }

    #[test]
    fn the_seed_decides_the_rotation() {
        assert_eq!(Rotator::new(100, 1), Rotator::new(100, 1));
        assert_ne!(Rotator::new(100, 1), Rotator::new(100, 2));
    }
}
