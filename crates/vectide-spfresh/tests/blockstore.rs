//! The block store against an oracle (a map of posting id → records), in
//! the crash simulator (every sync point; recovery from the last durable
//! snapshot reads exactly what it recorded), under concurrent APPENDs and
//! GETs, on a real `O_DIRECT` file, and with bad input.

use proptest::prelude::*;
use std::collections::BTreeMap;
use std::sync::Arc;
use vectide_core::sync::SyncSite;
use vectide_core::Error;
use vectide_spfresh::layout::{decode_map, encode_record};
use vectide_spfresh::{BlockStore, ReadScratch, Records, Swap};
use vectide_storage::block::{BlockFile, DirectFile, SimBlockFile, BLOCK};

const DIM: usize = 8;

/// The record of vector id `vid` (its vector is a function of the id).
fn rec(out: &mut Vec<u8>, vid: u32, version: u8) {
    let v: Vec<f32> = (0..DIM).map(|j| vid as f32 + j as f32 * 0.25).collect();
    encode_record(out, vid, version, &v);
}

fn recs(vids: impl IntoIterator<Item = u32>) -> Vec<u8> {
    let mut out = Vec::new();
    for v in vids {
        rec(&mut out, v, (v % 128) as u8);
    }
    out
}

type Oracle = BTreeMap<u32, Vec<u32>>;

/// Every posting of `store` read back equals the oracle (and ParallelGET
/// agrees with GET).
fn check(store: &BlockStore, oracle: &Oracle) -> Result<(), String> {
    let mut sc = ReadScratch::default();
    let mut r = Records::default();
    for pid in 0..store.posting_ids() {
        let got = store
            .get(pid, &mut r, &mut sc)
            .map_err(|e| format!("get {pid}: {e}"))?;
        match (got.is_some(), oracle.get(&pid)) {
            (false, None) => {}
            (true, Some(want)) => {
                if &r.vids != want {
                    return Err(format!("posting {pid}: {:?} != {want:?}", r.vids));
                }
                for (i, &v) in r.vids.iter().enumerate() {
                    if r.versions[i] != (v % 128) as u8 || r.vector(i, DIM)[1] != v as f32 + 0.25 {
                        return Err(format!("posting {pid}: record {i} garbled"));
                    }
                }
            }
            (live, want) => return Err(format!("posting {pid}: live {live}, oracle {want:?}")),
        }
    }
    let pids: Vec<u32> = (0..store.posting_ids()).collect();
    store
        .parallel_get(&pids, &mut sc)
        .map_err(|e| format!("parallel_get: {e}"))?;
    for (pid, got) in pids.iter().zip(sc.records()) {
        let want = oracle.get(pid).cloned().unwrap_or_default();
        if got.vids != want {
            return Err(format!("parallel_get {pid}: {:?} != {want:?}", got.vids));
        }
    }
    Ok(())
}

#[derive(Debug, Clone)]
enum Op {
    Create(u8),
    Append(u8, u8),
    Put(u8, u8),
    Remove(u8),
    Snapshot,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        1 => any::<u8>().prop_map(Op::Create),
        6 => (any::<u8>(), 1u8..60).prop_map(|(p, n)| Op::Append(p, n)),
        2 => (any::<u8>(), any::<u8>()).prop_map(|(p, n)| Op::Put(p, n)),
        1 => any::<u8>().prop_map(Op::Remove),
        1 => Just(Op::Snapshot),
    ]
}

/// Runs `ops` on `store`, keeping `oracle` in step; after each durable
/// snapshot, `on_snapshot(encoded mapping, oracle)`.
fn run(
    store: &BlockStore,
    ops: &[Op],
    oracle: &mut Oracle,
    mut on_snapshot: impl FnMut(&[u8], &Oracle),
) {
    let mut sc = ReadScratch::default();
    let mut next_vid = 0u32;
    let mut fresh = |n: u32| {
        let v: Vec<u32> = (next_vid..next_vid + n).collect();
        next_vid += n;
        v
    };
    let pick =
        |oracle: &Oracle, p: u8| oracle.keys().nth(p as usize % oracle.len().max(1)).copied();
    for op in ops {
        match *op {
            Op::Create(n) => {
                let v = fresh(n as u32);
                let pid = store.create_posting(&recs(v.clone())).unwrap();
                oracle.insert(pid, v);
            }
            Op::Append(p, n) => {
                let Some(pid) = pick(oracle, p) else { continue };
                let v = fresh(n as u32);
                let len = oracle[&pid].len() as u32 + n as u32;
                assert_eq!(
                    store.append(pid, &recs(v.clone()), &mut sc).unwrap(),
                    Swap::Done(len)
                );
                oracle.get_mut(&pid).unwrap().extend(v);
            }
            Op::Put(p, n) => {
                let Some(pid) = pick(oracle, p) else { continue };
                let v = fresh(n as u32);
                let e = store.entry(pid);
                assert_eq!(
                    store.put(pid, &recs(v.clone()), &e).unwrap(),
                    Swap::Done(n as u32)
                );
                oracle.insert(pid, v);
            }
            Op::Remove(p) => {
                let Some(pid) = pick(oracle, p) else { continue };
                let e = store.entry(pid).unwrap();
                assert_eq!(store.remove(pid, &e), Swap::Done(0));
                oracle.remove(&pid);
            }
            Op::Snapshot => {
                let mut bytes = Vec::new();
                store.snapshot(&mut bytes).unwrap();
                store.snapshot_durable();
                on_snapshot(&bytes, oracle);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Reads equal the oracle after every workload, and a store reopened
    /// from its last snapshot (on the file as it is, and on a crash image
    /// of it) reads exactly what the snapshot recorded.
    #[test]
    fn the_store_matches_an_oracle_and_its_snapshots(ops in proptest::collection::vec(op(), 1..60), seed in 1u64..1000) {
        let file = Arc::new(SimBlockFile::new(seed));
        let store = BlockStore::create(Box::new(file.clone()), DIM).unwrap();
        let mut oracle = Oracle::new();
        let mut last: Option<(Vec<u8>, Oracle)> = None;
        run(&store, &ops, &mut oracle, |b, o| last = Some((b.to_vec(), o.clone())));
        check(&store, &oracle).map_err(TestCaseError::fail)?;
        if let Some((bytes, at)) = last {
            let image = file.image_now();
            let crashed = SimBlockFile::with_durable(image.bytes, seed).unwrap();
            let (reopened, used) = BlockStore::open_encoded(Box::new(crashed), &bytes).unwrap();
            prop_assert_eq!(used, bytes.len());
            check(&reopened, &at).map_err(TestCaseError::fail)?;
            // The reopened store goes on writing where the snapshot left off.
            let mut o = at.clone();
            run(&reopened, &[Op::Create(30), Op::Append(0, 50), Op::Append(1, 3)], &mut o, |_, _| {});
            check(&reopened, &o).map_err(TestCaseError::fail)?;
        }
    }
}

/// A long workload with a snapshot every few operations, and a crash image
/// just before every sync point: recovery from the last snapshot made
/// durable before that point reads exactly what it recorded, in every
/// image. Writes go on between a snapshot's capture and its image being
/// durable. Then the mutation check: when released blocks are reused from
/// the capture on (the hold-back cut short), some image recovers a posting
/// whose blocks were overwritten, and the store's checks say so.
#[test]
fn every_crash_image_recovers_the_last_durable_snapshot() {
    let (checked, violations) = crash_run(false);
    assert!(checked >= 20, "only {checked} images");
    assert_eq!(violations, 0);
    let (early, violations) = crash_run(true);
    eprintln!(
        "crash images: {checked} checked, 0 violations; reusing early: {violations} of {early}"
    );
    assert!(
        violations > 0,
        "reusing blocks before the next snapshot went unnoticed"
    );
}

/// Crash images checked and violations; `reuse_early` frees released
/// blocks as soon as a snapshot is captured instead of once its image is
/// durable.
fn crash_run(reuse_early: bool) -> (usize, usize) {
    let mut rng = 7u64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let file = Arc::new(SimBlockFile::new(11));
    file.crash_before(0..1000);
    let store = BlockStore::create(Box::new(file.clone()), DIM).unwrap();
    let mut oracle = Oracle::new();
    let mut sc = ReadScratch::default();
    let mut vid = 0u32;
    // The snapshot durable before each sync point: (sync point, bytes, oracle).
    let mut durable: Vec<(u64, Vec<u8>, Oracle)> = Vec::new();
    let mut empty = Vec::new();
    store.snapshot(&mut empty).unwrap();
    store.snapshot_durable();
    durable.push((file.sync_points(), empty, Oracle::new()));
    for _ in 0..40 {
        for _ in 0..12 {
            let r = next();
            if oracle.len() < 6 || r % 9 == 0 {
                let pid = store
                    .create_posting(&recs(vid..vid + (r % 40) as u32))
                    .unwrap();
                oracle.insert(pid, (vid..vid + (r % 40) as u32).collect());
                vid += 40;
            } else {
                let pid = *oracle.keys().nth((r >> 8) as usize % oracle.len()).unwrap();
                if r % 5 == 0 {
                    let e = store.entry(pid);
                    let n = (r >> 20) as u32 % 90;
                    store.put(pid, &recs(vid..vid + n), &e).unwrap();
                    oracle.insert(pid, (vid..vid + n).collect());
                } else if r % 11 == 0 {
                    let e = store.entry(pid).unwrap();
                    store.remove(pid, &e);
                    oracle.remove(&pid);
                } else {
                    let n = 1 + (r >> 20) as u32 % 30;
                    store.append(pid, &recs(vid..vid + n), &mut sc).unwrap();
                    oracle.get_mut(&pid).unwrap().extend(vid..vid + n);
                }
                vid += 100;
            }
        }
        // Capture and sync; then writes go on while the caller makes the
        // image durable (modelled by one more sync point), and only then
        // are the blocks released before the capture reused. The mutation
        // reuses them at once, during those writes.
        let mut bytes = Vec::new();
        store.snapshot(&mut bytes).unwrap();
        let at_capture = oracle.clone();
        if reuse_early {
            store.snapshot_durable();
        }
        for k in 0..4u32 {
            let pid = *oracle.keys().nth(k as usize % oracle.len()).unwrap();
            let e = store.entry(pid);
            store.put(pid, &recs(vid..vid + 30), &e).unwrap();
            oracle.insert(pid, (vid..vid + 30).collect());
            vid += 100;
        }
        file.sync().unwrap(); // the image is durable
        durable.push((file.sync_points(), bytes, at_capture));
        if !reuse_early {
            store.snapshot_durable();
        }
    }
    let mut checked = 0;
    let mut violations = 0;
    for image in file.take_images() {
        // The last snapshot whose sync completed before this point.
        let Some((_, bytes, at)) = durable
            .iter()
            .rev()
            .find(|(p, _, _)| *p <= image.sync_point)
        else {
            continue;
        };
        checked += 1;
        let crashed = SimBlockFile::with_durable(image.bytes, 3).unwrap();
        let ok = BlockStore::open_encoded(Box::new(crashed), bytes)
            .map_err(|e| e.to_string())
            .and_then(|(s, _)| check(&s, at));
        if ok.is_err() {
            violations += 1;
        }
    }
    (checked, violations)
}

#[test]
fn concurrent_appends_all_land_once_and_readers_see_whole_postings() {
    let store = Arc::new(BlockStore::create(Box::new(SimBlockFile::new(5)), DIM).unwrap());
    let pids: Vec<u32> = (0..3).map(|_| store.create_posting(&[]).unwrap()).collect();
    let writers = 4u32;
    let per = 150u32;
    std::thread::scope(|s| {
        for t in 0..writers {
            let store = store.clone();
            let pids = pids.clone();
            s.spawn(move || {
                let mut sc = ReadScratch::default();
                for i in 0..per {
                    let vid = t * 100_000 + i;
                    let pid = pids[(i % 3) as usize];
                    assert!(matches!(
                        store.append(pid, &recs([vid]), &mut sc).unwrap(),
                        Swap::Done(_)
                    ));
                }
            });
        }
        let store = store.clone();
        s.spawn(move || {
            let mut sc = ReadScratch::default();
            let mut r = Records::default();
            for k in 0..300 {
                let pid = (k % 3) as u32;
                store.get(pid, &mut r, &mut sc).unwrap();
                // Whole records only, each vector matching its id.
                for (i, &v) in r.vids.iter().enumerate() {
                    assert_eq!(r.vector(i, DIM)[0], v as f32);
                }
            }
        });
    });
    let mut sc = ReadScratch::default();
    let mut all = Vec::new();
    for &pid in &pids {
        let mut r = Records::default();
        store.get(pid, &mut r, &mut sc).unwrap();
        all.extend(r.vids);
    }
    all.sort_unstable();
    let mut want: Vec<u32> = (0..writers)
        .flat_map(|t| (0..per).map(move |i| t * 100_000 + i))
        .collect();
    want.sort_unstable();
    assert_eq!(all, want);
    let st = store.stats();
    assert_eq!(st.postings, 3);
    // Every APPEND released at most its old tail: the blocks in use plus
    // the held and free ones account for every block handed out.
    assert_eq!(
        st.blocks_used + st.blocks_free + st.blocks_held + 1,
        st.blocks_end
    );
}

#[test]
fn snapshots_and_puts_racing_appends_and_reads_lose_nothing() {
    let store = Arc::new(BlockStore::create(Box::new(SimBlockFile::new(9)), DIM).unwrap());
    let pids: Vec<u32> = (0..2)
        .map(|_| store.create_posting(&recs(0..0)).unwrap())
        .collect();
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let writer = s.spawn(|| {
            let mut sc = ReadScratch::default();
            for vid in 0..400u32 {
                let r = store.append(pids[(vid % 2) as usize], &recs([vid]), &mut sc);
                assert!(matches!(r.unwrap(), Swap::Done(_)));
            }
            done.store(true, std::sync::atomic::Ordering::Release);
        });
        // A garbage collector: rewrites each posting whole (same records),
        // by CAS, so its blocks are released and, after snapshots, reused.
        s.spawn(|| {
            let mut sc = ReadScratch::default();
            let mut r = Records::default();
            while !done.load(std::sync::atomic::Ordering::Acquire) {
                for &pid in &pids {
                    let e = store.get(pid, &mut r, &mut sc).unwrap();
                    let mut bytes = Vec::new();
                    r.encode(DIM, &mut bytes);
                    let _ = store.put(pid, &bytes, &e).unwrap();
                }
            }
        });
        s.spawn(|| {
            while !done.load(std::sync::atomic::Ordering::Acquire) {
                let mut b = Vec::new();
                store.snapshot(&mut b).unwrap();
                assert!(store.snapshot(&mut Vec::new()).is_err(), "one at a time");
                store.snapshot_durable();
            }
        });
        s.spawn(|| {
            let mut sc = ReadScratch::default();
            while !done.load(std::sync::atomic::Ordering::Acquire) {
                store.parallel_get(&pids, &mut sc).unwrap();
                // Each posting's own records (vector v went to posting
                // v % 2), also those read again after a swap.
                for (k, r) in sc.records().enumerate() {
                    for (i, &v) in r.vids.iter().enumerate() {
                        assert_eq!(r.vector(i, DIM)[0], v as f32);
                        assert_eq!(v % 2, k as u32, "vector {v} credited to posting {k}");
                    }
                }
            }
        });
        writer.join().unwrap();
    });
    for (k, &pid) in pids.iter().enumerate() {
        let mut r = Records::default();
        store.get(pid, &mut r, &mut ReadScratch::default()).unwrap();
        let mut got = r.vids.clone();
        got.sort_unstable();
        let want: Vec<u32> = (0..400).filter(|v| v % 2 == k as u32).collect();
        assert_eq!(got, want, "posting {pid}");
    }
    let st = store.stats();
    assert_eq!(
        st.blocks_used + st.blocks_free + st.blocks_held + 1,
        st.blocks_end,
        "no block leaked"
    );
}

/// A scratch reused for batches that each hold one big posting in a
/// different place keeps about one batch's records, not the big posting's
/// size in every place (session 44's `spann-inplace` server soak: the
/// pooled scratches of 64-posting searches crept up).
#[test]
fn a_reused_read_scratch_keeps_one_batch_not_the_largest_posting_per_place() {
    const PLACES: usize = 16;
    const BIG: u32 = 400;
    let store = BlockStore::create(Box::new(SimBlockFile::new(5)), DIM).unwrap();
    let big = store.create_posting(&recs(0..BIG)).unwrap();
    let small: Vec<u32> = (0..PLACES as u32 - 1)
        .map(|i| store.create_posting(&recs([BIG + i])).unwrap())
        .collect();
    let mut sc = ReadScratch::default();
    let mut largest_batch = 0;
    for place in 0..PLACES {
        let mut pids = small.clone();
        pids.insert(place, big);
        store.parallel_get(&pids, &mut sc).unwrap();
        assert_eq!(sc.postings(), PLACES);
        for (i, r) in sc.records().enumerate() {
            let want = if i == place { BIG as usize } else { 1 };
            assert_eq!(r.len(), want, "posting {i} of batch {place}");
            for (j, &v) in r.vids.iter().enumerate() {
                assert_eq!(r.vector(j, DIM)[0], v as f32);
            }
        }
        largest_batch = largest_batch.max(sc.records().map(|r| r.len()).sum::<usize>());
    }
    let record = 4 + 1 + DIM * 4;
    let one_batch = largest_batch * record;
    // The blocks read (a power of two of them), the payload of the largest
    // posting, and the decoded batch twice over (a vector's growth).
    let bound = (BIG as usize * record / BLOCK + PLACES).next_power_of_two() * BLOCK
        + BIG as usize * record
        + 2 * one_batch
        + 4096;
    assert!(
        sc.capacity_bytes() <= bound,
        "{} bytes kept, at most {bound} expected (the big posting in all {PLACES} places would be {})",
        sc.capacity_bytes(),
        PLACES * BIG as usize * record
    );
}

/// A reader's guard against copies dropped under it: PUTs and removals
/// mark their posting as shrunk past the count a reader took; creates and
/// APPENDs (which drop nothing) do not.
#[test]
fn puts_and_removals_and_only_they_mark_a_posting_shrunk() {
    let store = BlockStore::create(Box::new(SimBlockFile::new(3)), DIM).unwrap();
    let mut sc = ReadScratch::default();
    let a = store.create_posting(&recs([1, 2])).unwrap();
    let b = store.create_posting(&recs([3])).unwrap();
    let t0 = store.shrink_count();
    store.append(a, &recs([4]), &mut sc).unwrap();
    assert!(!store.shrunk_since(&[a, b], t0), "an APPEND drops nothing");
    let e = store.entry(a);
    assert_eq!(store.put(a, &recs([1, 4]), &e).unwrap(), Swap::Done(2));
    assert!(store.shrunk_since(&[a], t0));
    assert!(store.shrunk_since(&[b, a], t0));
    assert!(!store.shrunk_since(&[b], t0), "only the posting PUT");
    let t1 = store.shrink_count();
    assert!(t1 > t0);
    assert!(
        !store.shrunk_since(&[a, b], t1),
        "nothing since the new count"
    );
    let eb = store.entry(b).unwrap();
    assert_eq!(store.remove(b, &eb), Swap::Done(0));
    assert!(store.shrunk_since(&[b], t1));
    assert!(
        !store.shrunk_since(&[a, 99], t1),
        "an unknown id never shrank"
    );
}

#[test]
fn a_real_o_direct_file_round_trips_through_a_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("postings.blk");
    let site = SyncSite("test.blockstore");
    let file = DirectFile::open(&path, true, site).unwrap();
    let store = BlockStore::create(Box::new(file), DIM).unwrap();
    let mut oracle = Oracle::new();
    let mut snap = Vec::new();
    run(
        &store,
        &[
            Op::Create(200),
            Op::Create(3),
            Op::Append(0, 50),
            Op::Append(1, 59),
            Op::Put(1, 20),
            Op::Snapshot,
        ],
        &mut oracle,
        |b, _| snap = b.to_vec(),
    );
    check(&store, &oracle).unwrap();
    drop(store);
    let file = DirectFile::open(&path, false, site).unwrap();
    let (store, _) = BlockStore::open_encoded(Box::new(file), &snap).unwrap();
    check(&store, &oracle).unwrap();
    assert!(store.io_stats().blocks_read > 0);
}

/// APPENDs after the first to a posting write their fresh block from the
/// tail cache, reading nothing back; after a reopen (an empty cache) the
/// first APPEND to a posting reads its tail once; PUTs and new postings
/// leave their tail cached too. The oracle holds throughout.
#[test]
fn appends_write_from_the_tail_cache_without_reading_the_tail() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("postings.blk");
    let site = SyncSite("test.blockstore");
    let store =
        BlockStore::create(Box::new(DirectFile::open(&path, true, site).unwrap()), DIM).unwrap();
    let mut oracle = Oracle::new();
    let mut snap = Vec::new();
    let mut ops = vec![Op::Create(3), Op::Create(1)];
    ops.extend((0..60).map(|i| Op::Append(i % 2, 1 + i % 3)));
    ops.extend([Op::Put(0, 7), Op::Append(0, 2), Op::Snapshot]);
    run(&store, &ops, &mut oracle, |b, _| snap = b.to_vec());
    let st = store.stats();
    assert_eq!(
        (st.tail_hits, st.tail_misses, st.blocks_read),
        (61, 0, 0),
        "{st:?}"
    );
    assert!(st.tail_bytes > 0 && st.tail_bytes < 2 * BLOCK as u64);
    check(&store, &oracle).unwrap();
    drop(store);

    let file = DirectFile::open(&path, false, site).unwrap();
    let (store, _) = BlockStore::open_encoded(Box::new(file), &snap).unwrap();
    let mut sc = ReadScratch::default();
    for (i, pid) in [0u32, 1, 0, 1, 0].into_iter().enumerate() {
        let vid = 10_000 + i as u32;
        let len = oracle[&pid].len() as u32 + 1;
        assert_eq!(
            store.append(pid, &recs([vid]), &mut sc).unwrap(),
            Swap::Done(len)
        );
        oracle.get_mut(&pid).unwrap().push(vid);
    }
    let st = store.stats();
    assert_eq!(
        (st.tail_hits, st.tail_misses, st.blocks_read),
        (3, 2, 2),
        "{st:?}"
    );
    check(&store, &oracle).unwrap();
}

#[test]
fn bad_input_is_an_error_and_changes_nothing() {
    let store = BlockStore::create(Box::new(SimBlockFile::new(1)), DIM).unwrap();
    let pid = store.create_posting(&recs(0..5)).unwrap();
    let mut sc = ReadScratch::default();
    // Not whole records.
    let mut half = recs([9]);
    half.pop();
    assert!(matches!(
        store.append(pid, &half, &mut sc),
        Err(Error::InvalidInput(_))
    ));
    assert!(matches!(
        store.create_posting(&half),
        Err(Error::InvalidInput(_))
    ));
    assert_eq!(store.append(77, &recs([1]), &mut sc).unwrap(), Swap::Gone);
    assert_eq!(store.put(77, &recs([1]), &None).unwrap(), Swap::Gone);
    // A stale expectation loses its CAS and frees what it wrote.
    let before = store.entry(pid);
    store.append(pid, &recs([5]), &mut sc).unwrap();
    let end = store.stats().blocks_end;
    assert_eq!(store.put(pid, &recs([6]), &before).unwrap(), Swap::Changed);
    let mut oracle = Oracle::new();
    oracle.insert(pid, (0..6).collect());
    check(&store, &oracle).unwrap();
    assert_eq!(store.stats().blocks_end, end + 1);
    assert_eq!(
        store.stats().blocks_free,
        1,
        "the loser's block is free again"
    );
    assert!(BlockStore::create(Box::new(SimBlockFile::new(1)), 0).is_err());
}

#[test]
fn opening_checks_the_header_the_dimension_and_the_blocks() {
    let file = Arc::new(SimBlockFile::new(2));
    let store = BlockStore::create(Box::new(file.clone()), DIM).unwrap();
    let pid = store.create_posting(&recs(0..300)).unwrap();
    let mut snap = Vec::new();
    store.snapshot(&mut snap).unwrap();
    store.snapshot_durable();
    let bytes = file.current();
    let open = |b: Vec<u8>| {
        BlockStore::open_encoded(Box::new(SimBlockFile::with_durable(b, 1).unwrap()), &snap)
    };
    assert!(open(bytes.clone()).is_ok());
    // A flipped bit in a posting's block: reading it is an error, not a
    // wrong answer.
    let (map, _) = decode_map(&snap).unwrap();
    let b = map.postings[pid as usize].as_ref().unwrap().blocks[1].block as usize;
    let mut flipped = bytes.clone();
    flipped[b * BLOCK + 1000] ^= 4;
    let (s, _) = open(flipped).unwrap();
    let mut r = Records::default();
    assert!(matches!(
        s.get(pid, &mut r, &mut ReadScratch::default()),
        Err(Error::Corrupted(_))
    ));
    // A bad header block; a file shorter than the mapping; another dimension.
    let mut bad = bytes.clone();
    bad[3] ^= 1;
    assert!(matches!(open(bad), Err(Error::Corrupted(_))));
    assert!(matches!(
        open(bytes[..2 * BLOCK].to_vec()),
        Err(Error::Corrupted(_))
    ));
    let g = Arc::new(SimBlockFile::new(1));
    BlockStore::create(Box::new(g.clone()), DIM + 1).unwrap();
    let mut hdr = bytes.clone();
    hdr[..BLOCK].copy_from_slice(&g.current()[..BLOCK]);
    assert!(matches!(open(hdr), Err(Error::DimensionMismatch { .. })));
}
