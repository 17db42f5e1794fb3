//! The epoch order's generator for Python (`syvain_core::order`): permutations, the
//! interleaving of a window's blocks and mixing phases, each computed without the GIL.

use pyo3::prelude::*;
use pyo3::types::PyBytes;
use syvain_core::error::NativeError;
use syvain_core::order::{interleave_labels, permutation as permute, spread_labels, unit_floats};

use crate::error::BindingResult;

/// Labels are u16: at most this many counts.
pub const MAX_LABELS: usize = 1 << 16;
/// At most this many labels in all (512 MiB of output).
pub const MAX_TOTAL: u64 = 1 << 28;
/// Items a permutation or a draw of floats holds at most (2 GiB of output).
pub const MAX_ITEMS: u64 = 1 << 28;

/// Checks the counts: at most 65536 labels, none negative, at most 2**28 in all.
fn checked_counts(what: &str, counts: &[i64]) -> Result<Vec<u64>, NativeError> {
    if counts.len() > MAX_LABELS {
        return Err(NativeError::Config(format!(
            "{what}: {} counts; at most {MAX_LABELS} labels fit in u16",
            counts.len()
        )));
    }
    let mut checked = Vec::with_capacity(counts.len());
    let mut total: u64 = 0;
    for (label, &count) in counts.iter().enumerate() {
        let Ok(count) = u64::try_from(count) else {
            return Err(NativeError::Config(format!(
                "{what}: counts[{label}] is {count}; counts must be >= 0"
            )));
        };
        total = total.saturating_add(count);
        if total > MAX_TOTAL {
            return Err(NativeError::Config(format!(
                "{what}: the counts sum to more than {MAX_TOTAL} (2**28)"
            )));
        }
        checked.push(count);
    }
    Ok(checked)
}

/// `sum(counts)` little-endian u16 labels, label k exactly `counts[k]` times, in a uniformly
/// random order that depends only on `(counts, seed)` (the earlier seeded order's windows).
#[pyfunction]
pub fn interleave<'py>(
    py: Python<'py>,
    counts: Vec<i64>,
    seed: u64,
) -> BindingResult<Bound<'py, PyBytes>> {
    labels_bytes(py, "interleave", &counts, seed, interleave_labels)
}

/// As [`interleave`], with each label's occurrences spread about evenly over the output
/// (`syvain_core::order::spread_labels`): the windows of the seeded order.
#[pyfunction]
pub fn spread<'py>(
    py: Python<'py>,
    counts: Vec<i64>,
    seed: u64,
) -> BindingResult<Bound<'py, PyBytes>> {
    labels_bytes(py, "spread", &counts, seed, spread_labels)
}

fn labels_bytes<'py>(
    py: Python<'py>,
    what: &str,
    counts: &[i64],
    seed: u64,
    labels: fn(&[u64], u64) -> Vec<u16>,
) -> BindingResult<Bound<'py, PyBytes>> {
    let counts = checked_counts(what, counts)?;
    let bytes: Vec<[u8; 2]> = crate::exiting::without_gil(py, || {
        labels(&counts, seed)
            .into_iter()
            .map(u16::to_le_bytes)
            .collect()
    });
    Ok(PyBytes::new(py, bytes.as_flattened()))
}

fn checked_items(what: &str, count: u64) -> Result<u64, NativeError> {
    if count > MAX_ITEMS {
        return Err(NativeError::Config(format!(
            "{what}: {count} items; at most {MAX_ITEMS} (2**28)"
        )));
    }
    Ok(count)
}

/// A uniformly random permutation of `range(count)` drawn from `seed`, as `count`
/// little-endian i64 (an `array("q")`'s bytes).
#[pyfunction]
pub fn permutation(py: Python<'_>, count: u64, seed: u64) -> BindingResult<Bound<'_, PyBytes>> {
    let count = checked_items("permutation", count)?;
    let bytes: Vec<[u8; 8]> = crate::exiting::without_gil(py, || {
        permute(count, seed)
            .into_iter()
            .map(u64::to_le_bytes)
            .collect()
    });
    Ok(PyBytes::new(py, bytes.as_flattened()))
}

/// `count` floats in [0, 1) drawn from `seed`.
#[pyfunction]
pub fn unit_draws(count: u64, seed: u64) -> BindingResult<Vec<f64>> {
    let count = checked_items("unit_draws", count)?;
    Ok(unit_floats(count as usize, seed))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(interleave, m)?)?;
    m.add_function(wrap_pyfunction!(spread, m)?)?;
    m.add_function(wrap_pyfunction!(permutation, m)?)?;
    m.add_function(wrap_pyfunction!(unit_draws, m)?)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_counts_are_refused() {
        assert!(checked_counts("interleave", &[1, -1]).is_err());
        assert!(checked_counts("interleave", &vec![0; MAX_LABELS + 1]).is_err());
        assert!(checked_counts("interleave", &vec![0; MAX_LABELS]).is_ok());
        assert!(checked_counts("interleave", &[1 << 27, 1 << 27]).is_ok());
        assert!(checked_counts("interleave", &[1 << 27, 1 << 27, 1]).is_err());
        assert!(checked_counts("interleave", &[i64::MAX, i64::MAX]).is_err());
    }
}
