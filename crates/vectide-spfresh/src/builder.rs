//! Pieces of SPANN's static build (Chen et al., NeurIPS 2021, §3.2) that
//! SPFresh's inserts and reassigns reuse: so far the replica rule.
//!
//! A vector on the boundary of two clusters is stored in several postings,
//! so that a query landing on either side finds it. SPANN caps the copies
//! at `replicas` (8 in the public code, `ReplicaCount`) and keeps a copy in
//! a further posting only when that posting's centroid is not "covered" by
//! a centroid already chosen: the relative-neighbourhood-graph rule. Its
//! public code (`ApproximateRNG` in SPTAG's `VectorIndex.cpp`; the
//! `RNGFactor` parameter, default 1.0) rejects candidate `c` when some
//! chosen `s` has `factor · d(c, s) ≤ d(v, c)`.

use vectide_core::metric::DistanceFn;

/// SPANN's replica rule: walks `cands` — `(d(v, c), c)`, nearest first —
/// and keeps `c` unless a centroid already kept, `s`, has
/// `factor · d(c, s) ≤ d(v, c)`; stops after `replicas`. The kept
/// centroids, nearest first, go to `out`. The nearest candidate is always
/// kept.
pub fn rng_select<'a>(
    dist: DistanceFn,
    cands: &[(f32, u32)],
    centroid: impl Fn(u32) -> &'a [f32],
    replicas: usize,
    factor: f32,
    out: &mut Vec<u32>,
) {
    out.clear();
    for &(dv, c) in cands {
        if out.len() >= replicas {
            break;
        }
        let vc = centroid(c);
        if out.iter().all(|&s| factor * dist(vc, centroid(s)) > dv) {
            out.push(c);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use vectide_core::Metric;

    /// Points on a line: the rule, worked by hand.
    #[test]
    fn a_centroid_behind_a_chosen_one_is_covered() {
        let dist = Metric::L2.distance_fn();
        // v at 0; centroids at 1, 2 (behind 1), -1.5 (the other side).
        let cs = [[1.0f32], [2.0], [-1.5]];
        let v = [0.0f32];
        let mut cands: Vec<(f32, u32)> = (0..3).map(|i| (dist(&v, &cs[i]), i as u32)).collect();
        cands.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut out = Vec::new();
        rng_select(dist, &cands, |c| &cs[c as usize], 8, 1.0, &mut out);
        // 2 is at distance² 1 from 1 and 4 from v: covered. -1.5 is at
        // 6.25 from 1 and 2.25 from v: kept.
        assert_eq!(out, [0, 2]);
        rng_select(dist, &cands, |c| &cs[c as usize], 1, 1.0, &mut out);
        assert_eq!(out, [0]);
        // A factor that makes every edge long enough keeps them all.
        rng_select(dist, &cands, |c| &cs[c as usize], 8, 10.0, &mut out);
        assert_eq!(out, [0, 2, 1]);
    }

    proptest! {
        /// The rule's properties: the nearest is kept; at most `replicas`;
        /// kept nearest first; each kept centroid is not covered by any kept
        /// before it; each candidate left out while there was room is
        /// covered by a kept one nearer to the vector.
        #[test]
        fn the_kept_set_obeys_the_rule(
            pts in prop::collection::vec(prop::collection::vec(-4.0f32..4.0, 3), 2..30),
            replicas in 1usize..9,
            factor in 0.5f32..2.0,
        ) {
            let dist = Metric::L2.distance_fn();
            let v = &pts[0];
            let cs = &pts[1..];
            let mut cands: Vec<(f32, u32)> =
                cs.iter().enumerate().map(|(i, c)| (dist(v, c), i as u32)).collect();
            cands.sort_by(|a, b| a.0.total_cmp(&b.0));
            let mut out = Vec::new();
            rng_select(dist, &cands, |c| &cs[c as usize], replicas, factor, &mut out);
            prop_assert!(!out.is_empty() && out.len() <= replicas);
            prop_assert_eq!(out[0], cands[0].1);
            let rank = |c: u32| cands.iter().position(|x| x.1 == c).unwrap();
            let covers = |s: u32, c: u32| {
                factor * dist(&cs[c as usize], &cs[s as usize]) <= dist(v, &cs[c as usize])
            };
            for (i, &c) in out.iter().enumerate() {
                for &s in &out[..i] {
                    prop_assert!(rank(s) < rank(c));
                    prop_assert!(!covers(s, c), "kept {} is covered by {}", c, s);
                }
            }
            let last = if out.len() == replicas { rank(*out.last().unwrap()) } else { cands.len() - 1 };
            for &(_, c) in &cands[..=last] {
                if !out.contains(&c) {
                    prop_assert!(
                        out.iter().any(|&s| rank(s) < rank(c) && covers(s, c)),
                        "{} was left out uncovered", c
                    );
                }
            }
        }
    }
}
