//! The memory node over loopback TCP: verbs, doorbell counts, atomics under
//! contention, bad input, limits and a node that does not answer.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};
use vectide_core::Error;
use vectide_remote::frame::{Reply, Request, VERSION};
use vectide_remote::{
    Completion, MemoryNode, NodeLimits, RemoteMemory, Status, TcpMemory, TcpOptions, Verb,
};

fn node(size: u64) -> MemoryNode {
    MemoryNode::start("127.0.0.1:0", size, NodeLimits::default()).unwrap()
}

fn client(n: &MemoryNode) -> TcpMemory {
    TcpMemory::connect(&n.addr().to_string(), TcpOptions::default()).unwrap()
}

#[test]
fn verbs_and_doorbells_are_counted_exactly() {
    let n = node(1 << 20);
    let m = client(&n);
    let r = m.create_region("part", 4096).unwrap();
    assert_eq!(m.open_region("part").unwrap(), r);
    let before = m.counters().snapshot();
    m.write(r, 100, b"hello").unwrap();
    assert_eq!(m.read(r, 100, 5).unwrap(), b"hello");
    assert_eq!(m.cas(r, 8, 0, 42).unwrap(), 0);
    assert_eq!(
        m.cas(r, 8, 0, 43).unwrap(),
        42,
        "a failed CAS returns the word found"
    );
    assert_eq!(m.fetch_add(r, 8, 8).unwrap(), 42);
    let chain: Vec<Verb> = (0..10)
        .map(|i| Verb::Read {
            region: r.id,
            offset: i * 64,
            len: 64,
        })
        .collect();
    let d = m.counters().snapshot();
    let cs = m.post(&chain).unwrap();
    assert_eq!(cs.len(), 10);
    let s = m.counters().snapshot().since(&d);
    assert_eq!(
        (s.round_trips, s.work_requests),
        (1, 10),
        "one doorbell, one round trip"
    );
    // Exact frame bytes: 4 + 1 + 4 + 10 × 17 out, 4 + 2 + 4 + 10 × (5 + 64) in.
    assert_eq!((s.bytes_sent, s.bytes_received), (179, 700));
    assert_eq!(s.model_ns, m.counters().model().round_trip_ns(879));
    let all = m.counters().snapshot().since(&before);
    assert_eq!((all.round_trips, all.work_requests), (6, 15));
    assert!(m.create_region("part", 8).is_err(), "a name in use");
    assert!(m
        .open_region("nothing")
        .unwrap_err()
        .to_string()
        .contains("no region"));
    let (list, size) = m.regions().unwrap();
    assert_eq!((list.len(), size.used, size.capacity), (1, 4096, 1 << 20));
    m.drop_region("part").unwrap();
    assert!(m.read(r, 0, 1).is_err(), "a dropped region's id is gone");
}

#[test]
fn atomics_from_several_compute_nodes_lose_no_update() {
    let n = node(1 << 16);
    let m = client(&n);
    let r = m.create_region("ctr", 64).unwrap();
    std::thread::scope(|s| {
        for t in 0..4 {
            let addr = n.addr().to_string();
            s.spawn(move || {
                let c = TcpMemory::connect(&addr, TcpOptions::default()).unwrap();
                for _ in 0..300 {
                    c.fetch_add(r, 0, 1).unwrap();
                    // A CAS loop on the second word.
                    let mut cur = c
                        .read(r, 8, 8)
                        .map(|b| u64::from_le_bytes(b.try_into().unwrap()))
                        .unwrap();
                    loop {
                        let found = c.cas(r, 8, cur, cur + t + 1).unwrap();
                        if found == cur {
                            break;
                        }
                        cur = found;
                    }
                }
            });
        }
    });
    let words = m.read(r, 0, 16).unwrap();
    assert_eq!(u64::from_le_bytes(words[..8].try_into().unwrap()), 1200);
    assert_eq!(
        u64::from_le_bytes(words[8..].try_into().unwrap()),
        300 * (1 + 2 + 3 + 4)
    );
}

#[test]
fn a_failed_request_flushes_the_rest_of_its_chain() {
    let n = node(1 << 16);
    let m = client(&n);
    let r = m.create_region("r", 128).unwrap();
    let cs = m
        .post(&[
            Verb::Write {
                region: r.id,
                offset: 0,
                bytes: vec![1; 8],
            },
            Verb::Cas {
                region: r.id,
                offset: 4,
                expect: 0,
                new: 1,
            },
            Verb::Write {
                region: r.id,
                offset: 8,
                bytes: vec![2; 8],
            },
        ])
        .unwrap();
    assert_eq!(
        cs,
        vec![
            Completion::Done,
            Completion::Failed(Status::Unaligned),
            Completion::Failed(Status::Flushed)
        ]
    );
    assert_eq!(
        m.read(r, 8, 8).unwrap(),
        vec![0; 8],
        "the flushed WRITE did not run"
    );
    for bad in [
        Verb::Read {
            region: r.id,
            offset: 120,
            len: 9,
        },
        Verb::Read {
            region: r.id,
            offset: u64::MAX - 3,
            len: 8,
        },
        Verb::FetchAdd {
            region: r.id,
            offset: 128,
            add: 1,
        },
        Verb::Read {
            region: 999,
            offset: 0,
            len: 1,
        },
    ] {
        let e = m.post(std::slice::from_ref(&bad)).unwrap()[0]
            .clone()
            .into_data()
            .unwrap_err();
        assert!(matches!(e, Error::InvalidInput(_)), "{bad:?}: {e}");
    }
    assert!(m
        .create_region("huge", 1 << 20)
        .unwrap_err()
        .to_string()
        .contains("does not fit"));
    assert_eq!(m.read(r, 0, 8).unwrap(), vec![1; 8], "the node serves on");
}

/// Raw frames a client of ours never sends: the node answers with an error
/// (or closes), keeps serving others, and never crashes or hangs.
#[test]
fn bad_frames_get_an_error_and_change_nothing() {
    let n = node(1 << 16);
    let m = client(&n);
    let r = m.create_region("keep", 64).unwrap();
    m.write(r, 0, b"kept").unwrap();
    let raw = |bytes: &[u8]| -> Option<Reply> {
        let mut s = TcpStream::connect(n.addr()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(bytes).unwrap();
        let mut p = [0u8; 4];
        s.read_exact(&mut p).ok()?;
        let mut b = vec![0u8; u32::from_le_bytes(p) as usize];
        s.read_exact(&mut b).ok()?;
        Some(Reply::decode(&b).unwrap())
    };
    let err = |r: Option<Reply>| match r {
        Some(Reply::Error { message, .. }) => message,
        other => panic!("expected an error reply, got {other:?}"),
    };
    assert!(err(raw(&u32::MAX.to_le_bytes())).contains("frame"));
    assert!(err(raw(&[3, 0, 0, 0, 9, 9, 9])).contains("unknown request kind"));
    let post = Request::Post(vec![Verb::Write {
        region: r.id,
        offset: 0,
        bytes: b"lost".to_vec(),
    }])
    .encode();
    assert!(
        err(raw(&post)).contains("HELLO"),
        "a request before the HELLO"
    );
    assert!(err(raw(&Request::Hello {
        version: VERSION + 1
    }
    .encode()))
    .contains("version"));
    let mut hello = Request::Hello { version: VERSION }.encode();
    hello.extend_from_slice(&[2, 0, 0, 0, 6, 1]); // a cut POST after a good HELLO
    let mut s = TcpStream::connect(n.addr()).unwrap();
    s.write_all(&hello).unwrap();
    drop(s);
    assert_eq!(m.read(r, 0, 4).unwrap(), b"kept");
    let e = TcpMemory::connect(&n.addr().to_string(), TcpOptions::default());
    assert!(e.is_ok(), "the node serves new connections");
}

#[test]
fn connections_beyond_the_limit_are_refused_as_transient() {
    let limits = NodeLimits {
        max_connections: 1,
        ..NodeLimits::default()
    };
    let n = MemoryNode::start("127.0.0.1:0", 1024, limits).unwrap();
    let first = client(&n);
    first.create_region("x", 8).unwrap();
    let e = TcpMemory::connect(&n.addr().to_string(), TcpOptions::default())
        .err()
        .unwrap();
    assert!(e.is_transient(), "{e}");
    assert!(e.to_string().contains("connections"), "{e}");
}

#[test]
fn a_node_that_does_not_answer_is_unavailable_within_the_timeout() {
    // Accepts and never answers.
    let mute = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = mute.local_addr().unwrap();
    let keep = std::thread::spawn(move || {
        let held: Vec<_> = mute.incoming().take(1).collect();
        std::thread::sleep(Duration::from_secs(3));
        drop(held);
    });
    let t0 = Instant::now();
    let opts = TcpOptions {
        timeout: Duration::from_millis(300),
        ..TcpOptions::default()
    };
    let e = TcpMemory::connect(&addr.to_string(), opts).err().unwrap();
    assert!(
        e.is_transient() && e.to_string().contains("did not answer"),
        "{e}"
    );
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    keep.join().unwrap();
    // Nothing listens: refused at once, transient too.
    let e = TcpMemory::connect(&addr.to_string(), opts).err().unwrap();
    assert!(e.is_transient(), "{e}");
    // A node stopped under a connected client.
    let n = node(1024);
    let m = TcpMemory::connect(&n.addr().to_string(), opts).unwrap();
    let r = m.create_region("r", 8).unwrap();
    drop(n);
    let t0 = Instant::now();
    assert!(m.read(r, 0, 8).unwrap_err().is_transient());
    assert!(t0.elapsed() < Duration::from_secs(2));
}

#[test]
fn the_local_transport_speaks_the_same_frames() {
    use std::sync::Arc;
    use vectide_remote::{LocalMemory, NetModel, Regions};
    let regions = Arc::new(Regions::new(1 << 12));
    let a = LocalMemory::local(Arc::clone(&regions), NetModel::default());
    let b = LocalMemory::local(regions, NetModel::default());
    let r = a.create_region("shared", 64).unwrap();
    b.write(r, 0, b"from b").unwrap();
    assert_eq!(a.read(r, 0, 6).unwrap(), b"from b");
    let s = a.counters().snapshot();
    // HELLO, CREATE and READ: 3 round trips on a's counters.
    assert_eq!((s.round_trips, s.work_requests), (3, 1));
}
