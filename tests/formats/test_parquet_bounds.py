"""Decoded-size bounds of the Parquet reader (``formats/parquet/bounds.py``): a dictionary bomb
reads in bounded memory and in order, and a row over the record limit is an error naming the
shard."""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from memory import run_child
from parquet_helpers import local_shard
from syvain_training_data.formats.parquet import bounds
from syvain_training_data.shard import iter_shard


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
    at most 64 MiB of values, the reader's peak RSS under 1 GiB."""
    data = dictionary_bomb(1024)
    assert len(data) < 4096
    shard = local_shard(tmp_path, data, 1024)
    measured = run_child(
        f"""
        from syvain_training_data import ManifestShard
        from syvain_training_data.formats.parquet import iter_parquet_batches
        shard = ManifestShard.model_validate_json({shard.model_dump_json()!r})
        rows = 0
        for batch in iter_parquet_batches(shard, batch_size=8192):
            assert batch.schema.field("a").type == "string", batch.schema
            assert batch.column("d")[0].as_py() == "a" * (1 << 20)
            rows += batch.num_rows
        print(json.dumps({{"rows": rows, "peak_mib": peak_rss_kib() // 1024}}))
        """,
        timeout=300,
    )
    rows, peak_mib = measured["rows"], measured["peak_mib"]
    assert rows == 1024
    assert peak_mib < 1024, f"peak RSS {peak_mib} MiB"


def test_rows_of_a_dictionary_bomb_come_out_whole_and_in_order(tmp_path, monkeypatch):
    monkeypatch.setattr(bounds, "PIECE_BYTES", 3 * 1024)  # pieces of 3 rows x 1 KiB
    data = dictionary_bomb(10, value_bytes=1024, columns="a")
    rows = list(iter_shard("parquet", local_shard(tmp_path, data, 10)))
    assert rows == [{"a": "a" * 1024}] * 10


def test_a_row_over_the_record_limit_is_an_error_naming_the_shard(tmp_path, monkeypatch):
    monkeypatch.setattr(bounds, "MAX_ROW_BYTES", 3 * 1024)
    data = dictionary_bomb(4, value_bytes=1024)  # 4 KiB per row
    shard = local_shard(tmp_path, data, 4)
    with pytest.raises(RuntimeError, match=r"Unreadable parquet shard file://.*over the limit"):
        list(iter_shard("parquet", shard))
