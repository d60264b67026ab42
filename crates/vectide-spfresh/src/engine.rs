//! The face of the SPANN-family engines: the [`Spfresh`] handle and its
//! [`VectorIndex`] implementation over the state (`state.rs`).

use crate::params::Mode;
use crate::state::*;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use vectide_core::validate::Checked;
use vectide_core::{
    EngineDescriptor, Filter, IndexStats, Metric, Neighbor, ParamValue, Params, Result,
    SearchParams, Seq, VectorIndex,
};

/// A SPANN-family index in a directory (see the module docs).
pub struct Spfresh {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for Spfresh {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Spfresh")
            .field("mode", &self.inner.mode)
            .field("dir", &self.inner.dir)
            .field("dim", &self.inner.dim)
            .field("len", &self.len())
            .finish()
    }
}

impl Drop for Spfresh {
    fn drop(&mut self) {
        self.inner.jobs.stop_workers();
    }
}

impl Spfresh {
    /// The mode (which engine this is).
    pub fn mode(&self) -> Mode {
        self.inner.mode
    }

    /// The split limit in records.
    pub fn posting_limit(&self) -> usize {
        self.inner.limit
    }

    /// Takes a snapshot now (and restarts the WAL).
    pub fn snapshot(&self) -> Result<()> {
        self.inner.snapshot()
    }

    /// Runs every queued Local Rebuilder job to completion on this thread.
    pub fn drain_jobs(&self) -> Result<()> {
        self.inner.drain_jobs()
    }

    /// Counts every posting's records (a full read of the block store).
    pub fn census(&self) -> Result<Census> {
        self.inner.census()
    }

    /// The last error of a background job, if any.
    pub fn last_job_error(&self) -> Option<String> {
        self.inner.last_error.lock().clone()
    }
}

pub(crate) fn descriptor_of(mode: Mode) -> &'static EngineDescriptor {
    match mode {
        Mode::Static => &crate::SPANN,
        Mode::Inplace => &crate::SPANN_INPLACE,
        Mode::Fresh => &crate::SPFRESH,
    }
}

impl VectorIndex for Spfresh {
    fn descriptor(&self) -> &'static EngineDescriptor {
        descriptor_of(self.inner.mode)
    }

    fn params(&self) -> Params {
        let mut p = self.inner.params.to_params(self.inner.threads);
        p.insert(
            "path".into(),
            ParamValue::Str(self.inner.dir.display().to_string()),
        );
        p
    }

    fn dim(&self) -> usize {
        self.inner.dim
    }

    fn metric(&self) -> Metric {
        self.inner.metric
    }

    fn search_defaults(&self) -> SearchParams {
        SearchParams {
            nprobe: Some(self.inner.params.nprobe),
            ..SearchParams::default()
        }
    }

    fn pool(&self) -> Option<&rayon::ThreadPool> {
        Some(&self.inner.pool)
    }

    fn insert(&self, seq: Seq, ids: &[u64], vectors: &[f32]) -> Result<()> {
        self.inner.insert(
            seq,
            Checked::new(self.inner.dim, self.inner.metric, ids, vectors)?,
        )
    }

    fn insert_checked(&self, seq: Seq, batch: Checked<'_>) -> Result<()> {
        self.inner.insert(seq, batch)
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
        let nprobe = params.nprobe.unwrap_or(self.inner.params.nprobe);
        self.inner
            .with_scratch(|sc| self.inner.search(query, k, nprobe, filter, sc, out))
    }

    fn distances(&self, query: &[f32], ids: &[u64], out: &mut Vec<Neighbor>) -> Result<()> {
        self.inner.distances(query, ids, out)
    }

    fn get(&self, id: u64) -> Result<Option<Vec<f32>>> {
        self.inner.get(id)
    }

    fn contains(&self, id: u64) -> Result<bool> {
        Ok(self.inner.ids.read().ext.contains_key(&id))
    }

    fn len(&self) -> usize {
        self.inner.ids.read().ext.len()
    }

    fn flush(&self) -> Result<()> {
        if self.inner.params.external_log {
            // The caller's log holds the writes since the last snapshot.
            return self.inner.snapshot();
        }
        // Every call is synced before it returns.
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
        self.inner.stats()
    }

    fn maintain(&self) -> Result<()> {
        self.inner.maintain()
    }

    /// `spann` leaves its rebuild to the caller's `maintain()` from now on
    /// (without this call it starts a due rebuild itself, in the
    /// background); the others' jobs run in their background drain.
    fn defer_maintenance(&self) -> bool {
        let static_mode = self.inner.mode == Mode::Static;
        if static_mode {
            self.inner.deferred.store(true, Ordering::Release);
        }
        static_mode
    }

    fn maintenance_due(&self) -> bool {
        self.inner.rebuild_due()
    }

    /// Holds the background drain (splits, merges, reassigns, compaction,
    /// reclaims, snapshots) and the background `spann` rebuild; postings
    /// may grow past the split limit meanwhile. The writers' backstops
    /// still run (a reclaim four thresholds behind, an overdue snapshot),
    /// and so does what a caller asks for (`maintain()` runs the queued
    /// jobs and a due rebuild on its own thread). The release starts the
    /// drain, and a `spann` rebuild that fell due meanwhile: no write may
    /// come to start it.
    fn pause_maintenance(&self, paused: bool) -> bool {
        let held = self.inner.jobs.pause(paused);
        if held && !paused {
            self.inner.start_rebuild_if_due();
        }
        held
    }

    fn close(&self) -> Result<()> {
        self.inner.jobs.stop_workers();
        self.inner.drain_jobs()?;
        self.inner.snapshot()
    }

    fn check_structure(&self) -> Result<Vec<String>> {
        self.inner.check_structure()
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}
