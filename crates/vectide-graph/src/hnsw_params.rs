//! The parameters of the HNSW family (`hnsw`, `p-hnsw` and the paper
//! baselines, d-HNSW's partitions later): [`HnswParams`] with their
//! documented defaults, their registry specs and the conversions from and to
//! [`Params`].

use vectide_core::{limits, Error, ParamKind, ParamSpec, Params, ParamsExt, Result};

/// Parameters of an HNSW graph.
///
/// Defaults follow Malkov & Yashunin's HNSW paper and hnswlib: `m = 16`
/// neighbours per node on the upper layers and `2 * m` on layer 0,
/// `ef_construction = 200`.
#[derive(Debug, Clone, PartialEq)]
pub struct HnswParams {
    /// Maximum out-degree on layers >= 1; layer 0 allows `2 * m`.
    pub m: usize,
    /// Candidate-list size while inserting.
    pub ef_construction: usize,
    /// Default candidate-list size while searching (raised to `k`).
    pub ef_search: usize,
    /// Seed of the level generator (levels are a pure function of the seed
    /// and the insertion counter).
    pub seed: u64,
    /// Pending deletes, as a fraction of the live points, that trigger a
    /// consolidation (graph repair + slot reclamation) at the end of a delete.
    pub consolidate_fraction: f64,
    /// α of the repair rule: when a list loses a deleted neighbour, a
    /// replacement `c` is admitted unless a kept `r` has `α · d(r, c) < d(p, c)`.
    /// FreshDiskANN uses 1.2 on Vamana graphs; on HNSW graphs we measured 1.0
    /// (HNSW's own rule) to hold recall better under churn: over 10 rounds of
    /// 10 % delete + re-insert on glove-6b-50-angular-100k, recall@10 fell
    /// 0.6 points with 1.0 and 1.0 point with 1.2 (a larger α fills the
    /// sparse heuristic lists, so later back-edges prune new nodes away).
    /// Ignored (taken as 1) under inner product.
    pub repair_alpha: f32,
    /// Worker threads for batch calls; `None` uses rayon's global pool (all cores).
    pub threads: Option<usize>,
    /// How searches estimate distances while they walk layer 0 (`hnsw`
    /// only; the persistent engines stay on float32).
    pub quantization: crate::codes::Quantization,
}

impl Default for HnswParams {
    fn default() -> Self {
        HnswParams {
            m: 16,
            ef_construction: 200,
            ef_search: 64,
            seed: 0x5eed_ec7d,
            consolidate_fraction: 0.05,
            repair_alpha: 1.0,
            threads: None,
            quantization: crate::codes::Quantization::None,
        }
    }
}

/// Highest layer a node may get.
pub use crate::prune::MAX_LEVEL;

impl HnswParams {
    /// Checks the parameters; every field is bounded so that a hostile file or
    /// call cannot ask for absurd allocations.
    pub fn validate(&self) -> Result<()> {
        if !(2..=256).contains(&self.m) {
            return Err(Error::invalid(format!(
                "m must be in 2..=256, got {}",
                self.m
            )));
        }
        if !(1..=100_000).contains(&self.ef_construction) {
            return Err(Error::invalid(format!(
                "ef_construction must be in 1..=100000, got {}",
                self.ef_construction
            )));
        }
        if !(1..=100_000).contains(&self.ef_search) {
            return Err(Error::invalid(format!(
                "ef_search must be in 1..=100000, got {}",
                self.ef_search
            )));
        }
        // Parameters travel as JSON / Python integers typed i64: a larger
        // seed could not be reported back as it was given.
        if i64::try_from(self.seed).is_err() {
            return Err(Error::invalid(format!(
                "seed must be in 0..={}, got {}",
                i64::MAX,
                self.seed
            )));
        }
        if !(self.consolidate_fraction > 0.0 && self.consolidate_fraction <= 1.0) {
            return Err(Error::invalid(format!(
                "consolidate_fraction must be in (0, 1], got {}",
                self.consolidate_fraction
            )));
        }
        if !(1.0..=4.0).contains(&self.repair_alpha) {
            return Err(Error::invalid(format!(
                "repair_alpha must be in 1..=4, got {}",
                self.repair_alpha
            )));
        }
        if self.threads == Some(0) {
            return Err(Error::invalid("threads must be at least 1"));
        }
        Ok(())
    }

    /// Out-degree bound of layer 0.
    pub fn m0(&self) -> usize {
        self.m * 2
    }
}

/// `m`: graph degree.
pub const M: ParamSpec = ParamSpec {
    name: "m",
    kind: ParamKind::Int {
        min: limits::MIN_M as i64,
        max: limits::MAX_M as i64,
    },
    default: "16",
    doc: "neighbours per node on the upper layers (2m on layer 0)",
    source: "HNSW paper (Malkov & Yashunin 2018) and hnswlib",
};
/// `ef_construction`: candidate list while inserting.
pub const EF_CONSTRUCTION: ParamSpec = ParamSpec {
    name: "ef_construction",
    kind: ParamKind::Int {
        min: 1,
        max: limits::MAX_EF as i64,
    },
    default: "200",
    doc: "candidate-list size while inserting",
    source: "hnswlib's default",
};
/// `ef_search`: the default of the `ef` knob.
pub const EF_SEARCH: ParamSpec = ParamSpec {
    name: "ef_search",
    kind: ParamKind::Int {
        min: 1,
        max: limits::MAX_EF as i64,
    },
    default: "64",
    doc: "default candidate-list size of a search (the ef knob; raised to k)",
    source: "Vectide (recall ≈ 0.95 at k = 10 on glove-50)",
};
/// `seed`: level generator.
pub const SEED: ParamSpec = ParamSpec {
    name: "seed",
    kind: ParamKind::Int {
        min: 0,
        max: i64::MAX,
    },
    default: "0x5eedec7d",
    doc: "seed of the level generator (levels are a function of it and the insert counter)",
    source: "Vectide",
};
/// `consolidate_fraction`: when deletes are consolidated.
pub const CONSOLIDATE_FRACTION: ParamSpec = ParamSpec {
    name: "consolidate_fraction",
    kind: ParamKind::Float {
        min: 1e-9,
        max: 1.0,
    },
    default: "0.05",
    doc: "pending deletes, as a fraction of live points, that trigger a consolidation",
    source: "FreshDiskANN §6 (consolidation at a few percent of deletes)",
};
/// `repair_alpha`: α of the in-neighbour repair.
pub const REPAIR_ALPHA: ParamSpec = ParamSpec {
    name: "repair_alpha",
    kind: ParamKind::Float { min: 1.0, max: 4.0 },
    default: "1.0",
    doc: "α of the repair rule of consolidation (1 = HNSW's own heuristic)",
    source: "Vectide, measured under churn (see HnswParams::repair_alpha)",
};

/// `quantization`: traversal on compressed vectors.
pub const QUANTIZATION: ParamSpec = ParamSpec {
    name: "quantization",
    kind: ParamKind::Choice(crate::codes::Quantization::NAMES),
    default: "none",
    doc: "distances while walking layer 0: none (float32) or rabitq1 (1-bit RaBitQ codes beside each list, fast scan, exact re-ranking)",
    source: "RaBitQ (Gao & Long 2024) and SymphonyQG (Gao et al. 2025)",
};

/// The graph fields of checked parameters (other keys are left to the
/// caller); every absent one keeps its default.
pub fn graph_params(params: &Params) -> Result<HnswParams> {
    let d = HnswParams::default();
    let p = HnswParams {
        m: params.usize("m").unwrap_or(d.m),
        ef_construction: params.usize("ef_construction").unwrap_or(d.ef_construction),
        ef_search: params.usize("ef_search").unwrap_or(d.ef_search),
        seed: params.int("seed").map_or(d.seed, |s| s as u64),
        consolidate_fraction: params
            .float("consolidate_fraction")
            .unwrap_or(d.consolidate_fraction),
        repair_alpha: params
            .float("repair_alpha")
            .map_or(d.repair_alpha, |a| a as f32),
        threads: params.usize("threads"),
        quantization: match params.string("quantization") {
            Some(q) => crate::codes::Quantization::parse(q)?,
            None => d.quantization,
        },
    };
    p.validate()?;
    Ok(p)
}

/// The graph parameters as [`Params`] (the inverse of [`graph_params`]).
pub fn graph_params_out(p: &HnswParams, threads: usize) -> Params {
    use vectide_core::ParamValue::{Float, Int};
    let mut out = Params::new();
    out.insert("m".into(), Int(p.m as i64));
    out.insert("ef_construction".into(), Int(p.ef_construction as i64));
    out.insert("ef_search".into(), Int(p.ef_search as i64));
    out.insert("seed".into(), Int(p.seed as i64));
    out.insert("consolidate_fraction".into(), Float(p.consolidate_fraction));
    // Through text, so that an f32 such as 1.2 reads back as 1.2, not 1.2000000476837158.
    out.insert(
        "repair_alpha".into(),
        Float(p.repair_alpha.to_string().parse().unwrap_or(1.0)),
    );
    out.insert("threads".into(), Int(threads as i64));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_that_cannot_be_reported_back_is_refused() {
        let mut p = HnswParams {
            seed: i64::MAX as u64,
            ..HnswParams::default()
        };
        p.validate().unwrap();
        assert_eq!(graph_params(&graph_params_out(&p, 1)).unwrap().seed, p.seed);
        p.seed = i64::MAX as u64 + 1;
        let e = p.validate().unwrap_err().to_string();
        assert!(e.contains("seed must be in 0..="), "{e}");
    }
}
