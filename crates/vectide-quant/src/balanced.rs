//! Balanced k-means: clusters held under a size cap.
//!
//! SPANN (Chen et al., NeurIPS 2021, §3.2) wants postings of similar length,
//! so that every posting read costs about the same. Ordinary k-means gives
//! no bound: dense regions make giant clusters. Here, after ordinary
//! k-means, each round assigns the points under a **capacity**
//! `⌈(1 + slack) · n / k⌉`: points are placed in decreasing order of regret
//! (how much farther their second-nearest centre is than their nearest), each
//! into its nearest centre that still has room, and the centres then move to
//! the means of their points. The cap holds by construction, whatever the
//! data; with `slack = 0` and `k` dividing `n`, every cluster has exactly
//! `n / k` points.
//!
//! Candidates per point are its `candidates` nearest centres (default 8); a
//! point whose candidates are all full goes to its nearest centre with room
//! among all of them.

use crate::check_rows;
use crate::kmeans::{self, assign_rows, update_means, Centroids, KMeansParams};
use rand::rngs::StdRng;
use rand::SeedableRng;
use rayon::prelude::*;
use vectide_core::distance::l2_sq_fn;
use vectide_core::{Error, Result};

/// Parameters of [`balanced_kmeans`].
#[derive(Clone, Debug)]
pub struct BalancedParams {
    /// The k-means run it starts from (k, seed, iterations).
    pub kmeans: KMeansParams,
    /// Cluster size cap `⌈(1 + slack) · n / k⌉`.
    pub slack: f64,
    /// Capacity-constrained rounds after k-means.
    pub rounds: usize,
    /// Nearest centres tried per point before all of them are.
    pub candidates: usize,
}

impl BalancedParams {
    /// `k` clusters, slack 0.1, 3 rounds, 8 candidates.
    pub fn new(k: usize) -> Self {
        BalancedParams {
            kmeans: KMeansParams::new(k),
            slack: 0.1,
            rounds: 3,
            candidates: 8,
        }
    }
}

/// The cap on a cluster's size for `n` points in `k` clusters.
pub fn capacity(n: usize, k: usize, slack: f64) -> usize {
    (((1.0 + slack) * n as f64) / k as f64).ceil().max(1.0) as usize
}

/// Balanced k-means of `data` (`n × dim`): the centres and each row's
/// cluster; no cluster holds more than [`capacity`] rows.
pub fn balanced_kmeans(
    data: &[f32],
    dim: usize,
    p: &BalancedParams,
) -> Result<(Centroids, Vec<u32>)> {
    if !(0.0..=100.0).contains(&p.slack) || p.candidates == 0 {
        return Err(Error::invalid(
            "balanced k-means: slack must be in [0, 100] and candidates at least 1",
        ));
    }
    let n = check_rows(data, dim, p.kmeans.k, "balanced k-means")?;
    let k = p.kmeans.k;
    let mut centres = kmeans::train(data, dim, &p.kmeans)?.as_slice().to_vec();
    let cap = capacity(n, k, p.slack);
    let mut rng = StdRng::seed_from_u64(p.kmeans.seed ^ 0xba1a_4ced);
    let mut labels = constrained_assign(data, dim, &centres, cap, p.candidates);
    for _ in 0..p.rounds {
        let _ = update_means(data, dim, &labels, &mut centres, k, &mut rng);
        labels = constrained_assign(data, dim, &centres, cap, p.candidates);
    }
    Ok((Centroids::new(dim, centres)?, labels))
}

/// Greedy capacity-constrained assignment (see the module docs).
fn constrained_assign(
    data: &[f32],
    dim: usize,
    centres: &[f32],
    cap: usize,
    candidates: usize,
) -> Vec<u32> {
    let dist = l2_sq_fn();
    let k = centres.len() / dim;
    let c = candidates.min(k);
    // Each row's c nearest centres, closest first.
    let near: Vec<Vec<(u32, f32)>> = data
        .par_chunks_exact(dim)
        .with_min_len(256)
        .map(|x| {
            let mut all: Vec<(u32, f32)> = centres
                .chunks_exact(dim)
                .enumerate()
                .map(|(i, cen)| (i as u32, dist(x, cen)))
                .collect();
            if c < all.len() {
                all.select_nth_unstable_by(c, |a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
                all.truncate(c);
            }
            all.sort_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
            all
        })
        .collect();
    let regret = |v: &Vec<(u32, f32)>| {
        if v.len() > 1 {
            v[1].1 - v[0].1
        } else {
            f32::INFINITY
        }
    };
    let mut order: Vec<usize> = (0..near.len()).collect();
    order.sort_by(|&a, &b| {
        regret(&near[b])
            .total_cmp(&regret(&near[a]))
            .then(a.cmp(&b))
    });
    let mut sizes = vec![0usize; k];
    let mut labels = vec![0u32; near.len()];
    for row in order {
        let pick = near[row]
            .iter()
            .map(|&(cl, _)| cl)
            .find(|&cl| sizes[cl as usize] < cap)
            .unwrap_or_else(|| {
                // Every candidate is full: the nearest centre with room.
                let x = &data[row * dim..(row + 1) * dim];
                (0..k)
                    .filter(|&cl| sizes[cl] < cap)
                    .map(|cl| (cl as u32, dist(x, &centres[cl * dim..(cl + 1) * dim])))
                    .min_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)))
                    .map(|(cl, _)| cl)
                    // k · cap ≥ n, so some centre has room while rows remain.
                    .unwrap_or(0)
            });
        sizes[pick as usize] += 1;
        labels[row] = pick;
    }
    labels
}

/// Hierarchical balanced k-means, as SPANN chooses its posting centroids
/// (Chen et al., NeurIPS 2021, §3.2: a hierarchy of balanced clusterings
/// keeps the postings of similar length at any scale): the rows are split
/// into `branch` balanced clusters, and every cluster above `leaf` rows is
/// split again, until each holds at most `leaf`. A cluster that needs at
/// most `branch` parts is split once into `⌈size / leaf⌉` with no slack,
/// so no leaf exceeds `leaf` rows. Returns the leaves' centres (the means
/// of their rows) and each row's leaf. Deterministic for a seed.
pub fn hierarchical_balanced(
    data: &[f32],
    dim: usize,
    leaf: usize,
    branch: usize,
    seed: u64,
) -> Result<(Centroids, Vec<u32>)> {
    if leaf == 0 || branch < 2 {
        return Err(Error::invalid(
            "hierarchical k-means: leaf must be at least 1 and branch at least 2",
        ));
    }
    let n = check_rows(data, dim, 1, "hierarchical k-means")?;
    let mut centres: Vec<f32> = Vec::new();
    let mut labels = vec![0u32; n];
    let mut stack: Vec<Vec<u32>> = vec![(0..n as u32).collect()];
    let mut sub: Vec<f32> = Vec::new();
    let mut round = 0u64;
    while let Some(rows) = stack.pop() {
        if rows.len() <= leaf {
            let id = (centres.len() / dim) as u32;
            let at = centres.len();
            centres.resize(at + dim, 0.0);
            for &r in &rows {
                labels[r as usize] = id;
                let x = &data[r as usize * dim..(r as usize + 1) * dim];
                centres[at..].iter_mut().zip(x).for_each(|(c, v)| *c += v);
            }
            let inv = 1.0 / rows.len().max(1) as f32;
            centres[at..].iter_mut().for_each(|c| *c *= inv);
            continue;
        }
        let parts = rows.len().div_ceil(leaf);
        let (k, slack) = if parts <= branch {
            (parts, 0.0)
        } else {
            (branch, 0.1)
        };
        sub.clear();
        for &r in &rows {
            sub.extend_from_slice(&data[r as usize * dim..(r as usize + 1) * dim]);
        }
        round += 1;
        let mut p = BalancedParams::new(k);
        p.slack = slack;
        p.kmeans = p
            .kmeans
            .seed(seed.wrapping_add(round.wrapping_mul(0x9e37_79b9)));
        let (_, l) = balanced_kmeans(&sub, dim, &p)?;
        let mut groups: Vec<Vec<u32>> = vec![Vec::new(); k];
        for (&r, &c) in rows.iter().zip(&l) {
            groups[c as usize].push(r);
        }
        // Identical rows can leave k-means with one group holding all of
        // a cluster: split it by position so the recursion always ends.
        if groups.iter().filter(|g| !g.is_empty()).count() == 1 {
            groups = rows.chunks(leaf).map(|c| c.to_vec()).collect();
        }
        stack.extend(groups.into_iter().filter(|g| !g.is_empty()).rev());
    }
    Ok((Centroids::new(dim, centres)?, labels))
}

/// Sizes of the clusters of `labels` (for reports and tests).
pub fn sizes(labels: &[u32], k: usize) -> Vec<usize> {
    let mut s = vec![0usize; k];
    for &l in labels {
        if let Some(v) = s.get_mut(l as usize) {
            *v += 1;
        }
    }
    s
}

/// Unconstrained nearest-centre labels (for comparisons in tests).
pub fn nearest_labels(centres: &Centroids, data: &[f32]) -> Vec<u32> {
    assign_rows(l2_sq_fn(), centres.as_slice(), centres.dim(), data)
        .into_iter()
        .map(|(c, _)| c)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::Rng;

    /// One dense blob and a sparse spread: plain k-means makes one cluster
    /// much larger than the rest.
    fn skewed(seed: u64) -> Vec<f32> {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut v = Vec::new();
        for _ in 0..1500 {
            v.extend((0..3).map(|_| rng.gen_range(-0.5f32..0.5)));
        }
        for _ in 0..500 {
            v.extend((0..3).map(|_| rng.gen_range(-40f32..40.0)));
        }
        v
    }

    #[test]
    fn no_cluster_exceeds_the_cap_and_rows_keep_good_centres() {
        let data = skewed(1);
        let n = data.len() / 3;
        let mut p = BalancedParams::new(10);
        let plain = kmeans::train(&data, 3, &p.kmeans).unwrap();
        let plain_max = *sizes(&nearest_labels(&plain, &data), 10)
            .iter()
            .max()
            .unwrap();
        let (c, labels) = balanced_kmeans(&data, 3, &p).unwrap();
        let cap = capacity(n, 10, p.slack);
        let s = sizes(&labels, 10);
        assert!(
            plain_max > cap,
            "the data must be skewed for this test ({plain_max} <= {cap})"
        );
        assert!(s.iter().all(|&x| x <= cap), "{s:?} over {cap}");
        assert_eq!(s.iter().sum::<usize>(), n);
        // A row is either with its nearest centre or that centre is full.
        let near = nearest_labels(&c, &data);
        for (row, (&l, &nl)) in labels.iter().zip(&near).enumerate() {
            assert!(l == nl || s[nl as usize] == cap, "row {row}");
        }
        p.slack = 0.0;
        let (_, labels) = balanced_kmeans(&data, 3, &p).unwrap();
        let s = sizes(&labels, 10);
        assert!(
            s.iter().max().unwrap() - s.iter().min().unwrap() <= 1,
            "{s:?}"
        );
    }

    #[test]
    fn bad_input_is_an_error() {
        let mut p = BalancedParams::new(2);
        p.slack = -1.0;
        assert!(balanced_kmeans(&[0.0; 8], 2, &p).is_err());
        let p = BalancedParams::new(5);
        assert!(
            balanced_kmeans(&[0.0; 8], 2, &p).is_err(),
            "fewer rows than k"
        );
    }

    #[test]
    fn hierarchical_leaves_hold_at_most_leaf_rows_and_centres_are_their_means() {
        let data = skewed(3);
        let n = data.len() / 3;
        let (c, labels) = hierarchical_balanced(&data, 3, 7, 4, 9).unwrap();
        let s = sizes(&labels, c.k());
        assert!(s.iter().all(|&x| (1..=7).contains(&x)), "{s:?}");
        assert_eq!(s.iter().sum::<usize>(), n);
        // Balanced: about n / leaf leaves, not one per row.
        assert!(c.k() >= n / 7 && c.k() <= 2 * n / 7, "{} leaves", c.k());
        for (id, &size) in s.iter().enumerate() {
            let mut mean = [0f32; 3];
            for (r, _) in labels
                .iter()
                .enumerate()
                .filter(|&(_, &l)| l as usize == id)
            {
                (0..3).for_each(|j| mean[j] += data[r * 3 + j] / size as f32);
            }
            for (m, x) in mean.iter().zip(c.centroid(id)) {
                assert!((m - x).abs() < 1e-3);
            }
        }
        // Rows sit with their near neighbours: most rows' leaf centre is
        // among their 3 nearest centres.
        let near = (0..n)
            .filter(|&r| {
                let mut d: Vec<(u32, f32)> = Vec::new();
                c.nearest_n(&data[r * 3..r * 3 + 3], 3, &mut d);
                d.iter().any(|&(id, _)| id == labels[r])
            })
            .count();
        assert!(near * 10 > n * 7, "{near} of {n}");
        let again = hierarchical_balanced(&data, 3, 7, 4, 9).unwrap();
        assert_eq!(again.1, labels, "deterministic");
    }

    #[test]
    fn hierarchical_ends_on_identical_rows_and_rejects_bad_shapes() {
        let data = vec![1.0f32; 3 * 100];
        let (c, labels) = hierarchical_balanced(&data, 3, 8, 4, 0).unwrap();
        assert!(sizes(&labels, c.k()).iter().all(|&x| x <= 8));
        assert!(hierarchical_balanced(&data, 3, 0, 4, 0).is_err());
        assert!(hierarchical_balanced(&data, 3, 8, 1, 0).is_err());
        assert!(hierarchical_balanced(&[f32::NAN; 3], 3, 8, 4, 0).is_err());
    }
}
