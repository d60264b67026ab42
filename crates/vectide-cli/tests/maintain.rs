//! `vectide maintain`: a collection's pending maintenance from the command
//! line (here: fresh-diskann's first LTI, written from its temp index);
//! `vectide inspect` and `open-probe --verify` on a damaged p-hnsw index.

use std::io::Write;
use std::process::Command;

fn vectide(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_vectide"))
        .args(args)
        .output()
        .expect("runs")
}

/// Imports `n` points of dimension 8 (coordinate `k` of point `i` is
/// `x(i, k)`) into collection `docs` of a new database under `dir`, engine
/// `engine`; returns the database directory.
fn import(
    dir: &std::path::Path,
    engine: &str,
    n: u32,
    x: impl Fn(u32, u32) -> f32,
) -> std::path::PathBuf {
    let data = dir.join("db");
    let points = dir.join("points.jsonl");
    let mut f = std::fs::File::create(&points).unwrap();
    for i in 0..n {
        let v: Vec<f32> = (0..8).map(|k| x(i, k)).collect();
        writeln!(f, "{}", serde_json::json!({"id": i, "vector": v})).unwrap();
    }
    drop(f);
    let out = vectide(&[
        "import",
        "--data",
        data.to_str().unwrap(),
        "--collection",
        "docs",
        "--engine",
        engine,
        points.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    data
}

#[test]
fn maintain_writes_the_first_lti_and_bad_names_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let data = import(dir.path(), "fresh-diskann", 600, |i, k| {
        ((i * 7 + k * 13) % 31) as f32 + 0.5
    });
    let data_s = data.to_str().unwrap();
    let out = vectide(&["maintain", "--data", data_s]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("docs: maintenance done") && stdout.contains("600 live points"),
        "{stdout}"
    );
    // The LTI is on disk now: inspect reads its manifest and file.
    let out = vectide(&[
        "inspect",
        "--json",
        data.join("collections/docs/index").to_str().unwrap(),
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("lti"), "{text}");
    // An unknown collection is an error naming it, exit 1.
    let out = vectide(&["maintain", "--data", data_s, "--collection", "nope"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("nope"));
}

/// A p-hnsw node whose vector was altered on disk: `vectide inspect` and
/// `vectide open-probe --verify` fail naming the node (its checksum).
#[test]
fn inspect_and_open_probe_verify_name_a_damaged_p_hnsw_node() {
    let dir = tempfile::tempdir().unwrap();
    let data = import(dir.path(), "p-hnsw", 50, |i, k| {
        ((i * 5 + k * 3) % 17) as f32
    });
    let index = data.join("collections/docs/index");
    let index_s = index.to_str().unwrap();
    let probe = || vectide(&["open-probe", "--persist", "msync", "--verify", index_s]);
    let out = probe();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Node 0's vector (dim 8, m 16: the vector starts 192 bytes into the
    // block, after the 4 KiB header page).
    let nodes = index.join("nodes.vtdp");
    let mut bytes = std::fs::read(&nodes).unwrap();
    bytes[4096 + 192 + 1] ^= 0x40;
    std::fs::write(&nodes, bytes).unwrap();
    for out in [vectide(&["inspect", index_s]), probe()] {
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(err.contains("node 0: checksum mismatch"), "{err}");
    }
}
