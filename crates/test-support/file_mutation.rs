//! Hostile bytes for the file fuzz tests of every format: a proptest
//! strategy of byte mutations (overwrite, truncate, insert), their
//! application, and a re-seal of a trailing CRC so that the structural
//! checks behind the checksum are exercised too. Included by the engine
//! crates' `tests/file_fuzz.rs` (`#[path]`).

use proptest::prelude::*;

/// One change to a file's bytes.
#[derive(Debug, Clone)]
pub enum Mutation {
    Set(usize, u8),
    Truncate(usize),
    Insert(usize, u8),
}

/// Mostly overwrites, sometimes a cut or an inserted byte.
pub fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        6 => (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Set(i, b)),
        1 => any::<usize>().prop_map(Mutation::Truncate),
        1 => (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Insert(i, b)),
    ]
}

/// Applies the mutations in order (positions taken modulo the length);
/// stops once the bytes are empty.
pub fn apply(bytes: &mut Vec<u8>, muts: &[Mutation]) {
    for m in muts {
        if bytes.is_empty() {
            break;
        }
        match *m {
            Mutation::Set(i, b) => {
                let i = i % bytes.len();
                bytes[i] = b;
            }
            Mutation::Truncate(n) => bytes.truncate(n % bytes.len()),
            Mutation::Insert(i, b) => {
                let i = i % (bytes.len() + 1);
                bytes.insert(i, b);
            }
        }
    }
}

/// Recomputes the CRC32 stored just before the last `end` bytes over
/// everything before it, so that only structural checks remain.
pub fn reseal(bytes: &mut [u8], end: usize) {
    if bytes.len() < end + 4 {
        return;
    }
    let crc_at = bytes.len() - end - 4;
    let crc = crc32fast::hash(&bytes[..crc_at]);
    bytes[crc_at..crc_at + 4].copy_from_slice(&crc.to_le_bytes());
}
