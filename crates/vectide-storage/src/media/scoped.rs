//! Media chosen per directory: a crash kit runs an engine it knows only
//! through the registry on [`super::SimMedia`] by installing an override for
//! the engine's directory; the engine asks [`media_for`] when it opens or
//! creates a region there.
//!
//! Overrides are scoped like the sync observers of `vectide_core::sync`
//! (see `vectide_core::scope`): they apply to paths inside their root only,
//! the innermost root wins, and with none installed [`media_for`] costs one
//! relaxed atomic load before calling the default.

use super::Media;
use std::path::Path;
use std::sync::Arc;
use vectide_core::scope::{ScopeGuard, ScopeRegistry};

static OVERRIDES: ScopeRegistry<Arc<dyn Media>> = ScopeRegistry::new();

/// Removes its override when dropped.
pub type MediaGuard = ScopeGuard<Arc<dyn Media>>;

/// Makes [`media_for`] return `media` for every path inside `root` (or
/// `root` itself) until the guard is dropped.
pub fn install_media_override(root: &Path, media: Arc<dyn Media>) -> MediaGuard {
    OVERRIDES.install(root, media)
}

/// The media for a region under `path`: the override of the innermost root
/// containing it, else `default()` (the engine's own choice, from its
/// parameters). Engines call it once per open or create.
pub fn media_for(path: &Path, default: impl FnOnce() -> Arc<dyn Media>) -> Arc<dyn Media> {
    OVERRIDES.innermost(path).unwrap_or_else(default)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::media::{MsyncMedia, SimConfig, SimMedia};
    use crate::region::{Region, Site};

    fn msync() -> Arc<dyn Media> {
        Arc::new(MsyncMedia::new())
    }

    #[test]
    fn regions_inside_the_root_get_the_override_others_the_default() {
        let root = tempfile::tempdir().unwrap();
        let other = tempfile::tempdir().unwrap();
        let sim = Arc::new(SimMedia::new(SimConfig::default()));
        let guard = install_media_override(root.path(), sim.clone());
        let inside = root.path().join("index").join("nodes.bin");
        assert_eq!(media_for(&inside, msync).kind(), "sim");
        assert_eq!(media_for(&other.path().join("x"), msync).kind(), "msync");
        // A region created through it runs on the simulator: its fences are
        // the simulator's.
        let path = root.path().join("r");
        let region = Region::create(media_for(&path, msync), &path, 4096).unwrap();
        region
            .u64_at(0)
            .store(7, std::sync::atomic::Ordering::Relaxed);
        region.persist(Site("test"), 0, 8);
        region.fence(Site("test"));
        assert_eq!(sim.fences(), 1);
        // The innermost root wins.
        let inner = Arc::new(SimMedia::new(SimConfig::default()));
        let inner_guard = install_media_override(&root.path().join("index"), inner.clone());
        let m = media_for(&inside, msync);
        m.fence(Site("test"));
        assert_eq!((inner.fences(), sim.fences()), (1, 1));
        drop(inner_guard);
        drop(guard);
        assert_eq!(media_for(&inside, msync).kind(), "msync");
    }
}
