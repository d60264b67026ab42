//! Inserting: slot allocation, level draw, the layer-by-layer linking of
//! HNSW (Malkov & Yashunin, Algorithm 1 with the neighbour-selection
//! heuristic of Algorithm 4), and the publication of a new node.

use crate::state::{pack_entry, unpack_entry, Hnsw};
use rayon::prelude::*;
use std::sync::atomic::{AtomicUsize, Ordering};
use vectide_core::heap::Candidate;
use vectide_core::validate::{copy_normalized, Checked};
use vectide_core::{Result, Seq};
use vectide_graph::codes::Quantization;
use vectide_graph::mem::{Store, DELETED};
use vectide_graph::prune::{
    backlink, draw_level, plan_links, rank_from, select_heuristic, Backlink,
};
use vectide_graph::search::Scratch;
use vectide_graph::slots::{allocate, newer_rows, publish};
use vectide_graph::Graph;
use vectide_quant::{Rabitq, RabitqParams};

/// Called with the number of rows done so far (for progress bars).
pub use vectide_core::Progress;

impl Hnsw {
    /// Draws a level with P(level >= l) = m^-l.
    fn random_level(&self) -> usize {
        let n = self.level_counter.fetch_add(1, Ordering::Relaxed);
        draw_level(self.params.seed, n, self.params.m)
    }

    /// Inserts a validated batch (upsert semantics), in parallel on the
    /// index's pool, reporting rows done to `progress`.
    pub fn insert_checked_rows(
        &self,
        seq: Seq,
        batch: Checked<'_>,
        progress: Option<Progress<'_>>,
    ) -> Result<()> {
        let (ids, vectors) = (batch.ids(), batch.vectors());
        let _op = self.core.seqs.begin(seq);
        let _shared = self.core.mutate.read();
        let rows = newer_rows(&self.core.ids, ids, seq);
        if rows.is_empty() {
            return Ok(());
        }
        self.enable_codes_from(&rows, vectors)?;
        let slots = allocate(&self.core.alloc, &self.core.store, rows.len())?;
        let store = self.core.store.read();
        let done = AtomicUsize::new(0);
        let dim = self.core.dim;
        let work = |scratch: &mut Scratch, i: usize| {
            let r = rows[i];
            let mut v = std::mem::take(&mut scratch.query);
            copy_normalized(self.core.metric, &vectors[r * dim..(r + 1) * dim], &mut v);
            let level = self.random_level();
            self.insert_node(&store, slots[i], ids[r], seq, &v, level, scratch);
            publish(
                &store,
                &self.core.ids,
                &self.core.pending,
                slots[i],
                ids[r],
                seq,
            );
            scratch.query = v;
            if let Some(p) = progress {
                let n = done.fetch_add(1, Ordering::Relaxed) + 1;
                if n.is_multiple_of(1024) || n == rows.len() {
                    p(n);
                }
            }
        };
        if rows.len() < 64 || vectide_core::VectorIndex::threads(self) == 1 {
            let mut scratch = self.core.scratch.get();
            (0..rows.len()).for_each(|i| work(&mut scratch, i));
        } else {
            self.core.install(|| {
                (0..rows.len())
                    .into_par_iter()
                    .for_each_init(|| self.core.scratch.get(), |scratch, i| work(scratch, i))
            });
        }
        Ok(())
    }

    /// With quantization on and no codes yet, turns them on around the
    /// mean of the first batch's rows (normalised as stored): the
    /// quantizer's centroid, kept from then on (saved with the index).
    fn enable_codes_from(&self, rows: &[usize], vectors: &[f32]) -> Result<()> {
        if self.params.quantization == Quantization::None
            || self.core.store.read().codes().is_some()
        {
            return Ok(());
        }
        let dim = self.core.dim;
        let mut mean = vec![0f64; dim];
        let mut v = Vec::with_capacity(dim);
        for &r in rows {
            copy_normalized(self.core.metric, &vectors[r * dim..(r + 1) * dim], &mut v);
            for (m, x) in mean.iter_mut().zip(&v) {
                *m += f64::from(*x);
            }
        }
        let centroid = mean
            .iter()
            .map(|m| (m / rows.len() as f64) as f32)
            .collect();
        let rq = Rabitq::new(self.core.metric, centroid, RabitqParams::default())?;
        let mut store = self.core.store.write();
        if store.codes().is_none() {
            store.enable_codes(rq)?;
        }
        Ok(())
    }

    /// Links one node into the graph, top layer first.
    #[allow(clippy::too_many_arguments)]
    fn insert_node(
        &self,
        store: &Store,
        slot: u32,
        label: u64,
        seq: Seq,
        v: &[f32],
        level: usize,
        scratch: &mut Scratch,
    ) {
        // SAFETY: `slot` came from `allocate`: never linked, or reclaimed by a
        // consolidation that removed every edge to it and waited for all
        // searches (exclusive store lock) before freeing it. No other thread
        // knows its id until we link it below.
        unsafe { store.init_slot(slot, label, seq, v, level) };
        let mut word = self.entry.load(Ordering::Acquire);
        let _top_guard = if unpack_entry(word).is_none_or(|(_, top)| level > top) {
            let g = self.entry_lock.lock();
            word = self.entry.load(Ordering::Acquire);
            Some(g)
        } else {
            None
        };
        let Some(entry) = unpack_entry(word) else {
            self.entry.store(pack_entry(slot, level), Ordering::Release);
            return;
        };
        // Phase 1: every own list is set before anyone can reach the node, so
        // a search entering it at any layer finds its edges there (an empty
        // list at an entry point would strand that search).
        let mut lists = std::mem::take(&mut scratch.lists);
        // Deleted nodes are walked, never linked to (a consolidation that
        // repairs beside inserts relies on it; see `update`).
        plan_links(
            store,
            self.core.dist,
            v,
            slot,
            level,
            entry,
            self.params.ef_construction,
            self.params.m,
            scratch,
            &mut lists,
            |s| store.state(s) != DELETED,
        );
        for (l, selected) in lists.iter_mut().enumerate() {
            let Scratch {
                neighbors, sorted, ..
            } = scratch;
            self.set_own_list(store, slot, l, selected, neighbors, sorted);
        }
        // Phase 2: the back-edges that make the node reachable.
        for (l, selected) in lists.iter().enumerate() {
            for &n in selected {
                let Scratch {
                    sorted,
                    neighbors,
                    fresh,
                    ..
                } = scratch;
                let _g = store.lock(n);
                match backlink(store, self.core.dist, n, slot, l, neighbors, sorted, fresh) {
                    Backlink::Present => {}
                    Backlink::Append => {
                        store.push_neighbor(n, l, slot);
                    }
                    Backlink::Replace => store.set_list(n, l, fresh),
                }
            }
        }
        scratch.lists = lists;
        if level > entry.1 {
            self.entry.store(pack_entry(slot, level), Ordering::Release);
        }
    }

    /// Sets the new node's list at layer `l`, merging with edges other
    /// inserters may already have added to it (they can reach the node
    /// through a higher layer before this one is set).
    fn set_own_list(
        &self,
        store: &Store,
        slot: u32,
        l: usize,
        selected: &mut Vec<u32>,
        buf: &mut Vec<u32>,
        ranked: &mut Vec<Candidate>,
    ) {
        let _g = store.lock(slot);
        store.neighbors_into(slot, l, buf);
        if buf.is_empty() {
            store.set_list(slot, l, selected);
            return;
        }
        buf.extend_from_slice(selected);
        buf.sort_unstable();
        buf.dedup();
        buf.retain(|&x| x != slot);
        rank_from(store, self.core.dist, slot, buf, ranked);
        select_heuristic(store, self.core.dist, ranked, store.cap(l), selected);
        store.set_list(slot, l, selected);
    }
}
