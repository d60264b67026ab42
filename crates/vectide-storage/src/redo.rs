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

use crate::wal::Wal;
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

/// The rows `rows` of a batch (`ids`, `vectors` of `dim`), copied out;
/// the whole batch when `rows` is every row.
pub fn select_rows(
    dim: usize,
    ids: &[u64],
    vectors: &[f32],
    rows: &[usize],
) -> (Vec<u64>, Vec<f32>) {
    if rows.len() == ids.len() {
        return (ids.to_vec(), vectors.to_vec());
    }
    (
        rows.iter().map(|&i| ids[i]).collect(),
        rows.iter()
            .flat_map(|&i| &vectors[i * dim..(i + 1) * dim])
            .copied()
            .collect(),
    )
}

/// Logs an insert call of `ids` (vectors of `dim`) into `wal` and syncs
/// it: as many records as [`rows_per_record`] needs, or one record of the
/// sequence number alone when no row is left (so that the watermark after
/// a recovery covers the call too).
pub fn log_insert(
    wal: &mut Wal,
    seq: u64,
    ids: &[u64],
    vectors: &[f32],
    dim: usize,
    buf: &mut Vec<u8>,
) -> Result<()> {
    if ids.is_empty() {
        return log_delete(wal, seq, &[], buf);
    }
    let per = rows_per_record(dim);
    for (ci, c) in ids.chunks(per).enumerate() {
        encode_insert(seq, c, &vectors[ci * per * dim..][..c.len() * dim], buf);
        wal.append(buf)?;
    }
    wal.sync()
}

/// Logs a delete call of `ids` into `wal` and syncs it (a delete of
/// nothing is one record of the sequence number alone).
pub fn log_delete(wal: &mut Wal, seq: u64, ids: &[u64], buf: &mut Vec<u8>) -> Result<()> {
    for c in ids.chunks(rows_per_record(0)) {
        encode_delete(seq, c, buf);
        wal.append(buf)?;
    }
    if ids.is_empty() {
        encode_delete(seq, &[], buf);
        wal.append(buf)?;
    }
    wal.sync()
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
    fn calls_are_logged_in_records_and_synced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.log");
        let (mut wal, _) = Wal::open(&path).unwrap();
        let mut buf = Vec::new();
        let dim = 3 << 20; // one row per record
        let vecs = vec![0.25f32; 3 * dim];
        let (ids, v) = select_rows(dim, &[7, 8, 9], &vecs, &[0, 2]);
        assert_eq!((ids.as_slice(), v.len()), (&[7u64, 9][..], 2 * dim));
        log_insert(&mut wal, 4, &ids, &v, dim, &mut buf).unwrap();
        log_insert(&mut wal, 5, &[], &[], dim, &mut buf).unwrap();
        log_delete(&mut wal, 6, &[7], &mut buf).unwrap();
        assert_eq!(wal.unsynced(), 0);
        drop(wal);
        let (_, recs) = Wal::open(&path).unwrap();
        let ops: Vec<LogOp> = recs.iter().map(|r| decode_op(r, dim).unwrap()).collect();
        assert_eq!(
            ops.len(),
            4,
            "two rows in two records, a seq-only record, a delete"
        );
        assert!(matches!(&ops[1], LogOp::Insert { seq: 4, ids, .. } if ids == &[9]));
        assert_eq!(
            ops[2],
            LogOp::Delete {
                seq: 5,
                ids: vec![]
            }
        );
        assert_eq!(
            ops[3],
            LogOp::Delete {
                seq: 6,
                ids: vec![7]
            }
        );
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
