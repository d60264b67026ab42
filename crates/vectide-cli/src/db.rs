//! `vectide serve` and `vectide import`: the database from the command line.

use clap::Args;
use serde_json::Value;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use vectide_core::Metric;
use vectide_db::{CollectionConfig, Database, Durability, ExtId, Options, PointInput};

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Database directory (created if missing).
    #[arg(long)]
    pub data: PathBuf,
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    #[arg(long, default_value_t = 6333)]
    pub port: u16,
    /// Require this key in the `api-key` header.
    #[arg(long)]
    pub api_key: Option<String>,
    /// `group` (default: concurrent writers share an fsync) or `always`.
    #[arg(long, default_value = "group")]
    pub durability: String,
    /// Largest request body, MiB (1..=4096).
    #[arg(long, default_value_t = 64)]
    pub body_limit_mb: usize,
}

/// The largest `--body-limit-mb` (4 GiB).
const MAX_BODY_MB: usize = 4096;
/// The largest `--batch` of `import`.
const MAX_IMPORT_BATCH: usize = 1_000_000;

pub fn serve(args: &ServeArgs) -> Result<(), String> {
    vectide_core::limits::check_range("--body-limit-mb", args.body_limit_mb, 1, MAX_BODY_MB)
        .map_err(|e| e.to_string())?;
    let opts = Options {
        durability: Durability::parse(&args.durability).map_err(|e| e.to_string())?,
        ..Options::default()
    };
    // Every collection recovers before the server listens.
    let db = Database::open(&args.data, opts).map_err(|e| e.to_string())?;
    let addr: std::net::SocketAddr = format!("{}:{}", args.host, args.port)
        .parse()
        .map_err(|e| format!("bad --host/--port: {e}"))?;
    let config = vectide_server::ServerConfig {
        api_key: args.api_key.clone(),
        body_limit: args.body_limit_mb << 20,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(vectide_server::serve(db, addr, config))
        .map_err(|e| e.to_string())
}

#[derive(Args, Debug)]
pub struct ImportArgs {
    /// Database directory.
    #[arg(long)]
    pub data: PathBuf,
    /// Collection to fill (created when missing, with the file's dimension).
    #[arg(long)]
    pub collection: String,
    /// `.npy` (float32/float64 rows; ids 0..n), `.hdf5`/`.h5` (its `train`
    /// rows; ids 0..n), `.jsonl` (`{"id", "vector", "payload"}`), or a known
    /// dataset name (its `train` rows).
    pub file: String,
    #[arg(long, default_value = "cosine")]
    pub metric: String,
    /// The engine (`vectide engines` lists them).
    #[arg(long, default_value = vectide_engines::DEFAULT_ENGINE)]
    pub engine: String,
    /// Rows per upsert (1..=1000000).
    #[arg(long, default_value_t = 1000)]
    pub batch: usize,
}

/// Reads a `.npy` file of 2-d float rows (C order, little-endian f4 or f8).
#[derive(clap::Args)]
pub struct RepairArgs {
    /// The database directory (not open in another process).
    #[arg(long)]
    pub data: PathBuf,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct MaintainArgs {
    /// The database directory (not open in another process).
    #[arg(long)]
    pub data: PathBuf,
    /// Only this collection (default: every one).
    #[arg(long)]
    pub collection: Option<String>,
}

/// `vectide maintain`: runs each collection's pending maintenance (a
/// fresh-diskann merge, a delete consolidation) with a progress bar fed by
/// the engine's `merge_done` / `merge_total` / `merge_phase` statistics.
pub fn maintain(args: &MaintainArgs) -> Result<(), String> {
    let db = Database::open(&args.data, Options::default()).map_err(|e| e.to_string())?;
    let names = match &args.collection {
        Some(n) => vec![n.clone()],
        None => db.list(),
    };
    for name in names {
        let col = db.collection(&name).map_err(|e| e.to_string())?;
        let bar = crate::progress(0, &name);
        let t = std::time::Instant::now();
        let r = std::thread::scope(|s| {
            let job = s.spawn(|| col.maintain());
            while !job.is_finished() {
                if let Ok(st) = col.stats() {
                    if let (Some(done), Some(total)) =
                        (st.extra_value("merge_done"), st.extra_value("merge_total"))
                    {
                        bar.set_length(total as u64);
                        bar.set_position(done as u64);
                    }
                    if let Some(phase) = st.extra_value("merge_phase") {
                        bar.set_message(format!("{name} phase {phase}"));
                    }
                }
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            match job.join() {
                Ok(r) => r.map_err(|e| e.to_string()),
                Err(_) => Err("the maintenance thread panicked".to_string()),
            }
        });
        bar.finish_and_clear();
        r.map_err(|e| format!("{name}: {e}"))?;
        let st = col.stats().map_err(|e| e.to_string())?;
        println!(
            "{name}: maintenance done in {:.1} s; {} live points, {} deletes pending",
            t.elapsed().as_secs_f64(),
            st.live,
            st.pending_deletes
        );
    }
    Ok(())
}

/// `vectide repair`: cuts each damaged WAL at its first bad record and
/// reports what was dropped (see `vectide_db::repair`).
pub fn repair(args: &RepairArgs) -> Result<(), String> {
    let report = vectide_db::repair(&args.data, vectide_db::Options::default())
        .map_err(|e| e.to_string())?;
    let rows: Vec<serde_json::Value> = report
        .iter()
        .map(|r| {
            let w = &r.wal;
            serde_json::json!({
                "collection": r.collection,
                "damaged": w.damage.is_some(),
                "segment": w.damage.as_ref().map(|d| d.0.display().to_string()),
                "offset": w.damage.as_ref().map(|d| d.1),
                "reason": w.damage.as_ref().map(|d| d.2.clone()),
                "kept_through_seq": w.kept_through,
                "dropped_records": w.dropped_records,
                "dropped_seqs": w.dropped_seqs.map(|(a, b)| [a, b]),
                "dropped_bytes": w.dropped_bytes,
                "removed_segments": w.removed_segments.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
                "points_without_vector_deleted": r.orphans_removed.iter().map(|e| e.to_json()).collect::<Vec<_>>(),
                "stale_vectors_removed": r.stale_vectors_removed,
            })
        })
        .collect();
    if args.json {
        println!("{}", serde_json::Value::Array(rows));
        return Ok(());
    }
    for (r, row) in report.iter().zip(&rows) {
        let w = &r.wal;
        match &w.damage {
            None => println!("{}: the log is sound; nothing changed", r.collection),
            Some((seg, off, why)) => {
                println!("{}: damaged WAL", r.collection);
                println!("  segment          {}", seg.display());
                println!("  first bad record at byte {off}: {why}");
                println!(
                    "  kept             records through sequence number {}",
                    w.kept_through
                );
                match w.dropped_seqs {
                    Some((a, b)) => println!(
                        "  dropped          {} readable record(s), sequence numbers {a}..={b}, and the damaged bytes ({} bytes in all)",
                        w.dropped_records, w.dropped_bytes
                    ),
                    None => println!("  dropped          {} damaged byte(s), no readable record", w.dropped_bytes),
                }
                for p in &w.removed_segments {
                    println!("  removed segment  {}", p.display());
                }
                println!(
                    "  points deleted (payload without vector after the cut): {}",
                    row["points_without_vector_deleted"]
                );
                println!(
                    "  stale vectors removed from the engine: {}",
                    r.stale_vectors_removed
                );
            }
        }
    }
    Ok(())
}

pub fn read_npy(path: &Path) -> Result<(usize, Vec<f32>), String> {
    let b = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let what = path.display();
    if b.len() < 10 || &b[..6] != b"\x93NUMPY" {
        return Err(format!("{what}: not a .npy file"));
    }
    let (hlen, hstart) = match b[6] {
        1 => (u16::from_le_bytes([b[8], b[9]]) as usize, 10),
        2 | 3 => {
            if b.len() < 12 {
                return Err(format!("{what}: truncated header"));
            }
            (u32::from_le_bytes([b[8], b[9], b[10], b[11]]) as usize, 12)
        }
        v => return Err(format!("{what}: unsupported .npy version {v}")),
    };
    let header = b
        .get(hstart..hstart + hlen)
        .and_then(|h| std::str::from_utf8(h).ok())
        .ok_or_else(|| format!("{what}: truncated header"))?;
    let width = if header.contains("'<f4'") {
        4
    } else if header.contains("'<f8'") {
        8
    } else {
        return Err(format!(
            "{what}: only little-endian float32/float64 arrays are imported"
        ));
    };
    if header.contains("'fortran_order': True") {
        return Err(format!(
            "{what}: Fortran-ordered arrays are not supported; save a C-ordered copy"
        ));
    }
    let shape = header
        .split("'shape':")
        .nth(1)
        .and_then(|s| s.split(')').next())
        .map(|s| s.trim().trim_start_matches('('))
        .ok_or_else(|| format!("{what}: no shape in the header"))?;
    let dims: Vec<usize> = shape
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse()
                .map_err(|_| format!("{what}: bad shape {shape:?}"))
        })
        .collect::<Result<_, _>>()?;
    let [n, d] = dims[..] else {
        return Err(format!("{what}: expected a 2-d array, got shape ({shape})"));
    };
    let data = &b[hstart + hlen..];
    if d == 0
        || data.len()
            != n.checked_mul(d)
                .and_then(|x| x.checked_mul(width))
                .unwrap_or(usize::MAX)
    {
        return Err(format!(
            "{what}: {} data bytes do not hold a {n} x {d} array",
            data.len()
        ));
    }
    let v = if width == 4 {
        data.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    } else {
        data.chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().expect("8")) as f32)
            .collect()
    };
    Ok((d, v))
}

fn jsonl(path: &Path) -> Result<(usize, Vec<PointInput>), String> {
    let f = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut out = Vec::new();
    let mut dim = 0;
    for (i, line) in std::io::BufReader::new(f).lines().enumerate() {
        let line = line.map_err(|e| e.to_string())?;
        if line.trim().is_empty() {
            continue;
        }
        let at = format!("{}:{}", path.display(), i + 1);
        let v: Value = serde_json::from_str(&line).map_err(|e| format!("{at}: {e}"))?;
        let id = ExtId::from_json(&v["id"]).map_err(|e| format!("{at}: id: {e}"))?;
        let vector: Vec<f32> = v["vector"]
            .as_array()
            .ok_or_else(|| format!("{at}: vector must be a list"))?
            .iter()
            .map(|x| {
                x.as_f64()
                    .map(|f| f as f32)
                    .ok_or_else(|| format!("{at}: vector components must be numbers"))
            })
            .collect::<Result<_, _>>()?;
        if dim == 0 {
            dim = vector.len();
        }
        out.push(PointInput {
            id,
            vector,
            payload: v.get("payload").cloned().unwrap_or(Value::Null),
        });
    }
    Ok((dim, out))
}

/// The `train` rows of an HDF5 file, read by `vectide.datasets train-npy`
/// (h5py) into a temporary `.npy`.
fn hdf5_train(path: &Path) -> Result<(usize, Vec<f32>), String> {
    if !path.is_file() {
        return Err(format!("{}: no such file", path.display()));
    }
    let tmp = tempfile::Builder::new()
        .suffix(".npy")
        .tempfile()
        .map_err(|e| format!("cannot create a temporary file: {e}"))?;
    let py = crate::dataset::python();
    let st = std::process::Command::new(&py)
        .args(["-m", "vectide.datasets", "train-npy"])
        .arg(path)
        .arg(tmp.path())
        .status()
        .map_err(|e| format!("cannot run {} to read the HDF5 file: {e}", py.display()))?;
    if !st.success() {
        return Err(format!(
            "{}: reading its 'train' rows failed",
            path.display()
        ));
    }
    read_npy(tmp.path())
}

fn numbered(d: usize, v: &[f32]) -> Vec<PointInput> {
    v.chunks_exact(d)
        .enumerate()
        .map(|(i, r)| PointInput {
            id: ExtId::Num(i as u64),
            vector: r.to_vec(),
            payload: Value::Null,
        })
        .collect()
}

pub fn import(args: &ImportArgs) -> Result<(), String> {
    vectide_core::limits::check_range("--batch", args.batch, 1, MAX_IMPORT_BATCH)
        .map_err(|e| e.to_string())?;
    let path = Path::new(&args.file);
    let (dim, points): (usize, Vec<PointInput>) = match path.extension().and_then(|e| e.to_str()) {
        Some("hdf5") | Some("h5") => {
            let (d, v) = hdf5_train(path)?;
            (d, numbered(d, &v))
        }
        Some("npy") => {
            let (d, v) = read_npy(path)?;
            (d, numbered(d, &v))
        }
        Some("jsonl") | Some("ndjson") => jsonl(path)?,
        _ => {
            let ds = crate::dataset::load(&args.file)?;
            (ds.dim, numbered(ds.dim, &ds.train))
        }
    };
    if dim == 0 || points.is_empty() {
        return Err(format!("{}: nothing to import", args.file));
    }
    let db: Arc<Database> =
        Database::open(&args.data, Options::default()).map_err(|e| e.to_string())?;
    let c = match db.collection(&args.collection) {
        Ok(c) => c,
        Err(_) => db
            .create_collection(
                &args.collection,
                CollectionConfig {
                    dim,
                    metric: Metric::parse(&args.metric).map_err(|e| e.to_string())?,
                    engine: args.engine.clone(),
                    params: Default::default(),
                    ..Default::default()
                },
            )
            .map_err(|e| e.to_string())?,
    };
    let bar = crate::progress(points.len() as u64, "importing");
    for chunk in points.chunks(args.batch.max(1)) {
        c.upsert(chunk).map_err(|e| e.to_string())?;
        bar.inc(chunk.len() as u64);
    }
    bar.finish_and_clear();
    c.checkpoint().map_err(|e| e.to_string())?;
    println!(
        "imported {} points into {:?} ({} live)",
        points.len(),
        args.collection,
        c.len()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn npy_files_parse_and_bad_ones_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.npy");
        let header = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
        let mut h = header.to_string();
        while !(10 + h.len() + 1).is_multiple_of(64) {
            h.push(' ');
        }
        h.push('\n');
        let mut b = b"\x93NUMPY\x01\x00".to_vec();
        b.extend_from_slice(&(h.len() as u16).to_le_bytes());
        b.extend_from_slice(h.as_bytes());
        for x in [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0] {
            b.extend_from_slice(&x.to_le_bytes());
        }
        std::fs::write(&p, &b).unwrap();
        assert_eq!(
            read_npy(&p).unwrap(),
            (3, vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
        );
        std::fs::write(&p, &b[..b.len() - 2]).unwrap();
        assert!(read_npy(&p).unwrap_err().contains("do not hold"));
        std::fs::write(&p, b"garbage").unwrap();
        assert!(read_npy(&p).is_err());
    }
}
