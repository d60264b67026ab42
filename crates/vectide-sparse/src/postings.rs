//! One term's posting list: the documents holding the term, in ascending
//! document order, with their weights, and the list's largest and smallest
//! weight (the bounds the search prunes with).
//!
//! Documents mostly arrive in ascending order (the database numbers new
//! points upward), so an insert is usually a push; a point written again
//! replaces its weight in place. An insert or removal in the middle shifts
//! the entries after it; the bounds are recomputed only when the weight
//! that set one changes or goes.

#[derive(Debug, Clone, Default)]
pub struct PostingList {
    docs: Vec<u64>,
    weights: Vec<f32>,
    /// Of the whole list (−∞ and +∞ when it is empty).
    list_max: f32,
    list_min: f32,
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
        if self.docs.is_empty() {
            (self.list_max, self.list_min) = (w, w);
        }
        if self.docs.last().is_none_or(|&d| d < doc) {
            self.docs.push(doc);
            self.weights.push(w);
            self.widen(w);
            return;
        }
        match self.docs.binary_search(&doc) {
            Ok(i) => {
                let old = std::mem::replace(&mut self.weights[i], w);
                if old == self.list_max || old == self.list_min {
                    self.recompute();
                } else {
                    self.widen(w);
                }
            }
            Err(i) => {
                self.docs.insert(i, doc);
                self.weights.insert(i, w);
                self.widen(w);
            }
        }
    }

    /// Removes `doc`; whether it was there.
    pub fn remove(&mut self, doc: u64) -> bool {
        match self.docs.binary_search(&doc) {
            Ok(i) => {
                self.docs.remove(i);
                let old = self.weights.remove(i);
                if old == self.list_max || old == self.list_min {
                    self.recompute();
                }
                true
            }
            Err(_) => false,
        }
    }

    fn widen(&mut self, w: f32) {
        self.list_max = self.list_max.max(w);
        self.list_min = self.list_min.min(w);
    }

    fn recompute(&mut self) {
        self.list_max = self
            .weights
            .iter()
            .copied()
            .fold(f32::NEG_INFINITY, f32::max);
        self.list_min = self.weights.iter().copied().fold(f32::INFINITY, f32::min);
    }

    /// The largest contribution `q · w` an entry can make (the query
    /// weight may be negative); 0 for an empty list.
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

    /// The bounds' consistency with the entries (tests).
    #[cfg(test)]
    pub(crate) fn check(&self) {
        assert!(self.docs.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(self.docs.len(), self.weights.len());
        if !self.docs.is_empty() {
            let mut fresh = self.clone();
            fresh.recompute();
            assert_eq!(
                (fresh.list_max, fresh.list_min),
                (self.list_max, self.list_min)
            );
        }
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
        // The largest weight replaced and removed: the bounds follow.
        let top = p.list_max;
        let at = p.weights().iter().position(|&w| w == top).unwrap();
        let d = p.docs()[at];
        p.put(d, 0.0);
        p.check();
        assert!(p.list_max < top);
        assert!(p.remove(0));
        p.check();
        assert_eq!(p.list_bound(2.0), 2.0 * 297.0);
        assert_eq!(p.list_bound(-1.0), 298.0);
    }
}
