//! A shard on the local directory store, read straight into its decoder thread: no runtime
//! task, no channel and no thread hand-off between the file and the decoder, so a shard's first
//! record costs one open, one stat and one small read.
//!
//! The local rules of SPEC section 4 are those of the stream: the size guards the read (the
//! etag of a local file is not enforced), a missing file or a directory is a missing object,
//! other failures are sorted by their `io::ErrorKind` (`classify_local_io`), and a transient
//! one (interrupted, timed out, the file ending early) is retried under the budget from the
//! byte reached, with the same warning line.

use std::fs::File;
use std::io::{ErrorKind, Read, Seek, SeekFrom};
use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;

use crate::caller::retry_message;
use crate::classify::{classify_local_io, first_line, StoreFailure};
use crate::counters::{self, Counters, RetryCause};
use crate::error::{NativeError, NativeResult};
use crate::policy::{Budget, Policy};
use crate::source::ByteSource;
use crate::stream::{COALESCE_BYTES, FIRST_FILE_READ};
use crate::warnings;

/// The bytes `[start, size)` of a local file, as a decoder pulls them.
pub struct LocalFileSource {
    uri: String,
    path: PathBuf,
    size: u64,
    position: u64,
    /// When set, data errors read "Unreadable {format} shard {uri}: ...".
    format: Option<&'static str>,
    file: Option<File>,
    /// The next read's size: 64 KiB first, growing fourfold up to 1 MiB.
    piece: usize,
    budget: Budget,
    counters: Option<Arc<Counters>>,
}

impl LocalFileSource {
    /// Nothing is opened yet (that happens in the decoder thread); the stream counters entered
    /// on the calling thread count it.
    pub fn new(
        uri: &str,
        path: PathBuf,
        size: u64,
        format: Option<&'static str>,
        policy: Policy,
    ) -> Self {
        let counters = counters::entered();
        if let Some(counters) = &counters {
            counters.stream_opened();
        }
        Self {
            uri: uri.to_string(),
            path,
            size,
            position: 0,
            format,
            file: None,
            piece: FIRST_FILE_READ,
            budget: Budget::new(policy),
            counters,
        }
    }

    fn data_error(&self, reason: String) -> NativeError {
        match self.format {
            Some(format) => NativeError::Shard {
                format,
                uri: self.uri.clone(),
                reason,
            },
            None => NativeError::InvalidData {
                uri: self.uri.clone(),
                reason,
            },
        }
    }

    fn io_failure(&self, error: &std::io::Error) -> StoreFailure {
        match error.kind() {
            ErrorKind::NotFound => StoreFailure::Fatal(NativeError::NotFound {
                uri: self.uri.clone(),
            }),
            _ => classify_local_io(&self.uri, error),
        }
    }

    /// Opens the file at the current position, after checking that it is the declared size.
    fn open(&self) -> Result<File, StoreFailure> {
        let mut file = File::open(&self.path).map_err(|e| self.io_failure(&e))?;
        let meta = file.metadata().map_err(|e| self.io_failure(&e))?;
        if meta.is_dir() {
            return Err(StoreFailure::Fatal(NativeError::NotFound {
                uri: self.uri.clone(),
            }));
        }
        if meta.len() != self.size {
            return Err(StoreFailure::Fatal(self.data_error(format!(
                "size mismatch: the object has {} bytes but size_bytes is {}",
                meta.len(),
                self.size
            ))));
        }
        file.seek(SeekFrom::Start(self.position))
            .map_err(|e| self.io_failure(&e))?;
        Ok(file)
    }

    /// The next piece; the cause comes with a transient failure.
    fn read_piece(&mut self) -> Result<Bytes, (StoreFailure, RetryCause)> {
        if self.file.is_none() {
            self.file = Some(self.open().map_err(|f| (f, RetryCause::Other))?);
        }
        let want = (self.size - self.position).min(self.piece as u64);
        // Read into spare capacity: no zeroing of a buffer about to be filled.
        let mut buffer = Vec::with_capacity(want as usize);
        let read = match self.file.as_mut() {
            Some(file) => file.take(want).read_to_end(&mut buffer),
            None => Ok(0),
        };
        if let Err(error) = read {
            return Err((self.io_failure(&error), RetryCause::Other));
        }
        if buffer.is_empty() {
            // The file shrank under us: reopened, it fails its size check.
            let detail = format!(
                "response body ended early at offset {} of {} bytes",
                self.position, self.size
            );
            return Err((StoreFailure::Transient(detail), RetryCause::EndedEarly));
        }
        self.position += buffer.len() as u64;
        self.piece = (self.piece * 4).min(COALESCE_BYTES);
        Ok(Bytes::from(buffer))
    }
}

impl ByteSource for LocalFileSource {
    fn is_immediate(&self) -> bool {
        true
    }

    fn next_chunk(&mut self) -> NativeResult<Option<Bytes>> {
        loop {
            if self.position >= self.size {
                return Ok(None);
            }
            let (failure, cause) = match self.read_piece() {
                Ok(chunk) => {
                    self.budget.progress();
                    if let Some(counters) = &self.counters {
                        counters.bytes_received(chunk.len());
                    }
                    return Ok(Some(chunk));
                }
                Err(failed) => failed,
            };
            let detail = match failure {
                StoreFailure::Fatal(error) => return Err(error),
                StoreFailure::Transient(detail) => detail,
            };
            self.file = None;
            let elapsed = self.budget.elapsed_without_progress();
            let Some(delay) = self.budget.next_delay() else {
                return Err(NativeError::RetryExhausted {
                    operation: "GET",
                    uri: self.uri.clone(),
                    position: format!(" at offset {} of {} bytes", self.position, self.size),
                    attempts: self.budget.failed_attempts(),
                    elapsed_s: self.budget.elapsed().as_secs_f64(),
                    last_error: first_line(&detail).to_string(),
                });
            };
            warnings::warn(&retry_message(
                "GET",
                &self.uri,
                self.budget.failed_attempts(),
                elapsed,
                delay,
                &format!("at offset {}: {detail}", self.position),
            ));
            if let Some(counters) = &self.counters {
                counters.retried(cause);
            }
            std::thread::sleep(delay);
        }
    }
}
