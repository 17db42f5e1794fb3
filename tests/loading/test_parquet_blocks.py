"""Parquet in the seeded order (SPEC section 6, v4): shards with an offset index (our saver
writes one) are cut into blocks like indexed msgpack.zstf shards, every record read once in
the one order of every topology, each block read fetching about its own pages; a file without
an offset index keeps whole shards as blocks unless ``indexes=True``."""

from __future__ import annotations

import io
import random
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from syvain_training_data import SyvainTrainingData  # noqa: E402
from syvain_training_data.publish.adopt import adopt  # noqa: E402
from syvain_training_data.storage import put_object  # noqa: E402

SHARDS, RECORDS, TEXT_BYTES = 3, 4500, 2000


def as_list(batch: list[Any]) -> list[Any]:
    return batch


def records_of(shard: int) -> list[dict[str, Any]]:
    """Incompressible texts, so a shard is about RECORDS x TEXT_BYTES (9 MB: three blocks)."""
    rng = random.Random(shard)
    return [
        {"shard": shard, "i": i, "text": rng.randbytes(TEXT_BYTES // 2).hex()}
        for i in range(RECORDS)
    ]


EVERY = sorted((s, i) for s in range(SHARDS) for i in range(RECORDS))


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> tuple[SyvainTrainingData, str]:
    client = SyvainTrainingData()
    manifest_uri = f"file://{tmp_path_factory.mktemp('parquet-blocks')}/data-manifest.json"
    saver = client.dataset_saver(manifest_uri, data_format="parquet")
    for shard in range(SHARDS):
        saver.save("train", None, records_of(shard), shard_id=f"{shard:02d}")
    saver.commit_manifest()
    return client, manifest_uri


def keys(batches: list[list[dict[str, Any]]]) -> list[tuple[int, int]]:
    return [(record["shard"], record["i"]) for batch in batches for record in batch]


def shard_bytes(client: SyvainTrainingData, manifest_uri: str) -> int:
    manifest = client.load_manifest(manifest_uri)
    return sum(shard.size_bytes for shard in manifest.splits["train"].shards)


def test_saved_parquet_shards_are_cut_into_blocks(saved):
    client, manifest_uri = saved
    loader = client.split_data_loader(manifest_uri, as_list, {"batch_size": 64}).load(
        "train", seed=3
    )
    plan = loader.dataset.read_plan
    assert plan.indexed
    assert all(len(blocks) > 1 for blocks in plan.block_counts), plan.block_counts
    batches = list(loader)
    assert sorted(keys(batches)) == EVERY
    # Each block read fetches its pages, the footer's tail and a page on each side at most.
    assert loader.stats().bytes <= 1.1 * shard_bytes(client, manifest_uri)


def test_ranks_and_workers_split_the_one_seeded_order(saved):
    client, manifest_uri = saved
    alone = keys(
        list(
            client.split_data_loader(manifest_uri, as_list, {"batch_size": 50}).load(
                "train", seed=7
            )
        )
    )
    parts, fetched = [], 0
    args = {"batch_size": 50, "num_workers": 2, "multiprocessing_context": "fork"}
    for rank in range(2):
        split = client.split_data_loader(manifest_uri, as_list, args).load(
            "train", seed=7, rank=rank, world_size=2
        )
        by_worker: dict[int, list[tuple[int, int]]] = {}
        for index, batch in enumerate(split):
            by_worker.setdefault(index % 2, []).extend(keys([batch]))
        parts += by_worker[0] + by_worker.get(1, [])
        fetched += split.stats().bytes
    assert parts == alone
    assert sorted(alone) == EVERY
    # Four consumers, each reading a quarter of every block of its window: a page at each
    # end of each of its ranges more than one consumer would fetch.
    assert fetched <= 1.3 * shard_bytes(client, manifest_uri), fetched


def test_a_state_resumes_on_another_topology(saved):
    client, manifest_uri = saved
    first = client.split_data_loader(manifest_uri, as_list, {"batch_size": 16}).load(
        "train", seed=2
    )
    seen = []
    for index, batch in enumerate(first):
        seen += keys([batch])
        if index == 300:
            break
    state = first.state_dict()
    rest = []
    for rank in range(3):
        resumed = client.split_data_loader(manifest_uri, as_list, {"batch_size": 9}).load(
            "train", seed=2, world_size=3, rank=rank
        )
        resumed.load_state_dict(state)
        rest += keys(list(resumed))
    assert sorted(seen + rest) == EVERY


def foreign_dataset(tmp_path) -> str:
    """The same records as files pyarrow writes by default (no offset index), adopted."""
    root = f"file://{tmp_path}"
    for shard in range(SHARDS):
        sink = io.BytesIO()
        pq.write_table(pa.Table.from_pylist(records_of(shard)), sink, row_group_size=1000)
        put_object(f"{root}/part-{shard}.parquet", sink.getvalue())
    manifest_uri = f"{root}/data-manifest.json"
    adopt([f"{root}/"], data_format="parquet", split="train", out=manifest_uri)
    return manifest_uri


def test_a_file_without_an_offset_index_keeps_whole_shards_unless_told(tmp_path):
    client = SyvainTrainingData()
    manifest_uri = foreign_dataset(tmp_path)
    loader = client.split_data_loader(manifest_uri, as_list, {"batch_size": 64})
    whole = loader.load("train", seed=1)
    assert not whole.dataset.read_plan.indexed
    assert sorted(keys(list(whole))) == EVERY
    # Told, blocks enter by row group: exact, each block fetching its row groups' chunks.
    blocks = loader.load("train", seed=1, indexes=True)
    assert blocks.dataset.read_plan.indexed
    assert sorted(keys(list(blocks))) == EVERY
