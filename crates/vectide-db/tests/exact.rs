//! An exact search (`exact: true`) answers as a brute force over the live
//! points does, for every engine of the registry, with its points spread
//! over every place the engine keeps them (fresh-diskann: the LTI after a
//! merge and the temp indexes; the SPANN family: many postings, so that
//! the engine's one-pass scan runs, with deleted and replaced points).

use serde_json::json;
use std::collections::BTreeMap;
use vectide_core::{Metric, Params, SearchParams};
use vectide_db::{CollectionConfig, Database, ExtId, Options, PointInput};
use vectide_engines::ParamValue;

const DIM: usize = 8;

fn vector(seed: u64) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..DIM)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % 1_000) as f32 / 100.0 - 5.0
        })
        .collect()
}

fn params(engine: &str) -> Params {
    let d = vectide_engines::descriptor(engine).unwrap();
    let mut p = Params::new();
    for (k, v) in [
        ("temp_points", ParamValue::Int(300)),
        ("merge_points", ParamValue::Int(600)),
        ("merge", ParamValue::Str("inline".into())),
        ("posting_vectors", ParamValue::Int(32)),
        ("rebuild", ParamValue::Str("inline".into())),
        ("pq_bytes", ParamValue::Int(4)),
        ("threads", ParamValue::Int(1)),
    ] {
        if d.param(k).is_some() {
            p.insert(k.into(), v);
        }
    }
    p
}

#[test]
fn exact_search_matches_a_brute_force_over_the_live_points_for_every_engine() {
    for desc in vectide_engines::REGISTRY.iter() {
        let engine = desc.name;
        let dir = tempfile::tempdir().unwrap();
        let db = Database::open(dir.path(), Options::default()).unwrap();
        let cfg = CollectionConfig {
            dim: DIM,
            metric: Metric::L2,
            engine: engine.into(),
            params: params(engine),
            ..Default::default()
        };
        let c = db.create_collection("c", cfg).unwrap();
        let mut live: BTreeMap<u64, Vec<f32>> = BTreeMap::new();
        let put = |ids: std::ops::Range<u64>, salt: u64, live: &mut BTreeMap<u64, Vec<f32>>| {
            let pts: Vec<PointInput> = ids
                .map(|i| {
                    let v = vector(i * 31 + salt);
                    live.insert(i, v.clone());
                    PointInput {
                        id: ExtId::Num(i),
                        vector: v,
                        payload: json!({}),
                    }
                })
                .collect();
            for chunk in pts.chunks(100) {
                c.upsert(chunk).unwrap();
            }
        };
        put(0..1_500, 0, &mut live);
        c.maintain().unwrap();
        // Replaced and deleted points after the merge or split: some in
        // the LTI, some in temp indexes, some moved between postings.
        put(200..400, 7, &mut live);
        let gone: Vec<ExtId> = (1_000..1_200).map(ExtId::Num).collect();
        c.delete(Some(&gone), None).unwrap();
        for i in 1_000..1_200 {
            live.remove(&i);
        }
        put(1_500..1_700, 0, &mut live);
        let exact = SearchParams {
            exact: true,
            ..Default::default()
        };
        for q in 0..20u64 {
            let query = vector(900_000 + q);
            let hits = c.search(&query, 10, &exact, None, false, false).unwrap();
            let mut truth: Vec<(f32, u64)> = live
                .iter()
                .map(|(&i, v)| {
                    let d: f32 = v.iter().zip(&query).map(|(a, b)| (a - b) * (a - b)).sum();
                    (d, i)
                })
                .collect();
            truth.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
            let got: Vec<(f32, ExtId)> = hits.iter().map(|h| (h.distance, h.id.clone())).collect();
            assert_eq!(got.len(), 10, "{engine}");
            for (j, ((dg, ig), (dt, it))) in got.iter().zip(&truth).enumerate() {
                assert!(
                    (dg - dt).abs() <= 1e-3 * dt.max(1.0),
                    "{engine}: query {q}, rank {j}: distance {dg}, brute force {dt}"
                );
                // The id too, unless a neighbour ties with it.
                let tie = [j.wrapping_sub(1), j + 1]
                    .iter()
                    .filter_map(|&n| truth.get(n))
                    .any(|(dn, _)| (dn - dt).abs() <= 1e-3 * dt.max(1.0));
                assert!(
                    tie || *ig == ExtId::Num(*it),
                    "{engine}: query {q}, rank {j}: id {ig:?} at {dg}, brute force {it} at {dt}"
                );
            }
        }
        db.close().unwrap();
    }
}
