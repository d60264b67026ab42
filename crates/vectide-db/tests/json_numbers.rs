//! Issue 10 item 5: JSON numbers in payloads round-trip exactly, through the
//! WAL (replay after a crash) and at rest (the redb point store after a
//! checkpoint).

use serde_json::Value;
use std::time::Duration;
use vectide_core::Metric;
use vectide_db::{CollectionConfig, Database, ExtId, Options, PointInput};
use vectide_engines::Params;

/// Numbers as text; each must come back as the same text.
const NUMBERS: &[&str] = &[
    "15028.519667320139",
    "0.30000000000000004",
    "1e-320",
    "5e-324",
    "1.7976931348623157e308",
    "-0.0",
    "2.2250738585072014e-308",
    "0.1",
    "123456789.12345679",
    "9223372036854775807",
    "-9223372036854775808",
    "18446744073709551615",
];

fn payload() -> Value {
    let text = format!("{{\"v\": [{}]}}", NUMBERS.join(", "));
    serde_json::from_str(&text).unwrap()
}

fn texts(v: &Value) -> Vec<String> {
    v["v"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| {
            // Through f64 for floats, so "1e-320" and "1e-320" printed by
            // ryu compare as values, not spellings.
            if x.is_f64() {
                format!("{:e}", x.as_f64().unwrap())
            } else {
                x.to_string()
            }
        })
        .collect()
}

fn want() -> Vec<String> {
    NUMBERS
        .iter()
        .map(|t| match t.parse::<i128>() {
            Ok(i) => i.to_string(),
            Err(_) => format!("{:e}", t.parse::<f64>().unwrap()),
        })
        .collect()
}

#[test]
fn payload_numbers_round_trip_through_wal_and_store() {
    // Parsing first: serde_json's default float parser rounds some values
    // one ulp off (15028.519667320139 became 15028.51966732014).
    let p = payload();
    assert_eq!(texts(&p), want(), "parsed");
    assert_eq!(
        p["v"][0].as_f64().unwrap().to_bits(),
        15028.519667320139f64.to_bits()
    );
    let dir = tempfile::tempdir().unwrap();
    let opts = || Options {
        checkpoint_interval: Duration::from_secs(3600),
        ..Options::default()
    };
    let db = Database::open(dir.path(), opts()).unwrap();
    let c = db
        .create_collection(
            "n",
            CollectionConfig {
                dim: 2,
                metric: Metric::L2,
                engine: "hnsw".into(),
                params: Params::new(),
                ..Default::default()
            },
        )
        .unwrap();
    c.upsert(&[PointInput {
        id: ExtId::Num(1),
        vector: vec![1.0, 2.0],
        payload: p.clone(),
    }])
    .unwrap();
    let get = |c: &vectide_db::Collection| {
        c.get(&[ExtId::Num(1)], false).unwrap()[0]
            .as_ref()
            .unwrap()
            .payload
            .clone()
    };
    assert_eq!(texts(&get(&c)), want(), "in memory");
    // Crash (no checkpoint): the point comes back from the WAL.
    drop(c);
    drop(db);
    let db = Database::open(dir.path(), opts()).unwrap();
    let c = db.collection("n").unwrap();
    assert_eq!(texts(&get(&c)), want(), "after WAL replay");
    // Checkpoint: the point comes back from the store.
    c.checkpoint().unwrap();
    drop(c);
    drop(db);
    let db = Database::open(dir.path(), opts()).unwrap();
    let c = db.collection("n").unwrap();
    let back = get(&c);
    assert_eq!(texts(&back), want(), "after checkpoint");
    assert_eq!(back, p);
    assert!(
        back["v"][5].as_f64().unwrap().is_sign_negative(),
        "-0.0 keeps its sign"
    );
}
