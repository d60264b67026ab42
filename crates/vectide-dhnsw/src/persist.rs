//! Saving and opening (`docs/format-dhnsw.md`, "the saved file"), and
//! attaching. To a database `d-hnsw` is a volatile engine: a save copies
//! the region's used bytes (its label map among them) into one checksummed
//! file beside the build parameters; an open uploads them into a new region
//! of the memory node it is given and reads the labels from the file's map,
//! not over the network. A compute node naming a region the memory node
//! holds attaches to it instead.

use crate::layout::{Entry, Header, HEADER_BYTES};
use crate::params::DhnswParams;
use crate::state::{DHnsw, Layout, Loc};
use crate::subgraph::SubGraph;
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::Ordering;
use vectide_core::io::{atomic_write, push_crc, ByteReader};
use vectide_core::{Error, Metric, Result};

/// First bytes of a saved file.
pub const FILE_MAGIC: &[u8; 8] = b"VTDHFILE";
/// The saved file's version.
pub const FILE_VERSION: u32 = 1;

/// What a saved file holds.
pub struct Saved {
    pub dim: usize,
    pub metric: Metric,
    pub seq: u64,
    pub region: String,
    pub params: DhnswParams,
    /// The region's bytes `0..alloc_end` (empty for an index never built).
    pub image: Vec<u8>,
}

impl DHnsw {
    /// Writes the saved file (atomically: temp file, fsync, rename).
    pub(crate) fn save_file(&self, path: &Path) -> Result<()> {
        let _w = self.write.lock();
        let mut guard = self.layout.write();
        let (name, image) = match guard.as_mut() {
            Some(lay) => {
                // Every partition held while the bytes are read (other
                // compute nodes may write the region): one moment's image.
                let mine = self.hold_all(lay, &[])?;
                let end = self.read_word(lay, crate::layout::ALLOC_END_AT);
                let read = end.and_then(|end| {
                    lay.header.alloc_end = lay.header.alloc_end.max(end);
                    crate::fetch::read_range(&*self.mem, lay.region, 0, end)
                });
                self.release_all(lay, mine);
                let mut img = read?;
                let at = lay.header.table_off as usize;
                // The held states read as they were before the hold.
                for p in 0..lay.table.len() {
                    let s = at
                        + p * crate::layout::ENTRY_BYTES as usize
                        + crate::layout::ENTRY_STATE_AT as usize;
                    let w = u64::from_le_bytes(img[s..s + 8].try_into().expect("8 bytes"));
                    img[s..s + 8].copy_from_slice(&(w & !1).to_le_bytes());
                }
                // The header as this node knows it (live count now).
                let mut h = lay.header.clone();
                h.live = self.labels.read().len() as u64;
                img[..HEADER_BYTES as usize].copy_from_slice(&h.encode());
                (lay.name.clone(), img)
            }
            None => (String::new(), Vec::new()),
        };
        let seq = self
            .applied
            .load(Ordering::Acquire)
            .max(self.durable.load(Ordering::Acquire));
        let p = &self.params;
        let mut b = Vec::with_capacity(image.len() + 128);
        b.extend_from_slice(FILE_MAGIC);
        b.extend_from_slice(&FILE_VERSION.to_le_bytes());
        b.extend_from_slice(&(self.dim as u32).to_le_bytes());
        b.extend_from_slice(self.metric.name().as_bytes());
        b.push(0);
        b.extend_from_slice(&seq.to_le_bytes());
        for v in [
            p.m as u64,
            p.ef_construction as u64,
            p.partition_points as u64,
            p.partitions.unwrap_or(0) as u64,
            p.gap.to_bits(),
            p.seed,
        ] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(&(name.len() as u32).to_le_bytes());
        b.extend_from_slice(name.as_bytes());
        b.extend_from_slice(&(image.len() as u64).to_le_bytes());
        b.extend_from_slice(&image);
        push_crc(&mut b, 0);
        atomic_write(path, |w| Ok(w.write_all(&b)?))?;
        self.durable.store(seq, Ordering::Release);
        Ok(())
    }
}

/// Reads and checks a saved file.
pub fn read_saved(path: &Path) -> Result<Saved> {
    let bytes = std::fs::read(path).map_err(|e| Error::io_at(path, e))?;
    parse_saved(&bytes)
}

/// Parses a saved file's bytes (checksum first).
pub fn parse_saved(bytes: &[u8]) -> Result<Saved> {
    if bytes.len() < 12 {
        return Err(Error::corrupted("d-hnsw file: too short"));
    }
    let mut c = ByteReader::new(bytes);
    c.bytes(bytes.len() - 4)?;
    c.crc_of_preceding("d-hnsw file")?;
    let mut r = ByteReader::new(bytes);
    r.magic_version(FILE_MAGIC, FILE_VERSION, "d-hnsw file")?;
    let dim = r.u32()? as usize;
    vectide_core::limits::check_dim(dim)
        .map_err(|_| Error::corrupted(format!("d-hnsw file: dimension {dim}")))?;
    let mut name = Vec::new();
    loop {
        match r.u8()? {
            0 => break,
            c if name.len() < 16 => name.push(c),
            _ => return Err(Error::corrupted("d-hnsw file: a metric name too long")),
        }
    }
    let metric = Metric::parse(&String::from_utf8_lossy(&name))
        .map_err(|_| Error::corrupted("d-hnsw file: unknown metric"))?;
    let seq = r.u64()?;
    let (m, efc, pp, k, gap, seed) = (r.u64()?, r.u64()?, r.u64()?, r.u64()?, r.u64()?, r.u64()?);
    let n = r.u32()? as usize;
    if n > 256 {
        return Err(Error::corrupted("d-hnsw file: a region name too long"));
    }
    let region = String::from_utf8(r.bytes(n)?.to_vec())
        .map_err(|_| Error::corrupted("d-hnsw file: a region name not UTF-8"))?;
    let len = r.u64()?;
    if len > r.remaining() as u64 {
        return Err(Error::corrupted("d-hnsw file: the image is cut short"));
    }
    let image = r.bytes(len as usize)?.to_vec();
    let params = DhnswParams {
        m: m as usize,
        ef_construction: efc as usize,
        partition_points: pp as usize,
        partitions: (k > 0).then_some(k as usize),
        gap: f64::from_bits(gap),
        seed,
        ..DhnswParams::default()
    };
    let check = params.to_params();
    DhnswParams::from_params(&check).map_err(|e| Error::corrupted(format!("d-hnsw file: {e}")))?;
    Ok(Saved {
        dim,
        metric,
        seq,
        region,
        params,
        image,
    })
}

/// A region image decoded: header, table, meta-HNSW, live labels.
pub type Image = (Header, Vec<Entry>, SubGraph, Vec<(u64, Loc)>);

/// The layout and label map of a region image (checked throughout).
pub fn decode_image(image: &[u8], dim: usize, seq: u64) -> Result<Image> {
    decode_image_as(image, dim, seq, false)
}

/// [`decode_image`] of a region its memory node's restart left to be put
/// right (`restarted`): every partition is read as one a writer was
/// inside of. A state word is never FLUSHed for its own sake (a restart's
/// recovery takes and publishes every partition again), so after a crash
/// an even one proves nothing: the cache line it shares with the entry's
/// other words may have been kept in part, its state from one write and
/// the words beside it from another.
pub fn decode_image_as(image: &[u8], dim: usize, seq: u64, restarted: bool) -> Result<Image> {
    let mut hr = ByteReader::new(image);
    let head = hr.bytes(HEADER_BYTES as usize)?;
    // The region's size is in the header; check it against itself.
    let size = u64::from_le_bytes(head[80..88].try_into().expect("8 bytes"));
    let mut h = Header::decode(head, size)?;
    if h.dim as usize != dim {
        return Err(Error::invalid(format!(
            "d-hnsw: the region holds {}-d vectors, the index is {dim}-d",
            h.dim
        )));
    }
    if (image.len() as u64) < h.alloc_end {
        return Err(Error::corrupted(
            "d-hnsw: the image ends before the region's used bytes",
        ));
    }
    let rec = u64::from(h.record);
    let t = &image[h.table_off as usize
        ..(h.table_off + u64::from(h.k) * crate::layout::ENTRY_BYTES) as usize];
    let table = Entry::decode_table(t, h.k, rec, h.alloc_end)?;
    let meta_b = &image[h.meta_off as usize..(h.meta_off + h.meta_len) as usize];
    let meta = SubGraph::decode(
        meta_b,
        0,
        false,
        dim,
        h.m as usize,
        h.m0 as usize,
        crate::builder::META_TAG,
    )?;
    let mut parts: Vec<u64> = (0..meta.len() as u32)
        .filter(|&i| !meta.is_deleted(i))
        .map(|i| meta.labels[i as usize])
        .collect();
    parts.sort_unstable();
    if parts.len() != h.k as usize || parts.iter().enumerate().any(|(i, &p)| p != i as u64) {
        return Err(Error::corrupted(
            "d-hnsw: the meta-HNSW does not hold one live node per partition",
        ));
    }
    // The label map: every present value must name a live node holding
    // its label, and every live node must be named.
    let map_at = h.labels_off as usize;
    let map_b =
        &image[map_at..map_at + (h.labels_buckets * crate::labelmap::BUCKET_BYTES) as usize];
    // A partition a writer was inside (its state odd: a writer at work or
    // one that stopped) is not held to the map: its labels are where the
    // map says, unchecked (a rebuild renumbers its nodes while their
    // labels are named again, two at one slot for a while), and a later
    // take-over puts them right.
    let busy: Vec<bool> = table.iter().map(|e| restarted || e.busy()).collect();
    let mut named: std::collections::HashMap<(u32, u32), (u64, u64, u16)> =
        std::collections::HashMap::new();
    let mut locs = Vec::new();
    let mut keys = 0u64;
    for (b, kv) in map_b.chunks_exact(16).enumerate() {
        let key = u64::from_le_bytes(kv[..8].try_into().expect("8 bytes"));
        if key == 0 {
            continue;
        }
        keys += 1;
        let v =
            crate::labelmap::Slot::decode(u64::from_le_bytes(kv[8..].try_into().expect("8 bytes")));
        if !v.present {
            continue;
        }
        if busy.get(v.part as usize).copied().unwrap_or(false) {
            locs.push((
                key - 1,
                Loc {
                    part: v.part,
                    node: v.slot,
                    seq,
                    bucket: b as u64,
                    version: v.version,
                },
            ));
        } else if named
            .insert((v.part, v.slot), (key - 1, b as u64, v.version))
            .is_some()
        {
            return Err(Error::corrupted(format!(
                "d-hnsw: two labels of the label map name partition {} node {}",
                v.part, v.slot
            )));
        }
    }
    for (p, e) in table.iter().enumerate() {
        let (lo, hi) = e.range(rec).expect("checked");
        // The entry must describe its blob as the blob describes itself:
        // node addresses are computed from the entry.
        let bh = crate::layout::BlobHeader::decode(
            &mut ByteReader::new(&image[e.blob_off as usize..(e.blob_off + e.blob_len) as usize]),
            h.dim,
            h.m,
            h.m0,
        )?;
        if u64::from(bh.n) != u64::from(e.n_base)
            || bh.records_at() as u64 != e.records_at
            || bh.bytes() as u64 != e.blob_len
        {
            return Err(Error::corrupted(format!(
                "d-hnsw partition {p}: its table entry does not match its blob"
            )));
        }
        let g = SubGraph::decode(
            &image[lo as usize..hi as usize],
            e.count as usize,
            e.backward,
            dim,
            h.m as usize,
            h.m0 as usize,
            p as u32,
        )?;
        for node in 0..g.len() as u32 {
            if g.is_deleted(node) {
                continue;
            }
            let label = g.labels[node as usize];
            match named.remove(&(p as u32, node)) {
                Some((l, bucket, version)) if l == label => locs.push((
                    label,
                    Loc {
                        part: p as u32,
                        node,
                        seq,
                        bucket,
                        version,
                    },
                )),
                Some((l, ..)) => {
                    return Err(Error::corrupted(format!(
                        "d-hnsw: the label map names partition {p} node {node} for label {l}, which holds label {label}"
                    )))
                }
                // Published in its partition, never in the map: a writer
                // stopped between the two (on a backing file, a crash). Not
                // a point of the index; its room goes at the next rebuild.
                None => {}
            }
        }
    }
    if let Some(((p, node), (l, ..))) = named.into_iter().next() {
        return Err(Error::corrupted(format!(
            "d-hnsw: the label map names partition {p} node {node} for label {l}, which holds no such live node"
        )));
    }
    // The counters as the map and the partitions have them.
    h.keys = keys;
    h.live = locs.len() as u64;
    Ok((h, table, meta, locs))
}

/// Opens a saved index: uploads its image into a new region of the memory
/// node `params` name (or one in this process).
pub fn open(path: &Path, params: &vectide_core::Params) -> Result<DHnsw> {
    let s = read_saved(path)?;
    let p = s.params.reopened(params)?;
    let idx = DHnsw::connect(s.dim, s.metric, p)?;
    idx.durable.store(s.seq, Ordering::Release);
    idx.applied.store(s.seq, Ordering::Release);
    if s.image.is_empty() {
        return Ok(idx);
    }
    let (mut header, table, meta, locs) = decode_image(&s.image, s.dim, s.seq)?;
    if (header.m as usize, header.metric) != (idx.params.m, s.metric) {
        return Err(Error::corrupted(
            "d-hnsw file: the region's degree or metric differs from the file's",
        ));
    }
    let name = idx
        .params
        .region
        .clone()
        .unwrap_or_else(crate::builder::auto_name);
    let region = match idx.mem.create_region(&name, header.region_size) {
        Ok(r) => r,
        // This owner's region, left on a memory node that kept it (a
        // database reopening from its saved file): replaced.
        Err(e) => {
            let ours = idx.params.lease.as_deref().is_some_and(|owner| {
                idx.mem.open_region(&name).is_ok_and(|r| {
                    idx.read_owner(r)
                        .is_ok_and(|(w, ..)| w >> 16 == crate::writers::writer_key(owner))
                })
            });
            if !ours {
                return Err(e);
            }
            idx.mem.drop_region(&name)?;
            idx.mem.create_region(&name, header.region_size)?
        }
    };
    // A new region: put right for the node's current boot. The header but
    // its magic after the rest, the magic last (as a build writes them).
    header.boot = idx.mem.boot() & ((1 << 48) - 1);
    let mut head = s.image[..HEADER_BYTES as usize].to_vec();
    head[crate::layout::BOOT_AT as usize..][..8].copy_from_slice(&header.boot.to_le_bytes());
    // No lease carried over from the file: this node takes one if it is
    // given an owner.
    header.owner = 0;
    head[crate::layout::OWNER_AT as usize..].fill(0);
    let up = crate::fetch::post_phases(
        &*idx.mem,
        region,
        vec![
            (
                crate::sites::BUILD,
                vec![(HEADER_BYTES, s.image[HEADER_BYTES as usize..].to_vec())],
            ),
            (crate::sites::BUILD, vec![(8, head[8..].to_vec())]),
            (crate::sites::BUILD_HEADER, vec![(0, head[..8].to_vec())]),
        ],
    );
    if let Err(e) = up {
        let _ = idx.mem.drop_region(&name);
        return Err(e);
    }
    header.live = locs.len() as u64;
    {
        let mut map = idx.labels.write();
        map.extend(locs);
    }
    *idx.cache.lock() = idx.params.cache(header.k as usize);
    let mut lay = Layout::with_meta(region, name, header, table, meta);
    idx.take_lease(&mut lay)?;
    *idx.layout.write() = Some(lay);
    Ok(idx)
}

/// Attaches `idx` to the region its `region` parameter names, when the
/// memory node already holds one (or its newest `NAME~N`): the header is
/// read and checked (magic, format version, dimension, metric, the
/// region's size), then the whole used range in doorbell chains, decoded
/// and checked as an open checks a saved image, and the labels taken from
/// its label map. Returns whether it attached (false: no such region, the
/// first insert builds it). The attached node reads the partition table
/// again before each search batch and writes like any writer (`locks.rs`).
pub(crate) fn attach(idx: &mut DHnsw) -> Result<bool> {
    if idx.params.memnode.is_none() {
        return Ok(false);
    }
    // A region another compute node moves the index out of meanwhile is
    // dropped under this one's reads: the newest is looked for again.
    let mut moves = 0;
    loop {
        match attach_once(idx) {
            Err(e) if vectide_remote::is_unknown_region(&e) && moves < 8 => moves += 1,
            other => return other,
        }
    }
}

fn attach_once(idx: &mut DHnsw) -> Result<bool> {
    let Some((mut lay, mut locs, loose)) = find_region(idx)? else {
        return Ok(false);
    };
    // A memory node restarted since the region was last put right: put
    // right first (by this node, or another one waited for), then the
    // labels read again, strictly.
    if idx.recover_if_restarted(&mut lay)? || loose {
        match find_region(idx)? {
            Some((l, fresh, _)) => {
                lay = l;
                locs = fresh;
            }
            None => return Ok(false),
        }
    }
    if idx.params.lease.is_some() {
        idx.take_lease(&mut lay)?;
        // Labels as the region holds them once put right.
        if let Some((l, fresh, _)) = find_region(idx)? {
            lay = l;
            locs = fresh;
        }
    }
    let durable = idx.stored_durable(&lay)?;
    idx.durable.store(durable, Ordering::Release);
    idx.applied.store(durable, Ordering::Release);
    idx.params.m = lay.header.m as usize;
    idx.params.partitions = Some(lay.header.k as usize);
    *idx.cache.get_mut() = idx.params.cache(lay.header.k as usize);
    idx.labels.get_mut().extend(locs);
    *idx.layout.get_mut() = Some(lay);
    idx.attached = true;
    Ok(true)
}

/// The newest region of the index's name on the memory node (`NAME`, or
/// the `NAME~N` its writers moved it to), read and checked: its layout and
/// the labels its map names. `None`: no such region.
/// A region found and read: its layout and the labels its map names.
/// The third field: read before the recovery its memory node's restart
/// calls for (every partition taken as busy, its labels unchecked): the
/// caller puts the region right and reads it again.
type Attached = (Layout, Vec<(u64, Loc)>, bool);

fn find_region(idx: &DHnsw) -> Result<Option<Attached>> {
    let Some(name) = idx.params.region.clone() else {
        return Ok(None);
    };
    // The builder moves its index to `NAME~N` when it lays it out afresh:
    // the newest of those is the index.
    let (regions, _) = idx.mem.regions()?;
    let generation = |r: &str| -> Option<u64> {
        if r == name {
            Some(0)
        } else {
            r.strip_prefix(name.as_str())?
                .strip_prefix('~')?
                .parse()
                .ok()
        }
    };
    let mut found: Vec<(u64, String)> = regions
        .iter()
        .filter_map(|r| generation(&r.name).map(|g| (g, r.name.clone())))
        .collect();
    found.sort_unstable_by(|a, b| b.cmp(a));
    // The newest with a header's magic: a newer one without is a move that
    // stopped before its header was durable (the one it left is whole).
    let mut pick = None;
    for (_, n) in &found {
        let r = idx.mem.open_region(n)?;
        let magic = idx.mem.read(r, 0, 8.min(r.size) as u32)?;
        if magic == crate::layout::MAGIC {
            pick = Some(n.clone());
            break;
        }
    }
    let Some(name) = pick.or_else(|| found.first().map(|f| f.1.clone())) else {
        return Ok(None);
    };
    let region = idx.mem.open_region(&name)?;
    if region.size < HEADER_BYTES {
        return Err(Error::invalid(format!(
            "d-hnsw: region {name:?} holds {} bytes, too few for a d-hnsw index ({HEADER_BYTES} bytes of header)",
            region.size
        )));
    }
    let head = idx.mem.read(region, 0, HEADER_BYTES as u32)?;
    let h = Header::decode(&head, region.size)
        .map_err(|e| Error::invalid(format!("d-hnsw: region {name:?}: {e}")))?;
    if h.region_size != region.size {
        return Err(Error::invalid(format!(
            "d-hnsw: region {name:?} has {} bytes, its header says {}",
            region.size, h.region_size
        )));
    }
    if h.dim as usize != idx.dim || h.metric != idx.metric {
        return Err(Error::invalid(format!(
            "d-hnsw: region {name:?} holds a {}-d {} index, this one is {}-d {}",
            h.dim,
            h.metric.name(),
            idx.dim,
            idx.metric.name()
        )));
    }
    // The used bytes read whole and checked. Other compute nodes may be
    // writing meanwhile (a rebuild moves `alloc_end`, an entry and the map
    // change between the reads): what does not check out is read again a
    // few times before it counts as damage.
    let mut tries = 0;
    let ((header, table, meta, locs), loose) = loop {
        let head = idx.mem.read(region, 0, HEADER_BYTES as u32)?;
        let end = Header::decode(&head, region.size).map_or(h.alloc_end, |h| h.alloc_end);
        let image = crate::fetch::read_range(&*idx.mem, region, 0, end)?;
        // Put right for this boot of the memory node, or to be put right
        // (the caller recovers it, then reads it again).
        let restarted = image
            .get(..HEADER_BYTES as usize)
            .and_then(|b| Header::decode(b, region.size).ok())
            .is_some_and(|h| !idx.boot_current(h.boot));
        match decode_image_as(&image, idx.dim, 0, restarted) {
            Ok(x) => break (x, restarted),
            Err(Error::Corrupted(_)) if tries < 8 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(5 << tries));
            }
            Err(e) => return Err(e),
        }
    };
    Ok(Some((
        Layout::with_meta(region, name, header, table, meta),
        locs,
        loose,
    )))
}

impl DHnsw {
    /// After another compute node moved the index to a new region (this
    /// node's calls failed on the dropped one): attaches to the newest
    /// region of the index's name. Returns whether there was one to move to.
    pub(crate) fn reattach(&self) -> Result<bool> {
        if self.params.memnode.is_none() || self.params.region.is_none() {
            return Ok(false);
        }
        let Some((mut lay, mut locs, loose)) = find_region(self)? else {
            return Ok(false);
        };
        if loose {
            // Its memory node restarted: put right, then read again.
            self.recover_if_restarted(&mut lay)?;
            match find_region(self)? {
                Some((l, fresh, _)) => {
                    lay = l;
                    locs = fresh;
                }
                None => return Ok(false),
            }
        }
        let mut guard = self.layout.write();
        if guard.as_ref().is_some_and(|l| l.name == lay.name) {
            return Ok(false);
        }
        {
            let mut labels = self.labels.write();
            let seqs: HashMap<u64, u64> = labels.iter().map(|(l, loc)| (*l, loc.seq)).collect();
            labels.clear();
            labels.extend(locs.into_iter().map(|(l, mut loc)| {
                loc.seq = seqs.get(&l).copied().unwrap_or(0);
                (l, loc)
            }));
        }
        *self.cache.lock() = self.params.cache(lay.header.k as usize);
        self.stuck.lock().clear();
        self.leased.on_region(lay.region);
        *guard = Some(lay);
        Ok(true)
    }
}

/// Describes a region on a live memory node (`vectide inspect --memnode
/// ADDR --region NAME`): the header, then every partition read (in
/// doorbell chains) and checked, as `(field, value)` rows.
pub fn inspect_region(addr: &str, name: &str, timeout_ms: u64) -> Result<Vec<(String, String)>> {
    use vectide_remote::RemoteMemory;
    let mem = vectide_remote::TcpMemory::connect(
        addr,
        vectide_remote::TcpOptions {
            timeout: std::time::Duration::from_millis(timeout_ms),
            ..Default::default()
        },
    )?;
    let region = mem.open_region(name)?;
    let head = mem.read(region, 0, HEADER_BYTES.min(region.size) as u32)?;
    let h = Header::decode(&head, region.size)?;
    let image = crate::fetch::read_range(&mem, region, 0, h.alloc_end)?;
    // Not yet put right after its memory node restarted: its partitions
    // are read as busy (see `decode_image_as`).
    let restarted = !crate::recovery::boot_is_current(&mem, h.boot);
    let (_, table, _, locs) = decode_image_as(&image, h.dim as usize, 0, restarted)?;
    let mut rows = vec![
        ("engine", "d-hnsw".to_string()),
        ("memnode", addr.to_string()),
        ("region", name.to_string()),
        ("format_version", crate::layout::VERSION.to_string()),
        ("dim", h.dim.to_string()),
        ("metric", h.metric.name().to_string()),
    ];
    rows.extend(crate::layout_rows(&h, &table, locs.len()));
    Ok(rows.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
}
