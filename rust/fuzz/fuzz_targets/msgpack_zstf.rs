//! Whole msgpack.zstf shards: framing, zstd limits, MessagePack validation, record count.
#![no_main]

use _native::codec::msgpack::validate_record;
use _native::codec::zstf::ZstfFrames;
use libfuzzer_sys::fuzz_target;

#[path = "common.rs"]
mod common;

fuzz_target!(|data: &[u8]| {
    let Some(input) = common::split(data) else {
        return;
    };
    // A small payload limit keeps each run fast and exercises the "payload too large" paths.
    let mut frames = ZstfFrames::new(Box::new(input.source), input.declared).with_payload_limit(1 << 20);
    while let Ok(Some(payload)) = frames.next_payload() {
        assert!(frames.frames() <= input.declared);
        assert!(payload.len() <= 1 << 20);
        assert_eq!(validate_record(&payload), Ok(()));
    }
});
