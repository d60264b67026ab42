//! StreamingMerge end to end: an LTI from a fresh-vamana graph, a change
//! set (deleted nodes, new points from a temp index), the merge, and the new
//! LTI checked against the brute-force oracle over the final set: deleted
//! points gone, new ones found, lists sound, codes in their slots.

#[path = "../../test-support/oracle.rs"]
mod oracle;

use std::collections::{HashMap, HashSet};
use vectide_core::{Metric, VectorIndex};
use vectide_diskann::layout::{PqFile, NO_LABEL};
use vectide_diskann::lti::{self, GraphSource, Lti, Scratch};
use vectide_diskann::merge::{streaming_merge, Inserts, MergeParams, Phase};
use vectide_storage::block::{BlockFile, IoStats, ReadReq, SimBlockFile};
use vectide_vamana::{FreshVamana, GraphExport, VamanaParams, START_LABEL};

const DIM: usize = 16;

fn export(metric: Metric, ids: &[u64], data: &[f32]) -> GraphExport {
    let v = FreshVamana::new(DIM, metric, VamanaParams::default()).unwrap();
    v.insert(1, ids, data).unwrap();
    v.export_graph()
}

/// Writes graph `g` as an LTI into `file` (8-byte PQ codes to `pq`).
fn write_lti(
    file: &SimBlockFile,
    pq: &std::path::Path,
    g: &GraphExport,
    metric: Metric,
) -> lti::Written {
    let src = GraphSource {
        metric,
        durable_seq: 1,
        ..GraphSource::from_export(g)
    };
    lti::write(file, pq, &src, 8, 0).unwrap()
}

/// The temp index's points as merge inserts: the start node left out,
/// links renumbered among the points.
fn inserts_of(g: &GraphExport) -> (Vec<u64>, Vec<f32>, Vec<Vec<u32>>) {
    let keep: Vec<usize> = (0..g.len())
        .filter(|&i| g.labels[i] != START_LABEL)
        .collect();
    let num: HashMap<usize, u32> = keep
        .iter()
        .enumerate()
        .map(|(k, &i)| (i, k as u32))
        .collect();
    let labels = keep.iter().map(|&i| g.labels[i]).collect();
    let vectors = keep.iter().flat_map(|&i| g.vector(i).to_vec()).collect();
    let links = keep
        .iter()
        .map(|&i| {
            g.lists[i]
                .iter()
                .filter_map(|&n| num.get(&(n as usize)).copied())
                .collect()
        })
        .collect();
    (labels, vectors, links)
}

struct Case {
    recall_before: f64,
    recall_after: f64,
    rebuilt: f64,
    old_nodes: u64,
    new_nodes: u64,
}

fn recall(lti: &Lti, points: &[(u64, Vec<f32>)], queries: &[Vec<f32>], metric: Metric) -> f64 {
    let mut s = Scratch::default();
    let mut out = Vec::new();
    let mut found = Vec::new();
    let mut truth = Vec::new();
    for q in queries {
        lti.search(q, 10, 12, 2, &|_, _| true, &mut s, &mut out)
            .unwrap();
        found.push(out.iter().map(|x| x.1).collect::<Vec<_>>());
        truth.push(oracle::brute_force(metric, points, q, 10));
    }
    oracle::recall(&found, &truth)
}

/// `n` points in the LTI, `del` of them deleted, `add` new ones merged.
fn run(n: usize, del: usize, add: usize) -> Case {
    let metric = Metric::L2;
    let dir = tempfile::tempdir().unwrap();
    let all = oracle::clustered(n + add, DIM, 10, 3);
    let ids: Vec<u64> = (0..n as u64).collect();
    let g = export(metric, &ids, &all[..n * DIM]);
    let file = SimBlockFile::new(1);
    let pq_old = dir.path().join("old.pq");
    let node_of = write_lti(&file, &pq_old, &g, metric).node_of;
    let old = Lti::open(Box::new(file), &pq_old).unwrap();

    // Delete every `n / del`-th id; their node numbers from the write.
    let gone: HashSet<u64> = (0..del as u64).map(|i| i * (n / del) as u64).collect();
    let dead: Vec<u32> = (0..g.len())
        .filter(|&i| gone.contains(&g.labels[i]))
        .map(|i| node_of[i])
        .collect();
    assert_eq!(dead.len(), del);
    let new_ids: Vec<u64> = (n as u64..(n + add) as u64).collect();
    let temp = export(metric, &new_ids, &all[n * DIM..]);
    let (labels, vectors, links) = inserts_of(&temp);

    let queries: Vec<Vec<f32>> = (0..60)
        .map(|i| {
            all[(i * 37 % (n + add)) * DIM..][..DIM]
                .iter()
                .map(|x| x + 0.01)
                .collect()
        })
        .collect();
    let before_pts: Vec<(u64, Vec<f32>)> = (0..n)
        .map(|i| (i as u64, all[i * DIM..(i + 1) * DIM].to_vec()))
        .collect();
    let recall_before = recall(&old, &before_pts, &queries, metric);

    let inter = SimBlockFile::new(2);
    let out = SimBlockFile::new(3);
    let pq_new = dir.path().join("new.pq");
    let phases = std::sync::Mutex::new(Vec::new());
    // The engine's merge knobs (`merge_l`, `merge_refill`): the recall
    // checks hold them to the rebuild's quality.
    let d = vectide_diskann::FreshDiskannParams::default();
    let p = MergeParams {
        r: 64,
        l: d.merge_l,
        alpha: 1.2,
        w: 4,
        io_threads: 0,
        refill: d.merge_refill,
        in_flight: 4,
    };
    let m = streaming_merge(
        &old,
        &dead,
        Inserts {
            labels: &labels,
            vectors: &vectors,
            links: &links,
        },
        &p,
        Box::new(inter),
        &out,
        &pq_new,
        9,
        Some(&|ph, done, total| {
            assert!(done <= total);
            phases.lock().unwrap().push(ph);
        }),
    )
    .unwrap();
    let phases = phases.into_inner().unwrap();
    for ph in [Phase::Delete, Phase::Insert, Phase::Patch] {
        assert!(phases.contains(&ph), "{ph:?} reported");
    }
    assert_eq!(m.header.durable_seq, 9);
    assert_eq!(m.slots.len(), add);
    assert!(m.stats.repaired > 0 || del == 0);
    // Codes: the old array patched in place equals the new PQ file's.
    let mut codes = old.codes().as_ref().clone();
    m.apply_codes(&mut codes);
    let (_, file_codes) = PqFile::read(&pq_new).unwrap();
    assert_eq!(codes, file_codes);

    let new = Lti::open(
        Box::new(SimBlockFile::with_durable(out.current(), 4).unwrap()),
        &pq_new,
    )
    .unwrap();
    // Every label once; deleted ones gone; new ones in their slots; lists
    // never name a free node or the node itself.
    let mut seen = HashSet::new();
    let mut free = HashSet::new();
    let mut lists = Vec::new();
    new.scan(|i, node| {
        if node.label == NO_LABEL {
            free.insert(i);
        } else {
            assert!(seen.insert(node.label), "label {} twice", node.label);
        }
        lists.push((i, node.neighbor_ids().collect::<Vec<_>>()));
        Ok(())
    })
    .unwrap();
    assert!(gone.iter().all(|g| !seen.contains(g)));
    assert!(new_ids.iter().all(|g| seen.contains(g)));
    assert_eq!(
        seen.len(),
        n - del + add + 1,
        "live points and the start node"
    );
    assert_eq!(
        free.iter().copied().collect::<HashSet<_>>(),
        m.free.iter().copied().collect()
    );
    let mut in_deg = vec![0u32; new.header().nodes as usize];
    for (i, l) in &lists {
        assert!(l.len() <= new.header().max_degree as usize);
        for &x in l {
            assert!(!free.contains(&x) && x != *i, "node {i} names {x}");
            in_deg[x as usize] += 1;
        }
    }
    // Every live node but the start has an in-edge (new points and old
    // ones whose last in-edge a prune dropped: the merge links orphans).
    let start = new.header().start;
    for (i, _) in &lists {
        if !free.contains(i) && *i as u64 != start {
            assert!(in_deg[*i as usize] > 0, "node {i} has no in-edge");
        }
    }
    assert_eq!(m.stats.orphans_left, 0);
    let after_pts: Vec<(u64, Vec<f32>)> = (0..n + add)
        .filter(|&i| !gone.contains(&(i as u64)))
        .map(|i| (i as u64, all[i * DIM..(i + 1) * DIM].to_vec()))
        .collect();
    let recall_after = recall(&new, &after_pts, &queries, metric);
    // The reference: the same final set rebuilt from scratch.
    let (r_ids, r_data): (Vec<u64>, Vec<f32>) = (
        after_pts.iter().map(|p| p.0).collect(),
        after_pts.iter().flat_map(|p| p.1.clone()).collect(),
    );
    let rg = export(metric, &r_ids, &r_data);
    let rfile = SimBlockFile::new(5);
    let rpq = dir.path().join("rebuilt.pq");
    write_lti(&rfile, &rpq, &rg, metric);
    let rebuilt = recall(
        &Lti::open(Box::new(rfile), &rpq).unwrap(),
        &after_pts,
        &queries,
        metric,
    );
    eprintln!("n {n} del {del} add {add}: recall {recall_before:.3} -> {recall_after:.3} (rebuilt {rebuilt:.3}), {:?}", m.stats);
    Case {
        recall_before,
        recall_after,
        rebuilt,
        old_nodes: old.header().nodes,
        new_nodes: new.header().nodes,
    }
}

/// At a small search list (L 12, W 2: recall is not saturated) the merged
/// index is within `points` of the same set rebuilt from scratch.
///
/// The rebuilt file is laid out by `sector_order` throughout, so sector
/// mates give its searches more exact distances per read; a merge lays new
/// points out among themselves, past the end or in freed slots, not beside
/// their old neighbours. Where new points are a fifth of the index that
/// costs the merged file about 2.5 points at this L (measured over 20 runs
/// of the test: 0.908-0.923 merged, 0.932-0.952 rebuilt; before the layout
/// change both were 0.88), so that case gets 5 points.
fn close_to_rebuilt(c: &Case, points: f64) {
    assert!(
        c.recall_after >= c.rebuilt - points / 100.0,
        "merged {} vs rebuilt {} (before {})",
        c.recall_after,
        c.rebuilt,
        c.recall_before
    );
}

#[test]
fn merge_of_deletes_and_inserts_keeps_recall() {
    let c = run(3000, 150, 150);
    assert_eq!(c.new_nodes, c.old_nodes, "new points took the freed slots");
    close_to_rebuilt(&c, 3.0);
}

#[test]
fn more_inserts_than_deletes_grow_the_file_and_deletes_alone_leave_free_slots() {
    let c = run(2000, 50, 400);
    assert_eq!(c.new_nodes, c.old_nodes + 350);
    close_to_rebuilt(&c, 5.0);
    let c = run(2000, 200, 0);
    assert_eq!(c.new_nodes, c.old_nodes);
    close_to_rebuilt(&c, 3.0);
}

/// A block file whose writes (or reads) fail with "no space left" / an
/// I/O error once a budget is spent.
struct Flaky {
    inner: SimBlockFile,
    writes_left: std::sync::atomic::AtomicI64,
    reads_left: std::sync::atomic::AtomicI64,
}

impl Flaky {
    fn new(inner: SimBlockFile, writes: i64, reads: i64) -> Self {
        Flaky {
            inner,
            writes_left: writes.into(),
            reads_left: reads.into(),
        }
    }
}

fn spend(
    budget: &std::sync::atomic::AtomicI64,
    err: std::io::ErrorKind,
) -> vectide_core::Result<()> {
    if budget.fetch_sub(1, std::sync::atomic::Ordering::SeqCst) <= 0 {
        return Err(vectide_core::Error::Io {
            path: None,
            source: std::io::Error::new(err, "injected"),
        });
    }
    Ok(())
}

impl BlockFile for Flaky {
    fn len_blocks(&self) -> u64 {
        self.inner.len_blocks()
    }
    fn read_batch(&self, reqs: &mut [ReadReq<'_>]) -> vectide_core::Result<()> {
        spend(&self.reads_left, std::io::ErrorKind::Other)?;
        self.inner.read_batch(reqs)
    }
    fn write(&self, block: u64, buf: &[u8]) -> vectide_core::Result<()> {
        spend(&self.writes_left, std::io::ErrorKind::StorageFull)?;
        self.inner.write(block, buf)
    }
    fn sync(&self) -> vectide_core::Result<()> {
        self.inner.sync()
    }
    fn set_len_blocks(&self, blocks: u64) -> vectide_core::Result<()> {
        self.inner.set_len_blocks(blocks)
    }
    fn stats(&self) -> IoStats {
        self.inner.stats()
    }
}

/// A disk full while the Delete phase writes, and failing reads of the
/// old LTI while both phases read it: the merge returns the I/O error (no
/// panic, no hang, the other phase stopped), and the old LTI answers as
/// before.
#[test]
fn a_failing_disk_fails_the_merge_and_leaves_the_old_lti() {
    let metric = Metric::L2;
    let dir = tempfile::tempdir().unwrap();
    let (n, add) = (3000, 200);
    let all = oracle::clustered(n + add, DIM, 10, 5);
    let ids: Vec<u64> = (0..n as u64).collect();
    let g = export(metric, &ids, &all[..n * DIM]);
    let pq_old = dir.path().join("old.pq");
    let file = SimBlockFile::new(1);
    write_lti(&file, &pq_old, &g, metric);
    let bytes = file.current();
    let temp = export(
        metric,
        &(n as u64..(n + add) as u64).collect::<Vec<_>>(),
        &all[n * DIM..],
    );
    let (labels, vectors, links) = inserts_of(&temp);
    let p = MergeParams {
        r: 64,
        l: 75,
        alpha: 1.2,
        w: 4,
        io_threads: 4,
        refill: 0,
        in_flight: 1,
    };
    let dead: Vec<u32> = (1..200).map(|i| i * 7).collect();
    let queries: Vec<Vec<f32>> = (0..20)
        .map(|i| all[i * 97 * DIM..][..DIM].to_vec())
        .collect();
    let answers = |lti: &Lti| -> Vec<Vec<u64>> {
        let (mut s, mut out) = (Scratch::default(), Vec::new());
        queries
            .iter()
            .map(|q| {
                lti.search(q, 10, 40, 4, &|_, _| true, &mut s, &mut out)
                    .unwrap();
                out.iter().map(|x| x.1).collect()
            })
            .collect()
    };
    // (writes left on the intermediate file, reads left on the old LTI)
    for (writes, reads, kind) in [
        (2, i64::MAX, std::io::ErrorKind::StorageFull),
        (i64::MAX, 40, std::io::ErrorKind::Other),
        (i64::MAX, 400, std::io::ErrorKind::Other),
    ] {
        let old_file = Flaky::new(
            SimBlockFile::with_durable(bytes.clone(), 2).unwrap(),
            i64::MAX,
            i64::MAX,
        );
        let old = Lti::open(Box::new(old_file), &pq_old).unwrap();
        let before = answers(&old);
        // The budget starts now (the open and the searches above read).
        let old = {
            let f = Flaky::new(
                SimBlockFile::with_durable(bytes.clone(), 2).unwrap(),
                i64::MAX,
                reads,
            );
            Lti::from_parts(
                Box::new(f),
                *old.header(),
                old.pq().clone(),
                old.codes().clone(),
            )
            .unwrap()
        };
        let inter = Flaky::new(SimBlockFile::new(3), writes, i64::MAX);
        let out = SimBlockFile::new(4);
        let r = streaming_merge(
            &old,
            &dead,
            Inserts {
                labels: &labels,
                vectors: &vectors,
                links: &links,
            },
            &p,
            Box::new(inter),
            &out,
            &dir.path().join("new.pq"),
            9,
            None,
        );
        match r {
            Err(vectide_core::Error::Io { source, .. }) => assert_eq!(source.kind(), kind),
            other => panic!(
                "writes {writes}, reads {reads}: {:?}",
                other.map(|m| m.stats)
            ),
        }
        let again = Lti::open(
            Box::new(SimBlockFile::with_durable(bytes.clone(), 5).unwrap()),
            &pq_old,
        )
        .unwrap();
        assert_eq!(answers(&again), before);
    }
}
