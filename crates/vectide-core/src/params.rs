//! Engine parameters as they arrive from Python, JSON or the command line,
//! and the schema each engine declares for them.
//!
//! An engine lists its parameters as [`ParamSpec`]s (name, type and range,
//! default, a one-line doc and where the default comes from). The registry
//! checks every incoming [`Params`] against that list with [`check_params`]
//! before the engine sees it: an unknown name is an error listing the known
//! ones, a value of the wrong type or outside its range is an error naming
//! the range. Engines then read the checked values with [`ParamsExt`].

use crate::error::{Error, Result};
use std::collections::BTreeMap;
use std::fmt;

/// A parameter value as it arrives from Python, JSON or the command line.
#[derive(Debug, Clone, PartialEq)]
pub enum ParamValue {
    Int(i64),
    Float(f64),
    Bool(bool),
    Str(String),
}

impl fmt::Display for ParamValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParamValue::Int(v) => write!(f, "{v}"),
            ParamValue::Float(v) => write!(f, "{v}"),
            ParamValue::Bool(v) => write!(f, "{v}"),
            ParamValue::Str(v) => write!(f, "{v:?}"),
        }
    }
}

impl ParamValue {
    /// Parses a command-line value: integer, float, `true`/`false`, else string.
    pub fn parse(text: &str) -> ParamValue {
        if let Ok(v) = text.parse::<i64>() {
            ParamValue::Int(v)
        } else if let Ok(v) = text.parse::<f64>() {
            ParamValue::Float(v)
        } else if let Ok(v) = text.parse::<bool>() {
            ParamValue::Bool(v)
        } else {
            ParamValue::Str(text.to_string())
        }
    }
}

/// Engine parameters by name.
pub type Params = BTreeMap<String, ParamValue>;

/// The type and range of one parameter.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ParamKind {
    /// An integer in `min..=max`.
    Int {
        min: i64,
        max: i64,
    },
    /// A number (an integer is accepted) in `min..=max`.
    Float {
        min: f64,
        max: f64,
    },
    Bool,
    /// One of the listed strings.
    Choice(&'static [&'static str]),
    /// A filesystem path (the directory of a durable engine).
    Path,
    /// A short text: 1 to 256 bytes, no control characters (an address,
    /// a region's name).
    Text,
}

impl fmt::Display for ParamKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParamKind::Int { min, max } => write!(f, "integer {min}..={max}"),
            ParamKind::Float { min, max } => write!(f, "number {min}..={max}"),
            ParamKind::Bool => write!(f, "boolean"),
            ParamKind::Choice(c) => write!(f, "one of {}", c.join(" | ")),
            ParamKind::Path => write!(f, "path"),
            ParamKind::Text => write!(f, "text"),
        }
    }
}

/// One parameter an engine takes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ParamSpec {
    pub name: &'static str,
    pub kind: ParamKind,
    /// The default as text (`""` when the parameter is required, `"auto"`
    /// when the engine derives it).
    pub default: &'static str,
    /// One line on what it does.
    pub doc: &'static str,
    /// Where the default comes from (a paper section, a library's default).
    pub source: &'static str,
}

impl ParamSpec {
    /// Checks one value against the spec; the error names the parameter and
    /// its type or range.
    pub fn check(&self, value: &ParamValue) -> Result<()> {
        let ok = match (self.kind, value) {
            (ParamKind::Int { min, max }, ParamValue::Int(v)) => (min..=max).contains(v),
            (ParamKind::Float { min, max }, ParamValue::Float(v)) => {
                v.is_finite() && *v >= min && *v <= max
            }
            (ParamKind::Float { min, max }, ParamValue::Int(v)) => {
                (*v as f64) >= min && (*v as f64) <= max
            }
            (ParamKind::Bool, ParamValue::Bool(_)) => true,
            (ParamKind::Choice(c), ParamValue::Str(s)) => c.contains(&s.as_str()),
            (ParamKind::Path, ParamValue::Str(_)) => true,
            (ParamKind::Text, ParamValue::Str(s)) => {
                (1..=256).contains(&s.len()) && !s.chars().any(char::is_control)
            }
            _ => false,
        };
        if ok {
            return Ok(());
        }
        let what = match self.kind {
            ParamKind::Int { min, max } => format!("an integer in {min}..={max}"),
            ParamKind::Float { min, max } => format!("a number in {min}..={max}"),
            ParamKind::Bool => "true or false".to_string(),
            ParamKind::Choice(c) => format!("one of {}", c.join(", ")),
            ParamKind::Path => "a path (string)".to_string(),
            ParamKind::Text => "a text of 1 to 256 bytes without control characters".to_string(),
        };
        Err(Error::invalid(format!(
            "parameter {} must be {what}, got {value}",
            self.name
        )))
    }
}

/// Checks every parameter of `params` against `specs` (the engine's schema).
/// Unknown names are an error listing the known ones; nothing is created.
pub fn check_params(engine: &str, specs: &[ParamSpec], params: &Params) -> Result<()> {
    let unknown: Vec<&str> = params
        .keys()
        .map(String::as_str)
        .filter(|k| !specs.iter().any(|s| s.name == *k))
        .collect();
    if !unknown.is_empty() {
        let mut known: Vec<&str> = specs.iter().map(|s| s.name).collect();
        known.sort_unstable();
        return Err(Error::invalid(format!(
            "unknown parameter(s) {} for engine {engine:?}; known: {}",
            unknown.join(", "),
            known.join(", ")
        )));
    }
    for (name, value) in params {
        if let Some(spec) = specs.iter().find(|s| s.name == name) {
            spec.check(value)?;
        }
    }
    Ok(())
}

/// Typed reads of parameters already checked by [`check_params`]. A value
/// of another type than asked (which the check rules out) reads as absent.
pub trait ParamsExt {
    fn int(&self, name: &str) -> Option<i64>;
    fn usize(&self, name: &str) -> Option<usize> {
        self.int(name).and_then(|v| usize::try_from(v).ok())
    }
    fn float(&self, name: &str) -> Option<f64>;
    fn string(&self, name: &str) -> Option<&str>;
}

impl ParamsExt for Params {
    fn int(&self, name: &str) -> Option<i64> {
        match self.get(name) {
            Some(ParamValue::Int(v)) => Some(*v),
            _ => None,
        }
    }
    fn float(&self, name: &str) -> Option<f64> {
        match self.get(name) {
            Some(ParamValue::Float(v)) => Some(*v),
            Some(ParamValue::Int(v)) => Some(*v as f64),
            _ => None,
        }
    }
    fn string(&self, name: &str) -> Option<&str> {
        match self.get(name) {
            Some(ParamValue::Str(v)) => Some(v),
            _ => None,
        }
    }
}

/// Builds a [`Params`] from `(name, value)` pairs.
pub fn params_of<'a>(pairs: impl IntoIterator<Item = (&'a str, ParamValue)>) -> Params {
    pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPECS: &[ParamSpec] = &[
        ParamSpec {
            name: "m",
            kind: ParamKind::Int { min: 2, max: 256 },
            default: "16",
            doc: "degree",
            source: "test",
        },
        ParamSpec {
            name: "alpha",
            kind: ParamKind::Float { min: 1.0, max: 2.0 },
            default: "1.2",
            doc: "pruning",
            source: "test",
        },
        ParamSpec {
            name: "persist",
            kind: ParamKind::Choice(&["pmem", "msync"]),
            default: "pmem",
            doc: "media",
            source: "test",
        },
    ];

    #[test]
    fn parses_cli_values() {
        assert_eq!(ParamValue::parse("16"), ParamValue::Int(16));
        assert_eq!(ParamValue::parse("0.5"), ParamValue::Float(0.5));
        assert_eq!(ParamValue::parse("true"), ParamValue::Bool(true));
        assert_eq!(ParamValue::parse("x"), ParamValue::Str("x".into()));
    }

    #[test]
    fn checks_names_types_and_ranges() {
        let ok = params_of([
            ("m", ParamValue::Int(8)),
            ("alpha", ParamValue::Int(1)),
            ("persist", ParamValue::Str("msync".into())),
        ]);
        check_params("e", SPECS, &ok).unwrap();
        assert_eq!(ok.usize("m"), Some(8));
        assert_eq!(ok.float("alpha"), Some(1.0));
        assert_eq!(ok.string("persist"), Some("msync"));
        assert_eq!(ok.int("absent"), None);

        let cases: &[(&str, ParamValue, &str)] = &[
            (
                "M",
                ParamValue::Int(8),
                "unknown parameter(s) M for engine \"e\"; known: alpha, m, persist",
            ),
            (
                "m",
                ParamValue::Int(1),
                "m must be an integer in 2..=256, got 1",
            ),
            (
                "m",
                ParamValue::Float(8.0),
                "m must be an integer in 2..=256",
            ),
            ("m", ParamValue::Str("8".into()), "got \"8\""),
            (
                "alpha",
                ParamValue::Float(f64::NAN),
                "alpha must be a number in 1..=2",
            ),
            ("alpha", ParamValue::Bool(true), "alpha must be a number"),
            (
                "persist",
                ParamValue::Str("disk".into()),
                "one of pmem, msync",
            ),
        ];
        for (name, value, want) in cases {
            let e = check_params("e", SPECS, &params_of([(*name, value.clone())])).unwrap_err();
            assert!(matches!(e, Error::InvalidInput(_)));
            assert!(e.to_string().contains(want), "{name}={value}: {e}");
        }
    }
}
