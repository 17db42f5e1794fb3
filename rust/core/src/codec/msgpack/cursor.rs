//! The token reader: bounds-checked reads of MessagePack items off a payload that may still be
//! arriving, and tight loops for runs of ints (token id lists).

use super::{Scalar, BEYOND_LIMIT, INCOMPLETE, INVALID_PAYLOAD};

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
    pub(super) pos: usize,
    /// `Some(limit)` while the payload is still arriving (it may grow up to `limit` bytes): a
    /// token running past `buf` is then incomplete rather than invalid.
    partial: Option<usize>,
}

impl<'a> Cursor<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Self::resume(buf, 0, None)
    }

    pub(super) fn resume(buf: &'a [u8], pos: usize, partial: Option<usize>) -> Self {
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
    pub(super) fn skip_fixed_scalars(&mut self, most: usize) -> usize {
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
    pub(super) fn resumable_token(&mut self) -> Result<Option<Token<'a>>, &'static str> {
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
