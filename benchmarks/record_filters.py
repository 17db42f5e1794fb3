"""Filter benchmark: records/s of `load` over a local msgpack.zstf dataset, with no filter and
with a filter that keeps every record (what the filtered path itself costs), at 0 and 2
workers, batch_size 256, a collate_fn that returns the list as is.

Rounds are interleaved (every case once per round) so a busy neighbour slows every case alike;
prints the median and the best of the rounds.

Run: .venv/bin/python benchmarks/record_filters.py [--records 200000] [--rounds 7]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from typing import Any

from syvain_training_data import SyvainTrainingData

SHARDS = 8


def keep_all(record: dict[str, Any]) -> bool:
    return True


def as_list(batch: list[Any]) -> list[Any]:
    return batch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=7)
    options = parser.parse_args()
    client = SyvainTrainingData()
    per_shard = options.records // SHARDS
    total = per_shard * SHARDS
    with tempfile.TemporaryDirectory() as root:
        uri = f"file://{root}/data-manifest.json"
        saver = client.dataset_saver(uri, data_format="msgpack.zstf")
        for shard in range(SHARDS):
            records = (
                {"id": shard * per_shard + i, "score": i % 10, "text": "lorem ipsum " * 8}
                for i in range(per_shard)
            )
            saver.save("train", None, records, shard_id=f"{shard:03d}")
        saver.commit_manifest()
        cases: list[tuple[int, str, dict[str, Any]]] = [
            (workers, name, load)
            for workers in (0, 2)
            for name, load in (("no filter", {}), ("filter keeps all", {"filter": keep_all}))
        ]
        rates: dict[tuple[int, str], list[float]] = {}
        for _ in range(options.rounds):
            for workers, name, load in cases:
                args: dict[str, Any] = {"batch_size": 256, "num_workers": workers}
                if workers:
                    args["multiprocessing_context"] = "fork"
                loader = client.split_data_loader(uri, as_list, args).load("train", **load)
                started = time.perf_counter()
                count = sum(len(batch) for batch in loader)
                elapsed = time.perf_counter() - started
                assert count == total, count
                rates.setdefault((workers, name), []).append(count / elapsed)
    for (workers, name), rate in rates.items():
        print(
            f"workers={workers}  {name:17s} median {statistics.median(rate):10,.0f}  "
            f"best {max(rate):10,.0f} records/s"
        )


if __name__ == "__main__":
    main()
