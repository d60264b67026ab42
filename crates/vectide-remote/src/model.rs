//! Exact counters of a transport and the network model's virtual clock.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// What a round trip costs under the model: `latency` plus the frame bytes
/// (both ways) over `bandwidth`. The defaults are named after RDMA: 3 µs
/// and 100 Gb/s (a ConnectX-6 link, the seed paper's testbed).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NetModel {
    pub latency: Duration,
    /// Bits per second.
    pub bandwidth_bps: f64,
}

impl Default for NetModel {
    fn default() -> Self {
        NetModel {
            latency: Duration::from_micros(3),
            bandwidth_bps: 100e9,
        }
    }
}

impl NetModel {
    /// The modelled time of one round trip that moved `bytes` (both ways).
    pub fn round_trip_ns(&self, bytes: u64) -> u64 {
        let wire = bytes as f64 * 8.0 / self.bandwidth_bps * 1e9;
        self.latency.as_nanos() as u64 + wire.round() as u64
    }
}

/// A transport's exact counts and its virtual clock (per compute node:
/// every transport object is one). Shared by the transport's threads.
#[derive(Debug, Default)]
pub struct Counters {
    model: NetModel,
    round_trips: AtomicU64,
    work_requests: AtomicU64,
    bytes_sent: AtomicU64,
    bytes_received: AtomicU64,
    model_ns: AtomicU64,
    wall_ns: AtomicU64,
}

/// A copy of [`Counters`] at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CountersSnapshot {
    pub round_trips: u64,
    pub work_requests: u64,
    pub bytes_sent: u64,
    pub bytes_received: u64,
    /// The modelled network time of every round trip so far.
    pub model_ns: u64,
    /// The wall time the transport spent in round trips (sending the frame
    /// to having read the reply).
    pub wall_ns: u64,
}

impl CountersSnapshot {
    /// The counts between `earlier` and this snapshot.
    pub fn since(&self, earlier: &CountersSnapshot) -> CountersSnapshot {
        CountersSnapshot {
            round_trips: self.round_trips - earlier.round_trips,
            work_requests: self.work_requests - earlier.work_requests,
            bytes_sent: self.bytes_sent - earlier.bytes_sent,
            bytes_received: self.bytes_received - earlier.bytes_received,
            model_ns: self.model_ns - earlier.model_ns,
            wall_ns: self.wall_ns - earlier.wall_ns,
        }
    }
}

impl Counters {
    /// Counters under `model`.
    pub fn new(model: NetModel) -> Counters {
        Counters {
            model,
            ..Counters::default()
        }
    }

    /// The model in use.
    pub fn model(&self) -> NetModel {
        self.model
    }

    /// Records one round trip: `wrs` work requests (0 for a control verb),
    /// the frame bytes each way, and its wall time. Returns its modelled
    /// time in nanoseconds.
    pub fn record(&self, wrs: u64, sent: u64, received: u64, wall: Duration) -> u64 {
        let ns = self.model.round_trip_ns(sent + received);
        self.round_trips.fetch_add(1, Ordering::Relaxed);
        self.work_requests.fetch_add(wrs, Ordering::Relaxed);
        self.bytes_sent.fetch_add(sent, Ordering::Relaxed);
        self.bytes_received.fetch_add(received, Ordering::Relaxed);
        self.model_ns.fetch_add(ns, Ordering::Relaxed);
        self.wall_ns
            .fetch_add(wall.as_nanos() as u64, Ordering::Relaxed);
        ns
    }

    /// The counts so far.
    pub fn snapshot(&self) -> CountersSnapshot {
        CountersSnapshot {
            round_trips: self.round_trips.load(Ordering::Relaxed),
            work_requests: self.work_requests.load(Ordering::Relaxed),
            bytes_sent: self.bytes_sent.load(Ordering::Relaxed),
            bytes_received: self.bytes_received.load(Ordering::Relaxed),
            model_ns: self.model_ns.load(Ordering::Relaxed),
            wall_ns: self.wall_ns.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_round_trip_costs_latency_plus_bytes_over_bandwidth() {
        let m = NetModel::default();
        assert_eq!(m.round_trip_ns(0), 3_000);
        // 1 MiB at 100 Gb/s: 83,886 ns on the wire.
        assert_eq!(m.round_trip_ns(1 << 20), 3_000 + 83_886);
        let c = Counters::new(m);
        c.record(3, 100, 1 << 20, Duration::from_micros(50));
        c.record(0, 20, 12, Duration::from_micros(10));
        let s = c.snapshot();
        assert_eq!(
            (
                s.round_trips,
                s.work_requests,
                s.bytes_sent,
                s.bytes_received
            ),
            (2, 3, 120, (1 << 20) + 12)
        );
        assert_eq!(
            s.model_ns,
            m.round_trip_ns(100 + (1 << 20)) + m.round_trip_ns(32)
        );
        assert_eq!(s.wall_ns, 60_000);
        assert_eq!(s.since(&s), CountersSnapshot::default());
    }
}
