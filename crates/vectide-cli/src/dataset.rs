//! Datasets for the native benchmark.
//!
//! HDF5 is read in one place only, the Python module `vectide.datasets`
//! (h5py). The CLI asks it to `export` a dataset name or an ann-benchmarks
//! file into raw little-endian sidecars (`docs/format-vbin.md`): it prepares
//! the dataset first when it is missing, and reuses sidecars already written.

use std::path::{Path, PathBuf};
use std::process::Command;
use vectide_core::io::Matrix;

/// An ANN benchmark dataset in memory.
#[derive(Debug)]
pub struct Dataset {
    pub name: String,
    pub distance: String,
    pub dim: usize,
    pub train: Vec<f32>,
    pub test: Vec<f32>,
    /// Row-major ground truth, `gt_k` ids per query.
    pub neighbors: Vec<i32>,
    pub gt_k: usize,
}

impl Dataset {
    pub fn n_train(&self) -> usize {
        self.train.len() / self.dim
    }
    pub fn n_test(&self) -> usize {
        self.test.len() / self.dim
    }
    /// The Vectide metric of an ann-benchmarks distance name.
    pub fn metric(&self) -> Result<vectide_core::Metric, String> {
        let name = match self.distance.as_str() {
            "angular" | "cosine" => "cosine",
            "euclidean" | "l2" => "l2",
            "dot" | "ip" | "inner_product" => "ip",
            other => return Err(format!("unsupported dataset distance {other:?}")),
        };
        vectide_core::Metric::parse(name).map_err(|e| e.to_string())
    }
}

/// The Python interpreter that has `vectide.datasets`: `$VECTIDE_PYTHON`,
/// else the `python` beside this executable (inside `.venv/bin`), else `python3`.
pub fn python() -> PathBuf {
    if let Some(p) = std::env::var_os("VECTIDE_PYTHON") {
        return PathBuf::from(p);
    }
    if let Ok(exe) = std::env::current_exe() {
        if let Some(dir) = exe.parent() {
            let beside = dir.join("python");
            if beside.exists() {
                return beside;
            }
        }
    }
    PathBuf::from("python3")
}

/// Exports (preparing if needed) and loads a dataset by name or HDF5 path;
/// a directory of sidecars already exported (holding `meta.json`) is read
/// as it is, without Python.
pub fn load(name_or_path: &str) -> Result<Dataset, String> {
    let dir = Path::new(name_or_path);
    if dir.is_dir() && dir.join("meta.json").is_file() {
        return read_dir(dir);
    }
    let py = python();
    let out = Command::new(&py)
        .args(["-m", "vectide.datasets", "export", name_or_path])
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot run {} to prepare the dataset: {e}", py.display()))?;
    if !out.status.success() {
        return Err(format!(
            "preparing dataset {name_or_path:?} failed ({})",
            out.status
        ));
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let dir = stdout
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .ok_or("vectide.datasets export printed no directory")?;
    read_dir(Path::new(dir.trim()))
}

/// Reads an exported dataset directory.
pub fn read_dir(dir: &Path) -> Result<Dataset, String> {
    let meta_path = dir.join("meta.json");
    let meta: serde_json::Value = serde_json::from_slice(
        &std::fs::read(&meta_path).map_err(|e| format!("{}: {e}", meta_path.display()))?,
    )
    .map_err(|e| format!("{}: {e}", meta_path.display()))?;
    let read = |name: &str| Matrix::read(&dir.join(name)).map_err(|e| e.to_string());
    let (train, test, gt) = (
        read("train.fbin")?,
        read("test.fbin")?,
        read("neighbors.ibin")?,
    );
    let (n, dim, nq, qdim, gq, gt_k) = (
        train.rows, train.cols, test.rows, test.cols, gt.rows, gt.cols,
    );
    if qdim != dim || gq != nq || n == 0 || nq == 0 {
        return Err(format!(
            "{}: inconsistent shapes train {n}x{dim}, test {nq}x{qdim}, neighbors {gq}x{gt_k}",
            dir.display()
        ));
    }
    Ok(Dataset {
        name: meta["name"].as_str().unwrap_or("dataset").to_string(),
        distance: meta["distance"].as_str().unwrap_or("angular").to_string(),
        dim,
        train: train.f32s(),
        test: test.f32s(),
        neighbors: gt.i32s(),
        gt_k,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(path: &Path, rows: u32, cols: u32, data: &[u8]) {
        let mut b = rows.to_le_bytes().to_vec();
        b.extend_from_slice(&cols.to_le_bytes());
        b.extend_from_slice(data);
        std::fs::write(path, b).unwrap();
    }

    #[test]
    fn reads_sidecars_and_rejects_bad_shapes() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let floats: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0]
            .iter()
            .flat_map(|f| f.to_le_bytes())
            .collect();
        write(&d.join("train.fbin"), 2, 2, &floats);
        write(&d.join("test.fbin"), 1, 2, &floats[..8]);
        write(&d.join("neighbors.ibin"), 1, 1, &1i32.to_le_bytes());
        std::fs::write(
            d.join("meta.json"),
            r#"{"name":"t","distance":"euclidean"}"#,
        )
        .unwrap();
        let ds = read_dir(d).unwrap();
        assert_eq!((ds.n_train(), ds.n_test(), ds.gt_k), (2, 1, 1));
        assert_eq!(ds.train, vec![1.0, 2.0, 3.0, 4.0]);
        assert_eq!(ds.metric().unwrap(), vectide_core::Metric::L2);
        // A truncated matrix is an error, not a panic.
        write(&d.join("train.fbin"), 3, 2, &floats);
        assert!(read_dir(d).unwrap_err().contains("header says 3 x 2"));
        std::fs::write(d.join("train.fbin"), [1u8, 2]).unwrap();
        assert!(read_dir(d).is_err());
    }
}
