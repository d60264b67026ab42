//! The bytes of the block store (`docs/format-blockstore.md`).
//!
//! A store file is whole 4 KiB blocks. Block 0 is the store header; every
//! other block is free or holds part of one posting. A posting is a byte
//! stream of records, `vid u32 ‖ version u8 ‖ vector (dim f32)`, cut into
//! the 4,080-byte payloads of its blocks in order: every block of a posting
//! but the last is full, so a record may straddle two blocks.
//!
//! A data block starts with a 16-byte head: `crc32 u32 ‖ posting u32 ‖
//! gen u32 ‖ used u16 ‖ zero u16`. The CRC covers bytes 4..4096 (the rest
//! of the head and the whole payload, unused bytes zero). `gen` is the
//! store's write counter when the block was written: a mapping entry names
//! each of its blocks by number **and** gen, so a read that meets a block
//! since released and rewritten (for any posting) sees a different gen and
//! knows, instead of returning another posting's records.
//!
//! The mapping and the free pool live in RAM and in snapshots
//! ([`encode_map`] / [`decode_map`]), not in the store file.

use vectide_core::io::{push_crc, ByteReader};
use vectide_core::{Error, Result};
use vectide_storage::block::BLOCK;

/// First bytes of a store file (block 0).
pub const STORE_MAGIC: &[u8; 8] = b"VTSPBLK\0";
/// The store file format this build reads and writes.
pub const STORE_VERSION: u32 = 1;
/// First bytes of an encoded mapping.
pub const MAP_MAGIC: &[u8; 8] = b"VTSPMAP\0";
/// The mapping encoding this build reads and writes.
pub const MAP_VERSION: u32 = 1;
/// Bytes of a data block's head.
pub const HEAD: usize = 16;
/// Payload bytes per data block.
pub const PAYLOAD: usize = BLOCK - HEAD;
/// Bytes of a record before its vector: `vid u32 ‖ version u8`.
pub const RECORD_META: usize = 5;
/// Largest dimension a store accepts.
pub const MAX_DIM: u32 = 65_536;
/// Bytes of the store header before its CRC.
const STORE_HEADER_LEN: usize = 20;

/// Bytes of one record of a `dim`-dimensional store.
pub fn record_bytes(dim: usize) -> usize {
    RECORD_META + 4 * dim
}

/// Block 0: the store's identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreHeader {
    pub dim: u32,
}

impl StoreHeader {
    /// Block 0's bytes: `magic ‖ version u32 ‖ dim u32 ‖ record bytes u32 ‖
    /// crc32 u32` of what precedes it, the rest zero.
    pub fn encode(&self, block: &mut [u8]) {
        block.fill(0);
        block[..8].copy_from_slice(STORE_MAGIC);
        block[8..12].copy_from_slice(&STORE_VERSION.to_le_bytes());
        block[12..16].copy_from_slice(&self.dim.to_le_bytes());
        let rb = record_bytes(self.dim as usize) as u32;
        block[16..20].copy_from_slice(&rb.to_le_bytes());
        let crc = crc32fast::hash(&block[..STORE_HEADER_LEN]);
        block[STORE_HEADER_LEN..STORE_HEADER_LEN + 4].copy_from_slice(&crc.to_le_bytes());
    }

    /// Parses and checks block 0 (magic, version, CRC, a record size that
    /// agrees with the dimension).
    pub fn decode(block: &[u8]) -> Result<Self> {
        let mut r = ByteReader::new(block);
        r.magic_version(STORE_MAGIC, STORE_VERSION, "block store")?;
        let dim = r.u32()?;
        let rb = r.u32()?;
        r.crc_of_preceding("block store header")?;
        if dim == 0 || dim > MAX_DIM || rb as usize != record_bytes(dim as usize) {
            return Err(Error::corrupted(format!(
                "block store header: dimension {dim} with {rb}-byte records"
            )));
        }
        Ok(StoreHeader { dim })
    }
}

/// The head of a data block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockHead {
    /// The posting the block was written for.
    pub posting: u32,
    /// The store's write counter at the write.
    pub gen: u32,
    /// Payload bytes in use.
    pub used: u16,
}

/// Writes `head` and `payload` into `block` (whole, zero-padded) and seals
/// it with its CRC.
pub fn seal_block(block: &mut [u8], head: BlockHead, payload: &[u8]) -> Result<()> {
    if block.len() != BLOCK || payload.len() > PAYLOAD || payload.len() != head.used as usize {
        return Err(Error::invalid(
            "block store: a block is 4 KiB with at most 4,080 payload bytes",
        ));
    }
    block[4..8].copy_from_slice(&head.posting.to_le_bytes());
    block[8..12].copy_from_slice(&head.gen.to_le_bytes());
    block[12..14].copy_from_slice(&head.used.to_le_bytes());
    block[14..16].fill(0);
    block[HEAD..HEAD + payload.len()].copy_from_slice(payload);
    block[HEAD + payload.len()..].fill(0);
    let crc = crc32fast::hash(&block[4..]);
    block[..4].copy_from_slice(&crc.to_le_bytes());
    Ok(())
}

/// Checks a data block's CRC and head; its head and used payload.
pub fn open_block(block: &[u8]) -> Result<(BlockHead, &[u8])> {
    let mut r = ByteReader::new(block);
    let crc = r.u32()?;
    let posting = r.u32()?;
    let gen = r.u32()?;
    let used = u16::from_le_bytes(r.bytes(2)?.try_into().expect("2 bytes"));
    let zero = r.bytes(2)?;
    if block.len() != BLOCK || crc != crc32fast::hash(&block[4..]) {
        return Err(Error::corrupted("block store: a block's checksum fails"));
    }
    if used as usize > PAYLOAD || zero != [0, 0] {
        return Err(Error::corrupted("block store: a block's head is malformed"));
    }
    let payload = r.bytes(used as usize)?;
    Ok((BlockHead { posting, gen, used }, payload))
}

/// Appends one record to `out`.
pub fn encode_record(out: &mut Vec<u8>, vid: u32, version: u8, vector: &[f32]) {
    out.extend_from_slice(&vid.to_le_bytes());
    out.push(version);
    for x in vector {
        out.extend_from_slice(&x.to_le_bytes());
    }
}

/// The records of a posting, decoded (buffers reused between reads).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Records {
    pub vids: Vec<u32>,
    pub versions: Vec<u8>,
    /// `vids.len() * dim` values.
    pub vectors: Vec<f32>,
}

impl Records {
    pub fn len(&self) -> usize {
        self.vids.len()
    }
    pub fn is_empty(&self) -> bool {
        self.vids.is_empty()
    }
    pub fn clear(&mut self) {
        self.vids.clear();
        self.versions.clear();
        self.vectors.clear();
    }
    /// Record `i`'s vector.
    pub fn vector(&self, i: usize, dim: usize) -> &[f32] {
        &self.vectors[i * dim..(i + 1) * dim]
    }
    /// Decodes the whole records of `bytes` and appends them; a partial
    /// record is corruption.
    pub fn decode_from(&mut self, bytes: &[u8], dim: usize) -> Result<()> {
        let rb = record_bytes(dim);
        if !bytes.len().is_multiple_of(rb) {
            return Err(Error::corrupted(format!(
                "block store: {} posting bytes are not whole {rb}-byte records",
                bytes.len()
            )));
        }
        let mut r = ByteReader::new(bytes);
        while r.remaining() > 0 {
            self.vids.push(r.u32()?);
            self.versions.push(r.u8()?);
            r.f32s(dim, &mut self.vectors)?;
        }
        Ok(())
    }
    /// Appends every record of `other`.
    pub fn extend_from(&mut self, other: &Records) {
        self.vids.extend_from_slice(&other.vids);
        self.versions.extend_from_slice(&other.versions);
        self.vectors.extend_from_slice(&other.vectors);
    }
    /// The bytes its buffers hold (their capacity, not their length).
    pub fn capacity_bytes(&self) -> usize {
        self.vids.capacity() * 4 + self.versions.capacity() + self.vectors.capacity() * 4
    }
    /// Records `range` of it, as a posting's view.
    pub fn slice(&self, range: std::ops::Range<usize>, dim: usize) -> RecordsView<'_> {
        RecordsView {
            vids: &self.vids[range.clone()],
            versions: &self.versions[range.clone()],
            vectors: &self.vectors[range.start * dim..range.end * dim],
        }
    }
    /// Encodes every record (as [`encode_record`] would, in order).
    pub fn encode(&self, dim: usize, out: &mut Vec<u8>) {
        for i in 0..self.len() {
            encode_record(out, self.vids[i], self.versions[i], self.vector(i, dim));
        }
    }
}

/// The decoded records of one posting, borrowed from the [`Records`] a
/// ParallelGET decoded a whole batch into.
#[derive(Debug, Clone, Copy)]
pub struct RecordsView<'a> {
    pub vids: &'a [u32],
    pub versions: &'a [u8],
    /// `vids.len() * dim` values.
    pub vectors: &'a [f32],
}

impl<'a> RecordsView<'a> {
    pub fn len(&self) -> usize {
        self.vids.len()
    }
    pub fn is_empty(&self) -> bool {
        self.vids.is_empty()
    }
    /// Record `i`'s vector.
    pub fn vector(&self, i: usize, dim: usize) -> &'a [f32] {
        &self.vectors[i * dim..(i + 1) * dim]
    }
}

/// A block of a posting as its mapping entry names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockRef {
    pub block: u32,
    pub gen: u32,
}

/// A posting's mapping entry: its record count and blocks in order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Posting {
    pub records: u32,
    pub blocks: Vec<BlockRef>,
}

/// Blocks a posting of `bytes` bytes occupies.
pub fn blocks_for(bytes: usize) -> usize {
    bytes.div_ceil(PAYLOAD)
}

/// A decoded mapping snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MapImage {
    pub dim: u32,
    /// Entry per posting id; `None`: removed (or never created).
    pub postings: Vec<Option<Posting>>,
    /// Free blocks below `end`.
    pub free: Vec<u32>,
    /// Blocks from `end` on have never been used.
    pub end: u32,
    /// The next write's gen.
    pub gen: u32,
}

/// `MAP_MAGIC ‖ version u32 ‖ dim u32 ‖ end u32 ‖ gen u32 ‖ postings u32 ‖
/// per posting (present u8, then if 1: records u32 ‖ blocks u32 ‖
/// (block u32 ‖ gen u32) × blocks) ‖ free u32 ‖ block u32 × free ‖ crc32
/// u32` of everything before it.
pub fn encode_map(m: &MapImage, out: &mut Vec<u8>) {
    let start = out.len();
    out.extend_from_slice(MAP_MAGIC);
    for v in [MAP_VERSION, m.dim, m.end, m.gen, m.postings.len() as u32] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    for p in &m.postings {
        match p {
            None => out.push(0),
            Some(p) => {
                out.push(1);
                out.extend_from_slice(&p.records.to_le_bytes());
                out.extend_from_slice(&(p.blocks.len() as u32).to_le_bytes());
                for b in &p.blocks {
                    out.extend_from_slice(&b.block.to_le_bytes());
                    out.extend_from_slice(&b.gen.to_le_bytes());
                }
            }
        }
    }
    out.extend_from_slice(&(m.free.len() as u32).to_le_bytes());
    for b in &m.free {
        out.extend_from_slice(&b.to_le_bytes());
    }
    push_crc(out, start);
}

/// Parses an encoded mapping and checks it whole: the CRC, that every
/// posting's blocks hold exactly its records, that no block is named twice
/// (by two postings, or as free and used) and that every block lies in
/// `1..end`. Returns the image and the bytes it took.
pub fn decode_map(bytes: &[u8]) -> Result<(MapImage, usize)> {
    let mut r = ByteReader::new(bytes);
    r.magic_version(MAP_MAGIC, MAP_VERSION, "block mapping")?;
    let dim = r.u32()?;
    if dim == 0 || dim > MAX_DIM {
        return Err(Error::corrupted(format!("block mapping: dimension {dim}")));
    }
    let end = r.u32()?;
    let gen = r.u32()?;
    let n = r.u32()? as usize;
    let bad = |m: &str| Error::corrupted(format!("block mapping: {m}"));
    // One flag byte at least per posting: `n` cannot outrun the input.
    if n > r.remaining() {
        return Err(bad("more postings than bytes"));
    }
    let mut postings = Vec::with_capacity(n);
    for _ in 0..n {
        match r.u8()? {
            0 => postings.push(None),
            1 => {
                let records = r.u32()?;
                let nb = r.u32()? as usize;
                if nb > r.remaining() / 8 {
                    return Err(bad("more blocks than bytes"));
                }
                let mut blocks = Vec::with_capacity(nb);
                for _ in 0..nb {
                    let block = r.u32()?;
                    blocks.push(BlockRef {
                        block,
                        gen: r.u32()?,
                    });
                }
                postings.push(Some(Posting { records, blocks }));
            }
            f => return Err(bad(&format!("posting flag {f}"))),
        }
    }
    let nf = r.u32()? as usize;
    if nf > r.remaining() / 4 {
        return Err(bad("more free blocks than bytes"));
    }
    let mut free = Vec::with_capacity(nf);
    for _ in 0..nf {
        free.push(r.u32()?);
    }
    r.crc_of_preceding("block mapping")?;
    let image = MapImage {
        dim,
        postings,
        free,
        end,
        gen,
    };
    image.check()?;
    Ok((image, r.position()))
}

impl MapImage {
    /// One past the highest block a posting names (1 when none does: block
    /// 0 is the header); the file must hold at least this many blocks.
    pub fn named_end(&self) -> u32 {
        self.postings
            .iter()
            .flatten()
            .flat_map(|p| p.blocks.iter().map(|r| r.block + 1))
            .max()
            .unwrap_or(1)
    }

    /// The structural checks of a mapping: each posting's block count is
    /// what its records need, and no block is 0, at or past `end`, or
    /// named twice (by two postings, or as used and free).
    pub fn check(&self) -> Result<()> {
        let bad = |m: String| Error::corrupted(format!("block mapping: {m}"));
        if self.dim == 0 || self.dim > MAX_DIM {
            return Err(bad(format!("dimension {}", self.dim)));
        }
        let rb = record_bytes(self.dim as usize);
        let mut named: Vec<u32> = self.free.clone();
        for p in self.postings.iter().flatten() {
            if blocks_for(p.records as usize * rb) != p.blocks.len() {
                return Err(bad(format!(
                    "{} records in {} blocks",
                    p.records,
                    p.blocks.len()
                )));
            }
            named.extend(p.blocks.iter().map(|b| b.block));
        }
        named.sort_unstable();
        if let Some(b) = named
            .windows(2)
            .find(|w| w[0] == w[1])
            .map(|w| w[0])
            .or(named.first().filter(|&&b| b == 0).copied())
            .or(named.last().filter(|&&b| b >= self.end).copied())
        {
            return Err(bad(format!(
                "block {b} is past the end, block 0, or named twice"
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_round_trips_and_any_flipped_bit_is_caught() {
        let mut b = vec![0u8; BLOCK];
        let payload: Vec<u8> = (0..300u32).map(|i| i as u8).collect();
        let head = BlockHead {
            posting: 7,
            gen: 42,
            used: 300,
        };
        seal_block(&mut b, head, &payload).unwrap();
        let (h, p) = open_block(&b).unwrap();
        assert_eq!((h, p), (head, &payload[..]));
        for bit in [0, 40, 8 * 20, 8 * 4000, 8 * BLOCK - 1] {
            let mut c = b.clone();
            c[bit / 8] ^= 1 << (bit % 8);
            assert!(
                matches!(open_block(&c), Err(Error::Corrupted(_))),
                "bit {bit}"
            );
        }
    }

    #[test]
    fn records_decode_what_they_encode_and_reject_a_partial_one() {
        let mut bytes = Vec::new();
        encode_record(&mut bytes, 3, 1, &[1.0, 2.0]);
        encode_record(&mut bytes, 9, 127, &[-1.0, 0.5]);
        let mut r = Records::default();
        r.decode_from(&bytes, 2).unwrap();
        assert_eq!(r.vids, [3, 9]);
        assert_eq!(r.versions, [1, 127]);
        assert_eq!(r.vector(1, 2), [-1.0, 0.5]);
        let mut again = Vec::new();
        r.encode(2, &mut again);
        assert_eq!(again, bytes);
        assert!(Records::default().decode_from(&bytes[..20], 2).is_err());
    }

    #[test]
    fn the_store_header_checks_magic_version_and_crc() {
        let mut b = vec![0u8; BLOCK];
        StoreHeader { dim: 50 }.encode(&mut b);
        assert_eq!(StoreHeader::decode(&b).unwrap().dim, 50);
        let mut v = b.clone();
        v[8] = 9;
        assert!(matches!(
            StoreHeader::decode(&v),
            Err(Error::Version { .. })
        ));
        let mut c = b.clone();
        c[13] ^= 1;
        assert!(StoreHeader::decode(&c).is_err());
        assert!(StoreHeader::decode(&[0u8; 10]).is_err());
    }

    fn image() -> MapImage {
        MapImage {
            dim: 4,
            postings: vec![
                Some(Posting {
                    records: 1,
                    blocks: vec![BlockRef { block: 2, gen: 5 }],
                }),
                None,
                Some(Posting::default()),
            ],
            free: vec![1, 3],
            end: 4,
            gen: 6,
        }
    }

    #[test]
    fn a_mapping_round_trips() {
        let mut bytes = vec![];
        encode_map(&image(), &mut bytes);
        let (m, used) = decode_map(&bytes).unwrap();
        assert_eq!(m, image());
        assert_eq!(used, bytes.len());
    }

    #[test]
    fn a_mapping_naming_a_block_twice_or_past_the_end_is_corrupt() {
        for edit in [
            |m: &mut MapImage| m.free.push(2),
            |m: &mut MapImage| m.free.push(4),
            |m: &mut MapImage| m.free.push(0),
            |m: &mut MapImage| m.postings[0].as_mut().unwrap().records = 400,
        ] {
            let mut m = image();
            edit(&mut m);
            let mut bytes = vec![];
            encode_map(&m, &mut bytes);
            assert!(matches!(decode_map(&bytes), Err(Error::Corrupted(_))));
        }
        let mut bytes = vec![];
        encode_map(&image(), &mut bytes);
        for cut in 0..bytes.len() {
            assert!(decode_map(&bytes[..cut]).is_err(), "cut at {cut}");
        }
    }
}
