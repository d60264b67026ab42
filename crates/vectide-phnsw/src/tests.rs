//! Unit tests of the sequence-number rules, each pinning one interleaving of
//! concurrent writers that the crash harnesses reach only by chance.

use super::layout::M_DURABLE_SEQ;
use super::{PHnsw, PHnswParams};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use vectide_core::{Metric, VectorIndex};
use vectide_graph::HnswParams;
use vectide_storage::{PersistMode, SimConfig, SimMedia};

fn params() -> PHnswParams {
    PHnswParams {
        hnsw: HnswParams {
            m: 4,
            ef_construction: 16,
            threads: Some(1),
            ..HnswParams::default()
        },
        nlog_entries: 4,
        nlist_entries: 16,
        initial_capacity: 16,
    }
}

fn v(x: f32) -> Vec<f32> {
    vec![x, 1.0 - x, 0.5 * x, 2.0]
}

/// Three writers, a crash: op 4 was in flight (discarded), op 5 (upsert of
/// label 1) and op 6 (upsert of label 2) had finished, so the durable
/// watermark stayed at 3 while nodes numbered 5 and 6 survived. A client
/// that numbers its next operations from `durable_seq()` (as `vectide.Index`
/// does) sends 4, 5, 6 again: they are new operations, not replays.
#[test]
fn numbers_above_the_durable_watermark_do_not_survive_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let idx = PHnsw::create(dir.path(), 4, Metric::L2, params(), PersistMode::Msync).unwrap();
    idx.insert(1, &[1, 2, 3], &[v(0.1), v(0.2), v(0.3)].concat())
        .unwrap();
    idx.insert(5, &[1], &v(0.5)).unwrap();
    idx.insert(6, &[2], &v(0.6)).unwrap();
    // The watermark the crash left: op 4 never finished.
    idx.meta.u64_at(M_DURABLE_SEQ).store(3, Ordering::Release);
    drop(idx);

    let idx = PHnsw::open(dir.path(), PersistMode::Msync, None).unwrap();
    assert_eq!(idx.durable_seq(), 3);
    // The client's next numbers: 4, 5, 6.
    idx.insert(4, &[1], &v(0.7)).unwrap();
    assert_eq!(
        idx.delete(5, &[2]).unwrap(),
        1,
        "a delete numbered 5 after the reopen is not older than the write numbered 6 before it"
    );
    assert_eq!(
        idx.get(1).unwrap().unwrap(),
        v(0.7),
        "an upsert numbered 4 after the reopen replaces the node numbered 5 before it"
    );
    assert!(!idx.contains(2).unwrap());
    // Within one open, numbers keep their meaning: an older replay is
    // skipped.
    idx.insert(3, &[1], &v(0.9)).unwrap();
    assert_eq!(idx.get(1).unwrap().unwrap(), v(0.7));
    assert_eq!(idx.delete(2, &[1]).unwrap(), 0);
    // Numbers at or below the watermark still mean what they did: a replay
    // of op 1 does not bring back label 2 or undo label 3.
    idx.insert(1, &[3], &v(0.95)).unwrap();
    assert_eq!(idx.get(3).unwrap().unwrap(), v(0.3));
    assert!(idx.check().is_empty(), "{:?}", idx.check());
}

/// Two writers finish together: B has raised the durable word to 7 and not
/// yet persisted it when A, whose operation 7 covers too, asks for it. A
/// acknowledges after its own fence, so that fence must carry the word.
#[test]
fn a_writer_does_not_rely_on_another_writers_unfenced_watermark() {
    let dir = tempfile::tempdir().unwrap();
    let sim = Arc::new(SimMedia::new(SimConfig::default()));
    let idx = PHnsw::create_on(dir.path(), 4, Metric::L2, params(), sim.clone()).unwrap();
    idx.insert(1, &[1], &v(0.1)).unwrap();
    // Writer B, between its fetch_max and its persist.
    idx.meta
        .u64_at(M_DURABLE_SEQ)
        .fetch_max(7, Ordering::AcqRel);
    // Writer A's end of operation: what `insert_logged` does after its
    // NLog `NONE`.
    idx.store_durable_seq(7);
    idx.meta.fence(super::builder::F_DONE);
    // A acknowledges: the watermark that covers it must survive a crash
    // now, whatever becomes of the lines still pending.
    for _ in 0..32 {
        let img = sim.image_now();
        let meta = img
            .regions
            .iter()
            .find(|r| r.name == super::layout::META_FILE)
            .unwrap();
        let word = u64::from_le_bytes(
            meta.bytes[M_DURABLE_SEQ..M_DURABLE_SEQ + 8]
                .try_into()
                .unwrap(),
        );
        assert_eq!(word, 7, "the durable word A's acknowledgement relies on");
    }
    // Once a fence made 7 durable, a writer that needs no more skips the
    // persist.
    idx.durable_seq_fenced(7);
    assert!(!idx.store_durable_seq(6));
    assert!(!idx.store_durable_seq(7));
    assert!(idx.store_durable_seq(8));
}

/// Writers whose inserts grow the node and upper-list files, watched by a
/// thread that reads the allocation words the way an open after a crash
/// does (a SIGKILL keeps every store): a word must never name room beyond
/// its file, or the index no longer opens.
#[test]
fn allocation_words_never_pass_the_end_of_their_files() {
    use super::layout::{M_NEXT_SLOT, M_UPPER_NEXT};
    use std::sync::atomic::AtomicBool;
    let dir = tempfile::tempdir().unwrap();
    let idx = PHnsw::create(dir.path(), 4, Metric::L2, params(), PersistMode::Pmem).unwrap();
    let done = AtomicBool::new(false);
    let seen = std::thread::scope(|s| {
        let monitor = s.spawn(|| {
            let mut bad = Vec::new();
            while !done.load(Ordering::Acquire) && bad.len() < 4 {
                let next = idx.meta.u64_at(M_NEXT_SLOT).load(Ordering::Acquire) as usize;
                let upper = idx.meta.u64_at(M_UPPER_NEXT).load(Ordering::Acquire) as usize;
                let (cap, len) = (idx.graph.capacity(), idx.graph.upper.len());
                if next > cap {
                    bad.push(format!("next slot {next} beyond {cap} node blocks"));
                }
                if upper > len {
                    bad.push(format!("upper word {upper} beyond {len} bytes"));
                }
            }
            bad
        });
        let writers: Vec<_> = (0..3u64)
            .map(|t| {
                let idx = &idx;
                s.spawn(move || {
                    for i in 0..1500u64 {
                        let label = t * 1_000_000 + i;
                        idx.insert(label + 1, &[label], &v((i % 97) as f32 / 97.0 + t as f32))
                            .unwrap();
                    }
                })
            })
            .collect();
        for w in writers {
            w.join().unwrap();
        }
        done.store(true, Ordering::Release);
        monitor.join().unwrap()
    });
    assert!(seen.is_empty(), "{seen:?}");
    assert_eq!(idx.len(), 4500);
}

/// Writer A ends an operation: its NLog entry's `NONE` is stored and
/// persisted, its fence not yet done, so the durable state is still the
/// operation's own (`LOGGED` here). Writer B claims an entry meanwhile. Had
/// it taken A's, its content would share the cache line with A's durable
/// `LOGGED`, and a crash could leave A's state over a mix of both contents,
/// which recovery would redo.
#[test]
fn an_nlog_entry_is_not_reused_before_its_release_is_durable() {
    use super::log::{NEntry, KIND_DELETE, LOGGED, NONE};
    use vectide_storage::Site;
    let dir = tempfile::tempdir().unwrap();
    let sim = Arc::new(SimMedia::new(SimConfig::default()));
    let idx = PHnsw::create_on(dir.path(), 4, Metric::L2, params(), sim).unwrap();
    let (logs, meta) = (&idx.logs, &idx.meta);
    let site = Site("test");
    // Writer A: a whole logged operation up to its last fence.
    let a = logs.nlog_claim(meta);
    let e = NEntry {
        kind: KIND_DELETE,
        level: 0,
        slot: 0,
        label: 7,
        seq: 1,
        old: Some(0),
        live_before: 0,
        lists: Vec::new(),
    };
    logs.nlog_write(meta, a, &e, site);
    meta.fence(site);
    logs.nlog_set_state(meta, a, LOGGED, site);
    meta.fence(site);
    logs.nlog_set_state(meta, a, NONE, site);
    // Writer B, before A's fence.
    let b = logs.nlog_claim(meta);
    assert_ne!(a, b, "entry {a} claimed again before its NONE was durable");
    // A's fence, then its release: the entry is free again.
    meta.fence(site);
    logs.nlog_release(a);
    assert_eq!(logs.nlog_claim(meta), a);
}

/// An index holding labels `1..=n`, inserted as operation 1.
fn labels_1_to(n: u64) -> (tempfile::TempDir, PHnsw) {
    let dir = tempfile::tempdir().unwrap();
    let idx = PHnsw::create(dir.path(), 4, Metric::L2, params(), PersistMode::Msync).unwrap();
    let ids: Vec<u64> = (1..=n).collect();
    let rows: Vec<f32> = ids.iter().flat_map(|&i| v(i as f32 / n as f32)).collect();
    idx.insert(1, &ids, &rows).unwrap();
    (dir, idx)
}

/// Flips one byte of the vector of `label`'s node in `nodes.vtdp`; returns
/// the node's slot.
fn flip_vector_byte(idx: &PHnsw, dir: &std::path::Path, label: u64) -> u32 {
    let slot = idx.labels.get(&idx.graph, label).unwrap();
    let at = idx.graph.node_off(slot) + idx.g.n_vector() + 5;
    let path = dir.join(super::layout::NODES_FILE);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[at] ^= 0x10;
    std::fs::write(&path, bytes).unwrap();
    slot
}

fn corrupted_naming(r: vectide_core::Result<impl std::fmt::Debug>, slot: u32) {
    match r {
        Err(vectide_core::Error::Corrupted(m)) => {
            assert!(m.contains(&format!("node {slot}:")), "{m}")
        }
        other => panic!("expected Corrupted naming node {slot}, got {other:?}"),
    }
}

/// A byte flipped in a node's vector on disk: the check, `vectide inspect`
/// and the explicit verify pass report it as corruption naming the slot;
/// searches still run (they do not verify).
#[test]
fn a_flipped_vector_byte_is_reported_naming_its_node() {
    let (dir, idx) = labels_1_to(20);
    assert_eq!(idx.verify().unwrap(), 20);
    assert!(idx.check().is_empty(), "{:?}", idx.check());
    let rows = super::inspect::inspect(dir.path()).unwrap();
    assert!(rows
        .iter()
        .any(|(k, v)| k == "node_checksums" && v.starts_with("20 ")));
    let slot = flip_vector_byte(&idx, dir.path(), 7);
    drop(idx);

    corrupted_naming(super::inspect::inspect(dir.path()), slot);
    let idx = PHnsw::open(dir.path(), PersistMode::Msync, None).unwrap();
    corrupted_naming(idx.verify(), slot);
    corrupted_naming(idx.check_structure(), slot);
    let found = idx.check();
    assert!(
        found
            .iter()
            .any(|m| m.contains(&format!("node {slot}: checksum"))),
        "{found:?}"
    );
    assert_eq!(
        idx.search(&v(0.5), 3, &Default::default(), None)
            .unwrap()
            .len(),
        3
    );
}

/// A logged delete in flight whose node was damaged: recovery verifies the
/// nodes it is about to redo and refuses to open, naming the slot, rather
/// than act on them.
#[test]
fn recovery_verifies_the_nodes_it_redoes() {
    use super::log::{NEntry, KIND_DELETE, LOGGED};
    let (dir, idx) = labels_1_to(10);
    let slot = idx.labels.get(&idx.graph, 3).unwrap();
    // A delete of label 3 that crashed after its LOGGED fence.
    let e = NEntry {
        kind: KIND_DELETE,
        level: 0,
        slot,
        label: 3,
        seq: 2,
        old: Some(slot),
        live_before: idx.logs.nlog_live(&idx.meta, 0),
        lists: Vec::new(),
    };
    let site = vectide_storage::Site("test.delete");
    idx.logs.nlog_write(&idx.meta, 0, &e, site);
    idx.logs.nlog_set_state(&idx.meta, 0, LOGGED, site);
    idx.meta.fence(site);
    assert_eq!(flip_vector_byte(&idx, dir.path(), 3), slot);
    drop(idx);
    corrupted_naming(
        PHnsw::open(dir.path(), PersistMode::Msync, None).map(|_| ()),
        slot,
    );
}

/// What a consolidation cut off between its repaired lists and its relinks
/// leaves: a live node that no list names (the pruning dropped its last
/// in-edges, the relink never came), the dead node still `DELETED`, the
/// meta word `consolidating` set. The crash kit found such a node at rank
/// 1 by nothing, round after round. The open finishes the consolidation.
#[test]
fn an_open_finishes_a_consolidation_cut_off_before_its_relinks() {
    use super::layout::{unpack_entry, DELETED, LIVE, M_CONSOLIDATING, M_ENTRY, UNLINKED};
    use vectide_graph::Graph;
    let (dir, idx) = labels_1_to(30);
    let dead = idx.labels.get(&idx.graph, 5).unwrap();
    assert_eq!(idx.delete(2, &[5]).unwrap(), 1);
    let g = &idx.graph;
    let (ep, _) = unpack_entry(idx.meta.u64_at(M_ENTRY).load(Ordering::Acquire)).unwrap();
    let y = (0..idx.next_slot() as u32)
        .find(|&s| g.state(s) == LIVE && g.level(s) == 0 && s != ep)
        .expect("a layer-0 node");
    let y_label = g.label(y);
    let mut buf = Vec::new();
    for s in 0..idx.next_slot() as u32 {
        for l in 0..=g.level(s) {
            g.neighbors_into(s, l, &mut buf);
            if buf.contains(&y) {
                buf.retain(|&n| n != y);
                idx.write_list(s, l, &buf, super::consolidate::S_C_LISTS);
            }
        }
    }
    idx.meta.u64_at(M_CONSOLIDATING).store(1, Ordering::Release);
    drop(idx);

    let idx = PHnsw::open(dir.path(), PersistMode::Msync, None).unwrap();
    let q = idx.get(y_label).unwrap().unwrap();
    let r = idx
        .search(&q, 1, &vectide_core::SearchParams::with_ef(64), None)
        .unwrap();
    assert_eq!(r[0].id, y_label, "the orphan is reachable again");
    assert!(idx.recovery_report().consolidation_finished);
    assert_eq!(idx.graph.state(dead), UNLINKED);
    assert_ne!(idx.graph.state(dead), DELETED);
    assert_eq!(idx.meta.u64_at(M_CONSOLIDATING).load(Ordering::Acquire), 0);
    assert_eq!(idx.check(), Vec::<String>::new());
    // A clean open runs nothing.
    drop(idx);
    let idx = PHnsw::open(dir.path(), PersistMode::Msync, None).unwrap();
    assert!(!idx.recovery_report().consolidation_finished);
}

/// An insert that recovery discarded wrote its block, naming upper-list
/// room that its bump of `upper next` had taken, but the bump never reached
/// the media: a later insert was given the same room. The consolidation
/// that frees the discarded slot must not hand that room out with it (the
/// crash kit saw two live nodes sharing one room: each listed itself).
#[test]
fn a_freed_slot_never_brings_a_room_a_linked_node_owns() {
    use super::layout::LIVE;
    let (_dir, idx) = labels_1_to(30);
    let g = &idx.graph;
    let owner = (0..idx.next_slot() as u32)
        .find(|&s| g.state(s) == LIVE && g.level(s) > 0)
        .expect("a node with upper lists");
    let level = g.level(owner);
    let room = g
        .nodes
        .u64_at(g.node_off(owner) + idx.g.n_upper())
        .load(Ordering::Acquire);
    // The discarded insert's block: sealed, state INSERTING, the room.
    let ghost = idx.alloc_slot().unwrap();
    idx.init_node(ghost, 999, 2, &v(0.77), level, room);
    assert!(g.verify(ghost).is_ok());
    idx.consolidate().unwrap();
    assert!(idx.free.lock().contains(&ghost), "ghost freed");
    let end = room + (level * idx.g.upper_list_bytes()) as u64;
    for (s, e) in idx.rooms.lock().ranges() {
        assert!(
            e <= room || s >= end,
            "free room [{s}, {e}) overlaps [{room}, {end}), which node {owner} owns"
        );
    }
    // Inserts take the slot and the index stays whole.
    for (i, l) in (200..220u64).enumerate() {
        idx.insert(3 + i as u64, &[l], &v(0.013 * i as f32))
            .unwrap();
    }
    assert!(!idx.free.lock().contains(&ghost));
    assert_eq!(idx.check(), Vec::<String>::new());
}

/// The live set held constant while its labels are replaced round after
/// round (deletes, inserts of new labels, a consolidation each round):
/// after the first rounds, the upper-list room in use stops growing. Before
/// the room pool, a freed slot kept its room only for a node of no higher
/// level, so the rooms of slots reused by level-0 nodes were lost and
/// `upper next` climbed every round (a soak: 10x in 10 minutes).
#[test]
fn upper_list_room_follows_the_live_set_under_churn() {
    use super::layout::M_UPPER_NEXT;
    let (_dir, idx) = labels_1_to(400);
    let upper_next = || idx.meta.u64_at(M_UPPER_NEXT).load(Ordering::Acquire);
    let mut seq = 2;
    let mut next_label = 1_000u64;
    let mut live: Vec<u64> = (1..=400).collect();
    let mut after = Vec::new();
    for _ in 0..16 {
        // Replace half the live set.
        let gone: Vec<u64> = live.drain(..200).collect();
        idx.delete(seq, &gone).unwrap();
        seq += 1;
        let new: Vec<u64> = (next_label..next_label + 200).collect();
        next_label += 200;
        let rows: Vec<f32> = new
            .iter()
            .flat_map(|&l| v(((l * 7919) % 1000) as f32 / 1000.0))
            .collect();
        idx.insert(seq, &new, &rows).unwrap();
        seq += 1;
        live.extend(new);
        idx.consolidate().unwrap();
        after.push(upper_next());
    }
    // m = 4: about a quarter of the nodes have upper lists, ~100 lists
    // live; the first rounds take what the churn needs at most.
    let (settled, last) = (after[5], after[after.len() - 1]);
    assert!(
        last <= settled + settled / 10,
        "upper next grew from {settled} to {last} over {} rounds of a constant live set: {after:?}",
        after.len() - 6
    );
    assert_eq!(idx.check(), Vec::<String>::new());
    assert_eq!(idx.len(), 400);
}
