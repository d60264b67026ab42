use std::time::Instant;
use vectide_quant::pq::{DistanceTable, ProductQuantizer};
fn main() {
    let n = 370_000usize;
    let dim = 50;
    let m = 32;
    let mut s = 12345u64;
    let mut rnd = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let train: Vec<f32> = (0..20000 * dim)
        .map(|_| (rnd() % 1000) as f32 / 1000.0)
        .collect();
    let pq = ProductQuantizer::train(
        &train,
        dim,
        &vectide_quant::pq::PqParams {
            iters: 3,
            ..vectide_quant::pq::PqParams::new(m)
        },
    )
    .unwrap();
    let codes: Vec<u8> = (0..n * m).map(|_| rnd() as u8).collect();
    let q: Vec<f32> = (0..dim).map(|_| (rnd() % 1000) as f32 / 1000.0).collect();
    let mut t = DistanceTable::default();
    pq.table_into(&q, vectide_core::Metric::L2, &mut t).unwrap();
    for span in [n, 4096] {
        let lists: Vec<u32> = (0..64 * 100_000)
            .map(|_| (rnd() % span as u64) as u32)
            .collect();
        let mut out = Vec::new();
        let mut sum = 0.0;
        let t0 = Instant::now();
        for l in lists.chunks(64) {
            t.distances_at(&codes, l, &mut out).unwrap();
            sum += out[0];
        }
        let a = t0.elapsed().as_secs_f64() / lists.len() as f64 * 1e9;
        let t0 = Instant::now();
        for l in lists.chunks(64) {
            for &i in l {
                sum += t.distance(&codes[i as usize * m..(i as usize + 1) * m]);
            }
        }
        let b = t0.elapsed().as_secs_f64() / lists.len() as f64 * 1e9;
        let t0 = Instant::now();
        for l in lists.chunks(64) {
            for &i in l {
                sum += vectide_quant::pq::lookup_scalar(
                    t.terms(),
                    m,
                    &codes[i as usize * m..(i as usize + 1) * m],
                );
            }
        }
        let c = t0.elapsed().as_secs_f64() / lists.len() as f64 * 1e9;
        println!(
            "span {span}: distances_at {a:.1} ns, single avx2 {b:.1} ns, scalar {c:.1} ns ({sum})"
        );
    }
}
