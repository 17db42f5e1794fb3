"""The faults a ``FaultProxy`` can be scripted with, for the S3 integration tests.

Factories (all returning a ``Fault``):

``reset_after(n)``       response head + n body bytes, then RST (SO_LINGER 0) to the client.
``stall_after(n, s)``    response head + n body bytes, then silence for s seconds with the
                         socket open, then a clean close.
``status(code, ...)``    answers itself with an S3 XML error (and any ``headers``, such as
                         Retry-After); upstream is never contacted.
``close_before_headers`` reads the request, then closes (FIN) without any answer.
``short_body(n)``        response head (original Content-Length) + n body bytes, then FIN.
``drop_response``        forwards the request, lets upstream answer in full (so a PUT is
                         stored), then closes the client connection without a byte of it.

"Body bytes" are payload bytes for Content-Length bodies and raw wire bytes for chunked ones;
n larger than the body forwards the whole body before cutting. Every fault takes ``method``
and ``target`` (a substring of the request target) to restrict which requests it applies to.
"""

from __future__ import annotations

import http
import uuid
from dataclasses import dataclass


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
    headers: tuple[tuple[str, str], ...] = ()

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
    headers: dict[str, str] | None = None,
) -> Fault:
    """Answer with ``code``, ``headers`` and an S3 XML error body (``<Code>s3_code</Code>``)
    without contacting upstream; the connection stays usable (keep-alive)."""
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
        headers=tuple((headers or {}).items()),
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


def error_response(fault: Fault, method: str, target: str) -> bytes:
    """The whole answer of a ``status`` fault: head, and the S3 XML error body unless HEAD."""
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
        + "".join(f"{name}: {value}\r\n" for name, value in fault.headers)
        + "Server: syvain-fault-proxy\r\n"
        "\r\n"
    ).encode()
    return head if method == "HEAD" else head + body
