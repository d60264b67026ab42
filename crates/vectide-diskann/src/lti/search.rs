//! DiskANN's beam search over an LTI (module docs of `lti`): one query at
//! a time ([`Lti::search`]) or several in lockstep, their reads of a hop
//! batched together ([`Lti::search_expanded_lockstep`]).

use super::cache::{HopSectors, Lockstep, ReadCaches, Scratch};
use super::{record_in, Lti, QueryStats};
use crate::layout::{Node, NO_LABEL};
use vectide_core::{Error, Result};
use vectide_storage::block::BLOCK;

impl Lti {
    /// Beam search: the `k` nearest admitted nodes to `q` (normalised under
    /// cosine) by exact distance, as `(distance, label)` into `out`.
    /// `admit(node, label)` decides which expanded nodes may be results.
    #[allow(clippy::too_many_arguments)]
    pub fn search(
        &self,
        q: &[f32],
        k: usize,
        l: usize,
        w: usize,
        admit: &dyn Fn(u32, u64) -> bool,
        scratch: &mut Scratch,
        out: &mut Vec<(f32, u64)>,
    ) -> Result<QueryStats> {
        self.beam(q, k, l, w, admit, false, scratch, out)
    }

    /// GreedySearch for StreamingMerge's Insert phase: the beam search with
    /// list `l`, leaving every expanded node that holds a point (the start
    /// node included) with its exact distance and vector in
    /// `scratch.expanded` / `scratch.expanded_vectors`.
    pub fn search_expanded(
        &self,
        q: &[f32],
        l: usize,
        w: usize,
        scratch: &mut Scratch,
    ) -> Result<QueryStats> {
        let mut out = Vec::new();
        self.beam(q, 1, l, w, &|_, _| false, true, scratch, &mut out)
    }

    /// GreedySearch as [`Lti::search_expanded`] for each of `jobs`, up to
    /// one search per slot of `ls` at a time, in lock-step: each round
    /// every search in flight picks its hop's nodes, the records none of
    /// the caches hold are read in one batch (each once, however many
    /// searches want it), and every search expands its nodes. A slot whose
    /// search ends takes the next job at once. `done(job, scratch, stats)`
    /// is called as each search ends (in no fixed order), with
    /// `scratch.expanded` / `scratch.expanded_vectors` filled; a record
    /// read once for several searches counts as read by the first and as
    /// a cache hit by the others.
    ///
    /// StreamingMerge's Insert phase runs its searches so: one batch per
    /// round for all of a thread's searches instead of one per search, so
    /// far fewer submissions, wake-ups and thread switches per read.
    pub fn search_expanded_lockstep<'q>(
        &self,
        jobs: impl IntoIterator<Item = usize>,
        query: impl Fn(usize) -> &'q [f32],
        l: usize,
        w: usize,
        ls: &mut Lockstep,
        mut done: impl FnMut(usize, &Scratch, QueryStats) -> Result<()>,
    ) -> Result<()> {
        let (l, w) = (l.max(1), w.max(1));
        let bytes = self.header.sectors_per_node() * BLOCK;
        let mut jobs = jobs.into_iter();
        let Lockstep {
            slots,
            caches,
            bufs,
            reads,
        } = ls;
        for slot in slots.iter_mut() {
            slot.job = None;
        }
        loop {
            reads.clear();
            let mut planned = false;
            for slot in slots.iter_mut() {
                slot.planned = false;
                loop {
                    let j = match slot.job {
                        Some(j) => j,
                        None => {
                            let Some(j) = jobs.next() else { break };
                            slot.stats = QueryStats::default();
                            if !self.beam_start(query(j), 1, &mut slot.scratch, &mut slot.stats)? {
                                done(j, &slot.scratch, slot.stats)?;
                                continue;
                            }
                            slot.job = Some(j);
                            j
                        }
                    };
                    if self.beam_plan(w, &mut slot.scratch, caches, reads, &mut slot.stats) {
                        slot.planned = true;
                        planned = true;
                        break;
                    }
                    slot.job = None;
                    done(j, &slot.scratch, slot.stats)?;
                }
            }
            if !planned {
                return Ok(());
            }
            if !reads.is_empty() {
                self.read_sectors(reads, bufs)?;
            }
            let src = HopSectors {
                cache: &self.cache,
                caches,
                reads,
                bufs,
            };
            for slot in slots.iter_mut().filter(|s| s.planned) {
                let q = query(slot.job.unwrap_or_default());
                let no = |_: u32, _: u64| false;
                self.beam_hop(q, l, &no, true, &mut slot.scratch, &mut slot.stats, &src)?;
            }
            caches.keep(reads, bufs, bytes);
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn beam(
        &self,
        q: &[f32],
        k: usize,
        l: usize,
        w: usize,
        admit: &dyn Fn(u32, u64) -> bool,
        collect: bool,
        scratch: &mut Scratch,
        out: &mut Vec<(f32, u64)>,
    ) -> Result<QueryStats> {
        out.clear();
        let mut stats = QueryStats::default();
        if !self.beam_start(q, k, scratch, &mut stats)? {
            return Ok(stats);
        }
        let (l, w) = (l.max(k).max(1), w.max(1));
        let bytes = self.header.sectors_per_node() * BLOCK;
        let mut caches = std::mem::take(&mut scratch.caches);
        let mut bufs = std::mem::take(&mut scratch.bufs);
        let mut reads = std::mem::take(&mut scratch.reads);
        let r = (|| -> Result<()> {
            loop {
                reads.clear();
                if !self.beam_plan(w, scratch, &mut caches, &mut reads, &mut stats) {
                    return Ok(());
                }
                if !reads.is_empty() {
                    self.read_sectors(&reads, &mut bufs)?;
                }
                let src = HopSectors {
                    cache: &self.cache,
                    caches: &caches,
                    reads: &reads,
                    bufs: &bufs,
                };
                self.beam_hop(q, l, admit, collect, scratch, &mut stats, &src)?;
                caches.keep(&reads, &bufs, bytes);
            }
        })();
        scratch.caches = caches;
        scratch.bufs = bufs;
        scratch.reads = reads;
        r?;
        self.beam_done(k, scratch, out);
        Ok(stats)
    }

    /// A search's set-up: the PQ table of `q` and a list holding the start
    /// node. False when there is nothing to search (no nodes, or `k` 0).
    fn beam_start(
        &self,
        q: &[f32],
        k: usize,
        scratch: &mut Scratch,
        stats: &mut QueryStats,
    ) -> Result<bool> {
        let h = &self.header;
        scratch.expanded.clear();
        scratch.expanded_vectors.clear();
        scratch.full.clear();
        if q.len() != h.dim as usize {
            return Err(Error::DimensionMismatch {
                expected: h.dim as usize,
                got: q.len(),
            });
        }
        if h.nodes == 0 || k == 0 {
            return Ok(false);
        }
        self.pq.table_into(q, h.metric, &mut scratch.table)?;
        scratch.visited.clear();
        scratch.list.clear();
        scratch.vec.resize(h.dim as usize, 0.0);
        let start = h.start as u32;
        scratch.visited.insert(start);
        scratch
            .list
            .push((scratch.table.distance(self.code(start)), start, false));
        stats.pq_distances += 1;
        scratch.done.clear();
        Ok(true)
    }

    /// Picks a hop's nodes (the `w` nearest unexpanded in the list) into
    /// `scratch.batch` and their first sectors into `scratch.sectors`;
    /// each sector neither cached nor in `reads` already is pushed to
    /// `reads` and counted as read. False when the search is over.
    fn beam_plan(
        &self,
        w: usize,
        scratch: &mut Scratch,
        caches: &mut ReadCaches,
        reads: &mut Vec<u64>,
        stats: &mut QueryStats,
    ) -> bool {
        let h = &self.header;
        scratch.batch.clear();
        for e in scratch.list.iter_mut() {
            if !e.2 {
                e.2 = true;
                scratch.batch.push(e.1);
                if scratch.batch.len() == w {
                    break;
                }
            }
        }
        if scratch.batch.is_empty() {
            return false;
        }
        scratch.sectors.clear();
        let mut read_any = false;
        for &id in &scratch.batch {
            let (first, _) = h.locate(id as u64);
            if scratch.sectors.contains(&first) {
                continue;
            }
            scratch.sectors.push(first);
            if self.cache.contains_key(&first) || caches.hit(first) || reads.contains(&first) {
                stats.cache_hits += 1;
            } else {
                reads.push(first);
                stats.sectors_read += h.sectors_per_node() as u64;
                read_any = true;
            }
        }
        if read_any {
            stats.hops += 1;
        }
        true
    }

    /// Expands a hop's nodes (`scratch.batch`, their records in `src`),
    /// then the sector mates whose exact distance would enter the list.
    #[allow(clippy::too_many_arguments)]
    fn beam_hop(
        &self,
        q: &[f32],
        l: usize,
        admit: &dyn Fn(u32, u64) -> bool,
        collect: bool,
        scratch: &mut Scratch,
        stats: &mut QueryStats,
        src: &HopSectors<'_>,
    ) -> Result<()> {
        let h = &self.header;
        let nps = h.nodes_per_sector();
        let mut joined = Vec::new();
        let batch = std::mem::take(&mut scratch.batch);
        let sectors = std::mem::take(&mut scratch.sectors);
        let r = (|| -> Result<()> {
            for &id in &batch {
                if scratch.done.contains(id) {
                    continue; // expanded as a sector mate this hop
                }
                let rec = record_in(h, src.get(h.locate(id as u64).0), id, &mut joined);
                let node = Node::parse(rec, h)?;
                node.vector_into(&mut scratch.vec)?;
                let d = (self.dist)(q, &scratch.vec);
                stats.exact_distances += 1;
                self.expand(id, &node, d, false, l, admit, collect, scratch, stats)?;
            }
            // Sector mates: their records came with the read. One whose
            // exact distance would enter the list is expanded now, saving
            // the read its expansion would cost later.
            if nps > 1 {
                for &first in &sectors {
                    let buf = src.get(first);
                    let base = (first - 1) * nps as u64;
                    for slot in 0..nps as u64 {
                        let v = base + slot;
                        if v >= h.nodes || scratch.done.contains(v as u32) {
                            continue;
                        }
                        let v = v as u32;
                        let node = Node::parse(record_in(h, buf, v, &mut joined), h)?;
                        if node.label == NO_LABEL {
                            continue;
                        }
                        node.vector_into(&mut scratch.vec)?;
                        let d = (self.dist)(q, &scratch.vec);
                        stats.exact_distances += 1;
                        let enters =
                            scratch.list.len() < l || scratch.list.last().is_some_and(|e| d < e.0);
                        if enters {
                            self.expand(v, &node, d, true, l, admit, collect, scratch, stats)?;
                        }
                    }
                }
            }
            Ok(())
        })();
        scratch.batch = batch;
        scratch.sectors = sectors;
        r
    }

    /// The `k` nearest results of a finished search into `out`.
    fn beam_done(&self, k: usize, scratch: &mut Scratch, out: &mut Vec<(f32, u64)>) {
        scratch
            .full
            .sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        out.clear();
        out.extend(scratch.full.iter().take(k).copied());
    }

    /// Expands node `id` (exact distance `d`, its vector in
    /// `scratch.vec`): a result if admitted, collected under
    /// `search_expanded`, its unvisited neighbours into the list by PQ
    /// distance. A sector mate (`mate`) also enters the list, expanded.
    #[allow(clippy::too_many_arguments)]
    fn expand(
        &self,
        id: u32,
        node: &Node<'_>,
        d: f32,
        mate: bool,
        l: usize,
        admit: &dyn Fn(u32, u64) -> bool,
        collect: bool,
        scratch: &mut Scratch,
        stats: &mut QueryStats,
    ) -> Result<()> {
        scratch.done.insert(id);
        stats.expanded += 1;
        if mate {
            if scratch.visited.insert(id) {
                insert_bounded(&mut scratch.list, l, (d, id, true));
            } else if let Some(e) = scratch.list.iter_mut().find(|e| e.1 == id) {
                e.2 = true;
            }
        }
        if node.label != NO_LABEL {
            if collect {
                scratch.expanded.push((d, id));
                scratch.expanded_vectors.extend_from_slice(&scratch.vec);
            }
            if id as u64 != self.header.start && admit(id, node.label) {
                scratch.full.push((d, node.label));
            }
        }
        // The unvisited neighbours' PQ distances in one batch (their
        // visited slots fetched first: each probe is a cache miss).
        for nbr in node.neighbor_ids() {
            scratch.visited.prefetch(nbr);
        }
        scratch.fresh.clear();
        for nbr in node.neighbor_ids() {
            if scratch.visited.insert(nbr) {
                scratch.fresh.push(nbr);
            }
        }
        scratch
            .table
            .distances_at(&self.codes, &scratch.fresh, &mut scratch.dists)?;
        stats.pq_distances += scratch.fresh.len() as u64;
        // Those that can enter, sorted, merged into the list in one pass.
        let worst = if scratch.list.len() >= l {
            scratch.list.last().map_or(f32::INFINITY, |e| e.0)
        } else {
            f32::INFINITY
        };
        scratch.entering.clear();
        scratch.entering.extend(
            scratch
                .fresh
                .iter()
                .zip(&scratch.dists)
                .filter(|e| *e.1 < worst)
                .map(|(&nbr, &d)| (d, nbr, false)),
        );
        if !scratch.entering.is_empty() {
            scratch
                .entering
                .sort_unstable_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
            merge_bounded(&mut scratch.list, &scratch.entering, l, &mut scratch.merged);
        }
        Ok(())
    }
}

/// Merges `new` (sorted) into the distance-sorted `list`, keeping the `l`
/// best; an entry already in `list` goes first among equal distances.
fn merge_bounded(
    list: &mut Vec<(f32, u32, bool)>,
    new: &[(f32, u32, bool)],
    l: usize,
    merged: &mut Vec<(f32, u32, bool)>,
) {
    merged.clear();
    let (mut i, mut j) = (0, 0);
    while merged.len() < l && (i < list.len() || j < new.len()) {
        if j == new.len() || (i < list.len() && list[i].0 <= new[j].0) {
            merged.push(list[i]);
            i += 1;
        } else {
            merged.push(new[j]);
            j += 1;
        }
    }
    std::mem::swap(list, merged);
}

/// Inserts into a distance-sorted list kept at most `l` long.
fn insert_bounded(list: &mut Vec<(f32, u32, bool)>, l: usize, e: (f32, u32, bool)) {
    if list.len() >= l && list.last().is_some_and(|last| e.0 >= last.0) {
        return;
    }
    let at = list.partition_point(|x| x.0 <= e.0);
    list.insert(at, e);
    list.truncate(l);
}

#[cfg(test)]
mod merge_tests {
    use super::{insert_bounded, merge_bounded};

    #[test]
    fn merging_a_sorted_batch_equals_inserting_one_at_a_time() {
        for l in [1, 5, 16] {
            let (mut a, mut b, mut tmp) = (Vec::new(), Vec::new(), Vec::new());
            for round in 0..40u32 {
                let mut new: Vec<(f32, u32, bool)> = (0..round % 7)
                    .map(|k| (((round * 31 + k * 17) % 23) as f32, round * 10 + k, false))
                    .collect();
                new.sort_by(|x, y| x.0.total_cmp(&y.0).then(x.1.cmp(&y.1)));
                for &e in &new {
                    insert_bounded(&mut a, l, e);
                }
                merge_bounded(&mut b, &new, l, &mut tmp);
                assert_eq!(a, b, "l {l} round {round}");
                assert!(b.len() <= l);
            }
        }
    }
}
