//! Inserts and deletes from this compute node (part 2 makes them safe from
//! several at once). A new point goes to the partition the meta-HNSW
//! ranks first; its node is linked into the partition's graph on the
//! compute node (HNSW's neighbour selection and back-link rule, layer 0),
//! and the new record, the changed neighbour lists and the partition's
//! overflow count are written in one doorbell chain, the count last. A
//! partition whose gap is full is rebuilt elsewhere. A delete writes the
//! node's tombstone flag (searches walk through it, never return it).

use crate::layout::{
    encode_list, encode_record, DELETED, ENTRY_BYTES, ENTRY_COUNT_AT, ENTRY_STATE_AT, KEYS_AT,
    LIVE_AT, RECORD_FLAGS_AT, RECORD_LIST_AT,
};
use crate::state::{DHnsw, Layout, Loc};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use vectide_core::heap::Candidate;
use vectide_core::{Result, Seq};
use vectide_graph::prune::{backlink, plan_links, Backlink};
use vectide_graph::{Graph, Scratch};
use vectide_remote::Verb;

impl DHnsw {
    /// Inserts a checked batch (vectors normalised for cosine).
    pub(crate) fn insert_rows(&self, seq: Seq, ids: &[u64], vectors: &[f32]) -> Result<()> {
        self.check_writable()?;
        let _w = self.write.lock();
        // Replays of operations not newer than what a label holds are
        // skipped; an upsert of a live label deletes its old node first.
        let mut keep: Vec<usize> = Vec::with_capacity(ids.len());
        let mut replaced: Vec<u64> = Vec::new();
        {
            let labels = self.labels.read();
            for (i, id) in ids.iter().enumerate() {
                match labels.get(id) {
                    Some(l) if l.seq >= seq => {}
                    Some(_) => {
                        replaced.push(*id);
                        keep.push(i);
                    }
                    None => keep.push(i),
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
        let done = self.insert_kept(seq, ids, vectors, &rows, &replaced);
        if done.is_ok() {
            self.applied
                .fetch_max(seq, std::sync::atomic::Ordering::AcqRel);
        }
        done
    }

    /// [`insert_rows`](Self::insert_rows) of the rows kept.
    fn insert_kept(
        &self,
        seq: Seq,
        ids: &[u64],
        vectors: &[f32],
        rows: &[usize],
        replaced: &[u64],
    ) -> Result<()> {
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
        self.delete_locked(seq, replaced, true)?;
        let mut guard = self.layout.write();
        let lay = guard.as_mut().expect("built");
        // A label map that the new labels would fill past its load is laid
        // out afresh (with its live labels only) first.
        let keys_after = lay.header.keys + rows.len() as u64;
        if keys_after as f64 > crate::labelmap::MAX_LOAD * lay.header.labels_buckets as f64 {
            self.relayout(lay, None)?;
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
        let mut placed = Vec::with_capacity(rows.len());
        for (p, group) in groups {
            placed.extend(self.insert_into(lay, p, seq, ids, vectors, &group, &mut s)?);
        }
        self.map_new(lay, seq, &placed)
    }

    /// Maps rows just placed, (label, partition, node), in the remote label
    /// map (each label's bucket claimed if it has none, its value swapped
    /// by CAS from what the claim read; a value already there, as a fresh
    /// layout writes it, is kept) and here; then the header's live and
    /// bucket counts move by what changed.
    fn map_new(&self, lay: &mut Layout, seq: Seq, placed: &[(u64, u32, u32)]) -> Result<()> {
        let labels: Vec<u64> = placed.iter().map(|r| r.0).collect();
        let (found, took) = lay.map.claim_many(&*self.mem, &labels)?;
        let mut swaps = Vec::new();
        let mut locs = Vec::with_capacity(placed.len());
        let mut added = 0u64;
        for (&(label, part, node), f) in placed.iter().zip(&found) {
            let v = f.value;
            let to = if v.present && (v.part, v.slot) == (part, node) {
                v
            } else {
                let to = v.at(part, node);
                swaps.push((f.bucket, v, to));
                to
            };
            // A label that was absent is one more live; an upsert replaced a
            // present value, and a fresh layout counted its labels already.
            added += u64::from(!v.present);
            locs.push((
                label,
                Loc {
                    part,
                    node,
                    seq,
                    bucket: f.bucket,
                    version: to.version,
                },
            ));
        }
        lay.map.swap_all(&*self.mem, &swaps)?;
        self.labels.write().extend(locs);
        self.count_changes(lay, added as i64, took)
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
        let live_before = it.next().expect("two completions").into_word()?;
        let keys_before = it.next().expect("two completions").into_word()?;
        lay.header.live = live_before.wrapping_add(live as u64);
        lay.header.keys = keys_before + keys;
        Ok(())
    }

    /// Places a partition's rows (into its gap, or by rebuilding it);
    /// returns them as (label, partition, node) for the label map.
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
    ) -> Result<crate::builder::Placed> {
        let dim = self.dim;
        let old = self.part(lay, p)?;
        if lay.room(p as usize) < group.len() as u64 {
            let labels: Vec<u64> = group.iter().map(|&i| ids[i]).collect();
            let mut v = Vec::with_capacity(group.len() * dim);
            for &i in group {
                v.extend_from_slice(&vectors[i * dim..(i + 1) * dim]);
            }
            let (g, rows) = self.rebuild_part(lay, p, &old, (&labels, &v), seq)?;
            let mut lru = self.cache.lock();
            lru.remove(p);
            lru.put(p, g);
            return Ok(rows);
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
        // The partition's state odd, the records and lists, the count, the
        // state even, each phase on its own (durable in turn on a backing
        // file): a reader sees the new records only once they are all
        // written, and a reader that read while they were being written
        // sees the state change and reads again.
        let at = lay.header.table_off + u64::from(p) * ENTRY_BYTES;
        let state = |s: u64| vec![(at + ENTRY_STATE_AT, s.to_le_bytes().to_vec())];
        let publish = vec![(at + ENTRY_COUNT_AT, count.to_le_bytes().to_vec())];
        // The map and the table change only once the node holds the writes.
        crate::fetch::post_phases(
            &*self.mem,
            lay.region,
            vec![state(e.state + 1), writes, publish, state(e.state + 2)],
        )?;
        lay.table[p as usize].count = count;
        lay.table[p as usize].state = e.state + 2;
        let g = Arc::new(g);
        let mut lru = self.cache.lock();
        lru.remove(p);
        lru.put(p, g);
        Ok(new_locs)
    }

    /// Deletes labels; returns how many were live.
    pub(crate) fn delete_rows(&self, seq: Seq, ids: &[u64]) -> Result<usize> {
        self.check_writable()?;
        let _w = self.write.lock();
        let n = self.delete_locked(seq, ids, false)?;
        self.applied
            .fetch_max(seq, std::sync::atomic::Ordering::AcqRel);
        Ok(n)
    }

    /// Writes the tombstones of `ids` (one doorbell chain) and marks their
    /// labels absent in the remote label map. `replacing`: an upsert's
    /// delete of the old node (no sequence check; the map's value is
    /// swapped to the new node by the insert).
    fn delete_locked(&self, seq: Seq, ids: &[u64], replacing: bool) -> Result<usize> {
        // Exclusive: a search that fetched a partition before the tombstone
        // was written would cache the copy without it.
        let mut guard = self.layout.write();
        let Some(lay) = guard.as_mut() else {
            return Ok(0);
        };
        let rec = lay.record();
        let mut gone: Vec<(u64, Loc)> = Vec::new();
        {
            let labels = self.labels.read();
            for id in ids {
                if let Some(l) = labels.get(id).copied() {
                    if replacing || l.seq <= seq {
                        gone.push((*id, l));
                    }
                }
            }
        }
        if gone.is_empty() {
            return Ok(0);
        }
        // Per partition touched: its state odd, the tombstones, its state
        // even (a reader holding the partition sees the version change).
        let mut by_part: BTreeMap<u32, Vec<(u64, Vec<u8>)>> = BTreeMap::new();
        for (_, l) in &gone {
            let e = &lay.table[l.part as usize];
            by_part.entry(l.part).or_default().push((
                e.node_at(u64::from(l.node), rec) + RECORD_FLAGS_AT,
                DELETED.to_le_bytes().to_vec(),
            ));
        }
        let state_at = |p: u32| lay.header.table_off + u64::from(p) * ENTRY_BYTES + ENTRY_STATE_AT;
        let odd = by_part
            .keys()
            .map(|&p| {
                (
                    state_at(p),
                    (lay.table[p as usize].state + 1).to_le_bytes().to_vec(),
                )
            })
            .collect();
        let even = by_part
            .keys()
            .map(|&p| {
                (
                    state_at(p),
                    (lay.table[p as usize].state + 2).to_le_bytes().to_vec(),
                )
            })
            .collect();
        let parts: Vec<u32> = by_part.keys().copied().collect();
        let flags = by_part.into_values().flatten().collect();
        crate::fetch::post_phases(&*self.mem, lay.region, vec![odd, flags, even])?;
        for p in parts {
            lay.table[p as usize].state += 2;
        }
        if !replacing {
            let swaps: Vec<_> = gone
                .iter()
                .map(|(_, l)| (l.bucket, l.slot(), l.slot().absent()))
                .collect();
            lay.map.swap_all(&*self.mem, &swaps)?;
        }
        {
            let mut labels = self.labels.write();
            let lru = self.cache.lock();
            for (id, l) in &gone {
                labels.remove(id);
                if let Some(g) = lru.peek(l.part) {
                    g.mark_deleted(l.node);
                }
            }
        }
        if !replacing {
            self.count_changes(lay, -(gone.len() as i64), 0)?;
        }
        Ok(gone.len())
    }
}
