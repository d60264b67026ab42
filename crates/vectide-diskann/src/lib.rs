//! # vectide-diskann
//!
//! FreshDiskANN's disk side (Singh et al., 2021, §5; DiskANN, Subramanya et
//! al., NeurIPS 2019, §3): the SSD-resident **long-term index** (LTI).
//!
//! - [`layout`]: the bytes (`docs/format-lti.md`): a header sector, node
//!   records (full-precision vector, label, neighbour ids) packed into
//!   4 KiB sectors with a CRC each, and the PQ file beside it;
//! - [`lti`]: writing an LTI from a graph (`fresh-vamana`'s export), opening
//!   one (PQ codes in RAM), the node cache near the start node, and the
//!   beam search (W sector reads per hop as one batch, PQ distances for
//!   routing, exact re-ranking of expanded nodes) with per-query stats.
//!
//! The `fresh-diskann` engine (RW/RO temp indexes, the DeleteList,
//! StreamingMerge, the redo log) is built on these in later steps.

#![deny(clippy::undocumented_unsafe_blocks)]

pub mod layout;
pub mod lti;
pub mod merge;

pub use layout::Header;
pub use lti::{GraphSource, Lti, QueryStats, Scratch};
