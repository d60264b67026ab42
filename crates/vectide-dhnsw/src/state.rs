//! [`DHnsw`]: the compute node's state (the memory node's handle, the
//! region's layout as last read or written, the meta-HNSW, the LRU of
//! sub-HNSWs, the label map and the timing counters). Every other room
//! imports it; it imports none of them.

use crate::labelmap::{LabelMap, Slot};
use crate::layout::{Entry, Header};
use crate::params::DhnswParams;
use crate::subgraph::SubGraph;
use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use vectide_core::metric::DistanceFn;
use vectide_core::{Metric, Result};
use vectide_remote::{NetModel, Region, Regions, RemoteMemory, TcpMemory, TcpOptions};

/// Where a label lives: partition, node id in it, the sequence number of
/// this compute node's operation that wrote it, and the label's bucket in
/// the remote label map with the version this node last saw there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Loc {
    pub part: u32,
    pub node: u32,
    pub seq: u64,
    pub bucket: u64,
    pub version: u16,
}

impl Loc {
    pub fn at(part: u32, node: u32, seq: u64, bucket: u64, version: u16) -> Loc {
        Loc {
            part,
            node,
            seq,
            bucket,
            version,
        }
    }

    /// The label map's value for this location.
    pub fn slot(&self) -> Slot {
        Slot {
            present: true,
            part: self.part,
            slot: self.node,
            version: self.version,
        }
    }
}

/// The region as the compute node knows it.
pub struct Layout {
    pub region: Region,
    pub name: String,
    pub header: Header,
    pub table: Vec<Entry>,
    pub meta: Arc<SubGraph>,
    /// The remote label map.
    pub map: LabelMap,
}

impl Layout {
    /// A layout just written, its meta-HNSW deserialised from `meta`.
    pub fn new(
        region: Region,
        name: String,
        header: Header,
        table: Vec<Entry>,
        meta: &crate::layout::GraphParts,
    ) -> Layout {
        Layout::with_meta(region, name, header, table, SubGraph::from_parts(meta))
    }

    /// A layout read back, its meta-HNSW decoded.
    pub fn with_meta(
        region: Region,
        name: String,
        header: Header,
        table: Vec<Entry>,
        meta: SubGraph,
    ) -> Layout {
        let map = LabelMap {
            region,
            off: header.labels_off,
            buckets: header.labels_buckets,
        };
        Layout {
            region,
            name,
            header,
            table,
            meta: Arc::new(meta),
            map,
        }
    }

    pub fn record(&self) -> u64 {
        u64::from(self.header.record)
    }

    /// Overflow records the gap of partition `p` can still take (its
    /// partner's records count against the same gap).
    pub fn room(&self, p: usize) -> u64 {
        let e = &self.table[p];
        let used: u64 = self
            .table
            .iter()
            .filter(|o| (o.gap_lo, o.gap_hi) == (e.gap_lo, e.gap_hi))
            .map(|o| o.count)
            .sum();
        ((e.gap_hi - e.gap_lo) / self.record()).saturating_sub(used)
    }
}

/// A least-recently-used set of sub-HNSWs, bounded by a count and by the
/// bytes they hold in RAM.
pub struct Lru {
    pub cap: usize,
    /// Bytes the cached graphs may hold (`usize::MAX`: no budget).
    pub budget: usize,
    used: usize,
    tick: u64,
    map: HashMap<u32, (Arc<SubGraph>, u64)>,
}

impl Default for Lru {
    fn default() -> Self {
        Lru::new(0, None)
    }
}

impl Lru {
    /// At most `cap` graphs and, with a `budget`, at most that many bytes.
    pub fn new(cap: usize, budget: Option<usize>) -> Lru {
        Lru {
            cap,
            budget: budget.unwrap_or(usize::MAX),
            used: 0,
            tick: 0,
            map: HashMap::new(),
        }
    }

    pub fn get(&mut self, p: u32) -> Option<Arc<SubGraph>> {
        self.tick += 1;
        let t = self.tick;
        self.map.get_mut(&p).map(|e| {
            e.1 = t;
            Arc::clone(&e.0)
        })
    }

    /// Caches `g` as partition `p`'s graph, evicting the least recently
    /// used until both bounds hold; a graph larger than the whole budget
    /// is not cached.
    pub fn put(&mut self, p: u32, g: Arc<SubGraph>) {
        self.remove(p);
        let bytes = g.memory_bytes();
        if self.cap == 0 || bytes > self.budget {
            return;
        }
        self.tick += 1;
        self.used += bytes;
        self.map.insert(p, (g, self.tick));
        while self.map.len() > self.cap || self.used > self.budget {
            match self.map.iter().min_by_key(|e| e.1 .1).map(|e| *e.0) {
                Some(o) => self.remove(o),
                None => break,
            }
        }
    }

    pub fn peek(&self, p: u32) -> Option<&Arc<SubGraph>> {
        self.map.get(&p).map(|e| &e.0)
    }

    pub fn remove(&mut self, p: u32) {
        if let Some((g, _)) = self.map.remove(&p) {
            self.used -= g.memory_bytes();
        }
    }

    pub fn clear(&mut self) {
        self.map.clear();
        self.used = 0;
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn bytes(&self) -> usize {
        self.used
    }
}

/// Cumulative timings of searches (nanoseconds), for the benchmark's
/// latency breakdown: meta-HNSW search, the fetch stage (wall time of the
/// round trips), the sub-HNSW stage (deserialising and searching), whole
/// batches.
#[derive(Default)]
pub struct Timing {
    pub batches: AtomicU64,
    pub queries: AtomicU64,
    pub meta_ns: AtomicU64,
    pub fetch_ns: AtomicU64,
    pub sub_ns: AtomicU64,
    /// Thread time deserialising fetched partitions (part of `sub_ns`'s
    /// stage, summed over the pool's threads).
    pub decode_ns: AtomicU64,
    pub batch_ns: AtomicU64,
    pub partitions_fetched: AtomicU64,
    pub partitions_cached: AtomicU64,
    pub rebuilds: AtomicU64,
    /// Moves into a new region laid out afresh (a rebuild did not fit).
    pub relayouts: AtomicU64,
    /// Times the whole index was partitioned afresh (automatic K outgrown).
    pub repartitions: AtomicU64,
    /// Region bytes no partition uses any more that the free table had no
    /// room for (until the index is laid out afresh).
    pub dead_bytes: AtomicU64,
    /// Bytes of the areas this node's rebuilds took, and of those the ones
    /// that came from the free table.
    pub rebuilt_bytes: AtomicU64,
    pub reused_bytes: AtomicU64,
    /// CASes this node lost to another writer (a partition's state, a
    /// label's value) and retried.
    pub cas_retries: AtomicU64,
    /// Time this node spent rebuilding partitions (build and write).
    pub rebuild_ns: AtomicU64,
    /// Regions this node put right after their memory node restarted.
    pub recoveries: AtomicU64,
}

impl Timing {
    pub fn add(a: &AtomicU64, v: u64) {
        a.fetch_add(v, Ordering::Relaxed);
    }
}

/// A d-HNSW index on a compute node (see the crate docs).
pub struct DHnsw {
    pub(crate) dim: usize,
    pub(crate) metric: Metric,
    pub(crate) dist: DistanceFn,
    pub(crate) params: DhnswParams,
    pub(crate) mem: Arc<dyn RemoteMemory>,
    /// The memory node inside this process, when no `memnode` was named.
    pub(crate) _local: Option<Arc<Regions>>,
    pub(crate) pool: Option<Arc<rayon::ThreadPool>>,
    /// `None` until the first insert builds the partitions.
    pub(crate) layout: RwLock<Option<Layout>>,
    pub(crate) cache: Mutex<Lru>,
    pub(crate) labels: RwLock<HashMap<u64, Loc>>,
    /// Held by inserts and deletes (one writer per compute node).
    pub(crate) write: Mutex<()>,
    pub(crate) durable: AtomicU64,
    /// The highest sequence number applied (what a save covers).
    pub(crate) applied: AtomicU64,
    /// Attached to a region another compute node built.
    pub(crate) attached: bool,
    /// Partitions seen with an odd state: (that state, when first seen),
    /// for `maintain` to take over once they stay so past the take-over
    /// time.
    pub(crate) stuck: Mutex<HashMap<u32, (u64, std::time::Instant)>>,
    /// Set when this node took a partition over: the header's counts are
    /// recounted once it holds none.
    pub(crate) taken_over: std::sync::atomic::AtomicBool,
    /// Set while this node puts a region right after its memory node
    /// restarted (`recovery.rs`): its own takes skip the boot check.
    pub(crate) recovering: std::sync::atomic::AtomicBool,
    /// This writer's slot in the writer table: (region id, offset).
    pub(crate) writer_at: Mutex<Option<(u32, u64)>>,
    /// The owed word's nonzero value this node saw, and since when
    /// (`sweep.rs`).
    pub(crate) owed_seen: Mutex<Option<(u64, std::time::Instant)>>,
    /// The region's lease this node holds, if any (`lease.rs`).
    pub(crate) leased: Arc<crate::lease::Held>,
    pub(crate) timing: Timing,
}

impl Drop for DHnsw {
    /// An index whose region was named for it (`region = auto`) gives the
    /// region back to the memory node when it closes: nothing else can
    /// find it (a save keeps the bytes in a file, and opening that file
    /// uploads them into a new region). A region the caller named is left
    /// for the caller. Best effort: a node that does not answer keeps it.
    fn drop(&mut self) {
        // The lease's renewals stop: held by no one alive, it may be
        // taken once it goes unrenewed past the take-over time.
        self.leased
            .stop
            .store(true, std::sync::atomic::Ordering::Release);
        if self.params.region.is_some() || self._local.is_some() {
            return;
        }
        if let Some(l) = self.layout.get_mut().take() {
            let _ = self.mem.drop_region(&l.name);
        }
    }
}

/// Bytes an in-process memory node may hand out.
pub const LOCAL_NODE_BYTES: u64 = 64 << 30;

impl DHnsw {
    /// A compute node for a new or reopened index: connects to the memory
    /// node named in `params` (or starts one in this process).
    pub(crate) fn connect(dim: usize, metric: Metric, params: DhnswParams) -> Result<DHnsw> {
        vectide_core::limits::check_dim(dim)?;
        let model = NetModel {
            latency: std::time::Duration::from_nanos((params.net_latency_us * 1e3) as u64),
            bandwidth_bps: params.net_gbps * 1e9,
        };
        let (mem, local): (Arc<dyn RemoteMemory>, _) = match &params.memnode {
            Some(_) if params.backing_file().is_some() => {
                let path = params.backing_file().expect("checked");
                let r = Arc::new(Regions::on_file(
                    &path,
                    LOCAL_NODE_BYTES,
                    vectide_storage::PersistMode::Msync,
                )?);
                (
                    Arc::new(vectide_remote::LocalMemory::local(Arc::clone(&r), model)),
                    Some(r),
                )
            }
            Some(addr) => (
                Arc::new(TcpMemory::connect(
                    addr,
                    TcpOptions {
                        timeout: std::time::Duration::from_millis(params.timeout_ms),
                        model,
                    },
                )?),
                None,
            ),
            None => {
                let r = Arc::new(Regions::new(LOCAL_NODE_BYTES));
                (
                    Arc::new(vectide_remote::LocalMemory::local(Arc::clone(&r), model)),
                    Some(r),
                )
            }
        };
        DHnsw::assemble(dim, metric, params, mem, local)
    }

    /// A compute node over `mem`, any transport to a memory node (an ibverbs
    /// one would do): a new index, built by its first insert.
    pub fn over(
        dim: usize,
        metric: Metric,
        params: &vectide_core::Params,
        mem: Arc<dyn RemoteMemory>,
    ) -> Result<DHnsw> {
        vectide_core::limits::check_dim(dim)?;
        let params = DhnswParams::from_params(params)?;
        DHnsw::assemble(dim, metric, params, mem, None)
    }

    fn assemble(
        dim: usize,
        metric: Metric,
        params: DhnswParams,
        mem: Arc<dyn RemoteMemory>,
        local: Option<Arc<Regions>>,
    ) -> Result<DHnsw> {
        let leased = Arc::new(crate::lease::Held::new(&mem));
        Ok(DHnsw {
            dim,
            metric,
            dist: metric.distance_fn(),
            pool: vectide_core::engine::thread_pool("d-hnsw", params.threads)?,
            params,
            mem,
            _local: local,
            layout: RwLock::new(None),
            cache: Mutex::new(Lru::default()),
            labels: RwLock::new(HashMap::new()),
            write: Mutex::new(()),
            durable: AtomicU64::new(0),
            applied: AtomicU64::new(0),
            attached: false,
            stuck: Mutex::new(HashMap::new()),
            taken_over: std::sync::atomic::AtomicBool::new(false),
            recovering: std::sync::atomic::AtomicBool::new(false),
            writer_at: Mutex::new(None),
            leased,
            owed_seen: Mutex::new(None),
            timing: Timing::default(),
        })
    }

    pub(crate) fn install<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        match &self.pool {
            Some(p) => p.install(f),
            None => f(),
        }
    }

    /// The transport's counters (round trips, bytes, modelled time).
    pub fn counters(&self) -> vectide_remote::CountersSnapshot {
        self.mem.counters().snapshot()
    }

    /// Empties the LRU of sub-HNSWs (a cold start for the next batch).
    pub fn clear_cache(&self) {
        self.cache.lock().clear();
    }

    /// The region's name, once built.
    pub fn region_name(&self) -> Option<String> {
        self.layout.read().as_ref().map(|l| l.name.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::GraphParts;

    fn graph(n: usize) -> Arc<SubGraph> {
        Arc::new(SubGraph::from_parts(&GraphParts {
            dim: 4,
            m: 2,
            m0: 4,
            entry: Some((0, 0)),
            labels: (0..n as u64).collect(),
            flags: vec![0; n],
            levels: vec![0; n],
            vectors: vec![0.5; 4 * n],
            lists: vec![vec![vec![]]; n],
        }))
    }

    #[test]
    fn the_lru_keeps_to_its_count_and_its_byte_budget() {
        let g = graph(10);
        let one = g.memory_bytes();
        // By count: the least recently used goes.
        let mut l = Lru::new(2, None);
        l.put(1, graph(10));
        l.put(2, graph(10));
        assert!(l.get(1).is_some());
        l.put(3, graph(10));
        assert!(l.peek(2).is_none() && l.peek(1).is_some() && l.peek(3).is_some());
        assert_eq!(l.bytes(), 2 * one);
        // By bytes: room for two and a half graphs holds two.
        let mut l = Lru::new(usize::MAX, Some(one * 5 / 2));
        for p in 0..4 {
            l.put(p, graph(10));
            assert!(l.bytes() <= one * 5 / 2);
        }
        assert_eq!((l.len(), l.bytes()), (2, 2 * one));
        assert!(l.peek(3).is_some() && l.peek(2).is_some());
        // Replacing a partition's graph counts it once; a graph larger
        // than the budget is not kept; removal gives the bytes back.
        l.put(3, graph(10));
        assert_eq!(l.bytes(), 2 * one);
        l.put(9, graph(40));
        assert!(l.peek(9).is_none());
        l.remove(3);
        assert_eq!(l.bytes(), one);
        l.clear();
        assert_eq!((l.len(), l.bytes()), (0, 0));
        assert!(Lru::new(0, None).bytes() == 0);
    }
}
