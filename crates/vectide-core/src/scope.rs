//! [`ScopeRegistry`]: values installed for a directory tree, looked up by
//! path, for test and crash-kit hooks that must not leak into other threads'
//! work.
//!
//! Tests run in parallel threads of one process, each in its own temporary
//! directory. A process-global hook (a sync observer, a media override)
//! therefore applies only to paths inside the root directory it was
//! installed for; code working elsewhere never sees it. With nothing
//! installed a lookup costs one relaxed atomic load.
//!
//! Roots are compared component by component ([`Path::starts_with`]),
//! first as given and then canonicalised, so that `dir/./x`, a symlinked
//! temporary directory or a relative path still match.

use parking_lot::RwLock;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

struct Entry<T> {
    id: u64,
    root: PathBuf,
    canonical: Option<PathBuf>,
    value: T,
}

/// Values installed per root directory (see the module docs). Meant to live
/// in a `static`.
pub struct ScopeRegistry<T: 'static> {
    installed: AtomicUsize,
    next_id: AtomicU64,
    entries: RwLock<Vec<Entry<T>>>,
}

impl<T: Clone + Send + Sync + 'static> ScopeRegistry<T> {
    /// An empty registry.
    pub const fn new() -> Self {
        ScopeRegistry {
            installed: AtomicUsize::new(0),
            next_id: AtomicU64::new(0),
            entries: RwLock::new(Vec::new()),
        }
    }

    /// Whether nothing is installed (one relaxed load: the fast path).
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.installed.load(Ordering::Relaxed) == 0
    }

    /// Installs `value` for every path inside `root` (and `root` itself)
    /// until the returned guard is dropped.
    pub fn install(&'static self, root: &Path, value: T) -> ScopeGuard<T> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut entries = self.entries.write();
        entries.push(Entry {
            id,
            root: root.to_path_buf(),
            canonical: std::fs::canonicalize(root).ok(),
            value,
        });
        self.installed.store(entries.len(), Ordering::Relaxed);
        ScopeGuard { registry: self, id }
    }

    /// The values whose root contains `path`, innermost root first (among
    /// equally deep roots, the latest installed first). Empty at the cost of
    /// one relaxed load when nothing is installed.
    pub fn matching(&self, path: &Path) -> Vec<T> {
        if self.is_empty() {
            return Vec::new();
        }
        let entries = self.entries.read();
        let mut canonical: Option<Option<PathBuf>> = None;
        let mut found: Vec<(usize, u64, T)> = entries
            .iter()
            .filter(|e| {
                path.starts_with(&e.root)
                    || e.canonical.as_ref().is_some_and(|root| {
                        canonical
                            .get_or_insert_with(|| canonicalize_lenient(path))
                            .as_ref()
                            .is_some_and(|p| p.starts_with(root))
                    })
            })
            .map(|e| (e.root.components().count(), e.id, e.value.clone()))
            .collect();
        drop(entries);
        found.sort_by_key(|e| std::cmp::Reverse((e.0, e.1)));
        found.into_iter().map(|(_, _, v)| v).collect()
    }

    /// The innermost value whose root contains `path`.
    pub fn innermost(&self, path: &Path) -> Option<T> {
        self.matching(path).into_iter().next()
    }

    fn remove(&self, id: u64) {
        let mut entries = self.entries.write();
        entries.retain(|e| e.id != id);
        self.installed.store(entries.len(), Ordering::Relaxed);
    }
}

impl<T: Clone + Send + Sync + 'static> Default for ScopeRegistry<T> {
    fn default() -> Self {
        Self::new()
    }
}

/// `path` canonicalised; a path that does not exist yet is canonicalised
/// through its nearest existing ancestor.
fn canonicalize_lenient(path: &Path) -> Option<PathBuf> {
    if let Ok(p) = std::fs::canonicalize(path) {
        return Some(p);
    }
    let parent = path.parent()?;
    let name = path.file_name()?;
    Some(canonicalize_lenient(parent)?.join(name))
}

/// Removes its value from the registry when dropped.
#[must_use = "the value is uninstalled when the guard is dropped"]
pub struct ScopeGuard<T: Clone + Send + Sync + 'static> {
    registry: &'static ScopeRegistry<T>,
    id: u64,
}

impl<T: Clone + Send + Sync + 'static> Drop for ScopeGuard<T> {
    fn drop(&mut self) {
        self.registry.remove(self.id);
    }
}

impl<T: Clone + Send + Sync + 'static> std::fmt::Debug for ScopeGuard<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScopeGuard").field("id", &self.id).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static REG: ScopeRegistry<u32> = ScopeRegistry::new();

    #[test]
    fn values_apply_inside_their_root_innermost_first_until_dropped() {
        let a = tempfile::tempdir().unwrap();
        let other = tempfile::tempdir().unwrap();
        let inner = a.path().join("sub");
        std::fs::create_dir(&inner).unwrap();
        let file = inner.join("f");
        assert!(REG.matching(&file).is_empty());
        let outer_guard = REG.install(a.path(), 1);
        let inner_guard = REG.install(&inner, 2);
        assert_eq!(REG.matching(&file), vec![2, 1]);
        assert_eq!(REG.innermost(&a.path().join("g")), Some(1));
        assert_eq!(REG.innermost(a.path()), Some(1), "the root itself");
        assert_eq!(REG.innermost(&other.path().join("f")), None);
        // A sibling whose name extends the root's is outside it.
        let sibling = PathBuf::from(format!("{}x/f", a.path().display()));
        assert_eq!(REG.innermost(&sibling), None);
        // A non-canonical spelling of a path inside still matches.
        std::fs::create_dir(a.path().join("x")).unwrap();
        let dotted = a.path().join("x").join("..").join("sub").join("f");
        assert!(!dotted.starts_with(&inner));
        assert_eq!(REG.innermost(&dotted), Some(2));
        drop(inner_guard);
        assert_eq!(REG.matching(&file), vec![1]);
        drop(outer_guard);
        assert!(REG.matching(&file).is_empty());
    }
}
