//! [`FileSim`]: the crash simulator of files, the twin of
//! [`crate::SimMedia`] for engines and databases that write ordinary files
//! and make them durable with `fsync` / `fdatasync`.
//!
//! It is a [`SyncObserver`] for one root directory: every sync point of
//! `vectide_core::sync` under the root reaches it. It counts them (in total
//! and by [`SyncSite`]), keeps a model of what is durable, and at chosen sync
//! point numbers — just before that sync takes effect — materialises a
//! *post-crash image* of the whole root into a directory of its own, where a
//! checker can reopen and verify it while the workload goes on. Like
//! `SimMedia` it ships in release builds, for `vectide crash-test`.
//!
//! ## Model
//! **Data.** Per file (per inode), the simulator remembers the length that
//! its last sync made durable: the length the file had when that sync
//! started, recorded when it returned. Of two syncs that overlap, the one
//! that started later decides, whichever returns last (what it covered is
//! durable once it returns). In an image every file holds its
//! current bytes up to that durable length, and its *unsynced tail* (the
//! bytes beyond) is, by a seeded draw, kept whole, dropped, torn (cut at a
//! random 8-byte aligned offset inside it), or zeroed: the file keeps its
//! current length but every byte of the tail reads as zero. The last is what
//! a file system that commits a file's new size before its data leaves
//! after a power loss (ext4 `data=writeback`; xfs shows unwritten extents as
//! zeros): a format that takes a zero-filled header or record for damage
//! must sync it before anything depends on it. A file never synced has a
//! durable length of 0: its whole content is a tail.
//!
//! **Directory entries.** Per directory, the simulator remembers the entries
//! (name → inode) that a sync made durable: an `fsync` of the directory
//! records all of its entries as they were when it started; an `fsync` or
//! `fdatasync` of a file records that file's own entry (ext4, xfs and btrfs
//! commit a new file's name with its first `fsync`; POSIX does not promise
//! it). An entry that differs now from its durable state is drawn
//! independently (seeded): a new name appears or vanishes, a name replaced
//! since (a rename over it) shows the new or the old inode, a removed name
//! stays removed or comes back with its old inode (the simulator keeps a
//! read handle to every durable file, so an unlinked inode stays readable).
//! A rename is atomic in every image: its inode shows under exactly one of
//! its old and new names.
//!
//! So appends (logs synced in steps) and whole-file replacement by rename
//! (`vectide_core::io::atomic_write`: temp file, fsync, rename, directory
//! fsync) are modelled exactly: every state a crash can leave is an outcome.
//!
//! ## Limits
//! - **In-place overwrites** of bytes below the durable length (redb's pages,
//!   a WAL header rewritten in place, a memory-mapped region's stores) are
//!   taken as durable as soon as they are written: the image holds the file's
//!   current bytes there. The model under-approximates such files' crash
//!   states (it never shows the old bytes, nor a torn page). Regions of
//!   `p-hnsw` belong to [`crate::SimMedia`], which models their stores.
//! - **Truncation** (`set_len` to a shorter length) is durable at once, and
//!   the simulator never sees it: a file's durable length is not lowered by
//!   a cut, so bytes written after a cut below the old durable length count
//!   as durable until the next sync records the new length.
//! - A torn tail is a prefix of the written bytes, and a zeroed tail is zero
//!   throughout: no mix of written, zero and garbage blocks, although a file
//!   system that writes data back out of order can leave zeros before a
//!   later written block.
//! - **Directories** are taken as they are now: creating or removing a
//!   directory is durable at once, and only regular files are copied
//!   (symlinks and other kinds are skipped). A rename between two
//!   directories is drawn as two independent entry changes.
//! - Syncs are seen only through `vectide_core::sync`: a dependency that
//!   syncs behind its back is invisible (the payload store's redb goes
//!   through it, see `vectide-db`'s `store.rs`).
//! - Files are read while the workload may be writing them: bytes still being
//!   written can appear in unsynced tails (which is one of the allowed
//!   states) and, for in-place overwrites, in durable ranges (see the first
//!   point).
//!
//! ## Sync points and the mutation check
//! Sync points are numbered from 0 in the order their `Before` call reached
//! the simulator, every sync under the root counted, so that numbering does
//! not change when a site is disabled. [`FileSim::disable`] makes the
//! simulator treat every sync of one site as if it had not happened (the
//! real sync still runs, so the workload is unchanged): a later image can
//! then lose what only that site made durable, which the crash checker must
//! detect. [`FileSim::aim_after_disabled`] adds crash points just after the
//! disabled site's syncs, where that loss shows.

use crate::media::rng_next;
use parking_lot::Mutex;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ffi::OsString;
use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use vectide_core::sync::{
    install_sync_observer, ObserverGuard, SyncDecision, SyncEvent, SyncKind, SyncObserver,
    SyncPhase, SyncSite,
};
use vectide_core::{Error, Result};

/// Sync points after a disabled site's sync among which
/// [`FileSim::aim_after_disabled`] draws a crash point.
pub const AIM_SPAN: u64 = 4;

/// Configuration of a [`FileSim`].
#[derive(Debug, Clone, Default)]
pub struct FileSimConfig {
    /// Seed of the fate draws.
    pub seed: u64,
    /// Names of files written in place (B-tree pages, headers rewritten
    /// where they are): their images keep every byte written. Dropping
    /// such a file's unsynced tail while its in-place writes count as
    /// durable would make states no disk can produce (a header naming pages
    /// past the end), and the model has no page-level fates.
    pub in_place: Vec<String>,
    /// Sync point numbers just before which images are taken.
    pub crash_before: BTreeSet<u64>,
    /// Images per crash point, each with its own draw (0 counts as 1).
    pub images_per_crash: usize,
    /// Where images go: `IMAGE_DIR/<point, 6 digits>-<k>`. Must be outside
    /// the root.
    pub image_dir: PathBuf,
}

/// What became of a directory entry in an image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryFate {
    /// As the last sync that covered it left it.
    Durable,
    /// Created since its directory's last sync (not durable yet): kept.
    New,
    /// Created since and not durable: lost (absent from the image).
    Vanished,
    /// Replaced since (a rename over it): the new inode was kept.
    Replaced,
    /// Replaced or removed since: shows the inode it had when it was made
    /// durable.
    Restored,
    /// Removed since: the removal was kept (absent from the image).
    Removed,
}

/// What became of a file's unsynced tail in an image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TailFate {
    /// Nothing beyond the durable length.
    None,
    Kept,
    Dropped,
    /// Cut at an 8-byte aligned offset inside the tail.
    Torn,
    /// The file's current length, with every byte of the tail zero.
    Zeroed,
}

/// One file of an image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageFile {
    /// Path relative to the root (and to the image directory).
    pub name: PathBuf,
    pub entry: EntryFate,
    /// Bytes of the inode made durable by its last sync (capped at `len`).
    pub durable_len: u64,
    /// Bytes the inode holds now.
    pub len: u64,
    pub tail: TailFate,
    /// Bytes in the image; `None` when the file is absent from it.
    pub image_len: Option<u64>,
}

/// A post-crash image, written to [`FileCrashImage::dir`].
#[derive(Debug, Clone)]
pub struct FileCrashImage {
    /// The sync point the crash came just before.
    pub point: u64,
    /// Its site (`"now"` for [`FileSim::image_now`]).
    pub site: SyncSite,
    /// The file or directory that sync was for.
    pub path: PathBuf,
    /// The directory holding the image (a copy of the root).
    pub dir: PathBuf,
    /// Every file the root holds now or held at its last durable state.
    pub files: Vec<ImageFile>,
}

impl FileCrashImage {
    /// The outcome of the file at `name` (relative to the root).
    pub fn file(&self, name: impl AsRef<Path>) -> Option<&ImageFile> {
        self.files.iter().find(|f| f.name == name.as_ref())
    }
}

/// Counters of a simulator run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FileSimReport {
    /// Syncs under the root (disabled ones included).
    pub sync_points: u64,
    /// Per site: syncs.
    pub by_site: BTreeMap<SyncSite, u64>,
    /// Syncs the mutation switch ignored.
    pub skipped: u64,
    /// Images written.
    pub images: u64,
    /// Images that could not be written (and were not handed to the
    /// callback), with the reason.
    pub errors: Vec<String>,
}

type Inode = (u64, u64);
type Callback = Box<dyn FnMut(&FileCrashImage) + Send>;

#[derive(Clone)]
struct Durable {
    inode: Inode,
    /// A read handle keeping the inode readable after an unlink.
    handle: Option<Arc<File>>,
}

enum Pending {
    File {
        inode: Inode,
        len: u64,
        /// The sync point number of its `Before` call (see `after`).
        point: u64,
        dir: PathBuf,
        name: OsString,
        entry: Durable,
    },
    Dir {
        dir: PathBuf,
        listing: BTreeMap<OsString, Durable>,
    },
}

/// A file's durable length and the sync that recorded it: a sync that
/// began earlier and returned later does not lower it.
#[derive(Debug, Clone, Copy)]
struct DurableLen {
    len: u64,
    /// The sync point (`Before` order) that recorded it; `None` for a file
    /// adopted as durable when the simulator started.
    point: Option<u64>,
}

struct State {
    report: FileSimReport,
    crash_before: BTreeSet<u64>,
    disabled: Option<SyncSite>,
    /// See [`FileSim::aim_after_disabled`].
    aim: bool,
    /// Files and directories whose next sync is a crash point (aimed).
    aimed_paths: BTreeSet<PathBuf>,
    rng: u64,
    on_crash: Option<Callback>,
    durable_len: HashMap<Inode, DurableLen>,
    /// Durable entries per directory (relative to the root).
    entries: HashMap<PathBuf, BTreeMap<OsString, Durable>>,
    /// Syncs between their `Before` and `After` calls, by event id.
    pending: HashMap<u64, Pending>,
}

/// The file crash simulator (see the module docs).
pub struct FileSim {
    root: PathBuf,
    image_dir: PathBuf,
    images_per_crash: usize,
    in_place: Vec<String>,
    state: Mutex<State>,
}

impl std::fmt::Debug for FileSim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileSim")
            .field("root", &self.root)
            .finish_non_exhaustive()
    }
}

fn inode_of(m: &std::fs::Metadata) -> Inode {
    (m.dev(), m.ino())
}

/// A read handle to the regular file at `path`, with its inode.
fn open_durable(path: &Path) -> Option<Durable> {
    let f = File::open(path).ok()?;
    let m = f.metadata().ok()?;
    m.is_file().then(|| Durable {
        inode: inode_of(&m),
        handle: Some(Arc::new(f)),
    })
}

/// Where crash harnesses put their indexes and images: `dir` when given,
/// else `/dev/shm` when present (images are many and small), else the
/// system temp dir.
pub fn scratch_root(dir: Option<&Path>) -> PathBuf {
    if let Some(d) = dir {
        return d.to_path_buf();
    }
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    }
}

/// A fresh directory under `root`, removed when dropped.
pub fn scratch_dir(root: &Path, tag: &str) -> Result<tempfile::TempDir> {
    tempfile::Builder::new()
        .prefix(&format!("vectide-crash-{tag}-"))
        .tempdir_in(root)
        .map_err(|e| Error::io_at(root, e))
}

/// Records every file under `dir` (`rel` below the root) as durable: its
/// entry and its whole length.
fn adopt_existing(
    dir: &Path,
    rel: PathBuf,
    durable_len: &mut HashMap<Inode, DurableLen>,
    entries: &mut HashMap<PathBuf, BTreeMap<OsString, Durable>>,
) {
    let files = listing(dir);
    for (name, d) in &files {
        if let Ok(m) = std::fs::metadata(dir.join(name)) {
            durable_len.insert(
                d.inode,
                DurableLen {
                    len: m.len(),
                    point: None,
                },
            );
        }
    }
    entries.insert(rel.clone(), files);
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                adopt_existing(&e.path(), rel.join(e.file_name()), durable_len, entries);
            }
        }
    }
}

/// Regular files of `dir` now, with read handles.
fn listing(dir: &Path) -> BTreeMap<OsString, Durable> {
    let mut out = BTreeMap::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_file()) {
                if let Some(d) = open_durable(&e.path()) {
                    out.insert(e.file_name(), d);
                }
            }
        }
    }
    out
}

fn read_all(f: &File) -> std::io::Result<Vec<u8>> {
    let len = f.metadata()?.len() as usize;
    let mut buf = vec![0u8; len];
    f.read_exact_at(&mut buf, 0)?;
    Ok(buf)
}

/// Where an image entry's bytes come from.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Choice {
    Current,
    Old,
    Gone,
}

impl FileSim {
    /// A simulator of the files under `root` (it need not exist yet).
    /// Install it with [`FileSim::install`].
    ///
    /// What the root holds already is durable: the simulator starts from a
    /// state a previous crash (or a clean shutdown) left on the media.
    pub fn new(root: &Path, config: FileSimConfig) -> Result<Arc<FileSim>> {
        let canon = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
        if config.image_dir.starts_with(root) || canon(&config.image_dir).starts_with(canon(root)) {
            return Err(Error::invalid(format!(
                "crash images ({}) must go outside the simulated root ({})",
                config.image_dir.display(),
                root.display()
            )));
        }
        let mut durable_len = HashMap::new();
        let mut entries = HashMap::new();
        adopt_existing(root, PathBuf::new(), &mut durable_len, &mut entries);
        Ok(Arc::new(FileSim {
            root: root.to_path_buf(),
            image_dir: config.image_dir,
            images_per_crash: config.images_per_crash.max(1),
            in_place: config.in_place,
            state: Mutex::new(State {
                report: FileSimReport::default(),
                crash_before: config.crash_before,
                disabled: None,
                aim: false,
                aimed_paths: BTreeSet::new(),
                rng: config.seed ^ 0xf11e_5eed,
                on_crash: None,
                durable_len,
                entries,
                pending: HashMap::new(),
            }),
        }))
    }

    /// Starts observing the syncs under the root, until the guard drops.
    pub fn install(self: &Arc<Self>) -> ObserverGuard {
        install_sync_observer(&self.root, Arc::clone(self) as Arc<dyn SyncObserver>)
    }

    /// The root directory simulated.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Sets the callback that receives each image once it is written. It
    /// runs inside the sync call with the simulator locked, so it must not
    /// sync anything under the root; the image directory is left to it (it
    /// may delete it).
    pub fn on_crash(&self, f: impl FnMut(&FileCrashImage) + Send + 'static) {
        self.state.lock().on_crash = Some(Box::new(f));
    }

    /// Adds crash points (sync point numbers).
    pub fn crash_before(&self, points: impl IntoIterator<Item = u64>) {
        self.state.lock().crash_before.extend(points);
    }

    /// Treats every sync of `site` as not having happened (or, with `None`,
    /// none): the mutation check.
    pub fn disable(&self, site: Option<SyncSite>) {
        self.state.lock().disabled = site;
    }

    /// Also crashes where a disabled site's loss shows: after each of its
    /// syncs, by a seeded draw of one in two, either the next sync of the
    /// same file or directory (the last moment before a later sync makes
    /// good the loss) or one of the next [`AIM_SPAN`] sync points (for a
    /// file never synced again, such as the temp file of an atomic write)
    /// becomes a crash point. A site called rarely (a log's header sync,
    /// once per log) is otherwise met by few uniformly drawn crash points,
    /// and the mutation check would call it unnecessary for want of
    /// trying.
    pub fn aim_after_disabled(&self, on: bool) {
        self.state.lock().aim = on;
    }

    /// The counters so far.
    pub fn report(&self) -> FileSimReport {
        self.state.lock().report.clone()
    }

    /// Sync points seen so far (the number the next one gets).
    pub fn sync_points(&self) -> u64 {
        self.state.lock().report.sync_points
    }

    /// Writes an image of the state now (as if the machine died at this
    /// instant) into `target`, which must not exist or be empty.
    pub fn image_now(&self, target: &Path) -> Result<FileCrashImage> {
        let mut s = self.state.lock();
        let point = s.report.sync_points;
        let root = self.root.clone();
        self.materialise(&mut s, target, point, SyncSite("now"), &root)
    }

    /// `path` relative to the root, if it is inside.
    fn relative(&self, path: &Path) -> Option<PathBuf> {
        if let Ok(r) = path.strip_prefix(&self.root) {
            return Some(r.to_path_buf());
        }
        let root = std::fs::canonicalize(&self.root).ok()?;
        let path = std::fs::canonicalize(path).ok()?;
        path.strip_prefix(root).ok().map(Path::to_path_buf)
    }

    fn before(&self, s: &mut State, e: &SyncEvent<'_>, rel: PathBuf) {
        let n = s.report.sync_points;
        s.report.sync_points += 1;
        *s.report.by_site.entry(e.site).or_default() += 1;
        let aimed = s.aimed_paths.remove(&rel);
        if s.crash_before.remove(&n) || aimed {
            for k in 0..self.images_per_crash {
                let target = self.image_dir.join(format!("{n:06}-{k}"));
                match self.materialise(s, &target, n, e.site, e.path) {
                    Ok(image) => {
                        if let Some(mut cb) = s.on_crash.take() {
                            cb(&image);
                            s.on_crash = Some(cb);
                        }
                    }
                    Err(err) => s.report.errors.push(format!("sync point {n}: {err}")),
                }
            }
        }
        if s.disabled == Some(e.site) {
            s.report.skipped += 1;
            // Aimed only once a callback can take the image (not while a
            // crash kit's recovery runs before it sets one).
            if s.aim && s.on_crash.is_some() {
                if rng_next(&mut s.rng).is_multiple_of(2) {
                    s.aimed_paths.insert(rel);
                } else {
                    let k = 1 + rng_next(&mut s.rng) % AIM_SPAN;
                    s.crash_before.insert(n + k);
                }
            }
            return;
        }
        let pending = if e.kind == SyncKind::Dir {
            Pending::Dir {
                dir: rel,
                listing: listing(e.path),
            }
        } else {
            let Ok(m) = e.file.metadata() else { return };
            let (Some(name), dir) = (rel.file_name(), rel.parent()) else {
                return;
            };
            let inode = inode_of(&m);
            // A read handle of the same inode (the sync's own may be
            // write-only).
            let handle = open_durable(e.path)
                .filter(|d| d.inode == inode)
                .and_then(|d| d.handle);
            Pending::File {
                inode,
                len: m.len(),
                point: n,
                dir: dir.map(Path::to_path_buf).unwrap_or_default(),
                name: name.to_os_string(),
                entry: Durable { inode, handle },
            }
        };
        s.pending.insert(e.id, pending);
    }

    fn after(s: &mut State, id: u64) {
        match s.pending.remove(&id) {
            Some(Pending::File {
                inode,
                len,
                point,
                dir,
                name,
                entry,
            }) => {
                // Two syncs of one file can overlap (a group commit's leader
                // and a direct sync of the same log): the one that began
                // later covers the bytes written before it began, whichever
                // returns first, so an earlier one's return must not take
                // its shorter length back.
                let newer = s
                    .durable_len
                    .get(&inode)
                    .is_none_or(|d| d.point.is_none_or(|p| point > p));
                if newer {
                    let point = Some(point);
                    s.durable_len.insert(inode, DurableLen { len, point });
                }
                s.entries.entry(dir).or_default().insert(name, entry);
            }
            Some(Pending::Dir { dir, listing }) => {
                s.entries.insert(dir, listing);
            }
            None => {}
        }
    }

    fn materialise(
        &self,
        s: &mut State,
        target: &Path,
        point: u64,
        site: SyncSite,
        path: &Path,
    ) -> Result<FileCrashImage> {
        if target.exists()
            && std::fs::read_dir(target)
                .map_err(|e| Error::io_at(target, e))?
                .next()
                .is_some()
        {
            return Err(Error::invalid(format!(
                "crash image directory {} is not empty",
                target.display()
            )));
        }
        let mut files = Vec::new();
        self.walk(s, Path::new(""), target, &mut files)?;
        s.report.images += 1;
        Ok(FileCrashImage {
            point,
            site,
            path: path.to_path_buf(),
            dir: target.to_path_buf(),
            files,
        })
    }

    /// Copies the directory `rel` of the root into `target` (see the model).
    fn walk(
        &self,
        s: &mut State,
        rel: &Path,
        target: &Path,
        files: &mut Vec<ImageFile>,
    ) -> Result<()> {
        let src = self.root.join(rel);
        let out = target.join(rel);
        std::fs::create_dir_all(&out).map_err(|e| Error::io_at(&out, e))?;
        let mut current: BTreeMap<OsString, Inode> = BTreeMap::new();
        let mut subdirs = BTreeSet::new();
        if src.is_dir() {
            for e in std::fs::read_dir(&src).map_err(|e| Error::io_at(&src, e))? {
                let e = e.map_err(|e| Error::io_at(&src, e))?;
                let Ok(t) = e.file_type() else { continue };
                if t.is_dir() {
                    subdirs.insert(e.file_name());
                } else if t.is_file() {
                    // A file removed since the listing is simply not there.
                    if let Ok(m) = e.metadata() {
                        current.insert(e.file_name(), inode_of(&m));
                    }
                }
            }
        }
        let durable = s.entries.get(rel).cloned().unwrap_or_default();
        // Draw every entry that differs from its durable state.
        let mut choice: BTreeMap<OsString, (Choice, EntryFate)> = BTreeMap::new();
        let names: BTreeSet<&OsString> = current.keys().chain(durable.keys()).collect();
        for name in names {
            let coin = rng_next(&mut s.rng) & 1 == 0;
            let c = match (current.get(name), durable.get(name).map(|d| d.inode)) {
                (Some(c), Some(o)) if *c == o => (Choice::Current, EntryFate::Durable),
                (Some(_), Some(_)) if coin => (Choice::Current, EntryFate::Replaced),
                (Some(_), Some(_)) => (Choice::Old, EntryFate::Restored),
                (Some(_), None) if coin => (Choice::Current, EntryFate::New),
                (Some(_), None) => (Choice::Gone, EntryFate::Vanished),
                (None, Some(_)) if coin => (Choice::Old, EntryFate::Restored),
                (None, _) => (Choice::Gone, EntryFate::Removed),
            };
            choice.insert(name.clone(), c);
        }
        // Renames are atomic: an inode shows under exactly one of its names.
        let inode_at = |name: &OsString, c: Choice| match c {
            Choice::Current => current.get(name).copied(),
            Choice::Old => durable.get(name).map(|d| d.inode),
            Choice::Gone => None,
        };
        let mut shown: HashMap<Inode, Vec<OsString>> = HashMap::new();
        for (name, (c, _)) in &choice {
            if let Some(i) = inode_at(name, *c) {
                shown.entry(i).or_default().push(name.clone());
            }
        }
        for names in shown.values().filter(|n| n.len() > 1) {
            // Keep the inode under its current name, take back the old ones.
            for name in names {
                if choice.get(name).is_some_and(|c| c.0 == Choice::Old) {
                    let back = if current.contains_key(name) {
                        (Choice::Current, EntryFate::Replaced)
                    } else {
                        (Choice::Gone, EntryFate::Removed)
                    };
                    choice.insert(name.clone(), back);
                }
            }
        }
        for (name, d) in &durable {
            let renamed_away = current.values().any(|i| *i == d.inode)
                && !choice
                    .iter()
                    .any(|(n, (c, _))| inode_at(n, *c) == Some(d.inode));
            if renamed_away {
                choice.insert(name.clone(), (Choice::Old, EntryFate::Restored));
            }
        }
        for (name, (c, entry)) in choice {
            let bytes = match c {
                Choice::Current => std::fs::read(src.join(&name)).ok(),
                Choice::Old => durable
                    .get(&name)
                    .and_then(|d| d.handle.as_ref())
                    .and_then(|f| read_all(f).ok()),
                Choice::Gone => None,
            };
            let inode = inode_at(&name, c);
            let mut file = ImageFile {
                name: rel.join(&name),
                entry,
                durable_len: 0,
                len: 0,
                tail: TailFate::None,
                image_len: None,
            };
            if let (Some(bytes), Some(inode)) = (bytes, inode) {
                let len = bytes.len() as u64;
                let durable_len = s.durable_len.get(&inode).map_or(0, |d| d.len).min(len);
                let whole = self
                    .in_place
                    .iter()
                    .any(|n| name.to_string_lossy() == n.as_str());
                let (tail, keep) = if len == durable_len {
                    (TailFate::None, len)
                } else if whole {
                    (TailFate::Kept, len)
                } else {
                    match rng_next(&mut s.rng) % 4 {
                        0 => (TailFate::Kept, len),
                        1 => (TailFate::Dropped, durable_len),
                        2 => (TailFate::Torn, tear(&mut s.rng, durable_len, len)),
                        _ => (TailFate::Zeroed, len),
                    }
                };
                let mut bytes = bytes;
                bytes.truncate(keep as usize);
                if tail == TailFate::Zeroed {
                    bytes[durable_len as usize..].fill(0);
                }
                let dst = out.join(&name);
                std::fs::write(&dst, &bytes).map_err(|e| Error::io_at(&dst, e))?;
                file = ImageFile {
                    durable_len,
                    len,
                    tail,
                    image_len: Some(keep),
                    ..file
                };
            }
            files.push(file);
        }
        for sub in subdirs {
            self.walk(s, &rel.join(sub), target, files)?;
        }
        Ok(())
    }
}

/// A random 8-byte aligned offset strictly inside `lo..hi` (or `lo` when
/// there is none).
fn tear(rng: &mut u64, lo: u64, hi: u64) -> u64 {
    let first = (lo / 8 + 1) * 8;
    if first >= hi {
        return lo;
    }
    let count = (hi - 1 - first) / 8 + 1;
    first + 8 * (rng_next(rng) % count)
}

impl SyncObserver for FileSim {
    fn on_sync(&self, e: &SyncEvent<'_>) -> SyncDecision {
        let Some(rel) = self.relative(e.path) else {
            return SyncDecision::Proceed;
        };
        let mut s = self.state.lock();
        match e.phase {
            SyncPhase::Before => self.before(&mut s, e, rel),
            SyncPhase::After => Self::after(&mut s, e.id),
        }
        SyncDecision::Proceed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use vectide_core::sync::{sync_dir, sync_file};

    const APPEND: SyncSite = SyncSite("test.append");
    const OTHER: SyncSite = SyncSite("test.other");

    type Seen = Arc<Mutex<Vec<(u64, Option<Vec<u8>>, Option<ImageFile>)>>>;

    /// A simulator of `root` whose callback records `name` in each image
    /// (bytes and outcome) and deletes the image.
    fn simulator(
        root: &Path,
        images: &Path,
        points: impl IntoIterator<Item = u64>,
        per: usize,
        name: &'static str,
    ) -> (Arc<FileSim>, Seen) {
        let sim = FileSim::new(
            root,
            FileSimConfig {
                seed: 11,
                crash_before: points.into_iter().collect(),
                images_per_crash: per,
                image_dir: images.to_path_buf(),
                ..FileSimConfig::default()
            },
        )
        .unwrap();
        let seen: Seen = Arc::default();
        let out = Arc::clone(&seen);
        sim.on_crash(move |img| {
            let bytes = std::fs::read(img.dir.join(name)).ok();
            out.lock().push((img.point, bytes, img.file(name).cloned()));
            std::fs::remove_dir_all(&img.dir).unwrap();
        });
        (sim, seen)
    }

    fn chunk(i: usize) -> Vec<u8> {
        (0..20).map(|j| (i * 37 + j + 1) as u8).collect()
    }

    #[test]
    fn an_appended_log_keeps_its_synced_prefix_and_an_optional_tail() {
        const STEPS: usize = 12;
        let root = tempfile::tempdir().unwrap();
        let images = tempfile::tempdir().unwrap();
        let (sim, seen) = simulator(root.path(), images.path(), 0..STEPS as u64, 6, "wal/log");
        let _guard = sim.install();
        std::fs::create_dir(root.path().join("wal")).unwrap();
        let path = root.path().join("wal/log");
        let mut f = File::create(&path).unwrap();
        let mut all = Vec::new();
        for i in 0..STEPS {
            f.write_all(&chunk(i)).unwrap();
            all.extend(chunk(i));
            sync_file(&f, &path, APPEND, true).unwrap();
        }
        let seen = seen.lock();
        assert_eq!(seen.len(), STEPS * 6);
        let mut tails = BTreeSet::new();
        for (point, bytes, file) in seen.iter() {
            let k = *point as usize;
            let durable = k * 20;
            let file = file.as_ref().unwrap();
            let Some(bytes) = bytes else {
                assert_eq!(k, 0, "a synced log vanished at point {k}");
                assert_eq!(file.entry, EntryFate::Vanished);
                continue;
            };
            assert!(
                bytes.len() >= durable && bytes.len() <= durable + 20,
                "point {k}: {} bytes",
                bytes.len()
            );
            assert_eq!(file.durable_len, durable as u64);
            assert_eq!(file.image_len, Some(bytes.len() as u64));
            assert_eq!(bytes[..durable], all[..durable], "point {k}: synced bytes");
            if file.tail == TailFate::Zeroed {
                assert_eq!(bytes.len(), durable + 20, "point {k}: zeroed length");
                assert!(bytes[durable..].iter().all(|&b| b == 0), "point {k}");
            } else {
                assert_eq!(bytes[..], all[..bytes.len()], "point {k}: not a prefix");
            }
            if file.tail == TailFate::Torn {
                assert!(bytes.len() % 8 == 0 && bytes.len() > durable);
            }
            tails.insert(format!("{:?}", file.tail));
        }
        assert_eq!(
            tails.into_iter().collect::<Vec<_>>(),
            ["Dropped", "Kept", "Torn", "Zeroed"],
            "every fate of an unsynced tail"
        );
        let report = sim.report();
        assert_eq!(report.sync_points, STEPS as u64);
        assert_eq!(report.by_site[&APPEND], STEPS as u64);
        assert_eq!(report.images, STEPS as u64 * 6);
        assert!(report.errors.is_empty(), "{:?}", report.errors);
    }

    /// Images (taken before the second sync) in which the bytes of the
    /// first sync are lost, with the first sync's site disabled or not.
    fn lost_synced_bytes(disable: bool) -> usize {
        let root = tempfile::tempdir().unwrap();
        let images = tempfile::tempdir().unwrap();
        let (sim, seen) = simulator(root.path(), images.path(), [1], 32, "log");
        if disable {
            sim.disable(Some(OTHER));
        }
        let _guard = sim.install();
        let path = root.path().join("log");
        let mut f = File::create(&path).unwrap();
        f.write_all(&chunk(0)).unwrap();
        sync_file(&f, &path, OTHER, false).unwrap();
        f.write_all(&chunk(1)).unwrap();
        sync_file(&f, &path, APPEND, true).unwrap();
        assert_eq!(sim.report().skipped, u64::from(disable));
        let seen = seen.lock();
        assert_eq!(seen.len(), 32);
        seen.iter()
            .filter(|(_, b, _)| b.as_ref().and_then(|b| b.get(..20)) != Some(&chunk(0)[..]))
            .count()
    }

    #[test]
    fn what_the_root_holds_when_the_simulator_starts_is_durable() {
        let root = tempfile::tempdir().unwrap();
        let images = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("sub")).unwrap();
        std::fs::write(root.path().join("sub/old"), chunk(1)).unwrap();
        std::fs::write(root.path().join("top"), chunk(2)).unwrap();
        // Many draws: none may lose a byte of what was there before.
        for seed in 0..20 {
            let sim = FileSim::new(
                root.path(),
                FileSimConfig {
                    seed,
                    image_dir: images.path().to_path_buf(),
                    ..FileSimConfig::default()
                },
            )
            .unwrap();
            let _g = sim.install();
            let img = sim
                .image_now(&images.path().join(format!("i{seed}")))
                .unwrap();
            assert_eq!(std::fs::read(img.dir.join("sub/old")).unwrap(), chunk(1));
            assert_eq!(std::fs::read(img.dir.join("top")).unwrap(), chunk(2));
        }
    }

    /// Two syncs of one log overlap (a group commit's leader and a direct
    /// sync of the same file): the one that began later returns first.
    /// What it covered stays durable when the earlier one returns (the
    /// simulator used to take the earlier one's shorter length back, and a
    /// write acknowledged after the later sync vanished from the images).
    #[test]
    fn an_earlier_sync_returning_last_does_not_take_durable_bytes_back() {
        let root = tempfile::tempdir().unwrap();
        let images = tempfile::tempdir().unwrap();
        let path = root.path().join("log");
        let mut f = File::create(&path).unwrap();
        f.write_all(&chunk(0)).unwrap();
        let sim = FileSim::new(
            root.path(),
            FileSimConfig {
                seed: 5,
                image_dir: images.path().to_path_buf(),
                ..FileSimConfig::default()
            },
        )
        .unwrap();
        let event = |id, phase| SyncEvent {
            id,
            path: &path,
            file: &f,
            site: APPEND,
            kind: SyncKind::Data,
            phase,
        };
        // The first sync begins at 20 bytes; 20 more are written; a second
        // sync begins at 40 bytes and returns; then the first returns.
        sim.on_sync(&event(1_000_001, SyncPhase::Before));
        (&f).write_all(&chunk(1)).unwrap();
        sim.on_sync(&event(1_000_002, SyncPhase::Before));
        sim.on_sync(&event(1_000_002, SyncPhase::After));
        sim.on_sync(&event(1_000_001, SyncPhase::After));
        // Unsynced bytes after both: any tail fate leaves the 40 synced.
        (&f).write_all(&chunk(2)).unwrap();
        for k in 0..8 {
            let img = sim.image_now(&images.path().join(format!("i{k}"))).unwrap();
            let file = img.file("log").unwrap();
            assert_eq!(file.durable_len, 40, "image {k}");
            let bytes = std::fs::read(img.dir.join("log")).unwrap();
            assert_eq!(bytes[..20], chunk(0)[..], "image {k}");
            assert_eq!(bytes[20..40], chunk(1)[..], "image {k}");
        }
    }

    #[test]
    fn a_disabled_site_makes_later_images_lose_what_it_synced() {
        assert_eq!(lost_synced_bytes(false), 0);
        assert!(lost_synced_bytes(true) > 0);
    }

    #[test]
    fn aimed_crash_points_follow_the_disabled_sites_syncs() {
        let root = tempfile::tempdir().unwrap();
        let images = tempfile::tempdir().unwrap();
        let (sim, seen) = simulator(root.path(), images.path(), [], 1, "log");
        sim.disable(Some(OTHER));
        sim.aim_after_disabled(true);
        let _guard = sim.install();
        let (log, side) = (root.path().join("log"), root.path().join("side"));
        let (mut f, mut g) = (File::create(&log).unwrap(), File::create(&side).unwrap());
        // Rounds of 20 sync points: `side` synced by the disabled site,
        // then the log 18 times, then `side` again by another site.
        let (mut disabled, mut next_of_side) = (Vec::new(), Vec::new());
        let mut n = 0u64;
        for round in 0..30 {
            g.write_all(&chunk(round)).unwrap();
            sync_file(&g, &side, OTHER, true).unwrap();
            disabled.push(n);
            for i in 0..18 {
                f.write_all(&chunk(i)).unwrap();
                sync_file(&f, &log, APPEND, true).unwrap();
            }
            sync_file(&g, &side, APPEND, true).unwrap();
            next_of_side.push(n + 19);
            n += 20;
        }
        let points: Vec<u64> = seen.lock().iter().map(|(p, _, _)| *p).collect();
        let near = |p: &u64| disabled.iter().any(|o| (o + 1..=o + AIM_SPAN).contains(p));
        assert!(
            points.iter().all(|p| near(p) || next_of_side.contains(p)),
            "{points:?}"
        );
        assert!(points.iter().any(near), "{points:?}");
        assert!(
            points.iter().any(|p| next_of_side.contains(p)),
            "{points:?}"
        );
        // Without aiming, no crash point was asked for: no image.
        let (sim, seen) = simulator(root.path(), images.path(), [], 1, "log");
        sim.disable(Some(OTHER));
        let _guard = sim.install();
        for _ in 0..20 {
            sync_file(&g, &side, OTHER, true).unwrap();
            sync_file(&g, &side, APPEND, true).unwrap();
        }
        assert!(seen.lock().is_empty());
    }

    #[test]
    fn only_syncs_inside_the_root_are_seen_while_installed() {
        let root = tempfile::tempdir().unwrap();
        let other = tempfile::tempdir().unwrap();
        let images = tempfile::tempdir().unwrap();
        let (sim, _) = simulator(root.path(), images.path(), [], 1, "f");
        let (other_sim, _) = simulator(other.path(), images.path(), [], 1, "f");
        let p = root.path().join("f");
        let q = other.path().join("f");
        let (f, g) = (File::create(&p).unwrap(), File::create(&q).unwrap());
        let guard = sim.install();
        let other_guard = other_sim.install();
        sync_file(&g, &q, APPEND, true).unwrap();
        sync_dir(other.path(), OTHER).unwrap();
        assert_eq!(sim.sync_points(), 0, "syncs elsewhere are not seen");
        sync_file(&f, &p, APPEND, true).unwrap();
        sync_dir(root.path(), OTHER).unwrap();
        assert_eq!(sim.sync_points(), 2);
        assert_eq!(other_sim.sync_points(), 2);
        drop(guard);
        sync_file(&f, &p, APPEND, true).unwrap();
        assert_eq!(sim.sync_points(), 2, "nothing after the guard dropped");
        drop(other_guard);
        assert!(FileSim::new(
            root.path(),
            FileSimConfig {
                image_dir: root.path().join("images"),
                ..FileSimConfig::default()
            }
        )
        .is_err());
    }

    #[test]
    fn atomic_write_leaves_the_old_or_the_new_file() {
        let root = tempfile::tempdir().unwrap();
        let images = tempfile::tempdir().unwrap();
        // Sync points: first write 0 (file), 1 (dir); second 2, 3.
        let (sim, seen) = simulator(root.path(), images.path(), [2, 3], 24, "f");
        let _guard = sim.install();
        let path = root.path().join("f");
        let write = |text: &'static [u8]| {
            vectide_core::io::atomic_write(&path, |w| Ok(w.write_all(text)?)).unwrap()
        };
        write(b"old contents");
        write(b"the new contents");
        assert_eq!(sim.sync_points(), 4);
        let seen = seen.lock();
        let (mut old, mut new) = (0, 0);
        for (point, bytes, file) in seen.iter() {
            match bytes.as_deref() {
                Some(b"old contents") => old += 1,
                Some(b"the new contents") => {
                    assert_eq!(*point, 3, "new before its data was synced");
                    assert_eq!(file.as_ref().unwrap().entry, EntryFate::Replaced);
                    new += 1
                }
                other => panic!("point {point}: {other:?}"),
            }
        }
        assert!(old > 24 && new > 0, "old {old}, new {new}");
        let now = sim.image_now(&images.path().join("now")).unwrap();
        assert_eq!(
            std::fs::read(now.dir.join("f")).unwrap(),
            b"the new contents"
        );
        assert_eq!(now.files.len(), 1, "{:?}", now.files);
        assert_eq!(now.files[0].entry, EntryFate::Durable);
    }

    #[test]
    fn a_removal_is_undone_or_kept_until_the_directory_is_synced() {
        let root = tempfile::tempdir().unwrap();
        let images = tempfile::tempdir().unwrap();
        let (sim, seen) = simulator(root.path(), images.path(), [2], 16, "gone");
        let _guard = sim.install();
        let path = root.path().join("gone");
        let mut f = File::create(&path).unwrap();
        f.write_all(b"durable bytes").unwrap();
        sync_file(&f, &path, APPEND, false).unwrap();
        sync_dir(root.path(), OTHER).unwrap();
        drop(f);
        std::fs::remove_file(&path).unwrap();
        sync_dir(root.path(), OTHER).unwrap();
        let fates: BTreeSet<_> = seen
            .lock()
            .iter()
            .map(|(_, b, f)| {
                if let Some(b) = b {
                    assert_eq!(b, b"durable bytes");
                }
                format!("{:?}", f.as_ref().unwrap().entry)
            })
            .collect();
        assert_eq!(
            fates.into_iter().collect::<Vec<_>>(),
            ["Removed", "Restored"]
        );
        let now = sim.image_now(&images.path().join("now")).unwrap();
        assert!(now.files.is_empty(), "{:?}", now.files);
    }
}
