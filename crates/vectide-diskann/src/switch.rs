//! The `fresh-diskann` merge and its atomic switch (§5.3–5.4): the merge
//! runs in the background (or inline); it freezes, gathers the change set,
//! runs StreamingMerge into a new LTI generation, then, under the writer
//! mutex and the state lock, moves the merged points to their LTI nodes,
//! renames the manifest naming the new generation into place and patches the
//! codes. Until that rename, a crash or an error leaves the old LTI in force.

use crate::lti::{self, GraphSource, Lti};
use crate::manifest::{self};
use crate::merge::{streaming_merge, Inserts, MergeParams, Phase};
use crate::state::*;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use vectide_core::{Error, Result, VectorIndex};
use vectide_storage::block::DirectFile;
use vectide_vamana::{FreshVamana, START_LABEL};

/// Searches each Insert-phase thread of a merge runs at once in
/// lock-step ([`MergeParams::in_flight`]); the phase has a thread per core
/// and one more, so that a thread waiting on its round's reads leaves its
/// core to another. On GloVe 390K (`examples/merge_loop.rs`, 5 % changed,
/// 2 cores, AVX2; four runs of each, interleaved) 3 threads × 8 searches
/// merged in 17.3 s on average against 20.1 s for 8 threads × 1 (the
/// kernel's CPU time fell from 7-8 s to 3.5-4 s), and 17.05 s / 19.2 s
/// with the visited-slot prefetch. 4 × 4, 2 × 8 and 3 × 4 were no better
/// than 3 × 8. More searches in flight cost user time: each holds a
/// 32 KiB PQ table and a visited set of about 64 KiB, and 8 of them
/// outgrow the L1 and L2 caches.
const MERGE_IN_FLIGHT: usize = 8;

impl Inner {
    // ----- merge -----

    /// Starts a StreamingMerge in the background, unless one is running:
    /// a task on the process's shared merge pool (one thread per core), so
    /// that a process's merge threads are bounded by its cores, not by its
    /// indexes (an index still runs one merge at a time, as before; more
    /// indexes due at once than cores queue).
    pub(crate) fn start_background(self: &Arc<Self>) {
        let mut bg = self.background.lock();
        if self.status.running.swap(true, Ordering::AcqRel) {
            return;
        }
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let pool = match vectide_core::pools::shared("fdann-merge", cores) {
            Ok(p) => p,
            Err(e) => {
                self.status.failures.fetch_add(1, Ordering::Relaxed);
                *self.status.last_error.lock() = Some(e.to_string());
                self.status.running.store(false, Ordering::Release);
                return;
            }
        };
        *bg = true;
        let me = Arc::clone(self);
        // The task keeps the pool alive until it ends.
        let keep = Arc::clone(&pool);
        pool.spawn(move || {
            let _pool = keep;
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| me.merge()))
                .unwrap_or_else(|_| Err(Error::invalid("the background merge panicked")));
            if let Err(e) = r {
                me.status.failures.fetch_add(1, Ordering::Relaxed);
                *me.status.last_error.lock() = Some(e.to_string());
            }
            let mut bg = me.background.lock();
            *bg = false;
            me.status.running.store(false, Ordering::Release);
            me.background_done.notify_all();
        });
    }

    /// Waits for the background merge, if one is queued or running.
    pub(crate) fn join_background(&self) {
        let mut bg = self.background.lock();
        while *bg {
            self.background_done.wait(&mut bg);
        }
    }

    /// Runs StreamingMerge now (module docs). Returns whether it merged.
    /// Refused once poisoned (see [`Inner::freeze`]).
    pub(crate) fn merge(self: &Arc<Self>) -> Result<bool> {
        self.poison.check()?;
        let _one = self.merge_lock.lock();
        let _job = self.status.activity.begin("merge");
        let r = self.merge_locked();
        self.status.phase.store(0, Ordering::Release);
        let ok = r?;
        Ok(ok)
    }

    pub(crate) fn merge_locked(self: &Arc<Self>) -> Result<bool> {
        // Freeze, then take the change set.
        let (old, dead, ros, covered, gen) = {
            let mut w = self.writer.lock();
            self.freeze(&mut w)?;
            let st = self.state.read();
            let mut dead = st.lti_dead.clone();
            dead.sort_unstable();
            dead.dedup();
            let ros: Vec<Arc<Temp>> = st.temps[..st.temps.len() - 1].to_vec();
            (
                st.lti.clone(),
                dead,
                ros,
                w.manifest.covered_seq,
                w.manifest.lti_gen + 1,
            )
        };
        if ros.is_empty() && dead.is_empty() {
            return Ok(false);
        }
        let ch = self.change_set(&ros);
        if old.is_none() && ch.labels.len() < vectide_quant::KSUB {
            // Too few points to train PQ: they stay in the temp indexes.
            return Ok(false);
        }
        let lti_path = manifest::lti_file(&self.dir, gen);
        let pq_path = manifest::pq_file(&self.dir, gen);
        let mid_path = manifest::mid_file(&self.dir, gen);
        let cleanup = || {
            for p in [&lti_path, &pq_path, &mid_path] {
                let _ = std::fs::remove_file(p);
            }
        };
        // The first LTI from one temp index whose points are all live is that
        // index's graph as it is; otherwise a static build of the points.
        let reuse = match (&old, ros.as_slice()) {
            (None, [one]) if one.index.len() == ch.labels.len() => Some(&one.index),
            _ => None,
        };
        let built = self
            .pool
            .install(|| self.build_new(old.as_deref(), reuse, &dead, &ch, gen, covered));
        let _ = std::fs::remove_file(&mid_path);
        let (slots, outcome) = match built {
            Ok(x) => x,
            Err(e) => {
                cleanup();
                return Err(e);
            }
        };
        self.status.phase.store(4, Ordering::Release);
        let r = self.switch(old, &dead, &ros, &ch, &slots, outcome.as_ref(), gen);
        if r.is_err() {
            cleanup();
        }
        r?;
        self.status.merges.fetch_add(1, Ordering::Relaxed);
        if let Some(o) = outcome {
            *self.status.last.lock() = Some(o.stats);
        }
        Ok(true)
    }

    /// The live points of the frozen temp indexes, with their links.
    pub(crate) fn change_set(&self, ros: &[Arc<Temp>]) -> ChangeSet {
        let exports: Vec<_> = ros
            .iter()
            .map(|t| (t.serial, t.index.export_graph()))
            .collect();
        let st = self.state.read();
        let mut ch = ChangeSet::default();
        for (serial, g) in &exports {
            let mut num = vec![u32::MAX; g.len()];
            let keep: Vec<usize> = (0..g.len())
                .filter(|&i| {
                    let l = g.labels[i];
                    l != START_LABEL
                        && st
                            .loc
                            .get(&l)
                            .is_some_and(|x| x.place == Place::temp(*serial))
                })
                .collect();
            let base = ch.labels.len() as u32;
            for (k, &i) in keep.iter().enumerate() {
                num[i] = base + k as u32;
            }
            for &i in &keep {
                ch.labels.push(g.labels[i]);
                ch.origin.push(*serial);
                ch.vectors.extend_from_slice(g.vector(i));
                ch.links.push(
                    g.lists[i]
                        .iter()
                        .map(|&n| num[n as usize])
                        .filter(|&n| n != u32::MAX)
                        .collect(),
                );
            }
        }
        ch
    }

    /// Writes generation `gen`: StreamingMerge over the old LTI, or the
    /// first LTI built from the change set. Returns each point's node.
    pub(crate) fn build_new(
        &self,
        old: Option<&LtiGen>,
        reuse: Option<&FreshVamana>,
        dead: &[u32],
        ch: &ChangeSet,
        gen: u64,
        covered: u64,
    ) -> Result<(Vec<u32>, Option<crate::merge::MergeOutcome>)> {
        let out = DirectFile::open(&manifest::lti_file(&self.dir, gen), true, LTI_SYNC)?;
        let pq_path = manifest::pq_file(&self.dir, gen);
        match old {
            Some(old) => {
                let mid = DirectFile::open(&manifest::mid_file(&self.dir, gen), true, LTI_SYNC)?;
                let status = &self.status;
                let progress = |ph: Phase, done: u64, total: u64| {
                    let code = match ph {
                        Phase::Delete => 1,
                        Phase::Insert => 2,
                        Phase::Patch => 3,
                    };
                    status.phase.store(code, Ordering::Release);
                    status.done.store(done, Ordering::Release);
                    status.total.store(total, Ordering::Release);
                };
                let p = MergeParams {
                    r: self.params.graph.r,
                    l: self.params.merge_l,
                    alpha: self.alpha(),
                    w: self.params.beam_width,
                    io_threads: self.threads + 1,
                    refill: self.params.merge_refill,
                    in_flight: MERGE_IN_FLIGHT,
                };
                let o = streaming_merge(
                    &old.lti,
                    dead,
                    Inserts {
                        labels: &ch.labels,
                        vectors: &ch.vectors,
                        links: &ch.links,
                    },
                    &p,
                    Box::new(mid),
                    &out,
                    &pq_path,
                    covered,
                    Some(&progress),
                )?;
                Ok((o.slots.clone(), Some(o)))
            }
            None => {
                self.status.phase.store(2, Ordering::Release);
                let g = match reuse {
                    Some(v) => {
                        // Repair around the deletes it still holds first.
                        v.maintain()?;
                        v.export_graph()
                    }
                    None => {
                        let v = FreshVamana::new(
                            self.dim,
                            self.metric,
                            Self::temp_params(&self.params, self.threads),
                        )?;
                        v.insert(covered.max(1), &ch.labels, &ch.vectors)?;
                        v.export_graph()
                    }
                };
                self.status.phase.store(3, Ordering::Release);
                let written = lti::write(
                    &out,
                    &pq_path,
                    &GraphSource {
                        durable_seq: covered,
                        ..GraphSource::from_export(&g)
                    },
                    self.params.pq_bytes,
                    self.params.graph.seed,
                )?;
                // Records are laid out by sector_order: node numbers are
                // not the export's indexes.
                let node: HashMap<u64, u32> = g
                    .labels
                    .iter()
                    .zip(&written.node_of)
                    .map(|(&l, &n)| (l, n))
                    .collect();
                Ok((ch.labels.iter().map(|l| node[l]).collect(), None))
            }
        }
    }

    /// The atomic switch to generation `gen` (module docs).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn switch(
        &self,
        old: Option<Arc<LtiGen>>,
        dead: &[u32],
        ros: &[Arc<Temp>],
        ch: &ChangeSet,
        slots: &[u32],
        outcome: Option<&crate::merge::MergeOutcome>,
        gen: u64,
    ) -> Result<()> {
        let file = DirectFile::open(&manifest::lti_file(&self.dir, gen), false, LTI_SYNC)?;
        let header = Lti::read_header(&file)?;
        let pq = old.as_ref().map(|g| g.lti.pq().clone());
        drop(old);
        let merged: HashSet<u64> = ros.iter().map(|t| t.serial).collect();
        let dead_set: HashSet<u32> = dead.iter().copied().collect();
        let mut w = self.writer.lock();
        let mut st = self.state.write();
        let mut moves = Vec::with_capacity(slots.len());
        let mut lti_dead: Vec<u32> = st
            .lti_dead
            .iter()
            .copied()
            .filter(|n| !dead_set.contains(n))
            .collect();
        for (j, &slot) in slots.iter().enumerate() {
            let id = ch.labels[j];
            match st.loc.get(&id) {
                Some(l) if l.place == Place::temp(ch.origin[j]) => moves.push((id, slot, l.seq)),
                _ => lti_dead.push(slot),
            }
        }
        let ro_dead: Vec<(u64, u64)> = st
            .ro_dead
            .iter()
            .copied()
            .filter(|(s, _)| !merged.contains(s))
            .collect();
        let mut m = w.manifest.clone();
        m.lti_gen = gen;
        m.ro.retain(|s| !merged.contains(s));
        m.lti_dead = lti_dead.clone();
        // A temp index frozen but not yet named by a manifest (a freeze
        // saving it meanwhile, see `Inner::freeze`) has its deletes named
        // by that freeze's manifest, not this one.
        m.ro_dead = ro_dead
            .iter()
            .copied()
            .filter(|(s, _)| m.ro.contains(s))
            .collect();
        let lti = match (pq, outcome) {
            (Some(pq), Some(o)) => {
                // Patch the codes in place: no search holds the old LTI
                // while the state is locked, so its codes are ours.
                m.write(&self.dir)?;
                let mut codes = match st.lti.take().map(Arc::try_unwrap) {
                    Some(Ok(g)) => {
                        Arc::try_unwrap(g.lti.into_codes()).unwrap_or_else(|a| (*a).clone())
                    }
                    Some(Err(a)) => a.lti.codes().as_ref().clone(),
                    None => Vec::new(),
                };
                o.apply_codes(&mut codes);
                Lti::from_parts(Box::new(file), header, pq, Arc::new(codes))
            }
            _ => {
                let lti = Lti::open(Box::new(file), &manifest::pq_file(&self.dir, gen))?;
                m.write(&self.dir)?;
                st.lti = None;
                Ok(lti)
            }
        };
        let lti = match lti {
            Ok(l) => l,
            Err(e) => {
                // The manifest names the new LTI but it cannot be used here:
                // reopening the directory recovers it.
                return Err(Error::corrupted(format!(
                    "merge switch: the new LTI could not be opened ({e}); reopen the index"
                )));
            }
        };
        for (id, slot, seq) in moves {
            st.loc.insert(
                id,
                Loc {
                    place: Place::Lti(slot),
                    seq,
                },
            );
        }
        st.lti_dead = lti_dead;
        st.ro_dead = ro_dead;
        st.temps.retain(|t| !merged.contains(&t.serial));
        st.lti = Some(Arc::new(LtiGen { gen, lti }));
        w.manifest = m;
        drop(st);
        drop(w);
        if gen > 1 {
            let _ = std::fs::remove_file(manifest::lti_file(&self.dir, gen - 1));
            let _ = std::fs::remove_file(manifest::pq_file(&self.dir, gen - 1));
        }
        for s in merged {
            let _ = std::fs::remove_file(manifest::temp_file(&self.dir, s));
        }
        Ok(())
    }
}

/// The points a merge folds in: per point its label, origin temp, vector
/// and links (indices of other points).
#[derive(Default)]
pub(crate) struct ChangeSet {
    pub(crate) labels: Vec<u64>,
    pub(crate) origin: Vec<u64>,
    pub(crate) vectors: Vec<f32>,
    pub(crate) links: Vec<Vec<u32>>,
}
