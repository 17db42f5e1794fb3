"""Parquet read in place from SeaweedFS: bytes and requests per read, and the rate of a whole
read beside its floor, a plain download of the same object plus ``pyarrow.parquet.read_table``.

The file is FineWeb-like: 64,000 rows of a ~2 KB text column and metadata columns (id, url,
language score, token count), zstd, 16 row groups of 4,000 rows (about 60 MB), as pyarrow
writes it by default (no page index). Figures:
- ``whole``: every row as Arrow batches (``iter_parquet_batches``), seconds and MB/s, beside the
  floor (GET of the whole object + ``read_table``) measured in turns on the same bytes;
- ``last_rows``: rows [63,990, 64,000): bytes fetched (the footer and one row group);
- ``id_column``: only the ``id`` column of every row: bytes fetched (its column chunks);
- ``slice`` and ``slice_paged``: rows [1,000, 1,100) of the first row group, from that file
  and from the same rows written with a page index and 256 KiB pages (as our saver writes):
  without the index the reader fetches the row group's column chunks, with it only the pages
  the rows fall in;
- requests: the ranged GETs each read made.

Run: .venv/bin/python benchmarks/parquet_ranges.py  (build with `maturin develop --release`)
"""

from __future__ import annotations

import io
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from seaweed import start_seaweed, storage_options  # noqa: E402
from syvain_training_data import ManifestShard, SyvainTrainingData  # noqa: E402
from syvain_training_data.formats.parquet import iter_parquet_batches, reader  # noqa: E402
from syvain_training_data.storage import get_object, put_object  # noqa: E402

ROWS, GROUP_ROWS, ROUNDS = 64_000, 4_000, 5


def fineweb_like(paged: bool = False) -> bytes:
    rng = random.Random(0)
    words = [f"w{i}" for i in range(20_000)]
    table = pa.table(
        {
            "id": [f"<urn:uuid:{i:032x}>" for i in range(ROWS)],
            "text": [" ".join(rng.choices(words, k=330)) for _ in range(ROWS)],
            "url": [f"https://example.org/{rng.randrange(10**9)}" for _ in range(ROWS)],
            "language_score": [rng.random() for _ in range(ROWS)],
            "token_count": [rng.randrange(100, 3000) for _ in range(ROWS)],
        }
    )
    sink = io.BytesIO()
    pages = {
        "write_page_index": True,
        "data_page_size": 256 * 1024,
        "write_batch_size": 128,
        "use_dictionary": False,
    }
    pq.write_table(
        table, sink, row_group_size=GROUP_ROWS, compression="zstd", **(pages if paged else {})
    )
    return sink.getvalue()


def tracked_read(shard: ManifestShard, config: Any, **read: Any) -> tuple[int, int, float]:
    """(bytes fetched, requests, seconds) of one ``iter_parquet_batches`` read."""
    opened: list[Any] = []
    real = reader.open_native

    def tracked(*args: Any) -> Any:
        native = real(*args)
        opened.append(native)
        return native

    reader.open_native = tracked  # type: ignore[assignment]
    try:
        started = time.perf_counter()
        rows = sum(b.num_rows for b in iter_parquet_batches(shard, storage_config=config, **read))
        seconds = time.perf_counter() - started
    finally:
        reader.open_native = real  # type: ignore[assignment]
    assert rows == read.get("stop", ROWS) - read.get("start", 0)
    return sum(f.fetched[1] for f in opened), sum(f.fetched[0] for f in opened), seconds


def main() -> None:
    data = fineweb_like()
    with start_seaweed(buckets=("bench",)) as seaweed:
        client = SyvainTrainingData(**storage_options(seaweed))
        config = client.storage_config
        uri = "s3://bench/fineweb-like.parquet"
        put_object(uri, data, storage_config=config)
        shard = ManifestShard(uri=uri, records=ROWS, size_bytes=len(data))
        ours, floor = [], []
        for _ in range(ROUNDS):
            fetched, requests, seconds = tracked_read(shard, config)
            ours.append(seconds)
            started = time.perf_counter()
            pq.read_table(io.BytesIO(get_object(uri, storage_config=config)))
            floor.append(time.perf_counter() - started)
        megabytes = len(data) / 1e6
        print(
            json.dumps(
                {
                    "case": "whole",
                    "file_mb": round(megabytes, 1),
                    "ours_mb_s": round(megabytes / statistics.median(ours), 1),
                    "floor_mb_s": round(megabytes / statistics.median(floor), 1),
                    "ratio": round(statistics.median(floor) / statistics.median(ours), 3),
                    "bytes_over_file": round(fetched / len(data), 4),
                    "requests": requests,
                }
            )
        )
        metadata = pq.ParquetFile(io.BytesIO(data)).metadata
        for case, read, expected in (
            ("last_rows", {"start": ROWS - 10, "stop": ROWS}, [metadata.num_row_groups - 1]),
            ("id_column", {"columns": ["id"]}, list(range(metadata.num_row_groups))),
        ):
            fetched, requests, _ = tracked_read(shard, config, **read)
            columns = [0] if case == "id_column" else range(metadata.num_columns)
            chunks = sum(
                metadata.row_group(g).column(c).total_compressed_size
                for g in expected
                for c in columns
            )
            print(
                json.dumps(
                    {
                        "case": case,
                        "bytes_fetched": fetched,
                        "chunks_plus_footer": chunks + metadata.serialized_size + 8,
                        "over_chunks_plus_footer": round(
                            fetched / (chunks + metadata.serialized_size + 8), 3
                        ),
                        "file_bytes": len(data),
                        "requests": requests,
                    }
                )
            )
        paged_uri = "s3://bench/fineweb-like-paged.parquet"
        paged = fineweb_like(paged=True)
        put_object(paged_uri, paged, storage_config=config)
        first_group = sum(
            metadata.row_group(0).column(c).total_compressed_size
            for c in range(metadata.num_columns)
        )
        for case, sliced_uri, size in (
            ("slice", uri, len(data)),
            ("slice_paged", paged_uri, len(paged)),
        ):
            sliced = ManifestShard(uri=sliced_uri, records=ROWS, size_bytes=size)
            fetched, requests, _ = tracked_read(sliced, config, start=1000, stop=1100)
            print(
                json.dumps(
                    {
                        "case": case,
                        "rows": 100,
                        "bytes_fetched": fetched,
                        "row_group_bytes": first_group,
                        "rows_share_of_file_bytes": round(100 / ROWS * size),
                        "file_bytes": size,
                        "requests": requests,
                    }
                )
            )


if __name__ == "__main__":
    main()
