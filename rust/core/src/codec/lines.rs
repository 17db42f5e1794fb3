//! jsonl.gz text framing: gunzip, split on "\n", check UTF-8, drop blank lines, bound line size.
//!
//! [`JsonlLines`] is the pure-Rust core of the decoder: it hands out batches of candidate lines
//! (JSON parsing happens under the GIL, straight into Python objects).

use super::columnar::is_json_record;
use super::gzip::{Gunzip, GzipEntry};
use super::{count_mismatch, found_more, DecodeFailure, RecordRange, MAX_LINE_BYTES};
use crate::source::ByteSource;

/// Decompressed text gathered before a batch is handed on.
const BATCH_BYTES: usize = 4 << 20;
/// Decompressed bytes requested from gunzip per step.
const READ_BYTES: usize = 256 << 10;
/// The first batch is handed on once this much text holds a complete line, and each next
/// one at four times as much, up to BATCH_BYTES: an open waits for its first line, not 4 MiB.
const FIRST_BATCH_BYTES: usize = 16 << 10;
const BATCH_GROWTH: usize = 4;

/// One non-blank line of a batch: its 1-based number in the shard and its byte range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    pub number: u64,
    pub start: usize,
    pub end: usize,
}

/// Complete, valid UTF-8 lines sharing one text buffer.
#[derive(Debug, Default)]
pub struct LineBatch {
    pub text: Vec<u8>,
    pub lines: Vec<Line>,
}

impl LineBatch {
    pub fn line(&self, line: &Line) -> &[u8] {
        &self.text[line.start..line.end]
    }
}

/// Splits a gzip stream into line batches.
///
/// Memory is bounded by the bytes scanned since the last batch (about [`BATCH_BYTES`] plus the
/// line being read), never by the lines kept: blank lines, and lines before a range's start,
/// are dropped from the buffer as the scan passes them.
pub struct JsonlLines {
    gunzip: Gunzip,
    /// Decompressed text; complete lines before `line_start`, the unfinished one after it.
    text: Vec<u8>,
    line_start: usize,
    /// Where the search for the next "\n" resumes.
    scan: usize,
    next_number: u64,
    lines: Vec<Line>,
    max_line: u64,
    done: bool,
    /// A partial read (`None`: the whole shard, with no count checks here).
    range: Option<RecordRange>,
    /// Records (lines holding a JSON object) passed so far: in a range read, the index of the
    /// next record.
    records: u64,
    /// An end-of-range error held back until the lines before it are handed out.
    failure: Option<DecodeFailure>,
    /// Text that makes the next batch (grows from FIRST_BATCH_BYTES to BATCH_BYTES).
    batch_bytes: usize,
    /// Entered mid-stream: output bytes still to drop before the first whole line.
    skip: u64,
    entered: bool,
}

impl JsonlLines {
    pub fn new(source: Box<dyn ByteSource>) -> Self {
        Self {
            gunzip: Gunzip::new(source),
            text: Vec::new(),
            line_start: 0,
            scan: 0,
            next_number: 1,
            lines: Vec::new(),
            max_line: MAX_LINE_BYTES,
            done: false,
            range: None,
            records: 0,
            failure: None,
            batch_bytes: FIRST_BATCH_BYTES,
            skip: 0,
            entered: false,
        }
    }

    /// The reader of `range` of a source that starts at the shard's start, or at `entry`.
    pub fn open(
        source: Box<dyn ByteSource>,
        range: RecordRange,
        entry: Option<&GzipEntry>,
    ) -> Self {
        let lines = Self::new(source);
        match entry {
            Some(entry) => lines.with_entry(entry),
            None => lines,
        }
        .with_range(range)
    }

    /// Reads a source that starts at `entry` (an access point of the shard's index) rather
    /// than at the shard's start: records and lines are numbered from the entry's first line,
    /// and the range (in the shard's numbering, set after this) must not start before it.
    pub fn with_entry(mut self, entry: &GzipEntry) -> Self {
        self.gunzip.enter_at(entry);
        self.skip = entry.skip;
        self.records = entry.first_record;
        self.next_number = entry.first_line.saturating_add(1);
        self.entered = true;
        self
    }

    /// Reads only the records of `range`, a record being a line holding a JSON object: lines
    /// before its start are validated, never built, reading stops after its last record,
    /// and the count is checked here (at least `stop` records; exactly `declared` when the
    /// range reaches the end). A full range keeps the whole-shard semantics.
    pub fn with_range(mut self, range: RecordRange) -> Self {
        self.range = (!range.is_full() || self.entered).then_some(range);
        if self.entered && self.records > range.start {
            self.failure = Some(DecodeFailure::shard(format!(
                "the index entry starts at record {}, after the range's first record {}",
                self.records, range.start
            )));
            self.done = true;
            return self;
        }
        self.done = self.range_done();
        self
    }

    /// Lowers the line limit, so tests can reach it with small inputs.
    pub fn with_max_line(mut self, max_line: u64) -> Self {
        self.max_line = max_line.min(MAX_LINE_BYTES);
        self
    }

    /// The next batch of lines; `None` once the stream (or the range) is done.
    pub fn next_batch(&mut self) -> Result<Option<LineBatch>, DecodeFailure> {
        if let Some(failure) = self.failure.take() {
            return Err(failure);
        }
        while !self.done {
            let read = READ_BYTES.min(self.batch_bytes);
            let more = self.gunzip.read_into(&mut self.text, read)?;
            self.scan_lines()?;
            if self.done {
                break;
            }
            if !more {
                // The last line may lack its "\n".
                let end = self.text.len();
                if end > self.line_start {
                    self.push_line(end, end)?;
                }
                self.done = true;
                self.failure = self.range_shortfall();
            } else if self.text.len() - self.line_start > self.max_line as usize {
                return Err(self.too_long());
            } else if self.text.len() >= self.batch_bytes {
                if !self.lines.is_empty() {
                    self.batch_bytes = (self.batch_bytes * BATCH_GROWTH).min(BATCH_BYTES);
                    return Ok(Some(self.take_batch()));
                }
                self.discard_passed();
            }
        }
        if self.lines.is_empty() {
            return self.failure.take().map_or(Ok(None), Err);
        }
        Ok(Some(self.take_batch()))
    }

    fn scan_lines(&mut self) -> Result<(), DecodeFailure> {
        if self.skip > 0 {
            // The rest of the line the entry point falls in: read by the range before.
            let n = self.skip.min(self.text.len() as u64) as usize;
            self.text.drain(..n);
            self.skip -= n as u64;
            if self.skip > 0 {
                return Ok(());
            }
        }
        while let Some(offset) = memchr::memchr(b'\n', &self.text[self.scan..]) {
            let newline = self.scan + offset;
            if newline == self.line_start {
                // A run of empty lines is passed at once: they are blank, never records.
                let run = self.text[newline..]
                    .iter()
                    .take_while(|&&b| b == b'\n')
                    .count();
                self.next_number += run as u64;
                self.line_start = newline + run;
                self.scan = self.line_start;
                continue;
            }
            self.push_line(newline, newline + 1)?;
            if self.range_done() {
                self.done = true;
                return Ok(());
            }
        }
        self.scan = self.text.len();
        Ok(())
    }

    /// Records the line ending at `end`; the next one starts at `next`.
    fn push_line(&mut self, end: usize, next: usize) -> Result<(), DecodeFailure> {
        let number = self.next_number;
        let bytes = &self.text[self.line_start..end];
        if bytes.len() as u64 > self.max_line {
            return Err(self.too_long());
        }
        let invalid_utf8 = || DecodeFailure::shard(format!("invalid UTF-8 in line {number}"));
        match self.range {
            // Before the range: only whether the line is a record matters. A record is a line
            // holding a JSON object, as the reader yields it: a line that is not one is
            // skipped by the reader, so it must not be counted here either, or a range would
            // start a record early (its predecessor read twice, its last record never).
            Some(range) if self.records < range.start => {
                if !is_blank_bytes(bytes).ok_or_else(invalid_utf8)? && is_json_record(bytes) {
                    self.records += 1;
                }
            }
            range => {
                let text = std::str::from_utf8(bytes).map_err(|_| invalid_utf8())?;
                if !is_blank(text) {
                    // Counted only in a range read (a whole read is counted by its parser);
                    // the line is handed on either way, so an invalid one is still logged.
                    if let Some(range) = range {
                        if is_json_record(bytes) {
                            if self.records == range.declared {
                                return Err(DecodeFailure::shard(found_more(range.declared)));
                            }
                            self.records += 1;
                        }
                    }
                    self.lines.push(Line {
                        number,
                        start: self.line_start,
                        end,
                    });
                }
            }
        }
        self.next_number += 1;
        self.line_start = next;
        self.scan = next;
        Ok(())
    }

    /// A range read has passed its last record and need not read on.
    fn range_done(&self) -> bool {
        self.range
            .is_some_and(|range| self.records == range.stop && !range.reaches_end())
    }

    /// The stream ended before a range read found all the records it needs.
    fn range_shortfall(&self) -> Option<DecodeFailure> {
        let range = self.range?;
        (self.records < range.stop)
            .then(|| DecodeFailure::shard(count_mismatch(range.declared, self.records)))
    }

    fn too_long(&self) -> DecodeFailure {
        DecodeFailure::shard(format!(
            "line {} longer than {} bytes",
            self.next_number, self.max_line
        ))
    }

    /// Drops the text of lines already passed (blank or before the range) when no kept line
    /// refers to it, keeping the unfinished line.
    fn discard_passed(&mut self) {
        self.text.drain(..self.line_start);
        self.scan -= self.line_start;
        self.line_start = 0;
    }

    /// Hands out the complete lines, keeping the unfinished one for the next batch.
    fn take_batch(&mut self) -> LineBatch {
        let tail = self.text[self.line_start..].to_vec();
        let mut text = std::mem::replace(&mut self.text, tail);
        text.truncate(self.line_start);
        self.scan -= self.line_start;
        self.line_start = 0;
        LineBatch {
            text,
            lines: std::mem::take(&mut self.lines),
        }
    }
}

/// Whether a line is blank, looking at its bytes only as far as needed: the first byte that
/// is not ASCII whitespace decides, unless it starts a multi-byte character. `None` for
/// invalid UTF-8 found on the way.
fn is_blank_bytes(line: &[u8]) -> Option<bool> {
    match line.iter().find(|b| !is_ascii_blank(**b)) {
        None => Some(true),
        Some(b) if b.is_ascii() => Some(false),
        Some(_) => std::str::from_utf8(line).ok().map(is_blank),
    }
}

/// ASCII characters `str.strip()` removes: \t \n \v \f \r, \x1c-\x1f and space.
fn is_ascii_blank(byte: u8) -> bool {
    matches!(byte, b'\t'..=b'\r' | 0x1c..=0x1f | b' ')
}

/// Whether the brackets of a JSON text nest deeper than `max` (strings skipped; the text need
/// not be valid JSON).
pub fn nesting_exceeds(text: &[u8], max: usize) -> bool {
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for &byte in text {
        if in_string {
            match byte {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match byte {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > max {
                    return true;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    false
}

/// Blank as Python's `str.strip()` sees it: Unicode whitespace plus the separators \x1c-\x1f.
pub(super) fn is_blank(line: &str) -> bool {
    line.chars()
        .all(|c| c.is_whitespace() || ('\x1c'..='\x1f').contains(&c))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::gzip::GzipWriter;
    use crate::source::MemorySource;
    use bytes::Bytes;

    fn gzip(text: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut w = GzipWriter::new();
        w.write(text, &mut out).unwrap();
        w.finish(&mut out).unwrap();
        out
    }

    /// The gzipped `text` as a reader fed in 3-byte chunks.
    fn reader(text: &[u8]) -> JsonlLines {
        let data = gzip(text);
        let chunks: Vec<Bytes> = data.chunks(3).map(Bytes::copy_from_slice).collect();
        JsonlLines::new(Box::new(MemorySource::new(chunks)))
    }

    /// Every (line number, text) the reader gives, or its error.
    fn read_all(mut reader: JsonlLines) -> Result<Vec<(u64, String)>, String> {
        let mut out = Vec::new();
        loop {
            match reader.next_batch() {
                Ok(Some(batch)) => {
                    for line in &batch.lines {
                        let text = String::from_utf8(batch.line(line).to_vec()).unwrap();
                        out.push((line.number, text));
                    }
                }
                Ok(None) => return Ok(out),
                Err(DecodeFailure::Shard(r)) => return Err(r),
                Err(DecodeFailure::Source(e)) => return Err(e.to_string()),
            }
        }
    }

    #[test]
    fn measures_nesting_outside_strings() {
        assert!(!nesting_exceeds(b"{\"a\":[[1]]}", 3));
        assert!(nesting_exceeds(b"{\"a\":[[[1]]]}", 3));
        assert!(!nesting_exceeds(b"{\"a\":\"[[[[\\\"[[[[\"}", 1));
        assert!(!nesting_exceeds(b"[][][][][]", 1));
        assert!(nesting_exceeds(b"[[[[ not json", 3));
    }

    #[test]
    fn numbers_lines_and_skips_blanks() {
        let got = lines(b"{\"a\":1}\n\n  \r\n{\"b\":2}\n\xc3\xa9", 100).unwrap();
        assert_eq!(
            got,
            vec![
                (1, "{\"a\":1}".to_owned()),
                (4, "{\"b\":2}".to_owned()),
                (5, "\u{e9}".to_owned())
            ]
        );
        assert_eq!(lines(b"", 100).unwrap(), vec![]);
        assert_eq!(lines(b"x\n", 100).unwrap(), vec![(1, "x".to_owned())]);
    }

    #[test]
    fn rejects_invalid_utf8_and_long_lines() {
        assert_eq!(
            lines(b"ok\n\xff\n", 100),
            Err("invalid UTF-8 in line 2".into())
        );
        assert_eq!(
            lines(b"12345\n123456\n", 5),
            Err("line 2 longer than 5 bytes".into())
        );
        assert_eq!(
            lines(b"12345\n123456", 5),
            Err("line 2 longer than 5 bytes".into())
        );
        assert!(lines(b"12345\n12345", 5).is_ok());
    }

    fn lines(text: &[u8], max_line: u64) -> Result<Vec<(u64, String)>, String> {
        read_all(reader(text).with_max_line(max_line))
    }

    fn range_lines(text: &[u8], range: RecordRange) -> Result<Vec<(u64, String)>, String> {
        read_all(reader(text).with_range(range))
    }

    fn range(declared: u64, start: i64, stop: i64) -> RecordRange {
        RecordRange::new(declared, start, Some(stop)).unwrap()
    }

    #[test]
    fn range_indices_count_json_objects_as_the_reader_yields_them() {
        // Line 3 is not JSON and line 4 not an object: the reader skips both, so they are not
        // records (3 records in all); each is handed on once, to the range that reads past it,
        // which logs it.
        let text = b"{\"a\":0}\n\n not json \n[1]\n \t\n{\"a\":2}\n{\"a\":3}\n";
        assert_eq!(
            range_lines(text, range(3, 2, 3)).unwrap(),
            vec![(7, "{\"a\":3}".to_owned())]
        );
        assert_eq!(
            range_lines(text, range(3, 1, 2)).unwrap(),
            vec![
                (3, " not json ".to_owned()),
                (4, "[1]".to_owned()),
                (6, "{\"a\":2}".to_owned())
            ]
        );
        assert_eq!(
            range_lines(text, range(3, 0, 1)).unwrap(),
            vec![(1, "{\"a\":0}".to_owned())]
        );
        assert_eq!(range_lines(text, range(3, 3, 3)).unwrap(), vec![]);
        assert_eq!(range_lines(text, range(3, 0, 0)).unwrap(), vec![]);
        // A count that took the invalid lines for records would find more than declared.
        assert!(range_lines(text, range(5, 4, 5)).is_err());
        // Unicode whitespace is blank too; the skip looks at it as text.
        let unicode = "\u{3000}\n{}\n{}".as_bytes();
        assert_eq!(
            range_lines(unicode, range(2, 1, 2)).unwrap(),
            vec![(3, "{}".to_owned())]
        );
    }

    #[test]
    fn range_stops_after_its_last_record_and_checks_the_count() {
        // Bad UTF-8 after the range is never read when the range stops before the end.
        let text = b"{}\n{}\n{}\n\xff\n";
        assert_eq!(range_lines(text, range(4, 1, 3)).unwrap().len(), 2);
        assert_eq!(
            range_lines(text, range(4, 1, 4)),
            Err("invalid UTF-8 in line 4".into())
        );
        assert_eq!(
            range_lines(b"{}\n{}\n", range(5, 1, 3)),
            Err(count_mismatch(5, 2))
        );
        assert_eq!(
            range_lines(b"{}\n{}\n", range(5, 3, 4)),
            Err(count_mismatch(5, 2))
        );
        assert_eq!(
            range_lines(b"{}\n{}\n{}\n", range(2, 1, 2)),
            Err(found_more(2))
        );
        assert_eq!(
            range_lines(b"{}\n{}\n\n \n", range(2, 1, 2)).unwrap().len(),
            1
        );
        assert!(range_lines(b"{}\n{}\n{}", range(3, 0, 3)).is_ok());
    }

    #[test]
    fn skipped_lines_obey_the_line_limit() {
        let data = gzip(b"{}\n123456789\n{}\n");
        let source = MemorySource::new([Bytes::from(data)]);
        let mut reader = JsonlLines::new(Box::new(source))
            .with_range(range(3, 2, 3))
            .with_max_line(5);
        assert!(
            matches!(reader.next_batch(), Err(DecodeFailure::Shard(r)) if r == "line 2 longer than 5 bytes")
        );
    }

    #[test]
    fn blank_runs_are_not_held() {
        let mut text = b"{}\n".to_vec();
        text.extend(std::iter::repeat_n(b'\n', 64 << 20));
        text.extend(b"{}\n");
        let data = gzip(&text);
        let source = MemorySource::new([Bytes::from(data)]);
        let mut reader = JsonlLines::new(Box::new(source));
        let mut lines = 0;
        let mut largest = 0;
        while let Some(batch) = reader.next_batch().unwrap() {
            lines += batch.lines.len();
            largest = largest.max(batch.text.len()).max(reader.text.capacity());
        }
        assert_eq!(lines, 2);
        assert!(largest <= 8 << 20, "held {largest} bytes");
    }

    #[test]
    fn long_unterminated_line_fails_before_the_stream_ends() {
        let text = vec![b'a'; 4 << 20];
        let data = gzip(&text);
        let source = MemorySource::new([Bytes::from(data)]);
        let mut reader = JsonlLines::new(Box::new(source)).with_max_line(1000);
        assert!(
            matches!(reader.next_batch(), Err(DecodeFailure::Shard(r)) if r.starts_with("line 1 longer"))
        );
        assert!(reader.text.len() < 2 << 20);
    }
}
