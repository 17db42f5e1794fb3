"""Representation loader benchmark: examples/s and MB/s from SeaweedFS beside the download floor.

Writes a publication with the test fixture builder (tests/representation_fixture.py) to a
throwaway SeaweedFS: two sources, two tasks per source in the measured split, every teacher
layer and state kind (so a block's representation rows weigh about 442 KB, as in the real
publication). Then, interleaved, best of --repeat runs each:

  loader  ``iter_representation_examples`` for --per-source examples per source: everything
          it downloads (manifest, index shards, artifact manifest, metadata tables, tensor
          files) with every custody and schema check, the joins and the copies;
  floor   a plain download of the same objects through ``storage.open_stream`` (chunks read
          and dropped: no file, no hash, no check).

Prints one JSON line: examples/s, MB/s (the loader's bytes over its time), the floor's MB/s
and their ratio (target >= 0.7).

Run: .venv/bin/python benchmarks/representation.py  (build with `./dev setup` first)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from representation_fixture import PublicationBuilder  # noqa: E402
from seaweed import config_for, start_seaweed  # noqa: E402
from syvain_training_data import _native, storage  # noqa: E402
from syvain_training_data.representation import iter_representation_examples  # noqa: E402
from syvain_training_data.storage import StorageConfig  # noqa: E402

LAYERS = (0, 3, 7, 11, 15, 19, 23, 27, 31)
SOURCES = ["common_pile", "dolmino"]
SPLIT = "analysis"


def run_loader(published: Any, config: StorageConfig, per_source: int) -> tuple[float, int, list]:
    """(seconds, examples, [(uri, size)] of what the loader downloaded)."""
    downloaded: list[tuple[str, int]] = []
    original = _native.download_object

    def recording(storage_: Any, uri: str, *args: Any, **kwargs: Any) -> tuple[int, str]:
        size, digest = original(storage_, uri, *args, **kwargs)
        downloaded.append((uri, size))
        return size, digest

    _native.download_object = recording  # type: ignore[assignment]
    try:
        started = time.perf_counter()
        examples = list(
            iter_representation_examples(
                published.manifest_uri,
                published.manifest_sha256,
                split=SPLIT,
                sources=SOURCES,
                per_source_count=per_source,
                teacher_layer=15,
                state_kind="post_mlp",
                storage_config=config,
            )
        )
        elapsed = time.perf_counter() - started
    finally:
        _native.download_object = original  # type: ignore[assignment]
    index = [(uri, len(data)) for uri, data in published.objects.items() if "/final/index/" in uri]
    return elapsed, len(examples), downloaded + index


def run_floor(objects: list[tuple[str, int]], config: StorageConfig) -> float:
    started = time.perf_counter()
    for uri, size in objects:
        with storage.open_stream(uri, size_bytes=size, storage_config=config) as stream:
            for _ in stream:
                pass
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--per-source", type=int, default=64)
    parser.add_argument("--blocks-per-task", type=int, default=40)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    if 2 * args.blocks_per_task < args.per_source:
        parser.error("two tasks per source must hold --per-source blocks")
    with start_seaweed(("syvain-data",)) as server:
        config = config_for(server)
        builder = PublicationBuilder(
            sources=SOURCES,
            blocks_per_task={"basis_fit": 2, "analysis": args.blocks_per_task, "validation": 2},
            layers=LAYERS,
            seed=1,
        )
        published = builder.publish(config)
        best_loader = best_floor = float("inf")
        examples = 0
        objects: list[tuple[str, int]] = []
        for _ in range(args.repeat):
            elapsed, examples, objects = run_loader(published, config, args.per_source)
            best_loader = min(best_loader, elapsed)
            best_floor = min(best_floor, run_floor(objects, config))
        total = sum(size for _, size in objects)
        megabytes = total / 1e6
        print(
            json.dumps(
                {
                    "case": "representation",
                    "examples": examples,
                    "objects": len(objects),
                    "megabytes": round(megabytes, 2),
                    "examples_per_s": round(examples / best_loader, 1),
                    "mb_per_s": round(megabytes / best_loader, 1),
                    "floor_mb_per_s": round(megabytes / best_floor, 1),
                    "ratio": round(best_floor / best_loader, 3),
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
