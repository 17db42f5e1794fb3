"""`iter_shard_batches`: Arrow record batches built in Rust from msgpack.zstf and jsonl.gz shards
(and pyarrow's own for Parquet): round trips against pyarrow's inference of the same records,
the schema rules, column selection, ranges, every decoder error of the record path, real stores,
and bounded memory."""

from __future__ import annotations

import json
import logging
import os
import random
import struct
import subprocess
import sys
import textwrap
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import torch

from syvain_training_data import ManifestShard, _native, iter_shard, iter_shard_batches
from syvain_training_data._native import shard_batches_from_bytes, shard_reader_from_bytes
from syvain_training_data.storage import StorageConfig
from test_codecs import (
    GIB,
    JSONL,
    MAP,
    MSGPACK,
    URI,
    common_records,
    corrupt,
    encode,
    gz,
    json_nested,
    nested_arrays_payload,
    random_records,
    read,
    unreadable,
    zstd_frame,
    zstd_raw_frame_declaring,
)
from test_iter_shard import config_for, encode_shard, publish, text_records

NATIVE_FORMATS = [MSGPACK, JSONL]
MIB = 1 << 20


def batches(data_format: str, data: bytes, declared: int, **options: Any) -> list[pa.RecordBatch]:
    reader = shard_batches_from_bytes(data_format, URI, data, declared, **options)
    return [pa.record_batch(batch) for batch in reader]


def table(data_format: str, data: bytes, declared: int, **options: Any) -> pa.Table:
    got = batches(data_format, data, declared, **options)
    return pa.Table.from_batches(got) if got else pa.table({})


def expected_table(records: list[dict[str, Any]]) -> pa.Table:
    """pyarrow's inference of the records: columns in first-seen key order, nulls for missing
    keys, int64 / double / string / binary / bool / list / struct."""
    return pa.Table.from_batches([pa.RecordBatch.from_struct_array(pa.array(records))])


def outcome(read: Any) -> tuple[int, str | None]:
    """How many records a read yields before it fails, and its error message."""
    count = 0
    try:
        for item in read():
            count += item.num_rows if hasattr(item, "num_rows") else 1  # a batch or a record
    except RuntimeError as error:
        return count, str(error)
    return count, None


def both_paths(data_format: str, data: bytes, declared: int, **range_: Any) -> None:
    """The columnar path yields the records the record path yields and fails the same way."""
    records = outcome(lambda: shard_reader_from_bytes(data_format, URI, data, declared, **range_))
    reader = shard_batches_from_bytes  # batch by batch: records before a failure count
    columns = outcome(lambda: reader(data_format, URI, data, declared, batch_size=3, **range_))
    assert columns == records


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


@pytest.mark.parametrize("data_format", NATIVE_FORMATS)
@pytest.mark.parametrize(
    ("records", "column", "kinds"),
    [
        ([{"c": 1}, {"c": "one"}], "c", "int and str"),
        ([{"c": "one"}, {"c": 1.5}], "c", "str and float"),
        ([{"c": True}, {"c": 1}], "c", "bool and int"),
        ([{"c": [1]}, {"c": {"k": 1}}], "c", "list and map"),
        ([{"m": {"t": [1, "x"]}}], "m.t[]", "int and str"),
    ],
)
def test_values_the_columns_cannot_hold_name_the_column(
    data_format: str, records: list[dict[str, Any]], column: str, kinds: str
) -> None:
    data = encode(data_format, records)
    reason = f"column {json.dumps(column)} mixes {kinds} values"
    assert outcome(lambda: batches(data_format, data, len(records))) == (
        0,
        unreadable(data_format, reason),
    )


def test_integers_beyond_int64_are_an_error_naming_the_column() -> None:
    data = encode(MSGPACK, [{"big": [2**64 - 1]}])
    reason = 'column "big[]" holds the integer 18446744073709551615, outside the int64 range'
    assert outcome(lambda: batches(MSGPACK, data, 1)) == (0, unreadable(MSGPACK, reason))
    # Not selected, it is skipped unbuilt.
    assert batches(MSGPACK, data + encode(MSGPACK, [{"x": 1}]), 2, columns=["x"])[0].num_rows == 2


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


# Every decoder error of the record path, through the columnar path.


def corruption_cases() -> list[tuple[str, bytes, int]]:
    frame = zstd_frame(MAP)
    valid_msgpack = encode(MSGPACK, [{"i": i} for i in range(5)])
    valid_jsonl = encode(JSONL, [{"i": i} for i in range(50)])
    crc = bytearray(valid_jsonl)
    crc[-6] ^= 0x01
    cases = [
        (MSGPACK, frame + struct.pack(">Q", 0) + b"x" * 64, 2),
        (MSGPACK, frame + struct.pack(">Q", 256 * MIB + 1) + b"x" * 64, 2),
        (MSGPACK, frame + b"\x00\x00\x00", 2),
        (MSGPACK, frame[:9], 1),
        (MSGPACK, frame[:-1], 1),
        (MSGPACK, struct.pack(">Q", 8) + b"not zstd", 1),
        (MSGPACK, zstd_raw_frame_declaring(GIB + 1, MAP), 1),
        (MSGPACK, zstd_frame(nested_arrays_payload(1000)), 1),
        (MSGPACK, valid_msgpack[:-3], 5),
        (MSGPACK, valid_msgpack, 3),
        (MSGPACK, valid_msgpack, 7),
        (JSONL, valid_jsonl[: len(valid_jsonl) // 2], 50),
        (JSONL, bytes(crc), 50),
        (JSONL, b"plain text, not gzip\n", 50),
        (JSONL, valid_jsonl + b"junk", 50),
        (JSONL, gz(b'{"a":1}\n{"b":"\xff"}\n'), 2),
        (JSONL, gz(json_nested(1001).encode()), 1),
        (JSONL, valid_jsonl, 49),
        (JSONL, valid_jsonl, 51),
    ]
    for payload in (
        b"",
        b"\x81\xa1k",
        b"\x81\xa1k\xd4\x01\x02",
        b"\x81\xa1k\xa1\xff",
        MAP + b"\x00",
    ):
        cases.append((MSGPACK, zstd_frame(payload), 1))
    for payload in (b"\x92\x01\x02", b"\x81\x01\x02", b"\x81\xa1a\x81\xc4\x01x\x01"):
        cases.append((MSGPACK, zstd_frame(payload), 1))
    return cases


@pytest.mark.parametrize("case", range(len(corruption_cases())))
def test_every_decoder_error_is_the_record_paths(case: int) -> None:
    data_format, data, declared = corruption_cases()[case]
    both_paths(data_format, data, declared)


def nested(depth: int, kind: str) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value] if kind == "list" else {"m": value}
    return value


@pytest.mark.parametrize("data_format", NATIVE_FORMATS)
@pytest.mark.parametrize("kind", ["list", "map"])
def test_columns_nest_as_deep_as_arrow_readers_import(data_format: str, kind: str) -> None:
    # pyarrow imports a column whose leaf sits 63 levels down, not 64: deeper records (the
    # record path takes up to 1000 levels) are an error naming the column, after the records
    # before them.
    fits = [{"i": 0, "a": nested(62, kind)}]
    got = table(data_format, encode(data_format, fits), 1)
    assert got.to_pylist() == fits
    data = encode(data_format, [{"i": 0}, {"i": 1, "a": nested(63, kind)}])
    count, message = outcome(lambda: shard_batches_from_bytes(data_format, URI, data, 2))
    assert count == 1 and message is not None
    assert message.startswith(f"Unreadable {data_format} shard {URI}: column ")
    assert message.endswith(
        "nests deeper than 63 levels, more than Arrow readers import "
        "(iter_shard reads such records)"
    )
    assert read(data_format, data, 2) == [{"i": 0}, {"i": 1, "a": nested(63, kind)}]


def test_invalid_jsonl_lines_are_logged_and_skipped(caplog: pytest.LogCaptureFixture) -> None:
    body = b'{"a":1}\n\nnot json\n[1,2]\n{"b":NaN}\n{"truncated":\n{"a":2}'
    caplog.set_level(logging.ERROR, logger="syvain_training_data")
    got = table(JSONL, gz(body), 3)
    assert got.column("a").to_pylist() == [1, None, 2]
    assert got.column_names == ["a", "b"]
    logged = [r.getMessage() for r in caplog.records]
    assert logged == [f"Skipping invalid JSON record in {URI}:{n}" for n in (3, 4, 6)]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("data_format", NATIVE_FORMATS)
def test_corruption_sweep(data_format: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.CRITICAL, logger="syvain_training_data")
    records = random_records(7, 20)
    for index, record in enumerate(records):  # columns Arrow can hold
        del record["int"]
        record["meta"]["n"] = {"deep": [index]}
    valid = encode(data_format, records)
    assert batches(data_format, valid, 20)[0].num_rows == 20
    compared = 0
    for seed in range(200):
        rng = random.Random(seed)
        damaged = corrupt(valid, rng)
        records_outcome = outcome(
            lambda damaged=damaged: shard_reader_from_bytes(data_format, URI, damaged, 20)
        )
        count, error = outcome(
            lambda damaged=damaged: shard_batches_from_bytes(
                data_format, URI, damaged, 20, batch_size=4
            )
        )
        if error is not None and "mixes" in error:
            # A flipped byte may turn a value into one its column cannot hold.
            assert error.startswith(f"Unreadable {data_format} shard {URI}: column "), seed
            continue
        assert (count, error) == records_outcome, seed
        compared += 1
    assert compared >= 150


# Real stores.


@pytest.fixture(params=["s3", "file"])
def store(request, seaweed, s3_bucket, unique_prefix, tmp_path) -> tuple[str, StorageConfig]:
    if request.param == "s3":
        return f"s3://{s3_bucket}/{unique_prefix}", config_for(seaweed)
    return f"file://{tmp_path}", StorageConfig()


@pytest.mark.parametrize("data_format", NATIVE_FORMATS)
def test_stores_round_trip(store, data_format: str) -> None:
    root, config = store
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


def test_parquet_passes_pyarrow_batches_through(store) -> None:
    from syvain_training_data.formats.parquet import write_parquet_shard

    root, config = store
    records = [{"i": i, "tokens": list(range(i % 5)), "s": str(i)} for i in range(3000)]
    path = f"{root}/part.parquet"
    local = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"syvain-{os.getpid()}.parquet")
    try:
        write_parquet_shard(records, local)
        with open(local, "rb") as file:
            shard = publish(path, file.read(), config, len(records))
    finally:
        os.unlink(local)
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
def test_one_gib_shard_streams_in_bounded_memory(seaweed, s3_bucket, unique_prefix) -> None:
    """A shard of 1 GiB decompressed (token lists and large strings) from SeaweedFS, through
    `iter_shard_batches`: peak RSS grows by less than 128 MiB."""
    count = 256
    tokens = list(range(50_000))
    encoder = _native.ShardEncoder(MSGPACK)
    pieces = [
        encoder.encode([{"i": i, "text": chr(97 + i % 26) * (4 * MIB - 400_000), "tokens": tokens}])
        for i in range(count)
    ]
    pieces.append(encoder.finish())
    data = b"".join(pieces)
    del pieces
    shard = publish(
        f"s3://{s3_bucket}/{unique_prefix}/big.msgpack.zstf", data, config_for(seaweed), count
    )
    del data
    script = textwrap.dedent(
        f"""
        import json, os

        def peak_rss_kib():
            with open("/proc/self/status") as status:
                for line in status:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1])

        from syvain_training_data import ManifestShard, iter_shard_batches
        from syvain_training_data.storage import StorageConfig
        config = StorageConfig.create(
            s3_base_url={seaweed.endpoint!r},
            region={seaweed.region!r},
            access_key_id=os.environ["AWS_ACCESS_KEY_ID"],
            secret_access_key=os.environ["AWS_SECRET_ACCESS_KEY"],
        )
        shard = ManifestShard.model_validate_json({shard.model_dump_json()!r})
        before = peak_rss_kib()
        rows = tokens = 0
        for batch in iter_shard_batches("msgpack.zstf", shard, storage_config=config):
            rows += batch.num_rows
            tokens += len(batch.int_list_buffers("tokens")[1])
        after = peak_rss_kib()
        print(json.dumps({{"rows": rows, "tokens": tokens, "growth_kib": after - before}}))
        """
    )
    env = dict(os.environ, **seaweed.env())
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=540, env=env
    )
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout)
    print(report)
    assert report["rows"] == count and report["tokens"] == count * len(tokens)
    assert report["growth_kib"] < 128 * 1024, report
