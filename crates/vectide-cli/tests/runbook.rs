//! `vectide runbook` through the binary: a small synthetic dataset written
//! as exported sidecars (`docs/format-vbin.md`, read without Python), a
//! runbook with every operation, the JSON it writes, and the refusals
//! (exit code 2, no output file) of runbooks and engines that cannot run.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const DIM: usize = 16;
const ROWS: usize = 3000;
const QUERIES: usize = 60;

/// A deterministic generator (xorshift) and a standard normal from it.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
    fn normal(&mut self) -> f32 {
        let (u, v) = (self.next().max(1e-12), self.next());
        ((-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()) as f32
    }
}

fn write_matrix(path: &Path, rows: usize, cols: usize, data: &[u8]) {
    let mut b = (rows as u32).to_le_bytes().to_vec();
    b.extend_from_slice(&(cols as u32).to_le_bytes());
    b.extend_from_slice(data);
    std::fs::write(path, b).unwrap();
}

/// Clustered vectors under an angular distance, as sidecars in `dir`.
fn write_dataset(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let centres: Vec<Vec<f32>> = (0..12)
        .map(|_| (0..DIM).map(|_| 4.0 * rng.normal()).collect())
        .collect();
    let point = |rng: &mut Rng| -> Vec<f32> {
        let c = &centres[(rng.next() * centres.len() as f64) as usize % centres.len()];
        c.iter().map(|x| x + rng.normal()).collect()
    };
    let bytes = |v: Vec<f32>| -> Vec<u8> { v.iter().flat_map(|f| f.to_le_bytes()).collect() };
    let train: Vec<f32> = (0..ROWS).flat_map(|_| point(&mut rng)).collect();
    let test: Vec<f32> = (0..QUERIES).flat_map(|_| point(&mut rng)).collect();
    write_matrix(&dir.join("train.fbin"), ROWS, DIM, &bytes(train));
    write_matrix(&dir.join("test.fbin"), QUERIES, DIM, &bytes(test));
    // The dataset's own ground truth is not used (the runbook's active sets
    // change); one column of zeros keeps the shapes consistent.
    write_matrix(
        &dir.join("neighbors.ibin"),
        QUERIES,
        1,
        &vec![0u8; QUERIES * 4],
    );
    std::fs::write(
        dir.join("meta.json"),
        r#"{"name": "synthetic-3k-16-angular", "distance": "angular"}"#,
    )
    .unwrap();
}

const RUNBOOK: &str = "\
synthetic:
  max_pts: 2000
  1: {operation: insert, start: 0, end: 1500}
  2: {operation: search}
  3: {operation: delete, start: 0, end: 300}
  4: {operation: insert, start: 1500, end: 1800}
  5: {operation: search}
  6: {operation: replace, tags_start: 300, tags_end: 500, ids_start: 2000, ids_end: 2200}
  7: {operation: search}
  8: {operation: delete, start: 1500, end: 1800}
  9: {operation: insert, start: 0, end: 300}
  10: {operation: search}
";

struct Setup {
    _dir: tempfile::TempDir,
    data: PathBuf,
    root: PathBuf,
}

fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("synthetic.vbin");
    write_dataset(&data);
    Setup {
        root: dir.path().to_path_buf(),
        data,
        _dir: dir,
    }
}

fn runbook(s: &Setup, yaml: &str, out: &Path, extra: &[&str]) -> Output {
    let path = s.root.join("runbook.yaml");
    std::fs::write(&path, yaml).unwrap();
    Command::new(env!("CARGO_BIN_EXE_vectide"))
        .arg("runbook")
        .arg("--dataset")
        .arg(&s.data)
        .arg("--runbook")
        .arg(&path)
        .arg("--out")
        .arg(out)
        .args(["--queries", "50", "--update-threads", "2"])
        .args(extra)
        .env("VECTIDE_PYTHON", "/nonexistent/python") // the sidecars need none
        .output()
        .expect("runs")
}

#[test]
fn runs_every_operation_on_the_default_engines() {
    let s = setup();
    let out = s.root.join("res/runbook.json");
    let r = runbook(&s, RUNBOOK, &out, &[]);
    let stderr = String::from_utf8_lossy(&r.stderr);
    assert!(r.status.success(), "{stderr}");
    let doc: Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    assert_eq!(doc["benchmark"], "runbook");
    assert_eq!(doc["dataset"], "synthetic-3k-16-angular");
    assert_eq!(doc["metric"], "cosine");
    assert_eq!(doc["k"], 10);
    assert_eq!(doc["queries_per_search"], 50);
    assert_eq!(
        doc["threads"],
        serde_json::json!({"updates": 2, "searches": 1})
    );
    assert!(doc["machine"]["cores"].as_u64().unwrap() >= 1);
    assert!(doc["simd"].is_string() && doc["date"].is_string());
    let rb = &doc["runbook"];
    assert_eq!(
        (rb["steps"].as_u64(), rb["search"].as_u64()),
        (Some(10), Some(4))
    );
    assert_eq!(
        (
            rb["insert"].as_u64(),
            rb["delete"].as_u64(),
            rb["replace"].as_u64()
        ),
        (Some(3), Some(2), Some(1))
    );
    assert_eq!(rb["peak_active"], 1500);
    let engines = doc["engines"].as_object().unwrap();
    let names: Vec<&str> = engines.keys().map(String::as_str).collect();
    // The default: the harness core's, every approximate engine in memory
    // or on SSD (the latter in a temporary directory).
    let mut want = vectide_harness::runbook::default_engines();
    want.sort();
    assert_eq!(names, want.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(
        names.contains(&"vectide:hnsw") && names.contains(&"vectide:fresh-diskann"),
        "{names:?}"
    );
    for (name, e) in engines {
        let steps = e["steps"].as_array().unwrap();
        assert_eq!(steps.len(), 10, "{name}");
        let mut sum = 0.0;
        for (i, st) in steps.iter().enumerate() {
            assert_eq!(st["step"], i + 1);
            let secs = st["seconds"].as_f64().unwrap();
            assert!(secs >= 0.0);
            sum += secs;
            assert!(st["memory_bytes"].as_u64().unwrap() > 0, "{name} {st}");
            if st["operation"] == "search" {
                let recall = st["recall"].as_f64().unwrap();
                assert!((0.0..=1.0).contains(&recall));
                assert!(st["qps"].as_f64().unwrap() > 0.0);
                let (mean, p99) = (
                    st["mean_latency_us"].as_f64().unwrap(),
                    st["p99_latency_us"].as_f64().unwrap(),
                );
                assert!(mean > 0.0 && p99 >= mean * 0.5, "{st}");
            } else {
                assert!(
                    st["points"].as_u64().unwrap() > 0 && st.get("points_per_s").is_some(),
                    "{st}"
                );
            }
        }
        let seconds = e["seconds"].as_f64().unwrap();
        assert!(
            (seconds - sum).abs() <= 1e-9 * sum.max(1.0),
            "{name}: {seconds} vs {sum}"
        );
        assert_eq!(doc["summary"]["seconds"][name], e["seconds"]);
        let avg = e["avg_recall"].as_f64().unwrap();
        assert!(avg >= 0.9, "{name}: avg recall {avg}");
        assert!(e["min_recall"].as_f64().unwrap() <= avg);
        assert_eq!(doc["summary"]["avg_recall10"][name], e["avg_recall"]);
        let knob = vectide_engines::descriptor(e["params"]["engine"].as_str().unwrap())
            .unwrap()
            .primary_knob
            .unwrap();
        let want = if knob.name() == "nprobe" { 32 } else { 100 };
        assert_eq!(
            e["search_knob"],
            serde_json::json!({knob.name(): want}),
            "{name}"
        );
        assert_eq!(e["params"]["threads"], 2, "{name}");
        assert!(e["params"]["engine"].is_string());
    }
    // A replace moved ids 300..500 to rows 2000..2200; the engines found them
    // there (high recall at the search after it), as the exact truth has them.
    for e in engines.values() {
        assert!(
            e["steps"][6]["recall"].as_f64().unwrap() >= 0.85,
            "{}",
            e["steps"][6]
        );
    }
}

#[test]
fn an_exact_engine_is_searched_without_a_knob_and_k_names_the_summary() {
    let s = setup();
    let out = s.root.join("flat.json");
    let r = runbook(
        &s,
        RUNBOOK,
        &out,
        &["--engines", "vectide:flat", "--k", "5"],
    );
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let doc: Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    let e = &doc["engines"]["vectide:flat"];
    assert_eq!(e["search_knob"], serde_json::json!({}));
    assert_eq!(e["min_recall"], 1.0);
    assert_eq!(doc["summary"]["avg_recall5"]["vectide:flat"], 1.0);
}

#[test]
fn a_directory_engine_runs_in_a_temporary_directory_and_a_variant_under_its_name() {
    let s = setup();
    let out = s.root.join("variants.json");
    let tmp = s.root.join("work");
    std::fs::create_dir_all(&tmp).unwrap();
    let path = s.root.join("runbook.yaml");
    std::fs::write(&path, RUNBOOK).unwrap();
    let r = Command::new(env!("CARGO_BIN_EXE_vectide"))
        .args(["runbook", "--dataset"])
        .arg(&s.data)
        .arg("--runbook")
        .arg(&path)
        .args([
            "--engines",
            "vectide:p-hnsw,hnsw@m=8",
            "--queries",
            "50",
            "--out",
        ])
        .arg(&out)
        .env("TMPDIR", &tmp)
        .output()
        .unwrap();
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let doc: Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    let p = &doc["engines"]["vectide:p-hnsw"];
    assert!(p["avg_recall"].as_f64().unwrap() >= 0.9, "{p}");
    let v = &doc["engines"]["vectide:hnsw@m=8"];
    assert_eq!(v["params"]["m"], 8, "{v}");
    assert_eq!(v["params"]["ef_construction"], 200, "{v}");
    // The temporary directory went with the engine.
    assert_eq!(std::fs::read_dir(&tmp).unwrap().count(), 0);
}

#[test]
fn a_runbook_that_cannot_run_exits_2_naming_the_step_and_writes_nothing() {
    let s = setup();
    let out = s.root.join("bad.json");
    let cases = [
        (
            RUNBOOK.replace(
                "3: {operation: delete, start: 0, end: 300}",
                "3: {operation: delete, start: 1500, end: 1600}",
            ),
            "step 3 (delete 1500..1600): ids never inserted or deleted already, first 1500",
        ),
        (
            RUNBOOK.replace("max_pts: 2000", "max_pts: 5000"),
            "max_pts 5000 must be in 1..=3000",
        ),
        (
            RUNBOOK.replace("4: {operation: insert", "4: {operation: upsert"),
            "step 4: unknown operation 'upsert'",
        ),
        (
            RUNBOOK.replace("end: 1800}\n  5", "end: 3001}\n  5"),
            "step 4 (insert): range 1500..3001 is empty or outside 0..3000",
        ),
        (
            RUNBOOK.replace("  7: {operation: search}\n", ""),
            "steps must be numbered 1..9 without gaps",
        ),
        (
            RUNBOOK.replace("ids_end: 2200", "ids_end: 2200, extra: 1"),
            "step 6 (replace): unknown field(s) ['extra']",
        ),
        (
            RUNBOOK.replace("tags_end: 500", "tags_end: 5.5"),
            "step 6: tags_end must be an integer, got 5.5",
        ),
        (
            RUNBOOK.replace("end: 1500}", "end: 2100}"),
            "step 1: 2100 points active, more than max_pts 2000",
        ),
        ("synthetic: [\n".to_string(), "not YAML"),
    ];
    for (yaml, message) in cases {
        let r = runbook(&s, &yaml, &out, &["--engines", "hnsw"]);
        let stderr = String::from_utf8_lossy(&r.stderr);
        assert_eq!(r.status.code(), Some(2), "{message}: {stderr}");
        assert!(stderr.contains(message), "want {message:?} in {stderr}");
        assert!(!out.exists(), "{message}: no output file");
        assert!(!stderr.contains("ground truth"), "nothing ran: {stderr}");
    }
    // Engines that cannot run a runbook are refused the same way.
    for (engines, message) in [
        ("nope", "unknown engine"),
        ("hnsw@nope=1", "has no parameter \"nope\""),
        ("hnsw@m=many", "m=many is not an integer"),
        ("hnsw,vectide:hnsw", "listed twice"),
    ] {
        let r = runbook(&s, RUNBOOK, &out, &["--engines", engines]);
        let stderr = String::from_utf8_lossy(&r.stderr);
        assert_eq!(r.status.code(), Some(2), "{engines}: {stderr}");
        assert!(stderr.contains(message), "{engines}: {stderr}");
        assert!(!out.exists());
    }
    let r = runbook(&s, RUNBOOK, &out, &["--k", "0"]);
    assert_eq!(r.status.code(), Some(2));
    assert!(!out.exists());
}
