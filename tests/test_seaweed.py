"""Tests of tests/seaweed.py: the throwaway SeaweedFS (weed mini) and what the S3 tests rely on
it for (enforced credentials, create-only PUT, ranged GET with If-Match, multipart).

Standard library only (plus tests/seaweed.py); nothing here imports syvain_training_data, so
these run before the package is built.
"""

from __future__ import annotations

import http.client
import os
import random
import re
import stat
import time
from pathlib import Path

import pytest

from seaweed import SeaweedServer, SeaweedStartError, start_seaweed

MIB = 1024 * 1024
pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def small_object(seaweed: SeaweedServer, unique_prefix: str) -> str:
    """The path of a small object just written."""
    path = f"/syvain-test/{unique_prefix}/small.txt"
    assert seaweed.request("PUT", path, body=b"hello infrastructure\n").status == 200
    return path


def test_buckets_exist_and_credentials_work(seaweed: SeaweedServer) -> None:
    listing = seaweed.request("GET", "/")
    assert listing.status == 200
    for bucket in ("syvain-test", "syvain-data"):
        assert f"<Name>{bucket}</Name>".encode() in listing.body
        assert seaweed.request("HEAD", f"/{bucket}").status == 200
    assert seaweed.endpoint.startswith("http://127.0.0.1:")
    assert seaweed.secret_access_key not in repr(seaweed)


def test_credentials_are_enforced(seaweed: SeaweedServer, small_object: str) -> None:
    path = small_object
    wrong_secret = seaweed.request("GET", path, secret_access_key="wrong-secret")
    assert (wrong_secret.status, wrong_secret.s3_error_code) == (403, "SignatureDoesNotMatch")
    assert seaweed.request("GET", "/", secret_access_key="wrong-secret").status == 403
    unknown_key = seaweed.request("GET", path, access_key_id="AKIDUNKNOWN00000")
    assert (unknown_key.status, unknown_key.s3_error_code) == (403, "InvalidAccessKeyId")
    anonymous = http.client.HTTPConnection(seaweed.host, seaweed.port, timeout=10)
    try:
        anonymous.request("GET", path)
        assert anonymous.getresponse().status == 403
    finally:
        anonymous.close()
    assert seaweed.request("PUT", path, body=b"x", secret_access_key="nope").status == 403
    assert seaweed.request("GET", path).body == b"hello infrastructure\n"


def test_create_only_put_with_if_none_match(seaweed: SeaweedServer, unique_prefix: str) -> None:
    path = f"/syvain-test/{unique_prefix}/create-only.json"
    first = seaweed.request("PUT", path, body=b"first", headers={"If-None-Match": "*"})
    assert first.status == 200
    second = seaweed.request("PUT", path, body=b"second", headers={"If-None-Match": "*"})
    assert (second.status, second.s3_error_code) == (412, "PreconditionFailed")
    assert seaweed.request("GET", path).body == b"first"


def test_ranged_get_with_if_match(seaweed: SeaweedServer, unique_prefix: str) -> None:
    path = f"/syvain-test/{unique_prefix}/ranged.bin"
    data = random.Random(1).randbytes(100_000)
    etag = seaweed.request("PUT", path, body=data).header("etag")
    assert etag and etag.startswith('"')
    ranged = seaweed.request("GET", path, headers={"Range": "bytes=1000-", "If-Match": etag})
    assert ranged.status == 206
    assert ranged.header("content-range") == f"bytes 1000-99999/{len(data)}"
    assert ranged.body == data[1000:]
    mismatch = seaweed.request("GET", path, headers={"Range": "bytes=1000-", "If-Match": '"0"'})
    assert (mismatch.status, mismatch.s3_error_code) == (412, "PreconditionFailed")
    seaweed.request("PUT", path, body=data[::-1])
    changed = seaweed.request("GET", path, headers={"Range": "bytes=0-", "If-Match": etag})
    assert changed.status == 412


def test_multipart_complete_honours_if_none_match(
    seaweed: SeaweedServer, unique_prefix: str
) -> None:
    path = f"/syvain-test/{unique_prefix}/multipart.bin"

    def upload() -> tuple[int, str]:
        created = seaweed.request("POST", path, query={"uploads": ""})
        match = re.search(rb"<UploadId>(.*?)</UploadId>", created.body)
        assert created.status == 200 and match
        upload_id = match.group(1).decode()
        etags = []
        for number, part in ((1, b"a" * (5 * MIB)), (2, b"b" * 10)):
            put = seaweed.request(
                "PUT", path, body=part, query={"partNumber": str(number), "uploadId": upload_id}
            )
            assert put.status == 200
            etags.append(put.header("etag"))
        body = "".join(
            f"<Part><PartNumber>{n}</PartNumber><ETag>{e}</ETag></Part>"
            for n, e in enumerate(etags, 1)
        )
        done = seaweed.request(
            "POST",
            path,
            body=f"<CompleteMultipartUpload>{body}</CompleteMultipartUpload>".encode(),
            headers={"If-None-Match": "*"},
            query={"uploadId": upload_id},
        )
        if done.status != 200:
            seaweed.request("DELETE", path, query={"uploadId": upload_id})
        return done.status, done.s3_error_code or ""

    assert upload() == (200, "")
    assert upload() == (412, "PreconditionFailed")
    assert seaweed.request("HEAD", path).header("content-length") == str(5 * MIB + 10)


def test_start_failure_reports_the_log_tail(tmp_path: Path) -> None:
    fake = tmp_path / "weed"
    fake.write_text("#!/bin/sh\necho 'fatal: the fake weed broke on purpose' >&2\nexit 3\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    expected = "(?s)exited with code 3.*broke on purpose"
    with pytest.raises(SeaweedStartError, match=expected), start_seaweed(weed_binary=str(fake)):
        pass


@pytest.mark.timeout(120)  # a hang guard only: the fake would run for an hour
def test_start_timeout_is_bounded_and_kills_the_process(tmp_path: Path) -> None:
    fake = tmp_path / "weed"
    pid_file = tmp_path / "pid"
    fake.write_text(f"#!/bin/sh\necho $$ > {pid_file}\necho 'still thinking'\nexec sleep 3600\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    with (
        pytest.raises(SeaweedStartError, match="(?s)not ready after.*still thinking"),
        start_seaweed(weed_binary=str(fake), startup_timeout=1.0),
    ):
        pass
    # Bounded: start_seaweed gave up on its own (the fake never gets ready) and the process is
    # gone (killed and reaped), not left sleeping for its hour.
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid_file.read_text()), 0)


@pytest.mark.timeout(60)
def test_a_second_server_starts_fast_and_cleans_up() -> None:
    started = time.monotonic()
    with start_seaweed(("other-bucket",)) as server:
        startup = time.monotonic() - started
        assert server.request("HEAD", "/other-bucket").status == 200
        assert server.pid is not None and server.data_dir is not None
        pid, root = server.pid, server.data_dir.parent
        assert root.is_dir()
    print(f"weed mini startup {startup:.2f} s, stop {time.monotonic() - started - startup:.2f} s")
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert not root.exists()
    assert startup < 30
