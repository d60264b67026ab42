//! Consolidation: repairs the lists that name deleted nodes, unlinks those
//! nodes and hands their slots to inserts (`maintain()`, or a writer whose
//! delete or upsert pushes the tombstones past `consolidate_fraction` of the
//! live nodes).
//!
//! Searches go on throughout and see every list either before or after its
//! repair; inserts and deletes wait (the `mutate` lock, exclusive) only in
//! steps 1, 4 and 7. The steps, each "→ F" a fence:
//!
//! 1. With writers paused for an instant: every `DELETED` node below the
//!    allocation word is dead. Every insert after this starts with them
//!    deleted and never links to one (`plan_links` admits no deleted node),
//!    so a repaired list gains no edge to a dead node again.
//! 2. Beside inserts and deletes, a stretch of slots at a time: every list
//!    of a linked node outside the dead set that names a dead node is
//!    recomputed without locks (`vectide_graph::repair::repair_list`: the
//!    dead neighbours give way to their own live neighbours, pruned by the
//!    engine's heuristic).
//! 3. The repaired lists are written `nlist_entries / nlog_entries` at a
//!    time under the NlistLog protocol of an insert's in-edges, on the
//!    NlistLog entries of one claimed NLog entry (whose own state stays
//!    `LOGGING`: nothing is redone), each batch holding its nodes' lock
//!    stripes (ascending, as an insert's back-edges take them; a list an
//!    insert changed since step 2 is recomputed under the lock): old lists
//!    into the entries → F; their `LOGGED` → F; new lists in place → F;
//!    their `NONE` → F. A crash undoes the batch in flight (its lists name
//!    the dead nodes again, which are still `DELETED`).
//! 4. Writers paused again: if the entry point is dead, the entry word
//!    moves to a live node of the highest level (or to "empty" when none is
//!    left) → F.
//! 5. Beside inserts and deletes: every live node the entry point no
//!    longer reaches on layer 0 is linked from a reachable one, one logged
//!    list at a time under that node's lock stripe (a list an insert
//!    changed since it was read is left, and the node with it, for the next
//!    consolidation).
//! 6. Still beside them: every dead node's state becomes
//!    `UNLINKED` → F: no list, bucket (a delete or an upsert left a
//!    tombstone or the new node there) or entry word names it, and no
//!    insert links to a `DELETED` or `UNLINKED` node.
//! 7. Writers paused again, the readers' gate is taken exclusively once
//!    (every search or lookup that began before step 6 ends first), then
//!    the free list is rebuilt
//!    from the node states: every slot below the allocation word that is not
//!    `LIVE` or `DELETED` (`UNLINKED`, or an insert's slot whose NLog entry a
//!    crash discarded), and with it the pool of upper-list room that no
//!    linked node owns ([`crate::rooms`]). An insert takes a slot from that
//!    list before it extends `nodes.vtdp`, and room from the pool before it
//!    bumps `upper next`.
//!
//! The meta word `consolidating` is set → F after step 1 and cleared once
//! step 5 is durable: a crash between them can leave a live node no list
//! names, so an open that finds it set runs the consolidation again. Room
//! is free when no linked node owns it, whatever other blocks name: a crash
//! can make a discarded insert's block name room that a later insert was
//! given.
//!
//! The free list and the room pool live in DRAM only: an open starts with
//! empty ones, and the first consolidation rebuilds them.

use super::layout::{pack_entry, DELETED, LIVE, M_CONSOLIDATING, M_ENTRY, NO_ENTRY, UNLINKED};
use super::log::{LOGGED, NONE};
use super::rooms::RoomPool;
use super::state::PHnsw;
use rayon::prelude::*;
use std::sync::atomic::Ordering;
use std::time::Instant;
use vectide_core::{Result, VectorIndex};
use vectide_graph::repair::{reconnect_unreachable_with, repair_list, RepairScratch};
use vectide_graph::Graph;
use vectide_storage::Site;

pub(crate) const S_C_BEGIN: Site = Site("consolidate.begin");
pub(crate) const F_C_BEGIN: Site = Site("consolidate.fence.begin");
pub(crate) const S_C_END: Site = Site("consolidate.end");
pub(crate) const S_C_ENTRY: Site = Site("consolidate.entry_point");
pub(crate) const F_C_ENTRY: Site = Site("consolidate.fence.entry_point");
pub(crate) const S_C_NLIST: Site = Site("consolidate.nlist");
pub(crate) const F_C_NLIST: Site = Site("consolidate.fence.nlist");
pub(crate) const S_C_LOGGED: Site = Site("consolidate.logged");
pub(crate) const F_C_LOGGED: Site = Site("consolidate.fence.logged");
pub(crate) const S_C_LISTS: Site = Site("consolidate.lists");
pub(crate) const F_C_LISTS: Site = Site("consolidate.fence.lists");
pub(crate) const S_C_DONE: Site = Site("consolidate.none");
pub(crate) const F_C_DONE: Site = Site("consolidate.fence.none");
pub(crate) const S_C_UNLINK: Site = Site("consolidate.unlink");
pub(crate) const F_C_UNLINK: Site = Site("consolidate.fence.unlink");

/// The node number a consolidation's NlistLog entries carry in place of an
/// insert's new node (no slot has it: the index holds at most `2^32 − 2`).
pub(crate) const CONSOLIDATION_NODE: u32 = u32::MAX;

/// Slots whose repairs a consolidation plans at a time.
pub(crate) const REPAIR_STRETCH: usize = 256;

/// Tombstones below which a writer does not start a consolidation on its
/// own (`maintain()` consolidates any number).
pub(crate) const AUTO_MIN_TOMBSTONES: usize = 64;

impl PHnsw {
    /// Slots below the allocation word that hold neither a live node nor a
    /// reclaimable one yet: deleted nodes (and, until the first
    /// consolidation after an open, slots a crash left unused).
    pub(crate) fn tombstones(&self) -> usize {
        let used = self.next_slot().saturating_sub(self.free.lock().len());
        used.saturating_sub(self.len())
    }

    /// Starts a consolidation from a writer, after its call's work and
    /// without its locks, when the tombstones pass `consolidate_fraction` of
    /// the live nodes (and [`AUTO_MIN_TOMBSTONES`]); one writer at a time.
    pub(crate) fn consolidate_if_due(&self) -> Result<()> {
        if !self.consolidation_due()
            || self.maintenance_deferred.load(Ordering::Acquire)
            || self
                .consolidating
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
                .is_err()
        {
            return Ok(());
        }
        let r = self.consolidate_now();
        self.consolidating.store(false, Ordering::Release);
        r.map(|_| ())
    }

    /// Whether tombstones passed `consolidate_fraction` of the live count
    /// (and number at least `AUTO_MIN_TOMBSTONES`).
    pub(crate) fn consolidation_due(&self) -> bool {
        let t = self.tombstones();
        t >= AUTO_MIN_TOMBSTONES
            && t as f64 > self.params.consolidate_fraction * self.len().max(1) as f64
    }

    /// Runs a consolidation (see the module docs); returns the slots it
    /// unlinked.
    pub fn consolidate(&self) -> Result<usize> {
        // Another consolidation may be running (a writer's): this one waits
        // for it on the lock and then finds what is left.
        self.consolidate_now()
    }

    fn consolidate_now(&self) -> Result<usize> {
        self.poison.check()?;
        let _serial = self.consolidation_serial.lock();
        let _job = self.activity.begin("consolidate");
        let t0 = Instant::now();
        let g = &self.graph;
        // Step 1: the dead set, taken once no insert is half done. Every
        // insert after this starts with these nodes deleted and never links
        // to them (`plan_links` admits no deleted node).
        let (dead, next) = {
            let _exclusive = self.mutate.write();
            let next = self.next_slot().min(g.capacity()) as u32;
            let dead: Vec<bool> = (0..next).map(|s| g.state(s) == DELETED).collect();
            (dead, next)
        };
        let n_dead = dead.iter().filter(|&&d| d).count();
        let mut repaired = 0;
        if n_dead > 0 {
            // Between the first repaired list and the last relink a live
            // node may be reachable from nowhere: an open that finds the
            // word set finishes the consolidation.
            self.set_consolidating(1, S_C_BEGIN);
            self.meta.fence(F_C_BEGIN);
            let owner = self.logs.nlog_claim(&self.meta);
            let mut batch = 0;
            // Steps 2-3 beside inserts and deletes.
            repaired = self.repair_lists(&dead, next, owner, &mut batch);
            // Step 4 with inserts and deletes paused.
            let paused = self.pause_writers(|| {
                self.move_entry_off(&dead, self.next_slot().min(g.capacity()) as u32)
            });
            // Step 5 beside them.
            let relinked = self.relink(owner, &mut batch);
            repaired += relinked;
            self.consolidation
                .relinked
                .fetch_add(relinked as u64, Ordering::Relaxed);
            // The NLog entry only owned the NlistLog entries: its state was
            // never more than `LOGGING`, which recovery discards.
            self.logs.nlog_store_state(&self.meta, owner, NONE);
            self.logs.nlog_release(owner);
            // Every list is durable (each batch ends with a fence); the
            // unlink's fence makes the word durable with the states.
            self.set_consolidating(0, S_C_END);
            // Step 6 beside inserts and deletes: no list names a dead node
            // and no insert links to one (`DELETED` or `UNLINKED`), so
            // their states change under nobody's feet. The persists land
            // on scattered pages: this is the step that paused writers
            // longest when it ran under the exclusive lock.
            for s in (0..next).filter(|&s| dead[s as usize]) {
                g.state_word(s).store(UNLINKED, Ordering::Release);
                g.nodes
                    .persist(S_C_UNLINK, g.node_off(s) + self.g.n_state(), 4);
            }
            self.meta.fence(F_C_UNLINK);
            // Step 7 paused again.
            let freeing = self.pause_writers(|| {
                self.rebuild_free_list(self.next_slot().min(g.capacity()) as u32)
            });
            let c = &self.consolidation;
            c.paused_micros
                .fetch_add(paused + freeing, Ordering::Relaxed);
            c.paused_max_micros
                .fetch_max(paused.max(freeing), Ordering::Relaxed);
        } else {
            let _exclusive = self.mutate.write();
            self.rebuild_free_list(self.next_slot().min(g.capacity()) as u32);
        }
        let c = &self.consolidation;
        c.runs.fetch_add(1, Ordering::Relaxed);
        c.unlinked.fetch_add(n_dead as u64, Ordering::Relaxed);
        c.lists_repaired
            .fetch_add(repaired as u64, Ordering::Relaxed);
        c.micros
            .fetch_add(t0.elapsed().as_micros() as u64, Ordering::Relaxed);
        Ok(n_dead)
    }

    /// Runs `f` with inserts and deletes paused (the `mutate` lock held
    /// exclusively); returns the microseconds they were paused.
    fn pause_writers(&self, f: impl FnOnce()) -> u64 {
        let _exclusive = self.mutate.write();
        let t = Instant::now();
        f();
        t.elapsed().as_micros() as u64
    }

    /// Step 7 (inserts and deletes paused by the caller).
    fn rebuild_free_list(&self, next: u32) {
        let (free, rooms) = self.free_slots(next);
        // Readers that began before the unlink may still hold a dead slot
        // or read its lists: slots and room go to inserts only after they
        // all ended.
        drop(self.gate.write());
        *self.free.lock() = free;
        *self.rooms.lock() = rooms;
    }

    fn set_consolidating(&self, v: u64, site: Site) {
        self.meta
            .u64_at(M_CONSOLIDATING)
            .store(v, Ordering::Release);
        self.meta.persist(site, M_CONSOLIDATING, 8);
    }

    /// Whether a consolidation was cut off between its first repaired list
    /// and its last relink (a crash): the open finishes it.
    pub(crate) fn consolidation_cut_off(&self) -> bool {
        self.meta.u64_at(M_CONSOLIDATING).load(Ordering::Acquire) != 0
    }

    /// Step 4: moves the entry word off a dead node → F.
    fn move_entry_off(&self, dead: &[bool], next: u32) {
        let g = &self.graph;
        let Some((ep, _)) = self.entry() else {
            return;
        };
        if !dead.get(ep as usize).copied().unwrap_or(false) {
            return;
        }
        let best = (0..next)
            .filter(|&s| g.state(s) == LIVE)
            .max_by_key(|&s| (g.level(s), std::cmp::Reverse(s)));
        let word = best.map_or(NO_ENTRY, |s| pack_entry(s, g.level(s)));
        self.meta.u64_at(M_ENTRY).store(word, Ordering::Release);
        self.meta.persist(S_C_ENTRY, M_ENTRY, 8);
        self.meta.fence(F_C_ENTRY);
    }

    /// Steps 2 and 3, beside inserts and deletes: every list of a linked
    /// node outside the dead set that names a dead node, repaired and
    /// written under the NlistLog, `nlist_per_op` lists at a time. The
    /// repairs of a stretch of slots are planned without locks (in
    /// parallel); each batch then takes its nodes' lock stripes in the
    /// global order inserts use, plans again any list an insert changed
    /// meanwhile, and writes. Returns the lists written.
    fn repair_lists(&self, dead: &[bool], next: u32, owner: usize, batch: &mut usize) -> usize {
        let g = &self.graph;
        let is_dead = |x: u32| dead.get(x as usize).copied().unwrap_or(false);
        let alpha = if self.g.metric == vectide_core::Metric::Ip {
            1.0
        } else {
            self.params.repair_alpha
        };
        let dist = self.dist;
        let per = self.logs.nlist_per_op();
        let mut written = 0;
        let mut sc = RepairScratch::default();
        let mut now = Vec::new();
        for start in (0..next).step_by(REPAIR_STRETCH) {
            let stop = (start + REPAIR_STRETCH as u32).min(next);
            // (slot, layer, list seen, repaired list)
            let plans: Vec<(u32, usize, Vec<u32>, Vec<u32>)> = self.install(|| {
                (start..stop)
                    .into_par_iter()
                    .filter(|&s| !is_dead(s) && matches!(g.state(s), LIVE | DELETED))
                    .map_init(RepairScratch::default, |sc, s| {
                        let mut out = Vec::new();
                        for l in 0..=g.level(s) {
                            if repair_list(g, dist, s, l, is_dead, alpha, sc) {
                                out.push((s, l, sc.seen().to_vec(), sc.kept().to_vec()));
                            }
                        }
                        out
                    })
                    .flatten_iter()
                    .collect()
            });
            for chunk in plans.chunks(per) {
                let mut stripes: Vec<usize> = chunk.iter().map(|p| Self::stripe(p.0)).collect();
                stripes.sort_unstable();
                stripes.dedup();
                let _guards: Vec<_> = stripes.iter().map(|&s| self.locks[s].lock()).collect();
                let mut lists: Vec<(u32, usize, Vec<u32>)> = Vec::with_capacity(chunk.len());
                for (s, l, seen, kept) in chunk {
                    g.neighbors_into(*s, *l, &mut now);
                    if now == *seen {
                        lists.push((*s, *l, kept.clone()));
                    } else if repair_list(g, dist, *s, *l, is_dead, alpha, &mut sc) {
                        // An insert's back-edge landed in between.
                        lists.push((*s, *l, sc.kept().to_vec()));
                    }
                }
                if !lists.is_empty() {
                    self.write_lists_logged(owner, *batch, &lists);
                    *batch += 1;
                    written += lists.len();
                }
            }
        }
        written
    }

    /// Step 5, beside inserts and deletes: the pruning can drop every edge
    /// that reached a live node through dead ones; each such node is linked
    /// from a reachable one, one logged list at a time, under that node's
    /// lock stripe (a list an insert changed since it was read is left, and
    /// its node to the next consolidation). Returns the lists written.
    fn relink(&self, owner: usize, batch: &mut usize) -> usize {
        let g = &self.graph;
        let Some((ep, _)) = self.entry() else {
            return 0;
        };
        // Read after the entry word: the entry point lies below it.
        let next = self.next_slot().min(g.capacity());
        let mut scratch = self.scratch.get();
        let mut now = Vec::new();
        reconnect_unreachable_with(
            g,
            self.dist,
            ep,
            next,
            |s| g.state(s) == LIVE,
            self.g.ef_construction,
            &mut scratch,
            |y, seen, list| {
                let _stripe = self.locks[Self::stripe(y)].lock();
                g.neighbors_into(y, 0, &mut now);
                if now != seen {
                    return false;
                }
                self.write_lists_logged(owner, *batch, &[(y, 0, list.to_vec())]);
                *batch += 1;
                true
            },
        )
    }

    /// Writes a batch of lists (at most `nlist_per_op`) under the NlistLog
    /// entries of NLog entry `owner`; four fences.
    fn write_lists_logged(&self, owner: usize, b: usize, chunk: &[(u32, usize, Vec<u32>)]) {
        let g = &self.graph;
        let meta = &self.meta;
        let mut old = Vec::new();
        let mut entries = Vec::with_capacity(chunk.len());
        {
            for (k, (s, l, _)) in chunk.iter().enumerate() {
                g.neighbors_into(*s, *l, &mut old);
                let e = self.logs.nlist_claim(meta, owner, k);
                self.logs.nlist_write(
                    meta,
                    e,
                    *s,
                    *l,
                    (CONSOLIDATION_NODE, b, chunk.len()),
                    &old,
                    S_C_NLIST,
                );
                entries.push(e);
            }
            meta.fence(F_C_NLIST);
            for &e in &entries {
                self.logs.nlist_set_state(meta, e, LOGGED, S_C_LOGGED);
            }
            meta.fence(F_C_LOGGED);
            for (s, l, list) in chunk {
                self.write_list(*s, *l, list, S_C_LISTS);
            }
            meta.fence(F_C_LISTS);
            for &e in &entries {
                self.logs.nlist_set_state(meta, e, NONE, S_C_DONE);
            }
            // Durably NONE before the entries serve another batch or
            // operation: an undo must never reach a list written since.
            meta.fence(F_C_DONE);
        }
    }

    /// Step 7: every slot below `next` that holds no linked node, lowest
    /// last (inserts pop from the end), and the upper-list room no linked
    /// node owns (see [`RoomPool`]: a block recovery discarded owns
    /// nothing, so room a crash made look owned twice is free).
    fn free_slots(&self, next: u32) -> (Vec<u32>, RoomPool) {
        use std::collections::BTreeMap;
        let g = &self.graph;
        let upper_next = self
            .meta
            .u64_at(super::layout::M_UPPER_NEXT)
            .load(Ordering::Acquire);
        let list_bytes = self.g.upper_list_bytes() as u64;
        let mut taken: BTreeMap<u64, u64> = BTreeMap::new();
        let mut free = Vec::new();
        for s in (0..next).rev() {
            if !matches!(g.state(s), LIVE | DELETED) {
                free.push(s);
                continue;
            }
            if let Some((at, end)) = self.room_named(s) {
                let e = taken.entry(at).or_insert(end);
                *e = (*e).max(end);
            }
        }
        let rooms = RoomPool::from_gaps(super::layout::PAGE as u64, upper_next, list_bytes, &taken);
        (free, rooms)
    }

    /// The upper-list room slot `s`'s block names, as a byte range (its
    /// level capped at `MAX_LEVEL`); `None` for a level-0 node.
    pub(crate) fn room_named(&self, s: u32) -> Option<(u64, u64)> {
        let g = &self.graph;
        let level = g.level(s).min(vectide_graph::prune::MAX_LEVEL) as u64;
        let at = g
            .nodes
            .u64_at(g.node_off(s) + self.g.n_upper())
            .load(Ordering::Acquire);
        (level > 0 && at != 0).then(|| {
            (
                at,
                at.saturating_add(level * self.g.upper_list_bytes() as u64),
            )
        })
    }
}
