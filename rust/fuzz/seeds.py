"""Writes a few valid inputs for a fuzz target into its corpus directory.

Layout of an input (see fuzz_targets/common.rs): chunking byte, declared-count byte, shard.
Usage: python seeds.py TARGET CORPUS_DIR
"""

from __future__ import annotations

import gzip
import io
import json
import struct
import sys
from pathlib import Path

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
    buffer = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", compresslevel=6, fileobj=buffer, mtime=0) as f:
        f.write(body.encode())
    return buffer.getvalue() + gzip.compress(b'{"second":"member"}\n')


def main() -> None:
    target, corpus = sys.argv[1], Path(sys.argv[2])
    corpus.mkdir(parents=True, exist_ok=True)
    if target == "msgpack_payload":
        seeds = msgpack_payloads()
    else:
        shard = msgpack_shard() if target == "msgpack_zstf" else jsonl_shard()
        seeds = [bytes([chunking, len(RECORDS) + 1]) + shard for chunking in (0, 1, 7)]
    for n, seed in enumerate(seeds):
        (corpus / f"seed-{n}").write_bytes(seed)


if __name__ == "__main__":
    main()
