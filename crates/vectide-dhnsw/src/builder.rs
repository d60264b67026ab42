//! Building: balanced k-means partitions (`vectide-quant`, a hard cap of
//! ⌈N/K⌉ points each), one sub-HNSW per partition and the meta-HNSW over
//! the centroids (both built by `vectide-hnsw`'s builder and exported),
//! laid out in a new region as `[header, meta, table, sub0, GAP, sub1,
//! sub2, GAP, sub3, …]` and written with doorbell chains of WRITEs, the
//! header last. A partition whose gap is full is rebuilt alone at the end
//! of the region with a gap of its own; an index of automatic K that
//! outgrows it twice over is partitioned afresh into a new region.

use crate::labelmap::LabelMap;
use crate::layout::{
    encode_blob, record_bytes, Entry, GraphParts, Header, ALLOC_END_AT, ENTRY_BYTES, EPOCH_AT,
    SECTIONS_AT,
};
use crate::state::{DHnsw, Layout, Loc};
use crate::subgraph::SubGraph;
use rayon::prelude::*;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use vectide_core::{Error, Result, VectorIndex};
use vectide_graph::HnswParams;
use vectide_hnsw::Hnsw;
use vectide_quant::balanced::{balanced_kmeans, BalancedParams};
use vectide_remote::Region;

/// Rows placed in a partition: (label, partition, node), for the label map.
pub(crate) type Placed = Vec<(u64, u32, u32)>;

/// A rebuilt partition: its graph, its new rows (to name in the label map),
/// its nodes whose label moved on meanwhile (to tombstone), and the area
/// (offset, length) it left, to free once it is published (`None`: the
/// index moved to a new region instead, nothing left to publish).
pub(crate) type Rebuilt = (
    Arc<SubGraph>,
    Placed,
    Vec<crate::locks::Doomed>,
    Option<(u64, u64)>,
);

/// A layout just written: its region, header and table, and each live
/// label's bucket in its label map.
type Written = (Region, Header, Vec<Entry>, HashMap<u64, u64>);

/// Overflow records a gap holds at least, whatever the partitions' sizes.
const MIN_ROOM: u64 = 16;

/// Tag of the meta-HNSW's blob.
pub const META_TAG: u32 = u32::MAX;

impl DHnsw {
    fn hnsw_params(&self, seed: u64) -> HnswParams {
        HnswParams {
            m: self.params.m,
            ef_construction: self.params.ef_construction,
            seed,
            threads: Some(1),
            ..HnswParams::default()
        }
    }

    /// One graph over `labels` / `vectors` (already normalised when the
    /// metric is cosine), as parts to lay out.
    pub(crate) fn build_graph(
        &self,
        labels: &[u64],
        vectors: &[f32],
        seed: u64,
    ) -> Result<GraphParts> {
        let (m, m0) = (self.params.m, 2 * self.params.m);
        if labels.is_empty() {
            return Ok(GraphParts {
                dim: self.dim,
                m,
                m0,
                ..GraphParts::default()
            });
        }
        let h = Hnsw::new(self.dim, self.metric, self.hnsw_params(seed))?;
        h.insert(1, labels, vectors)?;
        let g = h
            .export()
            .ok_or_else(|| Error::invalid("d-hnsw: a fresh sub-HNSW build left a hole"))?;
        Ok(GraphParts {
            dim: g.dim,
            m: g.m,
            m0: g.m0,
            entry: g.entry,
            flags: vec![0; g.labels.len()],
            labels: g.labels,
            levels: g.levels,
            vectors: g.vectors,
            lists: g.lists,
        })
    }

    fn gap_records(&self, points: usize) -> u64 {
        ((self.params.gap * points as f64).ceil() as u64).max(MIN_ROOM)
    }

    /// Partitions `vectors` (K from the parameters for their count) and
    /// builds a sub-HNSW per partition and the meta-HNSW over the
    /// centroids. Nothing is written.
    fn plan(&self, ids: &[u64], vectors: &[f32]) -> Result<(Vec<GraphParts>, GraphParts)> {
        let n = ids.len();
        let dim = self.dim;
        let k = self.params.k_for(n);
        let (centroids, assign) = if k == 1 {
            let mut c = vec![0f32; dim];
            for row in vectors.chunks(dim) {
                for (a, x) in c.iter_mut().zip(row) {
                    *a += x / n as f32;
                }
            }
            (c, vec![0u32; n])
        } else {
            let mut bp = BalancedParams::new(k);
            bp.slack = 0.0;
            bp.kmeans.seed = self.params.seed;
            let (c, a) = self.install(|| balanced_kmeans(vectors, dim, &bp))?;
            (c.as_slice().to_vec(), a)
        };
        let mut rows: Vec<Vec<usize>> = vec![Vec::new(); k];
        for (i, &p) in assign.iter().enumerate() {
            rows[p as usize].push(i);
        }
        let seed = self.params.seed;
        let subs: Vec<GraphParts> = self.install(|| {
            rows.par_iter()
                .enumerate()
                .map(|(p, r)| {
                    let labels: Vec<u64> = r.iter().map(|&i| ids[i]).collect();
                    let mut v = Vec::with_capacity(r.len() * dim);
                    for &i in r {
                        v.extend_from_slice(&vectors[i * dim..(i + 1) * dim]);
                    }
                    self.build_graph(&labels, &v, seed ^ p as u64)
                })
                .collect::<Result<_>>()
        })?;
        let meta_labels: Vec<u64> = (0..k as u64).collect();
        let meta = self.build_graph(&meta_labels, &centroids, seed ^ 0x3e7a)?;
        Ok((subs, meta))
    }

    /// Builds the index from its first batch: partitions, sub-HNSWs, the
    /// meta-HNSW, the region and its bytes, then the label map.
    pub(crate) fn build(&self, seq: u64, ids: &[u64], vectors: &[f32]) -> Result<()> {
        let (subs, meta) = self.plan(ids, vectors)?;
        let name = self.params.region.clone().unwrap_or_else(auto_name);
        let (region, header, table, buckets) = self.write_layout(&name, &subs, &meta, 1, None)?;
        let mut lay = Layout::new(region, name, header, table, &meta);
        // A new region's lease (if this node takes one) before any other
        // node can find it written.
        self.take_lease(&mut lay)?;
        self.switch_to(lay, &subs, &buckets, |_, _| seq);
        Ok(())
    }

    /// Makes `lay` (whose partitions hold `subs`) the index's layout and
    /// rewrites the label map from it, each label's sequence number from
    /// `seq_of` (given the map being replaced); the LRU starts empty. The layout's lock first, then the
    /// label map's (the order every path takes them in).
    fn switch_to(
        &self,
        lay: Layout,
        subs: &[GraphParts],
        buckets: &HashMap<u64, u64>,
        seq_of: impl Fn(u64, &HashMap<u64, Loc>) -> u64,
    ) {
        let mut guard = self.layout.write();
        self.switch_held(&mut guard, lay, subs, buckets, seq_of);
    }

    /// [`switch_to`](Self::switch_to) with the layout's lock held.
    fn switch_held(
        &self,
        guard: &mut Option<Layout>,
        lay: Layout,
        subs: &[GraphParts],
        buckets: &HashMap<u64, u64>,
        seq_of: impl Fn(u64, &HashMap<u64, Loc>) -> u64,
    ) {
        let mut map = self.labels.write();
        let mut fresh = HashMap::with_capacity(map.len());
        for (p, g) in subs.iter().enumerate() {
            for (node, &l) in g.labels.iter().enumerate() {
                if g.flags
                    .get(node)
                    .is_some_and(|f| f & crate::layout::DELETED != 0)
                {
                    continue;
                }
                let loc = Loc {
                    part: p as u32,
                    node: node as u32,
                    seq: seq_of(l, &map),
                    bucket: buckets[&l],
                    version: 1,
                };
                fresh.insert(l, loc);
            }
        }
        *map = fresh;
        *self.cache.lock() = self.params.cache(subs.len());
        self.stuck.lock().clear();
        self.leased.on_region(lay.region);
        *guard = Some(lay);
    }

    /// Whether an index of automatic K should be partitioned afresh before
    /// taking `incoming` more rows: its live count would call for at least
    /// twice the partitions it has (a first batch of 5,000 rows makes one
    /// partition; without this, every later row would join it).
    pub(crate) fn outgrown(&self, incoming: usize) -> bool {
        if self.params.partitions.is_some() {
            return false;
        }
        let k = self.layout.read().as_ref().map_or(0, |l| l.table.len());
        let after = self.labels.read().len() + incoming;
        k > 0 && self.params.k_for(after) >= 2 * k
    }

    /// Partitions the whole index afresh with `new` rows added (their
    /// labels' old rows, if any, left out), into a new region; the old one
    /// is dropped. Searches go on over the old region meanwhile (the
    /// layout is only read until the switch); the caller holds the writer
    /// lock. The label map keeps each old label's sequence number.
    pub(crate) fn repartition(&self, seq: u64, new: (&[u64], &[f32])) -> Result<()> {
        let dim = self.dim;
        let fresh: HashSet<u64> = new.0.iter().copied().collect();
        // Fenced like a relayout: every partition held while it is read
        // and until the old region is gone, only the nodes the label map
        // names carried over.
        let mut guard = self.layout.write();
        let lay = guard.as_mut().expect("built");
        let mine = self.hold_all(lay, &[])?;
        let read = self.fenced_parts(lay, None);
        let parts = match read {
            Ok(p) => p,
            Err(e) => {
                self.release_all(lay, mine);
                return Err(e);
            }
        };
        let (mut labels, mut vectors) = (Vec::new(), Vec::new());
        for g in &parts {
            for (node, &l) in g.labels.iter().enumerate() {
                let dead = g
                    .flags
                    .get(node)
                    .is_some_and(|f| f & crate::layout::DELETED != 0);
                if !dead && !fresh.contains(&l) {
                    labels.push(l);
                    vectors.extend_from_slice(&g.vectors[node * dim..(node + 1) * dim]);
                }
            }
        }
        let (old_name, epoch) = (lay.name.clone(), lay.header.epoch);
        labels.extend_from_slice(new.0);
        vectors.extend_from_slice(new.1);
        let planned = self.plan(&labels, &vectors).and_then(|(subs, meta)| {
            let name = next_region_name(&old_name, epoch + 1);
            let writers = self.writers_image(lay)?;
            let w = self.write_layout(&name, &subs, &meta, epoch + 1, Some(writers))?;
            Ok((subs, meta, name, w))
        });
        let (subs, meta, name, (region, header, table, buckets)) = match planned {
            Ok(x) => x,
            Err(e) => {
                self.release_all(lay, mine);
                return Err(e);
            }
        };
        self.switch_held(
            &mut guard,
            Layout::new(region, name, header, table, &meta),
            &subs,
            &buckets,
            |l, old| match old.get(&l) {
                Some(o) if !fresh.contains(&l) => o.seq,
                _ => seq,
            },
        );
        let _ = self.mem.drop_region(&old_name);
        self.timing.repartitions.fetch_add(1, Ordering::Relaxed);
        self.timing.dead_bytes.store(0, Ordering::Relaxed);
        Ok(())
    }

    /// Lays `subs` and `meta` out in a new region `name` (the label map of
    /// their live nodes, pairs around shared gaps, room to rebuild
    /// partitions after them) and writes them, the header last. Partitions
    /// start at `epoch`; `writers` is the writer table to carry over (from
    /// the region the index moves out of). Returns the region, header,
    /// table and each live label's bucket in the map.
    fn write_layout(
        &self,
        name: &str,
        subs: &[GraphParts],
        meta: &GraphParts,
        epoch: u64,
        writers: Option<Vec<u8>>,
    ) -> Result<Written> {
        let k = subs.len();
        let dim = self.dim;
        let meta_blob = encode_blob(meta, META_TAG);
        let blobs: Vec<Vec<u8>> = subs
            .iter()
            .enumerate()
            .map(|(p, g)| encode_blob(g, p as u32))
            .collect();
        let rec = record_bytes(dim, 2 * self.params.m) as u64;
        let mut rows: Vec<(u64, u32, u32)> = Vec::new();
        for (p, g) in subs.iter().enumerate() {
            for (node, &l) in g.labels.iter().enumerate() {
                if g.flags
                    .get(node)
                    .is_none_or(|f| f & crate::layout::DELETED == 0)
                {
                    rows.push((l, p as u32, node as u32));
                }
            }
        }
        let live = rows.len() as u64;
        let gaps: u64 = subs
            .chunks(2)
            .map(|pair| self.gap_records(pair.iter().map(|g| g.labels.len()).sum()))
            .sum();
        // Room for every point the layout can take and as many again
        // (labels deleted keep their buckets until the next layout).
        let n_buckets = LabelMap::buckets_for(2 * (live + gaps));
        let (map_bytes, at) = LabelMap::encode_new(n_buckets, &rows)?;
        let buckets: HashMap<u64, u64> = rows.iter().zip(at).map(|(r, b)| (r.0, b)).collect();
        let meta_off = SECTIONS_AT;
        let table_off = (meta_off + meta_blob.len() as u64).next_multiple_of(8);
        let labels_off = (table_off + k as u64 * ENTRY_BYTES).next_multiple_of(8);
        let free_off = labels_off + map_bytes.len() as u64;
        let free_slots = crate::space::free_slots_for(k);
        let mut off = free_off + free_slots * crate::space::FREE_SLOT_BYTES;
        let mut table = vec![Entry::default(); k];
        let mut p = 0;
        while p < k {
            let pair = p + 1 < k;
            let points = subs[p].labels.len() + if pair { subs[p + 1].labels.len() } else { 0 };
            let gap_lo = off + blobs[p].len() as u64;
            let gap_hi = gap_lo + self.gap_records(points) * rec;
            table[p] = Entry {
                blob_off: off,
                blob_len: blobs[p].len() as u64,
                n_base: subs[p].labels.len() as u32,
                backward: false,
                count: 0,
                epoch,
                gap_lo,
                gap_hi,
                records_at: blob_records_at(&blobs[p]),
                state: 0,
                intent: false,
            };
            off = gap_hi;
            if pair {
                table[p + 1] = Entry {
                    blob_off: off,
                    blob_len: blobs[p + 1].len() as u64,
                    n_base: subs[p + 1].labels.len() as u32,
                    backward: true,
                    count: 0,
                    epoch,
                    gap_lo,
                    gap_hi,
                    records_at: blob_records_at(&blobs[p + 1]),
                    state: 0,
                    intent: false,
                };
                off += blobs[p + 1].len() as u64;
            }
            off = off.next_multiple_of(8);
            p += 2;
        }
        // Room to rebuild partitions elsewhere as they fill up.
        let region_size = (off * 2).max(off + (1 << 20));
        let region = self.new_region(name, region_size)?;
        let header = Header {
            dim: dim as u32,
            metric: self.metric,
            m: self.params.m as u32,
            m0: 2 * self.params.m as u32,
            k: k as u32,
            record: rec as u32,
            epoch,
            meta_off,
            meta_len: meta_blob.len() as u64,
            table_off,
            alloc_end: off,
            region_size,
            live,
            labels_off,
            labels_buckets: n_buckets,
            keys: live,
            free_off,
            free_slots,
            // Put right for the node's current boot (a new region holds
            // no lock of a write a restart cut short).
            boot: self.mem.boot() & ((1 << 48) - 1),
            // A move carries the lease over (only its holder moves it).
            owner: self.leased.word.load(std::sync::atomic::Ordering::Acquire),
        };
        let mut writes = vec![(meta_off, meta_blob), (labels_off, map_bytes)];
        if let Some(w) = writers {
            writes.push((crate::layout::WRITERS_AT, w));
        }
        let mut t = Vec::with_capacity(k * ENTRY_BYTES as usize);
        for e in &table {
            t.extend_from_slice(&e.encode());
        }
        writes.push((table_off, t));
        for (e, b) in table.iter().zip(blobs) {
            writes.push((e.blob_off, b));
        }
        // The sections, then the header but its magic, then the magic, each
        // durable before the next: a region with the magic is whole (an
        // attach after a restart takes the newest such region).
        let mut head = header.encode();
        if let (Some(name), true) = (&self.params.lease, header.owner != 0) {
            let n = name.len().min(crate::layout::OWNER_NAME_MAX as usize);
            let at = crate::layout::OWNER_NAME_AT as usize;
            head[at] = n as u8;
            head[at + 1..at + 1 + n].copy_from_slice(&name.as_bytes()[..n]);
        }
        let written = crate::fetch::post_phases(
            &*self.mem,
            region,
            vec![
                (crate::sites::BUILD, writes),
                (crate::sites::BUILD, vec![(8, head[8..].to_vec())]),
                (crate::sites::BUILD_HEADER, vec![(0, head[..8].to_vec())]),
            ],
        );
        if let Err(e) = written {
            let _ = self.mem.drop_region(name);
            return Err(e);
        }
        Ok((region, header, table, buckets))
    }

    /// Moves the index into a new region laid out afresh (every
    /// partition's current graph as its blob, fresh gaps, a fresh label
    /// map of the live labels, no dead bytes), with partition `p`'s graph
    /// replaced by `new` when given; the old region is dropped. Run when a
    /// rebuilt partition does not fit or the label map is full: the region
    /// grows with the data and what rebuilds and deletes left dead comes
    /// back.
    ///
    /// The move is fenced: every partition is held first (those in
    /// `holding` the caller holds already), so no other compute node is
    /// inside one, and none starts a write there until the old region is
    /// gone (theirs then fail on it); each partition is read as it is, and
    /// only the nodes the label map names are carried over.
    pub(crate) fn relayout(
        &self,
        lay: &mut Layout,
        replace: Option<(u32, &GraphParts)>,
        holding: &[u32],
    ) -> Result<()> {
        let mine = self.hold_all(lay, holding)?;
        let subs = match self.fenced_parts(lay, replace) {
            Ok(s) => s,
            Err(e) => {
                self.release_all(lay, mine);
                return Err(e);
            }
        };
        let meta = lay.meta.to_parts();
        let epoch = lay.header.epoch + 1;
        let name = next_region_name(&lay.name, epoch);
        let written = self
            .writers_image(lay)
            .and_then(|w| self.write_layout(&name, &subs, &meta, epoch, Some(w)));
        let (region, header, table, buckets) = match written {
            Ok(w) => w,
            Err(e) => {
                self.release_all(lay, mine);
                return Err(e);
            }
        };
        let old = std::mem::replace(&mut lay.name, name);
        let _ = self.mem.drop_region(&old);
        self.stuck.lock().clear();
        lay.region = region;
        self.leased.on_region(region);
        lay.map = LabelMap {
            region,
            off: header.labels_off,
            buckets: header.labels_buckets,
        };
        lay.header = header;
        lay.table = table;
        // Every label's bucket is new (node ids are kept, except in `p`,
        // which the caller maps).
        {
            let mut map = self.labels.write();
            let mut keep = HashMap::with_capacity(map.len());
            for (l, loc) in map.drain() {
                if let Some(&b) = buckets.get(&l) {
                    keep.insert(
                        l,
                        Loc {
                            bucket: b,
                            version: 1,
                            ..loc
                        },
                    );
                }
            }
            *map = keep;
        }
        self.timing.relayouts.fetch_add(1, Ordering::Relaxed);
        self.timing.dead_bytes.store(0, Ordering::Relaxed);
        let mut lru = self.cache.lock();
        lru.clear();
        if let Some((p, g)) = replace {
            lru.put(p, Arc::new(SubGraph::from_parts(g)));
        }
        Ok(())
    }

    /// Holds every partition but those in `holding` (the caller's), each
    /// waited on a third of the take-over time at most; gives back what it
    /// took and fails when one stays held. Returns what it took.
    pub(crate) fn hold_all(&self, lay: &mut Layout, holding: &[u32]) -> Result<Vec<(u32, u64)>> {
        let patience = self.lease() / 3;
        let mut mine: Vec<(u32, u64)> = Vec::new();
        for q in 0..lay.table.len() as u32 {
            if holding.contains(&q) {
                continue;
            }
            let got = match self.acquire_within(lay, q, patience) {
                Ok(Some(h)) => Ok(h),
                Ok(None) => Err(Error::unavailable(
                    "d-hnsw: another compute node kept a partition held: the index could not move to a new region",
                )),
                Err(e) => Err(e),
            };
            match got {
                Ok(h) => mine.push((q, h)),
                Err(e) => {
                    self.release_all(lay, mine);
                    return Err(e);
                }
            }
        }
        Ok(mine)
    }

    /// Gives back partitions [`hold_all`](Self::hold_all) took (best
    /// effort: on a failure path).
    pub(crate) fn release_all(&self, lay: &mut Layout, mine: Vec<(u32, u64)>) {
        for (q, h) in mine {
            let _ = self.release(lay, q, h);
        }
    }

    /// Every partition's graph as the region holds it, with every held
    /// (partition `p`'s replaced by `new` when given), each live node the
    /// label map does not name marked deleted (it is not carried over).
    fn fenced_parts(
        &self,
        lay: &Layout,
        replace: Option<(u32, &GraphParts)>,
    ) -> Result<Vec<GraphParts>> {
        let mut subs = Vec::with_capacity(lay.table.len());
        for q in 0..lay.table.len() as u32 {
            if let Some((p, new)) = replace.filter(|r| r.0 == q) {
                let _ = p;
                subs.push(new.clone());
                continue;
            }
            let g = self.part_held(lay, q)?;
            let mut parts = g.to_parts();
            let live: Vec<u32> = (0..g.len() as u32).filter(|&n| !g.is_deleted(n)).collect();
            let labels: Vec<u64> = live.iter().map(|&n| g.labels[n as usize]).collect();
            for ((&n, _), f) in live
                .iter()
                .zip(&labels)
                .zip(lay.map.get_many(&*self.mem, &labels)?)
            {
                let named =
                    f.is_some_and(|f| f.value.present && (f.value.part, f.value.slot) == (q, n));
                if !named {
                    parts.flags[n as usize] |= crate::layout::DELETED;
                }
            }
            subs.push(parts);
        }
        Ok(subs)
    }

    /// Rebuilds partition `p`, held at odd state `held`, from its live
    /// nodes that the label map still names there (a node another writer
    /// replaced or deleted meanwhile is left behind) and `extra` new rows,
    /// into an area taken from the region's end by FETCH_ADD, with a gap of
    /// its own (its old bytes are dead); publishes it (the state even) and
    /// points the kept labels at their new nodes by CAS (a label changed in
    /// between has its new node tombstoned). Returns the new graph and the
    /// new rows as (label, partition, node) for the caller to map.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn rebuild_part(
        &self,
        lay: &mut Layout,
        p: u32,
        old: &SubGraph,
        extra: (&[u64], &[f32]),
        seq: u64,
        held: u64,
    ) -> Result<Rebuilt> {
        // A label among the new rows (an upsert) is not carried over: its
        // new row replaces it.
        let fresh: HashSet<u64> = extra.0.iter().copied().collect();
        let live: Vec<u32> = (0..old.len() as u32)
            .filter(|&n| !old.is_deleted(n) && !fresh.contains(&old.labels[n as usize]))
            .collect();
        let live_labels: Vec<u64> = live.iter().map(|&n| old.labels[n as usize]).collect();
        let found = lay.map.get_many(&*self.mem, &live_labels)?;
        let mut kept: HashMap<u64, crate::labelmap::Found> = HashMap::new();
        let (mut labels, mut vectors) = (Vec::new(), Vec::new());
        for ((&n, &l), f) in live.iter().zip(&live_labels).zip(found) {
            if let Some(f) = f.filter(|f| f.value.present && (f.value.part, f.value.slot) == (p, n))
            {
                kept.insert(l, f);
                labels.push(l);
                vectors.extend_from_slice(vectide_graph::Graph::vector(old, n));
            }
        }
        labels.extend_from_slice(extra.0);
        vectors.extend_from_slice(extra.1);
        let parts = self.build_graph(&labels, &vectors, self.params.seed ^ u64::from(p) ^ seq)?;
        let blob = encode_blob(&parts, p);
        let rec = lay.record();
        let gap = self.gap_records(labels.len()) * rec;
        let size = (blob.len() as u64 + gap).next_multiple_of(8);
        // A free area first (what earlier rebuilds left), else the region's
        // untouched end.
        let off = match self.take_free(lay, size)? {
            Some(off) => {
                self.timing.reused_bytes.fetch_add(size, Ordering::Relaxed);
                off
            }
            None => {
                // Durable before the area is written: a restart never
                // hands the same bytes out again.
                let c = self.mem.post(&[
                    vectide_remote::Verb::FetchAdd {
                        region: lay.region.id,
                        offset: ALLOC_END_AT,
                        add: size,
                    },
                    vectide_remote::Verb::Flush {
                        region: lay.region.id,
                        offset: ALLOC_END_AT,
                        len: 8,
                        site: crate::sites::ALLOC,
                    },
                ])?;
                let mut c = c.into_iter();
                let off = c.next().expect("two completions").into_word()?;
                c.next().expect("two completions").into_done()?;
                off
            }
        };
        self.timing.rebuilt_bytes.fetch_add(size, Ordering::Relaxed);
        let end = off + size;
        if end > lay.header.region_size {
            let holding: Vec<u32> = std::iter::once(p).chain(lay.partner(p)).collect();
            self.relayout(lay, Some((p, &parts)), &holding)?;
            self.timing.rebuilds.fetch_add(1, Ordering::Relaxed);
            let rows = self.renumber_local(p, &parts, &kept);
            return Ok((
                Arc::new(SubGraph::from_parts(&parts)),
                rows,
                Vec::new(),
                None,
            ));
        }
        let old_e = lay.table[p as usize];
        // What the partition leaves once published: its blob, and its gap
        // too when no partner shares it any more (a shared gap stays with
        // the partner, who may grow over this side of it).
        let left = if lay.partner(p).is_some() {
            (old_e.blob_off, old_e.blob_len)
        } else {
            let (lo, hi) = old_e.range(rec).unwrap_or((old_e.blob_off, old_e.blob_off));
            let (lo, hi) = (lo.min(old_e.gap_lo), hi.max(old_e.gap_hi));
            (lo, hi - lo)
        };
        let e = Entry {
            blob_off: off,
            blob_len: blob.len() as u64,
            n_base: labels.len() as u32,
            backward: false,
            count: 0,
            epoch: old_e.epoch + 1,
            gap_lo: off + blob.len() as u64,
            gap_hi: end,
            records_at: blob_records_at(&blob),
            state: held + 1,
            intent: false,
        };
        // Under the odd state: the blob, then the entry's intent, then its
        // fields, then the intent cleared, each phase durable before the
        // next on a backing file (64 bytes of fields may tear; while the
        // intent holds, it is the entry); the caller publishes (the state
        // even) once the label map names every node of the new blob.
        let at = lay.entry_at(p);
        let writing = Entry { state: held, ..e };
        crate::fetch::post_phases(
            &*self.mem,
            lay.region,
            vec![
                (crate::sites::REBUILD, vec![(off, blob)]),
                (
                    crate::sites::REBUILD_INTENT,
                    vec![(at + crate::layout::ENTRY_INTENT_AT, writing.intent_bytes())],
                ),
            ],
        )?;
        self.fold_intent(lay, p, &writing)?;
        let epoch = self.mem.fetch_add(lay.region, EPOCH_AT, 1)? + 1;
        self.timing.rebuilds.fetch_add(1, Ordering::Relaxed);
        lay.table[p as usize] = writing;
        lay.header.alloc_end = lay.header.alloc_end.max(end);
        lay.header.epoch = epoch;
        // The kept labels to their new nodes.
        let mut swaps = Vec::new();
        let mut rows = Vec::new();
        for (node, &l) in parts.labels.iter().enumerate() {
            match kept.get(&l) {
                Some(f) => swaps.push((l, node as u32, f.bucket, f.value)),
                None => rows.push((l, p, node as u32)),
            }
        }
        let cas: Vec<_> = swaps
            .iter()
            .map(|&(_, node, b, v)| (b, v, v.at(p, node)))
            .collect();
        let seen = lay.map.swap_many(&*self.mem, &cas)?;
        let mut stale = Vec::new();
        {
            let mut map = self.labels.write();
            for (&(l, node, b, v), got) in swaps.iter().zip(seen) {
                if got == v {
                    let seq = map.get(&l).map_or(0, |o| o.seq);
                    map.insert(l, Loc::at(p, node, seq, b, v.at(p, node).version));
                } else {
                    stale.push((p, node, l, b));
                }
            }
        }
        let g = Arc::new(SubGraph::from_parts(&parts));
        g.set_version(held + 1);
        Ok((g, rows, stale, Some(left)))
    }

    /// Creates region `name`; one of that name without a header's magic is
    /// what a move into it left when its compute node or the memory node
    /// stopped before the header was durable (a move holds every partition
    /// of the region it leaves, so no other is writing it): dropped first.
    fn new_region(&self, name: &str, size: u64) -> Result<vectide_remote::Region> {
        match self.mem.create_region(name, size) {
            Ok(r) => Ok(r),
            Err(e) => {
                let (regions, _) = self.mem.regions()?;
                if !regions.iter().any(|r| r.name == name) {
                    return Err(e);
                }
                let old = self.mem.open_region(name)?;
                let magic = self.mem.read(old, 0, 8.min(old.size as u32))?;
                if magic == crate::layout::MAGIC {
                    return Err(e);
                }
                self.mem.drop_region(name)?;
                self.mem.create_region(name, size)
            }
        }
    }

    /// Writes `e` (partition `p`'s entry, held) into the entry's fields,
    /// durable, then clears its intent: what a rebuild does once its intent
    /// is durable, and what a writer that takes a partition over does with
    /// an intent its stopped writer left. The clear needs no FLUSH of its
    /// own: while the intent stands it says what the fields say, and the
    /// first change of the fields after (an insert's count) clears it again
    /// in the same FLUSHed phase.
    pub(crate) fn fold_intent(&self, lay: &Layout, p: u32, e: &Entry) -> Result<()> {
        let at = lay.entry_at(p);
        crate::fetch::post_phases(
            &*self.mem,
            lay.region,
            vec![(crate::sites::REBUILD_ENTRY, vec![(at, e.field_bytes())])],
        )?;
        crate::fetch::post_unflushed(
            &*self.mem,
            lay.region,
            vec![(at + Entry::INTENT_CHECK_AT, vec![0u8; 8])],
        )
    }

    /// After a relayout put partition `p`'s rebuilt graph in a fresh map:
    /// this node's copy of the kept labels' places; returns the other
    /// labels (new rows) for the caller to map.
    fn renumber_local(
        &self,
        p: u32,
        parts: &GraphParts,
        kept: &HashMap<u64, crate::labelmap::Found>,
    ) -> Placed {
        let mut map = self.labels.write();
        let mut rows = Vec::new();
        for (node, &l) in parts.labels.iter().enumerate() {
            match (kept.contains_key(&l), map.get_mut(&l)) {
                (true, Some(loc)) => loc.node = node as u32,
                _ => rows.push((l, p, node as u32)),
            }
        }
        rows
    }
}

/// Where a blob's node records start (its header says).
fn blob_records_at(blob: &[u8]) -> u64 {
    let word = |i: usize| u32::from_le_bytes(blob[i..i + 4].try_into().expect("4 bytes"));
    // up_nodes and up_words are the header's 7th and 8th words.
    let (up_nodes, up_words) = (word(8 + 24) as usize, word(8 + 28) as usize);
    (crate::layout::BLOB_HEADER + 12 * up_nodes + 4 * up_words).next_multiple_of(8) as u64
}

/// A region name no other index on the node uses.
/// The name of the region an index moves into at `epoch`: its first
/// region's name, `~`, the epoch.
fn next_region_name(name: &str, epoch: u64) -> String {
    let base = name.split('~').next().unwrap_or(name);
    format!("{base}~{epoch}")
}

pub(crate) fn auto_name() -> String {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    format!(
        "dhnsw-{}-{t:x}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}
