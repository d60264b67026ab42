//! Parameters of the `fresh-diskann` engine: the graph's (shared with
//! `fresh-vamana`, whose temp indexes use them), the disk search's, and when
//! temp indexes freeze and merge.

use vectide_core::engine::{PATH, THREADS};
use vectide_core::params::check_params;
use vectide_core::{limits, Error, ParamKind, ParamSpec, ParamValue, Params, ParamsExt, Result};
use vectide_vamana::VamanaParams;

/// `beam_width`: sector reads per hop.
pub const BEAM_WIDTH: ParamSpec = ParamSpec {
    name: "beam_width",
    kind: ParamKind::Int { min: 1, max: 64 },
    default: "4",
    doc: "default beam width W of a disk search: the sector reads of a hop, issued as one batch",
    source: "FreshDiskANN §6 / DiskANN (W = 4)",
};
/// `pq_bytes`: bytes per PQ code in RAM.
pub const PQ_BYTES: ParamSpec = ParamSpec {
    name: "pq_bytes",
    kind: ParamKind::Int { min: 1, max: 1024 },
    default: "32 (at most dim)",
    doc: "bytes per PQ code kept in RAM for routing (at most dim; the default is min(32, dim))",
    source: "FreshDiskANN §6 (32-byte codes for 100-d SIFT / 128-d data)",
};
/// `temp_points`: when the RW-TempIndex freezes.
pub const TEMP_POINTS: ParamSpec = ParamSpec {
    name: "temp_points",
    kind: ParamKind::Int {
        min: 1,
        max: 1 << 32,
    },
    default: "50000",
    doc: "points at which the RW-TempIndex is frozen into an RO-TempIndex (snapshot written, redo log restarted)",
    source: "Vectide (the paper freezes at a memory budget; §5.1)",
};
/// `merge_points`: when StreamingMerge starts.
pub const MERGE_POINTS: ParamSpec = ParamSpec {
    name: "merge_points",
    kind: ParamKind::Int {
        min: 1,
        max: 1 << 40,
    },
    default: "100000",
    doc: "changes (points in temp indexes plus deleted LTI nodes) at which a background StreamingMerge starts",
    source: "Vectide (the paper merges when the temp indexes reach a size; §5.3)",
};

/// `merge`: where StreamingMerge runs.
pub const MERGE: ParamSpec = ParamSpec {
    name: "merge",
    kind: ParamKind::Choice(&["background", "inline"]),
    default: "background",
    doc: "background: a merge thread while searches and writes go on; inline: the write that makes a merge due runs it before returning (deterministic, for tests and the crash kit); not stored, given at each open",
    source: "FreshDiskANN §5.3 (background); Vectide (inline)",
};

/// Every parameter `fresh-diskann` takes.
pub static PARAMS: [ParamSpec; 13] = [
    vectide_vamana::params::R,
    vectide_vamana::params::L_BUILD,
    vectide_vamana::params::L_SEARCH,
    vectide_vamana::params::ALPHA,
    vectide_graph::hnsw_params::CONSOLIDATE_FRACTION,
    vectide_vamana::params::SEED,
    BEAM_WIDTH,
    PQ_BYTES,
    TEMP_POINTS,
    MERGE_POINTS,
    MERGE,
    PATH,
    THREADS,
];

/// Parameters of a [`crate::FreshDiskann`] index.
#[derive(Debug, Clone, PartialEq)]
pub struct FreshDiskannParams {
    /// The graph (R, L, α, …) of the temp indexes and of the LTI.
    pub graph: VamanaParams,
    pub beam_width: usize,
    /// Bytes per PQ code; 0 until [`FreshDiskannParams::resolve`] sets the
    /// default `min(32, dim)`.
    pub pq_bytes: usize,
    pub temp_points: usize,
    pub merge_points: usize,
    /// Merges run in the writing call instead of a background thread.
    pub merge_inline: bool,
}

impl Default for FreshDiskannParams {
    fn default() -> Self {
        FreshDiskannParams {
            graph: VamanaParams::default(),
            beam_width: 4,
            pq_bytes: 0,
            temp_points: 50_000,
            merge_points: 100_000,
            merge_inline: false,
        }
    }
}

impl FreshDiskannParams {
    /// Reads (and checks) parameters; absent ones keep their defaults.
    pub fn from_params(params: &Params) -> Result<Self> {
        check_params("fresh-diskann", &PARAMS, params)?;
        let mut graph_only = params.clone();
        for k in [
            "beam_width",
            "pq_bytes",
            "temp_points",
            "merge_points",
            "merge",
            "path",
        ] {
            graph_only.remove(k);
        }
        let d = FreshDiskannParams::default();
        let p = FreshDiskannParams {
            graph: VamanaParams::from_params(&graph_only)?,
            beam_width: params.usize("beam_width").unwrap_or(d.beam_width),
            pq_bytes: params.usize("pq_bytes").unwrap_or(d.pq_bytes),
            temp_points: params.usize("temp_points").unwrap_or(d.temp_points),
            merge_points: params.usize("merge_points").unwrap_or(d.merge_points),
            merge_inline: merge_inline(params),
        };
        p.validate()?;
        Ok(p)
    }

    /// Checks the fields against the schema's bounds.
    pub fn validate(&self) -> Result<()> {
        self.graph.validate()?;
        let bad = |what: String| Err(Error::invalid(what));
        if !(1..=64).contains(&self.beam_width) {
            return bad(format!(
                "beam_width must be in 1..=64, got {}",
                self.beam_width
            ));
        }
        if self.pq_bytes > 1024 {
            return bad(format!(
                "pq_bytes must be in 1..=1024, got {}",
                self.pq_bytes
            ));
        }
        if self.temp_points == 0 || self.merge_points == 0 {
            return bad("temp_points and merge_points must be at least 1".into());
        }
        Ok(())
    }

    /// The default PQ size for `dim` where none was given, then the check
    /// against the dimension.
    pub fn resolve(&mut self, dim: usize) -> Result<()> {
        if self.pq_bytes == 0 {
            self.pq_bytes = 32.min(dim);
        }
        self.check_dim(dim)
    }

    /// Checks the parameters against a dimension (`1 ≤ pq_bytes ≤ dim`).
    pub fn check_dim(&self, dim: usize) -> Result<()> {
        limits::check_dim(dim)?;
        if self.pq_bytes == 0 {
            return Err(Error::invalid("pq_bytes must be at least 1"));
        }
        if self.pq_bytes > dim {
            return Err(Error::invalid(format!(
                "pq_bytes {} exceeds the dimension {dim} (a PQ code has at most one byte per dimension)",
                self.pq_bytes
            )));
        }
        Ok(())
    }

    /// The parameters as [`Params`], with the pool's real size.
    pub fn to_params(&self, threads: usize) -> Params {
        let mut out = self.graph.to_params(threads);
        let int = |v: usize| ParamValue::Int(i64::try_from(v).unwrap_or(i64::MAX));
        out.insert("beam_width".into(), int(self.beam_width));
        if self.pq_bytes > 0 {
            out.insert("pq_bytes".into(), int(self.pq_bytes));
        }
        out.insert("temp_points".into(), int(self.temp_points));
        out.insert("merge_points".into(), int(self.merge_points));
        let mode = if self.merge_inline {
            "inline"
        } else {
            "background"
        };
        out.insert("merge".into(), ParamValue::Str(mode.into()));
        out
    }
}

/// Whether checked parameters ask for inline merges.
pub fn merge_inline(params: &Params) -> bool {
    params.string("merge").is_some_and(|m| m == "inline")
}

#[cfg(test)]
mod tests {
    use super::*;
    use vectide_core::params::params_of;

    #[test]
    fn defaults_round_trip_and_bad_values_are_named() {
        let p = FreshDiskannParams::from_params(&Params::new()).unwrap();
        assert_eq!(p, FreshDiskannParams::default());
        assert_eq!(FreshDiskannParams::from_params(&p.to_params(2)).unwrap(), {
            let mut q = p.clone();
            q.graph.threads = Some(2);
            q
        });
        for (k, v) in [
            ("r", ParamValue::Int(1)),
            ("beam_width", ParamValue::Int(0)),
            ("pq_bytes", ParamValue::Int(0)),
            ("temp_points", ParamValue::Int(0)),
            ("ef", ParamValue::Int(3)),
        ] {
            let e = FreshDiskannParams::from_params(&params_of([(k, v)])).unwrap_err();
            assert!(e.to_string().contains(k), "{k}: {e}");
        }
        let mut q = p.clone();
        q.resolve(16).unwrap();
        assert_eq!(q.pq_bytes, 16, "the default is min(32, dim)");
        q.pq_bytes = 32;
        assert!(q.check_dim(16).is_err() && q.check_dim(50).is_ok());
    }
}
