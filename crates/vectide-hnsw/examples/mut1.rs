use vectide_hnsw::phnsw::crashtest::{run, CrashTestConfig};
use vectide_storage::Site;
fn main() {
    let site = std::env::args().nth(1).unwrap();
    let site: &'static str = Box::leak(site.into_boxed_str());
    let r = run(&CrashTestConfig {
        points: 300,
        ops: 40,
        images_per_point: 4,
        recovery_share: 0.0,
        disable: Some(Site(site)),
        ..Default::default()
    })
    .unwrap();
    println!(
        "violating={} {:?}",
        r.violating_points,
        r.violations.first()
    );
}
