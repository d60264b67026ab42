//! The runbook as written: [`parse`] reads the YAML into [`Runbook`] (steps
//! with their integers as written; the check judges ranges).

use super::yaml::{parse_yaml, py_sorted_list, py_str, repr, repr_str, Node};
use super::{fail, RunbookError, OPERATIONS};
use std::collections::{BTreeMap, HashMap};

/// One step as written (integers as they are: the check judges ranges).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    Insert {
        start: i128,
        end: i128,
    },
    Delete {
        start: i128,
        end: i128,
    },
    Search,
    Replace {
        tags_start: i128,
        tags_end: i128,
        ids_start: i128,
        ids_end: i128,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Runbook {
    /// The top-level key it was read from.
    pub dataset: String,
    pub max_pts: i128,
    pub steps: Vec<Step>,
}

fn int(v: &Node, what: &str) -> Result<i128, RunbookError> {
    match v {
        Node::Int(i) => Ok(*i),
        other => fail(format!("{what} must be an integer, got {}", repr(other))),
    }
}

/// The fields of an operation besides `operation`.
fn fields_of(op: &str) -> &'static [&'static str] {
    match op {
        "insert" | "delete" => &["start", "end"],
        "replace" => &["tags_start", "tags_end", "ids_start", "ids_end"],
        _ => &[],
    }
}

/// Parses runbook YAML bytes; `key` picks the top-level key (the only one
/// when `None`).
pub fn parse(bytes: &[u8], key: Option<&str>) -> Result<Runbook, RunbookError> {
    let Node::Map(datasets) = parse_yaml(bytes)? else {
        return fail("a runbook is a mapping from a dataset name to its steps");
    };
    if datasets.is_empty() {
        return fail("a runbook is a mapping from a dataset name to its steps");
    }
    for (i, (name, _)) in datasets.iter().enumerate() {
        if datasets[..i].iter().any(|(other, _)| other == name) {
            return fail(format!("the runbook of {} appears twice", repr(name)));
        }
    }
    let names = || py_sorted_list(datasets.iter().map(|(k, _)| py_str(k)).collect());
    let (name, body) = match key {
        None if datasets.len() != 1 => {
            return fail(format!(
                "the file holds runbooks for {}: name one (--runbook-dataset)",
                names()
            ))
        }
        None => &datasets[0],
        Some(key) => match datasets.iter().find(|(k, _)| k.is(key)) {
            Some(found) => found,
            None => {
                return fail(format!(
                    "no runbook for dataset {}; the file has {}",
                    repr_str(key),
                    names()
                ))
            }
        },
    };
    let dataset = py_str(name);
    let Node::Map(body) = body else {
        return fail(format!("{dataset}: max_pts is missing"));
    };
    let mut max_pts = None;
    for (k, v) in body {
        if k.is("max_pts") && max_pts.replace(v).is_some() {
            return fail(format!("{dataset}: max_pts appears twice"));
        }
    }
    let Some(max_pts) = max_pts else {
        return fail(format!("{dataset}: max_pts is missing"));
    };
    let max_pts = int(max_pts, &format!("{dataset}: max_pts"))?;
    let mut numbered: BTreeMap<i128, &Node> = BTreeMap::new();
    for (k, v) in body {
        if k.is("max_pts") || k.is("gt_url") {
            continue;
        }
        let num = match k {
            Node::Int(i) => *i,
            Node::Str(s) if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) => {
                // More digits than an i128 holds: a gap in any case.
                s.parse().unwrap_or(i128::MAX)
            }
            other => {
                return fail(format!(
                    "{dataset}: unknown key {} (steps are numbered 1, 2, …)",
                    repr(other)
                ))
            }
        };
        if numbered.insert(num, v).is_some() {
            return fail(format!("{dataset}: step {num} appears twice"));
        }
    }
    let n = numbered.len();
    if !numbered.keys().copied().eq(1..=n as i128) {
        return fail(format!(
            "{dataset}: steps must be numbered 1..{n} without gaps"
        ));
    }
    let steps = numbered
        .into_iter()
        .map(|(num, s)| parse_step(num, s))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Runbook {
        dataset,
        max_pts,
        steps,
    })
}

fn parse_step(num: i128, s: &Node) -> Result<Step, RunbookError> {
    let Node::Map(fields) = s else {
        return fail(format!("step {num}: no operation"));
    };
    let Some((_, op)) = fields.iter().find(|(k, _)| k.is("operation")) else {
        return fail(format!("step {num}: no operation"));
    };
    let op = match op {
        Node::Str(op) if OPERATIONS.contains(&op.as_str()) => op.as_str(),
        other => {
            return fail(format!(
                "step {num}: unknown operation {} (known: {})",
                repr(other),
                OPERATIONS.join(", ")
            ))
        }
    };
    for (i, (k, _)) in fields.iter().enumerate() {
        if fields[..i].iter().any(|(other, _)| other == k) {
            return fail(format!(
                "step {num} ({op}): field {} appears twice",
                repr(k)
            ));
        }
    }
    let allowed = fields_of(op);
    let extra: Vec<String> = fields
        .iter()
        .filter(|(k, _)| !k.is("operation") && !allowed.iter().any(|a| k.is(a)))
        .map(|(k, _)| py_str(k))
        .collect();
    if !extra.is_empty() {
        return fail(format!(
            "step {num} ({op}): unknown field(s) {}",
            py_sorted_list(extra)
        ));
    }
    let missing: Vec<String> = allowed
        .iter()
        .filter(|a| !fields.iter().any(|(k, _)| k.is(a)))
        .map(|a| a.to_string())
        .collect();
    if !missing.is_empty() {
        return fail(format!(
            "step {num} ({op}): missing {}",
            py_sorted_list(missing)
        ));
    }
    // Values in the order written, as the Python reader checks them.
    let mut values = HashMap::new();
    for (k, v) in fields {
        if let Node::Str(name) = k {
            if name != "operation" {
                values.insert(name.as_str(), int(v, &format!("step {num}: {name}"))?);
            }
        }
    }
    let get = |name: &str| values[name];
    Ok(match op {
        "insert" => Step::Insert {
            start: get("start"),
            end: get("end"),
        },
        "delete" => Step::Delete {
            start: get("start"),
            end: get("end"),
        },
        "replace" => Step::Replace {
            tags_start: get("tags_start"),
            tags_end: get("tags_end"),
            ids_start: get("ids_start"),
            ids_end: get("ids_end"),
        },
        _ => Step::Search,
    })
}
