"""A server that answers a ranged GET with 200 and the whole object (HTTP allows it): through
the fault proxy's ``ignore_range`` mode in front of SeaweedFS. A read from byte 0 takes the
object (or the prefix it asked for); a read from any later offset fails at once, naming the
answer, never retries, never yields bytes from the wrong offset."""

from __future__ import annotations

import json
import random
import time

import pytest

from fault_proxy import FaultProxy, reset_after
from manifest_helpers import small_manifest
from seaweed import SeaweedServer, config_for, storage_options
from shards import NATIVE_FORMATS, encode_shard, publish, text_records
from syvain_training_data import StorageError, SyvainTrainingData, storage
from syvain_training_data.manifest import validate_manifest
from syvain_training_data.shard import iter_shard
from syvain_training_data.testing import storage_policy

MIB = 1024 * 1024
ANSWER = "ranged GET.* with 200 and the whole object"
pytestmark = pytest.mark.timeout(120)


def gets(proxy: FaultProxy) -> int:
    return sum(record.method == "GET" for record in proxy.history)


@pytest.fixture
def ignoring(seaweed: SeaweedServer, fault_proxy: FaultProxy) -> FaultProxy:
    """The proxy, dropping every Range header from now on."""
    fault_proxy.ignore_range(seaweed)
    return fault_proxy


@pytest.fixture
def short_budget():
    # The old behaviour (every 200 retried) then ends in seconds, as a wrong error.
    with storage_policy(window_s=5.0, backoff_base_s=0.1, backoff_cap_s=0.2):
        yield


def test_load_manifest(seaweed, ignoring, s3_bucket, unique_prefix, short_budget):
    uri = f"s3://{s3_bucket}/{unique_prefix}/manifest.json"
    storage.put_object(
        uri, json.dumps(small_manifest()).encode(), storage_config=config_for(seaweed)
    )
    client = SyvainTrainingData(**storage_options(seaweed, ignoring.endpoint))
    assert client.load_manifest(uri) == validate_manifest(small_manifest())
    assert gets(ignoring) == 1


@pytest.mark.parametrize("data_format", NATIVE_FORMATS)
def test_iter_shard(seaweed, ignoring, s3_bucket, unique_prefix, short_budget, data_format):
    records = text_records(2000)
    uri = f"s3://{s3_bucket}/{unique_prefix}/part.{data_format}"
    shard = publish(uri, encode_shard(data_format, records), config_for(seaweed), len(records))
    config = config_for(seaweed, ignoring.endpoint)
    assert list(iter_shard(data_format, shard, storage_config=config)) == records
    assert gets(ignoring) == 1


def test_a_segment_from_byte_0_is_the_prefix_of_the_whole_body(
    seaweed, ignoring, s3_bucket, unique_prefix, short_budget
):
    data = random.Random(3).randbytes(3 * MIB)
    uri = f"s3://{s3_bucket}/{unique_prefix}/object.bin"
    info = storage.put_object(uri, data, storage_config=config_for(seaweed))
    config = config_for(seaweed, ignoring.endpoint)
    with storage.open_stream(uri, size_bytes=info.size, end=MIB + 7, storage_config=config) as s:
        assert b"".join(s) == data[: MIB + 7]
    # The ranged GET, answered with 200, then one plain GET whose prefix is taken.
    assert (gets(ignoring), ignoring.ranges_ignored) == (2, 1)


def test_a_read_from_a_later_offset_fails_at_once(seaweed, ignoring, s3_bucket, unique_prefix):
    data = random.Random(4).randbytes(MIB)
    uri = f"s3://{s3_bucket}/{unique_prefix}/object.bin"
    info = storage.put_object(uri, data, storage_config=config_for(seaweed))
    config = config_for(seaweed, ignoring.endpoint)
    began = time.monotonic()
    stream = storage.open_stream(uri, size_bytes=info.size, start=100, storage_config=config)
    with pytest.raises(StorageError, match=ANSWER) as caught, stream:
        list(stream)
    assert uri in str(caught.value) and "bytes=100-" in str(caught.value)
    assert (gets(ignoring), ignoring.ranges_ignored) == (1, 1)
    assert time.monotonic() - began < 5


@pytest.mark.parametrize("data_format", NATIVE_FORMATS)
def test_a_stream_resumed_mid_object_fails_at_once(
    seaweed, ignoring, s3_bucket, unique_prefix, data_format
):
    records = text_records(20_000)
    uri = f"s3://{s3_bucket}/{unique_prefix}/part.{data_format}"
    shard = publish(uri, encode_shard(data_format, records), config_for(seaweed), len(records))
    assert shard.size_bytes > 2 * MIB
    ignoring.script(reset_after(MIB, method="GET"))
    config = config_for(seaweed, ignoring.endpoint)
    seen = []
    began = time.monotonic()
    with pytest.raises(StorageError, match=ANSWER) as caught:
        for record in iter_shard(data_format, shard, storage_config=config):
            seen.append(record)
    elapsed = time.monotonic() - began
    assert uri in str(caught.value)
    # The plain GET cut after 1 MiB, then one ranged GET from there, answered with 200.
    assert (gets(ignoring), ignoring.ranges_ignored) == (2, 1)
    assert seen == records[: len(seen)]
    # One backoff of the default policy (at most 1 s) and two requests.
    assert elapsed < 5, elapsed


def test_a_whole_body_of_another_size_fails_at_once(seaweed, ignoring, s3_bucket, unique_prefix):
    data = random.Random(5).randbytes(1000)
    uri = f"s3://{s3_bucket}/{unique_prefix}/object.bin"
    storage.put_object(uri, data, storage_config=config_for(seaweed))
    config = config_for(seaweed, ignoring.endpoint)
    stream = storage.open_stream(uri, size_bytes=999, storage_config=config)
    with pytest.raises(StorageError, match="size mismatch"), stream:
        list(stream)
    assert gets(ignoring) == 1
