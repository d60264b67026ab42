//! Batched search, the native path: the meta-HNSW picks each query's top-b
//! partitions; the batch's queries are grouped by partition so each
//! sub-HNSW is fetched once per batch; the uncached ones come in doorbell
//! chains of at most `doorbell_reads` READs (or one round trip each, or
//! node by node for the naive baseline); with the pipeline on, a fetcher
//! thread posts the next chain while the pool deserialises and searches
//! the one that arrived; each query's results are merged at the end.

use crate::fetch::{Fetched, RemoteGraph};
use crate::layout::{Entry, ENTRY_BYTES, ENTRY_STATE_AT};
use crate::params::Fetch;
use crate::state::{DHnsw, Layout, Timing};
use crate::subgraph::SubGraph;
use rayon::prelude::*;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;
use vectide_core::heap::{by_distance_then_id, keep_nearest};
use vectide_core::{Filter, Neighbor, Result, SearchParams};
use vectide_graph::Scratch;

/// A partition's queries' answers: (query, its nearest in the partition).
type Answers = Vec<(usize, Vec<Neighbor>)>;

impl DHnsw {
    /// The top-`b` partitions of each query (prepared), from the meta-HNSW.
    fn route(&self, lay: &Layout, qs: &[f32], b: usize) -> Vec<Vec<u32>> {
        let meta = &lay.meta;
        qs.par_chunks(self.dim)
            .map_init(Scratch::default, |s, q| {
                let mut out = Vec::with_capacity(b);
                meta.search(self.dist, q, b, b.max(32), s, |_| true, &mut out);
                out.iter().map(|n| n.id as u32).collect()
            })
            .collect()
    }

    fn search_part(
        &self,
        g: &SubGraph,
        qs: &[f32],
        group: &[usize],
        k: usize,
        ef: usize,
        filter: Option<Filter<'_>>,
    ) -> Answers {
        group
            .par_iter()
            .map_init(Scratch::default, |s, &qi| {
                let mut out = Vec::with_capacity(k);
                let q = &qs[qi * self.dim..(qi + 1) * self.dim];
                g.search(
                    self.dist,
                    q,
                    k,
                    ef,
                    s,
                    |l| filter.is_none_or(|f| f(l)),
                    &mut out,
                );
                (qi, out)
            })
            .collect()
    }

    /// This node's copy of the partition table brought up to date (one READ
    /// of the table): a partition whose entry moved on (its
    /// builder published into it) leaves the LRU and is read under its new
    /// entry. An entry a writer is inside is left as it was (the fetch's
    /// state check reads it again).
    pub(crate) fn refresh_table(&self) -> Result<()> {
        let (region, at, k, rec, size) = {
            let g = self.layout.read();
            let Some(l) = g.as_ref() else {
                return Ok(());
            };
            let k = l.table.len() as u64;
            (
                l.region,
                l.header.table_off,
                k,
                l.record(),
                l.header.region_size,
            )
        };
        let bytes = crate::fetch::read_range(&*self.mem, region, at, at + k * ENTRY_BYTES)?;
        let mut fresh = Vec::with_capacity(k as usize);
        for (p, b) in bytes.chunks_exact(ENTRY_BYTES as usize).enumerate() {
            // An entry a writer is inside may be torn: left undecoded.
            let s = &b[ENTRY_STATE_AT as usize..ENTRY_STATE_AT as usize + 8];
            if u64::from_le_bytes(s.try_into().expect("8 bytes")) % 2 == 0 {
                fresh.push((p, Entry::decode_table(b, 1, rec, size)?[0]));
            }
        }
        let mut g = self.layout.write();
        let Some(lay) = g.as_mut().filter(|l| l.region == region) else {
            return Ok(());
        };
        let mut lru = self.cache.lock();
        for (p, new) in fresh {
            if lay.table[p] != new {
                lay.table[p] = new;
                lru.remove(p as u32);
            }
        }
        Ok(())
    }

    /// Searches prepared queries `qs` (row-major).
    pub(crate) fn search_prepared(
        &self,
        qs: &[f32],
        k: usize,
        params: &SearchParams,
        filter: Option<Filter<'_>>,
    ) -> Result<Vec<Vec<Neighbor>>> {
        let nq = qs.len() / self.dim;
        // Other compute nodes may have published into partitions since
        // this node last read the table.
        self.refresh_table()?;
        let guard = self.layout.read();
        let Some(lay) = guard.as_ref() else {
            return Ok(vec![Vec::new(); nq]);
        };
        let t0 = Instant::now();
        let k_parts = lay.table.len();
        let b = params.nprobe.unwrap_or(self.params.probe).clamp(1, k_parts);
        let ef = params.ef.unwrap_or(self.params.ef_search).max(k);
        let routes = self.install(|| self.route(lay, qs, b));
        let t_meta = t0.elapsed();
        let mut groups: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
        for (qi, r) in routes.iter().enumerate() {
            for &p in r {
                groups.entry(p).or_default().push(qi);
            }
        }
        let mut results: Vec<Vec<Neighbor>> = vec![Vec::new(); nq];
        let mut merge = |a: Answers| {
            for (qi, v) in a {
                results[qi].extend(v);
            }
        };
        let mut fetch_ns = 0u64;
        let mut sub_ns = 0u64;
        if self.params.fetch == Fetch::Naive {
            let t = Instant::now();
            let pairs: Vec<(u32, usize)> = groups
                .iter()
                .flat_map(|(&p, g)| g.iter().map(move |&qi| (p, qi)))
                .collect();
            let found: Vec<Result<(usize, Vec<Neighbor>)>> = self.install(|| {
                pairs
                    .par_iter()
                    .map_init(Scratch::default, |s, &(p, qi)| {
                        let q = &qs[qi * self.dim..(qi + 1) * self.dim];
                        Ok((qi, self.naive_search(lay, p, q, k, ef, filter, s)?))
                    })
                    .collect()
            });
            for f in found {
                let (qi, v) = f?;
                merge(vec![(qi, v)]);
            }
            fetch_ns += t.elapsed().as_nanos() as u64;
        } else {
            // Cached partitions are searched at once; the rest fetched.
            let mut missing = Vec::new();
            let mut cached = Vec::new();
            {
                let mut lru = self.cache.lock();
                for &p in groups.keys() {
                    match lru.get(p) {
                        Some(g) => cached.push((p, g)),
                        None => missing.push(p),
                    }
                }
            }
            Timing::add(&self.timing.partitions_cached, cached.len() as u64);
            Timing::add(&self.timing.partitions_fetched, missing.len() as u64);
            let chain = match self.params.fetch {
                Fetch::Doorbell => self.params.chain_for(k_parts),
                _ => 1,
            };
            let t = Instant::now();
            for (p, g) in &cached {
                merge(self.install(|| self.search_part(g, qs, &groups[p], k, ef, filter)));
            }
            sub_ns += t.elapsed().as_nanos() as u64;
            let mut fetched: Vec<(u32, Arc<SubGraph>)> = Vec::with_capacity(missing.len());
            let mut work = |chunk: Vec<Fetched>, sub_ns: &mut u64| -> Result<()> {
                let t = Instant::now();
                let graphs: Vec<Result<(u32, Arc<SubGraph>, Answers)>> = self.install(|| {
                    chunk
                        .par_iter()
                        .map(|(p, bytes, e)| {
                            let t = Instant::now();
                            let g = Arc::new(self.decode_part(lay, e, *p, bytes)?);
                            Timing::add(&self.timing.decode_ns, t.elapsed().as_nanos() as u64);
                            let a = self.search_part(&g, qs, &groups[p], k, ef, filter);
                            Ok((*p, g, a))
                        })
                        .collect()
                });
                for r in graphs {
                    let (p, g, a) = r?;
                    merge(a);
                    fetched.push((p, g));
                }
                *sub_ns += t.elapsed().as_nanos() as u64;
                Ok(())
            };
            if self.params.pipeline && missing.len() > chain {
                // Fetch stage on a thread of its own, one chain ahead.
                let (tx, rx) = std::sync::mpsc::sync_channel::<Result<Vec<Fetched>>>(1);
                let fetch_res = std::thread::scope(|sc| -> Result<u64> {
                    let h = sc.spawn(|| {
                        let t = Instant::now();
                        let r = self.fetch_chains(lay, &missing, chain, |c| {
                            tx.send(Ok(c))
                                .map_err(|_| vectide_core::Error::invalid("search ended"))
                        });
                        if let Err(e) = r {
                            let _ = tx.send(Err(e));
                        }
                        drop(tx);
                        t.elapsed().as_nanos() as u64
                    });
                    let mut first_err = None;
                    for c in rx {
                        match c.and_then(|c| work(c, &mut sub_ns)) {
                            Ok(()) => {}
                            Err(e) => {
                                first_err.get_or_insert(e);
                            }
                        }
                    }
                    let ns = h.join().unwrap_or(0);
                    match first_err {
                        Some(e) => Err(e),
                        None => Ok(ns),
                    }
                })?;
                fetch_ns += fetch_res;
            } else {
                let t = Instant::now();
                let mut chunks = Vec::new();
                self.fetch_chains(lay, &missing, chain, |c| {
                    chunks.push(c);
                    Ok(())
                })?;
                fetch_ns += t.elapsed().as_nanos() as u64;
                for c in chunks {
                    work(c, &mut sub_ns)?;
                }
            }
            let mut lru = self.cache.lock();
            for (p, g) in fetched {
                lru.put(p, g);
            }
        }
        for r in &mut results {
            // A label may sit in two places for a moment (a writer has
            // published its new node and not yet tombstoned the old one):
            // it is answered once, at its nearer place.
            r.sort_by(by_distance_then_id);
            let mut seen = std::collections::HashSet::with_capacity(r.len());
            r.retain(|n| seen.insert(n.id));
            keep_nearest(r, k);
            r.sort_by(by_distance_then_id);
        }
        let tm = &self.timing;
        Timing::add(&tm.batches, 1);
        Timing::add(&tm.queries, nq as u64);
        Timing::add(&tm.meta_ns, t_meta.as_nanos() as u64);
        Timing::add(&tm.fetch_ns, fetch_ns);
        Timing::add(&tm.sub_ns, sub_ns);
        Timing::add(&tm.batch_ns, t0.elapsed().as_nanos() as u64);
        Ok(results)
    }

    /// The naive baseline for one query in one partition: the same
    /// traversal over a graph whose nodes are fetched one READ each.
    #[allow(clippy::too_many_arguments)]
    fn naive_search(
        &self,
        lay: &Layout,
        p: u32,
        q: &[f32],
        k: usize,
        ef: usize,
        filter: Option<Filter<'_>>,
        s: &mut Scratch,
    ) -> Result<Vec<Neighbor>> {
        let g = RemoteGraph::open(&*self.mem, lay, p)?;
        vectide_graph::search::knn(&g, self.dist, q, g.entry, ef.max(k), s, |n| {
            !g.is_deleted(n) && filter.is_none_or(|f| f(g.label(n)))
        });
        if let Some(e) = g.take_error() {
            return Err(e);
        }
        Ok(s.sorted
            .iter()
            .take(k)
            .map(|c| Neighbor::new(g.label(c.node), c.dist.0))
            .collect())
    }
}
