//! The bytes of the SSD long-term index (LTI): `docs/format-lti.md`.
//!
//! An LTI file is whole 4 KiB sectors. Sector 0 is the header; node records
//! follow from sector 1, packed `nodes_per_sector` to a sector when a node
//! fits in one, otherwise spanning `sectors_per_node` sectors each. Every
//! sector ends with the CRC-32 of its first 4,092 bytes, checked on every
//! read: a flipped bit on disk is an error, never a wrong answer.
//!
//! A node record is `vector (dim f32) ‖ label (u64) ‖ degree (u32) ‖
//! max_degree u32 neighbour ids` (unused ids zero). The PQ codes and
//! pivots live in their own file ([`PqFile`]), loaded into RAM.

use vectide_core::io::ByteReader;
use vectide_core::{Error, Metric, Result};
use vectide_quant::ProductQuantizer;
use vectide_storage::block::{AlignedBuf, BLOCK};

/// First bytes of an LTI file.
pub const MAGIC: &[u8; 8] = b"VTDXLTI\0";
/// The LTI format version this build reads and writes.
pub const VERSION: u32 = 1;
/// Bytes of a sector before its CRC.
pub const PAYLOAD: usize = BLOCK - 4;
/// Header bytes before its CRC (the rest of sector 0 is zero).
pub const HEADER_LEN: usize = 72;
/// Largest dimension and degree a header may name.
pub const MAX_DIM: u32 = 65_536;
pub const MAX_DEGREE: u32 = 4096;
/// The label of a record that holds no point (never returned).
pub const NO_LABEL: u64 = u64::MAX;

/// The LTI header (sector 0).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Header {
    pub metric: Metric,
    pub dim: u32,
    /// Neighbour slots per record.
    pub max_degree: u32,
    /// Node records.
    pub nodes: u64,
    /// The entry node of every search.
    pub start: u64,
    /// Highest operation sequence number the index contains.
    pub durable_seq: u64,
    /// Bytes per PQ code (the PQ file's `m`).
    pub pq_bytes: u32,
}

impl Header {
    /// Bytes of one node record.
    pub fn node_bytes(&self) -> usize {
        self.dim as usize * 4 + 8 + 4 + self.max_degree as usize * 4
    }

    /// Records per sector (0 when a record spans several sectors).
    pub fn nodes_per_sector(&self) -> usize {
        PAYLOAD / self.node_bytes()
    }

    /// Sectors a record occupies (1 when several share a sector).
    pub fn sectors_per_node(&self) -> usize {
        if self.nodes_per_sector() > 0 {
            1
        } else {
            self.node_bytes().div_ceil(PAYLOAD)
        }
    }

    /// The first sector of node `i` and its byte offset in that sector's
    /// payload (0 for spanning records).
    pub fn locate(&self, i: u64) -> (u64, usize) {
        let nps = self.nodes_per_sector() as u64;
        match i.checked_div(nps) {
            Some(sector) => (1 + sector, (i % nps) as usize * self.node_bytes()),
            None => (1 + i * self.sectors_per_node() as u64, 0),
        }
    }

    /// Sectors after the header.
    pub fn data_sectors(&self) -> u64 {
        let nps = self.nodes_per_sector() as u64;
        if nps > 0 {
            self.nodes.div_ceil(nps)
        } else {
            self.nodes * self.sectors_per_node() as u64
        }
    }

    /// Sector 0.
    pub fn encode(&self) -> AlignedBuf {
        let mut b = AlignedBuf::new(1);
        let mut h = Vec::with_capacity(HEADER_LEN);
        h.extend_from_slice(MAGIC);
        h.extend_from_slice(&VERSION.to_le_bytes());
        h.extend_from_slice(&[self.metric as u8, 0, 0, 0]);
        h.extend_from_slice(&self.dim.to_le_bytes());
        h.extend_from_slice(&self.max_degree.to_le_bytes());
        h.extend_from_slice(&self.nodes.to_le_bytes());
        h.extend_from_slice(&self.start.to_le_bytes());
        h.extend_from_slice(&self.durable_seq.to_le_bytes());
        h.extend_from_slice(&self.pq_bytes.to_le_bytes());
        h.resize(HEADER_LEN, 0);
        b[..HEADER_LEN].copy_from_slice(&h);
        seal(&mut b[..BLOCK]);
        b
    }

    /// Parses and checks sector 0 of a file of `file_sectors` sectors.
    pub fn decode(sector: &[u8], file_sectors: u64) -> Result<Self> {
        check_sector(sector, 0)?;
        let mut r = ByteReader::new(&sector[..HEADER_LEN]);
        if r.bytes(8)? != MAGIC {
            return Err(Error::corrupted("not an LTI file (bad magic)"));
        }
        let version = r.u32()?;
        if version != VERSION {
            return Err(Error::Version {
                found: version,
                supported: VERSION,
            });
        }
        let metric = Metric::from_tag(r.bytes(4)?[0])?;
        let h = Header {
            metric,
            dim: r.u32()?,
            max_degree: r.u32()?,
            nodes: r.u64()?,
            start: r.u64()?,
            durable_seq: r.u64()?,
            pq_bytes: r.u32()?,
        };
        if h.dim == 0 || h.dim > MAX_DIM || h.max_degree == 0 || h.max_degree > MAX_DEGREE {
            return Err(Error::corrupted(format!(
                "LTI header: dim {} / max degree {} out of bounds",
                h.dim, h.max_degree
            )));
        }
        if h.pq_bytes == 0 || h.pq_bytes > h.dim {
            return Err(Error::corrupted(format!(
                "LTI header: {} PQ bytes for dim {}",
                h.pq_bytes, h.dim
            )));
        }
        if h.nodes > 0 && h.start >= h.nodes {
            return Err(Error::corrupted(format!(
                "LTI header: start {} of {} nodes",
                h.start, h.nodes
            )));
        }
        // Bounded before any multiplication by the node count can overflow
        // (node numbers are u32 in the records).
        if h.nodes > u32::MAX as u64 || h.nodes > file_sectors.saturating_mul(PAYLOAD as u64) {
            return Err(Error::corrupted(format!(
                "LTI header: {} nodes in {file_sectors} sectors",
                h.nodes
            )));
        }
        if 1 + h.data_sectors() != file_sectors {
            return Err(Error::corrupted(format!(
                "LTI file has {file_sectors} sectors, its header needs {}",
                1 + h.data_sectors()
            )));
        }
        Ok(h)
    }
}

/// Writes a sector's CRC into its last 4 bytes.
pub fn seal(sector: &mut [u8]) {
    let crc = crc32fast::hash(&sector[..PAYLOAD]);
    sector[PAYLOAD..BLOCK].copy_from_slice(&crc.to_le_bytes());
}

/// Checks a sector read from disk against its CRC.
pub fn check_sector(sector: &[u8], number: u64) -> Result<()> {
    if sector.len() != BLOCK {
        return Err(Error::corrupted(format!(
            "LTI sector {number}: {} bytes",
            sector.len()
        )));
    }
    let want = u32::from_le_bytes(sector[PAYLOAD..BLOCK].try_into().expect("4 bytes"));
    if crc32fast::hash(&sector[..PAYLOAD]) != want {
        return Err(Error::corrupted(format!(
            "LTI sector {number}: checksum mismatch"
        )));
    }
    Ok(())
}

/// A node record read from the file (borrowed).
#[derive(Debug, Clone, Copy)]
pub struct Node<'a> {
    pub vector: &'a [u8],
    pub label: u64,
    pub neighbors: &'a [u8],
}

impl<'a> Node<'a> {
    /// Parses a record of `h.node_bytes()` bytes; every neighbour id is
    /// checked against the node count.
    pub fn parse(bytes: &'a [u8], h: &Header) -> Result<Self> {
        let mut r = ByteReader::new(bytes);
        let vector = r.bytes(h.dim as usize * 4)?;
        let label = r.u64()?;
        let degree = r.u32()?;
        if degree > h.max_degree {
            return Err(Error::corrupted(format!(
                "LTI node: degree {degree} over {}",
                h.max_degree
            )));
        }
        let neighbors = r.bytes(degree as usize * 4)?;
        let node = Node {
            vector,
            label,
            neighbors,
        };
        if node.neighbor_ids().any(|n| n as u64 >= h.nodes) {
            return Err(Error::corrupted(
                "LTI node: neighbour id past the node count",
            ));
        }
        Ok(node)
    }

    pub fn neighbor_ids(&self) -> impl Iterator<Item = u32> + 'a {
        self.neighbors
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
    }

    /// The vector into `out` (`dim` floats); a non-finite value is corruption.
    pub fn vector_into(&self, out: &mut [f32]) -> Result<()> {
        for (o, c) in out.iter_mut().zip(self.vector.chunks_exact(4)) {
            *o = f32::from_le_bytes(c.try_into().expect("4 bytes"));
            if !o.is_finite() {
                return Err(Error::corrupted("LTI node: non-finite vector component"));
            }
        }
        Ok(())
    }
}

/// Appends one node record to `out`; a vector of the wrong length or more
/// neighbours than the record holds is an error.
pub fn encode_node(
    out: &mut Vec<u8>,
    h: &Header,
    vector: &[f32],
    label: u64,
    neighbors: &[u32],
) -> Result<()> {
    let start = out.len();
    out.resize(start + h.node_bytes(), 0);
    let r = encode_node_into(
        &mut out[start..],
        h,
        Vector::Floats(vector),
        label,
        neighbors,
    );
    if r.is_err() {
        out.truncate(start);
    }
    r
}

/// A record's vector: floats, or the little-endian bytes a [`Node`] holds.
#[derive(Debug, Clone, Copy)]
pub enum Vector<'a> {
    Floats(&'a [f32]),
    Bytes(&'a [u8]),
    /// All zeros (a free record's).
    Zero,
}

/// Writes one node record into `slot` (`h.node_bytes()` bytes; the bytes
/// past the list are zeroed). A vector of the wrong length, a non-finite
/// component or more neighbours than the record holds is an error.
pub fn encode_node_into(
    slot: &mut [u8],
    h: &Header,
    vector: Vector<'_>,
    label: u64,
    neighbors: &[u32],
) -> Result<()> {
    let dim = h.dim as usize;
    let len = match vector {
        Vector::Floats(v) => v.len(),
        Vector::Bytes(b) if b.len() % 4 == 0 => b.len() / 4,
        Vector::Bytes(_) => usize::MAX,
        Vector::Zero => dim,
    };
    if len != dim || neighbors.len() > h.max_degree as usize || slot.len() != h.node_bytes() {
        return Err(Error::invalid(format!(
            "LTI record: {} floats and {} neighbours into {} bytes for dim {} and max degree {}",
            len,
            neighbors.len(),
            slot.len(),
            h.dim,
            h.max_degree
        )));
    }
    let (vec_part, rest) = slot.split_at_mut(dim * 4);
    match vector {
        Vector::Floats(v) => {
            for (o, x) in vec_part.chunks_exact_mut(4).zip(v) {
                o.copy_from_slice(&x.to_le_bytes());
            }
        }
        Vector::Bytes(b) => {
            if b.chunks_exact(4)
                .any(|c| !f32::from_le_bytes(c.try_into().expect("4 bytes")).is_finite())
            {
                return Err(Error::corrupted("LTI node: non-finite vector component"));
            }
            vec_part.copy_from_slice(b);
        }
        Vector::Zero => vec_part.fill(0),
    }
    rest[..8].copy_from_slice(&label.to_le_bytes());
    rest[8..12].copy_from_slice(&(neighbors.len() as u32).to_le_bytes());
    let (ids, pad) = rest[12..].split_at_mut(neighbors.len() * 4);
    for (o, n) in ids.chunks_exact_mut(4).zip(neighbors) {
        o.copy_from_slice(&n.to_le_bytes());
    }
    pad.fill(0);
    Ok(())
}

/// The PQ file beside an LTI: magic `VTDXLTPQ`, version, dim, m, n, the
/// quantizer's mean and codebooks, the `n × m` codes, then the envelope's
/// CRC-32 and end magic (`vectide_core::io`).
pub struct PqFile;

/// First bytes of a PQ file.
pub const PQ_MAGIC: &[u8; 8] = b"VTDXLTPQ";
/// Last bytes of a PQ file.
pub const PQ_END: &[u8; 8] = b"VTDXEND\0";

impl PqFile {
    pub fn encode(pq: &ProductQuantizer, codes: &[u8]) -> Vec<u8> {
        let mut b = Self::head(pq, (codes.len() / pq.m()) as u64);
        b.extend_from_slice(codes);
        b
    }

    /// The bytes before the codes.
    fn head(pq: &ProductQuantizer, n: u64) -> Vec<u8> {
        let mut b = Vec::with_capacity(32 + 4 * (pq.codebooks().len() + pq.dim()));
        b.extend_from_slice(PQ_MAGIC);
        b.extend_from_slice(&VERSION.to_le_bytes());
        b.extend_from_slice(&(pq.dim() as u32).to_le_bytes());
        b.extend_from_slice(&(pq.m() as u32).to_le_bytes());
        b.extend_from_slice(&n.to_le_bytes());
        for x in pq.mean().iter().chain(pq.codebooks()) {
            b.extend_from_slice(&x.to_le_bytes());
        }
        b
    }

    /// Writes the PQ file atomically (temp file, fsync, rename).
    pub fn write(path: &std::path::Path, pq: &ProductQuantizer, codes: &[u8]) -> Result<()> {
        let m = pq.m();
        Self::write_with(path, pq, (codes.len() / m) as u64, |i| {
            &codes[i * m..(i + 1) * m]
        })
    }

    /// Writes the PQ file of `n` codes, node `i`'s from `code(i)`, streamed
    /// (no copy of the code array: a merge writes old codes with new ones
    /// in their slots).
    pub fn write_with<'c>(
        path: &std::path::Path,
        pq: &ProductQuantizer,
        n: u64,
        code: impl Fn(usize) -> &'c [u8],
    ) -> Result<()> {
        let head = Self::head(pq, n);
        vectide_core::io::atomic_write(path, |w| {
            let mut crc = crc32fast::Hasher::new();
            crc.update(&head);
            w.write_all(&head)?;
            for i in 0..n as usize {
                let c = code(i);
                if c.len() != pq.m() {
                    return Err(Error::invalid("PQ file: a code of the wrong size"));
                }
                crc.update(c);
                w.write_all(c)?;
            }
            w.write_all(&crc.finalize().to_le_bytes())?;
            w.write_all(PQ_END)?;
            Ok(())
        })
    }

    /// Reads and checks a PQ file.
    pub fn read(path: &std::path::Path) -> Result<(ProductQuantizer, Vec<u8>)> {
        let bytes = std::fs::read(path).map_err(|e| Error::io_at(path, e))?;
        let body =
            vectide_core::io::check_envelope(&bytes, PQ_MAGIC, PQ_END, VERSION, 28, "LTI PQ")?;
        PqFile::decode(body)
    }

    /// Parses the body (inside the envelope) of a PQ file.
    pub fn decode(body: &[u8]) -> Result<(ProductQuantizer, Vec<u8>)> {
        let mut r = ByteReader::new(body);
        r.magic_version(PQ_MAGIC, VERSION, "LTI PQ file")?;
        let dim = r.u32()? as usize;
        let m = r.u32()? as usize;
        let n = r.u64()?;
        if dim == 0 || dim > MAX_DIM as usize || m == 0 || m > dim {
            return Err(Error::corrupted(format!("PQ file: dim {dim}, m {m}")));
        }
        let floats = dim + vectide_quant::KSUB * dim;
        let want = n
            .checked_mul(m as u64)
            .and_then(|c| c.checked_add(floats as u64 * 4));
        if want != Some(r.remaining() as u64) {
            return Err(Error::corrupted(format!(
                "PQ file: {} bytes left for {n} codes",
                r.remaining()
            )));
        }
        let (mut mean, mut books) = (Vec::with_capacity(dim), Vec::with_capacity(floats - dim));
        r.f32s(dim, &mut mean)?;
        r.f32s(floats - dim, &mut books)?;
        let pq = ProductQuantizer::from_parts(dim, m, mean, books)?;
        let codes = r.bytes(n as usize * m)?.to_vec();
        Ok((pq, codes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(dim: u32, deg: u32, nodes: u64) -> Header {
        Header {
            metric: Metric::Cosine,
            dim,
            max_degree: deg,
            nodes,
            start: 0,
            durable_seq: 9,
            pq_bytes: 2,
        }
    }

    #[test]
    fn records_pack_into_sectors_or_span_them() {
        let h = header(50, 84, 100);
        assert_eq!(h.node_bytes(), 200 + 12 + 336);
        assert_eq!((h.nodes_per_sector(), h.sectors_per_node()), (7, 1));
        assert_eq!(h.locate(0), (1, 0));
        assert_eq!(h.locate(8), (2, 548));
        assert_eq!(h.data_sectors(), 15);
        let big = header(2000, 64, 3);
        assert_eq!((big.nodes_per_sector(), big.sectors_per_node()), (0, 3));
        assert_eq!(big.locate(2), (7, 0));
        assert_eq!(big.data_sectors(), 9);
    }

    #[test]
    fn header_round_trips_and_damage_is_refused() {
        let h = header(50, 84, 100);
        let b = h.encode();
        assert_eq!(Header::decode(&b, 16).unwrap(), h);
        assert!(Header::decode(&b, 17).is_err(), "length mismatch");
        let mut bad = b[..].to_vec();
        bad[20] ^= 1;
        assert!(Header::decode(&bad, 16).is_err(), "checksum");
        let mut v2 = h.encode();
        v2[8] = 2;
        seal(&mut v2[..]);
        assert!(matches!(
            Header::decode(&v2, 16),
            Err(Error::Version { found: 2, .. })
        ));
    }

    #[test]
    fn node_records_round_trip_and_bad_ids_are_refused() {
        let h = header(3, 4, 10);
        let mut b = Vec::new();
        encode_node(&mut b, &h, &[1.0, 2.0, 3.0], 77, &[4, 9]).unwrap();
        assert_eq!(b.len(), h.node_bytes());
        let n = Node::parse(&b, &h).unwrap();
        assert_eq!(
            (n.label, n.neighbor_ids().collect::<Vec<_>>()),
            (77, vec![4, 9])
        );
        let mut v = [0f32; 3];
        n.vector_into(&mut v).unwrap();
        assert_eq!(v, [1.0, 2.0, 3.0]);
        let mut bad = Vec::new();
        encode_node(&mut bad, &h, &[1.0, 2.0, 3.0], 77, &[10]).unwrap();
        assert!(encode_node(&mut Vec::new(), &h, &[1.0, 2.0, 3.0], 77, &[1, 2, 3, 4, 5]).is_err());
        assert!(encode_node(&mut Vec::new(), &h, &[1.0], 77, &[]).is_err());
        assert!(Node::parse(&bad, &h).is_err());
        let mut deg = b.clone();
        deg[20..24].copy_from_slice(&5u32.to_le_bytes());
        assert!(Node::parse(&deg, &h).is_err());
    }
}
