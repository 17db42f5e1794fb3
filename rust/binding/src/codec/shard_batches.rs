//! `ShardBatchReader` (`iter_shard_batches`): the core's decoder thread builds Arrow record
//! batches off the GIL; Python receives them through the Arrow PyCapsule interface without a
//! copy ([`super::arrow_batch`]).

use std::sync::mpsc::Receiver;
use std::sync::Mutex;

use pyo3::prelude::*;
use syvain_core::caller::receive;
use syvain_core::codec::columnar::{
    self, column_selection, count_records, BatchOptions, Message, BATCH_BYTES,
};
use syvain_core::codec::gzip::GzipEntry;
use syvain_core::codec::{shard_error, RecordRange, ShardFormat};
use syvain_core::error::NativeError;
use syvain_core::process_bound::ProcessBound;
use syvain_core::source::ByteSource;

use super::arrow_batch::{IntBuffer, ShardBatch};
use super::invalid_lines::InvalidLines;
use super::memory_source;
use crate::caller::PythonCaller;
use crate::error::BindingResult;

/// Iterates the record batches of one msgpack.zstf or jsonl.gz shard.
///
/// Raises RuntimeError("Unreadable {format} shard {uri}: {reason}") for bad bytes, a value the
/// columns cannot hold, or a record count that disagrees with the manifest, and the source's
/// own errors as they are.
#[pyclass(module = "syvain_training_data._native")]
pub struct ShardBatchReader {
    format: ShardFormat,
    uri: String,
    /// Behind a mutex only because a pyclass must be `Sync`; bound to this process, so a
    /// forked child never touches the parent's decoder channel.
    receiver: Option<ProcessBound<Mutex<Receiver<Message>>>>,
    invalid_lines: InvalidLines,
}

impl ShardBatchReader {
    /// Starts building the batches of the records `range` of `source` on its own thread.
    pub fn open(
        format: ShardFormat,
        uri: String,
        source: Box<dyn ByteSource>,
        size_bytes: u64,
        range: RecordRange,
        options: BatchOptions,
        entry: Option<GzipEntry>,
    ) -> Result<Self, NativeError> {
        let receiver = columnar::spawn_at(format, &uri, source, size_bytes, range, options, entry)?;
        Ok(Self {
            format,
            uri,
            receiver: Some(ProcessBound::new(Mutex::new(receiver))),
            invalid_lines: InvalidLines::default(),
        })
    }

    /// Waits for the decoder thread without the GIL, checking for Ctrl-C in between.
    fn receive(&mut self, py: Python<'_>) -> BindingResult<Option<Message>> {
        let Some(receiver) = &mut self.receiver else {
            return Ok(None);
        };
        let receiver = &*receiver.in_this_process("shard batch reader")?;
        match receive(&PythonCaller(py), receiver)? {
            Some(message) => Ok(Some(message)),
            None => Err(self.error("decoder thread stopped unexpectedly").into()),
        }
    }

    fn error(&self, reason: impl Into<String>) -> NativeError {
        shard_error(self.format, &self.uri, reason)
    }
}

#[pymethods]
impl ShardBatchReader {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// The next batch; StopIteration once the shard is done and its count checked.
    fn __next__(&mut self, py: Python<'_>) -> BindingResult<Option<ShardBatch>> {
        loop {
            match self.receive(py)? {
                Some(Message::Batch(batch, invalid)) => {
                    self.invalid_lines.log(py, &self.uri, &invalid)?;
                    if let Some(batch) = batch {
                        return Ok(Some(ShardBatch::new(batch)));
                    }
                }
                Some(Message::Failed(failure)) => {
                    self.receiver = None;
                    return Err(failure.into_native(self.format, &self.uri).into());
                }
                Some(Message::End) | None => {
                    self.receiver = None;
                    return Ok(None);
                }
            }
        }
    }

    #[getter]
    fn uri(&self) -> &str {
        &self.uri
    }

    #[getter]
    fn data_format(&self) -> &'static str {
        self.format.name()
    }
}

/// Builds the batches of shard bytes held in memory (tests, benchmarks), as
/// `NativeStorage.open_shard_batches` builds those of a stored shard; `chunk_size` splits
/// `data` into chunks of that many bytes, as a network stream would.
#[pyfunction]
#[pyo3(signature = (data_format, uri, data, declared_records, chunk_size = None, *, start = 0, stop = None, columns = None, batch_size = 8192))]
#[allow(clippy::too_many_arguments)]
pub fn shard_batches_from_bytes(
    data_format: &str,
    uri: String,
    data: &[u8],
    declared_records: u64,
    chunk_size: Option<usize>,
    start: i64,
    stop: Option<i64>,
    columns: Option<Vec<String>>,
    batch_size: usize,
) -> BindingResult<ShardBatchReader> {
    let format = ShardFormat::of_shard(&uri, data_format)?;
    let range = RecordRange::new(declared_records, start, stop)?;
    let options = BatchOptions {
        columns: column_selection(columns)?,
        batch_rows: batch_size,
    };
    let source = memory_source(data, chunk_size);
    let size = data.len() as u64;
    Ok(ShardBatchReader::open(
        format, uri, source, size, range, options, None,
    )?)
}

/// Benchmark floor only (not public API): decompresses and parses every record of shard
/// bytes held in memory, building nothing, and returns how many records it found.
#[pyfunction]
#[pyo3(name = "_decode_only")]
pub fn decode_only(py: Python<'_>, data_format: &str, data: &[u8]) -> BindingResult<u64> {
    let format = ShardFormat::parse(data_format)?;
    Ok(crate::exiting::without_gil(py, || {
        count_records(format, data)
    })?)
}

/// Registers the columnar classes on the extension module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<ShardBatchReader>()?;
    m.add_class::<ShardBatch>()?;
    m.add_class::<IntBuffer>()?;
    m.add("BATCH_BYTES", BATCH_BYTES)?;
    m.add_function(wrap_pyfunction!(shard_batches_from_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(decode_only, m)?)?;
    Ok(())
}
