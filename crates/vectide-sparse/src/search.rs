//! Exact top-k by dot product: MaxScore, term at a time.
//!
//! The query's terms are ordered by the most each can add to a score (its
//! list's bound: the query weight times the list's largest weight, or its
//! smallest for a negative query weight, and never below 0 since a
//! document without the term gets 0 from it). Given a threshold that `k`
//! accepted documents are known to reach, the terms whose bounds together
//! stay below it are *non-essential*: a document found only in their lists
//! cannot enter, so candidates come from the essential lists alone, and
//! the non-essential lists are never read.
//!
//! 1. **Seed**: the shortest lists with the largest bounds (on text, the
//!    rare terms), up to a small budget of postings, give every document
//!    they hold a lower bound (what they add, plus the least each other
//!    term can add: 0 unless weights of the other sign exist). The k-th
//!    largest among accepted documents is the first threshold.
//! 2. **Accumulate** the essential lists, term at a time, into per-document
//!    partial sums (a dense array reused between searches when document
//!    numbers are dense, as the database's are; a hash map otherwise).
//! 3. **Tighten**: the k-th largest lower bound among the touched accepted
//!    documents (partial sum plus the non-essential terms' least).
//! 4. **Score** exactly the touched documents whose partial sum plus the
//!    non-essential bounds still reaches the threshold, in decreasing
//!    partial sum, keeping the best `k`: the threshold rises with them,
//!    and the first document that cannot reach it ends the pass.
//!
//! When the essential lists after the seed still hold more than half the
//! query's postings (short lists all, as on text without its stop words;
//! or the first answers wanted are many), pruning would save little and
//! scoring costs random reads: every list is added instead, in term order,
//! which makes each sum the exact score, and the best `k` are taken from
//! the sums ([`exhaustive`]).
//!
//! The answer is the same as scoring every document that shares a term
//! with the query: only documents that provably cannot enter are skipped
//! (bounds are compared with a margin for f64 rounding, see [`floor`]).
//! Scores are the exact dot products ([`SparseVector::dot`], f64
//! accumulation in term order, reported as f32); documents sharing no term
//! with the query are not answers (Qdrant's rule). Ties are ordered by the
//! caller's `tie` order, so that the database can break them by point id.

use crate::index::SparseIndex;
use crate::postings::PostingList;
use crate::vector::SparseVector;
use std::cell::RefCell;
use std::cmp::Ordering;
use std::collections::HashMap;

/// What a search did, for tests and benchmarks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SearchStats {
    /// Postings in the query's lists (what a full scan reads).
    pub postings: usize,
    /// Postings the search read (the seed's and the essential lists').
    pub read: usize,
    /// Candidates scored exactly.
    pub scored: usize,
    /// Times the filter was asked about a document.
    pub filtered: usize,
}

struct Cursor<'a> {
    term: u32,
    list: &'a PostingList,
    q: f64,
    /// The most its term can add to a score (never below 0).
    bound: f64,
    /// The least its term can add (never above 0).
    low: f64,
}

/// A held answer; the max-heap's top is the worst one.
struct Held<'t> {
    doc: u64,
    score: f32,
    tie: &'t dyn Fn(u64, u64) -> Ordering,
}

impl Held<'_> {
    /// `Less` when `self` ranks before `other`.
    fn rank(&self, other: &Self) -> Ordering {
        other
            .score
            .total_cmp(&self.score)
            .then_with(|| (self.tie)(self.doc, other.doc))
    }
}

impl PartialEq for Held<'_> {
    fn eq(&self, o: &Self) -> bool {
        self.rank(o) == Ordering::Equal
    }
}
impl Eq for Held<'_> {}
impl PartialOrd for Held<'_> {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Held<'_> {
    fn cmp(&self, o: &Self) -> Ordering {
        self.rank(o)
    }
}

/// How far below the k-th score a bound must be before it prunes: the f32
/// rounding of an exact score (2⁻²⁴ relative) must not push a pruned
/// document over it.
fn floor(theta: f64) -> f64 {
    theta - theta.abs() * 1e-6 - 1e-30
}

/// What scoring a candidate exactly costs, in postings read: a document's
/// vector is two or three cache misses away, a posting is a sequential
/// read and an add.
const SCORE_COST: usize = 128;

/// Postings the seed reads at most: a small share of the query's lists,
/// never fewer than a few per answer wanted.
fn seed_budget(total: usize, k: usize) -> usize {
    (total / 64).max(8 * k)
}

/// Per-document partial sums of one search.
enum Acc<'s> {
    /// Indexed by document number, with the documents touched marked in a
    /// bitset (small enough to stay in the first-level cache) and listed
    /// (the array and the bitset are all zeros between searches).
    Dense {
        sums: &'s mut Vec<f64>,
        seen: &'s mut Vec<u64>,
        touched: &'s mut Vec<u64>,
    },
    Map(HashMap<u64, f64>),
}

impl Acc<'_> {
    /// Adds a list, its weights times `q`, to its documents' sums.
    fn add_list(&mut self, list: &PostingList, q: f64) {
        let pairs = list.docs().iter().zip(list.weights());
        match self {
            Acc::Dense {
                sums,
                seen,
                touched,
            } => {
                let (sums, seen) = (sums.as_mut_slice(), seen.as_mut_slice());
                // Written at the end unconditionally and kept when new (no
                // branch to mispredict).
                let mut len = touched.len();
                touched.resize(len + list.len(), 0);
                let out = touched.as_mut_slice();
                for (&d, &w) in pairs {
                    let i = d as usize;
                    let (word, bit) = (i >> 6, 1u64 << (i & 63));
                    out[len] = d;
                    len += usize::from(seen[word] & bit == 0);
                    seen[word] |= bit;
                    sums[i] += q * f64::from(w);
                }
                touched.truncate(len);
            }
            Acc::Map(m) => {
                for (&d, &w) in pairs {
                    *m.entry(d).or_insert(0.0) += q * f64::from(w);
                }
            }
        }
    }

    /// [`add_list`](Self::add_list) for the documents already touched
    /// only.
    fn add_list_touched(&mut self, list: &PostingList, q: f64) {
        let pairs = list.docs().iter().zip(list.weights());
        match self {
            Acc::Dense { sums, seen, .. } => {
                let (sums, seen) = (sums.as_mut_slice(), seen.as_slice());
                for (&d, &w) in pairs {
                    let i = d as usize;
                    if seen[i >> 6] & (1u64 << (i & 63)) != 0 {
                        sums[i] += q * f64::from(w);
                    }
                }
            }
            Acc::Map(m) => {
                for (&d, &w) in pairs {
                    if let Some(s) = m.get_mut(&d) {
                        *s += q * f64::from(w);
                    }
                }
            }
        }
    }

    /// The sums of the documents of `out` read again.
    fn refresh(&self, out: &mut [(f64, u64)]) {
        for e in out.iter_mut() {
            e.0 = match self {
                Acc::Dense { sums, .. } => sums[e.1 as usize],
                Acc::Map(m) => m.get(&e.1).copied().unwrap_or(0.0),
            };
        }
    }

    /// Calls `f` with each touched document's sum and number.
    fn for_each(&self, mut f: impl FnMut(f64, u64)) {
        match self {
            Acc::Dense { sums, touched, .. } => {
                for &d in touched.iter() {
                    f(sums[d as usize], d);
                }
            }
            Acc::Map(m) => {
                for (&d, &x) in m {
                    f(x, d);
                }
            }
        }
    }

    /// The touched documents and their sums, kept.
    fn copy_into(&self, out: &mut Vec<(f64, u64)>) {
        self.for_each(|x, d| out.push((x, d)));
    }

    /// Zeroes the array (forgets every document).
    fn clear(&mut self) {
        match self {
            Acc::Dense {
                sums,
                seen,
                touched,
            } => zero_dense(sums, seen, touched),
            Acc::Map(m) => m.clear(),
        }
    }

    /// The touched documents and their sums, leaving the array zeroed.
    fn drain_into(&mut self, out: &mut Vec<(f64, u64)>) {
        self.copy_into(out);
        self.clear();
    }
}

/// Zeroes the touched documents' sums and bits: one by one when they are
/// few, the whole arrays at once (sequential writes) when they are many.
fn zero_dense(sums: &mut [f64], seen: &mut [u64], touched: &mut Vec<u64>) {
    if touched.len() >= sums.len() / 16 {
        sums.fill(0.0);
        seen.fill(0);
    } else {
        for &d in touched.iter() {
            sums[d as usize] = 0.0;
            seen[d as usize >> 6] = 0;
        }
    }
    touched.clear();
}

/// Document numbers past which the search accumulates in a hash map
/// rather than in its per-thread array (8 bytes and a bit per number, kept
/// by each thread that searched): 2²² numbers, 32.5 MiB.
const MAX_DENSE: usize = 1 << 22;

/// The scratch a thread's searches reuse (the dense accumulator).
#[derive(Default)]
struct Scratch {
    sums: Vec<f64>,
    seen: Vec<u64>,
    touched: Vec<u64>,
    lower: Vec<(f64, u64)>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// The query's weights by term in an open-addressing table, so that a
/// document's exact score is one probe per term it holds instead of a
/// merge of two sorted lists (the same products, summed in the same term
/// order: the same bits as [`SparseVector::dot`]).
struct QueryTable {
    /// `term + 1` (0: empty) and the weight, `2^bits` slots.
    slots: Vec<(u64, f64)>,
    shift: u32,
}

impl QueryTable {
    fn new(q: &SparseVector) -> QueryTable {
        let bits = (2 * q.len().max(1))
            .next_power_of_two()
            .trailing_zeros()
            .max(4);
        let mut slots = vec![(0u64, 0f64); 1 << bits];
        let mask = slots.len() - 1;
        for (&t, &w) in q.indices().iter().zip(q.values()) {
            let mut i = Self::hash(t, 64 - bits);
            while slots[i].0 != 0 {
                i = (i + 1) & mask;
            }
            slots[i] = (u64::from(t) + 1, f64::from(w));
        }
        QueryTable {
            slots,
            shift: 64 - bits,
        }
    }

    #[inline]
    fn hash(t: u32, shift: u32) -> usize {
        (u64::from(t).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> shift) as usize
    }

    /// What [`SparseVector::dot`] gives for `v` and the query.
    fn dot(&self, v: &SparseVector) -> Option<f32> {
        let mask = self.slots.len() - 1;
        let (mut sum, mut overlap) = (0f64, false);
        for (&t, &w) in v.indices().iter().zip(v.values()) {
            let key = u64::from(t) + 1;
            let mut i = Self::hash(t, self.shift);
            loop {
                let (k, q) = self.slots[i];
                if k == key {
                    sum += f64::from(w) * q;
                    overlap = true;
                    break;
                }
                if k == 0 {
                    break;
                }
                i = (i + 1) & mask;
            }
        }
        overlap.then_some(sum as f32)
    }
}

/// The k-th largest lower bound `x + add` among the accepted documents of
/// `lower` (pairs of partial sum and document; reordered), asking `accept`
/// in decreasing order, at most `4k + 16` times; `None` when fewer than `k`
/// pass.
fn kth_lower(
    lower: &mut [(f64, u64)],
    k: usize,
    add: f64,
    accept: &dyn Fn(u64) -> bool,
    stats: &mut SearchStats,
) -> Option<f64> {
    if lower.len() < k {
        return None;
    }
    let m = (4 * k + 16).min(lower.len());
    let desc = |a: &(f64, u64), b: &(f64, u64)| b.0.total_cmp(&a.0);
    if m < lower.len() {
        lower.select_nth_unstable_by(m - 1, desc);
    }
    let top = &mut lower[..m];
    top.sort_unstable_by(desc);
    let mut passed = 0;
    for &(x, d) in top.iter() {
        stats.filtered += 1;
        if accept(d) {
            passed += 1;
            if passed == k {
                return Some(x + add);
            }
        }
    }
    None
}

/// Every list added, in term order, so that each document's sum is its
/// exact score (the products of [`SparseVector::dot`], summed in its
/// order: the same bits); the best `k` accepted, taken in decreasing score
/// so that `accept` is asked about the documents that would enter only.
///
/// One pass over the sums keeps the `4k + 16` largest (a buffer cut back
/// to them whenever it doubles, its cut rising). That is the answer when
/// the `k`-th accepted one's score is above the first one left out; when
/// the filter refuses too many for that, every sum is taken, a growing
/// slice at a time.
fn exhaustive(
    acc: &mut Acc<'_>,
    lower: &mut Vec<(f64, u64)>,
    cursors: &mut [Cursor<'_>],
    k: usize,
    accept: &dyn Fn(u64) -> bool,
    tie: &dyn Fn(u64, u64) -> Ordering,
    stats: &mut SearchStats,
) -> Vec<(u64, f32)> {
    cursors.sort_unstable_by_key(|c| c.term);
    for c in cursors.iter() {
        stats.read += c.list.len();
        acc.add_list(c.list, c.q);
    }
    let desc = |a: &(f64, u64), b: &(f64, u64)| b.0.total_cmp(&a.0);
    let m = 4 * k + 16;
    lower.clear();
    let (mut cut, mut complete) = (f64::NEG_INFINITY, true);
    acc.for_each(|x, d| {
        if x >= cut {
            lower.push((x, d));
            if lower.len() == 2 * m {
                lower.select_nth_unstable_by(m - 1, desc);
                lower.truncate(m);
                cut = lower[m - 1].0;
                complete = false;
            }
        }
    });
    let mut heap = std::collections::BinaryHeap::with_capacity(k + 1);
    if !take_best(lower, k, accept, tie, &mut heap, stats) && !complete {
        // The filter refused too many of the best: all of them, then.
        heap.clear();
        lower.clear();
        acc.copy_into(lower);
        let (mut start, mut take) = (0, m);
        while start < lower.len() {
            let rest = &mut lower[start..];
            let n = take.min(rest.len());
            if n < rest.len() {
                rest.select_nth_unstable_by(n - 1, desc);
            }
            if take_best(&mut rest[..n], k, accept, tie, &mut heap, stats) {
                break;
            }
            start += n;
            take = take.saturating_mul(4);
        }
    }
    acc.clear();
    lower.clear();
    let mut out: Vec<Held<'_>> = heap.into_vec();
    out.sort();
    out.into_iter().map(|h| (h.doc, h.score)).collect()
}

/// Offers the documents of `cands` (sums and numbers; sorted here, best
/// first) to `heap`, the best `k` accepted so far, stopping at the first
/// whose score is below the `k`-th: `true` when it stopped so (no document
/// whose sum is at most the last one offered can enter).
fn take_best<'t>(
    cands: &mut [(f64, u64)],
    k: usize,
    accept: &dyn Fn(u64) -> bool,
    tie: &'t dyn Fn(u64, u64) -> Ordering,
    heap: &mut std::collections::BinaryHeap<Held<'t>>,
    stats: &mut SearchStats,
) -> bool {
    cands.sort_unstable_by(|a, b| b.0.total_cmp(&a.0));
    // Decreasing sums: their f32 scores never increase.
    for &(sum, doc) in cands.iter() {
        let held = Held {
            doc,
            score: sum as f32,
            tie,
        };
        if heap.len() == k && heap.peek().is_some_and(|w| held.score < w.score) {
            return true;
        }
        offer(heap, held, k, accept, stats);
    }
    false
}

/// Offers `held` to `heap`, the best `k` accepted so far; `accept` is
/// asked only when it would enter.
fn offer<'t>(
    heap: &mut std::collections::BinaryHeap<Held<'t>>,
    held: Held<'t>,
    k: usize,
    accept: &dyn Fn(u64) -> bool,
    stats: &mut SearchStats,
) {
    if heap.len() == k && heap.peek().is_some_and(|w| held.rank(w) != Ordering::Less) {
        return;
    }
    stats.filtered += 1;
    if !accept(held.doc) {
        return;
    }
    heap.push(held);
    if heap.len() > k {
        heap.pop();
    }
}

impl SparseIndex {
    /// The `k` documents with the largest dot product with `query` (after
    /// the index's modifier) among those `accept` admits, best first, ties
    /// in `tie` order. `accept` is asked about the documents that set the
    /// thresholds and those that would enter the answer, not about every
    /// document the query touches.
    pub fn search(
        &self,
        query: &SparseVector,
        k: usize,
        accept: &dyn Fn(u64) -> bool,
        tie: &dyn Fn(u64, u64) -> Ordering,
    ) -> (Vec<(u64, f32)>, SearchStats) {
        SCRATCH.with(|cell| match cell.try_borrow_mut() {
            Ok(mut scratch) => self.search_in(&mut scratch, query, k, accept, tie),
            // A search from inside a filter of another one on this thread.
            Err(_) => self.search_in(&mut Scratch::default(), query, k, accept, tie),
        })
    }

    fn search_in(
        &self,
        scratch: &mut Scratch,
        query: &SparseVector,
        k: usize,
        accept: &dyn Fn(u64) -> bool,
        tie: &dyn Fn(u64, u64) -> Ordering,
    ) -> (Vec<(u64, f32)>, SearchStats) {
        let q = self.effective_query(query);
        let mut stats = SearchStats::default();
        if k == 0 {
            return (Vec::new(), stats);
        }
        let mut cursors: Vec<Cursor<'_>> = q
            .indices()
            .iter()
            .zip(q.values())
            .filter_map(|(t, &w)| {
                let list = self.lists.get(t)?;
                let q = f64::from(w);
                Some(Cursor {
                    term: *t,
                    list,
                    q,
                    bound: list.list_bound(q).max(0.0),
                    low: (-list.list_bound(-q)).min(0.0),
                })
            })
            .collect();
        let total: usize = cursors.iter().map(|c| c.list.len()).sum();
        stats.postings = total;
        cursors.sort_by(|a, b| a.bound.total_cmp(&b.bound));
        // prefix[i]: the bounds of cursors[..i] together; lows likewise.
        let mut prefix = vec![0f64; cursors.len() + 1];
        let mut lows = vec![0f64; cursors.len() + 1];
        for (i, c) in cursors.iter().enumerate() {
            prefix[i + 1] = prefix[i] + c.bound;
            lows[i + 1] = lows[i] + c.low;
        }
        // The rounding of partial sums in another order than the exact
        // score's: a fraction of the largest magnitudes they can sum.
        // (Each order's f64 sum is off by at most (n − 1)·2⁻⁵³ of the
        // magnitudes; 1e-12 of them covers short queries with room.)
        let magnitude = prefix[cursors.len()] - lows[cursors.len()];
        let slack = magnitude * (1e-12f64).max(4.0 * (cursors.len() as f64 + 1.0) * f64::EPSILON);
        let dense = self.max_doc.is_some_and(|m| {
            usize::try_from(m).is_ok_and(|m| m < MAX_DENSE && m <= 4 * self.docs.len() + 4096)
        });
        {
            let Scratch {
                sums,
                seen,
                touched,
                lower,
            } = scratch;
            // Left dirty by a search a panicking callback cut short.
            zero_dense(sums, seen, touched);
            let mut acc = if dense {
                let n = self.max_doc.map_or(0, |m| m as usize + 1);
                if sums.len() < n {
                    sums.resize(n, 0.0);
                    seen.resize(n.div_ceil(64), 0);
                }
                Acc::Dense {
                    sums,
                    seen,
                    touched,
                }
            } else {
                Acc::Map(HashMap::new())
            };
            lower.clear();
            // 1. The seed.
            let mut theta: Option<f64> = None;
            let budget = seed_budget(total, k);
            if total > budget {
                let mut low_rest = lows[cursors.len()];
                let mut read = 0;
                for c in cursors.iter().rev() {
                    if read + c.list.len() > budget {
                        continue;
                    }
                    read += c.list.len();
                    low_rest -= c.low;
                    acc.add_list(c.list, c.q);
                }
                stats.read += read;
                acc.drain_into(lower);
                theta = kth_lower(lower, k, low_rest - slack, accept, &mut stats);
                lower.clear();
            }
            // 2. The essential lists: cursors[ne..].
            let mut ne = 0;
            if let Some(t) = theta {
                while ne < cursors.len() && prefix[ne + 1] < floor(t) - slack {
                    ne += 1;
                }
            }
            let essential: usize = cursors[ne..].iter().map(|c| c.list.len()).sum();
            if theta.is_none() || essential > total / 2 {
                // The pruning would save little: every list is read and
                // the sums are the scores.
                let out = exhaustive(&mut acc, lower, &mut cursors, k, accept, tie, &mut stats);
                return (out, stats);
            }
            for c in &cursors[ne..] {
                stats.read += c.list.len();
                acc.add_list(c.list, c.q);
            }
            acc.copy_into(lower);
            // 3. Tightened by the touched documents; then, while the
            // candidates whose bound reaches cost more to score than the
            // next non-essential list costs to read, that list is added to
            // their partial sums (no other document can reach), which
            // shrinks their bounds and raises their lower bounds.
            // A document whose bound falls short once does so for good
            // (what a list adds to its sum, the bound loses), so it leaves
            // `lower`; the k-th lower bound above the threshold is the same
            // without it.
            loop {
                if let Some(t) = theta {
                    let reach = floor(t) - prefix[ne] - slack;
                    lower.retain(|e| e.0 >= reach);
                }
                if let Some(t) = kth_lower(lower, k, lows[ne] - slack, accept, &mut stats) {
                    theta = Some(theta.map_or(t, |s| s.max(t)));
                }
                let Some(t) = theta else { break };
                let reach = floor(t) - prefix[ne] - slack;
                lower.retain(|e| e.0 >= reach);
                if ne == 0 || lower.len() * SCORE_COST <= cursors[ne - 1].list.len() {
                    break;
                }
                ne -= 1;
                let next = &cursors[ne];
                stats.read += next.list.len();
                acc.add_list_touched(next.list, next.q);
                acc.refresh(lower);
            }
            acc.clear();
            // 4. Exact scores where the bound still reaches, in decreasing
            // partial sum: the first that cannot reach ends the pass.
            let rest = prefix[ne] + slack;
            if let Some(t) = theta {
                lower.retain(|&(partial, _)| partial + rest >= floor(t));
            }
            lower.sort_unstable_by(|a, b| b.0.total_cmp(&a.0));
            let table = QueryTable::new(&q);
            let mut heap: std::collections::BinaryHeap<Held<'_>> =
                std::collections::BinaryHeap::with_capacity(k + 1);
            for &(partial, doc) in lower.iter() {
                if let Some(t) = theta {
                    if partial + rest < floor(t) {
                        break;
                    }
                }
                let Some(score) = self.docs.get(&doc).and_then(|v| table.dot(v)) else {
                    continue;
                };
                stats.scored += 1;
                offer(&mut heap, Held { doc, score, tie }, k, accept, &mut stats);
                if heap.len() == k {
                    let kth = f64::from(heap.peek().map_or(f32::MIN, |h| h.score));
                    theta = Some(theta.map_or(kth, |s| s.max(kth)));
                }
            }
            lower.clear();
            let mut out: Vec<Held<'_>> = heap.into_vec();
            out.sort();
            (out.into_iter().map(|h| (h.doc, h.score)).collect(), stats)
        }
    }

    /// The same answer by scoring every document that shares a term with
    /// the query (the oracle of the tests and the benchmark's baseline).
    pub fn search_scan(
        &self,
        query: &SparseVector,
        k: usize,
        accept: &dyn Fn(u64) -> bool,
        tie: &dyn Fn(u64, u64) -> Ordering,
    ) -> Vec<(u64, f32)> {
        let q = self.effective_query(query);
        let mut all: Vec<(u64, f32)> = self
            .docs
            .iter()
            .filter(|(d, _)| accept(**d))
            .filter_map(|(&d, v)| v.dot(&q).map(|s| (d, s)))
            .collect();
        all.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| tie(a.0, b.0)));
        all.truncate(k);
        all
    }
}
