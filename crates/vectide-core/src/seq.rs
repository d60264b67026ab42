//! Operation sequence numbers and the low-watermark tracker.

use parking_lot::Mutex;
use std::collections::BTreeMap;

/// A caller-supplied operation sequence number (0 means "none yet").
pub type Seq = u64;

/// Tracks which operations are in flight so that a low watermark can be read
/// while parallel operations finish out of order.
///
/// `watermark()` is the highest sequence number `s` such that every operation
/// that entered through [`SeqTracker::begin`] with a number `<= s` has
/// finished. An operation with a lower number still in flight holds the
/// watermark below itself, however many later ones finished.
#[derive(Debug, Default)]
pub struct SeqTracker {
    inner: Mutex<TrackerState>,
}

#[derive(Debug, Default)]
struct TrackerState {
    /// seq -> number of operations in flight with that seq.
    in_flight: BTreeMap<Seq, usize>,
    /// Highest seq that has finished.
    max_done: Seq,
}

impl SeqTracker {
    /// A tracker whose watermark starts at `start` (e.g. loaded from a file).
    pub fn starting_at(start: Seq) -> Self {
        SeqTracker {
            inner: Mutex::new(TrackerState {
                in_flight: BTreeMap::new(),
                max_done: start,
            }),
        }
    }

    /// Registers an operation; the returned guard marks it finished on drop.
    pub fn begin(&self, seq: Seq) -> SeqGuard<'_> {
        *self.inner.lock().in_flight.entry(seq).or_insert(0) += 1;
        SeqGuard { tracker: self, seq }
    }

    fn finish(&self, seq: Seq) {
        let mut st = self.inner.lock();
        if let Some(n) = st.in_flight.get_mut(&seq) {
            *n -= 1;
            if *n == 0 {
                st.in_flight.remove(&seq);
            }
        }
        st.max_done = st.max_done.max(seq);
    }

    /// The low watermark (see the type docs).
    pub fn watermark(&self) -> Seq {
        let st = self.inner.lock();
        match st.in_flight.keys().next() {
            Some(&lowest) => st.max_done.min(lowest.saturating_sub(1)),
            None => st.max_done,
        }
    }
}

/// Marks an operation finished when dropped (also on error or panic).
pub struct SeqGuard<'a> {
    tracker: &'a SeqTracker,
    seq: Seq,
}

impl Drop for SeqGuard<'_> {
    fn drop(&mut self) {
        self.tracker.finish(self.seq);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_order_completion_holds_the_watermark() {
        let t = SeqTracker::default();
        let a = t.begin(1);
        let b = t.begin(2);
        let c = t.begin(3);
        drop(c);
        assert_eq!(t.watermark(), 0, "1 and 2 still in flight");
        drop(a);
        assert_eq!(t.watermark(), 1);
        drop(b);
        assert_eq!(t.watermark(), 3);
    }

    #[test]
    fn starts_at_loaded_value() {
        let t = SeqTracker::starting_at(41);
        assert_eq!(t.watermark(), 41);
        drop(t.begin(42));
        assert_eq!(t.watermark(), 42);
    }
}
