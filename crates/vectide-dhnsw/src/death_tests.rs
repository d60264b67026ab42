//! A writer that dies at any step of an insert that rebuilds a partition
//! and moves labels to other partitions (upserts), or of a delete, leaves a
//! region another compute node can repair and go on with: the writer's transport stops answering after N work requests
//! (for every N up to the whole operation), the writer is dropped, and a
//! second compute node, attached before, runs `maintain` (which takes over
//! the partitions left held once they stay so past the take-over time and
//! puts their labels right). Afterwards every label the writer had
//! acknowledged is there with its vector, a delete it had acknowledged
//! stays deleted, what it had not acknowledged is either whole or absent,
//! and the region's structure (label map, partitions, counts) is whole.

use crate::state::DHnsw;
use crate::test_transport::{point, rows, writer_params, Wrapped};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use vectide_core::params::params_of;
use vectide_core::{Error, Metric, ParamValue, SearchParams, VectorIndex};
use vectide_remote::{MemoryNode, NodeLimits, RemoteMemory, TcpMemory, Verb};

const DIM: usize = 4;
/// A moved label's new vector is label `l + MOVE`'s.
const MOVE: u64 = 5000;

/// A transport that runs `left` more work requests and then stops
/// answering (a compute node that died).
fn dying(addr: &str, left: Arc<AtomicI64>) -> Wrapped {
    Wrapped {
        inner: TcpMemory::connect(addr, Default::default()).unwrap(),
        post: Box::new(move |inner: &TcpMemory, wrs: &[Verb]| {
            let now = left.fetch_sub(wrs.len() as i64, Ordering::AcqRel);
            if now >= wrs.len() as i64 {
                return inner.post(wrs);
            }
            // The requests it got out before it died, then nothing.
            if now > 0 {
                inner.post(&wrs[..now as usize])?;
            }
            Err(Error::unavailable("the compute node died"))
        }),
    }
}

/// A second compute node attached to `region` (10 ms timeouts: a stopped
/// writer's partitions are taken over after 60 ms), no LRU.
fn attached(addr: &str, region: &str) -> Box<dyn VectorIndex> {
    (crate::DESCRIPTOR.create)(
        DIM,
        Metric::L2,
        &params_of([
            ("memnode", ParamValue::Str(addr.to_string())),
            ("region", ParamValue::Str(region.into())),
            ("timeout_ms", ParamValue::Int(10)),
            ("threads", ParamValue::Int(1)),
            ("cache_partitions", ParamValue::Int(0)),
        ]),
    )
    .unwrap()
}

/// One run, the writer dying after `budget` work requests of its insert
/// and delete; returns the requests they took when it did not die, and the
/// violations found.
fn run(budget: i64) -> (i64, Vec<String>) {
    let node = MemoryNode::start("127.0.0.1:0", 64 << 20, NodeLimits::default()).unwrap();
    let addr = node.addr().to_string();
    let left = Arc::new(AtomicI64::new(i64::MAX));
    let transport = Arc::new(dying(&addr, Arc::clone(&left)));
    let params = writer_params("dead", 2);
    let writer = DHnsw::over(DIM, Metric::L2, &params, transport).unwrap();
    let first: Vec<u64> = (0..120).collect();
    writer.insert(1, &first, &rows(&first)).unwrap();
    let other = attached(&addr, "dead");
    let fresh: Vec<u64> = (500..520).collect();
    // Upserts whose new vectors (another label's) land elsewhere: their old
    // nodes are tombstoned after the new ones are published.
    let moved: Vec<u64> = (10..16).collect();
    let gone: Vec<u64> = vec![3, 40, 77, 501];
    let mut batch = fresh.clone();
    batch.extend(&moved);
    let mut vs = rows(&fresh);
    for &l in &moved {
        vs.extend(point(l + MOVE));
    }
    left.store(budget, Ordering::Release);
    let inserted = writer.insert(2, &batch, &vs).is_ok();
    let deleted = inserted && writer.delete(3, &gone).is_ok();
    let used = i64::MAX - left.load(Ordering::Acquire).max(0);
    let used = if budget == i64::MAX { used } else { 0 };
    drop(writer);
    // The partitions the writer left held: seen, then taken over once the
    // take-over time (six of the other node's 10 ms timeouts) has passed.
    let mut bad = Vec::new();
    for _ in 0..2 {
        if let Err(e) = other.maintain() {
            bad.push(format!("maintain: {e}"));
        }
        std::thread::sleep(std::time::Duration::from_millis(70));
    }
    other.maintain().unwrap();
    let check = |l: u64, must: Option<bool>| -> Option<String> {
        match (other.get(l), must) {
            (Ok(Some(v)), Some(true) | None) if v == point(l) => None,
            (Ok(None), Some(false) | None) => None,
            (got, _) => Some(format!("label {l}: {got:?}, expected present {must:?}")),
        }
    };
    for &l in &moved {
        match other.get(l) {
            Ok(Some(v)) if v == point(l + MOVE) => {}
            Ok(Some(v)) if v == point(l) && !inserted => {}
            got => bad.push(format!(
                "moved label {l}: {got:?} (upsert acknowledged: {inserted})"
            )),
        }
    }
    for &l in first.iter().filter(|l| !moved.contains(l)) {
        let must = if deleted && gone.contains(&l) {
            Some(false)
        } else if gone.contains(&l) {
            None
        } else {
            Some(true)
        };
        bad.extend(check(l, must));
    }
    for &l in &fresh {
        let must = match (inserted, deleted && gone.contains(&l)) {
            (_, true) => Some(false),
            (true, false) if !gone.contains(&l) => Some(true),
            _ => None,
        };
        bad.extend(check(l, must));
    }
    match other.check_structure() {
        Ok(v) => bad.extend(v),
        Err(e) => bad.push(format!("check: {e}")),
    }
    let every = SearchParams {
        nprobe: Some(2),
        ef: Some(64),
        ..SearchParams::default()
    };
    if deleted {
        let qs = rows(&gone);
        match other.search_batch(&qs, 3, &every, None) {
            Ok(found) => {
                for n in found.iter().flatten() {
                    if gone.contains(&n.id) {
                        bad.push(format!("deleted {} answered", n.id));
                    }
                }
            }
            Err(e) => bad.push(format!("search: {e}")),
        }
    }
    (used, bad)
}

#[test]
fn a_writer_dying_at_any_step_leaves_a_region_another_node_repairs() {
    let (steps, bad) = run(i64::MAX);
    assert!(bad.is_empty(), "no death: {bad:?}");
    assert!(steps > 20, "the insert and delete took {steps} requests");
    let mut deaths = 0;
    for budget in (0..steps).step_by((steps as usize / 40).max(1)) {
        let (_, bad) = run(budget);
        assert!(
            bad.is_empty(),
            "dying after {budget} of {steps} requests: {bad:?}"
        );
        deaths += 1;
    }
    assert!(deaths >= 20, "{deaths} death points");
}

/// The window the stepped deaths above may miss: a writer that stops right
/// after publishing an upsert's new nodes, before it tombstones the old
/// ones, leaves them live though no label names them. Another compute
/// node's `maintain`, seeing the header's owed word stand still for the
/// take-over time, reconciles every partition: the old nodes are
/// tombstoned, searches no longer answer a label at its old vector, and
/// the structure is whole.
#[test]
fn old_nodes_a_stopped_writer_owed_are_tombstoned_by_maintain() {
    let node = MemoryNode::start("127.0.0.1:0", 64 << 20, NodeLimits::default()).unwrap();
    let addr = node.addr().to_string();
    let transport = Arc::new(dying(&addr, Arc::new(AtomicI64::new(i64::MAX))));
    let writer = DHnsw::over(DIM, Metric::L2, &writer_params("owed", 2), transport).unwrap();
    let first: Vec<u64> = (0..120).collect();
    writer.insert(1, &first, &rows(&first)).unwrap();
    let other = attached(&addr, "owed");
    let moved: Vec<u64> = (10..16).collect();
    let vs: Vec<f32> = moved.iter().flat_map(|&l| point(l + MOVE)).collect();
    crate::switches::STOP_BEFORE_TOMBSTONES.set(true);
    let stopped = writer.insert(2, &moved, &vs);
    crate::switches::STOP_BEFORE_TOMBSTONES.set(false);
    assert!(stopped.is_err());
    drop(writer);
    let every = SearchParams {
        nprobe: Some(2),
        ef: Some(64),
        ..SearchParams::default()
    };
    let stale = |idx: &dyn VectorIndex| -> usize {
        let found = idx.search_batch(&rows(&moved), 1, &every, None).unwrap();
        found
            .iter()
            .zip(&moved)
            .filter(|(f, &l)| f.first().is_some_and(|n| n.id == l && n.distance < 1e-3))
            .count()
    };
    assert!(
        !other.check_structure().unwrap().is_empty() && stale(&*other) > 0,
        "the stopped writer left old nodes live"
    );
    for _ in 0..3 {
        other.maintain().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(70));
    }
    let left = other.check_structure().unwrap();
    assert!(left.is_empty(), "{left:?}");
    assert_eq!(stale(&*other), 0, "a label answered at its old vector");
    for &l in &moved {
        assert_eq!(other.get(l).unwrap(), Some(point(l + MOVE)));
    }
    assert_eq!(other.len(), 120);
}
