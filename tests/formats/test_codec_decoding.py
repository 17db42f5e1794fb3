"""Native shard decoders (SPEC section 3): every documented decoder error from crafted bytes,
declared counts, and seeded corruption sweeps."""

from __future__ import annotations

import gzip
import json
import logging
import math
import random
import struct
import zlib
from typing import Any

import msgspec
import pytest
import zstandard

from native_codec import (
    GIB,
    JSONL,
    MAP,
    MIB,
    MSGPACK,
    URI,
    corrupt,
    encode,
    random_records,
    read,
    read_error,
    unreadable,
)
from reference_codecs import (
    gz,
    json_nested,
    nested_arrays_payload,
    zstd_frame,
    zstd_raw_frame_declaring,
)
from syvain_training_data._native import shard_reader_from_bytes

# Decoder errors, one per SPEC section 3 reason, from crafted bytes.


def test_msgpack_invalid_frame_length() -> None:
    for length in (0, 256 * MIB + 1, 2**64 - 1):
        data = zstd_frame(MAP) + struct.pack(">Q", length) + b"x" * 64
        assert read_error(MSGPACK, data, 2) == unreadable(MSGPACK, "invalid frame length")


def test_msgpack_truncated_frame_header() -> None:
    data = zstd_frame(MAP) + b"\x00\x00\x00"
    assert read_error(MSGPACK, data, 2) == unreadable(MSGPACK, "truncated 8-byte frame header")


def test_msgpack_truncated_compressed_frame() -> None:
    data = zstd_frame(MAP)
    for cut in (8, 9, len(data) - 1):
        assert read_error(MSGPACK, data[:cut], 1) == unreadable(
            MSGPACK, "truncated compressed frame"
        )


def test_msgpack_invalid_zstandard_frame() -> None:
    frame = zstd_frame(MAP)[8:]
    assert frame[4:7] == b"\x20\x04\x21"  # single segment, content size 4, last raw block
    reserved_block = frame[:6] + b"\x27" + frame[7:]
    wrong_size = frame[:5] + b"\x05" + frame[6:]
    skippable = b"\x50\x2a\x4d\x18" + struct.pack("<I", 4) + b"abcd"
    bodies = (b"not zstd", frame + frame, frame + b"\x00", reserved_block, wrong_size, skippable)
    for body in bodies:
        data = struct.pack(">Q", len(body)) + body
        assert read_error(MSGPACK, data, 1) == unreadable(MSGPACK, "invalid Zstandard frame")


@pytest.mark.timeout(300)
def test_msgpack_payload_too_large() -> None:
    # Declared in the frame header: refused before decompressing.
    data = zstd_raw_frame_declaring(GIB + 1, MAP)
    assert read_error(MSGPACK, data, 1) == unreadable(MSGPACK, "payload too large")
    # Not declared: the output is capped while decompressing.
    compressor = zstandard.ZstdCompressor(level=1, write_content_size=False)
    chunker = compressor.chunker(chunk_size=8 * MIB)
    head = b"\x81\xa1k\xc6" + struct.pack(">I", GIB)  # a 1 GiB bin: payload 1 GiB + 8
    frame = b"".join(chunker.compress(head))
    zeros = bytes(64 * MIB)
    for _ in range(16):
        frame += b"".join(chunker.compress(zeros))
    frame += b"".join(chunker.finish())
    data = struct.pack(">Q", len(frame)) + frame
    assert read_error(MSGPACK, data, 1) == unreadable(MSGPACK, "payload too large")


def test_msgpack_invalid_payload() -> None:
    payloads = [
        b"",
        b"\x81\xa1k",  # truncated
        b"\x81\xa1k\xd4\x01\x02",  # ext
        b"\x81\xa1k\xc7\x01\x05x",  # ext8
        b"\x81\xa1\xffx\x01"[:4] + b"\x01",  # invalid UTF-8 key
        b"\x81\xa1k\xa1\xff",  # invalid UTF-8 value
        b"\x81\xa1k\xc1",  # never-used marker
        MAP + b"\x00",  # trailing bytes after the map
        b"\xdf\xff\xff\xff\xff",  # map longer than the payload
    ]
    for payload in payloads:
        assert read_error(MSGPACK, zstd_frame(payload), 1) == unreadable(
            MSGPACK, "invalid MessagePack payload"
        ), payload


def test_msgpack_nesting_deeper_than_1000_is_refused() -> None:
    assert read(MSGPACK, zstd_frame(nested_arrays_payload(999)), 1)[0]["k"] is not None
    for arrays in (1000, 5_000_000):
        for content_size in (True, False):
            data = zstd_frame(nested_arrays_payload(arrays), content_size=content_size)
            assert read_error(MSGPACK, data, 1) == unreadable(MSGPACK, "nesting too deep")
    # A hostile shard of under 200 bytes: an array nested 5,000,000 deep.
    assert len(zstd_frame(nested_arrays_payload(5_000_000))) < 200


def test_jsonl_nesting_up_to_1000_is_read_and_deeper_is_a_shard_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # jiter stops at 200; a line from another writer nested 250 or 1000 deep is still a record.
    for depth in (199, 200, 201, 250, 1000):
        line = json_nested(depth)
        assert read(JSONL, gz(line.encode() + b"\n"), 1) == [json.loads(line)], depth
    # An invalid deep line is still just an invalid line (logged, skipped).
    with caplog.at_level(logging.ERROR, logger="syvain_training_data"):
        body = b"[" * 300 + b"oops\n" + b'{"ok":1}\n'
        assert read(JSONL, gz(body), 1) == [{"ok": 1}]
    assert [r.getMessage() for r in caplog.records] == [f"Skipping invalid JSON record in {URI}:1"]
    # Deeper than 1000: the shard is unreadable, naming the line; records before it arrive.
    body = b'{"ok":1}\n' + json_nested(1001).encode() + b"\n"
    reader = shard_reader_from_bytes(JSONL, URI, gz(body), 2)
    assert reader.next_batch(10) == [{"ok": 1}]
    with pytest.raises(RuntimeError) as info:
        reader.next_batch(10)
    assert str(info.value) == unreadable(JSONL, "line 2 nested deeper than 1000 levels")


def test_jsonl_blank_runs_count_as_lines_not_records() -> None:
    body = b'{"a":1}\n' + b"\n" * (9 * MIB) + b'{"a":2}\n' + b" \r\n" * MIB
    assert read(JSONL, gz(body), 2) == [{"a": 1}, {"a": 2}]


def test_msgpack_payload_not_a_map() -> None:
    for value in ([1, 2], "text", 3, None, b"bin"):
        data = zstd_frame(msgspec.msgpack.encode(value))
        assert read_error(MSGPACK, data, 1) == unreadable(MSGPACK, "payload not a map")


def test_msgpack_non_string_map_key() -> None:
    for payload in (b"\x81\x01\x02", b"\x81\xa1a\x91\x81\xc0\x01", b"\x81\xa1a\x81\xc4\x01x\x01"):
        assert read_error(MSGPACK, zstd_frame(payload), 1) == unreadable(
            MSGPACK, "non-string map key"
        )


@pytest.mark.parametrize("data_format", [MSGPACK, JSONL])
def test_declared_count_is_enforced(data_format: str) -> None:
    data = encode(data_format, [{"i": i} for i in range(3)])
    assert read_error(data_format, data, 5) == unreadable(
        data_format, "declared 5 records but yielded 3"
    )
    reader = shard_reader_from_bytes(data_format, URI, data, 2)
    records, error = records_until_error(reader)
    assert records == [{"i": 0}, {"i": 1}]  # never more than declared
    assert str(error) == unreadable(data_format, "declared 2 records but found more")
    with pytest.raises(RuntimeError):  # stays failed
        reader.next_batch(10)
    assert reader.records_yielded == 2


def test_records_before_an_error_are_delivered() -> None:
    data = encode(MSGPACK, [{"i": i} for i in range(5)])
    reader = shard_reader_from_bytes(MSGPACK, URI, data[:-3], 5)
    records, error = records_until_error(reader)
    assert records == [{"i": i} for i in range(4)]
    assert "truncated compressed frame" in str(error)


def records_until_error(reader: Any) -> tuple[list[dict[str, Any]], RuntimeError]:
    # A call returns the records decoded so far (the first batches of a shard are small, so
    # that its first record comes early): several calls may precede the error.
    records: list[dict[str, Any]] = []
    while True:
        try:
            batch = reader.next_batch(100)
        except RuntimeError as error:
            return records, error
        assert batch, "the reader ended without the error"
        records.extend(batch)


def test_jsonl_truncated_gzip() -> None:
    data = encode(JSONL, [{"i": i} for i in range(50)])
    for cut in (0, 1, 5, 10, len(data) // 2, len(data) - 4, len(data) - 1):
        assert read_error(JSONL, data[:cut], 50) == unreadable(JSONL, "truncated gzip stream")


def test_jsonl_corrupt_gzip() -> None:
    data = bytearray(encode(JSONL, [{"i": i} for i in range(50)]))
    crc = bytearray(data)
    crc[-6] ^= 0x01
    method = bytearray(data)
    method[2] = 7
    for corrupted in (bytes(crc), bytes(method), b"plain text, not gzip\n"):
        assert read_error(JSONL, corrupted, 50) == unreadable(JSONL, "corrupt gzip stream")


def test_jsonl_concatenated_members_and_trailing_bytes() -> None:
    first = encode(JSONL, [{"i": 0}])
    second = gzip.compress(b'{"i":1}\n')  # another writer's member, with an mtime
    assert read(JSONL, first + second, 2) == [{"i": 0}, {"i": 1}]
    for trailing in (b"\n", b"\x00\x00", b"junk"):
        assert read_error(JSONL, first + trailing, 1) == unreadable(
            JSONL, "trailing bytes after gzip stream"
        )


def test_jsonl_invalid_utf8() -> None:
    data = gz(b'{"a":1}\n{"b":"\xff"}\n')
    assert read_error(JSONL, data, 2) == unreadable(JSONL, "invalid UTF-8 in line 2")


@pytest.mark.timeout(300)
def test_jsonl_line_longer_than_1_gib() -> None:
    compressor = zlib.compressobj(1, zlib.DEFLATED, 31)
    block = b"a" * (64 * MIB)
    data = compressor.compress(b'{"a":"')
    for _ in range(16):
        data += compressor.compress(block)
    data += compressor.compress(b'"}\n') + compressor.flush()
    expected = f"line 1 longer than {GIB} bytes"
    assert read_error(JSONL, data, 1) == unreadable(JSONL, expected)


def test_jsonl_invalid_lines_are_logged_and_skipped(caplog: pytest.LogCaptureFixture) -> None:
    body = (
        b'{"a":1}\n'
        b"\n"
        b"not json\n"
        b"   \r\n"
        b"[1,2]\n"
        b'"str"\n'
        b'{"b":NaN,"c":Infinity,"d":-Infinity}\n'
        b'{"truncated":\n'
        b'{"e":[1,{"f":null}]}'  # last line without "\n"
    )
    caplog.set_level(logging.ERROR, logger="syvain_training_data")
    records = read(JSONL, gz(body), 3)
    assert records[0] == {"a": 1} and records[2] == {"e": [1, {"f": None}]}
    assert math.isnan(records[1]["b"]) and records[1]["c"] == math.inf
    assert records[1]["d"] == -math.inf
    logged = [(r.name, r.levelno, r.getMessage()) for r in caplog.records]
    assert logged == [
        ("syvain_training_data", logging.ERROR, f"Skipping invalid JSON record in {URI}:{n}")
        for n in (3, 5, 6, 8)
    ]
    # Skipped lines do not count.
    assert read_error(JSONL, gz(body), 4) == unreadable(JSONL, "declared 4 records but yielded 3")


def test_jsonl_python_parity() -> None:
    lines = [
        '{"dup":1,"dup":2}',
        '{"esc":"\\u00e9\\ud83d\\ude00\\n\\/"}',
        '{"num":[-0,0.5,1E400,-1e-400,12345678901234567890123]}',
        ' {"padded": true} ',
    ]
    body = "\n".join(lines).encode()
    assert read(JSONL, gz(body), len(lines)) == [json.loads(line) for line in lines]


# Corruption sweeps: every outcome is the documented error or exactly the declared records.


@pytest.mark.timeout(120)
@pytest.mark.parametrize("data_format", [MSGPACK, JSONL])
def test_corruption_sweep(data_format: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.CRITICAL, logger="syvain_training_data")
    records = random_records(7, 20)
    for record in records:
        record["float"] = 1.5  # keep NaN out so equality holds
    if data_format == MSGPACK:
        records[0]["blob"] = bytes(range(256))
    valid = encode(data_format, records)
    assert read(data_format, valid, len(records)) == records
    outcomes = {"error": 0, "records": 0}
    for seed in range(200):
        rng = random.Random(seed)
        damaged = corrupt(valid, rng)
        chunk_size = rng.choice([None, 1, 7, 512])
        try:
            got = read(data_format, damaged, len(records), chunk_size)
        except RuntimeError as err:
            assert str(err).startswith(f"Unreadable {data_format} shard {URI}: "), (seed, err)
            outcomes["error"] += 1
        else:
            assert len(got) == len(records), seed
            outcomes["records"] += 1
    # Most damage must be caught; a few flips only change a value.
    assert outcomes["error"] >= 150, outcomes
