//! NLog (redo, one entry per operation) and NlistLog (undo, one entry per
//! neighbour-list update), pre-allocated in `meta.vtdp` and used circularly.
//!
//! Each entry begins with an 8-byte state word. A thread claims a free NLog
//! entry by CAS on a DRAM flag of the entry and stores `LOGGING` (the claim
//! need not be durable, because recovery treats `LOGGING` exactly like
//! `NONE`); then writes the content, persists it, fences, and only then
//! stores the next state (`LOGGED`), persists and fences it. Every later
//! state change is likewise persisted and fenced before the work that
//! depends on it.
//!
//! **Release.** An operation ends by storing and persisting `NONE`; the
//! entry becomes claimable again only after the fence that makes that `NONE`
//! durable ([`Logs::nlog_release`]). The state word shares its cache line
//! with the content, and a line reaches the media in 8-byte pieces: had the
//! next operation claimed the entry while the old state was still the
//! durable one, a crash could leave the old operation's `LOGGED` or
//! `N_COMPLETE` over a mix of both operations' content, and recovery would
//! redo that mix.

use super::layout::{
    Geometry, NI_BATCH, NI_COUNT, NI_LEVEL, NI_LIST, NI_NEW, NI_SLOT, NI_STATE, NL_INEDGES,
    NL_KIND, NL_LABEL, NL_LEVEL, NL_LISTS, NL_LIVE, NL_LIVE_BEFORE, NL_OLD, NL_SEQ, NL_SLOT,
    NL_STATE,
};
use std::sync::atomic::{AtomicBool, Ordering};
use vectide_storage::{Region, Site};

pub const NONE: u64 = 0;
pub const LOGGING: u64 = 1;
pub const LOGGED: u64 = 2;
/// NLog only: the new node's out-edges are in the index.
pub const N_COMPLETE: u64 = 3;

/// What an NLog entry records.
pub const KIND_INSERT: u32 = 1;
pub const KIND_UPSERT: u32 = 2;
pub const KIND_DELETE: u32 = 3;

/// An NLog entry's content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NEntry {
    pub kind: u32,
    pub level: usize,
    pub slot: u32,
    pub label: u64,
    pub seq: u64,
    /// Upsert: the node being replaced; delete: the node deleted.
    pub old: Option<u32>,
    /// The entry's live counter before the operation.
    pub live_before: i64,
    /// Out-edges per layer (inserts and upserts).
    pub lists: Vec<Vec<u32>>,
}

/// The logs of one index.
pub struct Logs {
    pub g: Geometry,
    /// Per NLog entry: held by an operation, from its claim until the fence
    /// that made its `NONE` durable (DRAM only; all clear at open).
    busy: Box<[AtomicBool]>,
}

impl Logs {
    pub fn new(g: Geometry) -> Self {
        Logs {
            g,
            busy: (0..g.nlog_entries)
                .map(|_| AtomicBool::new(false))
                .collect(),
        }
    }

    /// Claims the lowest free NLog entry and stores `LOGGING` in it (spins
    /// while every entry is busy: more concurrent operations than entries).
    /// A free entry is durably `NONE` (see the module docs).
    pub fn nlog_claim(&self, meta: &Region) -> usize {
        let mut spins = 0u32;
        loop {
            for i in 0..self.g.nlog_entries {
                let busy = &self.busy[i];
                if !busy.load(Ordering::Relaxed)
                    && busy
                        .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
                        .is_ok()
                {
                    let state = meta.u64_at(self.g.nlog_offset(i) + NL_STATE);
                    debug_assert_eq!(state.load(Ordering::Acquire), NONE, "NLog entry {i}");
                    state.store(LOGGING, Ordering::Release);
                    return i;
                }
            }
            spins += 1;
            if spins < 16 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// Makes a claimed entry free again. Only after the fence that made the
    /// entry's `NONE` durable.
    pub fn nlog_release(&self, i: usize) {
        self.busy[i].store(false, Ordering::Release);
    }

    // ---- NLog ----

    pub fn nlog_state(&self, meta: &Region, i: usize) -> u64 {
        meta.u64_at(self.g.nlog_offset(i) + NL_STATE)
            .load(Ordering::Acquire)
    }

    /// Stores and persists a state (the caller fences).
    pub fn nlog_set_state(&self, meta: &Region, i: usize, state: u64, site: Site) {
        let off = self.g.nlog_offset(i) + NL_STATE;
        meta.u64_at(off).store(state, Ordering::Release);
        meta.persist(site, off, 8);
    }

    /// Stores a state without persisting it: `LOGGING → NONE` in recovery,
    /// and `LOGGED`, whose durability the later `N_COMPLETE` subsumes (see
    /// the module docs of `phnsw`).
    pub fn nlog_store_state(&self, meta: &Region, i: usize, state: u64) {
        meta.u64_at(self.g.nlog_offset(i) + NL_STATE)
            .store(state, Ordering::Release);
    }

    /// The entry's live counter (its share of the index's live count).
    pub fn nlog_live(&self, meta: &Region, i: usize) -> i64 {
        meta.u64_at(self.g.nlog_offset(i) + NL_LIVE)
            .load(Ordering::Acquire) as i64
    }

    /// Stores and persists the entry's live counter (the caller fences).
    pub fn nlog_set_live(&self, meta: &Region, i: usize, v: i64, site: Site) {
        let off = self.g.nlog_offset(i) + NL_LIVE;
        meta.u64_at(off).store(v as u64, Ordering::Release);
        meta.persist(site, off, 8);
    }

    /// Writes and persists an entry's content (the caller fences).
    pub fn nlog_write(&self, meta: &Region, i: usize, e: &NEntry, site: Site) {
        let base = self.g.nlog_offset(i);
        meta.u32_at(base + NL_KIND).store(e.kind, Ordering::Relaxed);
        meta.u32_at(base + NL_LEVEL)
            .store(e.level as u32, Ordering::Relaxed);
        meta.u64_at(base + NL_SLOT)
            .store(e.slot as u64, Ordering::Relaxed);
        meta.u64_at(base + NL_LABEL)
            .store(e.label, Ordering::Relaxed);
        meta.u64_at(base + NL_SEQ).store(e.seq, Ordering::Relaxed);
        meta.u64_at(base + NL_OLD)
            .store(e.old.map_or(u64::MAX, |s| s as u64), Ordering::Relaxed);
        meta.u64_at(base + NL_LIVE_BEFORE)
            .store(e.live_before as u64, Ordering::Relaxed);
        meta.u64_at(base + NL_INEDGES).store(0, Ordering::Relaxed);
        let mut off = base + NL_LISTS;
        let mut end = off;
        for (l, list) in e.lists.iter().enumerate() {
            let cap = if l == 0 { self.g.m0 } else { self.g.m };
            let words = meta.u32s_at(off, 1 + cap);
            let n = list.len().min(cap);
            words[0].store(n as u32, Ordering::Relaxed);
            for (w, &id) in words[1..=n].iter().zip(list) {
                w.store(id, Ordering::Relaxed);
            }
            end = off + 4 * (1 + n);
            off += 4 * (1 + cap);
        }
        meta.persist(
            site,
            base + NL_KIND,
            end.max(base + NL_LISTS) - (base + NL_KIND),
        );
    }

    /// In-edge batches of the entry's insert whose lists are written.
    pub fn nlog_inedges(&self, meta: &Region, i: usize) -> usize {
        meta.u64_at(self.g.nlog_offset(i) + NL_INEDGES)
            .load(Ordering::Acquire) as usize
    }

    /// Records that in-edge batches `..done` are written; persisted with the
    /// batch's lists (the caller fences).
    pub fn nlog_set_inedges(&self, meta: &Region, i: usize, done: usize, site: Site) {
        let off = self.g.nlog_offset(i) + NL_INEDGES;
        meta.u64_at(off).store(done as u64, Ordering::Release);
        meta.persist(site, off, 8);
    }

    /// Reads an entry's content; `None` when it is out of range (a corrupted
    /// entry; content is persisted before `LOGGED`, so a `LOGGED` entry
    /// never holds a torn one).
    pub fn nlog_read(&self, meta: &Region, i: usize) -> Option<NEntry> {
        let base = self.g.nlog_offset(i);
        let kind = meta.u32_at(base + NL_KIND).load(Ordering::Acquire);
        let level = meta.u32_at(base + NL_LEVEL).load(Ordering::Acquire) as usize;
        if !(KIND_INSERT..=KIND_DELETE).contains(&kind) || level > vectide_graph::prune::MAX_LEVEL {
            return None;
        }
        let slot = u32::try_from(meta.u64_at(base + NL_SLOT).load(Ordering::Acquire)).ok()?;
        let old = meta.u64_at(base + NL_OLD).load(Ordering::Acquire);
        let old = if old == u64::MAX {
            None
        } else {
            Some(u32::try_from(old).ok()?)
        };
        let mut lists = Vec::new();
        if kind != KIND_DELETE {
            let mut off = base + NL_LISTS;
            for l in 0..=level {
                let cap = if l == 0 { self.g.m0 } else { self.g.m };
                let words = meta.u32s_at(off, 1 + cap);
                let n = words[0].load(Ordering::Acquire) as usize;
                if n > cap {
                    return None;
                }
                lists.push(
                    words[1..=n]
                        .iter()
                        .map(|w| w.load(Ordering::Acquire))
                        .collect(),
                );
                off += 4 * (1 + cap);
            }
        }
        Some(NEntry {
            kind,
            level,
            slot,
            label: meta.u64_at(base + NL_LABEL).load(Ordering::Acquire),
            seq: meta.u64_at(base + NL_SEQ).load(Ordering::Acquire),
            old,
            live_before: meta.u64_at(base + NL_LIVE_BEFORE).load(Ordering::Acquire) as i64,
            lists,
        })
    }

    // ---- NlistLog ----

    /// NlistLog entries each NLog entry owns: the in-edge updates of one
    /// operation are logged `nlist_per_op()` lists at a time.
    pub fn nlist_per_op(&self) -> usize {
        (self.g.nlist_entries / self.g.nlog_entries).max(1)
    }

    /// Claims the `k`-th NlistLog entry of the operation holding NLog entry
    /// `owner` by CAS `NONE → LOGGING`. Entries are partitioned among NLog
    /// entries, so the claim never waits: the owner released its entry
    /// (durably `NONE`) before it reuses it.
    pub fn nlist_claim(&self, meta: &Region, owner: usize, k: usize) -> usize {
        let per = self.nlist_per_op();
        let i = owner * per + k % per;
        let claimed = meta
            .u64_at(self.g.nlist_offset(i) + NI_STATE)
            .compare_exchange(NONE, LOGGING, Ordering::AcqRel, Ordering::Relaxed);
        debug_assert!(claimed.is_ok(), "NlistLog entry {i} of owner {owner} busy");
        i
    }

    pub fn nlist_state(&self, meta: &Region, i: usize) -> u64 {
        meta.u64_at(self.g.nlist_offset(i) + NI_STATE)
            .load(Ordering::Acquire)
    }

    /// Stores a state without persisting it (see the callers for why that
    /// is enough).
    pub fn nlist_store_state(&self, meta: &Region, i: usize, state: u64) {
        meta.u64_at(self.g.nlist_offset(i) + NI_STATE)
            .store(state, Ordering::Release);
    }

    pub fn nlist_set_state(&self, meta: &Region, i: usize, state: u64, site: Site) {
        let off = self.g.nlist_offset(i) + NI_STATE;
        meta.u64_at(off).store(state, Ordering::Release);
        meta.persist(site, off, 8);
    }

    /// Records the old list of `slot` at `level` (in-edge batch `batch` of
    /// the insert of node `new`, a batch of `count` lists) and persists it.
    #[allow(clippy::too_many_arguments)]
    pub fn nlist_write(
        &self,
        meta: &Region,
        i: usize,
        slot: u32,
        level: usize,
        (new, batch, count): (u32, usize, usize),
        old: &[u32],
        site: Site,
    ) {
        let base = self.g.nlist_offset(i);
        meta.u32_at(base + NI_COUNT)
            .store(count as u32, Ordering::Relaxed);
        meta.u32_at(base + NI_BATCH)
            .store(batch as u32, Ordering::Relaxed);
        meta.u32_at(base + NI_NEW).store(new, Ordering::Relaxed);
        meta.u32_at(base + NI_SLOT).store(slot, Ordering::Relaxed);
        meta.u32_at(base + NI_LEVEL)
            .store(level as u32, Ordering::Relaxed);
        let cap = self.g.m0;
        let words = meta.u32s_at(base + NI_LIST, 1 + cap);
        let n = old.len().min(cap);
        words[0].store(n as u32, Ordering::Relaxed);
        for (w, &id) in words[1..=n].iter().zip(old) {
            w.store(id, Ordering::Relaxed);
        }
        meta.persist(site, base + NI_SLOT, NI_LIST - NI_SLOT + 4 * (1 + n));
    }

    /// The insert (its new node) and in-edge batch an entry belongs to.
    pub fn nlist_owner_batch(&self, meta: &Region, i: usize) -> (u32, usize) {
        let base = self.g.nlist_offset(i);
        (
            meta.u32_at(base + NI_NEW).load(Ordering::Acquire),
            meta.u32_at(base + NI_BATCH).load(Ordering::Acquire) as usize,
        )
    }

    /// How many entries the batch of entry `i` wrote (from its owner's
    /// first entry).
    pub fn nlist_batch_count(&self, meta: &Region, i: usize) -> usize {
        meta.u32_at(self.g.nlist_offset(i) + NI_COUNT)
            .load(Ordering::Acquire) as usize
    }

    /// Reads a recorded old list: `(slot, level, list)`.
    pub fn nlist_read(&self, meta: &Region, i: usize) -> Option<(u32, usize, Vec<u32>)> {
        let base = self.g.nlist_offset(i);
        let slot = meta.u32_at(base + NI_SLOT).load(Ordering::Acquire);
        let level = meta.u32_at(base + NI_LEVEL).load(Ordering::Acquire) as usize;
        let words = meta.u32s_at(base + NI_LIST, 1 + self.g.m0);
        let n = words[0].load(Ordering::Acquire) as usize;
        let cap = if level == 0 { self.g.m0 } else { self.g.m };
        if level > vectide_graph::prune::MAX_LEVEL || n > cap {
            return None;
        }
        Some((
            slot,
            level,
            words[1..=n]
                .iter()
                .map(|w| w.load(Ordering::Acquire))
                .collect(),
        ))
    }
}
