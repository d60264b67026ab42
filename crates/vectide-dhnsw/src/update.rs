//! Inserts and deletes, from any compute node attached to the region. A new
//! point goes to the partition the meta-HNSW ranks first; the writer takes
//! the partition (and the partner sharing its gap) by CAS of its state
//! (`locks.rs`), links the node into the partition's graph on the compute
//! node (HNSW's neighbour selection and back-link rule, layer 0), writes the
//! new record and the changed neighbour lists, then the count, then the
//! next even state (the publish). A partition whose gap is full is rebuilt
//! elsewhere. Then the label map: each label's bucket claimed, its value
//! swapped by CAS to the new node; a CAS that finds another value (another
//! node changed the label meanwhile) re-reads and swaps again, the last
//! writer winning, and whichever node a label pointed at before is
//! tombstoned (the header's owed word raised before the publish and
//! lowered after, so that a writer stopping in between leaves a trace
//! `maintain` follows: `sweep.rs`). A delete swaps the label's value to absent the same way,
//! then tombstones its node (searches walk through tombstones, never
//! return them).

use crate::layout::{encode_list, encode_record, ENTRY_COUNT_AT, KEYS_AT, LIVE_AT, RECORD_LIST_AT};
use crate::state::{DHnsw, Layout, Loc};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use vectide_core::heap::Candidate;
use vectide_core::{Result, Seq};
use vectide_graph::prune::{backlink, plan_links, Backlink};
use vectide_graph::{Graph, Scratch};
use vectide_remote::Verb;

/// What naming placed rows in the label map changed (the counts, moved
/// before the partition is published) and leaves to do once no partition
/// is held (the tombstones).
#[derive(Default)]
pub(crate) struct Mapped {
    /// Labels that were absent (the live count grows by these).
    pub added: i64,
    /// Buckets the claims took.
    pub took: u64,
    /// Nodes no label points at any more: (partition, node, label).
    pub tombstones: Vec<crate::locks::Doomed>,
    /// What this write raised the header's owed word by (`sweep.rs`).
    pub owed: i64,
}

impl DHnsw {
    /// Inserts a checked batch (vectors normalised for cosine).
    pub(crate) fn insert_rows(&self, seq: Seq, ids: &[u64], vectors: &[f32]) -> Result<()> {
        let _w = self.write.lock();
        // Replays of operations not newer than what this node last applied
        // to a label are skipped (the label map replaces an upserted
        // label's old node, wherever it is).
        let mut keep: Vec<usize> = Vec::with_capacity(ids.len());
        {
            let labels = self.labels.read();
            for (i, id) in ids.iter().enumerate() {
                match labels.get(id) {
                    Some(l) if l.seq >= seq => {}
                    _ => keep.push(i),
                }
            }
        }
        // A batch repeating an id keeps its last row.
        let mut last: BTreeMap<u64, usize> = BTreeMap::new();
        for &i in &keep {
            last.insert(ids[i], i);
        }
        let rows: Vec<usize> = last.into_values().collect();
        if rows.is_empty() {
            return Ok(());
        }
        let done = self.insert_kept(seq, ids, vectors, &rows);
        if done.is_ok() {
            self.applied
                .fetch_max(seq, std::sync::atomic::Ordering::AcqRel);
        }
        done
    }

    /// [`insert_rows`](Self::insert_rows) of the rows kept.
    fn insert_kept(&self, seq: Seq, ids: &[u64], vectors: &[f32], rows: &[usize]) -> Result<()> {
        let dim = self.dim;
        let first = self.layout.read().is_none();
        if first || self.outgrown(rows.len()) {
            let ids2: Vec<u64> = rows.iter().map(|&i| ids[i]).collect();
            let mut v = Vec::with_capacity(rows.len() * dim);
            for &i in rows {
                v.extend_from_slice(&vectors[i * dim..(i + 1) * dim]);
            }
            return if first {
                self.build(seq, &ids2, &v)
            } else {
                self.repartition(seq, (&ids2, &v))
            };
        }
        let mut guard = self.layout.write();
        let lay = guard.as_mut().expect("built");
        // A label map that the new labels would fill past its load is laid
        // out afresh (with its live labels only) first.
        let keys_after = lay.header.keys + rows.len() as u64;
        if keys_after as f64 > crate::labelmap::MAX_LOAD * lay.header.labels_buckets as f64 {
            self.relayout(lay, None, &[])?;
        }
        // Route each row to the partition its nearest centroid heads.
        let mut groups: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
        let mut s = Scratch::default();
        for &i in rows {
            let mut out = Vec::with_capacity(1);
            lay.meta.search(
                self.dist,
                &vectors[i * dim..(i + 1) * dim],
                1,
                32,
                &mut s,
                |_| true,
                &mut out,
            );
            let p = out
                .first()
                .map(|n| n.id as u32)
                .filter(|&p| (p as usize) < lay.table.len())
                .ok_or_else(|| {
                    vectide_core::Error::corrupted("d-hnsw: the meta-HNSW routes to no partition")
                })?;
            groups.entry(p).or_default().push(i);
        }
        let mut all = Mapped::default();
        let mut failed = None;
        for (p, group) in groups {
            match self.insert_into(lay, p, seq, ids, vectors, &group, &mut s) {
                Ok(m) => {
                    all.tombstones.extend(m.tombstones);
                    all.owed += m.owed;
                }
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        // With no partition held: the nodes the labels left behind (also
        // those of the groups placed before a failure), and a recount if a
        // take-over happened on the way.
        if crate::switches::STOP_BEFORE_TOMBSTONES.on() {
            return Err(vectide_core::Error::unavailable(
                "the compute node died (a test's switch)",
            ));
        }
        let tombstoned = self
            .tombstone(lay, &all.tombstones)
            .and_then(|_| self.owe(lay, -all.owed));
        let recounted = self.recount_if_taken_over(lay);
        match failed {
            Some(e) => Err(e),
            None => tombstoned.and(recounted),
        }
    }

    /// Names rows just placed, (label, partition, node), in the remote
    /// label map, with their partition still held: each label's bucket
    /// claimed if it has none, its value swapped by CAS from what was read
    /// (a value already there, as a fresh layout writes it, is kept); a CAS
    /// that finds another value swaps again from it (this write is the
    /// later one). Returns what the caller does once no partition is held:
    /// the nodes the labels pointed at before (to tombstone) and the counts.
    fn map_swap(&self, lay: &mut Layout, seq: Seq, placed: &[(u64, u32, u32)]) -> Result<Mapped> {
        let mut out = Mapped::default();
        if placed.is_empty() {
            return Ok(out);
        }
        let labels: Vec<u64> = placed.iter().map(|r| r.0).collect();
        let (found, took) = lay.map.claim_many(&*self.mem, &labels)?;
        out.took = took;
        let mut locs: Vec<(u64, Loc)> = Vec::with_capacity(placed.len());
        // (row, bucket, expected, new)
        let mut pending = Vec::new();
        for (i, (&(label, part, node), f)) in placed.iter().zip(&found).enumerate() {
            let v = f.value;
            if v.present && (v.part, v.slot) == (part, node) {
                locs.push((label, Loc::at(part, node, seq, f.bucket, v.version)));
            } else {
                pending.push((i, f.bucket, v, v.at(part, node)));
            }
        }
        while !pending.is_empty() {
            let swaps: Vec<_> = pending.iter().map(|&(_, b, e, n)| (b, e, n)).collect();
            let seen = lay.map.swap_many(&*self.mem, &swaps)?;
            let mut again = Vec::new();
            for (&(i, bucket, expect, new), got) in pending.iter().zip(seen) {
                let (label, part, node) = placed[i];
                if got != expect {
                    crate::state::Timing::add(&self.timing.cas_retries, 1);
                    again.push((i, bucket, got, got.at(part, node)));
                    continue;
                }
                if expect.present {
                    out.tombstones
                        .push((expect.part, expect.slot, label, bucket));
                } else {
                    out.added += 1;
                }
                locs.push((label, Loc::at(part, node, seq, bucket, new.version)));
            }
            pending = again;
        }
        self.labels.write().extend(locs);
        Ok(out)
    }

    /// Before the publish: raises the owed word when nodes are left to
    /// tombstone once no partition is held (`sweep.rs`).
    fn owe_for(&self, lay: &Layout, mapped: &mut Mapped) -> Result<()> {
        if !mapped.tombstones.is_empty() {
            self.owe(lay, 1)?;
            mapped.owed = 1;
        }
        Ok(())
    }

    /// Moves the header's live count by `live` and its taken-bucket count
    /// by `keys` (FETCH_ADD, one doorbell), and this node's copy with them.
    pub(crate) fn count_changes(&self, lay: &mut Layout, live: i64, keys: u64) -> Result<()> {
        if live == 0 && keys == 0 {
            return Ok(());
        }
        let wrs = [
            Verb::FetchAdd {
                region: lay.region.id,
                offset: LIVE_AT,
                add: live as u64,
            },
            Verb::FetchAdd {
                region: lay.region.id,
                offset: KEYS_AT,
                add: keys,
            },
        ];
        let c = self.mem.post(&wrs)?;
        let mut it = c.into_iter();
        // Not FLUSHed: a region is recounted when it is put right after its
        // memory node restarted (`recovery.rs`).
        let live_before = it.next().expect("two completions").into_word()?;
        let keys_before = it.next().expect("two completions").into_word()?;
        lay.header.live = live_before.wrapping_add(live as u64);
        lay.header.keys = keys_before + keys;
        Ok(())
    }

    /// Places a partition's rows (into its gap, or by rebuilding it) and
    /// names them in the label map, under the partition's lock.
    #[allow(clippy::too_many_arguments)]
    fn insert_into(
        &self,
        lay: &mut Layout,
        p: u32,
        seq: Seq,
        ids: &[u64],
        vectors: &[f32],
        group: &[usize],
        s: &mut Scratch,
    ) -> Result<Mapped> {
        // Take the partition, and the partner sharing its gap (their counts
        // bound it together), in index order: two writers never wait on
        // each other in a cycle. A partner that no longer shares the gap
        // (rebuilt elsewhere meanwhile) is given back at once.
        // Holding one, the other is waited on for a third of the take-over
        // time at most; then the first is given back and both tried again,
        // so this writer never holds a lock long enough to be taken over.
        let patience = self.lease() / 3;
        let mut started = std::time::Instant::now();
        let mut partner = None;
        let held = loop {
            let Some(q) = lay.partner(p) else {
                break self.acquire(lay, p)?;
            };
            let (a, b) = if q < p { (q, p) } else { (p, q) };
            let ha = self.acquire(lay, a)?;
            match self.acquire_within(lay, b, patience) {
                Ok(Some(hb)) => {
                    let (hp, hq) = if a == p { (ha, hb) } else { (hb, ha) };
                    partner = Some((q, hq));
                    break hp;
                }
                Ok(None) => {
                    self.release(lay, a, ha)?;
                    if started.elapsed() > self.lease() {
                        // Waited a whole take-over time: take `b` alone,
                        // holding nothing (over from its holder if that one
                        // stopped), give it back, and try both again.
                        let hb = self.acquire(lay, b)?;
                        self.release(lay, b, hb)?;
                        started = std::time::Instant::now();
                    } else {
                        std::thread::sleep(std::time::Duration::from_millis(1));
                    }
                }
                Err(e) => {
                    let _ = self.release(lay, a, ha);
                    return Err(e);
                }
            }
        };
        if let Some((q, hq)) = partner {
            if lay.partner(p) != Some(q) {
                self.release(lay, q, hq)?;
                partner = None;
            }
        }
        let region = lay.region;
        // A write that fails once it has begun leaves `p` held (odd): a
        // half-done write is put right only by whoever takes the partition
        // over (`locks.rs`), never published as it is.
        let placed = self.insert_held(lay, p, held, seq, ids, vectors, group, s);
        // The partner is given back unchanged (not in a region the index
        // moved away from meanwhile).
        if let Some((q, hq)) = partner.filter(|_| lay.region == region) {
            let given = self.release(lay, q, hq);
            if placed.is_ok() {
                given?;
            }
        }
        placed
    }

    /// [`insert_into`](Self::insert_into) with `p` held at `held` (and its
    /// partner, if it shares the gap).
    #[allow(clippy::too_many_arguments)]
    fn insert_held(
        &self,
        lay: &mut Layout,
        p: u32,
        held: u64,
        seq: Seq,
        ids: &[u64],
        vectors: &[f32],
        group: &[usize],
        s: &mut Scratch,
    ) -> Result<Mapped> {
        let dim = self.dim;
        let old = self.part_held(lay, p)?;
        if lay.room(p as usize) < group.len() as u64 {
            let labels: Vec<u64> = group.iter().map(|&i| ids[i]).collect();
            let mut v = Vec::with_capacity(group.len() * dim);
            for &i in group {
                v.extend_from_slice(&vectors[i * dim..(i + 1) * dim]);
            }
            let t = std::time::Instant::now();
            let (g, rows, stale, left) =
                self.rebuild_part(lay, p, &old, (&labels, &v), seq, held)?;
            crate::state::Timing::add(&self.timing.rebuild_ns, t.elapsed().as_nanos() as u64);
            let mut mapped = self.map_swap(lay, seq, &rows)?;
            mapped.tombstones.extend(stale);
            self.count_changes(lay, mapped.added, mapped.took)?;
            self.owe_for(lay, &mut mapped)?;
            if let Some((off, len)) = left {
                // Published once the map names the new rows; only then is
                // the old area free (a reader still on it sees the state
                // move and reads again).
                self.publish(lay, p, held)?;
                if !self.give_free(lay, off, len).unwrap_or(false) {
                    self.timing
                        .dead_bytes
                        .fetch_add(len, std::sync::atomic::Ordering::Relaxed);
                }
            }
            let mut lru = self.cache.lock();
            lru.remove(p);
            lru.put(p, g);
            return Ok(mapped);
        }
        let mut g = old.to_owned_graph();
        let first_new = g.len() as u32;
        let m0 = g.m0;
        let mut changed: BTreeSet<u32> = BTreeSet::new();
        let (mut lists, mut buf, mut ranked, mut kept): (
            Vec<Vec<u32>>,
            Vec<u32>,
            Vec<Candidate>,
            Vec<u32>,
        ) = Default::default();
        for &i in group {
            let v = &vectors[i * dim..(i + 1) * dim];
            let node = g.push_node(ids[i], v);
            let Some((ep, top)) = g.entry.filter(|&(e, _)| e != node) else {
                continue;
            };
            plan_links(
                &g,
                self.dist,
                v,
                node,
                0,
                (ep, top),
                self.params.ef_construction,
                m0,
                s,
                &mut lists,
                |_| true,
            );
            g.set_list0(node, &lists[0]);
            for &nb in &lists[0] {
                match backlink(&g, self.dist, nb, node, 0, &mut buf, &mut ranked, &mut kept) {
                    Backlink::Present => {}
                    Backlink::Append => {
                        buf.push(node);
                        g.set_list0(nb, &buf);
                        changed.insert(nb);
                    }
                    Backlink::Replace => {
                        g.set_list0(nb, &kept);
                        changed.insert(nb);
                    }
                }
            }
        }
        let e = lay.table[p as usize];
        let rec = lay.record();
        let mut writes = Vec::new();
        for nb in changed.iter().filter(|&&nb| nb < first_new) {
            let mut b = Vec::with_capacity(4 + 4 * m0);
            encode_list(&mut b, &g.list0_of(*nb), m0);
            writes.push((e.node_at(u64::from(*nb), rec) + RECORD_LIST_AT, b));
        }
        let mut new_locs = Vec::with_capacity(g.len() - first_new as usize);
        for node in first_new..g.len() as u32 {
            let mut b = Vec::with_capacity(rec as usize);
            encode_record(
                &mut b,
                g.labels[node as usize],
                0,
                &g.list0_of(node),
                m0,
                g.vector(node),
            );
            let j = u64::from(node) - u64::from(e.n_base);
            writes.push((e.overflow_at(j, rec), b));
            new_locs.push((g.labels[node as usize], p, node));
        }
        let count = e.count + u64::from(g.len() as u32 - first_new);
        // Under the partition's odd state: the records and lists, then the
        // count (each phase durable in turn on a backing file), then the
        // label map, then the next even state: a reader sees the new
        // records only once they are all written, a reader that read while
        // they were being written sees the state change and reads again,
        // and a writer that takes the partition next (to rebuild it, say)
        // finds the new nodes already named by the map.
        let at = lay.entry_at(p);
        // The count, and the entry's rebuild intent cleared with it (an
        // intent left standing would say count 0: `layout.rs`).
        let publish = vec![
            (at + ENTRY_COUNT_AT, count.to_le_bytes().to_vec()),
            (
                at + crate::layout::Entry::INTENT_CHECK_AT,
                0u64.to_le_bytes().to_vec(),
            ),
        ];
        crate::fetch::post_phases(
            &*self.mem,
            lay.region,
            vec![
                (crate::sites::RECORDS, writes),
                (crate::sites::COUNT, publish),
            ],
        )?;
        lay.table[p as usize].count = count;
        let mut mapped = self.map_swap(lay, seq, &new_locs)?;
        // The counts too before the publish: a writer that dies before it
        // leaves the partition held, and its taker recounts.
        self.count_changes(lay, mapped.added, mapped.took)?;
        self.owe_for(lay, &mut mapped)?;
        self.publish(lay, p, held)?;
        g.set_version(held + 1);
        let g = Arc::new(g);
        let mut lru = self.cache.lock();
        lru.remove(p);
        lru.put(p, g);
        Ok(mapped)
    }

    /// Deletes labels; returns how many were live.
    pub(crate) fn delete_rows(&self, seq: Seq, ids: &[u64]) -> Result<usize> {
        let _w = self.write.lock();
        let n = self.delete_locked(seq, ids)?;
        self.applied
            .fetch_max(seq, std::sync::atomic::Ordering::AcqRel);
        Ok(n)
    }

    /// Deletes `ids` partition by partition, each held while its labels'
    /// values are swapped to absent and their nodes tombstoned, then
    /// published (a writer that dies in between leaves the partition held,
    /// and whoever takes it over tombstones what the map no longer names).
    /// A label whose value names another partition by the time its
    /// partition is held (another node moved it) is deleted there next. A
    /// label this node wrote by a later operation than `seq` is left (a
    /// replay).
    fn delete_locked(&self, seq: Seq, ids: &[u64]) -> Result<usize> {
        // Exclusive: a search that fetched a partition before the tombstone
        // was written would cache the copy without it.
        let mut guard = self.layout.write();
        let Some(lay) = guard.as_mut() else {
            return Ok(0);
        };
        let mut pending: Vec<u64> = {
            let labels = self.labels.read();
            ids.iter()
                .copied()
                .filter(|id| labels.get(id).is_none_or(|l| l.seq <= seq))
                .collect()
        };
        let mut gone = 0usize;
        while !pending.is_empty() {
            let found = lay.map.get_many(&*self.mem, &pending)?;
            let mut by_part: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
            for (&id, f) in pending.iter().zip(found) {
                if let Some(f) = f.filter(|f| f.value.present) {
                    by_part.entry(f.value.part).or_default().push(id);
                }
            }
            let mut again = Vec::new();
            for (p, group) in by_part {
                if p as usize >= lay.table.len() {
                    return Err(vectide_core::Error::corrupted(format!(
                        "d-hnsw: a label is mapped to partition {p} of {}",
                        lay.table.len()
                    )));
                }
                let held = self.acquire(lay, p)?;
                // A failure leaves `p` held, for a take-over to put right.
                gone += self.delete_held(lay, p, held, &group, &mut again)?;
            }
            pending = again;
        }
        self.recount_if_taken_over(lay)?;
        Ok(gone)
    }

    /// [`delete_locked`](Self::delete_locked) of `group` in partition `p`,
    /// held at `held`: values naming `p` swapped to absent, their nodes
    /// tombstoned, the partition published; labels now elsewhere go to
    /// `elsewhere`. Returns how many were deleted.
    fn delete_held(
        &self,
        lay: &mut Layout,
        p: u32,
        held: u64,
        group: &[u64],
        elsewhere: &mut Vec<u64>,
    ) -> Result<usize> {
        let found = lay.map.get_many(&*self.mem, group)?;
        let mut swaps = Vec::new();
        let mut ids = Vec::new();
        for (&id, f) in group.iter().zip(found) {
            match f.filter(|f| f.value.present) {
                Some(f) if f.value.part == p => {
                    swaps.push((f.bucket, f.value, f.value.absent()));
                    ids.push(id);
                }
                Some(_) => elsewhere.push(id),
                None => {}
            }
        }
        // A value naming a node of `p` gets a new node only under its lock
        // (held here), but an upsert elsewhere may move it away meanwhile:
        // a lost CAS sends the label after its new place.
        let seen = lay.map.swap_many(&*self.mem, &swaps)?;
        let mut won = Vec::with_capacity(swaps.len());
        let mut kept_ids = Vec::with_capacity(ids.len());
        for ((w, got), id) in swaps.iter().zip(seen).zip(&ids) {
            if got == w.1 {
                won.push(*w);
                kept_ids.push(*id);
            } else if got.present {
                crate::state::Timing::add(&self.timing.cas_retries, 1);
                elsewhere.push(*id);
            }
        }
        let (swaps, ids) = (won, kept_ids);
        let e = lay.table[p as usize];
        let rec = lay.record();
        let flags: Vec<(u64, Vec<u8>)> = swaps
            .iter()
            .map(|(_, v, _)| {
                (
                    e.node_at(u64::from(v.slot), rec) + crate::layout::RECORD_FLAGS_AT,
                    crate::layout::DELETED.to_le_bytes().to_vec(),
                )
            })
            .collect();
        // Not FLUSHed: a node the map no longer names is tombstoned when
        // the region is put right after its memory node restarted.
        crate::fetch::post_unflushed(&*self.mem, lay.region, flags)?;
        self.count_changes(lay, -(ids.len() as i64), 0)?;
        self.publish(lay, p, held)?;
        {
            let mut labels = self.labels.write();
            for id in &ids {
                labels.remove(id);
            }
        }
        let mut lru = self.cache.lock();
        match lru.get(p) {
            Some(g) if g.version() == held - 1 => {
                for (_, v, _) in &swaps {
                    g.mark_deleted(v.slot);
                }
                g.set_version(held + 1);
            }
            _ => lru.remove(p),
        }
        Ok(ids.len())
    }
}
