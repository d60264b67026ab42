//! Payload filters in Qdrant's JSON shape, parsed into a [`Filter`] tree and
//! evaluated against payload documents.
//!
//! ```json
//! {"must": [{"key": "city", "match": {"value": "Berlin"}}],
//!  "should": [{"key": "year", "range": {"gte": 2000, "lt": 2010}}],
//!  "must_not": [{"has_id": [1, 2]}]}
//! ```
//!
//! Conditions: `match` with `value` (equality on a keyword, integer or
//! bool), `any` (one of) or `except` (none of); `range` with `gt`, `gte`,
//! `lt`, `lte`; `has_id`; `is_empty`; `is_null`; and a nested filter. A key may
//! be a dotted path (`"address.city"`); when the path reaches an array, the
//! condition holds if it holds for any element (Qdrant's convention). `should`
//! holds when at least one of its conditions does (or it is empty); `must`
//! when all do; `must_not` when none does. Anything else is an error naming
//! the offending part.

use crate::error::{DbError, Result};
use crate::ids::ExtId;
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

    /// Whether a payload value equals this scalar.
    pub fn matches(&self, v: &Value) -> bool {
        match (self, v) {
            (Scalar::Str(a), Value::String(b)) => a == b,
            (Scalar::Bool(a), Value::Bool(b)) => a == b,
            (Scalar::Int(a), Value::Number(n)) => n.as_i64() == Some(*a),
            _ => false,
        }
    }
}

/// Bounds of a `range` condition.
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

/// One condition.
#[derive(Debug, Clone, PartialEq)]
pub enum Condition {
    Match { key: String, value: Scalar },
    Any { key: String, values: Vec<Scalar> },
    Except { key: String, values: Vec<Scalar> },
    Range { key: String, range: Range },
    HasId(Vec<ExtId>),
    IsEmpty { key: String },
    IsNull { key: String },
    Nested(Box<Filter>),
}

/// A boolean combination of conditions.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Filter {
    pub must: Vec<Condition>,
    pub should: Vec<Condition>,
    pub must_not: Vec<Condition>,
}

fn list<'a>(
    obj: &'a serde_json::Map<String, Value>,
    name: &str,
    at: &str,
) -> Result<Vec<&'a Value>> {
    match obj.get(name) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(a)) => Ok(a.iter().collect()),
        // Qdrant also accepts a single condition in place of a list.
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

fn key_of(obj: &serde_json::Map<String, Value>, at: &str) -> Result<String> {
    match obj.get("key") {
        Some(Value::String(k)) if !k.is_empty() => Ok(k.clone()),
        Some(other) => Err(DbError::invalid(format!(
            "{at}.key must be a non-empty string, got {other}"
        ))),
        None => Err(DbError::invalid(format!(
            "{at}: a field condition needs a \"key\""
        ))),
    }
}

impl Filter {
    /// Parses a filter from Qdrant's JSON shape.
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
                    "{at}: unknown filter clause {k:?} (known: must, should, must_not)"
                )));
            }
        }
        if obj.get("min_should").is_some_and(|v| !v.is_null()) {
            return Err(DbError::invalid(format!(
                "{at}: min_should is not supported"
            )));
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
        Ok(f)
    }

    /// Evaluates the filter for a point (`id`) with payload `p`.
    pub fn eval(&self, id: &ExtId, p: &Value) -> bool {
        self.must.iter().all(|c| c.eval(id, p))
            && (self.should.is_empty() || self.should.iter().any(|c| c.eval(id, p)))
            && !self.must_not.iter().any(|c| c.eval(id, p))
    }

    /// Whether the filter accepts every point.
    pub fn is_trivial(&self) -> bool {
        self.must.is_empty() && self.should.is_empty() && self.must_not.is_empty()
    }
}

impl Condition {
    fn parse(v: &Value, at: &str, depth: usize) -> Result<Condition> {
        let obj = v
            .as_object()
            .ok_or_else(|| DbError::invalid(format!("{at} must be an object, got {v}")))?;
        if obj.contains_key("must") || obj.contains_key("should") || obj.contains_key("must_not") {
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
                .collect::<Result<Vec<_>>>()?;
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
        if obj.contains_key("nested")
            || obj.contains_key("geo_bounding_box")
            || obj.contains_key("geo_radius")
            || obj.contains_key("values_count")
            || obj.contains_key("datetime_range")
            || obj.contains_key("geo_polygon")
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
        for k in obj.keys() {
            if !matches!(k.as_str(), "key" | "match" | "range") {
                return Err(DbError::invalid(format!(
                    "{at}: unknown condition operator {k:?} (known: match, range, has_id, is_empty, is_null)"
                )));
            }
        }
        if let Some(m) = obj.get("match") {
            let mo = m
                .as_object()
                .ok_or_else(|| DbError::invalid(format!("{at}.match must be an object")))?;
            let scalars = |name: &str| -> Result<Vec<Scalar>> {
                let arr = mo[name]
                    .as_array()
                    .ok_or_else(|| DbError::invalid(format!("{at}.match.{name} must be a list")))?;
                arr.iter()
                    .enumerate()
                    .map(|(i, x)| Scalar::from_json(x, &format!("{at}.match.{name}[{i}]")))
                    .collect()
            };
            if let Some(v) = mo.get("value") {
                return Ok(Condition::Match {
                    key,
                    value: Scalar::from_json(v, &format!("{at}.match.value"))?,
                });
            }
            if mo.contains_key("any") {
                return Ok(Condition::Any {
                    key,
                    values: scalars("any")?,
                });
            }
            if mo.contains_key("except") {
                return Ok(Condition::Except {
                    key,
                    values: scalars("except")?,
                });
            }
            let which = mo.keys().next().cloned().unwrap_or_default();
            return Err(DbError::invalid(format!(
                "{at}.match: unknown or unsupported form {which:?} (known: value, any, except)"
            )));
        }
        if let Some(r) = obj.get("range") {
            let ro = r
                .as_object()
                .ok_or_else(|| DbError::invalid(format!("{at}.range must be an object")))?;
            let mut range = Range::default();
            for (k, v) in ro {
                let x = number(v, &format!("{at}.range.{k}"))?;
                match k.as_str() {
                    "gt" => range.gt = x,
                    "gte" => range.gte = x,
                    "lt" => range.lt = x,
                    "lte" => range.lte = x,
                    other => {
                        return Err(DbError::invalid(format!(
                            "{at}.range: unknown bound {other:?} (known: gt, gte, lt, lte)"
                        )))
                    }
                }
            }
            return Ok(Condition::Range { key, range });
        }
        Err(DbError::invalid(format!(
            "{at}: condition on {key:?} has no match or range"
        )))
    }

    fn eval(&self, id: &ExtId, p: &Value) -> bool {
        match self {
            Condition::Match { key, value } => any_value(p, key, &mut |v| value.matches(v)),
            Condition::Any { key, values } => {
                any_value(p, key, &mut |v| values.iter().any(|s| s.matches(v)))
            }
            Condition::Except { key, values } => {
                // Qdrant: true when the field holds a value outside the list
                // (or is absent).
                let mut seen = false;
                let hit = any_value(p, key, &mut |v| {
                    seen = true;
                    !values.iter().any(|s| s.matches(v))
                });
                hit || !seen
            }
            Condition::Range { key, range } => any_value(p, key, &mut |v| {
                v.as_f64().is_some_and(|x| range.contains(x))
            }),
            Condition::HasId(ids) => ids.contains(id),
            Condition::IsEmpty { key } => {
                let mut non_empty = false;
                any_value(p, key, &mut |v| {
                    non_empty |= !v.is_null();
                    false
                });
                !non_empty
            }
            Condition::IsNull { key } => lookup(p, key).is_some_and(|v| v.is_null()),
            Condition::Nested(f) => f.eval(id, p),
        }
    }
}

/// The value at a dotted path (no array flattening).
fn lookup<'a>(p: &'a Value, key: &str) -> Option<&'a Value> {
    key.split('.').try_fold(p, |v, part| v.get(part))
}

/// Calls `f` on every value a dotted path reaches (flattening arrays at any
/// step); returns whether `f` returned true for one of them.
pub fn any_value(p: &Value, key: &str, f: &mut dyn FnMut(&Value) -> bool) -> bool {
    fn walk(v: &Value, parts: &[&str], f: &mut dyn FnMut(&Value) -> bool) -> bool {
        match (parts.split_first(), v) {
            (_, Value::Array(items)) => items.iter().any(|x| walk(x, parts, f)),
            (None, v) => f(v),
            (Some((head, rest)), Value::Object(o)) => {
                o.get(*head).is_some_and(|x| walk(x, rest, f))
            }
            _ => false,
        }
    }
    let parts: Vec<&str> = key.split('.').collect();
    walk(p, &parts, f)
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
        assert!(err(json!({"must": [{"key": "a", "match": {"text": "x"}}]})).contains("text"));
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
}
