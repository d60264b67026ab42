//! The region's writer table (`docs/format-dhnsw.md`): where a named
//! compute node (`writer = NAME`) keeps its durable point, so that the
//! point outlives the node. Each compute node numbers its own operations
//! (the engine contract's sequence numbers); several write one region, so
//! each has a slot of its own, claimed by CAS of a free slot's key.
//!
//! Every write of this engine is durable on a memory node with a backing
//! file when it is acknowledged (each phase FLUSHed before the next,
//! `docs/format-dhnsw.md`); `flush()` only records the watermark.

use crate::labelmap::cas_flushed;
use crate::layout::{WRITERS_AT, WRITER_BYTES, WRITER_SLOTS};
use crate::state::{DHnsw, Layout};
use vectide_core::{Error, Result};
use vectide_remote::Verb;

/// A writer name's key in the table: 64-bit FNV-1a of its bytes, never 0
/// (0 marks a free slot). Two names with one key would share a slot (odds
/// of 2⁻⁶⁴ a pair).
pub fn writer_key(name: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h.max(1)
}

fn word(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// The table's slot holding `key`, if any, from its bytes.
fn slot_of(table: &[u8], key: u64) -> Option<usize> {
    (0..WRITER_SLOTS as usize).find(|&i| word(table, i * WRITER_BYTES as usize) == key)
}

impl DHnsw {
    fn read_writers(&self, lay: &Layout) -> Result<Vec<u8>> {
        self.mem
            .read(lay.region, WRITERS_AT, (WRITER_SLOTS * WRITER_BYTES) as u32)
    }

    /// Where this writer's slot is in `lay`'s region: found by its key, or
    /// claimed (the first free slot whose key a CAS sets, FLUSHed). `None`
    /// for a compute node with no writer name.
    fn writer_slot(&self, lay: &Layout) -> Result<Option<u64>> {
        let Some(name) = &self.params.writer else {
            return Ok(None);
        };
        if let Some((region, at)) = *self.writer_at.lock() {
            if region == lay.region.id {
                return Ok(Some(at));
            }
        }
        let key = writer_key(name);
        let table = self.read_writers(lay)?;
        let at = match slot_of(&table, key) {
            Some(i) => WRITERS_AT + i as u64 * WRITER_BYTES,
            None => {
                let mut got = None;
                for i in 0..WRITER_SLOTS as usize {
                    if word(&table, i * WRITER_BYTES as usize) != 0 {
                        continue;
                    }
                    let at = WRITERS_AT + i as u64 * WRITER_BYTES;
                    let found =
                        cas_flushed(&*self.mem, lay.region, at, 0, key, crate::sites::DURABLE)?;
                    if found == 0 || found == key {
                        got = Some(at);
                        break;
                    }
                }
                got.ok_or_else(|| {
                    Error::invalid(format!(
                        "d-hnsw: the writer table of region {:?} is full ({WRITER_SLOTS} named writers); name this compute node as one of them",
                        lay.name
                    ))
                })?
            }
        };
        *self.writer_at.lock() = Some((lay.region.id, at));
        Ok(Some(at))
    }

    /// This writer's durable point as `lay`'s region holds it (0 for a
    /// compute node with no name, or a name the table does not hold).
    pub(crate) fn stored_durable(&self, lay: &Layout) -> Result<u64> {
        let Some(name) = &self.params.writer else {
            return Ok(0);
        };
        let table = self.read_writers(lay)?;
        Ok(slot_of(&table, writer_key(name))
            .map_or(0, |i| word(&table, i * WRITER_BYTES as usize + 8)))
    }

    /// Records `seq` as this writer's durable point (WRITE and FLUSH in one
    /// doorbell); nothing for a compute node with no name.
    pub(crate) fn store_durable(&self, lay: &Layout, seq: u64) -> Result<()> {
        let Some(at) = self.writer_slot(lay)? else {
            return Ok(());
        };
        let c = self.mem.post(&[
            Verb::Write {
                region: lay.region.id,
                offset: at + 8,
                bytes: seq.to_le_bytes().to_vec(),
            },
            Verb::Flush {
                region: lay.region.id,
                offset: at + 8,
                len: 8,
                site: crate::sites::DURABLE,
            },
        ])?;
        for c in c {
            c.into_done()?;
        }
        Ok(())
    }

    /// `flush()`: every write this node acknowledged is durable already;
    /// the watermark of what it applied is recorded in its slot (a named
    /// writer) and becomes its `durable_seq`.
    pub(crate) fn flush_writer(&self) -> Result<()> {
        // No write of this node in between: the watermark is exact.
        let _w = self.write.lock();
        let seq = self.applied.load(std::sync::atomic::Ordering::Acquire);
        if seq <= self.durable.load(std::sync::atomic::Ordering::Acquire) {
            return Ok(());
        }
        {
            let guard = self.layout.read();
            if let Some(lay) = guard.as_ref() {
                self.store_durable(lay, seq)?;
            }
        }
        self.durable
            .fetch_max(seq, std::sync::atomic::Ordering::AcqRel);
        Ok(())
    }

    /// The writer table of `lay`'s region, to carry into a new region (a
    /// relayout or a repartition, with every partition held).
    pub(crate) fn writers_image(&self, lay: &Layout) -> Result<Vec<u8>> {
        self.read_writers(lay)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_never_zero_and_tell_names_apart() {
        let names = ["a", "b", "crash", "db-1", "db-2", ""];
        let keys: std::collections::HashSet<u64> = names.iter().map(|n| writer_key(n)).collect();
        assert_eq!(keys.len(), names.len());
        assert!(!keys.contains(&0));
        assert_eq!(writer_key("crash"), writer_key("crash"));
    }
}
