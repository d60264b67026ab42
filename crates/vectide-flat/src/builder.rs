//! Insert and upsert batches.
//!
//! A batch is checked whole first ([`check_batch`]: dimension, finite
//! values, zero vectors under cosine, the reserved id, duplicate ids) and
//! room is reserved for its new ids, both before the first write: a bad
//! batch, or one that cannot be allocated, changes nothing. Then, under
//! the write lock, each row is copied into its slot (normalised under
//! cosine, its augmentation computed). An id already present is replaced in
//! place when the batch's sequence number is newer than the one recorded
//! for it, and skipped otherwise, so that replaying a log is harmless.

use crate::state::Flat;
use vectide_core::validate::{copy_normalized, Checked};
use vectide_core::{Result, Seq};

impl Flat {
    /// Inserts (or replaces) `ids` with the row-major `vectors`.
    pub(crate) fn insert_batch(&self, seq: Seq, batch: Checked<'_>) -> Result<()> {
        let (ids, vectors) = (batch.ids(), batch.vectors());
        let _op = self.seqs.begin(seq);
        let mut store = self.store.write();
        let new_ids = ids
            .iter()
            .filter(|&&id| store.slot_of(id).is_none())
            .count();
        store.reserve(new_ids)?;
        let mut row = Vec::with_capacity(self.dim);
        for (&id, v) in ids.iter().zip(vectors.chunks_exact(self.dim)) {
            copy_normalized(self.metric, v, &mut row);
            store.put(seq, id, &row);
        }
        Ok(())
    }
}
