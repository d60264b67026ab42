//! A collection's point store: external ids and JSON payloads, kept in
//! memory (the mirror, which filters read, plus payload indexes) and made
//! durable at checkpoints in two files of its own ([`files`]: a snapshot
//! and a log of checkpoint batches).
//!
//! What it keeps: per internal id, `seq u64 | ext id | payload JSON`;
//! in memory, the map from external to internal ids of the live points
//! (and of those whose upsert is in flight); the watermarks
//! `applied_seq`, `next_internal` and `engine_seq`; the declared payload
//! indexes (field → `keyword` | `integer`).
//!
//! Operations are applied in memory only: the mirror, plus the encoded
//! rows they change, kept aside until the next checkpoint. The
//! collection's WAL is the record of truth, and recovery replays it from
//! `durable_seq()`, the `applied_seq` of the last checkpoint. A checkpoint
//! takes the rows aside out of the store in one swap
//! ([`PointStore::begin_checkpoint`]) and writes them as one fsynced batch
//! ([`StoreFlush::commit`]) without the store's lock, so writers go on
//! meanwhile. The files hold at most about 1.5 times the rows under any
//! churn (a redb file, before catalog version 4, grew by doublings and
//! never shrank: [`legacy`] migrates such stores at their first open).
//! Per point, the sequence number of the last write is kept: a replayed
//! operation older than what a point holds is skipped (idempotent replay).
//!
//! A deleted point's external id is forgotten when its delete is logged
//! ([`PointStore::forget`]), and an id inserted again gets a new internal
//! number: memory and files follow the live points, not every id a
//! collection has ever seen (they kept every id once, so a churn of new
//! ids grew both without bound).

use crate::error::{DbError, Result};
use crate::filter::{Condition, Filter, Scalar};
use crate::ids::ExtId;
use parking_lot::Mutex;
use serde_json::{Map, Value};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;
use vectide_core::Seq;

pub mod files;
pub mod legacy;

pub use files::{StoreFiles, SYNC_STORE};

/// A live point's metadata.
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    pub ext: ExtId,
    pub payload: Value,
    pub seq: Seq,
}

/// The kind of a payload index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum IndexKind {
    Keyword,
    Integer,
}

impl IndexKind {
    pub fn parse(s: &str) -> Result<IndexKind> {
        match s {
            "keyword" => Ok(IndexKind::Keyword),
            "integer" => Ok(IndexKind::Integer),
            other => Err(DbError::invalid(format!(
                "payload index schema must be \"keyword\" or \"integer\", got {other:?}"
            ))),
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            IndexKind::Keyword => "keyword",
            IndexKind::Integer => "integer",
        }
    }
}

#[derive(Debug, Default)]
struct FieldIndex {
    kind: Option<IndexKind>,
    /// The field's key path (`None` for a name declared before fields were
    /// key paths that is not one: such an index holds nothing and answers
    /// no condition).
    path: Option<crate::path::KeyPath>,
    keyword: HashMap<String, HashSet<u64>>,
    integer: BTreeMap<i64, HashSet<u64>>,
    /// Numbers an integer index cannot hold (fractions, beyond i64): while
    /// any is stored, the index does not answer ranges (they would miss it).
    non_integers: usize,
}

impl FieldIndex {
    /// The indexable values of `field` in a payload; `None` stands for a
    /// number an integer index cannot hold.
    /// The values a condition compares are the ones the field's path
    /// selects with arrays unwrapped one level (`crate::filter`), so the
    /// index holds exactly those.
    fn values(&self, _field: &str, p: &Value, f: &mut dyn FnMut(Option<Scalar>)) {
        let Some(path) = &self.path else {
            return;
        };
        let mut vals = Vec::new();
        path.values(p, true, &mut vals);
        for v in vals {
            match (self.kind, v) {
                (Some(IndexKind::Keyword), Value::String(s)) => f(Some(Scalar::Str(s.clone()))),
                (Some(IndexKind::Integer), Value::Number(n)) => {
                    f(n.as_i64().filter(|_| !n.is_f64()).map(Scalar::Int))
                }
                _ => {}
            }
        }
    }

    fn add(&mut self, field: &str, id: u64, p: &Value) {
        let mut vals = Vec::new();
        self.values(field, p, &mut |s| vals.push(s));
        for s in vals {
            match s {
                Some(Scalar::Str(k)) => {
                    self.keyword.entry(k).or_default().insert(id);
                }
                Some(Scalar::Int(i)) => {
                    self.integer.entry(i).or_default().insert(id);
                }
                Some(Scalar::Bool(_)) => {}
                None => self.non_integers += 1,
            }
        }
    }

    fn remove(&mut self, field: &str, id: u64, p: &Value) {
        let mut vals = Vec::new();
        self.values(field, p, &mut |s| vals.push(s));
        for s in vals {
            match s {
                None => self.non_integers = self.non_integers.saturating_sub(1),
                Some(Scalar::Bool(_)) => {}
                Some(Scalar::Str(k)) => {
                    if let Some(set) = self.keyword.get_mut(&k) {
                        set.remove(&id);
                        if set.is_empty() {
                            self.keyword.remove(&k);
                        }
                    }
                }
                Some(Scalar::Int(i)) => {
                    if let Some(set) = self.integer.get_mut(&i) {
                        set.remove(&id);
                        if set.is_empty() {
                            self.integer.remove(&i);
                        }
                    }
                }
            }
        }
    }

    /// The posting sets a condition selects (their union is what it can
    /// hold for), when this index answers it; borrowed, nothing copied.
    /// A condition on a value of another type than the index holds is not
    /// answered (`None`): the filter then scans.
    fn postings(&self, c: &Condition) -> Option<Vec<&HashSet<u64>>> {
        static EMPTY: std::sync::LazyLock<HashSet<u64>> = std::sync::LazyLock::new(HashSet::new);
        let lookup = |s: &Scalar| -> Option<&HashSet<u64>> {
            match (self.kind, s) {
                (Some(IndexKind::Keyword), Scalar::Str(k)) => {
                    Some(self.keyword.get(k).unwrap_or(&EMPTY))
                }
                (Some(IndexKind::Integer), Scalar::Int(i)) => {
                    Some(self.integer.get(i).unwrap_or(&EMPTY))
                }
                _ => None,
            }
        };
        match c {
            Condition::Match { value, .. } => lookup(value).map(|s| vec![s]),
            Condition::Any { values, .. } => values.iter().map(lookup).collect(),
            Condition::Range { range, .. }
                if self.kind == Some(IndexKind::Integer) && self.non_integers == 0 =>
            {
                let lo = [
                    range.gt.map(|x| x.floor() as i64 + 1),
                    range.gte.map(|x| x.ceil() as i64),
                ]
                .into_iter()
                .flatten()
                .max()
                .unwrap_or(i64::MIN);
                let hi = [
                    range.lt.map(|x| x.ceil() as i64 - 1),
                    range.lte.map(|x| x.floor() as i64),
                ]
                .into_iter()
                .flatten()
                .min()
                .unwrap_or(i64::MAX);
                if lo > hi {
                    return Some(Vec::new());
                }
                Some(self.integer.range(lo..=hi).map(|(_, s)| s).collect())
            }
            _ => None,
        }
    }
}

/// One change to apply to the store (decoded from a WAL record).
#[derive(Debug, Clone)]
pub enum Change {
    Upsert {
        id: u64,
        ext: ExtId,
        payload: Value,
    },
    Delete {
        id: u64,
        ext: ExtId,
    },
    /// A payload edit (`crate::edit::PayloadEdit`, as the log holds it).
    SetPayload {
        id: u64,
        ext: ExtId,
        payload: Value,
    },
}

/// The point store of one collection.
pub struct PointStore {
    files: Arc<Mutex<StoreFiles>>,
    points: HashMap<u64, Point>,
    ids: HashMap<ExtId, u64>,
    next_internal: u64,
    applied: Seq,
    durable: Seq,
    engine_checkpoint: Seq,
    indexes: HashMap<String, FieldIndex>,
    /// Rows changed since the last checkpoint took them.
    dirty: Dirty,
}

/// Rows that operations changed since a checkpoint last took them: per
/// internal id, its encoded point (`None`: removed).
#[derive(Default)]
struct Dirty {
    points: HashMap<u64, Option<Vec<u8>>>,
}

impl Dirty {
    /// Puts back rows a failed checkpoint took, under the newer ones
    /// written since.
    fn restore(&mut self, older: Dirty) {
        for (id, row) in older.points {
            self.points.entry(id).or_insert(row);
        }
    }
}

/// What one checkpoint makes durable: the rows the store changed through
/// `applied`, taken out of it by [`PointStore::begin_checkpoint`].
/// [`commit`](Self::commit) writes them without the store's lock;
/// [`PointStore::end_checkpoint`] then records the outcome. Checkpoints must
/// commit in the order they began (the collection runs one at a time).
pub struct StoreFlush {
    files: Arc<Mutex<StoreFiles>>,
    rows: Dirty,
    applied: Seq,
    next_internal: u64,
    engine_seq: Seq,
}

impl StoreFlush {
    /// Sets the engine's durable point this checkpoint records (known
    /// once the engine's part of the checkpoint is durable).
    pub fn set_engine_seq(&mut self, seq: Seq) {
        self.engine_seq = seq;
    }

    /// Writes the rows and the watermarks durably: one appended, fsynced
    /// batch, or a new snapshot once the batches outgrow half the last one
    /// ([`files`]).
    pub fn commit(&self) -> Result<()> {
        self.files.lock().commit(&files::Batch {
            applied: self.applied,
            next_internal: self.next_internal,
            engine_seq: self.engine_seq,
            points: &self.rows.points,
        })
    }
}

fn encode_point(seq: Seq, ext: &ExtId, payload: &Value) -> Vec<u8> {
    let mut b = seq.to_le_bytes().to_vec();
    ext.encode(&mut b);
    b.extend_from_slice(payload.to_string().as_bytes());
    b
}

fn decode_point(b: &[u8]) -> Result<Point> {
    let seq = u64::from_le_bytes(
        b.get(..8)
            .ok_or_else(|| DbError::corrupted("point record too short"))?
            .try_into()
            .expect("8"),
    );
    let (ext, n) = ExtId::decode(&b[8..])?;
    let payload: Value = serde_json::from_slice(&b[8 + n..])
        .map_err(|e| DbError::corrupted(format!("point payload: {e}")))?;
    Ok(Point { ext, payload, seq })
}

impl PointStore {
    /// Opens (or creates) the store of the collection directory `dir`
    /// and loads the mirror; a store of catalog version 3 (redb) is
    /// migrated first.
    pub fn open(dir: &Path) -> Result<PointStore> {
        legacy::migrate(dir)?;
        let (files, img) = StoreFiles::open(dir)?;
        let mut points = HashMap::with_capacity(img.points.len());
        for (id, row) in img.points {
            points.insert(id, decode_point(&row)?);
        }
        let ids: HashMap<ExtId, u64> = points.iter().map(|(&id, p)| (p.ext.clone(), id)).collect();
        let next_internal = img
            .next_internal
            .max(points.keys().map(|&i| i + 1).max().unwrap_or(0));
        let mut store = PointStore {
            files: Arc::new(Mutex::new(files)),
            dirty: Dirty::default(),
            points,
            ids,
            next_internal,
            applied: img.applied,
            durable: img.applied,
            engine_checkpoint: img.engine_seq,
            indexes: HashMap::new(),
        };
        for (field, kind) in img.indexes {
            store.build_index(&field, kind);
        }
        Ok(store)
    }

    /// Highest sequence number applied (in memory).
    pub fn applied_seq(&self) -> Seq {
        self.applied
    }

    /// Highest sequence number in a durable commit.
    pub fn durable_seq(&self) -> Seq {
        self.durable
    }

    /// Live points.
    pub fn len(&self) -> usize {
        self.points.len()
    }

    pub fn is_empty(&self) -> bool {
        self.points.is_empty()
    }

    /// The internal id of an external one (live, or its upsert in flight;
    /// `None` once its delete is logged).
    pub fn internal(&self, ext: &ExtId) -> Option<u64> {
        self.ids.get(ext).copied()
    }

    /// Assigns (or returns) the internal id of an external one, in memory;
    /// the WAL record carries it, and applying makes it durable. Called
    /// in log order (under the store's write lock, as the record is made).
    pub fn assign(&mut self, ext: &ExtId) -> u64 {
        if let Some(&i) = self.ids.get(ext) {
            return i;
        }
        let i = self.next_internal;
        self.next_internal += 1;
        self.ids.insert(ext.clone(), i);
        i
    }

    /// Forgets `ext` as the record that deletes internal id `id` is made
    /// (in log order, like [`assign`](Self::assign)), so that an upsert
    /// logged after the delete assigns a new internal id. Does nothing when
    /// `ext` names another internal id already (inserted again since).
    pub fn forget(&mut self, ext: &ExtId, id: u64) {
        if self.ids.get(ext) == Some(&id) {
            self.ids.remove(ext);
        }
    }

    /// One more than the highest internal id ever assigned.
    pub fn next_internal(&self) -> u64 {
        self.next_internal
    }

    /// A live point.
    pub fn get(&self, id: u64) -> Option<&Point> {
        self.points.get(&id)
    }

    /// Iterates over live points (unordered).
    pub fn iter(&self) -> impl Iterator<Item = (&u64, &Point)> {
        self.points.iter()
    }

    /// Applies one operation's changes (in memory; the next checkpoint
    /// writes them). Changes older than what a point holds are skipped.
    pub fn apply(&mut self, seq: Seq, changes: &[Change]) {
        self.apply_owned(seq, changes.to_vec())
    }

    /// [`apply`](Self::apply), taking the changes (payloads move into the
    /// store instead of being copied).
    pub fn apply_owned(&mut self, seq: Seq, changes: Vec<Change>) {
        self.apply_many(std::iter::once((seq, changes)))
    }

    /// Applies a committed operation whose record was made through this
    /// store: [`assign`](Self::assign) and [`forget`](Self::forget) kept the
    /// id map in log order as the records were made, and records made after
    /// this one may have changed it since, so the map is left alone (setting
    /// it here would bring back an id a later delete forgot, or hide the new
    /// number a later upsert took).
    pub fn apply_recorded(&mut self, seq: Seq, changes: Vec<Change>) {
        if seq > self.applied {
            self.apply_in(seq, changes, false);
            self.applied = seq;
        }
    }

    /// Applies several operations (ascending sequence numbers); those at or
    /// below [`applied_seq`](Self::applied_seq) are already in the store
    /// (a replay after a checkpoint of the store but not of the engine).
    /// The id map follows them (a replay, where no record was made here).
    pub fn apply_many(&mut self, ops: impl IntoIterator<Item = (Seq, Vec<Change>)>) {
        for (seq, changes) in ops {
            if seq <= self.applied {
                continue;
            }
            self.apply_in(seq, changes, true);
            self.applied = seq;
        }
    }

    fn apply_in(&mut self, seq: Seq, changes: Vec<Change>, track_ids: bool) {
        for c in changes {
            match c {
                Change::Upsert { id, ext, payload } => {
                    if self.points.get(&id).is_some_and(|p| p.seq > seq) {
                        continue;
                    }
                    let payload = if payload.is_null() {
                        Value::Object(Map::new())
                    } else {
                        payload
                    };
                    self.dirty
                        .points
                        .insert(id, Some(encode_point(seq, &ext, &payload)));
                    if track_ids {
                        self.ids.insert(ext.clone(), id);
                    }
                    self.next_internal = self.next_internal.max(id + 1);
                    let old = self.points.insert(id, Point { ext, payload, seq });
                    self.reindex(id, old.as_ref().map(|p| &p.payload));
                }
                Change::Delete { id, ext } => {
                    if self.points.get(&id).is_some_and(|p| p.seq <= seq) {
                        self.dirty.points.insert(id, None);
                        let old = self.points.remove(&id);
                        self.reindex(id, old.as_ref().map(|p| &p.payload));
                    }
                    // Forgotten when the record was made; a replay forgets
                    // it here.
                    if track_ids {
                        self.forget(&ext, id);
                    }
                }
                Change::SetPayload { id, ext, payload } => {
                    let Some(p) = self.points.get(&id) else {
                        continue;
                    };
                    if p.seq > seq {
                        continue;
                    }
                    let mut merged = p.payload.clone();
                    // Checked when the record was made or decoded.
                    if let Ok(edit) = crate::edit::PayloadEdit::from_json(&payload) {
                        edit.apply(&mut merged);
                    }
                    self.dirty
                        .points
                        .insert(id, Some(encode_point(seq, &ext, &merged)));
                    let old = self.points.insert(
                        id,
                        Point {
                            ext,
                            payload: merged,
                            seq,
                        },
                    );
                    self.reindex(id, old.as_ref().map(|p| &p.payload));
                }
            }
        }
    }

    /// Takes what the store changed through [`applied_seq`](Self::applied_seq)
    /// out of it, with the engine's durable point as of the same checkpoint
    /// (`engine_seq`), to be committed by [`StoreFlush::commit`] without
    /// this store's lock. Costs a swap.
    pub fn begin_checkpoint(&mut self, engine_seq: Seq) -> StoreFlush {
        StoreFlush {
            files: Arc::clone(&self.files),
            rows: std::mem::take(&mut self.dirty),
            applied: self.applied,
            next_internal: self.next_internal,
            engine_seq,
        }
    }

    /// Records the outcome of a flush's commit: on success the store is
    /// durable through its `applied`; on failure its rows go back (under
    /// those written since) for the next checkpoint.
    pub fn end_checkpoint(&mut self, flush: StoreFlush, committed: bool) {
        if committed {
            self.durable = self.durable.max(flush.applied);
            self.engine_checkpoint = self.engine_checkpoint.max(flush.engine_seq);
        } else {
            self.dirty.restore(flush.rows);
        }
    }

    /// Makes everything applied durable (one fsynced commit, under this
    /// store's lock), recording the engine's durable point as of the same
    /// checkpoint (`engine_seq`).
    pub fn checkpoint(&mut self, engine_seq: Seq) -> Result<Seq> {
        let flush = self.begin_checkpoint(engine_seq);
        let result = flush.commit();
        self.end_checkpoint(flush, result.is_ok());
        result.map(|()| self.durable)
    }

    /// The engine's durable point recorded by the last checkpoint: an engine
    /// that comes back below it lost data the log no longer holds.
    pub fn engine_checkpoint(&self) -> Seq {
        self.engine_checkpoint
    }

    fn reindex(&mut self, id: u64, old: Option<&Value>) {
        let new = self.points.get(&id).map(|p| p.payload.clone());
        for (field, idx) in self.indexes.iter_mut() {
            if let Some(o) = old {
                idx.remove(field, id, o);
            }
            if let Some(n) = &new {
                idx.add(field, id, n);
            }
        }
    }

    fn build_index(&mut self, field: &str, kind: IndexKind) {
        let mut idx = FieldIndex {
            kind: Some(kind),
            path: crate::path::KeyPath::parse(field).ok(),
            ..Default::default()
        };
        for (&id, p) in &self.points {
            idx.add(field, id, &p.payload);
        }
        self.indexes.insert(field.to_string(), idx);
    }

    /// Declares (durably) and builds a payload index.
    pub fn create_index(&mut self, field: &str, kind: IndexKind) -> Result<()> {
        if field.is_empty() || field.len() > 256 {
            return Err(DbError::invalid("index field names are 1..=256 bytes"));
        }
        crate::path::KeyPath::parse(field)?;
        self.files.lock().declare_index(field, kind)?;
        self.build_index(field, kind);
        Ok(())
    }

    /// Declared payload indexes.
    pub fn indexes(&self) -> Vec<(String, IndexKind)> {
        let mut v: Vec<_> = self
            .indexes
            .iter()
            .filter_map(|(f, i)| i.kind.map(|k| (f.clone(), k)))
            .collect();
        v.sort();
        v
    }

    /// The ids a `must` condition can hold for, as borrowed posting sets,
    /// when a payload index (or `has_id`) answers it.
    fn must_postings<'a>(
        &'a self,
        c: &Condition,
        has_id: &'a mut HashSet<u64>,
    ) -> Option<Vec<&'a HashSet<u64>>> {
        match c {
            Condition::Match { key, .. }
            | Condition::Any { key, .. }
            | Condition::Range { key, .. } => {
                self.indexes.get(key.as_str()).and_then(|i| i.postings(c))
            }
            Condition::HasId(ids) => {
                // `ids` holds upserts in flight too: keep the live ones.
                has_id.extend(
                    ids.iter()
                        .filter_map(|e| self.ids.get(e).copied())
                        .filter(|i| self.points.contains_key(i)),
                );
                Some(vec![&*has_id])
            }
            _ => None,
        }
    }

    /// An upper bound on how many points the filter accepts, from the sizes
    /// of the index postings of its `must` conditions (the smallest); `None`
    /// when no index applies. Costs one lookup per condition, copies nothing.
    pub fn index_estimate(&self, f: &Filter) -> Option<usize> {
        f.must
            .iter()
            .filter_map(|c| {
                let mut tmp = HashSet::new();
                self.must_postings(c, &mut tmp)
                    .map(|sets| sets.iter().map(|s| s.len()).sum::<usize>())
            })
            .min()
    }

    /// Ids the filter can hold for, from the payload indexes of its `must`
    /// conditions: the condition with the fewest postings gives the
    /// candidates, the others check membership; sorted, without duplicates.
    /// The flag says whether the candidates are exactly the matches (every
    /// condition is a `must` an index answered), so that they need no
    /// further check. `None` when no index applies.
    pub fn index_candidates(&self, f: &Filter) -> Option<(Vec<u64>, bool)> {
        let mut tmps: Vec<HashSet<u64>> = (0..f.must.len()).map(|_| HashSet::new()).collect();
        let mut answered: Vec<Vec<&HashSet<u64>>> = f
            .must
            .iter()
            .zip(tmps.iter_mut())
            .filter_map(|(c, tmp)| self.must_postings(c, tmp))
            .collect();
        if answered.is_empty() {
            return None;
        }
        let exact = answered.len() == f.must.len()
            && f.should.is_empty()
            && f.must_not.is_empty()
            && f.min_should.is_none();
        answered.sort_by_key(|sets| sets.iter().map(|s| s.len()).sum::<usize>());
        let (first, rest) = answered.split_first().expect("not empty");
        let mut out: Vec<u64> = first
            .iter()
            .flat_map(|s| s.iter().copied())
            .filter(|id| rest.iter().all(|sets| sets.iter().any(|s| s.contains(id))))
            .collect();
        out.sort_unstable();
        out.dedup();
        Some((out, exact))
    }

    /// Bytes of the store's files.
    pub fn file_bytes(&self) -> u64 {
        self.files.lock().bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn index_candidates_intersect_the_must_conditions() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = PointStore::open(dir.path()).unwrap();
        s.create_index("city", IndexKind::Keyword).unwrap();
        s.create_index("n", IndexKind::Integer).unwrap();
        let cities = ["a", "b", "c"];
        let changes: Vec<Change> = (0..300u64)
            .map(|i| {
                let ext = ExtId::Num(i);
                let id = s.assign(&ext);
                Change::Upsert {
                    id,
                    ext,
                    payload: json!({"city": cities[(i % 3) as usize], "n": (i * 7) % 10, "t": i % 2}),
                }
            })
            .collect();
        s.apply(1, &changes);
        let filters = [
            json!({"must": [{"key": "city", "match": {"value": "a"}}, {"key": "n", "range": {"gte": 3, "lt": 7}}]}),
            json!({"must": [{"key": "city", "match": {"any": ["b", "c"]}}, {"key": "n", "match": {"value": 4}}]}),
            json!({"must": [{"key": "n", "range": {"gt": 8}}, {"has_id": [1, 9, 19, 29, 1000]}]}),
            json!({"must": [{"key": "t", "match": {"value": 1}}, {"key": "city", "match": {"value": "c"}}]}),
        ];
        for fj in &filters {
            let f = Filter::parse(fj).unwrap();
            let exact: HashSet<u64> = s
                .iter()
                .filter(|(_, p)| f.eval(&p.ext, &p.payload))
                .map(|(&i, _)| i)
                .collect();
            let (cands, is_exact) = s.index_candidates(&f).unwrap();
            assert!(cands.windows(2).all(|w| w[0] < w[1]), "{fj}");
            let cands: HashSet<u64> = cands.into_iter().collect();
            assert!(cands.is_superset(&exact), "{fj}");
            let all_indexed = !fj.to_string().contains("\"t\"");
            assert_eq!(is_exact, all_indexed, "{fj}");
            if all_indexed {
                assert_eq!(cands, exact, "every condition is indexed: {fj}");
            }
            let est = s.index_estimate(&f).unwrap();
            assert!(est >= exact.len() && est <= s.len(), "{fj}: estimate {est}");
        }
        let unindexed =
            Filter::parse(&json!({"must": [{"key": "t", "match": {"value": 1}}]})).unwrap();
        assert!(s.index_candidates(&unindexed).is_none());
        assert!(s.index_estimate(&unindexed).is_none());
        // A value of the wrong type for the index, or a fraction in an
        // integer field, makes the index step aside rather than miss points.
        let wrong =
            Filter::parse(&json!({"must": [{"key": "city", "match": {"value": 3}}]})).unwrap();
        assert!(s.index_candidates(&wrong).is_none());
        let id = s.assign(&ExtId::Num(5000));
        s.apply(
            2,
            &[Change::Upsert {
                id,
                ext: ExtId::Num(5000),
                payload: json!({"n": 4.5}),
            }],
        );
        let r =
            Filter::parse(&json!({"must": [{"key": "n", "range": {"gt": 4, "lt": 5}}]})).unwrap();
        assert!(
            s.index_candidates(&r).is_none(),
            "4.5 is not in the integer index"
        );
        let m = Filter::parse(&json!({"must": [{"key": "n", "match": {"value": 4}}]})).unwrap();
        assert!(
            s.index_candidates(&m).is_some(),
            "integer matches stay exact"
        );
        s.apply(
            3,
            &[Change::Delete {
                id,
                ext: ExtId::Num(5000),
            }],
        );
        assert!(
            s.index_candidates(&r).is_some(),
            "answered again once the fraction is gone"
        );
        // has_id names only live points, so its candidates are exact.
        let h = Filter::parse(&json!({"must": [{"has_id": [5000, 3]}]})).unwrap();
        assert_eq!(s.index_candidates(&h).unwrap(), (vec![3], true));
    }

    #[test]
    fn applies_checkpoints_and_reloads() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_path_buf();
        let mut s = PointStore::open(&path).unwrap();
        let a = s.assign(&ExtId::Num(10));
        let b = s.assign(&ExtId::Str("x".into()));
        assert_eq!((a, b), (0, 1));
        s.apply(
            1,
            &[
                Change::Upsert {
                    id: a,
                    ext: ExtId::Num(10),
                    payload: json!({"city": "Berlin", "n": 3}),
                },
                Change::Upsert {
                    id: b,
                    ext: ExtId::Str("x".into()),
                    payload: Value::Null,
                },
            ],
        );
        s.create_index("city", IndexKind::Keyword).unwrap();
        s.create_index("n", IndexKind::Integer).unwrap();
        s.apply(
            2,
            &[Change::SetPayload {
                id: b,
                ext: ExtId::Str("x".into()),
                payload: json!({"city": "Paris"}),
            }],
        );
        // Replay of an older upsert is skipped per point.
        s.apply(
            3,
            &[Change::Delete {
                id: a,
                ext: ExtId::Num(10),
            }],
        );
        assert_eq!(s.len(), 1);
        let f = Filter::parse(&json!({"must": [{"key": "city", "match": {"value": "Paris"}}]}))
            .unwrap();
        assert_eq!(s.index_candidates(&f).unwrap(), (vec![b], true));
        assert_eq!(s.checkpoint(0).unwrap(), 3);
        s.apply(
            4,
            &[Change::Upsert {
                id: a,
                ext: ExtId::Num(10),
                payload: json!({"n": 5}),
            }],
        );
        drop(s);
        let mut s = PointStore::open(&path).unwrap();
        assert!(
            s.durable_seq() >= 3,
            "the non-durable commit of seq 4 may be gone or not"
        );
        assert!(s.applied_seq() >= 3);
        assert_eq!(s.get(b).unwrap().payload, json!({"city": "Paris"}));
        // Point 10 is back if seq 4 survived; else its id was forgotten
        // with its delete, and it gets a new number.
        let again = s.assign(&ExtId::Num(10));
        assert_eq!(again == a, s.get(a).is_some(), "{again}");
        assert_eq!(s.assign(&ExtId::Num(11)), 2 + u64::from(again != a));
        let r =
            Filter::parse(&json!({"must": [{"key": "n", "range": {"gte": 4, "lt": 6}}]})).unwrap();
        let (c, _) = s.index_candidates(&r).unwrap();
        assert!(c.is_empty() || c == vec![a]);
        assert_eq!(s.indexes().len(), 2);
    }

    fn upsert(id: u64, payload: Value) -> Change {
        Change::Upsert {
            id,
            ext: ExtId::Num(id),
            payload,
        }
    }

    #[test]
    fn a_failed_checkpoint_puts_its_rows_back_under_newer_ones() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_path_buf();
        let mut s = PointStore::open(&path).unwrap();
        s.apply(1, &[upsert(0, json!({"v": 1})), upsert(1, json!({"v": 1}))]);
        let flush = s.begin_checkpoint(0);
        // Written while the flush was out: newer than its rows.
        s.apply(2, &[upsert(1, json!({"v": 2}))]);
        s.apply(
            3,
            &[Change::Delete {
                id: 0,
                ext: ExtId::Num(0),
            }],
        );
        s.end_checkpoint(flush, false);
        assert_eq!(s.durable_seq(), 0, "nothing became durable");
        assert_eq!(s.checkpoint(0).unwrap(), 3);
        drop(s);
        let s = PointStore::open(&path).unwrap();
        assert_eq!(s.applied_seq(), 3);
        assert!(s.get(0).is_none(), "the newer delete won");
        assert_eq!(s.get(1).unwrap().payload, json!({"v": 2}));
        assert_eq!(
            s.internal(&ExtId::Num(0)),
            None,
            "a deleted id is forgotten"
        );
        assert_eq!(s.internal(&ExtId::Num(1)), Some(1));
    }

    /// A delete forgets its external id as its record is made, before it
    /// is applied: an upsert of the same id recorded meanwhile gets a new
    /// internal number, and applying the two in log order leaves one point.
    /// (Forgotten only when applied, the upsert would reuse the old number,
    /// and a third upsert recorded after the delete's apply would take a
    /// new one: two live points for one id.)
    #[test]
    fn a_delete_forgets_its_id_in_log_order() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = PointStore::open(dir.path()).unwrap();
        let x = ExtId::Str("x".into());
        let a = s.assign(&x);
        s.apply(
            1,
            &[Change::Upsert {
                id: a,
                ext: x.clone(),
                payload: json!({"v": 1}),
            }],
        );
        s.forget(&x, a); // the delete's record (seq 2) is made
        let b = s.assign(&x); // an upsert's record (seq 3)
        assert_ne!(a, b);
        s.forget(&x, a); // a stale delete of the old number changes nothing
        assert_eq!(s.internal(&x), Some(b));
        s.apply(
            2,
            &[Change::Delete {
                id: a,
                ext: x.clone(),
            }],
        );
        assert_eq!(
            s.internal(&x),
            Some(b),
            "the delete's apply leaves the new number"
        );
        assert_eq!(s.assign(&x), b, "a fourth record reuses the live number");
        s.apply(
            3,
            &[Change::Upsert {
                id: b,
                ext: x.clone(),
                payload: json!({"v": 2}),
            }],
        );
        assert_eq!(s.len(), 1);
        assert_eq!(s.get(b).unwrap().payload, json!({"v": 2}));
        // A replay of the same records ends in the same state.
        s.checkpoint(0).unwrap();
        drop(s);
        let mut s = PointStore::open(dir.path()).unwrap();
        assert_eq!((s.len(), s.internal(&x)), (1, Some(b)));
        s.apply(
            4,
            &[Change::Delete {
                id: b,
                ext: x.clone(),
            }],
        );
        assert_eq!(s.internal(&x), None, "a replayed delete forgets");
    }

    /// Records made before earlier ones apply (writers commit in groups):
    /// an upsert's record, a delete's, an upsert's again, then the first
    /// applies, then a fourth record. The first's apply must not bring back
    /// the number the delete forgot: the fourth record would update that
    /// number after the delete and leave two live points for one id.
    #[test]
    fn an_apply_after_later_records_leaves_the_id_map_to_them() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = PointStore::open(dir.path()).unwrap();
        let x = ExtId::Num(7);
        let up = |id, v| Change::Upsert {
            id,
            ext: x.clone(),
            payload: json!({ "v": v }),
        };
        let a = s.assign(&x); // seq 1: upsert
        s.forget(&x, a); // seq 2: delete of a
        let b = s.assign(&x); // seq 3: upsert under a new number
        s.apply_recorded(1, vec![up(a, 1)]);
        assert_eq!(
            s.internal(&x),
            Some(b),
            "seq 1's apply keeps seq 3's number"
        );
        let c = s.assign(&x); // seq 4: upsert
        assert_eq!(c, b);
        s.apply_recorded(
            2,
            vec![Change::Delete {
                id: a,
                ext: x.clone(),
            }],
        );
        s.apply_recorded(3, vec![up(b, 3)]);
        s.apply_recorded(4, vec![up(c, 4)]);
        assert_eq!(s.len(), 1, "one live point for one id");
        assert_eq!(s.get(b).unwrap().payload, json!({"v": 4}));
        assert_eq!(s.internal(&x), Some(b));
    }

    /// Churn through ever new ids (every round deletes the live points and
    /// inserts as many never seen) keeps the id map at the live points and
    /// the files near the rows; the store kept every id once, and both grew
    /// with each round.
    #[test]
    fn a_churn_of_new_ids_keeps_memory_and_files_at_the_live_points() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = PointStore::open(dir.path()).unwrap();
        let n = 2_000u64;
        let mut seq = 0;
        let mut sizes = Vec::new();
        for round in 0..30u64 {
            for i in 0..n {
                let ext = ExtId::Str(format!("doc-{round}-{i}"));
                let id = s.assign(&ext);
                seq += 1;
                s.apply(
                    seq,
                    &[Change::Upsert {
                        id,
                        ext,
                        payload: json!({"r": round}),
                    }],
                );
            }
            if round > 0 {
                for i in 0..n {
                    let ext = ExtId::Str(format!("doc-{}-{i}", round - 1));
                    let id = s.internal(&ext).unwrap();
                    s.forget(&ext, id);
                    seq += 1;
                    s.apply(seq, &[Change::Delete { id, ext }]);
                }
            }
            s.checkpoint(0).unwrap();
            assert_eq!(
                (s.len(), s.ids.len()),
                (n as usize, n as usize),
                "round {round}"
            );
            sizes.push(s.file_bytes());
        }
        assert_eq!(s.next_internal(), 30 * n, "numbers are never reused");
        let max = *sizes[2..].iter().max().unwrap() as f64;
        assert!(
            max <= 1.6 * sizes[2] as f64 + (2 << 20) as f64,
            "file sizes per round: {sizes:?}"
        );
        drop(s);
        let s = PointStore::open(dir.path()).unwrap();
        assert_eq!((s.len(), s.ids.len()), (n as usize, n as usize));
        assert!(s.internal(&ExtId::Str("doc-28-5".into())).is_none());
        assert!(s.internal(&ExtId::Str("doc-29-5".into())).is_some());
    }

    /// Rounds that each rewrite a quarter of the rows keep the store's
    /// files within about 1.5 times the rows: the batches go to the log
    /// until it outgrows half the snapshot, which a compaction then
    /// rewrites. The redb store of catalog version 3 grew its file by
    /// doublings here.
    #[test]
    fn rewrites_between_checkpoints_keep_the_files_near_the_rows() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_path_buf();
        let mut s = PointStore::open(&path).unwrap();
        let text = "x".repeat(100);
        let n = 20_000u64;
        s.apply_many((0..n).map(|i| (i + 1, vec![upsert(i, json!({"t": text, "r": 0}))])));
        s.checkpoint(0).unwrap();
        let mut seq = n;
        let mut sizes = vec![s.file_bytes()];
        for round in 1..=16u64 {
            for i in (round % 4..n).step_by(4) {
                seq += 1;
                s.apply(seq, &[upsert(i, json!({"t": text, "r": round}))]);
            }
            s.checkpoint(0).unwrap();
            sizes.push(s.file_bytes());
        }
        assert!(s.files.lock().compactions() >= 2, "{sizes:?}");
        assert!(
            *sizes.iter().max().unwrap() as f64 <= 1.55 * sizes[0] as f64,
            "file sizes: after the load, then per round: {sizes:?}"
        );
        drop(s);
        let s = PointStore::open(&path).unwrap();
        assert_eq!(s.len(), n as usize);
        assert_eq!(s.get(7).unwrap().payload["r"], json!(15));
    }

    /// A store of catalog version 3 (redb) opens with its points, ids,
    /// watermarks and indexes, and is left in the new files only.
    #[test]
    fn a_redb_store_is_migrated_at_its_first_open() {
        use redb::ReadableDatabase as _;
        let dir = tempfile::tempdir().unwrap();
        let old = dir.path().join(legacy::LEGACY_FILE);
        {
            let db = redb::Database::create(&old).unwrap();
            let w = db.begin_write().unwrap();
            {
                let mut pts = w.open_table(legacy::POINTS).unwrap();
                let mut ids = w.open_table(legacy::IDS).unwrap();
                for i in 0..3u64 {
                    let ext = ExtId::Num(100 + i);
                    pts.insert(i, encode_point(i + 1, &ext, &json!({"k": i})).as_slice())
                        .unwrap();
                    let mut e = Vec::new();
                    ext.encode(&mut e);
                    ids.insert(e.as_slice(), i).unwrap();
                }
                let mut e = Vec::new();
                ExtId::Num(99).encode(&mut e);
                ids.insert(e.as_slice(), 3).unwrap();
                let mut meta = w.open_table(legacy::META).unwrap();
                meta.insert("applied_seq", 5).unwrap();
                meta.insert("next_internal", 4).unwrap();
                meta.insert("engine_seq", 4).unwrap();
                w.open_table(legacy::INDEXES)
                    .unwrap()
                    .insert("k", "integer")
                    .unwrap();
            }
            w.commit().unwrap();
            assert!(db.begin_read().is_ok());
        }
        let mut s = PointStore::open(dir.path()).unwrap();
        assert!(!old.exists(), "the redb file is gone");
        assert_eq!((s.applied_seq(), s.engine_checkpoint(), s.len()), (5, 4, 3));
        assert_eq!(s.get(2).unwrap().payload, json!({"k": 2}));
        assert_eq!(s.internal(&ExtId::Num(99)), None, "deleted: forgotten");
        assert_eq!(s.internal(&ExtId::Num(101)), Some(1));
        assert_eq!(s.assign(&ExtId::Num(7)), 4, "numbers are not reused");
        assert_eq!(s.indexes(), vec![("k".to_string(), IndexKind::Integer)]);
        drop(s);
        let s = PointStore::open(dir.path()).unwrap();
        assert_eq!((s.applied_seq(), s.len()), (5, 3));
    }
}
