//! Collections of several vector spaces: named dense spaces (each its own
//! engine) and sparse spaces, in one commit log. Points may lack spaces;
//! an upsert replaces the whole point. Searches in each space against
//! brute force, reads of the named vectors, bad input that changes
//! nothing, and the same state after a replay (a drop without a final
//! checkpoint), after a checkpoint, and after both.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;
use std::collections::HashMap;
use std::time::Duration;
use vectide_core::{Metric, SearchParams};
use vectide_db::spaces::{
    Modifier, PointData, SparseSpaceConfig, SparseVector, VectorSpaceConfig, VectorValue,
};
use vectide_db::{CollectionConfig, Database, ExtId, Filter, Options};
use vectide_engines::{ParamValue, Params};

fn dense(name: &str, dim: usize, metric: Metric, engine: &str) -> VectorSpaceConfig {
    let mut params = Params::new();
    if engine != "flat" {
        params.insert("m".into(), ParamValue::Int(8));
    }
    VectorSpaceConfig {
        name: name.into(),
        dim,
        metric,
        engine: engine.into(),
        params,
    }
}

fn config(second: &str) -> CollectionConfig {
    CollectionConfig::with_spaces(
        vec![
            dense("text", 4, Metric::Cosine, "hnsw"),
            dense("image", 3, Metric::L2, second),
        ],
        vec![
            SparseSpaceConfig {
                name: "bm25".into(),
                modifier: Modifier::Idf,
            },
            SparseSpaceConfig {
                name: "splade".into(),
                modifier: Modifier::None,
            },
        ],
    )
}

fn opts() -> Options {
    Options {
        checkpoint_interval: Duration::from_secs(3600),
        ..Options::default()
    }
}

fn sparse(rng: &mut StdRng) -> SparseVector {
    let n = rng.gen_range(0..6);
    let mut t: Vec<u32> = (0..n).map(|_| rng.gen_range(0..30)).collect();
    t.sort_unstable();
    t.dedup();
    // Few distinct weights, so that ties happen.
    let v = t.iter().map(|_| f32::from(rng.gen_range(1u8..4))).collect();
    SparseVector::new(t, v).unwrap()
}

/// A random point: each space present with probability 3/4.
fn point(rng: &mut StdRng, id: u64) -> PointData {
    let mut vectors = Vec::new();
    if rng.gen_bool(0.75) {
        vectors.push((
            "text".to_string(),
            VectorValue::Dense((0..4).map(|_| rng.gen_range(-1.0..1.0)).collect()),
        ));
    }
    if rng.gen_bool(0.75) {
        vectors.push((
            "image".to_string(),
            VectorValue::Dense((0..3).map(|_| rng.gen_range(-1.0..1.0)).collect()),
        ));
    }
    for name in ["bm25", "splade"] {
        if rng.gen_bool(0.75) {
            vectors.push((name.to_string(), VectorValue::Sparse(sparse(rng))));
        }
    }
    PointData {
        id: ExtId::Num(id),
        vectors,
        payload: json!({"group": id % 3}),
    }
}

/// The model: each live point's vectors by name.
type Model = HashMap<u64, HashMap<String, VectorValue>>;

fn dense_of(m: &Model, name: &str) -> Vec<(u64, Vec<f32>)> {
    m.iter()
        .filter_map(|(&id, v)| match v.get(name) {
            Some(VectorValue::Dense(x)) => Some((id, x.clone())),
            _ => None,
        })
        .collect()
}

/// Qdrant's IDF over the model's points that have the space.
fn expected_sparse(
    m: &Model,
    name: &str,
    q: &SparseVector,
    idf: bool,
    k: usize,
    keep: impl Fn(u64) -> bool,
) -> Vec<(u64, f32)> {
    let docs: Vec<(u64, &SparseVector)> = m
        .iter()
        .filter_map(|(&id, v)| match v.get(name) {
            Some(VectorValue::Sparse(x)) => Some((id, x)),
            _ => None,
        })
        .collect();
    let n = docs.len() as f64;
    let q = if idf {
        q.reweighted(|t| {
            let df = docs
                .iter()
                .filter(|(_, x)| x.indices().contains(&t))
                .count() as f64;
            ((n - df + 0.5) / (df + 0.5) + 1.0).ln()
        })
    } else {
        q.clone()
    };
    let mut all: Vec<(u64, f32)> = docs
        .iter()
        .filter(|(id, _)| keep(*id))
        .filter_map(|(id, x)| x.dot(&q).map(|s| (*id, s)))
        .collect();
    all.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    all.truncate(k);
    all
}

fn dist(metric: Metric, a: &[f32], b: &[f32]) -> f32 {
    let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let na: f32 = a.iter().map(|x| x * x).sum::<f32>().sqrt();
    let nb: f32 = b.iter().map(|x| x * x).sum::<f32>().sqrt();
    match metric {
        Metric::Cosine => 1.0 - dot / (na * nb),
        _ => a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum(),
    }
}

fn check_against(c: &vectide_db::Collection, m: &Model, rng: &mut StdRng) {
    assert_eq!(c.len(), m.len());
    // Dense spaces, exact.
    let exact = SearchParams {
        exact: true,
        ..SearchParams::default()
    };
    for (name, dim, metric) in [("text", 4, Metric::Cosine), ("image", 3, Metric::L2)] {
        let q: Vec<f32> = (0..dim).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let hits = c
            .search_in(name, &q, 5, &exact, None, false, false)
            .unwrap();
        let mut want: Vec<(u64, f32)> = dense_of(m, name)
            .into_iter()
            .map(|(id, v)| (id, dist(metric, &q, &v)))
            .collect();
        want.sort_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
        want.truncate(5);
        let got: Vec<u64> = hits
            .iter()
            .map(|h| match h.id {
                ExtId::Num(n) => n,
                _ => unreachable!(),
            })
            .collect();
        assert_eq!(
            got,
            want.iter().map(|w| w.0).collect::<Vec<_>>(),
            "space {name}"
        );
    }
    // Sparse spaces, exact, with and without a filter.
    for (name, idf) in [("bm25", true), ("splade", false)] {
        let q = sparse(rng);
        for filtered in [false, true] {
            let f =
                Filter::parse(&json!({"must": [{"key": "group", "match": {"value": 1}}]})).unwrap();
            let hits = c
                .search_sparse(name, &q, 7, filtered.then_some(&f), false, false)
                .unwrap();
            let want = expected_sparse(m, name, &q, idf, 7, |id| !filtered || id % 3 == 1);
            let got: Vec<(u64, f32)> = hits
                .iter()
                .map(|h| match h.id {
                    ExtId::Num(n) => (n, -h.distance),
                    _ => unreachable!(),
                })
                .collect();
            assert_eq!(got.len(), want.len(), "space {name}: {got:?} vs {want:?}");
            for (g, w) in got.iter().zip(&want) {
                assert_eq!(g.0, w.0, "space {name}: {got:?} vs {want:?}");
                assert!(
                    (g.1 - w.1).abs() < 1e-4,
                    "space {name}: {got:?} vs {want:?}"
                );
            }
        }
    }
    // Every point's vectors read back by name.
    let ids: Vec<ExtId> = m.keys().map(|&i| ExtId::Num(i)).collect();
    for (rec, id) in c.get(&ids, true).unwrap().into_iter().zip(m.keys()) {
        let rec = rec.unwrap();
        let named: HashMap<String, VectorValue> = rec.vectors.unwrap().into_iter().collect();
        let want = &m[id];
        assert_eq!(named.len(), want.len(), "point {id}");
        for (name, v) in want {
            match (v, &named[name]) {
                (VectorValue::Sparse(a), VectorValue::Sparse(b)) => assert_eq!(a, b),
                (VectorValue::Dense(a), VectorValue::Dense(b)) => {
                    assert_eq!(a.len(), b.len());
                    // Cosine spaces keep vectors normalised.
                    if name == "image" {
                        assert_eq!(a, b);
                    }
                }
                _ => panic!("point {id}: {name} changed kind"),
            }
        }
    }
}

fn run(second: &str) {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = StdRng::seed_from_u64(3);
    let mut model: Model = HashMap::new();
    {
        let db = Database::open(dir.path(), opts()).unwrap();
        let c = db.create_collection("multi", config(second)).unwrap();
        for round in 0..6 {
            let batch: Vec<PointData> = (0..40)
                .map(|_| {
                    let id = rng.gen_range(0..150);
                    point(&mut rng, id)
                })
                .fold(Vec::new(), |mut acc, p| {
                    if !acc.iter().any(|q: &PointData| q.id == p.id) {
                        acc.push(p);
                    }
                    acc
                });
            for p in &batch {
                let ExtId::Num(id) = p.id else { unreachable!() };
                model.insert(id, p.vectors.iter().cloned().collect());
            }
            c.upsert_points(batch).unwrap();
            let gone: Vec<ExtId> = (0..5).map(|_| ExtId::Num(rng.gen_range(0..150))).collect();
            for g in &gone {
                let ExtId::Num(id) = g else { unreachable!() };
                model.remove(id);
            }
            c.delete(Some(&gone), None).unwrap();
            if round == 2 {
                c.checkpoint().unwrap();
            }
        }
        check_against(&c, &model, &mut rng);
        // Dropped without a final checkpoint: the reopen replays the log
        // past the checkpoint of round 2.
    }
    for step in 0..3 {
        let db = Database::open(dir.path(), opts()).unwrap();
        let c = db.collection("multi").unwrap();
        check_against(&c, &model, &mut rng);
        let p = point(&mut rng, 1_000 + step);
        model.insert(1_000 + step, p.vectors.iter().cloned().collect());
        c.upsert_points(vec![p]).unwrap();
        if step == 1 {
            db.close().unwrap();
        }
    }
}

#[test]
fn spaces_survive_replay_and_checkpoints_with_a_volatile_second_engine() {
    run("flat");
}

#[test]
fn spaces_survive_replay_and_checkpoints_with_a_durable_second_engine() {
    run("p-hnsw");
}

#[test]
fn bad_vectors_are_refused_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let db = Database::open(dir.path(), opts()).unwrap();
    let c = db.create_collection("multi", config("flat")).unwrap();
    let mut rng = StdRng::seed_from_u64(1);
    c.upsert_points(vec![point(&mut rng, 1)]).unwrap();
    let seq = c.last_seq();
    let bad = |vectors: Vec<(String, VectorValue)>| PointData {
        id: ExtId::Num(9),
        vectors,
        payload: json!({}),
    };
    let sv = SparseVector::new(vec![1], vec![1.0]).unwrap();
    for (p, says) in [
        (
            bad(vec![("nope".into(), VectorValue::Dense(vec![1.0; 4]))]),
            "no vector named \"nope\"",
        ),
        (
            bad(vec![("text".into(), VectorValue::Sparse(sv.clone()))]),
            "is dense, got a sparse",
        ),
        (
            bad(vec![("bm25".into(), VectorValue::Dense(vec![1.0; 4]))]),
            "is sparse, got a dense",
        ),
        (
            bad(vec![("image".into(), VectorValue::Dense(vec![1.0; 4]))]),
            "dimension",
        ),
        (
            bad(vec![
                ("bm25".into(), VectorValue::Sparse(sv.clone())),
                ("bm25".into(), VectorValue::Sparse(sv.clone())),
            ]),
            "given twice",
        ),
    ] {
        let e = c.upsert_points(vec![p]).unwrap_err().to_string();
        assert!(e.contains(says), "{e}");
    }
    assert_eq!(c.last_seq(), seq);
    assert_eq!(c.len(), 1);
    let e = c
        .search_sparse("text", &sv, 3, None, false, false)
        .unwrap_err();
    assert!(e.to_string().contains("\"text\" is dense"), "{e}");
    let e = c
        .search_sparse("nope", &sv, 3, None, false, false)
        .unwrap_err();
    assert!(e.to_string().contains("no vector named"), "{e}");
    let e = c
        .search_in(
            "bm25",
            &[1.0; 4],
            3,
            &SearchParams::default(),
            None,
            false,
            false,
        )
        .unwrap_err();
    assert!(e.to_string().contains("\"bm25\" is sparse"), "{e}");
    // Names used twice, and an empty collection, are refused at creation.
    let mut twice = config("flat");
    twice.sparse_vectors[1].name = "text".into();
    assert!(db.create_collection("t", twice).is_err());
    assert!(db
        .create_collection("e", CollectionConfig::with_spaces(vec![], vec![]))
        .is_err());
}

#[test]
fn a_sparse_only_collection_works_and_reopens() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = StdRng::seed_from_u64(5);
    let cfg = CollectionConfig::with_spaces(
        vec![],
        vec![SparseSpaceConfig {
            name: "text".into(),
            modifier: Modifier::Idf,
        }],
    );
    let mut model: Model = HashMap::new();
    {
        let db = Database::open(dir.path(), opts()).unwrap();
        let c = db.create_collection("s", cfg).unwrap();
        let pts: Vec<PointData> = (0..200)
            .map(|i| PointData {
                id: ExtId::Num(i),
                vectors: vec![("text".into(), VectorValue::Sparse(sparse(&mut rng)))],
                payload: json!({"group": i % 3}),
            })
            .collect();
        for p in &pts {
            let ExtId::Num(id) = p.id else { unreachable!() };
            model.insert(id, p.vectors.iter().cloned().collect());
        }
        c.upsert_points(pts).unwrap();
        let e = c
            .search(&[1.0], 3, &SearchParams::default(), None, false, false)
            .unwrap_err();
        assert!(e.to_string().contains("no dense vectors"), "{e}");
    }
    let db = Database::open(dir.path(), opts()).unwrap();
    let c = db.collection("s").unwrap();
    assert_eq!(c.len(), 200);
    for _ in 0..20 {
        let q = sparse(&mut rng);
        let got: Vec<(u64, f32)> = c
            .search_sparse("text", &q, 10, None, false, false)
            .unwrap()
            .iter()
            .map(|h| match h.id {
                ExtId::Num(n) => (n, -h.distance),
                _ => unreachable!(),
            })
            .collect();
        let want = expected_sparse(&model, "text", &q, true, 10, |_| true);
        assert_eq!(
            got.iter().map(|g| g.0).collect::<Vec<_>>(),
            want.iter().map(|w| w.0).collect::<Vec<_>>()
        );
    }
}

#[test]
fn payload_edits_and_nested_keys_survive_replay() {
    use vectide_db::edit::PayloadEdit;
    use vectide_db::path::KeyPath;
    use vectide_db::IndexKind;
    let dir = tempfile::tempdir().unwrap();
    let obj = |v: serde_json::Value| v.as_object().unwrap().clone();
    let topic = |i: u64| ["a", "b", "c"][i as usize % 3];
    let want = {
        let db = Database::open(dir.path(), opts()).unwrap();
        let c = db
            .create_collection("p", CollectionConfig::new(2, Metric::L2, "flat"))
            .unwrap();
        c.create_index("meta.topic", IndexKind::Keyword).unwrap();
        let pts: Vec<vectide_db::PointInput> = (0..20)
            .map(|i| vectide_db::PointInput {
                id: ExtId::Num(i),
                vector: vec![i as f32, 1.0],
                payload: json!({"meta": {"topic": topic(i), "n": i}, "tags": ["x"], "drop": i}),
            })
            .collect();
        c.upsert(&pts).unwrap();
        let by = |t: &str| {
            Filter::parse(&json!({"must": [{"key": "meta.topic", "match": {"value": t}}]})).unwrap()
        };
        assert_eq!(c.count(Some(&by("a"))), 7);
        let ids = [ExtId::Num(0), ExtId::Num(1)];
        c.edit_payload(
            Some(&ids),
            None,
            &PayloadEdit::SetAt(
                KeyPath::parse("meta").unwrap(),
                obj(json!({"topic": "z", "n": null})),
            ),
        )
        .unwrap();
        c.edit_payload(
            None,
            Some(&by("b")),
            &PayloadEdit::Delete(vec![
                KeyPath::parse("drop").unwrap(),
                KeyPath::parse("tags[]").unwrap(),
            ]),
        )
        .unwrap();
        c.edit_payload(
            Some(&[ExtId::Num(2)]),
            None,
            &PayloadEdit::Overwrite(obj(json!({"only": 1}))),
        )
        .unwrap();
        c.edit_payload(Some(&[ExtId::Num(3)]), None, &PayloadEdit::Clear)
            .unwrap();
        c.set_payload(
            Some(&[ExtId::Num(6)]),
            None,
            &json!({"drop": null, "new": true}),
        )
        .unwrap();
        assert_eq!(c.count(Some(&by("z"))), 2);
        assert_eq!(c.delete(None, Some(&by("c"))).unwrap(), 5);
        let all: Vec<ExtId> = (0..20).map(ExtId::Num).collect();
        c.get(&all, false).unwrap()
        // Dropped without a checkpoint: the reopen replays every edit.
    };
    let db = Database::open(dir.path(), opts()).unwrap();
    let c = db.collection("p").unwrap();
    let all: Vec<ExtId> = (0..20).map(ExtId::Num).collect();
    let got = c.get(&all, false).unwrap();
    assert_eq!(got, want);
    let p = |i: usize| {
        got[i]
            .as_ref()
            .unwrap_or_else(|| panic!("point {i} gone: {got:?}"))
            .payload
            .clone()
    };
    assert_eq!(p(0)["meta"], json!({"topic": "z"}));
    assert_eq!(p(1)["meta"], json!({"topic": "z"}));
    assert_eq!(p(2), json!({"only": 1}));
    assert_eq!(p(3), json!({}));
    assert_eq!(p(4), json!({"meta": {"topic": "b", "n": 4}, "tags": []}));
    assert_eq!(
        p(6),
        json!({"meta": {"topic": "a", "n": 6}, "tags": ["x"], "new": true})
    );
    assert!(got[8].is_none(), "deleted by a filter on a nested key");
}

#[test]
fn min_should_is_honoured_when_an_index_answers_the_must_conditions() {
    let dir = tempfile::tempdir().unwrap();
    let db = Database::open(dir.path(), opts()).unwrap();
    let c = db
        .create_collection("m", CollectionConfig::new(2, Metric::L2, "flat"))
        .unwrap();
    let pts: Vec<vectide_db::PointInput> = (0..6)
        .map(|i| vectide_db::PointInput {
            id: ExtId::Num(i),
            vector: vec![i as f32, 0.0],
            payload: json!({"n": i}),
        })
        .collect();
    c.upsert(&pts).unwrap();
    // has_id answers the must condition from the store; min_should must
    // still be checked on each candidate.
    let f = Filter::parse(&json!({"must": [{"has_id": [1, 2, 3]}],
        "min_should": {"conditions": [{"key": "n", "range": {"gte": 3}}], "min_count": 1}}))
    .unwrap();
    assert_eq!(c.count(Some(&f)), 1);
    assert_eq!(c.delete(None, Some(&f)).unwrap(), 1);
    assert_eq!(c.len(), 5);
    // A payload edit nested past the readers' depth is refused.
    use vectide_db::edit::PayloadEdit;
    use vectide_db::path::KeyPath;
    let mut deep = json!(1);
    for _ in 0..115 {
        deep = json!({ "x": deep });
    }
    let edit = PayloadEdit::SetAt(
        KeyPath::parse("a.b.c.d.e.f").unwrap(),
        deep.as_object().unwrap().clone(),
    );
    let e = c
        .edit_payload(Some(&[ExtId::Num(1)]), None, &edit)
        .unwrap_err();
    assert!(e.to_string().contains("levels deep"), "{e}");
}
