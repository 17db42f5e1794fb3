"""Indexes never make the loader yield a wrong record (SPEC section 6, indexes, v4): a stale or
foreign index (it names another version of the shard) is set aside with one warning and the
shard read without it, at 1 and 4 ranks; a forged index that names the right version is found
by ``verify --deep``; whether the dataset has indexes is decided alike on every rank."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from fault_proxy import FaultProxy, status  # noqa: E402
from loader_data import s3_client  # noqa: E402
from syvain_training_data import SyvainTrainingData  # noqa: E402
from syvain_training_data.cli import main as cli_main  # noqa: E402
from syvain_training_data.formats.shard_index import (  # noqa: E402
    INDEX_SUFFIX,
    FrameOffsets,
    IndexLayout,
    ShardIndex,
    version_tag,
)
from syvain_training_data.storage import head_object  # noqa: E402

RECORDS = 90_000  # about 12 MB: three blocks of about 4 MiB, an index entry every ~14 records


def as_list(batch: list[Any]) -> list[Any]:
    return batch


def big_records(source: int) -> Any:
    # Small (several records per index entry) and incompressible.
    rng = random.Random(source)
    return ({"source": source, "i": i, "b": rng.randbytes(60 + i % 80)} for i in range(RECORDS))


@pytest.fixture
def dataset(tmp_path: Path) -> tuple[SyvainTrainingData, str, Any, Path]:
    client = SyvainTrainingData()
    manifest_uri = f"file://{tmp_path}/data-manifest.json"
    saver = client.dataset_saver(manifest_uri, data_format="msgpack.zstf")
    shard = saver.save("train", None, big_records(0), shard_id="big")
    saver.save("train", None, ({"source": 1, "i": i} for i in range(500)), shard_id="small")
    saver.commit_manifest()
    return client, manifest_uri, shard, Path(shard.uri.removeprefix("file://"))


def shifted_index(path: Path, shard: Any, version: bytes) -> bytes:
    """An index whose entries but the first point one frame early (at the record before the
    one they name), naming ``version``: every check a reader makes of the entries passes."""
    frames = FrameOffsets.of_file(str(path))
    layout = IndexLayout(shard.records, shard.size_bytes)
    assert frames.step == 1 and layout.every > 2
    entries = [0] + [frames.kept[k * layout.every - 1] for k in range(1, layout.entries)]
    return ShardIndex(shard.records, shard.size_bytes, version, entries).to_bytes()


def every_record_once(client: SyvainTrainingData, manifest_uri: str, world_size: int) -> None:
    seen = []
    for rank in range(world_size):
        loader = client.split_data_loader(manifest_uri, as_list, {"batch_size": 16}).load(
            "train", seed=5, rank=rank, world_size=world_size
        )
        seen += [(r["source"], r["i"]) for batch in loader for r in batch]
    expected = [(0, i) for i in range(RECORDS)] + [(1, i) for i in range(500)]
    assert sorted(seen) == expected


@pytest.mark.parametrize("world_size", [1, 4])
@pytest.mark.parametrize("kind", ["stale", "foreign"])
def test_a_stale_or_foreign_index_is_set_aside_and_every_record_comes_once(
    dataset, world_size, kind, caplog
):
    client, manifest_uri, shard, path = dataset
    index_path = path.parent / (path.name + INDEX_SUFFIX)
    etag = head_object(shard.uri).etag
    if kind == "stale":  # right for the shard before it was rewritten (its mtime moved on)
        index_path.write_bytes(shifted_index(path, shard, version_tag(shard.uri, etag)))
        stat = path.stat()
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    else:  # names another shard's version
        other = head_object(shard.uri.replace("part-big", "part-small")).etag
        index_path.write_bytes(shifted_index(path, shard, version_tag(shard.uri, other)))
    every_record_once(client, manifest_uri, world_size)
    warnings = [r for r in caplog.records if "Ignoring the shard index" in r.getMessage()]
    assert warnings and all("another version of the shard" in r.getMessage() for r in warnings)
    # One warning per shard per consumer, not per block.
    assert len(warnings) <= world_size


def test_a_forged_index_is_reported_by_verify_deep(dataset, capsys):
    """An index that names the shard's version but points at other records is trusted as much
    as the folder it sits in; ``verify --deep`` checks each entry against the shard."""
    client, manifest_uri, shard, path = dataset
    index_path = path.parent / (path.name + INDEX_SUFFIX)
    assert cli_main(["verify", "--deep", manifest_uri]) == 0
    version = version_tag(shard.uri, head_object(shard.uri).etag)
    index_path.write_bytes(shifted_index(path, shard, version))
    assert cli_main(["verify", "--deep", manifest_uri]) == 1
    out = capsys.readouterr().out
    assert f"problem: {shard.uri}{INDEX_SUFFIX}: " in out
    assert "entries name the wrong byte offset" in out and "entry 1: record" in out


def test_an_earlier_releases_index_is_not_used(dataset, caplog):
    client, manifest_uri, shard, path = dataset
    index_path = path.parent / (path.name + INDEX_SUFFIX)
    data = bytearray(index_path.read_bytes())
    data[:8] = b"SYVIDX01"
    index_path.write_bytes(bytes(data))
    every_record_once(client, manifest_uri, 1)
    assert "written by an earlier release" in caplog.text


def test_the_saver_writes_the_index_as_octet_stream_naming_the_shard_version(dataset):
    client, manifest_uri, shard, path = dataset
    data = (path.parent / (path.name + INDEX_SUFFIX)).read_bytes()
    version = version_tag(shard.uri, head_object(shard.uri).etag)
    index = ShardIndex.parse(data, shard.records, shard.size_bytes, version)
    assert list(index.offsets) == list(FrameOffsets.of_file(str(path)).kept)[:: index.layout.every]


CHILD = textwrap.dedent(
    """
    import json, os, sys
    from syvain_training_data import SyvainTrainingData
    endpoint, region, manifest_uri, rank, world, dist = sys.argv[1:7]
    rank, world = int(rank), int(world)
    if dist == "1":
        import torch.distributed
        torch.distributed.init_process_group(
            "gloo", init_method=os.environ["INIT"], rank=rank, world_size=world
        )
    client = SyvainTrainingData(
        s3_base_url=endpoint, region=region,
        access_key_id=os.environ["AWS_ACCESS_KEY_ID"],
        secret_access_key=os.environ["AWS_SECRET_ACCESS_KEY"],
    )
    loader = client.split_data_loader(manifest_uri, lambda b: b, {"batch_size": 16})
    ranks = {} if dist == "1" else {"rank": rank, "world_size": world}
    try:
        batches = loader.load("train", seed=5, **ranks)
        print(json.dumps([[r["source"], r["i"]] for b in batches for r in b]))
    except Exception as error:
        print(json.dumps({"error": f"{type(error).__name__}: {error}"}))
    """
)


def run_ranks(
    seaweed: Any, proxy: FaultProxy, manifest_uri: str, dist: bool, tmp_path: Path
) -> list[Any]:
    """Rank 0 reads straight from SeaweedFS, rank 1 through ``proxy``; each a process."""
    env = dict(
        os.environ,
        AWS_ACCESS_KEY_ID=seaweed.access_key_id,
        AWS_SECRET_ACCESS_KEY=seaweed.secret_access_key,
        INIT=f"file://{tmp_path}/rendezvous-{uuid.uuid4().hex}",
    )
    children = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, endpoint, seaweed.region, manifest_uri]
            + [str(rank), "2", "1" if dist else "0"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for rank, endpoint in enumerate((seaweed.endpoint, proxy.endpoint))
    ]
    outputs = []
    for child in children:
        out, err = child.communicate(timeout=300)
        assert child.returncode == 0, err[-3000:]
        outputs.append(json.loads(out.strip().splitlines()[-1]))
    return outputs


@pytest.mark.parametrize("dist", [False, True])
def test_a_rank_that_cannot_read_the_index_never_orders_otherwise(
    seaweed, s3_bucket, tmp_path, dist
):
    """Rank 1's every request for an index is refused (403): alone it raises a clear error at
    load(), in a torch.distributed group it takes rank 0's answer and reads the shards without
    the index; never records twice or not at all."""
    client = s3_client(seaweed)
    manifest_uri = f"s3://{s3_bucket}/ranks-{uuid.uuid4().hex}/data-manifest.json"
    saver = client.dataset_saver(manifest_uri, data_format="msgpack.zstf")
    saver.save("train", None, big_records(0), shard_id="big")
    saver.save("train", None, ({"source": 1, "i": i} for i in range(500)), shard_id="small")
    saver.commit_manifest()
    with FaultProxy("127.0.0.1", seaweed.port) as proxy:
        proxy.script(*[status(403, "Forbidden", "AccessDenied", target=".index")] * 50)
        outputs = run_ranks(seaweed, proxy, manifest_uri, dist, tmp_path)
    assert isinstance(outputs[0], list)
    if not dist:
        assert "Cannot tell whether the dataset has record offset indexes" in outputs[1]["error"]
        assert "indexes=True or indexes=False" in outputs[1]["error"]
        return
    seen = sorted(tuple(r) for r in outputs[0] + outputs[1])
    assert seen == [(0, i) for i in range(RECORDS)] + [(1, i) for i in range(500)]


def test_a_state_resumed_with_the_other_index_answer_is_refused_naming_indexes(dataset):
    client, manifest_uri, _, _ = dataset
    loader = client.split_data_loader(manifest_uri, as_list, {"batch_size": 16})
    first = loader.load("train", seed=5)
    batches = iter(first)
    next(batches)
    state = first.state_dict()
    json.dumps(state)  # plain JSON
    for indexes, words in ((False, "indexes=True"), (True, None)):
        resumed = loader.load("train", seed=5, indexes=indexes)
        if words is None:
            resumed.load_state_dict(state)  # the answer the state was saved with
            continue
        with pytest.raises(ValueError, match=words) as info:
            resumed.load_state_dict(state)
        assert "with record offset indexes" in str(info.value)
