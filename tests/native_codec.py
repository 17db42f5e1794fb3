"""The native codecs driven from bytes in memory (``shard_reader_from_bytes``,
``shard_batches_from_bytes``), and the records and damage the codec tests feed them."""

from __future__ import annotations

import random
import struct
from collections.abc import Iterable, Mapping
from typing import Any

import msgspec
import pyarrow as pa
import pytest

from reference_codecs import (
    gz,
    json_nested,
    nested_arrays_payload,
    zstd_frame,
    zstd_raw_frame_declaring,
)
from syvain_training_data._native import (
    ShardEncoder,
    shard_batches_from_bytes,
    shard_reader_from_bytes,
)

URI = "s3://bucket/shards/part-0"
MIB = 1 << 20
GIB = 1 << 30
MSGPACK = "msgpack.zstf"
JSONL = "jsonl.gz"
#: A valid MessagePack record payload.
MAP = msgspec.msgpack.encode({"k": 1})


def unreadable(data_format: str, reason: str) -> str:
    return f"Unreadable {data_format} shard {URI}: {reason}"


def encode(data_format: str, *calls: Iterable[Mapping[str, Any]]) -> bytes:
    """The shard of the records of every call, one ``encode`` call each."""
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


def corrupt(data: bytes, rng: random.Random) -> bytes:
    """``data`` with a few bits flipped, its tail cut, or bytes inserted or cut."""
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


# Decoder errors.


def decoder_error_cases() -> list[tuple[str, bytes, int]]:
    """(format, bytes, declared records) of a shard for each decoder error of SPEC section 3."""
    frame = zstd_frame(MAP)
    valid_msgpack = encode(MSGPACK, [{"i": i} for i in range(5)])
    valid_jsonl = encode(JSONL, [{"i": i} for i in range(50)])
    crc = bytearray(valid_jsonl)
    crc[-6] ^= 0x01
    cases = [
        (MSGPACK, frame + struct.pack(">Q", 0) + b"x" * 64, 2),
        (MSGPACK, frame + struct.pack(">Q", 256 * MIB + 1) + b"x" * 64, 2),
        (MSGPACK, frame + b"\x00\x00\x00", 2),
        (MSGPACK, frame[:9], 1),
        (MSGPACK, frame[:-1], 1),
        (MSGPACK, struct.pack(">Q", 8) + b"not zstd", 1),
        (MSGPACK, zstd_raw_frame_declaring(GIB + 1, MAP), 1),
        (MSGPACK, zstd_frame(nested_arrays_payload(1000)), 1),
        (MSGPACK, valid_msgpack[:-3], 5),
        (MSGPACK, valid_msgpack, 3),
        (MSGPACK, valid_msgpack, 7),
        (JSONL, valid_jsonl[: len(valid_jsonl) // 2], 50),
        (JSONL, bytes(crc), 50),
        (JSONL, b"plain text, not gzip\n", 50),
        (JSONL, valid_jsonl + b"junk", 50),
        (JSONL, gz(b'{"a":1}\n{"b":"\xff"}\n'), 2),
        (JSONL, gz(json_nested(1001).encode()), 1),
        (JSONL, valid_jsonl, 49),
        (JSONL, valid_jsonl, 51),
    ]
    for payload in (
        b"",
        b"\x81\xa1k",
        b"\x81\xa1k\xd4\x01\x02",
        b"\x81\xa1k\xa1\xff",
        MAP + b"\x00",
    ):
        cases.append((MSGPACK, zstd_frame(payload), 1))
    for payload in (b"\x92\x01\x02", b"\x81\x01\x02", b"\x81\xa1a\x81\xc4\x01x\x01"):
        cases.append((MSGPACK, zstd_frame(payload), 1))
    return cases


# The columnar path.


def batches(data_format: str, data: bytes, declared: int, **options: Any) -> list[pa.RecordBatch]:
    reader = shard_batches_from_bytes(data_format, URI, data, declared, **options)
    return [pa.record_batch(batch) for batch in reader]


def table(data_format: str, data: bytes, declared: int, **options: Any) -> pa.Table:
    got = batches(data_format, data, declared, **options)
    return pa.Table.from_batches(got) if got else pa.table({})


def outcome(read: Any) -> tuple[int, str | None]:
    """How many records a read yields before it fails, and its error message."""
    count = 0
    try:
        for item in read():
            count += item.num_rows if hasattr(item, "num_rows") else 1  # a batch or a record
    except RuntimeError as error:
        return count, str(error)
    return count, None


def both_paths(data_format: str, data: bytes, declared: int, **range_: Any) -> None:
    """The columnar path yields the records the record path yields and fails the same way."""
    records = outcome(lambda: shard_reader_from_bytes(data_format, URI, data, declared, **range_))
    reader = shard_batches_from_bytes  # batch by batch: records before a failure count
    columns = outcome(lambda: reader(data_format, URI, data, declared, batch_size=3, **range_))
    assert columns == records
