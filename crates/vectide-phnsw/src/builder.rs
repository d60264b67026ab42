//! Inserts and upserts under the NLog / NlistLog protocol (§4.3).
//!
//! Persistence points of one insert (each "→ fence" waits for durability):
//! 1. node block (vector, label, level, checksum, state `INSERTING`), allocation words,
//!    NLog content (slot, label, level, out-edge lists) → fence;
//! 2. NLog `LOGGED` (stored; made durable with step 3);
//! 3. out-edges written in place → fence; NLog `N_COMPLETE` → fence (from
//!    here the insert is redone by recovery);
//! 4. in-edges, up to `nlist_entries / nlog_entries` neighbour lists at a
//!    time: old lists into the operation's NlistLog entries → fence; their
//!    `LOGGED` → fence; the new lists in place → fence; their `NONE` (→
//!    fence, unless this was the last batch: step 5's fence covers it);
//! 5. publication: node `LIVE`, label map, the replaced node `DELETED`
//!    (upsert), the live counter, the entry point (if the node is the new
//!    top) → fence;
//! 6. NLog `NONE` (and, for the batch's last row, the durable sequence
//!    number, persisted by this writer even if another one raised it) →
//!    fence; only then is the NLog entry free for another operation. Then
//!    the call returns.
//!
//! The paper writes one NlistLog entry per neighbour-list update and fences
//! each; we keep one entry per list and the same state machine, but let the
//! lists of one insert share their fences (step 4). Recovery is unchanged by
//! this: every entry is undone on its own.

use super::layout::{
    pack_entry, DELETED, INSERTING, LIVE, M_DURABLE_SEQ, M_ENTRY, M_LEVEL_COUNTER, M_NEXT_SLOT,
    M_UPPER_NEXT, PAGE, UNLINKED,
};
use super::log::{NEntry, KIND_INSERT, KIND_UPSERT, LOGGED, NONE, N_COMPLETE};
use super::state::PHnsw;
use rayon::prelude::*;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;
use vectide_core::fault::{self, FaultSite};
use vectide_core::validate::{copy_normalized, Checked};
use vectide_core::Progress;
use vectide_core::{Error, Result, Seq};
use vectide_graph::prune::{backlink, draw_level, plan_links, Backlink};
use vectide_graph::Graph;
use vectide_graph::Scratch;
use vectide_storage::Site;

/// The fault point before an insert's publication, the one step after its
/// NLog entry that can fail (tests of the poisoned state).
pub const APPLY_FAULT: FaultSite = FaultSite("p-hnsw.publish");

pub(crate) const S_NODE: Site = Site("insert.node");
pub(crate) const S_ALLOC: Site = Site("insert.alloc");
pub(crate) const S_NLOG: Site = Site("insert.nlog");
pub(crate) const F_LOG: Site = Site("insert.fence.nlog");
pub(crate) const S_OUT: Site = Site("insert.out_edges");
pub(crate) const F_OUT: Site = Site("insert.fence.out_edges");
pub(crate) const S_NCOMPLETE: Site = Site("insert.n_complete");
pub(crate) const F_NCOMPLETE: Site = Site("insert.fence.n_complete");
pub(crate) const S_NL_LOG: Site = Site("in_edges.nlist");
pub(crate) const F_NL_LOG: Site = Site("in_edges.fence.nlist");
pub(crate) const S_NL_LOGGED: Site = Site("in_edges.logged");
pub(crate) const F_NL_LOGGED: Site = Site("in_edges.fence.logged");
pub(crate) const S_NL_WRITE: Site = Site("in_edges.lists");
pub(crate) const S_NL_PROGRESS: Site = Site("in_edges.progress");
pub(crate) const F_NL_WRITE: Site = Site("in_edges.fence.lists");
pub(crate) const S_NL_DONE: Site = Site("in_edges.none");
pub(crate) const F_NL_DONE: Site = Site("in_edges.fence.none");
pub(crate) const S_PUB_STATE: Site = Site("publish.states");
pub(crate) const S_PUB_LIVE: Site = Site("publish.live_count");
pub(crate) const S_PUB_ENTRY: Site = Site("publish.entry_point");
pub(crate) const F_PUB: Site = Site("publish.fence");
pub(crate) const S_DONE: Site = Site("insert.none");
pub(crate) const F_DONE: Site = Site("insert.fence.none");
pub(crate) const S_DURABLE: Site = Site("batch.durable_seq");
pub(crate) const F_DURABLE: Site = Site("batch.fence.durable_seq");

/// A back-link decision for one neighbour list, with the list it was made
/// from (`observed[obs]`) and the list it leads to (`flat[new]`).
#[derive(Debug, Clone)]
struct Plan {
    node: u32,
    level: usize,
    decision: Backlink,
    obs: std::ops::Range<usize>,
    new: std::ops::Range<usize>,
}

/// One planned neighbour-list update of step 4.
#[derive(Debug, Clone, Copy)]
struct ListUpdate {
    entry: usize,
    node: u32,
    level: usize,
    start: usize,
    len: usize,
}

fn ns(t: Instant) -> u64 {
    t.elapsed().as_nanos() as u64
}

impl PHnsw {
    /// Inserts a validated batch (upsert semantics), in parallel on the index's pool;
    /// every row is durable when the call returns.
    pub fn insert_checked_rows(
        &self,
        seq: Seq,
        batch: Checked<'_>,
        progress: Option<Progress<'_>>,
    ) -> Result<()> {
        self.poison.check()?;
        let (ids, vectors) = (batch.ids(), batch.vectors());
        let guard = parking_lot::Mutex::new(Some(self.seqs.begin(seq)));
        let remaining = AtomicUsize::new(ids.len());
        // Called once per row when it is done: the last one ends the batch's
        // sequence number and returns the watermark to make durable with its
        // own final fence.
        let finish = || {
            (remaining.fetch_sub(1, Ordering::AcqRel) == 1).then(|| {
                drop(guard.lock().take());
                self.seqs.watermark()
            })
        };
        let dim = self.g.dim;
        let done = AtomicUsize::new(0);
        let work = |scratch: &mut Scratch, r: usize| -> Result<()> {
            let mut v = std::mem::take(&mut scratch.query);
            copy_normalized(self.g.metric, &vectors[r * dim..(r + 1) * dim], &mut v);
            let out = self.insert_one(seq, ids[r], &v, scratch, &finish);
            scratch.query = v;
            if let Some(p) = progress {
                let n = done.fetch_add(1, Ordering::Relaxed) + 1;
                if n.is_multiple_of(1024) || n == ids.len() {
                    p(n);
                }
            }
            out
        };
        let result = if ids.len() < 64 || vectide_core::VectorIndex::threads(self) == 1 {
            let mut scratch = self.scratch.get();
            (0..ids.len()).try_for_each(|r| work(&mut scratch, r))
        } else {
            self.install(|| {
                (0..ids.len())
                    .into_par_iter()
                    .try_for_each_init(|| self.scratch.get(), |s, r| work(s, r))
            })
        };
        if result.is_err() && self.poison.cause().is_some() {
            // Rows after the one that failed to publish never ran and have
            // no NLog entry: the batch's number stays in flight, so that no
            // durable word covers it and a database replays it after the
            // reopen.
            std::mem::forget(guard.lock().take());
            return result;
        }
        // After an error some rows never finished: end the batch here.
        drop(guard.lock().take());
        self.persist_durable_seq();
        result?;
        // Upserts leave tombstones too.
        self.consolidate_if_due()
    }

    /// Raises the durable sequence word to `w` (monotonic) and persists it,
    /// unless a completed fence is known to have made `w` durable already;
    /// returns whether the caller must fence (and then call
    /// [`PHnsw::durable_seq_fenced`]) before it acknowledges.
    ///
    /// "The word did not move" does not mean "`w` is durable": another
    /// writer may have raised it to `w` or beyond and not fenced yet. So
    /// every writer that needs `w` durable persists the word itself (the
    /// line it persists holds `w` or more) and fences.
    pub(crate) fn store_durable_seq(&self, w: Seq) -> bool {
        self.meta
            .u64_at(M_DURABLE_SEQ)
            .fetch_max(w, Ordering::AcqRel);
        if self.durable_fenced.load(Ordering::Acquire) >= w {
            return false;
        }
        self.meta.persist(S_DURABLE, M_DURABLE_SEQ, 8);
        true
    }

    /// Records that a fence after [`PHnsw::store_durable_seq`]`(w)` completed.
    pub(crate) fn durable_seq_fenced(&self, w: Seq) {
        self.durable_fenced.fetch_max(w, Ordering::AcqRel);
    }

    /// Makes the sequence watermark durable if no row's final fence did
    /// (every row skipped as a replay, or an error).
    pub(crate) fn persist_durable_seq(&self) {
        let w = self.seqs.watermark();
        if self.store_durable_seq(w) {
            self.meta.fence(F_DURABLE);
            self.durable_seq_fenced(w);
        }
    }

    /// Takes a node slot, growing `nodes.vtdp` first when full.
    ///
    /// The allocation word never names a slot beyond the file: open rejects
    /// such a word, and after a crash (a SIGKILL keeps every store; another
    /// writer's persist can carry it to the media) the word holds whatever
    /// was last stored. So the file grows before the word moves, and the
    /// word moves by compare-and-swap from a value checked against the file.
    pub(crate) fn alloc_slot(&self) -> Result<u32> {
        let word = self.meta.u64_at(M_NEXT_SLOT);
        let mut s = word.load(Ordering::Acquire) as usize;
        loop {
            if s >= u32::MAX as usize - 1 {
                return Err(Error::invalid("index is full: 2^32-2 nodes"));
            }
            let cap = self.graph.capacity();
            if s >= cap {
                let want = (s + 1).max(cap + cap / 2).max(1024);
                self.graph.nodes.grow(PAGE + want * self.g.node_size())?;
                s = word.load(Ordering::Acquire) as usize;
                continue;
            }
            match word.compare_exchange_weak(
                s as u64,
                s as u64 + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Ok(s as u32),
                Err(now) => s = now as usize,
            }
        }
    }

    /// Takes a slot a consolidation reclaimed, if any. The slot is
    /// unreachable (no list, bucket or entry word names it, and every reader
    /// that could have held it finished before it was put on the list), so
    /// the insert writes its block as it would a new one; a crash before its
    /// NLog entry is `LOGGED` leaves it `UNLINKED` or `INSERTING`, both free
    /// at the next consolidation.
    fn take_free_slot(&self) -> Option<u32> {
        let f = self.free.lock().pop()?;
        if f < self.opened_slot {
            self.reused.lock().insert(f);
        }
        self.consolidation
            .slots_reused
            .fetch_add(1, Ordering::Relaxed);
        Some(f)
    }

    /// Takes room for `level` upper lists: free room a consolidation found
    /// (no linked node owns it, and no reader still reads it), else by
    /// bumping `upper next`, growing `upper.vtdp` first when full (the word
    /// never passes the file, as in [`PHnsw::alloc_slot`]).
    fn alloc_upper(&self, level: usize) -> Result<u64> {
        if let Some(at) = self.rooms.lock().take(level) {
            return Ok(at);
        }
        let bytes = level * self.g.upper_list_bytes();
        let word = self.meta.u64_at(M_UPPER_NEXT);
        let mut off = word.load(Ordering::Acquire) as usize;
        loop {
            let len = self.graph.upper.len();
            if off + bytes > len {
                self.graph.upper.grow((off + bytes).max(len + len / 2))?;
                off = word.load(Ordering::Acquire) as usize;
                continue;
            }
            match word.compare_exchange_weak(
                off as u64,
                (off + bytes) as u64,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Ok(off as u64),
                Err(now) => off = now as usize,
            }
        }
    }

    /// Writes a fresh node block (the node is unreachable: no list names it).
    pub(crate) fn init_node(
        &self,
        slot: u32,
        label: u64,
        seq: Seq,
        v: &[f32],
        level: usize,
        upper: u64,
    ) {
        let g = &self.g;
        let off = self.graph.node_off(slot);
        let nodes = &self.graph.nodes;
        // SAFETY: `slot` was just allocated, so no other thread reads or
        // writes its block: no list names it, it is not the entry point and
        // the label map does not point at it. The range is in bounds.
        unsafe {
            let bytes = nodes.bytes_mut(off + g.n_vector(), 4 * g.dim);
            for (d, x) in bytes.chunks_exact_mut(4).zip(v) {
                d.copy_from_slice(&x.to_le_bytes());
            }
        }
        nodes.u32_at(off).store(0, Ordering::Relaxed);
        nodes
            .u64_at(off + g.n_label())
            .store(label, Ordering::Relaxed);
        nodes.u64_at(off + g.n_seq()).store(seq, Ordering::Relaxed);
        nodes
            .u64_at(off + g.n_upper())
            .store(upper, Ordering::Relaxed);
        nodes
            .u32_at(off + g.n_state() + 4)
            .store(level as u32, Ordering::Relaxed);
        // The checksum lies in the block, so step 1's persist of the block
        // makes it durable under the same fence as what it covers.
        self.graph.seal(slot);
        nodes
            .u32_at(off + g.n_state())
            .store(INSERTING, Ordering::Release);
    }

    /// Writes a node's list at a layer in place (entries, then the count)
    /// and persists it; the caller fences.
    pub(crate) fn write_list(&self, slot: u32, level: usize, ids: &[u32], site: Site) {
        let n = vectide_graph::store_list(self.graph.list(slot, level), ids);
        if let Some((region, off, len)) = self.graph.list_range(slot, level) {
            region.persist(site, off, len.min(4 * (1 + n)));
        }
    }

    /// Inserts or replaces one label.
    fn insert_one(
        &self,
        seq: Seq,
        label: u64,
        v: &[f32],
        scratch: &mut Scratch,
        finish: &dyn Fn() -> Option<Seq>,
    ) -> Result<()> {
        // Consolidations wait for the row (and it for them).
        let _mutate = self.mutate.read();
        let _label = self.label_lock(label);
        let old = self.labels.get(&self.graph, label);
        if old.is_some_and(|o| self.recorded_seq(o) >= seq) {
            // Replay of an operation already in effect.
            if let Some(w) = finish() {
                if self.store_durable_seq(w) {
                    self.meta.fence(F_DURABLE);
                    self.durable_seq_fenced(w);
                }
            }
            return Ok(());
        }
        let out = self.insert_logged(seq, label, v, old, scratch, finish);
        if out.is_err() {
            finish();
        }
        out
    }

    /// The logged part of [`PHnsw::insert_one`].
    fn insert_logged(
        &self,
        seq: Seq,
        label: u64,
        v: &[f32],
        old: Option<u32>,
        scratch: &mut Scratch,
        finish: &dyn Fn() -> Option<Seq>,
    ) -> Result<()> {
        let t0 = Instant::now();
        let counter = self
            .meta
            .u64_at(M_LEVEL_COUNTER)
            .fetch_add(1, Ordering::Relaxed);
        let level = draw_level(self.g.seed, counter, self.g.m);
        let slot = match self.take_free_slot() {
            Some(s) => s,
            None => self.alloc_slot()?,
        };
        let upper = if level > 0 {
            self.alloc_upper(level)?
        } else {
            0
        };
        self.labels.reserve(&self.graph, &self.meta, label)?;
        self.init_node(slot, label, seq, v, level, upper);

        let mut word = self.meta.u64_at(M_ENTRY).load(Ordering::Acquire);
        let raises = super::layout::unpack_entry(word).is_none_or(|(_, top)| level > top);
        let _top = raises.then(|| {
            let g = self.entry_lock.lock();
            word = self.meta.u64_at(M_ENTRY).load(Ordering::Acquire);
            g
        });
        let mut lists = std::mem::take(&mut scratch.lists);
        match super::layout::unpack_entry(word) {
            Some(ep) => plan_links(
                &self.graph,
                self.dist,
                v,
                slot,
                level,
                ep,
                self.g.ef_construction,
                self.g.m,
                scratch,
                &mut lists,
                // Deleted nodes are walked, never linked to: a
                // consolidation repairs and unlinks beside inserts
                // (`consolidate`).
                |s| !matches!(self.graph.state(s), DELETED | UNLINKED),
            ),
            None => {
                lists.resize_with(level + 1, Vec::new);
                lists.truncate(level + 1);
                lists.iter_mut().for_each(Vec::clear);
            }
        }
        let t1 = Instant::now();
        self.timing.search_ns.fetch_add(ns(t0), Ordering::Relaxed);

        // Steps 1-2: log, then LOGGED.
        let i = self.logs.nlog_claim(&self.meta);
        let e = NEntry {
            kind: if old.is_some() {
                KIND_UPSERT
            } else {
                KIND_INSERT
            },
            level,
            slot,
            label,
            seq,
            old,
            live_before: self.logs.nlog_live(&self.meta, i),
            lists,
        };
        let node_off = self.graph.node_off(slot);
        self.graph
            .nodes
            .persist(S_NODE, node_off, self.g.node_size());
        self.meta.persist(S_ALLOC, M_NEXT_SLOT, 8);
        if level > 0 {
            self.meta.persist(S_ALLOC, M_UPPER_NEXT, 8);
        }
        self.logs.nlog_write(&self.meta, i, &e, S_NLOG);
        self.meta.fence(F_LOG);
        self.logs.nlog_store_state(&self.meta, i, LOGGED);
        let t2 = Instant::now();
        self.timing.logging_ns.fetch_add(ns(t1), Ordering::Relaxed);

        // Step 3: out-edges, then N_COMPLETE.
        self.write_out_edges(&e);
        let t3 = Instant::now();
        self.timing.update_ns.fetch_add(ns(t2), Ordering::Relaxed);
        // N_COMPLETE must be durable before any other node changes: the
        // first fence of the in-edges covers it, or its own when there are
        // none (the first node of an empty index).
        self.logs
            .nlog_set_state(&self.meta, i, N_COMPLETE, S_NCOMPLETE);
        self.timing.logging_ns.fetch_add(ns(t3), Ordering::Relaxed);

        // Steps 4-6.
        if self.link_back(i, slot, &e.lists, scratch, 0) == 0 {
            self.meta.fence(F_NCOMPLETE);
        }
        let t5 = Instant::now();
        // The only step after the log that can fail (the label map's
        // growth): its entry stays logged for recovery to redo, so the
        // state in memory now lags the index on the media.
        let published = fault::hit(&self.dir, APPLY_FAULT)
            .and_then(|()| self.publish(i, &e))
            .map_err(|err| {
                self.poison
                    .poison(&format!("the publication of write {seq}"), &err)
            });
        let t6 = Instant::now();
        self.timing.update_ns.fetch_add(ns(t5), Ordering::Relaxed);
        if published.is_ok() {
            self.logs.nlog_set_state(&self.meta, i, NONE, S_DONE);
            let w = finish();
            if let Some(w) = w {
                self.store_durable_seq(w);
            }
            self.meta.fence(F_DONE);
            self.logs.nlog_release(i);
            if let Some(w) = w {
                self.durable_seq_fenced(w);
            }
        }
        self.timing.logging_ns.fetch_add(ns(t6), Ordering::Relaxed);
        scratch.lists = e.lists;
        published
    }

    /// Writes the new node's out-edges from the entry and fences.
    pub(crate) fn write_out_edges(&self, e: &NEntry) {
        for (l, list) in e.lists.iter().enumerate() {
            self.write_list(e.slot, l, list, S_OUT);
        }
        self.meta.fence(F_OUT);
    }

    /// Step 4: adds `new` to the lists of its neighbours (`lists[l]` at layer
    /// `l`), each list update protected by an NlistLog entry. Idempotent:
    /// a neighbour already listing `new` is left alone (recovery redoes it).
    /// Returns the lists changed; when it is not zero, everything persisted
    /// before the call is durable (its first fence covered it).
    ///
    /// **Exact redo.** HNSW's heuristic may prune `new` itself out of a full
    /// list, so "the list does not hold `new`" does not mean "not done yet":
    /// redoing such a list would add an edge the insert never made. The
    /// lists are therefore processed in batches whose number is recorded in
    /// the NLog entry together with the batch's list writes (and in each
    /// NlistLog entry), and recovery resumes at the first batch not written
    /// (or at the batch it had to undo), `from_batch`.
    pub(crate) fn link_back(
        &self,
        owner: usize,
        new: u32,
        lists: &[Vec<u32>],
        scratch: &mut Scratch,
        from_batch: usize,
    ) -> usize {
        let mut changed = 0;
        let chunk = self.logs.nlist_per_op();
        let next = self.next_slot() as u32;
        let mut pairs: Vec<(usize, u32)> = lists
            .iter()
            .enumerate()
            .flat_map(|(l, ns)| ns.iter().map(move |&n| (l, n)))
            .filter(|&(_, n)| n != new && n < next)
            .collect();
        let mut updates: Vec<ListUpdate> = Vec::with_capacity(chunk);
        let mut plans: Vec<Plan> = Vec::with_capacity(chunk);
        let mut observed: Vec<u32> = Vec::new();
        let mut flat: Vec<u32> = Vec::new();
        for (p, part) in pairs.chunks_mut(chunk).enumerate().skip(from_batch) {
            let t0 = Instant::now();
            // Plan without locks: the pruning distances are the expensive
            // part, and neighbours' locks are held only from validation to
            // the last fence below.
            plans.clear();
            observed.clear();
            flat.clear();
            for &(l, n) in part.iter() {
                let plan = self.plan_backlink(n, new, l, scratch, &mut observed, &mut flat);
                plans.push(plan);
            }
            // Lock the neighbours' stripes in one global order, then redo the
            // plans whose list another insert changed in between.
            let mut stripes: Vec<usize> = part.iter().map(|&(_, n)| Self::stripe(n)).collect();
            stripes.sort_unstable();
            stripes.dedup();
            let _guards: Vec<_> = stripes.iter().map(|&s| self.locks[s].lock()).collect();
            for plan in plans.iter_mut() {
                self.graph
                    .neighbors_into(plan.node, plan.level, &mut scratch.neighbors);
                if scratch.neighbors[..] != observed[plan.obs.clone()] {
                    *plan = self.plan_backlink(
                        plan.node,
                        new,
                        plan.level,
                        scratch,
                        &mut observed,
                        &mut flat,
                    );
                }
            }
            updates.clear();
            let count = plans
                .iter()
                .filter(|pl| pl.decision != Backlink::Present)
                .count();
            for plan in plans.iter().filter(|pl| pl.decision != Backlink::Present) {
                let entry = self.logs.nlist_claim(&self.meta, owner, updates.len());
                self.logs.nlist_write(
                    &self.meta,
                    entry,
                    plan.node,
                    plan.level,
                    (new, p, count),
                    &observed[plan.obs.clone()],
                    S_NL_LOG,
                );
                updates.push(ListUpdate {
                    entry,
                    node: plan.node,
                    level: plan.level,
                    start: plan.new.start,
                    len: plan.new.len(),
                });
            }
            let t1 = Instant::now();
            self.timing.search_ns.fetch_add(ns(t0), Ordering::Relaxed);
            if updates.is_empty() {
                continue;
            }
            changed += updates.len();
            self.meta.fence(F_NL_LOG);
            for u in &updates {
                self.logs
                    .nlist_set_state(&self.meta, u.entry, LOGGED, S_NL_LOGGED);
            }
            self.meta.fence(F_NL_LOGGED);
            let t2 = Instant::now();
            for u in &updates {
                self.write_list(u.node, u.level, &flat[u.start..u.start + u.len], S_NL_WRITE);
            }
            self.logs
                .nlog_set_inedges(&self.meta, owner, p + 1, S_NL_PROGRESS);
            self.meta.fence(F_NL_WRITE);
            let t3 = Instant::now();
            for u in &updates {
                self.logs
                    .nlist_set_state(&self.meta, u.entry, NONE, S_NL_DONE);
            }
            // Durably NONE before the locks are released: once another
            // operation may change these lists, no undo may touch them.
            self.meta.fence(F_NL_DONE);
            let d = |a: Instant, b: Instant| b.duration_since(a).as_nanos() as u64;
            self.timing
                .logging_ns
                .fetch_add(d(t1, t2) + ns(t3), Ordering::Relaxed);
            self.timing
                .update_ns
                .fetch_add(d(t2, t3), Ordering::Relaxed);
        }
        changed
    }

    /// Decides how `n`'s list at `l` takes `new` (see [`backlink`]); appends
    /// the list it saw to `observed` and the resulting list to `flat`.
    fn plan_backlink(
        &self,
        n: u32,
        new: u32,
        l: usize,
        scratch: &mut Scratch,
        observed: &mut Vec<u32>,
        flat: &mut Vec<u32>,
    ) -> Plan {
        let Scratch {
            neighbors: buf,
            sorted: ranked,
            fresh: kept,
            ..
        } = scratch;
        let decision = backlink(&self.graph, self.dist, n, new, l, buf, ranked, kept);
        let old_len = match decision {
            Backlink::Replace => buf.len() - 1, // `new` was pushed
            _ => buf.len(),
        };
        let obs = observed.len()..observed.len() + old_len;
        observed.extend_from_slice(&buf[..old_len]);
        let start = flat.len();
        match decision {
            Backlink::Present => {}
            Backlink::Append => {
                flat.extend_from_slice(&buf[..old_len]);
                flat.push(new);
            }
            Backlink::Replace => flat.extend_from_slice(kept),
        }
        Plan {
            node: n,
            level: l,
            decision,
            obs,
            new: start..flat.len(),
        }
    }

    /// Step 5: makes an insert or upsert visible, then fences. Idempotent.
    pub(crate) fn publish(&self, i: usize, e: &NEntry) -> Result<()> {
        let g = &self.graph;
        g.state_word(e.slot).store(LIVE, Ordering::Release);
        let soff = g.node_off(e.slot) + self.g.n_state();
        g.nodes.persist(S_PUB_STATE, soff, 4);
        self.labels.publish(g, &self.meta, e.label, e.slot)?;
        if let Some(old) = e.old.filter(|&o| o != e.slot) {
            g.state_word(old).store(DELETED, Ordering::Release);
            g.nodes
                .persist(S_PUB_STATE, g.node_off(old) + self.g.n_state(), 4);
        }
        let delta = i64::from(e.kind == KIND_INSERT);
        self.logs
            .nlog_set_live(&self.meta, i, e.live_before + delta, S_PUB_LIVE);
        let entry = self.meta.u64_at(M_ENTRY);
        let word = entry.load(Ordering::Acquire);
        if super::layout::unpack_entry(word).is_none_or(|(_, top)| e.level > top) {
            entry.store(pack_entry(e.slot, e.level), Ordering::Release);
            self.meta.persist(S_PUB_ENTRY, M_ENTRY, 8);
        }
        self.meta.fence(F_PUB);
        Ok(())
    }
}
