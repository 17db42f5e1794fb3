"""The Parquet writer (SPEC section 3): columns in first-seen order, permissive promotion across
batches, zstd row groups, identical bytes for identical records, the errors, and its spool."""

from __future__ import annotations

import hashlib
import io
from types import MappingProxyType
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from parquet_helpers import assert_same, encode, parquet_records, table
from syvain_training_data.formats.parquet import write_parquet_shard, writer


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
        result = writer._promote(pa, part, target)
        assert result.type == target
        assert_same(result.to_pylist(), expected)
    assert writer._promote(pa, array.slice(3, 0), target).type == target


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
    monkeypatch.setattr(writer, "ROW_GROUP_ROWS", 2048)
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
    records = parquet_records(2500)
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
    encode(parquet_records(2100))
    with pytest.raises(ValueError):
        encode([{"a": 1}] * 1500 + [{"a": "x"}] * 1024)
    assert list(temp_dir.iterdir()) == []
