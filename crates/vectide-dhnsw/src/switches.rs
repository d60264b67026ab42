//! The fault tests' switches (their mutation checks): each off, and in a
//! build that is not a test a constant `false` the compiler removes.

#[cfg(test)]
pub(crate) struct Switch(std::sync::atomic::AtomicBool);

#[cfg(test)]
impl Switch {
    const fn new() -> Switch {
        Switch(std::sync::atomic::AtomicBool::new(false))
    }
    pub(crate) fn set(&self, on: bool) {
        self.0.store(on, std::sync::atomic::Ordering::Relaxed);
    }
    pub(crate) fn on(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::Relaxed)
    }
}

#[cfg(not(test))]
pub(crate) struct Switch;

#[cfg(not(test))]
impl Switch {
    const fn new() -> Switch {
        Switch
    }
    #[inline(always)]
    pub(crate) fn on(&self) -> bool {
        false
    }
}

/// Readers take every read as if no writer were inside (what the
/// partitions' state check prevents).
pub(crate) static TRUST_TORN: Switch = Switch::new();
/// Entries are read as if no rebuild intent were there.
pub(crate) static IGNORE_INTENTS: Switch = Switch::new();
/// A writer stops once its new nodes are published, before it tombstones
/// the old ones (as one that dies there).
pub(crate) static STOP_BEFORE_TOMBSTONES: Switch = Switch::new();
