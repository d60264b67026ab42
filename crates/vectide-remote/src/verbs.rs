//! Work requests (one-sided verbs) and their completions.

use vectide_core::{Error, Result};
use vectide_storage::Site;

/// An open region: its id on the node (valid while the node runs and the
/// region is not dropped) and its size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Region {
    pub id: u32,
    pub size: u64,
}

/// A region as the node lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionInfo {
    pub name: String,
    pub id: u32,
    pub size: u64,
}

/// One work request of a doorbell chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verb {
    /// Reads `len` bytes at `offset`.
    Read { region: u32, offset: u64, len: u32 },
    /// Writes `bytes` at `offset`.
    Write {
        region: u32,
        offset: u64,
        bytes: Vec<u8>,
    },
    /// Compare-and-swap of the 8-byte-aligned little-endian word at `offset`.
    Cas {
        region: u32,
        offset: u64,
        expect: u64,
        new: u64,
    },
    /// Fetch-and-add (wrapping) on the 8-byte-aligned little-endian word at
    /// `offset`.
    FetchAdd { region: u32, offset: u64, add: u64 },
    /// Makes `len` bytes at `offset` durable on a node with a backing file
    /// before it completes (RDMA's FLUSH to persistent memory); on a node
    /// without one it completes at once. `site` names the caller's
    /// persistence call for the crash simulator when the node runs in the
    /// caller's process (its mutation check switches sites off one at a
    /// time); it is not sent over the network, where a node records its
    /// own site, [`crate::backing::SITE_FLUSH`].
    Flush {
        region: u32,
        offset: u64,
        len: u64,
        site: Site,
    },
}

impl Verb {
    /// The verb's name, for messages.
    pub fn name(&self) -> &'static str {
        match self {
            Verb::Read { .. } => "READ",
            Verb::Write { .. } => "WRITE",
            Verb::Cas { .. } => "CAS",
            Verb::FetchAdd { .. } => "FETCH_ADD",
            Verb::Flush { .. } => "FLUSH",
        }
    }
}

/// Why a work request did not run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// It ran.
    Ok = 0,
    /// No region has this id.
    UnknownRegion = 1,
    /// `offset + len` is past the region's end.
    OutOfBounds = 2,
    /// An atomic verb's offset is not a multiple of 8.
    Unaligned = 3,
    /// A request before it in the chain failed, so it did not run.
    Flushed = 4,
}

impl Status {
    pub fn from_code(c: u8) -> Option<Status> {
        Some(match c {
            0 => Status::Ok,
            1 => Status::UnknownRegion,
            2 => Status::OutOfBounds,
            3 => Status::Unaligned,
            4 => Status::Flushed,
            _ => return None,
        })
    }
    pub fn describe(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::UnknownRegion => "no region has this id",
            Status::OutOfBounds => "offset + length is past the region's end",
            Status::Unaligned => "an atomic verb's offset is not a multiple of 8",
            Status::Flushed => "not run: a request before it in the chain failed",
        }
    }
}

/// The completion of one work request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Completion {
    /// A READ's bytes.
    Data(Vec<u8>),
    /// A WRITE done.
    Done,
    /// The word a CAS or FETCH_ADD found.
    Word(u64),
    /// The request failed or did not run.
    Failed(Status),
}

/// Whether `e` is a work request's failure on a region the memory node no
/// longer has (dropped: a compute node may find where it went and retry).
pub fn is_unknown_region(e: &Error) -> bool {
    matches!(e, Error::InvalidInput(m) if *m == format!("remote memory: {}", Status::UnknownRegion.describe()))
}

impl Completion {
    fn fail(self, want: &str) -> Error {
        match self {
            Completion::Failed(s) => Error::invalid(format!("remote memory: {}", s.describe())),
            other => Error::corrupted(format!(
                "remote memory: a completion of the wrong kind ({other:?}), {want} expected"
            )),
        }
    }
    /// A READ's bytes, or the failure as an error.
    pub fn into_data(self) -> Result<Vec<u8>> {
        match self {
            Completion::Data(d) => Ok(d),
            c => Err(c.fail("data")),
        }
    }
    /// A WRITE's success, or the failure as an error.
    pub fn into_done(self) -> Result<()> {
        match self {
            Completion::Done => Ok(()),
            c => Err(c.fail("done")),
        }
    }
    /// An atomic's old word, or the failure as an error.
    pub fn into_word(self) -> Result<u64> {
        match self {
            Completion::Word(w) => Ok(w),
            c => Err(c.fail("a word")),
        }
    }
}
