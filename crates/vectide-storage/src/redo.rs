//! Redo records of the engine contract's two mutating calls, shared by the
//! engines that keep a redo log of their own (`fresh-diskann`, `spfresh`):
//! an insert batch (ids and vectors) or a delete batch, each with the
//! caller's sequence number, as the payload of one [`crate::wal`] frame.
//!
//! Payload: `op u8 (1 insert, 2 delete) ‖ seq u64 ‖ n u32 ‖ ids u64×n ‖
//! (insert only) vectors f32×n×dim`, little-endian. A call larger than
//! [`rows_per_record`] rows takes several records with the same sequence
//! number; a call that changes nothing is still logged (with no rows), so
//! that the watermark after a recovery covers it.

use vectide_core::io::ByteReader;
use vectide_core::{Error, Result};

/// One redo-log record: an insert batch or a delete batch with its
/// sequence number.
#[derive(Debug, Clone, PartialEq)]
pub enum LogOp {
    Insert {
        seq: u64,
        ids: Vec<u64>,
        vectors: Vec<f32>,
    },
    Delete {
        seq: u64,
        ids: Vec<u64>,
    },
}

const OP_INSERT: u8 = 1;
const OP_DELETE: u8 = 2;

/// Rows per record, so that a record stays far below the WAL's bound.
pub fn rows_per_record(dim: usize) -> usize {
    ((16usize << 20) / (8 + 4 * dim)).max(1)
}

/// Appends the payload of an insert record of `ids` (vectors `ids × dim`).
pub fn encode_insert(seq: u64, ids: &[u64], vectors: &[f32], out: &mut Vec<u8>) {
    out.clear();
    out.push(OP_INSERT);
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(&(ids.len() as u32).to_le_bytes());
    for id in ids {
        out.extend_from_slice(&id.to_le_bytes());
    }
    for x in vectors {
        out.extend_from_slice(&x.to_le_bytes());
    }
}

/// Appends the payload of a delete record.
pub fn encode_delete(seq: u64, ids: &[u64], out: &mut Vec<u8>) {
    out.clear();
    out.push(OP_DELETE);
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(&(ids.len() as u32).to_le_bytes());
    for id in ids {
        out.extend_from_slice(&id.to_le_bytes());
    }
}

/// Parses a record payload for an index of `dim`.
pub fn decode_op(payload: &[u8], dim: usize) -> Result<LogOp> {
    let mut r = ByteReader::new(payload);
    let op = r.u8()?;
    let seq = r.u64()?;
    let n = r.u32()? as usize;
    let each = 8 + if op == OP_INSERT { 4 * dim } else { 0 };
    if n > r.remaining() / each {
        return Err(Error::corrupted("redo record: more rows than bytes"));
    }
    let ids = (0..n).map(|_| r.u64()).collect::<Result<Vec<_>>>()?;
    let out = match op {
        OP_INSERT => {
            let mut vectors = Vec::with_capacity(n * dim);
            r.f32s(n * dim, &mut vectors)?;
            if vectors.iter().any(|x| !x.is_finite()) {
                return Err(Error::corrupted("redo record: a non-finite component"));
            }
            LogOp::Insert { seq, ids, vectors }
        }
        OP_DELETE => LogOp::Delete { seq, ids },
        t => {
            return Err(Error::corrupted(format!(
                "redo record: unknown operation {t}"
            )))
        }
    };
    if r.remaining() != 0 {
        return Err(Error::corrupted("redo record: bytes after the last row"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn records_round_trip_and_bad_ops_are_errors() {
        let mut b = Vec::new();
        encode_insert(5, &[1, 2], &[0.5; 6], &mut b);
        assert_eq!(
            decode_op(&b, 3).unwrap(),
            LogOp::Insert {
                seq: 5,
                ids: vec![1, 2],
                vectors: vec![0.5; 6]
            }
        );
        encode_delete(6, &[9], &mut b);
        assert_eq!(
            decode_op(&b, 3).unwrap(),
            LogOp::Delete {
                seq: 6,
                ids: vec![9]
            }
        );
        b[0] = 7;
        assert!(decode_op(&b, 3).is_err());
    }

    #[test]
    fn truncated_or_padded_records_are_errors() {
        let mut b = Vec::new();
        encode_insert(5, &[1, 2], &[0.5; 6], &mut b);
        for cut in 0..b.len() {
            assert!(decode_op(&b[..cut], 3).is_err(), "cut at {cut}");
        }
        b.push(0);
        assert!(decode_op(&b, 3).is_err());
        let mut nan = Vec::new();
        encode_insert(5, &[1], &[f32::NAN, 0.0, 0.0], &mut nan);
        assert!(decode_op(&nan, 3).is_err());
    }

    proptest! {
        #[test]
        fn the_parser_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..400), dim in 1usize..64) {
            let _ = decode_op(&bytes, dim);
        }
    }
}
