//! Readers never see a half-published partition. A writer's doorbells are
//! torn into 8-byte WRITEs run one at a time (RDMA does not promise more
//! than that of a WRITE another node reads meanwhile), and between every
//! two of them a second compute node, attached to the region over TCP,
//! searches every partition. Each of its searches must either answer with
//! labels the writer has written or find a partition busy (a transient
//! error); none may fail on what it read or answer a label never written.
//! A reader has two defences against a torn entry: the partitions' state
//! check (it reads nothing a writer is inside of) and the entries' rebuild
//! intents (a rebuild's new entry is whole in the intent before its fields
//! are written). With both switched off, torn entries are read and
//! searches fail. (The intents alone are shown necessary by the crash kit's
//! mutation check, `tests/crash.rs`.)

use crate::state::DHnsw;
use crate::test_transport::{rows, writer_params, Wrapped};
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use vectide_core::params::params_of;
use vectide_core::{Metric, ParamValue, Result, SearchParams, VectorIndex};
use vectide_remote::{Completion, MemoryNode, NodeLimits, RemoteMemory, TcpMemory, Verb};

const DIM: usize = 4;

type Hook = Box<dyn Fn() + Send + Sync>;

/// A transport that, once armed, runs a chain one request at a time, each
/// WRITE as 8-byte pieces, and calls the hook after each.
fn tearing(addr: &str, hook: Arc<OnceLock<Hook>>, armed: Arc<AtomicBool>) -> Wrapped {
    let one = move |inner: &TcpMemory, wr: Verb| -> Result<Completion> {
        let mut c = inner.post(std::slice::from_ref(&wr))?;
        if let Some(h) = hook.get() {
            h();
        }
        Ok(c.pop().expect("one completion"))
    };
    Wrapped {
        inner: TcpMemory::connect(addr, Default::default()).unwrap(),
        post: Box::new(move |inner: &TcpMemory, wrs: &[Verb]| {
            if !armed.load(Ordering::Acquire) {
                return inner.post(wrs);
            }
            let mut out = Vec::with_capacity(wrs.len());
            for wr in wrs {
                let c = match wr {
                    Verb::Write {
                        region,
                        offset,
                        bytes,
                    } => {
                        let mut last = Completion::Done;
                        for (i, piece) in bytes.chunks(8).enumerate() {
                            last = one(
                                inner,
                                Verb::Write {
                                    region: *region,
                                    offset: offset + 8 * i as u64,
                                    bytes: piece.to_vec(),
                                },
                            )?;
                            if last != Completion::Done {
                                break;
                            }
                        }
                        last
                    }
                    other => one(inner, other.clone())?,
                };
                out.push(c);
            }
            Ok(out)
        }),
    }
}

#[derive(Default)]
struct Seen {
    answered: usize,
    busy: usize,
    bad: Vec<String>,
}

/// One run: the writer's inserts (through gaps and rebuilds) and deletes,
/// torn; returns what the reader saw between the pieces.
fn run(trust_torn: bool) -> Seen {
    let node = MemoryNode::start("127.0.0.1:0", 64 << 20, NodeLimits::default()).unwrap();
    let addr = node.addr().to_string();
    let hook_slot: Arc<OnceLock<Hook>> = Arc::new(OnceLock::new());
    let armed = Arc::new(AtomicBool::new(false));
    let transport = Arc::new(tearing(&addr, Arc::clone(&hook_slot), Arc::clone(&armed)));
    let params = writer_params("torn", 3);
    let writer = DHnsw::over(DIM, Metric::L2, &params, transport).unwrap();
    let first: Vec<u64> = (0..150).collect();
    writer.insert(1, &first, &rows(&first)).unwrap();
    let written: Arc<Mutex<HashSet<u64>>> = Arc::new(Mutex::new(first.iter().copied().collect()));
    let reader: Arc<Box<dyn VectorIndex>> = Arc::new(
        (crate::DESCRIPTOR.create)(
            DIM,
            Metric::L2,
            &params_of([
                ("memnode", ParamValue::Str(addr.clone())),
                ("region", ParamValue::Str("torn".into())),
                ("timeout_ms", ParamValue::Int(5)),
                ("cache_partitions", ParamValue::Int(0)),
                ("threads", ParamValue::Int(1)),
            ]),
        )
        .unwrap(),
    );
    let seen = Arc::new(Mutex::new(Seen::default()));
    let queries = rows(&[3, 100, 200, 1001, 1010, 1030]);
    {
        let (reader, seen, written) =
            (Arc::clone(&reader), Arc::clone(&seen), Arc::clone(&written));
        let every = SearchParams {
            nprobe: Some(3),
            ef: Some(16),
            ..SearchParams::default()
        };
        let hook: Hook = Box::new(move || {
            let r = reader.search_batch(&queries, 3, &every, None);
            let mut s = seen.lock().unwrap();
            match r {
                Ok(found) => {
                    s.answered += 1;
                    let known = written.lock().unwrap();
                    for n in found.iter().flatten() {
                        if !known.contains(&n.id) {
                            s.bad.push(format!("label {} was never written", n.id));
                        }
                    }
                }
                Err(e) if e.is_transient() => s.busy += 1,
                Err(e) => s.bad.push(e.to_string()),
            }
        });
        assert!(hook_slot.set(hook).is_ok());
    }
    crate::switches::TRUST_TORN.set(trust_torn);
    crate::switches::IGNORE_INTENTS.set(trust_torn);
    armed.store(true, Ordering::Release);
    for b in 0..5u64 {
        let ls: Vec<u64> = (1000 + 6 * b..1006 + 6 * b).collect();
        written.lock().unwrap().extend(&ls);
        writer.insert(2 + b, &ls, &rows(&ls)).unwrap();
    }
    writer.delete(20, &[5, 6, 1003]).unwrap();
    armed.store(false, Ordering::Release);
    crate::switches::TRUST_TORN.set(false);
    crate::switches::IGNORE_INTENTS.set(false);
    assert!(
        writer
            .stats()
            .unwrap()
            .extra_value("partition_rebuilds")
            .unwrap()
            > 0.0,
        "the inserts rebuilt a partition"
    );
    let s = std::mem::take(&mut *seen.lock().unwrap());
    s
}

#[test]
fn readers_between_every_8_byte_write_never_see_a_half_published_partition() {
    let s = run(false);
    assert!(
        s.bad.is_empty(),
        "{} bad reads: {:?}",
        s.bad.len(),
        &s.bad[..s.bad.len().min(3)]
    );
    assert!(s.answered >= 10, "{} answered, {} busy", s.answered, s.busy);
    assert!(s.busy > 0, "a reader met a writer inside a partition");
    // The mutation check: reads taken whatever the state, entries read
    // without their intents, go wrong.
    let t = run(true);
    assert!(
        !t.bad.is_empty(),
        "torn reads trusted went unnoticed ({} answered)",
        t.answered
    );
}
