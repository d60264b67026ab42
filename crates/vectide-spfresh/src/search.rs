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

use crate::engine::{Inner, Scratch};
use crate::params::Mode;
use crate::rebuild::Job;
use parking_lot::{RwLock, RwLockReadGuard};
use std::sync::atomic::{AtomicU64, Ordering};
use vectide_core::heap::TopK;
use vectide_core::validate::prepare_query;
use vectide_core::{Error, Filter, Metric, Neighbor, Result, SearchParams, VectorIndex};
use vectide_hnsw::{Hnsw, HnswParams};

/// Centroid searches one query may start over (see `Inner::search`).
const MAX_RESTARTS: usize = 8;

/// The centroids by posting id.
pub(crate) struct HeadVecs {
    dim: usize,
    vecs: Vec<f32>,
    alive: Vec<bool>,
    count: usize,
}

impl HeadVecs {
    /// Posting ids ever given a centroid (live or not).
    pub fn len(&self) -> usize {
        self.alive.len()
    }

    /// The centroid of posting `pid`, if it has one.
    #[inline]
    pub fn get(&self, pid: u32) -> Option<&[f32]> {
        let p = pid as usize;
        (self.alive.get(p) == Some(&true)).then(|| &self.vecs[p * self.dim..(p + 1) * self.dim])
    }
}

/// The centroid index: the centroids and an `hnsw` graph over them
/// (squared L2; graph ids are posting ids).
pub(crate) struct Heads {
    index: arc_swap::ArcSwap<Hnsw>,
    threads: usize,
    vecs: RwLock<HeadVecs>,
    /// The graph's own sequence numbers (it ignores an operation not newer
    /// than the last on an id).
    seq: AtomicU64,
}

impl Heads {
    fn graph_params(threads: usize) -> HnswParams {
        HnswParams {
            threads: Some(threads),
            ..HnswParams::default()
        }
    }

    pub fn new(dim: usize, threads: usize) -> Result<Heads> {
        let params = Self::graph_params(threads);
        Ok(Heads {
            index: arc_swap::ArcSwap::from_pointee(Hnsw::new(dim, Metric::L2, params)?),
            threads,
            vecs: RwLock::new(HeadVecs {
                dim,
                vecs: Vec::new(),
                alive: Vec::new(),
                count: 0,
            }),
            seq: AtomicU64::new(0),
        })
    }

    /// Drops every centroid (a static rebuild starts over).
    pub fn clear(&self) -> Result<()> {
        let mut v = self.vecs.write();
        let dim = v.dim;
        self.index.store(std::sync::Arc::new(Hnsw::new(
            dim,
            Metric::L2,
            Self::graph_params(self.threads),
        )?));
        v.alive.iter_mut().for_each(|a| *a = false);
        v.count = 0;
        Ok(())
    }

    pub fn read(&self) -> RwLockReadGuard<'_, HeadVecs> {
        self.vecs.read()
    }

    /// Live centroids.
    pub fn count(&self) -> usize {
        self.vecs.read().count
    }

    pub fn memory_bytes(&self) -> usize {
        let v = self.vecs.read();
        v.vecs.len() * 4 + v.alive.len() + self.index.load().stats().map_or(0, |s| s.memory_bytes)
    }

    /// Adds centroids `data` (`pids.len() × dim`) for postings `pids`.
    pub fn add(&self, pids: &[u32], data: &[f32]) -> Result<()> {
        {
            let mut v = self.vecs.write();
            let dim = v.dim;
            for (i, &p) in pids.iter().enumerate() {
                let p = p as usize;
                if v.alive.len() <= p {
                    v.alive.resize(p + 1, false);
                    v.vecs.resize((p + 1) * dim, 0.0);
                }
                if !v.alive[p] {
                    v.count += 1;
                }
                v.alive[p] = true;
                v.vecs[p * dim..(p + 1) * dim].copy_from_slice(&data[i * dim..(i + 1) * dim]);
            }
        }
        let ids: Vec<u64> = pids.iter().map(|&p| u64::from(p)).collect();
        let seq = self.seq.fetch_add(1, Ordering::AcqRel) + 1;
        self.index.load().insert(seq, &ids, data)
    }

    /// Removes posting `pid`'s centroid.
    pub fn remove(&self, pid: u32) -> Result<()> {
        let seq = self.seq.fetch_add(1, Ordering::AcqRel) + 1;
        self.index.load().delete(seq, &[u64::from(pid)])?;
        let mut v = self.vecs.write();
        if let Some(a) = v.alive.get_mut(pid as usize) {
            if *a {
                *a = false;
                v.count -= 1;
            }
        }
        Ok(())
    }

    /// The `k` centroids nearest `q` (`ef` ≥ k), nearest first, into `out`.
    /// When `k` covers every live centroid, they are all ranked exactly
    /// (no graph walk, so none is missed).
    pub fn nearest(&self, q: &[f32], k: usize, ef: usize, out: &mut Vec<Neighbor>) -> Result<()> {
        out.clear();
        {
            let v = self.vecs.read();
            if v.count == 0 {
                return Ok(());
            }
            if k >= v.count {
                let l2 = Metric::L2.distance_fn();
                out.extend(
                    v.alive
                        .iter()
                        .enumerate()
                        .filter(|(_, &a)| a)
                        .map(|(p, _)| {
                            Neighbor::new(p as u64, l2(q, &v.vecs[p * v.dim..(p + 1) * v.dim]))
                        }),
                );
                out.sort_by(|a, b| a.distance.total_cmp(&b.distance));
                return Ok(());
            }
        }
        self.index
            .load()
            .search_into(q, k, &SearchParams::with_ef(ef.max(k)), None, out)
    }
}

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
        for (i, recs) in read.records.iter().enumerate() {
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
}
