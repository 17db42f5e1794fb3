"""Custody of every object (``representation/custody.py``): HEAD, streamed size and SHA-256,
the translation of store errors, the native download into the workspace, the prefetcher and
the workspace.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fault_proxy import reset_after, stall_after
from representation_helpers import assert_examples, broken, first_selected, flip_byte, load
from representation_tasks import Task
from seaweed import config_for
from syvain_training_data import (
    ObjectChangedError,
    ObjectDataError,
    RepresentationIntegrityError,
    ShardDataError,
    StorageRetryExhaustedError,
    _native,
    storage,
)
from syvain_training_data.representation.custody import (
    Claim,
    Prefetcher,
    Workspace,
    custody_errors,
)
from syvain_training_data.storage import StorageConfig, native_storage
from syvain_training_data.testing import storage_policy

pytestmark = pytest.mark.timeout(300)


# --------------------------------------------------------------------------------------------
# Custody: HEAD, streamed size and SHA-256
# --------------------------------------------------------------------------------------------


def _upload(change: Callable[[dict[str, bytes], Task], None]) -> Callable[[Any], Any]:
    return lambda builder: {
        "upload_hook": lambda objects: change(objects, first_selected(builder)[0])
    }


@pytest.mark.parametrize(
    ("hooks", "match"),
    [
        pytest.param(
            _upload(lambda o, t: o.update({t.prepared_uri: flip_byte(o[t.prepared_uri])})),
            "have SHA-256 .* claimed",
            id="tensor-digest",
        ),
        pytest.param(
            _upload(
                lambda o, t: o.update(
                    {t.representation_uri: flip_byte(o[t.representation_uri], 100)}
                )
            ),
            "have SHA-256 .* claimed",
            id="representation-digest",
        ),
        pytest.param(
            _upload(
                lambda o, t: o.update(
                    {
                        u: flip_byte(o[u], 10)
                        for u in [t.prepared_uri.replace("safetensors", "parquet")]
                    }
                )
            ),
            "have SHA-256 .* claimed",
            id="metadata-digest",
        ),
        pytest.param(
            _upload(lambda o, t: o.update({t.prepared_uri: o[t.prepared_uri] + b" "})),
            "bytes but .* claimed",
            id="size",
        ),
        pytest.param(
            _upload(lambda o, t: o.pop(t.representation_uri)), "does not exist", id="missing"
        ),
        pytest.param(
            _upload(
                lambda o, t: o.update({u: flip_byte(o[u]) for u in o if u.endswith("recipe.json")})
            ),
            None,
            id="unread-singleton",
        ),
    ],
)
def test_custody_rules(builder, config, hooks, match):
    if match is None:  # the loader downloads only what it needs: a bad recipe.json is unseen
        published = builder.publish(config, **hooks(builder))
        assert_examples(load(published, config), builder)
        return
    broken(builder, config, match, **hooks(builder))


def test_store_errors_are_translated_only_when_they_are_about_the_data():
    uri = "s3://b/k"
    changed = pytest.raises(RepresentationIntegrityError, match="changed while it was read")
    with changed, custody_errors(uri):
        raise ObjectChangedError("etag")
    size = pytest.raises(RepresentationIntegrityError, match="^s3://b/k: size mismatch")
    with size, custody_errors(uri):
        raise ObjectDataError("size mismatch")
    shard = pytest.raises(RepresentationIntegrityError, match="^Unreadable parquet shard s3://b/k")
    with shard, custody_errors(uri):
        raise ShardDataError.of("parquet", uri, "declared 3 records but yielded 2")
    missing = pytest.raises(RepresentationIntegrityError, match="claims this object")
    with missing, custody_errors(uri):
        raise FileNotFoundError(uri)
    with pytest.raises(FileNotFoundError), custody_errors(uri, missing_is_integrity=False):
        raise FileNotFoundError(uri)
    kept_types = (PermissionError("no"), StorageRetryExhaustedError("later"), OSError("disk"))
    for kept in (*kept_types, RuntimeError("not a data error")):
        with pytest.raises(type(kept)), custody_errors(uri):
            raise kept


# --------------------------------------------------------------------------------------------
# The native download
# --------------------------------------------------------------------------------------------


@pytest.fixture
def blob(config, seaweed, s3_bucket, unique_prefix) -> tuple[str, bytes, str]:
    data = os.urandom(3 * 1024 * 1024 + 17)
    uri = f"s3://{s3_bucket}/{unique_prefix}/blob.bin"
    info = storage.put_object(uri, data, storage_config=config)
    return uri, data, info.etag


def test_download_object_hashes_while_streaming(blob, config, temp_dir):
    uri, data, etag = blob
    path = temp_dir / "out.bin"
    size, digest = _native.download_object(
        native_storage(config), uri, path, size_bytes=len(data), etag=etag
    )
    assert (size, digest) == (len(data), hashlib.sha256(data).hexdigest())
    assert path.read_bytes() == data
    path.unlink()


def test_download_object_local_store(tmp_path, temp_dir):
    source = tmp_path / "object.bin"
    source.write_bytes(b"x" * 5000)
    path = temp_dir / "out.bin"
    size, digest = _native.download_object(
        native_storage(StorageConfig()), f"file://{source}", path, size_bytes=5000
    )
    assert (size, digest) == (5000, hashlib.sha256(b"x" * 5000).hexdigest())
    path.unlink()


@pytest.mark.parametrize("delta", [-1, 1])
def test_failed_download_leaves_no_file(blob, config, temp_dir, delta):
    uri, data, etag = blob
    path = temp_dir / "out.bin"
    with pytest.raises(RuntimeError, match="size"):
        _native.download_object(
            native_storage(config), uri, path, size_bytes=len(data) + delta, etag=etag
        )
    assert not path.exists()


def test_download_of_a_missing_or_changed_object_leaves_no_file(blob, config, temp_dir):
    uri, data, _ = blob
    path = temp_dir / "out.bin"
    with pytest.raises(FileNotFoundError):
        _native.download_object(native_storage(config), uri + ".gone", path, size_bytes=10)
    with pytest.raises(ObjectChangedError):
        _native.download_object(
            native_storage(config), uri, path, size_bytes=len(data), etag='"0123456789"'
        )
    assert not path.exists()


def test_download_never_replaces_a_file(blob, config, temp_dir):
    uri, data, _ = blob
    path = temp_dir / "out.bin"
    path.write_bytes(b"mine")
    with pytest.raises(OSError, match="Cannot create"):
        _native.download_object(native_storage(config), uri, path, size_bytes=len(data))
    assert path.read_bytes() == b"mine"
    path.unlink()


def test_download_resumes_after_a_reset(blob, seaweed, fault_proxy, temp_dir):
    uri, data, etag = blob
    through_proxy = config_for(seaweed, fault_proxy.endpoint)
    fault_proxy.script(reset_after(len(data) // 3, method="GET"))
    path = temp_dir / "out.bin"
    with storage_policy(backoff_base_s=0.01, backoff_cap_s=0.05):
        _, digest = _native.download_object(
            native_storage(through_proxy), uri, path, size_bytes=len(data), etag=etag
        )
    assert digest == hashlib.sha256(data).hexdigest()
    assert fault_proxy.faults_applied == 1
    path.unlink()


def test_a_cancelled_download_stops_and_leaves_no_file(blob, config, temp_dir):
    uri, data, _ = blob
    path = temp_dir / "out.bin"
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(InterruptedError, match="cancelled"):
        _native.download_object(
            native_storage(config), uri, path, size_bytes=len(data), cancel=cancel
        )
    assert not path.exists()


def test_closing_the_prefetcher_stops_a_stalled_download(blob, seaweed, fault_proxy, temp_dir):
    uri, data, _ = blob
    through_proxy = config_for(seaweed, fault_proxy.endpoint)
    fault_proxy.script(stall_after(1000, 600.0, method="GET"))
    claim = Claim(uri, len(data), hashlib.sha256(data).hexdigest())
    with Workspace() as workspace:
        downloads = Prefetcher(workspace, through_proxy)
        downloads.plan([(claim, "blob")])
        deadline = time.monotonic() + 30
        while fault_proxy.faults_applied == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert fault_proxy.faults_applied == 1
        # close() cancels the stalled download instead of waiting for it: it returns within a
        # hang guard far shorter than the stall (no wall-clock bound is the assertion).
        closing = threading.Thread(target=downloads.close, daemon=True)
        closing.start()
        closing.join(60)
        assert not closing.is_alive(), "close() waited for the stalled download"
        assert os.listdir(workspace.path) == []


def test_workspace_names_files_uniquely_from_two_threads():
    # Two threads that both read the counter before either stores it would name one file twice;
    # the counter's addition waits for the other thread to make that interleaving happen.
    meet = threading.Barrier(2)

    class MeetingInt(int):
        def __add__(self, other: int) -> MeetingInt:
            # With the lock the other thread is kept out: the wait breaks, nothing to meet.
            with contextlib.suppress(threading.BrokenBarrierError):
                meet.wait(timeout=1)
            return MeetingInt(int(self) + other)

    with Workspace() as workspace:
        workspace._count = MeetingInt(0)
        names: list[Path] = []
        threads = [
            threading.Thread(target=lambda: names.append(workspace.new_path("s3://b/same")))
            for _ in range(2)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(set(names)) == 2
