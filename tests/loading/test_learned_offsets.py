"""A msgpack.zstf shard without a usable index, inside an indexed dataset, costs a seeded
consumer at most about twice its bytes (the frames walked once, each block read once), never
the quadratic bytes of reading every block from the shard's start."""

from __future__ import annotations

import os
import random
import struct
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from syvain_training_data import SyvainTrainingData  # noqa: E402
from syvain_training_data.formats.shard_index import INDEX_SUFFIX, FrameOffsets  # noqa: E402
from syvain_training_data.loading import learned_offsets  # noqa: E402
from syvain_training_data.loading.learned_offsets import LearnedOffsets  # noqa: E402
from syvain_training_data.manifest import ManifestShard  # noqa: E402
from syvain_training_data.shard import iter_shard  # noqa: E402


def as_list(batch: list[Any]) -> list[Any]:
    return batch


def frames_file(path: Path, lengths: list[int]) -> ManifestShard:
    body = b"".join(struct.pack(">Q", n) + bytes([n % 251]) * n for n in lengths)
    path.write_bytes(body)
    return ManifestShard(uri=f"file://{path}", records=len(lengths), size_bytes=len(body))


def test_learned_segments_hold_exactly_the_records_asked(tmp_path, monkeypatch):
    monkeypatch.setattr(learned_offsets, "PIECE_BYTES", 4096)  # many pieces, cut headers
    rng = random.Random(3)
    lengths = [rng.choice([1, 7, 300, 5000, 9000]) for _ in range(2000)]
    shard = frames_file(tmp_path / "s", lengths)
    starts = [0]
    for n in lengths:
        starts.append(starts[-1] + 8 + n)
    learned = LearnedOffsets(shard, None)
    for _ in range(300):
        start = rng.randrange(len(lengths))
        stop = rng.randint(start + 1, min(len(lengths), start + learned.block))
        segment = learned.segment(start, stop)
        assert segment is not None
        end = segment.first + segment.records
        assert segment.first <= start < stop <= end
        assert segment.byte_start == starts[segment.first]
        assert segment.byte_end == starts[end]
    assert learned.frontier[0] <= len(lengths)


@pytest.mark.parametrize(
    "damage", ["zero length", "beyond the shard", "fewer frames", "huge length"]
)
def test_bytes_that_are_not_frames_stop_the_walk(tmp_path, damage):
    shard = frames_file(tmp_path / "s", [10] * 100)
    data = bytearray(Path(shard.uri.removeprefix("file://")).read_bytes())
    if damage == "zero length":
        data[18 * 50 : 18 * 50 + 8] = struct.pack(">Q", 0)
    elif damage == "beyond the shard":
        data[18 * 50 : 18 * 50 + 8] = struct.pack(">Q", 10_000)
    elif damage == "huge length":
        data[18 * 50 : 18 * 50 + 8] = struct.pack(">Q", 2**63)
    else:
        shard = ManifestShard(uri=shard.uri, records=101, size_bytes=shard.size_bytes)
    Path(shard.uri.removeprefix("file://")).write_bytes(bytes(data))
    assert LearnedOffsets(shard, None).segment(95, shard.records) is None


def test_an_unindexed_shard_among_indexed_ones_costs_about_twice_its_bytes(tmp_path):
    client = SyvainTrainingData()
    manifest_uri = f"file://{tmp_path}/data-manifest.json"
    saver = client.dataset_saver(manifest_uri, data_format="msgpack.zstf")
    rng = random.Random(0)
    small = saver.save("train", None, ({"s": 0, "i": i} for i in range(3000)), shard_id="a")
    # About 40 MB: ten blocks, read in the seeded order's random block order.
    big = saver.save(
        "train",
        None,
        ({"s": 1, "i": i, "b": rng.randbytes(1000)} for i in range(40_000)),
        shard_id="b",
    )
    saver.commit_manifest()
    os.unlink(big.uri.removeprefix("file://") + INDEX_SUFFIX)
    loader = client.split_data_loader(manifest_uri, as_list, {"batch_size": 32}).load(
        "train", seed=1
    )
    seen = sorted((r["s"], r["i"]) for batch in loader for r in batch)
    assert seen == [(0, i) for i in range(3000)] + [(1, i) for i in range(40_000)]
    fetched = loader.stats().bytes
    print(f"fetched {fetched / big.size_bytes:.3f} x the unindexed shard's bytes")
    # Read from its start block by block, the big shard cost 5.5 times its bytes.
    assert fetched <= 2.05 * big.size_bytes + 1.1 * small.size_bytes, fetched / big.size_bytes
    # The walk learned offsets at the index's stride: the same offsets an index holds.
    frames = FrameOffsets.of_file(big.uri.removeprefix("file://"))
    learned = LearnedOffsets(big, None)
    assert learned.segment(39_990, 40_000) is not None
    every = learned.stride
    starts = [*frames.kept, big.size_bytes]  # frames.step is 1: every frame start
    assert list(learned.points) == starts[::every]
    assert [r["i"] for r in iter_shard("msgpack.zstf", big, start=39_990)] == list(
        range(39_990, 40_000)
    )
