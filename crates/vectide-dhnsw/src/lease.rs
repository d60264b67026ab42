//! Who may write a region (`docs/format-dhnsw.md`, "Lease"). Standalone
//! compute nodes share a region freely; a database collection takes the
//! region's lease (`lease = OWNER`): the header's owner word, set by CAS to
//! the owner's key and an epoch (FLUSHed), so that one owner at a time
//! writes it. The holder renews it (a beat word it raises every
//! `timeout_ms`, from a thread of its own); another owner may break it only
//! after watching the beat stand still for the take-over time (six times
//! `timeout_ms`); the same owner reopening after a crash takes it back at
//! once with the next epoch. Every lock a writer takes reads the owner word
//! in the same doorbell: a holder whose lease was broken, or a compute node
//! without the lease, writes nothing.

use crate::labelmap::cas_flushed;
use crate::layout::{BEAT_AT, OWNER_AT, OWNER_NAME_AT, OWNER_NAME_MAX};
use crate::state::{DHnsw, Layout};
use crate::writers::writer_key;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use vectide_core::{Error, Result};
use vectide_remote::{Region, RemoteMemory, Verb};

/// The owner word's epoch bits (the low 16; the high 48 are the owner's
/// key).
const EPOCH_BITS: u64 = 0xffff;

/// The owner word of `name` at `epoch`.
pub fn owner_word(name: &str, epoch: u64) -> u64 {
    (writer_key(name) << 16) | (epoch & EPOCH_BITS).max(1)
}

fn same_owner(a: u64, b: u64) -> bool {
    a >> 16 == b >> 16
}

/// What a compute node holds of a lease, shared with its renewal thread:
/// its owner word (0: none), the region it is on, and whether the node
/// closed.
pub struct Held {
    pub word: AtomicU64,
    pub stop: AtomicBool,
    renewing: AtomicBool,
    region: Mutex<Option<Region>>,
    /// Weak: a closed compute node's transport (and a memory node inside
    /// its process, with its backing file's lock) goes with it at once.
    mem: std::sync::Weak<dyn RemoteMemory>,
}

impl Held {
    pub fn new(mem: &Arc<dyn RemoteMemory>) -> Held {
        Held {
            word: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            renewing: AtomicBool::new(false),
            region: Mutex::new(None),
            mem: Arc::downgrade(mem),
        }
    }

    /// The region the index is on now (a build or a move changed it).
    pub fn on_region(&self, region: Region) {
        *self.region.lock() = Some(region);
    }

    /// One renewal; false once the lease is found taken (the renewals stop).
    fn renew(&self) -> bool {
        let word = self.word.load(Ordering::Acquire);
        let Some(region) = *self.region.lock() else {
            return true;
        };
        let Some(mem) = self.mem.upgrade() else {
            return false;
        };
        let c = mem.post(&[
            Verb::FetchAdd {
                region: region.id,
                offset: BEAT_AT,
                add: 1,
            },
            Verb::Read {
                region: region.id,
                offset: OWNER_AT,
                len: 8,
            },
        ]);
        match c.map(|c| c.into_iter().nth(1).map(|c| c.into_data())) {
            Ok(Some(Ok(b))) => {
                let w = u64::from_le_bytes(b[..8].try_into().expect("8 bytes"));
                if w != word {
                    return false;
                }
                true
            }
            // The node does not answer, or the region moved: try again.
            _ => true,
        }
    }

    /// A thread raising the beat every `every` while the node lives and
    /// holds the lease (it stops once it finds the lease taken).
    fn start_renewals(self: &Arc<Self>, every: Duration) {
        if self.renewing.swap(true, Ordering::AcqRel) {
            return;
        }
        let me = Arc::clone(self);
        let spawned = std::thread::Builder::new()
            .name("d-hnsw-lease".into())
            .spawn(move || loop {
                std::thread::sleep(every);
                if me.stop.load(Ordering::Acquire) || !me.renew() {
                    me.renewing.store(false, Ordering::Release);
                    return;
                }
            });
        if spawned.is_err() {
            self.renewing.store(false, Ordering::Release);
        }
    }
}

impl DHnsw {
    /// The owner word and name a region's header holds.
    pub(crate) fn read_owner(&self, region: Region) -> Result<(u64, u64, String)> {
        let b = self.mem.read(
            region,
            OWNER_AT,
            (OWNER_NAME_AT + 1 + OWNER_NAME_MAX - OWNER_AT) as u32,
        )?;
        let word = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        let owner = word(0);
        let beat = word((BEAT_AT - OWNER_AT) as usize);
        let at = (OWNER_NAME_AT - OWNER_AT) as usize;
        let n = usize::from(b[at]).min(OWNER_NAME_MAX as usize);
        let name = String::from_utf8_lossy(&b[at + 1..at + 1 + n]).into_owned();
        Ok((owner, beat, name))
    }

    /// Takes `lay`'s region's lease for this node's `lease` owner (nothing
    /// without one): free, or this owner's (a reopen: the next epoch at
    /// once), or another's whose beat stood still for the take-over time.
    /// A lease another owner renews meanwhile is an error naming it.
    /// A lease taken from a holder (this owner's earlier epoch, or another
    /// owner gone quiet) comes with the region put right: the holder was
    /// its only writer and will not finish what it left held.
    pub(crate) fn take_lease(&self, lay: &mut Layout) -> Result<()> {
        let Some(name) = self.params.lease.clone() else {
            return Ok(());
        };
        let expiry = self.lease();
        loop {
            let (w, beat, holder) = self.read_owner(lay.region)?;
            let mine = owner_word(&name, 1);
            let next = if w == 0 {
                mine
            } else if same_owner(w, mine) {
                owner_word(&name, (w & EPOCH_BITS) + 1)
            } else {
                // Another owner's: broken only once its beat stood still
                // for the whole take-over time.
                let began = Instant::now();
                loop {
                    std::thread::sleep((expiry / 20).max(Duration::from_millis(1)));
                    let (w2, beat2, _) = self.read_owner(lay.region)?;
                    if w2 != w || beat2 != beat {
                        return Err(Error::invalid(format!(
                            "d-hnsw: region {:?} is leased to {holder:?} (epoch {}), which renewed it within the last {:.1} s: one database at a time writes a region; it may be taken after {:.1} s without renewal",
                            lay.name,
                            w & EPOCH_BITS,
                            began.elapsed().as_secs_f64(),
                            expiry.as_secs_f64()
                        )));
                    }
                    if began.elapsed() > expiry {
                        break;
                    }
                }
                (mine & !EPOCH_BITS) | (((w & EPOCH_BITS) + 1) & EPOCH_BITS).max(1)
            };
            if cas_flushed(
                &*self.mem,
                lay.region,
                OWNER_AT,
                w,
                next,
                crate::sites::LEASE,
            )? != w
            {
                continue;
            }
            self.write_owner_name(lay.region, &name)?;
            self.leased.word.store(next, Ordering::Release);
            self.leased.on_region(lay.region);
            self.leased
                .start_renewals(Duration::from_millis(self.params.timeout_ms.max(1)));
            if w != 0 {
                self.recover_orphans(lay)?;
            }
            return Ok(());
        }
    }

    fn write_owner_name(&self, region: Region, name: &str) -> Result<()> {
        let n = name.len().min(OWNER_NAME_MAX as usize);
        let mut b = vec![n as u8];
        b.extend_from_slice(&name.as_bytes()[..n]);
        b.resize(1 + OWNER_NAME_MAX as usize, 0);
        crate::fetch::post_unflushed(&*self.mem, region, vec![(OWNER_NAME_AT, b)])
    }

    /// Whether this node may repair `lay`'s region (`maintain`): it may
    /// write it (the lease's holder, or no lease on either side).
    pub(crate) fn may_repair(&self, lay: &Layout) -> Result<bool> {
        let b = self.mem.read(lay.region, OWNER_AT, 8)?;
        let owner = u64::from_le_bytes(b[..8].try_into().expect("8 bytes"));
        Ok(owner == self.leased.word.load(Ordering::Acquire))
    }

    /// Whether this node may write a region whose owner word is `owner`
    /// (read in the doorbell that took a lock): its own lease, or no lease
    /// when it holds none. The error names the holder.
    pub(crate) fn may_write(&self, region: Region, owner: u64) -> Result<()> {
        let mine = self.leased.word.load(Ordering::Acquire);
        if owner == mine {
            return Ok(());
        }
        let (_, _, holder) = self.read_owner(region).unwrap_or_default();
        Err(Error::invalid(if mine == 0 {
            format!(
                "d-hnsw: the region is leased to {holder:?}: only its holder writes it (a compute node that is not may search it)"
            )
        } else {
            format!(
                "d-hnsw: this compute node's lease on the region was taken by {holder:?} (after it went unrenewed past the take-over time): it writes nothing more"
            )
        }))
    }
}
