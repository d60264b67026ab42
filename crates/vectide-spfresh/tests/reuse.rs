//! Vector numbers come back (`reclaim.rs`): under upsert churn with a
//! constant live set, the numbers handed out and the snapshot stay near
//! the live set in every mode, every answer matches a brute-force oracle
//! (a reused number never shows its old vector), readers running beside
//! the reclaim never see a wrong or deleted id, and recovery after a
//! crash keeps the free list and the reused numbers apart.
//!
//! Before the reclaim, 6000 upserts over 1000 live points took 7000
//! numbers and the snapshot went from 26 to 164 KB.

#[path = "../../test-support/oracle.rs"]
mod oracle;

use oracle::{brute_force, clustered, exact_distance, recall};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use vectide_core::{Metric, ParamValue, Params, SearchParams, VectorIndex};
use vectide_spfresh::{Mode, SpannParams, Spfresh, SNAPSHOT};
use vectide_storage::SplitMix as Rng;

const DIM: usize = 16;
const LIVE: u64 = 1000;

fn params() -> SpannParams {
    SpannParams {
        threads: Some(2),
        posting_pages: 1,
        ..SpannParams::default()
    }
}

fn open_params() -> Params {
    let mut p = Params::new();
    p.insert("threads".into(), ParamValue::Int(2));
    p
}

fn sp(nprobe: usize) -> SearchParams {
    SearchParams {
        nprobe: Some(nprobe),
        ..SearchParams::default()
    }
}

fn extra(idx: &dyn VectorIndex, name: &str) -> f64 {
    idx.stats().unwrap().extra_value(name).unwrap_or(0.0)
}

fn snapshot_bytes(dir: &std::path::Path) -> u64 {
    std::fs::metadata(dir.join(SNAPSHOT)).unwrap().len()
}

/// Every answer of a wide search: a live id at its current vector's
/// distance (a record of a reused number read as the new vector would
/// show the old vector's distance), and recall against brute force.
fn check_answers(idx: &dyn VectorIndex, live: &BTreeMap<u64, Vec<f32>>, rng: &mut Rng) -> f64 {
    let pts: Vec<(u64, Vec<f32>)> = live.iter().map(|(k, v)| (*k, v.clone())).collect();
    let (mut found, mut truth) = (Vec::new(), Vec::new());
    for _ in 0..20 {
        let q: Vec<f32> = (0..DIM).map(|_| rng.unit() * 2.0 - 1.0).collect();
        let got = idx.search(&q, 10, &sp(64), None).unwrap();
        for n in &got {
            let v = live
                .get(&n.id)
                .unwrap_or_else(|| panic!("id {} is not live", n.id));
            let d = exact_distance(idx.metric(), &q, v);
            assert!(
                (d - n.distance).abs() <= 1e-3 * d.abs().max(1.0),
                "id {}: distance {} but its vector is at {d}",
                n.id,
                n.distance
            );
        }
        found.push(got.iter().map(|n| n.id).collect());
        truth.push(brute_force(idx.metric(), &pts, &q, 10));
    }
    for id in [0, LIVE / 2, LIVE - 1] {
        assert_eq!(idx.get(id).unwrap().as_ref(), live.get(&id), "get({id})");
    }
    recall(&found, &truth)
}

/// 1000 live points, then 600 batches of 10 upserts of existing ids (new
/// vectors), one batch in ten deleting its ids and inserting them back:
/// 6000 upserts in all. Returns the numbers handed out and the snapshot
/// bytes before and after, and the index.
fn churn(
    mode: Mode,
) -> (
    tempfile::TempDir,
    Spfresh,
    BTreeMap<u64, Vec<f32>>,
    [u64; 4],
) {
    let dir = tempfile::tempdir().unwrap();
    let idx = Spfresh::create(dir.path(), DIM, Metric::L2, mode, params()).unwrap();
    let data = clustered(LIVE as usize, DIM, 20, 3);
    let ids: Vec<u64> = (0..LIVE).collect();
    idx.insert(1, &ids, &data).unwrap();
    let mut live: BTreeMap<u64, Vec<f32>> = ids
        .iter()
        .map(|&i| (i, data[i as usize * DIM..(i as usize + 1) * DIM].to_vec()))
        .collect();
    idx.snapshot().unwrap();
    let (vids0, snap0) = (
        idx.stats().unwrap().slots_used as u64,
        snapshot_bytes(dir.path()),
    );
    let mut rng = Rng(99 + mode.engine().len() as u64);
    let mut seq = 2;
    let mut worst = 1.0f64;
    for round in 0..600 {
        let mut batch = HashSet::new();
        while batch.len() < 10 {
            batch.insert(rng.next_u64() % LIVE);
        }
        let batch: Vec<u64> = batch.into_iter().collect();
        if round % 10 == 9 {
            idx.delete(seq, &batch).unwrap();
            seq += 1;
            for id in &batch {
                live.remove(id);
            }
        }
        let mut vecs = Vec::new();
        for &id in &batch {
            // Near the old vector: the clusters drift a little.
            let v: Vec<f32> = match live.get(&id) {
                Some(old) => old.iter().map(|x| x + 0.05 * (rng.unit() - 0.5)).collect(),
                None => data[id as usize * DIM..(id as usize + 1) * DIM].to_vec(),
            };
            vecs.extend_from_slice(&v);
            live.insert(id, v);
        }
        idx.insert(seq, &batch, &vecs).unwrap();
        seq += 1;
        if round % 50 == 49 {
            worst = worst.min(check_answers(&idx, &live, &mut rng));
        }
    }
    idx.drain_jobs().unwrap();
    idx.snapshot().unwrap();
    let problems = idx.check_structure().unwrap();
    assert!(problems.is_empty(), "{mode:?}: {problems:#?}");
    worst = worst.min(check_answers(&idx, &live, &mut rng));
    assert!(worst >= 0.8, "{mode:?}: recall {worst}");
    let figs = [
        vids0,
        idx.stats().unwrap().slots_used as u64,
        snap0,
        snapshot_bytes(dir.path()),
    ];
    (dir, idx, live, figs)
}

fn report(mode: Mode, idx: &Spfresh, figs: [u64; 4]) {
    println!(
        "{mode:?}: vids {} -> {} for {LIVE} live; snapshot {} -> {} bytes",
        figs[0], figs[1], figs[2], figs[3]
    );
    for k in [
        "reclaims",
        "reclaimed_vids",
        "vids_reused",
        "vids_free",
        "reclaim_postings_rewritten",
        "reclaim_bytes_written",
        "reclaim_seconds",
        "postings",
        "blocks_used",
    ] {
        println!("  {k} = {}", extra(idx, k));
    }
}

/// Old code: 7000 numbers and a snapshot 6.3x its start in every mode.
/// The reclaim runs on the index's background threads, so how far the
/// numbers run ahead of it depends on how busy the machine is: 1,390 to
/// 1,620 on an idle 2-core machine, 2,120 once while the whole test suite
/// ran beside it. The bound (2.5 times the live set) holds both and is a
/// third of what the old code took.
#[test]
fn upsert_churn_keeps_vector_numbers_and_snapshots_near_the_live_set() {
    for mode in [Mode::Fresh, Mode::Static, Mode::Inplace] {
        let (_dir, idx, _live, figs) = churn(mode);
        report(mode, &idx, figs);
        assert!(
            figs[1] <= 5 * LIVE / 2,
            "{mode:?}: {} vector numbers for {LIVE} live",
            figs[1]
        );
        assert!(
            figs[3] <= figs[2] * 5 / 2,
            "{mode:?}: snapshot {} -> {} bytes",
            figs[2],
            figs[3]
        );
        assert!(extra(&idx, "reclaims") >= 1.0 && extra(&idx, "vids_reused") > 0.0);
    }
}

/// After churn with numbers freed and reused, a snapshot holding the
/// free list and a WAL of inserts that reuse numbers, a crash (the index
/// dropped unclosed) and a reopen: the same live set, answers that match
/// the oracle, and no record of a free number.
#[test]
fn recovery_keeps_free_and_reused_numbers_apart() {
    for mode in [Mode::Fresh, Mode::Inplace] {
        let (dir, idx, mut live, _) = churn(mode);
        let mut rng = Rng(5);
        // More churn after the last snapshot: its inserts take freed
        // numbers and are in the WAL only.
        let mut seq = 10_000;
        for _ in 0..60 {
            let id = rng.next_u64() % LIVE;
            let v: Vec<f32> = (0..DIM).map(|_| rng.unit()).collect();
            idx.insert(seq, &[id], &v).unwrap();
            live.insert(id, v);
            seq += 1;
        }
        let gone = rng.next_u64() % LIVE;
        idx.delete(seq, &[gone]).unwrap();
        live.remove(&gone);
        drop(idx);
        // `vectide inspect`'s rows: the version the file holds and the
        // free numbers in it.
        let rows: BTreeMap<String, String> = vectide_spfresh::inspect_rows(dir.path())
            .unwrap()
            .into_iter()
            .collect();
        assert!(rows["snapshot"].starts_with("version 3 "), "{rows:?}");
        assert!(rows["vectors"].contains("free for reuse"), "{rows:?}");
        println!(
            "{mode:?}: inspect: {} / {}",
            rows["snapshot"], rows["vectors"]
        );
        let idx = Spfresh::open(dir.path(), &open_params()).unwrap();
        assert_eq!(idx.len(), live.len());
        let problems = idx.check_structure().unwrap();
        assert!(problems.is_empty(), "{mode:?}: {problems:#?}");
        let r = check_answers(&idx, &live, &mut rng);
        assert!(r >= 0.8, "{mode:?}: recall {r} after recovery");
        for (id, v) in live.iter().step_by(37) {
            assert_eq!(idx.get(*id).unwrap().as_ref(), Some(v), "get({id})");
        }
        assert_eq!(idx.get(gone).unwrap(), None);
        idx.close().unwrap();
    }
}

/// Readers beside a writer that deletes old ids and inserts new ones
/// (each id holds one vector ever, so an answer is checkable while writes
/// go on), reclaims running in the background: no answer names an id
/// whose delete was acknowledged before the search began, or an id never
/// written, and every distance is its id's vector's.
#[test]
fn readers_beside_the_reclaim_never_see_a_wrong_or_deleted_id() {
    for mode in [Mode::Fresh, Mode::Inplace] {
        let dir = tempfile::tempdir().unwrap();
        let idx = Arc::new(Spfresh::create(dir.path(), DIM, Metric::L2, mode, params()).unwrap());
        let n0 = 600u64;
        let data = clustered(n0 as usize, DIM, 12, 9);
        let ids: Vec<u64> = (0..n0).collect();
        idx.insert(1, &ids, &data).unwrap();
        let vectors: Arc<Mutex<HashMap<u64, Vec<f32>>>> = Arc::new(Mutex::new(
            ids.iter()
                .map(|&i| (i, data[i as usize * DIM..(i as usize + 1) * DIM].to_vec()))
                .collect(),
        ));
        // Ids whose delete was acknowledged, in order; `acked` of them.
        let deleted: Arc<Mutex<Vec<u64>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let answers = Arc::new(AtomicU64::new(0));
        std::thread::scope(|s| {
            for r in 0..2u64 {
                let (idx, vectors, deleted, stop, answers) = (
                    idx.clone(),
                    vectors.clone(),
                    deleted.clone(),
                    stop.clone(),
                    answers.clone(),
                );
                s.spawn(move || {
                    let mut rng = Rng(r + 1);
                    while !stop.load(Ordering::Acquire) {
                        let gone: HashSet<u64> = deleted.lock().unwrap().iter().copied().collect();
                        let q: Vec<f32> = (0..DIM).map(|_| rng.unit() * 2.0 - 1.0).collect();
                        let got = idx.search(&q, 10, &sp(32), None).unwrap();
                        let vs = vectors.lock().unwrap();
                        for n in got {
                            assert!(!gone.contains(&n.id), "deleted id {} returned", n.id);
                            let v = vs
                                .get(&n.id)
                                .unwrap_or_else(|| panic!("id {} never written", n.id));
                            let d = exact_distance(Metric::L2, &q, v);
                            assert!(
                                (d - n.distance).abs() <= 1e-3 * d.max(1.0),
                                "id {}: distance {} but its vector is at {d}",
                                n.id,
                                n.distance
                            );
                            answers.fetch_add(1, Ordering::Relaxed);
                        }
                        drop(vs);
                        let probe = rng.next_u64() % (n0 + 4000);
                        let v = idx.get(probe).unwrap();
                        if let Some(v) = v {
                            assert_eq!(vectors.lock().unwrap().get(&probe), Some(&v));
                        }
                    }
                });
            }
            let mut rng = Rng(77);
            // Step i inserts id n0 + i and deletes id i.
            for i in 0..4000u64 {
                let (next, oldest, seq) = (n0 + i, i, 2 + 2 * i);
                let v: Vec<f32> = (0..DIM).map(|_| rng.unit() * 2.0 - 1.0).collect();
                vectors.lock().unwrap().insert(next, v.clone());
                idx.insert(seq, &[next], &v).unwrap();
                idx.delete(seq + 1, &[oldest]).unwrap();
                deleted.lock().unwrap().push(oldest);
            }
            stop.store(true, Ordering::Release);
        });
        idx.drain_jobs().unwrap();
        let st = idx.stats().unwrap();
        println!(
            "{mode:?}: {} answers checked; vids {} for {} live; reclaims {}",
            answers.load(Ordering::Relaxed),
            st.slots_used,
            st.live,
            extra(&*idx, "reclaims")
        );
        assert!(answers.load(Ordering::Relaxed) > 100);
        assert!(extra(&*idx, "reclaims") >= 2.0, "{mode:?}: reclaims ran");
        assert!(
            st.slots_used <= 2 * 600 + 100,
            "{mode:?}: {}",
            st.slots_used
        );
        let problems = idx.check_structure().unwrap();
        assert!(problems.is_empty(), "{mode:?}: {problems:#?}");
    }
}
