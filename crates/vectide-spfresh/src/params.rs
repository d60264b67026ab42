//! Parameters of the engines `spann`, `spann-inplace` and `spfresh`: one
//! schema, one struct; the engine name chooses the [`Mode`].
//!
//! Defaults and their sources: SPTAG's `ParameterDefinitionList.h` (the
//! public SPANN / SPFresh code) and the SPFresh paper (Xu et al., SOSP 2023,
//! §5). Where they differ, the source line says which one is followed.

use vectide_core::engine::{LOG, PATH, THREADS};
use vectide_core::params::check_params;
use vectide_core::{limits, Error, ParamKind, ParamSpec, ParamValue, Params, ParamsExt, Result};

/// How an index treats updates after its build.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `spann`: SPANN's static index. A bulk load into an empty index is
    /// built statically; later updates are appended in place, and
    /// `maintain()` rebuilds the whole index from its live vectors.
    Static,
    /// `spann-inplace`: the paper's SPANN+ baseline: updates appended in
    /// place, deletes as tombstones, never a split, merge or reassign.
    Inplace,
    /// `spfresh`: SPANN kept balanced by LIRE (split, merge, reassign).
    Fresh,
}

impl Mode {
    /// The engine name of the mode.
    pub fn engine(self) -> &'static str {
        match self {
            Mode::Static => "spann",
            Mode::Inplace => "spann-inplace",
            Mode::Fresh => "spfresh",
        }
    }

    pub(crate) fn code(self) -> u8 {
        match self {
            Mode::Static => 0,
            Mode::Inplace => 1,
            Mode::Fresh => 2,
        }
    }

    pub(crate) fn from_code(c: u8) -> Result<Mode> {
        match c {
            0 => Ok(Mode::Static),
            1 => Ok(Mode::Inplace),
            2 => Ok(Mode::Fresh),
            _ => Err(Error::corrupted(format!("unknown SPANN mode {c}"))),
        }
    }
}

const fn int(
    name: &'static str,
    min: i64,
    max: i64,
    default: &'static str,
    doc: &'static str,
    source: &'static str,
) -> ParamSpec {
    ParamSpec {
        name,
        kind: ParamKind::Int { min, max },
        default,
        doc,
        source,
    }
}

/// `replicas`: postings a vector is written to at most.
pub const REPLICAS: ParamSpec = int(
    "replicas",
    1,
    64,
    "8",
    "postings a vector is stored in at most (boundary replicas, RNG-pruned)",
    "SPTAG ReplicaCount = 8",
);
/// `rng_factor`: the replica rule's factor.
pub const RNG_FACTOR: ParamSpec = ParamSpec {
    name: "rng_factor",
    kind: ParamKind::Float {
        min: 0.0,
        max: 100.0,
    },
    default: "1.0",
    doc: "a further replica in posting c is skipped when a chosen centroid s has rng_factor·d(c,s) ≤ d(v,c)",
    source: "SPTAG RNGFactor = 1.0",
};
/// `route_candidates`: centroids an insert or reassign chooses among.
pub const ROUTE_CANDIDATES: ParamSpec = int(
    "route_candidates",
    1,
    1024,
    "64",
    "nearest centroids an insert, a reassign or the build chooses its postings among",
    "SPTAG InternalResultNum = 64",
);
/// `nprobe`: postings a search reads.
pub const NPROBE: ParamSpec = int(
    "nprobe",
    1,
    limits::MAX_NPROBE as i64,
    "64",
    "default postings a search reads (the search knob nprobe)",
    "SPTAG SearchInternalResultNum = 64; SPFresh §5.3 (the nearest 64 postings)",
);
/// `head_ef`: the centroid index's search breadth.
pub const HEAD_EF: ParamSpec = int(
    "head_ef",
    1,
    limits::MAX_EF as i64,
    "128",
    "ef of the centroid index's HNSW search (at least the number of centroids asked for)",
    "Vectide (SPTAG searches its head graph with MaxCheck = 4096 distance evaluations)",
);
/// `posting_pages`: the split limit, in 4 KiB pages of records.
pub const POSTING_PAGES: ParamSpec = int(
    "posting_pages",
    1,
    64,
    "3",
    "a posting longer than this many 4 KiB pages of records is split (59 records at 50-d float32)",
    "SPTAG PostingPageLimit = 3",
);
/// `posting_vectors`: an optional cap on a posting's records.
pub const POSTING_VECTORS: ParamSpec = int(
    "posting_vectors",
    0,
    1 << 20,
    "0",
    "cap on the records of a posting before it splits (0: none, posting_pages alone sets the limit)",
    "SPTAG PostingVectorLimit (118 in microsoft/SPTAG's parameter list)",
);
/// `merge_threshold`: postings at or below this many live records merge.
pub const MERGE_THRESHOLD: ParamSpec = int(
    "merge_threshold",
    0,
    1 << 20,
    "10",
    "a posting a search finds with at most this many live records is merged into a neighbour (spfresh)",
    "SPTAG MergeThreshold = 10",
);
/// `reassign_range`: neighbour postings a split checks for reassignment.
pub const REASSIGN_RANGE: ParamSpec = int(
    "reassign_range",
    0,
    1024,
    "64",
    "postings nearest a split posting whose vectors are checked against the NPA conditions (spfresh)",
    "SPFresh §5.5 (64; the public code's ReassignK defaults to 0)",
);
/// `head_ratio`: centroids per vector of a static build.
pub const HEAD_RATIO: ParamSpec = ParamSpec {
    name: "head_ratio",
    kind: ParamKind::Float { min: 0.0001, max: 1.0 },
    default: "0.1",
    doc: "centroids per vector of a static build (hierarchical balanced k-means into leaves of about 1/head_ratio vectors)",
    source: "Vectide (SPTAG's SelectHead Ratio is 0.2; with up to 8 replicas, 0.1 keeps postings near the split limit)",
};
/// `snapshot_rows`: rows logged between snapshots.
pub const SNAPSHOT_ROWS: ParamSpec = int(
    "snapshot_rows",
    1,
    1 << 40,
    "200000",
    "inserted or deleted rows in the WAL after which a snapshot is taken (and the WAL restarted)",
    "Vectide (SPFresh §4.4 snapshots periodically)",
);
/// `rebuild`: where the Local Rebuilder's jobs run.
pub const REBUILD: ParamSpec = ParamSpec {
    name: "rebuild",
    kind: ParamKind::Choice(&["background", "inline"]),
    default: "background",
    doc: "background: the Local Rebuilder runs the jobs on the process's shared rebuild pool; inline: the writing call runs the jobs it queued before returning (deterministic, for tests and the crash kit); not stored, given at each open",
    source: "SPFresh §4.1 (background); Vectide (inline)",
};
/// `seed`: the build's clustering seed.
pub const SEED: ParamSpec = int(
    "seed",
    0,
    i64::MAX,
    "0",
    "seed of the static build's and the splits' clustering",
    "Vectide",
);

/// Every parameter the SPANN engines take.
pub static PARAMS: [ParamSpec; 16] = [
    REPLICAS,
    RNG_FACTOR,
    ROUTE_CANDIDATES,
    NPROBE,
    HEAD_EF,
    POSTING_PAGES,
    POSTING_VECTORS,
    MERGE_THRESHOLD,
    REASSIGN_RANGE,
    HEAD_RATIO,
    SNAPSHOT_ROWS,
    SEED,
    REBUILD,
    LOG,
    PATH,
    THREADS,
];

/// Parameters a store open may override (not stored).
pub const OPEN_PARAMS: &[&str] = &["threads", "path", "rebuild", "nprobe", "log"];

/// Parameters of a SPANN-family index.
#[derive(Debug, Clone, PartialEq)]
pub struct SpannParams {
    pub replicas: usize,
    pub rng_factor: f32,
    pub route_candidates: usize,
    pub nprobe: usize,
    pub head_ef: usize,
    pub posting_pages: usize,
    pub posting_vectors: usize,
    pub merge_threshold: usize,
    pub reassign_range: usize,
    pub head_ratio: f32,
    pub snapshot_rows: u64,
    pub seed: u64,
    /// Jobs run in the writing call (not stored).
    pub rebuild_inline: bool,
    /// Pool size (not stored).
    pub threads: Option<usize>,
    /// `log=database`: the caller logs every write; the engine persists
    /// only its snapshots (not stored: given at each open).
    pub external_log: bool,
}

impl Default for SpannParams {
    fn default() -> Self {
        SpannParams {
            replicas: 8,
            rng_factor: 1.0,
            route_candidates: 64,
            nprobe: 64,
            head_ef: 128,
            posting_pages: 3,
            posting_vectors: 0,
            merge_threshold: 10,
            reassign_range: 64,
            head_ratio: 0.1,
            snapshot_rows: 200_000,
            seed: 0,
            rebuild_inline: false,
            threads: None,
            external_log: false,
        }
    }
}

impl SpannParams {
    /// Reads (and checks) parameters of engine `engine`; absent ones keep
    /// their defaults.
    pub fn from_params(engine: &str, params: &Params) -> Result<Self> {
        check_params(engine, &PARAMS, params)?;
        let d = SpannParams::default();
        let p = SpannParams {
            replicas: params.usize("replicas").unwrap_or(d.replicas),
            rng_factor: params
                .float("rng_factor")
                .map_or(d.rng_factor, |f| f as f32),
            route_candidates: params
                .usize("route_candidates")
                .unwrap_or(d.route_candidates),
            nprobe: params.usize("nprobe").unwrap_or(d.nprobe),
            head_ef: params.usize("head_ef").unwrap_or(d.head_ef),
            posting_pages: params.usize("posting_pages").unwrap_or(d.posting_pages),
            posting_vectors: params.usize("posting_vectors").unwrap_or(d.posting_vectors),
            merge_threshold: params.usize("merge_threshold").unwrap_or(d.merge_threshold),
            reassign_range: params.usize("reassign_range").unwrap_or(d.reassign_range),
            head_ratio: params
                .float("head_ratio")
                .map_or(d.head_ratio, |f| f as f32),
            snapshot_rows: params
                .int("snapshot_rows")
                .map_or(d.snapshot_rows, |v| v as u64),
            seed: params.int("seed").map_or(d.seed, |v| v as u64),
            rebuild_inline: rebuild_inline(params),
            threads: params.usize("threads"),
            external_log: vectide_core::engine::log_is_external(params),
        };
        p.validate()?;
        Ok(p)
    }

    /// Checks the fields against the schema's bounds (a snapshot's
    /// parameters come through here too).
    pub fn validate(&self) -> Result<()> {
        let within = |name: &str, v: usize, lo: usize, hi: usize| {
            if (lo..=hi).contains(&v) {
                Ok(())
            } else {
                Err(Error::invalid(format!(
                    "{name} must be in {lo}..={hi}, got {v}"
                )))
            }
        };
        within("replicas", self.replicas, 1, 64)?;
        within("route_candidates", self.route_candidates, 1, 1024)?;
        within("nprobe", self.nprobe, 1, limits::MAX_NPROBE)?;
        within("head_ef", self.head_ef, 1, limits::MAX_EF)?;
        within("posting_pages", self.posting_pages, 1, 64)?;
        within("posting_vectors", self.posting_vectors, 0, 1 << 20)?;
        within("merge_threshold", self.merge_threshold, 0, 1 << 20)?;
        within("reassign_range", self.reassign_range, 0, 1024)?;
        if !(self.rng_factor.is_finite() && (0.0..=100.0).contains(&self.rng_factor)) {
            return Err(Error::invalid(format!(
                "rng_factor must be in 0..=100, got {}",
                self.rng_factor
            )));
        }
        if !(self.head_ratio.is_finite() && (0.0001..=1.0).contains(&self.head_ratio)) {
            return Err(Error::invalid(format!(
                "head_ratio must be in 0.0001..=1, got {}",
                self.head_ratio
            )));
        }
        if self.snapshot_rows == 0 {
            return Err(Error::invalid("snapshot_rows must be at least 1"));
        }
        Ok(())
    }

    /// The split limit in records of a `dim`-dimensional vector: the
    /// records that fit in `posting_pages` 4 KiB pages, at most
    /// `posting_vectors` when set, at least 2.
    pub fn posting_limit(&self, dim: usize) -> usize {
        let pages = self.posting_pages * 4096 / crate::layout::record_bytes(dim);
        let cap = if self.posting_vectors > 0 {
            self.posting_vectors
        } else {
            usize::MAX
        };
        pages.min(cap).max(2)
    }

    /// The leaf size of the static build's hierarchical k-means.
    pub fn leaf(&self) -> usize {
        (1.0 / self.head_ratio).round().max(1.0) as usize
    }

    /// The parameters as [`Params`], with the pool's real size.
    pub fn to_params(&self, threads: usize) -> Params {
        let int = |v: u64| ParamValue::Int(i64::try_from(v).unwrap_or(i64::MAX));
        let mut out = Params::new();
        for (k, v) in [
            ("replicas", self.replicas as u64),
            ("route_candidates", self.route_candidates as u64),
            ("nprobe", self.nprobe as u64),
            ("head_ef", self.head_ef as u64),
            ("posting_pages", self.posting_pages as u64),
            ("posting_vectors", self.posting_vectors as u64),
            ("merge_threshold", self.merge_threshold as u64),
            ("reassign_range", self.reassign_range as u64),
            ("snapshot_rows", self.snapshot_rows),
            ("seed", self.seed),
            ("threads", threads as u64),
        ] {
            out.insert(k.into(), int(v));
        }
        out.insert(
            "rng_factor".into(),
            ParamValue::Float(f64::from(self.rng_factor)),
        );
        out.insert(
            "head_ratio".into(),
            ParamValue::Float(f64::from(self.head_ratio)),
        );
        let mode = if self.rebuild_inline {
            "inline"
        } else {
            "background"
        };
        out.insert("rebuild".into(), ParamValue::Str(mode.into()));
        let log = if self.external_log { "database" } else { "own" };
        out.insert("log".into(), ParamValue::Str(log.into()));
        out
    }
}

/// Whether checked parameters ask for inline rebuild jobs.
pub fn rebuild_inline(params: &Params) -> bool {
    params.string("rebuild").is_some_and(|m| m == "inline")
}

#[cfg(test)]
mod tests {
    use super::*;
    use vectide_core::params::params_of;

    #[test]
    fn defaults_round_trip_and_bad_values_are_named() {
        let p = SpannParams::from_params("spfresh", &Params::new()).unwrap();
        assert_eq!(p, SpannParams::default());
        let back = SpannParams::from_params("spfresh", &p.to_params(2)).unwrap();
        assert_eq!(
            back,
            SpannParams {
                threads: Some(2),
                ..p.clone()
            }
        );
        for (k, v) in [
            ("replicas", ParamValue::Int(0)),
            ("rng_factor", ParamValue::Float(-1.0)),
            ("posting_pages", ParamValue::Int(0)),
            ("head_ratio", ParamValue::Float(0.0)),
            ("ef", ParamValue::Int(3)),
            ("seed", ParamValue::Int(-1)),
        ] {
            let e = SpannParams::from_params("spfresh", &params_of([(k, v)])).unwrap_err();
            assert!(e.to_string().contains(k), "{k}: {e}");
        }
    }

    #[test]
    fn limits_follow_the_record_size() {
        let p = SpannParams::default();
        // 50-d float32: 205-byte records, 3 pages hold 59 of them.
        assert_eq!(p.posting_limit(50), 59);
        assert_eq!(p.posting_limit(100_000), 2);
        assert_eq!(p.leaf(), 10);
        let capped = SpannParams {
            posting_vectors: 8,
            ..SpannParams::default()
        };
        assert_eq!(capped.posting_limit(50), 8);
        for m in [Mode::Static, Mode::Inplace, Mode::Fresh] {
            assert_eq!(Mode::from_code(m.code()).unwrap(), m);
        }
        assert!(Mode::from_code(9).is_err());
    }
}
