//! `vectide inspect DIR` for a P-HNSW index: reads the region files without
//! opening the index (no recovery runs, nothing is written).

use super::labels::file_name;
use super::layout::{
    decode_data_header, decode_meta, unpack_entry, verify_node_block, Geometry, DELETED, LIVE,
    META_FILE, M_DURABLE_SEQ, M_ENTRY, M_LABELS_ROOT, M_NEXT_SLOT, M_UPPER_NEXT, NI_STATE, NL_LIVE,
    NL_STATE, NODES_FILE, NODES_MAGIC, PAGE, UPPER_FILE, UPPER_MAGIC,
};
use super::log::{LOGGED, LOGGING, NONE, N_COMPLETE};
use std::path::Path;
use vectide_core::{Error, Result};

fn u64_at(b: &[u8], off: usize) -> Result<u64> {
    b.get(off..off + 8)
        .map(|s| u64::from_le_bytes(s.try_into().expect("8 bytes")))
        .ok_or_else(|| Error::corrupted(format!("{META_FILE}: truncated at {off}")))
}

/// Verifies the checksum of every linked node (live or deleted) below the
/// allocation word in the bytes of `nodes.vtdp`; returns how many.
fn verify_nodes(g: &Geometry, nodes: &[u8], next: u64) -> Result<usize> {
    let size = g.node_size();
    let mut checked = 0;
    for (slot, block) in nodes
        .get(PAGE..)
        .unwrap_or(&[])
        .chunks_exact(size)
        .take(next as usize)
        .enumerate()
    {
        let state = u32::from_le_bytes(block[g.n_state()..g.n_state() + 4].try_into().expect("4"));
        if matches!(state, LIVE | DELETED) {
            verify_node_block(g, slot as u32, block)?;
            checked += 1;
        }
    }
    Ok(checked)
}

/// `(field, value)` rows describing a P-HNSW directory: every file's header,
/// the logs' states, and every linked node's checksum (a mismatch is
/// [`Error::Corrupted`] naming the slot).
pub fn inspect(dir: &Path) -> Result<Vec<(String, String)>> {
    let read = |name: &str| {
        let p = dir.join(name);
        std::fs::read(&p).map_err(|e| Error::io_at(&p, e))
    };
    let meta = read(META_FILE)?;
    let g = decode_meta(meta.get(..PAGE).unwrap_or(&meta))?;
    if meta.len() < g.meta_len() {
        return Err(Error::corrupted(format!(
            "{META_FILE}: {} bytes, the logs need {}",
            meta.len(),
            g.meta_len()
        )));
    }
    let crc = u32::from_le_bytes(meta[12..16].try_into().expect("4 bytes"));
    let mut rows: Vec<(String, String)> = Vec::new();
    let mut row = |k: &str, v: String| rows.push((k.to_string(), v));
    row("engine", "p-hnsw".into());
    row("magic", String::from_utf8_lossy(&meta[..8]).into_owned());
    row("format_version", super::layout::FORMAT_VERSION.to_string());
    row("header_crc32", format!("{crc:08x} (verified)"));
    row("metric", g.metric.name().into());
    row("dim", g.dim.to_string());
    row("m", g.m.to_string());
    row("ef_construction", g.ef_construction.to_string());
    row("ef_search", g.ef_search.to_string());
    row("node_bytes", g.node_size().to_string());
    let next = u64_at(&meta, M_NEXT_SLOT)?;
    row("nodes_allocated", next.to_string());
    let live: i64 = (0..g.nlog_entries)
        .map(|i| u64_at(&meta, g.nlog_offset(i) + NL_LIVE).map(|v| v as i64))
        .sum::<Result<i64>>()?;
    row("live", live.to_string());
    let entry = u64_at(&meta, M_ENTRY)?;
    row(
        "entry_point",
        unpack_entry(entry).map_or("none".into(), |(s, l)| format!("node {s}, level {l}")),
    );
    row("durable_seq", u64_at(&meta, M_DURABLE_SEQ)?.to_string());
    let count = |states: Vec<u64>| {
        let n = |s: u64| states.iter().filter(|&&x| x == s).count();
        format!(
            "{} entries: {} none, {} logging, {} logged, {} n_complete, {} other",
            states.len(),
            n(NONE),
            n(LOGGING),
            n(LOGGED),
            n(N_COMPLETE),
            states.len() - n(NONE) - n(LOGGING) - n(LOGGED) - n(N_COMPLETE)
        )
    };
    let nlog: Vec<u64> = (0..g.nlog_entries)
        .map(|i| u64_at(&meta, g.nlog_offset(i) + NL_STATE))
        .collect::<Result<_>>()?;
    row("nlog", count(nlog));
    let nlist: Vec<u64> = (0..g.nlist_entries)
        .map(|i| u64_at(&meta, g.nlist_offset(i) + NI_STATE))
        .collect::<Result<_>>()?;
    row("nlistlog", count(nlist));
    for (name, magic) in [(NODES_FILE, NODES_MAGIC), (UPPER_FILE, UPPER_MAGIC)] {
        let b = read(name)?;
        decode_data_header(b.get(..PAGE).unwrap_or(&b), magic, name, crc)?;
        row(&format!("{name}_bytes"), b.len().to_string());
        if name == NODES_FILE {
            let checked = verify_nodes(&g, &b, next)?;
            row("node_checksums", format!("{checked} linked nodes verified"));
        }
    }
    row(
        "node_capacity",
        (std::fs::metadata(dir.join(NODES_FILE))
            .map_err(|e| Error::io_at(dir.join(NODES_FILE), e))?
            .len() as usize)
            .saturating_sub(PAGE)
            .checked_div(g.node_size())
            .unwrap_or(0)
            .to_string(),
    );
    row(
        "upper_allocated_bytes",
        u64_at(&meta, M_UPPER_NEXT)?.to_string(),
    );
    let root = u64_at(&meta, M_LABELS_ROOT)?;
    let lname = file_name(root >> 8);
    row("label_map", format!("{lname}, 2^{} buckets", root & 0xff));
    let lb = read(&lname)?;
    decode_data_header(
        lb.get(..PAGE).unwrap_or(&lb),
        super::layout::LABELS_MAGIC,
        &lname,
        crc,
    )?;
    Ok(rows)
}
