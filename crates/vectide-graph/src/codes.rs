//! RaBitQ codes beside the layer-0 lists, for traversal on compressed
//! vectors (SymphonyQG's layout, Gao et al. 2025).
//!
//! Per slot the store keeps two things:
//! - its own code (the 1-bit code of its vector and the four factors of
//!   the estimator, `vectide_quant::rabitq`), written when the slot is
//!   initialised;
//! - its neighbours' codes, in the layer-0 list's order, laid out as
//!   fast-scan blocks of 32 (`fastscan::Block`) followed by the 32
//!   neighbours' factors: one contiguous run per slot, so that a hop reads
//!   one block and estimates every neighbour at once.
//!
//! Every write of a layer-0 list goes through the store (`Store::set_list`,
//! `Store::push_neighbor`), which rewrites the matching codes under the
//! slot's lock, so a list carries its neighbours' current codes. A slot's
//! code never changes while any list names it: a slot is initialised only
//! when unreachable (the store's protocol), and an upsert takes a new slot.
//!
//! Readers copy a slot's run with relaxed atomic loads into their scratch
//! and scan the copy; a copy taken while a writer rewrites the list may mix
//! old and new codes, which only makes some estimates wrong: a search ranks
//! its answers by exact distances.

use std::sync::atomic::{AtomicU64, Ordering};
use vectide_core::hugemem::HugeArray;
use vectide_core::{Error, Result};
use vectide_quant::rabitq::fastscan::{self, Block, BLOCK};
use vectide_quant::rabitq::{Factors, Query, Rabitq};

/// How a graph engine estimates distances while it walks its graph.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Quantization {
    /// Exact float32 distances everywhere.
    #[default]
    None,
    /// 1-bit RaBitQ codes beside the layer-0 lists, exact re-ranking.
    Rabitq1,
}

impl Quantization {
    /// The values the `quantization` parameter takes.
    pub const NAMES: &'static [&'static str] = &["none", "rabitq1"];

    pub fn name(self) -> &'static str {
        match self {
            Quantization::None => "none",
            Quantization::Rabitq1 => "rabitq1",
        }
    }

    pub fn parse(s: &str) -> Result<Quantization> {
        match s {
            "none" => Ok(Quantization::None),
            "rabitq1" => Ok(Quantization::Rabitq1),
            other => Err(Error::invalid(format!(
                "quantization {other:?} is not supported: expected one of {:?}",
                Self::NAMES
            ))),
        }
    }

    /// The tag written in index files.
    pub fn tag(self) -> u8 {
        match self {
            Quantization::None => 0,
            Quantization::Rabitq1 => 1,
        }
    }

    pub fn from_tag(t: u8) -> Result<Quantization> {
        match t {
            0 => Ok(Quantization::None),
            1 => Ok(Quantization::Rabitq1),
            t => Err(Error::corrupted(format!(
                "quantization tag {t} is not one this build knows (0 none, 1 rabitq1)"
            ))),
        }
    }
}

/// Words of four factors (two f32 per word).
const OWN_FACTOR_WORDS: usize = 2;
/// Words of a block's 32 × 4 factors.
const BLOCK_FACTOR_WORDS: usize = BLOCK * 4 / 2;

/// The codes of a store's slots and of their layer-0 lists.
pub struct Codes {
    rq: Rabitq,
    /// Words of one code's bits.
    words: usize,
    /// Fast-scan bytes of one block.
    block_bytes: usize,
    /// Blocks per list (`⌈m0 / 32⌉`).
    blocks: usize,
    /// Words per slot of `lists`.
    list_words: usize,
    own: HugeArray<AtomicU64>,
    lists: HugeArray<AtomicU64>,
}

/// A reader's copy of one slot's list codes and the estimates from them.
#[derive(Default)]
pub struct CodeScratch {
    pub query: Query,
    bytes: Vec<u8>,
    factors: Vec<f32>,
    ip: [u32; BLOCK],
    /// Per list position: the estimated distance and its bound.
    pub est: Vec<(f32, f32)>,
}

fn f32_pair(w: u64) -> (f32, f32) {
    (f32::from_bits(w as u32), f32::from_bits((w >> 32) as u32))
}

fn pack_pair(a: f32, b: f32) -> u64 {
    u64::from(a.to_bits()) | u64::from(b.to_bits()) << 32
}

impl Codes {
    /// Codes for `capacity` slots with layer-0 lists of `m0`.
    pub fn new(rq: Rabitq, m0: usize, capacity: usize) -> Codes {
        let words = rq.padded() / 64;
        let block_bytes = Block::bytes_for(rq.padded());
        let blocks = m0.div_ceil(BLOCK).max(1);
        let list_words = blocks * (block_bytes / 8 + BLOCK_FACTOR_WORDS);
        Codes {
            own: HugeArray::zeroed(capacity * (words + OWN_FACTOR_WORDS)),
            lists: HugeArray::zeroed(capacity * list_words),
            rq,
            words,
            block_bytes,
            blocks,
            list_words,
        }
    }

    /// Bytes per slot of the codes of `dim`-dimensional vectors with
    /// layer-0 lists of `m0` (what [`Codes::new`] allocates per slot).
    pub fn bytes_for(dim: usize, m0: usize) -> usize {
        let padded = vectide_quant::rabitq::padded_dim(dim);
        let blocks = m0.div_ceil(BLOCK).max(1);
        8 * (padded / 64
            + OWN_FACTOR_WORDS
            + blocks * (Block::bytes_for(padded) / 8 + BLOCK_FACTOR_WORDS))
    }

    pub fn quantizer(&self) -> &Rabitq {
        &self.rq
    }

    /// Bytes per slot.
    pub fn bytes_per_slot(&self) -> usize {
        8 * (self.words + OWN_FACTOR_WORDS + self.list_words)
    }

    /// A copy holding `capacity` slots, the content kept (under `&mut`).
    pub fn grown(&mut self, capacity: usize) -> Codes {
        Codes {
            rq: self.rq.clone(),
            words: self.words,
            block_bytes: self.block_bytes,
            blocks: self.blocks,
            list_words: self.list_words,
            own: self.own.grown(capacity * (self.words + OWN_FACTOR_WORDS)),
            lists: self.lists.grown(capacity * self.list_words),
        }
    }

    /// Encodes `vector` as `slot`'s own code (the slot is unreachable).
    pub fn set_own(&self, slot: u32, vector: &[f32]) {
        // The store checked the vector (finite, of the dimension) before.
        let Ok(code) = self.rq.encode(vector) else {
            return;
        };
        let at = slot as usize * (self.words + OWN_FACTOR_WORDS);
        for (a, &w) in self.own[at..].iter().zip(&code.bin) {
            a.store(w, Ordering::Relaxed);
        }
        let f = code.factors;
        self.own[at + self.words].store(pack_pair(f.add, f.rescale), Ordering::Relaxed);
        self.own[at + self.words + 1].store(pack_pair(f.rescale_bits, f.error), Ordering::Relaxed);
    }

    /// `slot`'s own code bits into `bin` and its factors.
    fn own(&self, slot: u32, bin: &mut [u64]) -> Factors {
        let at = slot as usize * (self.words + OWN_FACTOR_WORDS);
        for (b, a) in bin.iter_mut().zip(&self.own[at..at + self.words]) {
            *b = a.load(Ordering::Relaxed);
        }
        let (add, rescale) = f32_pair(self.own[at + self.words].load(Ordering::Relaxed));
        let (rescale_bits, error) = f32_pair(self.own[at + self.words + 1].load(Ordering::Relaxed));
        Factors {
            add,
            rescale,
            rescale_bits,
            error,
            ex_rescale: 0.0,
        }
    }

    /// The words of a list run holding the codes of `ids`.
    fn encode_list(&self, ids: &[u32]) -> Vec<u64> {
        let mut out = Vec::with_capacity(self.list_words);
        let mut bin = vec![0u64; self.words];
        let mut bytes = vec![0u8; self.block_bytes];
        let mut factors = [0f32; BLOCK * 4];
        for b in 0..self.blocks {
            bytes.fill(0);
            factors.fill(0.0);
            let chunk = ids.get(b * BLOCK..).unwrap_or(&[]);
            for (j, &id) in chunk.iter().take(BLOCK).enumerate() {
                let f = self.own(id, &mut bin);
                Block::put(&mut bytes, j, &bin);
                factors[j] = f.add;
                factors[BLOCK + j] = f.rescale;
                factors[2 * BLOCK + j] = f.rescale_bits;
                factors[3 * BLOCK + j] = f.error;
            }
            out.extend(
                bytes
                    .chunks_exact(8)
                    .map(|w| u64::from_le_bytes(w.try_into().unwrap_or_default())),
            );
            out.extend(factors.chunks_exact(2).map(|p| pack_pair(p[0], p[1])));
        }
        debug_assert_eq!(out.len(), self.list_words);
        out
    }

    /// Rewrites `slot`'s list codes for the neighbours `ids` (the caller
    /// holds the slot's lock).
    pub fn write_list(&self, slot: u32, ids: &[u32]) {
        let base = slot as usize * self.list_words;
        for (a, w) in self.lists[base..base + self.list_words]
            .iter()
            .zip(self.encode_list(ids))
        {
            a.store(w, Ordering::Relaxed);
        }
    }

    /// Whether `slot`'s list codes are those of `ids` and of their current
    /// own codes (for tests and checks).
    pub fn list_matches(&self, slot: u32, ids: &[u32]) -> bool {
        let base = slot as usize * self.list_words;
        self.lists[base..base + self.list_words]
            .iter()
            .zip(self.encode_list(ids))
            .all(|(a, w)| a.load(Ordering::Relaxed) == w)
    }

    /// Writes the code of neighbour `id` at position `pos` of `slot`'s list
    /// (the caller holds the slot's lock).
    pub fn write_entry(&self, slot: u32, pos: usize, id: u32) {
        let (b, j) = (pos / BLOCK, pos % BLOCK);
        if b >= self.blocks {
            return;
        }
        let bw = self.block_bytes / 8;
        let at = slot as usize * self.list_words + b * (bw + BLOCK_FACTOR_WORDS);
        let mut bin = vec![0u64; self.words];
        let f = self.own(id, &mut bin);
        let mut bytes = vec![0u8; self.block_bytes];
        for (w, a) in bytes.chunks_exact_mut(8).zip(&self.lists[at..at + bw]) {
            w.copy_from_slice(&a.load(Ordering::Relaxed).to_le_bytes());
        }
        Block::put(&mut bytes, j, &bin);
        for (a, w) in self.lists[at..at + bw].iter().zip(bytes.chunks_exact(8)) {
            a.store(
                u64::from_le_bytes(w.try_into().unwrap_or_default()),
                Ordering::Relaxed,
            );
        }
        for (k, v) in [f.add, f.rescale, f.rescale_bits, f.error]
            .into_iter()
            .enumerate()
        {
            let idx = k * BLOCK + j;
            let a = &self.lists[at + bw + idx / 2];
            let (lo, hi) = f32_pair(a.load(Ordering::Relaxed));
            let w = if idx.is_multiple_of(2) {
                pack_pair(v, hi)
            } else {
                pack_pair(lo, v)
            };
            a.store(w, Ordering::Relaxed);
        }
    }

    /// Address of a slot's list codes, for prefetching only.
    #[inline]
    pub fn list_ptr(&self, slot: u32) -> *const u8 {
        self.lists
            .as_ptr()
            .wrapping_add(slot as usize * self.list_words) as *const u8
    }

    /// Bytes of a slot's list codes (what a prefetch should cover).
    pub fn list_bytes(&self) -> usize {
        self.list_words * 8
    }

    /// Prepares `q` in `s.query`.
    pub fn prepare(&self, q: &[f32], s: &mut CodeScratch) -> Result<()> {
        self.rq.query_into(q, &mut s.query)
    }

    /// Estimates the distance of the first `n` neighbours of `slot`'s list
    /// to the prepared query: `s.est[i]` for position `i`.
    pub fn estimate_list(&self, slot: u32, n: usize, s: &mut CodeScratch) {
        let bw = self.block_bytes / 8;
        let base = slot as usize * self.list_words;
        s.est.clear();
        s.bytes.resize(self.block_bytes, 0);
        s.factors.resize(BLOCK * 4, 0.0);
        let q = &s.query;
        let (two_delta, two_lo) = (2.0 * q.delta, 2.0 * q.lo);
        for b in 0..self.blocks.min(n.div_ceil(BLOCK)) {
            let at = base + b * (bw + BLOCK_FACTOR_WORDS);
            for (w, a) in s.bytes.chunks_exact_mut(8).zip(&self.lists[at..at + bw]) {
                w.copy_from_slice(&a.load(Ordering::Relaxed).to_le_bytes());
            }
            for (p, a) in s
                .factors
                .chunks_exact_mut(2)
                .zip(&self.lists[at + bw..at + bw + BLOCK_FACTOR_WORDS])
            {
                let w = a.load(Ordering::Relaxed);
                p[0] = f32::from_bits(w as u32);
                p[1] = f32::from_bits((w >> 32) as u32);
            }
            fastscan::scan(&q.lut, &s.bytes, &mut s.ip);
            let (add, rest) = s.factors.split_at(BLOCK);
            let (rescale, rest) = rest.split_at(BLOCK);
            let (bits, error) = rest.split_at(BLOCK);
            let take = (n - b * BLOCK).min(BLOCK);
            s.est.extend((0..take).map(|j| {
                let est = add[j]
                    + q.add
                    + rescale[j] * (two_delta * s.ip[j] as f32 - q.sum)
                    + two_lo * bits[j];
                (est, error[j] * q.norm)
            }));
        }
    }
}
