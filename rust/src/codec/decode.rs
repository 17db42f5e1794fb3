//! `ShardReader`: a decoder thread frames, decompresses and checks bytes without the GIL while
//! the Python side builds records in batches, so a second core works while Python runs.

use std::collections::VecDeque;
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender};
use std::sync::Mutex;

use bytes::Bytes;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyList;

use super::key_cache::KeyCache;
use super::lines::{JsonlLines, LineBatch};
use super::py_build::{JsonLine, MAX_JSON_DEPTH};
use super::zstf::ZstfFrames;
use super::{count_mismatch, found_more, py_build, shard_error, Failure, RecordRange, ShardFormat};
use crate::error::{NativeError, NativeResult};
use crate::runtime::SIGNAL_POLL;
use crate::source::{ByteSource, MemorySource};

/// Batches in flight between the decoder thread and Python: enough to overlap, little memory.
const CHANNEL_BATCHES: usize = 2;
/// A payload batch is handed on at this many records or bytes, whichever comes first.
const BATCH_RECORDS: usize = 512;
const BATCH_BYTES: usize = 4 << 20;
/// The first batch of a shard holds one record and each next one four times as many, up to
/// BATCH_RECORDS: the first record reaches the caller as soon as it is decoded (an open costs
/// one record, not 512), while the steady state keeps its large batches.
const FIRST_BATCH_RECORDS: usize = 1;
const BATCH_GROWTH: usize = 4;
/// One call hands back records of about this many encoded bytes at most (always at least one
/// record): the objects of a call then stay in the CPU caches and in the interpreter's recycled
/// memory pools until the caller drops them, where a call of thousands of large records would
/// make the allocator map fresh memory for every call.
/// (Measured on 1.4 KB records: 64 KiB calls build them 1.4 times as fast as 1024-record calls.)
const CALL_BYTES: usize = 64 << 10;
const LOGGER: &str = "syvain_training_data";

/// Validated payloads back to back in `data`, payload `i` ending at `ends[i]`; `next` is the
/// first not yet built.
struct Payloads {
    data: Vec<u8>,
    ends: Vec<usize>,
    next: usize,
}

impl Payloads {
    /// An empty batch with room for `bytes` (the size of the previous one, so a steady stream
    /// of batches does not regrow each buffer from nothing).
    fn with_capacity(bytes: usize) -> Self {
        Self {
            data: Vec::with_capacity(bytes),
            ends: Vec::with_capacity(BATCH_RECORDS),
            next: 0,
        }
    }

    fn take_next(&mut self) -> Option<&[u8]> {
        let end = *self.ends.get(self.next)?;
        let start = match self.next {
            0 => 0,
            n => self.ends[n - 1],
        };
        self.next += 1;
        self.data.get(start..end)
    }
}

enum Batch {
    Payloads(Payloads),
    Lines(LineBatch, usize),
}

enum Message {
    Batch(Batch),
    End,
    Failed(Failure),
}

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
    /// Behind a mutex only because a pyclass must be `Sync`; `&mut self` already excludes
    /// other users.
    receiver: Option<Mutex<Receiver<Message>>>,
    current: Option<Batch>,
    /// Records built by `__next__` ahead of the caller.
    ready: VecDeque<PyObject>,
    state: State,
    keys: KeyCache,
    logger: Option<PyObject>,
    /// Encoded bytes of the records built by the current `fill`.
    call_bytes: usize,
}

impl ShardReader {
    /// Starts decoding the records `range` of `source` (an object of `size_bytes` bytes) as
    /// `format` ("msgpack.zstf" or "jsonl.gz") on its own thread.
    ///
    /// Errors: an unknown format (ValueError), or a thread that cannot be started.
    pub fn open(
        format: &str,
        uri: String,
        source: Box<dyn ByteSource>,
        size_bytes: u64,
        range: RecordRange,
    ) -> NativeResult<ShardReader> {
        let format = ShardFormat::parse(format)?;
        let (sender, receiver) = sync_channel(CHANNEL_BATCHES);
        std::thread::Builder::new()
            .name("syvain-shard-decoder".into())
            .spawn(move || produce(format, source, size_bytes, range, sender))
            .map_err(|e| shard_error(format, &uri, format!("cannot start decoder thread: {e}")))?;
        Ok(ShardReader {
            format,
            uri,
            range,
            yielded: 0,
            receiver: Some(Mutex::new(receiver)),
            current: None,
            ready: VecDeque::new(),
            state: State::Open,
            keys: KeyCache::default(),
            logger: None,
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
                    let immediate = matches!(err, NativeError::Python(_));
                    let err = PyErr::from(err);
                    self.receiver = None;
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
    fn step(&mut self, py: Python<'_>) -> NativeResult<Option<PyObject>> {
        let Some(mut batch) = self.current.take() else {
            match self.receive(py)? {
                Message::Batch(batch) => self.current = Some(batch),
                Message::End => {
                    // A partial range was counted by the decoder core, skipped records too.
                    if self.range.is_full() && self.yielded != self.range.declared {
                        let declared = self.range.declared;
                        return Err(self.error(count_mismatch(declared, self.yielded)));
                    }
                    self.receiver = None;
                    self.state = State::Finished;
                }
                Message::Failed(failure) => return Err(failure.into_native(self.format, &self.uri)),
            }
            return Ok(None);
        };
        let record = self.take_record(py, &mut batch);
        if !batch_done(&batch) {
            self.current = Some(batch);
        }
        let Some(record) = record? else {
            return Ok(None);
        };
        if self.yielded == self.range.records() {
            return Err(self.error(found_more(self.range.declared)));
        }
        self.yielded += 1;
        Ok(Some(record.unbind()))
    }

    /// Builds the batch's next record; `None` for a skipped line or an exhausted batch.
    fn take_record<'py>(
        &mut self,
        py: Python<'py>,
        batch: &mut Batch,
    ) -> NativeResult<Option<Bound<'py, PyAny>>> {
        match batch {
            Batch::Payloads(payloads) => {
                let Some(payload) = payloads.take_next() else {
                    return Ok(None);
                };
                self.call_bytes += payload.len();
                match py_build::msgpack_record(py, payload, &mut self.keys) {
                    Ok(record) => Ok(Some(record)),
                    Err(Ok(reason)) => Err(self.error(reason)),
                    Err(Err(py_err)) => Err(NativeError::Python(py_err)),
                }
            }
            Batch::Lines(lines, next) => {
                let Some(line) = lines.lines.get(*next) else {
                    return Ok(None);
                };
                *next += 1;
                let text = lines.line(line);
                self.call_bytes += text.len();
                match py_build::json_record(py, text).map_err(NativeError::Python)? {
                    JsonLine::Record(record) => Ok(Some(record.into_any())),
                    JsonLine::Invalid => {
                        self.log_invalid_line(py, line.number)?;
                        Ok(None)
                    }
                    JsonLine::TooDeep => Err(self.error(format!(
                        "line {} nested deeper than {MAX_JSON_DEPTH} levels",
                        line.number
                    ))),
                }
            }
        }
    }

    /// Waits for the decoder thread without the GIL, checking for Ctrl-C in between.
    fn receive(&mut self, py: Python<'_>) -> NativeResult<Message> {
        loop {
            let Some(receiver) = &self.receiver else {
                return Err(self.error("decoder thread stopped unexpectedly"));
            };
            let got = py.allow_threads(|| {
                let receiver = receiver
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner());
                receiver.recv_timeout(SIGNAL_POLL)
            });
            match got {
                Ok(message) => return Ok(message),
                Err(RecvTimeoutError::Timeout) => py.check_signals()?,
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(self.error("decoder thread stopped unexpectedly"))
                }
            }
        }
    }

    fn log_invalid_line(&mut self, py: Python<'_>, number: u64) -> PyResult<()> {
        let logger = match &self.logger {
            Some(logger) => logger.bind(py).clone(),
            None => {
                let logger = py.import("logging")?.call_method1("getLogger", (LOGGER,))?;
                self.logger = Some(logger.clone().unbind());
                logger
            }
        };
        logger.call_method1(
            "error",
            ("Skipping invalid JSON record in %s:%d", &self.uri, number),
        )?;
        Ok(())
    }

    fn error(&self, reason: impl Into<String>) -> NativeError {
        shard_error(self.format, &self.uri, reason)
    }
}

fn batch_done(batch: &Batch) -> bool {
    match batch {
        Batch::Payloads(payloads) => payloads.next >= payloads.ends.len(),
        Batch::Lines(lines, next) => *next >= lines.lines.len(),
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
pub fn shard_reader_from_bytes(
    data_format: &str,
    uri: String,
    data: &[u8],
    declared_records: u64,
    chunk_size: Option<usize>,
    start: i64,
    stop: Option<i64>,
) -> PyResult<ShardReader> {
    let range = RecordRange::new(declared_records, start, stop)?;
    let chunk = chunk_size.unwrap_or(data.len()).max(1);
    let chunks: Vec<Bytes> = data.chunks(chunk).map(Bytes::copy_from_slice).collect();
    let source = MemorySource::new(chunks);
    Ok(ShardReader::open(
        data_format,
        uri,
        Box::new(source),
        data.len() as u64,
        range,
    )?)
}

/// The decoder thread: runs the format's pure-Rust core until the end, an error, or until the
/// reader is dropped (a failed send).
fn produce(
    format: ShardFormat,
    source: Box<dyn ByteSource>,
    size_bytes: u64,
    range: RecordRange,
    sender: SyncSender<Message>,
) {
    let run = std::panic::AssertUnwindSafe(|| match format {
        ShardFormat::MsgpackZstf => {
            let frames = ZstfFrames::with_range(source, range).with_object_size(size_bytes);
            produce_payloads(frames, &sender)
        }
        ShardFormat::JsonlGz => produce_lines(JsonlLines::new(source).with_range(range), &sender),
    });
    // A bug must surface as an error on this shard, never as a hang or an abort.
    if std::panic::catch_unwind(run).is_err() {
        let failure = Failure::shard("internal decoder error");
        let _ = sender.send(Message::Failed(failure));
    }
}

fn produce_payloads(mut frames: ZstfFrames, sender: &SyncSender<Message>) {
    let mut batch = Payloads::with_capacity(0);
    let mut batch_records = FIRST_BATCH_RECORDS;
    let last = loop {
        match frames.append_payload(&mut batch.data) {
            Ok(true) => {
                batch.ends.push(batch.data.len());
                if batch.ends.len() >= batch_records || batch.data.len() >= BATCH_BYTES {
                    batch_records = (batch_records * BATCH_GROWTH).min(BATCH_RECORDS);
                    let room = batch.data.len().min(BATCH_BYTES);
                    let full = std::mem::replace(&mut batch, Payloads::with_capacity(room));
                    if sender.send(Message::Batch(Batch::Payloads(full))).is_err() {
                        return;
                    }
                }
            }
            Ok(false) => break Message::End,
            // The records validated before the bad one still reach the caller.
            Err(failure) => break Message::Failed(failure),
        }
    };
    if !batch.ends.is_empty() && sender.send(Message::Batch(Batch::Payloads(batch))).is_err() {
        return;
    }
    let _ = sender.send(last);
}

fn produce_lines(mut lines: JsonlLines, sender: &SyncSender<Message>) {
    loop {
        let message = match lines.next_batch() {
            Ok(Some(batch)) => Message::Batch(Batch::Lines(batch, 0)),
            Ok(None) => Message::End,
            Err(failure) => Message::Failed(failure),
        };
        let last = !matches!(message, Message::Batch(_));
        if sender.send(message).is_err() || last {
            return;
        }
    }
}
