"""A scriptable fault-injecting HTTP/1.1 proxy on 127.0.0.1 for the S3 integration tests.

    proxy = FaultProxy("127.0.0.1", seaweed.port).start()
    proxy.script(reset_after(5 * MIB), status(503, "Slow Down", "SlowDown"))
    ... point the client at proxy.endpoint ...
    proxy.stop()

Each client connection gets a thread and its own upstream connection. The proxy parses
requests and responses (Content-Length, chunked and close-delimited bodies, interim 1xx
responses, ``Expect: 100-continue``) so that keep-alive works and a fault hits the Nth
*request*, not the Nth connection. Scripted faults form a FIFO queue: the head of the queue is
applied to the next request that matches its filter (``method``, ``target`` substring) and then
removed; other requests, and all requests once the queue is empty, pass through unchanged.
Bytes are forwarded verbatim, so SigV4 signatures (computed for the proxy's Host) stay valid.

Faults (factories below, all returning a ``Fault``):

``reset_after(n)``       response head + n body bytes, then RST (SO_LINGER 0) to the client.
``stall_after(n, s)``    response head + n body bytes, then silence for s seconds with the
                         socket open, then a clean close.
``status(code, ...)``    answers itself with an S3 XML error; upstream is never contacted.
``close_before_headers`` reads the request, then closes (FIN) without any answer.
``short_body(n)``        response head (original Content-Length) + n body bytes, then FIN.
``drop_response``        forwards the request, lets upstream answer in full (so a PUT is
                         stored), then closes the client connection without a byte of it.

"Body bytes" are payload bytes for Content-Length bodies and raw wire bytes for chunked ones;
n larger than the body forwards the whole body before cutting. After a cut, the upstream
connection is dropped too; the client's next connection passes through normally.
"""

from __future__ import annotations

import contextlib
import fcntl
import http
import logging
import select
import socket
import struct
import termios
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

log = logging.getLogger("fault_proxy")

_HEAD_LIMIT = 1 << 20
_CHUNK = 256 * 1024
_UPSTREAM_CONNECT_TIMEOUT = 10.0
_IO_TIMEOUT = 120.0  # any single blocking send/recv on either side
_IDLE_TIMEOUT = 600.0  # an idle keep-alive client connection is closed after this
_DRAIN_TIMEOUT = 10.0  # wait for sent bytes to be acknowledged before cutting


class _ProtocolError(Exception):
    pass


class _PeerClosed(Exception):
    pass


# --- faults ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fault:
    """One scripted fault. Build with the factories; ``method``/``target`` restrict which
    requests it applies to (``target`` is a substring of the request target)."""

    # reset_after | stall_after | status | close_before_headers | short_body | drop_response
    kind: str
    n_body_bytes: int = 0
    seconds: float = 0.0
    code: int = 0
    reason: str = ""
    s3_code: str = ""
    message: str = ""
    method: str | None = None
    target: str | None = None

    def matches(self, method: str, target: str) -> bool:
        if self.method is not None and self.method.upper() != method.upper():
            return False
        return self.target is None or self.target in target


def reset_after(
    n_body_bytes: int, *, method: str | None = None, target: str | None = None
) -> Fault:
    """Forward the response head and ``n_body_bytes`` of its body, then reset the client
    connection (RST)."""
    return Fault("reset_after", n_body_bytes=n_body_bytes, method=method, target=target)


def stall_after(
    n_body_bytes: int, seconds: float, *, method: str | None = None, target: str | None = None
) -> Fault:
    """Forward the response head and ``n_body_bytes``, send nothing for ``seconds`` while
    keeping the socket open, then close it."""
    return Fault(
        "stall_after", n_body_bytes=n_body_bytes, seconds=seconds, method=method, target=target
    )


_DEFAULT_S3_CODES = {
    400: "BadRequest",
    403: "AccessDenied",
    404: "NoSuchKey",
    409: "OperationAborted",
    412: "PreconditionFailed",
    500: "InternalError",
    503: "SlowDown",
}


def status(
    code: int,
    reason: str | None = None,
    s3_code: str | None = None,
    message: str | None = None,
    *,
    method: str | None = None,
    target: str | None = None,
) -> Fault:
    """Answer with ``code`` and an S3 XML error body (``<Code>s3_code</Code>``) without
    contacting upstream; the connection stays usable (keep-alive)."""
    if reason is None:
        try:
            reason = http.HTTPStatus(code).phrase
        except ValueError:
            reason = "Error"
    return Fault(
        "status",
        code=code,
        reason=reason,
        s3_code=s3_code or _DEFAULT_S3_CODES.get(code, "InternalError"),
        message=message or f"Injected by fault proxy: {code} {reason}",
        method=method,
        target=target,
    )


def close_before_headers(*, method: str | None = None, target: str | None = None) -> Fault:
    """Read the whole request, then close the connection without answering."""
    return Fault("close_before_headers", method=method, target=target)


def short_body(n_body_bytes: int, *, method: str | None = None, target: str | None = None) -> Fault:
    """Forward the response head (original Content-Length) and only ``n_body_bytes``, then a
    clean close (FIN)."""
    return Fault("short_body", n_body_bytes=n_body_bytes, method=method, target=target)


def drop_response(*, method: str | None = None, target: str | None = None) -> Fault:
    """Forward the request and read upstream's whole answer (the server did the work), then
    close the client connection (FIN) without answering: a response lost on the way back."""
    return Fault("drop_response", method=method, target=target)


@dataclass(frozen=True)
class RequestRecord:
    """One request the proxy saw: its method, target and the fault applied (or None)."""

    connection: int
    method: str
    target: str
    fault: Fault | None


# --- HTTP plumbing ---------------------------------------------------------------------------


class _Reader:
    """Buffered reads from a socket."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = bytearray()

    def _fill(self) -> bool:
        data = self.sock.recv(_CHUNK)
        if not data:
            return False
        self.buf += data
        return True

    def read_head(self) -> bytes | None:
        """The next message head including the blank line; None on EOF before any byte."""
        while True:
            while self.buf.startswith(b"\r\n"):  # tolerated stray CRLFs between messages
                del self.buf[:2]
            end = self.buf.find(b"\r\n\r\n")
            if end >= 0:
                head = bytes(self.buf[: end + 4])
                del self.buf[: end + 4]
                return head
            if len(self.buf) > _HEAD_LIMIT:
                raise _ProtocolError("message head too large")
            if not self._fill():
                if not self.buf:
                    return None
                raise _PeerClosed("EOF inside a message head")

    def readline(self) -> bytes:
        while True:
            end = self.buf.find(b"\n")
            if end >= 0:
                line = bytes(self.buf[: end + 1])
                del self.buf[: end + 1]
                return line
            if len(self.buf) > _HEAD_LIMIT:
                raise _ProtocolError("line too long")
            if not self._fill():
                raise _PeerClosed("EOF inside a chunked body")

    def read_some(self, limit: int) -> bytes:
        """Up to ``limit`` bytes (at least one), b"" at EOF."""
        if not self.buf and not self._fill():
            return b""
        data = bytes(self.buf[:limit])
        del self.buf[:limit]
        return data


@dataclass
class _Head:
    raw: bytes
    first_line: str
    headers: list[tuple[str, str]]  # lower-cased names

    def get(self, name: str) -> str | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None

    def tokens(self, name: str) -> set[str]:
        return {
            t.strip().lower()
            for key, value in self.headers
            if key == name
            for t in value.split(",")
            if t.strip()
        }


def _parse_head(raw: bytes) -> _Head:
    lines = raw.decode("latin-1").split("\r\n")
    headers = []
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep:
            raise _ProtocolError(f"malformed header line {line!r}")
        headers.append((name.strip().lower(), value.strip()))
    return _Head(raw, lines[0], headers)


def _framing(head: _Head, *, is_request: bool, method: str = "", code: int = 0) -> tuple[str, int]:
    """("none"|"length"|"chunked"|"eof", length) for the body that follows ``head``."""
    if not is_request and (method == "HEAD" or code in (204, 304) or 100 <= code < 200):
        return "none", 0
    if "chunked" in head.tokens("transfer-encoding"):
        return "chunked", 0
    length = head.get("content-length")
    if length is not None:
        return "length", int(length)
    return ("none", 0) if is_request else ("eof", 0)


def _body_pieces(reader: _Reader, framing: tuple[str, int]) -> Iterator[bytes]:
    """The raw wire bytes of one body, in pieces. Raises _PeerClosed on a truncated body."""
    kind, length = framing
    if kind == "length":
        remaining = length
        while remaining:
            piece = reader.read_some(min(remaining, _CHUNK))
            if not piece:
                raise _PeerClosed(f"EOF with {remaining} body bytes outstanding")
            remaining -= len(piece)
            yield piece
    elif kind == "chunked":
        while True:
            line = reader.readline()
            yield line
            size = int(line.split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while True:  # trailers up to the blank line
                    line = reader.readline()
                    yield line
                    if line in (b"\r\n", b"\n"):
                        return
            remaining = size + 2  # data + CRLF
            while remaining:
                piece = reader.read_some(min(remaining, _CHUNK))
                if not piece:
                    raise _PeerClosed("EOF inside a chunk")
                remaining -= len(piece)
                yield piece
    elif kind == "eof":
        while piece := reader.read_some(_CHUNK):
            yield piece


def _forward(pieces: Iterator[bytes], dst: socket.socket, limit: int | None = None) -> int:
    """Sends the pieces (at most ``limit`` bytes) to ``dst``; returns the bytes sent."""
    sent = 0
    for piece in pieces:
        if limit is not None and sent + len(piece) >= limit:
            dst.sendall(piece[: limit - sent])
            return limit
        dst.sendall(piece)
        sent += len(piece)
    return sent


def _wait_drained(sock: socket.socket, stop: threading.Event) -> None:
    """Until the peer acknowledged everything we sent (Linux TIOCOUTQ), bounded."""
    deadline = time.monotonic() + _DRAIN_TIMEOUT
    while time.monotonic() < deadline and not stop.is_set():
        try:
            raw = fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, struct.pack("i", 0))
        except (OSError, AttributeError):
            time.sleep(0.05)
            return
        if struct.unpack("i", raw)[0] == 0:
            return
        time.sleep(0.002)


def _discard_pending(sock: socket.socket) -> None:
    """Reads what the peer already sent so that close() sends FIN, not RST."""
    with contextlib.suppress(OSError):
        while sock.recv(_CHUNK, socket.MSG_DONTWAIT):
            pass


def _close_clean(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_WR)
    _discard_pending(sock)
    sock.close()


def _close_reset(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def _error_response(fault: Fault, method: str, target: str) -> bytes:
    request_id = uuid.uuid4().hex[:16].upper()
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{fault.s3_code}</Code><Message>{fault.message}</Message>"
        f"<Resource>{target.split('?')[0]}</Resource><RequestId>{request_id}</RequestId></Error>"
    ).encode()
    head = (
        f"HTTP/1.1 {fault.code} {fault.reason}\r\n"
        "Content-Type: application/xml\r\n"
        f"Content-Length: {len(body)}\r\n"
        f"x-amz-request-id: {request_id}\r\n"
        "Server: syvain-fault-proxy\r\n"
        "\r\n"
    ).encode()
    return head if method == "HEAD" else head + body


# --- the proxy -------------------------------------------------------------------------------


class FaultProxy:
    """Scriptable HTTP/1.1 proxy from 127.0.0.1:``port`` to ``upstream_host:upstream_port``."""

    def __init__(self, upstream_host: str, upstream_port: int, host: str = "127.0.0.1") -> None:
        self.upstream = (upstream_host, upstream_port)
        self.host = host
        self._lock = threading.Lock()
        self._faults: list[Fault] = []
        self._history: list[RequestRecord] = []
        self._requests_seen = 0
        self._faults_applied = 0
        self._connections = 0
        self._stop = threading.Event()
        self._listener: socket.socket | None = None
        self._accept_thread: threading.Thread | None = None
        self._threads: set[threading.Thread] = set()
        self._sockets: set[socket.socket] = set()
        self.port = 0

    # -- public API --

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def requests_seen(self) -> int:
        with self._lock:
            return self._requests_seen

    @property
    def faults_applied(self) -> int:
        with self._lock:
            return self._faults_applied

    @property
    def connections_accepted(self) -> int:
        with self._lock:
            return self._connections

    @property
    def pending_faults(self) -> int:
        with self._lock:
            return len(self._faults)

    @property
    def history(self) -> list[RequestRecord]:
        with self._lock:
            return list(self._history)

    def script(self, *faults: Fault) -> None:
        """Queues ``faults``, applied in order to the next matching requests."""
        for fault in faults:
            if not isinstance(fault, Fault):
                raise TypeError(f"not a Fault: {fault!r}")
        with self._lock:
            self._faults.extend(faults)

    def clear(self) -> None:
        """Drops the faults not applied yet."""
        with self._lock:
            self._faults.clear()

    def start(self) -> FaultProxy:
        if self._listener is not None:
            raise RuntimeError("FaultProxy already started")
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((self.host, 0))
        listener.listen(128)
        listener.settimeout(0.2)
        self._listener = listener
        self.port = listener.getsockname()[1]
        self._accept_thread = threading.Thread(
            target=self._accept_loop, name=f"fault-proxy-{self.port}-accept", daemon=True
        )
        self._accept_thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stops accepting, cuts every open connection (ending stalls early) and joins all
        threads."""
        self._stop.set()
        if self._accept_thread is not None:
            self._accept_thread.join(timeout)
        if self._listener is not None:
            self._listener.close()
        with self._lock:
            sockets = list(self._sockets)
            threads = list(self._threads)
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        deadline = time.monotonic() + timeout
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        alive = [t.name for t in threads if t.is_alive()]
        if alive:
            raise RuntimeError(f"FaultProxy threads did not stop: {alive}")

    def __enter__(self) -> FaultProxy:
        return self if self._listener is not None else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return (
            f"FaultProxy({self.endpoint} -> {self.upstream[0]}:{self.upstream[1]}, "
            f"requests_seen={self.requests_seen}, faults_applied={self.faults_applied}, "
            f"pending={self.pending_faults})"
        )

    # -- internals --

    def _track(self, sock: socket.socket) -> socket.socket:
        with self._lock:
            self._sockets.add(sock)
        return sock

    def _untrack(self, sock: socket.socket | None) -> None:
        if sock is None:
            return
        with self._lock:
            self._sockets.discard(sock)

    def _accept_loop(self) -> None:
        assert self._listener is not None
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                if self._stop.is_set():
                    return
                time.sleep(0.05)
                continue
            with self._lock:
                self._connections += 1
                number = self._connections
                self._sockets.add(client)
            thread = threading.Thread(
                target=self._serve,
                args=(client, number),
                name=f"fault-proxy-{self.port}-conn-{number}",
                daemon=True,
            )
            with self._lock:
                self._threads.add(thread)
            thread.start()

    def _take_fault(self, number: int, method: str, target: str) -> Fault | None:
        with self._lock:
            self._requests_seen += 1
            fault = None
            if self._faults and self._faults[0].matches(method, target):
                fault = self._faults.pop(0)
                self._faults_applied += 1
            self._history.append(RequestRecord(number, method, target, fault))
        if fault is not None:
            log.info("conn %d: %s %s -> %s", number, method, target, fault)
        return fault

    def _serve(self, client: socket.socket, number: int) -> None:
        client.settimeout(_IO_TIMEOUT)
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        reader = _Reader(client)
        upstream: socket.socket | None = None
        up_reader: _Reader | None = None
        cut = False  # True when a fault already closed the client socket
        try:
            while not self._stop.is_set():
                if not reader.buf and not self._wait_for_request(client, upstream):
                    return
                if upstream is not None and upstream.fileno() < 0:
                    upstream = up_reader = None
                raw = reader.read_head()
                if raw is None:
                    return
                head = _parse_head(raw)
                parts = head.first_line.split(" ")
                if len(parts) != 3:
                    raise _ProtocolError(f"bad request line {head.first_line!r}")
                method, target, version = parts
                close_after = "close" in head.tokens("connection") or version == "HTTP/1.0"
                expect = "100-continue" in head.tokens("expect")
                request_framing = _framing(head, is_request=True)
                fault = self._take_fault(number, method, target)

                if fault is not None and fault.kind in ("status", "close_before_headers"):
                    if expect:
                        client.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
                    for _ in _body_pieces(reader, request_framing):
                        pass
                    if fault.kind == "close_before_headers":
                        cut = True
                        _close_clean(client)
                        return
                    client.sendall(_error_response(fault, method, target))
                    if close_after:
                        return
                    continue

                if upstream is None:
                    upstream = self._track(
                        socket.create_connection(self.upstream, timeout=_UPSTREAM_CONNECT_TIMEOUT)
                    )
                    upstream.settimeout(_IO_TIMEOUT)
                    upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    up_reader = _Reader(upstream)
                assert up_reader is not None
                upstream.sendall(raw)
                response = None
                if expect:
                    response = self._read_response_head(up_reader, client, stop_at_100=True)
                    if response is None:  # 100 Continue forwarded: now the body
                        _forward(_body_pieces(reader, request_framing), upstream)
                    else:  # a final answer instead of 100: body state unknown, close after
                        close_after = True
                else:
                    _forward(_body_pieces(reader, request_framing), upstream)
                if response is None:
                    response = self._read_response_head(up_reader, client, stop_at_100=False)
                assert response is not None
                code = int(response.first_line.split(" ")[1])
                response_framing = _framing(response, is_request=False, method=method, code=code)
                if "close" in response.tokens("connection") or response_framing[0] == "eof":
                    close_after = True

                pieces = _body_pieces(up_reader, response_framing)
                if fault is not None and fault.kind == "drop_response":
                    for _ in pieces:
                        pass
                    cut = True
                    _close_clean(client)
                    return
                client.sendall(response.raw)
                if fault is None:
                    _forward(pieces, client)
                    if close_after:
                        return
                    continue

                _forward(pieces, client, limit=fault.n_body_bytes)
                cut = True
                if fault.kind == "reset_after":
                    _wait_drained(client, self._stop)
                    _close_reset(client)
                elif fault.kind == "stall_after":
                    self._stop.wait(fault.seconds)
                    _close_clean(client)
                else:  # short_body
                    _wait_drained(client, self._stop)
                    _close_clean(client)
                return
        except (OSError, _PeerClosed, _ProtocolError, ValueError) as exc:
            if not self._stop.is_set():
                log.debug("conn %d closed: %s: %s", number, type(exc).__name__, exc)
        finally:
            self._untrack(client)
            if not cut:
                with contextlib.suppress(OSError):
                    client.close()
            if upstream is not None:
                self._untrack(upstream)
                with contextlib.suppress(OSError):
                    upstream.close()
            with self._lock:
                self._threads.discard(threading.current_thread())

    def _wait_for_request(self, client: socket.socket, upstream: socket.socket | None) -> bool:
        """Waits while the connection is idle. False to end it (stop, idle timeout, client
        gone); an upstream that closes or speaks while idle is dropped and reopened lazily."""
        deadline = time.monotonic() + _IDLE_TIMEOUT
        while not self._stop.is_set():
            watch = [client] if upstream is None or upstream.fileno() < 0 else [client, upstream]
            try:
                readable, _, _ = select.select(watch, [], [], 0.5)
            except (OSError, ValueError):
                return False
            if upstream is not None and upstream in readable:
                self._untrack(upstream)
                upstream.close()  # fileno() becomes -1; the caller reconnects
                upstream = None
            if client in readable:
                return True
            if time.monotonic() > deadline:
                return False
        return False

    def _read_response_head(
        self, up_reader: _Reader, client: socket.socket, *, stop_at_100: bool
    ) -> _Head | None:
        """The final response head; interim 1xx heads are forwarded. With ``stop_at_100``,
        returns None right after forwarding a ``100 Continue``."""
        while True:
            raw = up_reader.read_head()
            if raw is None:
                raise _PeerClosed("upstream closed before a response")
            head = _parse_head(raw)
            parts = head.first_line.split(" ", 2)
            if len(parts) < 2 or not parts[1].isdigit():
                raise _ProtocolError(f"bad status line {head.first_line!r}")
            code = int(parts[1])
            if code == 101 or code >= 200:
                return head
            client.sendall(raw)
            if code == 100 and stop_at_100:
                return None


__all__ = [
    "Fault",
    "FaultProxy",
    "RequestRecord",
    "close_before_headers",
    "reset_after",
    "short_body",
    "stall_after",
    "status",
]
