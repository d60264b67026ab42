//! A committed record that fails to apply poisons its collection, for
//! every engine of the registry: the failing call and every later write
//! get `Poisoned` (and log nothing), reads go on from the state as it was,
//! checkpoints are refused, and a reopen replays the log — the failed
//! record included — and takes writes again.

use serde_json::json;
use std::time::Duration;
use vectide_core::fault::{install_faults, Faults};
use vectide_core::{Metric, Params, SearchParams};
use vectide_db::collection::APPLY_FAULT;
use vectide_db::{CollectionConfig, Database, DbError, ExtId, Options, PointInput};

const DIM: usize = 4;

fn point(i: u64) -> PointInput {
    PointInput {
        id: ExtId::Num(i),
        vector: vec![i as f32, 1.0, (i % 7) as f32, 0.5],
        payload: json!({"i": i}),
    }
}

fn opts() -> Options {
    Options {
        checkpoint_interval: Duration::from_secs(3600),
        ..Options::default()
    }
}

fn poisoned(e: DbError, engine: &str) -> String {
    assert!(e.is_poisoned(), "{engine}: {e}");
    e.to_string()
}

#[test]
fn a_record_that_fails_to_apply_poisons_the_collection_until_the_reopen_replays_it() {
    for desc in vectide_engines::REGISTRY.iter() {
        let name = desc.name;
        let dir = tempfile::tempdir().unwrap();
        let db = Database::open(dir.path(), opts()).unwrap();
        let cfg = CollectionConfig {
            dim: DIM,
            metric: Metric::L2,
            engine: name.into(),
            params: Params::new(),
            ..Default::default()
        };
        let c = db.create_collection("c", cfg).unwrap();
        for i in 0..40 {
            c.upsert(&[point(i)]).unwrap();
        }
        let plan = Faults::new();
        let _g = install_faults(dir.path(), plan.clone());
        plan.arm(APPLY_FAULT, 1);
        let first = poisoned(c.upsert(&[point(40)]).unwrap_err(), name);
        assert!(
            first.contains("injected fault at db.apply"),
            "{name}: {first}"
        );
        assert_eq!(plan.fired(APPLY_FAULT), 1);
        assert!(c.poisoned().is_some_and(|p| p.contains("record")));

        // Reads go on from the state as it was.
        assert_eq!(c.len(), 40, "{name}");
        assert!(c.get(&[ExtId::Num(40)], false).unwrap()[0].is_none());
        assert!(c.get(&[ExtId::Num(3)], false).unwrap()[0].is_some());
        let sp = SearchParams::default();
        let hits = c
            .search(&point(5).vector, 3, &sp, None, false, false)
            .unwrap();
        assert!(!hits.is_empty(), "{name}");

        // Every write is refused, none is logged; so is a checkpoint.
        let last = c.last_seq();
        let del = [ExtId::Num(0)];
        let refused = [
            c.upsert(&[point(41)]).unwrap_err(),
            c.delete(Some(&del), None).unwrap_err(),
            c.set_payload(Some(&del), None, &json!({"x": 1}))
                .unwrap_err(),
            c.checkpoint().unwrap_err(),
        ];
        for e in refused {
            let text = poisoned(e, name);
            assert!(
                text.contains("injected fault"),
                "{name}: the first cause: {text}"
            );
        }
        assert_eq!(c.last_seq(), last, "{name}");
        assert_eq!(c.len(), 40, "{name}");

        // A flush (a server's shutdown) passes over it.
        db.flush().unwrap();
        // The close leaves the log whole; the reopen applies record 41.
        drop(c);
        db.close().unwrap();
        drop(db);
        let db = Database::open(dir.path(), opts()).unwrap();
        let c = db.collection("c").unwrap();
        assert!(c.poisoned().is_none());
        assert_eq!(c.len(), 41, "{name}");
        assert!(
            c.get(&[ExtId::Num(40)], false).unwrap()[0].is_some(),
            "{name}"
        );
        c.upsert(&[point(41)]).unwrap();
        c.delete(Some(&del), None).unwrap();
        assert_eq!(c.len(), 41, "{name}");
        c.checkpoint().unwrap();
    }
}
