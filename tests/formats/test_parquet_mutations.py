"""Mutated Parquet shards through ``iter_shard("parquet", ...)``: a property test over small
files with bytes overwritten, inserted or cut, and declared counts and ranges that may not
fit. The reader (formats/parquet/, arrow-rs underneath) must give either the rows pyarrow
itself reads from those bytes, exactly ``stop - start`` of them, or a RuntimeError (its
ShardDataError naming the shard): never another exception, a crash or unbounded memory.
pyarrow is the reference: where both read a mutated file, ours must agree with it.

The native reader alone is fuzzed too (``rust/fuzz/fuzz_targets/parquet_read.rs``); this
test covers the whole path through Python. It runs in a child process (a crash there fails the test
instead of ending the session) with a fixed seed (``derandomize``: the same examples every
run, so it cannot flake), and the child's peak RSS is bounded.
"""

from __future__ import annotations

import io
import json
import math
import os
import resource
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from memory import run_child
from syvain_training_data import ManifestShard
from syvain_training_data.formats.parquet import write_parquet_shard
from syvain_training_data.shard import iter_shard

EXAMPLES = int(os.environ.get("PARQUET_MUTATIONS", "400"))
# Peak RSS the child may reach over all examples (the files are a few KiB; what a mutated
# header claims must not turn into allocations).
MAX_RSS_BYTES = 1 << 30


def base_shards() -> list[tuple[bytes, int]]:
    """(bytes, records) of small shards: our writer's, and pyarrow's with dictionary pages,
    several row groups and small pages, uncompressed (so that many mutations still decode)."""
    records = [
        {"id": f"r{i}", "tokens": list(range(i % 7)), "score": i / 3, "ok": i % 2 == 0}
        for i in range(24)
    ]
    ours = io.BytesIO()
    write_parquet_shard(records, ours)
    words = pa.array(["alpha", "beta", "gamma", "alpha"] * 8).dictionary_encode()
    table = pa.table(
        {
            "text": words,
            "tokens": pa.array([list(range(i % 5)) for i in range(32)], pa.list_(pa.int64())),
            "n": pa.array(range(32), pa.int32()),
        }
    )
    theirs = io.BytesIO()
    pq.write_table(
        table,
        theirs,
        row_group_size=10,
        data_page_size=64,
        compression="NONE",
        use_dictionary=True,
    )
    return [(ours.getvalue(), len(records)), (theirs.getvalue(), 32)]


BASES = base_shards()


def histogram_abort() -> tuple[bytes, int, int, int | None]:
    """The mutation this test found first: pyarrow 26 aborted the process (an uncaught
    ParquetException, "Definition level histogram size mismatch") when the reader asked
    for a column chunk's metadata (when pyarrow decoded the shards). Six bytes cut, two set."""
    data = bytearray(BASES[1][0])
    del data[171:177]
    data[869], data[1541] = 194, 63
    return bytes(data), 32, 0, None


@st.composite
def mutated(draw: st.DrawFn) -> tuple[bytes, int, int, int | None]:
    """(bytes, declared records, start, stop) of a mutated base shard."""
    data, records = draw(st.sampled_from(BASES))
    buffer = bytearray(data)
    for _ in range(draw(st.integers(0, 4))):
        kind = draw(st.sampled_from(["set", "insert", "cut", "int32"]))
        at = draw(st.integers(0, max(len(buffer) - 1, 0)))
        if kind == "set" and buffer:
            buffer[at] = draw(st.integers(0, 255))
        elif kind == "insert":
            buffer[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif kind == "cut":
            del buffer[at : at + draw(st.integers(1, 16))]
        elif len(buffer) >= at + 4:  # a length or count field made huge, negative or zero
            value = draw(st.sampled_from([0, 1, 2**31 - 1, 2**32 - 1, 2**24, 255]))
            buffer[at : at + 4] = value.to_bytes(4, "little")
    declared = draw(st.sampled_from([records, records - 1, records + 1, 1, 10**6]))
    start = draw(st.integers(0, declared)) if declared < 100 else 0
    stop = draw(st.one_of(st.none(), st.integers(start, max(start, min(declared, 100)))))
    return bytes(buffer), declared, start, stop


def pyarrow_rows(data: bytes) -> list[dict[str, Any]] | None:
    """What pyarrow reads from ``data`` (None if it cannot)."""
    try:
        rows: list[dict[str, Any]] = pq.read_table(pa.BufferReader(data)).to_pylist()
        return rows
    except Exception:  # noqa: BLE001 - anything pyarrow refuses
        return None


def same(a: Any, b: Any) -> bool:
    return a == b or _normal(a) == _normal(b)


def _normal(value: Any) -> str:
    def default(item: Any) -> str:
        return repr(item)

    def fix(item: Any) -> Any:
        if isinstance(item, float) and math.isnan(item):
            return "nan"
        if isinstance(item, dict):
            return {k: fix(v) for k, v in item.items()}
        if isinstance(item, list):
            return [fix(v) for v in item]
        return item

    return json.dumps(fix(value), default=default, sort_keys=True)


def read_cleanly(directory: Path) -> None:
    """The property, over EXAMPLES mutated shards written under ``directory``."""
    counter = iter(range(10**9))

    @settings(
        max_examples=EXAMPLES,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(mutated())
    @example(histogram_abort())
    def check(example: tuple[bytes, int, int, int | None]) -> None:
        data, declared, start, stop = example
        path = directory / f"m{next(counter)}.parquet"
        path.write_bytes(data)
        shard = ManifestShard(uri=f"file://{path}", records=declared, size_bytes=len(data))
        try:
            rows = [dict(r) for r in iter_shard("parquet", shard, start=start, stop=stop)]
        except RuntimeError:
            return  # ShardDataError (or another RuntimeError): refused cleanly
        finally:
            path.unlink()
        end = declared if stop is None else stop
        assert len(rows) == end - start
        reference = pyarrow_rows(data)
        if reference is not None and len(reference) == declared:
            assert same(rows, reference[start:end])

    check()


def test_mutated_parquet_shards_give_their_rows_or_a_shard_error(tmp_path):
    here = Path(__file__).resolve().parent
    peak = run_child(
        f"""
        import sys
        from pathlib import Path
        sys.path[:0] = [{str(here)!r}, {str(here.parent)!r}]
        import test_parquet_mutations as t
        t.read_cleanly(Path({str(tmp_path)!r}))
        print(json.dumps(peak_rss_kib() * 1024))
        """,
        env=dict(os.environ, PYTHONFAULTHANDLER="1"),
        timeout=1200,  # a hang guard only
    )
    print(f"{EXAMPLES} mutated shards, child peak RSS {peak / 2**20:.0f} MiB")
    assert peak < MAX_RSS_BYTES


@pytest.mark.parametrize("base", range(len(BASES)))
def test_the_unmutated_bases_read_whole(tmp_path, base):
    data, records = BASES[base]
    path = tmp_path / "base.parquet"
    path.write_bytes(data)
    shard = ManifestShard(uri=f"file://{path}", records=records, size_bytes=len(data))
    rows = [dict(r) for r in iter_shard("parquet", shard)]
    reference = pyarrow_rows(data)
    assert reference is not None and same(rows, reference)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss > 0
