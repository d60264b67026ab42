//! # vectide-spfresh
//!
//! SPFresh (Xu et al., SOSP 2023): a SPANN cluster index on SSD kept
//! balanced in place by LIRE. This crate grows in steps; so far:
//!
//! - [`layout`]: the bytes of the block store (`docs/format-blockstore.md`):
//!   the header block, data blocks sealed by a CRC and naming their posting
//!   and write gen, posting records `vid ‖ version ‖ vector`, and the
//!   encoded mapping a snapshot holds;
//! - [`blockstore`]: the Block Controller (§4.3): postings in 4 KiB blocks
//!   of one `O_DIRECT` file, GET / ParallelGET (one batch of reads through
//!   io_uring), APPEND (read-modify-write of the last block only, into a
//!   fresh block, the mapping entry swapped by CAS), PUT, and released blocks
//!   held back until the next snapshot is durable (§4.4);
//! - [`versions`]: the version map (§4.2.1), a byte per vector (7-bit
//!   reassign version, delete bit) updated by compare-and-swap;
//! - [`builder`]: SPANN's replica rule (boundary vectors in up to 8
//!   postings, RNG-pruned).

#![deny(clippy::undocumented_unsafe_blocks)]

pub mod blockstore;
pub mod builder;
pub mod layout;
pub mod versions;

pub use blockstore::{BlockStore, ReadScratch, StoreStats, Swap};
pub use layout::{encode_record, Records};
pub use versions::VersionMap;
