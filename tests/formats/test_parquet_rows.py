"""The Rust row builder of the Parquet reader (``_native.rows_from_arrow``) against pyarrow's
``to_pylist``, for every Arrow type it converts and those it leaves to pyarrow."""

from __future__ import annotations

import datetime
import decimal
import uuid
from typing import Any

import pyarrow as pa
import pytest

from parquet_helpers import assert_same, parquet_records
from syvain_training_data import _native


def rows_of(batch: pa.RecordBatch) -> list[dict[str, Any]]:
    schema, array = batch.__arrow_c_array__()
    asked: list[int] = []

    def fallback(index: int) -> list[Any]:
        asked.append(index)
        return batch.column(index).to_pylist()

    rows = _native.rows_from_arrow(schema, array, fallback)
    rows_of.asked = asked  # type: ignore[attr-defined]
    return rows


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
    records = parquet_records(2500, seed=7)
    batch = pa.Table.from_pylist(records).combine_chunks().to_batches()[0]
    for start in (0, 1000, 2048):
        part = batch.slice(start, 1024)
        assert_same(rows_of(part), part.to_pylist())
