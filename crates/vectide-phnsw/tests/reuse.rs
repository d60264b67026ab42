//! Slot reuse (issue 35, item 1): a consolidation repairs the lists around
//! deleted nodes, unlinks them and hands their slots to inserts, so the
//! regions follow the live set under churn; searches after reuse return no
//! deleted label and no old label of a reused slot.
//!
//! `VECTIDE_REUSE_POINTS` sizes the churn test (default 20000).

#[path = "../../test-support/oracle.rs"]
mod common;
#[path = "../../test-support/writer_rounds.rs"]
mod writer_rounds;

use common::{clustered, exact_distance};
use proptest::prelude::*;
use std::collections::HashMap;
use std::path::Path;
use vectide_core::{Metric, SearchParams, VectorIndex};
use vectide_graph::HnswParams;
use vectide_phnsw::{PHnsw, PHnswParams};
use vectide_storage::PersistMode;
use writer_rounds::rounds_beside;

fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.metadata().map(|m| m.len()).unwrap_or(0))
        .sum()
}

fn file_bytes(dir: &Path, name: &str) -> u64 {
    std::fs::metadata(dir.join(name)).unwrap().len()
}

/// 20K 64-d points, rounds that each replace half of them (delete, insert
/// new labels), `maintain()` after each: `nodes.vtdp` stays within 1.1× of
/// its size after the first maintain, and the slots in use stay near the
/// live count. Fails on the code before slot reuse (the file grows by half
/// the live set every round).
#[test]
fn churn_keeps_the_regions_flat() {
    let n: usize = std::env::var("VECTIDE_REUSE_POINTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    let dim = 64;
    let rounds = 5;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("idx");
    let params = PHnswParams {
        hnsw: HnswParams {
            m: 12,
            ef_construction: 64,
            ..HnswParams::default()
        },
        initial_capacity: 1024,
        ..PHnswParams::default()
    };
    let idx = PHnsw::create(&dir, dim, Metric::L2, params, PersistMode::Pmem).unwrap();
    let data = clustered(n * (rounds + 1), dim, 50, 7);
    let row = |i: usize| &data[i * dim..(i + 1) * dim];
    let ids: Vec<u64> = (0..n as u64).collect();
    let mut seq = 1;
    idx.insert(seq, &ids, &data[..n * dim]).unwrap();
    let mut live: Vec<u64> = ids;
    let mut next_label = n as u64;
    let live_bytes = (n * dim * 4) as f64;
    let mut ratios = Vec::new();
    let mut nodes_sizes = Vec::new();
    let mut slot_ratio = Vec::new();
    let sample = n / 100;
    let mut missed = Vec::new();
    let mut report = |idx: &PHnsw,
                      live: &[u64],
                      ratios: &mut Vec<f64>,
                      sizes: &mut Vec<u64>,
                      sr: &mut Vec<f64>| {
        let mut miss = 0;
        for &l in live.iter().step_by(live.len() / sample).take(sample) {
            let v = idx.get(l).unwrap().expect("live label");
            let r = idx.search(&v, 1, &SearchParams::with_ef(64), None).unwrap();
            miss += usize::from(r.first().map(|n| n.id) != Some(l));
        }
        missed.push(miss);
        let st = idx.stats().unwrap();
        ratios.push(dir_bytes(&dir) as f64 / live_bytes);
        sizes.push(file_bytes(&dir, "nodes.vtdp"));
        sr.push(st.slots_used as f64 / st.live as f64);
    };
    idx.maintain().unwrap();
    report(&idx, &live, &mut ratios, &mut nodes_sizes, &mut slot_ratio);
    for r in 0..rounds {
        // Replace every other live label.
        let gone: Vec<u64> = live.iter().copied().skip(r % 2).step_by(2).collect();
        live = live.iter().copied().skip(1 - r % 2).step_by(2).collect();
        seq += 1;
        assert_eq!(idx.delete(seq, &gone).unwrap(), gone.len());
        let new: Vec<u64> = (next_label..next_label + gone.len() as u64).collect();
        let base = n + r * n;
        let vecs: Vec<f32> = (0..gone.len())
            .flat_map(|k| row(base + k).to_vec())
            .collect();
        seq += 1;
        idx.insert(seq, &new, &vecs).unwrap();
        next_label += new.len() as u64;
        live.extend(new);
        idx.maintain().unwrap();
        assert_eq!(idx.len(), n);
        report(&idx, &live, &mut ratios, &mut nodes_sizes, &mut slot_ratio);
    }
    let st = idx.stats().unwrap();
    println!("directory bytes / live vector bytes after each maintain: {ratios:.2?}");
    println!("nodes.vtdp bytes after each maintain: {nodes_sizes:?}");
    println!("slots in use / live after each maintain: {slot_ratio:.3?}");
    println!("stats: {:?}", st.extra);
    println!("sampled labels not at rank 1 after each maintain: {missed:?}");
    assert!(st.maintenance_started >= 1, "consolidate is reported");
    let problems = idx.check();
    assert!(problems.is_empty(), "{problems:?}");
    let first = nodes_sizes[1] as f64;
    let last = *nodes_sizes.last().unwrap() as f64;
    assert!(
        last <= 1.1 * first,
        "nodes.vtdp grew from {first} to {last} bytes with a constant live set"
    );
    let dir_growth = ratios.last().unwrap() / ratios[1];
    assert!(
        dir_growth <= 1.1,
        "directory over live grew {dir_growth:.2}x"
    );
    assert!(
        *slot_ratio.last().unwrap() <= 1.05,
        "slots in use / live {:?}",
        slot_ratio
    );
    // The survivors are still found as well as the built index found its
    // points: sampled live labels at rank 1 of a search for their own vector.
    // Measured: 1 of 200 before, 15 to 21 after five rounds (the repair's
    // pruning thins the graph where half the nodes go at once; see the
    // crate docs' known gaps).
    let (before, after) = (missed[0], *missed.last().unwrap());
    assert!(
        after <= before + sample / 8,
        "{after} of {sample} sampled labels not at rank 1 after the churn, {before} before"
    );
    drop(idx);
    // A reopen starts with an empty free list; its first consolidation
    // rebuilds it from the node states.
    let idx = PHnsw::open(&dir, PersistMode::Pmem, None).unwrap();
    assert_eq!(idx.len(), n);
    idx.maintain().unwrap();
    let st = idx.stats().unwrap();
    assert_eq!(st.slots_used, st.live, "{:?}", st.extra);
}

#[derive(Debug, Clone)]
enum Op {
    Insert,
    Upsert(u8),
    Delete(u8),
    Maintain,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => Just(Op::Insert),
        2 => any::<u8>().prop_map(Op::Upsert),
        3 => any::<u8>().prop_map(Op::Delete),
        1 => Just(Op::Maintain),
    ]
}

/// Checks the index against the model: the same labels with the same
/// vectors, a sound structure, and exact searches (ef above the slots)
/// that return only live labels at the distance of their current vector
/// (a reused slot never answers for its old label).
fn check_against(idx: &PHnsw, model: &HashMap<u64, Vec<f32>>, queries: &[Vec<f32>]) {
    assert_eq!(idx.len(), model.len());
    let problems = idx.check();
    assert!(problems.is_empty(), "{problems:?}");
    for (l, v) in model {
        assert_eq!(idx.get(*l).unwrap().as_ref(), Some(v), "label {l}");
    }
    for q in queries {
        let r = idx
            .search(q, 10, &SearchParams::with_ef(512), None)
            .unwrap();
        assert_eq!(r.len(), model.len().min(10));
        for n in &r {
            let v = model
                .get(&n.id)
                .unwrap_or_else(|| panic!("search returned {} which is not live", n.id));
            let d = exact_distance(Metric::L2, q, v);
            assert!(
                (d - n.distance).abs() <= 1e-3 * d.max(1.0),
                "label {}: distance {} but its vector is at {d}",
                n.id,
                n.distance
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]
    /// Random inserts, upserts, deletes and consolidations against a model.
    #[test]
    fn reuse_matches_a_model(ops in proptest::collection::vec(op(), 20..160), seed in 0u64..1000) {
        let dim = 8;
        let tmp = tempfile::tempdir().unwrap();
        let params = PHnswParams {
            hnsw: HnswParams { m: 4, ef_construction: 32, threads: Some(1), ..HnswParams::default() },
            nlog_entries: 4,
            nlist_entries: 16,
            initial_capacity: 16,
        };
        let idx = PHnsw::create(tmp.path(), dim, Metric::L2, params, PersistMode::Pmem).unwrap();
        let data = clustered(ops.len() + 60, dim, 4, seed);
        let queries: Vec<Vec<f32>> = data[..5 * dim].chunks(dim).map(|c| c.to_vec()).collect();
        let mut model: HashMap<u64, Vec<f32>> = HashMap::new();
        // A base so that deletes and consolidations have something to do.
        let base: Vec<u64> = (0..40).collect();
        idx.insert(1, &base, &data[5 * dim..45 * dim]).unwrap();
        for (k, l) in base.iter().enumerate() {
            model.insert(*l, data[(5 + k) * dim..(6 + k) * dim].to_vec());
        }
        let mut seq = 1;
        let mut next = 1000u64;
        for (k, op) in ops.iter().enumerate() {
            seq += 1;
            let v = data[(45 + k % 15) * dim..(46 + k % 15) * dim]
                .iter()
                .map(|x| x + k as f32 * 1e-3)
                .collect::<Vec<f32>>();
            let labels: Vec<u64> = {
                let mut ls: Vec<u64> = model.keys().copied().collect();
                ls.sort_unstable();
                ls
            };
            match op {
                Op::Insert => {
                    next += 1;
                    idx.insert(seq, &[next], &v).unwrap();
                    model.insert(next, v);
                }
                Op::Upsert(i) if !labels.is_empty() => {
                    let l = labels[*i as usize % labels.len()];
                    idx.insert(seq, &[l], &v).unwrap();
                    model.insert(l, v);
                }
                Op::Delete(i) if !labels.is_empty() => {
                    let l = labels[*i as usize % labels.len()];
                    prop_assert_eq!(idx.delete(seq, &[l]).unwrap(), 1);
                    model.remove(&l);
                }
                Op::Maintain => {
                    idx.maintain().unwrap();
                    check_against(&idx, &model, &queries);
                }
                _ => {}
            }
        }
        idx.maintain().unwrap();
        check_against(&idx, &model, &queries);
        let st = idx.stats().unwrap();
        prop_assert_eq!(st.slots_used, st.live);
        drop(idx);
        let idx = PHnsw::open(tmp.path(), PersistMode::Pmem, Some(1)).unwrap();
        check_against(&idx, &model, &queries);
    }
}

/// A consolidation's list repairs run beside writers: with 8,000 points and
/// half of them deleted, upserts and deletes issued while it runs complete
/// before it ends (on the code that held writers for the whole job, every
/// one waited for its end), and the index afterwards is whole: the
/// structure check is clean and every live label is found by its own
/// vector.
#[test]
fn writers_complete_while_a_consolidation_repairs() {
    use std::sync::atomic::{AtomicU64, Ordering};
    let (n, dim) = (8_000usize, 32);
    let tmp = tempfile::tempdir().unwrap();
    let params = PHnswParams {
        hnsw: HnswParams {
            m: 12,
            ef_construction: 64,
            threads: Some(1),
            ..HnswParams::default()
        },
        initial_capacity: 1024,
        ..PHnswParams::default()
    };
    let idx = PHnsw::create(tmp.path(), dim, Metric::L2, params, PersistMode::Pmem).unwrap();
    // The test's own consolidation, not a writer's.
    assert!(idx.defer_maintenance());
    let data = clustered(n + 2_000, dim, 40, 11);
    let row = |i: usize| &data[i * dim..(i + 1) * dim];
    let ids: Vec<u64> = (0..n as u64).collect();
    idx.insert(1, &ids, &data[..n * dim]).unwrap();
    let dead: Vec<u64> = (0..n as u64).filter(|i| i % 2 == 0).collect();
    idx.delete(2, &dead).unwrap();

    // Each writer round is an insert and a delete of a live label.
    let seq = AtomicU64::new(3);
    let r = rounds_beside(
        2_000,
        |k| {
            let q = seq.fetch_add(2, Ordering::Relaxed);
            idx.insert(q, &[(n + k) as u64], row(n + k)).unwrap();
            idx.delete(q + 1, &[(2 * k + 1) as u64 % n as u64]).unwrap();
        },
        || idx.consolidate().unwrap(),
    );
    assert!(r.out >= dead.len(), "{} unlinked", r.out);
    r.expect_inside(20, "consolidation");
    assert_eq!(idx.check(), Vec::<String>::new());
    let mut missed = Vec::new();
    for label in 0..(n + 2_000) as u64 {
        let Some(v) = idx.get(label).unwrap() else {
            continue;
        };
        let r = idx.search(&v, 1, &SearchParams::with_ef(64), None).unwrap();
        if r.first().map(|x| x.id) != Some(label) {
            missed.push(label);
        }
    }
    let live = idx.len();
    assert!(
        missed.len() * 100 <= live,
        "{} of {live} live labels not at rank 1 of their own vector",
        missed.len()
    );
}

/// A probe, not a check (`cargo test -- --ignored --nocapture`): where a
/// consolidation's writer pause goes at 100K 50-d points on msync, 5 %
/// of the points replaced between consolidations, one writer beside it.
#[test]
#[ignore = "a probe: about a minute"]
fn probe_consolidation_pause_at_100k() {
    use std::sync::atomic::{AtomicU64, Ordering};
    let (n, dim) = (100_000usize, 50);
    let tmp = tempfile::tempdir().unwrap();
    let idx = PHnsw::create(
        tmp.path(),
        dim,
        Metric::L2,
        PHnswParams::default(),
        PersistMode::Msync,
    )
    .unwrap();
    assert!(idx.defer_maintenance());
    let rounds = 4;
    let data = clustered(n * 2, dim, 200, 3);
    let row = |i: usize| &data[i * dim..(i + 1) * dim];
    let ids: Vec<u64> = (0..n as u64).collect();
    idx.insert(1, &ids, &data[..n * dim]).unwrap();
    let seq = AtomicU64::new(2);
    let mut next = n;
    let stat = |name: &str| idx.stats().unwrap().extra_value(name).unwrap_or(0.0);
    for round in 0..rounds {
        let replace = n / 20;
        for j in 0..replace {
            let old = (round * replace + j) as u64 * 7 % n as u64;
            let q = seq.fetch_add(2, Ordering::Relaxed);
            idx.delete(q, &[old]).unwrap();
            idx.insert(q + 1, &[next as u64], row(next)).unwrap();
            next += 1;
        }
        let before = (
            stat("consolidate.relinked"),
            stat("consolidate.paused_micros"),
        );
        let base = next;
        let r = rounds_beside(
            15_000,
            |k| {
                let q = seq.fetch_add(1, Ordering::Relaxed);
                idx.insert(q, &[(base + k) as u64], row(base + k)).unwrap();
            },
            || idx.consolidate().unwrap(),
        );
        next = base + 15_000;
        println!(
            "round {round}: unlinked {}, job {:.0} ms, relinked {}, writers paused {:.1} ms (max so far {:.1} ms), {} writer rounds inside",
            r.out,
            r.job_ms,
            stat("consolidate.relinked") - before.0,
            (stat("consolidate.paused_micros") - before.1) / 1e3,
            stat("consolidate.paused_max_micros") / 1e3,
            r.inside
        );
    }
}
