//! P-HNSW crash-state tests on the simulator: crash points over inserts,
//! upserts, deletes and recovery itself; and the mutation check, which
//! switches off one persistence site at a time and requires the checker to
//! report violations. `VECTIDE_CRASH_POINTS` sizes the first (default 200).

use vectide_phnsw::crashtest::{mutation_sites, run, CrashTestConfig};
use vectide_storage::Site;

fn points() -> usize {
    std::env::var("VECTIDE_CRASH_POINTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200)
}

#[test]
fn every_crash_point_recovers_to_a_consistent_index() {
    let n = points();
    let r = run(&CrashTestConfig {
        points: n,
        seed: 11,
        ..CrashTestConfig::default()
    })
    .unwrap();
    println!("{r:#?}");
    assert_eq!(r.violating_points, 0, "{:#?}", r.violations);
    assert!(
        r.points_checked >= n.min(r.fences as usize),
        "{} points",
        r.points_checked
    );
    for op in ["insert", "upsert", "delete", "recovery"] {
        assert!(
            r.by_operation.get(op).copied().unwrap_or(0) > 0,
            "no crash during {op}: {:?}",
            r.by_operation
        );
    }
    assert!(
        r.recoveries_with_work * 2 > r.points_checked,
        "most points leave log work to recover"
    );
    assert!(
        r.by_pending_lines.keys().any(|k| k != "0"),
        "crashes with pending lines"
    );
    assert!(r.reference_recall_min >= 0.9 && r.worst_recall_drop <= 0.01);
}

/// The mutation check's configuration: every fence of a small workload is
/// a crash point, three images each, and crashes during recovery at every
/// fence of the recovery.
fn mutation_config() -> CrashTestConfig {
    CrashTestConfig {
        points: usize::MAX,
        ops: 40,
        images_per_point: 3,
        recovery_share: 0.5,
        recovery_crash_all: true,
        stop_at_first: true,
        seed: 1,
        ..CrashTestConfig::default()
    }
}

fn mutate(part: usize, parts: usize) {
    let cfg = mutation_config();
    let sites = mutation_sites(&cfg).unwrap();
    assert!(
        sites.len() >= 30,
        "the insert, delete and recovery paths persist at {} sites",
        sites.len()
    );
    let mut undetected: Vec<&str> = Vec::new();
    for (i, site) in sites.iter().enumerate() {
        if i % parts != part {
            continue;
        }
        let r = run(&CrashTestConfig {
            disable: Some(*site),
            ..cfg.clone()
        })
        .unwrap();
        println!(
            "{:32} detected after {} points: {}",
            site.0,
            r.points_checked,
            r.violations.first().cloned().unwrap_or_default()
        );
        if r.violating_points == 0 {
            undetected.push(site.0);
        }
    }
    assert!(
        undetected.is_empty(),
        "removing these persistence points went unnoticed: {undetected:?}"
    );
}

#[test]
fn mutation_check_part_1_of_3() {
    mutate(0, 3);
}

#[test]
fn mutation_check_part_2_of_3() {
    mutate(1, 3);
}

#[test]
fn mutation_check_part_3_of_3() {
    mutate(2, 3);
}

#[test]
fn a_disabled_unrelated_site_changes_nothing() {
    // The switch itself is exact: disabling a site no path uses leaves every
    // crash point clean.
    let r = run(&CrashTestConfig {
        points: 60,
        disable: Some(Site("no.such.site")),
        ..CrashTestConfig::default()
    })
    .unwrap();
    assert_eq!(r.violating_points, 0, "{:?}", r.violations);
}
