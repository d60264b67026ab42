//! A write-ahead log: length- and CRC-framed records appended to one file
//! (`docs/format-wal.md`).
//!
//! ```text
//! file   := header record*
//! header := "VTDXWAL\0" (8) | version u32 | reserved u32      (16 bytes)
//! record := len u32 | crc32(payload) u32 | payload (len bytes, len >= 1)
//! ```
//!
//! Appends go to an in-memory buffer; [`Wal::sync`] writes it and
//! `fdatasync`s. A record is durable once a `sync` that followed it
//! returned.
//!
//! **Group commit.** [`Wal::pending`] writes the buffer to the file (the
//! page cache) and returns a [`Pending`] ticket instead of syncing: the
//! owner of the log (an engine, under its writer lock) can go on to the
//! next call while the ticket's holder waits, outside that lock, in
//! [`Pending::wait`]. The first waiter that finds no `fdatasync` running
//! leads one, covering every byte written so far; waiters whose bytes it
//! covers return when it ends, the others wait for the next. So writers
//! that arrive while a sync runs share the following one: with 4 threads
//! writing single-point calls, about one sync per 3-4 calls instead of
//! one each. A failed group sync fails every later wait and sync of the
//! log (the kernel may have dropped the unsynced pages: a retry could
//! report success for data that is gone).
//!
//! **Torn tail or damage.** [`scan`] reads the records in order and stops at
//! the first one that is not valid (its length runs past the end of the file
//! or is out of range, or its CRC does not match). What follows decides what
//! that means: if no valid record starts anywhere after it, the bad bytes are
//! a *torn tail* (a crash during the last, never acknowledged write) and
//! [`Wal::open`] cuts them off; if a valid record does follow, the log is
//! *damaged* in the middle, which no crash produces, and opening fails with a
//! [`Error::Corrupted`] naming the file and offset, so that acknowledged
//! records are never dropped silently. A clean truncation at a record
//! boundary cannot be told from a log that simply ended there.
//!
//! **What open writes.** The header of a new or emptied log is synced at
//! once, before any record can follow it. A file system that commits a
//! file's size before its data (ext4 `data=writeback`, xfs) can otherwise
//! leave, after a power loss, a log whose header and unsynced records all
//! read as zeros, which could not be told from a damaged log. With the sync,
//! a crash can leave a zero-filled header only inside `open` itself, with
//! nothing after it: a file holding at most a header's length of zeros, or
//! a prefix of the header, is such a log and is emptied and given its header
//! anew. A zero header with bytes after it is damage. The crash kit's file
//! simulator draws zero-filled tails (`crashfs`), so its mutation check sees
//! this sync matter (test
//! `a_new_logs_header_survives_a_crash_only_because_it_is_synced`).
//! The cut of a torn tail is not synced on its own: the first
//! [`Wal::sync`] after it carries the file's length with the new records,
//! and a crash before that leaves the torn tail, which the next open cuts
//! again (bytes of it past new records still start no valid record, so
//! they are a torn tail too). The mutation check confirmed that sync never
//! mattered (fresh-diskann, 10,000 states).

use parking_lot::{Condvar, Mutex};
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use vectide_core::sync::{sync_file, SyncSite};
use vectide_core::{Error, Result};

/// Sync site of [`Wal::sync`] (appended records become durable).
pub const SYNC_APPEND: SyncSite = SyncSite("wal.append");
/// Sync site of [`Wal::truncate`].
pub const SYNC_TRUNCATE: SyncSite = SyncSite("wal.truncate");

/// Sync site of the header written into a new (or emptied) log at open.
pub const SYNC_CREATE: SyncSite = SyncSite("wal.create");

pub const WAL_MAGIC: &[u8; 8] = b"VTDXWAL\0";
pub const WAL_VERSION: u32 = 1;
/// Bytes of the file header.
pub const HEADER: usize = 16;
/// Largest payload accepted (a record claiming more is treated as torn).
pub const MAX_RECORD: usize = 64 << 20;

/// The 16-byte header every log file starts with.
pub fn header_bytes() -> [u8; HEADER] {
    let mut h = [0u8; HEADER];
    h[..8].copy_from_slice(WAL_MAGIC);
    h[8..12].copy_from_slice(&WAL_VERSION.to_le_bytes());
    h
}

/// Appends one framed record (`len | crc32 | payload`) to `out`.
pub fn frame(payload: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
    out.extend_from_slice(payload);
}

/// Where a log stops being readable, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadRecord {
    /// Byte offset of the first invalid record.
    pub offset: u64,
    /// What is wrong with it.
    pub reason: String,
    /// Offset of the first valid record after it, if any: `Some` means the
    /// log is damaged in the middle, `None` that the bad bytes are a tail.
    pub next_valid: Option<u64>,
}

/// The result of reading a log's bytes without changing them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scan {
    /// `(offset, payload range)` of every valid record before the first bad
    /// one, oldest first.
    pub records: Vec<(u64, std::ops::Range<usize>)>,
    /// End of the valid prefix (where the next record would go).
    pub end: u64,
    /// The first invalid record, if the valid prefix does not reach the end.
    pub bad: Option<BadRecord>,
    /// The header is a prefix of a valid one, or at most a header's length
    /// of zeros (a crash while the file was being created): the log is
    /// empty.
    pub torn_header: bool,
}

impl Scan {
    /// Whether the bad bytes, if any, are only a torn tail.
    pub fn is_clean_or_torn(&self) -> bool {
        self.bad.as_ref().is_none_or(|b| b.next_valid.is_none())
    }

    /// The payloads of the valid records.
    pub fn payloads<'a>(&'a self, bytes: &'a [u8]) -> impl Iterator<Item = &'a [u8]> + 'a {
        self.records.iter().map(move |(_, r)| &bytes[r.clone()])
    }
}

/// The payload range of the valid record at byte `at`, or why there is none.
pub fn frame_at(bytes: &[u8], at: usize) -> std::result::Result<std::ops::Range<usize>, String> {
    let head = bytes
        .get(at..at + 8)
        .ok_or_else(|| format!("{} bytes of a record header", bytes.len() - at))?;
    let n = u32::from_le_bytes(head[..4].try_into().expect("4 bytes")) as usize;
    let crc = u32::from_le_bytes(head[4..].try_into().expect("4 bytes"));
    if n == 0 || n > MAX_RECORD {
        return Err(format!("record length {n} out of range 1..={MAX_RECORD}"));
    }
    let end = at + 8 + n;
    if end > bytes.len() {
        return Err(format!(
            "record of {n} bytes runs {} bytes past the end",
            end - bytes.len()
        ));
    }
    if crc32fast::hash(&bytes[at + 8..end]) != crc {
        return Err(format!("CRC mismatch in a record of {n} bytes"));
    }
    Ok(at + 8..end)
}

/// Reads a whole log file's bytes (see the module docs): the valid records,
/// and where and how the valid prefix ends. Fails only on a bad header.
pub fn scan(path: &Path, bytes: &[u8]) -> Result<Scan> {
    if bytes.len() <= HEADER {
        // A crash inside `Wal::open`, before the header's sync returned:
        // a prefix of the header followed by zeros up to the file's length
        // (none, some or all of the header's bytes reached the disk; a file
        // system that commits sizes before data reads the rest as zeros).
        // Nothing past the header is written before that sync, so a zero
        // header with bytes after it is damage, below.
        let h = header_bytes();
        let reached = bytes.iter().zip(&h).take_while(|(a, b)| a == b).count();
        if reached < HEADER && bytes[reached..].iter().all(|&b| b == 0) {
            return Ok(Scan {
                torn_header: true,
                ..Scan::default()
            });
        }
    }
    if bytes.len() < HEADER || &bytes[..8] != WAL_MAGIC {
        return Err(Error::corrupted(format!(
            "{}: not a Vectide WAL (bad magic)",
            path.display()
        )));
    }
    let v = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
    if v != WAL_VERSION {
        return Err(Error::Version {
            found: v,
            supported: WAL_VERSION,
        });
    }
    let mut out = Scan::default();
    let mut at = HEADER;
    while at < bytes.len() {
        match frame_at(bytes, at) {
            Ok(r) => {
                out.records.push((at as u64, r.clone()));
                at = r.end;
            }
            Err(reason) => {
                // Is there a valid record anywhere after the bad one? Most
                // offsets fail on the length word alone, so this is cheap.
                let next_valid = (at + 1..bytes.len().saturating_sub(8))
                    .find(|&p| frame_at(bytes, p).is_ok())
                    .map(|p| p as u64);
                out.bad = Some(BadRecord {
                    offset: at as u64,
                    reason,
                    next_valid,
                });
                break;
            }
        }
    }
    out.end = at as u64;
    Ok(out)
}

/// The error for a log damaged in the middle.
pub fn damaged(path: &Path, bad: &BadRecord, what: &str) -> Error {
    Error::corrupted(format!(
        "{}: damaged at byte {} ({}){what}; run `vectide repair` to salvage the records before it",
        path.display(),
        bad.offset,
        bad.reason,
    ))
}

/// The sync sites a log reports its syncs under, so that a crash kit can
/// tell one user's log from another's (an engine's redo log from the
/// database's point store).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WalSites {
    pub create: SyncSite,
    pub append: SyncSite,
    pub truncate: SyncSite,
}

impl WalSites {
    /// [`SYNC_CREATE`], [`SYNC_APPEND`], [`SYNC_TRUNCATE`].
    pub const DEFAULT: WalSites = WalSites {
        create: SYNC_CREATE,
        append: SYNC_APPEND,
        truncate: SYNC_TRUNCATE,
    };
}

/// An append-only log file.
#[derive(Debug)]
pub struct Wal {
    path: PathBuf,
    file: Arc<File>,
    sites: WalSites,
    buf: Vec<u8>,
    /// Bytes in the file (synced or at least written).
    len: u64,
    unsynced: u64,
    /// What the group-commit waiters share (module docs).
    group: Arc<Group>,
}

/// The syncs of one log file that concurrent writers share.
#[derive(Debug)]
struct Group {
    file: Arc<File>,
    path: PathBuf,
    site: SyncSite,
    state: Mutex<GroupState>,
    synced_cv: Condvar,
}

#[derive(Debug, Default)]
struct GroupState {
    /// Bytes written to the file over the log's life (truncations do not
    /// lower it), and of those the ones a finished `fdatasync` covers.
    written: u64,
    synced: u64,
    /// A waiter leads an `fdatasync` now.
    flushing: bool,
    /// A sync failed: the log takes no more syncs.
    failed: Option<String>,
    syncs: u64,
}

impl Group {
    /// Records how a sync that covered `target` written bytes ended.
    fn settle(st: &mut GroupState, target: u64, res: &Result<()>) {
        match res {
            Ok(()) => {
                st.synced = st.synced.max(target);
                st.syncs += 1;
            }
            Err(e) => {
                st.failed.get_or_insert(e.to_string());
            }
        }
    }

    fn check(&self, st: &GroupState) -> Result<()> {
        match &st.failed {
            Some(e) => Err(Error::io_at(
                &self.path,
                std::io::Error::other(format!("an earlier sync of the log failed: {e}")),
            )),
            None => Ok(()),
        }
    }
}

/// Releases a group's waiters when its leader unwinds mid-sync.
struct Lead<'a>(&'a Group);

impl Drop for Lead<'_> {
    fn drop(&mut self) {
        let mut st = self.0.state.lock();
        st.flushing = false;
        st.failed.get_or_insert_with(|| "the sync panicked".into());
        self.0.synced_cv.notify_all();
    }
}

/// Bytes of a log written to its file but not yet synced: durable once
/// [`Pending::wait`] returns `Ok` (see the module docs). A clone waits for
/// the same bytes: several callers may wait on one ticket.
#[must_use = "a pending record is durable only after `wait`"]
#[derive(Debug, Clone)]
pub struct Pending {
    group: Arc<Group>,
    upto: u64,
}

impl Pending {
    /// Waits until an `fdatasync` that began after these bytes were
    /// written has ended, leading one when none runs.
    pub fn wait(self) -> Result<()> {
        let g = &*self.group;
        let mut st = g.state.lock();
        loop {
            g.check(&st)?;
            if st.synced >= self.upto {
                return Ok(());
            }
            if st.flushing {
                g.synced_cv.wait(&mut st);
                continue;
            }
            st.flushing = true;
            let target = st.written;
            drop(st);
            // Should the sync panic (an observer's, in tests), the waiters
            // are released with the failure instead of waiting forever.
            let lead = Lead(g);
            let res = sync_file(&g.file, &g.path, g.site, true);
            std::mem::forget(lead);
            st = g.state.lock();
            st.flushing = false;
            Group::settle(&mut st, target, &res);
            g.synced_cv.notify_all();
        }
    }
}

impl Wal {
    /// Opens (or creates) the log and returns it with the payloads of its
    /// valid records, oldest first. A torn tail is cut off; a log damaged in
    /// the middle (a valid record after a bad one) is an error.
    pub fn open(path: &Path) -> Result<(Wal, Vec<Vec<u8>>)> {
        Wal::open_with(path, WalSites::DEFAULT)
    }

    /// [`Wal::open`], the log's syncs reported under `sites`.
    pub fn open_with(path: &Path, sites: WalSites) -> Result<(Wal, Vec<Vec<u8>>)> {
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(|e| Error::io_at(path, e))?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)
            .map_err(|e| Error::io_at(path, e))?;
        let s = scan(path, &bytes)?;
        if let Some(bad) = s.bad.as_ref().filter(|b| b.next_valid.is_some()) {
            return Err(damaged(path, bad, ""));
        }
        let records = s.payloads(&bytes).map(<[u8]>::to_vec).collect();
        let end = if bytes.is_empty() || s.torn_header {
            file.set_len(0).map_err(|e| Error::io_at(path, e))?;
            file.seek(SeekFrom::Start(0))
                .map_err(|e| Error::io_at(path, e))?;
            file.write_all(&header_bytes())
                .map_err(|e| Error::io_at(path, e))?;
            // Synced at once (module docs, "What open writes").
            sync_file(&file, path, sites.create, false)?;
            HEADER as u64
        } else {
            if s.end < bytes.len() as u64 {
                file.set_len(s.end).map_err(|e| Error::io_at(path, e))?;
            }
            s.end
        };
        file.seek(SeekFrom::Start(end))
            .map_err(|e| Error::io_at(path, e))?;
        let file = Arc::new(file);
        let group = Arc::new(Group {
            file: Arc::clone(&file),
            path: path.to_path_buf(),
            site: sites.append,
            state: Mutex::default(),
            synced_cv: Condvar::new(),
        });
        Ok((
            Wal {
                path: path.to_path_buf(),
                file,
                sites,
                buf: Vec::new(),
                len: end,
                unsynced: 0,
                group,
            },
            records,
        ))
    }

    /// Appends a record to the buffer (not yet durable).
    pub fn append(&mut self, payload: &[u8]) -> Result<()> {
        if payload.is_empty() || payload.len() > MAX_RECORD {
            return Err(Error::invalid(format!(
                "WAL record of {} bytes is outside 1..={MAX_RECORD}",
                payload.len()
            )));
        }
        frame(payload, &mut self.buf);
        Ok(())
    }

    /// Bytes appended but not yet written.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// Writes the buffer to the file (the OS page cache: it survives a
    /// process crash, not a power loss) without `fdatasync`.
    pub fn write_out(&mut self) -> Result<()> {
        if !self.buf.is_empty() {
            (&*self.file)
                .write_all(&self.buf)
                .map_err(|e| Error::io_at(&self.path, e))?;
            let n = self.buf.len() as u64;
            self.len += n;
            self.unsynced += n;
            self.buf.clear();
            self.group.state.lock().written += n;
        }
        Ok(())
    }

    /// Writes the buffer to the file and returns the ticket that makes it
    /// durable, shared with other writers' (module docs, "Group commit").
    pub fn pending(&mut self) -> Result<Pending> {
        self.write_out()?;
        let st = self.group.state.lock();
        self.group.check(&st)?;
        Ok(Pending {
            group: Arc::clone(&self.group),
            upto: st.written,
        })
    }

    /// Bytes written since the last [`Wal::sync`] of this handle (buffered
    /// ones included; a group sync through [`Pending`] does not lower it).
    pub fn unsynced(&self) -> u64 {
        self.unsynced + self.buf.len() as u64
    }

    /// Writes the buffer and `fdatasync`s: every record appended so far is
    /// durable when this returns.
    pub fn sync(&mut self) -> Result<()> {
        self.write_out()?;
        self.unsynced = 0;
        let target = {
            let st = self.group.state.lock();
            self.group.check(&st)?;
            st.written
        };
        let res = sync_file(&self.file, &self.path, self.sites.append, true);
        Group::settle(&mut self.group.state.lock(), target, &res);
        res
    }

    /// Drops every record (after a checkpoint made them redundant).
    pub fn truncate(&mut self) -> Result<()> {
        self.buf.clear();
        self.unsynced = 0;
        self.file
            .set_len(HEADER as u64)
            .map_err(|e| Error::io_at(&self.path, e))?;
        (&*self.file)
            .seek(SeekFrom::Start(HEADER as u64))
            .map_err(|e| Error::io_at(&self.path, e))?;
        sync_file(&self.file, &self.path, self.sites.truncate, false)?;
        self.len = HEADER as u64;
        // The dropped records' callers are covered by the checkpoint that
        // made them redundant: their pending waits end.
        let mut st = self.group.state.lock();
        st.synced = st.written;
        self.group.synced_cv.notify_all();
        Ok(())
    }

    /// File size in bytes (written records).
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the log holds no written record.
    pub fn is_empty(&self) -> bool {
        self.len as usize == HEADER && self.buf.is_empty()
    }

    /// `fdatasync`s so far.
    pub fn syncs(&self) -> u64 {
        self.group.state.lock().syncs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_torn_into_a_prefix_and_zeros_opens_as_an_empty_log() {
        // A crash while open wrote the header: part of it reached the
        // disk, the rest of the file's length reads as zeros (the crash
        // kit drew magic + zeros in a spfresh run: "unsupported format
        // version 0").
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("w");
        let h = header_bytes();
        for reached in [0, 3, 8, 12, HEADER - 1] {
            for len in [reached, HEADER] {
                let mut b = h[..reached].to_vec();
                b.resize(len, 0);
                std::fs::write(&p, &b).unwrap();
                let (w, r) = Wal::open(&p).unwrap_or_else(|e| panic!("{reached}/{len}: {e}"));
                assert!(r.is_empty() && w.is_empty());
                drop(w);
                assert_eq!(
                    std::fs::read(&p).unwrap(),
                    h.to_vec(),
                    "header written anew"
                );
            }
        }
        // A zero header with bytes after it is damage, and a whole header
        // with another version is a version error.
        let mut b = vec![0u8; HEADER + 4];
        b[HEADER] = 1;
        std::fs::write(&p, &b).unwrap();
        assert!(Wal::open(&p).is_err());
        let mut b = h.to_vec();
        b[8] = 9;
        std::fs::write(&p, &b).unwrap();
        assert!(matches!(
            Wal::open(&p),
            Err(Error::Version { found: 9, .. })
        ));
    }

    #[test]
    fn records_round_trip_and_torn_tails_are_cut() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("w");
        let (mut w, r) = Wal::open(&p).unwrap();
        assert!(r.is_empty() && w.is_empty());
        w.append(b"one").unwrap();
        assert!(w.append(b"").is_err(), "empty records are refused");
        w.append(b"x").unwrap();
        w.append(&[7u8; 1000]).unwrap();
        assert!(w.buffered() > 1000);
        w.sync().unwrap();
        w.append(b"lost: never synced").unwrap();
        drop(w);
        let (mut w, r) = Wal::open(&p).unwrap();
        assert_eq!(r, vec![b"one".to_vec(), b"x".to_vec(), vec![7u8; 1000]]);
        w.append(b"four").unwrap();
        w.sync().unwrap();
        drop(w);
        // Tear the last record: flip a payload byte, then cut mid-record.
        let mut bytes = std::fs::read(&p).unwrap();
        let n = bytes.len();
        bytes[n - 1] ^= 1;
        std::fs::write(&p, &bytes).unwrap();
        let (w, r) = Wal::open(&p).unwrap();
        assert_eq!(
            r.len(),
            3,
            "the corrupted record and what follows are dropped"
        );
        assert_eq!(
            w.len() as usize,
            n - 12,
            "the file was cut at the torn record"
        );
        drop(w);
        let mut bytes = std::fs::read(&p).unwrap();
        bytes.truncate(bytes.len() - 3);
        std::fs::write(&p, &bytes).unwrap();
        let (mut w, r) = Wal::open(&p).unwrap();
        assert_eq!(r.len(), 2);
        w.truncate().unwrap();
        drop(w);
        let (_, r) = Wal::open(&p).unwrap();
        assert!(r.is_empty());
        // A header cut short or zero-filled by a crash at creation is an
        // empty log; a zero header with bytes past it is damage.
        for torn in [&header_bytes()[..5], &[0u8; 9][..], &[0u8; HEADER][..]] {
            std::fs::write(&p, torn).unwrap();
            let (w, r) = Wal::open(&p).unwrap();
            assert!(r.is_empty() && w.len() as usize == HEADER);
            drop(w);
            assert_eq!(std::fs::read(&p).unwrap(), header_bytes());
        }
        std::fs::write(&p, [0u8; HEADER + 1]).unwrap();
        assert!(matches!(Wal::open(&p), Err(Error::Corrupted(_))));
        std::fs::write(&p, b"garbage garbage garbage").unwrap();
        assert!(matches!(Wal::open(&p), Err(Error::Corrupted(_))));
        let mut bad = WAL_MAGIC.to_vec();
        bad.extend_from_slice(&9u32.to_le_bytes());
        bad.extend_from_slice(&0u32.to_le_bytes());
        std::fs::write(&p, &bad).unwrap();
        assert!(matches!(
            Wal::open(&p),
            Err(Error::Version { found: 9, .. })
        ));
    }

    /// Crash images of a new log taken before its first append is synced,
    /// with the header's own sync ([`SYNC_CREATE`]) simulated or not: how
    /// many of them opening rejects.
    fn new_logs_rejected_after_a_crash(create_synced: bool) -> usize {
        use crate::crashfs::{FileSim, FileSimConfig};
        use parking_lot::Mutex;
        use std::sync::Arc;
        const IMAGES: usize = 48;
        let root = tempfile::tempdir().unwrap();
        let images = tempfile::tempdir().unwrap();
        let sim = FileSim::new(
            root.path(),
            FileSimConfig {
                seed: 5,
                crash_before: [1].into(),
                images_per_crash: IMAGES,
                image_dir: images.path().to_path_buf(),
                ..FileSimConfig::default()
            },
        )
        .unwrap();
        if !create_synced {
            sim.disable(Some(SYNC_CREATE));
        }
        let opened: Arc<Mutex<Vec<Result<usize>>>> = Arc::default();
        let out = Arc::clone(&opened);
        sim.on_crash(move |img| {
            let p = img.dir.join("w");
            // The manifest names the log, so its entry is there whenever
            // the log is; only its bytes can be lost.
            if p.exists() {
                out.lock().push(Wal::open(&p).map(|(_, r)| r.len()));
            }
            std::fs::remove_dir_all(&img.dir).unwrap();
        });
        let _guard = sim.install();
        let path = root.path().join("w");
        let (mut w, _) = Wal::open(&path).unwrap();
        w.append(b"the first record").unwrap();
        w.sync().unwrap();
        let opened = opened.lock();
        assert!(
            opened.len() > IMAGES / 4,
            "{} images kept the log",
            opened.len()
        );
        let mut rejected = 0;
        for r in opened.iter() {
            match r {
                Ok(n) => assert!(*n <= 1, "{n} records"),
                Err(Error::Corrupted(_)) => rejected += 1,
                Err(e) => panic!("unexpected error: {e}"),
            }
        }
        rejected
    }

    #[test]
    fn a_new_logs_header_survives_a_crash_only_because_it_is_synced() {
        assert_eq!(new_logs_rejected_after_a_crash(true), 0);
        assert!(new_logs_rejected_after_a_crash(false) > 0);
    }

    #[test]
    fn a_pending_record_waits_for_a_sync_that_covers_it_and_no_more() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("w");
        let (mut w, _) = Wal::open(&p).unwrap();
        w.append(b"one").unwrap();
        let a = w.pending().unwrap();
        assert_eq!(w.syncs(), 0, "writing out is not syncing");
        w.append(b"two").unwrap();
        let b = w.pending().unwrap();
        a.wait().unwrap();
        assert_eq!(w.syncs(), 1);
        // The sync `a` led began after "two" was written: it covers `b`.
        b.wait().unwrap();
        assert_eq!(w.syncs(), 1, "a covered record waits for nothing");
        w.append(b"three").unwrap();
        let c = w.pending().unwrap();
        w.sync().unwrap();
        c.wait().unwrap();
        assert_eq!(w.syncs(), 2, "a direct sync covers the pending ones");
        w.append(b"four").unwrap();
        let d = w.pending().unwrap();
        w.truncate().unwrap();
        d.wait().unwrap();
        assert_eq!(
            w.syncs(),
            2,
            "a truncation ends the waits of what it dropped"
        );
        drop(w);
        assert!(Wal::open(&p).unwrap().1.is_empty());
    }

    /// Fails each sync under `root` once `fail` is set, counting them.
    #[derive(Default)]
    struct Flaky {
        fail: std::sync::atomic::AtomicBool,
        seen: std::sync::atomic::AtomicU64,
        delay: std::time::Duration,
    }

    impl vectide_core::sync::SyncObserver for Flaky {
        fn on_sync(&self, e: &vectide_core::sync::SyncEvent<'_>) -> vectide_core::SyncDecision {
            use std::sync::atomic::Ordering::Relaxed;
            if e.phase != vectide_core::sync::SyncPhase::Before {
                return vectide_core::SyncDecision::Proceed;
            }
            self.seen.fetch_add(1, Relaxed);
            std::thread::sleep(self.delay);
            if self.fail.load(Relaxed) {
                vectide_core::SyncDecision::Fail
            } else {
                vectide_core::SyncDecision::Proceed
            }
        }
    }

    #[test]
    fn concurrent_writers_share_syncs_and_every_waited_record_is_durable() {
        const THREADS: usize = 4;
        const EACH: usize = 50;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("w");
        let (w, _) = Wal::open(&p).unwrap();
        // A slow disk (2 ms a sync): writers arrive while a sync runs.
        let obs = Arc::new(Flaky {
            delay: std::time::Duration::from_millis(2),
            ..Flaky::default()
        });
        let _g = vectide_core::sync::install_sync_observer(dir.path(), obs.clone());
        let w = Mutex::new(w);
        std::thread::scope(|s| {
            for t in 0..THREADS {
                let w = &w;
                s.spawn(move || {
                    for i in 0..EACH {
                        let pending = {
                            let mut w = w.lock();
                            w.append(format!("{t}:{i}").as_bytes()).unwrap();
                            w.pending().unwrap()
                        };
                        pending.wait().unwrap();
                    }
                });
            }
        });
        let w = w.into_inner();
        let syncs = w.syncs();
        assert_eq!(syncs, obs.seen.load(std::sync::atomic::Ordering::Relaxed));
        assert!(
            syncs <= (THREADS * EACH / 2) as u64,
            "{syncs} syncs for {} writes",
            THREADS * EACH
        );
        drop(w);
        let (_, recs) = Wal::open(&p).unwrap();
        assert_eq!(recs.len(), THREADS * EACH);
    }

    /// Holds the first append sync until the test lets it go.
    struct Gate {
        first: std::sync::atomic::AtomicBool,
        entered: std::sync::Barrier,
        release: std::sync::Barrier,
    }

    impl vectide_core::sync::SyncObserver for Gate {
        fn on_sync(&self, e: &vectide_core::sync::SyncEvent<'_>) -> vectide_core::SyncDecision {
            if e.phase == vectide_core::sync::SyncPhase::Before
                && e.site == SYNC_APPEND
                && self.first.swap(false, std::sync::atomic::Ordering::SeqCst)
            {
                self.entered.wait();
                self.release.wait();
            }
            vectide_core::SyncDecision::Proceed
        }
    }

    #[test]
    fn a_sync_that_began_before_a_record_was_written_does_not_cover_it() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("w");
        let (w, _) = Wal::open(&p).unwrap();
        let gate = Arc::new(Gate {
            first: true.into(),
            entered: std::sync::Barrier::new(2),
            release: std::sync::Barrier::new(2),
        });
        let _g = vectide_core::sync::install_sync_observer(dir.path(), gate.clone());
        let w = Mutex::new(w);
        let pa = {
            let mut w = w.lock();
            w.append(b"a").unwrap();
            w.pending().unwrap()
        };
        let pb = std::thread::scope(|s| {
            let lead = s.spawn(move || pa.wait());
            gate.entered.wait();
            // The leader's sync has begun; "b" is written after it.
            let pb = {
                let mut w = w.lock();
                w.append(b"b").unwrap();
                w.pending().unwrap()
            };
            gate.release.wait();
            lead.join().unwrap().unwrap();
            pb
        });
        assert_eq!(w.lock().syncs(), 1);
        pb.wait().unwrap();
        assert_eq!(w.lock().syncs(), 2, "\"b\" needed a sync of its own");
    }

    #[test]
    fn a_failed_group_sync_fails_every_later_wait_and_sync() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("w");
        let (mut w, _) = Wal::open(&p).unwrap();
        let obs = Arc::new(Flaky::default());
        let _g = vectide_core::sync::install_sync_observer(dir.path(), obs.clone());
        w.append(b"one").unwrap();
        let a = w.pending().unwrap();
        obs.fail.store(true, std::sync::atomic::Ordering::Relaxed);
        w.append(b"two").unwrap();
        let b = w.pending().unwrap();
        assert!(matches!(a.wait(), Err(Error::Io { .. })));
        obs.fail.store(false, std::sync::atomic::Ordering::Relaxed);
        // The disk works again, but what it lost is unknown: no success.
        let err = b.wait().unwrap_err().to_string();
        assert!(err.contains("an earlier sync of the log failed"), "{err}");
        assert!(w.sync().is_err());
        w.append(b"three").unwrap();
        assert!(w.pending().is_err());
    }

    fn log_of(p: &Path, payloads: &[&[u8]]) -> Vec<u8> {
        let (mut w, _) = Wal::open(p).unwrap();
        for x in payloads {
            w.append(x).unwrap();
        }
        w.sync().unwrap();
        drop(w);
        std::fs::read(p).unwrap()
    }

    #[test]
    fn damage_before_valid_records_is_an_error_not_a_cut() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("w");
        let clean = log_of(&p, &[b"first record", b"second record", b"third record"]);
        // A flipped byte in the first record: valid records follow it.
        let mut bytes = clean.clone();
        bytes[HEADER + 10] ^= 0x40;
        std::fs::write(&p, &bytes).unwrap();
        let err = Wal::open(&p).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, Error::Corrupted(_)), "{msg}");
        assert!(msg.contains(&format!("byte {HEADER}")), "{msg}");
        assert_eq!(
            std::fs::read(&p).unwrap(),
            bytes,
            "a damaged log is left as it is"
        );
        let s = scan(&p, &bytes).unwrap();
        assert_eq!(s.records.len(), 0);
        assert_eq!(
            s.bad.as_ref().unwrap().next_valid,
            Some((HEADER + 8 + 12) as u64)
        );
        // A zeroed length word in the middle: also damage.
        let mut bytes = clean.clone();
        let second = HEADER + 8 + 12;
        bytes[second..second + 4].fill(0);
        std::fs::write(&p, &bytes).unwrap();
        assert!(matches!(Wal::open(&p), Err(Error::Corrupted(_))));
        // Zeros after the last record (a file extended but never written):
        // a torn tail, cut.
        let mut bytes = clean.clone();
        bytes.extend_from_slice(&[0u8; 4096]);
        std::fs::write(&p, &bytes).unwrap();
        let (w, r) = Wal::open(&p).unwrap();
        assert_eq!(r.len(), 3);
        assert_eq!(w.len() as usize, clean.len());
        drop(w);
        // Garbage after the last record: torn, cut.
        let mut bytes = clean.clone();
        bytes.extend((0..300u32).map(|i| (i * 7919 % 251) as u8));
        std::fs::write(&p, &bytes).unwrap();
        let (_, r) = Wal::open(&p).unwrap();
        assert_eq!(r.len(), 3);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(512))]
        /// Fuzz of the log parser: any damage to a log's bytes is read
        /// without a panic, as a prefix of the records written; a cut is
        /// always a torn tail, and damage inside a record that has a record
        /// after it is always found as damage.
        #[test]
        fn damaged_logs_read_as_a_prefix_and_damage_is_told_from_a_torn_tail(
            payloads in proptest::collection::vec(proptest::collection::vec(proptest::prelude::any::<u8>(), 1..40), 1..12),
            at in 0.0f64..1.0,
            kind in 0u8..3,
            garbage in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64),
        ) {
            let mut bytes = header_bytes().to_vec();
            let mut starts = Vec::new();
            for p in &payloads {
                starts.push(bytes.len());
                frame(p, &mut bytes);
            }
            let clean_len = bytes.len();
            let pos = HEADER + ((clean_len - HEADER) as f64 * at) as usize;
            match kind {
                0 => bytes[pos.min(clean_len - 1)] ^= 0x81,
                1 => bytes.truncate(pos),
                _ => bytes.extend_from_slice(&garbage),
            }
            let s = scan(Path::new("fuzz"), &bytes).unwrap();
            let got: Vec<&[u8]> = s.payloads(&bytes).collect();
            proptest::prop_assert!(got.len() <= payloads.len());
            for (g, p) in got.iter().zip(&payloads) {
                proptest::prop_assert_eq!(*g, &p[..]);
            }
            if kind == 2 {
                // Bytes after the last record never hide a record.
                proptest::prop_assert_eq!(got.len(), payloads.len());
            }
            if kind == 1 {
                // A cut never leaves a valid record after the bad bytes.
                proptest::prop_assert!(s.is_clean_or_torn());
            }
            if kind == 0 {
                let hit = starts.iter().rposition(|&st| st <= pos).unwrap();
                proptest::prop_assert_eq!(got.len(), hit);
                if hit + 1 < payloads.len() {
                    proptest::prop_assert!(!s.is_clean_or_torn(), "damage before record {} of {}", hit + 1, payloads.len());
                }
            }
        }
    }
}
