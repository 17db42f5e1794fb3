//! Raw MessagePack payloads: the parser never panics, what it accepts is balanced, the
//! validator's fast pass over scalar runs agrees with the event-by-event parse, and the
//! columnar int runs read what the token reader reads.
#![no_main]

use libfuzzer_sys::fuzz_target;
use syvain_core::codec::msgpack::{
    parse_record, validate_record, Cursor, ParseError, Scalar, Sink, StreamValidator, Token,
};

/// Checks the event stream: containers close in order, keys alternate with values.
#[derive(Default)]
struct Balance {
    open: Vec<(bool, usize)>,
    expect_value: bool,
    closed_top: bool,
}

impl Balance {
    fn value(&mut self) {
        assert!(!self.closed_top, "event after the record ended");
        if let Some((is_map, seen)) = self.open.last_mut() {
            if *is_map {
                assert!(self.expect_value, "map value without a key");
                self.expect_value = false;
            }
            *seen += 1;
        }
    }
}

impl Sink for Balance {
    type Error = ();
    fn scalar(&mut self, _: Scalar<'_>) -> Result<(), ()> {
        self.value();
        Ok(())
    }
    fn key(&mut self, _: &str) -> Result<(), ()> {
        assert!(matches!(self.open.last(), Some((true, _))) && !self.expect_value);
        self.expect_value = true;
        Ok(())
    }
    fn begin_map(&mut self, _len: usize) -> Result<(), ()> {
        if !self.open.is_empty() {
            self.value();
        }
        self.open.push((true, 0));
        Ok(())
    }
    fn begin_array(&mut self, _len: usize) -> Result<(), ()> {
        assert!(!self.open.is_empty(), "a record must be a map");
        self.value();
        self.open.push((false, 0));
        Ok(())
    }
    fn end(&mut self) -> Result<(), ()> {
        assert!(!self.expect_value, "map closed after a key");
        self.open.pop().expect("end without an open container");
        self.closed_top = self.open.is_empty();
        Ok(())
    }
}

fuzz_target!(|data: &[u8]| {
    let mut sink = Balance::default();
    let parsed = parse_record(data, &mut sink);
    if parsed.is_ok() {
        assert!(sink.closed_top && sink.open.is_empty());
    }
    let reason = parsed.map_err(|error| match error {
        ParseError::Payload(reason) => reason,
        ParseError::Sink(()) => unreachable!("Balance asserts instead of failing"),
    });
    assert_eq!(validate_record(data), reason);
    // Fed in pieces, as while decompressing: the same verdict (or an earlier refusal).
    let mut stream = StreamValidator::default();
    let step = 1 + data.first().map_or(0, |&b| usize::from(b % 7));
    let mut fed = Ok(());
    for end in (step..data.len()).step_by(step) {
        fed = stream.feed(&data[..end], data.len());
        if fed.is_err() {
            break;
        }
    }
    match fed {
        Ok(()) => assert_eq!(stream.finish(data), reason),
        Err(_) => assert!(reason.is_err()),
    }
    int_runs_match_tokens(data);
});

/// `Cursor::ints` takes exactly the leading ints that fit an i64, as `token` reads them.
fn int_runs_match_tokens(data: &[u8]) {
    let mut fast = Cursor::new(data);
    let mut ints = Vec::new();
    let taken = fast.ints(usize::MAX, &mut ints);
    let mut slow = Cursor::new(data);
    let (mut expected, mut remaining) = (Vec::new(), data.len());
    while let Ok(Token::Scalar(scalar)) = slow.token() {
        let value = match scalar {
            Scalar::Int(value) => value,
            Scalar::UInt(value) => match i64::try_from(value) {
                Ok(value) => value,
                Err(_) => break,
            },
            _ => break,
        };
        expected.push(value);
        remaining = slow.remaining();
    }
    assert_eq!(taken, ints.len());
    assert_eq!(ints, expected);
    assert_eq!(fast.remaining(), remaining);
}
