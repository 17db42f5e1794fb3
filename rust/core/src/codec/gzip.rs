//! Gzip (RFC 1952) framing over raw deflate from real zlib: a streaming reader of concatenated
//! members and a writer whose bytes match Python's `gzip.GzipFile(mtime=0, filename="")`.
//!
//! We parse headers and trailers ourselves so a truncated stream, a corrupt one and trailing
//! non-gzip bytes get distinct reasons.

use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};

use super::chunks::ChunkReader;
use super::raw_inflate::RawInflate;
use super::DecodeFailure;
use crate::source::ByteSource;

pub const TRUNCATED: &str = "truncated gzip stream";
pub const CORRUPT: &str = "corrupt gzip stream";
pub const TRAILING: &str = "trailing bytes after gzip stream";

const MAGIC: [u8; 2] = [0x1f, 0x8b];
const FHCRC: u8 = 0x02;
const FEXTRA: u8 = 0x04;
const FNAME: u8 = 0x08;
const FCOMMENT: u8 = 0x10;
const RESERVED_FLAGS: u8 = 0xe0;

/// Python's `GzipFile` header for level 6, mtime 0 and no file name: XFL 0, OS 255 (unknown).
/// `gzip.compress(mtime=0)` differs only in the OS byte, which zlib sets per platform.
pub const HEADER: [u8; 10] = [0x1f, 0x8b, 0x08, 0x00, 0, 0, 0, 0, 0x00, 0xff];

#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    /// Before the first member: an empty object is truncated, not a clean end.
    Start,
    Body,
    /// After a member's trailer: the end of the object, or another member.
    Between,
    End,
}

/// Where a read enters a gzip stream other than at its start (an access point of the shard's
/// index, `gzip_points`): the source then starts at the entry's byte.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GzipEntry {
    /// The entry is a member's first byte (its header), not a deflate block boundary.
    pub member_start: bool,
    /// Bits of the source's first byte that belong to the stream (0: it starts on a byte).
    pub unused_bits: u8,
    /// The (at most 32 KiB of) output before the entry point.
    pub window: Vec<u8>,
    /// Output bytes from the entry point to the first line that starts at or after it.
    pub skip: u64,
    /// Records (lines holding a JSON object) before that line.
    pub first_record: u64,
    /// Lines (blank ones too) before that line.
    pub first_line: u64,
}

/// Decompresses a gzip stream pulled from a byte source.
pub struct Gunzip {
    reader: ChunkReader,
    inflate: Decompress,
    /// The member entered mid-stream, decoded by zlib directly: its CRC-32 and size cannot be
    /// checked (the output before the entry point is not read).
    entered: Option<RawInflate>,
    /// An entry point not yet started (unused bits, window): started by the first read.
    pending_entry: Option<(u8, Vec<u8>)>,
    crc: crc32fast::Hasher,
    size: u32,
    state: State,
}

impl Gunzip {
    pub fn new(source: Box<dyn ByteSource>) -> Self {
        Self {
            reader: ChunkReader::new(source),
            inflate: Decompress::new(false),
            entered: None,
            pending_entry: None,
            crc: crc32fast::Hasher::new(),
            size: 0,
            state: State::Start,
        }
    }

    /// Reads the source as starting at `entry`'s byte of a gzip stream (before any read).
    pub fn enter_at(&mut self, entry: &GzipEntry) {
        if !entry.member_start {
            self.pending_entry = Some((entry.unused_bits, entry.window.clone()));
            self.state = State::Body;
        }
    }

    /// Starts the member entered mid-stream (its first byte may hold primed bits).
    fn enter(&mut self, unused_bits: u8, window: &[u8]) -> Result<(), DecodeFailure> {
        let mut raw = RawInflate::new().map_err(DecodeFailure::shard)?;
        if unused_bits > 0 {
            let first = self.reader.read_exact(1)?;
            let &[byte] = &first[..] else {
                return Err(DecodeFailure::shard(TRUNCATED));
            };
            raw.prime(unused_bits, byte).map_err(DecodeFailure::shard)?;
        }
        raw.set_window(window).map_err(DecodeFailure::shard)?;
        self.entered = Some(raw);
        Ok(())
    }

    /// Appends up to `max` decompressed bytes to `out`; `false` once the stream has ended.
    pub fn read_into(&mut self, out: &mut Vec<u8>, max: usize) -> Result<bool, DecodeFailure> {
        if let Some((unused_bits, window)) = self.pending_entry.take() {
            self.enter(unused_bits, &window)?;
        }
        loop {
            match self.state {
                State::End => return Ok(false),
                State::Start | State::Between => {
                    if !self.reader.fill()? {
                        if self.state == State::Start {
                            return Err(DecodeFailure::shard(TRUNCATED));
                        }
                        self.state = State::End;
                        return Ok(false);
                    }
                    self.read_header()?;
                    self.state = State::Body;
                }
                State::Body => {
                    if self.inflate_some(out, max)? {
                        return Ok(true);
                    }
                }
            }
        }
    }

    /// One inflate step; `true` when it produced output.
    fn inflate_some(&mut self, out: &mut Vec<u8>, max: usize) -> Result<bool, DecodeFailure> {
        if !self.reader.fill()? {
            return Err(DecodeFailure::shard(TRUNCATED));
        }
        // `max` is a soft bound: zlib fills whatever spare capacity the buffer has.
        out.reserve(max.max(1));
        if let Some(raw) = self.entered.as_mut() {
            let step = raw
                .inflate(self.reader.buffered(), out, false)
                .map_err(DecodeFailure::shard)?;
            self.reader.consume(step.consumed);
            if step.stream_end {
                self.finish_entered_member()?;
            } else if step.consumed == 0 && step.produced == 0 {
                return Err(DecodeFailure::shard(CORRUPT));
            }
            return Ok(step.produced > 0);
        }
        let start = out.len();
        let (in_before, out_before) = (self.inflate.total_in(), self.inflate.total_out());
        let status =
            self.inflate
                .decompress_vec(self.reader.buffered(), out, FlushDecompress::None);
        let status = status.map_err(|_| DecodeFailure::shard(CORRUPT))?;
        let consumed = (self.inflate.total_in() - in_before) as usize;
        let produced = (self.inflate.total_out() - out_before) as usize;
        self.reader.consume(consumed);
        self.crc.update(&out[start..]);
        self.size = self.size.wrapping_add(produced as u32);
        match status {
            Status::StreamEnd => self.finish_member()?,
            _ if consumed == 0 && produced == 0 => return Err(DecodeFailure::shard(CORRUPT)),
            _ => {}
        }
        Ok(produced > 0)
    }

    /// The end of the member entered mid-stream: its trailer is read, not checked.
    fn finish_entered_member(&mut self) -> Result<(), DecodeFailure> {
        if self.reader.read_exact(8)?.len() < 8 {
            return Err(DecodeFailure::shard(TRUNCATED));
        }
        self.entered = None;
        self.state = State::Between;
        Ok(())
    }

    fn finish_member(&mut self) -> Result<(), DecodeFailure> {
        let trailer = self.reader.read_exact(8)?;
        if trailer.len() < 8 {
            return Err(DecodeFailure::shard(TRUNCATED));
        }
        let crc = u32::from_le_bytes([trailer[0], trailer[1], trailer[2], trailer[3]]);
        let size = u32::from_le_bytes([trailer[4], trailer[5], trailer[6], trailer[7]]);
        let actual = std::mem::take(&mut self.crc).finalize();
        if crc != actual || size != self.size {
            return Err(DecodeFailure::shard(CORRUPT));
        }
        self.size = 0;
        self.inflate.reset(false);
        self.state = State::Between;
        Ok(())
    }

    fn read_header(&mut self) -> Result<(), DecodeFailure> {
        let fixed = self.reader.read_exact(10)?;
        let magic_len = fixed.len().min(2);
        if fixed[..magic_len] != MAGIC[..magic_len] {
            return Err(DecodeFailure::shard(if self.state == State::Start {
                CORRUPT
            } else {
                TRAILING
            }));
        }
        if fixed.len() < 10 {
            return Err(DecodeFailure::shard(TRUNCATED));
        }
        let flags = fixed[3];
        if fixed[2] != 8 || flags & RESERVED_FLAGS != 0 {
            return Err(DecodeFailure::shard(CORRUPT));
        }
        let mut header_crc = crc32fast::Hasher::new();
        header_crc.update(&fixed);
        if flags & FEXTRA != 0 {
            let len = self.header_bytes(2, &mut header_crc)?;
            let len = u16::from_le_bytes([len[0], len[1]]) as usize;
            self.header_bytes(len, &mut header_crc)?;
        }
        for flag in [FNAME, FCOMMENT] {
            if flags & flag != 0 {
                self.skip_zero_terminated(&mut header_crc)?;
            }
        }
        if flags & FHCRC != 0 {
            let expected = header_crc.finalize() as u16;
            let stored = self.header_bytes(2, &mut crc32fast::Hasher::new())?;
            if u16::from_le_bytes([stored[0], stored[1]]) != expected {
                return Err(DecodeFailure::shard(CORRUPT));
            }
        }
        Ok(())
    }

    fn header_bytes(
        &mut self,
        n: usize,
        crc: &mut crc32fast::Hasher,
    ) -> Result<bytes::Bytes, DecodeFailure> {
        let bytes = self.reader.read_exact(n)?;
        if bytes.len() < n {
            return Err(DecodeFailure::shard(TRUNCATED));
        }
        crc.update(&bytes);
        Ok(bytes)
    }

    fn skip_zero_terminated(&mut self, crc: &mut crc32fast::Hasher) -> Result<(), DecodeFailure> {
        loop {
            if !self.reader.fill()? {
                return Err(DecodeFailure::shard(TRUNCATED));
            }
            let buffered = self.reader.buffered();
            let (take, done) = match memchr::memchr(0, buffered) {
                Some(i) => (i + 1, true),
                None => (buffered.len(), false),
            };
            crc.update(&buffered[..take]);
            self.reader.consume(take);
            if done {
                return Ok(());
            }
        }
    }
}

/// Streams one gzip member: level 6 raw deflate from zlib, then CRC-32 and size.
pub struct GzipWriter {
    deflate: Compress,
    crc: crc32fast::Hasher,
    size: u32,
    started: bool,
}

impl Default for GzipWriter {
    fn default() -> Self {
        Self::new()
    }
}

impl GzipWriter {
    pub fn new() -> Self {
        Self {
            deflate: Compress::new(Compression::new(6), false),
            crc: crc32fast::Hasher::new(),
            size: 0,
            started: false,
        }
    }

    fn start(&mut self, out: &mut Vec<u8>) {
        if !self.started {
            out.extend_from_slice(&HEADER);
            self.started = true;
        }
    }

    /// Compresses `data`, appending whatever output zlib releases to `out`.
    pub fn write(&mut self, data: &[u8], out: &mut Vec<u8>) -> Result<(), String> {
        self.start(out);
        self.crc.update(data);
        self.size = self.size.wrapping_add(data.len() as u32);
        let mut rest = data;
        while !rest.is_empty() {
            out.reserve(rest.len() / 2 + 1024);
            let before = self.deflate.total_in();
            self.deflate
                .compress_vec(rest, out, FlushCompress::None)
                .map_err(|e| format!("gzip compression failed: {e}"))?;
            rest = &rest[(self.deflate.total_in() - before) as usize..];
        }
        Ok(())
    }

    /// Ends the member; the writer must not be used afterwards.
    pub fn finish(&mut self, out: &mut Vec<u8>) -> Result<(), String> {
        self.start(out);
        loop {
            out.reserve(64 * 1024);
            let status = self
                .deflate
                .compress_vec(&[], out, FlushCompress::Finish)
                .map_err(|e| format!("gzip compression failed: {e}"))?;
            if status == Status::StreamEnd {
                break;
            }
        }
        let crc = std::mem::take(&mut self.crc).finalize();
        out.extend_from_slice(&crc.to_le_bytes());
        out.extend_from_slice(&self.size.to_le_bytes());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::MemorySource;
    use bytes::Bytes;

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut w = GzipWriter::new();
        w.write(data, &mut out).unwrap();
        w.finish(&mut out).unwrap();
        out
    }

    fn gunzip(data: &[u8], chunk: usize) -> Result<Vec<u8>, String> {
        let chunks: Vec<Bytes> = data
            .chunks(chunk.max(1))
            .map(Bytes::copy_from_slice)
            .collect();
        let mut g = Gunzip::new(Box::new(MemorySource::new(chunks)));
        let mut out = Vec::new();
        loop {
            match g.read_into(&mut out, 7) {
                Ok(true) => {}
                Ok(false) => return Ok(out),
                Err(DecodeFailure::Shard(r)) => return Err(r),
                Err(DecodeFailure::Source(e)) => return Err(e.to_string()),
            }
        }
    }

    #[test]
    fn round_trips_concatenated_members() {
        let mut data = gzip(b"hello\n");
        data.extend(gzip(b""));
        data.extend(gzip(b"world\n"));
        for chunk in [1, 5, 10, 4096] {
            assert_eq!(gunzip(&data, chunk).unwrap(), b"hello\nworld\n");
        }
    }

    #[test]
    fn reads_optional_header_fields() {
        let mut encoder = flate2::GzBuilder::new()
            .filename("f.jsonl")
            .comment("c")
            .extra(vec![1, 2, 3])
            .write(Vec::new(), flate2::Compression::new(6));
        std::io::Write::write_all(&mut encoder, b"abc").unwrap();
        let data = encoder.finish().unwrap();
        assert_eq!(gunzip(&data, 3).unwrap(), b"abc");
    }

    #[test]
    fn distinguishes_truncated_corrupt_and_trailing() {
        let data = gzip(b"some text that compresses\n");
        assert_eq!(gunzip(&[], 4), Err(TRUNCATED.into()));
        for cut in [1, 5, 12, data.len() - 1] {
            assert_eq!(gunzip(&data[..cut], 4), Err(TRUNCATED.into()), "cut {cut}");
        }
        let mut bad_crc = data.clone();
        let n = bad_crc.len();
        bad_crc[n - 6] ^= 1;
        assert_eq!(gunzip(&bad_crc, 4), Err(CORRUPT.into()));
        assert_eq!(gunzip(b"not gzip at all", 4), Err(CORRUPT.into()));
        let mut trailing = data.clone();
        trailing.extend_from_slice(b"\n");
        assert_eq!(gunzip(&trailing, 4), Err(TRAILING.into()));
        let mut zeros = data.clone();
        zeros.extend_from_slice(&[0, 0]);
        assert_eq!(gunzip(&zeros, 4), Err(TRAILING.into()));
    }
}
