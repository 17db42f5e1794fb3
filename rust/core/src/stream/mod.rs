//! Resumable streaming of an immutable object of known size (SPEC section 4).
//!
//! A background task issues ranged GETs from the current offset with If-Match, resumes at the
//! last received byte after any transient failure (with a fresh client), and keeps at most the
//! read's readahead bound (`READAHEAD_BYTES` unless it asks for less) ahead of the consumer. The
//! consumer pulls chunks with a timeout so that its caller can look for Ctrl-C between waits.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use chrono::{DateTime, Utc};

use object_store::path::Path;
use object_store::ObjectStore;
use tokio::sync::{mpsc, Semaphore};
use tokio::task::JoinHandle;

use crate::counters::Counters;
use crate::error::{NativeError, NativeResult};
use crate::policy::Policy;
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
    /// The Last-Modified date the read is held to (a web server without ETags), if known.
    pub modified: Option<DateTime<Utc>>,
    /// The server must name the object's version (an ETag) so that a resumed read is held to
    /// the bytes it began with: an https:// or hf:// object, whose manifest etag is not
    /// enforced (a mirror's etags are its own).
    pub require_etag: bool,
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

/// The version a read is held to: the object's ETag (If-Match), or, from a web server that
/// gives none, its Last-Modified (If-Unmodified-Since, and every response's Last-Modified must
/// equal it), so that a resumed read never joins bytes of two versions. A read of several
/// streams (a Parquet file's footer, then its pages) passes the first one's on.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Version {
    pub etag: Option<String>,
    pub modified: Option<DateTime<Utc>>,
}

/// State shared between the task and the consumer.
#[derive(Default)]
struct Shared {
    warnings: Mutex<Vec<String>>,
    resumes: AtomicU32,
    /// The version the stream's responses were held to, once one was seen.
    pinned: Mutex<Option<Version>>,
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

    /// The version the stream's responses were held to (None before the first response).
    pub fn pinned(&self) -> Option<Version> {
        self.shared
            .pinned
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
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

mod producer;

use producer::Producer;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::object_stores::StorageConfig;
    use crate::storage::Storage;

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
        let storage = Storage::new(StorageConfig {
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
