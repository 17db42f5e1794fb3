"""Native storage against real stores: SeaweedFS over HTTP (through our fault proxy where a
test needs faults) and the local directory store."""

from __future__ import annotations

import hashlib
import logging
import multiprocessing
import os
import random
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator

import pytest

import fault_proxy as proxy_faults
from memory import CHILD_PRELUDE
from seaweed import config_for
from syvain_training_data import (
    ObjectChangedError,
    StorageRetryExhaustedError,
    SyvainTrainingData,
    storage,
)
from syvain_training_data.storage import StorageConfig
from syvain_training_data.testing import storage_policy

MIB = 1024 * 1024
BIG_SIZE = 64 * MIB

# Small backoff so that fault tests take seconds, not minutes; the attempt budget stays SPEC's.
FAST_BACKOFF = {"backoff_base_s": 0.01, "backoff_cap_s": 0.05}
# A wait for something that must happen: only a guard against a hang, never the assertion.
HANG_GUARD_S = 60.0
# Chunks reach the consumer in pieces of at most this much (core's stream COALESCE_BYTES).
HANDOVER_BYTES = MIB


def wait_until(condition, what: str) -> None:
    """Returns once ``condition()`` holds; fails (naming ``what``) only after HANG_GUARD_S."""
    deadline = time.monotonic() + HANG_GUARD_S
    while not condition():
        assert time.monotonic() < deadline, f"hang guard: {what} never happened"
        time.sleep(0.001)


def sha256_of_stream(stream: storage.ObjectStream) -> tuple[str, int]:
    digest = hashlib.sha256()
    total = 0
    for chunk in stream:
        digest.update(chunk)
        total += len(chunk)
    return digest.hexdigest(), total


@pytest.fixture(scope="module")
def big_object(seaweed, s3_bucket) -> Iterator[tuple[str, str, storage.ObjectInfo]]:
    """A 64 MiB object of seeded random bytes on SeaweedFS: (uri, sha256, info)."""
    data = random.Random(64).randbytes(BIG_SIZE)
    uri = f"s3://{s3_bucket}/storage-tests/big-{os.getpid()}.bin"
    info = storage.put_object(uri, data, storage_config=config_for(seaweed))
    yield uri, hashlib.sha256(data).hexdigest(), info
    storage.delete_object(uri, storage_config=config_for(seaweed))


# --- point operations, both stores ---------------------------------------------------------


def test_put_get_head_list_delete(store_root):
    root, config = store_root
    uri = f"{root}/dir/a%2Fb c é.bin"
    info = storage.put_object(
        uri, b"hello", storage_config=config, content_type="application/octet-stream"
    )
    assert info.size == 5
    assert storage.get_object(uri, storage_config=config) == b"hello"
    head = storage.head_object(uri, storage_config=config)
    assert head.size == 5
    assert head.etag == info.etag
    storage.put_object(f"{root}/dir/sub/x", b"x", storage_config=config)
    storage.put_object(f"{root}/dirx", b"y", storage_config=config)
    listed = [o.uri for o in storage.list_objects(f"{root}/dir", storage_config=config)]
    assert listed == sorted([uri, f"{root}/dir/sub/x"])
    storage.delete_object(uri, storage_config=config)
    with pytest.raises(FileNotFoundError):
        storage.head_object(uri, storage_config=config)
    storage.delete_object(uri, storage_config=config)  # already gone: fine


def test_create_only_conflict_is_file_exists(store_root):
    root, config = store_root
    uri = f"{root}/once.json"
    storage.put_object(uri, b"{}", storage_config=config, create_only=True)
    with pytest.raises(FileExistsError, match="once.json"):
        storage.put_object(uri, b"{}", storage_config=config, create_only=True)
    assert storage.get_object(uri, storage_config=config) == b"{}"


def test_missing_object_is_file_not_found_at_once(store_root, fault_proxy, seaweed, caplog):
    """Not found is final: one request per call (counted by the proxy in front of the S3
    server), no retry, whatever the backoff."""
    root, config = store_root
    if root.startswith("s3://"):
        config = config_for(seaweed, endpoint=fault_proxy.endpoint)
    uri = f"{root}/missing.bin"
    with caplog.at_level(logging.WARNING, logger="syvain_training_data.storage"):
        with pytest.raises(FileNotFoundError, match="missing.bin"):
            storage.get_object(uri, storage_config=config)
        with pytest.raises(FileNotFoundError, match="missing.bin"):
            storage.head_object(uri, storage_config=config)
        with pytest.raises(FileNotFoundError, match="missing.bin"):
            list(storage.open_stream(uri, size_bytes=10, storage_config=config))
    assert [r.getMessage() for r in caplog.records if "attempt" in r.getMessage()] == []
    if root.startswith("s3://"):
        assert [(r.method, r.target.split("?")[0]) for r in fault_proxy.history] == [
            (method, "/" + uri.removeprefix("s3://")) for method in ("GET", "HEAD", "GET")
        ]


def test_stream_round_trip_and_bounded_readahead(store_root):
    root, config = store_root
    data = random.Random(7).randbytes(24 * MIB + 17)
    uri = f"{root}/stream.bin"
    info = storage.put_object(uri, data, storage_config=config)
    with storage.open_stream(uri, size_bytes=info.size, storage_config=config) as stream:
        first = stream.read(1000)
        # The background task runs as far ahead as it may (within one hand-over of the bound),
        # and no further.
        limit = storage._native.READAHEAD_BYTES
        wait_until(
            lambda: stream.buffered_bytes >= limit - HANDOVER_BYTES, "the readahead filling up"
        )
        assert stream.buffered_bytes <= limit
        rest = stream.read()
        assert stream.position == len(data)
        assert stream.resumes == 0
    assert first + rest == data
    # A stream may start at an offset (resumption by a caller).
    tail = storage.open_stream(
        uri, size_bytes=info.size, start=len(data) - 10, storage_config=config
    )
    assert tail.read() == data[-10:]


def test_size_mismatch_fails_closed(store_root):
    root, config = store_root
    uri = f"{root}/sized.bin"
    storage.put_object(uri, b"0123456789", storage_config=config)
    for declared in (9, 11):
        with pytest.raises(RuntimeError, match=r"sized.bin.*size mismatch.*10 bytes"):
            list(storage.open_stream(uri, size_bytes=declared, storage_config=config))


def test_changed_object_by_etag_fails_closed(seaweed, s3_bucket, unique_prefix):
    # S3 only: a file:// etag is not enforced (SPEC section 4; test_storage_hardening.py).
    config = config_for(seaweed)
    uri = f"s3://{s3_bucket}/{unique_prefix}/mutable.bin"
    old = storage.put_object(uri, b"a" * 100, storage_config=config)
    storage.put_object(uri, b"b" * 100, storage_config=config)
    with pytest.raises(ObjectChangedError, match="mutable.bin"):
        list(storage.open_stream(uri, size_bytes=100, etag=old.etag, storage_config=config))


def test_bad_uris_fail_at_once():
    for uri in ["ftp://x/y", "s3://", "s3://bucket", "s3://b/a//c", "file://relative", "/tmp/x"]:
        with pytest.raises(ValueError, match="Invalid object URI"):
            storage.get_object(uri)
    with pytest.raises(ValueError, match="pass allow_http=True"):  # plain http: only opted in
        storage.get_object("http://x/y")


def test_bad_endpoint_fails_at_once():
    with pytest.raises(ValueError, match="s3_base_url"):
        SyvainTrainingData(s3_base_url="ftp://example", access_key_id="a", secret_access_key="b")
    with pytest.raises(ValueError, match="s3_base_url"):
        SyvainTrainingData(s3_base_url="not a url", access_key_id="a", secret_access_key="b")


def test_s3_without_credentials_fails_at_once():
    with pytest.raises(ValueError, match="no credentials"):
        storage.get_object(
            "s3://b/k", storage_config=StorageConfig(s3_base_url="http://127.0.0.1:1")
        )


# --- credentials -----------------------------------------------------------------------------


def test_wrong_secret_is_permission_error_quickly(seaweed, fault_proxy, big_object, caplog):
    uri, _, info = big_object
    secret = "wrong-secret-value-123"
    config = config_for(seaweed, secret=secret, endpoint=fault_proxy.endpoint)
    with caplog.at_level(logging.DEBUG), pytest.raises(PermissionError) as raised:
        storage.get_object(uri, storage_config=config)
    with pytest.raises(PermissionError):
        list(storage.open_stream(uri, size_bytes=info.size, storage_config=config))
    # Quickly: a refusal is final, one request per call (counted by the proxy), no retry.
    assert [r.method for r in fault_proxy.history] == ["GET", "GET"]
    assert not [r for r in caplog.records if "attempt" in r.getMessage()]
    assert secret not in str(raised.value)
    assert secret not in caplog.text


def test_secret_never_in_repr():
    secret = "s3cr3t-do-not-print"
    client = SyvainTrainingData(
        s3_base_url="http://127.0.0.1:9", access_key_id="AKID", secret_access_key=secret
    )
    for text in (
        repr(client),
        str(client),
        repr(client.storage_config),
        str(client.storage_config),
    ):
        assert secret not in text
    assert secret not in repr(storage.native_storage(client.storage_config))


# --- faults through the proxy ----------------------------------------------------------------

FAULTS = {
    "reset after body bytes": [
        proxy_faults.reset_after(5 * MIB),
        proxy_faults.reset_after(20 * MIB),
    ],
    "stall past the read timeout": [proxy_faults.stall_after(2 * MIB, 4.0)],
    "500 then 503 SlowDown": [
        proxy_faults.status(500, "Internal Server Error", "InternalError"),
        proxy_faults.status(503, "Slow Down", "SlowDown"),
        proxy_faults.status(503, "Slow Down", "SlowDown"),
    ],
    "close before headers": [
        proxy_faults.close_before_headers(),
        proxy_faults.close_before_headers(),
    ],
    "fewer bytes than Content-Length": [
        proxy_faults.short_body(3 * MIB),
        proxy_faults.short_body(30 * MIB),
    ],
}


@pytest.mark.parametrize("faults", list(FAULTS.values()), ids=list(FAULTS))
def test_stream_survives_fault(
    seaweed, fault_proxy: proxy_faults.FaultProxy, big_object, faults, caplog
):
    uri, expected_sha, info = big_object
    config = config_for(seaweed, endpoint=fault_proxy.endpoint)
    fault_proxy.script(*faults)
    with (
        storage_policy(**FAST_BACKOFF, read_inactivity_timeout_s=1.0),
        caplog.at_level(logging.WARNING, logger="syvain_training_data.storage"),
    ):
        stream = storage.open_stream(
            uri, size_bytes=info.size, etag=info.etag, storage_config=config
        )
        digest, total = sha256_of_stream(stream)
    assert (digest, total) == (expected_sha, BIG_SIZE)
    assert stream.resumes == len(faults)
    print(f"resumes={stream.resumes} faults_applied={fault_proxy.faults_applied}")
    retries = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(retries) == len(faults)
    assert all(uri in r.getMessage() and "attempt" in r.getMessage() for r in retries)
    assert seaweed.secret_access_key not in caplog.text


@pytest.mark.parametrize(
    ("fault", "operations"),
    [
        (proxy_faults.status(503, "Slow Down", "SlowDown"), {"HEAD", "PUT", "GET"}),
        (proxy_faults.close_before_headers(), {"HEAD", "PUT", "GET"}),
        # Only a GET answer has a body to cut: 3 of its 7 bytes arrive, then a reset.
        (proxy_faults.reset_after(3), {"GET"}),
    ],
    ids=["503", "close", "reset"],
)
def test_point_operations_retry(
    seaweed, fault_proxy, big_object, fault, operations, caplog, s3_bucket, unique_prefix
):
    uri, _, info = big_object
    config = config_for(seaweed, endpoint=fault_proxy.endpoint)
    small = f"s3://{s3_bucket}/{unique_prefix}/small.json"

    def arm(operation: str) -> None:
        if operation in operations:
            fault_proxy.script(fault)

    with storage_policy(**FAST_BACKOFF), caplog.at_level(logging.WARNING):
        arm("HEAD")
        assert storage.head_object(uri, storage_config=config).size == info.size
        arm("PUT")
        storage.put_object(
            small, b'{"a":1}', storage_config=config, content_type="application/json"
        )
        arm("GET")
        assert storage.get_object(small, storage_config=config) == b'{"a":1}'
    retried = [r.getMessage().split()[1] for r in caplog.records if "Retrying" in r.getMessage()]
    assert sorted(retried) == sorted(operations)
    assert fault_proxy.faults_applied == len(operations)


def test_object_overwritten_between_ranges_fails_closed(
    seaweed, fault_proxy, s3_bucket, unique_prefix
):
    uri = f"s3://{s3_bucket}/{unique_prefix}/overwritten.bin"
    direct = config_for(seaweed)
    data = random.Random(3).randbytes(16 * MIB)
    info = storage.put_object(uri, data, storage_config=direct)
    # The stream resumes only after 5 quiet seconds, so the overwrite below has long finished
    # by then even on a loaded machine: a resume before it would read the old bytes to the end.
    fault_proxy.script(proxy_faults.stall_after(1 * MIB, 10.0))
    with storage_policy(**FAST_BACKOFF, read_inactivity_timeout_s=5.0):
        stream = storage.open_stream(
            uri, size_bytes=info.size, storage_config=config_for(seaweed, fault_proxy.endpoint)
        )
        received = bytearray(stream.read_chunk() or b"")
        storage.put_object(uri, random.Random(4).randbytes(16 * MIB), storage_config=direct)
        with pytest.raises(ObjectChangedError, match="overwritten.bin"):
            for chunk in stream:
                received += chunk
    assert data.startswith(bytes(received))
    assert len(received) < len(data)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_unreachable_endpoint_exhausts_the_budget(seaweed):
    config = config_for(seaweed, endpoint=f"http://127.0.0.1:{free_port()}")
    uri = "s3://nowhere/key.bin"
    with storage_policy(max_attempts=4, window_s=30, **FAST_BACKOFF):
        with pytest.raises(StorageRetryExhaustedError) as raised:
            list(storage.open_stream(uri, size_bytes=1234, storage_config=config))
        message = str(raised.value)
        assert uri in message and "offset 0 of 1234 bytes" in message and "4 attempts" in message
        assert isinstance(raised.value, RuntimeError)
        with pytest.raises(StorageRetryExhaustedError, match="HEAD s3://nowhere/key.bin"):
            storage.head_object(uri, storage_config=config)


def test_spec_policy_is_the_default():
    from syvain_training_data import _native
    from syvain_training_data.testing import SPEC_POLICY

    assert _native.get_storage_policy() == SPEC_POLICY
    with storage_policy(max_attempts=2):
        assert _native.get_storage_policy()["max_attempts"] == 2
    assert _native.get_storage_policy() == SPEC_POLICY
    with pytest.raises(TypeError), storage_policy(bogus=1):
        pass


# --- Ctrl-C ----------------------------------------------------------------------------------


def test_ctrl_c_interrupts_a_blocked_read(seaweed, fault_proxy, big_object):
    """SIGINT reaches a read blocked on a stalled stream: the child reports the interrupt with
    none of the object read. The stall outlasts the hang guard, so a read that did not see the
    interrupt could neither finish nor report it (no wall-clock bound is asserted)."""
    uri, _, info = big_object
    fault_proxy.script(proxy_faults.stall_after(0, 10 * HANG_GUARD_S))
    # A shell that starts a job in the background (as CI runners may) hands it SIGINT ignored,
    # and Python then leaves it ignored; the child restores Ctrl-C as a terminal would have it.
    # The credentials go through the environment so that no failure output shows them.
    script = CHILD_PRELUDE + textwrap.dedent(
        f"""
        import signal, sys
        from syvain_training_data import storage
        signal.signal(signal.SIGINT, signal.default_int_handler)
        config = s3_config({fault_proxy.endpoint!r}, {seaweed.region!r})
        stream = storage.open_stream({uri!r}, size_bytes={info.size}, storage_config=config)
        try:
            print("reading", flush=True)
            stream.read()
        except KeyboardInterrupt:
            print("interrupted at", stream.position, flush=True)
            sys.exit(7)
        """
    )
    env = dict(os.environ, **seaweed.env())
    child = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "reading"
    # Blocked: the proxy holds the response, and the child's main thread sleeps (in the read,
    # the only call left after its line; Linux shows the thread's state).
    wait_until(lambda: fault_proxy.faults_applied == 1, "the stalled response")
    wait_until(lambda: _sleeping(child.pid), "the child blocking in its read")
    child.send_signal(signal.SIGINT)
    try:
        out, err = child.communicate(timeout=HANG_GUARD_S)
    finally:
        child.kill()
    assert child.returncode == 7, err
    assert out.splitlines()[-1] == "interrupted at 0"


def _sleeping(pid: int) -> bool:
    """Whether process ``pid``'s main thread sleeps (always True where /proc is missing)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "S"
    except FileNotFoundError:
        return True


# --- fork and spawn --------------------------------------------------------------------------


def _read_sha(args: tuple[str, int, str, StorageConfig]) -> str:
    uri, size, etag, config = args
    digest, _ = sha256_of_stream(
        storage.open_stream(uri, size_bytes=size, etag=etag, storage_config=config)
    )
    return digest


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_client_works_across_fork_and_spawn(seaweed, big_object, method, monkeypatch):
    uri, expected_sha, info = big_object
    config = config_for(seaweed)
    # No AWS_* variables: the pool's pickler (multiprocessing's own) carries the secret.
    for name in [name for name in os.environ if name.startswith("AWS_")]:
        monkeypatch.delenv(name)
    args = (uri, info.size, info.etag, config)
    assert _read_sha(args) == expected_sha  # the parent uses the client (runtime and pool) first
    context = multiprocessing.get_context(method)
    with context.Pool(2) as pool:
        assert pool.map(_read_sha, [args, args]) == [expected_sha, expected_sha]
    assert _read_sha(args) == expected_sha  # and keeps working after the fork
    assert storage.head_object(uri, storage_config=config).size == info.size
