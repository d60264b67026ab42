//! The engine snapshot (`docs/format-spfresh.md`, SPFresh §4.4): the
//! in-memory state of a SPANN-family index at one instant — the
//! parameters, the id maps, the version map, the centroids and the block
//! store's mapping and free pool — in one file (`snapshot.bin`), replaced
//! atomically. The block file holds the postings; the WAL files the
//! updates since.
//!
//! ```text
//! MAGIC "VTSPSNP\0" ‖ version u32 ‖ mode u8 ‖ metric u8 ‖ dim u32
//! ‖ replicas u32 ‖ rng_factor f32 ‖ route_candidates u32 ‖ nprobe u32
//! ‖ head_ef u32 ‖ posting_pages u32 ‖ posting_vectors u32 ‖ merge_threshold u32
//! ‖ reassign_range u32 ‖ head_ratio f32 ‖ snapshot_rows u64 ‖ seed u64
//! ‖ serial u64 ‖ covered_seq u64
//! ‖ vids u32 ‖ ext_id u64 × vids ‖ seq u64 × vids ‖ home u32 × vids
//! ‖ version map (its own sealed section, `versions.rs`)
//! ‖ pids u32 ‖ present u8 × pids ‖ centroid f32 × dim per present pid
//! ‖ free u32 ‖ free vid u32 × free                     (versions 2 and 3)
//! ‖ since_build u64                                    (version 3)
//! ‖ block mapping (its own sealed section, `docs/format-blockstore.md`)
//! ‖ crc32 u32 of everything before ‖ END "VTSPEND\0"
//! ```

use crate::params::{Mode, SpannParams};
use crate::versions::VersionMap;
use vectide_core::io::ByteReader;
use vectide_core::{Error, Metric, Result};
use vectide_storage::durable::Envelope;

/// First bytes of a snapshot.
pub const MAGIC: &[u8; 8] = b"VTSPSNP\0";
/// Last bytes of a snapshot.
pub const END: &[u8; 8] = b"VTSPEND\0";
/// The snapshot format version this build writes. It reads it, version
/// 2 (no changes since the build: a `spann` index counts them from its
/// open) and version 1 (no free list either: every dead number stays
/// unfree until a reclaim).
pub const VERSION: u32 = 3;

/// The snapshot's sealed envelope.
pub const ENVELOPE: Envelope = Envelope {
    magic: MAGIC,
    end: END,
    version: VERSION,
    what: "spfresh snapshot",
};

/// The envelope of a version-1 snapshot (read only).
const ENVELOPE_V1: Envelope = Envelope {
    version: 1,
    ..ENVELOPE
};

/// The envelope of a version-2 snapshot (read only).
const ENVELOPE_V2: Envelope = Envelope {
    version: 2,
    ..ENVELOPE
};

/// The per-vector sections of a snapshot, as captured.
pub struct Vids<'a> {
    /// The caller's id of each vector number.
    pub ext: &'a [u64],
    /// The sequence number of the insert that created each vector.
    pub seqs: &'a [u64],
    /// A posting holding a current copy of each vector.
    pub homes: &'a [u32],
    pub versions: &'a VersionMap,
    /// The free numbers (`reclaim.rs`), in the order they are handed out
    /// (from the end).
    pub free: &'a [u32],
}

/// The fixed fields of a snapshot.
#[derive(Debug, Clone, PartialEq)]
pub struct SnapHead {
    pub mode: Mode,
    pub metric: Metric,
    pub dim: usize,
    pub params: SpannParams,
    /// The first WAL serial whose records follow this snapshot.
    pub serial: u64,
    /// Every operation up to this sequence number is in the snapshot.
    pub covered_seq: u64,
    /// The inserts and deletes applied since the input of the last
    /// `spann` build was taken, as of the capture (what makes its next
    /// rebuild due; 0 from a version 1 or 2 snapshot).
    pub since_build: u64,
}

/// A decoded snapshot.
#[derive(Debug)]
pub struct Snapshot {
    pub head: SnapHead,
    /// The caller's id of each vector number.
    pub ext: Vec<u64>,
    /// The sequence number of the insert that created each vector.
    pub seqs: Vec<u64>,
    /// A posting that holds a current copy of each vector (what `get`
    /// reads).
    pub homes: Vec<u32>,
    pub versions: VersionMap,
    /// The numbers free for reuse (empty in a version-1 snapshot).
    pub free: Vec<u32>,
    /// The format version the file was written in.
    pub version: u32,
    /// The centroid of each posting id (`None`: removed).
    pub centroids: Vec<Option<Vec<f32>>>,
    /// The encoded block mapping (handed to `BlockStore::open_encoded`).
    pub map: Vec<u8>,
}

fn put_u32(b: &mut Vec<u8>, v: usize) {
    b.extend_from_slice(&(v as u32).to_le_bytes());
}

/// Encodes a snapshot from its parts (the state captured under the
/// engine's gate).
pub fn encode(
    head: &SnapHead,
    vids: &Vids<'_>,
    centroids: &[Option<&[f32]>],
    map: &[u8],
) -> Vec<u8> {
    let Vids {
        ext,
        seqs,
        homes,
        versions,
        free,
    } = *vids;
    let dim = head.dim;
    let present = centroids.iter().flatten().count();
    let mut b = ENVELOPE.begin(
        140 + 21 * ext.len() + 4 * free.len() + centroids.len() + present * 4 * dim + map.len(),
    );
    b.push(head.mode.code());
    b.push(head.metric as u8);
    put_u32(&mut b, dim);
    let p = &head.params;
    put_u32(&mut b, p.replicas);
    b.extend_from_slice(&p.rng_factor.to_le_bytes());
    for v in [
        p.route_candidates,
        p.nprobe,
        p.head_ef,
        p.posting_pages,
        p.posting_vectors,
        p.merge_threshold,
        p.reassign_range,
    ] {
        put_u32(&mut b, v);
    }
    b.extend_from_slice(&p.head_ratio.to_le_bytes());
    for v in [p.snapshot_rows, p.seed, head.serial, head.covered_seq] {
        b.extend_from_slice(&v.to_le_bytes());
    }
    put_u32(&mut b, ext.len());
    for v in ext.iter().chain(seqs) {
        b.extend_from_slice(&v.to_le_bytes());
    }
    for h in homes {
        b.extend_from_slice(&h.to_le_bytes());
    }
    versions.encode(&mut b);
    put_u32(&mut b, centroids.len());
    b.extend(centroids.iter().map(|c| u8::from(c.is_some())));
    for c in centroids.iter().flatten() {
        for x in *c {
            b.extend_from_slice(&x.to_le_bytes());
        }
    }
    put_u32(&mut b, free.len());
    for v in free {
        b.extend_from_slice(&v.to_le_bytes());
    }
    b.extend_from_slice(&head.since_build.to_le_bytes());
    b.extend_from_slice(map);
    ENVELOPE.seal(b)
}

/// Parses a snapshot: envelope (magic, version, CRC, end marker), then
/// every field through the bounds-checked reader.
pub fn decode(bytes: &[u8]) -> Result<Snapshot> {
    // Version 1 has no free list, 2 no changes since the build; anything
    // else but 3 is a version error.
    let version = match bytes.get(8..12) {
        Some(v) if v == 1u32.to_le_bytes() => 1,
        Some(v) if v == 2u32.to_le_bytes() => 2,
        _ => VERSION,
    };
    let mut r = match version {
        1 => ENVELOPE_V1.open(bytes)?,
        2 => ENVELOPE_V2.open(bytes)?,
        _ => ENVELOPE.open(bytes)?,
    };
    let mode = Mode::from_code(r.u8()?)?;
    let metric = Metric::from_tag(r.u8()?)?;
    let dim = r.u32()? as usize;
    if dim == 0 || dim > crate::layout::MAX_DIM as usize {
        return Err(Error::corrupted(format!("snapshot: dimension {dim}")));
    }
    let f32_of = |r: &mut ByteReader| -> Result<f32> {
        Ok(f32::from_le_bytes(r.bytes(4)?.try_into().expect("4 bytes")))
    };
    let replicas = r.u32()? as usize;
    let rng_factor = f32_of(&mut r)?;
    let mut ints = [0usize; 7];
    for v in &mut ints {
        *v = r.u32()? as usize;
    }
    let head_ratio = f32_of(&mut r)?;
    let snapshot_rows = r.u64()?;
    let seed = r.u64()?;
    let params = SpannParams {
        replicas,
        rng_factor,
        route_candidates: ints[0],
        nprobe: ints[1],
        head_ef: ints[2],
        posting_pages: ints[3],
        posting_vectors: ints[4],
        merge_threshold: ints[5],
        reassign_range: ints[6],
        head_ratio,
        snapshot_rows,
        seed,
        rebuild_inline: false,
        threads: None,
        external_log: false,
    };
    params
        .validate()
        .map_err(|e| Error::corrupted(format!("snapshot: parameters: {e}")))?;
    let serial = r.u64()?;
    let covered_seq = r.u64()?;
    let n = r.u32()? as usize;
    if n > r.remaining() / 20 {
        return Err(Error::corrupted("snapshot: more vectors than bytes"));
    }
    let ext = (0..n).map(|_| r.u64()).collect::<Result<Vec<_>>>()?;
    let seqs = (0..n).map(|_| r.u64()).collect::<Result<Vec<_>>>()?;
    let mut homes = Vec::with_capacity(n);
    r.u32s(n, &mut homes)?;
    let (versions, used) = VersionMap::decode(r.rest())?;
    r.bytes(used)?;
    if versions.len() as usize != n {
        return Err(Error::corrupted(format!(
            "snapshot: {n} vector ids but {} versions",
            versions.len()
        )));
    }
    let pids = r.u32()? as usize;
    let present = r.bytes(pids)?;
    let mut centroids = Vec::with_capacity(pids);
    let mut buf = Vec::new();
    for &flag in present {
        match flag {
            0 => centroids.push(None),
            1 => {
                buf.clear();
                r.f32s(dim, &mut buf)?;
                if buf.iter().any(|x| !x.is_finite()) {
                    return Err(Error::corrupted("snapshot: a non-finite centroid"));
                }
                centroids.push(Some(buf.clone()));
            }
            f => return Err(Error::corrupted(format!("snapshot: centroid flag {f}"))),
        }
    }
    let mut free = Vec::new();
    if version >= 2 {
        let f = r.u32()? as usize;
        if f > n {
            return Err(Error::corrupted(format!(
                "snapshot: {f} free vector numbers of {n}"
            )));
        }
        r.u32s(f, &mut free)?;
        let mut seen = vec![false; n];
        for &v in &free {
            let dead = versions.get(v).is_some_and(|s| s.deleted);
            match seen.get_mut(v as usize) {
                Some(s) if !*s && dead => *s = true,
                _ => {
                    return Err(Error::corrupted(format!(
                        "snapshot: free vector number {v} is unknown, live or listed twice"
                    )))
                }
            }
        }
    }
    let since_build = if version >= 3 { r.u64()? } else { 0 };
    let map = r.bytes(r.remaining())?.to_vec();
    Ok(Snapshot {
        head: SnapHead {
            mode,
            metric,
            dim,
            params,
            serial,
            covered_seq,
            since_build,
        },
        ext,
        seqs,
        homes,
        versions,
        free,
        version,
        centroids,
        map,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head() -> SnapHead {
        SnapHead {
            mode: Mode::Fresh,
            metric: Metric::Cosine,
            dim: 3,
            params: SpannParams::default(),
            serial: 4,
            covered_seq: 77,
            since_build: 1234,
        }
    }

    fn sample() -> Vec<u8> {
        let head = head();
        let v = VersionMap::new();
        v.push(3).unwrap();
        v.delete(1);
        v.delete(2);
        let c = [0.5f32, 1.0, -2.0];
        encode(
            &head,
            &Vids {
                ext: &[10, 11, 12],
                seqs: &[5, 6, 7],
                homes: &[3, 0, u32::MAX],
                versions: &v,
                free: &[2],
            },
            &[Some(&c), None],
            b"MAPBYTES",
        )
    }

    /// The same state in the version-2 layout (no changes since the
    /// build), as an older build wrote it.
    fn sample_v2() -> Vec<u8> {
        let mut b = sample();
        b.truncate(b.len() - 12);
        let map_at = b.len() - b"MAPBYTES".len();
        // The changes since the build sit just before the map.
        b.drain(map_at - 8..map_at);
        b[8..12].copy_from_slice(&2u32.to_le_bytes());
        ENVELOPE_V2.seal(b)
    }

    /// The same state in the version-1 layout (no free list either).
    fn sample_v1() -> Vec<u8> {
        let mut b = sample_v2();
        b.truncate(b.len() - 12);
        let map_at = b.len() - b"MAPBYTES".len();
        // The free list (count 1, vid 2) sits before the map.
        b.drain(map_at - 8..map_at);
        b[8..12].copy_from_slice(&1u32.to_le_bytes());
        ENVELOPE_V1.seal(b)
    }

    #[test]
    fn round_trips() {
        let s = decode(&sample()).unwrap();
        assert_eq!(s.head.mode, Mode::Fresh);
        assert_eq!(s.head.metric, Metric::Cosine);
        assert_eq!((s.head.serial, s.head.covered_seq), (4, 77));
        assert_eq!(s.head.params, SpannParams::default());
        assert_eq!(
            (s.ext, s.seqs, s.homes),
            (vec![10, 11, 12], vec![5, 6, 7], vec![3, 0, u32::MAX])
        );
        assert!(s.versions.get(1).unwrap().deleted && !s.versions.get(0).unwrap().deleted);
        assert_eq!((s.free, s.version), (vec![2], 3));
        assert_eq!(s.head.since_build, 1234);
        assert_eq!(s.centroids, vec![Some(vec![0.5, 1.0, -2.0]), None]);
        assert_eq!(s.map, b"MAPBYTES");
    }

    #[test]
    fn damage_is_an_error() {
        let good = sample();
        for i in 0..good.len() {
            let mut bad = good.clone();
            bad[i] ^= 0x10;
            assert!(decode(&bad).is_err(), "flip at {i}");
        }
        for cut in 0..good.len() {
            assert!(decode(&good[..cut]).is_err(), "cut at {cut}");
        }
        let mut v4 = good.clone();
        v4[8] = 4;
        assert!(matches!(decode(&v4), Err(Error::Version { found: 4, .. })));
    }

    #[test]
    fn a_version_2_snapshot_opens_with_no_changes_since_the_build() {
        let s = decode(&sample_v2()).unwrap();
        assert_eq!(s.version, 2);
        assert_eq!(s.head.since_build, 0);
        assert_eq!(s.free, vec![2]);
        assert_eq!(s.ext, vec![10, 11, 12]);
        assert_eq!(s.map, b"MAPBYTES");
    }

    #[test]
    fn a_version_1_snapshot_opens_with_no_free_numbers() {
        let s = decode(&sample_v1()).unwrap();
        assert_eq!(s.version, 1);
        assert!(s.free.is_empty());
        assert_eq!(s.ext, vec![10, 11, 12]);
        assert_eq!(s.map, b"MAPBYTES");
    }

    #[test]
    fn a_free_number_must_be_known_dead_and_listed_once() {
        let head = head();
        let v = VersionMap::new();
        v.push(3).unwrap();
        v.delete(2);
        for free in [&[0u32][..], &[2, 2], &[7]] {
            let b = encode(
                &head,
                &Vids {
                    ext: &[1, 2, 3],
                    seqs: &[1, 2, 3],
                    homes: &[0, 0, 0],
                    versions: &v,
                    free,
                },
                &[],
                b"",
            );
            assert!(
                matches!(decode(&b), Err(Error::Corrupted(_))),
                "free list {free:?}"
            );
        }
    }
}
