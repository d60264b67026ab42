//! Maximal marginal relevance: how two vectors compare and the order in
//! which Qdrant's MMR picks the candidates.

use crate::spaces::VectorValue;
use vectide_core::Metric;

/// How MMR compares two vectors: a dense space's metric as a similarity
/// (cosine, dot product, negated squared Euclidean distance), or a sparse
/// space's dot product (0 without a shared index).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Similarity {
    Dense(Metric),
    Sparse,
}

impl Similarity {
    /// The similarity of `a` and `b` (larger is closer), in f64. These are
    /// the values qdrant-client's local mode ranks by
    /// (`calculate_distance_core`: the cosine of the two vectors, the dot
    /// product, minus the squared distance; sparse: the plain dot product,
    /// without the space's IDF), not the scores shown.
    pub fn of(self, a: &VectorValue, b: &VectorValue) -> f64 {
        match (self, a, b) {
            (Similarity::Sparse, VectorValue::Sparse(x), VectorValue::Sparse(y)) => {
                x.dot(y).map_or(0.0, f64::from)
            }
            (Similarity::Dense(metric), VectorValue::Dense(x), VectorValue::Dense(y)) => {
                let dot = || -> f64 {
                    x.iter()
                        .zip(y)
                        .map(|(p, q)| f64::from(*p) * f64::from(*q))
                        .sum()
                };
                match metric {
                    Metric::Ip => dot(),
                    Metric::L2 => -x
                        .iter()
                        .zip(y)
                        .map(|(p, q)| (f64::from(*p) - f64::from(*q)).powi(2))
                        .sum::<f64>(),
                    Metric::Cosine => {
                        let norm = |v: &[f32]| -> f64 {
                            v.iter().map(|p| f64::from(*p).powi(2)).sum::<f64>().sqrt()
                        };
                        let (nx, ny) = (norm(x), norm(y));
                        if nx == 0.0 || ny == 0.0 {
                            0.0
                        } else {
                            dot() / (nx * ny)
                        }
                    }
                }
            }
            // Vectors of one space are all of its kind.
            _ => 0.0,
        }
    }
}

/// Maximal marginal relevance over `candidates` (in the order searched):
/// the positions of at most `limit` of them, in the order picked. The
/// first pick is the candidate most similar to `query`; each next one
/// maximises `λ·sim(query, c) − (1 − λ)·max sim(c, picked)`. As Qdrant
/// does it (and qdrant-client's local mode after it, `_mmr`), the
/// candidates still pending are kept in a list that a pick leaves by a
/// swap-remove (the last one moves into its place), and a tie goes to the
/// last maximum in that list's order. Each candidate's largest similarity
/// to the picked ones is kept up to date as picks are added, so a pick
/// costs one similarity per pending candidate.
pub fn mmr_order(
    query: &VectorValue,
    candidates: &[VectorValue],
    sim: Similarity,
    lambda: f64,
    limit: usize,
) -> Vec<usize> {
    if candidates.is_empty() || limit == 0 {
        return Vec::new();
    }
    let relevance: Vec<f64> = candidates.iter().map(|c| sim.of(query, c)).collect();
    let mut closest = vec![f64::NEG_INFINITY; candidates.len()];
    let mut pending: Vec<usize> = (0..candidates.len()).collect();
    let first = last_argmax(pending.iter().map(|&i| relevance[i]));
    let mut picked = vec![pending.swap_remove(first)];
    while picked.len() < limit && !pending.is_empty() {
        let last = &candidates[picked[picked.len() - 1]];
        for &i in &pending {
            closest[i] = closest[i].max(sim.of(&candidates[i], last));
        }
        let next = last_argmax(
            pending
                .iter()
                .map(|&i| lambda * relevance[i] - (1.0 - lambda) * closest[i]),
        );
        picked.push(pending.swap_remove(next));
    }
    picked
}

/// The position of the largest value, the last one on ties (Rust's
/// `Iterator::max_by`, which Qdrant's MMR uses).
fn last_argmax(values: impl Iterator<Item = f64>) -> usize {
    let mut best = (0, f64::NEG_INFINITY);
    for (i, v) in values.enumerate() {
        if i == 0 || v >= best.1 {
            best = (i, v);
        }
    }
    best.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spaces::SparseVector;

    fn dense(x: f32, y: f32) -> VectorValue {
        VectorValue::Dense(vec![x, y])
    }

    #[test]
    fn mmr_picks_as_qdrant_does() {
        let dot = Similarity::Dense(Metric::Ip);
        // After the first pick (0), the last candidate takes its place in
        // the pending list ([3, 1, 2]); 1, 2 and 3 then tie, and the last
        // maximum in that order wins (2); then [3, 1] tie again: 1.
        let c = [
            dense(1.0, 0.0),
            dense(0.0, 1.0),
            dense(0.0, -1.0),
            dense(0.0, 1.0),
        ];
        assert_eq!(
            mmr_order(&dense(1.0, 0.0), &c, dot, 0.5, 10),
            vec![0, 2, 1, 3]
        );
        assert_eq!(mmr_order(&dense(1.0, 0.0), &c, dot, 0.5, 2), vec![0, 2]);
        // Equally relevant: the last is picked first.
        let same = [dense(0.0, 1.0), dense(0.0, -1.0)];
        assert_eq!(mmr_order(&dense(1.0, 0.0), &same, dot, 0.5, 1), vec![1]);
        // λ = 1 is the nearest order; λ = 0 keeps only the first pick by
        // relevance, then the least similar to the picks.
        let q = dense(1.0, 0.0);
        let c = [
            dense(1.0, 0.1),
            dense(1.0, 0.2),
            dense(1.0, -0.9),
            dense(1.0, 0.15),
        ];
        let cos = Similarity::Dense(Metric::Cosine);
        assert_eq!(mmr_order(&q, &c, cos, 1.0, 4), vec![0, 3, 1, 2]);
        assert_eq!(mmr_order(&q, &c, cos, 0.0, 2), vec![0, 2]);
        assert!(mmr_order(&q, &[], cos, 0.5, 3).is_empty());
        // Euclid ranks by minus the squared distance; sparse by the plain
        // dot product, 0 without a shared index.
        let l2 = Similarity::Dense(Metric::L2);
        assert_eq!(l2.of(&dense(1.0, 1.0), &dense(4.0, 5.0)), -25.0);
        let sp = |i: Vec<u32>, v: Vec<f32>| VectorValue::Sparse(SparseVector::new(i, v).unwrap());
        let s = Similarity::Sparse;
        assert_eq!(
            s.of(
                &sp(vec![1, 5], vec![2.0, 3.0]),
                &sp(vec![5, 9], vec![0.5, 1.0])
            ),
            1.5
        );
        assert_eq!(s.of(&sp(vec![1], vec![2.0]), &sp(vec![2], vec![1.0])), 0.0);
    }
}
