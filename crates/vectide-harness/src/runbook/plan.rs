//! A runbook checked against a dataset: [`check`] replays it over the
//! dataset's rows before anything runs and returns the [`Plan`] that runs
//! as it is, or an error naming the step of the first problem.

use super::parse::{Runbook, Step};
use super::{fail, RunbookError};
use std::ops::Range;

/// A checked step, its ranges within the dataset's rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    Insert(Range<usize>),
    Delete(Range<usize>),
    Search,
    Replace {
        tags: Range<usize>,
        rows: Range<usize>,
    },
}

impl Op {
    pub fn name(&self) -> &'static str {
        match self {
            Op::Insert(_) => "insert",
            Op::Delete(_) => "delete",
            Op::Search => "search",
            Op::Replace { .. } => "replace",
        }
    }
}

/// Counts of a runbook's operations and its largest active set.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counts {
    pub insert: usize,
    pub delete: usize,
    pub search: usize,
    pub replace: usize,
    pub peak_active: usize,
}

/// A runbook checked against a dataset of `n` rows: it runs as it is.
#[derive(Debug, Clone)]
pub struct Plan {
    pub dataset: String,
    pub max_pts: usize,
    pub ops: Vec<Op>,
    pub counts: Counts,
}

/// Replays the runbook over `n` rows (see the module docs); the first
/// problem is an error naming its step.
pub fn check(rb: &Runbook, n: usize) -> Result<Plan, RunbookError> {
    if rb.max_pts < 1 || rb.max_pts > n as i128 {
        return fail(format!(
            "max_pts {} must be in 1..={n} (the dataset's rows)",
            rb.max_pts
        ));
    }
    let max_pts = rb.max_pts as usize;
    let range = |num: usize, what: &str, a: i128, b: i128| {
        if 0 <= a && a < b && b <= n as i128 {
            Ok(a as usize..b as usize)
        } else {
            fail(format!(
                "step {num} ({what}): range {a}..{b} is empty or outside 0..{n}"
            ))
        }
    };
    let mut active = vec![false; n];
    let mut live = 0usize;
    let mut counts = Counts::default();
    let mut ops = Vec::with_capacity(rb.steps.len());
    for (i, step) in rb.steps.iter().enumerate() {
        let num = i + 1;
        let op = match *step {
            Step::Insert { start, end } => {
                let r = range(num, "insert", start, end)?;
                if let Some(p) = active[r.clone()].iter().position(|&a| a) {
                    return fail(format!(
                        "step {num} (insert {start}..{end}): ids already active from an earlier \
                         insert, first {}",
                        r.start + p
                    ));
                }
                active[r.clone()].fill(true);
                live += r.len();
                counts.insert += 1;
                Op::Insert(r)
            }
            Step::Delete { start, end } => {
                let r = range(num, "delete", start, end)?;
                if let Some(p) = active[r.clone()].iter().position(|&a| !a) {
                    return fail(format!(
                        "step {num} (delete {start}..{end}): ids never inserted or deleted \
                         already, first {}",
                        r.start + p
                    ));
                }
                active[r.clone()].fill(false);
                live -= r.len();
                counts.delete += 1;
                Op::Delete(r)
            }
            Step::Replace {
                tags_start,
                tags_end,
                ids_start,
                ids_end,
            } => {
                let tags = range(num, "replace tags", tags_start, tags_end)?;
                let rows = range(num, "replace ids", ids_start, ids_end)?;
                if tags.len() != rows.len() {
                    return fail(format!(
                        "step {num} (replace): {} tags but {} rows",
                        tags.len(),
                        rows.len()
                    ));
                }
                if let Some(p) = active[tags.clone()].iter().position(|&a| !a) {
                    return fail(format!(
                        "step {num} (replace): id {} is not active",
                        tags.start + p
                    ));
                }
                counts.replace += 1;
                Op::Replace { tags, rows }
            }
            Step::Search => {
                counts.search += 1;
                Op::Search
            }
        };
        if live > max_pts {
            return fail(format!(
                "step {num}: {live} points active, more than max_pts {max_pts}"
            ));
        }
        counts.peak_active = counts.peak_active.max(live);
        ops.push(op);
    }
    Ok(Plan {
        dataset: rb.dataset.clone(),
        max_pts,
        ops,
        counts,
    })
}
