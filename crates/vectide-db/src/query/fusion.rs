//! Fusing prefetches' answers, as Qdrant does: reciprocal rank fusion
//! (optionally weighted) and distribution-based score fusion.

use crate::ids::ExtId;
use std::collections::HashMap;

/// A candidate: id and score.
pub(super) type Scored = (ExtId, f32);

/// Reciprocal rank fusion: `1 / (rank + k)` summed over the sources (rank
/// from 0), best first; ties keep the order of first appearance. With
/// weights (one per source), a source of weight `w` adds
/// `1 / ((rank + 1) / w + k - 1)`, and nothing when `w <= 0` (its points
/// still join the answer, at 0), as qdrant-client's
/// `hybrid.fusion.reciprocal_rank_fusion` computes it; a weight of 1 is
/// the unweighted term.
pub fn rrf(sources: &[Vec<Scored>], k: f64, weights: Option<&[f64]>) -> Vec<Scored> {
    let mut fused = Fused::default();
    for (i, src) in sources.iter().enumerate() {
        let w = weights.and_then(|w| w.get(i)).copied().unwrap_or(1.0);
        for (rank, (id, _)) in src.iter().enumerate() {
            let s = if w <= 0.0 {
                0.0
            } else {
                1.0 / ((rank as f64 + 1.0) / w + k - 1.0)
            };
            fused.add(id, s);
        }
    }
    fused.sorted()
}

/// Distribution-based score fusion: each source's scores mapped by
/// `(s − (μ − 3σ)) / 6σ` (σ the sample deviation; a lone score or no
/// spread gives 0.5), summed, best first; ties keep the order of first
/// appearance.
pub fn dbsf(sources: &[Vec<Scored>]) -> Vec<Scored> {
    let mut fused = Fused::default();
    for src in sources.iter().filter(|s| !s.is_empty()) {
        let n = src.len() as f64;
        let xs: Vec<f64> = src.iter().map(|(_, s)| f64::from(*s)).collect();
        let mean = xs.iter().sum::<f64>() / n;
        let var = if src.len() > 1 {
            xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0)
        } else {
            0.0
        };
        let sd = var.sqrt();
        let (lo, hi) = (mean - 3.0 * sd, mean + 3.0 * sd);
        for ((id, _), x) in src.iter().zip(&xs) {
            let norm = if var == 0.0 {
                0.5
            } else {
                (x - lo) / (hi - lo)
            };
            fused.add(id, norm);
        }
    }
    fused.sorted()
}

/// Fused scores summed per id, remembering the order of first appearance
/// (Qdrant's fusions keep it for ties).
#[derive(Default)]
struct Fused {
    order: Vec<ExtId>,
    scores: HashMap<ExtId, f64>,
}

impl Fused {
    fn add(&mut self, id: &ExtId, s: f64) {
        match self.scores.get_mut(id) {
            Some(x) => *x += s,
            None => {
                self.order.push(id.clone());
                self.scores.insert(id.clone(), s);
            }
        }
    }

    /// The ids by score, best first, stable (ties in first-appearance order).
    fn sorted(self) -> Vec<Scored> {
        let mut out: Vec<(ExtId, f64)> = self
            .order
            .into_iter()
            .map(|id| {
                let s = self.scores[&id];
                (id, s)
            })
            .collect();
        out.sort_by(|a, b| b.1.total_cmp(&a.1));
        out.into_iter().map(|(id, s)| (id, s as f32)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(v: &[Scored]) -> Vec<u64> {
        v.iter()
            .map(|(id, _)| match id {
                ExtId::Num(n) => *n,
                _ => unreachable!(),
            })
            .collect()
    }

    fn src(xs: &[(u64, f32)]) -> Vec<Scored> {
        xs.iter().map(|&(i, s)| (ExtId::Num(i), s)).collect()
    }

    #[test]
    fn rrf_and_dbsf_follow_qdrant() {
        let a = src(&[(1, 0.9), (2, 0.8), (3, 0.1)]);
        let b = src(&[(3, 5.0), (4, 4.0)]);
        let r = rrf(&[a.clone(), b.clone()], 2.0, None);
        // 1: 1/2; 2: 1/3; 3: 1/4 + 1/2; 4: 1/3.
        assert_eq!(ids(&r), vec![3, 1, 2, 4]);
        assert!((r[0].1 - 0.75).abs() < 1e-6);
        let d = dbsf(&[a, b, Vec::new()]);
        // b: mean 4.5, sd 0.7071: 3 -> (5 - 2.379) / 4.243 = 0.618.
        assert_eq!(d.len(), 4);
        let s3 = d.iter().find(|x| x.0 == ExtId::Num(3)).unwrap().1;
        let m: f64 = (0.9 + 0.8 + 0.1) / 3.0;
        let sd = (((0.9 - m).powi(2) + (0.8 - m).powi(2) + (0.1 - m).powi(2)) / 2.0).sqrt();
        let want = (0.1 - (m - 3.0 * sd)) / (6.0 * sd)
            + (5.0 - (4.5 - 3.0 * 0.5f64.sqrt())) / (6.0 * 0.5f64.sqrt());
        assert!((f64::from(s3) - want).abs() < 1e-5, "{s3} vs {want}");
        let lone = dbsf(&[src(&[(9, 3.0)])]);
        assert_eq!(lone[0].1, 0.5);
    }

    #[test]
    fn weighted_rrf_follows_qdrant_client() {
        let a = src(&[(1, 0.9), (2, 0.8), (3, 0.1)]);
        let b = src(&[(3, 5.0), (4, 4.0)]);
        let plain = rrf(&[a.clone(), b.clone()], 2.0, None);
        let ones = rrf(&[a.clone(), b.clone()], 2.0, Some(&[1.0, 1.0]));
        assert_eq!(plain, ones);
        // Weight 3 on a: rank r adds 1 / ((r + 1) / 3 + 1); b as before.
        let w = rrf(&[a.clone(), b.clone()], 2.0, Some(&[3.0, 1.0]));
        let want = |x: f64| x as f32;
        assert_eq!(ids(&w), vec![3, 1, 2, 4]);
        assert_eq!(w[0].1, want(1.0 / (3.0 / 3.0 + 1.0) + 1.0 / 2.0));
        assert_eq!(w[1].1, want(1.0 / (1.0 / 3.0 + 1.0)));
        assert_eq!(w[2].1, want(1.0 / (2.0 / 3.0 + 1.0)));
        assert_eq!(w[3].1, want(1.0 / 3.0));
        // A weight of 0 or less adds nothing; its points stay, at 0, in
        // the order they first appeared.
        let z = rrf(&[a, b], 60.0, Some(&[0.0, -2.0]));
        assert_eq!(ids(&z), vec![1, 2, 3, 4]);
        assert!(z.iter().all(|x| x.1 == 0.0));
    }
}
