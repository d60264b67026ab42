//! `vectide crash-test p-hnsw`: simulator points and real SIGKILLed
//! processes, sized by `VECTIDE_CRASH_POINTS` / `VECTIDE_KILL_ROUNDS`
//! (defaults 200 / 20).

use std::process::Command;

#[test]
fn crash_test_command_reports_no_violation() {
    let out = Command::new(env!("CARGO_BIN_EXE_vectide"))
        .args(["crash-test", "p-hnsw", "--json", "--seed", "3"])
        .output()
        .expect("runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_str(&stdout).expect("json");
    let knob = |k: &str, d: u64| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    assert_eq!(v["violations"], 0);
    assert!(
        v["crash_points_checked"].as_u64().unwrap() >= knob("VECTIDE_CRASH_POINTS", 200).min(200)
    );
    let kill = &v["kill"];
    assert!(kill["rounds"].as_u64().unwrap() >= knob("VECTIDE_KILL_ROUNDS", 20));
    assert!(kill["acknowledged_ops"].as_u64().unwrap() > 0);
    assert!(
        kill["recoveries_with_work"].as_u64().unwrap() > 0,
        "kills hit operations in flight"
    );
}

#[test]
fn crash_test_rejects_other_engines() {
    let out = Command::new(env!("CARGO_BIN_EXE_vectide"))
        .args(["crash-test", "hnsw", "--points", "1", "--kill-rounds", "0"])
        .output()
        .expect("runs");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("p-hnsw"));
}
