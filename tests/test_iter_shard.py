"""`iter_shard` over real stores: SeaweedFS (directly and through the fault proxy) and the local
directory store, for the two native formats."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import textwrap
from collections.abc import Iterable, Mapping
from typing import Any

import pytest

from fault_proxy import reset_after, short_body
from seaweed import config_for
from syvain_training_data import ManifestShard, _native, storage
from syvain_training_data.shard import iter_shard
from syvain_training_data.storage import StorageConfig
from syvain_training_data.testing import storage_policy

NATIVE_FORMATS = ["msgpack.zstf", "jsonl.gz"]
MIB = 1024 * 1024


def encode_shard(data_format: str, records: Iterable[Mapping[str, Any]], batch: int = 512) -> bytes:
    encoder = _native.ShardEncoder(data_format)
    pieces: list[bytes] = []
    pending: list[Mapping[str, Any]] = []
    for record in records:
        pending.append(record)
        if len(pending) == batch:
            pieces.append(encoder.encode(pending))
            pending = []
    pieces.append(encoder.encode(pending))
    pieces.append(encoder.finish())
    return b"".join(pieces)


def text_records(count: int, seed: int = 1) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    words = ["alpha", "beta", "gamma", "δέλτα", "epsilon", "ζ", "eta", "θ"]
    return [
        {
            "id": f"r{index}",
            "text": " ".join(rng.choice(words) for _ in range(200)),
            "tokens": [rng.randrange(-(2**40), 2**40) for _ in range(64)],
            "meta": {"i": index, "score": rng.random(), "tags": [], "empty": ""},
        }
        for index in range(count)
    ]


@pytest.fixture(params=["s3", "file"])
def store(request, seaweed, s3_bucket, unique_prefix, tmp_path) -> tuple[str, StorageConfig]:
    if request.param == "s3":
        return f"s3://{s3_bucket}/{unique_prefix}", config_for(seaweed)
    return f"file://{tmp_path}", StorageConfig()


def publish(uri: str, data: bytes, config: StorageConfig, records: int) -> ManifestShard:
    info = storage.put_object(uri, data, storage_config=config)
    return ManifestShard(uri=uri, records=records, size_bytes=info.size, etag=info.etag)


@pytest.mark.parametrize("data_format", NATIVE_FORMATS)
def test_round_trip(store, data_format):
    root, config = store
    records = text_records(3000)
    shard = publish(f"{root}/part.{data_format}", encode_shard(data_format, records), config, 3000)
    assert list(iter_shard(data_format, shard, storage_config=config)) == records


@pytest.mark.parametrize("data_format", NATIVE_FORMATS)
def test_iter_shard_is_lazy(store, data_format):
    root, config = store
    missing = ManifestShard(uri=f"{root}/missing.{data_format}", records=1, size_bytes=10)
    records = iter_shard(data_format, missing, storage_config=config)  # nothing is opened yet
    with pytest.raises(FileNotFoundError, match="missing"):
        next(records)


@pytest.mark.parametrize("data_format", NATIVE_FORMATS)
def test_more_records_than_declared_never_yielded(store, data_format):
    root, config = store
    records = text_records(50)
    data = encode_shard(data_format, records)
    shard = publish(f"{root}/part.{data_format}", data, config, 40)
    seen = []
    with pytest.raises(RuntimeError, match=rf"^Unreadable {data_format} shard .*declared 40"):
        for record in iter_shard(data_format, shard, storage_config=config):
            seen.append(record)
    assert seen == records[:40]


@pytest.mark.parametrize("data_format", NATIVE_FORMATS)
def test_fewer_records_than_declared(store, data_format):
    root, config = store
    records = text_records(30)
    shard = publish(f"{root}/part.{data_format}", encode_shard(data_format, records), config, 31)
    seen = []
    with pytest.raises(RuntimeError, match=r"declared 31 records but yielded 30"):
        for record in iter_shard(data_format, shard, storage_config=config):
            seen.append(record)
    assert seen == records


@pytest.mark.parametrize("data_format", NATIVE_FORMATS)
@pytest.mark.parametrize("delta", [-1, 1])
def test_size_mismatch_names_format_and_uri(store, data_format, delta):
    root, config = store
    shard = publish(
        f"{root}/p.{data_format}", encode_shard(data_format, text_records(5)), config, 5
    )
    wrong = shard.model_copy(update={"size_bytes": shard.size_bytes + delta})
    with pytest.raises(RuntimeError, match=rf"^Unreadable {data_format} shard {wrong.uri}: size"):
        list(iter_shard(data_format, wrong, storage_config=config))


@pytest.mark.parametrize("data_format", NATIVE_FORMATS)
def test_shard_streams_through_network_faults(
    seaweed, fault_proxy, s3_bucket, unique_prefix, data_format
):
    records = text_records(6000, seed=9)
    data = encode_shard(data_format, records)
    uri = f"s3://{s3_bucket}/{unique_prefix}/faulty.{data_format}"
    shard = publish(uri, data, config_for(seaweed), len(records))
    fault_proxy.script(reset_after(len(data) // 3), short_body(len(data) // 2))
    with storage_policy(backoff_base_s=0.01, backoff_cap_s=0.05):
        got = list(
            iter_shard(data_format, shard, storage_config=config_for(seaweed, fault_proxy.endpoint))
        )
    assert got == records
    assert fault_proxy.faults_applied == 2


def test_unknown_format_is_value_error(tmp_path):
    shard = ManifestShard(uri=f"file://{tmp_path}/x", records=1, size_bytes=1)
    with pytest.raises(ValueError, match="Unknown data format"):
        next(iter_shard("csv", shard))  # type: ignore[arg-type]


def test_one_gib_shard_streams_in_bounded_memory(seaweed, s3_bucket, unique_prefix):
    """A 1 GiB msgpack.zstf shard from SeaweedFS: peak RSS grows by less than 128 MiB."""
    record_bytes = 4 * MIB
    count = 256  # 256 x 4 MiB of incompressible bytes: a shard of just over 1 GiB
    encoder = _native.ShardEncoder("msgpack.zstf")
    rng = random.Random(5)
    pieces = [encoder.encode([{"i": i, "blob": rng.randbytes(record_bytes)}]) for i in range(count)]
    pieces.append(encoder.finish())
    data = b"".join(pieces)
    del pieces
    assert len(data) > 1024 * MIB
    uri = f"s3://{s3_bucket}/{unique_prefix}/big.msgpack.zstf"
    shard = publish(uri, data, config_for(seaweed), count)
    del data
    script = textwrap.dedent(
        f"""
        import json, os

        def peak_rss_kib():  # VmHWM belongs to this process image (ru_maxrss survives exec)
            with open("/proc/self/status") as status:
                for line in status:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1])

        from syvain_training_data import ManifestShard
        from syvain_training_data.shard import iter_shard
        from syvain_training_data.storage import StorageConfig
        config = StorageConfig.create(
            s3_base_url={seaweed.endpoint!r},
            region={seaweed.region!r},
            access_key_id=os.environ["AWS_ACCESS_KEY_ID"],
            secret_access_key=os.environ["AWS_SECRET_ACCESS_KEY"],
        )
        shard = ManifestShard.model_validate_json({shard.model_dump_json()!r})
        before = peak_rss_kib()
        n = 0
        total = 0
        for record in iter_shard("msgpack.zstf", shard, storage_config=config):
            n += 1
            total += len(record["blob"])
        after = peak_rss_kib()
        print(json.dumps({{"records": n, "bytes": total, "before_kib": before,
                          "growth_kib": after - before}}))
        """
    )
    # The credentials go through the environment so that no failure output shows them.
    env = dict(os.environ, **seaweed.env())
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env
    )
    assert result.returncode == 0, result.stderr
    import json

    measured = json.loads(result.stdout.strip().splitlines()[-1])
    print(f"1 GiB shard: {measured}")
    assert measured["records"] == count
    assert measured["bytes"] == count * record_bytes
    assert measured["growth_kib"] < 128 * 1024
    storage.delete_object(uri, storage_config=config_for(seaweed))
