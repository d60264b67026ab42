//! [`Poison`]: what a durable engine or a database collection holds once a
//! write that is already in its log failed to apply.
//!
//! From then on the state in memory differs from the log: serving more
//! writes on top of it would make acknowledged results that a reopen (which
//! replays the log) does not reproduce. So the first such failure poisons
//! the holder: reads go on from the state as it is, every later write gets
//! [`Error::Poisoned`] naming the first cause, and only a reopen clears it.

use crate::error::{Error, Result};
use std::sync::OnceLock;

/// The poison flag (module docs). Cheap to check: one atomic load.
#[derive(Debug, Default)]
pub struct Poison(OnceLock<String>);

impl Poison {
    /// `Err(Poisoned)` once poisoned, else `Ok`: the first thing a write does.
    #[inline]
    pub fn check(&self) -> Result<()> {
        match self.0.get() {
            None => Ok(()),
            Some(cause) => Err(Error::Poisoned(cause.clone())),
        }
    }

    /// Poisons (the first cause is kept) after `what` failed with `e`, and
    /// returns the error to give the writer whose write failed: the
    /// [`Error::Poisoned`] that later writers will get too.
    pub fn poison(&self, what: &str, e: &dyn std::fmt::Display) -> Error {
        let cause = self.0.get_or_init(|| format!("{what} failed: {e}"));
        Error::Poisoned(cause.clone())
    }

    /// The first cause, if poisoned.
    pub fn cause(&self) -> Option<&str> {
        self.0.get().map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_cause_sticks_and_every_later_write_is_refused() {
        let p = Poison::default();
        assert!(p.check().is_ok());
        let e = p.poison("apply of seq 7", &Error::invalid("disk gone"));
        assert!(
            matches!(e, Error::Poisoned(ref c) if c.contains("apply of seq 7 failed: disk gone"))
        );
        p.poison("apply of seq 8", &Error::invalid("another"));
        let later = p.check().unwrap_err();
        assert!(later.to_string().contains("seq 7"), "{later}");
        assert!(!later.to_string().contains("seq 8"), "{later}");
        assert_eq!(p.cause(), Some("apply of seq 7 failed: disk gone"));
    }
}
