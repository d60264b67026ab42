//! The state of [`Hnsw`]: the struct every part of the engine works
//! on, its locks and its inherent methods. The parts (build, update,
//! persistence, …) and the engine's face (`engine.rs`, the
//! [`VectorIndex`](vectide_core::VectorIndex) implementation) import it;
//! it imports none of them.

use crate::params::HnswParams;
use crate::search::{knn, Scratch};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use vectide_core::{Filter, Metric, Neighbor, Result, VectorIndex};
use vectide_graph::core::GraphCore;
use vectide_graph::mem::Store;
use vectide_graph::qsearch::knn_quantized;
pub(crate) use vectide_graph::slots::{Alloc, IdEntry};

pub(crate) const NO_ENTRY: u64 = u64::MAX;

/// Packs the entry point (slot, top level) into one atomic word.
#[inline]
pub(crate) fn pack_entry(slot: u32, level: usize) -> u64 {
    ((slot as u64) << 8) | level as u64
}

#[inline]
pub(crate) fn unpack_entry(word: u64) -> Option<(u32, usize)> {
    (word != NO_ENTRY).then_some(((word >> 8) as u32, (word & 0xff) as usize))
}

/// A k-NN search: on the codes when the store has them (layer 0 walked
/// on estimates, exact re-ranking), on float32 otherwise.
#[allow(clippy::too_many_arguments)]
#[inline]
fn walk<A: Fn(u32) -> bool>(
    store: &Store,
    dist: vectide_core::metric::DistanceFn,
    q: &[f32],
    entry: Option<(u32, usize)>,
    ef: usize,
    scratch: &mut Scratch,
    admit: A,
) {
    if store.codes().is_some() {
        knn_quantized(store, dist, q, entry, ef, scratch, admit)
    } else {
        knn(store, dist, q, entry, ef, scratch, admit)
    }
}

/// A volatile HNSW index (see the crate docs for the design). The state
/// every volatile graph engine shares (store, locks, id map, allocator,
/// DeleteList, sequence numbers, pools) is its [`GraphCore`], private to
/// the crate.
pub struct Hnsw {
    pub(crate) core: GraphCore,
    pub(crate) params: HnswParams,
    pub(crate) entry: AtomicU64,
    /// Held by an insert whose level exceeds the current top level.
    pub(crate) entry_lock: Mutex<()>,
    pub(crate) level_counter: AtomicU64,
}

impl std::fmt::Debug for Hnsw {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hnsw")
            .field("dim", &self.core.dim)
            .field("metric", &self.core.metric)
            .field("params", &self.params)
            .field("len", &self.len())
            .finish()
    }
}

impl Hnsw {
    /// An empty index.
    pub fn new(dim: usize, metric: Metric, params: HnswParams) -> Result<Self> {
        let store = Store::new(dim, params.m, 0);
        Self::with_store(dim, metric, params, store)
    }

    pub(crate) fn with_store(
        dim: usize,
        metric: Metric,
        params: HnswParams,
        store: Store,
    ) -> Result<Self> {
        params.validate()?;
        if params.quantization != vectide_graph::codes::Quantization::None
            && vectide_quant::rabitq::padded_dim(dim) > vectide_quant::rabitq::fastscan::MAX_PADDED
        {
            return Err(vectide_core::Error::invalid(format!(
                "quantization {} supports dimensions up to {}, not {dim}",
                params.quantization.name(),
                vectide_quant::rabitq::fastscan::MAX_PADDED
            )));
        }
        let core = GraphCore::new("hnsw", dim, metric, store, params.threads)?;
        Ok(Hnsw {
            core,
            entry: AtomicU64::new(NO_ENTRY),
            entry_lock: Mutex::new(()),
            level_counter: AtomicU64::new(0),
            params,
        })
    }

    /// The parameters the index was built with.
    pub fn params(&self) -> &HnswParams {
        &self.params
    }

    /// With quantization on, checks that every list carries its
    /// neighbours' current codes (call it with no write in flight).
    pub fn check_codes(&self) -> std::result::Result<(), String> {
        self.core.store.read().check_codes()
    }

    /// Whether searches walk on codes (quantization on and a first insert
    /// made the quantizer).
    pub fn has_codes(&self) -> bool {
        self.core.store.read().codes().is_some()
    }

    /// Searches with a prepared scratch; results go to `out`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn search_with(
        &self,
        store: &Store,
        q: &[f32],
        k: usize,
        ef: usize,
        filter: Option<Filter<'_>>,
        scratch: &mut Scratch,
        out: &mut Vec<Neighbor>,
    ) {
        out.clear();
        let entry = unpack_entry(self.entry.load(Ordering::Acquire));
        let dist = self.core.dist;
        match filter {
            None => walk(store, dist, q, entry, ef, scratch, |s| store.is_live(s)),
            Some(f) => walk(store, dist, q, entry, ef, scratch, |s| {
                store.is_live(s) && f(store.label(s))
            }),
        }
        out.extend(
            scratch
                .sorted
                .iter()
                .take(k)
                .map(|c| Neighbor::new(store.label(c.node), c.dist.0)),
        );
    }
}
