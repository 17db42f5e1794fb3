"""`_native.rows_from_arrow` against `RecordBatch.to_pylist` on the same batches.

Prints one JSON line per case and build: rows/s of `rows_from_arrow` and of `to_pylist` (best of
--repeat runs each). Give several builds of the extension to compare them in one
run on the same data (each path is loaded as its own module):

    .venv/bin/python benchmarks/rows_from_arrow.py before/_native.abi3.so after/_native.abi3.so

Without paths, the installed `syvain_training_data._native` is measured.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pyarrow as pa


def batches(rows: int, seed: int = 3) -> dict[str, pa.RecordBatch]:
    """Text records, token rows and a nested struct column, 1024 rows a batch as the reader."""
    rng = random.Random(seed)
    words = ["".join(rng.choices("abcdefghij klmnop", k=rng.randint(3, 12))) for _ in range(500)]
    text = pa.Table.from_pylist(
        [
            {
                "id": i,
                "text": " ".join(rng.choices(words, k=rng.randint(20, 120))),
                "score": rng.random(),
                "lang": rng.choice(["en", "fr", None]),
            }
            for i in range(rows)
        ]
    )
    token_rows = [rng.choices(range(50_000), k=rng.randint(64, 512)) for _ in range(rows)]
    tokens = pa.table({"tokens": pa.array(token_rows)})
    nested = pa.Table.from_pylist(
        [
            {"meta": {"source": rng.choice(words), "tags": rng.choices(words, k=3), "n": i}}
            for i in range(rows)
        ]
    )
    return {
        name: table.combine_chunks().to_batches(max_chunksize=1024)
        for name, table in (("text", text), ("tokens", tokens), ("nested", nested))
    }


def load(path: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location("_native", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def best(run: Callable[[], Any], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("native", nargs="*", help="paths of _native builds to compare")
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    if args.native:
        builds = {path: load(path) for path in args.native}
    else:
        from syvain_training_data import _native

        builds = {"installed": _native}
    for case, parts in batches(args.rows).items():

        def pylist(parts: list[pa.RecordBatch] = parts) -> None:
            for batch in parts:
                batch.to_pylist()

        floor = best(pylist, args.repeat)
        for name, native in builds.items():

            def rows(parts: list[pa.RecordBatch] = parts, native: ModuleType = native) -> None:
                for batch in parts:
                    native.rows_from_arrow(
                        *batch.__arrow_c_array__(), lambda i, b=batch: b.column(i).to_pylist()
                    )

            seconds = best(rows, args.repeat)
            print(
                json.dumps(
                    {
                        "case": case,
                        "build": name,
                        "rows_from_arrow_rows_per_s": round(args.rows / seconds),
                        "to_pylist_rows_per_s": round(args.rows / floor),
                        "speedup": round(floor / seconds, 2),
                    }
                )
            )


if __name__ == "__main__":
    main()
