"""The seeded order of SPEC section 6 (v4) end to end: every batch mixes the whole selection,
each record once, each byte fetched about once, on the local store and SeaweedFS, with and
without shard indexes."""

from __future__ import annotations

import dataclasses
import json
import os
import random
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from loader_data import s3_client  # noqa: E402
from syvain_training_data import SyvainTrainingData, iter_shard  # noqa: E402
from syvain_training_data.formats.shard_index import (  # noqa: E402
    INDEX_SUFFIX,
    ShardIndex,
    version_tag,
)
from syvain_training_data.storage import get_object, head_object  # noqa: E402
from uniform import expected_distinct  # noqa: E402

SOURCES, PER_SOURCE, BATCH = 64, 500, 32


def as_list(batch: list[Any]) -> list[Any]:
    return batch


UNIFORM = expected_distinct(SOURCES, PER_SOURCE, BATCH)  # 25.3


def write_sources(client: SyvainTrainingData, root: str, data_format: str, payload: int = 0) -> str:
    """64 sources x 500 records, one shard per source (as training data is usually written);
    each record holds ``payload`` incompressible bytes besides its keys."""
    manifest_uri = f"{root}/data-manifest.json"
    saver = client.dataset_saver(manifest_uri, data_format=data_format)  # type: ignore[arg-type]
    for source in range(SOURCES):
        records = (
            {"source": source, "i": i, "pad": "x" * (i % 50)}
            | (
                {"payload": random.Random(source * PER_SOURCE + i).randbytes(payload)}
                if payload
                else {}
            )
            for i in range(PER_SOURCE)
        )
        saver.save("train", None, records, shard_id=f"{source:03d}")
    saver.commit_manifest()
    return manifest_uri


@pytest.fixture(scope="module")
def local_sources(tmp_path_factory) -> dict[str, tuple[SyvainTrainingData, str]]:
    client = SyvainTrainingData()
    return {
        data_format: (
            client,
            write_sources(client, f"file://{tmp_path_factory.mktemp('mix')}", data_format),
        )
        for data_format in ("msgpack.zstf", "jsonl.gz")
    }


@pytest.fixture(scope="module")
def s3_sources(seaweed, s3_bucket) -> tuple[SyvainTrainingData, str]:
    # Shards of about 370 KB: a shard's index and the strides around 3 part boundaries cost
    # ~2 % of it, where they cost 12 % of a 21 KB shard.
    client = s3_client(seaweed)
    root = f"s3://{s3_bucket}/mix-{uuid.uuid4().hex}"
    return client, write_sources(client, root, "msgpack.zstf", payload=700)


def mix_figures(batches: list[list[dict[str, Any]]]) -> tuple[float, float]:
    """(distinct sources per batch, largest source's share of a batch), averaged."""
    distinct, largest = [], []
    for batch in batches:
        counts = Counter(record["source"] for record in batch)
        distinct.append(len(counts))
        largest.append(max(counts.values()) / len(batch))
    return sum(distinct) / len(distinct), sum(largest) / len(largest)


def shard_bytes(client: SyvainTrainingData, manifest_uri: str) -> int:
    manifest = client.load_manifest(manifest_uri)
    return sum(shard.size_bytes for shard in manifest.splits["train"].shards)


def keys(batches: list[list[dict[str, Any]]]) -> list[tuple[int, int]]:
    return [(record["source"], record["i"]) for batch in batches for record in batch]


EVERY = sorted((s, i) for s in range(SOURCES) for i in range(PER_SOURCE))


@pytest.mark.parametrize("workers", [0, 2])
def test_every_batch_mixes_the_whole_selection_and_fetches_each_byte_once(local_sources, workers):
    client, manifest_uri = local_sources["msgpack.zstf"]
    args: dict[str, Any] = {"batch_size": BATCH, "num_workers": workers}
    if workers:
        args["multiprocessing_context"] = "fork"
    loader = client.split_data_loader(manifest_uri, as_list, args).load("train", seed=0)
    batches = list(loader)
    assert sorted(keys(batches)) == EVERY
    distinct, largest = mix_figures(batches)
    # Spread windows: more distinct sources than a uniform permutation's 25.3, never fewer.
    assert distinct >= UNIFORM, (distinct, UNIFORM)
    assert largest <= 0.1
    assert loader.stats().bytes <= 1.05 * shard_bytes(client, manifest_uri)


def test_the_order_is_one_for_every_topology_and_changes_with_the_epoch(local_sources):
    """Ranks x workers split one order: their parts, concatenated, are the 1 x 0 order."""
    client, manifest_uri = local_sources["msgpack.zstf"]
    loader = client.split_data_loader(manifest_uri, as_list, {"batch_size": 50})
    alone = keys(list(loader.load("train", seed=5)))
    parts = []
    for rank in range(3):
        split = client.split_data_loader(
            manifest_uri,
            as_list,
            {"batch_size": 50, "num_workers": 2, "multiprocessing_context": "fork"},
        ).load("train", seed=5, rank=rank, world_size=3)
        by_worker: dict[int, list[tuple[int, int]]] = {}
        for index, batch in enumerate(split):
            by_worker.setdefault(index % 2, []).extend(keys([batch]))
        parts += by_worker[0] + by_worker.get(1, [])
    assert parts == alone
    next_epoch = client.split_data_loader(manifest_uri, as_list, {"batch_size": 50}).load(
        "train", seed=5
    )
    next_epoch.set_epoch(1)
    assert keys(list(next_epoch)) != alone and sorted(keys(list(next_epoch))) == EVERY


def test_a_state_resumes_the_seeded_order_on_another_topology(local_sources):
    client, manifest_uri = local_sources["msgpack.zstf"]
    first = client.split_data_loader(
        manifest_uri, as_list, {"batch_size": 16, "num_workers": 2}
    ).load("train", seed=9, world_size=1, rank=0)
    seen = []
    for index, batch in enumerate(first):
        seen += keys([batch])
        if index == 200:
            break
    state = first.state_dict()
    assert len(json.dumps(state)) <= 4096
    rest = []
    for rank in range(2):
        resumed = client.split_data_loader(manifest_uri, as_list, {"batch_size": 7}).load(
            "train", seed=9, world_size=2, rank=rank
        )
        resumed.load_state_dict(state)
        rest += keys(list(resumed))
    assert sorted(seen + rest) == EVERY


def test_a_state_of_the_previous_release_resumes_in_its_order(local_sources):
    """The previous release interleaved a window's blocks uniformly: a state it saved resumes
    that order record for record (the rest of the epoch and the epochs after it)."""
    client, manifest_uri = local_sources["msgpack.zstf"]

    def load(previous: bool) -> Any:
        loader = client.split_data_loader(manifest_uri, as_list, {"batch_size": 16}).load(
            "train", seed=9
        )
        if previous:  # what that release's loader planned
            loader.dataset.read_plan = dataclasses.replace(loader.dataset.read_plan, spread=False)
        return loader

    whole = keys(list(load(previous=True)))
    assert sorted(whole) == EVERY and whole != keys(list(load(previous=False)))
    interrupted, seen = load(previous=True), []
    for index, batch in enumerate(interrupted):
        seen += keys([batch])
        if index == 700:
            break
    resumed = load(previous=False)
    resumed.load_state_dict(interrupted.state_dict())
    assert seen + keys(list(resumed)) == whole
    resumed.set_epoch(1)
    next_epoch = load(previous=True)
    next_epoch.set_epoch(1)
    assert keys(list(resumed)) == keys(list(next_epoch))


def test_jsonl_shards_without_an_index_mix_as_whole_shard_blocks(local_sources):
    client, manifest_uri = local_sources["jsonl.gz"]
    loader = client.split_data_loader(manifest_uri, as_list, {"batch_size": BATCH}).load(
        "train", seed=0
    )
    batches = list(loader)
    assert sorted(keys(batches)) == EVERY
    distinct, largest = mix_figures(batches)
    assert distinct >= UNIFORM and largest <= 0.1
    # One consumer reads each whole shard once.
    assert loader.stats().bytes == shard_bytes(client, manifest_uri)


def test_the_saver_writes_a_record_offset_index_beside_each_msgpack_shard(local_sources):
    client, manifest_uri = local_sources["msgpack.zstf"]
    shard = client.load_manifest(manifest_uri).splits["train"].shards[3]
    data = get_object(shard.uri + INDEX_SUFFIX)
    index = ShardIndex.parse(data, shard.records, shard.size_bytes)
    body = Path(shard.uri.removeprefix("file://")).read_bytes()
    frames, position = [], 0
    while position < len(body):
        frames.append(position)
        position += 8 + int.from_bytes(body[position : position + 8], "big")
    assert list(index.offsets) == frames[:: index.layout.every]
    assert data == index.to_bytes()


def test_a_shard_without_its_index_is_still_read_exactly(tmp_path):
    """An index is optional: one deleted (or never written) costs bytes, not records."""
    client = SyvainTrainingData()
    manifest_uri = write_sources(client, f"file://{tmp_path}", "msgpack.zstf")
    shards = client.load_manifest(manifest_uri).splits["train"].shards
    for shard in shards[1::3]:
        os.unlink(shard.uri.removeprefix("file://") + INDEX_SUFFIX)
    loader = client.split_data_loader(
        manifest_uri, as_list, {"batch_size": BATCH, "num_workers": 2}
    ).load("train", seed=2)
    assert sorted(keys(list(loader))) == EVERY


def test_an_index_that_lies_is_an_error_naming_the_shard_never_wrong_records(tmp_path, caplog):
    client = SyvainTrainingData()
    manifest_uri = f"file://{tmp_path}/data-manifest.json"
    saver = client.dataset_saver(manifest_uri, data_format="msgpack.zstf")
    # Incompressible, so the shard has several blocks (about 12 MB).
    records = ({"source": 0, "i": i, "b": random.Random(i).randbytes(3000)} for i in range(4000))
    shard = saver.save("train", None, records, shard_id="big")
    saver.commit_manifest()
    path = Path(shard.uri.removeprefix("file://") + INDEX_SUFFIX)
    data = bytearray(path.read_bytes())
    entries = (len(data) - 32) // 8
    assert entries > 2
    for entry in range(2, entries):  # from record 2 x every on, not at a frame boundary
        at = 32 + 8 * entry
        data[at : at + 8] = (int.from_bytes(data[at : at + 8], "little") + 1).to_bytes(8, "little")
    path.write_bytes(bytes(data))
    loader = client.split_data_loader(manifest_uri, as_list, {"batch_size": 8}).load(
        "train", seed=1
    )
    with pytest.raises(RuntimeError, match=shard.uri):
        list(loader)
    # An index of the wrong size is ignored (logged), and the shard read from its start.
    path.write_bytes(b"{not an index")
    loader = client.split_data_loader(manifest_uri, as_list, {"batch_size": 8}).load(
        "train", seed=1
    )
    assert sorted(r["i"] for b in loader for r in b) == list(range(4000))
    from syvain_training_data.loading.shard_indexes import ShardIndexes

    # Not the index: the offsets a consumer learns walking the shard's frames.
    segment = ShardIndexes(None).segment(shard, 100, 200)
    assert segment is not None and segment.first <= 100 < 200 <= segment.first + segment.records
    learned = iter_shard("msgpack.zstf", shard, start=100, stop=200, index=segment)
    assert [r["i"] for r in learned] == list(range(100, 200))
    assert "Ignoring the shard index" in caplog.text


def test_seaweed_two_ranks_of_two_workers_mix_and_fetch_each_byte_once(s3_sources):
    client, manifest_uri = s3_sources
    args = {"batch_size": BATCH, "num_workers": 2, "multiprocessing_context": "fork"}
    batches, fetched = [], 0
    for rank in range(2):
        loader = client.split_data_loader(manifest_uri, as_list, args).load(
            "train", seed=0, rank=rank, world_size=2
        )
        batches += list(loader)
        fetched += loader.stats().bytes
    assert sorted(keys(batches)) == EVERY
    distinct, _ = mix_figures(batches)
    assert distinct >= 0.75 * UNIFORM, (distinct, UNIFORM)
    assert fetched <= 1.05 * shard_bytes(client, manifest_uri)


def test_load_tokens_and_columns_follow_the_seeded_order(tmp_path):
    client = SyvainTrainingData()
    manifest_uri = f"file://{tmp_path}/data-manifest.json"
    saver = client.dataset_saver(manifest_uri, data_format="msgpack.zstf")
    for source in range(16):
        rows = ({"tokens": [source * 1000 + i] * 3, "n": i} for i in range(200))
        saver.save("train", None, rows, shard_id=f"{source:02d}")
    saver.commit_manifest()
    loader = client.split_data_loader(manifest_uri, None, {"batch_size": 16})
    columns = list(loader.load("train", seed=4, columns=["tokens"]))
    firsts = [int(row[0]) for batch in columns for row in batch["tokens"]]
    assert sorted(firsts) == sorted(s * 1000 + i for s in range(16) for i in range(200))
    assert sum(len({t // 1000 for t in firsts[i : i + 16]}) for i in range(0, 3200, 16)) / 200 > 8
    blocks = list(loader.load_tokens("train", seq_len=3, seed=4, eos_id=None))
    tokens = [int(t) for block in blocks for t in block.flatten()]
    assert sorted(tokens) == sorted(
        s * 1000 + i for s in range(16) for i in range(200) for _ in "abc"
    )
    assert tokens[::3] == firsts


def test_a_copied_shard_gets_its_own_index(local_sources, tmp_path):
    from syvain_training_data.publish import copy_shard

    client, manifest_uri = local_sources["msgpack.zstf"]
    shard = client.load_manifest(manifest_uri).splits["train"].shards[5]
    destination = f"file://{tmp_path}/copy.msgpack.zstf"
    copied = copy_shard(shard, destination, data_format="msgpack.zstf")
    copy_version = version_tag(destination, head_object(destination).etag)
    source_version = version_tag(shard.uri, head_object(shard.uri).etag)
    copy_index = ShardIndex.parse(
        get_object(destination + INDEX_SUFFIX), shard.records, shard.size_bytes, copy_version
    )
    source_index = ShardIndex.parse(
        get_object(shard.uri + INDEX_SUFFIX), shard.records, shard.size_bytes, source_version
    )
    assert copy_index.offsets == source_index.offsets
    again = copy_shard(shard, destination, data_format="msgpack.zstf")  # idempotent
    assert again == copied


def test_a_truncated_index_on_s3_is_ignored_not_retried(seaweed, s3_bucket, fault_proxy, caplog):
    """An index shorter than its shard needs (its size is checked on every read of it) is set
    aside, logged, and the shard read without it, at once: the proxy's request log shows the
    truncated index requested at most once for each block of its shard, never retried."""
    from syvain_training_data.storage import put_object

    client = s3_client(seaweed, fault_proxy.endpoint)
    manifest_uri = f"s3://{s3_bucket}/short-index-{uuid.uuid4().hex}/data-manifest.json"
    saver = client.dataset_saver(manifest_uri, data_format="msgpack.zstf")
    for part in range(2):
        rows = (
            {"source": part, "i": i, "b": random.Random(i).randbytes(4000)} for i in range(3000)
        )
        saver.save("train", None, rows, shard_id=f"{part}")
    shards = saver.commit_manifest().splits["train"].shards
    uri = shards[1].uri + INDEX_SUFFIX
    data = get_object(uri, storage_config=client.storage_config)
    put_object(uri, data[:40], storage_config=client.storage_config)
    published = len(fault_proxy.history)
    loader = client.split_data_loader(manifest_uri, as_list, {"batch_size": 16}).load(
        "train", seed=3
    )
    got = sorted((r["source"], r["i"]) for batch in loader for r in batch)
    assert got == [(s, i) for s in range(2) for i in range(3000)]  # 2 blocks a shard
    assert "Ignoring the shard index" in caplog.text

    path = "/" + uri.removeprefix("s3://")
    requested = [r.target.split("?")[0] for r in fault_proxy.history[published:]].count(path)
    # Once, or once for each of the shard's 2 blocks when their reads start together before
    # the first sets it aside; retried, it would be requested up to the policy's 64 attempts.
    assert 1 <= requested <= 2
