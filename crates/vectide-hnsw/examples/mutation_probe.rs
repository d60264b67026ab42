use vectide_hnsw::phnsw::crashtest::{mutation_sites, run, CrashTestConfig};
fn main() {
    let base = CrashTestConfig {
        points: 100_000,
        ops: 40,
        images_per_point: 3,
        recovery_share: 0.5,
        recovery_crash_all: true,
        stop_at_first: true,
        ..Default::default()
    };
    let sites = mutation_sites(&base).unwrap();
    println!("{} sites", sites.len());
    let t0 = std::time::Instant::now();
    for s in sites {
        let t = std::time::Instant::now();
        let r = run(&CrashTestConfig {
            disable: Some(s),
            ..base.clone()
        })
        .unwrap();
        println!(
            "{:32} violating={} checked={} {:.1}s  {}",
            s.0,
            r.violating_points,
            r.points_checked,
            t.elapsed().as_secs_f64(),
            r.violations.first().cloned().unwrap_or_default()
        );
    }
    println!("total {:.1}s", t0.elapsed().as_secs_f64());
}
