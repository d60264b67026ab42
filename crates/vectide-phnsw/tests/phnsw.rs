//! P-HNSW integration tests: recall, reopen, upserts, deletes, bad regions.

#[path = "../../test-support/oracle.rs"]
mod common;
#[path = "../../test-support/poison.rs"]
mod poison;

use common::{brute_force, clustered, recall};
use std::sync::Arc;
use vectide_core::{Error, Metric, SearchParams, VectorIndex};
use vectide_graph::HnswParams;
use vectide_phnsw::{PHnsw, PHnswParams};
use vectide_storage::{Media, PersistMode, SimConfig, SimMedia};

fn params(m: usize) -> PHnswParams {
    PHnswParams {
        hnsw: HnswParams {
            m,
            ef_construction: 100,
            ..HnswParams::default()
        },
        initial_capacity: 64,
        ..PHnswParams::default()
    }
}

fn rows(data: &[f32], dim: usize) -> Vec<(u64, Vec<f32>)> {
    data.chunks(dim)
        .enumerate()
        .map(|(i, v)| (i as u64, v.to_vec()))
        .collect()
}

fn recall_of(
    idx: &PHnsw,
    points: &[(u64, Vec<f32>)],
    queries: &[f32],
    dim: usize,
    metric: Metric,
) -> f64 {
    let mut found = Vec::new();
    let mut truth = Vec::new();
    for q in queries.chunks(dim) {
        let r = idx
            .search(q, 10, &SearchParams::with_ef(200), None)
            .unwrap();
        found.push(r.iter().map(|n| n.id).collect::<Vec<_>>());
        truth.push(brute_force(metric, points, q, 10));
    }
    recall(&found, &truth)
}

#[test]
fn builds_searches_and_reopens_with_the_same_answers() {
    let dir = tempfile::tempdir().unwrap();
    let dim = 16;
    let data = clustered(3000, dim, 20, 1);
    let queries = clustered(100, dim, 20, 2);
    let idx = PHnsw::create(
        dir.path(),
        dim,
        Metric::Cosine,
        params(12),
        PersistMode::Pmem,
    )
    .unwrap();
    let ids: Vec<u64> = (0..3000).collect();
    idx.insert(1, &ids, &data).unwrap();
    assert_eq!(idx.len(), 3000);
    assert!(idx.check().is_empty(), "{:?}", idx.check());
    let points = rows(&data, dim);
    let r = recall_of(&idx, &points, &queries, dim, Metric::Cosine);
    assert!(r >= 0.95, "recall {r}");
    assert_eq!(idx.durable_seq(), 1);
    let before: Vec<_> = queries
        .chunks(dim)
        .map(|q| idx.search(q, 10, &SearchParams::default(), None).unwrap())
        .collect();
    let grown = idx.stats().unwrap().capacity;
    assert!(grown >= 3000, "the node file grew from 64 slots");
    drop(idx);
    let idx = PHnsw::open(dir.path(), PersistMode::Pmem, None).unwrap();
    assert_eq!(idx.recovery_report().discarded, 0);
    assert_eq!(idx.len(), 3000);
    assert_eq!(idx.durable_seq(), 1);
    let after: Vec<_> = queries
        .chunks(dim)
        .map(|q| idx.search(q, 10, &SearchParams::default(), None).unwrap())
        .collect();
    assert_eq!(before, after);
    assert!(idx.contains(17).unwrap() && !idx.contains(3000).unwrap());
    let v = idx.get(17).unwrap().unwrap();
    let n = data[17 * dim..18 * dim]
        .iter()
        .map(|x| x * x)
        .sum::<f32>()
        .sqrt();
    assert!(
        (v[0] - data[17 * dim] / n).abs() < 1e-6,
        "cosine vectors are stored normalised"
    );
}

#[test]
fn upserts_deletes_and_replay_are_exact() {
    let dir = tempfile::tempdir().unwrap();
    let dim = 8;
    let data = clustered(600, dim, 6, 3);
    let idx = PHnsw::create(dir.path(), dim, Metric::L2, params(8), PersistMode::Msync).unwrap();
    let ids: Vec<u64> = (0..600).collect();
    idx.insert(1, &ids, &data).unwrap();
    // Upsert 0..100 with new vectors.
    let newer = clustered(100, dim, 6, 4);
    idx.insert(2, &ids[..100], &newer).unwrap();
    assert_eq!(idx.len(), 600);
    for i in 0..100 {
        assert_eq!(
            idx.get(i).unwrap().unwrap(),
            newer[i as usize * dim..(i as usize + 1) * dim].to_vec()
        );
        let r = idx
            .search(
                &newer[i as usize * dim..(i as usize + 1) * dim],
                1,
                &SearchParams::with_ef(64),
                None,
            )
            .unwrap();
        assert_eq!(r[0].id, i);
    }
    // A replay of the older insert changes nothing.
    idx.insert(1, &ids[..100], &data[..100 * dim]).unwrap();
    assert_eq!(
        idx.get(5).unwrap().unwrap(),
        newer[5 * dim..6 * dim].to_vec()
    );
    // Deletes: absent ids ignored, an old delete does not undo a newer write.
    assert_eq!(idx.delete(3, &[1, 2, 3, 9999]).unwrap(), 3);
    assert_eq!(
        idx.delete(1, &[4]).unwrap(),
        0,
        "seq 1 is older than the upsert (seq 2)"
    );
    assert_eq!(idx.len(), 597);
    assert!(!idx.contains(2).unwrap());
    let r = idx
        .search(
            &newer[2 * dim..3 * dim],
            10,
            &SearchParams::with_ef(64),
            None,
        )
        .unwrap();
    assert!(r.iter().all(|n| n.id != 2));
    let filter = |id: u64| id.is_multiple_of(2);
    let r = idx
        .search(
            &data[300 * dim..301 * dim],
            10,
            &SearchParams::with_ef(64),
            Some(&filter),
        )
        .unwrap();
    assert!(r.len() == 10 && r.iter().all(|n| n.id.is_multiple_of(2)));
    assert!(idx.check().is_empty(), "{:?}", idx.check());
    assert_eq!(idx.durable_seq(), 3);
    drop(idx);
    let idx = PHnsw::open(dir.path(), PersistMode::Msync, None).unwrap();
    assert_eq!(idx.len(), 597);
    assert!(!idx.contains(1).unwrap() && idx.contains(4).unwrap());
    assert!(idx.check().is_empty());
}

#[test]
fn many_labels_rebuild_the_map_and_parallel_inserts_agree() {
    let dir = tempfile::tempdir().unwrap();
    let dim = 8;
    let n = 5000;
    let data = clustered(n, dim, 30, 5);
    let mut p = params(8);
    p.hnsw.threads = Some(2);
    let idx = PHnsw::create(dir.path(), dim, Metric::L2, p, PersistMode::Pmem).unwrap();
    // Sparse labels, several batches: the label map starts at 1024 buckets.
    let ids: Vec<u64> = (0..n as u64).map(|i| i * 7919 + 3).collect();
    for (b, chunk) in ids.chunks(1000).enumerate() {
        let start = b * 1000;
        idx.insert(
            b as u64 + 1,
            chunk,
            &data[start * dim..(start + chunk.len()) * dim],
        )
        .unwrap();
    }
    assert_eq!(idx.len(), n);
    assert!(idx.check().is_empty(), "{:?}", idx.check());
    for (i, &id) in ids.iter().enumerate().step_by(97) {
        assert_eq!(
            idx.get(id).unwrap().unwrap(),
            data[i * dim..(i + 1) * dim].to_vec()
        );
    }
    let files: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|f| f.starts_with("labels-"))
        .collect();
    assert_eq!(files.len(), 1, "old label tables are removed: {files:?}");
    assert_ne!(files[0], "labels-0.vtdp", "the map was rebuilt");
}

#[test]
fn bad_input_and_bad_regions_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let idx = PHnsw::create(dir.path(), 4, Metric::Cosine, params(4), PersistMode::Pmem).unwrap();
    assert!(
        matches!(idx.insert(1, &[1], &[0.0; 4]), Err(Error::InvalidInput(_))),
        "zero vector under cosine"
    );
    assert!(matches!(
        idx.insert(1, &[1], &[1.0; 3]),
        Err(Error::DimensionMismatch { .. }) | Err(Error::InvalidInput(_))
    ));
    assert!(idx.insert(1, &[u64::MAX], &[1.0; 4]).is_err());
    assert!(idx.insert(1, &[1], &[f32::NAN, 1.0, 1.0, 1.0]).is_err());
    assert!(idx
        .search(&[1.0; 4], 0, &SearchParams::default(), None)
        .is_err());
    assert_eq!(idx.len(), 0);
    idx.insert(1, &[1, 2], &[1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0])
        .unwrap();
    drop(idx);
    assert!(
        PHnsw::create(dir.path(), 4, Metric::Cosine, params(4), PersistMode::Pmem).is_err(),
        "no overwrite"
    );

    let meta = dir.path().join("meta.vtdp");
    let good = std::fs::read(&meta).unwrap();
    let reopen = || PHnsw::open(dir.path(), PersistMode::Pmem, None);
    let mut bad = good.clone();
    bad[0] = b'Z';
    std::fs::write(&meta, &bad).unwrap();
    assert!(matches!(reopen(), Err(Error::Corrupted(m)) if m.contains("magic")));
    let mut bad = good.clone();
    bad[8] = 1; // version 1 (no node checksums) is refused
    std::fs::write(&meta, &bad).unwrap();
    assert!(matches!(reopen(), Err(Error::Version { found: 1, .. })));
    let mut bad = good.clone();
    bad[16] = 5; // dimension changed, checksum not: a torn header
    std::fs::write(&meta, &bad).unwrap();
    assert!(matches!(reopen(), Err(Error::Corrupted(m)) if m.contains("checksum")));
    std::fs::write(&meta, &good[..1000]).unwrap();
    assert!(matches!(reopen(), Err(Error::Corrupted(_))));
    // Nothing was overwritten by the failed opens.
    std::fs::write(&meta, &good).unwrap();
    let idx = reopen().unwrap();
    assert_eq!(idx.len(), 2);
    drop(idx);
    let nodes = dir.path().join("nodes.vtdp");
    let mut n = std::fs::read(&nodes).unwrap();
    n[16] ^= 0xff;
    std::fs::write(&nodes, &n).unwrap();
    assert!(matches!(reopen(), Err(Error::Corrupted(_))));
    assert!(PHnsw::open(&dir.path().join("nope"), PersistMode::Pmem, None).is_err());
}

#[test]
fn persists_and_fences_per_insert_are_counted() {
    let dir = tempfile::tempdir().unwrap();
    let sim = Arc::new(SimMedia::new(SimConfig::default()));
    let media: Arc<dyn Media> = sim.clone();
    let dim = 8;
    let data = clustered(400, dim, 5, 9);
    let idx = PHnsw::create_on(dir.path(), dim, Metric::L2, params(8), media).unwrap();
    let ids: Vec<u64> = (0..300).collect();
    idx.insert(1, &ids, &data[..300 * dim]).unwrap();
    let before = sim.report();
    let n = 100u64;
    for i in 0..n {
        let r = 300 + i as usize;
        idx.insert(2 + i, &[r as u64], &data[r * dim..(r + 1) * dim])
            .unwrap();
    }
    let after = sim.report();
    let fences = (after.fences - before.fences) as f64 / n as f64;
    let persists = (after.persists - before.persists) as f64 / n as f64;
    let lines = (after.persisted_lines - before.persisted_lines) as f64 / n as f64;
    println!("per insert: {fences:.1} fences, {persists:.1} persists, {lines:.1} lines");
    // log, out-edges (N_COMPLETE rides with the next fence), 4 per batch of
    // in-edges (one batch here), publication, NONE + durable sequence number.
    assert!((8.0..=12.0).contains(&fences), "{fences} fences per insert");
    assert!(persists > fences);
}

/// An insert whose NLog entry is written but whose publication fails
/// poisons the index; the reopen's recovery redoes it from the NLog.
#[test]
fn a_failed_publication_poisons_until_recovery_redoes_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ix");
    let data = clustered(300, 8, 4, 2);
    poison::a_failed_apply_poisons_until_the_reopen(
        dir.path(),
        vectide_phnsw::APPLY_FAULT,
        8,
        &data,
        200,
        || Box::new(PHnsw::create(&path, 8, Metric::L2, params(8), PersistMode::Pmem).unwrap()),
        || Box::new(PHnsw::open(&path, PersistMode::Pmem, Some(1)).unwrap()),
    );
}

/// A batch whose first row fails to publish leaves its later rows unlogged:
/// the batch's number must not become durable, so that a database replays
/// the whole batch after the reopen.
#[test]
fn a_poisoned_batch_keeps_its_number_out_of_the_durable_word() {
    use vectide_core::fault::{install_faults, Faults};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ix");
    let data = clustered(40, 8, 4, 3);
    let idx = PHnsw::create(&path, 8, Metric::L2, params(8), PersistMode::Pmem).unwrap();
    let ids: Vec<u64> = (0..30).collect();
    idx.insert(1, &ids, &data[..30 * 8]).unwrap();
    assert_eq!(idx.durable_seq(), 1);
    let plan = Faults::new();
    let _g = install_faults(dir.path(), plan.clone());
    plan.arm(vectide_phnsw::APPLY_FAULT, 1);
    let e = idx
        .insert(2, &[30, 31, 32], &data[30 * 8..33 * 8])
        .unwrap_err();
    assert!(matches!(e, Error::Poisoned(_)), "{e}");
    assert_eq!(
        idx.durable_seq(),
        1,
        "a partly applied batch became durable"
    );
    drop(idx);
    let idx = PHnsw::open(&path, PersistMode::Pmem, Some(1)).unwrap();
    assert!(idx.durable_seq() < 2);
    // Recovery redid the logged row; a replay of the batch adds the rest.
    idx.insert(2, &[30, 31, 32], &data[30 * 8..33 * 8]).unwrap();
    assert_eq!(idx.len(), 33);
}

#[test]
fn the_exact_scan_answers_as_a_brute_force_over_the_live_nodes() {
    let dir = tempfile::tempdir().unwrap();
    let idx = PHnsw::create(dir.path(), 12, Metric::L2, params(8), PersistMode::Pmem).unwrap();
    common::check_exact_scan_under_churn(&idx, 12);
}
