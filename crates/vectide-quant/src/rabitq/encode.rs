//! The multi-bit code of extended RaBitQ: for a unit vector `o'`, the
//! levels `c_i ∈ [0, 2^B)` whose centred vector `y_i = c_i − (2^B − 1)/2`
//! points most nearly along `o'` (largest `⟨y, o'⟩ / ‖y‖`).
//!
//! `y_i` takes the sign of `o'_i` and a magnitude `k_i + ½`, `k_i ∈ [0,
//! 2^(B−1))`. Scaling `|o'|` by `t` and rounding down gives `k_i(t) =
//! min(⌊t |o'_i|⌋, 2^(B−1) − 1)`; the best code is `k(t)` for one of the
//! critical `t` at which some `k_i` steps up (between two of them nothing
//! changes). All of them are visited in increasing order, the cosine kept
//! up to date in O(1) per step (`D (2^(B−1) − 1)` steps, sorted first), and
//! the best kept: the exact optimum over the grid, as the extended paper's
//! quantization finds it.

/// The levels of `o` (a unit vector, padded) with `bits` bits each, and
/// `⟨y, o⟩` for the code's centred vector `y`.
pub fn levels(o: &[f32], bits: u8) -> (Vec<u8>, f64) {
    debug_assert!((2..=super::MAX_BITS).contains(&bits));
    let top = 1u32 << (bits - 1); // magnitudes 0..top
    let a: Vec<f64> = o.iter().map(|x| f64::from(x.abs())).collect();
    let mut events: Vec<(f64, u32)> = Vec::with_capacity(a.len() * (top as usize - 1));
    for (i, &ai) in a.iter().enumerate() {
        if ai > 0.0 {
            for k in 1..top {
                events.push((f64::from(k) / ai, i as u32));
            }
        }
    }
    events.sort_unstable_by(|x, y| x.0.total_cmp(&y.0));
    // All k = 0 first.
    let mut num: f64 = a.iter().map(|x| 0.5 * x).sum();
    let mut den: f64 = 0.25 * a.len() as f64;
    let mut k = vec![0u32; a.len()];
    let (mut best, mut best_at) = (num / den.sqrt(), 0usize);
    for (n, &(_, i)) in events.iter().enumerate() {
        let i = i as usize;
        k[i] += 1;
        num += a[i];
        // (k + ½)² − (k − ½)² = 2k.
        den += 2.0 * f64::from(k[i]);
        let cos = num / den.sqrt();
        if cos > best {
            best = cos;
            best_at = n + 1;
        }
    }
    k.fill(0);
    for &(_, i) in &events[..best_at] {
        k[i as usize] += 1;
    }
    let mut ip = 0f64;
    let codes = o
        .iter()
        .zip(&k)
        .zip(&a)
        .map(|((&x, &ki), &ai)| {
            ip += (f64::from(ki) + 0.5) * ai;
            if x > 0.0 {
                (top + ki) as u8
            } else {
                (top - 1 - ki) as u8
            }
        })
        .collect();
    (codes, ip)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn cos(codes: &[u8], o: &[f32], bits: u8) -> f64 {
        let mid = f64::from((1u32 << bits) - 1) / 2.0;
        let y: Vec<f64> = codes.iter().map(|&c| f64::from(c) - mid).collect();
        let ip: f64 = y.iter().zip(o).map(|(a, b)| a * f64::from(*b)).sum();
        ip / y.iter().map(|x| x * x).sum::<f64>().sqrt()
    }

    fn unit(rng: &mut rand::rngs::StdRng, d: usize) -> Vec<f32> {
        let v: Vec<f32> = (0..d)
            .map(|_| rng.gen_range(-1.0f32..1.0).powi(3))
            .collect();
        let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        v.iter().map(|x| x / n).collect()
    }

    #[test]
    fn the_levels_beat_every_other_scale_and_keep_the_signs() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(9);
        for bits in [2u8, 3, 4, 6] {
            let top = 1u32 << (bits - 1);
            let o = unit(&mut rng, 64);
            let (codes, ip) = levels(&o, bits);
            let best = cos(&codes, &o, bits);
            for (c, x) in codes.iter().zip(&o) {
                assert_eq!(u32::from(*c) >= top, *x > 0.0);
            }
            let mid = f64::from((1u32 << bits) - 1) / 2.0;
            let want: f64 = codes
                .iter()
                .zip(&o)
                .map(|(&c, &x)| (f64::from(c) - mid) * f64::from(x))
                .sum();
            assert!((ip - want).abs() < 1e-9);
            // Any scale's rounding is no better.
            for s in 1..400 {
                let t = f64::from(s) * 0.1;
                let alt: Vec<u8> = o
                    .iter()
                    .map(|&x| {
                        let k = ((t * f64::from(x.abs())).floor() as u32).min(top - 1);
                        if x > 0.0 {
                            (top + k) as u8
                        } else {
                            (top - 1 - k) as u8
                        }
                    })
                    .collect();
                assert!(cos(&alt, &o, bits) <= best + 1e-12, "bits {bits} t {t}");
            }
            // More bits, a closer direction.
            if bits < 6 {
                let (more, _) = levels(&o, bits + 1);
                assert!(cos(&more, &o, bits + 1) >= best - 1e-12);
            }
        }
    }
}
