//! Distance metrics and the mapping from a metric to its kernel.

use crate::distance;
use crate::error::{Error, Result};

/// How two vectors are compared. Distances are always "smaller is closer".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Metric {
    /// Squared Euclidean distance.
    L2 = 0,
    /// Negative inner product (`-dot`).
    Ip = 1,
    /// `1 - cos`; vectors are L2-normalised at insert and compared by inner product.
    Cosine = 2,
}

/// A distance function over two slices of equal length.
pub type DistanceFn = fn(&[f32], &[f32]) -> f32;

impl Metric {
    /// Parses `l2`, `ip` or `cosine` (also accepts `euclidean`, `angular`, `dot`).
    pub fn parse(name: &str) -> Result<Self> {
        match name.to_ascii_lowercase().as_str() {
            "l2" | "euclidean" | "euclid" => Ok(Metric::L2),
            "ip" | "dot" | "inner_product" => Ok(Metric::Ip),
            "cosine" | "angular" | "cos" => Ok(Metric::Cosine),
            other => Err(Error::invalid(format!(
                "unknown metric {other:?}: expected one of \"l2\", \"ip\", \"cosine\""
            ))),
        }
    }

    /// The canonical lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            Metric::L2 => "l2",
            Metric::Ip => "ip",
            Metric::Cosine => "cosine",
        }
    }

    /// Decodes the on-disk tag written by `self as u8`.
    pub fn from_tag(tag: u8) -> Result<Self> {
        match tag {
            0 => Ok(Metric::L2),
            1 => Ok(Metric::Ip),
            2 => Ok(Metric::Cosine),
            t => Err(Error::corrupted(format!("unknown metric tag {t}"))),
        }
    }

    /// The "smaller is closer" distance for stored (already normalised) vectors.
    ///
    /// The kernel is resolved once here through runtime CPU dispatch; engines
    /// keep the returned pointer so that the hot path pays no dispatch.
    pub fn distance_fn(self) -> DistanceFn {
        match self {
            Metric::L2 => distance::l2_sq_fn(),
            Metric::Ip => distance::neg_dot_fn(),
            Metric::Cosine => distance::one_minus_dot_fn(),
        }
    }

    /// Whether vectors are normalised when they enter the index.
    pub fn normalizes(self) -> bool {
        self == Metric::Cosine
    }
}

impl std::fmt::Display for Metric {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_round_trip() {
        for m in [Metric::L2, Metric::Ip, Metric::Cosine] {
            assert_eq!(Metric::parse(m.name()).unwrap(), m);
            assert_eq!(Metric::from_tag(m as u8).unwrap(), m);
        }
        assert!(Metric::parse("hamming").is_err());
        assert!(Metric::from_tag(9).is_err());
    }

    #[test]
    fn distances_are_smaller_is_closer() {
        let a = [1.0f32, 0.0];
        let b = [0.6f32, 0.8];
        assert!((Metric::L2.distance_fn()(&a, &b) - 0.8).abs() < 1e-6);
        assert!((Metric::Ip.distance_fn()(&a, &b) + 0.6).abs() < 1e-6);
        assert!((Metric::Cosine.distance_fn()(&a, &b) - 0.4).abs() < 1e-6);
    }
}
