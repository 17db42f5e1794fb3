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

mod cursor;
mod write;

pub use cursor::{Cursor, Token};
pub use write::{
    write_array_header, write_bin_header, write_bool, write_float, write_int, write_map_header,
    write_nil, write_str, write_uint,
};

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
