"""A scriptable fault-injecting HTTP/1.1 proxy on 127.0.0.1 for the S3 integration tests.

    proxy = FaultProxy("127.0.0.1", seaweed.port).start()
    proxy.script(reset_after(5 * MIB), status(503, "Slow Down", "SlowDown"))
    ... point the client at proxy.endpoint ...
    proxy.stop()

``proxy.ignore_range(seaweed)`` makes it drop the Range header of every request from then on
(signed again with those credentials, proxy_resign.py), so the server answers 200 with the
whole object; ``ranges_ignored`` counts them.

Each client connection gets a thread and its own upstream connection. The proxy parses
requests and responses (Content-Length, chunked and close-delimited bodies, interim 1xx
responses, ``Expect: 100-continue``) so that keep-alive works and a fault hits the Nth
*request*, not the Nth connection. Scripted faults form a FIFO queue: the head of the queue is
applied to the next request that matches its filter (``method``, ``target`` substring) and then
removed; other requests, and all requests once the queue is empty, pass through unchanged.
Bytes are forwarded verbatim, so SigV4 signatures (computed for the proxy's Host) stay valid.

The faults and their factories are in proxy_faults.py (re-exported here), the HTTP plumbing in
proxy_http.py.
"""

from __future__ import annotations

import contextlib
import logging
import select
import socket
import threading
import time

from proxy_faults import (
    Fault,
    RequestRecord,
    close_before_headers,
    drop_response,
    error_response,
    reset_after,
    short_body,
    stall_after,
    status,
)
from proxy_http import (
    Head,
    PeerClosed,
    ProtocolError,
    Reader,
    body_framing,
    body_pieces,
    close_clean,
    close_reset,
    forward,
    parse_head,
    wait_drained,
)
from proxy_resign import Credentials, without_range

log = logging.getLogger("fault_proxy")

_UPSTREAM_CONNECT_TIMEOUT = 10.0
_IO_TIMEOUT = 120.0  # any single blocking send/recv on either side
_IDLE_TIMEOUT = 600.0  # an idle keep-alive client connection is closed after this


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
        self._ignore_range: Credentials | None = None
        self._ranges_ignored = 0
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
    def ranges_ignored(self) -> int:
        with self._lock:
            return self._ranges_ignored

    def ignore_range(self, credentials: Credentials) -> None:
        """From now on, forwards every request without its Range header (signed again with
        ``credentials``): the server answers 200 with the whole object."""
        with self._lock:
            self._ignore_range = credentials

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
        reader = Reader(client)
        upstream: socket.socket | None = None
        up_reader: Reader | None = None
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
                head = parse_head(raw)
                parts = head.first_line.split(" ")
                if len(parts) != 3:
                    raise ProtocolError(f"bad request line {head.first_line!r}")
                method, target, version = parts
                close_after = "close" in head.tokens("connection") or version == "HTTP/1.0"
                expect = "100-continue" in head.tokens("expect")
                request_framing = body_framing(head, is_request=True)
                fault = self._take_fault(number, method, target)
                raw = self._maybe_without_range(head, raw)

                if fault is not None and fault.kind in ("status", "close_before_headers"):
                    if expect:
                        client.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
                    for _ in body_pieces(reader, request_framing):
                        pass
                    if fault.kind == "close_before_headers":
                        cut = True
                        close_clean(client)
                        return
                    client.sendall(error_response(fault, method, target))
                    if close_after:
                        return
                    continue

                if upstream is None:
                    upstream = self._track(
                        socket.create_connection(self.upstream, timeout=_UPSTREAM_CONNECT_TIMEOUT)
                    )
                    upstream.settimeout(_IO_TIMEOUT)
                    upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    up_reader = Reader(upstream)
                assert up_reader is not None
                upstream.sendall(raw)
                response = None
                if expect:
                    response = self._read_response_head(up_reader, client, stop_at_100=True)
                    if response is None:  # 100 Continue forwarded: now the body
                        forward(body_pieces(reader, request_framing), upstream)
                    else:  # a final answer instead of 100: body state unknown, close after
                        close_after = True
                else:
                    forward(body_pieces(reader, request_framing), upstream)
                if response is None:
                    response = self._read_response_head(up_reader, client, stop_at_100=False)
                assert response is not None
                code = int(response.first_line.split(" ")[1])
                response_framing = body_framing(
                    response, is_request=False, method=method, code=code
                )
                if "close" in response.tokens("connection") or response_framing[0] == "eof":
                    close_after = True

                pieces = body_pieces(up_reader, response_framing)
                if fault is not None and fault.kind == "drop_response":
                    for _ in pieces:
                        pass
                    cut = True
                    close_clean(client)
                    return
                client.sendall(response.raw)
                if fault is None:
                    forward(pieces, client)
                    if close_after:
                        return
                    continue

                forward(pieces, client, limit=fault.n_body_bytes)
                cut = True
                if fault.kind == "reset_after":
                    wait_drained(client, self._stop)
                    close_reset(client)
                elif fault.kind == "stall_after":
                    self._stop.wait(fault.seconds)
                    close_clean(client)
                else:  # short_body
                    wait_drained(client, self._stop)
                    close_clean(client)
                return
        except (OSError, PeerClosed, ProtocolError, ValueError) as exc:
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

    def _maybe_without_range(self, head: Head, raw: bytes) -> bytes:
        with self._lock:
            credentials = self._ignore_range
            if credentials is None or head.get("range") is None:
                return raw
            self._ranges_ignored += 1
        return without_range(head, credentials)

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
        self, up_reader: Reader, client: socket.socket, *, stop_at_100: bool
    ) -> Head | None:
        """The final response head; interim 1xx heads are forwarded. With ``stop_at_100``,
        returns None right after forwarding a ``100 Continue``."""
        while True:
            raw = up_reader.read_head()
            if raw is None:
                raise PeerClosed("upstream closed before a response")
            head = parse_head(raw)
            parts = head.first_line.split(" ", 2)
            if len(parts) < 2 or not parts[1].isdigit():
                raise ProtocolError(f"bad status line {head.first_line!r}")
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
    "drop_response",
    "reset_after",
    "short_body",
    "stall_after",
    "status",
]
