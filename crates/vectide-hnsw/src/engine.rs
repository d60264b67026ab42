//! The face of [`Hnsw`]: its [`VectorIndex`] implementation over the
//! state (`state.rs`) and the parts.

use crate::state::*;
use vectide_core::validate::Checked;
use vectide_core::{Filter, Metric, Neighbor, Result, SearchParams, Seq, VectorIndex};

impl VectorIndex for Hnsw {
    fn descriptor(&self) -> &'static vectide_core::EngineDescriptor {
        &crate::descriptor::HNSW
    }

    fn params(&self) -> vectide_core::Params {
        let mut out = vectide_graph::hnsw_params::graph_params_out(&self.params, self.threads());
        out.insert(
            "quantization".into(),
            vectide_core::ParamValue::Str(self.params.quantization.name().into()),
        );
        out
    }

    /// Edges to free slots or to nodes absent from that layer, and a live
    /// count that disagrees with the slot states. (Reachability is not a
    /// violation: pruning can, rarely, strand a node between
    /// consolidations; `check_graph` reports it.)
    fn check_structure(&self) -> Result<Vec<String>> {
        let g = self.check_graph();
        let mut v = Vec::new();
        if g.bad_edges > 0 {
            v.push(format!(
                "{} edges to free slots or missing layers",
                g.bad_edges
            ));
        }
        if g.live != self.len() {
            v.push(format!("{} live slots, {} live ids", g.live, self.len()));
        }
        Ok(v)
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn search_defaults(&self) -> SearchParams {
        SearchParams::with_ef(self.params.ef_search)
    }

    fn dim(&self) -> usize {
        self.core.dim
    }

    fn metric(&self) -> Metric {
        self.core.metric
    }

    fn insert(&self, seq: Seq, ids: &[u64], vectors: &[f32]) -> Result<()> {
        self.insert_with_progress(seq, ids, vectors, None)
    }

    fn insert_checked(&self, seq: Seq, batch: Checked<'_>) -> Result<()> {
        self.insert_checked_rows(seq, batch, None)
    }

    fn insert_with_progress(
        &self,
        seq: Seq,
        ids: &[u64],
        vectors: &[f32],
        progress: Option<vectide_core::Progress<'_>>,
    ) -> Result<()> {
        let batch = Checked::new(self.dim(), self.metric(), ids, vectors)?;
        self.insert_checked_rows(seq, batch, progress)
    }

    fn save(&self, path: &std::path::Path) -> Result<()> {
        Hnsw::save(self, path)
    }

    fn save_staged(&self, path: &std::path::Path) -> Result<vectide_core::StagedSave<'_>> {
        Hnsw::save_staged(self, path)
    }

    fn maintain(&self) -> Result<()> {
        self.consolidate();
        Ok(())
    }

    fn defer_maintenance(&self) -> bool {
        self.core.defer_maintenance()
    }

    fn maintenance_due(&self) -> bool {
        self.core
            .consolidation_due(self.params.consolidate_fraction)
    }

    fn delete(&self, seq: Seq, ids: &[u64]) -> Result<usize> {
        self.delete_batch(seq, ids)
    }

    fn search_into(
        &self,
        query: &[f32],
        k: usize,
        params: &SearchParams,
        filter: Option<Filter<'_>>,
        out: &mut Vec<Neighbor>,
    ) -> Result<()> {
        let ef = params.ef.unwrap_or(self.params.ef_search).max(k);
        self.core.with_query(query, k, |store, q, scratch| {
            self.search_with(store, q, k, ef, filter, scratch, out)
        })
    }

    vectide_graph::graph_core_methods!();
}
