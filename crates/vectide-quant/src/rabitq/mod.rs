//! RaBitQ: vectors as bit strings with an unbiased distance estimator and
//! an error bound (Gao & Long, SIGMOD 2024), and its extended multi-bit
//! form (Gao et al., SIGMOD 2025).
//!
//! A vector `o` is taken relative to a centroid `c`, normalised, and turned
//! by a random rotation `P` ([`rotate`]): `o' = P(o − c)/‖o − c‖`. Its
//! 1-bit code is the signs of `o'` (`b_i = [o'_i > 0]`), the corner `x̄ =
//! (2b − 1)/√D` of the hypercube nearest to `o'`. For a query `q`, with
//! `q_r = P(q − c)`, the estimator of `⟨o', q_r⟩` is `⟨x̄, q_r⟩ / ⟨x̄, o'⟩`:
//! unbiased, and off by more than `ε₀ · √((1 − ⟨x̄,o'⟩²)/⟨x̄,o'⟩²) / √(D − 1)`
//! times `‖q − c‖` only with a probability that falls exponentially in
//! `ε₀²` (the paper's Theorem 3.2; `ε₀` = [`EPSILON0`], 1.9, the value the
//! paper uses). The squared distance follows from `‖o − q‖² = ‖o − c‖² +
//! ‖q − c‖² − 2 ‖o − c‖ ⟨o', q_r⟩`, and the inner product from the same
//! identity, so every metric gets an estimate and a bound (see
//! [`Factors`]).
//!
//! With `bits` = B > 1, each coordinate also gets the best of `2^B` levels
//! ([`encode`]): the code `y_i = c_i − (2^B − 1)/2`, `c_i ∈ [0, 2^B)`,
//! whose direction is nearest to `o'`, found exactly over the critical
//! scales, as the extended paper does; its estimator is `⟨y, q_r⟩ / ⟨y,
//! o'⟩` with the query in floats. The top bit of `c_i` is the 1-bit code,
//! so a search estimates with the bits first ([`fastscan`], many vectors
//! at once) and refines only the candidates whose bound still reaches.
//!
//! The query side rotates `q − c` once, and quantizes it to 4-bit
//! unsigned levels for the bit codes (`q_r ≈ Δ·u + lo`): `⟨b, q_r⟩ ≈
//! Δ⟨b, u⟩ + lo·|b|`, where `⟨b, u⟩` is either four popcounts of the
//! code against the query's bit planes ([`Query::bin_dot`]) or table
//! lookups over 32 codes at a time ([`fastscan`]). The rounding is to the
//! nearest level, not the paper's randomized rounding, so the 1-bit
//! estimate is unbiased only up to it, and the bound leaves it out (the
//! paper shows 4 bits make it small): measured, the bias stays under 5 %
//! of the bound, and 6 to 7 % of pairs fall outside the bound where a
//! normal error at ε₀ = 1.9 standard deviations would leave 5.7 %
//! (`tests.rs`, `vectide rabitq-eval`).

pub mod encode;
pub mod fastscan;
pub mod rotate;

use vectide_core::{Error, Metric, Result};

pub use fastscan::{Block, BLOCK};
pub use rotate::{padded_dim, Rotator};

/// The paper's confidence parameter of the error bound.
pub const EPSILON0: f32 = 1.9;

/// The most bits per coordinate a code may have.
pub const MAX_BITS: u8 = 8;

/// Levels of the query's quantization for the bit codes (4 bits).
const QUERY_LEVELS: f32 = 15.0;

/// What a quantizer is built with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RabitqParams {
    /// Bits per coordinate: 1 (the sign only) to [`MAX_BITS`].
    pub bits: u8,
    /// Seed of the random rotation.
    pub seed: u64,
}

impl Default for RabitqParams {
    fn default() -> Self {
        RabitqParams {
            bits: 1,
            seed: 0x5241_4249_5451,
        }
    }
}

/// The per-vector numbers the estimates need beside the code, already
/// scaled for the quantizer's metric: with `s` = 1 for L2 and ½ for the
/// inner-product metrics, and `R = −2 s ‖o − c‖ / ⟨x̄, o'⟩ / √D`,
///
/// * `add`: `s (‖o − c‖² − [inner product] ‖o‖²)`;
/// * `rescale`: `R`, so that the 1-bit estimate is `add + q.add + R (2⟨b,
///   q_r⟩ − Σ q_r)`;
/// * `rescale_bits`: `R |b|` (what the query's offset `lo` adds through
///   every set bit);
/// * `error`: the bound of the 1-bit estimate per unit of `‖q − c‖`;
/// * `ex_rescale`: `−2 s ‖o − c‖ / ⟨y, o'⟩` for the multi-bit estimate
///   (0 for 1-bit codes).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Factors {
    pub add: f32,
    pub rescale: f32,
    pub rescale_bits: f32,
    pub error: f32,
    pub ex_rescale: f32,
}

/// One vector's code.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Code {
    /// The sign bits, `padded / 64` words, coordinate `i` at bit `i % 64`
    /// of word `i / 64`.
    pub bin: Vec<u64>,
    /// With `bits` > 1, the level `c_i` of each padded coordinate (its top
    /// bit is `b_i`); empty otherwise.
    pub levels: Vec<u8>,
    pub factors: Factors,
}

/// A RaBitQ quantizer: the centroid, the rotation, the metric, the bits.
#[derive(Debug, Clone, PartialEq)]
pub struct Rabitq {
    metric: Metric,
    bits: u8,
    seed: u64,
    centroid: Vec<f32>,
    rot: Rotator,
}

/// A query prepared against a quantizer (reusable: see
/// [`Rabitq::query_into`]).
#[derive(Debug, Clone, Default)]
pub struct Query {
    /// `P(q − c)`, padded.
    pub rotated: Vec<f32>,
    /// `s ‖q − c‖²` (minus `s ‖q‖²` for the inner product, plus 1 for
    /// cosine): the query's share of every estimate.
    pub add: f32,
    /// `‖q − c‖`, which scales every bound.
    pub norm: f32,
    /// `Σ q_r`.
    pub sum: f32,
    /// The 4-bit quantization: `q_r ≈ delta·u + lo`.
    pub delta: f32,
    pub lo: f32,
    /// `u`'s bit planes: plane `j` holds bit `j` of every `u_i`, as `bin`.
    pub planes: Vec<u64>,
    /// Per group of 4 coordinates, the 16 sums of `u` over its subsets
    /// (the fast-scan table).
    pub lut: Vec<u8>,
}

impl Rabitq {
    /// A quantizer of `dim`-dimensional vectors around `centroid`.
    pub fn new(metric: Metric, centroid: Vec<f32>, params: RabitqParams) -> Result<Rabitq> {
        if centroid.is_empty() {
            return Err(Error::invalid("rabitq: dimension must be at least 1"));
        }
        if !(1..=MAX_BITS).contains(&params.bits) {
            return Err(Error::invalid(format!(
                "rabitq: bits must be 1 to {MAX_BITS}, got {}",
                params.bits
            )));
        }
        if centroid.iter().any(|x| !x.is_finite()) {
            return Err(Error::invalid(
                "rabitq: the centroid holds a non-finite value",
            ));
        }
        if padded_dim(centroid.len()) > fastscan::MAX_PADDED {
            return Err(Error::invalid(format!(
                "rabitq: dimension {} is past the {} the fast-scan kernels' 16-bit sums can pad",
                centroid.len(),
                fastscan::MAX_PADDED
            )));
        }
        let rot = Rotator::new(centroid.len(), params.seed);
        Ok(Rabitq {
            metric,
            bits: params.bits,
            seed: params.seed,
            centroid,
            rot,
        })
    }

    /// A quantizer around the mean of `data` (`n × dim`, at least one row).
    pub fn train(metric: Metric, data: &[f32], dim: usize, params: RabitqParams) -> Result<Rabitq> {
        let n = crate::check_rows(data, dim, 1, "rabitq")?;
        let mut mean = vec![0f64; dim];
        for row in data.chunks_exact(dim) {
            for (m, x) in mean.iter_mut().zip(row) {
                *m += f64::from(*x);
            }
        }
        let centroid = mean.iter().map(|m| (m / n as f64) as f32).collect();
        Rabitq::new(metric, centroid, params)
    }

    pub fn dim(&self) -> usize {
        self.centroid.len()
    }

    /// The rotated dimension `D` (a multiple of 64).
    pub fn padded(&self) -> usize {
        self.rot.padded()
    }

    pub fn bits(&self) -> u8 {
        self.bits
    }

    pub fn seed(&self) -> u64 {
        self.seed
    }

    pub fn metric(&self) -> Metric {
        self.metric
    }

    pub fn centroid(&self) -> &[f32] {
        &self.centroid
    }

    /// Bytes of one code: the bits, the levels and five factors.
    pub fn code_bytes(&self) -> usize {
        let d = self.padded();
        d / 8 + if self.bits > 1 { d } else { 0 } + 20
    }

    /// `s` of [`Factors`].
    fn scale(&self) -> f32 {
        match self.metric {
            Metric::L2 => 1.0,
            Metric::Ip | Metric::Cosine => 0.5,
        }
    }

    fn check(&self, v: &[f32], what: &str) -> Result<()> {
        if v.len() != self.dim() {
            return Err(Error::invalid(format!(
                "rabitq: {what} has {} values, the quantizer {}",
                v.len(),
                self.dim()
            )));
        }
        if v.iter().any(|x| !x.is_finite()) {
            return Err(Error::invalid(format!(
                "rabitq: {what} holds a non-finite value"
            )));
        }
        Ok(())
    }

    /// The code of `v`.
    pub fn encode(&self, v: &[f32]) -> Result<Code> {
        self.check(v, "the vector")?;
        let d = self.padded();
        let resid: Vec<f32> = v.iter().zip(&self.centroid).map(|(x, c)| x - c).collect();
        let norm = norm(&resid);
        let mut o = vec![0f32; d];
        self.rot.rotate(&resid, &mut o);
        if norm > 0.0 {
            for x in &mut o {
                *x /= norm;
            }
        } else {
            // The centroid itself: any direction is exact (the distance
            // has no term in it); a fixed one keeps the code defined.
            o.fill(1.0 / (d as f32).sqrt());
        }
        let mut bin = vec![0u64; d / 64];
        let mut ones = 0u32;
        let mut abs_sum = 0f64;
        for (i, &x) in o.iter().enumerate() {
            if x > 0.0 {
                bin[i / 64] |= 1 << (i % 64);
                ones += 1;
            }
            abs_sum += f64::from(x.abs());
        }
        let sqrt_d = (d as f64).sqrt();
        // ⟨x̄, o'⟩, kept away from 0 (it is ≥ 1/√D for a unit vector).
        let ip = (abs_sum / sqrt_d).max(1e-9);
        let s = f64::from(self.scale());
        let n = f64::from(norm);
        let v_sq = if self.metric == Metric::L2 {
            0.0
        } else {
            v.iter().map(|x| f64::from(*x) * f64::from(*x)).sum()
        };
        let r = -2.0 * s * n / ip / sqrt_d;
        let mut f = Factors {
            add: (s * (n * n - v_sq)) as f32,
            rescale: r as f32,
            rescale_bits: (r * f64::from(ones)) as f32,
            error: (2.0 * s * n * f64::from(EPSILON0) * ((1.0 - ip * ip).max(0.0)).sqrt()
                / ip
                / ((d as f64) - 1.0).sqrt()) as f32,
            ex_rescale: 0.0,
        };
        let levels = if self.bits > 1 {
            let (levels, ip_y) = encode::levels(&o, self.bits);
            f.ex_rescale = (-2.0 * s * n / ip_y.max(1e-12)) as f32;
            levels
        } else {
            Vec::new()
        };
        Ok(Code {
            bin,
            levels,
            factors: f,
        })
    }

    /// `q` prepared for estimates against this quantizer's codes.
    pub fn query(&self, q: &[f32]) -> Result<Query> {
        let mut out = Query::default();
        self.query_into(q, &mut out)?;
        Ok(out)
    }

    /// [`query`](Self::query) into `out`, reusing its buffers (no
    /// allocation once they have grown to this quantizer's size).
    pub fn query_into(&self, q: &[f32], out: &mut Query) -> Result<()> {
        self.check(q, "the query")?;
        let d = self.padded();
        let dim = self.dim();
        out.rotated.resize(d, 0.0);
        let (mut qn2, mut q2) = (0f64, 0f64);
        for ((r, &x), &c) in out.rotated[..dim].iter_mut().zip(q).zip(&self.centroid) {
            *r = x - c;
            qn2 += f64::from(*r) * f64::from(*r);
            q2 += f64::from(x) * f64::from(x);
        }
        self.rot.rotate_in_place(&mut out.rotated);
        let (qn2, q2) = (qn2 as f32, q2 as f32);
        let s = self.scale();
        out.norm = qn2.sqrt();
        out.add = match self.metric {
            Metric::L2 => qn2,
            Metric::Ip => s * (qn2 - q2),
            Metric::Cosine => s * (qn2 - q2) + 1.0,
        };
        let (lo, hi) = out
            .rotated
            .iter()
            .fold((f32::MAX, f32::MIN), |(l, h), &x| (l.min(x), h.max(x)));
        let delta = if hi > lo {
            (hi - lo) / QUERY_LEVELS
        } else {
            1.0
        };
        out.lo = lo;
        out.delta = delta;
        out.sum = out.rotated.iter().sum();
        let words = d / 64;
        out.planes.clear();
        out.planes.resize(4 * words, 0);
        out.lut.resize(d / 4 * 16, 0);
        let inv = 1.0 / delta;
        for (g, chunk) in out.rotated.chunks_exact(4).enumerate() {
            let mut u = [0u8; 4];
            for (j, &x) in chunk.iter().enumerate() {
                u[j] = ((x - lo) * inv).round().clamp(0.0, QUERY_LEVELS) as u8;
                let i = 4 * g + j;
                for (p, plane) in out.planes.chunks_exact_mut(words).enumerate() {
                    plane[i / 64] |= u64::from(u[j] >> p & 1) << (i % 64);
                }
            }
            let t = &mut out.lut[g * 16..g * 16 + 16];
            t[0] = 0;
            for p in 1..16usize {
                // The subset without its lowest member, plus that member.
                let low = p.trailing_zeros() as usize;
                t[p] = t[p & (p - 1)] + u[low];
            }
        }
        Ok(())
    }

    /// The 1-bit estimate of the distance of `code`'s vector to `q` and its
    /// bound: the distance lies within `estimate ± bound` but for a small
    /// probability (see the module docs).
    pub fn estimate(&self, q: &Query, code: &Code) -> (f32, f32) {
        let ip = q.bin_dot(&code.bin);
        q.finish(ip as f32, &code.factors)
    }

    /// The multi-bit estimate (the 1-bit one for 1-bit codes).
    pub fn estimate_levels(&self, q: &Query, code: &Code) -> f32 {
        if code.levels.is_empty() {
            return self.estimate(q, code).0;
        }
        let dot: f32 = code
            .levels
            .iter()
            .zip(&q.rotated)
            .map(|(&c, &x)| f32::from(c) * x)
            .sum();
        let mid = ((1u32 << self.bits) - 1) as f32 / 2.0;
        code.factors.add + q.add + code.factors.ex_rescale * (dot - mid * q.sum)
    }

    /// The vector a code stands for, in the input space (for tests and
    /// inspection): the centroid plus the code's direction scaled by how
    /// much of the vector it holds.
    pub fn decode(&self, code: &Code, resid_norm: f32) -> Vec<f32> {
        let d = self.padded();
        let y: Vec<f32> = if code.levels.is_empty() {
            (0..d)
                .map(|i| {
                    if code.bin[i / 64] >> (i % 64) & 1 == 1 {
                        1.0
                    } else {
                        -1.0
                    }
                })
                .collect()
        } else {
            let mid = ((1u32 << self.bits) - 1) as f32 / 2.0;
            code.levels.iter().map(|&c| f32::from(c) - mid).collect()
        };
        let yn = norm(&y).max(1e-30);
        let unit: Vec<f32> = y.iter().map(|x| x / yn * resid_norm).collect();
        let mut out = vec![0f32; self.dim()];
        self.rot.unrotate(&unit, &mut out);
        for (o, c) in out.iter_mut().zip(&self.centroid) {
            *o += c;
        }
        out
    }
}

impl Query {
    /// `⟨b, u⟩` of a 1-bit code: a popcount per bit plane.
    pub fn bin_dot(&self, bin: &[u64]) -> u32 {
        let words = bin.len();
        (0..4)
            .map(|j| {
                let plane = &self.planes[j * words..(j + 1) * words];
                bin.iter()
                    .zip(plane)
                    .map(|(a, b)| (a & b).count_ones())
                    .sum::<u32>()
                    << j
            })
            .sum()
    }

    /// The estimate and bound from `⟨b, u⟩` and a code's factors.
    #[inline]
    pub fn finish(&self, ip_u: f32, f: &Factors) -> (f32, f32) {
        let est = f.add
            + self.add
            + f.rescale * (2.0 * self.delta * ip_u - self.sum)
            + 2.0 * self.lo * f.rescale_bits;
        (est, f.error * self.norm)
    }
}

fn norm(v: &[f32]) -> f32 {
    v.iter()
        .map(|x| f64::from(*x) * f64::from(*x))
        .sum::<f64>()
        .sqrt() as f32
}

#[cfg(test)]
mod tests;
