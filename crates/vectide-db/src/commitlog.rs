//! A collection's write-ahead log: segment files with group commit.
//!
//! Segments are `wal/<first seq, 20 digits>.log` in the WAL format of
//! `docs/format-wal.md` (header, then `len | crc32 | payload` records). Every
//! record's payload starts with its sequence number (u64), so replay can skip
//! what engines and the payload store already hold.
//!
//! **Group commit.** Writers append records to a shared buffer under a lock
//! and then wait for a flush that covers their record. The first waiter
//! without a flush in progress leads: it writes the buffer and `fdatasync`s
//! once for every record in it, outside the lock; the others wait on a
//! condition variable. Writers that append while a flush runs are covered
//! by the next one, so concurrent writers share syncs in both modes.
//! In `group` mode the leader also waits, before flushing, for as many
//! writers as the previous flush covered (or as are waiting now) to append,
//! up to the window (a few milliseconds): a lone writer never waits, a busy
//! collection batches more per sync. In `always` mode the leader flushes at
//! once. In both modes a writer returns only after an `fdatasync` that
//! started after its record was appended.
//!
//! **Rotation and truncation.** The leader starts a new segment when the
//! active one exceeds the segment size; `truncate_through(seq)` deletes the
//! closed segments whose records all have sequence numbers `<= seq` (after a
//! checkpoint made them redundant), oldest first, syncing the directory
//! after each: a crash leaves a prefix of them removed. With one sync after
//! all of them, a crash could undo some removals and keep others, and the
//! log would show a gap between segments, which open rejects as lost
//! records (the crash kit found it on `db:flat`).

use crate::error::{DbError, Result};
use parking_lot::{Condvar, Mutex};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use vectide_core::sync::{sync_dir, sync_file, sync_point, SyncKind, SyncSite};
use vectide_core::Seq;
use vectide_storage::wal::{frame, header_bytes, scan, Scan, HEADER};

/// Sync site of a new segment (its header, then its directory entry).
pub const SYNC_CREATE: SyncSite = SyncSite("db.commitlog.create");
/// Sync site of the directory after a new segment was created.
pub const SYNC_CREATE_DIR: SyncSite = SyncSite("db.commitlog.create.dir");
/// Sync site of a group commit's `fdatasync`.
pub const SYNC_COMMIT: SyncSite = SyncSite("db.commitlog.sync");
/// Sync site of the cut of the last segment's torn tail at open.
pub const SYNC_CUT: SyncSite = SyncSite("db.commitlog.cut");
/// Sync site of [`repair`]'s cut of a damaged log.
pub const SYNC_REPAIR: SyncSite = SyncSite("db.commitlog.repair");
/// Sync site of the directory after [`repair`] removed segments.
pub const SYNC_REPAIR_DIR: SyncSite = SyncSite("db.commitlog.repair.dir");
/// Sync site of the directory after a checkpoint deleted segments.
pub const SYNC_TRUNCATE_DIR: SyncSite = SyncSite("db.commitlog.truncate.dir");

/// When an acknowledged write is durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// `fdatasync` per operation (no waiting for others).
    Always,
    /// Concurrent writers share one `fdatasync` within the window.
    Group { window: Duration },
}

impl Durability {
    /// The default: group commit with a 2 ms window.
    pub const DEFAULT: Durability = Durability::Group {
        window: Duration::from_millis(2),
    };

    /// Parses `"always"` or `"group"`.
    pub fn parse(s: &str) -> Result<Durability> {
        match s {
            "always" => Ok(Durability::Always),
            "group" => Ok(Durability::DEFAULT),
            other => Err(DbError::invalid(format!(
                "durability must be \"always\" or \"group\", got {other:?}"
            ))),
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Durability::Always => "always",
            Durability::Group { .. } => "group",
        }
    }
}

struct Segment {
    first: Seq,
    path: PathBuf,
}

struct State {
    /// Records appended and not yet written.
    buf: Vec<u8>,
    /// Highest sequence number appended / made durable.
    appended: Seq,
    synced: Seq,
    flushing: bool,
    /// Writers waiting for a flush (the leader's window ends early when they
    /// are all in).
    waiting: usize,
    /// Records the last flush covered (how many the next leader waits for).
    last_batch: u64,
    /// A group-commit leader waits for appends (they notify `joined`).
    leader_waiting: bool,
    active: Arc<File>,
    /// The path of `active` (its sync point names it).
    active_path: Arc<Path>,
    active_len: u64,
    segments: Vec<Segment>,
    /// Bytes written since the last checkpoint.
    since_checkpoint: u64,
    syncs: u64,
    /// Group-commit windows a leader waited in.
    windows: u64,
    failed: Option<String>,
}

/// The write-ahead log of one collection.
pub struct CommitLog {
    dir: PathBuf,
    durability: Durability,
    segment_bytes: u64,
    state: Mutex<State>,
    flushed: Condvar,
    joined: Condvar,
    /// Held through a whole [`CommitLog::truncate_through`]: two at once
    /// (the background checkpoint and a flush) could delete out of order.
    truncating: Mutex<()>,
}

fn segment_name(first: Seq) -> String {
    format!("{first:020}.log")
}

fn create_segment(dir: &Path, first: Seq) -> Result<(File, PathBuf)> {
    let path = dir.join(segment_name(first));
    let mut f = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(&path)
        .map_err(|e| DbError::io_at(&path, e))?;
    f.write_all(&header_bytes())
        .map_err(|e| DbError::io_at(&path, e))?;
    sync_file(&f, &path, SYNC_CREATE, false)?;
    sync_dir(dir, SYNC_CREATE_DIR)?;
    Ok((f, path))
}

/// The sequence number a record payload starts with.
pub fn record_seq(payload: &[u8]) -> Result<Seq> {
    vectide_storage::durable::record::seq_of(payload)
        .map_err(|_| DbError::corrupted("WAL record shorter than its sequence number"))
}

/// The first sequence numbers of the segment files in `dir`, ascending.
fn segment_firsts(dir: &Path) -> Result<Vec<Seq>> {
    let mut firsts: Vec<Seq> = std::fs::read_dir(dir)
        .map_err(|e| DbError::io_at(dir, e))?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            n.strip_suffix(".log").and_then(|s| s.parse::<Seq>().ok())
        })
        .collect();
    firsts.sort_unstable();
    Ok(firsts)
}

/// Scans one segment and checks it: no bad record unless it is the torn
/// tail of the last segment, and sequence numbers that start at the
/// segment's name and continue the previous segment's without a gap.
fn read_segment(
    path: &Path,
    bytes: &[u8],
    first: Seq,
    expect: &mut Option<Seq>,
    last: bool,
) -> Result<Scan> {
    let s = scan(path, bytes)?;
    if let Some(bad) = &s.bad {
        if bad.next_valid.is_some() {
            return Err(vectide_storage::wal::damaged(path, bad, "").into());
        }
        if !last {
            return Err(
                vectide_storage::wal::damaged(path, bad, ", and later segments follow it").into(),
            );
        }
    }
    if s.torn_header && !last {
        return Err(DbError::corrupted(format!(
            "{}: header cut short, and later segments follow it",
            path.display()
        )));
    }
    if let Some(want) = *expect {
        if first != want {
            return Err(DbError::corrupted(format!(
                "{}: the previous segment ends at sequence number {}, this one starts at {first}: records are missing; run `vectide repair`",
                path.display(),
                want - 1
            )));
        }
    }
    let mut next = first;
    for (off, r) in &s.records {
        let seq = record_seq(&bytes[r.clone()])?;
        if seq != next {
            return Err(DbError::corrupted(format!(
                "{}: record at byte {off} has sequence number {seq}, expected {next}; run `vectide repair`",
                path.display()
            )));
        }
        next += 1;
    }
    *expect = Some(next);
    Ok(s)
}

/// What [`repair`] found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RepairReport {
    /// The damaged segment and the offset of the first bad record, with the
    /// reason; `None` when the log was sound.
    pub damage: Option<(PathBuf, u64, String)>,
    /// The last sequence number kept.
    pub kept_through: Seq,
    /// Readable records after the damage that were dropped: their count
    /// and sequence-number range.
    pub dropped_records: usize,
    pub dropped_seqs: Option<(Seq, Seq)>,
    /// Bytes removed (the damaged segment's tail and later segments).
    pub dropped_bytes: u64,
    /// Later segment files deleted.
    pub removed_segments: Vec<PathBuf>,
}

/// Every readable record from `at` on, resynchronising past bad bytes:
/// what a repair reports as dropped.
fn salvage_from(bytes: &[u8], mut at: usize) -> Vec<Seq> {
    let mut out = Vec::new();
    while at + 8 <= bytes.len() {
        match vectide_storage::wal::frame_at(bytes, at) {
            Ok(r) => {
                if let Ok(seq) = record_seq(&bytes[r.clone()]) {
                    out.push(seq);
                }
                at = r.end;
            }
            Err(_) => at += 1,
        }
    }
    out
}

/// Cuts the log in `dir` at its first damage (see [`CommitLog::open`]): the
/// damaged segment is truncated before the bad record and every later
/// segment deleted. Returns what was dropped; a sound log is left as it is.
pub fn repair(dir: &Path) -> Result<RepairReport> {
    let mut rep = RepairReport::default();
    if !dir.exists() {
        return Ok(rep);
    }
    let firsts = segment_firsts(dir)?;
    let mut expect = None;
    let mut damaged_at = None;
    for (i, &first) in firsts.iter().enumerate() {
        let path = dir.join(segment_name(first));
        let bytes = std::fs::read(&path).map_err(|e| DbError::io_at(&path, e))?;
        let last = i + 1 == firsts.len();
        let before = expect;
        match read_segment(&path, &bytes, first, &mut expect, last) {
            Ok(s) => {
                if let Some((_, r)) = s.records.last() {
                    rep.kept_through = record_seq(&bytes[r.clone()])?;
                }
            }
            Err(e @ DbError::Core(vectide_core::Error::Version { .. })) => return Err(e),
            Err(e) => {
                // Keep the records that precede the damage in this segment.
                let s = scan(&path, &bytes).unwrap_or_default();
                let mut keep = HEADER as u64;
                let mut next = before.unwrap_or(first);
                if before.is_none_or(|b| b == first) {
                    for (off, r) in &s.records {
                        if record_seq(&bytes[r.clone()]).ok() != Some(next) {
                            break;
                        }
                        keep = off + 8 + r.len() as u64;
                        rep.kept_through = next;
                        next += 1;
                    }
                }
                rep.damage = Some((path.clone(), keep, e.to_string()));
                damaged_at = Some((i, path, bytes, keep));
                break;
            }
        }
    }
    let Some((i, path, bytes, keep)) = damaged_at else {
        return Ok(rep);
    };
    let mut dropped = salvage_from(&bytes, keep as usize);
    rep.dropped_bytes += bytes.len() as u64 - keep;
    // A damaged segment that keeps nothing goes too, unless it is the first
    // (then it stays, emptied, and names where the log resumes): emptied
    // but kept after others, its name would leave a gap behind the cut.
    let remove_damaged = keep == HEADER as u64 && i > 0;
    for &first in &firsts[i + 1..] {
        let p = dir.join(segment_name(first));
        let b = std::fs::read(&p).map_err(|e| DbError::io_at(&p, e))?;
        dropped.extend(salvage_from(&b, HEADER.min(b.len())));
        rep.dropped_bytes += b.len() as u64;
        std::fs::remove_file(&p).map_err(|e| DbError::io_at(&p, e))?;
        rep.removed_segments.push(p);
    }
    if remove_damaged {
        std::fs::remove_file(&path).map_err(|e| DbError::io_at(&path, e))?;
        rep.removed_segments.push(path.clone());
    }
    // The removals are durable before the cut: a crash between leaves the
    // damage in place (the next repair finds it again), never a cut segment
    // followed by one that should be gone.
    sync_dir(dir, SYNC_REPAIR_DIR)?;
    rep.dropped_records = dropped.len();
    rep.dropped_seqs = dropped
        .iter()
        .min()
        .zip(dropped.iter().max())
        .map(|(a, b)| (*a, *b));
    if remove_damaged {
        return Ok(rep);
    }
    let f = OpenOptions::new()
        .write(true)
        .open(&path)
        .map_err(|e| DbError::io_at(&path, e))?;
    if bytes.len() < HEADER || bytes[..8] != header_bytes()[..8] {
        f.set_len(0).map_err(|e| DbError::io_at(&path, e))?;
        (&f).write_all(&header_bytes())
            .map_err(|e| DbError::io_at(&path, e))?;
    } else {
        f.set_len(keep).map_err(|e| DbError::io_at(&path, e))?;
    }
    sync_file(&f, &path, SYNC_REPAIR, false)?;
    Ok(rep)
}

impl CommitLog {
    /// Opens the log in `dir` and returns it with every valid record (their
    /// payloads, oldest first). Only a torn tail of the last segment is cut;
    /// a bad record anywhere else, a segment that ends early, or a gap in the
    /// sequence numbers is [`vectide_core::Error::Corrupted`] naming the segment and
    /// offset (`vectide repair` salvages what precedes it). New records
    /// continue the log's numbers, without a gap (a repair whose engine or
    /// store is ahead of the cut log first fills the numbers between with
    /// void records: [`CommitLog::fill_through`]).
    pub fn open(
        dir: &Path,
        durability: Durability,
        segment_bytes: u64,
    ) -> Result<(CommitLog, Vec<Vec<u8>>)> {
        std::fs::create_dir_all(dir).map_err(|e| DbError::io_at(dir, e))?;
        let firsts = segment_firsts(dir)?;
        let mut records = Vec::new();
        let mut segments = Vec::new();
        let mut cut = None;
        let mut expect: Option<Seq> = None;
        for (i, &first) in firsts.iter().enumerate() {
            let path = dir.join(segment_name(first));
            let bytes = std::fs::read(&path).map_err(|e| DbError::io_at(&path, e))?;
            let last = i + 1 == firsts.len();
            let s = read_segment(&path, &bytes, first, &mut expect, last)?;
            if s.end < bytes.len() as u64 || s.torn_header {
                cut = Some((path.clone(), s.end.max(HEADER as u64), s.torn_header));
            }
            records.extend(s.payloads(&bytes).map(<[u8]>::to_vec));
            segments.push(Segment { first, path });
        }
        // Every check passed: now cut the torn tail of the last segment.
        if let Some((path, end, torn_header)) = cut {
            let mut f = OpenOptions::new()
                .write(true)
                .open(&path)
                .map_err(|e| DbError::io_at(&path, e))?;
            if torn_header {
                f.set_len(0).map_err(|e| DbError::io_at(&path, e))?;
                f.write_all(&header_bytes())
                    .map_err(|e| DbError::io_at(&path, e))?;
            } else {
                f.set_len(end).map_err(|e| DbError::io_at(&path, e))?;
            }
            sync_file(&f, &path, SYNC_CUT, false)?;
        }
        let log_last = match records.last() {
            Some(r) => record_seq(r)?,
            None => firsts.last().map_or(0, |f| f.saturating_sub(1)),
        };
        let last_seq = log_last;
        // Append to the last segment (its torn tail is cut), so that an open
        // leaves no new file behind; a new segment only when there is none.
        let (active, path, first) = match segments.pop() {
            Some(seg) => {
                let f = OpenOptions::new()
                    .append(true)
                    .open(&seg.path)
                    .map_err(|e| DbError::io_at(&seg.path, e))?;
                (f, seg.path, seg.first)
            }
            None => {
                let (f, p) = create_segment(dir, last_seq + 1)?;
                (f, p, last_seq + 1)
            }
        };
        let active_len = active
            .metadata()
            .map_err(|e| DbError::io_at(&path, e))?
            .len();
        let active_path = Arc::from(path.as_path());
        segments.push(Segment { first, path });
        Ok((
            CommitLog {
                dir: dir.to_path_buf(),
                durability,
                segment_bytes: segment_bytes.max(4096),
                state: Mutex::new(State {
                    buf: Vec::new(),
                    appended: last_seq,
                    synced: last_seq,
                    flushing: false,
                    waiting: 0,
                    last_batch: 0,
                    leader_waiting: false,
                    active: Arc::new(active),
                    active_path,
                    active_len,
                    segments,
                    since_checkpoint: 0,
                    syncs: 0,
                    windows: 0,
                    failed: None,
                }),
                flushed: Condvar::new(),
                joined: Condvar::new(),
                truncating: Mutex::new(()),
            },
            records,
        ))
    }

    /// Appends `void(seq)` for every number from the next one through
    /// `through` and makes them durable: after a repair cut the log at K
    /// while the engine or the point store holds operations through D > K,
    /// the log goes on from K + 1 with records that carry no operation, so
    /// that its numbers stay contiguous (an open refuses a gap) and the next
    /// real operation is numbered D + 1, above what both sides hold. A crash
    /// part-way leaves a shorter contiguous run, which the next repair
    /// continues. Returns how many it appended.
    pub fn fill_through(&self, through: Seq, void: impl Fn(Seq) -> Vec<u8>) -> Result<u64> {
        let mut appended = 0;
        while self.last_seq() < through {
            let mut last = 0;
            for _ in 0..4096 {
                let (seq, ()) = self.append(|seq| Ok((void(seq), ())))?;
                appended += 1;
                last = seq;
                if seq >= through {
                    break;
                }
            }
            self.commit(last)?;
        }
        Ok(appended)
    }

    /// The durability mode.
    pub fn durability(&self) -> Durability {
        self.durability
    }

    /// The sequence number the oldest segment starts at: records before it
    /// were made redundant by a checkpoint.
    pub fn first_seq(&self) -> Seq {
        self.state.lock().segments.first().map_or(1, |s| s.first)
    }

    /// Highest sequence number appended so far.
    pub fn last_seq(&self) -> Seq {
        self.state.lock().appended
    }

    /// Appends a record built by `make(seq)` with the next sequence number,
    /// under the log's lock (so sequence order is append order). Returns the
    /// sequence number; the record is durable after [`CommitLog::commit`].
    pub fn append<T>(&self, make: impl FnOnce(Seq) -> Result<(Vec<u8>, T)>) -> Result<(Seq, T)> {
        let mut st = self.state.lock();
        if let Some(e) = &st.failed {
            return Err(DbError::io_at(
                &self.dir,
                std::io::Error::other(format!("the WAL failed earlier: {e}")),
            ));
        }
        let seq = st.appended + 1;
        let (payload, out) = make(seq)?;
        debug_assert_eq!(record_seq(&payload).ok(), Some(seq));
        frame(&payload, &mut st.buf);
        st.appended = seq;
        if st.leader_waiting {
            self.joined.notify_one();
        }
        Ok((seq, out))
    }

    /// Waits until the record `seq` is durable (see the module docs).
    pub fn commit(&self, seq: Seq) -> Result<()> {
        let mut st = self.state.lock();
        st.waiting += 1;
        let out = loop {
            if let Some(e) = &st.failed {
                break Err(DbError::io_at(&self.dir, std::io::Error::other(e.clone())));
            }
            if st.synced >= seq {
                break Ok(());
            }
            if st.flushing {
                self.flushed.wait(&mut st);
                continue;
            }
            st.flushing = true;
            if let Durability::Group { window } = self.durability {
                // Wait for as many writers as the last flush covered (or as
                // wait now), at most the window; a lone writer never waits.
                let expect = st.last_batch.max(st.waiting as u64);
                if expect > 1 {
                    let until = Instant::now() + window;
                    st.windows += 1;
                    st.leader_waiting = true;
                    while st.appended - st.synced < expect {
                        if self.joined.wait_until(&mut st, until).timed_out() {
                            break;
                        }
                    }
                    st.leader_waiting = false;
                }
            }
            let buf = std::mem::take(&mut st.buf);
            let target = st.appended;
            let file = Arc::clone(&st.active);
            let path = st.active_path.clone();
            drop(st);
            let res = (|| -> std::io::Result<()> {
                (&*file).write_all(&buf)?;
                sync_point(&file, &path, SYNC_COMMIT, SyncKind::Data, File::sync_data)
            })()
            .map_err(DbError::from);
            st = self.state.lock();
            st.flushing = false;
            match res {
                Ok(()) => {
                    st.last_batch = target - st.synced;
                    st.synced = st.synced.max(target);
                    st.active_len += buf.len() as u64;
                    st.since_checkpoint += buf.len() as u64;
                    st.syncs += 1;
                    // Rotate at a clean cut only: nothing appended meanwhile.
                    if st.active_len > self.segment_bytes
                        && st.buf.is_empty()
                        && st.synced == st.appended
                    {
                        if let Err(e) = self.rotate(&mut st) {
                            st.failed = Some(e.to_string());
                        }
                    }
                }
                Err(e) => st.failed = Some(e.to_string()),
            }
            self.flushed.notify_all();
        };
        st.waiting -= 1;
        out
    }

    /// Starts a new segment after everything appended so far (the caller
    /// made it durable).
    fn rotate(&self, st: &mut State) -> Result<()> {
        debug_assert!(st.buf.is_empty() && st.synced == st.appended);
        let first = st.appended + 1;
        let (f, path) = create_segment(&self.dir, first)?;
        st.active = Arc::new(f);
        st.active_path = Arc::from(path.as_path());
        st.active_len = header_bytes().len() as u64;
        st.segments.push(Segment { first, path });
        Ok(())
    }

    /// Bytes made durable since the last checkpoint (counting, after an
    /// open, the tail that open replayed).
    pub fn bytes_since_checkpoint(&self) -> u64 {
        self.state.lock().since_checkpoint
    }

    /// Sets the count of [`CommitLog::bytes_since_checkpoint`] (an open
    /// sets it to the bytes it replayed).
    pub fn set_bytes_since_checkpoint(&self, bytes: u64) {
        self.state.lock().since_checkpoint = bytes;
    }

    /// `fdatasync`s so far.
    pub fn syncs(&self) -> u64 {
        self.state.lock().syncs
    }

    /// How often a group-commit leader waited for others to join.
    pub fn windows(&self) -> u64 {
        self.state.lock().windows
    }

    /// After a checkpoint covering every record `<= seq`: rotates, then
    /// deletes every segment all of whose records are `<= seq`.
    pub fn truncate_through(&self, seq: Seq) -> Result<usize> {
        let _one = self.truncating.lock();
        // Flush what is buffered first, so that rotation has a clean cut.
        let last = self.last_seq();
        self.commit(last)?;
        let mut st = self.state.lock();
        while st.flushing {
            self.flushed.wait(&mut st);
        }
        if !st.buf.is_empty() || st.synced != st.appended {
            // A writer appended in between; its own commit will flush. Keep
            // the active segment and delete only older ones.
        } else if st.active_len > header_bytes().len() as u64 {
            self.rotate(&mut st)?;
        }
        // Segment i holds records first_i ..= first_{i+1} - 1.
        let mut gone = Vec::new();
        for w in st.segments.windows(2) {
            if w[1].first.saturating_sub(1) > seq {
                break;
            }
            gone.push(w[0].path.clone());
        }
        st.since_checkpoint = 0;
        drop(st);
        // Oldest first, each removal durable before the next: a crash
        // leaves a prefix of them removed, never a gap between segments
        // that open would take for lost records. A segment leaves the list
        // only once its removal is durable, so after an error the next
        // checkpoint starts again from the oldest.
        for path in &gone {
            match std::fs::remove_file(path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(DbError::io_at(path, e)),
            }
            sync_dir(&self.dir, SYNC_TRUNCATE_DIR)?;
            self.state.lock().segments.remove(0);
        }
        Ok(gone.len())
    }

    /// Segment files on disk now.
    pub fn segments(&self) -> usize {
        self.state.lock().segments.len()
    }

    /// Bytes of the segments a reader of every record after `seq` needs
    /// (whole segments: the one holding `seq + 1` and every later one).
    pub fn bytes_after(&self, seq: Seq) -> u64 {
        let st = self.state.lock();
        let n = st.segments.len();
        let from = st
            .segments
            .iter()
            .rposition(|s| s.first <= seq.saturating_add(1))
            .unwrap_or(0);
        st.segments[from..]
            .iter()
            .enumerate()
            .map(|(i, s)| {
                if from + i + 1 == n {
                    st.active_len
                } else {
                    std::fs::metadata(&s.path).map_or(0, |m| m.len())
                }
            })
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn rec(seq: Seq, body: &[u8]) -> Vec<u8> {
        use vectide_storage::durable::record::{encode, Kind};
        let mut v = Vec::new();
        encode(&mut v, Kind::Annotate, seq, false, &[], &[]);
        v.extend_from_slice(body);
        v
    }

    #[test]
    fn records_survive_reopen_rotation_and_truncation() {
        let dir = tempfile::tempdir().unwrap();
        let (log, recs) = CommitLog::open(dir.path(), Durability::Always, 4096).unwrap();
        assert!(recs.is_empty());
        for i in 0..100u64 {
            let (seq, ()) = log.append(|s| Ok((rec(s, &[i as u8; 100]), ()))).unwrap();
            assert_eq!(seq, i + 1);
            log.commit(seq).unwrap();
        }
        assert!(log.segments() > 1, "rotated past 4 KiB");
        drop(log);
        let (log, recs) = CommitLog::open(dir.path(), Durability::DEFAULT, 4096).unwrap();
        assert_eq!(recs.len(), 100);
        assert_eq!(record_seq(&recs[99]).unwrap(), 100);
        assert_eq!(log.last_seq(), 100);
        let removed = log.truncate_through(60).unwrap();
        assert!(removed > 0);
        let (seq, ()) = log.append(|s| Ok((rec(s, b"x"), ()))).unwrap();
        log.commit(seq).unwrap();
        drop(log);
        let (_, recs) = CommitLog::open(dir.path(), Durability::DEFAULT, 4096).unwrap();
        let seqs: Vec<Seq> = recs.iter().map(|r| record_seq(r).unwrap()).collect();
        assert_eq!(*seqs.last().unwrap(), 101);
        assert!(seqs[0] <= 61, "records after 60 are kept");
        assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1));
    }

    #[test]
    fn a_crash_during_truncation_leaves_no_gap_between_segments() {
        use vectide_storage::{FileSim, FileSimConfig};
        let root = tempfile::tempdir().unwrap();
        let images = tempfile::tempdir().unwrap();
        let dir = root.path().join("wal");
        let (log, _) = CommitLog::open(&dir, Durability::Always, 4096).unwrap();
        for i in 0..300u64 {
            let (seq, ()) = log.append(|s| Ok((rec(s, &[i as u8; 100]), ()))).unwrap();
            log.commit(seq).unwrap();
        }
        let before = log.segments();
        assert!(before >= 6, "{before} segments");
        // Everything on disk now is durable to the simulator; an image at
        // every sync of the truncation, several draws each.
        let sim = FileSim::new(
            root.path(),
            FileSimConfig {
                seed: 3,
                crash_before: (0..64).collect(),
                images_per_crash: 8,
                image_dir: images.path().to_path_buf(),
                ..FileSimConfig::default()
            },
        )
        .unwrap();
        let opened = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let out = Arc::clone(&opened);
        sim.on_crash(move |img| {
            let r =
                CommitLog::open(&img.dir.join("wal"), Durability::Always, 4096).map(|(_, recs)| {
                    recs.iter()
                        .map(|r| record_seq(r).unwrap())
                        .collect::<Vec<_>>()
                });
            out.lock().push(r.map_err(|e| e.to_string()));
            std::fs::remove_dir_all(&img.dir).unwrap();
        });
        let guard = sim.install();
        let removed = log.truncate_through(250).unwrap();
        drop(guard);
        assert!(removed >= 5, "{removed} segments removed");
        let opened = opened.lock();
        assert!(opened.len() >= 8 * removed, "{} images", opened.len());
        for r in opened.iter() {
            let seqs = r.as_ref().unwrap();
            assert_eq!(seqs.last(), Some(&300));
            assert!(seqs[0] <= 251 && seqs.windows(2).all(|w| w[1] == w[0] + 1));
        }
    }

    #[test]
    fn concurrent_writers_share_fsyncs() {
        let dir = tempfile::tempdir().unwrap();
        let (log, _) = CommitLog::open(dir.path(), Durability::DEFAULT, 1 << 20).unwrap();
        let log = Arc::new(log);
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let log = log.clone();
                std::thread::spawn(move || {
                    for _ in 0..25 {
                        let (seq, ()) = log.append(|s| Ok((rec(s, b"payload"), ()))).unwrap();
                        log.commit(seq).unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(log.last_seq(), 200);
        assert!(log.syncs() < 200, "{} fsyncs for 200 commits", log.syncs());
    }

    #[test]
    fn a_lone_writer_never_waits_for_a_group() {
        let dir = tempfile::tempdir().unwrap();
        let (log, _) = CommitLog::open(dir.path(), Durability::DEFAULT, 1 << 20).unwrap();
        for _ in 0..30 {
            let (seq, ()) = log.append(|s| Ok((rec(s, b"payload"), ()))).unwrap();
            log.commit(seq).unwrap();
        }
        assert_eq!(log.syncs(), 30, "one fsync per sequential commit");
        assert_eq!(log.windows(), 0, "no window opened without concurrency");
    }
}
