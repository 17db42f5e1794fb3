//! The access points of a jsonl.gz shard: for each step of `step` records inside each block of
//! `block` records (the unit the seeded order permutes), where a read can enter the gzip
//! stream with one ranged GET.
//!
//! A deflate stream can be entered at a block boundary given the bit offset and the 32 KiB of
//! output before it (zlib's zran.c). A step's entry is the last deflate boundary (or member
//! start) at or before the line of its first record: a read there skips the rest of a line
//! and a few records (less than one deflate block of text). Its end is the first boundary
//! after the line of the step's last record, so a read of whole steps fetches about their own
//! bytes. Steps restart at every block, so every block starts at an entry.
//!
//! [`AccessPoints`] is fed the shard's bytes in chunks of any size (one streaming pass: the
//! saver's spool, or `syvain-data index`), checks the whole stream (every member's CRC-32 and
//! size, UTF-8, line sizes) and counts records exactly as the reader does. Its memory is the
//! line being read plus about 32 KiB, never the shard.

use std::collections::VecDeque;

use super::columnar::is_json_record;
use super::gzip::{CORRUPT, TRAILING, TRUNCATED};
use super::lines::is_blank;
use super::raw_inflate::RawInflate;
use super::{DecodeFailure, MAX_LINE_BYTES};

/// The output an entry point keeps (deflate's window).
pub const WINDOW_BYTES: usize = 32 << 10;
/// The most output between a block's line and the last deflate boundary before it: a stream
/// whose deflate blocks are longer is not indexed (its reads would fetch that much before
/// their first record, and the builder would hold it).
pub const MAX_ENTRY_GAP: u64 = 64 << 20;
/// A gzip header (with its name, comment and extra field) may take this many bytes.
const MAX_HEADER_BYTES: usize = 1 << 20;
const READ_BYTES: usize = 256 << 10;

/// Where a read of one step enters the stream and where it may stop.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BlockEntry {
    /// The entry point, in bits from the shard's start (a member start is on a byte).
    pub start_bit: u64,
    pub member_start: bool,
    /// Output bytes from the entry point to the first line starting at or after it.
    pub skip: u64,
    /// Records before that line.
    pub first_record: u64,
    /// Lines (blank ones too) before that line.
    pub first_line: u64,
    /// The byte by which the step's last record (its "\n" too) can be decoded.
    pub end_byte: u64,
    /// The output before the entry point (at most [`WINDOW_BYTES`]; empty at a member start).
    pub window: Vec<u8>,
}

#[derive(Clone, Copy, Debug)]
struct Candidate {
    bit: u64,
    member_start: bool,
    /// Output offset of the point.
    out: u64,
    /// (skip, records, lines) at the first line start at or after `out`, once known.
    line: Option<(u64, u64, u64)>,
}

enum Member {
    /// Gathering a header's bytes (or, between members, the next one's).
    Header {
        between: bool,
    },
    Body,
    Trailer,
}

/// Builds the [`BlockEntry`]s of a jsonl.gz stream fed in chunks.
pub struct AccessPoints {
    block: u64,
    step: u64,
    member: Member,
    /// Header or trailer bytes gathered so far.
    pending: Vec<u8>,
    inflate: RawInflate,
    crc: crc32fast::Hasher,
    member_size: u32,
    members: u64,
    /// Compressed bytes taken so far.
    in_pos: u64,
    /// Output kept from absolute offset `text_base` on (the current line, and the window of
    /// the entry point a block starting at this line would use).
    text: Vec<u8>,
    text_base: u64,
    out_total: u64,
    member_out_start: u64,
    line_start: u64,
    lines: u64,
    records: u64,
    latest: Option<Candidate>,
    /// The latest candidate at or before `line_start`.
    line_candidate: Option<Candidate>,
    /// Entries waiting for the boundary after their last record (output offset it needs).
    open: VecDeque<(BlockEntry, u64)>,
    /// The entry of the current step, until its last record is read.
    current: Option<BlockEntry>,
    done: VecDeque<BlockEntry>,
}

impl AccessPoints {
    /// Entries every `step` records of each block of `block` records (both at least 1;
    /// `step` at most `block`).
    pub fn new(block: u64, step: u64) -> Result<Self, String> {
        let block = block.max(1);
        let mut points = Self {
            block,
            step: step.clamp(1, block),
            member: Member::Header { between: false },
            pending: Vec::new(),
            inflate: RawInflate::new()?,
            crc: crc32fast::Hasher::new(),
            member_size: 0,
            members: 0,
            in_pos: 0,
            text: Vec::new(),
            text_base: 0,
            out_total: 0,
            member_out_start: 0,
            line_start: 0,
            lines: 0,
            records: 0,
            latest: None,
            line_candidate: None,
            open: VecDeque::new(),
            current: None,
            done: VecDeque::new(),
        };
        points.current = Some(BlockEntry {
            member_start: true,
            ..BlockEntry::default()
        });
        Ok(points)
    }

    /// Records counted so far.
    pub fn records(&self) -> u64 {
        self.records
    }

    /// The entries whose steps are complete, in order.
    pub fn take_entries(&mut self) -> Vec<BlockEntry> {
        self.done.drain(..).collect()
    }

    /// Takes the next bytes of the shard.
    pub fn feed(&mut self, mut chunk: &[u8]) -> Result<(), DecodeFailure> {
        while !chunk.is_empty() {
            let taken = match self.member {
                Member::Header { between } => self.header(chunk, between)?,
                Member::Body => self.body(chunk)?,
                Member::Trailer => self.trailer(chunk)?,
            };
            chunk = &chunk[taken..];
            self.in_pos += taken as u64;
        }
        Ok(())
    }

    /// The end of the shard: every entry is complete once this returns.
    pub fn finish(&mut self) -> Result<(), DecodeFailure> {
        match self.member {
            Member::Header { between: true } if self.pending.is_empty() => {}
            _ => return Err(DecodeFailure::shard(TRUNCATED)),
        }
        if self.out_total > self.line_start {
            let end = self.out_total;
            self.line(end, end)?;
        }
        if let Some(entry) = self.current.take() {
            self.open.push_back((entry, self.out_total));
        }
        let end = self.in_pos;
        self.done.extend(self.open.drain(..).map(|(mut e, _)| {
            e.end_byte = end;
            e
        }));
        Ok(())
    }

    fn header(&mut self, chunk: &[u8], between: bool) -> Result<usize, DecodeFailure> {
        if self.pending.is_empty() {
            // A member starts here: a place to enter on a byte, with no window.
            self.candidate(self.in_pos * 8, true);
        }
        let before = self.pending.len();
        let take = chunk.len().min(MAX_HEADER_BYTES + 1 - before);
        self.pending.extend_from_slice(&chunk[..take]);
        match header_length(&self.pending) {
            Err(reason) => Err(DecodeFailure::shard(if between && reason == CORRUPT {
                TRAILING
            } else {
                reason
            })),
            Ok(None) if self.pending.len() > MAX_HEADER_BYTES => Err(DecodeFailure::shard(
                format!("gzip header longer than {MAX_HEADER_BYTES} bytes"),
            )),
            Ok(None) => Ok(take),
            Ok(Some(length)) => {
                self.pending.clear();
                self.member = Member::Body;
                self.members += 1;
                self.member_out_start = self.out_total;
                Ok(length - before)
            }
        }
    }

    fn body(&mut self, chunk: &[u8]) -> Result<usize, DecodeFailure> {
        let mut out = std::mem::take(&mut self.text);
        out.reserve(READ_BYTES);
        let before = out.len();
        let step = self.inflate.inflate(chunk, &mut out, true);
        self.text = out;
        let step = step.map_err(DecodeFailure::shard)?;
        self.crc.update(&self.text[before..]);
        self.member_size = self.member_size.wrapping_add(step.produced as u32);
        self.out_total += step.produced as u64;
        self.scan(before)?;
        let bit = (self.in_pos + step.consumed as u64) * 8 - u64::from(step.unused_bits);
        if step.stream_end {
            self.member = Member::Trailer;
        } else if step.at_block_boundary && self.out_total > self.member_out_start {
            self.boundary(bit.div_ceil(8));
            self.candidate(bit, false);
        } else if step.consumed == 0 && step.produced == 0 {
            return Err(DecodeFailure::shard(CORRUPT));
        }
        self.trim();
        Ok(step.consumed)
    }

    fn trailer(&mut self, chunk: &[u8]) -> Result<usize, DecodeFailure> {
        let take = chunk.len().min(8 - self.pending.len());
        self.pending.extend_from_slice(&chunk[..take]);
        if self.pending.len() == 8 {
            let t = &self.pending;
            let crc = u32::from_le_bytes([t[0], t[1], t[2], t[3]]);
            let size = u32::from_le_bytes([t[4], t[5], t[6], t[7]]);
            let actual = std::mem::take(&mut self.crc).finalize();
            if crc != actual || size != self.member_size {
                return Err(DecodeFailure::shard(CORRUPT));
            }
            self.pending.clear();
            self.member_size = 0;
            self.inflate = RawInflate::new().map_err(DecodeFailure::shard)?;
            self.member = Member::Header { between: true };
            self.boundary(self.in_pos + take as u64);
        }
        Ok(take)
    }

    /// Lines completed in the output from `text[from..]` on.
    fn scan(&mut self, from: usize) -> Result<(), DecodeFailure> {
        let mut at = from;
        while let Some(offset) = memchr::memchr(b'\n', &self.text[at..]) {
            let newline = self.text_base + (at + offset) as u64;
            self.line(newline, newline + 1)?;
            at += offset + 1;
        }
        if self.out_total - self.line_start > MAX_LINE_BYTES {
            return Err(DecodeFailure::shard(format!(
                "line {} longer than {MAX_LINE_BYTES} bytes",
                self.lines + 1
            )));
        }
        Ok(())
    }

    /// The line from `line_start` to `end` (its "\n" excluded); the next starts at `next`.
    fn line(&mut self, end: u64, next: u64) -> Result<(), DecodeFailure> {
        let number = self.lines + 1;
        let start = (self.line_start - self.text_base) as usize;
        let bytes = &self.text[start..(end - self.text_base) as usize];
        if bytes.len() as u64 > MAX_LINE_BYTES {
            return Err(DecodeFailure::shard(format!(
                "line {number} longer than {MAX_LINE_BYTES} bytes"
            )));
        }
        let text = std::str::from_utf8(bytes)
            .map_err(|_| DecodeFailure::shard(format!("invalid UTF-8 in line {number}")))?;
        let record = !is_blank(text) && is_json_record(bytes);
        if record {
            let n = self.records;
            if n > 0 && self.starts_step(n) {
                self.start_step(n)?;
            }
            self.records += 1;
            if self.starts_step(self.records) {
                if let Some(entry) = self.current.take() {
                    self.open.push_back((entry, next));
                }
            }
        }
        self.lines += 1;
        self.line_start = next;
        if let Some(c) = self.latest.as_mut() {
            if c.line.is_none() {
                c.line = Some((next - c.out, self.records, self.lines));
            }
        }
        self.line_candidate = self.latest;
        Ok(())
    }

    /// Whether record `n` is the first of a step.
    fn starts_step(&self, n: u64) -> bool {
        (n % self.block).is_multiple_of(self.step)
    }

    /// Record `n` starts a step: its entry is the line's candidate.
    fn start_step(&mut self, n: u64) -> Result<(), DecodeFailure> {
        let gap_error = || {
            DecodeFailure::shard(format!(
                "no deflate block boundary within {MAX_ENTRY_GAP} bytes before record {n}"
            ))
        };
        let c = self.line_candidate.ok_or_else(gap_error)?;
        let (skip, first_record, first_line) = c.line.ok_or_else(gap_error)?;
        let window = if c.member_start {
            Vec::new()
        } else {
            let from = (c.out.saturating_sub(WINDOW_BYTES as u64) - self.text_base) as usize;
            self.text[from..(c.out - self.text_base) as usize].to_vec()
        };
        self.current = Some(BlockEntry {
            start_bit: c.bit,
            member_start: c.member_start,
            skip,
            first_record,
            first_line,
            end_byte: 0,
            window,
        });
        Ok(())
    }

    fn candidate(&mut self, bit: u64, member_start: bool) {
        let out = self.out_total;
        let at_line_start = out == self.line_start;
        let candidate = Candidate {
            bit,
            member_start,
            out,
            line: at_line_start.then_some((0, self.records, self.lines)),
        };
        self.latest = Some(candidate);
        if at_line_start {
            self.line_candidate = Some(candidate);
        }
    }

    /// Everything decoded so far can be decoded from the shard's first `end_byte` bytes.
    fn boundary(&mut self, end_byte: u64) {
        while let Some((_, need)) = self.open.front() {
            if *need > self.out_total {
                break;
            }
            let (mut entry, _) = self.open.pop_front().expect("front exists");
            entry.end_byte = end_byte;
            self.done.push_back(entry);
        }
    }

    /// Drops output no longer needed: before the current line and before the window of the
    /// line's candidate (forgotten when it is over [`MAX_ENTRY_GAP`] behind).
    fn trim(&mut self) {
        if let Some(c) = self.line_candidate {
            if self.line_start - c.out > MAX_ENTRY_GAP {
                self.line_candidate = None;
            }
        }
        let keep = self.line_candidate.map_or(self.line_start, |c| {
            c.out
                .saturating_sub(WINDOW_BYTES as u64)
                .min(self.line_start)
        });
        if keep > self.text_base + (READ_BYTES as u64) {
            self.text.drain(..(keep - self.text_base) as usize);
            self.text_base = keep;
        }
    }
}

/// The length of the gzip header at the start of `bytes`; `None` while it is incomplete.
fn header_length(bytes: &[u8]) -> Result<Option<usize>, &'static str> {
    const FHCRC: u8 = 0x02;
    const FEXTRA: u8 = 0x04;
    const FNAME: u8 = 0x08;
    const FCOMMENT: u8 = 0x10;
    let magic = bytes.len().min(2);
    if bytes[..magic] != [0x1f, 0x8b][..magic] {
        return Err(CORRUPT);
    }
    if bytes.len() < 10 {
        return Ok(None);
    }
    let flags = bytes[3];
    if bytes[2] != 8 || flags & 0xe0 != 0 {
        return Err(CORRUPT);
    }
    let mut at = 10;
    if flags & FEXTRA != 0 {
        let Some(len) = bytes.get(at..at + 2) else {
            return Ok(None);
        };
        at += 2 + u16::from_le_bytes([len[0], len[1]]) as usize;
    }
    for flag in [FNAME, FCOMMENT] {
        if flags & flag != 0 {
            let Some(rest) = bytes.get(at..) else {
                return Ok(None);
            };
            let Some(zero) = memchr::memchr(0, rest) else {
                return Ok(None);
            };
            at += zero + 1;
        }
    }
    if flags & FHCRC != 0 {
        let Some(stored) = bytes.get(at..at + 2) else {
            return Ok(None);
        };
        let expected = crc32fast::hash(&bytes[..at]) as u16;
        if u16::from_le_bytes([stored[0], stored[1]]) != expected {
            return Err(CORRUPT);
        }
        at += 2;
    }
    Ok((at <= bytes.len()).then_some(at))
}

#[cfg(test)]
mod tests;
