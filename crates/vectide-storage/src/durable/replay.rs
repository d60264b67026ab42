//! Recovery by replay: the calls a log holds past an engine's checkpoint,
//! applied in log order. Consecutive inserts go to the engine as one batch
//! (one call per logged call dominated restart time); a batch ends at a
//! delete, at an id it already holds, or at [`BATCH_ROWS`] rows, and
//! carries the highest sequence number of its calls, which is harmless:
//! each point is applied once, and nothing is acknowledged until the
//! replay is over.

use std::collections::HashSet;
use vectide_core::{Result, Seq};

/// Rows after which a batch of replayed inserts is applied.
pub const BATCH_ROWS: usize = 4096;

/// Gathers replayed inserts into batches (see the module docs).
#[derive(Debug, Default)]
pub struct Batcher {
    seq: Seq,
    ids: Vec<u64>,
    vectors: Vec<f32>,
    seen: HashSet<u64>,
}

impl Batcher {
    /// Adds an insert call; `apply` receives the batch when it is full or
    /// when this call repeats one of its ids (then the call starts the next
    /// batch).
    pub fn insert(
        &mut self,
        seq: Seq,
        ids: &[u64],
        vectors: &[f32],
        apply: &mut impl FnMut(Seq, &[u64], &[f32]) -> Result<()>,
    ) -> Result<()> {
        if ids.iter().any(|i| self.seen.contains(i)) {
            self.flush(apply)?;
        }
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
    let mut batch = Batcher::default();
    for op in ops {
        out.calls += 1;
        out.watermark = out.watermark.max(op.seq());
        match op {
            super::LogOp::Insert { seq, ids, vectors } => {
                if !ids.is_empty() {
                    batch.insert(seq, &ids, &vectors, &mut insert)?;
                }
            }
            super::LogOp::Delete { seq, ids } => {
                batch.flush(&mut insert)?;
                if !ids.is_empty() {
                    delete(seq, &ids)?;
                }
            }
        }
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

    proptest::proptest! {
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
