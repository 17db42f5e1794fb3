//! The record decoder thread: frames, decompresses and checks a shard's bytes on its own
//! thread and hands on batches of validated msgpack payloads or jsonl lines, so the binding
//! builds records from them while the next batch is decoded on another core.

use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Mutex;

use super::gzip::GzipEntry;
use super::lines::{JsonlLines, LineBatch};
use super::zstf::ZstfFrames;
use super::{shard_error, DecodeFailure, RecordRange, ShardFormat};
use crate::caller::{receive, Caller};
use crate::error::NativeResult;
use crate::source::ByteSource;

/// Batches in flight between the decoder thread and its reader: enough to overlap, little
/// memory.
const CHANNEL_BATCHES: usize = 2;
/// A payload batch is handed on at this many records or bytes, whichever comes first.
pub const BATCH_RECORDS: usize = 512;
const BATCH_BYTES: usize = 4 << 20;
/// The first batch of a shard holds one record and each next one four times as many, up to
/// BATCH_RECORDS: the first record reaches the caller as soon as it is decoded (an open costs
/// one record, not 512), while the steady state keeps its large batches.
const FIRST_BATCH_RECORDS: usize = 1;
/// A read of at most this many bytes of an immediate source (a block of a seeded window, a
/// small local shard) is decoded entirely in the calling thread: a thread of its own cost
/// more to start and to hand batches over than the whole decoding, and a window starts up to
/// 127 such reads at once.
const INLINE_BYTES: u64 = 256 * 1024;
const BATCH_GROWTH: usize = 4;

/// Validated payloads back to back in `data`, payload `i` ending at `ends[i]`; `next` is the
/// first not yet taken.
pub struct Payloads {
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

    /// The next payload, or `None` once every one was taken.
    pub fn take_next(&mut self) -> Option<&[u8]> {
        let end = *self.ends.get(self.next)?;
        let start = match self.next {
            0 => 0,
            n => self.ends[n - 1],
        };
        self.next += 1;
        self.data.get(start..end)
    }
}

/// What the decoder hands on: payloads, or a batch of lines with the index of the next one.
pub enum Batch {
    Payloads(Payloads),
    Lines(LineBatch, usize),
}

impl Batch {
    /// Every record of the batch was taken.
    pub fn is_done(&self) -> bool {
        match self {
            Batch::Payloads(payloads) => payloads.next >= payloads.ends.len(),
            Batch::Lines(lines, next) => *next >= lines.lines.len(),
        }
    }
}

pub enum Message {
    Batch(Batch),
    End,
    Failed(DecodeFailure),
}

/// A shard being decoded: the messages of its producer, which runs on its own thread.
pub struct Decoder {
    format: ShardFormat,
    uri: String,
    /// Behind mutexes only so that the binding's class is `Sync`; `&mut self` excludes others.
    receiver: Mutex<Receiver<Message>>,
    /// The producer and its sender, not started yet: a local shard's first batch was decoded
    /// in the calling thread, and its thread starts when the reader asks for more.
    idle: Mutex<Option<(Producer, SyncSender<Message>)>>,
    /// Every batch is decoded in the calling thread (a small read of an immediate source).
    inline: bool,
}

impl Decoder {
    /// Starts decoding the records `range` of `source` (an object of `size_bytes` bytes) as
    /// `format`. The thread stops when the decoder is dropped.
    ///
    /// A range from the first record of a source whose bytes never wait on the network
    /// ([`ByteSource::is_immediate`]: a local file, memory) has its first batch (one record)
    /// decoded here, and its thread starts only when the reader asks for the next: a shard's
    /// first record then costs no thread start and no hand-off. Such a source of at most
    /// `INLINE_BYTES` is decoded here to its end, batch by batch as the reader asks, whatever
    /// its first record: skipping within it is short. Everything else is decoded on a thread
    /// started at once, so that skipping to a later first record (reading what comes before
    /// it) never holds up the caller where it cannot be interrupted.
    pub fn start(
        format: ShardFormat,
        uri: &str,
        source: Box<dyn ByteSource>,
        size_bytes: u64,
        range: RecordRange,
    ) -> NativeResult<Decoder> {
        Self::start_at(format, uri, source, size_bytes, range, None)
    }

    /// [`Decoder::start`] of a jsonl.gz source that starts at `entry` (an access point of
    /// the shard's index) rather than at the shard's start; `range` counts in the shard.
    pub fn start_at(
        format: ShardFormat,
        uri: &str,
        source: Box<dyn ByteSource>,
        size_bytes: u64,
        range: RecordRange,
        entry: Option<&GzipEntry>,
    ) -> NativeResult<Decoder> {
        let inline = source.is_immediate() && size_bytes <= INLINE_BYTES;
        let immediate = inline || source.is_immediate() && range.start == 0;
        let mut producer = Producer::new(format, source, size_bytes, range, entry);
        let (sender, receiver) = sync_channel(CHANNEL_BATCHES);
        let mut decoder = Decoder {
            format,
            uri: uri.to_string(),
            receiver: Mutex::new(receiver),
            idle: Mutex::new(None),
            inline,
        };
        if !immediate {
            decoder.start_thread(producer, sender)?;
            return Ok(decoder);
        }
        // The channel has room, so this send never blocks.
        match guarded(|| producer.next_message()) {
            Some(message @ Message::Batch(_)) => {
                let _ = sender.send(message);
                *decoder.idle.get_mut().unwrap_or_else(|p| p.into_inner()) =
                    Some((producer, sender));
            }
            Some(last) => {
                let _ = sender.send(last);
            }
            None => {}
        }
        Ok(decoder)
    }

    fn start_thread(&self, producer: Producer, sender: SyncSender<Message>) -> NativeResult<()> {
        std::thread::Builder::new()
            .name("syvain-shard-decoder".into())
            .spawn(move || run(producer, sender))
            .map_err(|e| {
                shard_error(
                    self.format,
                    &self.uri,
                    format!("cannot start decoder thread: {e}"),
                )
            })?;
        Ok(())
    }

    /// The next message, waiting as the caller waits; `None` once the producer is gone.
    pub fn next<C: Caller>(&mut self, caller: &C) -> Result<Option<Message>, C::Error> {
        let receiver = self.receiver.get_mut().unwrap_or_else(|p| p.into_inner());
        if let Ok(message) = receiver.try_recv() {
            return Ok(Some(message));
        }
        let idle = self
            .idle
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        match idle {
            Some((mut producer, sender)) if self.inline => {
                let message = caller.blocking(|| guarded(|| producer.next_message()));
                if matches!(message, Some(Message::Batch(_))) {
                    *self.idle.get_mut().unwrap_or_else(|p| p.into_inner()) =
                        Some((producer, sender));
                }
                return Ok(message);
            }
            Some((producer, sender)) => self.start_thread(producer, sender)?,
            None => {}
        }
        receive(caller, &self.receiver)
    }
}

/// Runs `step`; a panic (a bug) becomes an error on this shard, never a hang or an abort.
fn guarded(step: impl FnOnce() -> Option<Message>) -> Option<Message> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(step)).unwrap_or_else(|_| {
        Some(Message::Failed(DecodeFailure::shard(
            "internal decoder error",
        )))
    })
}

/// The decoder thread: runs the producer until its last message, or until the reader is
/// dropped (a failed send).
fn run(mut producer: Producer, sender: SyncSender<Message>) {
    loop {
        let Some(message) = guarded(|| producer.next_message()) else {
            return;
        };
        let last = !matches!(message, Message::Batch(_));
        if sender.send(message).is_err() || last {
            return;
        }
    }
}

/// The format's pure-Rust core, cut into the messages the reader receives.
enum Producer {
    Payloads {
        frames: Box<ZstfFrames>,
        batch: Payloads,
        batch_records: usize,
        /// The end (or failure) found while a batch was still to be sent.
        last: Option<Message>,
    },
    Lines {
        lines: Box<JsonlLines>,
        done: bool,
    },
    Finished,
}

impl Producer {
    fn new(
        format: ShardFormat,
        source: Box<dyn ByteSource>,
        size_bytes: u64,
        range: RecordRange,
        entry: Option<&GzipEntry>,
    ) -> Self {
        match format {
            ShardFormat::MsgpackZstf => Producer::Payloads {
                frames: Box::new(
                    ZstfFrames::with_range(source, range).with_object_size(size_bytes),
                ),
                batch: Payloads::with_capacity(0),
                batch_records: FIRST_BATCH_RECORDS,
                last: None,
            },
            ShardFormat::JsonlGz => Producer::Lines {
                lines: Box::new(JsonlLines::open(source, range, entry)),
                done: false,
            },
        }
    }

    /// The next message; `None` after the last one (the end, or a failure).
    fn next_message(&mut self) -> Option<Message> {
        match self {
            Producer::Payloads {
                frames,
                batch,
                batch_records,
                last,
            } => {
                if let Some(last) = last.take() {
                    *self = Producer::Finished;
                    return Some(last);
                }
                let end = loop {
                    match frames.append_payload(&mut batch.data) {
                        Ok(true) => {
                            batch.ends.push(batch.data.len());
                            if batch.ends.len() >= *batch_records || batch.data.len() >= BATCH_BYTES
                            {
                                *batch_records = (*batch_records * BATCH_GROWTH).min(BATCH_RECORDS);
                                let room = batch.data.len().min(BATCH_BYTES);
                                let full = std::mem::replace(batch, Payloads::with_capacity(room));
                                return Some(Message::Batch(Batch::Payloads(full)));
                            }
                        }
                        Ok(false) => break Message::End,
                        // The records validated before the bad one still reach the caller.
                        Err(failure) => break Message::Failed(failure),
                    }
                };
                if batch.ends.is_empty() {
                    *self = Producer::Finished;
                    return Some(end);
                }
                let rest = std::mem::replace(batch, Payloads::with_capacity(0));
                *last = Some(end);
                Some(Message::Batch(Batch::Payloads(rest)))
            }
            Producer::Lines { lines, done } => {
                if *done {
                    return None;
                }
                let message = match lines.next_batch() {
                    Ok(Some(batch)) => Message::Batch(Batch::Lines(batch, 0)),
                    Ok(None) => Message::End,
                    Err(failure) => Message::Failed(failure),
                };
                *done = !matches!(message, Message::Batch(_));
                Some(message)
            }
            Producer::Finished => None,
        }
    }
}
