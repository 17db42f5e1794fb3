"""`iter_shard` over real stores: SeaweedFS (directly and through the fault proxy) and the local
directory store, for the two native formats."""

from __future__ import annotations

import random

import pytest

from fault_proxy import reset_after, short_body
from memory import run_child
from seaweed import config_for
from shards import NATIVE_FORMATS, encode_shard, publish, text_records
from syvain_training_data import ManifestShard, storage
from syvain_training_data.shard import iter_shard
from syvain_training_data.testing import storage_policy

MIB = 1024 * 1024


@pytest.mark.parametrize("data_format", NATIVE_FORMATS)
def test_round_trip(store_root, data_format):
    root, config = store_root
    records = text_records(3000)
    shard = publish(f"{root}/part.{data_format}", encode_shard(data_format, records), config, 3000)
    assert list(iter_shard(data_format, shard, storage_config=config)) == records


@pytest.mark.parametrize("data_format", NATIVE_FORMATS)
def test_iter_shard_is_lazy(store_root, data_format):
    root, config = store_root
    missing = ManifestShard(uri=f"{root}/missing.{data_format}", records=1, size_bytes=10)
    records = iter_shard(data_format, missing, storage_config=config)  # nothing is opened yet
    with pytest.raises(FileNotFoundError, match="missing"):
        next(records)


@pytest.mark.parametrize("data_format", NATIVE_FORMATS)
def test_more_records_than_declared_never_yielded(store_root, data_format):
    root, config = store_root
    records = text_records(50)
    data = encode_shard(data_format, records)
    shard = publish(f"{root}/part.{data_format}", data, config, 40)
    seen = []
    with pytest.raises(RuntimeError, match=rf"^Unreadable {data_format} shard .*declared 40"):
        for record in iter_shard(data_format, shard, storage_config=config):
            seen.append(record)
    assert seen == records[:40]


@pytest.mark.parametrize("data_format", NATIVE_FORMATS)
def test_fewer_records_than_declared(store_root, data_format):
    root, config = store_root
    records = text_records(30)
    shard = publish(f"{root}/part.{data_format}", encode_shard(data_format, records), config, 31)
    seen = []
    with pytest.raises(RuntimeError, match=r"declared 31 records but yielded 30"):
        for record in iter_shard(data_format, shard, storage_config=config):
            seen.append(record)
    assert seen == records


@pytest.mark.parametrize("data_format", NATIVE_FORMATS)
@pytest.mark.parametrize("delta", [-1, 1])
def test_size_mismatch_names_format_and_uri(store_root, data_format, delta):
    root, config = store_root
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


def test_one_gib_shard_streams_in_bounded_memory(s3_env, s3_bucket, unique_prefix):
    """A 1 GiB msgpack.zstf shard from SeaweedFS: peak RSS grows by less than 128 MiB."""
    record_bytes = 4 * MIB
    count = 256  # 256 x 4 MiB of incompressible bytes: a shard of just over 1 GiB
    rng = random.Random(5)
    blobs = ({"i": i, "blob": rng.randbytes(record_bytes)} for i in range(count))
    uri = f"s3://{s3_bucket}/{unique_prefix}/big.msgpack.zstf"
    shard = publish(uri, encode_shard("msgpack.zstf", blobs, batch=1), config_for(s3_env), count)
    assert shard.size_bytes > 1024 * MIB
    # The credentials reach the child through the environment, so no failure output shows them.
    measured = run_child(
        f"""
        from syvain_training_data import ManifestShard
        from syvain_training_data.shard import iter_shard
        config = s3_config({s3_env.endpoint!r}, {s3_env.region!r})
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
        """,
        timeout=300,
    )
    print(f"1 GiB shard: {measured}")
    assert measured["records"] == count
    assert measured["bytes"] == count * record_bytes
    assert measured["growth_kib"] < 128 * 1024
    storage.delete_object(uri, storage_config=config_for(s3_env))
