//! The SPANN-family engines end to end: build, search against a
//! brute-force oracle, updates, LIRE's jobs, snapshots and recovery.

#[path = "../../test-support/oracle.rs"]
mod oracle;

use oracle::{brute_force, clustered, recall};
use std::collections::BTreeMap;
use vectide_core::{Metric, ParamValue, Params, SearchParams, VectorIndex};
use vectide_spfresh::{Mode, SpannParams, Spfresh};

const DIM: usize = 16;

fn params(inline: bool) -> SpannParams {
    SpannParams {
        rebuild_inline: inline,
        threads: Some(2),
        // Small postings so that a few thousand points split and merge.
        posting_pages: 1,
        ..SpannParams::default()
    }
}

fn open_params(inline: bool) -> Params {
    let mut p = Params::new();
    p.insert("threads".into(), ParamValue::Int(2));
    if inline {
        p.insert("rebuild".into(), ParamValue::Str("inline".into()));
    }
    p
}

fn live_recall(
    idx: &dyn VectorIndex,
    live: &BTreeMap<u64, Vec<f32>>,
    queries: &[f32],
    nprobe: usize,
) -> f64 {
    let pts: Vec<(u64, Vec<f32>)> = live.iter().map(|(k, v)| (*k, v.clone())).collect();
    let sp = SearchParams {
        nprobe: Some(nprobe),
        ..SearchParams::default()
    };
    let mut found = Vec::new();
    let mut truth = Vec::new();
    for q in queries.chunks(DIM) {
        found.push(
            idx.search(q, 10, &sp, None)
                .unwrap()
                .iter()
                .map(|n| n.id)
                .collect(),
        );
        truth.push(brute_force(idx.metric(), &pts, q, 10));
    }
    recall(&found, &truth)
}

fn assert_sound(idx: &Spfresh) {
    let problems = idx.check_structure().unwrap();
    assert!(problems.is_empty(), "{problems:#?}");
}

/// A churn workload: build on 3000, then rounds deleting the oldest 400
/// and inserting 400 new points from shifted clusters.
fn churn(mode: Mode, inline: bool) -> (tempfile::TempDir, Spfresh, BTreeMap<u64, Vec<f32>>) {
    let dir = tempfile::tempdir().unwrap();
    let idx = Spfresh::create(dir.path(), DIM, Metric::L2, mode, params(inline)).unwrap();
    let data = clustered(6000, DIM, 24, 7);
    let mut live = BTreeMap::new();
    let ids: Vec<u64> = (0..3000).collect();
    idx.insert(1, &ids, &data[..3000 * DIM]).unwrap();
    for &i in &ids {
        live.insert(i, data[i as usize * DIM..(i as usize + 1) * DIM].to_vec());
    }
    let mut seq = 2;
    for round in 0..7u64 {
        let del: Vec<u64> = (round * 400..(round + 1) * 400).collect();
        assert_eq!(idx.delete(seq, &del).unwrap(), 400);
        seq += 1;
        for d in &del {
            live.remove(d);
        }
        let new: Vec<u64> = (3000 + round * 400..3000 + (round + 1) * 400).collect();
        let rows: Vec<f32> = new
            .iter()
            .flat_map(|&i| data[i as usize * DIM..(i as usize + 1) * DIM].to_vec())
            .collect();
        // Inserted in small batches, as a stream would.
        for (c, r) in new.chunks(50).zip(rows.chunks(50 * DIM)) {
            idx.insert(seq, c, r).unwrap();
            seq += 1;
        }
        for (k, &i) in new.iter().enumerate() {
            live.insert(i, rows[k * DIM..(k + 1) * DIM].to_vec());
        }
    }
    idx.drain_jobs().unwrap();
    (dir, idx, live)
}

#[test]
fn spfresh_splits_merges_reassigns_and_keeps_recall() {
    let (dir, idx, live) = churn(Mode::Fresh, true);
    assert_eq!(idx.len(), live.len());
    assert_sound(&idx);
    let st = idx.stats().unwrap();
    let x = |k: &str| st.extra.iter().find(|(n, _)| n == k).unwrap().1;
    assert!(
        x("splits") > 0.0,
        "no split in 2800 inserts: {:?}",
        st.extra
    );
    assert!(x("reassign_evaluated") >= x("reassign_moved"));
    assert!(x("reassign_moved") > 0.0, "{:?}", st.extra);
    assert!(
        x("posting_records_max") <= idx.posting_limit() as f64 + 50.0,
        "{:?}",
        st.extra
    );
    let queries = clustered(100, DIM, 24, 99);
    let r = live_recall(&idx, &live, &queries, 64);
    assert!(r >= 0.9, "recall {r}");
    for id in [2800u64, 5799] {
        let v = idx.get(id).unwrap().unwrap();
        assert_eq!(&v, live.get(&id).unwrap());
    }
    assert!(idx.get(0).unwrap().is_none() && !idx.contains(0).unwrap());
    // Reopen without a snapshot at close: the WAL is replayed.
    let before: Vec<_> = queries
        .chunks(DIM)
        .take(5)
        .map(|q| idx.search(q, 10, &SearchParams::default(), None).unwrap())
        .collect();
    let durable = idx.durable_seq();
    drop(idx);
    let idx = Spfresh::open(dir.path(), &open_params(true)).unwrap();
    assert_eq!(idx.len(), live.len());
    assert_eq!(idx.durable_seq(), durable);
    assert_sound(&idx);
    let r2 = live_recall(&idx, &live, &queries, 64);
    assert!(r2 >= 0.9, "recall after replay {r2}");
    // Close (a snapshot), reopen: the same answers.
    idx.close().unwrap();
    let after_close: Vec<_> = queries
        .chunks(DIM)
        .take(5)
        .map(|q| idx.search(q, 10, &SearchParams::default(), None).unwrap())
        .collect();
    drop(idx);
    let idx = Spfresh::open(dir.path(), &open_params(true)).unwrap();
    for (i, q) in queries.chunks(DIM).take(5).enumerate() {
        let got = idx.search(q, 10, &SearchParams::default(), None).unwrap();
        assert_eq!(got, after_close[i]);
        let ids: Vec<u64> = got.iter().map(|n| n.id).collect();
        let was: Vec<u64> = before[i].iter().map(|n| n.id).collect();
        let common = ids.iter().filter(|x| was.contains(x)).count();
        assert!(common >= 8, "query {i}: {ids:?} vs {was:?}");
    }
    assert_sound(&idx);
}

#[test]
fn inplace_never_rebalances_and_static_rebuilds_on_maintain() {
    let (_d, inplace, live) = churn(Mode::Inplace, true);
    assert_sound(&inplace);
    let st = inplace.stats().unwrap();
    let x = |k: &str| st.extra.iter().find(|(n, _)| n == k).unwrap().1;
    assert_eq!(x("splits"), 0.0);
    assert_eq!(x("merges"), 0.0);
    assert_eq!(x("reassign_moved"), 0.0);
    assert!(
        x("posting_records_max") > inplace.posting_limit() as f64,
        "{:?}",
        st.extra
    );
    let queries = clustered(100, DIM, 24, 99);
    let r_inplace = live_recall(&inplace, &live, &queries, 8);

    let (_d2, spann, live2) = churn(Mode::Static, true);
    assert_eq!(live, live2);
    let before = spann.stats().unwrap();
    spann.maintain().unwrap();
    assert_sound(&spann);
    let after = spann.stats().unwrap();
    let max = |s: &vectide_core::IndexStats| {
        s.extra
            .iter()
            .find(|(n, _)| n == "posting_records_max")
            .unwrap()
            .1
    };
    assert!(
        max(&after) < max(&before),
        "the rebuild cut postings: {} -> {}",
        max(&before),
        max(&after)
    );
    assert!(max(&after) <= spann.posting_limit() as f64 + 10.0);
    let r_static = live_recall(&spann, &live2, &queries, 8);
    eprintln!("recall at nprobe 8: spann-inplace {r_inplace:.3}, spann rebuilt {r_static:.3}");
    assert!(r_static >= 0.8, "static recall {r_static}");
    // Both answer every live point of the data at a generous nprobe.
    assert!(live_recall(&inplace, &live, &queries, 64) >= 0.9);
    let _ = r_inplace;
}

#[test]
fn background_rebuilder_and_recovery_after_a_drop() {
    let (dir, idx, live) = churn(Mode::Fresh, false);
    assert_sound(&idx);
    drop(idx);
    let idx = Spfresh::open(dir.path(), &open_params(false)).unwrap();
    idx.drain_jobs().unwrap();
    assert_eq!(idx.len(), live.len());
    assert_sound(&idx);
    assert!(idx.last_job_error().is_none(), "{:?}", idx.last_job_error());
}

#[test]
fn bad_input_is_an_error_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let idx = Spfresh::create(dir.path(), DIM, Metric::Cosine, Mode::Fresh, params(true)).unwrap();
    let data = clustered(200, DIM, 4, 1);
    let ids: Vec<u64> = (0..200).collect();
    idx.insert(1, &ids, &data).unwrap();
    assert!(idx.insert(2, &[1000], &[0.0; DIM - 1]).is_err());
    assert!(
        idx.insert(2, &[1000], &[0.0; DIM]).is_err(),
        "zero vector under cosine"
    );
    assert!(
        idx.insert(2, &[1, 1], &data[..2 * DIM]).is_err(),
        "duplicate ids"
    );
    let mut nan = data[..DIM].to_vec();
    nan[3] = f32::NAN;
    assert!(idx.insert(2, &[1000], &nan).is_err());
    assert!(idx
        .search(&[1.0; 3], 10, &SearchParams::default(), None)
        .is_err());
    let sp = SearchParams {
        nprobe: Some(0),
        ..SearchParams::default()
    };
    assert!(idx.search(&data[..DIM], 10, &sp, None).is_err());
    assert_eq!(idx.len(), 200);
    assert_sound(&idx);
    // An index is not created twice, and a dimension past the block
    // store's bound is refused.
    assert!(Spfresh::create(dir.path(), DIM, Metric::L2, Mode::Fresh, params(true)).is_err());
    let d2 = tempfile::tempdir().unwrap();
    assert!(Spfresh::create(d2.path(), 0, Metric::L2, Mode::Fresh, params(true)).is_err());
    // Filtered search returns only what the filter allows.
    let f = |id: u64| id.is_multiple_of(2);
    let got = idx
        .search(&data[..DIM], 10, &SearchParams::default(), Some(&f))
        .unwrap();
    assert!(!got.is_empty() && got.iter().all(|n| n.id % 2 == 0));
    // Upsert: the id keeps one live vector, the new one.
    let newv = data[100 * DIM..101 * DIM].to_vec();
    idx.insert(3, &[0], &newv).unwrap();
    assert_eq!(idx.len(), 200);
    let got = idx
        .search(&newv, 2, &SearchParams::default(), None)
        .unwrap();
    assert!(got.iter().any(|n| n.id == 0), "{got:?}");
    // A replayed older insert is ignored.
    idx.insert(2, &[0], &data[..DIM]).unwrap();
    let v = idx.get(0).unwrap().unwrap();
    let norm: f32 = newv.iter().map(|x| x * x).sum::<f32>().sqrt();
    assert!((v[0] - newv[0] / norm).abs() < 1e-5);
    assert_sound(&idx);
}
