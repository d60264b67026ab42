//! Injected faults: named points on error paths that a test can make fail,
//! scoped by directory like the [`crate::sync`] observers.
//!
//! A write path calls [`hit`] with the directory it works in and the
//! [`FaultSite`] it is at; with nothing installed that costs one relaxed
//! atomic load. A test installs a [`Faults`] plan for its temporary
//! directory ([`install_faults`]) and arms a site for its next `n` hits;
//! each armed hit returns an I/O error, as a failing disk would, and the
//! plan counts it. Work in other directories (other tests' threads) never
//! sees the plan.

use crate::error::{Error, Result};
use crate::scope::{ScopeGuard, ScopeRegistry};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

/// The name of a fault point ("db.apply", "spfresh.apply", …).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FaultSite(pub &'static str);

/// A test's plan: which sites fail their next hits, and how many failed.
#[derive(Debug, Default)]
pub struct Faults {
    armed: Mutex<HashMap<&'static str, u64>>,
    fired: Mutex<HashMap<&'static str, u64>>,
}

impl Faults {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Makes the next `n` hits of `site` fail.
    pub fn arm(&self, site: FaultSite, n: u64) {
        *self.armed.lock().entry(site.0).or_default() += n;
    }

    /// Hits of `site` that failed so far.
    pub fn fired(&self, site: FaultSite) -> u64 {
        self.fired.lock().get(site.0).copied().unwrap_or(0)
    }

    fn take(&self, site: FaultSite) -> bool {
        let mut armed = self.armed.lock();
        match armed.get_mut(site.0) {
            Some(n) if *n > 0 => {
                *n -= 1;
                drop(armed);
                *self.fired.lock().entry(site.0).or_default() += 1;
                true
            }
            _ => false,
        }
    }
}

static PLANS: ScopeRegistry<Arc<Faults>> = ScopeRegistry::new();

/// Removes its plan when dropped.
pub type FaultGuard = ScopeGuard<Arc<Faults>>;

/// Installs `plan` for the fault points hit with a path inside `root`.
pub fn install_faults(root: &Path, plan: Arc<Faults>) -> FaultGuard {
    PLANS.install(root, plan)
}

/// The fault point itself: an injected I/O error if a plan for `path` has
/// `site` armed, else `Ok`.
#[inline]
pub fn hit(path: &Path, site: FaultSite) -> Result<()> {
    if PLANS.is_empty() {
        return Ok(());
    }
    for plan in PLANS.matching(path) {
        if plan.take(site) {
            return Err(Error::io_at(
                path,
                std::io::Error::other(format!("injected fault at {}", site.0)),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_armed_site_fails_its_next_hits_in_its_directory_only() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        let site = FaultSite("test.apply");
        assert!(hit(a.path(), site).is_ok());
        let plan = Faults::new();
        let _g = install_faults(a.path(), plan.clone());
        plan.arm(site, 2);
        // Another directory and another site are untouched.
        assert!(hit(b.path(), site).is_ok());
        assert!(hit(&a.path().join("x"), FaultSite("other")).is_ok());
        let e = hit(&a.path().join("x"), site).unwrap_err();
        assert!(
            e.to_string().contains("injected fault at test.apply"),
            "{e}"
        );
        assert!(hit(a.path(), site).is_err());
        assert!(hit(a.path(), site).is_ok());
        assert_eq!(plan.fired(site), 2);
    }
}
