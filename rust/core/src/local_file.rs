//! A shard on the local directory store: its first piece read straight into the decoder (no
//! runtime task, no channel, no thread hand-off before the first record), the rest through
//! the resumable stream, which reads ahead on the runtime while the decoder works.
//!
//! The local rules of SPEC section 4 hold for both parts: the size guards the read (the etag
//! of a local file is not enforced), a missing file or a directory is a missing object, and
//! other failures are sorted by their `io::ErrorKind` (`classify_local_io`). A transient
//! failure of the first read is left to the stream, which retries it under the budget.

use std::fs::File;
use std::io::{ErrorKind, Read, Seek, SeekFrom};
use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;

use crate::classify::{classify_local_io, StoreFailure};
use crate::counters::{self, Counters};
use crate::error::{NativeError, NativeResult};
use crate::source::ByteSource;
use crate::stream::{StoreFactory, StreamReader, StreamRequest, FIRST_FILE_READ};

/// The bytes of a local shard, as its decoder pulls them.
pub struct LocalShardSource {
    path: PathBuf,
    /// The whole read (`[start, end)`: all of the file, or a segment of it); the stream takes
    /// it over after the first piece.
    request: StreamRequest,
    factory: StoreFactory,
    /// The first piece was read (or left to the stream).
    started: bool,
    rest: Option<StreamReader>,
    counters: Option<Arc<Counters>>,
}

impl LocalShardSource {
    /// Nothing is opened yet (that happens in the decoder); the stream counters entered on the
    /// calling thread count it.
    pub fn new(path: PathBuf, request: StreamRequest, factory: StoreFactory) -> Self {
        let counters = counters::entered();
        if let Some(counters) = &counters {
            counters.stream_opened();
        }
        Self {
            path,
            request,
            factory,
            started: false,
            rest: None,
            counters,
        }
    }

    fn data_error(&self, reason: String) -> NativeError {
        let uri = self.request.uri.clone();
        match self.request.format {
            Some(format) => NativeError::Shard {
                format,
                uri,
                reason,
            },
            None => NativeError::InvalidData { uri, reason },
        }
    }

    fn io_failure(&self, error: &std::io::Error) -> StoreFailure {
        match error.kind() {
            ErrorKind::NotFound => StoreFailure::Fatal(NativeError::NotFound {
                uri: self.request.uri.clone(),
            }),
            _ => classify_local_io(&self.request.uri, error),
        }
    }

    /// Opens the file, checks that it has the declared size, and reads the first piece of
    /// `[start, end)`.
    fn first_piece(&self) -> Result<Bytes, StoreFailure> {
        let mut file = File::open(&self.path).map_err(|e| self.io_failure(&e))?;
        let meta = file.metadata().map_err(|e| self.io_failure(&e))?;
        if meta.is_dir() {
            return Err(StoreFailure::Fatal(NativeError::NotFound {
                uri: self.request.uri.clone(),
            }));
        }
        let size = self.request.size;
        if meta.len() != size {
            return Err(StoreFailure::Fatal(self.data_error(format!(
                "size mismatch: the object has {} bytes but size_bytes is {size}",
                meta.len()
            ))));
        }
        let (start, end) = (self.request.start, self.request.end);
        let want = (end - start).min(FIRST_FILE_READ as u64);
        if start > 0 {
            file.seek(SeekFrom::Start(start))
                .map_err(|e| self.io_failure(&e))?;
        }
        // Read into spare capacity: no zeroing of a buffer about to be filled.
        let mut piece = Vec::with_capacity(want as usize);
        file.take(want)
            .read_to_end(&mut piece)
            .map_err(|e| self.io_failure(&e))?;
        Ok(Bytes::from(piece))
    }

    /// Hands the read from `start` on to the resumable stream.
    fn continue_from(&mut self, start: u64) -> NativeResult<()> {
        let mut request = self.request.clone();
        request.start = start;
        let factory = self.factory.clone();
        let counters = self.counters.clone();
        self.rest = Some(StreamReader::continue_counted(request, factory, counters)?);
        Ok(())
    }
}

impl ByteSource for LocalShardSource {
    fn is_immediate(&self) -> bool {
        true
    }

    fn next_chunk(&mut self) -> NativeResult<Option<Bytes>> {
        if let Some(rest) = self.rest.as_mut() {
            return rest.next_chunk();
        }
        if self.started || self.request.start >= self.request.end {
            return Ok(None);
        }
        self.started = true;
        let piece = match self.first_piece() {
            Ok(piece) => piece,
            Err(StoreFailure::Fatal(error)) => return Err(error),
            // The stream retries it, from the start.
            Err(StoreFailure::Transient(_)) => {
                self.continue_from(self.request.start)?;
                return self.next_chunk();
            }
        };
        if let Some(counters) = &self.counters {
            counters.bytes_received(piece.len());
        }
        let read_to = self.request.start + piece.len() as u64;
        // A short first read (the file shrank after its size check) is the stream's to find.
        if read_to < self.request.end {
            self.continue_from(read_to)?;
        }
        if piece.is_empty() {
            return self.next_chunk();
        }
        Ok(Some(piece))
    }
}
