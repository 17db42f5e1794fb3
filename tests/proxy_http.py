"""HTTP/1.1 message plumbing for the fault proxy: buffered reads, message heads, body framing
(Content-Length, chunked, close-delimited) and the ways a proxied connection is closed.
"""

from __future__ import annotations

import contextlib
import fcntl
import socket
import struct
import termios
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

_HEAD_LIMIT = 1 << 20
_CHUNK = 256 * 1024
_DRAIN_TIMEOUT = 10.0  # wait for sent bytes to be acknowledged before cutting


class ProtocolError(Exception):
    pass


class PeerClosed(Exception):
    pass


class Reader:
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
                raise ProtocolError("message head too large")
            if not self._fill():
                if not self.buf:
                    return None
                raise PeerClosed("EOF inside a message head")

    def readline(self) -> bytes:
        while True:
            end = self.buf.find(b"\n")
            if end >= 0:
                line = bytes(self.buf[: end + 1])
                del self.buf[: end + 1]
                return line
            if len(self.buf) > _HEAD_LIMIT:
                raise ProtocolError("line too long")
            if not self._fill():
                raise PeerClosed("EOF inside a chunked body")

    def read_some(self, limit: int) -> bytes:
        """Up to ``limit`` bytes (at least one), b"" at EOF."""
        if not self.buf and not self._fill():
            return b""
        data = bytes(self.buf[:limit])
        del self.buf[:limit]
        return data


@dataclass
class Head:
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


def parse_head(raw: bytes) -> Head:
    lines = raw.decode("latin-1").split("\r\n")
    headers = []
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep:
            raise ProtocolError(f"malformed header line {line!r}")
        headers.append((name.strip().lower(), value.strip()))
    return Head(raw, lines[0], headers)


def body_framing(
    head: Head, *, is_request: bool, method: str = "", code: int = 0
) -> tuple[str, int]:
    """("none"|"length"|"chunked"|"eof", length) for the body that follows ``head``."""
    if not is_request and (method == "HEAD" or code in (204, 304) or 100 <= code < 200):
        return "none", 0
    if "chunked" in head.tokens("transfer-encoding"):
        return "chunked", 0
    length = head.get("content-length")
    if length is not None:
        return "length", int(length)
    return ("none", 0) if is_request else ("eof", 0)


def body_pieces(reader: Reader, framing: tuple[str, int]) -> Iterator[bytes]:
    """The raw wire bytes of one body, in pieces. Raises PeerClosed on a truncated body."""
    kind, length = framing
    if kind == "length":
        remaining = length
        while remaining:
            piece = reader.read_some(min(remaining, _CHUNK))
            if not piece:
                raise PeerClosed(f"EOF with {remaining} body bytes outstanding")
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
                    raise PeerClosed("EOF inside a chunk")
                remaining -= len(piece)
                yield piece
    elif kind == "eof":
        while piece := reader.read_some(_CHUNK):
            yield piece


def forward(pieces: Iterator[bytes], dst: socket.socket, limit: int | None = None) -> int:
    """Sends the pieces (at most ``limit`` bytes) to ``dst``; returns the bytes sent."""
    sent = 0
    for piece in pieces:
        if limit is not None and sent + len(piece) >= limit:
            dst.sendall(piece[: limit - sent])
            return limit
        dst.sendall(piece)
        sent += len(piece)
    return sent


def wait_drained(sock: socket.socket, stop: threading.Event) -> None:
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


def close_clean(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_WR)
    _discard_pending(sock)
    sock.close()


def close_reset(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()
