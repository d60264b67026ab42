//! Creating an index directory, and opening one: the snapshot, the block
//! store under its mapping, the centroid index rebuilt from the snapshot's
//! centroids, then every WAL from the snapshot's serial on, replayed
//! (SPFresh §4.4). `vectide inspect` reads the same files.

use crate::blockstore::BlockStore;
use crate::engine::Spfresh;
use crate::layout::decode_map;
use crate::params::{Mode, SpannParams};
use crate::snapshot::{self, Snapshot};
use crate::state::{home_word, wal_file, Inner, Writer, BLOCKS, BLOCK_SYNC, SNAPSHOT};
use crate::versions::VersionMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use vectide_core::{limits, Error, Metric, Params, ParamsExt, Result};
use vectide_storage::block::DirectFile;
use vectide_storage::block::BLOCK;
use vectide_storage::durable::{replay, RedoLog};

/// Cuts a partial block off the end of the block file: blocks appended
/// after the last snapshot's sync may be torn by a crash, and none of them
/// is named by the snapshot. A file shorter than the blocks the snapshot
/// names (`end`: one past the highest) is corruption; one shorter than the
/// snapshot's own `end` is not, since the free blocks at the end are cut
/// off once the snapshot is durable (`BlockStore::snapshot_durable`).
fn trim_torn_tail(path: &Path, end: u32) -> Result<()> {
    let len = std::fs::metadata(path)
        .map_err(|e| Error::io_at(path, e))?
        .len();
    let block = BLOCK as u64;
    let whole = len / block * block;
    if whole < u64::from(end) * block {
        return Err(Error::corrupted(format!(
            "{}: {len} bytes, but the snapshot names blocks up to {end}",
            path.display()
        )));
    }
    if whole != len {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(path)
            .map_err(|e| Error::io_at(path, e))?;
        f.set_len(whole).map_err(|e| Error::io_at(path, e))?;
        vectide_core::sync::sync_file(&f, path, BLOCK_SYNC, false)?;
    }
    Ok(())
}

fn start(inner: Inner) -> Result<Spfresh> {
    let inner = Arc::new(inner);
    // Every mode has background jobs: compaction and the reclaim of vector
    // numbers; splits and merges only `spfresh`.
    if !inner.params.rebuild_inline {
        crate::rebuild::start_background(&inner)?;
    }
    Ok(Spfresh { inner })
}

/// The serials of the WAL files in `dir`, ascending (see [`wal_file`]).
pub fn wal_serials(dir: &Path) -> Vec<u64> {
    let mut out: Vec<u64> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let n = e.file_name().to_string_lossy().to_string();
            n.strip_prefix("wal-")?.strip_suffix(".log")?.parse().ok()
        })
        .collect();
    out.sort_unstable();
    out
}

impl Spfresh {
    /// Creates an empty index of `mode` in `dir` (created if absent; an
    /// index already there is an error).
    pub fn create(
        dir: &Path,
        dim: usize,
        metric: Metric,
        mode: Mode,
        params: SpannParams,
    ) -> Result<Self> {
        limits::check_dim(dim)?;
        if dim > crate::layout::MAX_DIM as usize {
            return Err(Error::invalid(format!(
                "the block store holds vectors of at most {} dimensions, got {dim}",
                crate::layout::MAX_DIM
            )));
        }
        params.validate()?;
        if Self::exists(dir) {
            return Err(Error::invalid(format!(
                "{} already holds a SPANN index: open it instead",
                dir.display()
            )));
        }
        std::fs::create_dir_all(dir).map_err(|e| Error::io_at(dir, e))?;
        // Leftovers of a create that did not finish.
        for s in wal_serials(dir) {
            let _ = std::fs::remove_file(wal_file(dir, s));
        }
        let _ = std::fs::remove_file(dir.join(BLOCKS));
        let file = DirectFile::open(&dir.join(BLOCKS), true, BLOCK_SYNC)?;
        let store = BlockStore::create(Box::new(file), dim)?;
        let wal = match params.external_log {
            true => None,
            false => Some(RedoLog::open(&wal_file(dir, 1), dim)?.0),
        };
        let writer = Writer {
            wal,
            prev: None,
            serial: 1,
            rows: 0,
        };
        let inner = Inner::new(
            dir,
            dim,
            metric,
            mode,
            params,
            store,
            VersionMap::new(),
            writer,
        )?;
        inner.snapshot()?;
        start(inner)
    }

    /// Opens (recovers) the index in `dir`. `overrides` may set `threads`,
    /// `rebuild` and `nprobe` (not stored).
    pub fn open(dir: &Path, overrides: &Params) -> Result<Self> {
        let path = dir.join(SNAPSHOT);
        let bytes = std::fs::read(&path).map_err(|e| Error::io_at(&path, e))?;
        let Snapshot {
            head,
            ext,
            seqs,
            homes,
            versions,
            free,
            centroids,
            map,
            ..
        } = snapshot::decode(&bytes)
            .map_err(|e| Error::corrupted(format!("{}: {e}", path.display())))?;
        let mut params = head.params.clone();
        params.threads = overrides.usize("threads");
        params.rebuild_inline = crate::params::rebuild_inline(overrides);
        params.external_log = vectide_core::engine::log_is_external(overrides);
        if let Some(n) = overrides.usize("nprobe") {
            params.nprobe = n;
        }
        params.validate()?;
        let dim = head.dim;
        let (image, used) = decode_map(&map)?;
        trim_torn_tail(&dir.join(BLOCKS), image.named_end())?;
        let file = DirectFile::open(&dir.join(BLOCKS), false, BLOCK_SYNC)?;
        let store = BlockStore::open(Box::new(file), image)?;
        if used != map.len() || store.dim() != dim {
            return Err(Error::corrupted(
                "snapshot: the block mapping does not match the index",
            ));
        }
        let n = ext.len();
        if homes.len() != n || seqs.len() != n {
            return Err(Error::corrupted(
                "snapshot: id sections of different lengths",
            ));
        }
        let posting_ids = store.posting_ids() as usize;
        for p in 0..posting_ids.max(centroids.len()) {
            let stored = store.entry(p as u32).is_some();
            let has_c = centroids.get(p).is_some_and(Option::is_some);
            if stored != has_c {
                return Err(Error::corrupted(format!(
                    "snapshot: posting {p} is {} but {} a centroid",
                    if stored { "stored" } else { "absent" },
                    if has_c { "has" } else { "has no" }
                )));
            }
        }
        // Every WAL from the snapshot's serial on.
        let serials: Vec<u64> = wal_serials(dir)
            .into_iter()
            .filter(|&s| s >= head.serial)
            .collect();
        if serials.first().is_some_and(|&s| s != head.serial)
            || serials.windows(2).any(|w| w[1] != w[0] + 1)
        {
            return Err(Error::corrupted(format!(
                "the WAL files after snapshot serial {} are not consecutive: {serials:?}",
                head.serial
            )));
        }
        // Their calls, in log order. Under the database (whose commit log
        // is the only log) there are none, unless a standalone index left
        // some: they are replayed all the same.
        let mut calls = Vec::new();
        let mut last = None;
        for &s in &serials {
            let (wal, rec) = RedoLog::open(&wal_file(dir, s), dim)?;
            calls.extend(rec.ops);
            last = Some((wal, s));
        }
        let (wal, serial) = match (last, params.external_log) {
            (_, true) => (None, serials.last().copied().unwrap_or(head.serial)),
            (Some((wal, s)), false) => (Some(wal), s),
            (None, false) => (
                Some(RedoLog::open(&wal_file(dir, head.serial), dim)?.0),
                head.serial,
            ),
        };
        let writer = Writer {
            wal,
            prev: None,
            serial,
            rows: 0,
        };
        let inner = Inner::new(
            dir,
            dim,
            head.metric,
            head.mode,
            params,
            store,
            versions,
            writer,
        )?;
        {
            let mut m = inner.ids.write();
            for (v, &id) in ext.iter().enumerate() {
                if inner.versions.get(v as u32).is_some_and(|s| !s.deleted)
                    && m.ext.insert(id, v as u32).is_some()
                {
                    return Err(Error::corrupted(format!("snapshot: id {id} is live twice")));
                }
            }
            m.of_vid = ext;
            m.seq_of = seqs;
            *inner.free.lock() = free;
            *inner.homes.write() = homes
                .into_iter()
                .enumerate()
                .map(|(v, pid)| {
                    let version = inner.versions.get(v as u32).map_or(0, |s| s.version);
                    AtomicU64::new(home_word(pid, version))
                })
                .collect();
        }
        let mut pids = Vec::new();
        let mut data = Vec::new();
        for (p, c) in centroids.iter().enumerate() {
            if let Some(c) = c {
                pids.push(p as u32);
                data.extend_from_slice(c);
            }
        }
        if !pids.is_empty() {
            inner.heads.add(&pids, &data)?;
        }
        // Every call of those logs follows the snapshot.
        let rows = std::cell::Cell::new(0u64);
        let durable = replay(
            calls,
            head.covered_seq,
            |seq, ids, vectors| {
                rows.set(rows.get() + ids.len() as u64);
                inner.apply_insert(seq, ids, vectors)
            },
            |seq, ids| {
                rows.set(rows.get() + inner.apply_delete(seq, ids) as u64);
                Ok(())
            },
        )?
        .watermark;
        let rows = rows.get();
        // Rows logged since the snapshot, as the live path counts them.
        inner.writer.lock().rows = rows;
        // What the WALs held was synced: durable, whoever logs from now.
        inner.durable.store(durable, Ordering::Release);
        inner.synced.store(durable, Ordering::Release);
        inner.covered.store(durable, Ordering::Release);
        // The changes since the last build: those the snapshot recorded,
        // then those its logs replayed (counted as they were applied).
        // Before, an open counted from nothing, and an index that had a
        // rebuild due before a restart waited for another quarter of
        // changes after it.
        inner.built_at.store(0, Ordering::Relaxed);
        inner.carried.store(head.since_build, Ordering::Relaxed);
        if inner.params.rebuild_inline {
            inner.drain_jobs()?;
        }
        start(inner)
    }

    /// Whether `dir` holds a SPANN-family index.
    pub fn exists(dir: &Path) -> bool {
        Self::mode_at(dir).is_some()
    }

    /// The mode of the index in `dir`, read from its snapshot's header.
    pub fn mode_at(dir: &Path) -> Option<Mode> {
        use std::io::Read;
        let mut head = [0u8; 13];
        std::fs::File::open(dir.join(SNAPSHOT))
            .and_then(|mut f| f.read_exact(&mut head))
            .ok()?;
        (&head[..8] == snapshot::MAGIC)
            .then(|| Mode::from_code(head[12]).ok())
            .flatten()
    }
}

/// `vectide inspect` of a directory: the snapshot, the block store and the
/// WAL files.
pub fn inspect_rows(dir: &Path) -> Result<Vec<(String, String)>> {
    let path = dir.join(SNAPSHOT);
    let bytes = std::fs::read(&path).map_err(|e| Error::io_at(&path, e))?;
    let s = snapshot::decode(&bytes)
        .map_err(|e| Error::corrupted(format!("{}: {e}", path.display())))?;
    let bpath = dir.join(BLOCKS);
    let blen = std::fs::metadata(&bpath)
        .map_err(|e| Error::io_at(&bpath, e))?
        .len();
    let torn = blen % BLOCK as u64;
    let st = if torn == 0 {
        let file = DirectFile::open(&bpath, false, BLOCK_SYNC)?;
        BlockStore::open_encoded(Box::new(file), &s.map)?.0.stats()
    } else {
        // Read-only: the torn tail is cut at the next open, not here.
        let (image, _) = decode_map(&s.map)?;
        crate::blockstore::StoreStats {
            postings: image.postings.iter().flatten().count() as u64,
            blocks_used: image
                .postings
                .iter()
                .flatten()
                .map(|p| p.blocks.len() as u64)
                .sum(),
            blocks_free: image.free.len() as u64,
            blocks_end: u64::from(image.end),
            ..Default::default()
        }
    };
    let h = &s.head;
    let live = (0..s.versions.len())
        .filter(|&v| s.versions.get(v).is_some_and(|x| !x.deleted))
        .count();
    let mut rows: Vec<(String, String)> = vec![
        ("engine".into(), h.mode.engine().into()),
        (
            "snapshot".into(),
            format!("version {} (CRC verified), serial {}", s.version, h.serial),
        ),
        ("metric".into(), h.metric.name().into()),
        ("dim".into(), h.dim.to_string()),
        ("covered_seq".into(), h.covered_seq.to_string()),
        (
            "vectors".into(),
            format!(
                "{live} live of {} numbered, {} free for reuse",
                s.versions.len(),
                s.free.len()
            ),
        ),
        ("postings".into(), st.postings.to_string()),
        (
            "centroids".into(),
            s.centroids.iter().flatten().count().to_string(),
        ),
        (
            "blocks".into(),
            format!(
                "{} used, {} free, {} in the file",
                st.blocks_used, st.blocks_free, st.blocks_end
            ),
        ),
        (
            "block_file".into(),
            if torn == 0 {
                format!("{blen} bytes")
            } else {
                format!("{blen} bytes, a torn tail of {torn} bytes (cut at the next open)")
            },
        ),
        ("replicas".into(), h.params.replicas.to_string()),
        ("posting_pages".into(), h.params.posting_pages.to_string()),
        (
            "changes_since_build".into(),
            if s.version >= 3 {
                h.since_build.to_string()
            } else {
                "not recorded (version 1 or 2)".into()
            },
        ),
        ("nprobe".into(), h.params.nprobe.to_string()),
    ];
    for sv in wal_serials(dir).into_iter().filter(|&x| x >= h.serial) {
        let l = vectide_storage::durable::summarize(&wal_file(dir, sv), h.dim)?;
        rows.push((
            "wal".into(),
            format!(
                "wal-{sv}.log: {} calls, {} bytes{}",
                l.calls,
                l.bytes,
                if l.torn { " (torn tail)" } else { "" }
            ),
        ));
    }
    Ok(rows)
}
