"""Loader and stream counters: ``loader.stats()``, the periodic log line,
retries by cause through the fault proxy, and workers' counters reaching the main process."""

from __future__ import annotations

import logging
import pickle
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from fault_proxy import FaultProxy, reset_after, status  # noqa: E402
from loader_data import s3_client  # noqa: E402
from syvain_training_data import SyvainTrainingData  # noqa: E402
from syvain_training_data._native import StreamCounters  # noqa: E402
from syvain_training_data.loading.stats import RETRY_CAUSES, LoaderStats  # noqa: E402

SHARDS = 4
SHARD_RECORDS = 3000  # 12,000 records: more than one 1024-record publication per shard
BATCH = 64


def as_list(batch: list[Any]) -> list[Any]:
    return batch


def publish(client: SyvainTrainingData, manifest_uri: str) -> None:
    saver = client.dataset_saver(manifest_uri, data_format="msgpack.zstf")
    for shard in range(SHARDS):
        records = ({"shard": shard, "i": i, "text": "x" * 40} for i in range(SHARD_RECORDS))
        saver.save("train", None, records, shard_id=f"{shard:03d}")
    saver.commit_manifest()


@pytest.fixture(scope="module")
def local_dataset(tmp_path_factory) -> tuple[SyvainTrainingData, str]:
    client = SyvainTrainingData()
    uri = f"file://{tmp_path_factory.mktemp('stats')}/data-manifest.json"
    publish(client, uri)
    return client, uri


@pytest.fixture(scope="module")
def s3_dataset(seaweed, s3_bucket) -> tuple[SyvainTrainingData, str]:
    import uuid

    client = s3_client(seaweed)
    uri = f"s3://{s3_bucket}/stats-{uuid.uuid4().hex}/data-manifest.json"
    publish(client, uri)
    return client, uri


def shard_bytes(client: SyvainTrainingData, uri: str) -> int:
    return sum(shard.size_bytes for shard in client.load_manifest(uri).splits["train"].shards)


def read_epoch(loader: Any) -> int:
    return sum(len(batch) for batch in loader)


# fork is torch's default on Linux; spawn once per store shows the rows reach the main process.
@pytest.mark.parametrize(
    ("store", "workers", "context"),
    [
        ("local", 0, None),
        ("local", 2, "fork"),
        ("local", 2, "spawn"),
        ("s3", 0, None),
        ("s3", 2, "fork"),
        ("s3", 2, "spawn"),
    ],
)
def test_full_read_counts_records_bytes_and_opens_exactly(
    request, monkeypatch, store, workers, context
):
    client, uri = request.getfixturevalue(f"{store}_dataset")
    if store == "s3" and context == "spawn":  # spawned workers take the secret from their env
        for name, value in request.getfixturevalue("seaweed").env().items():
            monkeypatch.setenv(name, value)
    args: dict[str, Any] = {"batch_size": BATCH, "num_workers": workers}
    if context:
        args["multiprocessing_context"] = context
    loader = client.split_data_loader(uri, as_list, args).load("train")
    before = loader.stats()
    assert (before.records, before.bytes, before.batches, before.first_batch_s) == (0, 0, 0, None)

    assert read_epoch(loader) == SHARDS * SHARD_RECORDS
    stats = loader.stats()
    assert isinstance(stats, LoaderStats)
    assert stats.workers == workers
    assert stats.records == SHARDS * SHARD_RECORDS
    # Two workers split 4 equal shards at a shard boundary: each shard is streamed once.
    assert stats.bytes == shard_bytes(client, uri)
    assert stats.shard_opens == SHARDS
    assert stats.retries == dict.fromkeys(RETRY_CAUSES, 0)
    assert stats.batches == len(loader)
    # A mean of equal floats may round a hair above them.
    assert 0 < stats.first_record_mean_s <= stats.first_record_max_s * (1 + 1e-9)
    assert stats.first_batch_s is not None and 0 < stats.first_batch_s <= stats.elapsed_s
    assert 0 < stats.waited_s <= stats.elapsed_s

    # A second epoch adds to the same counters (new worker processes continue their rows).
    assert read_epoch(loader) == SHARDS * SHARD_RECORDS
    again = loader.stats()
    assert (again.records, again.bytes, again.shard_opens, again.batches) == (
        2 * stats.records,
        2 * stats.bytes,
        2 * SHARDS,
        2 * stats.batches,
    )


def test_counts_reach_the_main_process_while_workers_read(local_dataset):
    client, uri = local_dataset
    args = {"batch_size": BATCH, "num_workers": 2, "multiprocessing_context": "fork"}
    loader = client.split_data_loader(uri, as_list, args).load("train")
    batches = iter(loader)
    received = sum(len(next(batches)) for _ in range(60))  # 3,840 of 12,000 records
    stats = loader.stats()
    # Workers publish every 1024 records, and have read at least what the loop received.
    assert received - 2 * 1024 < stats.records <= SHARDS * SHARD_RECORDS
    assert stats.batches == 60
    del batches


def test_a_dropped_connection_is_counted_as_a_connection_retry(
    seaweed, s3_dataset, fault_proxy: FaultProxy
):
    _, uri = s3_dataset
    client = s3_client(seaweed, fault_proxy.endpoint)
    loader = client.split_data_loader(uri, as_list, {"batch_size": BATCH}).load("train")
    fault_proxy.script(reset_after(1000, method="GET", target="/shards/"))
    assert read_epoch(loader) == SHARDS * SHARD_RECORDS
    assert fault_proxy.faults_applied == 1
    stats = loader.stats()
    assert stats.retries == {**dict.fromkeys(RETRY_CAUSES, 0), "connection": 1}
    # The resumed stream fetches only the rest: the bytes handed over are still the shards'.
    assert stats.bytes == shard_bytes(client, uri)
    assert stats.records == SHARDS * SHARD_RECORDS


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_workers_retries_are_summed_in_the_main_process(
    s3_env, s3_dataset, fault_proxy: FaultProxy, context
):
    _, uri = s3_dataset
    client = s3_client(s3_env, fault_proxy.endpoint)
    args = {"batch_size": BATCH, "num_workers": 2, "multiprocessing_context": context}
    loader = client.split_data_loader(uri, as_list, args).load("train")
    fault_proxy.script(
        status(503, "Slow Down", "SlowDown", method="GET", target="/shards/"),
        reset_after(1000, method="GET", target="/shards/"),
    )
    assert read_epoch(loader) == SHARDS * SHARD_RECORDS
    assert fault_proxy.faults_applied == 2
    stats = loader.stats()
    assert stats.retries == {**dict.fromkeys(RETRY_CAUSES, 0), "status": 1, "connection": 1}
    assert stats.bytes == shard_bytes(client, uri)


def test_periodic_log_line_summarises_without_uris_or_secrets(seaweed, s3_dataset, caplog):
    client, uri = s3_dataset
    loader = client.split_data_loader(uri, as_list, {"batch_size": BATCH}).load(
        "train", log_stats_every=1e-9
    )
    with caplog.at_level(logging.INFO, logger="syvain_training_data.loading.stats"):
        read_epoch(loader)
    lines = [r.getMessage() for r in caplog.records if r.name.endswith("loading.stats")]
    assert len(lines) == len(loader)  # every batch is past the interval
    assert all(r.levelno == logging.INFO for r in caplog.records if r.name.endswith(".stats"))
    assert lines[-1].startswith(f"loader: {loader.stats().records:,} records (")
    assert "0 retries" in lines[-1] and "0 workers" in lines[-1]
    for line in lines:
        assert seaweed.secret_access_key not in line and seaweed.access_key_id not in line
        assert "s3://" not in line and "http" not in line


def test_no_log_line_unless_asked(local_dataset, caplog):
    client, uri = local_dataset
    loader = client.split_data_loader(uri, as_list, {"batch_size": BATCH}).load("train")
    with caplog.at_level(logging.DEBUG, logger="syvain_training_data.loading.stats"):
        read_epoch(loader)
    assert [r for r in caplog.records if r.name.endswith("loading.stats")] == []
    assert loader.stats().batches == len(loader)


@pytest.mark.parametrize("interval", [0, -1, float("nan"), True, "5"])
def test_log_interval_must_be_a_positive_number(local_dataset, interval):
    client, uri = local_dataset
    with pytest.raises(ValueError, match="log_stats_every must be a positive number"):
        client.split_data_loader(uri, as_list).load("train", log_stats_every=interval)


def test_dataset_still_pickles_outside_worker_start(local_dataset):
    client, uri = local_dataset
    loader = client.split_data_loader(uri, as_list, {"batch_size": BATCH}).load("train")
    read_epoch(loader)
    copy = pickle.loads(pickle.dumps(loader.dataset))
    # The copy counts on its own (shared rows travel only to the loader's workers).
    records = torch.utils.data.DataLoader(copy, batch_size=None)
    assert sum(1 for _ in records) == SHARDS * SHARD_RECORDS
    assert copy.counters.totals()[0] == SHARDS * SHARD_RECORDS
    assert loader.stats().records == SHARDS * SHARD_RECORDS


def test_stream_counters_count_only_streams_opened_while_entered(local_dataset):
    client, uri = local_dataset
    shard = client.load_manifest(uri).splits["train"].shards[0]
    from syvain_training_data.storage import open_stream

    counters, other = StreamCounters(), StreamCounters()
    with counters:
        stream = open_stream(shard.uri, size_bytes=shard.size_bytes)
    with other, open_stream(shard.uri, size_bytes=shard.size_bytes) as unread:
        assert unread.read(10) and (other.streams, counters.streams) == (1, 1)
    assert b"".join(stream) and (counters.streams, counters.bytes) == (1, shard.size_bytes)
    assert counters.retries == dict.fromkeys(RETRY_CAUSES, 0)
    with open_stream(shard.uri, size_bytes=shard.size_bytes) as outside:
        assert b"".join(outside)
    assert (counters.streams, counters.bytes) == (1, shard.size_bytes)
