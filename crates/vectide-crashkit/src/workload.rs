//! The kit's seeded operations: a pure function of the seed, the round, the
//! writer and the operation's number, so that a parent process can name
//! what its killed child was doing.

/// The crash simulators' seeded generator (splitmix64).
pub use vectide_storage::SplitMix as Rng;

/// A vector with components uniform in [-1, 1).
pub fn vector(rng: &mut Rng, dim: usize) -> Vec<f32> {
    (0..dim).map(|_| rng.unit() * 2.0 - 1.0).collect()
}

/// Dimension of the kit's vectors.
pub const DIM: usize = 12;

/// Operation `k` of writer `thread` in round `round`: `(label, Some(vector))`
/// upserts, `(label, None)` deletes (three in ten). `retry`: the label of the
/// writer's operation in flight at the last crash; its first operation of
/// the round goes to that label again, with new content (a client retrying
/// what it got no answer for).
pub fn op(
    seed: u64,
    round: usize,
    thread: usize,
    k: u64,
    labels: u64,
    retry: Option<u64>,
) -> (u64, Option<Vec<f32>>) {
    let mut rng = Rng(seed
        ^ (round as u64).wrapping_mul(0x2545_f491_4f6c_dd1d)
        ^ (thread as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ k.wrapping_mul(0xd6e8_feb8_6659_fd93));
    let label = rng.next_u64() % labels.max(1);
    let label = retry.filter(|_| k == 0).unwrap_or(label);
    if rng.below(10) < 3 {
        (label, None)
    } else {
        (label, Some(vector(&mut rng, DIM)))
    }
}

/// Label → vector: the state a history is checked against.
pub type Model = std::collections::HashMap<u64, Vec<f32>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operations_are_a_function_of_their_coordinates_and_retries_come_first() {
        assert_eq!(op(1, 2, 0, 5, 32, None), op(1, 2, 0, 5, 32, None));
        assert_ne!(op(1, 2, 0, 5, 32, None), op(1, 2, 1, 5, 32, None));
        assert_eq!(op(1, 2, 0, 0, 32, Some(31)).0, 31);
        assert!((0..200).all(|k| op(3, 0, 0, k, 32, Some(31)).0 < 32));
        let deletes = (0..1000)
            .filter(|&k| op(3, 0, 0, k, 32, None).1.is_none())
            .count();
        assert!((200..400).contains(&deletes), "{deletes} deletes in 1000");
    }
}
