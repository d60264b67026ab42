//! The centroid index (SPANN §3.2): the centroids by posting id and the
//! `hnsw` graph over them that routes a query (or a vector) to its nearest
//! postings.

use parking_lot::{RwLock, RwLockReadGuard};
use std::sync::atomic::{AtomicU64, Ordering};
use vectide_core::{Metric, Neighbor, Result, SearchParams, VectorIndex};
use vectide_hnsw::{Hnsw, HnswParams};

/// The centroids by posting id.
pub(crate) struct HeadVecs {
    pub(crate) dim: usize,
    pub(crate) vecs: Vec<f32>,
    pub(crate) alive: Vec<bool>,
    /// Per posting id, its incarnation: bumped each time the id is given
    /// a centroid, so that a writer holding a route to a removed posting
    /// does not append to a new one that reused its id.
    pub(crate) incarnation: Vec<u32>,
    pub(crate) count: usize,
}

impl HeadVecs {
    /// Posting ids ever given a centroid (live or not).
    pub fn len(&self) -> usize {
        self.alive.len()
    }

    /// The incarnation of posting `pid`, if it has a centroid.
    #[inline]
    pub fn incarnation(&self, pid: u32) -> Option<u32> {
        let p = pid as usize;
        (self.alive.get(p) == Some(&true)).then(|| self.incarnation[p])
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
    pub(crate) index: arc_swap::ArcSwap<Hnsw>,
    pub(crate) threads: usize,
    pub(crate) vecs: RwLock<HeadVecs>,
    /// The graph's own sequence numbers (it ignores an operation not newer
    /// than the last on an id).
    pub(crate) seq: AtomicU64,
}

impl Heads {
    pub(crate) fn graph_params(threads: usize) -> HnswParams {
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
                incarnation: Vec::new(),
                count: 0,
            }),
            seq: AtomicU64::new(0),
        })
    }

    /// A new, empty centroid index of the same shape (a static rebuild
    /// builds into one beside the index in use).
    pub fn fresh(&self) -> Result<Heads> {
        Heads::new(self.vecs.read().dim, self.threads)
    }

    /// Puts `new`'s centroids and graph in place of these, in one step
    /// for a reader of the centroids (the graph is swapped while the
    /// centroids are locked).
    pub fn replace(&self, new: Heads) {
        let Heads {
            index, vecs, seq, ..
        } = new;
        let mut v = self.vecs.write();
        self.index.store(index.load_full());
        *v = vecs.into_inner();
        self.seq.store(seq.into_inner(), Ordering::Release);
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
        v.vecs.len() * 4
            + v.alive.len() * 5
            + self.index.load().stats().map_or(0, |s| s.memory_bytes)
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
                    v.incarnation.resize(p + 1, 0);
                    v.vecs.resize((p + 1) * dim, 0.0);
                }
                if !v.alive[p] {
                    v.count += 1;
                    v.incarnation[p] = v.incarnation[p].wrapping_add(1);
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
