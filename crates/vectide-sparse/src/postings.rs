//! One term's posting list: the documents holding the term, in ascending
//! document order, with their weights, and per block of [`BLOCK`] entries
//! the block's last document and its largest and smallest weight (the
//! block-max bounds the search prunes with).
//!
//! Documents mostly arrive in ascending order (the database numbers new
//! points upward), so an insert is usually a push; a point written again
//! replaces its weight in place. An insert or removal in the middle shifts
//! the entries after it, and the bounds of the blocks from there on are
//! recomputed: the same order of work as the shift.

/// Entries per block of bounds.
pub const BLOCK: usize = 64;

#[derive(Debug, Clone, Default)]
pub struct PostingList {
    docs: Vec<u64>,
    weights: Vec<f32>,
    /// Per block: the last document, the largest and the smallest weight.
    last: Vec<u64>,
    max: Vec<f32>,
    min: Vec<f32>,
    /// Of the whole list.
    pub(crate) list_max: f32,
    pub(crate) list_min: f32,
}

impl PostingList {
    pub fn len(&self) -> usize {
        self.docs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.docs.is_empty()
    }

    pub fn docs(&self) -> &[u64] {
        &self.docs
    }

    pub fn weights(&self) -> &[f32] {
        &self.weights
    }

    /// Sets `doc`'s weight (inserting it in order if absent).
    pub fn put(&mut self, doc: u64, w: f32) {
        if self.docs.last().is_none_or(|&d| d < doc) {
            self.docs.push(doc);
            self.weights.push(w);
            self.refresh_from(self.docs.len() - 1);
            return;
        }
        match self.docs.binary_search(&doc) {
            Ok(i) => self.weights[i] = w,
            Err(i) => {
                self.docs.insert(i, doc);
                self.weights.insert(i, w);
            }
        }
        let i = self.docs.binary_search(&doc).unwrap_or(0);
        self.refresh_from(i);
    }

    /// Removes `doc`; whether it was there.
    pub fn remove(&mut self, doc: u64) -> bool {
        match self.docs.binary_search(&doc) {
            Ok(i) => {
                self.docs.remove(i);
                self.weights.remove(i);
                self.refresh_from(i);
                true
            }
            Err(_) => false,
        }
    }

    /// Recomputes the bounds of the blocks from the one holding entry `i`.
    fn refresh_from(&mut self, i: usize) {
        let first = i / BLOCK;
        let blocks = self.docs.len().div_ceil(BLOCK);
        self.last.truncate(first);
        self.max.truncate(first);
        self.min.truncate(first);
        for b in first..blocks {
            let range = b * BLOCK..((b + 1) * BLOCK).min(self.docs.len());
            let ws = &self.weights[range.clone()];
            self.last.push(self.docs[range.end - 1]);
            self.max
                .push(ws.iter().copied().fold(f32::NEG_INFINITY, f32::max));
            self.min
                .push(ws.iter().copied().fold(f32::INFINITY, f32::min));
        }
        self.list_max = self.max.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        self.list_min = self.min.iter().copied().fold(f32::INFINITY, f32::min);
    }

    /// The largest contribution `q · w` an entry of block `b` can make
    /// (the query weight may be negative).
    pub(crate) fn block_bound(&self, b: usize, q: f64) -> f64 {
        if q >= 0.0 {
            q * f64::from(self.max[b])
        } else {
            q * f64::from(self.min[b])
        }
    }

    /// The largest contribution over the whole list.
    pub(crate) fn list_bound(&self, q: f64) -> f64 {
        if self.docs.is_empty() {
            return 0.0;
        }
        if q >= 0.0 {
            q * f64::from(self.list_max)
        } else {
            q * f64::from(self.list_min)
        }
    }

    /// The block an entry index falls in.
    pub(crate) fn block_of(i: usize) -> usize {
        i / BLOCK
    }

    /// The first entry at or after `from` whose document is ≥ `doc`,
    /// skipping whole blocks by their last document.
    pub(crate) fn seek(&self, from: usize, doc: u64) -> usize {
        if from >= self.docs.len() || self.docs[from] >= doc {
            return from;
        }
        let mut b = from / BLOCK;
        while b < self.last.len() && self.last[b] < doc {
            b += 1;
        }
        if b == self.last.len() {
            return self.docs.len();
        }
        let start = (b * BLOCK).max(from);
        let end = ((b + 1) * BLOCK).min(self.docs.len());
        start + self.docs[start..end].partition_point(|&d| d < doc)
    }

    /// The bounds' consistency with the entries (tests).
    #[cfg(test)]
    pub(crate) fn check(&self) {
        assert!(self.docs.windows(2).all(|w| w[0] < w[1]));
        let mut fresh = PostingList {
            docs: self.docs.clone(),
            weights: self.weights.clone(),
            ..Default::default()
        };
        if !fresh.docs.is_empty() {
            fresh.refresh_from(0);
        }
        assert_eq!(fresh.last, self.last);
        assert_eq!(fresh.max, self.max);
        assert_eq!(fresh.min, self.min);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn put_remove_keep_order_and_bounds() {
        let mut p = PostingList::default();
        for d in (0..300u64).rev().step_by(2) {
            p.put(d, d as f32);
        }
        p.check();
        for d in (0..300u64).step_by(2) {
            p.put(d, -(d as f32));
        }
        p.check();
        assert_eq!(p.len(), 300);
        p.put(10, 99.0);
        assert_eq!(p.weights()[10], 99.0);
        assert!(p.remove(150));
        assert!(!p.remove(150));
        p.check();
        assert_eq!(p.seek(0, 150), 150);
        assert_eq!(p.docs()[p.seek(0, 150)], 151);
        assert_eq!(p.seek(0, 1000), p.len());
        assert_eq!(p.seek(200, 3), 200);
        assert_eq!(p.list_bound(2.0), 2.0 * 299.0);
        assert_eq!(p.list_bound(-1.0), 298.0);
    }
}
