//! Concurrent histories and their check against a recovered index.
//!
//! Several writers issue upserts and deletes of the same small set of labels.
//! Every operation is recorded twice on one logical clock: when it is
//! invoked (before the engine sees it) and when it is acknowledged (after the
//! call returned). A crash leaves some operations acknowledged and at most
//! one per writer in flight.
//!
//! After recovery each label must hold the effect of one operation that may
//! linearise last among those on that label:
//! - an acknowledged operation (or the state the round started from), unless
//!   another acknowledged operation on the label was invoked after it was
//!   acknowledged: that one is strictly later in real time and wins;
//! - any operation in flight at the crash (it may or may not have happened,
//!   and may order after anything it overlapped).
//!
//! The state found is then taken as the start of the next round, so an
//! operation in flight at one crash that a later acknowledged operation
//! overwrote can never come back: its vector is nowhere among the next
//! round's candidates.

use crate::subject::Subject;
use crate::workload::Model;
use std::collections::{BTreeSet, HashMap};
use vectide_core::Seq;

/// `None` when `label` maps to exactly `vec` and searching `vec` finds the
/// label at rank 1; else what is wrong.
pub fn find_label(idx: &dyn Subject, label: u64, vec: &[f32]) -> Option<String> {
    match idx.vector_of(label) {
        Err(e) => Some(format!("label {label}: read failed: {e}")),
        Ok(None) => Some(format!("label {label} missing")),
        Ok(Some(got)) if got != vec => Some(format!("label {label} maps to another vector")),
        Ok(Some(_)) => match idx.nearest(vec) {
            Ok(Some(n)) if n == label => None,
            Ok(_) => Some(format!(
                "label {label} not found at rank 1 by its own vector"
            )),
            Err(e) => Some(format!("label {label}: search failed: {e}")),
        },
    }
}

/// Where the writers take their sequence numbers from after an open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeqFrom {
    /// From the index's `durable_seq()`, counting up: what a client without
    /// a log of its own does (the Python `vectide.Index`).
    Durable,
    /// Above every number ever issued (the harness remembers them).
    Fresh,
}

impl SeqFrom {
    pub fn name(self) -> &'static str {
        match self {
            SeqFrom::Durable => "durable",
            SeqFrom::Fresh => "fresh",
        }
    }

    pub fn parse(s: &str) -> Option<SeqFrom> {
        match s {
            "durable" => Some(SeqFrom::Durable),
            "fresh" => Some(SeqFrom::Fresh),
            _ => None,
        }
    }
}

/// One operation of a concurrent history.
#[derive(Debug, Clone)]
pub struct HOp {
    pub round: usize,
    pub thread: usize,
    /// The operation's number in its writer.
    pub k: u64,
    pub label: u64,
    /// `Some`: upsert with this vector; `None`: delete.
    pub vector: Option<Vec<f32>>,
    pub seq: Seq,
    /// Clock value at invocation and at acknowledgement.
    pub inv: u64,
    pub ack: Option<u64>,
}

impl HOp {
    fn describe(&self) -> String {
        format!(
            "{} of round {} (writer {}, op {}, seq {}, {})",
            if self.vector.is_some() {
                "upsert"
            } else {
                "delete"
            },
            self.round,
            self.thread,
            self.k,
            self.seq,
            if self.ack.is_some() {
                "acknowledged"
            } else {
                "in flight at the crash"
            }
        )
    }
}

/// A history being recorded (behind a mutex when writers share it).
#[derive(Debug, Clone, Default)]
pub struct History {
    pub ops: Vec<HOp>,
    clock: u64,
}

impl History {
    /// Records an invocation; returns the operation's index for [`History::ack`].
    #[allow(clippy::too_many_arguments)]
    pub fn invoke(
        &mut self,
        round: usize,
        thread: usize,
        k: u64,
        label: u64,
        vector: Option<Vec<f32>>,
        seq: Seq,
    ) -> usize {
        self.clock += 1;
        self.ops.push(HOp {
            round,
            thread,
            k,
            label,
            vector,
            seq,
            inv: self.clock,
            ack: None,
        });
        self.ops.len() - 1
    }

    pub fn ack(&mut self, i: usize) {
        self.clock += 1;
        self.ops[i].ack = Some(self.clock);
    }

    /// Per writer thread, the label of its last operation when that one was
    /// never acknowledged (it was in flight at the crash): the next round
    /// retries it first, so that in-flight operations overlap across restarts.
    pub fn in_flight_labels(&self, threads: usize) -> Vec<Option<u64>> {
        (0..threads)
            .map(|t| {
                self.ops
                    .iter()
                    .rev()
                    .find(|o| o.thread == t)
                    .filter(|o| o.ack.is_none())
                    .map(|o| o.label)
            })
            .collect()
    }
}

/// Every vector ever written per label, for naming a wrong one.
#[derive(Debug, Default)]
pub struct Past {
    written: HashMap<u64, Vec<(String, Vec<f32>)>>,
}

impl Past {
    fn name(&self, label: u64, v: &[f32]) -> String {
        self.written
            .get(&label)
            .and_then(|w| w.iter().rev().find(|(_, x)| x == v))
            .map_or_else(
                || "a vector no operation wrote".to_string(),
                |(d, _)| format!("the vector of the {d}"),
            )
    }
}

/// What one round's check found.
#[derive(Debug, Clone, Default)]
pub struct RoundCheck {
    pub violations: Vec<String>,
    pub acked: usize,
    pub in_flight: usize,
    /// In-flight operations whose effect is what recovery left.
    pub in_flight_applied: usize,
    pub labels_checked: usize,
    /// Every sequence number up to here was acknowledged in the round.
    pub acked_prefix: Seq,
}

/// Counts a run sums over its checked rounds (the simulator and the kill
/// test report the same ones).
#[derive(Debug, Clone, Default)]
pub struct Tally {
    /// Operations acknowledged before their round's crash, and in flight at it.
    pub acked: usize,
    pub in_flight: usize,
    /// In-flight operations recovery completed (the rest it discarded).
    pub in_flight_applied: usize,
    /// Most operations in flight at one crash.
    pub max_in_flight: usize,
    /// Label states checked (every label of the set, every round).
    pub labels_checked: usize,
    pub violating_rounds: usize,
}

impl Tally {
    /// Adds a round's check; its first violations, each described by `at`,
    /// go to `violations` (40 at most in all).
    pub fn add(
        &mut self,
        rc: RoundCheck,
        violations: &mut Vec<String>,
        at: impl Fn(&str) -> String,
    ) {
        self.acked += rc.acked;
        self.in_flight += rc.in_flight;
        self.in_flight_applied += rc.in_flight_applied;
        self.max_in_flight = self.max_in_flight.max(rc.in_flight);
        self.labels_checked += rc.labels_checked;
        if !rc.violations.is_empty() {
            self.violating_rounds += 1;
            for v in rc.violations.iter().take(4) {
                if violations.len() < 40 {
                    violations.push(at(v));
                }
            }
        }
    }
}

/// Checks a recovered index against the state the round started from
/// (`base`) and the round's history; `base` becomes the recovered state.
/// `opened_durable` is the index's `durable_seq()` when the round began.
pub fn check_round(
    idx: &dyn Subject,
    base: &mut Model,
    ops: &[HOp],
    opened_durable: Seq,
    past: &mut Past,
) -> RoundCheck {
    let mut rc = RoundCheck::default();
    let v = &mut rc.violations;
    match idx.check() {
        Ok(found) => v.extend(found.into_iter().map(|e| format!("structure: {e}"))),
        Err(e) => v.push(format!("structure check failed: {e}")),
    }
    let mut by_label: HashMap<u64, Vec<&HOp>> = HashMap::new();
    for op in ops {
        by_label.entry(op.label).or_default().push(op);
        if op.ack.is_some() {
            rc.acked += 1;
        } else {
            rc.in_flight += 1;
        }
    }
    // The durable watermark covers every operation of the round numbered
    // below the first one not acknowledged.
    let mut by_seq: Vec<&HOp> = ops.iter().collect();
    by_seq.sort_by_key(|o| o.seq);
    let prefix = by_seq
        .iter()
        .take_while(|o| o.ack.is_some())
        .last()
        .map_or(opened_durable, |o| o.seq.max(opened_durable));
    rc.acked_prefix = prefix;
    // (A database numbers operations itself: no watermark to check.)
    if let Some(durable) = idx.durable_seq().filter(|&d| d < prefix) {
        let missed: Vec<String> = ops
            .iter()
            .filter(|o| o.seq > durable && o.seq <= prefix)
            .map(HOp::describe)
            .collect();
        v.push(format!(
            "durable_seq {durable} below {prefix}, up to which every operation was acknowledged: {}",
            missed.join(", ")
        ));
    }
    let labels: BTreeSet<u64> = base.keys().chain(by_label.keys()).copied().collect();
    let mut found = Model::new();
    for label in labels {
        rc.labels_checked += 1;
        let mine = by_label.get(&label).map_or(&[][..], |v| &v[..]);
        let last_acked_inv = mine.iter().filter(|o| o.ack.is_some()).map(|o| o.inv).max();
        // Candidates: (effect, in flight?).
        let mut cands: Vec<(Option<&[f32]>, bool)> = Vec::new();
        if last_acked_inv.is_none() {
            cands.push((base.get(&label).map(|x| &x[..]), false));
        }
        for o in mine {
            match o.ack {
                None => cands.push((o.vector.as_deref(), true)),
                Some(a) if last_acked_inv.is_none_or(|i| i < a) => {
                    cands.push((o.vector.as_deref(), false))
                }
                Some(_) => {}
            }
        }
        let got = match idx.vector_of(label) {
            Ok(g) => g,
            Err(e) => {
                v.push(format!("label {label}: read failed: {e}"));
                continue;
            }
        };
        let hit = cands.iter().find(|(c, _)| *c == got.as_deref());
        match hit {
            Some(&(_, in_flight)) => {
                rc.in_flight_applied += usize::from(in_flight);
                if let Some(g) = &got {
                    if let Some(e) = find_label(idx, label, g) {
                        v.push(e);
                    }
                }
            }
            None => {
                let what = match &got {
                    None => "absent".to_string(),
                    Some(g) => format!("holds {}", past.name(label, g)),
                };
                let last = mine
                    .iter()
                    .filter(|o| o.ack.is_some())
                    .max_by_key(|o| o.inv)
                    .map_or_else(
                        || "no acknowledged operation this round".to_string(),
                        |o| format!("last acknowledged: {}", o.describe()),
                    );
                v.push(format!("label {label} {what}; {last}"));
            }
        }
        if let Some(g) = got {
            found.insert(label, g);
        }
    }
    if idx.len() != found.len() {
        v.push(format!(
            "{} live labels, expected {}",
            idx.len(),
            found.len()
        ));
    }
    for o in ops {
        if let Some(x) = &o.vector {
            past.written
                .entry(o.label)
                .or_default()
                .push((o.describe(), x.clone()));
        }
    }
    *base = found;
    rc
}
