//! jsonl.gz entered mid-stream: the access point builder over arbitrary bytes, and a read
//! entered with an arbitrary (hostile) entry. Neither may panic; an entry the builder made
//! reads exactly the records a whole read yields for its block.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use syvain_core::codec::gzip::GzipEntry;
use syvain_core::codec::gzip_points::AccessPoints;
use syvain_core::codec::lines::JsonlLines;
use syvain_core::codec::RecordRange;
use syvain_core::source::MemorySource;

fn lines(data: &[u8], range: RecordRange, entry: Option<&GzipEntry>) -> Option<Vec<Vec<u8>>> {
    let chunks: Vec<Bytes> = data.chunks(61).map(Bytes::copy_from_slice).collect();
    let mut reader = JsonlLines::open(Box::new(MemorySource::new(chunks)), range, entry)
        .with_max_line(64 * 1024);
    let mut out = Vec::new();
    loop {
        match reader.next_batch() {
            Ok(Some(batch)) => out.extend(batch.lines.iter().map(|l| batch.line(l).to_vec())),
            Ok(None) => return Some(out),
            Err(_) => return None,
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&[block, unused, skip, first, window], rest)) = data.split_first_chunk::<5>() else {
        return;
    };
    // A hostile entry: any bits, window, skip and first record over any bytes.
    let window_len = usize::from(window).min(rest.len());
    let (window, shard) = rest.split_at(window_len);
    let hostile = GzipEntry {
        member_start: unused & 0x80 != 0,
        unused_bits: unused & 7,
        window: window.to_vec(),
        skip: u64::from(skip),
        first_record: u64::from(first >> 4),
        first_line: 0,
    };
    let range = RecordRange::new(64, i64::from(first & 0x3f), Some(64)).expect("in range");
    let _ = lines(shard, range, Some(&hostile));

    // The builder over the same bytes, in chunks as a stream would cut them.
    let Ok(mut points) = AccessPoints::new(u64::from(block.max(1)), u64::from(block.max(1))) else {
        return;
    };
    let mut entries = Vec::new();
    let mut ok = true;
    for piece in rest.chunks(usize::from(unused.max(1))) {
        if points.feed(piece).is_err() {
            ok = false;
            break;
        }
        entries.extend(points.take_entries());
    }
    if !ok || points.finish().is_err() {
        return;
    }
    entries.extend(points.take_entries());
    let records = points.records();
    let block = u64::from(block.max(1));
    for (k, e) in entries.iter().enumerate().skip(1) {
        let start = k as u64 * block;
        let stop = (start + block).min(records);
        let range = RecordRange::new(records, start as i64, Some(stop as i64)).expect("in range");
        let entry = GzipEntry {
            member_start: e.member_start,
            unused_bits: ((8 - e.start_bit % 8) % 8) as u8,
            window: e.window.clone(),
            skip: e.skip,
            first_record: e.first_record,
            first_line: e.first_line,
        };
        let end = if stop == records {
            rest.len()
        } else {
            e.end_byte as usize
        };
        let entered = lines(&rest[(e.start_bit / 8) as usize..end], range, Some(&entry));
        // (A whole read may fail earlier, on a line over the limit before the block.)
        if let Some(whole) = lines(rest, range, None) {
            assert_eq!(entered, Some(whole), "block {k}");
        }
    }
});
