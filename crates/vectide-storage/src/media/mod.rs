//! The [`Media`] trait and its three implementations: [`PmemMedia`],
//! [`MsyncMedia`] and the crash simulator [`SimMedia`]; [`media_for`], the
//! media of a region's directory, which a crash kit overrides with
//! [`install_media_override`].

mod msync;
mod pmem;
mod scoped;
mod sim;

pub use msync::MsyncMedia;
pub use pmem::PmemMedia;
pub use scoped::{install_media_override, media_for, MediaGuard};
pub(crate) use sim::next as rng_next;
pub use sim::{CrashImage, SimConfig, SimMedia, SimReport, SplitMix};

use crate::region::{PersistMode, Site};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// How the bytes of one or more [`crate::Region`]s become durable.
///
/// `persist` starts writing a byte range back; `fence` returns once every
/// range persisted before it, in any region attached to this media, is
/// durable. A fence orders: a store issued after it cannot become durable
/// before the ranges persisted before it.
pub trait Media: Send + Sync {
    /// `"pmem"`, `"pmem-emulated"`, `"msync"` or `"sim"`.
    fn kind(&self) -> &'static str;
    /// Starts writing `len` bytes at `addr` back to the media.
    fn persist(&self, site: Site, addr: *const u8, len: usize);
    /// Waits until everything persisted before is durable.
    fn fence(&self, site: Site);
    /// Called by a region when it maps a file; returns an id for the region.
    fn attach(&self, name: &str, base: *mut u8, len: usize) -> u32;
    /// Called by a region after its file grew.
    fn grown(&self, id: u32, new_len: usize);
    /// Called by a region before it unmaps.
    fn detach(&self, id: u32);
    /// Called by a region whose file was renamed (a file made durable
    /// under a temporary name, then moved into place): `name` is its new
    /// file name.
    fn renamed(&self, _id: u32, _name: &str) {}
    /// Whether regions should ask for `MAP_SYNC` (DAX persistence).
    fn wants_map_sync(&self) -> bool {
        false
    }
    /// Tells the media whether a `MAP_SYNC` mapping succeeded.
    fn note_map_sync(&self, _ok: bool) {}
}

/// Builds the media of a persistence mode.
pub fn for_mode(mode: PersistMode) -> Arc<dyn Media> {
    match mode {
        PersistMode::Pmem => Arc::new(PmemMedia::new()),
        PersistMode::Msync => Arc::new(MsyncMedia::new()),
    }
}

/// Copies bytes at `src` into `out` with relaxed atomic loads (8 bytes at a
/// time where aligned), so that reading memory other threads may be writing
/// is not a data race.
pub(crate) fn read_racy(src: *const u8, out: &mut [u8]) {
    let mut i = 0;
    let n = out.len();
    while i < n {
        let p = src.wrapping_add(i);
        if (p as usize).is_multiple_of(8) && i + 8 <= n {
            // SAFETY: `p` is 8-aligned and inside a live mapping (callers pass
            // ranges of an attached region); an atomic load never races.
            let w = unsafe { (*(p as *const AtomicU64)).load(Ordering::Relaxed) };
            out[i..i + 8].copy_from_slice(&w.to_le_bytes());
            i += 8;
        } else {
            // SAFETY: as above, one byte; AtomicU8 has the layout of u8.
            out[i] =
                unsafe { (*(p as *const std::sync::atomic::AtomicU8)).load(Ordering::Relaxed) };
            i += 1;
        }
    }
}

/// Cache-line size assumed by every media and format.
pub const LINE: usize = 64;
