//! The compressor of the shard encoders: serialized records -> deterministic shard bytes,
//! handed back as they are produced so a whole shard is never held.
//!
//! The binding serializes the records of one `encode` call into one [`Serialized`] batch (under
//! the GIL), and the batch goes to a background thread that compresses it while Python carries
//! on; [`ShardCompressor::ready`] returns whatever compressed output is ready so far and
//! [`ShardCompressor::finish`] waits for the rest. At most [`BATCHES_IN_FLIGHT`] batches wait
//! for the compressor, so memory stays bounded.
//!
//! Everything that can make a call fail is decided before its batch is handed on (the payload
//! and line limits while serializing; a frame that could exceed 256 MiB by
//! `ZSTD_compressBound` is compressed and checked in the calling thread), so each call stays
//! all or nothing. The compressor itself failing (zstd or zlib refusing memory, say) surfaces
//! as an `Encode` error (ValueError) at the next `encode` or `finish`, and the encoder stays
//! broken.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TryRecvError, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use super::gzip::GzipWriter;
use super::{ShardFormat, MAX_FRAME_BYTES};
use crate::caller::Caller;
use crate::error::{NativeError, NativeResult};

/// The Zstandard level of msgpack.zstf; the content size goes in each frame header, with no
/// checksum and no dictionary (the zstd defaults for one-shot compression).
const ZSTD_LEVEL: i32 = 3;

/// Serialized batches that may wait for the compressor thread before `encode` blocks.
const BATCHES_IN_FLIGHT: usize = 3;

enum Writer {
    MsgpackZstf(Box<ZstfWriter>),
    JsonlGz(Box<GzipWriter>),
}

struct ZstfWriter {
    compressor: zstd::bulk::Compressor<'static>,
    /// One frame at a time, before it is copied behind its length.
    scratch: Vec<u8>,
}

fn new_compressor() -> NativeResult<zstd::bulk::Compressor<'static>> {
    zstd::bulk::Compressor::new(ZSTD_LEVEL)
        .map_err(|e| NativeError::Encode(format!("zstd setup failed: {e}")))
}

impl ZstfWriter {
    /// Appends each payload as a length-prefixed frame; `Err((index, problem))` names the
    /// payload that failed.
    fn compress(
        &mut self,
        data: &[u8],
        ends: &[usize],
        out: &mut Vec<u8>,
        cancel: Option<&AtomicBool>,
    ) -> Result<(), (usize, String)> {
        let mut start = 0;
        for (index, &end) in ends.iter().enumerate() {
            if cancel.is_some_and(|c| c.load(Ordering::Relaxed)) {
                return Ok(());
            }
            let payload = &data[start..end];
            start = end;
            self.scratch.clear();
            self.scratch
                .reserve(zstd::zstd_safe::compress_bound(payload.len()));
            let len = self
                .compressor
                .compress_to_buffer(payload, &mut self.scratch)
                .map_err(|e| (index, format!("zstd compression failed: {e}")))?;
            if len as u64 > MAX_FRAME_BYTES {
                return Err((index, "its compressed frame is larger than 256 MiB".into()));
            }
            out.extend_from_slice(&(len as u64).to_be_bytes());
            out.extend_from_slice(&self.scratch[..len]);
        }
        Ok(())
    }
}

/// Work for the compressor thread, in shard order.
enum Job {
    /// Serialized records: msgpack payloads ending at `ends`, or JSON lines.
    Batch { data: Vec<u8>, ends: Vec<usize> },
    /// Bytes already compressed in the calling thread, passed through in order.
    Raw(Vec<u8>),
}

/// The compressor thread's side: runs `jobs` through `writer`, sends each batch's output, and
/// once `jobs` closes without `cancel`, the gzip trailer.
fn run_worker(mut writer: Writer, jobs: Receiver<Job>, output: mpsc::Sender<Done>, pool: Pool) {
    let cancel = &pool.cancel;
    for job in jobs.iter() {
        if cancel.load(Ordering::Relaxed) {
            return;
        }
        let (result, spent) = match (job, &mut writer) {
            (Job::Raw(bytes), _) => (Ok(bytes), None),
            (Job::Batch { data, ends }, Writer::MsgpackZstf(zstf)) => {
                let mut out = pool.take();
                out.reserve(data.len() / 2 + 16 * ends.len());
                let result = match zstf.compress(&data, &ends, &mut out, Some(cancel)) {
                    Ok(()) => Ok(out),
                    Err((_, problem)) => Err(problem),
                };
                (result, Some(data))
            }
            (Job::Batch { data, .. }, Writer::JsonlGz(gzip)) => {
                let mut out = pool.take();
                (gzip.write(&data, &mut out).map(|()| out), Some(data))
            }
        };
        let result = result.map(|bytes| (bytes, spent));
        let failed = result.is_err();
        if output.send(result).is_err() || failed {
            return;
        }
    }
    if cancel.load(Ordering::Relaxed) {
        return;
    }
    if let Writer::JsonlGz(gzip) = &mut writer {
        let mut out = Vec::new();
        let result = gzip.finish(&mut out).map(|()| (out, None));
        let _ = output.send(result);
    }
}

/// A batch's compressed bytes and, for reuse, an emptied buffer; or why compression failed.
type Done = Result<(Vec<u8>, Option<Vec<u8>>), String>;
type Output = Receiver<Done>;

/// Buffers handed back and forth so steady-state batches allocate (and page-fault) nothing.
const POOL_BUFFERS: usize = 4;
/// Larger buffers (a batch of huge records) are freed rather than kept.
const MAX_POOLED_CAPACITY: usize = 64 << 20;

/// The compressor thread's end of the buffer pool, and its cancel flag.
struct Pool {
    free: Receiver<Vec<u8>>,
    count: Arc<AtomicUsize>,
    cancel: Arc<AtomicBool>,
}

impl Pool {
    fn take(&self) -> Vec<u8> {
        match self.free.try_recv() {
            Ok(mut buffer) => {
                self.count.fetch_sub(1, Ordering::Relaxed);
                buffer.clear();
                buffer
            }
            Err(_) => Vec::new(),
        }
    }
}

struct Pipeline {
    jobs: Option<SyncSender<Job>>,
    /// Only ever used through `&mut self` (`get_mut`); the mutex makes the class `Sync`.
    output: Mutex<Output>,
    worker: Option<JoinHandle<()>>,
    cancel: Arc<AtomicBool>,
    /// Emptied buffers for the compressor thread, and how many it holds.
    to_worker: mpsc::Sender<Vec<u8>>,
    worker_buffers: Arc<AtomicUsize>,
    /// Emptied buffers for serializing here.
    spare: Vec<Vec<u8>>,
}

impl Pipeline {
    fn start(writer: Writer) -> NativeResult<Self> {
        let (jobs, job_rx) = mpsc::sync_channel(BATCHES_IN_FLIGHT);
        let (out_tx, output) = mpsc::channel();
        let cancel = Arc::new(AtomicBool::new(false));
        let (to_worker, free) = mpsc::channel();
        let worker_buffers = Arc::new(AtomicUsize::new(0));
        let pool = Pool {
            free,
            count: Arc::clone(&worker_buffers),
            cancel: Arc::clone(&cancel),
        };
        let worker = std::thread::Builder::new()
            .name("syvain-shard-encoder".into())
            .spawn(move || run_worker(writer, job_rx, out_tx, pool))
            .map_err(|e| NativeError::Encode(format!("cannot start the compressor thread: {e}")))?;
        Ok(Self {
            jobs: Some(jobs),
            output: Mutex::new(output),
            worker: Some(worker),
            cancel,
            to_worker,
            worker_buffers,
            spare: Vec::new(),
        })
    }

    fn take_spare(&mut self) -> Vec<u8> {
        let mut buffer = self.spare.pop().unwrap_or_default();
        buffer.clear();
        buffer
    }

    /// Keeps an emptied buffer for reuse here or in the compressor thread, or frees it.
    fn recycle(&mut self, buffer: Vec<u8>) {
        if buffer.capacity() == 0 || buffer.capacity() > MAX_POOLED_CAPACITY {
            return;
        }
        if self.spare.len() < POOL_BUFFERS {
            self.spare.push(buffer);
        } else if self.worker_buffers.load(Ordering::Relaxed) < POOL_BUFFERS {
            self.worker_buffers.fetch_add(1, Ordering::Relaxed);
            let _ = self.to_worker.send(buffer);
        }
    }

    /// Stops the thread without waiting for its pending work.
    fn stop(&mut self) {
        self.cancel.store(true, Ordering::Relaxed);
        self.jobs = None;
        if let Some(worker) = self.worker.take() {
            let _ = worker.join();
        }
    }
}

/// Compresses one shard. Each submitted batch is all or nothing: an error leaves no byte of
/// it behind and the compressor unchanged.
pub struct ShardCompressor {
    format: ShardFormat,
    pipeline: Pipeline,
    finished: bool,
    /// The compressor thread's failure, repeated by every later call.
    failure: Option<String>,
    /// msgpack.zstf batches compressed in the calling thread use this compressor.
    local: Option<Box<ZstfWriter>>,
}

/// Serialized records of one call: payloads (msgpack) or "\n"-terminated lines (JSON) back
/// to back in `data`, record `i` ending at `ends[i]`.
pub struct Serialized {
    pub data: Vec<u8>,
    pub ends: Vec<usize>,
    format: ShardFormat,
    /// Some frame could exceed 256 MiB: compress and check in the calling thread.
    oversized: bool,
}

impl Serialized {
    /// Ends the record written to `data` from `start` on.
    pub fn end_record(&mut self, start: usize) {
        if self.format == ShardFormat::MsgpackZstf
            && zstd::zstd_safe::compress_bound(self.data.len() - start) as u64 > MAX_FRAME_BYTES
        {
            self.oversized = true;
        }
        self.ends.push(self.data.len());
    }
}

impl ShardCompressor {
    /// A compressor for `format`, with its thread started.
    pub fn new(format: ShardFormat) -> NativeResult<Self> {
        let writer = match format {
            ShardFormat::MsgpackZstf => Writer::MsgpackZstf(Box::new(ZstfWriter {
                compressor: new_compressor()?,
                scratch: Vec::new(),
            })),
            ShardFormat::JsonlGz => Writer::JsonlGz(Box::default()),
        };
        Ok(Self {
            format,
            pipeline: Pipeline::start(writer)?,
            finished: false,
            failure: None,
            local: None,
        })
    }

    pub fn format(&self) -> ShardFormat {
        self.format
    }

    /// An empty batch to serialize records into, its buffer reused from earlier batches.
    pub fn batch(&mut self) -> Serialized {
        Serialized {
            data: self.pipeline.take_spare(),
            ends: Vec::new(),
            format: self.format,
            oversized: false,
        }
    }

    /// The error for record `index` of the current call.
    pub fn record_error(&self, index: usize, err: NativeError) -> NativeError {
        match err {
            NativeError::Encode(problem) => NativeError::Encode(format!(
                "Cannot write {} record {index}: {problem}",
                self.format.name()
            )),
            other => other,
        }
    }

    /// Fails once the compressor has failed, and after `finish`.
    pub fn check(&self, operation: &str) -> NativeResult<()> {
        if self.finished {
            return Err(NativeError::Encode(format!(
                "ShardEncoder.{operation} called after finish"
            )));
        }
        match &self.failure {
            Some(problem) => Err(NativeError::Encode(problem.clone())),
            None => Ok(()),
        }
    }

    /// Gives a serialized batch to the compressor thread. When the thread is behind and this
    /// is msgpack.zstf, compresses the batch here instead (frames are independent, so the
    /// bytes are the same) and passes them through, keeping both cores busy.
    pub fn submit<C: Caller>(&mut self, caller: &C, batch: Serialized) -> Result<(), C::Error> {
        if batch.ends.is_empty() {
            self.recycle(batch.data);
            return Ok(());
        }
        let job = if batch.oversized {
            // Rare (a payload near 256 MiB): compress here so a too-large frame fails this call.
            Job::Raw(self.compress_here(caller, &batch.data, &batch.ends)?)
        } else {
            let job = Job::Batch {
                data: batch.data,
                ends: batch.ends,
            };
            let jobs = self.jobs()?;
            match jobs.try_send(job) {
                Ok(()) => return Ok(()),
                Err(TrySendError::Disconnected(_)) => return Err(self.stopped().into()),
                Err(TrySendError::Full(Job::Batch { data, ends }))
                    if self.format == ShardFormat::MsgpackZstf =>
                {
                    let compressed = self.compress_here(caller, &data, &ends)?;
                    self.pipeline.recycle(data);
                    Job::Raw(compressed)
                }
                Err(TrySendError::Full(job)) => job,
            }
        };
        let jobs = self.jobs()?;
        if caller.blocking(|| jobs.send(job)).is_err() {
            return Err(self.stopped().into());
        }
        Ok(())
    }

    fn jobs(&self) -> NativeResult<&SyncSender<Job>> {
        self.pipeline
            .jobs
            .as_ref()
            .ok_or_else(|| NativeError::Encode("the shard compressor is closed".into()))
    }

    /// Compresses msgpack payloads in the calling thread.
    fn compress_here<C: Caller>(
        &mut self,
        caller: &C,
        data: &[u8],
        ends: &[usize],
    ) -> Result<Vec<u8>, C::Error> {
        if self.local.is_none() {
            self.local = Some(Box::new(ZstfWriter {
                compressor: new_compressor()?,
                scratch: Vec::new(),
            }));
        }
        let spare = self.pipeline.take_spare();
        let zstf = self.local.as_deref_mut().expect("just set");
        let compressed = caller.blocking(|| {
            let mut out = spare;
            out.reserve(data.len() / 2 + 16 * ends.len());
            zstf.compress(data, ends, &mut out, None).map(|()| out)
        });
        compressed.map_err(|(index, problem)| {
            self.record_error(index, NativeError::Encode(problem))
                .into()
        })
    }

    /// The compressor thread went away: its own error if it sent one.
    fn stopped(&mut self) -> NativeError {
        let mut ignored = Vec::new();
        match self.ready(&mut ignored) {
            Err(err) => err,
            Ok(()) => self.fail("the shard compressor thread stopped".into()),
        }
    }

    /// Takes the compressed output that is ready, without waiting.
    pub fn ready(&mut self, out: &mut Vec<Vec<u8>>) -> NativeResult<()> {
        loop {
            let output = self
                .pipeline
                .output
                .get_mut()
                .unwrap_or_else(|e| e.into_inner());
            match output.try_recv() {
                Ok(Ok((bytes, spent))) => {
                    out.push(bytes);
                    if let Some(buffer) = spent {
                        self.pipeline.recycle(buffer);
                    }
                }
                Ok(Err(problem)) => return Err(self.fail(problem)),
                Err(TryRecvError::Empty) => return Ok(()),
                Err(TryRecvError::Disconnected) => {
                    if self.pipeline.jobs.is_some() {
                        return Err(self.fail("the shard compressor thread stopped".into()));
                    }
                    return Ok(());
                }
            }
        }
    }

    fn fail(&mut self, problem: String) -> NativeError {
        let problem = format!("Cannot write {} shard: {problem}", self.format.name());
        self.failure = Some(problem.clone());
        self.pipeline.stop();
        NativeError::Encode(problem)
    }

    /// Waits for the compressor and appends the shard's remaining bytes (with the gzip
    /// trailer) to `out`. Once finished, it appends nothing.
    pub fn finish<C: Caller>(
        &mut self,
        caller: &C,
        out: &mut Vec<Vec<u8>>,
    ) -> Result<(), C::Error> {
        if self.finished {
            return Ok(());
        }
        self.check("finish")?;
        self.pipeline.jobs = None;
        let output: Output = std::mem::replace(
            self.pipeline
                .output
                .get_mut()
                .unwrap_or_else(|e| e.into_inner()),
            mpsc::channel().1,
        );
        let received: Vec<Done> = caller.blocking(move || output.into_iter().collect());
        if let Some(worker) = self.pipeline.worker.take() {
            if caller.blocking(|| worker.join()).is_err() {
                return Err(self
                    .fail("the shard compressor thread panicked".into())
                    .into());
            }
        }
        for result in received {
            match result {
                Ok((bytes, _)) => out.push(bytes),
                Err(problem) => return Err(self.fail(problem).into()),
            }
        }
        self.finished = true;
        self.pipeline.spare = Vec::new();
        Ok(())
    }

    /// Takes back a buffer whose bytes were handed on.
    pub fn recycle(&mut self, buffer: Vec<u8>) {
        self.pipeline.recycle(buffer);
    }

    /// Handed-out bytes were lost (the caller could not allocate them): later calls would
    /// write a shard with a hole, so every one fails.
    pub fn lose_output(&mut self) {
        self.failure = Some("earlier shard bytes were lost to a MemoryError".into());
    }
}

impl Drop for ShardCompressor {
    fn drop(&mut self) {
        self.pipeline.stop();
    }
}
