//! Columnar batches (`iter_shard_batches`): a decoder thread frames, decompresses, checks and
//! builds Arrow record batches off the GIL; Python receives them through the Arrow PyCapsule
//! interface without a copy.

mod batch;
mod builder;
mod records;

use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender};
use std::sync::Mutex;

use arrow_array::RecordBatch;
use bytes::Bytes;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

pub use batch::{IntBuffer, ShardBatch};
pub use records::{is_json_record, JsonRow, RecordBuilder};

use super::lines::JsonlLines;
use super::py_build::MAX_JSON_DEPTH;
use super::zstf::ZstfFrames;
use super::{count_mismatch, found_more, shard_error, Failure, RecordRange, ShardFormat};
use crate::error::{NativeError, NativeResult};
use crate::runtime::SIGNAL_POLL;
use crate::source::{ByteSource, MemorySource};

/// A batch is cut at its row count or once its values take about this much memory, so a
/// stream holds a few batches of this size at most (built, in flight, held by the caller).
pub const BATCH_BYTES: usize = 16 << 20;
/// Built batches waiting for the caller.
const CHANNEL_BATCHES: usize = 1;
/// The builder recurses once per nesting level (at most 1000): room for that, with margin.
const DECODER_STACK: usize = 16 << 20;
const LOGGER: &str = "syvain_training_data";

enum Message {
    /// A batch (none when only skipped lines are left), and the numbers of the invalid jsonl
    /// lines skipped while building it.
    Batch(Option<RecordBatch>, Vec<u64>),
    End,
    Failed(Failure),
}

/// What a batch stream builds: the columns kept and the batch size.
#[derive(Clone, Debug)]
pub struct BatchOptions {
    pub columns: Option<Vec<String>>,
    pub batch_rows: usize,
}

/// Iterates the record batches of one msgpack.zstf or jsonl.gz shard.
///
/// Raises RuntimeError("Unreadable {format} shard {uri}: {reason}") for bad bytes, a value the
/// columns cannot hold, or a record count that disagrees with the manifest, and the source's
/// own errors as they are.
#[pyclass(module = "syvain_training_data._native")]
pub struct ShardBatchReader {
    format: ShardFormat,
    uri: String,
    /// Behind a mutex only because a pyclass must be `Sync`.
    receiver: Option<Mutex<Receiver<Message>>>,
    logger: Option<PyObject>,
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
    ) -> NativeResult<Self> {
        if options.batch_rows == 0 {
            return Err(NativeError::Config("batch_size must be positive".into()));
        }
        let (sender, receiver) = sync_channel(CHANNEL_BATCHES);
        std::thread::Builder::new()
            .name("syvain-batch-decoder".into())
            .stack_size(DECODER_STACK)
            .spawn(move || produce(format, source, size_bytes, range, options, sender))
            .map_err(|e| shard_error(format, &uri, format!("cannot start decoder thread: {e}")))?;
        Ok(Self {
            format,
            uri,
            receiver: Some(Mutex::new(receiver)),
            logger: None,
        })
    }

    /// Waits for the decoder thread without the GIL, checking for Ctrl-C in between.
    fn receive(&self, py: Python<'_>) -> PyResult<Option<Message>> {
        let Some(receiver) = &self.receiver else {
            return Ok(None);
        };
        loop {
            let got = py.allow_threads(|| {
                let receiver = receiver
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner());
                receiver.recv_timeout(SIGNAL_POLL)
            });
            match got {
                Ok(message) => return Ok(Some(message)),
                Err(RecvTimeoutError::Timeout) => py.check_signals()?,
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(self.error("decoder thread stopped unexpectedly").into())
                }
            }
        }
    }

    fn log_invalid_lines(&mut self, py: Python<'_>, numbers: &[u64]) -> PyResult<()> {
        if numbers.is_empty() {
            return Ok(());
        }
        let logger = match &self.logger {
            Some(logger) => logger.bind(py).clone(),
            None => {
                let logger = py.import("logging")?.call_method1("getLogger", (LOGGER,))?;
                self.logger = Some(logger.clone().unbind());
                logger
            }
        };
        for number in numbers {
            logger.call_method1(
                "error",
                ("Skipping invalid JSON record in %s:%d", &self.uri, *number),
            )?;
        }
        Ok(())
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
    fn __next__(&mut self, py: Python<'_>) -> PyResult<Option<ShardBatch>> {
        loop {
            match self.receive(py)? {
                Some(Message::Batch(batch, invalid)) => {
                    self.log_invalid_lines(py, &invalid)?;
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

/// The decoder thread: runs the format's pure-Rust core into a [`RecordBuilder`] until the end,
/// an error, or until the reader is dropped (a failed send).
fn produce(
    format: ShardFormat,
    source: Box<dyn ByteSource>,
    size_bytes: u64,
    range: RecordRange,
    options: BatchOptions,
    sender: SyncSender<Message>,
) {
    let run = std::panic::AssertUnwindSafe(|| {
        let mut out = Batches::new(&options, range, &sender);
        let end = match format {
            ShardFormat::MsgpackZstf => {
                let frames = ZstfFrames::with_range(source, range).with_object_size(size_bytes);
                out.payloads(frames)
            }
            ShardFormat::JsonlGz => out.lines(JsonlLines::new(source).with_range(range)),
        };
        out.close(end);
    });
    // A bug must surface as an error on this shard, never as a hang or an abort.
    if std::panic::catch_unwind(run).is_err() {
        let failure = Failure::shard("internal decoder error");
        let _ = sender.send(Message::Failed(failure));
    }
}

/// Why a stream of batches ended.
enum End {
    /// The source is done: the count check follows.
    Done,
    Failed(Failure),
    /// The reader is gone.
    Dropped,
}

/// Cuts built records into batches and sends them.
struct Batches<'a> {
    builder: RecordBuilder,
    batch_rows: usize,
    range: RecordRange,
    /// Records built so far.
    records: u64,
    invalid_lines: Vec<u64>,
    sender: &'a SyncSender<Message>,
}

impl<'a> Batches<'a> {
    fn new(options: &BatchOptions, range: RecordRange, sender: &'a SyncSender<Message>) -> Self {
        Self {
            builder: RecordBuilder::new(options.columns.clone()),
            batch_rows: options.batch_rows,
            range,
            records: 0,
            invalid_lines: Vec::new(),
            sender,
        }
    }

    fn payloads(&mut self, mut frames: ZstfFrames) -> End {
        let mut payload = Vec::new();
        loop {
            payload.clear();
            match frames.append_payload(&mut payload) {
                Ok(true) => {}
                Ok(false) => return End::Done,
                Err(failure) => return End::Failed(failure),
            }
            // The frames count records themselves (one frame each), past the declared ones too.
            if let Err(reason) = self.builder.push_msgpack(&payload) {
                return End::Failed(Failure::Shard(reason));
            }
            self.records += 1;
            if !self.send_if_full() {
                return End::Dropped;
            }
        }
    }

    fn lines(&mut self, mut lines: JsonlLines) -> End {
        loop {
            let batch = match lines.next_batch() {
                Ok(Some(batch)) => batch,
                Ok(None) => return End::Done,
                Err(failure) => return End::Failed(failure),
            };
            for line in &batch.lines {
                let text = batch.line(line);
                if self.records == self.range.records() && is_json_record(text) {
                    return End::Failed(Failure::shard(found_more(self.range.declared)));
                }
                match self.builder.push_json(text) {
                    Ok(JsonRow::Record) => self.records += 1,
                    Ok(JsonRow::Invalid) => self.invalid_lines.push(line.number),
                    Ok(JsonRow::TooDeep) => {
                        return End::Failed(Failure::Shard(format!(
                            "line {} nested deeper than {MAX_JSON_DEPTH} levels",
                            line.number
                        )))
                    }
                    Err(reason) => return End::Failed(Failure::Shard(reason)),
                }
                if !self.send_if_full() {
                    return End::Dropped;
                }
            }
        }
    }

    /// Sends the batch once it is full; `false` if the reader is gone.
    fn send_if_full(&mut self) -> bool {
        if self.builder.rows() < self.batch_rows && self.builder.bytes() < BATCH_BYTES {
            return true;
        }
        self.send_batch().is_ok()
    }

    fn send_batch(&mut self) -> Result<(), ()> {
        if self.builder.rows() == 0 && self.invalid_lines.is_empty() {
            return Ok(());
        }
        let batch = match self.builder.rows() {
            0 => Ok(None),
            _ => self.builder.finish().map(Some),
        };
        let message = match batch {
            Ok(batch) => Message::Batch(batch, std::mem::take(&mut self.invalid_lines)),
            Err(reason) => Message::Failed(Failure::Shard(reason)),
        };
        self.sender.send(message).map_err(|_| ())
    }

    /// Sends what is left, then the end: the records built before a failure still reach the
    /// caller; a full read must have built exactly the declared records.
    fn close(mut self, end: End) {
        let last = match end {
            End::Dropped => return,
            End::Failed(failure) => Message::Failed(failure),
            End::Done if self.range.is_full() && self.records != self.range.declared => {
                Message::Failed(Failure::shard(count_mismatch(
                    self.range.declared,
                    self.records,
                )))
            }
            End::Done => Message::End,
        };
        if self.send_batch().is_ok() {
            let _ = self.sender.send(last);
        }
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
) -> PyResult<ShardBatchReader> {
    let format = ShardFormat::of_shard(&uri, data_format)?;
    let range = RecordRange::new(declared_records, start, stop)?;
    let options = BatchOptions {
        columns: column_selection(columns)?,
        batch_rows: batch_size,
    };
    let chunk = chunk_size.unwrap_or(data.len()).max(1);
    let chunks: Vec<Bytes> = data.chunks(chunk).map(Bytes::copy_from_slice).collect();
    let source = Box::new(MemorySource::new(chunks));
    let size = data.len() as u64;
    Ok(ShardBatchReader::open(
        format, uri, source, size, range, options,
    )?)
}

/// Benchmark floor only (not public API): decompresses and parses every record of shard
/// bytes held in memory, building nothing, and returns how many records it found. msgpack.zstf
/// payloads are validated by the frame reader as they are decompressed; jsonl.gz lines are
/// parsed by jiter.
#[pyfunction]
#[pyo3(name = "_decode_only")]
pub fn decode_only(py: Python<'_>, data_format: &str, data: &[u8]) -> PyResult<u64> {
    let format = ShardFormat::parse(data_format)?;
    let source = Box::new(MemorySource::new(vec![Bytes::copy_from_slice(data)]));
    let size = data.len() as u64;
    let counted = py.allow_threads(move || -> Result<u64, Failure> {
        let mut records = 0;
        match format {
            ShardFormat::MsgpackZstf => {
                let range = RecordRange::full(u64::MAX);
                let mut frames = ZstfFrames::with_range(source, range).with_object_size(size);
                let mut payload = Vec::new();
                while {
                    payload.clear();
                    frames.append_payload(&mut payload)?
                } {
                    records += 1;
                }
            }
            ShardFormat::JsonlGz => {
                let mut lines = JsonlLines::new(source);
                while let Some(batch) = lines.next_batch()? {
                    records += batch
                        .lines
                        .iter()
                        .filter(|line| is_json_record(batch.line(line)))
                        .count() as u64;
                }
            }
        }
        Ok(records)
    });
    counted.map_err(|failure| failure.into_native(format, "<bytes>").into())
}

/// Parses the `columns` argument: distinct names, at least one.
pub fn column_selection(columns: Option<Vec<String>>) -> PyResult<Option<Vec<String>>> {
    let Some(columns) = columns else {
        return Ok(None);
    };
    if columns.is_empty() {
        return Err(PyValueError::new_err(
            "columns must name at least one column",
        ));
    }
    for (i, name) in columns.iter().enumerate() {
        if columns[..i].contains(name) {
            return Err(PyValueError::new_err(format!(
                "columns names {name:?} more than once"
            )));
        }
    }
    Ok(Some(columns))
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
