//! Parameters of the `fresh-diskann` engine: the graph's (shared with
//! `fresh-vamana`, whose temp indexes use them), the disk search's, and when
//! temp indexes freeze and merge.

use vectide_core::engine::{LOG, PATH, THREADS};
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

/// `merge_l`: the search list of StreamingMerge's inserts.
pub const MERGE_L: ParamSpec = ParamSpec {
    name: "merge_l",
    kind: ParamKind::Int {
        min: 1,
        max: limits::MAX_EF as i64,
    },
    default: "40",
    doc: "search list L of each new point's GreedySearch over the LTI in StreamingMerge's Insert phase (its expanded nodes are the RobustPrune candidates); not stored, given at each open",
    source: "Vectide (examples/merge_loop.rs, 5 % changed, MERGE_RECALL sweep of the merged LTI at L 10-40): on GloVe 100K, L 40 instead of l_build's 75 keeps recall@10 within 0.3 points of a full rebuild's (0.8162 / 0.9051 / 0.9465 against 0.8190 / 0.9048 / 0.9475 at L 10 / 16 / 24); on GloVe 390K, L 40 against 50 reads 14 % fewer sectors, merges in 11.5-14.7 s against 15.0-16.4 s and costs at most 0.2 points at L 10-40",
};
/// `merge_refill`: Delete-phase candidates per deleted neighbour.
pub const MERGE_REFILL: ParamSpec = ParamSpec {
    name: "merge_refill",
    kind: ParamKind::Int {
        min: 0,
        max: 1 << 16,
    },
    default: "16",
    doc: "StreamingMerge's Delete phase: a node that lost a neighbour takes replacement candidates from the first merge_refill entries of the deleted neighbour's list (the nearest: RobustPrune writes lists nearest first, later back-edges go to the end), or a shorter share of at least half when the node's whole candidate set then fits its room; 0 takes whole lists as the paper's Algorithm 4; not stored, given at each open",
    source: "Vectide: on GloVe 100K with 5 % changed, 16 halves the Delete phase's CPU and the merged LTI's recall@10 moves by at most 0.16 point at L 10-24; a node that lost few neighbours takes a shorter share (at least half) when its whole candidate set then fits max_degree, skipping the alpha-rule pass (crates/vectide-diskann/src/merge.rs)",
};

/// `merge`: where StreamingMerge runs.
pub const MERGE: ParamSpec = ParamSpec {
    name: "merge",
    kind: ParamKind::Choice(&["background", "inline"]),
    default: "background",
    doc: "background: a merge task on the process's shared merge pool while searches and writes go on; inline: the write that makes a merge due runs it before returning (deterministic, for tests and the crash kit); not stored, given at each open",
    source: "FreshDiskANN §5.3 (background); Vectide (inline)",
};

/// Every parameter `fresh-diskann` takes.
pub static PARAMS: [ParamSpec; 16] = [
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
    MERGE_L,
    MERGE_REFILL,
    MERGE,
    LOG,
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
    /// The Insert phase's search list (`merge_l`).
    pub merge_l: usize,
    /// Delete-phase candidates per deleted neighbour (`merge_refill`; 0:
    /// all).
    pub merge_refill: usize,
    /// Merges run in the writing call instead of a background thread.
    pub merge_inline: bool,
    /// `log=database`: the caller logs every write; the engine persists
    /// only its checkpoints (not stored: given at each open).
    pub external_log: bool,
}

impl Default for FreshDiskannParams {
    fn default() -> Self {
        FreshDiskannParams {
            graph: VamanaParams::default(),
            beam_width: 4,
            pq_bytes: 0,
            temp_points: 50_000,
            merge_points: 100_000,
            merge_l: 40,
            merge_refill: 16,
            merge_inline: false,
            external_log: false,
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
            "merge_l",
            "merge_refill",
            "merge",
            "log",
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
            merge_l: params.usize("merge_l").unwrap_or(d.merge_l),
            merge_refill: params.usize("merge_refill").unwrap_or(d.merge_refill),
            merge_inline: merge_inline(params),
            external_log: vectide_core::engine::log_is_external(params),
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
        if !(1..=limits::MAX_EF).contains(&self.merge_l) {
            return bad(format!(
                "merge_l must be in 1..={}, got {}",
                limits::MAX_EF,
                self.merge_l
            ));
        }
        if self.merge_refill > 1 << 16 {
            return bad(format!(
                "merge_refill must be in 0..=65536, got {}",
                self.merge_refill
            ));
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
        out.insert("merge_l".into(), int(self.merge_l));
        out.insert("merge_refill".into(), int(self.merge_refill));
        let mode = if self.merge_inline {
            "inline"
        } else {
            "background"
        };
        out.insert("merge".into(), ParamValue::Str(mode.into()));
        let log = if self.external_log { "database" } else { "own" };
        out.insert("log".into(), ParamValue::Str(log.into()));
        out
    }
}

/// What an open takes besides the manifest: the pool size, the merge
/// knobs and who logs the writes (`merge`, `merge_l`, `merge_refill`,
/// `log`: not stored).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OpenKnobs {
    pub threads: Option<usize>,
    pub merge_inline: bool,
    pub merge_l: usize,
    pub merge_refill: usize,
    pub external_log: bool,
}

impl Default for OpenKnobs {
    fn default() -> Self {
        let d = FreshDiskannParams::default();
        OpenKnobs {
            threads: None,
            merge_inline: d.merge_inline,
            merge_l: d.merge_l,
            merge_refill: d.merge_refill,
            external_log: d.external_log,
        }
    }
}

impl OpenKnobs {
    /// Reads (and checks) the knobs from an open's parameters; absent
    /// ones take their defaults.
    pub fn from_params(params: &Params) -> Result<Self> {
        let p = FreshDiskannParams::from_params(params)?;
        Ok(OpenKnobs {
            threads: params.usize("threads"),
            merge_inline: p.merge_inline,
            merge_l: p.merge_l,
            merge_refill: p.merge_refill,
            external_log: p.external_log,
        })
    }

    /// With `threads` as the pool size.
    pub fn threads(threads: usize) -> Self {
        OpenKnobs {
            threads: Some(threads),
            ..OpenKnobs::default()
        }
    }
}

/// Whether checked parameters ask for inline merges.
fn merge_inline(params: &Params) -> bool {
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
            ("merge_l", ParamValue::Int(0)),
            ("merge_refill", ParamValue::Int(-1)),
            ("ef", ParamValue::Int(3)),
        ] {
            let e = FreshDiskannParams::from_params(&params_of([(k, v)])).unwrap_err();
            assert!(e.to_string().contains(k), "{k}: {e}");
        }
        // The knobs an open takes are checked the same way.
        let k = OpenKnobs::from_params(&params_of([("merge_l", ParamValue::Int(20))])).unwrap();
        assert_eq!((k.merge_l, k.merge_refill, k.merge_inline), (20, 16, false));
        assert!(
            OpenKnobs::from_params(&params_of([("merge_refill", ParamValue::Int(1 << 20))]))
                .unwrap_err()
                .to_string()
                .contains("merge_refill")
        );
        let mut q = p.clone();
        q.resolve(16).unwrap();
        assert_eq!(q.pq_bytes, 16, "the default is min(32, dim)");
        q.pq_bytes = 32;
        assert!(q.check_dim(16).is_err() && q.check_dim(50).is_ok());
    }
}
