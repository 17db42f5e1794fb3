//! The codecs end to end with no Python: records serialized by hand, compressed by the
//! encoders' compressor, then read back by the record decoder thread and the columnar one.

mod common;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::Array;
use bytes::Bytes;
use syvain_core::caller::Uninterrupted;
use syvain_core::codec::columnar::{self, count_records, BatchOptions};
use syvain_core::codec::compress::ShardCompressor;
use syvain_core::codec::decoder::{Batch, Decoder, Message};
use syvain_core::codec::msgpack::{write_int, write_map_header, write_str};
use syvain_core::codec::{DecodeFailure, RecordRange, ShardFormat};
use syvain_core::error::NativeError;
use syvain_core::source::{ByteSource, MemorySource};

/// `{"id": i, "text": "record i"}` as a MessagePack payload.
fn msgpack_record(i: i64) -> Vec<u8> {
    let mut out = Vec::new();
    write_map_header(&mut out, 2).unwrap();
    write_str(&mut out, "id").unwrap();
    write_int(&mut out, i);
    write_str(&mut out, "text").unwrap();
    write_str(&mut out, &format!("record {i}")).unwrap();
    out
}

fn json_record(i: i64) -> Vec<u8> {
    format!("{{\"id\": {i}, \"text\": \"record {i}\"}}").into_bytes()
}

/// A whole shard of `count` records, submitted in batches of `per_call`.
fn encode(format: ShardFormat, count: i64, per_call: i64) -> Vec<u8> {
    let mut compressor = ShardCompressor::new(format).unwrap();
    let mut chunks = Vec::new();
    let mut i = 0;
    while i < count {
        let mut batch = compressor.batch();
        for record in i..(i + per_call).min(count) {
            let start = batch.data.len();
            match format {
                ShardFormat::MsgpackZstf => batch.data.extend(msgpack_record(record)),
                ShardFormat::JsonlGz => {
                    batch.data.extend(json_record(record));
                    batch.data.push(b'\n');
                }
            }
            batch.end_record(start);
        }
        compressor.submit(&Uninterrupted, batch).unwrap();
        compressor.ready(&mut chunks).unwrap();
        i += per_call;
    }
    compressor.finish(&Uninterrupted, &mut chunks).unwrap();
    let mut more = Vec::new();
    compressor.finish(&Uninterrupted, &mut more).unwrap();
    assert!(more.is_empty(), "a second finish hands out nothing");
    assert!(matches!(
        compressor.check("encode"),
        Err(NativeError::Encode(message)) if message.contains("after finish")
    ));
    chunks.concat()
}

fn source(shard: &[u8], chunk: usize) -> Box<MemorySource> {
    let chunks: Vec<Bytes> = shard.chunks(chunk).map(Bytes::copy_from_slice).collect();
    Box::new(MemorySource::new(chunks))
}

/// Every record the decoder hands on, as (payload or line bytes), and how it ended.
fn decode_all(mut decoder: Decoder) -> (Vec<Vec<u8>>, Option<DecodeFailure>) {
    let mut records = Vec::new();
    while let Some(message) = decoder.next(&Uninterrupted).unwrap() {
        match message {
            Message::Batch(Batch::Payloads(mut payloads)) => {
                while let Some(payload) = payloads.take_next() {
                    records.push(payload.to_vec());
                }
            }
            Message::Batch(Batch::Lines(lines, _)) => {
                records.extend(lines.lines.iter().map(|line| lines.line(line).to_vec()));
            }
            Message::End => return (records, None),
            Message::Failed(failure) => return (records, Some(failure)),
        }
    }
    panic!("the decoder stopped without an end");
}

#[test]
fn msgpack_shards_round_trip_through_the_record_decoder() {
    let shard = encode(ShardFormat::MsgpackZstf, 2000, 300);
    assert_eq!(
        count_records(ShardFormat::MsgpackZstf, &shard).unwrap(),
        2000
    );
    for chunk in [1, 7, 4096, shard.len()] {
        let range = RecordRange::full(2000);
        let decoder = Decoder::start(
            ShardFormat::MsgpackZstf,
            "mem://shard",
            source(&shard, chunk),
            shard.len() as u64,
            range,
        )
        .unwrap();
        let (records, failure) = decode_all(decoder);
        assert!(failure.is_none());
        let expected: Vec<_> = (0..2000).map(msgpack_record).collect();
        assert_eq!(records, expected, "chunk {chunk}");
    }
}

/// Memory chunks handed over as a network stream would be: its decoder runs on its thread
/// from the start.
struct Remote(MemorySource);

impl ByteSource for Remote {
    fn next_chunk(&mut self) -> Result<Option<Bytes>, NativeError> {
        self.0.next_chunk()
    }
}

#[test]
fn a_remote_source_decodes_the_same_records_on_its_thread() {
    let shard = encode(ShardFormat::MsgpackZstf, 700, 100);
    let chunks: Vec<Bytes> = shard.chunks(100).map(Bytes::copy_from_slice).collect();
    let remote = Box::new(Remote(MemorySource::new(chunks)));
    assert!(!remote.is_immediate());
    let decoder = Decoder::start(
        ShardFormat::MsgpackZstf,
        "s3://bucket/shard",
        remote,
        shard.len() as u64,
        RecordRange::full(700),
    )
    .unwrap();
    let (records, failure) = decode_all(decoder);
    assert!(failure.is_none());
    assert_eq!(records, (0..700).map(msgpack_record).collect::<Vec<_>>());
}

#[test]
fn a_shard_that_fails_at_its_first_record_reports_it_without_a_thread() {
    let decoder = Decoder::start(
        ShardFormat::MsgpackZstf,
        "mem://shard",
        source(b"\x00\x00", 2),
        2,
        RecordRange::full(1),
    )
    .unwrap();
    let (records, failure) = decode_all(decoder);
    assert!(records.is_empty());
    assert!(
        matches!(failure, Some(DecodeFailure::Shard(_))),
        "{failure:?}"
    );
}

#[test]
fn a_record_range_skips_without_decoding_and_stops_after_it() {
    let shard = encode(ShardFormat::MsgpackZstf, 500, 500);
    let range = RecordRange::new(500, 120, Some(130)).unwrap();
    let decoder = Decoder::start(
        ShardFormat::MsgpackZstf,
        "mem://shard",
        source(&shard, 1000),
        shard.len() as u64,
        range,
    )
    .unwrap();
    let (records, failure) = decode_all(decoder);
    assert!(failure.is_none());
    let expected: Vec<_> = (120..130).map(msgpack_record).collect();
    assert_eq!(records, expected);
}

#[test]
fn jsonl_shards_round_trip_and_truncation_is_an_error() {
    let shard = encode(ShardFormat::JsonlGz, 1500, 700);
    assert_eq!(count_records(ShardFormat::JsonlGz, &shard).unwrap(), 1500);
    let decoder = Decoder::start(
        ShardFormat::JsonlGz,
        "mem://shard",
        source(&shard, 333),
        shard.len() as u64,
        RecordRange::full(1500),
    )
    .unwrap();
    let (records, failure) = decode_all(decoder);
    assert!(failure.is_none());
    assert_eq!(records, (0..1500).map(json_record).collect::<Vec<_>>());

    let cut = &shard[..shard.len() - 5];
    let decoder = Decoder::start(
        ShardFormat::JsonlGz,
        "mem://shard",
        source(cut, 333),
        cut.len() as u64,
        RecordRange::full(1500),
    )
    .unwrap();
    match decode_all(decoder).1 {
        Some(DecodeFailure::Shard(reason)) => assert!(!reason.is_empty()),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_truncated_msgpack_shard_names_its_problem() {
    let shard = encode(ShardFormat::MsgpackZstf, 100, 100);
    let cut = &shard[..shard.len() / 2];
    let error = count_records(ShardFormat::MsgpackZstf, cut).unwrap_err();
    match error {
        NativeError::Shard {
            format,
            uri,
            reason,
            ..
        } => {
            assert_eq!(format, "msgpack.zstf");
            assert_eq!(uri, "<bytes>");
            assert!(reason.contains("truncated"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn columnar_batches_hold_every_record_in_order() {
    for format in [ShardFormat::MsgpackZstf, ShardFormat::JsonlGz] {
        let shard = encode(format, 1000, 250);
        let options = BatchOptions {
            columns: Some(vec!["id".into()]),
            batch_rows: 300,
        };
        let receiver = columnar::spawn(
            format,
            "mem://shard",
            source(&shard, 512),
            shard.len() as u64,
            RecordRange::full(1000),
            options,
        )
        .unwrap();
        let mut ids = Vec::new();
        for message in receiver {
            match message {
                columnar::Message::Batch(Some(batch), invalid) => {
                    assert!(invalid.is_empty());
                    assert!(batch.num_rows() <= 300);
                    assert_eq!(batch.num_columns(), 1);
                    let column = batch.column(0).as_primitive::<Int64Type>();
                    assert_eq!(column.null_count(), 0);
                    ids.extend(column.values().iter().copied());
                }
                columnar::Message::Batch(None, _) => {}
                columnar::Message::End => break,
                columnar::Message::Failed(failure) => panic!("{format:?}: {failure:?}"),
            }
        }
        assert_eq!(ids, (0..1000).collect::<Vec<i64>>(), "{format:?}");
    }
}

#[test]
fn a_count_that_disagrees_with_the_manifest_fails_the_columnar_read() {
    let shard = encode(ShardFormat::MsgpackZstf, 10, 10);
    let options = BatchOptions {
        columns: None,
        batch_rows: 100,
    };
    let receiver = columnar::spawn(
        ShardFormat::MsgpackZstf,
        "mem://shard",
        source(&shard, 64),
        shard.len() as u64,
        RecordRange::full(11),
        options,
    )
    .unwrap();
    let failed = receiver.into_iter().find_map(|message| match message {
        columnar::Message::Failed(DecodeFailure::Shard(reason)) => Some(reason),
        _ => None,
    });
    let reason = failed.expect("a count failure");
    assert!(reason.contains("declared 11 records"), "{reason}");
}

/// A small read of an immediate source (a block of a seeded window) is decoded in the calling
/// thread batch by batch, whatever record it starts at: the same records as a whole read.
#[test]
fn a_small_immediate_read_decodes_any_range_in_the_calling_thread() {
    for format in [ShardFormat::MsgpackZstf, ShardFormat::JsonlGz] {
        let shard = encode(format, 1500, 64);
        assert!(
            shard.len() < 256 * 1024,
            "inline-sized: {} bytes",
            shard.len()
        );
        let expected: Vec<Vec<u8>> = (0..1500)
            .map(|i| match format {
                ShardFormat::MsgpackZstf => msgpack_record(i),
                ShardFormat::JsonlGz => json_record(i),
            })
            .collect();
        for (start, stop) in [
            (0, 1500),
            (0, 1),
            (1, 2),
            (250, 500),
            (700, 1500),
            (1499, 1500),
        ] {
            let range = RecordRange::new(1500, start, Some(stop)).unwrap();
            let decoder = Decoder::start(
                format,
                "mem://shard",
                source(&shard, 4096),
                shard.len() as u64,
                range,
            )
            .unwrap();
            let (records, failure) = decode_all(decoder);
            assert!(failure.is_none(), "{format:?} {start}..{stop}");
            assert_eq!(
                records,
                expected[start as usize..stop as usize],
                "{format:?} {start}..{stop}"
            );
        }
    }
}
