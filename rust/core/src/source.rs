//! The byte source a shard decoder pulls from: a resumable object stream, or bytes in memory.

use bytes::Bytes;

use crate::error::NativeResult;

/// A blocking producer of an object's bytes, in order. Called without the GIL held.
pub trait ByteSource: Send {
    /// The next chunk, or `None` once the object has been read to its end.
    fn next_chunk(&mut self) -> NativeResult<Option<Bytes>>;

    /// Its chunks come from memory or a local file, never from a wait on the network: a
    /// decoder may then read its first chunk in the calling thread.
    fn is_immediate(&self) -> bool {
        false
    }
}

/// Chunks held in memory (tests, benchmarks, encoders' round trips).
pub struct MemorySource {
    chunks: std::collections::VecDeque<Bytes>,
}

impl MemorySource {
    pub fn new(chunks: impl IntoIterator<Item = Bytes>) -> Self {
        Self {
            chunks: chunks.into_iter().collect(),
        }
    }
}

impl ByteSource for MemorySource {
    fn next_chunk(&mut self) -> NativeResult<Option<Bytes>> {
        Ok(self.chunks.pop_front())
    }

    fn is_immediate(&self) -> bool {
        true
    }
}
