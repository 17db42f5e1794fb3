"""The README's main job, end to end: publish a curriculum dataset from a process pool with
``DatasetSaver``, then read it the way training does with ``SplitDataLoader``.

On the embedded local directory store by default (no server, no credentials); with ``s3=True``
against a SeaweedFS started for the occasion, the way the test suite starts it (that needs a
source checkout, whose ``tests/seaweed.py`` does it). Running it again on the same directory
shows the saver reusing the shards it already finished.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import random
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any, TextIO

from syvain_training_data.client import SyvainTrainingData
from syvain_training_data.publish import DatasetSaver

WORDS = [
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
LAYOUT = (("train", "warmup", 2), ("train", "main", 6), ("valid", None, 2))
BATCH_SIZE = 64


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


def progress(
    label: str, done: int, total: int, started: float, *, stream: TextIO | None = None
) -> None:
    """One line redrawn in place on a terminal (only the last state elsewhere): a bar, the
    count and the elapsed time, on ``stream`` (default stdout)."""
    stream = stream or sys.stdout
    if done < total and not stream.isatty():
        return
    width = 30
    filled = width * done // max(total, 1)
    line = f"\r  {label:<8} [{'#' * filled}{'.' * (width - filled)}] {done}/{total}"
    end = "\n" if done >= total else ""
    print(f"{line}  {time.perf_counter() - started:5.1f} s", end=end, flush=True, file=stream)


def save_shard(
    saver: DatasetSaver, split: str, stage: str | None, shard_id: str, count: int
) -> tuple[str, int, bool]:
    """One task of the pool: (shard URI, bytes, reused) for a deterministic shard."""
    reused = saver.recover(split, stage, shard_id=shard_id) is not None
    shard = saver.save(split, stage, generate_records(shard_id, count), shard_id=shard_id)
    return shard.uri, shard.size_bytes, reused


def collate(records: list[Any]) -> list[str]:
    return [record["id"] for record in records]


def publish(client: SyvainTrainingData, manifest_uri: str, per_shard: int) -> tuple[int, int]:
    """Saves every shard of LAYOUT from two processes, commits; (bytes, shards reused)."""
    saver = client.dataset_saver(manifest_uri, data_format="msgpack.zstf")
    tasks = [
        (split, stage, f"{split}-{stage or 'all'}-{k:03d}")
        for split, stage, shards in LAYOUT
        for k in range(shards)
    ]
    context = multiprocessing.get_context("fork" if sys.platform == "linux" else "spawn")
    started, total_bytes, reused = time.perf_counter(), 0, 0
    with ProcessPoolExecutor(max_workers=2, mp_context=context) as pool:
        futures = [
            pool.submit(save_shard, saver, split, stage, shard_id, per_shard)
            for split, stage, shard_id in tasks
        ]
        for done, future in enumerate(as_completed(futures), start=1):
            _, size, was_reused = future.result()
            total_bytes += size
            reused += was_reused
            progress("saving", done, len(tasks), started)
    saver.commit_manifest()  # finds the shards the workers completed in the store
    return total_bytes, reused


def load(
    client: SyvainTrainingData, manifest_uri: str, split: str, **options: Any
) -> tuple[list[str], float]:
    """Every record id of one epoch, read with two DataLoader workers and a shuffle seed, and
    the seconds the epoch took (workers starting included, importing torch not)."""
    context = "fork" if sys.platform == "linux" else "spawn"
    args = {"batch_size": BATCH_SIZE, "num_workers": 2, "multiprocessing_context": context}
    loader = client.split_data_loader(manifest_uri, collate, args).load(split, seed=0, **options)
    started, ids = time.perf_counter(), []
    batches = len(loader)
    for done, batch in enumerate(loader, start=1):
        ids += batch
        if done % 8 == 0 or done == batches:
            progress(split, done, batches, started)
    return ids, time.perf_counter() - started


def run_demo(root: Path | None = None, records: int = 20_000, *, s3: bool = False) -> None:
    """Publishes about ``records`` records, reads them back, checks each once, summarises."""
    root = Path(root or tempfile.mkdtemp(prefix="syvain-demo-")).resolve()
    shards = sum(count for _, _, count in LAYOUT)
    per_shard = max(1, records // shards)
    with _store(root, s3) as (client, manifest_uri, where):
        print(f"store: {where}")
        print(f"publishing {per_shard * shards:,} records in {shards} shards from 2 processes")
        started = time.perf_counter()
        total_bytes, reused = publish(client, manifest_uri, per_shard)
        save_s = time.perf_counter() - started
        if reused:
            print(f"  reused {reused} shards finished by an earlier run (deterministic ids)")
        print(f"committed {manifest_uri}")
        manifest = client.load_manifest(manifest_uri)

        print("reading it back: 2 DataLoader workers, shuffled (seed 0)")
        train, train_s = load(client, manifest_uri, "train", curriculum_stages=["warmup", "main"])
        valid, valid_s = load(client, manifest_uri, "valid")
        load_s = train_s + valid_s
        expected = sum(entry.records for entry in manifest.splits.values())
        counts = Counter(train + valid)
        if len(counts) != expected or max(counts.values()) != 1:
            raise AssertionError("the epoch did not hold every record exactly once")
        print("every record read exactly once")

    total = per_shard * shards
    saved = f"{total / save_s:,.0f} records/s ({save_s:.2f} s)"
    if reused:
        saved = f"{save_s:.2f} s, {reused} of {shards} shards reused"
    print(
        f"\nsummary: {total:,} records, {total_bytes / 1e6:.1f} MB in {shards} msgpack.zstf "
        f"shards\n  saved  {saved}\n"
        f"  loaded {total / load_s:,.0f} records/s ({load_s:.2f} s, 2 workers)"
    )
    if not s3:
        print(f"  files: {root / 'datasets' / 'demo'}")
        print(f"  inspect: syvain-data inspect {manifest_uri}")


@contextlib.contextmanager
def _store(root: Path, s3: bool) -> Iterator[tuple[SyvainTrainingData, str, str]]:
    if not s3:
        yield SyvainTrainingData(), f"file://{root}/datasets/demo/data-manifest-v1.json", str(root)
        return
    tests = Path(__file__).resolve().parents[2] / "tests"
    if not (tests / "seaweed.py").is_file():
        raise RuntimeError(
            "demo --s3 starts SeaweedFS with tests/seaweed.py: run it from a checkout"
        )
    sys.path.insert(0, str(tests))
    from seaweed import start_seaweed  # type: ignore[import-not-found]

    with start_seaweed(buckets=("demo",)) as server:
        client = SyvainTrainingData(
            s3_base_url=server.endpoint,
            region=server.region,
            access_key_id=server.access_key_id,
            secret_access_key=server.secret_access_key,
            # The pool's workers get the saver by pickle; this server's throwaway secret may
            # travel with it (a real job sets the secret in the workers' environment).
            picklable_secret=True,
        )
        yield (
            client,
            "s3://demo/datasets/demo/data-manifest-v1.json",
            f"SeaweedFS at {server.endpoint}",
        )
