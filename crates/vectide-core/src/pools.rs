//! Process-wide worker pools: the engines of one process share them.
//!
//! An engine asks for a pool by a name (`fdann`, `spann`, `merge-io`, …) and
//! a worker count (its `threads` parameter, all cores by default). Engines
//! that ask for the same name and count get the same pool, so the threads a
//! process runs are bounded by the distinct (name, count) pairs in use, not
//! by the number of engines: fifty collections of `fresh-diskann` with the
//! default `threads` run one `fdann` pool of one thread per core between
//! them, where each used to start its own. A single engine gets a pool of
//! exactly the size it asked for, as before, so its parallelism is
//! unchanged; engines that share a pool share its cores, which is what the
//! cores can give them anyway.
//!
//! The registry holds weak references: a pool's threads end when the last
//! engine using it is dropped, and the next engine to ask starts it again.

use crate::error::{Error, Result};
use parking_lot::Mutex;
use std::sync::{Arc, Weak};

/// A shared worker pool.
pub type Pool = Arc<rayon::ThreadPool>;

/// What distinguishes one pool from another.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Key {
    name: &'static str,
    threads: usize,
    /// Nice level raised on each worker at start (0: unchanged).
    nice: i32,
}

static POOLS: Mutex<Vec<(Key, Weak<rayon::ThreadPool>)>> = Mutex::new(Vec::new());

fn get(key: Key) -> Result<Pool> {
    let mut pools = POOLS.lock();
    pools.retain(|(_, w)| w.strong_count() > 0);
    if let Some(p) = pools
        .iter()
        .find(|(k, _)| *k == key)
        .and_then(|(_, w)| w.upgrade())
    {
        return Ok(p);
    }
    let Key {
        name,
        threads,
        nice,
    } = key;
    let mut b = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(move |i| format!("vectide-{name}-{i}"));
    if nice > 0 {
        b = b.start_handler(move |_| {
            let _ = crate::sched::lower_priority(nice);
        });
    }
    let pool = Arc::new(
        b.build()
            .map_err(|e| Error::invalid(format!("cannot start {threads} threads: {e}")))?,
    );
    pools.push((key, Arc::downgrade(&pool)));
    Ok(pool)
}

/// The process's pool of `threads` workers named `vectide-{name}-{i}`
/// (started on first use).
pub fn shared(name: &'static str, threads: usize) -> Result<Pool> {
    get(Key {
        name,
        threads,
        nice: 0,
    })
}

/// As [`shared`], with each worker's nice level raised by `nice` at start
/// (work that should yield the cores to a more urgent phase).
pub fn shared_low_priority(name: &'static str, threads: usize, nice: i32) -> Result<Pool> {
    get(Key {
        name,
        threads,
        nice,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_pool_per_name_and_size_while_in_use() {
        let a = shared("pools-test", 3).unwrap();
        let b = shared("pools-test", 3).unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        let c = shared("pools-test", 2).unwrap();
        assert!(!Arc::ptr_eq(&a, &c));
        assert_eq!(c.current_num_threads(), 2);
        let weak = Arc::downgrade(&a);
        drop((a, b));
        assert!(weak.upgrade().is_none(), "the registry keeps no pool alive");
    }
}
