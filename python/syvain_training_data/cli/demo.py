"""``syvain-data demo``: the README's main job, end to end. It publishes a curriculum dataset
from a process pool with ``DatasetSaver``, then reads it the way training does with
``SplitDataLoader`` and checks that every record came back exactly once.

``--root`` is where the dataset goes: a local directory (the embedded store: no server, no
credentials; default a fresh temporary directory) or an ``s3://bucket/prefix`` URI on the store
the connection options name. Running it again on the same root shows the saver reusing the
shards it already finished (deterministic shard ids).
"""

from __future__ import annotations

import argparse
import multiprocessing
import random
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any, Final, TextIO

from syvain_training_data.cli.arguments import positive
from syvain_training_data.cli.context import Context, is_local_path, to_uri
from syvain_training_data.cli.output import CountProgress, emit
from syvain_training_data.client import SyvainTrainingData
from syvain_training_data.publish import DatasetSaver
from syvain_training_data.uris import file_path, scheme_of

WORDS: Final = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "was",
    "for",
    "on",
    "as",
    "with",
    "by",
    "at",
    "from",
    "that",
    "this",
    "which",
    "be",
    "are",
    "or",
    "an",
    "data",
    "model",
    "train",
    "shard",
    "record",
    "token",
    "stream",
    "store",
    "byte",
    "resume",
    "loader",
    "split",
    "stage",
]
# (split, curriculum stage, shards): the layout the demo publishes.
LAYOUT: Final = (("train", "warmup", 2), ("train", "main", 6), ("valid", None, 2))
BATCH_SIZE: Final = 64
# Under the root, as a saver run keeps a dataset: the manifest, and its shards beside it.
DATASET_PATH: Final = "datasets/demo"


HELP: Final = "publish a dataset from a process pool and read it back with SplitDataLoader"
DESCRIPTION: Final = (
    "The README's main job: publish a curriculum dataset with DatasetSaver from two processes "
    "(deterministic shard ids, so a second run reuses finished shards), then read one epoch "
    "with SplitDataLoader (two workers, shuffled) and check every record."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--root",
        default=None,
        metavar="DIR",
        help="local directory (default: a fresh temporary one) or s3://bucket/prefix to "
        "publish under",
    )
    parser.add_argument("--records", type=positive, default=20_000)


def run(ctx: Context) -> None:
    root = ctx.args.root or tempfile.mkdtemp(prefix="syvain-demo-")
    root_uri = to_uri(root) if is_local_path(root) else root.rstrip("/")
    run_demo(ctx.client, root_uri, ctx.args.records, ctx.stdout)


def generate_records(shard_id: str, count: int) -> Iterator[dict[str, Any]]:
    """Text-shaped records: an id, ~220 words, 256 token ids and a small meta map."""
    rng = random.Random(shard_id)
    for index in range(count):
        yield {
            "id": f"{shard_id}/{index:07d}",
            "text": " ".join(rng.choices(WORDS, k=220)),
            "tokens": [rng.getrandbits(16) for _ in range(256)],
            "meta": {"shard": shard_id, "index": index, "score": rng.random()},
        }


def save_shard(
    saver: DatasetSaver, split: str, stage: str | None, shard_id: str, count: int
) -> tuple[str, int, bool]:
    """One task of the pool: (shard URI, bytes, reused) for a deterministic shard."""
    reused = saver.recover(split, stage, shard_id=shard_id) is not None
    shard = saver.save(split, stage, generate_records(shard_id, count), shard_id=shard_id)
    return shard.uri, shard.size_bytes, reused


def collate(records: list[Any]) -> list[str]:
    return [record["id"] for record in records]


def _start_method() -> str:
    # fork starts the pool's and the DataLoader's workers fastest; elsewhere only spawn is safe.
    return "fork" if sys.platform == "linux" else "spawn"


def publish(
    client: SyvainTrainingData, manifest_uri: str, per_shard: int, out: TextIO
) -> tuple[int, int]:
    """Saves every shard of LAYOUT from two processes, commits; (bytes, shards reused)."""
    saver = client.dataset_saver(manifest_uri, data_format="msgpack.zstf")
    tasks = [
        (split, stage, f"{split}-{stage or 'all'}-{k:03d}")
        for split, stage, shards in LAYOUT
        for k in range(shards)
    ]
    context = multiprocessing.get_context(_start_method())
    total_bytes, reused = 0, 0
    progress = CountProgress(out, "saving", len(tasks))
    with ProcessPoolExecutor(max_workers=2, mp_context=context) as pool:
        futures = [
            pool.submit(save_shard, saver, split, stage, shard_id, per_shard)
            for split, stage, shard_id in tasks
        ]
        for future in as_completed(futures):
            _, size, was_reused = future.result()
            total_bytes += size
            reused += was_reused
            progress.advance()
    progress.finish()
    saver.commit_manifest()  # finds the shards the workers completed in the store
    return total_bytes, reused


def load(
    client: SyvainTrainingData, manifest_uri: str, split: str, out: TextIO, **options: Any
) -> tuple[list[str], float]:
    """Every record id of one epoch, read with two DataLoader workers and a shuffle seed, and
    the seconds the epoch took (workers starting included, importing torch not)."""
    args = {"batch_size": BATCH_SIZE, "num_workers": 2, "multiprocessing_context": _start_method()}
    loader = client.split_data_loader(manifest_uri, collate, args).load(split, seed=0, **options)
    started, ids = time.perf_counter(), []
    progress = CountProgress(out, split, len(loader))
    for batch in loader:
        ids += batch
        progress.advance()
    progress.finish()
    return ids, time.perf_counter() - started


def run_demo(client: SyvainTrainingData, root_uri: str, records: int, out: TextIO) -> None:
    """Publishes about ``records`` records under ``root_uri`` (file:// or s3://), reads them
    back, checks each once, and summarises on ``out``."""
    manifest_uri = to_uri(f"{root_uri}/{DATASET_PATH}/data-manifest-v1.json")
    shards = sum(count for _, _, count in LAYOUT)
    per_shard = max(1, records // shards)
    local = scheme_of(manifest_uri) == "file"
    endpoint = client.storage_config.s3_base_url
    if local:
        emit(out, f"store: {file_path(root_uri)}")
    else:
        emit(out, f"store: {root_uri}" + (f" at {endpoint}" if endpoint else ""))
    emit(out, f"publishing {per_shard * shards:,} records in {shards} shards from 2 processes")
    started = time.perf_counter()
    total_bytes, reused = publish(client, manifest_uri, per_shard, out)
    save_s = time.perf_counter() - started
    if reused:
        emit(out, f"  reused {reused} shards finished by an earlier run (deterministic ids)")
    emit(out, f"committed {manifest_uri}")
    manifest = client.load_manifest(manifest_uri)

    emit(out, "reading it back: 2 DataLoader workers, shuffled (seed 0)")
    train, train_s = load(client, manifest_uri, "train", out, curriculum_stages=["warmup", "main"])
    valid, valid_s = load(client, manifest_uri, "valid", out)
    load_s = train_s + valid_s
    expected = sum(entry.records for entry in manifest.splits.values())
    counts = Counter(train + valid)
    if len(counts) != expected or max(counts.values()) != 1:
        raise AssertionError("the epoch did not hold every record exactly once")
    emit(out, "every record read exactly once")

    total = per_shard * shards
    saved = f"{total / save_s:,.0f} records/s ({save_s:.2f} s)"
    if reused:
        saved = f"{save_s:.2f} s, {reused} of {shards} shards reused"
    emit(out)
    emit(
        out,
        f"summary: {total:,} records, {total_bytes / 1e6:.1f} MB in {shards} msgpack.zstf shards",
    )
    emit(out, f"  saved  {saved}")
    emit(out, f"  loaded {total / load_s:,.0f} records/s ({load_s:.2f} s, 2 workers)")
    if local:
        emit(out, f"  files: {file_path(root_uri)}/{DATASET_PATH}")
        emit(out, f"  inspect: syvain-data inspect {manifest_uri}")
