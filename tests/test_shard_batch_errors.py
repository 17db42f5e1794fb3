"""`iter_shard_batches` errors: values the columns cannot hold name the column, and every decoder
error of the record path (crafted, corrupted, nested too deep for Arrow readers) is the record
path's, after the same records."""

from __future__ import annotations

import json
import logging
import random
from typing import Any

import pytest

from native_codec import (
    JSONL,
    MSGPACK,
    URI,
    batches,
    both_paths,
    corrupt,
    decoder_error_cases,
    encode,
    outcome,
    random_records,
    read,
    table,
    unreadable,
)
from reference_codecs import gz
from shards import NATIVE_FORMATS
from syvain_training_data._native import shard_batches_from_bytes, shard_reader_from_bytes

# Values the columns cannot hold.


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


# Every decoder error of the record path, through the columnar path.


@pytest.mark.parametrize("case", range(len(decoder_error_cases())))
def test_every_decoder_error_is_the_record_paths(case: int) -> None:
    data_format, data, declared = decoder_error_cases()[case]
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
