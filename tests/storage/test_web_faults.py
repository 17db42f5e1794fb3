"""Faults between our client and the read-only web store (a plain-HTTP server on loopback,
read with ``allow_http``, as http:// URIs and as a gated hf:// repository at an ``HF_ENDPOINT``
mirror) and the gs:// store (fake-gcs-server), injected by our fault proxy
(tests/fault_proxy.py), which speaks plain HTTP/1.1: a reset mid-body is resumed by range with
the exact bytes and records, 5xx and 429 (with Retry-After) are retried and then succeed, a
persistent 5xx fails naming the object without hanging, and a stalled body is reopened."""

from __future__ import annotations

import logging
import random
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import fault_proxy as proxy_faults
from fault_proxy import FaultProxy
from gcs_emulator import _free_port, start_fake_gcs
from https_server import HttpsServer, serve_http
from syvain_training_data import StorageRetryExhaustedError, SyvainTrainingData, iter_shard
from syvain_training_data.manifest import ManifestShard
from syvain_training_data.storage import StorageConfig, get_object, native_storage, open_stream
from syvain_training_data.testing import storage_policy

MIB = 1024 * 1024
# Seeded for a reproducible failure; nothing here depends on the values.
DATA = random.Random(37).randbytes(6 * MIB)
RECORDS = [{"i": i, "text": random.Random(i).randbytes(700).hex()} for i in range(4500)]
FAST_BACKOFF = {"backoff_base_s": 0.01, "backoff_cap_s": 0.05}
HUB_FILES = "/datasets/org/corpus/resolve/main/objects"
HUB_TOKEN = "hf_fault_test_token"
pytestmark = pytest.mark.timeout(120)


@dataclass
class Store:
    """One store behind the proxy: the URIs of the big object and of a jsonl.gz shard."""

    name: str
    proxy: FaultProxy
    config: StorageConfig | None
    big: str
    shard: ManifestShard
    faults_before: int = 0

    @property
    def faults_applied(self) -> int:
        """Faults applied during this test (the proxy may serve a whole module)."""
        return self.proxy.faults_applied - self.faults_before


def jsonl_shard(folder: Path) -> tuple[bytes, int]:
    """The bytes and record count of a jsonl.gz shard of ``RECORDS`` written by the saver."""
    saver = SyvainTrainingData().dataset_saver(f"file://{folder}/m.json")
    shard = saver.save("train", None, RECORDS, shard_id="s")
    return Path(shard.uri.removeprefix("file://")).read_bytes(), shard.records


@pytest.fixture(scope="module")
def shard_bytes(tmp_path_factory) -> bytes:
    data, records = jsonl_shard(tmp_path_factory.mktemp("shard"))
    assert records == len(RECORDS) and len(data) > 3 * MIB  # resets below land mid-body
    return data


@pytest.fixture(scope="module")
def web(shard_bytes) -> Iterator[HttpsServer]:
    with serve_http() as server:
        for base in ("/objects", HUB_FILES):
            server.paths[f"{base}/big.bin"] = DATA
            server.paths[f"{base}/part.jsonl.gz"] = shard_bytes
        server.tokens[HUB_FILES] = HUB_TOKEN  # a gated repository
        yield server


@pytest.fixture(scope="module")
def gcs(shard_bytes) -> Iterator[tuple[FaultProxy, str]]:
    """fake-gcs-server behind a proxy (it serves downloads only to its public host, so the
    proxy starts first and is that host): the proxy and a bucket."""
    port = _free_port()
    with (
        FaultProxy("127.0.0.1", port) as proxy,
        start_fake_gcs(port, public_host=f"127.0.0.1:{proxy.port}") as server,
    ):
        bucket = f"b-{uuid.uuid4().hex[:12]}"
        server.create_bucket(bucket)
        server.upload(bucket, "objects/big.bin", DATA)
        server.upload(bucket, "objects/part.jsonl.gz", shard_bytes)
        yield proxy, bucket


@pytest.fixture(params=["http", "hf", "gs"])
def store(request, web, gcs, shard_bytes, monkeypatch) -> Iterator[Store]:
    native_storage.cache_clear()
    size = len(shard_bytes)
    if request.param == "http":
        proxy = FaultProxy("127.0.0.1", web.port).start()
        base = f"http://127.0.0.1:{proxy.port}/objects"
        config: StorageConfig | None = StorageConfig(allow_http=True)
    elif request.param == "hf":
        # The Hub's resolve URLs at a mirror (HF_ENDPOINT) behind the proxy, over plain HTTP.
        proxy = FaultProxy("127.0.0.1", web.port).start()
        monkeypatch.setenv("HF_ENDPOINT", proxy.endpoint)
        monkeypatch.delenv("HF_TOKEN", raising=False)
        base = "hf://datasets/org/corpus@main/objects"
        config = StorageConfig.create(allow_http=True, hf_token=HUB_TOKEN)
    else:
        proxy, bucket = gcs
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.endpoint)
        base = f"gs://{bucket}/objects"
        config = None
    shard = ManifestShard(uri=f"{base}/part.jsonl.gz", records=len(RECORDS), size_bytes=size)
    store = Store(request.param, proxy, config, f"{base}/big.bin", shard, proxy.faults_applied)
    try:
        yield store
    finally:
        proxy.clear()
        if request.param != "gs":
            proxy.stop()
        native_storage.cache_clear()


def read_big(store: Store) -> tuple[bytes, int | None]:
    with open_stream(store.big, size_bytes=len(DATA), storage_config=store.config) as stream:
        data = b"".join(stream)
        return data, stream.resumes


def test_a_reset_mid_body_is_resumed_by_range(store, web, caplog):
    store.proxy.script(
        proxy_faults.reset_after(1 * MIB, method="GET"),
        proxy_faults.reset_after(2 * MIB, method="GET"),
    )
    web.requests.clear()
    with storage_policy(**FAST_BACKOFF), caplog.at_level(logging.WARNING):
        data, resumes = read_big(store)
    assert data == DATA and resumes == 2
    assert store.faults_applied == 2
    retries = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(retries) == 2 and all(store.big in message for message in retries)
    if store.name != "gs":
        ranges = [
            next((v for k, v in h.items() if k.lower() == "range"), None)
            for method, _, h in web.requests
            if method == "GET"
        ]
        # The first read asks for the whole object; each resume for the rest from a later
        # offset (at least what arrived before the reset was not asked for again).
        starts = [int(r.removeprefix("bytes=").partition("-")[0]) for r in ranges if r]
        assert len(ranges) == 3 and len(starts) == 2
        assert starts[0] >= 1 * MIB - 1 and starts[1] >= starts[0]


def test_records_are_exact_after_resets_mid_shard(store):
    store.proxy.script(
        proxy_faults.reset_after(1 * MIB, method="GET"),
        proxy_faults.short_body(2 * MIB, method="GET"),
    )
    with storage_policy(**FAST_BACKOFF):
        got = list(iter_shard("jsonl.gz", store.shard, storage_config=store.config))
    assert got == RECORDS
    assert store.faults_applied == 2


def test_5xx_and_429_with_retry_after_are_retried_then_succeed(store, caplog):
    store.proxy.script(
        proxy_faults.status(500, method="GET"),
        proxy_faults.status(503, "Slow Down", "SlowDown", method="GET"),
        proxy_faults.status(429, "Too Many Requests", headers={"Retry-After": "1"}, method="GET"),
    )
    started = time.monotonic()
    with storage_policy(**FAST_BACKOFF), caplog.at_level(logging.WARNING):
        data, resumes = read_big(store)
        assert data == DATA and resumes == 3
        store.proxy.script(
            proxy_faults.status(429, "Too Many Requests", headers={"Retry-After": "1"}),
            proxy_faults.status(502, "Bad Gateway"),
        )
        assert get_object(store.shard.uri, storage_config=store.config)[:2] == b"\x1f\x8b"
    # Each Retry-After of 1 s was waited out (our own backoff here is at most 0.05 s).
    assert time.monotonic() - started >= 2.0
    assert store.faults_applied == 5
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(messages) == 5
    assert any("429" in message for message in messages)
    assert HUB_TOKEN not in caplog.text


def test_a_persistent_5xx_fails_naming_the_object_without_hanging(store):
    store.proxy.script(*[proxy_faults.status(503, "Service Unavailable")] * 20)
    with storage_policy(max_attempts=4, window_s=60, **FAST_BACKOFF):
        with pytest.raises(StorageRetryExhaustedError) as streamed:
            read_big(store)
        with pytest.raises(StorageRetryExhaustedError) as point:
            get_object(store.shard.uri, storage_config=store.config)
    store.proxy.clear()
    for raised, uri in ((streamed, store.big), (point, store.shard.uri)):
        message = str(raised.value)
        assert uri in message and "4 attempts" in message and "503" in message
    assert store.faults_applied == 8


def test_a_stalled_body_is_reopened_not_waited_on_forever(store):
    # The proxy would keep the connection silent for far longer than the test may run: only
    # the read-inactivity timeout ends the wait, and the read resumes from where it was.
    store.proxy.script(proxy_faults.stall_after(1 * MIB, 600.0, method="GET"))
    started = time.monotonic()
    with storage_policy(read_inactivity_timeout_s=1.0, **FAST_BACKOFF):
        data, resumes = read_big(store)
    assert data == DATA and resumes == 1
    assert time.monotonic() - started >= 1.0  # it did wait out the inactivity timeout
