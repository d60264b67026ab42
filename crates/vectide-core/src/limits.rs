//! The documented bounds of every size and count that arrives from outside
//! (HTTP, Python, the command line, engine parameters).
//!
//! Front ends check their inputs against these constants before they do any
//! work, and answer with a clear error (HTTP 400, Python `ValueError`)
//! naming the parameter and its range. Below a bound no code allocates
//! memory in proportion to the value asked for (`k`, `ef`, `limit` …): a
//! search allocates by the results it really finds.
//!
//! | what | range | why |
//! |---|---|---|
//! | `k`, `limit`, `offset + limit` | `1..=`[`MAX_K`] | one result list |
//! | `nq × k` of a dense batch answer | `..=`[`MAX_BATCH_RESULTS`] | Python `(nq, k)` arrays, HTTP query batches |
//! | `ef`, `ef_search`, `hnsw_ef`, `ef_construction` | `1..=`[`MAX_EF`] | candidate lists |
//! | `beam_width` (search knob) | `1..=`[`MAX_BEAM_WIDTH`] | reads per hop |
//! | `nprobe` (search knob) | `1..=`[`MAX_NPROBE`] | postings or partitions probed |
//! | `rerank` (search knob) | `1..=`[`MAX_EF`] | candidates re-ranked |
//! | `dim` (vector size) | `1..=`[`MAX_DIM`] | rows of the engines |
//! | `m` | [`MIN_M`]`..=`[`MAX_M`] | graph degree (`2m` on layer 0) |
//! | `threads` | `1..=`[`MAX_THREADS`] | worker pools are spawned eagerly |
//! | `nlog_entries` (p-hnsw) | `1..=`[`MAX_NLOG_ENTRIES`] | region header |
//! | `nlist_entries` (p-hnsw) | `1..=`[`MAX_NLIST_ENTRIES`] | region header |
//! | `initial_capacity` (p-hnsw) | `0..=`[`MAX_INITIAL_CAPACITY`] rows, and at most [`MAX_INITIAL_BYTES`] of vectors | file preallocation |
//! | `snapshot_every` (hnsw-snap/-wal) | `0..=`[`MAX_SNAPSHOT_EVERY`] | rows between snapshots |
//! | `wal_buffer` (hnsw-wal) | `0..=`[`MAX_WAL_BUFFER`] bytes (0 acts as 1) | bytes between fsyncs |
//! | `seed` | `0..=2**63-1` | as it arrives (a signed 64-bit integer) |
//! | integers in JSON (payloads, filters) | `-2**63..=2**64-1` | beyond, a JSON number is a double and would not round-trip |
//! | nesting of a JSON request body | `..=`[`MAX_JSON_DEPTH`] levels | the JSON readers recurse |
//! | `checkpoint_seconds` | `(0, `[`MAX_CHECKPOINT_SECONDS`]`]` | a `Duration` |

use crate::error::{Error, Result};

/// Largest `k` of a search, `limit` of a query or scroll page, and
/// `offset + limit` of a paged query.
pub const MAX_K: usize = 100_000;

/// Largest number of result cells (`queries × k`) of one batch call whose
/// answer is dense (Python `Index.search` returns `(nq, k)` arrays) or sent
/// at once (an HTTP query batch): 2**24, i.e. 192 MiB of ids and distances.
/// Larger batches are split by the caller.
pub const MAX_BATCH_RESULTS: usize = 1 << 24;

/// Largest candidate-list size (`ef`, `ef_search`, `hnsw_ef`, `ef_construction`).
pub const MAX_EF: usize = 100_000;

/// Largest beam width (`beam_width` search knob: reads issued per hop).
pub const MAX_BEAM_WIDTH: usize = 128;

/// Largest number of postings or partitions probed (`nprobe` search knob).
pub const MAX_NPROBE: usize = 1 << 20;

/// Largest vector dimension.
pub const MAX_DIM: usize = 65_536;

/// Smallest and largest graph degree `m`.
pub const MIN_M: usize = 2;
pub const MAX_M: usize = 256;

/// Largest worker-thread count of an engine or a database. A pool spawns its
/// threads when it is built, so this bounds what one request can start.
pub const MAX_THREADS: usize = 256;

/// p-hnsw: largest NLog (concurrent operations) and NlistLog entry counts.
pub const MAX_NLOG_ENTRIES: usize = 4096;
pub const MAX_NLIST_ENTRIES: usize = 65_536;

/// p-hnsw: largest `initial_capacity` (node blocks allocated at creation)…
pub const MAX_INITIAL_CAPACITY: usize = 1 << 24;
/// … and largest size of the vectors it preallocates (`capacity × dim × 4`).
pub const MAX_INITIAL_BYTES: usize = 64 << 30;

/// hnsw-snap / hnsw-wal: largest `snapshot_every` (rows; 0 = never).
pub const MAX_SNAPSHOT_EVERY: usize = 1 << 40;

/// hnsw-wal: largest `wal_buffer` (bytes between two fdatasyncs).
pub const MAX_WAL_BUFFER: usize = 1 << 30;

/// Longest checkpoint interval of a database (one year).
pub const MAX_CHECKPOINT_SECONDS: f64 = 365.0 * 86_400.0;

/// Smallest and largest integer a JSON document may hold: every integer in
/// this range is stored exactly; beyond it a JSON number would be read as a
/// double and come back changed.
pub const JSON_INT_MIN: i128 = i64::MIN as i128;
pub const JSON_INT_MAX: i128 = u64::MAX as i128;

/// Checks that `value` of parameter `name` lies in `lo..=hi`.
pub fn check_range(name: &str, value: usize, lo: usize, hi: usize) -> Result<()> {
    if (lo..=hi).contains(&value) {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "{name} must be in {lo}..={hi}, got {value}"
        )))
    }
}

/// `k` (or `limit`) of one search: `1..=MAX_K`.
pub fn check_k(k: usize) -> Result<()> {
    check_range("k", k, 1, MAX_K)
}

/// A page of `limit` results after skipping `offset`: `limit <= MAX_K` and
/// `offset + limit <= MAX_K` (a page costs a search of `offset + limit`).
pub fn check_page(offset: usize, limit: usize) -> Result<()> {
    check_range("limit", limit, 0, MAX_K)?;
    match offset.checked_add(limit) {
        Some(n) if n <= MAX_K => Ok(()),
        _ => Err(Error::invalid(format!(
            "offset + limit must be at most {MAX_K}, got {offset} + {limit}"
        ))),
    }
}

/// `nq` queries of `k` results each, answered at once: `nq × k <= MAX_BATCH_RESULTS`.
pub fn check_batch_results(nq: usize, k: usize) -> Result<()> {
    match nq.checked_mul(k) {
        Some(n) if n <= MAX_BATCH_RESULTS => Ok(()),
        _ => Err(Error::invalid(format!(
            "{nq} queries × k={k} results exceed {MAX_BATCH_RESULTS} result cells per call; \
             split the batch into calls of at most {} queries",
            (MAX_BATCH_RESULTS / k.max(1)).max(1)
        ))),
    }
}

/// `ef` of a search: `1..=MAX_EF`.
pub fn check_ef(ef: usize) -> Result<()> {
    check_range("ef", ef, 1, MAX_EF)
}

/// A vector dimension: `1..=MAX_DIM`.
pub fn check_dim(dim: usize) -> Result<()> {
    check_range("dim", dim, 1, MAX_DIM)
}

/// A worker-thread count: `1..=MAX_THREADS`.
pub fn check_threads(threads: usize) -> Result<()> {
    check_range("threads", threads, 1, MAX_THREADS)
}

/// Checks that every integer literal of a JSON text lies in
/// `JSON_INT_MIN..=JSON_INT_MAX`, so that it is stored exactly (an integer
/// beyond would be read as the nearest double). Strings are skipped; the
/// text is not otherwise validated (the JSON parser does that).
pub fn check_json_integers(text: &[u8]) -> Result<()> {
    let mut i = 0;
    let n = text.len();
    // The last object key seen, to name the field in the error.
    let mut key: &[u8] = b"";
    while i < n {
        match text[i] {
            b'"' => {
                // Skip the string, honouring backslash escapes.
                let start = i + 1;
                i += 1;
                while i < n && text[i] != b'"' {
                    i += if text[i] == b'\\' { 2 } else { 1 };
                }
                let end = i.min(n);
                i += 1;
                let mut j = i;
                while j < n && text[j].is_ascii_whitespace() {
                    j += 1;
                }
                if j < n && text[j] == b':' {
                    key = &text[start..end];
                }
            }
            b'-' | b'0'..=b'9' => {
                let start = i;
                i += 1;
                while i < n && matches!(text[i], b'0'..=b'9' | b'.' | b'e' | b'E' | b'+' | b'-') {
                    i += 1;
                }
                let tok = &text[start..i];
                if tok.iter().any(|c| matches!(c, b'.' | b'e' | b'E')) {
                    continue; // a float: read exactly as the nearest double, printed back the same
                }
                let digits = tok.strip_prefix(b"-").unwrap_or(tok);
                let in_range = digits.len() <= 20
                    && std::str::from_utf8(tok)
                        .ok()
                        .and_then(|s| s.parse::<i128>().ok())
                        .is_some_and(|v| (JSON_INT_MIN..=JSON_INT_MAX).contains(&v));
                if !in_range && digits.iter().all(u8::is_ascii_digit) && !digits.is_empty() {
                    let shown = String::from_utf8_lossy(&tok[..tok.len().min(40)]);
                    let at = if key.is_empty() {
                        String::new()
                    } else {
                        format!(
                            " (at {:?})",
                            String::from_utf8_lossy(&key[..key.len().min(64)])
                        )
                    };
                    return Err(Error::invalid(format!(
                        "integer {shown}{}{at} is outside -2**63..=2**64-1 and would not be \
                         stored exactly; send it as a string or a float",
                        if tok.len() > 40 { "…" } else { "" }
                    )));
                }
            }
            _ => i += 1,
        }
    }
    Ok(())
}

/// Deepest nesting of arrays and objects in a JSON request body (the
/// recursion limit of the JSON reader, which also applies to the parts a
/// typed reader would skip).
pub const MAX_JSON_DEPTH: usize = 128;

/// Checks that a JSON text nests arrays and objects at most
/// [`MAX_JSON_DEPTH`] levels deep (strings are skipped; the text is not
/// otherwise validated).
pub fn check_json_depth(text: &[u8]) -> Result<()> {
    let (mut depth, mut i) = (0usize, 0usize);
    while i < text.len() {
        match text[i] {
            b'"' => {
                i += 1;
                while i < text.len() && text[i] != b'"' {
                    i += if text[i] == b'\\' { 2 } else { 1 };
                }
            }
            b'[' | b'{' => {
                depth += 1;
                if depth > MAX_JSON_DEPTH {
                    return Err(Error::invalid(format!(
                        "JSON nested deeper than {MAX_JSON_DEPTH} levels (at byte {i})"
                    )));
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
        i += 1;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_nesting_is_bounded() {
        let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        assert!(check_json_depth(deep(MAX_JSON_DEPTH).as_bytes()).is_ok());
        let e = check_json_depth(deep(MAX_JSON_DEPTH + 1).as_bytes()).unwrap_err();
        assert!(e.to_string().contains("nested deeper than 128"), "{e}");
        let objects = format!("{}1{}", r#"{"a":"#.repeat(200), "}".repeat(200));
        assert!(check_json_depth(objects.as_bytes()).is_err());
        // Brackets inside strings (escaped quotes included) do not count.
        let quoted = format!(r#"{{"s": "\"{}"}}"#, "[".repeat(500));
        assert!(check_json_depth(quoted.as_bytes()).is_ok());
    }

    #[test]
    fn ranges_name_the_parameter_and_the_bound() {
        assert!(check_k(1).is_ok() && check_k(MAX_K).is_ok());
        let e = check_k(MAX_K + 1).unwrap_err().to_string();
        assert!(e.contains("k must be in 1..=100000"), "{e}");
        assert!(check_k(0).is_err());
        assert!(check_threads(MAX_THREADS).is_ok());
        assert!(check_threads(1500)
            .unwrap_err()
            .to_string()
            .contains("threads"));
        assert!(check_threads(0).is_err());
        assert!(check_dim(MAX_DIM + 1).is_err() && check_dim(0).is_err());
        assert!(check_ef(MAX_EF).is_ok() && check_ef(MAX_EF + 1).is_err());
        assert!(check_page(0, MAX_K).is_ok());
        assert!(check_page(1, MAX_K).is_err());
        assert!(check_page(usize::MAX, 10).is_err());
        assert!(check_batch_results(1 << 10, 1 << 14).is_ok());
        let e = check_batch_results(10_000, MAX_K).unwrap_err().to_string();
        assert!(e.contains("split the batch"), "{e}");
        assert!(check_batch_results(usize::MAX, 2).is_err());
    }

    #[test]
    fn json_integers_beyond_64_bits_are_refused() {
        let ok = br#"{"a": 18446744073709551615, "b": -9223372036854775808, "c": 1e400,
                     "d": 123456789012345678901234.5, "e": "99999999999999999999999", "f": [0, -0, 3]}"#;
        assert!(check_json_integers(ok).is_ok());
        for bad in [
            &b"[18446744073709551616]"[..],
            b"{\"x\": -9223372036854775809}",
            b"{\"x\": 1000000000000000000000000000000000000000000000000}",
            b"{\"s\": \"\\\"\", \"x\": 99999999999999999999}",
        ] {
            let e = check_json_integers(bad).unwrap_err().to_string();
            assert!(e.contains("2**64-1"), "{e}");
        }
        let e = check_json_integers(br#"{"params": {"threads" : 18446744073709551616}}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains(r#"(at "threads")"#), "{e}");
    }
}
