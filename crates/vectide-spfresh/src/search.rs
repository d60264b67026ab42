//! The centroid index and the search (SPANN §3.2, SPFresh §4.1): the query's
//! nearest centroids through an `hnsw` graph, their postings read in one
//! ParallelGET, stale and deleted records skipped, replicas counted once.
//!
//! Searches take no lock against the Local Rebuilder. Every change it makes
//! writes a vector's new copy before it drops the old one (a split fills
//! its new postings before it removes the old, a reassign writes the moved
//! copy before garbage collection may drop the stale one), and a vector's
//! data never changes, so a search returns any copy of a live vector it
//! reads, whatever its version. What is left is a copy written into a
//! posting after the search read it and dropped from another before the
//! search read that one: a search that finds a posting it read PUT or
//! removed since it started goes again (`BlockStore::shrunk_since`).
//!
//! Vector numbers are reused once a reclaim (`reclaim.rs`) has dropped
//! every record of a dead one: every reader holds `Inner::readers` shared
//! from its first posting read to its answer, and a reclaim takes it
//! exclusively once before it frees numbers, so a record a reader holds
//! always names the vector it was written for.

use crate::jobs::Job;
use crate::params::Mode;
use crate::state::{Inner, Scratch};
use std::sync::atomic::Ordering;
use vectide_core::heap::TopK;
use vectide_core::validate::prepare_query;
use vectide_core::{Error, Filter, Neighbor, Result};

/// Centroid searches one query may start over (see `Inner::search`).
const MAX_RESTARTS: usize = 8;

impl Inner {
    /// The `k` nearest live vectors to `query`, reading the `nprobe`
    /// postings nearest it.
    pub(crate) fn search(
        &self,
        query: &[f32],
        k: usize,
        nprobe: usize,
        filter: Option<Filter<'_>>,
        sc: &mut Scratch,
        out: &mut Vec<Neighbor>,
    ) -> Result<()> {
        out.clear();
        vectide_core::limits::check_k(k)?;
        if nprobe == 0 || nprobe > vectide_core::limits::MAX_NPROBE {
            return Err(Error::invalid(format!(
                "nprobe must be in 1..={}, got {nprobe}",
                vectide_core::limits::MAX_NPROBE
            )));
        }
        let Scratch {
            read,
            hits,
            pids,
            seen,
            top,
            sorted,
            qbuf,
            ..
        } = sc;
        let q = prepare_query(self.dim, self.metric, query, qbuf)?;
        if k == 0 {
            return Ok(());
        }
        let _reading = self.readers.read();
        // A posting read that was shrunk (PUT or removed) since the start
        // may have lost a copy whose replacement went into a posting read
        // earlier: the search goes again (module docs).
        let mut blocks = 0;
        for _ in 0..MAX_RESTARTS {
            let since = self.store.shrink_count();
            self.heads
                .nearest(q, nprobe, self.params.head_ef.max(nprobe), hits)?;
            pids.clear();
            pids.extend(hits.iter().map(|h| h.id as u32));
            blocks += self.store.parallel_get(pids, read)?;
            if !self.store.shrunk_since(pids, since) {
                break;
            }
            self.counters
                .search_restarts
                .fetch_add(1, Ordering::Relaxed);
        }
        let dist = self.metric.distance_fn();
        let top = top.get_or_insert_with(|| TopK::new(k));
        top.reset(k);
        seen.clear();
        let ids = self.ids.read();
        for (i, recs) in read.records().enumerate() {
            let mut live = 0usize;
            for j in 0..recs.len() {
                let vid = recs.vids[j];
                live += usize::from(self.versions.is_current(vid, recs.versions[j]));
                if !self.versions.is_live(vid) || !seen.insert(vid) {
                    continue;
                }
                if let Some(f) = filter {
                    match ids.of_vid.get(vid as usize) {
                        Some(&ext) if f(ext) => {}
                        _ => continue,
                    }
                }
                top.push(dist(q, recs.vector(j, self.dim)), vid);
            }
            // A small posting is merged; one mostly stale (deleted or moved
            // vectors) is garbage-collected, which the merge job does first,
            // so that searches stop reading the dead records.
            if self.mode == Mode::Fresh
                && (live <= self.params.merge_threshold || recs.len() - live > live)
            {
                self.jobs.push(Job::Merge(pids[i]));
            }
        }
        top.drain_sorted_into(sorted);
        out.extend(sorted.iter().filter_map(|c| {
            ids.of_vid
                .get(c.node as usize)
                .map(|&ext| Neighbor::new(ext, c.dist.0))
        }));
        let c = &self.counters;
        c.queries.fetch_add(1, Ordering::Relaxed);
        c.postings_read
            .fetch_add(pids.len() as u64, Ordering::Relaxed);
        c.blocks_read.fetch_add(blocks as u64, Ordering::Relaxed);
        Ok(())
    }

    /// The stored vector of `id`: read from its home posting, else from
    /// any posting holding a copy. A vector number's data never changes
    /// (an upsert takes a new number), so any copy of it will do, whatever
    /// its version; a full pass that a concurrent move slipped past (the
    /// copy written behind the pass, the old one collected ahead of it) is
    /// made again while the id stays live.
    pub(crate) fn get(&self, id: u64) -> Result<Option<Vec<f32>>> {
        let _reading = self.readers.read();
        self.get_reading(id)
    }

    /// [`Inner::get`] under the caller's hold of `readers`.
    fn get_reading(&self, id: u64) -> Result<Option<Vec<f32>>> {
        let Some(vid) = self.ids.read().ext.get(&id).copied() else {
            return Ok(None);
        };
        let mut sc = self.scratch();
        let found = (|| {
            for _ in 0..MAX_RESTARTS {
                let home = self.home(vid);
                let rest = (0..self.store.posting_ids()).filter(|&p| Some(p) != home);
                for p in home.into_iter().chain(rest) {
                    if self.store.get(p, &mut sc.recs, &mut sc.read)?.is_none() {
                        continue;
                    }
                    if let Some(j) = sc.recs.vids.iter().position(|&v| v == vid) {
                        return Ok(Some(sc.recs.vector(j, self.dim).to_vec()));
                    }
                }
                if !self.ids.read().ext.contains_key(&id) {
                    return Ok(None);
                }
            }
            Ok(None)
        })();
        self.give_back(sc);
        found
    }

    /// The distances from `query` to the live vectors of `ids` (absent
    /// ones skipped). Few ids are read one by one from their home
    /// postings; many (an exact search) in one pass over every posting,
    /// `SCAN_BATCH` postings per ParallelGET, each vector's first copy
    /// counted once. A copy a concurrent move put behind the pass is
    /// fetched on its own afterwards, so no live id is missed.
    pub(crate) fn distances(
        &self,
        query: &[f32],
        ids: &[u64],
        out: &mut Vec<Neighbor>,
    ) -> Result<()> {
        let mut sc = self.scratch();
        let reading = self.readers.read();
        let r = self.distances_with(query, ids, out, &mut sc);
        drop(reading);
        self.give_back(sc);
        r
    }

    fn distances_with(
        &self,
        query: &[f32],
        ids: &[u64],
        out: &mut Vec<Neighbor>,
        sc: &mut Scratch,
    ) -> Result<()> {
        let q = prepare_query(self.dim, self.metric, query, &mut sc.qbuf)?.to_vec();
        let dist = self.metric.distance_fn();
        let postings = self.store.posting_ids();
        if ids.len() < SCAN_FROM.max(postings as usize / 4) {
            for &id in ids {
                if let Some(v) = self.get_reading(id)? {
                    out.push(Neighbor::new(id, dist(&q, &v)));
                }
            }
            return Ok(());
        }
        let mut want: std::collections::HashMap<u32, u64> = {
            let map = self.ids.read();
            ids.iter()
                .filter_map(|&id| map.ext.get(&id).map(|&vid| (vid, id)))
                .collect()
        };
        let all: Vec<u32> = (0..postings).collect();
        for chunk in all.chunks(SCAN_BATCH) {
            if want.is_empty() {
                break;
            }
            self.store.parallel_get(chunk, &mut sc.read)?;
            for recs in sc.read.records() {
                for j in 0..recs.len() {
                    if let Some(id) = want.remove(&recs.vids[j]) {
                        out.push(Neighbor::new(id, dist(&q, recs.vector(j, self.dim))));
                    }
                }
            }
        }
        for (_, id) in want {
            if let Some(v) = self.get_reading(id)? {
                out.push(Neighbor::new(id, dist(&q, &v)));
            }
        }
        Ok(())
    }
}

/// From this many ids (or a quarter of the postings, if more) `distances`
/// scans every posting instead of reading each id's home.
const SCAN_FROM: usize = 256;
/// Postings per ParallelGET of that scan.
const SCAN_BATCH: usize = 64;
