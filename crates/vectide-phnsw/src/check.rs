//! A full structural check of a P-HNSW index (O(n); for tests, the crash
//! checker and `vectide inspect`, never for recovery).

use super::layout::{unpack_entry, DELETED, LIVE, M_ENTRY, UNLINKED};
use super::log::NONE;
use super::state::PHnsw;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use vectide_core::{Result, VectorIndex};
use vectide_graph::prune::MAX_LEVEL;
use vectide_graph::Graph;

impl PHnsw {
    /// Checks the structure and returns every violation found (empty when
    /// sound): every linked node's checksum; entry point valid and on top;
    /// every list within bounds and
    /// naming only linked nodes; every upper-layer node present below; the
    /// label map a bijection onto the live nodes; the live count right; no
    /// log entry left in flight.
    pub fn check(&self) -> Vec<String> {
        let mut v = Vec::new();
        let g = &self.graph;
        let next = self.next_slot();
        if next > g.capacity() {
            v.push(format!("next slot {next} beyond capacity {}", g.capacity()));
            return v;
        }
        let linked = |s: u32| matches!(g.state(s), LIVE | DELETED);
        // A deleted node may still name an unlinked one: a consolidation
        // unlinks its dead nodes under one fence, and a crash before it can
        // keep any subset of them deleted, with their lists (only live
        // lists are repaired). The next consolidation unlinks them before
        // it hands any slot out.
        let dead_to_unlinked = |s: u32, n: u32| g.state(s) == DELETED && g.state(n) == UNLINKED;
        let mut max_level = None;
        // The entry point must top the live nodes (a consolidation moves it
        // off a deleted node to the highest live one; deleted nodes above it
        // are then unlinked, or stay unreachable from above until they are).
        let mut max_live_level = None;
        let mut buf = Vec::new();
        for s in 0..next as u32 {
            if !linked(s) {
                continue;
            }
            if let Err(e) = g.verify(s) {
                v.push(e.to_string());
            }
            let level = g.level(s);
            max_level = max_level.max(Some(level));
            if g.state(s) == LIVE {
                max_live_level = max_live_level.max(Some(level));
            }
            if level > MAX_LEVEL {
                v.push(format!("node {s}: level {level} > {MAX_LEVEL}"));
                continue;
            }
            for l in 0..=level {
                let list = g.list(s, l);
                if list.is_empty() {
                    v.push(format!("node {s}: level {level} but no list at layer {l}"));
                    continue;
                }
                let count = list[0].load(Ordering::Acquire) as usize;
                if count > g.cap(l) {
                    v.push(format!("node {s} layer {l}: count {count} > {}", g.cap(l)));
                    continue;
                }
                buf.clear();
                buf.extend(list[1..=count].iter().map(|a| a.load(Ordering::Acquire)));
                for &n in &buf {
                    if n as usize >= next {
                        v.push(format!(
                            "node {s} layer {l}: neighbour {n} beyond next slot {next}"
                        ));
                    } else if !(linked(n) || dead_to_unlinked(s, n)) {
                        v.push(format!(
                            "node {s} layer {l}: neighbour {n} is not a linked node (state {})",
                            g.state(n)
                        ));
                    } else if g.level(n) < l {
                        v.push(format!(
                            "node {s} layer {l}: neighbour {n} has level {} only",
                            g.level(n)
                        ));
                    } else if n == s {
                        v.push(format!("node {s} layer {l}: lists itself"));
                    }
                }
                let mut sorted = buf.clone();
                sorted.sort_unstable();
                sorted.dedup();
                if sorted.len() != buf.len() {
                    v.push(format!("node {s} layer {l}: duplicate neighbours"));
                }
            }
        }
        self.check_rooms(next as u32, &mut v);
        match unpack_entry(self.meta.u64_at(M_ENTRY).load(Ordering::Acquire)) {
            None if max_live_level.is_some() => {
                v.push("no entry point but live nodes exist".into())
            }
            None => {}
            Some((ep, level)) => {
                if ep as usize >= next || !linked(ep) {
                    v.push(format!("entry point {ep} is not a linked node"));
                } else if g.level(ep) != level {
                    v.push(format!(
                        "entry point {ep}: word says level {level}, node has {}",
                        g.level(ep)
                    ));
                } else if max_live_level.is_some_and(|m| m > level) {
                    v.push(format!(
                        "entry point level {level} below the top live level {max_live_level:?}"
                    ));
                }
            }
        }
        let entries = self.labels.entries(g);
        let mut by_label: HashMap<u64, u32> = HashMap::new();
        let mut by_slot: HashMap<u32, u64> = HashMap::new();
        for &(label, slot) in &entries {
            if by_label.insert(label, slot).is_some() {
                v.push(format!("label {label} mapped twice"));
            }
            if by_slot.insert(slot, label).is_some() {
                v.push(format!("node {slot} mapped by two labels"));
            }
        }
        for s in 0..next as u32 {
            if g.state(s) == LIVE && by_slot.get(&s) != Some(&g.label(s)) {
                v.push(format!(
                    "live node {s} (label {}) is not in the label map",
                    g.label(s)
                ));
            }
        }
        if self.len() != entries.len() {
            v.push(format!(
                "live count {} but {} labels mapped",
                self.len(),
                entries.len()
            ));
        }
        for i in 0..self.g.nlog_entries {
            if self.logs.nlog_state(&self.meta, i) != NONE {
                v.push(format!("NLog entry {i} still in flight"));
            }
        }
        for i in 0..self.g.nlist_entries {
            if self.logs.nlist_state(&self.meta, i) != NONE {
                v.push(format!("NlistLog entry {i} still in flight"));
            }
        }
        v
    }

    /// The explicit verify pass: checks the checksum of every linked node
    /// (live or deleted) below the allocation word, and returns how many
    /// it checked, or [`vectide_core::Error::Corrupted`] naming the first
    /// node whose label, level, sequence number, upper-list offset or
    /// vector was altered. O(n) reads of every vector; searches do not
    /// verify (see `docs/format-phnsw.md`, "Node checksums").
    pub fn verify(&self) -> Result<usize> {
        let g = &self.graph;
        let next = self.next_slot().min(g.capacity());
        let mut checked = 0;
        for s in 0..next as u32 {
            if matches!(g.state(s), LIVE | DELETED) {
                g.verify(s)?;
                checked += 1;
            }
        }
        Ok(checked)
    }

    /// Upper-list room: no two linked nodes own any of the same room, and
    /// none beyond `upper next` (each lists itself into the other's lists
    /// otherwise, or a restart's allocation hands the room out again).
    fn check_rooms(&self, next: u32, v: &mut Vec<String>) {
        let g = &self.graph;
        let upper_next = self
            .meta
            .u64_at(super::layout::M_UPPER_NEXT)
            .load(Ordering::Acquire);
        let mut rooms: Vec<(u64, u64, u32)> = (0..next)
            .filter(|&s| matches!(g.state(s), LIVE | DELETED))
            .filter_map(|s| self.room_named(s).map(|(at, end)| (at, end, s)))
            .collect();
        rooms.sort_unstable();
        for w in rooms.windows(2) {
            if w[1].0 < w[0].1 {
                v.push(format!(
                    "nodes {} and {}: upper-list rooms [{}, {}) and [{}, {}) overlap",
                    w[0].2, w[1].2, w[0].0, w[0].1, w[1].0, w[1].1
                ));
            }
        }
        if let Some(&(at, end, s)) = rooms.iter().max_by_key(|r| r.1) {
            if end > upper_next {
                v.push(format!(
                    "node {s}: upper-list room [{at}, {end}) beyond upper next {upper_next}"
                ));
            }
        }
    }
}
