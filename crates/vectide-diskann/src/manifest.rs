//! The durable state of a `fresh-diskann` directory besides the LTI
//! (`docs/format-fresh-diskann.md`): the **manifest**, which names the LTI
//! generation, the RO-TempIndex snapshots, the redo log and the DeleteList,
//! replaced atomically at every freeze and every merge switch. The redo
//! log's records are the storage crate's shared [`vectide_storage::redo`]
//! operations, in its CRC-framed WAL.

use crate::params::FreshDiskannParams;
use std::path::{Path, PathBuf};
use vectide_core::io::ByteReader;
use vectide_core::{Error, Metric, Result};
use vectide_storage::durable::Envelope;
use vectide_vamana::VamanaParams;

/// First bytes of a manifest.
pub const MAGIC: &[u8; 8] = b"VTDXFDM\0";
/// Last bytes of a manifest.
pub const END: &[u8; 8] = b"VTDXEND\0";
/// The manifest format version this build reads and writes.
pub const VERSION: u32 = 1;
/// The manifest's sealed envelope.
pub const ENVELOPE: Envelope = Envelope {
    magic: MAGIC,
    end: END,
    version: VERSION,
    what: "fresh-diskann manifest",
};
/// The manifest's file name.
pub const MANIFEST: &str = "MANIFEST";

/// See the module docs.
#[derive(Debug, Clone, PartialEq)]
pub struct Manifest {
    pub dim: usize,
    pub metric: Metric,
    pub params: FreshDiskannParams,
    /// The LTI generation in force (`lti-G.bin`, `pq-G.bin`); 0: none yet.
    pub lti_gen: u64,
    /// RO-TempIndex snapshots (`temp-S.fv`), oldest first.
    pub ro: Vec<u64>,
    /// The RW-TempIndex's serial: its redo log is `redo-S.log`.
    pub rw: u64,
    /// Every operation with a sequence number up to this one is in the LTI
    /// and the snapshots; the redo log holds the ones after.
    pub covered_seq: u64,
    /// The DeleteList: LTI nodes whose point was deleted or replaced.
    pub lti_dead: Vec<u32>,
    /// Points of RO snapshots deleted or replaced since: `(serial, id)`.
    pub ro_dead: Vec<(u64, u64)>,
}

pub fn lti_file(dir: &Path, gen: u64) -> PathBuf {
    dir.join(format!("lti-{gen}.bin"))
}
pub fn pq_file(dir: &Path, gen: u64) -> PathBuf {
    dir.join(format!("pq-{gen}.bin"))
}
/// The intermediate LTI of the merge that makes generation `gen`.
pub fn mid_file(dir: &Path, gen: u64) -> PathBuf {
    dir.join(format!("lti-{gen}.mid"))
}
pub fn temp_file(dir: &Path, serial: u64) -> PathBuf {
    dir.join(format!("temp-{serial}.fv"))
}
pub fn log_file(dir: &Path, serial: u64) -> PathBuf {
    dir.join(format!("redo-{serial}.log"))
}

fn metric_tag(m: Metric) -> u8 {
    match m {
        Metric::L2 => 0,
        Metric::Ip => 1,
        Metric::Cosine => 2,
    }
}

impl Manifest {
    /// The manifest's bytes (envelope included).
    pub fn encode(&self) -> Vec<u8> {
        let mut b = ENVELOPE.begin(128 + 4 * self.lti_dead.len() + 16 * self.ro_dead.len());
        b.extend_from_slice(&(self.dim as u32).to_le_bytes());
        b.push(metric_tag(self.metric));
        let g = &self.params.graph;
        for v in [g.r, g.l_build, g.l_search] {
            b.extend_from_slice(&(v as u32).to_le_bytes());
        }
        b.extend_from_slice(&g.alpha.to_le_bytes());
        b.extend_from_slice(&g.consolidate_fraction.to_le_bytes());
        b.extend_from_slice(&g.seed.to_le_bytes());
        let p = &self.params;
        for v in [p.beam_width, p.pq_bytes] {
            b.extend_from_slice(&(v as u32).to_le_bytes());
        }
        for v in [p.temp_points as u64, p.merge_points as u64, self.lti_gen] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(&self.rw.to_le_bytes());
        b.extend_from_slice(&self.covered_seq.to_le_bytes());
        b.extend_from_slice(&(self.ro.len() as u64).to_le_bytes());
        for s in &self.ro {
            b.extend_from_slice(&s.to_le_bytes());
        }
        b.extend_from_slice(&(self.lti_dead.len() as u64).to_le_bytes());
        for n in &self.lti_dead {
            b.extend_from_slice(&n.to_le_bytes());
        }
        b.extend_from_slice(&(self.ro_dead.len() as u64).to_le_bytes());
        for (s, id) in &self.ro_dead {
            b.extend_from_slice(&s.to_le_bytes());
            b.extend_from_slice(&id.to_le_bytes());
        }
        ENVELOPE.seal(b)
    }

    /// Parses a manifest's bytes: envelope (magic, version, CRC), then every
    /// field through the bounds-checked reader.
    pub fn decode(bytes: &[u8]) -> Result<Manifest> {
        let mut r = ENVELOPE.open(bytes)?;
        Self::parse(&mut r)
    }

    fn parse(r: &mut ByteReader<'_>) -> Result<Manifest> {
        let dim = r.u32()? as usize;
        let metric = match r.u8()? {
            0 => Metric::L2,
            1 => Metric::Ip,
            2 => Metric::Cosine,
            t => return Err(Error::corrupted(format!("manifest: metric tag {t}"))),
        };
        let (rr, l_build, l_search) = (r.u32()? as usize, r.u32()? as usize, r.u32()? as usize);
        let alpha = f32::from_le_bytes(r.bytes(4)?.try_into().expect("4 bytes"));
        let consolidate_fraction = f64::from_le_bytes(r.bytes(8)?.try_into().expect("8 bytes"));
        let seed = r.u64()?;
        let (beam_width, pq_bytes) = (r.u32()? as usize, r.u32()? as usize);
        let (temp_points, merge_points) = (r.u64()? as usize, r.u64()? as usize);
        let lti_gen = r.u64()?;
        let rw = r.u64()?;
        let covered_seq = r.u64()?;
        let params = FreshDiskannParams {
            graph: VamanaParams {
                r: rr,
                l_build,
                l_search,
                alpha,
                consolidate_fraction,
                seed,
                threads: None,
            },
            beam_width,
            pq_bytes,
            temp_points,
            merge_points,
            ..FreshDiskannParams::default()
        };
        params
            .validate()
            .and_then(|_| params.check_dim(dim))
            .map_err(|e| Error::corrupted(format!("manifest parameters: {e}")))?;
        let count = |r: &mut ByteReader<'_>, each: usize| -> Result<usize> {
            let n = r.u64()?;
            if n > (r.remaining() / each) as u64 {
                return Err(Error::corrupted("manifest: a list runs past the file"));
            }
            Ok(n as usize)
        };
        let n = count(r, 8)?;
        let ro = (0..n).map(|_| r.u64()).collect::<Result<Vec<_>>>()?;
        let n = count(r, 4)?;
        let mut lti_dead = Vec::with_capacity(n);
        r.u32s(n, &mut lti_dead)?;
        let n = count(r, 16)?;
        let ro_dead = (0..n)
            .map(|_| Ok((r.u64()?, r.u64()?)))
            .collect::<Result<Vec<_>>>()?;
        if r.remaining() != 0 {
            return Err(Error::corrupted("manifest: bytes after the last field"));
        }
        if rw > u32::MAX as u64
            || ro.iter().any(|&s| s >= rw)
            || ro.windows(2).any(|w| w[0] >= w[1])
        {
            return Err(Error::corrupted(
                "manifest: snapshot serials out of order or not below the RW serial",
            ));
        }
        Ok(Manifest {
            dim,
            metric,
            params,
            lti_gen,
            ro,
            rw,
            covered_seq,
            lti_dead,
            ro_dead,
        })
    }

    /// Reads the manifest of a directory.
    pub fn read(dir: &Path) -> Result<Manifest> {
        ENVELOPE.read(&dir.join(MANIFEST), Self::parse)
    }

    /// Replaces the manifest atomically (temp file, fsync, rename, directory
    /// fsync).
    pub fn write(&self, dir: &Path) -> Result<()> {
        ENVELOPE.write(&dir.join(MANIFEST), &self.encode())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> Manifest {
        Manifest {
            dim: 40,
            metric: Metric::Cosine,
            params: FreshDiskannParams {
                pq_bytes: 32,
                ..FreshDiskannParams::default()
            },
            lti_gen: 3,
            ro: vec![4, 6],
            rw: 7,
            covered_seq: 99,
            lti_dead: vec![5, 9, 11],
            ro_dead: vec![(4, 1000), (6, 12)],
        }
    }

    #[test]
    fn manifest_round_trips() {
        let m = sample();
        assert_eq!(Manifest::decode(&m.encode()).unwrap(), m);
    }

    #[test]
    fn damaged_manifests_are_errors() {
        let good = sample().encode();
        for i in [0, 9, 20, good.len() / 2, good.len() - 9] {
            let mut bad = good.clone();
            bad[i] ^= 0x40;
            assert!(Manifest::decode(&bad).is_err(), "flip at {i}");
        }
        assert!(Manifest::decode(&good[..good.len() - 1]).is_err());
    }

    proptest! {
        #[test]
        fn parsers_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
            let _ = Manifest::decode(&bytes);
            // Resealed random bodies reach the field parser.
            let mut b = ENVELOPE.begin(bytes.len());
            b.extend_from_slice(&bytes);
            let _ = Manifest::decode(&ENVELOPE.seal(b));
        }
    }
}
