//! The one generator of the loader's epoch order: shard and block permutations, the
//! interleaving of a window's blocks and the mixing phases all come from here, so an order is
//! the same on every Python version and platform (SPEC section 6, the order, v4).
//!
//! The generator and the shuffle are written out on purpose: checkpoints store an epoch by its
//! seed, and an external crate's generator or shuffle algorithm may change between versions
//! (rand has changed both before; Python's `random.shuffle` promises nothing), which would
//! silently change every saved epoch order. SplitMix64 and Fisher-Yates with a multiply-shift
//! bound are fixed by this file alone, and pinned by its test vectors. Each decision's seed is
//! the SHA-256 of its name, taken on the Python side (`loading.block_order.plan_seed`).

/// SplitMix64 (Steele, Lea and Flood 2014; the constants of Vigna's reference code).
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// An index in `[0, i]`: the high 64 bits of `next_u64() * (i + 1)` (Lemire's
    /// multiply-shift, without rejection: its bias is below 2**-32 for i < 2**32).
    pub fn index_upto(&mut self, i: usize) -> usize {
        ((self.next_u64() as u128 * (i as u128 + 1)) >> 64) as usize
    }

    /// A float in [0, 1) with 53 random bits.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// Fisher-Yates from the last position down, swapping position i with an index j in [0, i].
fn shuffle<T>(items: &mut [T], rng: &mut SplitMix64) {
    for i in (1..items.len()).rev() {
        let j = rng.index_upto(i);
        items.swap(i, j);
    }
}

/// A uniformly random permutation of `0..count` drawn from `seed`.
pub fn permutation(count: u64, seed: u64) -> Vec<u64> {
    let mut items: Vec<u64> = (0..count).collect();
    shuffle(&mut items, &mut SplitMix64::new(seed));
    items
}

/// The labels `[0]*counts[0] + [1]*counts[1] + ...`, shuffled under SplitMix64(seed): the
/// interleaving of a window's blocks, each block keeping its records' order.
pub fn interleave_labels(counts: &[u64], seed: u64) -> Vec<u16> {
    let total: u64 = counts.iter().sum();
    let mut labels = Vec::with_capacity(total as usize);
    for (label, &count) in counts.iter().enumerate() {
        labels.extend(std::iter::repeat_n(label as u16, count as usize));
    }
    shuffle(&mut labels, &mut SplitMix64::new(seed));
    labels
}

/// The labels `[0]*counts[0] + [1]*counts[1] + ...` spread so each block's records sit about
/// evenly over the window: record j of block k gets the key
/// `(j + (phase_k + jitter) / 2) / counts[k]`, and the labels come out in key order (ties by
/// label). `phase_k` (one draw per block, in label order) places the block in a round;
/// `jitter` (one draw per record, taken when the previous record of its block is emitted)
/// moves each record within half a round, so consecutive records of a block stay at least
/// half a round apart and the blocks' order varies from round to round. Any run of positions
/// then draws from its blocks in proportion to their sizes, with less spread than a uniform
/// interleaving (whose runs of 32 among 64 equal blocks repeat a block about 6 times).
pub fn spread_labels(counts: &[u64], seed: u64) -> Vec<u16> {
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;

    let mut rng = SplitMix64::new(seed);
    let phases: Vec<f64> = counts.iter().map(|_| rng.unit()).collect();
    // Keys are finite and >= 0, so their bit patterns order as the floats do.
    let key = |record: u64, label: usize, rng: &mut SplitMix64| -> u64 {
        let offset = (phases[label] + rng.unit()) * 0.5;
        ((record as f64 + offset) / counts[label] as f64).to_bits()
    };
    let mut heap = BinaryHeap::with_capacity(counts.len());
    for (label, &count) in counts.iter().enumerate() {
        if count > 0 {
            heap.push(Reverse((key(0, label, &mut rng), label as u16, 0u64)));
        }
    }
    let total: u64 = counts.iter().sum();
    let mut labels = Vec::with_capacity(total as usize);
    while let Some(Reverse((_, label, record))) = heap.pop() {
        labels.push(label);
        let next = record + 1;
        if next < counts[label as usize] {
            heap.push(Reverse((key(next, label as usize, &mut rng), label, next)));
        }
    }
    labels
}

/// `count` floats in [0, 1) drawn from `seed` (mixing phases).
pub fn unit_floats(count: usize, seed: u64) -> Vec<f64> {
    let mut rng = SplitMix64::new(seed);
    (0..count).map(|_| rng.unit()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix64_matches_the_reference_sequence() {
        let mut rng = SplitMix64::new(0);
        let first: Vec<u64> = (0..4).map(|_| rng.next_u64()).collect();
        assert_eq!(
            first,
            [
                0xE220_A839_7B1D_CDAF,
                0x6E78_9E6A_A1B9_65F4,
                0x06C4_5D18_8009_454F,
                0xF88B_B8A8_724C_81EC,
            ]
        );
        // Vigna's splitmix64.c seeded with 1234567.
        let mut rng = SplitMix64::new(1234567);
        let first: Vec<u64> = (0..5).map(|_| rng.next_u64()).collect();
        assert_eq!(
            first,
            [
                6457827717110365317,
                3203168211198807973,
                9817491932198370423,
                4593380528125082431,
                16408922859458223821,
            ]
        );
    }

    #[test]
    fn the_interleaving_is_pinned() {
        // Saved epoch orders depend on this exact output: it must never change.
        assert_eq!(interleave_labels(&[2, 1, 3], 7), [2, 2, 0, 2, 0, 1]);
        assert_eq!(
            interleave_labels(&[3, 2, 4, 1], 12345),
            [0, 2, 1, 2, 2, 1, 2, 0, 3, 0]
        );
        assert_eq!(interleave_labels(&[], 7), Vec::<u16>::new());
        assert_eq!(interleave_labels(&[0, 1, 0], 99), [1]);
    }

    #[test]
    fn the_spread_is_pinned_and_spreads() {
        // Saved epoch orders depend on this exact output: it must never change.
        assert_eq!(spread_labels(&[2, 1, 3], 7), PINNED_SPREAD_7);
        assert_eq!(spread_labels(&[], 7), Vec::<u16>::new());
        assert_eq!(spread_labels(&[0, 1, 0], 99), [1]);
        // 64 equal blocks: a run of 32 positions holds about 31 distinct blocks (a uniform
        // interleaving about 25.5).
        let labels = spread_labels(&[20; 64], 3);
        let distinct: usize = labels
            .chunks(32)
            .map(|run| run.iter().collect::<std::collections::HashSet<_>>().len())
            .sum();
        let mean = distinct as f64 / 40.0;
        assert!(mean > 30.0, "{mean}");
    }

    const PINNED_SPREAD_7: [u16; 6] = [2, 1, 0, 2, 0, 2];

    #[test]
    fn the_permutation_is_pinned() {
        // As above: these vectors are saved epoch orders.
        assert_eq!(permutation(10, 42), PINNED_PERMUTATION_10_SEED_42);
        assert_eq!(permutation(0, 42), Vec::<u64>::new());
        assert_eq!(permutation(1, 42), [0]);
    }

    const PINNED_PERMUTATION_10_SEED_42: [u64; 10] = [8, 3, 6, 5, 4, 0, 9, 2, 1, 7];

    #[test]
    fn the_unit_floats_are_pinned_and_in_range() {
        let floats = unit_floats(1000, 3);
        assert!(floats.iter().all(|&f| (0.0..1.0).contains(&f)));
        let mean = floats.iter().sum::<f64>() / 1000.0;
        assert!((mean - 0.5).abs() < 0.05, "{mean}");
        assert_eq!(unit_floats(2, 0), PINNED_UNIT_SEED_0);
    }

    const PINNED_UNIT_SEED_0: [f64; 2] = [0.8833108082136426, 0.43152799704850997];

    #[test]
    fn a_permutation_holds_every_index_once_and_depends_on_the_seed() {
        for seed in [0, 1, 7, u64::MAX] {
            let mut sorted = permutation(1000, seed);
            sorted.sort_unstable();
            assert_eq!(sorted, (0..1000).collect::<Vec<u64>>());
        }
        assert_ne!(permutation(100, 1), permutation(100, 2));
    }

    #[test]
    fn each_label_appears_its_count() {
        let counts = [5u64, 0, 17, 1, 300, 2];
        for seed in [0, 1, 7, u64::MAX] {
            let labels = interleave_labels(&counts, seed);
            assert_eq!(labels.len() as u64, counts.iter().sum::<u64>());
            for (label, &count) in counts.iter().enumerate() {
                let seen = labels.iter().filter(|&&l| l as usize == label).count();
                assert_eq!(seen as u64, count, "label {label}, seed {seed}");
            }
        }
        assert_ne!(interleave_labels(&counts, 1), interleave_labels(&counts, 2));
        for seed in [0, 1, 7, u64::MAX] {
            let labels = spread_labels(&counts, seed);
            for (label, &count) in counts.iter().enumerate() {
                let seen = labels.iter().filter(|&&l| l as usize == label).count();
                assert_eq!(seen as u64, count, "label {label}, seed {seed}");
            }
        }
        assert_ne!(spread_labels(&counts, 1), spread_labels(&counts, 2));
    }
}
