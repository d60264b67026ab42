//! The compute node's side of the protocol, over any [`Exchange`] (a way
//! to send one request frame and get one reply frame back): counts every
//! round trip and turns replies into results.

use crate::frame::{ErrorCode, Reply, Request, VERSION};
use crate::model::Counters;
use crate::verbs::{Completion, Region, RegionInfo, Verb};
use crate::{NodeSize, RemoteMemory};
use std::time::Instant;
use vectide_core::{Error, Result};

/// Sends one request frame and returns the reply frame's body.
pub trait Exchange: Send + Sync {
    /// `frame` is `req` encoded; a transport sends the frame (the request
    /// is there for one that can use what the wire does not carry, a
    /// FLUSH's site).
    fn exchange(&self, req: &Request, frame: &[u8]) -> Result<Vec<u8>>;
    /// The boot number the node greeted the newest connection with
    /// (`None`: the exchange greets once, in [`Remote::new`]).
    fn boot(&self) -> Option<u64> {
        None
    }
}

/// A [`RemoteMemory`] over an [`Exchange`].
pub struct Remote<X: Exchange> {
    pub(crate) x: X,
    pub(crate) counters: Counters,
    /// The boot number of the first greeting.
    boot: u64,
}

impl<X: Exchange> Remote<X> {
    /// Wraps `x`, checking the node's protocol version (a HELLO).
    pub(crate) fn new(x: X, counters: Counters) -> Result<Remote<X>> {
        let mut r = Remote {
            x,
            counters,
            boot: 0,
        };
        match r.call(&Request::Hello { version: VERSION }, 0)? {
            Reply::Hello { version, boot } if version == VERSION => {
                r.boot = boot;
                Ok(r)
            }
            other => Err(unexpected(other)),
        }
    }

    /// One round trip, counted.
    fn call(&self, req: &Request, wrs: u64) -> Result<Reply> {
        let frame = req.encode();
        let t0 = Instant::now();
        let body = self.x.exchange(req, &frame)?;
        self.counters
            .record(wrs, frame.len() as u64, body.len() as u64 + 4, t0.elapsed());
        match Reply::decode(&body)? {
            Reply::Error { code, message } => Err(node_error(code, message)),
            r => Ok(r),
        }
    }
}

/// A node's error reply as the core error: its limits are transient.
pub(crate) fn node_error(code: u8, message: String) -> Error {
    let m = format!("memory node: {message}");
    match code {
        c if c == ErrorCode::Version as u8 => Error::invalid(m),
        c if c == ErrorCode::Malformed as u8 => Error::corrupted(m),
        c if c == ErrorCode::Limit as u8 => Error::unavailable(m),
        _ => Error::invalid(m),
    }
}

fn unexpected(r: Reply) -> Error {
    Error::corrupted(format!("memory node: an unexpected reply {r:?}"))
}

impl<X: Exchange> RemoteMemory for Remote<X> {
    fn create_region(&self, name: &str, size: u64) -> Result<Region> {
        match self.call(
            &Request::Create {
                name: name.into(),
                size,
            },
            0,
        )? {
            Reply::Region { id, size } => Ok(Region { id, size }),
            r => Err(unexpected(r)),
        }
    }

    fn open_region(&self, name: &str) -> Result<Region> {
        match self.call(&Request::Open { name: name.into() }, 0)? {
            Reply::Region { id, size } => Ok(Region { id, size }),
            r => Err(unexpected(r)),
        }
    }

    fn drop_region(&self, name: &str) -> Result<()> {
        match self.call(&Request::Drop { name: name.into() }, 0)? {
            Reply::Dropped => Ok(()),
            r => Err(unexpected(r)),
        }
    }

    fn regions(&self) -> Result<(Vec<RegionInfo>, NodeSize)> {
        match self.call(&Request::List, 0)? {
            Reply::List { size, regions } => Ok((regions, size)),
            r => Err(unexpected(r)),
        }
    }

    fn post(&self, wrs: &[Verb]) -> Result<Vec<Completion>> {
        if wrs.is_empty() {
            return Ok(Vec::new());
        }
        if wrs.len() > crate::frame::MAX_WRS {
            return Err(Error::invalid(format!(
                "a doorbell of {} work requests (at most {})",
                wrs.len(),
                crate::frame::MAX_WRS
            )));
        }
        match self.call(&Request::Post(wrs.to_vec()), wrs.len() as u64)? {
            Reply::Posted(cs) if cs.len() == wrs.len() => Ok(cs),
            r => Err(unexpected(r)),
        }
    }

    fn counters(&self) -> &Counters {
        &self.counters
    }

    fn boot(&self) -> u64 {
        self.x.boot().unwrap_or(self.boot)
    }
}
