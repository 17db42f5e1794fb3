//! `ParquetBatchReader` (`NativeStorage.open_parquet`): a Parquet shard read in place by the
//! core's arrow-rs reader, one batch per call with the GIL released; Python receives each
//! through the Arrow PyCapsule interface without a copy ([`super::arrow_batch`]).

use std::sync::Mutex;

use arrow_array::RecordBatch;
use pyo3::prelude::*;
use syvain_core::codec::parquet_read::ParquetBatches;

use super::arrow_batch::ShardBatch;
use crate::error::BindingResult;
use crate::exiting::without_gil;

/// Iterates the record batches of one read of a Parquet shard (its top-level byte-array
/// columns dictionary-encoded; `plain_schema` gives their expanded types).
///
/// Raises RuntimeError("Unreadable parquet shard {uri}: {reason}") for bytes that are not
/// Parquet or disagree with the declared size, and the store's own errors as they are.
#[pyclass(module = "syvain_training_data._native", frozen)]
pub struct ParquetBatchReader {
    batches: Mutex<ParquetBatches>,
}

impl ParquetBatchReader {
    pub fn new(batches: ParquetBatches) -> Self {
        Self {
            batches: Mutex::new(batches),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ParquetBatches> {
        self.batches.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[pymethods]
impl ParquetBatchReader {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// The next batch (its pages fetched and decoded without the GIL); StopIteration at the
    /// end of the read.
    fn __next__(&self, py: Python<'_>) -> BindingResult<Option<ShardBatch>> {
        let next = without_gil(py, || self.lock().next_batch())?;
        Ok(next.map(ShardBatch::new))
    }

    /// The file's columns with dictionaries expanded, as an empty batch (`pyarrow.schema()` and
    /// `pyarrow.record_batch()` take it through the Arrow PyCapsule interface).
    #[getter]
    fn plain_schema(&self) -> ShardBatch {
        ShardBatch::new(RecordBatch::new_empty(self.lock().plain_schema()))
    }

    /// The rows the file's footer declares.
    #[getter]
    fn rows(&self) -> i64 {
        self.lock().rows()
    }

    /// Whether the file has an offset index for every column chunk (a read of a slice of a
    /// row group then fetches only its pages).
    #[getter]
    fn paged(&self) -> bool {
        self.lock().paged()
    }

    /// (requests, bytes) this read fetched, its footer included.
    #[getter]
    fn fetched(&self) -> (u64, u64) {
        self.lock().fetched()
    }
}
