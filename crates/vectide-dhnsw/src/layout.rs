//! The bytes of a d-HNSW region (`docs/format-dhnsw.md`): the header, the
//! partition table, and graph blobs (the meta-HNSW and each partition's
//! sub-HNSW) whose node records share one format with the overflow records
//! inserts add. Every decoder goes through the bounds-checked
//! [`ByteReader`] and checks magic, version and sizes against what the
//! header promised.

use vectide_core::io::ByteReader;
use vectide_core::{Error, Metric, Result};

/// First bytes of a region.
pub const MAGIC: &[u8; 8] = b"VTDHNSW\0";
/// The region format's version (2 added the label map; 3 the writer
/// table and the partition entries' rebuild intents).
pub const VERSION: u32 = 3;
/// Bytes reserved for the header at offset 0.
pub const HEADER_BYTES: u64 = 256;
/// The writer table: right after the header, [`WRITER_SLOTS`] slots of
/// [`WRITER_BYTES`]; the other sections start after it.
pub const WRITERS_AT: u64 = HEADER_BYTES;
pub const WRITER_SLOTS: u64 = 32;
pub const WRITER_BYTES: u64 = 32;
/// Where a region's sections (meta-HNSW, table, …) may start.
pub const SECTIONS_AT: u64 = WRITERS_AT + WRITER_SLOTS * WRITER_BYTES;
/// Offset of an entry's rebuild intent (7 words, the last a check word).
pub const ENTRY_INTENT_AT: u64 = 72;
const INTENT_WORDS: usize = 7;
/// The high half of a live intent's check word (its low half: a CRC-32 of
/// the six words before it).
const INTENT_TAG: u64 = 0x1a7e_0000_0000_0000;
/// First bytes of a graph blob.
pub const BLOB_MAGIC: &[u8; 8] = b"VTDHBLB\0";
/// Bytes of a blob's own header.
pub const BLOB_HEADER: usize = 48;
/// Bytes of one partition-table entry.
pub const ENTRY_BYTES: u64 = 128;
/// Offset of the state word inside an entry: the partition's version,
/// raised by 1 (to odd) when a writer begins changing the partition and by
/// 1 again (to even) when it has published the change; readers check it
/// before and after what they read (a seqlock).
pub const ENTRY_STATE_AT: u64 = 64;
/// Offset of the overflow count word inside an entry.
pub const ENTRY_COUNT_AT: u64 = 24;
/// Offsets of the header's epoch and alloc_end words.
pub const EPOCH_AT: u64 = 40;
pub const ALLOC_END_AT: u64 = 72;
/// Offset of the header's live-count word (changed by FETCH_ADD).
pub const LIVE_AT: u64 = 88;
/// Offset of the header's word counting the label map's taken buckets
/// (changed by FETCH_ADD).
pub const KEYS_AT: u64 = 112;
/// Offset of the free table's lock word (even: free; odd: held).
pub const FREE_LOCK_AT: u64 = 136;
/// Offset of the header's boot word: the memory node's boot number (see
/// `vectide_remote::RemoteMemory::boot`) the region was last put right in
/// (its lock words all belonging to live writers of that boot); with
/// [`RECOVERING`] set, a compute node is putting it right for that boot.
pub const BOOT_AT: u64 = 144;
/// Offset of the header's owner word: the lease (`lease.rs`), the owner's
/// key in the high 48 bits and the lease's epoch in the low 16; 0: none.
pub const OWNER_AT: u64 = 152;
/// Offset of the lease's beat word (raised by the holder as it renews).
pub const BEAT_AT: u64 = 160;
/// Offset of the lease holder's name (a length byte, then up to
/// [`OWNER_NAME_MAX`] bytes), for messages.
pub const OWNER_NAME_AT: u64 = 168;
pub const OWNER_NAME_MAX: u64 = 72;
/// Offset of the header's owed word: upserts that moved a label and have
/// not yet tombstoned its old node (raised before the new node is
/// published, lowered once the old one is tombstoned; see `sweep.rs`).
pub const OWED_AT: u64 = 248;
/// The boot word's mark of a recovery under way (bits 48..63 count the
/// attempts, so that a stopped recovery is seen to stop and taken over).
pub const RECOVERING: u64 = 1 << 63;
/// A node record's flag: deleted (a tombstone; searches walk through it).
pub const DELETED: u32 = 1;
/// Offset of the flags word inside a node record.
pub const RECORD_FLAGS_AT: u64 = 8;
/// Offset of the layer-0 list (`count, m0 entries`) inside a node record.
pub const RECORD_LIST_AT: u64 = 12;
/// No entry point (an empty graph).
pub const NO_NODE: u32 = u32::MAX;
/// Largest `m0` and level a region may declare.
const MAX_M0: u32 = 512;
const MAX_LEVEL: u32 = 32;

fn metric_code(m: Metric) -> u8 {
    match m {
        Metric::L2 => 0,
        Metric::Cosine => 1,
        Metric::Ip => 2,
    }
}

fn metric_of(code: u8) -> Result<Metric> {
    match code {
        0 => Ok(Metric::L2),
        1 => Ok(Metric::Cosine),
        2 => Ok(Metric::Ip),
        c => Err(Error::corrupted(format!(
            "d-hnsw region: unknown metric code {c}"
        ))),
    }
}

/// Bytes of a node record: label, flags, the layer-0 list and the vector,
/// rounded up to 8.
pub fn record_bytes(dim: usize, m0: usize) -> usize {
    (16 + 4 * m0 + 4 * dim).next_multiple_of(8)
}

/// The region's header.
#[derive(Debug, Clone, PartialEq)]
pub struct Header {
    pub dim: u32,
    pub metric: Metric,
    pub m: u32,
    pub m0: u32,
    /// Partitions.
    pub k: u32,
    /// Bytes of a node record.
    pub record: u32,
    /// Raised whenever the table's layout changes (a partition rebuilt).
    pub epoch: u64,
    pub meta_off: u64,
    pub meta_len: u64,
    pub table_off: u64,
    /// End of the bytes handed out (everything above is free).
    pub alloc_end: u64,
    pub region_size: u64,
    /// Live points (kept by FETCH_ADD as labels come and go).
    pub live: u64,
    /// The label map: its offset and buckets (a power of two).
    pub labels_off: u64,
    pub labels_buckets: u64,
    /// Buckets of the label map with a key (kept by FETCH_ADD).
    pub keys: u64,
    /// The free table: its offset and slots (16 bytes each).
    pub free_off: u64,
    pub free_slots: u64,
    /// The boot word ([`BOOT_AT`]) as written at the build.
    pub boot: u64,
    /// The owner word ([`OWNER_AT`]) as written at the build.
    pub owner: u64,
}

impl Header {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(HEADER_BYTES as usize);
        b.extend_from_slice(MAGIC);
        for v in [self.dim, VERSION, self.m, self.m0, self.k, self.record] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(&[metric_code(self.metric), 0, 0, 0, 0, 0, 0, 0]);
        for v in [
            self.epoch,
            self.meta_off,
            self.meta_len,
            self.table_off,
            self.alloc_end,
            self.region_size,
            self.live,
            self.labels_off,
            self.labels_buckets,
            self.keys,
            self.free_off,
            self.free_slots,
        ] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        // The free table's lock, free.
        b.extend_from_slice(&0u64.to_le_bytes());
        b.extend_from_slice(&self.boot.to_le_bytes());
        b.extend_from_slice(&self.owner.to_le_bytes());
        b.resize(HEADER_BYTES as usize, 0);
        b
    }

    /// Decodes and checks a header read from a region of `region_size`
    /// bytes: magic, version, dimensions and that every section it names
    /// lies inside the region.
    pub fn decode(bytes: &[u8], region_size: u64) -> Result<Header> {
        let mut r = ByteReader::new(bytes);
        let magic = r.bytes(8)?;
        if magic != MAGIC {
            return Err(Error::corrupted(format!(
                "the region holds no d-hnsw index (magic {magic:02x?})"
            )));
        }
        let dim = r.u32()?;
        let version = r.u32()?;
        if version != VERSION {
            return Err(Error::invalid(format!(
                "the region's d-hnsw format is version {version}; this build reads version {VERSION}"
            )));
        }
        let (m, m0, k, record) = (r.u32()?, r.u32()?, r.u32()?, r.u32()?);
        let metric = metric_of(r.u8()?)?;
        r.bytes(7)?;
        let h = Header {
            dim,
            metric,
            m,
            m0,
            k,
            record,
            epoch: r.u64()?,
            meta_off: r.u64()?,
            meta_len: r.u64()?,
            table_off: r.u64()?,
            alloc_end: r.u64()?,
            region_size: r.u64()?,
            live: r.u64()?,
            labels_off: r.u64()?,
            labels_buckets: r.u64()?,
            keys: r.u64()?,
            free_off: r.u64()?,
            free_slots: r.u64()?,
            boot: {
                r.u64()?; // the free table's lock
                r.u64()?
            },
            owner: r.u64()?,
        };
        let bad = |what: &str| Err(Error::corrupted(format!("d-hnsw header: {what}")));
        if dim == 0 || dim as usize > vectide_core::limits::MAX_DIM {
            return bad(&format!("dimension {dim}"));
        }
        if m < 2 || m0 > MAX_M0 || u64::from(m0) != 2 * u64::from(m) {
            return bad(&format!("degrees m {m}, m0 {m0}"));
        }
        if k == 0 {
            return bad("no partitions");
        }
        if record as usize != record_bytes(dim as usize, m0 as usize) {
            return bad(&format!("record size {record}"));
        }
        if h.region_size != region_size {
            return bad(&format!(
                "written for a region of {} bytes, found {region_size}",
                h.region_size
            ));
        }
        let end = |off: u64, len: u64| off.checked_add(len).filter(|&e| e <= h.alloc_end);
        if h.alloc_end > region_size
            || end(h.meta_off, h.meta_len).is_none()
            || end(h.table_off, u64::from(k) * ENTRY_BYTES).is_none()
            || h.table_off < SECTIONS_AT
            || h.meta_off < SECTIONS_AT
            || h.labels_off < SECTIONS_AT
            || !h.labels_off.is_multiple_of(8)
            || !h.labels_buckets.is_power_of_two()
            || h.labels_buckets < crate::labelmap::WINDOW
            || h.labels_buckets
                .checked_mul(crate::labelmap::BUCKET_BYTES)
                .and_then(|b| end(h.labels_off, b))
                .is_none()
            || h.free_off < SECTIONS_AT
            || !h.free_off.is_multiple_of(8)
            || h.free_slots
                .checked_mul(crate::space::FREE_SLOT_BYTES)
                .and_then(|b| end(h.free_off, b))
                .is_none()
        {
            return bad("a section outside the region");
        }
        Ok(h)
    }
}

/// One partition's table entry. A partition's sub-HNSW is a graph blob
/// at `blob_off .. blob_off + blob_len` holding `n_base` node records, and
/// `count` overflow records in its gap: after the blob (`backward` false)
/// or before it (`backward` true). Two partitions share one gap
/// `gap_lo .. gap_hi`, one growing forward from its start, one backward
/// from its end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Entry {
    pub blob_off: u64,
    pub blob_len: u64,
    pub n_base: u32,
    pub backward: bool,
    /// Overflow records written.
    pub count: u64,
    pub epoch: u64,
    pub gap_lo: u64,
    pub gap_hi: u64,
    /// Offset of the first node record inside the blob.
    pub records_at: u64,
    /// The partition's version (see [`ENTRY_STATE_AT`]): odd while a writer
    /// changes it.
    pub state: u64,
    /// The fields come from a live rebuild intent (a writer stopped between
    /// writing it and clearing it): whoever holds the partition next folds
    /// it into the fields ([`Entry::intent_bytes`]) before anything else.
    pub intent: bool,
}

impl Entry {
    pub fn encode(&self) -> [u8; ENTRY_BYTES as usize] {
        let mut b = [0u8; ENTRY_BYTES as usize];
        b[0..8].copy_from_slice(&self.blob_off.to_le_bytes());
        b[8..16].copy_from_slice(&self.blob_len.to_le_bytes());
        b[16..20].copy_from_slice(&self.n_base.to_le_bytes());
        b[20..24].copy_from_slice(&u32::from(self.backward).to_le_bytes());
        b[24..32].copy_from_slice(&self.count.to_le_bytes());
        b[32..40].copy_from_slice(&self.epoch.to_le_bytes());
        b[40..48].copy_from_slice(&self.gap_lo.to_le_bytes());
        b[48..56].copy_from_slice(&self.gap_hi.to_le_bytes());
        b[56..64].copy_from_slice(&self.records_at.to_le_bytes());
        b[64..72].copy_from_slice(&self.state.to_le_bytes());
        b
    }

    /// The entry's fields (bytes `0..64`, without the state word): what a
    /// rebuild writes once its intent is durable.
    pub fn field_bytes(&self) -> Vec<u8> {
        self.encode()[..ENTRY_STATE_AT as usize].to_vec()
    }

    /// The rebuild intent of this entry (bytes `72..128`): where the
    /// partition's rebuilt graph is, for a fresh entry (no overflow, a
    /// forward gap right after the blob). Written, and made durable, before
    /// the fields are changed; while its check word holds, readers take the
    /// entry from it, so a crash that tears the fields' 64 bytes leaves a
    /// whole entry, old or new.
    pub fn intent_bytes(&self) -> Vec<u8> {
        let words = [
            self.blob_off,
            self.blob_len,
            u64::from(self.n_base),
            self.gap_hi,
            self.records_at,
            self.epoch,
        ];
        let mut b: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        let check = INTENT_TAG | u64::from(crc32fast::hash(&b));
        b.extend_from_slice(&check.to_le_bytes());
        b
    }

    /// Where an entry's intent check word is (cleared once the fields
    /// hold the rebuild).
    pub const INTENT_CHECK_AT: u64 = ENTRY_INTENT_AT + 8 * (INTENT_WORDS as u64 - 1);

    /// Whether an entry's bytes (`ENTRY_BYTES`) hold a *stale* intent: a
    /// check word that is not zero, over words that do not match it (a
    /// crash tore the intent's write, its words from two writes). Left
    /// standing, a later write of the same words (a rebuild into the same
    /// area) would make it whole again, naming an area the stale intent's
    /// writer never finished and a recovery may have handed out since.
    pub fn stale_intent(entry: &[u8]) -> bool {
        let rest = &entry[ENTRY_INTENT_AT as usize..ENTRY_BYTES as usize];
        let check = u64::from_le_bytes(
            rest[8 * (INTENT_WORDS - 1)..8 * INTENT_WORDS]
                .try_into()
                .expect("8 bytes"),
        );
        check != 0 && Entry::from_intent(rest, 0).is_none()
    }

    /// The entry an intent describes (`None`: no live intent).
    fn from_intent(b: &[u8], state: u64) -> Option<Entry> {
        let w = |i: usize| u64::from_le_bytes(b[8 * i..8 * i + 8].try_into().expect("8 bytes"));
        let check = w(INTENT_WORDS - 1);
        if check & !0xffff_ffff != INTENT_TAG
            || check & 0xffff_ffff != u64::from(crc32fast::hash(&b[..8 * (INTENT_WORDS - 1)]))
        {
            return None;
        }
        let (blob_off, blob_len) = (w(0), w(1));
        Some(Entry {
            blob_off,
            blob_len,
            n_base: u32::try_from(w(2)).ok()?,
            backward: false,
            count: 0,
            epoch: w(5),
            gap_lo: blob_off.checked_add(blob_len)?,
            gap_hi: w(3),
            records_at: w(4),
            state,
            intent: true,
        })
    }

    /// Whether a writer is changing the partition (its state is odd).
    pub fn busy(&self) -> bool {
        self.state % 2 == 1
    }

    /// Decodes the table (`k` entries) and checks every blob and gap lies
    /// below `alloc_end` and every overflow fits its gap.
    pub fn decode_table(bytes: &[u8], k: u32, record: u64, alloc_end: u64) -> Result<Vec<Entry>> {
        let mut r = ByteReader::new(bytes);
        let mut out = Vec::with_capacity(k as usize);
        for i in 0..k {
            let e = Entry {
                blob_off: r.u64()?,
                blob_len: r.u64()?,
                n_base: r.u32()?,
                backward: match r.u32()? {
                    0 => false,
                    1 => true,
                    v => {
                        return Err(Error::corrupted(format!(
                            "d-hnsw partition {i}: direction {v}"
                        )))
                    }
                },
                count: r.u64()?,
                epoch: r.u64()?,
                gap_lo: r.u64()?,
                gap_hi: r.u64()?,
                records_at: r.u64()?,
                state: r.u64()?,
                intent: false,
            };
            let rest = r.bytes((ENTRY_BYTES - ENTRY_INTENT_AT) as usize)?;
            let e = if crate::switches::IGNORE_INTENTS.on() {
                e
            } else {
                Entry::from_intent(rest, e.state).unwrap_or(e)
            };
            let (lo, hi) = e.range(record).ok_or_else(|| {
                Error::corrupted(format!("d-hnsw partition {i}: its bytes overflow"))
            })?;
            if hi > alloc_end
                || e.gap_lo > e.gap_hi
                || e.gap_hi > alloc_end
                || lo < SECTIONS_AT
                || e.records_at > e.blob_len
                || (e.count > 0
                    && (e.overflow_lo(record) < e.gap_lo || e.overflow_hi(record) > e.gap_hi))
            {
                return Err(Error::corrupted(format!(
                    "d-hnsw partition {i}: bytes {lo}..{hi} or gap {}..{} outside the region's {alloc_end} bytes",
                    e.gap_lo, e.gap_hi
                )));
            }
            out.push(e);
        }
        Ok(out)
    }

    /// The overflow's bytes (empty when `count` is 0).
    pub fn overflow_lo(&self, record: u64) -> u64 {
        if self.backward {
            self.blob_off.saturating_sub(self.count * record)
        } else {
            self.blob_off + self.blob_len
        }
    }

    pub fn overflow_hi(&self, record: u64) -> u64 {
        if self.backward {
            self.blob_off
        } else {
            self.blob_off + self.blob_len + self.count * record
        }
    }

    /// What one READ of the partition covers: the blob and its overflow.
    pub fn range(&self, record: u64) -> Option<(u64, u64)> {
        let over = self.count.checked_mul(record)?;
        if self.backward {
            Some((
                self.blob_off.checked_sub(over)?,
                self.blob_off.checked_add(self.blob_len)?,
            ))
        } else {
            Some((
                self.blob_off,
                self.blob_off
                    .checked_add(self.blob_len)?
                    .checked_add(over)?,
            ))
        }
    }

    /// Where node `id` of the partition lies (blob records, then overflow).
    pub fn node_at(&self, id: u64, record: u64) -> u64 {
        if id < u64::from(self.n_base) {
            self.blob_off + self.records_at + id * record
        } else {
            self.overflow_at(id - u64::from(self.n_base), record)
        }
    }

    /// Where overflow record `j` (0-based) goes.
    pub fn overflow_at(&self, j: u64, record: u64) -> u64 {
        if self.backward {
            self.blob_off - (j + 1) * record
        } else {
            self.blob_off + self.blob_len + j * record
        }
    }
}

/// A graph to lay out: nodes `0..n` with labels, levels, vectors and one
/// list per level, and the entry point.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GraphParts {
    pub dim: usize,
    pub m: usize,
    pub m0: usize,
    pub entry: Option<(u32, usize)>,
    pub labels: Vec<u64>,
    pub flags: Vec<u32>,
    pub levels: Vec<u8>,
    pub vectors: Vec<f32>,
    pub lists: Vec<Vec<Vec<u32>>>,
}

/// Where a blob's node records start, and its length, for a graph.
fn upper_words(g: &GraphParts) -> (usize, usize) {
    let nodes = g.levels.iter().filter(|&&l| l > 0).count();
    let words: usize = g.levels.iter().map(|&l| l as usize * (1 + g.m)).sum();
    (nodes, words)
}

/// Encodes a graph blob: header, the upper layers' index and lists, then
/// one node record per node.
pub fn encode_blob(g: &GraphParts, tag: u32) -> Vec<u8> {
    let n = g.labels.len();
    let rec = record_bytes(g.dim, g.m0);
    let (up_nodes, up_words) = upper_words(g);
    let mut b = Vec::with_capacity(BLOB_HEADER + 12 * up_nodes + 4 * up_words + 8 + n * rec);
    b.extend_from_slice(BLOB_MAGIC);
    let (ep, top) = g.entry.map_or((NO_NODE, 0), |(e, t)| (e, t as u32));
    for v in [
        n as u32,
        g.dim as u32,
        g.m as u32,
        g.m0 as u32,
        ep,
        top,
        up_nodes as u32,
        up_words as u32,
        rec as u32,
        tag,
    ] {
        b.extend_from_slice(&v.to_le_bytes());
    }
    let mut first = 0u32;
    for (node, &l) in g.levels.iter().enumerate() {
        if l > 0 {
            for v in [node as u32, u32::from(l), first] {
                b.extend_from_slice(&v.to_le_bytes());
            }
            first += u32::from(l) * (1 + g.m as u32);
        }
    }
    for (node, &l) in g.levels.iter().enumerate() {
        for level in 1..=l as usize {
            let list = &g.lists[node][level];
            let c = list.len().min(g.m);
            b.extend_from_slice(&(c as u32).to_le_bytes());
            for i in 0..g.m {
                let v = list.get(i).filter(|_| i < c).copied().unwrap_or(0);
                b.extend_from_slice(&v.to_le_bytes());
            }
        }
    }
    b.resize(b.len().next_multiple_of(8), 0);
    for node in 0..n {
        encode_record(
            &mut b,
            g.labels[node],
            g.flags.get(node).copied().unwrap_or(0),
            &g.lists[node][0],
            g.m0,
            &g.vectors[node * g.dim..(node + 1) * g.dim],
        );
    }
    b
}

/// Appends one node record.
pub fn encode_record(b: &mut Vec<u8>, label: u64, flags: u32, list: &[u32], m0: usize, v: &[f32]) {
    let start = b.len();
    b.extend_from_slice(&label.to_le_bytes());
    b.extend_from_slice(&flags.to_le_bytes());
    encode_list(b, list, m0);
    for x in v {
        b.extend_from_slice(&x.to_le_bytes());
    }
    b.resize(start + record_bytes(v.len(), m0), 0);
}

/// Appends a layer-0 list as stored in a record: count, then `m0` words.
pub fn encode_list(b: &mut Vec<u8>, list: &[u32], m0: usize) {
    let c = list.len().min(m0);
    b.extend_from_slice(&(c as u32).to_le_bytes());
    for i in 0..m0 {
        b.extend_from_slice(
            &list
                .get(i)
                .filter(|_| i < c)
                .copied()
                .unwrap_or(0)
                .to_le_bytes(),
        );
    }
}

/// A blob's header fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlobHeader {
    pub n: u32,
    pub dim: u32,
    pub m: u32,
    pub m0: u32,
    pub entry: u32,
    pub top: u32,
    pub up_nodes: u32,
    pub up_words: u32,
    pub record: u32,
    pub tag: u32,
}

impl BlobHeader {
    /// Byte offset of the first node record inside the blob.
    pub fn records_at(&self) -> usize {
        (BLOB_HEADER + 12 * self.up_nodes as usize + 4 * self.up_words as usize).next_multiple_of(8)
    }

    /// The blob's length.
    pub fn bytes(&self) -> usize {
        self.records_at() + self.n as usize * self.record as usize
    }

    pub fn decode(r: &mut ByteReader<'_>, dim: u32, m: u32, m0: u32) -> Result<BlobHeader> {
        let magic = r.bytes(8)?;
        if magic != BLOB_MAGIC {
            return Err(Error::corrupted(format!(
                "d-hnsw: not a graph blob (magic {magic:02x?})"
            )));
        }
        let h = BlobHeader {
            n: r.u32()?,
            dim: r.u32()?,
            m: r.u32()?,
            m0: r.u32()?,
            entry: r.u32()?,
            top: r.u32()?,
            up_nodes: r.u32()?,
            up_words: r.u32()?,
            record: r.u32()?,
            tag: r.u32()?,
        };
        if (h.dim, h.m, h.m0) != (dim, m, m0)
            || h.record as usize != record_bytes(dim as usize, m0 as usize)
            || h.top > MAX_LEVEL
            || (h.entry != NO_NODE && h.entry >= h.n)
            || h.up_nodes > h.n
        {
            return Err(Error::corrupted(format!(
                "d-hnsw blob {}: header {h:?} does not match the region's dim {dim}, m {m}, m0 {m0}",
                h.tag
            )));
        }
        Ok(h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graph(n: usize, dim: usize) -> GraphParts {
        GraphParts {
            dim,
            m: 2,
            m0: 4,
            entry: Some((1, 1)),
            labels: (0..n as u64).map(|i| 100 + i).collect(),
            flags: vec![0; n],
            levels: (0..n).map(|i| u8::from(i == 1)).collect(),
            vectors: (0..n * dim).map(|i| i as f32).collect(),
            lists: (0..n)
                .map(|i| {
                    let mut l = vec![vec![((i + 1) % n) as u32]];
                    if i == 1 {
                        l.push(vec![0]);
                    }
                    l
                })
                .collect(),
        }
    }

    #[test]
    fn a_blob_is_as_long_as_its_header_says() {
        let g = graph(5, 3);
        let b = encode_blob(&g, 7);
        let h = BlobHeader::decode(&mut ByteReader::new(&b), 3, 2, 4).unwrap();
        assert_eq!(h.bytes(), b.len());
        assert_eq!((h.n, h.tag, h.entry, h.top, h.up_nodes), (5, 7, 1, 1, 1));
        assert!(BlobHeader::decode(&mut ByteReader::new(&b), 4, 2, 4).is_err());
    }

    #[test]
    fn header_and_table_round_trip_and_are_checked() {
        let h = Header {
            dim: 3,
            metric: Metric::Cosine,
            m: 2,
            m0: 4,
            k: 2,
            record: record_bytes(3, 4) as u32,
            epoch: 9,
            meta_off: 1280,
            meta_len: 100,
            table_off: 1384,
            alloc_end: 4096,
            region_size: 8192,
            live: 5,
            labels_off: 2048,
            labels_buckets: 64,
            keys: 7,
            free_off: 3072,
            free_slots: 4,
            boot: 3,
            owner: 5 << 16 | 2,
        };
        let b = h.encode();
        assert_eq!(Header::decode(&b, 8192).unwrap(), h);
        assert!(Header::decode(&b, 4096).is_err(), "another region size");
        let mut v4 = b.clone();
        v4[12] = 4;
        let e = Header::decode(&v4, 8192).unwrap_err();
        assert!(e.to_string().contains("version 4"), "{e}");
        // A label map outside the used bytes, over the writer table, or not
        // a power of two.
        for (buckets, off) in [
            (48u64, 2048u64),
            (512, 2048),
            (64, 4000),
            (64, 2052),
            (64, 1024),
        ] {
            let bad = Header {
                labels_buckets: buckets,
                labels_off: off,
                ..h.clone()
            };
            assert!(
                Header::decode(&bad.encode(), 8192).is_err(),
                "{buckets} at {off}"
            );
        }
        let e = Entry {
            blob_off: 3000,
            blob_len: 200,
            n_base: 3,
            backward: true,
            count: 2,
            epoch: 1,
            gap_lo: 2500,
            gap_hi: 3000,
            records_at: 56,
            state: 7,
            intent: false,
        };
        assert!(e.busy() && !Entry { state: 8, ..e }.busy());
        let rec = h.record as u64;
        let mut t = e.encode().to_vec();
        t.extend_from_slice(
            &Entry {
                backward: false,
                count: 0,
                ..e
            }
            .encode(),
        );
        let got = Entry::decode_table(&t, 2, rec, 4096).unwrap();
        assert_eq!(got[0], e);
        assert_eq!(got[0].range(rec), Some((3000 - 2 * rec, 3200)));
        assert_eq!(got[0].overflow_at(0, rec), 3000 - rec);
        assert!(
            Entry::decode_table(&t, 2, rec, 3100).is_err(),
            "past alloc_end"
        );
        let over = Entry { count: 100, ..e };
        assert!(
            Entry::decode_table(&over.encode(), 1, rec, 4096).is_err(),
            "overflow past its gap"
        );
    }
}
