"""Parquet shards (SPEC section 3): the writer's rules, the reader's checks over real stores
(SeaweedFS and the local directory store), temporary files, and the Rust row builder against
``to_pylist`` for every Arrow type it converts."""

from __future__ import annotations

import datetime
import decimal
import hashlib
import io
import os
import queue
import random
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from types import MappingProxyType, SimpleNamespace
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from seaweed import config_for
from syvain_training_data import ManifestShard, ObjectChangedError, _native, storage
from syvain_training_data.formats import parquet, parquet_bounds
from syvain_training_data.formats.parquet import (
    ParquetWriteResult,
    iter_parquet_shard,
    write_parquet_shard,
)
from syvain_training_data.shard import iter_shard
from syvain_training_data.storage import StorageConfig


def encode(records: list[Any]) -> bytes:
    buffer = io.BytesIO()
    result = write_parquet_shard(records, buffer)
    data = buffer.getvalue()
    assert result == ParquetWriteResult(
        records=len(records), size_bytes=len(data), sha256=hashlib.sha256(data).hexdigest()
    )
    return data


def table(data: bytes) -> pa.Table:
    return pq.read_table(pa.BufferReader(data))


def text_records(count: int, seed: int = 1) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    words = ["alpha", "beta", "gamma", "δέλτα", "epsilon", "ζ", "eta", "θ"]
    return [
        {
            "id": f"r{index}",
            "text": " ".join(rng.choice(words) for _ in range(50)),
            "tokens": [rng.randrange(-(2**40), 2**40) for _ in range(32)],
            "meta": {"i": index, "score": rng.random(), "tags": ["a"] * (index % 3)},
            "raw": bytes([index % 256]) * (index % 5),
            "flag": index % 2 == 0,
        }
        for index in range(count)
    ]


@pytest.fixture(params=["s3", "file"])
def store(request, tmp_path) -> tuple[str, StorageConfig]:
    if request.param == "s3":
        server = request.getfixturevalue("seaweed")
        bucket = request.getfixturevalue("s3_bucket")
        prefix = request.getfixturevalue("unique_prefix")
        return f"s3://{bucket}/{prefix}", config_for(server)
    return f"file://{tmp_path}/store", StorageConfig()


def publish(uri: str, data: bytes, config: StorageConfig, records: int) -> ManifestShard:
    info = storage.put_object(uri, data, storage_config=config)
    return ManifestShard(uri=uri, records=records, size_bytes=info.size, etag=info.etag)


def local_shard(tmp_path: Path, data: bytes, records: int, name: str = "s.parquet"):
    path = tmp_path / name
    path.write_bytes(data)
    return ManifestShard(uri=f"file://{path}", records=records, size_bytes=len(data))


@pytest.fixture
def temp_dir(tmp_path, monkeypatch) -> Path:
    """The system temp directory, redirected to an empty directory of this test."""
    directory = tmp_path / "system-tmp"
    directory.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(directory))
    return directory


# --- writer ---------------------------------------------------------------------------------


def test_columns_in_first_seen_order_across_the_shard_and_missing_keys_null():
    records = [{"b": 1, "a": "x"}] * 1500 + [{"c": 2.5, "a": "y"}, {"d": True}] + [{"b": 3}] * 600
    data = encode(records)
    assert table(data).column_names == ["b", "a", "c", "d"]
    rows = table(data).to_pylist()
    assert rows[0] == {"b": 1, "a": "x", "c": None, "d": None}
    assert rows[1500] == {"b": None, "a": "y", "c": 2.5, "d": None}
    assert rows[1501] == {"b": None, "a": None, "c": None, "d": True}
    assert rows[-1] == {"b": 3, "a": None, "c": None, "d": None}
    assert len(rows) == len(records)


def test_permissive_promotion_across_batches():
    first = [{"n": i, "s": None, "l": [], "m": {"a": i}} for i in range(1024)]
    second = [{"n": i + 0.5, "s": "x", "l": [i], "m": {"b": "y"}} for i in range(1024)]
    third = [{"n": 7} for _ in range(10)]
    data = encode(first + second + third)
    schema = table(data).schema
    assert schema.field("n").type == pa.float64()
    assert schema.field("s").type == pa.string()
    assert schema.field("l").type == pa.list_(pa.int64())
    assert schema.field("m").type == pa.struct([("a", pa.int64()), ("b", pa.string())])
    rows = table(data).to_pylist()
    assert rows[0] == {"n": 0.0, "s": None, "l": [], "m": {"a": 0, "b": None}}
    assert rows[1024] == {"n": 0.5, "s": "x", "l": [0], "m": {"a": None, "b": "y"}}
    assert rows[-1] == {"n": 7.0, "s": None, "l": None, "m": None}
    assert all(type(row["n"]) is float for row in rows)


def test_promotion_of_nested_structs_and_lists():
    first = [{"x": [{"a": 1}], "s": {"t": {"u": 1}}} for _ in range(1024)]
    second = [{"x": [{"b": "y"}, None], "s": {"t": None, "v": 2.5}}, {"x": None, "s": None}]
    rows = table(encode(first + second)).to_pylist()
    assert rows[0] == {"x": [{"a": 1, "b": None}], "s": {"t": {"u": 1}, "v": None}}
    assert rows[1024] == {"x": [{"a": None, "b": "y"}, None], "s": {"t": None, "v": 2.5}}
    assert rows[1025] == {"x": None, "s": None}


def test_promotion_of_sliced_arrays():
    array = pa.array([[{"a": 1}], None, [{"a": 2}, None], [], [{"a": None}]] * 3)
    target = pa.list_(pa.struct([("a", pa.float64()), ("b", pa.string())]))

    def promoted(item: dict[str, Any] | None) -> dict[str, Any] | None:
        return (
            None
            if item is None
            else {"a": None if item["a"] is None else float(item["a"]), "b": None}
        )

    for start in range(0, 15, 4):
        part = array.slice(start, 5)
        expected = [None if v is None else [promoted(i) for i in v] for v in part.to_pylist()]
        result = parquet._promote(pa, part, target)
        assert result.type == target
        assert_same(result.to_pylist(), expected)
    assert parquet._promote(pa, array.slice(3, 0), target).type == target


def test_batches_of_1024_rows_are_inferred_separately():
    # Within one batch int and float mix into double; an int batch alone stays int64 until a
    # later batch widens the whole column.
    ints = encode([{"n": i} for i in range(3000)])
    assert table(ints).schema.field("n").type == pa.int64()
    widened = encode([{"n": i} for i in range(2048)] + [{"n": 0.5}])
    assert table(widened).schema.field("n").type == pa.float64()
    assert table(widened).column("n").to_pylist()[:3] == [0.0, 1.0, 2.0]


def test_incompatible_types_are_value_errors_naming_the_column():
    with pytest.raises(ValueError, match="'v'"):
        encode([{"v": 1}] * 1024 + [{"v": "x"}])
    with pytest.raises(ValueError, match=r"column 'v' of records 0\.\.1"):
        encode([{"v": 1}, {"v": "x"}])
    # A lossy int -> double promotion is refused, as pyarrow refuses it inside one batch.
    with pytest.raises(ValueError, match="'big'"):
        encode([{"big": 2**60 + 1}] * 1024 + [{"big": 0.5}])


def test_zstd_compression_and_row_groups(monkeypatch):
    monkeypatch.setattr(parquet, "ROW_GROUP_ROWS", 2048)
    data = encode([{"i": i, "s": str(i)} for i in range(5000)])
    metadata = pq.ParquetFile(pa.BufferReader(data)).metadata
    assert [metadata.row_group(g).num_rows for g in range(metadata.num_row_groups)] == [
        2048,
        2048,
        904,
    ]
    for group in range(metadata.num_row_groups):
        for column in range(metadata.num_columns):
            assert metadata.row_group(group).column(column).compression == "ZSTD"


def test_deterministic_bytes_for_paths_and_file_objects(tmp_path):
    records = text_records(2500)
    first = encode(records)
    assert encode(records) == first
    result = write_parquet_shard(iter(records), tmp_path / "a.parquet")
    assert (tmp_path / "a.parquet").read_bytes() == first
    assert result.sha256 == hashlib.sha256(first).hexdigest()
    write_parquet_shard(records, str(tmp_path / "b.parquet"))
    assert (tmp_path / "b.parquet").read_bytes() == first
    assert pq.ParquetFile(pa.BufferReader(first)).metadata.created_by.startswith("parquet-cpp")


def test_leading_empty_records_become_null_rows():
    data = encode([{}] * 1500 + [{"a": 1}])
    assert table(data).to_pylist() == [{"a": None}] * 1500 + [{"a": 1}]


def test_no_columns_and_no_records_are_value_errors():
    with pytest.raises(ValueError, match="no columns"):
        encode([{}] * 3)
    with pytest.raises(ValueError, match="Cannot save an empty record shard"):
        encode([])


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (["not a mapping"], "Parquet record 1500 is not a mapping"),
        ({1: "int key"}, "Parquet record 1500 has a non-string key 1"),
    ],
)
def test_bad_records_name_the_index_and_write_nothing(bad, message):
    buffer = io.BytesIO()
    with pytest.raises(ValueError, match=message):
        write_parquet_shard([{"a": 1}] * 1500 + [bad], buffer)
    assert buffer.getvalue() == b""


@pytest.mark.parametrize(
    "nested",
    [{"m": {b"k": 1}}, {"m": [{"k": 1}, {2: 3}]}, {"m": {"deep": {"x": {(1,): 0}}}}],
    ids=["bytes-key", "int-key-in-list", "tuple-key-deep"],
)
def test_nested_mappings_need_string_keys(nested):
    buffer = io.BytesIO()
    with pytest.raises(ValueError, match=r"Parquet record 1025 has a non-string key .* 'm'"):
        write_parquet_shard([{"m": {"k": 0}}] * 1025 + [nested], buffer)
    assert buffer.getvalue() == b""


def test_nested_mappings_that_are_not_dicts_are_written_as_structs():
    records = [
        MappingProxyType({"id": 1, "m": MappingProxyType({"a": [MappingProxyType({"b": 2})]})})
    ]
    assert table(encode(records)).to_pylist() == [{"id": 1, "m": {"a": [{"b": 2}]}}]


def test_writer_spool_is_removed(temp_dir):
    encode(text_records(2100))
    with pytest.raises(ValueError):
        encode([{"a": 1}] * 1500 + [{"a": "x"}] * 1024)
    assert list(temp_dir.iterdir()) == []


# --- reader ---------------------------------------------------------------------------------


def test_round_trip_through_iter_shard(store):
    root, config = store
    records = text_records(3000)
    shard = publish(f"{root}/part.parquet", encode(records), config, len(records))
    rows = list(iter_shard("parquet", shard, storage_config=config))
    assert rows == records
    assert [list(row) for row in rows[:2]] == [list(records[0]), list(records[1])]


def test_declared_more_records_than_the_file_holds(store):
    root, config = store
    shard = publish(f"{root}/p.parquet", encode(text_records(10)), config, 12)
    rows = []
    with pytest.raises(RuntimeError) as info:
        rows.extend(iter_shard("parquet", shard, storage_config=config))
    assert str(info.value) == (
        f"Unreadable parquet shard {shard.uri}: declared 12 records but yielded 10"
    )
    assert len(rows) == 10


def test_declared_fewer_records_yields_exactly_those(store):
    root, config = store
    records = text_records(2000)
    shard = publish(f"{root}/p.parquet", encode(records), config, 1500)
    rows = []
    with pytest.raises(RuntimeError) as info:
        rows.extend(iter_shard("parquet", shard, storage_config=config))
    assert str(info.value) == (
        f"Unreadable parquet shard {shard.uri}: declared 1500 records but found more"
    )
    assert rows == records[:1500]


@pytest.mark.parametrize(
    "corrupt",
    [
        lambda data: b"not a parquet file at all" * 10,
        lambda data: data[: len(data) // 2],
        lambda data: data[:100] + bytes(200) + data[300:],
    ],
    ids=["not-parquet", "truncated", "zeroed-pages"],
)
def test_corrupt_file_is_unreadable_chained_to_pyarrow(tmp_path, temp_dir, corrupt):
    data = corrupt(encode(text_records(500)))
    shard = local_shard(tmp_path, data, 500)
    with pytest.raises(RuntimeError) as info:
        list(iter_shard("parquet", shard, storage_config=StorageConfig()))
    assert str(info.value).startswith(f"Unreadable parquet shard {shard.uri}: ")
    assert info.value.__cause__ is not None
    assert list(temp_dir.iterdir()) == []


@pytest.mark.parametrize("delta", [-1, 1])
def test_size_mismatch_is_unreadable(store, temp_dir, delta):
    root, config = store
    data = encode(text_records(20))
    info = storage.put_object(f"{root}/p.parquet", data, storage_config=config)
    shard = ManifestShard(uri=info.uri, records=20, size_bytes=len(data) + delta)
    with pytest.raises(RuntimeError) as error:
        list(iter_shard("parquet", shard, storage_config=config))
    assert str(error.value).startswith(f"Unreadable parquet shard {shard.uri}: size mismatch")
    assert list(temp_dir.iterdir()) == []


def test_missing_object_is_file_not_found(tmp_path, temp_dir):
    shard = ManifestShard(uri=f"file://{tmp_path}/missing.parquet", records=1, size_bytes=10)
    with pytest.raises(FileNotFoundError, match="missing.parquet"):
        list(iter_shard("parquet", shard))
    assert list(temp_dir.iterdir()) == []


def test_changed_object_fails_closed(seaweed, s3_bucket, unique_prefix):
    config = config_for(seaweed)
    data = encode(text_records(5))
    shard = publish(f"s3://{s3_bucket}/{unique_prefix}/p.parquet", data, config, 5)
    stale = shard.model_copy(update={"etag": '"0123456789abcdef0123456789abcdef"'})
    with pytest.raises(ObjectChangedError):
        list(iter_shard("parquet", stale, storage_config=config))


def test_temporary_file_removed_after_read_early_close_and_error(store, temp_dir):
    root, config = store
    records = text_records(3000)
    shard = publish(f"{root}/t.parquet", encode(records), config, len(records))
    # An s3:// shard is downloaded to an unlinked temporary file; a file:// one read in place.

    assert list(iter_parquet_shard(shard, storage_config=config)) == records
    assert list(temp_dir.iterdir()) == []

    rows = iter_parquet_shard(shard, storage_config=config)
    assert next(rows) == records[0]
    assert list(temp_dir.iterdir()) == []
    rows.close()
    assert list(temp_dir.iterdir()) == []

    rows = iter_parquet_shard(shard, storage_config=config)
    next(rows)
    with pytest.raises(KeyError):
        rows.throw(KeyError("consumer failed"))
    assert list(temp_dir.iterdir()) == []

    wrong = shard.model_copy(update={"records": 10})
    with pytest.raises(RuntimeError, match="found more"):
        list(iter_parquet_shard(wrong, storage_config=config))
    assert list(temp_dir.iterdir()) == []


def test_local_shard_read_in_place_is_checked_before_and_after(tmp_path):
    records = text_records(3000)
    data = encode(records)
    shard = local_shard(tmp_path, data, len(records))
    path = Path(shard.uri[len("file://") :])

    short = shard.model_copy(update={"size_bytes": len(data) + 1})
    with pytest.raises(RuntimeError, match=r"Unreadable parquet shard .*size mismatch"):
        next(iter_parquet_shard(short))
    # SPEC 4: a local etag in the manifest is not enforced (it does not survive a copy).
    stale = shard.model_copy(update={"etag": "not-the-etag"})
    assert list(iter_parquet_shard(stale)) == records

    # The file is rewritten (same size, new mtime) while its rows are read: fails closed.
    rows = iter_parquet_shard(shard)
    assert next(rows) == records[0]
    path.write_bytes(data)
    os.utime(path, ns=(time.time_ns() + 10**9, time.time_ns() + 10**9))
    with pytest.raises(ObjectChangedError, match="s.parquet"):
        list(rows)


def test_rows_are_fresh_dicts_with_shared_keys(tmp_path):
    shard = local_shard(tmp_path, encode([{"key": i} for i in range(3000)]), 3000)
    rows = list(iter_parquet_shard(shard))
    assert rows == [{"key": i} for i in range(3000)]
    assert all(type(row) is dict for row in rows)
    keys = {id(next(iter(row))) for row in rows}
    assert len(keys) == 1
    rows[0]["key"] = "mutated"
    assert rows[1]["key"] == 1


def test_foreign_file_with_large_row_groups_and_fallback_types(tmp_path):
    # A file written by another tool: one big row group, types the Rust path leaves to pyarrow.
    count = 20_000
    source = pa.table(
        {
            "i": pa.array(range(count), pa.int32()),
            "when": pa.array(
                [
                    datetime.datetime(2024, 1, 1) + datetime.timedelta(seconds=i)
                    for i in range(count)
                ],
                pa.timestamp("us"),
            ),
            "cat": pa.array([["x", "y", "z"][i % 3] for i in range(count)]).dictionary_encode(),
        }
    )
    buffer = io.BytesIO()
    pq.write_table(source, buffer, row_group_size=count)
    shard = local_shard(tmp_path, buffer.getvalue(), count)
    assert list(iter_parquet_shard(shard)) == source.to_pylist()


def test_missing_pyarrow_names_the_extra(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    hint = 'pip install "syvain-training-data[parquet]"'
    with pytest.raises(ModuleNotFoundError, match="'parquet' extra") as info:
        write_parquet_shard([{"a": 1}], tmp_path / "x.parquet")
    assert hint in str(info.value)
    shard = ManifestShard(uri=f"file://{tmp_path}/x.parquet", records=1, size_bytes=1)
    with pytest.raises(ModuleNotFoundError, match="'parquet' extra") as info:
        next(iter_shard("parquet", shard))
    assert hint in str(info.value)


# --- rows_from_arrow against to_pylist --------------------------------------------------------


def rows_of(batch: pa.RecordBatch) -> list[dict[str, Any]]:
    schema, array = batch.__arrow_c_array__()
    asked: list[int] = []

    def fallback(index: int) -> list[Any]:
        asked.append(index)
        return batch.column(index).to_pylist()

    rows = _native.rows_from_arrow(schema, array, fallback)
    rows_of.asked = asked  # type: ignore[attr-defined]
    return rows


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


NATIVE_ARRAYS = {
    "null": pa.nulls(5),
    "bool": pa.array([True, None, False, True, False]),
    "int8": pa.array([-128, 127, None, 0, -6], pa.int8()),
    "int16": pa.array([-(2**15), 2**15 - 1, None, 0, 300], pa.int16()),
    "int32": pa.array([-(2**31), 2**31 - 1, None, 0, 70000], pa.int32()),
    "int64": pa.array([-(2**63), 2**63 - 1, None, 0, 70000], pa.int64()),
    "uint8": pa.array([0, 255, None, 1, 2], pa.uint8()),
    "uint16": pa.array([0, 2**16 - 1, None, 1, 2], pa.uint16()),
    "uint32": pa.array([0, 2**32 - 1, None, 1, 2], pa.uint32()),
    "uint64": pa.array([0, 2**64 - 1, None, 2**63, 2], pa.uint64()),
    "float32": pa.array([0.1, float("inf"), None, float("nan"), -0.0], pa.float32()),
    "float64": pa.array([0.1, float("-inf"), None, float("nan"), 1e300]),
    "string": pa.array(["a", "", None, "δέλτα 🎉", "x" * 1000]),
    "large_string": pa.array(["a", "", None, "ζ", "b"], pa.large_string()),
    "binary": pa.array([b"a", b"", None, b"\x00\xff", b"z"]),
    "large_binary": pa.array([b"a", b"", None, b"\x00", b"z"], pa.large_binary()),
    "fixed_binary": pa.array([b"ab", b"cd", None, b"\x00\x01", b"zz"], pa.binary(2)),
    "list": pa.array([[1, 2], [], None, [None, 3], [4]]),
    "large_list": pa.array([["a"], [], None, [None], ["b", "c"]], pa.large_list(pa.string())),
    "fixed_list": pa.array([[1, 2], [3, 4], None, [None, 5], [6, 7]], pa.list_(pa.int16(), 2)),
    "nested_list": pa.array([[[1], []], None, [[None]], [], [[2, 3]]]),
    "struct": pa.array(
        [{"a": 1, "b": "x"}, None, {"a": None, "b": None}, {"a": 2, "b": "y"}, {"a": 3}],
        pa.struct([("a", pa.int64()), ("b", pa.string())]),
    ),
    "struct_of_list": pa.array(
        [{"l": [1.5], "s": {"t": True}}, {"l": None, "s": None}, None, {"l": []}, {"s": {}}],
        pa.struct([("l", pa.list_(pa.float64())), ("s", pa.struct([("t", pa.bool_())]))]),
    ),
    "map": pa.array(
        [[("a", 1)], [], None, [("b", None), ("c", 3)], [("a", 1), ("a", 2)]],
        pa.map_(pa.string(), pa.int64()),
    ),
    "list_of_struct": pa.array([[{"x": 1}], None, [], [None, {"x": None}], [{"x": 5}]]),
}

FALLBACK_ARRAYS = {
    "float16": pa.array([1.5, None, 2.0, 0.0, 3.0], pa.float16()),
    "timestamp": pa.array([datetime.datetime(2024, 1, 2, 3, 4, 5)] * 4 + [None]),
    "date": pa.array([datetime.date(2024, 1, 2)] * 4 + [None]),
    "decimal": pa.array([decimal.Decimal("1.25")] * 4 + [None]),
    "dictionary": pa.array(["a", "b", None, "a", "c"]).dictionary_encode(),
    "string_view": pa.array(["a", "b", None, "c", "d"], pa.string_view()),
    "list_of_timestamp": pa.array([[datetime.datetime(2024, 1, 1)], None, [], [None], []]),
    # Extension types: to_pylist may give other values than the storage type's.
    "uuid": pa.ExtensionArray.from_storage(
        pa.uuid(), pa.array([uuid.UUID(int=i).bytes for i in range(4)] + [None], pa.binary(16))
    ),
    "bool8": pa.ExtensionArray.from_storage(pa.bool8(), pa.array([1, 0, None, 2, 0], pa.int8())),
    "list_of_uuid": pa.ListArray.from_arrays(
        pa.array([0, 1, 1, 1, 2, 4], pa.int32()),
        pa.ExtensionArray.from_storage(
            pa.uuid(), pa.array([uuid.UUID(int=i).bytes for i in range(4)], pa.binary(16))
        ),
        mask=pa.array([False, True, False, False, False]),
    ),
}


@pytest.mark.parametrize("name", sorted(NATIVE_ARRAYS))
def test_native_conversion_matches_to_pylist(name):
    array = NATIVE_ARRAYS[name]
    batch = pa.record_batch({name: array, "i": pa.array(range(len(array)))})
    rows = rows_of(batch)
    assert rows_of.asked == []  # type: ignore[attr-defined]
    assert_same(rows, batch.to_pylist())
    for start, length in [(1, 3), (2, 3), (4, 1), (5, 0)]:
        part = batch.slice(start, length)
        assert_same(rows_of(part), part.to_pylist())


@pytest.mark.parametrize("name", sorted(NATIVE_ARRAYS))
def test_empty_arrays_of_every_native_type(name):
    empty = pa.array([], NATIVE_ARRAYS[name].type)
    assert rows_of(pa.RecordBatch.from_arrays([empty], names=[name])) == []
    for source in (pa.nulls(0, empty.type), NATIVE_ARRAYS[name].slice(5)):
        assert rows_of(pa.RecordBatch.from_arrays([source], names=[name])) == []


@pytest.mark.parametrize("name", sorted(FALLBACK_ARRAYS))
def test_other_types_go_through_the_fallback(name):
    array = FALLBACK_ARRAYS[name]
    batch = pa.record_batch({"i": pa.array(range(5)), name: array})
    rows = rows_of(batch.slice(1, 4))
    assert rows_of.asked == [1]  # type: ignore[attr-defined]
    assert_same(rows, batch.slice(1, 4).to_pylist())


def test_field_metadata_other_than_extensions_stays_native():
    field = pa.field("v", pa.int64(), metadata={"PARQUET:field_id": "7", "note": "x" * 100})
    batch = pa.RecordBatch.from_arrays([pa.array([1, None, 3])], schema=pa.schema([field]))
    assert_same(rows_of(batch), batch.to_pylist())
    assert rows_of.asked == []  # type: ignore[attr-defined]


def test_struct_with_duplicate_field_names_fails_like_to_pylist():
    array = pa.StructArray.from_arrays([pa.array([1, 2]), pa.array([3, 4])], names=["d", "d"])
    batch = pa.record_batch({"s": array})
    with pytest.raises(ValueError, match="duplicate field names"):
        batch.to_pylist()
    with pytest.raises(ValueError, match="duplicate field names"):
        rows_of(batch)


def test_sliced_nested_columns_and_repeated_names():
    array = pa.array([[{"k": [i, None]}] * (i % 3) if i % 4 else None for i in range(50)])
    batch = pa.RecordBatch.from_arrays([array, pa.array(range(50)), array], names=["a", "b", "a"])
    for start in range(0, 50, 7):
        part = batch.slice(start, 9)
        assert_same(rows_of(part), part.to_pylist())


def test_zero_column_batches_and_bad_input():
    empty = pa.RecordBatch.from_struct_array(pa.array([{}] * 3, pa.struct([])))
    assert rows_of(empty) == [{}, {}, {}]
    schema, array = pa.record_batch({"a": [1]}).__arrow_c_array__()
    with pytest.raises(TypeError, match="arrow_schema"):
        _native.rows_from_arrow(array, schema, lambda index: [])
    column_schema, column_array = pa.array([1, 2]).__arrow_c_array__()
    with pytest.raises(ValueError, match="record batch"):
        _native.rows_from_arrow(column_schema, column_array, lambda index: [])
    batch = pa.record_batch({"f": pa.array([1.5, 2.5], pa.float16())})
    with pytest.raises(ValueError, match="fallback gave 1 values for column 0 of 2 rows"):
        _native.rows_from_arrow(*batch.__arrow_c_array__(), lambda index: [1])
    invalid = pa.Array.from_buffers(
        pa.string(),
        1,
        [None, pa.py_buffer(b"\x00\x00\x00\x00\x02\x00\x00\x00"), pa.py_buffer(b"\xff\xfe")],
    )
    with pytest.raises(UnicodeDecodeError):
        _native.rows_from_arrow(*pa.record_batch({"s": invalid}).__arrow_c_array__(), list)


def test_many_rows_match_to_pylist_exactly():
    records = text_records(2500, seed=7)
    batch = pa.Table.from_pylist(records).combine_chunks().to_batches()[0]
    for start in (0, 1000, 2048):
        part = batch.slice(start, 1024)
        assert_same(rows_of(part), part.to_pylist())


def decode_threads() -> int:
    return sum(thread.name == "syvain-parquet-decode" for thread in threading.enumerate())


def test_decode_thread_stops_on_early_close_and_at_the_end(tmp_path, monkeypatch):
    monkeypatch.setattr(parquet, "DECODE_BATCH_BYTES", 1)  # BATCH_ROWS rows per decoded batch
    full = threading.Event()

    class WatchedQueue(queue.Queue):
        """The helper's handoff queue, which tells when the helper finds it full."""

        def put(self, item, block=True, timeout=None):
            if self.full():
                full.set()
            super().put(item, block, timeout)

    monkeypatch.setattr(
        parquet, "queue", SimpleNamespace(Queue=WatchedQueue, Full=queue.Full, Empty=queue.Empty)
    )
    records = text_records(8000)
    shard = local_shard(tmp_path, encode(records), len(records))
    rows = iter_parquet_shard(shard)
    assert next(rows) == records[0]
    # The helper fills its handoff queue and waits (a hang guard only, never a measure).
    assert full.wait(60), "the decode helper never filled its queue"
    assert decode_threads() == 1
    rows.close()
    assert decode_threads() == 0
    assert list(iter_parquet_shard(shard)) == records
    assert decode_threads() == 0


def test_decode_error_mid_file_is_unreadable(tmp_path, temp_dir, monkeypatch):
    monkeypatch.setattr(parquet, "ROW_GROUP_ROWS", 1024)
    monkeypatch.setattr(parquet, "DECODE_BATCH_BYTES", 1)
    records = text_records(6000)
    data = bytearray(encode(records))
    metadata = pq.ParquetFile(pa.BufferReader(bytes(data))).metadata
    column = metadata.row_group(4).column(1)  # the text pages of the fifth row group
    start = column.data_page_offset + 64
    data[start : start + 256] = bytes(range(256))
    shard = local_shard(tmp_path, bytes(data), len(records))
    rows = []
    with pytest.raises(RuntimeError) as info:
        rows.extend(iter_parquet_shard(shard))
    assert str(info.value).startswith(f"Unreadable parquet shard {shard.uri}: ")
    assert isinstance(info.value.__cause__, pa.ArrowException | OSError)
    assert rows == records[: len(rows)] and 0 < len(rows) <= 4 * 1024
    assert decode_threads() == 0
    assert list(temp_dir.iterdir()) == []


# --- row ranges -------------------------------------------------------------------------------

RANGE_ROWS = 1000
GROUP_ROWS = 100  # ten row groups of 100 rows


def grouped_parquet() -> tuple[list[dict[str, Any]], bytes]:
    records = [{"id": index, "text": f"row {index}"} for index in range(RANGE_ROWS)]
    sink = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(records), sink, row_group_size=GROUP_ROWS)
    return records, sink.getvalue()


@pytest.mark.parametrize(
    ("start", "stop"),
    [
        (0, RANGE_ROWS),
        (0, 0),
        (0, 1),
        (100, 300),  # row-group boundaries
        (150, 420),  # inside groups
        (99, 101),
        (250, 250),
        (999, 1000),
        (1000, 1000),
        (830, None),
    ],
)
def test_row_ranges(store, start, stop):
    root, config = store
    records, data = grouped_parquet()
    shard = publish(f"{root}/ranges.parquet", data, config, RANGE_ROWS)
    rows = list(iter_parquet_shard(shard, storage_config=config, start=start, stop=stop))
    assert rows == records[start:stop]


def test_row_groups_before_start_are_not_decoded(tmp_path):
    records, data = grouped_parquet()
    corrupt = bytearray(data)
    metadata = pq.ParquetFile(pa.BufferReader(data)).metadata
    for group in range(3):  # garble every page of the first three row groups
        for index in range(metadata.num_columns):
            column = metadata.row_group(group).column(index)
            first = column.dictionary_page_offset or column.data_page_offset
            corrupt[first : first + column.total_compressed_size] = bytes(
                column.total_compressed_size
            )
    shard = local_shard(tmp_path, bytes(corrupt), RANGE_ROWS)
    with pytest.raises(RuntimeError, match="Unreadable parquet shard"):
        list(iter_parquet_shard(shard))
    assert list(iter_parquet_shard(shard, start=300)) == records[300:]
    assert list(iter_parquet_shard(shard, start=310, stop=320)) == records[310:320]


def test_counts_with_ranges(store):
    root, config = store
    records, data = grouped_parquet()
    # The manifest claims more rows than the file holds: a range inside what it holds reads.
    more = publish(f"{root}/more.parquet", data, config, RANGE_ROWS + 200)
    assert list(iter_parquet_shard(more, storage_config=config, stop=500)) == records[:500]
    with pytest.raises(RuntimeError, match=f"declared {RANGE_ROWS + 200} records but yielded"):
        list(iter_parquet_shard(more, storage_config=config, start=900, stop=1100))
    with pytest.raises(RuntimeError, match="but yielded 1000"):
        list(iter_parquet_shard(more, storage_config=config, start=900))
    # It claims fewer: the full count check applies when stop is the declared count.
    fewer = publish(f"{root}/fewer.parquet", data, config, 800)
    assert list(iter_parquet_shard(fewer, storage_config=config, stop=799)) == records[:799]
    rows: list[Any] = []
    with pytest.raises(RuntimeError, match="declared 800 records but found more"):
        rows.extend(iter_parquet_shard(fewer, storage_config=config, start=750))
    assert rows == records[750:800]


@pytest.mark.parametrize(
    ("start", "stop"), [(-1, None), (0, RANGE_ROWS + 1), (5, 4), (True, None), (0, 2.0)]
)
def test_bad_ranges_are_value_errors_at_once(tmp_path, start, stop):
    shard = ManifestShard(uri=f"file://{tmp_path}/none.parquet", records=RANGE_ROWS, size_bytes=1)
    with pytest.raises(ValueError, match="none.parquet"):
        iter_parquet_shard(shard, start=start, stop=stop)


# --- special files and temporary space ----------------------------------------------------------


def test_a_fifo_or_device_is_refused_without_hanging(tmp_path):
    fifo = tmp_path / "fifo.parquet"
    os.mkfifo(fifo)
    for path in (fifo, Path("/dev/null"), Path("/dev/zero")):
        shard = ManifestShard(uri=f"file://{path}", records=1, size_bytes=100)
        with pytest.raises(OSError, match="not a regular file") as info:
            next(iter_parquet_shard(shard))
        assert str(path) in str(info.value)
    directory = ManifestShard(uri=f"file://{tmp_path}", records=1, size_bytes=100)
    with pytest.raises(IsADirectoryError, match="not a regular file"):
        next(iter_parquet_shard(directory))


def test_too_little_temporary_space_fails_at_once(seaweed, s3_bucket, unique_prefix, monkeypatch):
    config = config_for(seaweed)
    data = encode(text_records(50))
    shard = publish(f"s3://{s3_bucket}/{unique_prefix}/big.parquet", data, config, 50)
    real = parquet.shutil.disk_usage
    monkeypatch.setattr(
        parquet.shutil, "disk_usage", lambda path: real(path)._replace(free=len(data) - 1)
    )
    with pytest.raises(OSError) as info:
        next(iter_parquet_shard(shard, storage_config=config))
    message = str(info.value)
    assert shard.uri in message and f"({len(data)} bytes)" in message
    assert tempfile.gettempdir() in message


_KILLED_READER = """
import sys
from syvain_training_data import ManifestShard, SyvainTrainingData
from syvain_training_data.formats.parquet import iter_parquet_shard
shard = ManifestShard.model_validate_json(sys.argv[1])
rows = iter_parquet_shard(shard, storage_config=SyvainTrainingData.from_env().storage_config)
next(rows)
print("reading", flush=True)
sys.stdin.read()
"""


def test_a_killed_reader_leaves_no_temporary_file(seaweed, s3_bucket, unique_prefix, tmp_path):
    import signal
    import subprocess

    config = config_for(seaweed)
    shard = publish(
        f"s3://{s3_bucket}/{unique_prefix}/k.parquet", encode(text_records(3000)), config, 3000
    )
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = {**os.environ, **seaweed.env(), "TMPDIR": str(temp)}
    process = subprocess.Popen(
        [sys.executable, "-c", _KILLED_READER, shard.model_dump_json()],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline() == b"reading\n"
        process.send_signal(signal.SIGKILL)
    finally:
        process.kill()
        process.communicate()
    assert process.returncode == -signal.SIGKILL
    assert list(temp.iterdir()) == []


# --- decoded-size bounds (hostile shards) -----------------------------------------------------


def dictionary_bomb(rows: int, value_bytes: int = 1 << 20, columns: str = "abcd") -> bytes:
    """A shard of a few KiB whose columns each reference one large dictionary value from every
    row: ``rows * len(columns) * value_bytes`` bytes once decoded."""
    value = pa.array(["a" * value_bytes])
    indices = pa.array([0] * rows, pa.int32())
    bomb = pa.table({name: pa.DictionaryArray.from_arrays(indices, value) for name in columns})
    buffer = io.BytesIO()
    # No stored Arrow schema: the columns read as plain strings, as from a writer of another
    # language (an Arrow schema in the file would ask for dictionary columns).
    pq.write_table(bomb, buffer, compression="zstd", use_dictionary=True, store_schema=False)
    return buffer.getvalue()


def test_a_dictionary_bomb_reads_in_bounded_memory(tmp_path):
    """1,024 rows x 4 columns referencing one 1 MiB value: 4 GiB decoded, read in pieces of
    at most 64 MiB of values (before: one 4 GiB batch, 8.3 GB RSS for 4,096 rows)."""
    data = dictionary_bomb(1024)
    assert len(data) < 4096
    shard = local_shard(tmp_path, data, 1024)
    script = f"""
from syvain_training_data import ManifestShard
from syvain_training_data.formats.parquet import iter_parquet_batches
shard = ManifestShard.model_validate_json({shard.model_dump_json()!r})
rows = 0
for batch in iter_parquet_batches(shard, batch_size=8192):
    assert batch.schema.field("a").type == "string", batch.schema
    assert batch.column("d")[0].as_py() == "a" * (1 << 20)
    rows += batch.num_rows
# VmHWM, not ru_maxrss: Linux keeps ru_maxrss across exec, so it would show the test
# process's own peak.
hwm = next(line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(rows, int(hwm) // 1024)
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    rows, peak_mib = map(int, done.stdout.split())
    assert rows == 1024
    assert peak_mib < 1024, f"peak RSS {peak_mib} MiB"


def test_rows_of_a_dictionary_bomb_come_out_whole_and_in_order(tmp_path, monkeypatch):
    monkeypatch.setattr(parquet_bounds, "PIECE_BYTES", 3 * 1024)  # pieces of 3 rows x 1 KiB
    data = dictionary_bomb(10, value_bytes=1024, columns="a")
    rows = list(iter_shard("parquet", local_shard(tmp_path, data, 10)))
    assert rows == [{"a": "a" * 1024}] * 10


def test_a_row_over_the_record_limit_is_an_error_naming_the_shard(tmp_path, monkeypatch):
    monkeypatch.setattr(parquet_bounds, "MAX_ROW_BYTES", 3 * 1024)
    data = dictionary_bomb(4, value_bytes=1024)  # 4 KiB per row
    shard = local_shard(tmp_path, data, 4)
    with pytest.raises(RuntimeError, match=r"Unreadable parquet shard file://.*over the limit"):
        list(iter_shard("parquet", shard))
