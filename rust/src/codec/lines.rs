//! jsonl.gz text framing: gunzip, split on "\n", check UTF-8, drop blank lines, bound line size.
//!
//! [`JsonlLines`] is the pure-Rust core of the decoder: it hands out batches of candidate lines
//! (JSON parsing happens under the GIL, straight into Python objects).

use super::gzip::Gunzip;
use super::{Failure, MAX_LINE_BYTES};
use crate::source::ByteSource;

/// Decompressed text gathered before a batch is handed on.
const BATCH_BYTES: usize = 4 << 20;
/// Decompressed bytes requested from gunzip per step.
const READ_BYTES: usize = 256 << 10;

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
        }
    }

    /// Lowers the line limit, so tests can reach it with small inputs.
    pub fn with_max_line(mut self, max_line: u64) -> Self {
        self.max_line = max_line.min(MAX_LINE_BYTES);
        self
    }

    /// The next batch of lines; `None` once the stream is done.
    pub fn next_batch(&mut self) -> Result<Option<LineBatch>, Failure> {
        while !self.done {
            let more = self.gunzip.read_into(&mut self.text, READ_BYTES)?;
            self.scan_lines()?;
            if !more {
                // The last line may lack its "\n".
                let end = self.text.len();
                if end > self.line_start {
                    self.push_line(end, end)?;
                }
                self.done = true;
            } else if self.text.len() - self.line_start > self.max_line as usize {
                return Err(self.too_long());
            } else if self.text.len() >= BATCH_BYTES && !self.lines.is_empty() {
                return Ok(Some(self.take_batch()));
            }
        }
        Ok((!self.lines.is_empty()).then(|| self.take_batch()))
    }

    fn scan_lines(&mut self) -> Result<(), Failure> {
        while let Some(offset) = memchr::memchr(b'\n', &self.text[self.scan..]) {
            let newline = self.scan + offset;
            self.push_line(newline, newline + 1)?;
        }
        self.scan = self.text.len();
        Ok(())
    }

    /// Records the line ending at `end`; the next one starts at `next`.
    fn push_line(&mut self, end: usize, next: usize) -> Result<(), Failure> {
        let number = self.next_number;
        let bytes = &self.text[self.line_start..end];
        if bytes.len() as u64 > self.max_line {
            return Err(self.too_long());
        }
        let text = std::str::from_utf8(bytes)
            .map_err(|_| Failure::shard(format!("invalid UTF-8 in line {number}")))?;
        if !is_blank(text) {
            self.lines.push(Line {
                number,
                start: self.line_start,
                end,
            });
        }
        self.next_number += 1;
        self.line_start = next;
        self.scan = next;
        Ok(())
    }

    fn too_long(&self) -> Failure {
        Failure::shard(format!(
            "line {} longer than {} bytes",
            self.next_number, self.max_line
        ))
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

/// Blank as Python's `str.strip()` sees it: Unicode whitespace plus the separators \x1c-\x1f.
fn is_blank(line: &str) -> bool {
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

    fn lines(text: &[u8], max_line: u64) -> Result<Vec<(u64, String)>, String> {
        let data = gzip(text);
        let chunks: Vec<Bytes> = data.chunks(3).map(Bytes::copy_from_slice).collect();
        let mut reader =
            JsonlLines::new(Box::new(MemorySource::new(chunks))).with_max_line(max_line);
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
                Err(Failure::Shard(r)) => return Err(r),
                Err(Failure::Source(e)) => return Err(e.to_string()),
            }
        }
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

    #[test]
    fn long_unterminated_line_fails_before_the_stream_ends() {
        let text = vec![b'a'; 4 << 20];
        let data = gzip(&text);
        let source = MemorySource::new([Bytes::from(data)]);
        let mut reader = JsonlLines::new(Box::new(source)).with_max_line(1000);
        assert!(
            matches!(reader.next_batch(), Err(Failure::Shard(r)) if r.starts_with("line 1 longer"))
        );
        assert!(reader.text.len() < 2 << 20);
    }
}
