"""Rewrites a signed S3 request head without its Range header, for the fault proxy's
``ignore_range`` mode: the server then answers 200 with the whole object, as a server or proxy
that ignores Range does. Range is a signed header, so the request is signed again with the
test server's credentials (the same Host, method, target and other headers).
"""

from __future__ import annotations

import urllib.parse
from typing import Protocol

from proxy_http import Head
from s3_signing import sign_headers

# Set again by the signer, or the one header to drop.
_REPLACED = frozenset(
    {"range", "authorization", "x-amz-date", "x-amz-content-sha256", "host", "content-length"}
)


class Credentials(Protocol):
    access_key_id: str
    secret_access_key: str
    region: str


def without_range(head: Head, credentials: Credentials) -> bytes:
    """``head`` (a bodiless request, e.g. a GET) without Range, signed again."""
    method, target, version = head.first_line.split(" ")
    parts = urllib.parse.urlsplit(target)
    kept = {name: value for name, value in head.headers if name not in _REPLACED}
    signed = sign_headers(
        method,
        head.get("host") or "",
        urllib.parse.unquote(parts.path),
        access_key_id=credentials.access_key_id,
        secret_access_key=credentials.secret_access_key,
        region=credentials.region,
        query=dict(urllib.parse.parse_qsl(parts.query, keep_blank_values=True)),
        headers=kept,
    )
    lines = [f"{method} {target} {version}", *(f"{k}: {v}" for k, v in signed.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
