//! # vectide-storage
//!
//! Where Vectide's bytes live and how they become durable.
//!
//! - [`region`]: [`Region`], a byte-addressable region backed by a
//!   memory-mapped file whose base address never moves (growth extends the
//!   file inside a reserved address range), and the [`Media`] trait that
//!   makes its bytes durable with `persist(range)` + `fence()`:
//!   - [`PmemMedia`]: `clwb` (or `clflushopt` / `clflush`) per cache line and
//!     `sfence`: real persistence on a DAX file system mapped with `MAP_SYNC`;
//!     on `/dev/shm` it is the DRAM emulation the P-HNSW paper used (survives
//!     a process crash, not a power loss);
//!   - [`MsyncMedia`]: the same persistence points turned into `msync` of the
//!     dirty pages, with group commit across threads, for ordinary disks;
//!   - [`SimMedia`]: the crash simulator. It records persists and fences and,
//!     at chosen fences, materialises a post-crash image in which every cache
//!     line not yet persisted-and-fenced is kept, dropped or kept in part at
//!     8-byte granularity (seeded). It ships in release builds so that
//!     `vectide crash-test` can run it.
//!
//! - [`media_for`]: the media of a region under a directory; a crash kit
//!   installs [`SimMedia`] there with [`install_media_override`] (scoped by
//!   directory, so that other threads' engines are unaffected).
//! - [`crashfs`]: [`FileSim`], the crash simulator of ordinary files. It
//!   observes the named sync points (`vectide_core::sync`) under a root
//!   directory and, at chosen ones, writes a post-crash image of the whole
//!   directory (unsynced tails kept, dropped or torn; entries not yet made
//!   durable by a directory sync drawn). It ships in release builds too.
//! - [`durable`]: the durable-engine kit: sealed manifest and snapshot
//!   envelopes, the one log record codec, the redo log, recovery by replay.
//! - [`block`]: aligned block files for the disk-resident indexes, behind
//!   the [`BlockFile`] trait: [`DirectFile`] (`O_DIRECT`, batched reads
//!   through io_uring, `pread` where the kernel refuses it) and
//!   [`SimBlockFile`] (in memory; at chosen sync points a crash image where
//!   every unsynced block is kept, dropped or torn at 512-byte sectors).
//!
//! Engines call the same code on every media: no code path exists only in
//! tests. Every `persist` and `fence` names its call [`Site`], so that the
//! simulator can disable one site at a time (the mutation check of the crash
//! tests) and count persistence work per operation.

pub mod block;
pub mod crashfs;
pub mod durable;
pub mod media;
pub mod region;
pub mod wal;

pub use block::{
    AlignedBuf, BlockCrashImage, BlockFate, BlockFile, DirectFile, IoStats, ReadReq, SimBlockFile,
    BLOCK,
};
pub use crashfs::{
    scratch_dir, scratch_root, FileCrashImage, FileSim, FileSimConfig, FileSimReport,
};
pub use media::{
    install_media_override, media_for, CrashImage, Media, MediaGuard, MsyncMedia, PmemMedia,
    SimConfig, SimMedia, SimReport, SplitMix,
};
pub use region::{PersistMode, Region, Site};
pub use wal::{Pending, Wal};
