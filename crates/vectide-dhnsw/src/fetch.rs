//! What crosses the network: partitions fetched whole in doorbell chains
//! (or one round trip each), writes posted in chains, and the naive
//! baseline's graph whose every node is fetched by a READ of its own the
//! first time a search touches it.

use crate::layout::{BlobHeader, Entry, BLOB_HEADER, DELETED, ENTRY_BYTES, ENTRY_STATE_AT};
use crate::state::{DHnsw, Layout};
use crate::subgraph::SubGraph;
use parking_lot::Mutex;
use std::sync::atomic::AtomicU32;
use std::sync::OnceLock;
use vectide_core::io::ByteReader;
use vectide_core::{Error, Result};
use vectide_graph::Graph;
use vectide_remote::{Region, RemoteMemory, Site, Verb};

/// Largest WRITE in one work request, and bytes per doorbell of writes
/// (the memory node takes frames of up to 64 MiB).
const WRITE_PIECE: usize = 8 << 20;
const CHAIN_BYTES: usize = 32 << 20;
/// Work requests per doorbell (the node's limit is 4,096).
const CHAIN_WRS: usize = 1024;
/// Bytes one chain of READs may bring back (a reply frame holds 256 MiB).
const CHAIN_READ_BYTES: u64 = 128 << 20;

/// Posts `writes` (offset, bytes) in as few doorbell chains as the node's
/// limits allow, in order, then FLUSHes what they wrote (durable on a
/// memory node with a backing file when this returns).
pub fn post_writes(
    mem: &dyn RemoteMemory,
    region: Region,
    site: Site,
    writes: Vec<(u64, Vec<u8>)>,
) -> Result<()> {
    post_phases(mem, region, vec![(site, writes)])
}

/// Writes: (offset, bytes) each.
pub type Writes = Vec<(u64, Vec<u8>)>;

/// Writes FLUSHed at one site, before the next phase's.
pub type Phase = (Site, Writes);

/// Posts `writes` in doorbell chains with no FLUSH: for what a region
/// recomputes when it is put right after its memory node restarted (the
/// header's counts, the free table, tombstones; `recovery.rs`).
pub fn post_unflushed(
    mem: &dyn RemoteMemory,
    region: Region,
    writes: Vec<(u64, Vec<u8>)>,
) -> Result<()> {
    post_chains(mem, region, vec![(None, writes)])
}

/// Posts phases of writes: each phase's WRITEs, then FLUSHes of the ranges
/// they wrote, so that on a memory node with a backing file no byte of a
/// phase becomes durable... before every byte of the phases before it is
/// (a chain runs in order and a FLUSH completes once its range is
/// durable). As few doorbell chains as the node's limits allow.
pub fn post_phases(mem: &dyn RemoteMemory, region: Region, phases: Vec<Phase>) -> Result<()> {
    post_chains(
        mem,
        region,
        phases.into_iter().map(|(s, w)| (Some(s), w)).collect(),
    )
}

/// [`post_phases`], a phase with no site FLUSHed at none.
fn post_chains(
    mem: &dyn RemoteMemory,
    region: Region,
    phases: Vec<(Option<Site>, Writes)>,
) -> Result<()> {
    let mut chain: Vec<Verb> = Vec::new();
    let mut bytes = 0usize;
    let send = |chain: &mut Vec<Verb>| -> Result<()> {
        if chain.is_empty() {
            return Ok(());
        }
        for c in mem.post(chain)? {
            c.into_done()?;
        }
        chain.clear();
        Ok(())
    };
    for (site, writes) in phases {
        let mut ranges: Vec<(u64, u64)> = Vec::with_capacity(writes.len());
        for (off, b) in writes {
            ranges.push((off, off + b.len() as u64));
            for (i, piece) in b.chunks(WRITE_PIECE).enumerate() {
                if chain.len() == CHAIN_WRS || bytes + piece.len() > CHAIN_BYTES {
                    send(&mut chain)?;
                    bytes = 0;
                }
                bytes += piece.len();
                chain.push(Verb::Write {
                    region: region.id,
                    offset: off + (i * WRITE_PIECE) as u64,
                    bytes: piece.to_vec(),
                });
            }
        }
        let Some(site) = site else {
            continue;
        };
        // Neighbouring ranges flushed as one.
        ranges.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
        for (lo, hi) in ranges {
            match merged.last_mut() {
                Some(last) if lo <= last.1 => last.1 = last.1.max(hi),
                _ => merged.push((lo, hi)),
            }
        }
        for (lo, hi) in merged {
            if chain.len() == CHAIN_WRS {
                send(&mut chain)?;
                bytes = 0;
            }
            chain.push(Verb::Flush {
                region: region.id,
                offset: lo,
                len: hi - lo,
                site,
            });
        }
    }
    send(&mut chain)
}

pub fn read_range(mem: &dyn RemoteMemory, region: Region, lo: u64, hi: u64) -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity((hi - lo) as usize);
    let mut at = lo;
    while at < hi {
        let n = (hi - at).min(WRITE_PIECE as u64);
        out.extend_from_slice(&mem.read(region, at, n as u32)?);
        at += n;
    }
    Ok(out)
}

/// A partition as a fetch brought it: its number, its bytes, and the table
/// entry they were read under (checked against the partition's state).
pub(crate) type Fetched = (u32, Vec<u8>, Entry);

/// Fetch attempts of a partition a writer keeps busy, before waiting
/// between them.
const SPIN: u32 = 3;

impl DHnsw {
    /// Fetches partitions `parts` (one READ each), `chain` READs per
    /// doorbell, handing each chain's graphs to `got` as they arrive.
    ///
    /// Each partition is read as `[READ its entry, READ its bytes, READ its
    /// state]` in one doorbell: the bytes count only when the entry's state
    /// is even (no writer inside), equals the state read after them, and
    /// the entry is the one the bytes' range came from. A partition whose
    /// entry has moved on (another writer published) is read again with the
    /// new entry; one a writer is inside is read again after a pause, until
    /// the memory node's timeout.
    pub(crate) fn fetch_chains(
        &self,
        lay: &Layout,
        parts: &[u32],
        chain: usize,
        mut got: impl FnMut(Vec<Fetched>) -> Result<()>,
    ) -> Result<()> {
        let rec = lay.record();
        let mut want: Vec<(u32, Entry)> =
            parts.iter().map(|&p| (p, lay.table[p as usize])).collect();
        let started = std::time::Instant::now();
        let mut round = 0u32;
        while !want.is_empty() {
            let mut again = Vec::new();
            for c in chunks(&want, rec, chain) {
                let mut out = Vec::with_capacity(c.len());
                for (p, e, fresh, bytes) in self.read_checked(lay, c, rec)? {
                    match (fresh, bytes) {
                        (_, Some(b)) => out.push((p, b, e)),
                        (next, None) => again.push((p, next.unwrap_or(e))),
                    }
                }
                if !out.is_empty() {
                    got(out)?;
                }
            }
            want = again;
            if want.is_empty() {
                break;
            }
            round += 1;
            if started.elapsed() > std::time::Duration::from_millis(self.params.timeout_ms) {
                return Err(Error::unavailable(format!(
                    "d-hnsw: partition {} stayed busy (a writer inside) for {} ms",
                    want[0].0, self.params.timeout_ms
                )));
            }
            if round > SPIN {
                std::thread::sleep(std::time::Duration::from_micros(50 << round.min(10)));
            }
        }
        Ok(())
    }

    /// One doorbell (or, for a partition larger than a reply frame, READs
    /// of pieces) for `c`: per partition, the entry it was read under, the
    /// newer entry to read it again with (if its entry moved on), and its
    /// bytes when they count.
    #[allow(clippy::type_complexity)]
    fn read_checked(
        &self,
        lay: &Layout,
        c: &[(u32, Entry)],
        rec: u64,
    ) -> Result<Vec<(u32, Entry, Option<Entry>, Option<Vec<u8>>)>> {
        let entry_at = |p: u32| lay.header.table_off + u64::from(p) * ENTRY_BYTES;
        let mut wrs = Vec::with_capacity(3 * c.len());
        let mut big = Vec::new();
        for &(p, e) in c {
            let (lo, hi) = e.range(rec).ok_or_else(|| {
                Error::corrupted(format!("d-hnsw partition {p}: its bytes overflow"))
            })?;
            wrs.push(Verb::Read {
                region: lay.region.id,
                offset: entry_at(p),
                len: ENTRY_BYTES as u32,
            });
            if hi - lo > CHAIN_READ_BYTES {
                // Larger than a reply frame holds: read in pieces below.
                big.push((lo, hi));
                wrs.push(Verb::Read {
                    region: lay.region.id,
                    offset: lo,
                    len: 0,
                });
            } else {
                wrs.push(Verb::Read {
                    region: lay.region.id,
                    offset: lo,
                    len: (hi - lo) as u32,
                });
            }
            wrs.push(Verb::Read {
                region: lay.region.id,
                offset: entry_at(p) + ENTRY_STATE_AT,
                len: 8,
            });
        }
        let mut done = self.mem.post(&wrs)?.into_iter();
        let mut big = big.into_iter();
        let mut out = Vec::with_capacity(c.len());
        for &(p, e) in c {
            let head = done.next().expect("a completion per request").into_data()?;
            let mut bytes = done.next().expect("a completion per request").into_data()?;
            let tail = done.next().expect("a completion per request").into_data()?;
            let mut after = u64::from_le_bytes(tail[..8].try_into().expect("8 bytes"));
            if bytes.is_empty() {
                if let Some((lo, hi)) = big.next() {
                    // Read in pieces after the doorbell: the state is read
                    // once more behind them.
                    bytes = read_range(&*self.mem, lay.region, lo, hi)?;
                    let s = self.mem.read(lay.region, entry_at(p) + ENTRY_STATE_AT, 8)?;
                    let s = u64::from_le_bytes(s[..8].try_into().expect("8 bytes"));
                    if s != after {
                        after = u64::MAX;
                    }
                }
            }
            // The state first: an entry a writer is inside may be torn, and
            // is not decoded at all.
            let state = u64::from_le_bytes(
                head[ENTRY_STATE_AT as usize..ENTRY_STATE_AT as usize + 8]
                    .try_into()
                    .expect("8 bytes"),
            );
            let stable = (state % 2 == 0 && state == after) || crate::switches::TRUST_TORN.on();
            if !stable {
                out.push((p, e, None, None));
                continue;
            }
            let now = Entry::decode_table(&head, 1, rec, lay.header.region_size)?[0];
            if now == e {
                out.push((p, e, None, Some(bytes)));
            } else {
                out.push((p, e, Some(now), None));
            }
        }
        Ok(out)
    }

    /// Deserialises partition `p`'s bytes, read under entry `e`.
    pub(crate) fn decode_part(
        &self,
        lay: &Layout,
        e: &Entry,
        p: u32,
        bytes: &[u8],
    ) -> Result<SubGraph> {
        let h = &lay.header;
        let g = SubGraph::decode(
            bytes,
            e.count as usize,
            e.backward,
            self.dim,
            h.m as usize,
            h.m0 as usize,
            p,
        )?;
        g.set_version(e.state);
        Ok(g)
    }
}

/// A node as the naive baseline fetched it.
struct Node {
    deleted: bool,
    label: u64,
    list0: Box<[AtomicU32]>,
    vector: Box<[f32]>,
}

/// A partition read node by node: the blob's header and upper layers by
/// one READ when opened, each node's record by one READ the first time
/// the search touches it (the paper's naive baseline: no partition is
/// shipped whole). Implements [`Graph`], so it is searched by the same
/// traversal as a fetched sub-HNSW.
pub struct RemoteGraph<'a> {
    mem: &'a dyn RemoteMemory,
    region: Region,
    entry_row: Entry,
    record: u64,
    dim: usize,
    m: usize,
    m0: usize,
    pub entry: Option<(u32, usize)>,
    upper: Vec<Box<[AtomicU32]>>,
    nodes: Vec<OnceLock<Node>>,
    failed: Mutex<Option<Error>>,
    empty_list: Box<[AtomicU32]>,
    zeros: Box<[f32]>,
}

impl<'a> RemoteGraph<'a> {
    /// Opens partition `p`: two READs (the blob's header, then its upper
    /// layers when it has any).
    pub fn open(mem: &'a dyn RemoteMemory, lay: &Layout, p: u32) -> Result<RemoteGraph<'a>> {
        let e = lay.table[p as usize];
        let hd = &lay.header;
        let head = mem.read(lay.region, e.blob_off, BLOB_HEADER as u32)?;
        let h = BlobHeader::decode(&mut ByteReader::new(&head), hd.dim, hd.m, hd.m0)?;
        let n = h.n as usize + e.count as usize;
        let (dim, m, m0) = (hd.dim as usize, hd.m as usize, hd.m0 as usize);
        let mut upper: Vec<Box<[AtomicU32]>> = (0..n).map(|_| Box::default()).collect();
        let up_len = h.records_at() - BLOB_HEADER;
        if h.up_nodes > 0 {
            let b = mem.read(lay.region, e.blob_off + BLOB_HEADER as u64, up_len as u32)?;
            crate::subgraph::decode_upper(&mut ByteReader::new(&b), &h, m, &mut upper)?;
        }
        let entry = if h.entry != crate::layout::NO_NODE {
            Some((h.entry, h.top as usize))
        } else {
            (n > 0).then_some((0, 0))
        };
        Ok(RemoteGraph {
            mem,
            region: lay.region,
            entry_row: e,
            record: lay.record(),
            dim,
            m,
            m0,
            entry,
            upper,
            nodes: (0..n).map(|_| OnceLock::new()).collect(),
            failed: Mutex::new(None),
            empty_list: (0..1 + m0).map(|_| AtomicU32::new(0)).collect(),
            zeros: vec![0.0; dim].into_boxed_slice(),
        })
    }

    fn fetch(&self, id: u32) -> Result<Node> {
        let at = self.entry_row.node_at(u64::from(id), self.record);
        let b = self.mem.read(self.region, at, self.record as u32)?;
        let mut r = ByteReader::new(&b);
        let label = r.u64()?;
        let flags = r.u32()?;
        let count = r.u32()?;
        let mut list = Vec::new();
        r.u32s(self.m0, &mut list)?;
        let mut vector = Vec::new();
        r.f32s(self.dim, &mut vector)?;
        let n = self.nodes.len() as u32;
        let c = (count as usize).min(self.m0);
        let mut l0 = vec![AtomicU32::new(c as u32)];
        l0.extend(
            list.iter()
                .map(|&x| AtomicU32::new(if x < n { x } else { 0 })),
        );
        Ok(Node {
            deleted: flags & DELETED != 0,
            label,
            list0: l0.into_boxed_slice(),
            vector: vector.into_boxed_slice(),
        })
    }

    fn node(&self, id: u32) -> Option<&Node> {
        let cell = self.nodes.get(id as usize)?;
        if let Some(n) = cell.get() {
            return Some(n);
        }
        match self.fetch(id) {
            Ok(n) => Some(cell.get_or_init(|| n)),
            Err(e) => {
                self.failed.lock().get_or_insert(e);
                None
            }
        }
    }

    /// The first READ that failed during a search, if one did.
    pub fn take_error(&self) -> Option<Error> {
        self.failed.lock().take()
    }

    pub fn label(&self, id: u32) -> u64 {
        self.node(id).map_or(u64::MAX, |n| n.label)
    }

    pub fn is_deleted(&self, id: u32) -> bool {
        self.node(id).is_none_or(|n| n.deleted)
    }
}

impl Graph for RemoteGraph<'_> {
    fn slots(&self) -> usize {
        self.nodes.len()
    }
    fn vector(&self, slot: u32) -> &[f32] {
        self.node(slot).map_or(&self.zeros, |n| &n.vector)
    }
    fn vector_ptr(&self, slot: u32) -> *const f32 {
        // Never fetches: a prefetch hint of a node not here yet is skipped.
        self.nodes
            .get(slot as usize)
            .and_then(OnceLock::get)
            .map_or(std::ptr::null(), |n| n.vector.as_ptr())
    }
    fn prefetch_vector(&self, _slot: u32) {}
    fn list0_ptr(&self, slot: u32) -> *const u8 {
        self.nodes
            .get(slot as usize)
            .and_then(OnceLock::get)
            .map_or(std::ptr::null(), |n| n.list0.as_ptr() as *const u8)
    }
    fn list(&self, slot: u32, level: usize) -> &[AtomicU32] {
        if level == 0 {
            return self.node(slot).map_or(&self.empty_list, |n| &n.list0);
        }
        let w = 1 + self.m;
        self.upper[slot as usize]
            .get((level - 1) * w..level * w)
            .unwrap_or(&[])
    }
    fn cap(&self, level: usize) -> usize {
        if level == 0 {
            self.m0
        } else {
            self.m
        }
    }
}

/// `want` in chains of at most `chain` partitions whose replies fit a
/// frame (a partition larger than a frame alone).
fn chunks(want: &[(u32, Entry)], rec: u64, chain: usize) -> Vec<&[(u32, Entry)]> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut bytes = 0u64;
    for (i, (_, e)) in want.iter().enumerate() {
        let n = e.range(rec).map_or(0, |(lo, hi)| hi - lo);
        if i > start && (i - start == chain.max(1) || bytes + n > CHAIN_READ_BYTES) {
            out.push(&want[start..i]);
            (start, bytes) = (i, 0);
        }
        bytes += n;
    }
    if start < want.len() {
        out.push(&want[start..]);
    }
    out
}
