//! The LTI's RAM caches of sectors: the sectors nearest the start node,
//! kept for the index's life ([`SectorCache`], DiskANN's
//! `num_nodes_to_cache`), and per-search scratch state with a small cache
//! of recently read sectors ([`Scratch`], [`Lockstep`]).

use super::{record_in, Lti, QueryStats};
use crate::layout::Node;
use rayon::prelude::*;
use std::collections::HashMap;
use std::sync::Arc;
use vectide_core::{Result, SparseVisited};
use vectide_quant::DistanceTable;
use vectide_storage::block::{AlignedBuf, BLOCK};

/// Records read once and shared by searches: first sector → the sectors
/// its record starts in (CRC-checked when read).
#[derive(Debug, Default)]
pub struct SectorCache(HashMap<u64, Box<[u8]>>);

impl SectorCache {
    /// Sectors held.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Bytes held (records and a key each).
    pub fn bytes(&self) -> usize {
        self.0.values().map(|b| b.len() + 16).sum()
    }

    pub(super) fn get(&self, first: u64) -> Option<&[u8]> {
        self.0.get(&first).map(|b| &b[..])
    }
}

/// Per-thread search state, reused across queries.
#[derive(Default)]
pub struct Scratch {
    /// `(pq distance, node, expanded)`, sorted by distance, at most `L`.
    pub(super) list: Vec<(f32, u32, bool)>,
    pub(super) visited: SparseVisited,
    pub(super) table: DistanceTable,
    /// Expanded nodes: `(exact distance, label)`.
    pub(super) full: Vec<(f32, u64)>,
    /// With [`Lti::search_expanded`]: every expanded node that holds a
    /// point, `(exact distance, node)`, and their vectors back to back.
    pub expanded: Vec<(f32, u32)>,
    pub expanded_vectors: Vec<f32>,
    pub(super) bufs: Vec<AlignedBuf>,
    pub(super) vec: Vec<f32>,
    pub(super) batch: Vec<u32>,
    /// Unvisited neighbours of an expanded node and their PQ distances.
    pub(super) fresh: Vec<u32>,
    pub(super) dists: Vec<f32>,
    /// Nodes expanded in this query.
    pub(super) done: SparseVisited,
    /// Neighbours that can enter the list, and the merge buffer.
    pub(super) entering: Vec<(f32, u32, bool)>,
    pub(super) merged: Vec<(f32, u32, bool)>,
    /// First sectors of this hop's nodes, and those not cached.
    pub(super) sectors: Vec<u64>,
    pub(super) reads: Vec<u64>,
    /// Records this scratch's searches find besides the file (the recent
    /// ones are off unless [`Scratch::keep_recent`] turned them on).
    pub(super) caches: ReadCaches,
}

impl Scratch {
    /// Keeps the last `sectors` records read (CLOCK eviction) and serves
    /// later searches on this scratch from them. StreamingMerge's Insert
    /// phase turns it on: a thread searches for new points in
    /// `sector_order`, so consecutive searches end in the same region and
    /// read the same sectors.
    pub fn keep_recent(&mut self, sectors: usize) {
        self.caches.keep_recent(sectors);
    }

    /// Serves this scratch's searches from `cache` too (records of the
    /// same LTI, as [`Lti::sectors_near_start`] reads them).
    pub fn share_cache(&mut self, cache: Arc<SectorCache>) {
        self.caches.shared = Some(cache);
    }

    /// Bytes the recent-records cache holds.
    pub fn recent_bytes(&self) -> usize {
        self.caches.recent.bytes()
    }
}

/// Where searches find records besides the file and the LTI's own cache:
/// a cache shared between searches and the records read lately.
#[derive(Default)]
pub(super) struct ReadCaches {
    pub(super) recent: Recent,
    pub(super) shared: Option<Arc<SectorCache>>,
}

impl ReadCaches {
    pub(super) fn keep_recent(&mut self, sectors: usize) {
        self.recent = Recent {
            cap: sectors,
            ..Recent::default()
        };
    }

    /// Whether the record starting at `first` is held (a recent one is
    /// marked referenced).
    pub(super) fn hit(&mut self, first: u64) -> bool {
        self.shared
            .as_ref()
            .is_some_and(|c| c.0.contains_key(&first))
            || self.recent.touch(first)
    }

    pub(super) fn get(&self, first: u64) -> Option<&[u8]> {
        self.shared
            .as_deref()
            .and_then(|c| c.get(first))
            .or_else(|| self.recent.get(first))
    }

    /// Keeps a hop's reads (`reads[i]` in `bufs[i]`) among the recent
    /// records, when they are on.
    pub(super) fn keep(&mut self, reads: &[u64], bufs: &[AlignedBuf], bytes: usize) {
        if self.recent.cap > 0 {
            for (&first, buf) in reads.iter().zip(bufs) {
                self.recent.put(first, &buf[..bytes]);
            }
        }
    }
}

/// The records a hop expands: in the LTI's cache, in `caches`, or read
/// for the hop (`reads[i]` in `bufs[i]`).
pub(super) struct HopSectors<'a> {
    pub(super) cache: &'a HashMap<u64, Box<[u8]>>,
    pub(super) caches: &'a ReadCaches,
    pub(super) reads: &'a [u64],
    pub(super) bufs: &'a [AlignedBuf],
}

impl HopSectors<'_> {
    pub(super) fn get(&self, first: u64) -> &[u8] {
        if let Some(b) = self.cache.get(&first) {
            return b;
        }
        if let Some(b) = self.caches.get(first) {
            return b;
        }
        let i = self.reads.iter().position(|&s| s == first).unwrap_or(0);
        &self.bufs[i][..]
    }
}

/// Searches run in lock-step by [`Lti::search_expanded_lockstep`]: a slot
/// per search in flight, and the caches and read buffers they share.
pub struct Lockstep {
    pub(super) slots: Vec<Slot>,
    pub(super) caches: ReadCaches,
    pub(super) bufs: Vec<AlignedBuf>,
    pub(super) reads: Vec<u64>,
}

#[derive(Default)]
pub(super) struct Slot {
    pub(super) job: Option<usize>,
    pub(super) scratch: Scratch,
    pub(super) stats: QueryStats,
    pub(super) planned: bool,
}

impl Lockstep {
    /// Room for `in_flight` searches at once (at least one).
    pub fn new(in_flight: usize) -> Self {
        Lockstep {
            slots: (0..in_flight.max(1)).map(|_| Slot::default()).collect(),
            caches: ReadCaches::default(),
            bufs: Vec::new(),
            reads: Vec::new(),
        }
    }

    /// Keeps the last `sectors` records read, as [`Scratch::keep_recent`],
    /// for all the searches run here.
    pub fn keep_recent(&mut self, sectors: usize) {
        self.caches.keep_recent(sectors);
    }

    /// Serves the searches from `cache` too, as [`Scratch::share_cache`].
    pub fn share_cache(&mut self, cache: Arc<SectorCache>) {
        self.caches.shared = Some(cache);
    }
}

/// A small per-scratch record cache: first sector → the record's sectors,
/// evicted by CLOCK (a hit sets a reference bit the hand clears once).
#[derive(Default)]
pub(super) struct Recent {
    pub(super) cap: usize,
    pub(super) slot_of: HashMap<u64, usize>,
    pub(super) keys: Vec<u64>,
    pub(super) bufs: Vec<Box<[u8]>>,
    pub(super) referenced: Vec<bool>,
    pub(super) hand: usize,
}

impl Recent {
    pub(super) fn bytes(&self) -> usize {
        self.bufs.iter().map(|b| b.len()).sum()
    }

    pub(super) fn get(&self, first: u64) -> Option<&[u8]> {
        self.slot_of.get(&first).map(|&i| &self.bufs[i][..])
    }

    pub(super) fn touch(&mut self, first: u64) -> bool {
        match self.slot_of.get(&first) {
            Some(&i) => {
                self.referenced[i] = true;
                true
            }
            None => false,
        }
    }

    pub(super) fn put(&mut self, first: u64, bytes: &[u8]) {
        if self.cap == 0 || self.slot_of.contains_key(&first) {
            return;
        }
        let i = if self.bufs.len() < self.cap {
            self.bufs.push(bytes.into());
            self.keys.push(first);
            self.referenced.push(false);
            self.bufs.len() - 1
        } else {
            while self.referenced[self.hand] {
                self.referenced[self.hand] = false;
                self.hand = (self.hand + 1) % self.cap;
            }
            let i = self.hand;
            self.hand = (self.hand + 1) % self.cap;
            self.slot_of.remove(&self.keys[i]);
            if self.bufs[i].len() == bytes.len() {
                self.bufs[i].copy_from_slice(bytes);
            } else {
                self.bufs[i] = bytes.into();
            }
            self.keys[i] = first;
            i
        };
        self.slot_of.insert(first, i);
    }
}

impl Lti {
    /// Caches the sectors of the nodes nearest the start (breadth-first,
    /// with the sector mates that share them) until `budget_bytes` is
    /// spent. Returns the nodes whose records are cached.
    pub fn cache_near_start(&mut self, budget_bytes: usize) -> Result<usize> {
        self.cache.clear();
        self.cache = self.sectors_near_start(budget_bytes)?.0;
        Ok(self.cached())
    }

    /// The sectors of the nodes nearest the start, breadth-first, until
    /// `budget_bytes` is spent: what [`Lti::cache_near_start`] keeps, as a
    /// cache of its own that searches can share through
    /// [`Scratch::share_cache`] (StreamingMerge's Insert phase). A level's
    /// reads are spread over the current rayon pool's threads.
    pub fn sectors_near_start(&self, budget_bytes: usize) -> Result<SectorCache> {
        let mut cache = HashMap::new();
        if self.header.nodes == 0 {
            return Ok(SectorCache(cache));
        }
        let h = self.header;
        let bytes = h.sectors_per_node() * BLOCK;
        let max = budget_bytes / (bytes + 16);
        let mut frontier = vec![h.start as u32];
        let mut seen = std::collections::HashSet::new();
        seen.insert(h.start as u32);
        let mut joined = Vec::new();
        while !frontier.is_empty() && cache.len() < max {
            let level = std::mem::take(&mut frontier);
            // The level's sectors not held yet, in breadth-first order,
            // within the budget; read in batches of 64, one batch per
            // thread of the pool at once.
            let mut wanted = std::collections::HashSet::new();
            let mut firsts: Vec<u64> = level
                .iter()
                .map(|&id| h.locate(id as u64).0)
                .filter(|f| !cache.contains_key(f) && wanted.insert(*f))
                .collect();
            firsts.truncate(max - cache.len());
            let read: Vec<Vec<(u64, Box<[u8]>)>> = firsts
                .par_chunks(64)
                .map_init(Vec::new, |bufs, chunk| {
                    self.read_sectors(chunk, bufs)?;
                    Ok(chunk
                        .iter()
                        .zip(bufs.iter())
                        .map(|(&first, buf)| (first, buf[..bytes].to_vec().into_boxed_slice()))
                        .collect())
                })
                .collect::<Result<_>>()?;
            cache.extend(read.into_iter().flatten());
            for &id in &level {
                let Some(buf) = cache.get(&h.locate(id as u64).0) else {
                    continue;
                };
                let node = Node::parse(record_in(&h, buf, id, &mut joined), &h)?;
                for nbr in node.neighbor_ids() {
                    if seen.insert(nbr) {
                        frontier.push(nbr);
                    }
                }
            }
        }
        Ok(SectorCache(cache))
    }
}
