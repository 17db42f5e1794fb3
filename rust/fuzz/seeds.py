"""Writes a few valid inputs for a fuzz target into its corpus directory.

Layout of an input (see fuzz_targets/common.rs): chunking byte, declared-count byte, shard.
Usage: python seeds.py TARGET CORPUS_DIR

Every seed is at most MAX_LEN bytes (scripts/fuzz.sh runs libFuzzer with -max_len=MAX_LEN) and
decodes to at most a few hundred KiB: each just past the limit it exercises (the fuzz targets'
64 KiB line limit and 1 MiB payload limit, the 1,000-level nesting limit), not megabytes
past it (seeds of megabytes hold a target to a few thousand executions per run).

The shards are made by the SPEC section 3 reference writers of the codec tests
(tests/reference_codecs.py), the bytes the native encoders are checked against.
"""

from __future__ import annotations

import gzip
import json
import struct
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from reference_codecs import (  # noqa: E402
    gzip_file_reference,
    msgpack_reference,
    nested_arrays_payload,
    zstd_frame,
    zstd_raw_frame_declaring,
)

# The largest input libFuzzer makes (and the largest seed).
MAX_LEN = 4096
# What the fuzz targets allow (fuzz_targets/*.rs): a jsonl line, a msgpack.zstf payload.
FUZZ_MAX_LINE = 64 << 10
FUZZ_MAX_PAYLOAD = 1 << 20

RECORDS = [
    {"id": 1, "text": "hello", "tags": ["a", "b"], "nested": {"x": 1.5, "y": None}},
    {"id": 2, "blob": "é😀", "flag": True, "big": 2**64 - 1, "neg": -(2**63)},
    {},
]


def msgpack_payloads() -> list[bytes]:
    import msgspec

    return [msgspec.msgpack.encode(r) for r in RECORDS]


def jsonl_shard() -> bytes:
    body = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in RECORDS)
    body += "\n   \nnot json\n" + '{"last":NaN}'
    return gzip_file_reference(body.encode()) + gzip.compress(b'{"second":"member"}\n')


# Memory-bomb shapes: a few compressed bytes that decompress to a lot.


def msgpack_bomb_shards() -> list[bytes]:
    return [
        # Far deeper than allowed (a hostile shard may nest millions of levels: the check stops
        # at 1,000 either way).
        zstd_frame(nested_arrays_payload(20_000)),
        zstd_frame(nested_arrays_payload(20_000), content_size=False),
        zstd_frame(nested_arrays_payload(999)),  # as deep as allowed
        zstd_raw_frame_declaring((1 << 30) + 1, b"\x80"),  # declares more than 1 GiB
        # Undeclared, just past the fuzz payload limit.
        zstd_frame(bytes(FUZZ_MAX_PAYLOAD + 4096), content_size=False),
        # A bin header that declares 1 GiB, with a few KiB of it.
        zstd_frame(b"\x81\xa1k\xc6" + struct.pack(">I", 1 << 30) + bytes(4096), content_size=False),
    ]


def jsonl_bomb_shards() -> list[bytes]:
    deep = b'{"v":' + b"[" * 1200 + b"1" + b"]" * 1200 + b"}\n"
    return [
        # Blank-line runs just longer than a line may be.
        gzip_file_reference(b'{"a":1}\n' + b"\n" * (FUZZ_MAX_LINE + 1024) + b'{"a":2}\n'),
        gzip_file_reference(b'{"a":1}\n' + b" \r\n" * (FUZZ_MAX_LINE // 3 + 1024) + b'{"a":2}'),
        gzip_file_reference(b'{"a":' + b"7" * (FUZZ_MAX_LINE + 16) + b"}\n"),  # line too long
        gzip_file_reference(deep + b'{"ok":1}\n' + b"[" * 250 + b"]" * 250 + b"\n"),  # deep
    ]


def parquet_shards() -> list[bytes]:
    """Small Parquet files: with a page index, CRCs and pages of 4 rows (as our writer makes
    them, smaller), dictionary-encoded with a list column, and snappy without a page index."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table(
        {
            "id": list(range(12)),
            "text": [f"t{i % 3}" * (i % 5) for i in range(12)],
            "tags": [[i, i + 1] if i % 4 else None for i in range(12)],
        }
    )
    shards = []
    for options in (
        {"write_page_index": True, "write_page_checksum": True, "use_dictionary": False},
        {"use_dictionary": True, "compression": "zstd"},
        {"compression": "snappy", "row_group_size": 5},
    ):
        sink = io.BytesIO()
        pq.write_table(table, sink, data_page_size=64, write_batch_size=4, **options)
        shards.append(sink.getvalue())
    return shards


def shard_seeds(shards: list[bytes], declared: int) -> list[bytes]:
    """Each shard whole, then cut into chunks of 1 and 7 bytes (the first one only)."""
    seeds = [bytes([chunking, declared]) + shards[0] for chunking in (0, 1, 7)]
    return seeds + [bytes([0, declared]) + shard for shard in shards[1:]]


def main() -> None:
    target, corpus = sys.argv[1], Path(sys.argv[2])
    corpus.mkdir(parents=True, exist_ok=True)
    count = len(RECORDS) + 1
    msgpack_shards = [msgpack_reference(RECORDS), *msgpack_bomb_shards()]
    jsonl_shards = [jsonl_shard(), *jsonl_bomb_shards()]
    if target == "msgpack_payload":
        deep = [nested_arrays_payload(arrays) for arrays in (999, 1000, 4000)]
        seeds = [*msgpack_payloads(), *deep]
    elif target == "msgpack_zstf":
        seeds = shard_seeds(msgpack_shards, count)
    elif target == "jsonl_gz":
        seeds = shard_seeds(jsonl_shards, count)
    elif target == "parquet_read":
        # start row, span (255: to the end), columns and batch rows, file
        seeds = [
            bytes([start, span, which]) + shard
            for shard in parquet_shards()
            for start, span, which in ((0, 255, 0), (3, 4, 1), (1, 1, 6))
        ]
    elif target == "gzip_entry":
        # block, entry bits (high bit: member start), skip, first record, window length, shard
        seeds = [
            bytes([block, bits, skip, first, 0]) + shard
            for shard in jsonl_shards
            for block, bits, skip, first in ((1, 0, 0, 0), (3, 5, 2, 0x21), (7, 0x80, 0, 0))
        ]
    else:  # record_range: start byte (low bit: 0 msgpack.zstf, 1 jsonl.gz), stop byte, shard
        seeds = [
            bytes([start << 1 | fmt, stop]) + seed
            for fmt, shards in ((0, msgpack_shards), (1, jsonl_shards))
            for seed in shard_seeds(shards, count)
            for start, stop in ((1, 3), (2, count))
        ]
    for n, seed in enumerate(seeds):
        if len(seed) > MAX_LEN:
            raise SystemExit(f"seed {n} of {target} has {len(seed)} bytes, over {MAX_LEN}")
        (corpus / f"seed-{n}").write_bytes(seed)


if __name__ == "__main__":
    main()
