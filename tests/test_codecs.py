"""Native shard codecs (SPEC section 3): round trips, byte identity with the Python reference
encoders, every documented decoder error, and seeded corruption sweeps."""

from __future__ import annotations

import gzip
import io
import json
import logging
import math
import os
import random
import struct
import subprocess
import sys
import textwrap
import zlib
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any

import msgspec
import pytest
import zstandard

from syvain_training_data._native import ShardEncoder, shard_reader_from_bytes

URI = "s3://bucket/shards/part-0"
MIB = 1 << 20
GIB = 1 << 30
MSGPACK = "msgpack.zstf"
JSONL = "jsonl.gz"


def unreadable(data_format: str, reason: str) -> str:
    return f"Unreadable {data_format} shard {URI}: {reason}"


def encode(data_format: str, *calls: Iterable[Mapping[str, Any]]) -> bytes:
    encoder = ShardEncoder(data_format)
    out = b"".join(encoder.encode(list(records)) for records in calls) + encoder.finish()
    assert encoder.bytes_written == len(out)
    return out


def read(data_format: str, data: bytes, declared: int, chunk_size: int | None = None) -> list:
    reader = shard_reader_from_bytes(data_format, URI, data, declared, chunk_size=chunk_size)
    records = []
    while batch := reader.next_batch(7):
        records.extend(batch)
    assert reader.records_yielded == len(records)
    return records


def read_error(data_format: str, data: bytes, declared: int) -> str:
    with pytest.raises(RuntimeError) as info:
        read(data_format, data, declared)
    return str(info.value)


# Reference encoders (SPEC section 3 writers).


def msgpack_reference(records: Iterable[Mapping[str, Any]]) -> bytes:
    compressor = zstandard.ZstdCompressor(level=3, write_content_size=True, write_checksum=False)
    out = b""
    for record in records:
        frame = compressor.compress(msgspec.msgpack.encode(record))
        out += struct.pack(">Q", len(frame)) + frame
    return out


def jsonl_body(records: Iterable[Mapping[str, Any]]) -> bytes:
    lines = (
        json.dumps(r, separators=(",", ":"), ensure_ascii=True, allow_nan=True) + "\n"
        for r in records
    )
    return "".join(lines).encode()


def gzip_file_reference(body: bytes) -> bytes:
    buffer = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", compresslevel=6, fileobj=buffer, mtime=0) as f:
        f.write(body)
    return buffer.getvalue()


def zstd_frame(payload: bytes, *, content_size: bool = True) -> bytes:
    compressor = zstandard.ZstdCompressor(level=3, write_content_size=content_size)
    frame = compressor.compress(payload)
    return struct.pack(">Q", len(frame)) + frame


def gz(body: bytes) -> bytes:
    return gzip_file_reference(body)


# Records.

INT_BOUNDS = [
    0, 1, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**63 - 1, 2**63, 2**64 - 1,
    -1, -32, -33, -128, -129, -32768, -32769, -(2**31), -(2**31) - 1, -(2**63),
]  # fmt: skip


def common_records() -> list[dict[str, Any]]:
    return [
        {"ints": INT_BOUNDS, "floats": [0.0, -0.0, 1.5, -2.25e-300, 1e16, 1e-5, 0.1, 5e-324]},
        {"text": "plain", "unicode": "héllo wörld ☃ 😀 \u2028 \x00 \x7f", "empty": ""},
        {"nested": {"a": [1, [2, [3, {"b": {"c": []}}]]], "d": {}}, "list": [], "map": {}},
        {"none": None, "yes": True, "no": False, "mixed": [None, True, 1, 1.0, "s", {}, []]},
        {"sizes": ["x" * n for n in (31, 32, 255, 256, 65535, 65536)]},
        {"wide": {f"k{i}": i for i in range(20)}, "long": list(range(70000))},
        {},
    ]


def test_msgpack_round_trip() -> None:
    records = common_records() + [
        {"bytes": b"\x00\xff", "empty_bytes": b"", "big_bytes": bytes(range(256)) * 300},
        {"array": bytearray(b"ab"), "view": memoryview(b"cd"), "tuple": (1, (2, 3))},
    ]
    expected = json.loads(json.dumps(records[:-2]))  # tuples -> lists, same values
    expected.append(records[-2])
    expected.append({"array": b"ab", "view": b"cd", "tuple": [1, [2, 3]]})
    data = encode(MSGPACK, records[:3], records[3:])
    for chunk_size in (None, 1, 9, 4096):
        assert read(MSGPACK, data, len(records), chunk_size) == expected


def test_jsonl_round_trip() -> None:
    records = common_records() + [
        {"big": [2**64, -(2**63) - 1, 10**40], "special": [math.inf, -math.inf]},
        {"tuple": (1, (2, "3"))},
    ]
    data = encode(JSONL, records)
    expected = json.loads("[" + jsonl_body(records).decode().replace("\n", ",")[:-1] + "]")
    for chunk_size in (None, 1, 13, 4096):
        assert read(JSONL, data, len(records), chunk_size) == expected
    [nan_record] = read(JSONL, encode(JSONL, [{"nan": math.nan}]), 1)
    assert math.isnan(nan_record["nan"])


def test_iteration_yields_one_record_at_a_time() -> None:
    records = [{"i": i} for i in range(2500)]
    for data_format in (MSGPACK, JSONL):
        reader = shard_reader_from_bytes(data_format, URI, encode(data_format, records), 2500)
        assert iter(reader) is reader
        assert next(reader) == {"i": 0}
        assert reader.records_yielded == 1
        assert list(reader) == records[1:]
        assert reader.records_yielded == 2500
        assert reader.next_batch() == []


def test_non_dict_mappings_are_written_as_maps() -> None:
    record = {"m": MappingProxyType({"a": 1})}
    for data_format in (MSGPACK, JSONL):
        data = encode(data_format, [MappingProxyType(record)])
        assert read(data_format, data, 1) == [{"m": {"a": 1}}]


# Byte identity with the reference encoders.


def random_records(seed: int, count: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    words = ["alpha", "βeta", "gamma", "δ", "😀", "", "x" * 40]
    out = []
    for i in range(count):
        out.append(
            {
                "id": i,
                "int": rng.randint(-(2**63), 2**64 - 1),
                "small": rng.randint(-200, 70000),
                "float": struct.unpack("<d", rng.randbytes(8))[0],
                "uniform": rng.random() * 10 ** rng.randint(-30, 30),
                "text": " ".join(rng.choice(words) for _ in range(rng.randint(0, 30))),
                "tags": [rng.choice(words) for _ in range(rng.randint(0, 5))],
                "meta": {"ok": rng.random() < 0.5, "none": None, "n": {"deep": [i, [i]]}},
            }
        )
    return out


def test_msgpack_bytes_match_msgspec_and_zstandard() -> None:
    records = [r for r in common_records() if r]  # msgspec encodes the same values
    records += random_records(1, 300)
    records.append({"blob": random.Random(2).randbytes(3 * MIB), "zeros": bytes(MIB)})
    records.append({"text": "repetitive line of text\n" * 100_000})
    records.append({"bytes": b"\x01" * 300, "tuple": (1, "a", None)})
    records = [r for r in records if all(not math.isnan(v) for v in _floats(r))]
    assert encode(MSGPACK, records[:10], records[10:]) == msgpack_reference(records)


def _floats(value: Any) -> Iterable[float]:
    if isinstance(value, float):
        yield value
    elif isinstance(value, Mapping):
        for v in value.values():
            yield from _floats(v)
    elif isinstance(value, list | tuple):
        for v in value:
            yield from _floats(v)


def test_jsonl_bytes_match_json_dumps_and_gzip() -> None:
    records = common_records() + random_records(3, 2000)
    records.append({"nan": math.nan, "inf": math.inf, "ninf": -math.inf, "big": 10**30})
    records.append({1: "int key", 2.5: "float", False: "bool", None: "none", "s": "str"})
    records.append({"text": "repetitive line of text " * 50_000})
    body = jsonl_body(records)
    ours = encode(JSONL, records[:5], [], records[5:1000], records[1000:])
    assert ours == gzip_file_reference(body)
    # gzip.compress(mtime=0) takes zlib's header, whose OS byte is per platform (3 on Unix).
    python = gzip.compress(body, compresslevel=6, mtime=0)
    assert ours[:9] == python[:9] and ours[9] == 255 and ours[10:] == python[10:]
    assert zlib.decompress(ours, wbits=31) == body


def test_jsonl_floats_are_python_repr() -> None:
    rng = random.Random(4)
    floats = [struct.unpack("<d", rng.randbytes(8))[0] for _ in range(50_000)]
    floats += [rng.uniform(-1, 1) * 10.0 ** rng.randint(-20, 20) for _ in range(50_000)]
    floats += [float(n) for n in range(-1000, 1000)] + [1e16, 1e15, 9999999999999998.0]
    records = [{"f": floats[i : i + 100]} for i in range(0, len(floats), 100)]
    assert zlib.decompress(encode(JSONL, records), wbits=31) == jsonl_body(records)


def test_identical_records_give_identical_bytes() -> None:
    records = random_records(5, 50)
    for data_format in (MSGPACK, JSONL):
        one_call = encode(data_format, records)
        per_record = encode(data_format, *([r] for r in records))
        assert one_call == per_record


# Encoder errors: ValueError, nothing written for that call.


@pytest.mark.parametrize("data_format", [MSGPACK, JSONL])
@pytest.mark.parametrize(
    ("record", "message"),
    [
        (["not", "a", "mapping"], "is not a mapping"),
        ({"x": object()}, "object"),
        ({"x": {1j: 1}}, "complex"),
        ({"x": "\ud800"}, "lone surrogate"),
    ],
)
def test_encoder_rejects_records_without_writing(
    data_format: str, record: Any, message: str
) -> None:
    encoder = ShardEncoder(data_format)
    first = encoder.encode([{"a": 1}])
    with pytest.raises(ValueError, match=message) as info:
        encoder.encode([{"ok": 1}, record])
    assert f"Cannot write {data_format} record 1" in str(info.value)
    assert encoder.records == 1
    rest = encoder.encode([{"b": 2}]) + encoder.finish()
    assert first + rest == encode(data_format, [{"a": 1}, {"b": 2}])


def test_msgpack_requires_str_keys_and_64_bit_ints() -> None:
    encoder = ShardEncoder(MSGPACK)
    for record in ({1: "a"}, {"a": {"b": {2: 3}}}, {"a": [{"b": 1}, {None: 1}]}):
        with pytest.raises(ValueError, match="map key is"):
            encoder.encode([record])
    for value in (2**64, -(2**63) - 1):
        with pytest.raises(ValueError, match="outside -2\\*\\*63..2\\*\\*64-1"):
            encoder.encode([{"x": [value]}])
    with pytest.raises(ValueError, match="bytes is not JSON serializable"):
        ShardEncoder(JSONL).encode([{"b": b"x"}])
    assert encoder.records == 0 and encoder.bytes_written == 0


def test_nesting_limits() -> None:
    def nested(depth: int) -> dict[str, Any]:
        value: Any = 1
        for _ in range(depth - 1):
            value = [value]
        return {"v": value}

    for data_format, limit in ((JSONL, 1000), (MSGPACK, 1000)):
        deepest = nested(limit)
        assert read(data_format, encode(data_format, [deepest]), 1) == [deepest]
        with pytest.raises(ValueError, match=f"deeper than {limit}"):
            ShardEncoder(data_format).encode([nested(limit + 1)])


@pytest.mark.timeout(300)
def test_msgpack_frame_and_payload_limits() -> None:
    encoder = ShardEncoder(MSGPACK)
    with pytest.raises(ValueError, match="compressed frame is larger than 256 MiB"):
        encoder.encode([{"blob": os.urandom(257 * MIB)}])
    with pytest.raises(ValueError, match="payload is larger than 1 GiB"):
        encoder.encode([{"blob": bytes(GIB)}])
    assert encoder.records == 0 and encoder.bytes_written == 0


def test_encoder_api_errors() -> None:
    with pytest.raises(ValueError, match="Unsupported native shard format"):
        ShardEncoder("parquet")
    encoder = ShardEncoder(JSONL)
    tail = encoder.finish()
    assert gzip.decompress(tail) == b""
    assert encoder.finish() == b""
    with pytest.raises(ValueError, match="after finish"):
        encoder.encode([{"a": 1}])
    with pytest.raises(ValueError, match="Unsupported native shard format"):
        shard_reader_from_bytes("parquet", URI, b"", 1)
    with pytest.raises(ValueError, match="max_records"):
        shard_reader_from_bytes(JSONL, URI, b"", 1).next_batch(0)


# Decoder errors, one per SPEC section 3 reason, from crafted bytes.

MAP = msgspec.msgpack.encode({"k": 1})


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


def zstd_raw_frame_declaring(content_size: int, block: bytes) -> bytes:
    """A frame whose header declares `content_size` (8-byte field) around one raw block."""
    header = b"\x28\xb5\x2f\xfd" + b"\xe0" + struct.pack("<Q", content_size)
    block_header = (1 | (len(block) << 3)).to_bytes(3, "little")  # last block, raw
    body = header + block_header + block
    return struct.pack(">Q", len(body)) + body


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


def nested_arrays_payload(arrays: int) -> bytes:
    """{"k": [[[...nil...]]]}: the root map and `arrays` arrays, nested."""
    return b"\x81\xa1k" + b"\x91" * arrays + b"\xc0"


def test_msgpack_nesting_deeper_than_1000_is_refused() -> None:
    assert read(MSGPACK, zstd_frame(nested_arrays_payload(999)), 1)[0]["k"] is not None
    for arrays in (1000, 5_000_000):
        for content_size in (True, False):
            data = zstd_frame(nested_arrays_payload(arrays), content_size=content_size)
            assert read_error(MSGPACK, data, 1) == unreadable(MSGPACK, "nesting too deep")
    # The 193-byte shard: an array nested 5,000,000 deep.
    assert len(zstd_frame(nested_arrays_payload(5_000_000))) < 200


def json_nested(depth: int) -> str:
    """A JSON object whose value nests `depth` levels in all (the object included)."""
    return '{"v":' + "[" * (depth - 1) + "1" + "]" * (depth - 1) + "}"


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


def test_encoder_memory_error_is_memory_error() -> None:
    # Python's allocator fails (the C-API test hook) while the bytes are handed out: the
    # caller sees MemoryError, not a PanicException (nor an abort), and the encoder is done.
    script = textwrap.dedent(
        """
        import _testcapi
        from syvain_training_data._native import ShardEncoder
        encoder = ShardEncoder("jsonl.gz")
        encoder.encode([{"a": "x" * 100000}])
        _testcapi.set_nomemory(0)
        try:
            encoder.finish()
        except MemoryError:
            _testcapi.remove_mem_hooks()
            print("MemoryError")
        else:
            _testcapi.remove_mem_hooks()
            print("no error")
        try:
            encoder.encode([{"a": 1}])
        except ValueError as err:
            print(err)
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.splitlines() == [
        "MemoryError",
        "ShardEncoder.encode called after finish",
    ]


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


def corrupt(data: bytes, rng: random.Random) -> bytes:
    buf = bytearray(data)
    kind = rng.randrange(4)
    if kind == 0:
        for _ in range(rng.randint(1, 3)):
            buf[rng.randrange(len(buf))] ^= 1 << rng.randrange(8)
    elif kind == 1:
        del buf[rng.randrange(len(buf)) :]
    elif kind == 2:
        at = rng.randrange(len(buf) + 1)
        buf[at:at] = rng.randbytes(rng.randint(1, 8))
    else:
        at = rng.randrange(len(buf))
        del buf[at : at + rng.randint(1, 8)]
    return bytes(buf)


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
