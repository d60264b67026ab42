//! The Query API (Qdrant's `/points/query`): one parser of its JSON shape
//! and one evaluation, which the server, the embedded Python API and the
//! HTTP client all reach.
//!
//! ```json
//! {"prefetch": [{"query": [0.1, 0.2], "using": "dense", "limit": 100},
//!               {"query": {"indices": [3, 9], "values": [0.5, 1.0]}, "using": "bm25"}],
//!  "query": {"fusion": "rrf"}, "filter": {...}, "limit": 10, "offset": 0,
//!  "score_threshold": null, "with_payload": true, "with_vector": false}
//! ```
//!
//! A query is nearest by a dense vector, a sparse vector or a stored
//! point's vector (`{"nearest": ...}` or the bare input), in the space
//! `using` names (the unnamed `""` by default), re-ranked by maximal
//! marginal relevance with `{"nearest": ..., "mmr": {"diversity",
//! "candidates_limit"}}`; `{"fusion": "rrf" | "dbsf"}` or `{"rrf": {"k": K,
//! "weights": [...]}}` fuses the prefetches' answers; no query lists
//! points in id order (score 1). A grouped query (`/points/query/groups`,
//! [`GroupsRequest`]) puts a query's answer in groups by a payload key.
//! Prefetches nest; each level's filter is
//! joined with the filters above it as Qdrant joins them (clause by
//! clause: `must` conditions add up, `should` alternatives pool;
//! `Filter::merge`), so limits apply to filtered candidates. A nearest query above prefetches re-scores their union.
//! The semantics are Qdrant's, as its client's local mode implements them:
//! RRF scores `1 / (rank + k)` (k = 2 unless given) summed over the
//! sources (`1 / ((rank + 1) / w + k − 1)` for a source of weight `w`),
//! DBSF normalises each source by its mean ± 3 standard
//! deviations and sums; fused ties keep the order of first appearance; a
//! score threshold keeps scores above it (below it for Euclid), and fused
//! scores at or above it; a query by point id leaves that point out. MMR
//! re-ranks the `candidates_limit` nearest (the limit unless given; the
//! threshold applies to them, the offset to the re-ranked answer) with
//! `λ = 1 − diversity`, and its points keep their similarity as score.

// The parts: `parse` reads requests, `eval` runs them on a collection,
// `groups` puts an answer in groups, `fusion` fuses prefetches' answers
// and `mmr` re-ranks by maximal marginal relevance.
mod eval;
mod fusion;
mod groups;
mod mmr;
mod parse;

pub use fusion::{dbsf, rrf};
pub use groups::{GroupsRequest, PointGroup};
pub use mmr::{mmr_order, Similarity};
pub use parse::{parse_point_vectors, parse_vector, GROUPS_FIELDS, PREFETCH_FIELDS, QUERY_FIELDS};

use crate::filter::Filter;
use crate::ids::ExtId;
use crate::spaces::{NamedVectors, SparseVector};
use serde_json::Value;

/// Deepest nesting of prefetches.
pub const MAX_PREFETCH_DEPTH: usize = 8;

/// What a nearest query searches with.
#[derive(Debug, Clone, PartialEq)]
pub enum VectorInput {
    Dense(Vec<f32>),
    Sparse(SparseVector),
    /// A stored point's vector in the space searched.
    Point(ExtId),
}

/// How prefetches' answers are fused.
#[derive(Debug, Clone, PartialEq)]
pub enum Fusion {
    /// Reciprocal rank fusion with its constant `k` and, when given, one
    /// weight per prefetch (in the prefetches' order).
    Rrf { k: f64, weights: Option<Vec<f64>> },
    /// Distribution-based score fusion.
    Dbsf,
}

/// Maximal marginal relevance: the nearest candidates re-ranked, each
/// pick trading its similarity to the query against its similarity to
/// the points already picked.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Mmr {
    /// 0 (relevance only) ..= 1 (diversity only); 0.5 unless given.
    pub diversity: f64,
    /// How many nearest points are re-ranked (`candidates_limit`; the
    /// level's limit unless given).
    pub candidates: Option<usize>,
}

/// Most candidates an MMR query re-ranks (Qdrant's bound on
/// `candidates_limit`, `QdrantLocal.MMR_CANDIDATES_LIMIT_MAX`); a limit
/// standing in for an absent `candidates_limit` is clamped to it too.
pub const MAX_MMR_CANDIDATES: usize = 16_384;

#[derive(Debug, Clone, PartialEq)]
pub enum QueryKind {
    /// Nearest to the input, re-ranked by MMR when asked.
    Nearest(VectorInput, Option<Mmr>),
    Fusion(Fusion),
}

/// Search knobs as asked (resolved against the space's engine when run).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Knobs {
    pub hnsw_ef: Option<usize>,
    pub exact: bool,
    /// Native knobs by name (`{"nprobe": 32}`).
    pub native: Vec<(String, u64)>,
}

/// Which vectors to return.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum WithVector {
    #[default]
    None,
    All,
    Names(Vec<String>),
}

impl WithVector {
    pub fn any(&self) -> bool {
        *self != WithVector::None
    }

    /// Keeps the asked vectors of `named`.
    pub fn select(&self, named: NamedVectors) -> NamedVectors {
        match self {
            WithVector::None => Vec::new(),
            WithVector::All => named,
            WithVector::Names(n) => named.into_iter().filter(|(k, _)| n.contains(k)).collect(),
        }
    }
}

/// One level of prefetch.
#[derive(Debug, Clone, PartialEq)]
pub struct Prefetch {
    pub prefetch: Vec<Prefetch>,
    pub query: Option<QueryKind>,
    pub using: Option<String>,
    pub filter: Option<Filter>,
    pub knobs: Knobs,
    pub score_threshold: Option<f32>,
    pub limit: usize,
}

/// A whole query request.
#[derive(Debug, Clone, PartialEq)]
pub struct QueryRequest {
    pub prefetch: Vec<Prefetch>,
    pub query: Option<QueryKind>,
    pub using: Option<String>,
    pub filter: Option<Filter>,
    pub knobs: Knobs,
    pub score_threshold: Option<f32>,
    pub limit: usize,
    pub offset: usize,
    pub with_payload: bool,
    pub with_vector: WithVector,
}

/// A point in a query's answer.
#[derive(Debug, Clone, PartialEq)]
pub struct ScoredPoint {
    pub id: ExtId,
    pub score: f32,
    pub payload: Option<Value>,
    /// The asked vectors, by space name (the single form's under `""`).
    pub vectors: Option<NamedVectors>,
}
