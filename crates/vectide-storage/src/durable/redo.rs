//! The redo log of a durable engine: each insert or delete call becomes
//! one [`record`](super::record) in a [`Wal`] frame, or, when it outgrows
//! a frame, several frames of which all but the last carry
//! [`CONTINUES`](super::record::CONTINUES). Recovery ([`read_calls`])
//! returns whole calls only: the frames of a call whose last frame never
//! reached the disk were never acknowledged and are dropped; [`RedoLog::open`]
//! then appends an [`Abandon`](Kind::Abandon) record, so that a later call
//! that reuses the cut call's sequence number is not joined to its frames.
//!
//! Used by `fresh-diskann` and `spfresh` (standalone; under the database
//! its commit log is the only log) and by the `hnsw-wal` baseline.

use super::record::{self, Kind};
use crate::wal::{Pending, Wal, MAX_RECORD};
use std::path::Path;
use vectide_core::poison::Poison;
use vectide_core::{Error, Result, Seq};

/// One logged call.
#[derive(Debug, Clone, PartialEq)]
pub enum LogOp {
    Insert {
        seq: Seq,
        ids: Vec<u64>,
        vectors: Vec<f32>,
    },
    Delete {
        seq: Seq,
        ids: Vec<u64>,
    },
}

impl LogOp {
    /// The call's sequence number.
    pub fn seq(&self) -> Seq {
        match self {
            LogOp::Insert { seq, .. } | LogOp::Delete { seq, .. } => *seq,
        }
    }
}

/// What a log held: its whole calls in log order, and whether it ended in
/// a call cut short.
#[derive(Debug, Default)]
pub struct Recovered {
    pub ops: Vec<LogOp>,
    pub torn: bool,
}

/// The whole calls of a redo log's frames (see the module docs). A frame
/// that is not a record of an engine's log is [`Error::Corrupted`], named
/// by its index.
pub fn read_calls(frames: &[Vec<u8>], dim: usize) -> Result<Recovered> {
    let mut ops = Vec::new();
    let mut open: Option<LogOp> = None;
    for (k, frame) in frames.iter().enumerate() {
        let rec = record::decode(frame, dim)
            .map_err(|e| Error::corrupted(format!("redo record {k}: {e}")))?;
        if !rec.tail.is_empty() {
            return Err(Error::corrupted(format!(
                "redo record {k}: bytes after the last row"
            )));
        }
        // Frames of another call whose last frame never made it: a crash
        // cut it, and the log went on after the restart.
        if open.as_ref().is_some_and(|o| {
            o.seq() != rec.seq || matches!(o, LogOp::Insert { .. }) != (rec.kind == Kind::Insert)
        }) {
            open = None;
        }
        match rec.kind {
            Kind::Abandon => {
                open = None;
                continue;
            }
            Kind::Annotate => {
                return Err(Error::corrupted(format!(
                    "redo record {k}: a payload update in an engine's log"
                )))
            }
            Kind::Insert => match &mut open {
                Some(LogOp::Insert { ids, vectors, .. }) => {
                    ids.extend_from_slice(&rec.ids);
                    vectors.extend_from_slice(&rec.vectors);
                }
                _ => {
                    open = Some(LogOp::Insert {
                        seq: rec.seq,
                        ids: rec.ids,
                        vectors: rec.vectors,
                    })
                }
            },
            Kind::Delete => match &mut open {
                Some(LogOp::Delete { ids, .. }) => ids.extend_from_slice(&rec.ids),
                _ => {
                    open = Some(LogOp::Delete {
                        seq: rec.seq,
                        ids: rec.ids,
                    })
                }
            },
        }
        if !rec.continues {
            ops.extend(open.take());
        }
    }
    Ok(Recovered {
        ops,
        torn: open.is_some(),
    })
}

/// What `vectide inspect` says of a redo log, read without changing it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogSummary {
    /// Whole calls.
    pub calls: usize,
    /// The file's length.
    pub bytes: usize,
    /// The file ends in bytes that are not a valid frame (a torn tail,
    /// which the next open cuts) or in a call cut short.
    pub torn: bool,
}

/// Reads the redo log at `path` (of an index of dimension `dim`) and
/// checks every record, without opening it for writing.
pub fn summarize(path: &Path, dim: usize) -> Result<LogSummary> {
    let bytes = std::fs::read(path).map_err(|e| Error::io_at(path, e))?;
    let scan = crate::wal::scan(path, &bytes)?;
    let frames: Vec<Vec<u8>> = scan.payloads(&bytes).map(<[u8]>::to_vec).collect();
    let rec = read_calls(&frames, dim).map_err(|e| match e {
        Error::Corrupted(m) => Error::corrupted(format!("{}: {m}", path.display())),
        e => e,
    })?;
    Ok(LogSummary {
        calls: rec.ops.len(),
        bytes: bytes.len(),
        torn: rec.torn || scan.bad.is_some(),
    })
}

/// The rows `rows` of a batch (`ids`, `vectors` of `dim`), copied out; the
/// whole batch when `rows` is every row.
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

/// A redo log: a [`Wal`] and the codec of its calls.
#[derive(Debug)]
pub struct RedoLog {
    wal: Wal,
    dim: usize,
    max_frame: usize,
    buf: Vec<u8>,
}

impl RedoLog {
    /// A redo log over an open WAL of an index of dimension `dim`.
    pub fn new(wal: Wal, dim: usize) -> Self {
        RedoLog {
            wal,
            dim,
            max_frame: MAX_RECORD / 4,
            buf: Vec::new(),
        }
    }

    /// Opens (or creates) the log at `path` and reads its whole calls; a
    /// call cut short is abandoned in the log itself (an
    /// [`Abandon`](Kind::Abandon) record, synced). Errors name the file.
    pub fn open(path: &Path, dim: usize) -> Result<(RedoLog, Recovered)> {
        let (wal, frames) = Wal::open(path)?;
        let rec = read_calls(&frames, dim).map_err(|e| match e {
            Error::Corrupted(m) => Error::corrupted(format!("{}: {m}", path.display())),
            e => e,
        })?;
        let mut log = RedoLog::new(wal, dim);
        if rec.torn {
            log.buf.clear();
            record::encode(&mut log.buf, Kind::Abandon, 0, false, &[], &[]);
            log.wal.append(&log.buf)?;
            log.wal.sync()?;
        }
        Ok((log, rec))
    }

    /// Frames no larger than `bytes` (tests: calls that span frames).
    pub fn with_max_frame(mut self, bytes: usize) -> Self {
        self.max_frame = bytes.clamp(record::HEAD + 8, MAX_RECORD);
        self
    }

    fn append_call(&mut self, kind: Kind, seq: Seq, ids: &[u64], vectors: &[f32]) -> Result<()> {
        let vdim = if kind == Kind::Insert { self.dim } else { 0 };
        debug_assert_eq!(vectors.len(), ids.len() * vdim);
        let per = record::rows_per_frame(kind, self.dim, self.max_frame);
        let frames = ids.len().div_ceil(per).max(1);
        for f in 0..frames {
            let rows = f * per..((f + 1) * per).min(ids.len());
            self.buf.clear();
            record::encode(
                &mut self.buf,
                kind,
                seq,
                f + 1 < frames,
                &ids[rows.clone()],
                &vectors[rows.start * vdim..rows.end * vdim],
            );
            self.wal.append(&self.buf)?;
        }
        Ok(())
    }

    /// Appends an insert call (not yet durable: see [`RedoLog::sync`]). A
    /// call of no rows is logged too, so that the watermark after a
    /// recovery covers it.
    pub fn append_insert(&mut self, seq: Seq, ids: &[u64], vectors: &[f32]) -> Result<()> {
        self.append_call(Kind::Insert, seq, ids, vectors)
    }

    /// Appends a delete call (not yet durable).
    pub fn append_delete(&mut self, seq: Seq, ids: &[u64]) -> Result<()> {
        self.append_call(Kind::Delete, seq, ids, &[])
    }

    /// Appends an insert call and writes it to the file; it is durable
    /// once the returned [`Pending`] is waited on (outside the caller's
    /// writer lock, so that concurrent writers share one `fdatasync`:
    /// `wal.rs`, "Group commit").
    pub fn write_insert(&mut self, seq: Seq, ids: &[u64], vectors: &[f32]) -> Result<Pending> {
        self.append_insert(seq, ids, vectors)?;
        self.wal.pending()
    }

    /// Appends a delete call and writes it to the file (see
    /// [`RedoLog::write_insert`]).
    pub fn write_delete(&mut self, seq: Seq, ids: &[u64]) -> Result<Pending> {
        self.append_delete(seq, ids)?;
        self.wal.pending()
    }

    /// Writes every appended call to the file and returns the ticket that
    /// makes them durable (shared with the writers' group commit), without
    /// waiting for it.
    pub fn pending(&mut self) -> Result<Pending> {
        self.wal.pending()
    }

    /// Makes every appended call durable.
    pub fn sync(&mut self) -> Result<()> {
        self.wal.sync()
    }

    /// The WAL underneath (its length, its sync count, its truncation).
    pub fn wal(&self) -> &Wal {
        &self.wal
    }

    /// See [`RedoLog::wal`].
    pub fn wal_mut(&mut self) -> &mut Wal {
        &mut self.wal
    }
}

/// Waits for a logged write's sync ([`RedoLog::write_insert`]; `None`
/// when the caller's log holds the write). A failure poisons the engine:
/// the write is applied and may be missing from its log.
pub fn await_sync(pending: Option<Pending>, poison: &Poison, seq: Seq) -> Result<()> {
    match pending {
        Some(p) => p
            .wait()
            .map_err(|e| poison.poison(&format!("the sync of write {seq}"), &e)),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ins(seq: Seq, ids: &[u64], dim: usize) -> LogOp {
        LogOp::Insert {
            seq,
            ids: ids.to_vec(),
            vectors: ids.iter().flat_map(|&i| vec![i as f32; dim]).collect(),
        }
    }

    #[test]
    fn calls_span_frames_and_come_back_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("redo.log");
        let dim = 4;
        let (log, rec) = RedoLog::open(&path, dim).unwrap();
        assert!(rec.ops.is_empty() && !rec.torn);
        // Three rows of an insert per frame.
        let mut log = log.with_max_frame(record::HEAD + 3 * (8 + 16));
        let big: Vec<u64> = (0..10).collect();
        let LogOp::Insert { vectors, .. } = ins(1, &big, dim) else {
            unreachable!()
        };
        log.write_insert(1, &big, &vectors).unwrap().wait().unwrap();
        log.write_insert(2, &[], &[]).unwrap().wait().unwrap();
        log.write_delete(3, &[4, 5]).unwrap().wait().unwrap();
        drop(log);
        assert_eq!(Wal::open(&path).unwrap().1.len(), 4 + 1 + 1, "frames");
        let (_, rec) = RedoLog::open(&path, dim).unwrap();
        assert!(!rec.torn);
        assert_eq!(
            rec.ops,
            vec![
                ins(1, &big, dim),
                ins(2, &[], dim),
                LogOp::Delete {
                    seq: 3,
                    ids: vec![4, 5]
                }
            ]
        );
    }

    #[test]
    fn a_cut_call_is_dropped_and_abandoned_so_a_retry_is_not_joined_to_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("redo.log");
        let dim = 2;
        let frame = |kind, seq, cont, ids: &[u64]| {
            let mut b = Vec::new();
            let v: Vec<f32> = if kind == Kind::Insert {
                vec![1.0; ids.len() * dim]
            } else {
                vec![]
            };
            record::encode(&mut b, kind, seq, cont, ids, &v);
            b
        };
        {
            let (wal, _) = Wal::open(&path).unwrap();
            let mut log = RedoLog::new(wal, dim);
            log.write_insert(1, &[1], &[1.0; 2])
                .unwrap()
                .wait()
                .unwrap();
            // The first frame of call 2, whose second never came.
            log.wal_mut()
                .append(&frame(Kind::Insert, 2, true, &[2]))
                .unwrap();
            log.sync().unwrap();
        }
        let (mut log, rec) = RedoLog::open(&path, dim).unwrap();
        assert!(rec.torn);
        assert_eq!(rec.ops, vec![ins(1, &[1], dim)]);
        let sum = summarize(&path, dim).unwrap();
        assert_eq!(
            (sum.calls, sum.torn),
            (1, false),
            "the abandon record closed the cut call"
        );
        // The retry of call 2 reuses its number; it must come back alone.
        log.write_insert(2, &[3], &[1.0; 2])
            .unwrap()
            .wait()
            .unwrap();
        drop(log);
        let (_, rec) = RedoLog::open(&path, dim).unwrap();
        assert!(!rec.torn);
        assert_eq!(rec.ops.len(), 2);
        assert!(matches!(&rec.ops[1], LogOp::Insert { seq: 2, ids, .. } if ids == &[3]));
        // Without the abandon record, frames of a cut call give way to a
        // different call.
        let frames = vec![
            frame(Kind::Insert, 5, true, &[1]),
            frame(Kind::Delete, 6, false, &[1]),
        ];
        let rec = read_calls(&frames, dim).unwrap();
        assert_eq!((rec.ops.len(), rec.torn), (1, false));
        // A payload update or a tail is not an engine's record.
        let mut bad = frame(Kind::Delete, 7, false, &[1]);
        bad.push(0);
        assert!(read_calls(&[bad], dim).is_err());
        assert!(read_calls(&[frame(Kind::Annotate, 7, false, &[1])], dim).is_err());
    }

    proptest! {
        /// Fuzz of the call parser: frames of valid calls, then a bit flip,
        /// a cut or random bytes in one of them: an error or whole calls of
        /// the right shape, never a panic.
        #[test]
        fn mutated_frames_never_panic(which in 0usize..4, how in 0u8..3, at in any::<usize>(), bit in 0u8..8, junk in proptest::collection::vec(any::<u8>(), 0..64)) {
            let dim = 3;
            let mut frames = Vec::new();
            let mut b = Vec::new();
            record::encode(&mut b, Kind::Insert, 4, true, &[1, 2], &[0.5; 6]);
            frames.push(b.clone());
            b.clear();
            record::encode(&mut b, Kind::Insert, 4, false, &[3], &[0.5; 3]);
            frames.push(b.clone());
            b.clear();
            record::encode(&mut b, Kind::Delete, 5, false, &[1], &[]);
            frames.push(b.clone());
            b.clear();
            record::encode(&mut b, Kind::Abandon, 0, false, &[], &[]);
            frames.push(b);
            let f = &mut frames[which];
            match how {
                0 => { let i = at % f.len(); f[i] ^= 1 << bit; }
                1 => { let n = at % f.len(); f.truncate(n); }
                _ => *f = junk,
            }
            if let Ok(rec) = read_calls(&frames, dim) {
                for op in rec.ops {
                    if let LogOp::Insert { ids, vectors, .. } = op {
                        prop_assert_eq!(vectors.len(), ids.len() * dim);
                    }
                }
            }
        }

        /// Any sequence of calls, any frame size: what is read back is the
        /// calls, in order.
        #[test]
        fn calls_round_trip(calls in proptest::collection::vec((any::<bool>(), 0usize..7), 0..12), max_rows in 1usize..4) {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("redo.log");
            let dim = 3;
            let (log, _) = RedoLog::open(&path, dim).unwrap();
            let mut log = log.with_max_frame(record::HEAD + max_rows * (8 + 4 * dim));
            let mut want = Vec::new();
            for (i, &(insert, n)) in calls.iter().enumerate() {
                let ids: Vec<u64> = (0..n as u64).map(|j| 100 * i as u64 + j).collect();
                let seq = i as Seq + 1;
                if insert {
                    let op = ins(seq, &ids, dim);
                    if let LogOp::Insert { vectors, .. } = &op { log.append_insert(seq, &ids, vectors).unwrap(); }
                    want.push(op);
                } else {
                    log.append_delete(seq, &ids).unwrap();
                    want.push(LogOp::Delete { seq, ids });
                }
            }
            log.sync().unwrap();
            drop(log);
            let (_, rec) = RedoLog::open(&path, dim).unwrap();
            prop_assert!(!rec.torn);
            prop_assert_eq!(rec.ops, want);
        }
    }
}
