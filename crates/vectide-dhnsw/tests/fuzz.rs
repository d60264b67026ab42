//! Fuzz targets of every d-HNSW parser (proptest): arbitrary bytes, and
//! valid bytes with random bytes overwritten, given to the region header,
//! the partition table, a graph blob with its overflow, a saved file and a
//! whole region image: each answers `Ok` or an error, never a panic, and a
//! graph it accepts has every list inside the graph.

use proptest::prelude::*;
use vectide_core::Metric;
use vectide_dhnsw::layout::{encode_blob, encode_record, record_bytes, Entry, GraphParts, Header};
use vectide_dhnsw::persist::{decode_image, parse_saved};
use vectide_dhnsw::subgraph::SubGraph;
use vectide_graph::Graph;

fn parts(n: usize) -> GraphParts {
    GraphParts {
        dim: 3,
        m: 2,
        m0: 4,
        entry: Some((0, 1)),
        labels: (0..n as u64).collect(),
        flags: vec![0; n],
        levels: (0..n).map(|i| u8::from(i == 0)).collect(),
        vectors: (0..n * 3).map(|i| i as f32).collect(),
        lists: (0..n)
            .map(|i| {
                let mut l = vec![vec![((i + 1) % n) as u32, ((i + 2) % n) as u32]];
                if i == 0 {
                    l.push(vec![1]);
                }
                l
            })
            .collect(),
    }
}

fn valid_blob_with_overflow() -> Vec<u8> {
    let mut b = encode_blob(&parts(6), 2);
    encode_record(&mut b, 99, 0, &[0, 6], 4, &[1.0, 2.0, 3.0]);
    b
}

/// Every layer-0 list a decoder accepted is inside the graph: its raw
/// count within the list's room and its entries below the node count (the
/// traversal's own clamping is not relied on here).
fn check_graph(g: &SubGraph) {
    use std::sync::atomic::Ordering;
    for i in 0..g.len() as u32 {
        let list = g.list(i, 0);
        let c = list[0].load(Ordering::Relaxed) as usize;
        assert!(c < list.len(), "node {i}: count {c}");
        for w in &list[1..=c] {
            assert!((w.load(Ordering::Relaxed) as usize) < g.len());
        }
    }
    if let Some((ep, top)) = g.entry {
        assert!((ep as usize) < g.len() && g.level(ep) >= top);
    }
}

/// A real region image: an index of 600 points in 6 partitions, with
/// inserts in its gaps and deletes, saved.
fn image() -> &'static (Vec<u8>, usize) {
    static IMG: std::sync::OnceLock<(Vec<u8>, usize)> = std::sync::OnceLock::new();
    IMG.get_or_init(|| {
        use vectide_core::params::params_of;
        use vectide_core::ParamValue;
        let dim = 4;
        let idx = (vectide_dhnsw::DESCRIPTOR.create)(
            dim,
            Metric::L2,
            &params_of([
                ("partition_points", ParamValue::Int(100)),
                ("m", ParamValue::Int(4)),
            ]),
        )
        .unwrap();
        let v: Vec<f32> = (0..700 * dim)
            .map(|i| ((i * 7919) % 1000) as f32 / 100.0)
            .collect();
        let ids: Vec<u64> = (0..700).collect();
        idx.insert(1, &ids[..600], &v[..600 * dim]).unwrap();
        idx.insert(2, &ids[600..], &v[600 * dim..]).unwrap();
        idx.delete(3, &[1, 2, 3, 650]).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("i.dhnsw");
        idx.save(&path).unwrap();
        let s = vectide_dhnsw::persist::read_saved(&path).unwrap();
        (s.image, dim)
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..2048), k in 0u32..8) {
        let _ = Header::decode(&bytes, bytes.len() as u64);
        let _ = Entry::decode_table(&bytes, k, 64, 1 << 20);
        if let Ok(g) = SubGraph::decode(&bytes, (k % 3) as usize, k % 2 == 0, 3, 2, 4, 2) {
            check_graph(&g);
        }
        let _ = parse_saved(&bytes);
        let _ = decode_image(&bytes, 3, 0);
    }

    #[test]
    fn damaged_blobs_are_rejected_or_stay_inside(at in proptest::collection::vec((0usize..4096, any::<u8>()), 1..6)) {
        let mut b = valid_blob_with_overflow();
        for (i, v) in at {
            let n = b.len();
            b[i % n] = v;
        }
        if let Ok(g) = SubGraph::decode(&b, 1, false, 3, 2, 4, 2) {
            check_graph(&g);
            let mut s = vectide_graph::Scratch::default();
            let mut out = Vec::new();
            g.search(Metric::L2.distance_fn(), &[0.0, 0.0, 0.0], 3, 8, &mut s, |_| true, &mut out);
        }
    }

    #[test]
    fn damaged_images_are_rejected_or_consistent(at in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..6)) {
        let (img, dim) = image();
        let mut b = img.clone();
        for (i, v) in at {
            let n = b.len();
            b[i % n] = v;
        }
        if let Ok((h, table, meta, locs)) = decode_image(&b, *dim, 0) {
            prop_assert!(h.k as usize == table.len() && h.k >= 1);
            prop_assert!(meta.len() >= h.k as usize);
            let rec = u64::from(h.record);
            for e in &table {
                let (lo, hi) = e.range(rec).unwrap();
                prop_assert!(lo >= vectide_dhnsw::layout::SECTIONS_AT && hi <= h.alloc_end);
                for id in 0..u64::from(e.n_base) + e.count {
                    prop_assert!(e.node_at(id, rec) + rec <= h.alloc_end);
                }
            }
            for (_, l) in locs {
                prop_assert!((l.part as usize) < table.len());
            }
        }
    }

    #[test]
    fn damaged_headers_are_rejected_or_in_bounds(at in proptest::collection::vec((0usize..256, any::<u8>()), 1..4)) {
        let h = Header {
            dim: 3, metric: Metric::L2, m: 2, m0: 4, k: 1,
            record: record_bytes(3, 4) as u32, epoch: 1, meta_off: 1280, meta_len: 64,
            table_off: 1344, alloc_end: 4096, region_size: 8192, live: 0,
            labels_off: 1472, labels_buckets: 64, keys: 0,
            free_off: 2496, free_slots: 4, boot: 0, owner: 0,
        };
        let mut b = h.encode();
        for (i, v) in at {
            b[i] = v;
        }
        if let Ok(d) = Header::decode(&b, 8192) {
            prop_assert!(d.alloc_end <= 8192 && d.meta_off + d.meta_len <= d.alloc_end);
            prop_assert!(d.labels_off + d.labels_buckets * 16 <= d.alloc_end);
        }
    }
}
