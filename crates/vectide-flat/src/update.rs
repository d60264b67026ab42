//! Deletes. A deleted id leaves the id map at once, its row is zeroed and
//! its slot goes to the free list, where the next insert takes it: a flat
//! index has no tombstones and nothing to consolidate.

use crate::state::Flat;
use vectide_core::{Result, Seq};

impl Flat {
    /// Deletes `ids`; absent ids, and ids written by a newer operation than
    /// `seq`, are left alone. Returns how many were removed.
    pub(crate) fn delete_batch(&self, seq: Seq, ids: &[u64]) -> Result<usize> {
        let _op = self.seqs.begin(seq);
        let mut store = self.store.write();
        Ok(ids.iter().filter(|&&id| store.remove(seq, id)).count())
    }
}
