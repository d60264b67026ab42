//! P-HNSW crash-state tests on the simulator: crash points over inserts,
//! upserts, deletes and recovery itself; and the mutation check, which
//! switches off one persistence site at a time and requires the checker to
//! report violations. `VECTIDE_CRASH_POINTS` sizes the first (default 200).

use vectide_phnsw::crashtest::{mutation_sites, run, CrashTestConfig, ALL_SITES};
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

/// Crash points over consolidations (entry move, logged list repairs and
/// relinks, unlinks) and over the inserts after them that reuse the
/// unlinked slots (and their upper-list room).
#[test]
fn every_crash_point_of_consolidations_and_slot_reuse_recovers() {
    let n = points();
    let r = run(&CrashTestConfig {
        points: n,
        seed: 23,
        maintain_every: 6,
        ..CrashTestConfig::default()
    })
    .unwrap();
    println!("{r:#?}");
    assert_eq!(r.violating_points, 0, "{:#?}", r.violations);
    for op in ["maintain", "insert", "delete"] {
        assert!(
            r.by_operation.get(op).copied().unwrap_or(0) > 0,
            "no crash during {op}: {:?}",
            r.by_operation
        );
    }
    for site in ["consolidate.fence.lists", "consolidate.fence.unlink"] {
        assert!(
            r.sites.contains_key(site),
            "{site} never ran: {:?}",
            r.sites
        );
    }
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

/// [`mutation_config`] with a consolidation after every tenth operation:
/// the consolidation's sites, and the inserts that reuse its slots.
fn mutation_config_with_consolidations() -> CrashTestConfig {
    CrashTestConfig {
        maintain_every: 10,
        ..mutation_config()
    }
}

/// Runs the mutation check on `sites`; panics naming those whose removal
/// went unnoticed.
fn mutate_sites(cfg: &CrashTestConfig, sites: &[Site]) {
    let mut undetected: Vec<&str> = Vec::new();
    for site in sites {
        let t0 = std::time::Instant::now();
        let r = run(&CrashTestConfig {
            disable: Some(*site),
            ..cfg.clone()
        })
        .unwrap();
        println!(
            "{:32} detected after {} points ({:.1} s): {}",
            site.0,
            r.points_checked,
            t0.elapsed().as_secs_f64(),
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

/// Every site the workload uses, a third of them per part. Finding the
/// sites is a whole clean run (every fence a crash point, three images
/// each): about two thirds of each part's time.
fn mutate(part: usize, parts: usize) {
    let cfg = mutation_config_with_consolidations();
    let sites = mutation_sites(&cfg).unwrap();
    assert!(
        sites.len() >= 30,
        "the insert, delete and recovery paths persist at {} sites",
        sites.len()
    );
    let mine: Vec<Site> = sites
        .iter()
        .enumerate()
        .filter(|(i, _)| i % parts == part)
        .map(|(_, s)| *s)
        .collect();
    mutate_sites(&cfg, &mine);
}

/// The fast set's mutation check: one site of each path (the insert's
/// redo log, its in-edge undo log and publication, the label map, a
/// delete, recovery's own, a consolidation's list log and its unlink), named, so no enumeration run is needed. The
/// three parts below check every site (`make test-all`).
#[test]
fn mutation_check_one_site_of_each_path() {
    let names = [
        "insert.fence.nlog",
        "in_edges.fence.nlist",
        "publish.live_count",
        "labels.bucket",
        "delete.live_count",
        "recovery.none",
    ];
    let site = |n: &&str| {
        *ALL_SITES
            .iter()
            .find(|s| s.0 == *n)
            .unwrap_or_else(|| panic!("no persistence site {n}"))
    };
    let sites: Vec<Site> = names.iter().map(site).collect();
    mutate_sites(&mutation_config(), &sites);
    let consolidation: Vec<Site> = ["consolidate.nlist", "consolidate.fence.unlink"]
        .iter()
        .map(site)
        .collect();
    mutate_sites(&mutation_config_with_consolidations(), &consolidation);
}

#[test]
#[ignore = "slow (about 3 minutes): make test-all runs it"]
fn mutation_check_part_1_of_3() {
    mutate(0, 3);
}

#[test]
#[ignore = "slow (about 3 minutes): make test-all runs it"]
fn mutation_check_part_2_of_3() {
    mutate(1, 3);
}

#[test]
#[ignore = "slow (about 3 minutes): make test-all runs it"]
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
