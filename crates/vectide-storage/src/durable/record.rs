//! The one record codec of Vectide's logs (`docs/format-wal.md`,
//! "Records"). Every frame of a durable engine's redo log, of a P-HNSW
//! baseline's log and of the database's commit log holds one record:
//!
//! ```text
//! kind u8 ‖ seq u64 ‖ n u32 ‖ ids u64 × n ‖ (insert) vectors f32 × n × dim ‖ tail
//! ```
//!
//! `kind`'s low seven bits say what the record does ([`Kind`]); its top bit
//! ([`CONTINUES`]) marks every frame of a call but its last, when a call
//! outgrows one frame. The `tail` is the rest of the frame, opaque here:
//! empty in engines' logs; the database keeps each point's external id and
//! payload there. Everything is little-endian and read back through the
//! bounds-checked [`ByteReader`].

use vectide_core::io::ByteReader;
use vectide_core::{Error, Result, Seq};

/// What a record does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Insert or replace the points `ids` with `vectors`.
    Insert = 1,
    /// Delete the points `ids`.
    Delete = 2,
    /// Change something of the points `ids` other than their vectors (the
    /// database's payload updates; engines never see it).
    Annotate = 3,
    /// The call whose frames precede this one never completed (a crash cut
    /// it): drop them. Written by [`crate::durable::RedoLog::open`].
    Abandon = 4,
}

impl Kind {
    fn from_code(c: u8) -> Result<Kind> {
        Ok(match c {
            1 => Kind::Insert,
            2 => Kind::Delete,
            3 => Kind::Annotate,
            4 => Kind::Abandon,
            t => return Err(Error::corrupted(format!("log record of unknown kind {t}"))),
        })
    }
}

/// Set on the kind byte of every frame of a call but its last.
pub const CONTINUES: u8 = 0x80;
/// Bytes before the ids: kind, sequence number, row count.
pub const HEAD: usize = 13;

/// A decoded record; `tail` borrows the frame.
#[derive(Debug, Clone, PartialEq)]
pub struct Record<'a> {
    pub kind: Kind,
    pub seq: Seq,
    /// More frames of the same call follow.
    pub continues: bool,
    pub ids: Vec<u64>,
    /// `ids.len() × dim` components for an insert; empty otherwise.
    pub vectors: Vec<f32>,
    pub tail: &'a [u8],
}

/// Appends a record's head, ids and (for an insert) vectors to `out`; the
/// caller appends the tail, if any, after it.
pub fn encode(
    out: &mut Vec<u8>,
    kind: Kind,
    seq: Seq,
    continues: bool,
    ids: &[u64],
    vectors: &[f32],
) {
    debug_assert!(kind == Kind::Insert || vectors.is_empty());
    out.reserve(HEAD + 8 * ids.len() + 4 * vectors.len());
    out.push(kind as u8 | if continues { CONTINUES } else { 0 });
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(&(ids.len() as u32).to_le_bytes());
    for id in ids {
        out.extend_from_slice(&id.to_le_bytes());
    }
    for x in vectors {
        out.extend_from_slice(&x.to_le_bytes());
    }
}

/// Reads a record of an index of dimension `dim`: the kind must be known,
/// the rows must fit, an insert's components must be finite.
pub fn decode(frame: &[u8], dim: usize) -> Result<Record<'_>> {
    let mut r = ByteReader::new(frame);
    let byte = r.u8()?;
    let kind = Kind::from_code(byte & !CONTINUES)?;
    let seq = r.u64()?;
    let n = r.u32()? as usize;
    let each = 8 + if kind == Kind::Insert { 4 * dim } else { 0 };
    if n > r.remaining() / each {
        return Err(Error::corrupted("log record: more rows than bytes"));
    }
    let ids = (0..n).map(|_| r.u64()).collect::<Result<Vec<_>>>()?;
    let mut vectors = Vec::new();
    if kind == Kind::Insert {
        r.f32s(n * dim, &mut vectors)?;
        if vectors.iter().any(|x| !x.is_finite()) {
            return Err(Error::corrupted("log record: a non-finite component"));
        }
    }
    let at = r.position();
    Ok(Record {
        kind,
        seq,
        continues: byte & CONTINUES != 0,
        ids,
        vectors,
        tail: &frame[at..],
    })
}

/// The sequence number of a record, read without decoding the rest.
pub fn seq_of(frame: &[u8]) -> Result<Seq> {
    let mut r = ByteReader::new(frame);
    r.u8()?;
    r.u64()
}

/// Rows of a `kind` record that fit in a frame of `max_frame` bytes (at
/// least one).
pub fn rows_per_frame(kind: Kind, dim: usize, max_frame: usize) -> usize {
    let each = 8 + if kind == Kind::Insert { 4 * dim } else { 0 };
    (max_frame.saturating_sub(HEAD) / each).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn records_round_trip_with_their_tail() {
        let mut b = Vec::new();
        encode(&mut b, Kind::Insert, 5, true, &[1, 2], &[0.5; 6]);
        b.extend_from_slice(b"tail");
        let r = decode(&b, 3).unwrap();
        assert_eq!(seq_of(&b).unwrap(), 5);
        assert!(seq_of(&b[..8]).is_err());
        assert_eq!(
            r,
            Record {
                kind: Kind::Insert,
                seq: 5,
                continues: true,
                ids: vec![1, 2],
                vectors: vec![0.5; 6],
                tail: b"tail",
            }
        );
        for kind in [Kind::Delete, Kind::Annotate, Kind::Abandon] {
            b.clear();
            encode(&mut b, kind, 9, false, &[4], &[]);
            let r = decode(&b, 3).unwrap();
            assert_eq!(
                (r.kind, r.seq, r.continues, r.ids, r.tail.len()),
                (kind, 9, false, vec![4], 0)
            );
        }
    }

    #[test]
    fn bad_kinds_cuts_and_non_finite_components_are_errors() {
        let mut b = Vec::new();
        encode(&mut b, Kind::Insert, 5, false, &[1, 2], &[0.5; 6]);
        for cut in 0..b.len() {
            assert!(decode(&b[..cut], 3).is_err(), "cut at {cut}");
        }
        for k in [0u8, 5, 0x7f, CONTINUES] {
            let mut bad = b.clone();
            bad[0] = k;
            assert!(decode(&bad, 3)
                .unwrap_err()
                .to_string()
                .contains("unknown kind"));
        }
        let mut nan = Vec::new();
        encode(
            &mut nan,
            Kind::Insert,
            5,
            false,
            &[1],
            &[f32::NAN, 0.0, 0.0],
        );
        assert!(decode(&nan, 3).is_err());
    }

    #[test]
    fn rows_per_frame_keeps_a_frame_within_its_bound() {
        for dim in [1, 3, 100, 1 << 20] {
            for kind in [Kind::Insert, Kind::Delete] {
                let n = rows_per_frame(kind, dim, 4096);
                let each = 8 + if kind == Kind::Insert { 4 * dim } else { 0 };
                assert!(n == 1 || HEAD + n * each <= 4096, "{kind:?} dim {dim}: {n}");
                assert!(HEAD + (n + 1) * each > 4096);
            }
        }
    }

    proptest! {
        #[test]
        fn the_parser_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..400), dim in 1usize..64) {
            let _ = decode(&bytes, dim);
        }
    }
}
