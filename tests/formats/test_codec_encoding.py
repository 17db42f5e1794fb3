"""Native shard encoders (SPEC section 3): round trips, byte identity with the Python reference
writers, and the encoder's errors."""

from __future__ import annotations

import gzip
import json
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

import pytest

from native_codec import (
    GIB,
    JSONL,
    MIB,
    MSGPACK,
    URI,
    common_records,
    encode,
    random_records,
    read,
)
from reference_codecs import gzip_file_reference, jsonl_body, msgpack_reference
from syvain_training_data._native import ShardEncoder, shard_reader_from_bytes


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


# Byte identity with the reference writers.


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
