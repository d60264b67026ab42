//! The long-term index end to end: a fresh-vamana graph written as an LTI
//! (on the crash-simulating block file and on a real O_DIRECT file), beam
//! search against the brute-force oracle, the cache, the stats, damage
//! found by the sector checksums, and header parsing under random bytes.

#[path = "../../test-support/oracle.rs"]
mod oracle;

use proptest::prelude::*;
use std::path::Path;
use vectide_core::{Error, Metric, VectorIndex};
use vectide_diskann::layout::Header;
use vectide_diskann::lti::{self, GraphSource, Lti, Scratch};
use vectide_storage::block::{AlignedBuf, BlockFile, DirectFile, SimBlockFile, BLOCK};
use vectide_vamana::{FreshVamana, GraphExport, VamanaParams};

const DIM: usize = 24;
const N: usize = 3000;

fn graph(metric: Metric) -> (GraphExport, Vec<f32>) {
    let data = oracle::clustered(N, DIM, 12, 7);
    let v = FreshVamana::new(DIM, metric, VamanaParams::default()).unwrap();
    let ids: Vec<u64> = (0..N as u64).map(|i| i * 3 + 1).collect();
    v.insert(1, &ids, &data).unwrap();
    (v.export_graph(), data)
}

fn source(g: &GraphExport) -> GraphSource<'_> {
    GraphSource::from_export(g)
}

fn truth(metric: Metric, data: &[f32], queries: &[Vec<f32>], k: usize) -> Vec<Vec<u64>> {
    let points: Vec<(u64, Vec<f32>)> = data
        .chunks(DIM)
        .enumerate()
        .map(|(i, x)| (i as u64 * 3 + 1, x.to_vec()))
        .collect();
    queries
        .iter()
        .map(|q| oracle::brute_force(metric, &points, q, k))
        .collect()
}

fn normalised(metric: Metric, q: &[f32]) -> Vec<f32> {
    let mut q = q.to_vec();
    if metric == Metric::Cosine {
        let n = q.iter().map(|x| x * x).sum::<f32>().sqrt();
        q.iter_mut().for_each(|x| *x /= n);
    }
    q
}

fn run_queries(
    lti: &Lti,
    metric: Metric,
    queries: &[Vec<f32>],
    l: usize,
    w: usize,
) -> (Vec<Vec<u64>>, lti::QueryStats) {
    let mut scratch = Scratch::default();
    let mut out = Vec::new();
    let mut total = lti::QueryStats::default();
    let found = queries
        .iter()
        .map(|q| {
            let s = lti
                .search(
                    &normalised(metric, q),
                    10,
                    l,
                    w,
                    &|_, _| true,
                    &mut scratch,
                    &mut out,
                )
                .unwrap();
            total += s;
            out.iter().map(|&(_, label)| label).collect()
        })
        .collect();
    (found, total)
}

fn queries(n: usize) -> Vec<Vec<f32>> {
    oracle::clustered(n, DIM, 12, 99)
        .chunks(DIM)
        .map(|q| q.to_vec())
        .collect()
}

#[test]
fn beam_search_over_a_simulated_file_finds_the_true_neighbours() {
    let dir = tempfile::tempdir().unwrap();
    for metric in [Metric::L2, Metric::Cosine] {
        let (g, data) = graph(metric);
        let file = SimBlockFile::new(1);
        let pq = dir.path().join(format!("{metric:?}.pq"));
        let h = lti::write(&file, &pq, &source(&g), 8, 0).unwrap().header;
        assert_eq!(h.nodes as usize, g.len());
        assert_eq!(file.len_blocks(), 1 + h.data_sectors());
        let lti = Lti::open(Box::new(file), &pq).unwrap();
        let qs = queries(100);
        let t = truth(metric, &data, &qs, 10);
        let (found, stats) = run_queries(&lti, metric, &qs, 60, 4);
        let r = oracle::recall(&found, &t);
        assert!(r >= 0.95, "{metric:?}: recall {r}");
        // Every hop reads at most W sectors, in one batch.
        assert!(stats.sectors_read <= 4 * stats.hops && stats.hops > 0);
        // Sector mates: nodes laid out beside their neighbours are
        // expanded from sectors read for another node.
        assert!(
            stats.expanded > stats.sectors_read + stats.cache_hits,
            "{stats:?}"
        );
        assert!(stats.exact_distances >= stats.expanded);
        assert_eq!(
            lti.file().stats().batches,
            stats.hops + 1,
            "plus the header read"
        );
        // The start node never comes back; every label is a user id.
        assert!(found
            .iter()
            .flatten()
            .all(|&id| id % 3 == 1 && id < 3 * N as u64));
    }
}

#[test]
fn the_cache_saves_reads_and_changes_no_answer() {
    let dir = tempfile::tempdir().unwrap();
    let mut lti = l2_lti(dir.path());
    let qs = queries(50);
    let (before, cold) = run_queries(&lti, Metric::L2, &qs, 40, 4);
    let cached = lti
        .cache_near_start(200 * lti.header().node_bytes())
        .unwrap();
    assert!(cached > 100 && cached <= 200, "{cached}");
    let (after, warm) = run_queries(&lti, Metric::L2, &qs, 40, 4);
    assert_eq!(before, after);
    assert!(warm.cache_hits > 0 && warm.sectors_read < cold.sectors_read);
    assert_eq!(warm.expanded, cold.expanded);
}

/// The L2 test graph as an LTI (8-byte codes) on a simulated file, its
/// PQ file in `dir`.
fn l2_lti(dir: &std::path::Path) -> Lti {
    let (g, _) = graph(Metric::L2);
    let pq = dir.join("x.pq");
    let file = SimBlockFile::new(1);
    lti::write(&file, &pq, &source(&g), 8, 0).unwrap();
    Lti::open(Box::new(file), &pq).unwrap()
}

/// Each query's top 10 labels (L 40, W 4) on `sc`, and the summed stats.
fn search_all(lti: &Lti, qs: &[Vec<f32>], sc: &mut Scratch) -> (Vec<Vec<u64>>, lti::QueryStats) {
    let mut out = Vec::new();
    let mut total = lti::QueryStats::default();
    let found = qs
        .iter()
        .map(|q| {
            total += lti
                .search(q, 10, 40, 4, &|_, _| true, sc, &mut out)
                .unwrap();
            out.iter().map(|x| x.1).collect()
        })
        .collect();
    (found, total)
}

#[test]
fn a_shared_cache_saves_reads_and_changes_no_answer() {
    let dir = tempfile::tempdir().unwrap();
    let lti = l2_lti(dir.path());
    let budget = 50 * (lti.header().sectors_per_node() * BLOCK + 16);
    let shared = std::sync::Arc::new(lti.sectors_near_start(budget).unwrap());
    assert_eq!(shared.len(), 50);
    assert!(shared.bytes() <= budget);
    // The start node's record is among them: every search begins there.
    let qs = queries(40);
    let (plain, cold) = search_all(&lti, &qs, &mut Scratch::default());
    let mut sc = Scratch::default();
    sc.share_cache(shared.clone());
    let (found, warm) = search_all(&lti, &qs, &mut sc);
    assert_eq!(found, plain);
    assert_eq!(warm.expanded, cold.expanded);
    assert_eq!(warm.sectors_read + warm.cache_hits, cold.sectors_read);
    assert!(warm.cache_hits >= 40, "{warm:?}");
    // The LTI's own cache is untouched by a shared one.
    assert_eq!(lti.cached(), 0);
}

#[test]
fn recent_records_save_reads_and_change_no_answer() {
    let dir = tempfile::tempdir().unwrap();
    let lti = l2_lti(dir.path());
    // Each query twice in a row: the second finds its records kept.
    let qs: Vec<Vec<f32>> = queries(30)
        .into_iter()
        .flat_map(|q| [q.clone(), q])
        .collect();
    let (plain, cold) = search_all(&lti, &qs, &mut Scratch::default());
    for cap in [1, 8, 64] {
        let mut sc = Scratch::default();
        sc.keep_recent(cap);
        let (found, warm) = search_all(&lti, &qs, &mut sc);
        assert_eq!(found, plain, "capacity {cap}");
        assert_eq!(warm.expanded, cold.expanded);
        assert_eq!(
            warm.sectors_read + warm.cache_hits,
            cold.sectors_read,
            "capacity {cap}"
        );
        assert!(sc.recent_bytes() <= cap * BLOCK);
        if cap == 64 {
            assert!(
                warm.sectors_read * 3 < cold.sectors_read * 2,
                "{warm:?} vs {cold:?}"
            );
        }
    }
}

/// Each query's expanded nodes (exact distance, node) and vectors.
type Expanded = (Vec<(f32, u32)>, Vec<f32>);

#[test]
fn lockstep_searches_expand_as_single_ones_and_read_a_shared_sector_once() {
    let dir = tempfile::tempdir().unwrap();
    let lti = l2_lti(dir.path());
    assert_eq!(lti.header().sectors_per_node(), 1);
    // Each query twice in a row: in lock-step the pair wants the same
    // sectors in the same rounds.
    let qs: Vec<Vec<f32>> = queries(30)
        .into_iter()
        .flat_map(|q| [q.clone(), q])
        .collect();
    let mut sc = Scratch::default();
    let mut single: Vec<Expanded> = Vec::new();
    let mut cold = lti::QueryStats::default();
    for q in &qs {
        cold += lti.search_expanded(q, 40, 4, &mut sc).unwrap();
        single.push((sc.expanded.clone(), sc.expanded_vectors.clone()));
    }
    for in_flight in [1, 3, 16] {
        let mut ls = lti::Lockstep::new(in_flight);
        let mut got: Vec<Option<Expanded>> = vec![None; qs.len()];
        let mut warm = lti::QueryStats::default();
        lti.search_expanded_lockstep(
            0..qs.len(),
            |i| &qs[i][..],
            40,
            4,
            &mut ls,
            |i, sc, st| {
                assert!(got[i].is_none(), "job {i} ended twice");
                got[i] = Some((sc.expanded.clone(), sc.expanded_vectors.clone()));
                warm += st;
                Ok(())
            },
        )
        .unwrap();
        for (i, g) in got.iter().enumerate() {
            assert_eq!(
                g.as_ref(),
                Some(&single[i]),
                "query {i}, {in_flight} in flight"
            );
        }
        assert_eq!(warm.expanded, cold.expanded);
        assert_eq!(warm.sectors_read + warm.cache_hits, cold.sectors_read);
        match in_flight {
            1 => assert_eq!(warm.sectors_read, cold.sectors_read),
            // Twins start and end together (an even number of slots): each
            // read serves both.
            16 => assert!(
                warm.sectors_read * 3 < cold.sectors_read * 2,
                "{warm:?} vs {cold:?}"
            ),
            _ => assert!(warm.sectors_read <= cold.sectors_read),
        }
    }
    // A query of the wrong dimension is an error, not a panic.
    let bad = [vec![0.0f32; 3]];
    let mut ls = lti::Lockstep::new(2);
    let r = lti.search_expanded_lockstep(0..1, |i| &bad[i][..], 40, 4, &mut ls, |_, _, _| Ok(()));
    assert!(matches!(r, Err(Error::DimensionMismatch { .. })), "{r:?}");
}

#[test]
fn a_real_direct_file_reads_the_same_and_filters_apply() {
    let dir = tempfile::tempdir().unwrap();
    let (g, data) = graph(Metric::L2);
    let path = dir.path().join("lti.blk");
    let pq = dir.path().join("lti.pq");
    {
        let f = DirectFile::open(&path, true, vectide_core::sync::SyncSite("test.lti")).unwrap();
        lti::write(&f, &pq, &source(&g), 8, 0).unwrap();
    }
    let f = DirectFile::open(&path, false, vectide_core::sync::SyncSite("test.lti")).unwrap();
    let lti = Lti::open(Box::new(f), &pq).unwrap();
    let qs = queries(30);
    let (found, _) = run_queries(&lti, Metric::L2, &qs, 60, 4);
    assert!(oracle::recall(&found, &truth(Metric::L2, &data, &qs, 10)) >= 0.95);
    // Only even labels admitted: every result is even.
    let mut s = Scratch::default();
    let mut out = Vec::new();
    lti.search(&qs[0], 10, 60, 4, &|_, l| l % 2 == 0, &mut s, &mut out)
        .unwrap();
    assert_eq!(out.len(), 10);
    assert!(out.iter().all(|&(_, l)| l % 2 == 0));
    assert!(matches!(
        lti.search(&qs[0][..5], 10, 60, 4, &|_, _| true, &mut s, &mut out),
        Err(Error::DimensionMismatch { .. })
    ));
}

fn reopen(bytes: Vec<u8>, pq: &Path) -> vectide_core::Result<Lti> {
    Lti::open(Box::new(SimBlockFile::with_durable(bytes, 1).unwrap()), pq)
}

#[test]
fn damage_is_an_error_never_a_wrong_answer() {
    let dir = tempfile::tempdir().unwrap();
    let (g, _) = graph(Metric::L2);
    let pq = dir.path().join("x.pq");
    let file = SimBlockFile::new(1);
    lti::write(&file, &pq, &source(&g), 8, 0).unwrap();
    let good = file.current();
    // A flipped bit in the sector of the start node: its read fails.
    let h = Header::decode(&good[..BLOCK], (good.len() / BLOCK) as u64).unwrap();
    let (sector, off) = h.locate(h.start);
    let mut bad = good.clone();
    bad[sector as usize * BLOCK + off + 3] ^= 0x10;
    let lti = reopen(bad, &pq).unwrap();
    let mut out = Vec::new();
    let err = lti.search(
        &g.vectors[..DIM],
        10,
        20,
        4,
        &|_, _| true,
        &mut Scratch::default(),
        &mut out,
    );
    assert!(matches!(err, Err(Error::Corrupted(_))), "{err:?}");
    // A truncated file, a damaged header, a PQ file of another index.
    assert!(reopen(good[..good.len() - BLOCK].to_vec(), &pq).is_err());
    let mut hdr = good.clone();
    hdr[17] ^= 1;
    assert!(reopen(hdr, &pq).is_err());
    let other = dir.path().join("other.pq");
    // The writer refuses parts that disagree.
    assert!(lti::write(
        &SimBlockFile::new(1),
        &other,
        &GraphSource {
            labels: &g.labels[..500],
            ..source(&g)
        },
        8,
        0
    )
    .is_err());
    let mut pq_bytes = std::fs::read(&pq).unwrap();
    let mid = pq_bytes.len() / 2;
    pq_bytes[mid] ^= 1;
    std::fs::write(&other, &pq_bytes).unwrap();
    assert!(reopen(good, &other).is_err(), "PQ file checksum");
}

/// The scan reads ahead on a thread of its own: it still hands out every
/// record in order, stops at a damaged sector before any record of its run,
/// and stops when its caller's callback fails.
#[test]
fn a_scan_reads_ahead_in_order_and_stops_at_damage_or_a_failing_callback() {
    let dir = tempfile::tempdir().unwrap();
    let (g, _) = graph(Metric::L2);
    let pq = dir.path().join("x.pq");
    let file = SimBlockFile::new(1);
    let written = lti::write(&file, &pq, &source(&g), 8, 0).unwrap();
    let good = file.current();
    let h = Header::decode(&good[..BLOCK], (good.len() / BLOCK) as u64).unwrap();
    assert!(
        h.data_sectors() > lti::RUN as u64 + 10,
        "the test wants two runs at least"
    );
    let lti = reopen(good.clone(), &pq).unwrap();
    let mut seen = Vec::new();
    lti.scan(|i, node| {
        seen.push((i, node.label));
        Ok(())
    })
    .unwrap();
    let mut want = vec![(0u32, 0u64); g.labels.len()];
    for (src, &node) in written.node_of.iter().enumerate() {
        want[node as usize] = (node, g.labels[src]);
    }
    assert_eq!(seen, want);
    // A flipped bit in a sector of the second run.
    let sector = lti::RUN + 5;
    let mut bad = good.clone();
    bad[sector * BLOCK + 9] ^= 0x40;
    let lti = reopen(bad, &pq).unwrap();
    let mut count = 0u64;
    let err = lti.scan(|_, _| {
        count += 1;
        Ok(())
    });
    assert!(matches!(err, Err(Error::Corrupted(_))), "{err:?}");
    // A run is checked whole before its records go out: those of the
    // first run went out, none of the damaged one.
    assert_eq!(count, (lti::RUN * h.nodes_per_sector()) as u64);
    // A callback that fails stops the scan with its error.
    let lti = reopen(good, &pq).unwrap();
    let mut count = 0;
    let err = lti.scan(|i, _| {
        count += 1;
        if i == 100 {
            return Err(Error::invalid("stop here"));
        }
        Ok(())
    });
    assert!(matches!(err, Err(Error::InvalidInput(_))), "{err:?}");
    assert_eq!(count, 101);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]
    /// Random sector-0 bytes (sealed or not) and random lengths: the header
    /// parser returns an error or a header consistent with the length.
    #[test]
    fn header_parser_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..128),
                                  seal in any::<bool>(), sectors in 0u64..1_000_000) {
        let mut b = AlignedBuf::new(1);
        let real = Header { metric: Metric::L2, dim: 8, max_degree: 16, nodes: 100, start: 3, durable_seq: 1, pq_bytes: 4 }.encode();
        b.copy_from_slice(&real);
        let at = bytes.first().copied().unwrap_or(0) as usize % 80;
        for (i, &x) in bytes.iter().enumerate() {
            if at + i < BLOCK { b[at + i] = x; }
        }
        if seal { vectide_diskann::layout::seal(&mut b[..]); }
        if let Ok(h) = Header::decode(&b, sectors) {
            prop_assert_eq!(1 + h.data_sectors(), sectors);
            prop_assert!(h.nodes == 0 || h.start < h.nodes);
        }
    }
}
