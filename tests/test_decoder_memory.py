"""Memory bombs: shards whose few compressed bytes decompress to 1 GiB or more fail
(or read) with peak RSS growth under 64 MiB, measured in a fresh interpreter reading a real
local file through `iter_shard`."""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest
import zstandard

from memory import run_child
from reference_codecs import zstd_raw_frame_declaring
from syvain_training_data import ManifestShard

MIB = 1 << 20
GIB = 1 << 30
BOUND_KIB = 64 * 1024
BLOCK = 64 * MIB


def repeated(byte: bytes, total: int) -> Iterator[bytes]:
    """`total` copies of `byte`, in blocks."""
    block = byte * BLOCK
    for _ in range(total // BLOCK):
        yield block
    yield byte * (total % BLOCK)


def zstf_record(pieces: Iterator[bytes], content_size: int | None) -> bytes:
    """One msgpack.zstf record around `pieces`, with or without the size in the frame header."""
    compressor = zstandard.ZstdCompressor(level=1, write_content_size=content_size is not None)
    stream = compressor.compressobj(size=content_size if content_size is not None else -1)
    frame = b"".join(stream.compress(piece) for piece in pieces) + stream.flush()
    return struct.pack(">Q", len(frame)) + frame


def deep_payload(arrays: int) -> Iterator[bytes]:
    """{"k": [[[...]]]}: the root map and `arrays` nested arrays (nil innermost)."""
    yield b"\x81\xa1k"
    yield from repeated(b"\x91", arrays)
    yield b"\xc0"


def gzip_pieces(pieces: Iterator[bytes]) -> bytes:
    compressor = zlib.compressobj(1, zlib.DEFLATED, 31)
    return b"".join(compressor.compress(piece) for piece in pieces) + compressor.flush()


def read_in_child(path: Path, data_format: str, records: int) -> dict:
    """Reads the shard at `path` in a new interpreter; returns its outcome and RSS growth."""
    shard = ManifestShard(uri=path.as_uri(), records=records, size_bytes=path.stat().st_size)
    return run_child(
        f"""
        from syvain_training_data import ManifestShard
        from syvain_training_data.shard import iter_shard
        shard = ManifestShard.model_validate_json({shard.model_dump_json()!r})
        before = peak_rss_kib()
        count = 0
        try:
            for _ in iter_shard({data_format!r}, shard):
                count += 1
            outcome = "ok"
        except RuntimeError as err:
            outcome = str(err)
        growth = peak_rss_kib() - before
        print(json.dumps({{"records": count, "outcome": outcome, "growth_kib": growth}}))
        """
    )


def unreadable(data_format: str, path: Path, reason: str) -> str:
    return f"Unreadable {data_format} shard {path.as_uri()}: {reason}"


@pytest.mark.timeout(900)
def test_msgpack_bombs_fail_in_bounded_memory(tmp_path):
    arrays = GIB - 4  # a payload of exactly 1 GiB
    cases = {
        "deep, size declared": (
            zstf_record(deep_payload(arrays), GIB),
            "nesting too deep",
        ),
        "deep, size not declared": (zstf_record(deep_payload(arrays), None), "nesting too deep"),
        # A header declaring more than 1 GiB: refused before decompressing.
        "declared over 1 GiB": (zstd_raw_frame_declaring(GIB + 1, b"\x80"), "payload too large"),
        # No size declared, decompressing to 1.5 GiB of zeros.
        "undeclared past 1 GiB": (
            zstf_record(repeated(b"\x00", GIB + GIB // 2), None),
            "payload not a map",
        ),
        # No size declared; a map whose 1 GiB bin cannot fit within the 1 GiB cap.
        "bin past the cap": (
            zstf_record(
                iter([b"\x81\xa1k\xc6" + struct.pack(">I", GIB), *repeated(b"\x00", GIB)]), None
            ),
            "payload too large",
        ),
    }
    for index, (name, (data, reason)) in enumerate(cases.items()):
        path = tmp_path / f"bomb-{index}.msgpack.zstf"
        path.write_bytes(data)
        assert len(data) < MIB, name
        got = read_in_child(path, "msgpack.zstf", 1)
        assert got["outcome"] == unreadable("msgpack.zstf", path, reason), name
        assert got["growth_kib"] < BOUND_KIB, (name, got)
        path.unlink()


@pytest.mark.timeout(900)
def test_jsonl_blank_run_of_1_gib_is_read_in_bounded_memory(tmp_path):
    pieces = iter([b'{"a":1}\n', *repeated(b"\n", GIB), b'{"a":2}\n'])
    path = tmp_path / "blank.jsonl.gz"
    path.write_bytes(gzip_pieces(pieces))
    got = read_in_child(path, "jsonl.gz", 2)
    assert (got["outcome"], got["records"]) == ("ok", 2)
    assert got["growth_kib"] < BOUND_KIB, got


@pytest.mark.timeout(900)
def test_jsonl_range_skipping_1_gib_is_bounded(tmp_path):
    # 1 GiB of lines before the range, none of them parsed or held.
    line = b'{"skip":"' + b"x" * 1000 + b'"}\n'
    count = GIB // len(line)
    pieces = iter([*(line * 1024 for _ in range(count // 1024)), b'{"last":1}\n'])
    records = (count // 1024) * 1024 + 1
    path = tmp_path / "skip.jsonl.gz"
    path.write_bytes(gzip_pieces(pieces))
    shard = ManifestShard(uri=path.as_uri(), records=records, size_bytes=path.stat().st_size)
    out = run_child(
        f"""
        from syvain_training_data import ManifestShard
        from syvain_training_data.shard import iter_shard
        shard = ManifestShard.model_validate_json({shard.model_dump_json()!r})
        before = peak_rss_kib()
        got = list(iter_shard("jsonl.gz", shard, start={records - 1}))
        print(json.dumps({{"got": got, "growth_kib": peak_rss_kib() - before}}))
        """
    )
    assert out["got"] == [{"last": 1}]
    assert out["growth_kib"] < BOUND_KIB, out
