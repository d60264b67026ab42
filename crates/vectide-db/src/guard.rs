//! Turning a dependency's panic on damaged bytes into a typed error.
//!
//! redb asserts on some inconsistencies of its file instead of returning an
//! error (a truncated `points.redb` trips `raw_file_len() >= layout.len()`).
//! Opening the store runs under [`catch_corruption`], which catches such a
//! panic and reports it as [`vectide_core::Error::Corrupted`]; the default panic message
//! is suppressed for that call only, so the user sees one clear error.

use crate::error::{DbError, Result};
use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Once;

thread_local! {
    static QUIET: Cell<bool> = const { Cell::new(false) };
}

static HOOK: Once = Once::new();

/// Installs (once) a panic hook that stays silent on threads inside
/// [`catch_corruption`] and defers to the previous hook elsewhere.
fn install_hook() {
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !QUIET.with(Cell::get) {
                previous(info);
            }
        }));
    });
}

/// Runs `f`; a panic inside it becomes `Corrupted("{what}: …")`.
pub fn catch_corruption<T>(what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    install_hook();
    let was = QUIET.with(|q| q.replace(true));
    let out = catch_unwind(AssertUnwindSafe(f));
    QUIET.with(|q| q.set(was));
    match out {
        Ok(r) => r,
        Err(p) => {
            let msg = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            Err(DbError::corrupted(format!(
                "{what} is damaged (the reader failed: {msg})"
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_a_corruption_error_and_values_pass_through() {
        let e = catch_corruption("x.redb", || -> Result<()> {
            panic!("assertion failed: len")
        })
        .unwrap_err();
        assert!(
            e.is_corrupted()
                && e.to_string().contains("x.redb")
                && e.to_string().contains("assertion failed"),
            "{e}"
        );
        assert_eq!(catch_corruption("y", || Ok(5)).unwrap(), 5);
        assert!(
            catch_corruption("z", || -> Result<()> { Err(DbError::invalid("no")) })
                .unwrap_err()
                .is_invalid_input()
        );
    }
}
