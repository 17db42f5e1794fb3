"""Tests of the test infrastructure itself: weed mini, the SigV4 helper and the fault proxy.

Standard library only (plus tests/seaweed.py and tests/fault_proxy.py); nothing here imports
syvain_training_data, so these run before the package is built.
"""

from __future__ import annotations

import hashlib
import http.client
import http.server
import os
import random
import re
import socket
import stat
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from fault_proxy import (
    FaultProxy,
    close_before_headers,
    reset_after,
    short_body,
    stall_after,
    status,
)
from seaweed import (
    SeaweedServer,
    SeaweedStartError,
    canonical_target,
    sign_headers,
    start_seaweed,
)

MIB = 1024 * 1024
pytestmark = pytest.mark.timeout(120)


# --- a raw HTTP client that reports exactly how a response ended -----------------------------


@dataclass
class RawResponse:
    status: int
    headers: dict[str, str]
    body: bytes
    outcome: str  # "complete" | "eof" | "reset" | "timeout"
    events: list[tuple[str, float]] = field(default_factory=list)

    @property
    def content_length(self) -> int | None:
        value = self.headers.get("content-length")
        return None if value is None else int(value)


class RawConnection:
    """One TCP connection; requests are signed for ``server`` and sent verbatim."""

    def __init__(self, server: SeaweedServer, port: int, timeout: float = 10.0) -> None:
        self.server = server
        self.port = port
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.buf = b""

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send(
        self,
        method: str,
        path: str,
        *,
        body: bytes = b"",
        headers: dict[str, str] | None = None,
        send_body: bool = True,
    ) -> None:
        headers = dict(headers or {})
        if body or method in ("PUT", "POST"):
            headers["Content-Length"] = str(len(body))
        signed = sign_headers(
            method,
            f"127.0.0.1:{self.port}",
            path,
            access_key_id=self.server.access_key_id,
            secret_access_key=self.server.secret_access_key,
            region=self.server.region,
            headers=headers,
            body=body,
        )
        head = f"{method} {canonical_target(path)} HTTP/1.1\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in signed.items()) + "\r\n"
        self.sock.sendall(head.encode() + (body if send_body else b""))

    def _recv(self) -> bytes:
        data = self.sock.recv(256 * 1024)
        if not data:
            raise EOFError
        return data

    def read_head(self) -> tuple[int, dict[str, str]]:
        while b"\r\n\r\n" not in self.buf:
            self.buf += self._recv()
        raw, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = raw.decode("latin-1").split("\r\n")
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        return int(lines[0].split(" ")[1]), headers

    def read_response(
        self, method: str = "GET", timeouts: tuple[float, ...] = (10.0,)
    ) -> RawResponse:
        """Reads a head and its Content-Length body. Each entry of ``timeouts`` is one read
        phase: a phase ending in a socket timeout is recorded and the next phase continues."""
        started = time.monotonic()
        self.sock.settimeout(timeouts[0])
        code, headers = self.read_head()
        expected = 0 if method == "HEAD" else int(headers.get("content-length", "0"))
        body = bytearray(self.buf)
        self.buf = b""
        events: list[tuple[str, float]] = []
        outcome = "complete"
        phases = list(timeouts)
        while len(body) < expected:
            self.sock.settimeout(phases[0])
            try:
                body += self._recv()
            except TimeoutError:
                events.append(("timeout", time.monotonic() - started))
                outcome = "timeout"
                if len(phases) == 1:
                    break
                phases.pop(0)
            except EOFError:
                events.append(("eof", time.monotonic() - started))
                outcome = "eof"
                break
            except ConnectionResetError:
                events.append(("reset", time.monotonic() - started))
                outcome = "reset"
                break
        if len(body) >= expected:
            outcome = "complete"
        return RawResponse(code, headers, bytes(body), outcome, events)

    def request(self, method: str, path: str, **kwargs: object) -> RawResponse:
        timeouts = kwargs.pop("timeouts", (10.0,))
        self.send(method, path, **kwargs)  # type: ignore[arg-type]
        return self.read_response(method, timeouts)  # type: ignore[arg-type]

    def wait_closed(self, timeout: float = 5.0) -> str:
        """ "eof" or "reset" once the peer closed; "open" if it did not within ``timeout``."""
        self.sock.settimeout(timeout)
        try:
            while self.sock.recv(65536):
                pass
        except ConnectionResetError:
            return "reset"
        except TimeoutError:
            return "open"
        return "eof"


# --- fixtures --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def objects(seaweed: SeaweedServer) -> Iterator[dict[str, bytes]]:
    """A few objects of seeded random bytes, keyed by path."""
    prefix = f"/syvain-test/infrastructure-{os.getpid()}"
    made = {
        f"{prefix}/4mib.bin": random.Random(4).randbytes(4 * MIB),
        f"{prefix}/small.txt": b"hello infrastructure\n",
    }
    for path, data in made.items():
        assert seaweed.request("PUT", path, body=data).status == 200
    yield made
    for path in made:
        seaweed.request("DELETE", path)


def object_path(objects: dict[str, bytes], suffix: str) -> str:
    return next(p for p in objects if p.endswith(suffix))


# --- SeaweedFS itself ------------------------------------------------------------------------


def test_buckets_exist_and_credentials_work(seaweed: SeaweedServer) -> None:
    listing = seaweed.request("GET", "/")
    assert listing.status == 200
    for bucket in ("syvain-test", "syvain-data"):
        assert f"<Name>{bucket}</Name>".encode() in listing.body
        assert seaweed.request("HEAD", f"/{bucket}").status == 200
    assert seaweed.endpoint.startswith("http://127.0.0.1:")
    assert seaweed.secret_access_key not in repr(seaweed)


def test_credentials_are_enforced(seaweed: SeaweedServer, objects: dict[str, bytes]) -> None:
    path = object_path(objects, "small.txt")
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
    assert seaweed.request("GET", path).body == objects[path]


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


# --- the proxy: pass-through -----------------------------------------------------------------


@pytest.mark.timeout(180)
def test_64_mib_round_trip_is_byte_identical(
    seaweed: SeaweedServer, fault_proxy: FaultProxy, unique_prefix: str
) -> None:
    path = f"/syvain-test/{unique_prefix}/big.bin"
    data = random.Random(64).randbytes(64 * MIB)
    put = seaweed.request("PUT", path, body=data, endpoint=fault_proxy.endpoint)
    assert put.status == 200
    got = seaweed.request("GET", path, endpoint=fault_proxy.endpoint)
    assert got.status == 200
    assert got.header("content-length") == str(len(data))
    assert hashlib.sha256(got.body).digest() == hashlib.sha256(data).digest()
    assert got.body == data
    tail = seaweed.request(
        "GET",
        path,
        endpoint=fault_proxy.endpoint,
        headers={"Range": f"bytes={40 * MIB}-", "If-Match": put.header("etag") or ""},
    )
    assert tail.status == 206 and tail.body == data[40 * MIB :]
    assert seaweed.request("GET", path).body == data  # direct agrees with proxied
    assert (fault_proxy.requests_seen, fault_proxy.faults_applied) == (3, 0)
    seaweed.request("DELETE", path)


def test_keep_alive_many_requests_one_connection(
    seaweed: SeaweedServer, fault_proxy: FaultProxy, objects: dict[str, bytes], unique_prefix: str
) -> None:
    small = object_path(objects, "small.txt")
    big = object_path(objects, "4mib.bin")
    with RawConnection(seaweed, fault_proxy.port) as conn:
        assert conn.request("HEAD", small).status == 200
        assert conn.request("GET", small).body == objects[small]
        assert conn.request("GET", big).body == objects[big]
        ranged = conn.request("GET", big, headers={"Range": "bytes=10-19"})
        assert (ranged.status, ranged.body) == (206, objects[big][10:20])
        path = f"/syvain-test/{unique_prefix}/kept.txt"
        assert conn.request("PUT", path, body=b"kept alive").status == 200
        assert conn.request("GET", f"/syvain-test/{unique_prefix}/missing").status == 404
        assert conn.request("GET", path).body == b"kept alive"
        assert conn.request("DELETE", path).status == 204
    assert fault_proxy.connections_accepted == 1
    assert fault_proxy.requests_seen == 8


def test_http_client_keep_alive_through_proxy(
    seaweed: SeaweedServer, fault_proxy: FaultProxy, objects: dict[str, bytes]
) -> None:
    path = object_path(objects, "small.txt")
    conn = http.client.HTTPConnection("127.0.0.1", fault_proxy.port, timeout=10)
    try:
        for _ in range(5):
            headers = sign_headers(
                "GET",
                f"127.0.0.1:{fault_proxy.port}",
                path,
                access_key_id=seaweed.access_key_id,
                secret_access_key=seaweed.secret_access_key,
            )
            conn.request("GET", canonical_target(path), headers=headers)
            response = conn.getresponse()
            assert (response.status, response.read()) == (200, objects[path])
    finally:
        conn.close()
    assert fault_proxy.connections_accepted == 1


def test_wrong_secret_through_proxy_is_403(
    seaweed: SeaweedServer, fault_proxy: FaultProxy, objects: dict[str, bytes]
) -> None:
    path = object_path(objects, "small.txt")
    response = seaweed.request("GET", path, endpoint=fault_proxy.endpoint, secret_access_key="x")
    assert response.status == 403
    assert seaweed.request("GET", path, endpoint=fault_proxy.endpoint).status == 200


def test_expect_100_continue_passes_through(
    seaweed: SeaweedServer, fault_proxy: FaultProxy, unique_prefix: str
) -> None:
    path = f"/syvain-test/{unique_prefix}/expect.bin"
    body = random.Random(5).randbytes(300_000)
    with RawConnection(seaweed, fault_proxy.port) as conn:
        conn.send("PUT", path, body=body, headers={"Expect": "100-continue"}, send_body=False)
        assert conn.read_head()[0] == 100
        conn.sock.sendall(body)
        assert conn.read_response().status == 200
        # A status fault answers 100 itself, swallows the body and keeps the connection.
        fault_proxy.script(status(503, "Slow Down", "SlowDown"))
        conn.send("PUT", path, body=b"never", headers={"Expect": "100-continue"}, send_body=False)
        assert conn.read_head()[0] == 100
        conn.sock.sendall(b"never")
        assert conn.read_response().status == 503
        assert conn.request("GET", path).body == body
    assert fault_proxy.connections_accepted == 1


# --- the proxy: faults -----------------------------------------------------------------------


@pytest.mark.parametrize("n", [0, 1, 100_000, 3 * MIB])
def test_reset_after_n_body_bytes(
    seaweed: SeaweedServer, fault_proxy: FaultProxy, objects: dict[str, bytes], n: int
) -> None:
    path = object_path(objects, "4mib.bin")
    fault_proxy.script(reset_after(n))
    with RawConnection(seaweed, fault_proxy.port) as conn:
        response = conn.request("GET", path)
    assert response.status == 200
    assert response.content_length == len(objects[path])
    assert response.outcome == "reset"
    assert response.body == objects[path][:n]
    # The client reconnects and the next request passes through.
    assert seaweed.request("GET", path, endpoint=fault_proxy.endpoint).body == objects[path]
    assert (fault_proxy.faults_applied, fault_proxy.connections_accepted) == (1, 2)


def test_reset_seen_by_http_client(
    seaweed: SeaweedServer, fault_proxy: FaultProxy, objects: dict[str, bytes]
) -> None:
    path = object_path(objects, "4mib.bin")
    fault_proxy.script(reset_after(1 * MIB))
    with pytest.raises(ConnectionResetError):
        seaweed.request("GET", path, endpoint=fault_proxy.endpoint)


@pytest.mark.timeout(30)
def test_stall_after_keeps_the_socket_open_then_closes(
    seaweed: SeaweedServer, fault_proxy: FaultProxy, objects: dict[str, bytes]
) -> None:
    path = object_path(objects, "4mib.bin")
    fault_proxy.script(stall_after(200_000, 2.0))
    with RawConnection(seaweed, fault_proxy.port) as conn:
        conn.send("GET", path)
        started = time.monotonic()
        response = conn.read_response(timeouts=(0.5, 10.0))
    assert response.status == 200
    assert response.body == objects[path][:200_000]
    kinds = [kind for kind, _ in response.events]
    # Kept open (a read timed out with the socket still open), then closed by the proxy (not
    # by our reader's 10 s limit); a stall cannot end early, so its lower bound holds on any
    # machine (no upper bound: a loaded machine may be late).
    assert kinds == ["timeout", "eof"], response.events
    assert time.monotonic() - started >= 1.5
    assert seaweed.request("GET", path, endpoint=fault_proxy.endpoint).body == objects[path]


def test_status_fault_answers_without_upstream(
    seaweed: SeaweedServer, fault_proxy: FaultProxy, objects: dict[str, bytes], unique_prefix: str
) -> None:
    small = object_path(objects, "small.txt")
    path = f"/syvain-test/{unique_prefix}/never-written.txt"
    fault_proxy.script(
        status(503, "Slow Down", "SlowDown"),
        status(500, "Internal Server Error", "InternalError"),
        status(503),
    )
    with RawConnection(seaweed, fault_proxy.port) as conn:
        slow = conn.request("GET", small)
        assert (slow.status, slow.headers["content-type"]) == (503, "application/xml")
        assert b"<Code>SlowDown</Code>" in slow.body
        assert slow.headers.get("x-amz-request-id")
        put = conn.request("PUT", path, body=b"must not arrive")
        assert put.status == 500 and b"<Code>InternalError</Code>" in put.body
        head = conn.request("HEAD", small)
        assert head.status == 503 and head.body == b""
        assert conn.request("GET", small).body == objects[small]  # same connection, passes
    assert seaweed.request("HEAD", path).status == 404  # upstream never saw the PUT
    assert (fault_proxy.connections_accepted, fault_proxy.faults_applied) == (1, 3)


def test_close_before_headers(
    seaweed: SeaweedServer, fault_proxy: FaultProxy, objects: dict[str, bytes], unique_prefix: str
) -> None:
    path = f"/syvain-test/{unique_prefix}/closed.txt"
    fault_proxy.script(close_before_headers(), close_before_headers())
    with RawConnection(seaweed, fault_proxy.port) as conn:
        conn.send("PUT", path, body=b"x" * 100_000)
        assert conn.wait_closed() == "eof"
        assert conn.buf == b""
    with pytest.raises(http.client.RemoteDisconnected):
        seaweed.request("GET", object_path(objects, "small.txt"), endpoint=fault_proxy.endpoint)
    assert seaweed.request("HEAD", path).status == 404
    assert seaweed.request("PUT", path, body=b"ok", endpoint=fault_proxy.endpoint).status == 200


@pytest.mark.parametrize("n", [0, 123_456])
def test_short_body_ends_cleanly_early(
    seaweed: SeaweedServer, fault_proxy: FaultProxy, objects: dict[str, bytes], n: int
) -> None:
    path = object_path(objects, "4mib.bin")
    fault_proxy.script(short_body(n))
    with RawConnection(seaweed, fault_proxy.port) as conn:
        response = conn.request("GET", path)
    assert response.content_length == len(objects[path])
    assert response.outcome == "eof"
    assert response.body == objects[path][:n]
    with pytest.raises(http.client.IncompleteRead):
        fault_proxy.script(short_body(n))
        seaweed.request("GET", path, endpoint=fault_proxy.endpoint)


def test_faults_filtered_by_method_and_target(
    seaweed: SeaweedServer, fault_proxy: FaultProxy, objects: dict[str, bytes]
) -> None:
    small = object_path(objects, "small.txt")
    big = object_path(objects, "4mib.bin")
    fault_proxy.script(status(500, method="GET", target="4mib"), status(503, method="HEAD"))
    endpoint = fault_proxy.endpoint
    assert seaweed.request("HEAD", big, endpoint=endpoint).status == 200  # not a GET
    assert seaweed.request("GET", small, endpoint=endpoint).status == 200  # other target
    assert seaweed.request("GET", big, endpoint=endpoint).status == 500
    assert seaweed.request("GET", big, endpoint=endpoint).status == 200
    assert seaweed.request("HEAD", small, endpoint=endpoint).status == 503
    assert seaweed.request("HEAD", small, endpoint=endpoint).status == 200
    assert fault_proxy.requests_seen == 6
    assert [r.fault.code if r.fault else None for r in fault_proxy.history] == [
        None,
        None,
        500,
        None,
        503,
        None,
    ]


def test_queue_order_counters_and_clear(
    seaweed: SeaweedServer, fault_proxy: FaultProxy, objects: dict[str, bytes]
) -> None:
    path = object_path(objects, "small.txt")
    fault_proxy.script(status(500), status(503))
    fault_proxy.script(short_body(3))
    codes = [seaweed.request("HEAD", path, endpoint=fault_proxy.endpoint).status for _ in range(2)]
    assert codes == [500, 503]
    assert fault_proxy.pending_faults == 1
    fault_proxy.clear()
    assert seaweed.request("GET", path, endpoint=fault_proxy.endpoint).body == objects[path]
    assert (fault_proxy.requests_seen, fault_proxy.faults_applied) == (3, 2)
    with pytest.raises(TypeError):
        fault_proxy.script("reset")  # type: ignore[arg-type]


@pytest.mark.timeout(30)
def test_stop_ends_a_stall_and_joins_all_threads(
    seaweed: SeaweedServer, objects: dict[str, bytes]
) -> None:
    proxy = FaultProxy(seaweed.host, seaweed.port).start()
    proxy.script(stall_after(0, 60.0))
    with RawConnection(seaweed, proxy.port) as conn:
        conn.send("GET", object_path(objects, "4mib.bin"))
        assert conn.read_head()[0] == 200
        idle = RawConnection(seaweed, proxy.port)  # an idle keep-alive connection too
        deadline = time.monotonic() + 60  # a hang guard only
        while proxy.connections_accepted < 2 or proxy.faults_applied < 1:
            assert time.monotonic() < deadline, "the proxy never took both connections"
            time.sleep(0.001)
        proxy.stop()
        # Both closed by stop(), within a guard far shorter than the 60 s stall (so not by it).
        assert conn.wait_closed(20.0) in ("eof", "reset")
        assert idle.wait_closed(20.0) in ("eof", "reset")
        idle.close()
    prefix = f"fault-proxy-{proxy.port}-"
    assert not [t.name for t in threading.enumerate() if t.name.startswith(prefix)]
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", proxy.port), timeout=1).close()


# --- chunked bodies, against a local stdlib upstream ------------------------------------------


class _ChunkedHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    chunks = [b"a" * 1000, b"b" * 70_000, b"c"]

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for chunk in self.chunks:
            self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
        self.wfile.write(b"0\r\nX-Trailer: yes\r\n\r\n")

    def do_PUT(self) -> None:
        body = bytearray()
        while True:
            size = int(self.rfile.readline().split(b";")[0], 16)
            if size == 0:
                while self.rfile.readline() not in (b"\r\n", b""):
                    pass
                break
            body += self.rfile.read(size)
            self.rfile.readline()
        reply = hashlib.sha256(body).hexdigest().encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)


@pytest.fixture
def chunked_upstream() -> Iterator[http.server.ThreadingHTTPServer]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _ChunkedHandler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1})
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_chunked_bodies_pass_through(chunked_upstream: http.server.ThreadingHTTPServer) -> None:
    expected = b"".join(_ChunkedHandler.chunks)
    payload = random.Random(9).randbytes(200_000)
    with FaultProxy("127.0.0.1", chunked_upstream.server_address[1]) as proxy:
        conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
        try:
            for _ in range(2):
                conn.request("GET", "/chunked")
                response = conn.getresponse()
                assert response.getheader("Transfer-Encoding") == "chunked"
                assert response.read() == expected
            conn.request(
                "PUT", "/upload", body=iter([payload[:1000], payload[1000:]]), encode_chunked=True
            )
            assert conn.getresponse().read() == hashlib.sha256(payload).hexdigest().encode()
            conn.request("GET", "/chunked")
            assert conn.getresponse().read() == expected
        finally:
            conn.close()
        assert (proxy.connections_accepted, proxy.requests_seen) == (1, 4)
        proxy.script(reset_after(5000))
        conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
        try:
            conn.request("GET", "/chunked")
            with pytest.raises((ConnectionResetError, http.client.IncompleteRead)):
                conn.getresponse().read()
        finally:
            conn.close()
