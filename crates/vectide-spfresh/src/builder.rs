//! SPANN's static build (Chen et al., NeurIPS 2021, §3.2): hierarchical
//! balanced k-means chooses the posting centroids (leaves of about
//! `1 / head_ratio` vectors), the centroids go into the centroid index,
//! each vector goes to up to `replicas` postings under the replica rule
//! below, and a posting longer than the split limit keeps its nearest
//! records (SPANN's "posting cut"; a vector every copy of which was cut is
//! kept in its nearest posting all the same, so none is lost).
//!
//! The replica rule, which SPFresh's inserts and reassigns reuse:
//!
//! A vector on the boundary of two clusters is stored in several postings,
//! so that a query landing on either side finds it. SPANN caps the copies
//! at `replicas` (8 in the public code, `ReplicaCount`) and keeps a copy in
//! a further posting only when that posting's centroid is not "covered" by
//! a centroid already chosen: the relative-neighbourhood-graph rule. Its
//! public code (`ApproximateRNG` in SPTAG's `VectorIndex.cpp`; the
//! `RNGFactor` parameter, default 1.0) rejects candidate `c` when some
//! chosen `s` has `factor · d(c, s) ≤ d(v, c)`.

use crate::blockstore::Swap;
use crate::heads::Heads;
use crate::layout::encode_record;
use crate::state::Inner;
use rayon::prelude::*;
use vectide_core::metric::DistanceFn;
use vectide_core::{Error, Result};
use vectide_quant::hierarchical_balanced;

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

/// The fault point of a static build, after its postings exist (tests of
/// a failed rebuild).
pub const BUILD_FAULT: vectide_core::fault::FaultSite =
    vectide_core::fault::FaultSite("spann.build");

/// Branching factor of the hierarchical k-means.
const BRANCH: usize = 16;

impl Inner {
    /// The static build of vectors `vids` (rows of `data`, normalised) into
    /// new postings, their centroids added to `heads` (the index in use,
    /// or a fresh one that a rebuild swaps in afterwards) and vectors
    /// routed by it (module docs). A first load holds the writer and the
    /// gate shared; a rebuild (`beside`) holds neither, and records each
    /// new posting as building (no snapshot records it) as it creates it.
    pub(crate) fn build(
        &self,
        heads: &Heads,
        vids: &[u32],
        data: &[f32],
        beside: bool,
    ) -> Result<()> {
        let dim = self.dim;
        let n = vids.len();
        if n == 0 {
            return Ok(());
        }
        let (cents, _) =
            hierarchical_balanced(data, dim, self.params.leaf(), BRANCH, self.params.seed)?;
        let k = cents.k();
        let mut pids = Vec::with_capacity(k);
        for _ in 0..k {
            pids.push(match beside {
                false => self.store.create_posting(&[])?,
                true => self.create_building(&[])?,
            });
        }
        heads.add(&pids, cents.as_slice())?;
        vectide_core::fault::hit(&self.dir, BUILD_FAULT)?;
        let l2 = self.l2();
        // (posting, distance, row) of every replica.
        let mut pairs: Vec<(u32, f32, u32)> = self.pool.install(|| {
            (0..n)
                .into_par_iter()
                .map_init(
                    || self.scratch(),
                    |sc, r| -> Result<Vec<(u32, f32, u32)>> {
                        let v = &data[r * dim..(r + 1) * dim];
                        self.route_in(heads, v, sc)?;
                        if sc.sel.is_empty() {
                            // Only when the centroid search found nothing.
                            let (c, _) = cents.nearest(v);
                            let p = pids[c as usize];
                            sc.sel.push(p);
                            sc.sel_inc.extend(heads.read().incarnation(p));
                        }
                        let heads = heads.read();
                        Ok(sc
                            .sel
                            .iter()
                            .map(|&p| (p, heads.get(p).map_or(f32::MAX, |c| l2(v, c)), r as u32))
                            .collect())
                    },
                )
                .collect::<Result<Vec<_>>>()
                .map(|v| v.into_iter().flatten().collect())
        })?;
        pairs.sort_unstable_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)));
        // The posting cut, keeping every row somewhere.
        let mut copies = vec![0u32; n];
        let mut keep = vec![false; pairs.len()];
        let mut at = 0;
        for g in pairs.chunk_by(|a, b| a.0 == b.0) {
            for (i, &(_, _, r)) in g.iter().enumerate() {
                if i < self.limit {
                    keep[at + i] = true;
                    copies[r as usize] += 1;
                }
            }
            at += g.len();
        }
        let mut nearest = vec![usize::MAX; n];
        for (i, &(_, d, r)) in pairs.iter().enumerate() {
            let best = &mut nearest[r as usize];
            if *best == usize::MAX || d < pairs[*best].1 {
                *best = i;
            }
        }
        for r in 0..n {
            if copies[r] == 0 {
                keep[nearest[r]] = true;
            }
        }
        let kept: Vec<(u32, f32, u32)> = pairs
            .iter()
            .zip(&keep)
            .filter(|(_, &k)| k)
            .map(|(p, _)| *p)
            .collect();
        let groups: Vec<&[(u32, f32, u32)]> = kept.chunk_by(|a, b| a.0 == b.0).collect();
        self.pool.install(|| {
            groups
                .par_iter()
                .map_init(Vec::new, |buf: &mut Vec<u8>, g| -> Result<()> {
                    let pid = g[0].0;
                    buf.clear();
                    for &(_, _, r) in *g {
                        let r = r as usize;
                        encode_record(buf, vids[r], 0, &data[r * dim..(r + 1) * dim]);
                    }
                    let _l = self.lock(pid);
                    let entry = self.store.entry(pid);
                    match self.store.put(pid, buf, &entry)? {
                        Swap::Done(_) if beside => {
                            if let Some(rb) = self.rebuilding.lock().as_mut() {
                                rb.homes
                                    .extend(g.iter().map(|&(_, _, r)| (vids[r as usize], pid)));
                            }
                            Ok(())
                        }
                        Swap::Done(_) => {
                            for &(_, _, r) in *g {
                                self.set_home(vids[r as usize], pid, 0);
                            }
                            Ok(())
                        }
                        _ => Err(Error::invalid(
                            "spann build: a new posting changed under the build",
                        )),
                    }
                })
                .collect::<Result<()>>()
        })
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
