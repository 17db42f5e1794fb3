"""Parquet shards for the Parquet tests: written (and checked) by our writer, read back by
pyarrow, put in a local file, and values compared type for type."""

from __future__ import annotations

import hashlib
import io
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from shards import text_records
from syvain_training_data import ManifestShard
from syvain_training_data.formats.parquet import ParquetWriteResult, write_parquet_shard


def encode(records: list[Any]) -> bytes:
    """The shard's bytes, the write result checked against them."""
    buffer = io.BytesIO()
    result = write_parquet_shard(records, buffer)
    data = buffer.getvalue()
    assert result == ParquetWriteResult(
        records=len(records), size_bytes=len(data), sha256=hashlib.sha256(data).hexdigest()
    )
    return data


def table(data: bytes) -> pa.Table:
    return pq.read_table(pa.BufferReader(data))


def parquet_records(count: int, seed: int = 1) -> list[dict[str, Any]]:
    """Text records of 50 words, with a binary and a boolean column besides."""
    return [
        {**record, "raw": bytes([index % 256]) * (index % 5), "flag": index % 2 == 0}
        for index, record in enumerate(text_records(count, seed, words=50))
    ]


def local_shard(
    tmp_path: Path, data: bytes, records: int, name: str = "s.parquet"
) -> ManifestShard:
    path = tmp_path / name
    path.write_bytes(data)
    return ManifestShard(uri=f"file://{path}", records=records, size_bytes=len(data))


def assert_same(left: Any, right: Any) -> None:
    """Equal values of identical types at every depth (and NaN equal to NaN)."""
    assert type(left) is type(right), (left, right)
    if isinstance(left, dict):
        assert list(left) == list(right)
        for key in left:
            assert_same(left[key], right[key])
    elif isinstance(left, list | tuple):
        assert len(left) == len(right)
        for a, b in zip(left, right, strict=True):
            assert_same(a, b)
    elif isinstance(left, float) and left != left:
        assert right != right
    else:
        assert left == right
