//! The in-process transport (a memory node inside the compute node's
//! process: tests, the demo, `memnode = file:PATH`): the same frames as TCP
//! (encoded, decoded, counted), handed to a [`Regions`] in this process.
//! Every figure of record goes through [`crate::TcpMemory`] instead.

use crate::client::{Exchange, Remote};
use crate::frame::Request;
use crate::model::{Counters, NetModel};
use crate::node::serve;
use crate::regions::Regions;
use std::sync::Arc;
use vectide_core::Result;

/// Hands frames to a [`Regions`] in this process.
pub struct Local(Arc<Regions>);

impl Exchange for Local {
    fn exchange(&self, sent: &Request, frame: &[u8]) -> Result<Vec<u8>> {
        // The frame decoded (as a node over TCP decodes it), then the
        // request served as sent: the same but for the FLUSH sites, which
        // the wire does not carry and the crash simulator counts here.
        let reply = match Request::decode(&frame[4..]) {
            Ok(_) => serve(&self.0, sent.clone()),
            Err(e) => crate::frame::Reply::error(crate::frame::ErrorCode::Malformed, e.to_string()),
        };
        Ok(reply.encode()[4..].to_vec())
    }
    fn boot(&self) -> Option<u64> {
        Some(self.0.boot())
    }
}

/// [`crate::RemoteMemory`] on regions in this process.
pub type LocalMemory = Remote<Local>;

impl LocalMemory {
    /// A transport to `regions` (shared with other transports, as compute
    /// nodes share a memory node).
    pub fn local(regions: Arc<Regions>, model: NetModel) -> LocalMemory {
        Remote::new(Local(regions), Counters::new(model)).expect("the same version")
    }
}
