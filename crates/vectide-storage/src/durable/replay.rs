//! Recovery by replay: the calls a log holds past an engine's checkpoint,
//! applied in log order. Consecutive inserts go to the engine as one batch
//! (one call per logged call dominated restart time). A batch carries the
//! highest sequence number of its calls, and engines stamp every row with
//! it; that is harmless only if no later call in the log has a lower
//! number (writers log in lock order, not sequence order: a later delete
//! numbered below the stamp would be taken for stale and skipped). So a
//! batch ends at a delete, at an id it already holds, at [`BATCH_ROWS`]
//! rows, and before a call whose joining would raise the stamp to the
//! lowest number of any call after it; a call alone is stamped with its
//! own number.

use std::collections::HashSet;
use vectide_core::{Result, Seq};

/// Rows after which a batch of replayed inserts is applied.
pub const BATCH_ROWS: usize = 4096;

/// Gathers replayed inserts into batches (see the module docs).
#[derive(Debug, Default)]
pub struct Batcher {
    /// The stamp: the highest number of the batch's calls.
    seq: Seq,
    /// The lowest number of the batch's calls.
    lo: Seq,
    /// The highest number of any call before the batch in the log.
    floor: Seq,
    ids: Vec<u64>,
    vectors: Vec<f32>,
    seen: HashSet<u64>,
}

impl Batcher {
    /// Adds an insert call. `around` is the highest sequence number of
    /// any call before it in the log and the lowest of any call after it
    /// (`(0, Seq::MAX)` when the log is in sequence order, as the
    /// database's is). The call joins the batch only if every number in
    /// the batch stays above everything logged before the batch and below
    /// everything logged after the call, and it repeats none of the batch's
    /// ids: then stamping its rows with the batch's highest number changes
    /// no engine's "newer than what the id holds" decision. Otherwise
    /// `apply` receives the batch first and the call starts the next one
    /// (a call alone is stamped with its own number). A full batch is
    /// applied at once.
    pub fn insert(
        &mut self,
        seq: Seq,
        ids: &[u64],
        vectors: &[f32],
        around: (Seq, Seq),
        apply: &mut impl FnMut(Seq, &[u64], &[f32]) -> Result<()>,
    ) -> Result<()> {
        let (before, after) = around;
        if !self.ids.is_empty()
            && (self.lo.min(seq) <= self.floor
                || self.seq.max(seq) >= after
                || ids.iter().any(|i| self.seen.contains(i)))
        {
            self.flush(apply)?;
        }
        if self.ids.is_empty() {
            self.floor = before;
            self.lo = seq;
            self.seq = seq;
        }
        self.lo = self.lo.min(seq);
        self.seq = self.seq.max(seq);
        self.ids.extend_from_slice(ids);
        self.vectors.extend_from_slice(vectors);
        self.seen.extend(ids.iter().copied());
        if self.ids.len() >= BATCH_ROWS {
            self.flush(apply)?;
        }
        Ok(())
    }

    /// Applies what is gathered (a delete must call it first).
    pub fn flush(
        &mut self,
        apply: &mut impl FnMut(Seq, &[u64], &[f32]) -> Result<()>,
    ) -> Result<()> {
        if !self.ids.is_empty() {
            apply(self.seq, &self.ids, &self.vectors)?;
            self.ids.clear();
            self.vectors.clear();
            self.seen.clear();
        }
        self.seq = 0;
        self.lo = 0;
        self.floor = 0;
        Ok(())
    }
}

/// What a replay did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Replayed {
    /// Calls applied.
    pub calls: usize,
    /// The highest sequence number now held: the checkpoint's or a
    /// replayed call's. Writers log in lock order, not sequence order, so
    /// this is the largest number seen, not the last.
    pub watermark: Seq,
}

/// Applies every call of `ops` (a log that begins after the checkpoint
/// that covers `covered`) in log order: inserts batched through
/// [`Batcher`], deletes one call each.
pub fn replay(
    ops: impl IntoIterator<Item = super::LogOp>,
    covered: Seq,
    mut insert: impl FnMut(Seq, &[u64], &[f32]) -> Result<()>,
    mut delete: impl FnMut(Seq, &[u64]) -> Result<()>,
) -> Result<Replayed> {
    let mut out = Replayed {
        calls: 0,
        watermark: covered,
    };
    let ops: Vec<super::LogOp> = ops.into_iter().collect();
    // The lowest sequence number of the calls after each one.
    let mut later = vec![Seq::MAX; ops.len() + 1];
    for (i, op) in ops.iter().enumerate().rev() {
        later[i] = later[i + 1].min(op.seq());
    }
    // The highest number of the calls before each one, and of what the
    // checkpoint holds: a call numbered at or below `covered` (numbered
    // before its writer took the lock, logged after the checkpoint) never
    // joins a batch whose stamp would beat what the checkpoint stored.
    let mut before = covered;
    let mut batch = Batcher::default();
    for (i, op) in ops.into_iter().enumerate() {
        out.calls += 1;
        out.watermark = out.watermark.max(op.seq());
        let seq_i = op.seq();
        match op {
            super::LogOp::Insert { seq, ids, vectors } => {
                if !ids.is_empty() {
                    batch.insert(seq, &ids, &vectors, (before, later[i + 1]), &mut insert)?;
                }
            }
            super::LogOp::Delete { seq, ids } => {
                batch.flush(&mut insert)?;
                if !ids.is_empty() {
                    delete(seq, &ids)?;
                }
            }
        }
        before = before.max(seq_i);
    }
    batch.flush(&mut insert)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::super::LogOp;
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn replay_batches_inserts_and_ends_at_the_highest_number() {
        let ops = vec![
            LogOp::Insert {
                seq: 5,
                ids: vec![1, 2],
                vectors: vec![1.0, 2.0],
            },
            LogOp::Insert {
                seq: 4,
                ids: vec![3],
                vectors: vec![3.0],
            },
            LogOp::Insert {
                seq: 6,
                ids: vec![1],
                vectors: vec![10.0],
            },
            LogOp::Delete {
                seq: 7,
                ids: vec![2],
            },
            LogOp::Insert {
                seq: 8,
                ids: vec![],
                vectors: vec![],
            },
        ];
        let mut calls = Vec::new();
        let log = std::cell::RefCell::new(&mut calls);
        let r = replay(
            ops,
            3,
            |s, ids, v| {
                log.borrow_mut().push(format!("ins {s} {ids:?} {v:?}"));
                Ok(())
            },
            |s, ids| {
                log.borrow_mut().push(format!("del {s} {ids:?}"));
                Ok(())
            },
        )
        .unwrap();
        assert_eq!(
            r,
            Replayed {
                calls: 5,
                watermark: 8
            }
        );
        assert_eq!(
            calls,
            [
                "ins 5 [1, 2, 3] [1.0, 2.0, 3.0]",
                "ins 6 [1] [10.0]",
                "del 7 [2]",
            ]
        );
    }

    /// An engine's per-id rule: an insert or delete applies only if it is
    /// newer than what the id holds (a delete leaves its number behind).
    #[derive(Default, Debug, PartialEq)]
    struct SeqModel(BTreeMap<u64, (Seq, Option<f32>)>);

    impl SeqModel {
        /// What a search or `get` sees: the live points' values (a batch
        /// may stamp rows with a higher number than their own; what the
        /// rule decides must not change).
        fn live(&self) -> BTreeMap<u64, f32> {
            self.0
                .iter()
                .filter_map(|(&id, &(_, v))| Some((id, v?)))
                .collect()
        }
        fn insert(&mut self, seq: Seq, ids: &[u64], v: &[f32]) {
            for (i, &id) in ids.iter().enumerate() {
                if self.0.get(&id).is_none_or(|e| seq > e.0) {
                    self.0.insert(id, (seq, Some(v[i])));
                }
            }
        }
        fn delete(&mut self, seq: Seq, ids: &[u64]) {
            for &id in ids {
                if self.0.get(&id).is_some_and(|e| seq >= e.0) {
                    self.0.insert(id, (seq, None));
                }
            }
        }
        /// The model after a (batched) replay of `ops`.
        fn replayed(ops: Vec<LogOp>) -> SeqModel {
            let m = std::cell::RefCell::new(SeqModel::default());
            replay(
                ops,
                0,
                |s, i, v| {
                    m.borrow_mut().insert(s, i, v);
                    Ok(())
                },
                |s, i| {
                    m.borrow_mut().delete(s, i);
                    Ok(())
                },
            )
            .unwrap();
            m.into_inner()
        }
    }

    #[test]
    fn a_later_call_numbered_below_a_batch_is_not_shadowed() {
        // Logged in lock order: 3 (A), 7 (B), then the delete of A numbered 5.
        let ops = vec![
            LogOp::Insert {
                seq: 3,
                ids: vec![1],
                vectors: vec![1.0],
            },
            LogOp::Insert {
                seq: 7,
                ids: vec![2],
                vectors: vec![2.0],
            },
            LogOp::Delete {
                seq: 5,
                ids: vec![1],
            },
        ];
        assert_eq!(
            SeqModel::replayed(ops).0.get(&1),
            Some(&(5, None)),
            "the delete was skipped"
        );
    }

    proptest::proptest! {
        /// Calls logged out of sequence order: batched replay leaves what
        /// applying them one by one leaves, under the engines' rule.
        #[test]
        fn batching_respects_the_engines_sequence_rule(
            calls in proptest::collection::vec((proptest::bool::ANY, proptest::collection::vec(0u64..8, 0..4)), 1..30),
            order in proptest::collection::vec(proptest::num::u64::ANY, 30),
        ) {
            // Distinct sequence numbers in a drawn order.
            let mut seqs: Vec<Seq> = (1..=calls.len() as Seq).collect();
            seqs.sort_by_key(|s| order[*s as usize - 1]);
            let mut ops = Vec::new();
            for ((ins, ids), &seq) in calls.into_iter().zip(&seqs) {
                let mut ids = ids;
                ids.sort_unstable();
                ids.dedup();
                ops.push(if ins {
                    LogOp::Insert { seq, vectors: vec![seq as f32; ids.len()], ids }
                } else {
                    LogOp::Delete { seq, ids }
                });
            }
            let mut want = SeqModel::default();
            for op in &ops {
                match op {
                    LogOp::Insert { seq, ids, vectors } => want.insert(*seq, ids, vectors),
                    LogOp::Delete { seq, ids } => want.delete(*seq, ids),
                }
            }
            proptest::prop_assert_eq!(SeqModel::replayed(ops).live(), want.live());
        }

        /// Batched or not, the state a replay leaves is that of applying
        /// the calls one by one.
        #[test]
        fn batching_changes_nothing(calls in proptest::collection::vec((proptest::bool::ANY, proptest::collection::vec(0u64..20, 0..6)), 0..40)) {
            let mut ops = Vec::new();
            let mut want: BTreeMap<u64, f32> = BTreeMap::new();
            for (i, (ins, ids)) in calls.into_iter().enumerate() {
                let seq = i as Seq + 1;
                if ins {
                    let mut ids = ids;
                    ids.sort_unstable();
                    ids.dedup();
                    for &id in &ids { want.insert(id, seq as f32); }
                    ops.push(LogOp::Insert { seq, vectors: vec![seq as f32; ids.len()], ids });
                } else {
                    for id in &ids { want.remove(id); }
                    ops.push(LogOp::Delete { seq, ids });
                }
            }
            let got = std::cell::RefCell::new(BTreeMap::new());
            replay(ops, 0, |_, ids, v| { for (i, &id) in ids.iter().enumerate() { got.borrow_mut().insert(id, v[i]); } Ok(()) },
                |_, ids| { for id in ids { got.borrow_mut().remove(id); } Ok(()) }).unwrap();
            proptest::prop_assert_eq!(got.into_inner(), want);
        }
    }
}
