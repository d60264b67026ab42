//! Remote memory for d-HNSW: one-sided verbs over a transport that could be
//! RDMA and here is TCP.
//!
//! A **memory node** owns named **regions** of bytes within its size and
//! serves verbs on them without ever parsing what they hold. A compute node
//! talks to it through [`RemoteMemory`]:
//!
//! - control verbs (registration, not one-sided): [`RemoteMemory::create_region`],
//!   [`RemoteMemory::open_region`], [`RemoteMemory::drop_region`], [`RemoteMemory::regions`];
//! - one-sided verbs, posted as **work requests** ([`Verb`]): READ(offset,
//!   len), WRITE(offset, bytes), CAS and FETCH_ADD on 8-byte-aligned words;
//! - a **doorbell** ([`RemoteMemory::post`]) is a chain of work requests sent
//!   in one frame and answered by one frame: one round trip, however many
//!   requests. The requests run in order; after one fails, the rest are not
//!   run ("flushed", as an RDMA queue pair flushes its work requests after an
//!   error).
//!
//! Every transport counts exactly ([`Counters`]): round trips, work requests,
//! and the frame bytes each way; and advances a virtual clock by a
//! [`NetModel`] (latency + bytes / bandwidth per round trip, 3 µs and
//! 100 Gb/s by default, after RDMA), so figures can be given both under the
//! model and as wall time on loopback TCP.
//!
//! Files: [`verbs`] (work requests and completions), [`frame`] (the wire
//! codec, `docs/protocol-memnode.md`), [`regions`] (the memory node's
//! store), [`backing`] (its backing file, `docs/format-memnode-backing.md`), [`model`] (counters and the network model), [`local`] (the
//! in-process transport, for unit tests), [`tcp`] (the TCP transport), and
//! [`node`] (the memory node's server).

pub mod backing;
pub mod client;
pub mod frame;
pub mod local;
pub mod model;
pub mod node;
pub mod regions;
pub mod tcp;
pub mod verbs;

pub use local::LocalMemory;
pub use model::{Counters, CountersSnapshot, NetModel};
pub use node::{MemoryNode, NodeLimits};
pub use regions::Regions;
pub use tcp::{TcpMemory, TcpOptions};
/// The name of a persistence call (a FLUSH's site; see [`Verb::Flush`]).
pub use vectide_storage::Site;
pub use verbs::{is_unknown_region, Completion, Region, RegionInfo, Status, Verb};

use vectide_core::Result;

/// What a compute node can do with a memory node (see the crate docs).
/// Implementations: [`TcpMemory`] (between processes; every figure goes
/// through it) and [`LocalMemory`] (in process, for unit tests). An RDMA
/// (ibverbs) backend would be a third, with no change to its callers.
pub trait RemoteMemory: Send + Sync {
    /// Creates a region of `size` zeroed bytes named `name`; an existing
    /// name is an error.
    fn create_region(&self, name: &str, size: u64) -> Result<Region>;
    /// Opens an existing region by name.
    fn open_region(&self, name: &str) -> Result<Region>;
    /// Removes a region and gives its bytes back to the node's budget.
    fn drop_region(&self, name: &str) -> Result<()>;
    /// The node's regions and its size budget.
    fn regions(&self) -> Result<(Vec<RegionInfo>, NodeSize)>;
    /// Rings one doorbell: the chain `wrs` in one round trip. One
    /// completion per work request, in order.
    fn post(&self, wrs: &[Verb]) -> Result<Vec<Completion>>;
    /// The transport's counters (shared by its clones).
    fn counters(&self) -> &Counters;
    /// The node's boot number, as it greeted this transport's newest
    /// connection: a node with a backing file counts its starts on that
    /// file (1, 2, …), so a change tells a compute node that the node
    /// restarted and serves what it held at its last FLUSH (locks held
    /// then belong to writes that failed); 0 for a node that keeps nothing
    /// across a restart.
    fn boot(&self) -> u64 {
        0
    }

    /// READ `len` bytes at `offset` (one round trip).
    fn read(&self, region: Region, offset: u64, len: u32) -> Result<Vec<u8>> {
        let mut c = self.post(&[Verb::Read {
            region: region.id,
            offset,
            len,
        }])?;
        c.pop().expect("one completion").into_data()
    }
    /// WRITE `bytes` at `offset` (one round trip).
    fn write(&self, region: Region, offset: u64, bytes: &[u8]) -> Result<()> {
        let mut c = self.post(&[Verb::Write {
            region: region.id,
            offset,
            bytes: bytes.to_vec(),
        }])?;
        c.pop().expect("one completion").into_done()
    }
    /// Compare-and-swap of the aligned word at `offset`: returns the word
    /// found (the swap happened if it equals `expect`).
    fn cas(&self, region: Region, offset: u64, expect: u64, new: u64) -> Result<u64> {
        let mut c = self.post(&[Verb::Cas {
            region: region.id,
            offset,
            expect,
            new,
        }])?;
        c.pop().expect("one completion").into_word()
    }
    /// FLUSH `len` bytes at `offset`: durable on a node with a backing file
    /// once it returns (one round trip).
    fn flush(&self, region: Region, offset: u64, len: u64) -> Result<()> {
        let mut c = self.post(&[Verb::Flush {
            region: region.id,
            offset,
            len,
            site: backing::SITE_FLUSH,
        }])?;
        c.pop().expect("one completion").into_done()
    }
    /// Fetch-and-add on the aligned word at `offset`: returns the word
    /// before the add (wrapping).
    fn fetch_add(&self, region: Region, offset: u64, add: u64) -> Result<u64> {
        let mut c = self.post(&[Verb::FetchAdd {
            region: region.id,
            offset,
            add,
        }])?;
        c.pop().expect("one completion").into_word()
    }
}

/// A memory node's size budget: bytes it may hand out, bytes in regions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeSize {
    pub capacity: u64,
    pub used: u64,
}
