use vectide_hnsw::phnsw::crashtest::{run, CrashTestConfig};
fn main() {
    let points: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(100);
    let t = std::time::Instant::now();
    let seed: u64 = std::env::args()
        .nth(2)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let r = run(&CrashTestConfig {
        points,
        seed,
        ..Default::default()
    })
    .unwrap();
    println!("{:#?}", r);
    println!("{:.1}s", t.elapsed().as_secs_f64());
}
