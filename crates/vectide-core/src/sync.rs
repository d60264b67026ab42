//! Sync points: every `fsync` / `fdatasync` of Vectide goes through
//! [`sync_file`], [`sync_dir`] or [`sync_point`], each naming its call
//! [`SyncSite`].
//!
//! A crash kit observes them: [`install_sync_observer`] registers a
//! [`SyncObserver`] for a root directory, and every sync of a path inside
//! that root calls it twice, [`SyncPhase::Before`] the real sync (the
//! observer may count it, capture a post-crash image of the state just
//! before it, or make it fail) and [`SyncPhase::After`] it returned `Ok`
//! (the observer may now treat the synced bytes as durable — or not, when
//! its mutation check "disables" the site: the real sync still happens, so
//! the engine runs unchanged, but the observer's model of the disk does not
//! take it into account). The two calls of one sync carry the same
//! [`SyncEvent::id`].
//!
//! Observers are scoped by directory (see [`crate::scope`]): tests running
//! in parallel threads in other directories are unaffected. With no
//! observer installed a sync point costs one relaxed atomic load on top of
//! the system call.
//!
//! The storage crate's `crashfs` module has the file crash simulator built
//! on this.

use crate::error::{Error, Result};
use crate::scope::{ScopeGuard, ScopeRegistry};
use std::fs::File;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The name of a sync call site ("wal.append", "atomic_write.dir", …):
/// what a crash kit counts and what its mutation check disables one at a
/// time. Like the storage crate's `Site` for persistence calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SyncSite(pub &'static str);

impl std::fmt::Display for SyncSite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

/// What a sync makes durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncKind {
    /// `fdatasync`: the file's data and the metadata needed to read it
    /// (its length).
    Data,
    /// `fsync`: data and all metadata.
    All,
    /// `fsync` of a directory: its entries (creations, renames, removals).
    Dir,
}

/// When an observer is called.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncPhase {
    /// Before the real sync: nothing of it has taken effect.
    Before,
    /// After the real sync returned `Ok` (not called when it failed or was
    /// failed by an observer).
    After,
}

/// One sync, as an observer sees it.
#[derive(Debug, Clone, Copy)]
pub struct SyncEvent<'a> {
    /// Process-wide number of this sync: the same in both phases.
    pub id: u64,
    /// The file or directory synced.
    pub path: &'a Path,
    /// Its open handle (for directories, the handle opened to sync them).
    pub file: &'a File,
    pub site: SyncSite,
    pub kind: SyncKind,
    pub phase: SyncPhase,
}

/// What an observer wants done with a sync (read in [`SyncPhase::Before`]
/// only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SyncDecision {
    /// Run the real sync.
    #[default]
    Proceed,
    /// Skip it and return an I/O error, as a failing disk would (fault
    /// injection of error paths).
    Fail,
}

/// Observes the sync points under a root directory (see the module docs).
///
/// Calls come from the syncing thread, possibly from several threads at a
/// time. An observer must not sync anything under its own root from inside
/// the callback.
pub trait SyncObserver: Send + Sync {
    fn on_sync(&self, event: &SyncEvent<'_>) -> SyncDecision;
}

static OBSERVERS: ScopeRegistry<Arc<dyn SyncObserver>> = ScopeRegistry::new();
static NEXT_SYNC: AtomicU64 = AtomicU64::new(0);

/// Removes its observer when dropped.
pub type ObserverGuard = ScopeGuard<Arc<dyn SyncObserver>>;

/// Installs `observer` for every sync of a path inside `root` (or of `root`
/// itself) until the guard is dropped. Nested roots each see the syncs of
/// their tree.
pub fn install_sync_observer(root: &Path, observer: Arc<dyn SyncObserver>) -> ObserverGuard {
    OBSERVERS.install(root, observer)
}

/// The sync point itself: tells the observers of `path` (if any), runs
/// `real` on `file` unless one of them fails it, then tells them it
/// succeeded. [`sync_file`] and [`sync_dir`] use it; call it directly for a
/// sync that must return `std::io::Result` (a storage backend of a
/// dependency).
pub fn sync_point(
    file: &File,
    path: &Path,
    site: SyncSite,
    kind: SyncKind,
    real: impl FnOnce(&File) -> std::io::Result<()>,
) -> std::io::Result<()> {
    if OBSERVERS.is_empty() {
        return real(file);
    }
    let observers = OBSERVERS.matching(path);
    if observers.is_empty() {
        return real(file);
    }
    let mut event = SyncEvent {
        id: NEXT_SYNC.fetch_add(1, Ordering::Relaxed),
        path,
        file,
        site,
        kind,
        phase: SyncPhase::Before,
    };
    let mut fail = false;
    for o in &observers {
        fail |= o.on_sync(&event) == SyncDecision::Fail;
    }
    if fail {
        return Err(std::io::Error::other(format!(
            "sync failed (injected by a sync observer at site {site})"
        )));
    }
    real(file)?;
    event.phase = SyncPhase::After;
    for o in &observers {
        o.on_sync(&event);
    }
    Ok(())
}

/// `fdatasync` (`data_only`) or `fsync` of an open file, through its sync
/// point.
pub fn sync_file(file: &File, path: &Path, site: SyncSite, data_only: bool) -> Result<()> {
    let (kind, real): (_, fn(&File) -> std::io::Result<()>) = if data_only {
        (SyncKind::Data, File::sync_data)
    } else {
        (SyncKind::All, File::sync_all)
    };
    sync_point(file, path, site, kind, real).map_err(|e| Error::io_at(path, e))
}

/// `fsync`s a directory (so that creations, renames and removals in it are
/// durable), through its sync point.
pub fn sync_dir(dir: &Path, site: SyncSite) -> Result<()> {
    let d = File::open(dir).map_err(|e| Error::io_at(dir, e))?;
    sync_point(&d, dir, site, SyncKind::Dir, File::sync_all).map_err(|e| Error::io_at(dir, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use parking_lot::Mutex;
    use std::path::PathBuf;

    type Seen = (u64, PathBuf, SyncSite, SyncKind, SyncPhase);

    #[derive(Default)]
    struct Recorder {
        seen: Mutex<Vec<Seen>>,
        fail: Option<SyncSite>,
    }

    impl SyncObserver for Recorder {
        fn on_sync(&self, e: &SyncEvent<'_>) -> SyncDecision {
            self.seen
                .lock()
                .push((e.id, e.path.to_path_buf(), e.site, e.kind, e.phase));
            if self.fail == Some(e.site) {
                SyncDecision::Fail
            } else {
                SyncDecision::Proceed
            }
        }
    }

    const A: SyncSite = SyncSite("test.a");
    const B: SyncSite = SyncSite("test.b");

    #[test]
    fn observers_see_both_phases_of_syncs_inside_their_root_only() {
        let root = tempfile::tempdir().unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        let rec = Arc::new(Recorder::default());
        let guard = install_sync_observer(root.path(), rec.clone());
        let p = root.path().join("f");
        let f = File::create(&p).unwrap();
        sync_file(&f, &p, A, true).unwrap();
        sync_dir(root.path(), B).unwrap();
        let q = elsewhere.path().join("f");
        let g = File::create(&q).unwrap();
        sync_file(&g, &q, A, false).unwrap();
        sync_dir(elsewhere.path(), B).unwrap();
        drop(guard);
        sync_file(&f, &p, A, false).unwrap();
        let seen = rec.seen.lock().clone();
        assert_eq!(seen.len(), 4, "{seen:?}");
        assert_eq!(seen[0].0, seen[1].0, "one id for both phases");
        assert_ne!(seen[0].0, seen[2].0);
        assert_eq!(
            (seen[0].2, seen[0].3, seen[0].4),
            (A, SyncKind::Data, SyncPhase::Before)
        );
        assert_eq!(seen[1].4, SyncPhase::After);
        assert_eq!(seen[0].1, p);
        assert_eq!(
            (&seen[2].1, seen[2].2, seen[2].3),
            (&root.path().to_path_buf(), B, SyncKind::Dir)
        );
    }

    #[test]
    fn an_observer_can_fail_a_sync() {
        let root = tempfile::tempdir().unwrap();
        let rec = Arc::new(Recorder {
            fail: Some(B),
            ..Recorder::default()
        });
        let _guard = install_sync_observer(root.path(), rec.clone());
        let p = root.path().join("f");
        let f = File::create(&p).unwrap();
        sync_file(&f, &p, A, true).unwrap();
        let err = sync_file(&f, &p, B, true).unwrap_err();
        assert!(err.to_string().contains("test.b"), "{err}");
        let phases: Vec<_> = rec.seen.lock().iter().map(|s| (s.2, s.4)).collect();
        assert_eq!(
            phases,
            [
                (A, SyncPhase::Before),
                (A, SyncPhase::After),
                (B, SyncPhase::Before)
            ],
            "no After for a failed sync"
        );
    }
}
