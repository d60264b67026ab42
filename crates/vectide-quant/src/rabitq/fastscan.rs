//! Fast scan: the 1-bit estimates of 32 codes at once, by table lookups.
//!
//! A code's bits are read four at a time: group `g` holds coordinates `4g
//! … 4g+3`, a 4-bit number. The query's table ([`super::Query::lut`]) has,
//! per group, the 16 sums of its quantized values over every subset of the
//! four, so `⟨b, u⟩` is one lookup per group. A [`Block`] stores 32 codes
//! group-major, 16 bytes per group: byte `j` holds code `j`'s nibble low
//! and code `j + 16`'s high. A shuffle instruction (`pshufb`) then looks up
//! 16 nibbles in a 16-byte table at once; AVX2 does two groups per
//! instruction, AVX-512 (with BW) four. Lookups are at most 60, summed in
//! 16-bit lanes (each lane holds the sums of at most `D/8` groups, under
//! 2¹⁶ for `D` ≤ [`MAX_PADDED`]) and in 32 bits at the end.
//!
//! Dispatch is at run time, once, like the distance kernels': AVX-512BW,
//! else AVX2, else the portable loop (the reference of the tests);
//! `VECTIDE_SIMD=scalar` or `avx2` forces a lower one.

use std::sync::OnceLock;

/// Codes per block.
pub const BLOCK: usize = 32;

/// The largest padded dimension the 16-bit sums hold.
pub const MAX_PADDED: usize = 8192;

type ScanFn = fn(&[u8], &[u8], &mut [u32; BLOCK]);

/// Up to 32 codes laid out for the fast scan, with their factors.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Block {
    /// `padded / 4 × 16` bytes.
    pub bytes: Vec<u8>,
}

impl Block {
    /// Bytes of a block of `padded`-dimensional codes.
    pub fn bytes_for(padded: usize) -> usize {
        padded / 4 * 16
    }

    /// The block of `codes` (at most 32, each `padded / 64` words; the
    /// slots past them hold zeros).
    pub fn pack<'a>(codes: impl IntoIterator<Item = &'a [u64]>, padded: usize) -> Block {
        let mut bytes = vec![0u8; Self::bytes_for(padded)];
        for (j, bin) in codes.into_iter().enumerate() {
            assert!(j < BLOCK, "a block holds {BLOCK} codes");
            Self::put(&mut bytes, j, bin);
        }
        Block { bytes }
    }

    /// Writes code `bin` into slot `j` of a block's bytes.
    pub fn put(bytes: &mut [u8], j: usize, bin: &[u64]) {
        let (shift, col) = if j < 16 { (0, j) } else { (4, j - 16) };
        for (g, chunk) in bytes.chunks_exact_mut(16).enumerate() {
            let nib = (bin[g / 16] >> (4 * (g % 16)) & 0xF) as u8;
            let b = &mut chunk[col];
            *b = (*b & !(0xF << shift)) | nib << shift;
        }
    }

    /// The code in slot `j` (the inverse of [`put`](Self::put)).
    pub fn get(bytes: &[u8], j: usize, out: &mut [u64]) {
        let (shift, col) = if j < 16 { (0, j) } else { (4, j - 16) };
        out.fill(0);
        for (g, chunk) in bytes.chunks_exact(16).enumerate() {
            let nib = u64::from(chunk[col] >> shift & 0xF);
            out[g / 16] |= nib << (4 * (g % 16));
        }
    }
}

/// `⟨b, u⟩` of the 32 codes of `block` against the query table `lut`.
pub fn scan(lut: &[u8], block: &[u8], out: &mut [u32; BLOCK]) {
    assert_eq!(
        lut.len(),
        block.len(),
        "the table and the block differ in groups"
    );
    assert!(
        lut.len().is_multiple_of(64) && lut.len() <= MAX_PADDED / 4 * 16,
        "a block of {} bytes is not one of padded codes",
        lut.len()
    );
    (kernel())(lut, block, out)
}

/// The portable kernel (the tests' reference).
pub fn scan_scalar(lut: &[u8], block: &[u8], out: &mut [u32; BLOCK]) {
    *out = [0; BLOCK];
    for (t, b) in lut.chunks_exact(16).zip(block.chunks_exact(16)) {
        for j in 0..16 {
            out[j] += u32::from(t[usize::from(b[j] & 0xF)]);
            out[j + 16] += u32::from(t[usize::from(b[j] >> 4)]);
        }
    }
}

/// The name of the kernel in use: `avx512`, `avx2` or `scalar`.
pub fn kernel_name() -> &'static str {
    chosen().1
}

fn kernel() -> ScanFn {
    chosen().0
}

fn chosen() -> (ScanFn, &'static str) {
    static CHOSEN: OnceLock<(ScanFn, &'static str)> = OnceLock::new();
    *CHOSEN.get_or_init(|| {
        let isa = vectide_core::distance::active_isa();
        #[cfg(target_arch = "x86_64")]
        {
            if isa == "avx512" && x86::avx512_ok() {
                return (x86::scan_avx512 as ScanFn, "avx512");
            }
            if isa != "scalar" && x86::avx2_ok() {
                return (x86::scan_avx2 as ScanFn, "avx2");
            }
        }
        let _ = isa;
        (scan_scalar as ScanFn, "scalar")
    })
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    use super::BLOCK;
    use std::arch::x86_64::*;

    pub fn avx2_ok() -> bool {
        is_x86_feature_detected!("avx2")
    }

    pub fn avx512_ok() -> bool {
        is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw")
    }

    /// AVX2 dispatch target; only chosen when [`avx2_ok`].
    pub fn scan_avx2(lut: &[u8], block: &[u8], out: &mut [u32; BLOCK]) {
        assert!(avx2_ok() && lut.len() == block.len() && lut.len().is_multiple_of(32));
        // SAFETY: AVX2 is present (asserted above), and the kernel reads
        // `lut` and `block` only within their equal lengths, 32 bytes at a
        // time over a multiple of 32.
        unsafe { scan_avx2_impl(lut, block, out) }
    }

    /// AVX-512 dispatch target; only chosen when [`avx512_ok`].
    pub fn scan_avx512(lut: &[u8], block: &[u8], out: &mut [u32; BLOCK]) {
        assert!(avx512_ok() && lut.len() == block.len() && lut.len().is_multiple_of(64));
        // SAFETY: AVX-512F and BW are present (asserted above), and the
        // kernel reads within the equal lengths, 64 bytes at a time over a
        // multiple of 64.
        unsafe { scan_avx512_impl(lut, block, out) }
    }

    /// Adds the 16-bit sums of even and odd bytes kept in `a` (both, the
    /// odd ones in the high byte) and `b` (the odd ones) to `out`.
    fn fold(a: &[u16], b: &[u16], lanes: usize, out: &mut [u32]) {
        // Lane `l`, entry `m`: bytes 2m and 2m+1 of lane `l`.
        for l in 0..lanes {
            for m in 0..8 {
                let (x, y) = (a[l * 8 + m], b[l * 8 + m]);
                out[2 * m] += u32::from(x.wrapping_sub(y << 8));
                out[2 * m + 1] += u32::from(y);
            }
        }
    }

    #[target_feature(enable = "avx2")]
    unsafe fn scan_avx2_impl(lut: &[u8], block: &[u8], out: &mut [u32; BLOCK]) {
        let mask = _mm256_set1_epi8(0x0F);
        let (mut lo_a, mut lo_b, mut hi_a, mut hi_b) = (
            _mm256_setzero_si256(),
            _mm256_setzero_si256(),
            _mm256_setzero_si256(),
            _mm256_setzero_si256(),
        );
        let mut i = 0;
        while i < lut.len() {
            // SAFETY: i + 32 <= len for both slices (len a multiple of 32).
            let (t, x) = unsafe {
                (
                    _mm256_loadu_si256(lut.as_ptr().add(i).cast()),
                    _mm256_loadu_si256(block.as_ptr().add(i).cast()),
                )
            };
            let lo = _mm256_shuffle_epi8(t, _mm256_and_si256(x, mask));
            let hi = _mm256_shuffle_epi8(t, _mm256_and_si256(_mm256_srli_epi16(x, 4), mask));
            lo_a = _mm256_add_epi16(lo_a, lo);
            lo_b = _mm256_add_epi16(lo_b, _mm256_srli_epi16(lo, 8));
            hi_a = _mm256_add_epi16(hi_a, hi);
            hi_b = _mm256_add_epi16(hi_b, _mm256_srli_epi16(hi, 8));
            i += 32;
        }
        let mut v = [[0u16; 16]; 4];
        for (dst, src) in v.iter_mut().zip([lo_a, lo_b, hi_a, hi_b]) {
            // SAFETY: `dst` is 32 writable bytes.
            unsafe { _mm256_storeu_si256(dst.as_mut_ptr().cast(), src) };
        }
        *out = [0; BLOCK];
        let (first, second) = out.split_at_mut(16);
        fold(&v[0], &v[1], 2, first);
        fold(&v[2], &v[3], 2, second);
    }

    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn scan_avx512_impl(lut: &[u8], block: &[u8], out: &mut [u32; BLOCK]) {
        let mask = _mm512_set1_epi8(0x0F);
        let (mut lo_a, mut lo_b, mut hi_a, mut hi_b) = (
            _mm512_setzero_si512(),
            _mm512_setzero_si512(),
            _mm512_setzero_si512(),
            _mm512_setzero_si512(),
        );
        let mut i = 0;
        while i < lut.len() {
            // SAFETY: i + 64 <= len for both slices (len a multiple of 64).
            let (t, x) = unsafe {
                (
                    _mm512_loadu_si512(lut.as_ptr().add(i).cast()),
                    _mm512_loadu_si512(block.as_ptr().add(i).cast()),
                )
            };
            let lo = _mm512_shuffle_epi8(t, _mm512_and_si512(x, mask));
            let hi = _mm512_shuffle_epi8(t, _mm512_and_si512(_mm512_srli_epi16(x, 4), mask));
            lo_a = _mm512_add_epi16(lo_a, lo);
            lo_b = _mm512_add_epi16(lo_b, _mm512_srli_epi16(lo, 8));
            hi_a = _mm512_add_epi16(hi_a, hi);
            hi_b = _mm512_add_epi16(hi_b, _mm512_srli_epi16(hi, 8));
            i += 64;
        }
        let mut v = [[0u16; 32]; 4];
        for (dst, src) in v.iter_mut().zip([lo_a, lo_b, hi_a, hi_b]) {
            // SAFETY: `dst` is 64 writable bytes.
            unsafe { _mm512_storeu_si512(dst.as_mut_ptr().cast(), src) };
        }
        *out = [0; BLOCK];
        let (first, second) = out.split_at_mut(16);
        fold(&v[0], &v[1], 4, first);
        fold(&v[2], &v[3], 4, second);
    }
}
