"""The error family: every exception the package defines is a SyvainError that keeps its
built-in base, and errors carry what they are about as attributes (no caller parses text)."""

from __future__ import annotations

import gzip
import pickle

import pytest

import syvain_training_data
from syvain_training_data import (
    ManifestShard,
    ObjectDataError,
    ShardDataError,
    StorageConfig,
    SyvainError,
    iter_shard,
    storage,
)
from syvain_training_data import errors as errors_module
from syvain_training_data.manifest import DataManifestDataFormat


def test_every_package_exception_is_a_syvain_error_and_a_runtime_error():
    for name in errors_module.__all__:
        error_type = getattr(errors_module, name)
        assert issubclass(error_type, SyvainError), name
        assert getattr(syvain_training_data, name) is error_type, name
        if error_type is not SyvainError:
            assert issubclass(error_type, RuntimeError), name


def write_shard(tmp_path, data_format: str, data: bytes) -> ManifestShard:
    path = tmp_path / f"bad.{data_format}"
    path.write_bytes(data)
    return ManifestShard(uri=f"file://{path}", records=3, size_bytes=len(data))


CORRUPT: dict[str, bytes] = {
    "msgpack.zstf": b"\x00\x00\x00\x00\x00\x00\x00\x05abcde",
    "jsonl.gz": gzip.compress(b'{"a": 1}\n')[:-3],
    "parquet": b"PAR1 not really parquet PAR1",
}


@pytest.mark.parametrize("data_format", sorted(CORRUPT))
def test_shard_data_errors_name_format_uri_and_reason(tmp_path, data_format):
    shard = write_shard(tmp_path, data_format, CORRUPT[data_format])
    fmt: DataManifestDataFormat = data_format  # type: ignore[assignment]
    with pytest.raises(ShardDataError) as caught:
        list(iter_shard(fmt, shard))
    error = caught.value
    assert isinstance(error, RuntimeError)
    assert (error.data_format, error.uri) == (data_format, shard.uri)
    assert str(error) == f"Unreadable {data_format} shard {shard.uri}: {error.reason}"
    copy = pickle.loads(pickle.dumps(error))  # as from a DataLoader worker or a Ray task
    assert (type(copy), str(copy), copy.data_format, copy.uri, copy.reason) == (
        ShardDataError,
        str(error),
        error.data_format,
        error.uri,
        error.reason,
    )


def test_a_size_mismatch_of_a_plain_object_is_object_data_error(tmp_path):
    path = tmp_path / "object.bin"
    path.write_bytes(b"x" * 100)
    uri = f"file://{path}"
    with (
        pytest.raises(ObjectDataError) as caught,
        storage.open_stream(uri, size_bytes=90, storage_config=StorageConfig()) as stream,
    ):
        b"".join(stream)
    error = caught.value
    assert error.uri == uri and str(error) == f"{uri}: {error.reason}"
    assert "size mismatch" in error.reason
    assert isinstance(error, RuntimeError) and isinstance(error, SyvainError)


def test_a_size_mismatch_of_a_parquet_shard_is_its_shard_data_error(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "good.parquet"
    pq.write_table(pa.table({"a": [1, 2, 3]}), path)
    size = path.stat().st_size
    shard = ManifestShard(uri=f"file://{path}", records=3, size_bytes=size + 7)
    with pytest.raises(ShardDataError) as caught:
        list(iter_shard("parquet", shard))
    assert caught.value.data_format == "parquet" and caught.value.uri == shard.uri
