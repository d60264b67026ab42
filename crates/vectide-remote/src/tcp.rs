//! The TCP transport: each doorbell is one request frame and one reply
//! frame on a connection taken from a small pool (threads post at once on
//! connections of their own). A node that does not answer within the
//! timeout, or a broken connection, is [`Error::Unavailable`]; the
//! connection is then dropped, never reused mid-frame.

use crate::client::{Exchange, Remote};
use crate::frame::{body_len, Reply, Request, MAX_REPLY, VERSION};
use crate::model::{Counters, NetModel};
use parking_lot::Mutex;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::Duration;
use vectide_core::{Error, Result};

/// How a compute node talks to a memory node.
#[derive(Debug, Clone, Copy)]
pub struct TcpOptions {
    /// Connect, send and reply timeout (10 s by default).
    pub timeout: Duration,
    /// The network model of the counters.
    pub model: NetModel,
}

impl Default for TcpOptions {
    fn default() -> Self {
        TcpOptions {
            timeout: Duration::from_secs(10),
            model: NetModel::default(),
        }
    }
}

/// Frames over pooled TCP connections.
pub struct Tcp {
    addr: SocketAddr,
    timeout: Duration,
    pool: Mutex<Vec<TcpStream>>,
    /// The boot number of the newest greeting.
    boot: std::sync::atomic::AtomicU64,
}

fn unavailable(addr: SocketAddr, e: std::io::Error) -> Error {
    use std::io::ErrorKind as K;
    match e.kind() {
        K::WouldBlock | K::TimedOut => {
            Error::unavailable(format!("memory node {addr} did not answer in time"))
        }
        _ => Error::unavailable(format!("memory node {addr}: {e}")),
    }
}

impl Tcp {
    /// A new connection, greeted (the HELLO of connection setup is not
    /// counted: an RDMA queue pair is set up once as well).
    fn open(&self) -> Result<TcpStream> {
        let s = TcpStream::connect_timeout(&self.addr, self.timeout)
            .map_err(|e| unavailable(self.addr, e))?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(self.timeout))?;
        s.set_write_timeout(Some(self.timeout))?;
        let mut s = s;
        let body = self.round_trip(&mut s, &Request::Hello { version: VERSION }.encode())?;
        match Reply::decode(&body)? {
            Reply::Hello { version, boot } if version == VERSION => {
                // The newest boot seen (two greetings around a restart may
                // land in either order).
                self.boot
                    .fetch_max(boot, std::sync::atomic::Ordering::AcqRel);
                Ok(s)
            }
            Reply::Error { code, message } => Err(crate::client::node_error(
                code,
                format!("{}: {message}", self.addr),
            )),
            r => Err(Error::corrupted(format!(
                "memory node {}: an unexpected reply {r:?}",
                self.addr
            ))),
        }
    }

    fn round_trip(&self, s: &mut TcpStream, frame: &[u8]) -> Result<Vec<u8>> {
        s.write_all(frame).map_err(|e| unavailable(self.addr, e))?;
        let mut prefix = [0u8; 4];
        s.read_exact(&mut prefix)
            .map_err(|e| unavailable(self.addr, e))?;
        let n = body_len(prefix, MAX_REPLY)?;
        let mut body = vec![0u8; n];
        s.read_exact(&mut body)
            .map_err(|e| unavailable(self.addr, e))?;
        Ok(body)
    }
}

impl Exchange for Tcp {
    fn exchange(&self, _: &Request, frame: &[u8]) -> Result<Vec<u8>> {
        let pooled = self.pool.lock().pop();
        let mut s = match pooled {
            Some(s) => s,
            None => self.open()?,
        };
        // On any error the connection is dropped (it may be mid-frame).
        let body = self.round_trip(&mut s, frame)?;
        self.pool.lock().push(s);
        Ok(body)
    }
    fn boot(&self) -> Option<u64> {
        Some(self.boot.load(std::sync::atomic::Ordering::Acquire))
    }
}

/// [`crate::RemoteMemory`] over TCP.
pub type TcpMemory = Remote<Tcp>;

impl TcpMemory {
    /// Connects to the memory node at `addr` (`host:port`).
    pub fn connect(addr: &str, opts: TcpOptions) -> Result<TcpMemory> {
        let sa = addr
            .to_socket_addrs()
            .map_err(|e| Error::invalid(format!("memory node address {addr:?}: {e}")))?
            .next()
            .ok_or_else(|| Error::invalid(format!("memory node address {addr:?} names no host")))?;
        let tcp = Tcp {
            addr: sa,
            timeout: opts.timeout,
            pool: Mutex::new(Vec::new()),
            boot: std::sync::atomic::AtomicU64::new(0),
        };
        Remote::new(tcp, Counters::new(opts.model))
    }
}
