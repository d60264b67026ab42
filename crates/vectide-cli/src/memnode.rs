//! `vectide memnode`: a memory node for d-HNSW (`vectide-remote`), serving
//! named regions within `--size` bytes until the process ends; with
//! `--backing FILE` the regions live in that file and a restart on it
//! serves them again.

use clap::Args;
use std::sync::Arc;
use std::time::Duration;
use vectide_core::{Error, Result};
use vectide_remote::backing::Backing;
use vectide_remote::{MemoryNode, NodeLimits, Regions};
use vectide_storage::region::PersistMode;

#[derive(Args)]
pub struct MemnodeArgs {
    /// Address to listen on; loopback unless told otherwise.
    #[arg(long, default_value = "127.0.0.1:7700")]
    listen: String,
    /// Bytes the node may hand out to regions (suffixes K, M, G, T: powers
    /// of 1024).
    #[arg(long, value_parser = parse_size)]
    size: u64,
    /// Connections served at once.
    #[arg(long, default_value_t = 64)]
    max_connections: usize,
    /// Seconds a connection may idle between frames before it is closed.
    #[arg(long, default_value_t = 600)]
    idle_timeout: u64,
    /// Keep the regions in this file (created if absent; on restart its
    /// regions are served again, each range as of its last FLUSH at least;
    /// docs/format-memnode-backing.md). Without it they live in memory.
    #[arg(long)]
    backing: Option<std::path::PathBuf>,
    /// How the backing file is made durable: msync (disks) or pmem
    /// (cache-line write-back on a DAX or /dev/shm file).
    #[arg(long, default_value = "msync", requires = "backing")]
    persist: String,
}

/// `123`, `64K`, `512M`, `4G`, `1T` → bytes.
pub fn parse_size(s: &str) -> std::result::Result<u64, String> {
    let t = s.trim();
    let (num, shift) = match t.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&t[..t.len() - 1], 10),
        Some('M') => (&t[..t.len() - 1], 20),
        Some('G') => (&t[..t.len() - 1], 30),
        Some('T') => (&t[..t.len() - 1], 40),
        _ => (t, 0),
    };
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a size (bytes, or a number with K, M, G or T)"))?;
    let bytes = n
        .checked_mul(1u64 << shift)
        .ok_or_else(|| format!("{s:?} is beyond 2**64 bytes"))?;
    if bytes == 0 {
        return Err("the size must be at least 1 byte".into());
    }
    Ok(bytes)
}

pub fn run(args: &MemnodeArgs) -> Result<()> {
    if args.max_connections == 0 || args.idle_timeout == 0 {
        return Err(Error::invalid(
            "--max-connections and --idle-timeout must be at least 1",
        ));
    }
    let limits = NodeLimits {
        max_connections: args.max_connections,
        idle_timeout: Duration::from_secs(args.idle_timeout),
        ..NodeLimits::default()
    };
    let (regions, kept) = match &args.backing {
        None => (Regions::new(args.size), String::new()),
        Some(path) => {
            let media = vectide_storage::media::for_mode(PersistMode::parse(&args.persist)?);
            let (b, restored) = Backing::open_or_create(path, media)?;
            let n = restored.slots.len();
            let r = Regions::backed(args.size, b, restored)?;
            (
                r,
                format!(", backing {} ({n} regions kept)", path.display()),
            )
        }
    };
    let node = MemoryNode::serve(&args.listen, Arc::new(regions), limits)?;
    // The address on stdout first, so that a parent that asked for port 0
    // learns the port.
    println!(
        "memnode listening on {} with {} bytes{kept}",
        node.addr(),
        args.size
    );
    use std::io::Write as _;
    let _ = std::io::stdout().flush();
    node.wait();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes_parse_with_suffixes_and_refuse_the_rest() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64k"), Ok(64 << 10));
        assert_eq!(parse_size("2G"), Ok(2 << 30));
        for bad in ["", "G", "-1", "1.5G", "0", "99999999999T", "12X"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }
}
