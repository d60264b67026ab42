//! Parameters of the `d-hnsw` engine and their schema. The defaults follow
//! the d-HNSW authors' code and slides (`../shared/seeds/001_*`, issue 36):
//! about 6,250 points per partition (K = 160 for SIFT1M), 5 partitions
//! probed, efSearch 48, an LRU of K/20 sub-HNSWs, doorbell chains of at
//! most K/10 READs.

use vectide_core::engine::THREADS;
use vectide_core::params::check_params;
use vectide_core::{limits, Error, ParamKind, ParamSpec, ParamValue, Params, ParamsExt, Result};
use vectide_graph::hnsw_params::{EF_CONSTRUCTION, M, SEED};

/// How a search fetches partitions from the memory node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fetch {
    /// Uncached partitions of a batch in doorbell chains of READs (one
    /// round trip per chain).
    Doorbell,
    /// One round trip per partition (the paper's baseline without doorbell
    /// batching).
    NoDoorbell,
    /// Every node a search visits fetched by a READ of its own (the
    /// paper's naive baseline).
    Naive,
}

impl Fetch {
    pub const NAMES: [&'static str; 3] = ["doorbell", "no-doorbell", "naive"];

    pub fn parse(s: &str) -> Option<Fetch> {
        match s {
            "doorbell" => Some(Fetch::Doorbell),
            "no-doorbell" => Some(Fetch::NoDoorbell),
            "naive" => Some(Fetch::Naive),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Fetch::Doorbell => "doorbell",
            Fetch::NoDoorbell => "no-doorbell",
            Fetch::Naive => "naive",
        }
    }
}

const fn spec(
    name: &'static str,
    kind: ParamKind,
    default: &'static str,
    doc: &'static str,
    source: &'static str,
) -> ParamSpec {
    ParamSpec {
        name,
        kind,
        default,
        doc,
        source,
    }
}

/// Every parameter `d-hnsw` takes.
pub static PARAMS: [ParamSpec; 21] = [
    THREADS,
    spec(
        "memnode",
        ParamKind::Text,
        "in-process",
        "the memory node, HOST:PORT (`vectide memnode`); file:PATH: a memory node inside this process keeping its regions in the backing file PATH (as `vectide memnode --backing PATH`); absent: a memory node inside this process that keeps nothing (tests, the demo)",
        "d-HNSW: partitions live in a remote memory node",
    ),
    spec(
        "writer",
        ParamKind::Text,
        "none",
        "this compute node's name among the region's writers: its durable_seq is kept in the region's writer table at each flush and read back when a node of that name attaches (none: kept in this process only, 0 at each attach)",
        "issue 37: each compute node its own sequence space and durable_seq",
    ),
    spec(
        "region",
        ParamKind::Text,
        "auto",
        "the region's name on the memory node (auto: a new unique name, given back to the node when the index closes, or `index` on a memnode file:PATH; a named region is kept)",
        "regions are registered by name, as RDMA memory regions are",
    ),
    spec(
        "lease",
        ParamKind::Text,
        "none",
        "take the region's lease for this owner (a database): one owner at a time writes a leased region, another is refused with an error naming it until the lease goes unrenewed for 6 x timeout_ms; the same owner reopening takes it back at once (none: no lease; a leased region is then read-only)",
        "issue 37: a database collection leases its region",
    ),
    spec(
        "timeout_ms",
        ParamKind::Int { min: 1, max: 600_000 },
        "10000",
        "a memory node that does not answer within this is unavailable (a transient error)",
        "issue 36: a timeout, 10 s by default, never a hang",
    ),
    spec(
        "partitions",
        ParamKind::Int { min: 0, max: 1_000_000 },
        "auto",
        "partitions K (0 or absent: ceil(N / partition_points) at the first build, and again whenever the live count calls for twice the partitions there are)",
        "the authors' code: K = 160 for SIFT1M, 120 for GIST1M",
    ),
    spec(
        "partition_points",
        ParamKind::Int { min: 1, max: 100_000_000 },
        "6250",
        "points per partition when K is auto",
        "K = 160 for SIFT1M is N / 6,250",
    ),
    M,
    EF_CONSTRUCTION,
    spec(
        "ef_search",
        ParamKind::Int { min: 1, max: limits::MAX_EF as i64 },
        "48",
        "default candidate-list size of a sub-HNSW search",
        "the authors' efSearch 48",
    ),
    spec(
        "probe",
        ParamKind::Int { min: 1, max: limits::MAX_NPROBE as i64 },
        "5",
        "partitions a query searches (the meta-HNSW's top b); the nprobe knob overrides it",
        "the authors' b = 5",
    ),
    spec(
        "cache_partitions",
        ParamKind::Int { min: -1, max: 1_000_000 },
        "auto",
        "sub-HNSWs the compute node's LRU holds (-1 or absent: ceil(K / 20); 0: none)",
        "the authors' LRU of K/20",
    ),
    spec(
        "cache_bytes",
        ParamKind::Int { min: 0, max: 1 << 50 },
        "0",
        "a RAM budget for the LRU's sub-HNSWs in bytes (0: none; when given without cache_partitions, the budget alone bounds the LRU)",
        "issue 36: an LRU of K/20 sub-HNSWs, or a RAM budget",
    ),
    spec(
        "doorbell_reads",
        ParamKind::Int { min: 0, max: 4096 },
        "auto",
        "READs per doorbell chain (0 or absent: max(1, K / 10))",
        "the authors' chains of at most K/10",
    ),
    spec(
        "fetch",
        ParamKind::Choice(&Fetch::NAMES),
        "doorbell",
        "doorbell | no-doorbell (a round trip per partition) | naive (a READ per visited node)",
        "the slides' Tables 1-2 baselines",
    ),
    spec(
        "pipeline",
        ParamKind::Bool,
        "true",
        "overlap fetching the next partitions with searching the fetched ones",
        "the 2026 paper's three-stage pipeline",
    ),
    spec(
        "gap",
        ParamKind::Float { min: 0.0, max: 16.0 },
        "0.25",
        "overflow room per partition for inserts, as a fraction of its points (shared per pair)",
        "the slides' layout: one shared gap per pair of sub-HNSWs",
    ),
    SEED,
    spec(
        "net_latency_us",
        ParamKind::Float { min: 0.0, max: 1e6 },
        "3",
        "the network model's latency per round trip (microseconds)",
        "an RDMA round trip on the slides' ConnectX testbed",
    ),
    spec(
        "net_gbps",
        ParamKind::Float { min: 0.001, max: 1e4 },
        "100",
        "the network model's bandwidth (Gb/s)",
        "100 Gb/s RDMA",
    ),
];

/// The `memnode` value (and default) for a memory node inside this process.
pub const IN_PROCESS: &str = "in-process";

/// The region an index on a memory node inside this process with a backing
/// file (`memnode = file:PATH`) lives in when `region` is auto.
pub const FILE_REGION: &str = "index";

/// Parameters that may change when an index is opened again.
pub const OPEN_PARAMS: &[&str] = &[
    "threads",
    "memnode",
    "region",
    "writer",
    "lease",
    "timeout_ms",
    "ef_search",
    "probe",
    "cache_partitions",
    "cache_bytes",
    "doorbell_reads",
    "fetch",
    "pipeline",
    "net_latency_us",
    "net_gbps",
];

/// Parameters of a d-HNSW index.
#[derive(Debug, Clone, PartialEq)]
pub struct DhnswParams {
    pub threads: Option<usize>,
    pub memnode: Option<String>,
    pub region: Option<String>,
    pub writer: Option<String>,
    pub lease: Option<String>,
    pub timeout_ms: u64,
    pub partitions: Option<usize>,
    pub partition_points: usize,
    pub m: usize,
    pub ef_construction: usize,
    pub ef_search: usize,
    pub probe: usize,
    pub cache_partitions: Option<usize>,
    pub cache_bytes: Option<usize>,
    pub doorbell_reads: Option<usize>,
    pub fetch: Fetch,
    pub pipeline: bool,
    pub gap: f64,
    pub seed: u64,
    pub net_latency_us: f64,
    pub net_gbps: f64,
}

impl Default for DhnswParams {
    fn default() -> Self {
        DhnswParams {
            threads: None,
            memnode: None,
            region: None,
            writer: None,
            lease: None,
            timeout_ms: 10_000,
            partitions: None,
            partition_points: 6250,
            m: 16,
            ef_construction: 200,
            ef_search: 48,
            probe: 5,
            cache_partitions: None,
            cache_bytes: None,
            doorbell_reads: None,
            fetch: Fetch::Doorbell,
            pipeline: true,
            gap: 0.25,
            seed: 0x5eed_ec7d,
            net_latency_us: 3.0,
            net_gbps: 100.0,
        }
    }
}

fn bool_of(p: &Params, name: &str) -> Option<bool> {
    match p.get(name) {
        Some(ParamValue::Bool(b)) => Some(*b),
        _ => None,
    }
}

impl DhnswParams {
    pub fn from_params(p: &Params) -> Result<Self> {
        check_params("d-hnsw", &PARAMS, p)?;
        let d = DhnswParams::default();
        let out = DhnswParams {
            threads: p.usize("threads"),
            memnode: p
                .string("memnode")
                .filter(|m| *m != IN_PROCESS)
                .map(str::to_string),
            region: p
                .string("region")
                .filter(|r| *r != "auto")
                .map(str::to_string),
            writer: p
                .string("writer")
                .filter(|w| *w != "none")
                .map(str::to_string),
            lease: p
                .string("lease")
                .filter(|w| *w != "none")
                .map(str::to_string),
            timeout_ms: p.int("timeout_ms").map_or(d.timeout_ms, |v| v as u64),
            partitions: p.usize("partitions").filter(|&k| k > 0),
            partition_points: p.usize("partition_points").unwrap_or(d.partition_points),
            m: p.usize("m").unwrap_or(d.m),
            ef_construction: p.usize("ef_construction").unwrap_or(d.ef_construction),
            ef_search: p.usize("ef_search").unwrap_or(d.ef_search),
            probe: p.usize("probe").unwrap_or(d.probe),
            cache_partitions: p.usize("cache_partitions"),
            cache_bytes: p.usize("cache_bytes").filter(|&b| b > 0),
            doorbell_reads: p.usize("doorbell_reads").filter(|&d| d > 0),
            fetch: p.string("fetch").and_then(Fetch::parse).unwrap_or(d.fetch),
            pipeline: bool_of(p, "pipeline").unwrap_or(d.pipeline),
            gap: p.float("gap").unwrap_or(d.gap),
            seed: p.int("seed").map_or(d.seed, |v| v as u64),
            net_latency_us: p.float("net_latency_us").unwrap_or(d.net_latency_us),
            net_gbps: p.float("net_gbps").unwrap_or(d.net_gbps),
        };
        if let Some(t) = out.threads {
            limits::check_threads(t)?;
        }
        if out.m < 2 {
            return Err(Error::invalid("d-hnsw: m must be at least 2"));
        }
        for (what, v, max) in [("writer", &out.writer, 255), ("lease", &out.lease, 255)] {
            if let Some(w) = v {
                if w.is_empty() || w.len() > max {
                    return Err(Error::invalid(format!(
                        "d-hnsw: {what} must be a name of 1 to {max} bytes, got {} bytes",
                        w.len()
                    )));
                }
            }
        }
        let mut out = out;
        if let Some(f) = out.backing_file() {
            if f.as_os_str().is_empty() {
                return Err(Error::invalid(
                    "d-hnsw: memnode file: needs a path (file:PATH)",
                ));
            }
            // Kept in the file: a name the next open finds it by.
            if out.lease.is_none() {
                out.region.get_or_insert_with(|| FILE_REGION.to_string());
            }
        }
        // A leased index (a database collection) lives in a region named
        // after its owner, which its next open finds, and keeps its
        // durable point under the owner's name.
        if let Some(owner) = &out.lease {
            out.region.get_or_insert_with(|| format!("leased:{owner}"));
            out.writer.get_or_insert_with(|| owner.clone());
        }
        Ok(out)
    }

    /// The backing file of a memory node inside this process
    /// (`memnode = file:PATH`).
    pub fn backing_file(&self) -> Option<std::path::PathBuf> {
        self.memnode
            .as_deref()
            .and_then(|m| m.strip_prefix("file:"))
            .map(std::path::PathBuf::from)
    }

    /// Only the parameters an open may change, from `p` over `self`.
    pub fn reopened(&self, p: &Params) -> Result<Self> {
        check_params("d-hnsw", &PARAMS, p)?;
        if let Some(k) = p.keys().find(|k| !OPEN_PARAMS.contains(&k.as_str())) {
            return Err(Error::invalid(format!(
                "d-hnsw: parameter {k} is fixed when the index is built; an open may change: {}",
                OPEN_PARAMS.join(", ")
            )));
        }
        let mut merged = self.to_params();
        for (k, v) in p {
            merged.insert(k.clone(), v.clone());
        }
        Self::from_params(&merged)
    }

    /// The partitions' count for `n` points.
    pub fn k_for(&self, n: usize) -> usize {
        self.partitions
            .unwrap_or_else(|| n.div_ceil(self.partition_points))
            .clamp(1, n.max(1))
    }

    /// Sub-HNSWs the LRU holds for `k` partitions (no count bound when
    /// only a RAM budget was given).
    pub fn cache_for(&self, k: usize) -> usize {
        match (self.cache_partitions, self.cache_bytes) {
            (Some(c), _) => c,
            (None, Some(_)) => usize::MAX,
            (None, None) => k.div_ceil(20),
        }
    }

    /// The LRU for `k` partitions: [`cache_for`](Self::cache_for) graphs
    /// within the RAM budget, if any.
    pub fn cache(&self, k: usize) -> crate::state::Lru {
        crate::state::Lru::new(self.cache_for(k), self.cache_bytes)
    }

    /// READs per doorbell chain for `k` partitions.
    pub fn chain_for(&self, k: usize) -> usize {
        self.doorbell_reads.unwrap_or((k / 10).max(1))
    }

    pub fn to_params(&self) -> Params {
        let mut p = Params::new();
        let mut put = |k: &str, v: ParamValue| {
            p.insert(k.to_string(), v);
        };
        put(
            "threads",
            ParamValue::Int(self.threads.unwrap_or_else(rayon::current_num_threads) as i64),
        );
        put(
            "memnode",
            ParamValue::Str(self.memnode.clone().unwrap_or_else(|| IN_PROCESS.into())),
        );
        put(
            "region",
            ParamValue::Str(self.region.clone().unwrap_or_else(|| "auto".into())),
        );
        put(
            "writer",
            ParamValue::Str(self.writer.clone().unwrap_or_else(|| "none".into())),
        );
        put(
            "lease",
            ParamValue::Str(self.lease.clone().unwrap_or_else(|| "none".into())),
        );
        put("timeout_ms", ParamValue::Int(self.timeout_ms as i64));
        put(
            "partitions",
            ParamValue::Int(self.partitions.unwrap_or(0) as i64),
        );
        put(
            "partition_points",
            ParamValue::Int(self.partition_points as i64),
        );
        put("m", ParamValue::Int(self.m as i64));
        put(
            "ef_construction",
            ParamValue::Int(self.ef_construction as i64),
        );
        put("ef_search", ParamValue::Int(self.ef_search as i64));
        put("probe", ParamValue::Int(self.probe as i64));
        put(
            "cache_partitions",
            ParamValue::Int(self.cache_partitions.map_or(-1, |c| c as i64)),
        );
        put(
            "cache_bytes",
            ParamValue::Int(self.cache_bytes.unwrap_or(0) as i64),
        );
        put(
            "doorbell_reads",
            ParamValue::Int(self.doorbell_reads.unwrap_or(0) as i64),
        );
        put("fetch", ParamValue::Str(self.fetch.name().into()));
        put("pipeline", ParamValue::Bool(self.pipeline));
        put("gap", ParamValue::Float(self.gap));
        put("seed", ParamValue::Int(self.seed as i64));
        put("net_latency_us", ParamValue::Float(self.net_latency_us));
        put("net_gbps", ParamValue::Float(self.net_gbps));
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vectide_core::params::params_of;

    #[test]
    fn defaults_round_trip_and_open_changes_only_open_params() {
        let d = DhnswParams::from_params(&Params::new()).unwrap();
        assert_eq!(d, DhnswParams::default());
        let back = DhnswParams::from_params(&d.to_params()).unwrap();
        assert!(back.threads.is_some(), "the pool's size is reported");
        assert_eq!(
            DhnswParams {
                threads: None,
                ..back
            },
            d
        );
        assert_eq!((d.k_for(1_000_000), d.k_for(10), d.k_for(0)), (160, 1, 1));
        assert_eq!(
            (d.cache_for(160), d.chain_for(160), d.chain_for(5)),
            (8, 16, 1)
        );
        let o = d
            .reopened(&params_of([("fetch", ParamValue::Str("naive".into()))]))
            .unwrap();
        assert_eq!(o.fetch, Fetch::Naive);
        assert!(d.reopened(&params_of([("m", ParamValue::Int(8))])).is_err());
        for bad in [
            params_of([("fetch", ParamValue::Str("rdma".into()))]),
            params_of([("memnode", ParamValue::Str(String::new()))]),
            params_of([("probe", ParamValue::Int(0))]),
        ] {
            assert!(DhnswParams::from_params(&bad).is_err(), "{bad:?}");
        }
    }
}
