//! Times the distance kernels of every available ISA.
//!
//! ```text
//! cargo run -p vectide-core --release --example kernels [CALLS] [REPS] [QSHIFT] [VSHIFT]
//! ```
//!
//! For each dimension, one query is compared against a buffer of vectors
//! (about 512 KiB, so it stays in L2 and the numbers reflect the kernels, not
//! DRAM), cycling through the buffer for `CALLS` evaluations (default 10
//! million) through a `fn` pointer, as the engines call them. Each
//! measurement is repeated `REPS` times (default 3) and the fastest is kept.
//!
//! The query and the vector buffer start `QSHIFT` and `VSHIFT` elements (default
//! 0 and 0) past a 64-byte boundary; e.g. `4 4` mimics the 16-byte alignment of
//! large `Vec<f32>` allocations, `1 3` is a worst case for the kernels.

use std::hint::black_box;
use std::time::Instant;

use vectide_core::distance::{self, kernels_for, Isa};
use vectide_core::metric::DistanceFn;

const DIMS: [usize; 4] = [50, 128, 384, 768];
const BUFFER_BYTES: usize = 512 * 1024;

/// A small deterministic generator (xorshift64*), values in [-1, 1).
struct Rng(u64);

impl Rng {
    fn next_f32(&mut self) -> f32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let bits = self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 40; // 24 bits
        bits as f32 / (1u32 << 23) as f32 - 1.0
    }
}

/// Nanoseconds per call of `f(query, vectors[i % n])` over `calls` calls.
fn time_ns(f: DistanceFn, query: &[f32], vectors: &[f32], dim: usize, calls: usize) -> f64 {
    let f = black_box(f);
    let count = vectors.len() / dim;
    let mut sum = 0.0f32;
    let mut slot = 0;
    let start = Instant::now();
    for _ in 0..calls {
        let v = &vectors[slot * dim..(slot + 1) * dim];
        sum += f(black_box(query), v);
        slot += 1;
        if slot == count {
            slot = 0;
        }
    }
    let elapsed = start.elapsed();
    black_box(sum);
    elapsed.as_secs_f64() * 1e9 / calls as f64
}

fn main() {
    let mut args = std::env::args().skip(1);
    let calls: usize = args
        .next()
        .map_or(10_000_000, |s| s.parse().expect("CALLS"));
    let reps: usize = args.next().map_or(3, |s| s.parse().expect("REPS"));
    let qshift: usize = args.next().map_or(0, |s| s.parse().expect("QSHIFT"));
    let vshift: usize = args.next().map_or(0, |s| s.parse().expect("VSHIFT"));
    assert!(qshift < 16 && vshift < 16, "shifts are in 0..16");

    let isas: Vec<(Isa, distance::Kernels)> = Isa::ALL
        .into_iter()
        .filter_map(|isa| match kernels_for(isa) {
            Some(k) => Some((isa, k)),
            None => {
                println!("note: {isa} not available on this CPU/target, skipped");
                None
            }
        })
        .collect();
    println!(
        "active ISA: {} | {calls} calls per measurement, best of {reps} | \
         query/vectors start {qshift}/{vshift} floats past a 64-byte boundary",
        distance::active_isa()
    );
    println!();
    println!(
        "{:>5} {:>8} {:>7} | {:>11} {:>8} | {:>11} {:>8}",
        "dim", "isa", "vectors", "l2_sq ns", "speedup", "dot ns", "speedup"
    );

    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for dim in DIMS {
        let count = (BUFFER_BYTES / (dim * 4)).max(16);
        let mut vbuf = vec![0.0f32; count * dim + 32];
        let mut qbuf = vec![0.0f32; dim + 32];
        let va = vbuf.as_ptr().align_offset(64) + vshift;
        let qa = qbuf.as_ptr().align_offset(64) + qshift;
        vbuf[va..va + count * dim]
            .iter_mut()
            .for_each(|x| *x = rng.next_f32());
        qbuf[qa..qa + dim]
            .iter_mut()
            .for_each(|x| *x = rng.next_f32());
        let vectors = &vbuf[va..va + count * dim];
        let query = &qbuf[qa..qa + dim];

        let mut scalar = (f64::NAN, f64::NAN);
        for &(isa, k) in &isas {
            let best = |f: DistanceFn| {
                time_ns(f, query, vectors, dim, calls / 10); // warm-up
                (0..reps)
                    .map(|_| time_ns(f, query, vectors, dim, calls))
                    .fold(f64::INFINITY, f64::min)
            };
            let l2 = best(k.l2_sq);
            let dot = best(k.dot);
            if isa == Isa::Scalar {
                scalar = (l2, dot);
            }
            println!(
                "{dim:>5} {:>8} {count:>7} | {l2:>11.2} {:>7.2}x | {dot:>11.2} {:>7.2}x",
                isa.name(),
                scalar.0 / l2,
                scalar.1 / dot
            );
        }
    }
}
