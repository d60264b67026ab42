//! Point stores of catalog version 3 and before it was 4: ids and payloads
//! in redb (`points.redb`), read once to migrate them to the store's own
//! files ([`super::files`]), then removed.
//!
//! Tables: `points` (internal id → `seq u64 | ext id | payload JSON`),
//! `ids` (ext id bytes → internal id), `meta` (`applied_seq`,
//! `next_internal`, `engine_seq`), `indexes` (field → `keyword` |
//! `integer`). redb asserts on some damage instead of returning an error,
//! so the read runs under [`crate::guard::catch_corruption`].

use super::files::{Image, StoreFiles, SNAPSHOT_FILE};
use super::IndexKind;
use crate::error::{DbError, Result};
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use std::path::Path;

/// The file of a version-3 point store.
pub const LEGACY_FILE: &str = "points.redb";

/// redb's file format that redb 4.x writes.
const REDB_FILE_FORMAT: u32 = 3;

pub(crate) const POINTS: TableDefinition<u64, &[u8]> = TableDefinition::new("points");
pub(crate) const IDS: TableDefinition<&[u8], u64> = TableDefinition::new("ids");
pub(crate) const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
pub(crate) const INDEXES: TableDefinition<&str, &str> = TableDefinition::new("indexes");

/// A table of the store, `None` if it was never created.
fn table<K: redb::Key + 'static, V: redb::Value + 'static>(
    r: &redb::ReadTransaction,
    def: TableDefinition<K, V>,
) -> Result<Option<redb::ReadOnlyTable<K, V>>> {
    match r.open_table(def) {
        Ok(t) => Ok(Some(t)),
        Err(redb::TableError::TableDoesNotExist(_)) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Reads a version-3 store's state.
fn read(path: &Path) -> Result<Image> {
    let db = match Database::open(path) {
        Ok(db) => db,
        Err(redb::DatabaseError::UpgradeRequired(found)) => {
            return Err(DbError::Core(vectide_core::Error::Version {
                found: found.into(),
                supported: REDB_FILE_FORMAT,
            }))
        }
        Err(e) => return Err(e.into()),
    };
    let r = db.begin_read()?;
    let mut img = Image::default();
    if let Some(t) = table(&r, POINTS)? {
        for item in t.iter()? {
            let (k, v) = item?;
            img.points.insert(k.value(), v.value().to_vec());
        }
    }
    if let Some(meta) = table(&r, META)? {
        img.applied = meta.get("applied_seq")?.map_or(0, |g| g.value());
        img.engine_seq = meta.get("engine_seq")?.map_or(0, |g| g.value());
        img.next_internal = meta.get("next_internal")?.map_or(0, |g| g.value());
    }
    // The rows carry the live points' ids; the table's other entries (the
    // deleted points', kept by that version) only bound the numbers used.
    if let Some(t) = table(&r, IDS)? {
        for item in t.iter()? {
            let (_, v) = item?;
            img.next_internal = img.next_internal.max(v.value().saturating_add(1));
        }
    }
    if let Some(t) = table(&r, INDEXES)? {
        for item in t.iter()? {
            let (k, v) = item?;
            img.indexes
                .insert(k.value().to_string(), IndexKind::parse(v.value())?);
        }
    }
    Ok(img)
}

/// Migrates a version-3 store in `dir`, if there is one: its state becomes
/// the snapshot of the new files, then `points.redb` is removed. A crash
/// after the snapshot's rename leaves both: the snapshot wins and the old
/// file goes at the next open. Returns whether a store was migrated.
pub fn migrate(dir: &Path) -> Result<bool> {
    let path = dir.join(LEGACY_FILE);
    if !path.exists() {
        return Ok(false);
    }
    if !dir.join(SNAPSHOT_FILE).exists() {
        let img = crate::guard::catch_corruption(&path.display().to_string(), || read(&path))?;
        StoreFiles::create_from(dir, &img)?;
    }
    std::fs::remove_file(&path).map_err(|e| DbError::io_at(&path, e))?;
    vectide_core::io::sync_dir(dir)?;
    Ok(true)
}
