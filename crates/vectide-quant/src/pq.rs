//! Product quantization (Jégou, Douze & Schmid, TPAMI 2011).
//!
//! A `dim`-d vector is centred (the training mean subtracted, as DiskANN
//! does before PQ), cut into `m` contiguous sub-vectors, and each one is
//! replaced by the index of the nearest of [`KSUB`] = 256 sub-centroids
//! learnt by k-means on that subspace: one byte per subspace, `m` bytes per
//! vector. `dim` need not be a multiple of `m`: the first `dim mod m`
//! subspaces get one dimension more than the others (50-d in 32 bytes:
//! 18 subspaces of 2 and 14 of 1).
//!
//! **Asymmetric distance** (ADC): for a query `q`, a [`DistanceTable`] holds,
//! per subspace `j` and code `c`, the distance term of `q`'s sub-vector
//! against sub-centroid `c` (`m × 256` floats, computed once per query);
//! the distance to a coded vector is then `bias + Σ_j table[j][code[j]]`,
//! `m` lookups. Under
//! - `L2`: terms are squared sub-distances and `bias = 0` (translation by
//!   the mean changes no L2 distance);
//! - `Ip`: terms are `-q_j · c`, `bias = -q · mean`, so the sum approximates
//!   `-q · x`;
//! - `Cosine`: as `Ip` on unit vectors with `bias = 1 - q · mean`,
//!   approximating `1 - q · x` (the caller normalises both, as the engines
//!   do at insert).
//!
//! The lookups dispatch at run time: with AVX2 (and unless `VECTIDE_SIMD`
//! forces `scalar`), eight subspaces at a time are gathered with
//! `VPGATHERDD`; otherwise a portable loop with four accumulators.

use crate::check_rows;
use crate::kmeans::{self, gather, KMeansParams};
use rand::rngs::StdRng;
use rand::seq::index::sample;
use rand::SeedableRng;
use rayon::prelude::*;
use vectide_core::distance::prefetch;
use vectide_core::metric::Metric;
use vectide_core::{Error, Result};

/// Sub-centroids per subspace (one byte of code).
pub const KSUB: usize = 256;

/// Parameters of [`ProductQuantizer::train`].
#[derive(Clone, Debug)]
pub struct PqParams {
    /// Bytes per code: the number of subspaces (1 ≤ m ≤ dim).
    pub m: usize,
    /// Lloyd iterations per subspace.
    pub iters: usize,
    /// Seed of the training sample and of every subspace's k-means.
    pub seed: u64,
    /// Training rows at most (a seeded sample above it).
    pub max_train: usize,
}

impl PqParams {
    /// `m` bytes per code, 25 iterations, seed 0, at most 65,536 training
    /// rows (256 per sub-centroid, FAISS's default).
    pub fn new(m: usize) -> Self {
        PqParams {
            m,
            iters: 25,
            seed: 0,
            max_train: KSUB * 256,
        }
    }
}

/// A trained product quantizer.
#[derive(Clone, Debug, PartialEq)]
pub struct ProductQuantizer {
    dim: usize,
    /// Subspace `j` covers dimensions `offsets[j]..offsets[j + 1]`.
    offsets: Vec<usize>,
    /// The training mean, subtracted before coding.
    mean: Vec<f32>,
    /// Subspace `j`'s 256 sub-centroids, row-major, at `KSUB * offsets[j]`.
    codebooks: Vec<f32>,
    /// `codebooks` with the mean added (same layout): [`Self::decode`]
    /// copies from it, one small run per subspace (a StreamingMerge
    /// decodes every pruning candidate, tens of millions per merge).
    folded: Vec<f32>,
}

/// Subspace boundaries: `dim` split into `m` contiguous runs, the first
/// `dim mod m` one dimension longer.
pub fn subspaces(dim: usize, m: usize) -> Vec<usize> {
    let (base, extra) = (dim / m, dim % m);
    let mut offsets = Vec::with_capacity(m + 1);
    let mut at = 0;
    offsets.push(0);
    for j in 0..m {
        at += base + usize::from(j < extra);
        offsets.push(at);
    }
    offsets
}

impl ProductQuantizer {
    /// Trains on `data` (`n × dim`, n ≥ 256 rows: one per sub-centroid).
    pub fn train(data: &[f32], dim: usize, p: &PqParams) -> Result<Self> {
        if p.m == 0 || p.m > dim {
            return Err(Error::invalid(format!(
                "product quantization: m (bytes per code) must be in 1..={dim}, got {}",
                p.m
            )));
        }
        if p.iters == 0 || p.max_train < KSUB {
            return Err(Error::invalid(format!(
                "product quantization: iters must be at least 1 and max_train at least {KSUB}"
            )));
        }
        let n = check_rows(data, dim, KSUB, "product quantization")?;
        let mut rng = StdRng::seed_from_u64(p.seed);
        let rows = if n > p.max_train {
            let mut pick = sample(&mut rng, n, p.max_train).into_vec();
            pick.sort_unstable();
            gather(data, dim, &pick)
        } else {
            data.to_vec()
        };
        let nt = rows.len() / dim;
        let mut mean = vec![0f64; dim];
        for x in rows.chunks_exact(dim) {
            for (m, &v) in mean.iter_mut().zip(x) {
                *m += v as f64;
            }
        }
        let mean: Vec<f32> = mean.iter().map(|&s| (s / nt as f64) as f32).collect();
        let offsets = subspaces(dim, p.m);
        let books: Vec<Result<Vec<f32>>> = (0..p.m)
            .into_par_iter()
            .map(|j| {
                let (a, b) = (offsets[j], offsets[j + 1]);
                let sub: Vec<f32> = rows
                    .chunks_exact(dim)
                    .flat_map(|x| x[a..b].iter().zip(&mean[a..b]).map(|(v, m)| v - m))
                    .collect();
                let kp = KMeansParams::new(KSUB)
                    .seed(p.seed.wrapping_add(j as u64 + 1))
                    .max_iters(p.iters);
                Ok(kmeans::train(&sub, b - a, &kp)?.as_slice().to_vec())
            })
            .collect();
        let mut codebooks = Vec::with_capacity(KSUB * dim);
        for b in books {
            codebooks.extend(b?);
        }
        Ok(Self::assemble(dim, offsets, mean, codebooks))
    }

    fn assemble(dim: usize, offsets: Vec<usize>, mean: Vec<f32>, codebooks: Vec<f32>) -> Self {
        let mut folded = codebooks.clone();
        for j in 0..offsets.len() - 1 {
            let (a, b) = (offsets[j], offsets[j + 1]);
            for row in folded[KSUB * a..KSUB * b].chunks_exact_mut(b - a) {
                for (x, mu) in row.iter_mut().zip(&mean[a..b]) {
                    *x += mu;
                }
            }
        }
        ProductQuantizer {
            dim,
            offsets,
            mean,
            codebooks,
            folded,
        }
    }

    /// A quantizer from its parts (as read back from a file): `mean` has
    /// `dim` floats, `codebooks` `256 × dim`, all finite; `m` in 1..=dim.
    pub fn from_parts(dim: usize, m: usize, mean: Vec<f32>, codebooks: Vec<f32>) -> Result<Self> {
        if m == 0 || m > dim || mean.len() != dim || codebooks.len() != KSUB * dim {
            return Err(Error::corrupted(format!(
                "product quantizer: dim {dim}, m {m}, {} mean floats, {} codebook floats",
                mean.len(),
                codebooks.len()
            )));
        }
        if mean.iter().chain(&codebooks).any(|v| !v.is_finite()) {
            return Err(Error::corrupted("product quantizer: non-finite value"));
        }
        Ok(Self::assemble(dim, subspaces(dim, m), mean, codebooks))
    }

    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Bytes per code.
    pub fn m(&self) -> usize {
        self.offsets.len() - 1
    }

    pub fn mean(&self) -> &[f32] {
        &self.mean
    }

    pub fn codebooks(&self) -> &[f32] {
        &self.codebooks
    }

    fn book(&self, j: usize) -> (&[f32], usize) {
        let (a, b) = (self.offsets[j], self.offsets[j + 1]);
        (&self.codebooks[KSUB * a..KSUB * b], b - a)
    }

    fn check_dim(&self, len: usize) -> Result<()> {
        if len != self.dim {
            return Err(Error::DimensionMismatch {
                expected: self.dim,
                got: len,
            });
        }
        Ok(())
    }

    fn check_code(&self, len: usize) -> Result<()> {
        if len != self.m() {
            return Err(Error::invalid(format!(
                "a code has {} bytes, got {len}",
                self.m()
            )));
        }
        Ok(())
    }

    /// Encodes one vector into `code` (`m` bytes).
    pub fn encode(&self, x: &[f32], code: &mut [u8]) -> Result<()> {
        self.check_dim(x.len())?;
        self.check_code(code.len())?;
        let mut sub = Vec::new();
        for (j, out) in code.iter_mut().enumerate() {
            let (a, b) = (self.offsets[j], self.offsets[j + 1]);
            sub.clear();
            sub.extend(x[a..b].iter().zip(&self.mean[a..b]).map(|(v, m)| v - m));
            let (book, d) = self.book(j);
            let mut best = (0usize, f32::INFINITY);
            for (c, cen) in book.chunks_exact(d).enumerate() {
                let dist: f32 = sub.iter().zip(cen).map(|(u, v)| (u - v) * (u - v)).sum();
                if dist < best.1 {
                    best = (c, dist);
                }
            }
            *out = best.0 as u8;
        }
        Ok(())
    }

    /// Encodes `n × dim` rows into `n × m` bytes, in parallel.
    pub fn encode_all(&self, data: &[f32]) -> Result<Vec<u8>> {
        check_rows(data, self.dim, 0, "product quantization encode")?;
        let m = self.m();
        let mut codes = vec![0u8; data.len() / self.dim * m];
        codes
            .par_chunks_mut(m)
            .zip(data.par_chunks_exact(self.dim))
            .with_min_len(256)
            .try_for_each(|(c, x)| self.encode(x, c))?;
        Ok(codes)
    }

    /// The vector a code stands for (centroids plus the mean).
    pub fn decode(&self, code: &[u8], out: &mut [f32]) -> Result<()> {
        self.check_dim(out.len())?;
        self.check_code(code.len())?;
        let f = &self.folded;
        for (ab, &c) in self.offsets.windows(2).zip(code) {
            let (a, d) = (ab[0], ab[1] - ab[0]);
            let from = KSUB * a + c as usize * d;
            // Runs of one or two floats (dim ≤ 2m, as 50-d GloVe at 32
            // bytes) copied without a call to memcpy each.
            match d {
                1 => out[a] = f[from],
                2 => {
                    out[a] = f[from];
                    out[a + 1] = f[from + 1];
                }
                _ => out[a..a + d].copy_from_slice(&f[from..from + d]),
            }
        }
        Ok(())
    }

    /// Fills `table` for query `q` under `metric` (see the module docs).
    pub fn table_into(&self, q: &[f32], metric: Metric, table: &mut DistanceTable) -> Result<()> {
        self.check_dim(q.len())?;
        let m = self.m();
        table.m = m;
        table.data.clear();
        table.data.reserve(m * KSUB);
        let qdotmean: f32 = q.iter().zip(&self.mean).map(|(a, b)| a * b).sum();
        table.bias = match metric {
            Metric::L2 => 0.0,
            Metric::Ip => -qdotmean,
            Metric::Cosine => 1.0 - qdotmean,
        };
        let mut sub = Vec::new();
        for j in 0..m {
            let (a, b) = (self.offsets[j], self.offsets[j + 1]);
            let (book, d) = self.book(j);
            match metric {
                Metric::L2 => {
                    sub.clear();
                    sub.extend(q[a..b].iter().zip(&self.mean[a..b]).map(|(v, mu)| v - mu));
                    table.data.extend(book.chunks_exact(d).map(|cen| {
                        sub.iter()
                            .zip(cen)
                            .map(|(u, v)| (u - v) * (u - v))
                            .sum::<f32>()
                    }));
                }
                Metric::Ip | Metric::Cosine => {
                    let qs = &q[a..b];
                    table.data.extend(
                        book.chunks_exact(d)
                            .map(|cen| -qs.iter().zip(cen).map(|(u, v)| u * v).sum::<f32>()),
                    );
                }
            }
        }
        Ok(())
    }

    /// A fresh table for `q` (allocates; hot paths reuse one with
    /// [`ProductQuantizer::table_into`]).
    pub fn table(&self, q: &[f32], metric: Metric) -> Result<DistanceTable> {
        let mut t = DistanceTable::default();
        self.table_into(q, metric, &mut t)?;
        Ok(t)
    }
}

/// One query's ADC table: `m × 256` terms and a bias.
#[derive(Clone, Debug, Default)]
pub struct DistanceTable {
    m: usize,
    data: Vec<f32>,
    bias: f32,
}

impl DistanceTable {
    /// Bytes per code this table expects.
    pub fn m(&self) -> usize {
        self.m
    }

    /// The `m × 256` terms, subspace-major.
    pub fn terms(&self) -> &[f32] {
        &self.data
    }

    /// The constant added to every sum of terms.
    pub fn bias(&self) -> f32 {
        self.bias
    }

    /// The approximate distance of one code (`m` bytes; a shorter or
    /// longer code is read up to the shorter of the two lengths).
    #[inline]
    pub fn distance(&self, code: &[u8]) -> f32 {
        self.bias + lookup(&self.data, self.m, code)
    }

    /// Approximate distances of the codes of nodes `ids` (node `i`'s code
    /// at `codes[i·m..(i + 1)·m]`) into `out`, cleared first. With AVX2,
    /// four codes are looked up together so that the table gathers of one
    /// overlap those of the others (one code's gathers form a dependent
    /// chain). An id whose code lies past `codes` is an error.
    pub fn distances_at(&self, codes: &[u8], ids: &[u32], out: &mut Vec<f32>) -> Result<()> {
        out.clear();
        let m = self.m;
        // The codes are scattered over an array far larger than the caches:
        // the check asks for each one, so that their misses overlap instead
        // of each lookup below waiting on its own.
        if let Some(&bad) = ids.iter().find(|&&i| {
            let at = codes.as_ptr().wrapping_add(i as usize * m);
            prefetch(at);
            prefetch(at.wrapping_add(m.saturating_sub(1)));
            (i as usize + 1).saturating_mul(m) > codes.len()
        }) {
            return Err(Error::invalid(format!(
                "PQ lookup: node {bad} has no code among {} bytes",
                codes.len()
            )));
        }
        let code = |i: u32| &codes[i as usize * m..(i as usize + 1) * m];
        #[cfg(target_arch = "x86_64")]
        {
            if use_avx2() && m * KSUB <= i32::MAX as usize && m * KSUB <= self.data.len() {
                let mut quads = ids.chunks_exact(4);
                for q in &mut quads {
                    let four = [q[0], q[1], q[2], q[3]];
                    // SAFETY: AVX2 was detected at run time; every id's code
                    // lies inside `codes` (checked above) and
                    // `m * KSUB <= table.len()`, as `lookup4_avx2` requires.
                    let d = unsafe { x86::lookup4_avx2(&self.data, m, codes, four) };
                    out.extend(d.iter().map(|x| self.bias + x));
                }
                out.extend(quads.remainder().iter().map(|&i| self.distance(code(i))));
                return Ok(());
            }
        }
        out.extend(ids.iter().map(|&i| self.distance(code(i))));
        Ok(())
    }

    /// Approximate distances of `codes` (`n × m` bytes) into `out` (`n`).
    pub fn distances(&self, codes: &[u8], out: &mut [f32]) {
        for (o, c) in out.iter_mut().zip(codes.chunks_exact(self.m.max(1))) {
            *o = self.distance(c);
        }
    }
}

fn lookup(table: &[f32], m: usize, code: &[u8]) -> f32 {
    let m = m.min(code.len()).min(table.len() / KSUB);
    #[cfg(target_arch = "x86_64")]
    {
        // The gather's i32 indices cover tables up to 2^31 entries.
        if use_avx2() && m * KSUB <= i32::MAX as usize {
            // SAFETY: `use_avx2` is true only when the CPU has AVX2 (runtime
            // detection); `m <= code.len()` and `m * KSUB <= table.len()`
            // hold by the `min` above, as `lookup_avx2` requires.
            return unsafe { x86::lookup_avx2(table, m, code) };
        }
    }
    lookup_scalar(table, m, code)
}

/// The portable lookup: `Σ_j table[j·256 + code[j]]` over `j < m`.
pub fn lookup_scalar(table: &[f32], m: usize, code: &[u8]) -> f32 {
    let mut acc = [0f32; 4];
    let m = m.min(code.len()).min(table.len() / KSUB);
    for (j, &c) in code[..m].iter().enumerate() {
        acc[j % 4] += table[j * KSUB + c as usize];
    }
    (acc[0] + acc[1]) + (acc[2] + acc[3])
}

#[cfg(target_arch = "x86_64")]
fn use_avx2() -> bool {
    use std::sync::OnceLock;
    static AVX2: OnceLock<bool> = OnceLock::new();
    *AVX2.get_or_init(|| {
        std::is_x86_feature_detected!("avx2") && vectide_core::distance::active_isa() != "scalar"
    })
}

/// The SIMD path, public for the tests that compare it with the scalar one.
#[cfg(target_arch = "x86_64")]
pub mod x86 {
    use super::KSUB;
    use std::arch::x86_64::*;

    /// Whether this CPU can run [`lookup_avx2`].
    pub fn available() -> bool {
        std::is_x86_feature_detected!("avx2")
    }

    /// The distances of four codes, `codes[id·m..(id + 1)·m]` for each id,
    /// with four independent accumulators.
    ///
    /// # Safety
    /// The CPU must support AVX2; `(id + 1)·m <= codes.len()` for every id
    /// and `m * KSUB <= table.len()`.
    #[target_feature(enable = "avx2")]
    pub unsafe fn lookup4_avx2(table: &[f32], m: usize, codes: &[u8], ids: [u32; 4]) -> [f32; 4] {
        let lane = _mm256_setr_epi32(0, 256, 512, 768, 1024, 1280, 1536, 1792);
        let mut acc = [_mm256_setzero_ps(); 4];
        let base = ids.map(|i| i as usize * m);
        let mut j = 0;
        while j + 8 <= m {
            let off = _mm256_add_epi32(lane, _mm256_set1_epi32((j * KSUB) as i32));
            for k in 0..4 {
                // SAFETY: `base[k] + j + 8 <= base[k] + m <= codes.len()`:
                // the 8-byte load is in bounds; each gathered index is
                // `(j + l)·256 + code byte < m·256 <= table.len()`.
                unsafe {
                    let bytes = _mm_loadl_epi64(codes.as_ptr().add(base[k] + j) as *const __m128i);
                    let idx = _mm256_add_epi32(_mm256_cvtepu8_epi32(bytes), off);
                    acc[k] = _mm256_add_ps(acc[k], _mm256_i32gather_ps::<4>(table.as_ptr(), idx));
                }
            }
            j += 8;
        }
        let mut out = [0f32; 4];
        for k in 0..4 {
            let mut lanes = [0f32; 8];
            // SAFETY: `lanes` has room for the 8 floats stored.
            unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), acc[k]) };
            let mut s = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3]))
                + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
            for jj in j..m {
                s += table[jj * KSUB + codes[base[k] + jj] as usize];
            }
            out[k] = s;
        }
        out
    }

    /// AVX2 lookup: eight subspaces per gather.
    ///
    /// # Safety
    /// The CPU must support AVX2, and `m <= code.len()`,
    /// `m * KSUB <= table.len()`.
    #[target_feature(enable = "avx2")]
    pub unsafe fn lookup_avx2(table: &[f32], m: usize, code: &[u8]) -> f32 {
        debug_assert!(m <= code.len() && m * KSUB <= table.len());
        let lane = _mm256_setr_epi32(0, 256, 512, 768, 1024, 1280, 1536, 1792);
        let mut acc = _mm256_setzero_ps();
        let mut j = 0;
        while j + 8 <= m {
            // SAFETY: `j + 8 <= m <= code.len()`: the 8-byte load is in
            // bounds. Each gathered index is `(j + l)·256 + code[j + l]` for
            // lane `l < 8`, below `m·256 <= table.len()`.
            unsafe {
                let bytes = _mm_loadl_epi64(code.as_ptr().add(j) as *const __m128i);
                let idx = _mm256_add_epi32(
                    _mm256_add_epi32(_mm256_cvtepu8_epi32(bytes), lane),
                    _mm256_set1_epi32((j * KSUB) as i32),
                );
                acc = _mm256_add_ps(acc, _mm256_i32gather_ps::<4>(table.as_ptr(), idx));
            }
            j += 8;
        }
        let mut lanes = [0f32; 8];
        // SAFETY: `lanes` has room for the 8 floats stored (unaligned store).
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), acc) };
        let mut s = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3]))
            + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
        while j < m {
            s += table[j * KSUB + code[j] as usize];
            j += 1;
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::Rng;

    fn data(n: usize, dim: usize, seed: u64) -> Vec<f32> {
        let mut rng = StdRng::seed_from_u64(seed);
        (0..n * dim).map(|_| rng.gen_range(-1.0f32..1.0)).collect()
    }

    #[test]
    fn batched_lookups_match_one_at_a_time() {
        let dim = 50;
        let x = data(2000, dim, 3);
        for m in [5usize, 16, 32, 50] {
            let pq = ProductQuantizer::train(&x, dim, &PqParams::new(m)).unwrap();
            let codes = pq.encode_all(&x).unwrap();
            let t = pq.table(&x[..dim], Metric::L2).unwrap();
            let ids: Vec<u32> = (0..23).map(|i| (i * 83) % 2000).collect();
            let mut out = Vec::new();
            t.distances_at(&codes, &ids, &mut out).unwrap();
            for (&i, &d) in ids.iter().zip(&out) {
                let one = t.distance(&codes[i as usize * m..(i as usize + 1) * m]);
                assert!(
                    (d - one).abs() <= 1e-4 * one.abs().max(1.0),
                    "m {m} id {i}: {d} vs {one}"
                );
            }
            assert!(t.distances_at(&codes, &[2000], &mut out).is_err());
        }
    }

    #[test]
    fn uneven_subspaces_cover_every_dimension_once() {
        assert_eq!(subspaces(50, 32)[..4], [0, 2, 4, 6]);
        let o = subspaces(50, 32);
        assert_eq!((o.len(), o[18], o[32]), (33, 36, 50));
        assert!(o.windows(2).all(|w| w[1] - w[0] == 1 || w[1] - w[0] == 2));
        assert_eq!(subspaces(8, 8), (0..=8).collect::<Vec<_>>());
    }

    #[test]
    fn decode_is_each_subspace_centroid_plus_the_mean() {
        let dim = 7;
        let x = data(1000, dim, 4);
        let pq = ProductQuantizer::train(&x, dim, &PqParams::new(3)).unwrap();
        let o = subspaces(dim, 3);
        let mut out = vec![0f32; dim];
        for code in [[0u8, 0, 0], [255, 1, 17], [9, 200, 255]] {
            pq.decode(&code, &mut out).unwrap();
            for j in 0..3 {
                let (a, b) = (o[j], o[j + 1]);
                let row = &pq.codebooks()[KSUB * a + code[j] as usize * (b - a)..][..b - a];
                for t in a..b {
                    assert_eq!(out[t], row[t - a] + pq.mean()[t]);
                }
            }
        }
    }

    #[test]
    fn adc_equals_the_exact_distance_to_the_decoded_vector() {
        let dim = 12;
        let x = data(2000, dim, 1);
        let pq = ProductQuantizer::train(&x, dim, &PqParams::new(5)).unwrap();
        let codes = pq.encode_all(&x).unwrap();
        let q = data(3, dim, 9);
        let mut dec = vec![0f32; dim];
        for metric in [Metric::L2, Metric::Ip, Metric::Cosine] {
            for qv in q.chunks(dim) {
                let t = pq.table(qv, metric).unwrap();
                for code in codes.chunks(5).take(200) {
                    pq.decode(code, &mut dec).unwrap();
                    let exact = match metric {
                        Metric::L2 => qv
                            .iter()
                            .zip(&dec)
                            .map(|(a, b)| (a - b) * (a - b))
                            .sum::<f32>(),
                        Metric::Ip => -qv.iter().zip(&dec).map(|(a, b)| a * b).sum::<f32>(),
                        Metric::Cosine => {
                            1.0 - qv.iter().zip(&dec).map(|(a, b)| a * b).sum::<f32>()
                        }
                    };
                    assert!((t.distance(code) - exact).abs() < 1e-4, "{metric:?}");
                }
            }
        }
    }

    #[test]
    fn encode_picks_the_nearest_sub_centroid_by_brute_force() {
        let dim = 6;
        let x = data(600, dim, 2);
        let pq = ProductQuantizer::train(&x, dim, &PqParams::new(4)).unwrap();
        let mut code = vec![0u8; 4];
        let offs = subspaces(dim, 4);
        for v in x.chunks(dim).take(50) {
            pq.encode(v, &mut code).unwrap();
            for j in 0..4 {
                let (a, b) = (offs[j], offs[j + 1]);
                let d = |c: usize| -> f32 {
                    (a..b)
                        .map(|i| {
                            let cen = pq.codebooks[KSUB * a + c * (b - a) + (i - a)];
                            let r = v[i] - pq.mean[i] - cen;
                            r * r
                        })
                        .sum()
                };
                let best = (0..KSUB).map(d).fold(f32::INFINITY, f32::min);
                assert!(d(code[j] as usize) <= best + 1e-6);
            }
        }
    }

    #[test]
    fn simd_lookup_matches_the_scalar_one() {
        #[cfg(target_arch = "x86_64")]
        if x86::available() {
            let mut rng = StdRng::seed_from_u64(4);
            for m in [1usize, 7, 8, 9, 16, 32, 33, 64] {
                let table: Vec<f32> = (0..m * KSUB).map(|_| rng.gen_range(-3.0f32..3.0)).collect();
                let code: Vec<u8> = (0..m).map(|_| rng.gen()).collect();
                let a = lookup_scalar(&table, m, &code);
                // SAFETY: AVX2 checked above; code and table have m entries.
                let b = unsafe { x86::lookup_avx2(&table, m, &code) };
                assert!((a - b).abs() <= 1e-4 * (1.0 + a.abs()), "m {m}: {a} vs {b}");
            }
        }
    }

    #[test]
    fn parts_round_trip_and_bad_input_is_an_error() {
        let x = data(300, 4, 3);
        let pq = ProductQuantizer::train(&x, 4, &PqParams::new(2)).unwrap();
        let back = ProductQuantizer::from_parts(4, 2, pq.mean().to_vec(), pq.codebooks().to_vec())
            .unwrap();
        assert_eq!(back, pq);
        assert!(ProductQuantizer::from_parts(4, 2, vec![0.0; 3], pq.codebooks().to_vec()).is_err());
        assert!(
            ProductQuantizer::from_parts(4, 5, pq.mean().to_vec(), pq.codebooks().to_vec())
                .is_err()
        );
        assert!(ProductQuantizer::train(&x, 4, &PqParams::new(0)).is_err());
        assert!(
            ProductQuantizer::train(&x, 4, &PqParams::new(5)).is_err(),
            "m > dim"
        );
        assert!(
            ProductQuantizer::train(&x[..400], 4, &PqParams::new(2)).is_err(),
            "fewer than 256 rows"
        );
        let mut code = [0u8; 2];
        assert!(pq.encode(&[0.0; 3], &mut code).is_err());
        assert!(pq.encode(&[0.0; 4], &mut [0u8; 3]).is_err());
        assert!(pq.table(&[0.0; 5], Metric::L2).is_err());
        assert!(pq.decode(&code, &mut [0.0; 2]).is_err());
    }
}
