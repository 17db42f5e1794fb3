//! Whole jsonl.gz shards: gzip members, trailing bytes, UTF-8, line splitting and limits.
#![no_main]

use libfuzzer_sys::fuzz_target;
use syvain_core::codec::lines::{nesting_exceeds, JsonlLines};

#[path = "common.rs"]
mod common;

fuzz_target!(|data: &[u8]| {
    // The record count is checked where lines become records, under the GIL.
    let Some((source, _declared)) = common::split(data) else {
        return;
    };
    // A small line limit keeps each run fast and exercises the "line too long" paths.
    let max_line = 64 * 1024;
    let mut lines = JsonlLines::new(Box::new(source)).with_max_line(max_line);
    let mut last_number = 0;
    while let Ok(Some(batch)) = lines.next_batch() {
        assert!(!batch.lines.is_empty());
        for line in &batch.lines {
            assert!(line.number > last_number);
            last_number = line.number;
            let text = std::str::from_utf8(batch.line(line)).expect("lines are valid UTF-8");
            assert!(!text.contains('\n') && !text.trim().is_empty());
            assert!(text.len() as u64 <= max_line);
            // The depth check of lines too deep for jiter: any text, no panic, bounded.
            if nesting_exceeds(text.as_bytes(), 1000) {
                assert!(text.len() > 1000);
            }
        }
    }
});
