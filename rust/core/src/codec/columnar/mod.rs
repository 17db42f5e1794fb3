//! Columnar batches (`iter_shard_batches`): a decoder thread frames, decompresses, checks and
//! builds Arrow record batches; the binding exports them through the Arrow PyCapsule interface
//! without a copy.

mod builder;
mod records;
mod recycled;

use std::sync::mpsc::{sync_channel, Receiver, SyncSender};

use arrow_array::RecordBatch;
use bytes::Bytes;

pub use records::{is_json_record, JsonRow, RecordBuilder};

use super::gzip::GzipEntry;
use super::lines::JsonlLines;
use super::zstf::ZstfFrames;
use super::{
    count_mismatch, found_more, shard_error, DecodeFailure, RecordRange, ShardFormat,
    MAX_JSON_DEPTH,
};
use crate::error::{NativeError, NativeResult};
use crate::source::{ByteSource, MemorySource};

/// A batch is cut at its row count or once its values take about this much memory, so a
/// stream holds a few batches of this size at most (built, in flight, held by the caller).
pub const BATCH_BYTES: usize = 16 << 20;
/// Built batches waiting for the caller.
const CHANNEL_BATCHES: usize = 1;
/// The builder recurses once per nesting level (at most 1000): room for that, with margin.
const DECODER_STACK: usize = 16 << 20;

pub enum Message {
    /// A batch (none when only skipped lines are left), and the numbers of the invalid jsonl
    /// lines skipped while building it.
    Batch(Option<RecordBatch>, Vec<u64>),
    End,
    Failed(DecodeFailure),
}

/// What a batch stream builds: the columns kept and the batch size.
#[derive(Clone, Debug)]
pub struct BatchOptions {
    pub columns: Option<Vec<String>>,
    pub batch_rows: usize,
}

/// Starts building the batches of the records `range` of `source` (an object of `size_bytes`
/// bytes) on its own thread; the thread stops when the receiver is dropped.
pub fn spawn(
    format: ShardFormat,
    uri: &str,
    source: Box<dyn ByteSource>,
    size_bytes: u64,
    range: RecordRange,
    options: BatchOptions,
) -> NativeResult<Receiver<Message>> {
    spawn_at(format, uri, source, size_bytes, range, options, None)
}

/// [`spawn`] of a jsonl.gz source that starts at `entry` (an access point of the shard's
/// index) rather than at the shard's start; `range` counts in the shard.
pub fn spawn_at(
    format: ShardFormat,
    uri: &str,
    source: Box<dyn ByteSource>,
    size_bytes: u64,
    range: RecordRange,
    options: BatchOptions,
    entry: Option<GzipEntry>,
) -> NativeResult<Receiver<Message>> {
    if options.batch_rows == 0 {
        return Err(NativeError::Config("batch_size must be positive".into()));
    }
    let (sender, receiver) = sync_channel(CHANNEL_BATCHES);
    std::thread::Builder::new()
        .name("syvain-batch-decoder".into())
        .stack_size(DECODER_STACK)
        .spawn(move || produce(format, source, size_bytes, range, options, entry, sender))
        .map_err(|e| shard_error(format, uri, format!("cannot start decoder thread: {e}")))?;
    Ok(receiver)
}

/// The decoder thread: runs the format's pure-Rust core into a [`RecordBuilder`] until the end,
/// an error, or until the reader is dropped (a failed send).
fn produce(
    format: ShardFormat,
    source: Box<dyn ByteSource>,
    size_bytes: u64,
    range: RecordRange,
    options: BatchOptions,
    entry: Option<GzipEntry>,
    sender: SyncSender<Message>,
) {
    let run = std::panic::AssertUnwindSafe(|| {
        let mut out = Batches::new(&options, range, &sender);
        let end = match format {
            ShardFormat::MsgpackZstf => {
                let frames = ZstfFrames::with_range(source, range).with_object_size(size_bytes);
                out.payloads(frames)
            }
            ShardFormat::JsonlGz => out.lines(JsonlLines::open(source, range, entry.as_ref())),
        };
        out.close(end);
    });
    // A bug must surface as an error on this shard, never as a hang or an abort.
    if std::panic::catch_unwind(run).is_err() {
        let failure = DecodeFailure::shard("internal decoder error");
        let _ = sender.send(Message::Failed(failure));
    }
}

/// Why a stream of batches ended.
enum End {
    /// The source is done: the count check follows.
    Done,
    Failed(DecodeFailure),
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
                return End::Failed(DecodeFailure::Shard(reason));
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
                    return End::Failed(DecodeFailure::shard(found_more(self.range.declared)));
                }
                match self.builder.push_json(text) {
                    Ok(JsonRow::Record) => self.records += 1,
                    Ok(JsonRow::Invalid) => self.invalid_lines.push(line.number),
                    Ok(JsonRow::TooDeep) => {
                        return End::Failed(DecodeFailure::Shard(format!(
                            "line {} nested deeper than {MAX_JSON_DEPTH} levels",
                            line.number
                        )))
                    }
                    Err(reason) => return End::Failed(DecodeFailure::Shard(reason)),
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
            Err(reason) => Message::Failed(DecodeFailure::Shard(reason)),
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
                Message::Failed(DecodeFailure::shard(count_mismatch(
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

/// Benchmark floor: decompresses and parses every record of shard bytes held in memory,
/// building nothing, and returns how many records it found. msgpack.zstf payloads are
/// validated by the frame reader as they are decompressed; jsonl.gz lines are parsed by jiter.
pub fn count_records(format: ShardFormat, data: &[u8]) -> NativeResult<u64> {
    let source = Box::new(MemorySource::new(vec![Bytes::copy_from_slice(data)]));
    let size = data.len() as u64;
    let counted = (move || -> Result<u64, DecodeFailure> {
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
    })();
    counted.map_err(|failure| failure.into_native(format, "<bytes>"))
}

/// Parses the `columns` argument: distinct names, at least one.
pub fn column_selection(columns: Option<Vec<String>>) -> NativeResult<Option<Vec<String>>> {
    let Some(columns) = columns else {
        return Ok(None);
    };
    if columns.is_empty() {
        return Err(NativeError::Config(
            "columns must name at least one column".into(),
        ));
    }
    for (i, name) in columns.iter().enumerate() {
        if columns[..i].contains(name) {
            return Err(NativeError::Config(format!(
                "columns names {name:?} more than once"
            )));
        }
    }
    Ok(Some(columns))
}
