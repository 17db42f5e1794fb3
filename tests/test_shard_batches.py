"""`iter_shard_batches`: Arrow record batches built in Rust from msgpack.zstf and jsonl.gz shards
(and pyarrow's own for Parquet): round trips against pyarrow's inference of the same records,
the schema rules, column selection, ranges, consumers, real stores and bounded memory. Its
errors are in test_shard_batch_errors.py."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import torch

from memory import run_child
from native_codec import (
    MIB,
    MSGPACK,
    URI,
    batches,
    both_paths,
    common_records,
    encode,
    table,
)
from seaweed import config_for
from shards import NATIVE_FORMATS, encode_shard, publish, text_records
from syvain_training_data import ManifestShard, _native, iter_shard, iter_shard_batches
from syvain_training_data._native import shard_batches_from_bytes


def expected_table(records: list[dict[str, Any]]) -> pa.Table:
    """pyarrow's inference of the records: columns in first-seen key order, nulls for missing
    keys, int64 / double / string / binary / bool / list / struct."""
    return pa.Table.from_batches([pa.RecordBatch.from_struct_array(pa.array(records))])


# Round trips and schema rules.


@pytest.mark.parametrize("data_format", NATIVE_FORMATS)
def test_round_trip_matches_pyarrow_inference(data_format: str) -> None:
    records = [
        {"i": 1, "f": 0.5, "s": "héllo ☃", "b": True, "none": None, "tokens": [1, 2, 3]},
        {"i": -(2**63), "f": 2, "s": "", "b": False, "tokens": [], "extra": {"x": [1.5]}},
        {"i": 2**63 - 1, "f": -1.25, "nested": {"a": [{"b": "c"}, {"d": None}]}},
        {"tokens": [2**31, -(2**40)], "extra": {"y": "z"}, "lists": [[1], [], [2, 3]]},
    ]
    data = encode(data_format, records)
    got = table(data_format, data, len(records), batch_size=len(records))
    assert got.equals(expected_table(records)), (got.schema, expected_table(records).schema)
    assert got.to_pylist() == expected_table(records).to_pylist()


def test_msgpack_bytes_become_binary() -> None:
    records = [{"blob": b"\x00\xff"}, {"blob": b""}, {}]
    got = table(MSGPACK, encode(MSGPACK, records), 3)
    assert got.schema.field("blob").type == pa.binary()
    assert got.column("blob").to_pylist() == [b"\x00\xff", b"", None]


@pytest.mark.parametrize("data_format", NATIVE_FORMATS)
def test_records_of_the_codec_tests_round_trip(data_format: str) -> None:
    # Those whose columns Arrow can hold (no int beyond int64, no list of ints and lists).
    unfit = ("ints", "mixed", "nested")
    records = [r for r in common_records() if not any(key in r for key in unfit)]
    got = table(data_format, encode(data_format, records), len(records), batch_size=len(records))
    assert got.equals(expected_table(records))


@pytest.mark.parametrize("data_format", NATIVE_FORMATS)
def test_ints_and_floats_promote_within_a_batch_and_each_batch_has_its_own_schema(
    data_format: str,
) -> None:
    records = [{"v": 1}, {"v": 2.5}, {"v": None}, {"v": 3}]
    data = encode(data_format, records)
    one = batches(data_format, data, 4, batch_size=4)
    assert [b.schema.field("v").type for b in one] == [pa.float64()]
    assert one[0].column("v").to_pylist() == [1.0, 2.5, None, 3.0]
    two = batches(data_format, data, 4, batch_size=1)
    assert [b.schema.field("v").type for b in two] == [
        pa.int64(),
        pa.float64(),
        pa.null(),
        pa.int64(),
    ]
    # Batches of different schemas unify the way the Parquet writer unifies them.
    merged = pa.concat_tables([pa.table(b) for b in two], promote_options="permissive")
    assert merged.column("v").to_pylist() == [1.0, 2.5, None, 3.0]


@pytest.mark.parametrize("data_format", NATIVE_FORMATS)
def test_missing_keys_are_nulls_and_nested_maps_are_structs(data_format: str) -> None:
    records = [{"a": {"x": 1}}, {"b": "only b"}, {"a": {"y": [True]}, "b": None}]
    got = table(data_format, encode(data_format, records), 3)
    assert got.schema == pa.schema(
        [
            ("a", pa.struct([("x", pa.int64()), ("y", pa.list_(pa.bool_()))])),
            ("b", pa.string()),
        ]
    )
    assert got.to_pylist() == [
        {"a": {"x": 1, "y": None}, "b": None},
        {"a": None, "b": "only b"},
        {"a": {"x": None, "y": [True]}, "b": None},
    ]


# Column selection, batch sizes and ranges.


@pytest.mark.parametrize("data_format", NATIVE_FORMATS)
def test_columns_select_in_order_and_skip_the_rest(data_format: str) -> None:
    records = [{"a": i, "skip": {"deep": [1, "mixed", {"x": None}]}, "b": str(i)} for i in range(5)]
    got = table(data_format, encode(data_format, records), 5, columns=["b", "nope", "a"])
    assert got.column_names == ["b", "nope", "a"]
    assert got.schema.field("nope").type == pa.null()
    assert got.column("a").to_pylist() == list(range(5))


def test_columns_argument_errors() -> None:
    data = encode(MSGPACK, [{"a": 1}])
    with pytest.raises(ValueError, match="at least one column"):
        shard_batches_from_bytes(MSGPACK, URI, data, 1, columns=[])
    with pytest.raises(ValueError, match="more than once"):
        shard_batches_from_bytes(MSGPACK, URI, data, 1, columns=["a", "a"])
    with pytest.raises(ValueError, match="batch_size must be positive"):
        shard_batches_from_bytes(MSGPACK, URI, data, 1, batch_size=0)


@pytest.mark.parametrize("data_format", NATIVE_FORMATS)
def test_batch_size_and_ranges(data_format: str) -> None:
    records = [{"i": i, "tokens": list(range(i % 7))} for i in range(100)]
    data = encode(data_format, records)
    sizes = [b.num_rows for b in batches(data_format, data, 100, batch_size=16)]
    assert sizes == [16] * 6 + [4]
    for start, stop in [(0, 100), (10, 20), (99, 100), (0, 0), (50, None)]:
        got = table(data_format, data, 100, start=start, stop=stop, batch_size=7)
        end = 100 if stop is None else stop
        assert (got.column("i").to_pylist() if len(got) else []) == list(range(start, end))
        both_paths(data_format, data, 100, start=start, stop=stop)


def test_batches_are_cut_by_size() -> None:
    records = [{"text": "x" * MIB} for _ in range(40)]
    got = batches(MSGPACK, encode(MSGPACK, records), 40)
    assert sum(b.num_rows for b in got) == 40
    assert max(b.num_rows for b in got) <= _native.BATCH_BYTES // MIB + 1 < 40


# Consumers.


def test_int_list_buffers_reach_numpy_and_torch_without_a_copy() -> None:
    records = [{"tokens": [1, 2, 3]}, {"tokens": []}, {"tokens": [2**40]}]
    [batch] = shard_batches_from_bytes(MSGPACK, URI, encode(MSGPACK, records), 3)
    offsets, values = batch.int_list_buffers("tokens")
    assert np.frombuffer(offsets, dtype=np.int32).tolist() == [0, 3, 3, 4]
    tokens = torch.frombuffer(values, dtype=torch.int64)
    assert tokens.tolist() == [1, 2, 3, 2**40]
    view = memoryview(values)
    assert (view.format, view.itemsize, view.readonly, len(values)) == ("q", 8, True, 4)
    # The same memory pyarrow sees.
    arrow_values = pa.record_batch(batch).column("tokens").values
    assert arrow_values.buffers()[1].address == np.frombuffer(values, dtype=np.int64).ctypes.data
    with pytest.raises(KeyError):
        batch.int_list_buffers("missing")
    [mixed] = shard_batches_from_bytes(MSGPACK, URI, encode(MSGPACK, [{"t": [1, None]}]), 1)
    with pytest.raises(ValueError, match="not a list of integers without nulls"):
        mixed.int_list_buffers("t")


def test_polars_and_streams_take_the_batch() -> None:
    [batch] = shard_batches_from_bytes(MSGPACK, URI, encode(MSGPACK, [{"a": 1}, {"a": 2}]), 2)
    assert pa.RecordBatchReader.from_stream(batch).read_all().column("a").to_pylist() == [1, 2]
    assert pa.table(batch).num_rows == 2
    assert batch.num_rows == len(batch) == 2 and batch.column_names == ["a"]
    assert "a: Int64" in repr(batch)


# Real stores.


@pytest.mark.parametrize("data_format", NATIVE_FORMATS)
def test_stores_round_trip(store_root, data_format: str) -> None:
    root, config = store_root
    records = text_records(500)
    shard = publish(f"{root}/part.{data_format}", encode_shard(data_format, records), config, 500)
    got = pa.Table.from_batches(
        pa.record_batch(batch)
        for batch in iter_shard_batches(data_format, shard, storage_config=config, batch_size=128)
    )
    assert got.to_pylist() == list(iter_shard(data_format, shard, storage_config=config))
    tokens = pa.Table.from_batches(
        pa.record_batch(batch)
        for batch in iter_shard_batches(
            data_format, shard, storage_config=config, columns=["tokens"], start=100, stop=300
        )
    )
    assert tokens.column("tokens").to_pylist() == [r["tokens"] for r in records[100:300]]


def test_parquet_passes_pyarrow_batches_through(store_root) -> None:
    from syvain_training_data.formats.parquet import write_parquet_shard

    root, config = store_root
    records = [{"i": i, "tokens": list(range(i % 5)), "s": str(i)} for i in range(3000)]
    data = io.BytesIO()
    write_parquet_shard(records, data)
    shard = publish(f"{root}/part.parquet", data.getvalue(), config, len(records))
    got = list(
        iter_shard_batches(
            "parquet",
            shard,
            storage_config=config,
            columns=["s", "none", "i"],
            batch_size=500,
            start=250,
            stop=2750,
        )
    )
    assert all(isinstance(b, pa.RecordBatch) and b.num_rows <= 500 for b in got)
    merged = pa.Table.from_batches(got)
    assert merged.column_names == ["s", "none", "i"]
    assert merged.column("i").to_pylist() == list(range(250, 2750))
    with pytest.raises(RuntimeError, match="declared 3001 records but yielded 3000"):
        list(
            iter_shard_batches(
                "parquet", shard.model_copy(update={"records": 3001}), storage_config=config
            )
        )


def test_unknown_format_and_bad_arguments(tmp_path) -> None:
    shard = ManifestShard(uri=f"file://{tmp_path}/x", records=1, size_bytes=1)
    with pytest.raises(ValueError, match="Unknown data format"):
        next(iter_shard_batches("csv", shard))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="batch_size"):
        next(iter_shard_batches(MSGPACK, shard, batch_size=0))
    with pytest.raises(TypeError, match="not a str"):
        next(iter_shard_batches(MSGPACK, shard, columns="tokens"))


@pytest.mark.timeout(600)
def test_one_gib_shard_streams_in_bounded_memory(s3_env, s3_bucket, unique_prefix) -> None:
    """A shard of 1 GiB decompressed (token lists and large strings) from SeaweedFS, through
    `iter_shard_batches`: peak RSS grows by less than 128 MiB."""
    count = 256
    tokens = list(range(50_000))
    records = (
        {"i": i, "text": chr(97 + i % 26) * (4 * MIB - 400_000), "tokens": tokens}
        for i in range(count)
    )
    uri = f"s3://{s3_bucket}/{unique_prefix}/big.msgpack.zstf"
    shard = publish(uri, encode_shard(MSGPACK, records, batch=1), config_for(s3_env), count)
    report = run_child(
        f"""
        from syvain_training_data import ManifestShard, iter_shard_batches
        config = s3_config({s3_env.endpoint!r}, {s3_env.region!r})
        shard = ManifestShard.model_validate_json({shard.model_dump_json()!r})
        before = peak_rss_kib()
        rows = tokens = 0
        for batch in iter_shard_batches("msgpack.zstf", shard, storage_config=config):
            rows += batch.num_rows
            tokens += len(batch.int_list_buffers("tokens")[1])
        after = peak_rss_kib()
        print(json.dumps({{"rows": rows, "tokens": tokens, "growth_kib": after - before}}))
        """,
        timeout=540,
    )
    print(report)
    assert report["rows"] == count and report["tokens"] == count * len(tokens)
    assert report["growth_kib"] < 128 * 1024, report
