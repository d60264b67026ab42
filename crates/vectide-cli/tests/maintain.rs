//! `vectide maintain`: a collection's pending maintenance from the command
//! line (here: fresh-diskann's first LTI, written from its temp index).

use std::io::Write;
use std::process::Command;

fn vectide(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_vectide"))
        .args(args)
        .output()
        .expect("runs")
}

#[test]
fn maintain_writes_the_first_lti_and_bad_names_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("db");
    let points = dir.path().join("points.jsonl");
    let mut f = std::fs::File::create(&points).unwrap();
    for i in 0..600u32 {
        let v: Vec<f32> = (0..8)
            .map(|k| ((i * 7 + k * 13) % 31) as f32 + 0.5)
            .collect();
        writeln!(f, "{}", serde_json::json!({"id": i, "vector": v})).unwrap();
    }
    drop(f);
    let data_s = data.to_str().unwrap();
    let out = vectide(&[
        "import",
        "--data",
        data_s,
        "--collection",
        "docs",
        "--engine",
        "fresh-diskann",
        points.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
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
