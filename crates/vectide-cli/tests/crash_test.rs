//! `vectide crash-test TARGET`: the crash kit's simulator and real
//! SIGKILLed processes through the command, sized by
//! `VECTIDE_CRASH_POINTS` / `VECTIDE_KILL_ROUNDS` (20 / 8 here).

use std::process::Command;

fn crash_test(target: &str, extra: &[&str]) -> serde_json::Value {
    let knob = |k: &str, d: &str| std::env::var(k).unwrap_or_else(|_| d.to_string());
    let (points, kills) = (
        knob("VECTIDE_CRASH_POINTS", "20"),
        knob("VECTIDE_KILL_ROUNDS", "8"),
    );
    let out = Command::new(env!("CARGO_BIN_EXE_vectide"))
        .args([
            "crash-test",
            target,
            "--json",
            "--seed",
            "3",
            "--points",
            &points,
        ])
        .args(["--kill-rounds", &kills])
        .args(extra)
        .output()
        .expect("runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{target}: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_str(&stdout).expect("json");
    assert_eq!(v["violations"], 0, "{target}");
    // The simulator's outcome is on stderr before the kill rounds start.
    let err = String::from_utf8_lossy(&out.stderr);
    let done = format!(
        "{target}: simulator done: {} crash points, 0 violations",
        v["crash_points_checked"]
    );
    assert!(err.contains(&done), "{err}");
    assert!(v["crash_points_checked"].as_u64().unwrap() >= points.parse::<u64>().unwrap());
    let kill = &v["kill"];
    assert!(kill["rounds"].as_u64().unwrap() >= kills.parse::<u64>().unwrap());
    assert!(kill["acknowledged_ops"].as_u64().unwrap() > 0, "{target}");
    assert!(
        kill["in_flight_ops"].as_u64().unwrap() > 0,
        "{target}: kills hit writes in flight"
    );
    v
}

#[test]
fn p_hnsw_on_both_media() {
    let v = crash_test("p-hnsw", &[]);
    assert!(v["simulator"]["crashes_at_fence"].as_u64().unwrap() > 0);
    crash_test("p-hnsw", &["--param", "persist=msync"]);
}

/// d-hnsw runs on a memory node inside the child process, on a backing
/// file in the target's directory: the simulator crashes at its FLUSHes,
/// and a SIGKILL takes the compute node and the memory node down together
/// (the next open finds the node restarted and puts the region right).
#[test]
fn d_hnsw_on_a_backing_file() {
    let v = crash_test("d-hnsw", &[]);
    assert!(v["simulator"]["crashes_at_fence"].as_u64().unwrap() > 0);
    assert!(
        v["kill"]["recoveries_with_work"].as_u64().unwrap() > 0,
        "{v}"
    );
}

#[test]
fn snapshot_baseline_and_database_collections() {
    crash_test("hnsw-snap", &[]);
    // A volatile engine's collection crashes at WAL syncs only.
    let v = crash_test("db:hnsw", &[]);
    assert!(v["simulator"]["crashes_at_sync_point"].as_u64().unwrap() > 0);
    // With p-hnsw, fences outnumber the WAL's syncs: crashes come at both,
    // in proportion.
    let v = crash_test("db:p-hnsw", &[]);
    let s = &v["simulator"];
    assert!(
        s["crashes_at_fence"].as_u64().unwrap() + s["crashes_at_sync_point"].as_u64().unwrap() > 0
    );
}

#[test]
fn volatile_engines_and_unknown_targets_are_refused() {
    for (t, want) in [("hnsw", "db:hnsw"), ("nope", "p-hnsw")] {
        let out = Command::new(env!("CARGO_BIN_EXE_vectide"))
            .args(["crash-test", t, "--points", "1", "--kill-rounds", "0"])
            .output()
            .expect("runs");
        assert!(!out.status.success(), "{t}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{t}: {err}");
    }
}
