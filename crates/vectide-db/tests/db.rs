//! Database integration tests: collections, ids, payloads, filters, the
//! commit path, recovery, checkpoints, locking and bad input.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;
use vectide_core::{Metric, SearchParams};
use vectide_db::{
    CollectionConfig, Database, DbError, Durability, ExtId, Filter, IndexKind, Options, PointInput,
};
use vectide_engines::{ParamValue, Params};

fn cfg(dim: usize, engine: &str) -> CollectionConfig {
    let mut params = Params::new();
    params.insert("m".into(), ParamValue::Int(8));
    params.insert("ef_construction".into(), ParamValue::Int(64));
    CollectionConfig {
        dim,
        metric: Metric::L2,
        engine: engine.into(),
        params,
        ..Default::default()
    }
}

fn points(n: usize, dim: usize, seed: u64) -> Vec<PointInput> {
    let mut rng = StdRng::seed_from_u64(seed);
    let cities = ["Berlin", "Paris", "Rome", "Oslo"];
    (0..n)
        .map(|i| PointInput {
            id: ExtId::Num(i as u64),
            vector: (0..dim).map(|_| rng.gen_range(-1.0..1.0)).collect(),
            payload: json!({"city": cities[i % 4], "year": 1990 + (i % 30) as i64, "pct": i % 100}),
        })
        .collect()
}

fn opts() -> Options {
    Options {
        checkpoint_interval: Duration::from_secs(3600),
        ..Options::default()
    }
}

#[test]
fn collections_round_trip_through_crash_replay_and_checkpoint() {
    for engine in ["hnsw", "p-hnsw", "hnsw-wal"] {
        let dir = tempfile::tempdir().unwrap();
        let db = Database::open(dir.path(), opts()).unwrap();
        let c = db.create_collection("docs", cfg(8, engine)).unwrap();
        assert!(matches!(
            db.create_collection("docs", cfg(8, engine)),
            Err(DbError::CollectionExists(_))
        ));
        let pts = points(500, 8, 1);
        c.upsert(&pts).unwrap();
        let uuid = ExtId::from_str_key("5c56c793-69f3-4fbf-87e6-c4bf54c28c26").unwrap();
        let key = ExtId::Str("doc-a".into());
        c.upsert(&[
            PointInput {
                id: uuid.clone(),
                vector: vec![0.5; 8],
                payload: json!({"city": "Lima"}),
            },
            PointInput {
                id: key.clone(),
                vector: vec![-0.5; 8],
                payload: Value::Null,
            },
        ])
        .unwrap();
        assert_eq!(c.len(), 502);
        let hits = c
            .search(
                &pts[7].vector,
                3,
                &SearchParams::default(),
                None,
                true,
                false,
            )
            .unwrap();
        assert_eq!(hits[0].id, ExtId::Num(7));
        assert_eq!(hits[0].payload.as_ref().unwrap()["city"], "Oslo");
        // Delete by filter and by id; set payload.
        let paris = Filter::parse(&json!({"must": [{"key": "city", "match": {"value": "Paris"}}]}))
            .unwrap();
        assert_eq!(c.count(Some(&paris)), 125);
        assert_eq!(c.delete(None, Some(&paris)).unwrap(), 125);
        assert_eq!(
            c.delete(Some(&[ExtId::Num(0), ExtId::Num(99_999)]), None)
                .unwrap(),
            1
        );
        assert_eq!(
            c.set_payload(Some(std::slice::from_ref(&key)), None, &json!({"tag": "x"}))
                .unwrap(),
            1
        );
        assert_eq!(c.len(), 376);
        let last = c.last_seq();
        // "Crash": drop without a checkpoint; the WAL replays on open.
        drop(c);
        drop(db);
        let db = Database::open(dir.path(), opts()).unwrap();
        let c = db.collection("docs").unwrap();
        assert_eq!(c.len(), 376, "{engine}");
        assert_eq!(c.last_seq(), last);
        assert_eq!(c.count(Some(&paris)), 0);
        let got = c
            .get(
                &[key.clone(), uuid.clone(), ExtId::Num(0), ExtId::Num(3)],
                true,
            )
            .unwrap();
        assert_eq!(got[0].as_ref().unwrap().payload, json!({"tag": "x"}));
        assert_eq!(
            got[1].as_ref().unwrap().vector.as_deref(),
            Some(&[0.5f32; 8][..])
        );
        assert!(got[2].is_none(), "deleted");
        assert_eq!(
            got[3].as_ref().unwrap().vector.as_deref(),
            Some(&pts[3].vector[..])
        );
        // Checkpoint: the WAL is cut and the collection reopens the same.
        c.checkpoint().unwrap();
        assert_eq!(c.wal_segments(), 1);
        c.upsert(&[PointInput {
            id: ExtId::Num(1),
            vector: vec![0.0; 8],
            payload: json!({"late": true}),
        }])
        .unwrap();
        drop(c);
        drop(db);
        let db = Database::open(dir.path(), opts()).unwrap();
        let c = db.collection("docs").unwrap();
        assert_eq!(c.len(), 377, "id 1 (deleted with Paris) is back");
        assert_eq!(
            c.get(&[ExtId::Num(1)], false).unwrap()[0]
                .as_ref()
                .unwrap()
                .payload,
            json!({"late": true})
        );
        let (page, next) = c.scroll(None, None, 10, false).unwrap();
        assert_eq!(page.len(), 10);
        let (page2, _) = c.scroll(None, next.as_ref(), 10, false).unwrap();
        assert!(page2[0].id > page[9].id, "scroll pages are ordered by id");
        assert!(db.delete_collection("docs").unwrap());
        assert!(matches!(
            db.collection("docs"),
            Err(DbError::CollectionNotFound(_))
        ));
        assert_eq!(db.list(), Vec::<String>::new());
    }
}

#[test]
fn a_second_opener_gets_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let db = Database::open(dir.path(), opts()).unwrap();
    let e = Database::open(dir.path(), opts()).unwrap_err();
    assert!(matches!(e, DbError::Locked { .. }), "{e}");
    assert!(e.to_string().contains(&std::process::id().to_string()));
    drop(db);
    Database::open(dir.path(), opts()).unwrap();
}

#[test]
fn close_releases_the_lock_and_stale_handles_fail_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let db = Database::open(dir.path(), opts()).unwrap();
    let a = db.create_collection("a", cfg(4, "hnsw")).unwrap();
    let b = db.create_collection("b", cfg(4, "p-hnsw")).unwrap();
    a.upsert(&points(50, 4, 1)).unwrap();
    b.upsert(&points(20, 4, 2)).unwrap();
    // A deleted collection's handle refuses writes and searches.
    assert!(db.delete_collection("b").unwrap());
    let e = b.upsert(&points(1, 4, 3)).unwrap_err();
    assert!(matches!(e, DbError::Closed(_)), "{e}");
    assert!(e.to_string().contains("\"b\""), "{e}");
    let q = [0.0f32; 4];
    assert!(matches!(
        b.search(&q, 3, &SearchParams::default(), None, false, false),
        Err(DbError::Closed(_))
    ));
    // Closing checkpoints, releases the lock while `db` is still alive, and
    // is idempotent; handles then fail, and the collection's files close
    // when the last handle drops.
    db.close().unwrap();
    db.close().unwrap();
    assert!(matches!(
        a.delete(Some(&[ExtId::Num(1)]), None),
        Err(DbError::Closed(_))
    ));
    assert!(matches!(db.collection("a"), Err(DbError::Closed(_))));
    assert!(matches!(
        db.create_collection("c", cfg(4, "hnsw")),
        Err(DbError::Closed(_))
    ));
    drop((a, b));
    let again = Database::open(dir.path(), opts()).unwrap();
    assert_eq!(again.list(), vec!["a".to_string()]);
    let a = again.collection("a").unwrap();
    assert_eq!(a.len(), 50, "the stale handle changed nothing");
    assert_eq!(
        a.counters
            .replayed
            .load(std::sync::atomic::Ordering::Relaxed),
        0,
        "close checkpointed"
    );
}

#[test]
fn bad_input_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let db = Database::open(dir.path(), opts()).unwrap();
    assert!(db.create_collection("bad name!", cfg(4, "hnsw")).is_err());
    assert!(db.create_collection("x", cfg(4, "nope")).is_err());
    assert!(db.create_collection("x", cfg(0, "hnsw")).is_err());
    assert!(db.list().is_empty());
    let c = db.create_collection("x", cfg(4, "hnsw")).unwrap();
    let p = |id: u64, v: Vec<f32>, payload: Value| PointInput {
        id: ExtId::Num(id),
        vector: v,
        payload,
    };
    assert!(c
        .upsert(&[p(1, vec![1.0; 3], Value::Null)])
        .unwrap_err()
        .to_string()
        .contains("dimension"));
    assert!(c.upsert(&[p(1, vec![f32::NAN; 4], Value::Null)]).is_err());
    assert!(c
        .upsert(&[p(1, vec![1.0; 4], json!([1, 2]))])
        .unwrap_err()
        .to_string()
        .contains("object"));
    assert!(c
        .upsert(&[
            p(1, vec![1.0; 4], Value::Null),
            p(1, vec![2.0; 4], Value::Null)
        ])
        .is_err());
    assert_eq!(c.len(), 0);
    assert_eq!(c.last_seq(), 0, "nothing reached the log");
    assert!(c
        .search(&[1.0; 3], 1, &SearchParams::default(), None, true, false)
        .is_err());
    assert!(c
        .search(&[1.0; 4], 0, &SearchParams::default(), None, true, false)
        .is_err());
    assert!(c.set_payload(None, None, &json!(3)).is_err());
    assert!(c.create_index("", IndexKind::Keyword).is_err());
}

/// Recall@10 of filtered search against brute force, at three selectivities,
/// with and without a payload index.
#[test]
fn restrictive_filters_keep_recall() {
    let dir = tempfile::tempdir().unwrap();
    // Exact answers up to 500 matches: 1% goes exact, 10% and 50% through
    // the filtered graph search.
    let db = Database::open(
        dir.path(),
        Options {
            exact_max: 500,
            ..opts()
        },
    )
    .unwrap();
    let c = db.create_collection("f", cfg(16, "hnsw")).unwrap();
    let pts = points(20_000, 16, 3);
    for chunk in pts.chunks(5000) {
        c.upsert(chunk).unwrap();
    }
    let mut rng = StdRng::seed_from_u64(9);
    let queries: Vec<Vec<f32>> = (0..50)
        .map(|_| (0..16).map(|_| rng.gen_range(-1.0..1.0)).collect())
        .collect();
    let l2 = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum::<f32>();
    for indexed in [false, true] {
        if indexed {
            c.create_index("pct", IndexKind::Integer).unwrap();
        }
        for pct in [1i64, 10, 50] {
            let f =
                Filter::parse(&json!({"must": [{"key": "pct", "range": {"lt": pct}}]})).unwrap();
            let mut hit = 0;
            for q in &queries {
                let mut exact: Vec<(f32, u64)> = pts
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| ((i % 100) as i64) < pct)
                    .map(|(i, p)| (l2(q, &p.vector), i as u64))
                    .collect();
                exact.sort_by(|a, b| a.0.total_cmp(&b.0));
                let truth: Vec<ExtId> = exact.iter().take(10).map(|x| ExtId::Num(x.1)).collect();
                let got = c
                    .search(q, 10, &SearchParams::with_ef(64), Some(&f), false, false)
                    .unwrap();
                assert!(got.len() == 10);
                hit += got.iter().filter(|h| truth.contains(&h.id)).count();
            }
            let recall = hit as f64 / 500.0;
            println!(
                "filtered recall@10 at {pct}% selectivity (payload index: {indexed}): {recall:.3}"
            );
            assert!(recall >= 0.9, "{pct}%: {recall}");
        }
    }
}

#[test]
fn group_commit_shares_fsyncs_and_always_does_not_wait() {
    for durability in [Durability::DEFAULT, Durability::Always] {
        let dir = tempfile::tempdir().unwrap();
        let db = Database::open(
            dir.path(),
            Options {
                durability,
                ..opts()
            },
        )
        .unwrap();
        let c = db.create_collection("g", cfg(4, "hnsw")).unwrap();
        let threads: Vec<_> = (0..8u64)
            .map(|t| {
                let c = Arc::clone(&c);
                std::thread::spawn(move || {
                    for i in 0..20u64 {
                        c.upsert(&[PointInput {
                            id: ExtId::Num(t * 100 + i),
                            vector: vec![t as f32, i as f32, 1.0, 0.5],
                            payload: Value::Null,
                        }])
                        .unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(c.len(), 160);
        assert_eq!(c.last_seq(), 160);
        println!(
            "{}: {} fsyncs for 160 acknowledged upserts from 8 threads",
            durability.name(),
            c.wal_syncs()
        );
        if durability != Durability::Always {
            assert!(c.wal_syncs() < 160, "group commit shared fsyncs");
        }
    }
}
