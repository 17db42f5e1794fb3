"""A raw HTTP/1.1 client for the fault proxy's tests: requests are signed for a test S3 server
and sent verbatim on one TCP connection, and each response reports exactly how it ended
(complete, EOF, reset or a read timeout). Standard library only.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass, field

from seaweed import SeaweedServer, canonical_target, sign_headers


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
