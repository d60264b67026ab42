//! Applying a logged operation to a collection's spaces: on the commit
//! path (every space, the rows already checked) and at a replay (each space
//! from its own durable point).

use crate::error::Result;
use crate::record::{Op, OP_DELETE, OP_UPSERT};
use crate::spaces::{DenseSpace, SparseSpace};
use std::sync::atomic::Ordering;
use vectide_core::validate::Checked;
use vectide_core::Seq;

/// Where each space holds operations through, at a replay: an operation is
/// applied to the spaces it is due in.
pub(crate) struct Durable {
    pub dense: Vec<Seq>,
    pub sparse: Vec<Seq>,
}

/// Applies `op` to the spaces (all of them on the commit path, `replay`
/// `None`; at a replay, those whose durable point it is due past).
///
/// A multi upsert may reach a dense engine twice under one sequence number
/// (the removal of the vectors its points no longer carry there, then the
/// insert): an engine durable per call (`keeps_itself`) whose durable point
/// equals the record's may have taken only the first, so such a record is
/// applied to it again at a replay. Both halves are idempotent per point.
pub(crate) fn apply(
    dense: &[DenseSpace],
    sparse: &[SparseSpace],
    op: &Op,
    replay: Option<&Durable>,
) -> Result<()> {
    let due_dense = |i: usize, d: &DenseSpace| {
        replay.is_none_or(|r| {
            op.seq > r.dense[i] || (op.seq == r.dense[i] && d.engine.keeps_itself())
        })
    };
    let due_sparse = |j: usize| replay.is_none_or(|r| op.seq > r.sparse[j]);
    let Some(rows) = &op.spaces else {
        // The single form's upsert, or any delete or payload update.
        for (i, d) in dense.iter().enumerate() {
            if !due_dense(i, d) {
                continue;
            }
            match op.kind {
                OP_UPSERT if replay.is_none() => {
                    let (dim, metric) = (d.engine.dim(), d.engine.metric());
                    let batch = Checked::validated_by_caller(dim, metric, &op.ids, &op.vectors);
                    d.engine.insert_checked(op.seq, batch)?;
                }
                OP_UPSERT => d.engine.insert(op.seq, &op.ids, &op.vectors)?,
                OP_DELETE => {
                    d.engine.delete(op.seq, &op.ids)?;
                }
                _ => continue,
            }
            d.engine_seq.store(op.seq, Ordering::Release);
        }
        if op.kind == OP_DELETE {
            for (j, s) in sparse.iter().enumerate() {
                if due_sparse(j) {
                    let mut x = s.index.write();
                    for &id in &op.ids {
                        x.delete(op.seq, id);
                    }
                }
            }
        }
        return Ok(());
    };
    for (i, (d, r)) in dense.iter().zip(&rows.dense).enumerate() {
        if !due_dense(i, d) {
            continue;
        }
        let mut touched = false;
        if !r.absent.is_empty() {
            let gone: Vec<u64> = r
                .absent
                .iter()
                .copied()
                .filter(|&id| d.engine.contains(id).unwrap_or(true))
                .collect();
            if !gone.is_empty() {
                d.engine.delete(op.seq, &gone)?;
                touched = true;
            }
        }
        if !r.ids.is_empty() {
            if replay.is_none() {
                let (dim, metric) = (d.engine.dim(), d.engine.metric());
                let batch = Checked::validated_by_caller(dim, metric, &r.ids, &r.vectors);
                d.engine.insert_checked(op.seq, batch)?;
            } else {
                d.engine.insert(op.seq, &r.ids, &r.vectors)?;
            }
            touched = true;
        }
        if touched {
            d.engine_seq.store(op.seq, Ordering::Release);
        }
    }
    for (j, (s, r)) in sparse.iter().zip(&rows.sparse).enumerate() {
        if !due_sparse(j) {
            continue;
        }
        let mut x = s.index.write();
        for &id in &r.absent {
            if x.contains(id) {
                x.delete(op.seq, id);
            }
        }
        for (id, v) in &r.rows {
            x.upsert(op.seq, *id, v.clone());
        }
    }
    Ok(())
}
