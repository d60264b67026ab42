//! `vectide runbook`: a big-ann-benchmarks streaming runbook on native engines.
//!
//! The runbook format and its checks are those of the Python module
//! `vectide.runbook` (same rules, same error messages): YAML, one top-level
//! key per dataset holding `max_pts` and steps numbered `1..N` (`gt_url` is
//! ignored), each with an `operation`:
//!
//! - `insert` / `delete`: `start`, `end` — rows `start..end`, ids = row numbers;
//! - `search`: no fields — the dataset's queries against the active set;
//! - `replace`: `tags_start`, `tags_end`, `ids_start`, `ids_end` — the active
//!   ids `tags_start..tags_end` take the vectors of rows `ids_start..ids_end`.
//!
//! [`parse`] reads the bytes of the file through `serde_norway` (its
//! recursion and alias-repetition limits, plus a node budget here, so a
//! hostile file is an error, never a panic or an exhausted memory) and
//! [`check`] replays the runbook over the dataset's rows before anything
//! runs: the first problem is an error naming the step (exit code 2, no
//! output file).
//!
//! The run mirrors `python -m vectide.bench runbook` (its JSON keys), with
//! the timed loops native: for each engine a fresh index with `threads =
//! --update-threads`, then the steps in order — insert (rows as f32, ids =
//! row numbers), delete, replace (an upsert: the engine contract's insert
//! replaces an existing id), search (the first `--queries` queries, one
//! `search_into` per query from one thread into a reused buffer, each query
//! timed). Ground truth of each search step is exact over the active set,
//! computed before any engine runs with the registry's exact in-memory
//! engine (batched search), once per distinct active set, shared by every
//! engine and excluded from every timing.

use crate::bench::{engine_name, machine_info, param_json, rss_bytes, utc_now};
use crate::dataset::{self, Dataset};
use clap::Args;
use serde::de::{self, DeserializeSeed, Deserializer, EnumAccess, MapAccess, SeqAccess, Visitor};
use serde_json::{json, Value};
use std::cell::Cell;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Instant;
use vectide_core::eval::recall_at_k;
use vectide_core::{EngineDescriptor, Knob, Neighbor, SearchParams, RESERVED_ID};
use vectide_engines::{AnyIndex, ParamValue, Params};

/// The operations of a runbook, in the order error messages list them.
pub const OPERATIONS: [&str; 4] = ["insert", "delete", "search", "replace"];
/// The largest runbook file read (big-ann-benchmarks' largest are a few MB).
const MAX_FILE_BYTES: u64 = 64 << 20;
/// The most YAML nodes a runbook may hold once its aliases are expanded.
const MAX_NODES: usize = 8 << 20;

/// The build parameters every run gives the engines that take them (by
/// schema): the Vamana family's R, L and alpha (FreshDiskANN §6.2) and the
/// HNSW family's M and efConstruction, as the Python runner does.
const VAMANA_FAMILY: [(&str, f64); 3] = [("r", 64.0), ("l_build", 75.0), ("alpha", 1.2)];
const HNSW_FAMILY: [(&str, f64); 2] = [("m", 16.0), ("ef_construction", 200.0)];

const POLICY: &str = "the engine's own: deletes are lazy and consolidation runs inside the delete \
     or insert call once the deleted fraction reaches consolidate_fraction (engine parameter)";
const SECONDS_DEFINITION: &str =
    "sum of the engine's operation times (inserts, deletes, replaces, \
     searches), each call timed natively; consolidation runs inside those calls; ground truth and \
     data loading excluded";
const MEMORY_METHOD: &str = "the engine's own memory figure (stats memory_bytes) after the step; \
     where an engine reports none, VmRSS from /proc/self/status minus VmRSS before the engine was \
     created";

#[derive(Args, Debug)]
pub struct RunbookArgs {
    /// Dataset name (e.g. clustered-20k-32-angular), an ann-benchmarks HDF5
    /// file, or a directory of exported sidecars (`docs/format-vbin.md`).
    #[arg(long)]
    dataset: String,
    /// The runbook YAML file (big-ann-benchmarks layout).
    #[arg(long)]
    runbook: PathBuf,
    /// The top-level key of the runbook to run when the file holds several.
    #[arg(long = "runbook-dataset")]
    runbook_dataset: Option<String>,
    /// Comma-separated engines (`NAME` or `vectide:NAME`; in-memory ones).
    /// Default: every registered in-memory engine with a search knob.
    #[arg(long)]
    engines: Option<String>,
    /// Neighbours per query.
    #[arg(long, default_value_t = 10)]
    k: usize,
    /// The value of each engine's primary search knob (ef, L), fixed for
    /// the run; an engine without a knob is searched without one.
    #[arg(long, default_value_t = 100)]
    knob: usize,
    /// Threads of inserts, deletes and replaces (searches use one thread).
    #[arg(long = "update-threads", default_value_t = 2)]
    update_threads: usize,
    /// Queries per search step (the first N of the dataset's).
    #[arg(long, default_value_t = 1000)]
    queries: usize,
    /// Output JSON file (written only when every engine has run).
    #[arg(long)]
    out: PathBuf,
}

/// Why `vectide runbook` failed: its input (exit code 2, nothing ran) or
/// a run (exit code 1).
#[derive(Debug)]
pub enum Failure {
    Input(String),
    Run(String),
}

impl Failure {
    pub fn exit_code(&self) -> u8 {
        match self {
            Failure::Input(_) => 2,
            Failure::Run(_) => 1,
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Input(m) | Failure::Run(m) => f.write_str(m),
        }
    }
}

/// A runbook that cannot run on the dataset; the message names the step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunbookError(pub String);

impl fmt::Display for RunbookError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn fail<T>(msg: impl Into<String>) -> Result<T, RunbookError> {
    Err(RunbookError(msg.into()))
}

// ---------------------------------------------------------------------------
// YAML: a tree of nodes that keeps duplicate keys (to name them) and counts
// what it builds (aliases are expanded by the parser, each expansion counts).

#[derive(Debug, Clone, PartialEq)]
enum Node {
    Null,
    Bool(bool),
    Int(i128),
    Float(f64),
    Str(String),
    Seq(Vec<Node>),
    Map(Vec<(Node, Node)>),
}

impl Node {
    fn is(&self, name: &str) -> bool {
        matches!(self, Node::Str(s) if s == name)
    }
}

/// Python's `repr` of a parsed value, as the Python module's messages show it.
fn repr(n: &Node) -> String {
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
fn repr_str(s: &str) -> String {
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
fn py_str(n: &Node) -> String {
    match n {
        Node::Str(s) => s.clone(),
        other => repr(other),
    }
}

/// A Python list of strings, sorted: `['a', 'b']`.
fn py_sorted_list(mut items: Vec<String>) -> String {
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

fn parse_yaml(bytes: &[u8]) -> Result<Node, RunbookError> {
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

// ---------------------------------------------------------------------------
// The runbook as written, and its check against a dataset.

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
    fn name(&self) -> &'static str {
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

/// Reads a runbook file (at most [`MAX_FILE_BYTES`]) and parses it.
pub fn load(path: &Path, key: Option<&str>) -> Result<Runbook, RunbookError> {
    use std::io::Read;
    let err = |e: std::io::Error| RunbookError(format!("{}: {e}", path.display()));
    let file = std::fs::File::open(path).map_err(err)?;
    let mut bytes = Vec::new();
    file.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(err)?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return fail(format!(
            "{}: larger than {} MiB; not a runbook",
            path.display(),
            MAX_FILE_BYTES >> 20
        ));
    }
    parse(&bytes, key).map_err(|e| RunbookError(format!("{}: {e}", path.display())))
}

// ---------------------------------------------------------------------------
// The run.

/// One engine as it will run.
struct Engine {
    /// `vectide:NAME`, the key of its results.
    key: String,
    desc: &'static EngineDescriptor,
    params: Params,
    search: SearchParams,
    knob: Option<Knob>,
}

fn check_args(args: &RunbookArgs) -> Result<(), String> {
    use vectide_core::limits::{self, check_range};
    (|| -> vectide_core::Result<()> {
        check_range("--k", args.k, 1, limits::MAX_K)?;
        check_range("--knob", args.knob, 1, limits::MAX_EF)?;
        check_range(
            "--update-threads",
            args.update_threads,
            1,
            limits::MAX_THREADS,
        )?;
        check_range("--queries", args.queries, 1, usize::MAX)
    })()
    .map_err(|e| e.to_string())
}

/// The build parameters of an engine: `threads`, the family parameters its
/// schema takes, and `l_search` = `--knob` where it takes one.
fn build_params(desc: &EngineDescriptor, args: &RunbookArgs) -> Params {
    let mut params = Params::new();
    params.insert(
        "threads".into(),
        ParamValue::Int(args.update_threads as i64),
    );
    for (name, value) in VAMANA_FAMILY.iter().chain(HNSW_FAMILY.iter()) {
        if let Some(spec) = desc.param(name) {
            let value = match spec.kind {
                vectide_engines::ParamKind::Float { .. } => ParamValue::Float(*value),
                _ => ParamValue::Int(*value as i64),
            };
            params.insert(name.to_string(), value);
        }
    }
    if desc.param("l_search").is_some() {
        params.insert("l_search".into(), ParamValue::Int(args.knob as i64));
    }
    params
}

/// The engines asked for (default: every in-memory engine with a knob).
fn engines(args: &RunbookArgs) -> Result<Vec<Engine>, String> {
    let specs: Vec<String> = match &args.engines {
        Some(list) => list
            .split(',')
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect(),
        None => vectide_engines::REGISTRY
            .iter()
            .filter(|d| !d.persistence.in_directory() && d.primary_knob.is_some())
            .map(|d| d.name.to_string())
            .collect(),
    };
    if specs.is_empty() {
        return Err("--engines names no engine".into());
    }
    let mut out: Vec<Engine> = Vec::new();
    for spec in &specs {
        let name = engine_name(spec);
        let desc = vectide_engines::descriptor(&name).map_err(|e| e.to_string())?;
        if desc.persistence.in_directory() {
            return Err(format!(
                "engine {name} lives in a directory; runbooks drive in-memory engines"
            ));
        }
        let key = format!("vectide:{name}");
        if out.iter().any(|e| e.key == key) {
            return Err(format!("engine {key} is listed twice"));
        }
        let mut search = SearchParams::default();
        if let Some(knob) = desc.primary_knob {
            search
                .set(knob, args.knob)
                .map_err(|e| format!("{key}: --knob: {e}"))?;
        }
        out.push(Engine {
            key,
            desc,
            params: build_params(desc, args),
            search,
            knob: desc.primary_knob,
        });
    }
    Ok(out)
}

/// Exact top-k of every query at one active set (`k` ids per query, fewer
/// than asked when the active set is smaller).
struct Truth {
    k: usize,
    ids: Vec<u64>,
}

/// The registry's exact in-memory engine (the one without a search knob).
fn exact_engine() -> Result<&'static EngineDescriptor, String> {
    vectide_engines::REGISTRY
        .iter()
        .copied()
        .find(|d| d.primary_knob.is_none() && !d.persistence.in_directory())
        .ok_or_else(|| "no exact in-memory engine is registered for the ground truth".into())
}

/// Rows of the dataset as one slice (`r` within the dataset, checked).
fn rows<'a>(ds: &'a Dataset, r: &Range<usize>) -> &'a [f32] {
    &ds.train[r.start * ds.dim..r.end * ds.dim]
}

fn ids(r: &Range<usize>) -> Vec<u64> {
    (r.start as u64..r.end as u64).collect()
}

/// Ground truth of every search step (`None` where the active set is
/// empty): the exact engine mirrors the runbook, and each distinct active
/// set (ids and the rows they hold) is searched once, batched.
fn ground_truth(
    ds: &Dataset,
    plan: &Plan,
    nq: usize,
    k: usize,
    threads: usize,
) -> Result<Vec<Option<Rc<Truth>>>, String> {
    use std::hash::{DefaultHasher, Hash, Hasher};
    const NONE: usize = usize::MAX;
    let exact = exact_engine()?;
    let mut params = Params::new();
    params.insert("threads".into(), ParamValue::Int(threads as i64));
    let metric = ds.metric()?;
    let index = vectide_engines::create(exact.name, ds.dim, metric, &params)
        .map_err(|e| format!("ground truth ({}): {e}", exact.name))?;
    let queries = &ds.test[..nq * ds.dim];
    let mut row_of = vec![NONE; ds.n_train()];
    let mut live = 0usize;
    let mut seen: HashMap<(u64, u64), Rc<Truth>> = HashMap::new();
    let mut last: Option<Option<Rc<Truth>>> = None;
    let mut out = Vec::with_capacity(plan.counts.search);
    let bar = crate::progress(plan.counts.search as u64, "truth");
    for (i, op) in plan.ops.iter().enumerate() {
        let seq = i as u64 + 1;
        let err = |e: vectide_core::Error| {
            format!(
                "ground truth ({}): step {} ({}): {e}",
                exact.name,
                i + 1,
                op.name()
            )
        };
        match op {
            Op::Insert(r) => {
                index.insert(seq, &ids(r), rows(ds, r)).map_err(err)?;
                r.clone().for_each(|id| row_of[id] = id);
                live += r.len();
            }
            Op::Delete(r) => {
                index.delete(seq, &ids(r)).map_err(err)?;
                row_of[r.clone()].fill(NONE);
                live -= r.len();
            }
            Op::Replace { tags, rows: from } => {
                index.insert(seq, &ids(tags), rows(ds, from)).map_err(err)?;
                tags.clone()
                    .zip(from.clone())
                    .for_each(|(id, row)| row_of[id] = row);
            }
            Op::Search => {}
        }
        if !matches!(op, Op::Search) {
            last = None; // the active set may have changed
            continue;
        }
        if let Some(t) = &last {
            out.push(t.clone());
            bar.inc(1);
            continue;
        }
        let truth = if live == 0 {
            None
        } else {
            let (mut a, mut b) = (DefaultHasher::new(), DefaultHasher::new());
            0x5eed_u64.hash(&mut b);
            for (id, &row) in row_of.iter().enumerate().filter(|(_, &r)| r != NONE) {
                (id, row).hash(&mut a);
                (id, row).hash(&mut b);
            }
            let key = (a.finish(), b.finish());
            if let Some(t) = seen.get(&key) {
                Some(t.clone())
            } else {
                let kk = k.min(live);
                let found = index
                    .search_batch(queries, kk, &SearchParams::default(), None)
                    .map_err(err)?;
                let mut ids = vec![RESERVED_ID; nq * kk];
                for (q, hits) in found.iter().enumerate() {
                    for (j, n) in hits.iter().take(kk).enumerate() {
                        ids[q * kk + j] = n.id;
                    }
                }
                let t = Rc::new(Truth { k: kk, ids });
                seen.insert(key, t.clone());
                Some(t)
            }
        };
        last = Some(truth.clone());
        out.push(truth);
        bar.inc(1);
    }
    bar.finish_and_clear();
    eprintln!(
        "ground truth: {} search steps, {} distinct active sets ({})",
        plan.counts.search,
        seen.len(),
        exact.name
    );
    Ok(out)
}

/// `q`-quantile of sorted values, linear between ranks (numpy's default).
fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let pos = q * (sorted.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64)
}

/// Runs the plan on one engine; returns its result document.
fn run_engine(
    e: &Engine,
    ds: &Dataset,
    plan: &Plan,
    truth: &[Option<Rc<Truth>>],
    nq: usize,
    k: usize,
) -> Result<Value, String> {
    let name = e.desc.name;
    let metric = ds.metric()?;
    let rss0 = rss_bytes();
    let index: AnyIndex = vectide_engines::create(name, ds.dim, metric, &e.params)
        .map_err(|err| format!("{}: {err}", e.key))?;
    let bar = crate::progress(plan.ops.len() as u64, &e.key);
    let mut steps: Vec<Value> = Vec::with_capacity(plan.ops.len());
    let mut totals: BTreeMap<&str, f64> = ["insert", "delete", "replace", "search"]
        .into_iter()
        .map(|op| (op, 0.0))
        .collect();
    let mut recalls: Vec<f64> = Vec::new();
    let mut peak_memory = 0u64;
    let mut out: Vec<Neighbor> = Vec::with_capacity(k);
    let mut found = vec![RESERVED_ID; nq * k];
    let mut latencies: Vec<f64> = Vec::with_capacity(nq);
    let mut search_no = 0usize;
    for (i, op) in plan.ops.iter().enumerate() {
        let num = i + 1;
        let seq = num as u64;
        let err =
            |err: vectide_core::Error| format!("{}: step {num} ({}): {err}", e.key, op.name());
        let mut row = serde_json::Map::new();
        row.insert("step".into(), json!(num));
        row.insert("operation".into(), json!(op.name()));
        let points = match op {
            Op::Insert(r) => {
                let (ids, x) = (ids(r), rows(ds, r));
                let t0 = Instant::now();
                index.insert(seq, &ids, x).map_err(err)?;
                Some((r.len(), t0.elapsed().as_secs_f64()))
            }
            Op::Delete(r) => {
                let ids = ids(r);
                let t0 = Instant::now();
                index.delete(seq, &ids).map_err(err)?;
                Some((r.len(), t0.elapsed().as_secs_f64()))
            }
            Op::Replace { tags, rows: from } => {
                // An upsert: insert replaces the vector of an existing id.
                let (ids, x) = (ids(tags), rows(ds, from));
                let t0 = Instant::now();
                index.insert(seq, &ids, x).map_err(err)?;
                Some((tags.len(), t0.elapsed().as_secs_f64()))
            }
            Op::Search => None,
        };
        if let Some((count, secs)) = points {
            *totals.entry(op.name()).or_default() += secs;
            row.insert("points".into(), json!(count));
            row.insert("seconds".into(), json!(secs));
            row.insert(
                "points_per_s".into(),
                json!((secs > 0.0).then(|| count as f64 / secs)),
            );
        } else {
            found.fill(RESERVED_ID);
            latencies.clear();
            for (q, query) in ds.test.chunks_exact(ds.dim).take(nq).enumerate() {
                let t0 = Instant::now();
                let res = index.search_into(query, k, &e.search, None, &mut out);
                latencies.push(t0.elapsed().as_secs_f64());
                res.map_err(err)?;
                for (j, n) in out.iter().take(k).enumerate() {
                    found[q * k + j] = n.id;
                }
            }
            let total: f64 = latencies.iter().sum();
            *totals.entry("search").or_default() += total;
            let (recall, recall5) = match &truth[search_no] {
                Some(t) => {
                    let at = |kk: usize| {
                        recall_at_k(found.chunks_exact(k), t.ids.chunks_exact(t.k), kk)
                            .map_err(|err| format!("{}: step {num}: {err}", e.key))
                    };
                    (Some(at(t.k)?), if t.k >= 5 { Some(at(5)?) } else { None })
                }
                None => (None, None), // an empty active set: nothing to find
            };
            search_no += 1;
            if let Some(r) = recall {
                recalls.push(r);
            }
            let mut sorted = latencies.clone();
            sorted.sort_by(f64::total_cmp);
            row.insert("recall".into(), json!(recall));
            row.insert("recall5at5".into(), json!(recall5));
            row.insert(
                "qps".into(),
                json!((total > 0.0).then(|| nq as f64 / total)),
            );
            row.insert("mean_latency_us".into(), json!(1e6 * total / nq as f64));
            row.insert(
                "p99_latency_us".into(),
                json!(1e6 * quantile(&sorted, 0.99)),
            );
            row.insert("seconds".into(), json!(total));
        }
        // Untimed: what the step left in memory.
        let stats = index.stats().map_err(err)?;
        let rss = match (rss0, rss_bytes()) {
            (Some(a), Some(b)) => Some(b.saturating_sub(a)),
            _ => None,
        };
        let memory = if stats.memory_bytes > 0 {
            stats.memory_bytes as u64
        } else {
            rss.unwrap_or(0)
        };
        peak_memory = peak_memory.max(memory);
        row.insert("memory_bytes".into(), json!(memory));
        row.insert("rss_delta_bytes".into(), json!(rss));
        row.insert(
            "engine_stats".into(),
            json!({
                "live": stats.live,
                "slots_used": stats.slots_used,
                "capacity": stats.capacity,
                "pending_deletes": stats.pending_deletes,
                "consolidations": stats.consolidations,
                "memory_bytes": stats.memory_bytes,
            }),
        );
        let recall = row.get("recall").and_then(Value::as_f64);
        let qps = row.get("qps").and_then(Value::as_f64);
        steps.push(Value::Object(row));
        bar.inc(1);
        if matches!(op, Op::Search) && bar.is_hidden() {
            // Not a terminal: a line per search step.
            eprintln!(
                "{}: step {num}/{}: recall@{k} {}, {:.0} qps, memory {:.0} MB",
                e.key,
                plan.ops.len(),
                recall.map_or("-".to_string(), |r| format!("{r:.4}")),
                qps.unwrap_or(0.0),
                memory as f64 / 1e6
            );
        }
    }
    bar.finish_and_clear();
    let mut params = serde_json::Map::new();
    params.insert("engine".into(), json!(name));
    params.insert("version".into(), json!(env!("CARGO_PKG_VERSION")));
    params.insert("simd".into(), json!(vectide_core::distance::active_isa()));
    for (k, v) in index.params() {
        params.insert(k, param_json(v));
    }
    let search_knob = match e.knob.and_then(|kn| e.search.get(kn).map(|v| (kn, v))) {
        Some((kn, v)) => json!({ kn.name(): v }),
        None => json!({}),
    };
    let avg = (!recalls.is_empty()).then(|| recalls.iter().sum::<f64>() / recalls.len() as f64);
    let min = recalls.iter().copied().reduce(f64::min);
    Ok(json!({
        "params": params,
        "consolidation_policy": POLICY,
        "search_knob": search_knob,
        "calibration": null,
        "steps": steps,
        "avg_recall": avg,
        "min_recall": min,
        "seconds": totals.values().sum::<f64>(),
        "seconds_by_operation": totals,
        "peak_memory_bytes": peak_memory,
    }))
}

/// `vectide runbook`.
pub fn run(args: &RunbookArgs) -> Result<(), Failure> {
    use Failure::{Input, Run};
    check_args(args).map_err(Input)?;
    let engines = engines(args).map_err(Input)?;
    let rb = load(&args.runbook, args.runbook_dataset.as_deref()).map_err(|e| Input(e.0))?;
    let ds = dataset::load(&args.dataset).map_err(Input)?;
    let metric = ds.metric().map_err(Input)?;
    let plan = check(&rb, ds.n_train()).map_err(|e| {
        Input(format!(
            "{}: {e} (dataset {}, {} rows)",
            args.runbook.display(),
            ds.name,
            ds.n_train()
        ))
    })?;
    for e in &engines {
        vectide_engines::validate(e.desc.name, ds.dim, &e.params)
            .map_err(|err| Input(format!("{}: {err}", e.key)))?;
    }
    if let Some(dir) = args.out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| Input(format!("{}: {e}", dir.display())))?;
    }
    let nq = args.queries.min(ds.n_test());
    let c = &plan.counts;
    eprintln!(
        "{}: {} rows, {nq} queries, dim {}, {}; runbook {} ({} steps: {} insert, {} delete, \
         {} replace, {} search; peak {} active); engines {} (simd: {})",
        ds.name,
        ds.n_train(),
        ds.dim,
        metric.name(),
        plan.dataset,
        plan.ops.len(),
        c.insert,
        c.delete,
        c.replace,
        c.search,
        c.peak_active,
        engines
            .iter()
            .map(|e| e.key.as_str())
            .collect::<Vec<_>>()
            .join(","),
        vectide_core::distance::active_isa()
    );
    let truth = ground_truth(&ds, &plan, nq, args.k, args.update_threads).map_err(Run)?;
    let mut results = serde_json::Map::new();
    println!(
        "{:<22} {:>10} {:>10} {:>10} {:>12}",
        "engine",
        format!("recall@{}", args.k),
        "min",
        "seconds",
        "peak_MB"
    );
    for e in &engines {
        let t0 = Instant::now();
        let r = run_engine(e, &ds, &plan, &truth, nq, args.k).map_err(Run)?;
        let fmt = |v: Option<f64>| v.map_or("-".to_string(), |x| format!("{x:.4}"));
        println!(
            "{:<22} {:>10} {:>10} {:>10.2} {:>12.1}",
            e.key,
            fmt(r["avg_recall"].as_f64()),
            fmt(r["min_recall"].as_f64()),
            r["seconds"].as_f64().unwrap_or(0.0),
            r["peak_memory_bytes"].as_f64().unwrap_or(0.0) / 1e6
        );
        eprintln!(
            "{}: {:.2} s of operations ({:.0} s wall)",
            e.key,
            r["seconds"].as_f64().unwrap_or(0.0),
            t0.elapsed().as_secs_f64()
        );
        results.insert(e.key.clone(), r);
    }
    let by = |field: &str| -> serde_json::Map<String, Value> {
        results
            .iter()
            .map(|(k, r)| (k.clone(), r[field].clone()))
            .collect()
    };
    let mut summary = serde_json::Map::new();
    summary.insert(
        format!("avg_recall{}", args.k),
        Value::Object(by("avg_recall")),
    );
    summary.insert("seconds".into(), Value::Object(by("seconds")));
    summary.insert(
        "peak_memory_bytes".into(),
        Value::Object(by("peak_memory_bytes")),
    );
    let file = std::fs::canonicalize(&args.runbook).unwrap_or_else(|_| args.runbook.clone());
    let doc = json!({
        "benchmark": "runbook",
        "query_loop": "native (vectide runbook): one search_into call per query",
        "dataset": ds.name,
        "dataset_path": args.dataset,
        "metric": metric.name(),
        "runbook": {
            "file": file.display().to_string(),
            "dataset_key": plan.dataset,
            "max_pts": plan.max_pts,
            "steps": plan.ops.len(),
            "insert": c.insert,
            "delete": c.delete,
            "replace": c.replace,
            "search": c.search,
            "peak_active": c.peak_active,
        },
        "k": args.k,
        "queries_per_search": nq,
        "threads": {"updates": args.update_threads, "searches": 1},
        "build_params": {
            "vamana_family": VAMANA_FAMILY.iter().map(|(k, v)| (k.to_string(), json!(v))).collect::<serde_json::Map<_, _>>(),
            "hnsw_family": HNSW_FAMILY.iter().map(|(k, v)| (k.to_string(), json!(*v as u64))).collect::<serde_json::Map<_, _>>(),
        },
        "search_knob": {"L_or_ef": args.knob},
        "ground_truth": format!("exact ({}), batched, once per distinct active set", exact_engine().map_or("?", |d| d.name)),
        "policies": results.keys().map(|k| (k.clone(), json!(POLICY))).collect::<serde_json::Map<_, _>>(),
        "seconds_definition": SECONDS_DEFINITION,
        "memory_method": MEMORY_METHOD,
        "machine": machine_info(),
        "simd": vectide_core::distance::active_isa(),
        "date": utc_now(),
        "engines": results,
        "summary": summary,
    });
    let text = serde_json::to_string_pretty(&doc).map_err(|e| Run(e.to_string()))?;
    vectide_core::io::atomic_write(&args.out, |w| {
        w.write_all(text.as_bytes())?;
        w.write_all(b"\n")?;
        Ok(())
    })
    .map_err(|e| Run(format!("{}: {e}", args.out.display())))?;
    eprintln!("wrote {}", args.out.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn err(text: &str) -> String {
        parse(text.as_bytes(), None).unwrap_err().0
    }

    fn check_err(text: &str, n: usize) -> String {
        check(&parse(text.as_bytes(), None).unwrap(), n)
            .unwrap_err()
            .0
    }

    const GOOD: &str = "\
ds:
  max_pts: 100
  gt_url: https://example.invalid/gt
  1: {operation: insert, start: 0, end: 80}
  '2': {operation: search}
  3:
    operation: delete
    start: 10
    end: 20
  4: {operation: replace, tags_start: 20, tags_end: 30, ids_start: 100, ids_end: 110}
  5: {operation: insert, start: 80, end: 100}
  6: {operation: search}
";

    #[test]
    fn parses_and_checks_a_runbook() {
        let rb = parse(GOOD.as_bytes(), None).unwrap();
        assert_eq!(rb.dataset, "ds");
        assert_eq!(rb.max_pts, 100);
        assert_eq!(rb.steps.len(), 6);
        assert_eq!(rb.steps[1], Step::Search);
        assert_eq!(
            rb.steps[3],
            Step::Replace {
                tags_start: 20,
                tags_end: 30,
                ids_start: 100,
                ids_end: 110
            }
        );
        let plan = check(&rb, 200).unwrap();
        assert_eq!(
            plan.counts,
            Counts {
                insert: 2,
                delete: 1,
                search: 2,
                replace: 1,
                peak_active: 90
            }
        );
        assert_eq!(plan.ops[0], Op::Insert(0..80));
        assert_eq!(
            plan.ops[3],
            Op::Replace {
                tags: 20..30,
                rows: 100..110
            }
        );
        // Steps in any order in the file run in numeric order.
        let shuffled = "ds:\n  2: {operation: search}\n  max_pts: 5\n  1: {operation: insert, start: 0, end: 5}\n";
        let rb = parse(shuffled.as_bytes(), None).unwrap();
        assert_eq!(rb.steps[0], Step::Insert { start: 0, end: 5 });
    }

    #[test]
    fn the_top_level_names_datasets() {
        assert!(err("").contains("a runbook is a mapping"), "{}", err(""));
        assert!(err("[1, 2]").contains("a runbook is a mapping"));
        assert!(err("{}").contains("a runbook is a mapping"));
        assert!(err("ds: [").starts_with("not YAML"), "{}", err("ds: ["));
        assert!(err("a: 1\n---\nb: 2\n").starts_with("not YAML"));
        let two = "b: {max_pts: 1}\na: {max_pts: 2, 1: {operation: search}}\n";
        assert_eq!(
            err(two),
            "the file holds runbooks for ['a', 'b']: name one (--runbook-dataset)"
        );
        let rb = parse(two.as_bytes(), Some("a")).unwrap();
        assert_eq!((rb.max_pts, rb.steps.len()), (2, 1));
        assert_eq!(
            parse(two.as_bytes(), Some("c")).unwrap_err().0,
            "no runbook for dataset 'c'; the file has ['a', 'b']"
        );
        assert_eq!(
            err("a: {max_pts: 1}\na: {max_pts: 2}\n"),
            "the runbook of 'a' appears twice"
        );
    }

    #[test]
    fn max_pts_and_step_numbering() {
        assert_eq!(err("ds: 3"), "ds: max_pts is missing");
        assert_eq!(
            err("ds: {1: {operation: search}}"),
            "ds: max_pts is missing"
        );
        assert_eq!(
            err("ds: {max_pts: '10'}"),
            "ds: max_pts must be an integer, got '10'"
        );
        assert_eq!(
            err("ds: {max_pts: 1, max_pts: 2}"),
            "ds: max_pts appears twice"
        );
        assert_eq!(
            err("ds: {max_pts: 1, steps: 2}"),
            "ds: unknown key 'steps' (steps are numbered 1, 2, …)"
        );
        assert_eq!(
            err("ds: {max_pts: 1, true: 2}"),
            "ds: unknown key True (steps are numbered 1, 2, …)"
        );
        assert_eq!(
            err("ds: {max_pts: 1, 1: {operation: search}, '1': {operation: search}}"),
            "ds: step 1 appears twice"
        );
        assert_eq!(
            err("ds: {max_pts: 1, 2: {operation: search}, 2: {operation: search}}"),
            "ds: step 2 appears twice"
        );
        assert_eq!(
            err("ds: {max_pts: 1, 1: {operation: search}, 3: {operation: search}}"),
            "ds: steps must be numbered 1..2 without gaps"
        );
        assert_eq!(
            err("ds: {max_pts: 1, 0: {operation: search}}"),
            "ds: steps must be numbered 1..1 without gaps"
        );
        assert_eq!(
            err("ds: {max_pts: 1, '99999999999999999999999999999999999999999999': {operation: search}}"),
            "ds: steps must be numbered 1..1 without gaps"
        );
        // No steps at all is a runbook that does nothing.
        assert!(parse(b"ds: {max_pts: 1}", None).unwrap().steps.is_empty());
    }

    #[test]
    fn step_errors_name_the_step() {
        let step = |s: &str| {
            err(&format!(
                "ds:\n  max_pts: 10\n  1: {{operation: search}}\n  2: {s}\n"
            ))
        };
        assert_eq!(step("7"), "step 2: no operation");
        assert_eq!(step("{start: 1}"), "step 2: no operation");
        assert_eq!(
            step("{operation: upsert}"),
            "step 2: unknown operation 'upsert' (known: insert, delete, search, replace)"
        );
        assert_eq!(
            step("{operation: 5}"),
            "step 2: unknown operation 5 (known: insert, delete, search, replace)"
        );
        assert_eq!(
            step("{operation: search, start: 1}"),
            "step 2 (search): unknown field(s) ['start']"
        );
        assert_eq!(
            step("{operation: insert, start: 1, end: 2, stop: 3, 4: 5}"),
            "step 2 (insert): unknown field(s) ['4', 'stop']"
        );
        assert_eq!(
            step("{operation: replace, tags_start: 1, tags_end: 2}"),
            "step 2 (replace): missing ['ids_end', 'ids_start']"
        );
        assert_eq!(
            step("{operation: delete, start: 1, start: 2, end: 3}"),
            "step 2 (delete): field 'start' appears twice"
        );
        for (v, shown) in [
            ("'3'", "'3'"),
            ("3.5", "3.5"),
            ("true", "True"),
            ("null", "None"),
            ("[3]", "[3]"),
            ("{a: 1}", "{'a': 1}"),
        ] {
            assert_eq!(
                step(&format!("{{operation: insert, start: 1, end: {v}}}")),
                format!("step 2: end must be an integer, got {shown}")
            );
        }
        assert!(step("{operation: !custom insert, start: 1, end: 2}").contains("tags"));
    }

    #[test]
    fn the_check_names_the_step_of_the_first_problem() {
        let rb = |steps: &str| format!("ds:\n  max_pts: 50\n{steps}");
        assert_eq!(
            check_err(&rb(""), 20),
            "max_pts 50 must be in 1..=20 (the dataset's rows)"
        );
        assert_eq!(
            check_err("ds: {max_pts: 0}", 20),
            "max_pts 0 must be in 1..=20 (the dataset's rows)"
        );
        let one = |s: &str| {
            check_err(
                &rb(&format!(
                    "  1: {{operation: insert, start: 0, end: 10}}\n  2: {s}\n"
                )),
                100,
            )
        };
        assert_eq!(
            one("{operation: insert, start: 5, end: 5}"),
            "step 2 (insert): range 5..5 is empty or outside 0..100"
        );
        assert_eq!(
            one("{operation: insert, start: -1, end: 5}"),
            "step 2 (insert): range -1..5 is empty or outside 0..100"
        );
        assert_eq!(
            one("{operation: delete, start: 90, end: 101}"),
            "step 2 (delete): range 90..101 is empty or outside 0..100"
        );
        assert_eq!(
            one("{operation: insert, start: 8, end: 12}"),
            "step 2 (insert 8..12): ids already active from an earlier insert, first 8"
        );
        assert_eq!(
            one("{operation: delete, start: 5, end: 15}"),
            "step 2 (delete 5..15): ids never inserted or deleted already, first 10"
        );
        assert_eq!(
            one("{operation: replace, tags_start: 0, tags_end: 5, ids_start: 50, ids_end: 56}"),
            "step 2 (replace): 5 tags but 6 rows"
        );
        assert_eq!(
            one("{operation: replace, tags_start: 5, tags_end: 15, ids_start: 50, ids_end: 60}"),
            "step 2 (replace): id 10 is not active"
        );
        assert_eq!(
            one("{operation: replace, tags_start: 0, tags_end: 5, ids_start: 99, ids_end: 104}"),
            "step 2 (replace ids): range 99..104 is empty or outside 0..100"
        );
        assert_eq!(
            one("{operation: replace, tags_start: 5, tags_end: 0, ids_start: 0, ids_end: 5}"),
            "step 2 (replace tags): range 5..0 is empty or outside 0..100"
        );
        assert_eq!(
            one("{operation: insert, start: 10, end: 51}"),
            "step 2: 51 points active, more than max_pts 50"
        );
        // A delete then an insert of the same rows is fine; deleting twice is not.
        let again = rb("  1: {operation: insert, start: 0, end: 10}\n  2: {operation: delete, start: 0, end: 10}\n  3: {operation: insert, start: 0, end: 10}\n  4: {operation: delete, start: 0, end: 10}\n  5: {operation: delete, start: 0, end: 1}\n");
        assert_eq!(
            check_err(&again, 100),
            "step 5 (delete 0..1): ids never inserted or deleted already, first 0"
        );
    }

    #[test]
    fn hostile_yaml_is_an_error() {
        // Deep nesting: the parser's recursion limit.
        let deep = format!("ds: {}1{}", "[".repeat(100_000), "]".repeat(100_000));
        assert!(err(&deep).starts_with("not YAML"));
        let deep_map = "a: ".repeat(10_000);
        assert!(parse(deep_map.as_bytes(), None).is_err());
        let indented: String = (0..300).map(|i| format!("{}a:\n", " ".repeat(i))).collect();
        assert!(
            err(&indented).contains("recursion limit"),
            "{}",
            err(&indented)
        );
        let flow = format!("ds: {}1{}", "[".repeat(120), "]".repeat(120));
        assert!(err(&flow).contains("max_pts is missing"), "{}", err(&flow));
        // Billion laughs: alias expansion is bounded.
        let mut bomb = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 1..12 {
            let p = i - 1;
            bomb += &format!("a{i}: &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n");
        }
        assert!(err(&bomb).starts_with("not YAML"), "{}", err(&bomb));
        // Not UTF-8, NUL bytes, a recursive alias.
        assert!(parse(&[0xff, 0xfe, 0x00, 0x41], None).is_err());
        assert!(parse(b"a: &x [*x]", None).is_err());
        // An alias to a step is a step like any other.
        let aliased = "ds:\n  max_pts: 5\n  1: &s {operation: search}\n  2: *s\n";
        assert_eq!(parse(aliased.as_bytes(), None).unwrap().steps.len(), 2);
    }

    /// A runbook's YAML from (operation, four small integers).
    fn yaml_of(max_pts: i64, steps: &[(u8, [i64; 4])]) -> String {
        let mut y = format!("ds:\n  max_pts: {max_pts}\n");
        for (i, (op, v)) in steps.iter().enumerate() {
            let body = match op % 4 {
                0 => format!("{{operation: insert, start: {}, end: {}}}", v[0], v[1]),
                1 => format!("{{operation: delete, start: {}, end: {}}}", v[0], v[1]),
                2 => "{operation: search}".to_string(),
                _ => format!(
                    "{{operation: replace, tags_start: {}, tags_end: {}, ids_start: {}, ids_end: {}}}",
                    v[0], v[1], v[2], v[3]
                ),
            };
            y += &format!("  {}: {body}\n", i + 1);
        }
        y
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            if let Ok(rb) = parse(&bytes, None) {
                let _ = check(&rb, 100);
            }
        }

        #[test]
        fn garbled_runbooks_never_panic(
            edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0u8..3), 1..8),
        ) {
            let mut bytes = GOOD.as_bytes().to_vec();
            for (at, byte, kind) in edits {
                let i = at.index(bytes.len() + 1);
                match kind {
                    0 if i < bytes.len() => bytes[i] = byte,
                    1 => bytes.insert(i, byte),
                    _ => bytes.truncate(i),
                }
            }
            if let Ok(rb) = parse(&bytes, None) {
                let _ = check(&rb, 150);
            }
        }

        /// Random runbooks of small ranges: the check never panics, and a
        /// runbook it accepts keeps every invariant when replayed.
        #[test]
        fn the_check_accepts_only_consistent_runbooks(
            max_pts in -2i64..40,
            steps in proptest::collection::vec((any::<u8>(), [-3i64..45, -3i64..45, -3i64..45, -3i64..45]), 0..24),
        ) {
            let n = 40usize;
            let rb = parse(yaml_of(max_pts, &steps).as_bytes(), None).unwrap();
            prop_assert_eq!(rb.steps.len(), steps.len());
            match check(&rb, n) {
                Ok(plan) => {
                    let mut active = vec![false; n];
                    for op in &plan.ops {
                        match op {
                            Op::Insert(r) => { prop_assert!(active[r.clone()].iter().all(|a| !a)); active[r.clone()].fill(true); }
                            Op::Delete(r) => { prop_assert!(active[r.clone()].iter().all(|&a| a)); active[r.clone()].fill(false); }
                            Op::Replace { tags, rows } => {
                                prop_assert!(active[tags.clone()].iter().all(|&a| a));
                                prop_assert_eq!(tags.len(), rows.len());
                                prop_assert!(!rows.is_empty() && rows.end <= n);
                            }
                            Op::Search => {}
                        }
                        prop_assert!(active.iter().filter(|&&a| a).count() <= plan.max_pts);
                    }
                }
                Err(e) => prop_assert!(e.0.starts_with("step ") || e.0.starts_with("max_pts "), "{}", e.0),
            }
        }
    }
}
