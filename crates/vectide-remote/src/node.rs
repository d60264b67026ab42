//! The memory node: serves the verbs on its [`Regions`] over TCP, one
//! thread per connection, within bounds (connections, frame size, work
//! requests per doorbell, an idle and a per-frame timeout). It never parses
//! what a region holds.

use crate::frame::{body_len, ErrorCode, Reply, Request, MAX_REQUEST, VERSION};
use crate::regions::Regions;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;
use vectide_core::{Error, Result};

/// Answers one request.
pub fn serve(regions: &Regions, req: Request) -> Reply {
    let r = match req {
        Request::Hello { version } if version != VERSION => {
            return Reply::error(
                ErrorCode::Version,
                format!("protocol version {version}; this memory node speaks version {VERSION}"),
            )
        }
        Request::Hello { .. } => Ok(Reply::Hello {
            version: VERSION,
            boot: regions.boot(),
        }),
        Request::Create { name, size } => regions.create(&name, size).map(|r| Reply::Region {
            id: r.id,
            size: r.size,
        }),
        Request::Open { name } => regions.open(&name).map(|r| Reply::Region {
            id: r.id,
            size: r.size,
        }),
        Request::Drop { name } => regions.drop_region(&name).map(|()| Reply::Dropped),
        Request::List => Ok(Reply::List {
            size: regions.size(),
            regions: regions.list(),
        }),
        Request::Post(wrs) => Ok(Reply::Posted(regions.execute(&wrs))),
    };
    r.unwrap_or_else(|e| Reply::error(ErrorCode::Invalid, e.to_string()))
}

/// A memory node's bounds besides its size.
#[derive(Debug, Clone, Copy)]
pub struct NodeLimits {
    /// Connections served at once; more are answered with an error and
    /// closed.
    pub max_connections: usize,
    /// A connection idle this long between frames is closed.
    pub idle_timeout: Duration,
    /// A frame must arrive whole within this once it has begun.
    pub frame_timeout: Duration,
}

impl Default for NodeLimits {
    fn default() -> Self {
        NodeLimits {
            max_connections: 64,
            idle_timeout: Duration::from_secs(600),
            frame_timeout: Duration::from_secs(10),
        }
    }
}

/// A running memory node (see the module docs); stopped on drop.
pub struct MemoryNode {
    addr: SocketAddr,
    regions: Arc<Regions>,
    stop: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
}

impl MemoryNode {
    /// Listens on `listen` (say `127.0.0.1:0` for a free port) and serves
    /// regions within `size` bytes from a thread of its own.
    pub fn start(listen: &str, size: u64, limits: NodeLimits) -> Result<MemoryNode> {
        MemoryNode::serve(listen, Arc::new(Regions::new(size)), limits)
    }

    /// Listens on `listen` and serves `regions` (in the heap or in a
    /// backing file) from a thread of its own.
    pub fn serve(listen: &str, regions: Arc<Regions>, limits: NodeLimits) -> Result<MemoryNode> {
        let listener = TcpListener::bind(listen)
            .map_err(|e| Error::invalid(format!("memory node: cannot listen on {listen}: {e}")))?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let accept = {
            let (regions, stop) = (Arc::clone(&regions), Arc::clone(&stop));
            std::thread::Builder::new()
                .name("memnode-accept".into())
                .spawn(move || accept_loop(listener, regions, stop, limits))?
        };
        Ok(MemoryNode {
            addr,
            regions,
            stop,
            accept: Some(accept),
        })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its regions (in this process).
    pub fn regions(&self) -> &Arc<Regions> {
        &self.regions
    }

    /// Serves until the process ends.
    pub fn wait(mut self) {
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
    }
}

impl Drop for MemoryNode {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Wakes the accept loop.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
    }
}

fn accept_loop(
    listener: TcpListener,
    regions: Arc<Regions>,
    stop: Arc<AtomicBool>,
    limits: NodeLimits,
) {
    let open = Arc::new(AtomicUsize::new(0));
    for conn in listener.incoming() {
        if stop.load(Ordering::Acquire) {
            break;
        }
        let Ok(mut stream) = conn else { continue };
        if open.load(Ordering::Acquire) >= limits.max_connections {
            let msg = format!(
                "the memory node serves {} connections at most",
                limits.max_connections
            );
            let _ = stream.set_write_timeout(Some(limits.frame_timeout));
            let _ = stream.write_all(&Reply::error(ErrorCode::Limit, msg).encode());
            continue;
        }
        open.fetch_add(1, Ordering::AcqRel);
        let (regions, served, stop) = (Arc::clone(&regions), Arc::clone(&open), Arc::clone(&stop));
        let spawned = std::thread::Builder::new()
            .name("memnode-conn".into())
            .spawn(move || {
                let _ = connection(stream, &regions, &stop, limits);
                served.fetch_sub(1, Ordering::AcqRel);
            });
        if spawned.is_err() {
            // The thread never ran (its stream closed with the closure):
            // give its place back.
            open.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// Serves one connection until it closes, errs, idles out or the node
/// stops. Its first request must be a HELLO of this version.
fn connection(
    mut s: TcpStream,
    regions: &Regions,
    stop: &AtomicBool,
    limits: NodeLimits,
) -> std::io::Result<()> {
    s.set_nodelay(true)?;
    s.set_write_timeout(Some(limits.frame_timeout))?;
    let mut greeted = false;
    let mut body = Vec::new();
    loop {
        s.set_read_timeout(Some(limits.idle_timeout))?;
        let mut prefix = [0u8; 4];
        s.read_exact(&mut prefix)?;
        if stop.load(Ordering::Acquire) {
            return Ok(());
        }
        s.set_read_timeout(Some(limits.frame_timeout))?;
        let n = match body_len(prefix, MAX_REQUEST) {
            Ok(n) => n,
            Err(e) => {
                // The frame cannot be skipped safely: answer and close.
                s.write_all(&Reply::error(ErrorCode::Limit, e.to_string()).encode())?;
                return Ok(());
            }
        };
        body.clear();
        body.resize(n, 0);
        s.read_exact(&mut body)?;
        let reply = match Request::decode(&body) {
            Err(e) => Reply::error(ErrorCode::Malformed, e.to_string()),
            Ok(req @ Request::Hello { .. }) => {
                let r = serve(regions, req);
                greeted = matches!(r, Reply::Hello { .. });
                r
            }
            Ok(_) if !greeted => {
                Reply::error(ErrorCode::Malformed, "the first request must be a HELLO")
            }
            Ok(req) => serve(regions, req),
        };
        s.write_all(&reply.encode())?;
        if !greeted {
            // A connection of another version or that skipped the HELLO.
            return Ok(());
        }
    }
}
