//! The memory node's store: named regions of bytes within a size budget,
//! and the execution of work-request chains on them. It never looks at
//! what the bytes mean.

use crate::backing::{Backing, Restored, Slot};
use crate::verbs::{Completion, RegionInfo, Status, Verb};
use crate::NodeSize;
use parking_lot::RwLock;
use std::collections::HashMap;
use std::sync::Arc;
use vectide_core::{Error, Result};

/// Longest region name, in bytes (UTF-8).
pub const MAX_NAME: usize = 255;

/// Where a region's bytes live.
enum Bytes {
    /// In this process's heap (a node without a backing file).
    Heap(RwLock<Vec<u8>>),
    /// In the backing file's mapping, `len` bytes at file offset `at`;
    /// `lock` orders the verbs on them as the heap's lock does and holds
    /// whether the region is still alive: a drop clears it under the
    /// write lock, so a verb that looked the region up before the drop
    /// fails instead of reaching bytes a later region may be given.
    Mapped {
        backing: Arc<Backing>,
        at: u64,
        len: usize,
        slot: usize,
        lock: RwLock<bool>,
    },
}

struct Mem {
    name: String,
    bytes: Bytes,
}

impl Mem {
    fn len(&self) -> usize {
        match &self.bytes {
            Bytes::Heap(v) => v.read().len(),
            Bytes::Mapped { len, .. } => *len,
        }
    }

    /// Reads `n` bytes at `at` (in bounds: checked by the caller); `None`
    /// once the region was dropped.
    fn read(&self, at: usize, n: usize) -> Option<Vec<u8>> {
        match &self.bytes {
            Bytes::Heap(v) => Some(v.read()[at..at + n].to_vec()),
            Bytes::Mapped {
                backing,
                at: base,
                lock,
                ..
            } => {
                let alive = lock.read();
                if !*alive {
                    return None;
                }
                let mut out = vec![0u8; n];
                // SAFETY: `base + at + n` lies inside this region's bytes
                // (the caller checked `at + n` against its length), which
                // lie inside the file's mapping; the mapping lives as long
                // as `backing`, and the region's write lock excludes the
                // verbs that write these bytes while this copy runs.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        backing.base().add(*base as usize + at),
                        out.as_mut_ptr(),
                        n,
                    )
                };
                Some(out)
            }
        }
    }

    /// Runs `f` on `n` writable bytes at `at` (in bounds: checked by the
    /// caller), exclusively; `None` once the region was dropped.
    fn write<R>(&self, at: usize, n: usize, f: impl FnOnce(&mut [u8]) -> R) -> Option<R> {
        match &self.bytes {
            Bytes::Heap(v) => Some(f(&mut v.write()[at..at + n])),
            Bytes::Mapped {
                backing,
                at: base,
                lock,
                ..
            } => {
                let alive = lock.write();
                if !*alive {
                    return None;
                }
                // SAFETY: in bounds as in `read`; the write lock makes this
                // the only access to the region's bytes through the node
                // while `f` runs (the crash simulator's racy reads copy
                // with atomic loads).
                let b = unsafe {
                    std::slice::from_raw_parts_mut(backing.base().add(*base as usize + at), n)
                };
                Some(f(b))
            }
        }
    }

    /// A FLUSH's persist of `n` bytes at `at` (the chain fences after its
    /// run of FLUSHes): whether there was anything to persist (nothing in
    /// the heap); `None` once dropped.
    fn persist(&self, site: vectide_storage::Site, at: usize, n: usize) -> Option<bool> {
        if let Bytes::Mapped {
            backing,
            at: base,
            lock,
            ..
        } = &self.bytes
        {
            let alive = lock.read();
            if !*alive {
                return None;
            }
            backing.persist(site, base + at as u64, n as u64);
            return Some(n > 0);
        }
        Some(false)
    }

    /// Marks a region in the backing file dead once no verb is on it.
    fn kill(&self) {
        if let Bytes::Mapped { lock, .. } = &self.bytes {
            *lock.write() = false;
        }
    }
}

#[derive(Default)]
struct Table {
    by_id: HashMap<u32, Arc<Mem>>,
    by_name: HashMap<String, u32>,
    next_id: u32,
    used: u64,
}

/// Named regions within `capacity` bytes, in the heap or in a backing
/// file.
pub struct Regions {
    capacity: u64,
    table: RwLock<Table>,
    backing: Option<Arc<Backing>>,
    /// This start's number on the backing file; 0 in the heap.
    boot: u64,
}

fn check_name(name: &str) -> Result<()> {
    if name.is_empty() || name.len() > MAX_NAME {
        return Err(Error::invalid(format!(
            "a region name is 1..={MAX_NAME} bytes, got {}",
            name.len()
        )));
    }
    Ok(())
}

impl Regions {
    /// An empty store in the heap that may hand out `capacity` bytes.
    pub fn new(capacity: u64) -> Regions {
        Regions {
            capacity,
            table: RwLock::new(Table {
                next_id: 1,
                ..Table::default()
            }),
            backing: None,
            boot: 0,
        }
    }

    /// A store kept in the backing file `path` (created when absent),
    /// serving what it held at its last FLUSH: what `vectide memnode
    /// --backing PATH` serves, for a memory node inside the caller's
    /// process. The media is the storage layer's for that path (`mode`,
    /// unless a crash simulator stands in for it there).
    pub fn on_file(
        path: &std::path::Path,
        capacity: u64,
        mode: vectide_storage::PersistMode,
    ) -> Result<Regions> {
        let media = vectide_storage::media_for(path, || vectide_storage::media::for_mode(mode));
        let (b, restored) = Backing::open_or_create(path, media)?;
        Regions::backed(capacity, b, restored)
    }

    /// A store in `backing`, serving the regions it held (`restored`);
    /// an error when they need more than `capacity` bytes.
    pub fn backed(capacity: u64, backing: Backing, restored: Restored) -> Result<Regions> {
        let backing = Arc::new(backing);
        let boot = restored.boot;
        let mut t = Table {
            next_id: restored.next_id,
            ..Table::default()
        };
        for (slot, s) in restored.slots {
            let len = usize::try_from(s.size)
                .map_err(|_| Error::invalid("a region beyond this machine's address space"))?;
            t.used += s.size;
            t.by_name.insert(s.name.clone(), s.id);
            t.by_id.insert(
                s.id,
                Arc::new(Mem {
                    name: s.name,
                    bytes: Bytes::Mapped {
                        backing: Arc::clone(&backing),
                        at: s.offset,
                        len,
                        slot,
                        lock: RwLock::new(true),
                    },
                }),
            );
        }
        if t.used > capacity {
            return Err(Error::invalid(format!(
                "the backing file {} holds {} bytes of regions, more than the node's size of {capacity}",
                backing.path().display(),
                t.used
            )));
        }
        Ok(Regions {
            capacity,
            table: RwLock::new(t),
            backing: Some(backing),
            boot,
        })
    }

    /// This start's number on the backing file (see
    /// [`crate::RemoteMemory::boot`]); 0 for regions in the heap.
    pub fn boot(&self) -> u64 {
        self.boot
    }

    /// The backing file, if the regions live in one.
    pub fn backing(&self) -> Option<&Arc<Backing>> {
        self.backing.as_ref()
    }

    /// The budget and what regions use of it.
    pub fn size(&self) -> NodeSize {
        NodeSize {
            capacity: self.capacity,
            used: self.table.read().used,
        }
    }

    /// Creates a zeroed region; a name in use, an empty or too long name,
    /// a zero size or one beyond the budget left is an error. In a backing
    /// file the region is durable (zeroed, cataloged) before it is served.
    pub fn create(&self, name: &str, size: u64) -> Result<RegionInfo> {
        check_name(name)?;
        if size == 0 {
            return Err(Error::invalid("a region's size must be at least 1 byte"));
        }
        let mut t = self.table.write();
        if t.by_name.contains_key(name) {
            return Err(Error::invalid(format!("region {name:?} exists")));
        }
        let left = self.capacity - t.used;
        if size > left {
            return Err(Error::invalid(format!(
                "region {name:?} of {size} bytes does not fit: the node has {left} of its {} bytes left",
                self.capacity
            )));
        }
        let len = usize::try_from(size)
            .map_err(|_| Error::invalid(format!("region size {size} is beyond this machine")))?;
        let id = t.next_id;
        let next = t
            .next_id
            .checked_add(1)
            .ok_or_else(|| Error::invalid("the node ran out of region ids"))?;
        let bytes = match &self.backing {
            None => Bytes::Heap(RwLock::new(vec![0u8; len])),
            Some(b) => {
                let mut live = Vec::with_capacity(t.by_id.len());
                let mut taken = vec![false; crate::backing::SLOTS];
                for m in t.by_id.values() {
                    if let Bytes::Mapped { at, len, slot, .. } = &m.bytes {
                        live.push((*at, *len as u64));
                        taken[*slot] = true;
                    }
                }
                let slot = taken.iter().position(|x| !x).ok_or_else(|| {
                    Error::invalid(format!(
                        "the backing file's catalog is full ({} regions)",
                        crate::backing::SLOTS
                    ))
                })?;
                let at = b.place(&live, size)?;
                b.publish(
                    slot,
                    &Slot {
                        id,
                        name: name.to_string(),
                        offset: at,
                        size,
                    },
                    next,
                )?;
                Bytes::Mapped {
                    backing: Arc::clone(b),
                    at,
                    len,
                    slot,
                    lock: RwLock::new(true),
                }
            }
        };
        t.next_id = next;
        let mem = Arc::new(Mem {
            name: name.to_string(),
            bytes,
        });
        t.by_id.insert(id, mem);
        t.by_name.insert(name.to_string(), id);
        t.used += size;
        Ok(RegionInfo {
            name: name.to_string(),
            id,
            size,
        })
    }

    /// An existing region by name.
    pub fn open(&self, name: &str) -> Result<RegionInfo> {
        check_name(name)?;
        let t = self.table.read();
        let id = *t
            .by_name
            .get(name)
            .ok_or_else(|| Error::invalid(format!("no region named {name:?}")))?;
        let size = t.by_id[&id].len() as u64;
        Ok(RegionInfo {
            name: name.to_string(),
            id,
            size,
        })
    }

    /// Removes a region (its id is never handed out again; in a backing
    /// file its slot is cleared, durably, and its bytes reused later).
    pub fn drop_region(&self, name: &str) -> Result<()> {
        check_name(name)?;
        let mut t = self.table.write();
        let id = *t
            .by_name
            .get(name)
            .ok_or_else(|| Error::invalid(format!("no region named {name:?}")))?;
        let mem = &t.by_id[&id];
        // Verbs already past the table wait for the region's lock and then
        // find it dead; only then may its bytes go to another region.
        mem.kill();
        if let Bytes::Mapped { backing, slot, .. } = &mem.bytes {
            backing.unpublish(*slot);
        }
        t.by_name.remove(name);
        let mem = t.by_id.remove(&id).expect("the tables agree");
        t.used -= mem.len() as u64;
        Ok(())
    }

    /// Every region, by id.
    pub fn list(&self) -> Vec<RegionInfo> {
        let t = self.table.read();
        let mut v: Vec<RegionInfo> = t
            .by_id
            .iter()
            .map(|(&id, m)| RegionInfo {
                name: m.name.clone(),
                id,
                size: m.len() as u64,
            })
            .collect();
        v.sort_by_key(|r| r.id);
        v
    }

    /// Runs a chain in order; after a failed request the rest are
    /// [`Status::Flushed`].
    pub fn execute(&self, wrs: &[Verb]) -> Vec<Completion> {
        let mut out = Vec::with_capacity(wrs.len());
        let mut failed = false;
        // A run of FLUSHes persists each range and fences once, before the
        // next other request runs (or the chain ends): one `msync` for the
        // run rather than one per range, the same durability order.
        let mut fence: Option<vectide_storage::Site> = None;
        for wr in wrs {
            if failed {
                out.push(Completion::Failed(Status::Flushed));
                continue;
            }
            if !matches!(wr, Verb::Flush { .. }) {
                self.fence_pending(&mut fence);
            }
            let c = self.one(wr, &mut fence);
            failed = matches!(c, Completion::Failed(_));
            out.push(c);
        }
        self.fence_pending(&mut fence);
        out
    }

    /// The fence a run of FLUSHes owes, if any.
    fn fence_pending(&self, fence: &mut Option<vectide_storage::Site>) {
        if let (Some(site), Some(b)) = (fence.take(), &self.backing) {
            b.fence(site);
        }
    }

    fn one(&self, wr: &Verb, fence: &mut Option<vectide_storage::Site>) -> Completion {
        let (region, offset, len, atomic) = match wr {
            Verb::Read {
                region,
                offset,
                len,
            } => (*region, *offset, u64::from(*len), false),
            Verb::Write {
                region,
                offset,
                bytes,
            } => (*region, *offset, bytes.len() as u64, false),
            Verb::Cas { region, offset, .. } | Verb::FetchAdd { region, offset, .. } => {
                (*region, *offset, 8, true)
            }
            Verb::Flush {
                region,
                offset,
                len,
                ..
            } => (*region, *offset, *len, false),
        };
        let Some(mem) = self.table.read().by_id.get(&region).cloned() else {
            return Completion::Failed(Status::UnknownRegion);
        };
        if atomic && offset % 8 != 0 {
            return Completion::Failed(Status::Unaligned);
        }
        let size = mem.len() as u64;
        if offset.checked_add(len).is_none_or(|end| end > size) {
            return Completion::Failed(Status::OutOfBounds);
        }
        // In bounds of the region's bytes: fits usize.
        let (at, n) = (offset as usize, len as usize);
        let word = |b: &[u8]| u64::from_le_bytes(b.try_into().expect("8 bytes"));
        let done = match wr {
            Verb::Read { .. } => mem.read(at, n).map(Completion::Data),
            Verb::Write { bytes, .. } => mem
                .write(at, n, |b| b.copy_from_slice(bytes))
                .map(|()| Completion::Done),
            Verb::Cas { expect, new, .. } => mem
                .write(at, 8, |w| {
                    let old = word(w);
                    if old == *expect {
                        w.copy_from_slice(&new.to_le_bytes());
                    }
                    old
                })
                .map(Completion::Word),
            Verb::FetchAdd { add, .. } => mem
                .write(at, 8, |w| {
                    let old = word(w);
                    w.copy_from_slice(&old.wrapping_add(*add).to_le_bytes());
                    old
                })
                .map(Completion::Word),
            Verb::Flush { site, .. } => mem.persist(*site, at, n).map(|persisted| {
                if persisted {
                    // A run of another site's FLUSHes fences first.
                    if fence.is_some_and(|f| f != *site) {
                        self.fence_pending(fence);
                    }
                    *fence = Some(*site);
                }
                Completion::Done
            }),
        };
        // Dropped while this verb waited for it.
        done.unwrap_or(Completion::Failed(Status::UnknownRegion))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_keep_to_their_budget_and_bounds() {
        let r = Regions::new(100);
        let a = r.create("a", 64).unwrap();
        assert!(r.create("a", 8).is_err(), "a name in use");
        assert!(r.create("b", 40).is_err(), "beyond the budget");
        assert!(r.create("", 8).is_err() && r.create(&"x".repeat(256), 8).is_err());
        assert!(r.create("z", 0).is_err());
        let b = r.create("b", 36).unwrap();
        assert_eq!(r.size().used, 100);
        let c = r.execute(&[
            Verb::Write {
                region: a.id,
                offset: 8,
                bytes: 7u64.to_le_bytes().to_vec(),
            },
            Verb::Cas {
                region: a.id,
                offset: 8,
                expect: 7,
                new: 9,
            },
            Verb::Cas {
                region: a.id,
                offset: 8,
                expect: 7,
                new: 11,
            },
            Verb::FetchAdd {
                region: a.id,
                offset: 8,
                add: 1,
            },
            Verb::Read {
                region: a.id,
                offset: 8,
                len: 8,
            },
        ]);
        assert_eq!(
            c,
            vec![
                Completion::Done,
                Completion::Word(7),
                Completion::Word(9),
                Completion::Word(9),
                Completion::Data(10u64.to_le_bytes().to_vec())
            ]
        );
        let c = r.execute(&[
            Verb::Read {
                region: b.id,
                offset: 30,
                len: 6,
            },
            Verb::Read {
                region: b.id,
                offset: 30,
                len: 7,
            },
            Verb::Write {
                region: a.id,
                offset: 0,
                bytes: vec![1],
            },
        ]);
        assert_eq!(c[1], Completion::Failed(Status::OutOfBounds));
        assert_eq!(
            c[2],
            Completion::Failed(Status::Flushed),
            "after a failure nothing runs"
        );
        assert_eq!(
            r.execute(&[Verb::Read {
                region: a.id,
                offset: 0,
                len: 1
            }])[0],
            Completion::Data(vec![0])
        );
        for bad in [
            Verb::Cas {
                region: a.id,
                offset: 4,
                expect: 0,
                new: 1,
            },
            Verb::FetchAdd {
                region: a.id,
                offset: 60,
                add: 1,
            },
            Verb::Read {
                region: 99,
                offset: 0,
                len: 1,
            },
            Verb::Read {
                region: a.id,
                offset: u64::MAX,
                len: 2,
            },
        ] {
            assert!(
                matches!(
                    r.execute(std::slice::from_ref(&bad))[0],
                    Completion::Failed(_)
                ),
                "{bad:?}"
            );
        }
        r.drop_region("a").unwrap();
        assert_eq!(r.size().used, 36);
        assert!(r.open("a").is_err());
        let a2 = r.create("a", 8).unwrap();
        assert_ne!(a2.id, a.id, "ids are not reused");
        assert_eq!(
            r.execute(&[Verb::Read {
                region: a.id,
                offset: 0,
                len: 1
            }])[0],
            Completion::Failed(Status::UnknownRegion)
        );
        assert_eq!(
            r.list().iter().map(|x| x.name.as_str()).collect::<Vec<_>>(),
            ["b", "a"]
        );
    }

    /// A verb that looked a region up before it was dropped (the window
    /// between the table's lock and the region's) must not reach the bytes
    /// a region created after the drop was given in the backing file.
    #[test]
    fn a_verb_on_a_region_dropped_meanwhile_fails_and_its_successor_stays_zero() {
        let dir = std::env::temp_dir().join(format!("vectide-regions-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let media: Arc<dyn vectide_storage::media::Media> =
            Arc::new(vectide_storage::media::MsyncMedia::new());
        let (b, restored) = Backing::open_or_create(&dir.join("node.vtb"), media).unwrap();
        let r = Regions::backed(1 << 20, b, restored).unwrap();
        let old = r.create("old", 4096).unwrap();
        let stale = r.table.read().by_id.get(&old.id).cloned().unwrap();
        r.drop_region("old").unwrap();
        let new = r.create("new", 4096).unwrap();
        let at = |m: &Mem| match &m.bytes {
            Bytes::Mapped { at, .. } => *at,
            Bytes::Heap(_) => unreachable!("a backed store"),
        };
        let fresh = r.table.read().by_id.get(&new.id).cloned().unwrap();
        assert_eq!(
            at(&stale),
            at(&fresh),
            "the new region took the old one's bytes"
        );
        assert!(stale.write(0, 8, |w| w.fill(0xAB)).is_none());
        assert!(
            stale.read(0, 8).is_none() && stale.persist(crate::backing::SITE_FLUSH, 0, 8).is_none()
        );
        let c = r.execute(&[Verb::Read {
            region: new.id,
            offset: 0,
            len: 8,
        }]);
        assert_eq!(c, vec![Completion::Data(vec![0; 8])]);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
