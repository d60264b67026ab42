//! External point ids: unsigned integers, UUIDs and string keys.
//!
//! Users name points their way; engines see dense internal `u64` ids. A
//! collection maps one to the other (`store.rs`). In JSON an integer is a
//! [`ExtId::Num`], a string that parses as a UUID is a [`ExtId::Uuid`]
//! (normalised to the hyphenated lower-case form), any other string is an
//! [`ExtId::Str`].

use crate::error::{DbError, Result};
use serde_json::Value;
use std::fmt;

/// The longest string key accepted.
pub const MAX_KEY_BYTES: usize = 1024;

/// A point id as the user gives it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ExtId {
    Num(u64),
    Uuid(uuid::Uuid),
    Str(String),
}

impl ExtId {
    /// Reads an id from JSON.
    pub fn from_json(v: &Value) -> Result<ExtId> {
        match v {
            Value::Number(n) => n.as_u64().map(ExtId::Num).ok_or_else(|| {
                DbError::invalid(format!(
                    "point ids are unsigned integers, UUIDs or strings; got {n}"
                ))
            }),
            Value::String(s) => Self::from_str_key(s),
            other => Err(DbError::invalid(format!(
                "point ids are unsigned integers, UUIDs or strings; got {other}"
            ))),
        }
    }

    /// A string id: a UUID when it parses as one, else a key.
    pub fn from_str_key(s: &str) -> Result<ExtId> {
        if let Ok(u) = uuid::Uuid::parse_str(s) {
            return Ok(ExtId::Uuid(u));
        }
        if s.is_empty() || s.len() > MAX_KEY_BYTES {
            return Err(DbError::invalid(format!(
                "string ids must be 1..={MAX_KEY_BYTES} bytes, got {}",
                s.len()
            )));
        }
        Ok(ExtId::Str(s.to_string()))
    }

    /// The id as JSON (what the API returns).
    pub fn to_json(&self) -> Value {
        match self {
            ExtId::Num(n) => Value::from(*n),
            ExtId::Uuid(u) => Value::String(u.hyphenated().to_string()),
            ExtId::Str(s) => Value::String(s.clone()),
        }
    }

    /// Tagged bytes (store keys, WAL records).
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            ExtId::Num(n) => {
                out.push(0);
                out.extend_from_slice(&n.to_le_bytes());
            }
            ExtId::Uuid(u) => {
                out.push(1);
                out.extend_from_slice(u.as_bytes());
            }
            ExtId::Str(s) => {
                out.push(2);
                out.extend_from_slice(&(s.len() as u32).to_le_bytes());
                out.extend_from_slice(s.as_bytes());
            }
        }
    }

    /// The tagged bytes alone.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(17);
        self.encode(&mut v);
        v
    }

    /// Reads tagged bytes; returns the id and the bytes consumed.
    pub fn decode(b: &[u8]) -> Result<(ExtId, usize)> {
        let bad = || DbError::corrupted("truncated or malformed point id");
        match b.first() {
            Some(0) => {
                let n =
                    u64::from_le_bytes(b.get(1..9).ok_or_else(bad)?.try_into().map_err(|_| bad())?);
                Ok((ExtId::Num(n), 9))
            }
            Some(1) => {
                let u = uuid::Uuid::from_slice(b.get(1..17).ok_or_else(bad)?).map_err(|_| bad())?;
                Ok((ExtId::Uuid(u), 17))
            }
            Some(2) => {
                let n =
                    u32::from_le_bytes(b.get(1..5).ok_or_else(bad)?.try_into().map_err(|_| bad())?)
                        as usize;
                let s = b.get(5..5 + n).ok_or_else(bad)?;
                let s = std::str::from_utf8(s).map_err(|_| bad())?;
                Ok((ExtId::Str(s.to_string()), 5 + n))
            }
            _ => Err(bad()),
        }
    }
}

impl fmt::Display for ExtId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExtId::Num(n) => write!(f, "{n}"),
            ExtId::Uuid(u) => write!(f, "{}", u.hyphenated()),
            ExtId::Str(s) => write!(f, "{s:?}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn json_and_bytes_round_trip() {
        for v in [
            json!(7),
            json!("5c56c793-69f3-4fbf-87e6-c4bf54c28c26"),
            json!("doc-1"),
        ] {
            let id = ExtId::from_json(&v).unwrap();
            assert_eq!(id.to_json(), v);
            let b = id.to_bytes();
            assert_eq!(ExtId::decode(&b).unwrap(), (id.clone(), b.len()));
        }
        assert!(matches!(
            ExtId::from_json(&json!("5C56C793-69F3-4FBF-87E6-C4BF54C28C26")).unwrap(),
            ExtId::Uuid(_)
        ));
        assert!(ExtId::from_json(&json!(-1)).is_err());
        assert!(ExtId::from_json(&json!(1.5)).is_err());
        assert!(ExtId::from_json(&json!("")).is_err());
        assert!(ExtId::from_json(&json!(null)).is_err());
        assert!(ExtId::decode(&[2, 9, 0, 0, 0, b'a']).is_err());
        assert!(ExtId::decode(&[]).is_err());
    }
}
