//! The run half of the harness core: ground truth against a brute-force
//! oracle over random runbooks, and the timed loop's results.

use proptest::prelude::*;
use vectide_core::Metric;
use vectide_harness::runbook::{
    check, document, ground_truth, parse, run_engine, Data, EngineRun, Plan, RunOptions,
};

/// Seeded draws for the random runbooks and vectors.
struct Rng(rand::rngs::StdRng);
impl Rng {
    fn new(seed: u64) -> Self {
        use rand::SeedableRng;
        Rng(rand::rngs::StdRng::seed_from_u64(seed))
    }
    fn below(&mut self, n: usize) -> usize {
        rand::Rng::gen_range(&mut self.0, 0..n)
    }
    fn unit(&mut self) -> f32 {
        rand::Rng::gen_range(&mut self.0, -0.5f32..0.5)
    }
}

/// A random runbook over `n` rows: inserts of fresh blocks, deletes and
/// replaces of active blocks, searches in between; YAML as a user writes it.
fn random_runbook(rng: &mut Rng, n: usize) -> String {
    let mut yaml = format!("random:\n  max_pts: {n}\n");
    let mut active: Vec<(usize, usize)> = Vec::new(); // active blocks of ids
    let mut next = 0usize;
    let mut step = 0;
    let mut push = |yaml: &mut String, s: String| {
        step += 1;
        yaml.push_str(&format!("  {step}: {s}\n"));
    };
    for _ in 0..12 {
        match rng.below(4) {
            0 | 1 if next < n => {
                let len = (1 + rng.below(40)).min(n - next);
                push(
                    &mut yaml,
                    format!("{{operation: insert, start: {next}, end: {}}}", next + len),
                );
                active.push((next, next + len));
                next += len;
            }
            2 if !active.is_empty() => {
                let (a, b) = active.remove(rng.below(active.len()));
                if rng.below(2) == 0 {
                    push(
                        &mut yaml,
                        format!("{{operation: delete, start: {a}, end: {b}}}"),
                    );
                } else {
                    let from = rng.below(n - (b - a) + 1);
                    push(
                        &mut yaml,
                        format!(
                            "{{operation: replace, tags_start: {a}, tags_end: {b}, \
                             ids_start: {from}, ids_end: {}}}",
                            from + b - a
                        ),
                    );
                    active.push((a, b));
                }
            }
            _ => push(&mut yaml, "{operation: search}".into()),
        }
    }
    push(&mut yaml, "{operation: search}".into());
    yaml
}

/// What each search step sees, by brute force: the id → row map of the
/// active set, and every query's `k` smallest distances, ascending.
type Seen = (Vec<Option<usize>>, Vec<Vec<f32>>);

fn l2(x: &[f32], q: &[f32]) -> f32 {
    x.iter().zip(q).map(|(a, b)| (a - b) * (a - b)).sum()
}

fn oracle(plan: &Plan, rows: &[f32], queries: &[f32], dim: usize, k: usize) -> Vec<Seen> {
    use vectide_harness::runbook::Op;
    let mut row_of: Vec<Option<usize>> = vec![None; rows.len() / dim];
    let mut out = Vec::new();
    for op in &plan.ops {
        match op {
            Op::Insert(r) => r.clone().for_each(|i| row_of[i] = Some(i)),
            Op::Delete(r) => r.clone().for_each(|i| row_of[i] = None),
            Op::Replace { tags, rows } => tags
                .clone()
                .zip(rows.clone())
                .for_each(|(i, r)| row_of[i] = Some(r)),
            Op::Search => {
                let per_query = queries
                    .chunks_exact(dim)
                    .map(|q| {
                        let mut d: Vec<f32> = row_of
                            .iter()
                            .flatten()
                            .map(|&r| l2(&rows[r * dim..(r + 1) * dim], q))
                            .collect();
                        d.sort_by(f32::total_cmp);
                        d.truncate(k);
                        d
                    })
                    .collect();
                out.push((row_of.clone(), per_query));
            }
        }
    }
    out
}

fn vectors(rng: &mut Rng, n: usize, dim: usize) -> Vec<f32> {
    (0..n * dim).map(|_| rng.unit()).collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    #[test]
    fn ground_truth_matches_brute_force(seed in 1u64..u64::MAX, k in 1usize..8) {
        let (n, dim, nq) = (120, 6, 9);
        let mut rng = Rng::new(seed);
        let rows = vectors(&mut rng, n, dim);
        let queries = vectors(&mut rng, nq, dim);
        let yaml = random_runbook(&mut rng, n);
        let plan = check(&parse(yaml.as_bytes(), None).unwrap(), n).unwrap();
        let data = Data::new(dim, Metric::L2, &rows, &queries).unwrap();
        let truth = ground_truth(&data, &plan, k, 1).unwrap();
        let want = oracle(&plan, &rows, &queries, dim, k);
        prop_assert_eq!(truth.steps.len(), want.len());
        // Ties (a replace may give two ids one row) may be broken either
        // way: every id found must be active, once, at the exact distances.
        for (got, (row_of, dists)) in truth.steps.iter().zip(&want) {
            match got {
                None => prop_assert!(dists.iter().all(Vec::is_empty), "{}", yaml),
                Some(t) => {
                    prop_assert_eq!(t.k, dists[0].len());
                    for (q, w) in dists.iter().enumerate() {
                        let found = &t.ids[q * t.k..(q + 1) * t.k];
                        let mut unique = found.to_vec();
                        unique.sort_unstable();
                        unique.dedup();
                        prop_assert_eq!(unique.len(), found.len());
                        let query = &queries[q * dim..(q + 1) * dim];
                        for (&id, &want) in found.iter().zip(w) {
                            let row = row_of[id as usize];
                            prop_assert!(row.is_some(), "id {} is not active: {}", id, yaml);
                            let d = l2(&rows[row.unwrap() * dim..(row.unwrap() + 1) * dim], query);
                            prop_assert!((d - want).abs() <= 1e-4 * want.max(1.0), "{} vs {}: {}", d, want, yaml);
                        }
                    }
                }
            }
        }
    }
}

const RUNBOOK: &str = "\
small:
  max_pts: 600
  1: {operation: insert, start: 0, end: 500}
  2: {operation: search}
  3: {operation: delete, start: 0, end: 100}
  4: {operation: replace, tags_start: 100, tags_end: 200, ids_start: 500, ids_end: 600}
  5: {operation: search}
";

struct Fixture {
    rows: Vec<f32>,
    queries: Vec<f32>,
    plan: Plan,
}

fn fixture() -> Fixture {
    let mut rng = Rng::new(7);
    let (n, dim) = (600, 8);
    Fixture {
        rows: vectors(&mut rng, n, dim),
        queries: vectors(&mut rng, 40, dim),
        plan: check(&parse(RUNBOOK.as_bytes(), None).unwrap(), n).unwrap(),
    }
}

#[test]
fn an_exact_engine_finds_everything_and_the_report_sums_it() {
    let f = fixture();
    let data = Data::new(8, Metric::L2, &f.rows, &f.queries).unwrap();
    let truth = ground_truth(&data, &f.plan, 10, 2).unwrap();
    assert_eq!(truth.distinct, 2);
    let mut e = EngineRun::new("flat", 2, 100, 32).unwrap();
    let opts = RunOptions {
        k: 10,
        settle_after_deletes: true,
        ..RunOptions::default()
    };
    let r = run_engine(&mut e, &data, &f.plan, &truth.steps, &opts).unwrap();
    assert_eq!(r["avg_recall"], 1.0);
    let steps = r["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 5);
    assert_eq!(steps[2]["points"], 100);
    assert!(steps[2]["consolidate_s"].as_f64().unwrap() >= 0.0);
    let sum: f64 = steps.iter().map(|s| s["seconds"].as_f64().unwrap()).sum();
    assert!((r["seconds"].as_f64().unwrap() - sum).abs() < 1e-9);
    let mut results = serde_json::Map::new();
    results.insert(e.key.clone(), r);
    let doc = document(serde_json::json!({"k": 10, "dataset": "x"}), results, true).unwrap();
    assert_eq!(doc["summary"]["avg_recall10"]["vectide:flat"], 1.0);
    assert_eq!(doc["dataset"], "x");
    assert!(doc["memory_method"].as_str().unwrap().contains("worker"));
    assert!(document(
        serde_json::json!({"dataset": "x"}),
        serde_json::Map::new(),
        true
    )
    .is_err());
}

#[test]
fn calibration_keeps_the_first_knob_that_reaches_the_target() {
    let f = fixture();
    let data = Data::new(8, Metric::L2, &f.rows, &f.queries).unwrap();
    let truth = ground_truth(&data, &f.plan, 10, 2).unwrap();
    let mut e = EngineRun::new("vectide:hnsw@m=4", 2, 10, 32).unwrap();
    assert_eq!(e.key, "vectide:hnsw@m=4");
    let opts = RunOptions {
        k: 10,
        calibrate: vec![10, 11, 400, 500],
        target: 0.99,
        ..RunOptions::default()
    };
    let r = run_engine(&mut e, &data, &f.plan, &truth.steps, &opts).unwrap();
    let cal = &r["calibration"];
    let sweep = cal["sweep"].as_array().unwrap();
    let last = sweep.last().unwrap();
    // The sweep stops at the first value reaching the target (ef 400 over
    // 500 points is exhaustive enough), and that value is kept.
    assert!(last["recall"].as_f64().unwrap() >= 0.99, "{cal}");
    assert!(sweep.len() <= 3, "{cal}");
    assert_eq!(cal["chosen"], last["knob"]);
    assert_eq!(r["search_knob"]["ef"], last["knob"]);
    assert_eq!(r["params"]["m"], 4);
}

#[test]
fn bad_engines_and_data_are_errors() {
    for (spec, msg) in [
        ("hnswlib", "unknown engine"),
        ("hnsw@m", "expected NAME@key=value"),
        ("hnsw@m=4@m=5", "twice"),
        ("hnsw@path=/x", "no parameter"),
        ("hnsw@m=1.5", "not an integer"),
    ] {
        let e = EngineRun::new(spec, 2, 10, 32).unwrap_err();
        assert!(e.contains(msg), "{spec}: {e}");
    }
    let x = [0.0f32; 10];
    assert!(Data::new(4, Metric::L2, &x, &x[..8]).is_err());
    assert!(Data::new(5, Metric::L2, &x, &[]).is_err());
}
