//! The crash-state test harness behind `vectide crash-test p-hnsw` and the
//! crate's crash tests.
//!
//! A seeded workload (a base batch, then single-row inserts, upserts and
//! deletes) runs on the crash simulator. A dry run first counts the fences of
//! every operation and the reference recall after each; then the workload
//! runs again with crash points spread uniformly over the operations' fences.
//! At each point the simulator materialises a post-crash image (pending lines
//! kept, dropped or torn at random), which is written to a fresh directory,
//! opened (recovery runs) and checked:
//!
//! - (a) structure: [`PHnsw::check`];
//! - (b) every operation acknowledged before the crash is in effect: every
//!   expected label maps to its exact vector and is found at rank 1 by
//!   searching that vector; deleted labels are absent; `durable_seq()`
//!   covers every acknowledged operation;
//! - (c) the operation in flight is all or nothing: its label holds either
//!   the old or the new state, never a half-written node (which (a) and the
//!   rank-1 search would expose);
//! - (d) recall@10 on a query set within one point of the uncrashed index;
//! - (e) the next upsert of the in-flight operation's label, numbered from
//!   `durable_seq()` as a client without a log numbers it, takes effect
//!   (recovery may have completed an operation numbered above the durable
//!   watermark; that number must not make the new upsert look like a replay);
//! - the recovered index accepts new inserts and a delete and stays sound
//!   (allocation words were durable).
//!
//! This harness has one writer and recovers every crash from the same
//! uncrashed history, so exactly one operation is ever in flight and no
//! history goes on after a recovery. [`run_concurrent`] (several writers of
//! overlapping labels, crash after crash on the simulator) and
//! [`kill_rounds`] (the same in real processes killed with SIGKILL, on both
//! media) check the rest against the acknowledged history ([`history`]).
//!
//! A share of the points also crashes *during recovery*: the first image is
//! recovered on a simulator that crashes at one of the recovery's own fences,
//! and the second image is recovered and checked.
//!
//! With [`CrashTestConfig::disable`] one persistence site is switched off in
//! every simulator of the run: the mutation check that proves the checker can
//! fail.

use super::state::{PHnsw, PHnswParams};
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use vectide_core::{Error, Metric, Result, SearchParams, VectorIndex};
use vectide_graph::HnswParams;
use vectide_storage::{scratch_dir, CrashImage, Media, SimConfig, SimMedia, Site, SplitMix as Rng};

/// What to run.
#[derive(Debug, Clone)]
pub struct CrashTestConfig {
    /// Crash points to check (at most one per fence of the workload).
    pub points: usize,
    pub seed: u64,
    pub dim: usize,
    /// Rows of the initial batch (not crashed).
    pub base: usize,
    /// Single-row operations after the base batch (crashed). `0` sizes the
    /// workload from `points`.
    pub ops: usize,
    /// Share of points that also crash during recovery.
    pub recovery_share: f64,
    /// Post-crash images per crash point, each with its own line fates.
    pub images_per_point: usize,
    /// For points that crash during recovery: crash at every fence of the
    /// recovery (not one chosen at random).
    pub recovery_crash_all: bool,
    /// Queries of the recall check.
    pub queries: usize,
    /// Switch one persistence site off (mutation check).
    pub disable: Option<Site>,
    /// Stop at the first crash point with a violation.
    pub stop_at_first: bool,
    /// Directory for the images (default: `/dev/shm` when present, else the
    /// system temp dir).
    pub scratch_dir: Option<PathBuf>,
    /// A `maintain()` (a consolidation: list repairs, unlinks, then slot
    /// reuse by the inserts after it) after every this many operations; 0:
    /// none.
    pub maintain_every: usize,
}

impl Default for CrashTestConfig {
    fn default() -> Self {
        CrashTestConfig {
            points: 200,
            seed: 1,
            dim: 12,
            base: 200,
            ops: 0,
            recovery_share: 0.25,
            images_per_point: 1,
            recovery_crash_all: false,
            queries: 40,
            disable: None,
            stop_at_first: false,
            scratch_dir: None,
            maintain_every: 0,
        }
    }
}

/// What a run found.
#[derive(Debug, Clone, Default)]
pub struct CrashTestReport {
    pub points_checked: usize,
    /// Crash points by the operation they interrupted (`insert`, `upsert`,
    /// `delete`; a crash during recovery counts under `recovery`).
    pub by_operation: BTreeMap<String, usize>,
    /// Crash points by pending (unpersisted) cache lines at the crash.
    pub by_pending_lines: BTreeMap<String, usize>,
    /// Crash points by the fence site they came just before.
    pub by_site: BTreeMap<String, usize>,
    /// Crash points whose recovery had log entries to undo or redo.
    pub recoveries_with_work: usize,
    /// Points with at least one violation, and the first few messages.
    pub violating_points: usize,
    pub violations: Vec<String>,
    /// Recall@10 of the uncrashed index, and the worst drop after recovery.
    pub reference_recall_min: f64,
    pub worst_recall_drop: f64,
    /// Fences and operations of the crashed phase.
    pub fences: u64,
    pub operations: usize,
    /// Persistence sites the workload exercised, with (persists, fences).
    pub sites: BTreeMap<String, (u64, u64)>,
    /// Persistence sites the recoveries exercised, with (persists, fences).
    pub recovery_sites: BTreeMap<String, (u64, u64)>,
}

fn merge_sites(into: &mut BTreeMap<String, (u64, u64)>, media: &SimMedia) {
    for (k, (p, f)) in media.report().by_site {
        let e = into.entry(k.0.to_string()).or_default();
        e.0 += p;
        e.1 += f;
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OpKind {
    Insert,
    Upsert,
    Delete,
    /// The base batch: applied, never crashed.
    Batch,
    /// `maintain()`: a consolidation; it changes no label.
    Maintain,
}

#[derive(Debug, Clone)]
struct Op {
    kind: OpKind,
    label: u64,
    vector: Vec<f32>,
    seq: u64,
    rows: Vec<(u64, Vec<f32>)>,
}

impl Op {
    fn one(kind: OpKind, label: u64, vector: Vec<f32>, seq: u64) -> Op {
        Op {
            kind,
            label,
            vector,
            seq,
            rows: Vec::new(),
        }
    }
}

fn vector(rng: &mut Rng, dim: usize) -> Vec<f32> {
    (0..dim).map(|_| rng.unit() * 2.0 - 1.0).collect()
}

fn params() -> PHnswParams {
    PHnswParams {
        hnsw: HnswParams {
            m: 6,
            ef_construction: 40,
            threads: Some(1),
            ..HnswParams::default()
        },
        // Four NlistLog entries per operation: inserts log their in-edges
        // in several batches, so batch boundaries are crashed too.
        nlog_entries: 4,
        nlist_entries: 16,
        initial_capacity: 64,
    }
}

/// Op 0 inserts into the empty index (an insert without in-edges), op 1 is
/// the base batch, then single-row inserts, upserts and deletes.
struct Workload {
    dim: usize,
    ops: Vec<Op>,
    queries: Vec<Vec<f32>>,
}

impl Workload {
    fn new(cfg: &CrashTestConfig, ops: usize) -> Self {
        let mut rng = Rng(cfg.seed ^ 0xc4a5_11ed);
        let dim = cfg.dim;
        let first = Op::one(OpKind::Insert, 0, vector(&mut rng, dim), 1);
        let rows: Vec<(u64, Vec<f32>)> = (1..=cfg.base as u64)
            .map(|l| (l, vector(&mut rng, dim)))
            .collect();
        let mut live: Vec<u64> = (0..=cfg.base as u64).collect();
        let mut next_label = cfg.base as u64;
        let mut list = Vec::with_capacity(ops + 2);
        list.push(first);
        list.push(Op {
            rows,
            ..Op::one(OpKind::Batch, 0, Vec::new(), 2)
        });
        for i in 0..ops {
            let seq = i as u64 + 3;
            let r = rng.below(100);
            let op = if r < 50 || live.len() < 10 {
                next_label += 1;
                live.push(next_label);
                Op::one(OpKind::Insert, next_label, vector(&mut rng, dim), seq)
            } else if r < 75 {
                let label = live[rng.below(live.len())];
                Op::one(OpKind::Upsert, label, vector(&mut rng, dim), seq)
            } else {
                let at = rng.below(live.len());
                let label = live.swap_remove(at);
                Op::one(OpKind::Delete, label, Vec::new(), seq)
            };
            list.push(op);
            if cfg.maintain_every > 0 && (i + 1) % cfg.maintain_every == 0 {
                // Numbered as the operation before it: it takes no number.
                list.push(Op::one(OpKind::Maintain, 0, Vec::new(), seq));
            }
        }
        let queries = (0..cfg.queries).map(|_| vector(&mut rng, dim)).collect();
        Workload {
            dim,
            ops: list,
            queries,
        }
    }
}

/// Expected label → vector after each prefix of operations.
pub type Model = HashMap<u64, Vec<f32>>;

fn apply(model: &mut Model, op: &Op) {
    match op.kind {
        OpKind::Insert | OpKind::Upsert => {
            model.insert(op.label, op.vector.clone());
        }
        OpKind::Delete => {
            model.remove(&op.label);
        }
        OpKind::Batch => model.extend(op.rows.iter().cloned()),
        OpKind::Maintain => {}
    }
}

/// The graph as the checker compares it: entry word and, per linked node,
/// its state and lists.
#[derive(Debug, Clone, Default, PartialEq)]
struct Snap {
    entry: u64,
    nodes: HashMap<u32, (u32, Vec<Vec<u32>>)>,
}

fn snapshot(idx: &PHnsw) -> Snap {
    use super::layout::{DELETED, LIVE, M_ENTRY};
    use vectide_graph::Graph;
    let g = &idx.graph;
    let mut nodes = HashMap::new();
    let mut buf = Vec::new();
    for s in 0..idx.next_slot() as u32 {
        let state = g.state(s);
        if state != LIVE && state != DELETED {
            continue;
        }
        let lists = (0..=g.level(s))
            .map(|l| {
                g.neighbors_into(s, l, &mut buf);
                buf.clone()
            })
            .collect();
        nodes.insert(s, (state, lists));
    }
    Snap {
        entry: idx
            .meta
            .u64_at(M_ENTRY)
            .load(std::sync::atomic::Ordering::Acquire),
        nodes,
    }
}

/// The recovered graph must be exactly the graph before the interrupted
/// operation or exactly the graph after it; otherwise the nodes that match
/// neither (or the mix) are reported.
///
/// A consolidation (`atomic == false`) is durable batch by batch, not as a
/// whole: only its entry word is compared (before or after); the structural
/// check, the model and recall judge the rest.
fn compare_snaps(rec: &Snap, before: &Snap, after: &Snap, atomic: bool, out: &mut Vec<String>) {
    if rec == before || rec == after {
        return;
    }
    if rec.entry != before.entry && rec.entry != after.entry {
        out.push(format!(
            "entry word {:#x} is neither {:#x} nor {:#x}",
            rec.entry, before.entry, after.entry
        ));
    }
    if !atomic {
        return;
    }
    let mut slots: Vec<u32> = rec
        .nodes
        .keys()
        .chain(before.nodes.keys())
        .chain(after.nodes.keys())
        .copied()
        .collect();
    slots.sort_unstable();
    slots.dedup();
    let mut bad = 0;
    for s in slots {
        let r = rec.nodes.get(&s);
        if r != before.nodes.get(&s) && r != after.nodes.get(&s) {
            bad += 1;
            if bad <= 2 {
                out.push(format!(
                    "node {s}: {:?} is neither the state before ({:?}) nor after ({:?}) the operation",
                    r,
                    before.nodes.get(&s),
                    after.nodes.get(&s)
                ));
            }
        }
    }
    if bad > 2 {
        out.push(format!("{bad} nodes differ from the uncrashed graph"));
    }
    if bad == 0 {
        out.push("the graph mixes nodes from before and after the operation".into());
    }
}

fn l2(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum()
}

fn recall_at_10(idx: &PHnsw, model: &Model, queries: &[Vec<f32>]) -> f64 {
    let mut hit = 0usize;
    let mut total = 0usize;
    for q in queries {
        let mut exact: Vec<(f32, u64)> = model.iter().map(|(&l, v)| (l2(q, v), l)).collect();
        exact.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let truth: Vec<u64> = exact.iter().take(10).map(|x| x.1).collect();
        let found = idx
            .search(q, 10, &SearchParams::with_ef(40), None)
            .unwrap_or_default();
        total += truth.len();
        hit += found.iter().filter(|n| truth.contains(&n.id)).count();
    }
    hit as f64 / total.max(1) as f64
}

fn scratch_root(cfg: &CrashTestConfig) -> PathBuf {
    vectide_storage::scratch_root(cfg.scratch_dir.as_deref())
}

type TempDir = tempfile::TempDir;

fn sim(
    seed: u64,
    disable: Option<Site>,
    crash_before: impl IntoIterator<Item = u64>,
) -> Arc<SimMedia> {
    sim_n(seed, disable, crash_before, 1)
}

fn sim_n(
    seed: u64,
    disable: Option<Site>,
    crash_before: impl IntoIterator<Item = u64>,
    images_per_crash: usize,
) -> Arc<SimMedia> {
    let s = Arc::new(SimMedia::new(SimConfig {
        seed,
        crash_before: crash_before.into_iter().collect(),
        images_per_crash,
    }));
    s.disable(disable);
    s
}

/// Creates the (empty) index on a simulator.
fn build(dir: &Path, w: &Workload, media: Arc<dyn Media>) -> Result<PHnsw> {
    PHnsw::create_on(dir, w.dim, Metric::L2, params(), media)
}

fn run_op(idx: &PHnsw, op: &Op) -> Result<()> {
    match op.kind {
        OpKind::Insert | OpKind::Upsert => idx.insert(op.seq, &[op.label], &op.vector),
        OpKind::Delete => idx.delete(op.seq, &[op.label]).map(|_| ()),
        OpKind::Batch => {
            let ids: Vec<u64> = op.rows.iter().map(|r| r.0).collect();
            let flat: Vec<f32> = op.rows.iter().flat_map(|r| r.1.iter().copied()).collect();
            idx.insert(op.seq, &ids, &flat)
        }
        OpKind::Maintain => idx.maintain(),
    }
}

/// Everything the checker needs about the moment of a crash.
struct Moment<'a> {
    before: &'a Model,
    in_flight: Option<&'a Op>,
    acked_seq: u64,
    ref_recall: f64,
    snap_before: &'a Snap,
    snap_after: &'a Snap,
}

/// `None` when `label` maps to exactly `vec` and searching `vec` finds the
/// label at rank 1; else what is wrong.
fn find_label(idx: &PHnsw, label: u64, vec: &[f32]) -> Option<String> {
    match idx.vector_of(label) {
        None => Some(format!("label {label} missing")),
        Some(got) if got != vec => Some(format!("label {label} maps to another vector")),
        Some(_) => {
            let r = idx
                .search(vec, 1, &SearchParams::with_ef(64), None)
                .unwrap_or_default();
            (r.first().map(|n| n.id) != Some(label))
                .then(|| format!("label {label} not found at rank 1 by its own vector"))
        }
    }
}

/// Checks a recovered index against the model; returns violations. The
/// index runs on `media`, whose next fence (the first of the inserts that
/// follow) is crashed once more: that image, recovered, must hold every
/// label the model expects and the new one whole or not at all.
fn check_recovered(
    idx: &PHnsw,
    media: &Arc<SimMedia>,
    root: &Path,
    w: &Workload,
    m: &Moment<'_>,
    drop_out: &mut f64,
) -> Vec<String> {
    let mut v: Vec<String> = idx.check();
    compare_snaps(
        &snapshot(idx),
        m.snap_before,
        m.snap_after,
        m.in_flight.is_some(),
        &mut v,
    );
    if idx.durable_seq() < m.acked_seq {
        v.push(format!(
            "durable_seq {} below the last acknowledged operation {}",
            idx.durable_seq(),
            m.acked_seq
        ));
    }
    let in_label = m.in_flight.map(|o| o.label);
    let find = |label: u64, vec: &[f32]| find_label(idx, label, vec);
    for (&label, vec) in m.before {
        if Some(label) == in_label {
            continue;
        }
        if let Some(e) = find(label, vec) {
            v.push(e);
        }
    }
    // The operation in flight: old state or new state, nothing between.
    let mut resolved = m.before.clone();
    if let Some(op) = m.in_flight {
        let old = m.before.get(&op.label);
        let new = (op.kind != OpKind::Delete).then_some(&op.vector);
        let got = idx.vector_of(op.label);
        let ok = match &got {
            None => {
                if old.is_none() || new.is_none() {
                    None
                } else {
                    Some(format!(
                        "in-flight {:?} of {} left it absent",
                        op.kind, op.label
                    ))
                }
            }
            Some(g) if Some(g) == new => find(op.label, g),
            Some(g) if Some(g) == old => find(op.label, g),
            Some(_) => Some(format!(
                "in-flight {:?} of {}: half-written vector",
                op.kind, op.label
            )),
        };
        v.extend(ok);
        match got {
            Some(g) => {
                resolved.insert(op.label, g);
            }
            None => {
                resolved.remove(&op.label);
            }
        }
    }
    // Nothing else is there: the live count matches the model.
    if idx.len() != resolved.len() {
        v.push(format!(
            "{} live labels, expected {}",
            idx.len(),
            resolved.len()
        ));
    }
    let r = recall_at_10(idx, &resolved, &w.queries);
    *drop_out = drop_out.max(m.ref_recall - r);
    if r + 0.01 < m.ref_recall {
        v.push(format!("recall@10 {r:.3} vs {:.3} uncrashed", m.ref_recall));
    }
    // The recovered index keeps working. First, the next upsert of the
    // in-flight operation's label (a client retrying it), numbered from
    // `durable_seq()` as a client without a log of its own numbers it (e):
    // it must take effect whether recovery completed that operation or
    // discarded it. Then new inserts; later a delete. The first of these
    // operations is crashed once more, and that image is recovered too.
    let next_seq = idx.durable_seq() + 1;
    let retry = m
        .in_flight
        .filter(|o| o.kind != OpKind::Batch)
        .map(|op| (op.label, vector(&mut Rng(next_seq ^ 0x0c1e_a7ed), w.dim)));
    let mut rng = Rng(m.acked_seq ^ 0xfeed);
    let fresh: Vec<(u64, Vec<f32>)> = (0..3)
        .map(|i| (1_000_000 + i, vector(&mut rng, w.dim)))
        .collect();
    let seq = m.acked_seq + 1_000;
    let ops: Vec<(u64, &[f32], u64)> = retry
        .iter()
        .map(|(l, x)| (*l, &x[..], next_seq))
        .chain(fresh.iter().map(|(l, x)| (*l, &x[..], seq)))
        .collect();
    let again: Arc<Mutex<Vec<CrashImage>>> = Arc::new(Mutex::new(Vec::new()));
    {
        let sink = again.clone();
        media.on_crash(move |i| sink.lock().push(i));
        media.crash_before([media.fences()]);
    }
    let snap_before = snapshot(idx);
    let mut snap_after = None;
    for &(label, vec, s) in &ops {
        if let Err(e) = idx.insert(s, &[label], vec) {
            v.push(format!("insert after recovery failed: {e}"));
        }
        snap_after.get_or_insert_with(|| snapshot(idx));
    }
    if let Some((label, x)) = &retry {
        if idx.vector_of(*label).as_ref() != Some(x) {
            v.push(format!(
                "the next upsert of {label} (numbered {next_seq} from durable_seq()) was taken for a replay"
            ));
        }
    }
    let images = std::mem::take(&mut *again.lock());
    if let Some(after) = snap_after {
        let (label, x, _) = ops[0];
        for img in &images {
            v.extend(
                check_second_crash(
                    img,
                    root,
                    m.acked_seq,
                    &resolved,
                    (label, x),
                    (&snap_before, &after),
                )
                .into_iter()
                .map(|e| format!("crash in the first operation after recovery: {e}")),
            );
        }
    }
    if let Some((label, x)) = retry {
        resolved.insert(label, x);
    }
    if let Some((&victim, _)) = resolved.iter().next() {
        let _ = idx.delete(seq + 1, &[victim]);
    }
    v.extend(
        idx.check()
            .into_iter()
            .map(|e| format!("after new inserts: {e}")),
    );
    for (label, vec) in &fresh {
        if let Some(e) = find(*label, vec) {
            v.push(format!("after recovery: {e}"));
        }
    }
    v
}

/// Recovers a crash taken in the first operation after a recovery (an
/// upsert of `new.0` to `new.1`) and checks that the other labels of
/// `expected` are intact and `new.0` holds its old state or the new one.
fn check_second_crash(
    img: &CrashImage,
    root: &Path,
    seed: u64,
    expected: &Model,
    new: (u64, &[f32]),
    (before, after): (&Snap, &Snap),
) -> Vec<String> {
    let mut v = Vec::new();
    let Ok(d) = scratch_dir(root, "again") else {
        return vec!["harness: no temp dir".into()];
    };
    if let Err(e) = img.write_to(d.path()) {
        return vec![format!("harness: {e}")];
    }
    let idx = match PHnsw::open_on(d.path(), sim(seed, None, []), Some(1)) {
        Ok(i) => i,
        Err(e) => return vec![format!("recovery failed: {e}")],
    };
    v.extend(idx.check());
    compare_snaps(&snapshot(&idx), before, after, true, &mut v);
    for (&label, vec) in expected {
        if label != new.0 && idx.vector_of(label).as_deref() != Some(vec.as_slice()) {
            v.push(format!("label {label} lost or changed"));
            break;
        }
    }
    let old = expected.get(&new.0).map(|x| &x[..]);
    match idx.vector_of(new.0) {
        None if old.is_none() => {}
        None => v.push(format!("label {} lost", new.0)),
        Some(g) if g == new.1 || Some(&g[..]) == old => {
            let r = idx
                .search(&g, 1, &SearchParams::with_ef(64), None)
                .unwrap_or_default();
            if r.first().map(|n| n.id) != Some(new.0) {
                v.push(format!("label {} published but not reachable", new.0));
            }
        }
        Some(_) => v.push(format!("label {} half-written", new.0)),
    }
    let want = expected.keys().filter(|&&l| l != new.0).count() + usize::from(idx.has_label(new.0));
    if idx.len() != want {
        v.push(format!("{} live labels, expected {want}", idx.len()));
    }
    v
}

fn pending_bucket(n: usize) -> String {
    match n {
        0 => "0",
        1..=2 => "1-2",
        3..=8 => "3-8",
        9..=32 => "9-32",
        _ => ">32",
    }
    .to_string()
}

struct Shared {
    report: CrashTestReport,
    /// (fence number, is a recovery crash) points still to check.
    recovery_points: std::collections::HashSet<u64>,
    current_op: usize,
    stop: bool,
    root: PathBuf,
    cfg: CrashTestConfig,
}

/// Recovers one image (maybe crashing during recovery) and checks it.
fn handle(shared: &mut Shared, w: &Workload, refs: &Refs, img: CrashImage) {
    if shared.stop {
        return;
    }
    let k = shared.current_op;
    let op = &w.ops[k];
    let moment = Moment {
        before: &refs.models[k],
        // A consolidation changes no label: nothing is in flight for (b)
        // and (c); the structure, the model and recall are checked as for
        // any crash.
        in_flight: (op.kind != OpKind::Maintain).then_some(op),
        acked_seq: if k == 0 { 0 } else { w.ops[k - 1].seq },
        ref_recall: refs.recall[k].min(refs.recall[k + 1]),
        snap_before: &refs.snaps[k],
        snap_after: &refs.snaps[k + 1],
    };
    let cfg = shared.cfg.clone();
    let mut violations = Vec::new();
    let mut label = match op.kind {
        OpKind::Insert => "insert",
        OpKind::Upsert => "upsert",
        OpKind::Delete => "delete",
        OpKind::Batch => "batch",
        OpKind::Maintain => "maintain",
    };
    let mut recall_drop = 0.0;
    let result = (|| -> Result<bool> {
        let d1 = scratch_dir(&shared.root, "img")?;
        img.write_to(d1.path())
            .map_err(|e| Error::io_at(d1.path(), e))?;
        let in_recovery = shared.recovery_points.contains(&img.fence);
        // The directories to recover and check: the image itself, or the
        // images of crashes during its recovery.
        let mut finals: Vec<TempDir> = Vec::new();
        let mut had_work = false;
        if in_recovery {
            // Count the recovery's fences on a throwaway copy.
            let probe = scratch_dir(&shared.root, "probe")?;
            img.write_to(probe.path())
                .map_err(|e| Error::io_at(probe.path(), e))?;
            let s = sim(cfg.seed, cfg.disable, []);
            let opened = PHnsw::open_on(probe.path(), s.clone(), Some(1));
            let rec_fences = s.fences();
            merge_sites(&mut shared.report.recovery_sites, &s);
            if let Ok(idx) = &opened {
                had_work = log_work(idx.recovery_report());
            }
            drop_idx(opened);
            let at: Vec<u64> = if rec_fences == 0 {
                Vec::new()
            } else if cfg.recovery_crash_all {
                (0..rec_fences).collect()
            } else {
                vec![(img.fence.wrapping_mul(0x9e37_79b9) >> 7) % rec_fences]
            };
            for j in at {
                let copy = scratch_dir(&shared.root, "rec")?;
                img.write_to(copy.path())
                    .map_err(|e| Error::io_at(copy.path(), e))?;
                let s2 = sim_n(
                    cfg.seed ^ img.fence ^ j,
                    cfg.disable,
                    [j],
                    cfg.images_per_point,
                );
                let second: Arc<Mutex<Vec<CrashImage>>> = Arc::new(Mutex::new(Vec::new()));
                let sink = second.clone();
                s2.on_crash(move |i| sink.lock().push(i));
                drop_idx(PHnsw::open_on(copy.path(), s2, Some(1)));
                for i2 in std::mem::take(&mut *second.lock()) {
                    let d2 = scratch_dir(&shared.root, "img2")?;
                    i2.write_to(d2.path())
                        .map_err(|e| Error::io_at(d2.path(), e))?;
                    finals.push(d2);
                }
                label = "recovery";
            }
        }
        if finals.is_empty() {
            finals.push(d1);
        }
        for dir in &finals {
            let s = sim_n(cfg.seed ^ img.fence, cfg.disable, [], cfg.images_per_point);
            let opened = PHnsw::open_on(dir.path(), s.clone(), Some(1));
            merge_sites(&mut shared.report.recovery_sites, &s);
            match opened {
                Ok(idx) => {
                    had_work |= log_work(idx.recovery_report());
                    violations.extend(check_recovered(
                        &idx,
                        &s,
                        &shared.root,
                        w,
                        &moment,
                        &mut recall_drop,
                    ));
                }
                Err(e) => violations.push(format!("recovery failed: {e}")),
            }
            if !violations.is_empty() {
                break;
            }
        }
        Ok(had_work)
    })();
    let r = &mut shared.report;
    match result {
        Ok(work) => r.recoveries_with_work += usize::from(work),
        Err(e) => violations.push(format!("harness error: {e}")),
    }
    r.points_checked += 1;
    *r.by_operation.entry(label.to_string()).or_default() += 1;
    *r.by_pending_lines
        .entry(pending_bucket(img.pending_lines))
        .or_default() += 1;
    *r.by_site.entry(img.site.0.to_string()).or_default() += 1;
    r.worst_recall_drop = r.worst_recall_drop.max(recall_drop);
    if !violations.is_empty() {
        r.violating_points += 1;
        for v in violations.into_iter().take(3) {
            if r.violations.len() < 20 {
                r.violations.push(format!(
                    "crash before fence {} ({}, during {label}): {v}",
                    img.fence, img.site.0
                ));
            }
        }
        if cfg.stop_at_first {
            shared.stop = true;
        }
    }
}

fn drop_idx(r: Result<PHnsw>) {
    drop(r);
}

/// What the dry run records before each operation (index `k`) and after the
/// last (`ops.len()`).
struct Refs {
    models: Vec<Model>,
    recall: Vec<f64>,
    snaps: Vec<Snap>,
}

/// Runs the crash test (see the module docs).
pub fn run(cfg: &CrashTestConfig) -> Result<CrashTestReport> {
    if cfg.dim == 0 || cfg.base < 10 {
        return Err(Error::invalid("crash test needs dim >= 1 and base >= 10"));
    }
    let ops = if cfg.ops > 0 {
        cfg.ops
    } else {
        (cfg.points / 3).max(60)
    };
    let w = Arc::new(Workload::new(cfg, ops));
    let root = scratch_root(cfg);

    // Dry run: fences of each operation, and the model, recall and graph
    // before each.
    let mut refs = Refs {
        models: Vec::with_capacity(w.ops.len() + 1),
        recall: Vec::with_capacity(w.ops.len() + 1),
        snaps: Vec::with_capacity(w.ops.len() + 1),
    };
    let mut model = Model::new();
    let mut crashable: Vec<u64> = Vec::new();
    {
        let d = scratch_dir(&root, "dry")?;
        let s = sim(cfg.seed, cfg.disable, []);
        let idx = build(d.path(), &w, s.clone())?;
        for op in &w.ops {
            refs.models.push(model.clone());
            refs.recall.push(recall_at_10(&idx, &model, &w.queries));
            refs.snaps.push(snapshot(&idx));
            let start = s.fences();
            run_op(&idx, op)?;
            if op.kind != OpKind::Batch {
                crashable.extend(start..s.fences());
            }
            apply(&mut model, op);
        }
        refs.models.push(model.clone());
        refs.recall.push(recall_at_10(&idx, &model, &w.queries));
        refs.snaps.push(snapshot(&idx));
    }
    let span = crashable.len() as u64;
    let mut rng = Rng(cfg.seed);
    // A uniform sample of the crashable fences (partial Fisher-Yates).
    let take = cfg.points.min(crashable.len());
    for i in 0..take {
        let j = i + rng.below(crashable.len() - i);
        crashable.swap(i, j);
    }
    let mut points: Vec<u64> = crashable[..take].to_vec();
    points.sort_unstable();
    let recovery_points = points
        .iter()
        .copied()
        .filter(|_| (rng.unit() as f64) < cfg.recovery_share)
        .collect();
    let reference_recall_min = refs.recall[2..].iter().copied().fold(1.0, f64::min);

    let shared = Arc::new(Mutex::new(Shared {
        report: CrashTestReport {
            reference_recall_min,
            fences: span,
            operations: ops,
            ..Default::default()
        },
        recovery_points,
        current_op: 0,
        stop: false,
        root: root.clone(),
        cfg: cfg.clone(),
    }));
    let d = scratch_dir(&root, "run")?;
    let s = sim_n(
        cfg.seed,
        cfg.disable,
        points.iter().copied(),
        cfg.images_per_point,
    );
    let idx = build(d.path(), &w, s.clone())?;
    {
        let (shared, w) = (shared.clone(), w.clone());
        s.on_crash(move |img| handle(&mut shared.lock(), &w, &refs, img));
    }
    for (k, op) in w.ops.iter().enumerate() {
        shared.lock().current_op = k;
        run_op(&idx, op)?;
        if shared.lock().stop {
            break;
        }
    }
    drop(idx);
    let mut report = std::mem::take(&mut shared.lock().report);
    report.sites = s
        .report()
        .by_site
        .into_iter()
        .map(|(k, v)| (k.0.to_string(), v))
        .collect();
    Ok(report)
}

/// The persistence sites a run exercises on the insert, delete and recovery
/// paths (everything but index creation): the mutation check's targets.
pub fn mutation_sites(cfg: &CrashTestConfig) -> Result<Vec<Site>> {
    let mut c = cfg.clone();
    c.disable = None;
    c.stop_at_first = false;
    let r = run(&c)?;
    Ok(ALL_SITES
        .iter()
        .copied()
        .filter(|s| r.sites.contains_key(s.0) || r.recovery_sites.contains_key(s.0))
        .collect())
}

/// Every persistence site of the engine (names are `&'static str`).
pub const ALL_SITES: &[Site] = &[
    super::builder::S_NODE,
    super::builder::S_ALLOC,
    super::builder::S_NLOG,
    super::builder::F_LOG,
    super::builder::S_OUT,
    super::builder::F_OUT,
    super::builder::S_NCOMPLETE,
    super::builder::F_NCOMPLETE,
    super::builder::S_NL_LOG,
    super::builder::F_NL_LOG,
    super::builder::S_NL_LOGGED,
    super::builder::F_NL_LOGGED,
    super::builder::S_NL_WRITE,
    super::builder::S_NL_PROGRESS,
    super::builder::F_NL_WRITE,
    super::builder::S_NL_DONE,
    super::builder::F_NL_DONE,
    super::builder::S_PUB_STATE,
    super::builder::S_PUB_LIVE,
    super::builder::S_PUB_ENTRY,
    super::builder::F_PUB,
    super::builder::S_DONE,
    super::builder::F_DONE,
    super::builder::S_DURABLE,
    super::builder::F_DURABLE,
    super::labels::SITE_BUCKET,
    super::update::S_DEL_NLOG,
    super::update::F_DEL_LOG,
    super::update::S_DEL_LOGGED,
    super::update::F_DEL_LOGGED,
    super::update::S_DEL_FLAG,
    super::update::S_DEL_LIVE,
    super::update::F_DEL_APPLY,
    super::update::S_DEL_DONE,
    super::update::F_DEL_DONE,
    super::consolidate::S_C_BEGIN,
    super::consolidate::F_C_BEGIN,
    super::consolidate::S_C_END,
    super::consolidate::S_C_ENTRY,
    super::consolidate::F_C_ENTRY,
    super::consolidate::S_C_NLIST,
    super::consolidate::F_C_NLIST,
    super::consolidate::S_C_LOGGED,
    super::consolidate::F_C_LOGGED,
    super::consolidate::S_C_LISTS,
    super::consolidate::F_C_LISTS,
    super::consolidate::S_C_DONE,
    super::consolidate::F_C_DONE,
    super::consolidate::S_C_UNLINK,
    super::consolidate::F_C_UNLINK,
    super::recovery::S_R_UNDO,
    super::recovery::F_R_UNDO,
    super::recovery::S_R_DONE,
    super::recovery::F_R_DONE,
];

/// Whether a recovery found log entries to undo, redo or discard.
fn log_work(r: &crate::RecoveryReport) -> bool {
    r != &crate::RecoveryReport {
        micros: r.micros,
        ..Default::default()
    }
}
