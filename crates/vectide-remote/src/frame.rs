//! The memory node's wire codec (`docs/protocol-memnode.md`): requests and
//! replies, each one length-prefixed frame. Every decoder reads through the
//! one bounds-checked reader ([`ByteReader`]); counts are bounded by the
//! bytes left before anything is reserved.

use crate::verbs::{Completion, RegionInfo, Status, Verb};
use crate::NodeSize;
use vectide_core::io::ByteReader;
use vectide_core::{Error, Result};

/// The HELLO's magic.
pub const MAGIC: &[u8; 8] = b"VTDXMEM\0";
/// The protocol version (2 added FLUSH).
pub const VERSION: u32 = 3;
/// Largest request frame body (a doorbell of WRITEs): 64 MiB.
pub const MAX_REQUEST: usize = 64 << 20;
/// Largest reply frame body, and so the most bytes a doorbell's READs may
/// ask for in all: 256 MiB.
pub const MAX_REPLY: usize = 256 << 20;
/// Most work requests in one doorbell.
pub const MAX_WRS: usize = 4096;

const HELLO: u8 = 1;
const CREATE: u8 = 2;
const OPEN: u8 = 3;
const DROP: u8 = 4;
const LIST: u8 = 5;
const POST: u8 = 6;

const OP_READ: u8 = 1;
const OP_WRITE: u8 = 2;
const OP_CAS: u8 = 3;
const OP_FETCH_ADD: u8 = 4;
const OP_FLUSH: u8 = 5;

const C_DATA: u8 = 0;
const C_DONE: u8 = 1;
const C_WORD: u8 = 2;
const C_FAILED: u8 = 3;

/// A request's kinds of failure, as the reply names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    /// A well-formed request the node refuses (unknown region name, a
    /// region that does not fit...).
    Invalid = 1,
    /// A frame the node cannot parse.
    Malformed = 2,
    /// A HELLO of another protocol version.
    Version = 3,
    /// The node's limits (connections, frame size).
    Limit = 4,
}

/// A request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    Hello { version: u32 },
    Create { name: String, size: u64 },
    Open { name: String },
    Drop { name: String },
    List,
    Post(Vec<Verb>),
}

/// A reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    Error {
        code: u8,
        message: String,
    },
    Hello {
        version: u32,
        /// The node's boot number (see [`crate::RemoteMemory::boot`]).
        boot: u64,
    },
    Region {
        id: u32,
        size: u64,
    },
    Dropped,
    List {
        size: NodeSize,
        regions: Vec<RegionInfo>,
    },
    Posted(Vec<Completion>),
}

fn put_name(out: &mut Vec<u8>, name: &str) {
    // Names are checked to be 1..=255 bytes by the node; a longer one is
    // cut here and refused there.
    let b = &name.as_bytes()[..name.len().min(255)];
    out.push(b.len() as u8);
    out.extend_from_slice(b);
}

fn get_name(r: &mut ByteReader<'_>) -> Result<String> {
    let n = r.u8()? as usize;
    String::from_utf8(r.bytes(n)?.to_vec())
        .map_err(|_| Error::corrupted("a region name is not UTF-8"))
}

fn frame(body: Vec<u8>) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len() + 4);
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&body);
    out
}

impl Request {
    /// The whole frame (length prefix included).
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::new();
        match self {
            Request::Hello { version } => {
                b.push(HELLO);
                b.extend_from_slice(MAGIC);
                b.extend_from_slice(&version.to_le_bytes());
            }
            Request::Create { name, size } => {
                b.push(CREATE);
                put_name(&mut b, name);
                b.extend_from_slice(&size.to_le_bytes());
            }
            Request::Open { name } => {
                b.push(OPEN);
                put_name(&mut b, name);
            }
            Request::Drop { name } => {
                b.push(DROP);
                put_name(&mut b, name);
            }
            Request::List => b.push(LIST),
            Request::Post(wrs) => {
                let bytes: usize = wrs
                    .iter()
                    .map(|w| match w {
                        Verb::Write { bytes, .. } => 17 + bytes.len(),
                        _ => 29,
                    })
                    .sum();
                b.reserve(5 + bytes);
                b.push(POST);
                b.extend_from_slice(&(wrs.len() as u32).to_le_bytes());
                for w in wrs {
                    match w {
                        Verb::Read {
                            region,
                            offset,
                            len,
                        } => {
                            b.push(OP_READ);
                            b.extend_from_slice(&region.to_le_bytes());
                            b.extend_from_slice(&offset.to_le_bytes());
                            b.extend_from_slice(&len.to_le_bytes());
                        }
                        Verb::Write {
                            region,
                            offset,
                            bytes,
                        } => {
                            b.push(OP_WRITE);
                            b.extend_from_slice(&region.to_le_bytes());
                            b.extend_from_slice(&offset.to_le_bytes());
                            b.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
                            b.extend_from_slice(bytes);
                        }
                        Verb::Cas {
                            region,
                            offset,
                            expect,
                            new,
                        } => {
                            b.push(OP_CAS);
                            b.extend_from_slice(&region.to_le_bytes());
                            b.extend_from_slice(&offset.to_le_bytes());
                            b.extend_from_slice(&expect.to_le_bytes());
                            b.extend_from_slice(&new.to_le_bytes());
                        }
                        Verb::FetchAdd {
                            region,
                            offset,
                            add,
                        } => {
                            b.push(OP_FETCH_ADD);
                            b.extend_from_slice(&region.to_le_bytes());
                            b.extend_from_slice(&offset.to_le_bytes());
                            b.extend_from_slice(&add.to_le_bytes());
                        }
                        Verb::Flush {
                            region,
                            offset,
                            len,
                            ..
                        } => {
                            b.push(OP_FLUSH);
                            b.extend_from_slice(&region.to_le_bytes());
                            b.extend_from_slice(&offset.to_le_bytes());
                            b.extend_from_slice(&len.to_le_bytes());
                        }
                    }
                }
            }
        }
        frame(b)
    }

    /// Parses a request frame's body (after the length prefix). A HELLO of
    /// another version parses (the node answers it with a version error).
    pub fn decode(body: &[u8]) -> Result<Request> {
        if body.len() > MAX_REQUEST {
            return Err(Error::corrupted(format!(
                "a request of {} bytes (at most {MAX_REQUEST})",
                body.len()
            )));
        }
        let mut r = ByteReader::new(body);
        let req = match r.u8()? {
            HELLO => {
                if r.bytes(MAGIC.len())? != MAGIC {
                    return Err(Error::corrupted(
                        "not a Vectide memory-node HELLO (bad magic)",
                    ));
                }
                Request::Hello { version: r.u32()? }
            }
            CREATE => Request::Create {
                name: get_name(&mut r)?,
                size: r.u64()?,
            },
            OPEN => Request::Open {
                name: get_name(&mut r)?,
            },
            DROP => Request::Drop {
                name: get_name(&mut r)?,
            },
            LIST => Request::List,
            POST => {
                let n = r.u32()? as usize;
                // The shortest work request is 17 bytes (a READ, a WRITE of
                // nothing): a lying count cannot reserve memory.
                if n > MAX_WRS || n > r.remaining() / 17 {
                    return Err(Error::corrupted(format!(
                        "a doorbell of {n} work requests (at most {MAX_WRS}, and what the frame holds)"
                    )));
                }
                let mut wrs = Vec::with_capacity(n);
                let mut read_bytes = 0u64;
                for _ in 0..n {
                    let op = r.u8()?;
                    let region = r.u32()?;
                    let offset = r.u64()?;
                    wrs.push(match op {
                        OP_READ => {
                            let len = r.u32()?;
                            read_bytes += u64::from(len);
                            Verb::Read {
                                region,
                                offset,
                                len,
                            }
                        }
                        OP_WRITE => {
                            let len = r.u32()? as usize;
                            Verb::Write {
                                region,
                                offset,
                                bytes: r.bytes(len)?.to_vec(),
                            }
                        }
                        OP_CAS => Verb::Cas {
                            region,
                            offset,
                            expect: r.u64()?,
                            new: r.u64()?,
                        },
                        OP_FETCH_ADD => Verb::FetchAdd {
                            region,
                            offset,
                            add: r.u64()?,
                        },
                        OP_FLUSH => Verb::Flush {
                            region,
                            offset,
                            len: r.u64()?,
                            site: crate::backing::SITE_FLUSH,
                        },
                        op => return Err(Error::corrupted(format!("unknown verb {op}"))),
                    });
                }
                // Each READ's reply carries 5 bytes besides its data.
                if read_bytes + 5 * n as u64 + 5 > MAX_REPLY as u64 {
                    return Err(Error::corrupted(format!(
                        "a doorbell reading {read_bytes} bytes (its reply may hold {MAX_REPLY})"
                    )));
                }
                Request::Post(wrs)
            }
            k => return Err(Error::corrupted(format!("unknown request kind {k}"))),
        };
        if r.remaining() != 0 {
            return Err(Error::corrupted(format!(
                "{} bytes after a request",
                r.remaining()
            )));
        }
        Ok(req)
    }
}

impl Reply {
    /// An error reply.
    pub fn error(code: ErrorCode, message: impl Into<String>) -> Reply {
        Reply::Error {
            code: code as u8,
            message: message.into(),
        }
    }

    /// The whole frame (length prefix included).
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::new();
        match self {
            Reply::Error { code, message } => {
                b.push(1);
                b.push(*code);
                let m = &message.as_bytes()[..message.len().min(u16::MAX as usize)];
                b.extend_from_slice(&(m.len() as u16).to_le_bytes());
                b.extend_from_slice(m);
            }
            Reply::Hello { version, boot } => {
                b.extend_from_slice(&[0, HELLO]);
                b.extend_from_slice(&version.to_le_bytes());
                b.extend_from_slice(&boot.to_le_bytes());
            }
            Reply::Region { id, size } => {
                b.extend_from_slice(&[0, CREATE]);
                b.extend_from_slice(&id.to_le_bytes());
                b.extend_from_slice(&size.to_le_bytes());
            }
            Reply::Dropped => b.extend_from_slice(&[0, DROP]),
            Reply::List { size, regions } => {
                b.extend_from_slice(&[0, LIST]);
                b.extend_from_slice(&size.capacity.to_le_bytes());
                b.extend_from_slice(&size.used.to_le_bytes());
                b.extend_from_slice(&(regions.len() as u32).to_le_bytes());
                for r in regions {
                    b.extend_from_slice(&r.id.to_le_bytes());
                    b.extend_from_slice(&r.size.to_le_bytes());
                    put_name(&mut b, &r.name);
                }
            }
            Reply::Posted(cs) => {
                let data: usize = cs
                    .iter()
                    .map(|c| match c {
                        Completion::Data(d) => 5 + d.len(),
                        _ => 9,
                    })
                    .sum();
                b.reserve(6 + data);
                b.extend_from_slice(&[0, POST]);
                b.extend_from_slice(&(cs.len() as u32).to_le_bytes());
                for c in cs {
                    match c {
                        Completion::Data(d) => {
                            b.push(C_DATA);
                            b.extend_from_slice(&(d.len() as u32).to_le_bytes());
                            b.extend_from_slice(d);
                        }
                        Completion::Done => b.push(C_DONE),
                        Completion::Word(w) => {
                            b.push(C_WORD);
                            b.extend_from_slice(&w.to_le_bytes());
                        }
                        Completion::Failed(s) => {
                            b.push(C_FAILED);
                            b.push(*s as u8);
                        }
                    }
                }
            }
        }
        frame(b)
    }

    /// Parses a reply frame's body (after the length prefix).
    pub fn decode(body: &[u8]) -> Result<Reply> {
        if body.len() > MAX_REPLY {
            return Err(Error::corrupted(format!(
                "a reply of {} bytes (at most {MAX_REPLY})",
                body.len()
            )));
        }
        let mut r = ByteReader::new(body);
        let reply = match r.u8()? {
            1 => {
                let code = r.u8()?;
                let n = u16::from_le_bytes(r.bytes(2)?.try_into().expect("2 bytes")) as usize;
                Reply::Error {
                    code,
                    message: String::from_utf8_lossy(r.bytes(n)?).into_owned(),
                }
            }
            0 => match r.u8()? {
                HELLO => Reply::Hello {
                    version: r.u32()?,
                    boot: r.u64()?,
                },
                CREATE => Reply::Region {
                    id: r.u32()?,
                    size: r.u64()?,
                },
                DROP => Reply::Dropped,
                LIST => {
                    let size = NodeSize {
                        capacity: r.u64()?,
                        used: r.u64()?,
                    };
                    let n = r.u32()? as usize;
                    if n > r.remaining() / 13 {
                        return Err(Error::corrupted(format!(
                            "a list of {n} regions beyond the frame"
                        )));
                    }
                    let mut regions = Vec::with_capacity(n);
                    for _ in 0..n {
                        let id = r.u32()?;
                        let size = r.u64()?;
                        regions.push(RegionInfo {
                            name: get_name(&mut r)?,
                            id,
                            size,
                        });
                    }
                    Reply::List { size, regions }
                }
                POST => {
                    let n = r.u32()? as usize;
                    if n > MAX_WRS || n > r.remaining() {
                        return Err(Error::corrupted(format!(
                            "{n} completions beyond the frame"
                        )));
                    }
                    let mut cs = Vec::with_capacity(n);
                    for _ in 0..n {
                        cs.push(match r.u8()? {
                            C_DATA => {
                                let len = r.u32()? as usize;
                                Completion::Data(r.bytes(len)?.to_vec())
                            }
                            C_DONE => Completion::Done,
                            C_WORD => Completion::Word(r.u64()?),
                            C_FAILED => {
                                let s = r.u8()?;
                                Completion::Failed(
                                    Status::from_code(s)
                                        .filter(|s| *s != Status::Ok)
                                        .ok_or_else(|| {
                                            Error::corrupted(format!("completion status {s}"))
                                        })?,
                                )
                            }
                            t => return Err(Error::corrupted(format!("completion kind {t}"))),
                        });
                    }
                    Reply::Posted(cs)
                }
                k => return Err(Error::corrupted(format!("unknown reply kind {k}"))),
            },
            s => return Err(Error::corrupted(format!("reply status {s}"))),
        };
        if r.remaining() != 0 {
            return Err(Error::corrupted(format!(
                "{} bytes after a reply",
                r.remaining()
            )));
        }
        Ok(reply)
    }
}

/// The length prefix of a frame: the body's size, checked against `max`.
pub fn body_len(prefix: [u8; 4], max: usize) -> Result<usize> {
    let n = u32::from_le_bytes(prefix) as usize;
    if n == 0 || n > max {
        return Err(Error::corrupted(format!(
            "a frame of {n} bytes (1..={max})"
        )));
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn verb() -> impl Strategy<Value = Verb> {
        prop_oneof![
            (any::<u32>(), any::<u64>(), 0u32..1 << 20).prop_map(|(region, offset, len)| {
                Verb::Read {
                    region,
                    offset,
                    len,
                }
            }),
            (
                any::<u32>(),
                any::<u64>(),
                proptest::collection::vec(any::<u8>(), 0..64)
            )
                .prop_map(|(region, offset, bytes)| Verb::Write {
                    region,
                    offset,
                    bytes
                }),
            (any::<u32>(), any::<u64>(), any::<u64>(), any::<u64>()).prop_map(
                |(region, offset, expect, new)| Verb::Cas {
                    region,
                    offset,
                    expect,
                    new
                }
            ),
            (any::<u32>(), any::<u64>(), any::<u64>()).prop_map(|(region, offset, add)| {
                Verb::FetchAdd {
                    region,
                    offset,
                    add,
                }
            }),
            (any::<u32>(), any::<u64>(), any::<u64>()).prop_map(|(region, offset, len)| {
                Verb::Flush {
                    region,
                    offset,
                    len,
                    site: crate::backing::SITE_FLUSH,
                }
            }),
        ]
    }

    fn request() -> impl Strategy<Value = Request> {
        prop_oneof![
            any::<u32>().prop_map(|version| Request::Hello { version }),
            ("[a-z0-9/_-]{1,40}", any::<u64>())
                .prop_map(|(name, size)| Request::Create { name, size }),
            "[a-z0-9/_-]{1,40}".prop_map(|name| Request::Open { name }),
            "[a-z0-9/_-]{1,40}".prop_map(|name| Request::Drop { name }),
            Just(Request::List),
            proptest::collection::vec(verb(), 0..20).prop_map(Request::Post),
        ]
    }

    fn completion() -> impl Strategy<Value = Completion> {
        prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..64).prop_map(Completion::Data),
            Just(Completion::Done),
            any::<u64>().prop_map(Completion::Word),
            (1u8..=4).prop_map(|s| Completion::Failed(Status::from_code(s).unwrap())),
        ]
    }

    fn reply() -> impl Strategy<Value = Reply> {
        prop_oneof![
            (1u8..=4, "[ -~]{0,60}").prop_map(|(code, message)| Reply::Error { code, message }),
            (any::<u32>(), any::<u64>()).prop_map(|(version, boot)| Reply::Hello { version, boot }),
            (any::<u32>(), any::<u64>()).prop_map(|(id, size)| Reply::Region { id, size }),
            Just(Reply::Dropped),
            (
                any::<u64>(),
                any::<u64>(),
                proptest::collection::vec((any::<u32>(), any::<u64>(), "[a-z]{1,12}"), 0..6)
            )
                .prop_map(|(capacity, used, rs)| Reply::List {
                    size: NodeSize { capacity, used },
                    regions: rs
                        .into_iter()
                        .map(|(id, size, name)| RegionInfo { name, id, size })
                        .collect()
                }),
            proptest::collection::vec(completion(), 0..20).prop_map(Reply::Posted),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        /// Every request and reply survives its codec.
        #[test]
        fn frames_round_trip(req in request(), rep in reply()) {
            let f = req.encode();
            prop_assert_eq!(body_len(f[..4].try_into().unwrap(), MAX_REQUEST).unwrap(), f.len() - 4);
            prop_assert_eq!(Request::decode(&f[4..]).unwrap(), req);
            let f = rep.encode();
            prop_assert_eq!(Reply::decode(&f[4..]).unwrap(), rep);
        }

        /// The fuzz target: any bytes, and any mutation or cut of a valid
        /// frame, decode to a value or a typed error, never a panic.
        #[test]
        fn decoders_never_panic(noise in proptest::collection::vec(any::<u8>(), 0..200),
                                req in request(), rep in reply(),
                                at in any::<usize>(), x in any::<u8>(), cut in any::<usize>()) {
            let _ = Request::decode(&noise);
            let _ = Reply::decode(&noise);
            for mut f in [req.encode(), rep.encode()] {
                let body = &mut f[4..];
                if !body.is_empty() {
                    let i = at % body.len();
                    body[i] ^= x | 1;
                }
                let n = cut % (body.len() + 1);
                let _ = Request::decode(&body[..n]);
                let _ = Reply::decode(&body[..n]);
                let _ = Request::decode(body);
                let _ = Reply::decode(body);
            }
        }
    }

    #[test]
    fn lying_counts_and_oversized_reads_are_refused() {
        let mut b = vec![POST];
        b.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(Request::decode(&b)
            .unwrap_err()
            .to_string()
            .contains("work requests"));
        let big = Request::Post(vec![Verb::Read {
            region: 1,
            offset: 0,
            len: u32::MAX,
        }])
        .encode();
        assert!(Request::decode(&big[4..])
            .unwrap_err()
            .to_string()
            .contains("reading"));
        assert!(body_len((MAX_REQUEST as u32 + 1).to_le_bytes(), MAX_REQUEST).is_err());
        assert!(body_len([0; 4], MAX_REQUEST).is_err());
        let mut hello = Request::Hello { version: VERSION }.encode();
        hello[5] ^= 1;
        assert!(Request::decode(&hello[4..])
            .unwrap_err()
            .to_string()
            .contains("magic"));
    }
}
