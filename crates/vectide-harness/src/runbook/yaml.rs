//! Runbook YAML: a tree of nodes that keeps duplicate keys (to name them)
//! and counts what it builds (aliases are expanded by the parser, each
//! expansion counts), and the Python-style rendering of values that error
//! messages use (`repr`), so that messages read the same from the CLI and
//! from Python.

use super::{fail, RunbookError, MAX_NODES};
use serde::de::{self, DeserializeSeed, Deserializer, EnumAccess, MapAccess, SeqAccess, Visitor};
use std::cell::Cell;
use std::fmt;

#[derive(Debug, Clone, PartialEq)]
pub(super) enum Node {
    Null,
    Bool(bool),
    Int(i128),
    Float(f64),
    Str(String),
    Seq(Vec<Node>),
    Map(Vec<(Node, Node)>),
}

impl Node {
    pub(super) fn is(&self, name: &str) -> bool {
        matches!(self, Node::Str(s) if s == name)
    }
}

/// Python's `repr` of a parsed value, as the Python module's messages show it.
pub(super) fn repr(n: &Node) -> String {
    match n {
        Node::Null => "None".into(),
        Node::Bool(true) => "True".into(),
        Node::Bool(false) => "False".into(),
        Node::Int(i) => i.to_string(),
        Node::Float(f) if f.is_nan() => "nan".into(),
        Node::Float(f) if f.is_infinite() => (if *f > 0.0 { "inf" } else { "-inf" }).into(),
        Node::Float(f) => format!("{f:?}"),
        Node::Str(s) => repr_str(s),
        Node::Seq(items) => format!(
            "[{}]",
            items.iter().map(repr).collect::<Vec<_>>().join(", ")
        ),
        Node::Map(entries) => format!(
            "{{{}}}",
            entries
                .iter()
                .map(|(k, v)| format!("{}: {}", repr(k), repr(v)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// Python's `repr` of a string.
pub(super) fn repr_str(s: &str) -> String {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if c.is_control() => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push(quote);
    out
}

/// Python's `str` of a key (a string as it is, anything else as its repr).
pub(super) fn py_str(n: &Node) -> String {
    match n {
        Node::Str(s) => s.clone(),
        other => repr(other),
    }
}

/// A Python list of strings, sorted: `['a', 'b']`.
pub(super) fn py_sorted_list(mut items: Vec<String>) -> String {
    items.sort();
    format!(
        "[{}]",
        items
            .iter()
            .map(|s| repr_str(s))
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// Deserialises a [`Node`], drawing every node from a shared budget.
#[derive(Clone, Copy)]
struct Seed<'a>(&'a Cell<usize>);

impl Seed<'_> {
    fn take<E: de::Error>(&self) -> Result<(), E> {
        match self.0.get().checked_sub(1) {
            Some(left) => {
                self.0.set(left);
                Ok(())
            }
            None => Err(E::custom(format!(
                "the document expands to more than {MAX_NODES} values (aliases included)"
            ))),
        }
    }
}

impl<'de> DeserializeSeed<'de> for Seed<'_> {
    type Value = Node;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Node, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Seed<'_> {
    type Value = Node;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a YAML value")
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Node, E> {
        self.take()?;
        Ok(Node::Bool(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Node, E> {
        self.take()?;
        Ok(Node::Int(v.into()))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Node, E> {
        self.take()?;
        Ok(Node::Int(v.into()))
    }
    fn visit_i128<E: de::Error>(self, v: i128) -> Result<Node, E> {
        self.take()?;
        Ok(Node::Int(v))
    }
    fn visit_u128<E: de::Error>(self, v: u128) -> Result<Node, E> {
        self.take()?;
        Ok(i128::try_from(v).map_or(Node::Float(v as f64), Node::Int))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Node, E> {
        self.take()?;
        Ok(Node::Float(v))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Node, E> {
        self.take()?;
        Ok(Node::Str(v.to_string()))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Node, E> {
        self.take()?;
        Ok(Node::Str(v))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Node, E> {
        self.take()?;
        Ok(Node::Null)
    }
    fn visit_none<E: de::Error>(self) -> Result<Node, E> {
        self.visit_unit()
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Node, D::Error> {
        self.deserialize(d)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Node, A::Error> {
        self.take()?;
        let mut items = Vec::new();
        while let Some(item) = seq.next_element_seed(self)? {
            items.push(item);
        }
        Ok(Node::Seq(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
        self.take()?;
        let mut entries = Vec::new();
        while let Some(key) = map.next_key_seed(self)? {
            let value = map.next_value_seed(self)?;
            entries.push((key, value));
        }
        Ok(Node::Map(entries))
    }
    fn visit_enum<A: EnumAccess<'de>>(self, _: A) -> Result<Node, A::Error> {
        Err(de::Error::custom("YAML tags (!name) are not supported"))
    }
}

/// Deepest bracket nesting let through to the parser (its own recursion
/// limit is 128 levels, found only after it has scanned the whole file).
const MAX_FLOW_DEPTH: usize = 128;

pub(super) fn parse_yaml(bytes: &[u8]) -> Result<Node, RunbookError> {
    // libyaml's scanner costs O(flow depth) per token, so deep flow nesting
    // is quadratic (100,000 `[` take half a minute): a cheap count of
    // brackets (quotes ignored) refuses such files before it runs.
    let mut depth = 0usize;
    for &b in bytes {
        match b {
            b'[' | b'{' => depth += 1,
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
        if depth > MAX_FLOW_DEPTH {
            return fail(format!(
                "not YAML: brackets nested deeper than {MAX_FLOW_DEPTH} levels"
            ));
        }
    }
    let budget = Cell::new(MAX_NODES);
    Seed(&budget)
        .deserialize(serde_norway::Deserializer::from_slice(bytes))
        .map_err(|e| RunbookError(format!("not YAML: {e}")))
}
