//! Payload edits (Qdrant's `set_payload`, with and without `key`,
//! `overwrite_payload`, `delete_payload`, `clear_payload`): what a
//! payload-update record carries per point and how the point store applies
//! it.
//!
//! In the log (`docs/format-database.md`), an edit is one JSON value: a
//! bare object is the merge of a log written before edits had kinds (its
//! keys set as given, nulls kept); every other edit is an array whose first
//! element names it: `["merge", {..}]` (a null removes its key, as Qdrant
//! does), `["set", "key.path", {..}]`, `["overwrite", {..}]`,
//! `["delete", ["key.path", ..]]`, `["clear"]`.

use crate::error::{DbError, Result};
use crate::path::{merge, KeyPath};
use serde_json::{json, Map, Value};

/// One payload edit.
#[derive(Debug, Clone, PartialEq)]
pub enum PayloadEdit {
    /// `set_payload`: the keys merged in (a null removes its key).
    Merge(Map<String, Value>),
    /// `set_payload` with `key`: the keys merged in at the path
    /// ([`KeyPath::set`]).
    SetAt(KeyPath, Map<String, Value>),
    /// `overwrite_payload`: the payload replaced.
    Overwrite(Map<String, Value>),
    /// `delete_payload`: what each path selects removed.
    Delete(Vec<KeyPath>),
    /// `clear_payload`: the payload emptied.
    Clear,
    /// A merge logged before edits had kinds (nulls kept as values).
    LegacyMerge(Map<String, Value>),
}

impl PayloadEdit {
    /// The edit applied to a payload (an object).
    pub fn apply(&self, payload: &mut Value) {
        if !payload.is_object() {
            *payload = Value::Object(Map::new());
        }
        let Value::Object(o) = payload else {
            unreachable!("made an object above")
        };
        match self {
            PayloadEdit::Merge(m) => merge(o, m),
            PayloadEdit::LegacyMerge(m) => o.extend(m.iter().map(|(k, v)| (k.clone(), v.clone()))),
            PayloadEdit::SetAt(path, m) => path.set(payload, m),
            PayloadEdit::Overwrite(m) => *o = m.clone(),
            PayloadEdit::Delete(paths) => {
                for path in paths {
                    path.delete(payload);
                }
            }
            PayloadEdit::Clear => o.clear(),
        }
    }

    /// Refuses an edit whose payload would nest deeper than the JSON
    /// readers of the stored payloads read
    /// (`vectide_core::limits::MAX_JSON_DEPTH`): the value's own depth plus
    /// the path it is set at.
    pub fn check_depth(&self) -> Result<()> {
        fn depth(v: &Value) -> usize {
            match v {
                Value::Array(a) => 1 + a.iter().map(depth).max().unwrap_or(0),
                Value::Object(o) => 1 + o.values().map(depth).max().unwrap_or(0),
                _ => 0,
            }
        }
        let (value, steps) = match self {
            PayloadEdit::Merge(m) | PayloadEdit::Overwrite(m) | PayloadEdit::LegacyMerge(m) => {
                (m, 0)
            }
            PayloadEdit::SetAt(p, m) => (m, p.steps().len()),
            PayloadEdit::Delete(_) | PayloadEdit::Clear => return Ok(()),
        };
        let d = 1 + value.values().map(depth).max().unwrap_or(0) + steps;
        let max = vectide_core::limits::MAX_JSON_DEPTH - 8;
        if d > max {
            return Err(DbError::invalid(format!(
                "the payload would nest {d} levels deep; at most {max}"
            )));
        }
        Ok(())
    }

    /// The edit as the log holds it.
    pub fn to_json(&self) -> Value {
        match self {
            PayloadEdit::Merge(m) => json!(["merge", m]),
            PayloadEdit::SetAt(p, m) => json!(["set", p.as_str(), m]),
            PayloadEdit::Overwrite(m) => json!(["overwrite", m]),
            PayloadEdit::Delete(paths) => {
                json!([
                    "delete",
                    paths.iter().map(KeyPath::as_str).collect::<Vec<_>>()
                ])
            }
            PayloadEdit::Clear => json!(["clear"]),
            PayloadEdit::LegacyMerge(m) => Value::Object(m.clone()),
        }
    }

    /// Reads an edit back from the log; anything else is `Corrupted`.
    pub fn from_json(v: &Value) -> Result<PayloadEdit> {
        let bad = || DbError::corrupted(format!("WAL record: not a payload edit: {v}"));
        let obj = |x: Option<&Value>| x.and_then(Value::as_object).cloned().ok_or_else(bad);
        match v {
            Value::Object(m) => Ok(PayloadEdit::LegacyMerge(m.clone())),
            Value::Array(a) => match a.first().and_then(Value::as_str) {
                Some("merge") if a.len() == 2 => Ok(PayloadEdit::Merge(obj(a.get(1))?)),
                Some("overwrite") if a.len() == 2 => Ok(PayloadEdit::Overwrite(obj(a.get(1))?)),
                Some("set") if a.len() == 3 => {
                    let path = a[1].as_str().ok_or_else(bad)?;
                    let path = KeyPath::parse(path).map_err(|_| bad())?;
                    Ok(PayloadEdit::SetAt(path, obj(a.get(2))?))
                }
                Some("delete") if a.len() == 2 => {
                    let paths = a[1].as_array().ok_or_else(bad)?;
                    paths
                        .iter()
                        .map(|p| {
                            p.as_str()
                                .and_then(|s| KeyPath::parse(s).ok())
                                .ok_or_else(bad)
                        })
                        .collect::<Result<Vec<_>>>()
                        .map(PayloadEdit::Delete)
                }
                Some("clear") if a.len() == 1 => Ok(PayloadEdit::Clear),
                _ => Err(bad()),
            },
            _ => Err(bad()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edits_round_trip_through_the_log_and_apply() {
        let m = |v: Value| v.as_object().unwrap().clone();
        let base = json!({"a": 1, "b": {"c": 2}, "l": [1]});
        for (edit, want) in [
            (
                PayloadEdit::Merge(m(json!({"a": null, "z": 3}))),
                json!({"b": {"c": 2}, "l": [1], "z": 3}),
            ),
            (
                PayloadEdit::LegacyMerge(m(json!({"a": null}))),
                json!({"a": null, "b": {"c": 2}, "l": [1]}),
            ),
            (
                PayloadEdit::SetAt(KeyPath::parse("b").unwrap(), m(json!({"d": 4}))),
                json!({"a": 1, "b": {"c": 2, "d": 4}, "l": [1]}),
            ),
            (PayloadEdit::Overwrite(m(json!({"q": 1}))), json!({"q": 1})),
            (
                PayloadEdit::Delete(vec![
                    KeyPath::parse("b.c").unwrap(),
                    KeyPath::parse("l[]").unwrap(),
                ]),
                json!({"a": 1, "b": {}, "l": []}),
            ),
            (PayloadEdit::Clear, json!({})),
        ] {
            let back = PayloadEdit::from_json(&edit.to_json()).unwrap();
            assert_eq!(back, edit);
            let mut p = base.clone();
            back.apply(&mut p);
            assert_eq!(p, want, "{edit:?}");
        }
        for bad in [
            json!(1),
            json!(["merge"]),
            json!(["set", "a[", {}]),
            json!(["nope", {}]),
            json!(["delete", [1]]),
        ] {
            assert!(PayloadEdit::from_json(&bad).is_err(), "{bad}");
        }
    }
}
