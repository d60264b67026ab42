//! Deletes: crash-consistent tombstones.
//!
//! A delete is an NLog operation of its own (the paper logs inserts only;
//! a delete must change two words in different cache lines — the node's
//! delete flag and the label map bucket — plus the live counter, so it needs
//! a redo record to be atomic): content → fence; `LOGGED` → fence; flag
//! `DELETED`, bucket tombstone, counter → fence; `NONE` → fence; then the
//! entry is free for another operation.
//!
//! The deleted node stays in the graph as a tombstone: searches walk through
//! it and never return it, so the graph stays navigable, until a
//! consolidation (`consolidate.rs`) repairs the lists that name it, unlinks
//! it and hands its slot to inserts.

use super::layout::DELETED;
use super::log::{NEntry, KIND_DELETE, LOGGED, NONE};
use super::state::PHnsw;
use std::sync::atomic::Ordering;
use vectide_core::{Result, Seq};
use vectide_storage::Site;

pub(crate) const S_DEL_NLOG: Site = Site("delete.nlog");
pub(crate) const F_DEL_LOG: Site = Site("delete.fence.nlog");
pub(crate) const S_DEL_LOGGED: Site = Site("delete.logged");
pub(crate) const F_DEL_LOGGED: Site = Site("delete.fence.logged");
pub(crate) const S_DEL_FLAG: Site = Site("delete.flag");
pub(crate) const S_DEL_LIVE: Site = Site("delete.live_count");
pub(crate) const F_DEL_APPLY: Site = Site("delete.fence.apply");
pub(crate) const S_DEL_DONE: Site = Site("delete.none");
pub(crate) const F_DEL_DONE: Site = Site("delete.fence.none");

impl PHnsw {
    /// Deletes labels; absent ones are ignored. Each is durable when the
    /// call returns. Returns how many were removed.
    pub(crate) fn delete_batch(&self, seq: Seq, ids: &[u64]) -> Result<usize> {
        self.poison.check()?;
        let mut removed = 0;
        let mut guard = Some(self.seqs.begin(seq));
        for (k, &label) in ids.iter().enumerate() {
            let _mutate = self.mutate.read();
            let _l = self.label_lock(label);
            let Some(slot) = self.labels.get(&self.graph, label) else {
                continue;
            };
            if self.recorded_seq(slot) > seq {
                continue; // replay of a delete older than the write
            }
            let i = self.logs.nlog_claim(&self.meta);
            let e = NEntry {
                kind: KIND_DELETE,
                level: 0,
                slot,
                label,
                seq,
                old: Some(slot),
                live_before: self.logs.nlog_live(&self.meta, i),
                lists: Vec::new(),
            };
            self.logs.nlog_write(&self.meta, i, &e, S_DEL_NLOG);
            self.meta.fence(F_DEL_LOG);
            self.logs
                .nlog_set_state(&self.meta, i, LOGGED, S_DEL_LOGGED);
            self.meta.fence(F_DEL_LOGGED);
            self.apply_delete(i, &e);
            self.logs.nlog_set_state(&self.meta, i, NONE, S_DEL_DONE);
            let w = (k + 1 == ids.len()).then(|| {
                // The batch ends here: its sequence number is made durable
                // by this delete's final fence.
                drop(guard.take());
                let w = self.seqs.watermark();
                self.store_durable_seq(w);
                w
            });
            self.meta.fence(F_DEL_DONE);
            self.logs.nlog_release(i);
            if let Some(w) = w {
                self.durable_seq_fenced(w);
            }
            removed += 1;
        }
        drop(guard);
        self.persist_durable_seq();
        self.consolidate_if_due()?;
        Ok(removed)
    }

    /// Applies a logged delete and fences. Idempotent (recovery redoes it).
    pub(crate) fn apply_delete(&self, i: usize, e: &NEntry) {
        let g = &self.graph;
        g.state_word(e.slot).store(DELETED, Ordering::Release);
        g.nodes
            .persist(S_DEL_FLAG, g.node_off(e.slot) + self.g.n_state(), 4);
        self.labels.remove(g, e.label);
        self.logs
            .nlog_set_live(&self.meta, i, e.live_before - 1, S_DEL_LIVE);
        self.meta.fence(F_DEL_APPLY);
    }
}
