//! Resumable streaming of an immutable object of known size (SPEC section 4).
//!
//! A background task issues ranged GETs from the current offset with If-Match, resumes at the
//! last received byte after any transient failure (with a fresh client), and keeps at most the
//! read's readahead bound (`READAHEAD_BYTES` unless it asks for less) ahead of the consumer. The
//! consumer pulls chunks with a timeout so that its caller can look for Ctrl-C between waits.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use std::io::{Read, Seek, SeekFrom};

use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt};
use object_store::path::Path;
use object_store::{GetOptions, GetRange, GetResult, GetResultPayload, ObjectStore};
use tokio::sync::{mpsc, Semaphore};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::caller::retry_message;
use crate::classify::{classify_store_error, first_line, StoreFailure};
use crate::counters::{Counters, RetryCause};
use crate::error::{NativeError, NativeResult};
use crate::policy::{Budget, Policy};
use crate::runtime::runtime;
use crate::source::ByteSource;

/// The most bytes the background task holds ahead of the consumer (the default, and the
/// largest bound a read may ask for).
pub const READAHEAD_BYTES: usize = 8 * 1024 * 1024;
/// The smallest readahead bound a read may ask for (a local file's first piece fits in it).
pub const MIN_READAHEAD_BYTES: usize = 64 * 1024;
const CHANNEL_SLOTS: usize = 64;
/// Back-to-back chunks are merged up to this size before they are handed over.
pub const COALESCE_BYTES: usize = 1024 * 1024;
/// A local file's first read, growing fourfold per read up to COALESCE_BYTES: a shard's first
/// record waits for 64 KiB, not 1 MiB, while the steady state keeps large reads.
pub const FIRST_FILE_READ: usize = 64 * 1024;

/// Builds a fresh store for every (re)connection.
pub type StoreFactory = Arc<dyn Fn() -> NativeResult<Arc<dyn ObjectStore>> + Send + Sync>;

/// What to stream.
#[derive(Clone)]
pub struct StreamRequest {
    pub uri: String,
    pub path: Path,
    /// The whole object's size: the store's answer and a local file's length must match it.
    pub size: u64,
    pub etag: Option<String>,
    /// Where the read starts and stops (`end` is `size` for a whole-object read; less for a
    /// segment of it): only `[start, end)` is requested, and exactly those bytes must arrive.
    pub start: u64,
    pub end: u64,
    /// When set, data errors are reported as "Unreadable {format} shard {uri}: ...".
    pub format: Option<&'static str>,
    pub policy: Policy,
    /// The most bytes held ahead of the consumer (`READAHEAD_BYTES` unless the read asks for
    /// less; see [`readahead_bound`]). No chunk handed over is larger, so the bound holds for
    /// bytes, not just permits.
    pub readahead: usize,
}

/// The readahead bound of a read: `READAHEAD_BYTES` when none is asked for, else the one asked
/// for, which must lie in `MIN_READAHEAD_BYTES..=READAHEAD_BYTES`.
pub fn readahead_bound(requested: Option<u64>) -> NativeResult<usize> {
    match requested {
        None => Ok(READAHEAD_BYTES),
        Some(bytes) if (MIN_READAHEAD_BYTES as u64..=READAHEAD_BYTES as u64).contains(&bytes) => {
            Ok(bytes as usize)
        }
        Some(bytes) => Err(invalid_readahead(bytes)),
    }
}

/// The error for a readahead bound out of range (`value` as the caller gave it).
pub fn invalid_readahead(value: impl std::fmt::Display) -> NativeError {
    NativeError::Config(format!(
        "Invalid readahead_bytes {value}; expected {MIN_READAHEAD_BYTES} (64 KiB) <= \
         readahead_bytes <= {READAHEAD_BYTES} (8 MiB)"
    ))
}

/// State shared between the task and the consumer.
#[derive(Default)]
struct Shared {
    warnings: Mutex<Vec<String>>,
    resumes: AtomicU32,
}

/// One step of the consumer.
pub enum Received {
    Chunk(Bytes),
    End,
    Pending,
}

/// The consumer's end of a stream.
pub struct StreamReader {
    uri: String,
    size: u64,
    /// Where the read stops (`size` unless a segment was asked for).
    end: u64,
    position: u64,
    finished: bool,
    receiver: mpsc::Receiver<NativeResult<Bytes>>,
    readahead: Arc<Semaphore>,
    /// The readahead bound: the semaphore's permits when nothing is buffered.
    bound: usize,
    shared: Arc<Shared>,
    task: JoinHandle<()>,
    /// The counters entered when the stream was opened, if any.
    counters: Option<Arc<Counters>>,
}

impl StreamReader {
    /// Starts streaming; the stream counters entered on this thread count it.
    pub fn open(request: StreamRequest, factory: StoreFactory) -> NativeResult<StreamReader> {
        let counters = crate::counters::entered();
        if let Some(counters) = &counters {
            counters.stream_opened();
        }
        Self::continue_counted(request, factory, counters)
    }

    /// Continues, from `request.start`, a read that another source started and counted as an
    /// open: its bytes and retries add to `counters`.
    pub fn continue_counted(
        mut request: StreamRequest,
        factory: StoreFactory,
        counters: Option<Arc<Counters>>,
    ) -> NativeResult<StreamReader> {
        let runtime = runtime()?;
        let (sender, receiver) = mpsc::channel(CHANNEL_SLOTS);
        // Checked by `readahead_bound` where a caller asks for one; kept in range here too.
        let bound = request
            .readahead
            .clamp(MIN_READAHEAD_BYTES, READAHEAD_BYTES);
        request.readahead = bound;
        let readahead = Arc::new(Semaphore::new(bound));
        let shared = Arc::new(Shared::default());
        let (uri, size, end, position) = (
            request.uri.clone(),
            request.size,
            request.end,
            request.start,
        );
        let producer = Producer {
            request,
            factory,
            sender,
            readahead: readahead.clone(),
            shared: shared.clone(),
            counters: counters.clone(),
        };
        let task = runtime.spawn(producer.run());
        Ok(StreamReader {
            uri,
            size,
            end,
            position,
            finished: false,
            receiver,
            readahead,
            bound,
            shared,
            task,
            counters,
        })
    }

    pub fn uri(&self) -> &str {
        &self.uri
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    pub fn position(&self) -> u64 {
        self.position
    }

    /// Bytes downloaded ahead of the consumer and not yet taken (at most the readahead bound).
    pub fn buffered_bytes(&self) -> usize {
        self.bound
            .saturating_sub(self.readahead.available_permits())
    }

    /// The most bytes this stream holds ahead of its consumer.
    pub fn readahead_bytes(&self) -> usize {
        self.bound
    }

    /// Transient failures that were retried so far.
    pub fn resumes(&self) -> u32 {
        self.shared.resumes.load(Ordering::Relaxed)
    }

    /// Retry warnings not yet logged (the consumer logs them where it holds the GIL).
    pub fn take_warnings(&self) -> Vec<String> {
        std::mem::take(
            &mut *self
                .shared
                .warnings
                .lock()
                .unwrap_or_else(|p| p.into_inner()),
        )
    }

    /// Waits up to `timeout` for the next chunk. Blocking: call without the GIL.
    pub fn receive(&mut self, timeout: Duration) -> NativeResult<Received> {
        if self.finished {
            return Ok(Received::End);
        }
        let runtime = runtime()?;
        let outcome =
            runtime.block_on(async { tokio::time::timeout(timeout, self.receiver.recv()).await });
        match outcome {
            Err(_) => Ok(Received::Pending),
            Ok(None) => {
                self.finished = true;
                if self.position == self.end {
                    Ok(Received::End)
                } else {
                    Err(NativeError::Storage {
                        uri: self.uri.clone(),
                        detail: format!(
                            "stream stopped at offset {} of {}",
                            self.position,
                            extent(self.size, self.end)
                        ),
                    })
                }
            }
            Ok(Some(Err(error))) => {
                self.finished = true;
                Err(error)
            }
            Ok(Some(Ok(chunk))) => {
                self.readahead
                    .add_permits(permits_for(chunk.len(), self.bound));
                self.position += chunk.len() as u64;
                if let Some(counters) = &self.counters {
                    counters.bytes_received(chunk.len());
                }
                Ok(Received::Chunk(chunk))
            }
        }
    }
}

impl ByteSource for StreamReader {
    fn next_chunk(&mut self) -> NativeResult<Option<Bytes>> {
        loop {
            let received = self.receive(Duration::from_secs(1));
            let warnings = self.take_warnings();
            for warning in &warnings {
                crate::warnings::warn(warning);
            }
            match received? {
                Received::Chunk(chunk) => return Ok(Some(chunk)),
                Received::End => return Ok(None),
                Received::Pending => continue,
            }
        }
    }
}

impl Drop for StreamReader {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Local files are read off the runtime in pieces of 64 KiB growing to `largest` (1 MiB, or the
/// readahead bound if less; object_store's own stream reads 8 KiB).
fn body_stream(
    response: GetResult,
    largest: usize,
) -> BoxStream<'static, object_store::Result<Bytes>> {
    match response.payload {
        GetResultPayload::File(file, _) => {
            let range = response.range;
            let state = (Some(file), range.start, range.end, FIRST_FILE_READ);
            futures::stream::try_unfold(state, move |(file, position, end, piece)| {
                async move {
                    let Some(mut file) = file else {
                        return Ok(None);
                    };
                    if position >= end {
                        return Ok(None);
                    }
                    let want = (end - position).min(piece as u64);
                    let read_piece = move || {
                        // Read into spare capacity: no zeroing of a buffer about to be filled.
                        let mut buffer = Vec::with_capacity(want as usize);
                        file.seek(SeekFrom::Start(position))?;
                        (&mut file).take(want).read_to_end(&mut buffer)?;
                        Ok::<_, std::io::Error>((file, buffer))
                    };
                    // The first, small read runs right here: two thread hand-offs fewer before
                    // a shard's first record. The large ones go to the blocking pool, so a
                    // slow disk never holds up the runtime's other streams for long.
                    let read = if piece == FIRST_FILE_READ {
                        Ok(read_piece())
                    } else {
                        tokio::task::spawn_blocking(read_piece).await
                    };
                    let generic = |source: Box<dyn std::error::Error + Send + Sync>| {
                        object_store::Error::Generic {
                            store: "LocalFileSystem",
                            source,
                        }
                    };
                    let (file, buffer) = match read {
                        Ok(Ok(done)) => done,
                        // The io::Error itself, so that `classify_store_error` sorts it by its kind.
                        Ok(Err(io)) => return Err(generic(Box::new(io))),
                        Err(join) => return Err(generic(Box::new(join))),
                    };
                    if buffer.is_empty() {
                        // The file shrank under us: end here, the caller reports the short body.
                        return Ok(None);
                    }
                    let next = position + buffer.len() as u64;
                    let piece = (piece * 4).min(largest);
                    Ok(Some((Bytes::from(buffer), (Some(file), next, end, piece))))
                }
            })
            .boxed()
        }
        GetResultPayload::Stream(stream) => stream,
    }
}

/// "N bytes" for a whole-object read, "the segment ending at offset E of N bytes" otherwise.
fn extent(size: u64, end: u64) -> String {
    if end == size {
        format!("{size} bytes")
    } else {
        format!("the segment ending at offset {end} of {size} bytes")
    }
}

/// The permits a chunk takes: its length, but never more than the whole bound, so that any
/// chunk can pass once the consumer has taken everything before it (no deadlock).
fn permits_for(len: usize, bound: usize) -> usize {
    len.min(bound)
}

/// The background task's state.
struct Producer {
    request: StreamRequest,
    factory: StoreFactory,
    sender: mpsc::Sender<NativeResult<Bytes>>,
    readahead: Arc<Semaphore>,
    shared: Arc<Shared>,
    counters: Option<Arc<Counters>>,
}

/// A failed ranged GET: what to do, and why (for the retry counters).
struct AttemptFailure {
    failure: StoreFailure,
    cause: RetryCause,
}

impl AttemptFailure {
    fn transient(cause: RetryCause, detail: String) -> Self {
        AttemptFailure {
            failure: StoreFailure::Transient(detail),
            cause,
        }
    }

    fn classified(uri: &str, error: object_store::Error, if_match: Option<&str>) -> Self {
        let cause = RetryCause::of(&error);
        AttemptFailure {
            failure: classify_store_error(uri, error, if_match),
            cause,
        }
    }
}

impl From<StoreFailure> for AttemptFailure {
    fn from(failure: StoreFailure) -> Self {
        AttemptFailure {
            failure,
            cause: RetryCause::Other,
        }
    }
}

/// How one ranged GET ended.
enum Attempt {
    Done,
    /// The whole-response deadline passed after progress: reopen at once.
    Reopen,
    ConsumerGone,
}

impl Producer {
    async fn run(self) {
        let mut offset = self.request.start;
        let mut etag = self.request.etag.clone();
        let mut budget = Budget::new(self.request.policy);
        let mut store = None;
        loop {
            if offset >= self.request.end {
                return;
            }
            let result = match store.clone() {
                Some(store) => {
                    self.attempt(store, &mut offset, &mut etag, &mut budget)
                        .await
                }
                None => match (self.factory)() {
                    Ok(fresh) => {
                        store = Some(fresh.clone());
                        self.attempt(fresh, &mut offset, &mut etag, &mut budget)
                            .await
                    }
                    Err(error) => Err(StoreFailure::Fatal(error).into()),
                },
            };
            let (failure, cause) = match result {
                Ok(Attempt::Done) | Ok(Attempt::ConsumerGone) => return,
                Ok(Attempt::Reopen) => continue,
                Err(AttemptFailure { failure, cause }) => (failure, cause),
            };
            match failure {
                StoreFailure::Fatal(error) => {
                    let _ = self.sender.send(Err(error)).await;
                    return;
                }
                StoreFailure::Transient(detail) => {
                    let elapsed = budget.elapsed_without_progress();
                    let Some(delay) = budget.next_delay() else {
                        let error = NativeError::RetryExhausted {
                            operation: "GET",
                            uri: self.request.uri.clone(),
                            position: format!(
                                " at offset {offset} of {}",
                                extent(self.request.size, self.request.end)
                            ),
                            attempts: budget.failed_attempts(),
                            elapsed_s: budget.elapsed().as_secs_f64(),
                            last_error: first_line(&detail).to_string(),
                        };
                        let _ = self.sender.send(Err(error)).await;
                        return;
                    };
                    let message = retry_message(
                        "GET",
                        &self.request.uri,
                        budget.failed_attempts(),
                        elapsed,
                        delay,
                        &format!("at offset {offset}: {detail}"),
                    );
                    self.shared
                        .warnings
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push(message);
                    self.shared.resumes.fetch_add(1, Ordering::Relaxed);
                    if let Some(counters) = &self.counters {
                        counters.retried(cause);
                    }
                    tokio::time::sleep(delay).await;
                    // A fresh client: the old one's connections may be what failed.
                    store = None;
                }
            }
        }
    }

    fn data_error(&self, reason: String) -> StoreFailure {
        StoreFailure::Fatal(match self.request.format {
            Some(format) => NativeError::Shard {
                format,
                uri: self.request.uri.clone(),
                reason,
            },
            None => NativeError::InvalidData {
                uri: self.request.uri.clone(),
                reason,
            },
        })
    }

    /// Sends the held bytes to the consumer, within the readahead bound. False: consumer gone.
    async fn hand_over(&self, held: &mut BytesMut, offset: &mut u64) -> bool {
        if held.is_empty() {
            return true;
        }
        self.hand_over_chunk(held.split().freeze(), offset).await
    }

    /// Sends a chunk to the consumer in pieces of at most the readahead bound (zero-copy), so
    /// that the bound holds for the bytes buffered, not just for the permits.
    async fn hand_over_chunk(&self, mut chunk: Bytes, offset: &mut u64) -> bool {
        let bound = self.request.readahead;
        while chunk.len() > bound {
            let piece = chunk.split_to(bound);
            if !self.send_within_bound(piece, offset).await {
                return false;
            }
        }
        self.send_within_bound(chunk, offset).await
    }

    async fn send_within_bound(&self, chunk: Bytes, offset: &mut u64) -> bool {
        let permits = permits_for(chunk.len(), self.request.readahead);
        let Ok(permit) = self.readahead.acquire_many(permits as u32).await else {
            return false;
        };
        permit.forget();
        *offset += chunk.len() as u64;
        self.sender.send(Ok(chunk)).await.is_ok()
    }

    async fn attempt(
        &self,
        store: Arc<dyn ObjectStore>,
        offset: &mut u64,
        etag: &mut Option<String>,
        budget: &mut Budget,
    ) -> Result<Attempt, AttemptFailure> {
        let request = &self.request;
        let policy = &request.policy;
        let options = GetOptions {
            range: Some(GetRange::Bounded(*offset..request.end)),
            if_match: etag.clone(),
            ..Default::default()
        };
        let deadline = Instant::now() + policy.stream_response_deadline;
        let opened = tokio::time::timeout_at(
            deadline.min(Instant::now() + policy.read_inactivity_timeout),
            store.get_opts(&request.path, options),
        )
        .await
        .map_err(|_| {
            AttemptFailure::transient(
                RetryCause::Timeout,
                "timed out waiting for the response".into(),
            )
        })?;
        let response =
            opened.map_err(|e| AttemptFailure::classified(&request.uri, e, etag.as_deref()))?;
        if response.meta.size != request.size {
            return Err(self
                .data_error(format!(
                    "size mismatch: the object has {} bytes but size_bytes is {}",
                    response.meta.size, request.size
                ))
                .into());
        }
        if etag.is_none() {
            etag.clone_from(&response.meta.e_tag);
        }
        // Neither a local file's piece nor a merged chunk grows past the readahead bound.
        let largest = COALESCE_BYTES.min(request.readahead);
        let mut body = body_stream(response, largest);
        // Chunks that arrive back to back are merged (local files come in 8 KiB pieces);
        // whatever is held is handed over before waiting on the network.
        let mut held = BytesMut::new();
        let mut received_here = false;
        loop {
            let next = match body.next().now_or_never() {
                Some(next) => next,
                None => {
                    if !self.hand_over(&mut held, offset).await {
                        return Ok(Attempt::ConsumerGone);
                    }
                    let wake = deadline.min(Instant::now() + policy.read_inactivity_timeout);
                    match tokio::time::timeout_at(wake, body.next()).await {
                        Ok(next) => next,
                        Err(_) if Instant::now() >= deadline && received_here => {
                            return Ok(Attempt::Reopen)
                        }
                        Err(_) => {
                            return Err(AttemptFailure::transient(
                                RetryCause::Timeout,
                                format!(
                                    "no data for {:.1} s",
                                    policy.read_inactivity_timeout.as_secs_f64()
                                ),
                            ))
                        }
                    }
                }
            };
            let chunk = match next {
                None => break,
                Some(Err(error)) => {
                    if !self.hand_over(&mut held, offset).await {
                        return Ok(Attempt::ConsumerGone);
                    }
                    return Err(AttemptFailure::classified(
                        &request.uri,
                        error,
                        etag.as_deref(),
                    ));
                }
                Some(Ok(chunk)) => chunk,
            };
            if *offset + (held.len() + chunk.len()) as u64 > request.end {
                let reason = if request.end == request.size {
                    format!("received more bytes than size_bytes ({})", request.size)
                } else {
                    format!(
                        "received more bytes than the segment ending at offset {}",
                        request.end
                    )
                };
                return Err(self.data_error(reason).into());
            }
            budget.progress();
            received_here = true;
            if held.is_empty() && chunk.len() >= FIRST_FILE_READ {
                // Large enough as it is (a local file's piece): handed over without a copy.
                if !self.hand_over_chunk(chunk, offset).await {
                    return Ok(Attempt::ConsumerGone);
                }
                continue;
            }
            held.extend_from_slice(&chunk);
            if held.len() >= largest && !self.hand_over(&mut held, offset).await {
                return Ok(Attempt::ConsumerGone);
            }
        }
        if !self.hand_over(&mut held, offset).await {
            return Ok(Attempt::ConsumerGone);
        }
        if *offset < request.end {
            return Err(AttemptFailure::transient(
                RetryCause::EndedEarly,
                format!(
                    "response body ended early at offset {offset} of {}",
                    extent(request.size, request.end)
                ),
            ));
        }
        Ok(Attempt::Done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::Storage;
    use crate::store::StoreConfig;

    #[test]
    fn readahead_bounds_in_range_only() {
        assert_eq!(readahead_bound(None).unwrap(), READAHEAD_BYTES);
        assert_eq!(readahead_bound(Some(65_536)).unwrap(), 65_536);
        assert_eq!(readahead_bound(Some(8 << 20)).unwrap(), 8 << 20);
        for bad in [0, 1000, 65_535, (8 << 20) + 1, 1 << 40] {
            let error = readahead_bound(Some(bad)).unwrap_err();
            assert!(
                matches!(&error, NativeError::Config(m) if m.contains(&bad.to_string())),
                "{error}"
            );
        }
    }

    #[test]
    fn permits_never_exceed_the_bound() {
        assert_eq!(permits_for(10, 65_536), 10);
        assert_eq!(permits_for(1 << 20, 65_536), 65_536);
    }

    /// A local file streamed with a 64 KiB bound: no chunk and no backlog larger than that,
    /// every byte in order.
    #[test]
    fn a_bounded_stream_buffers_at_most_its_bound() {
        let dir = std::env::temp_dir().join(format!("syvain-readahead-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("object.bin");
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        let uri = format!("file://{}", path.display());
        let storage = Storage::new(StoreConfig {
            s3_base_url: None,
            region: "us-east-1".into(),
            ..Default::default()
        })
        .unwrap();
        let size = data.len() as u64;
        let bound = MIN_READAHEAD_BYTES;
        let mut reader = storage
            .stream_range(&uri, size, None, 0, size, None, Some(bound as u64))
            .unwrap();
        assert_eq!(reader.readahead_bytes(), bound);
        let mut got = Vec::new();
        let mut first = true;
        while let Some(chunk) = reader.next_chunk().unwrap() {
            assert!(chunk.len() <= bound, "a chunk of {} bytes", chunk.len());
            got.extend_from_slice(&chunk);
            if first {
                first = false;
                std::thread::sleep(Duration::from_millis(300));
                let buffered = reader.buffered_bytes();
                assert!(
                    0 < buffered && buffered <= bound,
                    "{buffered} bytes buffered"
                );
            }
        }
        assert_eq!(got, data);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
