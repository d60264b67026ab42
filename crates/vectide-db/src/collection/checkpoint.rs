//! Checkpoints: when one is due, and what it does (the engine saved,
//! flushed or left to its own checkpoints, the point store committed, the
//! WAL cut through what both cover).

use super::recovery::{hands_log_over, INDEX_FILE};
use super::Collection;
use crate::error::Result;
use std::sync::atomic::Ordering;
use std::time::Instant;
use vectide_engines::Persistence;

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
        let index = self.engine.stats().map_or(0, |s| s.memory_bytes) as f64 * o.checkpoint_ratio;
        let cap = o.checkpoint_bytes.max(1);
        (index as u64).clamp(o.checkpoint_min_bytes.min(cap), cap)
    }

    /// WAL bytes a restart now would replay (about).
    pub fn wal_tail_bytes(&self) -> u64 {
        self.log.bytes_since_checkpoint()
    }

    /// Saves or flushes the engine, makes the store durable, and deletes the
    /// WAL segments both cover. Writers wait while it runs. Refused once
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
        let turn = self.turn.lock();
        // Poison is set only under the turn: checked here, a record that
        // failed while this checkpoint waited cannot be cut from the log.
        if let Err(e) = self.poison.check() {
            return if close { Ok(()) } else { Err(e.into()) };
        }
        let upto = *turn - 1;
        let engine_seq = self.engine_seq.load(Ordering::Acquire);
        if self.engine.descriptor().persistence == Persistence::Volatile {
            self.engine.save(&self.dir.join(INDEX_FILE))?;
        } else if close {
            self.engine.close()?;
        } else if !hands_log_over(&self.config.engine, &self.opts)
            || self.log.bytes_after(self.engine.durable_seq()) > self.opts.checkpoint_bytes
        {
            // An engine that handed its log over persists checkpoints at
            // its own pace (a freeze, a snapshot), and the log keeps what
            // it has not covered yet; it is made to checkpoint only once
            // that tail outgrows `checkpoint_bytes`.
            self.engine.flush()?;
        }
        let engine_durable = self.engine.durable_seq();
        self.store.write().checkpoint(engine_durable)?;
        // Every operation before the turn is applied, and the store now
        // holds all of them durably. The engine holds all of them durably
        // when its watermark covers the last operation that reached it
        // (operations that do not touch the engine, such as payload
        // updates, leave its own counter behind); otherwise the log keeps
        // what follows its watermark.
        let cut = if engine_durable >= engine_seq {
            upto
        } else {
            engine_durable.min(upto)
        };
        drop(turn);
        self.log.truncate_through(cut)?;
        *self.last_checkpoint.lock() = Instant::now();
        self.counters.checkpoints.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}
