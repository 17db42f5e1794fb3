//! Whole msgpack.zstf shards: framing, zstd limits, MessagePack validation, record count.
#![no_main]

use libfuzzer_sys::fuzz_target;
use syvain_core::codec::msgpack::validate_record;
use syvain_core::codec::zstf::ZstfFrames;

#[path = "common.rs"]
mod common;

fuzz_target!(|data: &[u8]| {
    let Some((source, declared)) = common::split(data) else {
        return;
    };
    // A small payload limit keeps each run fast and exercises the "payload too large" paths.
    let mut frames = ZstfFrames::new(Box::new(source), declared).with_payload_limit(1 << 20);
    while let Ok(Some(payload)) = frames.next_payload() {
        assert!(frames.frames() <= declared);
        assert!(payload.len() <= 1 << 20);
        assert_eq!(validate_record(&payload), Ok(()));
    }
});
