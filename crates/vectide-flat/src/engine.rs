//! The face of [`Flat`]: its [`VectorIndex`] implementation over the
//! state (`state.rs`) and the parts.

use crate::search::{search_one, TILES};
use crate::state::*;
use std::path::Path;
use std::sync::atomic::Ordering;
use vectide_core::validate::Checked;
use vectide_core::{
    limits, EngineDescriptor, Filter, IndexStats, Metric, Neighbor, Params, Result, SearchParams,
    Seq, VectorIndex,
};

impl VectorIndex for Flat {
    fn descriptor(&self) -> &'static EngineDescriptor {
        &crate::DESCRIPTOR
    }

    fn params(&self) -> Params {
        self.params.to_params(self.threads())
    }

    fn dim(&self) -> usize {
        self.dim
    }

    fn metric(&self) -> Metric {
        self.metric
    }

    fn pool(&self) -> Option<&rayon::ThreadPool> {
        self.pool.as_deref()
    }

    fn insert(&self, seq: Seq, ids: &[u64], vectors: &[f32]) -> Result<()> {
        self.insert_batch(seq, Checked::new(self.dim, self.metric, ids, vectors)?)
    }

    fn insert_checked(&self, seq: Seq, batch: Checked<'_>) -> Result<()> {
        self.insert_batch(seq, batch)
    }

    fn delete(&self, seq: Seq, ids: &[u64]) -> Result<usize> {
        self.delete_batch(seq, ids)
    }

    fn search_into(
        &self,
        query: &[f32],
        k: usize,
        _params: &SearchParams,
        filter: Option<Filter<'_>>,
        out: &mut Vec<Neighbor>,
    ) -> Result<()> {
        out.clear();
        limits::check_k(k)?;
        self.with_query(query, |store, q, scratch| {
            search_one(store, self.dist, q, k, filter, scratch, out)
        })
    }

    fn search_batch(
        &self,
        queries: &[f32],
        k: usize,
        _params: &SearchParams,
        filter: Option<Filter<'_>>,
    ) -> Result<Vec<Vec<Neighbor>>> {
        self.search_batch_tiled(queries, k, filter, TILES.queries, TILES.vectors)
    }

    fn distances(&self, query: &[f32], ids: &[u64], out: &mut Vec<Neighbor>) -> Result<()> {
        self.with_query(query, |store, q, _| {
            out.extend(ids.iter().filter_map(|&id| {
                let slot = store.slot_of(id)?;
                Some(Neighbor::new(id, (self.dist)(q, store.vector(slot))))
            }))
        })
    }

    /// A flat search is a scan already.
    fn exact_scan(&self, query: &[f32], k: usize) -> Result<Option<Vec<Neighbor>>> {
        self.search(query, k, &SearchParams::default(), None)
            .map(Some)
    }

    fn get(&self, id: u64) -> Result<Option<Vec<f32>>> {
        let store = self.store.read();
        Ok(store.slot_of(id).map(|s| store.vector(s).to_vec()))
    }

    fn contains(&self, id: u64) -> Result<bool> {
        Ok(self.store.read().slot_of(id).is_some())
    }

    fn len(&self) -> usize {
        self.store.read().live()
    }

    /// A volatile index has nothing to make durable but by [`VectorIndex::save`].
    fn flush(&self) -> Result<()> {
        Ok(())
    }

    fn durable_seq(&self) -> Seq {
        self.durable.load(Ordering::Acquire)
    }

    fn stats(&self) -> Result<IndexStats> {
        let store = self.store.read();
        Ok(IndexStats {
            live: store.live(),
            // Deletes free their slot at once.
            slots_used: store.live(),
            capacity: store.capacity(),
            pending_deletes: 0,
            memory_bytes: store.memory_bytes(),
            extra: vec![("free_slots".into(), store.free_slots() as f64)],
            ..IndexStats::default()
        })
    }

    fn save(&self, path: &Path) -> Result<()> {
        crate::persist::save(self, path)
    }

    fn save_staged(&self, path: &Path) -> Result<vectide_core::StagedSave<'_>> {
        crate::persist::save_staged(self, path)
    }

    fn check_structure(&self) -> Result<Vec<String>> {
        Ok(self.store.read().check())
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::FlatParams;

    #[test]
    fn a_small_index_answers_and_reports() {
        let idx = Flat::new(2, Metric::L2, FlatParams { threads: Some(2) }).unwrap();
        idx.insert(1, &[1, 2, 3], &[0.0, 0.0, 1.0, 0.0, 5.0, 5.0])
            .unwrap();
        let r = idx
            .search(&[0.9, 0.0], 2, &SearchParams::default(), None)
            .unwrap();
        assert_eq!(r.iter().map(|n| n.id).collect::<Vec<_>>(), vec![2, 1]);
        assert!((r[0].distance - 0.01).abs() < 1e-6);
        assert_eq!(idx.threads(), 2);
        assert_eq!(idx.engine(), "flat");
        assert_eq!(idx.get(3).unwrap(), Some(vec![5.0, 5.0]));
        assert!(idx.contains(1).unwrap() && !idx.contains(4).unwrap());
        let mut d = Vec::new();
        idx.distances(&[0.0, 0.0], &[3, 9, 1], &mut d).unwrap();
        assert_eq!(d, vec![Neighbor::new(3, 50.0), Neighbor::new(1, 0.0)]);
        assert_eq!(idx.delete(2, &[1, 1, 77]).unwrap(), 1);
        let st = idx.stats().unwrap();
        assert_eq!((st.live, st.slots_used, st.pending_deletes), (2, 2, 0));
        assert!(st.capacity >= 3 && st.memory_bytes > 0);
        assert_eq!(idx.len(), 2);
        assert!(idx
            .search(&[0.0, 0.0], 0, &SearchParams::default(), None)
            .is_err());
        assert!(idx
            .search(
                &[0.0, 0.0],
                limits::MAX_K + 1,
                &SearchParams::default(),
                None
            )
            .is_err());
        for dim in [0, limits::MAX_DIM + 1, usize::MAX] {
            assert!(Flat::new(dim, Metric::L2, FlatParams::default()).is_err());
        }
    }
}
