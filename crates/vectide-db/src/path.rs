//! Key paths into payloads, Qdrant's JSON-path subset: `city`,
//! `address.city`, `tags[]` (every element of an array), `items[0].name`
//! (one element), `"a.b"` (a quoted key). A path starts with a key; keys
//! are letters, digits, `_` and `-`, or quoted.
//!
//! Reading ([`KeyPath::values`]) follows Qdrant: a key steps into an
//! object, `[i]` and `[]` into an array; the values the whole path selects
//! are returned, and with `flat` a selected array is unwrapped one level
//! (what `match` and `range` compare against). Writing
//! ([`KeyPath::set`], [`KeyPath::delete`], [`merge`]) follows Qdrant's
//! `set_payload` with `key` and `delete_payload`.

use crate::error::{DbError, Result};
use serde_json::{Map, Value};

/// One step of a path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    Key(String),
    Index(usize),
    Each,
}

/// Most steps a key path may have (a payload edit at a path nests its
/// value that much deeper; stored payloads stay well within the JSON
/// readers' depth).
pub const MAX_STEPS: usize = 16;

/// A parsed key path (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyPath {
    text: String,
    steps: Vec<Step>,
}

fn invalid(text: &str, why: &str) -> DbError {
    DbError::invalid(format!("{text:?} is not a valid key path: {why}"))
}

impl KeyPath {
    /// Parses a path; an invalid one is an error naming it.
    pub fn parse(text: &str) -> Result<KeyPath> {
        let mut steps = Vec::new();
        let mut rest = text;
        if rest.is_empty() {
            return Err(invalid(text, "it is empty"));
        }
        loop {
            // A key: quoted, or a run of [A-Za-z0-9_-] (Unicode letters and
            // digits too, as Qdrant's parser takes them).
            if let Some(q) = rest.strip_prefix('"') {
                let end = q
                    .find('"')
                    .ok_or_else(|| invalid(text, "a quote is not closed"))?;
                steps.push(Step::Key(q[..end].to_string()));
                rest = &q[end + 1..];
            } else {
                let end = rest
                    .char_indices()
                    .find(|(_, c)| !(c.is_alphanumeric() || *c == '_' || *c == '-'))
                    .map_or(rest.len(), |(i, _)| i);
                if end == 0 {
                    return Err(invalid(text, "a key is expected"));
                }
                steps.push(Step::Key(rest[..end].to_string()));
                rest = &rest[end..];
            }
            while let Some(b) = rest.strip_prefix('[') {
                let end = b
                    .find(']')
                    .ok_or_else(|| invalid(text, "a bracket is not closed"))?;
                let inner = &b[..end];
                if inner.is_empty() {
                    steps.push(Step::Each);
                } else if inner.bytes().all(|c| c.is_ascii_digit()) {
                    let i = inner
                        .parse::<usize>()
                        .map_err(|_| invalid(text, "an index is too large"))?;
                    steps.push(Step::Index(i));
                } else {
                    return Err(invalid(text, "an index must be digits or empty"));
                }
                rest = &b[end + 1..];
            }
            if steps.len() > MAX_STEPS {
                return Err(invalid(text, &format!("more than {MAX_STEPS} steps")));
            }
            if rest.is_empty() {
                return Ok(KeyPath {
                    text: text.to_string(),
                    steps,
                });
            }
            rest = rest
                .strip_prefix('.')
                .filter(|r| !r.is_empty())
                .ok_or_else(|| invalid(text, "keys are joined by a dot"))?;
        }
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }

    pub fn steps(&self) -> &[Step] {
        &self.steps
    }

    /// The values the path selects in `p` (see the module docs); empty
    /// when it selects none.
    pub fn values<'a>(&self, p: &'a Value, flat: bool, out: &mut Vec<&'a Value>) {
        fn walk<'a>(v: &'a Value, steps: &[Step], flat: bool, out: &mut Vec<&'a Value>) {
            let Some((step, rest)) = steps.split_first() else {
                match v {
                    Value::Array(items) if flat => out.extend(items.iter()),
                    v => out.push(v),
                }
                return;
            };
            match (step, v) {
                (Step::Key(k), Value::Object(o)) => {
                    if let Some(x) = o.get(k) {
                        walk(x, rest, flat, out);
                    }
                }
                (Step::Index(i), Value::Array(a)) => {
                    if let Some(x) = a.get(*i) {
                        walk(x, rest, flat, out);
                    }
                }
                (Step::Each, Value::Array(a)) => {
                    for x in a {
                        walk(x, rest, flat, out);
                    }
                }
                _ => {}
            }
        }
        walk(p, &self.steps, flat, out);
    }

    /// Sets `value`'s keys at the path in `payload` (an object), as
    /// Qdrant's `set_payload` with `key` does: missing objects are made, a
    /// value in the way of a key is replaced by an object, the keys are
    /// merged into an object found at the end (a null removes its key), an
    /// index past an array's end does nothing, and an array step over a
    /// value that is not an array replaces it with an empty array.
    pub fn set(&self, payload: &mut Value, value: &Map<String, Value>) {
        fn into(slot: &mut Value, value: &Map<String, Value>) {
            match slot {
                Value::Object(o) => merge(o, value),
                other => {
                    let mut o = Map::new();
                    merge(&mut o, value);
                    *other = Value::Object(o);
                }
            }
        }
        fn walk(slot: &mut Value, steps: &[Step], value: &Map<String, Value>) {
            let Some((step, rest)) = steps.split_first() else {
                return;
            };
            match step {
                Step::Key(k) => {
                    if !slot.is_object() {
                        *slot = Value::Object(Map::new());
                    }
                    let Value::Object(o) = slot else {
                        unreachable!("made an object above")
                    };
                    let child = o
                        .entry(k.clone())
                        .or_insert_with(|| Value::Object(Map::new()));
                    if rest.is_empty() {
                        into(child, value);
                    } else {
                        walk(child, rest, value);
                    }
                }
                Step::Index(i) => match slot {
                    Value::Array(a) => {
                        if let Some(child) = a.get_mut(*i) {
                            if rest.is_empty() {
                                into(child, value);
                            } else {
                                walk(child, rest, value);
                            }
                        }
                    }
                    other => *other = Value::Array(Vec::new()),
                },
                Step::Each => match slot {
                    Value::Array(a) => {
                        for child in a {
                            if rest.is_empty() {
                                into(child, value);
                            } else {
                                walk(child, rest, value);
                            }
                        }
                    }
                    other => *other = Value::Array(Vec::new()),
                },
            }
        }
        walk(payload, &self.steps, value);
    }

    /// Removes what the path selects, as Qdrant's `delete_payload` does: a
    /// final key is removed from its object, a final `[]` empties its
    /// array, a final `[i]` does nothing; a path that selects nothing
    /// changes nothing.
    pub fn delete(&self, payload: &mut Value) {
        fn walk(v: &mut Value, steps: &[Step]) {
            let Some((step, rest)) = steps.split_first() else {
                return;
            };
            if rest.is_empty() {
                match (step, v) {
                    (Step::Key(k), Value::Object(o)) => {
                        o.remove(k);
                    }
                    (Step::Each, Value::Array(a)) => a.clear(),
                    _ => {}
                }
                return;
            }
            match (step, v) {
                (Step::Key(k), Value::Object(o)) => {
                    if let Some(x) = o.get_mut(k) {
                        walk(x, rest);
                    }
                }
                (Step::Index(i), Value::Array(a)) => {
                    if let Some(x) = a.get_mut(*i) {
                        walk(x, rest);
                    }
                }
                (Step::Each, Value::Array(a)) => {
                    for x in a {
                        walk(x, rest);
                    }
                }
                _ => {}
            }
        }
        walk(payload, &self.steps);
    }
}

/// Merges `src`'s keys into `dest`, as Qdrant's `set_payload` does: a
/// null removes its key.
pub fn merge(dest: &mut Map<String, Value>, src: &Map<String, Value>) {
    for (k, v) in src {
        if v.is_null() {
            dest.remove(k);
        } else {
            dest.insert(k.clone(), v.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn p(s: &str) -> KeyPath {
        KeyPath::parse(s).unwrap()
    }

    #[test]
    fn paths_parse_as_qdrant_reads_them() {
        assert_eq!(
            p("a[0][].b-c").steps(),
            &[
                Step::Key("a".into()),
                Step::Index(0),
                Step::Each,
                Step::Key("b-c".into())
            ]
        );
        assert_eq!(
            p("\"x.y\".z").steps(),
            &[Step::Key("x.y".into()), Step::Key("z".into())]
        );
        for bad in [
            "", ".a", "a.", "a..b", "a[x]", "a[", "[0]", "a b", "\"a", "a]",
        ] {
            let e = KeyPath::parse(bad).unwrap_err().to_string();
            assert!(e.contains("not a valid key path"), "{bad}: {e}");
        }
    }

    #[test]
    fn values_step_into_objects_and_arrays_only_as_written() {
        let d = json!({"a": [{"b": 1}, {"b": [2, 3]}], "c": {"d": null}, "t": ["x", "y"]});
        let vals = |path: &str, flat: bool| {
            let mut out = Vec::new();
            p(path).values(&d, flat, &mut out);
            out.into_iter().cloned().collect::<Vec<_>>()
        };
        assert_eq!(vals("a[].b", true), vec![json!(1), json!(2), json!(3)]);
        assert_eq!(vals("a[].b", false), vec![json!(1), json!([2, 3])]);
        assert_eq!(
            vals("a.b", true),
            Vec::<Value>::new(),
            "a key does not step into an array"
        );
        assert_eq!(vals("a[1].b", true), vec![json!(2), json!(3)]);
        assert_eq!(vals("t", true), vec![json!("x"), json!("y")]);
        assert_eq!(vals("t[]", false), vec![json!("x"), json!("y")]);
        assert_eq!(vals("c.d", true), vec![Value::Null]);
    }

    #[test]
    fn set_and_delete_follow_qdrant() {
        let obj = |v: Value| v.as_object().unwrap().clone();
        let mut d = json!({"a": {"x": 1, "y": 2}, "s": 5, "l": [{"k": 1}, 7]});
        p("a").set(&mut d, &obj(json!({"y": null, "z": 3})));
        assert_eq!(d["a"], json!({"x": 1, "z": 3}));
        p("s.t").set(&mut d, &obj(json!({"u": 1})));
        assert_eq!(d["s"], json!({"t": {"u": 1}}));
        p("l[]").set(&mut d, &obj(json!({"m": 2})));
        assert_eq!(d["l"], json!([{"k": 1, "m": 2}, {"m": 2}]));
        p("l[5]").set(&mut d, &obj(json!({"m": 3})));
        assert_eq!(d["l"], json!([{"k": 1, "m": 2}, {"m": 2}]));
        p("new.deep").set(&mut d, &obj(json!({"q": true})));
        assert_eq!(d["new"], json!({"deep": {"q": true}}));
        p("a.x[0]").set(&mut d, &obj(json!({"q": true})));
        assert_eq!(d["a"]["x"], json!([]));
        let mut e = json!({"a": {"b": 1, "c": 2}, "l": [1, 2], "m": [{"b": 1}, {"b": 2, "c": 3}]});
        p("a.b").delete(&mut e);
        p("l[0]").delete(&mut e);
        p("m[].b").delete(&mut e);
        p("nope.x").delete(&mut e);
        assert_eq!(e, json!({"a": {"c": 2}, "l": [1, 2], "m": [{}, {"c": 3}]}));
        p("l[]").delete(&mut e);
        assert_eq!(e["l"], json!([]));
    }
}
