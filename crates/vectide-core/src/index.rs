//! The [`VectorIndex`] trait: the one contract every engine implements.

use crate::engine::{EngineDescriptor, Knob};
use crate::error::Result;
use crate::heap::Neighbor;
use crate::io::StagedFile;
use crate::metric::Metric;
use crate::params::Params;
use crate::seq::Seq;
use std::path::Path;

/// A predicate on external ids, evaluated during the traversal: only ids for
/// which it returns `true` may appear in the results.
pub type Filter<'a> = &'a (dyn Fn(u64) -> bool + Sync);

/// Progress callback of long batch calls: rows done so far.
pub type Progress<'a> = &'a (dyn Fn(usize) + Sync);

/// Per-query knobs. An engine declares the knobs it takes
/// ([`crate::engine::EngineDescriptor::knobs`]); front ends build these with
/// [`SearchParams::set`] through the descriptor, so a knob an engine does not
/// take is an error before a query runs. An engine ignores fields it does
/// not take.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SearchParams {
    /// Candidate-list size of graph searches (HNSW's `ef`, Vamana's `L`).
    /// `None` uses the engine's default; it is raised to `k`.
    pub ef: Option<usize>,
    /// Reads issued per hop of a disk beam search.
    pub beam_width: Option<usize>,
    /// Postings or partitions probed.
    pub nprobe: Option<usize>,
    /// Candidates re-ranked with full-precision vectors.
    pub rerank: Option<usize>,
    /// Asks a database for an exact answer (Qdrant's `exact: true`): it
    /// scans its live points through [`VectorIndex::distances`]. Engines do
    /// not read it; an exact engine (`flat`) is exact anyway.
    pub exact: bool,
}

impl SearchParams {
    pub fn with_ef(ef: usize) -> Self {
        SearchParams {
            ef: Some(ef),
            ..SearchParams::default()
        }
    }

    /// The value of a knob, if set.
    pub fn get(&self, knob: Knob) -> Option<usize> {
        match knob {
            Knob::Ef => self.ef,
            Knob::BeamWidth => self.beam_width,
            Knob::Nprobe => self.nprobe,
            Knob::Rerank => self.rerank,
        }
    }

    /// Sets a knob after checking its range (`1..=knob.max()`).
    pub fn set(&mut self, knob: Knob, value: usize) -> Result<()> {
        crate::limits::check_range(knob.name(), value, 1, knob.max())?;
        let slot = match knob {
            Knob::Ef => &mut self.ef,
            Knob::BeamWidth => &mut self.beam_width,
            Knob::Nprobe => &mut self.nprobe,
            Knob::Rerank => &mut self.rerank,
        };
        *slot = Some(value);
        Ok(())
    }
}

/// Counters and sizes an engine reports. The common fields mean the same for
/// every engine (zero where they do not apply); `extra` holds named figures
/// of one engine.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct IndexStats {
    /// Live (searchable) vectors.
    pub live: usize,
    /// Node slots holding a live or a not-yet-reclaimed deleted vector.
    pub slots_used: usize,
    /// Slots allocated (used, free or never used).
    pub capacity: usize,
    /// Deleted vectors whose space is not reclaimed yet.
    pub pending_deletes: usize,
    /// Bytes of memory held by the index structures (approximate).
    pub memory_bytes: usize,
    /// Bytes the index occupies on disk (its files; 0 for volatile engines).
    pub disk_bytes: u64,
    /// Reads from disk or remote memory since the index was opened.
    pub reads: u64,
    /// Bytes those reads brought in.
    pub bytes_read: u64,
    /// Round trips to a remote memory node.
    pub round_trips: u64,
    /// Background jobs queued or running (consolidations, merges, splits).
    pub pending_background: usize,
    /// Delete consolidations run so far.
    pub consolidations: u64,
    /// Maintenance jobs running at the call (see [`crate::activity`]).
    pub maintenance: Vec<&'static str>,
    /// Maintenance jobs begun since the index was opened.
    pub maintenance_started: u64,
    /// Engine-specific figures, by name.
    pub extra: Vec<(String, f64)>,
}

impl IndexStats {
    /// The engine-specific figure `name`, if the engine reports it.
    pub fn extra_value(&self, name: &str) -> Option<f64> {
        self.extra.iter().find(|(k, _)| k == name).map(|&(_, v)| v)
    }
}

/// An approximate (or exact) nearest-neighbour index over `f32` vectors:
/// the one contract every engine implements.
///
/// ## Sequence numbers
/// Every mutating call carries a caller-supplied operation sequence number.
/// [`VectorIndex::durable_seq`] returns a low watermark: every operation with
/// a sequence number `<= durable_seq()` that the engine has acknowledged is
/// durable (for volatile engines: captured by the last save). A caller that
/// applies operations in sequence order (the database does) gets more: every
/// operation up to the watermark that entered the engine is durable. Callers
/// that race writers get no promise about an operation still in flight below
/// it, which a crash may drop. Applying an operation
/// twice is harmless: an insert whose sequence number is not newer than the one
/// already recorded for its id is skipped, and deleting an absent id is a no-op.
/// A database WAL can therefore replay every record after `durable_seq()`.
///
/// ## Reads that can fail
/// `get`, `contains`, `stats` return `Result`: a disk or remote engine does
/// I/O there. `len` does not: every engine keeps its live count in memory.
pub trait VectorIndex: Send + Sync {
    /// What the engine is (name, schema, knobs, persistence class).
    fn descriptor(&self) -> &'static EngineDescriptor;
    /// The engine's registry name.
    fn engine(&self) -> &'static str {
        self.descriptor().name
    }
    /// The parameters in effect, by name (the descriptor's schema).
    fn params(&self) -> Params;
    /// Vector dimension.
    fn dim(&self) -> usize;
    /// Distance metric.
    fn metric(&self) -> Metric;
    /// Worker threads of batch calls: the engine's pool, else rayon's
    /// global one.
    fn threads(&self) -> usize {
        self.pool()
            .map_or_else(rayon::current_num_threads, |p| p.current_num_threads())
    }
    /// The values the engine uses for knobs a query leaves unset (e.g.
    /// `ef` = the `ef_search` parameter).
    fn search_defaults(&self) -> SearchParams {
        SearchParams::default()
    }
    /// The engine's worker pool, on which batch calls run (`None`: the
    /// caller's thread, or rayon's global pool).
    fn pool(&self) -> Option<&rayon::ThreadPool> {
        None
    }
    /// Inserts a batch (row-major `ids.len() x dim`); an existing id is replaced
    /// (upsert). The batch is validated first: on error nothing changes.
    fn insert(&self, seq: Seq, ids: &[u64], vectors: &[f32]) -> Result<()>;
    /// [`VectorIndex::insert`] of a batch validated where it entered (the
    /// database's edge): the engine does not check it again. The default
    /// validates anyway, for engines that have no unchecked path.
    fn insert_checked(&self, seq: Seq, batch: crate::validate::Checked<'_>) -> Result<()> {
        self.insert(seq, batch.ids(), batch.vectors())
    }
    /// [`VectorIndex::insert`], reporting rows done to `progress`.
    fn insert_with_progress(
        &self,
        seq: Seq,
        ids: &[u64],
        vectors: &[f32],
        progress: Option<Progress<'_>>,
    ) -> Result<()> {
        self.insert(seq, ids, vectors)?;
        if let Some(p) = progress {
            p(ids.len());
        }
        Ok(())
    }
    /// Deletes ids; absent ids are ignored. Returns how many were removed.
    fn delete(&self, seq: Seq, ids: &[u64]) -> Result<usize>;
    /// Writes the `k` nearest live neighbours of `query` (closest first) into
    /// `out`, which is cleared first; reusing `out` avoids allocation.
    fn search_into(
        &self,
        query: &[f32],
        k: usize,
        params: &SearchParams,
        filter: Option<Filter<'_>>,
        out: &mut Vec<Neighbor>,
    ) -> Result<()>;
    /// Like [`VectorIndex::search_into`], returning a new vector (sized by
    /// the results found, not by `k`).
    fn search(
        &self,
        query: &[f32],
        k: usize,
        params: &SearchParams,
        filter: Option<Filter<'_>>,
    ) -> Result<Vec<Neighbor>> {
        let mut out = Vec::new();
        self.search_into(query, k, params, filter, &mut out)?;
        Ok(out)
    }
    /// Searches many row-major queries. The default runs one query at a time
    /// on the engine's pool; engines that batch (tiling queries against
    /// vectors, loading partitions once per batch) override it.
    fn search_batch(
        &self,
        queries: &[f32],
        k: usize,
        params: &SearchParams,
        filter: Option<Filter<'_>>,
    ) -> Result<Vec<Vec<Neighbor>>> {
        use rayon::prelude::*;
        let dim = self.dim();
        if dim == 0 || !queries.len().is_multiple_of(dim) {
            return Err(crate::Error::DimensionMismatch {
                expected: dim,
                got: queries.len() % dim.max(1),
            });
        }
        let run = || {
            queries
                .par_chunks(dim)
                .map_init(Vec::new, |out, q| {
                    self.search_into(q, k, params, filter, out)?;
                    Ok(out.clone())
                })
                .collect::<Result<Vec<_>>>()
        };
        match self.pool() {
            Some(pool) => pool.install(run),
            None => run(),
        }
    }
    /// Exact distances from `query` to the live ids among `ids` (absent ids
    /// are skipped), appended to `out` in the order of `ids`. Used for exact
    /// search over a small candidate set (e.g. a selective payload filter).
    /// The default reads each vector with [`VectorIndex::get`]; engines
    /// override it to read in place without allocating.
    fn distances(&self, query: &[f32], ids: &[u64], out: &mut Vec<Neighbor>) -> Result<()> {
        let mut buf = Vec::new();
        let q = crate::validate::prepare_query(self.dim(), self.metric(), query, &mut buf)?;
        let dist = self.metric().distance_fn();
        for &id in ids {
            if let Some(v) = self.get(id)? {
                out.push(Neighbor::new(id, dist(q, &v)));
            }
        }
        Ok(())
    }
    /// The `k` nearest live vectors to `query` by exact distance, nearest
    /// first (ties by id), from a scan of the engine's own storage in its
    /// order, or `None` when the engine has no such scan (a database then
    /// gives [`VectorIndex::distances`] every live id in one call).
    /// A scan holds the engine's locks for a bounded stretch at a time, so
    /// a writer waits for a part of it, never the whole; a point unchanged
    /// through the call is answered, one replaced or deleted meanwhile is
    /// answered as it was at some moment of the call or left out (an
    /// upsert may move it behind the scan), as a database's exact search
    /// promises.
    fn exact_scan(&self, query: &[f32], k: usize) -> Result<Option<Vec<Neighbor>>> {
        let _ = (query, k);
        Ok(None)
    }
    /// Asks the engine to leave the maintenance that falls due during
    /// writes (an hnsw delete's consolidation) to its caller, which polls
    /// [`VectorIndex::maintenance_due`] and runs [`VectorIndex::maintain`]
    /// off the write path (a database's background thread, so that the
    /// write that passes the threshold, and those queued behind it, do not
    /// wait for the job). Returns whether the engine will; the default,
    /// for engines whose jobs run in their own threads or not at all,
    /// declines. (`spann` accepts for its rebuild: from then on the
    /// caller's poll is what runs it; an index never asked starts its due
    /// rebuild itself, in the background.)
    fn defer_maintenance(&self) -> bool {
        false
    }
    /// Holds the engine's background maintenance (`true`: no background
    /// job starts until it is released; one running finishes) or releases
    /// it (`false`: the work that fell due meanwhile starts). Returns
    /// whether the engine has background jobs to hold; the default, for
    /// engines with none (or whose jobs run in the caller), declines and
    /// does nothing. Writes and searches go on while held, and so does
    /// what a caller asks for ([`VectorIndex::maintain`] runs the jobs on
    /// its own thread); an engine's backstops that bound its log or its
    /// dead space (a writer that finds them far behind runs them) still
    /// run. For a quiet stretch (a bulk load, a peak hour) and for a
    /// same-run baseline of writes beside no job (the soak's idle windows,
    /// for an engine whose jobs never stop under churn).
    fn pause_maintenance(&self, paused: bool) -> bool {
        let _ = paused;
        false
    }
    /// Whether deferred maintenance is due (see
    /// [`VectorIndex::defer_maintenance`]).
    fn maintenance_due(&self) -> bool {
        false
    }
    /// The stored vector of an id (normalised under cosine).
    fn get(&self, id: u64) -> Result<Option<Vec<f32>>>;
    /// Whether the id is live.
    fn contains(&self, id: u64) -> Result<bool>;
    /// Number of live vectors.
    fn len(&self) -> usize;
    /// Whether the index holds no live vector.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Makes everything applied so far durable (a no-op for volatile engines).
    fn flush(&self) -> Result<()>;
    /// The durability low watermark (see the trait docs).
    fn durable_seq(&self) -> Seq;
    /// Sizes and counters.
    fn stats(&self) -> Result<IndexStats>;
    /// Runs the maintenance that is due or pending (delete consolidation,
    /// merges, splits) and returns when none is in flight.
    fn maintain(&self) -> Result<()> {
        Ok(())
    }
    /// [`save`](Self::save) in two steps: the index's state is written
    /// beside `path` now (inserts and deletes wait, as in `save`), and the
    /// returned [`StagedSave`] makes it durable and puts it in place when
    /// committed, holding none of the index's locks, so that writes go on
    /// meanwhile. The durable watermark moves at the commit. Saves of one
    /// index are serialized until their commit (or drop). The default saves
    /// in one step.
    fn save_staged(&self, path: &Path) -> Result<StagedSave<'_>> {
        self.save(path)?;
        Ok(StagedSave::done(self.durable_seq()))
    }
    /// Writes a volatile index to a file (atomically), which the
    /// descriptor's `open` reads back. Engines that live in a directory are
    /// durable on their own: for them this is an error naming `flush`.
    fn save(&self, path: &Path) -> Result<()> {
        Err(crate::Error::invalid(format!(
            "a {} index lives in its directory and is durable on its own; \
             save({}) does not apply (use flush() to force durability)",
            self.engine(),
            path.display()
        )))
    }
    /// Whether the engine keeps its data itself, so that a database
    /// checkpoints it by [`VectorIndex::flush`] and reopens it where it is,
    /// rather than saving it to a file (the default: an engine that lives
    /// in a directory). An engine on a memory node keeps itself when the
    /// node keeps its regions across restarts.
    fn keeps_itself(&self) -> bool {
        self.descriptor().persistence.in_directory()
    }
    /// Stops background work and makes everything durable (the default:
    /// [`VectorIndex::flush`]). Calls after `close` may fail.
    fn close(&self) -> Result<()> {
        self.flush()
    }
    /// A full structural check of the index; returns the violations found
    /// (empty when sound). Engines without a checker return an error.
    fn check_structure(&self) -> Result<Vec<String>> {
        Err(crate::Error::invalid(format!(
            "a structural check is not implemented for engine {:?}",
            self.engine()
        )))
    }
    /// The engine as `Any`, for tools of its own crate (crash tests,
    /// inspectors) that need the concrete type.
    fn as_any(&self) -> &dyn std::any::Any;
}

impl std::fmt::Debug for dyn VectorIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VectorIndex")
            .field("engine", &self.engine())
            .field("dim", &self.dim())
            .field("metric", &self.metric())
            .field("len", &self.len())
            .finish()
    }
}

/// A save written beside its file and not yet durable (see
/// [`VectorIndex::save_staged`]).
pub struct StagedSave<'a> {
    file: Option<StagedFile>,
    covers: Seq,
    /// Moves the index's watermark (and releases what serializes its
    /// saves) once the file is in place.
    on_commit: Option<Box<dyn FnOnce() + 'a>>,
}

impl<'a> StagedSave<'a> {
    /// A staged file holding the index through `covers`; `on_commit` runs
    /// after the commit put it in place.
    pub fn new(file: StagedFile, covers: Seq, on_commit: impl FnOnce() + 'a) -> Self {
        StagedSave {
            file: Some(file),
            covers,
            on_commit: Some(Box::new(on_commit)),
        }
    }

    /// A save already durable (an engine that saves in one step).
    pub fn done(covers: Seq) -> Self {
        StagedSave {
            file: None,
            covers,
            on_commit: None,
        }
    }

    /// The sequence number the saved state holds every operation through.
    pub fn covers(&self) -> Seq {
        self.covers
    }

    /// fsyncs the file, puts it in place, then moves the watermark.
    pub fn commit(mut self) -> Result<()> {
        if let Some(f) = self.file.take() {
            f.commit()?;
        }
        if let Some(done) = self.on_commit.take() {
            done();
        }
        Ok(())
    }
}

impl std::fmt::Debug for StagedSave<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StagedSave")
            .field("file", &self.file)
            .field("covers", &self.covers)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An index of one point, to exercise the trait's default methods.
    struct One;

    static ONE: EngineDescriptor = EngineDescriptor {
        name: "one",
        summary: "a test index of one point",
        persistence: crate::engine::Persistence::Volatile,
        medium: crate::engine::Medium::Ram,
        params: &[],
        open_params: &[],
        knobs: &[],
        primary_knob: None,
        create: |_, _, _| Ok(Box::new(One)),
        open: |_, _| Ok(Box::new(One)),
        detect: |_| false,
        inspect: |_| Ok(Vec::new()),
    };

    impl VectorIndex for One {
        fn descriptor(&self) -> &'static EngineDescriptor {
            &ONE
        }
        fn params(&self) -> Params {
            Params::new()
        }
        fn as_any(&self) -> &dyn std::any::Any {
            self
        }
        fn dim(&self) -> usize {
            2
        }
        fn metric(&self) -> Metric {
            Metric::L2
        }
        fn insert(&self, _: Seq, _: &[u64], _: &[f32]) -> Result<()> {
            Ok(())
        }
        fn delete(&self, _: Seq, _: &[u64]) -> Result<usize> {
            Ok(0)
        }
        fn search_into(
            &self,
            _: &[f32],
            k: usize,
            _: &SearchParams,
            _: Option<Filter<'_>>,
            out: &mut Vec<Neighbor>,
        ) -> Result<()> {
            out.clear();
            out.extend([Neighbor::new(7, 0.5)].into_iter().take(k));
            Ok(())
        }
        fn get(&self, id: u64) -> Result<Option<Vec<f32>>> {
            Ok((id == 7).then(|| vec![1.0, 0.0]))
        }
        fn contains(&self, id: u64) -> Result<bool> {
            Ok(id == 7)
        }
        fn len(&self) -> usize {
            1
        }
        fn flush(&self) -> Result<()> {
            Ok(())
        }
        fn durable_seq(&self) -> Seq {
            0
        }
        fn stats(&self) -> Result<IndexStats> {
            Ok(IndexStats::default())
        }
    }

    #[test]
    fn search_allocates_by_the_results_not_by_k() {
        // Reserving `k` entries up front would abort the process here.
        let got = One
            .search(&[0.0, 0.0], usize::MAX / 2, &SearchParams::default(), None)
            .unwrap();
        assert_eq!(got, vec![Neighbor::new(7, 0.5)]);
        assert!(got.capacity() < 64);
    }

    #[test]
    fn defaults_batch_search_distances_and_save() {
        let got = One
            .search_batch(&[0.0, 0.0, 1.0, 1.0], 3, &SearchParams::default(), None)
            .unwrap();
        assert_eq!(got, vec![vec![Neighbor::new(7, 0.5)]; 2]);
        assert!(One
            .search_batch(&[0.0, 0.0, 1.0], 3, &SearchParams::default(), None)
            .is_err());
        let mut out = Vec::new();
        One.distances(&[1.0, 1.0], &[3, 7, 9], &mut out).unwrap();
        assert_eq!(out, vec![Neighbor::new(7, 1.0)]);
        let e = One.save(Path::new("x")).unwrap_err();
        assert!(e.to_string().contains("use flush()"), "{e}");
    }

    #[test]
    fn knobs_are_bounded() {
        let mut p = SearchParams::default();
        p.set(Knob::Nprobe, 64).unwrap();
        assert_eq!(p.get(Knob::Nprobe), Some(64));
        assert_eq!(p.get(Knob::Ef), None);
        assert!(p.set(Knob::Ef, 0).is_err());
        let e = p.set(Knob::BeamWidth, 1 << 20).unwrap_err();
        assert!(e.to_string().contains("beam_width"), "{e}");
    }
}
