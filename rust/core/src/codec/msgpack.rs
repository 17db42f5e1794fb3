//! MessagePack: the record parser (iterative, so nesting depth cannot overflow the stack) and
//! the smallest-encoding primitives the writer uses.
//!
//! The parser drives a [`Sink`]: [`Validator`] checks a payload off the GIL, and the Python
//! builder walks the same payload again under the GIL, so both passes share one grammar.

/// Reason: the bytes are not exactly one well-formed value of the accepted subset.
pub const INVALID_PAYLOAD: &str = "invalid MessagePack payload";
pub const NOT_A_MAP: &str = "payload not a map";
pub const NON_STRING_KEY: &str = "non-string map key";
pub const TOO_DEEP: &str = "nesting too deep";

/// Maps and arrays may nest this deep (the root map is level 1), as deep as the writer goes.
pub const MAX_DEPTH: usize = 1000;

/// Internal: a token runs past the bytes available so far.
const INCOMPLETE: &str = "incomplete MessagePack token";
/// While a payload arrives: a value needs more bytes than the payload may hold. The caller
/// knows which limit that was (a declared size, or the 1 GiB cap) and names the reason.
pub const BEYOND_LIMIT: &str = "MessagePack value runs past the payload limit";

/// A leaf value, borrowed from the payload.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Scalar<'a> {
    Nil,
    Bool(bool),
    Int(i64),
    UInt(u64),
    Float(f64),
    Str(&'a str),
    Bin(&'a [u8]),
}

/// Receives the parse events of one record, in document order.
pub trait Sink {
    type Error;
    fn scalar(&mut self, value: Scalar<'_>) -> Result<(), Self::Error>;
    /// The key of the next map entry; its value follows.
    fn key(&mut self, key: &str) -> Result<(), Self::Error>;
    fn begin_map(&mut self, len: usize) -> Result<(), Self::Error>;
    fn begin_array(&mut self, len: usize) -> Result<(), Self::Error>;
    /// Closes the innermost open map or array.
    fn end(&mut self) -> Result<(), Self::Error>;
    /// Whether the sink ignores fixed-size scalars (ints, floats, nil, bools): the parser then
    /// passes over runs of them among array items in one tight loop, without calling
    /// [`Sink::scalar`] (token id lists are most of an LLM dataset's bytes).
    const IGNORES_FIXED_SCALARS: bool = false;
}

#[derive(Debug, PartialEq)]
pub enum ParseError<E> {
    /// One of the reasons above.
    Payload(&'static str),
    Sink(E),
}

/// A sink that only lets the parser check the grammar.
pub struct Validator;

impl Sink for Validator {
    type Error = std::convert::Infallible;
    const IGNORES_FIXED_SCALARS: bool = true;
    fn scalar(&mut self, _: Scalar<'_>) -> Result<(), Self::Error> {
        Ok(())
    }
    fn key(&mut self, _: &str) -> Result<(), Self::Error> {
        Ok(())
    }
    fn begin_map(&mut self, _: usize) -> Result<(), Self::Error> {
        Ok(())
    }
    fn begin_array(&mut self, _: usize) -> Result<(), Self::Error> {
        Ok(())
    }
    fn end(&mut self) -> Result<(), Self::Error> {
        Ok(())
    }
}

/// Checks that `payload` is one map with string keys at every depth, nothing after it.
pub fn validate_record(payload: &[u8]) -> Result<(), &'static str> {
    parse_record(payload, &mut Validator).map_err(validation_reason)
}

fn validation_reason(err: ParseError<std::convert::Infallible>) -> &'static str {
    match err {
        ParseError::Payload(reason) => reason,
        ParseError::Sink(never) => match never {},
    }
}

/// Validates a payload while it is still being decompressed: each `feed` parses the complete
/// tokens of the payload so far, so a bad byte (nesting too deep above all) stops the
/// decompression there, instead of after the whole payload is held. Its own memory is the
/// open-container stack, at most [`MAX_DEPTH`] entries.
#[derive(Default)]
pub struct StreamValidator {
    parser: Parser,
    /// Bytes parsed so far.
    pos: usize,
}

impl StreamValidator {
    /// Starts a new payload.
    pub fn reset(&mut self) {
        self.parser = Parser::default();
        self.pos = 0;
    }

    /// `so_far` is the payload decompressed so far (earlier bytes unchanged since the last
    /// call); `limit` the most it may grow to.
    pub fn feed(&mut self, so_far: &[u8], limit: usize) -> Result<(), &'static str> {
        let mut cur = Cursor::resume(so_far, self.pos, Some(limit));
        let result = self.parser.advance(&mut cur, &mut Validator);
        self.pos = cur.pos;
        let complete = result.map_err(validation_reason)?;
        // A complete record followed by more bytes is not one value.
        if complete && cur.remaining() != 0 {
            return Err(INVALID_PAYLOAD);
        }
        Ok(())
    }

    /// The payload ended as `payload`: it must be exactly one complete record.
    pub fn finish(&mut self, payload: &[u8]) -> Result<(), &'static str> {
        let mut cur = Cursor::resume(payload, self.pos, None);
        let complete = self
            .parser
            .advance(&mut cur, &mut Validator)
            .map_err(validation_reason)?;
        if !complete || cur.remaining() != 0 {
            return Err(INVALID_PAYLOAD);
        }
        Ok(())
    }
}

/// One MessagePack item: a scalar, or the header of a map (entries) or array (items).
#[derive(Debug)]
pub enum Token<'a> {
    Scalar(Scalar<'a>),
    Map(usize),
    Array(usize),
}

/// Bytes of the fixed-size scalar a marker starts (ints, floats, nil, bools); 0 for others.
const FIXED_SCALAR_BYTES: [u8; 256] = {
    let mut table = [0u8; 256];
    let mut marker = 0;
    while marker < 256 {
        table[marker] = match marker as u8 {
            0x00..=0x7f | 0xe0..=0xff | 0xc0 | 0xc2 | 0xc3 => 1,
            0xcc | 0xd0 => 2,
            0xcd | 0xd1 => 3,
            0xca | 0xce | 0xd2 => 5,
            0xcb | 0xcf | 0xd3 => 9,
            _ => 0,
        };
        marker += 1;
    }
    table
};

/// Reads tokens off a payload; every read is bounds-checked, so any bytes are safe to feed.
pub struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    /// `Some(limit)` while the payload is still arriving (it may grow up to `limit` bytes): a
    /// token running past `buf` is then incomplete rather than invalid.
    partial: Option<usize>,
}

impl<'a> Cursor<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Self::resume(buf, 0, None)
    }

    fn resume(buf: &'a [u8], pos: usize, partial: Option<usize>) -> Self {
        Self { buf, pos, partial }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], &'static str> {
        let end = self.pos.checked_add(n).ok_or(INVALID_PAYLOAD)?;
        let Some(bytes) = self.buf.get(self.pos..end) else {
            return Err(match self.partial {
                Some(limit) if end <= limit => INCOMPLETE,
                Some(_) => BEYOND_LIMIT,
                None => INVALID_PAYLOAD,
            });
        };
        self.pos = end;
        Ok(bytes)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], &'static str> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    fn u8(&mut self) -> Result<u8, &'static str> {
        Ok(self.array::<1>()?[0])
    }

    fn u16(&mut self) -> Result<usize, &'static str> {
        Ok(u16::from_be_bytes(self.array()?) as usize)
    }

    fn u32(&mut self) -> Result<usize, &'static str> {
        usize::try_from(u32::from_be_bytes(self.array()?)).map_err(|_| INVALID_PAYLOAD)
    }

    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// Bytes the payload may still hold after the current position.
    fn room(&self) -> usize {
        self.partial
            .unwrap_or(self.buf.len())
            .saturating_sub(self.pos)
    }

    fn str(&mut self, len: usize) -> Result<Token<'a>, &'static str> {
        let bytes = self.take(len)?;
        let text = std::str::from_utf8(bytes).map_err(|_| INVALID_PAYLOAD)?;
        Ok(Token::Scalar(Scalar::Str(text)))
    }

    fn bin(&mut self, len: usize) -> Result<Token<'a>, &'static str> {
        Ok(Token::Scalar(Scalar::Bin(self.take(len)?)))
    }

    /// A container of `items` values needs at least one byte per value: rejecting larger
    /// counts early keeps a forged header from sizing allocations in the sink.
    fn container(&self, items: usize, map: bool) -> Result<Token<'a>, &'static str> {
        let needed = if map {
            items.checked_mul(2)
        } else {
            Some(items)
        };
        match needed {
            Some(n) if n <= self.room() => Ok(if map {
                Token::Map(items)
            } else {
                Token::Array(items)
            }),
            _ if self.partial.is_some() => Err(BEYOND_LIMIT),
            _ => Err(INVALID_PAYLOAD),
        }
    }

    /// Passes over the run of (at most `most`) fixed-size scalars at the cursor that lie wholly
    /// in the bytes so far, and returns how many; what stops the run is left for
    /// [`Cursor::token`] to read or report.
    fn skip_fixed_scalars(&mut self, most: usize) -> usize {
        let (buf, mut pos) = (self.buf, self.pos);
        let size_at = |pos: usize| {
            buf.get(pos)
                .map_or(0, |&m| FIXED_SCALAR_BYTES[usize::from(m)])
        };
        let mut skipped = 0;
        while skipped < most {
            let len = usize::from(size_at(pos));
            if len == 0 || buf.len() - pos < len {
                break;
            }
            // A run of one size: the next position does not wait on the byte just read, as the
            // CPU predicts the size check.
            loop {
                pos += len;
                skipped += 1;
                if skipped == most || buf.len() - pos < len || usize::from(size_at(pos)) != len {
                    break;
                }
            }
        }
        self.pos = pos;
        skipped
    }

    /// The next token; `None` if it is not complete yet (the position is then unchanged).
    fn resumable_token(&mut self) -> Result<Option<Token<'a>>, &'static str> {
        let mark = self.pos;
        match self.raw_token() {
            Ok(token) => Ok(Some(token)),
            Err(INCOMPLETE) => {
                self.pos = mark;
                Ok(None)
            }
            Err(reason) => Err(reason),
        }
    }

    /// The next token of a complete payload.
    pub fn token(&mut self) -> Result<Token<'a>, &'static str> {
        self.raw_token().map_err(|reason| match reason {
            INCOMPLETE => INVALID_PAYLOAD,
            other => other,
        })
    }

    /// Appends the run of (at most `most`) integers at the cursor that fit an i64 to `out`, and
    /// returns how many; what stops the run (another type, an int beyond i64, a truncated int)
    /// is left for [`Cursor::token`] to read or report. The columnar decoder's fast path for
    /// lists of token ids: a run of one encoding is decoded in a loop whose only branch on the
    /// bytes is "same marker again", which the CPU predicts.
    pub fn ints(&mut self, most: usize, out: &mut Vec<i64>) -> usize {
        let end = out.len() + most;
        let start = out.len();
        while out.len() < end {
            let Some(&marker) = self.buf.get(self.pos) else {
                break;
            };
            let before = out.len();
            match marker {
                0x00..=0x7f => self.fixint_run(end, out, |b| b < 0x80),
                0xe0..=0xff => self.fixint_run(end, out, |b| b >= 0xe0),
                0xcc => self.int_run(end, out, |[b]: [u8; 1]| Some(i64::from(b))),
                0xcd => self.int_run(end, out, |b| Some(i64::from(u16::from_be_bytes(b)))),
                0xce => self.int_run(end, out, |b| Some(i64::from(u32::from_be_bytes(b)))),
                0xcf => self.int_run(end, out, |b| i64::try_from(u64::from_be_bytes(b)).ok()),
                0xd0 => self.int_run(end, out, |b| Some(i64::from(i8::from_be_bytes(b)))),
                0xd1 => self.int_run(end, out, |b| Some(i64::from(i16::from_be_bytes(b)))),
                0xd2 => self.int_run(end, out, |b| Some(i64::from(i32::from_be_bytes(b)))),
                0xd3 => self.int_run(end, out, |b| Some(i64::from_be_bytes(b))),
                _ => break,
            }
            if out.len() == before {
                break;
            }
        }
        out.len() - start
    }

    /// One-byte ints (the marker is the value) while `same` holds.
    fn fixint_run(&mut self, end: usize, out: &mut Vec<i64>, same: impl Fn(u8) -> bool) {
        while out.len() < end {
            match self.buf.get(self.pos) {
                Some(&b) if same(b) => out.push(i64::from(b as i8)),
                _ => break,
            }
            self.pos += 1;
        }
    }

    /// Ints of the marker at the cursor followed by `N` big-endian bytes, while the marker
    /// repeats and `decode` takes the value.
    fn int_run<const N: usize>(
        &mut self,
        end: usize,
        out: &mut Vec<i64>,
        decode: impl Fn([u8; N]) -> Option<i64>,
    ) {
        let marker = self.buf[self.pos];
        while out.len() < end {
            let Some((&[first], bytes)) = self
                .buf
                .get(self.pos..self.pos + 1 + N)
                .map(|item| item.split_at(1))
            else {
                break;
            };
            if first != marker {
                break;
            }
            let Some(value) = decode(bytes.try_into().expect("N bytes")) else {
                break;
            };
            out.push(value);
            self.pos += 1 + N;
        }
    }

    fn raw_token(&mut self) -> Result<Token<'a>, &'static str> {
        let marker = self.u8()?;
        let scalar = |s| Ok(Token::Scalar(s));
        match marker {
            0x00..=0x7f => scalar(Scalar::UInt(u64::from(marker))),
            0x80..=0x8f => self.container(usize::from(marker & 0x0f), true),
            0x90..=0x9f => self.container(usize::from(marker & 0x0f), false),
            0xa0..=0xbf => self.str(usize::from(marker & 0x1f)),
            0xc0 => scalar(Scalar::Nil),
            0xc2 => scalar(Scalar::Bool(false)),
            0xc3 => scalar(Scalar::Bool(true)),
            0xc4 => {
                let n = usize::from(self.u8()?);
                self.bin(n)
            }
            0xc5 => {
                let n = self.u16()?;
                self.bin(n)
            }
            0xc6 => {
                let n = self.u32()?;
                self.bin(n)
            }
            0xca => scalar(Scalar::Float(f64::from(f32::from_be_bytes(self.array()?)))),
            0xcb => scalar(Scalar::Float(f64::from_be_bytes(self.array()?))),
            0xcc => scalar(Scalar::UInt(u64::from(self.u8()?))),
            0xcd => scalar(Scalar::UInt(u64::from(u16::from_be_bytes(self.array()?)))),
            0xce => scalar(Scalar::UInt(u64::from(u32::from_be_bytes(self.array()?)))),
            0xcf => scalar(Scalar::UInt(u64::from_be_bytes(self.array()?))),
            0xd0 => scalar(Scalar::Int(i64::from(i8::from_be_bytes(self.array()?)))),
            0xd1 => scalar(Scalar::Int(i64::from(i16::from_be_bytes(self.array()?)))),
            0xd2 => scalar(Scalar::Int(i64::from(i32::from_be_bytes(self.array()?)))),
            0xd3 => scalar(Scalar::Int(i64::from_be_bytes(self.array()?))),
            0xd9 => {
                let n = usize::from(self.u8()?);
                self.str(n)
            }
            0xda => {
                let n = self.u16()?;
                self.str(n)
            }
            0xdb => {
                let n = self.u32()?;
                self.str(n)
            }
            0xdc => {
                let n = self.u16()?;
                self.container(n, false)
            }
            0xdd => {
                let n = self.u32()?;
                self.container(n, false)
            }
            0xde => {
                let n = self.u16()?;
                self.container(n, true)
            }
            0xdf => {
                let n = self.u32()?;
                self.container(n, true)
            }
            0xe0..=0xff => scalar(Scalar::Int(i64::from(marker as i8))),
            // 0xc1 is never used; 0xc7-0xc9 and 0xd4-0xd8 are ext types, which we reject.
            _ => Err(INVALID_PAYLOAD),
        }
    }
}

/// An open container: values still to read (a map counts keys and values).
struct Open {
    map: bool,
    remaining: usize,
}

fn payload<E>(reason: &'static str) -> ParseError<E> {
    ParseError::Payload(reason)
}

/// Where a parse stands between calls: the open containers, innermost last.
#[derive(Default)]
struct Parser {
    stack: Vec<Open>,
    started: bool,
}

impl Parser {
    /// Parses the tokens of `cur` until the record is complete (`true`) or the bytes so far
    /// end inside a token (`false`; the cursor then stops before that token).
    fn advance<S: Sink>(
        &mut self,
        cur: &mut Cursor<'_>,
        sink: &mut S,
    ) -> Result<bool, ParseError<S::Error>> {
        if !self.started {
            let Some(token) = cur.resumable_token().map_err(payload)? else {
                return Ok(false);
            };
            let Token::Map(entries) = token else {
                return Err(payload(NOT_A_MAP));
            };
            sink.begin_map(entries).map_err(ParseError::Sink)?;
            self.stack.push(Open {
                map: true,
                remaining: entries * 2,
            });
            self.started = true;
        }
        while let Some(top) = self.stack.last_mut() {
            if top.remaining == 0 {
                self.stack.pop();
                sink.end().map_err(ParseError::Sink)?;
                continue;
            }
            if S::IGNORES_FIXED_SCALARS && !top.map {
                top.remaining -= cur.skip_fixed_scalars(top.remaining);
                if top.remaining == 0 {
                    continue;
                }
            }
            let is_key = top.map && top.remaining % 2 == 0;
            let Some(token) = cur.resumable_token().map_err(payload)? else {
                return Ok(false);
            };
            top.remaining -= 1;
            if is_key {
                match token {
                    Token::Scalar(Scalar::Str(key)) => sink.key(key).map_err(ParseError::Sink)?,
                    _ => return Err(payload(NON_STRING_KEY)),
                }
                continue;
            }
            let (map, remaining) = match token {
                Token::Scalar(value) => {
                    sink.scalar(value).map_err(ParseError::Sink)?;
                    continue;
                }
                Token::Map(n) => (true, n * 2),
                Token::Array(n) => (false, n),
            };
            if self.stack.len() >= MAX_DEPTH {
                return Err(payload(TOO_DEEP));
            }
            if map {
                sink.begin_map(remaining / 2).map_err(ParseError::Sink)?;
            } else {
                sink.begin_array(remaining).map_err(ParseError::Sink)?;
            }
            self.stack.push(Open { map, remaining });
        }
        Ok(true)
    }
}

/// Parses one record: a map with string keys at every depth (nested at most [`MAX_DEPTH`]
/// levels), filling the whole payload.
pub fn parse_record<S: Sink>(buf: &[u8], sink: &mut S) -> Result<(), ParseError<S::Error>> {
    let mut cur = Cursor::new(buf);
    Parser::default().advance(&mut cur, sink)?;
    if cur.remaining() != 0 {
        return Err(payload(INVALID_PAYLOAD));
    }
    Ok(())
}

// Writer primitives: the smallest encoding of each value, as msgpack-python and msgspec write.

pub fn write_nil(out: &mut Vec<u8>) {
    out.push(0xc0);
}

pub fn write_bool(out: &mut Vec<u8>, value: bool) {
    out.push(if value { 0xc3 } else { 0xc2 });
}

pub fn write_uint(out: &mut Vec<u8>, value: u64) {
    if value < 0x80 {
        out.push(value as u8);
    } else if let Ok(v) = u8::try_from(value) {
        out.extend_from_slice(&[0xcc, v]);
    } else if let Ok(v) = u16::try_from(value) {
        out.push(0xcd);
        out.extend_from_slice(&v.to_be_bytes());
    } else if let Ok(v) = u32::try_from(value) {
        out.push(0xce);
        out.extend_from_slice(&v.to_be_bytes());
    } else {
        out.push(0xcf);
        out.extend_from_slice(&value.to_be_bytes());
    }
}

/// Non-negative values take the unsigned forms, negative ones the smallest signed form.
pub fn write_int(out: &mut Vec<u8>, value: i64) {
    if let Ok(v) = u64::try_from(value) {
        write_uint(out, v);
    } else if value >= -32 {
        out.push(value as i8 as u8);
    } else if let Ok(v) = i8::try_from(value) {
        out.extend_from_slice(&[0xd0, v as u8]);
    } else if let Ok(v) = i16::try_from(value) {
        out.push(0xd1);
        out.extend_from_slice(&v.to_be_bytes());
    } else if let Ok(v) = i32::try_from(value) {
        out.push(0xd2);
        out.extend_from_slice(&v.to_be_bytes());
    } else {
        out.push(0xd3);
        out.extend_from_slice(&value.to_be_bytes());
    }
}

pub fn write_float(out: &mut Vec<u8>, value: f64) {
    out.push(0xcb);
    out.extend_from_slice(&value.to_be_bytes());
}

/// Writes a length header in its smallest form: the fix form `(base, exclusive limit)` and the
/// 8-bit form where the type has them. `None` when the length exceeds 32 bits.
fn write_len(
    out: &mut Vec<u8>,
    len: usize,
    fix: Option<(u8, usize)>,
    m8: Option<u8>,
    m16: u8,
    m32: u8,
) -> Option<()> {
    match fix {
        Some((base, limit)) if len < limit => out.push(base | len as u8),
        _ => match (m8, u8::try_from(len), u16::try_from(len)) {
            (Some(marker), Ok(v), _) => out.extend_from_slice(&[marker, v]),
            (_, _, Ok(v)) => {
                out.push(m16);
                out.extend_from_slice(&v.to_be_bytes());
            }
            _ => {
                out.push(m32);
                out.extend_from_slice(&u32::try_from(len).ok()?.to_be_bytes());
            }
        },
    }
    Some(())
}

pub fn write_str(out: &mut Vec<u8>, value: &str) -> Option<()> {
    write_len(out, value.len(), Some((0xa0, 32)), Some(0xd9), 0xda, 0xdb)?;
    out.extend_from_slice(value.as_bytes());
    Some(())
}

pub fn write_bin_header(out: &mut Vec<u8>, len: usize) -> Option<()> {
    write_len(out, len, None, Some(0xc4), 0xc5, 0xc6)
}

pub fn write_array_header(out: &mut Vec<u8>, len: usize) -> Option<()> {
    write_len(out, len, Some((0x90, 16)), None, 0xdc, 0xdd)
}

pub fn write_map_header(out: &mut Vec<u8>, len: usize) -> Option<()> {
    write_len(out, len, Some((0x80, 16)), None, 0xde, 0xdf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ints_read_what_token_reads_for_every_integer_encoding() {
        let mut payload = Vec::new();
        let signed = [
            0,
            1,
            127,
            -1,
            -32,
            -33,
            -128,
            -129,
            -32768,
            -32769,
            i64::MIN,
            300,
        ];
        for value in signed {
            write_int(&mut payload, value);
        }
        let unsigned = [
            128,
            255,
            256,
            65535,
            65536,
            u64::from(u32::MAX),
            i64::MAX as u64,
        ];
        for value in unsigned {
            write_uint(&mut payload, value);
        }
        // Explicit wide encodings of small values, as other writers may emit them.
        payload.extend_from_slice(&[0xd0, 0x05, 0xd1, 0xff, 0xfe, 0xcf, 0, 0, 0, 0, 0, 0, 0, 9]);
        let mut slow = Cursor::new(&payload);
        let mut expected = Vec::new();
        let mut ends = Vec::new();
        while slow.remaining() > 0 {
            expected.push(match slow.token().unwrap() {
                Token::Scalar(Scalar::Int(i)) => i,
                Token::Scalar(Scalar::UInt(u)) => i64::try_from(u).unwrap(),
                other => panic!("{other:?}"),
            });
            ends.push(slow.pos);
        }
        // Every prefix length, then all at once (runs of one encoding and changes of encoding).
        for most in 0..=expected.len() {
            let mut fast = Cursor::new(&payload);
            let mut out = vec![7];
            assert_eq!(fast.ints(most, &mut out), most);
            assert_eq!(out[1..], expected[..most]);
            assert_eq!(fast.pos, if most == 0 { 0 } else { ends[most - 1] });
        }
        let mut fast = Cursor::new(&payload);
        let mut out = Vec::new();
        assert_eq!(fast.ints(usize::MAX, &mut out), expected.len());
        assert_eq!(fast.ints(1, &mut out), 0);
        // Not an int, an int beyond i64, a truncated int: left for token() to read or report.
        for bytes in [
            &[0xa1, b'x'][..],
            &[0xcf, 0xff, 0, 0, 0, 0, 0, 0, 0],
            &[0xd2, 0, 0],
            &[0xc0],
        ] {
            let mut cursor = Cursor::new(bytes);
            assert_eq!(cursor.ints(5, &mut Vec::new()), 0);
            assert_eq!(cursor.pos, 0);
            // After a run, the same values stop it where they start.
            let run = [&[0xcd, 1, 2, 0xcd, 3, 4][..], bytes].concat();
            let mut cursor = Cursor::new(&run);
            let mut out = Vec::new();
            assert_eq!(cursor.ints(5, &mut out), 2);
            assert_eq!((out, cursor.pos), (vec![258, 772], 6));
        }
    }

    /// Records the events as text, to check what the parser reports.
    #[derive(Default)]
    struct Trace(Vec<String>);

    impl Sink for Trace {
        type Error = ();
        fn scalar(&mut self, v: Scalar<'_>) -> Result<(), ()> {
            self.0.push(format!("{v:?}"));
            Ok(())
        }
        fn key(&mut self, k: &str) -> Result<(), ()> {
            self.0.push(format!("key {k}"));
            Ok(())
        }
        fn begin_map(&mut self, n: usize) -> Result<(), ()> {
            self.0.push(format!("map {n}"));
            Ok(())
        }
        fn begin_array(&mut self, n: usize) -> Result<(), ()> {
            self.0.push(format!("array {n}"));
            Ok(())
        }
        fn end(&mut self) -> Result<(), ()> {
            self.0.push("end".into());
            Ok(())
        }
    }

    #[test]
    fn parses_nested_record() {
        // {"a": [1, -1, nil, true], "b": {"c": b"\x00"}, "d": 1.5 (f32)}
        let payload = [
            0x83, 0xa1, b'a', 0x94, 0x01, 0xff, 0xc0, 0xc3, 0xa1, b'b', 0x81, 0xa1, b'c', 0xc4,
            0x01, 0x00, 0xa1, b'd', 0xca, 0x3f, 0xc0, 0x00, 0x00,
        ];
        let mut trace = Trace::default();
        parse_record(&payload, &mut trace).unwrap();
        let expected = [
            "map 3",
            "key a",
            "array 4",
            "UInt(1)",
            "Int(-1)",
            "Nil",
            "Bool(true)",
            "end",
            "key b",
            "map 1",
            "key c",
            "Bin([0])",
            "end",
            "key d",
            "Float(1.5)",
            "end",
        ];
        assert_eq!(trace.0, expected);
    }

    #[test]
    fn rejects_with_distinct_reasons() {
        let cases: &[(&[u8], &str)] = &[
            (&[], INVALID_PAYLOAD),
            (&[0x93, 0x01, 0x02, 0x03], NOT_A_MAP),
            (&[0xa1, b'x'], NOT_A_MAP),
            (&[0x81, 0x01, 0x02], NON_STRING_KEY),
            (&[0x81, 0xa1, b'k', 0x91, 0x81, 0x02, 0x03], NON_STRING_KEY),
            (&[0x81, 0xa1, b'k', 0xd4, 0x01, 0x02], INVALID_PAYLOAD),
            (&[0x81, 0xa1, b'k', 0xc1], INVALID_PAYLOAD),
            (&[0x81, 0xa1, 0xff, 0x01], INVALID_PAYLOAD),
            (&[0x81, 0xa1, b'k'], INVALID_PAYLOAD),
            (&[0x80, 0x00], INVALID_PAYLOAD),
            (&[0xdf, 0xff, 0xff, 0xff, 0xff], INVALID_PAYLOAD),
            (&[0xc1], INVALID_PAYLOAD),
        ];
        for (bytes, reason) in cases {
            assert_eq!(validate_record(bytes), Err(*reason), "{bytes:x?}");
        }
    }

    /// The root map holding `arrays` arrays nested in each other, the innermost holding nil.
    fn nested(arrays: usize) -> Vec<u8> {
        let mut payload = vec![0x81, 0xa1, b'k'];
        payload.extend(std::iter::repeat_n(0x91, arrays));
        payload.push(0xc0);
        payload
    }

    #[test]
    fn nesting_is_bounded_at_the_writers_depth() {
        assert_eq!(validate_record(&nested(MAX_DEPTH - 1)), Ok(()));
        assert_eq!(validate_record(&nested(MAX_DEPTH)), Err(TOO_DEEP));
        assert_eq!(validate_record(&nested(1_000_000)), Err(TOO_DEEP));
    }

    /// Feeds `payload` in growing prefixes of `step` bytes, as decompression produces it.
    fn stream_validate(payload: &[u8], step: usize) -> Result<(), &'static str> {
        let mut validator = StreamValidator::default();
        let mut end = 0;
        while end < payload.len() {
            end = (end + step).min(payload.len());
            // Here the limit is the payload's own size, so running past it is invalid.
            validator
                .feed(&payload[..end], payload.len())
                .map_err(|r| {
                    if r == BEYOND_LIMIT {
                        INVALID_PAYLOAD
                    } else {
                        r
                    }
                })?;
        }
        validator.finish(payload)
    }

    #[test]
    fn stream_validation_agrees_with_whole_validation() {
        let payloads: &[&[u8]] = &[
            &[
                0x83, 0xa1, b'a', 0x94, 0x01, 0xff, 0xc0, 0xc3, 0xa1, b'b', 0x81, 0xa1, b'c', 0xc4,
                0x01, 0x00, 0xa1, b'd', 0xca, 0x3f, 0xc0, 0x00, 0x00,
            ],
            &[0x81, 0xa1, b'k', 0xda, 0x00, 0x03, b'x', b'y', b'z'],
            &[0x81, 0xa1, b'k', 0xc4, 0x05, 1, 2],
            &[0x81, 0xa1, b'k', 0x01, 0x02],
            &[0x80, 0x80],
            &[0x93, 0x01, 0x02, 0x03],
            &[0x81, 0x01, 0x02],
            &[0x81, 0xa1, 0xff, 0x01],
            &[0xdf, 0xff, 0xff, 0xff, 0xff],
            &[],
        ];
        for payload in payloads
            .iter()
            .copied()
            .chain([&nested(2000)[..], &nested(999)[..]])
        {
            for step in [1, 2, 3, 7, 1 << 20] {
                assert_eq!(
                    stream_validate(payload, step),
                    validate_record(payload),
                    "{payload:x?} in steps of {step}"
                );
            }
        }
    }

    #[test]
    fn stream_validation_stops_at_the_first_bad_byte() {
        // The depth error is found in the first 1004 bytes of a far longer payload.
        let payload = nested(10_000);
        let mut validator = StreamValidator::default();
        assert_eq!(
            validator.feed(&payload[..1004], payload.len()),
            Err(TOO_DEEP)
        );
        let mut validator = StreamValidator::default();
        assert_eq!(validator.feed(&[0x90], 100), Err(NOT_A_MAP));
    }

    #[test]
    fn writes_smallest_integers() {
        let cases: &[(i64, &[u8])] = &[
            (0, &[0x00]),
            (127, &[0x7f]),
            (128, &[0xcc, 0x80]),
            (256, &[0xcd, 0x01, 0x00]),
            (65536, &[0xce, 0, 1, 0, 0]),
            (-1, &[0xff]),
            (-32, &[0xe0]),
            (-33, &[0xd0, 0xdf]),
            (-129, &[0xd1, 0xff, 0x7f]),
            (-32769, &[0xd2, 0xff, 0xff, 0x7f, 0xff]),
            (i64::MIN, &[0xd3, 0x80, 0, 0, 0, 0, 0, 0, 0]),
        ];
        for (value, bytes) in cases {
            let mut out = Vec::new();
            write_int(&mut out, *value);
            assert_eq!(&out[..], *bytes, "{value}");
        }
        let mut out = Vec::new();
        write_uint(&mut out, u64::MAX);
        assert_eq!(out, [0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]);
    }

    #[test]
    fn writes_smallest_lengths() {
        let mut out = Vec::new();
        write_str(&mut out, &"x".repeat(31)).unwrap();
        assert_eq!(out[0], 0xbf);
        out.clear();
        write_str(&mut out, &"x".repeat(32)).unwrap();
        assert_eq!(&out[..2], &[0xd9, 32]);
        out.clear();
        write_array_header(&mut out, 16).unwrap();
        assert_eq!(out, [0xdc, 0, 16]);
        out.clear();
        write_map_header(&mut out, 15).unwrap();
        assert_eq!(out, [0x8f]);
        out.clear();
        write_bin_header(&mut out, 3).unwrap();
        assert_eq!(out, [0xc4, 3]);
        out.clear();
        write_map_header(&mut out, 70000).unwrap();
        assert_eq!(out, [0xdf, 0, 1, 0x11, 0x70]);
    }
}
