//! `GzipAccessPoints`: the access points of a jsonl.gz shard, built from its bytes fed in
//! chunks (the saver's spool, `syvain-data index`), and the `entry` argument a range read of an
//! indexed jsonl.gz shard passes to `open_shard`.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use syvain_core::codec::gzip::GzipEntry;
use syvain_core::codec::gzip_points::{AccessPoints, BlockEntry, WINDOW_BYTES};
use syvain_core::codec::{DecodeFailure, ShardFormat};

use crate::error::BindingResult;

/// One block's entry as Python sees it: (start_bit, member_start, skip, first_record,
/// first_line, end_byte, window).
type EntryTuple<'py> = (u64, bool, u64, u64, u64, u64, Bound<'py, PyBytes>);

/// Builds the access points of a jsonl.gz shard: every `step` records of each block of
/// `block` records.
#[pyclass(module = "syvain_training_data._native")]
pub struct GzipAccessPoints {
    uri: String,
    points: AccessPoints,
}

#[pymethods]
impl GzipAccessPoints {
    #[new]
    fn new(uri: String, block: u64, step: u64) -> PyResult<Self> {
        if step == 0 || step > block {
            return Err(PyValueError::new_err(
                "step must be at least 1 record and at most block",
            ));
        }
        let points = AccessPoints::new(block, step).map_err(PyValueError::new_err)?;
        Ok(Self { uri, points })
    }

    /// Takes the next bytes of the shard (without the GIL); ShardDataError naming the shard
    /// when they are not a valid jsonl.gz stream.
    fn feed(&mut self, py: Python<'_>, chunk: &[u8]) -> BindingResult<()> {
        let points = &mut self.points;
        let fed = crate::exiting::without_gil(py, || points.feed(chunk));
        fed.map_err(|failure| self.error(failure))
    }

    /// The end of the shard's bytes: the last entries are complete after it.
    fn finish(&mut self) -> BindingResult<()> {
        let finished = self.points.finish();
        finished.map_err(|failure| self.error(failure))
    }

    /// The entries of the blocks completed so far, in order (each returned once).
    fn take_entries<'py>(&mut self, py: Python<'py>) -> Vec<EntryTuple<'py>> {
        let entries = self.points.take_entries();
        entries
            .into_iter()
            .map(|e: BlockEntry| {
                (
                    e.start_bit,
                    e.member_start,
                    e.skip,
                    e.first_record,
                    e.first_line,
                    e.end_byte,
                    PyBytes::new(py, &e.window),
                )
            })
            .collect()
    }

    /// Records (lines holding a JSON object) counted so far.
    #[getter]
    fn records(&self) -> u64 {
        self.points.records()
    }
}

impl GzipAccessPoints {
    fn error(&self, failure: DecodeFailure) -> crate::error::BindingError {
        failure.into_native(ShardFormat::JsonlGz, &self.uri).into()
    }
}

/// The `entry` argument of a range read: (member_start, unused_bits, window, skip,
/// first_record, first_line), for jsonl.gz only.
pub type EntryArgument = (bool, u8, Vec<u8>, u64, u64, u64);

/// The checked entry of a range read of `format`.
pub fn gzip_entry(
    format: ShardFormat,
    entry: Option<EntryArgument>,
) -> PyResult<Option<GzipEntry>> {
    let Some((member_start, unused_bits, window, skip, first_record, first_line)) = entry else {
        return Ok(None);
    };
    if format != ShardFormat::JsonlGz {
        return Err(PyValueError::new_err("entry is for jsonl.gz shards only"));
    }
    if unused_bits > 7 || window.len() > WINDOW_BYTES {
        return Err(PyValueError::new_err(
            "entry: unused_bits must be in 0..=7 and the window at most 32 KiB",
        ));
    }
    Ok(Some(GzipEntry {
        member_start,
        unused_bits,
        window,
        skip,
        first_record,
        first_line,
    }))
}
