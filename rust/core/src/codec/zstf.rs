//! msgpack.zstf framing: 8-byte big-endian length, one zstd frame, one MessagePack map.
//!
//! [`ZstfFrames`] is the pure-Rust core of the decoder: it yields validated payloads and runs on
//! the decoder thread (and under the fuzzer) without Python.

use zstd::zstd_safe::{self, DCtx, InBuffer, OutBuffer};

use super::chunks::ChunkReader;
use super::{
    count_mismatch, found_more, msgpack, DecodeFailure, RecordRange, MAX_FRAME_BYTES,
    MAX_PAYLOAD_BYTES,
};
use crate::source::ByteSource;

pub const INVALID_FRAME_LENGTH: &str = "invalid frame length";
pub const TRUNCATED_HEADER: &str = "truncated 8-byte frame header";
pub const TRUNCATED_FRAME: &str = "truncated compressed frame";
pub const INVALID_ZSTD_FRAME: &str = "invalid Zstandard frame";
pub const PAYLOAD_TOO_LARGE: &str = "payload too large";

/// The magic number of a regular (not skippable) Zstandard frame, little-endian.
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];

/// Reads the records of one shard (or of a range of it), never more than declared.
pub struct ZstfFrames {
    reader: ChunkReader,
    range: RecordRange,
    /// The object's size when known: a length header reaching past it is a truncated frame
    /// at once, before its bytes are read or skipped.
    object_size: Option<u64>,
    /// Records passed so far, skipped ones included: the index of the next record.
    frames: u64,
    /// Taken from the process's spare contexts and given back on drop: a new context costs
    /// more than decompressing a small shard's first record.
    dctx: Option<DCtx<'static>>,
    payload_limit: u64,
    /// The frame being decompressed; reused, so steady-state records allocate nothing.
    scratch: Vec<u8>,
    validator: msgpack::StreamValidator,
}

impl Drop for ZstfFrames {
    fn drop(&mut self) {
        if let Some(dctx) = self.dctx.take() {
            spare_contexts::give_back(dctx);
        }
    }
}

/// Decompression contexts of finished readers, reused by the next ones.
mod spare_contexts {
    use std::sync::Mutex;

    use zstd::zstd_safe::{self, DCtx};

    use crate::runtime::fork_guard;

    /// Enough for the shards a process reads at once; more are freed.
    const KEPT: usize = 16;

    static SPARE: Mutex<Vec<DCtx<'static>>> = Mutex::new(Vec::new());

    pub fn take() -> DCtx<'static> {
        let spare = {
            let _no_fork = fork_guard();
            SPARE.lock().unwrap_or_else(|p| p.into_inner()).pop()
        };
        spare.unwrap_or_else(DCtx::create)
    }

    /// Keeps `dctx` (its session reset) for the next reader, unless enough are kept.
    pub fn give_back(mut dctx: DCtx<'static>) {
        if dctx.reset(zstd_safe::ResetDirective::SessionOnly).is_err() {
            return;
        }
        let _no_fork = fork_guard();
        let mut spare = SPARE.lock().unwrap_or_else(|p| p.into_inner());
        if spare.len() < KEPT {
            spare.push(dctx);
        }
    }
}

/// A scratch buffer grown past this by a large record is freed rather than kept.
const MAX_KEPT_SCRATCH: usize = 8 << 20;

impl ZstfFrames {
    pub fn new(source: Box<dyn ByteSource>, declared: u64) -> Self {
        Self::with_range(source, RecordRange::full(declared))
    }

    /// Reads the records of `range` only: earlier frames are hopped by their length headers
    /// without being decompressed, and reading stops after the range.
    pub fn with_range(source: Box<dyn ByteSource>, range: RecordRange) -> Self {
        Self {
            reader: ChunkReader::new(source),
            range,
            object_size: None,
            frames: 0,
            dctx: Some(spare_contexts::take()),
            payload_limit: MAX_PAYLOAD_BYTES,
            scratch: Vec::new(),
            validator: msgpack::StreamValidator::default(),
        }
    }

    /// The object holds exactly `size` bytes (the manifest's `size_bytes`, which the stream
    /// enforces).
    pub fn with_object_size(mut self, size: u64) -> Self {
        self.object_size = Some(size);
        self
    }

    /// Lowers the payload limit, so tests can reach it with small inputs.
    pub fn with_payload_limit(mut self, limit: u64) -> Self {
        self.payload_limit = limit.min(MAX_PAYLOAD_BYTES);
        self
    }

    /// Records passed so far (skipped ones included).
    pub fn frames(&self) -> u64 {
        self.frames
    }

    /// The next record's validated MessagePack payload; `None` at the end of the object.
    pub fn next_payload(&mut self) -> Result<Option<Vec<u8>>, DecodeFailure> {
        let mut payload = Vec::new();
        Ok(self.append_payload(&mut payload)?.then_some(payload))
    }

    /// Appends the next record's validated payload to `out` (so a batch of records shares one
    /// buffer); `false` at the end of the object (or of the range). On an error `out` is left
    /// as it was.
    pub fn append_payload(&mut self, out: &mut Vec<u8>) -> Result<bool, DecodeFailure> {
        while self.frames < self.range.start {
            let len = self.frame_header()?.ok_or_else(|| self.ended_early())?;
            if self.reader.skip(len)? < len {
                return Err(DecodeFailure::shard(TRUNCATED_FRAME));
            }
            self.frames += 1;
        }
        if self.frames == self.range.stop && !self.range.reaches_end() {
            return Ok(false);
        }
        let Some(len) = self.frame_header()? else {
            // A full read leaves the count check to the reader, which counts built records.
            if !self.range.is_full() && self.frames < self.range.stop {
                return Err(self.ended_early());
            }
            return Ok(false);
        };
        let frame = self.reader.read_exact(len)?;
        if frame.len() < len {
            return Err(DecodeFailure::shard(TRUNCATED_FRAME));
        }
        let (scratch, validator) = (&mut self.scratch, &mut self.validator);
        validator.reset();
        // Validated as it is decompressed: a payload that goes wrong early (a 1 GiB bomb of
        // nested arrays) is refused after its first bytes, not after it is all held.
        decompress_frame(
            self.dctx.get_or_insert_with(DCtx::create),
            &frame,
            self.payload_limit,
            scratch,
            |so_far, limit| validator.feed(so_far, limit),
        )?;
        validator.finish(scratch).map_err(DecodeFailure::shard)?;
        out.extend_from_slice(scratch);
        if scratch.capacity() > MAX_KEPT_SCRATCH {
            *scratch = Vec::new();
        }
        self.frames += 1;
        Ok(true)
    }

    /// Reads the next 8-byte length header; `None` at the end of the object. The length is
    /// checked (0 < L <= 256 MiB) before anything is read or skipped.
    fn frame_header(&mut self) -> Result<Option<usize>, DecodeFailure> {
        let header = self.reader.read_exact(8)?;
        if header.is_empty() {
            return Ok(None);
        }
        let header: [u8; 8] = header[..]
            .try_into()
            .map_err(|_| DecodeFailure::shard(TRUNCATED_HEADER))?;
        let len = u64::from_be_bytes(header);
        if len == 0 || len > MAX_FRAME_BYTES {
            return Err(DecodeFailure::shard(INVALID_FRAME_LENGTH));
        }
        // A well-formed header after the last declared record: stop before reading its frame.
        if self.frames == self.range.declared {
            return Err(DecodeFailure::shard(found_more(self.range.declared)));
        }
        if self
            .object_size
            .is_some_and(|size| self.reader.position().saturating_add(len) > size)
        {
            return Err(DecodeFailure::shard(TRUNCATED_FRAME));
        }
        usize::try_from(len)
            .map(Some)
            .map_err(|_| DecodeFailure::shard(INVALID_FRAME_LENGTH))
    }

    /// The object ended before the range did.
    fn ended_early(&self) -> DecodeFailure {
        DecodeFailure::shard(count_mismatch(self.range.declared, self.frames))
    }
}

/// Decompresses exactly one complete frame filling `frame`, to at most `limit` bytes, into
/// `out` (cleared first; its capacity is reused). After each step `check` sees the output so
/// far and the most it may grow to, and may stop the decompression with a reason
/// ([`msgpack::BEYOND_LIMIT`]: the payload would outgrow its limit).
fn decompress_frame(
    dctx: &mut DCtx<'_>,
    frame: &[u8],
    limit: u64,
    out: &mut Vec<u8>,
    mut check: impl FnMut(&[u8], usize) -> Result<(), &'static str>,
) -> Result<(), DecodeFailure> {
    let invalid = || DecodeFailure::shard(INVALID_ZSTD_FRAME);
    if frame.get(..4) != Some(&ZSTD_MAGIC[..]) {
        return Err(invalid());
    }
    match zstd_safe::find_frame_compressed_size(frame) {
        Ok(size) if size == frame.len() => {}
        _ => return Err(invalid()),
    }
    let declared = zstd_safe::get_frame_content_size(frame).map_err(|_| invalid())?;
    if declared.is_some_and(|size| size > limit) {
        return Err(DecodeFailure::shard(PAYLOAD_TOO_LARGE));
    }
    let limit = usize::try_from(declared.unwrap_or(limit)).map_err(|_| invalid())?;
    out.clear();
    // One byte past the limit tells "exactly at the limit" from "over it" when no size is
    // declared. A small frame cannot expand to a huge declared size, so don't trust it up front.
    let initial = declared
        .map_or(frame.len().saturating_mul(4), |size| size as usize)
        .min(frame.len().saturating_mul(64).max(1 << 16))
        .min(limit)
        + 1;
    out.reserve_exact(initial);
    dctx.reset(zstd_safe::ResetDirective::SessionOnly)
        .map_err(|_| invalid())?;
    let mut input = InBuffer::around(frame);
    loop {
        let (written_before, read_before) = (out.len(), input.pos());
        let hint = {
            // Appends after what earlier rounds wrote; dropping the buffer sets `out.len()`.
            let mut output = OutBuffer::around_pos(&mut *out, written_before);
            dctx.decompress_stream(&mut output, &mut input)
                .map_err(|_| invalid())?
        };
        if out.len() > limit {
            return Err(if declared.is_some() {
                invalid()
            } else {
                DecodeFailure::shard(PAYLOAD_TOO_LARGE)
            });
        }
        if out.len() > written_before {
            check(out, limit).map_err(|reason| match reason {
                // Past a declared size the payload cannot be what it claims; past the cap it
                // is too large.
                msgpack::BEYOND_LIMIT if declared.is_some() => {
                    DecodeFailure::shard(msgpack::INVALID_PAYLOAD)
                }
                msgpack::BEYOND_LIMIT => DecodeFailure::shard(PAYLOAD_TOO_LARGE),
                reason => DecodeFailure::shard(reason),
            })?;
        }
        if hint == 0 {
            break;
        }
        if out.len() == out.capacity() {
            let grown = out.capacity().saturating_mul(2).min(limit + 1);
            out.reserve_exact(grown.saturating_sub(out.len()));
        } else if input.pos() == frame.len()
            || (out.len(), input.pos()) == (written_before, read_before)
        {
            // Room left but no progress possible: the frame was cut short.
            return Err(invalid());
        }
    }
    if input.pos() != frame.len() {
        return Err(invalid());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::MemorySource;
    use bytes::Bytes;

    fn record(payload: &[u8]) -> Vec<u8> {
        let frame = zstd::bulk::compress(payload, 3).unwrap();
        let mut out = (frame.len() as u64).to_be_bytes().to_vec();
        out.extend_from_slice(&frame);
        out
    }

    fn read_all(data: &[u8], declared: u64, chunk: usize) -> Result<Vec<Vec<u8>>, String> {
        let chunks: Vec<Bytes> = data
            .chunks(chunk.max(1))
            .map(Bytes::copy_from_slice)
            .collect();
        payloads(ZstfFrames::new(
            Box::new(MemorySource::new(chunks)),
            declared,
        ))
    }

    /// Every payload the frames give, or their error.
    fn payloads(mut frames: ZstfFrames) -> Result<Vec<Vec<u8>>, String> {
        let mut out = Vec::new();
        loop {
            match frames.next_payload() {
                Ok(Some(p)) => out.push(p),
                Ok(None) => return Ok(out),
                Err(DecodeFailure::Shard(reason)) => return Err(reason),
                Err(DecodeFailure::Source(err)) => return Err(err.to_string()),
            }
        }
    }

    const MAP: &[u8] = &[0x81, 0xa1, b'k', 0x01];

    #[test]
    fn reads_records_across_chunk_sizes() {
        let mut data = record(MAP);
        data.extend(record(&[0x80]));
        for chunk in [1, 3, 8, 9, 1000] {
            assert_eq!(
                read_all(&data, 2, chunk).unwrap(),
                vec![MAP.to_vec(), vec![0x80]]
            );
        }
    }

    #[test]
    fn distinguishes_framing_errors() {
        let good = record(MAP);
        assert_eq!(read_all(&good[..5], 1, 64), Err(TRUNCATED_HEADER.into()));
        assert_eq!(
            read_all(&good[..good.len() - 1], 1, 64),
            Err(TRUNCATED_FRAME.into())
        );
        assert_eq!(read_all(&[0; 8], 1, 64), Err(INVALID_FRAME_LENGTH.into()));
        let huge = (MAX_FRAME_BYTES + 1).to_be_bytes();
        assert_eq!(read_all(&huge, 1, 64), Err(INVALID_FRAME_LENGTH.into()));
        let mut garbage = 4u64.to_be_bytes().to_vec();
        garbage.extend_from_slice(b"abcd");
        assert_eq!(read_all(&garbage, 1, 64), Err(INVALID_ZSTD_FRAME.into()));
        // Two frames inside one length: trailing bytes inside L.
        let frame = zstd::bulk::compress(MAP, 3).unwrap();
        let mut two = ((frame.len() * 2) as u64).to_be_bytes().to_vec();
        two.extend_from_slice(&frame);
        two.extend_from_slice(&frame);
        assert_eq!(read_all(&two, 1, 64), Err(INVALID_ZSTD_FRAME.into()));
        assert_eq!(
            read_all(&record(&[0x90]), 1, 64),
            Err(msgpack::NOT_A_MAP.into())
        );
    }

    #[test]
    fn enforces_the_declared_count() {
        let mut data = record(MAP);
        data.extend(record(MAP));
        assert_eq!(read_all(&data, 1, 64), Err(found_more(1)));
        assert_eq!(read_all(&data, 3, 64).unwrap().len(), 2);
    }

    fn read_range(data: &[u8], range: RecordRange, chunk: usize) -> Result<Vec<Vec<u8>>, String> {
        let chunks: Vec<Bytes> = data.chunks(chunk).map(Bytes::copy_from_slice).collect();
        let source = MemorySource::new(chunks);
        payloads(
            ZstfFrames::with_range(Box::new(source), range).with_object_size(data.len() as u64),
        )
    }

    fn range(declared: u64, start: i64, stop: i64) -> RecordRange {
        RecordRange::new(declared, start, Some(stop)).unwrap()
    }

    /// Four records; the second holds a frame that is not even Zstandard.
    fn shard_with_garbage_second() -> Vec<u8> {
        let mut data = record(&[0x81, 0xa1, b'i', 0x00]);
        data.extend(8u64.to_be_bytes());
        data.extend(b"notzstd!");
        data.extend(record(&[0x81, 0xa1, b'i', 0x02]));
        data.extend(record(&[0x81, 0xa1, b'i', 0x03]));
        data
    }

    #[test]
    fn skips_frames_before_the_range_without_decompressing_them() {
        let data = shard_with_garbage_second();
        let third = vec![0x81, 0xa1, b'i', 0x02];
        let fourth = vec![0x81, 0xa1, b'i', 0x03];
        for chunk in [1, 5, 1000] {
            assert_eq!(
                read_range(&data, range(4, 2, 4), chunk).unwrap(),
                vec![third.clone(), fourth.clone()]
            );
            assert_eq!(
                read_range(&data, range(4, 2, 3), chunk).unwrap(),
                vec![third.clone()]
            );
            assert_eq!(
                read_range(&data, range(4, 4, 4), chunk).unwrap(),
                Vec::<Vec<u8>>::new()
            );
            assert_eq!(read_range(&data, range(4, 0, 1), chunk).unwrap().len(), 1);
        }
        // The whole shard does decompress the bad frame.
        assert_eq!(
            read_range(&data, RecordRange::full(4), 64),
            Err(INVALID_ZSTD_FRAME.into())
        );
    }

    #[test]
    fn stops_after_the_range_and_checks_the_end_only_when_it_reaches_it() {
        let mut data = record(MAP);
        data.extend(record(MAP));
        data.extend(b"trailing garbage");
        assert_eq!(read_range(&data, range(3, 0, 2), 64).unwrap().len(), 2);
        assert_eq!(read_range(&data, range(3, 1, 2), 64).unwrap().len(), 1);
        assert_eq!(
            read_range(&data, range(2, 1, 2), 64),
            Err(INVALID_FRAME_LENGTH.into())
        );
        let mut three = record(MAP);
        three.extend(record(MAP));
        three.extend(record(MAP));
        assert_eq!(read_range(&three, range(2, 1, 2), 64), Err(found_more(2)));
        assert_eq!(read_range(&three, range(2, 2, 2), 64), Err(found_more(2)));
    }

    #[test]
    fn a_shard_ending_before_the_range_is_a_count_error() {
        let mut data = record(MAP);
        data.extend(record(MAP));
        assert_eq!(
            read_range(&data, range(5, 3, 4), 64),
            Err(count_mismatch(5, 2))
        );
        assert_eq!(
            read_range(&data, range(5, 1, 4), 64),
            Err(count_mismatch(5, 2))
        );
        assert_eq!(
            read_range(&data, range(5, 0, 5), 64),
            Ok(vec![MAP.to_vec(); 2])
        );
        assert_eq!(
            read_range(&data, range(5, 1, 5), 64),
            Err(count_mismatch(5, 2))
        );
    }

    #[test]
    fn corrupt_length_headers_in_the_skipped_part_are_errors() {
        let good = record(MAP);
        let mut zero = vec![0u8; 8];
        zero.extend(&good);
        assert_eq!(
            read_range(&zero, range(2, 1, 2), 64),
            Err(INVALID_FRAME_LENGTH.into())
        );
        let mut huge = (MAX_FRAME_BYTES + 1).to_be_bytes().to_vec();
        huge.extend(&good);
        assert_eq!(
            read_range(&huge, range(2, 1, 2), 64),
            Err(INVALID_FRAME_LENGTH.into())
        );
        // A length reaching past the object fails before anything is skipped.
        let mut past = 1000u64.to_be_bytes().to_vec();
        past.extend(&good);
        assert_eq!(
            read_range(&past, range(2, 1, 2), 64),
            Err(TRUNCATED_FRAME.into())
        );
        assert_eq!(
            read_range(&good[..5], range(2, 1, 2), 64),
            Err(TRUNCATED_HEADER.into())
        );
    }

    #[test]
    fn caps_payload_with_and_without_declared_size() {
        let mut big = vec![0xc4, 0xff];
        big.extend(std::iter::repeat_n(0u8, 255));
        big.insert(0, 0x81);
        big.insert(1, 0xa1);
        big.insert(2, b'b');
        let mut frames =
            ZstfFrames::new(Box::new(MemorySource::new([Bytes::from(record(&big))])), 1)
                .with_payload_limit(100);
        assert!(
            matches!(frames.next_payload(), Err(DecodeFailure::Shard(r)) if r == PAYLOAD_TOO_LARGE)
        );

        // Streamed frame without a content size in its header.
        let mut enc = zstd::stream::Encoder::new(Vec::new(), 3).unwrap();
        enc.include_contentsize(false).unwrap();
        std::io::Write::write_all(&mut enc, &big).unwrap();
        let frame = enc.finish().unwrap();
        assert_eq!(zstd_safe::get_frame_content_size(&frame).unwrap(), None);
        let mut data = (frame.len() as u64).to_be_bytes().to_vec();
        data.extend_from_slice(&frame);
        let source = MemorySource::new([Bytes::from(data.clone())]);
        let mut frames = ZstfFrames::new(Box::new(source), 1).with_payload_limit(100);
        assert!(
            matches!(frames.next_payload(), Err(DecodeFailure::Shard(r)) if r == PAYLOAD_TOO_LARGE)
        );
        let source = MemorySource::new([Bytes::from(data)]);
        let mut frames = ZstfFrames::new(Box::new(source), 1).with_payload_limit(big.len() as u64);
        assert_eq!(frames.next_payload().unwrap(), Some(big));
    }
}
