"""Tests of tests/fault_proxy.py: pass-through (keep-alive, 100-continue, chunked bodies) and
each scripted fault, through the proxy in front of SeaweedFS or a local stdlib server.

Standard library only (plus the test helpers); nothing here imports syvain_training_data, so
these run before the package is built.
"""

from __future__ import annotations

import hashlib
import http.client
import http.server
import os
import random
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from fault_proxy import FaultProxy
from proxy_faults import Fault, close_before_headers, reset_after, short_body, stall_after, status
from raw_http import RawConnection, RawResponse
from seaweed import SeaweedServer, canonical_target, sign_headers

MIB = 1024 * 1024
pytestmark = pytest.mark.timeout(120)


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


def get_big_object_with(
    fault: Fault, seaweed: SeaweedServer, fault_proxy: FaultProxy, objects: dict[str, bytes]
) -> tuple[str, RawResponse]:
    """The 4 MiB object's path and the response to a GET of it on a raw connection through the
    proxy with ``fault`` scripted."""
    path = object_path(objects, "4mib.bin")
    fault_proxy.script(fault)
    with RawConnection(seaweed, fault_proxy.port) as conn:
        return path, conn.request("GET", path)


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
    path, response = get_big_object_with(reset_after(n), seaweed, fault_proxy, objects)
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
    path, response = get_big_object_with(short_body(n), seaweed, fault_proxy, objects)
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
