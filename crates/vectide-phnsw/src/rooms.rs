//! The free upper-list room of `upper.vtdp` (DRAM only): every run of
//! lists below `upper next` that no linked node owns, rebuilt by each
//! consolidation's step 7 from the node blocks, and taken by inserts
//! before they bump `upper next`.
//!
//! Room is counted in lists (`4·(1 + m)` bytes each); a node of level `L`
//! owns `L` consecutive lists. Before this pool, a freed slot kept only its
//! last node's room, for a new node of no higher level: the room of a slot
//! reused by a level-0 node, or outgrown by a higher one, was never owned
//! again, and `upper.vtdp` grew with the churn while the live set did not
//! (a 10-minute soak: 0.025 → 0.241 of the live vector bytes, linearly).
//!
//! Free runs are derived, never recorded: what a linked (`live` or
//! `deleted`) node's block names is taken, everything else below the word
//! is free. A block that recovery discarded (an insert cut off before its
//! NLog entry was `LOGGED`) owns nothing, whatever room it names, so room
//! that a crash made look owned twice is simply free.

use std::collections::BTreeMap;
use vectide_graph::prune::MAX_LEVEL;

/// Free runs of lists, by length (`1..=MAX_LEVEL`; longer gaps are cut into
/// runs of `MAX_LEVEL`, the most one node takes).
#[derive(Debug, Default)]
pub(crate) struct RoomPool {
    /// `runs[n - 1]`: byte offsets of free runs of `n` lists.
    runs: Vec<Vec<u64>>,
    list_bytes: u64,
    free_lists: u64,
}

impl RoomPool {
    /// The free runs of `[start, end)` (bytes) outside `taken` (start →
    /// end of each owned room; owned rooms may overlap one another or pass
    /// the bounds, which only shrinks what is free).
    pub(crate) fn from_gaps(
        start: u64,
        end: u64,
        list_bytes: u64,
        taken: &BTreeMap<u64, u64>,
    ) -> RoomPool {
        let mut pool = RoomPool {
            runs: vec![Vec::new(); MAX_LEVEL],
            list_bytes,
            free_lists: 0,
        };
        if list_bytes == 0 {
            return pool;
        }
        let mut at = start;
        for (&s, &e) in taken.range(..end) {
            if s > at {
                pool.add_gap(at, s.min(end));
            }
            at = at.max(e);
            if at >= end {
                break;
            }
        }
        if at < end {
            pool.add_gap(at, end);
        }
        // Lowest offsets last, so inserts take them first (pop) and the
        // room in use stays packed toward the start of the file.
        for r in &mut pool.runs {
            r.sort_unstable_by(|a, b| b.cmp(a));
        }
        pool
    }

    /// Adds `[s, e)`, cut at list boundaries (rooms start at whole lists
    /// from the header page: a partial list at either end stays unused).
    fn add_gap(&mut self, s: u64, e: u64) {
        let lb = self.list_bytes;
        let mut n = (e.saturating_sub(s)) / lb;
        let mut at = s;
        while n > 0 {
            let run = n.min(MAX_LEVEL as u64);
            self.runs[run as usize - 1].push(at);
            self.free_lists += run;
            at += run * lb;
            n -= run;
        }
    }

    /// Takes room for `level` lists (`1..=MAX_LEVEL`): the shortest free
    /// run that holds them, its rest given back. `None` when no run does.
    pub(crate) fn take(&mut self, level: usize) -> Option<u64> {
        if level == 0 || level > MAX_LEVEL {
            return None;
        }
        let n =
            (level..=MAX_LEVEL).find(|&n| self.runs.get(n - 1).is_some_and(|r| !r.is_empty()))?;
        let at = self.runs[n - 1].pop()?;
        if n > level {
            self.runs[n - level - 1].push(at + (level as u64) * self.list_bytes);
        }
        self.free_lists -= level as u64;
        Some(at)
    }

    /// Free lists in the pool.
    pub(crate) fn free_lists(&self) -> u64 {
        self.free_lists
    }

    /// Every free run, as byte ranges (for checks and tests).
    #[cfg(test)]
    pub(crate) fn ranges(&self) -> Vec<(u64, u64)> {
        let mut out: Vec<(u64, u64)> = self
            .runs
            .iter()
            .enumerate()
            .flat_map(|(i, r)| {
                r.iter()
                    .map(move |&s| (s, s + (i as u64 + 1) * self.list_bytes))
            })
            .collect();
        out.sort_unstable();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn taken(rooms: &[(u64, u64)]) -> BTreeMap<u64, u64> {
        rooms.iter().copied().collect()
    }

    #[test]
    fn an_empty_pool_gives_nothing() {
        let mut p = RoomPool::default();
        assert_eq!(p.take(1), None);
        assert_eq!(p.free_lists(), 0);
    }

    #[test]
    fn gaps_between_owned_rooms_are_free_and_nothing_owned_is() {
        // Lists of 10 bytes from 100 to 300; owned: [120, 140), [130, 150)
        // (overlapping, as a crash can leave), [200, 210), [290, 320).
        let t = taken(&[(120, 140), (130, 150), (200, 210), (290, 320)]);
        let p = RoomPool::from_gaps(100, 300, 10, &t);
        assert_eq!(p.ranges(), vec![(100, 120), (150, 200), (210, 290)]);
        assert_eq!(p.free_lists(), 2 + 5 + 8);
        for (s, e) in p.ranges() {
            for (&ts, &te) in &t {
                assert!(
                    e <= ts || s >= te,
                    "free [{s}, {e}) overlaps owned [{ts}, {te})"
                );
            }
        }
    }

    #[test]
    fn take_uses_the_shortest_run_that_fits_and_gives_the_rest_back() {
        let t = taken(&[(110, 120), (150, 160)]);
        // Free: [100, 110) one list, [120, 150) three, [160, 200) four.
        let mut p = RoomPool::from_gaps(100, 200, 10, &t);
        assert_eq!(p.take(2), Some(120)); // the run of 3, rest [140, 150)
        let mut ones = [p.take(1), p.take(1)];
        ones.sort();
        assert_eq!(ones, [Some(100), Some(140)]); // the runs of 1
        assert_eq!(p.take(4), Some(160));
        assert_eq!(p.take(1), None);
        assert_eq!(p.free_lists(), 0);
        assert_eq!(p.take(0), None);
        assert_eq!(p.take(MAX_LEVEL + 1), None);
    }

    #[test]
    fn long_gaps_are_cut_into_runs_a_node_can_take() {
        let mut p = RoomPool::from_gaps(0, 10 * (MAX_LEVEL as u64 * 2 + 3), 10, &BTreeMap::new());
        assert_eq!(p.free_lists(), MAX_LEVEL as u64 * 2 + 3);
        let mut got = Vec::new();
        while let Some(at) = p.take(MAX_LEVEL) {
            got.push(at);
        }
        assert_eq!(got, vec![0, 10 * MAX_LEVEL as u64]);
        assert_eq!(p.take(3), Some(20 * MAX_LEVEL as u64));
        assert_eq!(p.take(1), None);
    }
}
