//! # vectide-sparse
//!
//! The sparse-vector room: Qdrant-shaped sparse vectors (u32 term indices,
//! f32 weights) searched by dot product over an inverted index.
//!
//! - `vector.rs`: [`SparseVector`], checked where it enters (equal lengths,
//!   unique indices, finite values), kept sorted by index.
//! - `postings.rs`: one term's posting list in document order, with its
//!   largest and smallest weight.
//! - `index.rs`: [`SparseIndex`] (each document's vector and the posting
//!   lists; upsert and delete are idempotent per document), the
//!   [`Modifier`] (Qdrant's IDF).
//! - `search.rs`: exact top-k by dot product, MaxScore term at a time
//!   (a seeded threshold, the essential lists accumulated, the rest never
//!   read), filters asked inside the search, ties in the caller's order;
//!   `search_scan`, the full scan it must agree with.
//! - `persist.rs`: save and load (`docs/format-sparse.md`).
//!
//! The index is volatile: the database makes it durable through its one
//! commit log and checkpoints (a saved file plus the log's tail), as it
//! does the volatile dense engines.

mod index;
mod persist;
mod postings;
mod search;
mod vector;

pub use index::{Modifier, SparseIndex};
pub use persist::{END_MAGIC, FORMAT_VERSION, HEADER_LEN, MAGIC, TRAILER_LEN};
pub use search::SearchStats;
pub use vector::{SparseVector, MAX_NNZ};

#[cfg(test)]
mod tests {
    use super::*;
    use std::cmp::Ordering;

    fn sv(i: &[u32], v: &[f32]) -> SparseVector {
        SparseVector::new(i.to_vec(), v.to_vec()).unwrap()
    }

    #[test]
    fn search_scores_overlapping_documents_only_and_breaks_ties_by_the_callers_order() {
        let mut x = SparseIndex::new(Modifier::None);
        x.upsert(1, 1, sv(&[1], &[1.0]));
        x.upsert(1, 2, sv(&[1, 2], &[1.0, 0.0]));
        x.upsert(1, 3, sv(&[2], &[5.0]));
        x.upsert(1, 4, sv(&[3], &[9.0]));
        x.upsert(1, 5, sv(&[1], &[-1.0]));
        let q = sv(&[1], &[2.0]);
        let asc = |a: u64, b: u64| a.cmp(&b);
        let desc = |a: u64, b: u64| b.cmp(&a);
        let (r, _) = x.search(&q, 10, &|_| true, &asc);
        assert_eq!(r, vec![(1, 2.0), (2, 2.0), (5, -2.0)]);
        let (r, _) = x.search(&q, 1, &|_| true, &desc);
        assert_eq!(r, vec![(2, 2.0)]);
        let (r, _) = x.search(&q, 10, &|d| d != 1, &asc);
        assert_eq!(r, vec![(2, 2.0), (5, -2.0)]);
        let _: Ordering = asc(1, 2);
    }

    #[test]
    fn weights_that_cancel_do_not_prune_a_true_answer() {
        // Document 1's partial sum rounds to 0 in term order (2^30 +
        // 2^-30 - 2^30) though its score is 2^-30, above document 0's.
        let big = 2f32.powi(30);
        let mut x = SparseIndex::new(Modifier::None);
        x.upsert(1, 0, sv(&[3], &[2f32.powi(-31)]));
        x.upsert(1, 1, sv(&[1, 2, 3], &[big, -big, 2f32.powi(-30)]));
        let q = sv(&[1, 2, 3], &[1.0, 1.0, 1.0]);
        let asc = |a: u64, b: u64| a.cmp(&b);
        let (got, _) = x.search(&q, 1, &|_| true, &asc);
        assert_eq!(got, x.search_scan(&q, 1, &|_| true, &asc));
        assert_eq!(got[0].0, 1);
    }

    #[test]
    fn a_search_inside_a_filter_gets_its_own_scratch() {
        let mut x = SparseIndex::new(Modifier::None);
        for d in 0..2_000u64 {
            x.upsert(
                1,
                d,
                sv(&[(d % 7) as u32, 9], &[1.0 + (d % 13) as f32, 0.5]),
            );
        }
        let q = sv(&[0, 3, 9], &[1.0, 2.0, 1.0]);
        let asc = |a: u64, b: u64| a.cmp(&b);
        let inner = sv(&[3], &[1.0]);
        // The filter searches too (on the same thread, mid-search).
        let keep = |d: u64| {
            let (r, _) = x.search(&inner, 3, &|_| true, &asc);
            r.len() == 3 && d.is_multiple_of(2)
        };
        let (got, _) = x.search(&q, 20, &keep, &asc);
        assert_eq!(got, x.search_scan(&q, 20, &|d| d.is_multiple_of(2), &asc));
        assert_eq!(got.len(), 20);
    }

    #[test]
    fn a_search_a_panicking_filter_cut_short_leaves_no_trace() {
        let mut x = SparseIndex::new(Modifier::None);
        for d in 0..5_000u64 {
            x.upsert(
                1,
                d,
                sv(&[(d % 11) as u32, 20], &[1.0 + (d % 17) as f32, 0.25]),
            );
        }
        let q = sv(&[1, 2, 20], &[1.0, 3.0, 1.0]);
        let asc = |a: u64, b: u64| a.cmp(&b);
        // The filter fails at its first call, while the query's sums are
        // in the thread's array (no list is short enough for a seed).
        let cut = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            x.search(&q, 50, &|_| panic!("a filter that fails"), &asc)
        }));
        assert!(cut.is_err());
        // The same thread's next search (of another term) works as on a
        // fresh thread, read for read.
        let q2 = sv(&[3], &[1.0]);
        let here = x.search(&q2, 50, &|_| true, &asc);
        let fresh = std::thread::scope(|s| {
            s.spawn(|| x.search(&q2, 50, &|_| true, &asc))
                .join()
                .unwrap()
        });
        assert_eq!(here, fresh);
        assert_eq!(here.0, x.search_scan(&q2, 50, &|_| true, &asc));
    }

    #[test]
    fn an_idf_weight_past_f32_is_clamped() {
        let mut x = SparseIndex::new(Modifier::Idf);
        x.upsert(1, 0, sv(&[1], &[1.0]));
        x.upsert(1, 1, sv(&[2], &[1.0]));
        let q = x.effective_query(&sv(&[1], &[3e38]));
        assert!(q.values()[0].is_finite());
        let asc = |a: u64, b: u64| a.cmp(&b);
        let (got, _) = x.search(&sv(&[1], &[3e38]), 2, &|_| true, &asc);
        assert_eq!(got.len(), 1);
        assert!(got[0].1.is_finite());
    }

    #[test]
    fn pruning_skips_most_postings_of_a_common_term() {
        let mut x = SparseIndex::new(Modifier::None);
        // Term 0 in every document with a small weight; term 1 in a few
        // with a large one.
        for d in 0..20_000u64 {
            let (t, v) = if d % 1000 == 0 {
                (vec![0, 1], vec![0.01, 10.0 + d as f32 / 1000.0])
            } else {
                (vec![0], vec![0.01 * ((d % 7) as f32 + 1.0)])
            };
            x.upsert(1, d, SparseVector::new(t, v).unwrap());
        }
        let q = sv(&[0, 1], &[1.0, 1.0]);
        let asc = |a: u64, b: u64| a.cmp(&b);
        let (r, stats) = x.search(&q, 10, &|_| true, &asc);
        assert_eq!(r, x.search_scan(&q, 10, &|_| true, &asc));
        assert_eq!(stats.postings, 20_020);
        assert!(stats.scored < 2_000, "{stats:?}");
        // The common term's list is never read.
        assert!(stats.read < 1_000, "{stats:?}");
    }
}
