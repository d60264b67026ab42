//! Inserting: FreshVamana's Insert (Algorithm 2) with per-node locks, and
//! the static build of a bulk load into an empty index as Vamana does it.
//!
//! **Insert** (`insert_node`): GreedySearch for the new point from the
//! start node with a list of `l_build`; RobustPrune of its visited set 𝒱
//! gives its out-list; then for each chosen neighbour `j`, under `j`'s lock,
//! the back-edge `j → p` is appended while `j`'s list has room (up to
//! `SLACK · r`, as DiskANN), else `j`'s list becomes RobustPrune(j,
//! N_out(j) ∪ {p}), back to `r`. The node is published under its
//! id only after it is linked. Inserts run in parallel on the index's pool,
//! searches and deletes alongside.
//!
//! **Bulk build** (`build_bulk`, a batch of more than `r` rows into an empty
//! index): every row gets a slot, the graph starts as a random `r`-regular
//! one, the start node is a frozen copy of the medoid (the point nearest
//! the centroid), and two passes over the rows in a seeded random order —
//! the first with α = 1, the second with the index's α — run the same
//! search, prune and back-edge steps (Subramanya et al. 2019, §2.3); a
//! last walk links any node the pruning left without an in-edge.

use crate::engine::FreshVamana;
use rayon::prelude::*;
use std::sync::atomic::{AtomicUsize, Ordering};
use vectide_core::heap::Candidate;
use vectide_core::validate::{copy_normalized, Checked};
use vectide_core::{Result, Seq, RESERVED_ID};
use vectide_graph::mem::{Store, DELETED, FREE, FROZEN};
use vectide_graph::prune::{robust_prune, splitmix64};
use vectide_graph::search::{search_layer_expanded, Scratch};
use vectide_graph::slots::{allocate, newer_rows, publish};
use vectide_graph::Graph;

/// Called with the number of rows done so far (for progress bars).
pub use vectide_core::Progress;

/// Whether RobustPrune may keep `x` as a neighbour: not a free slot, not a
/// node waiting for consolidation.
#[inline]
pub(crate) fn linkable(store: &Store, x: u32) -> bool {
    let s = store.state(x);
    s != FREE && s != DELETED
}

impl FreshVamana {
    /// Inserts a validated batch (upsert semantics), in parallel on the index's pool.
    pub fn insert_checked_rows(
        &self,
        seq: Seq,
        batch: Checked<'_>,
        progress: Option<Progress<'_>>,
    ) -> Result<()> {
        let (ids, vectors) = (batch.ids(), batch.vectors());
        let _op = self.core.seqs.begin(seq);
        let _shared = self.core.mutate.read();
        let rows = newer_rows(&self.core.ids, ids, seq);
        if rows.is_empty() {
            return Ok(());
        }
        let dim = self.core.dim;
        let mut normed = Vec::with_capacity(rows.len() * dim);
        let mut buf = Vec::new();
        for &r in &rows {
            copy_normalized(self.core.metric, &vectors[r * dim..(r + 1) * dim], &mut buf);
            normed.extend_from_slice(&buf);
        }
        {
            // The first batch creates the start node; a large one builds
            // the graph statically while holding the lock, so that a batch
            // arriving meanwhile waits here instead of linking into a graph
            // whose lists the build is about to overwrite.
            let _g = self.start_lock.lock();
            if self.start_slot().is_none() {
                self.create_start(&normed)?;
                if rows.len() > self.params.r {
                    let slots = allocate(&self.core.alloc, &self.core.store, rows.len())?;
                    let store = self.core.store.read();
                    self.build_bulk(&store, &slots, &rows, ids, &normed, seq, progress);
                    return Ok(());
                }
            }
        }
        let slots = allocate(&self.core.alloc, &self.core.store, rows.len())?;
        let store = self.core.store.read();
        let done = AtomicUsize::new(0);
        let work = |scratch: &mut Scratch, i: usize| {
            let v = &normed[i * dim..(i + 1) * dim];
            // SAFETY: `slots[i]` came from `allocate`: never linked, or
            // reclaimed by a consolidation that removed every edge to it
            // and waited for all searches (exclusive store lock) before
            // freeing it. No other thread knows its id until it is linked.
            unsafe { store.init_slot(slots[i], ids[rows[i]], seq, v, 0) };
            self.link(&store, slots[i], self.alpha(), true, scratch);
            publish(
                &store,
                &self.core.ids,
                &self.core.pending,
                slots[i],
                ids[rows[i]],
                seq,
            );
            report(progress, &done, rows.len(), 1);
        };
        if rows.len() < 64 || vectide_core::VectorIndex::threads(self) == 1 {
            let mut scratch = self.core.scratch.get();
            (0..rows.len()).for_each(|i| work(&mut scratch, i));
        } else {
            self.core.install(|| {
                (0..rows.len())
                    .into_par_iter()
                    .for_each_init(|| self.core.scratch.get(), |scratch, i| work(scratch, i))
            });
        }
        drop(store);
        drop(_shared);
        // Upserts retire the nodes they replace into the DeleteList too: the
        // same threshold consolidates them.
        self.consolidate_if_due();
        Ok(())
    }

    /// Creates the frozen start node: a copy of the medoid of `rows`
    /// (row-major, normalised). The caller holds `start_lock`.
    fn create_start(&self, rows: &[f32]) -> Result<()> {
        let dim = self.core.dim;
        let n = rows.len() / dim;
        let mut centroid = vec![0f64; dim];
        for r in rows.chunks_exact(dim) {
            for (c, &x) in centroid.iter_mut().zip(r) {
                *c += x as f64;
            }
        }
        let centroid: Vec<f32> = centroid.iter().map(|&c| (c / n as f64) as f32).collect();
        let medoid = rows
            .chunks_exact(dim)
            .map(|r| (self.core.dist)(&centroid, r))
            .enumerate()
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .map_or(0, |(i, _)| i);
        let slot = allocate(&self.core.alloc, &self.core.store, 1)?[0];
        let store = self.core.store.read();
        // SAFETY: a fresh slot of an index without a start node: nothing
        // links to it and no search can reach it before `start` is set.
        unsafe {
            store.init_slot(
                slot,
                RESERVED_ID,
                0,
                &rows[medoid * dim..(medoid + 1) * dim],
                0,
            )
        };
        store.set_state(slot, FROZEN);
        self.start.store(slot as u64, Ordering::Release);
        Ok(())
    }

    /// Links `slot` (initialised, its vector in place) into the graph:
    /// Algorithm 2's GreedySearch, RobustPrune of the visited set into its
    /// own list, then the back-edges. With `force`, a node whose every
    /// back-edge the pruning dropped takes the last neighbour's farthest
    /// edge (the bulk build instead ends with a reachability walk).
    pub(crate) fn link(
        &self,
        store: &Store,
        slot: u32,
        alpha: f32,
        force: bool,
        scratch: &mut Scratch,
    ) {
        let Some(start) = self.start_slot() else {
            return;
        };
        let v = store.vector(slot);
        let entry = [Candidate::new(
            (self.core.dist)(v, store.vector(start)),
            start,
        )];
        search_layer_expanded(
            store,
            self.core.dist,
            v,
            &entry,
            self.params.l_build,
            0,
            scratch,
            |_| true,
        );
        let r = self.params.r;
        let mut visited = std::mem::take(&mut scratch.lists);
        visited.resize_with(2, Vec::new);
        let (cands, chosen) = visited.split_at_mut(1);
        let (cands, chosen) = (&mut cands[0], &mut chosen[0]);
        cands.clear();
        cands.extend(scratch.expanded.iter().map(|c| c.node));
        let keep = |x: u32| linkable(store, x);
        let Scratch {
            neighbors: pool,
            sorted: ranked,
            fresh: list,
            ..
        } = scratch;
        {
            let _g = store.lock(slot);
            robust_prune(
                store,
                self.core.dist,
                slot,
                cands,
                keep,
                alpha,
                r,
                pool,
                ranked,
                list,
            );
            store.set_list(slot, 0, list);
            chosen.clear();
            chosen.extend_from_slice(list);
        }
        // Back-edges. `linked`: some neighbour kept the edge to the node.
        let mut linked = false;
        for (i, &j) in chosen.iter().enumerate() {
            let _g = store.lock(j);
            store.neighbors_into(j, 0, list);
            if list.contains(&slot) {
                linked = true;
                continue;
            }
            if list.len() < store.cap(0) {
                linked |= store.push_neighbor(j, 0, slot);
                continue;
            }
            robust_prune(
                store,
                self.core.dist,
                j,
                &[slot],
                keep,
                alpha,
                r,
                pool,
                ranked,
                list,
            );
            linked |= list.contains(&slot);
            // A point far from everything (an outlier, an upsert that moved
            // far) loses every back-edge to the pruning and could not be
            // found at all: the last neighbour keeps the edge anyway, in the
            // slack its pruned list leaves (at most r of ⌈1.3·r⌉ ids).
            if force && !linked && i + 1 == chosen.len() && list.len() < store.cap(0) {
                list.push(slot);
                linked = true;
            }
            store.set_list(j, 0, list);
        }
        scratch.lists = visited;
    }

    /// The static build of a bulk load into an empty index (see the module
    /// docs). The start node exists; `slots[i]` receives row `rows[i]`
    /// (`normed` holds the rows in that order).
    #[allow(clippy::too_many_arguments)]
    fn build_bulk(
        &self,
        store: &Store,
        slots: &[u32],
        rows: &[usize],
        ids: &[u64],
        normed: &[f32],
        seq: Seq,
        progress: Option<Progress<'_>>,
    ) {
        let dim = self.core.dim;
        let n = slots.len();
        let r = self.params.r;
        let seed = self.params.seed;
        self.core.install(|| {
            (0..n).into_par_iter().for_each(|i| {
                // SAFETY: fresh slots of an index that had no node but the
                // start one, which links to none of them yet; each slot is
                // written by one iteration only.
                unsafe {
                    store.init_slot(
                        slots[i],
                        ids[rows[i]],
                        seq,
                        &normed[i * dim..(i + 1) * dim],
                        0,
                    )
                };
            });
            // A random r-regular start graph over the new nodes and the
            // start node.
            let start = self.start_slot().expect("created before the build");
            let all: Vec<u32> = slots.iter().copied().chain([start]).collect();
            all.par_iter().enumerate().for_each(|(i, &s)| {
                let want = r.min(all.len() - 1);
                let mut list: Vec<u32> = Vec::with_capacity(want);
                let mut k = 0u64;
                while list.len() < want {
                    let pick = all[(splitmix64(seed ^ splitmix64((i as u64) << 20 ^ k))
                        % all.len() as u64) as usize];
                    k += 1;
                    if pick != s && !list.contains(&pick) {
                        list.push(pick);
                    }
                }
                let _g = store.lock(s);
                store.set_list(s, 0, &list);
            });
        });
        // Two passes in a seeded random order: α = 1, then α.
        let mut order: Vec<u32> = slots.to_vec();
        order.sort_by_key(|&s| splitmix64(seed ^ 0x0bd3 ^ s as u64));
        let done = AtomicUsize::new(0);
        for alpha in [1.0, self.alpha()] {
            self.core.install(|| {
                order.par_iter().for_each_init(
                    || self.core.scratch.get(),
                    |scratch, &s| {
                        self.link(store, s, alpha, false, scratch);
                        report(progress, &done, 2 * n, 2);
                    },
                )
            });
        }
        // Duplicates (and other nodes pruned out of every list) get an
        // in-edge back. No slot above these can be in use: the build holds
        // the start lock on an index that had only the start node, so the
        // allocator is not read here (it is never taken under the store
        // lock).
        let used = slots
            .iter()
            .chain(self.start_slot().as_ref())
            .max()
            .map_or(0, |&m| m as usize + 1);
        self.reconnect(store, used, &vec![false; used]);
        for (i, &s) in slots.iter().enumerate() {
            publish(
                store,
                &self.core.ids,
                &self.core.pending,
                s,
                ids[rows[i]],
                seq,
            );
        }
    }
}

/// Counts one more unit of work done out of `total` and reports the rows
/// done (a bulk build does two units per row, one per pass).
fn report(progress: Option<Progress<'_>>, done: &AtomicUsize, total: usize, per_row: usize) {
    if let Some(p) = progress {
        let d = done.fetch_add(1, Ordering::Relaxed) + 1;
        if d.is_multiple_of(1024) || d == total {
            p(d / per_row);
        }
    }
}
