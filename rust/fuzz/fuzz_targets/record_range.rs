//! Record-range reads of both native formats: skipping by length headers (msgpack.zstf) or by
//! newlines (jsonl.gz), stopping after the range, and the partial-read count rules.
#![no_main]

use libfuzzer_sys::fuzz_target;
use syvain_core::codec::columnar::is_json_record;
use syvain_core::codec::lines::JsonlLines;
use syvain_core::codec::msgpack::validate_record;
use syvain_core::codec::zstf::ZstfFrames;
use syvain_core::codec::RecordRange;

#[path = "common.rs"]
mod common;

fuzz_target!(|data: &[u8]| {
    // Two more leading bytes: the range's start and stop (clamped into the declared count);
    // the low bit of the start byte picks the format.
    let Some((&[start_byte, stop_byte], rest)) = data.split_first_chunk::<2>() else {
        return;
    };
    let Some((source, declared)) = common::split(rest) else {
        return;
    };
    let stop = u64::from(stop_byte).min(declared);
    let start = u64::from(start_byte >> 1).min(stop);
    let range = RecordRange::new(declared, start as i64, Some(stop as i64)).expect("in range");
    if start_byte & 1 == 0 {
        let mut frames = ZstfFrames::with_range(Box::new(source), range)
            .with_payload_limit(1 << 20)
            .with_object_size(rest.len().saturating_sub(2) as u64);
        let mut read = 0;
        while let Ok(Some(payload)) = frames.next_payload() {
            read += 1;
            assert!(read <= stop - start);
            assert!(frames.frames() <= stop);
            assert_eq!(validate_record(&payload), Ok(()));
        }
    } else {
        // A full range (0..declared) keeps the whole-shard semantics: the record count is
        // checked where lines become records (under the GIL), not by `JsonlLines`.
        let bounded = !range.is_full();
        let mut lines = JsonlLines::new(Box::new(source))
            .with_range(range)
            .with_max_line(64 * 1024);
        // Lines that are not records (not a JSON object) are handed on to be logged, but
        // a range holds at most its own records.
        let mut kept = 0;
        while let Ok(Some(batch)) = lines.next_batch() {
            let line = |line: &&_| is_json_record(batch.line(line));
            kept += batch.lines.iter().filter(line).count() as u64;
            assert!(!bounded || kept <= stop - start);
        }
    }
});
