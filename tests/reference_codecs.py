"""The SPEC section 3 writers in plain Python, and crafted msgpack.zstf / jsonl.gz bytes.

The native encoders must give these writers' bytes exactly; the decoder tests and
``rust/fuzz/seeds.py`` build their inputs with them. Only the standard library, msgspec and
zstandard: no ``syvain_training_data``, so the fuzz seeds need no built extension.
"""

from __future__ import annotations

import gzip
import io
import json
import struct
from collections.abc import Iterable, Mapping
from typing import Any

import msgspec
import zstandard


def msgpack_reference(records: Iterable[Mapping[str, Any]]) -> bytes:
    """A msgpack.zstf shard: per record, its 8-byte big-endian frame length, then a level-3
    Zstandard frame (content size, no checksum) of its MessagePack."""
    compressor = zstandard.ZstdCompressor(level=3, write_content_size=True, write_checksum=False)
    out = b""
    for record in records:
        frame = compressor.compress(msgspec.msgpack.encode(record))
        out += struct.pack(">Q", len(frame)) + frame
    return out


def jsonl_body(records: Iterable[Mapping[str, Any]]) -> bytes:
    """The uncompressed lines of a jsonl.gz shard."""
    lines = (
        json.dumps(r, separators=(",", ":"), ensure_ascii=True, allow_nan=True) + "\n"
        for r in records
    )
    return "".join(lines).encode()


def gzip_file_reference(body: bytes) -> bytes:
    """``body`` as the one gzip member of a jsonl.gz shard (level 6, no name, mtime 0)."""
    buffer = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", compresslevel=6, fileobj=buffer, mtime=0) as f:
        f.write(body)
    return buffer.getvalue()


gz = gzip_file_reference  # the short name the crafted jsonl.gz cases use


def zstd_frame(payload: bytes, *, content_size: bool = True) -> bytes:
    """One msgpack.zstf record around ``payload`` (any bytes, valid MessagePack or not)."""
    compressor = zstandard.ZstdCompressor(level=3, write_content_size=content_size)
    frame = compressor.compress(payload)
    return struct.pack(">Q", len(frame)) + frame


def zstd_raw_frame_declaring(content_size: int, block: bytes) -> bytes:
    """A record whose frame header declares `content_size` (8-byte field) around one raw
    block."""
    header = b"\x28\xb5\x2f\xfd" + b"\xe0" + struct.pack("<Q", content_size)
    block_header = (1 | (len(block) << 3)).to_bytes(3, "little")  # last block, raw
    body = header + block_header + block
    return struct.pack(">Q", len(body)) + body


def nested_arrays_payload(arrays: int) -> bytes:
    """{"k": [[[...nil...]]]}: the root map and `arrays` arrays, nested."""
    return b"\x81\xa1k" + b"\x91" * arrays + b"\xc0"


def json_nested(depth: int) -> str:
    """A JSON object whose value nests `depth` levels in all (the object included)."""
    return '{"v":' + "[" * (depth - 1) + "1" + "]" * (depth - 1) + "}"
