//! d-HNSW end to end: built from a first batch, searched in every fetch
//! mode against a brute-force oracle, inserted into (through the gaps and
//! past them: partition rebuilds), deleted from, saved and opened again,
//! over the in-process memory node and over TCP to a memory node.

#[path = "../../test-support/oracle.rs"]
mod oracle;

use vectide_core::params::params_of;
use vectide_core::{Metric, ParamValue, Params, SearchParams, VectorIndex};
use vectide_dhnsw::DHnsw;
use vectide_remote::{MemoryNode, NodeLimits};

const DIM: usize = 16;

fn index(extra: &[(&str, ParamValue)]) -> Box<dyn VectorIndex> {
    let mut p: Params = params_of([
        ("partition_points", ParamValue::Int(250)),
        ("threads", ParamValue::Int(2)),
    ]);
    for (k, v) in extra {
        p.insert(k.to_string(), v.clone());
    }
    (vectide_dhnsw::DESCRIPTOR.create)(DIM, Metric::L2, &p).unwrap()
}

fn ids(v: &[vectide_core::Neighbor]) -> Vec<u64> {
    v.iter().map(|n| n.id).collect()
}

fn recall(idx: &dyn VectorIndex, live: &[(u64, Vec<f32>)], qs: &[f32], sp: &SearchParams) -> f64 {
    let got = idx.search_batch(qs, 10, sp, None).unwrap();
    let found: Vec<Vec<u64>> = got.iter().map(|r| ids(r)).collect();
    let truth: Vec<Vec<u64>> = qs
        .chunks(DIM)
        .map(|q| oracle::brute_force(Metric::L2, live, q, 10))
        .collect();
    oracle::recall(&found, &truth)
}

#[test]
fn builds_searches_updates_and_reopens() {
    let n = 2000;
    let data = oracle::clustered(n + 600, DIM, 12, 7);
    let labels: Vec<u64> = (0..n as u64).map(|i| 10_000 + i).collect();
    let idx = index(&[]);
    assert!(idx
        .search(&data[..DIM], 5, &SearchParams::default(), None)
        .unwrap()
        .is_empty());
    idx.insert(1, &labels, &data[..n * DIM]).unwrap();
    assert_eq!(idx.len(), n);
    let st = idx.stats().unwrap();
    assert_eq!(st.extra_value("partitions"), Some(8.0));
    let mut live: Vec<(u64, Vec<f32>)> = labels
        .iter()
        .zip(data.chunks(DIM))
        .map(|(&l, v)| (l, v.to_vec()))
        .collect();
    let qs = &data[n * DIM..(n + 100) * DIM];
    let all = SearchParams {
        nprobe: Some(8),
        ef: Some(64),
        ..SearchParams::default()
    };
    let r = recall(&*idx, &live, qs, &all);
    assert!(r > 0.97, "every partition probed: recall {r}");
    let r5 = recall(&*idx, &live, qs, &SearchParams::default());
    assert!(r5 > 0.85, "b = 5 of 8: recall {r5}");
    // A stored vector reads back.
    assert_eq!(
        idx.get(10_003).unwrap().unwrap(),
        data[3 * DIM..4 * DIM].to_vec()
    );
    assert_eq!(idx.get(1).unwrap(), None);
    // Inserts fill the gaps and then rebuild partitions; deletes hide.
    let new: Vec<u64> = (0..500u64).map(|i| 50_000 + i).collect();
    let nv = &data[(n + 100) * DIM..(n + 600) * DIM];
    for (c, (l, v)) in new.chunks(50).zip(nv.chunks(50 * DIM)).enumerate() {
        idx.insert(2 + c as u64, l, v).unwrap();
    }
    live.extend(
        new.iter()
            .zip(nv.chunks(DIM))
            .map(|(&l, v)| (l, v.to_vec())),
    );
    let gone: Vec<u64> = labels.iter().step_by(3).copied().collect();
    assert_eq!(idx.delete(20, &gone).unwrap(), gone.len());
    assert_eq!(idx.delete(21, &gone).unwrap(), 0);
    live.retain(|(l, _)| !gone.contains(l));
    assert_eq!(idx.len(), live.len());
    let st = idx.stats().unwrap();
    assert!(
        st.extra_value("partition_rebuilds").unwrap() > 0.0,
        "{st:?}"
    );
    let cs = idx.check_structure().unwrap();
    assert!(cs.is_empty(), "{:?}", &cs[..cs.len().min(4)]);
    let r = recall(&*idx, &live, qs, &all);
    assert!(r > 0.95, "after inserts and deletes: recall {r}");
    // Each new point is found as its own nearest neighbour.
    for (l, v) in live.iter().rev().take(50) {
        let hit = idx.search(v, 1, &all, None).unwrap();
        assert_eq!(hit[0].id, *l);
    }
    // Every fetch mode answers the same queries alike.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("i.dhnsw");
    idx.save(&path).unwrap();
    assert_eq!(idx.durable_seq(), 21);
    let d = &vectide_dhnsw::DESCRIPTOR;
    assert!((d.detect)(&path));
    let rows = (d.inspect)(&path).unwrap();
    assert!(
        rows.iter().any(|r| r.0 == "partitions" && r.1 == "8"),
        "{rows:?}"
    );
    let base = idx.search_batch(qs, 10, &all, None).unwrap();
    for mode in ["doorbell", "no-doorbell", "naive"] {
        for pipeline in [true, false] {
            let p = params_of([
                ("fetch", ParamValue::Str(mode.into())),
                ("pipeline", ParamValue::Bool(pipeline)),
                ("doorbell_reads", ParamValue::Int(2)),
            ]);
            let back = (d.open)(&path, &p).unwrap();
            assert_eq!((back.len(), back.durable_seq()), (live.len(), 21));
            let got = back.search_batch(qs, 10, &all, None).unwrap();
            for (a, b) in got.iter().zip(&base) {
                assert_eq!(ids(a), ids(b), "{mode}, pipeline {pipeline}");
            }
            let st = back.stats().unwrap();
            let rt = st.round_trips as f64;
            let parts = 8.0;
            match mode {
                // HELLO + create + upload, then the table's READ and 8
                // partitions in chains of 2.
                "doorbell" => assert!(rt <= 3.0 + 2.0 + 1.0 + parts / 2.0, "{mode}: {rt}"),
                "no-doorbell" => assert!(rt >= parts, "{mode}: {rt}"),
                _ => assert!(rt > 100.0 * parts, "{mode}: a READ per node: {rt}"),
            }
        }
    }
    assert!((d.open)(&path, &params_of([("m", ParamValue::Int(8))])).is_err());
}

#[test]
fn over_tcp_to_a_memory_node() {
    let node = MemoryNode::start("127.0.0.1:0", 256 << 20, NodeLimits::default()).unwrap();
    let addr = node.addr().to_string();
    let n = 1200;
    let data = oracle::clustered(n + 50, DIM, 6, 3);
    let labels: Vec<u64> = (0..n as u64).collect();
    let idx = index(&[
        ("memnode", ParamValue::Str(addr.clone())),
        ("region", ParamValue::Str("t1".into())),
    ]);
    idx.insert(1, &labels, &data[..n * DIM]).unwrap();
    let live: Vec<(u64, Vec<f32>)> = labels
        .iter()
        .zip(data.chunks(DIM))
        .map(|(&l, v)| (l, v.to_vec()))
        .collect();
    let qs = &data[n * DIM..];
    let r = recall(
        &*idx,
        &live,
        qs,
        &SearchParams {
            nprobe: Some(5),
            ..Default::default()
        },
    );
    assert!(r > 0.9, "recall {r}");
    let dh = idx.as_any().downcast_ref::<DHnsw>().unwrap();
    assert_eq!(dh.region_name().as_deref(), Some("t1"));
    let c = dh.counters();
    assert!(c.round_trips > 0 && c.bytes_received > 0 && c.model_ns > 0);
    // A second compute node naming the same region attaches to it: the
    // label map read back, the same answers; its writes are refused
    // (only the builder writes), and nothing changes.
    let again = index(&[
        ("memnode", ParamValue::Str(addr.clone())),
        ("region", ParamValue::Str("t1".into())),
        ("cache_bytes", ParamValue::Int(200_000)),
    ]);
    assert_eq!(again.len(), n);
    let sp = SearchParams {
        nprobe: Some(5),
        ..Default::default()
    };
    let (a, b) = (
        idx.search_batch(qs, 10, &sp, None).unwrap(),
        again.search_batch(qs, 10, &sp, None).unwrap(),
    );
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(ids(x), ids(y));
    }
    assert_eq!(again.get(7).unwrap(), idx.get(7).unwrap());
    assert!(again.check_structure().unwrap().is_empty());
    // The attached node writes too: an upsert of label 1 (label 0's vector)
    // and a delete of label 2, seen from the builder at once.
    again.insert(1, &[1], &data[..DIM]).unwrap();
    assert_eq!(again.delete(2, &[2]).unwrap(), 1);
    assert_eq!(idx.get(1).unwrap().unwrap(), data[..DIM].to_vec());
    assert_eq!(idx.get(2).unwrap(), None);
    assert!(!idx.contains(2).unwrap() && idx.contains(1).unwrap());
    assert_eq!((again.len(), idx.len()), (n - 1, n - 1));
    let hit = idx.search(&data[..DIM], 2, &sp, None).unwrap();
    assert_eq!(
        {
            let mut v = ids(&hit);
            v.sort_unstable();
            v
        },
        vec![0, 1],
        "label 1 answered once, at its new place"
    );
    assert!(idx.check_structure().unwrap().is_empty());
    // The builder goes on writing: gap inserts whose back-links name nodes
    // the attached node's table does not count yet (skipped, not damage),
    // then enough rows that automatic K partitions the index afresh into
    // `t1~N`. A node attaching then finds the newest region and every
    // label; the first attached node, left on a dropped region, moves to
    // the new one by itself.
    let more = oracle::clustered(3000, DIM, 6, 11);
    idx.insert(2, &(5000..5040).collect::<Vec<u64>>(), &more[..40 * DIM])
        .unwrap();
    assert_eq!(
        again.search_batch(qs, 10, &sp, None).unwrap().len(),
        qs.len() / DIM
    );
    // The attached node reads the table again each batch: the new points
    // are found there too, each as its own nearest.
    let every = SearchParams {
        nprobe: Some(64),
        ef: Some(64),
        ..Default::default()
    };
    let hits = again
        .search_batch(&more[..40 * DIM], 1, &every, None)
        .unwrap();
    let found: Vec<u64> = hits.iter().map(|h| h[0].id).collect();
    assert_eq!(found, (5000..5040).collect::<Vec<u64>>());
    idx.insert(3, &(6000..9000).collect::<Vec<u64>>(), &more)
        .unwrap();
    let moved = idx
        .as_any()
        .downcast_ref::<DHnsw>()
        .unwrap()
        .region_name()
        .unwrap();
    assert!(moved.starts_with("t1~"), "{moved}");
    let third = index(&[
        ("memnode", ParamValue::Str(addr.clone())),
        ("region", ParamValue::Str("t1".into())),
    ]);
    assert_eq!(third.len(), n - 1 + 3040);
    assert!(third.check_structure().unwrap().is_empty());
    // The first attached node follows the index to its new region by
    // itself the first time its region is found gone.
    assert_eq!(
        again.search_batch(qs, 10, &sp, None).unwrap().len(),
        qs.len() / DIM
    );
    assert_eq!(
        again
            .as_any()
            .downcast_ref::<DHnsw>()
            .unwrap()
            .region_name(),
        Some(moved.clone())
    );
    drop(third);
    // Its LRU keeps to the RAM budget it was given.
    let st = again.stats().unwrap();
    let (held, budget) = (
        st.extra_value("cache_bytes").unwrap(),
        st.extra_value("cache_budget_bytes").unwrap(),
    );
    assert!(
        held > 0.0 && held <= budget && budget == 200_000.0,
        "{held} of {budget}"
    );
    // A region of another dimension, metric or format, or one holding no
    // d-hnsw index: a typed error naming the problem, at creation.
    let attach = |dim: usize, metric: Metric, region: &str| {
        (vectide_dhnsw::DESCRIPTOR.create)(
            dim,
            metric,
            &params_of([
                ("memnode", ParamValue::Str(addr.clone())),
                ("region", ParamValue::Str(region.into())),
            ]),
        )
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default()
    };
    assert!(
        attach(DIM + 1, Metric::L2, "t1").contains("holds a 16-d l2 index, this one is 17-d l2")
    );
    assert!(attach(DIM, Metric::Ip, "t1").contains("this one is 16-d ip"));
    let mem = vectide_remote::TcpMemory::connect(&addr, Default::default()).unwrap();
    let head = {
        use vectide_remote::RemoteMemory;
        let t1 = mem.open_region(&moved).unwrap();
        let mut h = mem.read(t1, 0, 256).unwrap();
        h[12..16].copy_from_slice(&4u32.to_le_bytes());
        let v2 = mem.create_region("v2", t1.size).unwrap();
        mem.write(v2, 0, &h).unwrap();
        mem.create_region("zeros", 4096).unwrap();
        mem.create_region("tiny", 16).unwrap();
        h
    };
    assert_eq!(&head[..8], b"VTDHNSW\0");
    assert!(attach(DIM, Metric::L2, "v2").contains("format is version 4"));
    assert!(attach(DIM, Metric::L2, "zeros").contains("holds no d-hnsw index"));
    assert!(attach(DIM, Metric::L2, "tiny").contains("too few for a d-hnsw index"));
    for r in ["v2", "zeros", "tiny"] {
        vectide_remote::RemoteMemory::drop_region(&mem, r).unwrap();
    }
    // A region named for the index (auto) goes back to the node when the
    // index closes; one the caller named stays.
    let names = || -> Vec<String> {
        let mem = vectide_remote::TcpMemory::connect(&addr, Default::default()).unwrap();
        let (regions, _) = vectide_remote::RemoteMemory::regions(&mem).unwrap();
        regions.into_iter().map(|r| r.name).collect()
    };
    let auto = index(&[("memnode", ParamValue::Str(addr.clone()))]);
    auto.insert(1, &labels[..300], &data[..300 * DIM]).unwrap();
    let name = auto
        .as_any()
        .downcast_ref::<DHnsw>()
        .unwrap()
        .region_name()
        .unwrap();
    assert!(names().contains(&name), "{name} while open");
    drop(auto);
    drop(again);
    drop(idx);
    assert_eq!(
        names(),
        vec![moved.clone()],
        "{name} given back, {moved} kept"
    );
    // A node that is gone: a transient error, not a hang.
    drop(node);
    let dead = (vectide_dhnsw::DESCRIPTOR.create)(
        DIM,
        Metric::L2,
        &params_of([
            ("memnode", ParamValue::Str("127.0.0.1:1".into())),
            ("timeout_ms", ParamValue::Int(500)),
        ]),
    );
    let e = dead.expect_err("no node at port 1");
    assert!(e.is_transient(), "{e}");
}

/// Inserts far beyond the first build: gaps fill, partitions are rebuilt at
/// the region's end, and when one does not fit the index moves to a new
/// region laid out afresh (the old one dropped). Nothing is lost and the
/// region does not keep what rebuilds left behind.
#[test]
fn growth_rebuilds_partitions_and_moves_to_a_larger_region() {
    // K fixed at 3: automatic K would partition afresh as the index grows.
    let idx = index(&[
        ("partition_points", ParamValue::Int(100)),
        ("partitions", ParamValue::Int(3)),
        ("gap", ParamValue::Float(0.0)),
    ]);
    let n = 3300;
    let data = oracle::clustered(n, DIM, 8, 11);
    let labels: Vec<u64> = (0..n as u64).collect();
    idx.insert(1, &labels[..300], &data[..300 * DIM]).unwrap();
    let name0 = idx.params()["region"].clone();
    for (c, (l, v)) in labels[300..]
        .chunks(30)
        .zip(data[300 * DIM..].chunks(30 * DIM))
        .enumerate()
    {
        idx.insert(2 + c as u64, l, v).unwrap();
        if c % 10 == 0 {
            // Churn: delete some of what is there, so rebuilds drop tombstones.
            let gone: Vec<u64> = l.iter().step_by(5).copied().collect();
            idx.delete(2 + c as u64, &gone).unwrap();
        }
    }
    let st = idx.stats().unwrap();
    assert!(
        st.extra_value("partition_rebuilds").unwrap() > 10.0,
        "{st:?}"
    );
    assert!(st.extra_value("region_relayouts").unwrap() >= 1.0, "{st:?}");
    assert_ne!(idx.params()["region"], name0, "moved to a new region");
    let used = st.extra_value("region_used_bytes").unwrap();
    let rec = (16 + 4 * 32 + 4 * DIM) as f64;
    assert!(
        used < 4.0 * rec * idx.len() as f64 + 65_536.0,
        "{used} bytes handed out for {} points",
        idx.len()
    );
    assert!(idx.check_structure().unwrap().is_empty());
    for (l, v) in labels.iter().zip(data.chunks(DIM)).rev().take(200) {
        if idx.contains(*l).unwrap() {
            let hit = idx
                .search(
                    v,
                    1,
                    &SearchParams {
                        nprobe: Some(8),
                        ef: Some(64),
                        ..Default::default()
                    },
                    None,
                )
                .unwrap();
            assert_eq!(hit[0].id, *l);
        }
    }
}

/// Automatic K follows the live count: an index whose first batch made two
/// partitions is partitioned afresh each time it outgrows its K twice over
/// (upserts of live labels and deletes go on meanwhile), and searches find
/// what a brute-force scan of the live set finds.
#[test]
fn automatic_partitions_follow_growth() {
    let idx = index(&[("partition_points", ParamValue::Int(100))]);
    let n = 2400;
    let data = oracle::clustered(n + 100, DIM, 8, 5);
    let (rows, qs) = data.split_at(n * DIM);
    let mut live: std::collections::BTreeMap<u64, Vec<f32>> = Default::default();
    let mut seq = 1;
    let put = |live: &mut std::collections::BTreeMap<u64, Vec<f32>>,
               idx: &dyn VectorIndex,
               labels: &[u64],
               from: usize,
               seq: u64| {
        let v = &rows[from * DIM..(from + labels.len()) * DIM];
        idx.insert(seq, labels, v).unwrap();
        for (l, row) in labels.iter().zip(v.chunks(DIM)) {
            live.insert(*l, row.to_vec());
        }
    };
    put(&mut live, &*idx, &(0..150).collect::<Vec<u64>>(), 0, seq);
    let st = idx.stats().unwrap();
    assert_eq!(st.extra_value("partitions"), Some(2.0));
    let name0 = idx.params()["region"].clone();
    let mut next = 150u64;
    while (next as usize) < n {
        seq += 1;
        let labels: Vec<u64> = (next..next + 50).collect();
        put(&mut live, &*idx, &labels, next as usize, seq);
        next += 50;
        // A live label upserted with another row, and one deleted.
        seq += 1;
        put(&mut live, &*idx, &[next / 3], next as usize - 1, seq);
        seq += 1;
        idx.delete(seq, &[next / 2 + 1]).unwrap();
        live.remove(&(next / 2 + 1));
    }
    let st = idx.stats().unwrap();
    assert_eq!(st.extra_value("partitions"), Some(16.0), "{st:?}");
    assert_eq!(st.extra_value("repartitions"), Some(3.0), "{st:?}");
    assert_ne!(idx.params()["region"], name0, "a new region each time");
    assert_eq!(idx.len(), live.len());
    assert!(idx.check_structure().unwrap().is_empty());
    let live: Vec<(u64, Vec<f32>)> = live.into_iter().collect();
    let r = recall(
        &*idx,
        &live,
        qs,
        &SearchParams {
            nprobe: Some(4),
            ef: Some(64),
            ..Default::default()
        },
    );
    assert!(r > 0.9, "recall {r}");
    // A replay of the first batch (other rows under its labels) changes
    // nothing: the labels kept their sequence numbers through the moves.
    let before = idx.len();
    idx.insert(1, &[5, 6], &rows[1000 * DIM..1002 * DIM])
        .unwrap();
    assert_eq!(idx.len(), before);
    let own = &live.iter().find(|(l, _)| *l == 5).unwrap().1;
    let hit = idx.search(own, 1, &SearchParams::default(), None).unwrap();
    assert_eq!((hit[0].id, hit[0].distance), (5, 0.0));
}

/// Two compute nodes (threads, each its own connections) write one region
/// at once: inserts and upserts of overlapping labels, deletes of
/// overlapping labels, searches between. Afterwards, from either node,
/// every label is where a model of the acknowledged writes allows (an
/// upserted-by-both label holds one of the two vectors), nothing deleted
/// comes back, the counts agree, and the region's structure (label map,
/// partitions, header counts) is whole.
#[test]
fn two_compute_nodes_write_one_region_at_once() {
    let node = MemoryNode::start("127.0.0.1:0", 256 << 20, NodeLimits::default()).unwrap();
    let addr = node.addr().to_string();
    let n = 1600u64;
    let base = oracle::clustered(n as usize, DIM, 8, 21);
    let params = [
        ("memnode", ParamValue::Str(addr.clone())),
        ("region", ParamValue::Str("shared".into())),
        ("partitions", ParamValue::Int(8)),
    ];
    let a = index(&params);
    a.insert(1, &(0..n).collect::<Vec<u64>>(), &base).unwrap();
    let b = index(&params);
    assert_eq!(b.len(), n as usize, "the second node attached");
    // Each node's own vector for a label: far apart for the two nodes.
    let vec_of = |who: u64, l: u64| -> Vec<f32> {
        (0..DIM)
            .map(|d| {
                let h = (l.wrapping_mul(2_654_435_761) ^ (d as u64 * 40_503)) % 100_003;
                h as f32 / 2_000.0 + 80.0 * who as f32
            })
            .collect()
    };
    // A: labels 5000..5300 and deletes 0..400 step 3; B: 5200..5500 and
    // deletes 0..400 step 5 (the overlaps raced on purpose).
    let work = |idx: &dyn VectorIndex, who: u64, from: u64| {
        let every = SearchParams {
            nprobe: Some(8),
            ef: Some(64),
            ..Default::default()
        };
        for (round, chunk) in (from..from + 300)
            .collect::<Vec<u64>>()
            .chunks(20)
            .enumerate()
        {
            let v: Vec<f32> = chunk.iter().flat_map(|&l| vec_of(who, l)).collect();
            idx.insert(10 + round as u64, chunk, &v).unwrap();
            let step = if who == 0 { 3 } else { 5 };
            let gone: Vec<u64> = (0..400).step_by(step).skip(round * 2).take(2).collect();
            idx.delete(100 + round as u64, &gone).unwrap();
            idx.search_batch(&v, 3, &every, None).unwrap();
        }
    };
    std::thread::scope(|sc| {
        sc.spawn(|| work(&*a, 0, 5000));
        sc.spawn(|| work(&*b, 1, 5200));
    });
    let mut deleted: std::collections::BTreeSet<u64> = Default::default();
    for round in 0..15 {
        for step in [3usize, 5] {
            deleted.extend((0..400u64).step_by(step).skip(round * 2).take(2));
        }
    }
    let live: Vec<u64> = (0..n)
        .filter(|l| !deleted.contains(l))
        .chain(5000..5500)
        .collect();
    let every = SearchParams {
        nprobe: Some(8),
        ef: Some(128),
        ..Default::default()
    };
    for idx in [&a, &b] {
        assert!(
            idx.check_structure().unwrap().is_empty(),
            "{:?}",
            idx.check_structure()
        );
        assert_eq!(idx.len(), live.len());
        for &l in &deleted {
            assert_eq!(idx.get(l).unwrap(), None, "deleted {l} came back");
        }
        for l in 5000..5500u64 {
            let got = idx.get(l).unwrap().unwrap_or_else(|| panic!("{l} lost"));
            let allowed = match l {
                5000..=5199 => vec![vec_of(0, l)],
                5300..=5499 => vec![vec_of(1, l)],
                _ => vec![vec_of(0, l), vec_of(1, l)],
            };
            assert!(
                allowed.contains(&got),
                "label {l} holds neither node's vector"
            );
            let hit = idx.search(&got, 1, &every, None).unwrap();
            assert_eq!(hit[0].id, l, "label {l} is its own nearest");
        }
        let qs: Vec<f32> = (0..40u64)
            .flat_map(|l| base[(l * 37 % n) as usize * DIM..][..DIM].to_vec())
            .collect();
        for r in idx.search_batch(&qs, 10, &every, None).unwrap() {
            for hit in r {
                assert!(!deleted.contains(&hit.id), "deleted {} answered", hit.id);
            }
        }
    }
    // Gaps filled and partitions were rebuilt (by either node), and the
    // region never had to move (a move while another node writes is not
    // supported yet).
    let sum = |k: &str| {
        a.stats().unwrap().extra_value(k).unwrap() + b.stats().unwrap().extra_value(k).unwrap()
    };
    assert!(sum("partition_rebuilds") > 0.0);
    assert_eq!(sum("region_relayouts"), 0.0);
}

/// Upserts of the same labels round after round rebuild partitions again
/// and again; each rebuild frees the area its partition left, and the next
/// takes its area there first: the region's used end stops growing.
#[test]
fn rebuilds_reuse_the_areas_they_free() {
    let idx = index(&[
        ("partitions", ParamValue::Int(4)),
        ("gap", ParamValue::Float(0.1)),
    ]);
    let n = 800usize;
    let labels: Vec<u64> = (0..n as u64).collect();
    idx.insert(1, &labels, &oracle::clustered(n, DIM, 6, 1))
        .unwrap();
    let used = |i: &dyn VectorIndex| {
        let st = i.stats().unwrap();
        let x = |k: &str| st.extra_value(k).unwrap();
        (
            x("region_used_bytes"),
            x("rebuilt_bytes"),
            x("rebuilt_bytes_reused"),
        )
    };
    let mut seen = Vec::new();
    for round in 0..16u64 {
        let v = oracle::clustered(n, DIM, 6, 100 + round);
        let part = &labels[(round as usize * 97) % 400..][..300];
        let rows: Vec<f32> = part
            .iter()
            .flat_map(|&l| v[l as usize * DIM..(l as usize + 1) * DIM].to_vec())
            .collect();
        idx.insert(2 + round, part, &rows).unwrap();
        seen.push(used(&*idx));
    }
    // Over the last ten rounds the rebuilds took far more bytes than the
    // region's used end moved: most came from areas earlier ones freed.
    let (first, last) = (seen[5], seen[15]);
    let took = last.1 - first.1;
    let grew = last.0 - first.0;
    assert!(took > 0.0 && last.2 > first.2, "{seen:?}");
    assert!(
        grew <= 0.25 * took,
        "the used end grew {grew} bytes while rebuilds took {took}: {seen:?}"
    );
    let st = idx.stats().unwrap();
    assert_eq!(st.extra_value("region_relayouts"), Some(0.0));
    assert_eq!(idx.len(), n);
    assert!(idx.check_structure().unwrap().is_empty());
}

/// Two compute nodes insert until the region is full and the index moves
/// to a new one (`mv~N`) under them, more than once. The move holds every
/// partition, so a write either finished before it (and is carried over)
/// or fails on the dropped region, and the node attaches to the new region
/// and writes it again by itself: no call fails. Afterwards every row
/// either node wrote is in the index, and its structure is whole.
#[test]
fn moves_to_a_new_region_lose_no_write_of_another_node() {
    two_writers_through_moves(&[
        ("partitions", ParamValue::Int(4)),
        ("gap", ParamValue::Float(0.02)),
    ]);
}

/// The same with automatic K: the index is partitioned afresh into new
/// regions (repartitions) while both nodes write.
#[test]
fn repartitions_lose_no_write_of_another_node() {
    two_writers_through_moves(&[("partition_points", ParamValue::Int(200))]);
}

fn two_writers_through_moves(extra: &[(&str, ParamValue)]) {
    let node = MemoryNode::start("127.0.0.1:0", 512 << 20, NodeLimits::default()).unwrap();
    let addr = node.addr().to_string();
    let mut params = vec![
        ("memnode", ParamValue::Str(addr.clone())),
        ("region", ParamValue::Str("mv".into())),
    ];
    params.extend(extra.iter().cloned());
    let first = index(&params);
    let n = 600u64;
    first
        .insert(
            1,
            &(0..n).collect::<Vec<u64>>(),
            &oracle::clustered(n as usize, DIM, 6, 5),
        )
        .unwrap();
    let moved = std::sync::atomic::AtomicU64::new(0);
    let work = |who: u64| {
        let idx = index(&params);
        let rows = oracle::clustered(1800, DIM, 6, 50 + who);
        for (b, chunk) in (0..60u64).map(|b| (b, 10_000 * (who + 1) + 30 * b)) {
            let labels: Vec<u64> = (chunk..chunk + 30).collect();
            let v = &rows[(b as usize * 30) * DIM..(b as usize * 30 + 30) * DIM];
            // A write that meets the dropped region attaches to the new one
            // and runs again by itself.
            idx.insert(2 + b, &labels, v)
                .unwrap_or_else(|e| panic!("node {who}: {e}"));
            idx.search_batch(v, 1, &SearchParams::default(), None)
                .unwrap();
        }
        let st = idx.stats().unwrap();
        moved.fetch_add(
            st.extra_value("region_relayouts").unwrap() as u64,
            std::sync::atomic::Ordering::Relaxed,
        );
    };
    std::thread::scope(|sc| {
        sc.spawn(|| work(0));
        sc.spawn(|| work(1));
    });
    let check = index(&params);
    let want: Vec<u64> = (0..n).chain(10_000..11_800).chain(20_000..21_800).collect();
    assert_eq!(check.len(), want.len());
    for l in want {
        assert!(check.contains(l).unwrap(), "label {l} lost");
    }
    assert!(check.check_structure().unwrap().is_empty());
    let name = check
        .as_any()
        .downcast_ref::<DHnsw>()
        .unwrap()
        .region_name()
        .unwrap();
    assert!(name.starts_with("mv~"), "the index moved: {name}");
}

/// A writer that holds one partition and waits for its gap partner (held
/// by another compute node that is alive: it keeps moving its hold) gives
/// the first back after a third of the take-over time and tries again,
/// rather than holding it throughout (which would let a waiter take it over
/// although alive); once the partner is free, the insert goes through.
#[test]
fn a_writer_waiting_for_a_partner_gives_back_what_it_holds() {
    use vectide_dhnsw::layout::{Header, ENTRY_BYTES, ENTRY_STATE_AT, HEADER_BYTES};
    use vectide_remote::RemoteMemory;
    let node = MemoryNode::start("127.0.0.1:0", 64 << 20, NodeLimits::default()).unwrap();
    let addr = node.addr().to_string();
    let idx = index(&[
        ("memnode", ParamValue::Str(addr.clone())),
        ("region", ParamValue::Str("pt".into())),
        ("partitions", ParamValue::Int(2)),
        ("timeout_ms", ParamValue::Int(40)),
    ]);
    let data = oracle::clustered(400, DIM, 2, 9);
    idx.insert(1, &(0..400).collect::<Vec<u64>>(), &data)
        .unwrap();
    let mem = vectide_remote::TcpMemory::connect(&addr, Default::default()).unwrap();
    let region = mem.open_region("pt").unwrap();
    let h = Header::decode(
        &mem.read(region, 0, HEADER_BYTES as u32).unwrap(),
        region.size,
    )
    .unwrap();
    let state_at = |p: u64| h.table_off + p * ENTRY_BYTES + ENTRY_STATE_AT;
    let word =
        |at: u64| u64::from_le_bytes(mem.read(region, at, 8).unwrap()[..8].try_into().unwrap());
    // Another (live) node holds partition 1.
    let s1 = word(state_at(1));
    assert_eq!(mem.cas(region, state_at(1), s1, s1 + 1).unwrap(), s1);
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|sc| {
        let held = sc.spawn(|| {
            // Alive: its hold moves every 60 ms (under the 240 ms take-over).
            let mut cur = s1 + 1;
            while !stop.load(std::sync::atomic::Ordering::Acquire) {
                std::thread::sleep(std::time::Duration::from_millis(60));
                assert_eq!(mem.cas(region, state_at(1), cur, cur + 2).unwrap(), cur);
                cur += 2;
            }
            assert_eq!(mem.cas(region, state_at(1), cur, cur + 1).unwrap(), cur);
        });
        let writer = sc.spawn(|| idx.insert(2, &[9000], &data[..DIM]));
        std::thread::sleep(std::time::Duration::from_millis(30));
        let first = word(state_at(0));
        std::thread::sleep(std::time::Duration::from_millis(400));
        let later = word(state_at(0));
        stop.store(true, std::sync::atomic::Ordering::Release);
        held.join().unwrap();
        writer.join().unwrap().unwrap();
        assert!(
            later >= first + 4,
            "partition 0 was held throughout the wait (state {first} then {later})"
        );
    });
    assert!(idx.contains(9000).unwrap());
    assert!(idx.check_structure().unwrap().is_empty());
}

/// A region's lease: one owner (a database) at a time writes it. Another
/// owner is refused with an error naming the holder while the holder
/// renews; a compute node without a lease may search it but not write it;
/// the same owner reopening takes it back at once with the next epoch, and
/// the node that held it before writes nothing more (fenced by the owner
/// word every lock's doorbell reads); once the holder is gone, another
/// owner takes the lease after it went unrenewed for the take-over time.
#[test]
fn one_owner_at_a_time_writes_a_leased_region() {
    let node = MemoryNode::start("127.0.0.1:0", 64 << 20, NodeLimits::default()).unwrap();
    let addr = node.addr().to_string();
    let open = |lease: Option<&str>| {
        let mut p = vec![
            ("memnode", ParamValue::Str(addr.clone())),
            ("region", ParamValue::Str("leased".into())),
            ("timeout_ms", ParamValue::Int(50)),
        ];
        if let Some(l) = lease {
            p.push(("lease", ParamValue::Str(l.into())));
        }
        (vectide_dhnsw::DESCRIPTOR.create)(DIM, Metric::L2, &params_of(p))
    };
    let rows = oracle::clustered(400, DIM, 4, 3);
    let a = open(Some("db-a")).unwrap();
    a.insert(1, &(0..400).collect::<Vec<u64>>(), &rows).unwrap();
    // Another owner, while db-a renews: refused, naming db-a.
    let t = std::time::Instant::now();
    let e = match open(Some("db-b")) {
        Ok(_) => panic!("another owner is refused"),
        Err(e) => e.to_string(),
    };
    assert!(e.contains("leased to \"db-a\""), "{e}");
    assert!(
        t.elapsed() < std::time::Duration::from_millis(300),
        "{:?}",
        t.elapsed()
    );
    // No lease: searches, but writes nothing.
    let reader = open(None).unwrap();
    assert_eq!(reader.len(), 400);
    assert_eq!(
        reader
            .search(&rows[..DIM], 1, &SearchParams::default(), None)
            .unwrap()[0]
            .id,
        0
    );
    let e = reader
        .insert(1, &[9999], &rows[..DIM])
        .unwrap_err()
        .to_string();
    assert!(e.contains("leased to \"db-a\""), "{e}");
    assert!(!reader.contains(9999).unwrap());
    // db-a reopening (its old node still alive, as after a crash that left
    // a zombie): the lease back at once, the old node fenced.
    let t = std::time::Instant::now();
    let a2 = open(Some("db-a")).unwrap();
    assert!(
        t.elapsed() < std::time::Duration::from_millis(300),
        "{:?}",
        t.elapsed()
    );
    a2.insert(2, &[1000], &rows[..DIM]).unwrap();
    let e = a
        .insert(3, &[1001], &rows[DIM..2 * DIM])
        .unwrap_err()
        .to_string();
    assert!(e.contains("lease on the region was taken"), "{e}");
    assert!(!a2.contains(1001).unwrap());
    drop(a);
    // db-a gone (no renewals): db-b takes the lease after the take-over
    // time (6 x 50 ms) and writes.
    drop(a2);
    let t = std::time::Instant::now();
    let b = open(Some("db-b")).unwrap();
    assert!(
        t.elapsed() >= std::time::Duration::from_millis(300),
        "{:?}",
        t.elapsed()
    );
    b.insert(4, &[2000], &rows[..DIM]).unwrap();
    assert!(b.contains(2000).unwrap() && b.contains(1000).unwrap());
    assert_eq!(b.len(), 402);
    assert!(b.check_structure().unwrap().is_empty());
}

/// A leased index on a memory node with a backing file, reopened after the
/// node restarted (here: a node inside the process, on its file): the
/// region is put right first (its lock words may be held by writes the
/// restart cut short), then the same owner takes its lease back, and its
/// durable_seq is what its last flush recorded.
#[test]
fn a_leased_region_reopens_after_its_memory_node_restarted() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("node.vtb");
    let params = || {
        params_of([
            (
                "memnode",
                ParamValue::Str(format!("file:{}", file.display())),
            ),
            ("lease", ParamValue::Str("db-x/c".into())),
            ("timeout_ms", ParamValue::Int(50)),
        ])
    };
    let rows = oracle::clustered(300, DIM, 4, 9);
    {
        let a = (vectide_dhnsw::DESCRIPTOR.create)(DIM, Metric::L2, &params()).unwrap();
        a.insert(7, &(0..300).collect::<Vec<u64>>(), &rows).unwrap();
        a.flush().unwrap();
        assert_eq!(a.durable_seq(), 7);
    }
    let b = (vectide_dhnsw::DESCRIPTOR.create)(DIM, Metric::L2, &params()).unwrap();
    assert_eq!(b.durable_seq(), 7);
    assert_eq!(b.len(), 300);
    b.insert(8, &[1000], &rows[..DIM]).unwrap();
    assert!(b.contains(1000).unwrap() && b.check_structure().unwrap().is_empty());
    assert_eq!(
        b.stats().unwrap().extra_value("recovery.restarts"),
        Some(1.0),
        "the region was put right for the node's new boot"
    );
}
