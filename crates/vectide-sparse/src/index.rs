//! The index's state: each document's vector (for reads, replacement and
//! saves) and one posting list per term.

use crate::postings::PostingList;
use crate::vector::SparseVector;
use std::collections::HashMap;
use vectide_core::Seq;

/// How query weights are scaled before the dot product.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Modifier {
    /// The dot product as given.
    #[default]
    None,
    /// Each query weight times the term's inverse document frequency, as
    /// Qdrant defines it: `ln((N − n + 0.5) / (n + 0.5) + 1)`, with `N` the
    /// live documents of the index and `n` those holding the term.
    Idf,
}

impl Modifier {
    pub fn name(self) -> &'static str {
        match self {
            Modifier::None => "none",
            Modifier::Idf => "idf",
        }
    }

    pub fn parse(s: &str) -> Option<Modifier> {
        match s {
            "none" => Some(Modifier::None),
            "idf" => Some(Modifier::Idf),
            _ => None,
        }
    }
}

/// An inverted index of sparse vectors keyed by document id (see the crate
/// docs).
#[derive(Debug, Default)]
pub struct SparseIndex {
    pub(crate) modifier: Modifier,
    pub(crate) docs: HashMap<u64, SparseVector>,
    pub(crate) lists: HashMap<u32, PostingList>,
    /// The newest sequence number applied.
    pub(crate) applied: Seq,
    /// The largest document number ever held (the search's dense
    /// accumulator spans `0..=max_doc` when the numbers are dense).
    pub(crate) max_doc: Option<u64>,
}

impl SparseIndex {
    pub fn new(modifier: Modifier) -> SparseIndex {
        SparseIndex {
            modifier,
            ..Default::default()
        }
    }

    pub fn modifier(&self) -> Modifier {
        self.modifier
    }

    /// Documents held.
    pub fn len(&self) -> usize {
        self.docs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.docs.is_empty()
    }

    /// Distinct terms with at least one document.
    pub fn terms(&self) -> usize {
        self.lists.len()
    }

    /// The newest sequence number applied ([`SparseIndex::upsert`] and
    /// [`SparseIndex::delete`] record it; a save writes it).
    pub fn applied_seq(&self) -> Seq {
        self.applied
    }

    /// Records that every operation through `seq` is applied (the caller
    /// holds the operations' order: those that did not reach the index
    /// changed nothing in it).
    pub fn mark_applied(&mut self, seq: Seq) {
        self.applied = self.applied.max(seq);
    }

    pub fn contains(&self, doc: u64) -> bool {
        self.docs.contains_key(&doc)
    }

    pub fn get(&self, doc: u64) -> Option<&SparseVector> {
        self.docs.get(&doc)
    }

    /// Every document and its vector, in no order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &SparseVector)> {
        self.docs.iter().map(|(&d, v)| (d, v))
    }

    /// Sets (or replaces) `doc`'s vector. Idempotent: replaying it leaves
    /// the same state.
    pub fn upsert(&mut self, seq: Seq, doc: u64, v: SparseVector) {
        self.remove_postings(doc);
        for (&t, &w) in v.indices().iter().zip(v.values()) {
            self.lists.entry(t).or_default().put(doc, w);
        }
        self.docs.insert(doc, v);
        self.max_doc = self.max_doc.max(Some(doc));
        self.applied = self.applied.max(seq);
    }

    /// Removes `doc`; whether it was there. Idempotent.
    pub fn delete(&mut self, seq: Seq, doc: u64) -> bool {
        let had = self.remove_postings(doc);
        self.docs.remove(&doc);
        self.applied = self.applied.max(seq);
        had
    }

    fn remove_postings(&mut self, doc: u64) -> bool {
        let Some(old) = self.docs.get(&doc) else {
            return false;
        };
        for t in old.indices() {
            if let Some(list) = self.lists.get_mut(t) {
                list.remove(doc);
                if list.is_empty() {
                    self.lists.remove(t);
                }
            }
        }
        true
    }

    /// Documents holding `term`.
    pub fn doc_freq(&self, term: u32) -> usize {
        self.lists.get(&term).map_or(0, PostingList::len)
    }

    /// Qdrant's IDF of `term` over this index's live documents.
    pub fn idf(&self, term: u32) -> f64 {
        let n = self.docs.len() as f64;
        let df = self.doc_freq(term) as f64;
        ((n - df + 0.5) / (df + 0.5) + 1.0).ln()
    }

    /// The query as the dot product sees it: reweighted by the modifier.
    pub fn effective_query(&self, q: &SparseVector) -> SparseVector {
        match self.modifier {
            Modifier::None => q.clone(),
            Modifier::Idf => q.reweighted(|t| self.idf(t)),
        }
    }

    /// Bytes held (approximate: vectors, postings, bounds).
    pub fn memory_bytes(&self) -> usize {
        let vectors: usize = self.docs.values().map(|v| 8 * v.len() + 64).sum();
        let postings: usize = self.lists.values().map(|l| 12 * l.len() + 64).sum();
        vectors + postings
    }

    #[cfg(test)]
    pub(crate) fn check(&self) {
        let mut count = 0;
        for (t, l) in &self.lists {
            l.check();
            assert!(!l.is_empty());
            for (d, w) in l.docs().iter().zip(l.weights()) {
                let v = &self.docs[d];
                let i = v.indices().binary_search(t).unwrap();
                assert_eq!(v.values()[i], *w);
            }
            count += l.len();
        }
        assert_eq!(
            count,
            self.docs.values().map(SparseVector::len).sum::<usize>()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sv(i: &[u32], v: &[f32]) -> SparseVector {
        SparseVector::new(i.to_vec(), v.to_vec()).unwrap()
    }

    #[test]
    fn upsert_replaces_and_delete_removes_postings() {
        let mut x = SparseIndex::new(Modifier::None);
        x.upsert(1, 7, sv(&[1, 2, 3], &[1.0, 2.0, 3.0]));
        x.upsert(2, 8, sv(&[2], &[5.0]));
        x.upsert(3, 7, sv(&[3, 4], &[1.0, 1.0]));
        x.check();
        assert_eq!(x.doc_freq(1), 0);
        assert_eq!(x.doc_freq(2), 1);
        assert_eq!(x.terms(), 3);
        assert!(x.delete(4, 8));
        assert!(!x.delete(5, 8));
        x.check();
        assert_eq!(x.terms(), 2);
        assert_eq!(x.applied_seq(), 5);
    }

    #[test]
    fn idf_follows_qdrants_formula() {
        let mut x = SparseIndex::new(Modifier::Idf);
        for d in 0..10 {
            x.upsert(1, d, sv(&[1, 100 + d as u32], &[1.0, 1.0]));
        }
        // N = 10: term 1 in all, term 100 in one.
        assert!((x.idf(1) - ((0.5f64 / 10.5) + 1.0).ln()).abs() < 1e-12);
        assert!((x.idf(100) - ((9.5f64 / 1.5) + 1.0).ln()).abs() < 1e-12);
        assert!((x.idf(5) - ((10.5f64 / 0.5) + 1.0).ln()).abs() < 1e-12);
        let q = x.effective_query(&sv(&[1, 100], &[2.0, 2.0]));
        assert!((f64::from(q.values()[1]) - 2.0 * x.idf(100)).abs() < 1e-5);
    }
}
