//! The collection's WAL records (`docs/format-database.md`, "Record
//! payloads"): the one record codec of every log
//! (`vectide_storage::durable::record`: kind, sequence number, internal
//! ids, vectors), with each point's external id and payload in the
//! record's tail. Encoders build a record's bytes and its decoded form
//! ([`Op`]) together, so that the writer applies exactly what it logged;
//! [`decode`] reads a record back through the one bounds-checked reader
//! (`vectide_core::io::ByteReader`).

use crate::error::{DbError, Result};
use crate::ids::ExtId;
use crate::spaces::{Shape, SparseVector, VectorValue};
use crate::store::Change;
use serde_json::Value;
use vectide_core::io::ByteReader;
use vectide_core::Seq;
use vectide_engines::AnyIndex;
use vectide_storage::durable::record::{self, Kind};
use vectide_storage::durable::Batcher;

pub(crate) const OP_UPSERT: u8 = Kind::Insert as u8;
pub(crate) const OP_DELETE: u8 = Kind::Delete as u8;
pub(crate) const OP_SET_PAYLOAD: u8 = Kind::Annotate as u8;

fn kind_of(op: u8) -> Kind {
    match op {
        OP_UPSERT => Kind::Insert,
        OP_DELETE => Kind::Delete,
        _ => Kind::Annotate,
    }
}

/// A decoded WAL record: what the engine (ids, vectors) and the point
/// store (changes) apply.
#[derive(Debug)]
pub(crate) struct Op {
    pub seq: Seq,
    pub kind: u8,
    pub ids: Vec<u64>,
    /// The single form's rows (a multi collection's upserts carry theirs
    /// in `spaces`).
    pub vectors: Vec<f32>,
    pub changes: Vec<Change>,
    /// A multi collection's upsert: each space's rows.
    pub spaces: Option<SpaceRows>,
}

/// A multi upsert's rows, by space: the points that carry the space's
/// vector, and those that do not (an upsert replaces the whole point, so
/// a vector the point had there is removed).
#[derive(Debug, Default)]
pub(crate) struct SpaceRows {
    pub dense: Vec<DenseRows>,
    pub sparse: Vec<SparseRows>,
}

#[derive(Debug, Default)]
pub(crate) struct DenseRows {
    pub ids: Vec<u64>,
    pub vectors: Vec<f32>,
    pub absent: Vec<u64>,
}

#[derive(Debug, Default)]
pub(crate) struct SparseRows {
    pub rows: Vec<(u64, SparseVector)>,
    pub absent: Vec<u64>,
}

impl SpaceRows {
    fn new(shape: &Shape) -> SpaceRows {
        SpaceRows {
            dense: shape.dense.iter().map(|_| DenseRows::default()).collect(),
            sparse: (0..shape.sparse).map(|_| SparseRows::default()).collect(),
        }
    }
}

impl Op {
    /// Whether applying it calls the engine (a payload update does not).
    pub fn touches_engine(&self) -> bool {
        self.kind == OP_UPSERT || self.kind == OP_DELETE
    }

    /// Applies a record this process just committed: its points were
    /// validated at the collection's edge (`upsert_owned`: every vector by
    /// `check_vector`, every point an id of its own), so the engine takes
    /// them without checking again.
    pub fn apply_to(&self, engine: &AnyIndex) -> Result<()> {
        match self.kind {
            OP_UPSERT => engine.insert(self.seq, &self.ids, &self.vectors)?,
            OP_DELETE => {
                engine.delete(self.seq, &self.ids)?;
            }
            _ => {}
        }
        Ok(())
    }
}

/// One point of an upsert record: its internal id, external id, vector and
/// payload.
pub(crate) struct UpsertRow<'a> {
    pub id: u64,
    pub ext: ExtId,
    pub vector: &'a [f32],
    pub payload: Value,
}

fn put_json(b: &mut Vec<u8>, v: &Value) {
    if v.is_null() {
        b.extend_from_slice(&0u32.to_le_bytes());
    } else {
        let s = v.to_string();
        b.extend_from_slice(&(s.len() as u32).to_le_bytes());
        b.extend_from_slice(s.as_bytes());
    }
}

/// An upsert record of `rows` (vectors of `dim`) and its decoded form.
pub(crate) fn encode_upsert<'a>(
    seq: Seq,
    dim: usize,
    n: usize,
    rows: impl Iterator<Item = UpsertRow<'a>>,
) -> (Vec<u8>, Op) {
    let mut op = Op {
        seq,
        kind: OP_UPSERT,
        ids: Vec::with_capacity(n),
        vectors: Vec::with_capacity(n * dim),
        changes: Vec::with_capacity(n),
        spaces: None,
    };
    let mut tail = Vec::with_capacity(n * 64);
    for r in rows {
        r.ext.encode(&mut tail);
        put_json(&mut tail, &r.payload);
        op.ids.push(r.id);
        op.vectors.extend_from_slice(r.vector);
        op.changes.push(Change::Upsert {
            id: r.id,
            ext: r.ext,
            payload: r.payload,
        });
    }
    let mut b = Vec::with_capacity(record::HEAD + 8 * n + 4 * n * dim + tail.len());
    record::encode(&mut b, Kind::Insert, seq, false, &op.ids, &op.vectors);
    b.extend_from_slice(&tail);
    (b, op)
}

/// A delete record, or a payload-update record (`payload` merged into each
/// target's), and its decoded form.
pub(crate) fn encode_targets(
    seq: Seq,
    kind: u8,
    targets: &[(u64, ExtId)],
    payload: &Value,
) -> (Vec<u8>, Op) {
    debug_assert!(kind == OP_DELETE || kind == OP_SET_PAYLOAD);
    let mut op = Op {
        seq,
        kind,
        ids: Vec::with_capacity(targets.len()),
        vectors: Vec::new(),
        changes: Vec::with_capacity(targets.len()),
        spaces: None,
    };
    let mut tail = Vec::with_capacity(targets.len() * 32);
    for (id, ext) in targets {
        ext.encode(&mut tail);
        op.ids.push(*id);
        op.changes.push(if kind == OP_DELETE {
            Change::Delete {
                id: *id,
                ext: ext.clone(),
            }
        } else {
            put_json(&mut tail, payload);
            Change::SetPayload {
                id: *id,
                ext: ext.clone(),
                payload: payload.clone(),
            }
        });
    }
    let mut b = Vec::with_capacity(record::HEAD + 8 * targets.len() + tail.len());
    record::encode(&mut b, kind_of(kind), seq, false, &op.ids, &[]);
    b.extend_from_slice(&tail);
    (b, op)
}

fn ext(r: &mut ByteReader<'_>) -> Result<ExtId> {
    let (id, n) = ExtId::decode(r.rest())?;
    r.bytes(n)?;
    Ok(id)
}

fn json(r: &mut ByteReader<'_>) -> Result<Value> {
    let n = r.u32()? as usize;
    if n == 0 {
        return Ok(Value::Null);
    }
    serde_json::from_slice(r.bytes(n)?).map_err(|e| DbError::corrupted(format!("WAL payload: {e}")))
}

/// Reads a record of a collection of dimension `dim`.
/// Decodes a record of a collection of the single form (`dim`) or of a
/// multi collection (`shape`).
pub(crate) fn decode_for(payload: &[u8], dim: usize, shape: Option<&Shape>) -> Result<Op> {
    match shape {
        Some(s) => decode_multi(payload, s),
        None => decode(payload, dim),
    }
}

pub(crate) fn decode(payload: &[u8], dim: usize) -> Result<Op> {
    let rec = record::decode(payload, dim).map_err(|e| DbError::corrupted(e.to_string()))?;
    if rec.continues {
        return Err(DbError::corrupted(
            "WAL record marked as continued: the database writes each operation in one record",
        ));
    }
    let kind = match rec.kind {
        Kind::Insert => OP_UPSERT,
        Kind::Delete => OP_DELETE,
        Kind::Annotate => OP_SET_PAYLOAD,
        Kind::Abandon => {
            return Err(DbError::corrupted(
                "WAL record of unknown kind 4 (an engine's, not the database's)",
            ))
        }
    };
    let mut r = ByteReader::new(rec.tail);
    let mut changes = Vec::with_capacity(rec.ids.len());
    for &id in &rec.ids {
        let ext = ext(&mut r)?;
        changes.push(match kind {
            OP_UPSERT => Change::Upsert {
                id,
                ext,
                payload: json(&mut r)?,
            },
            OP_DELETE => Change::Delete { id, ext },
            _ => {
                let payload = json(&mut r)?;
                crate::edit::PayloadEdit::from_json(&payload)?;
                Change::SetPayload { id, ext, payload }
            }
        });
    }
    if r.remaining() != 0 {
        return Err(DbError::corrupted("WAL record: bytes after the last point"));
    }
    Ok(Op {
        seq: rec.seq,
        kind,
        ids: rec.ids,
        vectors: rec.vectors,
        changes,
        spaces: None,
    })
}

/// A multi collection's upsert row.
pub(crate) struct MultiRow<'a> {
    pub id: u64,
    pub ext: ExtId,
    /// (space number, value), ascending by space number.
    pub vectors: Vec<(usize, &'a VectorValue)>,
    pub payload: Value,
}

fn put_vector(b: &mut Vec<u8>, v: &VectorValue) {
    match v {
        VectorValue::Dense(x) => {
            for f in x {
                b.extend_from_slice(&f.to_le_bytes());
            }
        }
        VectorValue::Sparse(x) => {
            b.extend_from_slice(&(x.len() as u32).to_le_bytes());
            for t in x.indices() {
                b.extend_from_slice(&t.to_le_bytes());
            }
            for w in x.values() {
                b.extend_from_slice(&w.to_le_bytes());
            }
        }
    }
}

/// The upsert record of a multi collection: the codec's ids (no vector
/// columns), then per point its external id, payload and vectors by space
/// number (`docs/format-database.md`).
pub(crate) fn encode_upsert_multi<'a>(
    seq: Seq,
    shape: &Shape,
    n: usize,
    rows: impl Iterator<Item = MultiRow<'a>>,
) -> (Vec<u8>, Op) {
    let mut op = Op {
        seq,
        kind: OP_UPSERT,
        ids: Vec::with_capacity(n),
        vectors: Vec::new(),
        changes: Vec::with_capacity(n),
        spaces: Some(SpaceRows::new(shape)),
    };
    let spaces = op.spaces.as_mut().expect("set above");
    let mut tail = Vec::with_capacity(n * 64);
    for r in rows {
        r.ext.encode(&mut tail);
        put_json(&mut tail, &r.payload);
        tail.extend_from_slice(&(r.vectors.len() as u16).to_le_bytes());
        let mut next = 0;
        for &(space, v) in &r.vectors {
            tail.extend_from_slice(&(space as u16).to_le_bytes());
            put_vector(&mut tail, v);
            place(spaces, shape, r.id, next, space);
            next = space + 1;
            match v {
                VectorValue::Dense(x) => {
                    let d = &mut spaces.dense[space];
                    d.ids.push(r.id);
                    d.vectors.extend_from_slice(x);
                }
                VectorValue::Sparse(x) => {
                    spaces.sparse[space - shape.dense.len()]
                        .rows
                        .push((r.id, x.clone()));
                }
            }
        }
        place(spaces, shape, r.id, next, shape.spaces());
        op.ids.push(r.id);
        op.changes.push(Change::Upsert {
            id: r.id,
            ext: r.ext,
            payload: r.payload,
        });
    }
    let mut b = Vec::with_capacity(record::HEAD + 8 * n + tail.len());
    record::encode(&mut b, Kind::Insert, seq, false, &op.ids, &[]);
    b.extend_from_slice(&tail);
    (b, op)
}

/// Marks point `id` absent from the spaces `from..to` (those its record
/// skipped).
fn place(spaces: &mut SpaceRows, shape: &Shape, id: u64, from: usize, to: usize) {
    for s in from..to {
        if s < shape.dense.len() {
            spaces.dense[s].absent.push(id);
        } else {
            spaces.sparse[s - shape.dense.len()].absent.push(id);
        }
    }
}

fn decode_multi(payload: &[u8], shape: &Shape) -> Result<Op> {
    let rec = record::decode(payload, 0).map_err(|e| DbError::corrupted(e.to_string()))?;
    if rec.kind != Kind::Insert {
        let mut op = decode(payload, 0)?;
        op.spaces = None;
        return Ok(op);
    }
    if rec.continues {
        return Err(DbError::corrupted(
            "WAL record marked as continued: the database writes each operation in one record",
        ));
    }
    let mut spaces = SpaceRows::new(shape);
    let mut r = ByteReader::new(rec.tail);
    let mut changes = Vec::with_capacity(rec.ids.len());
    let (mut idx, mut vals) = (Vec::new(), Vec::new());
    for &id in &rec.ids {
        let ext = ext(&mut r)?;
        let payload = json(&mut r)?;
        let count = u16::from_le_bytes(r.bytes(2)?.try_into().expect("2 bytes")) as usize;
        let mut next = 0;
        for _ in 0..count {
            let space = u16::from_le_bytes(r.bytes(2)?.try_into().expect("2 bytes")) as usize;
            if space < next || space >= shape.spaces() {
                return Err(DbError::corrupted(format!(
                    "WAL record: point {ext} names space {space} (out of order or beyond the collection's {})",
                    shape.spaces()
                )));
            }
            place(&mut spaces, shape, id, next, space);
            next = space + 1;
            if space < shape.dense.len() {
                let d = &mut spaces.dense[space];
                r.f32s(shape.dense[space], &mut d.vectors)?;
                d.ids.push(id);
            } else {
                let nnz = r.u32()? as usize;
                if nnz > vectide_sparse::MAX_NNZ {
                    return Err(DbError::corrupted(format!(
                        "WAL record: a sparse vector of {nnz} terms"
                    )));
                }
                idx.clear();
                vals.clear();
                r.u32s(nnz, &mut idx)?;
                r.f32s(nnz, &mut vals)?;
                let v = SparseVector::new(idx.clone(), vals.clone())
                    .map_err(|e| DbError::corrupted(format!("WAL record: {e}")))?;
                spaces.sparse[space - shape.dense.len()].rows.push((id, v));
            }
        }
        place(&mut spaces, shape, id, next, shape.spaces());
        changes.push(Change::Upsert { id, ext, payload });
    }
    if r.remaining() != 0 {
        return Err(DbError::corrupted("WAL record: bytes after the last point"));
    }
    Ok(Op {
        seq: rec.seq,
        kind: OP_UPSERT,
        ids: rec.ids,
        vectors: Vec::new(),
        changes,
        spaces: Some(spaces),
    })
}

/// Consecutive upserts of a WAL tail, replayed into the engine as one
/// batch (the kit's [`Batcher`]); a delete applies what is gathered first.
#[derive(Default)]
pub(crate) struct ReplayBatch(Batcher);

impl ReplayBatch {
    pub fn add(&mut self, engine: &AnyIndex, op: &Op) -> Result<()> {
        let mut apply = |seq, ids: &[u64], v: &[f32]| engine.insert(seq, ids, v);
        if op.kind != OP_UPSERT {
            self.0.flush(&mut apply)?;
            return op.apply_to(engine);
        }
        // The log is in sequence order: every record is numbered above
        // those before it and below those after it.
        Ok(self
            .0
            .insert(op.seq, &op.ids, &op.vectors, (0, Seq::MAX), &mut apply)?)
    }

    pub fn flush(&mut self, engine: &AnyIndex) -> Result<()> {
        Ok(self
            .0
            .flush(&mut |seq, ids: &[u64], v: &[f32]| engine.insert(seq, ids, v))?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn records_round_trip_and_damage_is_an_error() {
        let ext = [ExtId::Num(7), ExtId::Str("doc-1".into())];
        let vecs = [[1.0f32, 2.0], [3.0, -4.5]];
        let payloads = [json!({"a": 1}), Value::Null];
        let rows = (0..2).map(|i| UpsertRow {
            id: 10 + i as u64,
            ext: ext[i].clone(),
            vector: &vecs[i],
            payload: payloads[i].clone(),
        });
        let (b, op) = encode_upsert(5, 2, 2, rows);
        let back = decode(&b, 2).unwrap();
        assert_eq!((back.seq, back.kind), (5, OP_UPSERT));
        assert_eq!(back.ids, op.ids);
        assert_eq!(back.vectors, vec![1.0, 2.0, 3.0, -4.5]);
        assert_eq!(format!("{:?}", back.changes), format!("{:?}", op.changes));
        for kind in [OP_DELETE, OP_SET_PAYLOAD] {
            let targets = vec![(3u64, ExtId::Num(3)), (4, ExtId::Str("x".into()))];
            let (b, op) = encode_targets(9, kind, &targets, &json!({"k": true}));
            let back = decode(&b, 2).unwrap();
            assert_eq!(
                (back.seq, back.kind, back.ids.clone()),
                (9, kind, vec![3, 4])
            );
            assert_eq!(format!("{:?}", back.changes), format!("{:?}", op.changes));
            assert_eq!(back.touches_engine(), kind == OP_DELETE);
        }
        // Every truncation is an error, never a panic; so is an unknown kind.
        for cut in 0..b.len() {
            assert!(decode(&b[..cut], 2).is_err(), "cut at {cut}");
        }
        let mut bad = b.clone();
        bad[0] = 9;
        assert!(decode(&bad, 2)
            .unwrap_err()
            .to_string()
            .contains("unknown kind"));
    }

    /// A multi collection's upsert record (two dense spaces and a sparse
    /// one; points carrying some of them) round-trips; every truncation is
    /// an error; no single-byte change panics (each decodes to an error or
    /// to some operation), and the ones that break its structure are
    /// named.
    #[test]
    fn multi_records_round_trip_and_damage_never_panics() {
        let shape = Shape {
            dense: vec![2, 3],
            sparse: 1,
        };
        let a = VectorValue::Dense(vec![1.0, 2.0]);
        let b3 = VectorValue::Dense(vec![3.0, 4.0, 5.0]);
        let sp = VectorValue::Sparse(SparseVector::new(vec![4, 90], vec![0.5, -1.5]).unwrap());
        let rows = vec![
            MultiRow {
                id: 1,
                ext: ExtId::Num(1),
                vectors: vec![(0, &a), (2, &sp)],
                payload: json!({"t": "x"}),
            },
            MultiRow {
                id: 2,
                ext: ExtId::Str("two".into()),
                vectors: vec![(1, &b3)],
                payload: Value::Null,
            },
        ];
        let (rec, op) = encode_upsert_multi(8, &shape, 2, rows.into_iter());
        let back = decode_for(&rec, 0, Some(&shape)).unwrap();
        assert_eq!(
            (back.seq, back.kind, back.ids.clone()),
            (8, OP_UPSERT, vec![1, 2])
        );
        assert_eq!(format!("{:?}", back.changes), format!("{:?}", op.changes));
        assert_eq!(format!("{:?}", back.spaces), format!("{:?}", op.spaces));
        for cut in 0..rec.len() {
            assert!(
                decode_for(&rec[..cut], 0, Some(&shape)).is_err(),
                "cut at {cut}"
            );
        }
        let mut named = 0;
        for i in 0..rec.len() {
            for x in [0x01u8, 0x80, 0xff] {
                let mut bad = rec.clone();
                bad[i] ^= x;
                if decode_for(&bad, 0, Some(&shape)).is_err() {
                    named += 1;
                }
            }
        }
        assert!(
            named > rec.len(),
            "{named} of {} changes refused",
            3 * rec.len()
        );
        // A space out of order or past the collection's is refused by name.
        let mut bad = rec.clone();
        let tail_at = rec.len() - record::decode(&rec, 0).unwrap().tail.len();
        let mut head = Vec::new();
        ExtId::Num(1).encode(&mut head);
        put_json(&mut head, &json!({"t": "x"}));
        // The first point's external id and payload, its count of spaces,
        // then its first space number.
        let first_space = tail_at + head.len() + 2;
        assert_eq!(
            u16::from_le_bytes([bad[first_space], bad[first_space + 1]]),
            0
        );
        bad[first_space] = 7;
        let e = decode_for(&bad, 0, Some(&shape)).unwrap_err().to_string();
        assert!(e.contains("names space 7"), "{e}");
    }
}
