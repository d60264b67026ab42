//! How a benchmark judges search results, computed here once for every
//! front end (`vectide bench`, and the Python harness through the
//! extension's `recall_at_k`, `pareto_frontier` and `qps_at_recall`):
//!
//! - **recall@k**: the mean over queries of `|found[:k] ∩ truth[:k]| / k`.
//!   A found row may be shorter than `k`; duplicates count once and
//!   [`RESERVED_ID`] (the padding of missing results) never matches.
//! - **Pareto frontier** of `(recall, qps)` points: the points that no other
//!   point beats on both (recall ≥ and QPS ≥, one strictly), sorted by
//!   recall; along it QPS strictly decreases.
//! - **QPS at a recall target** `t`, from the frontier: `None` when no point
//!   reaches `t`; a point at exactly `t` gives its QPS; below the lowest
//!   frontier recall, the QPS of that lowest point (the fastest that
//!   reaches `t`: we do not extrapolate downwards); otherwise `log(QPS)` is
//!   interpolated linearly in recall between the two frontier points that
//!   bracket `t` (linearly in QPS if one of them is 0).

use crate::error::{Error, Result};
use crate::RESERVED_ID;

/// The recall targets the benchmarks report QPS at.
pub const RECALL_TARGETS: [f64; 3] = [0.9, 0.95, 0.99];

/// Recall within this of a target counts as reaching it.
const EPS: f64 = 1e-12;

/// Recall@k of result rows against ground-truth rows (one of each per
/// query). Errors: `k == 0`, no queries, a different number of result and
/// truth rows, a truth row with fewer than `k` ids.
pub fn recall_at_k<'f, 't>(
    found: impl ExactSizeIterator<Item = &'f [u64]>,
    truth: impl ExactSizeIterator<Item = &'t [u64]>,
    k: usize,
) -> Result<f64> {
    if k == 0 {
        return Err(Error::invalid("recall@k needs k >= 1"));
    }
    let nq = truth.len();
    if found.len() != nq {
        return Err(Error::invalid(format!(
            "{} result rows for {nq} queries",
            found.len()
        )));
    }
    if nq == 0 {
        return Err(Error::invalid("recall@k needs at least one query"));
    }
    let mut seen: Vec<u64> = Vec::with_capacity(k);
    let mut hits = 0usize;
    for (q, (f, t)) in found.zip(truth).enumerate() {
        let Some(t) = t.get(..k) else {
            return Err(Error::invalid(format!(
                "query {q}: {} ground-truth ids, fewer than k={k}",
                t.len()
            )));
        };
        seen.clear();
        seen.extend(f.iter().take(k).copied().filter(|&id| id != RESERVED_ID));
        seen.sort_unstable();
        seen.dedup();
        hits += t.iter().filter(|id| seen.binary_search(id).is_ok()).count();
    }
    Ok(hits as f64 / (nq * k) as f64)
}

/// The Pareto frontier of `(recall, qps)` points, by increasing recall
/// (points holding a NaN are left out).
pub fn pareto_frontier(points: &[(f64, f64)]) -> Vec<(f64, f64)> {
    let mut pts: Vec<(f64, f64)> = points
        .iter()
        .copied()
        .filter(|(r, q)| !r.is_nan() && !q.is_nan())
        .collect();
    // By decreasing recall; at equal recall the best QPS first.
    pts.sort_by(|a, b| b.0.total_cmp(&a.0).then(b.1.total_cmp(&a.1)));
    let mut frontier: Vec<(f64, f64)> = Vec::new();
    for (r, q) in pts {
        if frontier.last().is_none_or(|&(_, best)| q > best) {
            frontier.push((r, q));
        }
    }
    frontier.reverse();
    frontier
}

/// QPS at recall `target` (see the module docs for the rules).
pub fn qps_at_recall(points: &[(f64, f64)], target: f64) -> Option<f64> {
    let frontier = pareto_frontier(points);
    let &(top, _) = frontier.last()?;
    if top < target - EPS {
        return None;
    }
    if let Some(&(_, q)) = frontier.iter().find(|(r, _)| (r - target).abs() <= EPS) {
        return Some(q);
    }
    if target < frontier[0].0 {
        return Some(frontier[0].1);
    }
    frontier.windows(2).find_map(|w| {
        let ((r_lo, q_lo), (r_hi, q_hi)) = (w[0], w[1]);
        (r_lo < target && target < r_hi).then(|| {
            let x = (target - r_lo) / (r_hi - r_lo);
            if q_lo <= 0.0 || q_hi <= 0.0 {
                q_lo + x * (q_hi - q_lo)
            } else {
                (q_lo.ln() + x * (q_hi.ln() - q_lo.ln())).exp()
            }
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::seq::SliceRandom;
    use rand::{Rng, SeedableRng};

    /// Recall by its definition: for every truth id, whether it is among
    /// the first k found ids.
    fn brute_recall(found: &[Vec<u64>], truth: &[Vec<u64>], k: usize) -> f64 {
        let mut hits = 0;
        for (f, t) in found.iter().zip(truth) {
            let f = &f[..f.len().min(k)];
            hits += t[..k]
                .iter()
                .filter(|id| **id != RESERVED_ID && f.contains(id))
                .count();
        }
        hits as f64 / (truth.len() * k) as f64
    }

    fn rows(v: &[Vec<u64>]) -> impl ExactSizeIterator<Item = &[u64]> {
        v.iter().map(Vec::as_slice)
    }

    #[test]
    fn recall_matches_its_definition_on_random_rows() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for _ in 0..200 {
            let k = rng.gen_range(1..20);
            let nq = rng.gen_range(1..30);
            let truth: Vec<Vec<u64>> = (0..nq)
                .map(|_| {
                    let mut t: Vec<u64> = (0..40).collect();
                    t.shuffle(&mut rng);
                    t.truncate(k + rng.gen_range(0..3));
                    t
                })
                .collect();
            let found: Vec<Vec<u64>> = (0..nq)
                .map(|_| {
                    (0..rng.gen_range(0..k + 3))
                        .map(|_| {
                            if rng.gen_bool(0.1) {
                                RESERVED_ID
                            } else {
                                rng.gen_range(0..40)
                            }
                        })
                        .collect()
                })
                .collect();
            // Duplicates in found count once: dedupe the reference's input.
            let deduped: Vec<Vec<u64>> = found
                .iter()
                .map(|f| {
                    let mut out = Vec::new();
                    for &id in f.iter().take(k) {
                        if !out.contains(&id) {
                            out.push(id);
                        }
                    }
                    out
                })
                .collect();
            let want = brute_recall(&deduped, &truth, k);
            let got = recall_at_k(rows(&found), rows(&truth), k).unwrap();
            assert!((got - want).abs() < 1e-12, "k={k}: {got} vs {want}");
        }
    }

    #[test]
    fn recall_examples_and_refusals() {
        let truth = vec![vec![1, 2, 3, 9], vec![4, 5, 6, 9]];
        let found = vec![vec![3, 2, 7], vec![4, 4, RESERVED_ID]];
        let r = recall_at_k(rows(&found), rows(&truth), 3).unwrap();
        assert!((r - (2.0 / 3.0 + 1.0 / 3.0) / 2.0).abs() < 1e-12);
        let perfect = vec![vec![3, 1, 2], vec![6, 5, 4]];
        assert_eq!(recall_at_k(rows(&perfect), rows(&truth), 3).unwrap(), 1.0);
        // Ids past k do not count.
        let late = vec![vec![7, 8, 9, 1], vec![]];
        assert_eq!(recall_at_k(rows(&late), rows(&truth), 3).unwrap(), 0.0);
        assert!(recall_at_k(rows(&found), rows(&truth), 0).is_err());
        assert!(recall_at_k(rows(&found), rows(&truth), 5).is_err());
        assert!(recall_at_k(rows(&found[..1]), rows(&truth), 3).is_err());
        assert!(recall_at_k(rows(&[]), rows(&[]), 3).is_err());
    }

    /// The frontier by its definition: points no other point dominates.
    fn brute_frontier(points: &[(f64, f64)]) -> Vec<(f64, f64)> {
        let mut out: Vec<(f64, f64)> = points
            .iter()
            .copied()
            .filter(|&(r, q)| {
                !points
                    .iter()
                    .any(|&(r2, q2)| r2 >= r && q2 >= q && (r2 > r || q2 > q))
            })
            .collect();
        out.sort_by(|a, b| a.0.total_cmp(&b.0));
        out.dedup();
        out
    }

    #[test]
    fn frontier_matches_its_definition_on_random_sweeps() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        for _ in 0..300 {
            let n = rng.gen_range(0..12);
            // Coarse values, so that ties in recall and in QPS happen.
            let pts: Vec<(f64, f64)> = (0..n)
                .map(|_| {
                    (
                        rng.gen_range(80..100) as f64 / 100.0,
                        rng.gen_range(1..20) as f64 * 100.0,
                    )
                })
                .collect();
            let front = pareto_frontier(&pts);
            assert_eq!(front, brute_frontier(&pts), "{pts:?}");
            assert!(front.windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 > w[1].1));
            // QPS at a target: at least the QPS of every point reaching it
            // that the frontier interpolation lies above, and never more
            // than the fastest point reaching the lower bracket.
            for t in [0.85, 0.9, 0.95, 0.99] {
                let reaching: Vec<f64> =
                    pts.iter().filter(|p| p.0 >= t - EPS).map(|p| p.1).collect();
                match qps_at_recall(&pts, t) {
                    None => assert!(reaching.is_empty(), "{pts:?} at {t}"),
                    Some(q) => {
                        let best_reaching = reaching.iter().cloned().fold(f64::MIN, f64::max);
                        assert!(q >= best_reaching - 1e-9, "{pts:?} at {t}: {q}");
                        let fastest = pts.iter().map(|p| p.1).fold(f64::MIN, f64::max);
                        assert!(q <= fastest + 1e-9, "{pts:?} at {t}: {q}");
                    }
                }
            }
        }
    }

    #[test]
    fn qps_at_recall_rules() {
        let sweep = [
            (0.80, 1000.0),
            (0.90, 500.0),
            (0.95, 100.0),
            (0.85, 300.0),
            (0.99, 20.0),
        ];
        // Exact hits.
        assert_eq!(qps_at_recall(&sweep, 0.90), Some(500.0));
        assert_eq!(qps_at_recall(&sweep, 0.99), Some(20.0));
        // Bracketed: log-QPS interpolation (half way: the geometric mean).
        let q = qps_at_recall(&sweep, 0.925).unwrap();
        assert!((q - (500.0f64 * 100.0).sqrt()).abs() < 1e-9, "{q}");
        // The dominated (0.85, 300) plays no part.
        let q = qps_at_recall(&sweep, 0.875).unwrap();
        let want = (1000f64.ln() + 0.75 * 0.5f64.ln()).exp();
        assert!((q - want).abs() < 1e-9, "{q}");
        // Unreachable, empty.
        assert_eq!(qps_at_recall(&sweep, 0.995), None);
        assert_eq!(qps_at_recall(&[], 0.9), None);
        // Below the lowest frontier point: the fastest point reaching it.
        assert_eq!(
            qps_at_recall(&[(0.95, 900.0), (0.91, 400.0)], 0.90),
            Some(900.0)
        );
        // A zero QPS end: linear interpolation.
        assert_eq!(qps_at_recall(&[(0.8, 100.0), (1.0, 0.0)], 0.9), Some(50.0));
        // NaN points are left out.
        assert_eq!(
            pareto_frontier(&[(f64::NAN, 5.0), (0.5, 1.0)]),
            vec![(0.5, 1.0)]
        );
    }
}
