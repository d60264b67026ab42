//! StreamingMerge (FreshDiskANN §5.3–5.4): folds a change set (deleted
//! nodes of the LTI and new points from the temp indexes) into a new LTI
//! with RAM that grows with the change set, not with the index.
//!
//! 1. **Delete phase.** The lists of the deleted nodes are read (one batch
//!    per 64). Then the LTI is read a run of sectors at a time, in order
//!    (a thread reads ahead: [`Lti::scan_runs`]); a node that
//!    points at deleted nodes gets Algorithm 4's candidate set (its live
//!    neighbours and the live neighbours of its deleted ones); when it
//!    exceeds the room, the live neighbours stay and the others fill the
//!    room up to `r` under the α-rule (below), with PQ reconstructions of
//!    the candidates standing in for their vectors (only the node's own
//!    vector came with its block). Deleted nodes become free records. A
//!    run's lists are computed in parallel, then its records encoded in
//!    parallel ([`NodeWriter::push_records`]) and written, in order, to an
//!    **intermediate LTI** of the same numbering.
//! 2. **Insert phase**, at the same time as the Delete phase (which is
//!    CPU-bound while this one mostly waits on reads), in a pool of
//!    `io_threads`. The Delete phase runs in another pool at a lower
//!    priority (nice +10): its prunes take the cores while the searches
//!    wait on their reads, and give them back as each read completes (the
//!    searches are the merge's critical path). Each new point runs GreedySearch over the **old** LTI
//!    read from disk (the beam search, W reads per hop), where deleted
//!    nodes still route but never become candidates; its candidates are
//!    the live nodes expanded (their exact vectors came with their
//!    sectors) and the new points it links to in its temp index;
//!    RobustPrune gives its list. Each thread runs `in_flight` searches in
//!    lock-step ([`Lti::search_expanded_lockstep`]): one batch of reads
//!    per round for all of them, a record wanted by several read once.
//!    Searches run in `sector_order` over the
//!    temp-index links, so a thread's consecutive searches end in the same
//!    region, and each thread keeps the records it read recently (one 4
//!    KiB sector per new point it handles, at most 256). All threads share
//!    the records nearest the start node, read breadth-first before the
//!    searches (2 KiB per new point, at most 64 MiB: RAM that follows the
//!    change set), which every search's first hops pass. New points then
//!    take the free slots (lowest first), then slots past the end, in the
//!    same order (new neighbours share sectors). The back-edges go to an
//!    in-memory Δ (slot → new in-neighbours).
//! 3. **Patch phase.** The intermediate LTI is read block by block; each
//!    node gets its Δ, a list over its room (`max_degree`) is pruned to `r`
//!    (PQ reconstructions for old nodes, exact vectors for new ones); new
//!    points are written in their slots. Runs go as in the Delete phase
//!    (lists, then records, in parallel) to the **new LTI**,
//!    then its PQ file is written (old codes, new points' codes in their
//!    slots) without copying the code array.
//! 4. **Orphans.** Pruning in either phase can drop a node's last in-edge,
//!    leaving it unreachable from the start node. While the Patch phase
//!    writes, two bits per node record whether it has one in-edge and
//!    whether it has two; each live node left with none gets one from its
//!    nearest out-neighbour that has room, else in place of an entry of
//!    that neighbour whose target has another in-edge (the record is
//!    rewritten in the new LTI before the switch). This counts in-edges,
//!    not paths from the start: a group of nodes that only point at each
//!    other is not found, and giving up an entry could in rare cases cut
//!    such a group off. The engine's `check_structure` checks reachability
//!    (the crash kit runs it every round; none in 10,000 states).
//!
//! The caller switches to the new LTI (manifest + rename) and applies the
//! [`MergeOutcome`]'s codes to the codes array in place.
//!
//! ## RAM
//! A merge holds three named caches and buffers, each bounded by a
//! constant and reported in [`MergeStats`]: the records nearest the start
//! node (2 KiB per new point, at most [`NEAR_START_MAX`]), each Insert
//! thread's recent records (at most [`RECENT`] sectors), and the scans'
//! read-ahead and the writers' runs ([`IO_BUFFER_BYTES`]). The rest
//! follows the change set: the deleted nodes' first `merge_refill`
//! neighbours, the new points' lists, and the Δ as (node, new point)
//! pairs sorted by node (8 bytes an edge; a map of lists took about 25),
//! plus a fixed working set (one run's lists, each thread's search and
//! prune scratch). `tests/merge_ram_bound.rs` measures it with a counting
//! allocator: beyond the caches it grew by 1.2x (Delete and Insert
//! phases) and 2.0x (Patch phase) the change set's vector bytes (deleted
//! and new points) from 1 % to 10 % of a 50-d index changed (1.5x and
//! 2.8x with the map of lists and whole deleted lists), and grows by 0.3x
//! and 1.1x from 5 % to 15 % (the sizes the test uses since a loaded
//! machine let the 1 % merge's phases miss each other); the 5-11x that
//! `bench freshdiskann` used to report was the near-start cache (10x the
//! vector bytes of 50-d new points) and the 4 MiB of I/O buffers.
//!
//! ## Where we deviate from the paper
//! - **Links among new points.** The paper's Insert phase searches only the
//!   intermediate LTI, so new points never link each other except through
//!   Δ; a batch of points from one new region (the clustered runbook) would
//!   hang off the old graph. Each new point's candidates also hold its
//!   neighbours in the temp index that are merged with it.
//! - **Candidate sets within the room are kept whole** (no pruning below
//!   `max_degree`), as DiskANN's consolidation code does.
//! - **A repaired list keeps its live neighbours.** Algorithm 4 runs
//!   RobustPrune over the whole candidate set; at 5 % deletes nearly every
//!   node loses a neighbour or two and prunes about 250 candidates, which
//!   made the Delete phase the merge's cost. The live neighbours passed the
//!   α-rule when they were chosen, so they stay, and only the deleted
//!   neighbours' neighbours compete for the room left, each checked against
//!   the list (the in-memory engines' `repair_list` does the same).
//! - **Shorter candidate lists than a rebuild's** (`merge_refill`,
//!   `merge_l`): a repaired node takes replacements from the first 16
//!   entries of each deleted neighbour's list, not the whole list (fewer,
//!   at least 8, when its whole candidate set then fits its room, below),
//!   and the
//!   Insert phase searches with L 40, not the build's 75. Measured with
//!   `examples/merge_loop.rs` on GloVe 100K, 5 % changed, 2 cores
//!   (AVX2), recall@10 of the merged LTI at L 10 / 16 / 24 (W 4): whole
//!   lists and L 75 0.8211 / 0.9084 / 0.9486 in 7.2 s; 16 and L 50 0.8172
//!   / 0.9063 / 0.9472 in 4.6 s (0.64×); 16 and L 40 0.8162 / 0.9051 /
//!   0.9465 in 3.8-4.3 s; an LTI rebuilt from scratch on the same points
//!   0.8190 / 0.9048 / 0.9475. The merge's own lists are a little richer
//!   than a rebuild's, and the shortcuts spend that margin and about 0.3
//!   point more at L 10. On GloVe 390K, L 40 against L 50 cost at most
//!   0.2 point at L 10-40 and read 14 % fewer sectors.
//! - **A node that lost few neighbours skips the α-rule pass**: when a
//!   shorter share of each deleted neighbour's list (at least half of
//!   `merge_refill`) lets the whole candidate set fit `max_degree`, it
//!   takes that share and keeps every candidate. Refill 8 for every node
//!   halved the Delete phase's CPU on GloVe 390K at 5 % random deletes
//!   (1.8 against 3.8-4.1 s alone) for at most 0.18 point of recall@10 at
//!   L 10-40, but the clustered runbook, which deletes whole regions,
//!   averaged 0.966 with it (one run, other jobs on the machine) against
//!   0.975-0.981 in earlier sessions. Not knowing which of the two it was,
//!   nodes that lose many neighbours keep the wide set. The fitting share only
//!   changes nodes that lost two or three (about 3.6 s of CPU alone,
//!   recall@10 0.7819 / 0.8200 / 0.8694 / 0.9179 / 0.9569 at L 10 / 12 /
//!   16 / 24 / 40, as refill 16 for every node).
//! - **The Insert phase searches the old LTI, not the intermediate one**,
//!   so that it can run beside the Delete phase (on GloVe 100K, 5 %
//!   changed, 2 cores: merge 5.1-5.3 s one after the other, 3.6-3.8 s
//!   together, recall@10 after the merge 0.990 both ways). Deleted nodes
//!   are then stepping stones of the search as in a FreshVamana search,
//!   and are filtered out of the candidates.
//! - **New LTI files, not in-place patches.** Both phases write new files,
//!   so the old LTI stays intact until the switch: a crash or a failed
//!   write during a merge leaves it in force.

use crate::layout::{encode_node_into, Header, Node, PqFile, Vector, NO_LABEL};
use crate::lti::{edit_record, Lockstep, Lti, NodeWriter, QueryStats, Scratch};
use rayon::prelude::*;
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Instant;
use vectide_core::heap::Candidate;
use vectide_core::metric::DistanceFn;
use vectide_core::{Error, Result};
use vectide_graph::prune::{prune_points, Rows};
use vectide_storage::block::BlockFile;

/// Knobs of a merge: the graph's `r` and `α`, the Insert phase's search
/// list `l` and beam width `w`, and the threads its searches run on.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MergeParams {
    pub r: usize,
    pub l: usize,
    pub alpha: f32,
    pub w: usize,
    /// Threads of the Insert phase's own pool (0: as many as the caller's
    /// pool). Its searches wait on disk reads much of the time, so a
    /// thread more than the cores keeps them busy (the engine's choice).
    pub io_threads: usize,
    /// The Delete phase takes replacement candidates from the first
    /// `refill` entries of each deleted neighbour's list (0: all, as
    /// Algorithm 4).
    pub refill: usize,
    /// Searches each Insert-phase thread runs at once, in lock-step
    /// ([`Lti::search_expanded_lockstep`]; 0 counts as 1).
    pub in_flight: usize,
}

/// The new points of a merge: labels, vectors (`len × dim`, normalised
/// under cosine) and, per point, the indices of the other new points it
/// links to in its temp index.
#[derive(Debug, Clone, Copy)]
pub struct Inserts<'a> {
    pub labels: &'a [u64],
    pub vectors: &'a [f32],
    pub links: &'a [Vec<u32>],
}

impl Inserts<'_> {
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }
}

/// The phases, for progress reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Delete,
    Insert,
    Patch,
}

impl Phase {
    /// 1, 2, 3 in the order the phases start (the Delete and Insert
    /// phases start together; the Insert phase reports after the Delete).
    pub fn ordinal(self) -> usize {
        match self {
            Phase::Delete => 1,
            Phase::Insert => 2,
            Phase::Patch => 3,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Phase::Delete => "delete",
            Phase::Insert => "insert",
            Phase::Patch => "patch",
        }
    }
}

/// Progress callback: phase, units done, units in the phase.
pub type MergeProgress<'a> = &'a (dyn Fn(Phase, u64, u64) + Sync);

/// What a merge did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MergeStats {
    /// The Delete and Insert phases run at once: each one's own wall time.
    pub delete_secs: f64,
    pub insert_secs: f64,
    pub patch_secs: f64,
    /// Nodes whose lists the Delete phase rebuilt.
    pub repaired: u64,
    /// Nodes whose lists the Patch phase changed (old and new).
    pub patched: u64,
    /// Sectors read from disk (the scans and the Insert phase's searches).
    pub sectors_read: u64,
    /// Sectors written (intermediate and new LTI).
    pub sectors_written: u64,
    /// Insert-phase reads served by a thread's recent records.
    pub insert_cache_hits: u64,
    /// The Insert phase's searches, summed (reads, hops, expansions,
    /// PQ and exact distances).
    pub insert_searches: QueryStats,
    /// Live nodes left without an in-edge by the prunes that got one back.
    pub orphans_linked: u64,
    /// Such nodes no neighbour could take (none had room or a spare edge).
    pub orphans_left: u64,
    /// The merge's named caches and buffers, whose bounds do not follow
    /// the change set (the rest of its RAM does; `tests/merge_ram.rs`):
    /// the Insert phase's shared records nearest the start node (at most
    /// [`NEAR_START_MAX`]), its threads' recent records (at most
    /// [`RECENT`] sectors each), and the scans' read-ahead and the writers'
    /// runs ([`IO_BUFFER_BYTES`]).
    pub near_start_bytes: u64,
    pub recent_bytes: u64,
    pub io_buffer_bytes: u64,
}

impl MergeStats {
    /// Bytes of the named caches and buffers (see the fields).
    pub fn cache_bytes(&self) -> u64 {
        self.near_start_bytes + self.recent_bytes + self.io_buffer_bytes
    }
}

/// A phase's I/O buffers: a scan's read-ahead runs and the one in use
/// (`SCAN_AHEAD` plus one buffers of `RUN` sectors) and the writer's run
/// beside them (the Delete phase's scan and writer are gone before the
/// Patch phase's start).
pub const IO_BUFFER_BYTES: u64 =
    ((crate::lti::SCAN_AHEAD + 2) * crate::lti::RUN * vectide_storage::block::BLOCK) as u64;

/// A merge's result: the new LTI's header, the slot of each new point and
/// its PQ code (to apply to the codes array at the switch), the free slots
/// left, and the stats.
#[derive(Debug, Clone)]
pub struct MergeOutcome {
    pub header: Header,
    pub slots: Vec<u32>,
    /// `inserts × pq_bytes`: new point `j`'s code goes to `slots[j]`.
    pub codes: Vec<u8>,
    pub free: Vec<u32>,
    pub stats: MergeStats,
}

impl MergeOutcome {
    /// The new LTI's codes array from the old one, in place: grown to the
    /// new node count, new points' codes written in their slots.
    pub fn apply_codes(&self, codes: &mut Vec<u8>) {
        let m = self.header.pq_bytes as usize;
        codes.resize(self.header.nodes as usize * m, 0);
        for (j, &s) in self.slots.iter().enumerate() {
            codes[s as usize * m..(s as usize + 1) * m]
                .copy_from_slice(&self.codes[j * m..(j + 1) * m]);
        }
    }
}

/// Records each Insert-phase thread keeps from its recent searches: one
/// per new point the thread searches for, at most this many (4 KiB
/// sectors: 1 MiB a thread), so that the cache follows the change set.
/// On GloVe 100K (5 % changed, 8 threads) it serves 15 % of the reads and
/// the merge takes 3.6-3.8 s against 4.2-4.4 s without it.
pub const RECENT: usize = 256;

/// The Insert phase's shared cache of the records nearest the start node
/// (the first hops of every search): bytes per new point, and at most.
/// On GloVe 100K (5 % changed, the `merge_loop` example) 8 MiB of it cut
/// the Insert phase's reads from 320K to 233K; 1 MiB more per thread of
/// recent records (`RECENT` × 4) would have saved 12K more. On GloVe
/// 390K (19.5K new points: 39 MB at 2 KiB each) the cap of 64 MiB instead
/// of 8 cut the reads from 869K to 683K and the merge from 20.2 to 18.4 s
/// (the budget per new point keeps it following the change set).
const NEAR_START_PER_INSERT: usize = 2048;
pub const NEAR_START_MAX: usize = 64 << 20;

/// Nice levels the Delete phase's threads drop by (module docs).
const DELETE_NICE: i32 = 10;

/// What a phase writes for a record of the file it scans.
enum Rewrite {
    /// The record as it is (copied).
    Keep,
    /// A free record.
    Free,
    /// The node with this list.
    List(Vec<u32>),
    /// New point `j` in this slot, with this list (`None`: its list from
    /// the Insert phase).
    New(usize, Option<Vec<u32>>),
}

/// Per-thread buffers of a run's rewrites.
struct RunScratch {
    ps: PruneScratch,
    joined: Vec<u8>,
    vector: Vec<f32>,
}

/// What a phase writes for each of a run's `n` records, computed in
/// parallel: `f(scratch, k)` for the `k`-th.
fn rewrites(
    n: usize,
    dim: usize,
    f: impl Fn(&mut RunScratch, usize) -> Result<Rewrite> + Sync + Send,
) -> Result<Vec<Rewrite>> {
    (0..n)
        .into_par_iter()
        .map_init(
            || RunScratch {
                ps: PruneScratch::default(),
                joined: Vec::new(),
                vector: vec![0.0; dim],
            },
            f,
        )
        .collect()
}

/// The new points a Patch phase writes: labels, vectors and the lists the
/// Insert phase gave them.
struct NewPoints<'a> {
    labels: &'a [u64],
    vectors: &'a [f32],
    lists: &'a [Vec<u32>],
}

/// Encodes `what` into `slot`; `record` is the scanned record (empty past
/// the scanned file's end, where only new points go).
fn rewrite_into(
    slot: &mut [u8],
    h: &Header,
    what: &Rewrite,
    record: &[u8],
    new: Option<&NewPoints<'_>>,
) -> Result<()> {
    match what {
        Rewrite::Keep if record.len() == slot.len() => {
            slot.copy_from_slice(record);
            Ok(())
        }
        Rewrite::Keep => Err(Error::invalid("merge: a kept record is missing")),
        Rewrite::Free => encode_node_into(slot, h, Vector::Zero, NO_LABEL, &[]),
        Rewrite::List(l) => {
            let node = Node::parse(record, h)?;
            encode_node_into(slot, h, Vector::Bytes(node.vector), node.label, l)
        }
        Rewrite::New(j, l) => {
            let new = new.ok_or_else(|| Error::invalid("merge: a new point without its data"))?;
            let dim = h.dim as usize;
            encode_node_into(
                slot,
                h,
                Vector::Floats(&new.vectors[j * dim..(j + 1) * dim]),
                new.labels[*j],
                l.as_deref().unwrap_or(&new.lists[*j]),
            )
        }
    }
}

/// Runs StreamingMerge (module docs): `old` minus `dead` (node numbers of
/// the LTI; the start node may not be one) plus `inserts`, through the
/// empty block files `intermediate` and `out` (the new LTI) and the new PQ
/// file `pq_path`. Runs on the caller's rayon pool. The inserts' labels
/// must not be live in `old` (the caller deletes a replaced node).
#[allow(clippy::too_many_arguments)]
pub fn streaming_merge(
    old: &Lti,
    dead: &[u32],
    inserts: Inserts<'_>,
    p: &MergeParams,
    intermediate: Box<dyn BlockFile>,
    out: &dyn BlockFile,
    pq_path: &Path,
    durable_seq: u64,
    progress: Option<MergeProgress<'_>>,
) -> Result<MergeOutcome> {
    let m = Merge::new(old, dead, inserts, p, progress)?;
    let mut stats = MergeStats::default();
    let (free, lists) = m.delete_and_insert(&*intermediate, &mut stats)?;
    let placed = m.place(free, lists, &mut stats)?;
    let t = Instant::now();
    let (header, mut in_edges) = m.patch(intermediate, out, &placed, durable_seq, &mut stats)?;
    let vector_of = |c: u32, v: &mut [f32]| match placed.new_of(&m, c) {
        Some(x) => {
            v.copy_from_slice(x);
            Ok(())
        }
        None => old.pq().decode(old.code(c), v),
    };
    let (linked, left) = link_orphans(out, &header, &mut in_edges, m.dist, vector_of)?;
    if linked > 0 {
        out.sync()?;
    }
    stats.orphans_linked = linked;
    stats.orphans_left = left;
    let pq = old.pq();
    let pm = pq.m();
    let old_codes = old.codes();
    PqFile::write_with(pq_path, pq, header.nodes, |i| {
        match placed.slot_of.get(&(i as u32)) {
            Some(&j) => &placed.codes[j as usize * pm..(j as usize + 1) * pm],
            None => &old_codes[i * pm..(i + 1) * pm],
        }
    })?;
    stats.patch_secs = t.elapsed().as_secs_f64();
    Ok(MergeOutcome {
        header,
        slots: placed.slots,
        codes: placed.codes,
        free: placed.left_free,
        stats,
    })
}

/// What every phase of one merge reads: the old LTI and its shape, the
/// change set, the knobs, and the flags the two concurrent phases share.
struct Merge<'a> {
    old: &'a Lti,
    h: Header,
    dim: usize,
    dead: &'a [u32],
    /// One bit per old node (the scans ask for each neighbour of each node).
    dead_bits: Vec<u64>,
    inserts: Inserts<'a>,
    p: &'a MergeParams,
    dist: DistanceFn,
    /// New points in sector order over their temp-index links: the order
    /// of their searches and of their slots.
    order: Vec<u32>,
    progress: Option<MergeProgress<'a>>,
    /// Set when a phase failed: the other one stops.
    failed: AtomicBool,
    /// The Delete phase runs (the Insert phase reports progress after it).
    deleting: AtomicBool,
}

/// Where the new points go (module docs, Patch phase): their slots, their
/// PQ codes, their lists, and the Δ each old node receives.
struct Placement {
    /// Node number of each new point.
    slots: Vec<u32>,
    /// Node number → index of the new point there.
    slot_of: HashMap<u32, u32>,
    /// Free records no new point took.
    left_free: Vec<u32>,
    n_new: u64,
    codes: Vec<u8>,
    new_lists: Vec<Vec<u32>>,
    /// Node → new points that link to it.
    delta: Delta,
}

/// The Δ: (node, new point's slot) pairs sorted by node, 8 bytes an edge
/// (a map of lists cost about 25 an edge: a list header, an allocation
/// and a map entry for each node that a few new points link to, which
/// made it the Patch phase's largest buffer).
struct Delta(Vec<(u32, u32)>);

impl Delta {
    fn new(mut edges: Vec<(u32, u32)>) -> Delta {
        edges.sort_unstable();
        edges.dedup();
        Delta(edges)
    }

    /// The new points linking to node `i` (empty when none).
    fn get(&self, i: u32) -> &[(u32, u32)] {
        let at = self.0.partition_point(|&(t, _)| t < i);
        let end = at + self.0[at..].partition_point(|&(t, _)| t == i);
        &self.0[at..end]
    }
}

impl Placement {
    /// The vector of the new point at node `c`, if one is there.
    fn new_of<'m>(&self, m: &Merge<'m>, c: u32) -> Option<&'m [f32]> {
        self.slot_of.get(&c).map(|&j| m.new_vec(j as usize))
    }
}

impl<'a> Merge<'a> {
    fn new(
        old: &'a Lti,
        dead: &'a [u32],
        inserts: Inserts<'a>,
        p: &'a MergeParams,
        progress: Option<MergeProgress<'a>>,
    ) -> Result<Self> {
        let h = *old.header();
        let dim = h.dim as usize;
        let n_old = h.nodes;
        if inserts.vectors.len() != inserts.len() * dim || inserts.links.len() != inserts.len() {
            return Err(Error::invalid(
                "merge: insert labels, vectors and links disagree",
            ));
        }
        if inserts
            .links
            .iter()
            .any(|l| l.iter().any(|&k| k as usize >= inserts.len()))
        {
            return Err(Error::invalid("merge: a link names a point not merged"));
        }
        if dead
            .iter()
            .any(|&d| d as u64 >= n_old || d as u64 == h.start)
        {
            return Err(Error::invalid(
                "merge: a deleted node is past the LTI or is its start node",
            ));
        }
        if n_old + inserts.len() as u64 > u32::MAX as u64 {
            return Err(Error::invalid("merge: more than 2^32 - 1 nodes"));
        }
        let mut dead_bits = vec![0u64; (n_old as usize).div_ceil(64)];
        for &d in dead {
            set_bit(&mut dead_bits, d, true);
        }
        Ok(Merge {
            old,
            h,
            dim,
            dead,
            dead_bits,
            inserts,
            p,
            dist: h.metric.distance_fn(),
            order: crate::lti::sector_order(inserts.links, 0, h.nodes_per_sector()),
            progress,
            failed: AtomicBool::new(false),
            deleting: AtomicBool::new(true),
        })
    }

    fn is_dead(&self, n: u32) -> bool {
        bit(&self.dead_bits, n)
    }

    fn new_vec(&self, j: usize) -> &'a [f32] {
        let v: &'a [f32] = self.inserts.vectors;
        &v[j * self.dim..(j + 1) * self.dim]
    }

    fn report(&self, ph: Phase, done: u64, total: u64) {
        if let Some(f) = self.progress {
            f(ph, done, total)
        }
    }

    /// The Delete phase (CPU: prunes) and the Insert phase (mostly waiting
    /// on reads) at once, each in a pool of its own (the process's, shared with concurrent merges: `vectide_core::pools`); the Insert phase
    /// searches the old LTI, where deleted nodes still route but are never
    /// candidates. Returns the free records and each new point's list.
    fn delete_and_insert(
        &self,
        intermediate: &dyn BlockFile,
        stats: &mut MergeStats,
    ) -> Result<(Vec<u32>, Vec<NewList>)> {
        let io_threads = if self.p.io_threads > 0 {
            self.p.io_threads
        } else {
            rayon::current_num_threads()
        };
        let pool = vectide_core::engine::pool_of("merge-io", io_threads)?;
        // The Delete phase's own threads, at a lower priority: its prunes
        // keep the cores busy while the Insert phase's searches wait on
        // their reads, and yield them as each read completes (module docs).
        // Both pools are the process's (shared by concurrent merges of
        // other indexes).
        let delete_pool = vectide_core::pools::shared_low_priority(
            "merge-del",
            rayon::current_num_threads(),
            DELETE_NICE,
        )?;
        // The phase that fails first stops the other; its error is the one
        // returned (the other's only says it stopped).
        let first_failure = AtomicU8::new(0);
        let fail = |phase: u8| {
            let _ = first_failure.compare_exchange(0, phase, Ordering::AcqRel, Ordering::Acquire);
            self.failed.store(true, Ordering::Relaxed);
        };
        let (deleted, inserted) = std::thread::scope(|s| {
            let ins = s.spawn(|| {
                let t = Instant::now();
                let r = pool.install(|| self.insert_phase(io_threads));
                if r.is_err() {
                    fail(2);
                }
                (r, t.elapsed().as_secs_f64())
            });
            let del = delete_pool.install(|| self.delete_phase(intermediate));
            if del.is_err() {
                fail(1);
            }
            self.deleting.store(false, Ordering::Relaxed);
            let ins = ins.join();
            (del, ins)
        });
        let (inserted, insert_secs) =
            inserted.map_err(|_| Error::invalid("merge: the Insert phase panicked"))?;
        let (free, dstats, lists) = match (deleted, inserted) {
            (Ok((free, dstats)), Ok((lists, near, recent))) => {
                stats.near_start_bytes = near;
                stats.recent_bytes = recent;
                stats.io_buffer_bytes = IO_BUFFER_BYTES;
                (free, dstats, lists)
            }
            (Err(e), Ok(_)) | (Ok(_), Err(e)) => return Err(e),
            (Err(d), Err(i)) => {
                return Err(if first_failure.load(Ordering::Acquire) == 2 {
                    i
                } else {
                    d
                })
            }
        };
        let total = self.inserts.len() as u64;
        self.report(Phase::Insert, total, total);
        stats.sectors_read += dstats.sectors_read;
        stats.sectors_written += dstats.sectors_written;
        stats.repaired = dstats.repaired;
        stats.delete_secs = dstats.delete_secs;
        stats.insert_secs = insert_secs;
        Ok((free, lists))
    }

    /// Delete phase: every live node that lost a neighbour gets its list
    /// repaired, a run of the old LTI at a time (the repairs in parallel,
    /// then the run's records encoded in parallel into the intermediate
    /// LTI). Returns the free records (deleted nodes, free slots).
    fn delete_phase(&self, intermediate: &dyn BlockFile) -> Result<(Vec<u32>, MergeStats)> {
        let (h, dim, p, old) = (self.h, self.dim, self.p, self.old);
        let n_old = h.nodes;
        let is_dead = |n: u32| self.is_dead(n);
        let mut stats = MergeStats::default();
        let mut scratch = Scratch::default();
        let t = Instant::now();
        // The deleted nodes' live neighbours, then the scan.
        let mut dead_lists: HashMap<u32, Vec<u32>> = HashMap::with_capacity(self.dead.len());
        let mut sorted_dead: Vec<u32> = self.dead.to_vec();
        sorted_dead.sort_unstable();
        sorted_dead.dedup();
        // Only the first `refill` entries of each are ever taken (see
        // `delete_candidates`): the rest is not kept.
        let take = if p.refill == 0 { usize::MAX } else { p.refill };
        let qs = old.read_records(&sorted_dead, &mut scratch, |id, node| {
            let mut list: Vec<u32> = node
                .neighbor_ids()
                .filter(|&n| !is_dead(n))
                .take(take)
                .collect();
            list.shrink_to_fit();
            dead_lists.insert(id, list);
            Ok(())
        })?;
        stats.sectors_read += qs.sectors_read;
        let mut free: Vec<u32> = Vec::new();
        let mut w = NodeWriter::new(intermediate, h)?;
        let mut done = 0u64;
        old.scan_runs(|run| {
            if self.failed.load(Ordering::Relaxed) {
                return Err(Error::invalid("merge: the Insert phase failed"));
            }
            let outs = rewrites(run.len(), dim, |RunScratch { ps, joined, vector }, k| {
                let i = run.id(k);
                let node = run.node(&h, k, joined)?;
                if is_dead(i) || node.label == NO_LABEL {
                    return Ok(Rewrite::Free);
                }
                if !node.neighbor_ids().any(is_dead) {
                    return Ok(Rewrite::Keep);
                }
                let list: Vec<u32> = node.neighbor_ids().collect();
                let (mut kept, fresh) =
                    delete_candidates(i, &list, &is_dead, &dead_lists, p.refill);
                if kept.len() + fresh.len() <= h.max_degree as usize {
                    kept.extend_from_slice(&fresh);
                    return Ok(Rewrite::List(kept));
                }
                if kept.len() >= p.r {
                    return Ok(Rewrite::List(kept));
                }
                let dead = list.len() - kept.len();
                if let Some(t) = fitting_take(kept.len(), dead, h.max_degree as usize, p.refill) {
                    let (mut kept, fresh) = delete_candidates(i, &list, &is_dead, &dead_lists, t);
                    kept.extend_from_slice(&fresh);
                    return Ok(Rewrite::List(kept));
                }
                node.vector_into(vector)?;
                ps.refill(dim, self.dist, vector, &kept, &fresh, old, p)
                    .map(Rewrite::List)
            })?;
            for (k, o) in outs.iter().enumerate() {
                match o {
                    Rewrite::Free => free.push(run.id(k)),
                    Rewrite::List(_) => stats.repaired += 1,
                    _ => {}
                }
            }
            w.push_records(run.len(), |k, slot| {
                let mut joined = Vec::new();
                rewrite_into(slot, &h, &outs[k], run.record(&h, k, &mut joined), None)
            })?;
            done += run.len() as u64;
            self.report(Phase::Delete, done, n_old);
            Ok(())
        })?;
        self.report(Phase::Delete, n_old, n_old);
        stats.sectors_read += h.data_sectors();
        w.finish(h.start, h.durable_seq)?;
        stats.sectors_written += 1 + h.data_sectors();
        stats.delete_secs = t.elapsed().as_secs_f64();
        Ok((free, stats))
    }

    /// Insert phase: GreedySearch for each new point over the old LTI from
    /// disk, then RobustPrune of what it expanded plus its linked new
    /// points. A list names another new point `k` as `tag(k)` until the
    /// slots are known (they depend on the Delete phase's free records).
    /// Searches run in `order` (temp-index neighbours one after another),
    /// so a thread's consecutive searches end in the same region; each
    /// thread keeps its recent records for the next.
    fn insert_phase(&self, io_threads: usize) -> Result<(Vec<NewList>, u64, u64)> {
        let (dim, p, old, inserts) = (self.dim, self.p, self.old, self.inserts);
        let done = AtomicU64::new(0);
        let total = inserts.len() as u64;
        let recent = inserts.len().div_ceil(io_threads).clamp(1, RECENT);
        let near = Arc::new(
            old.sectors_near_start((inserts.len() * NEAR_START_PER_INSERT).min(NEAR_START_MAX))?,
        );
        let part_len = self
            .order
            .len()
            .div_ceil(4 * rayon::current_num_threads())
            .max(1);
        let parts: Vec<Vec<NewList>> = self
            .order
            .par_chunks(part_len)
            .map_init(
                || {
                    let mut ls = Lockstep::new(p.in_flight);
                    ls.keep_recent(recent);
                    ls.share_cache(near.clone());
                    (ls, PruneScratch::default())
                },
                |(ls, ps), part| {
                    let mut out: Vec<Option<NewList>> = (0..part.len()).map(|_| None).collect();
                    let query = |i: usize| self.new_vec(part[i] as usize);
                    old.search_expanded_lockstep(
                        0..part.len(),
                        query,
                        p.l,
                        p.w,
                        ls,
                        |i, sc, qs| {
                            if self.failed.load(Ordering::Relaxed) {
                                return Err(Error::invalid("merge: the Delete phase failed"));
                            }
                            let j = part[i] as usize;
                            let q = self.new_vec(j);
                            // Candidates: expanded live nodes, then linked new points.
                            ps.cand_nodes.clear();
                            let mut vecs = std::mem::take(&mut ps.flat);
                            vecs.clear();
                            for (e, v) in sc
                                .expanded
                                .iter()
                                .zip(sc.expanded_vectors.chunks_exact(dim))
                            {
                                if !self.is_dead(e.1) {
                                    ps.cand_nodes.push(e.1);
                                    vecs.extend_from_slice(v);
                                }
                            }
                            for &k in &inserts.links[j] {
                                if k as usize != j {
                                    ps.cand_nodes.push(tag(k as usize));
                                    vecs.extend_from_slice(self.new_vec(k as usize));
                                }
                            }
                            let list = {
                                let mut rows: Vec<&[f32]> =
                                    Vec::with_capacity(ps.cand_nodes.len() + 1);
                                rows.push(q);
                                rows.extend(vecs.chunks_exact(dim));
                                ps.prune_rows(self.dist, &rows, p)
                            };
                            ps.flat = vecs;
                            let d = done.fetch_add(1, Ordering::Relaxed) + 1;
                            if d.is_multiple_of(1024) && !self.deleting.load(Ordering::Relaxed) {
                                self.report(Phase::Insert, d, total);
                            }
                            let mut list = list;
                            list.shrink_to_fit();
                            out[i] = Some((list, qs));
                            Ok(())
                        },
                    )?;
                    out.into_iter()
                        .map(|o| o.ok_or_else(|| Error::invalid("merge: a search did not end")))
                        .collect::<Result<Vec<_>>>()
                },
            )
            .collect::<Result<_>>()?;
        let caches = (
            near.bytes() as u64,
            (recent * vectide_storage::block::BLOCK * io_threads) as u64,
        );
        Ok((parts.into_iter().flatten().collect(), caches.0, caches.1))
    }

    /// Slots for the new points: free ones first, then past the end, in
    /// `order`, so that new points that are neighbours share sectors too;
    /// their PQ codes; their lists with tags turned into slots, and the Δ.
    fn place(
        &self,
        free: Vec<u32>,
        lists: Vec<NewList>,
        stats: &mut MergeStats,
    ) -> Result<Placement> {
        let n = self.inserts.len();
        let pq = self.old.pq();
        let reused = free.len().min(n);
        let mut slots = vec![0u32; n];
        for (k, &j) in self.order.iter().enumerate() {
            slots[j as usize] = if k < reused {
                free[k]
            } else {
                (self.h.nodes as usize + k - reused) as u32
            };
        }
        let left_free = free[reused..].to_vec();
        let slot_of: HashMap<u32, u32> = slots
            .iter()
            .enumerate()
            .map(|(j, &s)| (s, j as u32))
            .collect();
        let mut codes = vec![0u8; n * pq.m()];
        codes
            .par_chunks_mut(pq.m().max(1))
            .enumerate()
            .try_for_each(|(j, c)| pq.encode(self.new_vec(j), c))?;
        let first_tag = u32::MAX - (n as u32).saturating_sub(1);
        let mut edges = Vec::with_capacity(lists.iter().map(|(l, _)| l.len()).sum());
        let mut new_lists: Vec<Vec<u32>> = vec![Vec::new(); lists.len()];
        for (&j, (mut list, qs)) in self.order.iter().zip(lists) {
            stats.insert_searches += qs;
            stats.sectors_read += qs.sectors_read;
            stats.insert_cache_hits += qs.cache_hits;
            for x in list.iter_mut() {
                if *x >= first_tag {
                    *x = slots[(u32::MAX - *x) as usize];
                }
            }
            edges.extend(list.iter().map(|&t| (t, slots[j as usize])));
            new_lists[j as usize] = list;
        }
        let delta = Delta::new(edges);
        Ok(Placement {
            slots,
            slot_of,
            left_free,
            n_new: self.h.nodes + (n - reused) as u64,
            codes,
            new_lists,
            delta,
        })
    }

    /// Patch phase: Δ into every list, new points into their slots, a run
    /// of the intermediate LTI at a time (the lists in parallel, then the
    /// records encoded in parallel into the new LTI's sectors), then the
    /// new points past the old end. Returns the new LTI's header and its
    /// in-edge counts (for the orphan links).
    fn patch(
        &self,
        intermediate: Box<dyn BlockFile>,
        out: &dyn BlockFile,
        pl: &Placement,
        durable_seq: u64,
        stats: &mut MergeStats,
    ) -> Result<(Header, InEdges)> {
        let (h, dim, p, old) = (self.h, self.dim, self.p, self.old);
        let (n_old, n_new) = (h.nodes, pl.n_new);
        let inter_header = Lti::read_header(&*intermediate)?;
        let inter = Lti::from_parts(
            intermediate,
            inter_header,
            old.pq().clone(),
            old.codes().clone(),
        )?;
        let out_shape = Header { nodes: n_new, ..h };
        let new_of = |c: u32| pl.new_of(self, c);
        let news = NewPoints {
            labels: self.inserts.labels,
            vectors: self.inserts.vectors,
            lists: &pl.new_lists,
        };
        // Node `i`'s list with its Δ (`None`: it has none): pruned to `r`
        // when over the room.
        let with_delta = |ps: &mut PruneScratch, i: u32, list: &[u32], vector: &[f32]| {
            let add = pl.delta.get(i);
            if add.is_empty() {
                return Ok(None);
            }
            let mut l = list.to_vec();
            for &(_, a) in add {
                if a != i && !l.contains(&a) {
                    l.push(a);
                }
            }
            if l.len() <= h.max_degree as usize {
                return Ok(Some(l));
            }
            ps.prune(dim, self.dist, vector, &l, new_of, old, p)
                .map(Some)
        };
        let rewrite_new = |ps: &mut PruneScratch, i: u32| -> Result<Rewrite> {
            let j = pl.slot_of[&i] as usize;
            Ok(Rewrite::New(
                j,
                with_delta(ps, i, &pl.new_lists[j], self.new_vec(j))?,
            ))
        };
        let mut w = NodeWriter::new(out, out_shape)?;
        let mut in_edges = InEdges::new(n_new as usize);
        // A new point's list counts its in-edges; one the Patch phase changed
        // counts as patched.
        let count_new = |o: &Rewrite, in_edges: &mut InEdges, stats: &mut MergeStats| {
            if let Rewrite::New(j, l) = o {
                stats.patched += u64::from(l.is_some());
                in_edges.add_list(l.as_deref().unwrap_or(&pl.new_lists[*j]));
            }
        };
        let mut done = 0u64;
        inter.scan_runs(|run| {
            let outs = rewrites(run.len(), dim, |RunScratch { ps, joined, vector }, k| {
                let i = run.id(k);
                if pl.slot_of.contains_key(&i) {
                    return rewrite_new(ps, i);
                }
                let node = run.node(&inter_header, k, joined)?;
                if node.label == NO_LABEL {
                    return Ok(Rewrite::Free);
                }
                if pl.delta.get(i).is_empty() {
                    return Ok(Rewrite::Keep);
                }
                let list: Vec<u32> = node.neighbor_ids().collect();
                node.vector_into(vector)?;
                Ok(with_delta(ps, i, &list, vector)?.map_or(Rewrite::Keep, Rewrite::List))
            })?;
            let mut joined = Vec::new();
            for (k, o) in outs.iter().enumerate() {
                match o {
                    Rewrite::Free => in_edges.mark_free(run.id(k)),
                    Rewrite::Keep => {
                        for t in run.node(&inter_header, k, &mut joined)?.neighbor_ids() {
                            in_edges.add(t);
                        }
                    }
                    Rewrite::List(l) => {
                        stats.patched += 1;
                        in_edges.add_list(l);
                    }
                    Rewrite::New(..) => count_new(o, &mut in_edges, stats),
                }
            }
            w.push_records(run.len(), |k, slot| {
                let mut joined = Vec::new();
                let record = run.record(&inter_header, k, &mut joined);
                rewrite_into(slot, &out_shape, &outs[k], record, Some(&news))
            })?;
            done += run.len() as u64;
            self.report(Phase::Patch, done, n_new);
            Ok(())
        })?;
        stats.sectors_read += inter_header.data_sectors();
        // New points past the old end.
        let tail = rewrites((n_new - n_old) as usize, dim, |s, k| {
            rewrite_new(&mut s.ps, (n_old + k as u64) as u32)
        })?;
        for o in &tail {
            count_new(o, &mut in_edges, stats);
        }
        w.push_records(tail.len(), |k, slot| {
            rewrite_into(slot, &out_shape, &tail[k], &[], Some(&news))
        })?;
        self.report(Phase::Patch, n_new, n_new);
        let header = w.finish(h.start, durable_seq)?;
        stats.sectors_written += 1 + header.data_sectors();
        Ok((header, in_edges))
    }
}

/// A new point's list from the Insert phase, and its search's work.
type NewList = (Vec<u32>, QueryStats);

/// A new point `k`'s name in an Insert-phase list until slots are known.
fn tag(k: usize) -> u32 {
    u32::MAX - k as u32
}

/// In-edges counted up to two per node, and free records, over the new
/// LTI as the Patch phase writes it (three bits per node).
struct InEdges {
    one: Vec<u64>,
    two: Vec<u64>,
    free: Vec<u64>,
}

fn bit(bits: &[u64], i: u32) -> bool {
    bits.get(i as usize / 64)
        .is_some_and(|w| w >> (i % 64) & 1 == 1)
}

fn set_bit(bits: &mut [u64], i: u32, on: bool) {
    if let Some(w) = bits.get_mut(i as usize / 64) {
        if on {
            *w |= 1 << (i % 64);
        } else {
            *w &= !(1 << (i % 64));
        }
    }
}

impl InEdges {
    fn new(n: usize) -> Self {
        let words = n.div_ceil(64);
        InEdges {
            one: vec![0; words],
            two: vec![0; words],
            free: vec![0; words],
        }
    }

    fn add(&mut self, t: u32) {
        if bit(&self.one, t) {
            set_bit(&mut self.two, t, true);
        } else {
            set_bit(&mut self.one, t, true);
        }
    }

    fn add_list(&mut self, list: &[u32]) {
        for &t in list {
            self.add(t);
        }
    }

    fn mark_free(&mut self, i: u32) {
        set_bit(&mut self.free, i, true);
    }

    /// Live nodes other than the start with no in-edge.
    fn orphans(&self, n: u64, start: u64) -> Vec<u32> {
        (0..n as u32)
            .filter(|&i| i as u64 != start && !bit(&self.free, i) && !bit(&self.one, i))
            .collect()
    }
}

/// Gives each orphan (module docs, step 4) an in-edge in the written file
/// `out`: from its out-neighbours, nearest first (`vector_of` gives their
/// vectors), then the start node, the first with room takes it; failing
/// that, the first with an entry whose target has another in-edge gives
/// that entry up. Returns (linked, left without one). Not synced.
fn link_orphans(
    out: &dyn BlockFile,
    h: &Header,
    edges: &mut InEdges,
    dist: DistanceFn,
    vector_of: impl Fn(u32, &mut [f32]) -> Result<()>,
) -> Result<(u64, u64)> {
    let room = h.max_degree as usize;
    let (mut linked, mut left) = (0, 0);
    let mut v = vec![0.0; h.dim as usize];
    for o in edges.orphans(h.nodes, h.start) {
        let (own, list) = edit_record(out, h, o, |x, l| (x.to_vec(), l.clone()))?;
        let mut near: Vec<(f32, u32)> = Vec::with_capacity(list.len() + 1);
        for q in list.into_iter().filter(|&q| q != o && !bit(&edges.free, q)) {
            vector_of(q, &mut v)?;
            near.push((dist(&own, &v), q));
        }
        near.sort_by(|a, b| a.0.total_cmp(&b.0));
        if near.iter().all(|&(_, q)| q as u64 != h.start) {
            near.push((f32::INFINITY, h.start as u32));
        }
        let mut done = false;
        for &(_, q) in &near {
            done = edit_record(out, h, q, |_, l| {
                let fits = l.len() < room && !l.contains(&o);
                if fits {
                    l.push(o);
                }
                fits
            })?;
            if done {
                break;
            }
        }
        if !done {
            for &(_, q) in &near {
                let two = &edges.two;
                let given = edit_record(out, h, q, |_, l| {
                    let at = l.iter().rposition(|&e| bit(two, e))?;
                    Some(std::mem::replace(&mut l[at], o))
                })?;
                if let Some(e) = given {
                    // `e` keeps at least one in-edge; whether it keeps two
                    // is unknown, so it no longer counts as having two.
                    set_bit(&mut edges.two, e, false);
                    done = true;
                    break;
                }
            }
        }
        if done {
            edges.add(o);
            linked += 1;
        } else {
            left += 1;
        }
    }
    Ok((linked, left))
}

/// Algorithm 4's candidates of node `node` whose list `list` names
/// deleted nodes: its live neighbours (kept, in order), and the live
/// neighbours of its deleted ones that it does not hold already (sorted,
/// without itself). Only the first `refill` entries of each deleted
/// neighbour's live list are taken (0: all): RobustPrune writes a list
/// nearest first (back-edges added later go to its end), and the nearest
/// neighbours of a deleted neighbour are the likeliest replacements for the
/// edge to it.
fn delete_candidates(
    node: u32,
    list: &[u32],
    is_dead: &dyn Fn(u32) -> bool,
    dead_lists: &HashMap<u32, Vec<u32>>,
    refill: usize,
) -> (Vec<u32>, Vec<u32>) {
    let take = if refill == 0 { usize::MAX } else { refill };
    let mut kept: Vec<u32> = Vec::new();
    let mut fresh: Vec<u32> = Vec::new();
    for &v in list {
        if !is_dead(v) {
            kept.push(v);
        } else if let Some(l) = dead_lists.get(&v) {
            fresh.extend(l.iter().take(take).copied().filter(|&x| x != node));
        }
    }
    fresh.sort_unstable();
    fresh.dedup();
    // Those the list holds already: one pass over both sorted.
    let mut held = kept.clone();
    held.sort_unstable();
    let mut h = held.iter().peekable();
    fresh.retain(|&x| {
        while h.next_if(|&&k| k < x).is_some() {}
        h.peek() != Some(&&x)
    });
    (kept, fresh)
}

/// A shorter take per deleted neighbour than `refill`, at least half of it,
/// with which a repaired node's whole candidate set fits its room: `kept`
/// live neighbours plus `take` entries of each of `dead` deleted ones stay
/// within `max_degree`. A node that lost only a few neighbours then keeps
/// its list and the nearest of each deleted one's neighbours without an
/// α-rule pass; one that lost many keeps the full `refill` and the pass.
fn fitting_take(kept: usize, dead: usize, max_degree: usize, refill: usize) -> Option<usize> {
    if refill == 0 || dead == 0 || kept >= max_degree {
        return None;
    }
    let take = (max_degree - kept) / dead;
    (take >= refill.div_ceil(2) && take < refill).then_some(take)
}

/// The admission of [`PruneScratch::refill`] over `rows`: row 0 is the
/// node, rows `1..=n_kept` its live neighbours (kept, in order), the rest
/// the candidates; the kept row numbers, at most `r` (and never fewer than
/// the `n_kept`), go to `out`.
fn refill_rows(
    dist: DistanceFn,
    rows: &[&[f32]],
    n_kept: usize,
    alpha: f32,
    r: usize,
    ranked: &mut Vec<Candidate>,
    out: &mut Vec<u32>,
) {
    ranked.clear();
    ranked
        .extend((n_kept + 1..rows.len()).map(|i| Candidate::new(dist(rows[0], rows[i]), i as u32)));
    ranked.sort_unstable();
    out.clear();
    out.extend(1..=n_kept as u32);
    // The member that occluded the last rejected candidate is asked
    // first: candidates come from a few deleted neighbours' lists, and one
    // member tends to occlude a run of them, so most rejections cost one
    // distance instead of a scan of the list.
    let mut last: Option<usize> = None;
    for c in ranked.iter() {
        if out.len() >= r {
            break;
        }
        let vc = rows[c.node as usize];
        let occludes = |k: u32| alpha * dist(vc, rows[k as usize]) < c.dist.0;
        if last.is_some_and(|i| occludes(out[i])) {
            continue;
        }
        match out
            .iter()
            .enumerate()
            .position(|(i, &k)| Some(i) != last && occludes(k))
        {
            Some(i) => last = Some(i),
            None => out.push(c.node),
        }
    }
}

/// Per-thread buffers of the prunes.
#[derive(Default)]
struct PruneScratch {
    flat: Vec<f32>,
    codes: Vec<u8>,
    cand_nodes: Vec<u32>,
    pool: Vec<u32>,
    ranked: Vec<Candidate>,
    kept: Vec<u32>,
}

impl PruneScratch {
    /// RobustPrune of `base` over `cands` (node numbers): a candidate's
    /// vector is borrowed from `cached` when it has one, else reconstructed
    /// into scratch from its PQ code in `codes` ([`PruneScratch::with_rows`]);
    /// the kept node numbers.
    #[allow(clippy::too_many_arguments)]
    fn prune<'v>(
        &mut self,
        dim: usize,
        dist: DistanceFn,
        base: &[f32],
        cands: &[u32],
        cached: impl Fn(u32) -> Option<&'v [f32]>,
        codes: &Lti,
        p: &MergeParams,
    ) -> Result<Vec<u32>> {
        self.with_rows(dim, base, cands, cached, codes, |s, rows| {
            s.prune_rows(dist, rows, p)
        })
    }

    /// The Delete phase's repair of a list that lost neighbours: `kept`
    /// (the live neighbours) stay, and the room up to `r` is filled from
    /// `fresh` (the deleted neighbours' live neighbours), nearest first,
    /// each admitted when no list member `k` has `α·d(k, c) < d(p, c)`.
    /// Vectors are PQ reconstructions as in [`PruneScratch::prune`].
    #[allow(clippy::too_many_arguments)]
    fn refill(
        &mut self,
        dim: usize,
        dist: DistanceFn,
        base: &[f32],
        kept: &[u32],
        fresh: &[u32],
        codes: &Lti,
        p: &MergeParams,
    ) -> Result<Vec<u32>> {
        let all: Vec<u32> = kept.iter().chain(fresh).copied().collect();
        self.with_rows(
            dim,
            base,
            &all,
            |_| None,
            codes,
            |s, rows| {
                refill_rows(
                    dist,
                    rows,
                    kept.len(),
                    p.alpha,
                    p.r,
                    &mut s.ranked,
                    &mut s.kept,
                );
                s.kept
                    .iter()
                    .map(|&k| s.cand_nodes[k as usize - 1])
                    .collect()
            },
        )
    }

    /// Runs `f` over `rows`: `base`, then the vector of each of `cands`
    /// (`self.cand_nodes` holds them, in order), borrowed from `cached`
    /// when it has one, else reconstructed into scratch from its PQ code.
    ///
    /// The codes are gathered first, then decoded: a candidate's code is
    /// a cache miss (the code array is far larger than the caches), and
    /// the gather's loads are independent, so the misses overlap instead
    /// of each stalling its own decode (measured under `perf`: the decode
    /// was a third of the Delete phase, nearly all of it waiting on the
    /// code's first byte).
    fn with_rows<'v, R>(
        &mut self,
        dim: usize,
        base: &[f32],
        cands: &[u32],
        cached: impl Fn(u32) -> Option<&'v [f32]>,
        codes: &Lti,
        f: impl FnOnce(&mut Self, &[&[f32]]) -> R,
    ) -> Result<R> {
        let mut flat = std::mem::take(&mut self.flat);
        flat.clear();
        let found: Vec<Option<&[f32]>> = cands.iter().map(|&c| cached(c)).collect();
        self.codes.clear();
        for (&c, f) in cands.iter().zip(&found) {
            if f.is_none() {
                self.codes.extend_from_slice(codes.code(c));
            }
        }
        let pq = codes.pq();
        for code in self.codes.chunks_exact(pq.m().max(1)) {
            let at = flat.len();
            flat.resize(at + dim, 0.0);
            pq.decode(code, &mut flat[at..])?;
        }
        let mut rows: Vec<&[f32]> = Vec::with_capacity(cands.len() + 1);
        rows.push(base);
        let mut misses = flat.chunks_exact(dim.max(1));
        rows.extend(
            found
                .iter()
                .map(|f| f.unwrap_or_else(|| misses.next().unwrap_or(&[]))),
        );
        self.cand_nodes.clear();
        self.cand_nodes.extend_from_slice(cands);
        let r = f(self, &rows);
        drop(rows);
        self.flat = flat;
        Ok(r)
    }

    /// RobustPrune of `rows[0]` over `self.cand_nodes`, whose vectors are
    /// `rows[1..]` (same order); the kept node numbers.
    fn prune_rows(&mut self, dist: DistanceFn, rows: &[&[f32]], p: &MergeParams) -> Vec<u32> {
        prune_points(
            Rows { rows },
            dist,
            p.alpha,
            p.r,
            &mut self.pool,
            &mut self.ranked,
            &mut self.kept,
        );
        let mut out: Vec<u32> = self
            .kept
            .iter()
            .map(|&k| self.cand_nodes[k as usize - 1])
            .collect();
        out.dedup();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vectide_core::Metric;
    use vectide_storage::block::SimBlockFile;

    /// Writes nodes at x = 0, 1, 2, … on a line (2-d vectors) with these
    /// lists (`None`: a free record), start node 0.
    fn line(lists: &[Option<Vec<u32>>], max_degree: u32) -> (SimBlockFile, Header, InEdges) {
        let file = SimBlockFile::new(7);
        let shape = Header {
            metric: Metric::L2,
            dim: 2,
            max_degree,
            nodes: 0,
            start: 0,
            durable_seq: 0,
            pq_bytes: 1,
        };
        let mut edges = InEdges::new(lists.len());
        let h = {
            let mut w = NodeWriter::new(&file, shape).unwrap();
            for (i, l) in lists.iter().enumerate() {
                match l {
                    Some(l) => {
                        w.push(&[i as f32, 0.0], i as u64, l).unwrap();
                        edges.add_list(l);
                    }
                    None => {
                        w.push_free().unwrap();
                        edges.mark_free(i as u32);
                    }
                }
            }
            w.finish(0, 0).unwrap()
        };
        (file, h, edges)
    }

    fn lists_of(file: &SimBlockFile, h: &Header) -> Vec<Vec<u32>> {
        (0..h.nodes as u32)
            .map(|i| edit_record(file, h, i, |_, l| l.clone()).unwrap())
            .collect()
    }

    fn exact(c: u32, v: &mut [f32]) -> Result<()> {
        v.copy_from_slice(&[c as f32, 0.0]);
        Ok(())
    }

    #[test]
    fn a_node_that_lost_few_neighbours_takes_a_shorter_fitting_share() {
        // Room 84: 62 live and 2 deleted fit with 11 of each (not 16).
        assert_eq!(fitting_take(62, 2, 84, 16), Some(11));
        // 61 live and 3 deleted: 7 each would fit, under half of 16.
        assert_eq!(fitting_take(61, 3, 84, 16), None);
        // The full share fits already, or there is no share to shorten.
        assert_eq!(fitting_take(63, 1, 84, 16), None);
        assert_eq!(fitting_take(62, 2, 84, 0), None);
        assert_eq!(fitting_take(84, 2, 84, 16), None);
        assert_eq!(fitting_take(10, 0, 84, 16), None);
        // Half of an odd share rounds up: 7 of 15 is too few, 8 enough.
        assert_eq!(fitting_take(70, 2, 84, 15), None);
        assert_eq!(fitting_take(68, 2, 84, 15), Some(8));
    }

    #[test]
    fn delete_candidates_take_the_front_of_each_deleted_list() {
        // Node 0's list: live 1, deleted 9, live 2, deleted 8 (whose list
        // names node 0 itself and node 2, which 0 already holds).
        let dead = |n: u32| n >= 8;
        let lists: HashMap<u32, Vec<u32>> = [(9, vec![5, 6, 7, 3]), (8, vec![0, 2, 4, 3])].into();
        let (kept, fresh) = delete_candidates(0, &[1, 9, 2, 8], &dead, &lists, 0);
        assert_eq!(kept, vec![1, 2]);
        assert_eq!(fresh, vec![3, 4, 5, 6, 7], "whole lists, without 0 and 2");
        // Two entries of each: 9 gives 5, 6; 8 gives 0 (itself) and 2 (held).
        let (kept, fresh) = delete_candidates(0, &[1, 9, 2, 8], &dead, &lists, 2);
        assert_eq!(kept, vec![1, 2]);
        assert_eq!(fresh, vec![5, 6]);
        // A deleted neighbour whose list is unknown gives nothing.
        let (_, fresh) = delete_candidates(0, &[1, 10], &dead, &lists, 0);
        assert!(fresh.is_empty());
    }

    #[test]
    fn a_repaired_list_keeps_its_live_neighbours_and_fills_the_room_nearest_first() {
        // The node at x = 0; its live neighbours at x = 5 and x = -4; the
        // candidates at 1, 2, 6, -1 and 9. Room for 4 (r = 4).
        let pts: Vec<[f32; 2]> = [0.0, 5.0, -4.0, 1.0, 2.0, 6.0, -1.0, 9.0]
            .iter()
            .map(|&x| [x, 0.0])
            .collect();
        let rows: Vec<&[f32]> = pts.iter().map(|p| &p[..]).collect();
        let dist = Metric::L2.distance_fn();
        let (mut ranked, mut out) = (Vec::new(), Vec::new());
        refill_rows(dist, &rows, 2, 1.2, 4, &mut ranked, &mut out);
        // 1 (d 1) is admitted: the kept 5 and -4 are farther from it than
        // it is from 0. -1 (d 1) too. Then the room is full.
        assert_eq!(out, vec![1, 2, 3, 6]);
        // With more room: 2 (d 4) is occluded by 1 (1.2·d(1, 2) = 1.2 < 4),
        // 6 (d 36) by 5, 9 by 5; nothing else comes in.
        refill_rows(dist, &rows, 2, 1.2, 10, &mut ranked, &mut out);
        assert_eq!(out, vec![1, 2, 3, 6]);
        // The live neighbours stay even when a candidate would occlude them
        // (RobustPrune over everything would drop 5 for 1), and a full list
        // takes nothing.
        refill_rows(dist, &rows, 2, 1.2, 2, &mut ranked, &mut out);
        assert_eq!(out, vec![1, 2]);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(200))]
        /// The refill admits exactly what the plain rule admits (each
        /// candidate, nearest first, checked against every list member
        /// until the room is full), whatever member it asks first.
        #[test]
        fn refill_matches_the_plain_alpha_rule(
            pts in proptest::collection::vec((-8i8..8, -8i8..8), 3..40),
            n_kept in 0usize..6,
            r in 1usize..24,
        ) {
            let pts: Vec<[f32; 2]> = pts.iter().map(|&(x, y)| [x as f32, y as f32]).collect();
            let rows: Vec<&[f32]> = pts.iter().map(|p| &p[..]).collect();
            let n_kept = n_kept.min(rows.len() - 1);
            let dist = Metric::L2.distance_fn();
            let (mut ranked, mut out) = (Vec::new(), Vec::new());
            refill_rows(dist, &rows, n_kept, 1.2, r, &mut ranked, &mut out);
            let mut plain: Vec<u32> = (1..=n_kept as u32).collect();
            for c in ranked.iter() {
                if plain.len() >= r {
                    break;
                }
                let vc = rows[c.node as usize];
                if plain.iter().all(|&k| 1.2 * dist(vc, rows[k as usize]) >= c.dist.0) {
                    plain.push(c.node);
                }
            }
            proptest::prop_assert_eq!(out, plain);
        }

        /// Algorithm 4's candidates as defined, whatever the overlap of
        /// the kept neighbours with the deleted ones' lists.
        #[test]
        fn delete_candidates_match_their_definition(
            list in proptest::collection::vec(0u32..40, 0..30),
            dead_lists in proptest::collection::vec(proptest::collection::vec(0u32..20, 0..12), 20),
            refill in 0usize..6,
        ) {
            let dead = |n: u32| n >= 20;
            let lists: HashMap<u32, Vec<u32>> = dead_lists
                .into_iter()
                .enumerate()
                .map(|(i, l)| (20 + i as u32, l))
                .collect();
            let (kept, fresh) = delete_candidates(0, &list, &dead, &lists, refill);
            let live: Vec<u32> = list.iter().copied().filter(|&n| !dead(n)).collect();
            let take = if refill == 0 { usize::MAX } else { refill };
            let mut want: Vec<u32> = list
                .iter()
                .filter(|&&n| dead(n))
                .flat_map(|n| lists[n].iter().take(take).copied())
                .filter(|&x| x != 0 && !live.contains(&x))
                .collect();
            want.sort_unstable();
            want.dedup();
            proptest::prop_assert_eq!(kept, live);
            proptest::prop_assert_eq!(fresh, want);
        }
    }

    #[test]
    fn orphans_get_an_in_edge_from_a_neighbour_with_room() {
        // 3 and 4 have no in-edge; 5 is free. Room 3: 2 takes 3, 1 takes 4
        // (each orphan's nearest out-neighbour).
        let lists = [
            Some(vec![1, 2]),
            Some(vec![2, 0]),
            Some(vec![1, 0]),
            Some(vec![0, 2]),
            Some(vec![0, 1]),
            None,
        ];
        let (file, h, mut edges) = line(&lists, 3);
        assert_eq!(edges.orphans(h.nodes, h.start), vec![3, 4]);
        let dist = Metric::L2.distance_fn();
        assert_eq!(
            link_orphans(&file, &h, &mut edges, dist, exact).unwrap(),
            (2, 0)
        );
        let got = lists_of(&file, &h);
        assert_eq!(got[2], vec![1, 0, 3]);
        assert_eq!(got[1], vec![2, 0, 4]);
        let live: Vec<u32> = (1..5).collect();
        assert!(crate::stats::unreachable(&got, 0, &live).is_empty());
        assert!(edges.orphans(h.nodes, h.start).is_empty());
    }

    #[test]
    fn a_full_neighbour_gives_up_an_edge_whose_target_has_another() {
        // Room 2, every list full. 3's nearest neighbour 2 gives up its
        // entry 0 (in-edges from 1 and 2); 4's neighbour 1 gives up 2
        // (in-edges from 0, 1 and now 3), not 0 (down to one).
        let lists = [
            Some(vec![1, 2]),
            Some(vec![2, 0]),
            Some(vec![1, 0]),
            Some(vec![2, 1]),
            Some(vec![1, 0]),
        ];
        let (file, h, mut edges) = line(&lists, 2);
        let dist = Metric::L2.distance_fn();
        assert_eq!(
            link_orphans(&file, &h, &mut edges, dist, exact).unwrap(),
            (2, 0)
        );
        let got = lists_of(&file, &h);
        assert_eq!(got[2], vec![1, 3]);
        assert_eq!(got[1], vec![4, 0]);
        let live: Vec<u32> = (1..5).collect();
        assert!(crate::stats::unreachable(&got, 0, &live).is_empty());
        // Lists read back parse (sectors resealed).
        assert!(got.iter().all(|l| l.len() == 2));
    }

    #[test]
    fn the_start_node_takes_an_orphan_its_neighbours_cannot() {
        // Room 1: 0 -> 1 -> 0, 2 -> 1. 2's neighbour 1 is full and its
        // entry 0 has one in-edge; the start 0 gives up 1 (in-edges from
        // 0 and 2).
        let lists = [Some(vec![1]), Some(vec![0]), Some(vec![1])];
        let (file, h, mut edges) = line(&lists, 1);
        let dist = Metric::L2.distance_fn();
        assert_eq!(
            link_orphans(&file, &h, &mut edges, dist, exact).unwrap(),
            (1, 0)
        );
        let got = lists_of(&file, &h);
        assert_eq!(got, vec![vec![2], vec![0], vec![1]]);
        assert!(crate::stats::unreachable(&got, 0, &[1, 2]).is_empty());
    }

    #[test]
    fn an_orphan_nobody_can_take_is_counted_not_forced() {
        // Room 1: 0 -> 1 -> 0, 2 -> 0. Taking 2 would cost 1 its only
        // in-edge, so nothing changes and 2 is counted as left.
        let lists = [Some(vec![1]), Some(vec![0]), Some(vec![0])];
        let (file, h, mut edges) = line(&lists, 1);
        let dist = Metric::L2.distance_fn();
        assert_eq!(
            link_orphans(&file, &h, &mut edges, dist, exact).unwrap(),
            (0, 1)
        );
        assert_eq!(lists_of(&file, &h), vec![vec![1], vec![0], vec![0]]);
    }
}
