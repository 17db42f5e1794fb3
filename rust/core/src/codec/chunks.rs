//! Reading exact byte counts across the chunk boundaries of a `ByteSource`.

use bytes::{Buf, Bytes};

use crate::error::NativeResult;
use crate::source::ByteSource;

/// Capacity reserved up front for a read that spans chunks; a lying length prefix must not
/// make us allocate 256 MiB before the bytes exist.
const SPANNING_READ_RESERVE: usize = 1 << 20;

/// Buffers the current chunk of a source and hands out exact-length pieces of the object.
pub struct ChunkReader {
    source: Box<dyn ByteSource>,
    chunk: Bytes,
    eof: bool,
    /// Bytes of the object consumed so far.
    position: u64,
}

impl ChunkReader {
    pub fn new(source: Box<dyn ByteSource>) -> Self {
        Self {
            source,
            chunk: Bytes::new(),
            eof: false,
            position: 0,
        }
    }

    /// Ensures at least one unread byte is buffered; `false` at the end of the object.
    pub fn fill(&mut self) -> NativeResult<bool> {
        while self.chunk.is_empty() {
            if self.eof {
                return Ok(false);
            }
            match self.source.next_chunk()? {
                Some(chunk) => self.chunk = chunk,
                None => self.eof = true,
            }
        }
        Ok(true)
    }

    /// The buffered, unread bytes of the current chunk (empty until `fill`).
    pub fn buffered(&self) -> &[u8] {
        &self.chunk
    }

    /// Marks `n` buffered bytes as read.
    pub fn consume(&mut self, n: usize) {
        let n = n.min(self.chunk.len());
        self.chunk.advance(n);
        self.position += n as u64;
    }

    /// Bytes of the object consumed so far.
    pub fn position(&self) -> u64 {
        self.position
    }

    /// Skips `n` bytes without copying them; returns how many were skipped (fewer only when
    /// the object ends first).
    pub fn skip(&mut self, n: usize) -> NativeResult<usize> {
        let mut skipped = 0;
        while skipped < n && self.fill()? {
            let take = (n - skipped).min(self.chunk.len());
            self.consume(take);
            skipped += take;
        }
        Ok(skipped)
    }

    /// Reads `n` bytes; fewer only when the object ends first. Zero-copy inside one chunk.
    pub fn read_exact(&mut self, n: usize) -> NativeResult<Bytes> {
        if n == 0 || !self.fill()? {
            return Ok(Bytes::new());
        }
        if self.chunk.len() >= n {
            self.position += n as u64;
            return Ok(self.chunk.split_to(n));
        }
        let mut out = Vec::with_capacity(n.min(SPANNING_READ_RESERVE));
        while out.len() < n && self.fill()? {
            let take = (n - out.len()).min(self.chunk.len());
            out.extend_from_slice(&self.chunk[..take]);
            self.consume(take);
        }
        Ok(Bytes::from(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::MemorySource;

    fn reader(chunks: &[&'static [u8]]) -> ChunkReader {
        let source = MemorySource::new(chunks.iter().map(|c| Bytes::from_static(c)));
        ChunkReader::new(Box::new(source))
    }

    #[test]
    fn reads_across_empty_and_split_chunks() {
        let mut r = reader(&[b"", b"ab", b"", b"cde", b"f"]);
        assert_eq!(&r.read_exact(3).unwrap()[..], b"abc");
        assert_eq!(&r.read_exact(2).unwrap()[..], b"de");
        assert_eq!(&r.read_exact(5).unwrap()[..], b"f");
        assert!(r.read_exact(1).unwrap().is_empty());
        assert!(!r.fill().unwrap());
    }

    #[test]
    fn skips_across_chunks_and_stops_at_the_end() {
        let mut r = reader(&[b"ab", b"", b"cde", b"f"]);
        assert_eq!(r.skip(0).unwrap(), 0);
        assert_eq!(r.skip(3).unwrap(), 3);
        assert_eq!(&r.read_exact(1).unwrap()[..], b"d");
        assert_eq!(r.position(), 4);
        assert_eq!(r.skip(10).unwrap(), 2);
        assert_eq!(r.position(), 6);
        assert_eq!(r.skip(1).unwrap(), 0);
    }
}
