//! Zero-initialised arrays in memory backed by transparent huge pages.
//!
//! A graph search touches a few hundred vectors and lists per query, each on
//! a page of its own: with 4 KiB pages nearly every one of those reads also
//! misses the TLB, and the page walk sits on the query's critical path (a
//! 390K × 50-d index holds 100 MB of vectors, the TLBs cover a few MB). Large
//! arrays of the in-memory stores are therefore mapped anonymously and
//! advised `MADV_HUGEPAGE` before their first touch, so that on a kernel
//! with transparent huge pages in `madvise` or `always` mode they are faulted
//! in as 2 MiB pages; elsewhere (THP off, other systems, small arrays) they
//! are ordinary zeroed heap memory and everything works the same, only
//! slower. [`HugeArray::huge_bytes`] reports what the kernel granted.
//!
//! Only types whose all-zero bit pattern is a valid value and that need no
//! drop ([`Zeroable`]) can be held: anonymous mappings start zeroed, and the
//! array never runs destructors.

use std::alloc::Layout;
use std::ptr::NonNull;

/// Types for which all-zero bytes are a valid value and which have no drop
/// glue.
///
/// # Safety
/// Implementors guarantee both properties.
pub unsafe trait Zeroable {}

// SAFETY: zero is a valid value of each of these, and none has drop glue.
unsafe impl Zeroable for u8 {}
// SAFETY: as above.
unsafe impl Zeroable for u32 {}
// SAFETY: as above.
unsafe impl Zeroable for u64 {}
// SAFETY: as above (0.0).
unsafe impl Zeroable for f32 {}
// SAFETY: as above (the atomics are `repr(transparent)`-like wrappers of their
// integer, zero-initialised by all-zero bytes).
unsafe impl Zeroable for std::sync::atomic::AtomicU8 {}
// SAFETY: as above.
unsafe impl Zeroable for std::sync::atomic::AtomicU32 {}
// SAFETY: as above.
unsafe impl Zeroable for std::sync::atomic::AtomicU64 {}
// SAFETY: `UnsafeCell<T>` has the layout and validity of `T` and no drop
// glue of its own.
unsafe impl<T: Zeroable> Zeroable for std::cell::UnsafeCell<T> {}
// SAFETY: an array of zero-valid, drop-free elements is zero-valid and
// drop-free.
unsafe impl<T: Zeroable, const N: usize> Zeroable for [T; N] {}

/// Arrays of at least this many bytes are mapped and advised; smaller ones
/// are heap allocations (a huge page would be mostly empty).
pub const HUGE_THRESHOLD: usize = 2 << 20;

const HUGE_PAGE: usize = 2 << 20;

enum Backing {
    /// `std::alloc` allocation of `layout` (`None`: no allocation, the
    /// array is empty or zero-sized).
    Heap(Option<Layout>),
    /// An anonymous mapping of `len` bytes (a whole number of pages) that
    /// starts with the array, on a huge-page boundary.
    Mapped { len: usize },
}

/// A fixed-length, zero-initialised array of `T`; see the module docs.
pub struct HugeArray<T: Zeroable> {
    ptr: NonNull<T>,
    len: usize,
    backing: Backing,
}

// SAFETY: `HugeArray` owns its elements like a `Box<[T]>` does: sending or
// sharing it is sound exactly when it is for the elements.
unsafe impl<T: Zeroable + Send> Send for HugeArray<T> {}
// SAFETY: as above; `&HugeArray` only gives out `&[T]`.
unsafe impl<T: Zeroable + Sync> Sync for HugeArray<T> {}

impl<T: Zeroable> HugeArray<T> {
    /// `len` zeroed elements.
    ///
    /// # Panics
    /// When the size overflows `isize` or memory runs out, as `vec!` does.
    pub fn zeroed(len: usize) -> Self {
        let layout = Layout::array::<T>(len).expect("HugeArray: size overflows");
        if layout.size() >= HUGE_THRESHOLD {
            if let Some(a) = Self::mapped(len, layout) {
                return a;
            }
        }
        if layout.size() == 0 {
            return HugeArray {
                ptr: NonNull::dangling(),
                len,
                backing: Backing::Heap(None),
            };
        }
        // SAFETY: `layout` has a non-zero size.
        let p = unsafe { std::alloc::alloc_zeroed(layout) } as *mut T;
        let Some(ptr) = NonNull::new(p) else {
            std::alloc::handle_alloc_error(layout)
        };
        HugeArray {
            ptr,
            len,
            backing: Backing::Heap(Some(layout)),
        }
    }

    #[cfg(target_os = "linux")]
    fn mapped(len: usize, layout: Layout) -> Option<Self> {
        if layout.align() > HUGE_PAGE {
            return None;
        }
        let size = layout.size().next_multiple_of(page_size());
        let map_len = size.checked_add(HUGE_PAGE)?;
        // SAFETY: a private anonymous mapping at an address of the kernel's
        // choosing: it aliases nothing, and its result is checked below.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return None;
        }
        let base = base as usize;
        let start = base.next_multiple_of(HUGE_PAGE);
        let end = start + size;
        // SAFETY: `[base, start)` and `[end, base + map_len)` are the parts
        // of the fresh mapping before the first huge-page boundary and after
        // the array (both page-aligned: `base`, `start` and `size` are);
        // nothing refers to them. Unmapping them leaves exactly the array.
        // The advice only changes how the kernel backs the array's pages; a
        // kernel that refuses it (THP disabled) leaves ordinary pages, so
        // its result is not an error.
        unsafe {
            if start > base {
                libc::munmap(base as *mut libc::c_void, start - base);
            }
            if base + map_len > end {
                libc::munmap(end as *mut libc::c_void, base + map_len - end);
            }
            libc::madvise(start as *mut libc::c_void, size, libc::MADV_HUGEPAGE);
        }
        Some(HugeArray {
            // `start` is non-null (inside a successful mapping) and aligned to
            // 2 MiB, hence to `align_of::<T>()` (checked above).
            ptr: NonNull::new(start as *mut T)?,
            len,
            backing: Backing::Mapped { len: size },
        })
    }

    #[cfg(not(target_os = "linux"))]
    fn mapped(_len: usize, _layout: Layout) -> Option<Self> {
        None
    }

    /// A new array of `len` elements holding a copy of `self`'s first
    /// `min(len, self.len())` elements bytewise, the rest zeroed: the
    /// growth step of the stores (the elements are plain data or atomics
    /// owned by a caller with exclusive access).
    pub fn grown(&mut self, len: usize) -> Self {
        let out = Self::zeroed(len);
        let n = len.min(self.len);
        // SAFETY: both arrays hold at least `n` elements, they are distinct
        // allocations, and `&mut self` excludes concurrent writers of the
        // source; a bytewise copy of a `Zeroable` (plain data, no drop glue)
        // is a valid value.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.as_ptr(), out.ptr.as_ptr(), n) };
        out
    }

    /// Bytes of this array that the kernel currently backs with huge pages
    /// (from `/proc/self/smaps`; 0 when unknown or on the heap path).
    pub fn huge_bytes(&self) -> usize {
        match self.backing {
            Backing::Mapped { len } => {
                let lo = self.ptr.as_ptr() as usize;
                smaps_anon_huge(lo, lo + len).unwrap_or(0).min(len)
            }
            Backing::Heap(_) => 0,
        }
    }
}

#[cfg(target_os = "linux")]
fn page_size() -> usize {
    // SAFETY: `sysconf` has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as usize
    } else {
        4096
    }
}

/// `AnonHugePages` of the mappings (`/proc/self/smaps` entries) that overlap
/// `[lo, hi)`, in bytes. A mapping the kernel merged with a neighbour counts
/// whole, so the caller caps the figure at its own size.
fn smaps_anon_huge(lo: usize, hi: usize) -> Option<usize> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
    let mut inside = false;
    let mut total = 0;
    for line in smaps.lines() {
        let range = line.split_once(' ').map_or(line, |(r, _)| r);
        if let Some((a, b)) = range.split_once('-') {
            if let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16)) {
                inside = a < hi && b > lo;
                continue;
            }
        }
        if inside {
            if let Some(kb) = line.strip_prefix("AnonHugePages:") {
                let kb: usize = kb.trim().trim_end_matches("kB").trim().parse().ok()?;
                total += kb * 1024;
            }
        }
    }
    Some(total)
}

impl<T: Zeroable> std::ops::Deref for HugeArray<T> {
    type Target = [T];
    #[inline]
    fn deref(&self) -> &[T] {
        // SAFETY: `ptr` points at `len` initialised (zeroed or since
        // written) elements owned by `self`, or is dangling with a zero-size
        // layout.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<T: Zeroable> std::ops::DerefMut for HugeArray<T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as in `deref`, and `&mut self` makes the borrow unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl<T: Zeroable> Drop for HugeArray<T> {
    fn drop(&mut self) {
        match self.backing {
            Backing::Heap(Some(layout)) => {
                // SAFETY: allocated by `alloc_zeroed` with this layout;
                // `Zeroable` elements need no drop.
                unsafe { std::alloc::dealloc(self.ptr.as_ptr() as *mut u8, layout) }
            }
            Backing::Heap(None) => {}
            Backing::Mapped { len } => {
                // SAFETY: the mapping this array created (exactly `len` bytes
                // from `ptr`), which nothing refers to once it is dropped.
                unsafe {
                    libc::munmap(self.ptr.as_ptr() as *mut libc::c_void, len);
                }
            }
        }
    }
}

impl<T: Zeroable> Default for HugeArray<T> {
    fn default() -> Self {
        Self::zeroed(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[test]
    fn small_and_large_arrays_start_zeroed_and_hold_writes() {
        for len in [0usize, 1, 1000, HUGE_THRESHOLD / 4 + 7] {
            let mut a = HugeArray::<u32>::zeroed(len);
            assert_eq!(a.len(), len);
            assert!(a.iter().all(|&x| x == 0));
            for (i, x) in a.iter_mut().enumerate() {
                *x = i as u32;
            }
            assert!(a.iter().enumerate().all(|(i, &x)| x == i as u32));
        }
    }

    #[test]
    fn large_arrays_are_mapped_on_a_huge_page_boundary() {
        let a = HugeArray::<AtomicU32>::zeroed(HUGE_THRESHOLD);
        if cfg!(target_os = "linux") {
            assert!(matches!(a.backing, Backing::Mapped { .. }));
            assert_eq!(a.as_ptr() as usize % HUGE_PAGE, 0);
        }
        a[HUGE_THRESHOLD - 1].store(7, Ordering::Relaxed);
        assert_eq!(a[HUGE_THRESHOLD - 1].load(Ordering::Relaxed), 7);
    }

    #[test]
    fn growth_keeps_the_prefix_and_zeroes_the_rest() {
        let mut a = HugeArray::<u64>::zeroed(1000);
        for (i, x) in a.iter_mut().enumerate() {
            *x = i as u64 + 1;
        }
        let b = a.grown(HUGE_THRESHOLD / 8 + 3);
        assert!(b[..1000]
            .iter()
            .enumerate()
            .all(|(i, &x)| x == i as u64 + 1));
        assert!(b[1000..].iter().all(|&x| x == 0));
        let c = HugeArray::<u64>::zeroed(10).grown(4);
        assert_eq!(c.len(), 4);
    }

    #[test]
    fn huge_bytes_reads_this_mapping() {
        // Whether the kernel grants huge pages depends on its THP mode; the
        // figure must be readable and bounded by the mapping either way.
        let mut a = HugeArray::<u8>::zeroed(4 * HUGE_PAGE);
        a.iter_mut().step_by(4096).for_each(|x| *x = 1);
        assert!(a.huge_bytes() <= 5 * HUGE_PAGE);
        assert_eq!(HugeArray::<u8>::zeroed(10).huge_bytes(), 0);
    }
}
