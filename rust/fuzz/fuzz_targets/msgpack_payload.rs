//! Raw MessagePack payloads: the parser never panics, and what it accepts is balanced.
#![no_main]

use syvain_core::codec::msgpack::{parse_record, Scalar, Sink};
use libfuzzer_sys::fuzz_target;

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
    if parse_record(data, &mut sink).is_ok() {
        assert!(sink.closed_top && sink.open.is_empty());
    }
});
