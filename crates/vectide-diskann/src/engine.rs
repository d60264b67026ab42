//! The `fresh-diskann` engine (FreshDiskANN §5.1–5.4, §5.6): state, the
//! write path (redo log, RW-TempIndex, DeleteList), search over every part,
//! freezing, and the merge with its atomic switch.
//!
//! ## State
//! - the **LTI** (`lti-G.bin`, PQ codes in RAM), or none before the first
//!   merge;
//! - **temp indexes**: `fresh-vamana` graphs in RAM, the last one the
//!   RW-TempIndex that takes inserts, the others RO-TempIndexes (frozen,
//!   snapshot in `temp-S.fv`);
//! - the **location map** `id → (LTI node | temp serial, seq)` of every
//!   live point: the one truth of what is live. A copy of a point anywhere
//!   else (an LTI node replaced by an upsert, a frozen temp's point deleted
//!   since) is filtered out of every search, and listed for the next merge:
//!   LTI nodes in the **DeleteList**, temp points in `ro_dead`.
//!
//! ## Writes
//! One writer at a time (a mutex): the call is validated, written to the
//! redo log and fsynced (the call is durable when it returns), applied to
//! the RW-TempIndex and the location map. Past `temp_points` the RW index
//! freezes: its snapshot is saved, a new redo log starts, the manifest
//! names both. Past `merge_points` changes a background StreamingMerge
//! starts; searches, inserts and deletes go on beside it.
//!
//! ## The merge switch
//! After the new LTI is written, under the writer mutex and the state lock:
//! the merged points move to their LTI nodes (a point deleted or replaced
//! during the merge leaves its new node in the DeleteList), the manifest
//! naming the new generation is renamed into place, and the codes array is
//! patched in place. Until that rename, a crash or an error leaves the old
//! LTI in force.
//!
//! Files: `state.rs` (the state and [`Inner`]), `write.rs` (the write path
//! and the freeze), `switch.rs` (the merge and its switch), `read.rs`
//! (search, get), `stats.rs` (stats, the structural check); this file is
//! the engine's face (`FreshDiskann`, its `VectorIndex` implementation).

use crate::lti::Lti;
use crate::merge::MergeStats;
use crate::params::FreshDiskannParams;
pub use crate::state::LTI_SYNC;
use crate::state::*;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use vectide_core::validate::Checked;
use vectide_core::{
    Error, Filter, IndexStats, Metric, Neighbor, Params, Result, SearchParams, Seq, VectorIndex,
};

/// A FreshDiskANN index in a directory (see the module docs).
pub struct FreshDiskann {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for FreshDiskann {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FreshDiskann")
            .field("dir", &self.inner.dir)
            .field("dim", &self.inner.dim)
            .field("len", &self.len())
            .finish()
    }
}

impl Drop for FreshDiskann {
    fn drop(&mut self) {
        self.inner.join_background();
    }
}

impl FreshDiskann {
    /// The index directory.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    pub fn params(&self) -> &FreshDiskannParams {
        &self.inner.params
    }

    /// Runs a merge now (waiting for a background one first); returns
    /// whether anything was merged.
    pub fn merge_now(&self) -> Result<bool> {
        self.inner.join_background();
        self.inner.merge()
    }

    /// Freezes the RW-TempIndex now.
    pub fn freeze(&self) -> Result<()> {
        let mut w = self.inner.writer.lock();
        self.inner.freeze(&mut w)
    }

    /// Statistics of the last merge.
    pub fn last_merge(&self) -> Option<MergeStats> {
        self.inner.status.last.lock().clone()
    }

    /// The LTI in force, if any, for tools (`read`: a closure over it).
    pub fn with_lti<R>(&self, f: impl FnOnce(Option<&Lti>) -> R) -> R {
        let st = self.inner.state.read();
        f(st.lti.as_ref().map(|g| &g.lti))
    }

    /// Caches the records nearest the LTI's start within `bytes` of RAM.
    pub fn cache_lti(&self, bytes: usize) -> Result<usize> {
        let mut st = self.inner.state.write();
        let Some(g) = st.lti.take() else {
            return Ok(0);
        };
        let mut g = match Arc::try_unwrap(g) {
            Ok(g) => g,
            Err(a) => {
                st.lti = Some(a);
                return Err(Error::invalid(
                    "the LTI is in use by a merge; cache it later",
                ));
            }
        };
        let r = g.lti.cache_near_start(bytes);
        st.lti = Some(Arc::new(g));
        r
    }
}

impl VectorIndex for FreshDiskann {
    fn descriptor(&self) -> &'static vectide_core::EngineDescriptor {
        &crate::DESCRIPTOR
    }

    fn params(&self) -> Params {
        let mut p = self.inner.params.to_params(self.inner.threads);
        p.insert(
            "path".into(),
            vectide_core::ParamValue::Str(self.inner.dir.display().to_string()),
        );
        p
    }

    fn dim(&self) -> usize {
        self.inner.dim
    }

    fn metric(&self) -> Metric {
        self.inner.metric
    }

    fn threads(&self) -> usize {
        self.inner.threads
    }

    fn pool(&self) -> Option<&rayon::ThreadPool> {
        Some(&self.inner.pool)
    }

    fn search_defaults(&self) -> SearchParams {
        SearchParams {
            ef: Some(self.inner.params.graph.l_search),
            beam_width: Some(self.inner.params.beam_width),
            ..SearchParams::default()
        }
    }

    fn insert(&self, seq: Seq, ids: &[u64], vectors: &[f32]) -> Result<()> {
        self.insert_with_progress(seq, ids, vectors, None)
    }

    fn insert_checked(&self, seq: Seq, batch: Checked<'_>) -> Result<()> {
        self.inner.insert(seq, batch, None)
    }

    fn insert_with_progress(
        &self,
        seq: Seq,
        ids: &[u64],
        vectors: &[f32],
        progress: Option<vectide_core::Progress<'_>>,
    ) -> Result<()> {
        let batch = Checked::new(self.inner.dim, self.inner.metric, ids, vectors)?;
        self.inner.insert(seq, batch, progress)
    }

    fn delete(&self, seq: Seq, ids: &[u64]) -> Result<usize> {
        self.inner.delete(seq, ids)
    }

    fn search_into(
        &self,
        query: &[f32],
        k: usize,
        params: &SearchParams,
        filter: Option<Filter<'_>>,
        out: &mut Vec<Neighbor>,
    ) -> Result<()> {
        self.inner.search_into(query, k, params, filter, out)
    }

    fn distances(&self, query: &[f32], ids: &[u64], out: &mut Vec<Neighbor>) -> Result<()> {
        self.inner.distances(query, ids, out)
    }

    fn get(&self, id: u64) -> Result<Option<Vec<f32>>> {
        self.inner.get(id)
    }

    fn contains(&self, id: u64) -> Result<bool> {
        Ok(self.inner.state.read().loc.contains_key(&id))
    }

    fn len(&self) -> usize {
        self.inner.state.read().loc.len()
    }

    fn flush(&self) -> Result<()> {
        if self.inner.params.external_log {
            // The caller's log holds the writes since the last freeze:
            // freeze now, so that the manifest covers them.
            let mut w = self.inner.writer.lock();
            return self.inner.freeze(&mut w);
        }
        // Every acknowledged call is durable already (its log record was
        // synced before it returned).
        Ok(())
    }

    fn durable_seq(&self) -> Seq {
        let i = &self.inner;
        if i.params.external_log {
            i.covered.load(Ordering::Acquire)
        } else {
            i.synced.load(Ordering::Acquire)
        }
    }

    fn stats(&self) -> Result<IndexStats> {
        Ok(self.inner.stats())
    }

    fn maintain(&self) -> Result<()> {
        self.merge_now().map(|_| ())
    }

    fn close(&self) -> Result<()> {
        self.inner.join_background();
        if self.inner.params.external_log {
            self.flush()?;
        }
        Ok(())
    }

    fn check_structure(&self) -> Result<Vec<String>> {
        self.inner.check()
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}
