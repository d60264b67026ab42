//! The point store's durable form: a snapshot and a log of checkpoint
//! batches (`docs/format-database.md`, "Point store").
//!
//! ```text
//! points.snap := "VTDXPTS\0" | version u32 | body | crc32(everything before) u32
//! body        := applied u64 | next_internal u64 | engine_seq u64
//!                | n_indexes u32 | (len u32 | field | kind u8)*
//!                | n_points u64 | (id u64 | len u32 | row)*
//!                | n_ids u64 | (id u64 | len u32 | ext id)*
//! points.log  := the framing of `vectide_storage::wal` (header, then
//!                len | crc32 | payload records), each payload one of
//!   batch := 1 u8 | applied u64 | next_internal u64 | engine_seq u64
//!            | n_rows u32 | (id u64 | 0 u8 (removed) or 1 u8 | len u32 | row)*
//!            | n_ids u32 | (id u64 | len u32 | ext id)*
//!   index := 2 u8 | len u32 | field | kind u8
//! ```
//!
//! The `ids` sections are empty since version 2: a row carries its
//! point's external id, and the ids of deleted points are forgotten (they
//! were kept for ever before, so the section grew with every id a
//! collection had ever seen). Version-1 sections are read and dropped.
//!
//! A checkpoint appends one batch (the rows it changed and its
//! watermarks) and `fdatasync`s it ([`SYNC_STORE`]); the state is the
//! snapshot with the log's records applied in order. Once the log
//! outgrows half the snapshot (and at least [`COMPACT_MIN`]), or a batch
//! would not fit in one record, the checkpoint writes the whole state as a
//! new snapshot instead (temp file, fsync, rename, directory fsync) and then
//! empties the log: the two files hold at most about 1.5 times the
//! store's rows, however long the churn. A crash after the rename and
//! before the log is emptied leaves the new snapshot with the old log,
//! whose records, applied in order, end in the state the snapshot holds:
//! the same rows, removals and watermarks (each record's watermarks replace
//! the previous ones). Every write is an append or a whole-file rename, the
//! two kinds of change the crash kit's file simulator models exactly.

use super::IndexKind;
use crate::error::{DbError, Result};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use vectide_core::io::{push_crc, ByteReader};
use vectide_core::sync::SyncSite;
use vectide_core::Seq;
use vectide_storage::wal::{self, Wal, WalSites};

/// The snapshot of a collection's point store.
pub const SNAPSHOT_FILE: &str = "points.snap";
/// The log of checkpoint batches since the snapshot.
pub const LOG_FILE: &str = "points.log";
const MAGIC: &[u8; 8] = b"VTDXPTS\0";
const VERSION: u32 = 2;
/// The oldest snapshot version read (its `ids` section is dropped).
const OLDEST_VERSION: u32 = 1;
const BATCH: u8 = 1;
const INDEX: u8 = 2;
/// The log is compacted into the snapshot only once it holds this much.
pub const COMPACT_MIN: u64 = 1 << 20;

/// Sync site of the point store's appended checkpoint batches.
pub const SYNC_STORE: SyncSite = SyncSite("db.store.sync");
/// Sync sites of the store's log: its creation, its batches, its emptying
/// after a compaction.
pub const SITES: WalSites = WalSites {
    create: SyncSite("db.store.create"),
    append: SYNC_STORE,
    truncate: SyncSite("db.store.truncate"),
};

/// The store's durable state, as the files hold it: rows still encoded.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Image {
    pub applied: Seq,
    pub next_internal: u64,
    pub engine_seq: Seq,
    /// internal id → encoded point (`seq | ext id | payload`).
    pub points: HashMap<u64, Vec<u8>>,
    pub indexes: BTreeMap<String, IndexKind>,
}

/// What one checkpoint makes durable.
pub struct Batch<'a> {
    pub applied: Seq,
    pub next_internal: u64,
    pub engine_seq: Seq,
    /// internal id → encoded point, `None`: removed.
    pub points: &'a HashMap<u64, Option<Vec<u8>>>,
}

impl Batch<'_> {
    fn encode(&self, out: &mut Vec<u8>) {
        out.push(BATCH);
        for v in [self.applied, self.next_internal, self.engine_seq] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&(self.points.len() as u32).to_le_bytes());
        for (&id, row) in self.points {
            out.extend_from_slice(&id.to_le_bytes());
            match row {
                Some(b) => {
                    out.push(1);
                    put_bytes(out, b);
                }
                None => out.push(0),
            }
        }
        // No ids (version 2).
        out.extend_from_slice(&0u32.to_le_bytes());
    }
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u32).to_le_bytes());
    out.extend_from_slice(b);
}

fn get_bytes<'a>(r: &mut ByteReader<'a>) -> Result<&'a [u8]> {
    let n = r.u32()? as usize;
    Ok(r.bytes(n)?)
}

/// A snapshot's `n u64 | (id u64 | len u32 | bytes)*` section. The count
/// is bounded by the bytes left (12 bytes per entry at least), so a lying
/// count cannot make the reader reserve memory.
fn entries(r: &mut ByteReader<'_>, what: &str) -> Result<Vec<(u64, Vec<u8>)>> {
    let n = r.u64()?;
    if n > r.remaining() as u64 / 12 {
        return Err(DbError::corrupted(format!(
            "point store snapshot: {what} count {n} exceeds the file"
        )));
    }
    let mut out = Vec::with_capacity(n as usize);
    for _ in 0..n {
        let id = r.u64()?;
        out.push((id, get_bytes(r)?.to_vec()));
    }
    Ok(out)
}

fn kind_code(k: IndexKind) -> u8 {
    match k {
        IndexKind::Keyword => 1,
        IndexKind::Integer => 2,
    }
}

fn kind_of(code: u8) -> Result<IndexKind> {
    match code {
        1 => Ok(IndexKind::Keyword),
        2 => Ok(IndexKind::Integer),
        c => Err(DbError::corrupted(format!("point store: index kind {c}"))),
    }
}

fn field_of(b: &[u8]) -> Result<String> {
    String::from_utf8(b.to_vec())
        .map_err(|_| DbError::corrupted("point store: an index field is not UTF-8"))
}

impl Image {
    /// Applies one record of the log.
    pub fn apply_record(&mut self, rec: &[u8]) -> Result<()> {
        let mut r = ByteReader::new(rec);
        match r.u8()? {
            BATCH => {
                self.applied = r.u64()?;
                self.next_internal = r.u64()?;
                self.engine_seq = r.u64()?;
                for _ in 0..r.u32()? {
                    let id = r.u64()?;
                    match r.u8()? {
                        0 => {
                            self.points.remove(&id);
                        }
                        1 => {
                            self.points.insert(id, get_bytes(&mut r)?.to_vec());
                        }
                        t => return Err(DbError::corrupted(format!("point store: row tag {t}"))),
                    }
                }
                // A version-1 batch's ids: the rows carry them.
                for _ in 0..r.u32()? {
                    r.u64()?;
                    get_bytes(&mut r)?;
                }
            }
            INDEX => {
                let field = field_of(get_bytes(&mut r)?)?;
                self.indexes.insert(field, kind_of(r.u8()?)?);
            }
            t => return Err(DbError::corrupted(format!("point store: record kind {t}"))),
        }
        if r.remaining() != 0 {
            return Err(DbError::corrupted(format!(
                "point store: {} bytes after a record",
                r.remaining()
            )));
        }
        Ok(())
    }

    /// Applies a batch not yet written (a compaction's own).
    fn apply_batch(&mut self, b: &Batch<'_>) {
        self.applied = b.applied;
        self.next_internal = b.next_internal;
        self.engine_seq = b.engine_seq;
        for (&id, row) in b.points {
            match row {
                Some(r) => {
                    self.points.insert(id, r.clone());
                }
                None => {
                    self.points.remove(&id);
                }
            }
        }
    }

    /// The snapshot file's bytes.
    pub fn encode_snapshot(&self) -> Vec<u8> {
        let mut out =
            Vec::with_capacity(64 + self.points.values().map(|r| r.len() + 12).sum::<usize>());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        for v in [self.applied, self.next_internal, self.engine_seq] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&(self.indexes.len() as u32).to_le_bytes());
        for (f, &k) in &self.indexes {
            put_bytes(&mut out, f.as_bytes());
            out.push(kind_code(k));
        }
        out.extend_from_slice(&(self.points.len() as u64).to_le_bytes());
        for (&id, row) in &self.points {
            out.extend_from_slice(&id.to_le_bytes());
            put_bytes(&mut out, row);
        }
        // No ids (version 2).
        out.extend_from_slice(&0u64.to_le_bytes());
        push_crc(&mut out, 0);
        out
    }

    /// Parses a snapshot file's bytes.
    pub fn decode_snapshot(bytes: &[u8]) -> Result<Image> {
        let mut r = ByteReader::new(bytes);
        r.magic_version_in(MAGIC, OLDEST_VERSION..=VERSION, "point store snapshot")?;
        // The checksum first: a damaged count must not drive the parse
        // (the magic and version took 12 bytes, so the CRC's 4 are there
        // or the next read fails).
        let mut whole = ByteReader::new(bytes);
        whole.bytes(bytes.len() - 4)?;
        whole.crc_of_preceding("point store snapshot")?;
        let mut r = ByteReader::new(&bytes[r.position()..bytes.len() - 4]);
        let mut img = Image {
            applied: r.u64()?,
            next_internal: r.u64()?,
            engine_seq: r.u64()?,
            ..Image::default()
        };
        for _ in 0..r.u32()? {
            let field = field_of(get_bytes(&mut r)?)?;
            img.indexes.insert(field, kind_of(r.u8()?)?);
        }
        img.points = entries(&mut r, "point")?.into_iter().collect();
        // A version-1 snapshot's ids: the rows carry them.
        entries(&mut r, "id")?;
        if r.remaining() != 0 {
            return Err(DbError::corrupted(
                "point store snapshot: bytes after the ids",
            ));
        }
        Ok(img)
    }
}

/// The store's two files, open for checkpoints.
#[derive(Debug)]
pub struct StoreFiles {
    dir: PathBuf,
    log: Wal,
    snapshot_bytes: u64,
    compactions: u64,
}

/// Reads the snapshot (none: an empty store).
fn read_snapshot(path: &Path) -> Result<(Image, u64)> {
    match std::fs::read(path) {
        Ok(b) => Ok((Image::decode_snapshot(&b)?, b.len() as u64)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok((Image::default(), 0)),
        Err(e) => Err(DbError::io_at(path, e)),
    }
}

fn prefixed(path: &Path, e: DbError) -> DbError {
    match e {
        DbError::Core(vectide_core::Error::Corrupted(m)) => {
            DbError::corrupted(format!("{}: {m}", path.display()))
        }
        e => e,
    }
}

impl StoreFiles {
    /// Opens (or creates) the files in `dir` and returns the state they
    /// hold. A torn last batch is cut (its checkpoint never returned).
    pub fn open(dir: &Path) -> Result<(StoreFiles, Image)> {
        let snap = dir.join(SNAPSHOT_FILE);
        let (mut img, snapshot_bytes) = read_snapshot(&snap).map_err(|e| prefixed(&snap, e))?;
        let log_path = dir.join(LOG_FILE);
        let (log, records) = Wal::open_with(&log_path, SITES)?;
        for rec in &records {
            img.apply_record(rec).map_err(|e| prefixed(&log_path, e))?;
        }
        Ok((
            StoreFiles {
                dir: dir.to_path_buf(),
                log,
                snapshot_bytes,
                compactions: 0,
            },
            img,
        ))
    }

    /// Writes `img` as the snapshot of a store in `dir` that has none yet
    /// (a migration), before the store is opened.
    pub fn create_from(dir: &Path, img: &Image) -> Result<()> {
        let bytes = img.encode_snapshot();
        vectide_core::io::atomic_write(&dir.join(SNAPSHOT_FILE), |w| {
            w.write_all(&bytes).map_err(Into::into)
        })?;
        Ok(())
    }

    /// Makes a checkpoint's batch durable: appended to the log, or, once
    /// the log has outgrown half the snapshot, merged with the snapshot and
    /// the log into a new snapshot.
    pub fn commit(&mut self, batch: &Batch<'_>) -> Result<()> {
        let mut rec = Vec::new();
        batch.encode(&mut rec);
        let grown = self.log.len() + rec.len() as u64;
        if rec.len() > wal::MAX_RECORD || grown > (self.snapshot_bytes / 2).max(COMPACT_MIN) {
            return self.compact(Some(batch));
        }
        self.log.append(&rec)?;
        self.log.sync()?;
        Ok(())
    }

    /// Declares a payload index durably.
    pub fn declare_index(&mut self, field: &str, kind: IndexKind) -> Result<()> {
        let mut rec = vec![INDEX];
        put_bytes(&mut rec, field.as_bytes());
        rec.push(kind_code(kind));
        self.log.append(&rec)?;
        self.log.sync()?;
        Ok(())
    }

    /// Writes the files' state, with `batch` applied, as the new snapshot
    /// and empties the log.
    pub fn compact(&mut self, batch: Option<&Batch<'_>>) -> Result<()> {
        let (mut img, _) = StoreFiles::read(&self.dir)?;
        if let Some(b) = batch {
            img.apply_batch(b);
        }
        let bytes = img.encode_snapshot();
        vectide_core::io::atomic_write(&self.dir.join(SNAPSHOT_FILE), |w| {
            w.write_all(&bytes).map_err(Into::into)
        })?;
        self.snapshot_bytes = bytes.len() as u64;
        self.log.truncate()?;
        self.compactions += 1;
        Ok(())
    }

    /// The state the files in `dir` hold, read without changing them (the
    /// log's torn tail, if any, skipped), with the snapshot's size.
    pub fn read(dir: &Path) -> Result<(Image, u64)> {
        let snap = dir.join(SNAPSHOT_FILE);
        let (mut img, n) = read_snapshot(&snap).map_err(|e| prefixed(&snap, e))?;
        let log_path = dir.join(LOG_FILE);
        let bytes = match std::fs::read(&log_path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(DbError::io_at(&log_path, e)),
        };
        if !bytes.is_empty() {
            let s = wal::scan(&log_path, &bytes)?;
            if let Some(bad) = s.bad.as_ref().filter(|b| b.next_valid.is_some()) {
                return Err(wal::damaged(&log_path, bad, "").into());
            }
            for rec in s.payloads(&bytes) {
                img.apply_record(rec).map_err(|e| prefixed(&log_path, e))?;
            }
        }
        Ok((img, n))
    }

    /// Bytes of the two files.
    pub fn bytes(&self) -> u64 {
        self.snapshot_bytes + self.log.len()
    }

    /// Compactions since the open.
    pub fn compactions(&self) -> u64 {
        self.compactions
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image() -> Image {
        let mut img = Image {
            applied: 9,
            next_internal: 4,
            engine_seq: 7,
            ..Image::default()
        };
        img.points.insert(0, b"row0".to_vec());
        img.points.insert(3, b"row three".to_vec());
        img.indexes.insert("tag".into(), IndexKind::Keyword);
        img
    }

    #[test]
    fn snapshots_round_trip_and_every_damage_is_an_error() {
        let img = image();
        let bytes = img.encode_snapshot();
        assert_eq!(Image::decode_snapshot(&bytes).unwrap(), img);
        for cut in 0..bytes.len() {
            assert!(Image::decode_snapshot(&bytes[..cut]).is_err(), "cut {cut}");
        }
        for at in 0..bytes.len() {
            let mut b = bytes.clone();
            b[at] ^= 0x10;
            let e = Image::decode_snapshot(&b).unwrap_err();
            assert!(
                e.is_corrupted() || matches!(e, DbError::Core(vectide_core::Error::Version { .. })),
                "byte {at}: {e}"
            );
        }
    }

    /// A version-1 snapshot (every id ever assigned in its `ids` section)
    /// and a version-1 batch (the ids of the points it added) are read;
    /// their ids are dropped, the rows carry the live points' ids.
    #[test]
    fn version_1_files_are_read_and_their_ids_dropped() {
        let img = image();
        let mut v1 = img.encode_snapshot();
        v1.truncate(v1.len() - 12); // the empty ids section and the CRC
        v1[8..12].copy_from_slice(&1u32.to_le_bytes());
        v1.extend_from_slice(&2u64.to_le_bytes());
        for (id, ext) in [(0u64, &b"a"[..]), (5, b"gone")] {
            v1.extend_from_slice(&id.to_le_bytes());
            put_bytes(&mut v1, ext);
        }
        push_crc(&mut v1, 0);
        assert_eq!(Image::decode_snapshot(&v1).unwrap(), img);
        let mut rec = Vec::new();
        Batch {
            applied: 10,
            next_internal: 6,
            engine_seq: 8,
            points: &[(6, Some(b"six".to_vec()))].into_iter().collect(),
        }
        .encode(&mut rec);
        rec.truncate(rec.len() - 4);
        rec.extend_from_slice(&1u32.to_le_bytes());
        rec.extend_from_slice(&6u64.to_le_bytes());
        put_bytes(&mut rec, b"ext6");
        let mut got = img.clone();
        got.apply_record(&rec).unwrap();
        assert_eq!(got.points[&6], b"six");
        assert_eq!((got.applied, got.next_internal), (10, 6));
        // A newer version is refused by name.
        let mut v3 = img.encode_snapshot();
        v3[8..12].copy_from_slice(&3u32.to_le_bytes());
        assert!(matches!(
            Image::decode_snapshot(&v3),
            Err(DbError::Core(vectide_core::Error::Version {
                found: 3,
                supported: 2
            }))
        ));
    }

    #[test]
    fn batches_append_then_compact_and_a_reopen_sees_the_same_state() {
        let dir = tempfile::tempdir().unwrap();
        let (mut f, img) = StoreFiles::open(dir.path()).unwrap();
        assert_eq!(img, Image::default());
        let mut want = Image::default();
        let mut compacted = false;
        for round in 0..400u64 {
            let mut points = HashMap::new();
            for i in 0..50u64 {
                let id = (round * 7 + i) % 300;
                if (round + i) % 5 == 0 {
                    points.insert(id, None);
                } else {
                    points.insert(id, Some(vec![round as u8; 100]));
                }
            }
            let b = Batch {
                applied: round + 1,
                next_internal: 300,
                engine_seq: round,
                points: &points,
            };
            want.apply_batch(&b);
            f.commit(&b).unwrap();
            if round == 10 {
                f.declare_index("tag", IndexKind::Integer).unwrap();
                want.indexes.insert("tag".into(), IndexKind::Integer);
            }
            compacted |= f.compactions() > 0;
            // The log never outgrows half the last snapshot (or the floor).
            let snap = std::fs::metadata(dir.path().join(SNAPSHOT_FILE)).map_or(0, |m| m.len());
            assert!(
                f.bytes() <= snap + (snap / 2).max(COMPACT_MIN) + wal::HEADER as u64,
                "round {round}: {} bytes beside a snapshot of {snap}",
                f.bytes()
            );
        }
        assert!(compacted, "no compaction in 400 batches");
        drop(f);
        let (_, img) = StoreFiles::open(dir.path()).unwrap();
        assert_eq!(img, want);
    }

    #[test]
    fn a_crash_between_the_new_snapshot_and_the_emptied_log_replays_to_the_same_state() {
        let dir = tempfile::tempdir().unwrap();
        let (mut f, _) = StoreFiles::open(dir.path()).unwrap();
        let mut want = Image::default();
        for round in 0..20u64 {
            let points: HashMap<u64, Option<Vec<u8>>> = (0..10u64)
                .map(|i| {
                    let id = (round + i) % 13;
                    (id, (i % 3 != 0).then(|| vec![round as u8; 8]))
                })
                .collect();
            let b = Batch {
                applied: round + 1,
                next_internal: 13,
                engine_seq: round + 1,
                points: &points,
            };
            want.apply_batch(&b);
            f.commit(&b).unwrap();
        }
        assert_eq!(f.compactions(), 0);
        let log = std::fs::read(dir.path().join(LOG_FILE)).unwrap();
        f.compact(None).unwrap();
        drop(f);
        // The old log back beside the new snapshot.
        std::fs::write(dir.path().join(LOG_FILE), &log).unwrap();
        assert_eq!(StoreFiles::open(dir.path()).unwrap().1, want);
    }

    #[test]
    fn mutated_files_never_panic() {
        let dir = tempfile::tempdir().unwrap();
        let (mut f, _) = StoreFiles::open(dir.path()).unwrap();
        f.compact(None).unwrap();
        let points: HashMap<u64, Option<Vec<u8>>> =
            [(1, Some(b"x".to_vec())), (2, None)].into_iter().collect();
        f.commit(&Batch {
            applied: 3,
            next_internal: 3,
            engine_seq: 0,
            points: &points,
        })
        .unwrap();
        f.declare_index("k", IndexKind::Keyword).unwrap();
        drop(f);
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for name in [SNAPSHOT_FILE, LOG_FILE] {
            let path = dir.path().join(name);
            let good = std::fs::read(&path).unwrap();
            for _ in 0..300 {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let mut b = good.clone();
                let at = (seed as usize) % b.len();
                b[at] = (seed >> 32) as u8;
                let cut = (seed >> 20) as usize % (b.len() + 1);
                b.truncate(cut.max(at + 1));
                std::fs::write(&path, &b).unwrap();
                // An error or a state, never a panic.
                let _ = StoreFiles::read(dir.path());
                let _ = StoreFiles::open(dir.path());
            }
            std::fs::write(&path, &good).unwrap();
        }
    }
}
