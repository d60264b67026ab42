//! Parameters of `fresh-vamana` and their schema, with the paper's
//! defaults (FreshDiskANN §6.2: R = 64, L = 75, α = 1.2).

use vectide_core::engine::THREADS;
use vectide_core::params::check_params;
use vectide_core::{limits, Error, ParamKind, ParamSpec, ParamValue, Params, ParamsExt, Result};
use vectide_graph::hnsw_params::CONSOLIDATE_FRACTION;

/// Largest out-degree bound.
pub const MAX_R: usize = 512;

/// Room of a list beyond `r`: a back-edge is appended while the list holds
/// fewer than `slack_cap(r)` ids, and only a list that would pass that is
/// pruned (back to `r`). DiskANN's `GRAPH_SLACK_FACTOR` is 1.3; without the
/// slack nearly every back-edge into a full list is pruned away again, and
/// points far from the rest (an outlier, an upsert that moved) are left
/// with no in-edge.
pub const SLACK: f64 = 1.3;

/// The physical capacity of a list: `⌈SLACK · r⌉`.
pub fn slack_cap(r: usize) -> usize {
    (r as f64 * SLACK).ceil() as usize
}

/// `r`: out-degree bound.
pub const R: ParamSpec = ParamSpec {
    name: "r",
    kind: ParamKind::Int {
        min: 2,
        max: MAX_R as i64,
    },
    default: "64",
    doc: "out-degree bound R of every node",
    source: "FreshDiskANN §6.2 (R = 64)",
};
/// `l_build`: candidate list of inserts.
pub const L_BUILD: ParamSpec = ParamSpec {
    name: "l_build",
    kind: ParamKind::Int {
        min: 1,
        max: limits::MAX_EF as i64,
    },
    default: "75",
    doc: "search list size L of an insert's GreedySearch (its visited set feeds RobustPrune)",
    source: "FreshDiskANN §6.2 (L_c = 75)",
};
/// `l_search`: the default of the `ef` knob.
pub const L_SEARCH: ParamSpec = ParamSpec {
    name: "l_search",
    kind: ParamKind::Int {
        min: 1,
        max: limits::MAX_EF as i64,
    },
    default: "64",
    doc: "default search list size L_s of a query (the ef knob; raised to k)",
    source: "Vectide (the same default as hnsw's ef_search; sweep it with the ef knob)",
};
/// `alpha`: RobustPrune's distance threshold.
pub const ALPHA: ParamSpec = ParamSpec {
    name: "alpha",
    kind: ParamKind::Float { min: 1.0, max: 4.0 },
    default: "1.2",
    doc: "α of RobustPrune: an edge (p, c) goes only if a kept r has α·d(r, c) ≤ d(p, c) (inner product uses 1)",
    source: "FreshDiskANN §6.2 (α = 1.2)",
};
/// `seed`: the random start graph of a bulk build.
pub const SEED: ParamSpec = ParamSpec {
    name: "seed",
    kind: ParamKind::Int {
        min: 0,
        max: i64::MAX,
    },
    default: "0x5eedec7d",
    doc: "seed of the random R-regular start graph and of the build order of a bulk load",
    source: "Vectide",
};

/// Every parameter `fresh-vamana` takes.
pub static PARAMS: [ParamSpec; 7] = [
    R,
    L_BUILD,
    L_SEARCH,
    ALPHA,
    CONSOLIDATE_FRACTION,
    SEED,
    THREADS,
];

/// Parameters of a [`crate::FreshVamana`] index.
#[derive(Debug, Clone, PartialEq)]
pub struct VamanaParams {
    pub r: usize,
    pub l_build: usize,
    pub l_search: usize,
    pub alpha: f32,
    /// Pending deletes, as a fraction of live points, that trigger a
    /// consolidation (Algorithm 4).
    pub consolidate_fraction: f64,
    pub seed: u64,
    /// Worker threads (`None`: rayon's global pool).
    pub threads: Option<usize>,
}

impl Default for VamanaParams {
    fn default() -> Self {
        VamanaParams {
            r: 64,
            l_build: 75,
            l_search: 64,
            alpha: 1.2,
            consolidate_fraction: 0.05,
            seed: 0x5eed_ec7d,
            threads: None,
        }
    }
}

impl VamanaParams {
    /// Reads (and checks) loosely typed parameters; absent ones keep their
    /// defaults, unknown ones are an error listing the known ones.
    pub fn from_params(params: &Params) -> Result<Self> {
        check_params("fresh-vamana", &PARAMS, params)?;
        let d = VamanaParams::default();
        let p = VamanaParams {
            r: params.usize("r").unwrap_or(d.r),
            l_build: params.usize("l_build").unwrap_or(d.l_build),
            l_search: params.usize("l_search").unwrap_or(d.l_search),
            alpha: params.float("alpha").map_or(d.alpha, |a| a as f32),
            consolidate_fraction: params
                .float("consolidate_fraction")
                .unwrap_or(d.consolidate_fraction),
            seed: params.int("seed").map_or(d.seed, |s| s as u64),
            threads: params.usize("threads"),
        };
        p.validate()?;
        Ok(p)
    }

    /// Checks every field against the schema's bounds.
    pub fn validate(&self) -> Result<()> {
        let bad = |what: String| Err(Error::invalid(what));
        if !(2..=MAX_R).contains(&self.r) {
            return bad(format!("r must be in 2..={MAX_R}, got {}", self.r));
        }
        for (name, v) in [("l_build", self.l_build), ("l_search", self.l_search)] {
            if !(1..=limits::MAX_EF).contains(&v) {
                return bad(format!("{name} must be in 1..={}, got {v}", limits::MAX_EF));
            }
        }
        if !(1.0..=4.0).contains(&self.alpha) {
            return bad(format!("alpha must be in 1..=4, got {}", self.alpha));
        }
        if !(self.consolidate_fraction > 0.0 && self.consolidate_fraction <= 1.0) {
            return bad(format!(
                "consolidate_fraction must be in (0, 1], got {}",
                self.consolidate_fraction
            ));
        }
        if i64::try_from(self.seed).is_err() {
            return bad(format!(
                "seed must be in 0..={}, got {}",
                i64::MAX,
                self.seed
            ));
        }
        match self.threads {
            Some(t) => limits::check_threads(t),
            None => Ok(()),
        }
    }

    /// The parameters as [`Params`] (the inverse of [`Self::from_params`]),
    /// with the pool's real size.
    pub fn to_params(&self, threads: usize) -> Params {
        use ParamValue::{Float, Int};
        let mut out = Params::new();
        out.insert("r".into(), Int(self.r as i64));
        out.insert("l_build".into(), Int(self.l_build as i64));
        out.insert("l_search".into(), Int(self.l_search as i64));
        out.insert("alpha".into(), Float(self.alpha as f64));
        out.insert(
            "consolidate_fraction".into(),
            Float(self.consolidate_fraction),
        );
        out.insert("seed".into(), Int(self.seed as i64));
        out.insert("threads".into(), Int(threads as i64));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vectide_core::params::params_of;

    #[test]
    fn defaults_round_trip_and_bounds() {
        let p = VamanaParams::from_params(&Params::new()).unwrap();
        assert_eq!(p, VamanaParams::default());
        assert_eq!(VamanaParams::from_params(&p.to_params(2)).unwrap().r, 64);
        for (k, v) in [
            ("r", ParamValue::Int(1)),
            ("l_build", ParamValue::Int(0)),
            ("alpha", ParamValue::Float(0.5)),
            ("consolidate_fraction", ParamValue::Float(0.0)),
            ("m", ParamValue::Int(16)),
        ] {
            let e = VamanaParams::from_params(&params_of([(k, v)])).unwrap_err();
            assert!(e.to_string().contains(k), "{k}: {e}");
        }
    }
}
