"""Writes a few valid inputs for a fuzz target into its corpus directory.

Layout of an input (see fuzz_targets/common.rs): chunking byte, declared-count byte, shard.
Usage: python seeds.py TARGET CORPUS_DIR

Every seed is at most MAX_LEN bytes (scripts/fuzz.sh runs libFuzzer with -max_len=MAX_LEN) and
decodes to at most a few hundred KiB: each just past the limit it exercises (the fuzz targets'
64 KiB line limit and 1 MiB payload limit, the 1,000-level nesting limit), not megabytes
past it. Seeds of 4 MiB of blank lines held the jsonl_gz and record_range targets to about
8,000 executions in 600 s.
"""

from __future__ import annotations

import gzip
import io
import json
import struct
import sys
from pathlib import Path

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


def msgpack_shard() -> bytes:
    import zstandard

    compressor = zstandard.ZstdCompressor(level=3, write_content_size=True)
    frames = [compressor.compress(p) for p in msgpack_payloads()]
    return b"".join(struct.pack(">Q", len(f)) + f for f in frames)


def jsonl_shard() -> bytes:
    body = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in RECORDS)
    body += "\n   \nnot json\n" + '{"last":NaN}'
    return gzip_text(body.encode()) + gzip.compress(b'{"second":"member"}\n')


def gzip_text(body: bytes) -> bytes:
    buffer = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", compresslevel=6, fileobj=buffer, mtime=0) as f:
        f.write(body)
    return buffer.getvalue()


# Memory-bomb shapes (issue 13): a few compressed bytes that decompress to a lot.


def zstf_record(payload: bytes, *, content_size: bool = True) -> bytes:
    import zstandard

    frame = zstandard.ZstdCompressor(level=3, write_content_size=content_size).compress(payload)
    return struct.pack(">Q", len(frame)) + frame


def deep_msgpack(arrays: int) -> bytes:
    """{"k": [[[...nil...]]]} with `arrays` nested arrays."""
    return b"\x81\xa1k" + b"\x91" * arrays + b"\xc0"


def frame_declaring(content_size: int, block: bytes) -> bytes:
    """A record whose zstd frame header declares `content_size` around one raw block."""
    header = b"\x28\xb5\x2f\xfd\xe0" + struct.pack("<Q", content_size)
    body = header + (1 | (len(block) << 3)).to_bytes(3, "little") + block
    return struct.pack(">Q", len(body)) + body


def msgpack_bomb_shards() -> list[bytes]:
    return [
        # Far deeper than allowed (issue 13's shard had 5,000,000 levels: the check stops at
        # 1,000 either way).
        zstf_record(deep_msgpack(20_000)),
        zstf_record(deep_msgpack(20_000), content_size=False),
        zstf_record(deep_msgpack(999)),  # as deep as allowed
        frame_declaring((1 << 30) + 1, b"\x80"),  # declares more than 1 GiB
        # Undeclared, just past the fuzz payload limit.
        zstf_record(bytes(FUZZ_MAX_PAYLOAD + 4096), content_size=False),
        # A bin header that declares 1 GiB, with a few KiB of it.
        zstf_record(
            b"\x81\xa1k\xc6" + struct.pack(">I", 1 << 30) + bytes(4096), content_size=False
        ),
    ]


def jsonl_bomb_shards() -> list[bytes]:
    deep = b'{"v":' + b"[" * 1200 + b"1" + b"]" * 1200 + b"}\n"
    return [
        # Blank-line runs just longer than a line may be.
        gzip_text(b'{"a":1}\n' + b"\n" * (FUZZ_MAX_LINE + 1024) + b'{"a":2}\n'),
        gzip_text(b'{"a":1}\n' + b" \r\n" * (FUZZ_MAX_LINE // 3 + 1024) + b'{"a":2}'),
        gzip_text(b'{"a":' + b"7" * (FUZZ_MAX_LINE + 16) + b"}\n"),  # a line too long
        gzip_text(deep + b'{"ok":1}\n' + b"[" * 250 + b"]" * 250 + b"\n"),  # deep JSON
    ]


def shard_seeds(shards: list[bytes], declared: int) -> list[bytes]:
    """Each shard whole, then cut into chunks of 1 and 7 bytes (the first one only)."""
    seeds = [bytes([chunking, declared]) + shards[0] for chunking in (0, 1, 7)]
    return seeds + [bytes([0, declared]) + shard for shard in shards[1:]]


def main() -> None:
    target, corpus = sys.argv[1], Path(sys.argv[2])
    corpus.mkdir(parents=True, exist_ok=True)
    count = len(RECORDS) + 1
    msgpack_shards = [msgpack_shard(), *msgpack_bomb_shards()]
    jsonl_shards = [jsonl_shard(), *jsonl_bomb_shards()]
    if target == "msgpack_payload":
        seeds = [*msgpack_payloads(), deep_msgpack(999), deep_msgpack(1000), deep_msgpack(4000)]
    elif target == "msgpack_zstf":
        seeds = shard_seeds(msgpack_shards, count)
    elif target == "jsonl_gz":
        seeds = shard_seeds(jsonl_shards, count)
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
