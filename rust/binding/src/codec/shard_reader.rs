//! `ShardReader`: the core's decoder thread frames, decompresses and checks bytes without the
//! GIL while this side builds records in batches, so a second core works while Python runs.

use std::collections::VecDeque;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyList;
use syvain_core::codec::decoder::{Batch, Decoder, Message, BATCH_RECORDS};
use syvain_core::codec::gzip::GzipEntry;
use syvain_core::codec::{
    count_mismatch, found_more, shard_error, RecordRange, ShardFormat, MAX_JSON_DEPTH,
};
use syvain_core::error::NativeError;
use syvain_core::process_bound::ProcessBound;
use syvain_core::source::ByteSource;

use super::invalid_lines::InvalidLines;
use super::key_cache::KeyCache;
use super::memory_source;
use super::py_build::{self, JsonLine};
use crate::caller::PythonCaller;
use crate::error::{BindingError, BindingResult};

/// One call hands back records of about this many encoded bytes at most (always at least one
/// record): the objects of a call then stay in the CPU caches and in the interpreter's recycled
/// memory pools until the caller drops them, where a call of thousands of large records would
/// make the allocator map fresh memory for every call.
/// (Measured on 1.4 KB records: 64 KiB calls build them 1.4 times as fast as 1024-record calls.)
const CALL_BYTES: usize = 64 << 10;

enum State {
    Open,
    Finished,
    Failed(PyErr),
}

/// Iterates the records of one msgpack.zstf or jsonl.gz shard as dicts.
///
/// Raises RuntimeError("Unreadable {format} shard {uri}: {reason}") for bad bytes or a record
/// count that disagrees with the manifest, and the source's own errors as they are.
#[pyclass(module = "syvain_training_data._native")]
pub struct ShardReader {
    format: ShardFormat,
    uri: String,
    range: RecordRange,
    yielded: u64,
    /// Bound to this process: a forked child never touches the parent's decoder.
    decoder: Option<ProcessBound<Decoder>>,
    current: Option<Batch>,
    /// Records built by `__next__` ahead of the caller.
    ready: VecDeque<PyObject>,
    state: State,
    keys: KeyCache,
    invalid_lines: InvalidLines,
    /// Encoded bytes of the records built by the current `fill`.
    call_bytes: usize,
}

impl ShardReader {
    /// Starts decoding the records `range` of `source` (an object of `size_bytes` bytes) as
    /// `format` on the core's decoder thread (a local shard's first record is decoded in this
    /// call, without the GIL).
    ///
    /// Errors: a thread that cannot be started.
    pub fn open(
        py: Python<'_>,
        format: ShardFormat,
        uri: String,
        source: Box<dyn ByteSource>,
        size_bytes: u64,
        range: RecordRange,
        entry: Option<GzipEntry>,
    ) -> Result<ShardReader, NativeError> {
        // Without the GIL: a local shard's first record is decoded right here.
        let decoder = crate::exiting::without_gil(py, || {
            Decoder::start_at(format, &uri, source, size_bytes, range, entry.as_ref())
        })?;
        Ok(ShardReader {
            format,
            uri,
            range,
            yielded: 0,
            decoder: Some(ProcessBound::new(decoder)),
            current: None,
            ready: VecDeque::new(),
            state: State::Open,
            keys: KeyCache::default(),
            invalid_lines: InvalidLines::default(),
            call_bytes: 0,
        })
    }

    /// Appends up to `max` records to `out`. A failure after some records is kept and raised
    /// by the next call, so the records before a bad byte still reach the caller.
    fn fill(&mut self, py: Python<'_>, max: usize, out: &mut Vec<PyObject>) -> PyResult<()> {
        self.call_bytes = 0;
        while out.len() < max && (out.is_empty() || self.call_bytes < CALL_BYTES) {
            if let Some(record) = self.ready.pop_front() {
                out.push(record);
                continue;
            }
            match &self.state {
                State::Finished => return Ok(()),
                State::Failed(err) if out.is_empty() => return Err(err.clone_ref(py)),
                State::Failed(_) => return Ok(()),
                State::Open => {}
            }
            // One decoder batch (<= BATCH_BYTES of payload) per call bounds the memory a call
            // holds: 1024 records of 4 MiB would otherwise become one 4 GiB list.
            if self.current.is_none() && !out.is_empty() {
                return Ok(());
            }
            match self.step(py) {
                Ok(Some(record)) => out.push(record),
                Ok(None) => {}
                Err(err) => {
                    // Ctrl-C (or another Python error) is raised now, not after the batch.
                    let immediate = matches!(err, BindingError::Python(_));
                    let err = PyErr::from(err);
                    self.decoder = None;
                    self.current = None;
                    self.state = State::Failed(err.clone_ref(py));
                    if immediate {
                        return Err(err);
                    }
                }
            }
        }
        Ok(())
    }

    /// One record from the current batch, or moves to the next message.
    fn step(&mut self, py: Python<'_>) -> BindingResult<Option<PyObject>> {
        let Some(mut batch) = self.current.take() else {
            match self.receive(py)? {
                Message::Batch(batch) => self.current = Some(batch),
                Message::End => {
                    // A partial range was counted by the decoder core, skipped records too.
                    if self.range.is_full() && self.yielded != self.range.declared {
                        let declared = self.range.declared;
                        return Err(self.error(count_mismatch(declared, self.yielded)).into());
                    }
                    self.decoder = None;
                    self.state = State::Finished;
                }
                Message::Failed(failure) => {
                    return Err(failure.into_native(self.format, &self.uri).into())
                }
            }
            return Ok(None);
        };
        let record = self.take_record(py, &mut batch);
        if !batch.is_done() {
            self.current = Some(batch);
        }
        let Some(record) = record? else {
            return Ok(None);
        };
        if self.yielded == self.range.records() {
            return Err(self.error(found_more(self.range.declared)).into());
        }
        self.yielded += 1;
        Ok(Some(record.unbind()))
    }

    /// Builds the batch's next record; `None` for a skipped line or an exhausted batch.
    fn take_record<'py>(
        &mut self,
        py: Python<'py>,
        batch: &mut Batch,
    ) -> BindingResult<Option<Bound<'py, PyAny>>> {
        match batch {
            Batch::Payloads(payloads) => {
                let Some(payload) = payloads.take_next() else {
                    return Ok(None);
                };
                self.call_bytes += payload.len();
                match py_build::msgpack_record(py, payload, &mut self.keys) {
                    Ok(record) => Ok(Some(record)),
                    Err(Ok(reason)) => Err(self.error(reason).into()),
                    Err(Err(py_err)) => Err(py_err.into()),
                }
            }
            Batch::Lines(lines, next) => {
                let Some(line) = lines.lines.get(*next) else {
                    return Ok(None);
                };
                *next += 1;
                let text = lines.line(line);
                self.call_bytes += text.len();
                match py_build::json_record(py, text)? {
                    JsonLine::Record(record) => Ok(Some(record.into_any())),
                    JsonLine::Invalid => {
                        self.invalid_lines.log(py, &self.uri, &[line.number])?;
                        Ok(None)
                    }
                    JsonLine::TooDeep => Err(self
                        .error(format!(
                            "line {} nested deeper than {MAX_JSON_DEPTH} levels",
                            line.number
                        ))
                        .into()),
                }
            }
        }
    }

    /// Waits for the decoder without the GIL, checking for Ctrl-C in between.
    fn receive(&mut self, py: Python<'_>) -> BindingResult<Message> {
        let stopped = || "decoder thread stopped unexpectedly";
        let Some(decoder) = self.decoder.as_mut() else {
            return Err(self.error(stopped()).into());
        };
        let decoder = decoder.in_this_process("shard reader")?;
        match decoder.next(&PythonCaller(py))? {
            Some(message) => Ok(message),
            None => Err(self.error(stopped()).into()),
        }
    }

    fn error(&self, reason: impl Into<String>) -> NativeError {
        shard_error(self.format, &self.uri, reason)
    }
}

#[pymethods]
impl ShardReader {
    /// Up to `max_records` records, fewer once about 64 KiB of encoded records are built (at
    /// least one); an empty list once the shard is done and its count checked.
    #[pyo3(signature = (max_records = 1024))]
    fn next_batch<'py>(
        &mut self,
        py: Python<'py>,
        max_records: usize,
    ) -> PyResult<Bound<'py, PyList>> {
        if max_records == 0 {
            return Err(PyValueError::new_err("max_records must be positive"));
        }
        let mut out = Vec::with_capacity(max_records.min(1024));
        self.fill(py, max_records, &mut out)?;
        PyList::new(py, out)
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&mut self, py: Python<'_>) -> PyResult<Option<PyObject>> {
        if self.ready.is_empty() {
            let mut out = Vec::new();
            self.fill(py, BATCH_RECORDS, &mut out)?;
            self.ready.extend(out);
        }
        Ok(self.ready.pop_front())
    }

    /// Records handed out so far (including those buffered for `__next__`).
    #[getter]
    fn records_yielded(&self) -> u64 {
        self.yielded - self.ready.len() as u64
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

/// Decodes shard bytes held in memory (tests, benchmarks, small local shards): the records
/// `[start, stop)` (`stop` defaults to `declared_records`), as `NativeStorage.open_shard` reads.
///
/// `chunk_size` splits `data` into chunks of that many bytes, as a network stream would.
#[pyfunction]
#[pyo3(signature = (data_format, uri, data, declared_records, chunk_size = None, *, start = 0, stop = None))]
#[allow(clippy::too_many_arguments)]
pub fn shard_reader_from_bytes(
    py: Python<'_>,
    data_format: &str,
    uri: String,
    data: &[u8],
    declared_records: u64,
    chunk_size: Option<usize>,
    start: i64,
    stop: Option<i64>,
) -> BindingResult<ShardReader> {
    let range = RecordRange::new(declared_records, start, stop)?;
    let source = memory_source(data, chunk_size);
    let format = ShardFormat::parse(data_format)?;
    let size = data.len() as u64;
    Ok(ShardReader::open(
        py, format, uri, source, size, range, None,
    )?)
}
