//! Every entry of every block, read through the reader's own line splitter, gives exactly the
//! records a read of the whole shard gives for that block.

use bytes::Bytes;

use super::*;
use crate::codec::gzip::{GzipEntry, GzipWriter};
use crate::codec::lines::JsonlLines;
use crate::codec::RecordRange;
use crate::source::MemorySource;

/// A deterministic text of `n` lines: records of varied length, some blank lines, some lines
/// that are not JSON objects, and long ones.
fn text(n: usize, seed: u64) -> Vec<u8> {
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let mut next = || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        state >> 33
    };
    let mut out = String::new();
    for i in 0..n {
        match next() % 23 {
            0 => out.push('\n'),
            1 => out.push_str("not json\n"),
            2 => out.push_str("[1, 2]\n"),
            3 => out.push_str(&format!(
                "{{\"i\": {i}, \"long\": \"{}\"}}\n",
                "x".repeat(40_000)
            )),
            _ => {
                let words = (next() % 40) as usize;
                let body: Vec<String> = (0..words)
                    .map(|w| format!("w{}", next() % (w as u64 + 7)))
                    .collect();
                out.push_str(&format!("{{\"i\": {i}, \"t\": \"{}\"}}\n", body.join(" ")));
            }
        }
    }
    out.into_bytes()
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut w = GzipWriter::new();
    w.write(data, &mut out).unwrap();
    w.finish(&mut out).unwrap();
    out
}

fn build(data: &[u8], block: u64, chunk: usize) -> Result<(u64, Vec<BlockEntry>), String> {
    build_steps(data, block, block, chunk)
}

fn build_steps(
    data: &[u8],
    block: u64,
    step: u64,
    chunk: usize,
) -> Result<(u64, Vec<BlockEntry>), String> {
    let mut points = AccessPoints::new(block, step)?;
    let mut entries = Vec::new();
    for piece in data.chunks(chunk) {
        points.feed(piece).map_err(reason)?;
        entries.extend(points.take_entries());
    }
    points.finish().map_err(reason)?;
    entries.extend(points.take_entries());
    Ok((points.records(), entries))
}

fn reason(failure: DecodeFailure) -> String {
    match failure {
        DecodeFailure::Shard(r) => r,
        DecodeFailure::Source(e) => e.to_string(),
    }
}

/// The lines (number, text) a read of `range` yields, from `entry` when given.
fn read(
    data: &[u8],
    range: RecordRange,
    entry: Option<&BlockEntry>,
) -> Result<Vec<(u64, String)>, String> {
    let (bytes, gz_entry) = match entry {
        None => (data.to_vec(), None),
        Some(e) => {
            let start = (e.start_bit / 8) as usize;
            let unused = ((8 - e.start_bit % 8) % 8) as u8;
            let entry = GzipEntry {
                member_start: e.member_start,
                unused_bits: unused,
                window: e.window.clone(),
                skip: e.skip,
                first_record: e.first_record,
                first_line: e.first_line,
            };
            let end = if range.reaches_end() {
                data.len()
            } else {
                e.end_byte as usize
            };
            (data[start..end].to_vec(), Some(entry))
        }
    };
    let chunks: Vec<Bytes> = bytes.chunks(977).map(Bytes::copy_from_slice).collect();
    let mut lines = JsonlLines::open(
        Box::new(MemorySource::new(chunks)),
        range,
        gz_entry.as_ref(),
    );
    let mut out = Vec::new();
    while let Some(batch) = lines.next_batch().map_err(reason)? {
        for line in &batch.lines {
            out.push((
                line.number,
                String::from_utf8(batch.line(line).to_vec()).unwrap(),
            ));
        }
    }
    Ok(out)
}

/// A whole read's lines, each with the number of records before it.
fn counted(whole: Vec<(u64, String)>) -> Vec<(u64, (u64, String))> {
    let mut records = 0;
    whole
        .into_iter()
        .map(|line| {
            let before = records;
            records += u64::from(is_json_record(line.1.as_bytes()));
            (before, line)
        })
        .collect()
}

/// What a range read of records [start, stop) yields, cut from a whole read's lines: the lines
/// after record `start - 1` through record `stop - 1` (invalid lines between are handed on).
fn expected(whole: &[(u64, (u64, String))], start: u64, stop: u64) -> Vec<(u64, String)> {
    let first = whole.partition_point(|(before, _)| *before < start);
    let end = whole.partition_point(|(before, _)| *before < stop);
    whole[first..end]
        .iter()
        .map(|(_, line)| line.clone())
        .collect()
}

fn check_every_block(data: &[u8], block: u64) {
    let (records, entries) = build(data, block, 4093).unwrap();
    let whole = counted(read(data, RecordRange::full(records), None).unwrap());
    let (again, same) = build(data, block, 1 << 20).unwrap();
    assert_eq!(
        (records, &entries),
        (again, &same),
        "the entries do not depend on chunking"
    );
    let blocks = records.div_ceil(block).max(1);
    assert_eq!(entries.len() as u64, blocks);
    assert_eq!(entries[0].start_bit, 0);
    for (k, entry) in entries.iter().enumerate().skip(1) {
        let k = k as u64;
        let (start, stop) = (k * block, ((k + 1) * block).min(records));
        assert!(entry.first_record <= start, "block {k}");
        assert!(entry.window.len() <= WINDOW_BYTES);
        assert!(entry.end_byte <= data.len() as u64);
        let range = RecordRange::new(records, start as i64, Some(stop as i64)).unwrap();
        let entered = read(data, range, Some(entry)).unwrap();
        assert_eq!(
            entered,
            expected(&whole, start, stop),
            "block {k} of {blocks}"
        );
        // A read that ends at the next block's entry's end, from this entry.
        if k + 1 < blocks {
            let stop = (k + 2) * block;
            let range =
                RecordRange::new(records, start as i64, Some(stop.min(records) as i64)).unwrap();
            let mut wide = entry.clone();
            wide.end_byte = entries[k as usize + 1].end_byte;
            let stop = stop.min(records);
            assert_eq!(
                read(data, range, Some(&wide)).unwrap(),
                expected(&whole, start, stop)
            );
        }
    }
}

#[test]
fn every_block_read_from_its_entry_equals_the_whole_read() {
    let plain = text(4_000, 1);
    let data = gzip(&plain);
    // (Blocks of one record, an entry per line, are checked on a smaller text below.)
    for block in [5, 250, 1_000, 5_000] {
        check_every_block(&data, block);
    }
}

#[test]
fn steps_restart_at_every_block() {
    let plain = text(3_000, 5);
    let data = gzip(&plain);
    let (block, step) = (700u64, 300u64);
    let (records, entries) = build_steps(&data, block, step, 1 << 14).unwrap();
    // Steps start at 0, 300, 600 of every block of 700: records 0, 300, 600, 700, 1000, ...
    let firsts: Vec<u64> = (0..records).filter(|n| (n % block) % step == 0).collect();
    assert_eq!(entries.len(), firsts.len());
    let whole = counted(read(&data, RecordRange::full(records), None).unwrap());
    for (entry, (k, &first)) in entries.iter().zip(firsts.iter().enumerate()).skip(1) {
        let stop = firsts.get(k + 1).copied().unwrap_or(records);
        let range = RecordRange::new(records, first as i64, Some(stop as i64)).unwrap();
        assert!(entry.first_record <= first);
        let entered = read(&data, range, Some(entry)).unwrap();
        assert_eq!(entered, expected(&whole, first, stop), "step {k}");
    }
}

#[test]
fn entries_cross_members_and_header_fields() {
    let plain = text(3_000, 2);
    let mut data = Vec::new();
    for part in plain.chunks(30_011) {
        // Members that split lines, some with a name and comment.
        let mut encoder = flate2::GzBuilder::new()
            .filename("part.jsonl")
            .comment("c")
            .write(Vec::new(), flate2::Compression::new(6));
        std::io::Write::write_all(&mut encoder, part).unwrap();
        data.extend(encoder.finish().unwrap());
    }
    data.extend(gzip(b""));
    for block in [3, 40, 333] {
        check_every_block(&data, block);
    }
}

#[test]
fn a_last_line_without_newline_and_blank_runs() {
    let mut plain = b"\n\n{\"a\": 1}\n\n\n{\"a\": 2}\nnope\n".to_vec();
    plain.extend(text(2_000, 3));
    plain.extend(b"{\"last\": true}");
    check_every_block(&gzip(&plain), 5);
    check_every_block(&gzip(&text(300, 6)), 1);
}

#[test]
fn refuses_what_the_reader_refuses() {
    let data = gzip(b"{\"a\": 1}\n");
    assert_eq!(build(&data[..data.len() - 1], 1, 3).unwrap_err(), TRUNCATED);
    assert_eq!(build(&[], 1, 3).unwrap_err(), TRUNCATED);
    let mut bad = data.clone();
    let n = bad.len();
    bad[n - 6] ^= 1;
    assert_eq!(build(&bad, 1, 3).unwrap_err(), CORRUPT);
    let mut trailing = data.clone();
    trailing.push(b'\n');
    assert_eq!(build(&trailing, 1, 3).unwrap_err(), TRAILING);
    let invalid = gzip(b"{\"a\": 1}\n{\"b\": \"\xff\"}\n");
    assert_eq!(
        build(&invalid, 1, 3).unwrap_err(),
        "invalid UTF-8 in line 2"
    );
}

#[test]
fn an_entry_past_the_range_is_refused() {
    let plain = text(3_000, 4);
    let data = gzip(&plain);
    let (records, entries) = build(&data, 1_000, 1 << 16).unwrap();
    assert!(entries[2].first_record > 10);
    let range = RecordRange::new(records, 10, Some(20)).unwrap();
    let error = read(&data, range, Some(&entries[2])).unwrap_err();
    assert!(
        error.contains("after the range's first record 10"),
        "{error}"
    );
}
