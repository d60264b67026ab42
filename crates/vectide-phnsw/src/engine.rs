//! The face of [`PHnsw`]: its [`VectorIndex`] implementation over the
//! state (`state.rs`) and the parts.

use super::layout::{LIVE, M_DURABLE_SEQ};
use super::state::*;
use std::sync::atomic::Ordering;
use vectide_core::validate::prepare_query;
use vectide_core::validate::Checked;
use vectide_core::{
    Error, Filter, IndexStats, Metric, Neighbor, Result, SearchParams, Seq, VectorIndex,
};
use vectide_graph::search::knn;

impl VectorIndex for PHnsw {
    fn descriptor(&self) -> &'static vectide_core::EngineDescriptor {
        &super::descriptor::P_HNSW
    }

    fn params(&self) -> vectide_core::Params {
        self.params_out()
    }

    fn pool(&self) -> Option<&rayon::ThreadPool> {
        self.pool.as_deref()
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn search_defaults(&self) -> SearchParams {
        SearchParams::with_ef(self.params.ef_search)
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

    fn dim(&self) -> usize {
        self.g.dim
    }

    fn metric(&self) -> Metric {
        self.g.metric
    }

    fn insert(&self, seq: Seq, ids: &[u64], vectors: &[f32]) -> Result<()> {
        self.insert_with_progress(seq, ids, vectors, None)
    }

    fn insert_checked(&self, seq: Seq, batch: Checked<'_>) -> Result<()> {
        self.insert_checked_rows(seq, batch, None)
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
        if k == 0 {
            return Err(Error::invalid("k must be at least 1"));
        }
        let mut scratch = self.scratch.get();
        let mut qbuf = std::mem::take(&mut scratch.query);
        let q = match prepare_query(self.g.dim, self.g.metric, query, &mut qbuf) {
            Ok(q) => q,
            Err(e) => {
                scratch.query = qbuf;
                return Err(e);
            }
        };
        let ef = params.ef.unwrap_or(self.params.ef_search).max(k);
        // A consolidation hands the slots it unlinked to inserts only after
        // every search that could still reach them has ended.
        let _gate = self.gate.read();
        let graph = &self.graph;
        let entry = self.entry();
        match filter {
            None => knn(graph, self.dist, q, entry, ef, &mut scratch, |s| {
                graph.state(s) == LIVE
            }),
            Some(f) => knn(graph, self.dist, q, entry, ef, &mut scratch, |s| {
                graph.state(s) == LIVE && f(graph.label(s))
            }),
        }
        out.clear();
        // An upsert makes the new node live just before it retires the old
        // one: a search in between may meet both versions of a label; it
        // keeps the closer one, so a label appears once.
        for c in scratch.sorted.iter() {
            if out.len() == k {
                break;
            }
            let label = graph.label(c.node);
            if !out.iter().any(|n| n.id == label) {
                out.push(Neighbor::new(label, c.dist.0));
            }
        }
        scratch.query = qbuf;
        Ok(())
    }

    fn distances(&self, query: &[f32], ids: &[u64], out: &mut Vec<Neighbor>) -> Result<()> {
        use vectide_graph::Graph;
        let mut scratch = self.scratch.get();
        let mut qbuf = std::mem::take(&mut scratch.query);
        let _gate = self.gate.read();
        let result = prepare_query(self.g.dim, self.g.metric, query, &mut qbuf).map(|q| {
            out.extend(ids.iter().filter_map(|&id| {
                let s = self.labels.get(&self.graph, id)?;
                Some(Neighbor::new(id, (self.dist)(q, self.graph.vector(s))))
            }));
        });
        scratch.query = qbuf;
        result
    }

    /// A scan of the node slots in file order, the readers' gate held per
    /// stretch of slots (a consolidation takes it exclusively, with
    /// writers paused, before it hands unlinked slots to inserts: it
    /// waits for one stretch, not the whole scan).
    fn exact_scan(&self, query: &[f32], k: usize) -> Result<Option<Vec<Neighbor>>> {
        let mut qbuf = Vec::new();
        let q = prepare_query(self.g.dim, self.g.metric, query, &mut qbuf)?;
        let g = &self.graph;
        vectide_graph::core::scan_nearest(
            k,
            || self.next_slot().min(g.capacity()) as u32,
            |slots, bound, kept| {
                let _gate = self.gate.read();
                for s in slots {
                    if g.state(s) == LIVE {
                        let d = (self.dist)(q, vectide_graph::Graph::vector(g, s));
                        if d <= bound {
                            kept.push(Neighbor::new(g.label(s), d));
                        }
                    }
                }
            },
        )
        .map(Some)
    }

    fn get(&self, id: u64) -> Result<Option<Vec<f32>>> {
        Ok(self.vector_of(id))
    }

    fn contains(&self, id: u64) -> Result<bool> {
        Ok(self.has_label(id))
    }

    fn len(&self) -> usize {
        let total: i64 = (0..self.g.nlog_entries)
            .map(|i| self.logs.nlog_live(&self.meta, i))
            .sum();
        total.max(0) as usize
    }

    fn flush(&self) -> Result<()> {
        // Every acknowledged operation is durable already.
        Ok(())
    }

    fn durable_seq(&self) -> Seq {
        self.meta.u64_at(M_DURABLE_SEQ).load(Ordering::Acquire)
    }

    fn maintain(&self) -> Result<()> {
        self.consolidate().map(|_| ())
    }

    fn defer_maintenance(&self) -> bool {
        self.maintenance_deferred.store(true, Ordering::Release);
        true
    }

    fn maintenance_due(&self) -> bool {
        self.consolidation_due()
    }

    fn stats(&self) -> Result<IndexStats> {
        let live = self.len();
        // Reclaimed slots wait on the free list for inserts.
        let used = self.next_slot().saturating_sub(self.free.lock().len());
        let memory_bytes = self.meta.len()
            + self.graph.nodes.len()
            + self.graph.upper.len()
            + self.labels.table.read().region.len();
        let mut stats = IndexStats {
            live,
            slots_used: used,
            capacity: self.graph.capacity(),
            pending_deletes: used.saturating_sub(live),
            memory_bytes,
            // The regions are memory-mapped files: what is mapped is on disk.
            disk_bytes: memory_bytes as u64,
            extra: self.extra_stats(),
            ..IndexStats::default()
        };
        self.activity.fill(&mut stats);
        Ok(stats)
    }

    fn check_structure(&self) -> Result<Vec<String>> {
        // A node whose checksum does not match is damage, not a structural
        // violation to list: the typed error names its slot.
        self.verify()?;
        Ok(self.check())
    }
}
