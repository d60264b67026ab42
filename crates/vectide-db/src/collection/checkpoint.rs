//! Checkpoints: when one is due, and what it does (the engine saved,
//! flushed or left to its own checkpoints, the point store committed, the
//! WAL cut through what both cover).

use super::recovery::{hands_log_over, INDEX_FILE};
use super::Collection;
use crate::error::Result;
use crate::spaces::{dense_dir, DenseSpace, SparseSpace};
use std::sync::atomic::Ordering;
use std::time::Instant;
use vectide_core::Seq;

impl Collection {
    /// Whether the checkpoint policy calls for a checkpoint now.
    pub fn checkpoint_due(&self) -> bool {
        if self.poison.cause().is_some() {
            return false;
        }
        let bytes = self.log.bytes_since_checkpoint();
        bytes >= self.checkpoint_threshold()
            || (bytes > 0 && self.last_checkpoint.lock().elapsed() >= self.opts.checkpoint_interval)
    }

    /// WAL bytes (counted from what a restart would replay) that make a
    /// checkpoint due (see [`Options::checkpoint_bytes`]).
    pub fn checkpoint_threshold(&self) -> u64 {
        let o = &self.opts;
        let index = self.stats().map_or(0, |s| s.memory_bytes) as f64 * o.checkpoint_ratio;
        let cap = o.checkpoint_bytes.max(1);
        (index as u64).clamp(o.checkpoint_min_bytes.min(cap), cap)
    }

    /// WAL bytes a restart now would replay (about).
    pub fn wal_tail_bytes(&self) -> u64 {
        self.log.bytes_since_checkpoint()
    }

    /// Saves or flushes the engine, makes the store durable, and deletes the
    /// WAL segments both cover. Writers wait only while a volatile engine's
    /// state is written to the page cache and the store's changed rows are
    /// taken; the fsyncs, a durable engine's flush and the store's commit
    /// run beside them. Refused once
    /// the collection is poisoned: its state lacks a logged record, which
    /// only the log can still give back at the reopen.
    pub fn checkpoint(&self) -> Result<()> {
        self.checkpoint_and(false)
    }

    /// The last checkpoint, at the database's close: a durable engine is
    /// closed (its background work stopped, the rest made durable) rather
    /// than flushed; a volatile one is saved, which is all its close would
    /// do again.
    /// A poisoned collection takes none: its log stays whole for the
    /// reopen.
    pub(crate) fn final_checkpoint(&self) -> Result<()> {
        self.checkpoint_and(true)
    }

    fn checkpoint_and(&self, close: bool) -> Result<()> {
        let _job = self.activity.begin("checkpoint");
        let _one = self.checkpointing.lock();
        let turn = self.turn.lock();
        // Poison is set only under the turn: checked here, a record that
        // failed while this checkpoint waited cannot be cut from the log.
        if let Err(e) = self.poison.check() {
            return if close { Ok(()) } else { Err(e.into()) };
        }
        let upto = *turn - 1;
        // Each space's state: a volatile engine's or a sparse index's is
        // written beside its file now, under the turn (in the page cache:
        // no fsync); the fsync and rename come after the turn is released.
        let mut parts = Vec::with_capacity(self.dense.len() + self.sparse.len());
        for (i, d) in self.dense.iter().enumerate() {
            let touched = d.engine_seq.load(Ordering::Acquire);
            let part = if d.engine.keeps_itself() {
                if close {
                    d.engine.close()?;
                }
                Part::Durable(d)
            } else {
                let file = dense_dir(&self.dir, i).join(INDEX_FILE);
                Part::Staged(d.engine.save_staged(&file)?)
            };
            parts.push((touched, part));
        }
        for sp in &self.sparse {
            // Saved under the turn, the file holds every operation through
            // `upto` (those that did not touch the space changed nothing in
            // it): its durable point is `upto`, so that a space never
            // written cannot hold the collection's recorded checkpoint back
            // (which would hide another space's lost file at the next open).
            let mut x = sp.index.write();
            x.mark_applied(upto);
            parts.push((upto, Part::Sparse(sp, x.save_staged(&sp.file)?, upto)));
        }
        // The store's rows through `upto` are taken now, under the turn;
        // they are written after it is released, while later operations
        // apply to the store's memory.
        let mut flush = self.store.write().begin_checkpoint(0);
        drop(turn);
        // Writers go on from here.
        let mut cut = upto;
        let mut lowest = upto;
        for (touched, part) in parts {
            // In a multi collection an upsert may reach an engine that keeps
            // itself twice under one number (the removal of vectors its
            // points no longer carry there, then the insert), and such an
            // engine may move its durable point between the two (a
            // background snapshot): the record at its durable point is kept,
            // since a restart takes it again (`apply`).
            let split = self.shape.is_some() && matches!(part, Part::Durable(_));
            let durable = match self.space_part(part, close) {
                Ok(d) => d,
                Err(e) => {
                    self.store.write().end_checkpoint(flush, false);
                    return Err(e);
                }
            };
            // Every operation through `upto` is applied. A space holds
            // all of them durably when its durable point covers the last
            // operation that reached it by `upto` (operations that do not
            // touch it, such as payload updates, leave its own counter
            // behind); otherwise the log keeps what follows its durable
            // point.
            if durable < touched {
                cut = cut.min(durable);
            }
            if split && durable <= touched {
                cut = cut.min(durable.saturating_sub(1));
            }
            lowest = lowest.min(durable);
        }
        // The spaces' parts are durable before the store records where
        // they stand.
        flush.set_engine_seq(lowest);
        let committed = flush.commit();
        self.store.write().end_checkpoint(flush, committed.is_ok());
        committed?;
        self.log.truncate_through(cut)?;
        *self.last_checkpoint.lock() = Instant::now();
        self.counters.checkpoints.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// A space's part of a checkpoint, after the turn: a staged save
    /// committed; a durable engine flushed when it keeps no log of its own
    /// to us, or when the log's tail past its own durable point outgrows
    /// [`Self::handover_tail_cap`]. Returns the space's durable point.
    fn space_part(&self, part: Part<'_>, close: bool) -> Result<Seq> {
        match part {
            Part::Staged(s) => {
                let covers = s.covers();
                s.commit()?;
                Ok(covers)
            }
            Part::Sparse(sp, file, covers) => {
                file.commit()?;
                sp.durable.fetch_max(covers, Ordering::AcqRel);
                Ok(covers)
            }
            Part::Durable(d) => {
                if !close
                    && (!hands_log_over(&d.config.engine, &self.opts)
                        || self.log.bytes_after(d.engine.durable_seq()) > self.handover_tail_cap())
                {
                    // An engine that handed its log over persists
                    // checkpoints at its own pace (a freeze, a snapshot),
                    // and the log keeps what it has not covered yet; it is
                    // made to checkpoint only once that tail would make a
                    // restart's replay long.
                    d.engine.flush()?;
                }
                Ok(d.engine.durable_seq())
            }
        }
    }

    /// The longest log tail past its own durable point that an engine
    /// which handed its log over is left to keep: eight checkpoint
    /// thresholds (so 40 % of the index's size at the default ratio), at
    /// most `checkpoint_bytes`. Replaying a tail of `checkpoint_bytes`
    /// (256 MiB) into `fresh-diskann` took 50 s at a restart.
    pub fn handover_tail_cap(&self) -> u64 {
        self.checkpoint_threshold()
            .saturating_mul(8)
            .min(self.opts.checkpoint_bytes)
    }
}

/// A space's share of a checkpoint, taken under the turn.
enum Part<'a> {
    /// A volatile engine's save, staged.
    Staged(vectide_core::StagedSave<'a>),
    /// An engine that keeps itself.
    Durable(&'a DenseSpace),
    /// A sparse index's file, staged, and what it covers.
    Sparse(&'a SparseSpace, vectide_core::io::StagedFile, Seq),
}
