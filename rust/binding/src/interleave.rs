//! `interleave`: a seeded, uniformly random order of labelled blocks (an epoch's order of
//! blocks drawn from several sources), deterministic in its arguments forever.
//!
//! The generator and the shuffle are written out here on purpose: checkpoints store an epoch
//! by its seed, and an external crate's generator or shuffle algorithm may change between
//! versions (rand has changed both before), which would silently change every saved epoch
//! order. SplitMix64 and Fisher-Yates with a multiply-shift bound are fixed by this file alone.

use pyo3::prelude::*;
use pyo3::types::PyBytes;
use syvain_core::error::NativeError;

use crate::error::BindingResult;

/// Labels are u16: at most this many counts.
pub const MAX_LABELS: usize = 1 << 16;
/// At most this many labels in all (512 MiB of output).
pub const MAX_TOTAL: u64 = 1 << 28;

/// SplitMix64 (Steele, Lea and Flood 2014; the constants of Vigna's reference code).
struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// An index in `[0, i]`: the high 64 bits of `next_u64() * (i + 1)` (Lemire's
    /// multiply-shift, without rejection: its bias is below 2**-35 for i < 2**28).
    fn index_upto(&mut self, i: usize) -> usize {
        ((self.next_u64() as u128 * (i as u128 + 1)) >> 64) as usize
    }
}

/// The labels `[0]*counts[0] + [1]*counts[1] + ...`, shuffled by Fisher-Yates (from the last
/// position down, swapping position i with an index j in [0, i]) under SplitMix64(seed).
pub fn interleave_labels(counts: &[u64], seed: u64) -> Vec<u16> {
    let total: u64 = counts.iter().sum();
    let mut labels = Vec::with_capacity(total as usize);
    for (label, &count) in counts.iter().enumerate() {
        labels.extend(std::iter::repeat_n(label as u16, count as usize));
    }
    let mut rng = SplitMix64::new(seed);
    for i in (1..labels.len()).rev() {
        let j = rng.index_upto(i);
        labels.swap(i, j);
    }
    labels
}

/// Checks the counts: at most 65536 labels, none negative, at most 2**28 in all.
fn checked_counts(counts: &[i64]) -> Result<Vec<u64>, NativeError> {
    if counts.len() > MAX_LABELS {
        return Err(NativeError::Config(format!(
            "interleave: {} counts; at most {MAX_LABELS} labels fit in u16",
            counts.len()
        )));
    }
    let mut checked = Vec::with_capacity(counts.len());
    let mut total: u64 = 0;
    for (label, &count) in counts.iter().enumerate() {
        let Ok(count) = u64::try_from(count) else {
            return Err(NativeError::Config(format!(
                "interleave: counts[{label}] is {count}; counts must be >= 0"
            )));
        };
        total = total.saturating_add(count);
        if total > MAX_TOTAL {
            return Err(NativeError::Config(format!(
                "interleave: the counts sum to more than {MAX_TOTAL} (2**28)"
            )));
        }
        checked.push(count);
    }
    Ok(checked)
}

/// `sum(counts)` little-endian u16 labels, label k exactly `counts[k]` times, in a uniformly
/// random order that depends only on `(counts, seed)` (see the module comment). The shuffle
/// runs without the GIL.
#[pyfunction]
pub fn interleave<'py>(
    py: Python<'py>,
    counts: Vec<i64>,
    seed: u64,
) -> BindingResult<Bound<'py, PyBytes>> {
    let counts = checked_counts(&counts)?;
    let bytes: Vec<[u8; 2]> = crate::exiting::without_gil(py, || {
        interleave_labels(&counts, seed)
            .into_iter()
            .map(u16::to_le_bytes)
            .collect()
    });
    Ok(PyBytes::new(py, bytes.as_flattened()))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(interleave, m)?)?;
    Ok(())
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
    fn the_order_is_pinned() {
        // Saved epoch orders depend on this exact output: it must never change.
        assert_eq!(interleave_labels(&[2, 1, 3], 7), PINNED_2_1_3_SEED_7);
        assert_eq!(
            interleave_labels(&[3, 2, 4, 1], 12345),
            [0, 2, 1, 2, 2, 1, 2, 0, 3, 0]
        );
        assert_eq!(interleave_labels(&[], 7), Vec::<u16>::new());
        assert_eq!(interleave_labels(&[0, 1, 0], 99), [1]);
    }

    const PINNED_2_1_3_SEED_7: [u16; 6] = [2, 2, 0, 2, 0, 1];

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
    }

    #[test]
    fn bad_counts_are_refused() {
        assert!(checked_counts(&[1, -1]).is_err());
        assert!(checked_counts(&vec![0; MAX_LABELS + 1]).is_err());
        assert!(checked_counts(&vec![0; MAX_LABELS]).is_ok());
        assert!(checked_counts(&[1 << 27, 1 << 27]).is_ok());
        assert!(checked_counts(&[1 << 27, 1 << 27, 1]).is_err());
        assert!(checked_counts(&[i64::MAX, i64::MAX]).is_err());
    }
}
