"""A forked child never hangs on what its parent left behind.

``fork()`` copies a process's memory but only the forking thread. Locks that another thread of
the parent held at that moment (the I/O runtime's scheduler, a connection pool, a channel) stay
locked forever in the child, so a child that uses or *drops* anything built in the parent that
holds the runtime, a client or a connection waits forever. These tests fork hundreds of times
while the parent's streams, decoder threads and prefetch threads are live, and require every
child to drop what it inherited, read afresh and exit, within a generous deadline.
"""

from __future__ import annotations

import gc
import os
import signal
import threading
import time
import traceback
import uuid
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest

pytest.importorskip("torch")

from loader_data import publish_shards, s3_client  # noqa: E402
from syvain_training_data import SyvainTrainingData, iter_shard  # noqa: E402

FORKS = 120
DATALOADER_FORKS = 12
# Far above what a healthy child needs (tens of milliseconds); only a hang gets near it.
CHILD_DEADLINE_S = 60.0
SHARDS = 6
RECORDS_PER_SHARD = 400


def _records(shard: int) -> list[dict[str, Any]]:
    # Incompressible-ish payloads so that each shard is a few hundred KiB and streams stay busy.
    return [
        {"shard": shard, "i": i, "payload": os.urandom(512).hex()} for i in range(RECORDS_PER_SHARD)
    ]


def _publish(client: SyvainTrainingData, root: str) -> str:
    shards = (_records(shard) for shard in range(SHARDS))
    return publish_shards(client, f"{root}/data-manifest.json", "msgpack.zstf", shards, 2)


@pytest.fixture(scope="module", params=["local", "s3"])
def published(request, tmp_path_factory) -> tuple[SyvainTrainingData, str]:
    if request.param == "local":
        client = SyvainTrainingData()
        root = f"file://{tmp_path_factory.mktemp('fork-safety')}"
    else:
        seaweed = request.getfixturevalue("seaweed")
        bucket = request.getfixturevalue("s3_bucket")
        client = s3_client(seaweed)
        root = f"s3://{bucket}/fork-safety-{uuid.uuid4().hex}"
    return client, _publish(client, root)


def as_list(batch: list[Any]) -> list[Any]:
    return batch


def _keep_reading(loader: Any, stop: threading.Event) -> None:
    """Epoch after epoch until ``stop``: streams, decoders and prefetch threads stay live."""
    while not stop.is_set():
        for _ in loader:
            if stop.is_set():
                return


def _wait(pid: int, deadline: float) -> int | None:
    """The child's exit code, or None if it was still running at ``deadline`` (then killed)."""
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.002)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return None


def _fork_many(
    count: int, child: Callable[[int], None], deadline_s: float = CHILD_DEADLINE_S
) -> tuple[int, list[int]]:
    """Forks ``count`` children one after another, each running ``child(number)`` then exiting.

    Returns (children that hung, exit codes of children that failed)."""
    hung, failed = 0, []
    for number in range(count):
        with warnings.catch_warnings():
            # Python warns that forking a multi-threaded process may deadlock the child:
            # that is exactly what this test is about.
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the child
            code = 0
            try:
                child(number)
            except BaseException:
                traceback.print_exc()
                code = 3
            os._exit(code)
        code = _wait(pid, time.monotonic() + deadline_s)
        if code is None:
            hung += 1
        elif code != 0:
            failed.append(code)
    return hung, failed


@pytest.fixture
def busy_parent(published) -> Iterator[tuple[SyvainTrainingData, str, Iterator[Any]]]:
    """The parent mid-read: a thread reading epoch after epoch (prefetching the next shard),
    and a paused iterator whose streams and decoder are open."""
    client, manifest_uri = published
    background = client.split_data_loader(manifest_uri, as_list, {"batch_size": 16}).load("train")
    stop = threading.Event()
    reader = threading.Thread(target=_keep_reading, args=(background, stop), daemon=True)
    reader.start()
    paused_loader = client.split_data_loader(manifest_uri, as_list, {"batch_size": 8})
    paused = iter(paused_loader.load("train", seed=1))
    next(paused)
    try:
        yield client, manifest_uri, paused
    finally:
        stop.set()
        reader.join(timeout=120)


def test_forked_children_drop_what_they_inherited_and_read_afresh(busy_parent):
    client, manifest_uri, paused = busy_parent
    manifest = client.load_manifest(manifest_uri)
    shard = manifest.splits["train"].shards[-1]
    config = client.storage_config
    loader = client.split_data_loader(manifest_uri, as_list, {"batch_size": 64})

    def child(number: int) -> None:
        # Drop the parent's paused iterator (its streams, decoder and prefetch thread) and,
        # now and then, everything else unreachable (a full collection takes ~70 ms here);
        # then read a shard and a whole epoch through the clients the parent built.
        paused.close()
        if number % 10 == 0:
            gc.collect()
        records = sum(1 for _ in iter_shard("msgpack.zstf", shard, storage_config=config))
        assert records == RECORDS_PER_SHARD
        assert sum(len(batch) for batch in loader.load("train")) == SHARDS * RECORDS_PER_SHARD

    hung, failed = _fork_many(FORKS, child)
    assert (hung, failed) == (0, [])
    # The parent's own reads are untouched by its children.
    assert sum(len(batch) for batch in paused) + 8 == SHARDS * RECORDS_PER_SHARD


def test_dataloader_workers_fork_while_the_parent_reads(busy_parent):
    client, manifest_uri, _ = busy_parent
    args = {"batch_size": 32, "num_workers": 2, "multiprocessing_context": "fork", "timeout": 120}
    loader = client.split_data_loader(manifest_uri, as_list, args)
    for _ in range(DATALOADER_FORKS):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            total = sum(len(batch) for batch in loader.load("train", seed=0))
        assert total == SHARDS * RECORDS_PER_SHARD


def test_a_child_drops_an_inherited_shard_encoder_without_joining_its_thread():
    """An encoder's compressor thread exists only in the parent: dropping the encoder in the
    child used to join that thread, a Rust panic inside the interpreter's deallocation. The
    child leaks it instead, refuses to use an inherited one, and encodes afresh."""
    from syvain_training_data import _native

    encoder = _native.ShardEncoder("jsonl.gz")
    encoder.encode([{"i": i, "text": "x" * 100} for i in range(2000)])
    kept = _native.ShardEncoder("msgpack.zstf")

    def child(number: int) -> None:
        nonlocal encoder
        del encoder
        gc.collect()
        with pytest.raises(ValueError, match="opened before the process forked"):
            kept.encode([{"i": 0}])
        fresh = _native.ShardEncoder("msgpack.zstf")
        fresh.encode([{"i": number}])
        assert fresh.finish()

    hung, failed = _fork_many(2, child, deadline_s=10.0)
    assert (hung, failed) == (0, [])
    assert encoder.finish()  # the parent's own encoders are untouched
    kept.encode([{"i": 0}])
