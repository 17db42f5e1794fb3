"""Elastic resume end to end: stop a run of (ranks, workers, batch size) after k batches, resume
every rank of a run with another topology from one rank's state, and check each record of the
epoch arrives exactly once (real worker processes, the local store and SeaweedFS)."""

from __future__ import annotations

import json
import uuid
from collections import Counter
from typing import Any

import pytest

pytest.importorskip("torch")

from loader_data import publish_shards, s3_client  # noqa: E402
from syvain_training_data import SyvainTrainingData  # noqa: E402

SHARDS = {"msgpack.zstf": [37, 5, 61, 18, 44], "jsonl.gz": [23, 71, 9, 50]}


def record_ids(batch: list[Any]) -> list[str]:
    return [record["id"] for record in batch]


def make_dataset(client: SyvainTrainingData, root: str, data_format: str) -> tuple[str, set[str]]:
    uri = f"{root}/{data_format}/data-manifest.json"
    shards = [
        [{"id": f"{shard}-{i}", "text": "x" * (i % 13)} for i in range(count)]
        for shard, count in enumerate(SHARDS[data_format])
    ]
    ids = {record["id"] for records in shards for record in records}
    return publish_shards(client, uri, data_format, shards), ids


@pytest.fixture(scope="module")
def local_sets(tmp_path_factory):
    client = SyvainTrainingData()
    root = f"file://{tmp_path_factory.mktemp('resume')}"
    return client, {fmt: make_dataset(client, root, fmt) for fmt in SHARDS}


@pytest.fixture(scope="module")
def s3_sets(seaweed, s3_bucket):
    client = s3_client(seaweed)
    root = f"s3://{s3_bucket}/resume-{uuid.uuid4().hex}"
    return client, {fmt: make_dataset(client, root, fmt) for fmt in SHARDS}


def run(client, uri, ranks, workers, batch, stop_after, *, state=None, context="fork", **load):
    """Every rank of a run; each takes ``stop_after`` batches (None: to the end). Returns the
    record ids received and rank 0's state."""
    args: dict[str, Any] = {"batch_size": batch, "num_workers": workers}
    if workers:
        args["multiprocessing_context"] = context
    loader = client.split_data_loader(uri, record_ids, args)
    received: list[str] = []
    saved = None
    for rank in range(ranks):
        dl = loader.load("train", rank=rank, world_size=ranks, **load)
        if state is not None:
            dl.load_state_dict(json.loads(json.dumps(state)))  # as a checkpoint file would
        batches = iter(dl)
        for taken, batch in enumerate(batches):
            received += batch
            if stop_after is not None and taken + 1 == stop_after:
                break
        if rank == 0:
            saved = dl.state_dict()
        del batches
    return received, saved


# (ranks, workers, batch) stopped after k batches -> (ranks, workers, batch) to the end.
MATRIX = [
    ((2, 2, 4, 3), (3, 1, 5)),  # more ranks, fewer workers
    ((4, 0, 3, 4), (1, 2, 8)),  # shrink ranks, grow workers
    ((1, 2, 8, 5), (5, 3, 2)),  # grow both
    ((3, 3, 2, 4), (2, 0, 16)),  # shrink both
    ((8, 1, 1, 6), (8, 1, 1)),  # same topology
    ((2, 1, 7, 2), (6, 2, 3)),  # grow both again, other batch sizes
]


@pytest.mark.parametrize("data_format", list(SHARDS))
@pytest.mark.parametrize(("before", "after"), MATRIX)
def test_resume_on_another_topology_yields_the_rest_exactly_once(
    local_sets, data_format, before, after
):
    client, sets = local_sets
    uri, ids = sets[data_format]
    first, state = run(client, uri, *before, seed=11, shuffle_buffer=16)
    assert len(json.dumps(state)) <= 4096
    rest, _ = run(client, uri, *after, None, state=state, seed=11, shuffle_buffer=16)
    assert Counter(first + rest) == Counter(ids)


def test_resume_over_seaweedfs_with_spawned_workers(s3_sets, s3_env):
    # Spawned workers take the secret from the environment (s3_env).
    client, sets = s3_sets
    uri, ids = sets["msgpack.zstf"]
    first, state = run(client, uri, 2, 2, 4, 5, context="spawn", seed=3)
    rest, _ = run(client, uri, 3, 2, 6, None, state=state, context="spawn", seed=3)
    assert Counter(first + rest) == Counter(ids)


def test_resume_of_a_resumed_run(local_sets):
    client, sets = local_sets
    uri, ids = sets["jsonl.gz"]
    first, state = run(client, uri, 3, 1, 4, 3, seed=2)
    second, state = run(client, uri, 2, 2, 5, 2, state=state, seed=2)
    assert len(state["interrupts"]) == 2
    rest, _ = run(client, uri, 4, 0, 3, None, state=state, seed=2)
    assert Counter(first + second + rest) == Counter(ids)


def test_same_topology_resume_is_the_uninterrupted_stream(local_sets):
    client, sets = local_sets
    uri, _ = sets["msgpack.zstf"]
    whole, _ = run(client, uri, 1, 2, 4, None, seed=8)
    first, state = run(client, uri, 1, 2, 4, 7, seed=8)
    rest, _ = run(client, uri, 1, 2, 4, None, state=state, seed=8)
    assert first + rest == whole


def test_equal_batches_resume_keeps_ranks_equal(local_sets):
    client, sets = local_sets
    uri, ids = sets["msgpack.zstf"]
    first, state = run(client, uri, 2, 1, 4, 3, equal_batches=True)
    loader = client.split_data_loader(uri, record_ids, {"batch_size": 5})
    counts, rest = [], []
    for rank in range(3):
        dl = loader.load("train", rank=rank, world_size=3, equal_batches=True)
        dl.load_state_dict(state)
        batches = list(dl)
        counts.append(len(batches))
        rest += [i for b in batches for i in b]
    assert len(set(counts)) == 1
    received = Counter(first + rest)
    assert max(received.values()) == 1 and set(received) <= ids
    assert len(ids) - len(received) < 2 + 3  # fewer than world_size left out per run


def test_a_state_for_another_selection_is_refused(local_sets):
    client, sets = local_sets
    uri, _ = sets["msgpack.zstf"]
    _, state = run(client, uri, 1, 0, 4, 2, seed=1)
    loader = client.split_data_loader(uri, record_ids, {"batch_size": 4})
    with pytest.raises(ValueError, match="another selection"):
        loader.load("train", seed=2).load_state_dict(state)
    with pytest.raises(ValueError, match="Unsupported loader state version"):
        loader.load("train", seed=1).load_state_dict({"version": 1})


def write_foreign_dataset(root) -> tuple[str, set[str]]:
    """A dataset written without this package (msgpack + zstandard frames, gzip JSON lines and
    a hand-written manifest), as another conforming implementation would (SPEC sections 2-3)."""
    import gzip
    import struct

    import msgpack
    import zstandard

    ids: set[str] = set()
    splits = {}
    for data_format, counts in SHARDS.items():
        shards = []
        for shard, count in enumerate(counts):
            records = [{"id": f"{data_format}-{shard}-{i}", "n": [i, i * 2]} for i in range(count)]
            ids.update(r["id"] for r in records)
            if data_format == "msgpack.zstf":
                frames = [
                    zstandard.ZstdCompressor(level=3).compress(msgpack.packb(r)) for r in records
                ]
                data = b"".join(struct.pack(">Q", len(f)) + f for f in frames)
            else:
                lines = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records)
                data = gzip.compress(lines.encode(), mtime=0)
            path = root / f"{data_format}-{shard}.bin"
            path.write_bytes(data)
            shards.append({"uri": f"file://{path}", "records": count, "size_bytes": len(data)})
        splits[data_format] = shards
    return splits, ids


@pytest.mark.parametrize("data_format", list(SHARDS))
def test_datasets_of_other_writers_load_split_by_records(tmp_path, data_format):
    splits, _ = write_foreign_dataset(tmp_path)
    shards = splits[data_format]
    manifest = {
        "version": 1,
        "data_format": data_format,
        "splits": {"train": {"records": sum(s["records"] for s in shards), "shards": shards}},
    }
    uri = f"file://{tmp_path}/data-manifest.json"
    (tmp_path / "data-manifest.json").write_text(json.dumps(manifest))
    client = SyvainTrainingData()
    ids = {f"{data_format}-{s}-{i}" for s, n in enumerate(SHARDS[data_format]) for i in range(n)}
    first, state = run(client, uri, 3, 2, 4, 2, seed=6)
    rest, _ = run(client, uri, 2, 1, 5, None, state=state, seed=6)
    assert Counter(first + rest) == Counter(ids)


def test_a_thousand_resumes_on_one_topology(tmp_path):
    """A preemptible run: two ranks (of unequal batch counts) stopped after one batch each and
    resumed on the same topology 1,000 times in one epoch. Every state can be saved and stays
    one entry, far under 4 KiB, and the epoch is the uninterrupted one, every record once."""
    client = SyvainTrainingData()
    uri = f"file://{tmp_path}/data-manifest.json"
    saver = client.dataset_saver(uri, data_format="msgpack.zstf")
    ids = []
    for shard, count in enumerate([700, 601, 700]):  # 2,001 records: ranks of 1,001 and 1,000
        records = [{"id": f"{shard}-{i}"} for i in range(count)]
        ids += [r["id"] for r in records]
        saver.save("train", None, records, shard_id=f"{shard:03d}")
    saver.commit_manifest()
    loader = client.split_data_loader(uri, record_ids, {"batch_size": 1})
    options = {"world_size": 2, "seed": 3, "shuffle_buffer": 8}
    whole = [[i for b in loader.load("train", rank=r, **options) for i in b] for r in range(2)]
    streams: list[list[str]] = [[], []]
    state: dict[str, Any] | None = None
    sizes = []
    for _ in range(1000):
        for rank in range(2):
            dl = loader.load("train", rank=rank, **options)
            if state is not None:
                dl.load_state_dict(json.loads(json.dumps(state)))
            streams[rank] += next(iter(dl))
            if rank == 0:
                saved = dl.state_dict()
        state = saved
        sizes.append(len(json.dumps(state, separators=(",", ":"))))
        assert state["epoch"] == 0 and len(state["interrupts"]) == 1
    assert state == {**state, "interrupts": [[2, 1, 1, 0, 1000]]}
    for rank in range(2):
        dl = loader.load("train", rank=rank, **options)
        dl.load_state_dict(state)
        streams[rank] += [i for b in dl for i in b]
    assert streams == whole  # record for record the uninterrupted epoch
    assert Counter(streams[0] + streams[1]) == Counter(ids)
    # 81 bytes after the first resume, 84 after the 1,000th: only the batch count grows.
    assert max(sizes) < 100 and sizes[-1] - sizes[0] == len("1000") - len("1")
