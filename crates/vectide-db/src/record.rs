//! The collection's WAL records (`docs/format-database.md`, "Record
//! payloads"): one codec for the one log. Encoders build a record's bytes
//! and its decoded form ([`Op`]) together, so that the writer applies
//! exactly what it logged; [`decode`] reads a record back through the one
//! bounds-checked reader (`vectide_core::io::ByteReader`).

use crate::error::{DbError, Result};
use crate::ids::ExtId;
use crate::store::Change;
use serde_json::Value;
use std::collections::HashSet;
use vectide_core::io::ByteReader;
use vectide_core::Seq;
use vectide_engines::AnyIndex;

pub(crate) const OP_UPSERT: u8 = 1;
pub(crate) const OP_DELETE: u8 = 2;
pub(crate) const OP_SET_PAYLOAD: u8 = 3;

/// A decoded WAL record: what the engine (ids, vectors) and the point
/// store (changes) apply.
#[derive(Debug)]
pub(crate) struct Op {
    pub seq: Seq,
    pub kind: u8,
    pub ids: Vec<u64>,
    pub vectors: Vec<f32>,
    pub changes: Vec<Change>,
}

impl Op {
    /// Whether applying it calls the engine (a payload update does not).
    pub fn touches_engine(&self) -> bool {
        self.kind == OP_UPSERT || self.kind == OP_DELETE
    }

    /// Applies it to the engine.
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

fn header(seq: Seq, kind: u8, n: usize, capacity: usize) -> Vec<u8> {
    let mut b = Vec::with_capacity(capacity);
    b.extend_from_slice(&seq.to_le_bytes());
    b.push(kind);
    b.extend_from_slice(&(n as u32).to_le_bytes());
    b
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
    let mut b = header(seq, OP_UPSERT, n, 16 + n * (4 * dim + 64));
    let mut op = Op {
        seq,
        kind: OP_UPSERT,
        ids: Vec::with_capacity(n),
        vectors: Vec::with_capacity(n * dim),
        changes: Vec::with_capacity(n),
    };
    for r in rows {
        b.extend_from_slice(&r.id.to_le_bytes());
        r.ext.encode(&mut b);
        for x in r.vector {
            b.extend_from_slice(&x.to_le_bytes());
        }
        put_json(&mut b, &r.payload);
        op.ids.push(r.id);
        op.vectors.extend_from_slice(r.vector);
        op.changes.push(Change::Upsert {
            id: r.id,
            ext: r.ext,
            payload: r.payload,
        });
    }
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
    let mut b = header(seq, kind, targets.len(), 16 + targets.len() * 32);
    let mut op = Op {
        seq,
        kind,
        ids: Vec::with_capacity(targets.len()),
        vectors: Vec::new(),
        changes: Vec::with_capacity(targets.len()),
    };
    for (id, ext) in targets {
        b.extend_from_slice(&id.to_le_bytes());
        ext.encode(&mut b);
        op.ids.push(*id);
        op.changes.push(if kind == OP_DELETE {
            Change::Delete {
                id: *id,
                ext: ext.clone(),
            }
        } else {
            put_json(&mut b, payload);
            Change::SetPayload {
                id: *id,
                ext: ext.clone(),
                payload: payload.clone(),
            }
        });
    }
    (b, op)
}

fn ext(r: &mut ByteReader<'_>, payload: &[u8]) -> Result<ExtId> {
    let (id, n) = ExtId::decode(&payload[r.position()..])?;
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
pub(crate) fn decode(payload: &[u8], dim: usize) -> Result<Op> {
    let mut r = ByteReader::new(payload);
    let seq = r.u64()?;
    let kind = r.u8()?;
    let n = r.u32()? as usize;
    if n > payload.len() {
        return Err(DbError::corrupted(
            "WAL record claims more points than it holds",
        ));
    }
    let mut op = Op {
        seq,
        kind,
        ids: Vec::with_capacity(n),
        vectors: Vec::new(),
        changes: Vec::with_capacity(n),
    };
    for _ in 0..n {
        let id = r.u64()?;
        let ext = ext(&mut r, payload)?;
        op.ids.push(id);
        match kind {
            OP_UPSERT => {
                r.f32s(dim, &mut op.vectors)?;
                let payload = json(&mut r)?;
                op.changes.push(Change::Upsert { id, ext, payload });
            }
            OP_DELETE => op.changes.push(Change::Delete { id, ext }),
            OP_SET_PAYLOAD => {
                let payload = json(&mut r)?;
                op.changes.push(Change::SetPayload { id, ext, payload });
            }
            k => {
                return Err(DbError::corrupted(format!(
                    "WAL record of unknown kind {k}"
                )))
            }
        }
    }
    Ok(op)
}

/// Consecutive upserts of a WAL tail, replayed into the engine as one batch
/// (one call instead of one per record, which dominated restart time). A
/// batch ends at a delete, at an id it already holds, or at 4096 points; it
/// carries the sequence number of its last record, which is harmless: each
/// point is applied once, and everything up to that number is applied when
/// the batch is.
#[derive(Default)]
pub(crate) struct ReplayBatch {
    seq: Seq,
    ids: Vec<u64>,
    vectors: Vec<f32>,
    seen: HashSet<u64>,
}

impl ReplayBatch {
    pub fn add(&mut self, engine: &AnyIndex, op: &Op) -> Result<()> {
        if op.kind != OP_UPSERT || op.ids.iter().any(|i| self.seen.contains(i)) {
            self.flush(engine)?;
        }
        if op.kind != OP_UPSERT {
            return op.apply_to(engine);
        }
        self.seq = op.seq;
        self.ids.extend_from_slice(&op.ids);
        self.vectors.extend_from_slice(&op.vectors);
        self.seen.extend(op.ids.iter().copied());
        if self.ids.len() >= 4096 {
            self.flush(engine)?;
        }
        Ok(())
    }

    pub fn flush(&mut self, engine: &AnyIndex) -> Result<()> {
        if !self.ids.is_empty() {
            engine.insert(self.seq, &self.ids, &self.vectors)?;
            self.ids.clear();
            self.vectors.clear();
            self.seen.clear();
        }
        Ok(())
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
        bad[8] = 9;
        assert!(decode(&bad, 2)
            .unwrap_err()
            .to_string()
            .contains("unknown kind"));
    }
}
