//! Shared check of the integration tests: a durable engine on its own log
//! whose apply fails after the log is poisoned until it is reopened.
#![allow(dead_code)]

use std::path::Path;
use vectide_core::fault::{install_faults, FaultSite, Faults};
use vectide_core::{Error, SearchParams, VectorIndex};

fn is_poisoned(r: Result<impl std::fmt::Debug, Error>, what: &str) -> String {
    match r {
        Err(Error::Poisoned(cause)) => cause,
        other => panic!("{what}: expected Poisoned, got {other:?}"),
    }
}

/// `create` makes the engine in `dir` (on its own log) and `open` reopens
/// it; `rows` holds `n + 2` vectors of `dim`. Inserts `0..n` (sequence
/// numbers 1..=n), makes the apply of `n` fail at `site`, and checks: the
/// failing call and every later write get `Poisoned` naming the first
/// cause, reads serve the state as it was, and a reopen replays the
/// failed write from the log and takes writes again.
pub fn a_failed_apply_poisons_until_the_reopen(
    dir: &Path,
    site: FaultSite,
    dim: usize,
    rows: &[f32],
    n: u64,
    create: impl FnOnce() -> Box<dyn VectorIndex>,
    open: impl FnOnce() -> Box<dyn VectorIndex>,
) {
    let row = |i: u64| &rows[i as usize * dim..(i as usize + 1) * dim];
    let idx = create();
    for i in 0..n {
        idx.insert(i + 1, &[i], row(i)).unwrap();
    }
    let plan = Faults::new();
    let guard = install_faults(dir, plan.clone());
    plan.arm(site, 1);
    let cause = is_poisoned(idx.insert(n + 1, &[n], row(n)), "the failing insert");
    assert!(
        cause.contains(&format!("injected fault at {}", site.0)),
        "{cause}"
    );
    assert_eq!(plan.fired(site), 1);
    drop(guard);

    // Reads go on from the state as it was.
    assert_eq!(idx.len(), n as usize);
    assert!(!idx.contains(n).unwrap());
    let sp = SearchParams::default();
    let hits = idx.search(row(1), 1, &sp, None).unwrap();
    assert_eq!(hits.first().map(|h| h.id), Some(1));

    // Writes and checkpoints are refused with the first cause.
    for (what, r) in [
        (
            "an insert",
            idx.insert(n + 2, &[n + 1], row(n + 1)).map(|_| 0),
        ),
        ("a delete", idx.delete(n + 2, &[0])),
    ] {
        assert_eq!(is_poisoned(r, what), cause);
    }
    // Neither a flush (nothing to do on its own log) nor the drop may
    // drop the failed write's log record: the reopen below checks it.
    let _ = idx.flush();
    assert_eq!(idx.len(), n as usize);
    drop(idx);

    let idx = open();
    assert_eq!(
        idx.len(),
        n as usize + 1,
        "the reopen replays the failed write"
    );
    assert!(idx.contains(n).unwrap());
    let next = idx.durable_seq() + 1;
    idx.insert(next, &[n + 1], row(n + 1)).unwrap();
    assert_eq!(idx.delete(next + 1, &[0]).unwrap(), 1);
    assert_eq!(idx.len(), n as usize + 1);
}
