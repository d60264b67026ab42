//! Payload filters in Qdrant's JSON shape, parsed into a [`Filter`] tree and
//! evaluated against payload documents, with Qdrant's semantics (as its
//! client's local mode implements them: the reference the conformance test
//! holds us to).
//!
//! ```json
//! {"must": [{"key": "city", "match": {"value": "Berlin"}}],
//!  "should": [{"key": "year", "range": {"gte": 2000, "lt": 2010}}],
//!  "must_not": [{"has_id": [1, 2]}],
//!  "min_should": {"conditions": [...], "min_count": 2}}
//! ```
//!
//! Keys are key paths (`crate::path`: `a.b`, `tags[]`, `items[0].name`).
//! Conditions: `match` with `value` (equality on a keyword, integer or
//! bool; a float payload value never matches), `any` (one of), `except`
//! (a non-null value outside the list), `text` (every word of the text is
//! a word of the value: words are runs of letters and digits, compared
//! lower-cased), `text_any` (one word is), `phrase` (the words in a row);
//! `range` with `gt`, `gte`, `lt`, `lte` on numbers (not booleans);
//! `values_count`; `has_id`; `is_empty` (no value, or only nulls and empty
//! arrays); `is_null` (a null, or an array holding one); `nested` (a
//! filter that one element of an array of objects must pass); and a filter
//! as a condition. A field condition holds when it holds for one of the
//! values the key selects (arrays unwrapped one level); none selected, it
//! does not hold. `must` holds when all its conditions do, `must_not` when
//! none does, `should` when one does (or it is empty), `min_should` when at
//! least `min_count` of its conditions do. Anything else is an error naming
//! the offending part.

use crate::error::{DbError, Result};
use crate::ids::ExtId;
use crate::path::KeyPath;
use serde_json::Value;

/// A scalar a `match` compares with.
#[derive(Debug, Clone, PartialEq)]
pub enum Scalar {
    Str(String),
    Int(i64),
    Bool(bool),
}

impl Scalar {
    fn from_json(v: &Value, at: &str) -> Result<Scalar> {
        match v {
            Value::String(s) => Ok(Scalar::Str(s.clone())),
            Value::Bool(b) => Ok(Scalar::Bool(*b)),
            Value::Number(n) => n.as_i64().map(Scalar::Int).ok_or_else(|| {
                DbError::invalid(format!(
                    "{at}: match compares keywords, integers or booleans, got {n}"
                ))
            }),
            other => Err(DbError::invalid(format!(
                "{at}: match compares keywords, integers or booleans, got {other}"
            ))),
        }
    }

    /// Whether a payload value equals this scalar (a float never equals an
    /// integer, a boolean never a number).
    pub fn matches(&self, v: &Value) -> bool {
        match (self, v) {
            (Scalar::Str(a), Value::String(b)) => a == b,
            (Scalar::Bool(a), Value::Bool(b)) => a == b,
            (Scalar::Int(a), Value::Number(n)) => !n.is_f64() && n.as_i64() == Some(*a),
            _ => false,
        }
    }
}

/// Bounds of a `range` or `values_count` condition.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Range {
    pub gt: Option<f64>,
    pub gte: Option<f64>,
    pub lt: Option<f64>,
    pub lte: Option<f64>,
}

impl Range {
    pub fn contains(&self, x: f64) -> bool {
        self.gt.is_none_or(|b| x > b)
            && self.gte.is_none_or(|b| x >= b)
            && self.lt.is_none_or(|b| x < b)
            && self.lte.is_none_or(|b| x <= b)
    }
}

/// How a `text` family match compares words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TextMode {
    /// Every word of the query is a word of the value.
    All,
    /// One word of the query is.
    Any,
    /// The query's words appear in a row.
    Phrase,
}

/// One condition.
#[derive(Debug, Clone, PartialEq)]
pub enum Condition {
    Match {
        key: KeyPath,
        value: Scalar,
    },
    Any {
        key: KeyPath,
        values: Vec<Scalar>,
    },
    Except {
        key: KeyPath,
        values: Vec<Scalar>,
    },
    Text {
        key: KeyPath,
        words: Vec<String>,
        mode: TextMode,
    },
    Range {
        key: KeyPath,
        range: Range,
    },
    ValuesCount {
        key: KeyPath,
        range: Range,
    },
    HasId(std::collections::HashSet<ExtId>),
    IsEmpty {
        key: KeyPath,
    },
    IsNull {
        key: KeyPath,
    },
    /// `{"nested": {"key", "filter"}}`: one object of the array at `key`
    /// passes the filter.
    NestedArray {
        key: KeyPath,
        filter: Box<Filter>,
    },
    /// A filter used as a condition.
    Nested(Box<Filter>),
}

/// `min_should`: at least `min_count` of `conditions` hold.
#[derive(Debug, Clone, PartialEq)]
pub struct MinShould {
    pub conditions: Vec<Condition>,
    pub min_count: usize,
}

/// A parsed filter (see the module docs).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Filter {
    pub must: Vec<Condition>,
    pub should: Vec<Condition>,
    pub must_not: Vec<Condition>,
    pub min_should: Option<MinShould>,
}

fn list<'a>(
    obj: &'a serde_json::Map<String, Value>,
    name: &str,
    at: &str,
) -> Result<Vec<&'a Value>> {
    match obj.get(name) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(a)) => Ok(a.iter().collect()),
        Some(v @ Value::Object(_)) => Ok(vec![v]),
        Some(other) => Err(DbError::invalid(format!(
            "{at}.{name} must be a list of conditions, got {other}"
        ))),
    }
}

fn number(v: &Value, at: &str) -> Result<Option<f64>> {
    match v {
        Value::Null => Ok(None),
        Value::Number(n) => n
            .as_f64()
            .filter(|x| x.is_finite())
            .map(Some)
            .ok_or_else(|| DbError::invalid(format!("{at} must be a finite number"))),
        other => Err(DbError::invalid(format!(
            "{at} must be a number, got {other}"
        ))),
    }
}

fn key_of(obj: &serde_json::Map<String, Value>, at: &str) -> Result<KeyPath> {
    match obj.get("key") {
        Some(Value::String(k)) => {
            KeyPath::parse(k).map_err(|e| DbError::invalid(format!("{at}.key: {e}")))
        }
        Some(other) => Err(DbError::invalid(format!(
            "{at}.key must be a key path string, got {other}"
        ))),
        None => Err(DbError::invalid(format!(
            "{at}: a field condition needs a \"key\""
        ))),
    }
}

fn range_of(v: &Value, at: &str) -> Result<Range> {
    let ro = v
        .as_object()
        .ok_or_else(|| DbError::invalid(format!("{at} must be an object")))?;
    let mut range = Range::default();
    for (k, v) in ro {
        let x = number(v, &format!("{at}.{k}"))?;
        match k.as_str() {
            "gt" => range.gt = x,
            "gte" => range.gte = x,
            "lt" => range.lt = x,
            "lte" => range.lte = x,
            other => {
                return Err(DbError::invalid(format!(
                    "{at}: unknown bound {other:?} (known: gt, gte, lt, lte)"
                )))
            }
        }
    }
    Ok(range)
}

/// The words of a text, as Qdrant's default word tokenizer makes them:
/// runs of letters and digits, lower-cased.
pub fn words(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect()
}

impl Filter {
    pub fn parse(v: &Value) -> Result<Filter> {
        Self::parse_at(v, "filter", 0)
    }

    fn parse_at(v: &Value, at: &str, depth: usize) -> Result<Filter> {
        if depth > 32 {
            return Err(DbError::invalid(format!(
                "{at}: filter nested deeper than 32 levels"
            )));
        }
        let obj = v
            .as_object()
            .ok_or_else(|| DbError::invalid(format!("{at} must be an object, got {v}")))?;
        for k in obj.keys() {
            if !matches!(k.as_str(), "must" | "should" | "must_not" | "min_should") {
                return Err(DbError::invalid(format!(
                    "{at}: unknown filter clause {k:?} (known: must, should, must_not, min_should)"
                )));
            }
        }
        let mut f = Filter::default();
        for (name, into) in [
            ("must", &mut f.must),
            ("should", &mut f.should),
            ("must_not", &mut f.must_not),
        ] {
            for (i, c) in list(obj, name, at)?.into_iter().enumerate() {
                into.push(Condition::parse(
                    c,
                    &format!("{at}.{name}[{i}]"),
                    depth + 1,
                )?);
            }
        }
        if let Some(m) = obj.get("min_should").filter(|v| !v.is_null()) {
            let at = format!("{at}.min_should");
            let mo = m
                .as_object()
                .ok_or_else(|| DbError::invalid(format!("{at} must be an object")))?;
            let min_count = mo
                .get("min_count")
                .and_then(Value::as_u64)
                .filter(|&n| n >= 1)
                .ok_or_else(|| {
                    DbError::invalid(format!("{at}.min_count must be an integer of at least 1"))
                })? as usize;
            let mut conditions = Vec::new();
            for (i, c) in list(mo, "conditions", &at)?.into_iter().enumerate() {
                conditions.push(Condition::parse(
                    c,
                    &format!("{at}.conditions[{i}]"),
                    depth + 1,
                )?);
            }
            f.min_should = Some(MinShould {
                conditions,
                min_count,
            });
        }
        Ok(f)
    }

    /// Whether a point passes (`id` is `None` inside a `nested` condition,
    /// where `has_id` never holds).
    pub fn eval(&self, id: &ExtId, p: &Value) -> bool {
        self.eval_at(Some(id), p)
    }

    fn eval_at(&self, id: Option<&ExtId>, p: &Value) -> bool {
        self.must.iter().all(|c| c.eval(id, p))
            && (self.should.is_empty() || self.should.iter().any(|c| c.eval(id, p)))
            && !self.must_not.iter().any(|c| c.eval(id, p))
            && self.min_should.as_ref().is_none_or(|m| {
                m.conditions.iter().filter(|c| c.eval(id, p)).count() >= m.min_count
            })
    }

    /// `outer` and `inner` joined as Qdrant joins a query's filter with a
    /// prefetch's (its `Filter::merge_opts`): clause by clause, so that
    /// `must` and `must_not` conditions add up while `should` conditions of
    /// both become alternatives of one another, and the `min_should`
    /// conditions are pooled with the larger count.
    pub fn merge(outer: Option<&Filter>, inner: Option<&Filter>) -> Option<Filter> {
        let (o, i) = match (outer, inner) {
            (None, None) => return None,
            (Some(x), None) | (None, Some(x)) => return Some(x.clone()),
            (Some(o), Some(i)) => (o, i),
        };
        let cat = |a: &[Condition], b: &[Condition]| [a, b].concat();
        Some(Filter {
            must: cat(&o.must, &i.must),
            should: cat(&o.should, &i.should),
            must_not: cat(&o.must_not, &i.must_not),
            min_should: match (&o.min_should, &i.min_should) {
                (None, x) | (x, None) => x.clone(),
                (Some(a), Some(b)) => Some(MinShould {
                    conditions: cat(&a.conditions, &b.conditions),
                    min_count: a.min_count.max(b.min_count),
                }),
            },
        })
    }

    pub fn is_trivial(&self) -> bool {
        self.must.is_empty()
            && self.should.is_empty()
            && self.must_not.is_empty()
            && self.min_should.is_none()
    }
}

impl Condition {
    fn parse(v: &Value, at: &str, depth: usize) -> Result<Condition> {
        let obj = v
            .as_object()
            .ok_or_else(|| DbError::invalid(format!("{at} must be an object, got {v}")))?;
        if ["must", "should", "must_not", "min_should"]
            .iter()
            .any(|k| obj.contains_key(*k))
        {
            return Ok(Condition::Nested(Box::new(Filter::parse_at(v, at, depth)?)));
        }
        if let Some(ids) = obj.get("has_id") {
            let arr = ids
                .as_array()
                .ok_or_else(|| DbError::invalid(format!("{at}.has_id must be a list of ids")))?;
            let ids = arr
                .iter()
                .enumerate()
                .map(|(i, x)| {
                    ExtId::from_json(x)
                        .map_err(|e| DbError::invalid(format!("{at}.has_id[{i}]: {e}")))
                })
                .collect::<Result<std::collections::HashSet<_>>>()?;
            return Ok(Condition::HasId(ids));
        }
        if let Some(inner) = obj.get("is_empty") {
            let o = inner.as_object().ok_or_else(|| {
                DbError::invalid(format!("{at}.is_empty must be {{\"key\": ...}}"))
            })?;
            return Ok(Condition::IsEmpty {
                key: key_of(o, &format!("{at}.is_empty"))?,
            });
        }
        if let Some(inner) = obj.get("is_null") {
            let o = inner.as_object().ok_or_else(|| {
                DbError::invalid(format!("{at}.is_null must be {{\"key\": ...}}"))
            })?;
            return Ok(Condition::IsNull {
                key: key_of(o, &format!("{at}.is_null"))?,
            });
        }
        if let Some(inner) = obj.get("nested") {
            let at = format!("{at}.nested");
            let o = inner.as_object().ok_or_else(|| {
                DbError::invalid(format!("{at} must be {{\"key\": ..., \"filter\": ...}}"))
            })?;
            // `items` and `items[]` name the same array.
            let mut key = key_of(o, &at)?;
            if key.as_str().len() > 2 && key.as_str().ends_with("[]") {
                key = KeyPath::parse(&key.as_str()[..key.as_str().len() - 2])?;
            }
            let filter = o.get("filter").ok_or_else(|| {
                DbError::invalid(format!("{at}: a nested condition needs a filter"))
            })?;
            return Ok(Condition::NestedArray {
                key,
                filter: Box::new(Filter::parse_at(
                    filter,
                    &format!("{at}.filter"),
                    depth + 1,
                )?),
            });
        }
        if obj.contains_key("geo_bounding_box")
            || obj.contains_key("geo_radius")
            || obj.contains_key("datetime_range")
            || obj.contains_key("geo_polygon")
            || obj.contains_key("has_vector")
        {
            let which = obj
                .keys()
                .find(|k| *k != "key")
                .cloned()
                .unwrap_or_default();
            return Err(DbError::invalid(format!(
                "{at}: the {which:?} condition is not supported"
            )));
        }
        let key = key_of(obj, at)?;
        let mut op = None;
        for k in obj.keys() {
            match k.as_str() {
                "key" => {}
                "match" | "range" | "values_count" if op.is_none() => op = Some(k.as_str()),
                "match" | "range" | "values_count" => {
                    return Err(DbError::invalid(format!(
                        "{at}: one condition per key (got more than one of match, range, values_count)"
                    )))
                }
                other => {
                    return Err(DbError::invalid(format!(
                        "{at}: unknown condition operator {other:?} (known: match, range, values_count, has_id, is_empty, is_null, nested)"
                    )))
                }
            }
        }
        match op {
            Some("match") => Self::parse_match(&obj["match"], key, at),
            Some("range") => Ok(Condition::Range {
                key,
                range: range_of(&obj["range"], &format!("{at}.range"))?,
            }),
            Some("values_count") => Ok(Condition::ValuesCount {
                key,
                range: range_of(&obj["values_count"], &format!("{at}.values_count"))?,
            }),
            _ => Err(DbError::invalid(format!(
                "{at}: condition on {:?} has no match, range or values_count",
                key.as_str()
            ))),
        }
    }

    fn parse_match(m: &Value, key: KeyPath, at: &str) -> Result<Condition> {
        let mo = m
            .as_object()
            .ok_or_else(|| DbError::invalid(format!("{at}.match must be an object")))?;
        if mo.len() != 1 {
            return Err(DbError::invalid(format!(
                "{at}.match must hold exactly one of value, any, except, text, text_any, phrase"
            )));
        }
        let (form, v) = mo.iter().next().expect("one entry");
        let scalars = || -> Result<Vec<Scalar>> {
            let arr = v
                .as_array()
                .ok_or_else(|| DbError::invalid(format!("{at}.match.{form} must be a list")))?;
            arr.iter()
                .enumerate()
                .map(|(i, x)| Scalar::from_json(x, &format!("{at}.match.{form}[{i}]")))
                .collect()
        };
        let text = |mode| -> Result<Condition> {
            let s = v
                .as_str()
                .ok_or_else(|| DbError::invalid(format!("{at}.match.{form} must be a string")))?;
            Ok(Condition::Text {
                key: key.clone(),
                words: words(s),
                mode,
            })
        };
        match form.as_str() {
            "value" => Ok(Condition::Match {
                value: Scalar::from_json(v, &format!("{at}.match.value"))?,
                key,
            }),
            "any" => Ok(Condition::Any {
                values: scalars()?,
                key,
            }),
            "except" => Ok(Condition::Except {
                values: scalars()?,
                key,
            }),
            "text" => text(TextMode::All),
            "text_any" => text(TextMode::Any),
            "phrase" => text(TextMode::Phrase),
            other => Err(DbError::invalid(format!(
                "{at}.match: unknown or unsupported form {other:?} (known: value, any, except, text, text_any, phrase)"
            ))),
        }
    }

    fn eval(&self, id: Option<&ExtId>, p: &Value) -> bool {
        let mut vals = Vec::new();
        let mut values = |key: &KeyPath, flat: bool| {
            vals.clear();
            key.values(p, flat, &mut vals);
            std::mem::take(&mut vals)
        };
        match self {
            Condition::Match { key, value } => {
                values(key, true).into_iter().any(|v| value.matches(v))
            }
            Condition::Any { key, values: list } => values(key, true)
                .into_iter()
                .any(|v| list.iter().any(|s| s.matches(v))),
            Condition::Except { key, values: list } => values(key, true)
                .into_iter()
                .any(|v| !v.is_null() && !list.iter().any(|s| s.matches(v))),
            Condition::Text {
                key,
                words: q,
                mode,
            } => values(key, true).into_iter().any(|v| match v {
                Value::String(s) => text_matches(q, &words(s), *mode),
                _ => false,
            }),
            Condition::Range { key, range } => values(key, true).into_iter().any(|v| match v {
                Value::Number(n) => n.as_f64().is_some_and(|x| range.contains(x)),
                _ => false,
            }),
            Condition::ValuesCount { key, range } => {
                let vs = values(key, false);
                let count = |v: &Value| match v {
                    Value::Null => 0,
                    Value::Array(a) => a.len(),
                    _ => 1,
                };
                if vs.iter().all(|v| v.is_null()) {
                    range.contains(0.0)
                } else {
                    vs.iter().any(|v| range.contains(count(v) as f64))
                }
            }
            Condition::HasId(ids) => id.is_some_and(|id| ids.contains(id)),
            Condition::IsEmpty { key } => values(key, false).iter().all(|v| match v {
                Value::Null => true,
                Value::Array(a) => a.is_empty(),
                _ => false,
            }),
            Condition::IsNull { key } => values(key, false).iter().any(|v| match v {
                Value::Null => true,
                Value::Array(a) => a.iter().any(Value::is_null),
                _ => false,
            }),
            Condition::NestedArray { key, filter } => values(key, false).iter().any(|v| match v {
                Value::Array(items) => items
                    .iter()
                    .filter(|x| x.is_object())
                    .any(|x| filter.eval_at(None, x)),
                _ => false,
            }),
            Condition::Nested(f) => f.eval_at(id, p),
        }
    }
}

fn text_matches(query: &[String], doc: &[String], mode: TextMode) -> bool {
    match mode {
        TextMode::All => !query.is_empty() && query.iter().all(|w| doc.contains(w)),
        TextMode::Any => query.iter().any(|w| doc.contains(w)),
        TextMode::Phrase => !query.is_empty() && doc.windows(query.len()).any(|w| w == query),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn f(v: Value) -> Filter {
        Filter::parse(&v).unwrap()
    }

    #[test]
    fn qdrant_shapes_parse_and_evaluate() {
        let p = json!({"city": "Berlin", "year": 2005, "tags": ["a", "b"], "addr": {"zip": 10115}, "n": null});
        let id = ExtId::Num(7);
        assert!(f(json!({"must": [{"key": "city", "match": {"value": "Berlin"}}]})).eval(&id, &p));
        assert!(!f(json!({"must": [{"key": "city", "match": {"value": "Paris"}}]})).eval(&id, &p));
        assert!(f(json!({"must": [{"key": "tags", "match": {"any": ["x", "b"]}}]})).eval(&id, &p));
        assert!(
            f(json!({"must": [{"key": "city", "match": {"except": ["Paris"]}}]})).eval(&id, &p)
        );
        assert!(
            f(json!({"must": [{"key": "year", "range": {"gte": 2000, "lt": 2010}}]})).eval(&id, &p)
        );
        assert!(!f(json!({"must": [{"key": "year", "range": {"gt": 2005}}]})).eval(&id, &p));
        assert!(f(json!({"must": [{"key": "addr.zip", "match": {"value": 10115}}]})).eval(&id, &p));
        assert!(
            f(json!({"should": [{"key": "city", "match": {"value": "X"}}, {"has_id": [7]}]}))
                .eval(&id, &p)
        );
        assert!(!f(json!({"must_not": [{"has_id": [7, 8]}]})).eval(&id, &p));
        assert!(
            f(json!({"must": [{"is_empty": {"key": "missing"}}, {"is_null": {"key": "n"}}]}))
                .eval(&id, &p)
        );
        assert!(
            f(json!({"must": [{"should": [{"key": "year", "match": {"value": 2005}}]}]}))
                .eval(&id, &p)
        );
        assert!(f(json!({})).is_trivial());
        assert!(!f(json!({"min_should": {"conditions": [], "min_count": 1}})).is_trivial());
        // A single condition in place of a list, as Qdrant accepts.
        assert!(f(json!({"must": {"key": "city", "match": {"value": "Berlin"}}})).eval(&id, &p));
    }

    #[test]
    fn bad_filters_name_the_problem() {
        let err = |v: Value| Filter::parse(&v).unwrap_err().to_string();
        assert!(err(json!({"must": [{"key": "a", "regex": "x"}]}))
            .contains("unknown condition operator \"regex\""));
        assert!(err(json!({"mus": []})).contains("unknown filter clause \"mus\""));
        assert!(
            err(json!({"must": [{"key": "a", "range": {"gt": "x"}}]})).contains("must be a number")
        );
        assert!(err(json!({"must": [{"key": "a", "match": {"text": 1}}]})).contains("string"));
        assert!(err(json!({"must": [{"key": "a", "match": {"prefix": "x"}}]})).contains("prefix"));
        assert!(err(json!({"must": [{"key": "a[", "match": {"value": 1}}]}))
            .contains("not a valid key path"));
        assert!(
            err(json!({"min_should": {"conditions": [], "min_count": 0}})).contains("min_count")
        );
        assert!(err(json!({"must": [{"nested": {"key": "a"}}]})).contains("needs a filter"));
        assert!(
            err(json!({"must": [{"key": "a", "range": {"around": 1}}]})).contains("unknown bound")
        );
        assert!(err(json!({"must": [{"geo_radius": {}}]})).contains("not supported"));
        assert!(err(json!("x")).contains("must be an object"));
        assert!(err(json!({"must": [{"match": {"value": 1}}]})).contains("needs a \"key\""));
        let mut deep = json!({"must": []});
        for _ in 0..40 {
            deep = json!({"must": [deep]});
        }
        assert!(err(deep).contains("deeper"));
    }

    #[test]
    fn qdrant_semantics_of_the_wider_conditions() {
        let id = ExtId::Num(3);
        let p = json!({
            "title": "The Quick brown-fox", "n": 2.0, "i": 2, "b": true,
            "tags": ["x", null], "empty": [], "meta": {"topic": "rust", "lang": ["en", "de"]},
            "items": [{"k": 1, "v": "a"}, {"k": 2, "v": "b"}], "obj": {"k": 1}
        });
        let yes = |v: Value| assert!(f(v.clone()).eval(&id, &p), "{v}");
        let no = |v: Value| assert!(!f(v.clone()).eval(&id, &p), "{v}");
        // Nested keys and arrays.
        yes(json!({"must": [{"key": "meta.topic", "match": {"value": "rust"}}]}));
        yes(json!({"must": [{"key": "meta.lang", "match": {"value": "de"}}]}));
        yes(json!({"must": [{"key": "meta.lang[]", "match": {"value": "de"}}]}));
        yes(json!({"must": [{"key": "items[].k", "range": {"gte": 2}}]}));
        no(json!({"must": [{"key": "items.k", "range": {"gte": 2}}]}));
        yes(json!({"must": [{"key": "items[1].v", "match": {"value": "b"}}]}));
        // A float never matches an integer; a boolean is not a number.
        no(json!({"must": [{"key": "n", "match": {"value": 2}}]}));
        yes(json!({"must": [{"key": "i", "match": {"value": 2}}]}));
        no(json!({"must": [{"key": "b", "range": {"gte": 0}}]}));
        // except: a non-null value outside the list; an absent key fails.
        no(json!({"must": [{"key": "missing", "match": {"except": ["x"]}}]}));
        yes(json!({"must": [{"key": "tags", "match": {"except": ["y"]}}]}));
        no(json!({"must": [{"key": "meta.lang", "match": {"except": ["en", "de"]}}]}));
        // Text: whole words, any order, lower-cased.
        yes(json!({"must": [{"key": "title", "match": {"text": "fox QUICK"}}]}));
        no(json!({"must": [{"key": "title", "match": {"text": "qui"}}]}));
        no(json!({"must": [{"key": "title", "match": {"text": ""}}]}));
        yes(json!({"must": [{"key": "title", "match": {"text_any": "cat fox"}}]}));
        yes(json!({"must": [{"key": "title", "match": {"phrase": "brown fox"}}]}));
        no(json!({"must": [{"key": "title", "match": {"phrase": "fox brown"}}]}));
        // is_null: a null or an array holding one; is_empty: nothing,
        // nulls or empty arrays.
        yes(json!({"must": [{"is_null": {"key": "tags"}}]}));
        no(json!({"must": [{"is_null": {"key": "missing"}}]}));
        yes(json!({"must": [{"is_empty": {"key": "empty"}}, {"is_empty": {"key": "missing"}}]}));
        no(json!({"must": [{"is_empty": {"key": "tags"}}]}));
        // values_count.
        yes(json!({"must": [{"key": "meta.lang", "values_count": {"gte": 2}}]}));
        no(json!({"must": [{"key": "obj", "values_count": {"gt": 1}}]}));
        // nested: one element passes the whole filter.
        yes(
            json!({"must": [{"nested": {"key": "items", "filter": {"must": [
            {"key": "k", "match": {"value": 2}}, {"key": "v", "match": {"value": "b"}}]}}}]}),
        );
        no(
            json!({"must": [{"nested": {"key": "items[]", "filter": {"must": [
            {"key": "k", "match": {"value": 1}}, {"key": "v", "match": {"value": "b"}}]}}}]}),
        );
        no(
            json!({"must": [{"nested": {"key": "obj", "filter": {"must": [
            {"key": "k", "match": {"value": 1}}]}}}]}),
        );
        no(json!({"must": [{"nested": {"key": "items", "filter": {"must": [{"has_id": [3]}]}}}]}));
        // min_should.
        let three = json!([{"key": "i", "match": {"value": 2}}, {"has_id": [3]},
            {"key": "meta.topic", "match": {"value": "go"}}]);
        yes(json!({"min_should": {"conditions": three, "min_count": 2}}));
        no(json!({"min_should": {"conditions": three, "min_count": 3}}));
    }
}
