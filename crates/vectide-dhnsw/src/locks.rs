//! Writers of a partition, from any compute node: a writer takes the
//! partition by CAS of its state word from even to odd (the readers' seqlock,
//! `docs/format-dhnsw.md`), works under it, and publishes by writing the next
//! even state after the change. A CAS that finds the state odd means another
//! writer is inside: re-read and retry after a pause. A state that stays at
//! the same odd value for longer than the memory node's timeout belongs to a
//! writer that stopped (a compute node that died mid-publish): the waiter
//! takes it over by CAS to the next odd value and finds the partition as the
//! dead writer left it, readable (its unpublished node ignored, its room
//! reclaimed at the next rebuild).

use crate::labelmap::Slot;
use crate::layout::{Entry, DELETED, ENTRY_BYTES, ENTRY_STATE_AT, RECORD_FLAGS_AT};
use crate::state::{DHnsw, Layout};
use crate::subgraph::SubGraph;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use vectide_core::{Error, Result};
use vectide_remote::Verb;

/// A node to tombstone: (partition, node, label, the label's map bucket).
pub(crate) type Doomed = (u32, u32, u64, u64);

/// What taking a lock word came to.
pub(crate) enum Taken {
    /// Held at this odd value; whether it was taken over from a stopped
    /// holder.
    Held(u64, bool),
    /// Still held by another after the patience given.
    Busy,
    /// Given back at once: the region is not put right since its memory
    /// node restarted (`recovery.rs`).
    Restarted,
}

fn restarted() -> Error {
    Error::unavailable(
        "d-hnsw: the memory node restarted during this call; the region is put right by the next one",
    )
}

/// A lock word unchanged for this many times the timeout is taken over.
pub const TAKE_OVER: u64 = 6;

impl Layout {
    /// Where partition `p`'s entry and state word are.
    pub fn entry_at(&self, p: u32) -> u64 {
        self.header.table_off + u64::from(p) * ENTRY_BYTES
    }

    pub fn state_at(&self, p: u32) -> u64 {
        self.entry_at(p) + ENTRY_STATE_AT
    }

    /// The other partition sharing `p`'s gap, if one still does.
    pub fn partner(&self, p: u32) -> Option<u32> {
        let e = &self.table[p as usize];
        let q = p ^ 1;
        self.table
            .get(q as usize)
            .filter(|o| (o.gap_lo, o.gap_hi) == (e.gap_lo, e.gap_hi))
            .map(|_| q)
    }
}

impl DHnsw {
    /// Takes partition `p` for writing; returns the odd state it now holds.
    /// This node's copy of the entry is brought up to date when another
    /// writer published since (and the LRU's graph of `p` dropped).
    /// Called holding no other lock: when the memory node restarted since
    /// the region was last put right, puts it right first.
    pub(crate) fn acquire(&self, lay: &mut Layout, p: u32) -> Result<u64> {
        let (held, took_over) = loop {
            match self.take_word_within(
                lay.region,
                lay.state_at(p),
                lay.table[p as usize].state,
                None,
            )? {
                Taken::Held(h, t) => break (h, t),
                Taken::Restarted => {
                    self.recover_if_restarted(lay)?;
                }
                Taken::Busy => unreachable!("no patience: waits until it takes the word"),
            }
        };
        self.refresh_entry(lay, p, held)?;
        if took_over {
            // Taken over (odd to the next odd value): its writer stopped
            // somewhere in a write; put its labels right before using it,
            // and recount once no partition is held (it may have stopped
            // between its map changes and its counts).
            self.reconcile(lay, p)?;
            self.taken_over
                .store(true, std::sync::atomic::Ordering::Release);
        }
        Ok(held)
    }

    /// [`acquire`](Self::acquire) that gives up (`None`) after waiting
    /// `patience` on a holder (for a writer already holding a partition).
    pub(crate) fn acquire_within(
        &self,
        lay: &mut Layout,
        p: u32,
        patience: Duration,
    ) -> Result<Option<u64>> {
        let got = self.take_word_within(
            lay.region,
            lay.state_at(p),
            lay.table[p as usize].state,
            Some(patience),
        )?;
        let (held, took_over) = match got {
            Taken::Held(h, t) => (h, t),
            Taken::Busy => return Ok(None),
            // Another lock is held: no recovery now; the call fails and
            // the next one puts the region right.
            Taken::Restarted => return Err(restarted()),
        };
        self.refresh_entry(lay, p, held)?;
        if took_over {
            self.reconcile(lay, p)?;
            self.taken_over
                .store(true, std::sync::atomic::Ordering::Release);
        }
        Ok(Some(held))
    }

    /// [`recount`](Self::recount) if this node took a partition over since
    /// the last one (called with no partition held).
    pub(crate) fn recount_if_taken_over(&self, lay: &mut Layout) -> Result<()> {
        if self
            .taken_over
            .swap(false, std::sync::atomic::Ordering::AcqRel)
        {
            if let Err(e) = self.recount(lay) {
                self.taken_over
                    .store(true, std::sync::atomic::Ordering::Release);
                return Err(e);
            }
        }
        Ok(())
    }

    /// Takes over, puts right and publishes every partition whose state
    /// this node has seen at one odd value for longer than the take-over
    /// time (its writer stopped); a partition seen odd for the first time
    /// is remembered. What `maintain` runs. Returns how many were repaired.
    pub(crate) fn repair_stuck(&self) -> Result<usize> {
        let mut guard = self.layout.write();
        let Some(lay) = guard.as_mut() else {
            return Ok(0);
        };
        // A node that may not write the region (its lease is another's)
        // repairs nothing in it.
        if !self.may_repair(lay)? {
            return Ok(0);
        }
        let k = lay.table.len() as u64;
        let at = lay.header.table_off;
        let table = crate::fetch::read_range(&*self.mem, lay.region, at, at + k * ENTRY_BYTES)?;
        let lease = Duration::from_millis(self.params.timeout_ms.saturating_mul(TAKE_OVER));
        let mut stuck = self.stuck.lock();
        let mut fixed = 0;
        let mut need_recount = false;
        for (p, b) in table.chunks_exact(ENTRY_BYTES as usize).enumerate() {
            let p = p as u32;
            let w = &b[ENTRY_STATE_AT as usize..ENTRY_STATE_AT as usize + 8];
            let s = u64::from_le_bytes(w.try_into().expect("8 bytes"));
            if s.is_multiple_of(2) {
                stuck.remove(&p);
                continue;
            }
            match stuck.get(&p) {
                Some(&(v, since)) if v == s && since.elapsed() > lease => {
                    stuck.remove(&p);
                    if self.mem.cas(lay.region, lay.state_at(p), s, s + 2)? != s {
                        continue; // someone else moved it meanwhile
                    }
                    self.refresh_entry(lay, p, s + 2)?;
                    self.reconcile(lay, p)?;
                    self.publish(lay, p, s + 2)?;
                    fixed += 1;
                    // Its writer may have stopped between its map changes
                    // and its counts.
                    need_recount = true;
                }
                Some(&(v, _)) if v == s => {}
                _ => {
                    stuck.insert(p, (s, Instant::now()));
                }
            }
        }
        drop(stuck);
        if need_recount {
            self.taken_over
                .store(true, std::sync::atomic::Ordering::Release);
        }
        self.recount_if_taken_over(lay)?;
        Ok(fixed)
    }

    /// Sets the header's live and taken-bucket counts from the label map,
    /// with every partition held (every change of a label's presence and
    /// every count update happens under one, so none is under way).
    pub(crate) fn recount(&self, lay: &mut Layout) -> Result<()> {
        let k = lay.table.len() as u32;
        let mut held = Vec::with_capacity(k as usize);
        let mut out = Ok(());
        let patience = self.lease() / 3;
        let mut gave_up = false;
        for p in 0..k {
            match self.acquire_within(lay, p, patience) {
                Ok(Some(h)) => held.push((p, h)),
                Ok(None) => {
                    gave_up = true;
                    break;
                }
                Err(e) => {
                    out = Err(e);
                    break;
                }
            }
        }
        if gave_up {
            // A partition stayed held: give every one back and try at the
            // next chance (the counts stay as they are meanwhile).
            for (p, h) in held {
                self.release(lay, p, h)?;
            }
            self.taken_over
                .store(true, std::sync::atomic::Ordering::Release);
            return Ok(());
        }
        if out.is_ok() {
            out = (|| {
                let scanned = lay.map.scan(&*self.mem)?;
                let live = scanned.iter().filter(|(_, v)| v.present).count() as u64;
                let keys = scanned.len() as u64;
                crate::fetch::post_unflushed(
                    &*self.mem,
                    lay.region,
                    vec![
                        (crate::layout::LIVE_AT, live.to_le_bytes().to_vec()),
                        (crate::layout::KEYS_AT, keys.to_le_bytes().to_vec()),
                    ],
                )?;
                lay.header.live = live;
                lay.header.keys = keys;
                Ok(())
            })();
        }
        for (p, h) in held {
            let given = self.release(lay, p, h);
            if out.is_ok() {
                out = given;
            }
        }
        out
    }

    /// After taking over partition `p` from a writer that stopped: every
    /// live node whose label the map points at a slot of `p` that holds no
    /// such label (the writer rebuilt `p`, switched its entry, and stopped
    /// before re-pointing all its labels) is named again by CAS; every
    /// other live node the map does not name (written but never mapped, or
    /// whose label was deleted or moved before its tombstone was written)
    /// is tombstoned. Returns how many nodes were put right.
    pub(crate) fn reconcile(&self, lay: &mut Layout, p: u32) -> Result<usize> {
        self.cache.lock().remove(p);
        let e = lay.table[p as usize];
        let (lo, hi) = e
            .range(lay.record())
            .ok_or_else(|| Error::corrupted(format!("d-hnsw partition {p}: its bytes overflow")))?;
        let b = crate::fetch::read_range(&*self.mem, lay.region, lo, hi)?;
        let g = self.decode_part(lay, &e, p, &b)?;
        let live: Vec<u32> = (0..g.len() as u32).filter(|&n| !g.is_deleted(n)).collect();
        let labels: Vec<u64> = live.iter().map(|&n| g.labels[n as usize]).collect();
        let found = lay.map.get_many(&*self.mem, &labels)?;
        let holds = |slot: u32, l: u64| {
            (slot as usize) < g.len() && g.labels[slot as usize] == l && !g.is_deleted(slot)
        };
        let mut swaps = Vec::new();
        let mut orphans = Vec::new();
        for ((&n, &l), f) in live.iter().zip(&labels).zip(found) {
            match f.filter(|f| f.value.present && f.value.part == p) {
                Some(f) if f.value.slot == n => {}
                Some(f) if !holds(f.value.slot, l) => {
                    swaps.push((f.bucket, f.value, f.value.at(p, n)));
                }
                _ => orphans.push(n),
            }
        }
        let seen = lay.map.swap_many(&*self.mem, &swaps)?;
        let renamed = seen.iter().zip(&swaps).filter(|(s, w)| **s == w.1).count();
        let rec = lay.record();
        let flags = orphans
            .iter()
            .map(|&n| {
                (
                    e.node_at(u64::from(n), rec) + RECORD_FLAGS_AT,
                    DELETED.to_le_bytes().to_vec(),
                )
            })
            .collect();
        crate::fetch::post_unflushed(&*self.mem, lay.region, flags)?;
        Ok(renamed + orphans.len())
    }

    /// Takes the lock word at `at` (even: free; odd: held), first trying
    /// it at `guess`: a CAS from even to odd; a CAS that finds another
    /// value retries from it; an odd value is waited on, and one that stays
    /// the same past the timeout (its holder stopped) is taken over by CAS
    /// to the next odd value. Returns the odd value held and whether it was
    /// taken over.
    pub(crate) fn take_word(
        &self,
        region: vectide_remote::Region,
        at: u64,
        guess: u64,
    ) -> Result<(u64, bool)> {
        match self.take_word_within(region, at, guess, None)? {
            Taken::Held(h, t) => Ok((h, t)),
            Taken::Restarted => Err(restarted()),
            Taken::Busy => unreachable!("no patience: waits until it takes the word"),
        }
    }

    /// The take-over time: six times the memory node's timeout (a minute by
    /// default), far longer than any write this engine does under a lock,
    /// and longer than a writer holding one lock waits for another.
    pub(crate) fn lease(&self) -> Duration {
        Duration::from_millis(self.params.timeout_ms.saturating_mul(TAKE_OVER))
    }

    /// [`take_word`](Self::take_word), giving up (`None`) once it has
    /// waited `patience` on a holder: a writer that already holds another
    /// lock waits only so long, then gives that back and tries again, so no
    /// live holder ever waits long enough to be taken over.
    pub(crate) fn take_word_within(
        &self,
        region: vectide_remote::Region,
        at: u64,
        guess: u64,
        patience: Option<Duration>,
    ) -> Result<Taken> {
        let lease = self.lease();
        let began = Instant::now();
        let mut cur = guess;
        let mut stuck: Option<(u64, Instant)> = None;
        let mut round = 0u32;
        loop {
            let take = if cur.is_multiple_of(2) {
                Some(cur + 1)
            } else {
                match stuck {
                    Some((s, since)) if s == cur && since.elapsed() > lease => Some(cur + 2),
                    Some((s, _)) if s == cur => None,
                    _ => {
                        stuck = Some((cur, Instant::now()));
                        None
                    }
                }
            };
            if let Some(t) = take {
                // The region's boot word in the same doorbell: a lock taken
                // in a region not yet put right since its memory node
                // restarted is given back at once.
                let c = self.mem.post(&[
                    Verb::Cas {
                        region: region.id,
                        offset: at,
                        expect: cur,
                        new: t,
                    },
                    Verb::Read {
                        region: region.id,
                        offset: crate::layout::BOOT_AT,
                        len: 16,
                    },
                ])?;
                let mut c = c.into_iter();
                let found = c.next().expect("two completions").into_word()?;
                let boot = c.next().expect("two completions").into_data()?;
                let owner = u64::from_le_bytes(boot[8..16].try_into().expect("8 bytes"));
                let boot = u64::from_le_bytes(boot[..8].try_into().expect("8 bytes"));
                if found == cur {
                    // Only the lease's holder writes a leased region (and
                    // a node without a lease one without); a recovery
                    // (putting right what writers left, changing no point)
                    // runs whoever holds the lease.
                    let recovering = self.recovering.load(std::sync::atomic::Ordering::Acquire);
                    if let Err(e) = self.may_write(region, owner).or_else(|e| {
                        if recovering {
                            Ok(())
                        } else {
                            Err(e)
                        }
                    }) {
                        self.mem.cas(region, at, t, cur)?;
                        return Err(e);
                    }
                    if !self.recovering.load(std::sync::atomic::Ordering::Acquire)
                        && !self.boot_current(boot)
                    {
                        self.mem.cas(region, at, t, cur)?;
                        return Ok(Taken::Restarted);
                    }
                    return Ok(Taken::Held(t, t == cur + 2));
                }
                crate::state::Timing::add(&self.timing.cas_retries, 1);
                cur = found;
                continue;
            }
            if patience.is_some_and(|p| began.elapsed() > p) {
                return Ok(Taken::Busy);
            }
            round += 1;
            std::thread::sleep(Duration::from_micros(20 << round.min(9)));
            let w = self.mem.read(region, at, 8)?;
            cur = u64::from_le_bytes(w[..8].try_into().expect("8 bytes"));
        }
    }

    /// After taking `p` at odd state `held`: the entry as it is (another
    /// writer may have published since this node last read it). A rebuild
    /// intent a stopped writer left is folded into the entry's fields
    /// first (`layout.rs`).
    pub(crate) fn refresh_entry(&self, lay: &mut Layout, p: u32, held: u64) -> Result<()> {
        let mine = lay.table[p as usize];
        // The state before the take: equal to this node's copy's means
        // nobody published in between.
        if held == mine.state + 1 {
            lay.table[p as usize].state = held;
            return Ok(());
        }
        self.reload_entry(lay, p, held)
    }

    /// [`refresh_entry`](Self::refresh_entry) that always reads the entry.
    /// A stale intent (torn by a crash) is cleared, durably, before
    /// anything else: see [`Entry::stale_intent`].
    pub(crate) fn reload_entry(&self, lay: &mut Layout, p: u32, held: u64) -> Result<()> {
        let b = self
            .mem
            .read(lay.region, lay.entry_at(p), ENTRY_BYTES as u32)?;
        if Entry::stale_intent(&b) {
            crate::fetch::post_phases(
                &*self.mem,
                lay.region,
                vec![(
                    crate::sites::INTENT_DROP,
                    vec![(lay.entry_at(p) + Entry::INTENT_CHECK_AT, vec![0u8; 8])],
                )],
            )?;
        }
        let mut e = Entry::decode_table(&b, 1, lay.record(), lay.header.region_size)?[0];
        e.state = held;
        if e.intent {
            self.fold_intent(lay, p, &e)?;
            e.intent = false;
        }
        lay.table[p as usize] = e;
        self.cache.lock().remove(p);
        Ok(())
    }

    /// Publishes partition `p`, held at `held`: CAS of its state to the
    /// next even value (not FLUSHed: every partition is taken and published
    /// again when the region is put right after its memory node restarted,
    /// and what the state guarded is durable already). A CAS that finds another value means a
    /// waiter took the partition over (this hold outlived the take-over
    /// time): an error, and this node's copy of the entry is dropped.
    pub(crate) fn publish(&self, lay: &mut Layout, p: u32, held: u64) -> Result<()> {
        let found = self.mem.cas(lay.region, lay.state_at(p), held, held + 1)?;
        if found != held {
            self.cache.lock().remove(p);
            return Err(Error::unavailable(format!(
                "d-hnsw: partition {p} was taken over while this compute node wrote it (state {found}, held {held}); the write may be partial"
            )));
        }
        lay.table[p as usize].state = held + 1;
        Ok(())
    }

    /// Gives partition `p` back (its state moves on, so readers that read
    /// it meanwhile read it again).
    pub(crate) fn release(&self, lay: &mut Layout, p: u32, held: u64) -> Result<()> {
        self.publish(lay, p, held)
    }

    /// Partition `p`'s graph as its entry now says, for a writer holding it:
    /// the LRU's when it was read under the same state, else one READ.
    pub(crate) fn part_held(&self, lay: &Layout, p: u32) -> Result<Arc<SubGraph>> {
        let e = lay.table[p as usize];
        if let Some(g) = self.cache.lock().get(p) {
            if g.version() == e.state - 1 {
                return Ok(g);
            }
        }
        let (lo, hi) = e
            .range(lay.record())
            .ok_or_else(|| Error::corrupted(format!("d-hnsw partition {p}: its bytes overflow")))?;
        let b = crate::fetch::read_range(&*self.mem, lay.region, lo, hi)?;
        let g = self.decode_part(lay, &e, p, &b)?;
        g.set_version(e.state - 1);
        Ok(Arc::new(g))
    }

    /// Tombstones nodes `(partition, node, label, bucket)` that their label
    /// (whose map bucket is given) no longer points at, from any compute
    /// node: per partition, taken; each node's label and the label's map
    /// value read in one doorbell; a node is tombstoned only if it still
    /// holds the label (a rebuild may have renumbered the partition
    /// meanwhile) and the map does not name it (the label's newest node may
    /// have landed in the same slot: naming a node of this partition takes
    /// its lock, held here, so the check holds until the flags are
    /// written); then the partition published. Returns how many were
    /// tombstoned.
    pub(crate) fn tombstone(&self, lay: &mut Layout, nodes: &[Doomed]) -> Result<usize> {
        let mut by_part: BTreeMap<u32, Vec<(u32, u64, u64)>> = BTreeMap::new();
        for &(p, n, l, b) in nodes {
            by_part.entry(p).or_default().push((n, l, b));
        }
        let rec = lay.record();
        let mut done = 0;
        for (p, list) in by_part {
            if p as usize >= lay.table.len() {
                continue;
            }
            let held = self.acquire(lay, p)?;
            let e = lay.table[p as usize];
            let total = u64::from(e.n_base) + e.count;
            let here: Vec<(u32, u64, u64)> = list
                .into_iter()
                .filter(|&(n, ..)| u64::from(n) < total)
                .collect();
            let mut reads: Vec<Verb> = Vec::with_capacity(2 * here.len());
            for &(n, _, b) in &here {
                reads.push(Verb::Read {
                    region: lay.region.id,
                    offset: e.node_at(u64::from(n), rec),
                    len: 8,
                });
                reads.push(Verb::Read {
                    region: lay.region.id,
                    offset: lay.map.value_at(b),
                    len: 8,
                });
            }
            let mut flags = Vec::new();
            let mut marked = Vec::new();
            let read = match self.mem.post(&reads) {
                Ok(r) => r,
                Err(err) => {
                    let _ = self.publish(lay, p, held);
                    return Err(err);
                }
            };
            let mut it = read.into_iter();
            for &(n, l, _) in &here {
                let label = it.next().expect("a completion per READ").into_data()?;
                let value = it.next().expect("a completion per READ").into_data()?;
                let v = Slot::decode(u64::from_le_bytes(value[..8].try_into().expect("8 bytes")));
                let named_here = v.present && (v.part, v.slot) == (p, n);
                if u64::from_le_bytes(label[..8].try_into().expect("8 bytes")) == l && !named_here {
                    flags.push((
                        e.node_at(u64::from(n), rec) + RECORD_FLAGS_AT,
                        DELETED.to_le_bytes().to_vec(),
                    ));
                    marked.push(n);
                }
            }
            let written = crate::fetch::post_unflushed(&*self.mem, lay.region, flags);
            let published = self.publish(lay, p, held);
            written?;
            published?;
            // The LRU's copy, if it is this state's, takes the tombstones
            // and stays; any other copy goes.
            let mut lru = self.cache.lock();
            match lru.get(p) {
                Some(g) if g.version() == held - 1 => {
                    for &n in &marked {
                        g.mark_deleted(n);
                    }
                    g.set_version(held + 1);
                }
                _ => lru.remove(p),
            }
            done += marked.len();
        }
        Ok(done)
    }

    /// A label's vector: its place from the label map, its partition's
    /// entry as it is now, the record read and checked (its label, not a
    /// tombstone) under an unchanged state; read again when a writer moved
    /// it meanwhile.
    pub(crate) fn read_label(&self, lay: &Layout, id: u64) -> Result<Option<Vec<f32>>> {
        let rec = lay.record();
        let vec_at = 16 + 4 * u64::from(lay.header.m0);
        let started = Instant::now();
        loop {
            let Some(f) = lay.map.get(&*self.mem, id)?.filter(|f| f.value.present) else {
                return Ok(None);
            };
            let p = f.value.part;
            if p as usize >= lay.table.len() {
                return Err(Error::corrupted(format!(
                    "d-hnsw: label {id} is mapped to partition {p} of {}",
                    lay.table.len()
                )));
            }
            let b = self
                .mem
                .read(lay.region, lay.entry_at(p), ENTRY_BYTES as u32)?;
            let state = u64::from_le_bytes(
                b[ENTRY_STATE_AT as usize..ENTRY_STATE_AT as usize + 8]
                    .try_into()
                    .expect("8 bytes"),
            );
            if state % 2 == 0 {
                let e = Entry::decode_table(&b, 1, rec, lay.header.region_size)?[0];
                if u64::from(f.value.slot) < u64::from(e.n_base) + e.count {
                    let at = e.node_at(u64::from(f.value.slot), rec);
                    let c = self.mem.post(&[
                        Verb::Read {
                            region: lay.region.id,
                            offset: at,
                            len: rec as u32,
                        },
                        Verb::Read {
                            region: lay.region.id,
                            offset: lay.state_at(p),
                            len: 8,
                        },
                    ])?;
                    let mut c = c.into_iter();
                    let r = c.next().expect("two completions").into_data()?;
                    let s = c.next().expect("two completions").into_data()?;
                    let label = u64::from_le_bytes(r[..8].try_into().expect("8 bytes"));
                    let flags = u32::from_le_bytes(r[8..12].try_into().expect("4 bytes"));
                    if s[..8] == state.to_le_bytes() && label == id && flags & DELETED == 0 {
                        let mut v = Vec::with_capacity(self.dim);
                        vectide_core::io::ByteReader::new(&r[vec_at as usize..])
                            .f32s(self.dim, &mut v)?;
                        return Ok(Some(v));
                    }
                }
            }
            if started.elapsed() > Duration::from_millis(self.params.timeout_ms) {
                return Err(Error::unavailable(format!(
                    "d-hnsw: label {id}'s node kept moving for {} ms",
                    self.params.timeout_ms
                )));
            }
            std::thread::sleep(Duration::from_micros(100));
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::state::DHnsw;
    use vectide_core::params::params_of;
    use vectide_core::{Metric, ParamValue};

    /// A 4-d index of one partition holding labels 0..60, and their rows.
    fn one_partition() -> (Box<dyn vectide_core::VectorIndex>, Vec<f32>) {
        let idx = (crate::DESCRIPTOR.create)(
            4,
            Metric::L2,
            &params_of([("partitions", ParamValue::Int(1))]),
        )
        .unwrap();
        let rows: Vec<f32> = (0..60)
            .flat_map(|i| [i as f32, (i % 7) as f32, 0.0, 1.0])
            .collect();
        idx.insert(1, &(0..60).collect::<Vec<u64>>(), &rows)
            .unwrap();
        (idx, rows)
    }

    /// An intent a crash tore (its check word written, one of its words
    /// not) is no intent, and whoever takes the partition over next clears
    /// its check word: left standing, a later rebuild's write of the
    /// missing word alone (torn the other way) would make it whole again,
    /// naming an area its writer never finished.
    #[test]
    fn a_torn_intent_is_cleared_at_the_next_take_over() {
        use crate::layout::{Entry, ENTRY_BYTES, ENTRY_INTENT_AT};
        let (idx, rows) = one_partition();
        let dh = idx.as_any().downcast_ref::<DHnsw>().unwrap();
        let mut guard = dh.layout.write();
        let lay = guard.as_mut().unwrap();
        let at = lay.entry_at(0);
        let read =
            |lay: &crate::state::Layout| dh.mem.read(lay.region, at, ENTRY_BYTES as u32).unwrap();
        // An intent naming an area past the region's used bytes, with its
        // first word left as it was (the tear).
        let now =
            Entry::decode_table(&read(lay), 1, lay.record(), lay.header.region_size).unwrap()[0];
        let ghost = Entry {
            blob_off: now.blob_off + 4096,
            ..now
        };
        let words = ghost.intent_bytes();
        dh.mem
            .write(lay.region, at + ENTRY_INTENT_AT + 8, &words[8..])
            .unwrap();
        dh.mem
            .write(
                lay.region,
                at + ENTRY_INTENT_AT,
                &now.blob_off.to_le_bytes(),
            )
            .unwrap();
        assert!(Entry::stale_intent(&read(lay)));
        let e =
            Entry::decode_table(&read(lay), 1, lay.record(), lay.header.region_size).unwrap()[0];
        assert!(
            !e.intent && e.blob_off == now.blob_off,
            "a torn intent is no intent"
        );
        // A take-over (here the recovery after a restart) clears it.
        dh.recover_orphans(lay).unwrap();
        assert!(!Entry::stale_intent(&read(lay)));
        // The missing word written later cannot bring it back.
        dh.mem
            .write(
                lay.region,
                at + ENTRY_INTENT_AT,
                &ghost.blob_off.to_le_bytes(),
            )
            .unwrap();
        let e = Entry::decode_table(&read(lay), 1, lay.record(), lay.header.region_size);
        assert!(
            e.as_ref()
                .is_ok_and(|e| !e[0].intent && e[0].blob_off == now.blob_off),
            "{e:?}"
        );
        drop(guard);
        assert!(idx.check_structure().unwrap().is_empty());
        assert_eq!(idx.get(7).unwrap().unwrap(), rows[28..32].to_vec());
    }

    /// A value word in a bucket without a key (a crash kept the value of a
    /// claim and not its key) is zeroed by the recovery: a later claim of
    /// the bucket whose key alone a crash keeps must find the label absent,
    /// not naming the node of the write the first crash cut short.
    #[test]
    fn the_recovery_zeroes_values_in_buckets_without_a_key() {
        use crate::labelmap::{Slot, BUCKET_BYTES};
        let (idx, _) = one_partition();
        let dh = idx.as_any().downcast_ref::<DHnsw>().unwrap();
        let mut guard = dh.layout.write();
        let lay = guard.as_mut().unwrap();
        let map = lay.map;
        let buckets = |lay: &crate::state::Layout| {
            crate::fetch::read_range(
                &*dh.mem,
                lay.region,
                map.off,
                map.off + map.buckets * BUCKET_BYTES,
            )
            .unwrap()
        };
        let word = |b: &[u8]| u64::from_le_bytes(b[..8].try_into().unwrap());
        let stale = Slot::default().at(0, 5).encode();
        let empty: Vec<u64> = buckets(lay)
            .chunks_exact(BUCKET_BYTES as usize)
            .enumerate()
            .filter(|(_, kv)| word(kv) == 0)
            .map(|(b, _)| b as u64)
            .collect();
        assert!(empty.len() > 10);
        for &b in &empty {
            dh.mem
                .write(lay.region, map.value_at(b), &stale.to_le_bytes())
                .unwrap();
        }
        dh.recover_orphans(lay).unwrap();
        let after = buckets(lay);
        for &b in &empty {
            let kv = &after[(b * BUCKET_BYTES) as usize..][..BUCKET_BYTES as usize];
            assert_eq!((word(kv), word(&kv[8..])), (0, 0), "bucket {b}");
        }
        drop(guard);
        // A new label claims one of them and is where its write put it.
        idx.insert(2, &[1000], &[7.0, 7.0, 7.0, 7.0]).unwrap();
        assert_eq!(idx.get(1000).unwrap().unwrap(), vec![7.0; 4]);
        assert!(idx.check_structure().unwrap().is_empty());
    }

    /// An image read before the recovery a restart calls for holds its
    /// partitions to nothing: a torn line may pair an even state word with
    /// a map the writer inside had not finished changing. Checked as it
    /// is after the recovery, the same bytes are damage.
    #[test]
    fn an_image_left_by_a_restart_is_read_with_every_partition_busy() {
        use crate::persist::{decode_image, decode_image_as};
        let (idx, _) = one_partition();
        let dh = idx.as_any().downcast_ref::<DHnsw>().unwrap();
        let guard = dh.layout.read();
        let lay = guard.as_ref().unwrap();
        let mut image =
            crate::fetch::read_range(&*dh.mem, lay.region, 0, lay.header.alloc_end).unwrap();
        // Label 7 named at label 8's node, the partition published.
        let (a, b) = (
            lay.map.get(&*dh.mem, 7).unwrap().unwrap(),
            lay.map.get(&*dh.mem, 8).unwrap().unwrap(),
        );
        let at = lay.map.value_at(a.bucket) as usize;
        image[at..at + 8].copy_from_slice(&a.value.at(0, b.value.slot).encode().to_le_bytes());
        drop(guard);
        let strict = decode_image(&image, 4, 0);
        assert!(
            strict
                .as_ref()
                .is_err_and(|e| e.to_string().contains("label map name")),
            "{:?}",
            strict.map(|_| ())
        );
        let (_, _, _, locs) = decode_image_as(&image, 4, 0, true).unwrap();
        assert_eq!(locs.len(), 60);
    }

    /// A tombstone that arrives late, for a label whose newest node now
    /// sits in the very slot it names (a rebuild renumbered the partition
    /// in between), must leave that node alone: the map names it.
    #[test]
    fn a_late_tombstone_spares_the_node_the_map_names() {
        let idx = (crate::DESCRIPTOR.create)(
            4,
            Metric::L2,
            &params_of([("partitions", ParamValue::Int(2))]),
        )
        .unwrap();
        let rows: Vec<f32> = (0..200)
            .flat_map(|i| [i as f32, (i % 7) as f32, 0.0, 1.0])
            .collect();
        idx.insert(1, &(0..200).collect::<Vec<u64>>(), &rows)
            .unwrap();
        let dh = idx.as_any().downcast_ref::<DHnsw>().unwrap();
        let mut guard = dh.layout.write();
        let lay = guard.as_mut().unwrap();
        let f = lay.map.get(&*dh.mem, 42).unwrap().unwrap();
        let (p, n) = (f.value.part, f.value.slot);
        // Named by the map: spared. Another label's claim on the slot:
        // spared too (the node holds label 42).
        assert_eq!(dh.tombstone(lay, &[(p, n, 42, f.bucket)]).unwrap(), 0);
        let other = lay.map.get(&*dh.mem, 43).unwrap().unwrap();
        assert_eq!(dh.tombstone(lay, &[(p, n, 43, other.bucket)]).unwrap(), 0);
        drop(guard);
        assert_eq!(idx.get(42).unwrap().unwrap(), rows[42 * 4..43 * 4].to_vec());
        // Once the map no longer names it, the node goes.
        idx.insert(2, &[42], &[9.0, 9.0, 9.0, 9.0]).unwrap();
        let mut guard = dh.layout.write();
        let lay = guard.as_mut().unwrap();
        let now = lay.map.get(&*dh.mem, 42).unwrap().unwrap();
        assert_ne!(
            (now.value.part, now.value.slot),
            (p, n),
            "moved by the upsert"
        );
        drop(guard);
        assert_eq!(idx.get(42).unwrap().unwrap(), vec![9.0; 4]);
        assert!(idx.check_structure().unwrap().is_empty());
    }
}
