//! [`PmemMedia`]: cache-line write-back + store fence.

use super::{Media, LINE};
use crate::region::Site;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

/// The flush instruction the CPU offers, best first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flush {
    /// `clwb`: writes the line back and may keep it cached.
    Clwb,
    /// `clflushopt`: writes back and evicts, weakly ordered.
    ClflushOpt,
    /// `clflush`: writes back and evicts, strongly ordered.
    Clflush,
    /// No flush instruction (non-x86): only a fence; persistence then relies
    /// on the platform (eADR-like) or is emulated.
    None,
}

impl Flush {
    fn detect() -> Flush {
        #[cfg(target_arch = "x86_64")]
        {
            // cpuid is available on every x86_64 CPU; leaf 7 exists when the
            // max leaf (leaf 0, eax) is >= 7.
            let l0 = std::arch::x86_64::__cpuid(0);
            let max_leaf = l0.eax;
            let ebx7 = if max_leaf >= 7 {
                std::arch::x86_64::__cpuid_count(7, 0).ebx
            } else {
                0
            };
            if max_leaf >= 7 && ebx7 & (1 << 24) != 0 {
                return Flush::Clwb;
            }
            if max_leaf >= 7 && ebx7 & (1 << 23) != 0 {
                return Flush::ClflushOpt;
            }
            Flush::Clflush
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            Flush::None
        }
    }
}

/// Persistence by `clwb`/`clflushopt`/`clflush` per cache line and `sfence`.
///
/// Real persistence needs a DAX file system mapped with `MAP_SYNC` (the
/// regions ask for it and fall back when it is refused). On `/dev/shm` this
/// is the DRAM emulation the P-HNSW paper measured with: the same
/// instructions, surviving a process crash but not a power loss;
/// [`Media::kind`] then says `pmem-emulated`.
#[derive(Debug)]
pub struct PmemMedia {
    flush: Flush,
    /// 0 = no region mapped yet, 1 = every mapping had MAP_SYNC, 2 = some did not.
    dax: AtomicU8,
    any: AtomicBool,
}

impl Default for PmemMedia {
    fn default() -> Self {
        Self::new()
    }
}

impl PmemMedia {
    /// Detects the flush instruction once.
    pub fn new() -> Self {
        PmemMedia {
            flush: Flush::detect(),
            dax: AtomicU8::new(0),
            any: AtomicBool::new(false),
        }
    }

    /// The flush instruction in use.
    pub fn flush_instruction(&self) -> Flush {
        self.flush
    }
}

#[cfg(target_arch = "x86_64")]
#[inline]
fn flush_line(kind: Flush, p: *const u8) {
    // SAFETY: the flush instructions take any address mapped in the process
    // (they never fault on a mapped line and do not modify memory); callers
    // pass lines of an attached region. The instruction was detected by cpuid.
    unsafe {
        match kind {
            Flush::Clwb => {
                std::arch::asm!("clwb [{0}]", in(reg) p, options(nostack, preserves_flags))
            }
            Flush::ClflushOpt => {
                std::arch::asm!("clflushopt [{0}]", in(reg) p, options(nostack, preserves_flags))
            }
            Flush::Clflush => std::arch::x86_64::_mm_clflush(p),
            Flush::None => {}
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
#[inline]
fn flush_line(_kind: Flush, _p: *const u8) {}

impl Media for PmemMedia {
    fn kind(&self) -> &'static str {
        if self.dax.load(Ordering::Relaxed) == 1 {
            "pmem"
        } else {
            "pmem-emulated"
        }
    }

    #[inline]
    fn persist(&self, _site: Site, addr: *const u8, len: usize) {
        if len == 0 {
            return;
        }
        let start = addr as usize & !(LINE - 1);
        let end = addr as usize + len;
        let mut p = start;
        while p < end {
            flush_line(self.flush, p as *const u8);
            p += LINE;
        }
    }

    #[inline]
    fn fence(&self, _site: Site) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: sfence has no operands and no memory-safety preconditions.
        unsafe {
            std::arch::x86_64::_mm_sfence()
        };
        #[cfg(not(target_arch = "x86_64"))]
        std::sync::atomic::fence(Ordering::SeqCst);
    }

    fn attach(&self, _name: &str, _base: *mut u8, _len: usize) -> u32 {
        0
    }

    fn grown(&self, _id: u32, _new_len: usize) {}

    fn detach(&self, _id: u32) {}

    fn wants_map_sync(&self) -> bool {
        true
    }

    fn note_map_sync(&self, ok: bool) {
        let first = !self.any.swap(true, Ordering::Relaxed);
        let v = if ok { 1 } else { 2 };
        if first {
            self.dax.store(v, Ordering::Relaxed);
        } else if !ok {
            self.dax.store(2, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flushes_and_fences_on_real_memory() {
        // The instructions must run on ordinary memory without faulting,
        // including unaligned ranges that straddle lines.
        let m = PmemMedia::new();
        let buf = vec![7u8; 1000];
        m.persist(Site("t"), buf.as_ptr().wrapping_add(3), 200);
        m.persist(Site("t"), buf.as_ptr(), 0);
        m.fence(Site("t"));
        assert_eq!(buf[500], 7);
        #[cfg(target_arch = "x86_64")]
        assert_ne!(m.flush_instruction(), Flush::None);
        assert_eq!(
            m.kind(),
            "pmem-emulated",
            "no region mapped with MAP_SYNC yet"
        );
    }
}
