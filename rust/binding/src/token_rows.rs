//! Token batches written in place for `load_tokens`: rows of one record each (`pack=False`)
//! and each token's position in its document, straight into a batch's tensor (through numpy's
//! buffer), with no Python per token. Cells, not raw pointers: the buffers come from Python
//! and may overlap, and writing through `Cell` stays sound whatever they alias.

use std::cell::Cell;

use pyo3::buffer::{Element, PyBuffer, ReadOnlyCell};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

fn readable<'a, T: Element>(
    py: Python<'a>,
    buffer: &'a PyBuffer<T>,
    what: &str,
) -> PyResult<&'a [ReadOnlyCell<T>]> {
    buffer
        .as_slice(py)
        .ok_or_else(|| PyValueError::new_err(format!("{what} must be a C-contiguous buffer")))
}

fn writable<'a, T: Element>(
    py: Python<'a>,
    buffer: &'a PyBuffer<T>,
    what: &str,
) -> PyResult<&'a [Cell<T>]> {
    buffer.as_mut_slice(py).ok_or_else(|| {
        PyValueError::new_err(format!("{what} must be a writable C-contiguous buffer"))
    })
}

/// A readable element: a cell of a Python buffer, or (in tests) a plain value.
trait Value<T> {
    fn value(&self) -> T;
}

impl<T: Element + Copy> Value<T> for ReadOnlyCell<T> {
    fn value(&self) -> T {
        self.get()
    }
}

impl<T: Copy> Value<T> for T {
    fn value(&self) -> T {
        *self
    }
}

/// The rows of `out` (rows of `seq_len`, one per record): row i holds
/// `values[bounds[i]..bounds[i + 1]]`, then `eos` when given, cut at `seq_len`, then `pad`.
fn fill_rows<T: Copy, V: Value<T>>(
    values: &[V],
    bounds: &[i64],
    out: &[Cell<T>],
    seq_len: usize,
    pad: T,
    eos: Option<T>,
) -> Result<(), String> {
    if seq_len == 0 || !out.len().is_multiple_of(seq_len) {
        return Err(format!(
            "rows of {seq_len} do not tile a buffer of {}",
            out.len()
        ));
    }
    let records = bounds.len().saturating_sub(1);
    if records != out.len() / seq_len {
        return Err(format!(
            "{records} records for {} rows",
            out.len() / seq_len
        ));
    }
    for (record, pair) in bounds.windows(2).enumerate() {
        let (low, high) = (pair[0], pair[1]);
        if low < 0 || high < low || high as u64 > values.len() as u64 {
            return Err(format!(
                "record {record} spans [{low}, {high}) of {} values",
                values.len()
            ));
        }
        let tokens = &values[low as usize..high as usize];
        let row_start = record * seq_len;
        let row = &out[row_start..row_start + seq_len];
        let kept = tokens.len().min(seq_len);
        for (cell, value) in row[..kept].iter().zip(&tokens[..kept]) {
            cell.set(value.value());
        }
        let mut filled = kept;
        if let Some(eos) = eos {
            if filled < seq_len {
                row[filled].set(eos);
                filled += 1;
            }
        }
        for cell in &row[filled..] {
            cell.set(pad);
        }
    }
    Ok(())
}

/// Writes records (`values[bounds[i]..bounds[i + 1]]`) into the rows of `out`, a (records,
/// seq_len) int64 buffer: each record's tokens, then `eos` when given, cut at `seq_len`, then
/// `pad`. ValueError for bounds outside `values` or another number of rows.
#[pyfunction]
#[pyo3(signature = (values, bounds, out, seq_len, pad, eos=None))]
pub fn fill_token_rows(
    py: Python<'_>,
    values: PyBuffer<i64>,
    bounds: Vec<i64>,
    out: PyBuffer<i64>,
    seq_len: usize,
    pad: i64,
    eos: Option<i64>,
) -> PyResult<()> {
    let source = readable(py, &values, "values")?;
    let target = writable(py, &out, "out")?;
    fill_rows(source, &bounds, target, seq_len, pad, eos).map_err(PyValueError::new_err)
}

/// :func:`fill_token_rows` for a loss mask (uint8 buffers of 0/1, a bool tensor's bytes):
/// padding is 0 and, with `eos`, the eos after each record is 1.
#[pyfunction]
pub fn fill_mask_rows(
    py: Python<'_>,
    mask: PyBuffer<u8>,
    bounds: Vec<i64>,
    out: PyBuffer<u8>,
    seq_len: usize,
    eos: bool,
) -> PyResult<()> {
    let source = readable(py, &mask, "mask")?;
    let target = writable(py, &out, "out")?;
    let eos = eos.then_some(1);
    fill_rows(source, &bounds, target, seq_len, 0, eos).map_err(PyValueError::new_err)
}

/// Segment i of `out` (from `starts[i]` to the next start, or the end) counts up from
/// `firsts[i]`.
fn fill_segments(out: &[Cell<i64>], starts: &[i64], firsts: &[i64]) -> Result<(), String> {
    if starts.len() != firsts.len() || starts.first().is_some_and(|&s| s != 0) {
        return Err("segments need one first position each and must start at 0".into());
    }
    for (k, (&start, &first)) in starts.iter().zip(firsts).enumerate() {
        let stop = starts.get(k + 1).copied().unwrap_or(out.len() as i64);
        if start < 0 || stop < start || stop as u64 > out.len() as u64 {
            return Err(format!(
                "segment {k} spans [{start}, {stop}) of {}",
                out.len()
            ));
        }
        if first < 0 || first.checked_add(stop - start).is_none() {
            return Err(format!("segment {k} counts from {first}"));
        }
        for (cell, position) in out[start as usize..stop as usize].iter().zip(first..) {
            cell.set(position);
        }
    }
    Ok(())
}

/// Fills `out` (int64) with positions: from `starts[i]` (ascending, the first 0) to the next
/// start, `firsts[i]`, `firsts[i] + 1`, ... ValueError for segments outside `out`.
#[pyfunction]
pub fn fill_positions(
    py: Python<'_>,
    out: PyBuffer<i64>,
    starts: Vec<i64>,
    firsts: Vec<i64>,
) -> PyResult<()> {
    let target = writable(py, &out, "out")?;
    fill_segments(target, &starts, &firsts).map_err(PyValueError::new_err)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(fill_token_rows, m)?)?;
    m.add_function(wrap_pyfunction!(fill_mask_rows, m)?)?;
    m.add_function(wrap_pyfunction!(fill_positions, m)?)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(values: &[i64], bounds: &[i64], seq_len: usize, eos: Option<i64>) -> Vec<i64> {
        let out: Vec<Cell<i64>> = (0..(bounds.len() - 1) * seq_len)
            .map(|_| Cell::new(9))
            .collect();
        fill_rows(values, bounds, &out, seq_len, -1, eos).unwrap();
        out.iter().map(Cell::get).collect()
    }

    #[test]
    fn rows_are_padded_truncated_and_end_with_eos_when_it_fits() {
        let values = [1, 2, 3, 4, 5, 6];
        assert_eq!(
            rows(&values, &[0, 2, 2, 6], 3, None),
            [1, 2, -1, -1, -1, -1, 3, 4, 5]
        );
        assert_eq!(
            rows(&values, &[0, 2, 2, 6], 3, Some(0)),
            [1, 2, 0, 0, -1, -1, 3, 4, 5]
        );
    }

    #[test]
    fn bad_bounds_and_rows_are_errors_not_panics() {
        let source = [1i64, 2, 3];
        let out: Vec<Cell<i64>> = (0..4).map(|_| Cell::new(0)).collect();
        assert!(fill_rows(&source, &[0, 1, 4], &out, 2, 0, None).is_err());
        assert!(fill_rows(&source, &[0, 2, 1], &out, 2, 0, None).is_err());
        assert!(fill_rows(&source, &[-1, 1, 2], &out, 2, 0, None).is_err());
        assert!(fill_rows(&source, &[0, 1, 2, 3], &out, 2, 0, None).is_err());
        assert!(fill_rows(&source, &[0, 1], &out, 2, 0, None).is_err());
        assert!(fill_rows(&source, &[0, 1], &out, 3, 0, None).is_err());
        assert!(fill_rows(&source, &[0, 1], &out, 0, 0, None).is_err());
        fill_rows(&source, &[0, 1, 3], &out, 2, 0, None).unwrap();
    }

    #[test]
    fn positions_count_up_per_segment() {
        let out: Vec<Cell<i64>> = (0..7).map(|_| Cell::new(0)).collect();
        fill_segments(&out, &[0, 3, 5], &[4, 0, 0]).unwrap();
        assert_eq!(
            out.iter().map(Cell::get).collect::<Vec<_>>(),
            [4, 5, 6, 0, 1, 0, 1]
        );
        assert!(fill_segments(&out, &[1], &[0]).is_err());
        assert!(fill_segments(&out, &[0, 9], &[0, 0]).is_err());
        assert!(fill_segments(&out, &[0, 3, 2], &[0, 0, 0]).is_err());
        assert!(fill_segments(&out, &[0], &[i64::MAX]).is_err());
        assert!(fill_segments(&out, &[0], &[]).is_err());
    }
}
