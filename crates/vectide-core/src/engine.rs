//! What an engine tells the rest of Vectide about itself: its
//! [`EngineDescriptor`] (name, parameter schema, search knobs, persistence
//! class, and the functions that create, open, detect and inspect its
//! indexes). Each engine crate exports one; `vectide-engines` lists them in
//! one table, and every front end derives what it knows of engines from
//! that table.

use crate::error::{Error, Result};
use crate::index::VectorIndex;
use crate::limits;
use crate::metric::Metric;
use crate::params::{ParamKind, ParamSpec, Params};
use std::fmt;
use std::path::Path;

/// How an engine's data survives a restart. The database decides replay,
/// snapshots and checkpoints from this class, never from an engine's name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Persistence {
    /// In memory; [`VectorIndex::save`] writes a file that the descriptor's
    /// `open` reads back. A database saves it at each checkpoint and replays
    /// its log after the snapshot's `durable_seq`.
    Volatile,
    /// Lives in a directory; every acknowledged call is durable when it
    /// returns ([`VectorIndex::durable_seq`] follows it).
    DurableOnAck,
    /// Lives in a directory; what was applied is durable after
    /// [`VectorIndex::flush`] (and possibly earlier, at the engine's pace).
    DurableAtFlush,
    /// Lives in a memory node's region (the `memnode` and `region`
    /// parameters), not on the compute node: on a memory node with a
    /// backing file every acknowledged write is durable when it returns,
    /// and [`VectorIndex::flush`] records the compute node's
    /// [`VectorIndex::durable_seq`] in the region (kept per named writer);
    /// on one without, nothing survives the node. Saves and loads a file
    /// like a volatile engine, which is how a database checkpoints it.
    OnMemoryNode,
}

impl Persistence {
    /// Whether the engine lives in a directory (the `path` parameter).
    pub fn in_directory(self) -> bool {
        matches!(
            self,
            Persistence::DurableOnAck | Persistence::DurableAtFlush
        )
    }

    /// Whether the engine's data outlives its process by itself (in a
    /// directory, or on a memory node's backing file): what a crash kit
    /// crashes.
    pub fn durable(self) -> bool {
        self != Persistence::Volatile
    }

    /// Whether a database keeps the engine by saving it at each checkpoint
    /// (and loading the file when it opens) rather than in a directory.
    pub fn saved_by_database(self) -> bool {
        matches!(self, Persistence::Volatile | Persistence::OnMemoryNode)
    }

    pub fn name(self) -> &'static str {
        match self {
            Persistence::Volatile => "volatile (save/load)",
            Persistence::DurableOnAck => "durable on acknowledgement",
            Persistence::DurableAtFlush => "durable at flush",
            Persistence::OnMemoryNode => "durable at flush, on its memory node",
        }
    }
}

impl fmt::Display for Persistence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Where an engine keeps the data its searches read: what a benchmark or
/// a front end asks to pick engines by kind, never by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Medium {
    /// In RAM (a durable engine of this kind logs or snapshots to disk
    /// beside it).
    Ram,
    /// A byte-addressable persistent region (DAX pmem, or a mapped file
    /// standing in for one).
    PersistentMemory,
    /// Blocks on an SSD, read with `O_DIRECT` (RAM holds only what routes
    /// the reads).
    Ssd,
    /// A memory node's region, read with one-sided verbs over the network
    /// (RAM holds only what routes the reads and a cache).
    Remote,
}

impl Medium {
    pub fn name(self) -> &'static str {
        match self {
            Medium::Ram => "ram",
            Medium::PersistentMemory => "pmem",
            Medium::Ssd => "ssd",
            Medium::Remote => "remote",
        }
    }
}

impl fmt::Display for Medium {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A per-query search knob. Each engine declares the knobs it takes and
/// which one is primary (the one a recall/QPS sweep varies).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Knob {
    /// Candidate-list size of a graph search (HNSW's `ef`, Vamana's `L`).
    Ef,
    /// Reads issued per hop of a disk beam search (DiskANN's `W`).
    BeamWidth,
    /// Postings or partitions probed (SPANN, d-HNSW).
    Nprobe,
    /// Candidates re-ranked with full-precision vectors.
    Rerank,
}

impl Knob {
    pub const ALL: [Knob; 4] = [Knob::Ef, Knob::BeamWidth, Knob::Nprobe, Knob::Rerank];

    pub fn name(self) -> &'static str {
        match self {
            Knob::Ef => "ef",
            Knob::BeamWidth => "beam_width",
            Knob::Nprobe => "nprobe",
            Knob::Rerank => "rerank",
        }
    }

    pub fn parse(name: &str) -> Option<Knob> {
        Knob::ALL.into_iter().find(|k| k.name() == name)
    }

    /// Largest value accepted (values arrive from outside).
    pub fn max(self) -> usize {
        match self {
            Knob::Ef | Knob::Rerank => limits::MAX_EF,
            Knob::BeamWidth => limits::MAX_BEAM_WIDTH,
            Knob::Nprobe => limits::MAX_NPROBE,
        }
    }
}

/// Creates an empty index: dimension, metric and parameters already checked
/// against the descriptor's schema (durable engines find their directory
/// in `path`).
pub type CreateFn = fn(usize, Metric, &Params) -> Result<Box<dyn VectorIndex>>;
/// Opens an existing index at a path (a durable engine's directory, a
/// volatile engine's file) with open-time parameters (`threads`, …),
/// recovering it if needed.
pub type OpenFn = fn(&Path, &Params) -> Result<Box<dyn VectorIndex>>;
/// Whether a path holds an index of this engine (reads only headers).
pub type DetectFn = fn(&Path) -> bool;
/// A read-only description of an index, as `(field, value)` rows.
pub type InspectFn = fn(&Path) -> Result<Vec<(String, String)>>;

/// Everything the registry and the front ends know of one engine.
#[derive(Clone, Copy)]
pub struct EngineDescriptor {
    /// The registry name (`hnsw`, `p-hnsw`, …).
    pub name: &'static str,
    /// One line: what it is and where it comes from.
    pub summary: &'static str,
    pub persistence: Persistence,
    /// Where the data its searches read lives.
    pub medium: Medium,
    /// Every parameter it takes, including the common `threads` and (for
    /// engines in a directory) `path`.
    pub params: &'static [ParamSpec],
    /// Parameters that may differ when an existing index is opened (the rest
    /// are fixed when it is created).
    pub open_params: &'static [&'static str],
    /// The search knobs it takes.
    pub knobs: &'static [Knob],
    /// The knob a recall/QPS sweep varies; `None` for exact engines.
    pub primary_knob: Option<Knob>,
    pub create: CreateFn,
    pub open: OpenFn,
    pub detect: DetectFn,
    pub inspect: InspectFn,
}

impl fmt::Debug for EngineDescriptor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EngineDescriptor")
            .field("name", &self.name)
            .field("persistence", &self.persistence)
            .finish()
    }
}

impl EngineDescriptor {
    /// The schema entry of a parameter.
    pub fn param(&self, name: &str) -> Option<&'static ParamSpec> {
        self.params.iter().find(|p| p.name == name)
    }

    /// Checks a knob name against the ones this engine takes.
    pub fn knob(&self, name: &str) -> Result<Knob> {
        match Knob::parse(name) {
            Some(k) if self.knobs.contains(&k) => Ok(k),
            _ => Err(Error::invalid(format!(
                "unknown search knob {name:?} for engine {:?}; it takes: {}",
                self.name,
                if self.knobs.is_empty() {
                    "none (it is exact)".to_string()
                } else {
                    self.knobs
                        .iter()
                        .map(|k| k.name())
                        .collect::<Vec<_>>()
                        .join(", ")
                }
            ))),
        }
    }
}

/// The worker pool of an engine asked for `threads` workers (named
/// `vectide-{name}-{i}`), shared with every engine of the process that asks
/// for the same ([`crate::pools`]); `None` uses rayon's global pool.
pub fn thread_pool(
    name: &'static str,
    threads: Option<usize>,
) -> Result<Option<crate::pools::Pool>> {
    threads.map(|n| pool_of(name, n)).transpose()
}

/// The process's pool of `n` workers named `vectide-{name}-{i}`, for an
/// engine (or one of its phases) that always runs on a pool: engines that
/// ask for the same name and size share it ([`crate::pools`]).
pub fn pool_of(name: &'static str, n: usize) -> Result<crate::pools::Pool> {
    crate::pools::shared(name, n)
}

/// The `threads` parameter every engine takes.
pub const THREADS: ParamSpec = ParamSpec {
    name: "threads",
    kind: ParamKind::Int {
        min: 1,
        max: limits::MAX_THREADS as i64,
    },
    default: "all cores",
    doc: "worker threads of batch calls (a pool of that size, shared with the process's other engines that ask for the same)",
    source: "Vectide",
};

/// The `log` parameter of engines that keep a redo log of their own
/// (`fresh-diskann`, the SPANN family): who logs each write.
pub const LOG: ParamSpec = ParamSpec {
    name: "log",
    kind: ParamKind::Choice(&["own", "database"]),
    default: "own",
    doc: "own: each write is appended to the engine's redo log and synced before the call returns; database: the caller (a Vectide database) logs every write in its commit log and replays that log past durable_seq() after a crash, so the engine writes nothing per call and persists only its checkpoints (frozen temp indexes, snapshots, merges), at its own pace, at flush and at close; set by the database, not stored, given at each open",
    source: "Vectide (one log under the database)",
};

/// Whether checked parameters hand the log to the caller (`log=database`).
pub fn log_is_external(params: &Params) -> bool {
    use crate::params::ParamsExt;
    params.string(LOG.name) == Some("database")
}

/// The `path` parameter of engines that live in a directory.
pub const PATH: ParamSpec = ParamSpec {
    name: "path",
    kind: ParamKind::Path,
    default: "",
    doc: "the index directory (required; created if absent)",
    source: "Vectide",
};
